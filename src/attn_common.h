/* attn_common.h: what the attention files (exact, FAVOR) share beyond pf_attn_check. */
#ifndef PF_ATTN_COMMON_H
#define PF_ATTN_COMMON_H

#include <stddef.h>

#include "internal.h"

/* Element counts of the tensors of a shape that passed pf_attn_check (which guarantees that
 * none of these products overflows size_t, even in bytes). */
typedef struct pf_attn_sizes {
    size_t q;   /* B*H*Lq*d:  Q, dQ */
    size_t k;   /* B*H*Lk*d:  K, dK */
    size_t v;   /* B*H*Lk*dv: V, dV */
    size_t out; /* B*H*Lq*dv: out, dout */
    size_t lse; /* B*H*Lq:    lse */
} pf_attn_sizes;

PF_INTERNAL pf_attn_sizes pf_attn_sizes_of(const pf_shape *shape);

/* The number of valid keys of batch b: opts->key_len[b], or Lk when key_len is NULL.
 * The options must have passed pf_attn_check. */
PF_INTERNAL int pf_attn_key_len(const pf_attn_opts *opts, int b, int Lk);

/* Outputs must not overlap one another or an input (the kernels read inputs after writing
 * outputs): a span of bytes each, NULL or empty ones skipped. 1 if any does. */
typedef struct pf_span {
    const void *p;
    size_t bytes;
} pf_span;
PF_INTERNAL int pf_aliased(const pf_span *out, int nout, const pf_span *in, int nin);

/* The attention calls' case: outputs out (Lq x dv) and lse (Lq), or dQ, dK, dV, against Q, K,
 * V, dout and out (as inputs), lse, W (wn floats) and the key lengths. NULL: not an argument.
 * PF_EINVAL if they overlap (the shape and options must have passed pf_attn_check). */
PF_INTERNAL pf_status pf_attn_alias_check(const pf_shape *shape, const pf_attn_opts *opts,
                                          const float *out, const float *lse, const float *dQ,
                                          const float *dK, const float *dV, const float *Q,
                                          const float *K, const float *V, const float *dout,
                                          const float *out_in, const float *lse_in,
                                          const float *W, size_t wn);

#endif
