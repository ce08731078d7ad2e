#!/bin/sh
# mqar_from_exact.sh: recall against the state size, from a softmax start. No random-feature
# map learns multi-query associative recall reliably from scratch in the steps two cores give,
# and at length 256 nothing does, softmax included (docs/results.md, "recall"), so this asks
# what a map can hold once the lookup exists: exact-attention models that learnt the task at
# length 64 go on at length LENGTH with each map in place of their softmax (`performer train
# --init-from`: every weight carried, the learned positions row t from row t mod 64, W drawn
# from the seed, AdamW afresh), STEPS steps each, for every number of pairs; exact attention,
# the ceiling, is its length-64 model evaluated at LENGTH (--steps 0).
#
#   sh scripts/mqar_from_exact.sh      (after `make`; the default grid takes hours on 2 cores)
#
# 1. the sources: exact attention at length 64 from scratch with 4 pairs, 8000 steps, every seed
#    (scripts/mqar_sweep.sh into $BUILD/mqar_sweep, shared with the from-scratch sweep). With 16
#    pairs exact attention stays on the 1/pairs plateau from scratch at length 64 (seeds 1 and 2,
#    8000 steps), so
# 2. for every other number of pairs, the 4-pair models go on at length 64 with that many,
#    PAIR_STEPS steps (into $BUILD/mqar_pairs);
# 3. every map of ATTNS at every m of MS from them, at LENGTH (into $BUILD/mqar_from_exact);
# 4. the sources evaluated at LENGTH (into $BUILD/mqar_from_exact_ceiling).
# A finished run is not repeated and a stopped one resumed. Writes $FIG/mqar_from_exact.csv
# (plot_mqar.py's columns; rows of an earlier CSV whose runs this build no longer has are kept:
# a grid can grow a number of pairs at a time), .md (the table, then the sharpness of every final
# model's attention at the answers) and .png (one panel per length and pairs).
# Settings through the environment: BUILD (build), FIG (docs/figures), LENGTH (256), PAIRS (4
# 16), MS (16 64 256), ATTNS (favor favorpp relu elu; empty: the sources and the ceiling only),
# SEEDS (1 2 3), STEPS (2000), PAIR_STEPS (2000), JOBS (2 runs at a time), THREADS (1 each).
set -e
BUILD=${BUILD:-build}
FIG=${FIG:-docs/figures}
LENGTH=${LENGTH:-256}
PAIRS=${PAIRS:-4 16}
MS=${MS:-16 64 256}
ATTNS=${ATTNS-favor favorpp relu elu}
SEEDS=${SEEDS:-1 2 3}
STEPS=${STEPS:-2000}
PAIR_STEPS=${PAIR_STEPS:-2000}
R=$BUILD/mqar_from_exact
SWEEP="sh $(dirname "$0")/mqar_sweep.sh"
export BUILD SEEDS JOBS THREADS

# each stage's own table and figure stay beside its runs, not in FIG
NAME=mqar_sweep OUT=$BUILD/mqar_sweep FIG=$BUILD/mqar_sweep LENGTHS=64 PAIRS=4 ATTNS=exact \
    STEPS=8000 $SWEEP
for N in $PAIRS; do
    if [ "$N" = 4 ]; then
        src=$BUILD/mqar_sweep from_steps=8000
    else
        NAME=mqar_pairs OUT=$BUILD/mqar_pairs FIG=$BUILD/mqar_pairs FROM=64 FROM_PAIRS=4 \
            SRC=$BUILD/mqar_sweep FROM_STEPS=8000 LENGTHS=64 PAIRS=$N ATTNS=exact \
            STEPS=$PAIR_STEPS $SWEEP
        src=$BUILD/mqar_pairs from_steps=$PAIR_STEPS
    fi
    if [ -n "$ATTNS" ]; then
        NAME=mqar_from_exact OUT=$R FIG=$R FROM=64 SRC=$src FROM_STEPS=$from_steps \
            FROM_ATTN=exact LENGTHS=$LENGTH PAIRS=$N MS="$MS" ATTNS="$ATTNS" STEPS=$STEPS $SWEEP
    fi
    NAME=mqar_from_exact_ceiling OUT=${R}_ceiling FIG=${R}_ceiling FROM=64 SRC=$src \
        FROM_STEPS=$from_steps LENGTHS=$LENGTH PAIRS=$N ATTNS=exact STEPS=0 $SWEEP
done

mkdir -p "$FIG"
runs=${R}_ceiling
if [ -d "$R" ]; then runs="$R $runs"; fi
# shellcheck disable=SC2086 # (runs: paths without spaces)
/usr/bin/python3 scripts/plot_mqar.py --runs $runs --merge --steps "$STEPS" 0 \
    --out "$FIG/mqar_from_exact" --title "Recall from a softmax start: the exact models that \
learnt at length 64 trained on at a longer length with each map in place of softmax, $STEPS \
steps (line: median over seeds; small markers: each seed; exact: the length-64 models \
evaluated)" \
    >/dev/null
ckpts=$(for d in "$R"/L*-p*/*-s* "${R}"_ceiling/L*-p*/*-s*; do
    if [ -f "$d/checkpoint.safetensors" ]; then echo "$d/checkpoint.safetensors"; fi
done)
# shellcheck disable=SC2086 # (the checkpoints: paths without spaces)
PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH} /usr/bin/python3 scripts/plot_mqar.py \
    --out "$FIG/mqar_from_exact.md" --merge --sharpness $ckpts >/dev/null
echo "mqar_from_exact.sh: $FIG/mqar_from_exact.csv, .md and .png"
