/*
 * performer.h: fast attention over long sequences with random features.
 *
 * Exact softmax attention (online softmax, never an L x Lk matrix) and FAVOR+ linear attention
 * (Choromanski et al. 2020) with positive, hyperbolic, trigonometric and ReLU feature maps,
 * bidirectional and causal (query i attends to keys j <= i, itself included).
 *
 * Layout: every tensor is float32, row-major and contiguous. Queries are (B,H,Lq,d), keys
 * (B,H,Lk,d), values (B,H,Lk,dv) and outputs (B,H,Lq,dv). A projection W is (m,d), or (H,m,d)
 * when each head has its own.
 *
 * Every function returns a pf_status; the library never prints, exits or aborts on bad input.
 * The caller owns every tensor it passes; objects come in _create/_free pairs.
 *
 * Aliasing: an output must not overlap an input or another output. Every function that
 * computes on tensors (the attention forwards and backwards and their references, the slices,
 * pf_features, the FAVOR++/FAVOR# fits, pf_favor_state_step, pf_model_forward,
 * pf_model_attention_inputs) refuses that with PF_EINVAL before writing anything. The
 * exceptions, which support it: pf_exp (y may be x), pf_favor_slice_combine and _dcombine (S2
 * may be S: an elementwise update) and pf_sample_logits (the token is written after the logits
 * are read).
 *
 * Threads: any function may run in several threads at once on different objects and different
 * outputs (inputs may be shared, read only); an object (pf_rng, pf_favor_state, pf_favor_saved,
 * pf_model, pf_decoder) is used by one thread at a time. Each call runs its own OpenMP team
 * (pf_attn_opts.threads), whose size never changes a result.
 *
 * C++: the usage below names the fields of pf_shape (C99's designated initialisers, C++20's);
 * in C++17, give them in order, pf_shape shape = {B, H, Lq, Lk, d, dv}, or assign each field.
 *
 * Usage:
 *
 *     pf_shape shape = {.B = 1, .H = 8, .Lq = L, .Lk = L, .d = 64, .dv = 64};
 *     float *W = malloc(sizeof(float) * 256 * 64);
 *     pf_projection_draw(W, 256, 64, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 42, 0);
 *     pf_attn_opts opts = pf_attn_opts_default();
 *     pf_favor_opts fav = pf_favor_opts_default();
 *     fav.W = W;
 *     fav.m = 256;
 *     pf_status st = pf_attn_favor(out, Q, K, V, &shape, &opts, &fav);
 *     if (st != PF_OK) fprintf(stderr, "%s\n", pf_status_str(st));
 */
#ifndef PERFORMER_H
#define PERFORMER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(PF_BUILDING_LIBRARY) && defined(__GNUC__)
#define PF_API __attribute__((visibility("default")))
#else
#define PF_API
#endif

#define PF_VERSION_MAJOR 0
#define PF_VERSION_MINOR 1
#define PF_VERSION_PATCH 0

/* ---------------------------------------------------------------------------------------------
 * Status codes
 * ------------------------------------------------------------------------------------------ */

/* Statuses are ordered: a larger value is a worse outcome, and where parts of one call (heads,
 * blocks, threads, MPI ranks) end differently the call returns the largest. */
typedef enum pf_status {
    PF_OK = 0,
    PF_EINVAL,     /* an argument is NULL, a dimension is out of range, options disagree */
    PF_ENOMEM,     /* an allocation failed */
    PF_ENONFINITE, /* an input holds NaN/Inf, or a result (e.g. a denominator) is not finite */
    PF_EDOMAIN,    /* a mathematically undefined request (e.g. zero attention denominator) */
    PF_EIO,        /* a file could not be opened, read or written */
    PF_EFORMAT,    /* a file is not in the expected format (dtype, order, shape, truncated) */
    PF_ENOTSUP     /* valid but not supported by this build or this method */
} pf_status;

/* A short English description of a status; never NULL, static storage. */
PF_API const char *pf_status_str(pf_status status);

/* The library version as "MAJOR.MINOR.PATCH"; static storage. */
PF_API const char *pf_version(void);

/* The kernel set the linked OpenBLAS runs the exact, RA and LARA products on, as it names it
 * ("Haswell", "SkylakeX", ...; chosen for the CPU when OpenBLAS loads, or by the environment
 * variable OPENBLAS_CORETYPE); static storage. Timings depend on it (README, Speed). */
PF_API const char *pf_blas_core(void);

/* NULL when pf_blas_core() is the best OpenBLAS kernel set for this CPU's instructions; else the
 * set to ask for: "SkylakeX" when the CPU has AVX-512 (F, BW, VL, DQ), "Haswell" when it has
 * AVX2 and FMA, and OpenBLAS runs an older set. OpenBLAS chooses from a table of CPU models and
 * falls back to a generic set on a model it does not know (0.3.21 on Intel family 6 model 207:
 * "Prescott", SSE3, whose sgemm runs at a fifth of the speed: exact attention and the language
 * model's linear layers slow down as much as 3x). On AMD's AVX2 cores (Zen 1 to 3) it runs its
 * "Zen" set, Haswell's sgemm with plain C loops to zero and pack: "Haswell" is advised there
 * (on a Zen 4 made to run either, exact attention is 3-10% faster). The remedy: the environment
 * variable OPENBLAS_CORETYPE set to this name before OpenBLAS loads, that is before the process
 * starts (`OPENBLAS_CORETYPE=SkylakeX ./app`); setting it later has no effect. The performer
 * tool does this itself. Static storage. */
PF_API const char *pf_blas_core_advised(void);

/* The vector path of the library's own kernels: "avx512", "avx2" (x86-64), "neon" (aarch64) or
 * "ref" (portable C), the widest this CPU runs unless the environment variable PF_SIMD names
 * another it runs. They make
 * the features (exp, sin, cos) and run every FAVOR+ matrix product; static storage. */
PF_API const char *pf_simd_path(void);

/* y[i] = exp(x[i]) for n floats with the library's vector kernel (pf_simd_path): the features'
 * own exp, for callers with exponentials of their own (the language model's GELU). Relative
 * error within 2 ulp of float (test_simd checks it against double); NaN stays NaN, x > 88.72
 * gives +inf and x <= -104 gives 0, as expf. y may be x; otherwise they must not overlap. */
PF_API void pf_exp(float *y, const float *x, size_t n);

/* ---------------------------------------------------------------------------------------------
 * Randomness: Philox4x32-10 (Salmon et al. 2011), counter based.
 * A (seed, stream) pair gives the same numbers on every machine and at any thread count.
 * ------------------------------------------------------------------------------------------ */

typedef struct pf_rng {
    uint32_t key[2];     /* from the seed */
    uint32_t ctr[4];     /* ctr[0..1]: block counter, ctr[2..3]: stream */
    uint32_t buf[4];     /* the current output block */
    int used;            /* words of buf already handed out (4: empty) */
    int has_spare;       /* a second normal from Box-Muller is waiting */
    double spare;
} pf_rng;

/* One Philox4x32-10 block: out = philox(ctr, key). For known-answer tests. */
PF_API void pf_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* Starts a generator at block 0 of (seed, stream). Returns PF_EINVAL if rng is NULL. */
PF_API pf_status pf_rng_init(pf_rng *rng, uint64_t seed, uint64_t stream);

/* The next 32 random bits. rng must be initialised. */
PF_API uint32_t pf_rng_u32(pf_rng *rng);

/* A uniform double in (0, 1): never 0, never 1. */
PF_API double pf_rng_uniform(pf_rng *rng);

/* A standard normal double (Box-Muller on two uniforms, both values used). */
PF_API double pf_rng_normal(pf_rng *rng);

/* Fills out[0..n) with standard normals. PF_EINVAL on NULL (n == 0 is fine). */
PF_API pf_status pf_rng_fill_normal(pf_rng *rng, float *out, size_t n);

/* ---------------------------------------------------------------------------------------------
 * Random projections W (the Performer's orthogonal random features, Choromanski et al. 2020)
 * ------------------------------------------------------------------------------------------ */

typedef enum pf_proj_kind {
    PF_PROJ_IID = 0,        /* every entry N(0,1) */
    PF_PROJ_ORTHOGONAL = 1  /* stacked Haar-random orthogonal d x d blocks, last one cut */
} pf_proj_kind;

typedef enum pf_norm_kind {
    PF_NORM_CHI = 0,   /* each row's length is that of an independent N(0,I_d) vector (default) */
    PF_NORM_SQRTD = 1, /* every row has length sqrt(d) */
    PF_NORM_QMC = 2    /* lengths are chi_d quantiles at i/(m+1), randomly permuted over rows */
} pf_norm_kind;

/* Draws W (m,d) from (seed, stream). For PF_PROJ_IID with PF_NORM_CHI the rows are used as
 * drawn; the other norms rescale each iid row to the chosen length. Same arguments, same W, on
 * every machine. Returns PF_EINVAL on NULL W, m <= 0, d <= 0 or an unknown kind; PF_ENOMEM. */
PF_API pf_status pf_projection_draw(float *W, int m, int d, pf_proj_kind kind, pf_norm_kind norm,
                                    uint64_t seed, uint64_t stream);

/* The stream a training loop uses to redraw W every `every` steps (every <= 0: never redraw). */
PF_API uint64_t pf_projection_stream(uint64_t step, int64_t every);

/* Regularised lower incomplete gamma P(a, x), a > 0, x >= 0; NaN outside the domain. */
PF_API double pf_gamma_p(double a, double x);

/* Its inverse in x: the x with P(a, x) = p, for a > 0 and 0 <= p <= 1; NaN outside. */
PF_API double pf_gamma_p_inv(double a, double p);

/* The p-quantile of the chi distribution with k degrees of freedom: sqrt(2 * P^-1(k/2, p)). */
PF_API double pf_chi_quantile(int k, double p);

/* ---------------------------------------------------------------------------------------------
 * Feature maps (the Performer's, Choromanski et al. 2020, and their successors). Inputs x are
 * scaled by sqrt(scale) first, so phi(q).phi(k) estimates exp(scale q.k).
 * ------------------------------------------------------------------------------------------ */

typedef enum pf_kernel {
    PF_KERNEL_POSITIVE = 0,   /* exp(Wx - |x|^2/2)/sqrt(m): FAVOR+, r = m (default) */
    PF_KERNEL_HYPERBOLIC = 1, /* exp(-|x|^2/2)/sqrt(2m) [exp(Wx), exp(-Wx)], r = 2m */
    PF_KERNEL_TRIG = 2,       /* exp(|x|^2/2)/sqrt(m) [sin(Wx), cos(Wx)], r = 2m */
    PF_KERNEL_RELU = 3,       /* relu(Wx)/sqrt(m) + eps, r = m: not a softmax estimate */
    PF_KERNEL_OPRF = 4,       /* FAVOR++: D/sqrt(m) exp(A|w|^2 + B w.x - |x|^2/2), r = m */
    PF_KERNEL_SDERF = 5,      /* FAVOR#: matrix A from the data's second moments, r = m */
    PF_KERNEL_ELU = 6         /* elu(Wx) + 1 + eps, r = m: not a softmax estimate (see below) */
} pf_kernel;

/* PF_KERNEL_ELU is the linear attention of Katharopoulos et al. (2020, "Transformers are RNNs"),
 * phi(x) = elu(x') + 1 elementwise, when W is the identity I_d (m = d): that is the contract, W is
 * read like every map's W, and phi(x)_f = elu(w_f.x') + 1 + eps for any W (m, d), with
 * elu(u) = u for u > 0, exp(u) - 1 otherwise. No randomness is involved: pass W = I_d for the
 * plain linear attention (a drawn W gives a random-projection variant). The features lie in
 * (0, 1 + |x'| max|w|]: logscale is 0 as for relu, and eps is absolute. */

/* The feature width r of a kernel with m projections (m or 2m); 0 for an unknown kernel. */
PF_API int pf_kernel_width(pf_kernel kernel, int m);

/* Parses "positive", "hyperbolic", "trig", "relu", "oprf" (or "favor++"), "sderf" (or "favor#"),
 * "elu" (or "elu+1"); PF_EINVAL for anything else. pf_kernel_name gives the first spelling. */
PF_API pf_status pf_kernel_parse(const char *name, pf_kernel *kernel);
PF_API const char *pf_kernel_name(pf_kernel kernel);

/* Features of n rows X (n,d) with W (m,d): phi (n,r), r = pf_kernel_width(kernel, m).
 *
 * If logscale is NULL, phi holds the features themselves (which can overflow: PF_ENONFINITE).
 * Otherwise each row is stabilised: phi holds phi(x) / exp(logscale[i]) and logscale (n) the
 * removed log factor, chosen so the row's largest |feature| is O(1). For relu and elu, logscale
 * is 0.
 *
 * eps (>= 0) is added to every feature: for the softmax maps relative to the row's largest
 * |feature| (phi + eps * max|phi|, so it commutes with stabilisation and stays causal), for relu
 * and elu absolutely (relu(Wx)/sqrt(m) + eps, elu(Wx) + 1 + eps). */
PF_API pf_status pf_features(float *phi, float *logscale, const float *X, int n, int d,
                             const float *W, int m, pf_kernel kernel, float scale, float eps);

/* FAVOR++ / FAVOR# (Likhosherstov et al. 2022, "Chefs' Random Tables"; 2023, "FAVOR#"): the
 * parameters of the OPRF and SDERF maps. They are constants of a forward pass (no gradient flows
 * into them); both sides of an attention must use the same. */
typedef struct pf_kernel_params {
    float oprf_a;         /* PF_KERNEL_OPRF: the scalar A < 1/8 (A = 0 is the positive map) */
    const float *sderf_A; /* PF_KERNEL_SDERF: the symmetric A (d,d), I - 4A positive definite */
    const float *sderf_B; /* PF_KERNEL_SDERF: B (d,d), the symmetric square root of I - 4A */
    double sderf_log_D;   /* PF_KERNEL_SDERF: log D = log det(I - 4A) / 4 */
} pf_kernel_params;

/* pf_features for every kernel: params is read by OPRF and SDERF (required there) and ignored by
 * the others (may be NULL). pf_features itself refuses OPRF and SDERF (PF_EINVAL). PF_EINVAL
 * also for A >= 1/8 or not finite, NULL matrices or a log D that is not finite; PF_ENONFINITE
 * for a matrix holding NaN or Inf. */
PF_API pf_status pf_features_ex(float *phi, float *logscale, const float *X, int n, int d,
                                const float *W, int m, pf_kernel kernel, float scale, float eps,
                                const pf_kernel_params *params);

/* FAVOR++'s optimal A for queries Q (Lq,d) and keys K (Lk,d) (pass only valid rows; padding is
 * excluded by passing the valid lengths), inputs scaled once by sqrt(scale) (0: 1/sqrt(d)):
 * s = mean|q'|^2 + mean|k'|^2 + 2 mean(q').mean(k'), each side over its own rows, rho = s/d,
 * A* = (1 - 2 rho - sqrt((2 rho + 1)^2 + 8 rho)) / 16 <= 0, the A minimising the mean over pairs
 * of the log second moment of a feature product. PF_EINVAL, PF_ENONFINITE (NaN/Inf input). */
PF_API pf_status pf_oprf_optimal_a(float *A, const float *Q, int Lq, const float *K, int Lk,
                                   int d, float scale);

/* FAVOR#'s parameters from Q (Lq,d) and K (Lk,d) (valid rows only), scaled as above:
 * P = M_q + M_k + mu_q mu_k^T + mu_k mu_q^T (M the mean of x' x'^T, mu the mean of x', each side
 * over its own rows) = U diag(sigma) U^T (LAPACK dsyev), a_i = A*(sigma_i) as above,
 * A = U diag(a) U^T, B = U diag(sqrt(1 - 4a)) U^T (A, B (d,d), row-major) and
 * *log_D = sum_i log(1 - 4 a_i) / 4. PF_EINVAL, PF_ENONFINITE, PF_ENOMEM, PF_EDOMAIN if the
 * eigensolver fails. */
PF_API pf_status pf_sderf_params(float *A, float *B, double *log_D, const float *Q, int Lq,
                                 const float *K, int Lk, int d, float scale);

/* ---------------------------------------------------------------------------------------------
 * Attention
 * ------------------------------------------------------------------------------------------ */

typedef struct pf_shape {
    int B, H;    /* batch, heads */
    int Lq, Lk;  /* query and key lengths (equal when causal) */
    int d, dv;   /* query/key width, value width */
} pf_shape;

/* The most threads a call may ask for (pf_attn_opts.threads); more is PF_EINVAL, and
 * OpenMP's default (threads 0) is capped here too. */
#define PF_MAX_THREADS 1024

typedef struct pf_attn_opts {
    float scale;              /* logit scale s; 0 means 1/sqrt(d) */
    int causal;               /* 1: query i sees keys j <= i only; needs Lq == Lk */
    const int32_t *key_len;   /* B valid key lengths in [1, Lk], or NULL for all Lk */
    int threads;              /* 0: OpenMP's default; 1..PF_MAX_THREADS; results never
                                 depend on it */
} pf_attn_opts;

typedef struct pf_favor_opts {
    pf_kernel kernel;         /* feature map, default PF_KERNEL_POSITIVE */
    const float *W;           /* projection (m,d), or (H,m,d) when w_per_head */
    int m;                    /* rows of W (number of random projections) */
    int w_per_head;           /* 0: one W for every head; 1: W holds one (m,d) block per head */
    float eps;                /* kernel epsilon (see pf_features), default 0 */
    int chunk;                /* causal chunk length; 0: chosen from d and r */
    int oprf_a_given;         /* FAVOR++: 1 uses oprf_a; 0 takes the optimal A from each head's
                                 queries and keys (bidirectional only: a causal A must be given) */
    float oprf_a;             /* FAVOR++: A, with A < 1/8 (A = 0 is FAVOR+) */
} pf_favor_opts;

PF_API pf_attn_opts pf_attn_opts_default(void);
PF_API pf_favor_opts pf_favor_opts_default(void);

/* Checks a shape and options against each other: PF_OK or PF_EINVAL. */
PF_API pf_status pf_attn_check(const pf_shape *shape, const pf_attn_opts *opts);

/* Exact softmax attention, online softmax over key blocks; extra memory
 * O(block * (d + dv)) per thread. out (B,H,Lq,dv). lse, if not NULL, receives the log of each
 * row's softmax denominator, log sum_j exp(s q_i.k_j), as (B,H,Lq) (the backward pass needs it).
 * A query that sees no key (every key padded) is PF_EDOMAIN. */
PF_API pf_status pf_attn_exact(float *out, float *lse, const float *Q, const float *K,
                               const float *V, const pf_shape *shape, const pf_attn_opts *opts);

/* The naive reference for pf_attn_exact: one query at a time, scores in float64. Same contract.
 * Slow; for tests and for checking other implementations. */
PF_API pf_status pf_attn_exact_ref(float *out, float *lse, const float *Q, const float *K,
                                   const float *V, const pf_shape *shape,
                                   const pf_attn_opts *opts);

/* FAVOR+ attention (Choromanski et al. 2020): out = D^-1 phi(Q) (phi(K)^T V), bidirectional or
 * chunked causal, memory O(L (r + d + dv)) per head. Padded keys contribute nothing. A denominator
 * that is zero or not finite is PF_EDOMAIN (or PF_ENONFINITE), never a NaN in out. FAVOR++ takes A
 * per (batch element, head) from that head's queries and valid keys unless oprf_a_given (causal:
 * required, PF_EINVAL otherwise); FAVOR# is fitted likewise, bidirectional only (PF_ENOTSUP). */
PF_API pf_status pf_attn_favor(float *out, const float *Q, const float *K, const float *V,
                               const pf_shape *shape, const pf_attn_opts *opts,
                               const pf_favor_opts *favor);

/* Element types: of .npy arrays (pf_array), and of Q, K, V and out in the *_dt calls, which take
 * PF_F32, PF_F16 and PF_BF16. */
typedef enum pf_dtype {
    PF_F32 = 0,  /* float32 */
    PF_I32 = 1,  /* int32 (.npy only) */
    PF_I64 = 2,  /* int64 (.npy only) */
    PF_F16 = 3,  /* IEEE float16 (binary16), stored as uint16_t */
    PF_BF16 = 4  /* bfloat16 (float32's top 16 bits), stored as uint16_t */
} pf_dtype;

/* Bytes of one element of dt (4, 8 or 2); 0 for an unknown one. */
PF_API size_t pf_dtype_size(pf_dtype dt);

/* n elements of src (of type from) into dst (of type to), for from, to in PF_F32, PF_F16,
 * PF_BF16: half to float32 is exact, float32 to half rounds to nearest, ties to even (Inf past
 * the largest value, NaN kept). dst and src must not overlap unless they are the same and the
 * types too. PF_EINVAL for another type or NULL with n > 0. */
PF_API pf_status pf_convert(void *dst, pf_dtype to, const void *src, pf_dtype from, size_t n);

/* pf_attn_favor with Q, K, V and out in dtype. The kernels convert each block of rows to float32
 * as they read it (F16C on x86-64 CPUs that have it, a portable path elsewhere: the same
 * values) and round each block of outputs to dtype as they write it (to nearest, ties to even):
 * no float32 copy of a tensor is made, and the arithmetic and states are float32. The outputs
 * are pf_attn_favor's on the same inputs widened to float32, rounded once to dtype (bit for bit:
 * the same kernels run on the same values). FAVOR++ and FAVOR# (whose fits read whole tensors)
 * are PF_ENOTSUP here; an unknown dtype is PF_EINVAL. A NaN or Inf in a half input is
 * PF_ENONFINITE, as in float32. */
PF_API pf_status pf_attn_favor_dt(void *out, const void *Q, const void *K, const void *V,
                                  pf_dtype dtype, const pf_shape *shape, const pf_attn_opts *opts,
                                  const pf_favor_opts *favor);

/* The reference for pf_attn_favor: the explicit formula in float64, per head materialising
 * phi(Q) and phi(K), causal by a running prefix sum. Same contract. For tests. */
PF_API pf_status pf_attn_favor_ref(float *out, const float *Q, const float *K, const float *V,
                                   const pf_shape *shape, const pf_attn_opts *opts,
                                   const pf_favor_opts *favor);

/* ---------------------------------------------------------------------------------------------
 * Streaming causal FAVOR+ (decoding): the state (S, z, running key max) of H heads of one
 * sequence, advanced a token or a chunk at a time. Memory and time per token O(H r dv),
 * whatever the context length. Rows come out as the causal pf_attn_favor gives them.
 * ------------------------------------------------------------------------------------------ */

typedef struct pf_favor_state pf_favor_state;

/* Creates an empty state for H heads of widths d, dv. favor->W is copied (the state does not
 * keep the caller's pointer); scale as in pf_attn_opts (0: 1/sqrt(d)). */
PF_API pf_status pf_favor_state_create(pf_favor_state **state, int H, int d, int dv, float scale,
                                       const pf_favor_opts *favor);

/* Frees a state; harmless on NULL. */
PF_API void pf_favor_state_free(pf_favor_state *state);

/* Empties the state (position 0) keeping W. */
PF_API pf_status pf_favor_state_reset(pf_favor_state *state);

/* Advances by n >= 1 tokens: q, k (H,n,d), v (H,n,dv) -> out (H,n,dv), each row attending to every
 * earlier token and itself. Steps are cut into chunks at the multiples of C counted from
 * position 0, where the causal pf_attn_favor cuts them, so steps whose sizes are multiples of C
 * (the last may be shorter) give the same bits as pf_attn_favor on the (1, H, L) inputs when
 * that pass scans each head in one piece: H >= 4, or L <= 4 feature blocks (1024 rows at the
 * default C = 16). With fewer heads a longer pass cuts each head into scan blocks run in
 * parallel, whose starting states are the same sums associated differently; the rows then
 * agree to float rounding (relative 1e-6), as do steps of other sizes (1 when decoding).
 * A step that fails (a non-finite input, a zero denominator: PF_EDOMAIN with those rows 0, ...)
 * leaves the state exactly as it was, position included: retrying it with corrected inputs
 * gives the bits of a stream that never failed. */
PF_API pf_status pf_favor_state_step(pf_favor_state *state, float *out, const float *q,
                                     const float *k, const float *v, int n);

/* pf_favor_state_step with q, k, v and out in dtype (pf_dtype): the call's rows are widened to
 * float32 (n H (2 d + dv) floats, one token's worth when decoding), stepped in float32 (the
 * state is float32 whatever the dtype), and the outputs rounded to dtype; the rows equal
 * pf_favor_state_step's on the widened inputs, rounded once. */
PF_API pf_status pf_favor_state_step_dt(pf_favor_state *state, void *out, const void *q,
                                        const void *k, const void *v, int n, pf_dtype dtype);

/* Tokens consumed so far (0 for NULL); of sequence 0 in a state of several. */
PF_API int64_t pf_favor_state_position(const pf_favor_state *state);

/* Many sequences in one state, for an engine that serves several at once (beams, users,
 * speculative drafts): N sequences x H heads with one W, each sequence at its own position.
 * pf_favor_state_create is pf_favor_state_create_n with N = 1, and the single-sequence calls
 * above act on sequence 0. A state's memory is N H r (dv + 1) floats (rounded up per row to 16)
 * plus O(N H r) for the pending updates. */
PF_API pf_status pf_favor_state_create_n(pf_favor_state **state, int N, int H, int d, int dv,
                                         float scale, const pf_favor_opts *favor);
/* N (0 for NULL). */
PF_API int pf_favor_state_sequences(const pf_favor_state *state);
/* Sequence seq's position, or -1 for a bad argument. */
PF_API int64_t pf_favor_state_position_of(const pf_favor_state *state, int seq);

/* One token for each of count sequences: seqs[i] (NULL: sequences 0..count-1), each named once;
 * q, k (count, H, d), v (count, H, dv) -> out (count, H, dv). One product projects every row,
 * and the (sequence, head) pairs run on the library's threads. Each sequence succeeds or fails
 * on its own: statuses[i] (if not NULL) gets its status, a sequence that failed is left exactly
 * as it was (its rows of out zeros), the others advance. Returns the worst status; PF_EINVAL
 * (nothing stepped) for a bad argument. Rows equal pf_favor_state_step's for that sequence bit
 * for bit. */
PF_API pf_status pf_favor_state_step_n(pf_favor_state *state, float *out, const float *q,
                                       const float *k, const float *v, const int32_t *seqs,
                                       int count, pf_status *statuses);

/* A prompt of n >= 1 tokens into sequence seq from where it stands: q, k (H, n, d), v (H, n, dv)
 * -> out (H, n, dv), by the causal pass's chunks (pf_favor_state_step is this for sequence 0).
 * Decoding after it gives what stepping each token would, to float rounding (the sums are
 * associated by chunks instead of tokens); prefills whose sizes are multiples of the chunk C
 * counted from position 0 give the bits of one prefill of them all. On failure the sequence is
 * as it was. */
PF_API pf_status pf_favor_state_prefill(pf_favor_state *state, int seq, float *out,
                                        const float *q, const float *k, const float *v, int n);

/* Empties sequence seq (position 0). */
PF_API pf_status pf_favor_state_reset_seq(pf_favor_state *state, int seq);
/* Sequence dst becomes a copy of sequence src (branching: its next tokens continue src's
 * context); dst == src does nothing. */
PF_API pf_status pf_favor_state_copy_seq(pf_favor_state *state, int dst, int src);

/* Snapshots of one sequence: its position, per-head reference and state, behind a header naming
 * H, d, dv, r, the feature map and a fingerprint of W, scale, eps and (FAVOR++) A, and a CRC-32.
 * pf_favor_state_snapshot_bytes gives the size; _save writes it into buf (len at least that);
 * _load restores sequence seq from one, refusing (and changing nothing) a snapshot of another
 * shape, map or W (PF_EINVAL), of another version or byte order, truncated or corrupted
 * (PF_EFORMAT), with errmsg (if not NULL, errlen bytes) saying why. The _file forms write
 * atomically (a temporary file renamed over path) and read a regular file. A restored sequence
 * continues with the bits the saved one would have given. */
PF_API size_t pf_favor_state_snapshot_bytes(const pf_favor_state *state);
PF_API pf_status pf_favor_state_save(pf_favor_state *state, int seq, void *buf, size_t len);
PF_API pf_status pf_favor_state_load(pf_favor_state *state, int seq, const void *buf, size_t len,
                                     char *errmsg, size_t errlen);
PF_API pf_status pf_favor_state_save_file(pf_favor_state *state, int seq, const char *path,
                                          char *errmsg, size_t errlen);
PF_API pf_status pf_favor_state_load_file(pf_favor_state *state, int seq, const char *path,
                                          char *errmsg, size_t errlen);

/* ---------------------------------------------------------------------------------------------
 * FAVOR+ in slices (sequence parallelism): a sequence cut into contiguous slices, say one per
 * process, each holding its rows of Q, K, V. A slice's keys reduce to a state per head,
 *     S = sum_j phi~(k_j) e^(c_j - M) [v_j | 1]   (r x (dv+1), r = pf_kernel_width)
 * with its reference M (double; the largest key log factor c_j, -inf for no key): the causal
 * scan's state, so combining states rebases to the larger reference exactly as the
 * running maximum does. Bidirectional attention reads the combined state of every slice;
 * causal attention starts each slice's scan from the combined state of the slices before it.
 * The backward exchanges d/dS the same way. Nothing here communicates: the MPI library
 * (performer_mpi.h) moves these states, O(H r dv) floats per head and call, whatever L.
 *
 * Conventions of every pf_favor_slice_* function: shape gives the slice's own lengths (Lq, Lk:
 * its query and key rows; causal: equal) and Q, K, V, out, dout are its rows, laid out as
 * everywhere (B,H,L,.). opts->key_len, if not NULL, gives the number of valid keys *of this
 * slice* per batch element, in [0, Lk] (the global valid length minus the slice's first key,
 * clamped): 0 is allowed here. States are (B,H,r,dv+1) floats with references (B,H). sums is
 * what FAVOR++ without a given A and FAVOR# fit to (pf_favor_slice_sums, added over every
 * slice); NULL for the other maps. Results do not depend on the thread count.
 *
 * Equal to the single process: one slice holding the whole sequence gives pf_attn_favor's and
 * pf_attn_favor_backward's bits. With several, the sums over keys are associated per slice and
 * causal chunks of C are cut from each slice's first row (the single pass cuts them from
 * position 0): the outputs and gradients agree to float rounding (relative 1e-6), and are the
 * same bits for the same slices whatever the thread count.
 * ------------------------------------------------------------------------------------------ */

/* The checks every pf_favor_slice_* function makes of its shape and options, pf_attn_favor's
 * with key lengths in [0, Lk]: PF_OK, PF_EINVAL, PF_ENOTSUP (causal FAVOR#) or PF_ENONFINITE
 * (W). */
PF_API pf_status pf_favor_slice_check(const pf_shape *shape, const pf_attn_opts *opts,
                                      const pf_favor_opts *favor);

/* Doubles per head of the fit statistics (B H times this in all): nonzero for FAVOR++ without a
 * given A (4 + 2d) and FAVOR# (4 + 2d + 2d^2); 0 for the other maps, which need none. */
PF_API size_t pf_favor_slice_sums_len(const pf_shape *shape, const pf_favor_opts *favor);

/* The slice's fit statistics per (b, h): row counts, sums of |x|^2, column sums and (FAVOR#)
 * second moments of its queries and of its valid keys, unscaled, into sums (B, H,
 * pf_favor_slice_sums_len). They add up elementwise over slices (add them in slice order for
 * reproducible bits); the fitted A is then the single process's. PF_EINVAL (arguments, or a
 * kernel that needs none), PF_ENONFINITE (NaN or Inf in Q or the valid K). */
PF_API pf_status pf_favor_slice_sums(double *sums, const float *Q, const float *K,
                                     const pf_shape *shape, const pf_attn_opts *opts,
                                     const pf_favor_opts *favor);

/* The slice's own key state: S (B,H,r,dv+1), M (B,H) from its valid keys K, V (a slice with no
 * valid key gives S = 0, M = -inf). Q may be NULL. PF_EINVAL (nothing written), PF_ENONFINITE
 * (NaN or Inf in K or V, or an overflowing projection), PF_ENOMEM; after these two, S = 0 and
 * M = -inf in every head. */
PF_API pf_status pf_favor_slice_state(float *S, double *M, const float *K, const float *V,
                                      const pf_shape *shape, const pf_attn_opts *opts,
                                      const pf_favor_opts *favor, const double *sums);

/* S (heads, r, dv+1) referenced to M (heads) becomes S + S2 (referenced to M2), referenced per
 * head to the larger reference: S = e^(M - M') S + e^(M2 - M') S2. A reference of -inf is an empty
 * state. Commutative bit for bit; combine slices in a fixed order (or a fixed tree) for
 * reproducible bits. PF_EINVAL on NULL, sizes < 1, or a reference (in M or M2) that is NaN or
 * +inf, as pf_favor_slice_attn refuses them; S and M are then unchanged. */
PF_API pf_status pf_favor_slice_combine(float *S, double *M, const float *S2, const double *M2,
                                        int heads, int r, int dv);

/* The slice's outputs out (B,H,Lq,dv). Bidirectional: from (S, M), the combined state of every
 * slice's keys (K and V are not read but checked). Causal: the slice's chunked scan started from
 * (S, M), the combined state of the slices before it (M = -inf: none; then the slice's first
 * key must be valid, PF_EINVAL otherwise). Statuses as pf_attn_favor's; PF_EINVAL also for a
 * reference that is NaN or +inf, PF_ENONFINITE for a non-finite S. */
PF_API pf_status pf_favor_slice_attn(float *out, const float *Q, const float *K, const float *V,
                                     const float *S, const double *M, const pf_shape *shape,
                                     const pf_attn_opts *opts, const pf_favor_opts *favor,
                                     const double *sums);

/* The gradient of sum(out * dout) over this slice's outputs with respect to the state (S, M)
 * they were computed from (as for pf_favor_slice_attn): dS (B,H,r,dv+1), referenced to M (a
 * gradient referenced to M is e^M times the gradient with respect to the unscaled state).
 * Bidirectional: sum_i q~_i dN~_i^T over the slice's queries; causal: the part of the scan's
 * suffix state that reaches its start, 0 where M = -inf. out, if not NULL, is the forward's
 * output, which saves recomputing the numerators. Statuses as pf_attn_favor_backward's. */
PF_API pf_status pf_favor_slice_dstate(float *dS, const float *dout, const float *Q,
                                       const float *K, const float *V, const float *out,
                                       const float *S, const double *M, const pf_shape *shape,
                                       const pf_attn_opts *opts, const pf_favor_opts *favor,
                                       const double *sums);

/* G (heads, r, dv+1), a state gradient referenced to MG (heads), becomes G + G2 (referenced to
 * MG2), referenced to the smaller reference: G = e^(M' - MG) G + e^(M' - MG2) G2. A reference
 * of +inf or -inf is an empty gradient (pf_favor_slice_dstate's dS is 0 where M = -inf); a NaN
 * one is PF_EINVAL (G and MG unchanged).
 * Commutative bit for bit. Causal: the gradient reaching slice p
 * from the later ones is the combination over q > p of pf_favor_slice_dstate's dS_q with their
 * starting references; its reference is then the state's after slice p, as
 * pf_favor_slice_backward wants it. PF_EINVAL on NULL or sizes < 1. */
PF_API pf_status pf_favor_slice_dcombine(float *G, double *MG, const float *G2, const double *MG2,
                                         int heads, int r, int dv);

/* The slice's gradients dQ (B,H,Lq,d), dK (B,H,Lk,d), dV (B,H,Lk,dv) of sum(out * dout) over
 * every slice's outputs (W and FAVOR++/FAVOR#'s A held constant). (S, M) as for
 * pf_favor_slice_attn. R (B,H,r,dv+1): bidirectional, the sum of every slice's dS (required);
 * causal, d/dS reaching this slice from the later ones (pf_favor_slice_dcombine), referenced to
 * the state after this slice (the combination of (S, M) and its own pf_favor_slice_state), or
 * NULL for the last slice. Statuses as pf_attn_favor_backward's. */
PF_API pf_status pf_favor_slice_backward(float *dQ, float *dK, float *dV, const float *dout,
                                         const float *Q, const float *K, const float *V,
                                         const float *out, const float *S, const double *M,
                                         const float *R, const pf_shape *shape,
                                         const pf_attn_opts *opts, const pf_favor_opts *favor,
                                         const double *sums);

/* ---------------------------------------------------------------------------------------------
 * Sampling estimators of softmax attention (Zheng et al. 2022): randomized attention (RA, unbiased,
 * quadratic) and LARA (linear, multiple importance sampling over chunk proposals).
 * Bidirectional only (opts->causal must be 0: PF_ENOTSUP otherwise); key padding honoured.
 * ------------------------------------------------------------------------------------------ */

typedef struct pf_sampling_opts {
    int samples;        /* RA: samples per query; LARA: samples per proposal (>= 1) */
    int proposals;      /* LARA: C contiguous chunks of queries and of keys, 1 <= C <= min(Lq,Lk) */
    int deterministic;  /* LARA: omega_c = mu_c (epsilon = 0); then samples must be 1 */
    uint64_t seed;      /* randomness: (seed, stream = b*H + h) per head, thread independent */
} pf_sampling_opts;

PF_API pf_sampling_opts pf_sampling_opts_default(void);

/* RA: for each query, S samples (j ~ softmax_j(q.k_j), omega = q + k_j + N(0,I)) of
 * f(omega) = sum_j xi(k_j,omega) v_j / sum_j xi(k_j,omega), averaged. Cost O(S Lq Lk d). */
PF_API pf_status pf_attn_ra(float *out, const float *Q, const float *K, const float *V,
                            const pf_shape *shape, const pf_attn_opts *opts,
                            const pf_sampling_opts *sampling);

/* LARA with the balance heuristic, in log space. Cost O(C S (Lq + Lk) (d + dv)). */
PF_API pf_status pf_attn_lara(float *out, const float *Q, const float *K, const float *V,
                              const pf_shape *shape, const pf_attn_opts *opts,
                              const pf_sampling_opts *sampling);

/* LARA's reference: the same estimator (same draws) computed naively in float64. */
PF_API pf_status pf_attn_lara_ref(float *out, const float *Q, const float *K, const float *V,
                                  const pf_shape *shape, const pf_attn_opts *opts,
                                  const pf_sampling_opts *sampling);

/* ---------------------------------------------------------------------------------------------
 * Backward passes. Each writes (overwrites, never accumulates into) dQ (B,H,Lq,d),
 * dK (B,H,Lk,d) and dV (B,H,Lk,dv): the gradients of sum(out * dout) for dout (B,H,Lq,dv).
 * Padded keys get zero gradients. Memory stays linear in L.
 * ------------------------------------------------------------------------------------------ */

/* Exact attention backward, flash-attention style: scores are recomputed block by block from
 * the forward's out and lse (as returned by pf_attn_exact), never an L x Lk matrix. */
PF_API pf_status pf_attn_exact_backward(float *dQ, float *dK, float *dV, const float *dout,
                                        const float *Q, const float *K, const float *V,
                                        const float *out, const float *lse,
                                        const pf_shape *shape, const pf_attn_opts *opts);

/* Its naive reference (row by row, float64). Same contract; out and lse may be NULL. */
PF_API pf_status pf_attn_exact_backward_ref(float *dQ, float *dK, float *dV, const float *dout,
                                            const float *Q, const float *K, const float *V,
                                            const pf_shape *shape, const pf_attn_opts *opts);

/* FAVOR+ backward through the linear attention, the feature map and the input scaling; W (and
 * FAVOR++/FAVOR#'s A) is a constant. Causal runs the chunked scan in reverse (no stored
 * per-position state). out, if not NULL, is the forward's output (B,H,Lq,dv) for these inputs
 * and options, which the backward then does not recompute; NULL recomputes it. Working memory:
 * bidirectional, the key features of one head (Lk x m floats) or of as many heads as fit in
 * 4 MiB; causal, the rows of one head per thread while they fit in 64 MiB (2.4 KiB a row at
 * m = 256 and dv = 64, 0.4 KiB when the forward kept the features), and beyond that segments
 * of 16 MiB (whatever L), for about a fifth more time. */
PF_API pf_status pf_attn_favor_backward(float *dQ, float *dK, float *dV, const float *dout,
                                        const float *Q, const float *K, const float *V,
                                        const float *out, const pf_shape *shape,
                                        const pf_attn_opts *opts, const pf_favor_opts *favor);

/* What a FAVOR+ forward keeps for its backward, so that the backward does not recompute it:
 * per head, the stabilised features of the queries and of the keys (L x r floats each, r the
 * feature width, with their log factors and maxima) and, causal, each chunk's masked scores
 * (L x C); bidirectional, K~^T [V|1]. A head whose features are kept has a backward of 6 units
 * of L d r matrix work instead of 9 (bidirectional; causal about 7.7 instead of 9.7), for about
 * 2 L r floats of memory: the speed/memory choice of any autodiff "save for backward"
 * (pf_attn_favor_backward is the low-memory end). Made for one shape and set of options (W,
 * scale, kernel, m, eps, chunk, causal, key lengths): pf_attn_favor_save fills it,
 * pf_attn_favor_backward_saved reads it; the gradients are bit for bit those of
 * pf_attn_favor_backward. */
typedef struct pf_favor_saved pf_favor_saved;

/* Creates storage for the given shape and options (checked as pf_attn_favor checks them),
 * keeping the features of every head if max_bytes is 0, else of as many heads (the first ones,
 * in (b, h) order) as fit in max_bytes, the others being recomputed by the backward; a few
 * bytes per head are held whatever max_bytes says. */
PF_API pf_status pf_favor_saved_create(pf_favor_saved **saved, const pf_shape *shape,
                                       const pf_attn_opts *opts, const pf_favor_opts *favor,
                                       size_t max_bytes);

/* Frees it; harmless on NULL. */
PF_API void pf_favor_saved_free(pf_favor_saved *saved);

/* Bytes it holds (0 for NULL): at most max_bytes when that is not 0 and not below the fixed
 * part. */
PF_API size_t pf_favor_saved_bytes(const pf_favor_saved *saved);

/* Heads whose features it keeps (0 for NULL). */
PF_API int pf_favor_saved_heads(const pf_favor_saved *saved);

/* Empties it (keeping its memory): its backward is PF_EINVAL until the next
 * pf_attn_favor_save, so features of an older forward are never taken for a newer one's.
 * Harmless on NULL. */
PF_API void pf_favor_saved_clear(pf_favor_saved *saved);

/* PF_OK if saved was made for this shape and these options (and, with filled 1, was filled by
 * a forward with these key lengths), else PF_EINVAL: whether a caller's storage still fits a
 * new call (the language model makes it again when the batch shape changes). */
PF_API pf_status pf_favor_saved_match(const pf_favor_saved *saved, const pf_shape *shape,
                                      const pf_attn_opts *opts, const pf_favor_opts *favor,
                                      int filled);

/* pf_attn_favor (same out, bit for bit) that also fills saved. PF_EINVAL if saved was made for
 * another shape or options. A forward that fails with PF_ENONFINITE or PF_ENOMEM leaves saved
 * empty (its backward is then PF_EINVAL). */
PF_API pf_status pf_attn_favor_save(float *out, const float *Q, const float *K, const float *V,
                                    const pf_shape *shape, const pf_attn_opts *opts,
                                    const pf_favor_opts *favor, pf_favor_saved *saved);

/* pf_attn_favor_backward from what pf_attn_favor_save kept for these same Q, K, V. PF_EINVAL if
 * saved is NULL, empty, or was made for another shape or options. */
PF_API pf_status pf_attn_favor_backward_saved(float *dQ, float *dK, float *dV, const float *dout,
                                              const float *Q, const float *K, const float *V,
                                              const float *out, const pf_shape *shape,
                                              const pf_attn_opts *opts, const pf_favor_opts *favor,
                                              const pf_favor_saved *saved);

/* Its reference: the explicit formula differentiated in float64 with materialised features. */
PF_API pf_status pf_attn_favor_backward_ref(float *dQ, float *dK, float *dV, const float *dout,
                                            const float *Q, const float *K, const float *V,
                                            const pf_shape *shape, const pf_attn_opts *opts,
                                            const pf_favor_opts *favor);

/* ---------------------------------------------------------------------------------------------
 * NumPy .npy files: format 1.0 to 3.0, C order, little-endian.
 * ------------------------------------------------------------------------------------------ */

#define PF_NPY_MAX_DIMS 8

typedef struct pf_array {
    pf_dtype dtype;
    int ndim;
    int64_t shape[PF_NPY_MAX_DIMS];
    void *data;               /* owned by the array; free with pf_array_free */
    void *map_;               /* (the library's) the file mapping data lies in, or NULL */
    size_t map_len_;
} pf_array;

/* Element count of an array: the product of its shape (1 for rank 0; 0 for NULL or an array
 * emptied by pf_array_free, whose shape is (0,)); -1 if ndim or a dimension is out of range or
 * the product overflows. */
PF_API int64_t pf_array_size(const pf_array *a);

/* Reads a .npy file of dtype <f4, <i4 or <i8 into a (a's old contents are not freed). On
 * failure a is left empty and errmsg (if not NULL, errlen bytes) says what was wrong, naming the
 * file: PF_EIO if it cannot be opened or read, PF_EFORMAT for anything else (other dtypes,
 * Fortran order, a bad header, truncated data, or bytes after the data). */
PF_API pf_status pf_npy_read(const char *path, pf_array *a, char *errmsg, size_t errlen);

/* pf_npy_read without the copy: the data of a large array (1 MiB or more) is mapped from the
 * file (private: writes through a->data stay in this process), the same checks made first;
 * smaller arrays, and files that cannot be mapped, are read. pf_array_free unmaps. The file
 * must not be truncated while it is mapped (the system would end the process with SIGBUS
 * on the next access); replacing it by rename, as pf_npy_write does, is safe. */
PF_API pf_status pf_npy_map(const char *path, pf_array *a, char *errmsg, size_t errlen);

/* Writes a .npy file (format 1.0) atomically: to a temporary name in the same folder, then
 * renamed. On failure nothing is left at path. */
PF_API pf_status pf_npy_write(const char *path, const pf_array *a, char *errmsg, size_t errlen);

/* Frees a's data and empties it; harmless on an empty array or NULL. */
PF_API void pf_array_free(pf_array *a);

/* ---------------------------------------------------------------------------------------------
 * Files: how the library's readers and writers (.npy, checkpoints, corpora) treat files, for a
 * program's own. An input is read only if it is a regular file (a FIFO with no writer would
 * block, /dev/zero never end). An output replaces only a regular file or nothing (a symbolic
 * link, folder or device there is refused, never replaced), and only whole: it is written to a
 * new temporary file beside it, "<path>.tmp.XXXXXX", which is then renamed over it.
 * ------------------------------------------------------------------------------------------ */

/* Opens path for reading if it is a regular file and returns the descriptor (close-on-exec; the
 * caller closes it), its size in *size and PF_OK in *st. Anything else is refused before it can
 * block: the open does not wait (a FIFO with no writer would), and a folder, FIFO, device or
 * socket is PF_EIO with errmsg saying what it is. Returns -1 with *st set on failure: PF_EIO, or
 * PF_EINVAL for a NULL or empty path or a NULL size. st may be NULL; errmsg (if not NULL, errlen
 * bytes) names the file. */
PF_API int pf_io_open_regular(const char *path, int64_t *size, pf_status *st, char *errmsg,
                              size_t errlen);

/* Reads exactly n bytes from fd into buf, retrying on interruptions and short reads. PF_OK;
 * PF_EIO on a read error or an early end (the file shrank while it was read), errmsg naming path
 * (used for messages only); PF_EINVAL for fd < 0 or a NULL buf (n > 0). */
PF_API pf_status pf_io_read_all(int fd, void *buf, size_t n, const char *path, char *errmsg,
                                size_t errlen);

/* PF_OK if path may be replaced by a new regular file: nothing is there, or a regular file. A
 * symbolic link, folder, device, FIFO or socket is PF_EIO, errmsg saying what it is (replacing
 * `--out /dev/null` run as root would destroy the device; writing through a link is not done
 * silently); a NULL or empty path is PF_EINVAL. For a check before long work: every writer
 * checks again. */
PF_API pf_status pf_io_check_dest(const char *path, char *errmsg, size_t errlen);

/* An atomic replacement in progress: write to fd, then pf_io_atomic_finish. */
typedef struct pf_io_atomic {
    int fd;    /* the temporary file, open for writing */
    char *tmp; /* its name, beside the destination (owned: pf_io_atomic_finish frees it) */
} pf_io_atomic;

/* Checks path (pf_io_check_dest) and creates a new empty temporary file beside it, mode 0666
 * less the umask like any new file: "<path>.tmp.XXXXXX", the destination's name shortened where
 * that would pass the longest name a folder holds. PF_OK; PF_EIO, PF_EINVAL (w NULL too) or
 * PF_ENOMEM with errmsg naming path, nothing created. */
PF_API pf_status pf_io_atomic_begin(pf_io_atomic *w, const char *path, char *errmsg,
                                    size_t errlen);

/* Ends a replacement begun by pf_io_atomic_begin. With err 0 (every write succeeded) the file is
 * flushed to disk, path checked again and the file renamed over path; otherwise, or if any of
 * that fails, the temporary file is removed and path left as it was. err: 0, the errno of a
 * failed write, or -1 for a failure the caller reports itself. w->fd is closed and w->tmp freed
 * either way. PF_OK; PF_EIO with errmsg naming path; PF_EINVAL for a w not begun. */
PF_API pf_status pf_io_atomic_finish(pf_io_atomic *w, const char *path, int err, char *errmsg,
                                     size_t errlen);

/* The temporary files of replacements in progress, the library's writers' and those of
 * pf_io_atomic_begin, are listed (64 at once; one beyond is still removed on any failure but a
 * signal), so that a process ended by a signal can remove them: pf_io_temp_remove_all only
 * unlinks (async-signal-safe), for a signal handler that then ends the process. A caller that
 * takes a temporary file over, closing w.fd and renaming or removing w.tmp itself rather than
 * calling pf_io_atomic_finish (to put several files in place together), calls
 * pf_io_temp_forget(w.tmp) before it does, then frees w.tmp. NULL is harmless. */
PF_API void pf_io_temp_forget(const char *tmp);
PF_API void pf_io_temp_remove_all(void);

/* ---------------------------------------------------------------------------------------------
 * Language model: a decoder-only byte Transformer (pre-norm LayerNorm, causal multi-head
 * attention, GELU MLP of width 4C, input and output embeddings tied) whose attention is exact
 * softmax or FAVOR+. Tokens are bytes: int32 in [0, 256). Training is deterministic: the same
 * calls give the same bits at any thread count.
 * ------------------------------------------------------------------------------------------ */

#define PF_LM_VOCAB 256

/* The largest configuration pf_model_create accepts (and checkpoints may claim). */
#define PF_LM_MAX_CONTEXT (1 << 20)
#define PF_LM_MAX_LAYERS 1024
#define PF_LM_MAX_D_MODEL 65536
#define PF_LM_MAX_FEATURES 65536

typedef enum pf_lm_attention {
    PF_LM_EXACT = 0,   /* exact causal softmax attention */
    PF_LM_FAVOR = 1,   /* causal FAVOR+ with config.kernel and a fresh W every config.redraw */
    PF_LM_FAVORPP = 2, /* FAVOR++: OPRF features, A from a running average of training batches */
    PF_LM_LOCAL = 3    /* exact causal softmax over a window: query t sees keys t-window+1..t */
} pf_lm_attention;

typedef enum pf_lm_positions {
    PF_LM_LEARNED = 0, /* a learned (context, C) table added to the token embedding */
    PF_LM_ROTARY = 1   /* q and k rotated by position before the attention (and feature map) */
} pf_lm_positions;

typedef struct pf_model_config {
    int context;              /* T: longest sequence (learned positions: the table's length) */
    int layers;               /* L */
    int d_model;              /* C, a multiple of heads */
    int heads;                /* H; the head width C/H must be even for rotary positions */
    pf_lm_attention attention;
    pf_lm_positions positions;
    pf_kernel kernel;         /* FAVOR+ map, not OPRF/SDERF (relu gets eps 1e-3, others 0); elu
                                 is the linear attention elu(x') + 1: its W is the identity, so
                                 features must be C/H, and it is never drawn */
    int features;             /* m: rows of each layer's W (m, C/H), shared by the heads */
    int redraw;               /* a new W every `redraw` optimizer steps; 0: never */
    uint64_t seed;            /* the initial weights (GPT-2's initialisation) */
    uint64_t w_seed;          /* every W (orthogonal rows, chi norms), apart from seed; code
                               * that set seed alone to move W too now sets both */
    int window;               /* PF_LM_LOCAL's window w >= 1 (kept, >= 1, whatever the
                                 attention); w >= context is exact attention */
} pf_model_config;

typedef struct pf_model pf_model;

/* A small default: context 256, 4 layers, C 128, 4 heads, exact, learned positions, FAVOR
 * settings positive, m 64, redraw 1000, seed 1, w_seed 1, window 32. */
PF_API pf_model_config pf_model_config_default(void);

/* Creates a model with GPT-2's initialisation from config->seed and W (FAVOR) for step 0 from
 * config->w_seed. PF_EINVAL on a bad config, PF_ENOMEM. */
PF_API pf_status pf_model_create(pf_model **model, const pf_model_config *config);

/* Frees a model; harmless on NULL. */
PF_API void pf_model_free(pf_model *model);

/* The model's configuration, and its trainable parameter count. */
PF_API pf_model_config pf_model_get_config(const pf_model *model);
PF_API int64_t pf_model_num_params(const pf_model *model);

/* Training mode (1): pf_model_forward draws W for the current redraw period (from config.w_seed
 * and the step count) and updates running statistics (FAVOR++). Evaluation mode (0, the
 * default) keeps both as they are. */
PF_API pf_status pf_model_set_training(pf_model *model, int training);

/* Runs tokens (B,T), T <= context. With targets (B,T) (bytes, or -1 to ignore a position),
 * *loss receives the mean next-byte cross-entropy in nats over the counted positions; targets
 * and loss may both be NULL. logits (B,T,256), if not NULL, receives the logits. PF_EINVAL on
 * bad arguments or a byte outside [0, 256); errors of the attention are passed on. */
PF_API pf_status pf_model_forward(pf_model *model, float *loss, float *logits,
                                  const int32_t *tokens, const int32_t *targets, int B, int T);

/* Gradients of the last forward's loss (it must have had targets), overwriting the previous. */
PF_API pf_status pf_model_backward(pf_model *model);

/* ---- Training across processes ------------------------------------------------------------
 * A model can be one of several processes that train together, each running a share of every
 * step: a share of the batch (data parallel) or a contiguous slice of every sequence (sequence
 * parallel). libperformer_mpi (performer_mpi.h, pf_mpi_trainer) does this over MPI with the
 * functions below; they carry no MPI themselves, and a model given none of them trains alone. */

/* The loss of the last forward as a sum: *sum (float64) of the counted positions' losses and
 * *counted their number. PF_EINVAL if the last forward had no targets or failed. */
PF_API pf_status pf_model_loss_sum(const pf_model *model, double *sum, int64_t *counted);

/* pf_model_backward for a loss that is the sum of this forward's losses over `total` counted
 * positions of every process (total >= the forward's own count; 0 only if it counted none):
 * the gradients of (sum of this process's losses) / total. pf_model_backward(m) is
 * pf_model_backward_total(m, its own count). */
PF_API pf_status pf_model_backward_total(pf_model *model, int64_t total);

/* The parameters, *n floats in the order of the checkpoint's tensors (read only: change them
 * through pf_model_step), and the gradients of the last backward in the same order, to be summed
 * across processes before pf_model_step. NULL if model or n is NULL. */
PF_API const float *pf_model_parameters(const pf_model *model, size_t *n);
PF_API float *pf_model_gradients(pf_model *model, size_t *n);

/* Sequence parallel: how a process's forward and backward reach the rest of each sequence.
 * Its tokens are positions [position, position + T) of every sequence (positions and rotary
 * angles count from there); each layer's FAVOR attention over the whole sequence goes through
 * attn_forward and attn_backward (called collectively by every process, with this process's
 * rows: shape->Lq = Lk = T; pf_attn_favor's and pf_attn_favor_backward's contracts), and
 * `agree` returns the worst status of every process's for this point (the forward calls it
 * after its own checks and allocations, the backward before it starts), so that no process
 * waits in attention for one that failed. ctx is passed to all three. */
typedef struct pf_model_parallel {
    int64_t position;
    void *ctx;
    pf_status (*agree)(void *ctx, pf_status status);
    pf_status (*attn_forward)(void *ctx, float *out, const float *Q, const float *K,
                              const float *V, const pf_shape *shape, const pf_attn_opts *opts,
                              const pf_favor_opts *favor);
    pf_status (*attn_backward)(void *ctx, float *dQ, float *dK, float *dV, const float *dout,
                               const float *Q, const float *K, const float *V, const float *out,
                               const pf_shape *shape, const pf_attn_opts *opts,
                               const pf_favor_opts *favor);
} pf_model_parallel;

/* Makes the model's forwards and backwards this process's share of a sequence-parallel step
 * (copied; NULL: alone again). FAVOR and FAVOR++ with a given A only: PF_ENOTSUP for exact
 * attention (every query needs every key) and FAVOR++ (its statistic would be per process).
 * PF_EINVAL if position < 0 or a callback is missing. The forward checks position + T <= the
 * context. */
PF_API pf_status pf_model_set_parallel(pf_model *model, const pf_model_parallel *parallel);

typedef struct pf_adamw {
    float lr;            /* learning rate of this step */
    float beta1, beta2;  /* moment decays */
    float eps;           /* added to sqrt(v) */
    float weight_decay;  /* decoupled, applied to matrices and embeddings, not biases or norms */
    float clip;          /* clip the gradient to this global L2 norm; 0: no clipping */
} pf_adamw;

/* lr 3e-4, betas 0.9 and 0.95, eps 1e-8, weight decay 0.1, clip 1.0. */
PF_API pf_adamw pf_adamw_default(void);

/* One AdamW step from the current gradients; *grad_norm (if not NULL) receives their global
 * L2 norm before clipping. A gradient that is not finite is PF_ENONFINITE and changes nothing.
 * Advances the step count (which also schedules the FAVOR redraws). */
PF_API pf_status pf_model_step(pf_model *model, const pf_adamw *opt, float *grad_norm);

/* Optimizer steps taken (restored by pf_model_load). */
PF_API int64_t pf_model_steps(const pf_model *model);

/* The learning rate at step (0-based) of total: linear warm-up from lr/warmup to lr over
 * `warmup` steps, then a cosine from lr down to lr_min at step total. */
PF_API double pf_lr_schedule(int64_t step, int64_t total, int64_t warmup, double lr,
                             double lr_min);

/* ---- Training data: byte corpora -----------------------------------------------------------
 * A file's documents, split into training and validation by a hash of each document's bytes,
 * so the split depends on the contents only (not on their order; duplicates land on the same
 * side). A document is a FASTA record's sequence (its lines joined, then '\n') or a piece of a
 * text file ending at the first line end after every 2048 bytes.
 *
 *     pf_corpus c;
 *     pf_corpus_load(&c, "proteins.fasta.gz", PF_CORPUS_AUTO, 0.05, msg, sizeof msg);
 *     pf_corpus_batch(&c, PF_SPLIT_TRAIN, tokens, targets, B, T, seed, step);
 *     pf_model_forward(model, &loss, NULL, tokens, targets, B, T);
 *     pf_corpus_free(&c); */

typedef enum pf_corpus_format {
    PF_CORPUS_AUTO = 0, /* FASTA if the first byte that is not white space is '>', else text */
    PF_CORPUS_FASTA = 1,
    PF_CORPUS_TEXT = 2
} pf_corpus_format;

enum { PF_SPLIT_TRAIN = 0, PF_SPLIT_VAL = 1 };

/* The two splits, indexed PF_SPLIT_TRAIN and PF_SPLIT_VAL: each its documents' bytes one after
 * another, in file order. */
typedef struct pf_corpus {
    uint8_t *bytes[2]; /* owned by the corpus; free with pf_corpus_free */
    size_t n[2];       /* bytes of each split */
    size_t docs[2];    /* documents of each split */
} pf_corpus;

/* Reads the file at path (plain or gzip; a regular file of at most 2 GiB, also once inflated),
 * cuts it into documents as `format` says and splits them: a document goes to validation when
 * its 64-bit hash h has (h >> 11) 2^-53 < val_fraction, in [0, 1); when that leaves a split
 * empty and there are two documents or more, the document with the smallest hash (for
 * validation, if val_fraction > 0) or the largest (for training) moves over. c's old contents are
 * not freed; on failure c is left empty. PF_EINVAL: c or path NULL, format or val_fraction out of
 * range; PF_EIO: the file cannot be opened or read, or is not a regular file (a FIFO is refused
 * at once); PF_EFORMAT: a damaged gzip stream, a FASTA file with data before its first header, a
 * byte that is not a sequence letter or no sequence at all, a text that is empty or holds a NUL
 * byte (a binary file); PF_ENOMEM. errmsg (if not NULL, errlen bytes) says why, naming the file
 * (and the line). */
PF_API pf_status pf_corpus_load(pf_corpus *c, const char *path, pf_corpus_format format,
                                double val_fraction, char *errmsg, size_t errlen);

/* B windows of T + 1 consecutive bytes of a split (PF_SPLIT_TRAIN or PF_SPLIT_VAL) at offsets
 * drawn from (seed, stream): tokens (B,T) receive the first T bytes of each window, targets (B,T)
 * the last T, as pf_model_forward takes them. The same arguments give the same windows on every
 * machine. PF_EINVAL on a NULL pointer, B or T below 1, another split, or a split of fewer than
 * T + 1 bytes. */
PF_API pf_status pf_corpus_batch(const pf_corpus *c, int split, int32_t *tokens,
                                 int32_t *targets, int B, int T, uint64_t seed, uint64_t stream);

/* *hash: a 64-bit hash of the corpus's bytes, both splits: corpora with the same documents on
 * the same sides have the same one, so a run resumed later can check that its data are those it
 * began with. An identity, not a seal. PF_EINVAL on NULL. */
PF_API pf_status pf_corpus_hash(const pf_corpus *c, uint64_t *hash);

/* Frees c's bytes and empties it; harmless on an empty corpus or NULL. */
PF_API void pf_corpus_free(pf_corpus *c);

/* ---- Training data: multi-query associative recall (MQAR) ----------------------------------
 * The synthetic recall task of the Zoology study (Arora et al. 2023, "Zoology: measuring and
 * improving recall in efficient language models"), on bytes. A sequence of T tokens starts with
 * N key-value pairs k1 v1 k2 v2 ... kN vN; then Q of its keys are asked again, each at a query
 * position whose target is that key's value; every other position holds filler. Keys are bytes
 * [0, K), values [K, 2K), filler [2K, 256): the N keys of a sequence are distinct, and so are its
 * N values. The queries ask the keys in random order, every N queries a fresh permutation of
 * them (Q <= N: Q different keys; Zoology asks each key once, Q = N). As in Zoology, query j
 * sits at position 2N + 2g_j, the slots g drawn without replacement from [0, (T - 2N) / 2) with
 * weights 1/(g + 1) (to 2^-40; Zoology's power law with its a = 0.01 taken as 0: the queries
 * crowd towards the pairs but reach the end). Unlike Zoology, whose filler is any token, the
 * filler is never a key or a value (on 256 bytes it would often repeat a key). Only the answers
 * count: every other target is -1 (pf_model_forward skips those). The draws are integer
 * arithmetic only. */
typedef struct pf_mqar {
    int pairs;   /* N: 1..keys */
    int queries; /* Q: 1 or more */
    int keys;    /* K: key tokens, and as many value tokens; 1..127 (filler needs a byte) */
} pf_mqar;

/* 8 pairs, 8 queries (every key asked, as Zoology), 64 keys: the smallest context is 32. */
PF_API pf_mqar pf_mqar_default(void);

/* PF_OK if task is valid (1 <= N <= K <= 127, Q >= 1) and fits sequences of T tokens (2N + 2Q
 * <= T), else PF_EINVAL. */
PF_API pf_status pf_mqar_check(const pf_mqar *task, int T);

/* B sequences of T tokens into tokens (B,T) and targets (B,T), as pf_model_forward takes them.
 * Sequence b is a function of (seed, stream, b) alone (Philox blocks b 2^32 onward of (seed,
 * stream)), whatever B: the same arguments give the same sequences on every machine. PF_EINVAL on
 * a NULL pointer, B below 1 or a task pf_mqar_check refuses for T; PF_ENOMEM. */
PF_API pf_status pf_mqar_batch(const pf_mqar *task, int32_t *tokens, int32_t *targets, int B,
                               int T, uint64_t seed, uint64_t stream);

/* Writes the model to a safetensors file, atomically (a temporary file, then renamed): the
 * weights, the FAVOR projections, the configuration and step in "__metadata__", with
 * with_optimizer the AdamW moments too. meta: NULL or key, value, ..., NULL strings added to
 * the metadata (keys starting "pf." are reserved). PF_EIO, PF_EINVAL, PF_ENOMEM; errmsg (if not
 * NULL, errlen bytes) says what went wrong. */
PF_API pf_status pf_model_save(const pf_model *model, const char *path, const char *const *meta,
                               int with_optimizer, char *errmsg, size_t errlen);

/* Creates a model from a file pf_model_save wrote (moments and step restored when present).
 * PF_EIO if unreadable, PF_EFORMAT if malformed, truncated or inconsistent; errmsg says why. */
PF_API pf_status pf_model_load(pf_model **model, const char *path, char *errmsg, size_t errlen);

/* A metadata value of the file the model was loaded from, or NULL. */
PF_API const char *pf_model_meta(const pf_model *model, const char *key);

/* Starts dst from src's trained weights, whatever either model's attention: every trainable
 * tensor (embeddings, learned positions, layer norms, qkv, projections, MLP) is copied from src.
 * Everything else is dst's own and starts afresh, as pf_model_create left it: the step count
 * (0), the AdamW moments (0), FAVOR's W (dst's, drawn from dst's w_seed for step 0), FAVOR++'s
 * running statistic (none: A = 0 until a training batch). The shapes must agree: layers,
 * d_model, heads and positions. The contexts may differ: rotary positions hold no tensor, and a
 * table of learned positions is carried row t from src's row t mod src's context (a longer
 * context repeats src's rows, as Longformer extended RoBERTa's positions; a shorter one keeps
 * the first rows). PF_EINVAL if they do not (errmsg, if not NULL, errlen bytes, names the first
 * that differs, dst's value then src's) or an argument is NULL; dst is then unchanged.
 * PF_ENOMEM if W had to be drawn again and could not. */
PF_API pf_status pf_model_init_from(pf_model *dst, const pf_model *src, char *errmsg,
                                    size_t errlen);

/* What layer `layer` (0-based) of the model feeds its attention for tokens (B,T), T <= context:
 * q, k, v (B,H,T,hd), hd = d_model/heads, the heads split as the attention gets them (q and k
 * rotated by position with rotary positions); the attention scales q.k by 1/sqrt(hd) itself.
 * Runs pf_model_forward without targets in evaluation mode (W and FAVOR++'s statistic left as
 * they are; training mode is restored after), so it replaces the last forward: no backward may
 * follow. PF_EINVAL on bad arguments (layer out of range, a token outside [0, 256), a model set
 * up for sequence parallelism); errors of the forward are passed on. */
PF_API pf_status pf_model_attention_inputs(pf_model *model, float *q, float *k, float *v,
                                           const int32_t *tokens, int B, int T, int layer);

/* Decoding one token at a time: exact models keep a key/value cache (up to the context),
 * FAVOR models a pf_favor_state per layer (constant memory and time per token). The logits
 * equal those of pf_model_forward on the whole prefix, to float rounding. The decoder reads the
 * model's weights: the model must outlive it and not change while it is used. */
typedef struct pf_decoder pf_decoder;

PF_API pf_status pf_decoder_create(pf_decoder **decoder, const pf_model *model);
PF_API void pf_decoder_free(pf_decoder *decoder);
PF_API pf_status pf_decoder_reset(pf_decoder *decoder);

/* Feeds `token` at the next position; logits (256) receive the scores of the byte after it.
 * PF_EINVAL past the context when positions are learned or attention is exact. A step that
 * fails (any status but PF_OK) changes no layer's state and not the position: the same or
 * another token can be fed in its place. */
PF_API pf_status pf_decoder_step(pf_decoder *decoder, float *logits, int32_t token);

/* Feeds a prompt of n tokens at once: FAVOR models run it through every layer in pieces of rows,
 * each layer's attention by the chunked causal pass into its state (pf_favor_state_prefill), so
 * a long prompt costs about what the training forward does, not n steps; exact models step the
 * tokens. logits (256) receive the scores of the byte after the last token. Decoding after it
 * gives what stepping every token would, to float rounding. The same limits and statuses as
 * pf_decoder_step (PF_EINVAL past the context or for a token outside 0..255); a prefill that fails
 * leaves the decoder as it was. */
PF_API pf_status pf_decoder_prefill(pf_decoder *decoder, float *logits, const int32_t *tokens,
                                    int n);

/* Tokens fed since the last reset. */
PF_API int64_t pf_decoder_position(const pf_decoder *decoder);

/* Draws a byte from softmax(logits / temperature) restricted to the top_k largest (0: all);
 * temperature 0 takes the largest (the first on ties). */
PF_API pf_status pf_sample_logits(int32_t *token, const float *logits, int n, float temperature,
                                  int top_k, pf_rng *rng);

#ifdef __cplusplus
}
#endif

#endif /* PERFORMER_H */
