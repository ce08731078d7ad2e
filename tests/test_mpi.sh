#!/bin/sh
# test_mpi: sequence-parallel FAVOR+ over MPI (include/performer_mpi.h). Runs the test program
# BUILD/tests/mpi/test_mpi_attn under mpirun with 1, 2 and 3 ranks (more ranks than this
# machine's cores: --oversubscribe; as root: --allow-run-as-root), each run bounded by timeout:
# outputs and gradients against the single process for every map, bidirectional and causal,
# unequal slices and padding; strict causality across ranks; flat bytes against L; every rank
# getting the same status and message for a bad input or ranks that disagree. test_mpi_train runs
# likewise: the language model trained three steps data parallel and sequence parallel against
# one process, and its error cases. Then the tool: `mpirun -np N performer attn` (performer
# starts performer-mpi in its place) at 1, 2 and 3 ranks against one process, every kind of run
# (causal, bidirectional, FAVOR++ and FAVOR#, padding, Lq != Lk, gradients, --save-w): one rank
# the same bytes, more within 1e-6 normwise; then what fails (a NaN, flags, methods and commands
# that do not run across ranks, outputs that cannot be written, no performer-mpi): every rank's
# exit status, the message said once, no file written, a file there before untouched. Then the
# fault: the last of 3 ranks kills itself between two calls, and the others, waiting in a
# collective, must be ended within 30 s (Open MPI's mpirun aborts the job when a rank dies) with
# a non-zero exit. Skipped, saying so, where mpirun or the program is absent (no MPI: make setup
# installs it), but for a performer without performer-mpi under Open MPI's variables.
TEST=test_mpi; . "$(dirname "$0")/lib.sh"
prog="${BUILD:-build}/tests/mpi/test_mpi_attn"
# A performer with no performer-mpi beside it, started as rank 0 of 2 (Open MPI's variables, as
# mpirun sets them): it says it has no MPI and exits 2, doing nothing else (this much runs even
# where MPI is absent).
mkdir "$T/alone" && cp "$P" "$T/alone/performer"
OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 "$T/alone/performer" attn --q x.npy --k x.npy \
    --v x.npy --out "$T/alone/o.npy" 2>"$T/alone.err"
rc=$?
said="this performer was built without MPI .*: install libopenmpi-dev/openmpi-bin (make setup)"
if [ $rc -eq 2 ] && [ ! -e "$T/alone/o.npy" ] && grep -q "$said and rebuild" "$T/alone.err"; then
    pass
else
    fail "performer without performer-mpi under 2 ranks: exit $rc, $(cat "$T/alone.err")"
fi
if ! command -v mpirun >/dev/null 2>&1 || [ ! -x "$prog" ]; then
    echo "test_mpi.sh: skipped: no mpirun or no $prog (MPI absent; make setup installs Open MPI)"
    finish
    exit $?
fi
# Open MPI itself leaks by design at exit: leak reports under ASan would be about it, not us.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# loopback only; no other transport probing (nothing but this machine)
export OMPI_MCA_btl="self,vader,tcp" OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
run() { timeout "$@"; }
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
# the library's attention, then the language model trained across ranks (test_mpi_train: three
# steps data and sequence parallel against one process, and its errors)
for p in "$prog" "$(dirname "$prog")/test_mpi_train"; do
    for n in 1 2 3; do
        log="$T/$(basename "$p").np$n.log"
        if run 600 $MPIRUN -np $n "$p" >"$log" 2>&1; then
            pass
            grep -E "worst|bytes|every rank|validation" "$log"
        else
            fail "mpirun -np $n $p (exit $?):"
            grep -E "FAIL|rror" "$log" | head -n 20
        fi
    done
done
# ---- the tool: mpirun -np N performer attn ------------------------------------------------------
# performer, started by mpirun with more than one rank, starts performer-mpi (the tool's MPI build,
# beside it) in its place; --method favor then cuts the sequence across the ranks and writes what
# one process writes (one rank: the same bytes; more: float rounding), gradients included; a
# failure on any rank ends every rank with one message and no file written.
tool="${BUILD:-build}/performer-mpi"
case "$tool" in /*) ;; *) tool="$(pwd)/$tool" ;; esac
if [ -x "$tool" ]; then
    $PY - "$T" <<'PYEOF'
import sys
import numpy as np
t = sys.argv[1]
r = np.random.default_rng(3)
for n, s in [("q", (2, 2, 50, 8)), ("k", (2, 2, 50, 8)), ("v", (2, 2, 50, 4)),
             ("do", (2, 2, 50, 4)), ("k2", (2, 2, 37, 8)), ("v2", (2, 2, 37, 4)),
             ("q1", (41, 8)), ("k1", (29, 8)), ("v1", (29, 6)), ("do1", (41, 6)),
             ("w", (2, 16, 8))]:
    np.save(f"{t}/{n}.npy", (r.standard_normal(s) * 0.7).astype(np.float32))
np.save(f"{t}/lens.npy", np.array([50, 31], dtype=np.int32))
np.save(f"{t}/lens2.npy", np.array([37, 20], dtype=np.int64))
bad = np.load(f"{t}/q.npy")
bad[1, 1, 40, 3] = np.nan
np.save(f"{t}/qnan.npy", bad)
dnan = np.load(f"{t}/do.npy")
dnan[1, 0, 45, 2] = np.inf
np.save(f"{t}/donan.npy", dnan)
np.save(f"{t}/q2rows.npy", bad[:, :, :2])
np.save(f"{t}/k2rows.npy", np.load(f"{t}/k.npy")[:, :, :2])
np.save(f"{t}/v2rows.npy", np.load(f"{t}/v.npy")[:, :, :2])
PYEOF
    cd "$T"
    # the re-start: performer under mpirun is the MPI build, with the ranks mpirun gave it
    v=$(run 60 $MPIRUN -np 2 "$P" --version 2>&1)
    case "$v" in *"MPI build"*", 2 ranks;"*) pass ;;
        *) fail "mpirun -np 2 performer --version: '$v'" ;; esac
    # same NAME ARGS...: performer attn (one process) against mpirun -np 1, 2, 3 performer attn,
    # and performer-mpi itself at one rank (its MPI path: the same bytes too)
    same() {
        name=$1; shift
        if ! "$P" attn "$@" --out ref.npy --grad-prefix ref --save-w refw.npy 2>ref.log; then
            fail "performer attn ($name) failed: $(cat ref.log)"
            return
        fi
        for n in 1 2 3 m1; do
            prog="$P" np=$n
            [ $n = m1 ] && prog="$tool" np=1
            rm -f o$n.npy g$n.d?.npy w$n.npy
            if ! run 120 $MPIRUN -np $np "$prog" attn "$@" --out o$n.npy --grad-prefix g$n \
                    --save-w w$n.npy >tool$n.log 2>&1; then
                fail "mpirun -np $np $(basename "$prog") attn ($name) failed:"
                tail -n 5 tool$n.log
                continue
            fi
            if ! cmp -s refw.npy w$n.npy; then fail "$name, -np $n: --save-w differs"; continue; fi
            if [ $n = 1 ] || [ $n = m1 ]; then
                if cmp -s ref.npy o$n.npy && cmp -s ref.dq.npy g$n.dq.npy &&
                    cmp -s ref.dk.npy g$n.dk.npy && cmp -s ref.dv.npy g$n.dv.npy; then
                    pass
                else
                    fail "$name at one rank ($(basename "$prog")): not performer attn's bytes"
                fi
                continue
            fi
            if $PY - $n "$name" <<'PYEOF'
import sys
import numpy as np
n, name = sys.argv[1], sys.argv[2]
worst = 0
for a, b in [("ref", f"o{n}"), ("ref.dq", f"g{n}.dq"), ("ref.dk", f"g{n}.dk"),
             ("ref.dv", f"g{n}.dv")]:
    x, y = np.load(a + ".npy"), np.load(b + ".npy")
    assert x.shape == y.shape and x.dtype == y.dtype, (a, x.shape, y.shape)
    worst = max(worst, float(np.linalg.norm(x - y) / np.linalg.norm(x)))
print(f"mpirun -np {n} performer attn ({name}) against one process: "
      f"worst relative error {worst:.3g}")
sys.exit(0 if worst <= 1e-6 else 1)
PYEOF
            then pass; else fail "mpirun -np $n performer attn ($name): outputs differ"; fi
        done
    }
    same "causal, key lengths" --q q.npy --k k.npy --v v.npy --causal --key-lengths lens.npy \
        --grad-out do.npy
    same "bidirectional FAVOR++ fitted, Lq != Lk, key lengths" --q q.npy --k k2.npy --v v2.npy \
        --kernel oprf --key-lengths lens2.npy --grad-out do.npy
    same "causal FAVOR++ given A, chunk 4" --q q.npy --k k.npy --v v.npy --causal --kernel oprf \
        --oprf-a -0.1 --chunk 4 --features 32 --seed 7 --grad-out do.npy
    same "one head (L,d), FAVOR#, Lq != Lk" --q q1.npy --k k1.npy --v v1.npy --kernel sderf \
        --features 64 --grad-out do1.npy
    same "hyperbolic, a W per head" --q q.npy --k k2.npy --v v2.npy --kernel hyperbolic \
        --w w.npy --grad-out do.npy

    # expect NAME CODE TEXT NP ARGS...: mpirun -np NP $prog ARGS (prog: performer), each rank's
    # exit status recorded: every rank exits CODE, and TEXT is said once (not once a rank)
    prog=$P
    expect() {
        name=$1 code=$2 text=$3 np=$4; shift 4
        rm -f ranks.log
        run 120 $MPIRUN -np $np sh -c '"$0" "$@"; echo "$?" >>ranks.log' "$prog" "$@" \
            >err.log 2>&1
        codes=$(sort ranks.log 2>/dev/null | uniq -c | awk '{ print $1 "x" $2 }' | xargs)
        said=$(grep -cF -- "$text" err.log)
        if [ "$codes" = "${np}x$code" ] && [ "$said" -eq 1 ]; then
            pass
            grep -F -- "$text" err.log
        else
            fail "$name: exit statuses '$codes' (wanted ${np}x$code), '$text' said $said times:"
            grep -v '^--\|^ *$' err.log | head -n 8
        fi
    }
    A="attn --q q.npy --k k.npy --v v.npy"
    # a NaN met by the last rank only: the element named as one process names it; nothing
    # written, the file there before untouched
    cp q.npy o.npy
    expect "a NaN in the queries" 1 \
        "qnan.npy: contains NaN or Inf at index 1523 (element (1, 1, 40, 3))" 3 \
        attn --q qnan.npy --k k.npy --v v.npy --out o.npy
    cmp -s o.npy q.npy && pass || fail "a NaN: the output there before was changed"
    expect "a NaN in dO (the backward's)" 1 \
        "donan.npy: contains NaN or Inf at index 582 (element (1, 0, 45, 2))" \
        2 $A --out new.npy --grad-out donan.npy --grad-prefix g
    ls new.npy g.d?.npy 2>/dev/null && fail "a NaN: outputs written" || pass
    # flags
    expect "a flag of another method" 2 "--samples is for --method ra or lara only" 2 \
        $A --out new.npy --samples 4
    expect "an unknown flag" 2 "unknown option '--bogus'" 3 $A --out new.npy --bogus
    expect "a flag given twice" 2 "--seed is given twice" 2 $A --out new.npy --seed 1 --seed 2
    expect "--method exact" 2 "exact attention needs every key on every rank" 2 \
        $A --out new.npy --method exact
    expect "--method lara" 2 "--method lara does not run under mpirun" 3 $A --out new.npy \
        --method lara
    expect "demo" 2 "performer demo: does not run under mpirun" 2 demo
    expect "train without --parallel" 2 "2 ranks: --parallel data or --parallel sequence" 2 \
        train --out newrun
    [ -e newrun ] && fail "a refused train made newrun" || pass
    expect "fewer rows than ranks" 1 "2 queries cannot be cut across 3 ranks" 3 \
        attn --q q2rows.npy --k k2rows.npy --v v2rows.npy --out new.npy
    [ -e new.npy ] && fail "a refused run wrote new.npy" || pass
    # outputs: a missing folder is refused before any work; a gradient that cannot be written
    # after the output was staged (root passes access(): /proc takes no new files) leaves no
    # file written and the one there before as it was
    cp q.npy o.npy
    expect "--grad-prefix in a missing folder" 1 "nofolder/g.dq.npy: cannot write" 2 \
        $A --out o.npy --grad-out do.npy --grad-prefix nofolder/g
    if [ "$(id -u)" -eq 0 ]; then
        expect "a gradient that cannot be written" 1 "/proc/pf_test_mpi.dq.npy" 3 \
            $A --out o.npy --grad-out do.npy --grad-prefix /proc/pf_test_mpi
    else
        mkdir ro && chmod 555 ro
        expect "--grad-prefix in a read-only folder" 1 "Permission denied" 3 \
            $A --out o.npy --grad-out do.npy --grad-prefix ro/g
    fi
    cmp -s o.npy q.npy && pass || fail "a failed write: the output there before was changed"
    left=$(find . -name '*.tmp.*')
    [ -z "$left" ] && pass || fail "temporary files left: $left"
    # --timings: one line, from rank 0
    run 120 $MPIRUN -np 2 "$P" $A --out t.npy --timings >err.log 2>&1
    [ "$(grep -c 'the slowest rank computed' err.log)" -eq 1 ] && pass ||
        fail "--timings at 2 ranks: $(cat err.log)"
    # a performer without performer-mpi beside it: it says so and exits 2 on every rank
    prog=$T/alone/performer
    expect "no performer-mpi" 2 "this performer was built without MPI" 2 $A --out new.npy
    cd - >/dev/null
else
    echo "test_mpi.sh: no $tool: the tool under mpirun is not checked"
fi
# the fault
start=$(date +%s)
run 60 $MPIRUN -np 3 "$prog" kill >"$T/kill.log" 2>&1
rc=$?
took=$(($(date +%s) - start))
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -le 30 ]; then
    pass
    echo "a rank killed mid-run: mpirun ended the others after ${took} s (exit $rc)"
else
    fail "a rank killed mid-run: exit $rc after ${took} s (wanted non-zero within 30 s)"
    tail -n 5 "$T/kill.log"
fi
finish
