/* status.c: status strings and the small helpers every file uses. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "internal.h"
#ifdef _OPENMP
#include <omp.h>
#endif

const char *pf_status_str(pf_status status) {
    switch (status) {
    case PF_OK: return "ok";
    case PF_EINVAL: return "invalid argument";
    case PF_ENOMEM: return "out of memory";
    case PF_ENONFINITE: return "non-finite value (NaN or Inf)";
    case PF_EDOMAIN: return "undefined result (zero attention denominator)";
    case PF_EIO: return "input/output error";
    case PF_EFORMAT: return "bad file format";
    case PF_ENOTSUP: return "not supported";
    }
    return "unknown status";
}

/* The header's PF_VERSION_* (the Makefile names the shared library from them too). */
#define PF_STR_(x) #x
#define PF_STR(x) PF_STR_(x)

const char *pf_version(void) {
    return PF_STR(PF_VERSION_MAJOR) "." PF_STR(PF_VERSION_MINOR) "." PF_STR(PF_VERSION_PATCH);
}

void *pf_alloc(size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) return NULL;
    size_t bytes = count * size;
    if (bytes > SIZE_MAX - 63) return NULL;
    bytes = (bytes + 63) / 64 * 64;
    if (bytes == 0) bytes = 64;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes) != 0) return NULL;
    return p;
}

void pf_free(void *p) {
    free(p);
}

int pf_threads(int t) {
    /* Every parallel loop asks here first. Its threads call BLAS concurrently, so OpenBLAS must
     * not start threads of its own inside them. Its pthread build is pinned to one thread here,
     * once (a benign race). Not its OpenMP build (the one the Makefile links): there
     * openblas_set_num_threads is omp_set_num_threads, which would leave the calling thread, and
     * so the library, one OpenMP thread; that build runs a call from inside an active parallel
     * region on one thread by itself, and pf_blas_pin covers a region of one thread. */
    static volatile int blas_pinned = 0;
    if (!blas_pinned) {
        if (openblas_get_parallel() == OPENBLAS_THREAD) openblas_set_num_threads(1);
        blas_pinned = 1;
    }
    if (t > 0) return t < PF_MAX_THREADS ? t : PF_MAX_THREADS;
#ifdef _OPENMP
    int n = omp_get_max_threads(); /* OMP_NUM_THREADS=100000 would overflow the stack */
    return n < PF_MAX_THREADS ? n : PF_MAX_THREADS;
#else
    return 1;
#endif
}

void pf_blas_pin(void) {
#ifdef _OPENMP
    /* This thread's OpenMP thread count, which OpenBLAS's OpenMP build reads before each call,
     * belongs to the region's implicit task and ends with it. Outside every region (level 0) it
     * would be the caller's own: left alone, as a call there may use BLAS threads. */
    if (omp_get_level() > 0) omp_set_num_threads(1);
#endif
}

int pf_any_nonfinite(const float *x, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad |= !isfinite(x[i]);
    return bad;
}

float pf_effective_scale(float s, int d) {
    return s > 0 ? s : (float)(1.0 / sqrt((double)d));
}
