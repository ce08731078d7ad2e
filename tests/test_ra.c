/* test_ra.c: randomized attention (RA, Zheng et al. 2022), the unbiased sampling estimator.
 *
 * The reference is exact softmax attention computed here in float64. RA is random, so the
 * checks are statistical, each with its bound stated where it is made: the mean over many
 * independent seeds must sit within 5 standard errors of exact attention, its error must fall
 * like 1/sqrt(N), and more samples per query must mean less error. Padding, thread-count
 * independence, determinism and every error path are checked exactly. */
#include <stdint.h>
#include <string.h>

#include "check.h"

typedef struct cfg {
    int B, H, Lq, Lk, d, dv;
    const int32_t *key_len; /* NULL: all keys */
} cfg;

static pf_shape shape_of(const cfg *c) {
    pf_shape s = {c->B, c->H, c->Lq, c->Lk, c->d, c->dv};
    return s;
}

static size_t nq(const cfg *c) {
    return (size_t)c->B * c->H * c->Lq * c->d;
}
static size_t nk(const cfg *c) {
    return (size_t)c->B * c->H * c->Lk * c->d;
}
static size_t nv(const cfg *c) {
    return (size_t)c->B * c->H * c->Lk * c->dv;
}
static size_t nout(const cfg *c) {
    return (size_t)c->B * c->H * c->Lq * c->dv;
}

/* Exact attention by the definition, in double, default scale 1/sqrt(d), over j < key_len. */
static void exact_f64(double *out, const float *Q, const float *K, const float *V, const cfg *c) {
    double s = 1.0 / sqrt((double)c->d);
    double *sc = xmalloc(sizeof(double) * (size_t)c->Lk);
    for (int b = 0; b < c->B; b++) {
        int kl = c->key_len ? c->key_len[b] : c->Lk;
        for (int h = 0; h < c->H; h++) {
            size_t bh = (size_t)b * c->H + h;
            for (int i = 0; i < c->Lq; i++) {
                const float *q = Q + (bh * c->Lq + i) * c->d;
                double mx = -INFINITY;
                for (int j = 0; j < kl; j++) {
                    const float *k = K + (bh * c->Lk + j) * c->d;
                    double dot = 0;
                    for (int e = 0; e < c->d; e++) dot += (double)q[e] * k[e];
                    sc[j] = s * dot;
                    mx = fmax(mx, sc[j]);
                }
                double z = 0, *o = out + (bh * c->Lq + i) * c->dv;
                for (int e = 0; e < c->dv; e++) o[e] = 0;
                for (int j = 0; j < kl; j++) {
                    double w = exp(sc[j] - mx);
                    z += w;
                    for (int e = 0; e < c->dv; e++) o[e] += w * V[(bh * c->Lk + j) * c->dv + e];
                }
                for (int e = 0; e < c->dv; e++) o[e] /= z;
            }
        }
    }
    free(sc);
}

static pf_status run_ra(float *out, const float *Q, const float *K, const float *V, const cfg *c,
                        int S, uint64_t seed, int threads) {
    pf_shape sh = shape_of(c);
    pf_attn_opts o = pf_attn_opts_default();
    o.key_len = c->key_len;
    o.threads = threads;
    pf_sampling_opts sp = pf_sampling_opts_default();
    sp.samples = S;
    sp.seed = seed;
    return pf_attn_ra(out, Q, K, V, &sh, &o, &sp);
}

/* ---- unbiasedness: the mean over N seeds converges to exact attention ----------------------- */

static void test_unbiased(void) {
    const cfg c = {1, 2, 16, 16, 8, 4, NULL};
    enum { N = 400, S = 8, G = 16 };
    const size_t n = nout(&c);
    float *Q = xmalloc(sizeof(float) * nq(&c)), *K = xmalloc(sizeof(float) * nk(&c));
    float *V = xmalloc(sizeof(float) * nv(&c)), *out = xmalloc(sizeof(float) * n);
    double *ex = xmalloc(sizeof(double) * n);
    double *sum = calloc(n, sizeof(double)), *sum2 = calloc(n, sizeof(double));
    double *gsum = calloc((size_t)G * n, sizeof(double)); /* sums over 16 groups of 25 seeds */
    /* sigma 1.5: scores s q.k have std ~2.1, so attention is far from uniform and far from
     * one-hot, and the RA samples vary. */
    fill_normal(Q, nq(&c), 1.5f, 11, 0);
    fill_normal(K, nk(&c), 1.5f, 11, 1);
    fill_normal(V, nv(&c), 1.0f, 11, 2);
    exact_f64(ex, Q, K, V, &c);

    for (int r = 0; r < N; r++) {
        CHECK_STATUS(run_ra(out, Q, K, V, &c, S, 1000 + (uint64_t)r, 0), PF_OK);
        for (size_t e = 0; e < n; e++) {
            sum[e] += out[e];
            sum2[e] += (double)out[e] * out[e];
            gsum[(size_t)(r / (N / G)) * n + e] += out[e];
        }
    }

    /* Per element: z = (mean - exact) / (sd / sqrt(N)). RA is unbiased and each replicate is
     * an average of bounded f(w) (a convex combination of the v_j), so by the CLT z is close
     * to N(0,1); |z| > 5 has probability 6e-7 per element, < 1e-4 over all 128. */
    double var[4 * 16 * 2], zmax = 0, z2 = 0;
    int nvar = 0;
    for (size_t e = 0; e < n; e++) {
        double m = sum[e] / N;
        var[e] = (sum2[e] - N * m * m) / (N - 1);
        double se = sqrt(var[e] / N);
        double z = (m - ex[e]) / se;
        CHECK(fabs(z) <= 5.0, "element %zu: mean %.6f exact %.6f se %.2e z %.2f", e, m, ex[e], se,
              z);
        zmax = fmax(zmax, fabs(z));
        z2 += z * z;
        nvar += var[e] > 1e-8;
    }
    /* The samples really vary (otherwise the z test says nothing). */
    CHECK(nvar == (int)n, "only %d of %zu elements vary over seeds", nvar, n);
    /* Overall: mean z^2 ~ chi^2_k / k with mean 1. Different queries use independent draws, so
     * k >= 32 even if a query's 4 outputs were perfectly correlated: P(chi^2_32/32 > 2.5) and
     * P(chi^2_32/32 < 0.3) are both below 1e-4. */
    z2 /= (double)n;
    CHECK(z2 <= 2.5 && z2 >= 0.3, "mean z^2 %.3f outside [0.3, 2.5]", z2);
    printf("RA unbiased: L=16 d=8 dv=4 H=2, %d seeds x S=%d: max |z| %.2f, mean z^2 %.3f\n", N, S,
           zmax, z2);

    /* 1/sqrt(N): the variance-normalised squared error of a mean of N seeds has expectation
     * 1/N. Averaged over the disjoint groups: 16 groups of 25, 4 of 100, all 400. Each step
     * (4x the seeds) should halve the RMS error; allowed: a ratio in [1.4, 2.9] (MSE ratio in
     * [2, 8.4]; the smallest sample, N = 400, is a chi^2 with >= 32 degrees of freedom, which
     * stays within that factor of its mean with probability > 0.99). */
    double mse[3] = {0, 0, 0};
    const int per[3] = {25, 100, 400};
    for (int lvl = 0; lvl < 3; lvl++) {
        int groups = N / per[lvl], step = per[lvl] / (N / G);
        for (int g = 0; g < groups; g++) {
            for (size_t e = 0; e < n; e++) {
                double s = 0;
                for (int k = 0; k < step; k++) s += gsum[(size_t)(g * step + k) * n + e];
                double err = s / per[lvl] - ex[e];
                mse[lvl] += err * err / var[e];
            }
        }
        mse[lvl] /= (double)groups * (double)n;
    }
    for (int lvl = 0; lvl < 3; lvl++) {
        printf("RA unbiased: N=%3d normalised RMS error %.4f (1/sqrt(N) = %.4f)\n", per[lvl],
               sqrt(mse[lvl]), 1.0 / sqrt(per[lvl]));
    }
    for (int lvl = 0; lvl < 2; lvl++) {
        double ratio = sqrt(mse[lvl] / mse[lvl + 1]);
        CHECK(ratio >= 1.4 && ratio <= 2.9, "N %d -> %d: RMS error ratio %.3f not in [1.4, 2.9]",
              per[lvl], per[lvl + 1], ratio);
    }
    free(Q);
    free(K);
    free(V);
    free(out);
    free(ex);
    free(sum);
    free(sum2);
    free(gsum);
}

/* ---- more samples, less error --------------------------------------------------------------- */

static void test_samples(void) {
    const cfg c = {1, 2, 64, 48, 16, 8, NULL};
    const size_t n = nout(&c);
    float *Q = xmalloc(sizeof(float) * nq(&c)), *K = xmalloc(sizeof(float) * nk(&c));
    float *V = xmalloc(sizeof(float) * nv(&c)), *out = xmalloc(sizeof(float) * n);
    double *ex = xmalloc(sizeof(double) * n);
    fill_normal(Q, nq(&c), 1.5f, 12, 0);
    fill_normal(K, nk(&c), 1.5f, 12, 1);
    fill_normal(V, nv(&c), 1.0f, 12, 2);
    exact_f64(ex, Q, K, V, &c);

    /* The error of a mean of S independent samples is ~ sd / sqrt(S), summed over 1024
     * outputs (128 independent queries), so the norm-wise relative error is a stable quantity:
     * expected ratios 2 (S 1 -> 4), 2 (4 -> 16), 2 (16 -> 64). Required: each step falls by a
     * factor >= 1.5 and S = 64 is >= 5x below S = 1 (expected 8x). Averaged over 3 seeds. */
    const int Ss[4] = {1, 4, 16, 64};
    double err[4];
    for (int t = 0; t < 4; t++) {
        err[t] = 0;
        for (int r = 0; r < 3; r++) {
            CHECK_STATUS(run_ra(out, Q, K, V, &c, Ss[t], 77 + (uint64_t)r, 0), PF_OK);
            err[t] += rel_err_f64(out, ex, n) / 3;
        }
        printf("RA samples: S=%2d relative error %.4f\n", Ss[t], err[t]);
    }
    for (int t = 0; t < 3; t++) {
        CHECK(err[t + 1] * 1.5 <= err[t], "S %d -> %d: error %.4f -> %.4f", Ss[t], Ss[t + 1],
              err[t], err[t + 1]);
    }
    CHECK(err[3] * 5 <= err[0], "S 1 -> 64: error %.4f -> %.4f", err[0], err[3]);
    free(Q);
    free(K);
    free(V);
    free(out);
    free(ex);
}

/* ---- padding, threads, determinism ---------------------------------------------------------- */

/* Copies rows [0, Lk') of every head of a (B,H,Lk,w) tensor. */
static void truncate_rows(float *dst, const float *src, int BH, int Lk, int Lk2, int w) {
    for (int bh = 0; bh < BH; bh++) {
        memcpy(dst + (size_t)bh * Lk2 * w, src + (size_t)bh * Lk * w,
               sizeof(float) * (size_t)Lk2 * w);
    }
}

static void test_padding_threads(void) {
    /* Lq = 150: three query blocks, the last partial. */
    const int32_t kl[2] = {37, 70};
    const cfg c = {2, 3, 150, 70, 12, 5, kl};
    const size_t n = nout(&c);
    float *Q = xmalloc(sizeof(float) * nq(&c)), *K = xmalloc(sizeof(float) * nk(&c));
    float *V = xmalloc(sizeof(float) * nv(&c));
    float *o1 = xmalloc(sizeof(float) * n), *o2 = xmalloc(sizeof(float) * n);
    fill_normal(Q, nq(&c), 1.0f, 13, 0);
    fill_normal(K, nk(&c), 1.0f, 13, 1);
    fill_normal(V, nv(&c), 1.0f, 13, 2);
    /* Padded keys hold junk that must not matter. */
    for (int bh = 0; bh < 3; bh++) {
        for (size_t e = (size_t)kl[0] * c.d; e < (size_t)c.Lk * c.d; e++)
            K[(size_t)bh * c.Lk * c.d + e] = 50.0f;
    }

    /* Thread count: bit-identical. */
    CHECK_STATUS(run_ra(o1, Q, K, V, &c, 5, 3, 1), PF_OK);
    CHECK_STATUS(run_ra(o2, Q, K, V, &c, 5, 3, 2), PF_OK);
    CHECK(memcmp(o1, o2, sizeof(float) * n) == 0, "threads 1 and 2 differ");
    CHECK_STATUS(run_ra(o2, Q, K, V, &c, 5, 3, 3), PF_OK);
    CHECK(memcmp(o1, o2, sizeof(float) * n) == 0, "threads 1 and 3 differ");
    /* Same seed, same result; another seed, another result. */
    CHECK_STATUS(run_ra(o2, Q, K, V, &c, 5, 3, 0), PF_OK);
    CHECK(memcmp(o1, o2, sizeof(float) * n) == 0, "same seed differs");
    CHECK_STATUS(run_ra(o2, Q, K, V, &c, 5, 4, 0), PF_OK);
    CHECK(rel_err(o2, o1, n) > 1e-3, "seeds 3 and 4 agree: %.2e", rel_err(o2, o1, n));

    /* Padding: batch 0 (37 valid keys) equals the call on K, V cut to 37 keys (same streams:
     * b*H + h is unchanged); batch 1 (all 70 valid) equals the call without key_len. */
    const cfg ct = {2, 3, 150, 37, 12, 5, NULL};
    float *Kt = xmalloc(sizeof(float) * nk(&ct)), *Vt = xmalloc(sizeof(float) * nv(&ct));
    truncate_rows(Kt, K, 6, c.Lk, ct.Lk, c.d);
    truncate_rows(Vt, V, 6, c.Lk, ct.Lk, c.dv);
    CHECK_STATUS(run_ra(o2, Q, Kt, Vt, &ct, 5, 3, 0), PF_OK);
    size_t half = n / 2;
    CHECK(rel_err(o1, o2, half) <= 1e-6, "batch 0 vs truncated keys: %.2e", rel_err(o1, o2, half));
    const cfg cn = {2, 3, 150, 70, 12, 5, NULL};
    CHECK_STATUS(run_ra(o2, Q, K, V, &cn, 5, 3, 0), PF_OK);
    CHECK(rel_err(o1 + half, o2 + half, half) <= 1e-6, "batch 1 vs no padding: %.2e",
          rel_err(o1 + half, o2 + half, half));

    /* And padded RA still estimates exact attention over the valid keys: the error of S = 64
     * samples is ~1/8 of that of S = 1 (900 queries average out the randomness of these norms);
     * required: below 1/4. */
    double *ex = xmalloc(sizeof(double) * n);
    exact_f64(ex, Q, K, V, &c);
    CHECK_STATUS(run_ra(o2, Q, K, V, &c, 1, 9, 0), PF_OK);
    double e1 = rel_err_f64(o2, ex, n);
    CHECK_STATUS(run_ra(o2, Q, K, V, &c, 64, 9, 0), PF_OK);
    double e64 = rel_err_f64(o2, ex, n);
    printf("RA padded: relative error vs exact %.4f (S=1), %.4f (S=64)\n", e1, e64);
    CHECK(e64 * 4 < e1, "padded RA error %.4f (S=1) -> %.4f (S=64)", e1, e64);

    free(Q);
    free(K);
    free(V);
    free(o1);
    free(o2);
    free(Kt);
    free(Vt);
    free(ex);
}

/* ---- error paths ---------------------------------------------------------------------------- */

static void test_errors(void) {
    const cfg c = {1, 1, 8, 8, 4, 3, NULL};
    pf_shape sh = shape_of(&c);
    float Q[32], K[32], V[24], out[24];
    fill_normal(Q, 32, 1.0f, 14, 0);
    fill_normal(K, 32, 1.0f, 14, 1);
    fill_normal(V, 24, 1.0f, 14, 2);
    pf_attn_opts o = pf_attn_opts_default();
    pf_sampling_opts sp = pf_sampling_opts_default();
    CHECK(sp.samples == 1 && sp.proposals == 1 && sp.deterministic == 0, "defaults");

    CHECK_STATUS(pf_attn_ra(out, Q, K, V, &sh, &o, &sp), PF_OK);
    CHECK_STATUS(pf_attn_ra(NULL, Q, K, V, &sh, &o, &sp), PF_EINVAL);
    CHECK_STATUS(pf_attn_ra(out, NULL, K, V, &sh, &o, &sp), PF_EINVAL);
    CHECK_STATUS(pf_attn_ra(out, Q, NULL, V, &sh, &o, &sp), PF_EINVAL);
    CHECK_STATUS(pf_attn_ra(out, Q, K, NULL, &sh, &o, &sp), PF_EINVAL);
    CHECK_STATUS(pf_attn_ra(out, Q, K, V, NULL, &o, &sp), PF_EINVAL);
    CHECK_STATUS(pf_attn_ra(out, Q, K, V, &sh, NULL, &sp), PF_EINVAL);
    CHECK_STATUS(pf_attn_ra(out, Q, K, V, &sh, &o, NULL), PF_EINVAL);

    pf_shape bad = sh;
    bad.d = 0;
    CHECK_STATUS(pf_attn_ra(out, Q, K, V, &bad, &o, &sp), PF_EINVAL);
    pf_attn_opts oc = o;
    oc.causal = 1;
    CHECK_STATUS(pf_attn_ra(out, Q, K, V, &sh, &oc, &sp), PF_ENOTSUP);
    int32_t kl0 = 0, kl9 = 9;
    oc = o;
    oc.key_len = &kl0;
    CHECK_STATUS(pf_attn_ra(out, Q, K, V, &sh, &oc, &sp), PF_EINVAL);
    oc.key_len = &kl9;
    CHECK_STATUS(pf_attn_ra(out, Q, K, V, &sh, &oc, &sp), PF_EINVAL);

    pf_sampling_opts sb = sp;
    sb.samples = 0;
    CHECK_STATUS(pf_attn_ra(out, Q, K, V, &sh, &o, &sb), PF_EINVAL);
    sb.samples = -3;
    CHECK_STATUS(pf_attn_ra(out, Q, K, V, &sh, &o, &sb), PF_EINVAL);
    sb = sp;
    sb.deterministic = 1; /* RA has no deterministic variant */
    CHECK_STATUS(pf_attn_ra(out, Q, K, V, &sh, &o, &sb), PF_ENOTSUP);
    sb.deterministic = 2;
    CHECK_STATUS(pf_attn_ra(out, Q, K, V, &sh, &o, &sb), PF_EINVAL);
    /* More draws than a query's 2^32 Philox blocks hold: refused, not wrapped. */
    pf_shape wide = sh;
    wide.d = 1 << 20;
    sb = sp;
    sb.samples = 1 << 14;
    CHECK_STATUS(pf_attn_ra(out, Q, K, V, &wide, &o, &sb), PF_EINVAL);
    /* proposals are LARA's: RA ignores them */
    sb = sp;
    sb.proposals = 1000;
    CHECK_STATUS(pf_attn_ra(out, Q, K, V, &sh, &o, &sb), PF_OK);

    float save = Q[5];
    Q[5] = NAN;
    CHECK_STATUS(pf_attn_ra(out, Q, K, V, &sh, &o, &sp), PF_ENONFINITE);
    Q[5] = save;
    save = K[31];
    K[31] = INFINITY;
    CHECK_STATUS(pf_attn_ra(out, Q, K, V, &sh, &o, &sp), PF_ENONFINITE);
    K[31] = save;
    save = V[0];
    V[0] = -INFINITY;
    CHECK_STATUS(pf_attn_ra(out, Q, K, V, &sh, &o, &sp), PF_ENONFINITE);
    V[0] = save;

    /* Finite inputs whose scores overflow float: reported, not a NaN result with PF_OK. */
    float Qbig[32], Kbig[32];
    for (int e = 0; e < 32; e++) {
        Qbig[e] = 1e30f;
        Kbig[e] = 1e30f;
    }
    CHECK_STATUS(pf_attn_ra(out, Qbig, Kbig, V, &sh, &o, &sp), PF_ENONFINITE);
    CHECK_STATUS(pf_attn_ra(out, Q, K, V, &sh, &o, &sp), PF_OK);
}

int main(void) {
    test_errors();
    test_padding_threads();
    test_samples();
    test_unbiased();
    TEST_MAIN_END();
}
