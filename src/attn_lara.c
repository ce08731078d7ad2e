/* attn_lara.c: LARA (Zheng et al. 2022), linear-time randomized attention: self-normalised multiple
 * importance sampling of softmax attention with C chunk proposals. Fast path and reference.
 *
 * Scaled inputs q' = q sqrt(s), k' = k sqrt(s); xi(x, w) = exp(w.x - |x|^2/2). The target of
 * query i is p_i(w) = sum_j pi_ij N(w; q'_i + k'_j, I) and the integrand is
 * f(w) = sum_j xi(k'_j, w) v_j / sum_j xi(k'_j, w), with E_{p_i}[f] = softmax attention.
 *
 * Proposals. The queries [0, Lq) and the valid keys [0, key_len[b]) of a head are each cut
 * into C contiguous chunks, chunk c being [floor(c n / C), floor((c + 1) n / C)) (sizes differ
 * by at most 1). With q-bar_c, k-bar_c the chunk means of the scaled vectors,
 * mu_c = q-bar_c + k-bar_c and proposal c is N(mu_c, I). Each proposal gives S samples
 * w_cs = mu_c + eps_cs, eps ~ N(0, I_d) (deterministic: eps = 0, S = 1). For every sample,
 *
 *     l_cs         = logsumexp_j (w.k'_j - |k'_j|^2/2)
 *     kv_cs        = sum_j softmax_j (w.k'_j - |k'_j|^2/2) v_j
 *     log alpha_cs = log N(w; mu_c, I) - log sum_c' N(w; mu_c', I)        (balance heuristic)
 *     log w_ics    = log alpha_cs + (w.q'_i - |q'_i|^2/2) + l_cs - (w.mu_c - |mu_c|^2/2)
 *     out_i        = sum_{c,s} softmax_{(c,s)}(log w_ics) kv_cs
 *
 * (log w_ics is log p_i(w)/N(w; mu_c, I) up to a constant of query i, times alpha.)
 *
 * Randomness. Head (b, h) uses Philox stream b*H + h under sampling->seed; proposal c starts at
 * block counter c * 2^32 (ctr[1] = c, ctr[0] = 0) and draws its S*d normals sample by sample,
 * dimension by dimension, as float(pf_rng_normal). Both paths take their samples from
 * lara_draw, so the reference evaluates the estimator at exactly the fast path's w.
 *
 * The fast path rewrites the weights before evaluating them: the Gaussian of the own proposal
 * cancels against -(w.mu_c - |mu_c|^2/2) (the |w|^2/2 terms cancel too), and |q'_i|^2/2 is a
 * constant of row i, so
 *
 *     log w_ics = w.q'_i + beta_cs + const_i,
 *     beta_cs   = l_cs - logsumexp_c' (w.mu_c' - |mu_c'|^2/2),
 *
 * i.e. the balance heuristic divides by the mixture density. All dot products are batched
 * sgemm calls: Omega (CS,d) K^T, Omega Mu^T, Q Omega^T; softmaxes subtract their row max. Cost
 * O(C S (Lq + Lk + C) (d + dv)); memory O(C S (d + dv) + RB (Lk + C) + QB C S) per thread.
 * Work is split by head (b, h); each head runs on one thread, so results do not depend on the
 * thread count. The reference evaluates the formula above literally, in float64. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attn_common.h"
#include "internal.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* RB samples per batched key pass; QB queries per batched query pass. */
enum { RB = 128, QB = 64 };

/* The start of chunk c of C over [0, n): floor(c n / C). */
static int chunk_start(int c, int C, int n) {
    return (int)((int64_t)c * n / C);
}

/* Arguments shared by both paths: PF_OK or the status to return. */
static pf_status lara_check(const float *out, const float *Q, const float *K, const float *V,
                            const pf_shape *shape, const pf_attn_opts *opts,
                            const pf_sampling_opts *sp) {
    pf_status st = pf_attn_check(shape, opts);
    if (st != PF_OK) return st;
    if (!out || !Q || !K || !V || !sp) return PF_EINVAL;
    if (pf_attn_alias_check(shape, opts, out, NULL, NULL, NULL, NULL, Q, K, V, NULL, NULL, NULL,
                            NULL, 0))
        return PF_EINVAL;
    if (opts->causal) return PF_ENOTSUP; /* causal LARA: an open question (Zheng et al. 2022) */
    if (sp->samples < 1) return PF_EINVAL;
    if (sp->deterministic != 0 && sp->deterministic != 1) return PF_EINVAL;
    if (sp->deterministic && sp->samples != 1) return PF_EINVAL;
    /* Every chunk of queries and of valid keys must be non-empty. */
    int kmin = shape->Lk;
    for (int b = 0; b < shape->B; b++) kmin = pf_imin(kmin, pf_attn_key_len(opts, b, shape->Lk));
    if (sp->proposals < 1 || sp->proposals > shape->Lq || sp->proposals > kmin) return PF_EINVAL;
    /* C S must be an sgemm dimension, and a proposal's S d normals must fit its 2^32 Philox
     * blocks (two normals per block). */
    if ((int64_t)sp->proposals * sp->samples > INT_MAX) return PF_EINVAL;
    if ((uint64_t)sp->samples * ((uint64_t)shape->d + 1) > ((uint64_t)1 << 33)) return PF_EINVAL;
    pf_attn_sizes n = pf_attn_sizes_of(shape);
    if (pf_any_nonfinite(Q, n.q) || pf_any_nonfinite(K, n.k) || pf_any_nonfinite(V, n.v))
        return PF_ENONFINITE;
    return PF_OK;
}

/* The proposals and samples of one head: mu (C,d) and Om (C*S,d), row c*S + s holding w_cs.
 * Q (Lq,d) and K (kl,d) are the head's queries and valid keys, rs = sqrt(s). tmp: 2d doubles.
 * The means are summed in double and rounded once; the samples are float(mu) + float(eps). */
static void lara_draw(float *mu, float *Om, double *tmp, const float *Q, const float *K, int Lq,
                      int kl, int d, int C, int S, int det, double rs, uint64_t seed,
                      uint64_t stream) {
    double *sq = tmp, *sk = tmp + d;
    for (int c = 0; c < C; c++) {
        int q0 = chunk_start(c, C, Lq), q1 = chunk_start(c + 1, C, Lq);
        int k0 = chunk_start(c, C, kl), k1 = chunk_start(c + 1, C, kl);
        for (int x = 0; x < d; x++) sq[x] = sk[x] = 0.0;
        for (int i = q0; i < q1; i++) {
            for (int x = 0; x < d; x++) sq[x] += Q[(size_t)i * d + x];
        }
        for (int j = k0; j < k1; j++) {
            for (int x = 0; x < d; x++) sk[x] += K[(size_t)j * d + x];
        }
        float *m = mu + (size_t)c * d;
        for (int x = 0; x < d; x++) m[x] = (float)(rs * (sq[x] / (q1 - q0) + sk[x] / (k1 - k0)));

        pf_rng rng;
        pf_rng_init(&rng, seed, stream);
        rng.ctr[1] = (uint32_t)c; /* proposal c owns blocks [c 2^32, (c + 1) 2^32) */
        for (int s = 0; s < S; s++) {
            float *om = Om + ((size_t)c * S + s) * d;
            for (int x = 0; x < d; x++) om[x] = det ? m[x] : m[x] + (float)pf_rng_normal(&rng);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Fast path
 * ------------------------------------------------------------------------------------------ */

typedef struct lara_scratch {
    float *mu;   /* (C,d) */
    float *Om;   /* (CS,d) */
    float *KV;   /* (CS,dv) kv_cs */
    float *beta; /* (CS) */
    float *kn;   /* (Lk) |k'_j|^2 / 2 */
    float *mn;   /* (C) |mu_c|^2 / 2 */
    float *G;    /* (RB, max(Lk, C)) logits of a block of samples */
    float *Wt;   /* (QB, CS) log weights, then weights, of a block of queries */
    double *tmp; /* (2d) */
} lara_scratch;

static void lscratch_free(lara_scratch *w) {
    pf_free(w->mu);
    pf_free(w->Om);
    pf_free(w->KV);
    pf_free(w->beta);
    pf_free(w->kn);
    pf_free(w->mn);
    pf_free(w->G);
    pf_free(w->Wt);
    pf_free(w->tmp);
    memset(w, 0, sizeof(*w));
}

static int lscratch_alloc(lara_scratch *w, int Lk, int d, int dv, int C, int CS) {
    size_t cs = (size_t)CS;
    w->mu = pf_alloc((size_t)C * (size_t)d, sizeof(float));
    w->Om = pf_alloc(cs * (size_t)d, sizeof(float));
    w->KV = pf_alloc(cs * (size_t)dv, sizeof(float));
    w->beta = pf_alloc(cs, sizeof(float));
    w->kn = pf_alloc((size_t)Lk, sizeof(float));
    w->mn = pf_alloc((size_t)C, sizeof(float));
    w->G = pf_alloc((size_t)RB * (size_t)(Lk > C ? Lk : C), sizeof(float));
    w->Wt = pf_alloc((size_t)QB * cs, sizeof(float));
    w->tmp = pf_alloc(2 * (size_t)d, sizeof(double));
    if (!w->mu || !w->Om || !w->KV || !w->beta || !w->kn || !w->mn || !w->G || !w->Wt || !w->tmp) {
        lscratch_free(w);
        return 0;
    }
    return 1;
}

/* One head: out (Lq,dv) from Q (Lq,d), K (kl,d), V (kl,dv). */
static pf_status lara_head(float *out, const float *Q, const float *K, const float *V, int Lq,
                           int kl, int d, int dv, float s, int C, int S, int det, uint64_t seed,
                           uint64_t stream, lara_scratch *w) {
    const pf_simd_table *simd = pf_simd();
    const float rs = sqrtf(s);
    const int CS = C * S;
    pf_status st = PF_OK;

    lara_draw(w->mu, w->Om, w->tmp, Q, K, Lq, kl, d, C, S, det, sqrt((double)s), seed, stream);
    for (int j = 0; j < kl; j++) {
        double nn = 0.0;
        for (int x = 0; x < d; x++) nn += (double)K[(size_t)j * d + x] * K[(size_t)j * d + x];
        w->kn[j] = (float)(0.5 * s * nn);
    }
    for (int c = 0; c < C; c++) {
        double nn = 0.0;
        const float *m = w->mu + (size_t)c * d;
        for (int x = 0; x < d; x++) nn += (double)m[x] * m[x];
        w->mn[c] = (float)(0.5 * nn);
    }

    /* Per sample: kv_cs, l_cs and beta_cs, RB samples at a time. */
    for (int r0 = 0; r0 < CS; r0 += RB) {
        int n = pf_imin(RB, CS - r0);
        const float *om = w->Om + (size_t)r0 * d;
        float *kv = w->KV + (size_t)r0 * dv;
        double l[RB];
        /* G = Omega K'^T - |k'|^2/2  (n,kl), then exp(G - max) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, kl, d, rs, om, d, K, d, 0.0f, w->G,
                    kl);
        double zi[RB];
        for (int r = 0; r < n; r++) {
            float *g = w->G + (size_t)r * kl;
            for (int j = 0; j < kl; j++) g[j] -= w->kn[j];
            float mx = simd->max(g, (size_t)kl);
            double z = simd->exp_sub_sum(g, g, mx, (size_t)kl);
            l[r] = (double)mx + log(z);
            zi[r] = 1.0 / z;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, dv, kl, 1.0f, w->G, kl, V, dv,
                    0.0f, kv, dv);
        for (int r = 0; r < n; r++) {
            for (int c = 0; c < dv; c++) kv[(size_t)r * dv + c] *= (float)zi[r];
        }
        /* G = Omega Mu^T - |mu|^2/2  (n,C): log of each proposal's density up to a constant */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, C, d, 1.0f, om, d, w->mu, d, 0.0f,
                    w->G, C);
        for (int r = 0; r < n; r++) {
            float *g = w->G + (size_t)r * C;
            for (int c = 0; c < C; c++) g[c] -= w->mn[c];
            float mx = simd->max(g, (size_t)C);
            double z = simd->exp_sub_sum(g, g, mx, (size_t)C);
            w->beta[r0 + r] = (float)(l[r] - ((double)mx + log(z)));
        }
    }

    /* Per query: out_i = softmax_cs(w.q'_i + beta_cs) KV, QB queries at a time. */
    for (int i0 = 0; i0 < Lq; i0 += QB) {
        int bq = pf_imin(QB, Lq - i0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, CS, d, rs, Q + (size_t)i0 * d, d,
                    w->Om, d, 0.0f, w->Wt, CS);
        double z[QB];
        for (int r = 0; r < bq; r++) {
            float *lw = w->Wt + (size_t)r * CS;
            for (int c = 0; c < CS; c++) lw[c] += w->beta[c];
            float mx = simd->max(lw, (size_t)CS);
            z[r] = simd->exp_sub_sum(lw, lw, mx, (size_t)CS);
        }
        float *o = out + (size_t)i0 * dv;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bq, dv, CS, 1.0f, w->Wt, CS, w->KV,
                    dv, 0.0f, o, dv);
        for (int r = 0; r < bq; r++) {
            /* z >= 1 (the max term) unless a logit is not finite */
            double inv = 1.0 / z[r];
            for (int c = 0; c < dv; c++) {
                float *e = o + (size_t)r * dv + c;
                *e = (float)(*e * inv);
                if (!isfinite(*e)) st = PF_ENONFINITE;
            }
        }
    }
    return st;
}

pf_status pf_attn_lara(float *out, const float *Q, const float *K, const float *V,
                       const pf_shape *shape, const pf_attn_opts *opts,
                       const pf_sampling_opts *sampling) {
    pf_status st = lara_check(out, Q, K, V, shape, opts, sampling);
    if (st != PF_OK) return st;

    const int B = shape->B, H = shape->H, Lq = shape->Lq, Lk = shape->Lk;
    const int d = shape->d, dv = shape->dv;
    const int C = sampling->proposals, S = sampling->samples, det = sampling->deterministic;
    const float s = pf_effective_scale(opts->scale, d);
    const uint64_t seed = sampling->seed;
    const int64_t items = (int64_t)B * H;
    int nt = pf_threads(opts->threads);
    if (nt > items) nt = (int)items;

#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
    {
        pf_blas_pin();
        lara_scratch w;
        int ok = lscratch_alloc(&w, Lk, d, dv, C, C * S);
        if (!ok) pf_status_record(&st, PF_ENOMEM);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t bh = 0; bh < items; bh++) {
            if (!ok) continue;
            int b = (int)(bh / H);
            pf_status sh = lara_head(out + (size_t)bh * Lq * dv, Q + (size_t)bh * Lq * d,
                                     K + (size_t)bh * Lk * d, V + (size_t)bh * Lk * dv, Lq,
                                     pf_attn_key_len(opts, b, Lk), d, dv, s, C, S, det, seed,
                                     (uint64_t)bh, &w);
            if (sh != PF_OK) pf_status_record(&st, sh);
        }
        if (ok) lscratch_free(&w);
    }
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * Reference: the formula as written, in float64, one sample and one query at a time.
 * ------------------------------------------------------------------------------------------ */

pf_status pf_attn_lara_ref(float *out, const float *Q, const float *K, const float *V,
                           const pf_shape *shape, const pf_attn_opts *opts,
                           const pf_sampling_opts *sampling) {
    pf_status st = lara_check(out, Q, K, V, shape, opts, sampling);
    if (st != PF_OK) return st;

    const int B = shape->B, H = shape->H, Lq = shape->Lq, Lk = shape->Lk;
    const int d = shape->d, dv = shape->dv;
    const int C = sampling->proposals, S = sampling->samples, det = sampling->deterministic;
    const size_t CS = (size_t)C * (size_t)S;
    const double s = (double)pf_effective_scale(opts->scale, d), rs = sqrt(s);

    float *mu = pf_alloc((size_t)C * (size_t)d, sizeof(float));
    float *Om = pf_alloc(CS * (size_t)d, sizeof(float));
    double *tmp = pf_alloc(2 * (size_t)d, sizeof(double));
    double *g = pf_alloc((size_t)(Lk > C ? Lk : C), sizeof(double)); /* logits of one sample */
    double *kv = pf_alloc(CS * (size_t)dv, sizeof(double));
    double *base = pf_alloc(CS, sizeof(double)); /* log alpha + l - (w.mu_c - |mu_c|^2/2) */
    double *lw = pf_alloc(CS, sizeof(double));
    double *qd = pf_alloc((size_t)d, sizeof(double));
    double *o = pf_alloc((size_t)dv, sizeof(double));
    if (!mu || !Om || !tmp || !g || !kv || !base || !lw || !qd || !o) {
        st = PF_ENOMEM;
        goto done;
    }

    for (int b = 0; b < B; b++) {
        const int kl = pf_attn_key_len(opts, b, Lk);
        for (int h = 0; h < H; h++) {
            const size_t bh = (size_t)b * H + h;
            const float *Qh = Q + bh * Lq * d, *Kh = K + bh * Lk * d, *Vh = V + bh * Lk * dv;
            lara_draw(mu, Om, tmp, Qh, Kh, Lq, kl, d, C, S, det, rs, sampling->seed, bh);

            for (size_t cs = 0; cs < CS; cs++) {
                const float *w = Om + cs * d;
                const float *m = mu + (cs / (size_t)S) * d;
                /* l_cs and kv_cs: logits w.k'_j - |k'_j|^2/2 */
                double mx = -INFINITY;
                for (int j = 0; j < kl; j++) {
                    double dot = 0.0, nn = 0.0;
                    for (int x = 0; x < d; x++) {
                        double k = rs * Kh[(size_t)j * d + x];
                        dot += (double)w[x] * k;
                        nn += k * k;
                    }
                    g[j] = dot - 0.5 * nn;
                    mx = fmax(mx, g[j]);
                }
                double z = 0.0;
                double *kvr = kv + cs * dv;
                for (int c = 0; c < dv; c++) kvr[c] = 0.0;
                for (int j = 0; j < kl; j++) {
                    double e = exp(g[j] - mx);
                    z += e;
                    for (int c = 0; c < dv; c++) kvr[c] += e * Vh[(size_t)j * dv + c];
                }
                for (int c = 0; c < dv; c++) kvr[c] /= z;
                double l = mx + log(z);

                /* log alpha: log N(w; mu_c, I) - log sum_c' N(w; mu_c', I) */
                double gmx = -INFINITY, own = 0.0;
                for (int c = 0; c < C; c++) {
                    double dd = 0.0;
                    for (int x = 0; x < d; x++) {
                        double e = (double)w[x] - mu[(size_t)c * d + x];
                        dd += e * e;
                    }
                    g[c] = -0.5 * dd;
                    gmx = fmax(gmx, g[c]);
                    if ((size_t)c == cs / (size_t)S) own = g[c];
                }
                double gz = 0.0;
                for (int c = 0; c < C; c++) gz += exp(g[c] - gmx);
                double log_alpha = own - (gmx + log(gz));

                double wm = 0.0, mm = 0.0;
                for (int x = 0; x < d; x++) {
                    wm += (double)w[x] * m[x];
                    mm += (double)m[x] * m[x];
                }
                base[cs] = log_alpha + l - (wm - 0.5 * mm);
            }

            for (int i = 0; i < Lq; i++) {
                double qq = 0.0;
                for (int x = 0; x < d; x++) {
                    qd[x] = rs * Qh[(size_t)i * d + x];
                    qq += qd[x] * qd[x];
                }
                double mx = -INFINITY;
                for (size_t cs = 0; cs < CS; cs++) {
                    double dot = 0.0;
                    for (int x = 0; x < d; x++) dot += (double)Om[cs * d + x] * qd[x];
                    lw[cs] = base[cs] + dot - 0.5 * qq;
                    mx = fmax(mx, lw[cs]);
                }
                double z = 0.0;
                for (int c = 0; c < dv; c++) o[c] = 0.0;
                for (size_t cs = 0; cs < CS; cs++) {
                    double e = exp(lw[cs] - mx);
                    z += e;
                    for (int c = 0; c < dv; c++) o[c] += e * kv[cs * dv + c];
                }
                float *orow = out + (bh * Lq + i) * dv;
                for (int c = 0; c < dv; c++) {
                    orow[c] = (float)(o[c] / z);
                    if (!isfinite(orow[c])) st = PF_ENONFINITE;
                }
            }
        }
    }

done:
    pf_free(mu);
    pf_free(Om);
    pf_free(tmp);
    pf_free(g);
    pf_free(kv);
    pf_free(base);
    pf_free(lw);
    pf_free(qd);
    pf_free(o);
    return st;
}
