/* tool_mpi.c: the tool under mpirun (tool_mpi.h) over MPI_COMM_WORLD, compiled by mpicc into
 * performer-mpi only, beside the same objects of the tool's sources as performer's. */
#include "tool_mpi.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "performer_mpi.h"
#include "tool.h"

const int tool_mpi_build = 1;

static int rank_, size_ = 1;
static char held[16384]; /* this rank's messages since the last agreement, a line each */

/* At exit, whichever way the process leaves (return from main, exit after --help): MPI ends on
 * every rank, and messages no agreement printed are printed by their own rank. */
static void at_exit(void) {
    if (held[0]) fputs(held, stderr);
    held[0] = '\0';
    int done = 0, started = 0;
    MPI_Initialized(&started);
    if (started) MPI_Finalized(&done);
    if (started && !done) MPI_Finalize();
}

void tool_mpi_init(int *argc, char ***argv) {
    int provided = 0;
    /* the library's OpenMP threads never call MPI: only the main thread does */
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    atexit(at_exit);
    if (rank_ != 0) {
        fflush(stdout);
        if (!freopen("/dev/null", "w", stdout)) fclose(stdout);
    }
}

int tool_mpi_rank(void) {
    return rank_;
}

int tool_mpi_size(void) {
    return size_;
}

const char *tool_mpi_library(void) {
    static char name[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (MPI_Get_library_version(name, &len) != MPI_SUCCESS) return "MPI";
    name[strcspn(name, ",\n")] = '\0'; /* "Open MPI v4.1.4, package: ..." */
    return name;
}

int tool_mpi_hold(const char *msg) {
    if (size_ < 2) return 0;
    size_t n = strlen(held), room = sizeof(held) - n;
    if (room > 1) snprintf(held + n, room, "%s\n", msg);
    return 1;
}

/* Prints the held lines of rank `from` (already in held), each naming that rank after
 * "performer <cmd>" when `name` is set. */
static void print_held(int from, int name) {
    for (char *line = held; *line;) {
        char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        size_t head = strcspn(line, ":");
        if (name && head < len)
            fprintf(stderr, "%.*s (rank %d of %d)%.*s\n", (int)head, line, from, size_,
                    (int)(len - head), line + head);
        else
            fprintf(stderr, "%.*s\n", (int)len, line);
        line += len + (nl ? 1 : 0);
    }
}

int tool_mpi_agree(int rc) {
    if (size_ < 2) return rc;
    int mine = rc ? rank_ : size_, first = size_;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first == size_) { /* every rank fine: a line one of them held is its own to print */
        if (held[0]) fputs(held, stderr);
        held[0] = '\0';
        return 0;
    }
    int code = rc;
    MPI_Bcast(&code, 1, MPI_INT, first, MPI_COMM_WORLD);
    held[sizeof(held) - 1] = '\0';
    MPI_Bcast(held, (int)sizeof(held), MPI_CHAR, first, MPI_COMM_WORLD);
    /* rank 0 failing too: most often the same message (the same files, the same arguments),
     * so the rank is named only for a failure rank 0 did not have */
    if (rank_ == 0) print_held(first, rc == 0);
    fflush(stderr);
    held[0] = '\0';
    return code;
}

void tool_mpi_min_i64(int64_t *v, int n) {
    if (size_ > 1) MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
}

double tool_mpi_max(double x) {
    double all = x;
    if (size_ > 1) MPI_Allreduce(&x, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return all;
}

/* The rows travel as whole rows (w floats) in slabs (a block's rows of one rank), so that no
 * count passes INT_MAX before the blocks do; rank 0 receives each rank's slabs straight into
 * their places in full (an hvector of blocks slabs, L rows apart). */
int tool_mpi_gather_rows(float *full, const float *mine, size_t blocks, int L, int w) {
    if (blocks > INT_MAX) return -1;
    int o, n, err = MPI_SUCCESS;
    tool_mpi_cut(L, rank_, size_, &o, &n);
    MPI_Datatype row, slab, spread;
    MPI_Type_contiguous(w, MPI_FLOAT, &row);
    if (rank_ != 0) {
        MPI_Type_contiguous(n, row, &slab);
        MPI_Type_commit(&slab);
        err = MPI_Send(mine, (int)blocks, slab, 0, 91, MPI_COMM_WORLD);
        MPI_Type_free(&slab);
    } else {
        const size_t rw = (size_t)n * (size_t)w;
        for (size_t b = 0; b < blocks; b++)
            memcpy(full + (b * (size_t)L + (size_t)o) * (size_t)w, mine + b * rw,
                   sizeof(float) * rw);
        for (int p = 1; p < size_ && err == MPI_SUCCESS; p++) {
            int po, pn;
            tool_mpi_cut(L, p, size_, &po, &pn);
            MPI_Type_contiguous(pn, row, &slab);
            MPI_Type_create_hvector((int)blocks, 1, (MPI_Aint)L * w * (MPI_Aint)sizeof(float), slab,
                                    &spread);
            MPI_Type_commit(&spread);
            err = MPI_Recv(full + (size_t)po * (size_t)w, 1, spread, p, 91, MPI_COMM_WORLD,
                           MPI_STATUS_IGNORE);
            MPI_Type_free(&spread);
            MPI_Type_free(&slab);
        }
    }
    MPI_Type_free(&row);
    return err == MPI_SUCCESS ? 0 : -1;
}

pf_status tool_mpi_attn_favor(float *out, const float *Q, const float *K, const float *V,
                              const pf_shape *shape, const pf_attn_opts *opts,
                              const pf_favor_opts *favor, char *msg, size_t cap) {
    pf_mpi_info info;
    pf_status st = pf_mpi_attn_favor(out, Q, K, V, shape, opts, favor, MPI_COMM_WORLD, &info);
    snprintf(msg, cap, "%s", st == PF_OK ? "" : info.message);
    return st;
}

pf_status tool_mpi_attn_favor_backward(float *dQ, float *dK, float *dV, const float *dout,
                                       const float *Q, const float *K, const float *V,
                                       const float *out, const pf_shape *shape,
                                       const pf_attn_opts *opts, const pf_favor_opts *favor,
                                       char *msg, size_t cap) {
    pf_mpi_info info;
    pf_status st = pf_mpi_attn_favor_backward(dQ, dK, dV, dout, Q, K, V, out, shape, opts, favor,
                                              MPI_COMM_WORLD, &info);
    snprintf(msg, cap, "%s", st == PF_OK ? "" : info.message);
    return st;
}

int tool_team_start(tool_team *t, pf_model *model, int sequence, int B, int T, const char *cmd) {
    memset(t, 0, sizeof(*t));
    t->rank = rank_;
    t->size = size_;
    t->nb = B;
    t->nt = T;
    if (size_ == 1) return 0;
    pf_mpi_info info;
    pf_status st = pf_mpi_trainer_create(&t->tr, model, sequence ? PF_MPI_SEQUENCE : PF_MPI_DATA,
                                         MPI_COMM_WORLD, &info);
    if (st != PF_OK) return tool_fail(cmd, "%d ranks: %s", size_, info.message);
    if (pf_mpi_trainer_share(t->tr, B, T, &t->b0, &t->nb, &t->t0, &t->nt) != PF_OK)
        return tool_fail(cmd, "cannot share a batch of %d x %d among %d ranks", B, T, size_);
    t->tok = malloc(sizeof(int32_t) * (size_t)t->nb * t->nt);
    t->tgt = malloc(sizeof(int32_t) * (size_t)t->nb * t->nt);
    if (!t->tok || !t->tgt) return tool_fail(cmd, "out of memory");
    return 0;
}

pf_status tool_team_forward(tool_team *t, pf_model *m, float *loss, float *logits,
                            const int32_t *tok, const int32_t *tgt, int B, int T) {
    if (t->size == 1) return pf_model_forward(m, loss, logits, tok, tgt, B, T);
    for (int b = 0; b < t->nb; b++) {
        memcpy(t->tok + (size_t)b * t->nt, tok + (size_t)(t->b0 + b) * T + t->t0,
               sizeof(int32_t) * (size_t)t->nt);
        memcpy(t->tgt + (size_t)b * t->nt, tgt + (size_t)(t->b0 + b) * T + t->t0,
               sizeof(int32_t) * (size_t)t->nt);
    }
    return pf_mpi_trainer_forward(t->tr, loss, logits, t->tok, t->tgt, B, T, NULL);
}

pf_status tool_team_backward(tool_team *t, pf_model *m) {
    if (t->size == 1) return pf_model_backward(m);
    return pf_mpi_trainer_backward(t->tr, NULL);
}

pf_status tool_team_sum(tool_team *t, double *x, int n) {
    if (t->size == 1) return PF_OK;
    return pf_mpi_sum(x, n, MPI_COMM_WORLD);
}

void tool_team_free(tool_team *t) {
    pf_mpi_trainer_free(t->tr);
    t->tr = NULL;
    free(t->tok);
    free(t->tgt);
    t->tok = t->tgt = NULL;
}
