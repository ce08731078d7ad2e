/* attn_common.c: option defaults and the shape/option check shared by every attention. */
#include <math.h>
#include <stdint.h>

#include "attn_common.h"

pf_attn_opts pf_attn_opts_default(void) {
    pf_attn_opts o = {.scale = 0.0f, .causal = 0, .key_len = NULL, .threads = 0};
    return o;
}

/* *acc *= x unless that would pass `limit`; returns 0 on overflow. */
static int mul_checked(size_t *acc, size_t x, size_t limit) {
    if (x != 0 && *acc > limit / x) return 0;
    *acc *= x;
    return 1;
}

pf_status pf_attn_check(const pf_shape *shape, const pf_attn_opts *opts) {
    if (!shape || !opts) return PF_EINVAL;
    const pf_shape *s = shape;
    if (s->B < 1 || s->H < 1 || s->Lq < 1 || s->Lk < 1 || s->d < 1 || s->dv < 1) return PF_EINVAL;
    /* (batch, head) pairs are counted in an int everywhere */
    if ((int64_t)s->B * s->H > INT32_MAX) return PF_EINVAL;
    if (opts->causal != 0 && opts->causal != 1) return PF_EINVAL;
    if (opts->causal && s->Lq != s->Lk) return PF_EINVAL;
    if (opts->threads < 0 || opts->threads > PF_MAX_THREADS) return PF_EINVAL;
    if (!isfinite(opts->scale) || opts->scale < 0) return PF_EINVAL;

    /* Every tensor's byte count (and so every element offset) must fit in size_t; the
     * per-thread scratch (a few blocks of L x max(d, dv)) is far smaller. */
    size_t L = (size_t)(s->Lq > s->Lk ? s->Lq : s->Lk);
    size_t w = (size_t)(s->d > s->dv ? s->d : s->dv);
    size_t n = sizeof(float);
    size_t lim = SIZE_MAX / 4; /* headroom for a few such tensors side by side */
    if (!mul_checked(&n, (size_t)s->B, lim) || !mul_checked(&n, (size_t)s->H, lim) ||
        !mul_checked(&n, L, lim) || !mul_checked(&n, w, lim))
        return PF_EINVAL;

    if (opts->key_len) {
        for (int b = 0; b < s->B; b++) {
            if (opts->key_len[b] < 1 || opts->key_len[b] > s->Lk) return PF_EINVAL;
        }
    }
    return PF_OK;
}

pf_attn_sizes pf_attn_sizes_of(const pf_shape *s) {
    size_t bh = (size_t)s->B * (size_t)s->H;
    pf_attn_sizes n;
    n.q = bh * (size_t)s->Lq * (size_t)s->d;
    n.k = bh * (size_t)s->Lk * (size_t)s->d;
    n.v = bh * (size_t)s->Lk * (size_t)s->dv;
    n.out = bh * (size_t)s->Lq * (size_t)s->dv;
    n.lse = bh * (size_t)s->Lq;
    return n;
}

int pf_attn_key_len(const pf_attn_opts *opts, int b, int Lk) {
    return opts->key_len ? (int)opts->key_len[b] : Lk;
}

static int overlap(pf_span a, pf_span b) {
    if (!a.p || !b.p || !a.bytes || !b.bytes) return 0;
    const char *x = a.p, *y = b.p;
    return x < y + b.bytes && y < x + a.bytes;
}

int pf_aliased(const pf_span *out, int nout, const pf_span *in, int nin) {
    for (int i = 0; i < nout; i++) {
        for (int j = i + 1; j < nout; j++)
            if (overlap(out[i], out[j])) return 1;
        for (int j = 0; j < nin; j++)
            if (overlap(out[i], in[j])) return 1;
    }
    return 0;
}

pf_status pf_attn_alias_check(const pf_shape *shape, const pf_attn_opts *opts, const float *out,
                              const float *lse, const float *dQ, const float *dK, const float *dV,
                              const float *Q, const float *K, const float *V, const float *dout,
                              const float *out_in, const float *lse_in, const float *W,
                              size_t wn) {
    const pf_attn_sizes n = pf_attn_sizes_of(shape);
    const size_t f = sizeof(float);
    const pf_span outs[5] = {{out, n.out * f}, {lse, n.lse * f}, {dQ, n.q * f}, {dK, n.k * f},
                             {dV, n.v * f}};
    const pf_span ins[8] = {{Q, n.q * f},         {K, n.k * f},
                            {V, n.v * f},         {dout, n.out * f},
                            {out_in, n.out * f},  {lse_in, n.lse * f},
                            {W, wn * f},          {opts->key_len, sizeof(int32_t) * (size_t)shape->B}};
    return pf_aliased(outs, 5, ins, 8) ? PF_EINVAL : PF_OK;
}
