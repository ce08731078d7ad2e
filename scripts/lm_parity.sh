#!/bin/sh
# lm_parity.sh: which attentions reach exact softmax attention's loss where attention matters.
# The demo's model (data/demo-kjv.md: a byte-level Transformer, 4 layers, d_model 128, 2 heads,
# context 256, learned positions) trained from scratch on the King James Bible for the same
# steps and tokens (1000 steps of 8 windows: 2,048,000 bytes, where the demo model reaches 1.77
# nats/byte against 3.02 for the byte frequencies alone) with each attention, over several
# seeds: each seed S sets the batches, the initial weights and the random features (--seed S).
#
#   sh scripts/lm_parity.sh          (after `make`; 21 runs of 8-20 minutes on one thread of
#                                     the 2-core development machine: 1 h 43 min, two to four
#                                     at a time)
#
# Runs (RUNS, any of):
#   exact     softmax attention                     favor64   FAVOR+, m = 64 positive features
#   favor256  FAVOR+, m = 256                       favorpp   FAVOR++ (OPRF features), m = 64
#   relu      ReLU random features, m = 64          elu       ELU+1 linear attention (no W)
#   local32   softmax over the last 32 positions only (a local-window baseline)
#   (favorM, favorppM, reluM, localW: the same at any m or window)
# DATA=proteins trains the protein model instead (the Performer paper's experiment in small: the
# 20,000 proteins of Debian's mmseqs2-examples, 4 layers, d_model 128, 4 heads, context 1024,
# batch 4, learned positions, 1000 steps at lr 2e-3), into NAME lm_parity_proteins:
#   DATA=proteins RUNS="exact favor128 relu128 favorpp128" sh scripts/lm_parity.sh
# Writes docs/figures/lm_parity.{png,md,csv}: validation curves (mean and the range of the
# seeds), and per attention the final loss as mean +- sd over seeds and as the share of the gap
# between the byte frequencies (no context) and exact attention that it closes (1 = exact's
# loss, 0 = no context at all), each seed against the exact run of the same seed.
# The runs go to $OUT (build/lm_parity/NAME-sSEED); a finished run is not repeated, an
# interrupted one resumed (--resume gives the same bits). JOBS runs at a time, THREADS threads
# each (results do not depend on either).
# Environment: BUILD (build), DATA (bible), OUT, RUNS, SEEDS ("1 2 3"), STEPS (1000), JOBS (2),
#   THREADS (1), FIG (docs/figures), NAME (lm_parity, or lm_parity_DATA).
set -e
BUILD=${BUILD:-build}
P=${PERFORMER:-$BUILD/performer}
DATA=${DATA:-bible}
NAME=${NAME:-lm_parity$([ "$DATA" = bible ] || echo "_$DATA")}
OUT=${OUT:-$BUILD/$NAME}
RUNS=${RUNS:-exact favor64 favor256 favorpp relu elu local32}
SEEDS=${SEEDS:-1 2 3}
STEPS=${STEPS:-1000}
JOBS=${JOBS:-2}
THREADS=${THREADS:-1}
FIG=${FIG:-docs/figures}

[ -x "$P" ] || { echo "lm_parity.sh: no $P (run make first)" >&2; exit 1; }
mkdir -p "$OUT" "$FIG"

# the demo model's training (scripts/make_demo_checkpoint.sh), but for the attention and seed
case $DATA in
bible) model="--data bible --positions learned --layers 4 --d-model 128 --heads 2 --context 256
              --batch 8 --steps $STEPS --lr 2e-3 --warmup 100 --eval-every 100 --eval-batches 16" ;;
proteins) model="--data proteins --positions learned --layers 4 --d-model 128 --heads 4
                 --context 1024 --batch 4 --steps $STEPS --lr 2e-3 --warmup 100 --eval-every 100
                 --eval-batches 16" ;;
*) echo "lm_parity.sh: DATA is bible or proteins" >&2; exit 2 ;;
esac
args_of() {
    case $1 in
    exact) echo "--attention exact" ;;
    favorpp) echo "--attention favor++ --features 64" ;;
    relu) echo "--attention favor --kernel relu --features 64" ;;
    elu) echo "--attention favor --kernel elu" ;;
    favorpp[1-9]*) echo "--attention favor++ --features ${1#favorpp}" ;;
    favor[1-9]*) echo "--attention favor --kernel positive --features ${1#favor}" ;;
    relu[1-9]*) echo "--attention favor --kernel relu --features ${1#relu}" ;;
    local[1-9]*) echo "--attention local --window ${1#local}" ;;
    *) echo "lm_parity.sh: unknown run '$1'" >&2; return 2 ;;
    esac
}
for run in $RUNS; do args_of "$run" >/dev/null; done

if [ "$1" = "--one" ]; then # one run: --one RUN SEED
    dir=$OUT/$2-s$3
    if [ -f "$dir/checkpoint.safetensors" ]; then
        "$P" train --out "$dir" --resume --threads "$THREADS" --no-plot >"$dir.out" 2>&1 ||
            { echo "lm_parity.sh: $2 seed $3 failed (see $dir.out)" >&2; exit 1; }
    else
        # shellcheck disable=SC2046,SC2086
        "$P" train --out "$dir" $model $(args_of "$2") --seed "$3" --threads "$THREADS" \
            --no-plot >"$dir.out" 2>&1 ||
            { echo "lm_parity.sh: $2 seed $3 failed (see $dir.out)" >&2; exit 1; }
    fi
    echo "== $2 seed $3: $(grep "validation loss" "$dir.out" | tail -1)"
    exit 0
fi

# one line per (run, seed) still to do, run JOBS at a time
todo=$OUT/todo.txt
: >"$todo"
for run in $RUNS; do
    for seed in $SEEDS; do
        dir=$OUT/$run-s$seed
        if [ -f "$dir/log.csv" ] && [ "$(tail -1 "$dir/log.csv" | cut -d, -f1)" = "$STEPS" ]; then
            continue
        fi
        echo "$run $seed" >>"$todo"
    done
done
start=$(date +%s)
if [ -s "$todo" ]; then
    echo "lm_parity.sh: $(wc -l <"$todo") runs, $JOBS at a time, into $OUT"
    # each line 'run seed' is one `sh lm_parity.sh --one run seed` (above), JOBS at a time
    export BUILD P NAME OUT STEPS THREADS DATA
    xargs -P "$JOBS" -L 1 sh "$0" --one <"$todo"
fi
echo "lm_parity.sh: runs took $(( $(date +%s) - start )) s"

# no context: the byte frequencies of the training split scored on the validation split
if [ "$DATA" = bible ]; then
    unigram=$(/usr/bin/python3 scripts/unigram_loss.py bible "$(ls "$OUT"/*/bible-kjv.txt |
        head -1)")
else
    unigram=$(/usr/bin/python3 scripts/unigram_loss.py proteins \
        /usr/share/doc/mmseqs2/example-data/DB.fasta.gz)
fi
# shellcheck disable=SC2086
set -- --out "$FIG/$NAME" --runs-dir "$OUT" --steps "$STEPS" --unigram "$unigram" --runs $RUNS \
    --seeds $SEEDS
[ "$DATA" = bible ] || set -- "$@" --title "Proteins (mmseqs2-examples): 4 layers, d_model 128, 4 \
heads, context 1024, batch 4, trained from scratch; mean of $(echo $SEEDS | wc -w) seeds, band = \
lowest to highest seed"
/usr/bin/python3 scripts/plot_parity.py "$@"
