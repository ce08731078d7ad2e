/* test_features.c: the random feature maps: unbiasedness of phi(x).phi(y) for
 * exp(x.y), the variance gain of orthogonal projections, every map against the shared
 * float64 formula (ref.h), stabilisation (phi~ exp(logscale) = phi), eps, argument checks.
 *
 * Statistical checks (Monte Carlo over independent W) allow 4 standard errors: with N >= 2000
 * independent draws the mean is normal to a good approximation (CLT; the estimates have finite
 * fourth moments for the small |x|, |y| used), so a correct implementation fails one check with
 * probability ~6e-5. The seeds are fixed, so the test is deterministic. */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "ref.h"

/* ---- helpers (the float64 feature maps are ref.h's) ---------------------------------------- */

static void set_norm(float *x, int d, double norm) {
    double s = 0;
    for (int k = 0; k < d; k++) s += (double)x[k] * x[k];
    for (int k = 0; k < d; k++) x[k] = (float)(x[k] * norm / sqrt(s));
}

static double dot(const float *x, const float *y, int d) {
    double s = 0;
    for (int k = 0; k < d; k++) s += (double)x[k] * y[k];
    return s;
}

/* Monte Carlo over N independent W (streams 0..N-1): mean, standard error and variance of
 * phi(x).phi(y), and the standard error of that variance, sqrt((m4 - var^2) / N). */
typedef struct mc {
    double mean, se, var, var_se;
} mc;

static mc monte_carlo(const float *x, const float *y, int d, int m, pf_kernel kernel,
                      pf_proj_kind proj, int N, uint64_t seed) {
    int r = pf_kernel_width(kernel, m);
    float *W = xmalloc(sizeof(float) * m * d);
    float *phi = xmalloc(sizeof(float) * 2 * r);
    float xy[2 * 64];
    memcpy(xy, x, sizeof(float) * d);
    memcpy(xy + d, y, sizeof(float) * d);
    double *est = xmalloc(sizeof(double) * N);
    for (int t = 0; t < N; t++) {
        pf_projection_draw(W, m, d, proj, PF_NORM_CHI, seed, (uint64_t)t);
        pf_status st = pf_features(phi, NULL, xy, 2, d, W, m, kernel, 1.0f, 0.0f);
        if (st != PF_OK) fprintf(stderr, "pf_features: %s\n", pf_status_str(st));
        double e = 0;
        for (int f = 0; f < r; f++) e += (double)phi[f] * phi[r + f];
        est[t] = e;
    }
    mc out = {0, 0, 0, 0};
    for (int t = 0; t < N; t++) out.mean += est[t] / N;
    double m4 = 0;
    for (int t = 0; t < N; t++) {
        double e = est[t] - out.mean;
        out.var += e * e / (N - 1);
        m4 += e * e * e * e / N;
    }
    out.se = sqrt(out.var / N);
    out.var_se = sqrt(fmax(m4 - out.var * out.var, 0) / N);
    free(W);
    free(phi);
    free(est);
    return out;
}

/* a. E[phi(x).phi(y)] = exp(x.y) for the three softmax maps, iid and orthogonal W. */
static void test_unbiased(void) {
    const int d = 16, N = 2000;
    const pf_kernel kernels[3] = {PF_KERNEL_POSITIVE, PF_KERNEL_HYPERBOLIC, PF_KERNEL_TRIG};
    const int ms[3] = {16, 32, 64};
    float x[16], y[16];
    for (int pair = 0; pair < 2; pair++) {
        fill_normal(x, d, 1, 11, 2 * pair);
        fill_normal(y, d, 1, 11, 2 * pair + 1);
        set_norm(x, d, pair ? 1.0 : 0.5);
        set_norm(y, d, pair ? 0.8 : 0.6);
        const double truth = exp(dot(x, y, d));
        for (int k = 0; k < 3; k++) {
            for (int p = 0; p < 2; p++) {
                pf_proj_kind proj = p ? PF_PROJ_ORTHOGONAL : PF_PROJ_IID;
                int m = ms[(k + p + pair) % 3];
                mc s = monte_carlo(x, y, d, m, kernels[k], proj, N, 100 + pair);
                CHECK(fabs(s.mean - truth) <= 4 * s.se,
                      "%s %s m=%d: mean %.6f vs exp(x.y) %.6f, 4 SE = %.2g",
                      pf_kernel_name(kernels[k]), p ? "orthogonal" : "iid", m, s.mean, truth,
                      4 * s.se);
            }
        }
    }
}

/* b. m = d = 16, positive features: orthogonal rows lower the variance of the estimate. The
 * paper's Theorem 2 says so for every x, y when m <= d (the gain grows with |x + y|); we take
 * |x| = |y| = 0.5 at 30 degrees because for longer vectors the estimate is so heavy-tailed that
 * its sample variance needs far more draws to be compared. The difference of the two sample
 * variances must exceed 4 of its standard errors (each sqrt((m4 - var^2) / N)). */
static void test_orthogonal_variance(void) {
    const int d = 16, m = 16, N = 8000;
    float x[16], y[16];
    fill_normal(x, d, 1, 12, 0);
    fill_normal(y, d, 1, 12, 1);
    /* x, y = 0.5 (cos 30 x^ + sin 30 e), e the unit part of y orthogonal to x */
    set_norm(x, d, 1.0);
    double xy = dot(x, y, d);
    for (int k = 0; k < d; k++) y[k] -= (float)(xy * x[k]);
    set_norm(y, d, 1.0);
    for (int k = 0; k < d; k++) y[k] = (float)(0.5 * (sqrt(0.75) * x[k] + 0.5 * y[k]));
    for (int k = 0; k < d; k++) x[k] *= 0.5f;
    mc iid = monte_carlo(x, y, d, m, PF_KERNEL_POSITIVE, PF_PROJ_IID, N, 200);
    mc ort = monte_carlo(x, y, d, m, PF_KERNEL_POSITIVE, PF_PROJ_ORTHOGONAL, N, 201);
    double se = sqrt(iid.var_se * iid.var_se + ort.var_se * ort.var_se);
    printf("variance m = d = 16: iid %.4g, orthogonal %.4g (ratio %.3f, 4 SE of diff %.2g)\n",
           iid.var, ort.var, ort.var / iid.var, 4 * se);
    CHECK(iid.var - ort.var > 4 * se, "var iid %.4g, orthogonal %.4g, 4 SE %.2g", iid.var, ort.var,
          4 * se);
}

/* c. every map against features_f64; stabilised form; eps; scale 0 = 1/sqrt(d). m = 24 is one
 * panel of W^T on every path, m = 74 three on AVX2 (32, 32 and 10 columns, the last with
 * columns apart: pf_fmap_bind). */
static void test_maps(int m) {
    const int n = 37, d = 16;
    float *X = xmalloc(sizeof(float) * n * d), *W = xmalloc(sizeof(float) * m * d);
    printf("maps at m = %d\n", m);
    fill_normal(X, (size_t)n * d, 1, 13, 0);
    for (int i = 0; i < n; i++) set_norm(X + i * d, d, 0.2 + 3.0 * i / n); /* 0.2 .. 3.2 */
    pf_projection_draw(W, m, d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 13, 1);
    float *phi = xmalloc(sizeof(float) * n * 2 * m), *stab = xmalloc(sizeof(float) * n * 2 * m);
    float *ls = xmalloc(sizeof(float) * n);
    double *ref = xmalloc(sizeof(double) * 2 * m);
    const float scales[2] = {0.0f, 0.7f};
    const float epss[2] = {0.0f, 1e-2f};
    const pf_kernel kernels[5] = {PF_KERNEL_POSITIVE, PF_KERNEL_HYPERBOLIC, PF_KERNEL_TRIG,
                                  PF_KERNEL_RELU, PF_KERNEL_ELU};
    for (int k = 0; k < 5; k++) {
        pf_kernel kernel = kernels[k];
        const int absolute = kernel == PF_KERNEL_RELU || kernel == PF_KERNEL_ELU;
        int r = pf_kernel_width(kernel, m);
        for (int si = 0; si < 2; si++) {
            for (int ei = 0; ei < 2; ei++) {
                float sc = scales[si], eps = epss[ei];
                double s_eff = sc > 0 ? sc : 1.0 / sqrt(d);
                CHECK_STATUS(pf_features(phi, NULL, X, n, d, W, m, kernel, sc, eps), PF_OK);
                CHECK_STATUS(pf_features(stab, ls, X, n, d, W, m, kernel, sc, eps), PF_OK);
                double worst = 0, worst_stab = 0;
                for (int i = 0; i < n; i++) {
                    ref_phi_f32(ref, X + i * d, d, W, m, kernel, s_eff, eps);
                    double rmax = 0;
                    for (int f = 0; f < r; f++) rmax = fmax(rmax, fabs(ref[f]));
                    for (int f = 0; f < r; f++) {
                        double g = phi[i * r + f];
                        double gs = stab[i * r + f] * exp((double)ls[i]);
                        /* relative to the row's largest feature (sin, cos cross zero) */
                        worst = fmax(worst, fabs(g - ref[f]) / rmax);
                        worst_stab = fmax(worst_stab, fabs(gs - ref[f]) / rmax);
                    }
                    if (absolute) CHECK(ls[i] == 0.0f, "relu/elu logscale %g", ls[i]);
                }
                CHECK(worst < 1e-5, "%s scale %g eps %g: unstabilised rel err %.3g",
                      pf_kernel_name(kernel), sc, eps, worst);
                CHECK(worst_stab < 1e-5, "%s scale %g eps %g: stabilised * exp(ls) rel err %.3g",
                      pf_kernel_name(kernel), sc, eps, worst_stab);
            }
        }
        /* eps semantics against the eps = 0 features of the same call pattern */
        float *p0 = xmalloc(sizeof(float) * n * r), *pe = xmalloc(sizeof(float) * n * r);
        const float eps = 0.05f;
        CHECK_STATUS(pf_features(p0, NULL, X, n, d, W, m, kernel, 0.0f, 0.0f), PF_OK);
        CHECK_STATUS(pf_features(pe, NULL, X, n, d, W, m, kernel, 0.0f, eps), PF_OK);
        double worst = 0;
        for (int i = 0; i < n; i++) {
            double amax = 0;
            for (int f = 0; f < r; f++) amax = fmax(amax, fabs(p0[i * r + f]));
            double add = absolute ? eps : eps * amax;
            for (int f = 0; f < r; f++)
                worst = fmax(worst, fabs(pe[i * r + f] - p0[i * r + f] - add) / amax);
        }
        CHECK(worst < 1e-6, "%s: eps adds %s (err %.3g)", pf_kernel_name(kernel),
              absolute ? "eps" : "eps * max|phi|", worst);
        free(p0);
        free(pe);
    }
    /* relu: exactly relu(Wx')/sqrt(m) + eps, so a row with every u <= 0 is eps everywhere */
    float Wn[2 * 2] = {1, 0, 0, 1}, xn[2] = {-1.0f, -2.0f}, pn[2];
    CHECK_STATUS(pf_features(pn, NULL, xn, 1, 2, Wn, 2, PF_KERNEL_RELU, 1.0f, 0.25f), PF_OK);
    CHECK(pn[0] == 0.25f && pn[1] == 0.25f, "relu of negative u: %g %g", pn[0], pn[1]);
    float xp2[2] = {2.0f, -1.0f};
    CHECK_STATUS(pf_features(pn, NULL, xp2, 1, 2, Wn, 2, PF_KERNEL_RELU, 1.0f, 0.0f), PF_OK);
    CHECK_CLOSE(pn[0], 2.0 / sqrt(2.0), 0, 1e-7);
    CHECK(pn[1] == 0.0f, "relu(-1) = %g", pn[1]);
    free(X);
    free(W);
    free(ref);
    free(phi);
    free(stab);
    free(ls);
}

/* Large norms: stabilised features stay O(1) (largest |phi~| = 1/sqrt(m) or 1/sqrt(2m) for the
 * exponential maps) where the unstabilised trig map overflows float; and phi~ exp(logscale)
 * still equals the float64 features where those are representable in double. */
static void test_large_norms(void) {
    const int n = 8, d = 16, m = 32;
    float X[8 * 16], W[32 * 16], phi[8 * 64], ls[8];
    fill_normal(X, (size_t)n * d, 1, 14, 0);
    for (int i = 0; i < n; i++) set_norm(X + i * d, d, 30.0);
    pf_projection_draw(W, m, d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 14, 1);
    CHECK_STATUS(pf_features(phi, NULL, X, n, d, W, m, PF_KERNEL_TRIG, 0.0f, 0.0f),
                 PF_ENONFINITE); /* exp(|x'|^2/2) = exp(112.5) > FLT_MAX */
    for (int k = 0; k < 3; k++) {
        pf_kernel kernel = (pf_kernel)k;
        int r = pf_kernel_width(kernel, m);
        CHECK_STATUS(pf_features(phi, ls, X, n, d, W, m, kernel, 0.0f, 0.0f), PF_OK);
        double worst = 0;
        for (int i = 0; i < n; i++) {
            double amax = 0, ref[64], rmax = 0;
            for (int f = 0; f < r; f++) amax = fmax(amax, fabs(phi[i * r + f]));
            if (kernel != PF_KERNEL_TRIG) {
                /* exp(max u - t), t = max u + ln sqrt(r) rounded to float: |max u| <~ 100
                 * makes that rounding <= 2^-24 * 128 ~ 8e-6 */
                CHECK_CLOSE(amax, 1.0 / sqrt((double)r), 0, 1e-5);
            } else {
                CHECK(amax <= 1.0 / sqrt((double)m) && amax > 0.5 / sqrt((double)m),
                      "trig max|phi~| %g", amax);
            }
            ref_phi_f32(ref, X + i * d, d, W, m, kernel, 0.25, 0.0);
            for (int f = 0; f < r; f++) rmax = fmax(rmax, fabs(ref[f]));
            for (int f = 0; f < r; f++) {
                double g = phi[i * r + f] * exp((double)ls[i]);
                worst = fmax(worst, fabs(g - ref[f]) / rmax);
            }
        }
        /* the float u = W x' carries |u| 2^-24 ~ 4e-6 absolute error at |u| ~ 60, which
         * exp and sin/cos pass on as a relative error of that size; logscale (~ +-100) is
         * rounded to float, another 2^-24 |c| ~ 4e-6. */
        CHECK(worst < 2e-5, "%s norm 30: phi~ exp(logscale) vs float64 rel err %.3g",
              pf_kernel_name(kernel), worst);
    }
}

/* d. argument checks, parse and name. */
static void test_errors(void) {
    float X[4 * 3], W[5 * 3], phi[4 * 10], ls[4];
    fill_normal(X, 12, 1, 15, 0);
    fill_normal(W, 15, 1, 15, 1);
    CHECK_STATUS(pf_features(phi, ls, X, 4, 3, W, 5, PF_KERNEL_POSITIVE, 0, 0), PF_OK);
    CHECK_STATUS(pf_features(NULL, ls, X, 4, 3, W, 5, PF_KERNEL_POSITIVE, 0, 0), PF_EINVAL);
    CHECK_STATUS(pf_features(phi, ls, NULL, 4, 3, W, 5, PF_KERNEL_POSITIVE, 0, 0), PF_EINVAL);
    CHECK_STATUS(pf_features(phi, ls, X, 4, 3, NULL, 5, PF_KERNEL_POSITIVE, 0, 0), PF_EINVAL);
    CHECK_STATUS(pf_features(phi, ls, X, 0, 3, W, 5, PF_KERNEL_POSITIVE, 0, 0), PF_EINVAL);
    CHECK_STATUS(pf_features(phi, ls, X, -1, 3, W, 5, PF_KERNEL_POSITIVE, 0, 0), PF_EINVAL);
    CHECK_STATUS(pf_features(phi, ls, X, 4, 0, W, 5, PF_KERNEL_POSITIVE, 0, 0), PF_EINVAL);
    CHECK_STATUS(pf_features(phi, ls, X, 4, 3, W, 0, PF_KERNEL_POSITIVE, 0, 0), PF_EINVAL);
    CHECK_STATUS(pf_features(phi, ls, X, 4, 3, W, -2, PF_KERNEL_TRIG, 0, 0), PF_EINVAL);
    CHECK_STATUS(pf_features(phi, ls, X, 4, 3, W, 5, (pf_kernel)4, 0, 0), PF_EINVAL);
    CHECK_STATUS(pf_features(phi, ls, X, 4, 3, W, 5, (pf_kernel)-1, 0, 0), PF_EINVAL);
    CHECK_STATUS(pf_features(phi, ls, X, 4, 3, W, 5, PF_KERNEL_POSITIVE, -1.0f, 0), PF_EINVAL);
    CHECK_STATUS(pf_features(phi, ls, X, 4, 3, W, 5, PF_KERNEL_POSITIVE, NAN, 0), PF_EINVAL);
    CHECK_STATUS(pf_features(phi, ls, X, 4, 3, W, 5, PF_KERNEL_POSITIVE, 0, -0.1f), PF_EINVAL);
    CHECK_STATUS(pf_features(phi, ls, X, 4, 3, W, 5, PF_KERNEL_POSITIVE, 0, INFINITY), PF_EINVAL);
    X[5] = NAN;
    CHECK_STATUS(pf_features(phi, ls, X, 4, 3, W, 5, PF_KERNEL_POSITIVE, 0, 0), PF_ENONFINITE);
    X[5] = INFINITY;
    CHECK_STATUS(pf_features(phi, NULL, X, 4, 3, W, 5, PF_KERNEL_RELU, 0, 0), PF_ENONFINITE);
    X[5] = 0.5f;
    W[7] = -INFINITY;
    CHECK_STATUS(pf_features(phi, ls, X, 4, 3, W, 5, PF_KERNEL_HYPERBOLIC, 0, 0), PF_ENONFINITE);
    W[7] = 0.5f;
    /* finite inputs whose projection overflows float */
    X[0] = 3e38f;
    W[0] = 3e38f;
    CHECK_STATUS(pf_features(phi, ls, X, 4, 3, W, 5, PF_KERNEL_POSITIVE, 1, 0), PF_ENONFINITE);

    CHECK(pf_kernel_width(PF_KERNEL_POSITIVE, 7) == 7, "width positive");
    CHECK(pf_kernel_width(PF_KERNEL_HYPERBOLIC, 7) == 14, "width hyperbolic");
    CHECK(pf_kernel_width(PF_KERNEL_TRIG, 7) == 14, "width trig");
    CHECK(pf_kernel_width(PF_KERNEL_RELU, 7) == 7, "width relu");
    CHECK(pf_kernel_width((pf_kernel)9, 7) == 0, "width of an unknown kernel");
    CHECK(pf_kernel_width(PF_KERNEL_POSITIVE, 0) == 0, "width with m = 0");
    for (int k = 0; k < 4; k++) {
        pf_kernel got = (pf_kernel)99;
        CHECK_STATUS(pf_kernel_parse(pf_kernel_name((pf_kernel)k), &got), PF_OK);
        CHECK(got == (pf_kernel)k, "round trip of %d gave %d", k, (int)got);
    }
    const char *names[4] = {"positive", "hyperbolic", "trig", "relu"};
    for (int k = 0; k < 4; k++)
        CHECK(strcmp(pf_kernel_name((pf_kernel)k), names[k]) == 0, "name %d", k);
    pf_kernel kk;
    CHECK_STATUS(pf_kernel_parse("softmax", &kk), PF_EINVAL);
    CHECK_STATUS(pf_kernel_parse("Positive", &kk), PF_EINVAL);
    CHECK_STATUS(pf_kernel_parse("", &kk), PF_EINVAL);
    CHECK_STATUS(pf_kernel_parse(NULL, &kk), PF_EINVAL);
    CHECK_STATUS(pf_kernel_parse("trig", NULL), PF_EINVAL);
    CHECK(pf_kernel_name((pf_kernel)17) != NULL, "name of an unknown kernel is not NULL");
}

int main(void) {
    test_unbiased();
    test_orthogonal_variance();
    test_maps(24);
    test_maps(74);
    test_large_norms();
    test_errors();
    TEST_MAIN_END();
}
