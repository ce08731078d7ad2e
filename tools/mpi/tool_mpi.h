/* tool_mpi.h: the tool under mpirun. The tool's sources are compiled once and linked twice: into
 * `performer` with alone.c, where every function here is that of one process (rank 0 of 1,
 * whose verdict is its own), and into `performer-mpi` with tool_mpi.c (mpicc, libperformer_mpi),
 * where they run over MPI_COMM_WORLD. So the commands call them unconditionally and never ask
 * which build they are in but through tool_mpi_build.
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

/* 1 in performer-mpi, 0 in performer. */
extern const int tool_mpi_build;

/* Rows [o, o + n) of L are rank p's of N: [L p / N, L (p + 1) / N). */
static inline void tool_mpi_cut(int L, int p, int N, int *o, int *n) {
    *o = (int)((long long)L * p / N);
    *n = (int)((long long)L * (p + 1) / N) - *o;
}

/* performer-mpi: MPI_Init (and MPI_Finalize at exit); ranks other than 0 get /dev/null as
 * standard output, so that --help and --version are printed once. Call after the OpenBLAS
 * restart, before anything is printed. performer: nothing. */
void tool_mpi_init(int *argc, char ***argv);
int tool_mpi_rank(void);
int tool_mpi_size(void);

/* "Open MPI v4.1.4" or the like, for --version ("no MPI" in performer). */
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

/* ---- attention across ranks (performer attn --method favor) ------------------------------ */

/* Collective: every rank's rows of a (blocks, L, w) array, rank p holding rows
 * tool_mpi_cut(L, p, N) of each block as mine (blocks, n, w), into full on rank 0 (NULL
 * elsewhere). 0, or -1 if a transfer failed (on some rank; always in performer, which never
 * cuts the sequence). */
int tool_mpi_gather_rows(float *full, const float *mine, size_t blocks, int L, int w);

/* pf_mpi_attn_favor and its backward on MPI_COMM_WORLD, shape being this rank's rows; on a
 * failure msg says what (the same text on every rank). PF_ENOTSUP in performer. */
pf_status tool_mpi_attn_favor(float *out, const float *Q, const float *K, const float *V,
                              const pf_shape *shape, const pf_attn_opts *opts,
                              const pf_favor_opts *favor, char *msg, size_t cap);
pf_status tool_mpi_attn_favor_backward(float *dQ, float *dK, float *dV, const float *dout,
                                       const float *Q, const float *K, const float *V,
                                       const float *out, const pf_shape *shape,
                                       const pf_attn_opts *opts, const pf_favor_opts *favor,
                                       char *msg, size_t cap);

/* ---- training as a team of ranks (performer train --parallel) ---------------------------- */

struct pf_mpi_trainer; /* (performer_mpi.h, which only performer-mpi's tool_mpi.c includes) */

/* How this process takes part in each training step: alone (the whole batch, the model's own
 * calls), or as one rank of a pf_mpi_trainer, holding rows [b0, b0 + nb) and positions
 * [t0, t0 + nt) of every (B, T) batch, copied into tok and tgt. Zeroed before
 * tool_team_start. */
typedef struct tool_team {
    int rank, size;
    struct pf_mpi_trainer *tr; /* performer-mpi under several ranks; else NULL */
    int b0, nb, t0, nt;
    int32_t *tok, *tgt;
} tool_team;

/* Joins the ranks for model, sharing every (B, T) batch by whole sequences (sequence 0) or by
 * positions (1): collective under several ranks; alone, the share is the whole batch. 0, or an
 * exit code after a message (cmd's), not yet agreed. */
int tool_team_start(tool_team *t, pf_model *model, int sequence, int B, int T, const char *cmd);

/* pf_model_forward of this process's share of the (B, T) batch tok, tgt: the mean loss over
 * every rank's positions; logits (if not NULL) this rank's (nb, nt, 256). */
pf_status tool_team_forward(tool_team *t, pf_model *m, float *loss, float *logits,
                            const int32_t *tok, const int32_t *tgt, int B, int T);

/* pf_model_backward of the last forward, the gradients summed over the ranks. */
pf_status tool_team_backward(tool_team *t, pf_model *m);

/* x (n) becomes the sum over the ranks, in rank order. */
pf_status tool_team_sum(tool_team *t, double *x, int n);

void tool_team_free(tool_team *t);

#endif
