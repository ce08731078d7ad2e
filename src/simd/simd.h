/* simd.h: the kernel tables of each instruction set (see pf_simd_table in internal.h).
 *
 * Which kernels are templates and which are written per instruction set, and why: a kernel whose
 * arithmetic is the same sequence of vector operations at any width -- the register-tile products
 * (gemm_tmpl.h) and the decoding pass (decode_tmpl.h) -- is written once over a few macros
 * (VF, VW, v_fma, masked loads) that simd_avx2.c, simd_avx512.c and simd_neon.c define, so both paths give
 * the bits the template's order gives and a fix lands in both. A kernel whose best form differs
 * by instruction set -- exp (2^n by an integer add or in two halves on AVX2, by vscalefps on
 * AVX-512), sincos, the row maxima -- is written out in each file against the shared constants
 * below, and the tests hold every path to the same bits (exp) or bounds (sincos).
 *
 * exp in the vector paths: x = n ln2 + r with |r| <= ln2/2 (Cody-Waite split of ln2), exp(r)
 * by a degree-6 polynomial (the Cephes expf coefficients), and 2^n applied so that results from
 * 2^-149 (subnormal) to FLT_MAX are formed without overflow in between and rounded once: in two
 * halves (AVX2, NEON), by vscalefps (AVX-512, the same bits). n is x log2e rounded to the nearest
 * integer (ties to even) in one FMA, x log2e + 1.5 2^23 (exact to the integer while
 * |x log2e| < 2^22), less 1.5 2^23: one rounding where a multiply and a round take two, and
 * 3 cycles less on the path from x to the result. The polynomial 1 + r + r^2 q(r), q of degree 4,
 * is evaluated in Estrin's order, q = (P5 + P4 r) + r^2 ((P3 + P2 r) + r^2 (P1 + P0 r)): the same
 * count of FMAs as Horner's, 3 on the longest path to its 5 (the exp is bound by the
 * instructions in flight, not by its FMA count; 10% faster on AVX2 alone in L1, no ulp lost).
 * AVX2 takes a shorter way for vectors whose every x is in [-86.5, 88], where p 2^n is normal:
 * 2^n as an integer add into the exponent, the same bits (checked over every float).
 * NaN propagates; x > 88.72 gives +inf and x <= -104 gives 0, as expf does.
 *
 * sincos (s = sin x, c = cos x; s or c may be x itself, not a partial overlap; s and c must not
 * overlap): on a = |x| (sin is odd: its sign is x's, so sin(-0) = -0), j = round(a 2/pi) and
 * r = a - j pi/2 by a 3-part Cody-Waite split of pi/2; sin r and cos r by the Cephes sinf/cosf
 * polynomials (on |r| <= pi/4 + 1.2e-3: relative error 8.4e-9 for sin, 1.7e-10 for cos); the
 * quadrant j mod 4 swaps them and sets the signs. Lanes with |x| > PF_SINCOS_MAX, Inf or NaN are
 * redone by libm sinf/cosf (NaN for Inf and NaN, as libm). Why 8192: there j <= 5216 < 2^13, and
 *   - with FMA (the AVX2 and AVX-512 paths) pi/2 = F1 + F2 + F3 + 1.1e-23, floats of 24 bits:
 *     a - j F1 is exact (a multiple of 2^-23, or of 2^-24 when a < 1, and below 1 in size),
 *     the next two steps round once each (2^-24 relative to r), and j 1.1e-23 < 6e-20 is left:
 *     r is accurate relative to itself even next to a multiple of pi/2;
 *   - without FMA (the portable path) the Cephes split of 8 + 11 + 24 bits keeps j C1 and j C2
 *     exact (j < 2^13) and a - j C1 exact (Sterbenz); besides the roundings of r, the leftover
 *     j 1.7e-15 <= 9e-12 and the rounding of j C3 (<= 1.5e-11) are absolute errors < 3e-11;
 *   - a 2/pi is off by at most 2.4e-4 (rounding) + 2.1e-4 (the float 2/pi), and the portable
 *     path's + 0.5 rounds by 2.4e-4 more, so |r| <= pi/4 + 1.2e-3.
 * So each result is within 2^-23 (2 ulp of 1) of the exact value, and for |x| <= pi/4 (r = x)
 * within 2 ulp of itself; with FMA within 2 ulp of itself everywhere. tests/test_simd.c measures
 * 1.3 x 2^-24, 1.0 ulp and 1.5 ulp. */
#ifndef PF_SIMD_H
#define PF_SIMD_H

#include <math.h>

#include "internal.h"

#define PF_EXP_HI 88.7228394f          /* above: +inf */
#define PF_EXP_LO (-104.0f)            /* below: 0 (exp(-104) rounds to 0) */
#define PF_LOG2E 1.44269504088896341f
#define PF_LN2_HI 0.693359375f
#define PF_LN2_LO (-2.12194440e-4f)
#define PF_EXP_P0 1.9875691500e-4f
#define PF_EXP_P1 1.3981999507e-3f
#define PF_EXP_P2 8.3334519073e-3f
#define PF_EXP_P3 4.1665795894e-2f
#define PF_EXP_P4 1.6666665459e-1f
#define PF_EXP_P5 5.0000001201e-1f

#define PF_SINCOS_MAX 8192.0f          /* |x| above: libm sinf/cosf */
#define PF_SINCOS_MAX_BITS 0x46000000u /* its bits */
#define PF_2_PI 6.36619747e-1f         /* 2/pi */
#define PF_PIO2_F1 0x1.921fb6p+0f      /* pi/2 = F1 + F2 + F3 (FMA paths) */
#define PF_PIO2_F2 (-0x1.777a5cp-25f)
#define PF_PIO2_F3 (-0x1.ee59dap-50f)
#define PF_PIO2_C1 1.5703125f          /* pi/2 = C1 + C2 + C3 (8, 11 and 24 bits) */
#define PF_PIO2_C2 4.837512969970703125e-4f
#define PF_PIO2_C3 0x1.4442d2p-24f
#define PF_SIN_P0 (-1.9515295891e-4f)  /* sin r = r + r^3 (P2 + P1 r^2 + P0 r^4) */
#define PF_SIN_P1 8.3321608736e-3f
#define PF_SIN_P2 (-1.6666654611e-1f)
#define PF_COS_P0 2.443315711809948e-5f /* cos r = 1 - r^2/2 + r^4 (P2 + P1 r^2 + P0 r^4) */
#define PF_COS_P1 (-1.388731625493765e-3f)
#define PF_COS_P2 4.166664568298827e-2f

/* The lanes of a block of sincos that need libm: bit k of bad set for x[k] (k < 16). x is a copy
 * of the block's input (the outputs may have overwritten it). */
static inline void pf_sincos_fixup(float *s, float *c, const float *x, unsigned bad) {
    for (int k = 0; bad; k++, bad >>= 1) {
        if (bad & 1u) {
            const float xk = x[k];
            s[k] = sinf(xk);
            c[k] = cosf(xk);
        }
    }
}

extern const pf_simd_table pf_simd_ref;
#if defined(__x86_64__) || defined(__i386__)
extern const pf_simd_table pf_simd_avx2;
extern const pf_simd_table pf_simd_avx512;
#endif
#if defined(__aarch64__)
extern const pf_simd_table pf_simd_neon; /* simd_neon.c: every aarch64 CPU runs it */
#endif

#endif
