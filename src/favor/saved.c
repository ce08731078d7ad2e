/* saved.c: what a FAVOR+ forward keeps for its backward (pf_favor_saved): the stabilised
 * features of every head's queries and keys, their log factors and the per-head state, sized and
 * matched against the shapes and options of the call that reads them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_common.h"
#include "favor.h"

/* ---- what a forward keeps for its backward ------------------------------------------------ */

static int32_t key_len_of(const pf_attn_opts *opts, int b, int Lk) {
    return (int32_t)pf_attn_key_len(opts, b, Lk);
}

pf_status pf_favor_saved_match(const pf_favor_saved *sv, const pf_shape *shape,
                               const pf_attn_opts *opts, const pf_favor_opts *favor, int filled) {
    if (!sv || (filled && !sv->filled)) return PF_EINVAL;
    const pf_shape *a = &sv->shape;
    const pf_favor_opts *f = &sv->favor;
    if (a->B != shape->B || a->H != shape->H || a->Lq != shape->Lq || a->Lk != shape->Lk ||
        a->d != shape->d || a->dv != shape->dv)
        return PF_EINVAL;
    if (sv->opts.scale != opts->scale || sv->opts.causal != opts->causal) return PF_EINVAL;
    for (int b = 0; b < shape->B; b++)
        if (sv->key_len[b] != key_len_of(opts, b, shape->Lk)) return PF_EINVAL;
    if (f->kernel != favor->kernel || f->W != favor->W || f->m != favor->m ||
        f->w_per_head != favor->w_per_head || f->eps != favor->eps || f->chunk != favor->chunk ||
        f->oprf_a_given != favor->oprf_a_given ||
        (favor->oprf_a_given && f->oprf_a != favor->oprf_a))
        return PF_EINVAL;
    return PF_OK;
}

pf_status pf_favor_saved_create(pf_favor_saved **saved, const pf_shape *shape,
                                const pf_attn_opts *opts, const pf_favor_opts *favor,
                                size_t max_bytes) {
    if (!saved) return PF_EINVAL;
    *saved = NULL;
    pf_status st = pf_favor_check(shape, opts, favor);
    if (st != PF_OK) return st;
    const pf_shape s = *shape;
    const size_t H = (size_t)s.B * (size_t)s.H,
                 r = (size_t)pf_kernel_width(favor->kernel, favor->m);
    const size_t dw = (size_t)pf_favor_dw(s.dv), Lq = (size_t)s.Lq, Lk = (size_t)s.Lk;
    const size_t nkv = opts->causal ? 0 : r * dw;
    const size_t C = opts->causal ? (size_t)pf_favor_chunk(favor, s.Lq) : 0;
    /* sizes in floats (doubles count two), each rounded up to a 64-byte line */
    const size_t rows = Lq > Lk ? Lq : Lk;
    if (rows > SIZE_MAX / 8 / (r + C) / H) return PF_ENOMEM;
    /* every head's K~^T [V|1] and reference; then as many heads' features as max_bytes allows
     * (floats; doubles count two; each array rounded up to a 64-byte line) */
    const size_t fixed = H * nkv + 2 * H + 8 * 16 + (sizeof(pf_favor_saved) + 4 * H) / 4 + 1;
    const size_t per = Lq * r + Lk * r + Lq + Lk + 2 * Lk + Lq * C;
    size_t keep = H;
    if (max_bytes) keep = max_bytes / 4 <= fixed ? 0 : (max_bytes / 4 - fixed) / per;
    keep = keep < H ? keep : H;
    size_t sz[8] = {keep * Lq * r, keep * Lk * r, keep * Lq, keep * Lk,
                    2 * keep * Lk, H * nkv,       2 * H,     keep * Lq * C};
    size_t total = 0;
    for (int i = 0; i < 8; i++) {
        sz[i] = (sz[i] + 15) / 16 * 16;
        if (sz[i] > SIZE_MAX / 4 - total) return PF_ENOMEM;
        total += sz[i];
    }
    pf_favor_saved *sv = calloc(1, sizeof *sv);
    float *mem = pf_alloc(total, sizeof(float));
    int32_t *kl = malloc(sizeof(int32_t) * (size_t)s.B);
    if (!sv || !mem || !kl) {
        free(sv);
        pf_free(mem);
        free(kl);
        return PF_ENOMEM;
    }
    sv->shape = s;
    sv->opts = *opts;
    sv->favor = *favor;
    sv->r = (int)r;
    sv->dw = (int)dw;
    sv->nkeep = (int)keep;
    sv->key_len = kl;
    for (int b = 0; b < s.B; b++) kl[b] = key_len_of(opts, b, s.Lk);
    sv->opts.key_len = kl;
    float *m = mem;
    sv->qf = m, m += sz[0];
    sv->kf = m, m += sz[1];
    sv->qamax = m, m += sz[2];
    sv->kamax = m, m += sz[3];
    sv->kc = (double *)m, m += sz[4];
    sv->kv = opts->causal ? NULL : m, m += sz[5];
    sv->kvm = (double *)m, m += sz[6];
    sv->ka = opts->causal ? m : NULL;
    sv->C = (int)C;
    sv->bytes = total * sizeof(float) + sizeof *sv + sizeof(int32_t) * (size_t)s.B;
    *saved = sv;
    return PF_OK;
}

void pf_favor_saved_free(pf_favor_saved *saved) {
    if (!saved) return;
    pf_free(saved->qf);
    free(saved->key_len);
    free(saved);
}

size_t pf_favor_saved_bytes(const pf_favor_saved *saved) {
    return saved ? saved->bytes : 0;
}

int pf_favor_saved_heads(const pf_favor_saved *saved) {
    return saved ? saved->nkeep : 0;
}

void pf_favor_saved_clear(pf_favor_saved *saved) {
    if (saved) saved->filled = 0;
}
