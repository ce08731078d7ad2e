#!/bin/sh
# long_context.sh: does a longer context pay for FAVOR+, and where in the window? The same small
# model (LAYERS layers, d_model DMODEL, HEADS heads, rotary positions) is trained from scratch on
# each data set in DATAS with exact attention at context SHORT, and FAVOR+ (positive features,
# m = FEATURES, W fixed) at contexts SHORT and LONG; BATCH windows a step at every context (the
# same windows a step: the long model sees LONG/SHORT times the tokens), STEPS steps, seeds SEEDS.
# Then every model's loss is measured by position in the window, on the same validation windows
# of LONG bytes (the tool's own validation set, read back through PERFORMER_TRAIN_DUMP): the long
# model on whole windows, the short ones on each window cut into SHORT-byte pieces
# (performer.Model.token_losses). Where the long model's loss keeps falling beyond position SHORT,
# the far context pays.
#
#   sh scripts/long_context.sh        (after `make`; 66 minutes on the 2-core development machine,
#                                     two runs at a time: the long runs dominate)
#
# Data: bible (the King James Bible: chapters in order, pieces of about 2 KB) and proteins (the
# 20,000 proteins of Debian's mmseqs2-examples, whose repeats between sequences lie far apart).
# Writes $FIG/long_context.{csv,md,png} (scripts/plot_long_context.py); the runs go to $OUT, a
# finished one is not repeated and a stopped one resumed. Environment: BUILD (build), OUT
# ($BUILD/long_context), FIG (docs/figures), DATAS (bible proteins), SEEDS (1 2 3), SHORT (1024),
# LONG (8192), BATCH (4), STEPS (400), LAYERS (2), DMODEL (128), HEADS (4), FEATURES (64), LR
# (2e-3), WARMUP (50), EVAL_BATCHES (4: validation windows of LONG bytes, BATCH a batch), JOBS
# (2 runs at a time), THREADS (1 each).
set -e
BUILD=${BUILD:-build}
P=${PERFORMER:-$BUILD/performer}
OUT=${OUT:-$BUILD/long_context}
FIG=${FIG:-docs/figures}
DATAS=${DATAS:-bible proteins}
SEEDS=${SEEDS:-1 2 3}
SHORT=${SHORT:-1024}
LONG=${LONG:-8192}
BATCH=${BATCH:-4}
STEPS=${STEPS:-400}
LAYERS=${LAYERS:-2}
DMODEL=${DMODEL:-128}
HEADS=${HEADS:-4}
FEATURES=${FEATURES:-64}
LR=${LR:-2e-3}
WARMUP=${WARMUP:-50}
EVAL_BATCHES=${EVAL_BATCHES:-4}
JOBS=${JOBS:-2}
THREADS=${THREADS:-1}
PY=/usr/bin/python3

[ -x "$P" ] || { echo "long_context.sh: no $P (run make first)" >&2; exit 1; }
[ $((LONG % SHORT)) -eq 0 ] || { echo "long_context.sh: LONG must be a multiple of SHORT" >&2
                                 exit 2; }

# RUN: exact-cT or favor-cT
args_of() {
    case $1 in
    exact-c*) echo "--attention exact --context ${1#exact-c}" ;;
    favor-c*) echo "--attention favor --kernel positive --features $FEATURES --redraw 0
                    --context ${1#favor-c}" ;;
    *) echo "long_context.sh: unknown run '$1'" >&2; return 2 ;;
    esac
}

if [ "$1" = "--one" ]; then # --one DATA RUN SEED
    d=$OUT/$2/$3-s$4
    mkdir -p "$OUT/$2"
    if [ -f "$d/checkpoint.safetensors" ]; then
        [ "$(tail -1 "$d/log.csv" | cut -d, -f1)" = "$STEPS" ] && exit 0
        "$P" train --out "$d" --resume --threads "$THREADS" --no-plot >>"$d.out" 2>&1
    else
        # shellcheck disable=SC2046
        "$P" train --out "$d" --data "$2" $(args_of "$3") --layers "$LAYERS" --d-model "$DMODEL" \
            --heads "$HEADS" --positions rotary --batch "$BATCH" --steps "$STEPS" --lr "$LR" \
            --warmup "$WARMUP" --eval-every 100 --eval-batches "$EVAL_BATCHES" --seed "$4" \
            --threads "$THREADS" --no-plot >"$d.out" 2>&1
    fi || { echo "long_context.sh: $2 $3 seed $4 failed (see $d.out)" >&2; exit 1; }
    echo "== $2, $3, seed $4: $(grep "validation loss" "$d.out" | tail -1)"
    exit 0
fi

RUNS="exact-c$SHORT favor-c$SHORT favor-c$LONG"
mkdir -p "$OUT" "$FIG"
: >"$OUT/todo.txt"
for s in $SEEDS; do
    for data in $DATAS; do
        for r in $RUNS; do echo "$data $r $s" >>"$OUT/todo.txt"; done
    done
done
start=$(date +%s)
export BUILD P OUT STEPS THREADS BATCH LAYERS DMODEL HEADS FEATURES LR WARMUP EVAL_BATCHES
xargs -P "$JOBS" -L 1 sh "$0" --one <"$OUT/todo.txt"
echo "long_context.sh: runs took $(($(date +%s) - start)) s"

# the validation windows of LONG bytes, as the tool evaluates them: a --steps 0 run of the first
# seed's long model with PERFORMER_TRAIN_DUMP (eval_tokens.npy, (EVAL_BATCHES, BATCH, LONG))
for data in $DATAS; do
    w=$OUT/$data/windows
    [ -s "$w/eval_tokens.npy" ] && continue
    rm -rf "$w" "$w.run"
    mkdir -p "$w"
    s=$(echo $SEEDS | cut -d' ' -f1)
    PERFORMER_TRAIN_DUMP=$w "$P" train --out "$w.run" --data "$data" \
        --init-from "$OUT/$data/favor-c$LONG-s$s/checkpoint.safetensors" --attention favor \
        --kernel positive --features "$FEATURES" --context "$LONG" --batch "$BATCH" --steps 0 \
        --eval-batches "$EVAL_BATCHES" --seed "$s" --threads "$THREADS" --no-plot >"$w.out" 2>&1
    rm -f "$w/eval_logits.npy"
done
# the losses by position, through the library in Python (on the OpenBLAS kernels the tool picks)
if [ -z "${OPENBLAS_CORETYPE-}" ]; then
    core=$("$P" --version | sed -n "s/.*OpenBLAS kernels: \([A-Za-z0-9_]*\), set by performer.*/\1/p")
    [ -z "$core" ] || export OPENBLAS_CORETYPE="$core"
fi
# shellcheck disable=SC2086
"$PY" scripts/plot_long_context.py --runs "$OUT" --out "$FIG/long_context" --datas $DATAS \
    --seeds $SEEDS --short "$SHORT" --long "$LONG" --lib "$BUILD/libperformer.so"
