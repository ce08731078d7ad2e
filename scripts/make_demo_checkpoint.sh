#!/bin/sh
# make_demo_checkpoint.sh: the small trained model that `performer demo` runs FAVOR+ on (the
# queries, keys and values its layers really produce, next to random ones).
#
#   sh scripts/make_demo_checkpoint.sh      (after `make`; a few minutes on 2 idle cores)
#
# Trains a small exact-attention byte model on the King James Bible with `performer train` (the
# command is below, and recorded), then writes into $DEST (data/):
#   demo-kjv.safetensors  the checkpoint without its AdamW moments (weights, settings and
#                         counters only: a third of the size; it loads with pf_model_load, and
#                         `performer train --init-from` starts from it, but --resume cannot
#                         continue it bit for bit)
#   demo-kjv-val.txt      the first validation documents of the run's split (about 16 KB): the
#                         text the demo runs the model on, never seen in training
#   demo-kjv.md           what was run, how long it took, its validation loss against the
#                         no-context baseline, the files' sizes and SHA-256
# The run itself (full checkpoint, log, exported Bible) stays in $OUT; a finished run is not
# repeated, an interrupted one is resumed. Every file in $DEST is written to a temporary name and
# renamed. Settings through the environment (defaults = the shipped files): BUILD (build), OUT
# ($BUILD/demo-kjv), DEST (data), STEPS (1000), THREADS (2).
set -e
BUILD=${BUILD:-build}
P=${PERFORMER:-$BUILD/performer}
OUT=${OUT:-$BUILD/demo-kjv}
DEST=${DEST:-data}
STEPS=${STEPS:-1000}
THREADS=${THREADS:-2}
PY=/usr/bin/python3

[ -x "$P" ] || { echo "make_demo_checkpoint.sh: no $P (run make first)" >&2; exit 1; }
mkdir -p "$DEST"
args="--data bible --attention exact --positions learned --layers 4 --d-model 128 --heads 2
      --context 256 --batch 8 --steps $STEPS --lr 2e-3 --warmup 100 --eval-every 100
      --eval-batches 16 --seed 1"
cmd="performer train --out DIR $(echo $args)"
if [ -f "$OUT/checkpoint.safetensors" ]; then
    if [ "$(tail -1 "$OUT/log.csv" | cut -d, -f1)" != "$STEPS" ]; then
        echo "== resuming $OUT"
        "$P" train --out "$OUT" --resume --threads "$THREADS" --no-plot
    else
        echo "== $OUT: done already"
    fi
else
    echo "== $cmd"
    # shellcheck disable=SC2086
    "$P" train --out "$OUT" $args --threads "$THREADS" --no-plot
fi

"$PY" - "$OUT" "$DEST" "$cmd" "$("$P" --version | head -1)" "$(sed -n 's/^model name[^:]*: //p' \
    /proc/cpuinfo | head -1), $(nproc) cores" "$(dirname "$0")" <<'EOF'
import collections, csv, hashlib, json, math, os, struct, sys, tempfile
out, dest, cmd, version, cpu = sys.argv[1:6]

def atomic_write(path, data):
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp.", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise

# the checkpoint without the AdamW moments (safetensors: u64 header length, JSON, data)
b = open(os.path.join(out, "checkpoint.safetensors"), "rb").read()
n = struct.unpack("<Q", b[:8])[0]
head = json.loads(b[8:8 + n])
meta = head.pop("__metadata__")
data = b[8 + n:]
keep = sorted((k for k in head if not k.startswith("adamw.")), key=lambda k: head[k]["data_offsets"][0])
newhead, chunks, off = {"__metadata__": meta}, [], 0
for k in keep:
    s, e = head[k]["data_offsets"]
    newhead[k] = {"dtype": head[k]["dtype"], "shape": head[k]["shape"], "data_offsets": [off, off + e - s]}
    chunks.append(data[s:e])
    off += e - s
hj = json.dumps(newhead, separators=(",", ":")).encode()
hj += b" " * (-len(hj) % 8)
ckpt = struct.pack("<Q", len(hj)) + hj + b"".join(chunks)
atomic_write(os.path.join(dest, "demo-kjv.safetensors"), ckpt)

# the split as the tool makes it (scripts/unigram_loss.py): text pieces ending at the first line
# end after 2048 bytes, a piece validation when its hash (pf_doc_hash) maps below
# run.val_fraction
sys.path.insert(0, sys.argv[6])
from unigram_loss import documents, is_validation  # noqa: E402

docs = documents(open(os.path.join(out, "bible-kjv.txt"), "rb").read(), "text")
frac = float(meta["run.val_fraction"])
train, val, val_docs = collections.Counter(), collections.Counter(), []
for d in docs:
    if is_validation(d, frac):
        val.update(d)
        val_docs.append(d)
    else:
        train.update(d)
nt, nv = sum(train.values()), sum(val.values())
unigram = -sum(c / nv * math.log(train[x] / nt) for x, c in val.items())
excerpt = b""
for d in val_docs:
    if len(excerpt) >= 16384:
        break
    excerpt += d
atomic_write(os.path.join(dest, "demo-kjv-val.txt"), excerpt)

rows = list(csv.DictReader(open(os.path.join(out, "log.csv"))))
last = [r for r in rows if r["val_loss"]][-1]
first = rows[0]
size = len(ckpt)
sha = hashlib.sha256(ckpt).hexdigest()
md = f"""# data/: the trained model `performer demo` measures FAVOR+ on

Made by `sh scripts/make_demo_checkpoint.sh` ({version}; {cpu}), which ran

    {cmd}

and kept the weights: a decoder-only byte Transformer ({meta['pf.layers']} layers, d_model {meta['pf.d_model']},
{meta['pf.heads']} heads of width {int(meta['pf.d_model']) // int(meta['pf.heads'])}, context {meta['pf.context']}, learned positions, exact softmax
attention), {meta['pf.step']} steps of {meta['run.batch']} windows of {meta['pf.context']} bytes ({int(meta['run.tokens']):,} training tokens)
in {float(meta['run.elapsed']) / 60:.1f} min of training time (evaluations excluded; on the machine above, which
other work shared at the time: {int(meta['run.tokens']) / float(meta['run.elapsed']):,.0f} tokens/s).

| | validation loss (nats/byte) | perplexity | next-byte accuracy |
|---|---|---|---|
| step 0 (initial weights) | {float(first['val_loss']):.4f} | {float(first['val_ppl']):.2f} | {float(first['val_acc']):.4f} |
| step {last['step']} (this model) | {float(last['val_loss']):.4f} | {float(last['val_ppl']):.2f} | {float(last['val_acc']):.4f} |
| no context (byte frequencies) | {unigram:.4f} | {math.exp(unigram):.2f} | |

The no-context baseline is the training split's byte frequencies scored on the validation split
(the split by document hash, as the tool makes it, {nv:,} validation bytes).

- `demo-kjv.safetensors`: {size:,} bytes, the run's checkpoint without its AdamW moments
  (SHA-256 {sha});
  `performer sample --checkpoint` and `performer train --init-from` read it too.
- `demo-kjv-val.txt`: {len(excerpt):,} bytes, the first validation documents of that split
  (never trained on); `performer demo` runs the model on windows of it.
"""
atomic_write(os.path.join(dest, "demo-kjv.md"), md.encode())
print(md)
EOF
