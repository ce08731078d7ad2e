#!/bin/sh
# test_mpi: sequence-parallel FAVOR+ over MPI (include/performer_mpi.h). Runs the test program
# BUILD/tests/mpi/test_mpi_attn under mpirun with 1, 2 and 3 ranks (more ranks than this
# machine's cores: --oversubscribe; as root: --allow-run-as-root), each run bounded by timeout:
# outputs and gradients against the single process for every map, bidirectional and causal,
# unequal slices and padding; strict causality across ranks; flat bytes against L; every rank
# getting the same status and message for a bad input or ranks that disagree. Then the fault: the
# last of 3 ranks kills itself between two calls, and the others, waiting in a collective, must
# be ended within 30 s (Open MPI's mpirun aborts the job when a rank dies) with a non-zero exit.
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
for n in 1 2 3; do
    if run 600 $MPIRUN -np $n "$prog" >"$T/np$n.log" 2>&1; then
        pass
        grep -E "worst|bytes|every rank" "$T/np$n.log"
    else
        fail "mpirun -np $n $prog (exit $?):"
        grep -E "FAIL|rror" "$T/np$n.log" | head -n 20
    fi
done
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
