/* check.h: the tests' tiny assertion kit.
 *
 * CHECK(cond, fmt, ...)       fails (prints file:line and the message) unless cond holds.
 * CHECK_CLOSE(got, ref, atol, rtol)  |got - ref| <= atol + rtol * |ref|, printing all four.
 * CHECK_STATUS(expr, want)    a pf_status call returns `want`.
 * TEST_MAIN_END()             prints "N checks, M failed" and returns non-zero on any failure.
 *
 * A failed check does not stop the test: every failure is listed, then the program fails. */
#ifndef PF_TEST_CHECK_H
#define PF_TEST_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "performer.h"

static int check_count_ = 0;
static int check_failed_ = 0;

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        check_count_++;                                                                        \
        if (!(cond)) {                                                                         \
            check_failed_++;                                                                   \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                    \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, "\n");                                                             \
        }                                                                                      \
    } while (0)

#define CHECK_CLOSE(got, ref, atol, rtol)                                                      \
    do {                                                                                       \
        double g_ = (double)(got), r_ = (double)(ref);                                         \
        double tol_ = (double)(atol) + (double)(rtol) * fabs(r_);                              \
        check_count_++;                                                                        \
        if (!(fabs(g_ - r_) <= tol_)) {                                                        \
            check_failed_++;                                                                   \
            fprintf(stderr, "FAIL %s:%d: %s: got %.9g, expected %.9g, |diff| %.3g > tol %.3g\n", \
                    __FILE__, __LINE__, #got, g_, r_, fabs(g_ - r_), tol_);                    \
        }                                                                                      \
    } while (0)

#define CHECK_STATUS(expr, want)                                                               \
    do {                                                                                       \
        pf_status s_ = (expr);                                                                 \
        check_count_++;                                                                        \
        if (s_ != (want)) {                                                                    \
            check_failed_++;                                                                   \
            fprintf(stderr, "FAIL %s:%d: %s: got status %d (%s), expected %d (%s)\n", __FILE__, \
                    __LINE__, #expr, (int)s_, pf_status_str(s_), (int)(want),                  \
                    pf_status_str(want));                                                      \
        }                                                                                      \
    } while (0)

#define TEST_MAIN_END()                                                                        \
    do {                                                                                       \
        printf("%s: %d checks, %d failed\n", __FILE__, check_count_, check_failed_);           \
        return check_failed_ ? 1 : 0;                                                          \
    } while (0)

/* Relative error of got against a float64 reference: ||got - ref|| / ||ref|| (2-norms). */
static inline double rel_err_f64(const float *got, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)got[i] - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Relative error of got against a float32 reference. */
static inline double rel_err(const float *got, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)got[i] - (double)ref[i];
        num += e * e;
        den += (double)ref[i] * (double)ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Fills x[0..n) with N(0, sigma^2) from (seed, stream), so every test input is reproducible. */
static inline void fill_normal(float *x, size_t n, float sigma, uint64_t seed, uint64_t stream) {
    pf_rng rng;
    pf_rng_init(&rng, seed, stream);
    for (size_t i = 0; i < n; i++) x[i] = sigma * (float)pf_rng_normal(&rng);
}

static inline void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

#endif
