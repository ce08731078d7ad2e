/* decode.c: one token at a time, and drawing the next byte.
 *
 * The decoder runs the same layer functions as pf_model_forward on a single row. Exact
 * attention keeps each layer's keys and values (L, H, context, hd) and attends over the first
 * pos + 1 of them (the library's exact attention, one head at a time); local attention keeps
 * only the last `window` keys and values, a ring (L, H, window, hd), and attends over them with
 * the forward's own row function (local_row: the forward's bits); FAVOR keeps a
 * pf_favor_state per layer: O(H m hd) memory and time per token, whatever the position. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "favor/favor.h"
#include "model/model.h"

#define V PF_LM_VOCAB

struct pf_decoder {
    const pf_model *m;
    int64_t pos;
    float *kcache, *vcache;  /* (L, H, context, hd), exact; (L, H, window, hd) rings, local */
    int ring;                /* local: rows of each head's ring (window, at most context) */
    double *p;               /* local: (ring + hd) scratch of local_row */
    pf_favor_state **states; /* (L), FAVOR */
    float *mem;              /* the scratch below, one allocation */
    float *x;                /* (C) the residual stream */
    float *ln;               /* (C) */
    float *qkv;              /* (3C): q, k, v, each (H, 1, hd) */
    float *att;              /* (C) = (H, 1, hd) */
    float *tmp;              /* (C) */
    float *fch, *fch_gelu;   /* (4C) */
};

void pf_decoder_free(pf_decoder *d) {
    if (!d) return;
    if (d->states) {
        for (int l = 0; l < d->m->config.layers; l++) pf_favor_state_free(d->states[l]);
        free(d->states);
    }
    pf_free(d->kcache);
    pf_free(d->vcache);
    pf_free(d->p);
    pf_free(d->mem);
    free(d);
}

pf_status pf_decoder_create(pf_decoder **out, const pf_model *m) {
    if (!out) return PF_EINVAL;
    *out = NULL;
    if (!m) return PF_EINVAL;
    const pf_model_config *c = &m->config;
    const int L = c->layers, C = c->d_model, H = c->heads, hd = C / H;
    pf_decoder *d = calloc(1, sizeof(*d));
    if (!d) return PF_ENOMEM;
    d->m = m;
    size_t C16 = ((size_t)C + 15) / 16 * 16;
    d->mem = pf_alloc(C16 * 16, sizeof(float));
    if (!d->mem) {
        pf_decoder_free(d);
        return PF_ENOMEM;
    }
    d->x = d->mem;
    d->ln = d->x + C16;
    d->qkv = d->ln + C16;
    d->att = d->qkv + 3 * C16;
    d->tmp = d->att + C16;
    d->fch = d->tmp + C16;
    d->fch_gelu = d->fch + 4 * C16;
    if (!lm_uses_favor(c)) {
        /* with learned positions a local model stops at its context too: no more ring rows */
        const int rows = c->attention == PF_LM_EXACT                               ? c->context
                         : c->positions == PF_LM_LEARNED && c->context < c->window ? c->context
                                                                                   : c->window;
        size_t n = (size_t)L * H * rows * hd;
        d->ring = c->attention == PF_LM_LOCAL ? rows : 0;
        d->kcache = pf_alloc(n, sizeof(float));
        d->vcache = pf_alloc(n, sizeof(float));
        d->p = d->ring ? pf_alloc((size_t)rows + (size_t)hd, sizeof(double)) : NULL;
        if (!d->kcache || !d->vcache || (d->ring && !d->p)) {
            pf_decoder_free(d);
            return PF_ENOMEM;
        }
    } else {
        d->states = calloc((size_t)L, sizeof(pf_favor_state *));
        if (!d->states) {
            pf_decoder_free(d);
            return PF_ENOMEM;
        }
        for (int l = 0; l < L; l++) {
            lm_attn_spec s = lm_layer_spec(m, l);
            pf_favor_opts fav = pf_favor_opts_default();
            fav.kernel = s.kernel;
            fav.W = s.W;
            fav.m = s.m;
            fav.eps = s.eps;
            if (s.kind == PF_LM_FAVORPP) {
                /* FAVOR++ with the A training left (frozen) */
                fav.kernel = PF_KERNEL_OPRF;
                fav.oprf_a_given = 1;
                fav.oprf_a = s.A;
            }
            pf_status st = pf_favor_state_create(&d->states[l], H, hd, hd, 0.0f, &fav);
            if (st != PF_OK) {
                pf_decoder_free(d);
                return st;
            }
        }
    }
    *out = d;
    return PF_OK;
}

pf_status pf_decoder_reset(pf_decoder *d) {
    if (!d) return PF_EINVAL;
    d->pos = 0;
    if (d->states) {
        for (int l = 0; l < d->m->config.layers; l++) {
            pf_status st = pf_favor_state_reset(d->states[l]);
            if (st != PF_OK) return st;
        }
    }
    return PF_OK;
}

int64_t pf_decoder_position(const pf_decoder *d) {
    return d ? d->pos : 0;
}

/* Rotates the pairs of each head row of x (H, hd) by position t (as rope_forward). */
static void rope_row(float *x, int64_t t, int H, int hd, const float *table, int len) {
    for (int i = 0; i < hd / 2; i++) {
        float c, s;
        if (t < len) { /* the table holds what rope_angle gives */
            c = table[((size_t)t * (hd / 2) + i) * 2];
            s = table[((size_t)t * (hd / 2) + i) * 2 + 1];
        } else {
            rope_angle(t, i, hd, &c, &s);
        }
        for (int h = 0; h < H; h++) {
            float *r = x + (size_t)h * hd;
            float x0 = r[2 * i], x1 = r[2 * i + 1];
            r[2 * i] = x0 * c - x1 * s;
            r[2 * i + 1] = x0 * s + x1 * c;
        }
    }
}

pf_status pf_decoder_step(pf_decoder *d, float *logits, int32_t token) {
    if (!d || !logits || token < 0 || token >= V) return PF_EINVAL;
    const pf_model *m = d->m;
    const pf_model_config *c = &m->config;
    const int L = c->layers, C = c->d_model, H = c->heads, hd = C / H;
    const int64_t t = d->pos;
    if ((c->positions == PF_LM_LEARNED || c->attention == PF_LM_EXACT) && t >= c->context)
        return PF_EINVAL;
    const lm_params *p = &m->params;
    float mean, rstd;

    encoder_forward(d->x, &token, p->wte, c->positions == PF_LM_LEARNED ? p->wpe + t * C : NULL, 1,
                    1, C);
    for (int l = 0; l < L; l++) {
        layernorm_forward(d->ln, &mean, &rstd, d->x, p->ln1w + (size_t)l * C,
                          p->ln1b + (size_t)l * C, 1, C);
        matmul_forward(d->qkv, d->ln, p->qkvw + (size_t)l * 3 * C * C, p->qkvb + (size_t)l * 3 * C,
                       1, C, 3 * C);
        float *q = d->qkv, *k = d->qkv + C, *v = d->qkv + 2 * C; // each (H, 1, hd)
        if (c->positions == PF_LM_ROTARY) {
            rope_row(q, t, H, hd, m->rope, m->rope_len);
            rope_row(k, t, H, hd, m->rope, m->rope_len);
        }
        pf_status st;
        if (c->attention == PF_LM_LOCAL) {
            /* key t into ring row t % ring; the query sees keys max(0, t - ring + 1)..t */
            const double s = (double)pf_effective_scale(0.0f, hd);
            const int64_t j0 = t - d->ring + 1 > 0 ? t - d->ring + 1 : 0;
            st = PF_OK;
            for (int h = 0; h < H; h++) {
                size_t head = ((size_t)l * H + h) * (size_t)d->ring * hd;
                float *kc = d->kcache + head, *vc = d->vcache + head, lse;
                memcpy(kc + (t % d->ring) * hd, k + (size_t)h * hd, sizeof(float) * (size_t)hd);
                memcpy(vc + (t % d->ring) * hd, v + (size_t)h * hd, sizeof(float) * (size_t)hd);
                local_row(d->att + (size_t)h * hd, &lse, q + (size_t)h * hd, kc, vc, j0, t, d->ring,
                          hd, s, d->p);
                if (pf_any_nonfinite(d->att + (size_t)h * hd, (size_t)hd) || !isfinite(lse))
                    st = PF_ENONFINITE;
            }
        } else if (c->attention == PF_LM_EXACT) {
            pf_shape shape = {.B = 1, .H = 1, .Lq = 1, .Lk = (int)t + 1, .d = hd, .dv = hd};
            pf_attn_opts opts = pf_attn_opts_default();
            st = PF_OK;
            for (int h = 0; h < H && st == PF_OK; h++) {
                size_t head = ((size_t)l * H + h) * c->context * hd;
                float *kc = d->kcache + head, *vc = d->vcache + head;
                memcpy(kc + t * hd, k + (size_t)h * hd, sizeof(float) * (size_t)hd);
                memcpy(vc + t * hd, v + (size_t)h * hd, sizeof(float) * (size_t)hd);
                st = pf_attn_exact(d->att + (size_t)h * hd, NULL, q + (size_t)h * hd, kc, vc,
                                   &shape, &opts);
            }
        } else {
            st = pf_favor_state_stage(d->states[l], d->att, q, k, v, 1);
        }
        if (st != PF_OK) {
            /* a failed token changes no layer's state (the exact caches' row t is past pos; a
             * local ring's row t % ring held a key that no query from t on sees) */
            if (d->states)
                for (int j = 0; j < l; j++) pf_favor_state_abort(d->states[j]);
            return st;
        }
        matmul_forward(d->tmp, d->att, p->attprojw + (size_t)l * C * C, p->attprojb + (size_t)l * C,
                       1, C, C);
        residual_forward(d->x, d->x, d->tmp, (size_t)C);
        layernorm_forward(d->ln, &mean, &rstd, d->x, p->ln2w + (size_t)l * C,
                          p->ln2b + (size_t)l * C, 1, C);
        matmul_forward(d->fch, d->ln, p->fcw + (size_t)l * 4 * C * C, p->fcb + (size_t)l * 4 * C, 1,
                       C, 4 * C);
        gelu_forward(d->fch_gelu, d->fch, (size_t)4 * C);
        matmul_forward(d->tmp, d->fch_gelu, p->fcprojw + (size_t)l * 4 * C * C,
                       p->fcprojb + (size_t)l * C, 1, 4 * C, C);
        residual_forward(d->x, d->x, d->tmp, (size_t)C);
    }
    layernorm_forward(d->ln, &mean, &rstd, d->x, p->lnfw, p->lnfb, 1, C);
    matmul_forward(logits, d->ln, p->wte, NULL, 1, C, V);
    if (d->states)
        for (int l = 0; l < L; l++) pf_favor_state_commit(d->states[l]);
    d->pos++;
    return PF_OK;
}

/* ---- prefill: a prompt through every layer in chunks of rows --------------------------------- */

enum { PREFILL_ROWS = 512 }; /* rows per piece: a multiple of every chunk C the states use */

/* The scratch of a piece of n rows: one allocation. */
typedef struct prefill_buf {
    float *mem, *x, *ln, *qkv, *q, *k, *v, *att, *merged, *tmp, *fch, *fch_gelu, *mean, *rstd;
} prefill_buf;

static int prefill_alloc(prefill_buf *b, int n, int C) {
    const size_t N = (size_t)n, CC = (size_t)C;
    b->mem = pf_alloc(N * (19 * CC + 2), sizeof(float));
    if (!b->mem) return -1;
    float *f = b->mem;
    b->x = f, f += N * CC;
    b->ln = f, f += N * CC;
    b->qkv = f, f += 3 * N * CC;
    b->q = f, f += N * CC;
    b->k = f, f += N * CC;
    b->v = f, f += N * CC;
    b->att = f, f += N * CC;
    b->merged = f, f += N * CC;
    b->tmp = f, f += N * CC;
    b->fch = f, f += 4 * N * CC;
    b->fch_gelu = f, f += 4 * N * CC;
    b->mean = f, f += N;
    b->rstd = f;
    return 0;
}

/* Rows (n, C) at column offset off of src (row stride ld) as (H, n, hd), and back. */
static void to_heads(float *dst, const float *src, int ld, int off, int n, int H, int hd) {
    for (int t = 0; t < n; t++)
        for (int h = 0; h < H; h++)
            memcpy(dst + ((size_t)h * n + t) * hd, src + (size_t)t * ld + off + (size_t)h * hd,
                   sizeof(float) * (size_t)hd);
}
static void from_heads(float *dst, const float *src, int n, int H, int hd) {
    for (int h = 0; h < H; h++)
        for (int t = 0; t < n; t++)
            memcpy(dst + (size_t)t * H * hd + (size_t)h * hd, src + ((size_t)h * n + t) * hd,
                   sizeof(float) * (size_t)hd);
}

/* n tokens from position t0 through every layer, each layer's attention staged in its state
 * (nothing committed); logits of the last row if wanted. On failure the layers staged are
 * aborted. */
static pf_status prefill_piece(pf_decoder *d, prefill_buf *b, const int32_t *tok, int n,
                               int64_t t0, float *logits) {
    const pf_model *m = d->m;
    const pf_model_config *c = &m->config;
    const int L = c->layers, C = c->d_model, H = c->heads, hd = C / H;
    const lm_params *p = &m->params;
    encoder_forward(b->x, tok, p->wte, c->positions == PF_LM_LEARNED ? p->wpe + t0 * C : NULL, 1,
                    n, C);
    for (int l = 0; l < L; l++) {
        layernorm_forward(b->ln, b->mean, b->rstd, b->x, p->ln1w + (size_t)l * C,
                          p->ln1b + (size_t)l * C, n, C);
        matmul_forward(b->qkv, b->ln, p->qkvw + (size_t)l * 3 * C * C, p->qkvb + (size_t)l * 3 * C,
                       n, C, 3 * C);
        if (c->positions == PF_LM_ROTARY)
            for (int t = 0; t < n; t++) {
                rope_row(b->qkv + (size_t)t * 3 * C, t0 + t, H, hd, m->rope, m->rope_len);
                rope_row(b->qkv + (size_t)t * 3 * C + C, t0 + t, H, hd, m->rope, m->rope_len);
            }
        to_heads(b->q, b->qkv, 3 * C, 0, n, H, hd);
        to_heads(b->k, b->qkv, 3 * C, C, n, H, hd);
        to_heads(b->v, b->qkv, 3 * C, 2 * C, n, H, hd);
        const pf_status st = pf_favor_state_stage(d->states[l], b->att, b->q, b->k, b->v, n);
        if (st != PF_OK) {
            for (int j = 0; j < l; j++) pf_favor_state_abort(d->states[j]);
            return st;
        }
        from_heads(b->merged, b->att, n, H, hd);
        matmul_forward(b->tmp, b->merged, p->attprojw + (size_t)l * C * C,
                       p->attprojb + (size_t)l * C, n, C, C);
        residual_forward(b->x, b->x, b->tmp, (size_t)n * C);
        layernorm_forward(b->ln, b->mean, b->rstd, b->x, p->ln2w + (size_t)l * C,
                          p->ln2b + (size_t)l * C, n, C);
        matmul_forward(b->fch, b->ln, p->fcw + (size_t)l * 4 * C * C, p->fcb + (size_t)l * 4 * C, n,
                       C, 4 * C);
        gelu_forward(b->fch_gelu, b->fch, (size_t)n * 4 * C);
        matmul_forward(b->tmp, b->fch_gelu, p->fcprojw + (size_t)l * 4 * C * C,
                       p->fcprojb + (size_t)l * C, n, 4 * C, C);
        residual_forward(b->x, b->x, b->tmp, (size_t)n * C);
    }
    if (logits) {
        const float *last = b->x + (size_t)(n - 1) * C;
        layernorm_forward(b->ln, b->mean, b->rstd, last, p->lnfw, p->lnfb, 1, C);
        matmul_forward(logits, b->ln, p->wte, NULL, 1, C, V);
    }
    return PF_OK;
}

pf_status pf_decoder_prefill(pf_decoder *d, float *logits, const int32_t *tokens, int n) {
    if (!d || !logits || !tokens || n < 1) return PF_EINVAL;
    const pf_model_config *c = &d->m->config;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V) return PF_EINVAL;
    if ((c->positions == PF_LM_LEARNED || c->attention == PF_LM_EXACT) &&
        (int64_t)n > c->context - d->pos)
        return PF_EINVAL;
    const int L = c->layers;
    if (!d->states) { /* exact attention: its cache fills a row per step */
        const int64_t pos0 = d->pos;
        for (int i = 0; i < n; i++) {
            const pf_status st = pf_decoder_step(d, logits, tokens[i]);
            if (st != PF_OK) {
                d->pos = pos0; /* (the cache rows past pos are not read) */
                return st;
            }
        }
        return PF_OK;
    }
    /* pieces of PREFILL_ROWS, each staged in every layer and committed; a piece that fails
     * restores the states the prefill started from (snapshots), so nothing is half done */
    const int rows = n < PREFILL_ROWS ? n : PREFILL_ROWS;
    prefill_buf b;
    if (prefill_alloc(&b, rows, c->d_model) != 0) return PF_ENOMEM;
    const size_t snap = pf_favor_state_snapshot_bytes(d->states[0]);
    unsigned char *saved = n > rows && d->pos > 0 ? malloc(snap * (size_t)L) : NULL;
    if (n > rows && d->pos > 0 && !saved) {
        pf_free(b.mem);
        return PF_ENOMEM;
    }
    for (int l = 0; saved && l < L; l++)
        pf_favor_state_save(d->states[l], 0, saved + snap * (size_t)l, snap);
    const int64_t pos0 = d->pos;
    pf_status st = PF_OK;
    for (int i0 = 0; i0 < n && st == PF_OK; i0 += rows) {
        const int k = n - i0 < rows ? n - i0 : rows;
        st = prefill_piece(d, &b, tokens + i0, k, d->pos, i0 + k == n ? logits : NULL);
        if (st != PF_OK) break;
        for (int l = 0; l < L; l++) pf_favor_state_commit(d->states[l]);
        d->pos += k;
    }
    if (st != PF_OK && d->pos != pos0) {
        for (int l = 0; l < L; l++) {
            if (saved)
                pf_favor_state_load(d->states[l], 0, saved + snap * (size_t)l, snap, NULL, 0);
            else
                pf_favor_state_reset(d->states[l]);
        }
        d->pos = pos0;
    }
    free(saved);
    pf_free(b.mem);
    return st;
}

pf_status pf_sample_logits(int32_t *token, const float *logits, int n, float temperature, int top_k,
                           pf_rng *rng) {
    if (!token || !logits || n < 1 || !(temperature >= 0) || !isfinite(temperature) || top_k < 0 ||
        (temperature > 0 && !rng))
        return PF_EINVAL;
    if (pf_any_nonfinite(logits, (size_t)n)) return PF_ENONFINITE;
    int best = 0;
    for (int i = 1; i < n; i++) best = logits[i] > logits[best] ? i : best;
    if (temperature == 0 || top_k == 1) {
        *token = best;
        return PF_OK;
    }
    /* the top_k-th largest logit is the cut: keep l >= cut (ties at the cut kept, in order) */
    float cut = -INFINITY;
    if (top_k > 0 && top_k < n) {
        float *s = malloc(sizeof(float) * (size_t)n);
        if (!s) return PF_ENOMEM;
        memcpy(s, logits, sizeof(float) * (size_t)n);
        /* partial selection sort: n is a vocabulary (256), k small */
        for (int i = 0; i < top_k; i++) {
            int j = i;
            for (int r = i + 1; r < n; r++) j = s[r] > s[j] ? r : j;
            float tmp = s[i];
            s[i] = s[j];
            s[j] = tmp;
        }
        cut = s[top_k - 1];
        free(s);
    }
    double mx = logits[best], total = 0;
    for (int i = 0; i < n; i++) {
        if (logits[i] >= cut) total += exp(((double)logits[i] - mx) / temperature);
    }
    double u = pf_rng_uniform(rng) * total, acc = 0;
    int last = best;
    for (int i = 0; i < n; i++) {
        if (logits[i] < cut) continue;
        acc += exp(((double)logits[i] - mx) / temperature);
        last = i;
        if (u < acc) break;
    }
    *token = last;
    return PF_OK;
}
