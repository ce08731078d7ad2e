/* bench_attn.c: attention speed against this machine's own matrix-multiply speed.
 *
 * Every figure is a median over repeats, and every speed is reported as a ratio to something
 * measured in the same run, since absolute times drift on a shared machine:
 *   - machine sgemm GFLOP/s: every thread running its own single-threaded cblas_sgemm of a
 *     large square product at once (the BLAS is OpenBLAS's serial build; this is the machine's
 *     matrix-multiply throughput with the same threads the library uses);
 *   - exact attention, for FAVOR+.
 *
 * FLOP model (multiply-add = 2 FLOPs; B*H heads):
 *   exact, bidirectional   4 L^2 d            (Q K^T and P V, dv = d)
 *   exact, causal          2 L (L+1) d        (half the score matrix)
 *   FAVOR+ (either)        4 L m d + 4 L r dv (the Q and K projections; K'^T V and Q'(K'^T V))
 * Causal FAVOR+ is held to the bidirectional model: its extra intra-chunk work counts as cost.
 * Backward passes are reported as time ratios to their forward.
 *
 * Usage: bench_attn [--quick] [--csv FILE] [--lengths L1,L2,...]
 */
#define _DEFAULT_SOURCE /* wait4 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "performer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes);
    if (!p) {
        fprintf(stderr, "bench: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

static void fill(float *x, size_t n, uint64_t seed) {
    pf_rng rng;
    pf_rng_init(&rng, seed, 0);
    pf_rng_fill_normal(&rng, x, n);
}

/* ---- the machine's sgemm speed --------------------------------------------------------- */

static double sgemm_gflops(int threads, int reps) {
    const int n = 1024;
    double t[16];
    float *a = xmalloc(sizeof(float) * (size_t)threads * n * n * 3);
    fill(a, (size_t)threads * n * n * 3, 7);
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now();
#pragma omp parallel for num_threads(threads) schedule(static, 1)
        for (int i = 0; i < threads; i++) {
            float *A = a + (size_t)i * n * n * 3, *B = A + (size_t)n * n, *C = B + (size_t)n * n;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, A, n, B, n, 0.0f,
                        C, n);
        }
        if (r > 0) t[r - 1] = now() - t0; /* the first run is a warm-up */
    }
    free(a);
    return 2.0 * n * n * n * threads / median(t, reps) * 1e-9;
}

/* ---- one timed case ---------------------------------------------------------------------- */

typedef enum { EXACT, FAVOR } method;
typedef enum { FWD, FWD_BWD } pass;

typedef struct {
    int B, H, L, d, m;
    method meth;
    int causal;
    pass pass;
} bench_case;

typedef struct {
    float *Q, *K, *V, *out, *lse, *dout, *dQ, *dK, *dV, *W;
} buffers;

static pf_status run_once(const bench_case *c, buffers *b) {
    pf_shape shape = {c->B, c->H, c->L, c->L, c->d, c->d};
    pf_attn_opts opts = pf_attn_opts_default();
    opts.causal = c->causal;
    pf_status st;
    if (c->meth == EXACT) {
        st = pf_attn_exact(b->out, b->lse, b->Q, b->K, b->V, &shape, &opts);
        if (st == PF_OK && c->pass == FWD_BWD)
            st = pf_attn_exact_backward(b->dQ, b->dK, b->dV, b->dout, b->Q, b->K, b->V, b->out,
                                        b->lse, &shape, &opts);
    } else {
        pf_favor_opts fav = pf_favor_opts_default();
        fav.W = b->W;
        fav.m = c->m;
        st = pf_attn_favor(b->out, b->Q, b->K, b->V, &shape, &opts, &fav);
        if (st == PF_OK && c->pass == FWD_BWD)
            st = pf_attn_favor_backward(b->dQ, b->dK, b->dV, b->dout, b->Q, b->K, b->V, &shape,
                                        &opts, &fav);
    }
    return st;
}

static void buffers_make(buffers *b, const bench_case *c) {
    size_t n = (size_t)c->B * c->H * c->L * c->d;
    memset(b, 0, sizeof *b);
    b->Q = xmalloc(n * sizeof(float));
    b->K = xmalloc(n * sizeof(float));
    b->V = xmalloc(n * sizeof(float));
    b->out = xmalloc(n * sizeof(float));
    b->lse = xmalloc((size_t)c->B * c->H * c->L * sizeof(float));
    fill(b->Q, n, 1);
    fill(b->K, n, 2);
    fill(b->V, n, 3);
    if (c->pass == FWD_BWD) {
        b->dout = xmalloc(n * sizeof(float));
        b->dQ = xmalloc(n * sizeof(float));
        b->dK = xmalloc(n * sizeof(float));
        b->dV = xmalloc(n * sizeof(float));
        fill(b->dout, n, 4);
    }
    b->W = xmalloc((size_t)c->m * c->d * sizeof(float));
    pf_projection_draw(b->W, c->m, c->d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 0, 0);
}

static void buffers_free(buffers *b) {
    free(b->Q), free(b->K), free(b->V), free(b->out), free(b->lse);
    free(b->dout), free(b->dQ), free(b->dK), free(b->dV), free(b->W);
}

/* Median seconds of a case: a warm-up, then repeats until `reps` runs or `budget` seconds. */
static double time_case(const bench_case *c, int reps, double budget) {
    buffers b;
    buffers_make(&b, c);
    double t[64];
    int n = 0;
    pf_status st = run_once(c, &b); /* warm-up */
    double start = now();
    while (st == PF_OK && n < reps && n < 64) {
        double t0 = now();
        st = run_once(c, &b);
        t[n++] = now() - t0;
        if (now() - start > budget && n >= 1) break;
    }
    buffers_free(&b);
    if (st != PF_OK) {
        fprintf(stderr, "bench: %s\n", pf_status_str(st));
        return NAN;
    }
    return median(t, n);
}

/* Peak resident memory (MiB) of one causal FAVOR+ forward+backward at length L, measured in a
 * fresh process (this program re-executed with --peak L), so that the figure is that case's own
 * peak; a forked copy of a process that has run OpenMP threads cannot safely start its own. */
static double peak_mib(int L) {
    char arg[32];
    snprintf(arg, sizeof arg, "%d", L);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return NAN;
    if (pid == 0) {
        execl("/proc/self/exe", "bench_attn", "--peak", arg, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return NAN;
    return (double)ru.ru_maxrss / 1024.0; /* ru_maxrss is in KiB on Linux */
}

/* The child of peak_mib: one run, exit status 0 on success. */
static int peak_child(const bench_case *c) {
    buffers b;
    buffers_make(&b, c);
    pf_status st = run_once(c, &b);
    buffers_free(&b);
    return st == PF_OK ? 0 : 1;
}

static double flops(const bench_case *c) {
    double L = c->L, d = c->d, m = c->m, heads = (double)c->B * c->H;
    if (c->meth == EXACT) return heads * (c->causal ? 2.0 * L * (L + 1) * d : 4.0 * L * L * d);
    return heads * (4.0 * L * m * d + 4.0 * L * m * d);
}

int main(int argc, char **argv) {
    int quick = 0;
    const char *csv_path = NULL;
    int lengths[16] = {1024, 4096, 16384}, nlen = 3;
    int mem_lengths[2] = {65536, 131072}, nmem = 2;
    int max_exact_bwd = 4096;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
            nmem = 1;
        } else if (strcmp(argv[i], "--peak") == 0 && i + 1 < argc) {
            bench_case c = {1, 8, atoi(argv[++i]), 64, 256, FAVOR, 1, FWD_BWD};
            return peak_child(&c);
        } else if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
            csv_path = argv[++i];
        } else if (strcmp(argv[i], "--lengths") == 0 && i + 1 < argc) {
            nlen = 0;
            for (char *s = strtok(argv[++i], ","); s && nlen < 16; s = strtok(NULL, ","))
                lengths[nlen++] = atoi(s);
        } else {
            fprintf(stderr, "usage: bench_attn [--quick] [--csv FILE] [--lengths L1,L2,...]\n");
            return 2;
        }
    }
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    const int B = 1, H = 8, d = 64, m = 256;
    const int reps = quick ? 3 : 7;
    double sg = sgemm_gflops(threads, reps);
    printf("performer %s, %d threads; machine sgemm: %.1f GFLOP/s (median of %d, %d x 1024^3)\n",
           pf_version(), threads, sg, reps, threads);
    printf("B=%d H=%d d=%d m=%d, positive features, orthogonal W; times are medians\n\n", B, H,
           d, m);
    printf("%7s  %-22s %10s %9s %9s %9s %11s\n", "L", "method", "fwd ms", "GFLOP/s", "of sgemm",
           "vs exact", "fwd+bwd/fwd");
    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
    if (csv) fprintf(csv, "L,method,causal,fwd_seconds,fwdbwd_seconds,gflops,sgemm_fraction\n");
    for (int li = 0; li < nlen; li++) {
        int L = lengths[li];
        double exact_t[2] = {NAN, NAN};
        for (int meth = EXACT; meth <= FAVOR; meth++) {
            for (int causal = 0; causal <= 1; causal++) {
                bench_case c = {B, H, L, d, m, (method)meth, causal, FWD};
                double budget = quick ? 3.0 : 10.0;
                double sec = time_case(&c, reps, budget);
                /* The exact backward is quadratic too: time it while it stays affordable. */
                double both = NAN;
                if (meth == FAVOR || L <= max_exact_bwd) {
                    c.pass = FWD_BWD;
                    both = time_case(&c, reps, budget);
                }
                double gf = flops(&c) / sec * 1e-9;
                if (meth == EXACT) exact_t[causal] = sec;
                char name[32];
                snprintf(name, sizeof name, "%s %s", meth == EXACT ? "exact" : "FAVOR+",
                         causal ? "causal" : "bidirectional");
                printf("%7d  %-22s %10.2f %9.1f %8.0f%% %8.2fx %10.2fx\n", L, name, sec * 1e3, gf,
                       100 * gf / sg, exact_t[causal] / sec, both / sec);
                fflush(stdout);
                if (csv)
                    fprintf(csv, "%d,%s,%d,%.6g,%.6g,%.4g,%.4g\n", L,
                            meth == EXACT ? "exact" : "favor", causal, sec, both, gf, gf / sg);
            }
        }
    }
    printf("\nPeak resident memory of one causal FAVOR+ forward+backward (own process, inputs,\n"
           "outputs and gradients included):\n");
    for (int i = 0; i < nmem; i++) {
        double tensors = 8.0 * B * H * mem_lengths[i] * d * sizeof(float) / (1 << 20);
        double peak = peak_mib(mem_lengths[i]);
        printf("  L = %6d: %7.0f MiB peak; the 8 caller tensors (Q,K,V,out,dout,dQ,dK,dV) are "
               "%.0f MiB, the library's own working memory %.0f MiB\n",
               mem_lengths[i], peak, tensors, peak - tensors);
    }
    if (csv) fclose(csv);
    return 0;
}
