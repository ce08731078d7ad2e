/* features.c: the random feature maps (Performer: Choromanski et al. 2020; FAVOR++ and FAVOR#:
 * Likhosherstov et al. 2022, 2023) and their stabilised block form.
 *
 * Each map is phi(x) with exp(x'.y') ~ phi(x).phi(y) for x' = x sqrt(s). The block form used by
 * the attention (pf_fmap_rows) projects a block of rows with one product, U = sqrt(s) X W^T (by
 * pf_mm, with the W^T that pf_fmap_bind makes), and
 * then turns each row of U into features in place, removing a per-row log factor c so that the
 * largest feature is O(1) whatever the input norm: exp(u - h) overflows (trig: exp(+h)) or
 * underflows for |x'| ~ 10, while u - max u never does. */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "attn_common.h"
#include "favor.h"

int pf_kernel_width(pf_kernel kernel, int m) {
    if (m <= 0) return 0;
    switch (kernel) {
    case PF_KERNEL_POSITIVE:
    case PF_KERNEL_RELU:
    case PF_KERNEL_OPRF:
    case PF_KERNEL_SDERF:
    case PF_KERNEL_ELU:
        return m;
    case PF_KERNEL_HYPERBOLIC:
    case PF_KERNEL_TRIG:
        return m <= INT32_MAX / 2 ? 2 * m : 0;
    }
    return 0;
}

enum { NKERNELS = 7 };
static const char *const kernel_names[NKERNELS] = {"positive", "hyperbolic", "trig", "relu",
                                                   "oprf",     "sderf",      "elu"};

/* relu and elu add eps to each feature as it is; the softmax maps relative to the row's top */
static int eps_absolute(pf_kernel kernel) {
    return kernel == PF_KERNEL_RELU || kernel == PF_KERNEL_ELU;
}

pf_status pf_kernel_parse(const char *name, pf_kernel *kernel) {
    if (!name || !kernel) return PF_EINVAL;
    for (int k = 0; k < NKERNELS; k++) {
        if (strcmp(name, kernel_names[k]) == 0) {
            *kernel = (pf_kernel)k;
            return PF_OK;
        }
    }
    /* the papers' names */
    if (strcmp(name, "favor++") == 0 || strcmp(name, "favor#") == 0) {
        *kernel = name[5] == '+' ? PF_KERNEL_OPRF : PF_KERNEL_SDERF;
        return PF_OK;
    }
    if (strcmp(name, "elu+1") == 0) {
        *kernel = PF_KERNEL_ELU;
        return PF_OK;
    }
    return PF_EINVAL;
}

const char *pf_kernel_name(pf_kernel kernel) {
    if ((int)kernel < 0 || (int)kernel >= NKERNELS) return "unknown";
    return kernel_names[kernel];
}

PF_CLONES int pf_nonfinite_f32(const float *x, size_t n) {
    /* x * 0 is 0 for finite x and NaN for Inf or NaN; 16 independent sums with a fixed inner
     * trip count, so that -O2 vectorises the loop. */
    float acc[16] = {0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) acc[k] += x[i + k] * 0.0f;
    for (; i < n; i++) acc[0] += x[i] * 0.0f;
    int bad = 0;
    for (int k = 0; k < 16; k++) bad |= acc[k] != 0.0f;
    return bad;
}

/* ---- a map's scratch and its binding to W and the map's parameters ----------------------- */

/* Rounds a count of 4- or 8-byte items up to a whole number of 64-byte lines. */
static size_t lines(size_t n, size_t size) {
    return (n * size + 63) / 64 * 64;
}

int pf_kernel_ws_alloc(pf_kernel_ws *kw, pf_kernel kernel, int m, int d) {
    memset(kw, 0, sizeof *kw);
    const int sd = kernel == PF_KERNEL_SDERF, par = sd || kernel == PF_KERNEL_OPRF;
    const size_t M = (size_t)m, D = (size_t)d;
    /* dsyev wants lwork >= 3d - 1, and (block size + 2) d to run blocked: 66 d is plenty */
    kw->lwork = sd ? 66 * d : 0;
    /* dwork: SDERF binding: W and W A in double (2 m d); fit: P, means (d d + 3 d) + lwork */
    const size_t nd = sd ? 2 * M * D + D * D + 3 * D + (size_t)kw->lwork : 0;
    const size_t sz[8] = {lines(sd ? D * D : 0, 4),     lines(sd ? D * D : 0, 4),
                          lines(sd ? M * D : 0, 4),     lines(par ? M : 0, 4),
                          lines(par ? M : 0, 8),        lines(nd, 8),
                          lines(sd ? 2 * D * D : 0, 4), lines(M * D, 4)};
    size_t total = 0;
    for (int i = 0; i < 8; i++) total += sz[i];
    char *p = pf_alloc(total, 1);
    if (!p) return -1;
    kw->mem = p;
    kw->A = (float *)p;
    p += sz[0];
    kw->B = (float *)p;
    p += sz[1];
    kw->weff = (float *)p;
    p += sz[2];
    kw->bias = (float *)p;
    p += sz[3];
    kw->bias64 = (double *)p;
    p += sz[4];
    kw->dwork = (double *)p;
    p += sz[5];
    kw->fwork = (float *)p;
    p += sz[6];
    kw->wt = (float *)p;
    return 0;
}

void pf_kernel_ws_free(pf_kernel_ws *kw) {
    if (kw) pf_free(kw->mem);
}

/* C (m,d) = X (m,d) Y (d,d) in double, row by row in a fixed order (the binding's products are
 * small: m d^2 once per head and call, so no BLAS; their bits depend on no library). */
static void dmm(double *C, const double *X, const double *Y, int m, int d) {
    const size_t D = (size_t)d;
    for (int i = 0; i < m; i++) {
        double *c = C + (size_t)i * D;
        for (int j = 0; j < d; j++) c[j] = 0.0;
        for (int k = 0; k < d; k++) {
            const double x = X[(size_t)i * D + k];
            const double *y = Y + (size_t)k * D;
            for (int j = 0; j < d; j++) c[j] += x * y[j];
        }
    }
}

pf_status pf_fmap_bind(pf_fmap *fm, pf_kernel_ws *kw, float oprf_a, const float *A, const float *B,
                       double log_d) {
    const int m = fm->m, d = fm->d;
    const size_t D = (size_t)d;
    if (fm->kernel == PF_KERNEL_OPRF) {
        /* u_f = B w_f.x' + A |w_f|^2, D = (1 - 4A)^(d/4) */
        const double a = (double)oprf_a, b = sqrt(1 - 4 * a);
        for (int f = 0; f < m; f++) {
            const float *w = fm->W0 + (size_t)f * D;
            double sq = 0;
            for (int k = 0; k < d; k++) sq += (double)w[k] * (double)w[k];
            kw->bias64[f] = a * sq;
            kw->bias[f] = (float)kw->bias64[f];
        }
        fm->oprf_b = b;
        fm->wscale = (float)((double)fm->sqrt_s * b);
        fm->wmax *= b; /* pf_fmap_make's max |w_f| */
        fm->logd = 0.25 * d * log(1 - 4 * a);
    } else if (fm->kernel == PF_KERNEL_SDERF) {
        /* rows B w_f (B symmetric: row f of W B) and w_f^T A w_f, in double */
        double *Wd = kw->dwork, *T = Wd + (size_t)m * D;
        for (size_t i = 0; i < (size_t)m * D; i++) Wd[i] = (double)fm->W0[i];
        double *Bd = T + (size_t)m * D; /* (d,d), scratch (the fit's P is done with) */
        for (size_t i = 0; i < D * D; i++) Bd[i] = (double)B[i];
        dmm(T, Wd, Bd, m, d);
        double wmax = 0;
        for (size_t i = 0; i < (size_t)m * D; i++) kw->weff[i] = (float)T[i];
        for (int f = 0; f < m; f++) {
            double sq = 0;
            for (int k = 0; k < d; k++) sq += T[(size_t)f * D + k] * T[(size_t)f * D + k];
            wmax = fmax(wmax, sqrt(sq));
        }
        for (size_t i = 0; i < D * D; i++) Bd[i] = (double)A[i];
        dmm(T, Wd, Bd, m, d);
        for (int f = 0; f < m; f++) {
            double acc = 0;
            for (int k = 0; k < d; k++) acc += T[(size_t)f * D + k] * Wd[(size_t)f * D + k];
            kw->bias64[f] = acc;
            kw->bias[f] = (float)acc;
        }
        fm->W = kw->weff;
        fm->wmax = wmax;
        fm->sderf_B = B;
        fm->logd = log_d;
    }
    /* W^T, for the projection U = X W^T as products with W^T's rows (pf_fmap_project): panel
     * by panel, the panel of columns [j0, j0 + w) (d x w) from W's rows j0 .. j0 + w - 1 */
    const int pw = pf_simd()->wt_panel;
    fm->wtp = pw > 0 && pw < m ? pw : m;
    for (int j0 = 0; j0 < m; j0 += fm->wtp) {
        const int w = m - j0 < fm->wtp ? m - j0 : fm->wtp;
        pf_transpose(kw->wt + (size_t)j0 * D, fm->W + (size_t)j0 * D, w, d, d);
    }
    fm->Wt = kw->wt;
    if (fm->kernel != PF_KERNEL_OPRF && fm->kernel != PF_KERNEL_SDERF) return PF_OK;
    fm->bias = kw->bias;
    fm->bias64 = kw->bias64;
    if (!isfinite(fm->logd) || !isfinite(fm->wmax) || pf_nonfinite_f32(kw->bias, (size_t)m))
        return PF_ENONFINITE;
    return PF_OK;
}

pf_fmap pf_fmap_make(pf_kernel kernel, const float *W, int m, int d, float scale, float eps) {
    pf_fmap f;
    f.kernel = kernel;
    f.W = W;
    f.W0 = W;
    f.Wt = NULL;
    f.wtp = m;
    f.m = m;
    f.d = d;
    f.r = pf_kernel_width(kernel, m);
    f.s = (double)pf_effective_scale(scale, d);
    f.sqrt_s = (float)sqrt(f.s);
    f.eps = eps;
    double wmax = 0;
    for (int i = 0; i < m; i++) {
        double sq = 0;
        for (int k = 0; k < d; k++) sq += (double)W[(size_t)i * d + k] * W[(size_t)i * d + k];
        wmax = fmax(wmax, sqrt(sq));
    }
    f.wmax = wmax;
    f.wscale = f.sqrt_s;
    f.bias = NULL;
    f.bias64 = NULL;
    f.logd = 0;
    f.oprf_b = 1;
    f.sderf_B = NULL;
    return f;
}

/* p[0..n) += add */
static void add_const(float *p, int n, float add) {
    for (int f = 0; f < n; f++) p[f] += add;
}

/* p[0..n) = exp(p - t): the subtraction in float, in the exp's own pass */
static void exp_shift(const pf_simd_table *vk, float *restrict p, float t, int n) {
    vk->exp_sub(p, p, t, (size_t)n);
}

/* p[0..n) += b[0..n) */
static void add_vec(float *restrict p, const float *restrict b, int n) {
#pragma omp simd
    for (int f = 0; f < n; f++) p[f] += b[f];
}

void pf_fmap_project(const pf_fmap *fm, float *phi, int ldphi, const float *X, int n) {
    assert(fm->Wt); /* (pf_fmap_bind) */
    const int m = fm->m, d = fm->d;
    for (int j0 = 0; j0 < m; j0 += fm->wtp) {
        const int w = m - j0 < fm->wtp ? m - j0 : fm->wtp;
        pf_mm(0, 0, n, w, d, fm->wscale, X, d, fm->Wt + (size_t)j0 * (size_t)d, w, 0.0f, phi + j0,
              ldphi);
    }
}

pf_status pf_fmap_rows(const pf_fmap *fm, float *phi, int ldphi, double *c, float *amax,
                       const float *X, int n) {
    /* U = sqrt(s) X W^T into the first m columns of each phi row: u = W x' (OPRF: B W x',
     * SDERF: rows B w_f, then the bias). */
    pf_fmap_project(fm, phi, ldphi, X, n);
    return pf_fmap_map_rows(fm, phi, ldphi, c, amax, X, n);
}

PF_CLONES pf_status pf_fmap_map_rows(const pf_fmap *fm, float *phi, int ldphi, double *c,
                                     float *amax, const float *X, int n) {
    const int m = fm->m, d = fm->d;
    const pf_simd_table *vk = pf_simd();
    /* h = |x'|^2 / 2 with the same float sqrt(s) as u, so u and h describe one x'. */
    const double s2 = (double)fm->sqrt_s * (double)fm->sqrt_s;
    const float eps = fm->eps;
    const int need_top = amax != NULL || eps > 0; /* the largest phi~ is O(1), known to rounding */
    const double wmax2 = fm->wmax * fm->wmax;
    const double lnr = 0.5 * log((double)(fm->kernel == PF_KERNEL_HYPERBOLIC ? 2 * m : m));
    pf_status st = PF_OK;
    for (int i = 0; i < n; i++) {
        float *p = phi + (size_t)i * (size_t)ldphi;
        const float *x = X + (size_t)i * (size_t)d;
        const double sq = pf_sumsq_f64(x, d);
        const double h = 0.5 * s2 * sq;
        /* |u_f| and every partial sum of the product are <= |x'| max|w| (Cauchy-Schwarz): only
         * rows near that bound, or with a NaN or Inf in x (then sq and every u_f are NaN or
         * Inf too), need the full test */
        if (!(s2 * sq * wmax2 <= 1e76) && pf_nonfinite_f32(p, (size_t)m)) {
            memset(p, 0, sizeof(float) * (size_t)fm->r);
            c[i] = 0;
            if (amax) amax[i] = 0;
            st = PF_ENONFINITE;
            continue;
        }
        float top = 0; /* the row's largest |phi~| before eps */
        switch (fm->kernel) {
        case PF_KERNEL_OPRF:
        case PF_KERNEL_SDERF:
            /* D exp(u + bias - h)/sqrt(m): the positive map on u + bias, log D into c */
            add_vec(p, fm->bias, m);
            /* fall through */
        case PF_KERNEL_POSITIVE: {
            /* exp(u - h)/sqrt(m) = exp(u - t) exp(c), t = max u + ln sqrt(m) rounded to float
             * and c = t - ln sqrt(m) - h: the 1/sqrt(m) rides in the shift, and c uses the
             * rounded t, so phi~ exp(c) is the feature to float rounding */
            const float mx = vk->max(p, (size_t)m);
            const float t = (float)((double)mx + lnr);
            exp_shift(vk, p, t, m);
            c[i] = (double)t - lnr - h + fm->logd;
            if (need_top) top = (float)exp((double)mx - (double)t);
            if (eps > 0) add_const(p, m, eps * top);
            break;
        }
        case PF_KERNEL_HYPERBOLIC: {
            /* [exp(u - h), exp(-u - h)]/sqrt(2m) likewise, shifted by a = max|u| */
            float *q = p + m;
            for (int f = 0; f < m; f++) q[f] = -p[f];
            const float a = fmaxf(vk->max(p, (size_t)m), vk->max(q, (size_t)m));
            const float t = (float)((double)a + lnr);
            exp_shift(vk, p, t, 2 * m);
            c[i] = (double)t - lnr - h;
            if (need_top) top = (float)exp((double)a - (double)t);
            if (eps > 0) add_const(p, 2 * m, eps * top);
            break;
        }
        case PF_KERNEL_TRIG: {
            /* exp(h) [sin u, cos u]/sqrt(m): the whole norm factor goes to c */
            const float inv = (float)(1.0 / sqrt((double)m));
            float *q = p + m;
            vk->sincos(p, q, p, (size_t)m); /* sin u in place, cos u after it */
            /* the features are finite here (the row passed the test above), so a plain max
             * is fmaxf */
#pragma omp simd reduction(max : top)
            for (int f = 0; f < 2 * m; f++) {
                p[f] *= inv;
                const float a = fabsf(p[f]);
                top = a > top ? a : top;
            }
            c[i] = h;
            if (eps > 0) add_const(p, 2 * m, eps * top);
            break;
        }
        case PF_KERNEL_RELU: {
            const float inv = (float)(1.0 / sqrt((double)m));
            for (int f = 0; f < m; f++) p[f] = (p[f] > 0.0f ? p[f] : 0.0f) * inv + eps;
            c[i] = 0;
            break;
        }
        case PF_KERNEL_ELU:
            /* elu(u) + 1: u + 1 for u > 0, exp(u) otherwise (taken as it is, not expm1 + 1,
             * which would lose the small values' digits); in (0, 1 + |u|]: no log factor */
            for (int f = 0; f < m; f++) p[f] = (p[f] > 0.0f ? p[f] + 1.0f : expf(p[f])) + eps;
            c[i] = 0;
            break;
        }
        if (amax) amax[i] = top;
    }
    return st;
}

/* The three per-feature steps of the map backward, over f < n, in blocks of 16 with fixed
 * trip counts and restrict pointers so that -O2 vectorises them; each returns a sum of terms
 * kept in 16 float lanes, added in double in a fixed order. g = p - sub is the feature before
 * eps. */
static inline __attribute__((always_inline)) double lanes_sum(const float *acc, double tail) {
    /* a pairwise tree (a chain of 16 dependent adds costs more than the lanes themselves) */
    double s[8];
    for (int k = 0; k < 8; k++) s[k] = (double)acc[k] + (double)acc[k + 8];
    for (int k = 0; k < 4; k++) s[k] += s[k + 4];
    return ((s[0] + s[2]) + (s[1] + s[3])) + tail;
}

/* positive: a_f = dp_f g_f in place; returns sum_f a_f */
static inline __attribute__((always_inline)) double
bwd_positive(float *restrict dp, const float *restrict p, float sub, int n) {
    float acc[16] = {0};
    int f = 0;
    for (; f + 16 <= n; f += 16)
        for (int k = 0; k < 16; k++) {
            const float t = dp[f + k] * (p[f + k] - sub);
            dp[f + k] = t;
            acc[k] += t;
        }
    double tail = 0;
    for (; f < n; f++) {
        const float t = dp[f] * (p[f] - sub);
        dp[f] = t;
        tail += t;
    }
    return lanes_sum(acc, tail);
}

/* hyperbolic (d1, p1 the exp(u) half, d2, p2 the exp(-u) half): a_f = d1 g1 - d2 g2 into d1;
 * returns sum_f (d1 g1 + d2 g2) */
static inline __attribute__((always_inline)) double
bwd_hyperbolic(float *restrict d1, const float *restrict d2, const float *restrict p1,
               const float *restrict p2, float sub, int n) {
    float acc[16] = {0};
    int f = 0;
    for (; f + 16 <= n; f += 16)
        for (int k = 0; k < 16; k++) {
            const float t1 = d1[f + k] * (p1[f + k] - sub), t2 = d2[f + k] * (p2[f + k] - sub);
            d1[f + k] = t1 - t2;
            acc[k] += t1 + t2;
        }
    double tail = 0;
    for (; f < n; f++) {
        const float t1 = d1[f] * (p1[f] - sub), t2 = d2[f] * (p2[f] - sub);
        d1[f] = t1 - t2;
        tail += t1 + t2;
    }
    return lanes_sum(acc, tail);
}

/* trig (1: sin half, 2: cos half): a_f = d1 g2 - d2 g1 into d1; returns sum_f (d1 g1 + d2 g2) */
static inline __attribute__((always_inline)) double
bwd_trig(float *restrict d1, const float *restrict d2, const float *restrict p1,
         const float *restrict p2, float sub, int n) {
    float acc[16] = {0};
    int f = 0;
    for (; f + 16 <= n; f += 16)
        for (int k = 0; k < 16; k++) {
            const float g1 = p1[f + k] - sub, g2 = p2[f + k] - sub;
            const float a = d1[f + k] * g2 - d2[f + k] * g1;
            acc[k] += d1[f + k] * g1 + d2[f + k] * g2;
            d1[f + k] = a;
        }
    double tail = 0;
    for (; f < n; f++) {
        const float g1 = p1[f] - sub, g2 = p2[f] - sub;
        const float a = d1[f] * g2 - d2[f] * g1;
        tail += d1[f] * g1 + d2[f] * g2;
        d1[f] = a;
    }
    return lanes_sum(acc, tail);
}

/* sum of x[0..n), 16 float lanes added in double */
static inline __attribute__((always_inline)) double sum_lanes(const float *x, int n) {
    float acc[16] = {0};
    int f = 0;
    for (; f + 16 <= n; f += 16)
        for (int k = 0; k < 16; k++) acc[k] += x[f + k];
    double tail = 0;
    for (; f < n; f++) tail += x[f];
    return lanes_sum(acc, tail);
}

PF_CLONES int pf_fmap_rows_backward(const pf_fmap *fm, float *dX, float *dphi, int lddphi,
                                    const float *phi, int ldphi, const float *amax, const float *X,
                                    int n, double *b) {
    const int m = fm->m, d = fm->d, r = fm->r;
    const float eps = fm->eps;
    for (int i = 0; i < n; i++) {
        float *dp = dphi + (size_t)i * (size_t)lddphi;
        const float *p = phi + (size_t)i * (size_t)ldphi;
        /* g = phi~ before eps */
        const float sub = eps_absolute(fm->kernel) ? eps : eps * amax[i];
        if (eps > 0 && !eps_absolute(fm->kernel)) {
            /* phi~ = g + eps max|g|: the max passes eps sign(g*) sum(dphi) to its argmax */
            int fs = 0;
            float best = -1.0f;
            for (int f = 0; f < r; f++) {
                const float g = fabsf(p[f] - sub);
                if (g > best) {
                    best = g;
                    fs = f;
                }
            }
            const double dsum = sum_lanes(dp, r);
            dp[fs] += (float)((double)eps * (p[fs] - sub < 0 ? -dsum : dsum));
        }
        /* a_f = dg/du_f into dp[0..m); b = dg/dh */
        switch (fm->kernel) {
        case PF_KERNEL_POSITIVE: /* g = exp(u - h - t): dg/du = g, dg/dh = -g */
        case PF_KERNEL_OPRF:     /* the same in u = B w.x' + bias (the bias is a constant) */
        case PF_KERNEL_SDERF:
            b[i] = -bwd_positive(dp, p, sub, m);
            break;
        case PF_KERNEL_HYPERBOLIC: /* g1 = exp(u - h - t), g2 = exp(-u - h - t) */
            b[i] = -bwd_hyperbolic(dp, dp + m, p, p + m, sub, m);
            break;
        case PF_KERNEL_TRIG: /* g1 = exp(h - c) sin u, g2 = exp(h - c) cos u */
            b[i] = bwd_trig(dp, dp + m, p, p + m, sub, m);
            break;
        case PF_KERNEL_RELU: { /* g = relu(u)/sqrt(m): u > 0 exactly where g > 0 */
            const float inv = (float)(1.0 / sqrt((double)m));
            for (int f = 0; f < m; f++) dp[f] = p[f] - sub > 0.0f ? dp[f] * inv : 0.0f;
            b[i] = 0;
            break;
        }
        case PF_KERNEL_ELU: /* g = u + 1 > 1 for u > 0 (dg/du = 1), g = exp(u) <= 1 otherwise
                               (dg/du = g): dg/du = min(g, 1), read off the kept feature */
            for (int f = 0; f < m; f++) dp[f] *= fminf(p[f] - sub, 1.0f);
            b[i] = 0;
            break;
        }
    }
    /* dx = sqrt(s) dx' = sqrt(s) (a W + b x') = sqrt(s) a W + s b x (du/dx': OPRF B W, SDERF the
     * rows B w_f: wscale and fm->W say which) */
    pf_mm(0, 0, n, d, m, fm->wscale, dphi, lddphi, fm->W, d, 0.0f, dX, d);
    const double s2 = (double)fm->sqrt_s * (double)fm->sqrt_s;
    for (int i = 0; i < n; i++) {
        if (b[i] == 0) continue;
        const float f = (float)(s2 * b[i]);
        float *dx = dX + (size_t)i * (size_t)d;
        const float *x = X + (size_t)i * (size_t)d;
#pragma omp simd
        for (int k = 0; k < d; k++) dx[k] += f * x[k];
    }
    return pf_nonfinite_f32(dX, (size_t)n * (size_t)d); /* (while in cache) */
}

/* Features of n rows with a bound map, in blocks of 128 rows. */
static pf_status features_rows(const pf_fmap *fm, float *phi, float *logscale, const float *X,
                               int n) {
    const int r = fm->r, d = fm->d;
    enum { NB = 128 };
    double c[NB];
    for (int i0 = 0; i0 < n; i0 += NB) {
        const int nb = n - i0 < NB ? n - i0 : NB;
        float *p0 = phi + (size_t)i0 * (size_t)r;
        pf_status st = pf_fmap_rows(fm, p0, r, c, NULL, X + (size_t)i0 * (size_t)d, nb);
        if (st != PF_OK) return st;
        for (int i = 0; i < nb; i++) {
            if (logscale) {
                logscale[i0 + i] = (float)c[i];
                continue;
            }
            /* the unstabilised features, phi~ exp(c), rounded once from double */
            float *p = p0 + (size_t)i * (size_t)r;
            const double e = exp(c[i]);
            for (int f = 0; f < r; f++) p[f] = (float)((double)p[f] * e);
            if (pf_nonfinite_f32(p, (size_t)r)) return PF_ENONFINITE;
        }
    }
    return PF_OK;
}

pf_status pf_features_ex(float *phi, float *logscale, const float *X, int n, int d, const float *W,
                         int m, pf_kernel kernel, float scale, float eps,
                         const pf_kernel_params *params) {
    if (!phi || !X || !W) return PF_EINVAL;
    if (n <= 0 || d <= 0 || m <= 0) return PF_EINVAL;
    const int r = pf_kernel_width(kernel, m);
    if (r == 0) return PF_EINVAL;
    if (!isfinite(scale) || scale < 0 || !isfinite(eps) || eps < 0) return PF_EINVAL;
    const size_t dd = (size_t)d * (size_t)d;
    if (kernel == PF_KERNEL_OPRF) {
        if (!params || !isfinite(params->oprf_a) || !(params->oprf_a < 0.125f)) return PF_EINVAL;
    } else if (kernel == PF_KERNEL_SDERF) {
        if (!params || !params->sderf_A || !params->sderf_B || !isfinite(params->sderf_log_D))
            return PF_EINVAL;
        if (pf_nonfinite_f32(params->sderf_A, dd) || pf_nonfinite_f32(params->sderf_B, dd))
            return PF_ENONFINITE;
    }
    {
        const size_t f = sizeof(float);
        const pf_span outs[2] = {{phi, (size_t)n * (size_t)r * f}, {logscale, (size_t)n * f}};
        const pf_span ins[4] = {
            {X, (size_t)n * (size_t)d * f},
            {W, (size_t)m * (size_t)d * f},
            {params ? params->sderf_A : NULL, kernel == PF_KERNEL_SDERF ? dd * f : 0},
            {params ? params->sderf_B : NULL, kernel == PF_KERNEL_SDERF ? dd * f : 0}};
        if (pf_aliased(outs, 2, ins, 4)) return PF_EINVAL;
    }
    if (pf_nonfinite_f32(X, (size_t)n * (size_t)d) || pf_nonfinite_f32(W, (size_t)m * (size_t)d))
        return PF_ENONFINITE;

    pf_fmap fm = pf_fmap_make(kernel, W, m, d, scale, eps);
    pf_kernel_ws kw;
    if (pf_kernel_ws_alloc(&kw, kernel, m, d) != 0) return PF_ENOMEM;
    pf_status st = PF_OK;
    if (kernel == PF_KERNEL_OPRF)
        st = pf_fmap_bind(&fm, &kw, params->oprf_a, NULL, NULL, 0.0);
    else if (kernel == PF_KERNEL_SDERF)
        st = pf_fmap_bind(&fm, &kw, 0.0f, params->sderf_A, params->sderf_B, params->sderf_log_D);
    else
        st = pf_fmap_bind(&fm, &kw, 0.0f, NULL, NULL, 0.0);
    if (st == PF_OK) st = features_rows(&fm, phi, logscale, X, n);
    pf_kernel_ws_free(&kw);
    return st;
}

pf_status pf_features(float *phi, float *logscale, const float *X, int n, int d, const float *W,
                      int m, pf_kernel kernel, float scale, float eps) {
    /* OPRF and SDERF have parameters: pf_features_ex */
    if (kernel == PF_KERNEL_OPRF || kernel == PF_KERNEL_SDERF) return PF_EINVAL;
    return pf_features_ex(phi, logscale, X, n, d, W, m, kernel, scale, eps, NULL);
}

/* ---- float64 features, one row at a time: the references' own code ----------------------- */

/* (B z)_k for OPRF (scalar B) and SDERF (the float matrix B, symmetric), z = y, or x sq if y is
 * NULL */
static double apply_b(const pf_fmap *fm, const double *y, const float *x, double sq, int k) {
    if (fm->kernel == PF_KERNEL_OPRF) return fm->oprf_b * (y ? y[k] : (double)x[k] * sq);
    const float *row = fm->sderf_B + (size_t)k * (size_t)fm->d;
    double acc = 0;
    for (int l = 0; l < fm->d; l++) acc += (double)row[l] * (y ? y[l] : (double)x[l] * sq);
    return acc;
}

/* u = W x' into u (m) for x' = x sqrt(s) (OPRF, SDERF: u_f = w_f.B x' + bias_f); returns
 * h = |x'|^2 / 2. */
static double project_f64(const pf_fmap *fm, double *u, const float *x) {
    const int m = fm->m, d = fm->d;
    const double sq = sqrt(fm->s);
    const int opt = fm->kernel == PF_KERNEL_OPRF || fm->kernel == PF_KERNEL_SDERF;
    double h = 0;
    for (int k = 0; k < d; k++) h += ((double)x[k] * sq) * ((double)x[k] * sq);
    double y[256]; /* B x' (for larger d, B x' is recomputed per feature) */
    const int keep = opt && d <= 256;
    if (keep)
        for (int k = 0; k < d; k++) y[k] = apply_b(fm, NULL, x, sq, k);
    for (int f = 0; f < m; f++) {
        const float *w = fm->W0 + (size_t)f * (size_t)d;
        double acc = 0;
        for (int k = 0; k < d; k++) {
            const double xk = !opt ? (double)x[k] * sq : keep ? y[k] : apply_b(fm, NULL, x, sq, k);
            acc += (double)w[k] * xk;
        }
        u[f] = acc + (opt ? fm->bias64[f] : 0.0);
    }
    return 0.5 * h;
}

/* The feature g_f before eps (f < r), from u and h. */
static double base_f64(const pf_fmap *fm, const double *u, double h, int f) {
    const int m = fm->m;
    switch (fm->kernel) {
    case PF_KERNEL_POSITIVE:
        return exp(u[f] - h) / sqrt((double)m);
    case PF_KERNEL_OPRF:
    case PF_KERNEL_SDERF:
        return exp(u[f] - h + fm->logd) / sqrt((double)m);
    case PF_KERNEL_HYPERBOLIC:
        return (f < m ? exp(u[f] - h) : exp(-u[f - m] - h)) / sqrt(2.0 * (double)m);
    case PF_KERNEL_TRIG:
        return exp(h) * (f < m ? sin(u[f]) : cos(u[f - m])) / sqrt((double)m);
    case PF_KERNEL_RELU:
        return (u[f] > 0 ? u[f] : 0.0) / sqrt((double)m);
    case PF_KERNEL_ELU:
        return u[f] > 0 ? u[f] + 1.0 : exp(u[f]);
    }
    return 0;
}

int pf_fmap_row_f64(const pf_fmap *fm, double *phi, double *u, const float *x) {
    const int r = fm->r;
    const double h = project_f64(fm, u, x);
    double amax = 0;
    for (int f = 0; f < r; f++) {
        phi[f] = base_f64(fm, u, h, f);
        amax = fmax(amax, fabs(phi[f]));
    }
    /* eps: relative to the row's largest |feature| for the softmax maps, absolute for relu, elu */
    const double add = eps_absolute(fm->kernel) ? (double)fm->eps : (double)fm->eps * amax;
    int bad = 0;
    for (int f = 0; f < r; f++) {
        phi[f] += add;
        bad |= !isfinite(phi[f]);
    }
    return bad ? -1 : 0;
}

/* dg_f: the upstream gradient of feature f plus the eps term's share at the argmax. */
static inline double dg_at(const double *dphi, int f, int fmax_i, double extra) {
    return dphi[f] + (f == fmax_i ? extra : 0.0);
}

void pf_fmap_row_f64_backward(const pf_fmap *fm, double *dx, const double *dphi, const float *x,
                              const double *u) {
    const int m = fm->m, d = fm->d, r = fm->r;
    const double sq = sqrt(fm->s);
    double h = 0;
    for (int k = 0; k < d; k++) h += ((double)x[k] * sq) * ((double)x[k] * sq);
    h *= 0.5;

    /* phi = g + eps max|g|: the max passes eps * sign * sum(dphi) to its argmax (a.e.) */
    int fmax_i = 0;
    double gmax = 0, dsum = 0;
    for (int f = 0; f < r; f++) {
        double g = base_f64(fm, u, h, f);
        dsum += dphi[f];
        if (fabs(g) > fabs(gmax)) {
            gmax = g;
            fmax_i = f;
        }
    }
    double extra = 0;
    if (!eps_absolute(fm->kernel)) extra = (double)fm->eps * (gmax < 0 ? -1.0 : 1.0) * dsum;

    /* dx' = sum_f (dg/du_f) w_f + (dg/dh) x'  (du_f/dx' = w_f, dh/dx' = x'; OPRF and SDERF:
     * du_f/dx' = B w_f, so dx' = B sum_f (dg/du_f) w_f + (dg/dh) x') */
    const int opt = fm->kernel == PF_KERNEL_OPRF || fm->kernel == PF_KERNEL_SDERF;
    const int late = opt && d <= 256; /* B applied once at the end (else per feature) */
    for (int k = 0; k < d; k++) dx[k] = 0;
    double b = 0;
    for (int f = 0; f < m; f++) {
        /* dg of feature f and, for the two-block maps, of its partner m + f */
        const double d1 = dg_at(dphi, f, fmax_i, extra);
        const double d2 = r > m ? dg_at(dphi, m + f, fmax_i, extra) : 0.0;
        const double g1 = base_f64(fm, u, h, f);
        const double g2 = r > m ? base_f64(fm, u, h, m + f) : 0.0;
        double a = 0;
        switch (fm->kernel) {
        case PF_KERNEL_POSITIVE: /* g = exp(u - h)/sqrt(m) */
        case PF_KERNEL_OPRF:     /* g = D exp(u - h)/sqrt(m), u = w.B x' + bias */
        case PF_KERNEL_SDERF:
            a = d1 * g1;
            b -= d1 * g1;
            break;
        case PF_KERNEL_HYPERBOLIC: /* g1 = exp(u - h)/sqrt(2m), g2 = exp(-u - h)/sqrt(2m) */
            a = d1 * g1 - d2 * g2;
            b -= d1 * g1 + d2 * g2;
            break;
        case PF_KERNEL_TRIG: /* g1 = exp(h) sin(u)/sqrt(m), g2 = exp(h) cos(u)/sqrt(m) */
            a = d1 * g2 - d2 * g1;
            b += d1 * g1 + d2 * g2;
            break;
        case PF_KERNEL_RELU: /* g = relu(u)/sqrt(m) */
            a = u[f] > 0 ? d1 / sqrt((double)m) : 0.0;
            break;
        case PF_KERNEL_ELU: /* g = u + 1 (u > 0), exp(u) (u <= 0) */
            a = u[f] > 0 ? d1 : d1 * exp(u[f]);
            break;
        }
        const float *w = fm->W0 + (size_t)f * (size_t)d;
        if (opt && !late) {
            for (int k = 0; k < d; k++) dx[k] += a * apply_b(fm, NULL, w, 1.0, k); /* B w_f */
            continue;
        }
        for (int k = 0; k < d; k++) dx[k] += a * (double)w[k];
    }
    if (late) {
        double t[256];
        for (int k = 0; k < d; k++) t[k] = dx[k];
        for (int k = 0; k < d; k++) dx[k] = apply_b(fm, t, x, sq, k);
    }
    for (int k = 0; k < d; k++) dx[k] = (dx[k] + b * ((double)x[k] * sq)) * sq;
}
