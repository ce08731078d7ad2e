/* attn_exact.c: exact softmax attention, forward and backward, fast and reference.
 *
 *     out_i = sum_j exp(s q_i.k_j) v_j / sum_j exp(s q_i.k_j)     over visible keys j
 *
 * A key j is visible to query i when j < key_len[b] and, if causal, j <= i.
 *
 * The fast paths never form an Lq x Lk matrix: they walk key blocks with the online softmax
 * (forward) or recompute the probabilities block by block from the forward's lse (backward,
 * Dao et al. 2022), with every block product in cblas_sgemm. Work is split into (b, h, block)
 * items whose boundaries depend only on the shape; each item runs start to finish on one thread
 * and writes only its own rows, so results are bit-identical at any thread count.
 *
 * The references walk one query at a time in float64 and share no arithmetic with the fast
 * paths. */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attn_common.h"
#include "internal.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* Block sizes: BQ queries against BK keys. Scratch per thread: forward BQ*BK + BQ*dv floats,
 * backward two BQ x BK tiles (P and dP/dS), 256 KiB each: well inside a 2 MiB L2. Chosen by
 * timing B=1, H=8, L=4096, d=64 on Sapphire Rapids (64..256 x 128..1024 tried; wider key blocks
 * amortise the sgemm packing of Q and the per-row softmax bookkeeping). */
enum { BQ = 128, BK = 512 };

static int thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* Number of keys of [j0, j0 + n) visible to query i: keys j < lim(i) are visible, with
 * lim(i) = min(kl, i + 1) when causal, else kl. */
static int visible(int i, int kl, int causal, int j0, int n) {
    int lim = causal ? pf_imin(kl, i + 1) : kl;
    int c = lim - j0;
    return c < 0 ? 0 : (c > n ? n : c);
}

/* ---------------------------------------------------------------------------------------------
 * Forward, fast
 * ------------------------------------------------------------------------------------------ */

/* One query block of one head: rows [i0, i0 + bq) of out (Lq,dv) and lse (Lq).
 * Q (Lq,d), K (Lk,d), V (Lk,dv) are the head's slices. Scratch: S (BQ,BK), acc (BQ,dv),
 * M (BQ), l (BQ). */
static pf_status forward_block(float *out, float *lse, const float *Q, const float *K,
                               const float *V, int i0, int bq, int kl, int causal, int d, int dv,
                               float s, float *S, float *acc, float *M, double *l) {
    const pf_simd_table *simd = pf_simd();
    /* Keys past the block's last query are invisible to all of its rows when causal. */
    int kend = causal ? pf_imin(kl, i0 + bq) : kl;
    for (int r = 0; r < bq; r++) {
        M[r] = -INFINITY;
        l[r] = 0.0;
    }
    memset(acc, 0, sizeof(float) * (size_t)bq * (size_t)dv);

    for (int j0 = 0; j0 < kend; j0 += BK) {
        int bk = pf_imin(BK, kend - j0);
        /* S = s Q_blk K_blk^T  (bq,bk) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, bk, d, s, Q + (size_t)i0 * d, d,
                    K + (size_t)j0 * d, d, 0.0f, S, BK);
        for (int r = 0; r < bq; r++) {
            float *Sr = S + (size_t)r * BK;
            int n = visible(i0 + r, kl, causal, j0, bk);
            if (n > 0) {
                /* Online softmax: when the running max grows, everything summed so far was
                 * relative to the old max and is rescaled by exp(M_old - M_new) (0 at first). */
                float mb = simd->max(Sr, (size_t)n);
                if (mb > M[r]) {
                    float a = expf(M[r] - mb);
                    l[r] *= a;
                    float *ar = acc + (size_t)r * dv;
                    for (int c = 0; c < dv; c++) ar[c] *= a;
                    M[r] = mb;
                }
                l[r] += simd->exp_sub_sum(Sr, Sr, M[r], (size_t)n);
            }
            if (n < bk) memset(Sr + n, 0, sizeof(float) * (size_t)(bk - n));
        }
        /* acc += P V_blk  (bq,dv) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bq, dv, bk, 1.0f, S, BK,
                    V + (size_t)j0 * dv, dv, 1.0f, acc, dv);
    }

    pf_status st = PF_OK;
    for (int r = 0; r < bq; r++) {
        float *o = out + (size_t)(i0 + r) * dv;
        const float *ar = acc + (size_t)r * dv;
        if (!(l[r] > 0.0)) {
            /* No visible key: undefined. (A NaN score also lands here.) */
            memset(o, 0, sizeof(float) * (size_t)dv);
            if (lse) lse[i0 + r] = 0.0f;
            st = isfinite(M[r]) || M[r] == -INFINITY ? PF_EDOMAIN : PF_ENONFINITE;
            continue;
        }
        double inv = 1.0 / l[r];
        int bad = !isfinite(l[r]) || !isfinite(M[r]);
        for (int c = 0; c < dv; c++) {
            o[c] = (float)(ar[c] * inv);
            bad |= !isfinite(o[c]);
        }
        if (lse) lse[i0 + r] = (float)(M[r] + log(l[r]));
        if (bad) st = PF_ENONFINITE; /* scores overflowed float (inputs near FLT_MAX) */
    }
    return st;
}

pf_status pf_attn_exact(float *out, float *lse, const float *Q, const float *K, const float *V,
                        const pf_shape *shape, const pf_attn_opts *opts) {
    pf_status st = pf_attn_check(shape, opts);
    if (st != PF_OK) return st;
    if (!out || !Q || !K || !V) return PF_EINVAL;
    if (pf_attn_alias_check(shape, opts, out, lse, NULL, NULL, NULL, Q, K, V, NULL, NULL, NULL,
                            NULL, 0))
        return PF_EINVAL;
    pf_attn_sizes n = pf_attn_sizes_of(shape);
    if (pf_any_nonfinite(Q, n.q) || pf_any_nonfinite(K, n.k) || pf_any_nonfinite(V, n.v))
        return PF_ENONFINITE;

    const int B = shape->B, H = shape->H, Lq = shape->Lq, Lk = shape->Lk;
    const int d = shape->d, dv = shape->dv, causal = opts->causal;
    const float s = pf_effective_scale(opts->scale, d);
    const int nqb = (Lq + BQ - 1) / BQ;
    const int64_t items = (int64_t)B * H * nqb;
    int nt = pf_threads(opts->threads);
    if (nt > items) nt = (int)items;

    /* Per-thread scratch, each piece a multiple of 16 floats so every thread's part stays
     * 64-byte aligned: S (BQ,BK), acc (BQ,dv), M (BQ), l (BQ doubles). */
    size_t acc_n = ((size_t)BQ * dv + 15) / 16 * 16;
    size_t per = (size_t)BQ * BK + acc_n + BQ + 2 * BQ;
    float *scratch = pf_alloc((size_t)nt * per, sizeof(float));
    if (!scratch) return PF_ENOMEM;

    st = PF_OK;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
#endif
    for (int64_t t = 0; t < items; t++) {
        pf_blas_pin();
        /* Causal blocks late in the sequence cost the most: hand them out first. */
        int qb = nqb - 1 - (int)(t % nqb);
        int64_t bh = t / nqb;
        int b = (int)(bh / H);
        int i0 = qb * BQ, bq = pf_imin(BQ, Lq - i0);
        float *S = scratch + (size_t)thread_id() * per;
        float *acc = S + (size_t)BQ * BK;
        float *M = acc + acc_n;
        double *l = (double *)(M + BQ);
        float *lse_h = lse ? lse + (size_t)bh * Lq : NULL;
        pf_status sb = forward_block(out + (size_t)bh * Lq * dv, lse_h, Q + (size_t)bh * Lq * d,
                                     K + (size_t)bh * Lk * d, V + (size_t)bh * Lk * dv, i0, bq,
                                     pf_attn_key_len(opts, b, Lk), causal, d, dv, s, S, acc, M, l);
        if (sb != PF_OK) pf_status_record(&st, sb);
    }
    pf_free(scratch);
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * Forward, reference
 * ------------------------------------------------------------------------------------------ */

pf_status pf_attn_exact_ref(float *out, float *lse, const float *Q, const float *K, const float *V,
                            const pf_shape *shape, const pf_attn_opts *opts) {
    pf_status st = pf_attn_check(shape, opts);
    if (st != PF_OK) return st;
    if (!out || !Q || !K || !V) return PF_EINVAL;
    if (pf_attn_alias_check(shape, opts, out, lse, NULL, NULL, NULL, Q, K, V, NULL, NULL, NULL,
                            NULL, 0))
        return PF_EINVAL;
    pf_attn_sizes n = pf_attn_sizes_of(shape);
    if (pf_any_nonfinite(Q, n.q) || pf_any_nonfinite(K, n.k) || pf_any_nonfinite(V, n.v))
        return PF_ENONFINITE;

    const int B = shape->B, H = shape->H, Lq = shape->Lq, Lk = shape->Lk;
    const int d = shape->d, dv = shape->dv;
    const double s = (double)pf_effective_scale(opts->scale, d);
    double *sc = pf_alloc((size_t)Lk + (size_t)dv, sizeof(double)); /* scores, then the sum */
    if (!sc) return PF_ENOMEM;
    double *o = sc + Lk;

    for (int b = 0; b < B; b++) {
        int kl = opts->key_len ? opts->key_len[b] : Lk;
        for (int h = 0; h < H; h++) {
            size_t bh = (size_t)b * H + h;
            const float *Kh = K + bh * Lk * d, *Vh = V + bh * Lk * dv;
            for (int i = 0; i < Lq; i++) {
                const float *q = Q + (bh * Lq + i) * d;
                int nk = opts->causal && i + 1 < kl ? i + 1 : kl;
                /* Pass 1: scores and their max. */
                double mx = -INFINITY;
                for (int j = 0; j < nk; j++) {
                    double dot = 0.0;
                    for (int c = 0; c < d; c++) dot += (double)q[c] * Kh[(size_t)j * d + c];
                    sc[j] = s * dot;
                    if (sc[j] > mx) mx = sc[j];
                }
                /* Pass 2: exp(score - max), the sum and the weighted values. */
                double z = 0.0;
                for (int c = 0; c < dv; c++) o[c] = 0.0;
                for (int j = 0; j < nk; j++) {
                    double p = exp(sc[j] - mx);
                    z += p;
                    for (int c = 0; c < dv; c++) o[c] += p * Vh[(size_t)j * dv + c];
                }
                float *orow = out + (bh * Lq + i) * dv;
                if (nk == 0 || !(z > 0.0)) {
                    memset(orow, 0, sizeof(float) * (size_t)dv);
                    if (lse) lse[bh * Lq + i] = 0.0f;
                    st = PF_EDOMAIN;
                    continue;
                }
                int bad = !isfinite(mx);
                for (int c = 0; c < dv; c++) {
                    orow[c] = (float)(o[c] / z);
                    bad |= !isfinite(orow[c]);
                }
                if (lse) lse[bh * Lq + i] = (float)(mx + log(z));
                if (bad && st == PF_OK) st = PF_ENONFINITE;
            }
        }
    }
    pf_free(sc);
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * Backward, fast
 *
 * Forward (per head):   S = s Q K^T,  P = exp(S - lse) (masked),  out = P V.
 * With dO = dout and D_i = sum_c dO_ic out_ic (= sum_j P_ij dP_ij):
 *     dV = P^T dO,   dP = dO V^T,   dS = P * (dP - D),   dQ = s dS K,   dK = s dS^T Q.
 * Pass 1 owns query blocks (D and dQ), pass 2 owns key blocks (dK, dV); each recomputes P.
 * ------------------------------------------------------------------------------------------ */

/* P tile of rows [i0, i0 + bq) x keys [j0, j0 + bk): S holds s Q K^T (ld BK) on entry and
 * exp(S - lse_i) on visible entries, 0 elsewhere, on return. */
static void prob_tile(float *S, const float *lse, int i0, int bq, int j0, int bk, int kl,
                      int causal) {
    const pf_simd_table *simd = pf_simd();
    for (int r = 0; r < bq; r++) {
        float *Sr = S + (size_t)r * BK;
        int n = visible(i0 + r, kl, causal, j0, bk);
        if (n > 0) simd->exp_sub_sum(Sr, Sr, lse[i0 + r], (size_t)n);
        if (n < bk) memset(Sr + n, 0, sizeof(float) * (size_t)(bk - n));
    }
}

/* dS = P * (dP - D_i), in place in dP (ld BK). */
static void ds_tile(float *dP, const float *P, const float *D, int i0, int bq, int bk) {
    for (int r = 0; r < bq; r++) {
        float *a = dP + (size_t)r * BK;
        const float *p = P + (size_t)r * BK;
        float Di = D[i0 + r];
        for (int c = 0; c < bk; c++) a[c] = p[c] * (a[c] - Di);
    }
}

/* Pass 1 for query rows [i0, i0 + bq) of one head: D and dQ. */
static void backward_q_block(float *dQ, float *D, const float *dO, const float *Q, const float *K,
                             const float *V, const float *out, const float *lse, int i0, int bq,
                             int kl, int causal, int d, int dv, float s, float *P, float *dP) {
    /* D_i = dO_i . out_i, in double. */
    for (int r = 0; r < bq; r++) {
        const float *a = dO + (size_t)(i0 + r) * dv, *o = out + (size_t)(i0 + r) * dv;
        double acc = 0.0;
        for (int c = 0; c < dv; c++) acc += (double)a[c] * o[c];
        D[i0 + r] = (float)acc;
    }
    float *dQb = dQ + (size_t)i0 * d;
    memset(dQb, 0, sizeof(float) * (size_t)bq * d);
    int kend = causal ? pf_imin(kl, i0 + bq) : kl;
    for (int j0 = 0; j0 < kend; j0 += BK) {
        int bk = pf_imin(BK, kend - j0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, bk, d, s, Q + (size_t)i0 * d, d,
                    K + (size_t)j0 * d, d, 0.0f, P, BK);
        prob_tile(P, lse, i0, bq, j0, bk, kl, causal);
        /* dP = dO_blk V_blk^T  (bq,bk) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, bk, dv, 1.0f, dO + (size_t)i0 * dv,
                    dv, V + (size_t)j0 * dv, dv, 0.0f, dP, BK);
        ds_tile(dP, P, D, i0, bq, bk);
        /* dQ_blk += s dS K_blk  (bq,d) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bq, d, bk, s, dP, BK,
                    K + (size_t)j0 * d, d, 1.0f, dQb, d);
    }
}

/* Pass 2 for key rows [j0, j0 + bk) of one head: dK and dV (zero for padded keys). */
static void backward_k_block(float *dK, float *dV, const float *D, const float *dO, const float *Q,
                             const float *K, const float *V, const float *lse, int j0, int bk,
                             int Lq, int kl, int causal, int d, int dv, float s, float *P,
                             float *dP) {
    float *dKb = dK + (size_t)j0 * d, *dVb = dV + (size_t)j0 * dv;
    memset(dKb, 0, sizeof(float) * (size_t)bk * d);
    memset(dVb, 0, sizeof(float) * (size_t)bk * dv);
    int nv = pf_imin(bk, kl - j0); /* valid keys in the block; the rest stay zero */
    if (nv <= 0) return;
    /* Causal: key j is seen by queries i >= j only. */
    for (int i0 = causal ? j0 : 0; i0 < Lq; i0 += BQ) {
        int bq = pf_imin(BQ, Lq - i0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, nv, d, s, Q + (size_t)i0 * d, d,
                    K + (size_t)j0 * d, d, 0.0f, P, BK);
        prob_tile(P, lse, i0, bq, j0, nv, kl, causal);
        /* dV_blk += P^T dO_blk  (nv,dv) */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nv, dv, bq, 1.0f, P, BK,
                    dO + (size_t)i0 * dv, dv, 1.0f, dVb, dv);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, nv, dv, 1.0f, dO + (size_t)i0 * dv,
                    dv, V + (size_t)j0 * dv, dv, 0.0f, dP, BK);
        ds_tile(dP, P, D, i0, bq, nv);
        /* dK_blk += s dS^T Q_blk  (nv,d) */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nv, d, bq, s, dP, BK,
                    Q + (size_t)i0 * d, d, 1.0f, dKb, d);
    }
}

pf_status pf_attn_exact_backward(float *dQ, float *dK, float *dV, const float *dout, const float *Q,
                                 const float *K, const float *V, const float *out, const float *lse,
                                 const pf_shape *shape, const pf_attn_opts *opts) {
    pf_status st = pf_attn_check(shape, opts);
    if (st != PF_OK) return st;
    if (!dQ || !dK || !dV || !dout || !Q || !K || !V || !out || !lse) return PF_EINVAL;
    if (pf_attn_alias_check(shape, opts, NULL, NULL, dQ, dK, dV, Q, K, V, dout, out, lse, NULL, 0))
        return PF_EINVAL;
    pf_attn_sizes n = pf_attn_sizes_of(shape);
    if (pf_any_nonfinite(Q, n.q) || pf_any_nonfinite(K, n.k) || pf_any_nonfinite(V, n.v) ||
        pf_any_nonfinite(dout, n.out) || pf_any_nonfinite(out, n.out) ||
        pf_any_nonfinite(lse, n.lse))
        return PF_ENONFINITE;

    const int B = shape->B, H = shape->H, Lq = shape->Lq, Lk = shape->Lk;
    const int d = shape->d, dv = shape->dv, causal = opts->causal;
    const float s = pf_effective_scale(opts->scale, d);
    const int nqb = (Lq + BQ - 1) / BQ, nkb = (Lk + BK - 1) / BK;
    const int64_t qitems = (int64_t)B * H * nqb, kitems = (int64_t)B * H * nkb;
    int nt = pf_threads(opts->threads);
    int64_t most = qitems > kitems ? qitems : kitems;
    if (nt > most) nt = (int)most;

    size_t per = 2 * (size_t)BQ * BK; /* P and dP/dS tiles */
    float *scratch = pf_alloc((size_t)nt * per, sizeof(float));
    float *D = pf_alloc(n.lse, sizeof(float));
    if (!scratch || !D) {
        pf_free(scratch);
        pf_free(D);
        return PF_ENOMEM;
    }

#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
    {
        pf_blas_pin();
        float *P = scratch + (size_t)thread_id() * per;
        float *dP = P + (size_t)BQ * BK;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < qitems; t++) {
            int qb = nqb - 1 - (int)(t % nqb); /* heavy causal blocks first */
            int64_t bh = t / nqb;
            int b = (int)(bh / H);
            int i0 = qb * BQ;
            backward_q_block(
                dQ + (size_t)bh * Lq * d, D + (size_t)bh * Lq, dout + (size_t)bh * Lq * dv,
                Q + (size_t)bh * Lq * d, K + (size_t)bh * Lk * d, V + (size_t)bh * Lk * dv,
                out + (size_t)bh * Lq * dv, lse + (size_t)bh * Lq, i0, pf_imin(BQ, Lq - i0),
                pf_attn_key_len(opts, b, Lk), causal, d, dv, s, P, dP);
        }
        /* (implicit barrier: D is complete) */
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < kitems; t++) {
            int kb = (int)(t % nkb); /* causal: early keys are seen by the most queries */
            int64_t bh = t / nkb;
            int b = (int)(bh / H);
            int j0 = kb * BK;
            backward_k_block(dK + (size_t)bh * Lk * d, dV + (size_t)bh * Lk * dv,
                             D + (size_t)bh * Lq, dout + (size_t)bh * Lq * dv,
                             Q + (size_t)bh * Lq * d, K + (size_t)bh * Lk * d,
                             V + (size_t)bh * Lk * dv, lse + (size_t)bh * Lq, j0, pf_imin(BK, Lk - j0),
                             Lq, pf_attn_key_len(opts, b, Lk), causal, d, dv, s, P, dP);
        }
    }
    pf_free(scratch);
    pf_free(D);

    /* An lse that does not belong to these inputs can make P overflow. */
    if (pf_any_nonfinite(dQ, n.q) || pf_any_nonfinite(dK, n.k) || pf_any_nonfinite(dV, n.v))
        return PF_ENONFINITE;
    return PF_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Backward, reference: one query at a time in float64, dK and dV accumulated per head in double.
 * ------------------------------------------------------------------------------------------ */

pf_status pf_attn_exact_backward_ref(float *dQ, float *dK, float *dV, const float *dout,
                                     const float *Q, const float *K, const float *V,
                                     const pf_shape *shape, const pf_attn_opts *opts) {
    pf_status st = pf_attn_check(shape, opts);
    if (st != PF_OK) return st;
    if (!dQ || !dK || !dV || !dout || !Q || !K || !V) return PF_EINVAL;
    if (pf_attn_alias_check(shape, opts, NULL, NULL, dQ, dK, dV, Q, K, V, dout, NULL, NULL, NULL,
                            0))
        return PF_EINVAL;
    pf_attn_sizes n = pf_attn_sizes_of(shape);
    if (pf_any_nonfinite(Q, n.q) || pf_any_nonfinite(K, n.k) || pf_any_nonfinite(V, n.v) ||
        pf_any_nonfinite(dout, n.out))
        return PF_ENONFINITE;

    const int B = shape->B, H = shape->H, Lq = shape->Lq, Lk = shape->Lk;
    const int d = shape->d, dv = shape->dv;
    const double s = (double)pf_effective_scale(opts->scale, d);
    /* p (Lk), dp (Lk), dq (d), gK (Lk,d), gV (Lk,dv) */
    size_t need = 2 * (size_t)Lk + (size_t)d + (size_t)Lk * d + (size_t)Lk * dv;
    double *p = pf_alloc(need, sizeof(double));
    if (!p) return PF_ENOMEM;
    double *dp = p + Lk, *dq = dp + Lk, *gK = dq + d, *gV = gK + (size_t)Lk * d;

    for (int b = 0; b < B; b++) {
        int kl = opts->key_len ? opts->key_len[b] : Lk;
        for (int h = 0; h < H; h++) {
            size_t bh = (size_t)b * H + h;
            const float *Kh = K + bh * Lk * d, *Vh = V + bh * Lk * dv;
            memset(gK, 0, sizeof(double) * (size_t)Lk * d);
            memset(gV, 0, sizeof(double) * (size_t)Lk * dv);
            for (int i = 0; i < Lq; i++) {
                const float *q = Q + (bh * Lq + i) * d;
                const float *g = dout + (bh * Lq + i) * dv;
                int nk = opts->causal && i + 1 < kl ? i + 1 : kl;
                /* p_j = softmax_j(s q.k_j) */
                double mx = -INFINITY;
                for (int j = 0; j < nk; j++) {
                    double dot = 0.0;
                    for (int c = 0; c < d; c++) dot += (double)q[c] * Kh[(size_t)j * d + c];
                    p[j] = s * dot;
                    if (p[j] > mx) mx = p[j];
                }
                double z = 0.0;
                for (int j = 0; j < nk; j++) {
                    p[j] = exp(p[j] - mx);
                    z += p[j];
                }
                float *dqo = dQ + (bh * Lq + i) * d;
                if (nk == 0 || !(z > 0.0)) {
                    memset(dqo, 0, sizeof(float) * (size_t)d);
                    st = PF_EDOMAIN;
                    continue;
                }
                /* dp_j = g.v_j; Dsum = sum_j p_j dp_j = g.out_i */
                double Dsum = 0.0;
                for (int j = 0; j < nk; j++) {
                    p[j] /= z;
                    double a = 0.0;
                    for (int c = 0; c < dv; c++) a += (double)g[c] * Vh[(size_t)j * dv + c];
                    dp[j] = a;
                    Dsum += p[j] * a;
                }
                for (int c = 0; c < d; c++) dq[c] = 0.0;
                for (int j = 0; j < nk; j++) {
                    double ds = p[j] * (dp[j] - Dsum); /* d(score_ij) */
                    for (int c = 0; c < d; c++) {
                        dq[c] += s * ds * Kh[(size_t)j * d + c];
                        gK[(size_t)j * d + c] += s * ds * q[c];
                    }
                    for (int c = 0; c < dv; c++) gV[(size_t)j * dv + c] += p[j] * g[c];
                }
                for (int c = 0; c < d; c++) dqo[c] = (float)dq[c];
            }
            for (size_t e = 0; e < (size_t)Lk * d; e++) dK[bh * Lk * d + e] = (float)gK[e];
            for (size_t e = 0; e < (size_t)Lk * dv; e++) dV[bh * Lk * dv + e] = (float)gV[e];
        }
    }
    pf_free(p);
    if (st == PF_OK &&
        (pf_any_nonfinite(dQ, n.q) || pf_any_nonfinite(dK, n.k) || pf_any_nonfinite(dV, n.v)))
        st = PF_ENONFINITE;
    return st;
}
