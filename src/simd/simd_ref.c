/* simd_ref.c: the portable vector kernels: plain C and libm, the reference for the others. */
#include <math.h>

#include "internal.h"
#include "simd/simd.h"

static void exp_ref(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = expf(x[i]);
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

const pf_simd_table pf_simd_ref = {"ref", exp_ref, exp_sub_sum_ref, max_ref};
