/* scan.c: the row-block toolkit every FAVOR+ pass runs (the forward, the backward's recompute,
 * the decoding state and the slices): [V | 1] weighted by the key factors, the readout
 * D^-1 (numerator), a block of keys into a state K~^T [V | 1] with its reference, the rebasing and
 * combining of states, a block of queries against a state, and the causal chunk
 * (pf_favor_causal_rows) that walks a sequence chunk by chunk.
 *
 * Stabilisation. phi(x) = phi~(x) exp(c(x)) with phi~ = O(1) (see favor.h). out_i is unchanged by
 * a positive factor on query i's features, so a query's c simply drops. Key factors exp(c_j)
 * differ per key and are kept relative to a reference M >= c_j: key j enters as
 * phi~_j exp(c_j - M) <= phi~_j, and when M grows the accumulated state is rescaled by
 * exp(M_old - M_new) <= 1. Nothing overflows whatever the input norms. */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_common.h"
#include "favor.h"

/* ---- blocks of rows ------------------------------------------------------------------------ */

int pf_favor_dw(int dv) {
    return (dv + 1 + 15) / 16 * 16;
}

PF_CLONES int pf_favor_weighted_values(float *dst, int dw, const float *V, int dv, const double *c,
                                       const double *ref, double ref0, int n) {
    for (int j = 0; j < n; j++) {
        const float w = (float)exp(c[j] - (ref ? ref[j] : ref0));
        const float *v = V + (size_t)j * (size_t)dv;
        float *row = dst + (size_t)j * (size_t)dw;
#pragma omp simd
        for (int k = 0; k < dv; k++) row[k] = w * v[k];
        row[dv] = w;
        for (int k = dv + 1; k < dw; k++) row[k] = 0.0f;
    }
    return pf_nonfinite_f32(V, (size_t)n * (size_t)dv);
}

/* (favor.h) */
PF_CLONES pf_status pf_favor_readout(float *out, const float *o, int n, int dv) {
    pf_status st = PF_OK;
    const int dw = pf_favor_dw(dv);
    int any = 0; /* a row to look at again */
    for (int i = 0; i < n; i++) {
        const float *restrict row = o + (size_t)i * (size_t)dw;
        float *restrict dst = out + (size_t)i * (size_t)dv;
        const float inv = 1.0f / row[dv];
        any |= !(inv * 0.0f == 0.0f) || !(row[dv] * 0.0f == 0.0f);
        /* x * 0 is 0 for finite x, NaN otherwise: z tells a non-finite output in the same pass */
        float z = 0.0f;
#pragma omp simd reduction(+ : z)
        for (int k = 0; k < dv; k++) {
            const float y = row[k] * inv + 0.0f;
            dst[k] = y;
            z += y * 0.0f;
        }
        any |= z != 0.0f;
    }
    for (int i = 0; any && i < n; i++) {
        const float *row = o + (size_t)i * (size_t)dw;
        float *dst = out + (size_t)i * (size_t)dv;
        const float den = row[dv];
        pf_status bad = pf_favor_den_status(den);
        if (bad == PF_OK && (!isfinite(1.0f / den) || pf_nonfinite_f32(dst, (size_t)dv)))
            bad = PF_ENONFINITE;
        if (bad != PF_OK) {
            memset(dst, 0, sizeof(float) * (size_t)dv);
            if (bad > st) st = bad;
        }
    }
    return st;
}

/* pf_favor_readout of a block's ws->o into rows [row0, row0 + n) of out, through ws->xo when ws
 * writes half-precision rows (rounded once, to nearest even). */
static pf_status pf_favor_readout_rows(pf_favor_ws *ws, void *out, size_t row0, int n, int dv) {
    if (ws->dt == PF_F32) return pf_favor_readout((float *)out + row0 * (size_t)dv, ws->o, n, dv);
    const pf_status st = pf_favor_readout(ws->xo, ws->o, n, dv);
    pf_rows_from_f32((char *)out + row0 * (size_t)dv * 2, ws->dt, ws->xo, (size_t)n * (size_t)dv);
    return st;
}

int pf_favor_scan_blocks(int L, int heads, int C, int *len) {
    return pf_favor_split(L, heads, SCAN_UNIT * pf_favor_block(1, C), SCAN_SPLIT, len);
}

int pf_favor_bidir_blocks(int L, int heads, int *len) {
    return pf_favor_split(L, heads, FAVOR_BLOCK, FAVOR_SPLIT, len);
}

int pf_favor_split(int L, int heads, int unit, int target, int *len) {
    const int units = (L + unit - 1) / unit;
    int want = (target + heads - 1) / heads;
    want = want < 1 ? 1 : (want > units ? units : want);
    *len = (units + want - 1) / want * unit;
    return (L + *len - 1) / *len;
}

/* n rows of r floats from src (row stride lds) to dst (contiguous), with stores that bypass the
 * cache: the features a forward keeps for its backward are written once and not read again
 * until the backward, so a plain store would first read each line from memory. */
static void keep_rows(float *dst, const float *src, int lds, int n, int r) {
    pf_simd()->stream_rows(dst, src, (size_t)lds, (size_t)n, (size_t)r);
}

pf_status pf_favor_key_block(const pf_fmap *fm, pf_favor_ws *ws, float *KVb, double *Mb,
                             const void *K, const void *V, int n, int dv, float *kst, double *kc,
                             float *kamax) {
    const int r = fm->r, d = fm->d, dv1 = pf_favor_dw(dv);
    double M = -INFINITY;
    /* The sum is made transposed, T = [V | 1]_w^T K~ ((dv + 1) x r, in ws->state), and turned
     * round at the end: each element is the same chain of multiply-adds over the keys as in
     * K~^T [V | 1]_w (a product's two factors commute exactly), but the ones column is one more
     * row of T's register tiles instead of a column done apart in a second pass over K~. */
    float *T = ws->state;
    memset(T, 0, sizeof(float) * (size_t)(dv + 1) * (size_t)r);
    for (int j0 = 0; j0 < n; j0 += FAVOR_BLOCK) {
        const int nb = n - j0 < FAVOR_BLOCK ? n - j0 : FAVOR_BLOCK;
        const float *Vb = pf_favor_rows(ws, V, (size_t)j0, (size_t)nb, (size_t)dv, ws->xv);
        const float *Kb = pf_favor_rows(ws, K, (size_t)j0, (size_t)nb, (size_t)d, ws->xk);
        float *phi = ws->phi;
        double *c = kc ? kc + j0 : ws->c;
        /* (K rows are checked by pf_fmap_rows, V rows by pf_favor_weighted_values) */
        pf_status st = pf_fmap_rows(fm, phi, r, c, kamax ? kamax + j0 : NULL, Kb, nb);
        if (st != PF_OK) return st;
        if (kst) keep_rows(kst + (size_t)j0 * (size_t)r, phi, r, nb, r);
        const float beta = pf_favor_rebase(&M, c, nb);
        if (pf_favor_weighted_values(ws->vaug, dv1, Vb, dv, c, NULL, M, nb)) return PF_ENONFINITE;
        /* T = beta T + [V | 1]_w^T K~   ((dv + 1) x r) */
        pf_mm(1, 0, dv + 1, r, nb, 1.0f, ws->vaug, dv1, phi, r, beta, T, r);
    }
    /* KV = T^T, the columns after the ones column zero; 16 rows of KV at a time, so that T is
     * read a line at a time and the 16 rows written stay in L1 */
    for (int f0 = 0; f0 < r; f0 += 16) {
        const int f1 = r - f0 < 16 ? r : f0 + 16;
        for (int k = 0; k <= dv; k++)
            for (int f = f0; f < f1; f++)
                KVb[(size_t)f * (size_t)dv1 + (size_t)k] = T[(size_t)k * (size_t)r + (size_t)f];
        for (int f = f0; f < f1; f++)
            for (int k = dv + 1; k < dv1; k++) KVb[(size_t)f * (size_t)dv1 + (size_t)k] = 0.0f;
    }
    *Mb = M;
    return PF_OK;
}

float pf_favor_rebase(double *M, const double *c, int n) {
    double cb = -INFINITY;
    for (int j = 0; j < n; j++) cb = c[j] > cb ? c[j] : cb;
    if (!(cb > *M)) return 1.0f;
    const float beta = *M == -INFINITY ? 0.0f : (float)exp(*M - cb);
    *M = cb;
    return beta;
}

void pf_favor_combine(float *S, double *M, const float *S2, double M2, size_t n) {
    if (M2 == -INFINITY) return;
    if (*M == -INFINITY) {
        memcpy(S, S2, sizeof(float) * n);
        *M = M2;
        return;
    }
    const double Mn = *M > M2 ? *M : M2;
    const float a = (float)exp(*M - Mn), b = (float)exp(M2 - Mn);
    for (size_t i = 0; i < n; i++) S[i] = a * S[i] + b * S2[i];
    *M = Mn;
}

/* (favor.h) */
pf_status pf_favor_query_block(const pf_fmap *fm, pf_favor_ws *ws, void *out, const void *Q,
                               const float *KV, int n, int dv, float *qf, float *qamax) {
    const int r = fm->r, d = fm->d, dv1 = pf_favor_dw(dv);
    pf_status st = PF_OK;
    for (int i0 = 0; i0 < n; i0 += FAVOR_BLOCK) {
        const int nb = n - i0 < FAVOR_BLOCK ? n - i0 : FAVOR_BLOCK;
        float *phi = ws->phi;
        pf_status s1 = pf_fmap_rows(fm, phi, r, ws->cq, qf ? qamax + i0 : NULL,
                                    pf_favor_rows(ws, Q, (size_t)i0, (size_t)nb, (size_t)d, ws->xq),
                                    nb);
        if (s1 != PF_OK) return s1;
        if (qf) keep_rows(qf + (size_t)i0 * (size_t)r, phi, r, nb, r);
        /* O = Q~ KV   (nb x (dv + 1)) */
        pf_mm(0, 0, nb, dv + 1, r, 1.0f, phi, r, KV, dv1, 0.0f, ws->o, dv1);
        st = pf_status_worse(st, pf_favor_readout_rows(ws, out, (size_t)i0, nb, dv));
    }
    return st;
}

/* The causal chunk's two weightings of [V | 1] in one pass over V: dst1 row j
 * e^(c_j - ref1_j) [v_j | 1], dst2 row j e^(c_j - ref2) [v_j | 1] (the arithmetic of
 * pf_favor_weighted_values for each; V is checked by the caller). */
PF_CLONES void pf_favor_weighted_values2(float *dst1, float *dst2, int dw, const float *V, int dv,
                                         const double *c, const double *ref1, double ref2, int n) {
    for (int j = 0; j < n; j++) {
        const float w1 = (float)exp(c[j] - ref1[j]);
        const float w2 = c[j] - ref1[j] == c[j] - ref2 ? w1 : (float)exp(c[j] - ref2);
        const float *v = V + (size_t)j * (size_t)dv;
        float *row1 = dst1 + (size_t)j * (size_t)dw, *row2 = dst2 + (size_t)j * (size_t)dw;
#pragma omp simd
        for (int k = 0; k < dv; k++) {
            row1[k] = w1 * v[k];
            row2[k] = w2 * v[k];
        }
        row1[dv] = w1;
        row2[dv] = w2;
        for (int k = dv + 1; k < dw; k++) row1[k] = row2[k] = 0.0f;
    }
}

/* ---- the causal chunk's stages (pf_favor_causal_rows runs them in this order; profile_favor
 * times each) ------------------------------------------------------------------------------ */

void pf_favor_chunk_prefix(double *P, const double *ck, int n, int nk, double M) {
    double run = M;
    for (int j = 0; j < n; j++) {
        if (j < nk && ck[j] > run) run = ck[j];
        P[j] = run;
    }
}

void pf_favor_chunk_scores(float *A, int ldq, const float *Qc, const float *Kc, int r, int n,
                           int nk) {
    /* only the lower part, in strips of A_STRIP rows (each element's bits do not depend on the
     * product's shape); pf_favor_chunk_mask zeroes the rest */
    for (int i0 = 0; i0 < n; i0 += A_STRIP) {
        const int mi = n - i0 < A_STRIP ? n - i0 : A_STRIP;
        const int nj = i0 + mi < nk ? i0 + mi : nk;
        if (nj > 0)
            pf_mm(0, 1, mi, nj, r, 1.0f, Qc + (size_t)i0 * (size_t)ldq, ldq, Kc, r, 0.0f,
                  A + (size_t)i0 * (size_t)ldq, ldq);
    }
}

void pf_favor_chunk_mask(float *A, int ldq, const double *P, int n, int nk) {
    for (int i = 0; i < n; i++) {
        float *row = A + (size_t)i * (size_t)ldq;
        const int jmax = i < nk - 1 ? i : nk - 1;
        for (int j = 0; j <= jmax; j++) {
            if (P[j] != P[i]) row[j] *= (float)exp(P[j] - P[i]);
        }
        for (int j = jmax + 1; j < nk; j++) row[j] = 0.0f;
    }
}

void pf_favor_chunk_qscale(float *Qc, int ldq, int r, const double *P, int n, double M) {
    for (int i = 0; i < n; i++) {
        if (P[i] == M) continue;
        const float f = (float)exp(M - P[i]);
        float *row = Qc + (size_t)i * (size_t)ldq;
        for (int k = 0; k < r; k++) row[k] *= f;
    }
}

void pf_favor_chunk_out(float *O, int ldo, const float *Qc, int ldq, const float *S,
                        const float *Vw, int r, int n, int nk, int dv, int have_state) {
    /* [e^(M-P) Q~ | A] is Qc's row (A follows Q~ in it), [S ; Vw] is S's rows then Vw's */
    const int kdim = (have_state ? r : 0) + nk;
    pf_mm(0, 0, n, dv + 1, kdim, 1.0f, have_state ? Qc : Qc + r, ldq, have_state ? S : Vw, ldo,
          0.0f, O, ldo);
}

void pf_favor_chunk_state(float *S, int lds, const float *Kc, int r, const float *vs, int nk,
                          int dv, float beta) {
    pf_mm(1, 0, r, dv + 1, nk, 1.0f, Kc, r, vs, lds, beta, S, lds);
}

/* Causal, in chunks of C rows with a state S = sum_{j in earlier chunks} k~_j e^(c_j - M) [v_j|1]
 * referenced to M, the max key log factor so far. Query i of a chunk uses the prefix max
 * P_i = max(M, c_t0..c_i) as its reference, which looks at no later key:
 *   n_i = e^(M - P_i) q~_i S + sum_{t0 <= j <= i} (q~_i.k~_j) e^(P_j - P_i) e^(c_j - P_j) [v_j|1]
 * Every factor is <= 1. Then S = e^(M - M') S + sum_j k~_j e^(c_j - M') [v_j|1], M' = P_last.
 *
 * Features are made a block of whole chunks at a time (one projection product per block). The
 * two terms of n_i are one product: [e^(M - P) Q~ | A] (C x (r + C)) times [S ; [V|1]_w]
 * ((r + C) x dv1); the scores A sit in C spare columns after each Q~ row, the weighted values
 * in C spare rows below S. Rows j > i of A are exact zeros, so later keys and values change no
 * bit of n_i (0 * finite adds +-0). */
pf_status pf_favor_causal_rows(const pf_fmap *fm, pf_favor_ws *ws, int C, float *SV, double *Mp,
                               void *out, const void *Q, const void *K, const void *V, int L,
                               int klen, int dv, const pf_favor_keep *keep, const float *kmade,
                               const double *cmade) {
    /* rows of dv1 = pf_favor_dw(dv) floats; the products with a chunk's few rows run as fast on
     * the dv + 1 columns that matter (padding them to 16 columns costs 20%) */
    const int r = fm->r, d = fm->d, dv1 = pf_favor_dw(dv);
    const int NB = pf_favor_block(1, C), ldq = r + C;
    float *S = SV, *Vw = SV + (size_t)r * (size_t)dv1;
    double M = *Mp; /* -inf until the first key has been added */
    double *P = ws->p;
    pf_status st = PF_OK;
    for (int b0 = 0; b0 < L; b0 += NB) {
        const int nb = L - b0 < NB ? L - b0 : NB;
        int nkb = klen - b0; /* valid keys in the block */
        nkb = nkb < 0 ? 0 : (nkb > nb ? nb : nkb);
        const float *Vb = pf_favor_rows(ws, V, (size_t)b0, (size_t)nkb, (size_t)dv, ws->xv);
        if (pf_nonfinite_f32(Vb, (size_t)nkb * (size_t)dv)) {
            st = PF_ENONFINITE;
            break;
        }
        /* the features copied to keep (Q~ before it is scaled), the log factors made there; the
         * keys' made already when kmade is given (and then in keep already if keep is given) */
        const float *kphi = kmade ? kmade + (size_t)b0 * (size_t)r : ws->kphi;
        double *kcw = keep ? keep->kc + b0 : ws->c;
        const double *kc = kmade ? cmade + b0 : kcw;
        pf_status s1 = pf_fmap_rows(fm, ws->phi, ldq, ws->cq, keep ? keep->qamax + b0 : NULL,
                                    pf_favor_rows(ws, Q, (size_t)b0, (size_t)nb, (size_t)d, ws->xq),
                                    nb);
        if (s1 == PF_OK && nkb > 0 && !kmade)
            s1 = pf_fmap_rows(fm, ws->kphi, r, kcw, keep ? keep->kamax + b0 : NULL,
                              pf_favor_rows(ws, K, (size_t)b0, (size_t)nkb, (size_t)d, ws->xk),
                              nkb);
        if (s1 != PF_OK) {
            st = s1;
            break;
        }
        if (keep) {
            keep_rows(keep->qf + (size_t)b0 * (size_t)r, ws->phi, ldq, nb, r);
            if (!kmade) keep_rows(keep->kf + (size_t)b0 * (size_t)r, kphi, r, nkb, r);
        }

        for (int t0 = b0; t0 < b0 + nb; t0 += C) {
            const int n = b0 + nb - t0 < C ? b0 + nb - t0 : C;
            int nk = klen - t0; /* valid keys in the chunk */
            nk = nk < 0 ? 0 : (nk > n ? n : nk);
            float *Qc = ws->phi + (size_t)(t0 - b0) * (size_t)ldq, *A = Qc + r;
            const float *Kc = kphi + (size_t)(t0 - b0) * (size_t)r;
            const double *ck = kc + (t0 - b0);
            const int have_state = M > -INFINITY;
            pf_favor_chunk_prefix(P, ck, n, nk, M);
            if (nk > 0) {
                pf_favor_chunk_scores(A, ldq, Qc, Kc, r, n, nk);
                pf_favor_chunk_mask(A, ldq, P, n, nk);
                if (keep)
                    for (int i = 0; i < n; i++)
                        memcpy(keep->A + (size_t)(t0 + i) * (size_t)C, A + (size_t)i * (size_t)ldq,
                               sizeof(float) * (size_t)nk);
                /* e^(c_j - P_j) [v_j | 1] for A, and e^(c_j - M') [v_j | 1] for the state */
                pf_favor_weighted_values2(Vw, ws->vs, dv1, Vb + (size_t)(t0 - b0) * (size_t)dv,
                                          dv, ck, P, P[n - 1], nk);
            }
            if (have_state) pf_favor_chunk_qscale(Qc, ldq, r, P, n, M);
            /* A key at position 0 (klen >= 1) gives every chunk a state or a key. */
            assert(have_state || nk > 0);
            pf_favor_chunk_out(ws->o + (size_t)(t0 - b0) * (size_t)dv1, dv1, Qc, ldq, S, Vw, r, n,
                               nk, dv, have_state);
            if (nk > 0) {
                const double Mn = P[n - 1];
                pf_favor_chunk_state(S, dv1, Kc, r, ws->vs, nk, dv,
                                     have_state ? (float)exp(M - Mn) : 0.0f);
                M = Mn;
            }
        }
        /* the block's outputs read out at once (not chunk by chunk) */
        st = pf_status_worse(st, pf_favor_readout_rows(ws, out, (size_t)b0, nb, dv));
    }
    *Mp = M;
    return st;
}
