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

#ifdef __cplusplus
}
#endif

#endif /* PERFORMER_MPI_H */
