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
 * the time it would take at the 1-thread fp32 FMA peak (peak.h: a single token runs on one
 * thread, pf_favor_state_step), the largest of the probe's runs before the tokens, after them
 * and between their rounds, and each median time per token as a multiple of that time.
 *
 * Usage: bench_decode [--quick] [--tokens N] [--csv FILE]
 */
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
    double *t = xmalloc(sizeof(double) * NCTX * (size_t)tokens);
    char cpu[192], blas[128];
    char csv_tmp[4096];
    FILE *csv;
    if (csv_open(&csv, csv_tmp, sizeof csv_tmp, csv_path, "bench_decode") != 0) return 1;
    const peak_fma pk0 = peak_measure(1);
    peak_sampler during;
    peak_sampler_init(&during, 1, 0.02);
    /* every context's state first, then the single tokens in turn across them, so that the
     * shared machine's drifts fall on every context alike */
    pf_favor_state *st[NCTX] = {NULL};
    pf_status s = PF_OK;
    for (int c = 0; c < nctx && s == PF_OK; c++) {
        s = pf_favor_state_create(&st[c], H, d, dv, 0.0f, &fav);
        for (int64_t pos = 0; s == PF_OK && pos < contexts[c]; pos += big) {
            const int n = contexts[c] - pos < big ? (int)(contexts[c] - pos) : big;
            s = pf_favor_state_step(st[c], o, q, k, v, n);
        }
    }
    /* single tokens: rows 0..tokens-1 of the big step's first head block, as (H, 1, d) */
    float *q1 = xmalloc(sizeof(float) * H * d), *k1 = xmalloc(sizeof(float) * H * d);
    float *v1 = xmalloc(sizeof(float) * H * dv);
    /* rounds of RUN tokens per context in turn; a context's first token of a round finds its
     * state out of cache, as a decoder's next token would not: the medians drop it */
    enum { RUN = 8 };
    for (int i0 = -RUN; s == PF_OK && i0 < tokens; i0 += RUN) { /* one warm-up round */
        for (int c = 0; c < nctx && s == PF_OK; c++) {
            for (int i = i0; i < i0 + RUN && i < tokens && s == PF_OK; i++) {
                const int row = (i + RUN) % big;
                for (int h = 0; h < H; h++) {
                    memcpy(q1 + h * d, q + ((size_t)h * big + row) * d, sizeof(float) * d);
                    memcpy(k1 + h * d, k + ((size_t)h * big + row) * d, sizeof(float) * d);
                    memcpy(v1 + h * dv, v + ((size_t)h * big + row) * dv, sizeof(float) * dv);
                }
                const double t0 = now();
                s = pf_favor_state_step(st[c], o, q1, k1, v1, 1);
                if (i >= 0) t[(size_t)c * (size_t)tokens + (size_t)i] = now() - t0;
            }
        }
        peak_sample(&during); /* (registers only: the states stay where they were) */
    }
    free(q1);
    free(k1);
    free(v1);
    for (int c = 0; c < nctx; c++) pf_favor_state_free(st[c]);
    if (s != PF_OK) {
        fprintf(stderr, "bench_decode: %s\n", pf_status_str(s));
        csv_abort(&csv, csv_tmp);
        return 1;
    }
    const peak_fma pk1 = peak_measure(1);
    peak_fma pk = peak_max(pk0, pk1);
    pk.g1 = during.best > pk.g1 ? during.best : pk.g1;
    const int r = m; /* positive features */
    const double tok_flops = (double)H * (4.0 * m * d + 4.0 * r * (dv + 1));
    const double at_peak = tok_flops / (pk.g1 * 1e9);
    printf("performer %s on %s, %d threads, vector kernels %s, OpenBLAS kernels %s\n"
           "streaming causal FAVOR+ decode, H=%d d=%d m=%d, positive; a token runs on 1 thread\n",
           pf_version(), cpu_name(cpu, sizeof cpu), threads, pf_simd_path(),
           blas_kernels(blas, sizeof blas), H, d, m);
    printf(
        "fp32 FMA peak, 1 thread: %.1f GFLOP/s (%s, bench/peak.h; the largest of\n"
        "3 runs of 0.2 s before the tokens, %.1f, 3 after, %.1f, and %d of 20 ms between rounds,\n"
        "%.1f); a token's arithmetic, H (4 m d + 4 r (dv+1)) = %.0f FLOPs, takes %.2f us at\n"
        "that peak (\"vs peak\": the time per token over that)\n",
        pk.g1, peak_isa_name(pk.isa), pk0.g1, pk1.g1, during.runs, during.best, tok_flops,
        at_peak * 1e6);
    printf("%8s %14s %10s %10s %10s\n", "context", "us per token", "vs 1024", "GFLOP/s", "vs peak");
    if (csv)
        fprintf(csv, "context,seconds_per_token,ratio_to_first,flops_per_token,"
                     "peak_seconds_per_token,peak_multiple,fma_peak_gflops,machine\n");
    double base = 0;
    for (int c = 0; c < nctx; c++) {
        const double med = median(t + (size_t)c * (size_t)tokens, tokens);
        if (c == 0) base = med;
        printf("%8d %14.2f %9.2fx %10.1f %9.2fx\n", contexts[c], med * 1e6, med / base,
               tok_flops / med * 1e-9, med / at_peak);
        if (csv)
            fprintf(csv,
                    "%d,%.6g,%.4g,%.6g,%.6g,%.4g,%.4g,\"%s, vector kernels %s, OpenBLAS kernels "
                    "%s\"\n",
                    contexts[c], med, med / base, tok_flops, at_peak, med / at_peak, pk.g1, cpu,
                    pf_simd_path(), blas);
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
