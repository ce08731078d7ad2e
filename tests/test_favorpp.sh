#!/bin/sh
# test_favorpp.sh: `performer attn --kernel oprf|sderf` (FAVOR++ and FAVOR#) against a float64
# numpy reference of their formulas, written here from the papers' definitions, with the W the
# tool drew (--save-w):
#
#   FAVOR++: phi(x) = D/sqrt(m) exp(A|w|^2 + B w.x - |x|^2/2), B = sqrt(1 - 4A),
#            D = (1 - 4A)^(d/4); A given (--oprf-a) or, bidirectional, fitted per head:
#            rho = (mean|q|^2 + mean|k|^2 + 2 mean(q).mean(k)) / d over the valid rows,
#            A* = (1 - 2 rho - sqrt((2 rho + 1)^2 + 8 rho)) / 16;
#   FAVOR#:  P = M_q + M_k + mu_q mu_k^T + mu_k mu_q^T = U diag(s) U^T, a_i = A*(s_i),
#            A = U diag(a) U^T, B = U diag(sqrt(1 - 4a)) U^T, D = prod (1 - 4a_i)^(1/4),
#            phi(x) = D/sqrt(m) exp(w^T A w + w^T B x - |x|^2/2);
#   inputs scaled by sqrt(s), s = 1/sqrt(d); out = D^-1 phi(Q) phi(K)^T V with the mask.
#
# Bidirectional and causal (FAVOR++ with a given A), padded keys, Lq != Lk, rank 2 and 4; the
# relative error of the output below 1e-4; gradients of FAVOR++ with a given A against central
# differences of the same float64 formula; and the refusals (causal without A, causal FAVOR#,
# --oprf-a with another kernel, A >= 1/8).

TEST=test_favorpp; . "$(dirname "$0")/lib.sh"
if ! $PY -c 'import numpy' 2>/dev/null; then echo "FAIL: $PY has no numpy"; exit 1; fi

cat >"$T/ref.py" <<'EOF'
"""float64 FAVOR++ / FAVOR# for test_favorpp.sh.
ref.py make DIR seed B H Lq Lk d dv sigma [len...]   inputs (and lens.npy if lengths given)
ref.py check DIR OUT W kernel causal A|fit [lens]    exit 1 unless rel err < 1e-4
ref.py grad DIR PREFIX W A causal                    gradients by central differences"""
import sys
import numpy as np

def astar(rho):
    return (1 - 2 * rho - np.sqrt((2 * rho + 1) ** 2 + 8 * rho)) / 16

def mask(Lq, Lk, causal, n):
    m = np.ones((Lq, Lk), bool)
    if causal:
        m &= np.tril(np.ones((Lq, Lk), bool))
    m[:, n:] = False
    return m

def head(q, k, v, W, kernel, causal, A, n):
    """One head in float64: q (Lq,d), k (Lk,d), the first n keys valid."""
    d, m = q.shape[1], W.shape[0]
    s = 1 / np.sqrt(d)
    q, k = q * np.sqrt(s), k * np.sqrt(s)
    kv = k[:n]
    if kernel == 'oprf':
        if A is None:
            mq, mk = q.mean(0), kv.mean(0)
            rho = ((q * q).sum(1).mean() + (kv * kv).sum(1).mean() + 2 * mq @ mk) / d
            A = astar(rho)
        Am = A * np.eye(d)
        Bm = np.sqrt(1 - 4 * A) * np.eye(d)
        logD = d / 4 * np.log(1 - 4 * A)
    else:
        Mq, Mk = q.T @ q / len(q), kv.T @ kv / n
        mq, mk = q.mean(0), kv.mean(0)
        Pm = Mq + Mk + np.outer(mq, mk) + np.outer(mk, mq)
        sig, U = np.linalg.eigh(Pm)
        a = astar(sig)
        Am = U @ np.diag(a) @ U.T
        Bm = U @ np.diag(np.sqrt(1 - 4 * a)) @ U.T
        logD = np.log(1 - 4 * a).sum() / 4
    quad = np.einsum('id,de,ie->i', W, Am, W)
    def phi(x):
        return np.exp(logD + quad[None, :] + x @ Bm.T @ W.T - (x * x).sum(1, keepdims=True) / 2
                      ) / np.sqrt(m)
    S = phi(q) @ phi(k).T
    S = np.where(mask(len(q), len(k), causal, n), S, 0)
    return (S @ v) / S.sum(1, keepdims=True)

def forward(q, k, v, W, kernel, causal, A, lens):
    q4 = q.reshape((1,) * (4 - q.ndim) + q.shape)
    k4 = k.reshape((1,) * (4 - k.ndim) + k.shape)
    v4 = v.reshape((1,) * (4 - v.ndim) + v.shape)
    B, H = q4.shape[:2]
    out = np.zeros(q4.shape[:3] + (v4.shape[3],))
    for b in range(B):
        n = k4.shape[2] if lens is None else int(lens[b])
        for h in range(H):
            out[b, h] = head(q4[b, h], k4[b, h], v4[b, h], W, kernel, causal, A, n)
    return out.reshape(q.shape[:-1] + (v.shape[-1],))

def main():
    cmd, a = sys.argv[1], sys.argv[2:]
    if cmd == 'make':
        dr, seed, B, H, Lq, Lk, d, dv = a[0], *map(int, a[1:8])
        sigma = float(a[8])
        g = np.random.default_rng(seed)
        shape = lambda L, w: ((B, H) if B else ()) + (L, w)
        # anisotropic queries and keys (a random linear map) with a common mean: where FAVOR#
        # differs from FAVOR++
        M = np.eye(d) + 0.5 * g.standard_normal((d, d)) / np.sqrt(d)
        mu = 0.3 * g.standard_normal(d)
        for name, L, w in (('q', Lq, d), ('k', Lk, d), ('v', Lk, dv)):
            x = g.standard_normal(shape(L, w))
            if name != 'v':
                x = sigma * (x @ M.T + mu)
            np.save(f'{dr}/{name}.npy', x.astype('<f4'))
        if len(a) > 9:
            np.save(f'{dr}/lens.npy', np.array([int(x) for x in a[9:]], dtype='<i4'))
    elif cmd == 'check':
        dr, out, W, kernel, causal, A = a[:6]
        lens = np.load(a[6]) if len(a) > 6 else None
        q, k, v = (np.load(f'{dr}/{n}.npy').astype(np.float64) for n in 'qkv')
        ref = forward(q, k, v, np.load(W).astype(np.float64), kernel, causal == '1',
                      None if A == 'fit' else float(A), lens)
        got = np.load(out)
        if got.shape != ref.shape or got.dtype != np.float32:
            print('output shape %s dtype %s, expected %s' % (got.shape, got.dtype, ref.shape))
            sys.exit(1)
        e = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        print('%s rel err %.3g' % (kernel, e))
        sys.exit(0 if e < 1e-4 else 1)
    elif cmd == 'grad':
        dr, prefix, W, A, causal = a[0], a[1], np.load(a[2]).astype(np.float64), float(a[3]), a[4] == '1'
        q, k, v, do = (np.load(f'{dr}/{n}.npy').astype(np.float64) for n in ('q', 'k', 'v', 'do'))
        worst = 0
        for t, name in enumerate(('dq', 'dk', 'dv')):
            got = np.load(f'{prefix}.{name}.npy').astype(np.float64)
            xs = [q, k, v]
            ref = np.zeros_like(xs[t])
            for idx in np.ndindex(*ref.shape):
                h = 1e-6
                xp = [x.copy() for x in xs]; xp[t][idx] += h
                xm = [x.copy() for x in xs]; xm[t][idx] -= h
                fp = (forward(*xp, W, 'oprf', causal, A, None) * do).sum()
                fm = (forward(*xm, W, 'oprf', causal, A, None) * do).sum()
                ref[idx] = (fp - fm) / (2 * h)
            e = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            worst = max(worst, e)
        print('oprf gradient rel err %.3g' % worst)
        sys.exit(0 if worst < 1e-4 else 1)

main()
EOF

# run "what" args...: the tool succeeds
run() {
    what=$1; shift
    if "$P" attn "$@" 2>"$T/err" >/dev/null; then return 0; fi
    fail "$what: $(cat "$T/err")"
    return 1
}
ref() { # ref "what" args...: the reference agrees
    what=$1; shift
    if $PY "$T/ref.py" "$@" >"$T/ref.out" 2>&1; then pass; else fail "$what: $(cat "$T/ref.out")"; fi
}

D=$T/in
mkdir "$D"
IN="--q $D/q.npy --k $D/k.npy --v $D/v.npy"
# batch of 2, 3 heads, Lq 20, Lk 24 (cross attention), padded keys
$PY "$T/ref.py" make "$D" 1 2 3 20 24 16 8 1.0 24 17
for kern in oprf sderf favor++ favor#; do
    case $kern in favor++) name=oprf ;; favor#) name=sderf ;; *) name=$kern ;; esac
    run "$kern bidirectional" $IN --out "$T/o.npy" --kernel $kern --features 64 --save-w "$T/w.npy" \
        --key-lengths "$D/lens.npy" &&
        ref "$kern bidirectional, padded, Lq != Lk" check "$D" "$T/o.npy" "$T/w.npy" $name 0 fit \
            "$D/lens.npy"
done
run "oprf with A" $IN --out "$T/o.npy" --kernel oprf --oprf-a -0.1 --features 64 \
    --save-w "$T/w.npy" && ref "oprf with a given A" check "$D" "$T/o.npy" "$T/w.npy" oprf 0 -0.1
# causal: Lq = Lk, FAVOR++ with a given A, padded, one W per call; rank 4 and rank 2
$PY "$T/ref.py" make "$D" 2 2 2 33 33 16 8 1.0 33 20
for A in -0.05 0 -0.3; do
    run "oprf causal A=$A" $IN --out "$T/o.npy" --kernel oprf --oprf-a $A --causal \
        --features 32 --save-w "$T/w.npy" --key-lengths "$D/lens.npy" &&
        ref "oprf causal, A = $A, padded" check "$D" "$T/o.npy" "$T/w.npy" oprf 1 $A "$D/lens.npy"
done
$PY "$T/ref.py" make "$D" 3 0 0 40 40 8 4 1.5
run "oprf causal rank 2" $IN --out "$T/o.npy" --kernel oprf --oprf-a -0.2 --causal --chunk 8 \
    --features 16 --save-w "$T/w.npy" &&
    ref "oprf causal, rank 2, chunk 8" check "$D" "$T/o.npy" "$T/w.npy" oprf 1 -0.2
run "sderf rank 2" $IN --out "$T/o.npy" --kernel sderf --features 16 --save-w "$T/w.npy" &&
    ref "sderf rank 2" check "$D" "$T/o.npy" "$T/w.npy" sderf 0 fit

# gradients of FAVOR++ with a given A (a constant: no gradient flows into it)
$PY "$T/ref.py" make "$D" 4 0 0 6 6 4 3 0.8
$PY -c "import numpy as n; n.save('$D/do.npy', n.random.default_rng(5).standard_normal((6, 3)).astype('<f4'))"
for c in 0 1; do
    flag=; [ $c -eq 1 ] && flag=--causal
    # shellcheck disable=SC2086
    run "oprf gradients causal=$c" $IN --out "$T/o.npy" --kernel oprf --oprf-a -0.1 $flag \
        --features 8 --save-w "$T/w.npy" --grad-out "$D/do.npy" --grad-prefix "$T/g" &&
        ref "oprf gradients, causal=$c" grad "$D" "$T/g" "$T/w.npy" -0.1 $c
done

# refusals: a clear message, exit 2, no output
refuse() {
    what=$1; key=$2; shift 2
    rm -f "$T/r.npy"
    "$P" attn $IN --out "$T/r.npy" "$@" 2>"$T/err" >/dev/null
    rc=$?
    if [ $rc -ne 2 ]; then fail "$what: exit $rc, expected 2: $(cat "$T/err")"
    elif ! grep -q -- "$key" "$T/err"; then fail "$what: message lacks '$key': $(cat "$T/err")"
    elif [ -e "$T/r.npy" ]; then fail "$what: output written"
    else pass; fi
}
refuse "oprf causal without A" "needs --oprf-a" --kernel oprf --causal
refuse "sderf causal" "bidirectional only" --kernel sderf --causal
refuse "--oprf-a with positive" "--kernel oprf only" --oprf-a -0.1
refuse "--oprf-a 0.125" "below 1/8" --kernel oprf --oprf-a 0.125
refuse "--oprf-a 1" "--oprf-a" --kernel oprf --oprf-a 1
refuse "--oprf-a nan" "--oprf-a" --kernel oprf --oprf-a nan
refuse "--oprf-a with exact" "does not use it" --method exact --oprf-a -0.1

finish
