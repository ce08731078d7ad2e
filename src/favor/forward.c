/* forward.c: FAVOR+ attention, out = D^-1 phi(Q) (phi(K)^T V) (the Performer, Choromanski et al.
 * 2020), forward, and its float64 reference.
 *
 * One (b, h) pair is one unit of work, done by one thread, so the arithmetic (and the result,
 * bit for bit) does not depend on the thread count. Within a head, rows go in blocks that stay
 * in cache: a block of inputs becomes stabilised features (features.c) and goes straight into
 * the products with the state (scan.c), bidirectional or in causal chunks; no L x r matrix is
 * ever formed (but for the key features of a causal head cut into scan blocks, kept between the
 * two passes while they fit in FAVOR_KMADE bytes). Every product runs in the library's own
 * kernels (pf_mm, blas.c: no packing, and the same bits for a row whatever the rows beside it).
 *
 * Values are augmented with a ones column, [V | 1] (Lk, dv+1), so one product gives numerator
 * (columns 0..dv-1) and denominator (column dv). */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_common.h"
#include "favor.h"

/* ---- the driver --------------------------------------------------------------------------- */

/* Work is cut into units that never depend on the thread count, and each unit's arithmetic is
 * fixed, so any thread may run it (dynamic schedule) and the bits never change:
 *   bidirectional  per head, key blocks (pf_favor_split) give partial K~^T [V|1] sums, each with
 *                  its own max; they are combined in block order; then query blocks of
 *                  FAVOR_BLOCK rows read the combined sum;
 *   causal         per head, scan blocks (pf_favor_split: several only when B*H is small): the
 *                  local sum of every block but the last, an in-order prefix combine giving each
 *                  block its starting state, then each block's chunked scan from that state.
 * With B*H >= FAVOR_SPLIT a head is one key block and one scan block. */
typedef struct favor_job {
    const pf_shape *s;
    const pf_attn_opts *opts;
    const pf_favor_opts *favor;
    const void *Q, *K, *V;   /* of element type dt (pf_attn_favor_dt), else float32 */
    void *out;
    pf_dtype dt;
    int r, C, nkb, kbl;      /* key (or scan) blocks per head and their length */
    pf_fmap *fm;             /* (heads) */
    pf_kernel_ws *kw;        /* (heads; only [0] when one map serves every head) */
    pf_favor_maps maps;      /* one map for every head, or none (pf_favor_maps_init) */
    float *part;             /* (heads, nkb, r, dw): partial sums; [h][0] becomes the total */
    double *pmax;            /* (heads, nkb) */
    int *hst;                /* (heads): status of the head (phase 0) */
    int *kst;                /* (heads, nkb): status of each key unit */
    int *ust;                /* (heads, nqb): status of each query or scan unit */
    pf_favor_saved *sv;      /* what the backward will need, or NULL */
    const pf_favor_ext *ext; /* a slice's state and sums from outside, or NULL */
    /* causal, several scan blocks: the key features and log factors the key phase made for every
     * block but the last, (heads, kmrows, r) and (heads, kmrows), for the scan, which otherwise
     * makes them again; NULL when they would take over FAVOR_KMADE bytes or could not be had
     * (a head the saved store keeps uses that store instead) */
    float *kmade;
    double *cmade;
    size_t kmrows;
} favor_job;

/* Bytes of key features a causal forward may hold between its key phase and its scan. */
static const size_t FAVOR_KMADE = (size_t)16 << 20;

static size_t head_off(int bh, int L, int w) {
    return (size_t)bh * (size_t)L * (size_t)w;
}

/* Element off of X, a tensor of j->dt. */
static const void *at(const favor_job *j, const void *X, size_t off) {
    return (const char *)X + off * pf_dtype_size(j->dt);
}

/* A slice: head bh's state from outside, (r, dv+1) rows, into slot 0 as (r, dw) rows (the
 * causal starting state, or the bidirectional total); an empty one (-inf) as zeros. */
static void ext_state_in(favor_job *j, int bh) {
    const size_t dv1 = (size_t)j->s->dv + 1, dw = (size_t)pf_favor_dw(j->s->dv);
    const size_t r = (size_t)j->r;
    float *P = j->part + (size_t)bh * (size_t)j->nkb * r * dw;
    const double M = j->ext->M[bh];
    j->pmax[(size_t)bh * (size_t)j->nkb] = M;
    memset(P, 0, sizeof(float) * r * dw);
    if (M == -INFINITY) return;
    const float *S = j->ext->S + (size_t)bh * r * dv1;
    for (size_t f = 0; f < r; f++) memcpy(P + f * dw, S + f * dv1, sizeof(float) * dv1);
}

/* Phase 0: the head's map (OPRF/SDERF parameters) and the padded keys' check. */
static pf_status job_head(favor_job *j, int bh) {
    const pf_shape *s = j->s;
    const int b = bh / s->H;
    const int klen = pf_attn_key_len(j->opts, b, s->Lk);
    /* inputs are checked block by block where they are used (while in cache); only the padded
     * keys, never used, are checked here */
    const size_t pad = (size_t)(s->Lk - klen);
    if (pf_nonfinite_dt(at(j, j->K, head_off(bh, s->Lk, s->d) + (size_t)klen * (size_t)s->d),
                        j->dt, pad * (size_t)s->d) ||
        pf_nonfinite_dt(at(j, j->V, head_off(bh, s->Lk, s->dv) + (size_t)klen * (size_t)s->dv),
                        j->dt, pad * (size_t)s->dv))
        return PF_ENONFINITE;
    /* (the FAVOR++ and FAVOR# fits read Q and K: float32 only, pf_attn_favor_dt says) */
    const float *Kh = (const float *)at(j, j->K, head_off(bh, s->Lk, s->d));
    if (j->ext && j->ext->S) ext_state_in(j, bh);
    const float *Qh = j->Q ? (const float *)at(j, j->Q, head_off(bh, s->Lq, s->d)) : NULL;
    return pf_favor_maps_head(&j->maps, &j->fm[bh], &j->kw[bh], bh, s, j->opts, j->favor,
                              j->ext ? j->ext->sums : NULL, Qh, Kh, klen);
}

/* Where head bh's key features from row `row` on are kept by the key phase: the saved store's
 * (with their log factors *c and max|k~| *amax), else, causal, the hold for the scan (*amax
 * NULL); NULL when neither. */
static float *key_store(const favor_job *j, int bh, size_t row, double **c, float **amax) {
    *c = NULL, *amax = NULL;
    if (j->sv && bh < j->sv->nkeep) {
        const size_t o = (size_t)bh * (size_t)j->s->Lk + row;
        *c = j->sv->kc + o, *amax = j->sv->kamax + o;
        return j->sv->kf + o * (size_t)j->r;
    }
    if (!j->kmade) return NULL;
    const size_t o = (size_t)bh * j->kmrows + row;
    *c = j->cmade + o;
    return j->kmade + o * (size_t)j->r;
}

/* Phase 1: the local sum of key block kb of head bh into slot kb (bidirectional) or kb + 1
 * (causal, scan blocks but the last: slot 0 stays the empty starting state of block 0). */
static pf_status job_keys(favor_job *j, pf_favor_ws *ws, int bh, int kb) {
    const pf_shape *s = j->s;
    const int klen = pf_attn_key_len(j->opts, bh / s->H, s->Lk);
    const int j0 = kb * j->kbl, slot = kb + (j->opts->causal ? 1 : 0);
    int n = klen - j0;
    n = n > j->kbl ? j->kbl : n;
    float *KVb = j->part + ((size_t)bh * (size_t)j->nkb + (size_t)slot) * (size_t)j->r *
                               (size_t)pf_favor_dw(s->dv);
    double *Mb = j->pmax + (size_t)bh * (size_t)j->nkb + (size_t)slot;
    *Mb = -INFINITY;
    if (n <= 0) return PF_OK; /* padding only */
    const void *Kh = at(j, j->K, head_off(bh, s->Lk, s->d) + (size_t)j0 * (size_t)s->d);
    const void *Vh = at(j, j->V, head_off(bh, s->Lk, s->dv) + (size_t)j0 * (size_t)s->dv);
    double *c;
    float *amax, *kf = key_store(j, bh, (size_t)j0, &c, &amax); /* (causal: for the scan too) */
    return pf_favor_key_block(&j->fm[bh], ws, KVb, Mb, Kh, Vh, n, s->dv, kf, c, amax);
}

/* The key features (and log factors) of causal scan block sb of head bh that the key phase made,
 * from its first row; NULL when the scan must make them (the last block, or none kept). */
static const float *key_made(const favor_job *j, int bh, int sb, const double **c) {
    *c = NULL;
    if (sb >= j->nkb - 1) return NULL;
    double *kc;
    float *amax, *kf = key_store(j, bh, (size_t)sb * (size_t)j->kbl, &kc, &amax);
    *c = kc;
    return kf;
}

/* Phase 2, in block order: bidirectional, the head's total into slot 0; causal, slot kb
 * becomes block kb's starting state, start(kb) = start(kb - 1) + local(kb - 1). */
static void job_combine(favor_job *j, int bh) {
    const size_t n = (size_t)j->r * (size_t)pf_favor_dw(j->s->dv);
    float *P = j->part + (size_t)bh * (size_t)j->nkb * n;
    double *M = j->pmax + (size_t)bh * (size_t)j->nkb;
    if (!j->opts->causal) {
        for (int kb = 1; kb < j->nkb; kb++)
            pf_favor_combine(P, &M[0], P + (size_t)kb * n, M[kb], n);
        if (j->sv) {
            memcpy(j->sv->kv + (size_t)bh * n, P, sizeof(float) * n);
            j->sv->kvm[bh] = M[0];
        }
        return;
    }
    if (!(j->ext && j->ext->S)) M[0] = -INFINITY; /* (else the slice's starting state) */
    for (int kb = 1; kb < j->nkb; kb++)
        pf_favor_combine(P + (size_t)kb * n, &M[kb], P + (size_t)(kb - 1) * n, M[kb - 1], n);
}

/* Phase 3, bidirectional: queries of block qb (FAVOR_BLOCK rows). */
static pf_status job_queries(favor_job *j, pf_favor_ws *ws, int bh, int qb) {
    const pf_shape *s = j->s;
    const int i0 = qb * FAVOR_BLOCK, n = s->Lq - i0 < FAVOR_BLOCK ? s->Lq - i0 : FAVOR_BLOCK;
    const size_t nkv = (size_t)j->r * (size_t)pf_favor_dw(s->dv);
    const float *KV = j->part + (size_t)bh * (size_t)j->nkb * nkv;
    const void *Qh = at(j, j->Q, head_off(bh, s->Lq, s->d) + (size_t)i0 * (size_t)s->d);
    void *oh = (void *)at(j, j->out, head_off(bh, s->Lq, s->dv) + (size_t)i0 * (size_t)s->dv);
    const size_t o = (size_t)bh * (size_t)s->Lq + (size_t)i0;
    const int keep = j->sv && bh < j->sv->nkeep;
    return pf_favor_query_block(&j->fm[bh], ws, oh, Qh, KV, n, s->dv,
                                keep ? j->sv->qf + o * (size_t)j->r : NULL,
                                keep ? j->sv->qamax + o : NULL);
}

/* Phase 3, causal: scan block sb from its starting state. */
static pf_status job_scan(favor_job *j, pf_favor_ws *ws, int bh, int sb) {
    const pf_shape *s = j->s;
    const int klen = pf_attn_key_len(j->opts, bh / s->H, s->Lk);
    const int t0 = sb * j->kbl, n = s->Lq - t0 < j->kbl ? s->Lq - t0 : j->kbl;
    const size_t nkv = (size_t)j->r * (size_t)pf_favor_dw(s->dv);
    const float *start = j->part + ((size_t)bh * (size_t)j->nkb + (size_t)sb) * nkv;
    double M = j->pmax[(size_t)bh * (size_t)j->nkb + (size_t)sb];
    if (M > -INFINITY) memcpy(ws->state, start, sizeof(float) * nkv);
    const size_t o = (size_t)t0, row = (size_t)bh * (size_t)s->Lq + o; /* (Lq == Lk) */
    pf_favor_keep keep;
    const int kept = j->sv && bh < j->sv->nkeep;
    if (kept)
        keep = (pf_favor_keep){.qf = j->sv->qf + row * (size_t)j->r,
                               .qamax = j->sv->qamax + row,
                               .kf = j->sv->kf + row * (size_t)j->r,
                               .kamax = j->sv->kamax + row,
                               .kc = j->sv->kc + row,
                               .A = j->sv->ka + row * (size_t)j->C};
    const double *cmade;
    const float *kmade = key_made(j, bh, sb, &cmade);
    return pf_favor_causal_rows(&j->fm[bh], ws, j->C, ws->state, &M,
                                (void *)at(j, j->out, head_off(bh, s->Lq, s->dv) + o * (size_t)s->dv),
                                at(j, j->Q, head_off(bh, s->Lq, s->d) + o * (size_t)s->d),
                                at(j, j->K, head_off(bh, s->Lk, s->d) + o * (size_t)s->d),
                                at(j, j->V, head_off(bh, s->Lk, s->dv) + o * (size_t)s->dv), n,
                                klen - t0, s->dv, kept ? &keep : NULL, kmade, cmade);
}

/* A slice's own key state: slot 0 of head bh (the combined total), as (r, dv+1) rows; a head
 * that failed gives an empty state. */
static void ext_state_out(favor_job *j, int bh, int dead) {
    const size_t dv1 = (size_t)j->s->dv + 1, dw = (size_t)pf_favor_dw(j->s->dv);
    const size_t r = (size_t)j->r;
    float *S = j->ext->Sout + (size_t)bh * r * dv1;
    if (dead || !j->part || !j->pmax || j->pmax[(size_t)bh * (size_t)j->nkb] == -INFINITY) {
        memset(S, 0, sizeof(float) * r * dv1);
        j->ext->Mout[bh] = -INFINITY;
        return;
    }
    const float *P = j->part + (size_t)bh * (size_t)j->nkb * r * dw;
    for (size_t f = 0; f < r; f++) memcpy(S + f * dv1, P + f * dw, sizeof(float) * dv1);
    j->ext->Mout[bh] = j->pmax[(size_t)bh * (size_t)j->nkb];
}

/* How a forward is cut (favor_plan_make): key units per head (bidirectional key blocks, or the
 * causal scan blocks whose local sums precede the prefix), then query units (bidirectional
 * blocks of FAVOR_BLOCK rows, or the causal scan blocks); a slice's key state alone has no query
 * units, a slice given its total no key units. No more threads than units in any phase: each
 * idle one would only cost its scratch (and, where threads cannot be made, a libgomp exit). */
typedef struct favor_plan {
    int heads;
    int nk1, nqb; /* key and query units per head */
    int nt;       /* threads */
} favor_plan;

static favor_plan favor_plan_make(favor_job *j, int keys_only, int ext_state) {
    const pf_shape *s = j->s;
    const int causal = j->opts->causal;
    favor_plan p = {.heads = s->B * s->H}; /* (pf_attn_check: B H L d fits in size_t) */
    j->r = pf_kernel_width(j->favor->kernel, j->favor->m);
    j->C = causal ? pf_favor_chunk(j->favor, s->Lq) : 0;
    if (causal)
        j->nkb = pf_favor_scan_blocks(s->Lk, p.heads, j->C, &j->kbl);
    else if (ext_state) /* the total comes from outside: no key blocks */
        j->nkb = 1, j->kbl = s->Lk;
    else
        j->nkb = pf_favor_bidir_blocks(s->Lk, p.heads, &j->kbl);
    p.nqb = keys_only ? 0 : causal ? j->nkb : (s->Lq + FAVOR_BLOCK - 1) / FAVOR_BLOCK;
    p.nk1 = causal ? j->nkb - 1 : (ext_state ? 0 : j->nkb);
    const int64_t most =
        (int64_t)p.heads * (p.nk1 > p.nqb ? (p.nk1 > 1 ? p.nk1 : 1) : (p.nqb > 1 ? p.nqb : 1));
    const int want = pf_threads(j->opts->threads);
    p.nt = want > most ? (int)most : want;
    return p;
}

/* Places the job's buffers in one allocation at base (NULL: only counts); returns the bytes, and
 * in *zeroed those of the first pieces, which start zeroed. */
static size_t favor_layout(favor_job *j, const favor_plan *p, char *base, size_t *zeroed) {
    const size_t H = (size_t)p->heads, nkv = (size_t)j->r * (size_t)pf_favor_dw(j->s->dv);
    size_t off = 0;
    j->kw = pf_carve(base, &off, H, sizeof(pf_kernel_ws));
    j->hst = pf_carve(base, &off, H, sizeof(int));
    j->kst = pf_carve(base, &off, H * (size_t)j->nkb, sizeof(int));
    j->ust = pf_carve(base, &off, H * (size_t)(p->nqb > 0 ? p->nqb : 1), sizeof(int));
    *zeroed = off;
    j->fm = pf_carve(base, &off, H, sizeof(pf_fmap));
    j->part = pf_carve(base, &off, H * (size_t)j->nkb * nkv, sizeof(float));
    j->pmax = pf_carve(base, &off, H * (size_t)j->nkb, sizeof(double));
    return off;
}

/* The parallel region: every head's setup, its key units and their combination, then its
 * query (or scan) units. Returns 1 when a thread's scratch could not be had. */
static int favor_parallel(favor_job *j, const favor_plan *p) {
    const int heads = p->heads, nk1 = p->nk1, nqb = p->nqb, causal = j->opts->causal;
    const size_t nkb = (size_t)j->nkb;
    int nomem = 0;
#pragma omp parallel num_threads(p->nt)
    {
        pf_favor_ws ws;
        const int nb = pf_favor_block(causal, j->C);
        if (pf_favor_ws_alloc(&ws, nb, j->C, j->r, j->s->dv) != 0 ||
            (j->dt != PF_F32 && pf_favor_ws_half(&ws, j->dt, nb, j->s->d, j->s->dv) != 0)) {
#pragma omp atomic write
            nomem = 1;
        }
#pragma omp barrier
        if (!nomem) {
#pragma omp for schedule(dynamic, 1)
            for (int bh = 0; bh < heads; bh++) j->hst[bh] = (int)job_head(j, bh);
#pragma omp for schedule(dynamic, 1)
            for (int u = 0; u < heads * nk1; u++) {
                const int bh = u / nk1, kb = u % nk1;
                if (j->hst[bh] != PF_OK) continue;
                j->kst[(size_t)bh * nkb + (size_t)kb] = (int)job_keys(j, &ws, bh, kb);
            }
#pragma omp for schedule(dynamic, 1)
            for (int bh = 0; bh < heads; bh++) {
                for (int kb = 0; kb < nk1; kb++) {
                    const int u = j->kst[(size_t)bh * nkb + (size_t)kb];
                    if (u > j->hst[bh]) j->hst[bh] = u;
                }
                if (j->hst[bh] == PF_OK) job_combine(j, bh);
            }
#pragma omp for schedule(dynamic, 1)
            for (int u = 0; u < heads * nqb; u++) {
                const int bh = u / nqb, qb = u % nqb;
                if (j->hst[bh] != PF_OK) continue;
                j->ust[u] = (int)(causal ? job_scan(j, &ws, bh, qb) : job_queries(j, &ws, bh, qb));
            }
        }
        pf_favor_ws_free(&ws);
    }
    return nomem;
}

/* The heads' statuses in a fixed order into the call's; a head that failed outright is zeroed
 * (a failed setup or key block leaves it unwritten, a query or scan unit's NaN part of it).
 * *dead_heads counts them. */
static pf_status favor_heads_end(favor_job *j, const favor_plan *p, int keys_only,
                                 int *dead_heads) {
    const pf_shape *s = j->s;
    int worst = PF_OK;
    *dead_heads = 0;
    for (int bh = 0; bh < p->heads; bh++) {
        int hs = j->hst[bh], dead = hs != PF_OK;
        for (int u = 0; u < p->nqb; u++) {
            const int us = j->ust[(size_t)bh * (size_t)p->nqb + (size_t)u];
            hs = us > hs ? us : hs;
            dead |= pf_favor_fatal(us);
        }
        if (dead && j->out)
            memset((void *)at(j, j->out, head_off(bh, s->Lq, s->dv)), 0,
                   pf_dtype_size(j->dt) * (size_t)s->Lq * (size_t)s->dv);
        if (keys_only) ext_state_out(j, bh, dead);
        if (hs > worst) worst = hs;
        *dead_heads += dead;
    }
    return (pf_status)worst;
}

/* The forward, keeping what the backward needs in sv if it is not NULL; *complete is 1 when
 * every head was computed (none failed outright). Arguments checked. */
static pf_status favor_run(void *out, const void *Q, const void *K, const void *V, pf_dtype dt,
                           const pf_shape *shape, const pf_attn_opts *opts,
                           const pf_favor_opts *favor, pf_favor_saved *sv, int *complete,
                           const pf_favor_ext *ext) {
    const pf_shape s = *shape;
    /* a slice's key state alone: the bidirectional key phases, whatever opts->causal */
    const int keys_only = ext && ext->Sout, ext_state = ext && ext->S;
    pf_attn_opts kopts;
    if (keys_only) {
        kopts = *opts;
        kopts.causal = 0;
        opts = &kopts;
    }
    favor_job j = {.s = &s,
                   .opts = opts,
                   .favor = favor,
                   .Q = Q,
                   .K = K,
                   .V = V,
                   .out = out,
                   .dt = dt,
                   .sv = sv,
                   .ext = ext};
    *complete = 0;
    const favor_plan p = favor_plan_make(&j, keys_only, ext_state);
    size_t zeroed;
    char *arena = pf_alloc(favor_layout(&j, &p, NULL, &zeroed), 1);
    pf_status worst = arena ? PF_OK : PF_ENOMEM;
    if (arena) {
        favor_layout(&j, &p, arena, &zeroed);
        memset(arena, 0, zeroed);
        worst = pf_favor_maps_init(&j.maps, j.kw, p.heads, &s, opts, favor, ext && ext->sums);
    }
    if (worst == PF_OK && p.nk1 > 0 && !keys_only && opts->causal &&
        !(sv && sv->nkeep >= p.heads)) {
        /* the key phase's features kept for the scan while they fit (else it makes them again:
         * the same bits) */
        const size_t rows = (size_t)p.nk1 * (size_t)j.kbl, heads = (size_t)p.heads;
        /* (heads * rows <= B H L fits; the bytes per row divide, so no product can wrap) */
        if (heads * rows <= FAVOR_KMADE / (sizeof(float) * (size_t)j.r + sizeof(double))) {
            j.kmade = pf_alloc(heads * rows * (size_t)j.r, sizeof(float));
            j.cmade = pf_alloc(heads * rows, sizeof(double));
            if (!j.kmade || !j.cmade) {
                pf_free(j.kmade), pf_free(j.cmade);
                j.kmade = NULL, j.cmade = NULL;
            }
            j.kmrows = rows;
        }
    }
    if (worst == PF_OK && favor_parallel(&j, &p)) worst = PF_ENOMEM;
    if (worst == PF_OK) {
        int dead_heads;
        worst = favor_heads_end(&j, &p, keys_only, &dead_heads);
        *complete = dead_heads == 0;
    }
    if (worst == PF_ENOMEM && out)
        memset(out, 0, pf_dtype_size(dt) * (size_t)p.heads * (size_t)s.Lq * (size_t)s.dv);
    if (worst == PF_ENOMEM && keys_only)
        for (int bh = 0; bh < p.heads; bh++) ext_state_out(&j, bh, 1);
    if (arena)
        for (int bh = 0; bh < p.heads; bh++) pf_kernel_ws_free(&j.kw[bh]);
    pf_free(arena);
    pf_free(j.kmade);
    pf_free(j.cmade);
    return worst;
}

/* The checks of a forward's arguments (pf_attn_favor, pf_attn_favor_save and the reference):
 * pointers, shape, options, and out aliasing none of the inputs. */
static pf_status forward_args(const float *out, const float *Q, const float *K, const float *V,
                              const pf_shape *shape, const pf_attn_opts *opts,
                              const pf_favor_opts *favor) {
    if (!out || !Q || !K || !V) return PF_EINVAL;
    pf_status st = pf_favor_check(shape, opts, favor);
    if (st != PF_OK) return st;
    if (pf_attn_alias_check(
            shape, opts, out, NULL, NULL, NULL, NULL, Q, K, V, NULL, NULL, NULL, favor->W,
            (size_t)(favor->w_per_head ? shape->H : 1) * (size_t)favor->m * (size_t)shape->d))
        return PF_EINVAL;
    return PF_OK;
}

pf_status pf_favor_forward_ext(float *out, const float *Q, const float *K, const float *V,
                               const pf_shape *shape, const pf_attn_opts *opts,
                               const pf_favor_opts *favor, const pf_favor_ext *ext) {
    int complete;
    return favor_run(out, Q, K, V, PF_F32, shape, opts, favor, NULL, &complete, ext);
}

pf_status pf_attn_favor(float *out, const float *Q, const float *K, const float *V,
                        const pf_shape *shape, const pf_attn_opts *opts,
                        const pf_favor_opts *favor) {
    pf_status st = forward_args(out, Q, K, V, shape, opts, favor);
    if (st != PF_OK) return st;
    int complete;
    return favor_run(out, Q, K, V, PF_F32, shape, opts, favor, NULL, &complete, NULL);
}

/* Whether [a, a + na) and [b, b + nb) share a byte. */
static int bytes_overlap(const void *a, size_t na, const void *b, size_t nb) {
    const char *x = (const char *)a, *y = (const char *)b;
    return na && nb && x < y + nb && y < x + na;
}

pf_status pf_attn_favor_dt(void *out, const void *Q, const void *K, const void *V, pf_dtype dtype,
                           const pf_shape *shape, const pf_attn_opts *opts,
                           const pf_favor_opts *favor) {
    if (dtype == PF_F32)
        return pf_attn_favor((float *)out, (const float *)Q, (const float *)K, (const float *)V,
                             shape, opts, favor);
    if (dtype != PF_F16 && dtype != PF_BF16) return PF_EINVAL;
    if (!out || !Q || !K || !V) return PF_EINVAL;
    pf_status st = pf_favor_check(shape, opts, favor);
    if (st != PF_OK) return st;
    if (favor->kernel == PF_KERNEL_OPRF || favor->kernel == PF_KERNEL_SDERF) return PF_ENOTSUP;
    const size_t bh = (size_t)shape->B * (size_t)shape->H, e = pf_dtype_size(dtype);
    const size_t no = bh * (size_t)shape->Lq * (size_t)shape->dv * e;
    const size_t in[4] = {bh * (size_t)shape->Lq * (size_t)shape->d * e,
                          bh * (size_t)shape->Lk * (size_t)shape->d * e,
                          bh * (size_t)shape->Lk * (size_t)shape->dv * e,
                          (size_t)(favor->w_per_head ? shape->H : 1) * (size_t)favor->m *
                              (size_t)shape->d * sizeof(float)};
    const void *ptr[4] = {Q, K, V, favor->W};
    for (int i = 0; i < 4; i++)
        if (bytes_overlap(out, no, ptr[i], in[i])) return PF_EINVAL;
    int complete;
    return favor_run(out, Q, K, V, dtype, shape, opts, favor, NULL, &complete, NULL);
}

/* The forward that also fills `saved` for pf_attn_favor_backward_saved (saved.c). */
pf_status pf_attn_favor_save(float *out, const float *Q, const float *K, const float *V,
                             const pf_shape *shape, const pf_attn_opts *opts,
                             const pf_favor_opts *favor, pf_favor_saved *saved) {
    if (!saved) return PF_EINVAL;
    pf_status st = forward_args(out, Q, K, V, shape, opts, favor);
    if (st != PF_OK) return st;
    st = pf_favor_saved_match(saved, shape, opts, favor, 0);
    if (st != PF_OK) return st;
    int complete;
    saved->filled = 0;
    st = favor_run(out, Q, K, V, PF_F32, shape, opts, favor, saved, &complete, NULL);
    saved->filled = complete;
    return st;
}

/* ---- the float64 reference ---------------------------------------------------------------- */

/* out (dv) = num[0..dv) / num[dv], checked like pf_favor_readout. */
static pf_status readout_f64(float *out, const double *num, int dv) {
    const double den = num[dv];
    pf_status bad = PF_OK;
    if (!isfinite(den))
        bad = PF_ENONFINITE;
    else if (den == 0.0)
        bad = PF_EDOMAIN;
    for (int k = 0; k < dv && bad == PF_OK; k++) {
        double q = num[k] / den;
        if (!isfinite(q)) bad = PF_ENONFINITE;
        out[k] = (float)q;
    }
    if (bad != PF_OK) memset(out, 0, sizeof(float) * (size_t)dv);
    return bad;
}

pf_status pf_attn_favor_ref(float *out, const float *Q, const float *K, const float *V,
                            const pf_shape *shape, const pf_attn_opts *opts,
                            const pf_favor_opts *favor) {
    pf_status st = forward_args(out, Q, K, V, shape, opts, favor);
    if (st != PF_OK) return st;
    const pf_shape s = *shape;
    const pf_attn_sizes n = pf_attn_sizes_of(&s);
    if (pf_nonfinite_f32(Q, n.q) || pf_nonfinite_f32(K, n.k) || pf_nonfinite_f32(V, n.v))
        return PF_ENONFINITE;
    const int r = pf_kernel_width(favor->kernel, favor->m), dv = s.dv, dv1 = s.dv + 1;
    double *phiK = malloc(sizeof(double) * (size_t)s.Lk * (size_t)r);
    double *phiq = malloc(sizeof(double) * (size_t)r);
    double *u = malloc(sizeof(double) * (size_t)favor->m);
    double *KV = malloc(sizeof(double) * (size_t)r * (size_t)dv1);
    double *num = malloc(sizeof(double) * (size_t)dv1);
    pf_kernel_ws kw;
    const int kw_ok = pf_kernel_ws_alloc(&kw, favor->kernel, favor->m, s.d) == 0;
    if (!kw_ok) memset(&kw, 0, sizeof kw);
    if (!phiK || !phiq || !u || !KV || !num || !kw_ok) {
        st = PF_ENOMEM;
        goto done;
    }
    for (int b = 0; b < s.B; b++) {
        const int klen = pf_attn_key_len(opts, b, s.Lk);
        for (int h = 0; h < s.H; h++) {
            const size_t bh = (size_t)b * (size_t)s.H + (size_t)h;
            const float *Qh = Q + bh * (size_t)s.Lq * (size_t)s.d;
            const float *Kh = K + bh * (size_t)s.Lk * (size_t)s.d;
            const float *Vh = V + bh * (size_t)s.Lk * (size_t)dv;
            float *Oh = out + bh * (size_t)s.Lq * (size_t)dv;
            pf_fmap fm = pf_favor_fmap(&s, opts, favor, h);
            const pf_status sb = pf_favor_bind(&fm, &kw, favor, Qh, s.Lq, Kh, klen);
            int bad = sb != PF_OK;
            for (int j = 0; j < klen && !bad; j++)
                bad |= pf_fmap_row_f64(&fm, phiK + (size_t)j * r, u, Kh + (size_t)j * s.d);
            if (bad) {
                st = pf_status_worse(st, sb != PF_OK ? sb : PF_ENONFINITE);
                memset(Oh, 0, sizeof(float) * (size_t)s.Lq * (size_t)dv);
                continue;
            }
            /* KV = sum_j phi(k_j) [v_j | 1]^T: all keys (bidirectional) or, causal, the prefix
             * j <= i, grown one key per query */
            memset(KV, 0, sizeof(double) * (size_t)r * (size_t)dv1);
            const int kend = opts->causal ? 0 : klen;
            for (int j = 0; j < kend; j++) {
                const double *pk = phiK + (size_t)j * r;
                const float *v = Vh + (size_t)j * dv;
                for (int f = 0; f < r; f++) {
                    double *row = KV + (size_t)f * dv1;
                    for (int k = 0; k < dv; k++) row[k] += pk[f] * (double)v[k];
                    row[dv] += pk[f];
                }
            }
            for (int i = 0; i < s.Lq; i++) {
                if (opts->causal && i < klen) {
                    const double *pk = phiK + (size_t)i * r;
                    const float *v = Vh + (size_t)i * dv;
                    for (int f = 0; f < r; f++) {
                        double *row = KV + (size_t)f * dv1;
                        for (int k = 0; k < dv; k++) row[k] += pk[f] * (double)v[k];
                        row[dv] += pk[f];
                    }
                }
                if (pf_fmap_row_f64(&fm, phiq, u, Qh + (size_t)i * s.d)) {
                    st = pf_status_worse(st, PF_ENONFINITE);
                    memset(Oh + (size_t)i * dv, 0, sizeof(float) * (size_t)dv);
                    continue;
                }
                for (int k = 0; k < dv1; k++) num[k] = 0;
                for (int f = 0; f < r; f++) {
                    const double *row = KV + (size_t)f * dv1;
                    for (int k = 0; k < dv1; k++) num[k] += phiq[f] * row[k];
                }
                st = pf_status_worse(st, readout_f64(Oh + (size_t)i * dv, num, dv));
            }
        }
    }
done:
    free(phiK);
    free(phiq);
    free(u);
    free(KV);
    free(num);
    pf_kernel_ws_free(&kw);
    return st;
}
