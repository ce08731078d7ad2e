/* cmd_approx.c: `performer approx`: the estimator lab. Named experiments measure how far each
 * estimator of softmax attention (FAVOR+ with its feature maps, projections and row norms,
 * FAVOR++, FAVOR#, RA, LARA) lands from exact attention, and check the papers' claims
 * (docs/results.md).
 *
 * The error of one estimate is the MSE of the attention output against exact attention: the
 * mean over the L x dv entries of (out - exact)^2 (the kernel experiment looks
 * one level lower: the relative MSE of the kernel values). Each point is repeated over
 * independent draws (W from (seed, stream = draw index); RA and LARA from their own per-head
 * streams) on fixed inputs, and reported as mean and standard deviation over the draws. Inputs
 * are the same for every series at a point, so series are compared on equal terms.
 *
 * The draws of one point run as the heads of a single library call: the inputs are copied to H
 * = draws heads, each head gets its own W (w_per_head) or its own sampling stream (b*H + h), and
 * the library spreads the heads over its threads. A call that fails (say a trig denominator of
 * exactly 0) is redone one draw at a time, so only the failing draws are lost (and counted).
 *
 * Per experiment: DIR/NAME.csv (atomic: a temporary file, then renamed) with one row per
 * (panel, series, x), DIR/NAME.png drawn by scripts/plot_approx.py, and a table on stdout.
 *
 * The hard case: on N(0, sigma^2) inputs with sigma >= 1 the positive features' variance, which
 * grows like exp(|q'+k'|^2), puts most estimates above the error of answering 0 (trig's up to
 * 1e9 times it). Those rows are marked (row.hard), and the table shows a newcomer first the
 * panels where the estimators work and labels the hard ones; the CSV keeps its rows and order. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "tool.h"

#define CMD "approx"

enum { SEED_INPUT = 1, SEED_W = 2, SEED_SAMPLING = 3 };

const char cmd_approx_synopsis[] =
    "performer approx [--all | NAME...] [--out DIR] [--draws N] [--quick] [--threads N]\n"
    "     [--no-plot] [--checkpoint FILE] [--text FILE]\n"
    "     NAME: ortho maps kernel norms estimators length real\n";

void cmd_approx_help(void) {
    printf("usage: %s\n"
           "Runs experiments that measure the error of each estimator of softmax attention\n"
           "against exact attention: the MSE of the output, mean and standard deviation over\n"
           "independent draws of the random features (or samples). For each experiment NAME it\n"
           "writes DIR/NAME.csv and DIR/NAME.png and prints a table; progress goes to stderr.\n"
           "\n"
           "experiments:\n"
           "  ortho        iid vs orthogonal W, positive and trig maps, MSE vs m\n"
           "               (d = 16, L = 1024 and 4096, 15 draws, as in the Performer paper)\n"
           "  maps         positive, hyperbolic, trig, FAVOR++ and FAVOR# as the input scale\n"
           "               grows, on isotropic and anisotropic inputs (m = 128, L = 1024)\n"
           "  kernel       the same maps and inputs, but the error of each kernel value\n"
           "               exp(s q.k) itself: relative MSE over the (q_i, k_i) pairs\n"
           "  norms        chi, sqrt(d) and QMC row norms of orthogonal W, MSE vs m\n"
           "  estimators   RFA, FAVOR+, FAVOR++, RA and LARA vs the number of samples on\n"
           "               clustered and on unstructured inputs (L = 512; RA is quadratic)\n"
           "  length       MSE vs L at m = 64 (positive orthogonal and iid, trig)\n"
           "  real         causal attention on the queries, keys and values of each layer of\n"
           "               a trained model (--checkpoint) run on a text (--text): positive\n"
           "               (orthogonal and iid), FAVOR++, hyperbolic, trig and relu vs m, with\n"
           "               the MSE split into squared bias and variance over the draws and\n"
           "               the iid-projection prediction for positive iid features; not in\n"
           "               --all\n"
           "\n"
           "options:                                                              [default]\n"
           "  --all           every experiment\n"
           "  --out DIR       output folder, created if missing (its parent must exist)\n"
           "                                                                      [approx-out]\n"
           "  --draws N       draws per point, N >= 2, for every experiment   [per experiment]\n"
           "  --quick         tiny sizes and 3 draws: seconds, for tests          [off]\n"
           "  --threads N     threads, 0 = OpenMP's default; results do not depend on it [0]\n"
           "  --no-plot       write the CSV files and tables only                 [off]\n"
           "  --checkpoint FILE  real: the model           [data/demo-kjv.safetensors]\n"
           "  --text FILE     real: the text its windows come from [data/demo-kjv-val.txt]\n"
           "\n"
           "Each table shows first the panels where the estimators work and labels the hard\n"
           "case: inputs N(0, sigma^2) with sigma >= 1, where the positive features' variance,\n"
           "like exp(|q'+k'|^2), puts most estimates above the error of answering 0 (the\n"
           "\"answer 0\" column). The CSV files keep every row in the experiment's order.\n"
           "CSV columns: panel, series, xvar, x, draws, failed, mse_mean, mse_std, mse_median,\n"
           "zero_mse, mse_q25, mse_q75, bias2, variance (failed: draws whose estimate was not\n"
           "finite, left out of the statistics; zero_mse: the error of answering 0, i.e. the\n"
           "mean square of the exact output, or 1 for the kernel experiment's relative MSE;\n"
           "mse_q25, mse_q75: the quartiles over the draws; bias2 + variance = mse_mean: the\n"
           "squared error of the draws' mean output, and the spread of the draws around it,\n"
           "nan for the kernel experiment and for closed forms).\n"
           "Feature counts: m is the number of random projections; positive, FAVOR++,\n"
           "FAVOR# and relu have r = m features, trig and hyperbolic r = 2m.\n"
           "Plots need /usr/bin/python3 with matplotlib and scripts/plot_approx.py (found\n"
           "next to the executable, or in $PERFORMER_SCRIPTS).\n",
           cmd_approx_synopsis);
}

/* ---- configuration ------------------------------------------------------------------------- */

typedef struct approx_cfg {
    const char *out;
    int draws; /* 0: each experiment's own */
    int quick, threads, no_plot;
    int want[8];            /* which experiments, by index into experiments[] */
    const char *checkpoint; /* real: the trained model and the text it runs on */
    const char *text;
} approx_cfg;

typedef struct row {
    char panel[48], series[24], xvar[12];
    double x;
    int draws, failed;
    double mean, sd, median, zero_mse;
    double q25, q75;       /* quartiles of the draws' MSE */
    double bias2, variance; /* the mean MSE split over the draws (NaN where not measured) */
    int hard; /* inputs of the hard case (the table labels it; not in the CSV) */
} row;

/* An experiment's state while it runs. */
typedef struct lab {
    const approx_cfg *cfg;
    const char *name;
    char title[160];    /* the table's and the plot's title (the script adds draws and band) */
    const char *metric; /* what mse_* measure: the table's caption and the plot's y label */
    const char *zero;   /* what the "answer 0" column is, for the table's caption */
    int hard;           /* the rows added now are the hard case (add_row marks them) */
    row *rows;
    int n, cap;
    int step, steps; /* progress: (panel, series) pairs done and planned */
    double t0;
    int fatal; /* a library error other than a failed draw: the experiment stops */
} lab;

typedef struct experiment {
    const char *name;
    void (*run)(lab *lb);
    int in_all; /* run by --all (real, which needs a trained model, must be named) */
} experiment;

/* ---- inputs ---------------------------------------------------------------------------------- */

/* One set of inputs, copied to H heads (one per draw), and the exact output. */
typedef struct inputs {
    int L, d, dv, H;
    float *Q, *K, *V; /* (H,L,d), (H,L,d), (H,L,dv); head 0 is filled by a generator */
    float *exact;     /* (L,dv) */
    double exact_ms;  /* mean square of exact */
    float *out;       /* (H,L,dv) */
} inputs;

static void inputs_free(inputs *in) {
    free(in->Q);
    free(in->K);
    free(in->V);
    free(in->exact);
    free(in->out);
    memset(in, 0, sizeof(*in));
}

static int inputs_alloc(inputs *in, int L, int d, int dv, int H) {
    memset(in, 0, sizeof(*in));
    in->L = L;
    in->d = d;
    in->dv = dv;
    in->H = H;
    size_t nq = (size_t)H * L * d, nv = (size_t)H * L * dv;
    in->Q = malloc(sizeof(float) * nq);
    in->K = malloc(sizeof(float) * nq);
    in->V = malloc(sizeof(float) * nv);
    in->out = malloc(sizeof(float) * nv);
    in->exact = malloc(sizeof(float) * (size_t)L * dv);
    if (!in->Q || !in->K || !in->V || !in->out || !in->exact) {
        inputs_free(in);
        return -1;
    }
    return 0;
}

static void fill_normal(float *x, size_t n, double sigma, uint64_t stream) {
    pf_rng rng;
    pf_rng_init(&rng, SEED_INPUT, stream);
    pf_rng_fill_normal(&rng, x, n);
    for (size_t i = 0; i < n; i++) x[i] = (float)(sigma * x[i]);
}

/* Copies head 0 to the other heads and computes exact attention. 0 or -1 (lb->fatal set). */
static int inputs_finish(lab *lb, inputs *in) {
    size_t nq = (size_t)in->L * in->d, nv = (size_t)in->L * in->dv;
    for (int h = 1; h < in->H; h++) {
        memcpy(in->Q + h * nq, in->Q, sizeof(float) * nq);
        memcpy(in->K + h * nq, in->K, sizeof(float) * nq);
        memcpy(in->V + h * nv, in->V, sizeof(float) * nv);
    }
    pf_shape sh = {1, 1, in->L, in->L, in->d, in->dv};
    pf_attn_opts opts = pf_attn_opts_default();
    opts.threads = lb->cfg->threads;
    pf_status st = pf_attn_exact(in->exact, NULL, in->Q, in->K, in->V, &sh, &opts);
    if (st != PF_OK) {
        tool_fail(CMD, "%s: exact attention failed: %s", lb->name, pf_status_str(st));
        lb->fatal = 1;
        return -1;
    }
    double s = 0;
    for (size_t i = 0; i < nv; i++) s += (double)in->exact[i] * in->exact[i];
    in->exact_ms = s / (double)nv;
    return 0;
}

/* Q and K with covariance sigma^2 U diag(lam) U^T: eigenvalues log-spaced from 1 down to
 * 1/ratio, rescaled to mean 1 (so E|x|^2 = d sigma^2, as for isotropic inputs), U a Haar
 * rotation shared by Q and K. Head 0 only; V ~ N(0,1). */
static int fill_anisotropic(inputs *in, double sigma, double ratio) {
    int d = in->d, L = in->L;
    float *U = malloc(sizeof(float) * (size_t)d * d);
    double *lam = malloc(sizeof(double) * (size_t)d), *z = malloc(sizeof(double) * (size_t)d);
    if (!U || !lam || !z) {
        free(U);
        free(lam);
        free(z);
        return -1;
    }
    /* rows of norm sqrt(d), exactly orthogonal: U / sqrt(d) is a rotation */
    pf_projection_draw(U, d, d, PF_PROJ_ORTHOGONAL, PF_NORM_SQRTD, SEED_INPUT, 100);
    double mean = 0;
    for (int i = 0; i < d; i++) {
        lam[i] = pow(ratio, -(double)i / (d > 1 ? d - 1 : 1));
        mean += lam[i] / d;
    }
    for (int t = 0; t < 2; t++) {
        float *X = t == 0 ? in->Q : in->K;
        pf_rng rng;
        pf_rng_init(&rng, SEED_INPUT, 10 + (uint64_t)t);
        for (int r = 0; r < L; r++) {
            for (int i = 0; i < d; i++)
                z[i] = pf_rng_normal(&rng) * sqrt(lam[i] / mean) * sigma / sqrt((double)d);
            for (int e = 0; e < d; e++) {
                double acc = 0;
                for (int i = 0; i < d; i++) acc += (double)U[(size_t)i * d + e] * z[i];
                X[(size_t)r * d + e] = (float)acc;
            }
        }
    }
    fill_normal(in->V, (size_t)L * in->dv, 1.0, 12);
    free(U);
    free(lam);
    free(z);
    return 0;
}

/* The setting of the LARA paper (Zheng et al. 2022) in miniature: the sequence is G
 * contiguous segments, each with its own centre c_g ~ N(0, sc^2 I); a token's key and query
 * are its segment's centre plus N(0, sn^2 I) noise, so keys cluster and every query sits near
 * its own cluster. V ~ N(0,1). */
static int fill_clustered(inputs *in, int G, double sc, double sn) {
    int d = in->d, L = in->L;
    float *c = malloc(sizeof(float) * (size_t)G * d);
    if (!c) return -1;
    fill_normal(c, (size_t)G * d, sc, 20);
    fill_normal(in->Q, (size_t)L * d, sn, 21);
    fill_normal(in->K, (size_t)L * d, sn, 22);
    for (int t = 0; t < L; t++) {
        int g = (int)((int64_t)t * G / L);
        for (int e = 0; e < d; e++) {
            in->Q[(size_t)t * d + e] += c[(size_t)g * d + e];
            in->K[(size_t)t * d + e] += c[(size_t)g * d + e];
        }
    }
    fill_normal(in->V, (size_t)L * in->dv, 1.0, 23);
    free(c);
    return 0;
}

/* ---- estimators -------------------------------------------------------------------------- */

typedef enum { EST_FAVOR, EST_RA, EST_LARA } est_kind;

typedef struct method {
    const char *series;
    est_kind kind;
    pf_kernel kernel;
    pf_proj_kind proj;
    pf_norm_kind norm;
    int det; /* LARA: epsilon = 0 */
} method;

static pf_status run_method(const lab *lb, const method *me, int n, float *out, const float *Q,
                            const float *K, const float *V, const float *W, const pf_shape *sh) {
    pf_attn_opts opts = pf_attn_opts_default();
    opts.threads = lb->cfg->threads;
    if (me->kind == EST_FAVOR) {
        pf_favor_opts fav = pf_favor_opts_default();
        fav.kernel = me->kernel;
        fav.W = W;
        fav.m = n;
        fav.w_per_head = 1;
        return pf_attn_favor(out, Q, K, V, sh, &opts, &fav);
    }
    pf_sampling_opts sp = pf_sampling_opts_default();
    sp.seed = SEED_SAMPLING;
    if (me->kind == EST_RA) {
        sp.samples = n;
        return pf_attn_ra(out, Q, K, V, sh, &opts, &sp);
    }
    sp.proposals = n;
    sp.samples = 1;
    sp.deterministic = me->det;
    return pf_attn_lara(out, Q, K, V, sh, &opts, &sp);
}

/* 1 if this library computes FAVOR with this kernel (FAVOR++ and FAVOR# may be missing). */
static int kernel_available(pf_kernel kernel) {
    float x[8] = {0.1f, -0.2f, 0.3f, 0.05f, -0.1f, 0.2f, 0.0f, 0.1f}, W[4] = {1, 0, 0, 1}, o[4];
    pf_shape sh = {1, 1, 2, 2, 2, 2};
    pf_attn_opts opts = pf_attn_opts_default();
    opts.threads = 1;
    pf_favor_opts fav = pf_favor_opts_default();
    fav.kernel = kernel;
    fav.W = W;
    fav.m = 2;
    return pf_attn_favor(o, x, x + 4, x, &sh, &opts, &fav) == PF_OK;
}

static int method_available(const method *me) {
    return me->kind != EST_FAVOR || kernel_available(me->kernel);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The p-quantile of sorted x (n >= 1), linearly interpolated (numpy's default). */
static double quantile(const double *x, int n, double p) {
    double pos = p * (n - 1);
    int i = (int)pos;
    if (i >= n - 1) return x[n - 1];
    return x[i] + (pos - i) * (x[i + 1] - x[i]);
}

/* failed, mean, sd (n - 1), median and quartiles of the good values x[0..good) of r->draws;
 * sorts x. bias2 and variance are left NaN (eval_point's split sets them). */
static void set_stats(row *r, double *x, int good) {
    double sum = 0, sum2 = 0;
    for (int i = 0; i < good; i++) sum += x[i];
    r->failed = r->draws - good;
    r->mean = good ? sum / good : NAN;
    for (int i = 0; i < good; i++) sum2 += (x[i] - r->mean) * (x[i] - r->mean);
    r->sd = good > 1 ? sqrt(sum2 / (good - 1)) : good ? 0.0 : NAN;
    if (good) qsort(x, (size_t)good, sizeof(double), cmp_double);
    r->median = !good ? NAN : good % 2 ? x[good / 2] : 0.5 * (x[good / 2 - 1] + x[good / 2]);
    r->q25 = good ? quantile(x, good, 0.25) : NAN;
    r->q75 = good ? quantile(x, good, 0.75) : NAN;
    r->bias2 = r->variance = NAN;
}

/* The draws' mean MSE split into squared bias and variance, over the n good outputs outs[g]
 * (each of nv entries) against exact: with mean_i the draws' mean of entry i,
 *     bias2 = mean_i (mean_i - exact_i)^2,  variance = mean_i mean_g (out_gi - mean_i)^2,
 * so that mean_g MSE_g = bias2 + variance exactly (the variance divides by n, not n - 1). */
static void bias_variance(row *r, const float *const *outs, int n, const float *exact, size_t nv) {
    if (n < 1) return;
    double b = 0, v = 0;
    for (size_t i = 0; i < nv; i++) {
        double m = 0;
        for (int g = 0; g < n; g++) m += outs[g][i];
        m /= n;
        double e = m - (double)exact[i], s = 0;
        for (int g = 0; g < n; g++) s += ((double)outs[g][i] - m) * ((double)outs[g][i] - m);
        b += e * e;
        v += s / n;
    }
    r->bias2 = b / (double)nv;
    r->variance = v / (double)nv;
}

static void add_row(lab *lb, const row *r) {
    if (lb->n == lb->cap) {
        int cap = lb->cap ? 2 * lb->cap : 64;
        row *p = realloc(lb->rows, sizeof(row) * (size_t)cap);
        if (!p) {
            tool_fail(CMD, "out of memory");
            lb->fatal = 1;
            return;
        }
        lb->rows = p;
        lb->cap = cap;
    }
    lb->rows[lb->n] = *r;
    lb->rows[lb->n++].hard = lb->hard;
}

/* The statistics of one point from its draws' outputs (draw h at outs + h * nv, used where
 * ok[h]) against exact, into r, which is then appended; mse: scratch for r->draws values. A
 * draw whose MSE is not finite is left out like a failed one. */
static void finish_point(lab *lb, row *r, const float *outs, const int *ok, double *mse,
                         const float *exact, size_t nv) {
    const float **good_out = malloc(sizeof(*good_out) * (size_t)r->draws);
    if (!good_out) {
        tool_fail(CMD, "out of memory");
        lb->fatal = 1;
        return;
    }
    int good = 0;
    for (int h = 0; h < r->draws; h++) {
        if (!ok[h]) continue;
        const float *o = outs + (size_t)h * nv;
        double s = 0;
        for (size_t i = 0; i < nv; i++) {
            double e = (double)o[i] - (double)exact[i];
            s += e * e;
        }
        s /= (double)nv;
        if (!isfinite(s)) continue;
        good_out[good] = o;
        mse[good++] = s;
    }
    set_stats(r, mse, good);
    bias_variance(r, good_out, good, exact, nv);
    free(good_out);
    add_row(lb, r);
}

/* One point: the method with size n (m, S or C) on every draw (head) of in; appends a row. */
static void eval_point(lab *lb, inputs *in, const method *me, int n, const char *panel,
                       const char *xvar, double x) {
    if (lb->fatal) return;
    const int H = in->H, L = in->L, d = in->d, dv = in->dv;
    float *W = NULL;
    if (me->kind == EST_FAVOR) {
        W = malloc(sizeof(float) * (size_t)H * n * d);
        if (!W) {
            tool_fail(CMD, "out of memory for W (%d x %d x %d)", H, n, d);
            lb->fatal = 1;
            return;
        }
        for (int h = 0; h < H; h++)
            pf_projection_draw(W + (size_t)h * n * d, n, d, me->proj, me->norm, SEED_W,
                               (uint64_t)h);
    }
    pf_shape sh = {1, H, L, L, d, dv};
    int *ok = calloc((size_t)H, sizeof(int));
    if (!ok) {
        free(W);
        tool_fail(CMD, "out of memory");
        lb->fatal = 1;
        return;
    }
    pf_status st = run_method(lb, me, n, in->out, in->Q, in->K, in->V, W, &sh);
    size_t nq = (size_t)L * d, nv = (size_t)L * dv;
    if (st == PF_OK) {
        for (int h = 0; h < H; h++) ok[h] = 1;
    } else if (st == PF_EDOMAIN || st == PF_ENONFINITE) {
        /* Redo FAVOR one draw at a time (W carries the draw) to keep the draws that work. A
         * sampler's draws come from one call's streams (b*H + h) and cannot be split: a
         * failure loses them all. */
        pf_shape one = {1, 1, L, L, d, dv};
        for (int h = 0; h < H; h++) {
            ok[h] = me->kind == EST_FAVOR &&
                    run_method(lb, me, n, in->out + h * nv, in->Q + h * nq, in->K + h * nq,
                               in->V + h * nv, W + (size_t)h * n * d, &one) == PF_OK;
        }
    } else {
        tool_fail(CMD, "%s: %s with %s %d failed: %s", lb->name, me->series, xvar, n,
                  pf_status_str(st));
        lb->fatal = 1;
        free(W);
        free(ok);
        return;
    }
    free(W);

    double *mse = malloc(sizeof(double) * (size_t)H);
    if (!mse) {
        tool_fail(CMD, "out of memory");
        lb->fatal = 1;
        free(ok);
        return;
    }
    row r;
    memset(&r, 0, sizeof(r));
    snprintf(r.panel, sizeof(r.panel), "%s", panel);
    snprintf(r.series, sizeof(r.series), "%s", me->series);
    snprintf(r.xvar, sizeof(r.xvar), "%s", xvar);
    r.x = x;
    r.draws = H;
    r.zero_mse = in->exact_ms;
    finish_point(lb, &r, in->out, ok, mse, in->exact, nv);
    free(mse);
    free(ok);
}

/* The progress line of one (panel, series): "approx NAME: [k/n] panel series time". */
static void progress(lab *lb, const char *panel, const char *series, double ms) {
    lb->step++;
    fprintf(stderr, "approx %s: [%d/%d] %-18s %-15s %6.1f s\n", lb->name, lb->step, lb->steps,
            panel, series, ms / 1e3);
}

/* Runs a series (one method over xs) on in, with a progress line. sizes[i] is the method's
 * size at x = xs[i]. */
static void eval_series(lab *lb, inputs *in, const method *me, const char *panel, const char *xvar,
                        const int *sizes, const double *xs, int nx) {
    if (lb->fatal) return;
    if (!method_available(me)) {
        lb->step++;
        fprintf(stderr, "performer approx: %s: %s is not in this library yet: skipped\n", lb->name,
                me->series);
        return;
    }
    double t0 = tool_now_ms();
    for (int i = 0; i < nx && !lb->fatal; i++) eval_point(lb, in, me, sizes[i], panel, xvar, xs[i]);
    if (!lb->fatal) progress(lb, panel, me->series, tool_now_ms() - t0);
}

/* Rows from `first` on were added in (panel, x, series) order; puts them in (panel, series, x)
 * order, panels as they first appear and series as listed, for the table and the CSV. */
static void reorder(lab *lb, int first, const method *const *ms, int ns) {
    int n = lb->n - first, k = 0;
    if (n <= 0) return;
    row *tmp = malloc(sizeof(row) * (size_t)n);
    if (!tmp) return; /* the order only matters for reading: keep the rows as they are */
    for (int i = first; i < lb->n; i++) {
        int seen = 0;
        for (int j = first; j < i && !seen; j++)
            seen = strcmp(lb->rows[j].panel, lb->rows[i].panel) == 0;
        if (seen) continue;
        for (int s = 0; s < ns; s++) {
            for (int j = i; j < lb->n; j++) {
                const row *r = &lb->rows[j];
                if (strcmp(r->panel, lb->rows[i].panel) == 0 &&
                    strcmp(r->series, ms[s]->series) == 0)
                    tmp[k++] = *r;
            }
        }
    }
    if (k == n) memcpy(lb->rows + first, tmp, sizeof(row) * (size_t)n);
    free(tmp);
}

/* The kernel estimates themselves, on the maps experiment's inputs: over the L pairs
 * (q_i, k_i), the mean of (phi(q_i).phi(k_i) / exp(s q_i.k_i) - 1)^2, the relative error of the
 * kernel value (answering 0 scores 1), which is what the FAVOR++ and FAVOR# papers compare.
 * Features come stabilised, so the ratio is exp(logscale_q + logscale_k - s q.k) phi(q).phi(k),
 * in double. FAVOR++ and FAVOR# take their parameters from all of Q and K, as attention does. */
static void kernel_point(lab *lb, const inputs *in, const method *me, int m, const char *panel,
                         double x) {
    const int L = in->L, d = in->d, H = in->H, r = pf_kernel_width(me->kernel, m);
    const float scale = (float)(1.0 / sqrt((double)d));
    float *W = malloc(sizeof(float) * (size_t)m * d);
    float *pq = malloc(sizeof(float) * (size_t)L * r), *pk = malloc(sizeof(float) * (size_t)L * r);
    float *lq = malloc(sizeof(float) * (size_t)L), *lk = malloc(sizeof(float) * (size_t)L);
    float *A = malloc(sizeof(float) * (size_t)d * d), *B = malloc(sizeof(float) * (size_t)d * d);
    double *err = malloc(sizeof(double) * (size_t)H);
    pf_kernel_params kp;
    memset(&kp, 0, sizeof(kp));
    pf_status st = PF_ENOMEM;
    if (W && pq && pk && lq && lk && A && B && err) {
        st = PF_OK;
        if (me->kernel == PF_KERNEL_OPRF)
            st = pf_oprf_optimal_a(&kp.oprf_a, in->Q, L, in->K, L, d, scale);
        if (me->kernel == PF_KERNEL_SDERF) {
            st = pf_sderf_params(A, B, &kp.sderf_log_D, in->Q, L, in->K, L, d, scale);
            kp.sderf_A = A;
            kp.sderf_B = B;
        }
    }
    int good = 0;
    for (int h = 0; h < H && st == PF_OK; h++) {
        pf_projection_draw(W, m, d, me->proj, me->norm, SEED_W, (uint64_t)h);
        st = pf_features_ex(pq, lq, in->Q, L, d, W, m, me->kernel, scale, 0.0f, &kp);
        if (st == PF_OK)
            st = pf_features_ex(pk, lk, in->K, L, d, W, m, me->kernel, scale, 0.0f, &kp);
        if (st != PF_OK) break;
        double e = 0;
        for (int i = 0; i < L; i++) {
            const float *a = pq + (size_t)i * r, *b = pk + (size_t)i * r;
            const float *q = in->Q + (size_t)i * d, *k = in->K + (size_t)i * d;
            double dot = 0, qk = 0;
            for (int j = 0; j < r; j++) dot += (double)a[j] * b[j];
            for (int j = 0; j < d; j++) qk += (double)q[j] * k[j];
            double ratio = exp((double)lq[i] + (double)lk[i] - scale * qk) * dot;
            e += (ratio - 1) * (ratio - 1);
        }
        e /= L;
        if (isfinite(e)) err[good++] = e;
    }
    if (st != PF_OK) {
        tool_fail(CMD, "%s: %s features with m %d failed: %s", lb->name, me->series, m,
                  pf_status_str(st));
        lb->fatal = 1;
    } else {
        row rw;
        memset(&rw, 0, sizeof(rw));
        snprintf(rw.panel, sizeof(rw.panel), "%s", panel);
        snprintf(rw.series, sizeof(rw.series), "%s", me->series);
        snprintf(rw.xvar, sizeof(rw.xvar), "sigma");
        rw.x = x;
        rw.draws = H;
        set_stats(&rw, err, good);
        rw.zero_mse = 1.0; /* the relative MSE of answering 0 */
        add_row(lb, &rw);
    }
    free(W);
    free(pq);
    free(pk);
    free(lq);
    free(lk);
    free(A);
    free(B);
    free(err);
}

/* The closed form behind kernel_point for the positive map and FAVOR++ with iid features
 * (Likhosherstov et al. 2022, "Chefs' Random Tables"): one feature's relative variance for the
 * pair x, y (scaled) with s = |x + y|^2 is (1 - 4A)^d (1 - 8A)^(-d/2) exp(s / (1 - 8A)) - 1
 * (A = 0: the positive map, e^s - 1, as in Lemma 2 of the Performer paper), and m features
 * divide it by m. Averaged over the same pairs; no sampling, so no spread. It shows
 * what a finite sample of a heavy-tailed estimator hides: the positive map's measured error
 * stays far below its expectation once |q|, |k| are large. */
static void kernel_theory(lab *lb, const inputs *in, const method *me, int m, const char *panel,
                          double x) {
    const int L = in->L, d = in->d;
    const double scale = 1.0 / sqrt((double)d);
    float A = 0.0f;
    if (me->kernel == PF_KERNEL_OPRF &&
        pf_oprf_optimal_a(&A, in->Q, L, in->K, L, d, (float)scale) != PF_OK) {
        tool_fail(CMD, "%s: FAVOR++'s A failed", lb->name);
        lb->fatal = 1;
        return;
    }
    const double a = A, logc = d * log(1 - 4 * a) - 0.5 * d * log(1 - 8 * a);
    double e = 0;
    for (int i = 0; i < L; i++) {
        double s = 0;
        for (int j = 0; j < d; j++) {
            double t = (double)in->Q[(size_t)i * d + j] + (double)in->K[(size_t)i * d + j];
            s += scale * t * t;
        }
        e += expm1(logc + s / (1 - 8 * a)) / m;
    }
    row rw;
    memset(&rw, 0, sizeof(rw));
    snprintf(rw.panel, sizeof(rw.panel), "%s", panel);
    snprintf(rw.series, sizeof(rw.series), "%s", me->series);
    snprintf(rw.xvar, sizeof(rw.xvar), "sigma");
    rw.x = x;
    rw.draws = in->H;
    rw.mean = rw.median = rw.q25 = rw.q75 = e / L;
    rw.sd = 0.0;
    rw.bias2 = rw.variance = NAN;
    rw.zero_mse = 1.0;
    add_row(lb, &rw);
}

static int draws_of(const lab *lb, int full) {
    return lb->cfg->draws ? lb->cfg->draws : lb->cfg->quick ? 3 : full;
}

static void oom(lab *lb) {
    tool_fail(CMD, "%s: out of memory for the inputs", lb->name);
    lb->fatal = 1;
}

/* ---- the experiments --------------------------------------------------------------------- */

static const method M_POS_ORTH = {"positive orth",    EST_FAVOR,   PF_KERNEL_POSITIVE,
                                  PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 0};
static const method M_POS_IID = {"positive iid", EST_FAVOR,   PF_KERNEL_POSITIVE,
                                 PF_PROJ_IID,    PF_NORM_CHI, 0};
static const method M_TRIG_ORTH = {"trig orth",        EST_FAVOR,   PF_KERNEL_TRIG,
                                   PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 0};
static const method M_TRIG_IID = {"trig iid",  EST_FAVOR,   PF_KERNEL_TRIG,
                                  PF_PROJ_IID, PF_NORM_CHI, 0};
static const method M_HYP_ORTH = {"hyperbolic orth",  EST_FAVOR,   PF_KERNEL_HYPERBOLIC,
                                  PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 0};
static const method M_OPRF = {"FAVOR++",          EST_FAVOR,   PF_KERNEL_OPRF,
                              PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 0};
static const method M_SDERF = {"FAVOR#",           EST_FAVOR,   PF_KERNEL_SDERF,
                               PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 0};

/* kernel: the closed forms of the positive map and FAVOR++ (iid features) */
static const method M_POS_THEORY = {"positive theory", EST_FAVOR,   PF_KERNEL_POSITIVE,
                                    PF_PROJ_IID,       PF_NORM_CHI, 0};
static const method M_OPRF_THEORY = {"FAVOR++ theory", EST_FAVOR,   PF_KERNEL_OPRF,
                                     PF_PROJ_IID,      PF_NORM_CHI, 0};

static int m_list(const lab *lb, int *ms, double *xs) {
    static const int full[] = {16, 32, 64, 128, 256, 512}, quick[] = {8, 16, 32};
    const int *src = lb->cfg->quick ? quick : full;
    int n = lb->cfg->quick ? 3 : 6;
    for (int i = 0; i < n; i++) {
        ms[i] = src[i];
        xs[i] = src[i];
    }
    return n;
}

static void exp_ortho(lab *lb) {
    const int d = 16, H = draws_of(lb, 15);
    /* a blog reproduction's setting (L = 1024, sigma = 1), the paper's L = 4096, smaller inputs */
    const int Ls[3] = {lb->cfg->quick ? 128 : 1024, lb->cfg->quick ? 256 : 4096,
                       lb->cfg->quick ? 128 : 1024};
    static const double sig[3] = {1.0, 1.0, 0.5};
    const method *ms[4] = {&M_POS_IID, &M_POS_ORTH, &M_TRIG_IID, &M_TRIG_ORTH};
    int sizes[8];
    double xs[8];
    int nx = m_list(lb, sizes, xs);
    snprintf(lb->title, sizeof(lb->title),
             "ortho: iid vs orthogonal W, d = %d, Q, K ~ N(0, sigma^2), V ~ N(0, 1)", d);
    lb->steps = 3 * 4;
    for (int p = 0; p < 3 && !lb->fatal; p++) {
        inputs in;
        if (inputs_alloc(&in, Ls[p], d, d, H)) {
            oom(lb);
            return;
        }
        fill_normal(in.Q, (size_t)Ls[p] * d, sig[p], 1);
        fill_normal(in.K, (size_t)Ls[p] * d, sig[p], 2);
        fill_normal(in.V, (size_t)Ls[p] * d, 1.0, 3);
        char panel[48];
        snprintf(panel, sizeof(panel), "L=%d sigma=%g", Ls[p], sig[p]);
        lb->hard = sig[p] >= 1;
        if (inputs_finish(lb, &in) == 0) {
            for (int s = 0; s < 4; s++) eval_series(lb, &in, ms[s], panel, "m", sizes, xs, nx);
        }
        inputs_free(&in);
    }
}

static void maps_or_kernel(lab *lb, int kernel_level) {
    const int d = 16, H = draws_of(lb, 15);
    const int L = lb->cfg->quick ? 128 : 1024, m = lb->cfg->quick ? 16 : 128;
    if (kernel_level) {
        lb->metric = "relative MSE of the kernel values";
        lb->zero = "answer 0: the relative MSE of answering 0, which is 1; above it, an estimate "
                   "is worse than none";
    }
    if (kernel_level)
        snprintf(lb->title, sizeof(lb->title),
                 "kernel: relative MSE of exp(s q.k) estimates over %d pairs, d = %d, m = %d", L, d,
                 m);
    else
        snprintf(lb->title, sizeof(lb->title),
                 "maps: feature maps as |q|, |k| grow, d = %d, m = %d, L = %d, orthogonal W", d, m,
                 L);
    static const double full[] = {0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5};
    static const double quick[] = {0.5, 1.5};
    const double *sig = lb->cfg->quick ? quick : full;
    const int nx = lb->cfg->quick ? 2 : 10;
    const method *ms[5] = {&M_POS_ORTH, &M_HYP_ORTH, &M_TRIG_ORTH, &M_OPRF, &M_SDERF};
    static const char *const panels[2] = {"isotropic", "anisotropic: eigenvalues 1 to 1/100"};
    lb->steps = 2 * 5;
    /* A series runs over sigma: the inputs change with x, so loop x outside, then series;
     * rows are written in (series, x) order below for the table and the CSV. */
    int first = lb->n;
    for (int p = 0; p < 2 && !lb->fatal; p++) {
        double t0[5] = {0};
        int avail[5];
        for (int s = 0; s < 5; s++) {
            avail[s] = method_available(ms[s]);
            if (!avail[s])
                fprintf(stderr, "performer approx: %s: %s is not in this library yet: skipped\n",
                        lb->name, ms[s]->series);
        }
        for (int i = 0; i < nx && !lb->fatal; i++) {
            inputs in;
            if (inputs_alloc(&in, L, d, d, H)) {
                oom(lb);
                return;
            }
            if (p == 0) {
                fill_normal(in.Q, (size_t)L * d, sig[i], 1);
                fill_normal(in.K, (size_t)L * d, sig[i], 2);
                fill_normal(in.V, (size_t)L * d, 1.0, 3);
            } else if (fill_anisotropic(&in, sig[i], 100.0)) {
                inputs_free(&in);
                {
                    oom(lb);
                    return;
                }
            }
            lb->hard = sig[i] >= 1;
            if (inputs_finish(lb, &in) == 0) {
                for (int s = 0; s < 5 && !lb->fatal; s++) {
                    if (!avail[s]) continue;
                    double t = tool_now_ms();
                    if (kernel_level) {
                        kernel_point(lb, &in, ms[s], m, panels[p], sig[i]);
                        if (ms[s] == &M_POS_ORTH)
                            kernel_theory(lb, &in, &M_POS_THEORY, m, panels[p], sig[i]);
                        if (ms[s] == &M_OPRF)
                            kernel_theory(lb, &in, &M_OPRF_THEORY, m, panels[p], sig[i]);
                    } else
                        eval_point(lb, &in, ms[s], m, panels[p], "sigma", sig[i]);
                    t0[s] += tool_now_ms() - t;
                }
            }
            inputs_free(&in);
        }
        for (int s = 0; s < 5; s++) {
            if (avail[s])
                progress(lb, panels[p], ms[s]->series, t0[s]);
            else
                lb->step++;
        }
    }
    const method *order[7] = {ms[0], ms[1], ms[2], ms[3], ms[4], &M_POS_THEORY, &M_OPRF_THEORY};
    reorder(lb, first, order, kernel_level ? 7 : 5);
}

static void exp_maps(lab *lb) {
    maps_or_kernel(lb, 0);
}

static void exp_kernel(lab *lb) {
    maps_or_kernel(lb, 1);
}

static void exp_norms(lab *lb) {
    const int d = 16, H = draws_of(lb, 15), L = lb->cfg->quick ? 128 : 1024;
    snprintf(lb->title, sizeof(lb->title),
             "norms: row norms of orthogonal W, positive map, "
             "d = %d, L = %d",
             d, L);
    static const method chi = {"chi",       EST_FAVOR, PF_KERNEL_POSITIVE, PF_PROJ_ORTHOGONAL,
                               PF_NORM_CHI, 0};
    static const method sqd = {"sqrtd",       EST_FAVOR, PF_KERNEL_POSITIVE, PF_PROJ_ORTHOGONAL,
                               PF_NORM_SQRTD, 0};
    static const method qmc = {"qmc",       EST_FAVOR, PF_KERNEL_POSITIVE, PF_PROJ_ORTHOGONAL,
                               PF_NORM_QMC, 0};
    const method *ms[3] = {&chi, &sqd, &qmc};
    static const double sig[2] = {1.0, 1.5};
    int sizes[8];
    double xs[8];
    int nx = m_list(lb, sizes, xs);
    lb->steps = 2 * 3;
    for (int p = 0; p < 2 && !lb->fatal; p++) {
        inputs in;
        if (inputs_alloc(&in, L, d, d, H)) {
            oom(lb);
            return;
        }
        fill_normal(in.Q, (size_t)L * d, sig[p], 1);
        fill_normal(in.K, (size_t)L * d, sig[p], 2);
        fill_normal(in.V, (size_t)L * d, 1.0, 3);
        char panel[48];
        snprintf(panel, sizeof(panel), "sigma=%g", sig[p]);
        lb->hard = sig[p] >= 1;
        if (inputs_finish(lb, &in) == 0) {
            for (int s = 0; s < 3; s++) eval_series(lb, &in, ms[s], panel, "m", sizes, xs, nx);
        }
        inputs_free(&in);
    }
}

static void exp_estimators(lab *lb) {
    const int d = 16, H = draws_of(lb, 15), L = lb->cfg->quick ? 64 : 512;
    snprintf(lb->title, sizeof(lb->title),
             "estimators: samples = m (RFA, FAVOR), S (RA) or C "
             "(LARA), d = %d, L = %d",
             d, L);
    static const int full[] = {4, 8, 16, 32, 64, 128, 256}, quick[] = {4, 8};
    const int nx = lb->cfg->quick ? 2 : 7;
    const int *sizes = lb->cfg->quick ? quick : full;
    double xs[8];
    for (int i = 0; i < nx; i++) xs[i] = sizes[i];
    static const method rfa = {"RFA", EST_FAVOR, PF_KERNEL_POSITIVE, PF_PROJ_IID, PF_NORM_CHI, 0};
    static const method fplus = {"FAVOR+",           EST_FAVOR,   PF_KERNEL_POSITIVE,
                                 PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 0};
    static const method ra = {"RA", EST_RA, PF_KERNEL_POSITIVE, PF_PROJ_IID, PF_NORM_CHI, 0};
    static const method lara = {"LARA", EST_LARA, PF_KERNEL_POSITIVE, PF_PROJ_IID, PF_NORM_CHI, 0};
    static const method lara0 = {"LARA eps=0", EST_LARA,    PF_KERNEL_POSITIVE,
                                 PF_PROJ_IID,  PF_NORM_CHI, 1};
    const method *ms[6] = {&rfa, &fplus, &M_OPRF, &ra, &lara, &lara0};
    static const char *const panels[2] = {"clustered", "unstructured"};
    lb->steps = 2 * 6;
    for (int p = 0; p < 2 && !lb->fatal; p++) {
        inputs in;
        if (inputs_alloc(&in, L, d, d, H)) {
            oom(lb);
            return;
        }
        lb->hard = p == 1;
        if (p == 0) {
            if (fill_clustered(&in, 8, 1.0, 0.5)) {
                inputs_free(&in);
                {
                    oom(lb);
                    return;
                }
            }
        } else {
            /* the same overall scale as the clustered inputs: E|x|^2 = d (1 + 0.25): isotropic
             * with sigma = 1.12, the hard case */
            fill_normal(in.Q, (size_t)L * d, sqrt(1.25), 1);
            fill_normal(in.K, (size_t)L * d, sqrt(1.25), 2);
            fill_normal(in.V, (size_t)L * d, 1.0, 3);
        }
        if (inputs_finish(lb, &in) == 0) {
            for (int s = 0; s < 6; s++)
                eval_series(lb, &in, ms[s], panels[p], "samples", sizes, xs, nx);
        }
        inputs_free(&in);
    }
}

static void exp_length(lab *lb) {
    const int d = 16, H = draws_of(lb, 15), m = lb->cfg->quick ? 16 : 64;
    static const int full[] = {256, 512, 1024, 2048, 4096, 8192, 16384};
    static const int quick[] = {64, 128, 256};
    static const double sig[2] = {1.0, 0.5};
    const int nx = lb->cfg->quick ? 3 : 7;
    snprintf(lb->title, sizeof(lb->title),
             "length: MSE vs L, d = %d, m = %d, Q, K ~ N(0, sigma^2), V ~ N(0, 1)", d, m);
    const int *Ls = lb->cfg->quick ? quick : full;
    const method *ms[3] = {&M_POS_ORTH, &M_POS_IID, &M_TRIG_ORTH};
    lb->steps = 2 * 3;
    int first = lb->n;
    for (int p = 0; p < 2 && !lb->fatal; p++) {
        char panel[48];
        snprintf(panel, sizeof(panel), "sigma=%g", sig[p]);
        lb->hard = sig[p] >= 1;
        double t[3] = {0};
        for (int i = 0; i < nx && !lb->fatal; i++) {
            inputs in;
            if (inputs_alloc(&in, Ls[i], d, d, H)) {
                oom(lb);
                return;
            }
            /* the same streams at every L: the shorter inputs are prefixes of the longer */
            fill_normal(in.Q, (size_t)Ls[i] * d, sig[p], 1);
            fill_normal(in.K, (size_t)Ls[i] * d, sig[p], 2);
            fill_normal(in.V, (size_t)Ls[i] * d, 1.0, 3);
            if (inputs_finish(lb, &in) == 0) {
                for (int s = 0; s < 3; s++) {
                    double t0 = tool_now_ms();
                    eval_point(lb, &in, ms[s], m, panel, "L", Ls[i]);
                    t[s] += tool_now_ms() - t0;
                }
            }
            inputs_free(&in);
        }
        for (int s = 0; s < 3; s++) progress(lb, panel, ms[s]->series, t[s]);
    }
    reorder(lb, first, ms, 3);
}

/* ---- real: the estimators on a trained model's own queries and keys ------------------------ */

#define REAL_CHECKPOINT "demo-kjv.safetensors" /* shipped in data/ */
#define REAL_TEXT "demo-kjv-val.txt"

/* The text's bytes (at most cap) into *buf (*n, malloc'ed). 0, or -1 after a message. */
static int real_read_text(const char *path, unsigned char **buf, size_t *n, size_t cap) {
    char msg[1024];
    int64_t size;
    pf_status st;
    int fd = pf_io_open_regular(path, &size, &st, msg, sizeof(msg));
    if (fd < 0) return tool_fail(CMD, "--text: %s", msg), -1;
    size_t want = (size_t)size < cap ? (size_t)size : cap;
    *buf = malloc(want > 0 ? want : 1);
    if (!*buf) {
        close(fd);
        return tool_fail(CMD, "--text %s: out of memory", path), -1;
    }
    st = pf_io_read_all(fd, *buf, want, path, msg, sizeof(msg));
    close(fd);
    if (st != PF_OK) {
        free(*buf);
        *buf = NULL;
        return tool_fail(CMD, "--text: %s", msg), -1;
    }
    *n = want;
    return 0;
}

/* What the iid theory predicts for the MSE of causal FAVOR+ with m = 1 iid positive features
 * (divide by m for m of them), on BH blocks of T queries, keys (d) and values (dv), float64.
 * One feature's estimate of sum_j exp(q.k_j) a_j (q, k scaled by d^-1/4) has the second moment
 * sum_jl a_j a_l exp(|q|^2 + 2 q.k_j + 2 q.k_l + k_j.k_l), since E exp(w.u) = exp(|u|^2 / 2)
 * (the moments behind Lemma 2 of the Performer paper, whose l = j case is its kernel MSE).
 * To first order in 1/m (the delta method for the ratio out_i = N_i / D_i) the output's error
 * is that of the numerator with a_j = v_j - out_i, over D_i^2: the mean of
 *     exp(|q_i|^2) sum_{j,l <= i} a_j.a_l exp(2 q_i.k_j + 2 q_i.k_l + k_j.k_l) / D_i^2
 * over the queries and the dv entries (the mean of a_j over softmax_j is 0, so no square of a
 * mean is left). Exponents are shifted by the largest q_i.k_j and |k_j|^2, and a_j.a_l is
 * expanded as v_j.v_l - v_j.out - v_l.out + |out|^2 so that a query costs O(i^2). NaN if
 * out of memory. */
static double real_iid_prediction(const float *Q, const float *K, const float *V, int BH, int T,
                                  int d, int dv) {
    const double s = 1.0 / sqrt((double)d); /* q'.k' = s q.k */
    double *G = malloc(sizeof(double) * (size_t)T * T),
           *VV = malloc(sizeof(double) * (size_t)T * T);
    double *qk = malloc(sizeof(double) * (size_t)T), *w = malloc(sizeof(double) * (size_t)T);
    double *u = malloc(sizeof(double) * (size_t)T), *o = malloc(sizeof(double) * (size_t)dv);
    double total = NAN;
    if (G && VV && qk && w && u && o) {
        total = 0;
        for (int bh = 0; bh < BH; bh++) {
            const float *q = Q + (size_t)bh * T * d, *k = K + (size_t)bh * T * d;
            const float *v = V + (size_t)bh * T * dv;
            double Mk = -INFINITY;
            for (int j = 0; j < T; j++) {
                double n2 = 0;
                for (int e = 0; e < d; e++)
                    n2 += (double)k[(size_t)j * d + e] * k[(size_t)j * d + e];
                if (s * n2 > Mk) Mk = s * n2;
            }
            for (int j = 0; j < T; j++) {
                for (int l = 0; l <= j; l++) {
                    double kk = 0, vv = 0;
                    for (int e = 0; e < d; e++)
                        kk += (double)k[(size_t)j * d + e] * k[(size_t)l * d + e];
                    for (int e = 0; e < dv; e++)
                        vv += (double)v[(size_t)j * dv + e] * v[(size_t)l * dv + e];
                    G[(size_t)j * T + l] = G[(size_t)l * T + j] = exp(s * kk - Mk);
                    VV[(size_t)j * T + l] = VV[(size_t)l * T + j] = vv;
                }
            }
            for (int i = 0; i < T; i++) {
                const float *qi = q + (size_t)i * d;
                double c = -INFINITY, q2 = 0, D = 0, oo = 0;
                for (int e = 0; e < d; e++) q2 += s * qi[e] * qi[e];
                for (int j = 0; j <= i; j++) {
                    double t = 0;
                    for (int e = 0; e < d; e++) t += (double)qi[e] * k[(size_t)j * d + e];
                    qk[j] = s * t;
                    if (qk[j] > c) c = qk[j];
                }
                memset(o, 0, sizeof(double) * (size_t)dv);
                for (int j = 0; j <= i; j++) {
                    double p = exp(qk[j] - c);
                    D += p;
                    w[j] = p * p;
                    for (int e = 0; e < dv; e++) o[e] += p * v[(size_t)j * dv + e];
                }
                for (int e = 0; e < dv; e++) {
                    o[e] /= D;
                    oo += o[e] * o[e];
                }
                for (int j = 0; j <= i; j++) {
                    double t = 0;
                    for (int e = 0; e < dv; e++) t += (double)v[(size_t)j * dv + e] * o[e];
                    u[j] = t;
                }
                double quad = 0;
                for (int j = 0; j <= i; j++) {
                    const double *Gj = G + (size_t)j * T, *VVj = VV + (size_t)j * T;
                    double t = 0;
                    for (int l = 0; l <= i; l++) t += Gj[l] * w[l] * (VVj[l] - u[j] - u[l] + oo);
                    quad += w[j] * t;
                }
                if (quad > 0) total += exp(q2 + 2 * c + Mk + log(quad) - 2 * log(D));
            }
        }
        total /= (double)BH * T * dv;
    }
    free(G);
    free(VV);
    free(qk);
    free(w);
    free(u);
    free(o);
    return total;
}

/* A trained layer's inputs, (B,H,T,hd) each, its exact causal output and the draws' outputs. */
typedef struct real_inputs {
    pf_shape sh;
    float *q, *k, *v, *exact, *outs; /* outs: draws x (B,H,T,hd) */
    double exact_ms;
    float oprf_a; /* FAVOR++'s A, fitted on every query and key of the layer */
} real_inputs;

/* One point: the method with m features on every draw, causal; appends a row. */
static void real_point(lab *lb, const real_inputs *in, const method *me, int m, const char *panel,
                       int draws) {
    const size_t n = (size_t)in->sh.B * in->sh.H * in->sh.Lq * in->sh.dv;
    float *W = malloc(sizeof(float) * (size_t)m * in->sh.d);
    int *ok = calloc((size_t)draws, sizeof(int));
    double *mse = malloc(sizeof(double) * (size_t)draws);
    if (!W || !ok || !mse) {
        tool_fail(CMD, "out of memory");
        lb->fatal = 1;
    }
    pf_attn_opts opts = pf_attn_opts_default();
    opts.threads = lb->cfg->threads;
    opts.causal = 1; /* as the model attends */
    for (int h = 0; h < draws && !lb->fatal; h++) {
        pf_projection_draw(W, m, in->sh.d, me->proj, me->norm, SEED_W, (uint64_t)h);
        pf_favor_opts fav = pf_favor_opts_default();
        fav.kernel = me->kernel;
        fav.W = W;
        fav.m = m;
        if (me->kernel == PF_KERNEL_RELU) fav.eps = 1e-3f; /* as the model's ReLU layers */
        if (me->kernel == PF_KERNEL_OPRF) {
            fav.oprf_a_given = 1; /* causal: a fixed A, not one from the sequence */
            fav.oprf_a = in->oprf_a;
        }
        pf_status st = pf_attn_favor(in->outs + (size_t)h * n, in->q, in->k, in->v, &in->sh, &opts,
                                     &fav);
        if (st == PF_OK) {
            ok[h] = 1;
        } else if (st != PF_EDOMAIN && st != PF_ENONFINITE) {
            tool_fail(CMD, "real: %s with m %d failed: %s", me->series, m, pf_status_str(st));
            lb->fatal = 1;
        }
    }
    if (!lb->fatal) {
        row r;
        memset(&r, 0, sizeof(r));
        snprintf(r.panel, sizeof(r.panel), "%s", panel);
        snprintf(r.series, sizeof(r.series), "%s", me->series);
        snprintf(r.xvar, sizeof(r.xvar), "m");
        r.x = m;
        r.draws = draws;
        r.zero_mse = in->exact_ms;
        finish_point(lb, &r, in->outs, ok, mse, in->exact, n);
    }
    free(W);
    free(ok);
    free(mse);
}

/* The model's windows: B of T bytes spread evenly over the text, the first at its start and
 * the last at its end. */
static void real_windows(int32_t *tok, int B, int T, const unsigned char *text, size_t ntext) {
    for (int b = 0; b < B; b++) {
        size_t start = B > 1 ? (size_t)b * (ntext - (size_t)T) / (size_t)(B - 1) : 0;
        for (int t = 0; t < T; t++) tok[(size_t)b * T + t] = text[start + (size_t)t];
    }
}

static const method M_RELU_ORTH = {"relu orth",        EST_FAVOR,   PF_KERNEL_RELU,
                                   PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 0};

static void exp_real(lab *lb) {
    const approx_cfg *c = lb->cfg;
    const int draws = draws_of(lb, 15);
    static const int full[] = {16, 64, 256, 1024}, quick[] = {8, 32};
    const int nm = c->quick ? 2 : 4;
    const int *ms_m = c->quick ? quick : full;
    const method *ms[6] = {&M_POS_ORTH, &M_POS_IID, &M_OPRF, &M_HYP_ORTH, &M_TRIG_ORTH,
                           &M_RELU_ORTH};
    char msg[1024];
    pf_model *model = NULL;
    unsigned char *text = NULL;
    size_t ntext = 0;
    int32_t *tok = NULL;
    real_inputs in;
    memset(&in, 0, sizeof(in));
    if (pf_model_load(&model, c->checkpoint, msg, sizeof(msg)) != PF_OK) {
        tool_fail(CMD, "--checkpoint: %s", msg);
        lb->fatal = 1;
        return;
    }
    if (real_read_text(c->text, &text, &ntext, (size_t)1 << 24) != 0) {
        lb->fatal = 1;
        pf_model_free(model);
        return;
    }
    const pf_model_config mc = pf_model_get_config(model);
    const int H = mc.heads, hd = mc.d_model / mc.heads, B = c->quick ? 1 : 4;
    int T = mc.context < (c->quick ? 64 : 256) ? mc.context : (c->quick ? 64 : 256);
    if ((size_t)T > ntext) T = (int)ntext;
    if (T < 16) {
        tool_fail(CMD, "--text %s holds %zu bytes; at least 16 are needed", c->text, ntext);
        lb->fatal = 1;
        free(text);
        pf_model_free(model);
        return;
    }
    snprintf(lb->title, sizeof(lb->title),
             "real: causal attention on a trained model's queries and keys, %d windows of %d "
             "bytes, %d heads of width %d",
             B, T, H, hd);
    in.sh = (pf_shape){.B = B, .H = H, .Lq = T, .Lk = T, .d = hd, .dv = hd};
    const size_t n = (size_t)B * H * T * hd;
    tok = malloc(sizeof(int32_t) * (size_t)B * T);
    in.q = malloc(sizeof(float) * n);
    in.k = malloc(sizeof(float) * n);
    in.v = malloc(sizeof(float) * n);
    in.exact = malloc(sizeof(float) * n);
    in.outs = malloc(sizeof(float) * n * (size_t)draws);
    if (!tok || !in.q || !in.k || !in.v || !in.exact || !in.outs) {
        oom(lb);
    } else {
        real_windows(tok, B, T, text, ntext);
    }
    lb->steps = mc.layers * 6;
    pf_attn_opts opts = pf_attn_opts_default();
    opts.threads = c->threads;
    opts.causal = 1;
    for (int l = 0; l < mc.layers && !lb->fatal; l++) {
        pf_status st = pf_model_attention_inputs(model, in.q, in.k, in.v, tok, B, T, l);
        if (st == PF_OK) st = pf_attn_exact(in.exact, NULL, in.q, in.k, in.v, &in.sh, &opts);
        const float scale = (float)(1.0 / sqrt((double)hd));
        if (st == PF_OK)
            st = pf_oprf_optimal_a(&in.oprf_a, in.q, B * H * T, in.k, B * H * T, hd, scale);
        if (st != PF_OK) {
            tool_fail(CMD, "real: layer %d's inputs: %s", l + 1, pf_status_str(st));
            lb->fatal = 1;
            break;
        }
        double ms2 = 0, q2 = 0, k2 = 0;
        for (size_t i = 0; i < n; i++) {
            ms2 += (double)in.exact[i] * in.exact[i];
            q2 += (double)in.q[i] * in.q[i];
            k2 += (double)in.k[i] * in.k[i];
        }
        in.exact_ms = ms2 / (double)n;
        /* |q'|^2 = |q|^2 / sqrt(hd), what the features see, averaged over the rows */
        const double rows = (double)B * H * T;
        char panel[48];
        snprintf(panel, sizeof(panel), "layer %d: |q'|^2 %.1f |k'|^2 %.1f", l + 1,
                 q2 / rows / sqrt((double)hd), k2 / rows / sqrt((double)hd));
        for (int s = 0; s < 6 && !lb->fatal; s++) {
            double t0 = tool_now_ms();
            for (int i = 0; i < nm && !lb->fatal; i++)
                real_point(lb, &in, ms[s], ms_m[i], panel, draws);
            if (!lb->fatal) progress(lb, panel, ms[s]->series, tool_now_ms() - t0);
        }
        double pred = real_iid_prediction(in.q, in.k, in.v, B * H, T, hd, hd);
        for (int i = 0; i < nm && !lb->fatal; i++) {
            row r;
            memset(&r, 0, sizeof(r));
            snprintf(r.panel, sizeof(r.panel), "%s", panel);
            snprintf(r.series, sizeof(r.series), "iid prediction");
            snprintf(r.xvar, sizeof(r.xvar), "m");
            r.x = ms_m[i];
            r.draws = draws;
            r.mean = r.median = r.q25 = r.q75 = pred / ms_m[i];
            r.sd = 0.0;
            r.bias2 = r.variance = NAN;
            r.zero_mse = in.exact_ms;
            add_row(lb, &r);
        }
    }
    free(tok);
    free(in.q);
    free(in.k);
    free(in.v);
    free(in.exact);
    free(in.outs);
    free(text);
    pf_model_free(model);
}

static const experiment experiments[] = {
    {"ortho", exp_ortho, 1},           {"maps", exp_maps, 1},     {"kernel", exp_kernel, 1},
    {"norms", exp_norms, 1},           {"estimators", exp_estimators, 1},
    {"length", exp_length, 1},         {"real", exp_real, 0},
};
enum { N_EXP = (int)(sizeof(experiments) / sizeof(experiments[0])) };

/* ---- output: CSV, table, plot ------------------------------------------------------------ */

static void fmt_num(char *buf, size_t cap, double v) {
    if (isnan(v))
        snprintf(buf, cap, "nan");
    else
        snprintf(buf, cap, "%.8g", v);
}

/* The rows as CSV to f. 0, or -1 if a write failed. */
static int write_csv(const lab *lb, FILE *f) {
    fprintf(f, "panel,series,xvar,x,draws,failed,mse_mean,mse_std,mse_median,zero_mse,mse_q25,"
               "mse_q75,bias2,variance\n");
    for (int i = 0; i < lb->n; i++) {
        const row *r = &lb->rows[i];
        char a[32], b[32], c[32], e[32], q1[32], q3[32], bs[32], vr[32];
        fmt_num(a, sizeof(a), r->mean);
        fmt_num(b, sizeof(b), r->sd);
        fmt_num(c, sizeof(c), r->median);
        fmt_num(e, sizeof(e), r->zero_mse);
        fmt_num(q1, sizeof(q1), r->q25);
        fmt_num(q3, sizeof(q3), r->q75);
        fmt_num(bs, sizeof(bs), r->bias2);
        fmt_num(vr, sizeof(vr), r->variance);
        fprintf(f, "%s,%s,%s,%g,%d,%d,%s,%s,%s,%s,%s,%s,%s,%s\n", r->panel, r->series, r->xvar,
                r->x, r->draws, r->failed, a, b, c, e, q1, q3, bs, vr);
    }
    int bad = ferror(f);
    bad |= fclose(f) != 0;
    return bad ? -1 : 0;
}

/* Why the hard case is hard, in its labels. */
#define HARD_WHY "the features' variance grows like exp(|q'+k'|^2)"

/* One panel of the table: x down and series across, mean MSE (and the failed draws, if any),
 * rows [i, end); the hard case labelled, on the panel's heading if it is all hard, else on a
 * line before its first hard row. */
static void print_panel(const lab *lb, int i, int end) {
    /* series in order of appearance; x values of the first series */
    const char *series[8];
    int ns = 0, all_hard = 1;
    for (int k = i; k < end; k++) {
        all_hard &= lb->rows[k].hard;
        int seen = 0;
        for (int s = 0; s < ns; s++) seen |= strcmp(series[s], lb->rows[k].series) == 0;
        if (!seen && ns < 8) series[ns++] = lb->rows[k].series;
    }
    if (all_hard)
        printf("  %s  (hard case: sigma >= 1, %s)\n", lb->rows[i].panel, HARD_WHY);
    else
        printf("  %s\n", lb->rows[i].panel);
    printf("  %8s", lb->rows[i].xvar);
    for (int s = 0; s < ns; s++) printf(" %15s", series[s]);
    printf(" %10s\n", "answer 0");
    int labelled = all_hard;
    for (int k = i; k < end && strcmp(lb->rows[k].series, series[0]) == 0; k++) {
        double x = lb->rows[k].x;
        if (lb->rows[k].hard && !labelled) {
            printf("  -- from here on sigma >= 1, the hard case: %s\n", HARD_WHY);
            labelled = 1;
        }
        printf("  %8g", x);
        for (int s = 0; s < ns; s++) {
            const row *hit = NULL;
            for (int j = i; j < end; j++) {
                if (strcmp(lb->rows[j].series, series[s]) == 0 && lb->rows[j].x == x)
                    hit = &lb->rows[j];
            }
            char cell[40] = "-";
            if (hit && hit->failed)
                snprintf(cell, sizeof(cell), "%.3g (%d bad)", hit->mean, hit->failed);
            else if (hit)
                snprintf(cell, sizeof(cell), "%.3g", hit->mean);
            printf(" %15s", cell);
        }
        printf(" %10.3g\n", lb->rows[k].zero_mse);
    }
}

/* The table: the title, what the numbers are, then the panels: first those where the
 * estimators work (some row not the hard case), then those that are all the hard case, each
 * group in the CSV's order. */
static void print_table(const lab *lb, double secs) {
    printf("\n%s  [%.1f s]\n", lb->title, secs);
    if (lb->n == 0) return;
    printf("%s, mean over %d draws;\n%s\n", lb->metric, lb->rows[0].draws, lb->zero);
    for (int pass = 0; pass < 2; pass++) {
        int i = 0;
        while (i < lb->n) {
            const char *panel = lb->rows[i].panel;
            int end = i, all_hard = 1;
            while (end < lb->n && strcmp(lb->rows[end].panel, panel) == 0)
                all_hard &= lb->rows[end++].hard;
            if (all_hard == pass) print_panel(lb, i, end);
            i = end;
        }
    }
    fflush(stdout);
}


enum { PLOT_OK = 0, PLOT_MISSING = 1, PLOT_FAILED = 2 };

/* Draws DIR/NAME.png from the CSV (temporary name, then renamed); says once why plots are
 * missing. */
/* Draws the staged CSV into the staged PNG (png names it in messages). */
static int plot(const lab *lb, const char *csv, const char *staged_png, const char *png) {
    static int warned;
    char script[4200];
    switch (tool_plot("plot_approx.py", csv, staged_png, lb->title, lb->metric, script,
                      sizeof(script))) {
    case TOOL_PLOT_OK:
        return PLOT_OK;
    case TOOL_PLOT_NO_PYTHON:
        if (!warned++)
            fprintf(stderr, "performer approx: /usr/bin/python3 not found: no plots (the CSV "
                            "files are written)\n");
        return PLOT_MISSING;
    case TOOL_PLOT_NO_SCRIPT:
        if (!warned++)
            fprintf(stderr, "performer approx: scripts/plot_approx.py not found (set "
                            "PERFORMER_SCRIPTS): no plots (the CSV files are written)\n");
        return PLOT_MISSING;
    case TOOL_PLOT_NO_MATPLOTLIB:
        if (!warned++)
            fprintf(stderr, "performer approx: /usr/bin/python3 has no matplotlib: no plots (the "
                            "CSV files are written; apt install python3-matplotlib)\n");
        return PLOT_MISSING;
    default:
        tool_fail(CMD, "drawing %s failed (%s)", png, script);
        return PLOT_FAILED;
    }
}


/* ---- command line -------------------------------------------------------------------------- */

static int find_experiment(const char *name) {
    for (int e = 0; e < N_EXP; e++) {
        if (strcmp(name, experiments[e].name) == 0) return e;
    }
    return -1;
}

static int parse_args(approx_cfg *c, int argc, char **argv) {
    tool_args a;
    tool_args_init(&a, CMD, argc, argv);
    int all = 0, named = 0;
    while (tool_next(&a)) {
        const char *v = NULL;
        const char *arg = a.argv[a.i];
        if (tool_opt(&a, "--out", &v)) {
            if (v && !*v) return tool_usage(CMD, "--out: empty folder name");
            c->out = v;
        } else if (tool_opt(&a, "--draws", &v)) {
            if (v) tool_parse_int(&a, "--draws", v, 2, 100000, &c->draws);
        } else if (tool_opt(&a, "--threads", &v)) {
            if (v) tool_parse_int(&a, "--threads", v, 0, PF_MAX_THREADS, &c->threads);
        } else if (tool_path_opt(&a, "--checkpoint", &v)) {
            c->checkpoint = v;
        } else if (tool_path_opt(&a, "--text", &v)) {
            c->text = v;
        } else if (tool_flag(&a, "--all")) {
            all = 1;
        } else if (tool_flag(&a, "--quick")) {
            c->quick = 1;
        } else if (tool_flag(&a, "--no-plot")) {
            c->no_plot = 1;
        } else if (arg[0] != '-') {
            int e = find_experiment(arg);
            if (e < 0) {
                char list[256] = "";
                for (int k = 0; k < N_EXP; k++) {
                    strcat(list, k ? ", " : "");
                    strcat(list, experiments[k].name);
                }
                return tool_usage(CMD, "unknown experiment '%s'; expected %s or --all", arg, list);
            }
            c->want[e] = 1;
            named = 1;
        } else {
            return tool_unknown(&a);
        }
    }
    if (a.failed) return TOOL_EXIT_USAGE;
    if (all && named) return tool_usage(CMD, "give --all or experiment names, not both");
    if (!all && !named) return tool_usage(CMD, "name an experiment or give --all");
    if (all) {
        for (int e = 0; e < N_EXP; e++) c->want[e] = experiments[e].in_all;
    }
    const int real = find_experiment("real");
    if ((c->checkpoint || c->text) && !c->want[real])
        return tool_usage(CMD, "--%s is for the real experiment: name it",
                          c->checkpoint ? "checkpoint" : "text");
    if (c->want[real]) {
        /* the shipped model and text, where they are not given */
        static char ckpt[4096], text[4096];
        if (!c->checkpoint) {
            if (!tool_find_data(ckpt, sizeof(ckpt), REAL_CHECKPOINT))
                return tool_usage(CMD, "real needs a trained model: --checkpoint FILE (the "
                                       "shipped data/" REAL_CHECKPOINT " was not found)");
            c->checkpoint = ckpt;
        }
        if (!c->text) {
            if (!tool_find_data(text, sizeof(text), REAL_TEXT))
                return tool_usage(CMD, "real needs a text to run the model on: --text FILE (the "
                                       "shipped data/" REAL_TEXT " was not found)");
            c->text = text;
        }
    }
    return TOOL_EXIT_OK;
}

/* The output folder: created if missing (one level; *made says so), else it must be a
 * writable folder. */
static int prepare_dir(const char *dir, int *made) {
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) return tool_fail(CMD, "--out %s: not a folder", dir);
    } else if (mkdir(dir, 0777) != 0) {
        return tool_fail(CMD, "--out %s: cannot create the folder: %s", dir, strerror(errno));
    } else {
        *made = 1;
    }
    if (access(dir, W_OK | X_OK) != 0)
        return tool_fail(CMD, "--out %s: cannot write there: %s", dir, strerror(errno));
    return 0;
}

int cmd_approx(int argc, char **argv) {
    approx_cfg c;
    memset(&c, 0, sizeof(c));
    c.out = "approx-out";
    int rc = parse_args(&c, argc, argv);
    if (rc) return rc;
    int made = 0;
    if ((rc = prepare_dir(c.out, &made))) return rc;
    /* every CSV and plot this run writes must be a regular file or new: checked now, so a
     * link or a device there stops the run before its work, not after */
    for (int e = 0; e < N_EXP; e++) {
        for (int k = 0; k < (c.no_plot ? 1 : 2) && c.want[e]; k++) {
            char p[4200], msg[1024];
            snprintf(p, sizeof(p), "%s/%s.%s", c.out, experiments[e].name, k ? "png" : "csv");
            if (pf_io_check_dest(p, msg, sizeof(msg)) != PF_OK) {
                if (made) rmdir(c.out);
                return tool_fail(CMD, "%s", msg);
            }
        }
    }
    double t_all = tool_now_ms();
    int failed = 0, plotted = 0;
    for (int e = 0; e < N_EXP; e++) {
        if (!c.want[e]) continue;
        const experiment *ex = &experiments[e];
        lab lb;
        memset(&lb, 0, sizeof(lb));
        lb.cfg = &c;
        lb.name = ex->name;
        lb.metric = "MSE against exact attention";
        lb.zero = "answer 0: the MSE of answering 0 (exact's mean square); above it, an estimate "
                  "is worse than none";
        lb.t0 = tool_now_ms();
        ex->run(&lb);
        double secs = (tool_now_ms() - lb.t0) / 1e3;
        if (lb.fatal) {
            failed = 1;
            free(lb.rows);
            continue;
        }
        /* the CSV and its plot are staged and replaced together: a plot that fails leaves
         * the experiment's earlier files as they were */
        char csv[4200], png[4200];
        snprintf(csv, sizeof(csv), "%s/%s.csv", c.out, ex->name);
        snprintf(png, sizeof(png), "%s/%s.png", c.out, ex->name);
        tool_outputs outs;
        tool_outputs_init(&outs, CMD);
        int bad = tool_outputs_add(&outs, "--out", csv) != 0 ||
                  (!c.no_plot && tool_outputs_add(&outs, "--out", png) != 0);
        FILE *f = bad ? NULL : tool_outputs_open(&outs, 0);
        if (!f || write_csv(&lb, f) != 0) {
            if (f) tool_fail(CMD, "%s: write failed: %s", csv, strerror(errno));
            tool_outputs_discard(&outs);
            failed = 1;
            free(lb.rows);
            continue;
        }
        int p = PLOT_MISSING;
        if (!c.no_plot) {
            const char *staged = tool_outputs_stage(&outs, 1);
            p = staged ? plot(&lb, outs.o[0].tmp, staged, png) : PLOT_FAILED;
            if (p == PLOT_MISSING) tool_outputs_drop(&outs, 1); /* the CSV alone */
        }
        if (p == PLOT_FAILED || tool_outputs_commit(&outs) != 0) {
            tool_outputs_discard(&outs);
            failed = 1;
            free(lb.rows);
            continue;
        }
        print_table(&lb, secs);
        printf("  -> %s", csv);
        if (p == PLOT_OK) {
            printf(", %s", png);
            plotted++;
        }
        printf("\n");
        fflush(stdout);
        free(lb.rows);
    }
    if (made) rmdir(c.out); /* only if this run made it and wrote nothing there */
    fprintf(stderr, "approx: done in %.1f s\n", (tool_now_ms() - t_all) / 1e3);
    return failed ? TOOL_EXIT_FAIL : TOOL_EXIT_OK;
}
