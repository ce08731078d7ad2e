/* cmd_demo.c: `performer demo`: the one-minute answer to "what does FAVOR+ buy me?".
 *
 * For L = 512, 1024, ... it times exact attention, FAVOR+ and causal FAVOR+ on the same random
 * Q, K, V, measures each one's extra memory, and FAVOR+'s error against exact attention. The
 * first table is a setting where FAVOR+ works (entries of Q, K ~ N(0, 0.5^2)); the second gives
 * the error of the hard case, the same draws at sigma = 1, where the estimator's variance
 * (like exp(|q'+k'|^2)) puts it above the error of answering 0: a newcomer reads the one that
 * works first and sees the hard one labelled as such. Then the same error on the queries, keys
 * and values a small trained model really produces (the checkpoint shipped in data/, or
 * --checkpoint), next to N(0,1) inputs of their shape.
 *
 * Every measurement runs in its own fork()ed child, so its peak RSS (wait4's ru_maxrss) belongs
 * to that method alone. The parent makes the inputs before forking (the children share them
 * copy-on-write) and never runs an OpenMP region itself: GNU OpenMP's thread pool does not
 * survive fork(), so each child starts its own. Outputs go to shared anonymous memory, where
 * the parent reads them to compute the error. */
#define _DEFAULT_SOURCE /* wait4, MAP_ANONYMOUS */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "tool.h"

#define CMD "demo"
#define MAX_ROWS 32
/* the entries' standard deviation of the first table (where FAVOR+ works), and of the hard
 * case shown next to it */
#define DEMO_SIGMA 0.5
#define HARD_SIGMA 1.0
/* FAVOR+ on a trained model's inputs: W draws, windows of text, their longest length, layers
 * shown, and the shipped files */
#define REAL_DRAWS 5
#define REAL_DRAWS_QUICK 3
#define REAL_WINDOWS 4
#define REAL_MAX_T 1024
#define REAL_MAX_LAYERS 32
#define REAL_NM 3
#define DEMO_CHECKPOINT "demo-kjv.safetensors"
#define DEMO_TEXT "demo-kjv-val.txt"
static const int real_m[REAL_NM] = {64, 256, 1024};

const char cmd_demo_synopsis[] =
    "performer demo [--max-len L] [--d D] [--heads H] [--features M] [--budget SEC]\n"
    "     [--sigma S] [--threads N] [--seed S] [--quick]\n"
    "     [--checkpoint PATH | --no-checkpoint] [--text FILE]\n";

void cmd_demo_help(void) {
    printf("usage: %s\n"
           "Times exact softmax attention, FAVOR+ and causal FAVOR+ on random Q, K, V (B = 1)\n"
           "for L = 512, 1024, ... up to --max-len, with each method's extra memory and FAVOR+'s\n"
           "error against exact attention, ||approx - exact|| / ||exact|| (1.0 is the error of\n"
           "answering 0). The entries of Q and K are N(0, sigma^2), sigma = 0.5 by default: a\n"
           "setting where FAVOR+ works. A second table gives the error of the hard case, the same\n"
           "draws at sigma = 1 (left out when --sigma is 1 or more: the first table is then the\n"
           "hard case, and says so). Progress goes to stderr, the tables to stdout.\n"
           "\n"
           "options:                                                              [default]\n"
           "  --max-len L     the longest sequence                                [65536]\n"
           "  --d D           query/key/value width                               [64]\n"
           "  --heads H       heads                                               [8]\n"
           "  --features M    FAVOR+ random projections (positive features, orthogonal W) [256]\n"
           "  --budget SEC    run exact attention only while its predicted time (4x the last\n"
           "                  measured one) stays below SEC seconds               [10]\n"
           "  --sigma S       standard deviation of the entries of Q and K (V's is 1);\n"
           "                  FAVOR+'s error grows quickly with |q| and |k|       [%g]\n"
           "  --threads N     threads, 0 = OpenMP's default                       [0]\n"
           "  --seed S        seed of the inputs and of W                         [0]\n"
           "  --quick         L up to 4096 only (for tests)                       [off]\n"
           "\n"
           "Then FAVOR+ on real inputs: a trained language model (a performer train\n"
           "checkpoint) runs on windows of a text, and each layer's own queries, keys and\n"
           "values (pf_model_attention_inputs) go through causal exact attention and causal\n"
           "FAVOR+ (positive features, orthogonal W, m = 64, 256, 1024, %d draws of W; %d with\n"
           "--quick), next to N(0,1) inputs of the same shape and the same draws: %d windows\n"
           "(%d with --quick) of the model's context, at most %d bytes. It runs first: a\n"
           "checkpoint or text that cannot be used ends the demo at once (status 1).\n"
           "  --checkpoint PATH  the model            [data/demo-kjv.safetensors, when found]\n"
           "  --no-checkpoint    leave this part out\n"
           "  --text FILE        the text it reads    [data/demo-kjv-val.txt, when found]\n"
           "The shipped files (scripts/make_demo_checkpoint.sh makes them; data/demo-kjv.md\n"
           "says how) are looked for in $PERFORMER_DATA, then beside the executable's\n"
           "../data and ../../data, then ./data; when they are not found this part is left\n"
           "out with a note.\n",
           cmd_demo_synopsis, DEMO_SIGMA, REAL_DRAWS, REAL_DRAWS_QUICK, REAL_WINDOWS,
           REAL_WINDOWS / 2, REAL_MAX_T);
}

typedef struct demo_cfg {
    int max_len, d, H, m, threads, quick;
    double budget; /* seconds */
    double sigma;  /* std of Q and K */
    uint64_t seed;
    const char *checkpoint, *text; /* the trained model's part; NULL: none */
} demo_cfg;

enum { RUN_IDLE, RUN_FAVOR, RUN_FAVOR_CAUSAL, RUN_EXACT, RUN_FAVORPP, RUN_HARD };

/* What a child sends back. */
typedef struct child_report {
    int status; /* pf_status of the method */
    int runs;
    double ms;     /* median time of one call */
    double err[2]; /* RUN_HARD: FAVOR+'s and FAVOR++'s error against exact */
} child_report;

typedef struct measurement {
    int ok; /* the child reported success */
    double ms;
    double extra_mb; /* peak RSS minus the idle child's */
    double rss_mb;   /* the child's own peak RSS */
    double err[2];   /* RUN_HARD's errors */
    char why[128];   /* when not ok */
} measurement;

typedef struct row {
    int L;
    measurement favor, causal, exact, favorpp;
    measurement hard; /* the hard case's errors (HARD_SIGMA), where hard_run */
    int exact_run, hard_run;
    double rel_err, rel_err_pp; /* FAVOR+ and FAVOR++ against exact */
    double idle_mb;
} row;

/* The inputs of one row (H,L,d), n entries each: streams 1, 2, 3 of seed, N(0,1), and Q and K
 * (not V) times sigma. A NULL one is not made. */
static void fill_inputs(float *const in[3], size_t n, uint64_t seed, double sigma) {
    pf_rng rng;
    for (int t = 0; t < 3; t++) {
        if (!in[t]) continue;
        pf_rng_init(&rng, seed, (uint64_t)t + 1);
        pf_rng_fill_normal(&rng, in[t], n);
        if (t < 2 && sigma != 1) {
            for (size_t i = 0; i < n; i++) in[t][i] *= (float)sigma;
        }
    }
}

/* ||got - ref||_F / ||ref||_F (n entries), in double. */
static double rel_frobenius(const float *got, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)got[i] - (double)ref[i];
        num += e * e;
        den += (double)ref[i] * (double)ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- the child ----------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The hard case, untimed: the row's draws of Q and K at HARD_SIGMA (made again here, from the
 * same streams), the same V and the same W; FAVOR+'s and FAVOR++'s error against exact
 * attention on them into rep.err. */
static child_report child_hard(const demo_cfg *c, int L, const float *V) {
    child_report rep = {PF_ENOMEM, 0, 0, {NAN, NAN}};
    const size_t n = (size_t)c->H * (size_t)L * (size_t)c->d;
    float *buf = malloc(sizeof(float) * n * 4), *W = malloc(sizeof(float) * (size_t)c->m * c->d);
    if (!buf || !W) {
        free(buf);
        free(W);
        return rep;
    }
    float *Q = buf, *K = Q + n, *out_e = K + n, *out = out_e + n;
    float *const in[3] = {Q, K, NULL};
    fill_inputs(in, n, c->seed, HARD_SIGMA);
    pf_shape sh = {.B = 1, .H = c->H, .Lq = L, .Lk = L, .d = c->d, .dv = c->d};
    pf_attn_opts opts = pf_attn_opts_default();
    opts.threads = c->threads;
    rep.status = pf_attn_exact(out_e, NULL, Q, K, V, &sh, &opts);
    if (rep.status == PF_OK)
        rep.status = pf_projection_draw(W, c->m, c->d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, c->seed, 0);
    for (int j = 0; j < 2 && rep.status == PF_OK; j++) {
        pf_favor_opts fav = pf_favor_opts_default();
        fav.W = W;
        fav.m = c->m;
        if (j == 1) fav.kernel = PF_KERNEL_OPRF;
        rep.status = pf_attn_favor(out, Q, K, V, &sh, &opts, &fav);
        if (rep.status == PF_OK) rep.err[j] = rel_frobenius(out, out_e, n);
    }
    free(buf);
    free(W);
    return rep;
}

/* Runs one method, timed: one call, then (if that was quick) up to 5 more while they take
 * under a second in total; the median of those repeats, or the single call. RUN_HARD runs
 * child_hard instead. */
static child_report child_run(int what, const demo_cfg *c, int L, float *out, const float *Q,
                              const float *K, const float *V) {
    child_report rep = {PF_OK, 0, 0, {NAN, NAN}};
    if (what == RUN_HARD) return child_hard(c, L, V);
    if (what == RUN_IDLE) {
        memset(out, 0, sizeof(float) * (size_t)c->H * (size_t)L * (size_t)c->d);
        return rep;
    }
    pf_shape sh = {.B = 1, .H = c->H, .Lq = L, .Lk = L, .d = c->d, .dv = c->d};
    pf_attn_opts opts = pf_attn_opts_default();
    opts.threads = c->threads;
    opts.causal = what == RUN_FAVOR_CAUSAL;
    pf_favor_opts fav = pf_favor_opts_default();
    float *W = NULL;
    if (what != RUN_EXACT) {
        W = malloc(sizeof(float) * (size_t)c->m * (size_t)c->d);
        if (!W) {
            rep.status = PF_ENOMEM;
            return rep;
        }
        rep.status = pf_projection_draw(W, c->m, c->d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, c->seed, 0);
        fav.W = W;
        fav.m = c->m;
        if (what == RUN_FAVORPP) fav.kernel = PF_KERNEL_OPRF; /* A fitted to each head */
    }
    /* Warm-up: a fresh process starts its threads and faults its pages in on the first calls
     * (one call was not enough: the first case measured up to 5x slow). */
    double w0 = tool_now_ms();
    for (int w = 0; rep.status == PF_OK && w < 3 && (w == 0 || tool_now_ms() - w0 < 200); w++) {
        rep.status = what == RUN_EXACT ? pf_attn_exact(out, NULL, Q, K, V, &sh, &opts)
                                       : pf_attn_favor(out, Q, K, V, &sh, &opts, &fav);
    }
    double times[6], total = 0;
    int n = 0;
    while (rep.status == PF_OK && n < 6) {
        double t0 = tool_now_ms();
        rep.status = what == RUN_EXACT ? pf_attn_exact(out, NULL, Q, K, V, &sh, &opts)
                                       : pf_attn_favor(out, Q, K, V, &sh, &opts, &fav);
        double t = tool_now_ms() - t0;
        if (n == 0 && t > 300) { /* slow: one call is the measurement */
            times[n++] = t;
            break;
        }
        if (n > 0) total += t;
        times[n++] = t;
        if (total > 1000) break;
    }
    free(W);
    rep.runs = n;
    if (n == 1) {
        rep.ms = times[0];
    } else if (n > 1) {
        qsort(times + 1, (size_t)(n - 1), sizeof(double), cmp_double); /* the first: warm-up */
        rep.ms = times[1 + (n - 1) / 2];
    }
    return rep;
}

/* Forks a child for one measurement; waits for it and fills m. idle_kb: the idle child's peak
 * RSS (0 when measuring the idle child itself). */
static void measure(measurement *m, int what, const demo_cfg *c, int L, float *out, const float *Q,
                    const float *K, const float *V, long idle_kb) {
    memset(m, 0, sizeof(*m));
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(m->why, sizeof(m->why), "pipe: %s", strerror(errno));
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(m->why, sizeof(m->why), "fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return;
    }
    if (pid == 0) {
        close(fds[0]);
        child_report rep = child_run(what, c, L, out, Q, K, V);
        ssize_t w = write(fds[1], &rep, sizeof(rep));
        _exit(w == (ssize_t)sizeof(rep) ? 0 : 3);
    }
    close(fds[1]);
    child_report rep;
    ssize_t got;
    do {
        got = read(fds[0], &rep, sizeof(rep));
    } while (got < 0 && errno == EINTR);
    close(fds[0]);
    int wst = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof(ru));
    while (wait4(pid, &wst, 0, &ru) < 0 && errno == EINTR) {
    }
    m->rss_mb = (double)ru.ru_maxrss / 1024.0; /* Linux reports kilobytes */
    m->extra_mb = (double)(ru.ru_maxrss - idle_kb) / 1024.0;
    if (m->extra_mb < 0) m->extra_mb = 0; /* page-level noise */
    if (WIFSIGNALED(wst)) {
        snprintf(m->why, sizeof(m->why), "crashed (signal %d)", WTERMSIG(wst));
    } else if (got != (ssize_t)sizeof(rep) || !WIFEXITED(wst) || WEXITSTATUS(wst) != 0) {
        snprintf(m->why, sizeof(m->why), "the child failed");
    } else if (rep.status != PF_OK) {
        snprintf(m->why, sizeof(m->why), "%s", pf_status_str((pf_status)rep.status));
    } else {
        m->ok = 1;
        m->ms = rep.ms;
        m->err[0] = rep.err[0];
        m->err[1] = rep.err[1];
    }
}

/* ---- the parent ---------------------------------------------------------------------------- */

static float *shared_floats(size_t n) {
    void *p =
        mmap(NULL, sizeof(float) * n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* One row: inputs, the idle child, FAVOR+, causal FAVOR+, and exact unless skipped. Returns
 * 0, or an exit code after a message when the inputs cannot even be made. */
static int measure_row(row *r, const demo_cfg *c, int run_exact) {
    int L = r->L;
    size_t n = (size_t)c->H * (size_t)L * (size_t)c->d;
    float *Q = malloc(sizeof(float) * n), *K = malloc(sizeof(float) * n);
    float *V = malloc(sizeof(float) * n);
    float *out_f = shared_floats(n), *out_e = run_exact ? shared_floats(n) : NULL;
    float *out_p = run_exact ? shared_floats(n) : NULL;
    int rc = 0;
    if (!Q || !K || !V || !out_f || (run_exact && (!out_e || !out_p))) {
        rc = tool_fail(CMD, "out of memory at L = %d", L);
        goto done;
    }
    float *const in[3] = {Q, K, V};
    fill_inputs(in, n, c->seed, c->sigma);
    measurement idle;
    measure(&idle, RUN_IDLE, c, L, out_f, Q, K, V, 0);
    long idle_kb = (long)(idle.rss_mb * 1024.0);
    r->idle_mb = idle.rss_mb;
    fprintf(stderr, "  L=%-6d favor...", L);
    measure(&r->favor, RUN_FAVOR, c, L, out_f, Q, K, V, idle_kb);
    fprintf(stderr, " causal...");
    /* the causal output is not compared: write it where exact's will go, keeping FAVOR+'s */
    measure(&r->causal, RUN_FAVOR_CAUSAL, c, L, out_e ? out_e : out_f, Q, K, V, idle_kb);
    r->exact_run = run_exact;
    r->rel_err = r->rel_err_pp = NAN;
    if (run_exact) {
        /* FAVOR++ only matters for its error, so it runs where exact attention does */
        fprintf(stderr, " favor++...");
        measure(&r->favorpp, RUN_FAVORPP, c, L, out_p, Q, K, V, idle_kb);
        fprintf(stderr, " exact...");
        measure(&r->exact, RUN_EXACT, c, L, out_e, Q, K, V, idle_kb);
        if (r->exact.ok && r->favor.ok) r->rel_err = rel_frobenius(out_f, out_e, n);
        if (r->exact.ok && r->favorpp.ok) r->rel_err_pp = rel_frobenius(out_p, out_e, n);
        /* the hard case beside it, where exact attention runs (its errors need it) */
        r->hard_run = c->sigma < HARD_SIGMA;
        if (r->hard_run) {
            fprintf(stderr, " sigma=%g...", HARD_SIGMA);
            measure(&r->hard, RUN_HARD, c, L, out_f, Q, K, V, idle_kb);
        }
    }
    fprintf(stderr, " done\n");
    const measurement *ms[5] = {&r->favor, &r->causal, &r->exact, &r->favorpp, &r->hard};
    static const char *const names[5] = {"FAVOR+", "causal FAVOR+", "exact", "FAVOR++",
                                         "the hard case (sigma = 1)"};
    for (int t = 0; t < 5; t++) {
        if (t >= 2 && !run_exact) break;
        if (t == 4 && !r->hard_run) break;
        if (!ms[t]->ok)
            fprintf(stderr, "performer demo: L = %d: %s failed: %s\n", L, names[t], ms[t]->why);
    }
done:
    free(Q);
    free(K);
    free(V);
    if (out_f) munmap(out_f, sizeof(float) * n);
    if (out_e) munmap(out_e, sizeof(float) * n);
    if (out_p) munmap(out_p, sizeof(float) * n);
    return rc;
}

/* ---- the table ----------------------------------------------------------------------------- */

/* Display width of a UTF-8 string (characters, not bytes: "—" is one column). */
static int display_width(const char *s) {
    int w = 0;
    for (; *s; s++) w += ((unsigned char)*s & 0xC0) != 0x80;
    return w;
}

/* s right-aligned in width columns; a negative width left-aligns it in -width. */
static void cell(const char *s, int width) {
    if (width < 0) fputs(s, stdout);
    for (int i = display_width(s); i < (width < 0 ? -width : width); i++) putchar(' ');
    if (width >= 0) fputs(s, stdout);
}

/* An error cell: the value, or "—" (not run) or "failed". */
static void err_cell(double err, int ran, int width) {
    char s[64];
    if (!isnan(err))
        snprintf(s, sizeof(s), "%.3f", err);
    else
        snprintf(s, sizeof(s), ran ? "—" : "failed");
    cell(s, width);
}

/* The table of the hard case (HARD_SIGMA), for the rows that measured it. */
static void print_hard(const row *rows, int n, const demo_cfg *c) {
    int any = 0;
    for (int i = 0; i < n; i++) any |= rows[i].hard_run;
    if (!any) return;
    /* says "worse than answering 0" only where every error measured is (true at the defaults) */
    int worse = 1;
    for (int i = 0; i < n; i++) {
        const measurement *h = &rows[i].hard;
        if (rows[i].hard_run) worse &= h->ok && h->err[0] > 1 && h->err[1] > 1;
    }
    const double sd = sqrt((double)c->d);
    printf("\n"
           "sigma = %g, the hard case (|q'|^2 = %.3g, not %.3g): the same draws of Q and K times "
           "%.3g,\n"
           "the same V and W%s:\n",
           HARD_SIGMA, HARD_SIGMA * HARD_SIGMA * sd, c->sigma * c->sigma * sd,
           HARD_SIGMA / c->sigma, worse ? "; FAVOR+ does worse than answering 0 here" : "");
    static const char *const head[3] = {"L", "FAVOR+ err", "FAVOR++ err"};
    static const int width[3] = {7, 12, 13};
    for (int j = 0; j < 3; j++) cell(head[j], width[j]);
    putchar('\n');
    char s[64];
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        if (!r->hard_run) continue;
        snprintf(s, sizeof(s), "%d", r->L);
        cell(s, width[0]);
        for (int j = 0; j < 2; j++) err_cell(r->hard.ok ? r->hard.err[j] : NAN, 0, width[1 + j]);
        putchar('\n');
    }
}

static void print_table(const row *rows, int n, const demo_cfg *c, double exact_skip_s) {
    static const char *const head[9] = {"L",        "exact ms", "FAVOR+ ms", "causal ms",
                                        "speed-up", "MB exact", "MB FAVOR+", "FAVOR+ err",
                                        "FAVOR++ err"};
    static const int width[9] = {7, 11, 11, 11, 10, 10, 11, 12, 13};
    /* the table's caption: which setting it is, the hard case labelled as such */
    const double q2 = c->sigma * c->sigma * sqrt((double)c->d);
    if (c->sigma >= HARD_SIGMA)
        printf("sigma = %g, the hard case (|q'|^2 = %.3g; FAVOR+'s variance grows like "
               "exp(|q'+k'|^2)):\n",
               c->sigma, q2);
    else if (c->sigma <= DEMO_SIGMA)
        printf("sigma = %g (|q'|^2 = %.3g), a setting where FAVOR+ works:\n", c->sigma, q2);
    else
        printf("sigma = %g (|q'|^2 = %.3g):\n", c->sigma, q2);
    for (int j = 0; j < 9; j++) cell(head[j], width[j]);
    putchar('\n');
    char s[64];
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        snprintf(s, sizeof(s), "%d", r->L);
        cell(s, width[0]);
        const measurement *m3[3] = {&r->exact, &r->favor, &r->causal};
        for (int j = 0; j < 3; j++) {
            if (j == 0 && !r->exact_run)
                snprintf(s, sizeof(s), "—");
            else if (!m3[j]->ok)
                snprintf(s, sizeof(s), "failed");
            else
                snprintf(s, sizeof(s), m3[j]->ms < 10 ? "%.2f" : "%.1f", m3[j]->ms);
            cell(s, width[1 + j]);
        }
        if (r->exact_run && r->exact.ok && r->favor.ok && r->favor.ms > 0)
            snprintf(s, sizeof(s), "%.1fx", r->exact.ms / r->favor.ms);
        else
            snprintf(s, sizeof(s), "—");
        cell(s, width[4]);
        if (r->exact_run && r->exact.ok)
            snprintf(s, sizeof(s), "%.1f", r->exact.extra_mb);
        else
            snprintf(s, sizeof(s), "—");
        cell(s, width[5]);
        if (r->favor.ok)
            snprintf(s, sizeof(s), "%.1f", r->favor.extra_mb);
        else
            snprintf(s, sizeof(s), "—");
        cell(s, width[6]);
        const double err[2] = {r->rel_err, r->rel_err_pp};
        const int ran[2] = {r->favor.ok, !r->exact_run || r->favorpp.ok};
        for (int j = 0; j < 2; j++) err_cell(err[j], ran[j], width[7 + j]);
        putchar('\n');
    }
    print_hard(rows, n, c);

    const row *last = &rows[n - 1];
    /* the crossover: the shortest measured L from which on FAVOR+ was always faster */
    int cross = 0;
    for (int i = 0; i < n; i++) {
        if (!rows[i].exact_run || !rows[i].exact.ok || !rows[i].favor.ok) break;
        if (rows[i].favor.ms >= rows[i].exact.ms)
            cross = 0;
        else if (!cross)
            cross = rows[i].L;
    }
    double naive_gb = 4.0 * c->H * (double)last->L * (double)last->L / 1e9;
    printf(
        "\n"
        "exact: softmax attention, O(L^2) time; online softmax, so no L x L matrix (a naive one\n"
        "  would hold 4*H*L^2 bytes of scores: %.1f GB at L = %d). FAVOR+: m = %d positive\n"
        "  features, orthogonal W, O(L) time; causal: FAVOR+ with a causal mask (chunked).\n"
        "ms: median of up to 5 calls after warm-up calls (one call if it takes > 0.3 s).\n"
        "  speed-up: exact ms / FAVOR+ ms. \xE2\x80\x94: exact skipped (predicted > %g s).\n"
        "MB: peak RSS of a forked child running the method minus that of an idle child\n"
        "  holding the same inputs and output (%.0f MB at L = %d): the method's working memory.\n"
        "err: ||approx - exact||_F / ||exact||_F on the same inputs; 1.0 is the error of\n"
        "  answering 0 (with random V the exact outputs are small averages). FAVOR+'s error\n"
        "  grows with |q|, |k|: its variance goes like exp(|q'+k'|^2), q' = q d^-1/4, and\n"
        "  |q'|^2 = sigma^2 sqrt(d) on these inputs. FAVOR++ (same m, its A fitted to each\n"
        "  head) cuts it; so do more --features.\n",
        naive_gb, last->L, c->m, exact_skip_s, last->idle_mb, last->L);
    if (cross)
        printf("FAVOR+ was faster than exact attention from L = %d on (this machine, this run).\n",
               cross);
}

/* ---- FAVOR+ on a trained model's queries, keys and values --------------------------------- */

/* What the child that runs the trained model sends back, in shared memory. */
typedef struct real_report {
    int ok;
    char msg[1200]; /* why not, when not ok */
    pf_model_config cfg;
    long long step;
    int B, T, layers, draws; /* layers measured: the model's, at most REAL_MAX_LAYERS */
    /* row l < layers: layer l's own inputs; row `layers`: N(0,1) inputs of the same shape */
    double err[REAL_MAX_LAYERS + 1][REAL_NM][REAL_DRAWS];
    double q2[REAL_MAX_LAYERS + 1], k2[REAL_MAX_LAYERS + 1]; /* mean |q'|^2, |k'|^2 */
    double qr[REAL_MAX_LAYERS + 1], kr[REAL_MAX_LAYERS + 1]; /* effective ranks (eff_rank) */
    double ms;
} real_report;

/* Mean over rows (n rows of hd) of |x|^2 * scale. */
static double mean_sq(const float *x, size_t rows, int hd, double scale) {
    double s = 0;
    for (size_t i = 0; i < rows * (size_t)hd; i++) s += (double)x[i] * x[i];
    return s * scale / (double)rows;
}

/* The effective rank (tr S)^2 / tr(S^2) of the covariance S (hd x hd) of each head's B*T rows
 * of x (B,H,T,hd), averaged over the heads: about hd for N(0,1) entries, 1 for rows that vary
 * along one direction. In float64. */
static double eff_rank(const float *x, int B, int H, int T, int hd) {
    double *mean = calloc((size_t)hd, sizeof(double));
    double *S = calloc((size_t)hd * hd, sizeof(double));
    double sum = 0;
    if (!mean || !S) {
        free(mean);
        free(S);
        return NAN;
    }
    const double n = (double)B * T;
    for (int h = 0; h < H; h++) {
        memset(mean, 0, sizeof(double) * (size_t)hd);
        memset(S, 0, sizeof(double) * (size_t)hd * hd);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int i = 0; i < hd; i++)
                    mean[i] += x[(((size_t)b * H + h) * T + t) * hd + i] / n;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                const float *r = x + (((size_t)b * H + h) * T + t) * hd;
                for (int i = 0; i < hd; i++)
                    for (int j = 0; j < hd; j++)
                        S[(size_t)i * hd + j] += (r[i] - mean[i]) * (r[j] - mean[j]) / n;
            }
        double tr = 0, tr2 = 0;
        for (int i = 0; i < hd; i++) tr += S[(size_t)i * hd + i];
        for (size_t i = 0; i < (size_t)hd * hd; i++) tr2 += S[i] * S[i];
        sum += tr2 > 0 ? tr * tr / tr2 : 0;
    }
    free(mean);
    free(S);
    return sum / H;
}

/* The bytes of the text (at most cap): *n of them, malloc'ed into *buf. 0, or -1 with msg. */
static int read_text(const char *path, unsigned char **buf, size_t *n, size_t cap, char *msg,
                     size_t msglen) {
    int64_t size;
    pf_status st;
    int fd = pf_io_open_regular(path, &size, &st, msg, msglen);
    if (fd < 0) return -1;
    size_t want = (size_t)size < cap ? (size_t)size : cap;
    *buf = malloc(want > 0 ? want : 1);
    if (!*buf) {
        close(fd);
        snprintf(msg, msglen, "%s: out of memory", path);
        return -1;
    }
    st = pf_io_read_all(fd, *buf, want, path, msg, msglen);
    close(fd);
    if (st != PF_OK) {
        free(*buf);
        *buf = NULL;
        return -1;
    }
    *n = want;
    return 0;
}

/* Exact and FAVOR+ (every m, every draw) on one set of q, k, v (B,H,T,hd) into err[m][draw];
 * out_e, out_f, W are scratch. The library's status. */
static pf_status real_errors(double err[REAL_NM][REAL_DRAWS], const float *q, const float *k,
                             const float *v, const pf_shape *sh, const pf_attn_opts *opts,
                             float *out_e, float *out_f, float *W, int draws, uint64_t seed) {
    const size_t n = (size_t)sh->B * sh->H * sh->Lq * sh->dv;
    pf_status st = pf_attn_exact(out_e, NULL, q, k, v, sh, opts);
    for (int j = 0; j < REAL_NM && st == PF_OK; j++) {
        for (int r = 0; r < draws && st == PF_OK; r++) {
            /* draw r of every m from its own stream, away from the timing rows' stream 0 */
            st = pf_projection_draw(W, real_m[j], sh->d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, seed,
                                    1000 + (uint64_t)r);
            pf_favor_opts fav = pf_favor_opts_default();
            fav.W = W;
            fav.m = real_m[j];
            if (st == PF_OK) st = pf_attn_favor(out_f, q, k, v, sh, opts, &fav);
            if (st == PF_OK) err[j][r] = rel_frobenius(out_f, out_e, n);
        }
    }
    return st;
}

/* Row l of r from one set of q, k, v (B,H,T,hd; sh): the mean |q'|^2 and |k'|^2, their
 * effective ranks, and the errors (real_errors; scratch: its out_e, out_f and W). */
static pf_status real_row(real_report *r, int l, const float *q, const float *k, const float *v,
                          const pf_shape *sh, const pf_attn_opts *opts, float *const scratch[3],
                          uint64_t seed) {
    const int hd = sh->d;
    const size_t rows = (size_t)sh->B * sh->H * sh->Lq;
    const double scale = 1.0 / sqrt((double)hd); /* |q'|^2 = |q|^2 / sqrt(hd) */
    r->q2[l] = mean_sq(q, rows, hd, scale);
    r->k2[l] = mean_sq(k, rows, hd, scale);
    r->qr[l] = eff_rank(q, sh->B, sh->H, sh->Lq, hd);
    r->kr[l] = eff_rank(k, sh->B, sh->H, sh->Lq, hd);
    return real_errors(r->err[l], q, k, v, sh, opts, scratch[0], scratch[1], scratch[2], r->draws,
                       seed);
}

/* The model and the text: *m loaded from c->checkpoint, *text (*ntext bytes) read from
 * c->text. 0, or -1 with r->msg. */
static int real_open(real_report *r, const demo_cfg *c, pf_model **m, unsigned char **text,
                     size_t *ntext) {
    char msg[1024];
    if (pf_model_load(m, c->checkpoint, msg, sizeof(msg)) != PF_OK) {
        snprintf(r->msg, sizeof(r->msg), "--checkpoint: %s", msg);
        return -1;
    }
    r->cfg = pf_model_get_config(*m);
    r->step = (long long)pf_model_steps(*m);
    if (read_text(c->text, text, ntext, (size_t)1 << 24, msg, sizeof(msg)) != 0) {
        snprintf(r->msg, sizeof(r->msg), "--text: %s", msg);
        return -1;
    }
    if (*ntext < 16) {
        snprintf(r->msg, sizeof(r->msg), "--text: %s holds %zu bytes; at least 16 are needed",
                 c->text, *ntext);
        return -1;
    }
    return 0;
}

/* The shape of the part (r->B windows of r->T bytes, r->layers, r->draws), *tok the windows
 * (B,T) spread evenly over the text, the first at its start and the last at its end, and *buf
 * the working memory real_measure uses. 0, or -1 with r->msg. */
static int real_windows(real_report *r, const demo_cfg *c, const unsigned char *text, size_t ntext,
                        int32_t **tok, float **buf) {
    const int H = r->cfg.heads, hd = r->cfg.d_model / r->cfg.heads;
    const int B = c->quick ? REAL_WINDOWS / 2 : REAL_WINDOWS;
    int T = r->cfg.context < REAL_MAX_T ? r->cfg.context : REAL_MAX_T;
    if ((size_t)T > ntext) T = (int)ntext;
    r->B = B;
    r->T = T;
    r->layers = r->cfg.layers < REAL_MAX_LAYERS ? r->cfg.layers : REAL_MAX_LAYERS;
    r->draws = c->quick ? REAL_DRAWS_QUICK : REAL_DRAWS;
    *tok = malloc(sizeof(int32_t) * (size_t)B * T);
    const size_t n = (size_t)B * H * T * hd;
    *buf = malloc(sizeof(float) * (n * 8 + (size_t)real_m[REAL_NM - 1] * hd));
    if (!*tok || !*buf) {
        snprintf(r->msg, sizeof(r->msg), "out of memory");
        return -1;
    }
    for (int b = 0; b < B; b++) {
        size_t start = B > 1 ? (size_t)b * (ntext - (size_t)T) / (size_t)(B - 1) : 0;
        for (int t = 0; t < T; t++) (*tok)[(size_t)b * T + t] = text[start + (size_t)t];
    }
    return 0;
}

/* Every measured layer's own inputs (real_row), then N(0,1) inputs of the same shape with the
 * same draws of W, into r's rows. buf: real_windows'. The library's status. */
static pf_status real_measure(real_report *r, const demo_cfg *c, pf_model *m, const int32_t *tok,
                              float *buf) {
    const int B = r->B, T = r->T, H = r->cfg.heads, hd = r->cfg.d_model / r->cfg.heads;
    const size_t n = (size_t)B * H * T * hd;
    float *q = buf, *k = q + n, *v = k + n, *out_e = v + n, *out_f = out_e + n;
    float *rq = out_f + n, *rk = rq + n, *rv = rk + n, *W = rv + n;
    float *const scratch[3] = {out_e, out_f, W};
    pf_shape sh = {.B = B, .H = H, .Lq = T, .Lk = T, .d = hd, .dv = hd};
    pf_attn_opts opts = pf_attn_opts_default();
    opts.causal = 1; /* as the model attends */
    opts.threads = c->threads;
    pf_status st = PF_OK;
    for (int l = 0; l < r->layers && st == PF_OK; l++) {
        st = pf_model_attention_inputs(m, q, k, v, tok, B, T, l);
        if (st == PF_OK) st = real_row(r, l, q, k, v, &sh, &opts, scratch, c->seed);
    }
    /* the same shape, entries N(0,1), the same draws of W */
    float *rin[3] = {rq, rk, rv};
    for (int t = 0; t < 3 && st == PF_OK; t++) {
        pf_rng rng;
        pf_rng_init(&rng, c->seed, 101 + (uint64_t)t);
        st = pf_rng_fill_normal(&rng, rin[t], n);
    }
    if (st == PF_OK) st = real_row(r, r->layers, rq, rk, rv, &sh, &opts, scratch, c->seed);
    return st;
}

/* The child's work: the model on windows of the text, each layer's inputs, the errors. */
static void real_child(real_report *r, const demo_cfg *c) {
#ifdef _OPENMP
    if (c->threads > 0) omp_set_num_threads(c->threads);
#endif
    double t0 = tool_now_ms();
    pf_model *m = NULL;
    unsigned char *text = NULL;
    size_t ntext = 0;
    int32_t *tok = NULL;
    float *buf = NULL;
    if (real_open(r, c, &m, &text, &ntext) == 0 &&
        real_windows(r, c, text, ntext, &tok, &buf) == 0) {
        pf_status st = real_measure(r, c, m, tok, buf);
        if (st == PF_OK) {
            r->ms = tool_now_ms() - t0;
            r->ok = 1;
        } else {
            snprintf(r->msg, sizeof(r->msg), "the trained model's inputs: %s", pf_status_str(st));
        }
    }
    free(buf);
    free(tok);
    free(text);
    pf_model_free(m);
}

/* Runs real_child in a forked child (the parent never starts OpenMP's threads, which would not
 * survive the timing rows' forks). 0, or an exit code after a message. */
static int measure_real(real_report *r, const demo_cfg *c) {
    memset(r, 0, sizeof(*r));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return tool_fail(CMD, "fork: %s", strerror(errno));
    if (pid == 0) {
        real_child(r, c);
        _exit(0);
    }
    int wst = 0;
    while (waitpid(pid, &wst, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(wst))
        return tool_fail(CMD, "the trained model's part crashed (signal %d)", WTERMSIG(wst));
    if (!WIFEXITED(wst) || WEXITSTATUS(wst) != 0 || (!r->ok && !r->msg[0]))
        return tool_fail(CMD, "the trained model's part failed");
    if (!r->ok) return tool_fail(CMD, "%s", r->msg);
    return 0;
}

/* mean and standard deviation (n - 1) of x (n) */
static void mean_sd(const double *x, int n, double *mean, double *sd) {
    double s = 0, ss = 0;
    for (int i = 0; i < n; i++) s += x[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) ss += (x[i] - *mean) * (x[i] - *mean);
    *sd = n > 1 ? sqrt(ss / (n - 1)) : 0;
}

static void print_real(const real_report *r, const demo_cfg *c) {
    const int hd = r->cfg.d_model / r->cfg.heads;
    static const char *const att[] = {"exact", "FAVOR+", "FAVOR++", "local-window"};
    printf("\n"
           "FAVOR+ on a trained model's own queries, keys and values, causal as the model "
           "attends:\n"
           "  model  %s\n"
           "         (%s attention, step %lld; %d layers, d_model %d, %d heads of width %d)\n"
           "  text   %s: %d windows of %d bytes\n"
           "  err as above, mean \xC2\xB1 sd over %d draws of W (positive features, "
           "orthogonal),\n"
           "  the same draws for both kinds of input; the last row: N(0,1) entries of the same\n"
           "  shape, the hard case\n\n",
           c->checkpoint,
           r->cfg.attention == PF_LM_FAVOR && r->cfg.kernel == PF_KERNEL_ELU ? "elu + 1 linear"
                                                                           : att[r->cfg.attention],
           r->step, r->cfg.layers, r->cfg.d_model,
           r->cfg.heads, hd, c->text, r->B, r->T, r->draws);
    char s[64];
    cell("  inputs", -20);
    cell("|q'|\xC2\xB2", 7);
    cell("|k'|\xC2\xB2", 7);
    cell("rank q", 8);
    cell("rank k", 8);
    for (int j = 0; j < REAL_NM; j++) {
        snprintf(s, sizeof(s), "m = %d", real_m[j]);
        cell(s, 16);
    }
    putchar('\n');
    for (int l = 0; l <= r->layers; l++) {
        if (l < r->layers)
            snprintf(s, sizeof(s), "  layer %d", l + 1);
        else
            snprintf(s, sizeof(s), "  N(0,1) (hard case)");
        cell(s, -20);
        snprintf(s, sizeof(s), "%.2f", r->q2[l]);
        cell(s, 7);
        snprintf(s, sizeof(s), "%.2f", r->k2[l]);
        cell(s, 7);
        snprintf(s, sizeof(s), "%.1f", r->qr[l]);
        cell(s, 8);
        snprintf(s, sizeof(s), "%.1f", r->kr[l]);
        cell(s, 8);
        for (int j = 0; j < REAL_NM; j++) {
            double mean, sd;
            mean_sd(r->err[l][j], r->draws, &mean, &sd);
            snprintf(s, sizeof(s), "%.3f \xC2\xB1 %.3f", mean, sd);
            cell(s, 16);
        }
        putchar('\n');
    }
    if (r->layers < r->cfg.layers)
        printf("  (layers %d to %d not shown)\n", r->layers + 1, r->cfg.layers);
    printf("\n"
           "|q'|\xC2\xB2, |k'|\xC2\xB2: the mean squared norm of q' = q d^-1/4 and k' = k "
           "d^-1/4 (d = %d), what the\n"
           "  features see; rank: the effective rank (tr S)^2 / tr S^2 of the covariance S of "
           "a head's\n"
           "  queries (keys), averaged over the heads. Why the errors differ: not by the "
           "norms (N(0,1)\n"
           "  entries give |q'|\xC2\xB2 = sqrt(d) = %.0f) but by their structure: a trained "
           "layer's queries and\n"
           "  keys vary along a few directions, and random features estimate the softmax "
           "kernel there\n"
           "  better than over d independent ones.\n",
           hd, sqrt((double)hd));
}

/* ---- the command --------------------------------------------------------------------------- */

/* The options into c; *no_checkpoint: --no-checkpoint given. 0, or an exit code after a
 * message. */
static int parse_args(demo_cfg *c, int *no_checkpoint, int argc, char **argv) {
    int max_len_set = 0;
    tool_args a;
    tool_args_init(&a, CMD, argc, argv);
    while (tool_next(&a)) {
        const char *v = NULL;
        if (tool_opt(&a, "--max-len", &v)) {
            if (v) tool_parse_int(&a, "--max-len", v, 1, 1 << 24, &c->max_len);
            max_len_set = 1;
        } else if (tool_opt(&a, "--d", &v)) {
            if (v) tool_parse_int(&a, "--d", v, 1, 4096, &c->d);
        } else if (tool_opt(&a, "--heads", &v)) {
            if (v) tool_parse_int(&a, "--heads", v, 1, 4096, &c->H);
        } else if (tool_opt(&a, "--features", &v)) {
            if (v) tool_parse_int(&a, "--features", v, 1, 1 << 20, &c->m);
        } else if (tool_opt(&a, "--budget", &v)) {
            if (v) tool_parse_double(&a, "--budget", v, 0, HUGE_VAL, 1, &c->budget);
        } else if (tool_opt(&a, "--sigma", &v)) {
            if (v) tool_parse_double(&a, "--sigma", v, 0, 1e3, 1, &c->sigma);
        } else if (tool_opt(&a, "--threads", &v)) {
            if (v) tool_parse_int(&a, "--threads", v, 0, PF_MAX_THREADS, &c->threads);
        } else if (tool_opt(&a, "--seed", &v)) {
            if (v) tool_parse_u64(&a, "--seed", v, &c->seed);
        } else if (tool_flag(&a, "--quick")) {
            c->quick = 1;
        } else if (tool_path_opt(&a, "--checkpoint", &v)) {
            c->checkpoint = v;
        } else if (tool_flag(&a, "--no-checkpoint")) {
            *no_checkpoint = 1;
        } else if (tool_path_opt(&a, "--text", &v)) {
            c->text = v;
        } else {
            return tool_unknown(&a);
        }
    }
    if (a.failed) return TOOL_EXIT_USAGE;
    if (c->quick && max_len_set)
        return tool_usage(CMD, "--quick sets --max-len 4096: give one or the other");
    if (c->quick) c->max_len = 4096;
    if (*no_checkpoint && (c->checkpoint || c->text))
        return tool_usage(CMD, "--no-checkpoint leaves the trained model out: --%s is for it",
                          c->checkpoint ? "checkpoint" : "text");
    return 0;
}

/* The trained model's files: those given, or the shipped ones when found. *missing: the
 * shipped file not found, where that leaves the part out. 0, or an exit code after a message
 * (a --checkpoint given with no text to run on). */
static int find_real_files(demo_cfg *c, int no_checkpoint, const char **missing) {
    static char found_ckpt[4096], found_text[4096], real_ckpt[PATH_MAX], real_text[PATH_MAX];
    const int ckpt_given = c->checkpoint != NULL;
    if (!no_checkpoint && !ckpt_given) {
        if (tool_find_data(found_ckpt, sizeof(found_ckpt), DEMO_CHECKPOINT))
            c->checkpoint = realpath(found_ckpt, real_ckpt) ? real_ckpt : found_ckpt;
        else
            *missing = "data/" DEMO_CHECKPOINT;
    }
    if (c->checkpoint && !c->text) {
        if (tool_find_data(found_text, sizeof(found_text), DEMO_TEXT)) {
            c->text = realpath(found_text, real_text) ? real_text : found_text;
        } else if (ckpt_given) {
            return tool_usage(CMD, "--checkpoint needs a text to run on: --text FILE (the "
                                   "shipped data/" DEMO_TEXT " was not found)");
        } else {
            *missing = "data/" DEMO_TEXT;
            c->checkpoint = NULL;
        }
    }
    return 0;
}

/* The trained model's part (measure_real) into a report in shared memory, *out; the caller
 * unmaps it. 0, or an exit code after a message. */
static int run_real(const demo_cfg *c, real_report **out) {
    fprintf(stderr, "  the trained model's queries, keys and values...");
    real_report *real =
        mmap(NULL, sizeof(*real), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (real == MAP_FAILED) return tool_fail(CMD, "mmap: %s", strerror(errno));
    int rc = measure_real(real, c);
    if (rc) {
        munmap(real, sizeof(*real));
        return rc;
    }
    fprintf(stderr, " done (%.1f s)\n", real->ms / 1000);
    *out = real;
    return 0;
}

/* The timing rows (measure_row) for L = 512, 1024, ... up to c->max_len, *n of them; exact
 * attention while its predicted time stays within the budget. 0, or an exit code. */
static int run_rows(row *rows, int *n, const demo_cfg *c) {
    double last_exact_ms = 0;
    int run_exact = 1;
    for (int L = c->max_len < 512 ? c->max_len : 512; L <= c->max_len && *n < MAX_ROWS; L *= 2) {
        /* exact attention is quadratic: doubling L multiplies its time by 4 */
        if (run_exact && *n > 0) run_exact = last_exact_ms * 4 < c->budget * 1000;
        row *r = &rows[*n];
        memset(r, 0, sizeof(*r));
        r->L = L;
        int rc = measure_row(r, c, run_exact);
        if (rc) return rc;
        (*n)++;
        if (run_exact) {
            if (!r->exact.ok) run_exact = 0;
            last_exact_ms = r->exact.ms;
        }
        if (L > INT_MAX / 2) break;
    }
    return 0;
}

/* The tables on stdout: the timing rows (print_table), then the trained model's part, or
 * why it was left out (missing: the shipped file not found). */
static void print_results(const row *rows, int n, const demo_cfg *c, int nthreads,
                          const real_report *real, const char *missing) {
    printf("performer demo: exact attention vs FAVOR+, B=1, H=%d, d=%d, m=%d, %d thread%s;\n"
           "entries of Q, K ~ N(0, sigma^2), of V ~ N(0, 1); err: ||approx - exact|| / ||exact||,\n"
           "where 1.0 is the error of answering 0\n\n",
           c->H, c->d, c->m, nthreads, nthreads == 1 ? "" : "s");
    print_table(rows, n, c, c->budget);
    if (real) {
        print_real(real, c);
    } else if (missing) {
        printf("\nFAVOR+ on a trained model's own queries, keys and values: left out (%s was not\n"
               "  found beside this performer, nor in $PERFORMER_DATA; --checkpoint and --text\n"
               "  name the files).\n",
               missing);
    }
}

/* 1 if a method that was run failed in some row. */
static int any_failed(const row *rows, int n) {
    int failed = 0;
    for (int i = 0; i < n; i++) {
        failed |= !rows[i].favor.ok || !rows[i].causal.ok ||
                  (rows[i].exact_run && (!rows[i].exact.ok || !rows[i].favorpp.ok)) ||
                  (rows[i].hard_run && !rows[i].hard.ok);
    }
    return failed;
}

int cmd_demo(int argc, char **argv) {
    demo_cfg c = {.max_len = 65536,
                  .d = 64,
                  .H = 8,
                  .m = 256,
                  .threads = 0,
                  .quick = 0,
                  .budget = 10,
                  .sigma = DEMO_SIGMA,
                  .seed = 0,
                  .checkpoint = NULL,
                  .text = NULL};
    int no_checkpoint = 0;
    const char *missing = NULL;
    int rc = parse_args(&c, &no_checkpoint, argc, argv);
    if (!rc) rc = find_real_files(&c, no_checkpoint, &missing);
    if (rc) return rc;
    int nthreads = c.threads;
#ifdef _OPENMP
    if (nthreads == 0) nthreads = omp_get_max_threads(); /* reads a setting, starts nothing */
#endif
    fprintf(stderr, "performer demo: B=1, H=%d, d=%d, m=%d, sigma=%g, %d thread%s, L up to %d\n",
            c.H, c.d, c.m, c.sigma, nthreads, nthreads == 1 ? "" : "s", c.max_len);
    double t0 = tool_now_ms();
    /* first the trained model (a few seconds), so that a bad --checkpoint fails at once */
    real_report *real = NULL;
    if (c.checkpoint && (rc = run_real(&c, &real)) != 0) return rc;
    row rows[MAX_ROWS];
    int n = 0;
    rc = run_rows(rows, &n, &c);
    if (rc) return rc;
    fprintf(stderr, "performer demo: %.0f s\n", (tool_now_ms() - t0) / 1000);
    print_results(rows, n, &c, nthreads, real, missing);
    if (real) munmap(real, sizeof(*real));
    return any_failed(rows, n) ? TOOL_EXIT_FAIL : TOOL_EXIT_OK;
}
