# The third GPU run (2026-12-04): two calls, each from the repository root with OUT set:
#   bash benchmarks/results/gpu-h200-2026-12-04/command.sh call1   (then call2)
# call1: the linear's GPU tests (the float32 single-row projections the second run failed),
#   then the stages no GPU had measured or whose code changed since: corpus (CUDA graphs up
#   to 16,384 tokens), train-step, serve (on the GPU), host-overhead.
# call2: after the float32 linear's K tiles were kept apart in the compiled code too, the
#   linear's and the linear gradients' GPU tests; then bench, corpus, limits and kernels.
# call3: the covering core of the GPU test grid on the time left (it ran as one line, the
#   call3 case below; it left OUT/run.log and OUT/run/, unpacked here as call3/).
# call1 and call2 leave OUT/summary.txt and OUT/results.tar.gz (every log and result).
set -u
call="${1:?usage: command.sh call1|call2|call3}"
if [ "$call" = call3 ]; then
    python3 -m benchmarks.gpu_run.install --python python3 > /dev/null 2>&1
    python3 -m benchmarks.gpu_run "$OUT/run" --budget 185 --cap-scale 1.2 --stages gpu-tests \
        > "$OUT/run.log" 2>&1
    echo "exit $?"
    tail -30 "$OUT/run.log"
    exit 0
fi
start=$SECONDS
budget=${BUDGET_S:-550}
work="$OUT/results"
mkdir -p "$work"
left() { echo $((budget - (SECONDS - start))); }

python3 -m benchmarks.gpu_run.install --python python3 > "$work/install.log" 2>&1
echo "install exit $? ($((SECONDS - start)) s)"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

tests() {  # LIMIT TEST...: the core grid of those tests on 12 workers
    local limit=$1
    shift
    timeout "$limit" python3 -m pytest -o addopts= -q -rfE -p no:cacheprovider \
        -p benchmarks.gpu_run.grid --gpu-grid core -n 12 "$@" \
        --junitxml "$work/tests.xml" > "$work/tests.log" 2>&1
    echo "pytest exit $? ($((SECONDS - start)) s)"
    tail -25 "$work/tests.log"
}

stages() {  # SCALE STAGES: benchmarks.gpu_run's stages on the time left
    python3 -m benchmarks.gpu_run "$work/run" --budget "$(($(left) - 15))" --cap-scale "$1" \
        --stages "$2" > "$work/run.log" 2>&1
    echo "gpu_run exit $? ($((SECONDS - start)) s)"
    tail -45 "$work/run.log"
}

case "$call" in
call1)
    tests 110 tests/test_linear.py
    stages 2.5 environment,corpus,train-step,serve-model,serve,host-overhead
    ;;
call2)
    tests 90 tests/test_linear.py tests/test_ops_backward.py
    stages 2 environment,bench,corpus,limits,kernels
    ;;
*)
    echo "usage: command.sh call1|call2|call3" >&2
    exit 2
    ;;
esac

cp "$work/run/summary.txt" "$OUT/summary.txt" 2>/dev/null
tar -czf "$OUT/results.tar.gz" -C "$OUT" results && rm -rf "$work"
ls -la "$OUT"
