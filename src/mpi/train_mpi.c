/* train_mpi.c: the language model trained across MPI ranks (performer_mpi.h, pf_mpi_trainer).
 *
 * A user of the public headers: the model's own pf_model_loss_sum, pf_model_backward_total,
 * pf_model_gradients and, for sequence parallelism, pf_model_set_parallel, whose attention
 * callbacks are pf_mpi_attn_favor and its backward on the trainer's communicator.
 *
 * As in performer_mpi.c, every call runs the same collectives on every rank whatever happens:
 * a rank with bad arguments or a failed computation still takes part, and the worst status is
 * agreed on, so no rank waits for one that gave up. Sums that must be the same bits on every
 * rank are never MPI reductions (whose order the implementation picks): the ranks gather the
 * terms and add them in rank order. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "performer_mpi.h"

struct pf_mpi_trainer {
    pf_model *model;
    pf_mpi_parallel kind;
    MPI_Comm comm;
    int rank, size;
    int64_t total;    /* counted positions of every rank in the last forward; -1: none */
    pf_mpi_info *acc; /* the current call's info: the attention callbacks add to it */
    double *table;    /* (size, 3): every rank's (status, a, b), gathered */
};

static void info_start(pf_mpi_info *info) {
    memset(info, 0, sizeof *info);
    info->failed_rank = -1;
}

static void info_add(pf_mpi_info *to, const pf_mpi_info *from) {
    to->bytes_sent += from->bytes_sent;
    to->bytes_received += from->bytes_received;
    to->messages += from->messages;
    to->comm_seconds += from->comm_seconds;
    if (from->message[0] && !to->message[0]) {
        memcpy(to->message, from->message, sizeof to->message);
        to->failed_rank = from->failed_rank;
    }
}

static void say(pf_mpi_info *info, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(info->message, sizeof info->message, fmt, ap);
    va_end(ap);
}

/* Every rank's (status, a, b) gathered, so that each reads the same table. The worst status
 * (the lowest rank on ties) is returned and named in info; *sa and *sb (if not NULL) receive the
 * sums of a and b in rank order. */
static pf_status gather3(pf_mpi_trainer *t, pf_status mine, double a, double b, double *sa,
                         double *sb, pf_mpi_info *info) {
    double in[3] = {(double)mine, a, b};
    const double t0 = MPI_Wtime();
    int rc = MPI_Allgather(in, 3, MPI_DOUBLE, t->table, 3, MPI_DOUBLE, t->comm);
    info->comm_seconds += MPI_Wtime() - t0;
    info->bytes_sent += sizeof in;
    info->bytes_received += sizeof in * (size_t)(t->size - 1);
    info->messages += 2;
    pf_status worst = PF_OK;
    int who = -1;
    double ra = 0, rb = 0;
    if (rc != MPI_SUCCESS) {
        worst = PF_EIO; /* (MPI's default error handler aborts before this) */
    } else {
        for (int p = 0; p < t->size; p++) {
            pf_status s = (pf_status)(int)t->table[3 * p];
            if (s > worst) worst = s, who = p;
            ra += t->table[3 * p + 1];
            rb += t->table[3 * p + 2];
        }
    }
    if (worst != PF_OK && !info->message[0]) {
        if (who >= 0)
            say(info, "rank %d: %s", who, pf_status_str(worst));
        else
            say(info, "%s", pf_status_str(worst));
        info->failed_rank = who;
    }
    if (sa) *sa = ra;
    if (sb) *sb = rb;
    return worst;
}

/* ---- the sequence-parallel callbacks of the model ----------------------------------------- */

static pf_status cb_agree(void *ctx, pf_status st) {
    pf_mpi_trainer *t = ctx;
    return gather3(t, st, 0, 0, NULL, NULL, t->acc);
}

static pf_status cb_forward(void *ctx, float *out, const float *Q, const float *K, const float *V,
                            const pf_shape *shape, const pf_attn_opts *opts,
                            const pf_favor_opts *favor) {
    pf_mpi_trainer *t = ctx;
    pf_mpi_info one;
    pf_status st = pf_mpi_attn_favor(out, Q, K, V, shape, opts, favor, t->comm, &one);
    info_add(t->acc, &one);
    return st;
}

static pf_status cb_backward(void *ctx, float *dQ, float *dK, float *dV, const float *dout,
                             const float *Q, const float *K, const float *V, const float *out,
                             const pf_shape *shape, const pf_attn_opts *opts,
                             const pf_favor_opts *favor) {
    pf_mpi_trainer *t = ctx;
    pf_mpi_info one;
    pf_status st = pf_mpi_attn_favor_backward(dQ, dK, dV, dout, Q, K, V, out, shape, opts, favor,
                                              t->comm, &one);
    info_add(t->acc, &one);
    return st;
}

/* ---- the trainer ---------------------------------------------------------------------------- */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * UINT64_C(0x100000001b3);
    return h;
}

pf_status pf_mpi_trainer_create(pf_mpi_trainer **trainer, pf_model *model, pf_mpi_parallel kind,
                                MPI_Comm comm, pf_mpi_info *info) {
    pf_mpi_info own;
    if (!info) info = &own;
    info_start(info);
    if (!trainer) return PF_EINVAL; /* (not collective: nothing to agree with) */
    *trainer = NULL;
    int size = 1;
    MPI_Comm_size(comm, &size);
    pf_mpi_trainer *t = calloc(1, sizeof *t);
    double *table = malloc(sizeof(double) * 3 * (size_t)size);
    /* every rank learns whether every rank has its trainer before anything else is collective */
    int bad = !t || !table, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm);
    if (any || MPI_Comm_dup(comm, &t->comm) != MPI_SUCCESS) {
        free(t);
        free(table);
        say(info, "a rank is out of memory");
        return PF_ENOMEM;
    }
    MPI_Comm_rank(t->comm, &t->rank);
    t->size = size;
    t->table = table;
    t->model = model;
    t->kind = kind;
    t->total = -1;

    /* this rank's verdict, and what the ranks must share: the kind, the configuration, the
     * step and the parameters themselves (a hash: the same model, not merely the same shape) */
    pf_status st = PF_OK;
    char why[sizeof info->message] = "";
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    if (!model || (kind != PF_MPI_DATA && kind != PF_MPI_SEQUENCE)) {
        st = PF_EINVAL;
        snprintf(why, sizeof why, "%s", !model ? "no model" : "unknown kind of parallelism");
    } else {
        const pf_model_config c = pf_model_get_config(model);
        if (c.attention == PF_LM_FAVORPP) {
            st = PF_ENOTSUP;
            snprintf(why, sizeof why, "FAVOR++ does not train across ranks: its running "
                                      "statistic of q and k would be each rank's own");
        } else if (kind == PF_MPI_SEQUENCE && c.attention != PF_LM_FAVOR) {
            st = PF_ENOTSUP;
            snprintf(why, sizeof why, "sequence parallelism needs FAVOR attention: exact "
                                      "and local attention's queries need keys of other "
                                      "slices");
        }
        const int64_t step = pf_model_steps(model);
        size_t n = 0;
        const float *p = pf_model_parameters(model, &n);
        const int fields[] = {c.context, c.layers, c.d_model, c.heads, (int)c.attention,
                              (int)c.positions, (int)c.kernel, c.features, c.redraw, (int)kind,
                              c.window};
        h = fnv1a(h, fields, sizeof fields);
        h = fnv1a(h, &c.seed, sizeof c.seed);
        h = fnv1a(h, &c.w_seed, sizeof c.w_seed);
        h = fnv1a(h, &step, sizeof step);
        h = fnv1a(h, p, sizeof(float) * n);
    }
    /* (the 64-bit hash in two halves, each exact in a double) */
    pf_status worst = gather3(t, st, (double)(h >> 32), (double)(h & 0xffffffffu), NULL, NULL,
                              info);
    if (worst != PF_OK && why[0]) snprintf(info->message, sizeof info->message, "%s", why);
    if (worst == PF_OK) {
        for (int p = 1; p < t->size; p++)
            if (t->table[3 * p + 1] != t->table[1] || t->table[3 * p + 2] != t->table[2]) {
                worst = PF_EINVAL;
                say(info, "rank %d's model differs from rank 0's (configuration, step, weights "
                          "or kind of parallelism)",
                    p);
                info->failed_rank = p;
                break;
            }
    }
    if (worst == PF_OK && kind == PF_MPI_SEQUENCE) {
        pf_model_parallel par = {.position = 0, .ctx = t, .agree = cb_agree,
                                 .attn_forward = cb_forward, .attn_backward = cb_backward};
        worst = pf_model_set_parallel(model, &par); /* (checked above: the same everywhere) */
    }
    if (worst != PF_OK) {
        MPI_Comm_free(&t->comm);
        free(t->table);
        free(t);
        return worst;
    }
    *trainer = t;
    return PF_OK;
}

void pf_mpi_trainer_free(pf_mpi_trainer *t) {
    if (!t) return;
    if (t->kind == PF_MPI_SEQUENCE) pf_model_set_parallel(t->model, NULL);
    MPI_Comm_free(&t->comm);
    free(t->table);
    free(t);
}

pf_status pf_mpi_trainer_share(const pf_mpi_trainer *t, int B, int T, int *b0, int *nb, int *t0,
                               int *nt) {
    if (!t || !b0 || !nb || !t0 || !nt || B < 1 || T < 1) return PF_EINVAL;
    const int n = t->kind == PF_MPI_DATA ? B : T;
    if (n < t->size) return PF_EINVAL;
    const int lo = (int)((int64_t)n * t->rank / t->size);
    const int hi = (int)((int64_t)n * (t->rank + 1) / t->size);
    if (t->kind == PF_MPI_DATA) {
        *b0 = lo, *nb = hi - lo, *t0 = 0, *nt = T;
    } else {
        *b0 = 0, *nb = B, *t0 = lo, *nt = hi - lo;
    }
    return PF_OK;
}

pf_status pf_mpi_trainer_forward(pf_mpi_trainer *t, float *loss, float *logits,
                                 const int32_t *tokens, const int32_t *targets, int B, int T,
                                 pf_mpi_info *info) {
    pf_mpi_info own;
    if (!info) info = &own;
    info_start(info);
    if (!t) return PF_EINVAL;
    t->acc = info;
    t->total = -1;
    int b0, nb, t0, nt;
    pf_status st = pf_mpi_trainer_share(t, B, T, &b0, &nb, &t0, &nt);
    if (st == PF_OK && (!tokens || (loss && !targets))) st = PF_EINVAL;
    /* the arguments, agreed on before the model's forward (which, sequence parallel, talks) */
    st = gather3(t, st, 0, 0, NULL, NULL, info);
    if (st == PF_OK && t->kind == PF_MPI_SEQUENCE) {
        pf_model_parallel par = {.position = t0, .ctx = t, .agree = cb_agree,
                                 .attn_forward = cb_forward, .attn_backward = cb_backward};
        st = pf_model_set_parallel(t->model, &par); /* (fails alike on every rank) */
    }
    if (st != PF_OK) {
        t->acc = NULL;
        return st;
    }
    float mine = 0;
    st = pf_model_forward(t->model, targets ? &mine : NULL, logits, tokens, targets, nb, nt);
    /* (PF_ENONFINITE: the loss only, after every collective; its sum still counts) */
    double sum = 0;
    int64_t counted = 0;
    if (targets && (st == PF_OK || st == PF_ENONFINITE) &&
        pf_model_loss_sum(t->model, &sum, &counted) != PF_OK)
        sum = NAN, counted = 0;
    double gsum = 0, gcount = 0;
    st = gather3(t, st, sum, (double)counted, &gsum, &gcount, info);
    t->acc = NULL;
    if (targets && st == PF_OK) {
        t->total = (int64_t)gcount;
        float mean = gcount > 0 ? (float)(gsum / gcount) : 0.0f;
        if (loss) *loss = mean;
        if (!isfinite(mean)) st = PF_ENONFINITE;
    }
    return st;
}

/* The sum of every rank's x (n floats) in rank order, on every rank: rank j sums block j of x
 * (the elements [n j / N, n (j + 1) / N)) from every rank in rank order, in float64, then every
 * rank gathers the blocks. A piece at a time, so counts fit an int and memory stays bounded. */
static pf_status sum_ranks(pf_mpi_trainer *t, float *x, size_t n, int mine_ok, pf_mpi_info *info) {
    const int N = t->size;
    const size_t piece_max = (size_t)1 << 22;
    float *recv = malloc(sizeof(float) * (piece_max / (size_t)N + 1) * (size_t)N);
    int *cnt = malloc(sizeof(int) * 4 * (size_t)N);
    pf_status st = gather3(t, recv && cnt && mine_ok ? PF_OK : (mine_ok ? PF_ENOMEM : PF_EINVAL),
                           0, 0, NULL, NULL, info);
    for (size_t at = 0; st == PF_OK && at < n; at += piece_max) {
        const size_t len = n - at < piece_max ? n - at : piece_max;
        int *scnt = cnt, *sdis = cnt + N, *rcnt = cnt + 2 * N, *rdis = cnt + 3 * N;
        for (int j = 0; j < N; j++) {
            size_t lo = len * (size_t)j / (size_t)N, hi = len * (size_t)(j + 1) / (size_t)N;
            scnt[j] = (int)(hi - lo);
            sdis[j] = (int)lo;
        }
        const int mine = scnt[t->rank];
        for (int j = 0; j < N; j++) rcnt[j] = mine, rdis[j] = j * mine;
        const double t0 = MPI_Wtime();
        int rc = MPI_Alltoallv(x + at, scnt, sdis, MPI_FLOAT, recv, rcnt, rdis, MPI_FLOAT,
                               t->comm);
        if (rc == MPI_SUCCESS) {
            float *blk = x + at + sdis[t->rank];
            for (int i = 0; i < mine; i++) {
                double s = 0;
                for (int j = 0; j < N; j++) s += recv[(size_t)j * mine + i];
                blk[i] = (float)s;
            }
            rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, x + at, scnt, sdis, MPI_FLOAT,
                                t->comm);
        }
        info->comm_seconds += MPI_Wtime() - t0;
        const uint64_t moved = sizeof(float) * (len - (size_t)mine);
        info->bytes_sent += 2 * moved;
        info->bytes_received += 2 * moved;
        info->messages += 4 * (uint64_t)(N - 1);
        if (rc != MPI_SUCCESS) st = PF_EIO; /* (MPI's default handler aborts before this) */
    }
    free(recv);
    free(cnt);
    return st;
}

pf_status pf_mpi_trainer_backward(pf_mpi_trainer *t, pf_mpi_info *info) {
    pf_mpi_info own;
    if (!info) info = &own;
    info_start(info);
    if (!t) return PF_EINVAL;
    t->acc = info;
    /* (sequence parallel: the model's backward agrees on its start itself) */
    pf_status st = t->total < 0 ? PF_EINVAL : PF_OK;
    if (t->kind == PF_MPI_DATA) st = gather3(t, st, 0, 0, NULL, NULL, info);
    if (st == PF_OK || t->kind == PF_MPI_SEQUENCE)
        st = pf_model_backward_total(t->model, t->total < 0 ? 0 : t->total);
    /* data parallel: the backward ran alone, so agree on it; then sum (both kinds) */
    size_t n = 0;
    float *g = pf_model_gradients(t->model, &n);
    if (t->kind == PF_MPI_SEQUENCE && st != PF_OK) {
        t->acc = NULL;
        return st; /* (agreed inside: every rank returns here) */
    }
    st = sum_ranks(t, g, n, st == PF_OK && g, info);
    t->acc = NULL;
    return st;
}

pf_status pf_mpi_sum(double *x, int n, MPI_Comm comm) {
    int size;
    if (MPI_Comm_size(comm, &size) != MPI_SUCCESS) return PF_EIO;
    double *all = n > 0 ? malloc(sizeof(double) * (size_t)n * (size_t)size) : NULL;
    /* (every rank learns whether every rank can take part before the data moves) */
    int bad = n < 0 || (n > 0 && !x) ? 2 : n > 0 && !all, any = 0;
    if (MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS) any = 3;
    pf_status st = any == 0 ? PF_OK : any == 1 ? PF_ENOMEM : any == 2 ? PF_EINVAL : PF_EIO;
    if (st == PF_OK && n > 0) {
        if (MPI_Allgather(x, n, MPI_DOUBLE, all, n, MPI_DOUBLE, comm) != MPI_SUCCESS) {
            st = PF_EIO;
        } else {
            for (int i = 0; i < n; i++) {
                double s = 0;
                for (int p = 0; p < size; p++) s += all[(size_t)p * n + i];
                x[i] = s;
            }
        }
    }
    free(all);
    return st;
}
