#!/bin/sh
# mqar_sweep.sh: recall against state size. Multi-query associative recall (`performer train
# --task mqar`: key-value pairs at the start of each sequence, queries later; the answer accuracy
# is the share of queries whose value the model predicts) learnt from scratch by a small model
# with each attention: FAVOR+ (positive features), FAVOR++ and ReLU features at several feature
# counts m, elu + 1 linear attention (no W: its state is fixed by the head width), and exact
# softmax attention, the ceiling; at several sequence lengths and numbers of pairs, over seeds.
#
#   sh scripts/mqar_sweep.sh          (after `make`; the default grid takes hours on 2 cores)
#
# Every run: 2 layers, d_model 64, one head (of width 64), learned positions, TOKENS tokens a
# step (batch TOKENS / length), STEPS steps at a constant learning rate LR after 100 steps of
# warm-up, no weight decay, evaluated every EVAL steps on 8 validation batches; keys 64, a
# query for every 4 bytes of the window (length / 4 queries, each key asked as often). At length
# 64 with 4 pairs, seed 1, exact attention left the 1/pairs plateau at step 3500-4000 and reached
# 0.99 by 5750 in this setting (with 4 heads of width 16 it had not by 3000), while FAVOR+ m 64
# was still on it at step 10000: runs need thousands of steps. At length 256 with 8 pairs and 4
# windows a step (1024 tokens), exact attention had not left the plateau by step 6000 at lr 1e-3
# (learned or rotary positions) or at lr 3e-3 (rotary, by step 2700), nor with 4 pairs and 16
# windows a step by step 24,000 (exact and FAVOR+ m 256, seed 1; 43 and 63 minutes on one
# thread): longer lengths go on from models that learnt at 64 (FROM, below). The table and
# the figure take each run's best evaluated answer accuracy (a run that has learnt the task and
# wobbles is not penalised for its last evaluation).
#
# Writes $FIG/$NAME.csv (one row per run: length, pairs, attention, m, seed, best and final
# accuracy, minutes), $FIG/$NAME.md and $FIG/$NAME.png (scripts/plot_mqar.py draws them from the
# CSV alone; the .md ends with how sharp the softmax attention is that each finished exact,
# FAVOR+ and FAVOR++ model has or estimates, --sharpness); the runs go to $OUT, a finished one
# is not repeated and a stopped one resumed.
# Settings through the environment: BUILD (build), NAME (mqar_sweep), OUT ($BUILD/$NAME), FIG
# (docs/figures), LENGTHS (64 256 1024), PAIRS (4 16), MS (16 64 256: m = 1024 would cost some 1.5 h a
# run at length 64 on one thread by m = 256's rate, against 20 minutes at m = 16-64), ATTNS (exact
# favor favorpp relu elu), SEEDS (1 2 3), STEPS (8000), TOKENS (4096), LR (1e-3), EVAL (250),
# JOBS (2 runs at a time), THREADS (1 each). Runs go shortest length first and within a length
# seed by seed, so an interrupted sweep leaves whole lengths and seeds behind it.
#
# A curriculum: FROM (a shorter length) starts each run from the run of the same pairs,
# attention, m and seed at length FROM under SRC ($BUILD/mqar_sweep) that finished its FROM_STEPS
# (8000) steps (`performer train --init-from`: every weight carried, the learned positions row t
# from row t mod FROM, W redrawn from the seed, AdamW afresh); combinations without such a run
# are skipped with a note. E.g. NAME=mqar_curriculum FROM=64 LENGTHS=256 PAIRS=4 STEPS=4000.
# FROM_ATTN and FROM_M start every run from the source runs of that attention and m instead (its
# seed's): NAME=mqar_from_exact FROM=64 FROM_ATTN=exact LENGTHS=256 trains each attention and m
# on from the softmax models that learnt at length 64. FROM_PAIRS starts from the runs with that
# many pairs (FROM may then equal the length): FROM=64 FROM_PAIRS=4 LENGTHS=64 PAIRS=16 takes
# the 4-pair models on to 16 pairs.
set -e
BUILD=${BUILD:-build}
P=${PERFORMER:-$BUILD/performer}
NAME=${NAME:-mqar_sweep}
OUT=${OUT:-$BUILD/$NAME}
FIG=${FIG:-docs/figures}
LENGTHS=${LENGTHS:-64 256 1024}
PAIRS=${PAIRS:-4 16}
MS=${MS:-16 64 256}
ATTNS=${ATTNS:-exact favor favorpp relu elu}
SEEDS=${SEEDS:-1 2 3}
STEPS=${STEPS:-8000}
TOKENS=${TOKENS:-4096}
LR=${LR:-1e-3}
EVAL=${EVAL:-250}
JOBS=${JOBS:-2}
THREADS=${THREADS:-1}
FROM=${FROM:-}
SRC=${SRC:-$BUILD/mqar_sweep}
FROM_STEPS=${FROM_STEPS:-8000}
FROM_ATTN=${FROM_ATTN:-}
FROM_M=${FROM_M:-}
FROM_PAIRS=${FROM_PAIRS:-}

[ -x "$P" ] || { echo "mqar_sweep.sh: no $P (run make first)" >&2; exit 1; }

# attention flags of ATTN at M features (M ignored where there is no W)
args_of() {
    case $1 in
    exact) echo "--attention exact" ;;
    favor) echo "--attention favor --kernel positive --features $2" ;;
    favorpp) echo "--attention favor++ --features $2" ;;
    relu) echo "--attention favor --kernel relu --features $2" ;;
    elu) echo "--attention favor --kernel elu" ;;
    *) echo "mqar_sweep.sh: unknown attention '$1'" >&2; return 2 ;;
    esac
}

# the run at length FROM that run (N pairs, attention A, m M, seed S) starts from, if it finished:
# the same attention and m, or FROM_ATTN's and FROM_M's
from_run() {
    fa=${FROM_ATTN:-$2}
    case $fa in exact | elu) fm=0 ;; *) fm=${FROM_M:-$3} ;; esac
    f=$SRC/L$FROM-p${FROM_PAIRS:-$1}/$fa-m$fm-s$4
    [ "$(tail -n 1 "$f/log.csv" 2>/dev/null | cut -d, -f1)" = "$FROM_STEPS" ] &&
        [ -f "$f/checkpoint.safetensors" ] && echo "$f/checkpoint.safetensors"
}

if [ "$1" = "--one" ]; then # --one LENGTH PAIRS ATTN M SEED
    L=$2 N=$3 A=$4 M=$5 S=$6
    d=$OUT/L$L-p$N/$A-m$M-s$S
    init=
    if [ -n "$FROM" ]; then
        src=$(from_run "$N" "$A" "$M" "$S") || {
            echo "mqar_sweep.sh: no finished run at length $FROM under $SRC for $A m $M," \
                "seed $S" >&2
            exit 1
        }
        init="--init-from $src"
    fi
    mkdir -p "$OUT/L$L-p$N"
    if [ -f "$d/checkpoint.safetensors" ]; then
        [ "$(tail -1 "$d/log.csv" | cut -d, -f1)" = "$STEPS" ] && exit 0
        "$P" train --out "$d" --resume --threads "$THREADS" --no-plot >>"$d.out" 2>&1
    else
        # shellcheck disable=SC2046,SC2086 # (flag lists: words)
        "$P" train --out "$d" --task mqar --mqar-pairs "$N" --mqar-queries $((L / 4)) \
            --mqar-keys 64 --context "$L" --layers 2 --d-model 64 --heads 1 --positions learned \
            $(args_of "$A" "$M") $init --batch $((TOKENS / L)) --steps "$STEPS" --lr "$LR" \
            --lr-min "$LR" --warmup 100 --weight-decay 0 --eval-every "$EVAL" --eval-batches 8 --seed "$S" \
            --threads "$THREADS" --no-plot >"$d.out" 2>&1
    fi || { echo "mqar_sweep.sh: L $L, $N pairs, $A m $M seed $S failed (see $d.out)" >&2
            exit 1; }
    echo "== L $L, $N pairs, $A m $M, seed $S: $(grep "answer acc" "$d.out" | tail -1)"
    exit 0
fi

for a in $ATTNS; do args_of "$a" 1 >/dev/null; done
mkdir -p "$OUT" "$FIG"
todo=$OUT/todo.txt
: >"$todo"
for L in $LENGTHS; do
    for S in $SEEDS; do
        for N in $PAIRS; do
            for A in $ATTNS; do
                case $A in exact | elu) ms=0 ;; *) ms=$MS ;; esac
                for M in $ms; do
                    if [ -n "$FROM" ] && ! from_run "$N" "$A" "$M" "$S" >/dev/null; then
                        echo "mqar_sweep.sh: skipped L $L, $N pairs, $A m $M, seed $S: no" \
                            "finished run at length $FROM under $SRC"
                        continue
                    fi
                    echo "$L $N $A $M $S" >>"$todo"
                done
            done
        done
    done
done
start=$(date +%s)
echo "mqar_sweep.sh: $(wc -l <"$todo") runs, $JOBS at a time, into $OUT"
export BUILD P OUT STEPS TOKENS LR EVAL THREADS FROM SRC FROM_STEPS FROM_ATTN FROM_M FROM_PAIRS
xargs -P "$JOBS" -L 1 sh "$0" --one <"$todo"
echo "mqar_sweep.sh: runs took $(($(date +%s) - start)) s"
/usr/bin/python3 scripts/plot_mqar.py --runs "$OUT" --out "$FIG/$NAME" --steps "$STEPS"
# and how sharp the softmax attention is that each finished model's attention is or estimates
# (exact, FAVOR+, FAVOR++), at the answers (appended)
done_runs=$(for ck in "$OUT"/L*-p*/exact-m*-s*/checkpoint.safetensors \
    "$OUT"/L*-p*/favor-m*-s*/checkpoint.safetensors \
    "$OUT"/L*-p*/favorpp-m*-s*/checkpoint.safetensors; do
    if [ "$(tail -n 1 "$(dirname "$ck")/log.csv" 2>/dev/null | cut -d, -f1)" = "$STEPS" ]; then
        echo "$ck"
    fi
done)
# shellcheck disable=SC2086 # the checkpoints: words (paths without spaces)
[ -z "$done_runs" ] || PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH} /usr/bin/python3 \
    scripts/plot_mqar.py --out "$FIG/$NAME.md" --sharpness $done_runs >/dev/null
