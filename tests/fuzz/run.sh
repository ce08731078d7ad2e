#!/bin/sh
# Runs the libFuzzer targets BUILD/fuzz_* (make fuzz, make fuzz-regress).
#   sh tests/fuzz/run.sh BUILD regress   every seed (tests/fuzz/corpus/<target>/) and every kept
#                                        finding (tests/fuzz/regress/<target>/) once
#   sh tests/fuzz/run.sh BUILD fuzz      each target for FUZZ_TIME seconds (default 60),
#                                        FUZZ_JOBS at a time (default 2)
#   sh tests/fuzz/run.sh BUILD all       both
# FUZZ_ONLY (names, e.g. "fuzz_npy fuzz_text") limits the run to those targets.
#
# A fuzz run starts from the seeds and what earlier runs found (BUILD/corpus/<target>/, the only
# folder libFuzzer writes new inputs to: the committed seeds are read only), and stops at the
# first finding, leaving the input in BUILD/findings/<target>/. A finding is a crash, a
# sanitizer report, a leak, a failed FUZZ_CHECK, an input taking more than 10 s, an allocation
# of 1 GiB or more (a size taken from a file's header unchecked) or 2 GiB resident.
# One line per run, "fuzz: N passed, N failed", and BUILD/test-counts ("passed failed") for the
# total that make test prints. Exit 1 if anything failed.
build=${1:-build-fuzz}
mode=${2:-all}
time=${FUZZ_TIME:-60}
jobs=${FUZZ_JOBS:-2}
limits="-rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10"
here=tests/fuzz
pass=0
fail=0
mkdir -p "$build/logs" "$build/tmp"
# the harness's input files go to the build folder; BLAS runs on the calling thread alone, like
# the library built without OpenMP
export TMPDIR="$build/tmp" OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

targets=""
for t in "$build"/fuzz_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    if [ -n "${FUZZ_ONLY:-}" ]; then
        case " $FUZZ_ONLY " in *" $name "*) ;; *) continue ;; esac
    fi
    targets="$targets $name"
done
if [ -z "$targets" ]; then
    echo "fuzz: no targets in $build (make fuzz builds them)"
    echo "0 1" >"$build/test-counts"
    exit 1
fi

# What a failed run's log says: the sanitizer's report, its stack and the input kept.
summary() {
    grep -E 'ERROR|SUMMARY|fuzz check failed|runtime error|#[0-9]+ 0x|Test unit written' "$1" |
        grep -v 'in fuzzer::' | head -n 30 | sed 's/^/        /'
}

ok() {
    pass=$((pass + 1)); echo "  ok    $1"
}

bad() {
    fail=$((fail + 1)); echo "  FAIL  $1 (log: $2)"
    summary "$2"
}

regress() {
    for name in $targets; do
        files=$(find "$here/corpus/$name" "$here/regress/$name" -type f 2>/dev/null | sort)
        n=$(echo "$files" | grep -c .)
        log="$build/logs/$name.regress.log"
        if [ "$n" -eq 0 ]; then
            bad "$name: no seeds in $here/corpus/$name" /dev/null
            continue
        fi
        # libFuzzer runs inputs given as files once each, without fuzzing
        # shellcheck disable=SC2086
        if "$build/$name" $limits $files >"$log" 2>&1; then
            ok "$name regress ($n inputs)"
        else
            bad "$name regress ($n inputs)" "$log"
        fi
    done
}

# One target for $time seconds; its exit status to the file $build/logs/$name.rc.
fuzz_one() {
    name=$1
    work="$build/corpus/$name"
    mkdir -p "$work" "$build/findings/$name"
    dict=""
    [ -f "$here/$name.dict" ] && dict="-dict=$here/$name.dict"
    # room to grow: 1 KiB over the largest seed, at least libFuzzer's 4 KiB (its own default is
    # the largest seed, where a header could not grow by a byte)
    big=$(find "$here/corpus/$name" -type f -exec wc -c {} + |
          awk '$2 != "total" && $1 > m { m = $1 } END { print m + 0 }')
    max_len=$((big + 1024 > 4096 ? big + 1024 : 4096))
    # shellcheck disable=SC2086
    "$build/$name" $limits $dict -max_len=$max_len -max_total_time="$time" -print_final_stats=1 \
        -artifact_prefix="$build/findings/$name/" "$work" "$here/corpus/$name" \
        >"$build/logs/$name.fuzz.log" 2>&1
    echo $? >"$build/logs/$name.rc"
}

# "N runs, N/s, cov N, ft N, corpus N" from a finished run's log.
stats() {
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$1" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$1" | tail -n 1)
    cov=$(grep -E '^#[0-9]+' "$1" | grep ' cov: ' | tail -n 1 |
          sed 's/.* cov: \([0-9]*\) ft: \([0-9]*\) corp: \([0-9]*\).*/cov \1, ft \2, corpus \3/')
    echo "${runs:-?} runs, ${rate:-?}/s, ${cov:-cov ?}"
}

fuzz() {
    set -- $targets
    while [ $# -gt 0 ]; do
        batch=""
        i=0
        while [ $# -gt 0 ] && [ $i -lt "$jobs" ]; do
            batch="$batch $1"; shift; i=$((i + 1))
            fuzz_one "${batch##* }" &
        done
        wait
        for name in $batch; do
            log="$build/logs/$name.fuzz.log"
            if [ "$(cat "$build/logs/$name.rc" 2>/dev/null)" = 0 ]; then
                ok "$name ($time s: $(stats "$log"))"
            else
                bad "$name (findings: $build/findings/$name/)" "$log"
            fi
        done
    done
}

case $mode in
    regress) regress ;;
    fuzz) fuzz ;;
    all) regress; fuzz ;;
    *) echo "usage: run.sh BUILD regress|fuzz|all" >&2; exit 2 ;;
esac
echo "$pass $fail" >"$build/test-counts"
echo "fuzz: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
