#!/bin/sh
# Runs every test program in BUILD/tests and every end-to-end script tests/*.sh against
# BUILD/performer (and, for each vector path in SIMD_PATHS, the FAVOR+ tests on it); prints one
# line per test (with its seconds) and "LABEL: N passed, N failed". Exit 1 on a failure.
build=${1:-build}
label=${2:-tests}
pass=0
fail=0
failed=""
log="$build/test-logs"
mkdir -p "$log"
# OpenBLAS falls back to a generic kernel set on a CPU model it does not know; the tool then
# starts again with OPENBLAS_CORETYPE set (pf_blas_core_advised). The test programs run on the
# same kernels: the set the tool chose, exported when it chose one.
if [ -z "${OPENBLAS_CORETYPE-}" ] && [ -x "$build/performer" ]; then
    core=$("$build/performer" --version 2>/dev/null |
        sed -n "s/.*OpenBLAS kernels: \([A-Za-z0-9_]*\), set by performer over.*/\1/p")
    if [ -n "$core" ]; then
        export OPENBLAS_CORETYPE="$core"
        echo "  (OpenBLAS kernels: OPENBLAS_CORETYPE=$core, as performer sets them on this CPU)"
    fi
fi
for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    start=$(date +%s)
    if "$t" >"$log/$name.log" 2>&1; then
        pass=$((pass + 1)); echo "  ok    $name ($(($(date +%s) - start)) s)"
    else
        fail=$((fail + 1)); failed="$failed $name"; echo "  FAIL  $name (log: $log/$name.log)"
        tail -n 20 "$log/$name.log" | sed 's/^/        /'
    fi
done
# The FAVOR+ tests again on each other vector path this CPU runs (PF_SIMD; the default is the
# widest): every path's exp, features and small products under the attention's own checks.
for path in ${SIMD_PATHS-}; do
    case $path in
        avx512) grep -q '\<avx512f\>' /proc/cpuinfo 2>/dev/null || continue ;;
        avx2) grep -q '\<avx2\>' /proc/cpuinfo 2>/dev/null || continue ;;
    esac
    for name in test_favor_forward test_favor_state test_favor_backward; do
        t="$build/tests/$name"
        [ -x "$t" ] || continue
        start=$(date +%s)
        if PF_SIMD=$path "$t" >"$log/$name.$path.log" 2>&1; then
            pass=$((pass + 1)); echo "  ok    $name ($path, $(($(date +%s) - start)) s)"
        else
            fail=$((fail + 1)); failed="$failed $name.$path"
            echo "  FAIL  $name ($path; log: $log/$name.$path.log)"
            tail -n 20 "$log/$name.$path.log" | sed 's/^/        /'
        fi
    done
done
for s in tests/test_*.sh; do
    [ -f "$s" ] || continue
    name=$(basename "$s" .sh)
    start=$(date +%s)
    if PERFORMER="$build/performer" BUILD="$build" sh "$s" >"$log/$name.log" 2>&1; then
        pass=$((pass + 1)); echo "  ok    $name ($(($(date +%s) - start)) s)"
    else
        fail=$((fail + 1)); failed="$failed $name"; echo "  FAIL  $name (log: $log/$name.log)"
        tail -n 20 "$log/$name.log" | sed 's/^/        /'
    fi
done
echo "$pass $fail" >"$build/test-counts"
echo "$label: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
