/*
 * performer_cuda.h: FAVOR+ on NVIDIA GPUs (libperformer_cuda, built where nvcc is found).
 *
 * The forward pass of FAVOR+ attention, bidirectional and causal, and one-token decoding of a
 * batch of states, on tensors in GPU memory, in float32, bfloat16 or float16, on a CUDA stream.
 * Shapes, options and statuses are the core library's (performer.h): Q (B,H,Lq,d), K (B,H,Lk,d),
 * V (B,H,Lk,dv), out (B,H,Lq,dv), row-major and contiguous, the same pf_shape, pf_attn_opts and
 * pf_favor_opts; the results equal pf_attn_favor's given the same W, to float rounding.
 *
 * What runs where: the products (X W^T, the key state phi(K)^T [V|1], the query readout, the
 * causal chunks' scores) through cuBLAS, on tensor cores for bf16 and fp16 with float32
 * accumulation (the projection X W^T of half inputs on TF32 ones, from the inputs widened to
 * float32: W keeps 2^-11 of precision there, which the exponential features need); the feature
 * maps with their stabilisers, the weights of the values, the prefix
 * of chunk states and the normalisation in the library's own kernels. Half precision is storage
 * only: features, their log factors, the state and the normaliser are float32 (the features
 * and the state are rounded to bf16 as tensor-core inputs, never summed in it), so long
 * sequences cannot overflow where fp16 sums do. Causal attention runs in chunks of C rows: a
 * masked C x C product inside each chunk and a prefix of chunk states across them, never an
 * L x r x dv cumulative sum; a later key changes no bit of an earlier output.
 *
 * Device memory: every tensor argument is a device pointer (cudaMalloc, or managed memory) on
 * the context's device, except where a comment says otherwise. W (m,d) or (H,m,d) float32 is a
 * device copy of what pf_projection_draw gives (the same bits as the tool's --seed).
 *
 * Errors: every function returns a pf_status and never aborts; a host pointer where a device
 * one is needed, a shape, a dtype or a kernel that is not supported, no GPU or no driver is a
 * status, with pf_cuda_last_error() saying what in words. Arguments are checked before any
 * work is queued. What only the GPU can see (a NaN or Inf in Q, K or V, a zero denominator) is
 * read back at the end of the call, which therefore waits for the stream: the status is
 * PF_ENONFINITE or PF_EDOMAIN as pf_attn_favor's, and out then holds zeros (all of it for a NaN
 * or Inf in the inputs, the rows concerned for a zero denominator), never a NaN.
 *
 * Reproducibility: the same call on the same GPU gives the same bits; a different workspace
 * limit (heads processed at a time) may let cuBLAS choose other kernels, which agree to float
 * rounding.
 *
 *     pf_cuda_ctx *ctx;
 *     pf_cuda_ctx_create(&ctx, 0);                          // device 0
 *     float W[256 * 64];
 *     pf_projection_draw(W, 256, 64, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 42, 0);
 *     float *dW; cudaMalloc((void **)&dW, sizeof W); cudaMemcpy(dW, W, sizeof W, cudaMemcpyHostToDevice);
 *     pf_shape shape = {.B = 1, .H = 16, .Lq = L, .Lk = L, .d = 64, .dv = 64};
 *     pf_attn_opts opts = pf_attn_opts_default();
 *     opts.causal = 1;
 *     pf_favor_opts fav = pf_favor_opts_default();
 *     fav.W = dW;
 *     fav.m = 256;
 *     pf_status st = pf_cuda_favor(ctx, dout, dQ, dK, dV, PF_CUDA_BF16, &shape, &opts, &fav, stream);
 *     if (st != PF_OK) fprintf(stderr, "%s: %s\n", pf_status_str(st), pf_cuda_last_error());
 *     pf_cuda_ctx_free(ctx);
 *
 * Threads: a context is used by one host thread at a time (it holds a cuBLAS handle and a
 * workspace); give each thread its own.
 */
#ifndef PERFORMER_CUDA_H
#define PERFORMER_CUDA_H

#include <cuda_runtime_api.h>

#include "performer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The element type of Q, K, V and out (and of q, k, v, out when decoding). */
typedef enum pf_cuda_dtype {
    PF_CUDA_F32 = 0,  /* float32; products in float32 (TF32 only if the context allows it) */
    PF_CUDA_BF16 = 1, /* bfloat16; products on tensor cores, float32 accumulation */
    PF_CUDA_F16 = 2   /* float16; as bfloat16 (features and states in bfloat16's range) */
} pf_cuda_dtype;

/* Bytes of one element of dtype (4 or 2); 0 for an unknown dtype. */
PF_API size_t pf_cuda_dtype_size(pf_cuda_dtype dtype);

/* Number of CUDA devices this process can use (0 when there is no GPU or no driver: then
 * pf_cuda_last_error() says why). Never fails. */
PF_API int pf_cuda_device_count(void);

/* What went wrong in this host thread's last call of this library, in words (a CUDA error's
 * own text, the argument that was refused); "" if it succeeded (every call clears it first).
 * Static per-thread storage, valid until the thread's next call. */
PF_API const char *pf_cuda_last_error(void);

/* ---------------------------------------------------------------------------------------------
 * Context: a device, a cuBLAS handle, the workspace and a word for the kernels' error flags.
 * ------------------------------------------------------------------------------------------ */

typedef struct pf_cuda_ctx pf_cuda_ctx;

/* Creates a context on device `device` (0-based). PF_ENOTSUP if there is no such device (or no
 * GPU, or no driver), PF_ENOMEM, PF_EINVAL on NULL. The calls made with it run on its device,
 * whatever the calling thread's current device is (which they leave as it was). */
PF_API pf_status pf_cuda_ctx_create(pf_cuda_ctx **ctx, int device);

/* Frees a context and its workspace; harmless on NULL. Waits for the work it queued. */
PF_API void pf_cuda_ctx_free(pf_cuda_ctx *ctx);

/* The context's device. */
PF_API int pf_cuda_ctx_device(const pf_cuda_ctx *ctx);

/* Lets float32 products use TF32 tensor cores (allow 1: about 8x the throughput, inputs rounded
 * to 10 mantissa bits; the results then agree with the CPU to about 1e-3). Default 0: float32
 * products stay float32. PF_EINVAL on NULL or allow not 0/1. */
PF_API pf_status pf_cuda_ctx_set_tf32(pf_cuda_ctx *ctx, int allow);

/* The most workspace the context may hold (bytes; default 1 GiB). A forward processes as many
 * heads at a time as fit (at least one, whatever the limit), so memory stays linear in L and
 * bounded by the limit for any B*H; pf_cuda_favor_workspace says what a call needs. The
 * workspace grows when a call needs more and is kept for the next calls. */
PF_API pf_status pf_cuda_ctx_set_workspace_limit(pf_cuda_ctx *ctx, size_t bytes);

/* Device bytes the context holds now (its workspace and key lengths). */
PF_API size_t pf_cuda_ctx_bytes(const pf_cuda_ctx *ctx);

/* Frees the context's workspace (the next call allocates again). */
PF_API void pf_cuda_ctx_trim(pf_cuda_ctx *ctx);

/* Workspace of a forward: *per_head bytes for each head processed at a time, *fixed bytes
 * whatever the head count (either may be NULL). The shape and options are checked as
 * pf_cuda_favor checks them; favor->W and opts->key_len are neither checked nor read (NULL is
 * fine). An unknown kernel is PF_EINVAL, FAVOR++ and FAVOR# PF_ENOTSUP. */
PF_API pf_status pf_cuda_favor_workspace(size_t *per_head, size_t *fixed, pf_cuda_dtype dtype,
                                         const pf_shape *shape, const pf_attn_opts *opts,
                                         const pf_favor_opts *favor);

/* ---------------------------------------------------------------------------------------------
 * FAVOR+ forward
 * ------------------------------------------------------------------------------------------ */

/* The maps these kernels run: positive (FAVOR+), hyperbolic, trig and relu. FAVOR++, FAVOR# and
 * elu (PF_KERNEL_OPRF, PF_KERNEL_SDERF, PF_KERNEL_ELU) are PF_ENOTSUP here. */
PF_API int pf_cuda_kernel_supported(pf_kernel kernel);

/* FAVOR+ attention on the GPU: pf_attn_favor's contract with device tensors of `dtype` on
 * `stream` (0: the legacy default stream). favor->W is a device pointer to float32 W ((m,d), or
 * (H,m,d) with w_per_head); opts->key_len, if not NULL, B int32 lengths in host or device memory
 * (both are accepted: they are read once, before the work is queued); opts->threads is ignored.
 * favor->chunk: the causal chunk C (0: 128 for the GPU; any C >= 1 gives the same outputs to
 * rounding). Statuses as pf_attn_favor's; PF_ENOTSUP for FAVOR++/FAVOR#, a missing GPU or a
 * context on another device than the tensors; PF_EINVAL for a host or null pointer, an unknown
 * dtype, or tensors that overlap out. Returns when the stream has finished the call. */
PF_API pf_status pf_cuda_favor(pf_cuda_ctx *ctx, void *out, const void *Q, const void *K,
                               const void *V, pf_cuda_dtype dtype, const pf_shape *shape,
                               const pf_attn_opts *opts, const pf_favor_opts *favor,
                               cudaStream_t stream);

/* Stage timings of the forwards: with on = 1 the context records a CUDA event around each
 * stage of every later forward (which costs a little), and pf_cuda_ctx_stages reports them.
 * PF_EINVAL on NULL. */
PF_API pf_status pf_cuda_ctx_profile(pf_cuda_ctx *ctx, int on);

#define PF_CUDA_STAGES 8

/* The stages' names (static strings: "project", "features", "weights", "chunk_states",
 * "prefix", "scores", "readout_mm", "normalise") and milliseconds summed over the forwards since
 * profiling was turned on (or since the last call of this function), and the flops each did
 * (as matrix products count them, 2 per multiply-add; 0 for the elementwise stages) and the
 * bytes each moved (as counted from the sizes each reads and writes). Any array may be NULL;
 * each has PF_CUDA_STAGES entries. Resets the sums. Waits for the context's last stream. */
PF_API pf_status pf_cuda_ctx_stages(pf_cuda_ctx *ctx, const char **names, double *ms,
                                    double *flops, double *bytes);

/* ---------------------------------------------------------------------------------------------
 * FAVOR+ backward: the gradients dQ, dK, dV of sum(out * dout) (pf_attn_favor_backward's
 * contract, with device tensors of `dtype`: dQ (B,H,Lq,d), dK (B,H,Lk,d), dV (B,H,Lk,dv) and
 * dout (B,H,Lq,dv) in dtype, overwritten, never accumulated into). W is a constant. Every product
 * accumulates in float32; for half inputs the features, the state gradients and dN are rounded
 * to bfloat16 only as tensor-core inputs, as in the forward. Causal runs the forward's chunks:
 * the prefix of chunk states for the queries' gradients, a suffix of chunk states (the gradient
 * reaching each chunk from the later queries) for the keys' and values' gradients, and masked
 * C x C products inside each chunk: memory is linear in L (never an L x r x dv prefix), in groups
 * of heads that fit the context's workspace limit. Padded keys get zero gradients.
 *
 * Kept or recomputed, as the CPU library offers both: a pf_cuda_favor_saved filled by
 * pf_cuda_favor_save keeps each head's features (2 L r elements of bfloat16 for half inputs,
 * float32 otherwise, and 3 L floats), so that the backward does not recompute them (saving the
 * two projections and feature maps); pf_cuda_favor_backward with saved NULL recomputes them
 * from Q, K and W (memory: the workspace alone). Both agree to float rounding (the same
 * kernels make the features; cuBLAS may pick other kernels for another number of heads at a
 * time).
 *
 * Statuses as pf_cuda_favor's: PF_ENONFINITE for a NaN or Inf in Q, K, V, W or dout (the
 * gradients are then zeros), PF_EDOMAIN for a zero denominator (those rows pass no gradient),
 * PF_EINVAL for a saved made for other arguments or not filled. Returns when the stream has
 * finished the call.
 * ------------------------------------------------------------------------------------------ */

/* What a forward keeps for its backward: the features of every head, on ctx's device. */
typedef struct pf_cuda_favor_saved pf_cuda_favor_saved;

/* Workspace of a backward, as pf_cuda_favor_workspace says for the forward. */
PF_API pf_status pf_cuda_favor_backward_workspace(size_t *per_head, size_t *fixed,
                                                  pf_cuda_dtype dtype, const pf_shape *shape,
                                                  const pf_attn_opts *opts,
                                                  const pf_favor_opts *favor);

PF_API pf_status pf_cuda_favor_backward(pf_cuda_ctx *ctx, void *dQ, void *dK, void *dV,
                                        const void *dout, const void *Q, const void *K,
                                        const void *V, pf_cuda_dtype dtype, const pf_shape *shape,
                                        const pf_attn_opts *opts, const pf_favor_opts *favor,
                                        const pf_cuda_favor_saved *saved,
                                        cudaStream_t stream);

/* Device bytes a saved for these arguments holds (checked as pf_cuda_favor checks them). */
PF_API pf_status pf_cuda_favor_saved_size(size_t *bytes, pf_cuda_dtype dtype,
                                          const pf_shape *shape, const pf_attn_opts *opts,
                                          const pf_favor_opts *favor);

/* Creates (allocates) one for these arguments; empty until pf_cuda_favor_save fills it.
 * PF_EINVAL, PF_ENOTSUP, PF_ENOMEM as pf_cuda_favor. It uses ctx, which must outlive it. */
PF_API pf_status pf_cuda_favor_saved_create(pf_cuda_favor_saved **saved, pf_cuda_ctx *ctx,
                                            pf_cuda_dtype dtype, const pf_shape *shape,
                                            const pf_attn_opts *opts,
                                            const pf_favor_opts *favor);

/* Frees it (waiting for the device); harmless on NULL. */
PF_API void pf_cuda_favor_saved_free(pf_cuda_favor_saved *saved);

/* Device bytes it holds (0 for NULL). */
PF_API size_t pf_cuda_favor_saved_bytes(const pf_cuda_favor_saved *saved);

/* pf_cuda_favor (the same out, bit for bit) that also fills saved for a backward of these same
 * Q, K, V. PF_EINVAL if saved was made for other arguments (shape, dtype, options, W, key
 * lengths); a failed call leaves it empty. */
PF_API pf_status pf_cuda_favor_save(pf_cuda_ctx *ctx, void *out, const void *Q, const void *K,
                                    const void *V, pf_cuda_dtype dtype, const pf_shape *shape,
                                    const pf_attn_opts *opts, const pf_favor_opts *favor,
                                    pf_cuda_favor_saved *saved, cudaStream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Decoding: the causal FAVOR+ states of N sequences x H heads on the GPU, each advanced a token
 * at a time by one launch for the whole batch. A sequence's state is S (r, dv) and z (r) in
 * float32, referenced to its running key maximum M, and its position (tokens consumed). Each
 * sequence is at its own position: they are reset and stepped independently (active mask).
 * Memory N H r (dv + 1) floats, whatever the positions; a step reads and writes every active
 * state once. Rows equal pf_attn_favor's causal rows to float rounding (the state is float32
 * whatever the dtype), and the causal pf_cuda_favor's to its own rounding (bfloat16 products
 * for half inputs).
 * ------------------------------------------------------------------------------------------ */

typedef struct pf_cuda_favor_state pf_cuda_favor_state;

/* Creates N empty states (position 0) of H heads, widths d and dv, on ctx's device. favor->W
 * (a device pointer, as for pf_cuda_favor) is copied; favor->kernel, m, w_per_head and eps as
 * for pf_cuda_favor; scale as in pf_attn_opts (0: 1/sqrt(d)). The state uses ctx (which must
 * outlive it) for its launches and errors. PF_EINVAL, PF_ENOTSUP, PF_ENOMEM. */
PF_API pf_status pf_cuda_favor_state_create(pf_cuda_favor_state **state, pf_cuda_ctx *ctx, int N,
                                            int H, int d, int dv, float scale,
                                            const pf_favor_opts *favor);

/* Frees the states; harmless on NULL. */
PF_API void pf_cuda_favor_state_free(pf_cuda_favor_state *state);

/* Empties the states of the sequences whose entry of `which` (N host ints) is nonzero, or of
 * every sequence when which is NULL (position 0, W kept). Queued on stream. PF_EINVAL. */
PF_API pf_status pf_cuda_favor_state_reset(pf_cuda_favor_state *state, const int *which,
                                           cudaStream_t stream);

/* One token for every sequence whose entry of `active` is nonzero (N int32 in device memory;
 * NULL: all): q, k (N,H,d), v (N,H,dv) -> out (N,H,dv), each row attending to the sequence's
 * earlier tokens and itself. The rows of inactive sequences, and their states, are left as they
 * were. dtype as for pf_cuda_favor. Waits for the stream to read the error flags: PF_ENONFINITE
 * for a NaN or Inf in an active sequence's q, k or v (every head of that sequence: rows zero,
 * state and position unchanged; the other sequences step as usual) or a projection that
 * overflows float32 (that head: row zero, state unchanged), PF_EDOMAIN for a zero denominator
 * (the row is zero, the state stepped). */
PF_API pf_status pf_cuda_favor_state_step(pf_cuda_favor_state *state, void *out, const void *q,
                                          const void *k, const void *v, const int32_t *active,
                                          pf_cuda_dtype dtype, cudaStream_t stream);

/* Positions (tokens consumed) of the N sequences into pos (N host int64). Waits for stream. */
PF_API pf_status pf_cuda_favor_state_positions(const pf_cuda_favor_state *state, int64_t *pos,
                                               cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* PERFORMER_CUDA_H */
