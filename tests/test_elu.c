/* test_elu.c: the elu + 1 map (PF_KERNEL_ELU), the linear attention of Katharopoulos et al.
 * (2020, "Transformers are RNNs"), against float64 references written here from its definition:
 *
 *     phi(x) = elu(x') + 1,  x' = x sqrt(s),  elu(u) = u (u > 0), exp(u) - 1 (u <= 0)
 *     out_i  = sum_j (phi(q_i).phi(k_j)) v_j / sum_j phi(q_i).phi(k_j)   over visible keys j
 *
 * with W = I_d (the plain map) and, once, a random W (the header's contract elu(Wx') + 1).
 * Gradients: central differences of the float64 formula. Decoding: the state stepped token by
 * token against the causal pass. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* elu(u) + 1 in float64: u + 1, or exp(u) - 1 + 1 = exp(u) (taken whole: expm1(u) + 1 would
 * round the small values away) */
static double elu1(double u) {
    return u > 0 ? u + 1.0 : exp(u);
}

static void fill_uniform(float *x, size_t n, uint64_t seed, float lo, float hi) {
    pf_rng r;
    pf_rng_init(&r, seed, 0);
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)pf_rng_uniform(&r);
}

static void identity(float *W, int d) {
    memset(W, 0, sizeof(float) * (size_t)d * (size_t)d);
    for (int k = 0; k < d; k++) W[(size_t)k * d + k] = 1.0f;
}

/* Features of one row: W NULL means the identity. bound (m), if not NULL, gets
 * sum_k |w_fk x'_k|, which bounds the float rounding of u_f (relative 2^-24 per term). */
static void ref_phi(double *phi, double *bound, const double *x, int d, const float *W, int m,
                    double s, double eps) {
    for (int f = 0; f < m; f++) {
        double u = 0, b = 0;
        if (!W) {
            u = x[f] * sqrt(s);
            b = fabs(u);
        } else {
            for (int k = 0; k < d; k++) {
                u += (double)W[(size_t)f * d + k] * x[k] * sqrt(s);
                b += fabs((double)W[(size_t)f * d + k] * x[k] * sqrt(s));
            }
        }
        phi[f] = elu1(u) + eps;
        if (bound) bound[f] = b;
    }
}

/* The attention of one (b, h) in float64: Q (L,d), K (L,d), V (L,dv) doubles, W = I. */
static void ref_attn(double *out, const double *Q, const double *K, const double *V, int L, int d,
                     int dv, int causal, int kl, double s) {
    double pq[64], pk[64];
    for (int i = 0; i < L; i++) {
        ref_phi(pq, NULL, Q + (size_t)i * d, d, NULL, d, s, 0);
        double den = 0, num[64] = {0};
        const int lim = causal ? (i + 1 < kl ? i + 1 : kl) : kl;
        for (int j = 0; j < lim; j++) {
            ref_phi(pk, NULL, K + (size_t)j * d, d, NULL, d, s, 0);
            double a = 0;
            for (int f = 0; f < d; f++) a += pq[f] * pk[f];
            den += a;
            for (int c = 0; c < dv; c++) num[c] += a * V[(size_t)j * dv + c];
        }
        for (int c = 0; c < dv; c++) out[(size_t)i * dv + c] = num[c] / den;
    }
}

/* sum over the outputs of G . out, the float64 loss whose gradient the backward gives */
static double ref_loss(const double *Q, const double *K, const double *V, const float *G, int L,
                       int d, int dv, int causal, int kl, double s) {
    double *o = malloc(sizeof(double) * (size_t)L * dv);
    ref_attn(o, Q, K, V, L, d, dv, causal, kl, s);
    double acc = 0;
    for (size_t i = 0; i < (size_t)L * dv; i++) acc += o[i] * (double)G[i];
    free(o);
    return acc;
}

static void to_double(double *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = (double)x[i];
}

static void test_names(void) {
    printf("a. name, parse, width\n");
    pf_kernel k = PF_KERNEL_POSITIVE;
    CHECK_STATUS(pf_kernel_parse("elu", &k), PF_OK);
    CHECK(k == PF_KERNEL_ELU, "elu parses to %d", (int)k);
    k = PF_KERNEL_POSITIVE;
    CHECK_STATUS(pf_kernel_parse("elu+1", &k), PF_OK);
    CHECK(k == PF_KERNEL_ELU, "elu+1 parses to %d", (int)k);
    CHECK_STATUS(pf_kernel_parse("elu+2", &k), PF_EINVAL);
    CHECK_STATUS(pf_kernel_parse("ELU", &k), PF_EINVAL);
    CHECK(strcmp(pf_kernel_name(PF_KERNEL_ELU), "elu") == 0, "name %s",
          pf_kernel_name(PF_KERNEL_ELU));
    CHECK(pf_kernel_width(PF_KERNEL_ELU, 24) == 24, "width %d", pf_kernel_width(PF_KERNEL_ELU, 24));
    CHECK(pf_kernel_width(PF_KERNEL_ELU, 0) == 0, "width of m = 0");
}

static void test_features(void) {
    printf("b. features against elu(x') + 1 in float64 (identity and random W, eps)\n");
    enum { N = 37, D = 24, M = 40 };
    float X[N * D], I[D * D], W[M * D], phi[N * M], ls[N];
    fill_uniform(X, N * D, 11, -6.0f, 6.0f);
    X[0] = 0.0f;    /* elu's kink */
    X[1] = -100.0f; /* exp underflows to a denormal or zero */
    X[2] = 1e-30f;  /* just above the kink */
    identity(I, D);
    fill_uniform(W, M * D, 12, -1.0f, 1.0f);
    const float scales[2] = {0.0f, 1.0f}, epss[2] = {0.0f, 1e-3f};
    double x[D], ref[M], bnd[M];
    for (int w = 0; w < 2; w++)
        for (int si = 0; si < 2; si++)
            for (int ei = 0; ei < 2; ei++) {
                const int m = w ? M : D;
                const double s = scales[si] > 0 ? scales[si] : 1.0 / sqrt((double)D);
                for (int st = 0; st < 2; st++) {
                    CHECK_STATUS(pf_features(phi, st ? ls : NULL, X, N, D, w ? W : I, m,
                                             PF_KERNEL_ELU, scales[si], epss[ei]),
                                 PF_OK);
                    double worst = 0;
                    for (int i = 0; i < N; i++) {
                        to_double(x, X + (size_t)i * D, D);
                        ref_phi(ref, bnd, x, D, w ? W : NULL, m, s, epss[ei]);
                        for (int f = 0; f < m; f++) {
                            /* |du| <= 2 eps_f bound (d terms, one rounding each, and the scale)
                             * moves elu + 1 by at most |du| max(1, g) <= |du| |ref| (g >= 0;
                             * ref >= 1 where g > 1): relative, plus the float's own rounding */
                            const double e = fabs(phi[(size_t)i * m + f] - ref[f]) /
                                             (1e-37 + (2e-7 + 2.4e-7 * bnd[f]) * fabs(ref[f]));
                            worst = fmax(worst, e);
                        }
                        if (st) CHECK(ls[i] == 0.0f, "logscale %g", (double)ls[i]);
                    }
                    CHECK(worst <= 1.0,
                          "W %s, scale %g, eps %g, logscale %d: worst error %.3g "
                          "of the tolerance 1e-37 + (2e-7 + 2.4e-7 sum|w x'|) |ref|",
                          w ? "random" : "I", s, (double)epss[ei], st, worst);
                }
            }
    /* the features are positive: no zero denominator for inputs of modest size */
    CHECK_STATUS(pf_features(phi, NULL, X, N, D, I, D, PF_KERNEL_ELU, 1.0f, 0.0f), PF_OK);
    int pos = 1;
    for (int i = 3; i < N; i++)
        for (int f = 0; f < D; f++) pos &= phi[(size_t)i * D + f] > 0.0f;
    CHECK(pos, "elu + 1 features positive");
    /* refusals shared with every map */
    X[5] = NAN;
    CHECK_STATUS(pf_features(phi, NULL, X, N, D, I, D, PF_KERNEL_ELU, 1.0f, 0.0f), PF_ENONFINITE);
    X[5] = 0.0f;
    CHECK_STATUS(pf_features(phi, NULL, X, N, D, NULL, D, PF_KERNEL_ELU, 1.0f, 0.0f), PF_EINVAL);
    CHECK_STATUS(pf_features(phi, NULL, X, N, D, I, D, PF_KERNEL_ELU, 1.0f, -1.0f), PF_EINVAL);
    CHECK_STATUS(pf_features(phi, NULL, X, N, D, I, 0, PF_KERNEL_ELU, 1.0f, 0.0f), PF_EINVAL);
}

/* A problem: B = 2, H = 2, L, d = dv = 8, W = I. */
typedef struct prob {
    int B, H, L, d, dv;
    float *Q, *K, *V, *G, *W;
} prob;

static prob make_prob(int L, uint64_t seed) {
    prob p = {2, 2, L, 8, 8, NULL, NULL, NULL, NULL, NULL};
    const size_t n = (size_t)p.B * p.H * L * p.d;
    p.Q = malloc(sizeof(float) * n);
    p.K = malloc(sizeof(float) * n);
    p.V = malloc(sizeof(float) * n);
    p.G = malloc(sizeof(float) * n);
    p.W = malloc(sizeof(float) * (size_t)p.d * p.d);
    fill_uniform(p.Q, n, seed, -2.0f, 2.0f);
    fill_uniform(p.K, n, seed + 1, -2.0f, 2.0f);
    fill_uniform(p.V, n, seed + 2, -1.0f, 1.0f);
    fill_uniform(p.G, n, seed + 3, -1.0f, 1.0f);
    identity(p.W, p.d);
    return p;
}

static void free_prob(prob *p) {
    free(p->Q);
    free(p->K);
    free(p->V);
    free(p->G);
    free(p->W);
}

static pf_favor_opts elu_opts(const prob *p) {
    pf_favor_opts f = pf_favor_opts_default();
    f.kernel = PF_KERNEL_ELU;
    f.W = p->W;
    f.m = p->d;
    f.chunk = 4; /* several chunks, one cut inside them when L is not a multiple */
    return f;
}

static void test_forward(void) {
    printf("c. attention against the explicit float64 formula (bidirectional, causal, padded)\n");
    prob p = make_prob(29, 21);
    const int B = p.B, H = p.H, L = p.L, d = p.d, dv = p.dv;
    pf_shape s = {B, H, L, L, d, dv};
    pf_favor_opts f = elu_opts(&p);
    const size_t n = (size_t)B * H * L * d;
    float *out = malloc(sizeof(float) * n);
    double *Qd = malloc(sizeof(double) * n), *Kd = malloc(sizeof(double) * n),
           *Vd = malloc(sizeof(double) * n), *ref = malloc(sizeof(double) * (size_t)L * dv);
    to_double(Qd, p.Q, n);
    to_double(Kd, p.K, n);
    to_double(Vd, p.V, n);
    const int32_t kl[2] = {L, 13};
    for (int mode = 0; mode < 3; mode++) {
        pf_attn_opts o = pf_attn_opts_default();
        o.causal = mode == 1;
        o.key_len = mode == 2 ? kl : NULL;
        for (int th = 1; th <= 2; th++) {
            o.threads = th;
            CHECK_STATUS(pf_attn_favor(out, p.Q, p.K, p.V, &s, &o, &f), PF_OK);
            double worst = 0;
            for (int bh = 0; bh < B * H; bh++) {
                const size_t off = (size_t)bh * L * d;
                ref_attn(ref, Qd + off, Kd + off, Vd + off, L, d, dv, o.causal,
                         mode == 2 ? kl[bh / H] : L, 1.0 / sqrt((double)d));
                for (size_t i = 0; i < (size_t)L * dv; i++)
                    worst = fmax(worst, fabs(out[off + i] - ref[i]) / (1e-6 + 1e-5 * fabs(ref[i])));
            }
            CHECK(worst <= 1.0, "%s, %d threads: worst error %.3g of 1e-6 + 1e-5 |ref|",
                  mode == 0   ? "bidirectional"
                  : mode == 1 ? "causal"
                              : "padded",
                  th, worst);
        }
    }
    /* the library's own float64 reference agrees too */
    pf_attn_opts o = pf_attn_opts_default();
    o.causal = 1;
    float *out2 = malloc(sizeof(float) * n);
    CHECK_STATUS(pf_attn_favor(out, p.Q, p.K, p.V, &s, &o, &f), PF_OK);
    CHECK_STATUS(pf_attn_favor_ref(out2, p.Q, p.K, p.V, &s, &o, &f), PF_OK);
    double worst = 0;
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs(out[i] - out2[i]) / (1e-6 + 1e-5 * fabs(out2[i])));
    CHECK(worst <= 1.0, "pf_attn_favor_ref: worst %.3g", worst);
    free(out2);
    free(out);
    free(Qd);
    free(Kd);
    free(Vd);
    free(ref);
    free_prob(&p);
}

static void test_backward(void) {
    printf("d. gradients against central differences of the float64 formula\n");
    prob p = make_prob(11, 31);
    const int B = p.B, H = p.H, L = p.L, d = p.d, dv = p.dv;
    pf_shape s = {B, H, L, L, d, dv};
    pf_favor_opts f = elu_opts(&p);
    f.chunk = 3;
    const size_t n = (size_t)B * H * L * d, per = (size_t)L * d;
    float *out = malloc(sizeof(float) * n), *dQ = malloc(sizeof(float) * n),
          *dK = malloc(sizeof(float) * n), *dV = malloc(sizeof(float) * n);
    float *sQ = malloc(sizeof(float) * n), *sK = malloc(sizeof(float) * n),
          *sV = malloc(sizeof(float) * n);
    double *X[3];
    for (int a = 0; a < 3; a++) X[a] = malloc(sizeof(double) * n);
    to_double(X[0], p.Q, n);
    to_double(X[1], p.K, n);
    to_double(X[2], p.V, n);
    const int32_t kl[2] = {L, 6};
    const double sc = 1.0 / sqrt((double)d), h = 1e-5;
    for (int mode = 0; mode < 3; mode++) {
        pf_attn_opts o = pf_attn_opts_default();
        o.causal = mode == 1;
        o.key_len = mode == 2 ? kl : NULL;
        CHECK_STATUS(pf_attn_favor(out, p.Q, p.K, p.V, &s, &o, &f), PF_OK);
        CHECK_STATUS(pf_attn_favor_backward(dQ, dK, dV, p.G, p.Q, p.K, p.V, out, &s, &o, &f),
                     PF_OK);
        /* the kept-feature backward gives the same gradients to float rounding */
        pf_favor_saved *sv = NULL;
        CHECK_STATUS(pf_favor_saved_create(&sv, &s, &o, &f, 0), PF_OK);
        CHECK_STATUS(pf_attn_favor_save(out, p.Q, p.K, p.V, &s, &o, &f, sv), PF_OK);
        CHECK_STATUS(
            pf_attn_favor_backward_saved(sQ, sK, sV, p.G, p.Q, p.K, p.V, out, &s, &o, &f, sv),
            PF_OK);
        pf_favor_saved_free(sv);
        const float *grads[2][3] = {{dQ, dK, dV}, {sQ, sK, sV}};
        double worst[2] = {0, 0};
        for (int bh = 0; bh < B * H; bh++) {
            const int klen = mode == 2 ? kl[bh / H] : L;
            for (int a = 0; a < 3; a++)
                for (size_t e = 0; e < per; e++) {
                    double *x = X[a] + (size_t)bh * per + e, x0 = *x;
                    *x = x0 + h;
                    const double lp = ref_loss(X[0] + bh * per, X[1] + bh * per, X[2] + bh * per,
                                               p.G + bh * per, L, d, dv, o.causal, klen, sc);
                    *x = x0 - h;
                    const double lm = ref_loss(X[0] + bh * per, X[1] + bh * per, X[2] + bh * per,
                                               p.G + bh * per, L, d, dv, o.causal, klen, sc);
                    *x = x0;
                    const double ref = (lp - lm) / (2 * h);
                    for (int w = 0; w < 2; w++) {
                        const double g = grads[w][a][(size_t)bh * per + e];
                        worst[w] = fmax(worst[w], fabs(g - ref) / (2e-5 + 2e-4 * fabs(ref)));
                    }
                }
        }
        for (int w = 0; w < 2; w++)
            CHECK(worst[w] <= 1.0, "%s, %s: worst gradient error %.3g of 2e-5 + 2e-4 |ref|",
                  mode == 0   ? "bidirectional"
                  : mode == 1 ? "causal"
                              : "padded",
                  w ? "kept features" : "recomputed", worst[w]);
    }
    /* eps > 0 (absolute) reaches the gradient unchanged: elu + 1 + eps has elu's derivative */
    pf_attn_opts o = pf_attn_opts_default();
    o.causal = 1;
    f.eps = 0.25f;
    CHECK_STATUS(pf_attn_favor(out, p.Q, p.K, p.V, &s, &o, &f), PF_OK);
    CHECK_STATUS(pf_attn_favor_backward(dQ, dK, dV, p.G, p.Q, p.K, p.V, out, &s, &o, &f), PF_OK);
    CHECK_STATUS(pf_attn_favor_backward_ref(sQ, sK, sV, p.G, p.Q, p.K, p.V, &s, &o, &f), PF_OK);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs(dQ[i] - sQ[i]) / (1e-5 + 1e-4 * fabs(sQ[i])));
        worst = fmax(worst, fabs(dK[i] - sK[i]) / (1e-5 + 1e-4 * fabs(sK[i])));
        worst = fmax(worst, fabs(dV[i] - sV[i]) / (1e-5 + 1e-4 * fabs(sV[i])));
    }
    CHECK(worst <= 1.0, "eps 0.25 against pf_attn_favor_backward_ref: worst %.3g", worst);
    for (int a = 0; a < 3; a++) free(X[a]);
    free(out);
    free(dQ);
    free(dK);
    free(dV);
    free(sQ);
    free(sK);
    free(sV);
    free_prob(&p);
}

static void test_decode(void) {
    printf("e. decoding: one token at a time equals the causal pass\n");
    prob p = make_prob(23, 41);
    const int H = p.H, L = p.L, d = p.d, dv = p.dv;
    pf_shape s = {1, H, L, L, d, dv};
    pf_favor_opts f = elu_opts(&p);
    pf_attn_opts o = pf_attn_opts_default();
    o.causal = 1;
    const size_t n = (size_t)H * L * d;
    float *out = malloc(sizeof(float) * n), *dec = malloc(sizeof(float) * n);
    CHECK_STATUS(pf_attn_favor(out, p.Q, p.K, p.V, &s, &o, &f), PF_OK);
    pf_favor_state *st = NULL;
    CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, 0.0f, &f), PF_OK);
    float q[2 * 8], k[2 * 8], v[2 * 8], ot[2 * 8];
    for (int t = 0; t < L; t++) {
        for (int h = 0; h < H; h++) {
            memcpy(q + h * d, p.Q + ((size_t)h * L + t) * d, sizeof(float) * d);
            memcpy(k + h * d, p.K + ((size_t)h * L + t) * d, sizeof(float) * d);
            memcpy(v + h * dv, p.V + ((size_t)h * L + t) * dv, sizeof(float) * dv);
        }
        CHECK_STATUS(pf_favor_state_step(st, ot, q, k, v, 1), PF_OK);
        for (int h = 0; h < H; h++)
            memcpy(dec + ((size_t)h * L + t) * dv, ot + h * dv, sizeof(float) * dv);
    }
    double worst = 0;
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs(dec[i] - out[i]) / (1e-6 + 1e-5 * fabs(out[i])));
    CHECK(worst <= 1.0, "stepped against the causal pass: worst %.3g of 1e-6 + 1e-5 |ref|", worst);
    pf_favor_state_free(st);
    free(out);
    free(dec);
    free_prob(&p);
}

int main(void) {
    test_names();
    test_features();
    test_forward();
    test_backward();
    test_decode();
    TEST_MAIN_END();
}
