/* model.c: the byte-level Transformer: configuration, parameters, forward and backward.
 *
 * Embeddings are tied: the output layer is wte^T. For a byte model that saves V*C parameters
 * (about 2% here) and is what GPT-2 does; the input and output sides of a 256-symbol vocabulary
 * want the same geometry anyway. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

#define V PF_LM_VOCAB

pf_model_config pf_model_config_default(void) {
    pf_model_config c = {.context = 256,
                         .layers = 4,
                         .d_model = 128,
                         .heads = 4,
                         .attention = PF_LM_EXACT,
                         .positions = PF_LM_LEARNED,
                         .kernel = PF_KERNEL_POSITIVE,
                         .features = 64,
                         .redraw = 1000,
                         .seed = 1,
                         .w_seed = 1,
                         .window = 32};
    return c;
}

pf_status lm_config_check(const pf_model_config *c) {
    if (!c) return PF_EINVAL;
    if (c->context < 1 || c->context > PF_LM_MAX_CONTEXT) return PF_EINVAL;
    if (c->layers < 1 || c->layers > PF_LM_MAX_LAYERS) return PF_EINVAL;
    if (c->d_model < 1 || c->d_model > PF_LM_MAX_D_MODEL || c->heads < 1 ||
        c->d_model % c->heads != 0)
        return PF_EINVAL;
    int hd = c->d_model / c->heads;
    if (c->positions != PF_LM_LEARNED && c->positions != PF_LM_ROTARY) return PF_EINVAL;
    if (c->positions == PF_LM_ROTARY && hd % 2 != 0) return PF_EINVAL;
    if (c->attention != PF_LM_EXACT && c->attention != PF_LM_FAVOR &&
        c->attention != PF_LM_FAVORPP && c->attention != PF_LM_LOCAL)
        return PF_EINVAL;
    if (c->window < 1 || c->window > PF_LM_MAX_CONTEXT) return PF_EINVAL;
    /* every field in range whatever the attention, so that what pf_model_save writes
     * pf_model_load reads: FAVOR settings unused by exact attention still round-trip */
    if ((int)c->kernel < 0 || (int)c->kernel > PF_KERNEL_ELU || c->redraw < 0) return PF_EINVAL;
    if (c->features < (lm_uses_favor(c) ? 1 : 0) || c->features > PF_LM_MAX_FEATURES)
        return PF_EINVAL;
    /* FAVOR+ maps and elu; FAVOR++'s OPRF map is PF_LM_FAVORPP's (kernel is unused there) */
    if (c->attention == PF_LM_FAVOR && c->kernel != PF_KERNEL_POSITIVE &&
        c->kernel != PF_KERNEL_HYPERBOLIC && c->kernel != PF_KERNEL_TRIG &&
        c->kernel != PF_KERNEL_RELU && c->kernel != PF_KERNEL_ELU)
        return PF_EINVAL;
    /* elu + 1 of the head's own q', k': W = I (m = C/H) */
    if (c->attention == PF_LM_FAVOR && c->kernel == PF_KERNEL_ELU && c->features != hd)
        return PF_EINVAL;
    return PF_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Parameters: shapes, names, pointers
 * ------------------------------------------------------------------------------------------ */

static const char *const param_names[LM_NUM_PARAMS] = {
    "wte",
    "wpe",
    "blocks.ln1.weight",
    "blocks.ln1.bias",
    "blocks.attn.qkv.weight",
    "blocks.attn.qkv.bias",
    "blocks.attn.proj.weight",
    "blocks.attn.proj.bias",
    "blocks.ln2.weight",
    "blocks.ln2.bias",
    "blocks.mlp.fc.weight",
    "blocks.mlp.fc.bias",
    "blocks.mlp.proj.weight",
    "blocks.mlp.proj.bias",
    "lnf.weight",
    "lnf.bias",
};

int lm_param_shape(const pf_model_config *c, int i, const char **name, int64_t *shape) {
    int64_t L = c->layers, C = c->d_model;
    int64_t T = c->positions == PF_LM_LEARNED ? c->context : 0;
    *name = param_names[i];
    switch (i) {
    case 0:
        shape[0] = V;
        shape[1] = C;
        return 2;
    case 1:
        shape[0] = T;
        shape[1] = C;
        return 2;
    case 2:
    case 3:
    case 7:
    case 8:
    case 9:
    case 13:
        shape[0] = L;
        shape[1] = C;
        return 2;
    case 4:
        shape[0] = L;
        shape[1] = 3 * C;
        shape[2] = C;
        return 3;
    case 5:
        shape[0] = L;
        shape[1] = 3 * C;
        return 2;
    case 6:
        shape[0] = L;
        shape[1] = C;
        shape[2] = C;
        return 3;
    case 10:
        shape[0] = L;
        shape[1] = 4 * C;
        shape[2] = C;
        return 3;
    case 11:
        shape[0] = L;
        shape[1] = 4 * C;
        return 2;
    case 12:
        shape[0] = L;
        shape[1] = C;
        shape[2] = 4 * C;
        return 3;
    default:
        shape[0] = C;
        return 1;
    }
}

float *lm_param_ptr(const lm_params *p, int i) {
    float *const ptrs[LM_NUM_PARAMS] = {
        p->wte,  p->wpe,  p->ln1w, p->ln1b, p->qkvw,    p->qkvb,    p->attprojw, p->attprojb,
        p->ln2w, p->ln2b, p->fcw,  p->fcb,  p->fcprojw, p->fcprojb, p->lnfw,     p->lnfb};
    return ptrs[i];
}

int lm_param_decays(int i) {
    return i == 0 || i == 1 || i == 4 || i == 6 || i == 10 || i == 12;
}

/* Points the named tensors of p into mem, following sizes. */
static void point_params(lm_params *p, float *mem, const size_t *sizes) {
    float **ptrs[LM_NUM_PARAMS] = {&p->wte,     &p->wpe,     &p->ln1w,     &p->ln1b,
                                   &p->qkvw,    &p->qkvb,    &p->attprojw, &p->attprojb,
                                   &p->ln2w,    &p->ln2b,    &p->fcw,      &p->fcb,
                                   &p->fcprojw, &p->fcprojb, &p->lnfw,     &p->lnfb};
    for (int i = 0; i < LM_NUM_PARAMS; i++) {
        *ptrs[i] = mem;
        mem += sizes[i];
    }
}

/* GPT-2's initialisation: N(0, 0.02) for matrices and embeddings, the two projections into the
 * residual stream scaled by 1/sqrt(2L); LayerNorm weights 1, biases 0. Each tensor from its own
 * stream of the seed. */
static pf_status init_params(pf_model *m) {
    const pf_model_config *c = &m->config;
    for (int i = 0; i < LM_NUM_PARAMS; i++) {
        float *p = lm_param_ptr(&m->params, i);
        size_t n = m->param_sizes[i];
        if (i == 2 || i == 8 || i == 14) {
            for (size_t j = 0; j < n; j++) p[j] = 1.0f;
        } else if (!lm_param_decays(i)) {
            memset(p, 0, sizeof(float) * n);
        } else {
            pf_rng rng;
            pf_rng_init(&rng, c->seed, (UINT64_C(1) << 62) + (uint64_t)i);
            pf_status st = pf_rng_fill_normal(&rng, p, n);
            if (st != PF_OK) return st;
            float sd = 0.02f;
            if (i == 6 || i == 12) sd = (float)(0.02 / sqrt(2.0 * c->layers));
            for (size_t j = 0; j < n; j++) p[j] *= sd;
        }
    }
    return PF_OK;
}

pf_status lm_draw_projections(pf_model *m, int64_t stream) {
    const pf_model_config *c = &m->config;
    if (!lm_uses_favor(c) || m->w_stream == stream) return PF_OK;
    int hd = c->d_model / c->heads;
    if (c->attention == PF_LM_FAVOR && c->kernel == PF_KERNEL_ELU) {
        /* elu + 1 is the map of q', k' themselves: W = I, the same in every period */
        float *W = m->W;
        memset(W, 0, sizeof(float) * (size_t)c->layers * hd * hd);
        for (int l = 0; l < c->layers; l++)
            for (int k = 0; k < hd; k++) W[((size_t)l * hd + k) * hd + k] = 1.0f;
        m->w_stream = stream;
        return PF_OK;
    }
    for (int l = 0; l < c->layers; l++) {
        /* one stream per (redraw period, layer): the layer index in the low 16 bits */
        uint64_t s = ((uint64_t)stream << 16) | (uint64_t)l;
        pf_status st = pf_projection_draw(m->W + (size_t)l * c->features * hd, c->features, hd,
                                          PF_PROJ_ORTHOGONAL, PF_NORM_CHI, c->w_seed, s);
        if (st != PF_OK) return st;
    }
    m->w_stream = stream;
    return PF_OK;
}

lm_attn_spec lm_layer_spec(const pf_model *m, int l) {
    const pf_model_config *c = &m->config;
    int hd = c->d_model / c->heads;
    lm_attn_spec s = {.kind = c->attention, .kernel = c->kernel, .W = NULL, .m = 0, .eps = 0};
    if (c->attention == PF_LM_LOCAL) s.window = c->window;
    if (lm_uses_favor(c)) {
        s.W = m->W + (size_t)l * c->features * hd;
        s.m = c->features;
        s.eps = m->favor_eps;
    }
    if (c->attention == PF_LM_FAVORPP) {
        s.kernel = PF_KERNEL_OPRF;
        s.A = m->A[l];
    }
    if (lm_uses_favor(c) && m->saved) {
        s.saved = &m->saved[l];
        s.keep = m->training;
    }
    if (m->has_parallel) s.parallel = &m->parallel;
    return s;
}

void lm_favorpp_refresh(pf_model *m) {
    if (m->config.attention != PF_LM_FAVORPP) return;
    for (int l = 0; l < m->config.layers; l++)
        m->A[l] = m->rho_count > 0 ? (float)favorpp_a(m->rho[l]) : 0.0f;
}

pf_status pf_model_create(pf_model **model, const pf_model_config *config) {
    if (!model) return PF_EINVAL;
    *model = NULL;
    pf_status st = lm_config_check(config);
    if (st != PF_OK) return st;
    pf_model *m = calloc(1, sizeof(*m));
    if (!m) return PF_ENOMEM;
    m->config = *config;
    const pf_model_config *c = &m->config;
    int hd = c->d_model / c->heads;

    m->num_params = 0;
    for (int i = 0; i < LM_NUM_PARAMS; i++) {
        const char *name;
        int64_t shape[3];
        int nd = lm_param_shape(c, i, &name, shape);
        size_t n = 1;
        for (int j = 0; j < nd; j++) n *= (size_t)shape[j];
        m->param_sizes[i] = n;
        m->num_params += n;
    }
    m->params_memory = pf_alloc(m->num_params, sizeof(float));
    m->grads_memory = pf_alloc(m->num_params, sizeof(float));
    m->m_memory = pf_alloc(m->num_params, sizeof(float));
    m->v_memory = pf_alloc(m->num_params, sizeof(float));
    if (lm_uses_favor(c)) {
        m->W = pf_alloc((size_t)c->layers * c->features * hd, sizeof(float));
        m->rho = pf_alloc((size_t)c->layers, sizeof(float));
        m->A = pf_alloc((size_t)c->layers, sizeof(float));
        m->saved = calloc((size_t)c->layers, sizeof(pf_favor_saved *));
    }
    if (!m->params_memory || !m->grads_memory || !m->m_memory || !m->v_memory ||
        (lm_uses_favor(c) && (!m->W || !m->rho || !m->A || !m->saved))) {
        pf_model_free(m);
        return PF_ENOMEM;
    }
    point_params(&m->params, m->params_memory, m->param_sizes);
    point_params(&m->grads, m->grads_memory, m->param_sizes);
    memset(m->grads_memory, 0, sizeof(float) * m->num_params);
    memset(m->m_memory, 0, sizeof(float) * m->num_params);
    memset(m->v_memory, 0, sizeof(float) * m->num_params);
    m->counted = -1;
    m->w_stream = -1;
    m->favor_eps = c->attention == PF_LM_FAVOR && c->kernel == PF_KERNEL_RELU ? 1e-3f : 0.0f;
    if (m->rho) memset(m->rho, 0, sizeof(float) * (size_t)c->layers);
    if (m->A) memset(m->A, 0, sizeof(float) * (size_t)c->layers);

    st = init_params(m);
    if (st == PF_OK) st = lm_draw_projections(m, 0);
    if (st != PF_OK) {
        pf_model_free(m);
        return st;
    }
    *model = m;
    return PF_OK;
}

void pf_model_free(pf_model *m) {
    if (!m) return;
    pf_free(m->params_memory);
    pf_free(m->grads_memory);
    pf_free(m->m_memory);
    pf_free(m->v_memory);
    pf_free(m->W);
    pf_free(m->rho);
    pf_free(m->A);
    pf_free(m->rope);
    pf_free(m->acts_memory);
    pf_free(m->gacts_memory);
    if (m->saved)
        for (int l = 0; l < m->config.layers; l++) pf_favor_saved_free(m->saved[l]);
    free(m->saved);
    free(m->tokens);
    free(m->targets);
    if (m->meta) {
        for (char **p = m->meta; *p; p++) free(*p);
        free(m->meta);
    }
    free(m);
}

pf_model_config pf_model_get_config(const pf_model *m) {
    if (!m) {
        pf_model_config z;
        memset(&z, 0, sizeof(z));
        return z;
    }
    return m->config;
}

int64_t pf_model_num_params(const pf_model *m) {
    return m ? (int64_t)m->num_params : 0;
}

int64_t pf_model_steps(const pf_model *m) {
    return m ? m->step : 0;
}

pf_status pf_model_set_training(pf_model *m, int training) {
    if (!m || (training != 0 && training != 1)) return PF_EINVAL;
    m->training = training;
    return PF_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Activations
 * ------------------------------------------------------------------------------------------ */

/* Rounds a float count up to 16 (64 bytes), so every array starts aligned. */
static size_t pad16(size_t n) {
    return (n + 15) / 16 * 16;
}

/* Sizes of the activation arrays for BT tokens, in lm_acts order. */
static void act_sizes(size_t *s, const pf_model_config *c, size_t BT) {
    size_t L = (size_t)c->layers, C = (size_t)c->d_model, H = (size_t)c->heads;
    size_t sz[LM_NUM_ACTS] = {BT * C,
                              L * BT * C,
                              L * BT,
                              L * BT,
                              L * BT * 3 * C,
                              L * BT * C,
                              L * BT * C,
                              L * BT * C,
                              L * BT * C,
                              L * BT * H,
                              L * BT * C,
                              L * BT * C,
                              L * BT * C,
                              L * BT * C,
                              L * BT,
                              L * BT,
                              L * BT * 4 * C,
                              L * BT * 4 * C,
                              L * BT * C,
                              L * BT * C,
                              BT * C,
                              BT,
                              BT,
                              BT * V,
                              BT * V,
                              BT};
    for (int i = 0; i < LM_NUM_ACTS; i++) s[i] = pad16(sz[i]);
}

static void grad_act_sizes(size_t *s, const pf_model_config *c, size_t BT) {
    size_t C = (size_t)c->d_model;
    size_t sz[LM_NUM_GRAD_ACTS] = {BT * C, BT * C, BT * C,     BT * 3 * C, BT * C, BT * C,
                                   BT * C, BT * C, BT * 4 * C, BT * 4 * C, BT * V};
    for (int i = 0; i < LM_NUM_GRAD_ACTS; i++) s[i] = pad16(sz[i]);
}

static void point_acts(pf_model *m, size_t BT) {
    size_t s[LM_NUM_ACTS], g[LM_NUM_GRAD_ACTS];
    act_sizes(s, &m->config, BT);
    grad_act_sizes(g, &m->config, BT);
    lm_acts *a = &m->acts;
    float **ap[LM_NUM_ACTS] = {
        &a->encoded,  &a->ln1,      &a->ln1_mean, &a->ln1_rstd, &a->qkv,     &a->q,         &a->k,
        &a->v,        &a->att,      &a->lse,      &a->atty,     &a->attproj, &a->residual2, &a->ln2,
        &a->ln2_mean, &a->ln2_rstd, &a->fch,      &a->fch_gelu, &a->fcproj,  &a->residual3, &a->lnf,
        &a->lnf_mean, &a->lnf_rstd, &a->logits,   &a->probs,    &a->losses};
    float *p = m->acts_memory;
    for (int i = 0; i < LM_NUM_ACTS; i++) {
        *ap[i] = p;
        p += s[i];
    }
    lm_grad_acts *d = &m->gacts;
    float **gp[LM_NUM_GRAD_ACTS] = {&d->dresidual, &d->dln,       &d->datty,  &d->dqkv,
                                    &d->datt,      &d->dq,        &d->dk,     &d->dv,
                                    &d->dfch,      &d->dfch_gelu, &d->dlogits};
    p = m->gacts_memory;
    for (int i = 0; i < LM_NUM_GRAD_ACTS; i++) {
        *gp[i] = p;
        p += g[i];
    }
}

/* Makes room for B*T tokens (allocating only when it grows) and points the arrays. */
static pf_status ensure_acts(pf_model *m, int B, int T) {
    size_t BT = (size_t)B * (size_t)T;
    if (BT > m->act_capacity) {
        size_t s[LM_NUM_ACTS], g[LM_NUM_GRAD_ACTS], ns = 0, ng = 0;
        act_sizes(s, &m->config, BT);
        grad_act_sizes(g, &m->config, BT);
        for (int i = 0; i < LM_NUM_ACTS; i++) ns += s[i];
        for (int i = 0; i < LM_NUM_GRAD_ACTS; i++) ng += g[i];
        float *acts = pf_alloc(ns, sizeof(float));
        float *gacts = pf_alloc(ng, sizeof(float));
        int32_t *tok = malloc(sizeof(int32_t) * BT);
        int32_t *tgt = malloc(sizeof(int32_t) * BT);
        if (!acts || !gacts || !tok || !tgt) {
            pf_free(acts);
            pf_free(gacts);
            free(tok);
            free(tgt);
            return PF_ENOMEM;
        }
        pf_free(m->acts_memory);
        pf_free(m->gacts_memory);
        free(m->tokens);
        free(m->targets);
        m->acts_memory = acts;
        m->gacts_memory = gacts;
        m->tokens = tok;
        m->targets = tgt;
        m->act_capacity = BT;
    }
    m->B = B;
    m->T = T;
    point_acts(m, BT);
    return PF_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Forward and backward
 * ------------------------------------------------------------------------------------------ */

/* The rotary table for positions [0, T): made as long sequences first come, not at creation,
 * so that a model's memory follows what it runs (a context of 2^20 would otherwise cost
 * 2^20 hd floats at once, even for a checkpoint that is only loaded). */
static pf_status ensure_rope(pf_model *m, int T) {
    if (m->config.positions != PF_LM_ROTARY || T <= m->rope_len) return PF_OK;
    const int hd = m->config.d_model / m->config.heads;
    float *r = pf_alloc((size_t)T * hd, sizeof(float));
    if (!r) return PF_ENOMEM;
    rope_table(r, T, hd);
    pf_free(m->rope);
    m->rope = r;
    m->rope_len = T;
    return PF_OK;
}

/* Sequence parallel: every process's verdict on this point (alone: its own). */
static pf_status agree(const pf_model *m, pf_status st) {
    return m->has_parallel ? m->parallel.agree(m->parallel.ctx, st) : st;
}

/* The checks and allocations of a forward, before anything is computed. */
static pf_status forward_prepare(pf_model *m, const int32_t *tokens, const int32_t *targets, int B,
                                 int T, int64_t pos) {
    const pf_model_config *c = &m->config;
    const int L = c->layers, C = c->d_model;
    if (T > c->context - pos) return PF_EINVAL;
    /* every (B,T,4C) offset must fit an int row count and a size_t byte count */
    if ((int64_t)B * T > INT32_MAX / 4 / C / (L + 1)) return PF_EINVAL;
    const int N = B * T;
    for (int i = 0; i < N; i++) {
        if (tokens[i] < 0 || tokens[i] >= V) return PF_EINVAL;
        if (targets && (targets[i] < -1 || targets[i] >= V)) return PF_EINVAL;
    }
    pf_status st = ensure_acts(m, B, T);
    if (st == PF_OK) st = ensure_rope(m, (int)(pos + T));
    /* Training draws W for this step's redraw period; evaluation keeps the current one. */
    if (st == PF_OK && m->training && lm_uses_favor(c))
        st = lm_draw_projections(m, (int64_t)pf_projection_stream((uint64_t)m->step, c->redraw));
    return st;
}

/* Whether [a, a + na) and [b, b + nb) (bytes) overlap; NULL never does. */
static int overlap(const void *a, size_t na, const void *b, size_t nb) {
    const char *x = a, *y = b;
    return x && y && na && nb && x < y + nb && y < x + na;
}

pf_status pf_model_forward(pf_model *m, float *loss, float *logits, const int32_t *tokens,
                           const int32_t *targets, int B, int T) {
    if (!m) return PF_EINVAL;
    if (B >= 1 && T >= 1) { /* outputs over inputs or over each other: refused (performer.h) */
        const size_t bt = (size_t)B * (size_t)T, nl = bt * PF_LM_VOCAB * sizeof(float);
        const size_t nt = bt * sizeof(int32_t);
        if (overlap(logits, nl, tokens, nt) || overlap(logits, nl, targets, nt) ||
            overlap(loss, sizeof(float), tokens, nt) || overlap(loss, sizeof(float), targets, nt) ||
            overlap(loss, sizeof(float), logits, nl))
            return agree(m, PF_EINVAL);
    }
    const pf_model_config *c = &m->config;
    const int L = c->layers, C = c->d_model, H = c->heads, hd = C / H;
    const int64_t pos = m->has_parallel ? m->parallel.position : 0;
    m->counted = -1; /* until this forward succeeds */
    /* (sequence parallel: every path to a return goes through agree, bad arguments too) */
    pf_status st = !tokens || B < 1 || T < 1 || T > c->context || (loss && !targets)
                       ? PF_EINVAL
                       : forward_prepare(m, tokens, targets, B, T, pos);
    st = agree(m, st);
    if (st != PF_OK) return st;
    const int N = B * T;
    lm_favorpp_refresh(m); /* A from the batches before this one */
    memcpy(m->tokens, tokens, sizeof(int32_t) * (size_t)N);
    if (targets) memcpy(m->targets, targets, sizeof(int32_t) * (size_t)N);

    const lm_params *p = &m->params;
    lm_acts *a = &m->acts;
    const size_t NC = (size_t)N * C;
    encoder_forward(a->encoded, tokens, p->wte,
                    c->positions == PF_LM_LEARNED ? p->wpe + (size_t)pos * C : NULL, B, T, C);
    const float *rope = m->rope ? m->rope + (size_t)pos * hd : NULL; // (T, hd/2, 2) from pos
    const float *residual = a->encoded; // (B,T,C)
    for (int l = 0; l < L; l++) {
        // this layer's weights
        const float *ln1w = p->ln1w + (size_t)l * C, *ln1b = p->ln1b + (size_t)l * C;
        const float *qkvw = p->qkvw + (size_t)l * 3 * C * C, *qkvb = p->qkvb + (size_t)l * 3 * C;
        const float *attprojw = p->attprojw + (size_t)l * C * C;
        const float *attprojb = p->attprojb + (size_t)l * C;
        const float *ln2w = p->ln2w + (size_t)l * C, *ln2b = p->ln2b + (size_t)l * C;
        const float *fcw = p->fcw + (size_t)l * 4 * C * C, *fcb = p->fcb + (size_t)l * 4 * C;
        const float *fcprojw = p->fcprojw + (size_t)l * C * 4 * C;
        const float *fcprojb = p->fcprojb + (size_t)l * C;
        // this layer's activations
        float *ln1 = a->ln1 + l * NC;                     // (B,T,C)
        float *ln1_mean = a->ln1_mean + (size_t)l * N;    // (B,T)
        float *ln1_rstd = a->ln1_rstd + (size_t)l * N;    // (B,T)
        float *qkv = a->qkv + l * NC * 3;                 // (B,T,3C)
        float *q = a->q + l * NC, *k = a->k + l * NC;     // (B,H,T,hd)
        float *v = a->v + l * NC, *att = a->att + l * NC; // (B,H,T,hd)
        float *lse = a->lse + (size_t)l * N * H;          // (B,H,T)
        float *atty = a->atty + l * NC;                   // (B,T,C)
        float *attproj = a->attproj + l * NC;             // (B,T,C)
        float *residual2 = a->residual2 + l * NC;         // (B,T,C)
        float *ln2 = a->ln2 + l * NC;                     // (B,T,C)
        float *ln2_mean = a->ln2_mean + (size_t)l * N;    // (B,T)
        float *ln2_rstd = a->ln2_rstd + (size_t)l * N;    // (B,T)
        float *fch = a->fch + l * NC * 4;                 // (B,T,4C)
        float *fch_gelu = a->fch_gelu + l * NC * 4;       // (B,T,4C)
        float *fcproj = a->fcproj + l * NC;               // (B,T,C)
        float *residual3 = a->residual3 + l * NC;         // (B,T,C)

        layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, ln1w, ln1b, N, C);
        matmul_forward(qkv, ln1, qkvw, qkvb, N, C, 3 * C);
        lm_attn_spec spec = lm_layer_spec(m, l);
        st = attention_forward(atty, q, k, v, att, lse, qkv, rope, &spec, B, T, C, H);
        if (st != PF_OK) return st;
        if (c->attention == PF_LM_FAVORPP && m->training) {
            /* this batch joins the statistic after its own forward used the old A */
            double x = favorpp_rho(q, k, B, H, T, hd, 0.0f);
            m->rho[l] = favorpp_update(m->rho[l], x, m->rho_count + 1);
        }
        matmul_forward(attproj, atty, attprojw, attprojb, N, C, C);
        residual_forward(residual2, residual, attproj, NC);
        layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, ln2w, ln2b, N, C);
        matmul_forward(fch, ln2, fcw, fcb, N, C, 4 * C);
        gelu_forward(fch_gelu, fch, NC * 4);
        matmul_forward(fcproj, fch_gelu, fcprojw, fcprojb, N, 4 * C, C);
        residual_forward(residual3, residual2, fcproj, NC);
        residual = residual3;
    }
    if (c->attention == PF_LM_FAVORPP && m->training) m->rho_count++;
    layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, residual, p->lnfw, p->lnfb, N, C);
    matmul_forward(a->logits, a->lnf, p->wte, NULL, N, C, V); // tied: logits = lnf wte^T
    if (logits) memcpy(logits, a->logits, sizeof(float) * NC / C * V);

    if (targets) {
        int64_t counted = crossentropy_forward(a->probs, a->losses, a->logits, targets, N, V);
        double sum = 0;
        for (int i = 0; i < N; i++) sum += a->losses[i]; /* in order: thread independent */
        float mean = counted > 0 ? (float)(sum / (double)counted) : 0.0f;
        if (loss) *loss = mean;
        m->counted = counted;
        m->loss_sum = sum;
        if (!isfinite(mean)) return PF_ENONFINITE;
    }
    return PF_OK;
}

pf_status pf_model_backward(pf_model *m) {
    return pf_model_backward_total(m, m ? m->counted : -1);
}

pf_status pf_model_backward_total(pf_model *m, int64_t total) {
    pf_status st0 = !m || m->counted < 0 || total < m->counted || (total == 0 && m->counted > 0)
                        ? PF_EINVAL
                        : PF_OK;
    if (!m) return st0;
    st0 = agree(m, st0);
    if (st0 != PF_OK) return st0;
    const pf_model_config *c = &m->config;
    const int B = m->B, T = m->T, L = c->layers, C = c->d_model, H = c->heads;
    const int N = B * T;
    const size_t NC = (size_t)N * C;
    const lm_params *p = &m->params;
    lm_params *g = &m->grads;
    const lm_acts *a = &m->acts;
    lm_grad_acts *d = &m->gacts;

    memset(m->grads_memory, 0, sizeof(float) * m->num_params);
    // loss = sum_i losses_i / counted
    float scale = total > 0 ? 1.0f / (float)total : 0.0f;
    const float *rope = m->rope ? m->rope + (size_t)(m->has_parallel ? m->parallel.position : 0) *
                                                (C / H)
                                : NULL;
    crossentropy_backward(d->dlogits, a->probs, m->targets, scale, N, V);
    // logits = lnf wte^T
    matmul_backward(d->dln, g->wte, NULL, d->dlogits, a->lnf, p->wte, N, C, V);
    // lnf = layernorm(residual3[L-1])
    memset(d->dresidual, 0, sizeof(float) * NC);
    layernorm_backward(d->dresidual, g->lnfw, g->lnfb, d->dln, a->residual3 + (L - 1) * NC, p->lnfw,
                       a->lnf_mean, a->lnf_rstd, N, C);

    for (int l = L - 1; l >= 0; l--) {
        const float *residual = l == 0 ? a->encoded : a->residual3 + (l - 1) * NC;
        // weights
        const float *ln1w = p->ln1w + (size_t)l * C, *qkvw = p->qkvw + (size_t)l * 3 * C * C;
        const float *attprojw = p->attprojw + (size_t)l * C * C;
        const float *ln2w = p->ln2w + (size_t)l * C, *fcw = p->fcw + (size_t)l * 4 * C * C;
        const float *fcprojw = p->fcprojw + (size_t)l * C * 4 * C;
        // their gradients
        float *dln1w = g->ln1w + (size_t)l * C, *dln1b = g->ln1b + (size_t)l * C;
        float *dqkvw = g->qkvw + (size_t)l * 3 * C * C, *dqkvb = g->qkvb + (size_t)l * 3 * C;
        float *dattprojw = g->attprojw + (size_t)l * C * C;
        float *dattprojb = g->attprojb + (size_t)l * C;
        float *dln2w = g->ln2w + (size_t)l * C, *dln2b = g->ln2b + (size_t)l * C;
        float *dfcw = g->fcw + (size_t)l * 4 * C * C, *dfcb = g->fcb + (size_t)l * 4 * C;
        float *dfcprojw = g->fcprojw + (size_t)l * C * 4 * C;
        float *dfcprojb = g->fcprojb + (size_t)l * C;
        // saved activations
        const float *ln1 = a->ln1 + l * NC, *ln1_mean = a->ln1_mean + (size_t)l * N;
        const float *ln1_rstd = a->ln1_rstd + (size_t)l * N;
        const float *q = a->q + l * NC, *k = a->k + l * NC, *v = a->v + l * NC;
        const float *att = a->att + l * NC, *lse = a->lse + (size_t)l * N * H;
        const float *atty = a->atty + l * NC, *residual2 = a->residual2 + l * NC;
        const float *ln2 = a->ln2 + l * NC, *ln2_mean = a->ln2_mean + (size_t)l * N;
        const float *ln2_rstd = a->ln2_rstd + (size_t)l * N;
        const float *fch = a->fch + l * NC * 4, *fch_gelu = a->fch_gelu + l * NC * 4;

        // residual3 = residual2 + fcproj: d fcproj = d residual3 = dresidual
        matmul_backward(d->dfch_gelu, dfcprojw, dfcprojb, d->dresidual, fch_gelu, fcprojw, N, 4 * C,
                        C);
        gelu_backward(d->dfch, fch, d->dfch_gelu, NC * 4);
        matmul_backward(d->dln, dfcw, dfcb, d->dfch, ln2, fcw, N, C, 4 * C);
        // dresidual becomes d residual2: its own path plus layernorm 2's
        layernorm_backward(d->dresidual, dln2w, dln2b, d->dln, residual2, ln2w, ln2_mean, ln2_rstd,
                           N, C);
        // residual2 = residual + attproj: d attproj = d residual2
        matmul_backward(d->datty, dattprojw, dattprojb, d->dresidual, atty, attprojw, N, C, C);
        lm_attn_spec spec = lm_layer_spec(m, l);
        pf_status st = attention_backward(d->dqkv, d->datt, d->dq, d->dk, d->dv, d->datty, q, k, v,
                                          att, lse, rope, &spec, B, T, C, H);
        if (st != PF_OK) return st;
        matmul_backward(d->dln, dqkvw, dqkvb, d->dqkv, ln1, qkvw, N, C, 3 * C);
        // dresidual becomes d residual (the layer's input)
        layernorm_backward(d->dresidual, dln1w, dln1b, d->dln, residual, ln1w, ln1_mean, ln1_rstd,
                           N, C);
    }
    const int64_t pos = m->has_parallel ? m->parallel.position : 0;
    encoder_backward(g->wte, c->positions == PF_LM_LEARNED ? g->wpe + (size_t)pos * C : NULL,
                     d->dresidual, m->tokens, B, T, C);
    return PF_OK;
}

pf_status pf_model_loss_sum(const pf_model *m, double *sum, int64_t *counted) {
    if (!m || !sum || !counted || m->counted < 0) return PF_EINVAL;
    *sum = m->loss_sum;
    *counted = m->counted;
    return PF_OK;
}

const float *pf_model_parameters(const pf_model *m, size_t *n) {
    if (!m || !n) return NULL;
    *n = m->num_params;
    return m->params_memory;
}

float *pf_model_gradients(pf_model *m, size_t *n) {
    if (!m || !n) return NULL;
    *n = m->num_params;
    return m->grads_memory;
}

pf_status pf_model_set_parallel(pf_model *m, const pf_model_parallel *par) {
    if (!m) return PF_EINVAL;
    if (!par) {
        m->has_parallel = 0;
        return PF_OK;
    }
    if (par->position < 0 || !par->agree || !par->attn_forward || !par->attn_backward)
        return PF_EINVAL;
    if (m->config.attention != PF_LM_FAVOR) return PF_ENOTSUP;
    m->parallel = *par;
    m->has_parallel = 1;
    m->counted = -1; /* a backward must follow a forward made this way */
    return PF_OK;
}

/* ---------------------------------------------------------------------------------------------
 * One model's weights into another configuration; what a layer feeds its attention
 * ------------------------------------------------------------------------------------------ */

/* errmsg <- "NAME: A here, B in the source"; PF_EINVAL. */
static pf_status shape_differs(char *errmsg, size_t errlen, const char *name, long long here,
                               long long there) {
    if (errmsg && errlen > 0)
        snprintf(errmsg, errlen, "%s: %lld here, %lld in the source", name, here, there);
    return PF_EINVAL;
}

pf_status pf_model_init_from(pf_model *dst, const pf_model *src, char *errmsg, size_t errlen) {
    if (errmsg && errlen > 0) errmsg[0] = '\0';
    if (!dst || !src) {
        if (errmsg && errlen > 0) snprintf(errmsg, errlen, "bad argument");
        return PF_EINVAL;
    }
    const pf_model_config *d = &dst->config, *s = &src->config;
    if (d->layers != s->layers) return shape_differs(errmsg, errlen, "layers", d->layers, s->layers);
    if (d->d_model != s->d_model)
        return shape_differs(errmsg, errlen, "d_model", d->d_model, s->d_model);
    if (d->heads != s->heads) return shape_differs(errmsg, errlen, "heads", d->heads, s->heads);
    if (d->positions != s->positions) {
        if (errmsg && errlen > 0)
            snprintf(errmsg, errlen, "positions: %s here, %s in the source",
                     d->positions == PF_LM_ROTARY ? "rotary" : "learned",
                     s->positions == PF_LM_ROTARY ? "rotary" : "learned");
        return PF_EINVAL;
    }
    /* the same shapes give the same tensors in the same order (lm_param_shape): the token
     * embeddings, the learned positions' table (none with rotary positions), then the rest; only
     * the table's rows may differ */
    const size_t wte = dst->param_sizes[0], dpe = dst->param_sizes[1], spe = src->param_sizes[1];
    if (wte != src->param_sizes[0] || dst->num_params - dpe != src->num_params - spe) {
        if (errmsg && errlen > 0) snprintf(errmsg, errlen, "parameter counts differ");
        return PF_EINVAL;
    }
    /* W for step 0 from dst's w_seed: drawn first, as the only step that can fail (it allocates);
     * the current W is kept if it is already stream 0's */
    pf_status st = lm_draw_projections(dst, 0);
    if (st != PF_OK) return st;
    memcpy(dst->params_memory, src->params_memory, sizeof(float) * wte);
    if (dpe > 0) { /* learned positions: row t is the source's row t mod its context */
        const size_t C = (size_t)d->d_model;
        for (int t = 0; t < d->context; t++)
            memcpy(dst->params_memory + wte + (size_t)t * C,
                   src->params_memory + wte + (size_t)(t % s->context) * C, sizeof(float) * C);
    }
    memcpy(dst->params_memory + wte + dpe, src->params_memory + wte + spe,
           sizeof(float) * (dst->num_params - wte - dpe));
    memset(dst->grads_memory, 0, sizeof(float) * dst->num_params);
    memset(dst->m_memory, 0, sizeof(float) * dst->num_params);
    memset(dst->v_memory, 0, sizeof(float) * dst->num_params);
    dst->step = 0;
    if (dst->rho) memset(dst->rho, 0, sizeof(float) * (size_t)d->layers);
    dst->rho_count = 0;
    lm_favorpp_refresh(dst);
    if (dst->saved) /* features kept by an earlier training forward belong to old weights */
        for (int l = 0; l < d->layers; l++) pf_favor_saved_clear(dst->saved[l]);
    dst->counted = -1;
    return PF_OK;
}

pf_status pf_model_attention_inputs(pf_model *m, float *q, float *k, float *v,
                                    const int32_t *tokens, int B, int T, int layer) {
    if (!m || !q || !k || !v || !tokens || B < 1 || T < 1 || layer < 0 ||
        layer >= m->config.layers || m->has_parallel)
        return PF_EINVAL;
    {
        const size_t n = (size_t)B * (size_t)T * (size_t)m->config.d_model * sizeof(float);
        const size_t nt = (size_t)B * (size_t)T * sizeof(int32_t);
        if (overlap(q, n, k, n) || overlap(q, n, v, n) || overlap(k, n, v, n) ||
            overlap(q, n, tokens, nt) || overlap(k, n, tokens, nt) || overlap(v, n, tokens, nt))
            return PF_EINVAL;
    }
    const int training = m->training;
    m->training = 0; /* evaluation: W and FAVOR++'s statistic stay as they are */
    pf_status st = pf_model_forward(m, NULL, NULL, tokens, NULL, B, T);
    m->training = training;
    if (st != PF_OK) return st;
    /* the forward keeps every layer's q, k, v (B,H,T,hd) for its backward */
    const size_t n = (size_t)B * T * m->config.d_model;
    memcpy(q, m->acts.q + (size_t)layer * n, sizeof(float) * n);
    memcpy(k, m->acts.k + (size_t)layer * n, sizeof(float) * n);
    memcpy(v, m->acts.v + (size_t)layer * n, sizeof(float) * n);
    return PF_OK;
}
