/* performer-mpi: `performer attn`'s FAVOR+ with the sequence cut across MPI ranks.
 *
 *   mpirun -np N performer-mpi attn --q Q.npy --k K.npy --v V.npy --out O.npy [--causal]
 *       [--kernel K] [--oprf-a A] [--features M] [--proj P] [--norm N] [--seed S] [--scale S]
 *       [--eps E] [--chunk C] [--w W.npy] [--key-lengths LENS.npy] [--threads T]
 *       [--grad-out DO.npy --grad-prefix P]
 *
 * The flags mean what they mean to `performer attn --method favor` (the same W from the same
 * seed), and the files written are the same: O.npy and, with gradients, P.dq.npy, P.dk.npy,
 * P.dv.npy, equal to one process's to float rounding (one rank: the same bytes). Rank p takes
 * rows [L p / N, L (p+1) / N) of the queries and of the keys (inputs are mapped, so a rank reads
 * its own pages), runs pf_mpi_attn_favor (and its backward), and rank 0 gathers the rows and
 * writes each file atomically. A separate program, so that `performer` itself never needs MPI.
 *
 * Every rank checks its files and arguments and the ranks agree before any call that needs all
 * of them: a bad input gives every rank a message and exit status 1 (2: bad command line),
 * never a hang. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "performer_mpi.h"

static int rank, nranks;

/* The worst of every rank's exit code (0, 1 or 2): all ranks leave together. */
static int agree(int rc) {
    int all = rc;
    MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return all;
}

static int fail(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "performer-mpi attn (rank %d): ", rank);
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    return 1;
}

typedef struct cfg {
    const char *q, *k, *v, *out, *w, *lens, *gout, *gprefix;
    int causal, m, chunk, threads, a_given;
    pf_kernel kernel;
    pf_proj_kind proj;
    pf_norm_kind norm;
    unsigned long long seed;
    double scale, eps, a;
} cfg;

static int parse(cfg *c, int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "attn") != 0) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np N performer-mpi attn --q Q.npy --k K.npy --v V.npy "
                            "--out O.npy [FAVOR+ flags of performer attn]\n");
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1;
        char *end = NULL;
        if (strcmp(f, "--causal") == 0) {
            c->causal = 1;
            continue;
        }
        if (!v) {
            if (rank == 0) fprintf(stderr, "performer-mpi attn: %s: missing value\n", f);
            return 2;
        }
        if (strcmp(f, "--q") == 0) c->q = v;
        else if (strcmp(f, "--k") == 0) c->k = v;
        else if (strcmp(f, "--v") == 0) c->v = v;
        else if (strcmp(f, "--out") == 0) c->out = v;
        else if (strcmp(f, "--w") == 0) c->w = v;
        else if (strcmp(f, "--key-lengths") == 0) c->lens = v;
        else if (strcmp(f, "--grad-out") == 0) c->gout = v;
        else if (strcmp(f, "--grad-prefix") == 0) c->gprefix = v;
        else if (strcmp(f, "--kernel") == 0) used = pf_kernel_parse(v, &c->kernel) == PF_OK;
        else if (strcmp(f, "--proj") == 0) {
            used = !strcmp(v, "orthogonal") || !strcmp(v, "iid");
            c->proj = strcmp(v, "iid") == 0 ? PF_PROJ_IID : PF_PROJ_ORTHOGONAL;
        } else if (strcmp(f, "--norm") == 0) {
            used = !strcmp(v, "chi") || !strcmp(v, "sqrtd") || !strcmp(v, "qmc");
            c->norm = !strcmp(v, "sqrtd") ? PF_NORM_SQRTD : !strcmp(v, "qmc") ? PF_NORM_QMC
                                                                              : PF_NORM_CHI;
        } else if (strcmp(f, "--features") == 0) c->m = (int)strtol(v, &end, 10);
        else if (strcmp(f, "--chunk") == 0) c->chunk = (int)strtol(v, &end, 10);
        else if (strcmp(f, "--threads") == 0) c->threads = (int)strtol(v, &end, 10);
        else if (strcmp(f, "--seed") == 0) c->seed = strtoull(v, &end, 10);
        else if (strcmp(f, "--scale") == 0) c->scale = strtod(v, &end);
        else if (strcmp(f, "--eps") == 0) c->eps = strtod(v, &end);
        else if (strcmp(f, "--oprf-a") == 0) c->a = strtod(v, &end), c->a_given = 1;
        else {
            if (rank == 0) fprintf(stderr, "performer-mpi attn: unknown flag %s\n", f);
            return 2;
        }
        if (!used || (end && *end)) {
            if (rank == 0) fprintf(stderr, "performer-mpi attn: %s: bad value '%s'\n", f, v);
            return 2;
        }
        i++;
    }
    if (!c->q || !c->k || !c->v || !c->out || (!c->gout != !c->gprefix)) {
        if (rank == 0)
            fprintf(stderr, "performer-mpi attn: --q, --k, --v and --out are required, and "
                            "--grad-out goes with --grad-prefix\n");
        return 2;
    }
    return 0;
}

/* Rows [o, o + n) of each (b, h) block of a (.., L, w) array into dst (.., n, w). */
static void take_rows(float *dst, const float *src, size_t blocks, int L, int w, int o, int n) {
    for (size_t b = 0; b < blocks; b++)
        memcpy(dst + b * (size_t)n * (size_t)w, src + (b * (size_t)L + (size_t)o) * (size_t)w,
               sizeof(float) * (size_t)n * (size_t)w);
}

static void cut(int L, int p, int *o, int *n) {
    *o = (int)((long long)L * p / nranks);
    *n = (int)((long long)L * (p + 1) / nranks) - *o;
}

/* Every rank's rows of a (.., L, w) array to rank 0, into full (.., L, w) there. */
static void gather_rows(float *full, const float *mine, size_t blocks, int L, int w) {
    int o, n;
    cut(L, rank, &o, &n);
    if (rank != 0) {
        MPI_Send(mine, (int)(blocks * (size_t)n * (size_t)w), MPI_FLOAT, 0, 90, MPI_COMM_WORLD);
        return;
    }
    float *buf = malloc(sizeof(float) * blocks * ((size_t)L / nranks + 2) * (size_t)w);
    for (int p = 0; p < nranks; p++) {
        int po, pn;
        cut(L, p, &po, &pn);
        const float *src = mine;
        if (p > 0) {
            MPI_Recv(buf, (int)(blocks * (size_t)pn * (size_t)w), MPI_FLOAT, p, 90, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
            src = buf;
        }
        for (size_t b = 0; b < blocks; b++)
            memcpy(full + (b * (size_t)L + (size_t)po) * (size_t)w, src + b * (size_t)pn * (size_t)w,
                   sizeof(float) * (size_t)pn * (size_t)w);
    }
    free(buf);
}

static int write_npy(const char *path, const pf_array *like, int last, float *data) {
    pf_array a = *like;
    a.data = data;
    a.map_ = NULL;
    a.shape[a.ndim - 1] = last;
    char msg[1024];
    if (pf_npy_write(path, &a, msg, sizeof msg) != PF_OK) return fail("%s%s", msg, "");
    return 0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    cfg c = {.m = 256, .kernel = PF_KERNEL_POSITIVE, .proj = PF_PROJ_ORTHOGONAL,
             .norm = PF_NORM_CHI};
    int rc = agree(parse(&c, argc, argv));
    pf_array q = {0}, k = {0}, v = {0}, w = {0}, lens = {0}, g = {0};
    float *W = NULL, *lq = NULL, *lk = NULL, *lv = NULL, *lo = NULL, *lg = NULL;
    float *ldq = NULL, *ldk = NULL, *ldv = NULL, *full = NULL;
    int32_t *klen = NULL;
    char msg[1024];
    /* 1. the files, on every rank, then agreed on */
    const char *paths[4] = {c.q, c.k, c.v, c.gout};
    pf_array *arr[4] = {&q, &k, &v, &g};
    for (int t = 0; !rc && t < 4; t++) {
        if (!paths[t]) continue;
        if (pf_npy_map(paths[t], arr[t], msg, sizeof msg) != PF_OK) rc = fail("%s%s", msg, "");
        else if (arr[t]->dtype != PF_F32 || arr[t]->ndim < 2 || arr[t]->ndim > 4)
            rc = fail("%s: expected float32 of rank 2 to 4%s", paths[t], "");
    }
    const int r = q.ndim;
    pf_shape s = {0};
    if (!rc) {
        s.B = r == 4 ? (int)q.shape[0] : 1;
        s.H = r >= 3 ? (int)q.shape[r - 3] : 1;
        s.Lq = (int)q.shape[r - 2], s.Lk = (int)k.shape[r - 2];
        s.d = (int)q.shape[r - 1], s.dv = (int)v.shape[r - 1];
        int ok = k.ndim == r && v.ndim == r && k.shape[r - 1] == s.d && v.shape[r - 2] == s.Lk;
        for (int j = 0; ok && j < r - 2; j++) ok = k.shape[j] == q.shape[j] && v.shape[j] == q.shape[j];
        if (g.data) ok = ok && g.ndim == r && g.shape[r - 2] == s.Lq && g.shape[r - 1] == s.dv;
        if (!ok) rc = fail("%s, %s and the others: shapes do not go together", c.q, c.k);
        if (!rc && (s.Lq < nranks || s.Lk < nranks))
            rc = fail("%s: fewer rows than ranks%s", c.q, "");
        if (!rc && c.causal && s.Lq != s.Lk)
            rc = fail("--causal needs as many queries as keys%s%s", "", "");
    }
    if (!rc && c.lens) {
        if (pf_npy_read(c.lens, &lens, msg, sizeof msg) != PF_OK) rc = fail("%s%s", msg, "");
        else if ((lens.dtype != PF_I32 && lens.dtype != PF_I64) || lens.ndim != 1 ||
                 lens.shape[0] != s.B)
            rc = fail("%s: expected int32 or int64 (B,)%s", c.lens, "");
        else {
            klen = malloc(sizeof(int32_t) * (size_t)s.B);
            for (int b = 0; b < s.B; b++)
                klen[b] = lens.dtype == PF_I32 ? ((int32_t *)lens.data)[b]
                                                : (int32_t)((int64_t *)lens.data)[b];
        }
    }
    pf_favor_opts fav = pf_favor_opts_default();
    if (!rc) {
        fav.kernel = c.kernel;
        fav.eps = (float)c.eps;
        fav.chunk = c.chunk;
        fav.oprf_a_given = c.a_given;
        fav.oprf_a = (float)c.a;
        if (c.w) {
            if (pf_npy_map(c.w, &w, msg, sizeof msg) != PF_OK) rc = fail("%s%s", msg, "");
            else if (w.dtype != PF_F32 || (w.ndim != 2 && w.ndim != 3) || w.shape[w.ndim - 1] != s.d)
                rc = fail("%s: expected float32 (m, d) or (H, m, d)%s", c.w, "");
            else {
                fav.W = w.data;
                fav.m = (int)w.shape[w.ndim - 2];
                fav.w_per_head = w.ndim == 3;
            }
        } else if (c.m < 1 || !(W = malloc(sizeof(float) * (size_t)c.m * (size_t)s.d)) ||
                   pf_projection_draw(W, c.m, s.d, c.proj, c.norm, c.seed, 0) != PF_OK) {
            rc = fail("--features: cannot draw W%s%s", "", "");
        } else {
            fav.W = W;
            fav.m = c.m;
        }
    }
    rc = agree(rc);
    /* 2. this rank's rows, the attention, and its gradients */
    pf_attn_opts opts = pf_attn_opts_default();
    opts.causal = c.causal;
    opts.scale = (float)c.scale;
    opts.threads = c.threads;
    opts.key_len = klen;
    int qo = 0, qn = 0, ko = 0, kn = 0;
    const size_t blocks = (size_t)s.B * (size_t)s.H;
    pf_mpi_info info;
    if (!rc) {
        cut(s.Lq, rank, &qo, &qn);
        cut(s.Lk, rank, &ko, &kn);
        pf_shape ls = {s.B, s.H, qn, kn, s.d, s.dv};
        lq = malloc(sizeof(float) * blocks * (size_t)qn * (size_t)s.d);
        lk = malloc(sizeof(float) * blocks * (size_t)kn * (size_t)s.d);
        lv = malloc(sizeof(float) * blocks * (size_t)kn * (size_t)s.dv);
        lo = malloc(sizeof(float) * blocks * (size_t)qn * (size_t)s.dv);
        int nomem = !lq || !lk || !lv || !lo;
        if (!nomem) {
            take_rows(lq, q.data, blocks, s.Lq, s.d, qo, qn);
            take_rows(lk, k.data, blocks, s.Lk, s.d, ko, kn);
            take_rows(lv, v.data, blocks, s.Lk, s.dv, ko, kn);
        }
        if (agree(nomem ? fail("out of memory%s%s", "", "") : 0)) {
            rc = 1;
        } else {
            pf_status st = pf_mpi_attn_favor(lo, lq, lk, lv, &ls, &opts, &fav, MPI_COMM_WORLD, &info);
            if (st != PF_OK) rc = rank == 0 ? fail("FAVOR+ attention failed: %s%s", info.message, "") : 1;
            if (!rc && g.data) {
                lg = malloc(sizeof(float) * blocks * (size_t)qn * (size_t)s.dv);
                ldq = malloc(sizeof(float) * blocks * (size_t)qn * (size_t)s.d);
                ldk = malloc(sizeof(float) * blocks * (size_t)kn * (size_t)s.d);
                ldv = malloc(sizeof(float) * blocks * (size_t)kn * (size_t)s.dv);
                nomem = !lg || !ldq || !ldk || !ldv;
                if (!nomem) take_rows(lg, g.data, blocks, s.Lq, s.dv, qo, qn);
                if (agree(nomem ? fail("out of memory%s%s", "", "") : 0)) {
                    rc = 1;
                } else {
                    st = pf_mpi_attn_favor_backward(ldq, ldk, ldv, lg, lq, lk, lv, lo, &ls, &opts,
                                                    &fav, MPI_COMM_WORLD, &info);
                    if (st != PF_OK)
                        rc = rank == 0 ? fail("the FAVOR+ backward failed: %s%s", info.message, "") : 1;
                }
            }
        }
    }
    /* 3. rank 0 gathers and writes (the same files as one process) */
    if (!rc) {
        size_t most = blocks * (size_t)(s.Lq > s.Lk ? s.Lq : s.Lk) * (size_t)(s.d > s.dv ? s.d : s.dv);
        if (rank == 0 && !(full = malloc(sizeof(float) * most))) rc = fail("out of memory%s%s", "", "");
        rc = agree(rc);
    }
    if (!rc) {
        int wrc = 0;
        gather_rows(full, lo, blocks, s.Lq, s.dv);
        if (rank == 0) wrc = write_npy(c.out, &q, s.dv, full);
        if (g.data) {
            const char *ext[3] = {"dq", "dk", "dv"};
            const pf_array *like[3] = {&q, &k, &v};
            float *part[3] = {ldq, ldk, ldv};
            const int L[3] = {s.Lq, s.Lk, s.Lk}, wd[3] = {s.d, s.d, s.dv};
            for (int t = 0; t < 3; t++) {
                gather_rows(full, part[t], blocks, L[t], wd[t]);
                char path[4096];
                snprintf(path, sizeof path, "%s.%s.npy", c.gprefix, ext[t]);
                if (rank == 0 && !wrc) wrc = write_npy(path, like[t], wd[t], full);
            }
        }
        rc = agree(wrc);
    }
    pf_array_free(&q), pf_array_free(&k), pf_array_free(&v), pf_array_free(&w);
    pf_array_free(&lens), pf_array_free(&g);
    free(W), free(lq), free(lk), free(lv), free(lo), free(lg), free(ldq), free(ldk), free(ldv);
    free(full), free(klen);
    MPI_Finalize();
    return rc;
}
