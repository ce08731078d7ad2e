/* simd_neon.c: the vector kernels for AArch64 Advanced SIMD (NEON, 4 floats a step, with FMA).
 * Every aarch64 CPU has it, so it needs no flag and no run-time check; the Makefile compiles this
 * file for aarch64 only. exp, the row maximum, the register-tile products (gemm_tmpl.h) and the
 * decoding pass (decode_tmpl.h) are NEON's; sincos and the row copy are the portable ones
 * (simd_ref.c; its sincos is held to the portable bounds of simd.h). */
#if defined(__aarch64__)
#include <arm_neon.h>
#include <math.h>
#include <stdint.h>

#include "simd/simd.h"

/* exp of 4 floats; see simd.h for the method: the operations of exp8 in simd_avx2.c one for one
 * (fused multiply-adds, round to nearest even, 2^n in two halves), so the same bits. */
static inline float32x4_t exp4(float32x4_t x) {
    uint32x4_t num = vceqq_f32(x, x); /* lanes that are not NaN */
    float32x4_t xc = vminq_f32(vmaxq_f32(x, vdupq_n_f32(PF_EXP_LO)), vdupq_n_f32(PF_EXP_HI + 0.5f));
    const float32x4_t round = vdupq_n_f32(0x1.8p23f);
    float32x4_t fn = vsubq_f32(vfmaq_f32(round, xc, vdupq_n_f32(PF_LOG2E)), round);
    float32x4_t r = vfmsq_f32(xc, fn, vdupq_n_f32(PF_LN2_HI));
    r = vfmsq_f32(r, fn, vdupq_n_f32(PF_LN2_LO));
    const float32x4_t r2 = vmulq_f32(r, r);
    const float32x4_t a = vfmaq_f32(vdupq_n_f32(PF_EXP_P5), vdupq_n_f32(PF_EXP_P4), r);
    const float32x4_t b = vfmaq_f32(vdupq_n_f32(PF_EXP_P3), vdupq_n_f32(PF_EXP_P2), r);
    const float32x4_t c = vfmaq_f32(vdupq_n_f32(PF_EXP_P1), vdupq_n_f32(PF_EXP_P0), r);
    float32x4_t p = vfmaq_f32(b, c, r2);
    p = vfmaq_f32(a, p, r2);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, r2);
    int32x4_t n = vcvtnq_s32_f32(fn);
    int32x4_t n1 = vshrq_n_s32(n, 1);
    int32x4_t n2 = vsubq_s32(n, n1);
    int32x4_t bias = vdupq_n_s32(127);
    float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, bias), 23));
    float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, bias), 23));
    float32x4_t y = vmulq_f32(vmulq_f32(p, s1), s2);
    return vbslq_f32(num, y, x);
}

static void exp_neon(float *y, const float *x, size_t n) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, exp4(vld1q_f32(x + i)));
    if (i < n) {
        float tx[4] = {0}, ty[4];
        for (size_t k = 0; i + k < n; k++) tx[k] = x[i + k];
        vst1q_f32(ty, exp4(vld1q_f32(tx)));
        for (size_t k = 0; i + k < n; k++) y[i + k] = ty[k];
    }
}

static void exp_sub_neon(float *y, const float *x, float c, size_t n) {
    const float32x4_t vc = vdupq_n_f32(c);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, exp4(vsubq_f32(vld1q_f32(x + i), vc)));
    if (i < n) {
        float tx[4] = {0}, ty[4];
        for (size_t k = 0; i + k < n; k++) tx[k] = x[i + k] - c;
        vst1q_f32(ty, exp4(vld1q_f32(tx)));
        for (size_t k = 0; i + k < n; k++) y[i + k] = ty[k];
    }
}

/* The sum in double, lanes 0 and 1 and lanes 2 and 3 in two accumulators, added at the end. */
static double exp_sub_sum_neon(float *y, const float *x, float c, size_t n) {
    const float32x4_t vc = vdupq_n_f32(c);
    float64x2_t lo = vdupq_n_f64(0), hi = vdupq_n_f64(0);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + i), vc));
        vst1q_f32(y + i, e);
        lo = vaddq_f64(lo, vcvt_f64_f32(vget_low_f32(e)));
        hi = vaddq_f64(hi, vcvt_high_f64_f32(e));
    }
    double s = (vgetq_lane_f64(lo, 0) + vgetq_lane_f64(lo, 1)) +
               (vgetq_lane_f64(hi, 0) + vgetq_lane_f64(hi, 1));
    if (i < n) {
        float tx[4], ty[4];
        size_t k = 0;
        for (; i + k < n; k++) tx[k] = x[i + k] - c;
        for (; k < 4; k++) tx[k] = -INFINITY;
        vst1q_f32(ty, exp4(vld1q_f32(tx)));
        for (k = 0; i + k < n; k++) {
            y[i + k] = ty[k];
            s += ty[k];
        }
    }
    return s;
}

/* the small products (gemm_tmpl.h): tiles of 6 rows x 12 columns (18 of the 32 registers
 * accumulate), 3 x 3 dot products. A mask is the number of lanes in use; masked loads and stores
 * go through a small buffer, touching only those lanes. */
static inline float32x4_t loadm4(const float *p, int m) {
    float t[4] = {0, 0, 0, 0};
    for (int k = 0; k < m; k++) t[k] = p[k];
    return vld1q_f32(t);
}

static inline void storem4(float *p, float32x4_t v, int m) {
    float t[4];
    vst1q_f32(t, v);
    for (int k = 0; k < m; k++) p[k] = t[k];
}

/* (l0 + l1) + (l2 + l3), a fixed order */
static inline float sum4(float32x4_t v) {
    return (vgetq_lane_f32(v, 0) + vgetq_lane_f32(v, 1)) +
           (vgetq_lane_f32(v, 2) + vgetq_lane_f32(v, 3));
}

#define VF float32x4_t
#define VW 4
#define VMASK int
#define v_mask(n) (n)
#define v_zero() vdupq_n_f32(0.0f)
#define v_set1(x) vdupq_n_f32(x)
#define v_load(p) vld1q_f32(p)
#define v_loadm(p, m) loadm4((p), (m))
#define v_store(p, v) vst1q_f32((p), (v))
#define v_storem(p, v, m) storem4((p), (v), (m))
#define v_fma(a, b, c) vfmaq_f32((c), (a), (b))
#define v_mul(a, b) vmulq_f32((a), (b))
#define v_sum(v) sum4(v)
#define GEMM_MR 6
#define GEMM_NB 3
#define DOT_MI 3
#define DOT_NJ 3
#define GEMM_NAME gemm_neon
#include "simd/gemm_tmpl.h"

/* a decoding step's pass over a head's state (decode_tmpl.h): blocks of 4 vectors of columns */
#define v_add(a, b) vaddq_f32((a), (b))
#define DEC_NB 4
#define DECODE_NAME decode_neon
#include "simd/decode_tmpl.h"

static void sincos_neon(float *s, float *c, const float *x, size_t n) {
    pf_simd_ref.sincos(s, c, x, n);
}

/* max_ref's result: FMAXNM, like max_ref's comparison, passes over a NaN (the callers check
 * their rows for NaN themselves); four accumulators so that the loop is not one dependency
 * chain. */
static float max_neon(const float *x, size_t n) {
    float32x4_t m0 = vdupq_n_f32(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        m0 = vmaxnmq_f32(m0, vld1q_f32(x + i));
        m1 = vmaxnmq_f32(m1, vld1q_f32(x + i + 4));
        m2 = vmaxnmq_f32(m2, vld1q_f32(x + i + 8));
        m3 = vmaxnmq_f32(m3, vld1q_f32(x + i + 12));
    }
    for (; i + 4 <= n; i += 4) m0 = vmaxnmq_f32(m0, vld1q_f32(x + i));
    float r = vmaxnmvq_f32(vmaxnmq_f32(vmaxnmq_f32(m0, m1), vmaxnmq_f32(m2, m3)));
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

static void stream_rows_neon(float *dst, const float *src, size_t lds, size_t n, size_t r) {
    pf_simd_ref.stream_rows(dst, src, lds, n, r);
}

const pf_simd_table pf_simd_neon = {.name = "neon",
                                    .exp = exp_neon,
                                    .exp_sub_sum = exp_sub_sum_neon,
                                    .max = max_neon,
                                    .sincos = sincos_neon,
                                    .stream_rows = stream_rows_neon,
                                    .gemm = gemm_neon,
                                    .decode = decode_neon,
                                    .exp_sub = exp_sub_neon,
                                    .wt_panel = 0};
#endif
