#!/bin/sh
# bench/mpi/run.sh BUILD: bench_mpi (attention) and bench_mpi_train (the language model's
# training step) at 1 and 2 ranks (this machine, loopback). CSVs in BUILD/bench/mpi.csv and
# BUILD/bench/mpi_train.csv, the tables in BUILD/bench/mpi.txt, and the figures (measurements
# and the scaling models of docs/mpi.md) in BUILD/bench/mpi.png and BUILD/bench/mpi_train.png.
# QUICK=1 runs them small.
set -e
build=${1:-build}
mkdir -p "$build/bench"
csv="$build/bench/mpi.csv"
tcsv="$build/bench/mpi_train.csv"
rm -f "$csv" "$tcsv" "$build/bench/mpi.txt"
q=; [ -n "${QUICK-}" ] && q=--quick
# a rank waiting for others yields its core (else it spins, and the single-process timing on
# rank 0 shares its core with a spinning rank)
export OMPI_MCA_mpi_yield_when_idle=1
for n in 1 2; do
    timeout 1800 mpirun --allow-run-as-root --oversubscribe -np $n \
        "$build/bench/mpi/bench_mpi" --csv "$csv" $q | tee -a "$build/bench/mpi.txt"
done
for n in 1 2; do
    timeout 1800 mpirun --allow-run-as-root --oversubscribe -np $n \
        "$build/bench/mpi/bench_mpi_train" --csv "$tcsv" $q | tee -a "$build/bench/mpi.txt"
done
/usr/bin/python3 bench/mpi/plot_mpi.py "$csv" "$build/bench/mpi.png" | tee -a "$build/bench/mpi.txt"
/usr/bin/python3 bench/mpi/plot_mpi_train.py "$tcsv" "$build/bench/mpi_train.png" |
    tee -a "$build/bench/mpi.txt"
