#!/bin/sh
# test_tool.sh: end-to-end tests of the `performer` command, with numpy as the independent
# reference (float64 formulas written here, not taken from the library).
#
#   PERFORMER=build/performer BUILD=build sh tests/test_tool.sh
#
# - exact attention against numpy's softmax attention (bidirectional, causal, padded keys, rank
#   2/3/4, Lq != Lk, dv != d): relative error < 1e-5;
# - FAVOR+ with --save-w against the numpy FAVOR+ formula with that W (positive, hyperbolic,
#   relu; causal and not; one W per head): relative error < 1e-4; --w gives identical output;
# - gradients of sum(out * dO) against numpy's analytic gradient (exact attention) and central
#   finite differences of the float64 formula (FAVOR+: positive, relu, hyperbolic, causal);
# - RA and LARA (--method ra|lara): RA with 2000 samples within 10% (relative norm) of numpy's
#   exact attention, padded too (its error is O(1/sqrt(S)): ~4% measured at S = 2000); LARA with
#   epsilon = 0 and C = Lk proposals on well-separated keys (orthonormal directions of length 6,
#   queries within 0.1: exact attention is ~99.9% on the query's own key) within 1e-2 of exact,
#   and with C = 2 far from it; the same seed gives the same bits at 1 and 2 threads;
# - bad inputs: a clear message (keyword checked), a non-zero exit, and no output file;
# - --help mentions every flag; demo --quick prints a table, and then FAVOR+'s error on the
#   queries, keys and values of the trained model shipped in data/: one row per layer and one of
#   N(0,1) inputs of the same shape (labelled the hard case), every number finite, each layer's
#   mean error below the random inputs' at every m, its queries' and keys' effective rank far
#   below theirs (~60); a missing or bad --checkpoint or --text fails at once (exit 1, before
#   any timing), a performer with no data/ beside it leaves the part out with a note (exit 0);
# - demo's first screen: what err is (1.0 = answering 0) before any table, then the table at
#   sigma = 0.5 ("a setting where FAVOR+ works"), then the hard case, sigma = 1, labelled in its
#   caption, with larger errors on the same draws; --sigma 1 labels the one table the hard case;
#   no file is written or changed in the folder it runs in.
# No `set -e`: every check runs, failures are counted, exit 1 if any.
#
# PF_TOOL_ARCH names the tool's CPU where it is not this shell's (x86_64 checks of OpenBLAS's
# kernel sets are left out elsewhere); PF_TOOL_EMULATED=1 (tests/run_aarch64.sh, the aarch64
# tool under qemu-user) leaves out the demo's checks.

TEST=test_tool; . "$(dirname "$0")/lib.sh"
tool_arch=${PF_TOOL_ARCH:-$(uname -m)}
check() { # check "what" command...: the command must succeed
    what=$1; shift
    if "$@"; then pass; else fail "$what"; fi
}

if ! $PY -c 'import numpy' 2>/dev/null; then echo "FAIL: $PY has no numpy"; exit 1; fi

# ---- the numpy side ---------------------------------------------------------------------------
cat >"$T/ref.py" <<'EOF'
"""Fixtures and float64 references for test_tool.sh. Usage: ref.py <command> args..."""
import sys
import numpy as np

def load(path):
    return np.load(path)

def as4(x):
    """(L,d) -> (1,1,L,d); (H,L,d) -> (1,H,L,d)."""
    while x.ndim < 4:
        x = x[None]
    return x

def mask(B, Lq, Lk, causal, lens):
    """(B,1,Lq,Lk) boolean: may query i see key j."""
    m = np.ones((B, 1, Lq, Lk), bool)
    if causal:
        m &= np.tril(np.ones((Lq, Lk), bool))[None, None]
    if lens is not None:
        m &= (np.arange(Lk)[None, :] < lens[:, None])[:, None, None, :]
    return m

def exact(q, k, v, causal, lens, scale):
    """float64 softmax attention and the pieces the gradient needs."""
    d = q.shape[-1]
    s = scale if scale else 1 / np.sqrt(d)
    S = s * np.einsum('bhid,bhjd->bhij', q, k)
    M = mask(q.shape[0], q.shape[2], k.shape[2], causal, lens)
    S = np.where(M, S, -np.inf)
    P = np.exp(S - S.max(-1, keepdims=True))
    P /= P.sum(-1, keepdims=True)
    return P @ v, P, s

def features(x, W, kernel, s, eps):
    """phi(x) for x (B,H,L,d), W (H,m,d) already broadcast per head."""
    x = x * np.sqrt(s)
    m = W.shape[-2]
    u = np.einsum('bhld,hmd->bhlm', x, W)
    n2 = (x * x).sum(-1, keepdims=True) / 2
    if kernel == 'positive':
        f = np.exp(u - n2) / np.sqrt(m)
    elif kernel == 'hyperbolic':
        f = np.exp(-n2) / np.sqrt(2 * m) * np.concatenate([np.exp(u), np.exp(-u)], -1)
    elif kernel == 'relu':
        return np.maximum(u, 0) / np.sqrt(m) + eps
    else:
        raise SystemExit('unknown kernel ' + kernel)
    return f + eps * np.abs(f).max(-1, keepdims=True)

def favor(q, k, v, W, kernel, causal, lens, scale, eps):
    d = q.shape[-1]
    s = scale if scale else 1 / np.sqrt(d)
    if W.ndim == 2:
        W = np.broadcast_to(W, (q.shape[1],) + W.shape)
    fq = features(q, W, kernel, s, eps)
    fk = features(k, W, kernel, s, eps)
    A = np.einsum('bhir,bhjr->bhij', fq, fk)
    A = np.where(mask(q.shape[0], q.shape[2], k.shape[2], causal, lens), A, 0)
    return (A @ v) / A.sum(-1, keepdims=True)

def relerr(got, ref):
    return np.linalg.norm(got - ref) / np.linalg.norm(ref)

def opts(args):
    o = {'causal': False, 'lens': None, 'scale': 0.0, 'eps': 0.0, 'kernel': 'positive',
         'tol': 1e-5}
    i = 0
    while i < len(args):
        a = args[i]
        if a == '--causal':
            o['causal'] = True
        elif a == '--lens':
            i += 1; o['lens'] = np.load(args[i]).astype(np.int64).reshape(-1)
        elif a in ('--scale', '--eps', '--tol'):
            i += 1; o[a[2:]] = float(args[i])
        elif a == '--kernel':
            i += 1; o['kernel'] = args[i]
        else:
            raise SystemExit('ref.py: unknown option ' + a)
        i += 1
    return o

def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == 'make':          # make FILE dtype seed sigma dims...
        path, dt, seed, sigma = args[0], args[1], int(args[2]), float(args[3])
        shape = tuple(int(x) for x in args[4:])
        x = np.random.default_rng(seed).standard_normal(shape) * sigma
        np.save(path, x.astype(dt))
    elif cmd == 'lens':        # lens FILE dtype values...
        np.save(args[0], np.array([int(x) for x in args[2:]], dtype=args[1]))
    elif cmd == 'sep':         # sep PREFIX seed L d dv: keys length 6 on orthonormal directions
        prefix, seed, L, d, dv = args[0], int(args[1]), int(args[2]), int(args[3]), int(args[4])
        g = np.random.default_rng(seed)
        k = 6 * np.linalg.qr(g.standard_normal((d, d)))[0].T[:L]
        q = k + 0.1 * g.standard_normal((L, d))
        for name, x in (('q', q), ('k', k), ('v', g.standard_normal((L, dv)))):
            np.save(prefix + name + '.npy', np.ascontiguousarray(x, dtype='<f4'))
    elif cmd == 'poke':        # poke FILE flat-index value: set one element (nan, inf, ...)
        x = np.load(args[0]); x.reshape(-1)[int(args[1])] = float(args[2]); np.save(args[0], x)
    elif cmd == 'truncate':    # truncate FILE nbytes-to-drop
        b = open(args[0], 'rb').read(); open(args[0], 'wb').write(b[:len(b) - int(args[1])])
    elif cmd == 'shape':       # shape FILE dims...: exit 1 unless float32 of that shape
        x = np.load(args[0])
        want = tuple(int(a) for a in args[1:])
        if x.shape != want or x.dtype != np.float32:
            print('%s: shape %s dtype %s, expected %s float32' % (args[0], x.shape, x.dtype, want))
            sys.exit(1)
    elif cmd == 'exact':       # exact Q K V OUT [opts]
        q, k, v, out = [load(a) for a in args[:4]]
        o = opts(args[4:])
        ref, _, _ = exact(*(as4(x).astype(np.float64) for x in (q, k, v)),
                          o['causal'], o['lens'], o['scale'])
        if out.shape != v.shape[:-2] + (q.shape[-2], v.shape[-1]) or out.dtype != np.float32:
            print('output shape %s dtype %s' % (out.shape, out.dtype)); sys.exit(1)
        e = relerr(as4(out), ref)
        print('exact rel err %.3g' % e)
        sys.exit(0 if e < o['tol'] else 1)
    elif cmd == 'favor':       # favor Q K V W OUT [opts]
        q, k, v, W, out = [load(a) for a in args[:5]]
        o = opts(args[5:])
        ref = favor(*(as4(x).astype(np.float64) for x in (q, k, v)), W.astype(np.float64),
                    o['kernel'], o['causal'], o['lens'], o['scale'], o['eps'])
        if out.shape != v.shape[:-2] + (q.shape[-2], v.shape[-1]):
            print('output shape %s' % (out.shape,)); sys.exit(1)
        e = relerr(as4(out), ref)
        print('favor rel err %.3g' % e)
        sys.exit(0 if e < o['tol'] else 1)
    elif cmd in ('grad_exact', 'grad_favor'):  # grad_* Q K V DO PREFIX [W] [opts]
        q, k, v, do = [as4(load(a)).astype(np.float64) for a in args[:4]]
        prefix = args[4]
        rest = args[5:]
        W = None
        if cmd == 'grad_favor':
            W = load(rest[0]).astype(np.float64); rest = rest[1:]
        o = opts(rest)
        got = [as4(load(prefix + x)) for x in ('.dq.npy', '.dk.npy', '.dv.npy')]
        if cmd == 'grad_exact':
            # out = P V, P = softmax(S), S = s Q K^T: dV = P^T dO, dP = dO V^T,
            # dS = P * (dP - rowsum(dP * P)), dQ = s dS K, dK = s dS^T Q
            _, P, s = exact(q, k, v, o['causal'], o['lens'], o['scale'])
            dP = do @ np.swapaxes(v, -1, -2)
            dS = P * (dP - (dP * P).sum(-1, keepdims=True))
            ref = [s * dS @ k, s * np.swapaxes(dS, -1, -2) @ q, np.swapaxes(P, -1, -2) @ do]
        else:
            # central differences of f = sum(favor(q, k, v) * dO) in float64, h = 1e-6
            def f(q_, k_, v_):
                return (favor(q_, k_, v_, W, o['kernel'], o['causal'], o['lens'], o['scale'],
                              o['eps']) * do).sum()
            ref = []
            for t in range(3):
                xs = [q.copy(), k.copy(), v.copy()]
                g = np.zeros_like(xs[t])
                for idx in np.ndindex(*g.shape):
                    h = 1e-6
                    xp = [x.copy() for x in xs]; xp[t][idx] += h
                    xm = [x.copy() for x in xs]; xm[t][idx] -= h
                    g[idx] = (f(*xp) - f(*xm)) / (2 * h)
                ref.append(g)
        bad = 0
        for name, g, r in zip('qkv', got, ref):
            e = relerr(g, r)
            print('d%s rel err %.3g' % (name, e))
            bad += not (e < o['tol'])
        sys.exit(1 if bad else 0)
    else:
        raise SystemExit('ref.py: unknown command ' + cmd)

main()
EOF

ref() { $PY "$T/ref.py" "$@"; }
mk() { ref make "$@" || { echo "fixture failed: $*"; exit 1; }; }

# ---- fixtures -------------------------------------------------------------------------------
# rank 2: Lq = 7, Lk = 11, d = 16, dv = 8; rank 3: H = 3; rank 4: B = 2, H = 3; causal: L = 9
mk "$T/q2.npy" '<f4' 1 1 7 16;      mk "$T/k2.npy" '<f4' 2 1 11 16
mk "$T/v2.npy" '<f4' 3 1 11 8
mk "$T/q3.npy" '<f4' 4 1 3 7 16;    mk "$T/k3.npy" '<f4' 5 1 3 11 16
mk "$T/v3.npy" '<f4' 6 1 3 11 8
mk "$T/q4.npy" '<f4' 7 1 2 3 7 16;  mk "$T/k4.npy" '<f4' 8 1 2 3 11 16
mk "$T/v4.npy" '<f4' 9 1 2 3 11 8
mk "$T/qc.npy" '<f4' 10 1 2 3 9 16; mk "$T/kc.npy" '<f4' 11 1 2 3 9 16
mk "$T/vc.npy" '<f4' 12 1 2 3 9 8
# FAVOR+: smaller |q|, |k| so the estimator's denominators are well away from 0
mk "$T/fq.npy" '<f4' 13 0.5 2 3 9 16; mk "$T/fk.npy" '<f4' 14 0.5 2 3 9 16
mk "$T/fv.npy" '<f4' 15 1 2 3 9 8
mk "$T/wh.npy" '<f4' 16 1 3 32 16     # one W per head: (H, m, d)
ref lens "$T/lens.npy" '<i4' 5 11
ref lens "$T/lens64.npy" '<i8' 3 9
ref lens "$T/lensc.npy" '<i8' 4 9
ref lens "$T/lens1.npy" '<i4' 6

O="$T/out.npy"
run() { rm -f "$O"; "$P" attn "$@" 2>"$T/err"; }

# ---- exact attention vs numpy -----------------------------------------------------------------
for r in 2 3 4; do
    if run --method exact --q "$T/q$r.npy" --k "$T/k$r.npy" --v "$T/v$r.npy" --out "$O"; then
        check "exact rank $r" ref exact "$T/q$r.npy" "$T/k$r.npy" "$T/v$r.npy" "$O"
    else fail "exact rank $r: $(cat "$T/err")"; fi
done
if run --method exact --q "$T/q4.npy" --k "$T/k4.npy" --v "$T/v4.npy" --out "$O" \
       --key-lengths "$T/lens.npy" --scale 0.3; then
    check "exact padded" ref exact "$T/q4.npy" "$T/k4.npy" "$T/v4.npy" "$O" --lens "$T/lens.npy" \
        --scale 0.3
else fail "exact padded: $(cat "$T/err")"; fi
if run --method exact --q "$T/q2.npy" --k "$T/k2.npy" --v "$T/v2.npy" --out "$O" \
       --key-lengths "$T/lens1.npy"; then
    check "exact padded rank 2" ref exact "$T/q2.npy" "$T/k2.npy" "$T/v2.npy" "$O" \
        --lens "$T/lens1.npy"
else fail "exact padded rank 2: $(cat "$T/err")"; fi
if run --method exact --causal --q "$T/qc.npy" --k "$T/kc.npy" --v "$T/vc.npy" --out "$O"; then
    check "exact causal" ref exact "$T/qc.npy" "$T/kc.npy" "$T/vc.npy" "$O" --causal
else fail "exact causal: $(cat "$T/err")"; fi
if run --method exact --causal --q "$T/qc.npy" --k "$T/kc.npy" --v "$T/vc.npy" --out "$O" \
       --key-lengths "$T/lensc.npy" --threads 1; then
    check "exact causal padded" ref exact "$T/qc.npy" "$T/kc.npy" "$T/vc.npy" "$O" --causal \
        --lens "$T/lensc.npy"
else fail "exact causal padded: $(cat "$T/err")"; fi

# ---- FAVOR+ vs numpy with the same W ----------------------------------------------------------
W="$T/w.npy"
favor_case() { # favor_case name kernel extra-tool-flags -- extra-ref-flags
    name=$1; kernel=$2; shift 2
    tflags=""; while [ $# -gt 0 ] && [ "$1" != "--" ]; do tflags="$tflags $1"; shift; done
    [ $# -gt 0 ] && shift
    rm -f "$W"
    # shellcheck disable=SC2086
    if run --q "$T/fq.npy" --k "$T/fk.npy" --v "$T/fv.npy" --out "$O" --kernel "$kernel" \
           --features 32 --seed 5 --save-w "$W" $tflags; then
        check "favor $name" ref favor "$T/fq.npy" "$T/fk.npy" "$T/fv.npy" "$W" "$O" \
            --kernel "$kernel" --tol 1e-4 "$@"
    else fail "favor $name: $(cat "$T/err")"; fi
}
favor_case positive positive
favor_case "positive causal" positive --causal -- --causal
favor_case "positive causal chunk 4" positive --causal --chunk 4 -- --causal
favor_case "positive padded" positive --key-lengths "$T/lens64.npy" -- --lens "$T/lens64.npy"
favor_case "positive iid sqrtd" positive --proj iid --norm sqrtd
favor_case "positive qmc" positive --norm qmc
favor_case "positive eps" positive --eps 0.01 -- --eps 0.01
favor_case hyperbolic hyperbolic
favor_case "hyperbolic causal" hyperbolic --causal -- --causal
favor_case relu relu --eps 0.001 -- --eps 0.001
favor_case "relu causal" relu --causal --eps 0.001 -- --causal --eps 0.001
favor_case "relu padded" relu --eps 0.001 --key-lengths "$T/lens64.npy" -- --eps 0.001 \
    --lens "$T/lens64.npy"
if ref shape "$W" 32 16; then pass; else fail "--save-w shape"; fi

# one W per head, given with --w
if run --q "$T/fq.npy" --k "$T/fk.npy" --v "$T/fv.npy" --out "$O" --w "$T/wh.npy"; then
    check "favor per-head W" ref favor "$T/fq.npy" "$T/fk.npy" "$T/fv.npy" "$T/wh.npy" "$O" \
        --tol 1e-4
else fail "favor per-head W: $(cat "$T/err")"; fi

# --save-w then --w: identical output, byte for byte; a different seed gives another output
if run --q "$T/fq.npy" --k "$T/fk.npy" --v "$T/fv.npy" --out "$O" --seed 9 --save-w "$W"; then
    cp "$O" "$T/o1.npy"
    if run --q "$T/fq.npy" --k "$T/fk.npy" --v "$T/fv.npy" --out "$O" --w "$W"; then
        check "--w round trip identical" cmp -s "$O" "$T/o1.npy"
    else fail "--w round trip: $(cat "$T/err")"; fi
    if run --q "$T/fq.npy" --k "$T/fk.npy" --v "$T/fv.npy" --out "$O" --seed 10; then
        if cmp -s "$O" "$T/o1.npy"; then fail "another seed gave the same output"; else pass; fi
    else fail "seed 10: $(cat "$T/err")"; fi
else fail "--save-w: $(cat "$T/err")"; fi

# float16 inputs: widened exactly, the output written in float16, the float32 computation's
# rounded once (numpy rounds the float32 run's output; the bits must agree); a mix of float16
# and float32 gives a float32 output
$PY - "$T" <<'EOF' || fail "float16 fixtures"
import sys, numpy as np
t = sys.argv[1]
r = np.random.default_rng(16)
for n in "qkv":
    a = (r.normal(size=(2, 3, 40, 8)) * 0.5).astype(np.float16)
    np.save(f"{t}/h{n}.npy", a)
    np.save(f"{t}/h{n}32.npy", a.astype(np.float32))
EOF
for mode in "" "--causal"; do
    # shellcheck disable=SC2086
    "$P" attn $mode --q "$T/hq.npy" --k "$T/hk.npy" --v "$T/hv.npy" --out "$T/ho.npy" \
        --save-w "$T/hw.npy" 2>"$T/err" &&
        "$P" attn $mode --q "$T/hq32.npy" --k "$T/hk32.npy" --v "$T/hv32.npy" \
            --out "$T/ho32.npy" --w "$T/hw.npy" 2>>"$T/err" &&
        $PY -c "
import sys, numpy as np
o, r = np.load(sys.argv[1]), np.load(sys.argv[2])
same = (o.view(np.uint16) == r.astype(np.float16).view(np.uint16)).all()
sys.exit(0 if o.dtype == np.float16 and same else 1)
" "$T/ho.npy" "$T/ho32.npy" && pass || fail "float16 inputs $mode: $(cat "$T/err")"
done
"$P" attn --q "$T/hq.npy" --k "$T/hk32.npy" --v "$T/hv.npy" --out "$T/hm.npy" 2>"$T/err" &&
    $PY -c "import sys, numpy as np; sys.exit(np.load(sys.argv[1]).dtype != np.float32)" \
        "$T/hm.npy" && pass || fail "float16 and float32 mixed: not a float32 output"

# ---- gradients ------------------------------------------------------------------------------
mk "$T/gq.npy" '<f4' 20 1 2 5 4;  mk "$T/gk.npy" '<f4' 21 1 2 5 4; mk "$T/gv.npy" '<f4' 22 1 2 5 3
mk "$T/gdo.npy" '<f4' 23 1 2 5 3; mk "$T/gw.npy" '<f4' 24 1 8 4
G="$T/g"
for mode in "" "--causal"; do
    rm -f "$G".d?.npy
    # shellcheck disable=SC2086
    if run --method exact $mode --q "$T/gq.npy" --k "$T/gk.npy" --v "$T/gv.npy" --out "$O" \
           --grad-out "$T/gdo.npy" --grad-prefix "$G"; then
        check "grad shapes" ref shape "$G.dq.npy" 2 5 4
        check "grad shapes" ref shape "$G.dk.npy" 2 5 4
        check "grad shapes" ref shape "$G.dv.npy" 2 5 3
        # shellcheck disable=SC2086
        check "exact grad $mode" ref grad_exact "$T/gq.npy" "$T/gk.npy" "$T/gv.npy" \
            "$T/gdo.npy" "$G" $mode --tol 1e-5
    else fail "exact grad $mode: $(cat "$T/err")"; fi
done
for mode in "--kernel positive" "--kernel positive --causal" "--kernel relu --eps 0.01" \
            "--kernel hyperbolic --causal"; do
    rm -f "$G".d?.npy
    # shellcheck disable=SC2086
    if run $mode --q "$T/gq.npy" --k "$T/gk.npy" --v "$T/gv.npy" --out "$O" --w "$T/gw.npy" \
           --grad-out "$T/gdo.npy" --grad-prefix "$G"; then
        # shellcheck disable=SC2086
        check "favor grad $mode" ref grad_favor "$T/gq.npy" "$T/gk.npy" "$T/gv.npy" \
            "$T/gdo.npy" "$G" "$T/gw.npy" $mode --tol 1e-4
    else fail "favor grad $mode: $(cat "$T/err")"; fi
done

# ---- RA and LARA vs numpy's exact attention ---------------------------------------------------
if run --method ra --samples 2000 --seed 3 --q "$T/q2.npy" --k "$T/k2.npy" --v "$T/v2.npy" \
       --out "$O"; then
    check "ra vs exact" ref exact "$T/q2.npy" "$T/k2.npy" "$T/v2.npy" "$O" --tol 0.1
else fail "ra: $(cat "$T/err")"; fi
if run --method ra --samples 2000 --q "$T/q4.npy" --k "$T/k4.npy" --v "$T/v4.npy" --out "$O" \
       --key-lengths "$T/lens.npy" --threads 1; then
    check "ra padded vs exact" ref exact "$T/q4.npy" "$T/k4.npy" "$T/v4.npy" "$O" \
        --lens "$T/lens.npy" --tol 0.1
    cp "$O" "$T/ra1.npy"
    if run --method ra --samples 2000 --q "$T/q4.npy" --k "$T/k4.npy" --v "$T/v4.npy" \
           --out "$O" --key-lengths "$T/lens.npy" --threads 2; then
        check "ra same bits at 1 and 2 threads" cmp -s "$O" "$T/ra1.npy"
    else fail "ra threads 2: $(cat "$T/err")"; fi
else fail "ra padded: $(cat "$T/err")"; fi
ref sep "$T/s" 40 8 16 4 || { echo "fixture failed: sep"; exit 1; }
SQ="--q $T/sq.npy"; SK="--k $T/sk.npy"; SV="--v $T/sv.npy"
# shellcheck disable=SC2086
if run --method lara --deterministic --proposals 8 $SQ $SK $SV --out "$O"; then
    check "lara eps=0, C = Lk vs exact" ref exact "$T/sq.npy" "$T/sk.npy" "$T/sv.npy" "$O" \
        --tol 1e-2
else fail "lara deterministic: $(cat "$T/err")"; fi
# shellcheck disable=SC2086
if run --method lara --deterministic --proposals 2 $SQ $SK $SV --out "$O"; then
    if ref exact "$T/sq.npy" "$T/sk.npy" "$T/sv.npy" "$O" --tol 0.1 >/dev/null; then
        fail "lara eps=0 with C = 2 is as close as C = Lk: the proposals change nothing"
    else pass; fi
else fail "lara C = 2: $(cat "$T/err")"; fi
if run --method lara --proposals 4 --samples 8 --seed 7 --q "$T/q4.npy" --k "$T/k4.npy" \
       --v "$T/v4.npy" --out "$O" --key-lengths "$T/lens.npy"; then
    check "lara padded shape" ref shape "$O" 2 3 7 8
else fail "lara padded: $(cat "$T/err")"; fi

# ---- refusals: message keyword, non-zero exit, no output ------------------------------------
mk "$T/f64.npy" '<f8' 1 1 7 16
mk "$T/i32.npy" '<i4' 1 1 7 16
mk "$T/one.npy" '<f4' 1 1 16
mk "$T/k2d8.npy" '<f4' 2 1 11 8
mk "$T/v2l9.npy" '<f4' 3 1 9 8
mk "$T/qnan.npy" '<f4' 1 1 7 16;  ref poke "$T/qnan.npy" 37 nan
mk "$T/vinf.npy" '<f4' 3 1 11 8;  ref poke "$T/vinf.npy" 5 inf
mk "$T/trunc.npy" '<f4' 1 1 7 16; ref truncate "$T/trunc.npy" 10
ref lens "$T/len0.npy" '<i4' 0
ref lens "$T/len12.npy" '<i8' 12
ref lens "$T/lens2.npy" '<i4' 3 4
ref lens "$T/lensf.npy" '<f4' 3
mk "$T/wbad.npy" '<f4' 1 1 32 8
mk "$T/kh2.npy" '<f4' 1 1 2 2 11 16
mk "$T/vh2.npy" '<f4' 1 1 2 2 11 8

refuse() { # refuse "what" want-exit keyword args...: want-exit is 1, 2 or "any" (non-zero)
    what=$1; want=$2; key=$3; shift 3
    rm -f "$O"
    "$P" attn "$@" 2>"$T/err" >/dev/null
    rc=$?
    if [ $rc -eq 0 ]; then fail "$what: exit 0"
    elif [ "$want" != any ] && [ $rc -ne "$want" ]; then fail "$what: exit $rc, expected $want"
    elif ! grep -q -- "$key" "$T/err"; then fail "$what: message lacks '$key': $(cat "$T/err")"
    elif [ -e "$O" ]; then fail "$what: output file left behind"
    else pass; fi
}
Q2="--q $T/q2.npy"; K2="--k $T/k2.npy"; V2="--v $T/v2.npy"; OUT="--out $O"
# shellcheck disable=SC2086
{
refuse "float64 input" 1 "'<f8'" --q "$T/f64.npy" $K2 $V2 $OUT
refuse "int32 input" 1 "expected float32" --q "$T/i32.npy" $K2 $V2 $OUT
refuse "1-D input" 1 "rank 1" --q "$T/one.npy" $K2 $V2 $OUT
refuse "rank mismatch" 1 "same rank" $Q2 --k "$T/k3.npy" $V2 $OUT
refuse "d mismatch" 1 "widths differ" $Q2 --k "$T/k2d8.npy" $V2 $OUT
refuse "Lk mismatch" 1 "lengths differ" $Q2 $K2 --v "$T/v2l9.npy" $OUT
refuse "leading dims" 1 "leading" --q "$T/q4.npy" --k "$T/kh2.npy" --v "$T/vh2.npy" $OUT
refuse "truncated file" 1 "truncated" --q "$T/trunc.npy" $K2 $V2 $OUT
refuse "missing file" 1 "No such file" --q "$T/nope.npy" $K2 $V2 $OUT
refuse "not a npy file" 1 "not a .npy file" --q "$T/ref.py" $K2 $V2 $OUT
refuse "NaN in Q" 1 "NaN or Inf at index 37" --q "$T/qnan.npy" $K2 $V2 $OUT
refuse "Inf in V" 1 "NaN or Inf at index 5" $Q2 $K2 --v "$T/vinf.npy" $OUT
refuse "--features 0" 2 "expected a positive integer, got '0'" $Q2 $K2 $V2 $OUT --features 0
refuse "--features -5" 2 "expected a positive integer, got '-5'" $Q2 $K2 $V2 $OUT --features -5
refuse "--features abc" 2 "expected a positive integer, got 'abc'" $Q2 $K2 $V2 $OUT --features abc
refuse "--features 12x" 2 "expected a positive integer" $Q2 $K2 $V2 $OUT --features 12x
refuse "--features huge" 2 "expected a positive integer" $Q2 $K2 $V2 $OUT --features 99999999999
refuse "--scale 0" 2 "positive number" $Q2 $K2 $V2 $OUT --scale 0
refuse "--scale nan" 2 "positive number" $Q2 $K2 $V2 $OUT --scale nan
refuse "--eps -1" 2 "non-negative number" $Q2 $K2 $V2 $OUT --eps -1
refuse "--seed -1" 2 "non-negative integer" $Q2 $K2 $V2 $OUT --seed -1
refuse "--threads x" 2 "--threads" $Q2 $K2 $V2 $OUT --threads x
refuse "missing value" 2 "missing value" $Q2 $K2 $V2 $OUT --features
refuse "unknown flag" 2 "unknown option '--bogus'" $Q2 $K2 $V2 $OUT --bogus
refuse "unknown method" 2 "unknown value 'fast'" $Q2 $K2 $V2 $OUT --method fast
refuse "unknown kernel" 2 "unknown value 'gauss'" $Q2 $K2 $V2 $OUT --kernel gauss
refuse "elu draws no W" 2 "--kernel elu draws none" $Q2 $K2 $V2 $OUT --kernel elu --features 8
refuse "unknown proj" 2 "unknown value" $Q2 $K2 $V2 $OUT --proj haar
refuse "unknown norm" 2 "unknown value" $Q2 $K2 $V2 $OUT --norm l2
refuse "missing --out" 2 "missing --out" $Q2 $K2 $V2
refuse "stray argument" 2 "unexpected argument" $Q2 $K2 $V2 $OUT extra
refuse "grad-out alone" 2 "go together" $Q2 $K2 $V2 $OUT --grad-out "$T/gdo.npy"
refuse "save-w with exact" 2 "favor only" $Q2 $K2 $V2 $OUT --method exact --save-w "$W"
refuse "key length 0" 1 "out of range" $Q2 $K2 $V2 $OUT --key-lengths "$T/len0.npy"
refuse "key length > Lk" 1 "out of range" $Q2 $K2 $V2 $OUT --key-lengths "$T/len12.npy"
refuse "key lengths shape" 1 "one length per batch" $Q2 $K2 $V2 $OUT --key-lengths "$T/lens2.npy"
refuse "key lengths dtype" 1 "int32" $Q2 $K2 $V2 $OUT --key-lengths "$T/lensf.npy"
refuse "causal Lq != Lk" 1 "causal" $Q2 $K2 $V2 $OUT --causal
refuse "W with wrong d" 1 "expected (m, 16)" $Q2 $K2 $V2 $OUT --w "$T/wbad.npy"
refuse "grad-out shape" 1 "output's shape" $Q2 $K2 $V2 $OUT --method exact \
    --grad-out "$T/q2.npy" --grad-prefix "$T/g2"
refuse "output in a missing folder" 1 "No such file" $Q2 $K2 $V2 --out "$T/no/such/dir/o.npy"
refuse "output is a folder" 1 "folder" $Q2 $K2 $V2 --out "$T"
refuse "ra causal" 2 "bidirectional only" --q "$T/qc.npy" --k "$T/kc.npy" --v "$T/vc.npy" $OUT \
    --method ra --causal
refuse "lara causal" 2 "bidirectional only" --q "$T/qc.npy" --k "$T/kc.npy" --v "$T/vc.npy" \
    $OUT --method lara --causal
refuse "lara too many proposals" 1 "at most 7" $Q2 $K2 $V2 $OUT --method lara --proposals 8
refuse "lara proposals > key length" 1 "at most 5" --q "$T/q4.npy" --k "$T/k4.npy" \
    --v "$T/v4.npy" $OUT --method lara --proposals 6 --key-lengths "$T/lens.npy"
refuse "deterministic with samples" 2 "--samples must be 1" $Q2 $K2 $V2 $OUT --method lara \
    --deterministic --samples 2
refuse "samples with exact" 2 "ra or lara only" $Q2 $K2 $V2 $OUT --method exact --samples 4
refuse "proposals with ra" 2 "lara only" $Q2 $K2 $V2 $OUT --method ra --proposals 2
refuse "deterministic with favor" 2 "lara only" $Q2 $K2 $V2 $OUT --deterministic
refuse "--samples 0" 2 "expected a positive integer, got '0'" $Q2 $K2 $V2 $OUT --method ra \
    --samples 0
refuse "--proposals x" 2 "--proposals" $Q2 $K2 $V2 $OUT --method lara --proposals x
refuse "lara gradients" 2 "no backward" $Q2 $K2 $V2 $OUT --method lara --grad-out "$T/gdo.npy" \
    --grad-prefix "$T/g3"
refuse "lara with --w" 2 "favor only" $Q2 $K2 $V2 $OUT --method lara --w "$T/w.npy"
}
[ -e "$T/g2.dq.npy" ] && fail "grad outputs left behind"

# An unwritable output, a read-only folder. Root ignores permissions, so as root run the tool
# as nobody (setpriv), with the inputs readable by all.
mkdir "$T/ro" && chmod 555 "$T/ro"
chmod 755 "$T"
if [ "$(id -u)" -ne 0 ]; then
    refuse "read-only folder" 1 "Permission denied" $Q2 $K2 $V2 --out "$T/ro/o.npy"
elif command -v setpriv >/dev/null 2>&1 &&
     setpriv --reuid=65534 --regid=65534 --clear-groups "$P" --version >/dev/null 2>&1; then
    rm -f "$T/ro/o.npy"
    setpriv --reuid=65534 --regid=65534 --clear-groups "$P" attn $Q2 $K2 $V2 \
        --out "$T/ro/o.npy" 2>"$T/err"
    rc=$?
    if [ $rc -eq 0 ]; then fail "read-only folder: exit 0"
    elif ! grep -q "Permission denied" "$T/err"; then fail "read-only folder: $(cat "$T/err")"
    elif [ -n "$(ls -A "$T/ro")" ]; then fail "read-only folder: something was left"
    else pass; fi
else
    echo "NOTE: root without a usable setpriv: the read-only folder case is not run"
fi
# A write that fails after the check (root can pass access(); /proc refuses new files)
if [ "$(id -u)" -eq 0 ]; then
    rm -f "$T/err"
    "$P" attn $Q2 $K2 $V2 --out /proc/pf_test_tool_o.npy 2>"$T/err"
    rc=$?
    if [ $rc -ne 1 ]; then fail "/proc output: exit $rc"
    elif ! grep -q "/proc/pf_test_tool_o.npy" "$T/err"; then fail "/proc: $(cat "$T/err")"
    else pass; fi
fi

# No temporary files anywhere after all of this.
left=$(find "$T" -name '*.tmp.*' | head -n 5)
if [ -n "$left" ]; then fail "temporary files left: $left"; else pass; fi

# ---- help, version, top-level errors -----------------------------------------------------------
"$P" --help >"$T/help" 2>&1; rc=$?
[ $rc -eq 0 ] && pass || fail "--help exit $rc"
"$P" attn --help >"$T/ahelp" 2>&1; rc=$?
[ $rc -eq 0 ] && pass || fail "attn --help exit $rc"
"$P" demo --help >"$T/dhelp" 2>&1; rc=$?
[ $rc -eq 0 ] && pass || fail "demo --help exit $rc"
for f in --q --k --v --out --method --causal --kernel --features --proj --norm --seed --scale \
         --eps --w --save-w --key-lengths --threads --chunk --grad-out --grad-prefix \
         --samples --proposals --deterministic; do
    grep -q -E -- "$f([^a-z-]|\$)" "$T/help" || fail "--help does not mention attn $f"
    grep -q -E -- "$f([^a-z-]|\$)" "$T/ahelp" || fail "attn --help does not mention $f"
done
pass
for f in --max-len --d --heads --features --budget --sigma --threads --seed --quick \
         --checkpoint --no-checkpoint --text; do
    grep -q -E -- "$f([^a-z-]|\$)" "$T/help" || fail "--help does not mention demo $f"
    grep -q -E -- "$f([^a-z-]|\$)" "$T/dhelp" || fail "demo --help does not mention $f"
done
pass
for word in exact favor positive hyperbolic trig relu orthogonal iid chi sqrtd qmc ra lara; do
    grep -q "$word" "$T/ahelp" || fail "attn --help does not mention $word"
done
grep -q '\[256\]' "$T/ahelp" && pass || fail "attn --help does not give the default m"
"$P" --version | grep -q "^performer [0-9]" && pass || fail "--version"
# --version names the OpenBLAS kernels, which follow OPENBLAS_CORETYPE (x86-64 builds know these),
# and the library's vector path, which follows PF_SIMD (ref runs anywhere)
if [ "$tool_arch" = x86_64 ]; then
    for core in Haswell SkylakeX; do
        OPENBLAS_CORETYPE=$core "$P" --version | grep -q "; OpenBLAS kernels: $core)" && pass ||
            fail "--version with OPENBLAS_CORETYPE=$core: $(OPENBLAS_CORETYPE=$core "$P" --version)"
    done
fi
PF_SIMD=ref "$P" --version | grep -q "(vector kernels: ref;" && pass ||
    fail "--version with PF_SIMD=ref: $(PF_SIMD=ref "$P" --version)"
# FAVOR+ runs every product in the library's own kernels (pf_mm): its outputs and gradients have
# the same bits whichever OpenBLAS kernel set is loaded
if [ "$tool_arch" = x86_64 ] && grep -q '\<avx512f\>' /proc/cpuinfo; then
    mk "$T/fdo.npy" '<f4' 17 1 2 3 9 8
    for mode in "" "--causal"; do
        for core in Haswell SkylakeX; do
            # shellcheck disable=SC2086
            OPENBLAS_CORETYPE=$core "$P" attn $mode --q "$T/fq.npy" --k "$T/fk.npy" \
                --v "$T/fv.npy" --out "$T/bk$core.o.npy" --grad-out "$T/fdo.npy" \
                --grad-prefix "$T/bk$core" 2>"$T/err" || fail "favor $mode on $core: $(cat "$T/err")"
        done
        for f in o dq dk dv; do
            cmp -s "$T/bkHaswell.$f.npy" "$T/bkSkylakeX.$f.npy" && pass ||
                fail "favor $mode: $f differs between OpenBLAS's Haswell and SkylakeX kernels"
        done
    done
fi
# OpenBLAS falling back to a generic kernel set (as 0.3.21 does on CPU models it does not know):
# a stand-in openblas_get_corename answers "Prescott" (or $PF_TEST_CORE) unless OPENBLAS_CORETYPE
# is set. The tool starts again once with OPENBLAS_CORETYPE set to the set the CPU runs and says
# so in --version; a set the user chose is left alone; if it has already started again, it warns
# instead.
want=
if grep -q '\<avx512f\>' /proc/cpuinfo && grep -q '\<avx512bw\>' /proc/cpuinfo &&
    grep -q '\<avx512vl\>' /proc/cpuinfo && grep -q '\<avx512dq\>' /proc/cpuinfo; then
    want=SkylakeX
elif grep -q '\<avx2\>' /proc/cpuinfo && grep -q '\<fma\>' /proc/cpuinfo; then
    want=Haswell
fi
cat >"$T/fallback.c" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
char *openblas_get_corename(void) {
    char *(*real)(void) = (char *(*)(void))dlsym(RTLD_NEXT, "openblas_get_corename");
    const char *core = getenv("PF_TEST_CORE");
    return getenv("OPENBLAS_CORETYPE") || !real ? real() : core ? (char *)core : "Prescott";
}
EOF
if [ "$tool_arch" = x86_64 ] && [ -n "$want" ] &&
    cc -shared -fPIC -o "$T/fallback.so" "$T/fallback.c" -ldl 2>/dev/null; then
    fb() { # the tool with OpenBLAS's choice a fallback (ASan must accept a library before it)
        env -u OPENBLAS_CORETYPE -u PF_BLAS_FALLBACK LD_PRELOAD="$T/fallback.so" \
            ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" "$@"
    }
    v=$(fb "$P" --version 2>"$T/err")
    case $v in
        *"OpenBLAS kernels: $want, set by performer over OpenBLAS's choice of Prescott)") pass ;;
        *) fail "fallback: --version $v" ;;
    esac
    [ -s "$T/err" ] && fail "fallback: stderr $(cat "$T/err")" || pass
    # OpenBLAS's "Zen" set (Haswell's sgemm with C loops to zero and pack) on an AVX2 CPU or one
    # with AVX-512: the same remedy
    v=$(fb env PF_TEST_CORE=Zen "$P" --version 2>"$T/err")
    case $v in
        *"OpenBLAS kernels: $want, set by performer over OpenBLAS's choice of Zen)")
            [ -s "$T/err" ] && fail "Zen set: stderr $(cat "$T/err")" || pass ;;
        *) fail "Zen set: --version $v" ;;
    esac
    # the arguments survive the second start: the same output as without the stand-in
    "$P" attn --q "$T/fq.npy" --k "$T/fk.npy" --v "$T/fv.npy" --out "$T/nofb.o.npy" &&
        fb "$P" attn --q "$T/fq.npy" --k "$T/fk.npy" --v "$T/fv.npy" --out "$T/fb.o.npy" \
            2>"$T/err" && cmp -s "$T/fb.o.npy" "$T/nofb.o.npy" && pass ||
        fail "fallback: attn after starting again: $(cat "$T/err")"
    v=$(fb env OPENBLAS_CORETYPE=Prescott "$P" --version 2>"$T/err")
    case $v in
        *"; OpenBLAS kernels: Prescott)")
            [ -s "$T/err" ] && fail "fallback chosen: warned $(cat "$T/err")" || pass ;;
        *) fail "fallback chosen by the user: --version $v" ;;
    esac
    v=$(fb env PF_BLAS_FALLBACK=Prescott "$P" --version 2>"$T/err")
    case $v in
        *"; OpenBLAS kernels: Prescott)")
            grep -q "OPENBLAS_CORETYPE=$want" "$T/err" && [ "$(wc -l <"$T/err")" -eq 1 ] && pass ||
                fail "fallback after starting again: stderr $(cat "$T/err")" ;;
        *) fail "fallback after starting again: --version $v" ;;
    esac
fi
"$P" frobnicate 2>"$T/err"; rc=$?
[ $rc -eq 2 ] && grep -q "unknown command 'frobnicate'" "$T/err" && pass ||
    fail "unknown command: exit $rc, $(cat "$T/err")"
"$P" demo --bogus 2>"$T/err"; rc=$?
[ $rc -eq 2 ] && grep -q "unknown option" "$T/err" && pass || fail "demo --bogus: exit $rc"

# ---- demo --quick: a table with a row per L (small sizes: this also runs under ASan) ----------
# (not under emulation, PF_TOOL_EMULATED: its timings and the copied binary without data/ beside
# it are about a native run; the rest of this file is the tool's arithmetic and contracts)
if [ -n "${PF_TOOL_EMULATED:-}" ]; then
    echo "test_tool.sh: demo checks left out under emulation"
    finish
    exit $?
fi
"$P" demo --quick --heads 2 --d 16 --features 32 >"$T/demo" 2>"$T/demo.err"; rc=$?
if [ $rc -ne 0 ]; then fail "demo --quick exit $rc: $(tail -n 5 "$T/demo.err")"
elif ! grep -q "FAVOR+ err  *FAVOR++ err" "$T/demo"; then fail "demo: no table header"
else
    # every row ends with two finite errors (FAVOR+ and FAVOR++ against exact)
    rows=$(grep -c -E '^ +(512|1024|2048|4096) +[0-9].* [0-9]+\.[0-9]+ +[0-9]+\.[0-9]+$' "$T/demo")
    [ "$rows" -eq 4 ] && pass || { fail "demo: $rows rows, expected 4"; cat "$T/demo"; }
    grep -q "L=4096" "$T/demo.err" && pass || fail "demo: no progress on stderr"
fi
# the trained model's part: layers 1..4 and N(0,1), each |q'|², |k'|², the ranks of q and k and
# "mean ± sd" at three values of m
cat >"$T/real.py" <<'EOF'
import math, re, sys
text = open(sys.argv[1], encoding="utf-8").read()
assert "FAVOR+ on a trained model's own queries, keys and values" in text, "no section"
assert "demo-kjv.safetensors" in text and "demo-kjv-val.txt" in text, "not the shipped files"
num = r"([0-9.]+|nan|inf|-nan|-inf)"
rows = {}
for line in text.splitlines():
    m = re.match(r"^  (layer \d+|N\(0,1\) \(hard case\))" + " +%s" % num * 4 +
                 "".join(r" +%s ± %s" % (num, num) for _ in range(3)) + "$", line)
    if m:
        rows[m.group(1)] = [float(x) for x in m.groups()[1:]]
assert list(rows) == ["layer 1", "layer 2", "layer 3", "layer 4", "N(0,1) (hard case)"], rows
for name, v in rows.items():
    assert all(math.isfinite(x) for x in v), (name, v)
rnd = rows.pop("N(0,1) (hard case)")
assert 7 < rnd[0] < 9 and 7 < rnd[1] < 9, rnd  # |q'|^2 = |q|^2/sqrt(64) = 8 on average
assert 50 < rnd[2] < 64 and 50 < rnd[3] < 64, rnd  # 64/(1 + 64/n) for n = 512 or 1024 rows
for name, v in rows.items():
    assert v[2] < 16 and v[3] < 16, (name, v)  # the trained ones vary along a few directions
    for j in range(3):  # mean errors at m = 64, 256, 1024: the layer's below N(0,1)'s
        assert v[4 + 2 * j] < rnd[4 + 2 * j], (name, j, v, rnd)
print(len(rows), "layers")
EOF
if [ $rc -eq 0 ]; then
    $PY "$T/real.py" "$T/demo" >"$T/real.out" 2>&1 && pass ||
        { fail "demo: the trained model's part: $(tail -n 3 "$T/real.out")"; cat "$T/demo"; }
fi
"$P" demo --quick --heads 2 --d 16 --features 32 --no-checkpoint >"$T/demo2" 2>"$T/err"; rc=$?
[ $rc -eq 0 ] && ! grep -q "trained model" "$T/demo2" && pass ||
    fail "demo --no-checkpoint: exit $rc, $(grep "trained" "$T/demo2")"
# ---- demo's first screen: the setting where FAVOR+ works first, the hard case labelled --------
cat >"$T/first.py" <<'EOF'
import math, re, sys
text = open(sys.argv[1], encoding="utf-8").read()
sigma = float(sys.argv[2])
lines = text.splitlines()
num = r"([0-9]+\.[0-9]+)"
def table(i):  # the rows of the table whose header is line i: {L: [numbers]}
    rows = {}
    for line in lines[i + 1:]:
        m = re.match(r"^ +(\d+) +(.*)$", line)
        if not m:
            break
        rows[int(m.group(1))] = [float(x) for x in m.group(2).replace("x", "").split()]
    return rows
caps = [i for i, l in enumerate(lines) if l.startswith("sigma = ")]
heads = [i for i, l in enumerate(lines) if re.match(r"^ +L +", l)]
err = [i for i, l in enumerate(lines) if "where 1.0 is the error of answering 0" in l]
assert err and err[0] < heads[0], "err and 'answering 0' not explained before the first table"
if sigma < 1:
    assert len(caps) == 2 and len(heads) == 2, (caps, heads)
    assert lines[caps[0]] == "sigma = 0.5 (|q'|^2 = 1), a setting where FAVOR+ works:", lines[caps[0]]
    assert heads[0] == caps[0] + 1 and "FAVOR+ err  FAVOR++ err" in lines[heads[0]], lines[heads[0]]
    assert lines[caps[1]].startswith("sigma = 1, the hard case (|q'|^2 = 4, not 1): the same draws"), \
        lines[caps[1]]
    assert heads[1] in (caps[1] + 1, caps[1] + 2), (caps, heads)
    assert lines[heads[1]].split() == ["L", "FAVOR+", "err", "FAVOR++", "err"], lines[heads[1]]
    main, hard = table(heads[0]), table(heads[1])
    assert sorted(main) == sorted(hard) == [512, 1024, 2048, 4096], (main, hard)
    for L in main:  # the same draws, twice the scale: larger errors, both estimators
        e, h = main[L][-2:], hard[L]
        assert all(math.isfinite(x) for x in e + h), (L, e, h)
        assert h[0] > e[0] and h[1] > e[1], (L, e, h)
else:
    assert len(caps) == 1 and len(heads) == 1, (caps, heads)
    assert lines[caps[0]].startswith("sigma = 1, the hard case (|q'|^2 = 4; "), lines[caps[0]]
    assert heads[0] == caps[0] + 1, (caps, heads)
print("ok")
EOF
mkdir -p "$T/dfirst/sub"
printf 'kept\n' >"$T/dfirst/notes.txt"
printf 'nested\n' >"$T/dfirst/sub/x.csv"
cp -R "$T/dfirst" "$T/dfirst.before"
for sigma in 0.5 1; do
    if [ "$sigma" = 0.5 ]; then flag=""; else flag="--sigma 1"; fi
    # shellcheck disable=SC2086
    (cd "$T/dfirst" && "$P" demo --quick --heads 2 --d 16 --features 32 --no-checkpoint $flag \
        >"$T/dfirst.out" 2>"$T/dfirst.err"); rc=$?
    if [ $rc -ne 0 ]; then fail "demo first screen ($flag): exit $rc: $(tail -n 3 "$T/dfirst.err")"
    else
        $PY "$T/first.py" "$T/dfirst.out" $sigma >"$T/first.log" 2>&1 && pass ||
            { fail "demo first screen (sigma $sigma): $(tail -n 1 "$T/first.log")"; cat "$T/dfirst.out"; }
    fi
done
for f in notes.txt sub/x.csv; do
    cmp -s "$T/dfirst/$f" "$T/dfirst.before/$f" && pass || fail "demo: $f changed"
done
[ "$(cd "$T/dfirst" && find . | sort | paste -sd' ' -)" = ". ./notes.txt ./sub ./sub/x.csv" ] &&
    pass || fail "demo wrote files: $(cd "$T/dfirst" && find . | paste -sd' ' -)"
# a bad --checkpoint or --text fails before the timings
printf 'not a checkpoint' >"$T/bad.safetensors"
printf 'In the' >"$T/short.txt"
for args in "--checkpoint $T/none.safetensors" "--checkpoint $T/bad.safetensors" \
    "--text $T/none.txt" "--text $T/short.txt" "--text $T"; do
    # shellcheck disable=SC2086
    "$P" demo --quick $args >"$T/out" 2>"$T/err"; rc=$?
    if [ $rc -ne 1 ]; then fail "demo $args: exit $rc, expected 1: $(cat "$T/err")"
    elif ! grep -q -- "${args%% *}: " "$T/err"; then fail "demo $args: message $(cat "$T/err")"
    elif grep -q "L=512" "$T/err" || [ -s "$T/out" ]; then fail "demo $args: timed anyway"
    else pass; fi
done
"$P" demo --no-checkpoint --text "$T/x.txt" 2>"$T/err"; rc=$?
[ $rc -eq 2 ] && pass || fail "demo --no-checkpoint --text: exit $rc"
# a performer with no data/ beside it (nor in PERFORMER_DATA, nor in ./data): left out, noted
mkdir -p "$T/alone/bin"
cp "$P" "$T/alone/bin/performer"
(cd "$T/alone" && env -u PERFORMER_DATA bin/performer demo --quick --heads 2 --d 16 \
    --features 32 >"$T/alone.out" 2>"$T/alone.err"); rc=$?
[ $rc -eq 0 ] && grep -q "left out (data/demo-kjv.safetensors was not" "$T/alone.out" && pass ||
    fail "demo without data/: exit $rc, $(tail -n 3 "$T/alone.out") $(cat "$T/alone.err")"
# ... and given a checkpoint without a text to run it on: a usage error
(cd "$T/alone" && env -u PERFORMER_DATA bin/performer demo --quick \
    --checkpoint "$T/bad.safetensors" >/dev/null 2>"$T/err"); rc=$?
[ $rc -eq 2 ] && grep -q -- "--text FILE" "$T/err" && pass ||
    fail "demo --checkpoint without a text: exit $rc, $(cat "$T/err")"

finish
