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

#endif
