set -u
python3 -m benchmarks.gpu_run.install --python python3 > "$OUT/install.log" 2>&1 || true
timeout 200 python3 -m pytest -o addopts= -q -rfE -p no:cacheprovider -n 8 \
  "tests/test_training_triton.py::test_triton_gradients_match_hf" \
  "tests/test_model_inputs.py::test_an_unsupported_head_dim_runs_its_attention_on_the_reference" \
  "tests/test_forward_packed.py::test_triton_backend_forward_packed_matches_hf" \
  "tests/test_forward_packed.py::test_forward_packed_cuda_graphs_on_gpu" \
  "tests/test_linear_persistent.py::test_programs_walk_several_tiles" \
  "tests/test_autotune_threads.py::test_a_launch_waits_for_another_threads_tuning" \
  "tests/test_attention_backward.py::test_bad_dropout_p_raises" \
  "tests/test_ops_backward.py::test_embeddings_gradient_rows_of_unused_ids_are_zero" \
  "tests/test_optimize.py::test_losses_and_pooling_that_read_padded_positions_equal_hugging_faces" \
  --junitxml "$OUT/confirm.xml" > "$OUT/confirm.log" 2>&1
echo "pytest exit $?"
tail -40 "$OUT/confirm.log"
