#!/bin/sh
# test_mpi_train: `mpirun -np N performer train ... --parallel data|sequence` against one
# process. A small model (2 layers, d_model 32, FAVOR+, rotary positions) trains 6 steps on a
# made-up text, evaluating every 3:
#   - data parallel at 2 ranks and sequence parallel at 2 and 3 (oversubscribed): every row of
#     log.csv (training loss, gradient norm, validation loss and accuracy) and the final weights
#     equal the single process's to float rounding (relative 1e-5);
#   - the same for --task mqar (data and sequence parallel at 2 ranks), whose answers fall
#     unevenly on the ranks: the validation loss and the answer accuracy are the whole batch's;
#   - stopped after step 3 (--stop-after) and resumed under mpirun: the same log and the same
#     weight bits as the uninterrupted parallel run;
#   - rank 0 alone writes: the folder holds the run's files only, no temporaries;
#   - errors, each one message and the same non-zero exit from every rank, never a hang, and no
#     folder left behind: no --parallel under 2 ranks, sequence with exact attention, --batch
#     below the rank count, a data file that is not there, an --out that is a file;
#   - a rank killed mid-run: mpirun ends the other within 30 s, non-zero, and the last
#     checkpoint is whole (it loads, and --resume under one process continues from it).
# Skipped, saying so, where mpirun or the MPI build of the tool (performer-mpi) is absent.
TEST=test_mpi_train; . "$(dirname "$0")/lib.sh"
mp="$(dirname "$P")/performer-mpi"
if ! command -v mpirun >/dev/null 2>&1 || [ ! -x "$mp" ]; then
    echo "test_mpi_train.sh: skipped: no mpirun or no $mp (MPI absent; make setup installs Open MPI)"
    finish
    exit $?
fi
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export OMPI_MCA_btl="self,vader,tcp" OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
MPIRUN="timeout 300 mpirun --allow-run-as-root --oversubscribe"

# a text with something to learn: sentences from a small vocabulary, 60 "documents"
$PY - "$T/text.txt" <<'PYEOF'
import random, sys
r = random.Random(5)
words = "in the beginning god created heaven and earth light was good day night".split()
with open(sys.argv[1], "w") as f:
    for doc in range(60):
        f.write(" ".join(r.choice(words) for _ in range(120)) + ".\n\n")
PYEOF
SMALL="--steps 6 --eval-every 3 --eval-batches 2 --context 48 --layers 2 --d-model 32 --heads 2
       --positions rotary --no-plot --threads 1"
ARGS="--data $T/text.txt --batch 4 --attention favor --features 16 --redraw 4 $SMALL"
cd "$T" || exit 1
"$P" train --out one $ARGS >one.log 2>&1 || fail "one process: $(tail -n 3 one.log)"

# compare.py A B [bits]: log rows and checkpoint tensors of two runs, equal to 1e-5 or to the bit
cat >compare.py <<'PYEOF'
import csv, json, struct, sys
import numpy as np
a, b, bits = sys.argv[1], sys.argv[2], len(sys.argv) > 3
def rows(d):
    with open(f"{d}/log.csv") as f:
        return list(csv.DictReader(f))
def tensors(d):
    with open(f"{d}/checkpoint.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    head.pop("__metadata__", None)
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], np.float32)
            for k, v in head.items()}
ra, rb = rows(a), rows(b)
assert len(ra) == len(rb) == 7, (len(ra), len(rb))
worst = 0.0
for x, y in zip(ra, rb):
    for k in ("step", "lr", "train_loss", "grad_norm", "val_loss", "val_acc") + \
             (("val_answer_acc",) if "val_answer_acc" in x else ()):
        if bits:
            assert x[k] == y[k], (k, x[k], y[k])
        elif x[k] != "":
            e = abs(float(x[k]) - float(y[k])) / max(abs(float(y[k])), 1e-30)
            worst = max(worst, e)
            assert e <= 1e-5, (x["step"], k, x[k], y[k])
ta, tb = tensors(a), tensors(b)
assert ta.keys() == tb.keys()
for k in ta:
    if bits:
        assert ta[k].tobytes() == tb[k].tobytes(), k
    else:
        e = np.linalg.norm(ta[k] - tb[k]) / max(np.linalg.norm(tb[k]), 1e-30)
        worst = max(worst, e)
        assert e <= 1e-5, (k, e)
print(f"{a} against {b}: " + ("the same bits" if bits else f"worst relative difference {worst:.2g}"))
PYEOF

for run in "data 2" "sequence 2" "sequence 3"; do
    set -- $run
    d="$1-np$2"
    if $MPIRUN -np "$2" "$P" train --out "$d" $ARGS --parallel "$1" >"$d.log" 2>&1; then
        $PY compare.py "$d" one && pass || fail "$d: not one process's run"
        grep -q "parallel: $2 ranks, $1" "$d.log" && pass || fail "$d: no 'parallel:' line"
        extra=$(ls -A "$d" | grep -v -x -e checkpoint.safetensors -e log.csv)
        [ -z "$extra" ] && pass || fail "$d: files besides the run's: $extra"
        n=$(grep -c "^step 6/6: validation" "$d.log")
        [ "$n" = 1 ] && pass || fail "$d: the summary printed $n times (rank 0 alone prints)"
    else
        fail "mpirun -np $2 train --parallel $1: $(tail -n 5 "$d.log")"
    fi
done

# MQAR: few answers, unevenly on the ranks (sequence parallel: a slice of every window each)
MQ="--task mqar --mqar-pairs 4 --mqar-queries 8 --mqar-keys 16 --batch 4 --attention favor
    --features 16 --redraw 4 $SMALL"
"$P" train --out mq-one $MQ >mq-one.log 2>&1 || fail "mqar, one process: $(tail -n 3 mq-one.log)"
for run in "data 2" "sequence 2"; do
    set -- $run
    d="mq-$1-np$2"
    if $MPIRUN -np "$2" "$P" train --out "$d" $MQ --parallel "$1" >"$d.log" 2>&1; then
        $PY compare.py "$d" mq-one && pass || fail "$d: not one process's run"
    else
        fail "mqar: mpirun -np $2 train --parallel $1: $(tail -n 5 "$d.log")"
    fi
done

# stopped and resumed under mpirun: the uninterrupted parallel run's bits
if $MPIRUN -np 2 "$P" train --out resumed $ARGS --parallel sequence --stop-after 3 \
       >resumed.log 2>&1 &&
   $MPIRUN -np 2 "$P" train --out resumed --resume --parallel sequence >>resumed.log 2>&1; then
    $PY compare.py resumed sequence-np2 bits && pass || fail "resumed: not the same bits"
else
    fail "stop and --resume under mpirun: $(tail -n 5 resumed.log)"
fi

# errors: one message, every rank the same exit code, no folder left
bad() { # want-exit message-pattern folder mpirun-args...
    want=$1 pat=$2 dir=$3
    shift 3
    $MPIRUN "$@" >bad.log 2>&1
    rc=$?
    [ "$rc" = "$want" ] || { fail "$*: exit $rc, wanted $want: $(head -n 3 bad.log)"; return; }
    n=$(grep -c "$pat" bad.log)
    [ "$n" = 1 ] && pass || fail "$*: the message '$pat' $n times: $(head -n 5 bad.log)"
    [ ! -e "$dir" ] && pass || fail "$*: left $dir"
}
bad 2 "give --parallel\|--parallel data or --parallel sequence" e1 -np 2 "$P" train --out e1 $ARGS
bad 2 "needs --attention favor" e2 -np 2 "$P" train --out e2 --data text.txt --batch 4 $SMALL \
    --attention exact --parallel sequence
bad 2 "needs --batch >= 3" e3 -np 3 "$P" train --out e3 --data text.txt $SMALL --batch 2 \
    --parallel data
bad 1 "nothere.txt" e4 -np 2 "$P" train --out e4 --data nothere.txt $SMALL --parallel data
: >afile
$MPIRUN -np 2 "$P" train --out afile $ARGS --parallel data >bad.log 2>&1
rc=$?
[ $rc -ne 0 ] && [ "$(grep -c "not a folder" bad.log)" = 1 ] && [ -f afile ] && [ ! -s afile ] &&
    pass || fail "--out a file: exit $rc: $(head -n 3 bad.log)"

# a rank killed mid-run
long="--data $T/text.txt --steps 100000 --eval-every 5 --eval-batches 1 --context 48 --batch 4
      --layers 2 --d-model 32 --heads 2 --attention favor --features 16 --no-plot --threads 1"
start=$(date +%s)
timeout 60 mpirun --allow-run-as-root --oversubscribe -np 2 "$P" train --out killed $long \
    --parallel data >killed.log 2>&1 &
job=$!
i=0
while [ $i -lt 100 ] && [ ! -s killed/checkpoint.safetensors ]; do sleep 0.2; i=$((i + 1)); done
sleep 1
victim=$(pgrep -f "^[^ ]*performer[^ ]* train --out killed" | tail -n 1)
[ -n "$victim" ] && kill -9 "$victim"
wait $job
rc=$?
took=$(($(date +%s) - start))
if [ -n "$victim" ] && [ $rc -ne 0 ] && [ $took -le 60 ]; then
    pass
    echo "a rank killed mid-run: mpirun ended the other (exit $rc, ${took} s in all)"
else
    fail "a rank killed mid-run: victim '$victim', exit $rc after ${took} s"
fi
# the checkpoint is whole: one process resumes from it for one more step
at=$($PY -c 'import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]
print(json.loads(f.read(n))["__metadata__"]["pf.step"])' killed/checkpoint.safetensors 2>/dev/null)
if [ -n "$at" ] && "$P" train --out killed --resume --stop-after $((at + 1)) >resume.log 2>&1; then
    pass
else
    fail "resuming from step '$at' after the kill: $(tail -n 3 resume.log)"
fi
finish
