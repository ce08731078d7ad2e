/* test_favor_state.c: streaming causal FAVOR+ (pf_favor_state_*), the decoder's attention.
 *
 * The reference is the causal full pass pf_attn_favor (itself tested against float64 in
 * test_favor_forward.c) on the same (H, L) inputs, and for large norms the float64 pf_attn_favor_ref:
 * - token by token, every kernel, per-head W: rows equal to 1e-6 (relative 2-norm over all rows;
 *   the sums are associated differently, so float rounding, ~1e-7, is all that may differ);
 * - steps that are multiples of the chunk C (the last one shorter): the same bits as the full
 *   pass, since they run the same chunk computations (default C and C = 7), and pf_mm gives a
 *   row the same bits whatever the rows beside it; for long sequences of few heads, which the
 *   full pass scans in blocks, equal to 1e-6 (the stated limit, checked at L up to 4096);
 * - mixed step sizes 1, 3, 16, 7, 2, 31: equal to 1e-6;
 * - rows of norm 30 and keys of norms 1..30, whose log factors span ~100 so that the running
 *   max grows and the state is rescaled: equal to the float64 formula to 1e-5;
 * - reset, the position, W copied at create, thread count, every error path (and a refused
 *   step leaves the state as it was);
 * - one-token steps (decoding, a path of their own): the same bits as the full pass with C = 1
 *   for every kernel and several shapes, equal to float64 to 1e-5, the same at 1 and 2 threads;
 * - a failed step changes nothing; many sequences in one state, prefill, snapshots (8-10). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ref.h"

#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct problem {
    int H, L, d, dv, m;
    float *Q, *K, *V, *W; /* (H, L, d), (H, L, d), (H, L, dv), (H, m, d) */
    float *full, *out;    /* (H, L, dv): the full causal pass, the streamed rows */
    float *q, *k, *v, *o; /* one step's (H, n, .) inputs and output */
} problem;

static problem problem_make(int H, int L, int d, int dv, int m, uint64_t seed) {
    problem p = {H, L, d, dv, m, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    size_t nq = (size_t)H * L * d, nv = (size_t)H * L * dv;
    p.Q = xmalloc(sizeof(float) * nq);
    p.K = xmalloc(sizeof(float) * nq);
    p.V = xmalloc(sizeof(float) * nv);
    p.W = xmalloc(sizeof(float) * H * m * d);
    p.full = xmalloc(sizeof(float) * nv);
    p.out = xmalloc(sizeof(float) * nv);
    p.q = xmalloc(sizeof(float) * nq);
    p.k = xmalloc(sizeof(float) * nq);
    p.v = xmalloc(sizeof(float) * nv);
    p.o = xmalloc(sizeof(float) * nv);
    fill_normal(p.Q, nq, 1, seed, 0);
    fill_normal(p.K, nq, 1, seed, 1);
    fill_normal(p.V, nv, 1, seed, 2);
    set_row_norms(p.Q, nq / d, d, 0.5, 2.0);
    set_row_norms(p.K, nq / d, d, 0.5, 2.0);
    for (int h = 0; h < H; h++)
        pf_projection_draw(p.W + (size_t)h * m * d, m, d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, seed,
                           100 + h);
    return p;
}

static void problem_free(problem *p) {
    float *all[10] = {p->Q, p->K, p->V, p->W, p->full, p->out, p->q, p->k, p->v, p->o};
    for (int i = 0; i < 10; i++) free(all[i]);
}

static pf_favor_opts favor_of(const problem *p, pf_kernel kernel, int chunk) {
    pf_favor_opts f = pf_favor_opts_default();
    f.kernel = kernel;
    f.W = p->W;
    f.m = p->m;
    f.w_per_head = 1;
    f.eps = kernel == PF_KERNEL_RELU ? 1e-3f : 0.0f;
    f.chunk = chunk;
    return f;
}

static pf_status full_pass(problem *p, const pf_favor_opts *f) {
    pf_shape s = {1, p->H, p->L, p->L, p->d, p->dv};
    pf_attn_opts o = pf_attn_opts_default();
    o.causal = 1;
    return pf_attn_favor(p->full, p->Q, p->K, p->V, &s, &o, f);
}

/* Rows [t, t + n) of every head of X (H, L, w) into x (H, n, w), or back (dir = 1). */
static void gather(float *x, float *X, int H, int L, int w, int t, int n, int dir) {
    for (int h = 0; h < H; h++) {
        float *a = x + (size_t)h * n * w, *b = X + ((size_t)h * L + t) * w;
        if (dir)
            memcpy(b, a, sizeof(float) * n * w);
        else
            memcpy(a, b, sizeof(float) * n * w);
    }
}

/* Streams the whole sequence through st with step sizes steps[0], steps[1], ... (cycled, the
 * last cut to what is left) into p->out. Returns the first status other than PF_OK. */
static pf_status stream(problem *p, pf_favor_state *st, const int *steps, int nsteps) {
    pf_status worst = PF_OK;
    for (int t = 0, i = 0; t < p->L; i++) {
        int n = steps[i % nsteps];
        if (n > p->L - t) n = p->L - t;
        gather(p->q, p->Q, p->H, p->L, p->d, t, n, 0);
        gather(p->k, p->K, p->H, p->L, p->d, t, n, 0);
        gather(p->v, p->V, p->H, p->L, p->dv, t, n, 0);
        pf_status s = pf_favor_state_step(st, p->o, p->q, p->k, p->v, n);
        if (s != PF_OK && worst == PF_OK) worst = s;
        gather(p->o, p->out, p->H, p->L, p->dv, t, n, 1);
        t += n;
        if (pf_favor_state_position(st) != t) return PF_EINVAL; /* (checked by the caller) */
    }
    return worst;
}

static size_t nout(const problem *p) {
    return (size_t)p->H * p->L * p->dv;
}

/* 1-3: token by token, aligned chunks, mixed steps; every kernel; reset. m = 74 puts W^T in
 * three panels on AVX2 (pf_fmap_bind), the last of 10 columns. */
static void test_against_full_pass(int m) {
    const int H = 3, L = 150, d = 16, dv = 24; /* 150 = 9 x 16 + 6 */
    const int one[1] = {1}, mixed[6] = {1, 3, 16, 7, 2, 31};
    double worst_tok = 0, worst_mix = 0;
    for (int k = 0; k < 4; k++) {
        problem p = problem_make(H, L, d, dv, m, 11 + k);
        const int chunks[2] = {0, 7};
        for (int ci = 0; ci < 2; ci++) {
            pf_favor_opts f = favor_of(&p, (pf_kernel)k, chunks[ci]);
            const int C = chunks[ci] ? chunks[ci] : 16;
            CHECK_STATUS(full_pass(&p, &f), PF_OK);
            pf_favor_state *st = NULL;
            CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, 0.0f, &f), PF_OK);
            if (!st) continue;
            CHECK(pf_favor_state_position(st) == 0, "fresh state at %lld",
                  (long long)pf_favor_state_position(st));

            /* token by token */
            CHECK_STATUS(stream(&p, st, one, 1), PF_OK);
            double e = rel_err(p.out, p.full, nout(&p));
            worst_tok = fmax(worst_tok, e);
            CHECK(e <= 1e-6, "%s C=%d token by token: rel err %.3g", pf_kernel_name(f.kernel), C,
                  e);

            /* steps of C and of 2C from a reset state: the same bits */
            for (int mult = 1; mult <= 2; mult++) {
                CHECK_STATUS(pf_favor_state_reset(st), PF_OK);
                CHECK(pf_favor_state_position(st) == 0, "reset position");
                const int step[1] = {mult * C};
                CHECK_STATUS(stream(&p, st, step, 1), PF_OK);
                CHECK(memcmp(p.out, p.full, sizeof(float) * nout(&p)) == 0,
                      "%s: steps of %d (C = %d) differ from the full pass",
                      pf_kernel_name(f.kernel), mult * C, C);
            }

            /* mixed step sizes */
            CHECK_STATUS(pf_favor_state_reset(st), PF_OK);
            CHECK_STATUS(stream(&p, st, mixed, 6), PF_OK);
            e = rel_err(p.out, p.full, nout(&p));
            worst_mix = fmax(worst_mix, e);
            CHECK(e <= 1e-6, "%s C=%d mixed steps: rel err %.3g", pf_kernel_name(f.kernel), C, e);

            /* one step of the whole sequence: one more aligned case */
            CHECK_STATUS(pf_favor_state_reset(st), PF_OK);
            const int all[1] = {L};
            CHECK_STATUS(stream(&p, st, all, 1), PF_OK);
            CHECK(memcmp(p.out, p.full, sizeof(float) * nout(&p)) == 0, /* (the same calls) */
                  "%s C=%d: one step of L differs from the full pass", pf_kernel_name(f.kernel), C);
            pf_favor_state_free(st);
        }
        problem_free(&p);
    }
    printf("vs the causal full pass, m = %d: token by token worst rel err %.3g, mixed steps %.3g; "
           "aligned steps bit-identical\n",
           m, worst_tok, worst_mix);
}

/* 4. norm 30: queries of norm 30, keys of norms 1..30 (and all 30), so the key log factors
 * c_j = max u - |k'|^2/2 + ... range over ~100 and the running max moves: token by token and
 * aligned steps against the float64 reference. */
static void test_large_norms(void) {
    const int H = 2, L = 150, d = 16, dv = 16, m = 64;
    const pf_kernel ks[3] = {PF_KERNEL_POSITIVE, PF_KERNEL_HYPERBOLIC, PF_KERNEL_RELU};
    const int one[1] = {1}, mixed[4] = {5, 1, 16, 9};
    for (int keys = 0; keys < 2; keys++) {
        problem p = problem_make(H, L, d, dv, m, 31);
        set_row_norms(p.Q, (size_t)H * L, d, 30.0, 30.0);
        set_row_norms(p.K, (size_t)H * L, d, keys ? 1.0 : 30.0, 30.0);
        for (int k = 0; k < 3; k++) {
            pf_favor_opts f = favor_of(&p, ks[k], 0);
            pf_shape s = {1, H, L, L, d, dv};
            pf_attn_opts o = pf_attn_opts_default();
            o.causal = 1;
            float *ref = xmalloc(sizeof(float) * nout(&p));
            CHECK_STATUS(pf_attn_favor_ref(ref, p.Q, p.K, p.V, &s, &o, &f), PF_OK);
            pf_favor_state *st = NULL;
            CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, 0.0f, &f), PF_OK);
            for (int pass = 0; pass < 2; pass++) {
                CHECK_STATUS(pf_favor_state_reset(st), PF_OK);
                CHECK_STATUS(pass ? stream(&p, st, mixed, 4) : stream(&p, st, one, 1), PF_OK);
                double e = rel_err(p.out, ref, nout(&p));
                printf("norm 30 (keys %s), %s, %s: rel err vs float64 %.3g\n",
                       keys ? "1..30" : "30", pf_kernel_name(f.kernel),
                       pass ? "mixed steps" : "token by token", e);
                CHECK(e < 1e-5, "norm 30 %s pass %d: rel err %.3g", pf_kernel_name(f.kernel), pass,
                      e);
            }
            pf_favor_state_free(st);
            free(ref);
        }
        problem_free(&p);
    }
}

/* 5. W is copied; the thread count does not matter; scale is honoured. */
static void test_copy_threads_scale(void) {
    const int H = 4, L = 64, d = 16, dv = 8, m = 32;
    problem p = problem_make(H, L, d, dv, m, 41);
    const int one[1] = {1};
    pf_favor_opts f = favor_of(&p, PF_KERNEL_POSITIVE, 0);
    CHECK_STATUS(full_pass(&p, &f), PF_OK);
    pf_favor_state *st = NULL;
    CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, 0.0f, &f), PF_OK);
    float *keep = xmalloc(sizeof(float) * H * m * d);
    memcpy(keep, p.W, sizeof(float) * H * m * d);
    for (int i = 0; i < H * m * d; i++) p.W[i] = 0.0f; /* the state must not see this */
    CHECK_STATUS(stream(&p, st, one, 1), PF_OK);
    CHECK(rel_err(p.out, p.full, nout(&p)) <= 1e-6, "W was not copied");
    float *out1 = xmalloc(sizeof(float) * nout(&p));
    memcpy(out1, p.out, sizeof(float) * nout(&p));
    memcpy(p.W, keep, sizeof(float) * H * m * d);
    pf_favor_state_free(st);
#ifdef _OPENMP
    /* one thread and two threads: the same bits */
    int nt = omp_get_max_threads();
    omp_set_num_threads(nt > 1 ? 1 : 2);
    CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, 0.0f, &f), PF_OK);
    CHECK_STATUS(stream(&p, st, one, 1), PF_OK);
    CHECK(memcmp(p.out, out1, sizeof(float) * nout(&p)) == 0, "thread counts differ");
    pf_favor_state_free(st);
    omp_set_num_threads(nt);
#endif
    /* a scale other than 1/sqrt(d) */
    pf_shape s = {1, H, L, L, d, dv};
    pf_attn_opts o = pf_attn_opts_default();
    o.causal = 1;
    o.scale = 0.4f;
    CHECK_STATUS(pf_attn_favor(p.full, p.Q, p.K, p.V, &s, &o, &f), PF_OK);
    CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, 0.4f, &f), PF_OK);
    CHECK_STATUS(stream(&p, st, one, 1), PF_OK);
    CHECK(rel_err(p.out, p.full, nout(&p)) <= 1e-6, "scale 0.4: rel err %.3g",
          rel_err(p.out, p.full, nout(&p)));
    pf_favor_state_free(st);
    free(keep);
    free(out1);
    problem_free(&p);
}

/* 6. every error path. */
static void test_errors(void) {
    const int H = 2, L = 40, d = 8, dv = 4, m = 16;
    problem p = problem_make(H, L, d, dv, m, 51);
    pf_favor_opts f = favor_of(&p, PF_KERNEL_POSITIVE, 0);
    pf_favor_state *st = (pf_favor_state *)&p; /* must be set to NULL on failure */
    CHECK_STATUS(pf_favor_state_create(NULL, H, d, dv, 0, &f), PF_EINVAL);
    CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, 0, NULL), PF_EINVAL);
    CHECK(st == NULL, "a failed create leaves *state NULL");
    CHECK_STATUS(pf_favor_state_create(&st, 0, d, dv, 0, &f), PF_EINVAL);
    CHECK_STATUS(pf_favor_state_create(&st, H, 0, dv, 0, &f), PF_EINVAL);
    CHECK_STATUS(pf_favor_state_create(&st, H, d, -1, 0, &f), PF_EINVAL);
    CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, -1.0f, &f), PF_EINVAL);
    CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, NAN, &f), PF_EINVAL);
    pf_favor_opts g = f;
    g.W = NULL;
    CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, 0, &g), PF_EINVAL);
    g = f;
    g.m = 0;
    CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, 0, &g), PF_EINVAL);
    g = f;
    g.kernel = (pf_kernel)17;
    CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, 0, &g), PF_EINVAL);
    g = f;
    g.chunk = -2;
    CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, 0, &g), PF_EINVAL);
    g = f;
    g.eps = -1.0f;
    CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, 0, &g), PF_EINVAL);
    float keepw = p.W[3];
    p.W[3] = NAN;
    CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, 0, &f), PF_ENONFINITE);
    p.W[3] = keepw;
    CHECK(st == NULL, "failed creates leave *state NULL");

    pf_favor_state_free(NULL); /* harmless */
    CHECK_STATUS(pf_favor_state_reset(NULL), PF_EINVAL);
    CHECK(pf_favor_state_position(NULL) == 0, "position of NULL");

    CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, 0, &f), PF_OK);
    CHECK_STATUS(full_pass(&p, &f), PF_OK);
    /* a clean run with a refused step in the middle: the refused step changes nothing */
    const int n = 5;
    float *o = p.o;
    for (int t = 0; t < L; t += n) {
        gather(p.q, p.Q, H, L, d, t, n, 0);
        gather(p.k, p.K, H, L, d, t, n, 0);
        gather(p.v, p.V, H, L, dv, t, n, 0);
        if (t == 20) {
            CHECK_STATUS(pf_favor_state_step(NULL, o, p.q, p.k, p.v, n), PF_EINVAL);
            CHECK_STATUS(pf_favor_state_step(st, NULL, p.q, p.k, p.v, n), PF_EINVAL);
            CHECK_STATUS(pf_favor_state_step(st, o, NULL, p.k, p.v, n), PF_EINVAL);
            CHECK_STATUS(pf_favor_state_step(st, o, p.q, NULL, p.v, n), PF_EINVAL);
            CHECK_STATUS(pf_favor_state_step(st, o, p.q, p.k, NULL, n), PF_EINVAL);
            CHECK_STATUS(pf_favor_state_step(st, o, p.q, p.k, p.v, 0), PF_EINVAL);
            CHECK_STATUS(pf_favor_state_step(st, o, p.q, p.k, p.v, -3), PF_EINVAL);
            float *arrs[3] = {p.q, p.k, p.v};
            size_t where[3] = {(size_t)n * d + 3, 0, (size_t)2 * n * dv - 1}; /* head 1, 0, 1 */
            for (int a = 0; a < 3; a++) {
                for (int c = 0; c < 2; c++) {
                    float keep = arrs[a][where[a]];
                    arrs[a][where[a]] = c ? -INFINITY : NAN;
                    CHECK_STATUS(pf_favor_state_step(st, o, p.q, p.k, p.v, n), PF_ENONFINITE);
                    arrs[a][where[a]] = keep;
                }
            }
            /* finite but so long that W x' overflows float */
            float keep = p.k[1];
            p.k[1] = 3e38f;
            CHECK_STATUS(pf_favor_state_step(st, o, p.q, p.k, p.v, n), PF_ENONFINITE);
            p.k[1] = keep;
            CHECK(pf_favor_state_position(st) == 20, "refused steps moved the position to %lld",
                  (long long)pf_favor_state_position(st));
        }
        CHECK_STATUS(pf_favor_state_step(st, o, p.q, p.k, p.v, n), PF_OK);
        gather(o, p.out, H, L, dv, t, n, 1);
    }
    CHECK(rel_err(p.out, p.full, nout(&p)) <= 1e-6, "refused steps changed the state: %.3g",
          rel_err(p.out, p.full, nout(&p)));
    pf_favor_state_free(st);

    /* zero denominators (relu, eps 0, every feature 0): PF_EDOMAIN, zeros, nothing consumed */
    for (int i = 0; i < H * m * d; i++) p.W[i] = (i % d == 0) ? 1.0f : 0.0f;
    for (int j = 0; j < H * L; j++) p.K[(size_t)j * d] = -fabsf(p.K[(size_t)j * d]) - 0.1f;
    g = f;
    g.kernel = PF_KERNEL_RELU;
    g.eps = 0;
    CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, 0, &g), PF_OK);
    gather(p.q, p.Q, H, L, d, 0, 3, 0);
    gather(p.k, p.K, H, L, d, 0, 3, 0);
    gather(p.v, p.V, H, L, dv, 0, 3, 0);
    for (int i = 0; i < H * 3 * dv; i++) o[i] = NAN;
    CHECK_STATUS(pf_favor_state_step(st, o, p.q, p.k, p.v, 3), PF_EDOMAIN);
    int nan = 0;
    for (int i = 0; i < H * 3 * dv; i++) nan |= isnan(o[i]) || o[i] != 0.0f;
    CHECK(!nan, "zero denominators: rows not zeroed");
    CHECK(pf_favor_state_position(st) == 0, "EDOMAIN consumed the tokens: position %lld",
          (long long)pf_favor_state_position(st));
    pf_favor_state_free(st);
    problem_free(&p);
}

/* A failed step leaves the state exactly as it was: relu features with eps 0 and W whose rows
 * all weigh coordinate 0 positively, so a query with x_0 = -1 (the rest 0) has every feature 0
 * and a zero denominator (PF_EDOMAIN), while the other rows (x_0 >= 0.5) have positive ones. In a
 * stream of mixed step sizes, a bad query is tried first at some steps (in head 0 or in the last
 * head, so the heads before it have already stepped, at the first token or later, alone or as
 * the last row of a longer step); the position must not move, and every row of the stream,
 * retried with good queries, has the bits of a stream that never failed. */
static void test_failed_steps(void) {
    const int H = 3, L = 40, d = 8, dv = 5, m = 16;
    problem p = problem_make(H, L, d, dv, m, 4242);
    for (int i = 0; i < H * m * d; i++)
        if (i % d == 0) p.W[i] = 0.5f + 0.03f * (float)(i % 7);
        else p.W[i] *= 0.1f;
    for (int j = 0; j < H * L; j++) {
        p.Q[(size_t)j * d] = fabsf(p.Q[(size_t)j * d]) + 0.5f;
        p.K[(size_t)j * d] = fabsf(p.K[(size_t)j * d]) + 0.5f;
    }
    pf_favor_opts f = favor_of(&p, PF_KERNEL_RELU, 4);
    f.eps = 0.0f;
    static const int steps[6] = {1, 1, 5, 1, 3, 2};
    float *good = xmalloc(sizeof(float) * nout(&p));
    for (int pass = 0; pass < 2; pass++) {
        pf_favor_state *st = NULL;
        CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, 0.0f, &f), PF_OK);
        if (!st) break;
        int tries = 0;
        for (int t = 0, i = 0; t < L; i++) {
            int n = steps[i % 6];
            if (n > L - t) n = L - t;
            gather(p.q, p.Q, H, L, d, t, n, 0);
            gather(p.k, p.K, H, L, d, t, n, 0);
            gather(p.v, p.V, H, L, dv, t, n, 0);
            if (pass == 1 && i % 2 == 0) { /* a bad query first, in head 0 or the last */
                const int hb = (i / 2) % 2 ? H - 1 : 0;
                float *row = p.q + ((size_t)hb * n + (size_t)(n - 1)) * d, keep[8];
                memcpy(keep, row, sizeof keep);
                for (int c = 0; c < d; c++) row[c] = c == 0 ? -1.0f : 0.0f;
                CHECK_STATUS(pf_favor_state_step(st, p.o, p.q, p.k, p.v, n), PF_EDOMAIN);
                CHECK(pf_favor_state_position(st) == t,
                      "a failed step of %d at %d moved the position to %lld", n, t,
                      (long long)pf_favor_state_position(st));
                memcpy(row, keep, sizeof keep);
                tries++;
            }
            CHECK_STATUS(pf_favor_state_step(st, p.o, p.q, p.k, p.v, n), PF_OK);
            gather(p.o, p.out, H, L, dv, t, n, 1);
            t += n;
        }
        if (pass == 0)
            memcpy(good, p.out, sizeof(float) * nout(&p));
        else
            CHECK(memcmp(good, p.out, sizeof(float) * nout(&p)) == 0,
                  "after %d failed steps the stream's rows differ from one that never failed "
                  "(rel err %.3g)",
                  tries, rel_err(p.out, good, nout(&p)));
        pf_favor_state_free(st);
    }
    free(good);
    problem_free(&p);
}

/* The stated limit of the bit-for-bit claim (performer.h, pf_favor_state_step): aligned steps
 * give the full pass's bits when it scans each head in one piece, that is H >= 4 (B = 1) or
 * L <= 4 feature blocks (1024 rows at C = 16); a longer pass over fewer heads is cut into scan
 * blocks whose starting states are sums associated differently, and there the rows agree to
 * float rounding. Checked at L = 1024, 1040 and 4096 for H = 1, 2, 4. */
static void test_long_sequences(void) {
    static const int Ls[3] = {1024, 1040, 4096}, Hs[3] = {1, 2, 4};
    double worst = 0;
    for (int li = 0; li < 3; li++) {
        for (int hi = 0; hi < 3; hi++) {
            const int L = Ls[li], H = Hs[hi], C = 16;
            problem p = problem_make(H, L, 16, 8, 32, 700 + (uint64_t)(li * 3 + hi));
            pf_favor_opts f = favor_of(&p, PF_KERNEL_POSITIVE, C);
            CHECK_STATUS(full_pass(&p, &f), PF_OK);
            pf_favor_state *st = NULL;
            CHECK_STATUS(pf_favor_state_create(&st, H, 16, 8, 0.0f, &f), PF_OK);
            const int step[2] = {C, 3 * C};
            if (st) CHECK_STATUS(stream(&p, st, step, 2), PF_OK);
            const int one_piece = H >= 4 || L <= 4 * 256;
            if (one_piece) {
                CHECK(memcmp(p.out, p.full, sizeof(float) * nout(&p)) == 0,
                      "H=%d L=%d: aligned steps differ from the full pass (scanned in one piece)",
                      H, L);
            } else {
                double e = rel_err(p.out, p.full, nout(&p));
                worst = fmax(worst, e);
                CHECK(e <= 1e-6, "H=%d L=%d: aligned steps: rel err %.3g", H, L, e);
            }
            pf_favor_state_free(st);
            problem_free(&p);
        }
    }
    printf("long sequences: bit-identical where the full pass scans a head in one piece, "
           "else worst rel err %.3g\n",
           worst);
}

/* 7. one-token steps (decoding; favor/state.c's own path, with one pass over the state per head):
 * over many single tokens, every kernel a causal state supports (OPRF with a given A), shapes
 * whose dv + 1 is a whole number of vectors, one or two columns more (done apart by the
 * products), or a masked last vector, W per head or shared, eps 0 and > 0, keys of moderate
 * norms (the running max settles) and of norms 1..30 (it keeps moving: the state is rescaled):
 * - the same bits as the full causal pass with chunk C = 1, which runs the general path's
 *   arithmetic of a one-row step for every row;
 * - equal to the float64 reference pf_attn_favor_ref to 1e-5 (relative 2-norm);
 * - the same bits at 1 and 2 threads, also with heads enough for the step to spread them over
 *   threads. */
static void test_decode_path(void) {
    static const int shapes[5][3] = {/* d, dv, m */
                                     {16, 24, 32},
                                     {64, 64, 64},
                                     {8, 17, 20},
                                     {12, 15, 24},
                                     {20, 100, 40}};
    const pf_kernel ks[5] = {PF_KERNEL_POSITIVE, PF_KERNEL_HYPERBOLIC, PF_KERNEL_TRIG,
                             PF_KERNEL_RELU, PF_KERNEL_OPRF};
    const int H = 2, L = 97, one[1] = {1};
    double worst_ref = 0;
    int cases = 0;
    for (int si = 0; si < 5; si++) {
        const int d = shapes[si][0], dv = shapes[si][1], m = shapes[si][2];
        for (int moving = 0; moving < 2; moving++) {
            problem p = problem_make(H, L, d, dv, m, 900 + (uint64_t)(si * 2 + moving));
            if (moving) set_row_norms(p.K, (size_t)H * L, d, 1.0, 30.0);
            for (int k = 0; k < 5; k++) {
                for (int var = 0; var < 2; var++) { /* W per head and eps 0; shared W, eps > 0 */
                    pf_favor_opts f = favor_of(&p, ks[k], 1);
                    f.w_per_head = !var;
                    f.eps = var ? 1e-3f : 0.0f;
                    if (ks[k] == PF_KERNEL_OPRF) {
                        f.oprf_a_given = 1;
                        f.oprf_a = -0.1f;
                    }
                    /* trig has no stabiliser of its own: moderate norms only */
                    if (ks[k] == PF_KERNEL_TRIG && moving) continue;
                    CHECK_STATUS(full_pass(&p, &f), PF_OK);
                    pf_favor_state *st = NULL;
                    f.chunk = 0; /* the state's own chunk: one-token steps do not depend on it */
                    CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, 0.0f, &f), PF_OK);
                    if (!st) continue;
                    CHECK_STATUS(stream(&p, st, one, 1), PF_OK);
                    CHECK(memcmp(p.out, p.full, sizeof(float) * nout(&p)) == 0,
                          "%s d=%d dv=%d m=%d %s W, eps %g, %s keys: one-token steps differ from "
                          "the full pass with C = 1 (rel err %.3g)",
                          pf_kernel_name(f.kernel), d, dv, m, var ? "shared" : "per-head", f.eps,
                          moving ? "moving" : "settled", rel_err(p.out, p.full, nout(&p)));
                    pf_shape s = {1, H, L, L, d, dv};
                    pf_attn_opts o = pf_attn_opts_default();
                    o.causal = 1;
                    float *ref = xmalloc(sizeof(float) * nout(&p));
                    CHECK_STATUS(pf_attn_favor_ref(ref, p.Q, p.K, p.V, &s, &o, &f), PF_OK);
                    const double e = rel_err(p.out, ref, nout(&p));
                    worst_ref = fmax(worst_ref, e);
                    CHECK(e <= 1e-5, "%s d=%d dv=%d m=%d: one-token steps vs float64: %.3g",
                          pf_kernel_name(f.kernel), d, dv, m, e);
                    free(ref);
                    pf_favor_state_free(st);
                    cases++;
                }
            }
            problem_free(&p);
        }
    }
    printf("one-token steps: %d cases bit-identical to the full pass with C = 1; worst rel err vs "
           "float64 %.3g\n",
           cases, worst_ref);

#ifdef _OPENMP
    /* threads: 4 small heads (one thread per step), 8 heads of d = dv = 64, m = 256 (the
     * decoding benchmark's, shared among the two threads) and 64 heads of d = dv = 128,
     * m = 256 (among all), at 1 and 2 threads */
    const int nt = omp_get_max_threads();
    static const int Hs[3][5] = {
        {4, 16, 8, 32, 40}, {8, 64, 64, 256, 12}, {64, 128, 128, 256, 12}}; /* H d dv m L */
    for (int c = 0; c < 3; c++) {
        problem p = problem_make(Hs[c][0], Hs[c][4], Hs[c][1], Hs[c][2], Hs[c][3], 950 + c);
        set_row_norms(p.K, (size_t)p.H * p.L, p.d, 1.0, 30.0);
        pf_favor_opts f = favor_of(&p, PF_KERNEL_POSITIVE, 1);
        CHECK_STATUS(full_pass(&p, &f), PF_OK);
        float *first = xmalloc(sizeof(float) * nout(&p));
        float *firstp = xmalloc(sizeof(float) * nout(&p));
        for (int threads = 1; threads <= 2; threads++) {
            omp_set_num_threads(threads);
            pf_favor_state *st = NULL;
            CHECK_STATUS(pf_favor_state_create(&st, p.H, p.d, p.dv, 0.0f, &f), PF_OK);
            if (!st) continue;
            CHECK_STATUS(stream(&p, st, one, 1), PF_OK);
            CHECK(memcmp(p.out, p.full, sizeof(float) * nout(&p)) == 0,
                  "H=%d, %d threads: one-token steps differ from the full pass with C = 1", p.H,
                  threads);
            if (threads == 1)
                memcpy(first, p.out, sizeof(float) * nout(&p));
            else
                CHECK(memcmp(p.out, first, sizeof(float) * nout(&p)) == 0,
                      "H=%d: one-token steps differ between 1 and 2 threads", p.H);
            /* steps of a few tokens (prefills: the heads shared in the two larger cases) */
            static const int few[3] = {3, 2, 4};
            CHECK_STATUS(pf_favor_state_reset_seq(st, 0), PF_OK);
            CHECK_STATUS(stream(&p, st, few, 3), PF_OK);
            if (threads == 1)
                memcpy(firstp, p.out, sizeof(float) * nout(&p));
            else
                CHECK(memcmp(p.out, firstp, sizeof(float) * nout(&p)) == 0,
                      "H=%d: steps of 2-4 tokens differ between 1 and 2 threads", p.H);
            pf_favor_state_free(st);
        }
        omp_set_num_threads(nt);
        free(first);
        free(firstp);
        problem_free(&p);
    }
#endif
}

/* Row t of every head of a problem (H, L, w) into x (H, w) at slot i of a (count, H, w) buffer. */
static void token_rows(float *x, const float *X, int H, int L, int w, int t, int i) {
    for (int h = 0; h < H; h++)
        memcpy(x + ((size_t)i * H + h) * w, X + ((size_t)h * L + t) * w, sizeof(float) * w);
}

/* 8. Many sequences in one state (pf_favor_state_step_n): N sequences with their own tokens and
 * one W, stepped in changing subsets and orders (every sequence, then some), reset, copied; each
 * sequence's rows have the bits of a one-sequence state stepped token by token on its tokens.
 * A sequence whose inputs are refused (NaN) or whose step fails (zero denominator) is left as it
 * was while the others advance. Sizes large enough for the threads to share the pairs. */
static void test_many_sequences(void) {
    const int N = 16, H = 8, L = 8, d = 64, dv = 64, m = 256; /* (N H r (d + dv) = 2^22) */
    problem ps[16];
    for (int s = 0; s < N; s++) {
        ps[s] = problem_make(H, L, d, dv, m, 900 + (uint64_t)s);
        if (s) memcpy(ps[s].W, ps[0].W, sizeof(float) * H * m * d);
    }
    for (int shared = 0; shared < 2; shared++) {
        pf_favor_opts f = favor_of(&ps[0], PF_KERNEL_POSITIVE, 16);
        f.w_per_head = !shared;
        /* references: each sequence alone, token by token */
        const int one[1] = {1};
        for (int s = 0; s < N; s++) {
            pf_favor_state *r1 = NULL;
            CHECK_STATUS(pf_favor_state_create(&r1, H, d, dv, 0.0f, &f), PF_OK);
            if (r1) CHECK_STATUS(stream(&ps[s], r1, one, 1), PF_OK);
            memcpy(ps[s].full, ps[s].out, sizeof(float) * nout(&ps[s]));
            pf_favor_state_free(r1);
        }
        pf_favor_state *st = NULL;
        CHECK_STATUS(pf_favor_state_create_n(&st, N, H, d, dv, 0.0f, &f), PF_OK);
        if (!st) break;
        CHECK(pf_favor_state_sequences(st) == N, "sequences %d", pf_favor_state_sequences(st));
        float *q = xmalloc(sizeof(float) * N * H * d), *k = xmalloc(sizeof(float) * N * H * d);
        float *v = xmalloc(sizeof(float) * N * H * dv), *o = xmalloc(sizeof(float) * N * H * dv);
        int pos[16] = {0};
        int bad = 0;
        for (int round = 0; round < 3 * L; round++) {
            int32_t seqs[16];
            int count = 0;
            for (int s = 0; s < N; s++) { /* all, then changing subsets in reverse order */
                const int pick = round % 3 == 0 || (s + round) % 3 == 0;
                if (pick && pos[N - 1 - s] < L) seqs[count++] = N - 1 - s;
            }
            if (count == 0) continue;
            for (int i = 0; i < count; i++) {
                const problem *p = &ps[seqs[i]];
                token_rows(q, p->Q, H, L, d, pos[seqs[i]], i);
                token_rows(k, p->K, H, L, d, pos[seqs[i]], i);
                token_rows(v, p->V, H, L, dv, pos[seqs[i]], i);
            }
            pf_status stat[16];
            CHECK_STATUS(pf_favor_state_step_n(st, o, q, k, v, seqs, count, stat), PF_OK);
            for (int i = 0; i < count; i++) {
                const problem *p = &ps[seqs[i]];
                for (int h = 0; h < H; h++)
                    bad += memcmp(o + ((size_t)i * H + h) * dv,
                                  p->full + ((size_t)h * L + pos[seqs[i]]) * dv,
                                  sizeof(float) * dv) != 0;
                pos[seqs[i]]++;
                CHECK(pf_favor_state_position_of(st, seqs[i]) == pos[seqs[i]], "position of %d",
                      seqs[i]);
            }
        }
        CHECK(bad == 0, "shared W %d: %d rows of the many-sequence steps differ from the "
              "one-sequence states'", shared, bad);
        /* copy 1 onto 3, reset 2: then 3 continues 1's context and 2 starts again */
        for (int s = 0; s < N; s++) CHECK(pos[s] == L, "sequence %d at %d", s, pos[s]);
        CHECK_STATUS(pf_favor_state_copy_seq(st, 3, 1), PF_OK);
        CHECK_STATUS(pf_favor_state_reset_seq(st, 2), PF_OK);
        CHECK(pf_favor_state_position_of(st, 3) == L && pf_favor_state_position_of(st, 2) == 0,
              "after copy and reset: %lld, %lld", (long long)pf_favor_state_position_of(st, 3),
              (long long)pf_favor_state_position_of(st, 2));
        int32_t three[3] = {3, 1, 2};
        token_rows(q, ps[0].Q, H, L, d, 0, 0); /* 3 and 1 get the same token: same rows */
        token_rows(k, ps[0].K, H, L, d, 0, 0);
        token_rows(v, ps[0].V, H, L, dv, 0, 0);
        memcpy(q + (size_t)H * d, q, sizeof(float) * H * d);
        memcpy(k + (size_t)H * d, k, sizeof(float) * H * d);
        memcpy(v + (size_t)H * dv, v, sizeof(float) * H * dv);
        token_rows(q, ps[2].Q, H, L, d, 0, 2); /* 2 gets its first token again */
        token_rows(k, ps[2].K, H, L, d, 0, 2);
        token_rows(v, ps[2].V, H, L, dv, 0, 2);
        CHECK_STATUS(pf_favor_state_step_n(st, o, q, k, v, three, 3, NULL), PF_OK);
        CHECK(memcmp(o, o + (size_t)H * dv, sizeof(float) * H * dv) == 0,
              "a copied sequence does not continue as its source");
        bad = 0;
        for (int h = 0; h < H; h++)
            bad += memcmp(o + ((size_t)2 * H + h) * dv, ps[2].full + (size_t)h * L * dv,
                          sizeof(float) * dv) != 0;
        CHECK(bad == 0, "a reset sequence's first row differs from a fresh state's");
        /* failures stay in their sequence: a NaN in 0's key, a zero-feature relu query is not
         * possible here (positive features), so a NaN in 4's value; 5 steps normally */
        int32_t tri[3] = {0, 4, 5};
        for (int i = 0; i < 3; i++) {
            token_rows(q, ps[tri[i]].Q, H, L, d, 1, i);
            token_rows(k, ps[tri[i]].K, H, L, d, 1, i);
            token_rows(v, ps[tri[i]].V, H, L, dv, 1, i);
        }
        k[5] = NAN;
        v[2 * H * dv + 3] = INFINITY; /* (sequence 5: refused too) */
        v[2 * H * dv + 3] = v[2 * H * dv + 4];
        v[1 * H * dv + 7] = NAN;
        pf_status stat[3];
        const int64_t p0 = pf_favor_state_position_of(st, 0), p4 = pf_favor_state_position_of(st, 4);
        CHECK_STATUS(pf_favor_state_step_n(st, o, q, k, v, tri, 3, stat), PF_ENONFINITE);
        CHECK(stat[0] == PF_ENONFINITE && stat[1] == PF_ENONFINITE && stat[2] == PF_OK,
              "statuses %d %d %d", stat[0], stat[1], stat[2]);
        CHECK(pf_favor_state_position_of(st, 0) == p0 && pf_favor_state_position_of(st, 4) == p4 &&
                  pf_favor_state_position_of(st, 5) == L + 1,
              "failed sequences moved, or the good one did not");
        int nz = 0;
        for (int i = 0; i < 2 * H * dv; i++) nz += o[i] != 0.0f;
        CHECK(nz == 0, "the refused sequences' rows are not zeros (%d)", nz);
        /* refused calls step nothing */
        int32_t dup[2] = {1, 1}, out_of_range[2] = {1, 16}, neg[1] = {-1};
        const int64_t p1 = pf_favor_state_position_of(st, 1);
        CHECK_STATUS(pf_favor_state_step_n(st, o, q, k, v, dup, 2, NULL), PF_EINVAL);
        CHECK_STATUS(pf_favor_state_step_n(st, o, q, k, v, out_of_range, 2, NULL), PF_EINVAL);
        CHECK_STATUS(pf_favor_state_step_n(st, o, q, k, v, neg, 1, NULL), PF_EINVAL);
        CHECK_STATUS(pf_favor_state_step_n(st, o, q, k, v, NULL, 0, NULL), PF_EINVAL);
        CHECK_STATUS(pf_favor_state_step_n(st, o, q, k, v, NULL, N + 1, NULL), PF_EINVAL);
        CHECK_STATUS(pf_favor_state_step_n(st, q, q, k, v, NULL, 1, NULL), PF_EINVAL); /* alias */
        CHECK_STATUS(pf_favor_state_step_n(NULL, o, q, k, v, NULL, 1, NULL), PF_EINVAL);
        CHECK(pf_favor_state_position_of(st, 1) == p1, "a refused call stepped sequence 1");
        CHECK_STATUS(pf_favor_state_copy_seq(st, 0, N), PF_EINVAL);
        CHECK_STATUS(pf_favor_state_reset_seq(st, -1), PF_EINVAL);
        CHECK(pf_favor_state_position_of(st, N) == -1, "position of a bad sequence");
        CHECK_STATUS(pf_favor_state_create_n(&(pf_favor_state *){NULL}, 0, H, d, dv, 0, &f),
                     PF_EINVAL);
        free(q);
        free(k);
        free(v);
        free(o);
        pf_favor_state_free(st);
    }
    for (int s = 0; s < N; s++) problem_free(&ps[s]);
}

/* 9. Prefill: a prompt by the chunked pass into a state, then decoding. Decoding after it is
 * within float rounding of stepping every token (the sums associate by chunks, not tokens), and
 * prefills cut at multiples of C from position 0 give the bits of one prefill of them all; a
 * prefill of sequence 2 of a state of several gives the bits of a one-sequence state's. */
static void test_prefill(void) {
    const int H = 4, L = 70, d = 16, dv = 8, m = 32, C = 16;
    problem p = problem_make(H, L, d, dv, m, 4711);
    pf_favor_opts f = favor_of(&p, PF_KERNEL_POSITIVE, C);
    const int one[1] = {1};
    pf_favor_state *st = NULL;
    CHECK_STATUS(pf_favor_state_create(&st, H, d, dv, 0.0f, &f), PF_OK);
    if (!st) return;
    CHECK_STATUS(stream(&p, st, one, 1), PF_OK); /* token by token */
    memcpy(p.full, p.out, sizeof(float) * nout(&p));
    pf_favor_state_reset(st);
    const int prompt[2] = {53, 1}; /* a 53-token prompt, then decoding */
    CHECK_STATUS(stream(&p, st, prompt, 2), PF_OK);
    const double e = rel_err(p.out, p.full, nout(&p));
    CHECK(e <= 1e-6, "prefill then decoding vs token by token: rel err %.3g", e);
    float *whole = xmalloc(sizeof(float) * nout(&p));
    memcpy(whole, p.out, sizeof(float) * nout(&p));
    pf_favor_state_reset(st);
    const int cut[4] = {32, 16, 5, 1}; /* 53 in pieces that end at multiples of C, then 1s */
    CHECK_STATUS(stream(&p, st, cut, 4), PF_OK);
    CHECK(memcmp(whole, p.out, sizeof(float) * 53 * dv) == 0,
          "prefills of 32 + 16 + 5 differ from one of 53");
    pf_favor_state_free(st);
    /* sequence 2 of 3 */
    pf_favor_state *sn = NULL;
    CHECK_STATUS(pf_favor_state_create_n(&sn, 3, H, d, dv, 0.0f, &f), PF_OK);
    if (sn) {
        gather(p.q, p.Q, H, L, d, 0, 53, 0);
        gather(p.k, p.K, H, L, d, 0, 53, 0);
        gather(p.v, p.V, H, L, dv, 0, 53, 0);
        CHECK_STATUS(pf_favor_state_prefill(sn, 2, p.o, p.q, p.k, p.v, 53), PF_OK);
        int bad = 0;
        for (int h = 0; h < H; h++)
            bad += memcmp(p.o + (size_t)h * 53 * dv, whole + (size_t)h * L * dv,
                          sizeof(float) * 53 * dv) != 0;
        CHECK(bad == 0, "prefill of sequence 2 differs from a one-sequence state's");
        CHECK(pf_favor_state_position_of(sn, 2) == 53 && pf_favor_state_position_of(sn, 0) == 0,
              "positions after a prefill of sequence 2");
        CHECK_STATUS(pf_favor_state_prefill(sn, 3, p.o, p.q, p.k, p.v, 53), PF_EINVAL);
        CHECK_STATUS(pf_favor_state_prefill(sn, 0, p.o, p.q, p.k, p.v, 0), PF_EINVAL);
        pf_favor_state_free(sn);
    }
    free(whole);
    problem_free(&p);
}

/* 10. Snapshots: a saved sequence restored (into the same state later, or another state with the
 * same W) continues with the bits of the original; one of another W, map or shape, truncated,
 * corrupted, of another version or not a snapshot at all is refused with a message, the target
 * unchanged; files are written atomically and a failed write leaves an existing file as it was. */
static void test_snapshots(void) {
    const int H = 3, L = 40, d = 16, dv = 8, m = 32;
    problem p = problem_make(H, L, d, dv, m, 31337);
    pf_favor_opts f = favor_of(&p, PF_KERNEL_POSITIVE, 16);
    pf_favor_state *a = NULL, *b = NULL;
    CHECK_STATUS(pf_favor_state_create(&a, H, d, dv, 0.0f, &f), PF_OK);
    CHECK_STATUS(pf_favor_state_create_n(&b, 2, H, d, dv, 0.0f, &f), PF_OK);
    if (!a || !b) return;
    const int steps[3] = {7, 1, 1}; /* a prefill and decoding: something pending at the save */
    float *o2 = xmalloc(sizeof(float) * H * dv), *o3 = xmalloc(sizeof(float) * H * dv);
    for (int t = 0; t < 20;) {
        const int n = steps[t == 0 ? 0 : 1];
        gather(p.q, p.Q, H, L, d, t, n, 0);
        gather(p.k, p.K, H, L, d, t, n, 0);
        gather(p.v, p.V, H, L, dv, t, n, 0);
        CHECK_STATUS(pf_favor_state_step(a, p.o, p.q, p.k, p.v, n), PF_OK);
        t += n;
    }
    const size_t nb = pf_favor_state_snapshot_bytes(a);
    CHECK(nb == pf_favor_state_snapshot_bytes(b) && nb > (size_t)H * m * (dv + 1) * 4,
          "snapshot bytes %zu", nb);
    unsigned char *snap = xmalloc(nb + 1), *bad = xmalloc(nb + 1);
    CHECK_STATUS(pf_favor_state_save(a, 0, snap, nb), PF_OK);
    CHECK_STATUS(pf_favor_state_save(a, 0, snap, nb - 1), PF_EINVAL);
    char msg[256];
    CHECK_STATUS(pf_favor_state_load(b, 1, snap, nb, msg, sizeof msg), PF_OK);
    CHECK(pf_favor_state_position_of(b, 1) == 20, "restored position %lld",
          (long long)pf_favor_state_position_of(b, 1));
    /* both continue with the same tokens: the same bits; then a rolls back and repeats */
    int32_t seq1[1] = {1};
    int differ = 0;
    for (int t = 20; t < 30; t++) {
        gather(p.q, p.Q, H, L, d, t, 1, 0);
        gather(p.k, p.K, H, L, d, t, 1, 0);
        gather(p.v, p.V, H, L, dv, t, 1, 0);
        CHECK_STATUS(pf_favor_state_step(a, p.o, p.q, p.k, p.v, 1), PF_OK);
        CHECK_STATUS(pf_favor_state_step_n(b, o2, p.q, p.k, p.v, seq1, 1, NULL), PF_OK);
        differ += memcmp(p.o, o2, sizeof(float) * H * dv) != 0;
        if (t == 20) memcpy(o3, p.o, sizeof(float) * H * dv);
    }
    CHECK(differ == 0, "a restored sequence differs from the saved one in %d steps", differ);
    CHECK_STATUS(pf_favor_state_load(a, 0, snap, nb, NULL, 0), PF_OK); /* rollback */
    gather(p.q, p.Q, H, L, d, 20, 1, 0);
    gather(p.k, p.K, H, L, d, 20, 1, 0);
    gather(p.v, p.V, H, L, dv, 20, 1, 0);
    CHECK_STATUS(pf_favor_state_step(a, p.o, p.q, p.k, p.v, 1), PF_OK);
    CHECK(memcmp(p.o, o3, sizeof(float) * H * dv) == 0, "a rollback does not repeat the token");
    /* refused: each leaves b's sequence 0 empty and its sequence 1 where it was */
    const int64_t before = pf_favor_state_position_of(b, 1);
    struct {
        const char *what, *needle;
        size_t at, len;
        unsigned char value;
        pf_status want;
    } cases[] = {{"truncated", "bytes", 0, nb - 1, 0, PF_EFORMAT},
                 {"extended", "bytes", 0, nb + 1, 0, PF_EFORMAT},
                 {"not a snapshot", "not a performer state", 0, nb, 'X', PF_EFORMAT},
                 {"another version", "version", 8, nb, 9, PF_EFORMAT},
                 {"corrupted", "CRC", nb / 2, nb, 0x55, PF_EFORMAT},
                 {"another H", "H=", 16, nb, 5, PF_EINVAL},
                 {"another map", "feature map", 32, nb, PF_KERNEL_RELU, PF_EINVAL},
                 {"another W", "another W", 36, nb, 0x42, PF_EINVAL}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memcpy(bad, snap, nb);
        bad[nb] = 0;
        if (cases[c].value) bad[cases[c].at] ^= cases[c].value;
        msg[0] = 0;
        CHECK_STATUS(pf_favor_state_load(b, 1, bad, cases[c].len, msg, sizeof msg), cases[c].want);
        CHECK(strstr(msg, cases[c].needle) != NULL, "%s: message \"%s\"", cases[c].what, msg);
        CHECK(pf_favor_state_position_of(b, 1) == before, "%s: the sequence moved", cases[c].what);
    }
    /* another W, made honestly: a state of another draw refuses the snapshot */
    pf_favor_opts g = f;
    float *W2 = xmalloc(sizeof(float) * H * m * d);
    memcpy(W2, p.W, sizeof(float) * H * m * d);
    W2[7] = nextafterf(W2[7], 1.0f);
    g.W = W2;
    pf_favor_state *c2 = NULL;
    CHECK_STATUS(pf_favor_state_create(&c2, H, d, dv, 0.0f, &g), PF_OK);
    if (c2) {
        CHECK_STATUS(pf_favor_state_load(c2, 0, snap, nb, msg, sizeof msg), PF_EINVAL);
        CHECK(strstr(msg, "another W") != NULL, "W one ulp apart: \"%s\"", msg);
        CHECK(pf_favor_state_position(c2) == 0, "a refused snapshot moved the state");
    }
    pf_favor_state_free(c2);
    free(W2);
    /* files */
    char path[128], dir[64];
    snprintf(dir, sizeof dir, "/tmp/pf_snap_%d", (int)getpid());
    CHECK(mkdir(dir, 0700) == 0, "mkdir %s", dir);
    snprintf(path, sizeof path, "%s/s.pfstate", dir);
    CHECK_STATUS(pf_favor_state_save_file(b, 1, path, msg, sizeof msg), PF_OK);
    CHECK_STATUS(pf_favor_state_load_file(a, 0, path, msg, sizeof msg), PF_OK);
    CHECK(pf_favor_state_position(a) == pf_favor_state_position_of(b, 1), "file round trip");
    FILE *fp = fopen(path, "r+b");
    if (fp) {
        CHECK(ftruncate(fileno(fp), (off_t)nb - 3) == 0, "truncate");
        fclose(fp);
    }
    CHECK_STATUS(pf_favor_state_load_file(a, 0, path, msg, sizeof msg), PF_EFORMAT);
    CHECK(strstr(msg, path) != NULL && strstr(msg, "truncated") != NULL, "truncated file: \"%s\"",
          msg);
    CHECK_STATUS(pf_favor_state_load_file(a, 0, dir, msg, sizeof msg), PF_EIO);
    /* a failed save (into a folder that is not there) writes nothing; one over a folder too */
    char nowhere[96];
    snprintf(nowhere, sizeof nowhere, "%s/none/s.pfstate", dir);
    CHECK_STATUS(pf_favor_state_save_file(b, 1, nowhere, msg, sizeof msg), PF_EIO);
    CHECK_STATUS(pf_favor_state_save_file(b, 1, dir, msg, sizeof msg), PF_EIO);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (size_t)sb.st_size == nb - 3,
          "a failed save changed the existing file");
    unlink(path);
    rmdir(dir);
    free(snap);
    free(bad);
    free(o2);
    free(o3);
    pf_favor_state_free(a);
    pf_favor_state_free(b);
    problem_free(&p);
}

int main(void) {
    test_against_full_pass(32);
    test_against_full_pass(74);
    test_decode_path();
    test_failed_steps();
    test_many_sequences();
    test_prefill();
    test_snapshots();
    test_long_sequences();
    test_large_norms();
    test_copy_threads_scale();
    test_errors();
    TEST_MAIN_END();
}
