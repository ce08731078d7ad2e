/* bench_attn.c: attention speed against this machine's own matrix-multiply speed and its FMA
 * peak.
 *
 * Every figure is a median over repeats, and every speed is reported as a ratio to something
 * measured in the same run, since absolute times drift on a shared machine:
 *   - machine sgemm GFLOP/s: every thread running its own single-threaded cblas_sgemm of a
 *     large square product at once (inside the threads' parallel region OpenBLAS runs each call
 *     on its calling thread; this is the machine's matrix-multiply throughput with the same
 *     threads the library uses);
 *   - the fp32 FMA peak (peak.h) at the same thread count: the largest of its runs before the
 *     table's cases, after them and (20 ms each) after every timed repeat, since a probe is only
 *     ever slowed by the machine's other work; the table is printed once it is known;
 *   - exact attention, for FAVOR+.
 *
 * FLOP model (multiply-add = 2 FLOPs; B*H heads):
 *   exact, bidirectional   4 L^2 d            (Q K^T and P V, dv = d)
 *   exact, causal          2 L (L+1) d        (half the score matrix)
 *   FAVOR+ (either)        4 L m d + 4 L r dv (the Q and K projections; K'^T V and Q'(K'^T V))
 * Causal FAVOR+ is held to the bidirectional model: its extra intra-chunk work counts as cost.
 * Backward passes are reported as time ratios to their forward, each the median over repeats of
 * the ratio within one repeat (forward, forward+backward, ... run in turn): FAVOR+ both
 * recomputing the
 * features (pf_attn_favor_backward, least memory) and from the features its forward kept
 * (pf_attn_favor_save + pf_attn_favor_backward_saved, least time).
 *
 * Usage: bench_attn [--quick] [--csv FILE] [--lengths L1,L2,...]
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench.h"
#include "peak.h"
#include "performer.h"

/* ---- the machine's sgemm speed --------------------------------------------------------- */

enum { SG_N = 1024 };

/* Scratch for the probe: three SG_N^2 matrices per thread. */
static float *sgemm_buffer(int threads) {
    float *a = xmalloc(sizeof(float) * (size_t)threads * SG_N * SG_N * 3);
    fill(a, (size_t)threads * SG_N * SG_N * 3, 7, 1.0f);
    return a;
}

/* One round of the probe: every thread multiplies its own SG_N^3 at once; GFLOP/s. */
static double sgemm_once(float *a, int threads) {
    const int n = SG_N;
    double t0 = now();
#pragma omp parallel for num_threads(threads) schedule(static, 1)
    for (int i = 0; i < threads; i++) {
        float *A = a + (size_t)i * n * n * 3, *B = A + (size_t)n * n, *C = B + (size_t)n * n;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
    }
    return 2.0 * n * n * n * threads / (now() - t0) * 1e-9;
}

static double sgemm_gflops(int threads, int reps) {
    double g[16];
    float *a = sgemm_buffer(threads);
    for (int r = 0; r < 3; r++) sgemm_once(a, threads); /* warm-up: the speed climbs at first */
    for (int r = 0; r < reps; r++) g[r] = sgemm_once(a, threads);
    free(a);
    return median(g, reps);
}

/* ---- one timed case ---------------------------------------------------------------------- */

typedef enum { EXACT, FAVOR } method;
/* FWD_BWD_SAVED: the backward from the features the forward kept. FWD_BWD_REUSE: as a
 * training step that is short of memory, dout written over out once the forward's consumer is
 * done with it, and the backward recomputing what it needs of out (7 tensors, not 8). IDLE_*:
 * only allocate and touch the tensors of a forward (or forward+backward) run. */
typedef enum {
    FWD,
    FWD_BWD,
    FWD_BWD_SAVED,
    FWD_SAVE,
    FWD_BWD_REUSE,
    IDLE_FWD,
    IDLE_FWD_BWD,
    IDLE_FWD_BWD_REUSE
} pass;

typedef struct {
    int B, H, L, d, m;
    method meth;
    int causal;
    pass pass;
    int threads; /* 0: all */
} bench_case;

typedef struct {
    float *Q, *K, *V, *out, *lse, *dout, *dQ, *dK, *dV, *W;
    pf_favor_saved *saved; /* FWD_BWD_SAVED: made once, as a training loop would */
} buffers;

/* What the forward may keep for the backward (pf_favor_saved_create's max_bytes): every head
 * at the lengths where that is cheap, part of them at the longest. */
static const size_t KEEP_BUDGET = (size_t)512 << 20;

/* The heads a case keeps within KEEP_BUDGET. */
static int kept_heads(const bench_case *c, const float *W) {
    pf_shape shape = {c->B, c->H, c->L, c->L, c->d, c->d};
    pf_attn_opts opts = pf_attn_opts_default();
    opts.causal = c->causal;
    pf_favor_opts fav = pf_favor_opts_default();
    fav.W = W;
    fav.m = c->m;
    pf_favor_saved *sv = NULL;
    if (pf_favor_saved_create(&sv, &shape, &opts, &fav, KEEP_BUDGET) != PF_OK) return -1;
    const int h = pf_favor_saved_heads(sv);
    pf_favor_saved_free(sv);
    return h;
}

static int has_backward(pass p) {
    return p == FWD_BWD || p == FWD_BWD_SAVED || p == FWD_BWD_REUSE || p == IDLE_FWD_BWD ||
           p == IDLE_FWD_BWD_REUSE;
}

/* dout has a buffer of its own (else it is out's). */
static int own_dout(pass p) {
    return p != FWD_BWD_REUSE && p != IDLE_FWD_BWD_REUSE;
}

static pf_status run_once(const bench_case *c, buffers *b) {
    pf_shape shape = {c->B, c->H, c->L, c->L, c->d, c->d};
    pf_attn_opts opts = pf_attn_opts_default();
    opts.causal = c->causal;
    opts.threads = c->threads;
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
        if (c->pass == FWD_BWD_SAVED || c->pass == FWD_SAVE) {
            st = b->saved ? PF_OK
                          : pf_favor_saved_create(&b->saved, &shape, &opts, &fav, KEEP_BUDGET);
            if (st == PF_OK)
                st = pf_attn_favor_save(b->out, b->Q, b->K, b->V, &shape, &opts, &fav, b->saved);
            if (st == PF_OK && c->pass == FWD_BWD_SAVED)
                st = pf_attn_favor_backward_saved(b->dQ, b->dK, b->dV, b->dout, b->Q, b->K, b->V,
                                                  b->out, &shape, &opts, &fav, b->saved);
            return st;
        }
        st = pf_attn_favor(b->out, b->Q, b->K, b->V, &shape, &opts, &fav);
        if (st == PF_OK && c->pass == FWD_BWD_REUSE) {
            /* the loss's gradient, dout = out - t, written as a loss would: over out (in the
             * timings, where the buffers are FWD_BWD's, into dout's own) */
            const size_t n = (size_t)c->B * c->H * c->L * c->d;
            for (size_t i = 0; i < n; i++) b->dout[i] = b->out[i] - 0.25f;
            return pf_attn_favor_backward(b->dQ, b->dK, b->dV, b->dout, b->Q, b->K, b->V, NULL,
                                          &shape, &opts, &fav);
        }
        if (st == PF_OK && c->pass == FWD_BWD)
            st = pf_attn_favor_backward(b->dQ, b->dK, b->dV, b->dout, b->Q, b->K, b->V, b->out,
                                        &shape, &opts, &fav);
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
    fill(b->out, n, 8, 1.0f);
    if (c->meth == EXACT) {
        b->lse = xmalloc((size_t)c->B * c->H * c->L * sizeof(float));
        fill(b->lse, (size_t)c->B * c->H * c->L, 9, 1.0f);
    }
    fill(b->Q, n, 1, 1.0f);
    fill(b->K, n, 2, 1.0f);
    fill(b->V, n, 3, 1.0f);
    if (has_backward(c->pass)) {
        b->dout = own_dout(c->pass) ? xmalloc(n * sizeof(float)) : b->out;
        b->dQ = xmalloc(n * sizeof(float));
        b->dK = xmalloc(n * sizeof(float));
        b->dV = xmalloc(n * sizeof(float));
        fill(b->dout, n, 4, 1.0f);
        /* Touch the outputs, as a run would, so that they count in every resident figure
         * (with values: malloc + memset(0) may become calloc, which touches nothing). */
        fill(b->dQ, n, 5, 1.0f);
        fill(b->dK, n, 6, 1.0f);
        fill(b->dV, n, 7, 1.0f);
    }
    b->W = xmalloc((size_t)c->m * c->d * sizeof(float));
    pf_projection_draw(b->W, c->m, c->d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 0, 0);
}

static void buffers_free(buffers *b) {
    if (b->dout != b->out) free(b->dout);
    free(b->Q), free(b->K), free(b->V), free(b->out), free(b->lse);
    free(b->dQ), free(b->dK), free(b->dV), free(b->W);
    pf_favor_saved_free(b->saved);
}

static double flops(const bench_case *c);

/* One line of the table. */
typedef struct {
    int L, causal, heads;
    method meth;
    double med[4], ratio[4]; /* time_passes' */
    double frac;             /* of sgemm */
    double gf, vs_exact, mem_f, mem_b, mem_s;
} table_row;

static const char *row_name(const table_row *w) {
    static const char *const names[2][2] = {{"exact bidirectional", "exact causal"},
                                            {"FAVOR+ bidirectional", "FAVOR+ causal"}};
    return names[w->meth == FAVOR][w->causal != 0];
}

/* The FMA peak probe's short runs, one after each repeat of the table's cases. */
static peak_sampler fma_during;

/* np passes of a case run in turn in each repeat, after a
 * warm-up, until `reps` repeats or `budget` seconds: med[p] the median seconds of pass p and
 * ratio[p] the median over repeats of its time over pass 0's in the same repeat (so that the
 * shared machine's drifts cancel). NAN on failure. With sg (sgemm_buffer) each repeat also runs
 * the sgemm probe, and *sg_frac is the median over repeats of pass 0's GFLOP/s (flops model)
 * over the probe's in that repeat, and a short run of the FMA peak probe follows (fma_during). */
static void time_passes(const bench_case *c, const pass *ps, int np, int reps, double budget,
                        double *med, double *ratio, float *sg, int threads, double *sg_frac) {
    enum { MAXR = 64, MAXP = 4 };
    bench_case cs[MAXP];
    buffers b;
    bench_case all = *c; /* (tensors for every pass) */
    all.pass = ps[0];
    for (int p = 0; p < np; p++)
        if (has_backward(ps[p])) all.pass = FWD_BWD;
    buffers_make(&b, &all);
    for (int p = 0; p < np; p++) cs[p] = *c, cs[p].pass = ps[p];
    double t[MAXP][MAXR], q[MAXP][MAXR], fr[MAXR];
    int n = 0;
    /* Warm-up: at least two rounds and 0.2 s, so that threads, caches and the CPU's clock have
     * settled before the first timed call (one call was not enough for the first case). */
    pf_status st = PF_OK;
    double start = now();
    for (int w = 0; st == PF_OK && (w < 2 || (now() - start < 0.2 && w < 50)); w++)
        for (int p = 0; p < np && st == PF_OK; p++) st = run_once(&cs[p], &b);
    start = now();
    while (st == PF_OK && n < reps && n < MAXR) {
        for (int p = 0; p < np && st == PF_OK; p++) {
            double t0 = now();
            st = run_once(&cs[p], &b);
            t[p][n] = now() - t0;
        }
        for (int p = 0; p < np; p++) q[p][n] = t[p][n] / t[0][n];
        if (sg) {
            fr[n] = flops(c) / t[0][n] * 1e-9 / sgemm_once(sg, threads);
            peak_sample(&fma_during);
        }
        n++;
        if (now() - start > budget) break;
    }
    buffers_free(&b);
    for (int p = 0; p < np; p++) {
        med[p] = st == PF_OK ? median(t[p], n) : NAN;
        ratio[p] = st == PF_OK ? median(q[p], n) : NAN;
    }
    if (sg) *sg_frac = st == PF_OK ? median(fr, n) : NAN;
    if (st != PF_OK) fprintf(stderr, "bench: %s\n", pf_status_str(st));
}

/* Median seconds of a case: a warm-up, then repeats until `reps` runs or `budget` seconds. */
static double time_case(const bench_case *c, int reps, double budget) {
    double med, ratio;
    const pass p = c->pass;
    time_passes(c, &p, 1, reps, budget, &med, &ratio, NULL, 0, NULL);
    return med;
}

/* Peak resident memory (MiB) of one run of a case, measured in a fresh process (this program
 * re-executed with --peak), so that each figure is that case's own peak; a forked copy of a
 * process that has run OpenMP threads cannot safely start threads of its own. The child reports
 * its own high-water mark (VmHWM) through a pipe: the rusage of a child counts the size of the
 * parent it was forked from, which is not this case's. */
static double peak_mib_once(const bench_case *c) {
    char args[5][24];
    snprintf(args[0], sizeof args[0], "%d", c->L);
    snprintf(args[1], sizeof args[1], "%d", (int)c->meth);
    snprintf(args[2], sizeof args[2], "%d", c->causal);
    snprintf(args[3], sizeof args[3], "%d", (int)c->pass);
    fflush(stdout);
    int fd[2];
    if (pipe(fd) != 0) return NAN;
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]), close(fd[1]);
        return NAN;
    }
    if (pid == 0) {
        close(fd[0]);
        if (dup2(fd[1], STDOUT_FILENO) < 0) _exit(127);
        execl("/proc/self/exe", "bench_attn", "--peak", args[0], args[1], args[2], args[3],
              (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char buf[64] = {0};
    read_all(fd[0], buf, sizeof buf);
    int status = 0;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return NAN;
    long kib = strtol(buf, NULL, 10);
    return kib > 0 ? (double)kib / 1024.0 : NAN;
}

/* The median of three such figures (a process's peak size varies by a few MiB run to run). */
static double peak_mib(const bench_case *c) {
    double t[3];
    for (int i = 0; i < 3; i++) t[i] = peak_mib_once(c);
    return median(t, 3);
}

/* The child of peak_mib: one run (or, for IDLE, only the buffers); prints its peak resident
 * size in KiB; exit status 0 on success. */
static int peak_child(const bench_case *c) {
    buffers b;
    buffers_make(&b, c);
    pf_status st = c->pass >= IDLE_FWD ? PF_OK : run_once(c, &b);
    buffers_free(&b);
    printf("%ld\n", vm_hwm_kib());
    return st == PF_OK ? 0 : 1;
}

static double flops(const bench_case *c) {
    double L = c->L, d = c->d, m = c->m, heads = (double)c->B * c->H;
    if (c->meth == EXACT) return heads * (c->causal ? 2.0 * L * (L + 1) * d : 4.0 * L * L * d);
    return heads * (4.0 * L * m * d + 4.0 * L * m * d);
}

static void usage(void) {
    fprintf(stderr, "usage: bench_attn [--quick] [--csv FILE] [--lengths L1,L2,...] "
                    "[--max-exact L]\n");
}

int main(int argc, char **argv) {
    int quick = 0;
    const char *csv_path = NULL;
    int lengths[16] = {512, 1024, 2048, 4096, 8192, 16384, 32768, 65536}, nlen = 8;
    int mem_lengths[2] = {65536, 131072}, nmem = 2;
    int max_exact = 16384;    /* exact attention is timed up to this length */
    int max_exact_bwd = 8192; /* and its backward up to this one */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
            nmem = 1;
            lengths[0] = 1024, lengths[1] = 4096, nlen = 2;
            max_exact_bwd = 4096;
        } else if (strcmp(argv[i], "--peak") == 0 && i + 4 < argc) {
            bench_case c = {1,
                            8,
                            atoi(argv[i + 1]),
                            64,
                            256,
                            (method)atoi(argv[i + 2]),
                            atoi(argv[i + 3]),
                            (pass)atoi(argv[i + 4]),
                            0};
            return peak_child(&c);
        } else if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
            csv_path = argv[++i];
        } else if (strcmp(argv[i], "--max-exact") == 0 && i + 1 < argc) {
            max_exact = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--lengths") == 0 && i + 1 < argc) {
            nlen = 0;
            for (char *s = strtok(argv[++i], ","); s && nlen < 16; s = strtok(NULL, ","))
                if ((lengths[nlen] = atoi(s)) > 0) nlen++;
        } else {
            usage();
            return 2;
        }
    }
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    const int B = 1, H = 8, d = 64, m = 256;
    float W[256 * 64]; /* (for kept_heads' checks) */
    pf_projection_draw(W, m, d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 0, 0);
    const int reps = quick ? 3 : 7;
    char csv_tmp[4096];
    FILE *csv;
    if (csv_open(&csv, csv_tmp, sizeof csv_tmp, csv_path, "bench_attn") != 0) return 1;
    const peak_fma pk0 = peak_measure(threads);
    peak_sampler_init(&fma_during, threads, 0.02);
    double sg = sgemm_gflops(threads, reps);
    float *sgbuf = sgemm_buffer(threads);
    char cpu[192], blas[128];
    cpu_name(cpu, sizeof cpu);
    blas_kernels(blas, sizeof blas);

    /* The table's cases, timed first and printed once the FMA peak has been measured again
     * after them (progress on stderr meanwhile). */
    enum { MAXROWS = 64 };
    table_row rows[MAXROWS];
    int nrows = 0;
    for (int li = 0; li < nlen; li++) {
        int L = lengths[li];
        double exact_t[2] = {NAN, NAN};

        /* Baselines: processes holding the tensors of a forward, and of a forward+backward. */
        bench_case idle_f = {B, H, L, d, m, FAVOR, 0, IDLE_FWD, 0}, idle_b = idle_f;
        idle_b.pass = IDLE_FWD_BWD;
        double base_fwd = peak_mib(&idle_f), base_b = peak_mib(&idle_b);
        for (int meth = EXACT; meth <= FAVOR; meth++) {
            if (meth == EXACT && L > max_exact) continue;
            for (int causal = 0; causal <= 1 && nrows < MAXROWS; causal++) {
                bench_case c = {B, H, L, d, m, (method)meth, causal, FWD, 0};
                double budget = quick ? 3.0 : 10.0;
                /* forward, forward+backward and (FAVOR+) forward+backward with the features
                 * kept, in turn; the exact backward is quadratic too: timed while affordable */
                const pass ps[4] = {FWD, FWD_BWD, FWD_BWD_SAVED, FWD_SAVE};
                const int np = meth == FAVOR ? 4 : (L <= max_exact_bwd ? 2 : 1);
                table_row *w = &rows[nrows++];
                for (int p = 0; p < 4; p++) w->med[p] = w->ratio[p] = NAN;
                time_passes(&c, ps, np, reps, budget, w->med, w->ratio, sgbuf, threads, &w->frac);
                w->L = L, w->meth = (method)meth, w->causal = causal;
                w->heads = meth == FAVOR ? kept_heads(&c, W) : 0;
                w->mem_f = peak_mib(&c) - base_fwd, w->mem_b = NAN, w->mem_s = NAN;
                if (np > 1) {
                    c.pass = FWD_BWD;
                    w->mem_b = peak_mib(&c) - base_b;
                }
                if (np > 2) {
                    c.pass = FWD_BWD_SAVED;
                    w->mem_s = peak_mib(&c) - base_b;
                }
                c.pass = FWD;
                w->gf = flops(&c) / w->med[0] * 1e-9;
                if (meth == EXACT) exact_t[causal] = w->med[0];
                w->vs_exact = exact_t[causal] / w->med[0];
                fprintf(stderr, "bench_attn: L = %d %s: %.2f ms\n", L, row_name(w),
                        w->med[0] * 1e3);
            }
        }
    }
    const peak_fma pk1 = peak_measure(threads);
    peak_fma pk = peak_max(pk0, pk1);
    pk.gn = fma_during.best > pk.gn ? fma_during.best : pk.gn;

    printf("performer %s on %s, %d threads, vector kernels %s, OpenBLAS kernels %s\n"
           "machine sgemm: %.1f GFLOP/s (OpenBLAS, median of %d, %d x 1024^3; \"of sgemm\" is the\n"
           "median over repeats of the forward's GFLOP/s over that of the same probe run right\n"
           "after it, as this shared machine's speed drifts; exact attention's products run in\n"
           "OpenBLAS, FAVOR+'s in the library's own vector kernels)\n",
           pf_version(), cpu, threads, pf_simd_path(), blas, sg, reps, threads);
    printf("fp32 FMA peak (%s, registers only, bench/peak.h): %.1f GFLOP/s on 1 thread,\n"
           "%.1f on %d (%.2fx). Each the largest of its runs: 3 of 0.2 s before the cases (%.1f,\n"
           "%.1f), 3 after them (%.1f, %.1f) and, on %d threads, one of 20 ms after every timed\n"
           "repeat (%d runs, best %.1f). \"of FMA\" is the forward's GFLOP/s over the %d-thread\n"
           "peak; the sgemm probe is %.0f%% of it\n",
           peak_isa_name(pk.isa), pk.g1, pk.gn, threads, pk.gn / pk.g1, pk0.g1, pk0.gn, pk1.g1,
           pk1.gn, threads, fma_during.runs, fma_during.best, threads, 100 * sg / pk.gn);
    if (threads > 1 && pk.gn < 0.8 * threads * pk.g1)
        printf("(%d threads gave less than %.1fx one thread: the cores were busy with other work "
               "or share\ntheir FMA units; every fraction of the %d-thread peak is then too "
               "high)\n",
               threads, 0.8 * threads, threads);
    printf("B=%d H=%d d=%d m=%d, positive features, orthogonal W; times are medians; memory is\n"
           "the peak resident size of a process running one call, less that of one only holding\n"
           "the same tensors (the method's own working memory)\n\n",
           B, H, d, m);
    printf("fwd+bwd/f: the recomputing backward; kept/f and kept MiB: the backward from the\n"
           "features the forward kept (pf_attn_favor_save) for as many heads as fit in %zu MiB\n"
           "(kept/f is to the plain forward, kept/kf to the keeping forward)\n\n",
           KEEP_BUDGET >> 20);
    printf("%7s  %-21s %9s %8s %8s %7s %8s %10s %9s %9s %6s %8s %8s %9s\n", "L", "method", "fwd ms",
           "GFLOP/s", "of sgemm", "of FMA", "vs exact", "fwd+bwd/f", "fwd MiB", "f+b MiB", "heads",
           "kept/f", "kept/kf", "kept MiB");
    if (csv)
        fprintf(csv, "L,method,causal,fwd_seconds,fwdbwd_seconds,gflops,sgemm_fraction,"
                     "fwd_mib,fwdbwd_mib,saved_seconds,saved_mib,saved_heads,"
                     "save_fwd_seconds,fma_fraction,fma_peak_gflops,sgemm_gflops,machine\n");
    for (int i = 0; i < nrows; i++) {
        const table_row *w = &rows[i];
        const double fma = w->gf / pk.gn;
        char cv[6][24];
        printf("%7d  %-21s %9.2f %8.1f %7.0f%% %6.0f%% %8s %10s %9.1f %9s %6d %8s %8s %9s\n", w->L,
               row_name(w), w->med[0] * 1e3, w->gf, 100 * w->frac, 100 * fma,
               cell(cv[0], "%.2fx", w->vs_exact), cell(cv[1], "%.2fx", w->ratio[1]), w->mem_f,
               cell(cv[2], "%.1f", w->mem_b), w->heads, cell(cv[3], "%.2fx", w->ratio[2]),
               cell(cv[4], "%.2fx", w->ratio[2] / w->ratio[3]), cell(cv[5], "%.1f", w->mem_s));
        if (csv)
            fprintf(csv,
                    "%d,%s,%d,%.6g,%.6g,%.4g,%.4g,%.4g,%.4g,%.6g,%.4g,%d,%.6g,%.4g,%.4g,%.4g,"
                    "\"%s, vector kernels %s, OpenBLAS kernels %s\"\n",
                    w->L, w->meth == EXACT ? "exact" : "favor", w->causal, w->med[0], w->med[1],
                    w->gf, w->frac, w->mem_f, w->mem_b, w->med[2], w->mem_s, w->heads, w->med[3],
                    fma, pk.gn, sg, cpu, pf_simd_path(), blas);
    }
    fflush(stdout);
    if (csv_commit(&csv, csv_tmp, csv_path, "bench_attn") != 0) {
        free(sgbuf);
        return 1;
    }
    if (threads > 1) {
        /* One head alone must still use every core (work is split over row blocks). */
        printf("\nOne head (B = H = 1, L = 65536), %d threads against 1:\n", threads);
        for (int causal = 0; causal <= 1; causal++) {
            bench_case one = {1, 1, 65536, d, m, FAVOR, causal, FWD, 1}, all = one;
            all.threads = threads;
            double t1 = time_case(&one, reps, 5.0), tn = time_case(&all, reps, 5.0);
            const double g1 = flops(&one) * 1e-9 / t1, gn = flops(&all) * 1e-9 / tn;
            printf("  FAVOR+ %-13s forward: %.2f ms on 1 thread (%.0f%% of its FMA peak), "
                   "%.2f ms on %d (%.0f%%): %.2fx\n",
                   causal ? "causal" : "bidirectional", t1 * 1e3, 100 * g1 / pk.g1, tn * 1e3,
                   threads, 100 * gn / pk.gn, t1 / tn);
        }
    }
    {
        /* what the 7-tensor step costs in time: the backward recomputes out's numerators */
        const pass ps[2] = {FWD_BWD, FWD_BWD_REUSE};
        bench_case c = {B, H, 4096, d, m, FAVOR, 1, FWD_BWD, 0};
        double med[2], ratio[2];
        time_passes(&c, ps, 2, reps, 10.0, med, ratio, NULL, 0, NULL);
        printf("\nCausal FAVOR+ forward+backward at L = 4096 with dout written over out (the "
               "backward\ngiven no out): %.2f ms, %.2fx the time with out given\n",
               med[1] * 1e3, ratio[1]);
    }
    printf("\nPeak resident memory of one causal FAVOR+ forward+backward, whole process:\n");
    for (int i = 0; i < nmem; i++) {
        bench_case c = {B, H, mem_lengths[i], d, m, FAVOR, 1, FWD_BWD, 0}, idle = c;
        idle.pass = IDLE_FWD_BWD;
        double tensors = 8.0 * B * H * mem_lengths[i] * d * sizeof(float) / (1 << 20);
        double peak = peak_mib(&c), base = peak_mib(&idle);
        printf("  L = %6d: %6.0f MiB; the caller's 8 tensors (Q,K,V,out,dout,dQ,dK,dV) are "
               "%.0f MiB; the library's working memory %.0f MiB\n",
               mem_lengths[i], peak, tensors, peak - base);
        c.pass = FWD_BWD_SAVED;
        peak = peak_mib(&c);
        const int kh = kept_heads(&c, W);
        printf("  %10s  %6.0f MiB with the features of %d head%s kept (library: %.0f MiB)\n", "",
               peak, kh, kh == 1 ? "" : "s", peak - base);
        c.pass = FWD_BWD_REUSE, idle.pass = IDLE_FWD_BWD_REUSE;
        peak = peak_mib(&c), base = peak_mib(&idle);
        printf("  %10s  %6.0f MiB with dout written over out and the backward given no out: 7 "
               "tensors, %.0f MiB (library: %.0f MiB)\n",
               "", peak, tensors * 7 / 8, peak - base);
    }
    free(sgbuf);
    return 0;
}
