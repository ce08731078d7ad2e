#!/bin/sh
# long_context.sh: does a longer context help a FAVOR+ language model, for the same tokens?
# The same model (the comparison's: 4 layers, d_model 128, 4 heads, learned positions, FAVOR+
# positive, m = 128) is trained on the King James Bible at context 1024 (batch 8) and at context
# 8192 (batch 1): the same 8192 tokens a step, the same steps, the same learning rate schedule.
# Each is evaluated on its own validation windows (the same validation text, cut to its context):
# a prediction of the long model sees on average 4096 bytes before it, the short one's 512.
#
#   sh scripts/long_context.sh        (after `make`; about 10 minutes on 2 quiet cores)
#
# Exact attention at context 8192 would cost this model 64 times the attention arithmetic of
# context 1024 per window (`make bench-train` measures a training step at every context).
#
# Writes $FIG/long_context.png (validation curves) and $FIG/long_context.md (the table); the runs
# go to $OUT. A finished run is not repeated, an interrupted one resumed. Settings through the
# environment: BUILD (build), OUT ($BUILD/long_context), FIG (docs/figures), THREADS (2),
# LONG (8192), SHORT (1024), TOKENS (8192 a step), STEPS (500), LR (2e-3), WARMUP (100),
# FEATURES (128), REDRAW (100), EVAL_EVERY (100), EVAL_TOKENS (65536 an evaluation).
set -e
BUILD=${BUILD:-build}
P=${PERFORMER:-$BUILD/performer}
OUT=${OUT:-$BUILD/long_context}
FIG=${FIG:-docs/figures}
THREADS=${THREADS:-2}
LONG=${LONG:-8192}
SHORT=${SHORT:-1024}
TOKENS=${TOKENS:-8192}
STEPS=${STEPS:-500}
LR=${LR:-2e-3}
WARMUP=${WARMUP:-100}
FEATURES=${FEATURES:-128}
REDRAW=${REDRAW:-100}
EVAL_EVERY=${EVAL_EVERY:-100}
EVAL_TOKENS=${EVAL_TOKENS:-65536}

[ -x "$P" ] || { echo "long_context.sh: no $P (run make first)" >&2; exit 1; }
for c in "$SHORT" "$LONG"; do
    [ $((TOKENS % c)) -eq 0 ] && [ $((EVAL_TOKENS % c)) -eq 0 ] || {
        echo "long_context.sh: TOKENS and EVAL_TOKENS must be multiples of $c" >&2
        exit 2
    }
done
mkdir -p "$OUT" "$FIG"

plots=""
for c in "$SHORT" "$LONG"; do
    d=$OUT/context-$c
    if [ -f "$d/checkpoint.safetensors" ]; then
        if [ "$(tail -1 "$d/log.csv" | cut -d, -f1)" != "$STEPS" ]; then
            echo "== context $c: resuming"
            "$P" train --out "$d" --resume --threads "$THREADS" --no-plot
        fi
    else
        echo "== context $c: batch $((TOKENS / c)), $STEPS steps"
        "$P" train --out "$d" --data bible --attention favor --kernel positive \
            --features "$FEATURES" --redraw "$REDRAW" --layers 4 --d-model 128 --heads 4 \
            --positions learned --context "$c" --batch $((TOKENS / c)) --steps "$STEPS" \
            --lr "$LR" --warmup "$WARMUP" --eval-every "$EVAL_EVERY" \
            --eval-batches $((EVAL_TOKENS / c)) --seed 1 --threads "$THREADS" --no-plot
    fi
    plots="$plots|context $c (batch $((TOKENS / c)))=$d/log.csv"
done

title="FAVOR+ (m = $FEATURES) on the King James Bible, $TOKENS tokens a step, $STEPS steps"
IFS='|'
# shellcheck disable=SC2086
/usr/bin/python3 scripts/plot_train.py --compare "$FIG/long_context.png" --title "$title" \
    ${plots#|}
unset IFS

/usr/bin/python3 - "$FIG/long_context.md" "$title" "$TOKENS" "${plots#|}" <<'EOF'
import csv, os, sys
out, title, tokens, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rows = []
for item in runs.split("|"):
    label, path = item.rsplit("=", 1)
    with open(path, newline="") as f:
        log = list(csv.DictReader(f))
    rows.append((label, [r for r in log if r["val_loss"]], [r for r in log if r["train_loss"]]))
steps = [int(r["step"]) for r in rows[0][1] if int(r["step"]) > 0]
lines = [title, "", "Validation loss (nats/byte) after each number of steps, then the last "
         "evaluation's perplexity and next-byte accuracy, and the run's own training speed "
         "(evaluations excluded; whatever else the machine ran then is in it).", "",
         "| run | " + " | ".join("step %d" % s for s in steps) +
         " | perplexity | next-byte accuracy | tokens/s |",
         "|---|" + "---|" * (len(steps) + 3)]
for label, val, train in rows:
    loss = {int(r["step"]): float(r["val_loss"]) for r in val}
    tps = int(train[-1]["step"]) * tokens / float(train[-1]["elapsed_s"])
    lines.append("| %s | %s | %.3f | %.4f | %.0f |" % (
        label, " | ".join("%.4f" % loss[s] if s in loss else "-" for s in steps),
        float(val[-1]["val_ppl"]), float(val[-1]["val_acc"]), tps))
if len(rows) == 2:
    a = {int(r["step"]): float(r["val_loss"]) for r in rows[0][1]}
    b = {int(r["step"]): float(r["val_loss"]) for r in rows[1][1]}
    lines += ["", "Second run minus first: " + ", ".join(
        "%+.4f at step %d" % (b[s] - a[s], s) for s in steps if s in a and s in b) + "."]
text = "\n".join(lines) + "\n"
open(out + ".tmp", "w").write(text)
os.replace(out + ".tmp", out)
print(text)
EOF
echo "figure: $FIG/long_context.png, table: $FIG/long_context.md"
