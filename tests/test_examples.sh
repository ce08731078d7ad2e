#!/bin/sh
# test_examples.sh: the programs in examples/, as `make` built them into BUILD/examples/, run as
# a user would run them.
#
#   PERFORMER=build/performer BUILD=build sh tests/test_examples.sh
#
# stream_generate (a checkpoint, a prompt prefilled into one decoder per sequence, bytes drawn
# for several sequences side by side):
# - on a tiny FAVOR+ model with rotary positions, trained here for 3 steps: exit 0, nothing on
#   stderr, one line per sequence, each with its number and seed, the prompt echoed, then
#   exactly TOKENS bytes (escapes decoded), past the model's context of 32 bytes (FAVOR+ decodes
#   in constant memory); the same arguments give the same output; a sequence's bytes depend on
#   its seed alone (sequence 1 of seed 7 = sequence 0 of seed 8, whatever runs beside it); two
#   seeds give two texts; TOKENS 0 echoes the prompt;
# - on the committed demo model (exact attention, learned positions, context 256): text that is
#   mostly letters and spaces; a prompt and TOKENS that fill the context exactly run, one byte
#   more is refused (exit 2, a message naming the context);
# - a missing checkpoint and a file that is not one: exit 1, the reason on stderr, nothing on
#   stdout; bad arguments (too few or many, an empty prompt, TOKENS, SEQUENCES or SEED out of
#   range or not numbers): exit 2 with the usage.
# No `set -e`: every check runs, failures are counted, exit 1 if any.

TEST=test_examples; . "$(dirname "$0")/lib.sh"

BUILD=${BUILD:-build}
case "$BUILD" in /*) ;; *) BUILD="$(pwd)/$BUILD" ;; esac
E=$BUILD/examples/stream_generate
DEMO=$(pwd)/data/demo-kjv.safetensors
if [ ! -x "$E" ]; then fail "no $E (make builds it)"; finish; exit 1; fi

# run NAME ARGS...: the example's stdout in $T/NAME.out, stderr in $T/NAME.err, status in rc
run() {
    name=$1; shift
    "$E" "$@" >"$T/$name.out" 2>"$T/$name.err"
    rc=$?
}
# ok NAME: it exited 0 and said nothing on stderr
ok() {
    if [ "$rc" -eq 0 ] && [ ! -s "$T/$1.err" ]; then pass; else
        fail "$1: exit $rc: $(cat "$T/$1.err")"; fi
}
# refused NAME STATUS KEYWORD: it exited STATUS, said KEYWORD on stderr and nothing on stdout
refused() {
    if [ "$rc" -ne "$2" ]; then fail "$1: exit $rc, expected $2: $(cat "$T/$1.err")"
    elif ! grep -q -- "$3" "$T/$1.err"; then fail "$1: stderr lacks '$3': $(cat "$T/$1.err")"
    elif [ -s "$T/$1.out" ]; then fail "$1: wrote to stdout: $(cat "$T/$1.out")"
    else pass; fi
}
# lines NAME PROMPT TOKENS SEQUENCES SEED: the output has one line per sequence, "sequence S
# (seed SEED+S): " then the prompt and TOKENS bytes (\xNN is one byte)
lines() {
    if $PY - "$T/$1.out" "$2" "$3" "$4" "$5" <<'EOF'; then pass; else fail "$1: the lines"; fi
import re, sys
path, prompt, tokens, count, seed = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
got = open(path).read().split("\n")
assert got[-1] == "", "no newline at the end"
got = got[:-1]
assert len(got) == count, f"{len(got)} lines, expected {count}"
for s, line in enumerate(got):
    head = f"sequence {s} (seed {seed + s}): {prompt}"
    assert line.startswith(head), f"line {s}: {line!r} does not start {head!r}"
    n = len(re.findall(r"\\x[0-9a-f]{2}|[ -~]", line[len(head):]))
    assert n == tokens, f"line {s}: {n} bytes after the prompt, expected {tokens}: {line!r}"
    assert "\\" not in re.sub(r"\\x[0-9a-f]{2}", "", line), f"line {s}: a bare backslash"
EOF
}

# ---- a tiny FAVOR+ model, on the demo's validation text ------------------------------------------
"$P" train --out "$T/favor" --data data/demo-kjv-val.txt --layers 1 --d-model 16 --heads 2 \
    --context 32 --batch 4 --eval-batches 1 --steps 3 --eval-every 3 --no-plot \
    --attention favor --features 16 --positions rotary >"$T/train.log" 2>&1 ||
    fail "training the tiny model: $(tail -n 3 "$T/train.log")"
CK=$T/favor/checkpoint.safetensors

run a "$CK" "alpha beta" 40 3 7
ok a
lines a "alpha beta" 40 3 7
run b "$CK" "alpha beta" 40 3 7
if cmp -s "$T/a.out" "$T/b.out"; then pass; else fail "the same arguments gave another output"; fi
run c "$CK" "alpha beta" 40 2 8
ok c
lines c "alpha beta" 40 2 8
# each sequence is its own decoder and generator: its bytes are its seed's, whoever runs beside it
a1=$(sed -n '2s/^sequence 1 (seed 8): //p' "$T/a.out")
c0=$(sed -n '1s/^sequence 0 (seed 8): //p' "$T/c.out")
if [ -n "$a1" ] && [ "$a1" = "$c0" ]; then pass; else
    fail "seed 8 as sequence 1 of 3 and as sequence 0 of 2: '$a1' and '$c0'"; fi
# After 3 steps the model is close to its initial weights, whose logits are nearly equal: each
# byte is drawn from about 40 (top-k) at similar odds, so two seeds' 40 bytes agree with a
# probability of the order of 40^-40.
a0=$(sed -n '1s/^sequence 0 (seed 7): //p' "$T/a.out")
if [ -n "$a0" ] && [ "$a0" != "$a1" ]; then pass; else fail "seeds 7 and 8 gave '$a0', '$a1'"; fi
run z "$CK" "alpha beta" 0 2
ok z
same=$(printf 'sequence 0 (seed 1): alpha beta\nsequence 1 (seed 2): alpha beta')
if [ "$(cat "$T/z.out")" = "$same" ]; then pass; else fail "TOKENS 0: $(cat "$T/z.out")"; fi

# ---- the demo model: exact attention, learned positions, context 256 -----------------------------
if [ -f "$DEMO" ]; then
    run d "$DEMO" "In the beginning" 24 2 1
    ok d
    lines d "In the beginning" 24 2 1
    # a trained English model (data/demo-kjv.md: next-byte accuracy 0.49): with a fixed seed,
    # its 48 bytes are mostly letters and spaces (random bytes would be about 21% so)
    check_text=$(sed 's/^sequence [0-9] (seed [0-9]*): In the beginning//' "$T/d.out" |
        tr -d '\n' | tr -cd 'A-Za-z ' | wc -c)
    if [ "$check_text" -ge 36 ]; then pass; else
        fail "the demo model wrote $check_text letters and spaces of 48: $(cat "$T/d.out")"; fi
    long=$(printf '%0250d' 0)
    run full "$DEMO" "$long" 6 1
    ok full
    lines full "$long" 6 1 1
    run over "$DEMO" "$long" 7 1
    refused over 2 "context of 256 bytes"
else
    fail "no $DEMO"
fi

# ---- what is refused ----------------------------------------------------------------------------
run missing "$T/nothere.safetensors" "alpha"
refused missing 1 "nothere.safetensors"
run notone data/demo-kjv-val.txt "alpha"
refused notone 1 "cannot load the model"
run none
refused none 2 "usage: stream_generate CHECKPOINT PROMPT"
run one "$CK"
refused one 2 "usage:"
run many "$CK" alpha 1 1 1 1
refused many 2 "usage:"
run empty "$CK" ""
refused empty 2 "PROMPT is empty"
for bad in abc -1 1048577 12x ""; do
    run tok "$CK" alpha "$bad"
    refused tok 2 "TOKENS '$bad'"
done
for bad in 0 1025 two; do
    run seqs "$CK" alpha 4 "$bad"
    refused seqs 2 "SEQUENCES '$bad'"
done
for bad in -1 9223372036854775808 s; do
    run seed "$CK" alpha 4 2 "$bad"
    refused seed 2 "SEED '$bad'"
done

finish
