/* attn_favor.c: FAVOR+ attention, out = D^-1 phi(Q) (phi(K)^T V) (SPEC §4), forward.
 *
 * One (b, h) pair is one unit of work, done by one thread, so the arithmetic (and the result,
 * bit for bit) does not depend on the thread count. Within a head, rows go in blocks that stay
 * in cache: a block of inputs becomes stabilised features (features.c) and goes straight into
 * the products with the state, bidirectional or in causal chunks; no L x r matrix is ever
 * formed. Every product runs in the library's own kernels (pf_mm, blas.c: no packing, and the
 * same bits for a row whatever the rows beside it).
 *
 * Values are augmented with a ones column, [V | 1] (Lk, dv+1), so one product gives numerator
 * (columns 0..dv-1) and denominator (column dv).
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

enum {
    FAVOR_BLOCK = 256, /* rows per block, bidirectional */
    FAVOR_CHUNK = 16,  /* causal chunk when opts->chunk is 0 (see pf_favor_chunk) */
    FAVOR_SPLIT = 16,  /* bidirectional: key blocks wanted over all heads (pf_favor_split) */
    SCAN_SPLIT = 4,    /* causal: scan blocks wanted over all heads (each costs extra work) */
    SCAN_UNIT = 4,     /* causal: scan blocks are whole multiples of this many feature blocks */
    A_STRIP = 4        /* causal: rows of the chunk's scores A made at a time (lower part) */
};

pf_favor_opts pf_favor_opts_default(void) {
    pf_favor_opts o = {.kernel = PF_KERNEL_POSITIVE,
                       .W = NULL,
                       .m = 0,
                       .w_per_head = 0,
                       .eps = 0.0f,
                       .chunk = 0,
                       .oprf_a_given = 0,
                       .oprf_a = 0.0f};
    return o;
}

pf_status pf_favor_check(const pf_shape *shape, const pf_attn_opts *opts, const pf_favor_opts *fv) {
    pf_status st = pf_attn_check(shape, opts);
    if (st != PF_OK) return st;
    if (!fv || !fv->W) return PF_EINVAL;
    if (fv->m <= 0 || pf_kernel_width(fv->kernel, fv->m) == 0) return PF_EINVAL;
    if (fv->w_per_head != 0 && fv->w_per_head != 1) return PF_EINVAL;
    if (!isfinite(fv->eps) || fv->eps < 0) return PF_EINVAL;
    if (fv->chunk < 0) return PF_EINVAL;
    if (fv->kernel == PF_KERNEL_OPRF) {
        if (fv->oprf_a_given != 0 && fv->oprf_a_given != 1) return PF_EINVAL;
        if (fv->oprf_a_given && !(isfinite(fv->oprf_a) && fv->oprf_a < 0.125f)) return PF_EINVAL;
        /* a causal A may not look at the sequence (SPEC §2b, "Causal use") */
        if (opts->causal && !fv->oprf_a_given) return PF_EINVAL;
    }
    /* W holds (H or 1) * m * d floats; that count, in bytes, must fit in size_t */
    size_t nw = (size_t)fv->m * (size_t)shape->d; /* both < 2^31: no overflow */
    size_t heads = fv->w_per_head ? (size_t)shape->H : 1;
    if (nw > SIZE_MAX / sizeof(float) / heads) return PF_EINVAL;
    /* FAVOR#'s A comes from the whole sequence: it has no causal form */
    if (fv->kernel == PF_KERNEL_SDERF && opts->causal) return PF_ENOTSUP;
    if (pf_nonfinite_f32(fv->W, nw * heads)) return PF_ENONFINITE;
    return PF_OK;
}

pf_fmap pf_favor_fmap(const pf_shape *shape, const pf_attn_opts *opts, const pf_favor_opts *fv,
                      int h) {
    const size_t nw = (size_t)fv->m * (size_t)shape->d;
    const float *W = fv->W + (fv->w_per_head ? (size_t)h * nw : 0);
    return pf_fmap_make(fv->kernel, W, fv->m, shape->d, opts->scale, fv->eps);
}

/* The causal chunk C: the user's, or 16. Per chunk the masked intra-chunk products cost
 * 2 C^2 (r + dv + 1) flops against 2 C r (2d + 2(dv + 1)) for the features and the state, so
 * the extra work grows as C / d, while the products want C large. Measured with OpenBLAS's
 * AVX-512 small-matrix path (B = 1, H = 8, L = 4096): causal / bidirectional time is lowest at
 * C = 8..20 for d = 16..128 and r = 64..512 (d = 64, r = 256: 1.08 at 16, 1.1 at 32, 1.35 at
 * 64); with pf_mm on AVX-512 (d = 64, r = 256) flat from 8 to 24, 5% more at 32, 8% at 48. */
int pf_favor_chunk(const pf_favor_opts *fv, int L) {
    int C = fv->chunk ? fv->chunk : FAVOR_CHUNK;
    return C < L ? C : L;
}

/* Rows per block of features: FAVOR_BLOCK, or for causal a whole number of chunks near it. */
int pf_favor_block(int causal, int C) {
    if (!causal) return FAVOR_BLOCK;
    return C >= FAVOR_BLOCK ? C : FAVOR_BLOCK / C * C;
}

/* ---- per-thread scratch ------------------------------------------------------------------- */

/* Rounds a count of 4- or 8-byte items up to a whole number of 64-byte lines. */
static size_t lines(size_t n, size_t size) {
    return (n * size + 63) / 64 * 64;
}

int pf_favor_ws_alloc(pf_favor_ws *ws, int nb, int C, int r, int dv) {
    const size_t dv1 = (size_t)pf_favor_dw(dv), R = (size_t)r, NB = (size_t)nb, CC = (size_t)C;
    const size_t sz[9] = {lines(NB * (R + CC), 4),
                          lines(C ? NB * R : 0, 4),
                          lines(NB * dv1, 4),
                          lines(CC * dv1, 4),
                          lines(NB * dv1, 4),
                          lines((R + CC) * dv1, 4),
                          lines(NB, 8),
                          lines(NB, 8),
                          lines(CC, 8)};
    memset(ws, 0, sizeof *ws);
    size_t total = 0;
    for (int i = 0; i < 9; i++) total += sz[i]; /* r, dv, nb, C < 2^31: no overflow */
    char *m = pf_alloc(total, 1);
    if (!m) return -1;
    ws->mem = m;
    float **f[6] = {&ws->phi, &ws->kphi, &ws->vaug, &ws->vs, &ws->o, &ws->state};
    for (int i = 0; i < 6; i++) {
        *f[i] = (float *)m;
        m += sz[i];
    }
    ws->c = (double *)m;
    m += sz[6];
    ws->cq = (double *)m;
    m += sz[7];
    ws->p = (double *)m;
    return 0;
}

void pf_favor_ws_free(pf_favor_ws *ws) {
    if (ws) pf_free(ws->mem);
}

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
        pf_status bad = PF_OK;
        if (!isfinite(den))
            bad = PF_ENONFINITE;
        else if (den == 0.0f)
            bad = PF_EDOMAIN;
        else if (!isfinite(1.0f / den) || pf_nonfinite_f32(dst, (size_t)dv))
            bad = PF_ENONFINITE;
        if (bad != PF_OK) {
            memset(dst, 0, sizeof(float) * (size_t)dv);
            if (bad > st) st = bad;
        }
    }
    return st;
}

static pf_status worse(pf_status a, pf_status b) {
    return a > b ? a : b;
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
                             const float *K, const float *V, int n, int dv, float *kst, double *kc,
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
        const float *Vb = V + (size_t)j0 * (size_t)dv;
        float *phi = ws->phi;
        double *c = kc ? kc + j0 : ws->c;
        /* (K rows are checked by pf_fmap_rows, V rows by pf_favor_weighted_values) */
        pf_status st =
            pf_fmap_rows(fm, phi, r, c, kamax ? kamax + j0 : NULL, K + (size_t)j0 * (size_t)d, nb);
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

/* Bidirectional queries [0, n): out = (Q~ KV)[:, :dv] / (Q~ KV)[:, dv], in blocks; the features
 * are made in qf (n, r) with their maxima in qamax (n) when qf is not NULL. */
static pf_status query_block(const pf_fmap *fm, pf_favor_ws *ws, float *out, const float *Q,
                             const float *KV, int n, int dv, float *qf, float *qamax) {
    const int r = fm->r, d = fm->d, dv1 = pf_favor_dw(dv);
    pf_status st = PF_OK;
    for (int i0 = 0; i0 < n; i0 += FAVOR_BLOCK) {
        const int nb = n - i0 < FAVOR_BLOCK ? n - i0 : FAVOR_BLOCK;
        float *phi = ws->phi;
        pf_status s1 = pf_fmap_rows(fm, phi, r, ws->cq, qf ? qamax + i0 : NULL,
                                    Q + (size_t)i0 * (size_t)d, nb);
        if (s1 != PF_OK) return s1;
        if (qf) keep_rows(qf + (size_t)i0 * (size_t)r, phi, r, nb, r);
        /* O = Q~ KV   (nb x (dv + 1)) */
        pf_mm(0, 0, nb, dv + 1, r, 1.0f, phi, r, KV, dv1, 0.0f, ws->o, dv1);
        st = worse(st, pf_favor_readout(out + (size_t)i0 * (size_t)dv, ws->o, nb, dv));
    }
    return st;
}

/* The causal chunk's two weightings of [V | 1] in one pass over V: dst1 row j
 * e^(c_j - ref1_j) [v_j | 1], dst2 row j e^(c_j - ref2) [v_j | 1] (the arithmetic of
 * pf_favor_weighted_values for each; V is checked by the caller). */
PF_CLONES void pf_favor_weighted_values2(float *dst1, float *dst2, int dw, const float *V,
                                         int dv, const double *c, const double *ref1,
                                         double ref2, int n) {
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
                               float *out, const float *Q, const float *K, const float *V, int L,
                               int klen, int dv, const pf_favor_keep *keep) {
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
        if (pf_nonfinite_f32(V + (size_t)b0 * (size_t)dv, (size_t)nkb * (size_t)dv)) {
            st = PF_ENONFINITE;
            break;
        }
        /* the features copied to keep (Q~ before it is scaled), the log factors made there */
        float *kphi = ws->kphi;
        double *kc = keep ? keep->kc + b0 : ws->c;
        pf_status s1 = pf_fmap_rows(fm, ws->phi, ldq, ws->cq, keep ? keep->qamax + b0 : NULL,
                                    Q + (size_t)b0 * (size_t)d, nb);
        if (s1 == PF_OK && nkb > 0)
            s1 = pf_fmap_rows(fm, kphi, r, kc, keep ? keep->kamax + b0 : NULL,
                              K + (size_t)b0 * (size_t)d, nkb);
        if (s1 != PF_OK) {
            st = s1;
            break;
        }
        if (keep) {
            keep_rows(keep->qf + (size_t)b0 * (size_t)r, ws->phi, ldq, nb, r);
            keep_rows(keep->kf + (size_t)b0 * (size_t)r, kphi, r, nkb, r);
        }

        for (int t0 = b0; t0 < b0 + nb; t0 += C) {
            const int n = b0 + nb - t0 < C ? b0 + nb - t0 : C;
            int nk = klen - t0; /* valid keys in the chunk */
            nk = nk < 0 ? 0 : (nk > n ? n : nk);
            float *Qc = ws->phi + (size_t)(t0 - b0) * (size_t)ldq, *A = Qc + r;
            const float *Kc = kphi + (size_t)(t0 - b0) * (size_t)r;
            const float *Vc = V + (size_t)t0 * (size_t)dv;
            const double *ck = kc + (t0 - b0);
            const int have_state = M > -INFINITY;
            double run = M;
            for (int j = 0; j < n; j++) {
                if (j < nk && ck[j] > run) run = ck[j];
                P[j] = run;
            }
            if (nk > 0) {
                /* A = Q~ K~^T (n x nk), masked to j <= i and scaled by e^(P_j - P_i) <= 1: only
                 * its lower part is made, in strips of A_STRIP rows (each element's bits do not
                 * depend on the product's shape), and the rest is zeroed below */
                for (int i0 = 0; i0 < n; i0 += A_STRIP) {
                    const int mi = n - i0 < A_STRIP ? n - i0 : A_STRIP;
                    const int nj = i0 + mi < nk ? i0 + mi : nk;
                    if (nj > 0)
                        pf_mm(0, 1, mi, nj, r, 1.0f, Qc + (size_t)i0 * (size_t)ldq, ldq, Kc, r,
                              0.0f, A + (size_t)i0 * (size_t)ldq, ldq);
                }
                for (int i = 0; i < n; i++) {
                    float *row = A + (size_t)i * (size_t)ldq;
                    const int jmax = i < nk - 1 ? i : nk - 1;
                    for (int j = 0; j <= jmax; j++) {
                        if (P[j] != P[i]) row[j] *= (float)exp(P[j] - P[i]);
                    }
                    for (int j = jmax + 1; j < nk; j++) row[j] = 0.0f;
                }
                if (keep)
                    for (int i = 0; i < n; i++)
                        memcpy(keep->A + (size_t)(t0 + i) * (size_t)C, A + (size_t)i * (size_t)ldq,
                               sizeof(float) * (size_t)nk);
                /* e^(c_j - P_j) [v_j | 1] for A, and e^(c_j - M') [v_j | 1] for the state */
                pf_favor_weighted_values2(Vw, ws->vs, dv1, Vc, dv, ck, P, P[n - 1], nk);
            }
            if (have_state) {
                /* row i of Q~ times e^(M - P_i) <= 1 (A has been formed from the plain Q~) */
                for (int i = 0; i < n; i++) {
                    if (P[i] == M) continue;
                    const float f = (float)exp(M - P[i]);
                    float *row = Qc + (size_t)i * (size_t)ldq;
                    for (int k = 0; k < r; k++) row[k] *= f;
                }
            }
            /* O = [e^(M-P) Q~ | A] [S ; Vw]; before the first key only A Vw. A key at
             * position 0 (klen >= 1) gives every chunk a state or a key. */
            const int kdim = (have_state ? r : 0) + nk;
            assert(kdim > 0);
            pf_mm(0, 0, n, dv + 1, kdim, 1.0f, have_state ? Qc : A, ldq, have_state ? S : Vw, dv1,
                  0.0f, ws->o + (size_t)(t0 - b0) * (size_t)dv1, dv1);
            if (nk > 0) {
                /* S = e^(M - M') S + K~^T [V | 1] e^(c - M'), M' = P_last */
                const double Mn = P[n - 1];
                const float beta = have_state ? (float)exp(M - Mn) : 0.0f;
                pf_mm(1, 0, r, dv + 1, nk, 1.0f, Kc, r, ws->vs, dv1, beta, S, dv1);
                M = Mn;
            }
        }
        /* the block's outputs read out at once (not chunk by chunk) */
        st = worse(st, pf_favor_readout(out + (size_t)b0 * (size_t)dv, ws->o, nb, dv));
    }
    *Mp = M;
    return st;
}

/* ---- the driver --------------------------------------------------------------------------- */

/* Work is cut into units that never depend on the thread count, and each unit's arithmetic is
 * fixed, so any thread may run it (dynamic schedule) and the bits never change:
 *   bidirectional  per head, key blocks (pf_favor_split) give partial K~^T [V|1] sums, each with
 *                  its own max; they are combined in block order; then query blocks of
 *                  FAVOR_BLOCK rows read the combined sum;
 *   causal         per head, scan blocks (pf_favor_split: several only when B*H is small): the
 *                  local sum of every block but the last, an in-order prefix combine giving each
 *                  block its starting state, then each block's chunked scan from that state.
 * With B*H >= FAVOR_SPLIT a head is one key block and one scan block. */
typedef struct favor_job {
    const pf_shape *s;
    const pf_attn_opts *opts;
    const pf_favor_opts *favor;
    const float *Q, *K, *V;
    float *out;
    int r, C, nkb, kbl; /* key (or scan) blocks per head and their length */
    pf_fmap *fm;        /* (heads) */
    pf_kernel_ws *kw;   /* (heads) */
    float *part;        /* (heads, nkb, r, dw): partial sums; [h][0] becomes the total */
    double *pmax;       /* (heads, nkb) */
    int *hst;           /* (heads): status of the head (phase 0) */
    int *kst;           /* (heads, nkb): status of each key unit */
    int *ust;           /* (heads, nqb): status of each query or scan unit */
    pf_favor_saved *sv; /* what the backward will need, or NULL */
    const pf_favor_ext *ext; /* a slice's state and sums from outside, or NULL */
} favor_job;

static size_t head_off(int bh, int L, int w) {
    return (size_t)bh * (size_t)L * (size_t)w;
}

/* A slice: head bh's state from outside, (r, dv+1) rows, into slot 0 as (r, dw) rows (the
 * causal starting state, or the bidirectional total); an empty one (-inf) as zeros. */
static void ext_state_in(favor_job *j, int bh) {
    const size_t dv1 = (size_t)j->s->dv + 1, dw = (size_t)pf_favor_dw(j->s->dv);
    const size_t r = (size_t)j->r;
    float *P = j->part + (size_t)bh * (size_t)j->nkb * r * dw;
    const double M = j->ext->M[bh];
    j->pmax[(size_t)bh * (size_t)j->nkb] = M;
    memset(P, 0, sizeof(float) * r * dw);
    if (M == -INFINITY) return;
    const float *S = j->ext->S + (size_t)bh * r * dv1;
    for (size_t f = 0; f < r; f++) memcpy(P + f * dw, S + f * dv1, sizeof(float) * dv1);
}

/* Phase 0: the head's map (OPRF/SDERF parameters) and the padded keys' check. */
static pf_status job_head(favor_job *j, int bh) {
    const pf_shape *s = j->s;
    const int b = bh / s->H, h = bh % s->H;
    const int klen = pf_attn_key_len(j->opts, b, s->Lk);
    const float *Kh = j->K + head_off(bh, s->Lk, s->d);
    const float *Vh = j->V + head_off(bh, s->Lk, s->dv);
    /* inputs are checked block by block where they are used (while in cache); only the padded
     * keys, never used, are checked here */
    const size_t pad = (size_t)(s->Lk - klen);
    if (pf_nonfinite_f32(Kh + (size_t)klen * (size_t)s->d, pad * (size_t)s->d) ||
        pf_nonfinite_f32(Vh + (size_t)klen * (size_t)s->dv, pad * (size_t)s->dv))
        return PF_ENONFINITE;
    j->fm[bh] = pf_favor_fmap(s, j->opts, j->favor, h);
    if (j->ext && j->ext->S) ext_state_in(j, bh);
    if (j->ext && j->ext->sums)
        return pf_favor_bind_sums(&j->fm[bh], &j->kw[bh], j->favor,
                                  j->ext->sums + (size_t)bh * pf_favor_sums_len(j->favor->kernel,
                                                                               s->d));
    return pf_favor_bind(&j->fm[bh], &j->kw[bh], j->favor,
                         j->Q ? j->Q + head_off(bh, s->Lq, s->d) : NULL, s->Lq, Kh, klen);
}

/* Phase 1: the local sum of key block kb of head bh into slot kb (bidirectional) or kb + 1
 * (causal, scan blocks but the last: slot 0 stays the empty starting state of block 0). */
static pf_status job_keys(favor_job *j, pf_favor_ws *ws, int bh, int kb) {
    const pf_shape *s = j->s;
    const int klen = pf_attn_key_len(j->opts, bh / s->H, s->Lk);
    const int j0 = kb * j->kbl, slot = kb + (j->opts->causal ? 1 : 0);
    int n = klen - j0;
    n = n > j->kbl ? j->kbl : n;
    float *KVb = j->part + ((size_t)bh * (size_t)j->nkb + (size_t)slot) * (size_t)j->r *
                               (size_t)pf_favor_dw(s->dv);
    double *Mb = j->pmax + (size_t)bh * (size_t)j->nkb + (size_t)slot;
    *Mb = -INFINITY;
    if (n <= 0) return PF_OK; /* padding only */
    const float *Kh = j->K + head_off(bh, s->Lk, s->d) + (size_t)j0 * (size_t)s->d;
    const float *Vh = j->V + head_off(bh, s->Lk, s->dv) + (size_t)j0 * (size_t)s->dv;
    if (j->sv && !j->opts->causal && bh < j->sv->nkeep) {
        const size_t o = (size_t)bh * (size_t)s->Lk + (size_t)j0;
        return pf_favor_key_block(&j->fm[bh], ws, KVb, Mb, Kh, Vh, n, s->dv,
                                  j->sv->kf + o * (size_t)j->r, j->sv->kc + o, j->sv->kamax + o);
    }
    return pf_favor_key_block(&j->fm[bh], ws, KVb, Mb, Kh, Vh, n, s->dv, NULL, NULL, NULL);
}

/* Phase 2, in block order: bidirectional, the head's total into slot 0; causal, slot kb
 * becomes block kb's starting state, start(kb) = start(kb - 1) + local(kb - 1). */
static void job_combine(favor_job *j, int bh) {
    const size_t n = (size_t)j->r * (size_t)pf_favor_dw(j->s->dv);
    float *P = j->part + (size_t)bh * (size_t)j->nkb * n;
    double *M = j->pmax + (size_t)bh * (size_t)j->nkb;
    if (!j->opts->causal) {
        for (int kb = 1; kb < j->nkb; kb++)
            pf_favor_combine(P, &M[0], P + (size_t)kb * n, M[kb], n);
        if (j->sv) {
            memcpy(j->sv->kv + (size_t)bh * n, P, sizeof(float) * n);
            j->sv->kvm[bh] = M[0];
        }
        return;
    }
    if (!(j->ext && j->ext->S)) M[0] = -INFINITY; /* (else the slice's starting state) */
    for (int kb = 1; kb < j->nkb; kb++)
        pf_favor_combine(P + (size_t)kb * n, &M[kb], P + (size_t)(kb - 1) * n, M[kb - 1], n);
}

/* Phase 3, bidirectional: queries of block qb (FAVOR_BLOCK rows). */
static pf_status job_queries(favor_job *j, pf_favor_ws *ws, int bh, int qb) {
    const pf_shape *s = j->s;
    const int i0 = qb * FAVOR_BLOCK, n = s->Lq - i0 < FAVOR_BLOCK ? s->Lq - i0 : FAVOR_BLOCK;
    const size_t nkv = (size_t)j->r * (size_t)pf_favor_dw(s->dv);
    const float *KV = j->part + (size_t)bh * (size_t)j->nkb * nkv;
    const float *Qh = j->Q + head_off(bh, s->Lq, s->d) + (size_t)i0 * (size_t)s->d;
    float *oh = j->out + head_off(bh, s->Lq, s->dv) + (size_t)i0 * (size_t)s->dv;
    const size_t o = (size_t)bh * (size_t)s->Lq + (size_t)i0;
    const int keep = j->sv && bh < j->sv->nkeep;
    return query_block(&j->fm[bh], ws, oh, Qh, KV, n, s->dv,
                       keep ? j->sv->qf + o * (size_t)j->r : NULL, keep ? j->sv->qamax + o : NULL);
}

/* Phase 3, causal: scan block sb from its starting state. */
static pf_status job_scan(favor_job *j, pf_favor_ws *ws, int bh, int sb) {
    const pf_shape *s = j->s;
    const int klen = pf_attn_key_len(j->opts, bh / s->H, s->Lk);
    const int t0 = sb * j->kbl, n = s->Lq - t0 < j->kbl ? s->Lq - t0 : j->kbl;
    const size_t nkv = (size_t)j->r * (size_t)pf_favor_dw(s->dv);
    const float *start = j->part + ((size_t)bh * (size_t)j->nkb + (size_t)sb) * nkv;
    double M = j->pmax[(size_t)bh * (size_t)j->nkb + (size_t)sb];
    if (M > -INFINITY) memcpy(ws->state, start, sizeof(float) * nkv);
    const size_t o = (size_t)t0, row = (size_t)bh * (size_t)s->Lq + o; /* (Lq == Lk) */
    pf_favor_keep keep;
    const int kept = j->sv && bh < j->sv->nkeep;
    if (kept)
        keep = (pf_favor_keep){.qf = j->sv->qf + row * (size_t)j->r,
                               .qamax = j->sv->qamax + row,
                               .kf = j->sv->kf + row * (size_t)j->r,
                               .kamax = j->sv->kamax + row,
                               .kc = j->sv->kc + row,
                               .A = j->sv->ka + row * (size_t)j->C};
    return pf_favor_causal_rows(&j->fm[bh], ws, j->C, ws->state, &M,
                                j->out + head_off(bh, s->Lq, s->dv) + o * (size_t)s->dv,
                                j->Q + head_off(bh, s->Lq, s->d) + o * (size_t)s->d,
                                j->K + head_off(bh, s->Lk, s->d) + o * (size_t)s->d,
                                j->V + head_off(bh, s->Lk, s->dv) + o * (size_t)s->dv, n, klen - t0,
                                s->dv, kept ? &keep : NULL);
}

static int fatal(int st) {
    return st == PF_ENONFINITE || st == PF_ENOMEM;
}

/* A slice's own key state: slot 0 of head bh (the combined total), as (r, dv+1) rows; a head
 * that failed gives an empty state. */
static void ext_state_out(favor_job *j, int bh, int dead) {
    const size_t dv1 = (size_t)j->s->dv + 1, dw = (size_t)pf_favor_dw(j->s->dv);
    const size_t r = (size_t)j->r;
    float *S = j->ext->Sout + (size_t)bh * r * dv1;
    if (dead || !j->part || !j->pmax || j->pmax[(size_t)bh * (size_t)j->nkb] == -INFINITY) {
        memset(S, 0, sizeof(float) * r * dv1);
        j->ext->Mout[bh] = -INFINITY;
        return;
    }
    const float *P = j->part + (size_t)bh * (size_t)j->nkb * r * dw;
    for (size_t f = 0; f < r; f++) memcpy(S + f * dv1, P + f * dw, sizeof(float) * dv1);
    j->ext->Mout[bh] = j->pmax[(size_t)bh * (size_t)j->nkb];
}

/* The forward, keeping what the backward needs in sv if it is not NULL; *complete is 1 when
 * every head was computed (none failed outright). Arguments checked. */
static pf_status favor_run(float *out, const float *Q, const float *K, const float *V,
                           const pf_shape *shape, const pf_attn_opts *opts,
                           const pf_favor_opts *favor, pf_favor_saved *sv, int *complete,
                           const pf_favor_ext *ext) {
    const pf_shape s = *shape;
    const int heads = s.B * s.H; /* (pf_attn_check: B H L d fits in size_t) */
    /* a slice's key state alone: the bidirectional key phases, whatever opts->causal */
    const int keys_only = ext && ext->Sout, ext_state = ext && ext->S;
    pf_attn_opts kopts;
    if (keys_only) {
        kopts = *opts;
        kopts.causal = 0;
        opts = &kopts;
    }
    favor_job j = {.s = &s,
                   .opts = opts,
                   .favor = favor,
                   .Q = Q,
                   .K = K,
                   .V = V,
                   .out = out,
                   .sv = sv,
                   .ext = ext};
    *complete = 0;
    j.r = pf_kernel_width(favor->kernel, favor->m);
    j.C = opts->causal ? pf_favor_chunk(favor, s.Lq) : 0;
    if (opts->causal)
        j.nkb = pf_favor_scan_blocks(s.Lk, heads, j.C, &j.kbl);
    else if (ext_state) /* the total comes from outside: no key blocks */
        j.nkb = 1, j.kbl = s.Lk;
    else
        j.nkb = pf_favor_bidir_blocks(s.Lk, heads, &j.kbl);
    const int nqb = keys_only      ? 0
                    : opts->causal ? j.nkb
                                   : (s.Lq + FAVOR_BLOCK - 1) / FAVOR_BLOCK;
    const size_t nkv = (size_t)j.r * (size_t)pf_favor_dw(s.dv), H = (size_t)heads;
    j.fm = malloc(sizeof(pf_fmap) * H);
    j.kw = calloc(H, sizeof(pf_kernel_ws));
    j.part = pf_alloc(H * (size_t)j.nkb * nkv, sizeof(float));
    j.pmax = malloc(sizeof(double) * H * (size_t)j.nkb);
    j.hst = calloc(H, sizeof(int));
    j.kst = calloc(H * (size_t)j.nkb, sizeof(int));
    j.ust = calloc(H * (size_t)(nqb > 0 ? nqb : 1), sizeof(int));
    int worst = PF_OK;
    if (!j.fm || !j.kw || !j.part || !j.pmax || !j.hst || !j.kst || !j.ust) worst = PF_ENOMEM;
    for (int bh = 0; bh < heads && worst == PF_OK; bh++)
        if (pf_kernel_ws_alloc(&j.kw[bh], favor->kernel, favor->m, s.d) != 0) worst = PF_ENOMEM;
    const int nk1 = opts->causal ? j.nkb - 1 : (ext_state ? 0 : j.nkb); /* key units per head */
    /* no more threads than units of work in any phase: each idle one would only cost its
     * scratch (and, where threads cannot be made, a libgomp exit) */
    int64_t most = (int64_t)heads * (nk1 > nqb ? (nk1 > 1 ? nk1 : 1) : (nqb > 1 ? nqb : 1));
    int nt = pf_threads(opts->threads);
    if (nt > most) nt = (int)most;
    if (worst == PF_OK) {
        int nomem = 0;
#pragma omp parallel num_threads(nt)
        {
            pf_favor_ws ws;
            if (pf_favor_ws_alloc(&ws, pf_favor_block(opts->causal, j.C), j.C, j.r, s.dv) != 0) {
#pragma omp atomic write
                nomem = 1;
            }
#pragma omp barrier
            if (!nomem) {
#pragma omp for schedule(dynamic, 1)
                for (int bh = 0; bh < heads; bh++) j.hst[bh] = (int)job_head(&j, bh);
#pragma omp for schedule(dynamic, 1)
                for (int u = 0; u < heads * nk1; u++) {
                    const int bh = u / nk1, kb = u % nk1;
                    if (j.hst[bh] != PF_OK) continue;
                    j.kst[(size_t)bh * (size_t)j.nkb + (size_t)kb] = (int)job_keys(&j, &ws, bh, kb);
                }
#pragma omp for schedule(dynamic, 1)
                for (int bh = 0; bh < heads; bh++) {
                    for (int kb = 0; kb < nk1; kb++) {
                        const int u = j.kst[(size_t)bh * (size_t)j.nkb + (size_t)kb];
                        if (u > j.hst[bh]) j.hst[bh] = u;
                    }
                    if (j.hst[bh] == PF_OK) job_combine(&j, bh);
                }
#pragma omp for schedule(dynamic, 1)
                for (int u = 0; u < heads * nqb; u++) {
                    const int bh = u / nqb, qb = u % nqb;
                    if (j.hst[bh] != PF_OK) continue;
                    j.ust[u] = (int)(opts->causal ? job_scan(&j, &ws, bh, qb)
                                                  : job_queries(&j, &ws, bh, qb));
                }
            }
            pf_favor_ws_free(&ws);
        }
        if (nomem) worst = PF_ENOMEM;
        /* statuses in a fixed order; a head that failed outright is zeroed */
        for (int bh = 0; bh < heads && worst != PF_ENOMEM; bh++) {
            /* a failed setup or key block leaves the head unwritten; a query or scan unit's
             * NaN leaves part of it */
            int hs = j.hst[bh], dead = hs != PF_OK;
            for (int u = 0; u < nqb; u++) {
                const int us = j.ust[(size_t)bh * (size_t)nqb + (size_t)u];
                hs = us > hs ? us : hs;
                dead |= fatal(us);
            }
            if (dead && out)
                memset(out + head_off(bh, s.Lq, s.dv), 0,
                       sizeof(float) * (size_t)s.Lq * (size_t)s.dv);
            if (keys_only) ext_state_out(&j, bh, dead);
            if (hs > worst) worst = hs;
            *complete += dead;
        }
        *complete = worst != PF_ENOMEM && *complete == 0;
    }
    if (worst == PF_ENOMEM && out)
        memset(out, 0, sizeof(float) * H * (size_t)s.Lq * (size_t)s.dv);
    if (worst == PF_ENOMEM && keys_only)
        for (int bh = 0; bh < heads; bh++) ext_state_out(&j, bh, 1);
    if (j.kw)
        for (int bh = 0; bh < heads; bh++) pf_kernel_ws_free(&j.kw[bh]);
    free(j.fm);
    free(j.kw);
    pf_free(j.part);
    free(j.pmax);
    free(j.hst);
    free(j.kst);
    free(j.ust);
    return (pf_status)worst;
}

pf_status pf_favor_forward_ext(float *out, const float *Q, const float *K, const float *V,
                               const pf_shape *shape, const pf_attn_opts *opts,
                               const pf_favor_opts *favor, const pf_favor_ext *ext) {
    int complete;
    return favor_run(out, Q, K, V, shape, opts, favor, NULL, &complete, ext);
}

pf_status pf_attn_favor(float *out, const float *Q, const float *K, const float *V,
                        const pf_shape *shape, const pf_attn_opts *opts,
                        const pf_favor_opts *favor) {
    if (!out || !Q || !K || !V) return PF_EINVAL;
    pf_status st = pf_favor_check(shape, opts, favor);
    if (st != PF_OK) return st;
    if (pf_attn_alias_check(shape, opts, out, NULL, NULL, NULL, NULL, Q, K, V, NULL, NULL, NULL,
                            favor->W, (size_t)(favor->w_per_head ? shape->H : 1) * (size_t)favor->m * (size_t)shape->d))
        return PF_EINVAL;
    int complete;
    return favor_run(out, Q, K, V, shape, opts, favor, NULL, &complete, NULL);
}

/* ---- what a forward keeps for its backward ------------------------------------------------ */

static int32_t key_len_of(const pf_attn_opts *opts, int b, int Lk) {
    return (int32_t)pf_attn_key_len(opts, b, Lk);
}

pf_status pf_favor_saved_match(const pf_favor_saved *sv, const pf_shape *shape,
                               const pf_attn_opts *opts, const pf_favor_opts *favor, int filled) {
    if (!sv || (filled && !sv->filled)) return PF_EINVAL;
    const pf_shape *a = &sv->shape;
    const pf_favor_opts *f = &sv->favor;
    if (a->B != shape->B || a->H != shape->H || a->Lq != shape->Lq || a->Lk != shape->Lk ||
        a->d != shape->d || a->dv != shape->dv)
        return PF_EINVAL;
    if (sv->opts.scale != opts->scale || sv->opts.causal != opts->causal) return PF_EINVAL;
    for (int b = 0; b < shape->B; b++)
        if (sv->key_len[b] != key_len_of(opts, b, shape->Lk)) return PF_EINVAL;
    if (f->kernel != favor->kernel || f->W != favor->W || f->m != favor->m ||
        f->w_per_head != favor->w_per_head || f->eps != favor->eps || f->chunk != favor->chunk ||
        f->oprf_a_given != favor->oprf_a_given ||
        (favor->oprf_a_given && f->oprf_a != favor->oprf_a))
        return PF_EINVAL;
    return PF_OK;
}

pf_status pf_favor_saved_create(pf_favor_saved **saved, const pf_shape *shape,
                                const pf_attn_opts *opts, const pf_favor_opts *favor,
                                size_t max_bytes) {
    if (!saved) return PF_EINVAL;
    *saved = NULL;
    pf_status st = pf_favor_check(shape, opts, favor);
    if (st != PF_OK) return st;
    const pf_shape s = *shape;
    const size_t H = (size_t)s.B * (size_t)s.H,
                 r = (size_t)pf_kernel_width(favor->kernel, favor->m);
    const size_t dw = (size_t)pf_favor_dw(s.dv), Lq = (size_t)s.Lq, Lk = (size_t)s.Lk;
    const size_t nkv = opts->causal ? 0 : r * dw;
    const size_t C = opts->causal ? (size_t)pf_favor_chunk(favor, s.Lq) : 0;
    /* sizes in floats (doubles count two), each rounded up to a 64-byte line */
    const size_t rows = Lq > Lk ? Lq : Lk;
    if (rows > SIZE_MAX / 8 / (r + C) / H) return PF_ENOMEM;
    /* every head's K~^T [V|1] and reference; then as many heads' features as max_bytes allows
     * (floats; doubles count two; each array rounded up to a 64-byte line) */
    const size_t fixed = H * nkv + 2 * H + 8 * 16 + (sizeof(pf_favor_saved) + 4 * H) / 4 + 1;
    const size_t per = Lq * r + Lk * r + Lq + Lk + 2 * Lk + Lq * C;
    size_t keep = H;
    if (max_bytes) keep = max_bytes / 4 <= fixed ? 0 : (max_bytes / 4 - fixed) / per;
    keep = keep < H ? keep : H;
    size_t sz[8] = {keep * Lq * r, keep * Lk * r, keep * Lq, keep * Lk,
                    2 * keep * Lk, H * nkv,       2 * H,     keep * Lq * C};
    size_t total = 0;
    for (int i = 0; i < 8; i++) {
        sz[i] = (sz[i] + 15) / 16 * 16;
        if (sz[i] > SIZE_MAX / 4 - total) return PF_ENOMEM;
        total += sz[i];
    }
    pf_favor_saved *sv = calloc(1, sizeof *sv);
    float *mem = pf_alloc(total, sizeof(float));
    int32_t *kl = malloc(sizeof(int32_t) * (size_t)s.B);
    if (!sv || !mem || !kl) {
        free(sv);
        pf_free(mem);
        free(kl);
        return PF_ENOMEM;
    }
    sv->shape = s;
    sv->opts = *opts;
    sv->favor = *favor;
    sv->r = (int)r;
    sv->dw = (int)dw;
    sv->nkeep = (int)keep;
    sv->key_len = kl;
    for (int b = 0; b < s.B; b++) kl[b] = key_len_of(opts, b, s.Lk);
    sv->opts.key_len = kl;
    float *m = mem;
    sv->qf = m, m += sz[0];
    sv->kf = m, m += sz[1];
    sv->qamax = m, m += sz[2];
    sv->kamax = m, m += sz[3];
    sv->kc = (double *)m, m += sz[4];
    sv->kv = opts->causal ? NULL : m, m += sz[5];
    sv->kvm = (double *)m, m += sz[6];
    sv->ka = opts->causal ? m : NULL;
    sv->C = (int)C;
    sv->bytes = total * sizeof(float) + sizeof *sv + sizeof(int32_t) * (size_t)s.B;
    *saved = sv;
    return PF_OK;
}

void pf_favor_saved_free(pf_favor_saved *saved) {
    if (!saved) return;
    pf_free(saved->qf);
    free(saved->key_len);
    free(saved);
}

size_t pf_favor_saved_bytes(const pf_favor_saved *saved) {
    return saved ? saved->bytes : 0;
}

int pf_favor_saved_heads(const pf_favor_saved *saved) {
    return saved ? saved->nkeep : 0;
}

void pf_favor_saved_clear(pf_favor_saved *saved) {
    if (saved) saved->filled = 0;
}

pf_status pf_attn_favor_save(float *out, const float *Q, const float *K, const float *V,
                             const pf_shape *shape, const pf_attn_opts *opts,
                             const pf_favor_opts *favor, pf_favor_saved *saved) {
    if (!out || !Q || !K || !V || !saved) return PF_EINVAL;
    pf_status st = pf_favor_check(shape, opts, favor);
    if (st != PF_OK) return st;
    if (pf_attn_alias_check(shape, opts, out, NULL, NULL, NULL, NULL, Q, K, V, NULL, NULL, NULL,
                            favor->W, (size_t)(favor->w_per_head ? shape->H : 1) * (size_t)favor->m * (size_t)shape->d))
        return PF_EINVAL;
    st = pf_favor_saved_match(saved, shape, opts, favor, 0);
    if (st != PF_OK) return st;
    int complete;
    saved->filled = 0;
    st = favor_run(out, Q, K, V, shape, opts, favor, saved, &complete, NULL);
    saved->filled = complete;
    return st;
}

/* ---- the float64 reference ---------------------------------------------------------------- */

/* out (dv) = num[0..dv) / num[dv], checked like pf_favor_readout. */
static pf_status readout_f64(float *out, const double *num, int dv) {
    const double den = num[dv];
    pf_status bad = PF_OK;
    if (!isfinite(den))
        bad = PF_ENONFINITE;
    else if (den == 0.0)
        bad = PF_EDOMAIN;
    for (int k = 0; k < dv && bad == PF_OK; k++) {
        double q = num[k] / den;
        if (!isfinite(q)) bad = PF_ENONFINITE;
        out[k] = (float)q;
    }
    if (bad != PF_OK) memset(out, 0, sizeof(float) * (size_t)dv);
    return bad;
}

pf_status pf_attn_favor_ref(float *out, const float *Q, const float *K, const float *V,
                            const pf_shape *shape, const pf_attn_opts *opts,
                            const pf_favor_opts *favor) {
    if (!out || !Q || !K || !V) return PF_EINVAL;
    pf_status st = pf_favor_check(shape, opts, favor);
    if (st != PF_OK) return st;
    if (pf_attn_alias_check(shape, opts, out, NULL, NULL, NULL, NULL, Q, K, V, NULL, NULL, NULL,
                            favor->W, (size_t)(favor->w_per_head ? shape->H : 1) * (size_t)favor->m * (size_t)shape->d))
        return PF_EINVAL;
    const pf_shape s = *shape;
    const pf_attn_sizes n = pf_attn_sizes_of(&s);
    if (pf_nonfinite_f32(Q, n.q) || pf_nonfinite_f32(K, n.k) || pf_nonfinite_f32(V, n.v))
        return PF_ENONFINITE;
    const int r = pf_kernel_width(favor->kernel, favor->m), dv = s.dv, dv1 = s.dv + 1;
    double *phiK = malloc(sizeof(double) * (size_t)s.Lk * (size_t)r);
    double *phiq = malloc(sizeof(double) * (size_t)r);
    double *u = malloc(sizeof(double) * (size_t)favor->m);
    double *KV = malloc(sizeof(double) * (size_t)r * (size_t)dv1);
    double *num = malloc(sizeof(double) * (size_t)dv1);
    pf_kernel_ws kw;
    const int kw_ok = pf_kernel_ws_alloc(&kw, favor->kernel, favor->m, s.d) == 0;
    if (!kw_ok) memset(&kw, 0, sizeof kw);
    if (!phiK || !phiq || !u || !KV || !num || !kw_ok) {
        st = PF_ENOMEM;
        goto done;
    }
    for (int b = 0; b < s.B; b++) {
        const int klen = pf_attn_key_len(opts, b, s.Lk);
        for (int h = 0; h < s.H; h++) {
            const size_t bh = (size_t)b * (size_t)s.H + (size_t)h;
            const float *Qh = Q + bh * (size_t)s.Lq * (size_t)s.d;
            const float *Kh = K + bh * (size_t)s.Lk * (size_t)s.d;
            const float *Vh = V + bh * (size_t)s.Lk * (size_t)dv;
            float *Oh = out + bh * (size_t)s.Lq * (size_t)dv;
            pf_fmap fm = pf_favor_fmap(&s, opts, favor, h);
            const pf_status sb = pf_favor_bind(&fm, &kw, favor, Qh, s.Lq, Kh, klen);
            int bad = sb != PF_OK;
            for (int j = 0; j < klen && !bad; j++)
                bad |= pf_fmap_row_f64(&fm, phiK + (size_t)j * r, u, Kh + (size_t)j * s.d);
            if (bad) {
                st = worse(st, sb != PF_OK ? sb : PF_ENONFINITE);
                memset(Oh, 0, sizeof(float) * (size_t)s.Lq * (size_t)dv);
                continue;
            }
            /* KV = sum_j phi(k_j) [v_j | 1]^T: all keys (bidirectional) or, causal, the prefix
             * j <= i, grown one key per query */
            memset(KV, 0, sizeof(double) * (size_t)r * (size_t)dv1);
            const int kend = opts->causal ? 0 : klen;
            for (int j = 0; j < kend; j++) {
                const double *pk = phiK + (size_t)j * r;
                const float *v = Vh + (size_t)j * dv;
                for (int f = 0; f < r; f++) {
                    double *row = KV + (size_t)f * dv1;
                    for (int k = 0; k < dv; k++) row[k] += pk[f] * (double)v[k];
                    row[dv] += pk[f];
                }
            }
            for (int i = 0; i < s.Lq; i++) {
                if (opts->causal && i < klen) {
                    const double *pk = phiK + (size_t)i * r;
                    const float *v = Vh + (size_t)i * dv;
                    for (int f = 0; f < r; f++) {
                        double *row = KV + (size_t)f * dv1;
                        for (int k = 0; k < dv; k++) row[k] += pk[f] * (double)v[k];
                        row[dv] += pk[f];
                    }
                }
                if (pf_fmap_row_f64(&fm, phiq, u, Qh + (size_t)i * s.d)) {
                    st = worse(st, PF_ENONFINITE);
                    memset(Oh + (size_t)i * dv, 0, sizeof(float) * (size_t)dv);
                    continue;
                }
                for (int k = 0; k < dv1; k++) num[k] = 0;
                for (int f = 0; f < r; f++) {
                    const double *row = KV + (size_t)f * dv1;
                    for (int k = 0; k < dv1; k++) num[k] += phiq[f] * row[k];
                }
                st = worse(st, readout_f64(Oh + (size_t)i * dv, num, dv));
            }
        }
    }
done:
    free(phiK);
    free(phiq);
    free(u);
    free(KV);
    free(num);
    pf_kernel_ws_free(&kw);
    return st;
}
