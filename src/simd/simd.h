/* simd.h: the kernel tables of each instruction set (see pf_simd_table in internal.h).
 *
 * exp in the vector paths: x = n ln2 + r with |r| <= ln2/2 (Cody-Waite split of ln2), exp(r)
 * by a degree-6 polynomial (the Cephes expf coefficients), and 2^n applied in two halves so
 * that results from 2^-149 (subnormal) to FLT_MAX are formed without overflow in between.
 * NaN propagates; x > 88.72 gives +inf and x <= -104 gives 0, as expf does. */
#ifndef PF_SIMD_H
#define PF_SIMD_H

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

extern const pf_simd_table pf_simd_ref;
#if defined(__x86_64__) || defined(__i386__)
extern const pf_simd_table pf_simd_avx2;
extern const pf_simd_table pf_simd_avx512;
#endif

#endif
