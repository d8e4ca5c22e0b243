"""How a model runs: the backends and their dispatch, input validation, and the runtime (dense,
padding-free, replayed from CUDA graphs)."""
