"""The CUDA forward's arithmetic on the CPU: src/cuda/favor.cu step by step, with its buffers laid
out as the kernels lay them (flat arrays, the same index formulas) and its cuBLAS calls made by a
column-major strided-batched product with the same arguments, in float64. Checked against the
core library's pf_attn_favor (through the numpy package) on every map, bidirectional and causal,
with padding, per-head W, lengths that are not multiples of the chunk, chunk 1 and chunks longer
than L. A wrong transpose, stride, leading dimension, chunk reference or mask in favor.cu shows
here, without a GPU. (The kernels' own code runs only on a GPU: tests/cuda/test_cuda.c.)

    PYTHONPATH=python /usr/bin/python3 tests/cuda/emulate_favor.py
"""
import math
import sys

import numpy as np

import performer

POS, HYP, TRIG, RELU = "positive", "hyperbolic", "trig", "relu"


def gemm(ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch):
    """cublasGemmStridedBatchedEx, column-major: C_b = alpha op(A_b) op(B_b) + beta C_b."""
    for b in range(batch):
        a = A[b * sa:]
        bb = B[b * sb:]
        # op(A) is M x K: element (i, k) at i + k lda (N) or k + i lda (T)
        i, k = np.meshgrid(np.arange(M), np.arange(K), indexing="ij")
        Am = a[i + k * lda] if not ta else a[k + i * lda]
        k2, j = np.meshgrid(np.arange(K), np.arange(N), indexing="ij")
        Bm = bb[k2 + j * ldb] if not tb else bb[j + k2 * ldb]
        ci, cj = np.meshgrid(np.arange(M), np.arange(N), indexing="ij")
        idx = b * sc + ci + cj * ldc
        C[idx] = alpha * (Am @ Bm) + (beta * C[idx] if beta else 0.0)


def features(U, X, rows_alloc, n, valid, m, kernel, eps, s2, want_c):
    """k_features for one head: U (rows_alloc*m), X (n, d) -> phi (rows_alloc, r), c."""
    r = 2 * m if kernel in (HYP, TRIG) else m
    lnr = 0.5 * math.log(2 * m if kernel == HYP else m)
    inv = 1.0 / math.sqrt(m)
    phi = np.zeros((rows_alloc, r))
    c = np.full(rows_alloc, -np.inf)
    for i in range(min(n, valid)):
        u = U[i * m:(i + 1) * m]
        h = 0.5 * s2 * float(np.sum(X[i].astype(np.float64) ** 2))
        if kernel == POS:
            t = np.float32(u.max() + lnr)
            p = np.exp(u - t)
            top = math.exp(u.max() - t)
            phi[i] = p + eps * top
            c[i] = t - lnr - h
        elif kernel == HYP:
            a = np.abs(u).max()
            t = np.float32(a + lnr)
            top = math.exp(a - t)
            phi[i] = np.concatenate([np.exp(u - t), np.exp(-u - t)]) + eps * top
            c[i] = t - lnr - h
        elif kernel == TRIG:
            p = np.concatenate([np.sin(u), np.cos(u)]) * inv
            phi[i] = p + eps * np.abs(p).max()
            c[i] = h
        else:
            phi[i] = np.maximum(u, 0) * inv + eps
            c[i] = 0.0
    return phi.ravel(), (c if want_c else None)


def project(X, W, m, d, sqrt_s, n, ldrows):
    U = np.zeros(ldrows * m)
    gemm(1, 0, m, n, d, sqrt_s, W.ravel(), d, 0, X.ravel(), d, n * d, 0.0, U, m, ldrows * m, 1)
    return U


def head_bidirectional(Q, K, V, W, m, kernel, eps, sqrt_s, klen):
    Lq, d = Q.shape
    Lk, dv = V.shape
    r = 2 * m if kernel in (HYP, TRIG) else m
    dw = (dv + 1 + 7) // 8 * 8
    s2 = float(sqrt_s) ** 2
    U = project(K, W, m, d, sqrt_s, Lk, Lk)
    phk, c = features(U, K, Lk, Lk, klen, m, kernel, eps, s2, True)
    M = c.max()
    vs = np.zeros(Lk * dw)
    for j in range(Lk):
        w = 0.0 if c[j] == -np.inf else math.exp(c[j] - M)
        row = np.zeros(dw)
        if c[j] > -np.inf:
            row[:dv] = V[j]
        row[dv] = 1.0
        vs[j * dw:(j + 1) * dw] = w * row
    S = np.zeros(r * dw)
    gemm(0, 1, dw, r, Lk, 1.0, vs, dw, 0, phk, r, 0, 0.0, S, dw, 0, 1)
    U = project(Q, W, m, d, sqrt_s, Lq, Lq)
    phq, _ = features(U, Q, Lq, Lq, Lq, m, kernel, eps, s2, False)
    O = np.zeros(Lq * dw)
    gemm(0, 0, dw, Lq, r, 1.0, S, dw, 0, phq, r, 0, 0.0, O, dw, 0, 1)
    O = O.reshape(Lq, dw)
    return O[:, :dv] * (1.0 / O[:, dv:dv + 1])


def head_causal(Q, K, V, W, m, kernel, eps, sqrt_s, klen, C):
    L, d = Q.shape
    dv = V.shape[1]
    r = 2 * m if kernel in (HYP, TRIG) else m
    dw = (dv + 1 + 7) // 8 * 8
    C = min(C, L)
    nch = (L + C - 1) // C
    Lp = nch * C
    s2 = float(sqrt_s) ** 2
    U = project(K, W, m, d, sqrt_s, L, Lp)
    phk, c = features(U, K, Lp, L, klen, m, kernel, eps, s2, True)
    P = np.maximum.accumulate(c)
    eref = np.array([P[t * C - 1] if t > 0 else -np.inf for t in range(nch)])
    alpha = np.array([0.0 if eref[t] == -np.inf else
                      (1.0 if eref[t] == P[(t + 1) * C - 1] else math.exp(eref[t] - P[(t + 1) * C - 1]))
                      for t in range(nch)])
    U = project(Q, W, m, d, sqrt_s, L, Lp)
    phq, _ = features(U, Q, Lp, L, L, m, kernel, eps, s2, False)
    vw = np.zeros(Lp * dw)
    vs = np.zeros(Lp * dw)
    for j in range(Lp):
        if c[j] == -np.inf:
            continue
        tend = min(Lp, (j // C + 1) * C) - 1
        row = np.zeros(dw)
        if j < L:
            row[:dv] = V[j]
        row[dv] = 1.0
        vw[j * dw:(j + 1) * dw] = row
        vs[j * dw:(j + 1) * dw] = math.exp(c[j] - P[tend]) * row
    per = r * dw
    dS = np.zeros(nch * per)
    gemm(0, 1, dw, r, C, 1.0, vs, dw, C * dw, phk, r, C * r, 0.0, dS, dw, per, nch)
    Sb = np.zeros(nch * per)
    cur = np.zeros(per)
    for t in range(nch):
        Sb[t * per:(t + 1) * per] = cur
        cur = alpha[t] * cur + dS[t * per:(t + 1) * per]
    A32 = np.zeros(Lp * C)
    gemm(1, 0, C, C, r, 1.0, phk, r, C * r, phq, r, C * r, 0.0, A32, C, C * C, nch)
    A = np.zeros(Lp * C)
    for idx in range(Lp * C):
        j = idx % C
        rowg = idx // C
        i = (rowg % Lp) % C
        kj = rowg - i + j
        if j <= i and c[kj] > -np.inf:
            A[idx] = A32[idx] * math.exp(c[kj] - P[rowg])
    O = np.zeros(Lp * dw)
    O2 = np.zeros(Lp * dw)
    gemm(0, 0, dw, C, r, 1.0, Sb, dw, per, phq, r, C * r, 0.0, O, dw, C * dw, nch)
    gemm(0, 0, dw, C, C, 1.0, vw, dw, C * dw, A, C, C * C, 0.0, O2, dw, C * dw, nch)
    # k_normalise: the state term rebased to the row's reference, plus the chunk's own keys
    f = np.array([0.0 if eref[i // C] == -np.inf else math.exp(eref[i // C] - P[i])
                  for i in range(Lp)])
    O = (f[:, None] * O.reshape(Lp, dw) + O2.reshape(Lp, dw))[:L]
    return O[:, :dv] * (1.0 / O[:, dv:dv + 1])


def emulate(q, k, v, W, kernel, causal, key_lengths, chunk, eps, w_per_head):
    B, H, L, d = q.shape
    m = W.shape[-2]
    sqrt_s = np.float32(math.sqrt(np.float32(1.0 / math.sqrt(d))))
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for b in range(B):
        for h in range(H):
            Wh = (W[h] if w_per_head else W).astype(np.float64)
            kl = key_lengths[b] if key_lengths is not None else k.shape[2]
            args = (q[b, h].astype(np.float64), k[b, h].astype(np.float64),
                    v[b, h].astype(np.float64), Wh, m, kernel, eps, sqrt_s, kl)
            out[b, h] = head_causal(*args, chunk or 128) if causal else head_bidirectional(*args)
    return out


def main():
    rng = np.random.default_rng(7)
    fails = 0
    cases = 0
    for kernel in (POS, HYP, TRIG, RELU):
        for causal in (0, 1):
            for (L, Lk, chunk, pad, wph) in ((37, 29, 16, False, False), (50, 50, 1, True, True),
                                             (20, 20, 64, True, False), (65, 33, 0, False, True)):
                if causal:
                    Lk = L
                B, H, d, dv, m = 2, 2, 8, 5, 12
                # trig's features can be negative and its denominators small: inputs of small
                # norm keep it well conditioned, as the core library's own tests do
                sc = 0.3 if kernel == TRIG else 0.7
                q = rng.normal(size=(B, H, L, d)).astype(np.float32) * sc
                k = rng.normal(size=(B, H, Lk, d)).astype(np.float32) * sc
                v = rng.normal(size=(B, H, Lk, dv)).astype(np.float32)
                W = rng.normal(size=(H, m, d) if wph else (m, d)).astype(np.float32)
                kl = [Lk, max(1, Lk - 7)] if pad else None
                eps = 1e-3 if kernel == RELU else 0.0
                ref = performer.attention(q, k, v, W=W, kernel=kernel, causal=bool(causal),
                                          key_lengths=kl, eps=eps)
                got = emulate(q, k, v, W, kernel, causal, kl, chunk, eps, wph)
                err = np.abs(got - ref).max() / np.abs(ref).max()
                cases += 1
                ok = err < 1e-5
                fails += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {kernel:10s} causal={causal} L={L} Lk={Lk} "
                      f"chunk={chunk} pad={pad} w_per_head={wph}: rel err {err:.2e}")
    print(f"emulate_favor: {cases - fails} passed, {fails} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
