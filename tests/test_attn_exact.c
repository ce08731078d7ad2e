/* test_attn_exact.c: exact softmax attention, forward and backward.
 *
 * Every result is compared with a float64 computation written here (independent of the
 * library's references): the forward formula computed naively, and the gradients by central
 * finite differences of that forward. The library's fast paths are also compared with its
 * references, and must give bit-identical results at any thread count. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

/* ---- the test's own float64 attention ------------------------------------------------------ */

typedef struct cfg {
    int B, H, Lq, Lk, d, dv;
    int causal;
    const int32_t *key_len; /* NULL: all keys */
    float scale;            /* 0: 1/sqrt(d) */
    float sigma;            /* std of Q and K entries */
    const char *name;
} cfg;

static pf_shape shape_of(const cfg *c) {
    pf_shape s = {c->B, c->H, c->Lq, c->Lk, c->d, c->dv};
    return s;
}

static pf_attn_opts opts_of(const cfg *c, int threads) {
    pf_attn_opts o = pf_attn_opts_default();
    o.causal = c->causal;
    o.key_len = c->key_len;
    o.scale = c->scale;
    o.threads = threads;
    return o;
}

/* out (B,H,Lq,dv) and lse (B,H,Lq) in double from double inputs, by the definition:
 * out_i = sum_j e^{s q_i.k_j} v_j / sum_j e^{s q_i.k_j} over j < key_len (and j <= i if causal).
 * The max is subtracted only to keep exp finite; it cancels exactly. */
static void naive_forward(double *out, double *lse, const double *Q, const double *K,
                          const double *V, const cfg *c) {
    double s = c->scale > 0 ? c->scale : 1.0 / sqrt((double)c->d);
    double *sc = xmalloc(sizeof(double) * (size_t)c->Lk);
    for (int b = 0; b < c->B; b++) {
        int kl = c->key_len ? c->key_len[b] : c->Lk;
        for (int h = 0; h < c->H; h++) {
            size_t bh = (size_t)b * c->H + h;
            for (int i = 0; i < c->Lq; i++) {
                const double *q = Q + (bh * c->Lq + i) * c->d;
                double mx = -INFINITY;
                int nk = 0;
                for (int j = 0; j < kl; j++) {
                    if (c->causal && j > i) break;
                    const double *k = K + (bh * c->Lk + j) * c->d;
                    double dot = 0;
                    for (int e = 0; e < c->d; e++) dot += q[e] * k[e];
                    sc[j] = s * dot;
                    mx = fmax(mx, sc[j]);
                    nk++;
                }
                double z = 0;
                double *o = out + (bh * c->Lq + i) * c->dv;
                for (int e = 0; e < c->dv; e++) o[e] = 0;
                for (int j = 0; j < nk; j++) {
                    double w = exp(sc[j] - mx);
                    z += w;
                    for (int e = 0; e < c->dv; e++) o[e] += w * V[(bh * c->Lk + j) * c->dv + e];
                }
                for (int e = 0; e < c->dv; e++) o[e] /= z;
                if (lse) lse[bh * c->Lq + i] = mx + log(z);
            }
        }
    }
    free(sc);
}

static double *to_f64(const float *x, size_t n) {
    double *y = xmalloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

/* Inputs of one case, filled from fixed seeds. */
typedef struct data {
    size_t nq, nk, nv, no, nl;
    float *Q, *K, *V, *dout;
} data;

static data make_data(const cfg *c, uint64_t seed) {
    data t;
    size_t bh = (size_t)c->B * c->H;
    t.nq = bh * c->Lq * c->d;
    t.nk = bh * c->Lk * c->d;
    t.nv = bh * c->Lk * c->dv;
    t.no = bh * c->Lq * c->dv;
    t.nl = bh * c->Lq;
    t.Q = xmalloc(sizeof(float) * t.nq);
    t.K = xmalloc(sizeof(float) * t.nk);
    t.V = xmalloc(sizeof(float) * t.nv);
    t.dout = xmalloc(sizeof(float) * t.no);
    fill_normal(t.Q, t.nq, c->sigma, seed, 1);
    fill_normal(t.K, t.nk, c->sigma, seed, 2);
    fill_normal(t.V, t.nv, 1.0f, seed, 3);
    fill_normal(t.dout, t.no, 1.0f, seed, 4);
    return t;
}

static void free_data(data *t) {
    free(t->Q);
    free(t->K);
    free(t->V);
    free(t->dout);
}

/* ---- forward ------------------------------------------------------------------------------- */

/* Fast and reference forward against the naive float64 forward. The inputs are float32, so the
 * float64 result on the same inputs is exact up to 1e-15; what remains is the library's float32
 * rounding: scores rounded to float (relative 6e-8 of |s q.k|), P V summed in float. */
static void test_forward_case(const cfg *c) {
    data t = make_data(c, 1000u + (uint64_t)c->Lq * 7 + (uint64_t)c->Lk);
    pf_shape sh = shape_of(c);
    pf_attn_opts o = opts_of(c, 0);
    double *Qd = to_f64(t.Q, t.nq), *Kd = to_f64(t.K, t.nk), *Vd = to_f64(t.V, t.nv);
    double *oref = xmalloc(sizeof(double) * t.no), *lref = xmalloc(sizeof(double) * t.nl);
    naive_forward(oref, lref, Qd, Kd, Vd, c);

    float *out = xmalloc(sizeof(float) * t.no), *lse = xmalloc(sizeof(float) * t.nl);
    float *out2 = xmalloc(sizeof(float) * t.no), *lse2 = xmalloc(sizeof(float) * t.nl);
    for (size_t i = 0; i < t.no; i++) out[i] = out2[i] = 1e30f; /* overwritten, not read */

    CHECK_STATUS(pf_attn_exact(out, lse, t.Q, t.K, t.V, &sh, &o), PF_OK);
    CHECK_STATUS(pf_attn_exact_ref(out2, lse2, t.Q, t.K, t.V, &sh, &o), PF_OK);
    double e_fast = rel_err_f64(out, oref, t.no), e_ref = rel_err_f64(out2, oref, t.no);
    double e_fr = rel_err(out, out2, t.no);
    CHECK(e_fast < 1e-5, "%s: fast forward rel err %.3g", c->name, e_fast);
    CHECK(e_ref < 1e-6, "%s: reference forward rel err %.3g", c->name, e_ref);
    CHECK(e_fr < 1e-5, "%s: fast vs reference rel err %.3g", c->name, e_fr);

    /* lse: float32 of a value up to a few hundred; the score rounding bounds the error. */
    double worst = 0;
    for (size_t i = 0; i < t.nl; i++) {
        double tol = 1e-5 + 1e-6 * fabs(lref[i]);
        worst = fmax(worst, fabs(lse[i] - lref[i]) / tol);
        worst = fmax(worst, fabs(lse2[i] - lref[i]) / tol);
    }
    CHECK(worst <= 1.0, "%s: lse off by %.3g tolerances", c->name, worst);

    /* Without lse the output is the same. */
    for (size_t i = 0; i < t.no; i++) out2[i] = -1.0f;
    CHECK_STATUS(pf_attn_exact(out2, NULL, t.Q, t.K, t.V, &sh, &o), PF_OK);
    CHECK(memcmp(out, out2, sizeof(float) * t.no) == 0, "%s: lse == NULL changes out", c->name);

    printf("  %-28s fast %.2e  ref %.2e  fast-ref %.2e\n", c->name, e_fast, e_ref, e_fr);
    free(Qd);
    free(Kd);
    free(Vd);
    free(oref);
    free(lref);
    free(out);
    free(lse);
    free(out2);
    free(lse2);
    free_data(&t);
}

static const int32_t kl_a[2] = {77, 301};
static const int32_t kl_b[2] = {1, 200};
static const int32_t kl_c[2] = {600, 513};
static const int32_t kl_d[2] = {5, 3};

static void test_forward(void) {
    /* Block sizes in the library are 128 queries x 512 keys: lengths straddle both. */
    const cfg cases[] = {
        {1, 2, 200, 200, 32, 32, 0, NULL, 0, 1, "bidirectional"},
        {1, 2, 300, 300, 16, 16, 1, NULL, 0, 1, "causal"},
        {2, 2, 130, 301, 16, 8, 0, kl_a, 0, 1, "padded"},
        {2, 1, 301, 301, 8, 8, 1, kl_b, 0, 1, "padded causal"},
        {2, 1, 130, 700, 8, 8, 0, kl_c, 0, 1, "padded, key blocks"},
        {1, 1, 1, 1, 4, 4, 0, NULL, 0, 1, "L = 1"},
        {1, 1, 1, 1, 4, 4, 1, NULL, 0, 1, "L = 1 causal"},
        {1, 1, 7, 7, 5, 3, 1, NULL, 0, 1, "L = 7 causal"},
        {1, 1, 7, 130, 16, 16, 0, NULL, 0, 1, "Lq 7, Lk 130"},
        {1, 1, 301, 7, 16, 16, 0, NULL, 0, 1, "Lq 301, Lk 7"},
        {1, 1, 37, 1100, 16, 24, 0, NULL, 0, 1, "Lq 37, Lk 1100, dv != d"},
        {1, 1, 600, 600, 8, 8, 1, NULL, 0, 1, "causal 600"},
        {2, 3, 65, 129, 8, 12, 0, NULL, 0, 1, "B 2, H 3"},
        {2, 3, 65, 65, 8, 12, 1, NULL, 0.3f, 1, "B 2, H 3, causal, s 0.3"},
        {1, 2, 200, 150, 16, 16, 0, NULL, 0.05f, 1, "scale 0.05"},
        /* |q|, |k| ~ 30 (sigma 30/sqrt(16) = 7.5): logits s q.k up to several hundred, so
         * exp of a raw logit overflows float; the online max must keep every step finite. */
        {1, 2, 300, 1100, 16, 16, 0, NULL, 0, 7.5f, "large logits"},
        {1, 1, 700, 700, 16, 16, 1, NULL, 1.0f, 7.5f, "large logits causal s 1"},
    };
    printf("forward, relative error against float64:\n");
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) test_forward_case(&cases[k]);
}

/* ---- thread-count independence ------------------------------------------------------------- */

static void test_threads(void) {
    const cfg cases[] = {
        {1, 2, 300, 300, 16, 16, 1, NULL, 0, 1, "causal"},
        {2, 1, 301, 700, 8, 12, 0, kl_c, 0, 1, "padded"},
        {1, 1, 1, 1, 4, 4, 0, NULL, 0, 1, "L = 1"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        const cfg *c = &cases[k];
        data t = make_data(c, 77);
        pf_shape sh = shape_of(c);
        float *o[3], *l[3], *g[3][3];
        const int nth[3] = {1, 2, 3};
        for (int r = 0; r < 3; r++) {
            pf_attn_opts op = opts_of(c, nth[r]);
            o[r] = xmalloc(sizeof(float) * t.no);
            l[r] = xmalloc(sizeof(float) * t.nl);
            g[r][0] = xmalloc(sizeof(float) * t.nq);
            g[r][1] = xmalloc(sizeof(float) * t.nk);
            g[r][2] = xmalloc(sizeof(float) * t.nv);
            CHECK_STATUS(pf_attn_exact(o[r], l[r], t.Q, t.K, t.V, &sh, &op), PF_OK);
            CHECK_STATUS(pf_attn_exact_backward(g[r][0], g[r][1], g[r][2], t.dout, t.Q, t.K, t.V,
                                                o[r], l[r], &sh, &op),
                         PF_OK);
        }
        for (int r = 1; r < 3; r++) {
            CHECK(memcmp(o[0], o[r], sizeof(float) * t.no) == 0, "%s: out differs, %d threads",
                  c->name, nth[r]);
            CHECK(memcmp(l[0], l[r], sizeof(float) * t.nl) == 0, "%s: lse differs, %d threads",
                  c->name, nth[r]);
            CHECK(memcmp(g[0][0], g[r][0], sizeof(float) * t.nq) == 0, "%s: dQ differs, %d threads",
                  c->name, nth[r]);
            CHECK(memcmp(g[0][1], g[r][1], sizeof(float) * t.nk) == 0, "%s: dK differs, %d threads",
                  c->name, nth[r]);
            CHECK(memcmp(g[0][2], g[r][2], sizeof(float) * t.nv) == 0, "%s: dV differs, %d threads",
                  c->name, nth[r]);
        }
        for (int r = 0; r < 3; r++) {
            free(o[r]);
            free(l[r]);
            for (int w = 0; w < 3; w++) free(g[r][w]);
        }
        free_data(&t);
    }
}

/* ---- backward ------------------------------------------------------------------------------ */

/* f(Q,K,V) = sum(out * dout) in float64. */
static double objective(const double *Q, const double *K, const double *V, const double *dout,
                        double *work, const cfg *c, size_t no) {
    naive_forward(work, NULL, Q, K, V, c);
    double f = 0;
    for (size_t i = 0; i < no; i++) f += work[i] * dout[i];
    return f;
}

/* Central differences of the float64 objective, step h: truncation error h^2 f'''/6 ~ 1e-10 and
 * rounding ~1e-16/h ~ 1e-12 here, so the float64 gradient is good to ~1e-8 relative, far below
 * the 1e-3 allowed for the library's float32 gradients. */
static void fd_grad(double *g, double *x, size_t n, const double *Q, const double *K,
                    const double *V, const double *dout, double *work, const cfg *c, size_t no) {
    const double h = 1e-5;
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double fp = objective(Q, K, V, dout, work, c, no);
        x[i] = x0 - h;
        double fm = objective(Q, K, V, dout, work, c, no);
        x[i] = x0;
        g[i] = (fp - fm) / (2 * h);
    }
}

static void test_backward_fd_case(const cfg *c) {
    data t = make_data(c, 4242u + (uint64_t)c->causal * 2 + (c->key_len != NULL));
    pf_shape sh = shape_of(c);
    pf_attn_opts o = opts_of(c, 0);
    double *Qd = to_f64(t.Q, t.nq), *Kd = to_f64(t.K, t.nk), *Vd = to_f64(t.V, t.nv);
    double *dOd = to_f64(t.dout, t.no), *work = xmalloc(sizeof(double) * t.no);
    double *gq = xmalloc(sizeof(double) * t.nq), *gk = xmalloc(sizeof(double) * t.nk);
    double *gv = xmalloc(sizeof(double) * t.nv);
    fd_grad(gq, Qd, t.nq, Qd, Kd, Vd, dOd, work, c, t.no);
    fd_grad(gk, Kd, t.nk, Qd, Kd, Vd, dOd, work, c, t.no);
    fd_grad(gv, Vd, t.nv, Qd, Kd, Vd, dOd, work, c, t.no);

    float *out = xmalloc(sizeof(float) * t.no), *lse = xmalloc(sizeof(float) * t.nl);
    float *dQ = xmalloc(sizeof(float) * t.nq), *dK = xmalloc(sizeof(float) * t.nk);
    float *dV = xmalloc(sizeof(float) * t.nv);
    CHECK_STATUS(pf_attn_exact(out, lse, t.Q, t.K, t.V, &sh, &o), PF_OK);
    for (int which = 0; which < 2; which++) {
        for (size_t i = 0; i < t.nq; i++) dQ[i] = 1e30f;
        for (size_t i = 0; i < t.nk; i++) dK[i] = 1e30f;
        for (size_t i = 0; i < t.nv; i++) dV[i] = 1e30f;
        if (which == 0) {
            CHECK_STATUS(
                pf_attn_exact_backward(dQ, dK, dV, t.dout, t.Q, t.K, t.V, out, lse, &sh, &o),
                PF_OK);
        } else {
            CHECK_STATUS(pf_attn_exact_backward_ref(dQ, dK, dV, t.dout, t.Q, t.K, t.V, &sh, &o),
                         PF_OK);
        }
        double eq = rel_err_f64(dQ, gq, t.nq), ek = rel_err_f64(dK, gk, t.nk);
        double ev = rel_err_f64(dV, gv, t.nv);
        const char *who = which == 0 ? "fast" : "ref";
        CHECK(eq < 1e-3 && ek < 1e-3 && ev < 1e-3, "%s %s: FD rel err dQ %.3g dK %.3g dV %.3g",
              c->name, who, eq, ek, ev);
        printf("  %-22s %-4s vs FD: dQ %.2e  dK %.2e  dV %.2e\n", c->name, who, eq, ek, ev);
    }
    free(Qd);
    free(Kd);
    free(Vd);
    free(dOd);
    free(work);
    free(gq);
    free(gk);
    free(gv);
    free(out);
    free(lse);
    free(dQ);
    free(dK);
    free(dV);
    free_data(&t);
}

/* Fast backward against the reference on shapes that cross the block boundaries, padded keys'
 * gradients exactly zero, and the outputs overwritten whatever they held. */
static void test_backward_vs_ref_case(const cfg *c) {
    data t = make_data(c, 99u + (uint64_t)c->Lq);
    pf_shape sh = shape_of(c);
    pf_attn_opts o = opts_of(c, 0);
    float *out = xmalloc(sizeof(float) * t.no), *lse = xmalloc(sizeof(float) * t.nl);
    float *g[2][3];
    for (int w = 0; w < 2; w++) {
        g[w][0] = xmalloc(sizeof(float) * t.nq);
        g[w][1] = xmalloc(sizeof(float) * t.nk);
        g[w][2] = xmalloc(sizeof(float) * t.nv);
        for (size_t i = 0; i < t.nq; i++) g[w][0][i] = 1e30f;
        for (size_t i = 0; i < t.nk; i++) g[w][1][i] = -1e30f;
        for (size_t i = 0; i < t.nv; i++) g[w][2][i] = 1e30f;
    }
    CHECK_STATUS(pf_attn_exact(out, lse, t.Q, t.K, t.V, &sh, &o), PF_OK);
    CHECK_STATUS(
        pf_attn_exact_backward(g[0][0], g[0][1], g[0][2], t.dout, t.Q, t.K, t.V, out, lse, &sh, &o),
        PF_OK);
    CHECK_STATUS(
        pf_attn_exact_backward_ref(g[1][0], g[1][1], g[1][2], t.dout, t.Q, t.K, t.V, &sh, &o),
        PF_OK);
    double eq = rel_err(g[0][0], g[1][0], t.nq), ek = rel_err(g[0][1], g[1][1], t.nk);
    double ev = rel_err(g[0][2], g[1][2], t.nv);
    CHECK(eq < 1e-5 && ek < 1e-5 && ev < 1e-5, "%s: fast vs ref dQ %.3g dK %.3g dV %.3g", c->name,
          eq, ek, ev);
    printf("  %-28s fast vs ref: dQ %.2e  dK %.2e  dV %.2e\n", c->name, eq, ek, ev);

    if (c->key_len) {
        int nonzero[2] = {0, 0};
        for (int w = 0; w < 2; w++) {
            for (int b = 0; b < c->B; b++) {
                for (int h = 0; h < c->H; h++) {
                    size_t bh = (size_t)b * c->H + h;
                    for (int j = c->key_len[b]; j < c->Lk; j++) {
                        for (int e = 0; e < c->d; e++)
                            nonzero[w] += g[w][1][(bh * c->Lk + j) * c->d + e] != 0.0f;
                        for (int e = 0; e < c->dv; e++)
                            nonzero[w] += g[w][2][(bh * c->Lk + j) * c->dv + e] != 0.0f;
                    }
                }
            }
        }
        CHECK(nonzero[0] == 0 && nonzero[1] == 0,
              "%s: padded keys have %d (fast) and %d (ref) nonzero dK/dV entries", c->name,
              nonzero[0], nonzero[1]);
    }
    free(out);
    free(lse);
    for (int w = 0; w < 2; w++)
        for (int k = 0; k < 3; k++) free(g[w][k]);
    free_data(&t);
}

static void test_backward(void) {
    printf("backward, float32 gradients against float64 finite differences:\n");
    const cfg fd[] = {
        {2, 1, 6, 6, 3, 2, 0, NULL, 0, 1, "bidirectional"},
        {2, 1, 6, 6, 3, 2, 1, NULL, 0, 1, "causal"},
        {2, 1, 6, 6, 3, 2, 0, kl_d, 0, 1, "padded"},
        {2, 1, 6, 6, 3, 2, 1, kl_d, 0, 1, "causal padded"},
        {1, 2, 4, 7, 3, 5, 0, NULL, 0.7f, 1, "Lq 4, Lk 7, s 0.7"},
        {1, 1, 1, 1, 2, 2, 0, NULL, 0, 1, "L = 1"},
        {1, 1, 5, 5, 4, 3, 0, NULL, 0, 3, "larger logits"},
    };
    for (size_t k = 0; k < sizeof(fd) / sizeof(fd[0]); k++) test_backward_fd_case(&fd[k]);

    printf("backward, fast against reference:\n");
    const cfg vr[] = {
        {1, 2, 300, 300, 16, 16, 0, NULL, 0, 1, "bidirectional"},
        {2, 2, 301, 301, 16, 8, 1, kl_b, 0, 1, "causal padded"},
        {2, 1, 130, 700, 8, 12, 0, kl_c, 0, 1, "padded, key blocks"},
        {2, 1, 130, 301, 8, 8, 0, kl_a, 0.2f, 1, "padded, s 0.2"},
        {1, 1, 600, 600, 8, 8, 1, NULL, 0, 1, "causal 600"},
        {1, 1, 1, 1, 4, 4, 1, NULL, 0, 1, "L = 1"},
    };
    for (size_t k = 0; k < sizeof(vr) / sizeof(vr[0]); k++) test_backward_vs_ref_case(&vr[k]);
}

/* ---- errors -------------------------------------------------------------------------------- */

static void test_errors(void) {
    pf_attn_opts def = pf_attn_opts_default();
    CHECK(def.scale == 0.0f && def.causal == 0 && def.key_len == NULL && def.threads == 0,
          "defaults: scale %g causal %d threads %d", def.scale, def.causal, def.threads);

    const cfg c = {2, 1, 4, 4, 3, 2, 0, NULL, 0, 1, "errors"};
    data t = make_data(&c, 5);
    pf_shape sh = shape_of(&c);
    pf_attn_opts o = opts_of(&c, 0);
    float *out = xmalloc(sizeof(float) * t.no), *lse = xmalloc(sizeof(float) * t.nl);
    float *dQ = xmalloc(sizeof(float) * t.nq), *dK = xmalloc(sizeof(float) * t.nk);
    float *dV = xmalloc(sizeof(float) * t.nv);
    CHECK_STATUS(pf_attn_exact(out, lse, t.Q, t.K, t.V, &sh, &o), PF_OK);

    /* pf_attn_check */
    CHECK_STATUS(pf_attn_check(NULL, &o), PF_EINVAL);
    CHECK_STATUS(pf_attn_check(&sh, NULL), PF_EINVAL);
    CHECK_STATUS(pf_attn_check(&sh, &o), PF_OK);
    for (int field = 0; field < 6; field++) {
        for (int v = -1; v <= 0; v++) {
            pf_shape bad = sh;
            int *f[6] = {&bad.B, &bad.H, &bad.Lq, &bad.Lk, &bad.d, &bad.dv};
            *f[field] = v;
            CHECK_STATUS(pf_attn_check(&bad, &o), PF_EINVAL);
            CHECK_STATUS(pf_attn_exact(out, lse, t.Q, t.K, t.V, &bad, &o), PF_EINVAL);
            CHECK_STATUS(pf_attn_exact_ref(out, lse, t.Q, t.K, t.V, &bad, &o), PF_EINVAL);
            CHECK_STATUS(
                pf_attn_exact_backward(dQ, dK, dV, t.dout, t.Q, t.K, t.V, out, lse, &bad, &o),
                PF_EINVAL);
            CHECK_STATUS(pf_attn_exact_backward_ref(dQ, dK, dV, t.dout, t.Q, t.K, t.V, &bad, &o),
                         PF_EINVAL);
        }
    }
    {
        pf_shape huge = {INT_MAX, INT_MAX, INT_MAX, INT_MAX, INT_MAX, INT_MAX};
        CHECK_STATUS(pf_attn_check(&huge, &o), PF_EINVAL); /* size_t overflow */
        /* B * H beyond an int (tiny tensors otherwise): SIGFPE, SIGSEGV or one head computed
         * before; refused now, for every method, before any data is read (NULL data) */
        static const pf_shape many[3] = {{65536, 65536, 1, 1, 1, 1},
                                         {46341, 46341, 1, 1, 1, 1},
                                         {641, 6700417, 1, 1, 1, 1}};
        for (int k = 0; k < 3; k++) {
            CHECK_STATUS(pf_attn_check(&many[k], &o), PF_EINVAL);
            pf_favor_opts fo = pf_favor_opts_default();
            float w1[4] = {1, 0, 0, 1};
            fo.W = w1;
            fo.m = 4;
            CHECK_STATUS(pf_attn_favor(out, t.Q, t.K, t.V, &many[k], &o, &fo), PF_EINVAL);
            CHECK_STATUS(pf_attn_exact(out, lse, t.Q, t.K, t.V, &many[k], &o), PF_EINVAL);
        }
        pf_shape cross = sh;
        cross.Lk = 5;
        pf_attn_opts oc = o;
        oc.causal = 1;
        CHECK_STATUS(pf_attn_check(&cross, &oc), PF_EINVAL); /* causal needs Lq == Lk */
        CHECK_STATUS(pf_attn_exact(out, lse, t.Q, t.K, t.V, &cross, &oc), PF_EINVAL);
        pf_attn_opts ob = o;
        ob.threads = -1;
        CHECK_STATUS(pf_attn_check(&sh, &ob), PF_EINVAL);
        /* 100000 threads overflowed the stack inside OpenMP, INT_MAX made libgomp exit(1) */
        static const int too_many[] = {PF_MAX_THREADS + 1, 100000, INT_MAX};
        for (int k = 0; k < 3; k++) {
            ob.threads = too_many[k];
            CHECK_STATUS(pf_attn_check(&sh, &ob), PF_EINVAL);
            CHECK_STATUS(pf_attn_exact(out, lse, t.Q, t.K, t.V, &sh, &ob), PF_EINVAL);
            pf_favor_opts fo = pf_favor_opts_default();
            float Wt[4 * 64];
            for (int i = 0; i < 4 * sh.d && i < 4 * 64; i++) Wt[i] = 0.1f * (float)(i % 7) - 0.3f;
            fo.W = Wt;
            fo.m = 4;
            CHECK_STATUS(pf_attn_favor(out, t.Q, t.K, t.V, &sh, &ob, &fo), PF_EINVAL);
        }
        ob.threads = PF_MAX_THREADS; /* the most allowed still works (on 2 cores: slowly) */
        CHECK_STATUS(pf_attn_exact(out, lse, t.Q, t.K, t.V, &sh, &ob), PF_OK);
        ob = o;
        ob = o;
        ob.scale = -1.0f;
        CHECK_STATUS(pf_attn_check(&sh, &ob), PF_EINVAL);
        ob.scale = NAN;
        CHECK_STATUS(pf_attn_check(&sh, &ob), PF_EINVAL);
        ob.scale = INFINITY;
        CHECK_STATUS(pf_attn_check(&sh, &ob), PF_EINVAL);
        const int32_t bad_len[4][2] = {{0, 4}, {4, 5}, {-3, 2}, {4, INT32_MAX}};
        for (int k = 0; k < 4; k++) {
            ob = o;
            ob.key_len = bad_len[k];
            CHECK_STATUS(pf_attn_check(&sh, &ob), PF_EINVAL);
            CHECK_STATUS(pf_attn_exact(out, lse, t.Q, t.K, t.V, &sh, &ob), PF_EINVAL);
            CHECK_STATUS(pf_attn_exact_ref(out, lse, t.Q, t.K, t.V, &sh, &ob), PF_EINVAL);
            CHECK_STATUS(
                pf_attn_exact_backward(dQ, dK, dV, t.dout, t.Q, t.K, t.V, out, lse, &sh, &ob),
                PF_EINVAL);
            CHECK_STATUS(pf_attn_exact_backward_ref(dQ, dK, dV, t.dout, t.Q, t.K, t.V, &sh, &ob),
                         PF_EINVAL);
        }
        const int32_t ok_len[2] = {1, 4};
        ob = o;
        ob.key_len = ok_len;
        CHECK_STATUS(pf_attn_check(&sh, &ob), PF_OK);
    }

    /* NULL shape, options and tensors. lse is optional in the forward only. */
    CHECK_STATUS(pf_attn_exact(out, lse, t.Q, t.K, t.V, NULL, &o), PF_EINVAL);
    CHECK_STATUS(pf_attn_exact(out, lse, t.Q, t.K, t.V, &sh, NULL), PF_EINVAL);
    CHECK_STATUS(pf_attn_exact_ref(out, lse, t.Q, t.K, t.V, NULL, &o), PF_EINVAL);
    CHECK_STATUS(pf_attn_exact_ref(out, lse, t.Q, t.K, t.V, &sh, NULL), PF_EINVAL);
    CHECK_STATUS(pf_attn_exact(NULL, lse, t.Q, t.K, t.V, &sh, &o), PF_EINVAL);
    CHECK_STATUS(pf_attn_exact(out, lse, NULL, t.K, t.V, &sh, &o), PF_EINVAL);
    CHECK_STATUS(pf_attn_exact(out, lse, t.Q, NULL, t.V, &sh, &o), PF_EINVAL);
    CHECK_STATUS(pf_attn_exact(out, lse, t.Q, t.K, NULL, &sh, &o), PF_EINVAL);
    CHECK_STATUS(pf_attn_exact_ref(NULL, lse, t.Q, t.K, t.V, &sh, &o), PF_EINVAL);
    CHECK_STATUS(pf_attn_exact_ref(out, lse, NULL, t.K, t.V, &sh, &o), PF_EINVAL);
    CHECK_STATUS(pf_attn_exact_ref(out, lse, t.Q, NULL, t.V, &sh, &o), PF_EINVAL);
    CHECK_STATUS(pf_attn_exact_ref(out, lse, t.Q, t.K, NULL, &sh, &o), PF_EINVAL);
    CHECK_STATUS(pf_attn_exact_ref(out, NULL, t.Q, t.K, t.V, &sh, &o), PF_OK);

    const float *in[6] = {t.dout, t.Q, t.K, t.V, out, lse};
    for (int k = 0; k < 9; k++) {
        /* k < 3: one of dQ, dK, dV NULL; then one of the six inputs NULL. */
        float *gq = k == 0 ? NULL : dQ, *gk = k == 1 ? NULL : dK, *gv = k == 2 ? NULL : dV;
        const float *a[6];
        for (int w = 0; w < 6; w++) a[w] = (k >= 3 && w == k - 3) ? NULL : in[w];
        CHECK_STATUS(
            pf_attn_exact_backward(gq, gk, gv, a[0], a[1], a[2], a[3], a[4], a[5], &sh, &o),
            PF_EINVAL);
        if (k < 7) {
            CHECK_STATUS(pf_attn_exact_backward_ref(gq, gk, gv, a[0], a[1], a[2], a[3], &sh, &o),
                         PF_EINVAL);
        }
    }
    CHECK_STATUS(pf_attn_exact_backward(dQ, dK, dV, t.dout, t.Q, t.K, t.V, out, lse, NULL, &o),
                 PF_EINVAL);
    CHECK_STATUS(pf_attn_exact_backward(dQ, dK, dV, t.dout, t.Q, t.K, t.V, out, lse, &sh, NULL),
                 PF_EINVAL);
    CHECK_STATUS(pf_attn_exact_backward_ref(dQ, dK, dV, t.dout, t.Q, t.K, t.V, NULL, &o),
                 PF_EINVAL);
    CHECK_STATUS(pf_attn_exact_backward_ref(dQ, dK, dV, t.dout, t.Q, t.K, t.V, &sh, NULL),
                 PF_EINVAL);

    /* NaN / Inf anywhere in an input: PF_ENONFINITE. Each bad value sits in the last element,
     * so a check that stops early (or skips a tail) is caught. */
    float *copies[6];
    size_t sizes[6] = {t.no, t.nq, t.nk, t.nv, t.no, t.nl};
    const float bads[3] = {NAN, INFINITY, -INFINITY};
    for (int w = 0; w < 6; w++) {
        copies[w] = xmalloc(sizeof(float) * sizes[w]);
        memcpy(copies[w], in[w], sizeof(float) * sizes[w]);
    }
    for (int w = 0; w < 6; w++) {
        for (int k = 0; k < 3; k++) {
            float keep = copies[w][sizes[w] - 1];
            copies[w][sizes[w] - 1] = bads[k];
            const float *a[6] = {copies[0], copies[1], copies[2], copies[3], copies[4], copies[5]};
            CHECK_STATUS(
                pf_attn_exact_backward(dQ, dK, dV, a[0], a[1], a[2], a[3], a[4], a[5], &sh, &o),
                PF_ENONFINITE);
            if (w >= 1 && w <= 3) {
                CHECK_STATUS(pf_attn_exact(out, lse, a[1], a[2], a[3], &sh, &o), PF_ENONFINITE);
                CHECK_STATUS(pf_attn_exact_ref(out, lse, a[1], a[2], a[3], &sh, &o), PF_ENONFINITE);
            }
            if (w <= 3) {
                CHECK_STATUS(
                    pf_attn_exact_backward_ref(dQ, dK, dV, a[0], a[1], a[2], a[3], &sh, &o),
                    PF_ENONFINITE);
            }
            copies[w][sizes[w] - 1] = keep;
        }
    }
    for (int w = 0; w < 6; w++) free(copies[w]);

    /* Finite inputs whose float32 scores overflow (|q|, |k| ~ 1e20): the fast path cannot
     * represent them and must say so rather than return NaN. */
    {
        float *Qb = xmalloc(sizeof(float) * t.nq), *Kb = xmalloc(sizeof(float) * t.nk);
        for (size_t i = 0; i < t.nq; i++) Qb[i] = 1e20f;
        for (size_t i = 0; i < t.nk; i++) Kb[i] = 1e20f;
        CHECK_STATUS(pf_attn_exact(out, lse, Qb, Kb, t.V, &sh, &o), PF_ENONFINITE);
        free(Qb);
        free(Kb);
    }

    free(out);
    free(lse);
    free(dQ);
    free(dK);
    free(dV);
    free_data(&t);
}

int main(void) {
    test_errors();
    test_forward();
    test_threads();
    test_backward();
    TEST_MAIN_END();
}
