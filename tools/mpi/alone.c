/* alone.c: the tool under mpirun (tool_mpi.h) as one process, linked into the plain performer,
 * which never links MPI: rank 0 of 1, whose verdict is its own, training alone. (Started by
 * mpirun with more than one rank, it gives way to performer-mpi first: tools/performer.c.) */
#include <string.h>

#include "tool_mpi.h"

const int tool_mpi_build = 0;

void tool_mpi_init(int *argc, char ***argv) {
    (void)argc, (void)argv;
}

int tool_mpi_rank(void) {
    return 0;
}

int tool_mpi_size(void) {
    return 1;
}

const char *tool_mpi_library(void) {
    return "no MPI";
}

int tool_mpi_hold(const char *msg) {
    (void)msg;
    return 0;
}

int tool_mpi_agree(int rc) {
    return rc;
}

void tool_mpi_min_i64(int64_t *v, int n) {
    (void)v, (void)n;
}

double tool_mpi_max(double x) {
    return x;
}

int tool_mpi_gather_rows(float *full, const float *mine, size_t blocks, int L, int w) {
    (void)full, (void)mine, (void)blocks, (void)L, (void)w;
    return -1; /* one process never cuts the sequence */
}

pf_status tool_mpi_attn_favor(float *out, const float *Q, const float *K, const float *V,
                              const pf_shape *shape, const pf_attn_opts *opts,
                              const pf_favor_opts *favor, char *msg, size_t cap) {
    (void)out, (void)Q, (void)K, (void)V, (void)shape, (void)opts, (void)favor;
    if (cap) msg[0] = '\0';
    return PF_ENOTSUP;
}

pf_status tool_mpi_attn_favor_backward(float *dQ, float *dK, float *dV, const float *dout,
                                       const float *Q, const float *K, const float *V,
                                       const float *out, const pf_shape *shape,
                                       const pf_attn_opts *opts, const pf_favor_opts *favor,
                                       char *msg, size_t cap) {
    (void)dQ, (void)dK, (void)dV, (void)dout, (void)Q, (void)K, (void)V, (void)out;
    (void)shape, (void)opts, (void)favor;
    if (cap) msg[0] = '\0';
    return PF_ENOTSUP;
}

int tool_team_start(tool_team *t, pf_model *model, int sequence, int B, int T, const char *cmd) {
    (void)model, (void)sequence, (void)cmd;
    memset(t, 0, sizeof(*t));
    t->size = 1;
    t->nb = B;
    t->nt = T;
    return 0;
}

pf_status tool_team_forward(tool_team *t, pf_model *m, float *loss, float *logits,
                            const int32_t *tok, const int32_t *tgt, int B, int T) {
    (void)t;
    return pf_model_forward(m, loss, logits, tok, tgt, B, T);
}

pf_status tool_team_backward(tool_team *t, pf_model *m) {
    (void)t;
    return pf_model_backward(m);
}

pf_status tool_team_sum(tool_team *t, double *x, int n) {
    (void)t, (void)x, (void)n;
    return PF_OK;
}

void tool_team_free(tool_team *t) {
    (void)t;
}
