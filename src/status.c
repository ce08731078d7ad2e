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
     * not start threads of its own inside them: pin it to one, once (a benign race). */
    static volatile int blas_pinned = 0;
    if (!blas_pinned) {
        openblas_set_num_threads(1);
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

int pf_any_nonfinite(const float *x, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad |= !isfinite(x[i]);
    return bad;
}

float pf_effective_scale(float s, int d) {
    return s > 0 ? s : (float)(1.0 / sqrt((double)d));
}
