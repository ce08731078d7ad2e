/* blas.c: the matrix products. FAVOR+'s run in the library's own vector kernels (pf_mm); the
 * rest (exact attention, RA, LARA, FAVOR#'s fit) in OpenBLAS, whose kernel set pf_blas_core
 * names.
 *
 * FAVOR+'s products are narrow: one side is d or dv + 1 (64, 65), the other r (256) and a block
 * of rows (256), a causal chunk (16) or a decoding step (1). OpenBLAS 0.3.21's sgemm packs both
 * operands first, which for these shapes costs about as much as the arithmetic: on one core of
 * this project's machine (AMD Zen 5) its AVX2 "Haswell" kernels run them at 60-110 GFLOP/s and
 * its AVX-512 ("Cooperlake") ones at about 195; the vector paths' own tiles (simd/gemm_tmpl.h, no
 * packing: the operands sit in L1 and L2) at 210-230 on AVX-512. They also give each element of
 * C the same bits whatever the rows beside it, which BLAS does not promise: FAVOR+'s results
 * do not depend on the BLAS, and a decoding step runs the very arithmetic of the full pass. */
#include <assert.h>

#include <cblas.h>

#include "internal.h"

const char *pf_simd_path(void) {
    return pf_simd()->name;
}

const char *pf_blas_core(void) {
    const char *core = openblas_get_corename();
    return core ? core : "unknown";
}

void pf_transpose(float *dst, const float *src, int rows, int cols, int lds) {
    for (int i = 0; i < rows; i++)
        for (int c = 0; c < cols; c++)
            dst[(size_t)c * (size_t)rows + (size_t)i] = src[(size_t)i * (size_t)lds + (size_t)c];
}

void pf_mm(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda,
           const float *B, int ldb, float beta, float *C, int ldc) {
    assert(!(ta && tb));
    const size_t la = (size_t)lda;
    pf_simd()->gemm(tb, m, n, k, alpha, A, ta ? 1 : la, ta ? la : 1, B, (size_t)ldb, beta, C,
                    (size_t)ldc);
}
