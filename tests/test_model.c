/* test_model.c: the language model's layers and the whole model against float64 references.
 *
 * Every gradient is checked against central finite differences of a float64 forward written
 * here, independently of src/model (eps 1e-6 in double: truncation ~eps^2 and round-off
 * ~1e-16/eps, both far below float's 1e-7), so a mismatch is the float backward's fault. Float
 * results are compared by relative 2-norm error; the float forward and backward carry about
 * 1e-6 relative rounding per operation, so the bounds are a few 1e-5 for layers and 1e-3 for
 * the whole model (a chain of ~40 float operations whose errors add). Also: AdamW against its
 * closed form, the learning-rate schedule, thread-count independence, argument checks; what a
 * layer feeds its attention (pf_model_attention_inputs) against the float64 model, one
 * model's weights carried into another configuration (pf_model_init_from), and the two seeds
 * (config.seed the initial weights alone, config.w_seed every W alone). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "favor/favor.h"
#include "model/model.h"
#include "ref.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define V PF_LM_VOCAB
#define FD_EPS 1e-6

/* ---- small helpers -------------------------------------------------------------------------- */

static double *to_f64(const float *x, size_t n) {
    double *d = xmalloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static float *randf(size_t n, float sigma, uint64_t stream) {
    float *x = xmalloc(sizeof(float) * n);
    fill_normal(x, n, sigma, 7, stream);
    return x;
}

/* Relative 2-norm error of float got against double ref. */
static double relerr(const float *got, const double *ref, size_t n) {
    return rel_err_f64(got, ref, n);
}

/* ---- float64 references of each layer --------------------------------------------------- */

static void ln_ref(double *out, const double *x, const double *w, const double *b, int N, int C) {
    for (int i = 0; i < N; i++) {
        const double *r = x + (size_t)i * C;
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) m += r[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (r[c] - m) * (r[c] - m);
        v /= C;
        double s = 1.0 / sqrt(v + 1e-5);
        for (int c = 0; c < C; c++) out[(size_t)i * C + c] = (r[c] - m) * s * w[c] + b[c];
    }
}

static void mm_ref(double *out, const double *x, const double *W, const double *bias, int N, int C,
                   int OC) {
    for (int i = 0; i < N; i++) {
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0;
            for (int c = 0; c < C; c++) s += x[(size_t)i * C + c] * W[(size_t)o * C + c];
            out[(size_t)i * OC + o] = s;
        }
    }
}

static double gelu_ref(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / 3.141592653589793) * (x + 0.044715 * x * x * x)));
}

/* Rotates each head row of x (B,T,ld) at columns [off + h*hd, ...) by position t. */
static void rope_ref(double *x, int ld, int off, int B, int T, int H, int hd) {
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < H; h++) {
                double *r = x + ((size_t)b * T + t) * ld + off + (size_t)h * hd;
                for (int i = 0; i < hd / 2; i++) {
                    double a = t * pow(10000.0, -2.0 * i / hd);
                    double x0 = r[2 * i], x1 = r[2 * i + 1];
                    r[2 * i] = x0 * cos(a) - x1 * sin(a);
                    r[2 * i + 1] = x0 * sin(a) + x1 * cos(a);
                }
            }
        }
    }
}

/* Feature map phi (r) of a row x (hd), already scaled, for W (m,hd): ref.h's map, or FAVOR++'s
 * with the model's A. */
static int fmap_ref(double *phi, const double *x, const float *W, int m, int hd, pf_kernel kern,
                    double eps, double A) {
    if (kern != PF_KERNEL_OPRF) {
        ref_phi_f64(phi, x, hd, W, m, kern, 1.0, eps);
        return pf_kernel_width(kern, m);
    }
    double h = 0;
    for (int j = 0; j < hd; j++) h += x[j] * x[j];
    h /= 2;
    for (int f = 0; f < m; f++) {
        double u = 0, w2 = 0;
        for (int j = 0; j < hd; j++) {
            u += W[(size_t)f * hd + j] * x[j];
            w2 += (double)W[(size_t)f * hd + j] * W[(size_t)f * hd + j];
        }
        /* FAVOR++: D/sqrt(m) exp(A|w|^2 + B w.x - |x|^2/2), B = sqrt(1-4A), D = (1-4A)^(d/4) */
        phi[f] = pow(1 - 4 * A, hd / 4.0) / sqrt(m) * exp(A * w2 + sqrt(1 - 4 * A) * u - h);
    }
    return m;
}

/* Causal attention of qkv (B,T,3C) into out (B,T,C): exact softmax when W is NULL (over the
 * keys i - window < j <= i when window > 0: local attention), else FAVOR with the explicit
 * features (no stabilisation: the test inputs are small). */
static void attn_ref(double *out, const double *qkv_in, int B, int T, int C, int H, int rotary,
                     const float *W, int m, pf_kernel kern, double eps, double A, int window) {
    int hd = C / H;
    double *qkv = xmalloc(sizeof(double) * (size_t)B * T * 3 * C);
    memcpy(qkv, qkv_in, sizeof(double) * (size_t)B * T * 3 * C);
    if (rotary) {
        rope_ref(qkv, 3 * C, 0, B, T, H, hd);
        rope_ref(qkv, 3 * C, C, B, T, H, hd);
    }
    double s = 1.0 / sqrt(hd), rs = sqrt(s);
    double *pq = xmalloc(sizeof(double) * 2 * (m > 0 ? m : 1));
    double *pk = xmalloc(sizeof(double) * 2 * (m > 0 ? m : 1));
    double xq[512], xk[512];
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            for (int i = 0; i < T; i++) {
                const double *q = qkv + ((size_t)b * T + i) * 3 * C + h * hd;
                double w[4096], tot = 0;
                const int j0 = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
                for (int j = 0; j < j0; j++) w[j] = 0;
                for (int j = j0; j <= i; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hd;
                    if (!W) {
                        double dot = 0;
                        for (int c = 0; c < hd; c++) dot += q[c] * k[c];
                        w[j] = exp(s * dot);
                    } else {
                        for (int c = 0; c < hd; c++) {
                            xq[c] = q[c] * rs;
                            xk[c] = k[c] * rs;
                        }
                        int r = fmap_ref(pq, xq, W, m, hd, kern, eps, A);
                        fmap_ref(pk, xk, W, m, hd, kern, eps, A);
                        double dot = 0;
                        for (int f = 0; f < r; f++) dot += pq[f] * pk[f];
                        w[j] = dot;
                    }
                    tot += w[j];
                }
                double *o = out + ((size_t)b * T + i) * C + h * hd;
                for (int c = 0; c < hd; c++) {
                    double acc = 0;
                    for (int j = 0; j <= i; j++)
                        acc += w[j] * qkv[((size_t)b * T + j) * 3 * C + 2 * C + h * hd + c];
                    o[c] = acc / tot;
                }
            }
        }
    }
    free(pq);
    free(pk);
    free(qkv);
}

/* ---- the whole model in float64 --------------------------------------------------------- */

/* The mean cross-entropy of the model with parameters P (num_params, the model's layout).
 * qkv_out (B,T,3C), if not NULL, receives layer `layer`'s qkv (before any rotation). */
static double model_ref_qkv(const pf_model *mod, const double *P, const int32_t *tok,
                            const int32_t *tgt, int B, int T, double *logits_out, int layer,
                            double *qkv_out) {
    const pf_model_config *c = &mod->config;
    int L = c->layers, C = c->d_model, H = c->heads, N = B * T;
    const double *p[LM_NUM_PARAMS];
    size_t off = 0;
    for (int i = 0; i < LM_NUM_PARAMS; i++) {
        p[i] = P + off;
        off += mod->param_sizes[i];
    }
    size_t NC = (size_t)N * C;
    double *x = xmalloc(sizeof(double) * NC), *ln = xmalloc(sizeof(double) * NC);
    double *qkv = xmalloc(sizeof(double) * NC * 3), *att = xmalloc(sizeof(double) * NC);
    double *tmp = xmalloc(sizeof(double) * NC), *fc = xmalloc(sizeof(double) * NC * 4);
    double *lg = xmalloc(sizeof(double) * (size_t)N * V);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int ch = 0; ch < C; ch++) {
                double e = p[0][(size_t)tok[b * T + t] * C + ch];
                if (c->positions == PF_LM_LEARNED) e += p[1][(size_t)t * C + ch];
                x[((size_t)b * T + t) * C + ch] = e;
            }
        }
    }
    for (int l = 0; l < L; l++) {
        ln_ref(ln, x, p[2] + l * C, p[3] + l * C, N, C);
        mm_ref(qkv, ln, p[4] + (size_t)l * 3 * C * C, p[5] + l * 3 * C, N, C, 3 * C);
        if (qkv_out && l == layer) memcpy(qkv_out, qkv, sizeof(double) * NC * 3);
        lm_attn_spec sp = lm_layer_spec(mod, l);
        attn_ref(att, qkv, B, T, C, H, c->positions == PF_LM_ROTARY, sp.W, sp.m, sp.kernel, sp.eps,
                 sp.A, sp.window);
        mm_ref(tmp, att, p[6] + (size_t)l * C * C, p[7] + l * C, N, C, C);
        for (size_t i = 0; i < NC; i++) x[i] += tmp[i];
        ln_ref(ln, x, p[8] + l * C, p[9] + l * C, N, C);
        mm_ref(fc, ln, p[10] + (size_t)l * 4 * C * C, p[11] + l * 4 * C, N, C, 4 * C);
        for (size_t i = 0; i < NC * 4; i++) fc[i] = gelu_ref(fc[i]);
        mm_ref(tmp, fc, p[12] + (size_t)l * 4 * C * C, p[13] + l * C, N, 4 * C, C);
        for (size_t i = 0; i < NC; i++) x[i] += tmp[i];
    }
    ln_ref(ln, x, p[14], p[15], N, C);
    mm_ref(lg, ln, p[0], NULL, N, C, V);
    double loss = 0;
    int counted = 0;
    for (int i = 0; i < N; i++) {
        if (!tgt || tgt[i] < 0) continue;
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++) mx = fmax(mx, lg[(size_t)i * V + j]);
        for (int j = 0; j < V; j++) s += exp(lg[(size_t)i * V + j] - mx);
        loss += log(s) + mx - lg[(size_t)i * V + tgt[i]];
        counted++;
    }
    if (logits_out) memcpy(logits_out, lg, sizeof(double) * (size_t)N * V);
    free(x);
    free(ln);
    free(qkv);
    free(att);
    free(tmp);
    free(fc);
    free(lg);
    return counted ? loss / counted : 0;
}

static double model_ref(const pf_model *mod, const double *P, const int32_t *tok,
                        const int32_t *tgt, int B, int T, double *logits_out) {
    return model_ref_qkv(mod, P, tok, tgt, B, T, logits_out, -1, NULL);
}

/* ---- layer tests ------------------------------------------------------------------------- */

/* d/dx_j of f at x (double), central differences over every entry of x. */
typedef double (*scalar_fn)(void *ctx);

static void fd_grad(double *g, double *x, size_t n, scalar_fn f, void *ctx) {
    for (size_t j = 0; j < n; j++) {
        double x0 = x[j];
        x[j] = x0 + FD_EPS;
        double fp = f(ctx);
        x[j] = x0 - FD_EPS;
        double fm = f(ctx);
        x[j] = x0;
        g[j] = (fp - fm) / (2 * FD_EPS);
    }
}

/* LayerNorm: loss = sum(out * R) */
typedef struct {
    double *x, *w, *b, *R, *out;
    int N, C;
} ln_ctx;

static double ln_loss(void *p) {
    ln_ctx *c = p;
    ln_ref(c->out, c->x, c->w, c->b, c->N, c->C);
    double s = 0;
    for (int i = 0; i < c->N * c->C; i++) s += c->out[i] * c->R[i];
    return s;
}

static void test_layernorm(void) {
    const int N = 6, C = 20;
    float *x = randf((size_t)N * C, 2.0f, 1), *w = randf(C, 1.0f, 2), *b = randf(C, 1.0f, 3);
    float *R = randf((size_t)N * C, 1.0f, 4);
    for (int i = 0; i < N * C; i++) x[i] += 3.0f; /* a mean far from zero */
    float *out = xmalloc(sizeof(float) * N * C), mean[6], rstd[6];
    layernorm_forward(out, mean, rstd, x, w, b, N, C);
    ln_ctx c = {to_f64(x, N * C),
                to_f64(w, C),
                to_f64(b, C),
                to_f64(R, N * C),
                xmalloc(sizeof(double) * N * C),
                N,
                C};
    ln_loss(&c);
    double e = relerr(out, c.out, (size_t)N * C);
    CHECK(e < 1e-6, "layernorm forward rel err %.3g", e);

    /* the backward accumulates: start from known values */
    float *dx = xmalloc(sizeof(float) * N * C), dw[20], db[20];
    for (int i = 0; i < N * C; i++) dx[i] = 0.5f;
    for (int i = 0; i < C; i++) dw[i] = db[i] = 0.25f;
    layernorm_backward(dx, dw, db, R, x, w, mean, rstd, N, C);
    double *gx = xmalloc(sizeof(double) * N * C), gw[20], gb[20];
    fd_grad(gx, c.x, (size_t)N * C, ln_loss, &c);
    fd_grad(gw, c.w, C, ln_loss, &c);
    fd_grad(gb, c.b, C, ln_loss, &c);
    for (int i = 0; i < N * C; i++) gx[i] += 0.5;
    for (int i = 0; i < C; i++) {
        gw[i] += 0.25;
        gb[i] += 0.25;
    }
    double ex = relerr(dx, gx, (size_t)N * C), ew = relerr(dw, gw, C), eb = relerr(db, gb, C);
    CHECK(ex < 2e-5 && ew < 2e-5 && eb < 2e-5, "layernorm backward rel err dx %.3g dw %.3g db %.3g",
          ex, ew, eb);
    printf("layernorm: forward %.2g, backward dx %.2g dw %.2g db %.2g\n", e, ex, ew, eb);
    free(x), free(w), free(b), free(R), free(out), free(dx), free(gx);
    free(c.x), free(c.w), free(c.b), free(c.R), free(c.out);
}

/* Matmul: loss = sum(out * R) */
typedef struct {
    double *x, *W, *b, *R, *out;
    int N, C, OC;
} mm_ctx;

static double mm_loss(void *p) {
    mm_ctx *c = p;
    mm_ref(c->out, c->x, c->W, c->b, c->N, c->C, c->OC);
    double s = 0;
    for (int i = 0; i < c->N * c->OC; i++) s += c->out[i] * c->R[i];
    return s;
}

static void test_matmul(void) {
    /* N above one row block and OC above one column block, so the blocking is exercised */
    const int N = 300, C = 12, OC = 70;
    float *x = randf((size_t)N * C, 1.0f, 10), *W = randf((size_t)OC * C, 1.0f, 11);
    float *b = randf(OC, 1.0f, 12), *R = randf((size_t)N * OC, 1.0f, 13);
    float *out = xmalloc(sizeof(float) * N * OC);
    matmul_forward(out, x, W, b, N, C, OC);
    mm_ctx c = {to_f64(x, N * C),
                to_f64(W, OC * C),
                to_f64(b, OC),
                to_f64(R, N * OC),
                xmalloc(sizeof(double) * N * OC),
                N,
                C,
                OC};
    mm_loss(&c);
    double e = relerr(out, c.out, (size_t)N * OC);
    CHECK(e < 1e-6, "matmul forward rel err %.3g", e);

    float *dx = xmalloc(sizeof(float) * N * C), *dW = xmalloc(sizeof(float) * OC * C);
    float *db = xmalloc(sizeof(float) * OC);
    for (int i = 0; i < N * C; i++) dx[i] = 99.0f; /* overwritten */
    for (int i = 0; i < OC * C; i++) dW[i] = 1.0f; /* accumulated */
    for (int i = 0; i < OC; i++) db[i] = 1.0f;
    matmul_backward(dx, dW, db, R, x, W, N, C, OC);
    /* the loss is linear in each argument, so finite differences are exact up to rounding */
    double *gx = xmalloc(sizeof(double) * N * C), *gW = xmalloc(sizeof(double) * OC * C);
    double *gb = xmalloc(sizeof(double) * OC);
    fd_grad(gx, c.x, (size_t)N * C, mm_loss, &c);
    fd_grad(gW, c.W, (size_t)OC * C, mm_loss, &c);
    fd_grad(gb, c.b, OC, mm_loss, &c);
    for (int i = 0; i < OC * C; i++) gW[i] += 1.0;
    for (int i = 0; i < OC; i++) gb[i] += 1.0;
    double ex = relerr(dx, gx, (size_t)N * C), eW = relerr(dW, gW, (size_t)OC * C);
    double eb = relerr(db, gb, OC);
    CHECK(ex < 1e-5 && eW < 1e-5 && eb < 1e-5, "matmul backward rel err dx %.3g dW %.3g db %.3g",
          ex, eW, eb);
    printf("matmul: forward %.2g, backward dx %.2g dW %.2g db %.2g\n", e, ex, eW, eb);
    free(x), free(W), free(b), free(R), free(out), free(dx), free(dW), free(db);
    free(gx), free(gW), free(gb), free(c.x), free(c.W), free(c.b), free(c.R), free(c.out);
}

static void test_gelu(void) {
    /* more than one block of 2048, and the tails where exp(2u) overflows or vanishes */
    const int n = 5000;
    float *x = randf(n, 3.0f, 20), *R = randf(n, 1.0f, 21), *y = xmalloc(sizeof(float) * n);
    float *dx = xmalloc(sizeof(float) * n);
    const float tails[6] = {-100.0f, -20.0f, -9.0f, 9.0f, 20.0f, 100.0f};
    for (int i = 0; i < 6; i++) x[2500 + i] = tails[i];
    gelu_forward(y, x, n);
    gelu_backward(dx, x, R, n);
    /* elementwise: d/dx_i sum_j gelu(x_j) R_j = gelu'(x_i) R_i, by central differences */
    double *ry = xmalloc(sizeof(double) * n), *g = xmalloc(sizeof(double) * n);
    for (int i = 0; i < n; i++) {
        ry[i] = gelu_ref(x[i]);
        g[i] = (gelu_ref(x[i] + FD_EPS) - gelu_ref(x[i] - FD_EPS)) / (2 * FD_EPS) * R[i];
    }
    double e = relerr(y, ry, n), eg = relerr(dx, g, n);
    CHECK(e < 1e-6 && eg < 1e-5, "gelu rel err forward %.3g backward %.3g", e, eg);
    int tails_ok = 1;
    for (int i = 2500; i < 2506; i++) tails_ok &= isfinite(y[i]) && isfinite(dx[i]);
    CHECK(tails_ok && y[2500] == 0.0f && y[2505] == 100.0f, "gelu tails: %g %g", y[2500], y[2505]);
    printf("gelu: forward %.2g, backward %.2g\n", e, eg);
    free(x), free(R), free(y), free(dx), free(ry), free(g);
}

typedef struct {
    double *l;
    const int32_t *tg;
    int N;
} ce_ctx;

static double ce_loss(void *p) {
    ce_ctx *c = p;
    double tot = 0;
    int cnt = 0;
    for (int i = 0; i < c->N; i++) {
        if (c->tg[i] < 0) continue;
        const double *r = c->l + (size_t)i * V;
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++) mx = fmax(mx, r[j]);
        for (int j = 0; j < V; j++) s += exp(r[j] - mx);
        tot += log(s) + mx - r[c->tg[i]];
        cnt++;
    }
    return tot / cnt;
}

static void test_crossentropy(void) {
    const int N = 5;
    float *l = randf((size_t)N * V, 4.0f, 30);
    int32_t tg[5] = {3, 255, -1, 0, 3};
    float *probs = xmalloc(sizeof(float) * N * V), losses[5];
    float *dl = xmalloc(sizeof(float) * N * V);
    int64_t cnt = crossentropy_forward(probs, losses, l, tg, N, V);
    CHECK(cnt == 4, "counted %lld targets, expected 4", (long long)cnt);
    ce_ctx c = {to_f64(l, (size_t)N * V), tg, N};
    double sum = 0;
    for (int i = 0; i < N; i++) sum += losses[i];
    CHECK_CLOSE(sum / 4, ce_loss(&c), 0, 1e-6);
    CHECK(losses[2] == 0.0f, "ignored target's loss %g", losses[2]);
    double psum = 0;
    for (int j = 0; j < V; j++) psum += probs[j];
    CHECK_CLOSE(psum, 1.0, 1e-6, 0);
    crossentropy_backward(dl, probs, tg, 0.25f, N, V);
    double *g = xmalloc(sizeof(double) * N * V);
    fd_grad(g, c.l, (size_t)N * V, ce_loss, &c);
    double e = relerr(dl, g, (size_t)N * V);
    CHECK(e < 1e-5, "crossentropy backward rel err %.3g", e);
    printf("crossentropy: backward %.2g\n", e);
    free(l), free(probs), free(dl), free(c.l), free(g);
}

static void test_encoder(void) {
    const int B = 2, T = 5, C = 40, Tctx = 7;
    int32_t tok[10] = {1, 2, 1, 255, 0, 2, 2, 2, 7, 1}; /* repeats, across and within rows */
    float *wte = randf((size_t)V * C, 1.0f, 40), *wpe = randf((size_t)Tctx * C, 1.0f, 41);
    float *out = xmalloc(sizeof(float) * B * T * C), *R = randf((size_t)B * T * C, 1.0f, 42);
    encoder_forward(out, tok, wte, wpe, B, T, C);
    int ok = 1;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                ok &= out[((size_t)b * T + t) * C + c] ==
                      wte[(size_t)tok[b * T + t] * C + c] + wpe[(size_t)t * C + c];
    CHECK(ok, "encoder forward is not wte[token] + wpe[t]");
    /* the loss sum(out * R) is linear: d/dwte[v] = sum of R over the rows holding v */
    float *dwte = xmalloc(sizeof(float) * V * C), *dwpe = xmalloc(sizeof(float) * Tctx * C);
    memset(dwte, 0, sizeof(float) * V * C);
    memset(dwpe, 0, sizeof(float) * Tctx * C);
    encoder_backward(dwte, dwpe, R, tok, B, T, C);
    double *gte = calloc((size_t)V * C, sizeof(double)), *gpe = calloc((size_t)Tctx * C, 8);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                gte[(size_t)tok[b * T + t] * C + c] += R[((size_t)b * T + t) * C + c];
                gpe[(size_t)t * C + c] += R[((size_t)b * T + t) * C + c];
            }
    double e1 = relerr(dwte, gte, (size_t)V * C), e2 = relerr(dwpe, gpe, (size_t)Tctx * C);
    CHECK(e1 < 1e-6 && e2 < 1e-6, "encoder backward rel err dwte %.3g dwpe %.3g", e1, e2);
    printf("encoder: backward dwte %.2g dwpe %.2g\n", e1, e2);
    free(wte), free(wpe), free(out), free(R), free(dwte), free(dwpe), free(gte), free(gpe);
}

typedef struct {
    double *x, *R, *y;
    int B, H, T, hd;
} rope_ctx;

static double rope_loss(void *p) {
    rope_ctx *c = p;
    size_t n = (size_t)c->B * c->H * c->T * c->hd;
    memcpy(c->y, c->x, sizeof(double) * n);
    /* (B,H,T,hd) is (B*H, T, hd): one "batch" row per head with ld = hd */
    rope_ref(c->y, c->hd, 0, c->B * c->H, c->T, 1, c->hd);
    double s = 0;
    for (size_t i = 0; i < n; i++) s += c->y[i] * c->R[i];
    return s;
}

static void test_rope(void) {
    const int B = 2, H = 3, T = 9, hd = 8;
    size_t n = (size_t)B * H * T * hd;
    float *x = randf(n, 1.0f, 50), *R = randf(n, 1.0f, 51), *cs = xmalloc(sizeof(float) * T * hd);
    rope_table(cs, T, hd);
    rope_ctx c = {to_f64(x, n), to_f64(R, n), xmalloc(sizeof(double) * n), B, H, T, hd};
    rope_loss(&c);
    float *y = xmalloc(sizeof(float) * n), *d = xmalloc(sizeof(float) * n);
    memcpy(y, x, sizeof(float) * n);
    rope_forward(y, cs, B, H, T, hd);
    double e = relerr(y, c.y, n);
    memcpy(d, R, sizeof(float) * n);
    rope_backward(d, cs, B, H, T, hd);
    double *g = xmalloc(sizeof(double) * n);
    fd_grad(g, c.x, n, rope_loss, &c);
    double eg = relerr(d, g, n);
    CHECK(e < 1e-6 && eg < 1e-5, "rope rel err forward %.3g backward %.3g", e, eg);
    /* a rotation keeps norms and the relative property: q(t).k(t) depends on t only via t-s */
    printf("rope: forward %.2g, backward %.2g\n", e, eg);
    free(x), free(R), free(cs), free(c.x), free(c.R), free(c.y), free(y), free(d), free(g);
}

/* The attention wrapper: permutes, rotary, the library's attention, back. */
typedef struct {
    double *qkv, *R, *out;
    int B, T, C, H, rotary;
    const float *W;
    int m;
    pf_kernel kern;
    double eps, A;
    int window;
} att_ctx;

static double att_loss(void *p) {
    att_ctx *c = p;
    attn_ref(c->out, c->qkv, c->B, c->T, c->C, c->H, c->rotary, c->W, c->m, c->kern, c->eps, c->A,
             c->window);
    double s = 0;
    for (int i = 0; i < c->B * c->T * c->C; i++) s += c->out[i] * c->R[i];
    return s;
}

/* One attention layer against attn_ref, forward and (finite differences) backward; local
 * attention with window `window`, elu with W = I (m = hd) as the model runs it. */
static void test_attention_w(pf_lm_attention kind, pf_kernel kern, int rotary, int window) {
    const int B = 2, T = 7, C = 12, H = 3, hd = C / H, m = kern == PF_KERNEL_ELU ? hd : 16;
    const int no_w = kind == PF_LM_EXACT || kind == PF_LM_LOCAL;
    size_t n3 = (size_t)B * T * 3 * C, n = (size_t)B * T * C;
    float *qkv = randf(n3, 1.0f, 60), *R = randf(n, 1.0f, 61);
    float *W = xmalloc(sizeof(float) * m * hd);
    pf_projection_draw(W, m, hd, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 3, 0);
    if (kern == PF_KERNEL_ELU)
        for (int i = 0; i < m * hd; i++) W[i] = i % (hd + 1) == 0 ? 1.0f : 0.0f; /* I */
    float *cs = xmalloc(sizeof(float) * T * hd);
    rope_table(cs, T, hd);
    lm_attn_spec spec = {kind,
                         kern,
                         no_w ? NULL : W,
                         no_w ? 0 : m,
                         kern == PF_KERNEL_RELU ? 1e-3f : 0.0f,
                         kind == PF_LM_FAVORPP ? -0.2f : 0.0f,
                         NULL,
                         0,
                         NULL,
                         kind == PF_LM_LOCAL ? window : 0};
    float *q = xmalloc(sizeof(float) * n), *k = xmalloc(sizeof(float) * n);
    float *v = xmalloc(sizeof(float) * n), *att = xmalloc(sizeof(float) * n);
    float *lse = xmalloc(sizeof(float) * B * H * T), *out = xmalloc(sizeof(float) * n);
    float *dqkv = xmalloc(sizeof(float) * n3), *s4 = xmalloc(sizeof(float) * 4 * n);
    pf_status st =
        attention_forward(out, q, k, v, att, lse, qkv, rotary ? cs : NULL, &spec, B, T, C, H);
    CHECK_STATUS(st, PF_OK);
    att_ctx c = {to_f64(qkv, n3),
                 to_f64(R, n),
                 xmalloc(sizeof(double) * n),
                 B,
                 T,
                 C,
                 H,
                 rotary,
                 spec.W,
                 spec.m,
                 kern,
                 spec.eps,
                 spec.A,
                 spec.window};
    att_loss(&c);
    double e = relerr(out, c.out, n);
    st = attention_backward(dqkv, s4, s4 + n, s4 + 2 * n, s4 + 3 * n, R, q, k, v, att, lse,
                            rotary ? cs : NULL, &spec, B, T, C, H);
    CHECK_STATUS(st, PF_OK);
    double *g = xmalloc(sizeof(double) * n3);
    fd_grad(g, c.qkv, n3, att_loss, &c);
    double eg = relerr(dqkv, g, n3);
    char lname[32];
    snprintf(lname, sizeof(lname), "local (window %d)", window);
    const char *name = kind == PF_LM_EXACT ? "exact" : kind == PF_LM_LOCAL ? lname
                                                                          : pf_kernel_name(kern);
    if (kind == PF_LM_FAVORPP) name = "favor++ (A = -0.2)";
    /* trig features can be negative, so the denominators of some rows nearly cancel and
     * amplify float rounding (measured 1.6e-5 / 3.7e-5): a looser bound for that map only */
    double bf = kern == PF_KERNEL_TRIG && kind != PF_LM_EXACT ? 1e-4 : 1e-5;
    CHECK(e < bf && eg < 10 * bf, "attention %s rotary %d rel err forward %.3g backward %.3g", name,
          rotary, e, eg);
    printf("attention %s%s: forward %.2g, backward %.2g\n", name, rotary ? "+rotary" : "", e, eg);
    if (kind == PF_LM_LOCAL && window == 1) {
        /* each query sees only its own key: a softmax over one score is 1, the output v */
        CHECK(memcmp(att, v, sizeof(float) * n) == 0, "window 1: output is not v itself");
    }
    if (kind == PF_LM_LOCAL && window >= T) {
        /* the window holds every earlier key: exact attention, to float rounding (the exact
         * path's float products and exp against the window's float64 rows) */
        lm_attn_spec ex = spec;
        ex.kind = PF_LM_EXACT;
        float *out2 = xmalloc(sizeof(float) * n), *dqkv2 = xmalloc(sizeof(float) * n3);
        CHECK_STATUS(attention_forward(out2, q, k, v, att, lse, qkv, rotary ? cs : NULL, &ex, B, T,
                                       C, H),
                     PF_OK);
        CHECK_STATUS(attention_backward(dqkv2, s4, s4 + n, s4 + 2 * n, s4 + 3 * n, R, q, k, v, att,
                                        lse, rotary ? cs : NULL, &ex, B, T, C, H),
                     PF_OK);
        double wo = 0, wg = 0;
        for (size_t i = 0; i < n; i++)
            wo = fmax(wo, fabs(out2[i] - out[i]) / (1e-6 + 1e-5 * fabs(out2[i])));
        for (size_t i = 0; i < n3; i++)
            wg = fmax(wg, fabs(dqkv2[i] - dqkv[i]) / (1e-6 + 1e-5 * fabs(dqkv2[i])));
        CHECK(wo <= 1 && wg <= 1, "window %d >= T: against exact attention, worst %.3g (forward) "
              "%.3g (backward) of 1e-6 + 1e-5 |exact|", window, wo, wg);
        free(out2), free(dqkv2);
    }
    if (!no_w) {
        /* training keeps the forward's features: the same bits; an evaluation forward after it
         * empties the slot, and the backward then recomputes (the same bits again) */
        float *out2 = xmalloc(sizeof(float) * n), *dqkv2 = xmalloc(sizeof(float) * n3);
        pf_favor_saved *sv = NULL;
        spec.saved = &sv;
        for (int keep = 1; keep >= 0; keep--) {
            spec.keep = keep;
            CHECK_STATUS(attention_forward(out2, q, k, v, att, lse, qkv, rotary ? cs : NULL, &spec,
                                           B, T, C, H),
                         PF_OK);
            CHECK(sv != NULL && sv->filled == keep, "keep %d: slot %p", keep, (void *)sv);
            CHECK_STATUS(attention_backward(dqkv2, s4, s4 + n, s4 + 2 * n, s4 + 3 * n, R, q, k, v,
                                            att, lse, rotary ? cs : NULL, &spec, B, T, C, H),
                         PF_OK);
            CHECK(memcmp(out, out2, sizeof(float) * n) == 0 &&
                      memcmp(dqkv, dqkv2, sizeof(float) * n3) == 0,
                  "attention %s keep %d: kept features changed the bits", name, keep);
        }
        pf_favor_saved_free(sv);
        free(out2), free(dqkv2);
    }
    free(qkv), free(R), free(W), free(cs), free(q), free(k), free(v), free(att), free(lse);
    free(out), free(dqkv), free(s4), free(c.qkv), free(c.R), free(c.out), free(g);
}

static void test_attention(pf_lm_attention kind, pf_kernel kern, int rotary) {
    test_attention_w(kind, kern, rotary, 0);
}

/* ---- the whole model --------------------------------------------------------------------- */

static pf_model_config tiny_config(pf_lm_attention att, pf_lm_positions pos, pf_kernel kern) {
    pf_model_config c = pf_model_config_default();
    c.context = 8;
    c.layers = 2;
    c.d_model = 16;
    c.heads = 2;
    c.attention = att;
    c.positions = pos;
    c.kernel = kern;
    c.features = kern == PF_KERNEL_ELU ? c.d_model / c.heads : 16;
    c.seed = 5;
    c.window = 3;
    return c;
}

/* FAVOR++: a running statistic as if some batches had been seen, so A is not 0 (FAVOR+). */
static void set_favorpp_stats(pf_model *m) {
    if (m->config.attention != PF_LM_FAVORPP) return;
    for (int l = 0; l < m->config.layers; l++) m->rho[l] = 0.5f + 0.25f * (float)l;
    m->rho_count = 3;
}

/* Makes the tiny model's weights larger than GPT-2's 0.02 so every path carries signal. */
static void perturb(pf_model *m) {
    pf_rng rng;
    pf_rng_init(&rng, 77, 0);
    for (size_t i = 0; i < m->num_params; i++)
        m->params_memory[i] += 0.2f * (float)pf_rng_normal(&rng);
}

static void test_model_gradients(pf_lm_attention att, pf_lm_positions pos, pf_kernel kern) {
    pf_model_config cfg = tiny_config(att, pos, kern);
    pf_model *m = NULL;
    CHECK_STATUS(pf_model_create(&m, &cfg), PF_OK);
    if (!m) return;
    perturb(m);
    set_favorpp_stats(m);
    const int B = 2, T = 7;
    int32_t tok[14], tgt[14];
    pf_rng rng;
    pf_rng_init(&rng, 9, 1);
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(pf_rng_u32(&rng) % V);
    for (int i = 0; i < B * T; i++) tgt[i] = (int32_t)(pf_rng_u32(&rng) % V);
    tgt[3] = -1;
    float loss;
    CHECK_STATUS(pf_model_set_training(m, 1), PF_OK);
    CHECK_STATUS(pf_model_forward(m, &loss, NULL, tok, tgt, B, T), PF_OK);
    CHECK_STATUS(pf_model_backward(m), PF_OK);
    if (att == PF_LM_FAVORPP) {
        /* the forward used A*(rho) of the earlier batches, then added its own batch */
        CHECK(m->rho_count == 4 && m->rho[0] != 0.5f, "training forward did not update rho");
        CHECK_CLOSE(m->A[1], favorpp_a(0.75), 0, 1e-6);
        float r0 = m->rho[0];
        CHECK_STATUS(pf_model_set_training(m, 0), PF_OK);
        CHECK_STATUS(pf_model_forward(m, NULL, NULL, tok, NULL, B, T), PF_OK);
        CHECK(m->rho_count == 4 && m->rho[0] == r0, "evaluation changed the statistic");
        CHECK_STATUS(pf_model_set_training(m, 1), PF_OK);
        /* the gradients below belong to the training forward's A: recompute them with it */
        for (int l = 0; l < cfg.layers; l++) m->rho[l] = 0.5f + 0.25f * (float)l;
        m->rho_count = 3;
        CHECK_STATUS(pf_model_forward(m, &loss, NULL, tok, tgt, B, T), PF_OK);
        CHECK_STATUS(pf_model_backward(m), PF_OK);
    }
    double *P = to_f64(m->params_memory, m->num_params);
    double ref = model_ref(m, P, tok, tgt, B, T, NULL);
    CHECK_CLOSE(loss, ref, 0, 1e-5);

    /* finite differences on 8 entries of every tensor (all entries of the small ones) */
    double worst = 0;
    size_t off = 0;
    for (int i = 0; i < LM_NUM_PARAMS; i++) {
        size_t n = m->param_sizes[i];
        double num = 0, den = 0;
        for (int s = 0; s < 8 && n > 0; s++) {
            size_t j = off + (size_t)(pf_rng_u32(&rng) % n);
            double x0 = P[j];
            P[j] = x0 + FD_EPS;
            double fp = model_ref(m, P, tok, tgt, B, T, NULL);
            P[j] = x0 - FD_EPS;
            double fm = model_ref(m, P, tok, tgt, B, T, NULL);
            P[j] = x0;
            double g = (fp - fm) / (2 * FD_EPS), got = m->grads_memory[j];
            num += (got - g) * (got - g);
            den += g * g;
        }
        double e = den > 0 ? sqrt(num / den) : sqrt(num);
        const char *name;
        int64_t shape[3];
        lm_param_shape(&cfg, i, &name, shape);
        if (n > 0) CHECK(e < 1e-4, "model gradient of %s: rel err %.3g", name, e);
        if (e > worst) worst = e;
        off += n;
    }
    printf("model %s/%s/%s: loss %.6f (ref %.6f), worst gradient rel err %.2g\n",
           att == PF_LM_EXACT   ? "exact"
           : att == PF_LM_LOCAL ? "local"
           : att == PF_LM_FAVOR ? "favor"
                                : "favor++",
           pf_kernel_name(kern), pos == PF_LM_ROTARY ? "rotary" : "learned", loss, ref, worst);
    free(P);
    pf_model_free(m);
}

/* The same forward and backward at 1 and 2 threads: identical bits. */
static void test_threads(pf_lm_attention att, pf_kernel kern) {
#ifdef _OPENMP
    pf_model_config cfg = tiny_config(att, PF_LM_ROTARY, kern);
    cfg.window = 5;
    /* large enough that every layer's loops run on more than one thread (32K floats) */
    cfg.context = 64;
    cfg.d_model = 128;
    cfg.heads = 4;
    if (kern == PF_KERNEL_ELU) cfg.features = 32;
    if (att != PF_LM_EXACT) cfg.layers = 1; /* (every loop runs in one layer: less CI time) */
    pf_model *m1 = NULL, *m2 = NULL;
    pf_model_create(&m1, &cfg);
    pf_model_create(&m2, &cfg);
    if (!m1 || !m2) {
        CHECK(0, "create failed");
        return;
    }
    const int B = 8, T = 64;
    int32_t tok[512], tgt[512];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (i * 37 + 11) % V;
        tgt[i] = (i * 53 + 5) % V;
    }
    float l1, l2;
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    pf_model_forward(m1, &l1, NULL, tok, tgt, B, T);
    pf_model_backward(m1);
    omp_set_num_threads(2);
    pf_model_forward(m2, &l2, NULL, tok, tgt, B, T);
    pf_model_backward(m2);
    omp_set_num_threads(saved);
    CHECK(memcmp(&l1, &l2, sizeof(float)) == 0, "%d/%s: loss differs: %.9g vs %.9g", (int)att,
          pf_kernel_name(kern), l1, l2);
    CHECK(memcmp(m1->grads_memory, m2->grads_memory, sizeof(float) * m1->num_params) == 0,
          "%d/%s: gradients differ between 1 and 2 threads", (int)att, pf_kernel_name(kern));
    pf_model_free(m1);
    pf_model_free(m2);
#else
    (void)att, (void)kern;
#endif
}

static double logit_err(const float *a, const float *b);

/* A few AdamW steps on one repeated batch: the loss falls (local attention with window 3, and
 * elu + 1), and a local model with window >= T gives exact attention's loss to float
 * rounding. On one thread: the sizes are tiny (a team of two spends seconds waiting on a
 * loaded machine), and test_threads checks the thread count. */
static void test_local_training(void) {
#ifdef _OPENMP
    const int saved_threads = omp_get_max_threads();
    omp_set_num_threads(1);
#endif
    const pf_lm_attention atts[2] = {PF_LM_LOCAL, PF_LM_FAVOR};
    const pf_kernel kerns[2] = {PF_KERNEL_POSITIVE, PF_KERNEL_ELU};
    const int B = 2, T = 8;
    int32_t tok[16], tgt[16];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (i * 37 + 11) % 64;
        tgt[i] = (i * 53 + 5) % 64;
    }
    for (int a = 0; a < 2; a++) {
        pf_model_config cfg = tiny_config(atts[a], PF_LM_ROTARY, kerns[a]);
        pf_model *m = NULL;
        CHECK_STATUS(pf_model_create(&m, &cfg), PF_OK);
        if (!m) continue;
        pf_adamw o = pf_adamw_default();
        o.lr = 3e-3f;
        pf_model_set_training(m, 1);
        float first = 0, loss = 0;
        for (int s = 0; s < 10; s++) {
            CHECK_STATUS(pf_model_forward(m, &loss, NULL, tok, tgt, B, T), PF_OK);
            CHECK_STATUS(pf_model_backward(m), PF_OK);
            CHECK_STATUS(pf_model_step(m, &o, NULL), PF_OK);
            if (s == 0) first = loss;
        }
        CHECK(isfinite(loss) && loss < first - 0.5f, "%s: loss %.4f after 10 steps from %.4f",
              a ? "elu" : "local", loss, first);
        printf("training %s: loss %.4f -> %.4f in 10 steps\n", a ? "elu" : "local", first, loss);
        pf_model_free(m);
    }
    /* window >= T: exact attention's loss and logits (float rounding: ~1e-6) */
    pf_model_config ce = tiny_config(PF_LM_EXACT, PF_LM_LEARNED, PF_KERNEL_POSITIVE);
    pf_model_config cl = tiny_config(PF_LM_LOCAL, PF_LM_LEARNED, PF_KERNEL_POSITIVE);
    cl.window = T;
    pf_model *me = NULL, *ml = NULL;
    CHECK_STATUS(pf_model_create(&me, &ce), PF_OK);
    CHECK_STATUS(pf_model_create(&ml, &cl), PF_OK);
    if (me && ml) {
        perturb(me);
        perturb(ml);
        float le, ll;
        float *ge = xmalloc(sizeof(float) * B * T * V), *gl = xmalloc(sizeof(float) * B * T * V);
        CHECK_STATUS(pf_model_forward(me, &le, ge, tok, tgt, B, T), PF_OK);
        CHECK_STATUS(pf_model_forward(ml, &ll, gl, tok, tgt, B, T), PF_OK);
        double worst = 0;
        for (int t = 0; t < B * T; t++)
            worst = fmax(worst, logit_err(gl + (size_t)t * V, ge + (size_t)t * V));
        CHECK_CLOSE(ll, le, 0, 1e-6);
        CHECK(worst < 1e-5, "window = T against exact: logits rel err %.3g", worst);
        free(ge), free(gl);
    }
    pf_model_free(me);
    pf_model_free(ml);
#ifdef _OPENMP
    omp_set_num_threads(saved_threads);
#endif
}

/* ---- decoding ---------------------------------------------------------------------------- */

/* A decoder step that fails leaves every layer as it was: FAVOR with relu features, eps 0, the
 * last layer's queries all equal to coordinate 0 of its layer-normed input and its keys all 1,
 * its W positive: a token whose embedding makes that coordinate negative (token 200, with
 * x_0 = -50 against +50 for the others) has every query feature 0 and a zero denominator in
 * the last layer, after the first layer has stepped. Tried first at some positions (the first
 * among them), it must fail with PF_EDOMAIN and leave the position, and the logits of every
 * later token, as in a run that never tried it. */
/* The model of the tests below: a FAVOR relu model whose last layer fails (PF_EDOMAIN) on
 * token 200 and on no other (see test_decoder_failed_step). */
static pf_model *failing_model(int context) {
    pf_model_config cfg = tiny_config(PF_LM_FAVOR, PF_LM_LEARNED, PF_KERNEL_RELU);
    cfg.context = context;
    pf_model *m = NULL;
    CHECK_STATUS(pf_model_create(&m, &cfg), PF_OK);
    if (!m) return NULL;
    perturb(m);
    const int Lr = cfg.layers, C = cfg.d_model, hd = C / cfg.heads, bad = 200;
    m->favor_eps = 0.0f;
    lm_params *p = &m->params;
    for (int t = 0; t < V; t++) p->wte[(size_t)t * C] = t == bad ? -50.0f : 50.0f;
    const int l = Lr - 1;
    float *w = p->qkvw + (size_t)l * 3 * C * C, *b = p->qkvb + (size_t)l * 3 * C;
    for (int i = 0; i < 2 * C; i++) { /* q_i = ln_0, k_i = 1 */
        for (int j = 0; j < C; j++) w[(size_t)i * C + j] = i < C && j == 0 ? 1.0f : 0.0f;
        b[i] = i < C ? 0.0f : 1.0f;
    }
    p->ln1w[(size_t)l * C] = 1.0f;
    p->ln1b[(size_t)l * C] = 0.0f;
    /* (W was drawn at create: made positive) */
    for (size_t i = 0; i < (size_t)cfg.features * hd; i++) {
        float *wl = m->W + (size_t)l * cfg.features * hd;
        wl[i] = 0.1f + fabsf(wl[i]);
    }
    return m;
}

static void test_decoder_failed_step(void) {
    pf_model *m = failing_model(16);
    if (!m) return;
    const int bad = 200;
    const int T = 12;
    int32_t tok[12];
    for (int t = 0; t < T; t++) tok[t] = (t * 37 + 11) % 199;
    float *good = xmalloc(sizeof(float) * T * V), row[V];
    for (int pass = 0; pass < 2; pass++) {
        pf_decoder *d = NULL;
        CHECK_STATUS(pf_decoder_create(&d, m), PF_OK);
        if (!d) break;
        for (int t = 0; t < T; t++) {
            if (pass == 1 && t % 3 == 0) {
                CHECK_STATUS(pf_decoder_step(d, row, bad), PF_EDOMAIN);
                CHECK(pf_decoder_position(d) == t, "a failed token moved the position to %lld",
                      (long long)pf_decoder_position(d));
            }
            CHECK_STATUS(pf_decoder_step(d, row, tok[t]), PF_OK);
            if (pass == 0)
                memcpy(good + (size_t)t * V, row, sizeof row);
            else
                CHECK(memcmp(good + (size_t)t * V, row, sizeof row) == 0,
                      "logits at %d differ after failed tokens", t);
        }
        pf_decoder_free(d);
    }
    free(good);
    pf_model_free(m);
}

/* A prefill that fails after its first piece of rows was committed (the failing token at 550
 * of 600) leaves the decoder as it was, from position 0 and from position 1: the position, and
 * the logits of the tokens fed next, bit for bit those of a decoder that never saw it. */
static void test_decoder_prefill_failure(void) {
    pf_model *m = failing_model(700);
    if (!m) return;
    const int n = 600;
    int32_t *tok = xmalloc(sizeof(int32_t) * n);
    for (int t = 0; t < n; t++) tok[t] = (t * 37 + 11) % 199;
    float row[V], good[3][V];
    pf_decoder *d = NULL;
    CHECK_STATUS(pf_decoder_create(&d, m), PF_OK);
    if (!d) return;
    for (int start = 0; start < 2; start++) {
        CHECK_STATUS(pf_decoder_reset(d), PF_OK);
        if (start) CHECK_STATUS(pf_decoder_step(d, row, 5), PF_OK);
        for (int t = 0; t < 3; t++) CHECK_STATUS(pf_decoder_step(d, good[t], tok[t]), PF_OK);
        CHECK_STATUS(pf_decoder_reset(d), PF_OK);
        if (start) CHECK_STATUS(pf_decoder_step(d, row, 5), PF_OK);
        tok[550] = 200;
        CHECK_STATUS(pf_decoder_prefill(d, row, tok, n), PF_EDOMAIN);
        tok[550] = 7;
        CHECK(pf_decoder_position(d) == start, "a failed prefill moved the position to %lld",
              (long long)pf_decoder_position(d));
        int differ = 0;
        for (int t = 0; t < 3; t++) {
            CHECK_STATUS(pf_decoder_step(d, row, tok[t]), PF_OK);
            differ += memcmp(row, good[t], sizeof row) != 0;
        }
        CHECK(differ == 0, "after a failed prefill (from %d) %d logits differ", start, differ);
    }
    pf_decoder_free(d);
    free(tok);
    pf_model_free(m);
}

/* Relative 2-norm difference of two logit rows. */
static double logit_err(const float *a, const float *b) {
    double num = 0, den = 0;
    for (int j = 0; j < V; j++) {
        num += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
        den += (double)b[j] * b[j];
    }
    return sqrt(num / den);
}

/* pf_decoder_prefill: a prompt at once, then decoding, against stepping every token: within
 * float rounding (1e-5) at the prompt's last row and at every row decoded after it; a second
 * prefill continues from the first; bad tokens and the context limit are refused with the
 * position unchanged. */
static void test_decoder_prefill_k(pf_lm_attention att, pf_lm_positions pos, pf_kernel kern) {
    pf_model_config cfg = tiny_config(att, pos, kern);
    cfg.context = 48;
    pf_model *m = NULL;
    CHECK_STATUS(pf_model_create(&m, &cfg), PF_OK);
    if (!m) return;
    perturb(m);
    set_favorpp_stats(m);
    const int T = 44;
    int32_t tok[44];
    for (int t = 0; t < T; t++) tok[t] = (t * 53 + 3) % V;
    float *ref = xmalloc(sizeof(float) * T * V), row[V];
    pf_decoder *d = NULL;
    CHECK_STATUS(pf_decoder_create(&d, m), PF_OK);
    if (!d) return;
    for (int t = 0; t < T; t++) CHECK_STATUS(pf_decoder_step(d, ref + (size_t)t * V, tok[t]), PF_OK);
    double worst = 0;
    for (int rep = 0; rep < 2; rep++) {
        CHECK_STATUS(pf_decoder_reset(d), PF_OK);
        if (rep == 0) {
            CHECK_STATUS(pf_decoder_prefill(d, row, tok, 29), PF_OK);
        } else { /* two prefills, the second from where the first stopped */
            CHECK_STATUS(pf_decoder_prefill(d, row, tok, 11), PF_OK);
            worst = fmax(worst, logit_err(row, ref + (size_t)10 * V));
            CHECK_STATUS(pf_decoder_prefill(d, row, tok + 11, 18), PF_OK);
        }
        CHECK(pf_decoder_position(d) == 29, "position after prefill %lld",
              (long long)pf_decoder_position(d));
        worst = fmax(worst, logit_err(row, ref + (size_t)28 * V));
        for (int t = 29; t < T; t++) {
            CHECK_STATUS(pf_decoder_step(d, row, tok[t]), PF_OK);
            worst = fmax(worst, logit_err(row, ref + (size_t)t * V));
        }
    }
    CHECK(worst < 1e-5, "prefill then decoding vs stepping every token: rel err %.3g", worst);
    printf("decoder prefill %s/%s: worst rel err of the logits %.2g\n",
           att == PF_LM_EXACT   ? "exact"
           : att == PF_LM_LOCAL ? "local"
           : att == PF_LM_FAVOR ? (kern == PF_KERNEL_ELU ? "elu" : "favor")
                                : "favor++",
           pos == PF_LM_ROTARY ? "rotary" : "learned", worst);
    /* refused: the position stays */
    CHECK_STATUS(pf_decoder_reset(d), PF_OK);
    CHECK_STATUS(pf_decoder_prefill(d, row, tok, 5), PF_OK);
    int32_t badtok[3] = {1, 256, 2};
    CHECK_STATUS(pf_decoder_prefill(d, row, badtok, 3), PF_EINVAL);
    badtok[1] = -1;
    CHECK_STATUS(pf_decoder_prefill(d, row, badtok, 3), PF_EINVAL);
    CHECK_STATUS(pf_decoder_prefill(d, row, tok, 0), PF_EINVAL);
    CHECK_STATUS(pf_decoder_prefill(d, NULL, tok, 3), PF_EINVAL);
    CHECK_STATUS(pf_decoder_prefill(NULL, row, tok, 3), PF_EINVAL);
    if (att == PF_LM_EXACT || pos == PF_LM_LEARNED)
        CHECK_STATUS(pf_decoder_prefill(d, row, tok, 44), PF_EINVAL); /* 5 + 44 > 48 */
    CHECK(pf_decoder_position(d) == 5, "refused prefills moved the position to %lld",
          (long long)pf_decoder_position(d));
    pf_decoder_free(d);
    free(ref);
    pf_model_free(m);
}

/* Incremental decoding gives the logits of the full forward at every position. */
static void test_decoder_k(pf_lm_attention att, pf_lm_positions pos, pf_kernel kern) {
    pf_model_config cfg = tiny_config(att, pos, kern);
    cfg.context = 24;
    pf_model *m = NULL;
    CHECK_STATUS(pf_model_create(&m, &cfg), PF_OK);
    if (!m) return;
    perturb(m);
    set_favorpp_stats(m);
    const int T = 24;
    int32_t tok[24];
    for (int t = 0; t < T; t++) tok[t] = (t * 91 + 7) % V;
    float *full = xmalloc(sizeof(float) * T * V), row[V];
    CHECK_STATUS(pf_model_forward(m, NULL, full, tok, NULL, 1, T), PF_OK);
    pf_decoder *d = NULL;
    pf_status st = pf_decoder_create(&d, m);
    CHECK_STATUS(st, PF_OK);
    if (st != PF_OK) {
        free(full);
        pf_model_free(m);
        return;
    }
    double worst = 0;
    for (int rep = 0; rep < 2; rep++) {
        for (int t = 0; t < T; t++) {
            CHECK_STATUS(pf_decoder_step(d, row, tok[t]), PF_OK);
            double num = 0, den = 0;
            for (int j = 0; j < V; j++) {
                double e = (double)row[j] - full[(size_t)t * V + j];
                num += e * e;
                den += (double)full[(size_t)t * V + j] * full[(size_t)t * V + j];
            }
            double e = sqrt(num / den);
            worst = e > worst ? e : worst;
        }
        CHECK(pf_decoder_position(d) == T, "position %lld", (long long)pf_decoder_position(d));
        if (att == PF_LM_EXACT || pos == PF_LM_LEARNED)
            CHECK_STATUS(pf_decoder_step(d, row, 1), PF_EINVAL); /* past the context */
        CHECK_STATUS(pf_decoder_reset(d), PF_OK);
    }
    /* float rounding through ~30 operations of different blocking: ~1e-6 */
    CHECK(worst < 1e-5, "decoder logits vs full forward: rel err %.3g", worst);
    printf("decoder %s/%s: worst rel err of the logits %.2g\n",
           att == PF_LM_EXACT   ? "exact"
           : att == PF_LM_LOCAL ? "local"
           : att == PF_LM_FAVOR ? (kern == PF_KERNEL_ELU ? "elu" : "favor")
                                : "favor++",
           pos == PF_LM_ROTARY ? "rotary" : "learned", worst);
    CHECK_STATUS(pf_decoder_step(d, row, 256), PF_EINVAL);
    CHECK_STATUS(pf_decoder_step(d, NULL, 1), PF_EINVAL);
    pf_decoder_free(d);
    pf_decoder_free(NULL);
    free(full);
    pf_model_free(m);
}

static void test_decoder(pf_lm_attention att, pf_lm_positions pos) {
    test_decoder_k(att, pos, PF_KERNEL_POSITIVE);
}

static void test_decoder_prefill(pf_lm_attention att, pf_lm_positions pos) {
    test_decoder_prefill_k(att, pos, PF_KERNEL_POSITIVE);
}

static void test_sampling(void) {
    float l[6] = {0.0f, 0.6931472f, 1.0986123f, 1.3862944f, -1.0f, 1.3862944f};
    int32_t tok = -1;
    pf_rng rng;
    pf_rng_init(&rng, 3, 0);
    CHECK_STATUS(pf_sample_logits(&tok, l, 6, 0.0f, 0, &rng), PF_OK);
    CHECK(tok == 3, "greedy took %d, expected the first maximum 3", tok);
    CHECK_STATUS(pf_sample_logits(&tok, l, 6, 1.0f, 1, &rng), PF_OK);
    CHECK(tok == 3, "top-1 took %d", tok);
    /* softmax at temperature 1 over top 4 (ties at the cut kept): weights 2, 3, 4, 4 for
     * bytes 1, 2, 3, 5, total 13. 26000 draws: each count within 5 SD of its mean. */
    int cnt[6] = {0};
    const int N = 26000;
    for (int i = 0; i < N; i++) {
        pf_sample_logits(&tok, l, 6, 1.0f, 4, &rng);
        cnt[tok]++;
    }
    double w[6] = {0, 2, 3, 4, 0, 4};
    for (int j = 0; j < 6; j++) {
        double p = w[j] / 13, mean = N * p, sd = sqrt(N * p * (1 - p));
        CHECK(fabs(cnt[j] - mean) <= 5 * sd + 1e-9, "byte %d drawn %d times, expected %.0f", j,
              cnt[j], mean);
    }
    /* temperature 2 and all bytes: weights exp(l/2) */
    memset(cnt, 0, sizeof(cnt));
    double z = 0;
    for (int j = 0; j < 6; j++) z += exp(l[j] / 2.0);
    for (int i = 0; i < N; i++) {
        pf_sample_logits(&tok, l, 6, 2.0f, 0, &rng);
        cnt[tok]++;
    }
    for (int j = 0; j < 6; j++) {
        double p = exp(l[j] / 2.0) / z, mean = N * p, sd = sqrt(N * p * (1 - p));
        CHECK(fabs(cnt[j] - mean) <= 5 * sd, "T=2: byte %d drawn %d times, expected %.0f", j,
              cnt[j], mean);
    }
    CHECK_STATUS(pf_sample_logits(&tok, l, 6, -1.0f, 0, &rng), PF_EINVAL);
    CHECK_STATUS(pf_sample_logits(&tok, l, 6, 1.0f, 0, NULL), PF_EINVAL);
    l[2] = NAN;
    CHECK_STATUS(pf_sample_logits(&tok, l, 6, 1.0f, 0, &rng), PF_ENONFINITE);
}

/* ---- optimizer and schedule -------------------------------------------------------------- */

static void test_adamw(void) {
    pf_model_config cfg = tiny_config(PF_LM_EXACT, PF_LM_LEARNED, PF_KERNEL_POSITIVE);
    pf_model *m = NULL;
    pf_model_create(&m, &cfg);
    if (!m) {
        CHECK(0, "create failed");
        return;
    }
    size_t n = m->num_params;
    float *p0 = xmalloc(sizeof(float) * n);
    memcpy(p0, m->params_memory, sizeof(float) * n);

    /* A constant gradient g every step, weight decay wd on decayed tensors: with
     * mhat = g and vhat = g^2 exactly, each step is p <- p (1 - lr wd) - lr g / (|g| + eps),
     * so after k steps p_k = a^k p0 - lr u (1 - a^k) / (1 - a), a = 1 - lr wd,
     * u = g / (|g| + eps). eps = 0.5 makes u depend on |g|. */
    pf_adamw o = pf_adamw_default();
    o.lr = 0.01f;
    o.eps = 0.5f;
    o.weight_decay = 0.1f;
    o.clip = 0;
    const int K = 5;
    for (int s = 0; s < K; s++) {
        for (size_t i = 0; i < n; i++) m->grads_memory[i] = (float)((int)(i % 7) - 3) * 0.3f;
        CHECK_STATUS(pf_model_step(m, &o, NULL), PF_OK);
    }
    CHECK(pf_model_steps(m) == K, "steps %lld", (long long)pf_model_steps(m));
    double num = 0, den = 0;
    size_t off = 0;
    for (int t = 0; t < LM_NUM_PARAMS; t++) {
        double wd = lm_param_decays(t) ? o.weight_decay : 0;
        double a = 1 - o.lr * wd;
        for (size_t j = off; j < off + m->param_sizes[t]; j++) {
            double g = (double)(float)((int)(j % 7) - 3) * 0.3f, u = g / (fabs(g) + o.eps);
            double ak = pow(a, K);
            double ref = ak * p0[j] - o.lr * u * (wd > 0 ? (1 - ak) / (1 - a) : K);
            num += (m->params_memory[j] - ref) * (m->params_memory[j] - ref);
            den += ref * ref;
        }
        off += m->param_sizes[t];
    }
    double e = sqrt(num / den);
    CHECK(e < 1e-5, "AdamW after %d steps: rel err %.3g against the closed form", K, e);

    /* Clipping: one step from zero moments with g scaled by s = clip / |g|:
     * mhat = g s, vhat = (g s)^2, so the step is lr g s / (|g| s + eps). */
    pf_model_free(m);
    m = NULL;
    pf_model_create(&m, &cfg);
    memcpy(p0, m->params_memory, sizeof(float) * n);
    double sq = 0;
    for (size_t i = 0; i < n; i++) {
        float g = (float)((int)(i % 5) - 2);
        m->grads_memory[i] = g;
        sq += (double)g * g;
    }
    o.weight_decay = 0;
    o.clip = 1.0f;
    float gn = 0;
    CHECK_STATUS(pf_model_step(m, &o, &gn), PF_OK);
    CHECK_CLOSE(gn, sqrt(sq), 0, 1e-6);
    double s = 1.0 / sqrt(sq);
    num = den = 0;
    for (size_t i = 0; i < n; i++) {
        double g = (int)(i % 5) - 2;
        double ref = p0[i] - o.lr * g * s / (fabs(g) * s + o.eps);
        num += (m->params_memory[i] - ref) * (m->params_memory[i] - ref);
        den += (p0[i] - ref) * (p0[i] - ref);
    }
    e = sqrt(num / den);
    CHECK(e < 1e-3, "clipped step: rel err of the update %.3g", e);

    /* a non-finite gradient changes nothing */
    memcpy(p0, m->params_memory, sizeof(float) * n);
    m->grads_memory[3] = NAN;
    CHECK_STATUS(pf_model_step(m, &o, NULL), PF_ENONFINITE);
    CHECK(memcmp(p0, m->params_memory, sizeof(float) * n) == 0, "NaN step changed parameters");
    CHECK(pf_model_steps(m) == 1, "NaN step counted");
    o.beta1 = 1.0f;
    CHECK_STATUS(pf_model_step(m, &o, NULL), PF_EINVAL);
    printf("adamw: closed form rel err %.2g\n", e);
    free(p0);
    pf_model_free(m);
}

static void test_schedule(void) {
    /* warm-up: lr (s+1)/W; then lr_min + (lr - lr_min)(1 + cos(pi p))/2, p = (s-W)/(S-W) */
    CHECK_CLOSE(pf_lr_schedule(0, 1000, 100, 1e-3, 1e-4), 1e-5, 0, 1e-12);
    CHECK_CLOSE(pf_lr_schedule(49, 1000, 100, 1e-3, 1e-4), 5e-4, 0, 1e-12);
    CHECK_CLOSE(pf_lr_schedule(99, 1000, 100, 1e-3, 1e-4), 1e-3, 0, 1e-12);
    CHECK_CLOSE(pf_lr_schedule(100, 1000, 100, 1e-3, 1e-4), 1e-3, 0, 1e-12);
    CHECK_CLOSE(pf_lr_schedule(550, 1000, 100, 1e-3, 1e-4), 5.5e-4, 0, 1e-12);
    CHECK_CLOSE(pf_lr_schedule(325, 1000, 100, 1e-3, 1e-4),
                1e-4 + 0.45e-3 * (1 + cos(3.141592653589793 / 4)), 0, 1e-12);
    CHECK_CLOSE(pf_lr_schedule(1000, 1000, 100, 1e-3, 1e-4), 1e-4, 0, 1e-12);
    CHECK_CLOSE(pf_lr_schedule(5000, 1000, 100, 1e-3, 1e-4), 1e-4, 0, 1e-12);
    CHECK_CLOSE(pf_lr_schedule(0, 10, 0, 2e-3, 0), 2e-3, 0, 1e-12);
}

/* ---- FAVOR++ statistics ------------------------------------------------------------------ */

static void test_favorpp_stats(void) {
    /* A*(0) = 0 (FAVOR+); A* < 0 and decreasing for rho > 0; A* minimises the variance
     * exponent (1-4A)^d (1-8A)^(-d/2) exp(2(1-4A)s/(1-8A)) for s = rho d: check the minimum by
     * comparing with A* +- 1e-3 at d = 16. */
    CHECK_CLOSE(favorpp_a(0), 0, 1e-15, 0);
    CHECK(favorpp_a(1) < 0 && favorpp_a(2) < favorpp_a(1), "A* not decreasing");
    for (double rho = 0.25; rho <= 4; rho *= 2) {
        int d = 16;
        double s = rho * d;
        double a = favorpp_a(rho);
#define LOGVAR(A)                                                                                  \
    (d * log(1 - 4 * (A)) - d / 2.0 * log(1 - 8 * (A)) + 2 * (1 - 4 * (A)) * s / (1 - 8 * (A)))
        CHECK(LOGVAR(a) < LOGVAR(a + 1e-3) && LOGVAR(a) < LOGVAR(a - 1e-3),
              "A*(%g) = %g is not a minimum", rho, a);
#undef LOGVAR
    }
    /* the running statistic: the plain mean of the first 100 batches, then exponential */
    float r = 0;
    double mean = 0;
    for (int n = 1; n <= 100; n++) {
        double x = 1.0 + 0.01 * n;
        r = favorpp_update(r, x, n);
        mean += (x - mean) / n;
    }
    CHECK_CLOSE(r, mean, 0, 1e-6);
    float r2 = favorpp_update(r, 5.0, 101);
    CHECK_CLOSE(r2, r + (5.0 - r) * 0.01, 0, 1e-6);
    /* for one sequence and head, A*(rho) is the library's optimal A (an independent code) */
    {
        const int L1 = 9, d1 = 8;
        float *q1 = randf((size_t)L1 * d1, 1.5f, 72), *k1 = randf((size_t)L1 * d1, 1.0f, 73);
        for (int i = 0; i < L1 * d1; i++) q1[i] += 0.3f;
        float a_lib = 0;
        CHECK_STATUS(pf_oprf_optimal_a(&a_lib, q1, L1, k1, L1, d1, 0.0f), PF_OK);
        CHECK_CLOSE(favorpp_a(favorpp_rho(q1, k1, 1, 1, L1, d1, 0.0f)), a_lib, 1e-6, 1e-5);
        free(q1), free(k1);
    }
    /* rho of a batch against a direct mean over pairs */
    const int B = 2, H = 2, T = 5, hd = 4;
    size_t n = (size_t)B * H * T * hd;
    float *q = randf(n, 1.0f, 70), *k = randf(n, 1.0f, 71);
    for (size_t i = 0; i < n; i++) q[i] += 0.5f;
    double s = 1.0 / sqrt(hd), tot = 0;
    for (int bh = 0; bh < B * H; bh++)
        for (int i = 0; i < T; i++)
            for (int j = 0; j < T; j++) {
                double e = 0;
                for (int c = 0; c < hd; c++) {
                    double x =
                        (double)q[((size_t)bh * T + i) * hd + c] + k[((size_t)bh * T + j) * hd + c];
                    e += x * x;
                }
                tot += e * s;
            }
    CHECK_CLOSE(favorpp_rho(q, k, B, H, T, hd, 0), tot / (B * H * T * T) / hd, 0, 1e-12);
    free(q), free(k);
}

/* ---- arguments --------------------------------------------------------------------------- */

static pf_status agree_alone(void *ctx, pf_status st);
static pf_status fwd_alone(void *ctx, float *out, const float *Q, const float *K,
                           const float *Vs, const pf_shape *s, const pf_attn_opts *o,
                           const pf_favor_opts *f);
static pf_status bwd_alone(void *ctx, float *dQ, float *dK, float *dV, const float *dout,
                           const float *Q, const float *K, const float *Vs, const float *out,
                           const pf_shape *s, const pf_attn_opts *o, const pf_favor_opts *f);

static void test_arguments(void) {
    pf_model *m = NULL;
    pf_model_config c = tiny_config(PF_LM_EXACT, PF_LM_LEARNED, PF_KERNEL_POSITIVE);
    CHECK_STATUS(pf_model_create(NULL, &c), PF_EINVAL);
    CHECK_STATUS(pf_model_create(&m, NULL), PF_EINVAL);
    c.heads = 3;
    CHECK_STATUS(pf_model_create(&m, &c), PF_EINVAL);
    c = tiny_config(PF_LM_EXACT, PF_LM_ROTARY, PF_KERNEL_POSITIVE);
    c.d_model = 6;
    c.heads = 2; /* head width 3: odd, no rotary */
    CHECK_STATUS(pf_model_create(&m, &c), PF_EINVAL);
    c = tiny_config(PF_LM_FAVOR, PF_LM_LEARNED, PF_KERNEL_OPRF); /* FAVOR++ is its own kind */
    CHECK_STATUS(pf_model_create(&m, &c), PF_EINVAL);
    c = tiny_config(PF_LM_FAVOR, PF_LM_LEARNED, PF_KERNEL_POSITIVE);
    c.features = 0;
    CHECK_STATUS(pf_model_create(&m, &c), PF_EINVAL);
    CHECK(m == NULL, "failed create left a model");
    /* elu: one feature per head coordinate (W = I) */
    c = tiny_config(PF_LM_FAVOR, PF_LM_LEARNED, PF_KERNEL_ELU);
    c.features = 16;
    CHECK_STATUS(pf_model_create(&m, &c), PF_EINVAL);
    c.kernel = (pf_kernel)7;
    c.features = 8;
    CHECK_STATUS(pf_model_create(&m, &c), PF_EINVAL);
    c = tiny_config(PF_LM_FAVORPP, PF_LM_LEARNED, PF_KERNEL_ELU); /* (kernel unused: FAVOR++) */
    CHECK_STATUS(pf_model_create(&m, &c), PF_OK);
    pf_model_free(m);
    m = NULL;
    /* the window: >= 1 whatever the attention */
    c = tiny_config(PF_LM_LOCAL, PF_LM_LEARNED, PF_KERNEL_POSITIVE);
    c.window = 0;
    CHECK_STATUS(pf_model_create(&m, &c), PF_EINVAL);
    c.window = -1;
    CHECK_STATUS(pf_model_create(&m, &c), PF_EINVAL);
    c.window = PF_LM_MAX_CONTEXT + 1;
    CHECK_STATUS(pf_model_create(&m, &c), PF_EINVAL);
    c = tiny_config(PF_LM_EXACT, PF_LM_LEARNED, PF_KERNEL_POSITIVE);
    c.window = 0;
    CHECK_STATUS(pf_model_create(&m, &c), PF_EINVAL);
    c = tiny_config(PF_LM_LOCAL, PF_LM_LEARNED, PF_KERNEL_POSITIVE);
    c.attention = (pf_lm_attention)4;
    CHECK_STATUS(pf_model_create(&m, &c), PF_EINVAL);
    CHECK(m == NULL, "failed create left a model");
    /* local attention has no W, no kept features and no sequence parallel form */
    c = tiny_config(PF_LM_LOCAL, PF_LM_LEARNED, PF_KERNEL_POSITIVE);
    CHECK_STATUS(pf_model_create(&m, &c), PF_OK);
    if (m) {
        CHECK(m->W == NULL && m->saved == NULL, "local attention allocated FAVOR's state");
        pf_model_parallel par;
        memset(&par, 0, sizeof(par));
        par.agree = agree_alone;
        par.attn_forward = fwd_alone;
        par.attn_backward = bwd_alone;
        CHECK_STATUS(pf_model_set_parallel(m, &par), PF_ENOTSUP);
    }
    pf_model_free(m);
    m = NULL;
    c = tiny_config(PF_LM_EXACT, PF_LM_LEARNED, PF_KERNEL_POSITIVE);
    CHECK_STATUS(pf_model_create(&m, &c), PF_OK);
    int32_t tok[4] = {1, 2, 3, 4}, bad[4] = {1, 256, 3, 4}, tgt[4] = {2, 3, 4, -2};
    float loss;
    CHECK_STATUS(pf_model_backward(m), PF_EINVAL); /* no forward yet */
    CHECK_STATUS(pf_model_forward(m, &loss, NULL, bad, NULL, 1, 4), PF_EINVAL);
    CHECK_STATUS(pf_model_forward(m, &loss, NULL, tok, tgt, 1, 4), PF_EINVAL);
    CHECK_STATUS(pf_model_forward(m, NULL, NULL, tok, NULL, 1, 9), PF_EINVAL); /* > context */
    CHECK_STATUS(pf_model_forward(m, NULL, NULL, tok, NULL, 0, 4), PF_EINVAL);
    CHECK_STATUS(pf_model_forward(m, NULL, NULL, tok, NULL, 1, 4), PF_OK);
    CHECK_STATUS(pf_model_backward(m), PF_EINVAL); /* that forward had no targets */
    CHECK(pf_model_num_params(m) == 256 * 16 + 8 * 16 + 2 * 12 * 16 * 16 + 2 * 13 * 16 + 2 * 16,
          "parameter count %lld", (long long)pf_model_num_params(m));
    pf_model_free(m);
    pf_model_free(NULL);
}

/* The pieces a parallel trainer builds on (performer.h, "Training across processes"): the loss
 * as a sum, the backward of a loss over more positions than this forward's (gradients scale by
 * count / total: exactly, when that is a power of two), the parameter and gradient buffers, and
 * pf_model_set_parallel's refusals. */
static pf_status agree_alone(void *ctx, pf_status st) { return (void)ctx, st; }
static pf_status fwd_alone(void *ctx, float *out, const float *Q, const float *K,
                           const float *Vs, const pf_shape *s, const pf_attn_opts *o,
                           const pf_favor_opts *f) {
    return (void)ctx, pf_attn_favor(out, Q, K, Vs, s, o, f);
}
static pf_status bwd_alone(void *ctx, float *dQ, float *dK, float *dV, const float *dout,
                           const float *Q, const float *K, const float *Vs, const float *out,
                           const pf_shape *s, const pf_attn_opts *o, const pf_favor_opts *f) {
    return (void)ctx, pf_attn_favor_backward(dQ, dK, dV, dout, Q, K, Vs, out, s, o, f);
}

static void test_parallel_pieces(void) {
    pf_model_config c = pf_model_config_default();
    c.context = 16, c.layers = 2, c.d_model = 16, c.heads = 2, c.features = 8;
    c.attention = PF_LM_FAVOR;
    pf_model *m = NULL;
    CHECK_STATUS(pf_model_create(&m, &c), PF_OK);
    if (!m) return;
    enum { Bn = 2, Tn = 12 };
    int32_t tok[Bn * Tn], tgt[Bn * Tn];
    for (int i = 0; i < Bn * Tn; i++) tok[i] = (i * 37) % 50 + 40, tgt[i] = i % 5 ? tok[i] : -1;
    double sum = 0;
    int64_t counted = 0;
    CHECK_STATUS(pf_model_loss_sum(m, &sum, &counted), PF_EINVAL); /* no forward yet */
    float loss = 0;
    CHECK_STATUS(pf_model_forward(m, &loss, NULL, tok, tgt, Bn, Tn), PF_OK);
    CHECK_STATUS(pf_model_loss_sum(m, &sum, &counted), PF_OK);
    CHECK(counted == Bn * Tn - (Bn * Tn + 4) / 5, "counted %lld", (long long)counted);
    CHECK_CLOSE(loss, sum / (double)counted, 0, 1e-7);
    size_t n = 0, np = 0;
    float *g = pf_model_gradients(m, &n);
    const float *par = pf_model_parameters(m, &np);
    CHECK(g && par && n == np && (int64_t)n == pf_model_num_params(m), "buffers of %zu, %zu", n,
          np);
    CHECK_STATUS(pf_model_backward(m), PF_OK);
    float *g1 = malloc(sizeof(float) * n);
    memcpy(g1, g, sizeof(float) * n);
    CHECK_STATUS(pf_model_backward_total(m, counted), PF_OK);
    CHECK(memcmp(g1, g, sizeof(float) * n) == 0, "backward_total(own count) != backward");
    CHECK_STATUS(pf_model_backward_total(m, 4 * counted), PF_OK);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) off += g[i] != g1[i] * 0.25f;
    CHECK(off == 0, "total 4 x counted: %zu gradients are not exactly a quarter", off);
    CHECK_STATUS(pf_model_backward_total(m, counted - 1), PF_EINVAL);
    CHECK_STATUS(pf_model_backward_total(m, 0), PF_EINVAL);
    CHECK(pf_model_gradients(NULL, &n) == NULL && pf_model_parameters(m, NULL) == NULL,
          "NULL arguments");
    free(g1);

    pf_model_parallel pp = {.position = 4, .agree = agree_alone, .attn_forward = fwd_alone,
                            .attn_backward = bwd_alone};
    CHECK_STATUS(pf_model_set_parallel(m, &pp), PF_OK);
    CHECK_STATUS(pf_model_forward(m, &loss, NULL, tok, tgt, Bn, Tn), PF_OK); /* 4 + 12 <= 16 */
    CHECK_STATUS(pf_model_backward(m), PF_OK);
    pp.position = 5; /* 5 + 12 > 16 */
    CHECK_STATUS(pf_model_set_parallel(m, &pp), PF_OK);
    CHECK_STATUS(pf_model_forward(m, &loss, NULL, tok, tgt, Bn, Tn), PF_EINVAL);
    CHECK_STATUS(pf_model_backward(m), PF_EINVAL); /* (the failed forward counted nothing) */
    pp.position = -1;
    CHECK_STATUS(pf_model_set_parallel(m, &pp), PF_EINVAL);
    pp.position = 0, pp.agree = NULL;
    CHECK_STATUS(pf_model_set_parallel(m, &pp), PF_EINVAL);
    CHECK_STATUS(pf_model_set_parallel(m, NULL), PF_OK);
    CHECK_STATUS(pf_model_forward(m, &loss, NULL, tok, tgt, Bn, Tn), PF_OK);
    pf_model_free(m);
    for (int a = 0; a < 2; a++) {
        c.attention = a ? PF_LM_FAVORPP : PF_LM_EXACT;
        CHECK_STATUS(pf_model_create(&m, &c), PF_OK);
        pp.agree = agree_alone;
        CHECK_STATUS(pf_model_set_parallel(m, &pp), PF_ENOTSUP);
        pf_model_free(m);
    }
}

/* ---- one model's weights in another; a layer's attention inputs ------------------------- */

/* pf_model_attention_inputs against the float64 model: layer l's qkv from the model's own
 * embeddings, layer norms, attention, MLP and qkv weights (model_ref_qkv), rotated by position
 * with rotary positions (rope_ref), split into heads (B,H,T,hd). Bounds as the whole model's. */
static void test_attention_inputs(pf_lm_attention att, pf_lm_positions pos, pf_kernel kern) {
    pf_model_config cfg = tiny_config(att, pos, kern);
    pf_model *m = NULL;
    CHECK_STATUS(pf_model_create(&m, &cfg), PF_OK);
    if (!m) return;
    perturb(m);
    set_favorpp_stats(m);
    const int B = 2, T = 7, C = cfg.d_model, H = cfg.heads, hd = C / H;
    const size_t n = (size_t)B * T * C;
    int32_t tok[14];
    pf_rng rng;
    pf_rng_init(&rng, 9, 3);
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(pf_rng_u32(&rng) % V);
    double *P = to_f64(m->params_memory, m->num_params);
    double *qkv = xmalloc(sizeof(double) * n * 3);
    double *ref[3] = {xmalloc(sizeof(double) * n), xmalloc(sizeof(double) * n),
                      xmalloc(sizeof(double) * n)};
    float *got[3] = {xmalloc(sizeof(float) * n), xmalloc(sizeof(float) * n),
                     xmalloc(sizeof(float) * n)};
    /* training mode: the call evaluates (FAVOR++'s statistic stays) and leaves the mode as it was */
    CHECK_STATUS(pf_model_set_training(m, 1), PF_OK);
    const int64_t rho_count = m->rho_count;
    double worst = 0;
    for (int l = 0; l < cfg.layers; l++) {
        model_ref_qkv(m, P, tok, NULL, B, T, NULL, l, qkv);
        if (pos == PF_LM_ROTARY) {
            rope_ref(qkv, 3 * C, 0, B, T, H, hd);
            rope_ref(qkv, 3 * C, C, B, T, H, hd);
        }
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++)
                    for (int c = 0; c < hd; c++)
                        for (int j = 0; j < 3; j++)
                            ref[j][(((size_t)b * H + h) * T + t) * hd + c] =
                                qkv[((size_t)b * T + t) * 3 * C + (size_t)j * C + h * hd + c];
        CHECK_STATUS(pf_model_attention_inputs(m, got[0], got[1], got[2], tok, B, T, l), PF_OK);
        for (int j = 0; j < 3; j++) {
            double e = relerr(got[j], ref[j], n);
            CHECK(e < 1e-4, "attention %d positions %d layer %d %c: rel err %.3g", att, pos, l,
                  "qkv"[j], e);
            worst = e > worst ? e : worst;
        }
    }
    printf("attention inputs %s/%s: worst rel err of q, k, v %.2g\n",
           att == PF_LM_EXACT ? "exact" : att == PF_LM_FAVOR ? "favor" : "favor++",
           pos == PF_LM_ROTARY ? "rotary" : "learned", worst);
    CHECK(m->training == 1, "training mode not restored");
    CHECK(m->rho_count == rho_count, "the statistic moved: %lld batches", (long long)m->rho_count);
    /* a backward cannot follow (the forward had no targets) */
    CHECK_STATUS(pf_model_backward(m), PF_EINVAL);
    CHECK_STATUS(pf_model_attention_inputs(m, got[0], got[1], got[2], tok, B, T, cfg.layers),
                 PF_EINVAL);
    CHECK_STATUS(pf_model_attention_inputs(m, got[0], got[1], got[2], tok, B, T, -1), PF_EINVAL);
    CHECK_STATUS(pf_model_attention_inputs(m, got[0], NULL, got[2], tok, B, T, 0), PF_EINVAL);
    CHECK_STATUS(pf_model_attention_inputs(m, got[0], got[1], got[2], tok, B, cfg.context + 1, 0),
                 PF_EINVAL);
    tok[3] = 256;
    CHECK_STATUS(pf_model_attention_inputs(m, got[0], got[1], got[2], tok, B, T, 0), PF_EINVAL);
    for (int j = 0; j < 3; j++) {
        free(ref[j]);
        free(got[j]);
    }
    free(qkv);
    free(P);
    pf_model_free(m);
}

/* The seeds apart: seed moves the initial weights and not W; w_seed moves W and not the weights,
 * at creation and at every redraw (W of redraw period s, layer l is pf_projection_draw's from
 * (w_seed, s << 16 | l), drawn here); pf_model_config_default sets both to 1. */
static void test_seeds(void) {
    const pf_model_config d = pf_model_config_default();
    CHECK(d.seed == 1 && d.w_seed == 1, "default seeds %llu, %llu", (unsigned long long)d.seed,
          (unsigned long long)d.w_seed);
    pf_model_config c[3];
    c[0] = tiny_config(PF_LM_FAVOR, PF_LM_LEARNED, PF_KERNEL_POSITIVE);
    c[0].seed = 5;
    c[0].w_seed = 5;
    c[0].redraw = 1; /* a new W every step */
    c[1] = c[0];
    c[1].w_seed = 6; /* W alone */
    c[2] = c[0];
    c[2].seed = 6; /* the weights alone */
    pf_model *m[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) CHECK_STATUS(pf_model_create(&m[i], &c[i]), PF_OK);
    if (!m[0] || !m[1] || !m[2]) return;
    const int hd = c[0].d_model / c[0].heads;
    const size_t np = m[0]->num_params, wl = (size_t)c[0].features * hd, wn = c[0].layers * wl;
    float *ref = xmalloc(sizeof(float) * wl);
    for (int round = 0; round < 2; round++) { /* at creation (stream 0), after a step (1) */
        CHECK(memcmp(m[0]->params_memory, m[1]->params_memory, 4 * np) == 0 || round > 0,
              "w_seed moved the initial weights");
        CHECK(memcmp(m[0]->params_memory, m[2]->params_memory, 4 * np) != 0,
              "seed did not move the weights");
        CHECK(memcmp(m[0]->W, m[1]->W, 4 * wn) != 0, "round %d: w_seed did not move W", round);
        CHECK(memcmp(m[0]->W, m[2]->W, 4 * wn) == 0, "round %d: seed moved W", round);
        for (int i = 0; i < 2; i++)
            for (int l = 0; l < c[i].layers; l++) {
                CHECK_STATUS(pf_projection_draw(ref, c[i].features, hd, PF_PROJ_ORTHOGONAL,
                                                PF_NORM_CHI, c[i].w_seed,
                                                (uint64_t)round << 16 | (uint64_t)l),
                             PF_OK);
                CHECK(memcmp(ref, m[i]->W + l * wl, 4 * wl) == 0,
                      "round %d, model %d, layer %d: W is not (w_seed, stream)'s", round, i, l);
            }
        if (round > 0) break;
        /* one training step each on the same batch; the next training forward draws stream 1 */
        int32_t tok[16], tgt[16];
        for (int i = 0; i < 16; i++) tok[i] = (i * 37) % V, tgt[i] = (i * 11 + 3) % V;
        pf_adamw opt = pf_adamw_default();
        float loss;
        for (int i = 0; i < 3; i++) {
            CHECK_STATUS(pf_model_set_training(m[i], 1), PF_OK);
            CHECK_STATUS(pf_model_forward(m[i], &loss, NULL, tok, tgt, 2, 8), PF_OK);
            CHECK_STATUS(pf_model_backward(m[i]), PF_OK);
            CHECK_STATUS(pf_model_step(m[i], &opt, NULL), PF_OK);
            CHECK_STATUS(pf_model_forward(m[i], &loss, NULL, tok, tgt, 2, 8), PF_OK);
            CHECK(m[i]->w_stream == 1, "model %d: W stream %lld", i, (long long)m[i]->w_stream);
        }
    }
    free(ref);
    for (int i = 0; i < 3; i++) pf_model_free(m[i]);
}

/* pf_model_init_from: src's trained tensors in dst, bit for bit; dst's own W (its seed's, as a
 * fresh model draws it), moments, step and statistic start afresh, even after dst trained; shapes
 * that disagree are refused with dst unchanged. */
static void test_init_from(void) {
    pf_model_config sc = tiny_config(PF_LM_EXACT, PF_LM_LEARNED, PF_KERNEL_POSITIVE);
    pf_model_config dc = tiny_config(PF_LM_FAVORPP, PF_LM_LEARNED, PF_KERNEL_POSITIVE);
    dc.seed = 11;
    dc.w_seed = 12; /* dst's own W is w_seed's */
    pf_model *src = NULL, *dst = NULL, *fresh = NULL;
    CHECK_STATUS(pf_model_create(&src, &sc), PF_OK);
    CHECK_STATUS(pf_model_create(&dst, &dc), PF_OK);
    CHECK_STATUS(pf_model_create(&fresh, &dc), PF_OK);
    if (!src || !dst || !fresh) return;
    perturb(src);
    /* dst trains a step first: moments, step, statistic and (redraw 1) W all move */
    dst->config.redraw = 1;
    const int B = 2, T = 7;
    int32_t tok[14], tgt[14];
    pf_rng rng;
    pf_rng_init(&rng, 4, 4);
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)(pf_rng_u32(&rng) % V);
        tgt[i] = (int32_t)(pf_rng_u32(&rng) % V);
    }
    float loss;
    pf_adamw opt = pf_adamw_default();
    CHECK_STATUS(pf_model_set_training(dst, 1), PF_OK);
    for (int s = 0; s < 2; s++) {
        CHECK_STATUS(pf_model_forward(dst, &loss, NULL, tok, tgt, B, T), PF_OK);
        CHECK_STATUS(pf_model_backward(dst), PF_OK);
        CHECK_STATUS(pf_model_step(dst, &opt, NULL), PF_OK);
    }
    CHECK_STATUS(pf_model_forward(dst, &loss, NULL, tok, tgt, B, T), PF_OK); /* W of stream 2 */
    CHECK(dst->step == 2 && dst->rho_count == 3 && dst->w_stream == 2, "dst did not train");
    dst->config.redraw = dc.redraw;
    const size_t wn = (size_t)dc.layers * dc.features * (dc.d_model / dc.heads);

    /* shapes that disagree: refused, dst unchanged */
    float *before = xmalloc(sizeof(float) * dst->num_params);
    memcpy(before, dst->params_memory, sizeof(float) * dst->num_params);
    const struct {
        int layers, d_model, heads, context;
        pf_lm_positions pos;
        const char *msg;
    } bad[] = {{3, 16, 2, 8, PF_LM_LEARNED, "layers: 3 here, 2 in the source"},
               {2, 32, 2, 8, PF_LM_LEARNED, "d_model: 32 here, 16 in the source"},
               {2, 16, 4, 8, PF_LM_LEARNED, "heads: 4 here, 2 in the source"},
               {2, 16, 2, 8, PF_LM_ROTARY, "positions: rotary here, learned in the source"}};
    char msg[256];
    for (int i = 0; i < 4; i++) {
        pf_model_config bc = dc;
        bc.layers = bad[i].layers;
        bc.d_model = bad[i].d_model;
        bc.heads = bad[i].heads;
        bc.context = bad[i].context;
        bc.positions = bad[i].pos;
        pf_model *b = NULL;
        CHECK_STATUS(pf_model_create(&b, &bc), PF_OK);
        if (!b) continue;
        float *keep = xmalloc(sizeof(float) * b->num_params);
        memcpy(keep, b->params_memory, sizeof(float) * b->num_params);
        CHECK_STATUS(pf_model_init_from(b, src, msg, sizeof(msg)), PF_EINVAL);
        CHECK(strstr(msg, bad[i].msg) != NULL, "message '%s', expected '%s'", msg, bad[i].msg);
        CHECK(memcmp(keep, b->params_memory, sizeof(float) * b->num_params) == 0,
              "a refused init changed the model");
        free(keep);
        pf_model_free(b);
    }
    CHECK_STATUS(pf_model_init_from(NULL, src, msg, sizeof(msg)), PF_EINVAL);
    CHECK_STATUS(pf_model_init_from(dst, NULL, NULL, 0), PF_EINVAL);
    CHECK(memcmp(before, dst->params_memory, sizeof(float) * dst->num_params) == 0,
          "a refused init changed dst");
    free(before);

    CHECK_STATUS(pf_model_init_from(dst, src, msg, sizeof(msg)), PF_OK);
    CHECK(memcmp(dst->params_memory, src->params_memory, sizeof(float) * src->num_params) == 0,
          "the trained tensors are not carried bit for bit");
    int zero = 1;
    for (size_t i = 0; i < dst->num_params; i++)
        zero &= dst->m_memory[i] == 0 && dst->v_memory[i] == 0;
    CHECK(zero, "AdamW moments not reset");
    CHECK(pf_model_steps(dst) == 0 && dst->rho_count == 0 && dst->w_stream == 0,
          "step %lld, statistic over %lld batches, W stream %lld", (long long)dst->step,
          (long long)dst->rho_count, (long long)dst->w_stream);
    CHECK(memcmp(dst->W, fresh->W, sizeof(float) * wn) == 0, "W is not the fresh model's");
    CHECK(dst->A[0] == 0 && dst->A[1] == 0 && dst->rho[0] == 0, "FAVOR++'s A not reset");
    CHECK(pf_model_get_config(dst).attention == PF_LM_FAVORPP, "dst's configuration changed");
    /* dst now computes what fresh computes with src's weights */
    memcpy(fresh->params_memory, src->params_memory, sizeof(float) * src->num_params);
    float l1, l2;
    CHECK_STATUS(pf_model_set_training(dst, 0), PF_OK);
    CHECK_STATUS(pf_model_forward(dst, &l1, NULL, tok, tgt, B, T), PF_OK);
    CHECK_STATUS(pf_model_forward(fresh, &l2, NULL, tok, tgt, B, T), PF_OK);
    CHECK(l1 == l2, "loss %.9g, a fresh model with the same weights %.9g", l1, l2);

    /* learned positions into another context: row t is src's row t mod src's context (longer:
     * repeated; shorter: the first rows), every other tensor as it is */
    const int ctxs[] = {20, 5, 16};
    for (int i = 0; i < 3; i++) {
        pf_model_config lc = sc; /* (src's attention: the same computation) */
        lc.context = ctxs[i];
        pf_model *b = NULL;
        CHECK_STATUS(pf_model_create(&b, &lc), PF_OK);
        if (!b) continue;
        CHECK_STATUS(pf_model_init_from(b, src, msg, sizeof(msg)), PF_OK);
        const size_t C = (size_t)sc.d_model, wte = (size_t)V * C, T0 = (size_t)sc.context;
        int same = memcmp(b->params_memory, src->params_memory, sizeof(float) * wte) == 0;
        for (size_t t = 0; t < (size_t)ctxs[i]; t++)
            for (size_t j = 0; j < C; j++)
                same &= b->params_memory[wte + t * C + j] ==
                        src->params_memory[wte + (t % T0) * C + j];
        const size_t rest = src->num_params - wte - T0 * C;
        CHECK(b->num_params == src->num_params + ((size_t)ctxs[i] - T0) * C, "parameter count");
        same &= memcmp(b->params_memory + wte + (size_t)ctxs[i] * C,
                       src->params_memory + wte + T0 * C, sizeof(float) * rest) == 0;
        CHECK(same, "context %d: the tensors are not carried (positions row t mod %zu)",
              ctxs[i], T0);
        /* over windows the source could read, the model computes what the source does */
        if (ctxs[i] > T) {
            float lb, ls;
            CHECK_STATUS(pf_model_forward(b, &lb, NULL, tok, tgt, B, T), PF_OK);
            CHECK_STATUS(pf_model_forward(src, &ls, NULL, tok, tgt, B, T), PF_OK);
            CHECK(lb == ls, "context %d: loss %.9g, the source's %.9g", ctxs[i], lb, ls);
        }
        pf_model_free(b);
    }

    /* rotary positions hold no tensor: the contexts may differ */
    pf_model_config rs = sc, rd = sc;
    rs.positions = rd.positions = PF_LM_ROTARY;
    rd.context = 32;
    pf_model *a = NULL, *b = NULL;
    CHECK_STATUS(pf_model_create(&a, &rs), PF_OK);
    CHECK_STATUS(pf_model_create(&b, &rd), PF_OK);
    if (a && b) CHECK_STATUS(pf_model_init_from(b, a, msg, sizeof(msg)), PF_OK);
    pf_model_free(a);
    pf_model_free(b);
    pf_model_free(src);
    pf_model_free(dst);
    pf_model_free(fresh);
}

int main(void) {
    test_layernorm();
    test_matmul();
    test_gelu();
    test_crossentropy();
    test_encoder();
    test_rope();
    test_attention(PF_LM_EXACT, PF_KERNEL_POSITIVE, 0);
    test_attention(PF_LM_EXACT, PF_KERNEL_POSITIVE, 1);
    test_attention(PF_LM_FAVOR, PF_KERNEL_POSITIVE, 0);
    test_attention(PF_LM_FAVOR, PF_KERNEL_POSITIVE, 1);
    test_attention(PF_LM_FAVOR, PF_KERNEL_HYPERBOLIC, 0);
    test_attention(PF_LM_FAVOR, PF_KERNEL_TRIG, 1);
    test_attention(PF_LM_FAVOR, PF_KERNEL_RELU, 1);
    test_attention(PF_LM_FAVORPP, PF_KERNEL_OPRF, 1);
    test_attention(PF_LM_FAVOR, PF_KERNEL_ELU, 0);
    test_attention(PF_LM_FAVOR, PF_KERNEL_ELU, 1);
    test_attention_w(PF_LM_LOCAL, PF_KERNEL_POSITIVE, 0, 3);
    test_attention_w(PF_LM_LOCAL, PF_KERNEL_POSITIVE, 1, 2);
    test_attention_w(PF_LM_LOCAL, PF_KERNEL_POSITIVE, 0, 1);
    test_attention_w(PF_LM_LOCAL, PF_KERNEL_POSITIVE, 1, 7);  /* = T */
    test_attention_w(PF_LM_LOCAL, PF_KERNEL_POSITIVE, 0, 50); /* > T */
    test_model_gradients(PF_LM_EXACT, PF_LM_LEARNED, PF_KERNEL_POSITIVE);
    test_model_gradients(PF_LM_EXACT, PF_LM_ROTARY, PF_KERNEL_POSITIVE);
    test_model_gradients(PF_LM_FAVOR, PF_LM_LEARNED, PF_KERNEL_POSITIVE);
    test_model_gradients(PF_LM_FAVOR, PF_LM_ROTARY, PF_KERNEL_RELU);
    test_model_gradients(PF_LM_FAVORPP, PF_LM_ROTARY, PF_KERNEL_POSITIVE);
    test_model_gradients(PF_LM_LOCAL, PF_LM_LEARNED, PF_KERNEL_POSITIVE);
    test_model_gradients(PF_LM_LOCAL, PF_LM_ROTARY, PF_KERNEL_POSITIVE);
    test_model_gradients(PF_LM_FAVOR, PF_LM_LEARNED, PF_KERNEL_ELU);
    test_threads(PF_LM_EXACT, PF_KERNEL_POSITIVE);
    test_threads(PF_LM_LOCAL, PF_KERNEL_POSITIVE);
    test_threads(PF_LM_FAVOR, PF_KERNEL_ELU);
    test_local_training();
    test_decoder(PF_LM_EXACT, PF_LM_LEARNED);
    test_decoder(PF_LM_EXACT, PF_LM_ROTARY);
    test_decoder(PF_LM_FAVOR, PF_LM_LEARNED);
    test_decoder(PF_LM_FAVOR, PF_LM_ROTARY);
    test_decoder(PF_LM_FAVORPP, PF_LM_ROTARY);
    test_decoder(PF_LM_LOCAL, PF_LM_LEARNED);
    test_decoder(PF_LM_LOCAL, PF_LM_ROTARY);
    test_decoder_k(PF_LM_FAVOR, PF_LM_ROTARY, PF_KERNEL_ELU);
    test_decoder_failed_step();
    test_decoder_prefill(PF_LM_FAVOR, PF_LM_LEARNED);
    test_decoder_prefill(PF_LM_FAVOR, PF_LM_ROTARY);
    test_decoder_prefill(PF_LM_FAVORPP, PF_LM_ROTARY);
    test_decoder_prefill(PF_LM_EXACT, PF_LM_ROTARY);
    test_decoder_prefill(PF_LM_LOCAL, PF_LM_ROTARY);
    test_decoder_prefill_k(PF_LM_FAVOR, PF_LM_LEARNED, PF_KERNEL_ELU);
    test_decoder_prefill_failure();
    test_sampling();
    test_adamw();
    test_schedule();
    test_favorpp_stats();
    test_arguments();
    test_parallel_pieces();
    test_attention_inputs(PF_LM_EXACT, PF_LM_LEARNED, PF_KERNEL_POSITIVE);
    test_attention_inputs(PF_LM_EXACT, PF_LM_ROTARY, PF_KERNEL_POSITIVE);
    test_attention_inputs(PF_LM_FAVOR, PF_LM_LEARNED, PF_KERNEL_RELU);
    test_attention_inputs(PF_LM_FAVORPP, PF_LM_ROTARY, PF_KERNEL_POSITIVE);
    test_seeds();
    test_init_from();
    TEST_MAIN_END();
}
