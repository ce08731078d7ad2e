/* backward.c: the backward pass of FAVOR+ attention, fast and float64 reference.
 *
 * Notation per head, with stabilised features (favor.h) q~_i, k~_j and key log factors c_j:
 * key j enters query i's sums as k^_j = k~_j e^(c_j - ref_i) with ref_i = M (bidirectional:
 * the max over all keys) or P_i (causal: the prefix max up to i). Then, with [v | 1] the
 * augmented values and G = dout,
 *
 *     n_i = sum_j (q~_i.k^_j) v_j,  D_i = sum_j q~_i.k^_j,  out_i = n_i / D_i
 *     dn_i = G_i / D_i,  dD_i = -(G_i.out_i) / D_i,  dN~_i = [dn_i | dD_i]   (dv+1)
 *     dq~_i = sum_{j seen by i} k^_j ([v_j|1].dN~_i)         = S_i dN~_i
 *     dk^_j = sum_{i that see j} q~_i ([v_j|1].dN~_i)       = R_j [v_j|1]
 *     dv_j  = sum_{i that see j} (q~_i.k^_j) dn_i
 *
 * out is homogeneous of degree 0 in each query's features and in the key features a query
 * sees, so the references M, P_i and the query's own log factor are constants: the gradient
 * through each feature map is the one of the unstabilised map, written in terms of phi~
 * (pf_fmap_rows_backward), and exact almost everywhere. When the caller passes the forward's
 * out, only D_i is recomputed (a matrix-vector product), not n_i.
 *
 * Bidirectional: KV~ = sum_j k^_j [v_j|1]^T (r x dw, the forward's layout and the forward's
 * key blocks, so D_i has the forward's bits); dQ~ = dN~ KV~^T; dKV~ = Q~^T dN~;
 * dK^ = [V|1]_w dKV~^T; dV = K^ dKV. Three passes, each cut into units independent of the
 * thread count: key blocks (K~ kept, partial KV~ combined in block order), query blocks (dQ,
 * partial dKV~ summed in block order), key blocks again (dK, dV). Heads go in groups whose kept
 * K~ fit in a fixed budget.
 *
 * Causal, chunks of C as in the forward, one head per unit: a forward scan recomputes out (or D)
 * with the prefix state S and gives dQ~ (inter-chunk e^(M - P_i) S dN~_i, intra-chunk the masked
 * C x C products); a reverse scan carries the suffix state R = sum_{i later} e^(ref - P_i) q~_i
 * dN~_i^T, kept referenced to the state max M_c at the end of the current chunk: stepping back
 * to a smaller reference multiplies R by e^(M_{c-1} - M_c) <= 1, and every key weight
 * e^(c_j - P_i) or e^(c_j - M_c) is <= 1 too. There is no per-position state and no prefix
 * state is ever recovered by subtraction. One head keeps its features Q~, K~ (L x r each, unless
 * the forward kept them), dN~ (L x dv+1), the chunks' masked score blocks (L x C, twice) and the
 * log factors (L): O(L (r + C + dv)) per thread. That would grow without bound (600 MiB at
 * L = 131072, r = 256, two threads), so a head whose rows do not fit in BWD_STORE goes in
 * segments: the forward scan keeps only the prefix state at each segment's start, and the reverse
 * scan makes a segment's rows again from it; the scratch is then about BWD_SEGMENT whatever L,
 * for about a fifth more time. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_common.h"
#include "favor.h"

enum {
    BWD_BLOCK = 256,      /* rows per block of features, bidirectional */
    BWD_SPLIT = 16,       /* bidirectional: blocks wanted over all heads (pf_favor_split) */
    BWD_BUDGET = 1 << 20, /* floats of kept K~ (4 MiB) a group of heads holds: one L = 4096 head */
};

/* Causal: a thread keeps a head's rows whole while they fit in BWD_STORE bytes, else segments of
 * about BWD_SEGMENT bytes (bwd_causal_unit). */
static const size_t BWD_STORE = (size_t)64 << 20, BWD_SEGMENT = (size_t)16 << 20;

/* ---- per-thread scratch ------------------------------------------------------------------- */

typedef struct bwd_ws {
    float *kst;    /* (Lk, r): causal: K~ of the head */
    float *qst;    /* (L, r): causal: Q~ of the head */
    float *dnst;   /* (L, dv+1): causal: dN~ of the head */
    float *ast;    /* (L, C): causal: per chunk, A'_ij = (q~_i.k~_j) e^(c_j - P_i), j <= i */
    float *bst;    /* (L, C): causal: per chunk, B_ij = (dN~_i.[v_j|1]_w) e^(c_j - P_i), j <= i */
    float *kamax;  /* (Lk): causal: max|k~| before eps, per key */
    float *qamax;  /* (L or nb): max|q~| before eps, per query */
    float *blk;    /* (nb, r): bidirectional: Q~ of a block */
    float *dblk;   /* (nb, r): d loss / d phi~ of a block of rows */
    float *vaug;   /* (nb, dw): weighted [V | 1] rows, or dN~ of a block (bidirectional) */
    float *o;      /* (nb, dw): numerators and denominators of a block of queries */
    float *vs;     /* (C, dv+1): causal: [V | 1] rows weighted for the state */
    float *dnw;    /* (C, dv+1): causal: dN~ rows weighted for the suffix state */
    float *state;  /* (r, dv+1): causal: the prefix state S^T (dv+1, r) */
    float *dstate; /* (r, dv+1): causal: the suffix state R^T (dv+1, r) */
    float *ckpt;   /* (nseg, dv+1, r): causal in segments: the prefix state before each */
    double *kc;    /* (Lk): causal: key log factors */
    double *p;     /* (L): causal: prefix maxima */
    double *cq;    /* (nb): query log factors (unused, they cancel) */
    double *bsc;   /* (nb): scratch of pf_fmap_rows_backward */
    double *ckm;   /* (nseg): references of ckpt */
    void *mem;
} bwd_ws;

static size_t lines(size_t n, size_t size) {
    return (n * size + 63) / 64 * 64;
}

/* C = 0 for bidirectional. Causal: the thread keeps the features of F rows (0 when every
 * head's come from the forward) and the scan's rows of S (a head, or a segment of one), nseg the
 * most segments a head is cut into. Returns 0, or -1 when out of memory. */
static int bwd_ws_alloc(bwd_ws *ws, int F, int S, int nseg, int nb, int C, int r, int dv) {
    const size_t dv1 = (size_t)dv + 1, NB = (size_t)nb, CC = (size_t)C;
    const size_t dw = (size_t)pf_favor_dw(dv);
    const size_t LF = C ? (size_t)F : 0, LL = C ? (size_t)S : 0;
    const size_t NS = nseg > 1 ? (size_t)nseg : 0;
    struct {
        float **p;
        size_t n;
    } fl[] = {{&ws->kst, LF * (size_t)r},
              {&ws->qst, LF * (size_t)r},
              {&ws->dnst, LL * dv1},
              {&ws->ast, LL * CC},
              {&ws->bst, LL * CC},
              {&ws->kamax, LF},
              {&ws->qamax, LF > NB ? LF : NB},
              {&ws->blk, NB * (size_t)r},
              {&ws->dblk, NB * (size_t)r},
              {&ws->vaug, NB * dw},
              {&ws->o, NB * dw},
              {&ws->vs, CC * dv1},
              {&ws->dnw, CC * dv1},
              {&ws->state, (size_t)r * dv1},
              {&ws->dstate, (size_t)r * dv1},
              {&ws->ckpt, NS * (size_t)r * dv1}};
    struct {
        double **p;
        size_t n;
    } db[] = {{&ws->kc, LF}, {&ws->p, LL}, {&ws->cq, NB}, {&ws->bsc, NB}, {&ws->ckm, NS}};
    const size_t nfl = sizeof fl / sizeof fl[0], ndb = sizeof db / sizeof db[0];
    memset(ws, 0, sizeof *ws);
    size_t total = 0;
    for (size_t i = 0; i < nfl + ndb; i++) {
        const size_t sz = i < nfl ? lines(fl[i].n, 4) : lines(db[i - nfl].n, 8);
        if (sz > SIZE_MAX - total) return -1;
        total += sz;
    }
    char *m = pf_alloc(total, 1);
    if (!m) return -1;
    ws->mem = m;
    for (size_t i = 0; i < nfl; i++) {
        *fl[i].p = (float *)m;
        m += lines(fl[i].n, 4);
    }
    for (size_t i = 0; i < ndb; i++) {
        *db[i].p = (double *)m;
        m += lines(db[i].n, 8);
    }
    return 0;
}

typedef struct bwd_head {
    const float *Q, *K, *V, *G; /* (Lq,d), (Lk,d), (Lk,dv), dout (Lq,dv) */
    const float *out;           /* (Lq,dv), the forward's output, or NULL */
    float *dQ, *dK, *dV;        /* (Lq,d), (Lk,d), (Lk,dv) */
    int Lq, Lk, klen, dv;
} bwd_head;

/* From the denominators (column dv of o, row stride ldo) and either the numerators (columns
 * 0..dv-1 of o; out NULL) or the forward's out (n, dv), and G (n, dv): dN~ (n, lddn) with
 * dN~_i = [G_i / D_i | -(G_i.out_i) / D_i | 0 ...] (zeros up to lddn). A zero denominator is
 * PF_EDOMAIN, a non-finite one PF_ENONFINITE; such a row gets dN~ = 0 (it passes no gradient on,
 * and no NaN). PF_ENONFINITE, before any of those, if G or out holds a NaN or Inf: dN~ is then
 * not finite, so G and out are checked through it, while in registers, not read again. */
PF_CLONES static pf_status grad_of_out(float *dn, int lddn, const float *o, int ldo,
                                       const float *out, const float *G, int n, int dv) {
    pf_status st = PF_OK;
    float nan = 0.0f; /* x - x: NaN once any x is not finite */
    for (int i = 0; i < n; i++) {
        const float *row = o + (size_t)i * (size_t)ldo;
        const float *g = G + (size_t)i * (size_t)dv;
        const float *oi = out ? out + (size_t)i * (size_t)dv : NULL;
        float *dst = dn + (size_t)i * (size_t)lddn;
        const float den = row[dv];
        const pf_status bad = pf_favor_den_status(den);
        if (bad != PF_OK) {
            if (pf_nonfinite_f32(g, (size_t)dv) || (oi && pf_nonfinite_f32(oi, (size_t)dv)))
                return PF_ENONFINITE;
            memset(dst, 0, sizeof(float) * (size_t)lddn);
            st = pf_status_worse(st, bad);
            continue;
        }
        const double inv = 1.0 / (double)den;
        const float finv = (float)inv;
        double go = 0; /* G_i . out_i */
        if (oi) {
            float acc = 0;
#pragma omp simd reduction(+ : acc)
            for (int k = 0; k < dv; k++) acc += g[k] * oi[k];
            go = acc;
        } else {
            for (int k = 0; k < dv; k++) go += (double)g[k] * ((double)row[k] * inv);
        }
        float chk = 0.0f;
#pragma omp simd reduction(+ : chk)
        for (int k = 0; k < dv; k++) {
            dst[k] = g[k] * finv;
            chk += dst[k] - dst[k];
        }
        dst[dv] = (float)(-go * inv);
        nan += chk + (dst[dv] - dst[dv]);
        for (int k = dv + 1; k < lddn; k++) dst[k] = 0.0f;
    }
    return nan != nan ? PF_ENONFINITE : st;
}

/* Row i of x (n rows of w floats, stride ld) times e^(ref_i - P_i) where it differs from 1;
 * ref_i = ref[i] if ref is not NULL, else ref0. */
PF_CLONES static void scale_rows(float *x, int ld, int n, int w, const double *ref, double ref0,
                                 const double *P) {
    for (int i = 0; i < n; i++) {
        const double e = (ref ? ref[i] : ref0) - P[i];
        if (e == 0) continue;
        const float f = (float)exp(e);
        float *row = x + (size_t)i * (size_t)ld;
#pragma omp simd
        for (int k = 0; k < w; k++) row[k] *= f;
    }
}

/* Lines of the next chunk's rows, fetched a few at a time between the products of the current
 * one. The causal passes read each chunk's Q~ and K~ (16 KiB each at C = 16, r = 256) from
 * wherever the forward kept them (4 MiB a head at L = 4096: from memory), and the hardware
 * prefetchers, which stop at each 4 KiB page, bring them too late: the first product to read
 * them waited for memory (1-3 us of its 2-7). Fetched all at once at the start of a chunk, the
 * lines gained 2-3%; spread over the chunk's products, 128 lines before each, with the T1 hint
 * (into L2, where the T0 hint's lines evicted the products' operands from L1: 2%), the causal
 * backward ran 5-6% faster on Zen 4 with the AVX2 kernels (107.5 -> 101.5 ms, L = 4096, 8 heads,
 * one thread) and 5% with the AVX-512 ones. Prefetches change no result. */
enum { AHEAD_SPANS = 8, AHEAD_LINES = 128 };
typedef struct ahead {
    const char *p[AHEAD_SPANS];
    size_t left[AHEAD_SPANS]; /* bytes */
    int n;
} ahead;

/* Up to lines more lines of the queue fetched, the latest span first. */
static void ahead_go(ahead *a, int lines) {
    while (lines > 0 && a->n > 0) {
        const int t = a->n - 1;
        __builtin_prefetch(a->p[t], 0, 2);
        a->p[t] += 64;
        lines--;
        if (a->left[t] <= 64)
            a->n--;
        else
            a->left[t] -= 64;
    }
}

/* n rows of w floats from row row0 of x (stride w) queued (x NULL or n <= 0: nothing). */
static void ahead_rows(ahead *a, const float *x, size_t w, long row0, long n) {
    if (!x || n <= 0 || w == 0) return;
    if (a->n == AHEAD_SPANS) ahead_go(a, INT_MAX); /* (the queue is never this long) */
    a->p[a->n] = (const char *)(x + (size_t)row0 * w);
    a->left[a->n] = sizeof(float) * (size_t)n * w;
    a->n++;
}

/* pf_mm after the next AHEAD_LINES lines of the queue. */
static void mm_ahead(ahead *a, int ta, int tb, int m, int n, int k, float alpha, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    ahead_go(a, AHEAD_LINES);
    pf_mm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* What the causal passes keep for rows base.. of a head: per thread when a head is one unit (all
 * its rows, or one segment of them at a time), per head when its rows are cut into scan blocks
 * (then the passes over the blocks are units). Row i of the head is row i - base here. */
typedef struct causal_store {
    float *qst, *kst;     /* (L, r): Q~, K~ */
    float *dnst;          /* (L, dv+1): dN~ */
    float *ast, *bst;     /* (L, C): per chunk A' and B (see bwd_ws) */
    float *qamax, *kamax; /* (L) */
    double *kc, *p;       /* (L): key log factors, prefix maxima */
    const float *akept;   /* (L, C): the forward's masked scores A, or NULL (recomputed) */
    int base;             /* the head's row that is row 0 here */
} causal_store;

/* Rows [row, row + n) of a head queued: its Q~, and its K~ and V up to the key length. */
static void ahead_chunk(ahead *a, const causal_store *cs, const bwd_head *hd, int r, long row,
                        long n) {
    const long nk = hd->klen - row < n ? hd->klen - row : n, l = row - cs->base;
    ahead_rows(a, cs->qst, (size_t)r, l, n);
    ahead_rows(a, cs->kst, (size_t)r, l, nk);
    ahead_rows(a, hd->V, (size_t)hd->dv, row, nk);
}

/* ---- bidirectional ------------------------------------------------------------------------ */

typedef struct bwd_job {
    const pf_shape *s;
    const pf_attn_opts *opts;
    const pf_favor_opts *favor;
    const float *Q, *K, *V, *G, *out;
    float *dQ, *dK, *dV;
    int r, dw, C;
    int nkb, kbl, nqb, qbl; /* key and query blocks per head, their lengths */
    int g0;                 /* the group's first head */
    int nsb, sbl;           /* causal: scan blocks per head, their length */
    int seg, segk;          /* causal with nsb == 1: rows per segment of a head (bwd_causal_unit)
                               whose features are made here, kept by the forward */
    causal_store cs;        /* causal with nsb > 1: the rows of the head being processed */
    float *ls, *rs;     /* (nsb, dv+1, r): local, then starting prefix and ending suffix states */
    double *lm;         /* (nsb): references of ls */
    int *cst;           /* (nsb): statuses of the scan units */
    pf_fmap *fm;        /* (heads) */
    pf_kernel_ws *kw;   /* (heads; only [0] when one map serves every head) */
    pf_favor_maps maps; /* one map for every head, or none (pf_favor_maps_init) */
    int *hst;           /* (heads): the head's status */
    int *dead;          /* (heads): 1 once a failure leaves the head without gradients */
    int *kst, *qst;     /* (heads, nkb), (heads, nqb): unit statuses */
    /* the group's storage, per head of the group: */
    float *kf;                /* (Lk, r): K~ */
    double *kc;               /* (Lk): key log factors */
    float *kamax;             /* (Lk) */
    float *part;              /* (nkb, r, dw): partial KV~; slot 0 the total */
    double *pmax;             /* (nkb) */
    float *dpart;             /* (nqb, dv+1, r): partial dKV~^T; slot 0 the total */
    const pf_favor_saved *sv; /* the forward's features and KV~, or NULL (recomputed) */
    const pf_favor_ext *ext;  /* a slice's states from outside, or NULL */
    int dstate;               /* a slice's d/dS alone (ext->dS): no dQ, dK, dV */
} bwd_job;

static size_t hoff(int bh, int L, int w) {
    return (size_t)bh * (size_t)L * (size_t)w;
}

/* The group slot of head bh: index (bh - g0) into the group's storage. */
static size_t gslot(const bwd_job *j, int bh) {
    return (size_t)(bh - j->g0);
}

/* 1 if the forward kept head bh's features. */
static int kept(const bwd_job *j, int bh) {
    return j->sv && bh < j->sv->nkeep;
}

/* Head bh's key rows from row 0 (the forward's, or those made here): K~ (Lk, r), log factors,
 * maxima; its KV~ and reference. */
static const float *head_kf(const bwd_job *j, int bh) {
    const size_t Lk = (size_t)j->s->Lk, r = (size_t)j->r;
    return kept(j, bh) ? j->sv->kf + (size_t)bh * Lk * r : j->kf + gslot(j, bh) * Lk * r;
}

static const double *head_kc(const bwd_job *j, int bh) {
    const size_t Lk = (size_t)j->s->Lk;
    return kept(j, bh) ? j->sv->kc + (size_t)bh * Lk : j->kc + gslot(j, bh) * Lk;
}

static const float *head_kamax(const bwd_job *j, int bh) {
    const size_t Lk = (size_t)j->s->Lk;
    return kept(j, bh) ? j->sv->kamax + (size_t)bh * Lk : j->kamax + gslot(j, bh) * Lk;
}

static const float *head_kv(const bwd_job *j, int bh) {
    const size_t nkv = (size_t)j->r * (size_t)j->dw;
    return kept(j, bh) ? j->sv->kv + (size_t)bh * nkv
                       : j->part + gslot(j, bh) * (size_t)j->nkb * nkv;
}

static double head_kvm(const bwd_job *j, int bh) {
    return kept(j, bh) ? j->sv->kvm[bh] : j->pmax[gslot(j, bh) * (size_t)j->nkb];
}

/* Phase 1: keys of block kb: K~ kept, partial KV~. */
static pf_status bidir_keys(bwd_job *j, pf_favor_ws *fws, int bh, int kb) {
    const pf_shape *s = j->s;
    const int klen = pf_attn_key_len(j->opts, bh / s->H, s->Lk);
    const int j0 = kb * j->kbl;
    int n = klen - j0;
    n = n > j->kbl ? j->kbl : n;
    const size_t g = gslot(j, bh), nkv = (size_t)j->r * (size_t)j->dw;
    float *KVb = j->part + (g * (size_t)j->nkb + (size_t)kb) * nkv;
    double *Mb = j->pmax + g * (size_t)j->nkb + (size_t)kb;
    const size_t Lk = (size_t)s->Lk;
    if (n > 0 && j->ext) {
        /* a slice: KV~ is the total from outside; only K~ is made here */
        const float *Kb = j->K + hoff(bh, s->Lk, s->d) + (size_t)j0 * (size_t)s->d;
        const float *Vb = j->V + hoff(bh, s->Lk, s->dv) + (size_t)j0 * (size_t)s->dv;
        if (pf_nonfinite_f32(Vb, (size_t)n * (size_t)s->dv)) return PF_ENONFINITE;
        for (int b0 = 0; b0 < n; b0 += BWD_BLOCK) {
            const int nb = n - b0 < BWD_BLOCK ? n - b0 : BWD_BLOCK;
            const size_t row = g * Lk + (size_t)(j0 + b0);
            pf_status st = pf_fmap_rows(&j->fm[bh], j->kf + row * (size_t)j->r, j->r, j->kc + row,
                                        j->kamax + row, Kb + (size_t)b0 * (size_t)s->d, nb);
            if (st != PF_OK) return st;
        }
        return PF_OK;
    }
    if (j->ext) return PF_OK; /* (slot 0 holds the given total) */
    *Mb = -INFINITY;
    if (n <= 0) return PF_OK;
    return pf_favor_key_block(
        &j->fm[bh], fws, KVb, Mb, j->K + hoff(bh, s->Lk, s->d) + (size_t)j0 * (size_t)s->d,
        j->V + hoff(bh, s->Lk, s->dv) + (size_t)j0 * (size_t)s->dv, n, s->dv,
        j->kf + (g * Lk + (size_t)j0) * (size_t)j->r, j->kc + g * Lk + j0, j->kamax + g * Lk + j0);
}

/* Phase 2: KV~ of the head in slot 0, in block order. */
static void bidir_combine_kv(bwd_job *j, int bh) {
    const size_t g = gslot(j, bh), nkv = (size_t)j->r * (size_t)j->dw;
    float *P = j->part + g * (size_t)j->nkb * nkv;
    double *M = j->pmax + g * (size_t)j->nkb;
    for (int kb = 1; kb < j->nkb; kb++)
        pf_favor_combine(P, &M[0], P + (size_t)kb * nkv, M[kb], nkv);
}

/* Phase 3: queries of block qb: dN~, dQ, partial dKV~^T = dN~^T Q~ (turned round, so that the
 * ones column is one more row of the register tiles: the same products in the same order, so
 * the same bits as Q~^T dN~). */
static pf_status bidir_queries(bwd_job *j, bwd_ws *ws, int bh, int qb) {
    const pf_shape *s = j->s;
    const pf_fmap *fm = &j->fm[bh];
    const int r = j->r, d = s->d, dv = s->dv, dw = j->dw;
    const size_t g = gslot(j, bh), nkv = (size_t)r * (size_t)dw;
    const float *KV = head_kv(j, bh), *KVt = ws->state; /* KV^T, (dv + 1, r) */
    pf_transpose(ws->state, KV, r, dv + 1, dw);
    float *dKVt = j->dpart + (g * (size_t)j->nqb + (size_t)qb) * nkv;
    /* a slice makes dQ, or (dstate) only its part of dKV~, whose total comes from outside */
    const int want_dq = !j->dstate, want_dkv = !(j->ext && !j->dstate);
    const int i0 = qb * j->qbl, L = s->Lq - i0 < j->qbl ? s->Lq - i0 : j->qbl;
    pf_status st = PF_OK;
    if (want_dkv) memset(dKVt, 0, sizeof(float) * nkv); /* (the slot's tail never written) */
    for (int b0 = 0; b0 < L; b0 += BWD_BLOCK) {
        const int nb = L - b0 < BWD_BLOCK ? L - b0 : BWD_BLOCK;
        const size_t row = (size_t)(i0 + b0);
        const float *Qb = j->Q + hoff(bh, s->Lq, d) + row * (size_t)d;
        const float *Gb = j->G + hoff(bh, s->Lq, dv) + row * (size_t)dv;
        const float *ob = j->out ? j->out + hoff(bh, s->Lq, dv) + row * (size_t)dv : NULL;
        /* Q~ of the block: the forward's, or made again */
        const float *Qf = ws->blk, *qamax = ws->qamax;
        if (kept(j, bh)) {
            const size_t o = (size_t)bh * (size_t)s->Lq + row;
            Qf = j->sv->qf + o * (size_t)r;
            qamax = j->sv->qamax + o;
        } else {
            pf_status s1 = pf_fmap_rows(fm, ws->blk, r, ws->cq, ws->qamax, Qb, nb);
            if (s1 != PF_OK) return s1;
        }
        /* D = Q~ z (and, without the forward's out, the numerators Q~ KV~[:, :dv]) */
        if (ob)
            pf_mm(0, 1, nb, 1, r, 1.0f, Qf, r, KVt + (size_t)dv * (size_t)r, r, 0.0f, ws->o + dv,
                  dw);
        else
            pf_mm(0, 0, nb, dv + 1, r, 1.0f, Qf, r, KV, dw, 0.0f, ws->o, dw);
        float *dN = ws->vaug;
        const pf_status sg = grad_of_out(dN, dw, ws->o, dw, ob, Gb, nb, dv);
        if (sg == PF_ENONFINITE) return sg; /* (dout or out not finite) */
        st = pf_status_worse(st, sg);
        /* dKV~^T += dN~^T Q~ */
        if (want_dkv) pf_mm(1, 0, dv + 1, r, nb, 1.0f, dN, dw, Qf, r, b0 ? 1.0f : 0.0f, dKVt, r);
        if (!want_dq) continue;
        /* dQ~ = dN~ KV~^T (the dv + 1 columns that matter) */
        pf_mm(0, 0, nb, r, dv + 1, 1.0f, dN, dw, KVt, r, 0.0f, ws->dblk, r);
        /* (gradients are checked block by block, while in cache) */
        if (pf_fmap_rows_backward(fm, j->dQ + hoff(bh, s->Lq, d) + row * (size_t)d, ws->dblk, r, Qf,
                                  r, qamax, Qb, nb, ws->bsc))
            return PF_ENONFINITE;
    }
    return st;
}

/* Phase 4: dKV~^T of the head in slot 0, summed in block order. */
static void bidir_combine_dkv(bwd_job *j, int bh) {
    const size_t g = gslot(j, bh), nkv = (size_t)j->r * (size_t)j->dw;
    float *P = j->dpart + g * (size_t)j->nqb * nkv;
    for (int qb = 1; qb < j->nqb; qb++) {
        const float *Pb = P + (size_t)qb * nkv;
        for (size_t i = 0; i < nkv; i++) P[i] += Pb[i];
    }
}

/* Phase 5: keys of block kb again: dK^ = [V|1]_w dKV~^T, dV = w K~ dKV~[:, :dv], dK. */
static pf_status bidir_keys_again(bwd_job *j, bwd_ws *ws, int bh, int kb) {
    const pf_shape *s = j->s;
    const pf_fmap *fm = &j->fm[bh];
    const int r = j->r, d = s->d, dv = s->dv, dw = j->dw;
    const int klen = pf_attn_key_len(j->opts, bh / s->H, s->Lk);
    const int j0 = kb * j->kbl;
    int n = klen - j0;
    n = n > j->kbl ? j->kbl : n;
    const size_t g = gslot(j, bh), nkv = (size_t)r * (size_t)dw;
    const float *dKVt = j->dpart + g * (size_t)j->nqb * nkv; /* (dv + 1, r) */
    float *dKV = ws->state;                                  /* its first dv rows turned: (r, dv) */
    pf_transpose(dKV, dKVt, dv, r, r);
    const double M = head_kvm(j, bh);
    for (int b0 = 0; b0 < n; b0 += BWD_BLOCK) {
        const int nb = n - b0 < BWD_BLOCK ? n - b0 : BWD_BLOCK;
        const size_t row = (size_t)(j0 + b0);
        const float *Kb = head_kf(j, bh) + row * (size_t)r;
        const double *c = head_kc(j, bh) + row;
        float *dVb = j->dV + hoff(bh, s->Lk, dv) + row * (size_t)dv;
        pf_favor_weighted_values(ws->vaug, dw, j->V + hoff(bh, s->Lk, dv) + row * (size_t)dv, dv, c,
                                 NULL, M, nb);
        /* dK~ = [V|1]_w dKV~^T: dk^_j = R [v_j|1], the key rows weighted by e^(c_j - M) */
        pf_mm(0, 0, nb, r, dv + 1, 1.0f, ws->vaug, dw, dKVt, r, 0.0f, ws->dblk, r);
        /* dV = K~ dKV~[:, :dv]: dv_j = sum_i (q~_i.k^_j) dn_i, before the weights e^(c_j - M) below
         */
        pf_mm(0, 0, nb, dv, r, 1.0f, Kb, r, dKV, dv, 0.0f, dVb, dv);
        for (int i = 0; i < nb; i++) {
            const float w = ws->vaug[(size_t)i * (size_t)dw + (size_t)dv];
            float *dvr = dVb + (size_t)i * (size_t)dv;
#pragma omp simd
            for (int k = 0; k < dv; k++) dvr[k] *= w;
        }
        if (pf_fmap_rows_backward(fm, j->dK + hoff(bh, s->Lk, d) + row * (size_t)d, ws->dblk, r, Kb,
                                  r, head_kamax(j, bh) + row,
                                  j->K + hoff(bh, s->Lk, d) + row * (size_t)d, nb, ws->bsc) ||
            pf_nonfinite_f32(dVb, (size_t)nb * (size_t)dv))
            return PF_ENONFINITE;
    }
    return PF_OK;
}

/* ---- causal ------------------------------------------------------------------------------- */

/* Pass 1 over rows [r0, r1) (r0 a multiple of the feature block): Q~ and the valid K~ into cs
 * (unless kept: cs holds the forward's); if LT is not NULL, the rows' local state
 * LT (dv+1, r) = sum_j [v_j|1] e^(c_j - *Ml) k~_j^T, *Ml = max_j c_j (-inf: no valid key). */
static pf_status causal_features(const pf_fmap *fm, const bwd_head *hd, const causal_store *cs,
                                 bwd_ws *ws, int C, int r0, int r1, int kept, float *LT,
                                 double *Ml) {
    const int r = fm->r, d = fm->d, dv = hd->dv, dv1 = dv + 1, NB = pf_favor_block(1, C);
    double M = -INFINITY;
    for (int b0 = r0; b0 < r1; b0 += NB) {
        const int nb = r1 - b0 < NB ? r1 - b0 : NB, lb = b0 - cs->base;
        int nkb = hd->klen - b0;
        nkb = nkb < 0 ? 0 : (nkb > nb ? nb : nkb);
        if (pf_nonfinite_f32(hd->V + (size_t)b0 * (size_t)dv, (size_t)nkb * (size_t)dv) ||
            pf_nonfinite_f32(hd->G + (size_t)b0 * (size_t)dv, (size_t)nb * (size_t)dv) ||
            (hd->out &&
             pf_nonfinite_f32(hd->out + (size_t)b0 * (size_t)dv, (size_t)nb * (size_t)dv)))
            return PF_ENONFINITE;
        pf_status s1 = PF_OK;
        if (!kept)
            s1 = pf_fmap_rows(fm, cs->qst + (size_t)lb * (size_t)r, r, ws->cq, cs->qamax + lb,
                              hd->Q + (size_t)b0 * (size_t)d, nb);
        if (s1 == PF_OK && nkb > 0 && !kept)
            s1 = pf_fmap_rows(fm, cs->kst + (size_t)lb * (size_t)r, r, cs->kc + lb, cs->kamax + lb,
                              hd->K + (size_t)b0 * (size_t)d, nkb);
        if (s1 != PF_OK) return s1;
        if (LT && nkb > 0) {
            const double *c = cs->kc + lb;
            const float beta = pf_favor_rebase(&M, c, nkb);
            pf_favor_weighted_values(ws->vaug, dv1, hd->V + (size_t)b0 * (size_t)dv, dv, c, NULL, M,
                                     nkb);
            /* L^T = beta L^T + [V|1]_w^T K~: the block's keys into its local state, rebased to M */
            pf_mm(1, 0, dv1, r, nkb, 1.0f, ws->vaug, dv1, cs->kst + (size_t)lb * (size_t)r, r, beta,
                  LT, r);
        }
    }
    if (Ml) *Ml = M;
    return PF_OK;
}

/* Pass 2 over rows [r0, r1): the forward scan from the state ST0 (dv+1, r) referenced to M0
 * (-inf: empty), with cs holding the rows' features: dN~, A', B and P kept in cs, dQ of the
 * rows written if dq (else only what the reverse scan needs is made); if RTl is not NULL, the
 * rows' local suffix sum RTl (dv+1, r) = sum_i e^(M0 - P_i) dN~_i q~_i^T. The state after the
 * rows is left in ws->state, referenced to P at the last row. */
static pf_status causal_forward(const pf_fmap *fm, const bwd_head *hd, const causal_store *cs,
                                bwd_ws *ws, int C, int r0, int r1, const float *ST0, double M0,
                                float *RTl, int dq) {
    const int r = fm->r, d = fm->d, dv = hd->dv, dv1 = dv + 1;
    const int NB = pf_favor_block(1, C);
    /* the states are kept transposed, (dv+1, r), and the chunks' products run in pf_mm, as
     * the forward's do (the same bits for the scores A, kept or made again): with S as
     * (r, dv+1), dN~ S^T would be a product of dot products only dv+1 long */
    float *ST = ws->state, *O = ws->o;
    double M = M0;
    if (M0 > -INFINITY && ST0 != ST) memcpy(ST, ST0, sizeof(float) * (size_t)r * (size_t)dv1);
    pf_status st = PF_OK;
    ahead ah = {.n = 0};
    /* P, out (or D), dN~ (kept), dQ~ and dQ; A' and B kept per chunk */
    for (int b0 = r0; b0 < r1; b0 += NB) {
        const int nb = r1 - b0 < NB ? r1 - b0 : NB, lb = b0 - cs->base;
        const float *Qx = hd->Q + (size_t)b0 * (size_t)d;
        const float *Qb = cs->qst + (size_t)lb * (size_t)r;

        for (int t0 = b0; t0 < b0 + nb; t0 += C) {
            const int n = b0 + nb - t0 < C ? b0 + nb - t0 : C, lt = t0 - cs->base;
            int nk = hd->klen - t0;
            nk = nk < 0 ? 0 : (nk > n ? n : nk);
            const float *Qc = cs->qst + (size_t)lt * (size_t)r;
            const float *Kc = cs->kst + (size_t)lt * (size_t)r;
            const float *Vc = hd->V + (size_t)t0 * (size_t)dv;
            const double *ck = cs->kc + lt;
            double *P = cs->p + lt;
            float *A = cs->ast + (size_t)lt * (size_t)C, *Bm = cs->bst + (size_t)lt * (size_t)C;
            float *dN = cs->dnst + (size_t)lt * (size_t)dv1;
            float *dQc = ws->dblk + (size_t)(t0 - b0) * (size_t)r;
            {
                /* the next chunk's rows, fetched during this one's products */
                const long nx = t0 + n, nn = r1 - nx < C ? r1 - nx : C;
                ahead_chunk(&ah, cs, hd, r, nx, nn);
                ahead_rows(&ah, cs->akept, (size_t)C, nx - cs->base, nn);
                ahead_rows(&ah, hd->G, (size_t)dv, nx, nn);
                ahead_rows(&ah, hd->out, (size_t)dv, nx, nn);
            }
            const int have_state = M > -INFINITY;
            double run = M;
            for (int j = 0; j < n; j++) {
                if (j < nk && ck[j] > run) run = ck[j];
                P[j] = run;
            }
            /* out: O = e^(M - P) Q~ S + A [V|1]_w, A masked, [V|1]_w = e^(c_j - P_j) [v_j|1];
             * with the forward's out only its last column, the denominators D */
            const int w = hd->out ? 1 : dv1, c0 = hd->out ? dv : 0;
            if (have_state) {
                if (hd->out)
                    /* inter-chunk D_i = q~_i.z, z = S^T[dv] (the forward's out given: denominators
                     * alone) */
                    mm_ahead(&ah, 0, 1, n, 1, r, 1.0f, Qc, r, ST + (size_t)dv * (size_t)r, r, 0.0f,
                             O + dv, dv1);
                else
                    /* inter-chunk [n_i | D_i] = q~_i S; both then times e^(M - P_i) */
                    mm_ahead(&ah, 0, 1, n, dv1, r, 1.0f, Qc, r, ST, r, 0.0f, O, dv1);
                scale_rows(O + c0, dv1, n, w, NULL, M, P);
            }
            if (nk > 0) {
                if (cs->akept) {
                    for (int i = 0; i < n; i++)
                        memcpy(A + (size_t)i * (size_t)C, cs->akept + (size_t)(lt + i) * (size_t)C,
                               sizeof(float) * (size_t)nk);
                } else {
                    /* intra-chunk A = Q~ K~^T, then masked (j <= i) and scaled by e^(P_j - P_i) */
                    mm_ahead(&ah, 0, 1, n, nk, r, 1.0f, Qc, r, Kc, r, 0.0f, A, C);
                    pf_favor_chunk_mask(A, C, P, n, nk);
                }
                pf_favor_weighted_values(ws->vs, dv + 1, Vc, dv, ck, P, 0.0, nk);
                if (hd->out) /* intra-chunk D += A [1]_w, the key weights e^(c_j - P_j) */
                    mm_ahead(&ah, 0, 0, n, 1, nk, 1.0f, A, C, ws->vs + dv, dv1,
                             have_state ? 1.0f : 0.0f, O + dv, dv1);
                else
                    /* intra-chunk [n | D] += A [V|1]_w */
                    mm_ahead(&ah, 0, 0, n, dv1, nk, 1.0f, A, C, ws->vs, dv1,
                             have_state ? 1.0f : 0.0f, O, dv1);
            }
            st = pf_status_worse(st, grad_of_out(dN, dv1, O, dv1,
                                                 hd->out ? hd->out + (size_t)t0 * (size_t)dv : NULL,
                                                 hd->G + (size_t)t0 * (size_t)dv, n, dv));
            /* dQ~ = e^(M - P) dN~ S^T + B K~, B_ij = (dN~_i.[v_j|1]_w) e^(P_j - P_i) masked */
            if (have_state && dq) {
                /* inter-chunk dQ~ = dN~ S^T, then times e^(M - P_i) */
                mm_ahead(&ah, 0, 0, n, r, dv1, 1.0f, dN, dv1, ST, r, 0.0f, dQc, r);
                scale_rows(dQc, r, n, r, NULL, M, P);
            }
            if (nk > 0) {
                /* B = dN~ [V|1]_w^T, then masked and scaled like A */
                mm_ahead(&ah, 0, 1, n, nk, dv1, 1.0f, dN, dv1, ws->vs, dv1, 0.0f, Bm, C);
                pf_favor_chunk_mask(Bm, C, P, n, nk);
                /* intra-chunk dQ~ += B K~: dq~_i += sum_{j <= i} B_ij k~_j */
                if (dq)
                    mm_ahead(&ah, 0, 0, n, r, nk, 1.0f, Bm, C, Kc, r, have_state ? 1.0f : 0.0f, dQc,
                             r);
                /* keep A' = A diag(e^(c_j - P_j)) for dV in the reverse scan */
                for (int i = 0; i < n; i++) {
                    float *row = A + (size_t)i * (size_t)C;
                    for (int j = 0; j < nk; j++) row[j] *= ws->vs[(size_t)j * (size_t)dv1 + dv];
                }
                /* S = e^(M - M') S + K~^T [V|1] e^(c - M'), M' = P_last */
                const double Mn = P[n - 1];
                const float beta = have_state ? (float)exp(M - Mn) : 0.0f;
                pf_favor_weighted_values(ws->vs, dv + 1, Vc, dv, ck, NULL, Mn, nk);
                /* S^T = beta S^T + [V|1]_w^T K~: the chunk's keys into the prefix state, rebased to
                 * P_last */
                mm_ahead(&ah, 1, 0, dv1, r, nk, 1.0f, ws->vs, dv1, Kc, r, beta, ST, r);
                M = Mn;
            }
        }
        if (RTl) {
            /* RTl += (e^(M0 - P_i) dN~_i)^T Q~, the block's rows at once */
            float *dnw = ws->vaug;
            for (int i = 0; i < nb; i++) {
                const float f = (float)exp(M0 - cs->p[lb + i]);
                const float *src = cs->dnst + (size_t)(lb + i) * (size_t)dv1;
                float *dst = dnw + (size_t)i * (size_t)dv1;
                for (int k = 0; k < dv1; k++) dst[k] = f * src[k];
            }
            mm_ahead(&ah, 1, 0, dv1, r, nb, 1.0f, dnw, dv1, Qb, r, b0 > r0 ? 1.0f : 0.0f, RTl, r);
        }
        if (dq && pf_fmap_rows_backward(fm, hd->dQ + (size_t)b0 * (size_t)d, ws->dblk, r,
                                        cs->qst + (size_t)lb * (size_t)r, r, cs->qamax + lb, Qx, nb,
                                        ws->bsc))
            return PF_ENONFINITE;
    }
    return st;
}

/* Pass 3 over rows [r0, r1): the reverse scan from the suffix state RT0 (dv+1, r) of the rows
 * after r1, referenced to P[r1 - 1] (NULL: no rows after): dK and dV of the rows. With fold,
 * the rows' first chunk is added to the state too, which is then left in ws->dstate as the
 * suffix state of the rows from r0 on, referenced to Mprev = P[r0 - 1]. */
static pf_status causal_reverse(const pf_fmap *fm, const bwd_head *hd, const causal_store *cs,
                                bwd_ws *ws, int C, int r0, int r1, const float *RT0, int fold,
                                double Mprev) {
    const int r = fm->r, d = fm->d, dv = hd->dv, dv1 = dv + 1;
    const int NB = pf_favor_block(1, C);
    float *RT = ws->dstate;

    /* reverse scan: R = sum_{i after chunk c} e^(M_c - P_i) q~_i dN~_i^T, M_c = P at the end of
     * chunk c; dK~_c = [V|1]_(M_c) R^T + B^T Q~_c, dV_c = e^(c - M_c) K~_c R_v + A'^T dN_c */
    int have_r = RT0 != NULL;
    ahead ah = {.n = 0};
    if (RT0 && RT0 != RT) memcpy(RT, RT0, sizeof(float) * (size_t)r * (size_t)dv1);
    const int nblocks = (r1 - r0 + NB - 1) / NB;
    for (int bi = nblocks - 1; bi >= 0; bi--) {
        const int b0 = r0 + bi * NB, nb = r1 - b0 < NB ? r1 - b0 : NB, lb = b0 - cs->base;
        int nkb = hd->klen - b0;
        nkb = nkb < 0 ? 0 : (nkb > nb ? nb : nkb);
        const int nchunks = (nb + C - 1) / C;
        for (int ci = nchunks - 1; ci >= 0; ci--) {
            const int t0 = b0 + ci * C, n = b0 + nb - t0 < C ? b0 + nb - t0 : C;
            const int lt = t0 - cs->base;
            int nk = hd->klen - t0;
            nk = nk < 0 ? 0 : (nk > n ? n : nk);
            const float *Qc = cs->qst + (size_t)lt * (size_t)r;
            const float *Kc = cs->kst + (size_t)lt * (size_t)r;
            const float *Vc = hd->V + (size_t)t0 * (size_t)dv;
            const double *ck = cs->kc + lt, *P = cs->p + lt;
            const float *A = cs->ast + (size_t)lt * (size_t)C;
            const float *Bm = cs->bst + (size_t)lt * (size_t)C;
            const float *dN = cs->dnst + (size_t)lt * (size_t)dv1;
            const double Mc = P[n - 1];
            {
                /* the previous chunk's rows, fetched during this one's products */
                const long np = t0 - r0 < C ? t0 - r0 : C, px = t0 - np, lx = px - cs->base;
                ahead_chunk(&ah, cs, hd, r, px, np);
                ahead_rows(&ah, cs->ast, (size_t)C, lx, np);
                ahead_rows(&ah, cs->bst, (size_t)C, lx, np);
                ahead_rows(&ah, cs->dnst, (size_t)dv1, lx, np);
            }
            if (nk > 0) {
                float *dKc = ws->dblk + (size_t)(t0 - b0) * (size_t)r;
                float *dVc = hd->dV + (size_t)t0 * (size_t)dv;
                if (have_r) {
                    pf_favor_weighted_values(ws->vs, dv + 1, Vc, dv, ck, NULL, Mc, nk);
                    /* dK~_c = [V|1]_w R^T: dk^_j = R_j [v_j|1] from the queries of later chunks */
                    mm_ahead(&ah, 0, 0, nk, r, dv1, 1.0f, ws->vs, dv1, RT, r, 0.0f, dKc, r);
                    /* dV_c = K~_c R[:, :dv]^T: dv_j = sum_{i later} (q~_i.k^_j) dn_i, weighted
                     * below */
                    mm_ahead(&ah, 0, 1, nk, dv, r, 1.0f, Kc, r, RT, r, 0.0f, dVc, dv);
                    for (int j = 0; j < nk; j++) {
                        const float w = ws->vs[(size_t)j * (size_t)dv1 + dv];
                        for (int k = 0; k < dv; k++) dVc[(size_t)j * (size_t)dv + k] *= w;
                    }
                }
                /* dK~_c += B^T Q~_c: dk^_j += sum_{i >= j in the chunk} B_ij q~_i */
                mm_ahead(&ah, 1, 0, nk, r, n, 1.0f, Bm, C, Qc, r, have_r ? 1.0f : 0.0f, dKc, r);
                /* dV_c += A'^T dN~[:, :dv]: dv_j += sum_{i >= j in the chunk} A'_ij dn_i */
                mm_ahead(&ah, 1, 0, nk, dv, n, 1.0f, A, C, dN, dv1, have_r ? 1.0f : 0.0f, dVc, dv);
            }
            if (t0 > r0 || fold) {
                /* R := e^(M_{c-1} - M_c) R + Q~_c^T (e^(M_{c-1} - P_i) dN~_i) (not needed
                 * before the rows' first chunk unless folded: the rows before get their R
                 * otherwise) */
                const double Mp = t0 > r0 ? cs->p[lt - 1] : Mprev;
                for (int i = 0; i < n; i++) {
                    const float f = (float)exp(Mp - P[i]);
                    const float *src = dN + (size_t)i * (size_t)dv1;
                    float *dst = ws->dnw + (size_t)i * (size_t)dv1;
                    for (int k = 0; k < dv1; k++) dst[k] = f * src[k];
                }
                const float beta = have_r ? (float)exp(Mp - Mc) : 0.0f;
                /* R^T = beta R^T + dN~_w^T Q~_c: the chunk's queries into the suffix state, rebased
                 * to M_c */
                mm_ahead(&ah, 1, 0, dv1, r, n, 1.0f, ws->dnw, dv1, Qc, r, beta, RT, r);
                have_r = 1;
            }
        }
        if (nkb > 0 &&
            (pf_fmap_rows_backward(fm, hd->dK + (size_t)b0 * (size_t)d, ws->dblk, r,
                                   cs->kst + (size_t)lb * (size_t)r, r, cs->kamax + lb,
                                   hd->K + (size_t)b0 * (size_t)d, nkb, ws->bsc) ||
             pf_nonfinite_f32(hd->dV + (size_t)b0 * (size_t)dv, (size_t)nkb * (size_t)dv)))
            return PF_ENONFINITE;
    }
    return PF_OK;
}

/* ---- the driver --------------------------------------------------------------------------- */

/* (r, dv+1) rows src into (r, dw) rows dst, zeros after column dv. */
static void widen(float *dst, const float *src, int r, int dv, int dw) {
    const size_t dv1 = (size_t)dv + 1;
    for (size_t f = 0; f < (size_t)r; f++) {
        memcpy(dst + f * (size_t)dw, src + f * dv1, sizeof(float) * dv1);
        memset(dst + f * (size_t)dw + dv1, 0, sizeof(float) * ((size_t)dw - dv1));
    }
}

/* (r, dv+1) src transposed into (dv+1, r) dst. */
static void to_t(float *dst, const float *src, int r, int dv) {
    const size_t dv1 = (size_t)dv + 1;
    for (size_t f = 0; f < (size_t)r; f++)
        for (size_t k = 0; k < dv1; k++) dst[k * (size_t)r + f] = src[f * dv1 + k];
}

/* A bidirectional slice: head bh's total KV~ (and, unless dstate, its total dKV~) from outside
 * into slot 0 of the group's storage. */
static void ext_bidir_in(bwd_job *j, int bh) {
    const size_t g = gslot(j, bh), nkv = (size_t)j->r * (size_t)j->dw;
    const size_t n = (size_t)j->r * ((size_t)j->s->dv + 1);
    const double M = j->ext->M[bh];
    j->pmax[g * (size_t)j->nkb] = M;
    if (M == -INFINITY)
        memset(j->part + g * (size_t)j->nkb * nkv, 0, sizeof(float) * nkv);
    else
        widen(j->part + g * (size_t)j->nkb * nkv, j->ext->S + (size_t)bh * n, j->r, j->s->dv,
              j->dw);
    if (!j->dstate)
        to_t(j->dpart + g * (size_t)j->nqb * nkv, j->ext->R + (size_t)bh * n, j->r, j->s->dv);
}

/* A slice's d/dS of head bh out, (r, dv+1) rows: from the bidirectional total in slot 0 of
 * dpart, or zeros when the head failed. */
static void ext_dstate_out(bwd_job *j, int bh, int dead) {
    const size_t n = (size_t)j->r * ((size_t)j->s->dv + 1), dv1 = (size_t)j->s->dv + 1;
    float *dS = j->ext->dS + (size_t)bh * n;
    if (dead || j->opts->causal) {
        if (dead) memset(dS, 0, sizeof(float) * n);
        return;
    }
    const float *P = j->dpart + gslot(j, bh) * (size_t)j->nqb * (size_t)j->r * (size_t)j->dw;
    for (size_t f = 0; f < (size_t)j->r; f++)
        for (size_t k = 0; k < dv1; k++) dS[f * dv1 + k] = P[k * (size_t)j->r + f];
}

/* Phase 0 of a head: its map (OPRF/SDERF parameters), the padded keys (checked; zero
 * gradients). */
static pf_status bwd_head_setup(bwd_job *j, int bh) {
    const pf_shape *s = j->s;
    const int b = bh / s->H;
    const int klen = pf_attn_key_len(j->opts, b, s->Lk);
    const size_t kl = (size_t)klen, pad = (size_t)(s->Lk - klen);
    const float *Kh = j->K + hoff(bh, s->Lk, s->d), *Vh = j->V + hoff(bh, s->Lk, s->dv);
    if (j->dK) {
        memset(j->dK + hoff(bh, s->Lk, s->d) + kl * (size_t)s->d, 0,
               sizeof(float) * pad * (size_t)s->d);
        memset(j->dV + hoff(bh, s->Lk, s->dv) + kl * (size_t)s->dv, 0,
               sizeof(float) * pad * (size_t)s->dv);
    }
    if (pf_nonfinite_f32(Kh + kl * (size_t)s->d, pad * (size_t)s->d) ||
        pf_nonfinite_f32(Vh + kl * (size_t)s->dv, pad * (size_t)s->dv))
        return PF_ENONFINITE;
    if (j->ext && !j->opts->causal) ext_bidir_in(j, bh);
    return pf_favor_maps_head(&j->maps, &j->fm[bh], &j->kw[bh], bh, s, j->opts, j->favor,
                              j->ext ? j->ext->sums : NULL, j->Q + hoff(bh, s->Lq, s->d), Kh, klen);
}

static bwd_head head_of(const bwd_job *j, int bh) {
    const pf_shape *s = j->s;
    bwd_head hd = {
        .Q = j->Q + hoff(bh, s->Lq, s->d),
        .K = j->K + hoff(bh, s->Lk, s->d),
        .V = j->V + hoff(bh, s->Lk, s->dv),
        .G = j->G + hoff(bh, s->Lq, s->dv),
        .out = j->out ? j->out + hoff(bh, s->Lq, s->dv) : NULL,
        .dQ = j->dQ ? j->dQ + hoff(bh, s->Lq, s->d) : NULL,
        .dK = j->dK ? j->dK + hoff(bh, s->Lk, s->d) : NULL,
        .dV = j->dV ? j->dV + hoff(bh, s->Lk, s->dv) : NULL,
        .Lq = s->Lq,
        .Lk = s->Lk,
        .klen = pf_attn_key_len(j->opts, bh / s->H, s->Lk),
        .dv = s->dv,
    };
    return hd;
}

/* A unit's status u into its head's: the worse one; a fatal one (or any failure of the setup)
 * marks the head dead: its remaining units are skipped and its gradients zeroed at the end. */
static void merge(bwd_job *j, int bh, int u) {
    if (u > j->hst[bh]) j->hst[bh] = u;
    if (pf_favor_fatal(u)) j->dead[bh] = 1;
}

/* The forward's features of head bh from row base on into cs (causal: Lq == Lk). */
static void kept_features(const bwd_job *j, int bh, int base, causal_store *cs) {
    const size_t o = (size_t)bh * (size_t)j->s->Lq + (size_t)base, r = (size_t)j->r;
    cs->base = base;
    cs->qst = j->sv->qf + o * r;
    cs->kst = j->sv->kf + o * r;
    cs->qamax = j->sv->qamax + o;
    cs->kamax = j->sv->kamax + o;
    cs->kc = j->sv->kc + o;
    cs->akept = j->sv->ka + o * (size_t)j->sv->C;
}

/* A slice's states from outside (ext), the only places the causal passes look at them: head
 * bh's starting state from earlier slices into dst as (dv+1, r) rows, returning its reference
 * (-inf, dst untouched: none); and its suffix state from later slices into dst, returning 1 (0:
 * none). */
static double slice_state_in(const bwd_job *j, int bh, float *dst) {
    if (!j->ext || !j->ext->S || j->ext->M[bh] == -INFINITY) return -INFINITY;
    to_t(dst, j->ext->S + (size_t)bh * (size_t)j->r * ((size_t)j->s->dv + 1), j->r, j->s->dv);
    return j->ext->M[bh];
}

static int slice_suffix_in(const bwd_job *j, int bh, float *dst) {
    if (!j->ext || !j->ext->R) return 0;
    to_t(dst, j->ext->R + (size_t)bh * (size_t)j->r * ((size_t)j->s->dv + 1), j->r, j->s->dv);
    return 1;
}

/* Causal with nsb > 1, head bh, inside the parallel region: each pass over the scan blocks is a
 * set of units; between passes, in order, the prefix of the blocks' forward states and the
 * suffix of their backward states. */
static void bwd_causal_split(bwd_job *j, bwd_ws *ws, int bh) {
    const bwd_head hd = head_of(j, bh);
    const pf_fmap *fm = &j->fm[bh];
    const int nsb = j->nsb, L = j->s->Lq, r = j->r, dv1 = j->s->dv + 1;
    const size_t n = (size_t)dv1 * (size_t)r;
    const int suffix = j->ext && j->ext->R; /* (slice_suffix_in) */
    causal_store cs = j->cs;
    if (kept(j, bh)) kept_features(j, bh, 0, &cs);
#pragma omp for schedule(dynamic, 1)
    for (int u = 0; u < nsb; u++) {
        const int r0 = u * j->sbl, r1 = r0 + j->sbl < L ? r0 + j->sbl : L;
        const int last = u == nsb - 1;
        j->cst[u] = (int)causal_features(fm, &hd, &cs, ws, j->C, r0, r1, kept(j, bh),
                                         last ? NULL : j->ls + (size_t)(u + 1) * n,
                                         last ? NULL : &j->lm[u + 1]);
    }
#pragma omp single
    {
        for (int u = 0; u < nsb; u++) merge(j, bh, j->cst[u]);
        /* slot u: the state before block u, start(u) = start(u - 1) + local(u - 1); slot 0
         * empty, or a slice's starting state */
        j->lm[0] = slice_state_in(j, bh, j->ls);
        for (int u = 1; u < nsb; u++)
            pf_favor_combine(j->ls + (size_t)u * n, &j->lm[u], j->ls + (size_t)(u - 1) * n,
                             j->lm[u - 1], n);
    }
    if (j->dead[bh]) return;
#pragma omp for schedule(dynamic, 1)
    for (int u = 0; u < nsb; u++) {
        const int r0 = u * j->sbl, r1 = r0 + j->sbl < L ? r0 + j->sbl : L;
        j->cst[u] = (int)causal_forward(fm, &hd, &cs, ws, j->C, r0, r1, j->ls + (size_t)u * n,
                                        j->lm[u], u > 0 ? j->rs + (size_t)u * n : NULL, 1);
    }
#pragma omp single
    {
        for (int u = 0; u < nsb; u++) merge(j, bh, j->cst[u]);
        /* slot u (u >= 1): block u's local suffix sum, referenced to Ms(u) = P at the end of
         * block u - 1; becomes the suffix of blocks u.. (what block u - 1 starts from):
         * end(u) = local(u) + e^(Ms(u) - Ms(u + 1)) end(u + 1) */
        if (slice_suffix_in(j, bh, j->rs)) {
            /* a slice's suffix from later slices (referenced to P at the head's last row): slot
             * 0 (not otherwise used) for the last block, and into the last block's end */
            const int u = nsb - 1;
            const float f = (float)exp(j->cs.p[u * j->sbl - 1] - j->cs.p[L - 1]);
            float *R = j->rs + (size_t)u * n;
            for (size_t i = 0; i < n; i++) R[i] += f * j->rs[i];
        }
        for (int u = nsb - 2; u >= 1; u--) {
            const double Mu = j->cs.p[u * j->sbl - 1], Mn = j->cs.p[(u + 1) * j->sbl - 1];
            const float f = (float)exp(Mu - Mn);
            float *R = j->rs + (size_t)u * n;
            const float *Rn = j->rs + (size_t)(u + 1) * n;
            for (size_t i = 0; i < n; i++) R[i] += f * Rn[i];
        }
    }
    if (j->dead[bh]) return;
#pragma omp for schedule(dynamic, 1)
    for (int u = 0; u < nsb; u++) {
        const int r0 = u * j->sbl, r1 = r0 + j->sbl < L ? r0 + j->sbl : L;
        const float *Rn = u < nsb - 1 ? j->rs + (size_t)(u + 1) * n : suffix ? j->rs : NULL;
        j->cst[u] = (int)causal_reverse(fm, &hd, &cs, ws, j->C, r0, r1, Rn, 0, 0.0);
    }
#pragma omp single
    for (int u = 0; u < nsb; u++) merge(j, bh, j->cst[u]);
}

/* A causal slice's d/dS alone (one unit per head): the forward sweep over the head's segments
 * from the starting state (ws->state, reference M0), each segment's local suffix sum
 * sum_i e^(M_seg - P_i) dN~_i q~_i^T (M_seg its starting reference) added to the head's dS,
 * (r, dv+1) rows referenced to M0, with the factor e^(M0 - M_seg) <= 1. No state before the
 * slice (M0 = -inf): nothing can receive a gradient, dS = 0. */
static pf_status causal_dstate(bwd_job *j, bwd_ws *ws, int bh, const bwd_head *hd, causal_store *cs,
                               int S, int nseg, double M0) {
    const pf_fmap *fm = &j->fm[bh];
    const int L = j->s->Lq, r = j->r, kf = kept(j, bh);
    const size_t dv1 = (size_t)j->s->dv + 1, n = (size_t)r * dv1;
    float *dS = j->ext->dS + (size_t)bh * n;
    memset(dS, 0, sizeof(float) * n);
    if (M0 == -INFINITY) return PF_OK;
    pf_status st = PF_OK;
    double M = M0;
    for (int u = 0; u < nseg && !pf_favor_fatal(st); u++) {
        const int r0 = u * S, r1 = r0 + S < L ? r0 + S : L;
        cs->base = r0;
        if (kf) kept_features(j, bh, r0, cs);
        st = pf_status_worse(st, causal_features(fm, hd, cs, ws, j->C, r0, r1, kf, NULL, NULL));
        if (pf_favor_fatal(st)) break;
        st = pf_status_worse(
            st, causal_forward(fm, hd, cs, ws, j->C, r0, r1, ws->state, M, ws->dstate, 0));
        const float f = (float)exp(M0 - M);
        for (size_t k = 0; k < dv1; k++)
            for (size_t c = 0; c < (size_t)r; c++)
                dS[c * dv1 + k] += f * ws->dstate[k * (size_t)r + c];
        M = cs->p[r1 - 1 - r0];
    }
    if (pf_favor_fatal(st)) memset(dS, 0, sizeof(float) * n);
    return st;
}

/* The causal unit when a head is one unit: the three passes over its rows, kept in the
 * thread's scratch. A long head's rows go in segments of j->seg, so that the scratch does not
 * grow with L: a forward sweep over the segments writes dQ and keeps only the prefix state
 * before each; a reverse sweep makes each segment's features, dN~, A' and B again from that state
 * (not dQ) and carries the suffix state into the segment before. The same operations on the same
 * values as in one segment: the gradients are bit for bit the same. */
static pf_status bwd_causal_unit(bwd_job *j, bwd_ws *ws, int bh) {
    const bwd_head hd = head_of(j, bh);
    const pf_fmap *fm = &j->fm[bh];
    const int kf = kept(j, bh), L = j->s->Lq, S = kf ? j->segk : j->seg, nseg = (L + S - 1) / S;
    const size_t n = (size_t)j->r * (size_t)(j->s->dv + 1);
    causal_store cs = {ws->qst,   ws->kst, ws->dnst, ws->ast, ws->bst, ws->qamax,
                       ws->kamax, ws->kc,  ws->p,    NULL,    0};
    pf_status st = PF_OK;
    /* the state's reference after the segments so far (a slice: its starting state) */
    double M = slice_state_in(j, bh, ws->state);
    if (j->dstate) return causal_dstate(j, ws, bh, &hd, &cs, S, nseg, M);
    for (int u = 0; u < nseg && !pf_favor_fatal(st); u++) {
        const int r0 = u * S, r1 = r0 + S < L ? r0 + S : L;
        cs.base = r0;
        if (kf) kept_features(j, bh, r0, &cs);
        st = pf_status_worse(st, causal_features(fm, &hd, &cs, ws, j->C, r0, r1, kf, NULL, NULL));
        if (pf_favor_fatal(st)) break;
        if (nseg > 1) {
            if (M > -INFINITY) memcpy(ws->ckpt + (size_t)u * n, ws->state, sizeof(float) * n);
            ws->ckm[u] = M;
        }
        st = pf_status_worse(st,
                             causal_forward(fm, &hd, &cs, ws, j->C, r0, r1, ws->state, M, NULL, 1));
        M = cs.p[r1 - 1 - r0];
    }
    const int rin = slice_suffix_in(j, bh, ws->dstate); /* from later slices */
    for (int u = nseg - 1; u >= 0 && !pf_favor_fatal(st); u--) {
        const int r0 = u * S, r1 = r0 + S < L ? r0 + S : L;
        if (u < nseg - 1) { /* (the last segment's rows are still here) */
            cs.base = r0;
            if (kf) kept_features(j, bh, r0, &cs);
            st = pf_status_worse(st,
                                 causal_features(fm, &hd, &cs, ws, j->C, r0, r1, kf, NULL, NULL));
            if (pf_favor_fatal(st)) break;
            st = pf_status_worse(st, causal_forward(fm, &hd, &cs, ws, j->C, r0, r1,
                                                    ws->ckpt + (size_t)u * n, ws->ckm[u], NULL, 0));
            if (pf_favor_fatal(st)) break;
        }
        st = pf_status_worse(st, causal_reverse(fm, &hd, &cs, ws, j->C, r0, r1,
                                                u < nseg - 1 || rin ? ws->dstate : NULL, u > 0,
                                                u > 0 ? ws->ckm[u] : 0.0));
    }
    return st;
}

/* Rows per segment of a causal head of L rows whose scan goes in blocks of NB, when a thread
 * keeps `row` bytes per row: all of them if they fit in BWD_STORE, else a whole number of
 * blocks in about BWD_SEGMENT; seg > 0 asks for that many (rounded up to whole blocks). */
static int segment_rows(int L, int NB, size_t row, int seg) {
    if (seg <= 0) {
        if ((size_t)L * row <= BWD_STORE) return L;
        const size_t blocks = BWD_SEGMENT / row / (size_t)NB;
        seg = blocks > 1 ? (int)blocks * NB : NB;
    }
    seg = (seg + NB - 1) / NB * NB;
    return seg < L ? seg : L;
}

/* How a backward is cut into units of work (bwd_plan_make). Bidirectional: key and query blocks
 * as the forward cut them (so KV~ and D get its bits), heads in groups of G whose K~ made here
 * fits BWD_BUDGET (every head at once when the forward kept them all). Causal: a head is one unit,
 * walked by one thread in segments of seg rows with a checkpoint before each when its rows do not
 * fit BWD_STORE (segment_rows); when few long heads made the forward cut scan blocks (nsb > 1),
 * the blocks are the units and the heads go one at a time (bwd_causal_split). No more threads
 * than units in any phase. */
typedef struct bwd_plan {
    int heads, causal, all_kept;
    int G;                /* heads per group */
    size_t GG, GK;        /* bidirectional: heads of a group with sums here, with K~ made here */
    int NB;               /* rows per block of the passes */
    int fseg, sseg, nseg; /* a thread's rows of features and of the scan, the most segments */
    int nt;               /* threads */
} bwd_plan;

static bwd_plan bwd_plan_make(bwd_job *j, int seg) {
    const pf_shape *s = j->s;
    const pf_favor_opts *favor = j->favor;
    bwd_plan p = {.heads = s->B * s->H, .causal = j->opts->causal};
    const int heads = p.heads, causal = p.causal;
    p.all_kept = j->sv && j->sv->nkeep == heads; /* (then nothing is recomputed) */
    j->r = pf_kernel_width(favor->kernel, favor->m);
    j->dw = pf_favor_dw(s->dv);
    j->C = causal ? pf_favor_chunk(favor, s->Lq) : 0;
    j->nkb = pf_favor_bidir_blocks(s->Lk, heads, &j->kbl);
    j->nqb = pf_favor_bidir_blocks(s->Lq, heads, &j->qbl);
    const size_t per = (size_t)s->Lk * (size_t)j->r;
    int G = causal || p.all_kept ? heads
                                 : (int)(per >= (size_t)BWD_BUDGET ? 1 : (size_t)BWD_BUDGET / per);
    p.G = G > heads ? heads : (G < 1 ? 1 : G);
    p.GG = causal ? 0 : (size_t)p.G;
    p.GK = p.all_kept ? 0 : p.GG;
    j->nsb = causal && !j->dstate ? pf_favor_scan_blocks(s->Lq, heads, j->C, &j->sbl) : 1;
    /* causal: the bytes a thread keeps per row of a head (the scan's dN~, A', B, P, and unless
     * the forward kept them the features Q~, K~ with their maxima and key log factors) */
    const size_t scan_row = 4 * ((size_t)s->dv + 1 + 2 * (size_t)j->C) + 8;
    const size_t feat_row = scan_row + 4 * (2 * (size_t)j->r + 2) + 8;
    const int any_kept = j->sv && j->sv->nkeep > 0;
    p.NB = causal ? pf_favor_block(1, j->C) : BWD_BLOCK;
    j->seg = causal ? segment_rows(s->Lq, p.NB, feat_row, seg) : s->Lq;
    j->segk = causal ? segment_rows(s->Lq, p.NB, scan_row, seg) : s->Lq;
    /* (segk >= seg: a kept head holds less a row) */
    p.fseg = p.all_kept ? 0 : j->seg;
    p.sseg = any_kept ? j->segk : j->seg;
    const int shortest = p.all_kept ? j->segk : j->seg;
    p.nseg = (s->Lq + shortest - 1) / shortest;
    int64_t units = j->nkb > j->nqb ? j->nkb : j->nqb;
    if (j->nsb > units) units = j->nsb;
    const int64_t most = (int64_t)heads * (units > 1 ? units : 1);
    const int want = pf_threads(j->opts->threads);
    p.nt = want < most ? want : (int)most;
    return p;
}

/* Places the job's buffers in one allocation at base (NULL: only counts them); returns the bytes
 * it needs, and in *zeroed those of its first pieces, which start zeroed. */
static size_t bwd_layout(bwd_job *j, const bwd_plan *p, char *base, size_t *zeroed) {
    const pf_shape *s = j->s;
    const size_t H = (size_t)p->heads, nkv = (size_t)j->r * (size_t)j->dw;
    const size_t per = (size_t)s->Lk * (size_t)j->r, Lk = (size_t)s->Lk;
    size_t off = 0;
    j->kw = pf_carve(base, &off, H, sizeof(pf_kernel_ws));
    j->hst = pf_carve(base, &off, H, sizeof(int));
    j->dead = pf_carve(base, &off, H, sizeof(int));
    j->kst = pf_carve(base, &off, H * (size_t)j->nkb, sizeof(int));
    j->qst = pf_carve(base, &off, H * (size_t)j->nqb, sizeof(int));
    const size_t nsb = j->nsb > 1 ? (size_t)j->nsb : 0;
    j->cst = pf_carve(base, &off, nsb, sizeof(int));
    *zeroed = off;
    j->fm = pf_carve(base, &off, H, sizeof(pf_fmap));
    j->kf = pf_carve(base, &off, p->GK * per, sizeof(float));
    j->kc = pf_carve(base, &off, p->GK * Lk, sizeof(double));
    j->kamax = pf_carve(base, &off, p->GK * Lk, sizeof(float));
    j->part = pf_carve(base, &off, p->GK * (size_t)j->nkb * nkv, sizeof(float));
    j->pmax = pf_carve(base, &off, p->GK * (size_t)j->nkb, sizeof(double));
    j->dpart = pf_carve(base, &off, p->GG * (size_t)j->nqb * nkv, sizeof(float));
    if (nsb) { /* causal in scan blocks: one head's rows, and the blocks' states */
        const size_t L = (size_t)s->Lq, R = (size_t)j->r, dv1 = (size_t)s->dv + 1;
        const size_t CC = (size_t)j->C, LR = p->all_kept ? 0 : L * R;
        causal_store *cs = &j->cs;
        cs->qst = pf_carve(base, &off, LR, sizeof(float));
        cs->kst = pf_carve(base, &off, LR, sizeof(float));
        cs->dnst = pf_carve(base, &off, L * dv1, sizeof(float));
        cs->ast = pf_carve(base, &off, L * CC, sizeof(float));
        cs->bst = pf_carve(base, &off, L * CC, sizeof(float));
        cs->qamax = pf_carve(base, &off, L, sizeof(float));
        cs->kamax = pf_carve(base, &off, L, sizeof(float));
        j->ls = pf_carve(base, &off, nsb * dv1 * R, sizeof(float));
        j->rs = pf_carve(base, &off, nsb * dv1 * R, sizeof(float));
        cs->kc = pf_carve(base, &off, L, sizeof(double));
        cs->p = pf_carve(base, &off, L, sizeof(double));
        j->lm = pf_carve(base, &off, nsb, sizeof(double));
    }
    return off;
}

/* A thread's scratch: its rows of a whole head only when a head is one unit (causal, nsb 1);
 * the forward's key-block scratch where bidirectional keys are made here. 0, or -1. */
static int bwd_thread_ws(const bwd_job *j, const bwd_plan *p, bwd_ws *ws, pf_favor_ws *fws) {
    const int keep = p->causal && j->nsb == 1;
    memset(fws, 0, sizeof *fws);
    if (bwd_ws_alloc(ws, keep ? p->fseg : 0, keep ? p->sseg : 0, keep ? p->nseg : 0, p->NB, j->C,
                     j->r, j->s->dv) != 0)
        return -1;
    if (!p->causal && !p->all_kept &&
        pf_favor_ws_alloc(fws, pf_favor_block(0, 0), 0, j->r, j->s->dv) != 0)
        return -1;
    return 0;
}

/* Each thread of the region runs the group's phases below together (their `omp for`s share the
 * work). Causal, a head a unit: */
static void bwd_group_causal(bwd_job *j, bwd_ws *ws, int g0, int g1) {
#pragma omp for schedule(dynamic, 1)
    for (int bh = g0; bh < g1; bh++)
        if (!j->dead[bh]) merge(j, bh, (int)bwd_causal_unit(j, ws, bh));
}

/* Causal, a head's scan blocks the units: one head at a time. */
static void bwd_group_causal_blocks(bwd_job *j, bwd_ws *ws, int g0, int g1) {
    for (int bh = g0; bh < g1; bh++)
        if (!j->dead[bh]) bwd_causal_split(j, ws, bh);
}

/* Bidirectional: K~ and KV~ of the heads the forward did not keep (a slice: K~ only, KV~ is
 * given), then the query blocks (dQ, and the partial dKV~ combined per head), then the key
 * blocks again (dK, dV); a slice asking for d/dS alone stops after the queries. */
static void bwd_group_bidir(bwd_job *j, const bwd_plan *p, bwd_ws *ws, pf_favor_ws *fws, int g0,
                            int g1) {
    const int ng = g1 - g0;
    const size_t nkb = (size_t)j->nkb, nqb = (size_t)j->nqb;
    if (!p->all_kept && !j->dstate) {
#pragma omp for schedule(dynamic, 1)
        for (int u = 0; u < ng * j->nkb; u++) {
            const int bh = g0 + u / j->nkb, kb = u % j->nkb;
            if (!j->dead[bh] && !kept(j, bh))
                j->kst[(size_t)bh * nkb + (size_t)kb] = (int)bidir_keys(j, fws, bh, kb);
        }
#pragma omp for schedule(dynamic, 1)
        for (int bh = g0; bh < g1; bh++) {
            if (kept(j, bh)) continue;
            for (int kb = 0; kb < j->nkb && !j->dead[bh]; kb++)
                merge(j, bh, j->kst[(size_t)bh * nkb + (size_t)kb]);
            if (!j->dead[bh] && !j->ext) bidir_combine_kv(j, bh);
        }
    }
#pragma omp for schedule(dynamic, 1)
    for (int u = 0; u < ng * j->nqb; u++) {
        const int bh = g0 + u / j->nqb, qb = u % j->nqb;
        if (!j->dead[bh]) j->qst[(size_t)bh * nqb + (size_t)qb] = (int)bidir_queries(j, ws, bh, qb);
    }
#pragma omp for schedule(dynamic, 1)
    for (int bh = g0; bh < g1; bh++) {
        for (int qb = 0; qb < j->nqb && !j->dead[bh]; qb++)
            merge(j, bh, j->qst[(size_t)bh * nqb + (size_t)qb]);
        if (!j->dead[bh] && (!j->ext || j->dstate)) bidir_combine_dkv(j, bh);
        if (j->dstate) ext_dstate_out(j, bh, j->dead[bh]);
    }
    if (j->dstate) return;
#pragma omp for schedule(dynamic, 1)
    for (int u = 0; u < ng * j->nkb; u++) {
        const int bh = g0 + u / j->nkb, kb = u % j->nkb;
        if (!j->dead[bh])
            j->kst[(size_t)bh * nkb + (size_t)kb] = (int)bidir_keys_again(j, ws, bh, kb);
    }
#pragma omp for schedule(dynamic, 1)
    for (int bh = g0; bh < g1; bh++)
        for (int kb = 0; kb < j->nkb && !j->dead[bh]; kb++)
            merge(j, bh, j->kst[(size_t)bh * nkb + (size_t)kb]);
}

/* The parallel region: per group of heads, their setup and then the plan's schedule. Returns 1
 * when a thread's scratch could not be had. */
static int bwd_parallel(bwd_job *j, const bwd_plan *p) {
    int nomem = 0;
#pragma omp parallel num_threads(p->nt)
    {
        bwd_ws ws;
        pf_favor_ws fws;
        if (bwd_thread_ws(j, p, &ws, &fws) != 0) {
#pragma omp atomic write
            nomem = 1;
        }
#pragma omp barrier
        for (int g0 = 0; g0 < p->heads && !nomem; g0 += p->G) {
            const int g1 = g0 + p->G < p->heads ? g0 + p->G : p->heads;
#pragma omp single
            j->g0 = g0;
#pragma omp for schedule(dynamic, 1)
            for (int bh = g0; bh < g1; bh++) {
                j->hst[bh] = (int)bwd_head_setup(j, bh);
                j->dead[bh] = j->hst[bh] != PF_OK;
            }
            if (p->causal && j->nsb == 1)
                bwd_group_causal(j, &ws, g0, g1);
            else if (p->causal)
                bwd_group_causal_blocks(j, &ws, g0, g1);
            else
                bwd_group_bidir(j, p, &ws, &fws, g0, g1);
        }
        pf_free(ws.mem);
        pf_favor_ws_free(&fws);
    }
    return nomem;
}

/* The heads' statuses into the call's: a dead head's gradients zeroed (a slice's d/dS emptied).
 * Returns the worst. */
static pf_status bwd_heads_end(bwd_job *j, const bwd_plan *p) {
    const pf_shape *s = j->s;
    int worst = PF_OK;
    const size_t nq = (size_t)s->Lq * (size_t)s->d, nk = (size_t)s->Lk * (size_t)s->d;
    const size_t nv = (size_t)s->Lk * (size_t)s->dv;
    for (int bh = 0; bh < p->heads; bh++) {
        if (j->dead[bh] && !j->dstate) {
            memset(j->dQ + hoff(bh, s->Lq, s->d), 0, sizeof(float) * nq);
            memset(j->dK + hoff(bh, s->Lk, s->d), 0, sizeof(float) * nk);
            memset(j->dV + hoff(bh, s->Lk, s->dv), 0, sizeof(float) * nv);
        }
        if (j->dead[bh] && j->dstate) ext_dstate_out(j, bh, 1);
        if (j->hst[bh] > worst) worst = j->hst[bh];
    }
    return (pf_status)worst;
}

/* The backward, from the forward's features in sv, or recomputing them (sv NULL); causal heads
 * in segments of seg rows (0: chosen here); arguments checked. */
static pf_status bwd_run(float *dQ, float *dK, float *dV, const float *dout, const float *Q,
                         const float *K, const float *V, const float *out, const pf_shape *shape,
                         const pf_attn_opts *opts, const pf_favor_opts *favor,
                         const pf_favor_saved *sv, int seg, const pf_favor_ext *ext) {
    const pf_shape s = *shape;
    bwd_job j = {.s = &s,
                 .opts = opts,
                 .favor = favor,
                 .Q = Q,
                 .K = K,
                 .V = V,
                 .G = dout,
                 .out = out,
                 .dQ = dQ,
                 .dK = dK,
                 .dV = dV,
                 .sv = sv,
                 .ext = ext,
                 .dstate = ext && ext->dS};
    const bwd_plan p = bwd_plan_make(&j, seg);
    size_t zeroed;
    char *arena = pf_alloc(bwd_layout(&j, &p, NULL, &zeroed), 1);
    pf_status worst = arena ? PF_OK : PF_ENOMEM;
    if (arena) {
        bwd_layout(&j, &p, arena, &zeroed);
        memset(arena, 0, zeroed);
        worst = pf_favor_maps_init(&j.maps, j.kw, p.heads, &s, opts, favor, ext && ext->sums);
    }
    if (worst == PF_OK) worst = bwd_parallel(&j, &p) ? PF_ENOMEM : bwd_heads_end(&j, &p);
    /* The passes check an input only as they reach it, and a head that fails stops there: so
     * that a NaN or Inf anywhere in the inputs is always PF_ENONFINITE, as in the reference,
     * a failure of another kind looks at them all (only then, at the cost of one read). */
    const pf_attn_sizes ns = pf_attn_sizes_of(&s);
    if (worst == PF_EDOMAIN &&
        (pf_nonfinite_f32(Q, ns.q) || pf_nonfinite_f32(K, ns.k) || pf_nonfinite_f32(V, ns.v) ||
         pf_nonfinite_f32(dout, ns.out) || (out && pf_nonfinite_f32(out, ns.out))))
        worst = PF_ENONFINITE;
    if (worst == PF_ENOMEM && !j.dstate) {
        memset(dQ, 0, sizeof(float) * ns.q);
        memset(dK, 0, sizeof(float) * ns.k);
        memset(dV, 0, sizeof(float) * ns.v);
    }
    if (worst == PF_ENOMEM && j.dstate)
        memset(ext->dS, 0, sizeof(float) * (size_t)p.heads * (size_t)j.r * ((size_t)s.dv + 1));
    if (arena)
        for (int bh = 0; bh < p.heads; bh++) pf_kernel_ws_free(&j.kw[bh]);
    pf_free(arena);
    return worst;
}

pf_status pf_attn_favor_backward(float *dQ, float *dK, float *dV, const float *dout, const float *Q,
                                 const float *K, const float *V, const float *out,
                                 const pf_shape *shape, const pf_attn_opts *opts,
                                 const pf_favor_opts *favor) {
    if (!dQ || !dK || !dV || !dout || !Q || !K || !V) return PF_EINVAL;
    pf_status st = pf_favor_check(shape, opts, favor);
    if (st != PF_OK) return st;
    if (pf_attn_alias_check(shape, opts, NULL, NULL, dQ, dK, dV, Q, K, V, dout, out, NULL, favor->W,
                            (size_t)(favor->w_per_head ? shape->H : 1) * (size_t)favor->m *
                                (size_t)shape->d))
        return PF_EINVAL;
    return bwd_run(dQ, dK, dV, dout, Q, K, V, out, shape, opts, favor, NULL, 0, NULL);
}

pf_status pf_attn_favor_backward_saved(float *dQ, float *dK, float *dV, const float *dout,
                                       const float *Q, const float *K, const float *V,
                                       const float *out, const pf_shape *shape,
                                       const pf_attn_opts *opts, const pf_favor_opts *favor,
                                       const pf_favor_saved *saved) {
    if (!dQ || !dK || !dV || !dout || !Q || !K || !V || !saved) return PF_EINVAL;
    pf_status st = pf_favor_check(shape, opts, favor);
    if (st == PF_OK) st = pf_favor_saved_match(saved, shape, opts, favor, 1);
    if (st != PF_OK) return st;
    if (pf_attn_alias_check(shape, opts, NULL, NULL, dQ, dK, dV, Q, K, V, dout, out, NULL, favor->W,
                            (size_t)(favor->w_per_head ? shape->H : 1) * (size_t)favor->m *
                                (size_t)shape->d))
        return PF_EINVAL;
    return bwd_run(dQ, dK, dV, dout, Q, K, V, out, shape, opts, favor, saved, 0, NULL);
}

pf_status pf_favor_backward_segmented(float *dQ, float *dK, float *dV, const float *dout,
                                      const float *Q, const float *K, const float *V,
                                      const float *out, const pf_shape *shape,
                                      const pf_attn_opts *opts, const pf_favor_opts *favor,
                                      const pf_favor_saved *saved, int seg) {
    if (!dQ || !dK || !dV || !dout || !Q || !K || !V) return PF_EINVAL;
    pf_status st = pf_favor_check(shape, opts, favor);
    if (st == PF_OK && saved) st = pf_favor_saved_match(saved, shape, opts, favor, 1);
    if (st != PF_OK) return st;
    return bwd_run(dQ, dK, dV, dout, Q, K, V, out, shape, opts, favor, saved, seg, NULL);
}

pf_status pf_favor_backward_ext(float *dQ, float *dK, float *dV, const float *dout, const float *Q,
                                const float *K, const float *V, const float *out,
                                const pf_shape *shape, const pf_attn_opts *opts,
                                const pf_favor_opts *favor, const pf_favor_ext *ext) {
    return bwd_run(dQ, dK, dV, dout, Q, K, V, out, shape, opts, favor, NULL, 0, ext);
}

/* ---- the float64 reference ---------------------------------------------------------------- */

/* S += x [v | 1]^T for x (r), v (dv); S is (r, dv+1) */
static void add_outer(double *S, const double *x, const float *v, int r, int dv) {
    for (int f = 0; f < r; f++) {
        double *row = S + (size_t)f * (size_t)(dv + 1);
        for (int k = 0; k < dv; k++) row[k] += x[f] * (double)v[k];
        row[dv] += x[f];
    }
}

/* Per head: materialised unstabilised features phi(Q), phi(K) and their u = W x' in double; a
 * prefix sum S_i = sum_{j <= i} phi(k_j) [v_j|1]^T for out and dphi(q_i) = S_i dN~_i, then a
 * suffix sum R_j = sum_{i >= j} phi(q_i) dN~_i^T for dphi(k_j) = R_j [v_j|1] and
 * dv_j = R_j[:, :dv]^T phi(k_j) (bidirectional: S and R over every valid key and query). */
pf_status pf_attn_favor_backward_ref(float *dQ, float *dK, float *dV, const float *dout,
                                     const float *Q, const float *K, const float *V,
                                     const pf_shape *shape, const pf_attn_opts *opts,
                                     const pf_favor_opts *favor) {
    if (!dQ || !dK || !dV || !dout || !Q || !K || !V) return PF_EINVAL;
    pf_status st = pf_favor_check(shape, opts, favor);
    if (st != PF_OK) return st;
    if (pf_attn_alias_check(
            shape, opts, NULL, NULL, dQ, dK, dV, Q, K, V, dout, NULL, NULL, favor->W,
            (size_t)(favor->w_per_head ? shape->H : 1) * (size_t)favor->m * (size_t)shape->d))
        return PF_EINVAL;
    const pf_shape s = *shape;
    const pf_attn_sizes ns = pf_attn_sizes_of(&s);
    if (pf_nonfinite_f32(Q, ns.q) || pf_nonfinite_f32(K, ns.k) || pf_nonfinite_f32(V, ns.v) ||
        pf_nonfinite_f32(dout, ns.out))
        return PF_ENONFINITE;
    const int r = pf_kernel_width(favor->kernel, favor->m), m = favor->m;
    const int dv = s.dv, dv1 = dv + 1, d = s.d, Lq = s.Lq, Lk = s.Lk;
    double *pq = malloc(sizeof(double) * (size_t)Lq * r), *pk = malloc(sizeof(double) * Lk * r);
    double *uq = malloc(sizeof(double) * (size_t)Lq * m), *uk = malloc(sizeof(double) * Lk * m);
    double *dN = malloc(sizeof(double) * (size_t)Lq * dv1);
    double *S = malloc(sizeof(double) * (size_t)r * dv1), *dphi = malloc(sizeof(double) * r);
    double *dx = malloc(sizeof(double) * (size_t)d), *num = malloc(sizeof(double) * dv1);
    pf_kernel_ws kw;
    const int kw_ok = pf_kernel_ws_alloc(&kw, favor->kernel, m, d) == 0;
    if (!pq || !pk || !uq || !uk || !dN || !S || !dphi || !dx || !num || !kw_ok) {
        st = PF_ENOMEM;
        goto done;
    }
    memset(dQ, 0, sizeof(float) * ns.q);
    memset(dK, 0, sizeof(float) * ns.k);
    memset(dV, 0, sizeof(float) * ns.v);
    for (int b = 0; b < s.B; b++) {
        const int klen = pf_attn_key_len(opts, b, Lk);
        for (int h = 0; h < s.H; h++) {
            const size_t bh = (size_t)b * (size_t)s.H + (size_t)h;
            const float *Qh = Q + bh * Lq * d, *Kh = K + bh * Lk * d, *Vh = V + bh * Lk * dv;
            const float *Gh = dout + bh * Lq * dv;
            float *dQh = dQ + bh * Lq * d, *dKh = dK + bh * Lk * d, *dVh = dV + bh * Lk * dv;
            pf_fmap fm = pf_favor_fmap(&s, opts, favor, h);
            const pf_status sb = pf_favor_bind(&fm, &kw, favor, Qh, Lq, Kh, klen);
            if (sb != PF_OK) {
                st = pf_status_worse(st, sb);
                continue;
            }
            int bad = 0;
            for (int i = 0; i < Lq; i++)
                bad |= pf_fmap_row_f64(&fm, pq + (size_t)i * r, uq + (size_t)i * m,
                                       Qh + (size_t)i * d);
            for (int j = 0; j < klen; j++)
                bad |= pf_fmap_row_f64(&fm, pk + (size_t)j * r, uk + (size_t)j * m,
                                       Kh + (size_t)j * d);
            if (bad) {
                st = pf_status_worse(st, PF_ENONFINITE);
                continue;
            }
            /* forward: prefix (causal) or full sums S, out, dN~, dphi(q_i) = S dN~_i */
            memset(S, 0, sizeof(double) * (size_t)r * dv1);
            for (int j = 0; j < (opts->causal ? 0 : klen); j++)
                add_outer(S, pk + (size_t)j * r, Vh + (size_t)j * dv, r, dv);
            for (int i = 0; i < Lq; i++) {
                if (opts->causal && i < klen)
                    add_outer(S, pk + (size_t)i * r, Vh + (size_t)i * dv, r, dv);
                for (int k = 0; k < dv1; k++) num[k] = 0;
                for (int f = 0; f < r; f++)
                    for (int k = 0; k < dv1; k++)
                        num[k] += pq[(size_t)i * r + f] * S[(size_t)f * dv1 + k];
                double *dn = dN + (size_t)i * dv1;
                if (!isfinite(num[dv]) || num[dv] == 0) {
                    st = pf_status_worse(st, isfinite(num[dv]) ? PF_EDOMAIN : PF_ENONFINITE);
                    for (int k = 0; k < dv1; k++) dn[k] = 0;
                } else {
                    double go = 0;
                    for (int k = 0; k < dv; k++) {
                        go += Gh[(size_t)i * dv + k] * num[k] / num[dv];
                        dn[k] = Gh[(size_t)i * dv + k] / num[dv];
                    }
                    dn[dv] = -go / num[dv];
                }
                for (int f = 0; f < r; f++) {
                    double acc = 0;
                    for (int k = 0; k < dv1; k++) acc += S[(size_t)f * dv1 + k] * dn[k];
                    dphi[f] = acc;
                }
                pf_fmap_row_f64_backward(&fm, dx, dphi, Qh + (size_t)i * d, uq + (size_t)i * m);
                for (int k = 0; k < d; k++) dQh[(size_t)i * d + k] = (float)dx[k];
            }
            /* backward: suffix (or full) sums R, reusing S */
            double *R = S;
            memset(R, 0, sizeof(double) * (size_t)r * dv1);
            if (!opts->causal) {
                for (int i = 0; i < Lq; i++)
                    for (int f = 0; f < r; f++)
                        for (int k = 0; k < dv1; k++)
                            R[(size_t)f * dv1 + k] +=
                                pq[(size_t)i * r + f] * dN[(size_t)i * dv1 + k];
            }
            for (int j = (opts->causal ? Lq : klen) - 1; j >= 0; j--) {
                if (opts->causal) {
                    for (int f = 0; f < r; f++)
                        for (int k = 0; k < dv1; k++)
                            R[(size_t)f * dv1 + k] +=
                                pq[(size_t)j * r + f] * dN[(size_t)j * dv1 + k];
                }
                if (j >= klen) continue;
                for (int f = 0; f < r; f++) {
                    double acc = R[(size_t)f * dv1 + dv];
                    for (int k = 0; k < dv; k++)
                        acc += R[(size_t)f * dv1 + k] * Vh[(size_t)j * dv + k];
                    dphi[f] = acc;
                }
                for (int k = 0; k < dv; k++) {
                    double acc = 0;
                    for (int f = 0; f < r; f++)
                        acc += R[(size_t)f * dv1 + k] * pk[(size_t)j * r + f];
                    dVh[(size_t)j * dv + k] = (float)acc;
                }
                pf_fmap_row_f64_backward(&fm, dx, dphi, Kh + (size_t)j * d, uk + (size_t)j * m);
                for (int k = 0; k < d; k++) dKh[(size_t)j * d + k] = (float)dx[k];
            }
        }
    }
done:
    free(pq);
    free(pk);
    free(uq);
    free(uk);
    free(dN);
    free(S);
    free(dphi);
    free(dx);
    free(num);
    pf_kernel_ws_free(&kw);
    return st;
}
