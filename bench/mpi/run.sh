#!/bin/sh
# bench/mpi/run.sh BUILD: bench_mpi at 1 and 2 ranks (this machine, loopback), the CSV in
# BUILD/bench/mpi.csv, its tables in BUILD/bench/mpi.txt, and the figure (measurements and the
# scaling model of docs/mpi.md) in BUILD/bench/mpi.png. QUICK=1 runs it small.
set -e
build=${1:-build}
mkdir -p "$build/bench"
csv="$build/bench/mpi.csv"
rm -f "$csv" "$build/bench/mpi.txt"
q=; [ -n "${QUICK-}" ] && q=--quick
# a rank waiting for others yields its core (else it spins, and the single-process timing on
# rank 0 shares its core with a spinning rank)
export OMPI_MCA_mpi_yield_when_idle=1
for n in 1 2; do
    timeout 1800 mpirun --allow-run-as-root --oversubscribe -np $n \
        "$build/bench/mpi/bench_mpi" --csv "$csv" $q | tee -a "$build/bench/mpi.txt"
done
/usr/bin/python3 bench/mpi/plot_mpi.py "$csv" "$build/bench/mpi.png" | tee -a "$build/bench/mpi.txt"
