"""The CUDA backward's arithmetic on the CPU: src/cuda/backward.cu step by step, its buffers laid
out as the kernels lay them and its cuBLAS calls made with the same arguments by
emulate_favor.gemm, in float64. Checked against the core library's FAVOR+ gradients
(performer.attention_grad, pf_attn_favor_backward) on every map, bidirectional and causal, with
padding, per-head W, eps > 0 on every map, lengths that are not multiples of the chunk, chunk 1
and chunks longer than L. A wrong transpose, stride, leading dimension, rebase, mask or suffix
in backward.cu shows here, without a GPU; the kernels' own code runs only on a GPU
(tests/cuda/test_cuda_backward.c).

The second part emulates half inputs: the same steps with every buffer that backward.cu keeps
in bfloat16 rounded to it where the GPU rounds it (features, [V|1] and Vs, the prefix and suffix
states, A', B', dN and dNf), inputs and dout in float16, against the float64 gradients of the
same rounded inputs (the CPU library's float32 backward, itself within ~1e-6 of float64), over many seeds at the smallest shapes (few keys and features: there the
gradient is the smallest difference of rounded terms). Its largest error is what bounds
test_cuda_backward.c's half-precision tolerance (HALF_BOUND).

    PYTHONPATH=python /usr/bin/python3 tests/cuda/emulate_backward.py
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import emulate_favor as ef  # noqa: E402
from emulate_favor import HYP, POS, RELU, TRIG, gemm  # noqa: E402

import performer  # noqa: E402

# The rounding of a buffer the GPU keeps in its product type Tc: the identity for float32 inputs,
# bfloat16 (round to nearest even) for half inputs (half_rounding sets it).
TC = None


def tc(a):
    return a if TC is None else TC(a)


def bf16(a):
    """a rounded to bfloat16, as float64."""
    a = np.asarray(a, np.float64).astype(np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)



def features_top(U, X, rows_alloc, n, valid, m, kernel, eps, s2):
    """k_features with the tops (feature_row's top_out): phi, c, top."""
    phi, c = ef.features(U, X, rows_alloc, n, valid, m, kernel, eps, s2, True)
    top = np.zeros(rows_alloc)
    for i in range(min(n, valid)):
        u = U[i * m:(i + 1) * m]
        if kernel == POS:
            t = np.float32(u.max() + 0.5 * math.log(m))
            top[i] = math.exp(u.max() - t)
        elif kernel == HYP:
            a = np.abs(u).max()
            t = np.float32(a + 0.5 * math.log(2 * m))
            top[i] = math.exp(a - t)
        elif kernel == TRIG:
            top[i] = (np.abs(np.concatenate([np.sin(u), np.cos(u)])) / math.sqrt(m)).max()
    return phi, c, top


def dnorm(O, O2, f, dout, rows_alloc, L, dv, dw):
    """k_dnorm for one head: dN and dNf = f dN (rows_alloc x dw)."""
    dn = np.zeros((rows_alloc, dw))
    O = O.reshape(rows_alloc, dw)
    tot = O if O2 is None else f[:, None] * O + O2.reshape(rows_alloc, dw)
    for i in range(L):
        den = tot[i, dv]
        out = tot[i, :dv] / den
        dn[i, :dv] = dout[i] / den
        dn[i, dv] = -float(dout[i] @ out) / den
    return dn.ravel(), (None if f is None else (f[:, None] * dn).ravel())


def fmap_bwd(dphi, phi, top, c, rows_alloc, n, m, r, kernel, eps):
    """k_fmap_bwd for one head: a (rows_alloc x m) and b (rows_alloc)."""
    A = np.zeros((rows_alloc, m))
    bco = np.zeros(rows_alloc)
    dphi = dphi.reshape(rows_alloc, r)
    phi = phi.reshape(rows_alloc, r)
    inv = 1.0 / math.sqrt(m)
    for i in range(n):
        if c is not None and c[i] == -np.inf:
            continue
        dp = dphi[i].copy()
        p = phi[i]
        sub = eps if kernel == RELU else eps * top[i]
        if eps > 0 and kernel != RELU:
            fs = int(np.argmax(np.abs(p - sub)))  # the lowest index among ties, as the warp's
            dsum = dp.sum()
            dp[fs] += eps * (-dsum if p[fs] - sub < 0 else dsum)
        g = p - sub
        if kernel == POS:
            A[i] = dp * g
            bco[i] = -A[i].sum()
        elif kernel == HYP:
            t1, t2 = dp[:m] * g[:m], dp[m:] * g[m:]
            A[i] = t1 - t2
            bco[i] = -(t1 + t2).sum()
        elif kernel == TRIG:
            A[i] = dp[:m] * g[m:] - dp[m:] * g[:m]
            bco[i] = (dp[:m] * g[:m] + dp[m:] * g[m:]).sum()
        else:
            A[i] = np.where(g > 0, dp * inv, 0.0)
    return A.ravel(), bco


def side_backward(dphi, phi, top, c, X, W, rows_alloc, n, m, r, d, kernel, eps, sqrt_s, s2):
    """side_backward: k_fmap_bwd, unproject (cuBLAS), k_dx."""
    A, bco = fmap_bwd(dphi, phi, top, c, rows_alloc, n, m, r, kernel, eps)
    T = np.zeros(rows_alloc * d)
    gemm(0, 0, d, n, m, sqrt_s, W.ravel(), d, 0, A, m, rows_alloc * m, 0.0, T, d, rows_alloc * d, 1)
    T = T.reshape(rows_alloc, d)[:n]
    return T + (s2 * bco[:n])[:, None] * X


def key_weight(c, P, M, j, rows_alloc, C):
    if c[j] == -np.inf:
        return 0.0
    ref = P[min(rows_alloc, (j // C + 1) * C) - 1] if P is not None else M
    return 1.0 if ref == c[j] else math.exp(c[j] - ref)


def head_bidirectional(Q, K, V, dout, W, m, kernel, eps, sqrt_s, klen):
    Lq, d = Q.shape
    Lk, dv = V.shape
    r = 2 * m if kernel in (HYP, TRIG) else m
    dw = (dv + 1 + 7) // 8 * 8
    s2 = float(sqrt_s) ** 2
    per = r * dw
    phk, c, topk = features_top(ef.project(K, W, m, d, sqrt_s, Lk, Lk), K, Lk, Lk, klen, m,
                                kernel, eps, s2)
    phq, _, topq = features_top(ef.project(Q, W, m, d, sqrt_s, Lq, Lq), Q, Lq, Lq, Lq, m, kernel,
                                eps, s2)
    phk, phq = tc(phk), tc(phq)
    M = c.max()
    vs = np.zeros(Lk * dw)
    for j in range(Lk):
        if c[j] > -np.inf:
            row = np.zeros(dw)
            row[:dv] = V[j]
            row[dv] = 1.0
            vs[j * dw:(j + 1) * dw] = key_weight(c, None, M, j, Lk, 1) * row
    vs = tc(vs)
    S = np.zeros(per)
    gemm(0, 1, dw, r, Lk, 1.0, vs, dw, Lk * dw, phk, r, Lk * r, 0.0, S, dw, per, 1)
    S = tc(S)
    O = np.zeros(Lq * dw)
    gemm(0, 0, dw, Lq, r, 1.0, S, dw, per, phq, r, Lq * r, 0.0, O, dw, Lq * dw, 1)
    dn = tc(dnorm(O, None, None, dout, Lq, Lq, dv, dw)[0])
    gq = np.zeros(Lq * r)
    gemm(1, 0, r, Lq, dw, 1.0, S, dw, per, dn, dw, Lq * dw, 0.0, gq, r, Lq * r, 1)
    dS = np.zeros(per)
    gemm(0, 1, dw, r, Lq, 1.0, dn, dw, Lq * dw, phq, r, Lq * r, 0.0, dS, dw, per, 1)
    dS = tc(dS)
    gk = np.zeros(Lk * r)
    gemm(1, 0, r, Lk, dw, 1.0, dS, dw, per, vs, dw, Lk * dw, 0.0, gk, r, Lk * r, 1)
    Y = np.zeros(Lk * dw)
    gemm(0, 0, dw, Lk, r, 1.0, dS, dw, per, phk, r, Lk * r, 0.0, Y, dw, Lk * dw, 1)
    Y = Y.reshape(Lk, dw)
    dV = np.array([key_weight(c, None, M, j, Lk, 1) * Y[j, :dv] for j in range(Lk)])
    dQ = side_backward(gq, phq, topq, None, Q, W, Lq, Lq, m, r, d, kernel, eps, sqrt_s, s2)
    dK = side_backward(gk, phk, topk, c, K, W, Lk, Lk, m, r, d, kernel, eps, sqrt_s, s2)
    return dQ, dK, dV


def mask(S32, P, c, Lp, C):
    """k_mask for one head."""
    out = np.zeros(Lp * C)
    for idx in range(Lp * C):
        j = idx % C
        rowg = idx // C
        i = (rowg % Lp) % C
        kj = rowg - i + j
        if j <= i and c[kj] > -np.inf:
            out[idx] = S32[idx] * math.exp(c[kj] - P[rowg])
    return out


def head_causal(Q, K, V, dout, W, m, kernel, eps, sqrt_s, klen, C):
    L, d = Q.shape
    dv = V.shape[1]
    r = 2 * m if kernel in (HYP, TRIG) else m
    dw = (dv + 1 + 7) // 8 * 8
    C = min(C, L)
    nch = (L + C - 1) // C
    Lp = nch * C
    s2 = float(sqrt_s) ** 2
    per = r * dw
    phk, c, topk = features_top(ef.project(K, W, m, d, sqrt_s, L, Lp), K, Lp, L, klen, m, kernel,
                                eps, s2)
    phq, _, topq = features_top(ef.project(Q, W, m, d, sqrt_s, L, Lp), Q, Lp, L, L, m, kernel,
                                eps, s2)
    phk, phq = tc(phk), tc(phq)
    P = np.maximum.accumulate(c)
    eref = np.array([P[t * C - 1] if t > 0 else -np.inf for t in range(nch)])
    E = np.array([P[(t + 1) * C - 1] for t in range(nch)])
    alpha = np.array([0.0 if eref[t] == -np.inf else
                      (1.0 if eref[t] == E[t] else math.exp(eref[t] - E[t])) for t in range(nch)])
    vw = np.zeros(Lp * dw)
    vs = np.zeros(Lp * dw)
    for j in range(Lp):
        if c[j] == -np.inf:
            continue
        row = np.zeros(dw)
        if j < L:
            row[:dv] = V[j]
        row[dv] = 1.0
        vw[j * dw:(j + 1) * dw] = row
        vs[j * dw:(j + 1) * dw] = key_weight(c, P, None, j, Lp, C) * row
    vw, vs = tc(vw), tc(vs)
    sC, sV, sA = C * r, C * dw, C * C
    st = np.zeros(nch * per)
    gemm(0, 1, dw, r, C, 1.0, vs, dw, sV, phk, r, sC, 0.0, st, dw, per, nch)
    Sb = np.zeros(nch * per)
    cur = np.zeros(per)
    for t in range(nch):
        Sb[t * per:(t + 1) * per] = cur
        cur = alpha[t] * cur + st[t * per:(t + 1) * per]
    Sb = tc(Sb)
    a32 = np.zeros(Lp * C)
    gemm(1, 0, C, C, r, 1.0, phk, r, sC, phq, r, sC, 0.0, a32, C, sA, nch)
    A = tc(mask(a32, P, c, Lp, C))
    O = np.zeros(Lp * dw)
    O2 = np.zeros(Lp * dw)
    gemm(0, 0, dw, C, r, 1.0, Sb, dw, per, phq, r, sC, 0.0, O, dw, sV, nch)
    gemm(0, 0, dw, C, C, 1.0, vw, dw, sV, A, C, sA, 0.0, O2, dw, sV, nch)
    f = np.array([0.0 if eref[i // C] == -np.inf else
                  (1.0 if eref[i // C] == P[i] else math.exp(eref[i // C] - P[i]))
                  for i in range(Lp)])
    dn, dnf = dnorm(O, O2, f, dout, Lp, L, dv, dw)
    dn, dnf = tc(dn), tc(dnf)
    gq = np.zeros(Lp * r)
    gemm(1, 0, r, C, dw, 1.0, Sb, dw, per, dnf, dw, sV, 0.0, gq, r, sC, nch)
    gemm(1, 0, C, C, dw, 1.0, vw, dw, sV, dn, dw, sV, 0.0, a32, C, sA, nch)
    Bm = tc(mask(a32, P, c, Lp, C))
    gemm(0, 0, r, C, C, 1.0, phk, r, sC, Bm, C, sA, 1.0, gq, r, sC, nch)
    gemm(0, 1, dw, r, C, 1.0, dnf, dw, sV, phq, r, sC, 0.0, st, dw, per, nch)
    Rb = np.zeros(nch * per)
    cur = np.zeros(per)
    for t in range(nch - 1, -1, -1):
        Rb[t * per:(t + 1) * per] = cur
        cur = alpha[t] * cur + st[t * per:(t + 1) * per]
    Rb = tc(Rb)
    gk = np.zeros(Lp * r)
    gemm(1, 0, r, C, dw, 1.0, Rb, dw, per, vs, dw, sV, 0.0, gk, r, sC, nch)
    gemm(0, 1, r, C, C, 1.0, phq, r, sC, Bm, C, sA, 1.0, gk, r, sC, nch)
    gemm(0, 0, dw, C, r, 1.0, Rb, dw, per, phk, r, sC, 0.0, O, dw, sV, nch)
    gemm(0, 1, dw, C, C, 1.0, dn, dw, sV, A, C, sA, 0.0, O2, dw, sV, nch)
    Y, Z = O.reshape(Lp, dw), O2.reshape(Lp, dw)
    dV = np.array([key_weight(c, P, None, j, Lp, C) * Y[j, :dv] + (Z[j, :dv] if c[j] > -np.inf
                                                                  else 0.0) for j in range(L)])
    dQ = side_backward(gq, phq, topq, None, Q, W, Lp, L, m, r, d, kernel, eps, sqrt_s, s2)
    dK = side_backward(gk, phk, topk, c, K, W, Lp, L, m, r, d, kernel, eps, sqrt_s, s2)
    return dQ, dK, dV


def emulate(q, k, v, dout, W, kernel, causal, key_lengths, chunk, eps, w_per_head):
    B, H, L, d = q.shape
    m = W.shape[-2]
    sqrt_s = np.float32(math.sqrt(np.float32(1.0 / math.sqrt(d))))
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in range(B):
        for h in range(H):
            Wh = (W[h] if w_per_head else W).astype(np.float64)
            kl = key_lengths[b] if key_lengths is not None else k.shape[2]
            args = (q[b, h].astype(np.float64), k[b, h].astype(np.float64),
                    v[b, h].astype(np.float64), dout[b, h].astype(np.float64), Wh, m, kernel,
                    eps, sqrt_s, kl)
            g = head_causal(*args, chunk or 128) if causal else head_bidirectional(*args)
            dq[b, h], dk[b, h], dv[b, h] = g
    return dq, dk, dv


def main():
    rng = np.random.default_rng(11)
    fails = 0
    cases = 0
    for kernel in (POS, HYP, TRIG, RELU):
        for causal in (0, 1):
            for (L, Lk, chunk, pad, wph, eps) in ((37, 29, 16, False, False, 0.0),
                                                  (50, 50, 1, True, True, 1e-3),
                                                  (20, 20, 64, True, False, 0.0),
                                                  (65, 33, 0, False, True, 1e-2)):
                if causal:
                    Lk = L
                if kernel == RELU:
                    eps = max(eps, 1e-3)
                B, H, d, dv, m = 2, 2, 8, 5, 12
                sc = 0.3 if kernel == TRIG else 0.7
                q = rng.normal(size=(B, H, L, d)).astype(np.float32) * sc
                k = rng.normal(size=(B, H, Lk, d)).astype(np.float32) * sc
                v = rng.normal(size=(B, H, Lk, dv)).astype(np.float32)
                dout = rng.normal(size=(B, H, L, dv)).astype(np.float32)
                W = rng.normal(size=(H, m, d) if wph else (m, d)).astype(np.float32)
                kl = [Lk, max(1, Lk - 7)] if pad else None
                ref = performer.attention_grad(q, k, v, dout, W=W, kernel=kernel,
                                               causal=bool(causal), key_lengths=kl, eps=eps)[1:]
                got = emulate(q, k, v, dout, W, kernel, causal, kl, chunk, eps, wph)
                errs = [np.abs(g - r).max() / np.abs(r).max() for g, r in zip(got, ref)]
                cases += 1
                ok = max(errs) < 1e-5
                fails += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {kernel:10s} causal={causal} L={L} Lk={Lk} "
                      f"chunk={chunk} pad={pad} w_per_head={wph} eps={eps}: rel err dQ "
                      f"{errs[0]:.2e} dK {errs[1]:.2e} dV {errs[2]:.2e}")
    half_fails, half_cases = half_rounding()
    print(f"emulate_backward: {cases + half_cases - fails - half_fails} passed, "
          f"{fails + half_fails} failed")
    return 1 if fails or half_fails else 0


# test_cuda_backward.c's tolerance for half-precision gradients (TOL_HALF there): normwise
# max|g - ref| / max|ref| of each of dQ, dK, dV
HALF_BOUND = 4e-2
HALF_SEEDS = 40


def half_rounding():
    """Half inputs at test_cuda_backward.c's smallest shapes (d = 16, dv = 40, m = 32; rows of
    norm 0.3..1.2, trig's 0.3 times that), HALF_SEEDS seeds each: the largest error of the
    emulated GPU rounding against float64 on the same float16 inputs must stay under
    HALF_BOUND."""
    global TC
    fails = cases = 0
    for kernel in (POS, HYP, TRIG):
        for causal, L in ((1, 7), (0, 7), (1, 64)):
            worst = np.zeros(3)
            for seed in range(HALF_SEEDS):
                rng = np.random.default_rng(1000 + seed)
                d, dv, m = 16, 40, 32
                x = [rng.normal(size=(1, 1, L, d)) for _ in range(2)]
                for a in x:
                    nrm = np.linalg.norm(a, axis=-1, keepdims=True)
                    a *= rng.uniform(0.3, 1.2, size=nrm.shape) / nrm
                    if kernel == TRIG:
                        a *= 0.3
                f16 = [np.asarray(a, np.float32).astype(np.float16).astype(np.float32)
                       for a in x + [rng.normal(size=(1, 1, L, dv)) for _ in range(2)]]
                q, k, v, dout = f16
                W = performer.projection(m, d, seed=seed).astype(np.float32)
                ref = performer.attention_grad(q.astype(np.float64), k.astype(np.float64),
                                               v.astype(np.float64), dout.astype(np.float64),
                                               W=W, kernel=kernel, causal=bool(causal))[1:]
                TC = bf16
                try:
                    got = emulate(q, k, v, dout, W, kernel, causal, None, 0, 0.0, False)
                finally:
                    TC = None
                worst = np.maximum(worst, [np.abs(g - r).max() / np.abs(r).max()
                                           for g, r in zip(got, ref)])
            cases += 1
            ok = worst.max() < HALF_BOUND
            fails += not ok
            print(f"{'ok  ' if ok else 'FAIL'} half rounding {kernel:10s} causal={causal} L={L} "
                  f"d=16 m=32, worst of {HALF_SEEDS} seeds: dQ {worst[0]:.2e} dK {worst[1]:.2e} "
                  f"dV {worst[2]:.2e} (bound {HALF_BOUND:g})")
    return fails, cases


if __name__ == "__main__":
    sys.exit(main())
