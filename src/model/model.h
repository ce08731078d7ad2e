/* model.h: the language model's insides, shared by the files of src/model and the tests;
 * not installed.
 *
 * Layout follows karpathy/llm.c (train_gpt2.c): each layer is a pair of free functions,
 * x_forward(out, ..., inp, dims) and x_backward(dinp, dparams..., dout, saved..., dims);
 * parameters, their gradients and the two AdamW moments each live in one allocation, with named
 * pointers into it. Every array carries its shape in a comment. N = B*T rows of a (B,T,.) tensor.
 *
 * Gradient conventions: parameter gradients (dweight, dbias, dwte, ...) are ACCUMULATED (+=);
 * input gradients are overwritten (=), except layernorm_backward's dinp, which accumulates:
 * it is the residual stream's gradient, to which every block adds. Each function says.
 *
 * Determinism: work is split into blocks whose boundaries depend on the shapes only (never on
 * the thread count), and every reduction runs in a fixed order, so results are bit-identical at
 * any thread count. Matrix products are cblas_sgemm (OpenBLAS pinned to one thread) per
 * block. */
#ifndef PF_MODEL_H
#define PF_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* ---- layers (layers.c) ------------------------------------------------------------------- */

/* out (B,T,C) = wte[inp] + wpe[t]; inp (B,T) bytes, wte (V,C), wpe (context,C) or NULL. */
PF_INTERNAL void encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe,
                                 int B, int T, int C);
/* dwte (V,C) += dout at each token's row; dwpe (context,C) (if not NULL) += dout summed over b.
 * dout (B,T,C). */
PF_INTERNAL void encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp,
                                  int B, int T, int C);

/* out (N,C) = (inp - mean) * rstd * weight + bias; mean, rstd (N) saved for the backward. */
PF_INTERNAL void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                   const float *weight, const float *bias, int N, int C);
/* dinp (N,C) +=, dweight (C) +=, dbias (C) +=. */
PF_INTERNAL void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const float *inp, const float *weight, const float *mean,
                                    const float *rstd, int N, int C);

/* out (N,OC) = inp (N,C) weight^T + bias; weight (OC,C), bias (OC) or NULL. */
PF_INTERNAL void matmul_forward(float *out, const float *inp, const float *weight,
                                const float *bias, int N, int C, int OC);
/* dinp (N,C) = dout weight (overwritten; skipped if NULL); dweight (OC,C) += dout^T inp;
 * dbias (OC) += column sums of dout (skipped if NULL). dout (N,OC). */
PF_INTERNAL void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int N, int C, int OC);

/* GPT-2's tanh GELU, elementwise over n; the backward overwrites dinp. */
PF_INTERNAL void gelu_forward(float *out, const float *inp, size_t n);
PF_INTERNAL void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* out = a + b over n; the backward is the identity on both (callers share the buffer). */
PF_INTERNAL void residual_forward(float *out, const float *a, const float *b, size_t n);

/* Rotary positions. A head row x (hd) at position t has its pairs (x[2i], x[2i+1]) rotated by
 * the angle t * 10000^(-2i/hd). cos_sin (T, hd/2, 2) from rope_table. */
PF_INTERNAL void rope_angle(int64_t t, int i, int hd, float *c, float *s);
PF_INTERNAL void rope_table(float *cos_sin, int T, int hd);
/* In place on x (B,H,T,hd): the forward rotates by +angle, the backward (of dout) by -angle. */
PF_INTERNAL void rope_forward(float *x, const float *cos_sin, int B, int H, int T, int hd);
PF_INTERNAL void rope_backward(float *dx, const float *cos_sin, int B, int H, int T, int hd);

/* Which attention a layer runs; W (m,hd) and eps only for FAVOR, A only for FAVOR++ (the
 * scalar of the OPRF features (Likhosherstov et al. 2022): a constant of the forward, no
 * gradient), window only for PF_LM_LOCAL. */
typedef struct lm_attn_spec {
    pf_lm_attention kind;
    pf_kernel kernel;
    const float *W;
    int m;
    float eps;
    float A;
    /* FAVOR: the layer's slot for what its forward keeps for the backward (NULL: none); keep 1
     * when the forward should fill it (training), 0 when it should leave it empty */
    pf_favor_saved **saved;
    int keep;
    /* FAVOR: sequence parallel, the attention over every process's slice (NULL: alone) */
    const pf_model_parallel *parallel;
    int window; /* PF_LM_LOCAL: keys t - window + 1..t */
} lm_attn_spec;

/* Causal multi-head attention on qkv (B,T,3C) (q | k | v, head h at columns h*hd):
 * q, k, v (B,H,T,hd) receive the permuted inputs (q and k rotated when cos_sin is not NULL),
 * att (B,H,T,hd) the attention output, lse (B,H,T) the exact softmax's log-normaliser (exact
 * only; may be NULL otherwise), out (B,T,C) att permuted back. Returns the library's status. */
PF_INTERNAL pf_status attention_forward(float *out, float *q, float *k, float *v, float *att,
                                        float *lse, const float *qkv, const float *cos_sin,
                                        const lm_attn_spec *spec, int B, int T, int C, int H);
/* dqkv (B,T,3C) = gradient of the forward (overwritten), from dout (B,T,C) and the forward's
 * saved q, k, v, att, lse. Scratch: datt, dq, dk, dv, each (B,H,T,hd). */
PF_INTERNAL pf_status attention_backward(float *dqkv, float *datt, float *dq, float *dk, float *dv,
                                         const float *dout, const float *q, const float *k,
                                         const float *v, const float *att, const float *lse,
                                         const float *cos_sin, const lm_attn_spec *spec, int B,
                                         int T, int C, int H);

/* Local-window causal softmax attention (a baseline) of one head's query row q (hd) over keys
 * j0..j1 (inclusive, j0 <= j1): key j is row j of K (hd) and V (hd), or row j % ring when
 * ring > 0 (a decoder's ring buffer). Scores s q.k_j, their softmax and the output in float64;
 * out (hd) and *lse = log sum_j exp(s q.k_j) rounded to float. p: scratch of j1 - j0 + 1 + hd
 * doubles. Forward and decoder share it, so that a decoded row has the forward's bits. */
PF_INTERNAL void local_row(float *out, float *lse, const float *q, const float *K, const float *V,
                           int64_t j0, int64_t j1, int ring, int hd, double s, double *p);
/* The window's attention on q, k, v (B,H,T,hd): att (B,H,T,hd), lse (B,H,T), query t over keys
 * max(0, t - window + 1)..t. O(B H T window hd). PF_ENONFINITE if an output is not finite. */
PF_INTERNAL pf_status local_attention_forward(float *att, float *lse, const float *q,
                                              const float *k, const float *v, int B, int H, int T,
                                              int hd, int window);
/* Its gradient: dq, dk, dv (B,H,T,hd) overwritten, from datt (B,H,T,hd) and the forward's q, k,
 * v, lse; the probabilities are recomputed from lse (float64 inside). PF_ENOMEM, or
 * PF_ENONFINITE if a gradient is not finite. */
PF_INTERNAL pf_status local_attention_backward(float *dq, float *dk, float *dv, const float *datt,
                                               const float *q, const float *k, const float *v,
                                               const float *lse, int B, int H, int T, int hd,
                                               int window);

/* Softmax cross-entropy over V classes: probs (N,V), losses (N) (0 where target < 0);
 * returns the number of counted rows. logits (N,V), targets (N). */
PF_INTERNAL int64_t crossentropy_forward(float *probs, float *losses, const float *logits,
                                         const int32_t *targets, int N, int V);
/* dlogits (N,V) = (probs - onehot(target)) * scale (overwritten; 0 rows where target < 0). */
PF_INTERNAL void crossentropy_backward(float *dlogits, const float *probs, const int32_t *targets,
                                       float scale, int N, int V);

/* ---- FAVOR++ bookkeeping (the kernel itself is not in the library yet) -------------------- */

/* The batch statistic rho = s/d of FAVOR++'s optimal A (Likhosherstov et al. 2022) for q, k
 * (B,H,T,hd) with the scale folded in: s = mean|q'|^2 + mean|k'|^2 + 2 mean(q').mean(k'), q' = q
 * sqrt(scale). In float64. */
PF_INTERNAL double favorpp_rho(const float *q, const float *k, int B, int H, int T, int hd,
                               float scale);
/* The A minimising the OPRF variance for rho: (1 - 2 rho - sqrt((2 rho + 1)^2 + 8 rho)) / 16. */
PF_INTERNAL double favorpp_a(double rho);

/* FAVOR++'s running statistic: after n batches, rho_n = rho_{n-1} + (x - rho_{n-1}) w_n with
 * w_n = max(1/n, 1 - FAVORPP_MOMENTUM): the plain mean of the first batches, then an
 * exponential average over about 1/(1 - momentum) batches (q and k drift as training goes). */
#define FAVORPP_MOMENTUM 0.99
PF_INTERNAL float favorpp_update(float rho, double x, int64_t n);

/* ---- the model (model.c) ----------------------------------------------------------------- */

#define LM_NUM_PARAMS 16

/* Whether a configuration runs FAVOR (a W per layer, features kept for the backward): FAVOR+ and
 * FAVOR++; exact and local attention have no W. */
static inline int lm_uses_favor(const pf_model_config *c) {
    return c->attention == PF_LM_FAVOR || c->attention == PF_LM_FAVORPP;
}

/* The trainable tensors, each a named pointer into one allocation (llm.c's ParameterTensors). */
typedef struct lm_params {
    float *wte;      /* (V, C) token embedding, also the output layer (tied) */
    float *wpe;      /* (context, C) learned positions; 0 floats with rotary */
    float *ln1w;     /* (L, C) */
    float *ln1b;     /* (L, C) */
    float *qkvw;     /* (L, 3C, C) */
    float *qkvb;     /* (L, 3C) */
    float *attprojw; /* (L, C, C) */
    float *attprojb; /* (L, C) */
    float *ln2w;     /* (L, C) */
    float *ln2b;     /* (L, C) */
    float *fcw;      /* (L, 4C, C) */
    float *fcb;      /* (L, 4C) */
    float *fcprojw;  /* (L, C, 4C) */
    float *fcprojb;  /* (L, C) */
    float *lnfw;     /* (C) */
    float *lnfb;     /* (C) */
} lm_params;

/* The saved forward activations, one allocation (llm.c's ActivationTensors). hd = C/H. */
typedef struct lm_acts {
    float *encoded;   /* (B, T, C) */
    float *ln1;       /* (L, B, T, C) */
    float *ln1_mean;  /* (L, B, T) */
    float *ln1_rstd;  /* (L, B, T) */
    float *qkv;       /* (L, B, T, 3C) */
    float *q;         /* (L, B, H, T, hd), rotated */
    float *k;         /* (L, B, H, T, hd), rotated */
    float *v;         /* (L, B, H, T, hd) */
    float *att;       /* (L, B, H, T, hd) */
    float *lse;       /* (L, B, H, T) */
    float *atty;      /* (L, B, T, C) */
    float *attproj;   /* (L, B, T, C) */
    float *residual2; /* (L, B, T, C) */
    float *ln2;       /* (L, B, T, C) */
    float *ln2_mean;  /* (L, B, T) */
    float *ln2_rstd;  /* (L, B, T) */
    float *fch;       /* (L, B, T, 4C) */
    float *fch_gelu;  /* (L, B, T, 4C) */
    float *fcproj;    /* (L, B, T, C) */
    float *residual3; /* (L, B, T, C) */
    float *lnf;       /* (B, T, C) */
    float *lnf_mean;  /* (B, T) */
    float *lnf_rstd;  /* (B, T) */
    float *logits;    /* (B, T, V) */
    float *probs;     /* (B, T, V) */
    float *losses;    /* (B, T) */
} lm_acts;

#define LM_NUM_ACTS 26

/* Backward scratch, reused by every layer (one allocation). */
typedef struct lm_grad_acts {
    float *dresidual; /* (B, T, C) the residual stream's gradient */
    float *dln;       /* (B, T, C) */
    float *datty;     /* (B, T, C) */
    float *dqkv;      /* (B, T, 3C) */
    float *datt;      /* (B, H, T, hd) */
    float *dq;        /* (B, H, T, hd) */
    float *dk;        /* (B, H, T, hd) */
    float *dv;        /* (B, H, T, hd) */
    float *dfch;      /* (B, T, 4C) */
    float *dfch_gelu; /* (B, T, 4C) */
    float *dlogits;   /* (B, T, V) */
} lm_grad_acts;

#define LM_NUM_GRAD_ACTS 11

struct pf_model {
    pf_model_config config;
    size_t param_sizes[LM_NUM_PARAMS];
    size_t num_params;
    lm_params params; /* into params_memory */
    lm_params grads;  /* into grads_memory */
    float *params_memory;
    float *grads_memory;
    float *m_memory; /* AdamW first moments (num_params) */
    float *v_memory; /* AdamW second moments (num_params) */
    int64_t step;    /* optimizer steps taken */

    /* FAVOR: W (L, m, hd), drawn for stream w_stream; relu's eps */
    float *W;
    int64_t w_stream; /* -1: not drawn */
    float favor_eps;
    /* FAVOR++: per layer the running average of rho (L) over `rho_count` training batches
     * (favorpp_update); each forward uses A = favorpp_a(rho) from the batches before it, so A
     * never looks at the tokens it is applied to (a causal A may not look at the sequence), and
     * evaluation mode leaves it frozen */
    float *rho;
    int64_t rho_count;
    float *A; /* (L) the A of each layer's forwards until the next training step */
    pf_favor_saved **saved; /* (L) FAVOR: what each layer's training forward keeps */
    int training;

    float *rope;  /* (rope_len, hd/2, 2) cos, sin, grown by forwards; NULL before the first */
    int rope_len; /* positions in rope */

    /* activations for the current (B, T); reallocated when B*T grows */
    int B, T;
    size_t act_capacity; /* tokens (B*T) the buffers hold */
    lm_acts acts;
    float *acts_memory;
    lm_grad_acts gacts;
    float *gacts_memory;
    int32_t *tokens;  /* (B, T) copy of the last forward's inputs */
    int32_t *targets; /* (B, T) */
    int64_t counted;  /* targets >= 0 in the last forward; -1: no targets */
    double loss_sum;  /* the sum of their losses (float64) */

    /* sequence parallel (pf_model_set_parallel): this process's slice of every sequence */
    pf_model_parallel parallel;
    int has_parallel;

    /* metadata of the file the model was loaded from: key, value, ..., NULL */
    char **meta;
};

/* Checks a configuration: PF_OK, PF_EINVAL, or PF_ENOTSUP (FAVOR++). */
PF_INTERNAL pf_status lm_config_check(const pf_model_config *c);

/* The shapes of parameter i (0..LM_NUM_PARAMS-1): its name and dims; returns ndim. */
PF_INTERNAL int lm_param_shape(const pf_model_config *c, int i, const char **name, int64_t *shape);

/* Pointer to parameter i inside a lm_params (the order of the struct). */
PF_INTERNAL float *lm_param_ptr(const lm_params *p, int i);

/* 1 if parameter i is decayed by AdamW (matrices and embeddings). */
PF_INTERNAL int lm_param_decays(int i);

/* Draws every layer's W for stream `stream` (if it is not already the current one). */
PF_INTERNAL pf_status lm_draw_projections(pf_model *m, int64_t stream);

/* Sets FAVOR++'s A (L) from the running statistic: favorpp_a(rho), or 0 (FAVOR+) before any
 * training batch. */
PF_INTERNAL void lm_favorpp_refresh(pf_model *m);

/* The attention spec of layer l. */
PF_INTERNAL lm_attn_spec lm_layer_spec(const pf_model *m, int l);

/* *norm = the global L2 norm of the gradients, in float64, in a fixed order. PF_ENOMEM. */
PF_INTERNAL pf_status lm_grad_norm(const pf_model *m, double *norm);

#endif
