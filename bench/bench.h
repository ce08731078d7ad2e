/* bench.h: what the benchmark programs share: a clock, medians, allocation that exits on
 * failure, and normal test data from the library's generator. */
#ifndef PF_BENCH_H
#define PF_BENCH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* The CPU, as /proc/cpuinfo names its first one ("AMD EPYC (family 26, model 2)"), into buf;
 * "unknown CPU" elsewhere. */
static inline const char *cpu_name(char *buf, size_t size) {
    char line[256], name[128] = "", family[16] = "", model[16] = "";
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f) && line[0] != '\n') {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        char *v = colon + 1 + (colon[1] == ' ');
        v[strcspn(v, "\n")] = '\0';
        if (strncmp(line, "model name", 10) == 0) snprintf(name, sizeof name, "%s", v);
        else if (strncmp(line, "cpu family", 10) == 0) snprintf(family, sizeof family, "%s", v);
        else if (strncmp(line, "model\t", 6) == 0) snprintf(model, sizeof model, "%s", v);
    }
    if (f) fclose(f);
    if (!name[0])
        snprintf(buf, size, "unknown CPU");
    else if (family[0] && model[0])
        snprintf(buf, size, "%s (family %s, model %s)", name, family, model);
    else
        snprintf(buf, size, "%s", name);
    return buf;
}

/* OpenBLAS's kernel set, as the headers name it: "SkylakeX", or "Prescott (slower than ...)"
 * when a better set runs on this CPU (pf_blas_core_advised), into buf. */
static inline const char *blas_kernels(char *buf, size_t size) {
    const char *want = pf_blas_core_advised();
    if (want)
        snprintf(buf, size, "%s (slower than %s on this CPU: OPENBLAS_CORETYPE=%s)",
                 pf_blas_core(), want, want);
    else
        snprintf(buf, size, "%s", pf_blas_core());
    return buf;
}

/* Reads fd into buf (size bytes, at most size - 1 of them kept and a '\0' after) until its end,
 * then closes it: what a child process printed through a pipe. */
static inline void read_all(int fd, char *buf, size_t size) {
    size_t got = 0;
    for (ssize_t k; got < size - 1 && (k = read(fd, buf + got, size - 1 - got)) > 0;)
        got += (size_t)k;
    buf[got] = '\0';
    close(fd);
}

/* This process's peak resident size in KiB (VmHWM), or -1. */
static inline long vm_hwm_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) kib = strtol(line + 6, NULL, 10);
    fclose(f);
    return kib;
}

/* v formatted into buf (24 bytes), or "-" when it was not measured (NaN). */
static inline const char *cell(char *buf, const char *fmt, double v) {
    if (v != v)
        snprintf(buf, 24, "-");
    else
        snprintf(buf, 24, fmt, v);
    return buf;
}

/* A CSV written to PATH.tmp (its name in tmp, size bytes) and renamed over PATH only when
 * complete, so that a failed or interrupted run never replaces an earlier table. *f is NULL when
 * path is NULL. Returns 0, or -1 after saying why (prog: the program's name). */
static inline int csv_open(FILE **f, char *tmp, size_t size, const char *path, const char *prog) {
    *f = NULL;
    if (!path) return 0;
    if ((size_t)snprintf(tmp, size, "%s.tmp", path) >= size) {
        fprintf(stderr, "%s: path too long: %s\n", prog, path);
        return -1;
    }
    if (!(*f = fopen(tmp, "w"))) {
        fprintf(stderr, "%s: cannot write %s\n", prog, tmp);
        return -1;
    }
    return 0;
}

/* Closes *f (if open) and renames tmp over path; -1 after saying why, tmp removed. */
static inline int csv_commit(FILE **f, const char *tmp, const char *path, const char *prog) {
    if (!*f) return 0;
    const int bad = ferror(*f) | (fclose(*f) != 0);
    *f = NULL;
    if (bad || rename(tmp, path) != 0) {
        fprintf(stderr, "%s: cannot write %s\n", prog, path);
        remove(tmp);
        return -1;
    }
    return 0;
}

/* Abandons *f (if open): closed, tmp removed, path untouched. */
static inline void csv_abort(FILE **f, const char *tmp) {
    if (!*f) return;
    fclose(*f);
    *f = NULL;
    remove(tmp);
}

#endif
