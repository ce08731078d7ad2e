/* test_mpi_attn: sequence-parallel FAVOR+ (performer_mpi.h) against the single process, run by
 * tests/test_mpi.sh under `mpirun -np N` for N = 1, 2, 3.
 *
 * Every rank makes the whole inputs itself (fixed seeds), computes pf_attn_favor and
 * pf_attn_favor_backward on the whole sequence, and compares its own rows of the parallel
 * results: the same bits at one rank; at several, the normwise relative error over all ranks
 * (summed with MPI) within float rounding, max(1e-6, 4x the single process's own error against
 * float64). Every map, bidirectional (also Lq != Lk, cut differently) and causal, unequal
 * slices, key padding that ends inside a slice. Also: the same bits at 1 and 2 threads; strict
 * causality across ranks (a key changed on the last rank changes no bit on the others); bytes
 * per call that do not grow with L; and the errors: a NaN, a NULL, a bad key length or ranks
 * that disagree (d, W) give every rank the same status and message, never a hang.
 *
 *   test_mpi_attn          all of the above
 *   test_mpi_attn kill     the last rank ends itself with SIGKILL between two calls; the others
 *                          are then in a collective call that can never finish (mpirun must end
 *                          them: tests/test_mpi.sh times it) */
#include <math.h>
#include <signal.h>
#include <string.h>

#include "check.h"
#include "performer_mpi.h"

enum { B = 2, H = 2, D = 16, DV = 8, MF = 32 };

static int rank, nranks;

/* Rank p's rows of a sequence of L: unequal slices (weights 1, 3, 5, 1, ...; salt shifts them). */
static void cut(int L, int p, int salt, int *o, int *n) {
    int w[64], tot = 0, before = 0;
    for (int q = 0; q < nranks; q++) {
        w[q] = 1 + 2 * ((q + salt) % 3);
        tot += w[q];
        if (q < p) before += w[q];
    }
    *o = (int)((long)L * before / tot);
    *n = (int)((long)L * (before + w[p]) / tot) - *o;
}

static void rows(float *dst, const float *src, int L, int w, int o, int n) {
    for (int bh = 0; bh < B * H; bh++)
        memcpy(dst + (size_t)bh * n * w, src + ((size_t)bh * L + o) * w, sizeof(float) * n * w);
}

/* ||a - b||^2 and ||b||^2 of this rank's rows a against rows [o, o + n) of the whole ref. */
static void err_sums(double *e, const float *a, const float *ref, int L, int w, int o, int n) {
    for (int bh = 0; bh < B * H; bh++)
        for (size_t i = 0; i < (size_t)n * w; i++) {
            const double x = a[(size_t)bh * n * w + i], y = ref[((size_t)bh * L + o) * w + i];
            e[0] += (x - y) * (x - y);
            e[1] += y * y;
        }
}

static int same_rows(const float *a, const float *ref, int L, int w, int o, int n) {
    for (int bh = 0; bh < B * H; bh++)
        if (memcmp(a + (size_t)bh * n * w, ref + ((size_t)bh * L + o) * w,
                   sizeof(float) * n * w) != 0)
            return 0;
    return 1;
}

typedef struct cs {
    pf_kernel kernel;
    int causal, Lq, Lk, pad;
} cs;

static void setup_favor(pf_favor_opts *fv, float *W, pf_kernel k, int causal) {
    pf_projection_draw(W, MF, D, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 5, 0);
    *fv = pf_favor_opts_default();
    fv->kernel = k;
    fv->W = W;
    fv->m = MF;
    fv->chunk = 8;
    if (k == PF_KERNEL_RELU) fv->eps = 1e-3f;
    if (k == PF_KERNEL_OPRF && causal) fv->oprf_a_given = 1, fv->oprf_a = -0.05f;
}

static double worst = 0, worst_trig = 0; /* (trig's features change sign: its sums cancel) */

static void one_case(const cs *c) {
    const int Lq = c->Lq, Lk = c->Lk;
    const size_t nq = (size_t)B * H * Lq, nk = (size_t)B * H * Lk;
    float *Q = malloc(4 * nq * D), *K = malloc(4 * nk * D), *V = malloc(4 * nk * DV);
    float *G = malloc(4 * nq * DV), W[MF * D];
    fill_normal(Q, nq * D, 0.7f, 21, 1);
    fill_normal(K, nk * D, 0.7f, 21, 2);
    fill_normal(V, nk * DV, 1.0f, 21, 3);
    fill_normal(G, nq * DV, 1.0f, 21, 4);
    pf_favor_opts fv;
    setup_favor(&fv, W, c->kernel, c->causal);
    int32_t klen[B] = {Lk, Lk - c->pad};
    pf_attn_opts o = pf_attn_opts_default();
    o.causal = c->causal;
    o.key_len = klen;
    pf_shape s = {B, H, Lq, Lk, D, DV};
    /* the single process, and float64 */
    float *ro = malloc(4 * nq * DV), *rq = malloc(4 * nq * D), *rk = malloc(4 * nk * D);
    float *rv = malloc(4 * nk * DV), *fo = malloc(4 * nq * DV), *fq = malloc(4 * nq * D);
    float *fk = malloc(4 * nk * D), *fvv = malloc(4 * nk * DV);
    CHECK_STATUS(pf_attn_favor(ro, Q, K, V, &s, &o, &fv), PF_OK);
    CHECK_STATUS(pf_attn_favor_backward(rq, rk, rv, G, Q, K, V, NULL, &s, &o, &fv), PF_OK);
    CHECK_STATUS(pf_attn_favor_ref(fo, Q, K, V, &s, &o, &fv), PF_OK);
    CHECK_STATUS(pf_attn_favor_backward_ref(fq, fk, fvv, G, Q, K, V, &s, &o, &fv), PF_OK);
    /* this rank's slices */
    int qo, qn, ko, kn;
    cut(Lq, rank, 0, &qo, &qn);
    if (c->causal)
        ko = qo, kn = qn;
    else
        cut(Lk, rank, 1, &ko, &kn);
    pf_shape ls = {B, H, qn, kn, D, DV};
    float *lq = malloc(4 * (size_t)B * H * qn * D), *lk = malloc(4 * (size_t)B * H * kn * D);
    float *lv = malloc(4 * (size_t)B * H * kn * DV), *lg = malloc(4 * (size_t)B * H * qn * DV);
    rows(lq, Q, Lq, D, qo, qn);
    rows(lk, K, Lk, D, ko, kn);
    rows(lv, V, Lk, DV, ko, kn);
    rows(lg, G, Lq, DV, qo, qn);
    float *out[2], *dq = malloc(4 * (size_t)B * H * qn * D), *dk = malloc(4 * (size_t)B * H * kn * D);
    float *dv = malloc(4 * (size_t)B * H * kn * DV);
    pf_mpi_info info;
    for (int t = 0; t < 2; t++) {
        out[t] = malloc(4 * (size_t)B * H * qn * DV);
        pf_attn_opts ot = o;
        ot.threads = t + 1;
        CHECK_STATUS(pf_mpi_attn_favor(out[t], lq, lk, lv, &ls, &ot, &fv, MPI_COMM_WORLD, &info),
                     PF_OK);
    }
    CHECK(memcmp(out[0], out[1], 4 * (size_t)B * H * qn * DV) == 0,
          "%s %s: outputs differ at 1 and 2 threads", pf_kernel_name(c->kernel),
          c->causal ? "causal" : "bidir");
    CHECK_STATUS(pf_mpi_attn_favor_backward(dq, dk, dv, lg, lq, lk, lv, NULL, &ls, &o, &fv,
                                            MPI_COMM_WORLD, &info),
                 PF_OK);
    /* errors over all ranks: [slices vs one][out dq dk dv][num den], [one vs f64] */
    double e[2][4][2] = {{{0}}};
    err_sums(e[0][0], out[0], ro, Lq, DV, qo, qn);
    err_sums(e[0][1], dq, rq, Lq, D, qo, qn);
    err_sums(e[0][2], dk, rk, Lk, D, ko, kn);
    err_sums(e[0][3], dv, rv, Lk, DV, ko, kn);
    err_sums(e[1][0], ro, fo, Lq, DV, 0, Lq);
    err_sums(e[1][1], rq, fq, Lq, D, 0, Lq);
    err_sums(e[1][2], rk, fk, Lk, D, 0, Lk);
    err_sums(e[1][3], rv, fvv, Lk, DV, 0, Lk);
    double tot[8];
    MPI_Allreduce(e[0], tot, 8, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    const int same[4] = {same_rows(out[0], ro, Lq, DV, qo, qn), same_rows(dq, rq, Lq, D, qo, qn),
                         same_rows(dk, rk, Lk, D, ko, kn), same_rows(dv, rv, Lk, DV, ko, kn)};
    const char *what[4] = {"out", "dQ", "dK", "dV"};
    for (int i = 0; i < 4; i++) {
        const double err = sqrt(tot[2 * i] / tot[2 * i + 1]);
        const double e64 = sqrt(e[1][i][0] / e[1][i][1]), tol = fmax(1e-6, 4 * e64);
        if (nranks == 1)
            CHECK(same[i], "%s %s %s: one rank is not the single process's bits",
                  pf_kernel_name(c->kernel), c->causal ? "causal" : "bidir", what[i]);
        else
            CHECK(err <= tol, "%s %s %s: error %.3g > %.3g against the single process",
                  pf_kernel_name(c->kernel), c->causal ? "causal" : "bidir", what[i], err, tol);
        if (c->kernel == PF_KERNEL_TRIG && err > worst_trig) worst_trig = err;
        if (c->kernel != PF_KERNEL_TRIG && err > worst) worst = err;
        if (rank == 0)
            printf("  np %d %-10s %-6s Lq %d Lk %d %-3s rel %.2e (one process vs float64 %.2e)\n",
                   nranks, pf_kernel_name(c->kernel), c->causal ? "causal" : "bidir", Lq, Lk,
                   what[i], err, e64);
    }
    free(Q), free(K), free(V), free(G), free(ro), free(rq), free(rk), free(rv), free(fo);
    free(fq), free(fk), free(fvv), free(lq), free(lk), free(lv), free(lg), free(out[0]);
    free(out[1]), free(dq), free(dk), free(dv);
}

/* A key on the last rank changed: no bit of any other rank's output moves. */
static void strict_causality(void) {
    const int L = 240;
    const size_t n = (size_t)B * H * L;
    float *Q = malloc(4 * n * D), *K = malloc(4 * n * D), *V = malloc(4 * n * DV), W[MF * D];
    fill_normal(Q, n * D, 1.5f, 31, 1);
    fill_normal(K, n * D, 1.5f, 31, 2);
    fill_normal(V, n * DV, 1.0f, 31, 3);
    pf_favor_opts fv;
    setup_favor(&fv, W, PF_KERNEL_POSITIVE, 1);
    pf_attn_opts o = pf_attn_opts_default();
    o.causal = 1;
    int qo, qn;
    cut(L, rank, 0, &qo, &qn);
    pf_shape ls = {B, H, qn, qn, D, DV};
    float *lq = malloc(4 * (size_t)B * H * qn * D), *lk = malloc(4 * (size_t)B * H * qn * D);
    float *lv = malloc(4 * (size_t)B * H * qn * DV), *a = malloc(4 * (size_t)B * H * qn * DV);
    float *b = malloc(4 * (size_t)B * H * qn * DV);
    rows(lq, Q, L, D, qo, qn);
    rows(lk, K, L, D, qo, qn);
    rows(lv, V, L, DV, qo, qn);
    CHECK_STATUS(pf_mpi_attn_favor(a, lq, lk, lv, &ls, &o, &fv, MPI_COMM_WORLD, NULL), PF_OK);
    if (rank == nranks - 1) {
        /* a key with a far larger log factor: it would move every later row's reference */
        for (int k = 0; k < D; k++) lk[(size_t)(qn - 1) * D + k] = 6.0f;
        lv[(size_t)(qn - 1) * DV] = 100.0f;
    }
    CHECK_STATUS(pf_mpi_attn_favor(b, lq, lk, lv, &ls, &o, &fv, MPI_COMM_WORLD, NULL), PF_OK);
    const int same = memcmp(a, b, 4 * (size_t)B * H * qn * DV) == 0;
    if (rank < nranks - 1)
        CHECK(same, "rank %d: a key on the last rank changed this rank's outputs", rank);
    else if (qn > 1 || nranks == 1)
        CHECK(!same, "the changed key changed nothing on its own rank");
    free(Q), free(K), free(V), free(lq), free(lk), free(lv), free(a), free(b);
}

/* Bytes per call against L: the same at every L (states only). */
static void bytes_flat(void) {
    uint64_t bytes[3];
    const int Ls[3] = {64, 512, 4096};
    for (int i = 0; i < 3; i++) {
        const int L = Ls[i];
        int qo, qn;
        cut(L, rank, 0, &qo, &qn);
        const size_t n = (size_t)B * H * qn;
        float *q = malloc(4 * n * D), *k = malloc(4 * n * D), *v = malloc(4 * n * DV);
        float *out = malloc(4 * n * DV), W[MF * D];
        fill_normal(q, n * D, 0.5f, 41, (uint64_t)rank);
        fill_normal(k, n * D, 0.5f, 42, (uint64_t)rank);
        fill_normal(v, n * DV, 1.0f, 43, (uint64_t)rank);
        pf_favor_opts fv;
        setup_favor(&fv, W, PF_KERNEL_POSITIVE, 1);
        pf_attn_opts o = pf_attn_opts_default();
        o.causal = 1;
        pf_shape ls = {B, H, qn, qn, D, DV};
        pf_mpi_info info;
        CHECK_STATUS(pf_mpi_attn_favor(out, q, k, v, &ls, &o, &fv, MPI_COMM_WORLD, &info), PF_OK);
        bytes[i] = info.bytes_sent + info.bytes_received;
        free(q), free(k), free(v), free(out);
    }
    CHECK(bytes[0] == bytes[1] && bytes[1] == bytes[2],
          "bytes per call grow with L: %llu, %llu, %llu", (unsigned long long)bytes[0],
          (unsigned long long)bytes[1], (unsigned long long)bytes[2]);
    if (rank == 0)
        printf("  np %d bytes sent + received by rank 0 per causal call at L = 64, 512, 4096: "
               "%llu, %llu, %llu\n",
               nranks, (unsigned long long)bytes[0], (unsigned long long)bytes[1],
               (unsigned long long)bytes[2]);
}

/* Every rank gets the same status and message; `bad` says which rank spoils its arguments. */
static void one_error(const char *name, int bad, int what, pf_status want) {
    const int L = 60;
    int qo, qn;
    cut(L, rank, 0, &qo, &qn);
    const size_t n = (size_t)B * H * qn;
    float *q = malloc(4 * n * 32), *k = malloc(4 * n * 32), *v = malloc(4 * n * DV);
    float *out = malloc(4 * n * DV), *dq = malloc(4 * n * 32), *dk = malloc(4 * n * 32);
    float *dv = malloc(4 * n * DV), W[MF * 32];
    fill_normal(q, n * 32, 0.5f, 51, (uint64_t)rank);
    fill_normal(k, n * 32, 0.5f, 52, (uint64_t)rank);
    fill_normal(v, n * DV, 1.0f, 53, (uint64_t)rank);
    fill_normal(out, n * DV, 1.0f, 54, (uint64_t)rank); /* (dout of the backward) */
    pf_favor_opts fv;
    setup_favor(&fv, W, PF_KERNEL_POSITIVE, 0);
    pf_attn_opts o = pf_attn_opts_default();
    o.causal = 1;
    pf_shape ls = {B, H, qn, qn, D, DV};
    int32_t kl[B] = {L, L};
    const float *Q = q;
    if (rank == bad) {
        if (what == 0) q[3] = NAN;                    /* a NaN in the queries */
        if (what == 1) { /* disagrees about d, with arguments valid on their own */
            ls.d = 32;
            pf_projection_draw(W, MF, 32, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 5, 0);
        }
        if (what == 2) W[5] += 1.0f;                  /* another W */
        if (what == 3) Q = NULL;                      /* a missing array */
        if (what == 5) k[(size_t)(qn - 1) * D] = INFINITY; /* an Inf in the keys */
    }
    if (what == 4) kl[1] = L + 1, o.key_len = kl; /* beyond the keys of all ranks */
    pf_mpi_info info;
    pf_status st = what == 5 ? pf_mpi_attn_favor_backward(dq, dk, dv, out, Q, k, v, NULL, &ls, &o,
                                                          &fv, MPI_COMM_WORLD, &info)
                             : pf_mpi_attn_favor(out, Q, k, v, &ls, &o, &fv, MPI_COMM_WORLD, &info);
    CHECK(st == want, "%s: rank %d got %s, expected %s", name, rank, pf_status_str(st),
          pf_status_str(want));
    /* the same message on every rank */
    char all[64][200];
    MPI_Allgather(info.message, 200, MPI_CHAR, all, 200, MPI_CHAR, MPI_COMM_WORLD);
    for (int p = 0; p < nranks; p++)
        CHECK(strcmp(all[p], info.message) == 0, "%s: rank %d says \"%s\", rank %d \"%s\"", name,
              rank, info.message, p, all[p]);
    CHECK(info.message[0] != 0, "%s: no message", name);
    if (what != 4) CHECK(info.failed_rank == bad, "%s: failed_rank %d, not %d", name, info.failed_rank, bad);
    if (rank == 0) printf("  np %d %s: every rank: %s (\"%s\")\n", nranks, name, pf_status_str(st), info.message);
    free(q), free(k), free(v), free(out), free(dq), free(dk), free(dv);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (argc > 1 && strcmp(argv[1], "kill") == 0) {
        /* the fault: one call together, then the last rank dies; the others wait in the next */
        strict_causality();
        if (rank == nranks - 1) raise(SIGKILL);
        for (;;) strict_causality();
    }
    const pf_kernel ks[7] = {PF_KERNEL_POSITIVE, PF_KERNEL_HYPERBOLIC, PF_KERNEL_TRIG,
                             PF_KERNEL_RELU,     PF_KERNEL_OPRF,       PF_KERNEL_SDERF,
                             PF_KERNEL_ELU};
    for (int k = 0; k < 7; k++)
        for (int causal = 0; causal < 2; causal++) {
            if (causal && ks[k] == PF_KERNEL_SDERF) continue;
            cs c = {ks[k], causal, 300, causal ? 300 : 217, causal ? 70 : 100};
            one_case(&c);
        }
    strict_causality();
    bytes_flat();
    const int last = nranks - 1;
    one_error("a NaN in the last rank's queries", last, 0, PF_ENONFINITE);
    if (nranks > 1) {
        one_error("the last rank's d differs", last, 1, PF_EINVAL);
        one_error("the last rank's W differs", last, 2, PF_EINVAL);
    }
    one_error("rank 0's Q is NULL", 0, 3, PF_EINVAL);
    one_error("key_len beyond the keys of all ranks", -1, 4, PF_EINVAL);
    one_error("backward: an Inf in the last rank's keys", last, 5, PF_ENONFINITE);
    if (rank == 0)
        printf("  np %d worst relative error against one process: %.3g (trig: %.3g)\n", nranks,
               worst, worst_trig);
    int failed = check_failed_, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank != 0) {
        /* (rank 0 reports; the others only if they failed) */
        MPI_Finalize();
        return failed ? 1 : 0;
    }
    MPI_Finalize();
    printf("  np %d: failures on all ranks: %d\n", nranks, any);
    TEST_MAIN_END();
}
