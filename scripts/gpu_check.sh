#!/bin/sh
# gpu_check.sh: everything that needs an NVIDIA GPU, in one go, each step's log kept:
#   1. the machine: GPU, driver, CUDA, PyTorch, and what the libraries load (ldd)
#   2. the CUDA test programs (tests/cuda/test_cuda.c, the forward; test_cuda_backward.c, the
#      backward) and the CPU emulation of the forward's arithmetic
#   3. the PyTorch tests on CUDA tensors (python/tests/test_torch_cuda.py), and a training run
#      (bench/cuda/train_gpu.py: ours, performer-pytorch's formulation and SDPA, bf16)
#   4. the benchmark (bench/cuda/bench_cuda.py): the report and its CSV
#   5. the test programs again under compute-sanitizer memcheck (--quick sizes), one step each
#
#   make && sh scripts/gpu_check.sh [LOGDIR]     (LOGDIR: build/gpu-logs)
#
# BUILD names the build folder (build); BENCH_BUDGET the benchmark's seconds (200) and BENCH_ARGS
# more of its arguments ("--only fwdbwd", say); TRAIN_SECONDS each training run's most seconds
# (60) and TRAIN_DATA its text (BUILD/bible-kjv.txt: train_gpu.py --make-data writes it where the
# bible program is);
# SANITIZER_TIMEOUT memcheck's, for each program (600), SANITIZER_ONLY the backward program's cases
# under it (--only: all); SKIP lists steps to leave out
# ("sanitizer sanitizer_backward bench"). Prints one line per step and "gpu_check: N passed,
# N failed"; exit 1 on a failure. docs/gpu_runs.md keeps what each run on a GPU showed.
set -u
BUILD=${BUILD:-build}
LOG=${1:-$BUILD/gpu-logs}
BENCH_BUDGET=${BENCH_BUDGET:-200}
BENCH_ARGS=${BENCH_ARGS:-}
TRAIN_SECONDS=${TRAIN_SECONDS:-60}
TRAIN_DATA=${TRAIN_DATA:-$BUILD/bible-kjv.txt}
SANITIZER_TIMEOUT=${SANITIZER_TIMEOUT:-600}
SKIP=${SKIP:-}
mkdir -p "$LOG"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export PERFORMER_LIB="$PWD/$BUILD/libperformer.so.0"
export PERFORMER_CUDA_LIB="$PWD/$BUILD/libperformer_cuda.so.0"
export PYTHONUNBUFFERED=1
pass=0
fail=0
step() { # step NAME TIMEOUT COMMAND...: runs it, logs to LOG/NAME.log, counts it
    name=$1
    limit=$2
    shift 2
    case " $SKIP " in *" $name "*) echo "  skip  $name"; return 0 ;; esac
    t0=$(date +%s)
    timeout "$limit" "$@" >"$LOG/$name.log" 2>&1
    rc=$?
    t1=$(date +%s)
    if [ $rc -eq 0 ]; then
        pass=$((pass + 1)); echo "  ok    $name ($((t1 - t0)) s)"
    else
        fail=$((fail + 1)); echo "  FAIL  $name (exit $rc, $((t1 - t0)) s; log: $LOG/$name.log)"
        tail -n 25 "$LOG/$name.log" | sed 's/^/        /'
    fi
}

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
    nvcc --version 2>/dev/null | tail -n 2
    command -v compute-sanitizer || echo "compute-sanitizer: not found"
    $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())' || true
    for f in "$BUILD/libperformer.so.0" "$BUILD/libperformer_cuda.so.0" \
        "$BUILD/tests/cuda/test_cuda" "$BUILD/tests/cuda/test_cuda_backward"; do
        echo "ldd $f:"
        ldd "$f" 2>&1 | sed 's/^/    /'
    done
} >"$LOG/machine.log" 2>&1
head -n 4 "$LOG/machine.log"
if grep -q 'not found' "$LOG/machine.log"; then
    echo "  (missing shared libraries: see $LOG/machine.log)"
fi

step test_cuda 300 "$BUILD/tests/cuda/test_cuda"
step test_cuda_backward 300 "$BUILD/tests/cuda/test_cuda_backward"
step emulate 120 $PY tests/cuda/emulate_favor.py
step torch_cuda 300 $PY -m unittest discover -v -s python/tests -p test_torch_cuda.py
# a byte-level Transformer trained in bf16 through performer.torch on the GPU, and the same model
# with performer-pytorch's formulation in pure torch and with SDPA (the text: TRAIN_DATA)
step train $((3 * TRAIN_SECONDS + 60)) $PY bench/cuda/train_gpu.py --device cuda --dtype bf16 \
    --data "$TRAIN_DATA" --max-seconds "$TRAIN_SECONDS" --csv "$LOG/train_gpu_cuda_bf16.csv" \
    --report "$LOG/train_gpu_cuda_bf16.txt" --reference docs/train_gpu_cpu_fp32.csv
# shellcheck disable=SC2086 # BENCH_ARGS: words
step bench $((BENCH_BUDGET + 60)) $PY bench/cuda/bench_cuda.py --budget "$BENCH_BUDGET" \
    --out "$LOG/bench_cuda.txt" --csv "$LOG/bench_cuda.csv" $BENCH_ARGS
# last: memcheck slows every kernel 10-100x
if command -v compute-sanitizer >/dev/null 2>&1; then
    step sanitizer "$SANITIZER_TIMEOUT" compute-sanitizer --tool memcheck --error-exitcode 1 \
        "$BUILD/tests/cuda/test_cuda" --quick
    # shellcheck disable=SC2086 # SANITIZER_ONLY: the cases' letters, one word
    step sanitizer_backward "$SANITIZER_TIMEOUT" compute-sanitizer --tool memcheck \
        --error-exitcode 1 "$BUILD/tests/cuda/test_cuda_backward" --quick \
        ${SANITIZER_ONLY:+--only $SANITIZER_ONLY}
else
    echo "  skip  sanitizer, sanitizer_backward (compute-sanitizer not on PATH)"
fi
echo "gpu_check: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
