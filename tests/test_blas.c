/* test_blas.c: the matrix products (src/blas.c): pf_mm on every vector path this CPU runs
 * (simd/gemm_tmpl.h), against a float64 product written here: every transpose pair it takes,
 * one and several rows (every tile remainder), column counts around the vector widths (the
 * column kinds of gemm_tmpl.h), k of 0, 1 and more, beta 0 (over NaN-filled C: it must not be
 * read), 1 and 0.5, padded leading dimensions whose padding must stay untouched. Products of
 * float inputs summed in float agree with float64 to k * 2^-24 relative to the sum of |terms|;
 * the bound used is 1e-6 * (k + 1) of it. Each row must also get the same bits alone as among
 * others (what makes a decoding step equal the full pass). pf_simd_path names the path in use,
 * pf_blas_core OpenBLAS's kernel set. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "internal.h"

enum { PAD = 3 };

/* op(X)[i][j] of a row-major X with leading dimension ld, op = transpose when t. */
static double at(const float *X, int ld, int t, int i, int j) {
    return t ? X[(size_t)j * ld + i] : X[(size_t)i * ld + j];
}

/* One case: C (m x n, ldc = n + PAD) = alpha op(A) op(B) + beta C through t->gemm, checked
 * against float64 and for untouched padding, and each row alone against its bits in the whole. */
static void check_case(const pf_simd_table *t, int ta, int tb, int m, int n, int k, float beta) {
    const int lda = (ta ? m : k) + PAD, ldb = (tb ? k : n) + PAD, ldc = n + PAD;
    const int ra = ta ? k : m, rb = tb ? n : k; /* stored rows of A and B */
    const size_t na = (size_t)ra * lda + 1, nb = (size_t)rb * ldb + 1, nc = (size_t)m * ldc;
    float *A = xmalloc(sizeof(float) * na), *B = xmalloc(sizeof(float) * nb);
    float *C = xmalloc(sizeof(float) * nc), *C0 = xmalloc(sizeof(float) * nc);
    fill_normal(A, na, 1.0f, 1, (uint64_t)(m * 31 + k));
    fill_normal(B, nb, 1.0f, 2, (uint64_t)(n * 17 + k));
    fill_normal(C0, nc, 1.0f, 3, 0);
    if (beta == 0.0f)
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) C0[(size_t)i * ldc + j] = NAN;
    memcpy(C, C0, sizeof(float) * nc);
    const float alpha = 0.75f;
    const size_t rs = ta ? 1 : (size_t)lda, cs = ta ? (size_t)lda : 1;
    t->gemm(tb, m, n, k, alpha, A, rs, cs, B, (size_t)ldb, beta, C, (size_t)ldc);
    const char *what = t->name;
    double worst = 0;
    int untouched = 1;
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            double ref = 0, mag = 0;
            for (int p = 0; p < k; p++) {
                const double term = at(A, lda, ta, i, p) * at(B, ldb, tb, p, j);
                ref += term, mag += fabs(term);
            }
            ref *= alpha, mag *= alpha;
            if (beta != 0.0f) {
                ref += beta * (double)C0[(size_t)i * ldc + j];
                mag += fabs(beta * (double)C0[(size_t)i * ldc + j]);
            }
            const double got = C[(size_t)i * ldc + j];
            const double e = fabs(got - ref) / (mag > 0 ? mag : 1.0);
            if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
        }
        for (int j = n; j < ldc; j++)
            untouched &= memcmp(&C[(size_t)i * ldc + j], &C0[(size_t)i * ldc + j], 4) == 0;
    }
    CHECK(worst <= 1e-6 * (k + 1), "%s ta=%d tb=%d m=%d n=%d k=%d beta=%g: rel err %.3g", what, ta,
          tb, m, n, k, beta, worst);
    CHECK(untouched, "%s ta=%d tb=%d m=%d n=%d k=%d: the padding of C changed", what, ta, tb, m, n,
          k);
    if (m > 1) { /* each row alone: C0's row i through a product of one row */
        float *row = xmalloc(sizeof(float) * (size_t)ldc);
        int same = 1;
        for (int i = 0; i < m; i++) {
            memcpy(row, C0 + (size_t)i * ldc, sizeof(float) * (size_t)ldc);
            t->gemm(tb, 1, n, k, alpha, A + (size_t)i * rs, rs, cs, B, (size_t)ldb, beta, row,
                    (size_t)ldc);
            same &= memcmp(row, C + (size_t)i * ldc, sizeof(float) * (size_t)n) == 0;
        }
        CHECK(same, "%s ta=%d tb=%d m=%d n=%d k=%d beta=%g: a row alone differs", what, ta, tb, m,
              n, k, beta);
        free(row);
    }
    free(A), free(B), free(C), free(C0);
}

int main(void) {
    const float betas[3] = {0.0f, 1.0f, 0.5f};
    /* rows 1..7 and 13 (tiles of 6 and of 3 or 4, and their remainders),
     * columns about 8 and 16 wide (one or two columns apart, masked tails, 4 x 16 tiles) */
    const char *paths[3] = {"ref", "avx2", "avx512"};
    const int gm[9] = {1, 2, 3, 4, 5, 6, 7, 13, 16};
    const int gn[14] = {1, 2, 3, 8, 9, 10, 15, 16, 17, 18, 33, 64, 65, 83};
    const int gk[5] = {0, 1, 7, 16, 300};
    for (int pi = 0; pi < 3; pi++) {
        const pf_simd_table *t = pf_simd_get(paths[pi]);
        if (!t) {
            printf("%s: not run by this CPU\n", paths[pi]);
            continue;
        }
        for (int ab = 0; ab < 3; ab++) /* (ta, tb) = (0, 0), (1, 0), (0, 1) */
            for (int mi = 0; mi < 9; mi++)
                for (int ni = 0; ni < 14; ni++)
                    for (int ki = 0; ki < 5; ki++)
                        check_case(t, ab == 1, ab == 2, gm[mi], gn[ni], gk[ki],
                                   betas[(mi + ni + ki) % 3]);
        /* k past the ones column's copy of B's column (1024 floats at a time) */
        for (int ab = 0; ab < 3; ab++)
            for (int mi = 0; mi < 3; mi++)
                check_case(t, ab == 1, ab == 2, 1 + 6 * mi, 65, 2100, 0.5f);
    }
    const char *path = pf_simd_path();
    CHECK(path && strcmp(path, pf_simd()->name) == 0, "pf_simd_path %s, the table in use %s",
          path ? path : "(null)", pf_simd()->name);
    const char *core = pf_blas_core();
    CHECK(core && core[0], "pf_blas_core: empty");
    printf("OpenBLAS kernels: %s\n", core);
    TEST_MAIN_END();
}
