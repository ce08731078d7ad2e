#!/bin/sh
# compare_lm.sh: the same small byte-level language model trained on the proteins of Debian's
# mmseqs2-examples for the same steps with exact softmax attention, FAVOR+ (positive features)
# and FAVOR+ with ReLU features; validation curves in one plot and a table of final loss,
# perplexity, accuracy and training speed.
#
#   sh scripts/compare_lm.sh            (after `make`; runs one model at a time)
#
# Writes docs/figures/lm_compare.png and docs/figures/lm_compare.md; the runs themselves
# (checkpoints, logs, curves) go to $OUT (build/lm_compare). A run that already finished is
# not repeated; one that was interrupted is resumed (--resume gives the same bits).
#
# The settings can be changed through the environment; the defaults are what fits about
# eight minutes per run on a 2-core machine:
#   BUILD (build), OUT, LAYERS (4), DMODEL (128), HEADS (4), CONTEXT (1024), BATCH (4),
#   STEPS (1000), LR (2e-3), WARMUP (100), FEATURES (128), REDRAW (100), EVAL_EVERY (100),
#   EVAL_BATCHES (16), THREADS (2), RUNS ("exact favor relu")
set -e
BUILD=${BUILD:-build}
P=$BUILD/performer
OUT=${OUT:-$BUILD/lm_compare}
LAYERS=${LAYERS:-4}
DMODEL=${DMODEL:-128}
HEADS=${HEADS:-4}
CONTEXT=${CONTEXT:-1024}
BATCH=${BATCH:-4}
STEPS=${STEPS:-1000}
LR=${LR:-2e-3}
WARMUP=${WARMUP:-100}
FEATURES=${FEATURES:-128}
REDRAW=${REDRAW:-100}
EVAL_EVERY=${EVAL_EVERY:-100}
EVAL_BATCHES=${EVAL_BATCHES:-16}
THREADS=${THREADS:-2}
RUNS=${RUNS:-exact favor relu}
FIG=${FIG:-docs/figures}

[ -x "$P" ] || { echo "compare_lm.sh: no $P (run make first)" >&2; exit 1; }
mkdir -p "$OUT" "$FIG"

common="--data proteins --layers $LAYERS --d-model $DMODEL --heads $HEADS --context $CONTEXT
        --batch $BATCH --steps $STEPS --lr $LR --warmup $WARMUP --eval-every $EVAL_EVERY
        --eval-batches $EVAL_BATCHES --seed 1 --positions learned --no-plot"
plots=""
for run in $RUNS; do
    case $run in
    exact) args="--attention exact"; label="exact softmax" ;;
    favor) args="--attention favor --kernel positive --features $FEATURES --redraw $REDRAW"
           label="FAVOR+ positive (m=$FEATURES)" ;;
    relu) args="--attention favor --kernel relu --features $FEATURES --redraw $REDRAW"
          label="FAVOR+ ReLU (m=$FEATURES)" ;;
    *) echo "compare_lm.sh: unknown run '$run'" >&2; exit 2 ;;
    esac
    dir=$OUT/$run
    if [ -f "$dir/checkpoint.safetensors" ]; then
        if [ "$(tail -1 "$dir/log.csv" | cut -d, -f1)" != "$STEPS" ]; then
            echo "== $run: resuming"
            $P train --out "$dir" --resume --threads "$THREADS" --no-plot
        else
            echo "== $run: done already"
        fi
    else
        echo "== $run: $label"
        # shellcheck disable=SC2086
        $P train --out "$dir" $common $args --threads "$THREADS"
    fi
    plots="$plots|$label=$dir/log.csv"
done

title="proteins (mmseqs2 examples): $LAYERS layers, d_model $DMODEL, $HEADS heads, context"
title="$title $CONTEXT, batch $BATCH, $STEPS steps"
# labels hold spaces: pass them through a '|'-separated list
IFS='|'
# shellcheck disable=SC2086
/usr/bin/python3 scripts/plot_train.py --compare "$FIG/lm_compare.png" --title "$title" \
    ${plots#|}
unset IFS

/usr/bin/python3 - "$FIG/lm_compare.md" "$BATCH" "$CONTEXT" "$title" "${plots#|}" <<'EOF'
import csv, math, sys
out, B, T, title, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
rows = []
for item in runs.split("|"):
    label, path = item.split("=", 1)
    last_val, steps, elapsed = None, 0, 0.0
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["val_loss"]:
                last_val = r
            if r["train_loss"]:
                steps = int(r["step"])
                elapsed = float(r["elapsed_s"])
    tps = steps * B * T / elapsed if elapsed > 0 else float("nan")
    rows.append((label, float(last_val["val_loss"]), float(last_val["val_ppl"]),
                 float(last_val["val_acc"]), tps, elapsed))
base = rows[0][1]
lines = [f"{title}\n",
         "| attention | val loss (nats/byte) | vs first | perplexity | next-byte accuracy | "
         "training tokens/s | training time |",
         "|---|---|---|---|---|---|---|"]
for label, loss, ppl, acc, tps, el in rows:
    lines.append(f"| {label} | {loss:.4f} | {100 * (loss / base - 1):+.1f}% | {ppl:.3f} | "
                 f"{acc:.4f} | {tps:.0f} | {el / 60:.1f} min |")
text = "\n".join(lines) + "\n"
open(out, "w").write(text)
print(text)
EOF
echo "figure: $FIG/lm_compare.png, table: $FIG/lm_compare.md"
