/* favor_problem.h: the FAVOR+ tests' shared problem: Q, K, V (and an upstream gradient G) of one
 * shape with N(0, 1) entries from fixed streams of a seed, an orthogonal W per head (or one for
 * all), and buffers for a fast result, a second one, a float64 reference and gradients. Used by
 * test_favor_forward.c, test_favor_backward.c and test_favor_fit.c. */
#ifndef PF_TEST_FAVOR_PROBLEM_H
#define PF_TEST_FAVOR_PROBLEM_H

#include <stdint.h>
#include <stdlib.h>

#include "check.h"

typedef struct problem {
    pf_shape s;
    float *Q, *K, *V, *G, *W;           /* G: d loss / d out */
    float *out, *out2;                  /* fast outputs */
    double *ref;                        /* the float64 reference's output */
    float *dQ, *dK, *dV, *rQ, *rK, *rV; /* fast and reference gradients */
    size_t nq, nk, nv, no;
} problem;

/* Entries of Q, K, V, G from streams 0..3 of seed; W of head h (h < w_heads) from stream
 * 100 + h: orthogonal rows with chi norms. */
static inline problem problem_make_w(int B, int H, int Lq, int Lk, int d, int dv, int m,
                                     int w_heads, uint64_t seed) {
    problem p;
    p.s = (pf_shape){B, H, Lq, Lk, d, dv};
    p.nq = (size_t)B * H * Lq * d;
    p.nk = (size_t)B * H * Lk * d;
    p.nv = (size_t)B * H * Lk * dv;
    p.no = (size_t)B * H * Lq * dv;
    p.Q = xmalloc(sizeof(float) * p.nq);
    p.K = xmalloc(sizeof(float) * p.nk);
    p.V = xmalloc(sizeof(float) * p.nv);
    p.G = xmalloc(sizeof(float) * p.no);
    p.W = xmalloc(sizeof(float) * (size_t)w_heads * m * d);
    p.out = xmalloc(sizeof(float) * p.no);
    p.out2 = xmalloc(sizeof(float) * p.no);
    p.ref = xmalloc(sizeof(double) * p.no);
    p.dQ = xmalloc(sizeof(float) * p.nq);
    p.dK = xmalloc(sizeof(float) * p.nk);
    p.dV = xmalloc(sizeof(float) * p.nv);
    p.rQ = xmalloc(sizeof(float) * p.nq);
    p.rK = xmalloc(sizeof(float) * p.nk);
    p.rV = xmalloc(sizeof(float) * p.nv);
    fill_normal(p.Q, p.nq, 1, seed, 0);
    fill_normal(p.K, p.nk, 1, seed, 1);
    fill_normal(p.V, p.nv, 1, seed, 2);
    fill_normal(p.G, p.no, 1, seed, 3);
    for (int h = 0; h < w_heads; h++)
        pf_projection_draw(p.W + (size_t)h * m * d, m, d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, seed,
                           100 + (uint64_t)h);
    return p;
}

/* A W per head. */
static inline problem problem_make(int B, int H, int Lq, int Lk, int d, int dv, int m,
                                   uint64_t seed) {
    return problem_make_w(B, H, Lq, Lk, d, dv, m, H, seed);
}

static inline void problem_free(problem *p) {
    float *all[14] = {p->Q,  p->K,  p->V,  p->G,  p->W,  p->out, p->out2,
                      p->dQ, p->dK, p->dV, p->rQ, p->rK, p->rV,  NULL};
    for (int i = 0; all[i]; i++) free(all[i]);
    free(p->ref);
}

#endif
