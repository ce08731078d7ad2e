/*
 * performer_mpi.h: sequence-parallel FAVOR+ over MPI (libperformer_mpi, built where mpicc is).
 *
 * Each rank of a communicator holds one contiguous slice of the sequence, in rank order: its
 * rows of Q, K, V (and of dout), laid out as everywhere, (B,H,Ln,.) with Ln its own length
 * (slices may differ in length; every rank holds at least one row). The ranks exchange only
 * FAVOR+ states, r x (dv+1) floats per head (performer.h, "FAVOR+ in slices"), whatever L:
 * bidirectional attention combines every rank's key state, causal attention gives each rank
 * the combined state of the lower ranks, with the running-maximum rebase, so causality stays
 * strict bit for bit (a key on rank p changes nothing on ranks below p). The backward sends the
 * state gradients the same way. The arithmetic is the core library's; this one only moves
 * states.
 *
 * States are combined in a fixed tree (recursive doubling by rank, then a broadcast from the
 * last rank), never by an MPI reduction whose order the implementation picks: the results are
 * the same bits for the same slices whatever the number of threads, and equal the single
 * process's to float rounding (one rank: its bits).
 *
 * Errors never hang: every rank checks its arguments, and before any data moves the ranks
 * exchange a small descriptor (shape, options, a hash of W and of key_len, their own verdict),
 * so that all of them return the same status when any is bad or they disagree; later failures
 * (a NaN met while computing) are agreed on at the end of the call. info->message then says
 * which rank and what, the same text on every rank.
 *
 *     MPI_Init(&argc, &argv);
 *     pf_shape shape = {.B = 1, .H = 8, .Lq = my_rows, .Lk = my_rows, .d = 64, .dv = 64};
 *     pf_attn_opts opts = pf_attn_opts_default();
 *     opts.causal = 1;
 *     pf_mpi_info info;
 *     pf_status st = pf_mpi_attn_favor(out, Q, K, V, &shape, &opts, &fav, MPI_COMM_WORLD, &info);
 *     if (st != PF_OK) fprintf(stderr, "%s\n", info.message);
 */
#ifndef PERFORMER_MPI_H
#define PERFORMER_MPI_H

#include <mpi.h>

#include "performer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a call did, on this rank. */
typedef struct pf_mpi_info {
    uint64_t bytes_sent;     /* payload bytes this rank sent (a broadcast counts once, as sent
                                by its root and received by each other rank) */
    uint64_t bytes_received; /* payload bytes this rank received */
    uint64_t messages;       /* messages sent and received */
    double comm_seconds;     /* wall time in communication (including waiting for others) */
    int failed_rank;         /* the lowest rank with the worst status, or -1 */
    char message[200];       /* what went wrong (the same on every rank), "" on success */
} pf_mpi_info;

/* FAVOR+ attention (pf_attn_favor) of a sequence cut across the ranks of comm, in rank order.
 * shape: this rank's slice (Lq, Lk its own query and key rows; causal: equal); B, H, d, dv and
 * every option must be the same on every rank. opts->key_len, if not NULL, holds the B global
 * valid key lengths in [1, sum of Lk] (the same on every rank). favor: as for pf_attn_favor,
 * every map; FAVOR++ without a given A and FAVOR# fit to the statistics of the whole sequence
 * (exchanged: O(B H d) doubles, O(B H d^2) for FAVOR#). out: this rank's rows (B,H,Lq,dv).
 * Collective: every rank of comm must call it. Returns the same status on every rank: the worst
 * of any rank's (PF_EINVAL also when ranks disagree). info may be NULL. */
PF_API pf_status pf_mpi_attn_favor(float *out, const float *Q, const float *K, const float *V,
                                   const pf_shape *shape, const pf_attn_opts *opts,
                                   const pf_favor_opts *favor, MPI_Comm comm, pf_mpi_info *info);

/* Its backward (pf_attn_favor_backward): this rank's dQ (B,H,Lq,d), dK (B,H,Lk,d) and
 * dV (B,H,Lk,dv) of sum(out * dout) over every rank's outputs. out, if not NULL, is the
 * forward's output for this rank (saves recomputing numerators); NULL on some ranks is fine.
 * Collective, same status on every rank, as the forward. */
PF_API pf_status pf_mpi_attn_favor_backward(float *dQ, float *dK, float *dV, const float *dout,
                                            const float *Q, const float *K, const float *V,
                                            const float *out, const pf_shape *shape,
                                            const pf_attn_opts *opts, const pf_favor_opts *favor,
                                            MPI_Comm comm, pf_mpi_info *info);

/* ---- Training the language model across ranks ---------------------------------------------
 * Every rank holds the same model (created from the same configuration and seed, or loaded from
 * the same checkpoint) and runs a share of each step:
 *   PF_MPI_DATA      a share of the batch's sequences, whole;
 *   PF_MPI_SEQUENCE  a contiguous slice of every sequence (FAVOR attention only): the layers'
 *                    attention runs as pf_mpi_attn_favor over the slices, everything else
 *                    (embeddings, layer norms, MLP, loss) on the rank's own tokens.
 * The loss is the mean over every rank's counted positions; the gradients are summed over the
 * ranks in rank order (each rank sums one block of the parameters, in rank order, in float64,
 * then every rank gathers every block), so every rank holds the same bits, and pf_model_step on
 * each keeps the models equal. A step equals one process's on the whole batch to float
 * rounding. Bytes per step: the attention states (sequence) and twice the gradients, whatever
 * the context.
 *
 *     pf_mpi_trainer *tr;
 *     pf_mpi_trainer_create(&tr, model, PF_MPI_SEQUENCE, MPI_COMM_WORLD, NULL);
 *     pf_mpi_trainer_share(tr, B, T, &b0, &nb, &t0, &nt);      // this rank's rows, positions
 *     pf_mpi_trainer_forward(tr, &loss, NULL, my_tokens, my_targets, B, T, NULL);
 *     pf_mpi_trainer_backward(tr, NULL);
 *     pf_model_step(model, &opt, &gnorm);                        // the same on every rank */
typedef enum pf_mpi_parallel { PF_MPI_DATA = 0, PF_MPI_SEQUENCE = 1 } pf_mpi_parallel;

typedef struct pf_mpi_trainer pf_mpi_trainer;

/* Makes model this rank's part of a run over comm (collective; comm is duplicated). The ranks
 * check that their models are the same (configuration, step, parameters: a hash). PF_ENOTSUP:
 * FAVOR++ (its running statistic would be per rank), or sequence parallel with exact attention
 * (every query needs every key). PF_EINVAL: the ranks' models or kinds differ. The same status
 * on every rank; info->message says why. The model must outlive the trainer. */
PF_API pf_status pf_mpi_trainer_create(pf_mpi_trainer **trainer, pf_model *model,
                                       pf_mpi_parallel kind, MPI_Comm comm, pf_mpi_info *info);

/* Frees a trainer (not collective) and makes its model train alone again; harmless on NULL. */
PF_API void pf_mpi_trainer_free(pf_mpi_trainer *trainer);

/* This rank's share of a (B,T) batch: rows [*b0, *b0 + *nb) and positions [*t0, *t0 + *nt),
 * rank p of N taking rows (data) or positions (sequence) [n p / N, n (p + 1) / N). PF_EINVAL
 * if that leaves a rank nothing (fewer rows, or positions, than ranks). */
PF_API pf_status pf_mpi_trainer_share(const pf_mpi_trainer *trainer, int B, int T, int *b0,
                                      int *nb, int *t0, int *nt);

/* pf_model_forward of this rank's share of a (B,T) batch, collectively: tokens and targets
 * (nb, nt) as pf_mpi_trainer_share gives them; *loss (if not NULL) the mean over every rank's
 * counted positions, the same on every rank; logits (nb, nt, 256) this rank's. Returns the
 * worst status of any rank on every rank. */
PF_API pf_status pf_mpi_trainer_forward(pf_mpi_trainer *trainer, float *loss, float *logits,
                                        const int32_t *tokens, const int32_t *targets, int B,
                                        int T, pf_mpi_info *info);

/* The gradients of the last forward's global loss, summed over the ranks (collective); then
 * pf_model_step on every rank. Same status on every rank. */
PF_API pf_status pf_mpi_trainer_backward(pf_mpi_trainer *trainer, pf_mpi_info *info);

/* x (n doubles) becomes the sum of every rank's x, added in rank order: the same bits on every
 * rank (a tool's counts and sums). Collective; PF_EIO if MPI fails. */
PF_API pf_status pf_mpi_sum(double *x, int n, MPI_Comm comm);

#ifdef __cplusplus
}
#endif

#endif /* PERFORMER_MPI_H */
