/* simd_avx2.c: the vector kernels for AVX2 + FMA (8 floats a step). Compiled with -mavx2 -mfma
 * and called only when cpuid says the CPU has both. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "simd/simd.h"

/* exp(r) for |r| <= ln2/2: the Cephes polynomial in Estrin's order (simd.h) */
static inline __m256 exp8_poly(__m256 r) {
    const __m256 r2 = _mm256_mul_ps(r, r);
    const __m256 a = _mm256_fmadd_ps(_mm256_set1_ps(PF_EXP_P4), r, _mm256_set1_ps(PF_EXP_P5));
    const __m256 b = _mm256_fmadd_ps(_mm256_set1_ps(PF_EXP_P2), r, _mm256_set1_ps(PF_EXP_P3));
    const __m256 c = _mm256_fmadd_ps(_mm256_set1_ps(PF_EXP_P0), r, _mm256_set1_ps(PF_EXP_P1));
    __m256 p = _mm256_fmadd_ps(c, r2, b);
    p = _mm256_fmadd_ps(p, r2, a);
    return _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
}

/* exp of 8 floats, any x; see simd.h for the method: 2^n in two halves, NaN by a blend. For the
 * vectors that exp8 cannot do by its shorter way. */
static __attribute__((noinline)) __m256 exp8_wide(__m256 x) {
    __m256 nan_mask = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(PF_EXP_LO)),
                              _mm256_set1_ps(PF_EXP_HI + 0.5f));
    const __m256 round = _mm256_set1_ps(0x1.8p23f);
    __m256 fn = _mm256_sub_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(PF_LOG2E), round), round);
    __m256 r = _mm256_fnmadd_ps(fn, _mm256_set1_ps(PF_LN2_HI), xc);
    r = _mm256_fnmadd_ps(fn, _mm256_set1_ps(PF_LN2_LO), r);
    __m256 p = exp8_poly(r);
    __m256i n = _mm256_cvtps_epi32(fn);
    __m256i n1 = _mm256_srai_epi32(n, 1);
    __m256i n2 = _mm256_sub_epi32(n, n1);
    __m256i bias = _mm256_set1_epi32(127);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    return _mm256_blendv_ps(y, x, nan_mask);
}

/* exp of 8 floats; see simd.h for the method. Where every lane has -86.5 <= x <= 88 (what the
 * feature maps give, x <= 0 and far above -86.5) the clamps are idle and p 2^n is normal
 * (-125 <= n <= 127, p in [0.70, 1.42]): then 2^n is an integer add of n into p's exponent,
 * exact as the two multiplies are: the same bits in 16 instructions to exp8_wide's 26 (every
 * float checked against exp8_wide). Any other lane (large, tiny, NaN) sends its vector there. */
static inline __m256 exp8(__m256 x) {
    const __m256 round = _mm256_set1_ps(0x1.8p23f);
    /* 1.5 2^23 + n: n in t's low mantissa bits */
    const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(PF_LOG2E), round);
    const __m256 fn = _mm256_sub_ps(t, round);
    __m256 r = _mm256_fnmadd_ps(fn, _mm256_set1_ps(PF_LN2_HI), x);
    r = _mm256_fnmadd_ps(fn, _mm256_set1_ps(PF_LN2_LO), r);
    const __m256 p = exp8_poly(r);
    const __m256 out = _mm256_or_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-86.5f), _CMP_NGE_UQ),
                                    _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_NLE_UQ));
    if (__builtin_expect(_mm256_movemask_ps(out) != 0, 0)) return exp8_wide(x);
    /* t << 23 is n << 23: the bits of 1.5 2^23 above the low 9 shift out */
    return _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_castps_si256(t), 23)));
}

static void exp_avx2(float *y, const float *x, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float tx[8] = {0}, ty[8];
        for (size_t k = 0; i + k < n; k++) tx[k] = x[i + k];
        _mm256_storeu_ps(ty, exp8(_mm256_loadu_ps(tx)));
        for (size_t k = 0; i + k < n; k++) y[i + k] = ty[k];
    }
}

static void exp_sub_avx2(float *y, const float *x, float c, size_t n) {
    const __m256 vc = _mm256_set1_ps(c);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vc)));
    if (i < n) {
        float tx[8] = {0}, ty[8];
        for (size_t k = 0; i + k < n; k++) tx[k] = x[i + k] - c;
        _mm256_storeu_ps(ty, exp8(_mm256_loadu_ps(tx)));
        for (size_t k = 0; i + k < n; k++) y[i + k] = ty[k];
    }
}

static inline __m256d sum8_pd(__m256d acc, __m256 v) {
    acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    return _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

static double exp_sub_sum_avx2(float *y, const float *x, float c, size_t n) {
    __m256 vc = _mm256_set1_ps(c);
    __m256d acc = _mm256_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vc));
        _mm256_storeu_ps(y + i, e);
        acc = sum8_pd(acc, e);
    }
    double t[4];
    _mm256_storeu_pd(t, acc);
    double s = (t[0] + t[1]) + (t[2] + t[3]);
    if (i < n) {
        float tx[8], ty[8];
        size_t k = 0;
        for (; i + k < n; k++) tx[k] = x[i + k] - c;
        for (; k < 8; k++) tx[k] = -INFINITY;
        _mm256_storeu_ps(ty, exp8(_mm256_loadu_ps(tx)));
        for (k = 0; i + k < n; k++) {
            y[i + k] = ty[k];
            s += ty[k];
        }
    }
    return s;
}

/* Four running maxima, so that a row of 256 is not a chain of 32 dependent vmaxps (4 cycles
 * each): the max of floats is the same whatever the order. */
static float max_avx2(const float *x, size_t n) {
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
        m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + i + 8));
        m2 = _mm256_max_ps(m2, _mm256_loadu_ps(x + i + 16));
        m3 = _mm256_max_ps(m3, _mm256_loadu_ps(x + i + 24));
    }
    for (; i + 8 <= n; i += 8) m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
    __m256 m = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
    float t[8];
    _mm256_storeu_ps(t, m);
    float r = t[0];
    for (int k = 1; k < 8; k++) r = t[k] > r ? t[k] : r;
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

/* sin and cos of 8 floats; see simd.h for the method. Returns the lanes (bit k for lane k) with
 * |x| > PF_SINCOS_MAX, Inf or NaN, whose results are garbage. */
static inline unsigned sincos8(__m256 x, __m256 *s, __m256 *c) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 a = _mm256_andnot_ps(sign, x);
    __m256 fj = _mm256_round_ps(_mm256_mul_ps(a, _mm256_set1_ps(PF_2_PI)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fj, _mm256_set1_ps(PF_PIO2_F1), a); /* exact */
    r = _mm256_fnmadd_ps(fj, _mm256_set1_ps(PF_PIO2_F2), r);
    r = _mm256_fnmadd_ps(fj, _mm256_set1_ps(PF_PIO2_F3), r);
    __m256 z = _mm256_mul_ps(r, r);
    __m256 ps = _mm256_set1_ps(PF_SIN_P0);
    ps = _mm256_fmadd_ps(ps, z, _mm256_set1_ps(PF_SIN_P1));
    ps = _mm256_fmadd_ps(ps, z, _mm256_set1_ps(PF_SIN_P2));
    ps = _mm256_fmadd_ps(ps, _mm256_mul_ps(z, r), r);
    __m256 pc = _mm256_set1_ps(PF_COS_P0);
    pc = _mm256_fmadd_ps(pc, z, _mm256_set1_ps(PF_COS_P1));
    pc = _mm256_fmadd_ps(pc, z, _mm256_set1_ps(PF_COS_P2));
    pc = _mm256_fmadd_ps(pc, _mm256_mul_ps(z, z), _mm256_mul_ps(z, _mm256_set1_ps(-0.5f)));
    pc = _mm256_add_ps(pc, _mm256_set1_ps(1.0f));
    /* quadrant j mod 4: odd swaps sin and cos; sin changes sign for bit 1 of j (and with x),
     * cos for bit 1 of j + 1 */
    __m256i j = _mm256_cvtps_epi32(fj), one = _mm256_set1_epi32(1);
    __m256 odd = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(j, one), one));
    __m256 sv = _mm256_blendv_ps(ps, pc, odd), cv = _mm256_blendv_ps(pc, ps, odd);
    __m256 ssign = _mm256_and_ps(_mm256_castsi256_ps(_mm256_slli_epi32(j, 30)), sign);
    __m256 csign = _mm256_and_ps(
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(j, one), 30)), sign);
    *s = _mm256_xor_ps(sv, _mm256_xor_ps(ssign, _mm256_and_ps(x, sign)));
    *c = _mm256_xor_ps(cv, csign);
    __m256 bad = _mm256_cmp_ps(a, _mm256_set1_ps(PF_SINCOS_MAX), _CMP_NLE_UQ);
    return (unsigned)_mm256_movemask_ps(bad);
}

static void sincos_avx2(float *s, float *c, const float *x, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i), sv, cv;
        unsigned bad = sincos8(xv, &sv, &cv);
        _mm256_storeu_ps(s + i, sv);
        _mm256_storeu_ps(c + i, cv);
        if (bad) {
            float tx[8]; /* s or c may have overwritten x */
            _mm256_storeu_ps(tx, xv);
            pf_sincos_fixup(s + i, c + i, tx, bad);
        }
    }
    if (i < n) {
        float tx[8] = {0}, ts[8], tc[8];
        __m256 sv, cv;
        for (size_t k = 0; i + k < n; k++) tx[k] = x[i + k];
        unsigned bad = sincos8(_mm256_loadu_ps(tx), &sv, &cv);
        _mm256_storeu_ps(ts, sv);
        _mm256_storeu_ps(tc, cv);
        pf_sincos_fixup(ts, tc, tx, bad);
        for (size_t k = 0; i + k < n; k++) {
            s[i + k] = ts[k];
            c[i + k] = tc[k];
        }
    }
}

static void stream_rows_avx2(float *dst, const float *src, size_t lds, size_t n, size_t r) {
    if (((uintptr_t)dst & 31) != 0 || r % 8 != 0) {
        pf_simd_ref.stream_rows(dst, src, lds, n, r);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const float *a = src + i * lds;
        float *b = dst + i * r;
        for (size_t k = 0; k < r; k += 8) _mm256_stream_ps(b + k, _mm256_loadu_ps(a + k));
    }
    _mm_sfence();
}

/* the small products (gemm_tmpl.h): tiles of 6 rows x 16 columns (12 of the 16 registers
 * accumulate), 3 x 3 dot products */
static inline __m256i mask8(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define VF __m256
#define VW 8
#define VMASK __m256i
#define v_mask(n) mask8(n)
#define v_zero() _mm256_setzero_ps()
#define v_set1(x) _mm256_set1_ps(x)
#define v_load(p) _mm256_loadu_ps(p)
#define v_loadm(p, m) _mm256_maskload_ps((p), (m))
#define v_store(p, v) _mm256_storeu_ps((p), (v))
#define v_storem(p, v, m) _mm256_maskstore_ps((p), (m), (v))
#define v_fma(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define v_mul(a, b) _mm256_mul_ps((a), (b))
#define v_sum(v) sum8(v)
#define GEMM_MR 6
#define GEMM_NB 2
#define DOT_MI 3
#define DOT_NJ 3
#define GEMM_NAME gemm_avx2
#include "simd/gemm_tmpl.h"

/* a decoding step's pass over a head's state (decode_tmpl.h): blocks of 8 vectors of columns, so
 * that dv = 64 is one pass over the state (80 KiB a head at m = 256, from L2: its traffic sets
 * the pass's speed), with the pending w' read from L1 in every row so that the 8 accumulators
 * fit the 16 registers: 1.15-1.3x the speed of two passes of 4 */
#define v_add(a, b) _mm256_add_ps((a), (b))
#define DEC_NB 8
#define DEC_WMEM 1
#define DECODE_NAME decode_avx2
#include "simd/decode_tmpl.h"

/* W^T in panels of two register tiles' columns (pf_fmap_bind): whole, d x m with rows 1 KiB
 * apart at m = 256, a tile's 64 lines of B fall in 4 of L1's 64 sets and come from L2 for every
 * row group; an 8 KiB panel, its rows contiguous, stays in L1 while the block's row groups go
 * by. On a Zen 4: the projection (256 x 256 x 64, X from memory) 108-109 GFLOP/s whole,
 * 110-112 in panels of 32 columns; the bidirectional forward (L = 4096, 8 heads) 1.6-1.8%
 * faster on one thread, 1.4-2.9% on two, panels of 16 between. The same bits: each element
 * of U keeps its sequence of operations. (AVX-512's 6 x 64 tiles gained nothing from
 * panels: 0 there.) */
#ifndef WT_PANEL
#define WT_PANEL 32
#endif

const pf_simd_table pf_simd_avx2 = {.name = "avx2",
                                    .exp = exp_avx2,
                                    .exp_sub_sum = exp_sub_sum_avx2,
                                    .max = max_avx2,
                                    .sincos = sincos_avx2,
                                    .stream_rows = stream_rows_avx2,
                                    .gemm = gemm_avx2,
                                    .decode = decode_avx2,
                                    .exp_sub = exp_sub_avx2,
                                    .wt_panel = WT_PANEL};
#endif
