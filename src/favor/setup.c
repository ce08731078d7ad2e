/* setup.c: what every FAVOR+ pass starts from: the options' defaults and checks, each head's
 * feature map, the sizes of row blocks and causal chunks, and the per-thread scratch
 * (pf_favor_ws) the forward, the backward and the decoding state share. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_common.h"
#include "favor.h"

pf_favor_opts pf_favor_opts_default(void) {
    pf_favor_opts o = {.kernel = PF_KERNEL_POSITIVE,
                       .W = NULL,
                       .m = 0,
                       .w_per_head = 0,
                       .eps = 0.0f,
                       .chunk = 0,
                       .oprf_a_given = 0,
                       .oprf_a = 0.0f};
    return o;
}

pf_status pf_favor_check(const pf_shape *shape, const pf_attn_opts *opts, const pf_favor_opts *fv) {
    pf_status st = pf_attn_check(shape, opts);
    if (st != PF_OK) return st;
    if (!fv || !fv->W) return PF_EINVAL;
    if (fv->m <= 0 || pf_kernel_width(fv->kernel, fv->m) == 0) return PF_EINVAL;
    if (fv->w_per_head != 0 && fv->w_per_head != 1) return PF_EINVAL;
    if (!isfinite(fv->eps) || fv->eps < 0) return PF_EINVAL;
    if (fv->chunk < 0) return PF_EINVAL;
    if (fv->kernel == PF_KERNEL_OPRF) {
        if (fv->oprf_a_given != 0 && fv->oprf_a_given != 1) return PF_EINVAL;
        if (fv->oprf_a_given && !(isfinite(fv->oprf_a) && fv->oprf_a < 0.125f)) return PF_EINVAL;
        /* a causal A may not look at the sequence (its data statistics would see later tokens) */
        if (opts->causal && !fv->oprf_a_given) return PF_EINVAL;
    }
    /* W holds (H or 1) * m * d floats; that count, in bytes, must fit in size_t */
    size_t nw = (size_t)fv->m * (size_t)shape->d; /* both < 2^31: no overflow */
    size_t heads = fv->w_per_head ? (size_t)shape->H : 1;
    if (nw > SIZE_MAX / sizeof(float) / heads) return PF_EINVAL;
    /* FAVOR#'s A comes from the whole sequence: it has no causal form */
    if (fv->kernel == PF_KERNEL_SDERF && opts->causal) return PF_ENOTSUP;
    if (pf_nonfinite_f32(fv->W, nw * heads)) return PF_ENONFINITE;
    return PF_OK;
}

pf_fmap pf_favor_fmap(const pf_shape *shape, const pf_attn_opts *opts, const pf_favor_opts *fv,
                      int h) {
    const size_t nw = (size_t)fv->m * (size_t)shape->d;
    const float *W = fv->W + (fv->w_per_head ? (size_t)h * nw : 0);
    return pf_fmap_make(fv->kernel, W, fv->m, shape->d, opts->scale, fv->eps);
}

pf_status pf_favor_maps_init(pf_favor_maps *mp, pf_kernel_ws *kw, int heads, const pf_shape *shape,
                             const pf_attn_opts *opts, const pf_favor_opts *fv, int sums) {
    const int fitted =
        fv->kernel == PF_KERNEL_SDERF || (fv->kernel == PF_KERNEL_OPRF && !fv->oprf_a_given);
    mp->one = !fv->w_per_head && !fitted && !sums;
    for (int bh = 0; bh < (mp->one ? 1 : heads); bh++)
        if (pf_kernel_ws_alloc(&kw[bh], fv->kernel, fv->m, shape->d) != 0) return PF_ENOMEM;
    if (mp->one) {
        mp->map = pf_favor_fmap(shape, opts, fv, 0);
        mp->st = pf_favor_bind(&mp->map, &kw[0], fv, NULL, 0, NULL, 0);
    }
    return PF_OK;
}

pf_status pf_favor_maps_head(const pf_favor_maps *mp, pf_fmap *fm, pf_kernel_ws *kw, int bh,
                             const pf_shape *shape, const pf_attn_opts *opts,
                             const pf_favor_opts *fv, const double *sums, const float *Q,
                             const float *K, int klen) {
    if (mp->one) {
        *fm = mp->map;
        return mp->st;
    }
    *fm = pf_favor_fmap(shape, opts, fv, bh % shape->H);
    if (sums)
        return pf_favor_bind_sums(fm, kw, fv,
                                  sums + (size_t)bh * pf_favor_sums_len(fv->kernel, shape->d));
    return pf_favor_bind(fm, kw, fv, Q, shape->Lq, K, klen);
}

/* The causal chunk C: the user's, or 16. Per chunk the masked intra-chunk products cost
 * 2 C^2 (r + dv + 1) flops against 2 C r (2d + 2(dv + 1)) for the features and the state, so
 * the extra work grows as C / d, while the products want C large. Measured with OpenBLAS's
 * AVX-512 small-matrix path (B = 1, H = 8, L = 4096): causal / bidirectional time is lowest at
 * C = 8..20 for d = 16..128 and r = 64..512 (d = 64, r = 256: 1.08 at 16, 1.1 at 32, 1.35 at
 * 64); with pf_mm on AVX-512 (d = 64, r = 256) flat from 8 to 24, 5% more at 32, 8% at 48. */
int pf_favor_chunk(const pf_favor_opts *fv, int L) {
    int C = fv->chunk ? fv->chunk : FAVOR_CHUNK;
    return C < L ? C : L;
}

/* Rows per block of features: FAVOR_BLOCK, or for causal a whole number of chunks near it. */
int pf_favor_block(int causal, int C) {
    if (!causal) return FAVOR_BLOCK;
    return C >= FAVOR_BLOCK ? C : FAVOR_BLOCK / C * C;
}

/* ---- per-thread scratch ------------------------------------------------------------------- */

/* Rounds a count of 4- or 8-byte items up to a whole number of 64-byte lines. */
static size_t lines(size_t n, size_t size) {
    return (n * size + 63) / 64 * 64;
}

int pf_favor_ws_alloc(pf_favor_ws *ws, int nb, int C, int r, int dv) {
    const size_t dv1 = (size_t)pf_favor_dw(dv), R = (size_t)r, NB = (size_t)nb, CC = (size_t)C;
    const size_t sz[9] = {lines(NB * (R + CC), 4),
                          lines(C ? NB * R : 0, 4),
                          lines(NB * dv1, 4),
                          lines(CC * dv1, 4),
                          lines(NB * dv1, 4),
                          lines((R + CC) * dv1, 4),
                          lines(NB, 8),
                          lines(NB, 8),
                          lines(CC, 8)};
    memset(ws, 0, sizeof *ws);
    size_t total = 0;
    for (int i = 0; i < 9; i++) total += sz[i]; /* r, dv, nb, C < 2^31: no overflow */
    char *m = pf_alloc(total, 1);
    if (!m) return -1;
    ws->mem = m;
    float **f[6] = {&ws->phi, &ws->kphi, &ws->vaug, &ws->vs, &ws->o, &ws->state};
    for (int i = 0; i < 6; i++) {
        *f[i] = (float *)m;
        m += sz[i];
    }
    ws->c = (double *)m;
    m += sz[6];
    ws->cq = (double *)m;
    m += sz[7];
    ws->p = (double *)m;
    return 0;
}

int pf_favor_ws_half(pf_favor_ws *ws, pf_dtype dt, int nb, int d, int dv) {
    const size_t NB = (size_t)nb, q = lines(NB * (size_t)d, 4), v = lines(NB * (size_t)dv, 4);
    char *m = pf_alloc(2 * q + 2 * v, 1);
    if (!m) return -1;
    ws->xmem = m;
    ws->xq = (float *)m;
    ws->xk = (float *)(m + q);
    ws->xv = (float *)(m + 2 * q);
    ws->xo = (float *)(m + 2 * q + v);
    ws->dt = dt;
    return 0;
}

void pf_favor_ws_free(pf_favor_ws *ws) {
    if (ws) {
        pf_free(ws->mem);
        pf_free(ws->xmem);
    }
}
