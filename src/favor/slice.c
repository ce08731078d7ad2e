/* slice.c: FAVOR+ in slices of a sequence (performer.h, "FAVOR+ in slices"), for
 * sequence parallelism: what a slice gives out (its fit statistics, its key state, d/dS of its
 * queries) and what it starts from (the combined state of other slices, their d/dS).
 *
 * No second copy of the arithmetic: the forward and backward are forward.c's and
 * backward.c's drivers, told by a pf_favor_ext to take a head's starting (causal) or total
 * (bidirectional) state from outside instead of making it, or to give their own out; the state
 * is the causal scan's (S referenced to its running maximum), and combining states is
 * pf_favor_combine, the scan blocks' own. So one slice holding a whole sequence runs exactly the
 * single process's operations and gives its bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_common.h"
#include "favor.h"

#ifdef _OPENMP
#include <omp.h>
#endif

size_t pf_favor_slice_sums_len(const pf_shape *shape, const pf_favor_opts *favor) {
    if (!shape || !favor || shape->d < 1) return 0;
    if (favor->kernel == PF_KERNEL_OPRF && favor->oprf_a_given) return 0;
    return pf_favor_sums_len(favor->kernel, shape->d);
}

/* Outputs (outs) against every tensor a slice call reads: Q, K, V, dout and out (as inputs),
 * the state S and its references M, R, W, the sums and the key lengths; the shape and options
 * must have passed the checks. 1 if any overlap. */
static int slice_aliased(const pf_span *outs, int nout, const pf_shape *shape,
                         const pf_attn_opts *opts, const pf_favor_opts *favor, const float *Q,
                         const float *K, const float *V, const float *dout, const float *out,
                         const float *S, const double *M, const float *R, const double *sums) {
    const pf_attn_sizes n = pf_attn_sizes_of(shape);
    const size_t heads = (size_t)shape->B * (size_t)shape->H, f = sizeof(float);
    const size_t ns =
        heads * (size_t)pf_kernel_width(favor->kernel, favor->m) * ((size_t)shape->dv + 1);
    const size_t wn =
        (size_t)(favor->w_per_head ? shape->H : 1) * (size_t)favor->m * (size_t)shape->d;
    const pf_span ins[11] = {{Q, n.q * f},
                             {K, n.k * f},
                             {V, n.v * f},
                             {dout, n.out * f},
                             {out, n.out * f},
                             {S, ns * f},
                             {M, heads * sizeof(double)},
                             {R, ns * f},
                             {favor->W, wn * f},
                             {sums, heads * pf_favor_slice_sums_len(shape, favor) * sizeof(double)},
                             {opts->key_len, sizeof(int32_t) * (size_t)shape->B}};
    return pf_aliased(outs, nout, ins, 11);
}

pf_status pf_favor_slice_check(const pf_shape *shape, const pf_attn_opts *opts,
                               const pf_favor_opts *favor) {
    if (!shape || !opts) return PF_EINVAL;
    pf_attn_opts o = *opts;
    o.key_len = NULL;
    pf_status st = pf_favor_check(shape, &o, favor);
    if (st != PF_OK) return st;
    if (opts->key_len)
        for (int b = 0; b < shape->B; b++)
            if (opts->key_len[b] < 0 || opts->key_len[b] > shape->Lk) return PF_EINVAL;
    return PF_OK;
}

/* The checks of every slice function, and sums present when the map fits to them. */
static pf_status slice_check(const pf_shape *shape, const pf_attn_opts *opts,
                             const pf_favor_opts *favor, const double *sums) {
    pf_status st = pf_favor_slice_check(shape, opts, favor);
    if (st != PF_OK) return st;
    if (pf_favor_slice_sums_len(shape, favor) > 0 && !sums) return PF_EINVAL;
    return PF_OK;
}

/* A state given from outside: references finite or -inf (causal: -inf only where the slice's
 * first key is valid), S finite where the reference is. */
static pf_status state_check(const float *S, const double *M, const pf_shape *shape,
                             const pf_attn_opts *opts, const pf_favor_opts *favor) {
    if (!S || !M) return PF_EINVAL;
    const size_t n = (size_t)pf_kernel_width(favor->kernel, favor->m) * ((size_t)shape->dv + 1);
    for (int b = 0; b < shape->B; b++) {
        const int klen = pf_attn_key_len(opts, b, shape->Lk);
        for (int h = 0; h < shape->H; h++) {
            const size_t bh = (size_t)b * (size_t)shape->H + (size_t)h;
            if (isnan(M[bh]) || M[bh] == INFINITY) return PF_EINVAL;
            if (M[bh] == -INFINITY && opts->causal && klen == 0) return PF_EINVAL;
            if (M[bh] > -INFINITY && pf_nonfinite_f32(S + bh * n, n)) return PF_ENONFINITE;
        }
    }
    return PF_OK;
}

pf_status pf_favor_slice_sums(double *sums, const float *Q, const float *K, const pf_shape *shape,
                              const pf_attn_opts *opts, const pf_favor_opts *favor) {
    if (!sums || !Q || !K) return PF_EINVAL;
    pf_status st = slice_check(shape, opts, favor, sums);
    if (st != PF_OK) return st;
    const size_t len = pf_favor_slice_sums_len(shape, favor);
    if (len == 0) return PF_EINVAL;
    {
        const pf_span outs[1] = {
            {sums, (size_t)shape->B * (size_t)shape->H * len * sizeof(double)}};
        if (slice_aliased(outs, 1, shape, opts, favor, Q, K, NULL, NULL, NULL, NULL, NULL, NULL,
                          NULL))
            return PF_EINVAL;
    }
    const pf_shape s = *shape;
    const int heads = s.B * s.H;
    for (int bh = 0; bh < heads; bh++) {
        const int klen = pf_attn_key_len(opts, bh / s.H, s.Lk);
        if (pf_nonfinite_f32(Q + (size_t)bh * (size_t)s.Lq * (size_t)s.d,
                             (size_t)s.Lq * (size_t)s.d) ||
            pf_nonfinite_f32(K + (size_t)bh * (size_t)s.Lk * (size_t)s.d,
                             (size_t)klen * (size_t)s.d))
            return PF_ENONFINITE;
    }
    const int sd = favor->kernel == PF_KERNEL_SDERF;
    int nomem = 0;
    /* one head per unit; a head's BLAS products on its thread alone (bits independent of the
     * thread count) */
#pragma omp parallel num_threads(pf_threads(opts->threads))
    {
        float *fwork = sd ? pf_alloc((size_t)s.d * (size_t)s.d, sizeof(float)) : NULL;
        if (sd && !fwork) {
#pragma omp atomic write
            nomem = 1;
        }
        pf_blas_pin();
#pragma omp for schedule(dynamic, 1)
        for (int bh = 0; bh < heads; bh++) {
            if (sd && !fwork) continue;
            pf_favor_sums(sums + (size_t)bh * len, favor->kernel,
                          Q + (size_t)bh * (size_t)s.Lq * (size_t)s.d, s.Lq,
                          K + (size_t)bh * (size_t)s.Lk * (size_t)s.d,
                          pf_attn_key_len(opts, bh / s.H, s.Lk), s.d, fwork);
        }
        pf_free(fwork);
    }
    return nomem ? PF_ENOMEM : PF_OK;
}

pf_status pf_favor_slice_state(float *S, double *M, const float *K, const float *V,
                               const pf_shape *shape, const pf_attn_opts *opts,
                               const pf_favor_opts *favor, const double *sums) {
    if (!S || !M || !K || !V) return PF_EINVAL;
    pf_status st = slice_check(shape, opts, favor, sums);
    if (st != PF_OK) return st;
    {
        const size_t heads = (size_t)shape->B * (size_t)shape->H;
        const pf_span outs[2] = {{S, heads * (size_t)pf_kernel_width(favor->kernel, favor->m) *
                                         ((size_t)shape->dv + 1) * sizeof(float)},
                                 {M, heads * sizeof(double)}};
        if (slice_aliased(outs, 2, shape, opts, favor, NULL, K, V, NULL, NULL, NULL, NULL, NULL,
                          sums))
            return PF_EINVAL;
    }
    const pf_favor_ext ext = {.sums = sums, .Sout = S, .Mout = M};
    st = pf_favor_forward_ext(NULL, NULL, K, V, shape, opts, favor, &ext);
    if (st != PF_OK) {
        /* the contract: a failure empties every head, not only the one that failed */
        const size_t heads = (size_t)shape->B * (size_t)shape->H;
        const size_t n = (size_t)pf_kernel_width(favor->kernel, favor->m) * ((size_t)shape->dv + 1);
        memset(S, 0, sizeof(float) * heads * n);
        for (size_t h = 0; h < heads; h++) M[h] = -INFINITY;
    }
    return st;
}

/* A state's reference may be finite or -inf (empty); a gradient's also +inf (empty). */
static int refs_ok(const double *M, int heads, int plus_inf) {
    for (int h = 0; h < heads; h++)
        if (isnan(M[h]) || (M[h] == INFINITY && !plus_inf)) return 0;
    return 1;
}

pf_status pf_favor_slice_combine(float *S, double *M, const float *S2, const double *M2, int heads,
                                 int r, int dv) {
    if (!S || !M || !S2 || !M2 || heads < 1 || r < 1 || dv < 1) return PF_EINVAL;
    if (!refs_ok(M, heads, 0) || !refs_ok(M2, heads, 0)) return PF_EINVAL;
    const size_t n = (size_t)r * ((size_t)dv + 1);
    for (size_t h = 0; h < (size_t)heads; h++)
        pf_favor_combine(S + h * n, &M[h], S2 + h * n, M2[h], n);
    return PF_OK;
}

pf_status pf_favor_slice_dcombine(float *G, double *MG, const float *G2, const double *MG2,
                                  int heads, int r, int dv) {
    if (!G || !MG || !G2 || !MG2 || heads < 1 || r < 1 || dv < 1) return PF_EINVAL;
    if (!refs_ok(MG, heads, 1) || !refs_ok(MG2, heads, 1)) return PF_EINVAL;
    const size_t n = (size_t)r * ((size_t)dv + 1);
    for (size_t h = 0; h < (size_t)heads; h++) {
        float *g = G + h * n;
        const float *g2 = G2 + h * n;
        if (isinf(MG2[h])) continue; /* (an empty gradient) */
        if (isinf(MG[h])) {
            memcpy(g, g2, sizeof(float) * n);
            MG[h] = MG2[h];
            continue;
        }
        /* the smaller reference: every factor <= 1 */
        const double Mn = MG[h] < MG2[h] ? MG[h] : MG2[h];
        const float a = (float)exp(Mn - MG[h]), b = (float)exp(Mn - MG2[h]);
        for (size_t i = 0; i < n; i++) g[i] = a * g[i] + b * g2[i];
        MG[h] = Mn;
    }
    return PF_OK;
}

pf_status pf_favor_slice_attn(float *out, const float *Q, const float *K, const float *V,
                              const float *S, const double *M, const pf_shape *shape,
                              const pf_attn_opts *opts, const pf_favor_opts *favor,
                              const double *sums) {
    if (!out || !Q || !K || !V) return PF_EINVAL;
    pf_status st = slice_check(shape, opts, favor, sums);
    if (st == PF_OK) st = state_check(S, M, shape, opts, favor);
    if (st != PF_OK) return st;
    const pf_span outs[1] = {{out, pf_attn_sizes_of(shape).out * sizeof(float)}};
    if (slice_aliased(outs, 1, shape, opts, favor, Q, K, V, NULL, NULL, S, M, NULL, sums))
        return PF_EINVAL;
    const pf_favor_ext ext = {.sums = sums, .S = S, .M = M};
    return pf_favor_forward_ext(out, Q, K, V, shape, opts, favor, &ext);
}

pf_status pf_favor_slice_dstate(float *dS, const float *dout, const float *Q, const float *K,
                                const float *V, const float *out, const float *S, const double *M,
                                const pf_shape *shape, const pf_attn_opts *opts,
                                const pf_favor_opts *favor, const double *sums) {
    if (!dS || !dout || !Q || !K || !V) return PF_EINVAL;
    pf_status st = slice_check(shape, opts, favor, sums);
    if (st == PF_OK) st = state_check(S, M, shape, opts, favor);
    if (st != PF_OK) return st;
    {
        const pf_span outs[1] = {{dS, (size_t)shape->B * (size_t)shape->H *
                                          (size_t)pf_kernel_width(favor->kernel, favor->m) *
                                          ((size_t)shape->dv + 1) * sizeof(float)}};
        if (slice_aliased(outs, 1, shape, opts, favor, Q, K, V, dout, out, S, M, NULL, sums))
            return PF_EINVAL;
    }
    const pf_favor_ext ext = {.sums = sums, .S = S, .M = M, .dS = dS};
    return pf_favor_backward_ext(NULL, NULL, NULL, dout, Q, K, V, out, shape, opts, favor, &ext);
}

pf_status pf_favor_slice_backward(float *dQ, float *dK, float *dV, const float *dout,
                                  const float *Q, const float *K, const float *V, const float *out,
                                  const float *S, const double *M, const float *R,
                                  const pf_shape *shape, const pf_attn_opts *opts,
                                  const pf_favor_opts *favor, const double *sums) {
    if (!dQ || !dK || !dV || !dout || !Q || !K || !V) return PF_EINVAL;
    pf_status st = slice_check(shape, opts, favor, sums);
    if (st == PF_OK) st = state_check(S, M, shape, opts, favor);
    if (st != PF_OK) return st;
    if (!opts->causal && !R) return PF_EINVAL;
    {
        const pf_attn_sizes ns = pf_attn_sizes_of(shape);
        const pf_span outs[3] = {
            {dQ, ns.q * sizeof(float)}, {dK, ns.k * sizeof(float)}, {dV, ns.v * sizeof(float)}};
        if (slice_aliased(outs, 3, shape, opts, favor, Q, K, V, dout, out, S, M, R, sums))
            return PF_EINVAL;
    }
    const size_t n = (size_t)pf_kernel_width(favor->kernel, favor->m) * ((size_t)shape->dv + 1);
    if (R && pf_nonfinite_f32(R, (size_t)shape->B * (size_t)shape->H * n)) return PF_ENONFINITE;
    const pf_favor_ext ext = {.sums = sums, .S = S, .M = M, .R = R};
    return pf_favor_backward_ext(dQ, dK, dV, dout, Q, K, V, out, shape, opts, favor, &ext);
}
