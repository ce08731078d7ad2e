#!/bin/sh
# test_cuda: FAVOR+ on the GPU (include/performer_cuda.h). Runs the test programs
# BUILD/tests/cuda/test_cuda (tests/cuda/test_cuda.c: every output of libperformer_cuda against
# the CPU library, float32, bfloat16 and float16, bidirectional and causal, padding, strict
# causality, decoding, every refused argument) and BUILD/tests/cuda/test_cuda_backward
# (tests/cuda/test_cuda_backward.c: the backward's gradients against the CPU's, kept or
# recomputed features, strict causality, padding, every refused argument), each of which prints
# one line per case with its error and says itself that it skips where there is no GPU or no
# driver. Skipped, saying so, where a program is absent (no nvcc: the CUDA library is not built).
# With PF_CUDA_SANITIZER=1 and compute-sanitizer on PATH, each program again with --quick
# (smaller sizes, every kind of case) under compute-sanitizer's memcheck, which must report no
# error.
TEST=test_cuda; . "$(dirname "$0")/lib.sh"
# The forward's arithmetic, with its buffers' layouts and cuBLAS arguments, emulated on the CPU
# against pf_attn_favor (tests/cuda/emulate_favor.py): runs everywhere, GPU or not, but for the
# sanitizer build (python would need the ASan runtime preloaded; test_python covers that build).
# The backward's likewise (tests/cuda/emulate_backward.py), and with its half-precision roundings.
lib="${BUILD:-build}/libperformer.so.0"
if [ -f "$lib" ] && ! nm -D "$lib" 2>/dev/null | grep -q __asan_init; then
    for emu in emulate_favor emulate_backward; do
        if PYTHONPATH=python PERFORMER_LIB="$lib" /usr/bin/python3 "tests/cuda/$emu.py" \
            >"$T/$emu.log" 2>&1; then
            pass; tail -n 1 "$T/$emu.log"
        else
            fail "tests/cuda/$emu.py:"; grep -v '^ok' "$T/$emu.log" | tail -n 20
        fi
    done
else
    echo "test_cuda.sh: the emulation is not run on a sanitizer build"
fi
# run_prog NAME: BUILD/tests/cuda/NAME, then (PF_CUDA_SANITIZER=1) again under memcheck
run_prog() {
    name=$1
    prog="${BUILD:-build}/tests/cuda/$name"
    if [ ! -x "$prog" ]; then
        echo "test_cuda.sh: $name skipped: no $prog (built where nvcc is found: make cuda)"
        return 0
    fi
    log="$T/$name.log"
    timeout 900 "$prog" >"$log" 2>&1
    rc=$?
    cat "$log"
    if [ $rc -eq 0 ]; then
        pass
    else
        fail "$prog (exit $rc):"
        grep '^FAIL' "$log" | head -n 20
    fi
    if grep -q "^$name: skipped" "$log"; then
        # no GPU here: nothing for the sanitizer to run on
        return 0
    fi
    if [ "${PF_CUDA_SANITIZER-}" = 1 ]; then
        if command -v compute-sanitizer >/dev/null 2>&1; then
            mlog="$T/$name.memcheck.log"
            timeout 1800 compute-sanitizer --tool memcheck --error-exitcode 1 "$prog" --quick \
                >"$mlog" 2>&1
            rc=$?
            if [ $rc -eq 0 ]; then
                pass
                grep 'ERROR SUMMARY' "$mlog"
            else
                fail "compute-sanitizer --tool memcheck $prog --quick (exit $rc):"
                grep -E '^=+ (ERROR|Invalid|Program hit|Address|Saved host)|^FAIL|ERROR SUMMARY' \
                    "$mlog" | head -n 40
            fi
        else
            echo "test_cuda.sh: PF_CUDA_SANITIZER=1, but no compute-sanitizer on PATH:" \
                "memcheck of $name not run"
        fi
    fi
}
run_prog test_cuda
run_prog test_cuda_backward
finish
