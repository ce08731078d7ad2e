/* attn_ra.c: randomized attention (RA, Zheng et al. 2022), the unbiased sampling estimator of
 * softmax attention, and the sampling options shared with LARA (attn_lara.c).
 *
 * With the scale folded into the inputs (q' = q sqrt(s), k' = k sqrt(s), so exp(q'.k') =
 * exp(s q.k)) and xi(x, w) = exp(w.x - |x|^2/2), softmax attention is an expectation:
 *
 *     p_i(w) = sum_j pi_ij N(w; q'_i + k'_j, I),   pi_ij = softmax_j(q'_i.k'_j)
 *     f(w)   = sum_j xi(k'_j, w) v_j / sum_j xi(k'_j, w)
 *     E_{p_i}[f(w)] = sum_j pi_ij v_j                       (exactly)
 *
 * RA draws S samples per query (j ~ pi_i, then w = q'_i + k'_j + eps, eps ~ N(0, I_d)) and
 * averages f(w), evaluated in log space with the row max subtracted. Only the valid keys
 * j < key_len[b] take part, in pi and in f.
 *
 * Randomness. Head (b, h) uses Philox stream b*H + h under sampling->seed. Query i of that head
 * starts at block counter i * 2^32 (ctr[1] = i, ctr[0] = 0), so every query owns 2^32 blocks
 * and its draws do not depend on which thread runs it or in what order. Per sample it takes
 * one uniform (the key index, by inverse CDF) then d normals (eps), in that order; a Box-Muller
 * spare carries over to the next sample of the same query.
 *
 * Work is split into (b, h, query block) items with boundaries fixed by the shape; each runs on
 * one thread and writes its own rows, so results are bit-identical at any thread count. The
 * samples of a block are batched: Omega (rows, d) times K^T and the softmax rows times V are
 * two cblas_sgemm calls. Cost O(S Lq Lk (d + dv)); memory O((QB + RB) Lk) per thread. */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attn_common.h"
#include "internal.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* QB queries per work item; RB sample rows per batched evaluation of f. */
enum { QB = 64, RB = 128 };

pf_sampling_opts pf_sampling_opts_default(void) {
    /* One proposal is the only count valid for every shape. */
    pf_sampling_opts o = {.samples = 1, .proposals = 1, .deterministic = 0, .seed = 0};
    return o;
}

/* Per-thread scratch. */
typedef struct ra_scratch {
    float *P;    /* (QB, Lk) exp(s q.k - max) of the block's queries */
    float *G;    /* (RB, Lk) exp(w.k' - |k'|^2/2 - max) of the pending samples */
    float *Om;   /* (RB, d)  pending samples w */
    float *F;    /* (RB, dv) G V */
    float *kn;   /* (Lk)     |k'_j|^2 / 2 */
    double *acc; /* (QB, dv) sum over samples of f(w) */
    double *inv; /* (RB)     1 / sum_j of each pending row */
    int *owner;  /* (RB)     the block row each pending sample belongs to */
} ra_scratch;

static void scratch_free(ra_scratch *w) {
    pf_free(w->P);
    pf_free(w->G);
    pf_free(w->Om);
    pf_free(w->F);
    pf_free(w->kn);
    pf_free(w->acc);
    pf_free(w->inv);
    pf_free(w->owner);
    memset(w, 0, sizeof(*w));
}

static int scratch_alloc(ra_scratch *w, int Lk, int d, int dv) {
    w->P = pf_alloc((size_t)QB * (size_t)Lk, sizeof(float));
    w->G = pf_alloc((size_t)RB * (size_t)Lk, sizeof(float));
    w->Om = pf_alloc((size_t)RB * (size_t)d, sizeof(float));
    w->F = pf_alloc((size_t)RB * (size_t)dv, sizeof(float));
    w->kn = pf_alloc((size_t)Lk, sizeof(float));
    w->acc = pf_alloc((size_t)QB * (size_t)dv, sizeof(double));
    w->inv = pf_alloc(RB, sizeof(double));
    w->owner = pf_alloc(RB, sizeof(int));
    if (!w->P || !w->G || !w->Om || !w->F || !w->kn || !w->acc || !w->inv || !w->owner) {
        scratch_free(w);
        return 0;
    }
    return 1;
}

/* f(w) for the n pending samples: acc[owner[r]] += softmax_j(w_r.k'_j - |k'_j|^2/2) V.
 * K (kl,d) and V (kl,dv) are the head's valid keys; rs = sqrt(s), so w.k' = rs (w.k). */
static void eval_f(ra_scratch *w, int n, const float *K, const float *V, int kl, int d, int dv,
                   float rs) {
    const pf_simd_table *simd = pf_simd();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, kl, d, rs, w->Om, d, K, d, 0.0f, w->G,
                kl);
    for (int r = 0; r < n; r++) {
        float *g = w->G + (size_t)r * kl;
        for (int j = 0; j < kl; j++) g[j] -= w->kn[j];
        float mx = simd->max(g, (size_t)kl);
        double z = simd->exp_sub_sum(g, g, mx, (size_t)kl);
        /* z >= 1 (the max term) unless a logit is not finite; then the row is NaN and the
         * caller's final check reports it. */
        w->inv[r] = 1.0 / z;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, dv, kl, 1.0f, w->G, kl, V, dv, 0.0f,
                w->F, dv);
    for (int r = 0; r < n; r++) {
        double *a = w->acc + (size_t)w->owner[r] * dv;
        const float *f = w->F + (size_t)r * dv;
        for (int c = 0; c < dv; c++) a[c] += (double)f[c] * w->inv[r];
    }
}

/* Queries [i0, i0 + bq) of one head: rows of out (Lq,dv). Q (Lq,d), K (Lk,d), V (Lk,dv) are
 * the head's slices, kl its valid key count. */
static pf_status ra_block(float *out, const float *Q, const float *K, const float *V, int i0,
                          int bq, int kl, int d, int dv, float s, int S, uint64_t seed,
                          uint64_t stream, ra_scratch *w) {
    const pf_simd_table *simd = pf_simd();
    const float rs = sqrtf(s);
    pf_status st = PF_OK;

    for (int j = 0; j < kl; j++) {
        const float *k = K + (size_t)j * d;
        double nn = 0.0;
        for (int c = 0; c < d; c++) nn += (double)k[c] * k[c];
        w->kn[j] = (float)(0.5 * s * nn);
    }
    memset(w->acc, 0, sizeof(double) * (size_t)bq * dv);

    /* pi_i: P = s Q_blk K^T, then exp(P - row max). */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, kl, d, s, Q + (size_t)i0 * d, d, K, d,
                0.0f, w->P, kl);
    int n = 0; /* pending sample rows in w->Om */
    for (int r = 0; r < bq; r++) {
        float *p = w->P + (size_t)r * kl;
        const float *q = Q + (size_t)(i0 + r) * d;
        float mx = simd->max(p, (size_t)kl);
        simd->exp_sub_sum(p, p, mx, (size_t)kl);
        /* The CDF is summed here, in index order, so the search below meets the same total. */
        double tot = 0.0;
        for (int j = 0; j < kl; j++) tot += p[j];
        if (!(tot > 0.0) || !isfinite(tot)) {
            st = PF_ENONFINITE; /* a score overflowed: the row is reported, not sampled */
            continue;
        }

        pf_rng rng;
        pf_rng_init(&rng, seed, stream);
        rng.ctr[1] = (uint32_t)(i0 + r); /* query i owns blocks [i 2^32, (i + 1) 2^32) */
        for (int smp = 0; smp < S; smp++) {
            /* j ~ pi_i by inverse CDF: the first j whose running sum passes u tot. Since
             * u < 1 and the sums match, the search stops at a j with p_j > 0. */
            double t = pf_rng_uniform(&rng) * tot, cum = 0.0;
            int jj = kl - 1;
            for (int j = 0; j < kl; j++) {
                cum += p[j];
                if (t < cum) {
                    jj = j;
                    break;
                }
            }
            /* w = q' + k'_j + eps */
            const float *k = K + (size_t)jj * d;
            float *om = w->Om + (size_t)n * d;
            for (int c = 0; c < d; c++) om[c] = rs * (q[c] + k[c]) + (float)pf_rng_normal(&rng);
            w->owner[n] = r;
            if (++n == RB) {
                eval_f(w, n, K, V, kl, d, dv, rs);
                n = 0;
            }
        }
    }
    if (n > 0) eval_f(w, n, K, V, kl, d, dv, rs);

    const double invS = 1.0 / S;
    for (int r = 0; r < bq; r++) {
        float *o = out + (size_t)(i0 + r) * dv;
        const double *a = w->acc + (size_t)r * dv;
        for (int c = 0; c < dv; c++) {
            o[c] = (float)(a[c] * invS);
            if (!isfinite(o[c])) st = PF_ENONFINITE;
        }
    }
    return st;
}

pf_status pf_attn_ra(float *out, const float *Q, const float *K, const float *V,
                     const pf_shape *shape, const pf_attn_opts *opts,
                     const pf_sampling_opts *sampling) {
    pf_status st = pf_attn_check(shape, opts);
    if (st != PF_OK) return st;
    if (!out || !Q || !K || !V || !sampling) return PF_EINVAL;
    if (pf_attn_alias_check(shape, opts, out, NULL, NULL, NULL, NULL, Q, K, V, NULL, NULL, NULL,
                            NULL, 0))
        return PF_EINVAL;
    if (opts->causal) return PF_ENOTSUP;
    if (sampling->deterministic != 0 && sampling->deterministic != 1) return PF_EINVAL;
    if (sampling->deterministic) return PF_ENOTSUP; /* RA has no deterministic variant */
    if (sampling->samples < 1) return PF_EINVAL;
    /* A query's draws must fit its 2^32 Philox blocks (2^34 words): per sample 2 words for
     * the uniform and at most 4 (d/2 + 1) for the normals. */
    if ((uint64_t)sampling->samples * (2 * (uint64_t)shape->d + 6) > ((uint64_t)1 << 34))
        return PF_EINVAL;
    pf_attn_sizes n = pf_attn_sizes_of(shape);
    if (pf_any_nonfinite(Q, n.q) || pf_any_nonfinite(K, n.k) || pf_any_nonfinite(V, n.v))
        return PF_ENONFINITE;

    const int B = shape->B, H = shape->H, Lq = shape->Lq, Lk = shape->Lk;
    const int d = shape->d, dv = shape->dv, S = sampling->samples;
    const float s = pf_effective_scale(opts->scale, d);
    const uint64_t seed = sampling->seed;
    const int nqb = (Lq + QB - 1) / QB;
    const int64_t items = (int64_t)B * H * nqb;
    int nt = pf_threads(opts->threads);
    if (nt > items) nt = (int)items;

    st = PF_OK;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
    {
        pf_blas_pin();
        ra_scratch w;
        int ok = scratch_alloc(&w, Lk, d, dv);
        if (!ok) pf_status_record(&st, PF_ENOMEM);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < items; t++) {
            if (!ok) continue;
            int64_t bh = t / nqb;
            int b = (int)(bh / H);
            int i0 = (int)(t % nqb) * QB;
            pf_status sb =
                ra_block(out + (size_t)bh * Lq * dv, Q + (size_t)bh * Lq * d,
                         K + (size_t)bh * Lk * d, V + (size_t)bh * Lk * dv, i0, pf_imin(QB, Lq - i0),
                         pf_attn_key_len(opts, b, Lk), d, dv, s, S, seed, (uint64_t)bh, &w);
            if (sb != PF_OK) pf_status_record(&st, sb);
        }
        if (ok) scratch_free(&w);
    }
    return st;
}
