#!/bin/sh
# mqar_swap.sh: how many features does a random-feature map need to do what trained softmax
# attention does on recall? Every exact-attention model of scripts/mqar_sweep.sh (the runs
# $OUT/L<length>-p<pairs>/exact-m0-s<seed>) is evaluated, weights unchanged, with its attention
# swapped for FAVOR+ (positive features), FAVOR++ (A fitted on 8 training batches) and ReLU
# features at feature counts m = SWAP_MS, W drawn from W_SEEDS, and with elu + 1 (no W), on the
# validation sequences that model was scored on (`performer train --init-from CKPT --steps 0`:
# the same data seed, batch and task). As m grows FAVOR+ and FAVOR++ tend to softmax attention
# (both are unbiased for exp(q.k)), so the answer accuracy against m says what state a
# linear-time readout of these very attention weights would need; exact attention evaluated the
# same way is the check that nothing else changed.
#
#   sh scripts/mqar_swap.sh     (after scripts/mqar_sweep.sh has trained some exact runs)
#   TRAINED=favor sh scripts/mqar_swap.sh     (the same for its FAVOR+ models that learnt)
#
# TRAINED (exact) names the sweep's attention whose models are swapped; only models that
# learnt the task (best evaluated answer accuracy above 0.5) are, and for TRAINED other than
# exact the swap to exact attention reads the softmax attention their features estimate,
# beside a row `trained` (the model's last evaluation in training, with the W it had then).
# Writes $FIG/${NAME}_swap.csv (or ${NAME}_swap_$TRAINED.csv; columns length, pairs, seed,
# attention, m, w_seed, val_loss, answer_acc, model) and draws its .png and .md
# (scripts/plot_mqar.py --swap; the .md ends with the sharpness of each model's attention at
# the answers, --sharpness). Settings through the environment: BUILD (build), NAME
# (mqar_sweep), OUT ($BUILD/$NAME), FIG (docs/figures), TRAINED (exact), SWAP_MS (16 64 256
# 1024 4096 16384), W_SEEDS (1 2 3), TOKENS (4096) and STEPS (8000) as the sweep's (batch =
# TOKENS / length; a run short of STEPS is skipped), THREADS (1). Each evaluation takes
# seconds (about 10 at m = 16384, length 64).
set -e
BUILD=${BUILD:-build}
P=${PERFORMER:-$BUILD/performer}
NAME=${NAME:-mqar_sweep}
OUT=${OUT:-$BUILD/$NAME}
FIG=${FIG:-docs/figures}
SWAP_MS=${SWAP_MS:-16 64 256 1024 4096 16384}
W_SEEDS=${W_SEEDS:-1 2 3}
TOKENS=${TOKENS:-4096}
STEPS=${STEPS:-8000}
THREADS=${THREADS:-1}
TRAINED=${TRAINED:-exact}
case $TRAINED in
exact) SUFFIX="" ;;
favor | favorpp | relu | elu) SUFFIX=_$TRAINED ;;
*) echo "mqar_swap.sh: TRAINED must be exact, favor, favorpp, relu or elu, not '$TRAINED'" >&2
   exit 2 ;;
esac

[ -x "$P" ] || { echo "mqar_swap.sh: no $P (run make first)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
csv=$tmp/swap.csv
echo "length,pairs,seed,attention,m,w_seed,val_loss,answer_acc,model" >"$csv"
one() { # ATTENTION-NAME M W-SEED FLAGS...: one evaluation of $ck into the CSV (W-SEED 0: no W)
    name=$1 m=$2 w=$3
    shift 3
    d=$tmp/run
    rm -rf "$d"
    ws=""
    [ "$w" = 0 ] || ws="--w-seed $w"
    # shellcheck disable=SC2068,SC2086 # FLAGS, ws: words
    "$P" train --out "$d" --init-from "$ck" --task mqar --mqar-pairs "$N" \
        --mqar-queries $((L / 4)) --mqar-keys 64 $@ --data-seed "$S" $ws \
        --steps 0 --batch "$B" --eval-batches 8 --threads "$THREADS" --no-plot \
        >"$tmp/out" 2>&1 || { cat "$tmp/out" >&2; exit 1; }
    row=$(tail -n 1 "$d/log.csv")
    echo "$L,$N,$S,$name,$m,$w,$(echo "$row" | cut -d, -f7),$(echo "$row" | cut -d, -f10),$model" \
        >>"$csv"
    n=$((n + 1))
}

n=0
for ck in "$OUT"/L*-p*/"$TRAINED"-m*-s*/checkpoint.safetensors; do
    [ -f "$ck" ] || continue
    run=$(dirname "$ck")
    model=$(basename "$run")
    group=$(basename "$(dirname "$run")")      # L<length>-p<pairs>
    L=${group#L}; L=${L%%-*}
    N=${group##*-p}
    S=${run##*-s}
    # only finished runs: the log's last step is the sweep's STEPS
    [ -f "$run/log.csv" ] || continue
    last=$(tail -n 1 "$run/log.csv" | cut -d, -f1)
    if [ "$last" != "$STEPS" ]; then
        echo "mqar_swap.sh: $run is not finished (step $last of $STEPS), skipped" >&2
        continue
    fi
    # only models that learnt the task: a model at the plateau has no lookup to carry
    best=$(cut -d, -f10 "$run/log.csv" | sed 1d | grep . | sort -g | tail -n 1)
    if ! awk -v b="${best:-0}" 'BEGIN { exit !(b > 0.5) }'; then
        echo "mqar_swap.sh: $model (L $L, $N pairs) did not learn the task (best $best)," \
            "skipped" >&2
        continue
    fi
    B=$((TOKENS / L))
    if [ "$TRAINED" != exact ]; then # its own last evaluation, with the W it had then
        row=$(tail -n 1 "$run/log.csv")
        tm=${model#*-m}
        echo "$L,$N,$S,trained,${tm%-s*},0,$(echo "$row" | cut -d, -f7),$(echo "$row" |
            cut -d, -f10),$model" >>"$csv"
    fi
    one exact 0 0 --attention exact
    one elu 0 0 --attention favor --kernel elu
    for m in $SWAP_MS; do
        for w in $W_SEEDS; do
            one favor "$m" "$w" --attention favor --kernel positive --features "$m"
            one favorpp "$m" "$w" --attention favor++ --features "$m" --fit-batches 8
            one relu "$m" "$w" --attention favor --kernel relu --features "$m"
        done
        echo "mqar_swap.sh: L $L, $N pairs, seed $S, m $m done"
    done
done
[ "$n" -gt 0 ] || { echo "mqar_swap.sh: no finished $TRAINED run under $OUT that learnt" >&2
                    exit 1; }
mkdir -p "$FIG"
dst=$FIG/${NAME}_swap$SUFFIX
cp "$csv" "$dst.csv.tmp"
mv "$dst.csv.tmp" "$dst.csv"
/usr/bin/python3 scripts/plot_mqar.py --swap "$dst.csv" --out "$dst"
# and how sharp those models' attention is where they answer (appended to the .md)
# shellcheck disable=SC2046 # the checkpoints: words (paths without spaces)
PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH} /usr/bin/python3 scripts/plot_mqar.py \
    --out "$dst.md" --sharpness $(cut -d, -f1,2,9 "$csv" | sed 1d | sort -u |
    sed 's#^\([0-9]*\),\([0-9]*\),\(.*\)$#'"$OUT"'/L\1-p\2/\3/checkpoint.safetensors#')
