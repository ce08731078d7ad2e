/* internal.h: what the library's files share and the tests may reach; not installed.
 * Nothing here is part of the public API. */
#ifndef PF_INTERNAL_H
#define PF_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "performer.h"

#define PF_INTERNAL __attribute__((visibility("hidden")))

static inline int pf_imin(int a, int b) {
    return a < b ? a : b;
}

/* Records the status s of one iteration of a parallel loop in *st: the worse of the two (so the
 * call's status does not depend on which thread arrives first). Needs a critical section. */
static inline void pf_status_record(pf_status *st, pf_status s) {
#ifdef _OPENMP
#pragma omp critical(pf_status_record)
#endif
    {
        if (s > *st) *st = s;
    }
}

/* One allocation carved into pieces, by a layout function run twice: with base NULL to count the
 * bytes, then to place the pieces. The piece of count items of size bytes at *off (then moved
 * past it, rounded up to whole 64-byte lines, as pf_alloc aligns the base); NULL while counting.
 * A size that overflows leaves *off at SIZE_MAX, which no allocation can have. */
static inline void *pf_carve(char *base, size_t *off, size_t count, size_t size) {
    if (*off == SIZE_MAX || (size && count > (SIZE_MAX - 64) / size)) {
        *off = SIZE_MAX;
        return NULL;
    }
    const size_t bytes = (count * size + 63) / 64 * 64;
    if (bytes > SIZE_MAX - 64 - *off) {
        *off = SIZE_MAX;
        return NULL;
    }
    void *piece = base ? base + *off : NULL;
    *off += bytes;
    return piece;
}

/* The worse of two statuses: the larger, by the order performer.h states for pf_status (OpenMP
 * max-reductions over statuses and the MPI layer's MPI_MAXLOC rely on the same order). */
static inline pf_status pf_status_worse(pf_status a, pf_status b) {
    return a > b ? a : b;
}

/* Aligned allocation (64 bytes, cache line and AVX-512 width); NULL on failure or overflow. */
PF_INTERNAL void *pf_alloc(size_t count, size_t size);
PF_INTERNAL void pf_free(void *p);

/* The number of threads a call with opts->threads == t should use (t > 0: t; 0: OpenMP's). */
PF_INTERNAL int pf_threads(int t);

/* Called by each thread of a parallel region before its BLAS calls: they run on this thread
 * alone until the region ends. OpenBLAS's OpenMP build runs a call made inside an active region
 * on one thread, but a region of one thread (threads = 1) is not active, and there it would start
 * a team of its own. No effect outside a parallel region or without OpenMP. */
PF_INTERNAL void pf_blas_pin(void);

/* pf_blas_core_advised's rule, for OpenBLAS kernel set `core` on a CPU of `cpu`: 2 AVX-512 (F,
 * BW, VL, DQ), 1 AVX2 and FMA, 0 neither. The tests ask it about CPUs they do not run on. */
PF_INTERNAL const char *pf_blas_core_advice(const char *core, int cpu);

/* 1 if any of x[0..n) is NaN or Inf. */
PF_INTERNAL int pf_any_nonfinite(const float *x, size_t n);

/* The effective logit scale: s if s > 0, else 1/sqrt(d). */
PF_INTERNAL float pf_effective_scale(float s, int d);

/* pf_simd()->gemm with BLAS's arguments (ta, tb 0 or 1; not both 1): the library's own product,
 * for every FAVOR+ product: narrow ones (a side of d or dv + 1), where sgemm's packing costs
 * about as much as the arithmetic, whose bits must not depend on the number of rows (blas.c). */
PF_INTERNAL void pf_mm(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc);

/* dst (cols, rows) = the first cols columns of src (rows, row stride lds) transposed: products
 * with src^T then take dst's rows, at the speed of pf_mm's tiles. */
PF_INTERNAL void pf_transpose(float *dst, const float *src, int rows, int cols, int lds);

/* ---- vector kernels (src/simd/): chosen once at run time from the CPU's features ---------- */

typedef struct pf_simd_table {
    const char *name;                                /* "avx512", "avx2", "neon", "ref" */
    void (*exp)(float *y, const float *x, size_t n); /* y = exp(x) */
    /* y = exp(x - c); returns sum of y (in double) */
    double (*exp_sub_sum)(float *y, const float *x, float c, size_t n);
    float (*max)(const float *x, size_t n); /* max, -inf for n = 0 */
    /* s = sin x, c = cos x (float rounding, see simd.h); s or c may be x itself (in place),
     * but s and c must not overlap each other, nor x partly */
    void (*sincos)(float *s, float *c, const float *x, size_t n);
    /* n rows of r floats from src (row stride lds) to dst (contiguous), stored past the cache
     * where the CPU can (whole 64-byte lines when dst is 64-byte aligned and r a multiple of
     * 16): for data written once and not read again soon */
    void (*stream_rows)(float *dst, const float *src, size_t lds, size_t n, size_t r);
    /* C (m x n, row stride ldc) = alpha op(A) op(B) + beta C for the small products of the
     * causal chunks and the decoding steps, each element of C by one fixed sequence of
     * operations whatever m and wherever it sits (simd/gemm_tmpl.h), so that a product of one
     * row gives the bits of the same row in a product of many. op(A)(i, p) = A[i rs + p cs]
     * with rs or cs equal to 1; op(B) = B (k x n, row stride ldb) when tb is 0, else B^T with B
     * (n x k, row stride ldb) and cs = 1. beta = 0: C is not read. */
    void (*gemm)(int tb, int m, int n, int k, float alpha, const float *A, size_t rs, size_t cs,
                 const float *B, size_t ldb, float beta, float *C, size_t ldc);
    /* A decoding step's one pass over a head's state S (r rows of n used columns, row stride
     * lds; simd/decode_tmpl.h): first the previous token's pending update S = beta S + k wk
     * (k (r) a column, wk (n) a row; none when k is NULL), then o (n) = [q | a] [S ; w] with the
     * updated S, k = r + 1 (qa holds q (r) then a), each element with the bits of gemm's
     *   gemm(0, r, n, 1, 1, k, 1, r, wk, ., beta, S, lds)          (as op(A) = k^T)
     *   gemm(0, 1, n, r + 1, 1, qa, ., 1, [S ; w], lds, 0, o, .)   (S read after its update) */
    void (*decode)(float *S, size_t lds, int r, int n, const float *qa, const float *k,
                   const float *wk, float beta, const float *w, float *o);
    /* y = exp(x - c), the subtraction rounded to float: the bits of x - c then exp, in one pass
     * (y may be x) */
    void (*exp_sub)(float *y, const float *x, float c, size_t n);
    /* Columns of W^T a feature projection takes as one panel (pf_fmap_bind stores W^T panel by
     * panel, each d x wt_panel contiguous, and pf_fmap_project multiplies by one at a time, so
     * that the panel stays in L1 while a block's rows go by); 0: W^T whole, one product */
    int wt_panel;
} pf_simd_table;

/* The table in use: the best this CPU supports, unless PF_SIMD=ref|avx2|avx512 in the
 * environment asks for another (one the CPU supports). */
PF_INTERNAL const pf_simd_table *pf_simd(void);

/* half.c: float16 and bfloat16 to and from float32 (round to nearest even), n elements; and
 * whether any of n elements of dt is Inf or NaN. */
PF_INTERNAL float pf_f16_to_f32(uint16_t h);
PF_INTERNAL uint16_t pf_f32_to_f16(float f);
PF_INTERNAL float pf_bf16_to_f32(uint16_t b);
PF_INTERNAL uint16_t pf_f32_to_bf16(float f);
PF_INTERNAL void pf_rows_to_f32(float *dst, const void *src, pf_dtype dt, size_t n);
PF_INTERNAL void pf_rows_from_f32(void *dst, pf_dtype dt, const float *src, size_t n);
PF_INTERNAL int pf_nonfinite_dt(const void *x, pf_dtype dt, size_t n);

/* Each table by name, or NULL when this CPU cannot run it: for tests of every path. */
PF_INTERNAL const pf_simd_table *pf_simd_get(const char *name);

#endif
