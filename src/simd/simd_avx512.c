/* simd_avx512.c: the vector kernels for AVX-512F (16 floats a step, masked tails). Compiled with
 * -mavx512f and called only when cpuid (and the OS, through XCR0) says it can run. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>

#include "simd/simd.h"

/* exp of 16 floats; see simd.h for the method. */
static inline __m512 exp16(__m512 x) {
    __mmask16 nan_mask = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(PF_EXP_LO)),
                              _mm512_set1_ps(PF_EXP_HI + 0.5f));
    __m512 fn = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(PF_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(PF_LN2_HI), xc);
    r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(PF_LN2_LO), r);
    __m512 p = _mm512_set1_ps(PF_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PF_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PF_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PF_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PF_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PF_EXP_P5));
    __m512 r2 = _mm512_mul_ps(r, r);
    p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i n = _mm512_cvtps_epi32(fn);
    __m512i n1 = _mm512_srai_epi32(n, 1);
    __m512i n2 = _mm512_sub_epi32(n, n1);
    __m512i bias = _mm512_set1_epi32(127);
    __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23));
    __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, bias), 23));
    __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
    return _mm512_mask_blend_ps(nan_mask, y, x);
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

const pf_simd_table pf_simd_avx512 = {"avx512", exp_avx512, exp_sub_sum_avx512, max_avx512};
#endif
