/* simd_avx512.c: the vector kernels for AVX-512F (16 floats a step, masked tails). Compiled with
 * -mavx512f and called only when cpuid (and the OS, through XCR0) says it can run. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "simd/simd.h"

/* exp of 16 floats; see simd.h for the method. A NaN passes the clamps (vmaxps and vminps
 * return their second operand when either is NaN) and every step after them: no compare and
 * blend for it (10% of the time). */
static inline __m512 exp16(__m512 x) {
    __m512 xc = _mm512_min_ps(_mm512_set1_ps(PF_EXP_HI + 0.5f),
                              _mm512_max_ps(_mm512_set1_ps(PF_EXP_LO), x));
    const __m512 round = _mm512_set1_ps(0x1.8p23f);
    __m512 fn = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(PF_LOG2E), round), round);
    __m512 r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(PF_LN2_HI), xc);
    r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(PF_LN2_LO), r);
    const __m512 r2 = _mm512_mul_ps(r, r);
    const __m512 a = _mm512_fmadd_ps(_mm512_set1_ps(PF_EXP_P4), r, _mm512_set1_ps(PF_EXP_P5));
    const __m512 b = _mm512_fmadd_ps(_mm512_set1_ps(PF_EXP_P2), r, _mm512_set1_ps(PF_EXP_P3));
    const __m512 c = _mm512_fmadd_ps(_mm512_set1_ps(PF_EXP_P0), r, _mm512_set1_ps(PF_EXP_P1));
    __m512 p = _mm512_fmadd_ps(c, r2, b);
    p = _mm512_fmadd_ps(p, r2, a);
    p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    /* p 2^n in one instruction, exact down to the subnormals (rounded once there) */
    return _mm512_scalef_ps(p, fn);
}

static inline __mmask16 tail_mask(size_t left) {
    return (__mmask16)((1u << left) - 1u);
}

static void exp_avx512(float *y, const float *x, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, exp16(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, k, exp16(_mm512_maskz_loadu_ps(k, x + i)));
    }
}

static void exp_sub_avx512(float *y, const float *x, float c, size_t n) {
    const __m512 vc = _mm512_set1_ps(c);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vc)));
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vc)));
    }
}

static inline __m512d sum16_pd(__m512d acc, __m512 v) {
    acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return _mm512_add_pd(acc, _mm512_cvtps_pd(hi));
}

static double exp_sub_sum_avx512(float *y, const float *x, float c, size_t n) {
    __m512 vc = _mm512_set1_ps(c);
    __m512d acc = _mm512_setzero_pd();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vc));
        _mm512_storeu_ps(y + i, e);
        acc = sum16_pd(acc, e);
    }
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        __m512 xv = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + i);
        __m512 e = exp16(_mm512_sub_ps(xv, vc));
        _mm512_mask_storeu_ps(y + i, k, e);
        acc = sum16_pd(acc, e);
    }
    return _mm512_reduce_add_pd(acc);
}

static float max_avx512(const float *x, size_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        m = _mm512_max_ps(m, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + i));
    }
    return _mm512_reduce_max_ps(m);
}

/* sin and cos of 16 floats; see simd.h for the method. Returns the lanes with |x| >
 * PF_SINCOS_MAX, Inf or NaN, whose results are garbage. */
static inline __mmask16 sincos16(__m512 x, __m512 *s, __m512 *c) {
    const __m512i sign = _mm512_castps_si512(_mm512_set1_ps(-0.0f));
    __m512 a = _mm512_abs_ps(x);
    __m512 fj = _mm512_roundscale_ps(_mm512_mul_ps(a, _mm512_set1_ps(PF_2_PI)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(fj, _mm512_set1_ps(PF_PIO2_F1), a); /* exact */
    r = _mm512_fnmadd_ps(fj, _mm512_set1_ps(PF_PIO2_F2), r);
    r = _mm512_fnmadd_ps(fj, _mm512_set1_ps(PF_PIO2_F3), r);
    __m512 z = _mm512_mul_ps(r, r);
    __m512 ps = _mm512_set1_ps(PF_SIN_P0);
    ps = _mm512_fmadd_ps(ps, z, _mm512_set1_ps(PF_SIN_P1));
    ps = _mm512_fmadd_ps(ps, z, _mm512_set1_ps(PF_SIN_P2));
    ps = _mm512_fmadd_ps(ps, _mm512_mul_ps(z, r), r);
    __m512 pc = _mm512_set1_ps(PF_COS_P0);
    pc = _mm512_fmadd_ps(pc, z, _mm512_set1_ps(PF_COS_P1));
    pc = _mm512_fmadd_ps(pc, z, _mm512_set1_ps(PF_COS_P2));
    pc = _mm512_fmadd_ps(pc, _mm512_mul_ps(z, z), _mm512_mul_ps(z, _mm512_set1_ps(-0.5f)));
    pc = _mm512_add_ps(pc, _mm512_set1_ps(1.0f));
    /* quadrant j mod 4: odd swaps sin and cos; sin changes sign for bit 1 of j (and with x),
     * cos for bit 1 of j + 1 */
    __m512i j = _mm512_cvtps_epi32(fj), one = _mm512_set1_epi32(1);
    __mmask16 odd = _mm512_test_epi32_mask(j, one);
    __m512i sv = _mm512_castps_si512(_mm512_mask_blend_ps(odd, ps, pc));
    __m512i cv = _mm512_castps_si512(_mm512_mask_blend_ps(odd, pc, ps));
    __m512i ssign = _mm512_xor_si512(_mm512_slli_epi32(j, 30), _mm512_castps_si512(x));
    __m512i csign = _mm512_slli_epi32(_mm512_add_epi32(j, one), 30);
    *s = _mm512_castsi512_ps(_mm512_xor_si512(sv, _mm512_and_si512(ssign, sign)));
    *c = _mm512_castsi512_ps(_mm512_xor_si512(cv, _mm512_and_si512(csign, sign)));
    return _mm512_cmp_ps_mask(a, _mm512_set1_ps(PF_SINCOS_MAX), _CMP_NLE_UQ);
}

static void sincos_avx512(float *s, float *c, const float *x, size_t n) {
    size_t i = 0;
    for (; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 xv = _mm512_maskz_loadu_ps(k, x + i), sv, cv;
        __mmask16 bad = sincos16(xv, &sv, &cv) & k;
        _mm512_mask_storeu_ps(s + i, k, sv);
        _mm512_mask_storeu_ps(c + i, k, cv);
        if (bad) {
            float tx[16]; /* s or c may have overwritten x */
            _mm512_storeu_ps(tx, xv);
            pf_sincos_fixup(s + i, c + i, tx, bad);
        }
    }
}

static void stream_rows_avx512(float *dst, const float *src, size_t lds, size_t n, size_t r) {
    if (((uintptr_t)dst & 63) != 0 || r % 16 != 0) {
        pf_simd_ref.stream_rows(dst, src, lds, n, r);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const float *a = src + i * lds;
        float *b = dst + i * r;
        for (size_t k = 0; k < r; k += 16) _mm512_stream_ps(b + k, _mm512_loadu_ps(a + k));
    }
    _mm_sfence();
}

/* The 16 sums of a 4 x 4 tile of dot products at once: a transposing tree of 15 vector adds
 * instead of 16 reductions. It pairs lanes as _mm512_reduce_add_ps does (i with i + 8, then
 * i + 4, i + 2, i + 1; float addition commutes), so each sum has v_sum's bits, and ends with
 * C(i, j) in lane 4 i + j. Then alpha and beta as finish1 does, lane by lane. */
static inline __attribute__((always_inline)) void sums4x4(__m512 acc[4][4], float alpha, float beta,
                                                          float *C, size_t ldc) {
    __m512 u[8], w[4], z[2];
    /* element e = 4 j + i (column-major), so that the tree leaves row-major lanes */
#pragma GCC unroll 8
    for (int t = 0; t < 8; t++) { /* elements 2t, 2t + 1: lanes i + (i + 8) */
        const __m512 a = acc[(2 * t) % 4][(2 * t) / 4], b = acc[(2 * t + 1) % 4][(2 * t + 1) / 4];
        u[t] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
#pragma GCC unroll 8
    for (int s = 0; s < 4; s++) /* quarter k of w[s]: element 4 s + k, lanes i + (i + 4) */
        w[s] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * s], u[2 * s + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(u[2 * s], u[2 * s + 1], _MM_SHUFFLE(3, 1, 3, 1)));
#pragma GCC unroll 8
    for (int q = 0; q < 2; q++) /* lanes i + (i + 2) */
        z[q] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * q], w[2 * q + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(w[2 * q], w[2 * q + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* lanes i + (i + 1): lane 4 k + j holds element 4 j + k, C(k, j) */
    __m512 f = _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
    if (alpha != 1.0f) f = _mm512_mul_ps(_mm512_set1_ps(alpha), f);
    if (beta != 0.0f) {
        __m512 old = _mm512_castps128_ps512(_mm_loadu_ps(C));
        old = _mm512_insertf32x4(old, _mm_loadu_ps(C + ldc), 1);
        old = _mm512_insertf32x4(old, _mm_loadu_ps(C + 2 * ldc), 2);
        old = _mm512_insertf32x4(old, _mm_loadu_ps(C + 3 * ldc), 3);
        f = _mm512_fmadd_ps(_mm512_set1_ps(beta), old, f);
    }
    _mm_storeu_ps(C, _mm512_castps512_ps128(f));
    _mm_storeu_ps(C + ldc, _mm512_extractf32x4_ps(f, 1));
    _mm_storeu_ps(C + 2 * ldc, _mm512_extractf32x4_ps(f, 2));
    _mm_storeu_ps(C + 3 * ldc, _mm512_extractf32x4_ps(f, 3));
}

/* the small products (gemm_tmpl.h): tiles of 6 rows x 64 columns (24 of the 32 registers
 * accumulate), 4 x 4 dot products */
#define VF __m512
#define VW 16
#define VMASK __mmask16
#define v_mask(n) ((__mmask16)((1u << (n)) - 1u))
#define v_zero() _mm512_setzero_ps()
#define v_set1(x) _mm512_set1_ps(x)
#define v_load(p) _mm512_loadu_ps(p)
#define v_loadm(p, m) _mm512_maskz_loadu_ps((m), (p))
#define v_store(p, v) _mm512_storeu_ps((p), (v))
#define v_storem(p, v, m) _mm512_mask_storeu_ps((p), (m), (v))
#define v_fma(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define v_mul(a, b) _mm512_mul_ps((a), (b))
#define v_sum(v) _mm512_reduce_add_ps(v)
#define v_sums_tile(acc, alpha, beta, C, ldc) sums4x4((acc), (alpha), (beta), (C), (ldc))
#define GEMM_MR 6
#define GEMM_NB 4
#define DOT_MI 4
#define DOT_NJ 4
#define GEMM_NAME gemm_avx512
#include "simd/gemm_tmpl.h"

/* a decoding step's pass over a head's state (decode_tmpl.h): blocks of 4 vectors of columns */
#define v_add(a, b) _mm512_add_ps((a), (b))
#define DEC_NB 4
#define DECODE_NAME decode_avx512
#include "simd/decode_tmpl.h"

const pf_simd_table pf_simd_avx512 = {.name = "avx512",
                                      .exp = exp_avx512,
                                      .exp_sub_sum = exp_sub_sum_avx512,
                                      .max = max_avx512,
                                      .sincos = sincos_avx512,
                                      .stream_rows = stream_rows_avx512,
                                      .gemm = gemm_avx512,
                                      .decode = decode_avx512,
                                      .exp_sub = exp_sub_avx512,
                                      .wt_panel = 0};
#endif
