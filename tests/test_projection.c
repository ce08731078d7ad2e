/* test_projection.c: random projections W: argument checks, an independent numpy
 * reference for one orthogonal draw, orthogonality, the three row-norm rules, Haar directions,
 * iid moments and determinism.
 *
 * Statistical checks allow 5 standard errors of the exact sampling distribution (the SE is
 * stated at each check); by the CLT a correct implementation fails one with probability ~6e-7,
 * and the seeds are fixed, so the test is deterministic. */
#include <stdint.h>
#include <string.h>

#include "check.h"

static double row_norm(const float *w, int d) {
    double s = 0;
    for (int j = 0; j < d; j++) s += (double)w[j] * w[j];
    return sqrt(s);
}

static void test_args(void) {
    float W[64];
    CHECK_STATUS(pf_projection_draw(NULL, 4, 4, PF_PROJ_IID, PF_NORM_CHI, 1, 0), PF_EINVAL);
    CHECK_STATUS(pf_projection_draw(W, 0, 4, PF_PROJ_IID, PF_NORM_CHI, 1, 0), PF_EINVAL);
    CHECK_STATUS(pf_projection_draw(W, -1, 4, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 1, 0), PF_EINVAL);
    CHECK_STATUS(pf_projection_draw(W, 4, 0, PF_PROJ_IID, PF_NORM_CHI, 1, 0), PF_EINVAL);
    CHECK_STATUS(pf_projection_draw(W, 4, -3, PF_PROJ_ORTHOGONAL, PF_NORM_QMC, 1, 0), PF_EINVAL);
    CHECK_STATUS(pf_projection_draw(W, 4, 4, (pf_proj_kind)7, PF_NORM_CHI, 1, 0), PF_EINVAL);
    CHECK_STATUS(pf_projection_draw(W, 4, 4, (pf_proj_kind)-1, PF_NORM_CHI, 1, 0), PF_EINVAL);
    CHECK_STATUS(pf_projection_draw(W, 4, 4, PF_PROJ_IID, (pf_norm_kind)7, 1, 0), PF_EINVAL);
    CHECK_STATUS(pf_projection_draw(W, 4, 4, PF_PROJ_ORTHOGONAL, (pf_norm_kind)3, 1, 0),
                 PF_EINVAL);
    CHECK_STATUS(pf_projection_draw(W, 4, 16, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 1, 0), PF_OK);
    CHECK_STATUS(pf_projection_draw(W, 3, 1, PF_PROJ_ORTHOGONAL, PF_NORM_SQRTD, 1, 0), PF_OK);
    /* d = 1: every "orthogonal block" is [+-1]; sqrtd makes every entry +-1 */
    for (int i = 0; i < 3; i++) CHECK(fabsf(W[i]) == 1.0f, "d = 1: W[%d] = %g", i, W[i]);

    CHECK(pf_projection_stream(12345, 0) == 0, "every = 0: never redraw");
    CHECK(pf_projection_stream(12345, -5) == 0, "every < 0: never redraw");
    CHECK(pf_projection_stream(0, 100) == 0 && pf_projection_stream(99, 100) == 0 &&
          pf_projection_stream(100, 100) == 1 && pf_projection_stream(250, 100) == 2,
          "stream = step / every");
}

/* One orthogonal sqrtd draw (m = 7, d = 5: a full block and a cut one) against numpy: an
 * independent Python Philox4x32-10 and Box-Muller made the same normals, G_ij = z[j*d + i]
 * per block, numpy.linalg.qr (LAPACK) gave Q, R, and Q diag(sign(diag R)) * sqrt(5) is W. The
 * QR factorisation with a positive diagonal is unique, so a different Householder convention
 * cannot change it. */
static void test_numpy_reference(void) {
    static const float ref[7 * 5] = {
        -1.132578147e+00f, 1.286264398e+00f,  -1.017933310e+00f, -9.784396710e-01f,
        2.631695769e-01f,  6.279031289e-01f,  1.568615593e+00f,  1.042904993e+00f,
        4.930300179e-01f,  9.024706979e-01f,  -6.417189839e-01f, -8.791722964e-01f,
        8.859718782e-01f,  -9.407306111e-01f, 1.464695384e+00f,  -1.687189131e+00f,
        4.307010207e-03f,  5.319024078e-01f,  1.354617570e+00f,  -1.883224694e-01f,
        -2.541534649e-01f, 3.346737879e-01f,  1.344728452e+00f,  -1.039044931e+00f,
        -1.391219067e+00f, 7.406871066e-01f,  -1.657234124e+00f, 1.350630196e-01f,
        7.766358874e-01f,  1.040938205e+00f,  -2.824289383e-01f, -3.921379055e-01f,
        2.081646198e+00f,  -6.149462644e-01f, -2.346315350e-01f,
    };
    float W[7 * 5];
    CHECK_STATUS(pf_projection_draw(W, 7, 5, PF_PROJ_ORTHOGONAL, PF_NORM_SQRTD, 2024, 11), PF_OK);
    double worst = 0;
    for (int i = 0; i < 35; i++) {
        CHECK_CLOSE(W[i], ref[i], 1e-6, 1e-6);
        worst = fmax(worst, fabs((double)W[i] - ref[i]));
    }
    printf("orthogonal m=7 d=5 vs numpy QR reference: max |diff| %.2e\n", worst);
}

/* Rows within each d-block are orthogonal: |<w_i, w_j>| / (|w_i| |w_j|) < 1e-5 (float entries
 * of exactly orthogonal double rows: ~sqrt(d) 6e-8). */
static double block_orthogonality(const float *W, int m, int d) {
    double worst = 0;
    for (int r0 = 0; r0 < m; r0 += d) {
        int rows = m - r0 < d ? m - r0 : d;
        for (int i = 0; i < rows; i++) {
            for (int j = i + 1; j < rows; j++) {
                const float *a = W + (size_t)(r0 + i) * d, *b = W + (size_t)(r0 + j) * d;
                double s = 0;
                for (int t = 0; t < d; t++) s += (double)a[t] * b[t];
                worst = fmax(worst, fabs(s) / (row_norm(a, d) * row_norm(b, d)));
            }
        }
    }
    return worst;
}

static void test_orthogonal_and_norms(void) {
    static const struct { int m, d; } shapes[] = {{100, 16}, {5, 16}, {64, 64}, {300, 128},
                                                  {16, 16}, {33, 8}};
    for (int s = 0; s < (int)(sizeof(shapes) / sizeof(shapes[0])); s++) {
        int m = shapes[s].m, d = shapes[s].d;
        float *W = xmalloc(sizeof(float) * m * d);
        for (int nk = 0; nk < 3; nk++) {
            pf_norm_kind norm = (pf_norm_kind)nk;
            CHECK_STATUS(pf_projection_draw(W, m, d, PF_PROJ_ORTHOGONAL, norm, 7, s), PF_OK);
            double orth = block_orthogonality(W, m, d);
            CHECK(orth < 1e-5, "m=%d d=%d norm=%d: max |cos| between block rows %.3g", m, d,
                  nk, orth);
            if (nk == 0) {
                printf("orthogonal m=%d d=%d: max |cos| within blocks %.2e\n", m, d, orth);
            }
        }
        /* sqrtd: every row has length sqrt(d), orthogonal and iid */
        for (int k = 0; k < 2; k++) {
            CHECK_STATUS(pf_projection_draw(W, m, d, (pf_proj_kind)k, PF_NORM_SQRTD, 8, s), PF_OK);
            double worst = 0;
            for (int i = 0; i < m; i++) {
                double n = row_norm(W + (size_t)i * d, d);
                worst = fmax(worst, fabs(n - sqrt((double)d)) / sqrt((double)d));
            }
            CHECK(worst < 1e-5, "sqrtd kind=%d m=%d d=%d: max rel norm err %.3g", k, m, d, worst);
        }
        /* qmc: the row lengths, as a multiset, are exactly the chi_d quantiles at i/(m+1);
         * each row's length identifies its quantile, and each quantile is used once */
        for (int k = 0; k < 2; k++) {
            CHECK_STATUS(pf_projection_draw(W, m, d, (pf_proj_kind)k, PF_NORM_QMC, 9, s), PF_OK);
            double *qs = xmalloc(sizeof(double) * m);
            int *used = calloc((size_t)m, sizeof(int));
            for (int i = 0; i < m; i++) qs[i] = pf_chi_quantile(d, (i + 1.0) / (m + 1.0));
            double worst = 0;
            int perm_ok = 1, in_order = 1;
            for (int r = 0; r < m; r++) {
                double n = row_norm(W + (size_t)r * d, d);
                int best = 0;
                for (int i = 1; i < m; i++) {
                    if (fabs(qs[i] - n) < fabs(qs[best] - n)) best = i;
                }
                worst = fmax(worst, fabs(n - qs[best]) / qs[best]);
                perm_ok &= !used[best];
                used[best] = 1;
                in_order &= best == r;
            }
            CHECK(worst < 1e-5, "qmc kind=%d m=%d d=%d: max rel norm err %.3g", k, m, d, worst);
            CHECK(perm_ok, "qmc kind=%d m=%d d=%d: a quantile used twice", k, m, d);
            /* a uniform shuffle of m >= 5 rows is the identity with probability 1/m! */
            CHECK(m < 5 || !in_order, "qmc m=%d d=%d: lengths not shuffled", m, d);
            free(qs);
            free(used);
        }
        free(W);
    }
}

/* chi norms: |w|^2 ~ chi^2_d, so E|w|^2 = d and Var|w|^2 = 2d. Over N independent rows the mean
 * has SE sqrt(2d/N); the variance estimate mean((|w|^2 - d)^2) has SE
 * sqrt((mu4 - mu2^2)/N) with chi^2_d's central moments mu2 = 2d, mu4 = 12d^2 + 48d. Entries are
 * marginally N(0,1) in both kinds (orthogonal rows: a Haar direction times a chi_d length), so
 * the entry mean has SE 1/sqrt(Nd) and the entry second moment SE sqrt(2/(Nd)). */
static void test_chi_moments(void) {
    enum { m = 64, d = 16, draws = 200 };
    const double N = (double)m * draws, k = d;
    float *W = xmalloc(sizeof(float) * m * d);
    for (int kind = 0; kind < 2; kind++) {
        double s1 = 0, s2 = 0, e1 = 0, e2 = 0;
        for (int t = 0; t < draws; t++) {
            CHECK_STATUS(pf_projection_draw(W, m, d, (pf_proj_kind)kind, PF_NORM_CHI, 31, t),
                         PF_OK);
            for (int i = 0; i < m; i++) {
                double n2 = row_norm(W + (size_t)i * d, d);
                n2 *= n2;
                s1 += n2;
                s2 += (n2 - k) * (n2 - k);
                for (int j = 0; j < d; j++) {
                    e1 += W[i * d + j];
                    e2 += (double)W[i * d + j] * W[i * d + j];
                }
            }
        }
        double mean = s1 / N, var = s2 / N, em = e1 / (N * d), ev = e2 / (N * d);
        double se_mean = sqrt(2 * k / N), se_var = sqrt((12 * k * k + 48 * k - 4 * k * k) / N);
        CHECK_CLOSE(mean, k, 5 * se_mean, 0);
        CHECK_CLOSE(var, 2 * k, 5 * se_var, 0);
        CHECK_CLOSE(em, 0, 5 / sqrt(N * d), 0);
        CHECK_CLOSE(ev, 1, 5 * sqrt(2 / (N * d)), 0);
        printf("%s chi, %g rows of d=%d: E|w|^2 %.3f (ref %d, SE %.3f), Var|w|^2 %.2f (ref %d, "
               "SE %.2f), entry mean %.4f, entry E w^2 %.4f\n", kind ? "orthogonal" : "iid", N, d,
               mean, d, se_mean, var, 2 * d, se_var, em, ev);
    }
    free(W);
}

/* iid entries: N(0,1). m*d = 65536 entries: mean SE 1/sqrt(n), second moment SE sqrt(2/n),
 * fourth moment SE sqrt(96/n); adjacent-column correlation SE 1/sqrt(m (d-1)). */
static void test_iid_entries(void) {
    enum { m = 1024, d = 64 };
    float *W = xmalloc(sizeof(float) * m * d);
    CHECK_STATUS(pf_projection_draw(W, m, d, PF_PROJ_IID, PF_NORM_CHI, 77, 0), PF_OK);
    double n = (double)m * d, s1 = 0, s2 = 0, s4 = 0, c = 0;
    for (int i = 0; i < m * d; i++) {
        double w = W[i];
        s1 += w;
        s2 += w * w;
        s4 += w * w * w * w;
        if (i % d != d - 1) c += w * W[i + 1];
    }
    CHECK_CLOSE(s1 / n, 0, 5 / sqrt(n), 0);
    CHECK_CLOSE(s2 / n, 1, 5 * sqrt(2 / n), 0);
    CHECK_CLOSE(s4 / n, 3, 5 * sqrt(96 / n), 0);
    CHECK_CLOSE(c / (m * (d - 1.0)), 0, 5 / sqrt(m * (d - 1.0)), 0);
    printf("iid %dx%d: mean %.4f, E w^2 %.4f, E w^4 %.3f, adjacent corr %.4f\n", m, d, s1 / n,
           s2 / n, s4 / n, c / (m * (d - 1.0)));
    free(W);
}

/* Haar directions. A row u of a Haar orthogonal matrix is uniform on the sphere S^{d-1}:
 * E u = 0 with Var u_a = 1/d; E u u^T = I/d, with Var(u_a^2) = 3/(d(d+2)) - 1/d^2 and
 * Var(u_a u_b) = 1/(d(d+2)) for a != b. Without the sign fix the first component of every row
 * would have a fixed sign, so the mean test catches it. For d = 3 each coordinate of u is
 * uniform on [-1, 1] (Archimedes), checked by Kolmogorov-Smirnov (sqrt(n) D < 1.95, level
 * 0.001). Rows 0 and d-1 of the first block, one draw per stream. */
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void test_haar(void) {
    enum { d = 8, draws = 4000 };
    float W[d * d];
    const int rows[2] = {0, d - 1};
    double worst_mean = 0, worst_cov = 0;
    for (int rr = 0; rr < 2; rr++) {
        double mu[d] = {0}, S[d][d] = {{0}};
        for (int t = 0; t < draws; t++) {
            pf_projection_draw(W, d, d, PF_PROJ_ORTHOGONAL, PF_NORM_SQRTD, 5, t);
            double u[d];
            for (int a = 0; a < d; a++) u[a] = W[rows[rr] * d + a] / sqrt((double)d);
            for (int a = 0; a < d; a++) {
                mu[a] += u[a];
                for (int b = 0; b < d; b++) S[a][b] += u[a] * u[b];
            }
        }
        double var_diag = 3.0 / (d * (d + 2.0)) - 1.0 / (d * (double)d);
        double var_off = 1.0 / (d * (d + 2.0));
        for (int a = 0; a < d; a++) {
            double se = sqrt(1.0 / d / draws);
            CHECK_CLOSE(mu[a] / draws, 0, 5 * se, 0);
            worst_mean = fmax(worst_mean, fabs(mu[a] / draws) / se);
            for (int b = 0; b < d; b++) {
                double ref = a == b ? 1.0 / d : 0.0;
                double se2 = sqrt((a == b ? var_diag : var_off) / draws);
                CHECK_CLOSE(S[a][b] / draws, ref, 5 * se2, 0);
                worst_cov = fmax(worst_cov, fabs(S[a][b] / draws - ref) / se2);
            }
        }
    }
    printf("Haar d=%d, %d draws: max |mean u_a| %.2f SE, max |E u u^T - I/d| %.2f SE\n", d,
           draws, worst_mean, worst_cov);

    enum { n = 20000 };
    double *x = xmalloc(sizeof(double) * n);
    float W3[9];
    for (int rr = 0; rr < 3; rr++) {
        for (int comp = 0; comp < 3; comp += 2) {
            for (int t = 0; t < n; t++) {
                pf_projection_draw(W3, 3, 3, PF_PROJ_ORTHOGONAL, PF_NORM_SQRTD, 6, t);
                x[t] = W3[rr * 3 + comp] / sqrt(3.0);
            }
            qsort(x, n, sizeof(double), cmp_double);
            double D = 0;
            for (int i = 0; i < n; i++) {
                double F = 0.5 * (x[i] + 1.0);  /* the CDF of U(-1, 1) */
                /* a comparison, not D = fmax(D, e): GCC 12.2 for aarch64 stops with an
                 * internal error vectorising that reduction at -O2 */
                double e = fmax(fabs(F - (double)i / n), fabs((double)(i + 1) / n - F));
                if (e > D) D = e;
            }
            CHECK(sqrt((double)n) * D < 1.95, "d=3 row %d comp %d: KS sqrt(n) D = %.3f", rr,
                  comp, sqrt((double)n) * D);
            printf("Haar d=3 row %d component %d: KS sqrt(n) D = %.3f (bound 1.95)\n", rr, comp,
                   sqrt((double)n) * D);
        }
    }
    free(x);
}

static void test_determinism(void) {
    enum { m = 100, d = 16 };
    static float A[m * d], B[m * d], C[m * d], E[m * d];
    for (int kind = 0; kind < 2; kind++) {
        for (int nk = 0; nk < 3; nk++) {
            pf_proj_kind k = (pf_proj_kind)kind;
            pf_norm_kind nm = (pf_norm_kind)nk;
            pf_projection_draw(A, m, d, k, nm, 1234, 5);
            pf_projection_draw(B, m, d, k, nm, 1234, 5);
            pf_projection_draw(C, m, d, k, nm, 1234, 6);
            pf_projection_draw(E, m, d, k, nm, 1235, 5);
            CHECK(memcmp(A, B, sizeof(A)) == 0, "kind=%d norm=%d: not bit-identical", kind, nk);
            int same_c = 0, same_e = 0;
            for (int i = 0; i < m * d; i++) {
                same_c += A[i] == C[i];
                same_e += A[i] == E[i];
            }
            CHECK(same_c == 0, "kind=%d norm=%d: streams 5 and 6 share %d entries", kind, nk,
                  same_c);
            CHECK(same_e == 0, "kind=%d norm=%d: seeds 1234, 1235 share %d entries", kind, nk,
                  same_e);
        }
    }
    /* redrawing through pf_projection_stream: steps in one window share W, the next differs */
    pf_projection_draw(A, m, d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 1, pf_projection_stream(0, 10));
    pf_projection_draw(B, m, d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 1, pf_projection_stream(9, 10));
    pf_projection_draw(C, m, d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 1, pf_projection_stream(10, 10));
    CHECK(memcmp(A, B, sizeof(A)) == 0, "steps 0 and 9 must share W");
    CHECK(memcmp(A, C, sizeof(A)) != 0, "step 10 must redraw W");
}

int main(void) {
    test_args();
    test_numpy_reference();
    test_orthogonal_and_norms();
    test_chi_moments();
    test_iid_entries();
    test_haar();
    test_determinism();
    TEST_MAIN_END();
}
