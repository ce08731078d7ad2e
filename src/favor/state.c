/* state.c: streaming causal FAVOR+ (SPEC §4, last paragraph): the state of H heads of one
 * sequence, advanced a token or a chunk at a time, for decoding.
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
 * (pf_simd_table.decode) instead of two products; no OpenMP region unless the heads are many.
 * For H = 8, d = dv = 64, m = 256 on Zen 4 (bench/bench_decode.c) a token took 34 us, 3.8 times
 * its arithmetic at the 1-thread FMA peak, and takes 16-19 us, 1.8-2.1 times: the projection
 * runs at about the peak, the pass over S (two FMAs and an add per element, and a store) at
 * about half of it, and the feature map's exps and the checks take the rest.
 *
 * A step that fails leaves the state as it was (position, S, M): a step is staged, then
 * committed only when every head succeeded (pf_favor_state_stage / _commit / _abort, which the
 * decoder also uses to make a step of all its layers one transaction). A one-token step needs no
 * copy for that: its own update of S (beta S + k~ w) is kept pending, as the key features, the
 * weighted row and beta, and applied by the next step's pass over S before that step reads S out
 * (the same element operations, so the same bits). A failed step has then only applied the
 * update of the token before it, which was already part of the state. A step of several tokens
 * applies what is pending, copies S and M of a non-empty state first (its chunks update S in
 * place), and restores them on failure. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_common.h"
#include "favor.h"

#ifdef _OPENMP
#include <omp.h>
#endif

struct pf_favor_state {
    int H, d, dv, r, C;
    float *W;         /* (H or 1, m, d): the caller's W, copied */
    pf_fmap *fm;      /* (H): each head's feature map (W pointing into the copy) */
    pf_kernel_ws *kw; /* (H): OPRF: each head's bias (A |w_f|^2) */
    float *SV;        /* (H, r + C, dw): per head S, then C rows of scratch */
    double *M;        /* (H): per head reference; -inf before the first token */
    int64_t pos;      /* tokens consumed */
    int nws;          /* workspaces, one per thread the steps may use */
    pf_favor_ws *ws;  /* (nws) */
    /* one-token steps */
    int w_shared; /* one W for every head: one projection product for all */
    int ldu;      /* row stride of u: r + 1 (a query row's score after it), rounded up */
    float *x;     /* (2H, d): each head's query and key rows, in pairs */
    float *u[2];  /* (2H, ldu) each: their features; in u[cur] the pending updates' keys */
    double *c;    /* (2H): their log factors */
    float *scr;   /* (nws, dw): per thread, the readout */
    /* the pending update of each head (set cur) and the staged step's (set cur ^ 1) */
    int cur;
    float *pw;            /* (2, H, dw): the weighted [v | 1] rows */
    float *pb;            /* (2, H): the betas, e^(M - P) */
    float *zero;          /* (dw + r + 1) zeros: a pass that only applies the pending update */
    unsigned char *pend;  /* (H): head h has an update pending in set cur */
    unsigned char *fresh; /* (H): the staged step wrote head h's S directly (its first key) */
    double *Mn;           /* (H): the staged step's M */
    /* a staged step: 0 none, 1 one token, n > 1 tokens (S and M copied into bak, bakM first
     * when the position was not 0) */
    int staged;
    float *bak;   /* (H, r, dw), allocated at the first step of several tokens */
    double *bakM; /* (H) */
};

void pf_favor_state_free(pf_favor_state *st) {
    if (!st) return;
    if (st->ws)
        for (int t = 0; t < st->nws; t++) pf_favor_ws_free(&st->ws[t]);
    free(st->ws);
    if (st->kw)
        for (int h = 0; h < st->H; h++) pf_kernel_ws_free(&st->kw[h]);
    free(st->kw);
    free(st->fm);
    pf_free(st->W);
    pf_free(st->SV);
    pf_free(st->x);
    pf_free(st->u[0]);
    pf_free(st->u[1]);
    pf_free(st->c);
    pf_free(st->scr);
    pf_free(st->pw);
    pf_free(st->pb);
    pf_free(st->zero);
    pf_free(st->bak);
    free(st->pend);
    free(st->fresh);
    free(st->Mn);
    free(st->bakM);
    free(st->M);
    free(st);
}

pf_status pf_favor_state_create(pf_favor_state **state, int H, int d, int dv, float scale,
                                const pf_favor_opts *favor) {
    if (!state) return PF_EINVAL;
    *state = NULL;
    /* the checks of a causal pass of one token: dims, scale, the FAVOR options, W finite */
    const pf_shape shape = {.B = 1, .H = H, .Lq = 1, .Lk = 1, .d = d, .dv = dv};
    pf_attn_opts opts = pf_attn_opts_default();
    opts.scale = scale;
    opts.causal = 1;
    pf_status s0 = pf_favor_check(&shape, &opts, favor);
    if (s0 != PF_OK) return s0;
    const int r = pf_kernel_width(favor->kernel, favor->m);
    const int C = pf_favor_chunk(favor, INT32_MAX);
    /* every buffer's size in bytes must fit in size_t */
    const size_t wh = favor->w_per_head ? (size_t)H : 1, nw = (size_t)favor->m * (size_t)d;
    const size_t rows = (size_t)r + (size_t)C, dv1 = (size_t)pf_favor_dw(dv);
    if (rows > SIZE_MAX / sizeof(float) / dv1 / (size_t)H) return PF_EINVAL;

    pf_favor_state *st = calloc(1, sizeof *st);
    if (!st) return PF_ENOMEM;
    st->H = H;
    st->d = d;
    st->dv = dv;
    st->r = r;
    st->C = C;
    st->nws = pf_threads(0);
    if (st->nws > H) st->nws = H;
    if (st->nws < 1) st->nws = 1;
    st->W = pf_alloc(wh * nw, sizeof(float));
    st->fm = malloc(sizeof(pf_fmap) * (size_t)H);
    st->SV = pf_alloc((size_t)H * rows * dv1, sizeof(float));
    st->M = malloc(sizeof(double) * (size_t)H);
    st->ws = calloc((size_t)st->nws, sizeof(pf_favor_ws));
    st->kw = calloc((size_t)H, sizeof(pf_kernel_ws));
    st->w_shared = !favor->w_per_head;
    st->ldu = (r + 1 + 15) / 16 * 16;
    st->x = pf_alloc((size_t)2 * (size_t)H * (size_t)d, sizeof(float));
    for (int i = 0; i < 2; i++)
        st->u[i] = pf_alloc((size_t)2 * (size_t)H * (size_t)st->ldu, sizeof(float));
    st->c = pf_alloc((size_t)2 * (size_t)H, sizeof(double));
    st->scr = pf_alloc((size_t)st->nws * dv1, sizeof(float));
    st->pw = pf_alloc((size_t)2 * (size_t)H * dv1, sizeof(float));
    st->pb = pf_alloc((size_t)2 * (size_t)H, sizeof(float));
    st->zero = pf_alloc(dv1 + (size_t)r + 1, sizeof(float));
    st->pend = calloc((size_t)H, 1);
    st->fresh = calloc((size_t)H, 1);
    st->Mn = malloc(sizeof(double) * (size_t)H);
    int ok = st->W && st->fm && st->SV && st->M && st->ws && st->kw && st->x && st->u[0] &&
             st->u[1] && st->c && st->scr && st->pw && st->pb && st->zero && st->pend &&
             st->fresh && st->Mn;
    for (int t = 0; ok && t < st->nws; t++)
        ok = pf_favor_ws_alloc(&st->ws[t], pf_favor_block(1, C), C, r, dv) == 0;
    for (int h = 0; ok && h < H; h++)
        ok = pf_kernel_ws_alloc(&st->kw[h], favor->kernel, favor->m, d) == 0;
    if (!ok) {
        pf_favor_state_free(st);
        return PF_ENOMEM;
    }
    memset(st->zero, 0, sizeof(float) * (dv1 + (size_t)r + 1));
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
    pf_favor_state_reset(st);
    *state = st;
    return PF_OK;
}

pf_status pf_favor_state_reset(pf_favor_state *st) {
    if (!st) return PF_EINVAL;
    const size_t per = ((size_t)st->r + (size_t)st->C) * (size_t)pf_favor_dw(st->dv);
    memset(st->SV, 0, sizeof(float) * per * (size_t)st->H);
    for (int h = 0; h < st->H; h++) st->M[h] = -INFINITY;
    memset(st->pend, 0, (size_t)st->H);
    st->staged = 0;
    st->pos = 0;
    return PF_OK;
}

int64_t pf_favor_state_position(const pf_favor_state *st) {
    return st ? st->pos : 0;
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

/* Head h's S (r rows of dw floats) and its pending update's key features, weighted row and
 * beta (NULL k: none pending). */
static float *head_S(const pf_favor_state *st, int h) {
    return st->SV + (size_t)h * ((size_t)st->r + (size_t)st->C) * (size_t)pf_favor_dw(st->dv);
}
static const float *pending_k(const pf_favor_state *st, int set, int h) {
    return st->u[set] + ((size_t)2 * (size_t)h + 1) * (size_t)st->ldu;
}
static float *pending_w(const pf_favor_state *st, int set, int h) {
    return st->pw + ((size_t)set * (size_t)st->H + (size_t)h) * (size_t)pf_favor_dw(st->dv);
}

/* Applies head h's pending update to its S (a pass of the decoding kernel that reads nothing
 * out): S then holds every token so far, as the chunked path needs it. */
static void apply_pending(pf_favor_state *st, int h, float *o) {
    if (!st->pend[h]) return;
    const int dw = pf_favor_dw(st->dv);
    pf_simd()->decode(head_S(st, h), (size_t)dw, st->r, st->dv + 1, st->zero,
                      pending_k(st, st->cur, h), pending_w(st, st->cur, h),
                      st->pb[(size_t)st->cur * (size_t)st->H + (size_t)h], st->zero, o);
    st->pend[h] = 0;
}

/* Head h of a one-token step whose query and key rows have been projected into u[cur ^ 1] (the
 * query's row 2h, the key's 2h + 1): pf_favor_causal_rows's arithmetic for one row (C = 1), with
 * the pending update of S and the readout made by one pass, and this token's update staged
 * (set cur ^ 1, st->Mn). t: the calling thread's scratch. */
static pf_status step_one_head(pf_favor_state *st, int h, int t, float *out, const float *q,
                               const float *k, const float *v) {
    const pf_fmap *fm = &st->fm[h];
    const int r = st->r, d = st->d, dv = st->dv, dw = pf_favor_dw(dv), nx = st->cur ^ 1;
    float *uq = st->u[nx] + (size_t)2 * (size_t)h * (size_t)st->ldu, *uk = uq + st->ldu;
    double *c = st->c + (size_t)2 * (size_t)h;
    float *S = head_S(st, h);
    const float *qh = q + (size_t)h * (size_t)d, *kh = k + (size_t)h * (size_t)d;
    const float *vh = v + (size_t)h * (size_t)dv;
    float *oh = out + (size_t)h * (size_t)dv;
    const double M = st->M[h];
    st->Mn[h] = M;
    st->fresh[h] = M == -INFINITY;
    if (st->fresh[h]) /* the first key (S = 0, nothing pending): the general path */
        return pf_favor_causal_rows(fm, &st->ws[t], st->C, S, &st->Mn[h], oh, qh, kh, vh, 1, 1, dv,
                                    NULL);
    pf_status s = pf_fmap_map_rows(fm, uq, st->ldu, c, NULL, st->x + (size_t)2 * (size_t)h * d, 2);
    if (s != PF_OK) return s;
    /* P = max(M, c_k), the query's reference and the new M; a = q~.k~ from the plain q~ */
    const double ck = c[1], P = ck > M ? ck : M;
    float a;
    pf_mm(0, 1, 1, 1, r, 1.0f, uq, st->ldu, uk, r, 0.0f, &a, 1);
    float *w = pending_w(st, nx, h), *o = st->scr + (size_t)t * (size_t)dw;
    pf_favor_weighted_values(w, dw, vh, dv, &ck, &P, 0.0, 1); /* e^(c_k - P) [v | 1] */
    const float f = (float)exp(M - P);
    if (P != M)
        for (int i = 0; i < r; i++) uq[i] *= f;
    uq[r] = a;
    /* S = beta' S + k~' w' (the token before, pending), then
     * o = [e^(M - P) q~ | a] [S ; w]; this token's S = e^(M - P) S + k~ w is staged */
    const size_t pc = (size_t)st->cur * (size_t)st->H + (size_t)h;
    pf_simd()->decode(S, (size_t)dw, r, dv + 1, uq, st->pend[h] ? pending_k(st, st->cur, h) : NULL,
                      pending_w(st, st->cur, h), st->pb[pc], w, o);
    st->pend[h] = 0;
    st->pb[(size_t)nx * (size_t)st->H + (size_t)h] = f;
    st->Mn[h] = P;
    return pf_favor_readout(oh, o, 1, dv);
}

/* A step of one token (checked), every head, staged. */
static pf_status step_one(pf_favor_state *st, float *out, const float *q, const float *k,
                          const float *v) {
    const int H = st->H, d = st->d, m = st->fm[0].m;
    const size_t D = (size_t)d;
    float *u = st->u[st->cur ^ 1];
    for (int h = 0; h < H; h++) {
        memcpy(st->x + (size_t)2 * (size_t)h * D, q + (size_t)h * D, sizeof(float) * D);
        memcpy(st->x + ((size_t)2 * (size_t)h + 1) * D, k + (size_t)h * D, sizeof(float) * D);
    }
    /* U = wscale X W^T: one product for every head when they share W (their maps are then the
     * same), else one per head */
    if (st->w_shared)
        pf_mm(0, 0, 2 * H, m, d, st->fm[0].wscale, st->x, d, st->fm[0].Wt, m, 0.0f, u, st->ldu);
    else
        for (int h = 0; h < H; h++)
            pf_mm(0, 0, 2, m, d, st->fm[h].wscale, st->x + (size_t)2 * (size_t)h * D, d,
                  st->fm[h].Wt, m, 0.0f, u + (size_t)2 * (size_t)h * (size_t)st->ldu, st->ldu);
    int worst = PF_OK;
    int nt = st->nws;
    /* a token of one head is ~1 us: threads only for very many heads */
    if ((int64_t)H * st->r * (d + st->dv) < ((int64_t)1 << 22)) nt = 1;
    st->staged = 1;
    if (nt == 1) {
        for (int h = 0; h < H; h++) {
            const int s = (int)step_one_head(st, h, 0, out, q, k, v);
            if (s > worst) worst = s;
        }
    } else {
#pragma omp parallel for num_threads(nt) schedule(static) reduction(max : worst)
        for (int h = 0; h < H; h++) {
            int t = 0;
#ifdef _OPENMP
            t = omp_get_thread_num();
#endif
            const int s = (int)step_one_head(st, h, t, out, q, k, v);
            if (s > worst) worst = s;
        }
    }
    return (pf_status)worst;
}

/* A step of n > 1 tokens (checked), every head, staged: the pending updates applied, S and M
 * copied when the state is not empty, then the causal pass's chunks on S in place. */
static pf_status step_many(pf_favor_state *st, float *out, const float *q, const float *k,
                           const float *v, int n) {
    const int H = st->H, d = st->d, dv = st->dv, C = st->C, dw = pf_favor_dw(dv);
    const size_t nd = (size_t)n * (size_t)d, ndv = (size_t)n * (size_t)dv;
    const size_t rows = (size_t)st->r * (size_t)dw;
    if (st->pos > 0 && !st->bak) {
        st->bak = pf_alloc((size_t)H * rows, sizeof(float));
        st->bakM = malloc(sizeof(double) * (size_t)H);
        if (!st->bak || !st->bakM) {
            pf_free(st->bak);
            free(st->bakM);
            st->bak = NULL;
            st->bakM = NULL;
            return PF_ENOMEM;
        }
    }
    for (int h = 0; h < H; h++) {
        apply_pending(st, h, st->scr);
        if (st->pos > 0) {
            memcpy(st->bak + (size_t)h * rows, head_S(st, h), sizeof(float) * rows);
            st->bakM[h] = st->M[h];
        }
    }
    st->staged = n;
    /* the first piece ends at the next multiple of C */
    const int into = (int)(st->pos % C);
    const int first = into == 0 ? 0 : (C - into < n ? C - into : n);
    int nt = st->nws;
    /* Threads only for big steps: a token of one head is a few microseconds of work, and on a
     * busy machine waking a second thread can cost a scheduler time slice (milliseconds). */
    if ((int64_t)n * H * st->r * (d + dv) < ((int64_t)1 << 22)) nt = 1;

    int worst = PF_OK;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(max : worst)
    for (int h = 0; h < H; h++) {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#endif
        pf_favor_ws *ws = &st->ws[t];
        float *SV = head_S(st, h);
        const float *qh = q + (size_t)h * nd, *kh = k + (size_t)h * nd, *vh = v + (size_t)h * ndv;
        float *oh = out + (size_t)h * ndv;
        pf_status s1 = PF_OK, s2 = PF_OK;
        if (first > 0)
            s1 = pf_favor_causal_rows(&st->fm[h], ws, C, SV, &st->M[h], oh, qh, kh, vh, first,
                                      first, dv, NULL);
        if (n > first) {
            const size_t o = (size_t)first;
            s2 = pf_favor_causal_rows(&st->fm[h], ws, C, SV, &st->M[h], oh + o * (size_t)dv,
                                      qh + o * (size_t)d, kh + o * (size_t)d, vh + o * (size_t)dv,
                                      n - first, n - first, dv, NULL);
        }
        const int s = s1 > s2 ? (int)s1 : (int)s2;
        if (s > worst) worst = s;
    }
    return (pf_status)worst;
}

void pf_favor_state_abort(pf_favor_state *st) {
    if (!st || !st->staged) return;
    const size_t rows = (size_t)st->r * (size_t)pf_favor_dw(st->dv);
    for (int h = 0; h < st->H; h++) {
        if (st->staged == 1) {
            /* a head that took its first key wrote S: empty again (M was staged in Mn) */
            if (st->fresh[h]) memset(head_S(st, h), 0, sizeof(float) * rows);
        } else if (st->pos > 0) {
            memcpy(head_S(st, h), st->bak + (size_t)h * rows, sizeof(float) * rows);
            st->M[h] = st->bakM[h];
        } else {
            memset(head_S(st, h), 0, sizeof(float) * rows);
            st->M[h] = -INFINITY;
        }
    }
    st->staged = 0;
}

void pf_favor_state_commit(pf_favor_state *st) {
    if (!st || !st->staged) return;
    if (st->staged == 1) {
        st->cur ^= 1;
        for (int h = 0; h < st->H; h++) {
            st->pend[h] = !st->fresh[h];
            st->M[h] = st->Mn[h];
        }
    }
    st->pos += st->staged;
    st->staged = 0;
}

pf_status pf_favor_state_stage(pf_favor_state *st, float *out, const float *q, const float *k,
                               const float *v, int n) {
    if (!st || !out || !q || !k || !v || n <= 0 || st->staged) return PF_EINVAL;
    const int H = st->H, d = st->d, dv = st->dv;
    const size_t nd = (size_t)n * (size_t)d, ndv = (size_t)n * (size_t)dv;
    if ((size_t)n > SIZE_MAX / sizeof(float) / (size_t)H / (size_t)(d > dv ? d : dv))
        return PF_EINVAL;
    {
        const size_t f = sizeof(float);
        const pf_span outs[1] = {{out, (size_t)H * ndv * f}};
        const pf_span ins[3] = {
            {q, (size_t)H * nd * f}, {k, (size_t)H * nd * f}, {v, (size_t)H * ndv * f}};
        if (pf_aliased(outs, 1, ins, 3)) return PF_EINVAL;
    }
    if (pf_nonfinite_f32(v, (size_t)H * ndv)) return PF_ENONFINITE;
    for (int h = 0; h < H; h++) {
        if (check_rows(&st->fm[h], q + (size_t)h * nd, n) != PF_OK ||
            check_rows(&st->fm[h], k + (size_t)h * nd, n) != PF_OK)
            return PF_ENONFINITE;
    }
    const pf_status s = n == 1 ? step_one(st, out, q, k, v) : step_many(st, out, q, k, v, n);
    if (s != PF_OK) pf_favor_state_abort(st);
    return s;
}

pf_status pf_favor_state_step(pf_favor_state *st, float *out, const float *q, const float *k,
                              const float *v, int n) {
    const pf_status s = pf_favor_state_stage(st, out, q, k, v, n);
    if (s == PF_OK) pf_favor_state_commit(st);
    return s;
}
