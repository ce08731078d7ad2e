/* test_favor_backward.c: the FAVOR+ backward pass.
 *
 * - pf_attn_favor_backward and its reference against central finite differences of this file's
 *   own float64 forward (the explicit pairwise formula, its own feature maps), every kernel,
 *   bidirectional and causal, with and without padding, with eps (the max term) and without;
 * - the fast backward against the float64 reference at lengths that are not multiples of the
 *   chunk, every kernel, and for rows of norm 30;
 * - the same with the forward's out passed in (only the denominators are then recomputed);
 * - outputs are overwritten, padded keys get zeros, threads do not change a bit (also with one
 *   head cut into blocks), error paths.
 *
 * Finite differences: step h = 1e-6 in float64 on inputs of norm ~1, so the truncation error
 * (~h^2) and the rounding error (~1e-16 / h) are far below the tolerances: 1e-4 for the float32
 * fast path (measured ~4e-7), 1e-5 for the float64 reference (measured ~3e-8). */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "favor_problem.h"
#include "favor/favor.h"
#include "ref.h"

/* ---- this file's float64 forward ---------------------------------------------------------- */

/* sum(out * G) for the explicit formula, inputs in double. */
static double loss_f64(const double *Q, const double *K, const double *V, const float *G,
                       const pf_shape *s, const pf_attn_opts *o, const pf_favor_opts *f) {
    int r = pf_kernel_width(f->kernel, f->m);
    double scale = o->scale > 0 ? o->scale : 1.0 / sqrt(s->d);
    double pq[64], pk[64], loss = 0;
    for (int b = 0; b < s->B; b++) {
        int klen = o->key_len ? o->key_len[b] : s->Lk;
        for (int h = 0; h < s->H; h++) {
            size_t bh = (size_t)b * s->H + h;
            const float *W = f->W + (f->w_per_head ? (size_t)h * f->m * s->d : 0);
            for (int i = 0; i < s->Lq; i++) {
                ref_phi_f64(pq, Q + (bh * s->Lq + i) * s->d, s->d, W, f->m, f->kernel, scale,
                            f->eps);
                int jend = o->causal ? (i + 1 < klen ? i + 1 : klen) : klen;
                double den = 0, num[16] = {0};
                for (int j = 0; j < jend; j++) {
                    ref_phi_f64(pk, K + (bh * s->Lk + j) * s->d, s->d, W, f->m, f->kernel, scale,
                                f->eps);
                    double a = 0;
                    for (int t = 0; t < r; t++) a += pq[t] * pk[t];
                    den += a;
                    for (int k = 0; k < s->dv; k++) num[k] += a * V[(bh * s->Lk + j) * s->dv + k];
                }
                for (int k = 0; k < s->dv; k++)
                    loss += G[(bh * s->Lq + i) * s->dv + k] * num[k] / den;
            }
        }
    }
    return loss;
}

/* Central differences of loss_f64 with respect to every element of x (n), step h. */
static void fd_grad(double *g, double *x, size_t n, const double *Q, const double *K,
                    const double *V, const float *G, const pf_shape *s, const pf_attn_opts *o,
                    const pf_favor_opts *f) {
    const double h = 1e-6;
    for (size_t e = 0; e < n; e++) {
        double keep = x[e];
        x[e] = keep + h;
        double lp = loss_f64(Q, K, V, G, s, o, f);
        x[e] = keep - h;
        double lm = loss_f64(Q, K, V, G, s, o, f);
        x[e] = keep;
        g[e] = (lp - lm) / (2 * h);
    }
}

/* The fast gradients' buffers filled with 1e30 (a backward must overwrite, not accumulate). */
static void poison_grads(problem *p) {
    for (size_t i = 0; i < p->nq; i++) p->dQ[i] = 1e30f;
    for (size_t i = 0; i < p->nk; i++) p->dK[i] = 1e30f;
    for (size_t i = 0; i < p->nv; i++) p->dV[i] = 1e30f;
}

/* 1 if the fast gradients dQ, dK, dV are bit for bit the reference ones rQ, rK, rV. */
static int same_grads(const problem *p) {
    return memcmp(p->dQ, p->rQ, sizeof(float) * p->nq) == 0 &&
           memcmp(p->dK, p->rK, sizeof(float) * p->nk) == 0 &&
           memcmp(p->dV, p->rV, sizeof(float) * p->nv) == 0;
}

static pf_favor_opts favor_of(const problem *p, pf_kernel kernel, int m, float eps) {
    pf_favor_opts f = pf_favor_opts_default();
    f.kernel = kernel;
    f.W = p->W;
    f.m = m;
    f.w_per_head = 1;
    f.eps = eps;
    return f;
}

static double *to_f64(const float *x, size_t n) {
    double *y = xmalloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

/* 1. every kernel x causal x padding (x eps) against finite differences */
static void test_finite_differences(void) {
    const int B = 2, H = 2, d = 4, dv = 3, m = 6;
    double worst_fast = 0, worst_ref = 0;
    for (int causal = 0; causal < 2; causal++) {
        for (int pad = 0; pad < 2; pad++) {
            for (int k = 0; k < 5; k++) {
                const int Lq = causal ? 9 : 7, Lk = 9;
                problem p = problem_make(B, H, Lq, Lk, d, dv, m, 300 + causal * 10 + pad);
                set_row_norms(p.Q, p.nq / d, d, 0.5, 1.5);
                set_row_norms(p.K, p.nk / d, d, 0.5, 1.5);
                /* k = 4: positive with eps > 0, so the max term's gradient is exercised */
                pf_kernel kernel = k < 4 ? (pf_kernel)k : PF_KERNEL_POSITIVE;
                float eps = kernel == PF_KERNEL_RELU ? 0.05f : (k == 4 ? 0.1f : 0.0f);
                pf_favor_opts f = favor_of(&p, kernel, m, eps);
                f.chunk = 4; /* several chunks, the last one partial */
                pf_attn_opts o = pf_attn_opts_default();
                o.causal = causal;
                int32_t klen[2] = {9, 5};
                o.key_len = pad ? klen : NULL;
                CHECK_STATUS(pf_attn_favor_backward(p.dQ, p.dK, p.dV, p.G, p.Q, p.K, p.V, NULL,
                                                    &p.s, &o, &f),
                             PF_OK);
                CHECK_STATUS(
                    pf_attn_favor_backward_ref(p.rQ, p.rK, p.rV, p.G, p.Q, p.K, p.V, &p.s, &o, &f),
                    PF_OK);
                double *Q = to_f64(p.Q, p.nq), *K = to_f64(p.K, p.nk), *V = to_f64(p.V, p.nv);
                double *gQ = xmalloc(sizeof(double) * p.nq), *gK = xmalloc(sizeof(double) * p.nk);
                double *gV = xmalloc(sizeof(double) * p.nv);
                fd_grad(gQ, Q, p.nq, Q, K, V, p.G, &p.s, &o, &f);
                fd_grad(gK, K, p.nk, Q, K, V, p.G, &p.s, &o, &f);
                fd_grad(gV, V, p.nv, Q, K, V, p.G, &p.s, &o, &f);
                const char *names[3] = {"dQ", "dK", "dV"};
                const float *fast[3] = {p.dQ, p.dK, p.dV}, *ref[3] = {p.rQ, p.rK, p.rV};
                const double *fd[3] = {gQ, gK, gV};
                size_t n[3] = {p.nq, p.nk, p.nv};
                for (int t = 0; t < 3; t++) {
                    double ef = rel_err_f64(fast[t], fd[t], n[t]);
                    double er = rel_err_f64(ref[t], fd[t], n[t]);
                    worst_fast = fmax(worst_fast, ef);
                    worst_ref = fmax(worst_ref, er);
                    CHECK(ef < 1e-4, "%s eps=%g causal=%d pad=%d %s: fast vs FD rel err %.3g",
                          pf_kernel_name(kernel), eps, causal, pad, names[t], ef);
                    CHECK(er < 1e-5, "%s eps=%g causal=%d pad=%d %s: ref vs FD rel err %.3g",
                          pf_kernel_name(kernel), eps, causal, pad, names[t], er);
                }
                /* padded keys: exactly zero */
                if (pad) {
                    for (int h = 0; h < H; h++) {
                        for (int j = 5; j < Lk; j++) {
                            size_t rk = ((size_t)(H + h) * Lk + j);
                            for (int e = 0; e < d; e++)
                                CHECK(p.dK[rk * d + e] == 0.0f, "padded dK %g", p.dK[rk * d + e]);
                            for (int e = 0; e < dv; e++)
                                CHECK(p.dV[rk * dv + e] == 0.0f, "padded dV %g", p.dV[rk * dv + e]);
                        }
                    }
                }
                free(Q);
                free(K);
                free(V);
                free(gQ);
                free(gK);
                free(gV);
                problem_free(&p);
            }
        }
    }
    printf("finite differences: fast worst rel err %.3g, ref %.3g\n", worst_fast, worst_ref);
}

static double worst3(const problem *p, int print, const char *what) {
    double e[3] = {rel_err(p->dQ, p->rQ, p->nq), rel_err(p->dK, p->rK, p->nk),
                   rel_err(p->dV, p->rV, p->nv)};
    if (print) printf("%s: dQ %.3g dK %.3g dV %.3g\n", what, e[0], e[1], e[2]);
    return fmax(e[0], fmax(e[1], e[2]));
}

/* 2. fast vs the float64 reference at lengths that are not multiples of the chunk */
static void test_vs_reference(void) {
    const int lens[2] = {37, 200};
    double worst = 0;
    for (int li = 0; li < 2; li++) {
        for (int causal = 0; causal < 2; causal++) {
            for (int k = 0; k < 4; k++) {
                const int L = lens[li], Lk = causal ? L : L + 11, d = 16, dv = 24, m = 32;
                problem p = problem_make(2, 3, L, Lk, d, dv, m, 400 + li);
                set_row_norms(p.Q, p.nq / d, d, 0.5, 2.0);
                set_row_norms(p.K, p.nk / d, d, 0.5, 2.0);
                pf_favor_opts f = favor_of(&p, (pf_kernel)k, m, k == 3 ? 1e-3f : 0.0f);
                pf_attn_opts o = pf_attn_opts_default();
                o.causal = causal;
                int32_t klen[2] = {Lk, Lk - Lk / 3};
                o.key_len = klen;
                CHECK_STATUS(
                    pf_attn_favor_backward_ref(p.rQ, p.rK, p.rV, p.G, p.Q, p.K, p.V, &p.s, &o, &f),
                    PF_OK);
                const int chunks[3] = {0, 7, 64};
                float *out = xmalloc(sizeof(float) * p.no);
                for (int ci = 0; ci < (causal ? 3 : 1); ci++) {
                    f.chunk = chunks[ci];
                    /* without and with the forward's out */
                    CHECK_STATUS(pf_attn_favor(out, p.Q, p.K, p.V, &p.s, &o, &f), PF_OK);
                    for (int given = 0; given < 2; given++) {
                        CHECK_STATUS(pf_attn_favor_backward(p.dQ, p.dK, p.dV, p.G, p.Q, p.K, p.V,
                                                            given ? out : NULL, &p.s, &o, &f),
                                     PF_OK);
                        double e = worst3(&p, 0, "");
                        worst = fmax(worst, e);
                        CHECK(e < 1e-5, "%s causal=%d L=%d chunk=%d out=%d: rel err %.3g",
                              pf_kernel_name(f.kernel), causal, L, f.chunk, given, e);
                    }
                }
                free(out);
                problem_free(&p);
            }
        }
    }
    printf("fast vs float64 reference: worst rel err %.3g\n", worst);
}

/* 3. rows of norm up to 30: gradients finite and equal to float64 */
static void test_large_norms(void) {
    const int L = 150, d = 16, dv = 16, m = 64;
    const pf_kernel ks[3] = {PF_KERNEL_POSITIVE, PF_KERNEL_HYPERBOLIC, PF_KERNEL_RELU};
    for (int causal = 0; causal < 2; causal++) {
        for (int k = 0; k < 3; k++) {
            problem p = problem_make(1, 2, L, L, d, dv, m, 500);
            set_row_norms(p.Q, p.nq / d, d, 30.0, 30.0);
            set_row_norms(p.K, p.nk / d, d, 1.0, 30.0);
            pf_favor_opts f = favor_of(&p, ks[k], m, ks[k] == PF_KERNEL_RELU ? 1e-3f : 0.0f);
            pf_attn_opts o = pf_attn_opts_default();
            o.causal = causal;
            CHECK_STATUS(
                pf_attn_favor_backward(p.dQ, p.dK, p.dV, p.G, p.Q, p.K, p.V, NULL, &p.s, &o, &f),
                PF_OK);
            CHECK_STATUS(
                pf_attn_favor_backward_ref(p.rQ, p.rK, p.rV, p.G, p.Q, p.K, p.V, &p.s, &o, &f),
                PF_OK);
            char what[64];
            snprintf(what, sizeof what, "norm 30, %s, causal=%d", pf_kernel_name(f.kernel), causal);
            double e = worst3(&p, 1, what);
            CHECK(e < 1e-4, "%s: rel err %.3g", what, e);
            problem_free(&p);
        }
    }
}

/* 4. outputs overwritten, never accumulated; 5. threads */
static void test_overwrite_and_threads(void) {
    problem p = problem_make(2, 3, 300, 300, 32, 16, 64, 600);
    int32_t klen[2] = {300, 211};
    for (int causal = 0; causal < 2; causal++) {
        for (int k = 0; k < 4; k++) {
            pf_favor_opts f = favor_of(&p, (pf_kernel)k, 64, k == 3 ? 1e-3f : 0.0f);
            pf_attn_opts o = pf_attn_opts_default();
            o.causal = causal;
            o.key_len = klen;
            o.threads = 1;
            poison_grads(&p);
            CHECK_STATUS(
                pf_attn_favor_backward(p.dQ, p.dK, p.dV, p.G, p.Q, p.K, p.V, NULL, &p.s, &o, &f),
                PF_OK);
            memset(p.rQ, 0, sizeof(float) * p.nq);
            memset(p.rK, 0, sizeof(float) * p.nk);
            memset(p.rV, 0, sizeof(float) * p.nv);
            o.threads = 2;
            CHECK_STATUS(
                pf_attn_favor_backward(p.rQ, p.rK, p.rV, p.G, p.Q, p.K, p.V, NULL, &p.s, &o, &f),
                PF_OK);
            CHECK(same_grads(&p),
                  "%s causal=%d: prefilled 1e30 / 1 thread and zeroed / 2 threads differ",
                  pf_kernel_name(f.kernel), causal);
        }
    }
    problem_free(&p);
}

/* 5'. Few heads: bidirectional passes cut into key and query blocks (partial sums combined in
 * block order), B*H = 1 and 3 at lengths with several blocks and padding, with and without the
 * forward's out: threads 1, 2 and 3 give the same bits, and the float64 reference agrees. */
static void test_few_heads(void) {
    const int lens[2] = {3000, 1300}, Bs[2] = {1, 3};
    for (int c = 0; c < 2; c++) {
        const int L = lens[c], B = Bs[c], d = 16, dv = 16, m = 32;
        problem p = problem_make(B, 1, L, L, d, dv, m, 650 + c);
        set_row_norms(p.Q, p.nq / d, d, 0.5, 2.0);
        set_row_norms(p.K, p.nk / d, d, 0.5, 2.0);
        int32_t klen[3] = {c == 0 ? 900 : L - 7, L, 700};
        float *out = xmalloc(sizeof(float) * p.no);
        float *g[3] = {xmalloc(sizeof(float) * p.nq), xmalloc(sizeof(float) * p.nk),
                       xmalloc(sizeof(float) * p.nv)};
        for (int causal = 0; causal < 2; causal++) {
            pf_attn_opts o = pf_attn_opts_default();
            o.causal = causal;
            o.key_len = klen;
            pf_favor_opts f = favor_of(&p, PF_KERNEL_POSITIVE, m, 0);
            CHECK_STATUS(pf_attn_favor(out, p.Q, p.K, p.V, &p.s, &o, &f), PF_OK);
            CHECK_STATUS(
                pf_attn_favor_backward_ref(p.rQ, p.rK, p.rV, p.G, p.Q, p.K, p.V, &p.s, &o, &f),
                PF_OK);
            for (int given = 0; given < 2; given++) {
                o.threads = 1;
                CHECK_STATUS(pf_attn_favor_backward(g[0], g[1], g[2], p.G, p.Q, p.K, p.V,
                                                    given ? out : NULL, &p.s, &o, &f),
                             PF_OK);
                for (int t = 2; t <= 3; t++) {
                    o.threads = t;
                    CHECK_STATUS(pf_attn_favor_backward(p.dQ, p.dK, p.dV, p.G, p.Q, p.K, p.V,
                                                        given ? out : NULL, &p.s, &o, &f),
                                 PF_OK);
                    CHECK(memcmp(p.dQ, g[0], sizeof(float) * p.nq) == 0 &&
                              memcmp(p.dK, g[1], sizeof(float) * p.nk) == 0 &&
                              memcmp(p.dV, g[2], sizeof(float) * p.nv) == 0,
                          "B=%d L=%d causal=%d out=%d: threads 1 and %d differ", B, L, causal,
                          given, t);
                }
                double e = worst3(&p, 0, "");
                CHECK(e < 1e-5, "B=%d L=%d causal=%d out=%d: rel err vs reference %.3g", B, L,
                      causal, given, e);
            }
        }
        free(out);
        for (int t = 0; t < 3; t++) free(g[t]);
        problem_free(&p);
    }
}

/* 5''. What the forward keeps (pf_favor_saved): the forward's out and the backward's gradients
 * are bit for bit those of pf_attn_favor and pf_attn_favor_backward, for every map, causal or
 * not, with padding, many heads and few (key, query and scan blocks), at 1 and 2 threads. */
static void test_saved(void) {
    const pf_kernel kernels[6] = {PF_KERNEL_POSITIVE, PF_KERNEL_HYPERBOLIC, PF_KERNEL_TRIG,
                                  PF_KERNEL_RELU,     PF_KERNEL_OPRF,       PF_KERNEL_SDERF};
    const int Bs[2] = {2, 1}, Hs[2] = {3, 1}, Ls[2] = {300, 2100};
    int cases = 0;
    for (int c = 0; c < 2; c++) {
        const int B = Bs[c], H = Hs[c], L = Ls[c], d = 16, dv = 16, m = 32;
        problem p = problem_make(B, H, L, L, d, dv, m, 660 + c);
        set_row_norms(p.Q, p.nq / d, d, 0.5, 2.0);
        set_row_norms(p.K, p.nk / d, d, 0.5, 2.0);
        int32_t klen[2] = {L - 37, L};
        float *out = xmalloc(sizeof(float) * p.no), *out2 = xmalloc(sizeof(float) * p.no);
        for (int causal = 0; causal < 2; causal++) {
            for (int k = 0; k < 6; k++) {
                if (causal && kernels[k] == PF_KERNEL_SDERF) continue;
                pf_attn_opts o = pf_attn_opts_default();
                o.causal = causal;
                o.key_len = klen;
                pf_favor_opts f = favor_of(&p, kernels[k], m, k == 3 ? 1e-3f : 0.0f);
                if (kernels[k] == PF_KERNEL_OPRF && causal) {
                    f.oprf_a_given = 1;
                    f.oprf_a = -0.05f;
                }
                const size_t r =
                    (size_t)(kernels[k] == PF_KERNEL_POSITIVE || kernels[k] == PF_KERNEL_RELU ||
                                     kernels[k] == PF_KERNEL_OPRF || kernels[k] == PF_KERNEL_SDERF
                                 ? m
                                 : 2 * m);
                /* every head kept (max_bytes 0), about half of them, none */
                pf_favor_saved *sv = NULL;
                CHECK_STATUS(pf_favor_saved_create(&sv, &p.s, &o, &f, 0), PF_OK);
                const size_t all = pf_favor_saved_bytes(sv);
                CHECK(pf_favor_saved_heads(sv) == B * H &&
                          all >= sizeof(float) * r * (p.nq + p.nk) / d,
                      "saved keeps %d heads in %zu bytes", pf_favor_saved_heads(sv), all);
                for (int budget = 0; budget < 3; budget++) {
                    if (budget > 0) {
                        pf_favor_saved_free(sv);
                        const size_t max = budget == 1 ? all / 2 : 1;
                        CHECK_STATUS(pf_favor_saved_create(&sv, &p.s, &o, &f, max), PF_OK);
                        const int kh = pf_favor_saved_heads(sv);
                        CHECK(budget == 1 ? (kh == (B * H) / 2 || kh == (B * H - 1) / 2) : kh == 0,
                              "max_bytes %zu of %zu keeps %d of %d heads", max, all, kh, B * H);
                        CHECK(budget == 2 || pf_favor_saved_bytes(sv) <= max,
                              "max_bytes %zu, holds %zu", max, pf_favor_saved_bytes(sv));
                    }
                    for (int t = 1; t <= 2; t++) {
                        o.threads = t;
                        CHECK_STATUS(pf_attn_favor(out, p.Q, p.K, p.V, &p.s, &o, &f), PF_OK);
                        CHECK_STATUS(pf_attn_favor_save(out2, p.Q, p.K, p.V, &p.s, &o, &f, sv),
                                     PF_OK);
                        CHECK(memcmp(out, out2, sizeof(float) * p.no) == 0,
                              "%s causal=%d B*H=%d: saving forward changed out",
                              pf_kernel_name(f.kernel), causal, B * H);
                        for (int given = 0; given < 2; given++) {
                            const float *fo = given ? out : NULL;
                            CHECK_STATUS(pf_attn_favor_backward(p.rQ, p.rK, p.rV, p.G, p.Q, p.K,
                                                                p.V, fo, &p.s, &o, &f),
                                         PF_OK);
                            poison_grads(&p);
                            CHECK_STATUS(pf_attn_favor_backward_saved(p.dQ, p.dK, p.dV, p.G, p.Q,
                                                                      p.K, p.V, fo, &p.s, &o, &f,
                                                                      sv),
                                         PF_OK);
                            CHECK(same_grads(&p),
                                  "%s causal=%d B*H=%d threads=%d out=%d heads kept %d: saved and "
                                  "recomputed gradients differ",
                                  pf_kernel_name(f.kernel), causal, B * H, t, given,
                                  pf_favor_saved_heads(sv));
                            cases++;
                        }
                    }
                }
                pf_favor_saved_free(sv);
            }
        }
        free(out);
        free(out2);
        problem_free(&p);
    }
    printf("saved features: %d cases bit-identical to the recomputing backward\n", cases);

    /* errors: made for other shapes or options, empty, failed forward */
    problem p = problem_make(2, 2, 20, 20, 8, 8, 16, 710);
    pf_favor_opts f = favor_of(&p, PF_KERNEL_POSITIVE, 16, 0);
    pf_attn_opts o = pf_attn_opts_default();
    float *out = xmalloc(sizeof(float) * p.no);
    pf_favor_saved *sv = (pf_favor_saved *)&p; /* (must be reset to NULL on failure) */
    CHECK_STATUS(pf_favor_saved_create(NULL, &p.s, &o, &f, 0), PF_EINVAL);
    pf_shape bad = p.s;
    bad.d = 0;
    CHECK_STATUS(pf_favor_saved_create(&sv, &bad, &o, &f, 0), PF_EINVAL);
    CHECK(sv == NULL, "failed create left a pointer");
    pf_favor_opts fm0 = f;
    fm0.m = 0;
    CHECK_STATUS(pf_favor_saved_create(&sv, &p.s, &o, &fm0, 0), PF_EINVAL);
    pf_favor_saved_free(NULL);
    CHECK(pf_favor_saved_bytes(NULL) == 0 && pf_favor_saved_heads(NULL) == 0, "of NULL");
    CHECK_STATUS(pf_favor_saved_create(&sv, &p.s, &o, &f, 0), PF_OK);
    /* empty */
    CHECK_STATUS(
        pf_attn_favor_backward_saved(p.dQ, p.dK, p.dV, p.G, p.Q, p.K, p.V, NULL, &p.s, &o, &f, sv),
        PF_EINVAL);
    CHECK_STATUS(pf_attn_favor_save(out, p.Q, p.K, p.V, &p.s, &o, &f, NULL), PF_EINVAL);
    CHECK_STATUS(pf_attn_favor_save(out, p.Q, p.K, p.V, &p.s, &o, &f, sv), PF_OK);
    CHECK_STATUS(pf_attn_favor_backward_saved(p.dQ, p.dK, p.dV, p.G, p.Q, p.K, p.V, NULL, &p.s, &o,
                                              &f, NULL),
                 PF_EINVAL);
    /* another shape, causal flag, W, scale, key lengths, kernel */
    pf_shape s2 = p.s;
    s2.Lq = s2.Lk = 10;
    CHECK_STATUS(pf_attn_favor_save(out, p.Q, p.K, p.V, &s2, &o, &f, sv), PF_EINVAL);
    CHECK_STATUS(
        pf_attn_favor_backward_saved(p.dQ, p.dK, p.dV, p.G, p.Q, p.K, p.V, NULL, &s2, &o, &f, sv),
        PF_EINVAL);
    pf_attn_opts oc = o;
    oc.causal = 1;
    CHECK_STATUS(
        pf_attn_favor_backward_saved(p.dQ, p.dK, p.dV, p.G, p.Q, p.K, p.V, NULL, &p.s, &oc, &f, sv),
        PF_EINVAL);
    oc = o;
    oc.scale = 0.5f;
    CHECK_STATUS(
        pf_attn_favor_backward_saved(p.dQ, p.dK, p.dV, p.G, p.Q, p.K, p.V, NULL, &p.s, &oc, &f, sv),
        PF_EINVAL);
    int32_t kl[2] = {20, 19};
    oc = o;
    oc.key_len = kl;
    CHECK_STATUS(
        pf_attn_favor_backward_saved(p.dQ, p.dK, p.dV, p.G, p.Q, p.K, p.V, NULL, &p.s, &oc, &f, sv),
        PF_EINVAL);
    kl[1] = 20; /* the same lengths in another array match */
    CHECK_STATUS(
        pf_attn_favor_backward_saved(p.dQ, p.dK, p.dV, p.G, p.Q, p.K, p.V, NULL, &p.s, &oc, &f, sv),
        PF_OK);
    pf_favor_opts f2 = f;
    f2.W = p.W + 16 * 8; /* another W (head 1's) */
    f2.w_per_head = 0;
    CHECK_STATUS(
        pf_attn_favor_backward_saved(p.dQ, p.dK, p.dV, p.G, p.Q, p.K, p.V, NULL, &p.s, &o, &f2, sv),
        PF_EINVAL);
    f2 = f;
    f2.kernel = PF_KERNEL_RELU;
    CHECK_STATUS(
        pf_attn_favor_backward_saved(p.dQ, p.dK, p.dV, p.G, p.Q, p.K, p.V, NULL, &p.s, &o, &f2, sv),
        PF_EINVAL);
    /* a forward that fails leaves it empty */
    const float keep = p.K[5];
    p.K[5] = NAN;
    CHECK_STATUS(pf_attn_favor_save(out, p.Q, p.K, p.V, &p.s, &o, &f, sv), PF_ENONFINITE);
    p.K[5] = keep;
    CHECK_STATUS(
        pf_attn_favor_backward_saved(p.dQ, p.dK, p.dV, p.G, p.Q, p.K, p.V, NULL, &p.s, &o, &f, sv),
        PF_EINVAL);
    pf_favor_saved_free(sv);
    free(out);
    problem_free(&p);
}

static int has_nan(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (isnan(x[i])) return 1;
    return 0;
}

/* 5'''. A long causal head's scan in segments (pf_favor_backward_segmented): the gradients are
 * bit for bit those of the whole-head scan, for every causal map, with padding that leaves whole
 * segments without keys, a chunk that does not divide the segment, the forward's out given or
 * not, features kept or recomputed, at 1 and 2 threads; segments of one block, of several, and
 * of a length that does not divide L. */
static void test_segments(void) {
    const pf_kernel kernels[5] = {PF_KERNEL_POSITIVE, PF_KERNEL_HYPERBOLIC, PF_KERNEL_TRIG,
                                  PF_KERNEL_RELU, PF_KERNEL_OPRF};
    const int B = 2, H = 2, L = 1000, d = 16, dv = 16, m = 32;
    const int segs[3] = {1, 300, 700};
    problem p = problem_make(B, H, L, L, d, dv, m, 880);
    set_row_norms(p.Q, p.nq / d, d, 0.5, 3.0);
    set_row_norms(p.K, p.nk / d, d, 0.5, 3.0);
    int32_t klen[2] = {L - 37, 200};
    float *out = xmalloc(sizeof(float) * p.no);
    int cases = 0;
    for (int k = 0; k < 5; k++) {
        for (int chunk = 0; chunk <= 24; chunk += 24) {
            pf_attn_opts o = pf_attn_opts_default();
            o.causal = 1;
            o.key_len = klen;
            pf_favor_opts f = favor_of(&p, kernels[k], m, k == 3 ? 1e-3f : 0.0f);
            f.chunk = chunk;
            if (kernels[k] == PF_KERNEL_OPRF) {
                f.oprf_a_given = 1;
                f.oprf_a = -0.05f;
            }
            /* features kept for every head, for half of them (a thread then holds the rows of
             * both kinds, with segments of their own lengths), or for none */
            pf_favor_saved *sv = NULL, *half = NULL;
            CHECK_STATUS(pf_favor_saved_create(&sv, &p.s, &o, &f, 0), PF_OK);
            CHECK_STATUS(pf_favor_saved_create(&half, &p.s, &o, &f, pf_favor_saved_bytes(sv) / 2),
                         PF_OK);
            CHECK(pf_favor_saved_heads(half) >= 1 && pf_favor_saved_heads(half) < B * H,
                  "half the budget keeps %d heads", pf_favor_saved_heads(half));
            CHECK_STATUS(pf_attn_favor_save(out, p.Q, p.K, p.V, &p.s, &o, &f, sv), PF_OK);
            CHECK_STATUS(pf_attn_favor_save(out, p.Q, p.K, p.V, &p.s, &o, &f, half), PF_OK);
            for (int kept = 0; kept < 3; kept++) {
                for (int given = 0; given < 2; given++) {
                    const float *fo = given ? out : NULL;
                    const pf_favor_saved *use = kept == 2 ? half : kept ? sv : NULL;
                    o.threads = 1;
                    CHECK_STATUS(pf_favor_backward_segmented(p.rQ, p.rK, p.rV, p.G, p.Q, p.K, p.V,
                                                             fo, &p.s, &o, &f, use, 0),
                                 PF_OK);
                    for (int t = 1; t <= 2; t++) {
                        o.threads = t;
                        for (int g = 0; g < 3; g++) {
                            poison_grads(&p);
                            CHECK_STATUS(pf_favor_backward_segmented(p.dQ, p.dK, p.dV, p.G, p.Q,
                                                                     p.K, p.V, fo, &p.s, &o, &f,
                                                                     use, segs[g]),
                                         PF_OK);
                            CHECK(same_grads(&p),
                                  "%s chunk=%d kept=%d out=%d threads=%d: segments of %d rows "
                                  "change the gradients",
                                  pf_kernel_name(f.kernel), chunk, kept, given, t, segs[g]);
                            cases++;
                        }
                    }
                }
            }
            pf_favor_saved_free(sv);
            pf_favor_saved_free(half);
        }
    }
    printf("segmented causal scan: %d cases bit-identical to the whole-head scan\n", cases);
    free(out);
    problem_free(&p);
}

/* 6. error paths */
/* The backward and its reference both fail with want, and the fast one leaves no NaN. */
static void bwd_fails(problem *p, const pf_attn_opts *o, const pf_favor_opts *f, pf_status want,
                      const char *what) {
    CHECK_STATUS(
        pf_attn_favor_backward(p->dQ, p->dK, p->dV, p->G, p->Q, p->K, p->V, NULL, &p->s, o, f),
        want);
    CHECK(!has_nan(p->dQ, p->nq) && !has_nan(p->dK, p->nk) && !has_nan(p->dV, p->nv),
          "NaN in the gradients after %s (causal=%d)", what, o->causal);
    CHECK_STATUS(
        pf_attn_favor_backward_ref(p->dQ, p->dK, p->dV, p->G, p->Q, p->K, p->V, &p->s, o, f), want);
}

static void test_errors(void) {
    problem p = problem_make(2, 2, 20, 20, 8, 8, 16, 700);
    pf_favor_opts f = favor_of(&p, PF_KERNEL_POSITIVE, 16, 0);
    pf_attn_opts o = pf_attn_opts_default();
    const pf_shape s = p.s;
    float *dQ = p.dQ, *dK = p.dK, *dV = p.dV;
    CHECK_STATUS(pf_attn_favor_backward(dQ, dK, dV, p.G, p.Q, p.K, p.V, NULL, &s, &o, &f), PF_OK);
    CHECK_STATUS(pf_attn_favor_backward(NULL, dK, dV, p.G, p.Q, p.K, p.V, NULL, &s, &o, &f),
                 PF_EINVAL);
    CHECK_STATUS(pf_attn_favor_backward(dQ, NULL, dV, p.G, p.Q, p.K, p.V, NULL, &s, &o, &f),
                 PF_EINVAL);
    CHECK_STATUS(pf_attn_favor_backward(dQ, dK, NULL, p.G, p.Q, p.K, p.V, NULL, &s, &o, &f),
                 PF_EINVAL);
    CHECK_STATUS(pf_attn_favor_backward(dQ, dK, dV, NULL, p.Q, p.K, p.V, NULL, &s, &o, &f),
                 PF_EINVAL);
    CHECK_STATUS(pf_attn_favor_backward(dQ, dK, dV, p.G, NULL, p.K, p.V, NULL, &s, &o, &f),
                 PF_EINVAL);
    CHECK_STATUS(pf_attn_favor_backward(dQ, dK, dV, p.G, p.Q, NULL, p.V, NULL, &s, &o, &f),
                 PF_EINVAL);
    CHECK_STATUS(pf_attn_favor_backward(dQ, dK, dV, p.G, p.Q, p.K, NULL, NULL, &s, &o, &f),
                 PF_EINVAL);
    CHECK_STATUS(pf_attn_favor_backward(dQ, dK, dV, p.G, p.Q, p.K, p.V, NULL, NULL, &o, &f),
                 PF_EINVAL);
    CHECK_STATUS(pf_attn_favor_backward(dQ, dK, dV, p.G, p.Q, p.K, p.V, NULL, &s, NULL, &f),
                 PF_EINVAL);
    CHECK_STATUS(pf_attn_favor_backward(dQ, dK, dV, p.G, p.Q, p.K, p.V, NULL, &s, &o, NULL),
                 PF_EINVAL);
    CHECK_STATUS(pf_attn_favor_backward_ref(NULL, dK, dV, p.G, p.Q, p.K, p.V, &s, &o, &f),
                 PF_EINVAL);
    CHECK_STATUS(pf_attn_favor_backward_ref(dQ, dK, dV, p.G, p.Q, p.K, p.V, &s, &o, NULL),
                 PF_EINVAL);
    pf_favor_opts g = f;
    g.W = NULL;
    CHECK_STATUS(pf_attn_favor_backward(dQ, dK, dV, p.G, p.Q, p.K, p.V, NULL, &s, &o, &g),
                 PF_EINVAL);
    g = f;
    g.m = 0;
    CHECK_STATUS(pf_attn_favor_backward(dQ, dK, dV, p.G, p.Q, p.K, p.V, NULL, &s, &o, &g),
                 PF_EINVAL);
    g.m = -1;
    CHECK_STATUS(pf_attn_favor_backward_ref(dQ, dK, dV, p.G, p.Q, p.K, p.V, &s, &o, &g), PF_EINVAL);
    g = f;
    g.kernel = (pf_kernel)9;
    CHECK_STATUS(pf_attn_favor_backward(dQ, dK, dV, p.G, p.Q, p.K, p.V, NULL, &s, &o, &g),
                 PF_EINVAL);
    g = f;
    g.chunk = -3;
    CHECK_STATUS(pf_attn_favor_backward(dQ, dK, dV, p.G, p.Q, p.K, p.V, NULL, &s, &o, &g),
                 PF_EINVAL);
    pf_shape bad = s;
    bad.Lk = 10;
    pf_attn_opts oc = o;
    oc.causal = 1;
    CHECK_STATUS(pf_attn_favor_backward(dQ, dK, dV, p.G, p.Q, p.K, p.V, NULL, &bad, &oc, &f),
                 PF_EINVAL);
    CHECK_STATUS(pf_attn_favor_backward_ref(dQ, dK, dV, p.G, p.Q, p.K, p.V, &bad, &oc, &f),
                 PF_EINVAL);

    /* NaN / Inf in each input, including a padded key, fast and reference */
    float *arrs[5] = {p.Q, p.K, p.V, p.G, p.W};
    size_t sizes[5] = {p.nq, p.nk, p.nv, p.no, (size_t)2 * 16 * 8};
    int32_t kl[2] = {20, 13};
    for (int a = 0; a < 5; a++) {
        size_t where[3] = {0, sizes[a] / 2, sizes[a] - 1}; /* the last is padded for K, V */
        for (int w = 0; w < 3; w++) {
            for (int c = 0; c < 2; c++) {
                float keep = arrs[a][where[w]];
                arrs[a][where[w]] = w == 1 ? INFINITY : NAN;
                pf_attn_opts on = o;
                on.causal = c;
                on.key_len = kl;
                CHECK_STATUS(
                    pf_attn_favor_backward(dQ, dK, dV, p.G, p.Q, p.K, p.V, NULL, &s, &on, &f),
                    PF_ENONFINITE);
                if (a < 4)
                    CHECK(!has_nan(dQ, p.nq) && !has_nan(dK, p.nk) && !has_nan(dV, p.nv),
                          "NaN in the gradients after a NaN input (%d)", a);
                CHECK_STATUS(
                    pf_attn_favor_backward_ref(dQ, dK, dV, p.G, p.Q, p.K, p.V, &s, &on, &f),
                    PF_ENONFINITE);
                arrs[a][where[w]] = keep;
            }
        }
    }
    /* a NaN or Inf in the forward's out */
    float *outb = xmalloc(sizeof(float) * p.no);
    CHECK_STATUS(pf_attn_favor(outb, p.Q, p.K, p.V, &s, &o, &f), PF_OK);
    CHECK_STATUS(pf_attn_favor_backward(dQ, dK, dV, p.G, p.Q, p.K, p.V, outb, &s, &o, &f), PF_OK);
    outb[p.no / 2] = NAN;
    CHECK_STATUS(pf_attn_favor_backward(dQ, dK, dV, p.G, p.Q, p.K, p.V, outb, &s, &o, &f),
                 PF_ENONFINITE);
    outb[p.no / 2] = INFINITY;
    CHECK_STATUS(pf_attn_favor_backward(dQ, dK, dV, p.G, p.Q, p.K, p.V, outb, &s, &o, &f),
                 PF_ENONFINITE);
    free(outb);

    /* zero denominators: relu, eps = 0, every key feature relu(u) = 0 */
    for (size_t i = 0; i < (size_t)2 * 16 * 8; i++) p.W[i] = (i % 8 == 0) ? 1.0f : 0.0f;
    for (size_t j = 0; j < p.nk / 8; j++) p.K[j * 8] = -fabsf(p.K[j * 8]) - 0.1f;
    g = f;
    g.kernel = PF_KERNEL_RELU;
    for (int c = 0; c < 2; c++) {
        pf_attn_opts on = o;
        on.causal = c;
        bwd_fails(&p, &on, &g, PF_EDOMAIN, "a zero denominator");
        /* a non-finite dout comes first, in a row with or without a denominator */
        for (int w = 0; w < 2; w++) {
            const size_t at = w ? p.no - 1 : 0;
            const float keep = p.G[at];
            p.G[at] = w ? INFINITY : NAN;
            bwd_fails(&p, &on, &g, PF_ENONFINITE, "a non-finite dout and a zero denominator");
            p.G[at] = keep;
        }
    }
    problem_free(&p);
}

int main(void) {
    test_finite_differences();
    test_vs_reference();
    test_large_norms();
    test_overwrite_and_threads();
    test_few_heads();
    test_saved();
    test_segments();
    test_errors();
    TEST_MAIN_END();
}
