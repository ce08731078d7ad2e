/* bench_peak.c: this machine's fp32 FMA peak (peak.h), on 1 thread and on all, with what it
 * means per cycle: the clock is measured too, by a chain of dependent integer adds of a register
 * (one cycle each on every x86-64 core since the Pentium Pro; not adds of an immediate, which
 * Intel cores since Golden Cove fold at rename, several a cycle), since a virtual machine's
 * /proc/cpuinfo gives the nominal clock, not the one the core runs at. Every vector set of the
 * library's that the CPU runs is probed, the widest first; the other benchmarks use the set of the kernels the
 * library runs (peak.h: ymm under PF_SIMD=avx2), marked here with a *.
 *
 * Usage: bench_peak */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench.h"
#include "peak.h"

/* Cycles per second of this thread: n rounds of 16 dependent adds; the best of 5 runs. */
static double clock_hz(void) {
#if PEAK_X86 && defined(__x86_64__)
    double best = 0;
    long n = 1 << 20;
    for (int r = 0; r < 8; r++) {
        long x = 0, k = n, one = 1;
        const double t0 = now();
        __asm__ volatile("1:\n\t"
                         ".rept 16\n\t"
                         "add %2, %0\n\t"
                         ".endr\n\t"
                         "dec %1\n\t"
                         "jnz 1b"
                         : "+r"(x), "+r"(k)
                         : "r"(one)
                         : "cc");
        const double t = now() - t0;
        if (x != 16 * n) return 0;
        if (t < 0.05) { /* calibrate to ~0.1 s */
            n = (long)((double)n * 0.1 / (t > 1e-4 ? t : 1e-4));
            r--;
            continue;
        }
        const double hz = 16.0 * (double)n / t;
        best = hz > best ? hz : best;
    }
    return best;
#else
    return 0;
#endif
}

/* The first "cpu MHz" of /proc/cpuinfo, or 0. */
static double cpuinfo_mhz(void) {
    char line[256];
    double mhz = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "cpu MHz", 7) == 0) {
            const char *colon = strchr(line, ':');
            if (colon) mhz = atof(colon + 1);
            break;
        }
    if (f) fclose(f);
    return mhz;
}

int main(int argc, char **argv) {
    (void)argv;
    if (argc > 1) {
        fprintf(stderr, "usage: bench_peak\n");
        return 2;
    }
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    char cpu[192];
    const peak_isa widest = peak_isa_of_cpu();
    printf("performer %s on %s, %d threads, vector kernels %s\n", pf_version(),
           cpu_name(cpu, sizeof cpu), threads, pf_simd_path());
    printf("fp32 FMA peak: %d independent FMA chains per thread, registers only, best of 3 runs "
           "of 0.2 s\n\n",
           PEAK_NACC);
    const double hz = clock_hz(), mhz = cpuinfo_mhz();
    printf("%-32s %12s %12s %10s %16s\n", "vector set", "1 thread", "all threads", "all / 1",
           "flop/cycle/core");
    for (int isa = widest; isa >= (widest == PEAK_PORTABLE ? PEAK_PORTABLE : PEAK_SSE2); isa--) {
        const double g1 = peak_gflops((peak_isa)isa, 1, 3, 0.2);
        const double gn = threads > 1 ? peak_gflops((peak_isa)isa, threads, 3, 0.2) : g1;
        char fpc[24] = "-";
        if (hz > 0) snprintf(fpc, sizeof fpc, "%.1f", g1 * 1e9 / hz);
        char name[40];
        snprintf(name, sizeof name, "%s%s", peak_isa_name((peak_isa)isa),
                 isa == (int)peak_isa_of_kernels() ? " *" : "");
        printf("%-32s %7.1f GF/s %7.1f GF/s %9.2fx %16s\n", name, g1, gn, gn / g1, fpc);
        if (widest == PEAK_PORTABLE) break;
    }
    printf("\nclock of 1 thread, from a chain of dependent adds: %.2f GHz; /proc/cpuinfo says "
           "%.0f MHz\n",
           hz * 1e-9, mhz);
    return 0;
}
