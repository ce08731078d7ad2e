/* profile_favor.c: where the time of a FAVOR+ forward goes, stage by stage, on one thread.
 *
 * The library's forward (src/favor/forward.c, src/favor/scan.c, src/favor/features.c) is redone
 * here from the library's own internal pieces (pf_mm, the vector kernels, the feature map's
 * projection and exp, pf_favor_weighted_values, pf_favor_rebase, pf_favor_combine, and the
 * causal chunk's stages pf_favor_chunk_*, which pf_favor_causal_rows runs in the same order) with
 * a clock read around each stage: per block of 256 rows for the feature maps and the
 * bidirectional products, per causal chunk for the chunk's stages. The output is checked bit for
 * bit against pf_attn_favor on one thread, and the sum of the stages' times is set against the
 * library's own time, measured in the same run: so the table describes the library's forward, not
 * another program. The library itself carries no timers.
 *
 * Positive features, B = 1, H heads, d = dv, m features, one thread, the FAVOR_BLOCK and chunk
 * of the library (256 and 16), bidirectional key blocks as pf_favor_bidir_blocks cuts them; a
 * causal head must be one scan block (pf_favor_scan_blocks: H >= 4, or L <= 1024). Every stage's
 * time is the median over repeats of its total in one forward. Each forward is followed by a run
 * of the FMA peak probe (peak.h) of ~50 ms, and each fraction of the peak is the median over
 * repeats of the ratio within one repeat, as this machine's speed drifts with other work; a
 * repeat in which the thread lost the CPU for over 1% of its time is done again.
 *
 * FLOPs (multiply-add = 2): the products' own counts (the [V | 1] products have dv + 1 columns,
 * the causal chunk products their full C x C and C x (r + C) shapes); the exps and the other
 * elementwise work are shown by elements, with no FLOPs.
 *
 * --library N runs only pf_attn_favor, N times, with no clock reads and no output: for a
 * sampling profiler (perf record -e cpu-clock, see docs/profile_favor.md).
 *
 * --products runs only the last table, each product of the forward alone (a few seconds).
 *
 * --backward measures the backward from kept features instead (pf_attn_favor_save, then
 * pf_attn_favor_backward_saved), bidirectional or causal, against the plain forward in the same
 * repeats, each call paired with a probe run as above, then the backward's products alone; with
 * --library N it runs only that backward, N times.
 *
 * Usage: profile_favor [--L N] [--heads H] [--reps R] [--causal|--bidirectional] [--md]
 *                      [--library N] [--backward] [--products]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "favor/favor.h"
#include "peak.h"

enum { BLOCK = FAVOR_BLOCK, CHUNK = FAVOR_CHUNK }; /* the library's sizes (favor.h) */

typedef enum {
    S_SETUP,   /* checks, map binding (W^T), workspace */
    S_PROJ,    /* U = sqrt(s) X W^T (queries and keys) */
    S_STATS,   /* per row |x|^2, the overflow test, max u, the shift t and c */
    S_EXP,     /* exp(u - t), the subtraction in the exp's pass */
    S_VALUES,  /* key log factors' max, weighted [V | 1] rows (V checked) */
    S_KV,      /* bidirectional K~^T [V | 1], made as [V | 1]^T K~ and turned round */
    S_COMBINE, /* bidirectional: key blocks' partial sums combined */
    S_QKV,     /* bidirectional Q~ (K~^T [V | 1]) */
    S_READOUT, /* numerators over denominators, output checks */
    S_PREFIX,  /* causal: prefix maxima of the key log factors */
    S_A,       /* causal: A = Q~ K~^T within the chunk */
    S_MASK,    /* causal: A masked and scaled by e^(P_j - P_i) */
    S_CVALUES, /* causal: e^(c_j - P_j) [v_j | 1] (for A) and e^(c_j - M') [v_j | 1] (state) */
    S_QSCALE,  /* causal: rows of Q~ times e^(M - P_i) */
    S_OUT,     /* causal: O = [e^(M-P) Q~ | A] [S ; Vw] */
    S_STATE,   /* causal: S = beta S + K~^T [V | 1] */
    NSTAGES
} stage;

static const char *const stage_name[NSTAGES] = {
    "setup: checks, W^T, scratch",
    "projection X W^T (Q and K)",
    "feature map: |x|^2, max u, t, c",
    "feature map: exp(u - t)",
    "weighted [V | 1] rows",
    "[V | 1]^T K~ (dv+1 x r), turned",
    "combine key blocks",
    "Q~ (K~^T [V | 1])",
    "normalisation (readout)",
    "causal: prefix max of c",
    "causal: A = Q~ K~^T (lower part)",
    "causal: A masked, e^(P_j - P_i)",
    "causal: weighted [V | 1] (A, state)",
    "causal: Q~ rows times e^(M - P_i)",
    "causal: [Q~ | A] [S ; Vw]",
    "causal: state S += K~^T [V | 1]",
};

typedef struct {
    double t[NSTAGES];     /* seconds in one forward */
    double flops[NSTAGES]; /* multiply-add = 2 */
    double elems[NSTAGES]; /* elements of the elementwise stages */
    long clocks;           /* clock reads */
} profile;

/* This thread's CPU time, seconds. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double mark(profile *p, stage s, double t0) {
    const double t1 = now();
    p->t[s] += t1 - t0;
    p->clocks++;
    return t1;
}

/* ---- the positive feature map, pf_fmap_rows's steps (features.c) -------------------------- */

/* Row statistics of n rows of U in phi: t (the shift) into t, c = t - ln sqrt(m) - h. Returns 1
 * on a row the library would refuse (not expected here). */
PF_CLONES static int fmap_stats(const pf_fmap *fm, const float *phi, int ldphi, double *c, float *t,
                                const float *X, int n) {
    const int m = fm->m, d = fm->d;
    const pf_simd_table *vk = pf_simd();
    const double s2 = (double)fm->sqrt_s * (double)fm->sqrt_s;
    const double wmax2 = fm->wmax * fm->wmax;
    const double lnr = 0.5 * log((double)m);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        const float *p = phi + (size_t)i * (size_t)ldphi;
        const double sq = pf_sumsq_f64(X + (size_t)i * (size_t)d, d);
        const double h = 0.5 * s2 * sq;
        if (!(s2 * sq * wmax2 <= 1e76) && pf_nonfinite_f32(p, (size_t)m)) bad = 1;
        const float mx = vk->max(p, (size_t)m);
        t[i] = (float)((double)mx + lnr);
        c[i] = (double)t[i] - lnr - h + fm->logd;
    }
    return bad;
}

/* pf_fmap_rows (positive, no eps, no amax) in three timed stages (n <= BLOCK). */
static int fmap_rows(profile *p, const pf_fmap *fm, float *phi, int ldphi, double *c,
                     const float *X, int n) {
    const pf_simd_table *vk = pf_simd();
    float t[BLOCK];
    double tc = now();
    pf_fmap_project(fm, phi, ldphi, X, n);
    tc = mark(p, S_PROJ, tc);
    p->flops[S_PROJ] += 2.0 * n * fm->m * fm->d;
    const int bad = fmap_stats(fm, phi, ldphi, c, t, X, n);
    tc = mark(p, S_STATS, tc);
    p->elems[S_STATS] += (double)n * fm->m;
    for (int i = 0; i < n; i++)
        vk->exp_sub(phi + (size_t)i * (size_t)ldphi, phi + (size_t)i * (size_t)ldphi, t[i],
                    (size_t)fm->m);
    mark(p, S_EXP, tc);
    p->elems[S_EXP] += (double)n * fm->m;
    return bad;
}

/* ---- one head --------------------------------------------------------------------------- */

typedef struct {
    int L, d, dv, m, r, H, causal;
} dims;

/* Bidirectional: key blocks of kbl rows (each in blocks of BLOCK rows), combined in order, then
 * query blocks of BLOCK rows. part (nkb, r, dw), pmax (nkb). */
static int head_bidir(profile *p, const dims *D, const pf_fmap *fm, pf_favor_ws *ws, float *part,
                      double *pmax, int nkb, int kbl, float *out, const float *Q, const float *K,
                      const float *V) {
    const int r = D->r, d = D->d, dv = D->dv, dw = pf_favor_dw(dv);
    const size_t nkv = (size_t)r * (size_t)dw;
    int bad = 0;
    for (int kb = 0; kb < nkb; kb++) {
        const int j0 = kb * kbl, n = D->L - j0 < kbl ? D->L - j0 : kbl;
        float *KVb = part + (size_t)kb * nkv, *T = ws->state;
        double M = -INFINITY;
        double t = now();
        memset(T, 0, sizeof(float) * (size_t)(dv + 1) * (size_t)r);
        mark(p, S_KV, t);
        for (int b0 = 0; b0 < n; b0 += BLOCK) {
            const int nb = n - b0 < BLOCK ? n - b0 : BLOCK;
            const size_t row = (size_t)(j0 + b0);
            bad |= fmap_rows(p, fm, ws->phi, r, ws->c, K + row * (size_t)d, nb);
            t = now();
            const float beta = pf_favor_rebase(&M, ws->c, nb);
            bad |= pf_favor_weighted_values(ws->vaug, dw, V + row * (size_t)dv, dv, ws->c, NULL, M,
                                            nb);
            t = mark(p, S_VALUES, t);
            p->elems[S_VALUES] += (double)nb * (dv + 1);
            pf_mm(1, 0, dv + 1, r, nb, 1.0f, ws->vaug, dw, ws->phi, r, beta, T, r);
            mark(p, S_KV, t);
            p->flops[S_KV] += 2.0 * r * (dv + 1) * nb;
        }
        t = now();
        for (int f = 0; f < r; f++) {
            float *row = KVb + (size_t)f * (size_t)dw;
            for (int k = 0; k <= dv; k++) row[k] = T[(size_t)k * (size_t)r + (size_t)f];
            for (int k = dv + 1; k < dw; k++) row[k] = 0.0f;
        }
        mark(p, S_KV, t);
        pmax[kb] = M;
    }
    double t = now();
    for (int kb = 1; kb < nkb; kb++)
        pf_favor_combine(part, &pmax[0], part + kb * nkv, pmax[kb], nkv);
    mark(p, S_COMBINE, t);
    p->elems[S_COMBINE] += (double)(nkb - 1) * (double)nkv;
    for (int i0 = 0; i0 < D->L; i0 += BLOCK) {
        const int nb = D->L - i0 < BLOCK ? D->L - i0 : BLOCK;
        bad |= fmap_rows(p, fm, ws->phi, r, ws->cq, Q + (size_t)i0 * (size_t)d, nb);
        t = now();
        pf_mm(0, 0, nb, dv + 1, r, 1.0f, ws->phi, r, part, dw, 0.0f, ws->o, dw);
        t = mark(p, S_QKV, t);
        p->flops[S_QKV] += 2.0 * nb * r * (dv + 1);
        bad |= PF_OK != pf_favor_readout(out + (size_t)i0 * (size_t)dv, ws->o, nb, dv);
        mark(p, S_READOUT, t);
        p->elems[S_READOUT] += (double)nb * dv;
    }
    return bad;
}

/* Causal: pf_favor_causal_rows over the whole head from an empty state (every key valid). */
static int head_causal(profile *p, const dims *D, const pf_fmap *fm, pf_favor_ws *ws, float *out,
                       const float *Q, const float *K, const float *V) {
    const int r = D->r, d = D->d, dv = D->dv, dw = pf_favor_dw(dv), C = CHUNK, L = D->L;
    const int NB = pf_favor_block(1, C), ldq = r + C;
    float *S = ws->state, *Vw = ws->state + (size_t)r * (size_t)dw;
    double M = -INFINITY, *P = ws->p;
    int bad = 0;
    for (int b0 = 0; b0 < L; b0 += NB) {
        const int nb = L - b0 < NB ? L - b0 : NB;
        double t = now();
        bad |= pf_nonfinite_f32(V + (size_t)b0 * (size_t)dv, (size_t)nb * (size_t)dv);
        mark(p, S_CVALUES, t);
        float *kphi = ws->kphi;
        double *kc = ws->c;
        bad |= fmap_rows(p, fm, ws->phi, ldq, ws->cq, Q + (size_t)b0 * (size_t)d, nb);
        bad |= fmap_rows(p, fm, kphi, r, kc, K + (size_t)b0 * (size_t)d, nb);
        for (int t0 = b0; t0 < b0 + nb; t0 += C) {
            const int n = b0 + nb - t0 < C ? b0 + nb - t0 : C, nk = n;
            float *Qc = ws->phi + (size_t)(t0 - b0) * (size_t)ldq, *A = Qc + r;
            const float *Kc = kphi + (size_t)(t0 - b0) * (size_t)r;
            const float *Vc = V + (size_t)t0 * (size_t)dv;
            const double *ck = kc + (t0 - b0);
            const int have_state = M > -INFINITY;
            t = now();
            pf_favor_chunk_prefix(P, ck, n, nk, M);
            t = mark(p, S_PREFIX, t);
            pf_favor_chunk_scores(A, ldq, Qc, Kc, r, n, nk);
            for (int i0 = 0; i0 < n; i0 += A_STRIP) { /* (its flops: the lower part's strips) */
                const int mi = n - i0 < A_STRIP ? n - i0 : A_STRIP;
                p->flops[S_A] += 2.0 * mi * (i0 + mi < nk ? i0 + mi : nk) * r;
            }
            t = mark(p, S_A, t);
            pf_favor_chunk_mask(A, ldq, P, n, nk);
            t = mark(p, S_MASK, t);
            p->elems[S_MASK] += (double)n * nk;
            pf_favor_weighted_values2(Vw, ws->vs, dw, Vc, dv, ck, P, P[n - 1], nk);
            t = mark(p, S_CVALUES, t);
            p->elems[S_CVALUES] += 2.0 * nk * (dv + 1);
            if (have_state) {
                pf_favor_chunk_qscale(Qc, ldq, r, P, n, M);
                for (int i = 0; i < n; i++) p->elems[S_QSCALE] += P[i] == M ? 0 : r;
            }
            t = mark(p, S_QSCALE, t);
            pf_favor_chunk_out(ws->o + (size_t)(t0 - b0) * (size_t)dw, dw, Qc, ldq, S, Vw, r, n, nk,
                               dv, have_state);
            t = mark(p, S_OUT, t);
            p->flops[S_OUT] += 2.0 * n * ((have_state ? r : 0) + nk) * (dv + 1);
            const double Mn = P[n - 1];
            pf_favor_chunk_state(S, dw, Kc, r, ws->vs, nk, dv,
                                 have_state ? (float)exp(M - Mn) : 0.0f);
            mark(p, S_STATE, t);
            p->flops[S_STATE] += 2.0 * r * (dv + 1) * nk;
            M = Mn;
        }
        t = now();
        bad |= PF_OK != pf_favor_readout(out + (size_t)b0 * (size_t)dv, ws->o, nb, dv);
        mark(p, S_READOUT, t);
        p->elems[S_READOUT] += (double)nb * dv;
    }
    return bad;
}

/* One instrumented forward of H heads (B = 1). Returns 0, or 1 if some input was refused. */
static int forward(profile *p, const dims *D, float *out, const float *Q, const float *K,
                   const float *V, const float *W) {
    memset(p, 0, sizeof *p);
    double t = now();
    const pf_shape shape = {1, D->H, D->L, D->L, D->d, D->dv};
    pf_attn_opts opts = pf_attn_opts_default();
    opts.causal = D->causal;
    opts.threads = 1;
    pf_favor_opts fav = pf_favor_opts_default();
    fav.W = W;
    fav.m = D->m;
    if (pf_favor_check(&shape, &opts, &fav) != PF_OK) return 1;
    const int C = D->causal ? CHUNK : 0, r = D->r, dw = pf_favor_dw(D->dv);
    int kbl = D->L, nkb = D->causal ? pf_favor_scan_blocks(D->L, D->H, C, &kbl)
                                    : pf_favor_bidir_blocks(D->L, D->H, &kbl);
    if (D->causal && nkb != 1) return 2; /* (see the top; main checks) */
    pf_favor_ws ws;
    pf_kernel_ws kw;
    if (pf_favor_ws_alloc(&ws, pf_favor_block(D->causal, C), C, r, D->dv) != 0) return 1;
    if (pf_kernel_ws_alloc(&kw, PF_KERNEL_POSITIVE, D->m, D->d) != 0) return 1;
    float *part = pf_alloc((size_t)nkb * (size_t)r * (size_t)dw, sizeof(float));
    double *pmax = xmalloc(sizeof(double) * (size_t)nkb);
    if (!part) return 1;
    t = mark(p, S_SETUP, t);
    int bad = 0;
    for (int h = 0; h < D->H && !bad; h++) {
        const size_t o = (size_t)h * (size_t)D->L;
        t = now();
        pf_fmap fm = pf_favor_fmap(&shape, &opts, &fav, h);
        bad |= pf_favor_bind(&fm, &kw, &fav, Q + o * D->d, D->L, K + o * D->d, D->L) != PF_OK;
        mark(p, S_SETUP, t);
        if (D->causal) {
            memset(ws.state, 0, sizeof(float) * (size_t)r * (size_t)dw);
            bad |= head_causal(p, D, &fm, &ws, out + o * D->dv, Q + o * D->d, K + o * D->d,
                               V + o * D->dv);
        } else {
            bad |= head_bidir(p, D, &fm, &ws, part, pmax, nkb, kbl, out + o * D->dv, Q + o * D->d,
                              K + o * D->d, V + o * D->dv);
        }
    }
    t = now();
    pf_favor_ws_free(&ws);
    pf_kernel_ws_free(&kw);
    pf_free(part);
    free(pmax);
    mark(p, S_SETUP, t);
    return bad;
}

/* name as a table cell: for Markdown (md) a code span with its pipes escaped, into buf (96). */
static const char *cell_name(char *buf, const char *name, int md) {
    if (!md) return name;
    size_t o = 0;
    buf[o++] = '`';
    for (const char *c = name; *c && o < 92; c++) {
        if (*c == '|') buf[o++] = '\\';
        buf[o++] = *c;
    }
    buf[o++] = '`';
    buf[o] = '\0';
    return buf;
}

/* ---- each product alone ------------------------------------------------------------------ */

typedef struct {
    const char *name;
    int ta, tb, m, n, k, lda, ldb, ldc;
    float alpha, beta;
} product;

/* One product shape run over and over on the same operands (in cache), runs of ~20 ms each
 * paired with a run of the FMA peak probe of as long: the median over 15 pairs of GFLOP/s and,
 * in *frac, of GFLOP/s over the probe's. */
static double product_gflops(const product *pr, peak_isa isa, double *frac) {
    const size_t na = (size_t)(pr->ta ? pr->k : pr->m) * (size_t)pr->lda;
    const size_t nb = (size_t)(pr->tb ? pr->n : pr->k) * (size_t)pr->ldb;
    const size_t nc = (size_t)pr->m * (size_t)pr->ldc;
    float *A = pf_alloc(na, sizeof(float)), *B = pf_alloc(nb, sizeof(float));
    float *Cm = pf_alloc(nc, sizeof(float));
    if (!A || !B || !Cm) exit(2);
    fill(A, na, 11, 0.1f);
    fill(B, nb, 12, 0.1f);
    fill(Cm, nc, 13, 0.1f);
    const double f = 2.0 * pr->m * pr->n * pr->k;
    long it = 1;
    for (;;) {
        const double t0 = now();
        for (long i = 0; i < it; i++)
            pf_mm(pr->ta, pr->tb, pr->m, pr->n, pr->k, pr->alpha, A, pr->lda, B, pr->ldb, pr->beta,
                  Cm, pr->ldc);
        if (now() - t0 > 0.02) break;
        it *= 2;
    }
    const long probe_iters = peak_iters(isa, 1, 0.02);
    double g[15], q[15];
    for (int r = 0; r < 15; r++) {
        const double t0 = now();
        for (long i = 0; i < it; i++)
            pf_mm(pr->ta, pr->tb, pr->m, pr->n, pr->k, pr->alpha, A, pr->lda, B, pr->ldb, pr->beta,
                  Cm, pr->ldc);
        g[r] = f * (double)it / (now() - t0) * 1e-9;
        q[r] = g[r] / peak_run(isa, 1, probe_iters);
    }
    peak_sink = peak_sink + Cm[0];
    pf_free(A), pf_free(B), pf_free(Cm);
    *frac = median(q, 15);
    return median(g, 15);
}

/* Each product of ps alone (product_gflops), a row each, under title. */
static void print_products(const product *ps, size_t n, const char *title, peak_isa isa, int md) {
    printf("%s", title);
    printf(md ? "| %-30s | %-16s | %8s | %7s |\n" : "%-30s %-16s %9s %8s\n", "product", "m x n x k",
           "GFLOP/s", "% peak");
    if (md) printf("|---|---|--:|--:|\n");
    for (size_t i = 0; i < n; i++) {
        double frac;
        const double g = product_gflops(&ps[i], isa, &frac);
        char shape[32], nm[96];
        snprintf(shape, sizeof shape, "%d x %d x %d", ps[i].m, ps[i].n, ps[i].k);
        printf(md ? "| %-30s | %-16s | %8.1f | %7.0f |\n" : "%-30s %-16s %9.1f %8.0f\n",
               cell_name(nm, ps[i].name, md), shape, g, 100 * frac);
    }
}

static void products_alone(const dims *D, peak_isa isa, int md) {
    const int r = D->r, d = D->d, dv = D->dv, dw = pf_favor_dw(dv), C = CHUNK;
    const product ps[] = {
        {"projection X W^T", 0, 0, BLOCK, D->m, d, d, D->m, r, 0.125f, 0.0f},
        {"K~^T [V | 1]", 1, 0, r, dv + 1, BLOCK, r, dw, dw, 1.0f, 0.5f},
        {"[V | 1]^T K~ (the library's)", 1, 0, dv + 1, r, BLOCK, dw, r, r, 1.0f, 0.5f},
        {"K~^T V (no ones column)", 1, 0, r, dv, BLOCK, r, dw, dw, 1.0f, 0.5f},
        {"Q~ (K~^T [V | 1])", 0, 0, BLOCK, dv + 1, r, r, dw, dw, 1.0f, 0.0f},
        {"Q~ (K~^T V) (no ones column)", 0, 0, BLOCK, dv, r, r, dw, dw, 1.0f, 0.0f},
        {"causal A = Q~ K~^T", 0, 1, C, C, r, r + C, r, r + C, 1.0f, 0.0f},
        {"causal [Q~ | A] [S ; Vw]", 0, 0, C, dv + 1, r + C, r + C, dw, dw, 1.0f, 0.0f},
        {"causal S += K~^T [V | 1]", 1, 0, r, dv + 1, C, r, dw, dw, 1.0f, 0.5f},
    };
    print_products(
        ps, sizeof ps / sizeof *ps,
        "\nEach product alone, its operands in cache (pf_mm; medians over 15 runs of ~20 "
        "ms, each paired\nwith a run of the peak probe):\n",
        isa, md);
}

static double lib_forward(const dims *D, float *out, const float *Q, const float *K, const float *V,
                          const float *W) {
    const pf_shape shape = {1, D->H, D->L, D->L, D->d, D->dv};
    pf_attn_opts opts = pf_attn_opts_default();
    opts.causal = D->causal;
    opts.threads = 1;
    pf_favor_opts fav = pf_favor_opts_default();
    fav.W = W;
    fav.m = D->m;
    const double t0 = now();
    const pf_status st = pf_attn_favor(out, Q, K, V, &shape, &opts, &fav);
    const double t = now() - t0;
    if (st != PF_OK) {
        fprintf(stderr, "profile_favor: pf_attn_favor: %s\n", pf_status_str(st));
        exit(1);
    }
    return t;
}

/* ---- the backward from kept features ------------------------------------------------------ */

typedef struct {
    pf_shape shape;
    pf_attn_opts opts;
    pf_favor_opts fav;
    pf_favor_saved *sv;
    float *dout, *dQ, *dK, *dV;
} bwd_case;

static void bwd_case_init(bwd_case *c, const dims *D, int causal, const float *W) {
    c->shape = (pf_shape){1, D->H, D->L, D->L, D->d, D->dv};
    c->opts = pf_attn_opts_default();
    c->opts.causal = causal;
    c->opts.threads = 1;
    c->fav = pf_favor_opts_default();
    c->fav.W = W;
    c->fav.m = D->m;
    const size_t n = (size_t)D->H * (size_t)D->L * (size_t)D->d;
    c->dout = xmalloc(sizeof(float) * n);
    c->dQ = xmalloc(sizeof(float) * n);
    c->dK = xmalloc(sizeof(float) * n);
    c->dV = xmalloc(sizeof(float) * n);
    fill(c->dout, n, 4, 1.0f);
    if (pf_favor_saved_create(&c->sv, &c->shape, &c->opts, &c->fav, 0) != PF_OK) {
        fprintf(stderr, "profile_favor: pf_favor_saved_create failed\n");
        exit(1);
    }
}

static void bwd_case_free(bwd_case *c) {
    pf_favor_saved_free(c->sv);
    free(c->dout), free(c->dQ), free(c->dK), free(c->dV);
}

/* The keeping forward (into out) and then the backward from what it kept: their two times. */
static void bwd_once(bwd_case *c, float *out, const float *Q, const float *K, const float *V,
                     double *t_save, double *t_bwd) {
    const double t0 = now();
    pf_status st = pf_attn_favor_save(out, Q, K, V, &c->shape, &c->opts, &c->fav, c->sv);
    const double t1 = now();
    if (st == PF_OK)
        st = pf_attn_favor_backward_saved(c->dQ, c->dK, c->dV, c->dout, Q, K, V, out, &c->shape,
                                          &c->opts, &c->fav, c->sv);
    *t_save = t1 - t0;
    *t_bwd = now() - t1;
    if (st != PF_OK) {
        fprintf(stderr, "profile_favor: the kept backward: %s\n", pf_status_str(st));
        exit(1);
    }
}

/* The backward's products, bidirectional, per block of BLOCK rows (src/favor/backward.c), alone
 * with their operands in cache. */
static void backward_products(const dims *D, peak_isa isa, int md) {
    const int r = D->r, d = D->d, dv = D->dv, dw = pf_favor_dw(dv);
    const product ps[] = {
        {"dKV~^T = dN~^T Q~ (turned)", 1, 0, dv + 1, r, BLOCK, dw, r, r, 1.0f, 0.5f},
        {"dQ~ = dN~ KV~^T", 0, 0, BLOCK, r, dv + 1, dw, r, r, 1.0f, 0.0f},
        {"dQ = (dQ~ . Q~) W (and dK)", 0, 0, BLOCK, d, D->m, r, d, d, 0.125f, 0.0f},
        {"dK~ = [V | 1]_w dKV~^T", 0, 0, BLOCK, r, dv + 1, dw, r, r, 1.0f, 0.0f},
        {"dV = K~ dKV~", 0, 0, BLOCK, dv, r, r, dv, dv, 1.0f, 0.0f},
    };
    print_products(ps, sizeof ps / sizeof *ps,
                   "\nThe backward's products alone, operands in cache (as above):\n", isa, md);
}

/* Plain forward, keeping forward and kept backward in turn, each followed by a probe run, for
 * reps repeats kept (as the forward's profile keeps them). The backward's FLOPs are those of
 * its products (src/favor/backward.c), per row: bidirectional 2 m (3 (dv + 1) + dv + 2 d) for
 * dKV~, dQ~ and dK~ with the ones column, dV, and the two feature-map gradients times W (1.51x
 * the forward's model 8 m d at d = dv = 64); causal 2 (4 r (dv + 1) + r dv + 2 m d + 3 C r +
 * C (dv + 1) + C dv): the prefix state rebuilt, dQ~, the suffix state, dK~ (with the ones
 * column), dV, the two feature-map gradients, and the chunk's C x C products A, B, B K~, B^T Q~
 * and A^T dN~ (1.98x). */
static int backward_profile(const dims *D, int reps, int md, const float *Q, const float *K,
                            const float *V, const float *W) {
    const peak_isa isa = peak_isa_of_kernels();
    const long probe_iters = peak_iters(isa, 1, 0.05);
    const size_t n = (size_t)D->H * (size_t)D->L * (size_t)D->d;
    float *out = xmalloc(sizeof(float) * n);
    char cpu[192];
    printf("performer %s on %s, 1 thread, vector kernels %s\n", pf_version(),
           cpu_name(cpu, sizeof cpu), pf_simd_path());
    const double fwd_model = 8.0 * D->H * (double)D->L * D->m * D->d;
    const double rows = (double)D->H * D->L, r = D->r, m = D->m, d = D->d, dv = D->dv, C = CHUNK;
    const double bwd_bidir = 2.0 * rows * m * (3.0 * (dv + 1) + dv + 2.0 * d);
    const double bwd_causal =
        2.0 * rows *
        (4.0 * r * (dv + 1) + r * dv + 2.0 * m * d + 3.0 * C * r + C * (dv + 1) + C * dv);
    for (int causal = 0; causal <= 1; causal++) {
        if (D->causal >= 0 && causal != D->causal) continue;
        dims Dc = *D;
        Dc.causal = causal;
        const double bwd_model = causal ? bwd_causal : bwd_bidir;
        bwd_case c;
        bwd_case_init(&c, &Dc, causal, W);
        double tf[99], ts[99], tb[99], ff[99], fs[99], fb[99], ratio[99], ratio_eq[99], pk[99];
        double t_s, t_b;
        lib_forward(&Dc, out, Q, K, V, W); /* warm-up */
        bwd_once(&c, out, Q, K, V, &t_s, &t_b);
        int kept = 0, tries = 0;
        for (; kept < reps; tries++) {
            const double w0 = now(), c0 = cpu_now();
            const double t_f = lib_forward(&Dc, out, Q, K, V, W);
            const double p1 = peak_run(isa, 1, probe_iters);
            bwd_once(&c, out, Q, K, V, &t_s, &t_b);
            const double p2 = peak_run(isa, 1, probe_iters);
            const double w = now() - w0, cw = cpu_now() - c0;
            if (w - cw > 0.01 * w && tries < 10 * reps) continue;
            const double p = 0.5 * (p1 + p2);
            tf[kept] = t_f, ts[kept] = t_s, tb[kept] = t_b, pk[kept] = p;
            ff[kept] = fwd_model / t_f * 1e-9 / p1;
            fs[kept] = fwd_model / t_s * 1e-9 / p;
            fb[kept] = bwd_model / t_b * 1e-9 / p2;
            ratio[kept] = (t_s + t_b) / t_f;
            ratio_eq[kept] = (t_s + bwd_model / fwd_model * t_f) / t_f; /* at the forward's speed */
            kept++;
        }
        printf("\nFAVOR+ %s, features kept, B=1 H=%d L=%d d=%d m=%d, positive, 1 thread, "
               "median of %d\n(%d of %d repeats kept; FMA peak %s, %.1f GFLOP/s, median of the "
               "paired runs)\n\n",
               causal ? "causal" : "bidirectional", Dc.H, Dc.L, Dc.d, Dc.m, reps, reps, tries,
               peak_isa_name(isa), median(pk, reps));
        const char *fmt = md ? "| %-40s | %8s | %7s |\n" : "%-40s %9s %8s\n";
        printf(fmt, "call", "ms", "% peak");
        if (md) printf("|---|--:|--:|\n");
        char a[24], b[24];
        snprintf(a, 24, "%.2f", median(tf, reps) * 1e3);
        snprintf(b, 24, "%.0f", 100 * median(ff, reps));
        printf(fmt, "forward (pf_attn_favor)", a, b);
        snprintf(a, 24, "%.2f", median(ts, reps) * 1e3);
        snprintf(b, 24, "%.0f", 100 * median(fs, reps));
        printf(fmt, "keeping forward (pf_attn_favor_save)", a, b);
        snprintf(a, 24, "%.2f", median(tb, reps) * 1e3);
        snprintf(b, 24, "%.0f", 100 * median(fb, reps));
        printf(fmt, "backward from kept features", a, b);
        printf("\n(keeping forward + backward) / forward: %.3fx; the backward's products are "
               "%.2fx the forward's\nmodel, so at the forward's speed it would be %.3fx\n",
               median(ratio, reps), bwd_model / fwd_model, median(ratio_eq, reps));
        bwd_case_free(&c);
    }
    backward_products(D, isa, md);
    free(out);
    return 0;
}

int main(int argc, char **argv) {
    dims D = {4096, 64, 64, 256, 256, 8, -1};
    int reps = 9, md = 0, library = 0, backward = 0, products = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--L") == 0 && i + 1 < argc)
            D.L = atoi(argv[++i]);
        else if (strcmp(argv[i], "--heads") == 0 && i + 1 < argc)
            D.H = atoi(argv[++i]);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--causal") == 0)
            D.causal = 1;
        else if (strcmp(argv[i], "--bidirectional") == 0)
            D.causal = 0;
        else if (strcmp(argv[i], "--md") == 0)
            md = 1;
        else if (strcmp(argv[i], "--library") == 0 && i + 1 < argc)
            library = atoi(argv[++i]);
        else if (strcmp(argv[i], "--backward") == 0)
            backward = 1;
        else if (strcmp(argv[i], "--products") == 0)
            products = 1;
        else {
            fprintf(stderr, "usage: profile_favor [--L N] [--heads H] [--reps R] "
                            "[--causal|--bidirectional] [--md] [--library N] [--backward] "
                            "[--products]\n");
            return 2;
        }
    }
    if (D.L < 1 || D.H < 1 || reps < 1 || reps > 99) {
        fprintf(stderr, "profile_favor: L, heads >= 1, 1 <= reps <= 99\n");
        return 2;
    }
    int kbl;
    if (!backward && D.causal != 0 && pf_favor_scan_blocks(D.L, D.H, CHUNK, &kbl) != 1) {
        fprintf(stderr, "profile_favor: the causal profile needs one scan block a head (heads "
                        ">= 4, or L <= 1024)\n");
        return 2;
    }
    if (products) { /* the forward's products alone (a few seconds: for work on the kernels) */
        char cpu[192];
        printf("performer %s on %s, 1 thread, vector kernels %s, FMA peak %s\n", pf_version(),
               cpu_name(cpu, sizeof cpu), pf_simd_path(), peak_isa_name(peak_isa_of_kernels()));
        products_alone(&D, peak_isa_of_kernels(), md);
        return 0;
    }
    const size_t n = (size_t)D.H * (size_t)D.L * (size_t)D.d;
    float *Q = xmalloc(sizeof(float) * n), *K = xmalloc(sizeof(float) * n);
    float *V = xmalloc(sizeof(float) * n), *out = xmalloc(sizeof(float) * n);
    float *ref = xmalloc(sizeof(float) * n), *W = xmalloc(sizeof(float) * D.m * D.d);
    fill(Q, n, 1, 1.0f);
    fill(K, n, 2, 1.0f);
    fill(V, n, 3, 1.0f);
    pf_projection_draw(W, D.m, D.d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 0, 0);
    if (library > 0) {
        D.causal = D.causal > 0;
        if (backward) {
            bwd_case c;
            bwd_case_init(&c, &D, D.causal, W);
            double t_s, t_b;
            for (int i = 0; i < library; i++) {
                bwd_once(&c, out, Q, K, V, &t_s, &t_b);
            }
            bwd_case_free(&c);
        } else {
            for (int i = 0; i < library; i++) lib_forward(&D, out, Q, K, V, W);
        }
        return 0;
    }
    if (backward) return backward_profile(&D, reps, md, Q, K, V, W);

    /* every timed forward is paired with a run of the FMA peak probe (peak.h) of ~50 ms right
     * after it, and each fraction of the peak is the median over the pairs of the ratio within
     * one pair: this machine's speed drifts with other work (and with its host's) */
    const peak_isa isa = peak_isa_of_kernels();
    const long probe_iters = peak_iters(isa, 1, 0.05);
    char cpu[192];
    printf("performer %s on %s, 1 thread, vector kernels %s\n", pf_version(),
           cpu_name(cpu, sizeof cpu), pf_simd_path());
    double clk[64];
    for (int i = 0; i < 64; i++) {
        const double t0 = now();
        for (int k = 0; k < 1000; k++) (void)now();
        clk[i] = (now() - t0) / 1000;
    }
    const double clock_cost = median(clk, 64);
    const char *row_fmt = md ? "| %-36s | %10s | %8s | %7s | %8s | %7s | %9s |\n"
                             : "%-36s %11s %9s %8s %9s %8s %10s\n";

    for (int causal = 0; causal <= 1; causal++) {
        if (D.causal >= 0 && causal != D.causal) continue;
        dims Dc = D;
        Dc.causal = causal;
        profile prof[99], tmp;
        double lib[99], tot[99], probe[99];
        /* warm-up, and the bitwise check */
        lib_forward(&Dc, ref, Q, K, V, W);
        if (forward(&tmp, &Dc, out, Q, K, V, W)) {
            fprintf(stderr, "profile_favor: the inputs were refused\n");
            return 1;
        }
        size_t diff = 0;
        for (size_t i = 0; i < n; i++) diff += memcmp(&out[i], &ref[i], sizeof(float)) != 0;
        /* the library, the profile and the probe in turn; a run counts when this thread had
         * the CPU for all but 1% of its wall time (the clocks would count the time the
         * machine's other work took the CPU away), up to 10 tries a run */
        int kept = 0, tries = 0;
        for (; kept < reps; tries++) {
            const double w0 = now(), c0 = cpu_now();
            lib[kept] = lib_forward(&Dc, ref, Q, K, V, W);
            forward(&prof[kept], &Dc, out, Q, K, V, W);
            probe[kept] = peak_run(isa, 1, probe_iters);
            const double w = now() - w0, c = cpu_now() - c0;
            if (w - c > 0.01 * w && tries < 10 * reps) continue;
            tot[kept] = 0;
            for (int s = 0; s < NSTAGES; s++) tot[kept] += prof[kept].t[s];
            kept++;
        }
        const profile *p0 = &prof[0];
        const double model = 8.0 * Dc.H * (double)Dc.L * Dc.m * Dc.d; /* bench_attn's */
        double all_flops = 0;
        for (int s = 0; s < NSTAGES; s++) all_flops += p0->flops[s];
        /* medians of times, and of per-run fractions of the peak */
        double v[99], med[NSTAGES], frac[NSTAGES];
        for (int s = 0; s < NSTAGES; s++) {
            for (int r = 0; r < reps; r++) v[r] = prof[r].t[s];
            med[s] = median(v, reps);
            for (int r = 0; r < reps; r++) v[r] = p0->flops[s] / prof[r].t[s] * 1e-9 / probe[r];
            frac[s] = median(v, reps);
        }
        for (int r = 0; r < reps; r++) v[r] = model / lib[r] * 1e-9 / probe[r];
        const double lib_frac = median(v, reps);
        for (int r = 0; r < reps; r++) v[r] = all_flops / tot[r] * 1e-9 / probe[r];
        const double tot_frac = median(v, reps);
        const double lib_t = median(lib, reps), tot_t = median(tot, reps);
        for (int r = 0; r < reps; r++) v[r] = probe[r];
        const double pk_med = median(v, reps), pk_lo = v[0], pk_hi = v[reps - 1];
        printf("\nFAVOR+ %s forward, B=1 H=%d L=%d d=%d m=%d, positive, 1 thread, median of %d\n"
               "FMA peak, 1 thread, %s: %.1f GFLOP/s (median of the runs paired with the "
               "forwards;\n%.1f to %.1f); %d of %d runs kept (the others lost the CPU to other "
               "work for over 1%%\nof their time); output %s pf_attn_favor's (%zu of %zu floats "
               "differ)\nlibrary call %.2f ms (%.1f GFLOP/s by bench_attn's model, 8 H L m d = "
               "%.4g FLOPs: %.0f%% of\npeak); stages' sum %.2f ms (%.2fx the library's; %ld "
               "clock reads of %.0f ns each, %.2f ms)\n\n",
               causal ? "causal" : "bidirectional", Dc.H, Dc.L, Dc.d, Dc.m, reps,
               peak_isa_name(isa), pk_med, pk_lo, pk_hi, reps, tries,
               diff ? "DIFFERS FROM" : "identical to", diff, n, lib_t * 1e3, model / lib_t * 1e-9,
               model, 100 * lib_frac, tot_t * 1e3, tot_t / lib_t, p0->clocks, clock_cost * 1e9,
               p0->clocks * clock_cost * 1e3);
        printf(row_fmt, "stage", "MFLOP", "ms", "% time", "GFLOP/s", "% peak", "ns/elem");
        if (md) printf("|---|--:|--:|--:|--:|--:|--:|\n");
        for (int s = 0; s < NSTAGES; s++) {
            if (p0->t[s] == 0 && p0->flops[s] == 0 && p0->elems[s] == 0) continue;
            char c[6][24];
            const double f = p0->flops[s];
            snprintf(c[0], 24, f > 0 ? "%.1f" : "-", f * 1e-6);
            snprintf(c[1], 24, "%.2f", med[s] * 1e3);
            snprintf(c[2], 24, "%.1f", 100 * med[s] / tot_t);
            snprintf(c[3], 24, f > 0 ? "%.1f" : "-", f / med[s] * 1e-9);
            snprintf(c[4], 24, f > 0 ? "%.0f" : "-", 100 * frac[s]);
            snprintf(c[5], 24, p0->elems[s] > 0 ? "%.2f" : "-", med[s] / p0->elems[s] * 1e9);
            char nm[96];
            printf(row_fmt, cell_name(nm, stage_name[s], md), c[0], c[1], c[2], c[3], c[4], c[5]);
        }
        char c[4][24];
        snprintf(c[0], 24, "%.1f", all_flops * 1e-6);
        snprintf(c[1], 24, "%.2f", tot_t * 1e3);
        snprintf(c[2], 24, "%.1f", all_flops / tot_t * 1e-9);
        snprintf(c[3], 24, "%.0f", 100 * tot_frac);
        printf(row_fmt, md ? "**all stages**" : "all stages", c[0], c[1], "100.0", c[2], c[3], "-");
        printf("(bench_attn's model: %.1f MFLOP; the products above do %.1f, %.2fx)\n",
               model * 1e-6, all_flops * 1e-6, all_flops / model);
        if (diff) return 1;
    }
    products_alone(&D, isa, md);
    free(Q), free(K), free(V), free(out), free(ref), free(W);
    return 0;
}
