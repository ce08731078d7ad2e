#!/bin/sh
# mqar_curriculum.sh: recall at lengths 256, 1024 and 4096 by a curriculum. From scratch, no
# model of scripts/mqar_sweep.sh's size leaves the 1/pairs plateau at length 256 in the steps two
# cores give (24,000 steps, exact attention included: docs/results.md, "recall"), so the models
# that learnt the task at length 64 go on to longer windows, each from its own previous length
# (`performer train --init-from` with a longer --context: the learned positions repeated, row t
# from row t mod the shorter context; a new W; AdamW afresh):
#
#   length 256   from 64:   exact, FAVOR+ and FAVOR++ (m 256), 4000 steps
#   length 1024  from 256:  FAVOR+ and FAVOR++, 1000 steps
#   length 4096  from 1024: FAVOR+ and FAVOR++, 1000 steps
#   exact attention, the ceiling, at 1024 and 4096: its length-256 model evaluated (--steps 0);
#   training it there costs its quadratic time, and once it has learnt the task its subnormal
#   gradients slow it several times more
#
#   sh scripts/mqar_curriculum.sh     (after scripts/mqar_sweep.sh has the length-64 runs)
#
# Runs go to $BUILD/mqar_curriculum, _1024, _4096, _exact1024 and _exact4096 (a finished run is
# not repeated, a stopped one resumed); writes $FIG/mqar_curriculum.csv (the runs of every
# length, plot_mqar.py's columns; the steps column says which were evaluated only), .md (the
# table, then the sharpness of each final model's attention at the answers) and .png.
# Settings through the environment: BUILD (build), FIG (docs/figures), SEEDS (3: the seed whose
# FAVOR+ and FAVOR++ models learnt at length 64; give others where they did), PAIRS (4),
# JOBS (2).
set -e
BUILD=${BUILD:-build}
FIG=${FIG:-docs/figures}
SEEDS=${SEEDS:-3}
PAIRS=${PAIRS:-4}
JOBS=${JOBS:-2}
R=$BUILD/mqar_curriculum
SWEEP="sh $(dirname "$0")/mqar_sweep.sh"
export BUILD SEEDS PAIRS JOBS
export MS=256

# each stage's own table and figure stay with its runs; the one for every length goes to FIG
NAME=mqar_curriculum OUT=$R FIG=$R FROM=64 SRC=$BUILD/mqar_sweep FROM_STEPS=8000 LENGTHS=256 \
    ATTNS="exact favor favorpp" STEPS=4000 $SWEEP
NAME=mqar_curriculum_1024 OUT=${R}_1024 FIG=${R}_1024 FROM=256 SRC=$R FROM_STEPS=4000 \
    LENGTHS=1024 ATTNS="favor favorpp" STEPS=1000 $SWEEP
NAME=mqar_curriculum_4096 OUT=${R}_4096 FIG=${R}_4096 FROM=1024 SRC=${R}_1024 FROM_STEPS=1000 \
    LENGTHS=4096 ATTNS="favor favorpp" STEPS=1000 $SWEEP
for L in 1024 4096; do
    NAME=mqar_curriculum_exact$L OUT=${R}_exact$L FIG=${R}_exact$L FROM=256 SRC=$R \
        FROM_STEPS=4000 LENGTHS=$L ATTNS=exact STEPS=0 $SWEEP
done

# every length in one table and figure
mkdir -p "$FIG"
parts="$R/mqar_curriculum.csv ${R}_1024/mqar_curriculum_1024.csv
       ${R}_4096/mqar_curriculum_4096.csv ${R}_exact1024/mqar_curriculum_exact1024.csv
       ${R}_exact4096/mqar_curriculum_exact4096.csv"
# shellcheck disable=SC2086 # (parts: paths without spaces)
{
    head -n 1 "$R/mqar_curriculum.csv"
    for f in $parts; do tail -n +2 "$f"; done
} >"$FIG/mqar_curriculum.csv.tmp"
mv "$FIG/mqar_curriculum.csv.tmp" "$FIG/mqar_curriculum.csv"
/usr/bin/python3 scripts/plot_mqar.py --csv "$FIG/mqar_curriculum.csv" \
    --out "$FIG/mqar_curriculum" --title "Recall by a curriculum: the models that learnt at \
length 64 carried on to longer windows (each seed's best evaluation; exact at 1024 and 4096: \
its length-256 model, evaluated)" >/dev/null
ckpts=$(for d in "$R"/L*-p*/*-s* "${R}"_*/L*-p*/*-s*; do
    if [ -f "$d/checkpoint.safetensors" ]; then echo "$d/checkpoint.safetensors"; fi
done)
# shellcheck disable=SC2086 # (the checkpoints: paths without spaces)
PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH} /usr/bin/python3 scripts/plot_mqar.py \
    --out "$FIG/mqar_curriculum.md" --sharpness $ckpts >/dev/null
echo "mqar_curriculum.sh: $FIG/mqar_curriculum.csv, .md and .png"
