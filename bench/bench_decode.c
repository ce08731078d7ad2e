/* bench_decode.c: the time per decoded token of streaming causal FAVOR+ (pf_favor_state_step
 * with n = 1) against the context length, which it must not depend on.
 *
 * For each context c a state is first advanced to c with big steps; then `tokens` single-token
 * steps are timed one by one, in rounds of a few tokens per context in turn (so that the
 * machine's drifts fall on all alike); each context's median is reported, with its ratio to
 * the context-1024 median measured in the same run (the target: at most 1.1x at 65536). B = 1
 * sequence, H = 8, d = dv = 64, m = 256 positive features, orthogonal W.
 *
 * And against the arithmetic of a token (multiply-add = 2 FLOPs; r = m features):
 *   per head   4 m d          the feature maps' projections of q and k (the exps not counted)
 *            + 2 r (dv + 1)   the state update S += k~ [v | 1]
 *            + 2 r (dv + 1)   the numerator and denominator q~ S
 * the time it would take at the fp32 FMA peak of the threads the step runs on (peak.h), the
 * largest of the probe's runs before the tokens, after them and between their rounds, and each
 * median time per token as a multiple of that time.
 *
 * Twice: states made while OpenMP's thread count is 1 (the kernels' own speed on one core),
 * and states made with the default count, whose steps share a token's heads among the threads
 * (pf_favor_state_step); their tokens alternate round by round, and the last line is the ratio
 * of their times.
 *
 * Usage: bench_decode [--quick] [--tokens N] [--csv FILE]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench.h"
#include "peak.h"
#include "performer.h"

int main(int argc, char **argv) {
    int tokens = 256, quick = 0;
    const char *csv_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
            csv_path = argv[++i];
        } else if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) {
            tokens = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench_decode [--quick] [--tokens N] [--csv FILE]\n");
            return 2;
        }
    }
    if (tokens < 1) tokens = 1;
    const int H = 8, d = 64, dv = 64, m = 256, big = 2048;
    enum { NCTX = 4 };
    const int contexts[NCTX] = {1024, 4096, 16384, 65536};
    const int nctx = quick ? NCTX - 1 : NCTX;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    float *W = xmalloc(sizeof(float) * m * d);
    pf_projection_draw(W, m, d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 0, 0);
    pf_favor_opts fav = pf_favor_opts_default();
    fav.W = W;
    fav.m = m;
    /* one big step's inputs, reused for every big step; entries N(0, 1/4): |x'| ~ 1.4 */
    const size_t nq = (size_t)H * big * d;
    float *q = xmalloc(sizeof(float) * nq), *k = xmalloc(sizeof(float) * nq);
    float *v = xmalloc(sizeof(float) * nq), *o = xmalloc(sizeof(float) * nq);
    fill(q, nq, 1, 0.5f);
    fill(k, nq, 2, 0.5f);
    fill(v, nq, 3, 1.0f);
    /* the thread counts: one (the kernels' own speed: the 2x target) and OpenMP's (what a
     * state made with the defaults uses: its heads share the threads, pf_favor_state_step) */
    /* (a step gives each thread at least 2^16 of H r (d + dv), and uses no more threads than
     * processors: step_threads, src/favor/state.c) */
    const int share = (int)((int64_t)H * m * (d + dv) >> 16);
    int used = threads < H ? threads : H;
#ifdef _OPENMP
    if (used > omp_get_num_procs()) used = omp_get_num_procs();
#endif
    if (share < used) used = share > 1 ? share : 1;
    const int nset = used > 1 ? 2 : 1, nts[2] = {1, used};
    double *t = xmalloc(sizeof(double) * 2 * NCTX * (size_t)tokens);
    char cpu[192], blas[128];
    char csv_tmp[4096];
    FILE *csv;
    if (csv_open(&csv, csv_tmp, sizeof csv_tmp, csv_path, "bench_decode") != 0) return 1;
    const peak_fma pk0 = peak_measure(used);
    peak_sampler during[2];
    for (int ts = 0; ts < nset; ts++) peak_sampler_init(&during[ts], nts[ts], 0.02);
    /* every state first (a state takes OpenMP's thread count when it is made), then the single
     * tokens in turn across them, so that the shared machine's drifts fall on all alike */
    pf_favor_state *st[2][NCTX] = {{NULL}};
    pf_status s = PF_OK;
    for (int ts = 0; ts < nset; ts++) {
#ifdef _OPENMP
        omp_set_num_threads(ts == 0 ? 1 : threads);
#endif
        for (int c = 0; c < nctx && s == PF_OK; c++) {
            s = pf_favor_state_create(&st[ts][c], H, d, dv, 0.0f, &fav);
            for (int64_t pos = 0; s == PF_OK && pos < contexts[c]; pos += big) {
                const int n = contexts[c] - pos < big ? (int)(contexts[c] - pos) : big;
                s = pf_favor_state_step(st[ts][c], o, q, k, v, n);
            }
        }
    }
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    /* single tokens: rows 0..tokens-1 of the big step's first head block, as (H, 1, d) */
    float *q1 = xmalloc(sizeof(float) * H * d), *k1 = xmalloc(sizeof(float) * H * d);
    float *v1 = xmalloc(sizeof(float) * H * dv);
    /* rounds of RUN tokens per state in turn; a state's first token of a round finds it out of
     * cache, as a decoder's next token would not: the medians drop it */
    enum { RUN = 8 };
    for (int i0 = -RUN; s == PF_OK && i0 < tokens; i0 += RUN) { /* one warm-up round */
        for (int ts = 0; ts < nset; ts++)
            for (int c = 0; c < nctx && s == PF_OK; c++) {
                for (int i = i0; i < i0 + RUN && i < tokens && s == PF_OK; i++) {
                    const int row = (i + RUN) % big;
                    for (int h = 0; h < H; h++) {
                        memcpy(q1 + h * d, q + ((size_t)h * big + row) * d, sizeof(float) * d);
                        memcpy(k1 + h * d, k + ((size_t)h * big + row) * d, sizeof(float) * d);
                        memcpy(v1 + h * dv, v + ((size_t)h * big + row) * dv, sizeof(float) * dv);
                    }
                    const double t0 = now();
                    s = pf_favor_state_step(st[ts][c], o, q1, k1, v1, 1);
                    if (i >= 0)
                        t[((size_t)ts * NCTX + (size_t)c) * (size_t)tokens + (size_t)i] =
                            now() - t0;
                }
            }
        /* (registers only: the states stay where they were) */
        for (int ts = 0; ts < nset; ts++) peak_sample(&during[ts]);
    }
    free(q1);
    free(k1);
    free(v1);
    for (int ts = 0; ts < nset; ts++)
        for (int c = 0; c < nctx; c++) pf_favor_state_free(st[ts][c]);
    if (s != PF_OK) {
        fprintf(stderr, "bench_decode: %s\n", pf_status_str(s));
        csv_abort(&csv, csv_tmp);
        return 1;
    }
    const peak_fma pk1 = peak_measure(used);
    peak_fma pk = peak_max(pk0, pk1);
    pk.g1 = during[0].best > pk.g1 ? during[0].best : pk.g1;
    if (nset > 1) pk.gn = during[1].best > pk.gn ? during[1].best : pk.gn;
    const int r = m; /* positive features */
    const double tok_flops = (double)H * (4.0 * m * d + 4.0 * r * (dv + 1));
    printf("performer %s on %s, %d threads, vector kernels %s, OpenBLAS kernels %s\n"
           "streaming causal FAVOR+ decode, H=%d d=%d m=%d, positive; a token's arithmetic,\n"
           "H (4 m d + 4 r (dv+1)) = %.0f FLOPs; medians of %d tokens\n",
           pf_version(), cpu_name(cpu, sizeof cpu), threads, pf_simd_path(),
           blas_kernels(blas, sizeof blas), H, d, m, tok_flops, tokens);
    if (csv)
        fprintf(csv, "context,threads,seconds_per_token,ratio_to_first,"
                     "flops_per_token,peak_seconds_per_token,peak_multiple,fma_peak_gflops,"
                     "machine\n");
    double med1 = NAN;
    for (int ts = 0; ts < nset; ts++) {
        const double g = peak_at(&pk, nts[ts]), at_peak = tok_flops / (g * 1e9);
        const peak_fma *pm[2] = {&pk0, &pk1};
        printf("\n%s\n"
               "fp32 FMA peak, %d thread%s: %.1f GFLOP/s (%s, bench/peak.h; the largest of 3 runs\n"
               "of 0.2 s before the tokens, %.1f, 3 after, %.1f, and %d of 20 ms between rounds,\n"
               "%.1f); the arithmetic takes %.2f us at that peak (\"vs peak\": the time per token\n"
               "over that)\n",
               ts == 0 ? "One thread (the state made while OpenMP's thread count was 1):"
                       : "The default thread count (the state's heads share the threads):",
               nts[ts], nts[ts] > 1 ? "s" : "", g, peak_isa_name(pk.isa), peak_at(pm[0], nts[ts]),
               peak_at(pm[1], nts[ts]), during[ts].runs, during[ts].best, at_peak * 1e6);
        printf("%8s %14s %10s %10s %10s\n", "context", "us per token", "vs 1024", "GFLOP/s",
               "vs peak");
        double base = 0;
        for (int c = 0; c < nctx; c++) {
            double *tc = t + ((size_t)ts * NCTX + (size_t)c) * (size_t)tokens;
            const double med = median(tc, tokens);
            if (c == 0) base = med;
            if (ts == 0 && c == 0) med1 = med;
            printf("%8d %14.2f %9.2fx %10.1f %9.2fx\n", contexts[c], med * 1e6, med / base,
                   tok_flops / med * 1e-9, med / at_peak);
            if (csv)
                fprintf(csv,
                        "%d,%d,%.6g,%.4g,%.6g,%.6g,%.4g,%.4g,\"%s, vector kernels %s, "
                        "OpenBLAS kernels %s\"\n",
                        contexts[c], nts[ts], med, med / base, tok_flops, at_peak, med / at_peak, g,
                        cpu, pf_simd_path(), blas);
        }
        if (ts == 1)
            printf("%d threads against 1 at context %d: %.2fx the time a token\n", nts[ts],
                   contexts[0], base / med1);
    }
    if (csv_commit(&csv, csv_tmp, csv_path, "bench_decode") != 0) return 1;
    free(W);
    free(q);
    free(k);
    free(v);
    free(o);
    free(t);
    return 0;
}
