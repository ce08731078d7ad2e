/* bench.h: what the benchmark programs share: a clock, medians, allocation that exits on
 * failure, and normal test data from the library's generator. */
#ifndef PF_BENCH_H
#define PF_BENCH_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "performer.h"

/* Seconds on a monotonic clock. */
static inline double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of t (n >= 1), which it sorts. */
static inline double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static inline void *xmalloc(size_t bytes) {
    void *p = malloc(bytes);
    if (!p) {
        fprintf(stderr, "bench: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

/* x (n) = sigma * N(0, 1) draws of stream 0 of `seed`. */
static inline void fill(float *x, size_t n, uint64_t seed, float sigma) {
    pf_rng rng;
    pf_rng_init(&rng, seed, 0);
    pf_rng_fill_normal(&rng, x, n);
    if (sigma != 1.0f)
        for (size_t i = 0; i < n; i++) x[i] *= sigma;
}

#endif
