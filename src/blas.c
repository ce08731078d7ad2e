/* blas.c: the matrix products: OpenBLAS for the large ones (which kernels run; one-row
 * products), the library's own vector kernels for the causal chunks' few-row ones (pf_mm).
 *
 * OpenBLAS 0.3.21's sgemm packs both operands whatever their shape, except on its AVX-512 kernel
 * sets (SkylakeX, Cooperlake, Sapphire Rapids), which have a small-matrix path that does not.
 * A product of one row (a decoding step's projection) then costs a copy of the whole other
 * operand. sgemv does not copy, but on the AVX-512 sets it is slower than their small path. So
 * one-row products go to sgemv unless the kernels have the small path. Later OpenBLAS releases
 * forward one-row products to gemv themselves.
 *
 * The causal chunks (16 rows, or 1 when decoding) multiply by the running state: products like
 * 16 x 65 x 272 and 256 x 65 x 16 that the AVX2 "Haswell" kernels, packing, run at 60-100
 * GFLOP/s on one core of this project's machine (AMD Zen 5) where the vector paths' own tiles
 * (simd/gemm_tmpl.h, no packing: the operands sit in L1 and L2) run at 170-220 on AVX-512, as
 * fast as OpenBLAS's AVX-512 small-matrix path. They also give each row of C the same bits
 * whatever the rows beside it, which BLAS does not promise: a decoding step then runs the very
 * arithmetic of the full pass. */
#include <assert.h>
#include <stdatomic.h>
#include <strings.h>

#include <cblas.h>

#include "internal.h"

const char *pf_simd_path(void) {
    return pf_simd()->name;
}

const char *pf_blas_core(void) {
    const char *core = openblas_get_corename();
    return core ? core : "unknown";
}

/* 1 if the kernel set has sgemm's small-matrix path (an AVX-512 set), else 0. */
static int small_path(void) {
    static atomic_int known = -1; /* (found once; the same answer for every thread) */
    int v = atomic_load_explicit(&known, memory_order_relaxed);
    if (v >= 0) return v;
    static const char *const sets[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    v = 0;
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++)
        v |= strcasecmp(pf_blas_core(), sets[s]) == 0;
    atomic_store_explicit(&known, v, memory_order_relaxed);
    return v;
}

void pf_gemm_row(int ta, int tb, int n, int k, float alpha, const float *A, int lda, const float *B,
                 int ldb, float beta, float *C) {
    if (n <= 0) return;
    const int inca = ta ? lda : 1; /* a is A's row, or its column when transposed */
    if (k <= 0) {                  /* (sgemv would not scale c when there is nothing to add) */
        for (int j = 0; j < n; j++) C[j] = beta == 0.0f ? 0.0f : beta * C[j];
        return;
    }
    if (tb) /* B is n x k: c = B a */
        cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, alpha, B, ldb, A, inca, beta, C, 1);
    else /* B is k x n: c = B^T a */
        cblas_sgemv(CblasRowMajor, CblasTrans, k, n, alpha, B, ldb, A, inca, beta, C, 1);
}

void pf_gemm(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda,
             const float *B, int ldb, float beta, float *C, int ldc) {
    if (m <= 0 || n <= 0) return;
    if (m == 1 && !small_path()) {
        pf_gemm_row(ta, tb, n, k, alpha, A, lda, B, ldb, beta, C);
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
                k, alpha, A, lda, B, ldb, beta, C, ldc);
}

void pf_mm(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda,
           const float *B, int ldb, float beta, float *C, int ldc) {
    assert(!(ta && tb));
    const size_t la = (size_t)lda;
    pf_simd()->gemm(tb, m, n, k, alpha, A, ta ? 1 : la, ta ? la : 1, B, (size_t)ldb, beta, C,
                    (size_t)ldc);
}
