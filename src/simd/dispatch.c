/* dispatch.c: picks the vector kernels for this CPU once, on first use. */
#include <stdlib.h>
#include <string.h>

#include "simd/simd.h"

#if defined(__x86_64__) || defined(__i386__)
static int cpu_has(const char *feature) {
    __builtin_cpu_init();
    if (strcmp(feature, "avx2") == 0)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (strcmp(feature, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return 0;
}
#endif

const pf_simd_table *pf_simd_get(const char *name) {
    if (!name) return NULL;
    if (strcmp(name, "ref") == 0) return &pf_simd_ref;
#if defined(__x86_64__) || defined(__i386__)
    if (strcmp(name, "avx2") == 0) return cpu_has("avx2") ? &pf_simd_avx2 : NULL;
    if (strcmp(name, "avx512") == 0) return cpu_has("avx512") ? &pf_simd_avx512 : NULL;
#endif
#if defined(__aarch64__)
    if (strcmp(name, "neon") == 0) return &pf_simd_neon;
#endif
    return NULL;
}

static const pf_simd_table *choose(void) {
    const pf_simd_table *t = pf_simd_get(getenv("PF_SIMD"));
    if (t) return t;
    if ((t = pf_simd_get("avx512"))) return t;
    if ((t = pf_simd_get("avx2"))) return t;
    if ((t = pf_simd_get("neon"))) return t;
    return &pf_simd_ref;
}

const pf_simd_table *pf_simd(void) {
    /* A benign race: every thread computes the same pointer. */
    static const pf_simd_table *volatile chosen = NULL;
    const pf_simd_table *t = chosen;
    if (!t) chosen = t = choose();
    return t;
}
