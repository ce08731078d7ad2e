#!/bin/sh
# test_mpi: sequence-parallel FAVOR+ over MPI (include/performer_mpi.h). Runs the test program
# BUILD/tests/mpi/test_mpi_attn under mpirun with 1, 2 and 3 ranks (more ranks than this
# machine's cores: --oversubscribe; as root: --allow-run-as-root), each run bounded by timeout:
# outputs and gradients against the single process for every map, bidirectional and causal,
# unequal slices and padding; strict causality across ranks; flat bytes against L; every rank
# getting the same status and message for a bad input or ranks that disagree. Then the fault: the
# last of 3 ranks kills itself between two calls, and the others, waiting in a collective, must
# be ended within 30 s (Open MPI's mpirun aborts the job when a rank dies) with a non-zero exit.
# test_mpi_train runs likewise: the language model trained three steps data parallel and
# sequence parallel against one process, and its error cases.
# Skipped, saying so, where mpirun or the program is absent (no MPI: make setup installs it).
TEST=test_mpi; . "$(dirname "$0")/lib.sh"
prog="${BUILD:-build}/tests/mpi/test_mpi_attn"
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
# the tool: mpirun -np N performer-mpi attn writes what performer attn writes (one rank: the same
# bytes; more: float rounding), gradients included; a bad input ends every rank with status 1
tool="${BUILD:-build}/performer-mpi"
case "$tool" in /*) ;; *) tool="$(pwd)/$tool" ;; esac
if [ -x "$tool" ]; then
    $PY - "$T" <<'PYEOF'
import sys
import numpy as np
t = sys.argv[1]
r = np.random.default_rng(3)
for n, s in [("q", (2, 2, 50, 8)), ("k", (2, 2, 50, 8)), ("v", (2, 2, 50, 4)),
             ("do", (2, 2, 50, 4)), ("k2", (2, 2, 37, 8)), ("v2", (2, 2, 37, 4))]:
    np.save(f"{t}/{n}.npy", (r.standard_normal(s) * 0.7).astype(np.float32))
np.save(f"{t}/lens.npy", np.array([50, 31], dtype=np.int32))
np.save(f"{t}/lens2.npy", np.array([37, 20], dtype=np.int32))
bad = np.load(f"{t}/q.npy")
bad[1, 1, 40, 3] = np.nan
np.save(f"{t}/qnan.npy", bad)
PYEOF
    cd "$T"
    for case in "causal" "bidir"; do
        if [ $case = causal ]; then
            args="--q q.npy --k k.npy --v v.npy --causal --key-lengths lens.npy --grad-out do.npy"
        else
            args="--q q.npy --k k2.npy --v v2.npy --kernel oprf --key-lengths lens2.npy --grad-out do.npy"
        fi
        "$P" attn $args --out ref.npy --grad-prefix ref || fail "performer attn ($case) failed"
        for n in 1 2 3; do
            if ! run 120 $MPIRUN -np $n "$tool" attn $args --out o$n.npy --grad-prefix g$n                 >tool$n.log 2>&1; then
                fail "mpirun -np $n performer-mpi attn ($case) failed:"; tail -n 5 tool$n.log
                continue
            fi
            if [ $n = 1 ]; then
                if cmp -s ref.npy o1.npy && cmp -s ref.dq.npy g1.dq.npy &&
                    cmp -s ref.dk.npy g1.dk.npy && cmp -s ref.dv.npy g1.dv.npy; then
                    pass
                else
                    fail "performer-mpi at one rank ($case): not performer attn's bytes"
                fi
                continue
            fi
            if $PY - $n <<'PYEOF'
import sys
import numpy as np
n = sys.argv[1]
worst = 0
for a, b in [("ref", f"o{n}"), ("ref.dq", f"g{n}.dq"), ("ref.dk", f"g{n}.dk"), ("ref.dv", f"g{n}.dv")]:
    x, y = np.load(a + ".npy"), np.load(b + ".npy")
    assert x.shape == y.shape, (a, x.shape, y.shape)
    worst = max(worst, float(np.linalg.norm(x - y) / np.linalg.norm(x)))
print(f"performer-mpi at {n} ranks against performer attn: worst relative error {worst:.3g}")
sys.exit(0 if worst <= 1e-6 else 1)
PYEOF
            then pass; else fail "performer-mpi at $n ranks ($case): outputs differ"; fi
        done
    done
    # a NaN in the queries, met by one rank: every rank exits 1, the first says where
    run 120 $MPIRUN -np 3 "$tool" attn --q qnan.npy --k k.npy --v v.npy --out bad.npy         >nan.log 2>&1
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ ! -e bad.npy ] && grep -q "non-finite" nan.log; then
        pass
        grep "performer-mpi" nan.log | head -n 1
    else
        fail "a NaN in the queries: exit $rc, expected 1 on every rank and no output"
        tail -n 5 nan.log
    fi
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
