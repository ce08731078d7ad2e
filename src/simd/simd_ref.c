/* simd_ref.c: the portable vector kernels: plain C and libm, the reference for the others. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "internal.h"
#include "simd/simd.h"

static void exp_ref(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = expf(x[i]);
}

static void exp_sub_ref(float *y, const float *x, float c, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = expf(x[i] - c);
}

static double exp_sub_sum_ref(float *y, const float *x, float c, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        y[i] = expf(x[i] - c);
        s += y[i];
    }
    return s;
}

static float max_ref(const float *x, size_t n) {
    float m = -INFINITY;
    for (size_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

enum { SC_BLOCK = 64 };

/* sin and cos of one block of SC_BLOCK floats, by the method of simd.h without FMA (the Cephes
 * split of pi/2): a fixed trip count, no branches and no aliasing, so that -O2 vectorises it.
 * Lanes with |x| > PF_SINCOS_MAX, Inf or NaN get sin 0 and cos 0 instead; returns 1 if any. */
static int sincos_block(float *restrict s, float *restrict c, const float *restrict x) {
    int bad = 0;
    for (int k = 0; k < SC_BLOCK; k++) {
        const float xk = x[k];
        uint32_t xb, sb, cb;
        memcpy(&xb, &xk, sizeof xb);
        /* a = |x|, or 0 if |x| > PF_SINCOS_MAX, Inf or NaN: as integers, since a float compare
         * (it may trap on NaN) keeps GCC from vectorising */
        const int out = (xb & 0x7fffffffu) > PF_SINCOS_MAX_BITS;
        bad |= out;
        const uint32_t ab = (xb & 0x7fffffffu) & (0u - (uint32_t)!out);
        float a;
        memcpy(&a, &ab, sizeof a);
        const int32_t j = (int32_t)(a * PF_2_PI + 0.5f); /* a >= 0: the nearest integer */
        const float fj = (float)j;
        float r = a - fj * PF_PIO2_C1; /* exact */
        r = r - fj * PF_PIO2_C2;
        r = r - fj * PF_PIO2_C3;
        const float z = r * r;
        const float ps = r + r * z * ((PF_SIN_P0 * z + PF_SIN_P1) * z + PF_SIN_P2);
        const float pc = ((PF_COS_P0 * z + PF_COS_P1) * z + PF_COS_P2) * (z * z) - 0.5f * z + 1.0f;
        /* quadrant j mod 4: odd swaps sin and cos, sin changes sign for j mod 4 in {2, 3} (and
         * with x), cos for j mod 4 in {1, 2} */
        const float sv = (j & 1) ? pc : ps, cv = (j & 1) ? ps : pc;
        memcpy(&sb, &sv, sizeof sb);
        memcpy(&cb, &cv, sizeof cb);
        sb ^= (xb & 0x80000000u) ^ (((uint32_t)j << 30) & 0x80000000u);
        cb ^= ((uint32_t)(j + 1) << 30) & 0x80000000u;
        memcpy(&s[k], &sb, sizeof sb);
        memcpy(&c[k], &cb, sizeof cb);
    }
    return bad;
}

static void sincos_ref(float *s, float *c, const float *x, size_t n) {
    float xb[SC_BLOCK], sb[SC_BLOCK], cb[SC_BLOCK];
    for (size_t i = 0; i < n; i += SC_BLOCK) {
        const size_t len = n - i < SC_BLOCK ? n - i : SC_BLOCK;
        memcpy(xb, x + i, len * sizeof *xb); /* a copy: s or c may be x */
        memset(xb + len, 0, (SC_BLOCK - len) * sizeof *xb);
        if (sincos_block(sb, cb, xb)) {
            for (size_t k = 0; k < len; k++) {
                if (!(fabsf(xb[k]) <= PF_SINCOS_MAX)) {
                    sb[k] = sinf(xb[k]);
                    cb[k] = cosf(xb[k]);
                }
            }
        }
        memcpy(s + i, sb, len * sizeof *sb);
        memcpy(c + i, cb, len * sizeof *cb);
    }
}

/* SSE stores where every x86-64 CPU has them (16-byte aligned dst, r a multiple of 4), else
 * memcpy. */
static void stream_rows_ref(float *dst, const float *src, size_t lds, size_t n, size_t r) {
#if defined(__x86_64__)
    if (((uintptr_t)dst & 15) == 0 && r % 4 == 0) {
        for (size_t i = 0; i < n; i++) {
            const float *a = src + i * lds;
            float *b = dst + i * r;
            for (size_t k = 0; k < r; k += 4) _mm_stream_ps(b + k, _mm_loadu_ps(a + k));
        }
        _mm_sfence();
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) memcpy(dst + i * r, src + i * lds, sizeof(float) * r);
}

/* Each C(i, j) as one sum over p = 0, 1, ..., k-1 in order. */
static void gemm_ref(int tb, int m, int n, int k, float alpha, const float *A, size_t rs, size_t cs,
                     const float *B, size_t ldb, float beta, float *C, size_t ldc) {
    for (int i = 0; i < m; i++) {
        const float *a = A + (size_t)i * rs;
        float *c = C + (size_t)i * ldc;
        for (int j = 0; j < n; j++) {
            float s = 0.0f;
            if (tb)
                for (int p = 0; p < k; p++) s += a[(size_t)p * cs] * B[(size_t)j * ldb + (size_t)p];
            else
                for (int p = 0; p < k; p++) s += a[(size_t)p * cs] * B[(size_t)p * ldb + (size_t)j];
            if (alpha != 1.0f) s *= alpha;
            c[j] = beta == 0.0f ? s : beta * c[j] + s;
        }
    }
}

/* A decoding step's pass over a head's state (pf_simd_table.decode): the pending update
 * S = beta S + k wk (none when k is NULL), then gemm_ref's sums for o = [q | a] [S ; w], each
 * column's over p in order, in one pass over the rows of S (each updated, written back, then
 * read out). */
static void decode_ref(float *S, size_t lds, int r, int n, const float *qa, const float *k,
                       const float *wk, float beta, const float *w, float *o) {
    for (int j = 0; j < n; j++) o[j] = 0.0f;
    for (int p = 0; p < r; p++) {
        float *s = S + (size_t)p * lds;
        const float q = qa[p];
        for (int j = 0; j < n; j++) {
            if (k) {
                float x = 0.0f;
                x += k[p] * wk[j];
                s[j] = beta == 0.0f ? x : beta * s[j] + x;
            }
            o[j] += q * s[j];
        }
    }
    for (int j = 0; j < n; j++) o[j] += qa[r] * w[j];
}

const pf_simd_table pf_simd_ref = {.name = "ref",
                                   .exp = exp_ref,
                                   .exp_sub_sum = exp_sub_sum_ref,
                                   .max = max_ref,
                                   .sincos = sincos_ref,
                                   .stream_rows = stream_rows_ref,
                                   .gemm = gemm_ref,
                                   .decode = decode_ref,
                                   .exp_sub = exp_sub_ref,
                                   .wt_panel = 0};
