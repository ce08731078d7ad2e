/* favor_state.c: streaming causal FAVOR+ (SPEC §4, last paragraph): the state of H heads of one
 * sequence, advanced a token or a chunk at a time, for decoding.
 *
 * Per head the state is the causal scan's own: S = sum_j k~_j e^(c_j - M) [v_j | 1] (r x dv+1)
 * referenced to the running key max M (attn_favor.c, pf_favor_causal_rows, does every step), so
 * memory and time per token are O(r dv) per head whatever the position.
 *
 * A step of n tokens is cut at the multiples of the chunk C counted from position 0, exactly
 * where the full causal pass cuts its chunks. So steps whose sizes are multiples of C (the last
 * one may be shorter) run the very same chunk computations as pf_attn_favor and give the same
 * bits, since every product (pf_mm) gives a row the same bits whatever the rows beside it, as
 * long as the full pass scans each head as one
 * block (it cuts a head into scan blocks only when B*H is small and L long: pf_favor_scan_blocks;
 * then the blocks' starting states are sums in another order). Any other step sizes (1 for
 * decoding) split chunks, so sums are associated differently: equal to float rounding. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    int ok = st->W && st->fm && st->SV && st->M && st->ws && st->kw;
    for (int t = 0; ok && t < st->nws; t++)
        ok = pf_favor_ws_alloc(&st->ws[t], pf_favor_block(1, C), C, r, dv) == 0;
    for (int h = 0; ok && h < H; h++)
        ok = pf_kernel_ws_alloc(&st->kw[h], favor->kernel, favor->m, d) == 0;
    if (!ok) {
        pf_favor_state_free(st);
        return PF_ENOMEM;
    }
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
        double sq = 0;
        for (int k = 0; k < fm->d; k++) sq += (double)x[k] * (double)x[k];
        if (!(sqrt(s * sq) * fm->wmax <= 1e38)) return PF_ENONFINITE;
    }
    return PF_OK;
}

pf_status pf_favor_state_step(pf_favor_state *st, float *out, const float *q, const float *k,
                              const float *v, int n) {
    if (!st || !out || !q || !k || !v || n <= 0) return PF_EINVAL;
    const int H = st->H, d = st->d, dv = st->dv, C = st->C;
    const size_t nd = (size_t)n * (size_t)d, ndv = (size_t)n * (size_t)dv;
    if ((size_t)n > SIZE_MAX / sizeof(float) / (size_t)H / (size_t)(d > dv ? d : dv))
        return PF_EINVAL;
    if (pf_nonfinite_f32(v, (size_t)H * ndv)) return PF_ENONFINITE;
    for (int h = 0; h < H; h++) {
        if (check_rows(&st->fm[h], q + (size_t)h * nd, n) != PF_OK ||
            check_rows(&st->fm[h], k + (size_t)h * nd, n) != PF_OK)
            return PF_ENONFINITE;
    }
    /* the first piece ends at the next multiple of C */
    const int into = (int)(st->pos % C);
    const int first = into == 0 ? 0 : (C - into < n ? C - into : n);
    const size_t per = ((size_t)st->r + (size_t)C) * (size_t)pf_favor_dw(dv);
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
        float *SV = st->SV + (size_t)h * per;
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
    st->pos += n;
    return (pf_status)worst;
}
