/* peak.h: this machine's fp32 FMA peak, measured: what every FAVOR+ speed is a fraction of.
 *
 * Each thread runs its own loop of independent fused multiply-adds on registers only (no
 * memory traffic): NACC accumulator vectors, each updated acc = acc a + b once per iteration, so
 * NACC chains are in flight. An FMA unit takes 4 cycles (AMD Zen 2-5, Intel since Skylake) and
 * a core has 2 of them: 8 chains fill them, NACC = 12 leaves room for a longer latency. a is
 * just below 1, so every accumulator stays finite and normal (it tends to b / (1 - a)); the
 * lanes are summed at the end and the sum checked, so the compiler cannot drop the loop, and
 * without -ffast-math it may not fold it either.
 *
 * The vector set is that of the kernels the library runs (pf_simd_path): AVX-512 (zmm) for the
 * avx512 kernels, AVX2 with FMA (ymm) for the avx2 ones, so that PF_SIMD=avx2 on an AVX-512 CPU
 * is measured against the ymm peak its kernels can reach (half the zmm peak on an Intel core
 * with two 512-bit FMA units; the same on AMD Zen 4). For the portable kernels (ref) it is the
 * widest set the CPU runs, as the library's dispatch would pick it (src/simd/dispatch.c): the
 * machine's peak; without AVX2, SSE2 multiplies and adds, counted as FMAs. GFLOP/s count 2 flops
 * per lane per FMA. Every report names the set its peak was measured with (peak_isa_name).
 *
 * A probe of ~0.2 s per thread count; peak_measure runs a few and keeps the largest: the probe
 * measures what the cores can do, and anything else running on a shared machine only lowers it.
 * On AMD Zen 4 (2 FMA pipes of 256 bits; an AVX-512 FMA runs in two halves) the peak is 32 flops
 * per cycle and core, AVX-512 or AVX2; on Intel with two 512-bit FMA units, 64. */
#ifndef PF_BENCH_PEAK_H
#define PF_BENCH_PEAK_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define PEAK_X86 1
#else
#define PEAK_X86 0
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench.h"

enum { PEAK_NACC = 12 };

typedef enum { PEAK_PORTABLE, PEAK_SSE2, PEAK_AVX2, PEAK_AVX512 } peak_isa;

static inline const char *peak_isa_name(peak_isa isa) {
    static const char *const names[] = {"portable C", "SSE2 (multiply + add, no FMA)",
                                        "AVX2+FMA (ymm)", "AVX-512F (zmm)"};
    return names[isa];
}

/* fp32 lanes per vector */
static inline int peak_lanes(peak_isa isa) {
    return isa == PEAK_AVX512 ? 16 : isa == PEAK_AVX2 ? 8 : isa == PEAK_SSE2 ? 4 : 1;
}

/* The widest set of the library's that this CPU runs (the test of src/simd/dispatch.c). */
static inline peak_isa peak_isa_of_cpu(void) {
#if PEAK_X86
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"))
        return PEAK_AVX512;
    if (avx2) return PEAK_AVX2;
    return PEAK_SSE2;
#else
    return PEAK_PORTABLE;
#endif
}

/* The set of the kernels the library runs (pf_simd_path; PF_SIMD may ask for narrower ones than
 * the CPU's widest): ymm for avx2, else the CPU's widest. */
static inline peak_isa peak_isa_of_kernels(void) {
    const peak_isa cpu = peak_isa_of_cpu();
    if (cpu >= PEAK_AVX2 && strcmp(pf_simd_path(), "avx2") == 0) return PEAK_AVX2;
    return cpu;
}

/* The loops: iters iterations of PEAK_NACC independent FMAs per lane; returns the sum of every
 * lane of every accumulator (finite). */
#define PEAK_BODY(VT, SET1, FMA, STORE, W)                                                         \
    VT acc[PEAK_NACC];                                                                             \
    for (int i = 0; i < PEAK_NACC; i++) acc[i] = SET1(1.0f + 0.01f * (float)i);                    \
    const VT a = SET1(0.999999f), b = SET1(1e-6f);                                                 \
    for (long it = 0; it < iters; it++) {                                                          \
        _Pragma("GCC unroll 12") for (int i = 0; i < PEAK_NACC; i++) acc[i] = FMA(acc[i], a, b);   \
    }                                                                                              \
    double s = 0;                                                                                  \
    float lanes[W];                                                                                \
    for (int i = 0; i < PEAK_NACC; i++) {                                                          \
        STORE(lanes, acc[i]);                                                                      \
        for (int k = 0; k < W; k++) s += lanes[k];                                                 \
    }                                                                                              \
    return s

#if PEAK_X86
__attribute__((target("avx512f"), noinline)) static double peak_loop_avx512(long iters) {
    PEAK_BODY(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_storeu_ps, 16);
}

__attribute__((target("avx2,fma"), noinline)) static double peak_loop_avx2(long iters) {
    PEAK_BODY(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_storeu_ps, 8);
}

static inline __m128 peak_muladd_sse2(__m128 x, __m128 a, __m128 b) {
    return _mm_add_ps(_mm_mul_ps(x, a), b);
}

__attribute__((noinline)) static double peak_loop_sse2(long iters) {
    PEAK_BODY(__m128, _mm_set1_ps, peak_muladd_sse2, _mm_storeu_ps, 4);
}
#endif

static inline float peak_set1(float x) {
    return x;
}

static inline void peak_store1(float *p, float x) {
    *p = x;
}

__attribute__((noinline)) static double peak_loop_portable(long iters) {
    PEAK_BODY(float, peak_set1, fmaf, peak_store1, 1);
}

static inline double peak_loop(peak_isa isa, long iters) {
#if PEAK_X86
    if (isa == PEAK_AVX512) return peak_loop_avx512(iters);
    if (isa == PEAK_AVX2) return peak_loop_avx2(iters);
    if (isa == PEAK_SSE2) return peak_loop_sse2(iters);
#endif
    return peak_loop_portable(iters);
}

/* What the loops' results go into, so that no loop is dead code. */
static volatile double peak_sink;

/* One run: `threads` threads each iterate its own loop `iters` times at once; GFLOP/s of all
 * of them together (wall time). Exits if a result is not finite (a broken probe). */
static inline double peak_run(peak_isa isa, int threads, long iters) {
    double sum = 0;
    int ran = 0; /* the threads that ran */
    const double t0 = now();
#pragma omp parallel num_threads(threads) reduction(+ : sum, ran)
    {
        sum += peak_loop(isa, iters);
        ran += 1;
    }
    const double t = now() - t0;
    if (!isfinite(sum)) {
        fprintf(stderr, "bench: the FMA peak probe's result is not finite (%g)\n", sum);
        exit(2);
    }
    peak_sink = peak_sink + sum;
    return 2.0 * PEAK_NACC * peak_lanes(isa) * (double)iters * ran / t * 1e-9;
}

/* The loop count of a run of ~`seconds` on `threads` threads, from short runs. */
static inline long peak_iters(peak_isa isa, int threads, double seconds) {
    long iters = 1 << 16;
    (void)peak_run(isa, threads, iters); /* warm-up: threads started, clock up */
    for (;;) {
        const double t0 = now();
        (void)peak_run(isa, threads, iters);
        const double t = now() - t0;
        if (t > 0.02) return (long)((double)iters * seconds / t) + 1;
        iters *= 4;
    }
}

/* The best of `rounds` runs of ~`seconds` each on `threads` threads (GFLOP/s). */
static inline double peak_gflops(peak_isa isa, int threads, int rounds, double seconds) {
    const long iters = peak_iters(isa, threads, seconds);
    double best = 0;
    for (int r = 0; r < rounds; r++) {
        const double g = peak_run(isa, threads, iters);
        best = g > best ? g : best;
    }
    return best;
}

/* A measured peak: 1 thread and `threads` threads. */
typedef struct {
    peak_isa isa;
    int threads;
    double g1, gn; /* GFLOP/s */
} peak_fma;

/* Rounds of 0.2 s: 3 on 1 thread and 3 on all, 1.2 s in all. */
static inline peak_fma peak_measure(int threads) {
    peak_fma p;
    p.isa = peak_isa_of_kernels();
    p.threads = threads;
    p.g1 = peak_gflops(p.isa, 1, 3, 0.2);
    p.gn = threads > 1 ? peak_gflops(p.isa, threads, 3, 0.2) : p.g1;
    return p;
}

/* The larger of two measurements of each (at a run's start and end, say). */
static inline peak_fma peak_max(peak_fma a, peak_fma b) {
    a.g1 = a.g1 > b.g1 ? a.g1 : b.g1;
    a.gn = a.gn > b.gn ? a.gn : b.gn;
    return a;
}

/* Short runs of the probe between a benchmark's timings, the largest kept: a busy moment at the
 * start and at the end of a long run does not then decide its peak. */
typedef struct {
    peak_isa isa;
    int threads, runs;
    long iters;
    double best; /* GFLOP/s */
} peak_sampler;

static inline void peak_sampler_init(peak_sampler *s, int threads, double seconds) {
    s->isa = peak_isa_of_kernels();
    s->threads = threads;
    s->iters = peak_iters(s->isa, threads, seconds);
    s->best = 0;
    s->runs = 0;
}

static inline void peak_sample(peak_sampler *s) {
    const double g = peak_run(s->isa, s->threads, s->iters);
    s->best = g > s->best ? g : s->best;
    s->runs++;
}

/* The peak at t threads (1, or all of the measurement's). */
static inline double peak_at(const peak_fma *p, int t) {
    return t <= 1 ? p->g1 : p->gn;
}

#endif
