/* bench_serve.c: what an inference engine pays for a FAVOR+ decoding state: a prompt prefilled
 * by the chunked causal pass against the same prompt stepped a token at a time, one-token steps
 * of N = 1, 8 and 64 sequences in one state (pf_favor_state_step_n), and a sequence's bytes.
 *
 * H = 8 heads, d = dv = 64, m = 256 positive features, orthogonal W, entries of q, k ~ N(0, 1/4);
 * the library's threads (OMP_NUM_THREADS) for everything. Prefill: a prompt of P tokens (4096;
 * --quick 1024) into an empty sequence, the median of 5; stepping: the same P tokens one at a
 * time, the median of 3 totals. Decoding: N sequences prefilled to 1024 tokens each, then 64
 * calls stepping all N by one token (after 8 not timed): the median call, and N over it as tokens
 * per second. All ratios come from this one run.
 *
 * Usage: bench_serve [--quick]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench.h"
#include "performer.h"

enum { H = 8, D = 64, DV = 64, M = 256 };

static void die(const char *what, pf_status s) {
    fprintf(stderr, "bench_serve: %s: %s\n", what, pf_status_str(s));
    exit(1);
}

/* Token t of a (H, P, w) block into x (H, 1, w). */
static void token(float *x, const float *X, int P, int w, int t) {
    for (int h = 0; h < H; h++)
        memcpy(x + (size_t)h * w, X + ((size_t)h * P + t) * w, sizeof(float) * w);
}

int main(int argc, char **argv) {
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else {
            fprintf(stderr, "usage: bench_serve [--quick]\n");
            return 2;
        }
    }
    const int P = quick ? 1024 : 4096, ctx = 1024;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    char cpu[192];
    printf("performer %s on %s, %d threads, vector kernels %s\n", pf_version(),
           cpu_name(cpu, sizeof cpu), threads, pf_simd_path());
    printf("FAVOR+ decoding state, H=%d d=dv=%d m=%d positive features\n\n", H, D, M);
    float *W = xmalloc(sizeof(float) * M * D);
    pf_projection_draw(W, M, D, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 0, 0);
    pf_favor_opts fav = pf_favor_opts_default();
    fav.W = W;
    fav.m = M;
    const size_t nq = (size_t)H * P * D;
    float *q = xmalloc(sizeof(float) * nq), *k = xmalloc(sizeof(float) * nq);
    float *v = xmalloc(sizeof(float) * nq), *o = xmalloc(sizeof(float) * nq);
    fill(q, nq, 1, 0.5f);
    fill(k, nq, 2, 0.5f);
    fill(v, nq, 3, 1.0f);

    /* ---- prefill against stepping */
    pf_favor_state *st = NULL;
    pf_status s = pf_favor_state_create(&st, H, D, DV, 0.0f, &fav);
    if (s != PF_OK) die("create", s);
    double tp[5], ts[3];
    for (int rep = 0; rep < 5; rep++) {
        pf_favor_state_reset(st);
        const double t0 = now();
        if ((s = pf_favor_state_prefill(st, 0, o, q, k, v, P)) != PF_OK) die("prefill", s);
        tp[rep] = now() - t0;
    }
    float *q1 = xmalloc(sizeof(float) * H * D * 64), *k1 = xmalloc(sizeof(float) * H * D * 64);
    float *v1 = xmalloc(sizeof(float) * H * DV * 64), *o1 = xmalloc(sizeof(float) * H * DV * 64);
    for (int rep = 0; rep < 3; rep++) {
        pf_favor_state_reset(st);
        double total = 0;
        for (int t = 0; t < P; t++) {
            token(q1, q, P, D, t);
            token(k1, k, P, D, t);
            token(v1, v, P, DV, t);
            const double t0 = now();
            if ((s = pf_favor_state_step(st, o1, q1, k1, v1, 1)) != PF_OK) die("step", s);
            total += now() - t0;
        }
        ts[rep] = total;
    }
    pf_favor_state_free(st);
    const double mp = median(tp, 5), ms = median(ts, 3);
    printf("prompt of %d tokens      ms      tokens/s\n", P);
    printf("  prefill            %8.2f   %11.0f\n", 1e3 * mp, P / mp);
    printf("  token by token     %8.2f   %11.0f\n", 1e3 * ms, P / ms);
    printf("  prefill / stepping: %.1fx the tokens per second\n\n", ms / mp);

    /* ---- many sequences, one token each */
    printf("N sequences at %d tokens, one token each per call:\n", ctx);
    printf("      N   us per call   us per token   tokens/s\n");
    const int Ns[3] = {1, 8, 64};
    for (int ni = 0; ni < 3; ni++) {
        const int N = Ns[ni];
        pf_favor_state *sn = NULL;
        if ((s = pf_favor_state_create_n(&sn, N, H, D, DV, 0.0f, &fav)) != PF_OK)
            die("create_n", s);
        for (int i = 0; i < N; i++) /* (every sequence the same prompt: the work is the same) */
            if ((s = pf_favor_state_prefill(sn, i, o, q, k, v, ctx < P ? ctx : P)) != PF_OK)
                die("prefill", s);
        for (int i = 0; i < N; i++) {
            token(q1 + (size_t)i * H * D, q, P, D, (ctx + i) % P);
            token(k1 + (size_t)i * H * D, k, P, D, (ctx + i) % P);
            token(v1 + (size_t)i * H * DV, v, P, DV, (ctx + i) % P);
        }
        double tc[64];
        for (int rep = -8; rep < 64; rep++) {
            const double t0 = now();
            if ((s = pf_favor_state_step_n(sn, o1, q1, k1, v1, NULL, N, NULL)) != PF_OK)
                die("step_n", s);
            if (rep >= 0) tc[rep] = now() - t0;
        }
        const double mc = median(tc, 64);
        printf("  %5d   %11.1f   %12.2f   %8.0f\n", N, 1e6 * mc, 1e6 * mc / N, N / mc);
        pf_favor_state_free(sn);
    }
    pf_favor_state *one = NULL;
    pf_favor_state_create(&one, H, D, DV, 0.0f, &fav);
    const int dw = (DV + 1 + 15) / 16 * 16;
    const double mem = (double)H * (M * dw + 2.0 * (M + dw + 1)) * 4 + H * 8 + 8;
    printf("\nbytes per sequence: %.0f KiB in memory (H r dw floats, dw = dv + 1 rounded up to 16,\n"
           "and the pending rows), %.0f KiB as a snapshot\n",
           mem / 1024, (double)pf_favor_state_snapshot_bytes(one) / 1024);
    pf_favor_state_free(one);
    free(q);
    free(k);
    free(v);
    free(o);
    free(q1);
    free(k1);
    free(v1);
    free(o1);
    free(W);
    return 0;
}
