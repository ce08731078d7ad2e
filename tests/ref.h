/* ref.h: what several tests share: float64 references written from the feature maps' formulas,
 * independent of the library's code, and fixtures. */
#ifndef PF_TEST_REF_H
#define PF_TEST_REF_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "performer.h"

/* The unstabilised features phi (r) of one row x (d) in float64, from pf_kernel's formulas
 * (include/performer.h), with x' = x sqrt(scale), u = W x', h = |x'|^2 / 2:
 *   positive    exp(u - h) / sqrt(m)
 *   hyperbolic  [exp(u - h), exp(-u - h)] / sqrt(2m)
 *   trig        exp(h) [sin u, cos u] / sqrt(m)
 *   relu        relu(u) / sqrt(m)
 *   elu         elu(u) + 1 = u + 1 (u > 0), exp(u) (u <= 0)
 * then eps added: times max|phi| for the softmax maps, as is for relu and elu. OPRF and SDERF, whose
 * parameters come from the data, are test_favor_fit.c's: NaN here. */
static inline void ref_phi_f64(double *phi, const double *x, int d, const float *W, int m,
                               pf_kernel kernel, double scale, double eps) {
    double h = 0;
    for (int k = 0; k < d; k++) h += x[k] * x[k] * scale / 2;
    for (int f = 0; f < m; f++) {
        double u = 0;
        for (int k = 0; k < d; k++) u += (double)W[(size_t)f * d + k] * x[k] * sqrt(scale);
        switch (kernel) {
        case PF_KERNEL_POSITIVE:
            phi[f] = exp(u - h) / sqrt(m);
            break;
        case PF_KERNEL_HYPERBOLIC:
            phi[f] = exp(u - h) / sqrt(2.0 * m);
            phi[m + f] = exp(-u - h) / sqrt(2.0 * m);
            break;
        case PF_KERNEL_TRIG:
            phi[f] = exp(h) * sin(u) / sqrt(m);
            phi[m + f] = exp(h) * cos(u) / sqrt(m);
            break;
        case PF_KERNEL_RELU:
            phi[f] = (u > 0 ? u : 0) / sqrt(m);
            break;
        case PF_KERNEL_ELU:
            phi[f] = u > 0 ? u + 1 : exp(u);
            break;
        case PF_KERNEL_OPRF:
        case PF_KERNEL_SDERF:
            phi[f] = NAN;
            break;
        }
    }
    const int r = pf_kernel_width(kernel, m);
    double amax = 0;
    for (int f = 0; f < r; f++) amax = fmax(amax, fabs(phi[f]));
    const int absolute = kernel == PF_KERNEL_RELU || kernel == PF_KERNEL_ELU;
    for (int f = 0; f < r; f++) phi[f] += absolute ? eps : eps * amax;
}

/* ref_phi_f64 of a float row (d <= 1024). */
static inline void ref_phi_f32(double *phi, const float *x, int d, const float *W, int m,
                               pf_kernel kernel, double scale, double eps) {
    double xd[1024];
    if (d > 1024) {
        fprintf(stderr, "ref_phi_f32: d = %d > 1024\n", d);
        exit(1);
    }
    for (int k = 0; k < d; k++) xd[k] = x[k];
    ref_phi_f64(phi, xd, d, W, m, kernel, scale, eps);
}

/* Row i of X (rows x d) rescaled to the norm lo + (hi - lo) (i mod 17) / 16: inputs whose norms
 * spread over [lo, hi]. */
static inline void set_row_norms(float *X, size_t rows, int d, double lo, double hi) {
    for (size_t i = 0; i < rows; i++) {
        double s = 0, norm = lo + (hi - lo) * (double)(i % 17) / 16.0;
        for (int k = 0; k < d; k++) s += (double)X[i * d + k] * X[i * d + k];
        for (int k = 0; k < d; k++) X[i * d + k] = (float)(X[i * d + k] * norm / sqrt(s));
    }
}

#endif
