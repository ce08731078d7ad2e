#!/bin/sh
# Runs every test program in BUILD/tests and every end-to-end script tests/*.sh against
# BUILD/performer; prints one line per test and "LABEL: N passed, N failed". Exit 1 on a failure.
build=${1:-build}
label=${2:-tests}
pass=0
fail=0
failed=""
log="$build/test-logs"
mkdir -p "$log"
for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    if "$t" >"$log/$name.log" 2>&1; then
        pass=$((pass + 1)); echo "  ok    $name"
    else
        fail=$((fail + 1)); failed="$failed $name"; echo "  FAIL  $name (log: $log/$name.log)"
        tail -n 20 "$log/$name.log" | sed 's/^/        /'
    fi
done
for s in tests/test_*.sh; do
    [ -f "$s" ] || continue
    name=$(basename "$s" .sh)
    if PERFORMER="$build/performer" BUILD="$build" sh "$s" >"$log/$name.log" 2>&1; then
        pass=$((pass + 1)); echo "  ok    $name"
    else
        fail=$((fail + 1)); failed="$failed $name"; echo "  FAIL  $name (log: $log/$name.log)"
        tail -n 20 "$log/$name.log" | sed 's/^/        /'
    fi
done
echo "$pass $fail" >"$build/test-counts"
echo "$label: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
