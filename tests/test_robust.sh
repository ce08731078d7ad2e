#!/bin/sh
# test_robust.sh: the tool never destroys what was there, never hangs on an input, and refuses
# what does not apply, each case with its exit status, its message, and every file that existed
# before byte-identical (and of the same kind) afterwards.
#
#   PERFORMER=build/performer BUILD=build sh tests/test_robust.sh
#
# - outputs naming a device, a FIFO or a symbolic link: refused, the node untouched;
# - an input named as an output (--out q.npy), two outputs naming one file (also through
#   ./, a folder's .., a hard link, or --grad-prefix's names): refused, nothing written;
# - a run that fails after staging some outputs keeps every file that was there;
# - a 255-byte output name works (its temporary name is shortened);
# - `train` failing on bad data leaves no --out folder; `approx` likewise;
# - FIFO inputs (--q, --data, --checkpoint, --key-lengths) refused at once, never a hang;
#   --data /dev/zero refused; gzip with data after its last member refused;
# - `train --resume` range-checks every run.* value it reads (0, negative, out of range,
#   malformed), naming the key; pf.* values too;
# - flags a method does not use are refused (--method exact --kernel trig, ...); empty file
#   names say so; --threads beyond the library's limit is a usage error.
# No `set -e`: every check runs, failures are counted, exit 1 if any.

TEST=test_robust; . "$(dirname "$0")/lib.sh"
if ! $PY -c 'import numpy' 2>/dev/null; then echo "FAIL: $PY has no numpy"; exit 1; fi

# A listing of every entry under $T/w: kind, name, link target, and a checksum of each regular
# file, so "byte-identical and of the same kind" is one comparison.
W="$T/w"
mkdir "$W"
snapshot() {
    (cd "$W" && find . -mindepth 1 -printf '%y %p %l\n' | sort &&
        find . -type f -exec sha256sum {} + | sort -k 2) >"$1"
}

# expect "what" want-exit keyword command...: the command exits want-exit (1 or 2) within 20 s
# with `keyword` in its stderr, and every file in $W is as it was.
expect() {
    what=$1; want=$2; key=$3; shift 3
    snapshot "$T/before"
    timeout 20 "$@" >"$T/out" 2>"$T/err" </dev/null
    rc=$?
    snapshot "$T/after"
    if [ $rc -eq 124 ]; then fail "$what: hung (killed after 20 s)"
    elif [ $rc -ne "$want" ]; then fail "$what: exit $rc, expected $want: $(cat "$T/err")"
    elif ! grep -q -- "$key" "$T/err"; then fail "$what: message lacks '$key': $(cat "$T/err")"
    elif ! cmp -s "$T/before" "$T/after"; then
        fail "$what: files changed: $(diff "$T/before" "$T/after" | head -n 6)"
    else pass; fi
}

cd "$W" || exit 1
$PY - <<'EOF'
import numpy as np
r = np.random.default_rng(3)
for n in "qkv":
    np.save(f"{n}.npy", r.standard_normal((2, 9, 8), dtype=np.float32))
np.save("do.npy", r.standard_normal((2, 9, 8), dtype=np.float32))
np.save("lens.npy", np.array([9], dtype=np.int32))
EOF
echo "precious" >precious.txt
cp q.npy old.npy
A="attn --q q.npy --k k.npy --v v.npy"

# ---- outputs never destroy what was there ------------------------------------------------------
ln -s precious.txt link.npy
ln -s nowhere.npy dangling.npy
mkfifo fifo.npy
expect "--out a symlink" 1 "symbolic link" $P $A --out link.npy
expect "--out a dangling symlink" 1 "symbolic link" $P $A --out dangling.npy
expect "--out a FIFO" 1 "FIFO" $P $A --out fifo.npy
expect "--save-w a symlink" 1 "symbolic link" $P $A --out o.npy --save-w link.npy
ln -s precious.txt link.npy.x.dk.npy
expect "--grad-prefix onto a symlink" 1 "symbolic link" $P $A --out o.npy \
    --grad-out do.npy --grad-prefix link.npy.x
rm link.npy.x.dk.npy
# a device must stay a device (as root a rename would replace it: `--out /dev/null` once
# replaced the system's). Root tests on a null device of its own, so that a regression cannot
# harm the machine; others on /dev/null, which they cannot replace anyway.
if [ "$(id -u)" -eq 0 ] && mknod "$W/null" c 1 3 2>/dev/null; then dev="$W/null"
else dev=/dev/null; fi
expect "--out a device" 1 "device" $P $A --out "$dev"
[ -c "$dev" ] && pass || fail "$dev is no longer a character device"
expect "--out a folder" 1 "folder" $P $A --out "$W"
# inputs named as outputs
expect "--out names the input Q" 2 "also an output" $P $A --out q.npy
expect "--out names the input Q through ./" 2 "also an output" $P $A --out ./q.npy
expect "--save-w names the input K" 2 "also an output" $P $A --out o.npy --save-w k.npy
cp do.npy do.dq.npy
expect "--grad-prefix writes over --grad-out" 2 "also an output" $P $A --out o.npy \
    --grad-out do.dq.npy --grad-prefix do
rm do.dq.npy
ln q.npy hard.npy
expect "--out a hard link of Q" 2 "also an output" $P $A --out hard.npy
rm hard.npy
# two outputs, one file
expect "--out and --save-w one file" 2 "same file" $P $A --out o.npy --save-w o.npy
expect "--out and --save-w one file (./)" 2 "same file" $P $A --out o.npy --save-w ./o.npy
mkdir sub
expect "--out and --save-w one file (sub/..)" 2 "same file" $P $A --out o.npy --save-w sub/../o.npy
expect "--out and a gradient one file" 2 "same file" $P $A --out g.dq.npy --grad-out do.npy \
    --grad-prefix g
# a failure after the first output is staged: every earlier file kept (/proc takes no new
# files, so the gradients' temporary files cannot be made there; root passes access())
cp q.npy o.npy
if [ "$(id -u)" -eq 0 ]; then
    expect "failure after staging" 1 "/proc/pf_robust" $P $A --out o.npy \
        --grad-out do.npy --grad-prefix /proc/pf_robust
fi
cmp -s o.npy q.npy && pass || fail "o.npy changed by a failed run"
# empty names
expect "--out ''" 2 "--out: empty file name" $P $A --out ''
expect "--q ''" 2 "--q: empty file name" $P attn --q '' --k k.npy --v v.npy --out o.npy
expect "--save-w=" 2 "--save-w: empty file name" $P $A --out o.npy --save-w=
# a name of 255 bytes: legal, so it must work (the temporary name is shortened to fit)
long=$(printf '%0251d' 0).npy
if timeout 20 $P $A --out "$long" 2>"$T/err" && [ -f "$long" ] &&
    timeout 20 $P $A --out "$long" --features 8 2>>"$T/err"; then pass
else fail "a 255-byte output name: $(cat "$T/err")"; fi
rm -f "$long"
[ -z "$(find . -name '*.tmp.*')" ] && pass || fail "temporary files left: $(find . -name '*.tmp.*')"

# ---- no input hangs or exhausts the machine ----------------------------------------------------
mkfifo in.fifo
expect "--q a FIFO" 1 "FIFO" $P attn --q in.fifo --k k.npy --v v.npy --out o.npy
expect "--key-lengths a FIFO" 1 "FIFO" $P $A --out o.npy --key-lengths in.fifo
expect "--w /dev/zero" 1 "device" $P $A --out o.npy --w /dev/zero
expect "--data a FIFO" 1 "FIFO" $P train --out "$W/run1" --data in.fifo --steps 1 --no-plot
[ -e "$W/run1" ] && fail "train on a FIFO left its --out folder" || pass
expect "--data /dev/zero" 1 "device" $P train --out "$W/run2" --data /dev/zero --steps 1 --no-plot
[ -e "$W/run2" ] && fail "train on /dev/zero left its --out folder" || pass
expect "--checkpoint a FIFO" 1 "FIFO" $P sample --checkpoint in.fifo --tokens 1
# gzip: data after the last member
$PY - <<'EOF'
import gzip
text = ("In the beginning was a small corpus of words, line after line.\n" * 300).encode()
with open("corpus.txt.gz", "wb") as f:
    f.write(gzip.compress(text) + b"tail that is not gzip")
with open("two.txt.gz", "wb") as f:
    f.write(gzip.compress(text) + gzip.compress(text))
with open("binary.txt", "wb") as f:
    f.write(b"\0" * 100)
EOF
TINY="--layers 1 --d-model 16 --heads 2 --context 16 --batch 2 --eval-batches 1 --no-plot"
expect "gzip with trailing data" 1 "after the end of the gzip data" \
    $P train --out "$W/run3" --data corpus.txt.gz $TINY --steps 1
[ -e "$W/run3" ] && fail "train on bad gzip left its --out folder" || pass
expect "train on binary data" 1 "NUL byte" $P train --out "$W/run4" --data binary.txt $TINY --steps 1
[ -e "$W/run4" ] && fail "train on binary data left its --out folder" || pass
# gzip members in a row are one stream, as gzip reads them
if timeout 60 $P train --out "$T/two" --data two.txt.gz $TINY --steps 2 --eval-every 2 \
    >/dev/null 2>"$T/err"; then pass; else fail "two gzip members: $(cat "$T/err")"; fi

# ---- resumed runs validate every setting they read ---------------------------------------------
R="$T/resume"
if timeout 120 $P train --out "$R" --data two.txt.gz $TINY --steps 4 --eval-every 2 \
    --stop-after 2 >/dev/null 2>"$T/err"; then pass; else fail "train for resume: $(cat "$T/err")"; fi
cp "$R/checkpoint.safetensors" "$T/good.safetensors"
# edit KEY VALUE: the run's checkpoint with one metadata value replaced (or removed if VALUE is -)
edit() {
    $PY - "$T/good.safetensors" "$R/checkpoint.safetensors" "$1" "$2" <<'EOF'
import json, struct, sys
src, dst, key, value = sys.argv[1:]
b = open(src, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
if value == "-":
    del h["__metadata__"][key]
else:
    h["__metadata__"][key] = value
hb = json.dumps(h).encode()
open(dst, "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
EOF
}
for kv in "run.eval_every 0" "run.checkpoint_every 0" "run.eval_batches 0" \
          "run.val_fraction 5" "run.val_fraction nan" "run.steps -3" "run.batch 2000000" \
          "run.lr 0" "run.lr_min 20" "run.clip x" "run.warmup 1.5" "run.format 7" \
          "run.elapsed -1" "run.tokens -5" "run.data_hash zz" "run.eval_every -" \
          "pf.context 0" "pf.layers 1025" "pf.heads 3" "pf.features 70000" "pf.redraw -1" \
          "pf.step -2" "pf.d_model 1e3"; do
    set -- $kv
    edit "$1" "$2"
    expect "resume with $1 = $2" 1 "$1" $P train --out "$R" --resume
done
cp "$T/good.safetensors" "$R/checkpoint.safetensors"
edit run.lr_min 0.5
expect "resume with lr_min > lr" 1 "run.lr_min" $P train --out "$R" --resume
cp "$T/good.safetensors" "$R/checkpoint.safetensors"
if timeout 120 $P train --out "$R" --resume >/dev/null 2>"$T/err"; then pass
else fail "resume of the good checkpoint: $(cat "$T/err")"; fi

# ---- sample: bytes that are not printable are escaped on a terminal (or when asked) ----------
prompt=$(printf 'ab\001c\303\251\033[2J')
$P sample --checkpoint "$R/checkpoint.safetensors" --prompt "$prompt" --tokens 0 --escape yes \
    >"$T/esc" 2>/dev/null
[ "$(cat "$T/esc")" = 'ab\x01c\xc3\xa9\x1b[2J' ] && pass || fail "--escape yes: $(od -c "$T/esc")"
$P sample --checkpoint "$R/checkpoint.safetensors" --prompt "$prompt" --tokens 0 >"$T/raw" 2>/dev/null
[ "$(cat "$T/raw")" = "$prompt" ] && pass || fail "--escape auto on a pipe: $(od -c "$T/raw")"
if command -v script >/dev/null 2>&1; then
    script -qec "$P sample --checkpoint $R/checkpoint.safetensors --prompt '$prompt' --tokens 0" \
        /dev/null >"$T/tty" 2>&1 </dev/null
    grep -q 'ab\\x01c\\xc3\\xa9\\x1b\[2J' "$T/tty" && pass || fail "--escape auto on a terminal: $(od -c "$T/tty" | head)"
fi
expect "--escape maybe" 2 "unknown value 'maybe'" $P sample --checkpoint "$R/checkpoint.safetensors" \
    --escape maybe

# ---- the second adversarial pass ---------------------------------------------------------------
# train's input is never one of its outputs
mkdir -p "$W/run5"
cp "$W/two.txt.gz" "$W/run5/log.csv"
expect "--data is the run's log.csv" 2 "also an output" $P train --out "$W/run5" \
    --data "$W/run5/log.csv" $TINY --steps 1
# a run that fails after the model is made keeps an existing log.csv (it is cut back only when
# the first row is ready): a memory limit makes the activations fail
printf 'step,lr\n1,2\n' >"$W/run5/log.csv"
# (AddressSanitizer reserves terabytes of address space, which a ulimit -v forbids: not there)
if ! nm "$P" 2>/dev/null | grep -q __asan_init; then
    expect "train out of memory keeps log.csv" 1 "memory" sh -c \
        "ulimit -v 600000; exec $P train --out $W/run5 --data $W/two.txt.gz --layers 1 \
         --d-model 64 --heads 2 --context 256 --batch 4096 --eval-batches 1 --steps 1 --no-plot"
fi
# the log's write errors are errors (a file size limit stands in for a full disk)
(
    ulimit -f 8
    trap '' XFSZ
    exec "$P" train --out "$T/fz" --data "$W/two.txt.gz" --layers 1 --d-model 2 --heads 1 \
        --context 2 --batch 1 --eval-batches 1 --steps 400 --eval-every 400 --no-plot
) >/dev/null 2>"$T/err"
rc=$?
if [ $rc -eq 1 ] && grep -q "write error" "$T/err"; then pass
else fail "log write error: exit $rc: $(tail -n 2 "$T/err")"; fi
# closed standard streams: messages never land in the files the run opens
(exec >&-; "$P" train --out "$T/closed" --data "$W/two.txt.gz" $TINY --steps 1 --eval-every 1) \
    2>/dev/null
if [ -f "$T/closed/log.csv" ] && ! grep -q "data:\|model:" "$T/closed/log.csv"; then pass
else fail "train with stdout closed: $(head -n 3 "$T/closed/log.csv" 2>&1)"; fi
# stdout that cannot be written is a failure, not success
if [ -w /dev/full ]; then
    "$P" sample --checkpoint "$T/good.safetensors" --tokens 50 >/dev/full 2>"$T/err"
    rc=$?
    if [ $rc -eq 1 ] && grep -q "standard output" "$T/err"; then pass
    else fail "sample >/dev/full: exit $rc: $(cat "$T/err")"; fi
    "$P" attn --help >/dev/full 2>/dev/null && fail "attn --help >/dev/full: exit 0" || pass
fi
# one run at a time in a folder; only the library's own temporary names count as stale
mkdir -p "$W/run6"
echo "mine" >"$W/run6/log.csv.tmp.mine"
"$P" train --out "$W/run6" --data "$W/two.txt.gz" --layers 1 --d-model 16 --heads 2 \
    --context 16 --batch 2 --eval-batches 1 --steps 100000 --eval-every 100000 --no-plot \
    >/dev/null 2>&1 &
bg=$!
i=0
while [ $i -lt 100 ] && [ ! -s "$W/run6/log.csv" ]; do sleep 0.1; i=$((i + 1)); done
snapshot "$T/b6"
timeout 20 "$P" train --out "$W/run6" --data "$W/two.txt.gz" $TINY --steps 1 2>"$T/err" >/dev/null
rc=$?
if [ $rc -eq 1 ] && grep -q "another" "$T/err"; then pass
else fail "a second train in the same folder: exit $rc: $(cat "$T/err")"; fi
kill -TERM $bg 2>/dev/null
wait $bg 2>/dev/null
[ -f "$W/run6/log.csv.tmp.mine" ] && pass || fail "train removed a user's log.csv.tmp.mine"
rm -rf "$W/run6"
# resuming a finished run reports where it stands, not NaN
"$P" train --out "$R" --resume >"$T/fin" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "validation loss [0-9]" "$T/fin" && ! grep -qi "nan" "$T/fin"; then
    pass
else fail "resume of a finished run: exit $rc: $(cat "$T/fin")"; fi
cp "$T/good.safetensors" "$R/checkpoint.safetensors"
# counters and moments from a checkpoint are range-checked too
for kv in "run.tokens 9223372036854775807" "run.elapsed 1e308" "pf.step 100" \
          "pf.rho_count 9223372036854775807"; do
    set -- $kv
    edit "$1" "$2"
    expect "resume with $1 = $2" 1 "$1" "$P" train --out "$R" --resume
done
$PY -c '
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
off = 8 + n + h["adamw.v.wte"]["data_offsets"][0]
b[off:off + 4] = struct.pack("<f", -1.0)
open(sys.argv[2], "wb").write(bytes(b))
' "$T/good.safetensors" "$R/checkpoint.safetensors"
expect "resume with a negative second moment" 1 "negative" "$P" train --out "$R" --resume
cp "$T/good.safetensors" "$R/checkpoint.safetensors"
# a large file that is not a checkpoint is refused from its first bytes, not read whole
truncate -s 3G "$T/sparse.safetensors"
expect "a 3 GB non-checkpoint" 1 "header length 0" "$P" sample --checkpoint "$T/sparse.safetensors"
rm -f "$T/sparse.safetensors"
# flags that do not apply, flags given twice, values that are not numbers as written
expect "train exact --kernel" 2 "exact attention does not use it" "$P" train --out "$T/x" \
    --kernel trig
expect "train exact --features" 2 "exact attention does not use it" "$P" train --out "$T/x" \
    --features 8
expect "train favor++ --kernel" 2 "favor++ has its own" "$P" train --out "$T/x" \
    --attention favor++ --kernel trig
expect "train bible --format" 2 "--format is for --data FILE" "$P" train --out "$T/x" \
    --data bible --format fasta
expect "attn --chunk without --causal" 2 "for --causal only" $P $A --out o.npy --chunk 16
expect "attn --w with --features" 2 "with --w, W is given" $P $A --out o.npy --w "$W/k.npy" \
    --features 9
expect "sample --temperature 0 --top-k" 2 "does not apply with --temperature 0" "$P" sample \
    --checkpoint "$T/good.safetensors" --temperature 0 --top-k 5
expect "demo --quick --max-len" 2 "one or the other" "$P" demo --quick --max-len 600
expect "--out given twice" 2 "--out is given twice" $P $A --out o1.npy --out o2.npy
expect "--causal given twice" 2 "--causal is given twice" $P $A --out o.npy --causal --causal
expect "--scale with a newline" 2 "--scale" $P $A --out o.npy --scale "$(printf '\n1')"
expect "--scale in hex" 2 "--scale" $P $A --out o.npy --scale 0x10
expect "--features above 2^20" 2 "at most" $P $A --out o.npy --features 2000000
expect "--version with an argument" 2 "takes no arguments" "$P" --version extra
expect "help with two names" 2 "help takes one" "$P" help attn extra
# a flag's value may be -h: it is a value, not a request for help
"$P" sample --checkpoint "$T/good.safetensors" --prompt -h --tokens 0 >"$T/h" 2>/dev/null
[ "$(cat "$T/h")" = "-h" ] && pass || fail "--prompt -h: $(head -c 80 "$T/h")"
# approx: a CSV and its plot are replaced together; a plot that fails keeps the earlier pair
"$P" approx norms --quick --draws 3 --no-plot --out "$W/apx" >/dev/null 2>&1
mkdir -p "$T/badplot"
printf 'import sys\nsys.exit(1)\n' >"$T/badplot/plot_approx.py"
expect "approx with a failing plot" 1 "drawing" env PERFORMER_SCRIPTS="$T/badplot" "$P" approx \
    norms --quick --draws 3 --out "$W/apx"
ln -s "$W/precious.txt" "$W/apx/norms.png"
if "$P" approx norms --quick --draws 3 --no-plot --out "$W/apx" >/dev/null 2>"$T/err"; then pass
else fail "approx --no-plot with a link where no plot is written: $(cat "$T/err")"; fi
expect "approx plot over a link" 1 "symbolic link" "$P" approx norms --quick --draws 3 \
    --out "$W/apx"
rm -rf "$W/apx"
# a dangling symbolic link as train's folder
ln -s "$T/nowhere" "$W/dangling-dir"
expect "train --out a dangling link" 1 "symbolic link to nothing" "$P" train \
    --out "$W/dangling-dir" --data "$W/two.txt.gz" $TINY --steps 1
rm "$W/dangling-dir"

# ---- flags that do not apply are errors --------------------------------------------------------
for f in "--kernel trig" "--features 64" "--eps 0.1" "--chunk 16" "--proj iid" "--norm qmc" \
         "--seed 3" "--save-w w.npy" "--w q.npy" "--samples 4" "--proposals 2" "--deterministic"; do
    # shellcheck disable=SC2086
    expect "exact with $f" 2 "does not use it" $P $A --out o.npy --method exact $f
done
for f in "--kernel trig" "--features 64" "--eps 0.1" "--chunk 16" "--proj iid" "--norm qmc"; do
    # shellcheck disable=SC2086
    expect "ra with $f" 2 "does not use it" $P $A --out o.npy --method ra $f
done
expect "favor with --samples" 2 "does not use it" $P $A --out o.npy --samples 3
expect "--kernel=trig with exact" 2 "--kernel is for --method favor" $P $A --out o.npy \
    --method exact --kernel=trig
expect "--threads 100000" 2 "--threads" $P $A --out o.npy --threads 100000
expect "train --threads 100000" 2 "--threads" $P train --out "$T/x" --threads 100000
[ -e "$T/x" ] && fail "a usage error made train's folder" || pass

finish
