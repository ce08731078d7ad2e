/* test_blas.c: the matrix products (src/blas.c): pf_mm on every vector path this CPU runs
 * (simd/gemm_tmpl.h), against a float64 product written here: every transpose pair it takes,
 * one and several rows (every tile remainder), column counts around the vector widths (the
 * column kinds of gemm_tmpl.h), k of 0, 1 and more, beta 0 (over NaN-filled C: it must not be
 * read), 1 and 0.5, padded leading dimensions whose padding must stay untouched. Products of
 * float inputs summed in float agree with float64 to k * 2^-24 relative to the sum of |terms|;
 * the bound used is 1e-6 * (k + 1) of it. Each row must also get the same bits alone as among
 * others (what makes a decoding step equal the full pass). pf_simd_path names the path in use,
 * pf_blas_core OpenBLAS's kernel set, pf_blas_core_advised the set it should run (its rule is
 * checked for CPUs this one is not).
 *
 * OpenBLAS as the library calls it: sgemm from several OpenMP threads at once, each pinned to
 * itself by pf_blas_pin, gives every product the bits it has alone (a BLAS that shared a packing
 * buffer between threads would not), in regions of several threads and of one; the pin ends
 * with its region, and the library leaves the caller's OpenMP thread count as it was.
 *
 * The decoding step's fused pass over a state (simd/decode_tmpl.h) gives the bits of the two
 * products it replaces, on every path. */
#include <math.h>
#include <string.h>

#include <cblas.h>

#include "check.h"
#include "internal.h"
#ifdef _OPENMP
#include <omp.h>
#endif

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

/* pf_blas_core_advice: the set to ask for by the CPU's level (2 AVX-512, 1 AVX2, 0 neither)
 * when OpenBLAS runs an older one; nothing for a set as good, or for a name it does not know. */
/* A decoding step's fused pass (t->decode) against the two products it stands for, made by the
 * same table's gemm: S = beta S + k wk (the pending update; none when pending is 0), then
 * o = [q | a] [S ; w] with the updated S, bit for bit, S's padding (row stride n + PAD)
 * untouched. S, k, wk and w hold some +0 and -0 (the signs of exact zeros depend on the order of
 * operations). */
static void check_decode(const pf_simd_table *t, int r, int n, float beta, int pending) {
    const int lds = n + PAD;
    const size_t ns = (size_t)(r + 1) * lds;
    float *S = xmalloc(sizeof(float) * ns), *Sg = xmalloc(sizeof(float) * ns);
    float *qa = xmalloc(sizeof(float) * (r + 1)), *k = xmalloc(sizeof(float) * r);
    float *w = xmalloc(sizeof(float) * n), *o = xmalloc(sizeof(float) * n);
    float *og = xmalloc(sizeof(float) * n), *wk = xmalloc(sizeof(float) * n);
    fill_normal(S, ns, 1.0f, (uint64_t)(r * 1000 + n), 0);
    fill_normal(qa, (size_t)r + 1, 1.0f, (uint64_t)(r * 1000 + n), 1);
    fill_normal(k, (size_t)r, 1.0f, (uint64_t)(r * 1000 + n), 2);
    fill_normal(w, (size_t)n, 1.0f, (uint64_t)(r * 1000 + n), 3);
    fill_normal(wk, (size_t)n, 1.0f, (uint64_t)(r * 1000 + n), 4);
    for (int p = 0; p < r; p++)
        for (int j = n; j < lds; j++) S[(size_t)p * lds + j] = 12345.0f; /* padding */
    for (size_t i = 0; i < ns; i += 7) S[i] = i % 2 ? -0.0f : 0.0f;
    for (int p = 0; p < r; p += 5) k[p] = p % 2 ? -0.0f : 0.0f;
    if (n > 2) w[n - 2] = wk[n - 1] = -0.0f;
    /* the products: S updated in place, then [S ; w] as r + 1 rows */
    memcpy(Sg, S, sizeof(float) * ns);
    if (pending) t->gemm(0, r, n, 1, 1.0f, k, 1, (size_t)r, wk, (size_t)n, beta, Sg, (size_t)lds);
    memcpy(Sg + (size_t)r * lds, w, sizeof(float) * n);
    t->gemm(0, 1, n, r + 1, 1.0f, qa, (size_t)(r + 1), 1, Sg, (size_t)lds, 0.0f, og, (size_t)n);
    t->decode(S, (size_t)lds, r, n, qa, pending ? k : NULL, wk, beta, w, o);
    CHECK(memcmp(o, og, sizeof(float) * n) == 0,
          "%s decode r=%d n=%d beta=%g pending=%d: readout differs", t->name, r, n, beta, pending);
    CHECK(memcmp(S, Sg, sizeof(float) * (size_t)r * lds) == 0,
          "%s decode r=%d n=%d beta=%g pending=%d: update differs (or padding touched)", t->name, r,
          n, beta, pending);
    free(wk);
    free(S);
    free(Sg);
    free(qa);
    free(k);
    free(w);
    free(o);
    free(og);
}

static void check_advice(void) {
    static const struct {
        const char *core;
        int cpu;
        const char *want;
    } cases[] = {
        {"Prescott", 2, "SkylakeX"}, {"Prescott", 1, "Haswell"},    {"Prescott", 0, NULL},
        {"NEHALEM", 2, "SkylakeX"},  {"Sandybridge", 1, "Haswell"}, {"Haswell", 2, "SkylakeX"},
        {"Zen", 2, "SkylakeX"},      {"Zen", 1, "Haswell"},         {"Haswell", 1, NULL},
        {"SkylakeX", 2, NULL},       {"Cooperlake", 2, NULL},       {"SkylakeX", 1, NULL},
        {"ThunderX2", 2, NULL},      {"unknown", 2, NULL},          {NULL, 2, NULL},
        {"Prescott", -1, NULL},      {"ZEN", 1, "Haswell"},         {"Zen", 0, NULL},
        {"Excavator", 1, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *got = pf_blas_core_advice(cases[i].core, cases[i].cpu);
        const char *want = cases[i].want;
        CHECK(got == want || (got && want && strcmp(got, want) == 0),
              "advice for %s on a CPU of level %d: %s, expected %s",
              cases[i].core ? cases[i].core : "(null)", cases[i].cpu, got ? got : "none",
              want ? want : "none");
    }
    const char *advised = pf_blas_core_advised();
    printf("OpenBLAS kernels: %s%s%s\n", pf_blas_core(), advised ? "; this CPU runs " : "",
           advised ? advised : "");
}

/* NPROD products of exact attention's block shapes (and a square one), each computed alone
 * first (on one thread: a threaded BLAS need not give the same bits), then all of them ROUNDS
 * times over by `nt` threads at once in dynamic order. */
enum { NPROD = 12, ROUNDS = 4 };
static void check_concurrent_sgemm(int nt) {
    static const int shape[4][5] = {/* ta, tb, m, n, k */
                                    {0, 1, 128, 512, 64},
                                    {0, 0, 128, 64, 512},
                                    {1, 0, 512, 64, 128},
                                    {0, 0, 200, 200, 200}};
    float *A[NPROD], *B[NPROD], *C[NPROD], *R[NPROD];
#ifdef _OPENMP
#pragma omp parallel num_threads(1)
#endif
    for (int p = 0; p < NPROD; p++) {
        pf_blas_pin();
        const int *s = shape[p % 4];
        const size_t na = (size_t)s[2] * s[4], nb = (size_t)s[4] * s[3], nc = (size_t)s[2] * s[3];
        A[p] = xmalloc(sizeof(float) * na), B[p] = xmalloc(sizeof(float) * nb);
        C[p] = xmalloc(sizeof(float) * nc * ROUNDS), R[p] = xmalloc(sizeof(float) * nc);
        fill_normal(A[p], na, 1.0f, 11, (uint64_t)p);
        fill_normal(B[p], nb, 1.0f, 12, (uint64_t)p);
        cblas_sgemm(CblasRowMajor, s[0] ? CblasTrans : CblasNoTrans,
                    s[1] ? CblasTrans : CblasNoTrans, s[2], s[3], s[4], 1.0f, A[p],
                    s[0] ? s[2] : s[4], B[p], s[1] ? s[4] : s[3], 0.0f, R[p], s[3]);
    }
    int outer = 1, inner = 0;
#ifdef _OPENMP
    outer = omp_get_max_threads();
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) reduction(max : inner)
#endif
    for (int u = 0; u < NPROD * ROUNDS; u++) {
        pf_blas_pin();
#ifdef _OPENMP
        if (omp_get_max_threads() > inner) inner = omp_get_max_threads();
#endif
        const int p = u % NPROD, *s = shape[p % 4];
        float *c = C[p] + (size_t)(u / NPROD) * (size_t)s[2] * (size_t)s[3];
        cblas_sgemm(CblasRowMajor, s[0] ? CblasTrans : CblasNoTrans,
                    s[1] ? CblasTrans : CblasNoTrans, s[2], s[3], s[4], 1.0f, A[p],
                    s[0] ? s[2] : s[4], B[p], s[1] ? s[4] : s[3], 0.0f, c, s[3]);
    }
    int same = 1;
    for (int p = 0; p < NPROD; p++) {
        const size_t nc = (size_t)shape[p % 4][2] * (size_t)shape[p % 4][3];
        for (int r = 0; r < ROUNDS; r++) same &= memcmp(C[p] + r * nc, R[p], 4 * nc) == 0;
        free(A[p]), free(B[p]), free(C[p]), free(R[p]);
    }
    CHECK(same, "sgemm from %d threads at once: a product differs from its bits alone", nt);
#ifdef _OPENMP
    CHECK(inner == 1, "pf_blas_pin in a region of %d threads: BLAS may use %d", nt, inner);
    CHECK(omp_get_max_threads() == outer, "after a pinned region: %d OpenMP threads, was %d",
          omp_get_max_threads(), outer);
#else
    (void)outer, (void)inner;
#endif
}

int main(void) {
#ifdef _OPENMP
    const int omp_threads = omp_get_max_threads();
#endif
    check_advice();
    check_concurrent_sgemm(4); /* more threads than this machine may have cores: interleaved */
    check_concurrent_sgemm(1);
#ifdef _OPENMP
    pf_threads(0); /* (pins OpenBLAS's pthread build; must not take the caller's threads) */
    CHECK(omp_get_max_threads() == omp_threads && pf_threads(0) == omp_threads,
          "the library changed OpenMP's thread count: %d, pf_threads %d, was %d",
          omp_get_max_threads(), pf_threads(0), omp_threads);
#endif
    const float betas[3] = {0.0f, 1.0f, 0.5f};
    /* rows 1..7 and 13 (tiles of 6 and of 3 or 4, and their remainders), 40 and 70 (the columns
     * apart side by side: 4 rows, or 4 groups of a vector's width of rows, and what is left),
     * columns about 8 and 16 wide (one or two columns apart, masked tails, 4 x 16 tiles) */
    const char *paths[4] = {"ref", "avx2", "avx512", "neon"};
    const int gm[11] = {1, 2, 3, 4, 5, 6, 7, 13, 16, 40, 70};
    const int gn[14] = {1, 2, 3, 8, 9, 10, 15, 16, 17, 18, 33, 64, 65, 83};
    const int gk[5] = {0, 1, 7, 16, 300};
    for (int pi = 0; pi < 4; pi++) {
        const pf_simd_table *t = pf_simd_get(paths[pi]);
        if (!t) {
            printf("%s: not run by this CPU\n", paths[pi]);
            continue;
        }
        for (int ab = 0; ab < 3; ab++) /* (ta, tb) = (0, 0), (1, 0), (0, 1) */
            for (int mi = 0; mi < 11; mi++)
                for (int ni = 0; ni < 14; ni++)
                    for (int ki = 0; ki < 5; ki++)
                        check_case(t, ab == 1, ab == 2, gm[mi], gn[ni], gk[ki],
                                   betas[(mi + ni + ki) % 3]);
        /* decoding passes: r about the vector widths (lone columns' dot tails), n the column
         * kinds (lone 1 or 2, masked tails, blocks of 4 vectors and more, a first block of as
         * many vectors as a pass keeps with its last masked: 28, 31, 60, 63), beta 0, 1, other */
        const int dr[8] = {1, 7, 8, 15, 16, 17, 64, 1100};
        const int dn[19] = {1,  2,  8,  9,  10, 11, 16, 17, 18, 19,
                            28, 31, 33, 60, 63, 65, 66, 80, 101};
        const float dbeta[3] = {0.0f, 1.0f, 0.37f};
        for (int ri = 0; ri < 8; ri++)
            for (int ni = 0; ni < 19; ni++)
                for (int bi = 0; bi < 4; bi++) /* bi 3: nothing pending */
                    check_decode(t, dr[ri], dn[ni], dbeta[bi % 3], bi < 3);
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
    TEST_MAIN_END();
}
