/* state.c: streaming causal FAVOR+ (the prefix-sum form of the Performer paper's causal
 * attention): the states of H heads of N sequences, each at its own position, advanced a token at
 * a time (all or some sequences in one call) or by a prompt's chunks (prefill), copied, reset,
 * saved and restored.
 *
 * Per head the state is the causal scan's own: S = sum_j k~_j e^(c_j - M) [v_j | 1] (r x dv+1)
 * referenced to the running key max M (scan.c, pf_favor_causal_rows, does every step), so
 * memory and time per token are O(r dv) per head whatever the position.
 *
 * A step of n tokens is cut at the multiples of the chunk C counted from position 0, exactly
 * where the full causal pass cuts its chunks. So steps whose sizes are multiples of C (the last
 * one may be shorter) run the very same chunk computations as pf_attn_favor and give the same
 * bits, since every product (pf_mm) gives a row the same bits whatever the rows beside it, as
 * long as the full pass scans each head as one
 * block (it cuts a head into scan blocks only when B*H is small and L long: pf_favor_scan_blocks;
 * then the blocks' starting states are sums in another order). Any other step sizes (1 for
 * decoding) split chunks, so sums are associated differently: equal to float rounding.
 *
 * A step of one token (decoding) has its own path, with the bits of the general one (which
 * for one row runs the arithmetic of a chunk of one, so token-by-token steps equal the full
 * pass with C = 1 bit for bit): the queries and keys of every head projected by one product
 * (pf_mm gives each row the bits it gets alone), the same feature map (pf_fmap_map_rows), and
 * the readout q~ S and the update S = beta S + k~ [v | 1]_w in one pass over S
 * (pf_simd_table.decode) instead of two products; the heads share the threads once each has
 * some microseconds of work (step_threads), and one thread runs without an OpenMP region. For
 * H = 8, d = dv = 64, m = 256 on Zen 4 (bench/bench_decode.c) a token on one thread took 34 us,
 * 3.8 times its arithmetic at the 1-thread FMA peak, and takes 16-19 us, 1.8-2.1 times: the
 * projection runs at about the peak, the pass over S (two FMAs and an add per element, and a
 * store) at about half of it, and the feature map's exps and the checks take the rest.
 *
 * A step that fails leaves the state as it was (position, S, M): a step is staged, then
 * committed only when every head of that sequence succeeded (pf_favor_state_stage / _commit /
 * _abort, which the decoder also uses to make a step of all its layers one transaction); the
 * sequences of one call succeed or fail each on its own. A one-token step needs no copy for
 * that: its own update of S (beta S + k~ w) is kept pending, as the key features, the weighted
 * row and beta, and applied by the next step's pass over S before that step reads S out (the
 * same element operations, so the same bits). A failed step has then only applied the update of
 * the token before it, which was already part of the state. A step of several tokens (a prefill)
 * applies what is pending and runs the chunks on a copy of the sequence's S with the chunk
 * scratch after it, copied back on success.
 *
 * A snapshot of one sequence (pf_favor_state_save / _load) is its position, its M and S (the
 * pending update applied first) behind a header that names the shape, the feature map and a
 * fingerprint of W, and a CRC-32 of all of it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "attn_common.h"
#include "favor.h"
#include "io/io.h"

#ifdef _OPENMP
#include <omp.h>
#endif

struct pf_favor_state {
    int N, H, d, dv, r, C, dw;
    float *W;         /* (H or 1, m, d): the caller's W, copied */
    pf_fmap *fm;      /* (H): each head's feature map (W pointing into the copy) */
    pf_kernel_ws *kw; /* (H): OPRF: each head's bias (A |w_f|^2) */
    uint64_t wprint;  /* the fingerprint of W and the maps (snapshots) */
    float *S;         /* (N, H, r, dw): per sequence and head the state */
    double *M;        /* (N, H): its reference; -inf before the first token */
    int64_t *pos;     /* (N): tokens consumed */
    int nws;          /* workspaces, one per thread the steps may use */
    pf_favor_ws *ws;  /* (nws) */
    float *scr;       /* (nws, (r + C + 1) dw): per thread [S ; chunk rows] and a readout row */
    /* one-token steps of up to N sequences */
    int w_shared; /* one W for every head: one projection product for all */
    int ldu;      /* row stride of u: r + 1 (a query row's score after it), rounded up */
    float *x;     /* (N, 2H, d): each head's query and key rows, in pairs */
    float *u;     /* (N, 2H, ldu): their features */
    double *c;    /* (N, 2H): their log factors */
    float *zero;  /* (dw + r + 1) zeros: a pass that only applies the pending update */
    /* per sequence s the pending update of each head (set cur[s]) and the staged step's */
    unsigned char *cur;   /* (N) */
    unsigned char *pend;  /* (N, H): an update is pending in set cur */
    float *pk;            /* (N, 2, H, r): the key features */
    float *pw;            /* (N, 2, H, dw): the weighted [v | 1] rows */
    float *pb;            /* (N, 2, H): the betas, e^(M - P) */
    double *Mn;           /* (N, H): the staged step's M */
    unsigned char *fresh; /* (N, H): the staged step wrote S directly (the head's first key) */
    int *staged;          /* (N): 0 none, 1 one token, n > 1 tokens (in SB) */
    float *SB;            /* (H, r + C, dw): a staged step of several tokens, allocated at the
                             first (one sequence at a time) */
    int sb_seq;           /* the sequence whose step SB holds, or -1 */
};

static size_t nh(const pf_favor_state *st, int s, int h) {
    return (size_t)s * (size_t)st->H + (size_t)h;
}
static float *head_S(const pf_favor_state *st, int s, int h) {
    return st->S + nh(st, s, h) * (size_t)st->r * (size_t)st->dw;
}
/* set `set` (0, 1) of sequence s's pending rows of head h */
static float *pend_k(const pf_favor_state *st, int s, int set, int h) {
    return st->pk + (((size_t)s * 2 + (size_t)set) * (size_t)st->H + (size_t)h) * (size_t)st->r;
}
static float *pend_w(const pf_favor_state *st, int s, int set, int h) {
    return st->pw + (((size_t)s * 2 + (size_t)set) * (size_t)st->H + (size_t)h) * (size_t)st->dw;
}
static float *pend_b(const pf_favor_state *st, int s, int set, int h) {
    return st->pb + ((size_t)s * 2 + (size_t)set) * (size_t)st->H + (size_t)h;
}
static float *thread_scr(const pf_favor_state *st, int t) {
    return st->scr + (size_t)t * ((size_t)st->r + (size_t)st->C + 1) * (size_t)st->dw;
}

void pf_favor_state_free(pf_favor_state *st) {
    if (!st) return;
    if (st->ws)
        for (int t = 0; t < st->nws; t++) pf_favor_ws_free(&st->ws[t]);
    free(st->ws);
    if (st->kw)
        for (int h = 0; h < st->H; h++) pf_kernel_ws_free(&st->kw[h]);
    free(st->kw);
    free(st->fm);
    void *mem[] = {st->W,    st->S,  st->scr, st->x,  st->u, st->c,
                   st->zero, st->pk, st->pw,  st->pb, st->SB};
    for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++) pf_free(mem[i]);
    void *heap[] = {st->M, st->pos, st->cur, st->pend, st->Mn, st->fresh, st->staged};
    for (size_t i = 0; i < sizeof heap / sizeof heap[0]; i++) free(heap[i]);
    free(st);
}

/* FNV-1a over bytes, continuing from h. */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* The fingerprint a snapshot carries: W's bits, the map's kind, sizes, scale, eps and (OPRF)
 * A, so that a state is restored only under the very maps that made it. */
static uint64_t fingerprint(const pf_favor_state *st, size_t nw, const pf_favor_opts *f) {
    uint64_t h = fnv(14695981039346656037ull, st->W, sizeof(float) * nw);
    const int32_t ints[6] = {(int32_t)f->kernel, f->m, st->d, st->dv, f->w_per_head, st->r};
    const float floats[3] = {st->fm[0].sqrt_s, f->eps, f->kernel == PF_KERNEL_OPRF ? f->oprf_a : 0};
    h = fnv(h, ints, sizeof ints);
    return fnv(h, floats, sizeof floats);
}

pf_status pf_favor_state_create_n(pf_favor_state **state, int N, int H, int d, int dv, float scale,
                                  const pf_favor_opts *favor) {
    if (!state) return PF_EINVAL;
    *state = NULL;
    if (N < 1) return PF_EINVAL;
    /* the checks of a causal pass of one token: dims, scale, the FAVOR options, W finite */
    const pf_shape shape = {.B = 1, .H = H, .Lq = 1, .Lk = 1, .d = d, .dv = dv};
    pf_attn_opts opts = pf_attn_opts_default();
    opts.scale = scale;
    opts.causal = 1;
    pf_status s0 = pf_favor_check(&shape, &opts, favor);
    if (s0 != PF_OK) return s0;
    const int r = pf_kernel_width(favor->kernel, favor->m);
    const int C = pf_favor_chunk(favor, INT32_MAX), dw = pf_favor_dw(dv);
    /* every buffer's size in bytes must fit in size_t (pf_alloc refuses those that do not) */
    const size_t wh = favor->w_per_head ? (size_t)H : 1, nw = (size_t)favor->m * (size_t)d;
    const size_t NH = (size_t)N * (size_t)H, R = (size_t)r, DW = (size_t)dw;
    if (NH > SIZE_MAX / 64 / (R + 1) / DW / 2) return PF_EINVAL;

    pf_favor_state *st = calloc(1, sizeof *st);
    if (!st) return PF_ENOMEM;
    st->N = N;
    st->H = H;
    st->d = d;
    st->dv = dv;
    st->r = r;
    st->C = C;
    st->dw = dw;
    st->sb_seq = -1;
    st->nws = pf_threads(0);
    if ((size_t)st->nws > NH) st->nws = (int)NH;
    if (st->nws < 1) st->nws = 1;
    st->w_shared = !favor->w_per_head;
    st->ldu = (r + 1 + 15) / 16 * 16;
    st->W = pf_alloc(wh * nw, sizeof(float));
    st->fm = malloc(sizeof(pf_fmap) * (size_t)H);
    st->kw = calloc((size_t)H, sizeof(pf_kernel_ws));
    st->S = pf_alloc(NH * R * DW, sizeof(float));
    st->M = malloc(sizeof(double) * NH);
    st->pos = calloc((size_t)N, sizeof(int64_t));
    st->ws = calloc((size_t)st->nws, sizeof(pf_favor_ws));
    st->scr = pf_alloc((size_t)st->nws * (R + (size_t)C + 1) * DW, sizeof(float));
    st->x = pf_alloc(2 * NH * (size_t)d, sizeof(float));
    st->u = pf_alloc(2 * NH * (size_t)st->ldu, sizeof(float));
    st->c = pf_alloc(2 * NH, sizeof(double));
    st->zero = pf_alloc(DW + R + 1, sizeof(float));
    st->cur = calloc((size_t)N, 1);
    st->pend = calloc(NH, 1);
    st->pk = pf_alloc(2 * NH * R, sizeof(float));
    st->pw = pf_alloc(2 * NH * DW, sizeof(float));
    st->pb = pf_alloc(2 * NH, sizeof(float));
    st->Mn = malloc(sizeof(double) * NH);
    st->fresh = calloc(NH, 1);
    st->staged = calloc((size_t)N, sizeof(int));
    int ok = st->W && st->fm && st->kw && st->S && st->M && st->pos && st->ws && st->scr && st->x &&
             st->u && st->c && st->zero && st->cur && st->pend && st->pk && st->pw && st->pb &&
             st->Mn && st->fresh && st->staged;
    for (int t = 0; ok && t < st->nws; t++)
        ok = pf_favor_ws_alloc(&st->ws[t], pf_favor_block(1, C), C, r, dv) == 0;
    for (int h = 0; ok && h < H; h++)
        ok = pf_kernel_ws_alloc(&st->kw[h], favor->kernel, favor->m, d) == 0;
    if (!ok) {
        pf_favor_state_free(st);
        return PF_ENOMEM;
    }
    memset(st->zero, 0, sizeof(float) * (DW + R + 1));
    memcpy(st->W, favor->W, sizeof(float) * wh * nw);
    pf_favor_opts own = *favor;
    own.W = st->W;
    for (int h = 0; h < H; h++) {
        /* OPRF: the given A (pf_favor_check insists on one for causal use) */
        st->fm[h] = pf_favor_fmap(&shape, &opts, &own, h);
        pf_status sb = pf_fmap_bind(&st->fm[h], &st->kw[h], favor->oprf_a, NULL, NULL, 0.0);
        if (sb != PF_OK) {
            pf_favor_state_free(st);
            return sb;
        }
    }
    st->wprint = fingerprint(st, wh * nw, favor);
    for (int s = 0; s < N; s++) pf_favor_state_reset_seq(st, s);
    *state = st;
    return PF_OK;
}

pf_status pf_favor_state_create(pf_favor_state **state, int H, int d, int dv, float scale,
                                const pf_favor_opts *favor) {
    return pf_favor_state_create_n(state, 1, H, d, dv, scale, favor);
}

int pf_favor_state_sequences(const pf_favor_state *st) {
    return st ? st->N : 0;
}

pf_status pf_favor_state_reset_seq(pf_favor_state *st, int seq) {
    if (!st || seq < 0 || seq >= st->N || st->staged[seq]) return PF_EINVAL;
    memset(head_S(st, seq, 0), 0, sizeof(float) * (size_t)st->H * (size_t)st->r * (size_t)st->dw);
    for (int h = 0; h < st->H; h++) {
        st->M[nh(st, seq, h)] = -INFINITY;
        st->pend[nh(st, seq, h)] = 0;
    }
    st->pos[seq] = 0;
    return PF_OK;
}

pf_status pf_favor_state_reset(pf_favor_state *st) {
    if (!st) return PF_EINVAL;
    for (int s = 0; s < st->N; s++) {
        st->staged[s] = 0;
        pf_favor_state_reset_seq(st, s);
    }
    st->sb_seq = -1;
    return PF_OK;
}

int64_t pf_favor_state_position(const pf_favor_state *st) {
    return st ? st->pos[0] : 0;
}

int64_t pf_favor_state_position_of(const pf_favor_state *st, int seq) {
    return st && seq >= 0 && seq < st->N ? st->pos[seq] : -1;
}

/* PF_ENONFINITE if a row of X (n, d) holds NaN or Inf, or is so long that u = W x' could
 * overflow float (|x'| max|w| > 1e38, the bound pf_fmap_rows tests): refusing such input up
 * front leaves the state untouched. */
static pf_status check_rows(const pf_fmap *fm, const float *X, int n) {
    const double s = (double)fm->sqrt_s * (double)fm->sqrt_s;
    for (int i = 0; i < n; i++) {
        const float *x = X + (size_t)i * (size_t)fm->d;
        const double sq = pf_sumsq_f64(x, fm->d); /* (8 partial sums: no chain of d adds) */
        if (!(sqrt(s * sq) * fm->wmax <= 1e38)) return PF_ENONFINITE;
    }
    return PF_OK;
}

/* The input checks of n tokens of one sequence, q, k (H, n, d) and v (H, n, dv). */
static pf_status check_tokens(const pf_favor_state *st, const float *q, const float *k,
                              const float *v, int n) {
    const size_t nd = (size_t)n * (size_t)st->d;
    if (pf_nonfinite_f32(v, (size_t)st->H * (size_t)n * (size_t)st->dv)) return PF_ENONFINITE;
    for (int h = 0; h < st->H; h++)
        if (check_rows(&st->fm[h], q + (size_t)h * nd, n) != PF_OK ||
            check_rows(&st->fm[h], k + (size_t)h * nd, n) != PF_OK)
            return PF_ENONFINITE;
    return PF_OK;
}

/* Applies sequence s's pending update of head h to its S (a pass of the decoding kernel that
 * reads nothing out): S then holds every token so far. o: a row of scratch. */
static void apply_pending(pf_favor_state *st, int s, int h, float *o) {
    if (!st->pend[nh(st, s, h)]) return;
    const int c = st->cur[s];
    pf_simd()->decode(head_S(st, s, h), (size_t)st->dw, st->r, st->dv + 1, st->zero,
                      pend_k(st, s, c, h), pend_w(st, s, c, h), *pend_b(st, s, c, h), st->zero, o);
    st->pend[nh(st, s, h)] = 0;
}

/* Head h of sequence s in a one-token step, its query and key rows projected into u at unit i
 * (rows 2 (i H + h) and the next): pf_favor_causal_rows's arithmetic for one row (C = 1), the
 * pending update of S and the readout made by one pass, this token's update staged (set
 * cur[s] ^ 1, Mn). t: the calling thread. */
static pf_status step_one_head(pf_favor_state *st, int s, int h, int i, int t, float *out,
                               const float *q, const float *k, const float *v) {
    const pf_fmap *fm = &st->fm[h];
    const int r = st->r, d = st->d, dv = st->dv, dw = st->dw, cur = st->cur[s], nx = cur ^ 1;
    const size_t row = 2 * ((size_t)i * (size_t)st->H + (size_t)h);
    float *uq = st->u + row * (size_t)st->ldu, *uk = uq + st->ldu;
    double *c = st->c + row;
    float *S = head_S(st, s, h), *scr = thread_scr(st, t);
    const size_t at = (size_t)i * (size_t)st->H + (size_t)h;
    const float *qh = q + at * (size_t)d, *kh = k + at * (size_t)d, *vh = v + at * (size_t)dv;
    float *oh = out + at * (size_t)dv;
    const size_t sh = nh(st, s, h);
    const double M = st->M[sh];
    st->Mn[sh] = M;
    st->fresh[sh] = M == -INFINITY;
    if (st->fresh[sh]) {
        /* the first key (S = 0, nothing pending): the general path, on [S ; chunk rows] */
        memset(scr, 0, sizeof(float) * (size_t)r * (size_t)dw);
        const pf_status s1 = pf_favor_causal_rows(fm, &st->ws[t], st->C, scr, &st->Mn[sh], oh, qh,
                                                  kh, vh, 1, 1, dv, NULL, NULL, NULL);
        memcpy(S, scr, sizeof(float) * (size_t)r * (size_t)dw);
        return s1;
    }
    pf_status s1 = pf_fmap_map_rows(fm, uq, st->ldu, c, NULL, st->x + row * (size_t)d, 2);
    if (s1 != PF_OK) return s1;
    /* P = max(M, c_k), the query's reference and the new M; a = q~.k~ from the plain q~ */
    const double ck = c[1], P = ck > M ? ck : M;
    float a;
    pf_mm(0, 1, 1, 1, r, 1.0f, uq, st->ldu, uk, r, 0.0f, &a, 1);
    float *w = pend_w(st, s, nx, h), *o = scr + ((size_t)r + (size_t)st->C) * (size_t)dw;
    pf_favor_weighted_values(w, dw, vh, dv, &ck, &P, 0.0, 1); /* e^(c_k - P) [v | 1] */
    const float f = (float)exp(M - P);
    if (P != M)
        for (int j = 0; j < r; j++) uq[j] *= f;
    uq[r] = a;
    /* S = beta' S + k~' w' (the token before, pending), then
     * o = [e^(M - P) q~ | a] [S ; w]; this token's S = e^(M - P) S + k~ w is staged */
    pf_simd()->decode(S, (size_t)dw, r, dv + 1, uq, st->pend[sh] ? pend_k(st, s, cur, h) : NULL,
                      pend_w(st, s, cur, h), *pend_b(st, s, cur, h), w, o);
    st->pend[sh] = 0;
    memcpy(pend_k(st, s, nx, h), uk, sizeof(float) * (size_t)r);
    *pend_b(st, s, nx, h) = f;
    st->Mn[sh] = P;
    return pf_favor_readout(oh, o, 1, dv);
}

/* The threads for a step of `units` (sequence, head) pairs, each whole on one thread, and `work`
 * = tokens x H r (d + dv) in all: as many as have 2^16 of work each (two heads' token at r = 256,
 * d = dv = 64, about 4 us), at most the state's. Below that a team's start and join cost what a
 * thread saves. On Zen 4, 2 threads against 1, tokens back to back: 8 such heads 13.5 against
 * 17.9 us a token, 4 heads 7.7 against 9.0; at 2^16 in all 2 heads 4.1 against 4.4 but 4 heads
 * of r = 128 5.4 against 5.0, and below it one thread is faster. Prefills of 8 heads: 2 tokens
 * 60-74 against 89-91 us, 4 tokens 66 against 101, 8 tokens 97 against 161. And no more than
 * the processors the process may run on (omp_get_num_procs): with OMP_NUM_THREADS=3 or 4 on 2
 * cores a token of 8 heads took 37 or 64 us against 18 on one thread. */
static int step_threads(const pf_favor_state *st, int units, int64_t work) {
    int nt = st->nws < units ? st->nws : units;
#ifdef _OPENMP
    const int procs = omp_get_num_procs();
    if (procs >= 1 && nt > procs) nt = procs;
#endif
    const int64_t share = work >> 16;
    return share >= nt ? nt : share > 1 ? (int)share : 1;
}

/* A one-token step of count sequences seq[i] (checked, none staged, their inputs checked:
 * status[i] PF_OK), every head, staged per sequence; status[i] gets each sequence's outcome. */
static void step_one(pf_favor_state *st, float *out, const float *q, const float *k, const float *v,
                     const int32_t *seq, int count, int *status) {
    const int H = st->H, d = st->d;
    const size_t D = (size_t)d;
    for (int i = 0; i < count; i++)
        for (int h = 0; h < H; h++) {
            const size_t at = (size_t)i * (size_t)H + (size_t)h;
            memcpy(st->x + 2 * at * D, q + at * D, sizeof(float) * D);
            memcpy(st->x + (2 * at + 1) * D, k + at * D, sizeof(float) * D);
        }
    /* U = wscale X W^T: one product for every row when the heads share W (their maps are then
     * the same), else one per head (pf_mm: a row's bits do not depend on the rows beside it) */
    if (st->w_shared)
        pf_fmap_project(&st->fm[0], st->u, st->ldu, st->x, 2 * H * count);
    else
        for (int i = 0; i < count; i++)
            for (int h = 0; h < H; h++) {
                const size_t at = 2 * ((size_t)i * (size_t)H + (size_t)h);
                pf_fmap_project(&st->fm[h], st->u + at * (size_t)st->ldu, st->ldu, st->x + at * D,
                                2);
            }
    const int units = count * H;
    const int nt = step_threads(st, units, (int64_t)units * st->r * (d + st->dv));
    for (int i = 0; i < count; i++) st->staged[seq[i]] = 1;
    /* (one thread without a parallel region: entering one costs a token a futex call) */
    if (nt == 1)
        for (int u = 0; u < units; u++) {
            const int i = u / H, s1 = (int)step_one_head(st, seq[i], u % H, i, 0, out, q, k, v);
            if (s1 != PF_OK) status[i] |= 1 << s1;
        }
    else
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int u = 0; u < units; u++) {
            int t = 0;
#ifdef _OPENMP
            t = omp_get_thread_num();
#endif
            const int i = u / H, h = u % H;
            const int s1 = (int)step_one_head(st, seq[i], h, i, t, out, q, k, v);
            if (s1 != PF_OK) {
#pragma omp atomic update
                status[i] |= 1 << s1; /* (the worst is taken below: the set of statuses) */
            }
        }
    for (int i = 0; i < count; i++) {
        int worst = PF_OK;
        for (int b = 0; b < 31; b++)
            if (status[i] & (1 << b)) worst = b;
        status[i] = worst;
    }
}

/* A step of n > 1 tokens of sequence s (checked, inputs checked), every head, staged in SB:
 * the pending updates applied, then the causal pass's chunks on a copy of each head's S. */
static pf_status step_many(pf_favor_state *st, int s, float *out, const float *q, const float *k,
                           const float *v, int n) {
    const int H = st->H, d = st->d, dv = st->dv, C = st->C, dw = st->dw, r = st->r;
    const size_t nd = (size_t)n * (size_t)d, ndv = (size_t)n * (size_t)dv;
    const size_t rows = (size_t)r * (size_t)dw, per = ((size_t)r + (size_t)C) * (size_t)dw;
    if (st->sb_seq >= 0) return PF_EINVAL; /* (another sequence's prefill is staged) */
    if (!st->SB && !(st->SB = pf_alloc((size_t)H * per, sizeof(float)))) return PF_ENOMEM;
    for (int h = 0; h < H; h++) {
        apply_pending(st, s, h, thread_scr(st, 0));
        memcpy(st->SB + (size_t)h * per, head_S(st, s, h), sizeof(float) * rows);
        st->Mn[nh(st, s, h)] = st->M[nh(st, s, h)];
    }
    st->staged[s] = n;
    st->sb_seq = s;
    /* the first piece ends at the next multiple of C */
    const int into = (int)(st->pos[s] % C);
    const int first = into == 0 ? 0 : (C - into < n ? C - into : n);
    const int nt = step_threads(st, H, (int64_t)n * H * r * (d + dv));
    int worst = PF_OK;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(max : worst)
    for (int h = 0; h < H; h++) {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#endif
        pf_favor_ws *ws = &st->ws[t];
        float *SV = st->SB + (size_t)h * per;
        double *M = &st->Mn[nh(st, s, h)];
        const float *qh = q + (size_t)h * nd, *kh = k + (size_t)h * nd, *vh = v + (size_t)h * ndv;
        float *oh = out + (size_t)h * ndv;
        pf_status s1 = PF_OK, s2 = PF_OK;
        if (first > 0)
            s1 = pf_favor_causal_rows(&st->fm[h], ws, C, SV, M, oh, qh, kh, vh, first, first, dv,
                                      NULL, NULL, NULL);
        if (n > first) {
            const size_t o = (size_t)first;
            s2 = pf_favor_causal_rows(&st->fm[h], ws, C, SV, M, oh + o * (size_t)dv,
                                      qh + o * (size_t)d, kh + o * (size_t)d, vh + o * (size_t)dv,
                                      n - first, n - first, dv, NULL, NULL, NULL);
        }
        const int s3 = s1 > s2 ? (int)s1 : (int)s2;
        if (s3 > worst) worst = s3;
    }
    return (pf_status)worst;
}

static void abort_seq(pf_favor_state *st, int s) {
    if (st->staged[s] == 1) {
        /* a head that took its first key wrote S: empty again (M was staged in Mn) */
        for (int h = 0; h < st->H; h++)
            if (st->fresh[nh(st, s, h)])
                memset(head_S(st, s, h), 0, sizeof(float) * (size_t)st->r * (size_t)st->dw);
    } else if (st->staged[s] > 1) {
        st->sb_seq = -1;
    }
    st->staged[s] = 0;
}

static void commit_seq(pf_favor_state *st, int s) {
    const int H = st->H;
    if (st->staged[s] == 1) {
        st->cur[s] ^= 1;
        for (int h = 0; h < H; h++) st->pend[nh(st, s, h)] = !st->fresh[nh(st, s, h)];
    } else if (st->staged[s] > 1) {
        const size_t rows = (size_t)st->r * (size_t)st->dw;
        const size_t per = ((size_t)st->r + (size_t)st->C) * (size_t)st->dw;
        for (int h = 0; h < H; h++)
            memcpy(head_S(st, s, h), st->SB + (size_t)h * per, sizeof(float) * rows);
        st->sb_seq = -1;
    }
    for (int h = 0; h < H; h++) st->M[nh(st, s, h)] = st->Mn[nh(st, s, h)];
    st->pos[s] += st->staged[s];
    st->staged[s] = 0;
}

void pf_favor_state_abort(pf_favor_state *st) {
    if (st) abort_seq(st, 0);
}

void pf_favor_state_commit(pf_favor_state *st) {
    if (st) commit_seq(st, 0);
}

/* The checks every step makes: out aliasing none of q, k, v (sizes for count rows of H heads). */
static int aliased_io(const pf_favor_state *st, const float *out, const float *q, const float *k,
                      const float *v, size_t rows) {
    const size_t f = sizeof(float), H = (size_t)st->H;
    const pf_span outs[1] = {{out, H * rows * (size_t)st->dv * f}};
    const pf_span ins[3] = {{q, H * rows * (size_t)st->d * f},
                            {k, H * rows * (size_t)st->d * f},
                            {v, H * rows * (size_t)st->dv * f}};
    return pf_aliased(outs, 1, ins, 3);
}

pf_status pf_favor_state_stage_seq(pf_favor_state *st, int seq, float *out, const float *q,
                                   const float *k, const float *v, int n) {
    if (!st || !out || !q || !k || !v || n <= 0 || seq < 0 || seq >= st->N || st->staged[seq])
        return PF_EINVAL;
    const int wmax = st->d > st->dv ? st->d : st->dv;
    if ((size_t)n > SIZE_MAX / sizeof(float) / (size_t)st->H / (size_t)wmax) return PF_EINVAL;
    if (aliased_io(st, out, q, k, v, (size_t)n)) return PF_EINVAL;
    pf_status s1 = check_tokens(st, q, k, v, n);
    if (s1 != PF_OK) return s1;
    if (n == 1) {
        const int32_t one = seq;
        int status = PF_OK;
        step_one(st, out, q, k, v, &one, 1, &status);
        s1 = (pf_status)status;
    } else {
        s1 = step_many(st, seq, out, q, k, v, n);
    }
    if (s1 != PF_OK) abort_seq(st, seq);
    return s1;
}

pf_status pf_favor_state_stage(pf_favor_state *st, float *out, const float *q, const float *k,
                               const float *v, int n) {
    return pf_favor_state_stage_seq(st, 0, out, q, k, v, n);
}

pf_status pf_favor_state_prefill(pf_favor_state *st, int seq, float *out, const float *q,
                                 const float *k, const float *v, int n) {
    const pf_status s = pf_favor_state_stage_seq(st, seq, out, q, k, v, n);
    if (s == PF_OK) commit_seq(st, seq);
    return s;
}

pf_status pf_favor_state_step(pf_favor_state *st, float *out, const float *q, const float *k,
                              const float *v, int n) {
    return pf_favor_state_prefill(st, 0, out, q, k, v, n);
}

pf_status pf_favor_state_step_dt(pf_favor_state *st, void *out, const void *q, const void *k,
                                 const void *v, int n, pf_dtype dtype) {
    if (dtype == PF_F32)
        return pf_favor_state_step(st, (float *)out, (const float *)q, (const float *)k,
                                   (const float *)v, n);
    if ((dtype != PF_F16 && dtype != PF_BF16) || !st || !out || !q || !k || !v || n < 1)
        return PF_EINVAL;
    const size_t nd = (size_t)st->H * (size_t)n * (size_t)st->d;
    const size_t ndv = (size_t)st->H * (size_t)n * (size_t)st->dv, e = pf_dtype_size(dtype);
    /* out must not share a byte with the inputs (pf_favor_state_step's contract) */
    const char *o = (const char *)out;
    const struct {
        const char *p;
        size_t bytes;
    } in[3] = {{(const char *)q, nd * e}, {(const char *)k, nd * e}, {(const char *)v, ndv * e}};
    for (int i = 0; i < 3; i++)
        if (o < in[i].p + in[i].bytes && in[i].p < o + ndv * e) return PF_EINVAL;
    float *x = pf_alloc(2 * nd + 2 * ndv, sizeof(float));
    if (!x) return PF_ENOMEM;
    float *qf = x, *kf = x + nd, *vf = x + 2 * nd, *of = vf + ndv;
    pf_rows_to_f32(qf, q, dtype, nd);
    pf_rows_to_f32(kf, k, dtype, nd);
    pf_rows_to_f32(vf, v, dtype, ndv);
    const pf_status status = pf_favor_state_step(st, of, qf, kf, vf, n);
    pf_rows_from_f32(out, dtype, of, ndv);
    pf_free(x);
    return status;
}

pf_status pf_favor_state_step_n(pf_favor_state *st, float *out, const float *q, const float *k,
                                const float *v, const int32_t *seqs, int count,
                                pf_status *statuses) {
    if (!st || !out || !q || !k || !v || count < 1 || count > st->N) return PF_EINVAL;
    if (aliased_io(st, out, q, k, v, (size_t)count)) return PF_EINVAL;
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)count);
    int *status = calloc((size_t)count, sizeof(int));
    unsigned char *seen = calloc((size_t)st->N, 1);
    pf_status worst = seq && status && seen ? PF_OK : PF_ENOMEM;
    for (int i = 0; worst == PF_OK && i < count; i++) {
        seq[i] = seqs ? seqs[i] : i;
        if (seq[i] < 0 || seq[i] >= st->N || seen[seq[i]] || st->staged[seq[i]])
            worst = PF_EINVAL; /* (out of range, named twice, or mid-transaction) */
        else
            seen[seq[i]] = 1;
    }
    if (worst == PF_OK) {
        /* each sequence's inputs checked apart: one bad sequence does not stop the others */
        const size_t H = (size_t)st->H, D = (size_t)st->d, DV = (size_t)st->dv;
        int live = 0;
        for (int i = 0; i < count; i++) {
            const pf_status c1 = check_tokens(st, q + (size_t)i * H * D, k + (size_t)i * H * D,
                                              v + (size_t)i * H * DV, 1);
            if (c1 == PF_OK) {
                live++;
                continue;
            }
            memset(out + (size_t)i * H * DV, 0, sizeof(float) * H * DV);
            status[i] = -(int)c1; /* (kept out of the step below) */
        }
        if (live == count) {
            step_one(st, out, q, k, v, seq, count, status);
        } else if (live > 0) {
            /* (rare: some sequence's inputs refused) the others stepped one at a time */
            for (int i = 0; i < count; i++) {
                if (status[i] < 0) continue;
                const int32_t one = seq[i];
                int s1 = PF_OK;
                step_one(st, out + (size_t)i * H * DV, q + (size_t)i * H * D, k + (size_t)i * H * D,
                         v + (size_t)i * H * DV, &one, 1, &s1);
                status[i] = s1;
            }
        }
        for (int i = 0; i < count; i++) {
            if (status[i] < 0) {
                status[i] = -status[i];
                continue;
            }
            if (status[i] == PF_OK)
                commit_seq(st, seq[i]);
            else
                abort_seq(st, seq[i]);
        }
        for (int i = 0; i < count; i++) {
            if (status[i] > (int)worst) worst = (pf_status)status[i];
            if (statuses) statuses[i] = (pf_status)status[i];
        }
    } else if (statuses) {
        for (int i = 0; i < count; i++) statuses[i] = worst;
    }
    free(seq);
    free(status);
    free(seen);
    return worst;
}

pf_status pf_favor_state_copy_seq(pf_favor_state *st, int dst, int src) {
    if (!st || dst < 0 || dst >= st->N || src < 0 || src >= st->N || st->staged[dst] ||
        st->staged[src])
        return PF_EINVAL;
    if (dst == src) return PF_OK;
    for (int h = 0; h < st->H; h++) apply_pending(st, src, h, thread_scr(st, 0));
    memcpy(head_S(st, dst, 0), head_S(st, src, 0),
           sizeof(float) * (size_t)st->H * (size_t)st->r * (size_t)st->dw);
    for (int h = 0; h < st->H; h++) {
        st->M[nh(st, dst, h)] = st->M[nh(st, src, h)];
        st->pend[nh(st, dst, h)] = 0;
    }
    st->pos[dst] = st->pos[src];
    return PF_OK;
}

/* ---- snapshots --------------------------------------------------------------------------- */

enum { SNAP_VERSION = 1, SNAP_HEAD = 64 };
static const char SNAP_MAGIC[8] = {'P', 'F', 'S', 'T', 'A', 'T', 'E', '\n'};

size_t pf_favor_state_snapshot_bytes(const pf_favor_state *st) {
    if (!st) return 0;
    const size_t H = (size_t)st->H;
    return SNAP_HEAD + H * sizeof(double) +
           H * (size_t)st->r * ((size_t)st->dv + 1) * sizeof(float) + 4;
}

/* The header: magic, version, byte-order mark, H, d, dv, r, kernel, the fingerprint, position. */
static void snap_header(const pf_favor_state *st, int64_t pos, unsigned char *b) {
    memset(b, 0, SNAP_HEAD);
    memcpy(b, SNAP_MAGIC, 8);
    const uint32_t u[7] = {
        SNAP_VERSION,     0x01020304u,     (uint32_t)st->H,           (uint32_t)st->d,
        (uint32_t)st->dv, (uint32_t)st->r, (uint32_t)st->fm[0].kernel};
    memcpy(b + 8, u, sizeof u);
    memcpy(b + 36, &st->wprint, 8);
    memcpy(b + 44, &pos, 8);
}

pf_status pf_favor_state_save(pf_favor_state *st, int seq, void *buf, size_t len) {
    if (!st || !buf || seq < 0 || seq >= st->N || st->staged[seq]) return PF_EINVAL;
    if (len < pf_favor_state_snapshot_bytes(st)) return PF_EINVAL;
    unsigned char *b = buf;
    snap_header(st, st->pos[seq], b);
    const size_t dv1 = (size_t)st->dv + 1;
    unsigned char *p = b + SNAP_HEAD;
    for (int h = 0; h < st->H; h++) {
        apply_pending(st, seq, h, thread_scr(st, 0));
        memcpy(p, &st->M[nh(st, seq, h)], sizeof(double));
        p += sizeof(double);
    }
    for (int h = 0; h < st->H; h++)
        for (int i = 0; i < st->r; i++) {
            memcpy(p, head_S(st, seq, h) + (size_t)i * (size_t)st->dw, sizeof(float) * dv1);
            p += sizeof(float) * dv1;
        }
    const uint32_t crc = (uint32_t)crc32(0L, b, (uInt)(p - b));
    memcpy(p, &crc, 4);
    return PF_OK;
}

pf_status pf_favor_state_load(pf_favor_state *st, int seq, const void *buf, size_t len,
                              char *errmsg, size_t errlen) {
    if (!st || !buf || seq < 0 || seq >= st->N || st->staged[seq])
        return pf_io_fail(PF_EINVAL, errmsg, errlen, "state", "no state, buffer or sequence %d",
                          seq);
    const unsigned char *b = buf;
    const size_t need = pf_favor_state_snapshot_bytes(st);
    if (len < SNAP_HEAD || memcmp(b, SNAP_MAGIC, 8) != 0)
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, "state", "not a performer state snapshot");
    uint32_t u[7];
    memcpy(u, b + 8, sizeof u);
    if (u[0] != SNAP_VERSION || u[1] != 0x01020304u)
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, "state",
                          "snapshot version %u (byte order mark %08x): this library reads "
                          "version %d written on a machine of its byte order",
                          u[0], u[1], SNAP_VERSION);
    if (u[2] != (uint32_t)st->H || u[3] != (uint32_t)st->d || u[4] != (uint32_t)st->dv ||
        u[5] != (uint32_t)st->r)
        return pf_io_fail(PF_EINVAL, errmsg, errlen, "state",
                          "snapshot of H=%u d=%u dv=%u r=%u; this state has H=%d d=%d dv=%d r=%d",
                          u[2], u[3], u[4], u[5], st->H, st->d, st->dv, st->r);
    if (u[6] != (uint32_t)st->fm[0].kernel)
        return pf_io_fail(PF_EINVAL, errmsg, errlen, "state",
                          "snapshot of the %s feature map; this state runs %s",
                          pf_kernel_name((pf_kernel)u[6]), pf_kernel_name(st->fm[0].kernel));
    uint64_t wprint;
    memcpy(&wprint, b + 36, 8);
    if (wprint != st->wprint)
        return pf_io_fail(PF_EINVAL, errmsg, errlen, "state",
                          "snapshot made with another W (or scale, eps, A): fingerprint %016llx, "
                          "this state's %016llx",
                          (unsigned long long)wprint, (unsigned long long)st->wprint);
    if (len != need)
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, "state",
                          "snapshot of %zu bytes, %zu expected (truncated or extended)", len, need);
    uint32_t crc;
    memcpy(&crc, b + need - 4, 4);
    if (crc != (uint32_t)crc32(0L, b, (uInt)(need - 4)))
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, "state", "snapshot corrupted (CRC-32)");
    int64_t pos;
    memcpy(&pos, b + 44, 8);
    if (pos < 0)
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, "state", "snapshot position %lld",
                          (long long)pos);
    /* every check passed: nothing was changed before here */
    const size_t dv1 = (size_t)st->dv + 1, pad = (size_t)st->dw - dv1;
    const unsigned char *p = b + SNAP_HEAD;
    for (int h = 0; h < st->H; h++, p += sizeof(double)) {
        memcpy(&st->M[nh(st, seq, h)], p, sizeof(double));
        st->pend[nh(st, seq, h)] = 0;
    }
    for (int h = 0; h < st->H; h++) {
        float *S = head_S(st, seq, h);
        for (int i = 0; i < st->r; i++, p += sizeof(float) * dv1) {
            memcpy(S + (size_t)i * (size_t)st->dw, p, sizeof(float) * dv1);
            memset(S + (size_t)i * (size_t)st->dw + dv1, 0, sizeof(float) * pad);
        }
    }
    st->pos[seq] = pos;
    return PF_OK;
}

pf_status pf_favor_state_save_file(pf_favor_state *st, int seq, const char *path, char *errmsg,
                                   size_t errlen) {
    if (!st || !path || seq < 0 || seq >= st->N || st->staged[seq])
        return pf_io_fail(PF_EINVAL, errmsg, errlen, path ? path : "state",
                          "no state, path or sequence %d", seq);
    const size_t n = pf_favor_state_snapshot_bytes(st);
    unsigned char *buf = malloc(n);
    if (!buf) return pf_io_fail(PF_ENOMEM, errmsg, errlen, path, "out of memory");
    pf_favor_state_save(st, seq, buf, n);
    pf_io_atomic w;
    pf_status s = pf_io_atomic_begin(&w, path, errmsg, errlen);
    if (s == PF_OK)
        s = pf_io_atomic_finish(&w, path, pf_io_write_all(w.fd, buf, n), errmsg, errlen);
    free(buf);
    return s;
}

pf_status pf_favor_state_load_file(pf_favor_state *st, int seq, const char *path, char *errmsg,
                                   size_t errlen) {
    if (!st || !path || seq < 0 || seq >= st->N || st->staged[seq])
        return pf_io_fail(PF_EINVAL, errmsg, errlen, path ? path : "state",
                          "no state, path or sequence %d", seq);
    int64_t size = 0;
    pf_status s = PF_OK;
    const int fd = pf_io_open_regular(path, &size, &s, errmsg, errlen);
    if (fd < 0) return s;
    const size_t need = pf_favor_state_snapshot_bytes(st);
    if ((uint64_t)size != need) {
        close(fd);
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, path,
                          "%lld bytes, a snapshot of this state has %zu (truncated, or another "
                          "shape)",
                          (long long)size, need);
    }
    unsigned char *buf = malloc(need);
    if (!buf) {
        close(fd);
        return pf_io_fail(PF_ENOMEM, errmsg, errlen, path, "out of memory");
    }
    s = pf_io_read_all(fd, buf, need, path, errmsg, errlen);
    close(fd);
    if (s == PF_OK) {
        char msg[256] = "";
        s = pf_favor_state_load(st, seq, buf, need, msg, sizeof msg);
        if (s != PF_OK) {
            const char *why = strncmp(msg, "state: ", 7) == 0 ? msg + 7 : msg;
            pf_io_fail(s, errmsg, errlen, path, "%s", why);
        }
    }
    free(buf);
    return s;
}
