#!/bin/sh
# test_targets.sh: bench/targets.py's verdicts and its errors, with stand-in benchmarks (no
# timing: each stand-in writes the table its benchmark would, with the figures the case sets).
# - At the targets' lines (75%, 1.15x, 70%, 2x, 50%, 60%) every target is met, and just past
#   one line only that target is not; the figures shown are the ones the benchmarks gave.
# - A benchmark that fails or is killed, a training step that did not run, or a missing one: a
#   message, a non-zero exit, and a --md file that existed before left as it was.
TEST=test_targets; . "$(dirname "$0")/lib.sh"

root=$(pwd)
B="$T/build"
mkdir -p "$B/bench"

# sourced by each stand-in (its arguments are the caller's): csv, the file after --csv, and
# lengths, bench_attn's; the stand-in named by FAKE_FAIL fails
cat >"$B/bench/common.sh" <<'XEOF'
csv=
lengths=
while [ $# -gt 0 ]; do
    case $1 in
        --csv) csv=$2; shift ;;
        --lengths) lengths=$(echo "$2" | tr , ' '); shift ;;
    esac
    shift
done
[ "${FAKE_FAIL:-}" = "$(basename "$0")" ] && { echo "stand-in fails" >&2; exit 3; }
[ "${FAKE_KILL:-}" = "$(basename "$0")" ] && kill -9 $$
machine='"Test CPU, vector kernels avx2, OpenBLAS kernels Haswell"'
XEOF
cat >"$B/bench/bench_attn" <<'XEOF'
#!/bin/sh
. "$(dirname "$0")/common.sh"
{
echo "L,method,causal,fwd_seconds,fwdbwd_seconds,gflops,sgemm_fraction,fwd_mib,fwdbwd_mib,saved_seconds,saved_mib,saved_heads,save_fwd_seconds,fma_fraction,fma_peak_gflops,sgemm_gflops,machine"
for L in $lengths; do
    f=$FAKE_FWD; [ "$L" = "${FAKE_LOW_AT:-}" ] && f=$FAKE_LOW
    r=$FAKE_RATIO; [ "$L" = "${FAKE_SLOW_AT:-}" ] && r=$FAKE_SLOW
    echo "$L,favor,0,0.01,0.03,100,0.9,1,2,0,0,8,0.011,$f,200,150,$machine"
    echo "$L,favor,1,$(awk "BEGIN { print 0.01 * $r }"),0.03,90,0.8,1,2,0,0,8,0.012,0.6,200,150,$machine"
    if [ "$L" -le 4096 ]; then
        echo "$L,exact,0,0.05,0.2,120,0.8,1,2,0,0,0,0,$FAKE_EXACT,200,150,$machine"
        echo "$L,exact,1,0.03,0.1,110,0.7,1,2,0,0,0,0,0.5,200,150,$machine"
    fi
done
} >"$csv"
XEOF
cat >"$B/bench/profile_favor" <<'XEOF'
#!/bin/sh
k=$FAKE_KEPT; case " $* " in *" --causal "*) k=$FAKE_KEPT_CAUSAL ;; esac
. "$(dirname "$0")/common.sh"
printf '%-40s %9s %8s\n' call ms '% peak' "forward (pf_attn_favor)" 50.00 75 \
    "keeping forward (pf_attn_favor_save)" 53.00 72 "backward from kept features" 80.00 "$k"
XEOF
cat >"$B/bench/bench_decode" <<'XEOF'
#!/bin/sh
. "$(dirname "$0")/common.sh"
{
echo "context,threads,seconds_per_token,ratio_to_first,flops_per_token,peak_seconds_per_token,peak_multiple,fma_peak_gflops,machine"
for c in 1024 4096 16384; do
    m=1.5; [ "$c" = 4096 ] && m=$FAKE_DEC
    echo "$c,1,$(awk "BEGIN { print 9e-6 * $m }"),1,1e6,9e-6,$m,110,$machine"
    echo "$c,2,1.2e-05,1,1e6,4.5e-6,2.7,220,$machine"
done
} >"$csv"
XEOF
cat >"$B/bench/bench_train" <<'XEOF'
#!/bin/sh
. "$(dirname "$0")/common.sh"
{
echo "context,method,batch,tokens,status,note,seconds_per_step,tokens_per_second,forward_seconds,backward_seconds,optimizer_seconds,steps,peak_mib,estimate_mib,model_flops_per_token,gflops,fma_fraction,exact_over_favor_time,exact_over_favor_memory,params,loss,layers,d_model,heads,features,fma_peak_gflops,threads,cpu_seconds_per_step,cores_busy,fma_fraction_per_cpu,fma_peak_gflops_per_cpu_second,machine"
echo "1024,exact,32,32768,ok,\"\",7,4681,2,5,0.1,3,3600,3500,1e6,110,0.45,,,1000,5.5,4,256,4,256,230,2,14,2,0.45,115,$machine"
echo "1024,favor,32,32768,${FAKE_TRAIN_STATUS:-ok},\"\",5,6553,2,3,0.1,3,4600,4500,1e6,160,$FAKE_TRAIN,1.4,0.77,1000,5.5,4,256,4,256,230,2,10,2,0.7,115,$machine"
} >"$csv"
XEOF
chmod +x "$B/bench/bench_attn" "$B/bench/profile_favor" "$B/bench/bench_decode" \
    "$B/bench/bench_train"

# the figures at the targets' lines
at_line() {
    env FAKE_FWD=0.75 FAKE_RATIO=1.15 FAKE_KEPT=70 FAKE_KEPT_CAUSAL=70 FAKE_DEC=2.0 \
        FAKE_TRAIN=0.5 FAKE_EXACT=0.6 "$@"
}
targets() { # [FAKE_X=VALUE...] [ARGS...]: targets.py ARGS against the stand-ins, the FAKE_
    # settings over the lines'; output in $T/out and $T/err; its exit status
    envs=
    while [ $# -gt 0 ]; do
        case $1 in FAKE_*=*) envs="$envs $1"; shift ;; *) break ;; esac
    done
    # shellcheck disable=SC2086
    (cd "$T" && at_line $envs "$PY" "$root/bench/targets.py" --build "$B" "$@" >"$T/out" \
        2>"$T/err")
}
row() { grep -F "| $1" "$T/out"; }

targets --md "$T/t.md"; rc=$?
[ $rc -eq 0 ] && pass || fail "at the lines: exit $rc, $(cat "$T/err")"
n=$(grep -c '| yes |$' "$T/out")
[ "$n" -eq 6 ] && pass || { fail "at the lines: $n of 6 targets met"; cat "$T/out"; }
grep -q "Targets on Test CPU, vector kernels avx2, OpenBLAS kernels Haswell" "$T/out" && pass ||
    fail "the table does not name the machine"
row "FAVOR+ bidirectional" | grep -q "75% at 2048, 75% at 4096, 75% at 8192, 75% at 16384, 75% at 32768, 75% at 65536 |" &&
    pass || fail "forward row: $(row "FAVOR+ bidirectional")"
row "causal" | grep -q "1.15x at 2048.*1.15x at 65536 |" && pass || fail "causal row: $(row causal)"
row "decoding" | grep -q "1.50x-2.00x (13.5-18.0 us a token, contexts 1024-16384)" && pass ||
    fail "decoding row: $(row decoding)"
row "training" | grep -q "FAVOR+ 50% (5.00 s a step); exact 45%" && pass ||
    fail "training row: $(row training)"
row "exact" | grep -q "60% at 2048, 60% at 4096 |" && pass || fail "exact row: $(row exact)"
# --md holds the same table
sed -n '/^Targets on/,$p' "$T/out" | cmp -s - "$T/t.md" && pass || fail "--md differs from stdout"

# just past each line: that target alone is not met
for case in "FAKE_LOW_AT=16384 FAKE_LOW=0.7499|FAVOR+ bidirectional" \
    "FAKE_SLOW_AT=4096 FAKE_SLOW=1.151|causal" "FAKE_KEPT_CAUSAL=69|backward" \
    "FAKE_KEPT=69|backward" "FAKE_DEC=2.01|decoding" "FAKE_TRAIN=0.499|training" \
    "FAKE_EXACT=0.599|exact"; do
    # shellcheck disable=SC2086
    targets ${case%|*}; rc=$?
    miss=$(grep -c '| \*\*no\*\* |$' "$T/out")
    [ $rc -eq 0 ] && [ "$miss" -eq 1 ] && row "${case#*|}" | grep -q '| \*\*no\*\* |$' && pass ||
        fail "$case: exit $rc, $miss targets missed: $(cat "$T/out" "$T/err")"
done

# errors: each leaves an existing --md file as it was
echo "before" >"$T/keep.md"
kept() { [ "$(cat "$T/keep.md")" = before ]; }
for b in bench_attn profile_favor bench_decode bench_train; do
    targets FAKE_FAIL=$b --md "$T/keep.md"; rc=$?
    [ $rc -eq 1 ] && grep -q "$b exited with status 3" "$T/err" && kept && pass ||
        fail "$b failing: exit $rc, $(cat "$T/err")"
done
targets FAKE_KILL=bench_decode --md "$T/keep.md"; rc=$?
[ $rc -eq 1 ] && grep -q "bench_decode was killed by signal 9" "$T/err" && kept && pass ||
    fail "bench_decode killed: exit $rc, $(cat "$T/err")"
targets FAKE_TRAIN_STATUS=out_of_memory --md "$T/keep.md"; rc=$?
[ $rc -eq 1 ] && grep -q "FAVOR+ step did not run.*out_of_memory" "$T/err" && kept && pass ||
    fail "training not run: exit $rc, $(cat "$T/err")"
mv "$B/bench/bench_decode" "$T/bench_decode"
targets --md "$T/keep.md"; rc=$?
[ $rc -eq 2 ] && grep -q "not built: bench_decode" "$T/err" && kept && pass ||
    fail "a benchmark missing: exit $rc, $(cat "$T/err")"
mv "$T/bench_decode" "$B/bench/bench_decode"
targets --md "$T/nowhere/t.md"; rc=$?
[ $rc -eq 2 ] && grep -q "no folder" "$T/err" && pass || fail "--md into no folder: exit $rc"
targets --md "$T"; rc=$?
[ $rc -eq 2 ] && grep -q "a folder" "$T/err" && pass || fail "--md a folder: exit $rc"
# a symlink: its target gets the table, the link stays a link; a FIFO is refused untouched
echo old >"$T/real.md"
ln -s "$T/real.md" "$T/link.md"
targets --md "$T/link.md"; rc=$?
[ $rc -eq 0 ] && [ -L "$T/link.md" ] && grep -q "^Targets on Test CPU" "$T/real.md" && pass ||
    fail "--md through a symlink: exit $rc, $(ls -l "$T/link.md"), $(head -n 1 "$T/real.md")"
if mkfifo "$T/fifo.md" 2>/dev/null; then
    targets --md "$T/fifo.md"; rc=$?
    [ $rc -eq 2 ] && grep -q "not a regular file" "$T/err" && [ -p "$T/fifo.md" ] && pass ||
        fail "--md a FIFO: exit $rc, $(cat "$T/err")"
fi
left=
for f in "$T"/.targets-*; do [ -e "$f" ] && left="$left $f"; done
[ -z "$left" ] && pass || fail "temporary files left:$left"
targets --bogus; rc=$?
[ $rc -eq 2 ] && pass || fail "an unknown flag: exit $rc"
finish
