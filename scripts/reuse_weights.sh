#!/bin/sh
# reuse_weights.sh: can a Performer reuse a softmax model's weights? An exact-attention model
# trained on the King James Bible is evaluated, with no training, with its attention swapped
# (`performer train --init-from SOURCE --steps 0`): FAVOR+ positive at m = 64, 256 and 1024,
# FAVOR++ with A fitted on training batches (--fit-batches; with A = 0 it would be FAVOR+ itself)
# and FAVOR+ ReLU, each over several W draws (seeds); then each swapped model is fine-tuned for
# a few hundred steps and its validation curve set against the same attention trained from
# scratch for as many steps (and the exact model fine-tuned alike, as the control).
#
#   sh scripts/reuse_weights.sh            (after `make`; tens of minutes on 2 cores)
#   SOURCE=build/lm_compare_bible/exact/checkpoint.safetensors sh scripts/reuse_weights.sh
#
# What is carried and what is new (performer train --help, --init-from): every trained tensor
# comes from SOURCE; FAVOR's W (from each run's --seed), FAVOR++'s statistic, the AdamW moments
# and the step count start afresh. The evaluation batches depend on the seed (data and W share
# it), so every swapped loss is set against the exact model's evaluated with the same seed: the
# jump is a difference on the same validation windows.
#
# Writes $FIG/$NAME.md (the tables) and $FIG/$NAME.png (the curves; NAME: reuse_weights); the
# runs go to $OUT. A finished run is not repeated. Settings through the environment:
#   BUILD (build), NAME (reuse_weights), OUT ($BUILD/$NAME), FIG (docs/figures), THREADS (2);
#   SOURCE: an exact checkpoint to start from; without it one is trained into $OUT/source with
#     the settings of scripts/compare_lm.sh's Bible run: LAYERS (4), DMODEL (128), HEADS (4),
#     CONTEXT (1024), BATCH (4), SOURCE_STEPS (1000), LR (2e-3), WARMUP (100);
#   SEEDS ("1 2 3"): W draws of every swapped evaluation; EVAL_BATCHES (16);
#   MS ("64 256 1024"): FAVOR+ features of the evaluations; FT_M (256): of the fine-tuning;
#   FIT (32): FAVOR++'s --fit-batches; REDRAW (100);
#   FT_STEPS (300), FT_LR (5e-4), FT_WARMUP (20): fine-tuning; the from-scratch runs take
#     FT_STEPS steps at LR with WARMUP; FT_EVAL (25): evaluate every FT_EVAL steps.
# A tiny run, to see that it works (20 s here, from the demo's model; its numbers are noise):
#   SOURCE=data/demo-kjv.safetensors BATCH=2 FT_STEPS=10 FT_EVAL=5 SEEDS="1 2" EVAL_BATCHES=2 \
#   FIT=2 OUT=/tmp/rw FIG=/tmp/rw sh scripts/reuse_weights.sh
set -e
BUILD=${BUILD:-build}
P=${PERFORMER:-$BUILD/performer}
NAME=${NAME:-reuse_weights}
OUT=${OUT:-$BUILD/$NAME}
FIG=${FIG:-docs/figures}
THREADS=${THREADS:-2}
LAYERS=${LAYERS:-4}
DMODEL=${DMODEL:-128}
HEADS=${HEADS:-4}
CONTEXT=${CONTEXT:-1024}
BATCH=${BATCH:-4}
SOURCE_STEPS=${SOURCE_STEPS:-1000}
LR=${LR:-2e-3}
WARMUP=${WARMUP:-100}
SEEDS=${SEEDS:-1 2 3}
EVAL_BATCHES=${EVAL_BATCHES:-16}
MS=${MS:-64 256 1024}
FT_M=${FT_M:-256}
FIT=${FIT:-32}
REDRAW=${REDRAW:-100}
FT_STEPS=${FT_STEPS:-300}
FT_LR=${FT_LR:-5e-4}
FT_WARMUP=${FT_WARMUP:-20}
FT_EVAL=${FT_EVAL:-25}
PY=/usr/bin/python3

[ -x "$P" ] || { echo "reuse_weights.sh: no $P (run make first)" >&2; exit 1; }
mkdir -p "$OUT/zero" "$OUT/finetune" "$OUT/scratch" "$FIG"

# run DIR STEPS FLAGS...: performer train into DIR unless its log already ends at step STEPS;
# a run stopped before that is resumed (the same bits as never stopped)
run() {
    d=$1; steps=$2; shift 2
    if [ -f "$d/checkpoint.safetensors" ]; then
        [ "$(tail -1 "$d/log.csv" | cut -d, -f1)" = "$steps" ] && return 0
        "$P" train --out "$d" --resume --threads "$THREADS" --no-plot >/dev/null
    else
        "$P" train --out "$d" "$@" >/dev/null
    fi
}
# meta KEY: a metadata value of SOURCE
meta() {
    "$PY" -c "import json, struct, sys
f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]
print(json.loads(f.read(n))['__metadata__'][sys.argv[2]])" "$SOURCE" "$1"
}

# ---- the source: an exact model on the Bible -------------------------------------------------
if [ -z "${SOURCE-}" ]; then
    SOURCE=$OUT/source/checkpoint.safetensors
    if [ -f "$SOURCE" ] &&
        [ "$(tail -1 "$OUT/source/log.csv" | cut -d, -f1)" != "$SOURCE_STEPS" ]; then
        echo "== source: resuming"
        "$P" train --out "$OUT/source" --resume --threads "$THREADS" --no-plot
    elif [ ! -f "$SOURCE" ]; then
        echo "== source: exact attention, $SOURCE_STEPS steps"
        "$P" train --out "$OUT/source" --data bible --attention exact --layers "$LAYERS" \
            --d-model "$DMODEL" --heads "$HEADS" --context "$CONTEXT" --batch "$BATCH" \
            --steps "$SOURCE_STEPS" --lr "$LR" --warmup "$WARMUP" --eval-every 100 \
            --eval-batches "$EVAL_BATCHES" --seed 1 --threads "$THREADS" --no-plot
    fi
fi
[ -f "$SOURCE" ] || { echo "reuse_weights.sh: no $SOURCE" >&2; exit 1; }
# the Bible once, as a text file every run reads (the split and batches are --data bible's)
TEXT=$OUT/bible-kjv.txt
if [ ! -s "$TEXT" ]; then
    if [ -s "$(dirname "$SOURCE")/bible-kjv.txt" ]; then
        cp "$(dirname "$SOURCE")/bible-kjv.txt" "$TEXT.tmp"
    else
        bible -f Ge1:1-Re22:21 | cut -d' ' -f2- >"$TEXT.tmp"
    fi
    mv "$TEXT.tmp" "$TEXT"
fi
DATA="--data $TEXT --format text --batch $BATCH --eval-batches $EVAL_BATCHES --threads $THREADS
      --no-plot"

# variants: NAME, then the flags of its attention
variant_args() {
    case $1 in
    exact) echo "--attention exact" ;;
    favor-m*) echo "--attention favor --kernel positive --features ${1#favor-m} --redraw $REDRAW" ;;
    relu-m*) echo "--attention favor --kernel relu --features ${1#relu-m} --redraw $REDRAW" ;;
    favorppfit-m*) echo "--attention favor++ --features ${1#favorppfit-m} --redraw $REDRAW
                         --fit-batches $FIT" ;;
    *) echo "reuse_weights.sh: unknown variant $1" >&2; exit 2 ;;
    esac
}

# ---- 1. swapped, no training -----------------------------------------------------------------
ZERO="exact"
for m in $MS; do ZERO="$ZERO favor-m$m"; done
ZERO="$ZERO favorppfit-m$FT_M relu-m$FT_M"
for v in $ZERO; do
    for s in $SEEDS; do
        echo "== no training: $v, seed $s"
        # shellcheck disable=SC2046,SC2086
        run "$OUT/zero/$v-s$s" 0 --init-from "$SOURCE" $(variant_args "$v") --seed "$s" \
            --steps 0 $DATA
    done
done

# ---- 2. fine-tuned against from scratch ------------------------------------------------------
FT="exact favor-m$FT_M favorppfit-m$FT_M relu-m$FT_M"
for v in $FT; do
    echo "== fine-tuning: $v, $FT_STEPS steps"
    # shellcheck disable=SC2046,SC2086
    run "$OUT/finetune/$v" "$FT_STEPS" --init-from "$SOURCE" $(variant_args "$v") --seed 1 \
        --steps "$FT_STEPS" --lr "$FT_LR" --warmup "$FT_WARMUP" --eval-every "$FT_EVAL" $DATA
    [ "$v" = exact ] && continue # (exact from scratch is the source itself)
    echo "== from scratch: $v, $FT_STEPS steps"
    # shellcheck disable=SC2046,SC2086
    run "$OUT/scratch/$v" "$FT_STEPS" $(variant_args "$v" | sed 's/--fit-batches [0-9]*//') \
        --layers "$(meta pf.layers)" --d-model "$(meta pf.d_model)" --heads "$(meta pf.heads)" \
        --context "$(meta pf.context)" --positions "$(meta pf.positions)" --seed 1 \
        --steps "$FT_STEPS" --lr "$LR" --warmup "$WARMUP" --eval-every "$FT_EVAL" $DATA
done

# ---- 3. the tables and the curves ------------------------------------------------------------
"$PY" - "$OUT" "$FIG" "$SOURCE" "$ZERO" "$FT" "$SEEDS" "$FT_STEPS" "$FT_LR" "$LR" "$FIT" \
    "$NAME" <<'EOF'
import csv, json, math, os, struct, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

out, fig, source, zero, ft, seeds, ft_steps, ft_lr, lr, fit, name = sys.argv[1:12]
zero, ft, seeds = zero.split(), ft.split(), seeds.split()

def log(path):
    with open(os.path.join(path, "log.csv"), newline="") as f:
        return [(int(r["step"]), float(r["val_loss"])) for r in csv.DictReader(f) if r["val_loss"]]

def mean_sd(x):
    m = sum(x) / len(x)
    return m, (math.sqrt(sum((v - m) ** 2 for v in x) / (len(x) - 1)) if len(x) > 1 else 0.0)

def label(v):
    if v == "exact":
        return "exact softmax (the source)"
    kind, m = v.rsplit("-m", 1)
    return {"favor": "FAVOR+ positive", "relu": "FAVOR+ ReLU", "favorpp": "FAVOR++ (A = 0)",
            "favorppfit": "FAVOR++ (A fitted on %s training batches)" % fit}[kind] + ", m = " + m

f = open(source, "rb")
meta = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))["__metadata__"]
exact = {s: log(os.path.join(out, "zero", "exact-s" + s))[0][1] for s in seeds}
lines = ["Source: %s (%s attention, step %s; %s layers, d_model %s, %s heads, context %s, %s "
         "positions), King James Bible." % (source, meta["pf.attention"], meta["pf.step"],
         meta["pf.layers"], meta["pf.d_model"], meta["pf.heads"], meta["pf.context"],
         meta["pf.positions"]), "",
         "Swapped attention, no training (`performer train --init-from SOURCE --steps 0`), "
         "validation loss in nats/byte, mean ± sd over %d seeds (W draws; each seed's exact "
         "loss on the same validation windows is subtracted for the jump):" % len(seeds), "",
         "| attention | val loss | jump over exact |", "|---|---|---|"]
for v in zero:
    loss = [log(os.path.join(out, "zero", "%s-s%s" % (v, s)))[0][1] for s in seeds]
    jump = [l - exact[s] for l, s in zip(loss, seeds)]
    lines.append("| %s | %.4f ± %.4f | %+.4f ± %.4f |" % ((label(v),) + mean_sd(loss) +
                                                        mean_sd(jump)))
lines += ["", "Fine-tuned from the source for %s steps (lr %s) against the same attention trained "
          "from scratch for as many steps (lr %s), seed 1:" % (ft_steps, ft_lr, lr), "",
          "| attention | step 0 | fine-tuned | from scratch |", "|---|---|---|---|"]
figure, axes = plt.subplots(1, 2, figsize=(12, 4.8))
for i, v in enumerate(ft):
    a = log(os.path.join(out, "finetune", v))
    col = "C%d" % i
    scratch = "—"
    for ax in axes:
        ax.plot([s for s, _ in a], [l for _, l in a], color=col, label=label(v) + ", fine-tuned")
    if v != "exact":
        b = log(os.path.join(out, "scratch", v))
        for ax in axes:
            ax.plot([s for s, _ in b], [l for _, l in b], color=col, ls="--",
                    label=label(v) + ", from scratch")
        scratch = "%.4f" % b[-1][1]
    lines.append("| %s | %.4f | %.4f | %s |" % (label(v), a[0][1], a[-1][1], scratch))
top = max(log(os.path.join(out, "finetune", v))[0][1] for v in ft)
axes[1].set_ylim(exact[seeds[0]] - 0.1, max(top, exact[seeds[0]] + 0.5) + 0.1)
axes[0].set_title("validation loss (all)", fontsize=10)
axes[1].set_title("near the source's loss", fontsize=10)
for ax in axes:
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats/byte)")
    ax.grid(alpha=0.3)
# the legend below the panels, off the curves
handles, labels = axes[0].get_legend_handles_labels()
figure.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
# each source's figure says which model it starts from
figure.suptitle("%s's weights (%s layers, %s heads, context %s, step %s) under other attention: "
                "fine-tuned against from scratch" % (os.path.basename(os.path.dirname(source))
                if source.endswith("checkpoint.safetensors") else os.path.basename(source),
                meta["pf.layers"], meta["pf.heads"], meta["pf.context"], meta["pf.step"]),
                fontsize=10)
figure.tight_layout(rect=(0, 0.09, 1, 1))
png = os.path.join(fig, name + ".png")
plt.savefig(png + ".tmp.png", dpi=110)
os.replace(png + ".tmp.png", png)
text = "\n".join(lines) + "\n"
md = os.path.join(fig, name + ".md")
open(md + ".tmp", "w").write(text)
os.replace(md + ".tmp", md)
print(text)
print("figure:", png, "table:", md)
EOF
