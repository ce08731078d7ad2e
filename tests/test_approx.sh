#!/bin/sh
# test_approx.sh: end-to-end tests of `performer approx` (the estimator lab) at --quick sizes.
#
#   PERFORMER=build/performer BUILD=build sh tests/test_approx.sh
#
# - every experiment: the CSV has the documented header, one row per (panel, series, x) (the
#   counts below follow from the --quick sizes in tools/cmd_approx.c), the draws asked for, and
#   finite, non-negative statistics; a table on stdout and progress on stderr; no temporary files;
# - FAVOR++ / FAVOR# series: present, or reported as not in the library (then their rows are
#   absent); nothing else may be skipped;
# - the same CSV at 1 and 2 threads (the library's results do not depend on the thread count);
# - in every row, mse_q25 <= mse_median <= mse_q75, and the split of the mean MSE over the draws
#   is an identity: mse_mean = bias2 + variance to the CSV's rounding;
# - real, on a tiny checkpoint trained here: layer 1's error of answering 0 (the exact output's
#   mean square), |q'|^2 and |k'|^2, and its iid-projection prediction against numpy in float64,
#   from the safetensors file (independent of the library); its refusals (a bad checkpoint, a
#   short text, --checkpoint without real);
# - one plot: a PNG is written (when /usr/bin/python3 has matplotlib); without the plotting
#   script the tool says so and still writes the CSV, exit 0;
# - bad experiment names and flags: a clear message, exit 2, and no output folder or file;
# - the first screen: `--all` prints first a panel where the estimators work (sigma = 0.5), says
#   what the "answer 0" column is before it, labels every sigma >= 1 panel (and row) as the hard
#   case, keeps the CSV's rows in the experiment's order, and leaves the other files in the
#   output folder as they were.
# No `set -e`: every check runs, failures are counted, exit 1 if any.

TEST=test_approx; . "$(dirname "$0")/lib.sh"


HEADER="panel,series,xvar,x,draws,failed,mse_mean,mse_std,mse_median,zero_mse,mse_q25,mse_q75"
HEADER="$HEADER,bias2,variance"

# csv_ok FILE ROWS DRAWS: header, row count, draws column, finite non-negative numbers
csv_ok() {
    f=$1; rows=$2; draws=$3
    if [ ! -f "$f" ]; then fail "$f: missing"; return; fi
    h=$(head -n 1 "$f")
    [ "$h" = "$HEADER" ] && pass || fail "$f: header '$h'"
    n=$(($(wc -l <"$f") - 1))
    [ "$n" -eq "$rows" ] && pass || fail "$f: $n rows, expected $rows"
    # bias2 and variance are nan only for the kernel values and the closed forms
    bad=$(awk -F, -v D="$draws" 'function num(x) { return x ~ /^[0-9.]+(e[-+][0-9]+)?$/ }
        NR > 1 {
            if (NF != 14 || $5 != D || $6 != 0) { print NR ": " $0; next }
            for (i = 7; i <= 12; i++) if (!num($i)) { print NR ": " $0; next }
            if ($4 !~ /^[0-9.]+$/) { print NR ": " $0; next }
            if (!(num($13) && num($14)) && !($13 == "nan" && $14 == "nan" &&
                (FILENAME ~ /kernel.csv$/ || $2 ~ /theory|prediction/))) print NR ": " $0
        }' "$f" | head -n 3)
    [ -z "$bad" ] && pass || fail "$f: bad rows (want $draws draws, none failed, finite): $bad"
    # quartiles in order; mean MSE = squared bias + variance (each printed to 8 digits)
    bad=$(awk -F, 'NR > 1 {
            if ($11 > $9 * (1 + 1e-7) || $9 > $12 * (1 + 1e-7)) { print NR ": quartiles " $0; next }
            if ($13 == "nan") next
            e = $7 - ($13 + $14); if (e < 0) e = -e
            if (e > 2e-7 * $7 + 1e-300) print NR ": " $7 " != " $13 " + " $14
        }' "$f" | head -n 3)
    [ -z "$bad" ] && pass || fail "$f: $bad"
}

# ---- every experiment, --quick --no-plot --------------------------------------------------
# name:rows (without FAVOR++ / FAVOR#):FAVOR++ rows (with its closed form):FAVOR# rows
for spec in ortho:36:0:0 maps:12:4:4 kernel:16:8:4 norms:18:0:0 estimators:20:4:0 \
            length:18:0:0; do
    name=${spec%%:*}; rest=${spec#*:}
    rows=${rest%%:*}; rest=${rest#*:}
    opp=${rest%%:*}; sharp=${rest#*:}
    out="$T/$name"
    "$P" approx --quick --no-plot --out "$out" "$name" >"$T/stdout" 2>"$T/stderr"; rc=$?
    if [ $rc -ne 0 ]; then
        fail "approx --quick $name: exit $rc: $(tail -n 3 "$T/stderr")"
        continue
    fi
    # a series may only be skipped if it is FAVOR++ or FAVOR# and the tool says so
    if grep -q "FAVOR++ is not in this library yet" "$T/stderr"; then opp=0; fi
    if grep -q "FAVOR# is not in this library yet" "$T/stderr"; then sharp=0; fi
    if grep "not in this library yet" "$T/stderr" | grep -v -q -e "FAVOR++" -e "FAVOR#"; then
        fail "$name: an unexpected series was skipped: $(cat "$T/stderr")"
    fi
    csv_ok "$out/$name.csv" $((rows + opp + sharp)) 3
    if [ "$opp" -gt 0 ]; then
        grep -q ",FAVOR++," "$out/$name.csv" && pass || fail "$name: no FAVOR++ rows"
    fi
    if [ "$sharp" -gt 0 ]; then
        grep -q ",FAVOR#," "$out/$name.csv" && pass || fail "$name: no FAVOR# rows"
    fi
    grep -q "MSE .*, mean over 3 draws" "$T/stdout" && pass || fail "$name: no table"
    grep -q "approx $name: \[" "$T/stderr" && pass || fail "$name: no progress on stderr"
    [ ! -e "$out/$name.png" ] && pass || fail "$name: --no-plot drew a plot"
    left=$(find "$out" -name '*.tmp.*')
    [ -z "$left" ] && pass || fail "$name: temporary files left: $left"
done

# --draws, and the thread count changes nothing
"$P" approx --quick --no-plot --draws 4 --threads 1 --out "$T/t1" norms >/dev/null 2>&1
"$P" approx --quick --no-plot --draws 4 --threads 2 --out "$T/t2" norms >/dev/null 2>&1
csv_ok "$T/t1/norms.csv" 18 4
if cmp -s "$T/t1/norms.csv" "$T/t2/norms.csv"; then pass
else fail "norms: different CSV at 1 and 2 threads"; fi

# ---- plots ----------------------------------------------------------------------------------
if $PY -c 'import matplotlib, numpy' 2>/dev/null; then
    "$P" approx --quick --out "$T/plot" length >/dev/null 2>"$T/stderr"; rc=$?
    if [ $rc -ne 0 ]; then fail "plot: exit $rc: $(tail -n 3 "$T/stderr")"
    elif [ ! -s "$T/plot/length.png" ]; then fail "plot: no length.png"
    elif [ "$(head -c 4 "$T/plot/length.png" | od -An -c | tr -d ' ')" != "211PNG" ]; then
        fail "plot: length.png is not a PNG"
    else pass; fi
    left=$(find "$T/plot" -name '*.tmp.*')
    [ -z "$left" ] && pass || fail "plot: temporary files left: $left"
else
    echo "NOTE: $PY has no matplotlib: the plot is not checked"
fi
# Without the script (a copy of the tool where no scripts/ folder is near): a note, the CSV,
# exit 0.
mkdir -p "$T/alone/bin" "$T/alone/run"
cp "$P" "$T/alone/bin/performer"
(cd "$T/alone/run" && PERFORMER_SCRIPTS= "$T/alone/bin/performer" approx --quick --out o length \
    >/dev/null 2>"$T/stderr"); rc=$?
if [ $rc -ne 0 ]; then fail "no script: exit $rc"
elif ! grep -q "plot_approx.py not found" "$T/stderr"; then fail "no script: $(cat "$T/stderr")"
else csv_ok "$T/alone/run/o/length.csv" 18 3; fi

# ---- the first screen: where the estimators work first, the hard case labelled ----------------
mkdir -p "$T/first/sub"
printf 'kept\n' >"$T/first/notes.txt"
printf 'an earlier plot\n' >"$T/first/ortho.png"
printf 'nested\n' >"$T/first/sub/x.csv"
cp -R "$T/first" "$T/first.before"
"$P" approx --all --quick --no-plot --out "$T/first" >"$T/stdout" 2>"$T/stderr"; rc=$?
[ $rc -eq 0 ] && pass || fail "first screen: exit $rc: $(tail -n 3 "$T/stderr")"
# the first table: its title, what "answer 0" is, then the sigma = 0.5 panel
first=$(grep -m 1 -n '^  [A-Za-z]' "$T/stdout")
case $first in
    *"  L=128 sigma=0.5") pass ;;
    *) fail "first screen: the first panel is '$first', expected L=128 sigma=0.5" ;;
esac
zero=$(grep -m 1 -n '^answer 0: the MSE of answering 0' "$T/stdout" | cut -d: -f1)
[ -n "$zero" ] && [ "$zero" -lt "${first%%:*}" ] && pass ||
    fail "first screen: no explanation of 'answer 0' before the first panel: $(head -n 5 "$T/stdout")"
grep -q '^ortho: ' "$T/stdout" && [ "$(grep -m 1 -v '^$' "$T/stdout")" = \
    "$(grep -m 1 '^ortho: ' "$T/stdout")" ] && pass || fail "first screen: ortho is not first"
# every panel of inputs with sigma >= 1 is labelled the hard case, no other one is
bad=$(grep -E '^  (L=[0-9]+ )?sigma=(1|1\.5)( |$)' "$T/stdout" |
    grep -v '  (hard case: sigma >= 1, ')
[ -z "$bad" ] && pass || fail "first screen: sigma >= 1 panels not labelled the hard case: $bad"
grep -E '^  (L=[0-9]+ )?sigma=0\.5' "$T/stdout" | grep -q 'hard case' &&
    fail "first screen: a sigma = 0.5 panel labelled the hard case" || pass
grep -q '^  unstructured  (hard case: ' "$T/stdout" && pass ||
    fail "first screen: estimators' unstructured panel (sigma = 1.12) not labelled"
n=$(grep -c '^  -- from here on sigma >= 1, the hard case' "$T/stdout")
[ "$n" -eq 4 ] && pass || fail "first screen: $n hard-case lines in maps and kernel, expected 4"
# in the tables the hard panels come last; in the CSV the rows keep the experiment's order
order=$(grep -E '^  (L=[0-9]+ )?sigma=' "$T/stdout" | sed -n '1,3p' | sed 's/  (hard.*//' | tr -d ' ' |
    paste -sd, -)
[ "$order" = "L=128sigma=0.5,L=128sigma=1,L=256sigma=1" ] && pass ||
    fail "first screen: ortho's panels in the order $order"
[ "$(sed -n '2p' "$T/first/ortho.csv" | cut -d, -f1)" = "L=128 sigma=1" ] && pass ||
    fail "first screen: ortho.csv's rows were reordered: $(sed -n '2p' "$T/first/ortho.csv")"
for f in notes.txt ortho.png sub/x.csv; do
    cmp -s "$T/first/$f" "$T/first.before/$f" && pass || fail "first screen: $f changed"
done
new=$(cd "$T/first" && find . -type f | sort | grep -v -x -e ./notes.txt -e ./ortho.png \
    -e ./sub/x.csv | paste -sd' ' -)
[ "$new" = "./estimators.csv ./kernel.csv ./length.csv ./maps.csv ./norms.csv ./ortho.csv" ] &&
    pass || fail "first screen: files written: $new"

# ---- refusals: exit 2, a clear message, nothing created ---------------------------------------
refuse() { # refuse "what" want-exit keyword args...
    what=$1; want=$2; key=$3; shift 3
    rm -rf "$T/bad"
    "$P" approx --out "$T/bad" "$@" >/dev/null 2>"$T/err"; rc=$?
    if [ $rc -ne "$want" ]; then fail "$what: exit $rc, expected $want: $(cat "$T/err")"
    elif ! grep -q -- "$key" "$T/err"; then fail "$what: message lacks '$key': $(cat "$T/err")"
    elif [ -e "$T/bad" ]; then fail "$what: the output folder was created"
    else pass; fi
}
refuse "unknown experiment" 2 "unknown experiment 'bogus'" --quick bogus
refuse "unknown after a good one" 2 "unknown experiment 'ortho2'" --quick ortho ortho2
refuse "no experiment" 2 "name an experiment or give --all" --quick
refuse "--all and a name" 2 "not both" --quick --all maps
refuse "unknown flag" 2 "unknown option '--fast'" --quick --fast ortho
refuse "--draws 1" 2 "--draws: expected an integer from 2" --quick --draws 1 ortho
refuse "--draws x" 2 "--draws" --quick --draws x ortho
refuse "--draws missing" 2 "missing value" --quick ortho --draws
refuse "--threads -1" 2 "--threads" --quick --threads -1 ortho
refuse "--quick=1" 2 "takes no value" --quick=1 ortho
# folders: a missing parent, a file in the way (exit 1)
"$P" approx --quick --no-plot --out "$T/no/such" length >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q "cannot create" "$T/err" && [ ! -e "$T/no" ] && pass ||
    fail "missing parent: exit $rc: $(cat "$T/err")"
: >"$T/afile"
"$P" approx --quick --no-plot --out "$T/afile" length >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q "not a folder" "$T/err" && pass ||
    fail "file as --out: exit $rc: $(cat "$T/err")"

# ---- real: a tiny model trained here, against numpy ---------------------------------------------
mkdir -p "$T/tiny"
$PY -c "
import random
r = random.Random(1)
w = 'the lord said unto moses and he went up into the mountain of god'.split()
open('$T/tiny/t.txt', 'w').write('\n\n'.join(' '.join(r.choice(w) for _ in range(60))
                                             for _ in range(40)))
"
"$P" train --out "$T/tiny/ck" --data "$T/tiny/t.txt" --layers 2 --d-model 32 --heads 2 \
    --context 48 --steps 3 --batch 2 --eval-every 3 --eval-batches 1 --no-plot --threads 1 \
    >/dev/null 2>"$T/stderr" ||
    fail "real: training the tiny model failed: $(tail -n 3 "$T/stderr")"
CK="$T/tiny/ck/checkpoint.safetensors"
"$P" approx real --quick --no-plot --checkpoint "$CK" --text "$T/tiny/t.txt" --out "$T/real" \
    >"$T/stdout" 2>"$T/stderr"; rc=$?
if [ $rc -ne 0 ]; then
    fail "approx real: exit $rc: $(tail -n 3 "$T/stderr")"
else
    # 2 layers x (6 series x 2 m + the iid prediction at 2 m)
    csv_ok "$T/real/real.csv" 28 3
    if $PY -c 'import numpy' 2>/dev/null; then
        out=$($PY - "$CK" "$T/tiny/t.txt" "$T/real/real.csv" <<'PYEOF' 2>&1
import csv, json, struct, sys
import numpy as np
ck, txt, res = sys.argv[1:4]
with open(ck, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    head = json.loads(f.read(n))
    blob = f.read()
meta = head.pop("__metadata__")
t = {k: np.frombuffer(blob[v["data_offsets"][0]:v["data_offsets"][1]], "<f4").reshape(v["shape"])
     .astype(np.float64) for k, v in head.items()}
C, H, ctx = int(meta["pf.d_model"]), int(meta["pf.heads"]), int(meta["pf.context"])
hd = C // H
text = open(txt, "rb").read()
T = min(ctx, 64, len(text))          # --quick: one window of min(context, 64) bytes at the start
tok = np.frombuffer(text[:T], np.uint8)
def ln(x, w, b):
    m = x.mean(1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(1, keepdims=True) + 1e-5) * w + b
x = t["wte"][tok] + t["wpe"][:T]
mask = np.tril(np.ones((T, T), bool))
bad = []
# layer 1's inputs: layer norm (eps 1e-5) of the embeddings, then qkv = x W^T + b, heads split
qkv = ln(x, t["blocks.ln1.weight"][0], t["blocks.ln1.bias"][0]) @ t["blocks.attn.qkv.weight"][0].T \
    + t["blocks.attn.qkv.bias"][0]
q, k, v = (qkv[:, i * C:(i + 1) * C].reshape(T, H, hd).transpose(1, 0, 2) for i in range(3))
s = hd ** -0.5
S = np.where(mask, np.einsum("hid,hjd->hij", q, k) * s, -np.inf)
P = np.exp(S - S.max(2, keepdims=True))
P /= P.sum(2, keepdims=True)
O = P @ v
# the iid prediction, term by term: exp(|q'|^2 + 2 q'.k'_j + 2 q'.k'_l + k'_j.k'_l) a_j.a_l over
# the causal pairs, a_j = v_j - out_i, / D^2, averaged over the queries and entries (m = 1)
pred = 0.0
for h in range(H):
    G = k[h] @ k[h].T * s
    for i in range(T):
        A = v[h, :i + 1] - O[h, i]
        E = np.exp(q[h, i] @ q[h, i] * s + 2 * S[h, i, :i + 1, None] + 2 * S[h, i, None, :i + 1]
                   + G[:i + 1, :i + 1])
        pred += (E * (A @ A.T)).sum() / np.exp(S[h, i, :i + 1]).sum() ** 2
pred /= H * T * hd
rows = [r for r in csv.DictReader(open(res)) if r["panel"].startswith("layer 1:")]
zero, ms = float(rows[0]["zero_mse"]), (O ** 2).mean()
if abs(zero - ms) > 1e-4 * ms:
    bad.append(f"answer-0 MSE {zero}, numpy {ms}")
want = "layer 1: |q'|^2 %.1f |k'|^2 %.1f" % ((q ** 2).sum(2).mean() * s, (k ** 2).sum(2).mean() * s)
if rows[0]["panel"] != want:
    bad.append(f"panel '{rows[0]['panel']}', numpy says '{want}'")
preds = [r for r in rows if r["series"] == "iid prediction"]
if len(preds) != 2:
    bad.append(f"{len(preds)} iid prediction rows for layer 1")
for r in preds:
    p = pred / float(r["x"])
    if abs(float(r["mse_mean"]) - p) > 1e-3 * p:
        bad.append(f"m {r['x']}: prediction {r['mse_mean']}, numpy {p}")
print("\n".join(bad) if bad else "ok")
PYEOF
)
        [ "$out" = ok ] && pass || fail "real against numpy: $out"
    else
        echo "NOTE: $PY has no numpy: real is not checked against it"
    fi
fi
# refusals: --checkpoint without real (2), a file that is no checkpoint, a text too short (1)
refuse "--checkpoint without real" 2 "is for the real experiment" --quick --checkpoint "$CK" maps
printf 'not a model' >"$T/tiny/bad.safetensors"
"$P" approx real --quick --no-plot --checkpoint "$T/tiny/bad.safetensors" --text "$T/tiny/t.txt" \
    --out "$T/realbad" >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q -- "--checkpoint: " "$T/err" && [ ! -e "$T/realbad/real.csv" ] && pass ||
    fail "real, bad checkpoint: exit $rc: $(cat "$T/err")"
printf 'short' >"$T/tiny/short.txt"
"$P" approx real --quick --no-plot --checkpoint "$CK" --text "$T/tiny/short.txt" \
    --out "$T/realshort" >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 1 ] && grep -q "at least 16 are needed" "$T/err" && pass ||
    fail "real, short text: exit $rc: $(cat "$T/err")"

# ---- help -------------------------------------------------------------------------------------
"$P" approx --help >"$T/help" 2>&1; rc=$?
[ $rc -eq 0 ] && pass || fail "approx --help exit $rc"
for w in --all --out --draws --quick --threads --no-plot --checkpoint --text ortho maps kernel \
         norms estimators length real mse_mean mse_std zero_mse mse_q25 bias2 variance; do
    grep -q -- "$w" "$T/help" || fail "approx --help does not mention $w"
done
"$P" --help | grep -q "approx" && pass || fail "performer --help does not list approx"

finish
