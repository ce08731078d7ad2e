/* optim.c: AdamW (Loshchilov & Hutter 2019) with global-norm gradient clipping, and the
 * learning-rate schedule (linear warm-up, then cosine decay). */
#include <math.h>
#include <stdlib.h>

#include "model/model.h"

enum { NORM_BLOCK = 16384 }; /* elements per partial sum of the gradient norm */

pf_adamw pf_adamw_default(void) {
    pf_adamw o = {.lr = 3e-4f,
                  .beta1 = 0.9f,
                  .beta2 = 0.95f,
                  .eps = 1e-8f,
                  .weight_decay = 0.1f,
                  .clip = 1.0f};
    return o;
}

pf_status lm_grad_norm(const pf_model *m, double *norm) {
    // partial sums of squares over fixed blocks, then added in block order
    size_t n = m->num_params;
    int64_t nb = (int64_t)((n + NORM_BLOCK - 1) / NORM_BLOCK);
    double *part = malloc(sizeof(double) * (size_t)(nb > 0 ? nb : 1));
    if (!part) return PF_ENOMEM;
    const float *g = m->grads_memory;
    const int nt = pf_threads(0);
    (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        size_t i0 = (size_t)b * NORM_BLOCK, i1 = i0 + NORM_BLOCK < n ? i0 + NORM_BLOCK : n;
        double s = 0;
        for (size_t i = i0; i < i1; i++) s += (double)g[i] * g[i];
        part[b] = s;
    }
    double s = 0;
    for (int64_t b = 0; b < nb; b++) s += part[b];
    free(part);
    *norm = sqrt(s);
    return PF_OK;
}

pf_status pf_model_step(pf_model *m, const pf_adamw *o, float *grad_norm) {
    if (!m || !o) return PF_EINVAL;
    if (!(o->lr >= 0) || !isfinite(o->lr) || !(o->beta1 >= 0 && o->beta1 < 1) ||
        !(o->beta2 >= 0 && o->beta2 < 1) || !(o->eps > 0) || !isfinite(o->eps) ||
        !(o->weight_decay >= 0) || !isfinite(o->weight_decay) || !(o->clip >= 0) ||
        !isfinite(o->clip))
        return PF_EINVAL;
    double norm;
    pf_status st = lm_grad_norm(m, &norm);
    if (st != PF_OK) return st;
    if (grad_norm) *grad_norm = (float)norm;
    if (!isfinite(norm)) return PF_ENONFINITE;
    float gscale = (o->clip > 0 && norm > o->clip) ? (float)(o->clip / norm) : 1.0f;

    // bias corrections of step t = step + 1
    double t = (double)(m->step + 1);
    float bc1 = (float)(1.0 - pow(o->beta1, t));
    float bc2 = (float)(1.0 - pow(o->beta2, t));
    const float lr = o->lr, b1 = o->beta1, b2 = o->beta2, eps = o->eps;
    const int nt = pf_threads(0);
    (void)nt;
    size_t off = 0;
    for (int i = 0; i < LM_NUM_PARAMS; i++) {
        size_t n = m->param_sizes[i];
        float wd = lm_param_decays(i) ? o->weight_decay : 0.0f;
        float *p = m->params_memory + off, *g = m->grads_memory + off;
        float *mm = m->m_memory + off, *vv = m->v_memory + off;
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t j = 0; j < (int64_t)n; j++) {
            // m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
            // p -= lr (m/bc1 / (sqrt(v/bc2) + eps) + wd p)
            float gj = g[j] * gscale;
            float mj = b1 * mm[j] + (1.0f - b1) * gj;
            float vj = b2 * vv[j] + (1.0f - b2) * gj * gj;
            mm[j] = mj;
            vv[j] = vj;
            float mhat = mj / bc1, vhat = vj / bc2;
            p[j] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[j]);
        }
        off += n;
    }
    m->step++;
    return PF_OK;
}

double pf_lr_schedule(int64_t step, int64_t total, int64_t warmup, double lr, double lr_min) {
    if (step < 0) step = 0;
    if (warmup > 0 && step < warmup) return lr * (double)(step + 1) / (double)warmup;
    if (total <= warmup) return lr;
    double p = (double)(step - warmup) / (double)(total - warmup);
    if (p > 1) p = 1;
    return lr_min + 0.5 * (lr - lr_min) * (1.0 + cos(3.14159265358979323846 * p));
}
