/* tool_mpi.h: the tool under mpirun. The MPI build of the tool, performer-mpi, compiles the same
 * sources with -DPF_TOOL_MPI and tools/mpi/tool_mpi.c (mpicc, libperformer_mpi); the plain
 * `performer` never links MPI, and here every function is a stand-in for one process (rank 0 of
 * 1, whose verdict is its own), so the commands call them unconditionally.
 *
 * Under several ranks the tool's messages (tool_fail, tool_usage) are held, not printed, until the
 * ranks agree (tool_mpi_agree): the message of the lowest failing rank is then printed once, by
 * rank 0, and every rank returns that rank's exit code. Every rank must make the same sequence
 * of agreeing (collective) calls, so a rank that fails goes on to the next agreement, never past
 * it. */
#ifndef PF_TOOL_MPI_H
#define PF_TOOL_MPI_H

#include <stddef.h>
#include <stdint.h>

#include "performer.h"

/* Rows [o, o + n) of L are rank p's of N: [L p / N, L (p + 1) / N). */
static inline void tool_mpi_cut(int L, int p, int N, int *o, int *n) {
    *o = (int)((long long)L * p / N);
    *n = (int)((long long)L * (p + 1) / N) - *o;
}

#ifdef PF_TOOL_MPI
#define TOOL_MPI_BUILD 1

/* MPI_Init (and MPI_Finalize at exit); ranks other than 0 get /dev/null as standard output, so
 * that --help and --version are printed once. Call after the OpenBLAS restart, before anything
 * is printed. */
void tool_mpi_init(int *argc, char ***argv);
int tool_mpi_rank(void);
int tool_mpi_size(void);

/* "Open MPI v4.1.4" or the like, for --version. */
const char *tool_mpi_library(void);

/* Keeps msg (a whole line, no newline) until the next tool_mpi_agree; 1 if kept (several ranks),
 * 0 if the caller is to print it. */
int tool_mpi_hold(const char *msg);

/* Collective. rc is this rank's exit code so far (0: fine). Returns the exit code of the lowest
 * rank with a non-zero one, after rank 0 has printed that rank's held messages (naming the rank
 * when rank 0 itself was fine), or 0 if every rank was fine. */
int tool_mpi_agree(int rc);

/* Collective: v[i] := the smallest v[i] over the ranks. */
void tool_mpi_min_i64(int64_t *v, int n);

/* Collective: the largest x over the ranks. */
double tool_mpi_max(double x);

/* Collective: every rank's rows of a (blocks, L, w) array, rank p holding rows
 * tool_mpi_cut(L, p, N) of each block as mine (blocks, n, w), into full on rank 0 (NULL
 * elsewhere). 0, or -1 if a transfer failed (on some rank). */
int tool_mpi_gather_rows(float *full, const float *mine, size_t blocks, int L, int w);

/* pf_mpi_attn_favor and its backward on MPI_COMM_WORLD, shape being this rank's rows; on a
 * failure msg says what (the same text on every rank). */
pf_status tool_mpi_attn_favor(float *out, const float *Q, const float *K, const float *V,
                              const pf_shape *shape, const pf_attn_opts *opts,
                              const pf_favor_opts *favor, char *msg, size_t cap);
pf_status tool_mpi_attn_favor_backward(float *dQ, float *dK, float *dV, const float *dout,
                                       const float *Q, const float *K, const float *V,
                                       const float *out, const pf_shape *shape,
                                       const pf_attn_opts *opts, const pf_favor_opts *favor,
                                       char *msg, size_t cap);

#else /* the plain tool: one process */
#define TOOL_MPI_BUILD 0

static inline int tool_mpi_rank(void) {
    return 0;
}
static inline int tool_mpi_size(void) {
    return 1;
}
static inline int tool_mpi_hold(const char *msg) {
    (void)msg;
    return 0;
}
static inline int tool_mpi_agree(int rc) {
    return rc;
}
static inline void tool_mpi_min_i64(int64_t *v, int n) {
    (void)v;
    (void)n;
}
static inline double tool_mpi_max(double x) {
    return x;
}
static inline int tool_mpi_gather_rows(float *full, const float *mine, size_t blocks, int L,
                                       int w) {
    (void)full, (void)mine, (void)blocks, (void)L, (void)w;
    return -1; /* one process never cuts the sequence */
}
static inline pf_status tool_mpi_attn_favor(float *out, const float *Q, const float *K,
                                            const float *V, const pf_shape *shape,
                                            const pf_attn_opts *opts, const pf_favor_opts *favor,
                                            char *msg, size_t cap) {
    (void)out, (void)Q, (void)K, (void)V, (void)shape, (void)opts, (void)favor;
    if (cap) msg[0] = '\0';
    return PF_ENOTSUP;
}
static inline pf_status tool_mpi_attn_favor_backward(float *dQ, float *dK, float *dV,
                                                     const float *dout, const float *Q,
                                                     const float *K, const float *V,
                                                     const float *out, const pf_shape *shape,
                                                     const pf_attn_opts *opts,
                                                     const pf_favor_opts *favor, char *msg,
                                                     size_t cap) {
    (void)dQ, (void)dK, (void)dV, (void)dout, (void)Q, (void)K, (void)V, (void)out;
    (void)shape, (void)opts, (void)favor;
    if (cap) msg[0] = '\0';
    return PF_ENOTSUP;
}
#endif

#endif
