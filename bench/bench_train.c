/* bench_train.c: a full training step of the byte language model (forward with targets,
 * backward, AdamW) against the context length, exact attention against FAVOR+: tokens per
 * second, the step's split into forward, backward and optimizer, peak memory, and the model's
 * arithmetic as a fraction of this machine's FMA peak measured in the same run.
 *
 * Every step does the same number of tokens (--tokens, batch = tokens / context, at least 1), so
 * a context's cost per token is what changes. Each case runs in its own process (this program
 * re-executed with a hidden flag): it creates the model (pf_model_create, training mode), takes
 * one warm-up step (activations allocated, FAVOR+ features storage made), then timed steps, at
 * least 2 and more while the case's time budget (--budget) lasts, at most 5; the figures are
 * medians over them (each part its own median). The process then reports its own peak resident
 * size (VmHWM), so that each case's memory is its own. Random bytes (the library's generator) are
 * the tokens; the targets are the next bytes.
 *
 * The cases of one context run one after the other (exact, then FAVOR+), so that the shared
 * machine's drifts fall on both alike, and "exact/FAVOR+" is their ratio. Before a case runs:
 *   - memory: an estimate of what it holds (parameters, gradients and AdamW moments; every
 *     layer's activations and one layer's activation gradients as src/model/model.c sizes them;
 *     for FAVOR+ the features each layer's forward keeps for its backward, sized by
 *     pf_favor_saved_create; for exact the backward's tiles). Exact attention here keeps no
 *     T x T matrix: its forward keeps q, k, v, out and the log-sum-exp per layer, and its
 *     backward recomputes the probabilities block by block (src/attn_exact.c), so at a fixed
 *     number of tokens its memory does not grow with the context. A case whose estimate
 *     exceeds --max-gib is not run ("does not fit"), and the process running a case has an
 *     address-space limit (RLIMIT_AS, --as-limit-gib, default max-gib + 4) so that a
 *     misestimate ends in PF_ENOMEM (an "out of memory" row), not in the kernel's OOM killer;
 *   - time: a step estimated, from the same method's previous context scaled by the model's
 *     FLOPs, to take longer than --max-step-seconds is not run; a case process that runs past
 *     60 s + 6 x max-step-seconds is stopped (SIGALRM) and its row says so.
 *
 * FLOP model (multiply-add = 2 FLOPs), per token, forward + backward = 3 x forward:
 *   matrix products     6 N, N = 12 L C^2 + 256 C: the weights of the qkv, output, and the two
 *                       MLP products of every layer and of the tied output layer (wte^T). The
 *                       embedding lookups, biases, norms, GELU and softmax are not counted.
 *   exact, causal       6 L C (T + 1): per layer and head, the query at position t sees t + 1
 *                       keys, 2 hd (t + 1) for q.K^T and as much for P V; over t < T that is
 *                       2 hd (T + 1) a token on average, H heads give 2 C (T + 1), times 3. The
 *                       backward's recomputation of the probabilities is not counted (it is
 *                       cost, as in the usual model-FLOPs convention).
 *   FAVOR+, causal      12 L m (2 C + H): per layer and head, the projections of q and k on W
 *                       (m x hd) 2 x 2 m hd, the prefix sums' state update k~ [v | 1]
 *                       2 m (hd + 1) and readout q~ [S | z] 2 m (hd + 1): 4 m hd + 4 m (hd + 1),
 *                       H heads 4 m (2 C + H), times 3. The exponentials and the chunked causal
 *                       scheme's intra-chunk work are not counted (they are cost).
 * GFLOP/s is that model over the median step time; "of FMA" its fraction of the fp32 FMA peak on
 * all threads (peak.h: training runs on every thread), the largest of the probe's runs before the
 * cases, between them (parent process, no case running) and after them.
 *
 * Usage: bench_train [--help] [--quick] [--csv FILE] [--contexts T1,T2,...] [--tokens N]
 *                    [--layers L] [--d-model C] [--heads H] [--features M] [--budget S]
 *                    [--max-gib G] [--as-limit-gib G] [--max-step-seconds S]
 */
#define _DEFAULT_SOURCE
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench.h"
#include "peak.h"
#include "performer.h"

typedef enum { EXACT, FAVOR } method;

static const char *method_name(method m) {
    return m == EXACT ? "exact" : "FAVOR+";
}

/* The model of every case but for its context and batch. */
typedef struct {
    int layers, d_model, heads, features;
} model_shape;

enum { MIN_STEPS = 2, MAX_STEPS = 5 };

/* ---- model FLOPs and memory, from the shapes ------------------------------------------- */

/* N of the FLOP model: the weights of the matrix products. */
static double dense_params(const model_shape *s) {
    const double L = s->layers, C = s->d_model;
    return 12.0 * L * C * C + (double)PF_LM_VOCAB * C;
}

/* Model FLOPs per token of a training step (header comment). */
static double flops_per_token(const model_shape *s, method meth, int T) {
    const double L = s->layers, C = s->d_model, H = s->heads, m = s->features;
    const double attn = meth == EXACT ? 6.0 * L * C * (T + 1.0) : 12.0 * L * m * (2.0 * C + H);
    return 6.0 * dense_params(s) + attn;
}

/* Every trainable parameter (pf_model_num_params; learned positions). */
static double all_params(const model_shape *s, int T) {
    const double L = s->layers, C = s->d_model;
    return (double)PF_LM_VOCAB * C + (double)T * C + L * (12.0 * C * C + 13.0 * C) + 2.0 * C;
}

/* Bytes a case holds at its peak, estimated (header comment); 0 if FAVOR+'s storage cannot be
 * sized (a shape the library refuses). */
static double estimate_bytes(const model_shape *s, method meth, int B, int T, int threads) {
    const double C = s->d_model, H = s->heads, L = s->layers, V = PF_LM_VOCAB;
    const double BT = (double)B * T;
    double bytes = 4.0 * 4.0 * all_params(s, T); /* params, grads, m, v */
    bytes += 4.0 * BT * (C + L * (21.0 * C + H + 4.0) + C + 3.0 + 2.0 * V); /* activations */
    bytes += 4.0 * BT * (18.0 * C + V); /* activation gradients */
    bytes += 4.0 * 4.0 * BT;            /* tokens, targets (twice) */
    const int hd = s->d_model / s->heads;
    if (meth == FAVOR) {
        pf_shape shape = {B, s->heads, T, T, hd, hd};
        pf_attn_opts opts = pf_attn_opts_default();
        opts.causal = 1;
        pf_favor_opts fav = pf_favor_opts_default();
        float *W = xmalloc(sizeof(float) * (size_t)s->features * (size_t)hd);
        pf_projection_draw(W, s->features, hd, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 0, 0);
        fav.W = W;
        fav.m = s->features;
        pf_favor_saved *sv = NULL;
        /* (storage is allocated here, untouched, and freed) */
        pf_status st = pf_favor_saved_create(&sv, &shape, &opts, &fav, 0);
        free(W);
        if (st != PF_OK) return 0;
        bytes += L * (double)pf_favor_saved_bytes(sv);
        pf_favor_saved_free(sv);
        bytes += 4.0 * L * s->features * hd; /* W */
    } else {
        bytes += 4.0 * threads * 2.0 * 128 * 512 + 4.0 * BT * H; /* backward tiles, D */
    }
    return bytes;
}

/* ---- one case, in a process of its own ------------------------------------------------- */

/* CPU seconds of this process (every thread), or of the calling thread. */
static double cpu_seconds(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The case process: prints one line on stdout,
 *   ok PARAMS STEPS FWD BWD OPT TOTAL HWM_KIB LOSS CPU   (seconds: medians; the last step's
 *                                                       loss; CPU: the process's CPU seconds)
 * or
 *   fail STATUS HWM_KIB WHERE
 * and returns 0 (ok) or 1. */
static int case_child(const model_shape *s, method meth, int B, int T, double budget) {
    pf_model_config cfg = pf_model_config_default();
    cfg.context = T;
    cfg.layers = s->layers;
    cfg.d_model = s->d_model;
    cfg.heads = s->heads;
    cfg.attention = meth == EXACT ? PF_LM_EXACT : PF_LM_FAVOR;
    cfg.positions = PF_LM_LEARNED;
    cfg.kernel = PF_KERNEL_POSITIVE;
    cfg.features = s->features;
    const char *where = "create";
    pf_model *model = NULL;
    pf_status st = pf_model_create(&model, &cfg);
    const size_t n = (size_t)B * T;
    int32_t *tok = malloc(sizeof(int32_t) * (n + 1)), *tgt = malloc(sizeof(int32_t) * n);
    if (st == PF_OK && (!tok || !tgt)) st = PF_ENOMEM;
    if (st == PF_OK) st = pf_model_set_training(model, 1);
    if (st == PF_OK) {
        /* random bytes; row b of the targets is row b of the tokens shifted by one */
        pf_rng rng;
        pf_rng_init(&rng, 11, 0);
        for (size_t i = 0; i <= n; i++) tok[i] = (int32_t)(pf_rng_u32(&rng) & 255u);
        for (size_t i = 0; i < n; i++) tgt[i] = tok[i + 1];
    }
    const pf_adamw opt = pf_adamw_default();
    double t[3][MAX_STEPS], tot[MAX_STEPS], cpu[MAX_STEPS];
    float loss = NAN;
    int steps = 0;
    double start = 0;
    for (int k = -1; st == PF_OK && k < MAX_STEPS; k++) { /* k = -1: the warm-up */
        if (k == 0) start = now();
        if (k >= MIN_STEPS && now() - start > budget) break;
        const double c0 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID), t0 = now();
        where = "forward";
        st = pf_model_forward(model, &loss, NULL, tok, tgt, B, T);
        const double t1 = now();
        if (st == PF_OK) where = "backward", st = pf_model_backward(model);
        const double t2 = now();
        if (st == PF_OK) where = "optimizer step", st = pf_model_step(model, &opt, NULL);
        const double t3 = now(), c3 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
        if (st == PF_OK && !isfinite(loss)) where = "forward (loss)", st = PF_ENONFINITE;
        if (st == PF_OK && k >= 0) {
            t[0][k] = t1 - t0, t[1][k] = t2 - t1, t[2][k] = t3 - t2, tot[k] = t3 - t0;
            cpu[k] = c3 - c0;
            steps = k + 1;
        }
    }
    const long hwm = vm_hwm_kib();
    if (st == PF_OK) {
        printf("ok %lld %d %.9g %.9g %.9g %.9g %ld %.6g %.9g\n",
               (long long)pf_model_num_params(model), steps, median(t[0], steps),
               median(t[1], steps), median(t[2], steps), median(tot, steps), hwm, (double)loss,
               median(cpu, steps));
    } else {
        printf("fail %d %ld %s\n", (int)st, hwm, where);
    }
    fflush(stdout);
    pf_model_free(model);
    free(tok);
    free(tgt);
    return st == PF_OK ? 0 : 1;
}

/* The FMA probe's loop (peak.h) on the calling thread, in GFLOP per second of that thread's CPU
 * time: what a core does while it runs one of this program's threads, whatever else the shared
 * machine runs (the wall-clock probe counts the time the other work takes the cores). */
static double peak_per_cpu_second(peak_isa isa, long iters) {
    const double c0 = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
    peak_sink = peak_sink + peak_loop(isa, iters);
    const double c = cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - c0;
    return 2.0 * PEAK_NACC * peak_lanes(isa) * (double)iters / c * 1e-9;
}

static void max_into(double *best, double v) {
    *best = v > *best ? v : *best;
}

/* ---- the parent ------------------------------------------------------------------------- */

typedef enum { RUN_OK, RUN_NOFIT, RUN_TOOLONG, RUN_NOMEM, RUN_FAILED } row_status;

typedef struct {
    int T, B;
    method meth;
    row_status status;
    char note[160];
    long long params;
    int steps;
    double fwd, bwd, opt, total; /* seconds */
    double cpu;                  /* CPU seconds of a step, every thread */
    double peak_mib, est_mib, flops_tok, loss;
    double exact_time, exact_mem; /* FAVOR+ rows: exact's over this row's (same context) */
} row;

/* Runs one case in a fresh process (this program re-executed; a forked copy of a process that
 * has run OpenMP threads cannot safely start threads of its own) with an address-space limit
 * of as_bytes and an alarm of timeout seconds, and fills the row from its line. */
static void run_case(row *w, const model_shape *s, double budget, double as_bytes,
                     unsigned timeout) {
    char a[8][32];
    snprintf(a[0], sizeof a[0], "%d", w->T);
    snprintf(a[1], sizeof a[1], "%d", (int)w->meth);
    snprintf(a[2], sizeof a[2], "%d", w->B);
    snprintf(a[3], sizeof a[3], "%d", s->layers);
    snprintf(a[4], sizeof a[4], "%d", s->d_model);
    snprintf(a[5], sizeof a[5], "%d", s->heads);
    snprintf(a[6], sizeof a[6], "%d", s->features);
    snprintf(a[7], sizeof a[7], "%.6g", budget);
    fflush(stdout);
    fflush(stderr);
    w->status = RUN_FAILED;
    int fd[2];
    if (pipe(fd) != 0) {
        snprintf(w->note, sizeof w->note, "failed: pipe: %s", strerror(errno));
        return;
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]), close(fd[1]);
        snprintf(w->note, sizeof w->note, "failed: fork: %s", strerror(errno));
        return;
    }
    if (pid == 0) {
        close(fd[0]);
        if (dup2(fd[1], STDOUT_FILENO) < 0) _exit(127);
        struct rlimit rl;
        rl.rlim_cur = rl.rlim_max = (rlim_t)as_bytes;
        setrlimit(RLIMIT_AS, &rl);
        alarm(timeout); /* (kept across exec) */
        execl("/proc/self/exe", "bench_train", "--case", a[0], a[1], a[2], a[3], a[4], a[5], a[6],
              a[7], (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char buf[512] = {0};
    read_all(fd[0], buf, sizeof buf);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) {
            snprintf(w->note, sizeof w->note, "failed: waitpid: %s", strerror(errno));
            return;
        }
    long long params = 0;
    int steps = 0, code = 0;
    long hwm = -1;
    double f, b, o, tt, loss, cpu;
    char where[64] = "";
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
        sscanf(buf, "ok %lld %d %lf %lf %lf %lf %ld %lf %lf", &params, &steps, &f, &b, &o, &tt,
               &hwm, &loss, &cpu) == 9) {
        w->status = RUN_OK;
        w->params = params, w->steps = steps;
        w->fwd = f, w->bwd = b, w->opt = o, w->total = tt, w->loss = loss;
        w->cpu = cpu;
        w->peak_mib = hwm > 0 ? (double)hwm / 1024.0 : NAN;
    } else if (sscanf(buf, "fail %d %ld %63[^\n]", &code, &hwm, where) >= 2) {
        w->status = code == PF_ENOMEM ? RUN_NOMEM : RUN_FAILED;
        w->peak_mib = hwm > 0 ? (double)hwm / 1024.0 : NAN;
        if (code == PF_ENOMEM)
            snprintf(w->note, sizeof w->note,
                     "out of memory in the %s (address-space limit %.1f GiB)", where,
                     as_bytes / 1073741824.0);
        else
            snprintf(w->note, sizeof w->note, "failed in the %s: %s", where,
                     pf_status_str((pf_status)code));
    } else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
        snprintf(w->note, sizeof w->note, "stopped after %u s (time limit)", timeout);
    } else if (WIFSIGNALED(status)) {
        snprintf(w->note, sizeof w->note, "failed: killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    } else {
        snprintf(w->note, sizeof w->note, "failed: exit status %d (address-space limit %.1f GiB)",
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1, as_bytes / 1073741824.0);
    }
}

static void usage(void) {
    fprintf(
        stderr,
        "usage: bench_train [--help] [--quick] [--csv FILE] [--contexts T1,T2,...]\n"
        "                   [--tokens N] [--layers L] [--d-model C] [--heads H] [--features M]\n"
        "                   [--budget SECONDS] [--max-gib G] [--as-limit-gib G]\n"
        "                   [--max-step-seconds S]\n"
        "  a training step (forward, backward, AdamW) of the byte LM, exact and FAVOR+,\n"
        "  against the context; defaults: contexts 256..32768 (doubling), tokens 32768 a step,\n"
        "  4 layers, d_model 128, 4 heads, 128 features, budget 15 s a case, max-gib 16,\n"
        "  as-limit-gib max-gib + 4, max-step-seconds 300\n");
}

/* argv[i] as an int in [lo, hi] into *v; 0 if it is not one. */
static int parse_int(const char *s, long lo, long hi, int *v) {
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || end == s || *end || x < lo || x > hi) return 0;
    *v = (int)x;
    return 1;
}

static int parse_double(const char *s, double lo, double hi, double *v) {
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (errno || end == s || *end || !(x >= lo && x <= hi)) return 0;
    *v = x;
    return 1;
}

static const char *status_name(row_status s) {
    static const char *const names[] = {"ok", "does_not_fit", "too_long", "out_of_memory",
                                        "failed"};
    return names[s];
}

int main(int argc, char **argv) {
    if (argc == 10 && strcmp(argv[1], "--case") == 0) {
        model_shape s;
        int T, meth, B;
        double budget;
        if (!parse_int(argv[2], 1, PF_LM_MAX_CONTEXT, &T) || !parse_int(argv[3], 0, 1, &meth) ||
            !parse_int(argv[4], 1, INT32_MAX, &B) || !parse_int(argv[5], 1, 1 << 20, &s.layers) ||
            !parse_int(argv[6], 1, 1 << 20, &s.d_model) ||
            !parse_int(argv[7], 1, 1 << 20, &s.heads) ||
            !parse_int(argv[8], 1, 1 << 20, &s.features) || !parse_double(argv[9], 0, 1e9, &budget))
            return 2;
        return case_child(&s, (method)meth, B, T, budget);
    }
    model_shape s = {4, 128, 4, 128};
    int contexts[32] = {256, 512, 1024, 2048, 4096, 8192, 16384, 32768}, nctx = 8;
    int tokens = 32768, quick = 0, tokens_set = 0, contexts_set = 0;
    double budget = 15.0, max_gib = 16.0, as_gib = NAN, max_step = 300.0;
    const char *csv_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int more = i + 1 < argc;
        int ok = 1;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage();
            return 0;
        } else if (strcmp(a, "--quick") == 0) {
            quick = 1;
        } else if (strcmp(a, "--csv") == 0 && more) {
            csv_path = argv[++i];
        } else if (strcmp(a, "--contexts") == 0 && more) {
            char *list = argv[++i], *save = NULL;
            nctx = 0;
            for (char *t = strtok_r(list, ",", &save); t && ok; t = strtok_r(NULL, ",", &save))
                ok = nctx < 32 && parse_int(t, 1, PF_LM_MAX_CONTEXT, &contexts[nctx++]);
            ok = ok && nctx > 0;
            contexts_set = 1;
        } else if (strcmp(a, "--tokens") == 0 && more) {
            ok = parse_int(argv[++i], 1, 1 << 28, &tokens);
            tokens_set = 1;
        } else if (strcmp(a, "--layers") == 0 && more) {
            ok = parse_int(argv[++i], 1, PF_LM_MAX_LAYERS, &s.layers);
        } else if (strcmp(a, "--d-model") == 0 && more) {
            ok = parse_int(argv[++i], 1, PF_LM_MAX_D_MODEL, &s.d_model);
        } else if (strcmp(a, "--heads") == 0 && more) {
            ok = parse_int(argv[++i], 1, PF_LM_MAX_D_MODEL, &s.heads);
        } else if (strcmp(a, "--features") == 0 && more) {
            ok = parse_int(argv[++i], 1, PF_LM_MAX_FEATURES, &s.features);
        } else if (strcmp(a, "--budget") == 0 && more) {
            ok = parse_double(argv[++i], 0, 1e6, &budget);
        } else if (strcmp(a, "--max-gib") == 0 && more) {
            ok = parse_double(argv[++i], 0.001, 1e6, &max_gib);
        } else if (strcmp(a, "--as-limit-gib") == 0 && more) {
            ok = parse_double(argv[++i], 0.001, 1e6, &as_gib);
        } else if (strcmp(a, "--max-step-seconds") == 0 && more) {
            ok = parse_double(argv[++i], 0.001, 1e6, &max_step);
        } else {
            ok = 0;
        }
        if (!ok) {
            usage();
            return 2;
        }
    }
    if (s.d_model % s.heads != 0) {
        fprintf(stderr, "bench_train: d_model %d is not a multiple of heads %d\n", s.d_model,
                s.heads);
        usage();
        return 2;
    }
    if (quick) {
        if (!contexts_set) contexts[0] = 256, contexts[1] = 1024, nctx = 2;
        if (!tokens_set) tokens = 2048;
        budget = budget < 0.3 ? budget : 0.3;
    }
    if (isnan(as_gib)) as_gib = max_gib + 4.0;
    const double as_bytes = as_gib * 1073741824.0;
    const unsigned timeout = (unsigned)(60.0 + 6.0 * max_step);
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    char csv_tmp[4096];
    FILE *csv;
    if (csv_open(&csv, csv_tmp, sizeof csv_tmp, csv_path, "bench_train") != 0) return 1;
    char cpu[192], blas[128];
    cpu_name(cpu, sizeof cpu);
    blas_kernels(blas, sizeof blas);

    const peak_fma pk0 = peak_measure(threads);
    peak_sampler during;
    peak_sampler_init(&during, threads, 0.1);
    const long cpu_iters = peak_iters(pk0.isa, 1, 0.1);
    double cpu_peak = 0; /* GFLOP per CPU second, the largest of every run */
    for (int k = 0; k < 3; k++) max_into(&cpu_peak, peak_per_cpu_second(pk0.isa, cpu_iters));

    row rows[64];
    int nrows = 0;
    double last_time[2] = {NAN, NAN}; /* each method's last measured step, and its FLOPs */
    double last_flops[2] = {NAN, NAN};
    for (int ci = 0; ci < nctx; ci++) {
        const int T = contexts[ci];
        const int B = tokens / T > 1 ? tokens / T : 1;
        row *ex = NULL;
        for (int mi = EXACT; mi <= FAVOR; mi++) {
            row *w = &rows[nrows++];
            memset(w, 0, sizeof *w);
            w->T = T, w->B = B, w->meth = (method)mi;
            w->fwd = w->bwd = w->opt = w->total = w->peak_mib = w->loss = w->cpu = NAN;
            w->exact_time = w->exact_mem = NAN;
            w->flops_tok = flops_per_token(&s, w->meth, T);
            const double est = estimate_bytes(&s, w->meth, B, T, threads);
            w->est_mib = est / 1048576.0;
            const double step_est =
                last_time[mi] * (w->flops_tok * B * T) / last_flops[mi]; /* NaN at first */
            if (est <= 0) {
                w->status = RUN_FAILED;
                snprintf(w->note, sizeof w->note, "failed: the library refuses this shape");
            } else if (est > max_gib * 1073741824.0) {
                w->status = RUN_NOFIT;
                snprintf(w->note, sizeof w->note, "does not fit (needs ~%.2f GiB > %.3g)",
                         est / 1073741824.0, max_gib);
            } else if (step_est > max_step) {
                w->status = RUN_TOOLONG;
                snprintf(w->note, sizeof w->note, "not run: a step would take ~%.3g s (> %.3g)",
                         step_est, max_step);
            } else {
                fprintf(stderr, "bench_train: context %d, %s, batch %d ...\n", T,
                        method_name(w->meth), B);
                run_case(w, &s, budget, as_bytes, timeout);
                for (int k = 0; k < 2; k++) peak_sample(&during);
                max_into(&cpu_peak, peak_per_cpu_second(pk0.isa, cpu_iters));
            }
            if (w->status == RUN_OK) {
                last_time[mi] = w->total;
                last_flops[mi] = w->flops_tok * B * T;
                fprintf(stderr, "bench_train: context %d, %s: %.1f ms a step, %.0f MiB\n", T,
                        method_name(w->meth), w->total * 1e3, w->peak_mib);
            } else {
                fprintf(stderr, "bench_train: context %d, %s: %s\n", T, method_name(w->meth),
                        w->note);
            }
            if (mi == EXACT) {
                ex = w;
            } else if (ex && ex->status == RUN_OK && w->status == RUN_OK) {
                w->exact_time = ex->total / w->total;
                w->exact_mem = ex->peak_mib / w->peak_mib;
            }
        }
    }
    const peak_fma pk1 = peak_measure(threads);
    peak_fma pk = peak_max(pk0, pk1);
    pk.gn = during.best > pk.gn ? during.best : pk.gn;
    for (int k = 0; k < 3; k++) max_into(&cpu_peak, peak_per_cpu_second(pk0.isa, cpu_iters));

    const int hd = s.d_model / s.heads;
    printf("performer %s on %s, %d threads, vector kernels %s, OpenBLAS kernels %s\n", pf_version(),
           cpu, threads, pf_simd_path(), blas);
    printf("training step of the byte LM (pf_model_forward with targets, pf_model_backward,\n"
           "pf_model_step with pf_adamw_default): %d layers, d_model %d, %d heads (hd %d),\n"
           "learned positions; FAVOR+: positive features, orthogonal W, m = %d, kept for the\n"
           "backward; %d tokens a step (batch = %d / context, at least 1), random bytes\n",
           s.layers, s.d_model, s.heads, hd, s.features, tokens, tokens);
    printf(
        "each case in its own process: 1 warm-up step, then %d to %d timed steps within %.3g s;\n"
        "medians (of each part separately: fwd + bwd + opt need not add up to the step).\n"
        "peak MiB: the case process's peak resident size (VmHWM); est MiB: the estimate it\n"
        "was admitted on (a case over %.3g GiB is not run; address-space limit %.3g GiB)\n",
        MIN_STEPS, MAX_STEPS, budget, max_gib, as_gib);
    printf("model FLOPs a token (fwd + bwd = 3 x fwd; multiply-add = 2): 6 N with N = 12 L C^2 +\n"
           "256 C = %.0f (the matrix products' weights; all parameters: %.0f at context %d),\n"
           "+ exact causal 6 L C (T + 1), + FAVOR+ causal 12 L m (2 C + H) = %.0f\n",
           dense_params(&s), all_params(&s, contexts[0]), contexts[0],
           flops_per_token(&s, FAVOR, 1) - 6.0 * dense_params(&s));
    printf("fp32 FMA peak (%s, registers only, bench/peak.h): %.1f GFLOP/s on %d threads\n"
           "(%.1f on 1), the largest of 3 runs of 0.2 s before the cases (%.1f), 3 after them\n"
           "(%.1f) and %d of 0.1 s between them (%.1f); \"of FMA\" is GFLOP/s over it\n",
           peak_isa_name(pk.isa), pk.gn, threads, pk.g1, pk0.gn, pk1.gn, during.runs, during.best);
    if (threads > 1 && pk.gn < 0.8 * threads * pk.g1)
        printf("(%d threads gave less than %.1fx one thread: the cores were busy with other work;\n"
               "every fraction of the %d-thread peak is then of what this run could get)\n",
               threads, 0.8 * threads, threads);
    printf("cores: the step's CPU seconds (every thread) over its wall seconds, at most %d; "
           "per CPU:\nthe model's FLOPs per CPU second over the same loop's GFLOP per second of "
           "its thread's\nCPU time (%.1f; the largest of %d runs), what the cores do while they "
           "run this step,\nwhatever else the machine runs (threads waiting at a barrier count "
           "as busy)\n",
           threads, cpu_peak, 6 + nrows);
    printf("x time, x mem (FAVOR+ rows): exact's step time and peak memory over FAVOR+'s, same "
           "context\n\n");
    printf("%7s %-7s %5s %10s %10s %9s %9s %8s %9s %9s %8s %7s %5s %7s %7s %7s\n", "context",
           "method", "batch", "ms/step", "tokens/s", "fwd ms", "bwd ms", "opt ms", "peak MiB",
           "est MiB", "GFLOP/s", "of FMA", "cores", "per CPU", "x time", "x mem");
    if (csv)
        fprintf(csv, "context,method,batch,tokens,status,note,seconds_per_step,tokens_per_second,"
                     "forward_seconds,backward_seconds,optimizer_seconds,steps,peak_mib,"
                     "estimate_mib,model_flops_per_token,gflops,fma_fraction,exact_over_favor_time,"
                     "exact_over_favor_memory,params,loss,layers,d_model,heads,features,"
                     "fma_peak_gflops,threads,cpu_seconds_per_step,cores_busy,fma_fraction_per_cpu,"
                     "fma_peak_gflops_per_cpu_second,machine\n");
    for (int i = 0; i < nrows; i++) {
        const row *w = &rows[i];
        const double ntok = (double)w->B * w->T;
        const double gf = w->flops_tok * ntok / w->total * 1e-9;
        const double per_cpu = w->flops_tok * ntok / w->cpu * 1e-9 / cpu_peak;
        char c[14][24];
        if (w->status == RUN_OK)
            printf("%7d %-7s %5d %10.1f %10.0f %9.1f %9.1f %8.1f %9.0f %9.0f %8.1f %6.1f%% %5.2f "
                   "%6.1f%% %7s %7s\n",
                   w->T, method_name(w->meth), w->B, w->total * 1e3, ntok / w->total, w->fwd * 1e3,
                   w->bwd * 1e3, w->opt * 1e3, w->peak_mib, w->est_mib, gf, 100 * gf / pk.gn,
                   w->cpu / w->total, 100 * per_cpu, cell(c[0], "%.2fx", w->exact_time),
                   cell(c[1], "%.2fx", w->exact_mem));
        else
            printf("%7d %-7s %5d  %s\n", w->T, method_name(w->meth), w->B, w->note);
        if (csv) {
            const int ok = w->status == RUN_OK;
            fprintf(csv,
                    "%d,%s,%d,%.0f,%s,\"%s\",%s,%s,%s,%s,%s,%d,%s,%.1f,%.6g,%s,%s,%s,%s,%lld,%s,"
                    "%d,%d,%d,%d,%.4g,%d,%s,%s,%s,%.4g,\"%s, vector kernels %s, OpenBLAS kernels "
                    "%s\"\n",
                    w->T, w->meth == EXACT ? "exact" : "favor", w->B, ntok, status_name(w->status),
                    w->note, cell(c[0], "%.6g", w->total), cell(c[1], "%.6g", ntok / w->total),
                    cell(c[2], "%.6g", w->fwd), cell(c[3], "%.6g", w->bwd),
                    cell(c[4], "%.6g", w->opt), w->steps, cell(c[5], "%.1f", w->peak_mib),
                    w->est_mib, w->flops_tok, cell(c[6], "%.4g", ok ? gf : NAN),
                    cell(c[7], "%.4g", ok ? gf / pk.gn : NAN), cell(c[8], "%.4g", w->exact_time),
                    cell(c[9], "%.4g", w->exact_mem), w->params, cell(c[10], "%.5g", w->loss),
                    s.layers, s.d_model, s.heads, s.features, pk.gn, threads,
                    cell(c[11], "%.6g", w->cpu), cell(c[12], "%.4g", w->cpu / w->total),
                    cell(c[13], "%.4g", ok ? per_cpu : NAN), cpu_peak, cpu, pf_simd_path(), blas);
        }
    }
    fflush(stdout);
    if (csv_commit(&csv, csv_tmp, csv_path, "bench_train") != 0) return 1;
    return 0;
}
