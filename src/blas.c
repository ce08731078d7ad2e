/* blas.c: the matrix products. FAVOR+'s run in the library's own vector kernels (pf_mm); the
 * rest (exact attention, RA, LARA, FAVOR#'s fit) in OpenBLAS, whose kernel set pf_blas_core
 * names.
 *
 * FAVOR+'s products are narrow: one side is d or dv + 1 (64, 65), the other r (256) and a block
 * of rows (256), a causal chunk (16) or a decoding step (1). OpenBLAS 0.3.21's sgemm packs both
 * operands first, which for these shapes costs about as much as the arithmetic: on one core of
 * this project's machine (AMD Zen 5) its AVX2 "Haswell" kernels run them at 60-110 GFLOP/s and
 * its AVX-512 ("Cooperlake") ones at about 195; the vector paths' own tiles (simd/gemm_tmpl.h, no
 * packing: the operands sit in L1 and L2) at 210-230 on AVX-512. They also give each element of
 * C the same bits whatever the rows beside it, which BLAS does not promise: FAVOR+'s results
 * do not depend on the BLAS, and a decoding step runs the very arithmetic of the full pass.
 *
 * OpenBLAS picks its kernel set when it loads, from a table of CPU models; 0.3.21 gives a model
 * it does not know its generic SSE3 set ("Prescott") whatever the CPU runs (Intel family 6
 * model 207: 32 GFLOP/s a core where its AVX-512 set runs 150), and AMD's Zen 1 to 3 its "Zen"
 * set: the Haswell set's sgemm kernel and blocking, but plain C where Haswell's zeroes C and
 * packs B with vector instructions. pf_blas_core_advised compares the set running with the CPU's
 * instructions and names the remedy. */
#include <assert.h>
#include <string.h>
#include <strings.h>

#include <cblas.h>

#include "internal.h"

const char *pf_simd_path(void) {
    return pf_simd()->name;
}

void pf_exp(float *y, const float *x, size_t n) {
    if (n) pf_simd()->exp(y, x, n);
}

const char *pf_blas_core(void) {
    const char *core = openblas_get_corename();
    return core ? core : "unknown";
}

/* OpenBLAS's x86-64 kernel sets by the widest instructions their sgemm uses: 2 AVX-512, 1 AVX2
 * and FMA, 0 older (SSE; AVX alone; AMD's FMA4 families) or lesser. -1: a name not listed here
 * (a later OpenBLAS's, another architecture's), never advised against. These are OpenBLAS's
 * names for its kernel sets, not CPU models: which set a model gets is OpenBLAS's table, the
 * one that falls short.
 *
 * "Zen" (AMD's Zen 1 to 3 in OpenBLAS 0.3.21 to at least 0.3.28, kernel/x86_64/KERNEL.ZEN)
 * counts as lesser: it is Haswell's sgemm kernel with the same blocking (param.h), but C's
 * zeroing before a product with beta 0 (SGEMM_BETA) and B's packing (SGEMMONCOPY) are generic
 * C loops where Haswell's set has vector ones. Exact attention's block products (128 x 512 x 64
 * with beta 0) spend 8% of their time in that zeroing: on an AVX2 CPU Haswell's set is better. */
static int core_level(const char *core) {
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    static const char *const avx2[] = {"Haswell", "Excavator"};
    static const char *const older[] = {
        "Katmai",  "Coppermine", "Northwood", "Prescott",   "Banias",       "Atom",
        "Core2",   "Penryn",     "Dunnington", "Nehalem",   "Athlon",       "Opteron",
        "Opteron_SSE3", "Barcelona", "Nano",  "Sandybridge", "Bobcat",      "Bulldozer",
        "Piledriver", "Steamroller", "Zen"};
    for (size_t i = 0; i < sizeof avx512 / sizeof *avx512; i++)
        if (strcasecmp(core, avx512[i]) == 0) return 2;
    for (size_t i = 0; i < sizeof avx2 / sizeof *avx2; i++)
        if (strcasecmp(core, avx2[i]) == 0) return 1;
    for (size_t i = 0; i < sizeof older / sizeof *older; i++)
        if (strcasecmp(core, older[i]) == 0) return 0;
    return -1;
}

/* The same scale for this CPU, from cpuid (and the OS's saving of the vector registers, which
 * the compiler's checks include): AVX-512 F, BW, VL and DQ, what OpenBLAS's SkylakeX kernels are
 * compiled for; AVX2 and FMA, its Haswell kernels. */
static int cpu_level(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return 2;
    return 1;
#else
    return -1;
#endif
}

const char *pf_blas_core_advice(const char *core, int cpu) {
    /* SkylakeX, not Cooperlake, for AVX-512: the two have the same sgemm kernels (Cooperlake
     * adds bfloat16 ones), and OPENBLAS_CORETYPE=Cooperlake is not accepted by 0.3.21. */
    static const char *const name[] = {NULL, "Haswell", "SkylakeX"};
    const int have = core ? core_level(core) : -1;
    if (have < 0 || cpu <= have || cpu > 2) return NULL;
    return name[cpu];
}

const char *pf_blas_core_advised(void) {
    return pf_blas_core_advice(pf_blas_core(), cpu_level());
}

void pf_transpose(float *dst, const float *src, int rows, int cols, int lds) {
    enum { T = 16 }; /* in T x T blocks: the T lines read and the T written stay in L1 */
    for (int i0 = 0; i0 < rows; i0 += T)
        for (int c0 = 0; c0 < cols; c0 += T) {
            const int i1 = rows - i0 < T ? rows : i0 + T, c1 = cols - c0 < T ? cols : c0 + T;
            for (int i = i0; i < i1; i++)
                for (int c = c0; c < c1; c++)
                    dst[(size_t)c * (size_t)rows + (size_t)i] =
                        src[(size_t)i * (size_t)lds + (size_t)c];
        }
}

void pf_mm(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda,
           const float *B, int ldb, float beta, float *C, int ldc) {
    assert(!(ta && tb));
    const size_t la = (size_t)lda;
    pf_simd()->gemm(tb, m, n, k, alpha, A, ta ? 1 : la, ta ? la : 1, B, (size_t)ldb, beta, C,
                    (size_t)ldc);
}
