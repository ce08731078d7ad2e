/* blas.c: which OpenBLAS kernels run. */
#include <cblas.h>

#include "internal.h"

const char *pf_blas_core(void) {
    const char *core = openblas_get_corename();
    return core ? core : "unknown";
}
