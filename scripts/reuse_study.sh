#!/bin/sh
# reuse_study.sh: when can a softmax model's weights be reused under FAVOR+, and is it worth it?
# Three exact-attention runs of the demo configuration (scripts/lm_parity.sh's "exact", seeds 1 to
# 3: the Bible, context 256, 4 layers, d_model 128, 2 heads, batch 8, 1000 steps at lr 2e-3) are
# taken at steps 200, 500 and 1000 (a run stopped there with --stop-after and resumed: the same
# bits as lm_parity.sh's run, which the script checks row by row), and
#
#  1. each snapshot's attention is swapped with no training (`performer train --init-from SNAP
#     --steps 0`): FAVOR+ positive at m = 64 and 256, ReLU features at m = 64, elu + 1, FAVOR++ at
#     m = 64 with A fitted on 32 training batches; W drawn W_DRAWS times (--w-seed 1..); every
#     evaluation on the same validation windows (--data-seed 1), so each jump is a difference
#     over the same bytes: the swapped model's loss less the snapshot's own;
#  2. each snapshot's attention entropy is measured, layer by layer and head by head, on
#     validation windows (performer.Model.attention_inputs, performer.attention_entropy: the
#     entropy of each causal softmax row, against log(i + 1), a uniform row's);
#  3. the snapshots at steps 200 and 500 are fine-tuned with FAVOR+ m = 64 for the steps left to
#     1000 (W fixed: --redraw 0), starting at the learning rate the exact run had reached there
#     (its log's lr at that step; 20 steps of warm-up, cosine to a tenth), against FAVOR+ m = 64
#     trained from scratch for 1000 steps (lm_parity.sh's "favor64" runs, W fixed as well); from
#     step 500 also with a new W every 100 steps (--redraw 100). Seeds 1 to 3 throughout: the
#     fine-tuning of source seed s takes --seed s.
#
#   sh scripts/reuse_study.sh       (after `make` and scripts/lm_parity.sh's exact and favor64
#                                    runs; about an hour on 2 cores)
#
# Writes $FIG/reuse_{jump,entropy,finetune}.csv and reuse_{jump,finetune}.png and .md
# (scripts/plot_reuse.py draws them from the CSVs alone); the runs go to $OUT, a finished one is
# not repeated and a stopped one is resumed. Settings through the environment: BUILD (build),
# PARITY ($BUILD/lm_parity: the exact-sN and favor64-sN runs), OUT ($BUILD/reuse_study), FIG
# (docs/figures), SEEDS (1 2 3), STEPS_AT (200 500 1000: the snapshots), FT_FROM (200 500),
# W_DRAWS (3), JOBS (2 runs at a time), THREADS (1 each).
set -e
BUILD=${BUILD:-build}
P=${PERFORMER:-$BUILD/performer}
PARITY=${PARITY:-$BUILD/lm_parity}
OUT=${OUT:-$BUILD/reuse_study}
FIG=${FIG:-docs/figures}
SEEDS=${SEEDS:-1 2 3}
STEPS_AT=${STEPS_AT:-200 500 1000}
FT_FROM=${FT_FROM:-200 500}
W_DRAWS=${W_DRAWS:-3}
JOBS=${JOBS:-2}
THREADS=${THREADS:-1}
PY=/usr/bin/python3
TOTAL=1000
# lm_parity.sh's model and schedule (the sources' and the from-scratch runs')
MODEL="--positions learned --layers 4 --d-model 128 --heads 2 --context 256 --batch 8
       --eval-every 100 --eval-batches 16"

[ -x "$P" ] || { echo "reuse_study.sh: no $P (run make first)" >&2; exit 1; }

# last DIR: the last step of DIR's log (empty without one)
last() { [ -f "$1/log.csv" ] && tail -1 "$1/log.csv" | cut -d, -f1; }

swap_args() {
    case $1 in
    exact) echo "--attention exact" ;;
    favor64) echo "--attention favor --kernel positive --features 64" ;;
    favor256) echo "--attention favor --kernel positive --features 256" ;;
    relu64) echo "--attention favor --kernel relu --features 64" ;;
    elu) echo "--attention favor --kernel elu" ;;
    favorpp64) echo "--attention favor++ --features 64 --fit-batches 32" ;;
    *) echo "reuse_study.sh: unknown attention '$1'" >&2; return 2 ;;
    esac
}

if [ "$1" = "--one" ]; then
    shift
    case $1 in
    src) # src SEED: the exact run to each snapshot step, a copy of its checkpoint at each
        s=$2 d=$OUT/src/exact-s$2
        mkdir -p "$OUT/src"
        for at in $STEPS_AT; do
            snap=$OUT/src/s$s-step$at.safetensors
            [ -f "$snap" ] && continue
            if [ -f "$d/checkpoint.safetensors" ]; then
                "$P" train --out "$d" --resume --stop-after "$at" --threads "$THREADS" \
                    --no-plot >>"$d.out" 2>&1
            else
                # shellcheck disable=SC2086
                "$P" train --out "$d" --data bible $MODEL --attention exact --steps "$TOTAL" \
                    --lr 2e-3 --warmup 100 --seed "$s" --stop-after "$at" --threads "$THREADS" \
                    --no-plot >"$d.out" 2>&1
            fi
            [ "$(last "$d")" = "$at" ] ||
                { echo "reuse_study.sh: source seed $s did not stop at $at ($d.out)" >&2; exit 1; }
            cp "$d/checkpoint.safetensors" "$snap.tmp" && mv "$snap.tmp" "$snap"
        done
        echo "== source seed $s: snapshots at $STEPS_AT" ;;
    swap) # swap STEP SEED ATTENTION WSEED: the snapshot under ATTENTION, no training
        d=$OUT/swap/step$2-s$3-$4-w$5
        mkdir -p "$OUT/swap"
        [ "$(last "$d")" = 0 ] && exit 0
        rm -rf "$d"
        # shellcheck disable=SC2046
        "$P" train --out "$d" --init-from "$OUT/src/s$3-step$2.safetensors" \
            --data "$OUT/bible-kjv.txt" --format text $(swap_args "$4") --steps 0 --batch 8 \
            --eval-batches 16 --seed "$3" --data-seed 1 \
            $([ "$4" = exact ] || [ "$4" = elu ] || echo "--w-seed $5") \
            --threads "$THREADS" --no-plot >"$d.out" 2>&1 ||
            { echo "reuse_study.sh: swap $* failed (see $d.out)" >&2; exit 1; } ;;
    ft) # ft STEP SEED REDRAW: FAVOR+ m = 64 fine-tuned from the snapshot to step TOTAL
        d=$OUT/ft/from$2-s$3-redraw$4
        mkdir -p "$OUT/ft"
        n=$((TOTAL - $2))
        [ "$(last "$d")" = "$n" ] && exit 0
        if [ -f "$d/checkpoint.safetensors" ]; then
            "$P" train --out "$d" --resume --threads "$THREADS" --no-plot >>"$d.out" 2>&1
        else
            # the learning rate the source had reached at step $2
            lr=$(awk -F, -v at="$2" '$1 == at { print $2 }' "$OUT/src/exact-s$3/log.csv")
            # shellcheck disable=SC2086
            "$P" train --out "$d" --init-from "$OUT/src/s$3-step$2.safetensors" \
                --data "$OUT/bible-kjv.txt" --format text $MODEL --attention favor \
                --kernel positive --features 64 --redraw "$4" --steps "$n" --lr "$lr" \
                --warmup 20 --seed "$3" --threads "$THREADS" --no-plot >"$d.out" 2>&1
        fi || { echo "reuse_study.sh: fine-tuning $* failed (see $d.out)" >&2; exit 1; }
        echo "== fine-tuned from step $2, seed $3, redraw $4: $(grep "validation loss" "$d.out" |
            tail -1)" ;;
    esac
    exit 0
fi

mkdir -p "$OUT" "$FIG"
for s in $SEEDS; do
    for r in exact favor64; do
        [ "$(last "$PARITY/$r-s$s")" = "$TOTAL" ] || {
            echo "reuse_study.sh: no finished $PARITY/$r-s$s (RUNS='exact favor64' sh" \
                "scripts/lm_parity.sh makes it)" >&2
            exit 1
        }
    done
done
# the Bible as a text file, once (the split is --data bible's: the same windows)
if [ ! -s "$OUT/bible-kjv.txt" ]; then
    cp "$(ls "$PARITY"/exact-s*/bible-kjv.txt | head -1)" "$OUT/bible-kjv.txt.tmp"
    mv "$OUT/bible-kjv.txt.tmp" "$OUT/bible-kjv.txt"
fi
export BUILD P OUT STEPS_AT THREADS TOTAL MODEL
start=$(date +%s)

# run_jobs FILE: each line one `sh reuse_study.sh --one ...`, JOBS at a time
run_jobs() { [ ! -s "$1" ] || xargs -P "$JOBS" -L 1 sh "$0" --one <"$1"; }

# the snapshot at TOTAL is the lm_parity run's own checkpoint
for s in $SEEDS; do
    snap=$OUT/src/s$s-step$TOTAL.safetensors
    mkdir -p "$OUT/src"
    case " $STEPS_AT " in *" $TOTAL "*)
        [ -f "$snap" ] || cp "$PARITY/exact-s$s/checkpoint.safetensors" "$snap" ;;
    esac
done

echo "reuse_study.sh: the sources' snapshots"
for s in $SEEDS; do echo "src $s"; done >"$OUT/jobs-src.txt"
run_jobs "$OUT/jobs-src.txt"
# the resumed source runs are lm_parity.sh's, bit for bit: every logged loss and gradient norm
for s in $SEEDS; do
    "$PY" - "$OUT/src/exact-s$s/log.csv" "$PARITY/exact-s$s/log.csv" <<'EOF'
import csv, sys
def rows(path):
    with open(path, newline="") as f:
        return {r["step"]: (r["lr"], r["train_loss"], r["grad_norm"], r["val_loss"])
                for r in csv.DictReader(f)}
a, b = rows(sys.argv[1]), rows(sys.argv[2])
bad = [s for s in a if a[s] != b.get(s)]
if bad:
    sys.exit("reuse_study.sh: %s differs from %s at steps %s" % (sys.argv[1], sys.argv[2], bad[:5]))
EOF
done
echo "reuse_study.sh: fine-tuning and swapping"
: >"$OUT/jobs.txt"
for from in $FT_FROM; do
    for s in $SEEDS; do
        echo "ft $from $s 0" >>"$OUT/jobs.txt"
        if [ "$from" = 500 ]; then echo "ft $from $s 100" >>"$OUT/jobs.txt"; fi
    done
done
for at in $STEPS_AT; do
    for s in $SEEDS; do
        echo "swap $at $s exact 1" >>"$OUT/jobs.txt"
        echo "swap $at $s elu 1" >>"$OUT/jobs.txt"
        for a in favor64 favor256 relu64 favorpp64; do
            w=1
            while [ $w -le "$W_DRAWS" ]; do
                echo "swap $at $s $a $w" >>"$OUT/jobs.txt"
                w=$((w + 1))
            done
        done
    done
done
run_jobs "$OUT/jobs.txt"
echo "reuse_study.sh: runs took $(($(date +%s) - start)) s"

# ---- the CSVs behind the figures ---------------------------------------------------------------
# the entropies go through the library in Python: on the OpenBLAS kernels the tool runs on (it
# picks them itself where OpenBLAS's own choice is a fallback; Python cannot), as tests/run.sh does
if [ -z "${OPENBLAS_CORETYPE-}" ]; then
    core=$("$P" --version | sed -n "s/.*OpenBLAS kernels: \([A-Za-z0-9_]*\), set by performer.*/\1/p")
    [ -z "$core" ] || export OPENBLAS_CORETYPE="$core"
fi
"$PY" scripts/plot_reuse.py collect --out "$OUT" --parity "$PARITY" --fig "$FIG" \
    --seeds $SEEDS --steps-at $STEPS_AT --ft-from $FT_FROM --total "$TOTAL" \
    --lib "$BUILD/libperformer.so"
# no context: the byte frequencies of the training split scored on the validation split
"$PY" scripts/plot_reuse.py plot --fig "$FIG" \
    --unigram "$("$PY" scripts/unigram_loss.py bible "$OUT/bible-kjv.txt")"
