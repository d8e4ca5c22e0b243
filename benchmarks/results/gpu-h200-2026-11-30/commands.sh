# The second GPU run's three calls, from the repository root with OUT set:
#   bash benchmarks/results/gpu-h200-2026-11-30/commands.sh call1   (then call2, call3)
# (each call ran these lines from a file of its own; gathered here afterwards, unchanged).
# call1: the tests the first run failed and their files, diagnose.py, then the stages the first
#   run's cold caches cut short. call2: the linear compiled without fusions, the real-shape
#   attention gradients without gradients on padded rows, varlen against dense in one tile
#   config; the kernel suite and BERT-base's forward. call3: the linear back on the compiler's
#   fusions, the custom ops held to the public function in the same variant, the attention's
#   IEEE reciprocal a row; the kernel suite again.
set -u
call="${1:?usage: commands.sh call1|call2|call3}"
n="${call#call}"
[ "$n" = 1 ] && n=""
python3 -m benchmarks.gpu_run.install --python python3 > "$OUT/install$n.log" 2>&1 || true
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

tests() {  # LIMIT TEST...: the core grid of those tests on 12 workers
    local limit=$1
    shift
    timeout "$limit" python3 -m pytest -o addopts= -q -rfE -p no:cacheprovider \
        -p benchmarks.gpu_run.grid --gpu-grid core -n 12 "$@" \
        --junitxml "$OUT/tests$n.xml" > "$OUT/tests$n.log" 2>&1
    echo "pytest exit $?"
    tail -45 "$OUT/tests$n.log"
}

stages() {  # BUDGET STAGES: benchmarks.gpu_run's stages, caps doubled
    python3 -m benchmarks.gpu_run "$OUT/run$n" --budget "$1" --cap-scale 2 --stages "$2" \
        > "$OUT/run$n.log" 2>&1
    echo "gpu_run exit $?"
    tail -30 "$OUT/run$n.log"
}

case "$call" in
call1)
    tests 210 tests/test_linear_quantized.py tests/test_layer_norm.py tests/test_softmax.py \
        tests/test_embeddings.py tests/test_gpu_real_shapes.py tests/test_attention_backward.py \
        tests/test_custom_ops.py tests/test_forward_packed.py tests/test_model_inputs.py \
        tests/test_modernbert_triton.py tests/test_dropout.py tests/test_ops_backward.py \
        tests/test_attention.py
    timeout 90 env PYTHONPATH=. python3 benchmarks/results/gpu-h200-2026-11-30/diagnose.py \
        > "$OUT/diagnose.log" 2>&1
    echo "diagnose exit $?"
    cat "$OUT/diagnose.log"
    stages 230 environment,corpus,limits,kernels,train-step,serve-model,serve
    ;;
call2)
    tests 130 tests/test_linear.py tests/test_linear_quantized.py \
        tests/test_linear_persistent.py "tests/test_gpu_real_shapes.py::test_attention_gradients" \
        "tests/test_custom_ops.py::test_custom_op_equals_public_function" \
        "tests/test_attention.py::test_varlen_matches_dense_per_sequence"
    stages 200 kernels,bench
    ;;
call3)
    tests 75 "tests/test_linear.py::test_gpu_bert_projections" \
        "tests/test_custom_ops.py::test_custom_op_equals_public_function" \
        "tests/test_attention.py::test_varlen_matches_dense_per_sequence" \
        "tests/test_attention.py::test_sequence_lengths" tests/test_gpu_real_shapes.py
    stages 90 kernels
    ;;
*)
    echo "usage: commands.sh call1|call2|call3" >&2
    exit 2
    ;;
esac
