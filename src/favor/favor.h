/* favor.h: what the files of src/favor/ share (and the model, the MPI and CUDA layers, and the
 * tests and benchmarks that look inside FAVOR+): the feature maps (features.c), the options and
 * scratch (setup.c), the row-block toolkit (scan.c), the passes (forward.c, backward.c), what a
 * forward keeps (saved.c), the decoding state (state.c), slices (slice.c) and the FAVOR++/FAVOR#
 * fits (fit.c).
 *
 * A feature map is fixed by (kernel, W, m, d, scale, eps). The fast path works on blocks of rows
 * and returns *stabilised* features phi~ = phi / exp(c) with a per-row log factor c (the
 * Performer paper's features, "Stabilisers"), in float, with c in double. The float64 path (for
 * the references) works on one row at a time and returns the features themselves. */
#ifndef PF_FAVOR_H
#define PF_FAVOR_H

#include <math.h>

#include "internal.h"

/* Sizes of the row blocks and splits (setup.c, scan.c, forward.c, backward.c) */
enum {
    FAVOR_BLOCK = 256, /* rows per block, bidirectional */
    FAVOR_CHUNK = 16,  /* causal chunk when opts->chunk is 0 (see pf_favor_chunk) */
    FAVOR_SPLIT = 16,  /* bidirectional: key blocks wanted over all heads (pf_favor_split) */
    SCAN_SPLIT = 4,    /* causal: scan blocks wanted over all heads (each costs extra work) */
    SCAN_UNIT = 4,     /* causal: scan blocks are whole multiples of this many feature blocks */
    A_STRIP = 4        /* causal: rows of the chunk's scores A made at a time (lower part) */
};

/* Elementwise loops that -O2 vectorises for the baseline ISA only (SSE2 on x86-64) are compiled
 * also for AVX2 and AVX-512 and picked at load time by cpuid (GCC's function multiversioning).
 * Without contraction to FMA (-std=c11 turns it off) every version gives the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(PF_NO_CLONES)
#define PF_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PF_CLONES
#endif

typedef struct pf_fmap {
    pf_kernel kernel;
    const float *W;  /* (m,d): the projection the block path multiplies by: the drawn W, or
                        for SDERF its rows times B (B w_f) */
    const float *W0; /* (m,d): the drawn W (the float64 path's) */
    const float *Wt; /* W transposed, in panels of wtp columns, each (d, wtp) contiguous (the
                        last may be narrower): the projection's B (pf_fmap_project) */
    int wtp;         /* the panels' width (pf_simd()->wt_panel, or m: one panel) */
    int m, d, r;     /* r = pf_kernel_width(kernel, m) */
    float sqrt_s;    /* x' = x sqrt(s) */
    double s;        /* the effective scale s */
    float eps;       /* >= 0, see pf_features */
    double wmax;     /* a bound of |u_f - bias_f| / |x'| (the overflow test) */
    float wscale;    /* U = wscale X W^T: sqrt(s), times B for OPRF */
    /* OPRF and SDERF (pf_fmap_bind), u_f = B w_f.x' + bias_f, phi = D exp(u - h)/sqrt(m): */
    const float *bias;    /* (m): A |w_f|^2 or w_f^T A w_f, rounded from bias64; NULL otherwise */
    const double *bias64; /* (m) */
    double logd;          /* log D; 0 for the other maps */
    double oprf_b;        /* OPRF: B = sqrt(1 - 4A) */
    const float *sderf_B; /* SDERF: B (d,d) */
} pf_fmap;

/* sum of x[k]^2 in double with 8 independent partial sums (a fixed order, so the same bits
 * every time): a single chain of dependent adds would cost as much as the row's exps. */
static inline __attribute__((always_inline)) double pf_sumsq_f64(const float *x, int d) {
    double acc[8] = {0};
    int k = 0;
    for (; k + 8 <= d; k += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)x[k + j] * (double)x[k + j];
    for (; k < d; k++) acc[0] += (double)x[k] * (double)x[k];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* out_i = o_i[0..dv) / o_i[dv] for n rows. A zero denominator is PF_EDOMAIN, a non-finite
 * one (or quotient) PF_ENONFINITE; such a row is written as zeros, never NaN. Adding +0 turns
 * a -0 into +0, so a zero output has one bit pattern whatever the order of exact zeros. */
PF_INTERNAL pf_status pf_favor_readout(float *out, const float *o, int n, int dv);

/* Fills a map's fields; the arguments must have been checked (kernel known, m, d > 0). Every map
 * needs pf_fmap_bind (or pf_favor_bind) before use. */
PF_INTERNAL pf_fmap pf_fmap_make(pf_kernel kernel, const float *W, int m, int d, float scale,
                                 float eps);

/* Stabilised features of n rows X (n,d), row stride d: phi (n, ldphi >= r) gets phi~ and c (n)
 * the removed log factor, phi(x) = phi~(x) exp(c). Per kernel (u = W x', h = |x'|^2/2):
 *   positive    c = max u - h,     phi~ = exp(u - max u)/sqrt(m)
 *   hyperbolic  c = max |u| - h,   phi~ = [exp(u - max|u|), exp(-u - max|u|)]/sqrt(2m)
 * (for these two the 1/sqrt(.) is folded into the float shift of the exp, so c and the largest
 * feature move by the rounding of that shift, consistently: phi~ exp(c) is unchanged)
 *   trig        c = h,             phi~ = [sin u, cos u]/sqrt(m)
 *   relu        c = 0,             phi~ = relu(u)/sqrt(m) + eps
 *   oprf, sderf u += bias, then as positive with c += log D
 * and for the softmax maps phi~ += eps * max|phi~|. amax (n), if not NULL, receives that
 * max|phi~| before eps (the backward needs it). Row i depends on row i of X only.
 * PF_ENONFINITE if a row of X holds NaN or Inf or its u overflowed (that row is zeroed, the
 * others are computed). W must be finite. No allocation. */
PF_INTERNAL pf_status pf_fmap_rows(const pf_fmap *f, float *phi, int ldphi, double *c, float *amax,
                                   const float *X, int n);

/* pf_fmap_rows after its projection: the first m columns of each phi row hold U = wscale X W^T
 * as pf_fmap_project makes it (so that a caller may project several maps' rows with one call);
 * the rest as pf_fmap_rows, the same bits. */
PF_INTERNAL pf_status pf_fmap_map_rows(const pf_fmap *f, float *phi, int ldphi, double *c,
                                       float *amax, const float *X, int n);

/* U = wscale X W^T for n rows of X (d floats each, contiguous) into the first m columns of phi's
 * rows (row stride ldphi): one pf_mm for each panel of W^T (pf_fmap_bind). A row's bits depend
 * on that row alone. */
PF_INTERNAL void pf_fmap_project(const pf_fmap *f, float *phi, int ldphi, const float *X, int n);

/* The backward of pf_fmap_rows for n rows with the log factors c held constant: out is
 * homogeneous of degree 0 in each query's features and in the key features a query sees, so
 * d out / d x through phi~ = phi exp(-c0), c0 fixed, is exact (a.e.). Given phi~ (n, ldphi) and
 * amax (n) from pf_fmap_rows and dphi (n, lddphi) = d loss / d phi~, writes dX (n,d), the
 * gradient with respect to X (through x' = x sqrt(s)). dphi is overwritten; b (n) is scratch.
 * Returns 1 if dX holds a NaN or Inf, else 0. */
PF_INTERNAL int pf_fmap_rows_backward(const pf_fmap *f, float *dX, float *dphi, int lddphi,
                                      const float *phi, int ldphi, const float *amax,
                                      const float *X, int n, double *b);

/* Unstabilised float64 features of one row x (d): phi (r), u (m) receives W x'. The reference
 * code, independent of pf_fmap_rows. Returns 0, or -1 if a feature is not finite. */
PF_INTERNAL int pf_fmap_row_f64(const pf_fmap *f, double *phi, double *u, const float *x);

/* The backward of pf_fmap_row_f64: given dphi (r), the row x and its u (m) from the forward,
 * writes dx (d), the gradient with respect to x (through x' = x sqrt(s)); W is a constant. */
PF_INTERNAL void pf_fmap_row_f64_backward(const pf_fmap *f, double *dx, const double *dphi,
                                          const float *x, const double *u);

/* The checks every FAVOR+ entry point makes: pf_attn_check, then the FAVOR options (W not
 * NULL, m > 0, known kernel, w_per_head 0 or 1, eps finite and >= 0, chunk >= 0; OPRF:
 * oprf_a_given 0 or 1, a given A finite and < 1/8, causal only with a given A): PF_EINVAL;
 * causal SDERF: PF_ENOTSUP; then W finite: PF_ENONFINITE. */
PF_INTERNAL pf_status pf_favor_check(const pf_shape *shape, const pf_attn_opts *opts,
                                     const pf_favor_opts *favor);

/* The feature map of head h under checked options. */
PF_INTERNAL pf_fmap pf_favor_fmap(const pf_shape *shape, const pf_attn_opts *opts,
                                  const pf_favor_opts *favor, int h);

/* The causal chunk C for sequences of length L (favor->chunk, or the default; at most L). */
PF_INTERNAL int pf_favor_chunk(const pf_favor_opts *favor, int L);

/* Rows per block of features: bidirectional a fixed block, causal a whole number of chunks. */
PF_INTERNAL int pf_favor_block(int causal, int C);

/* The width of the augmented values [V | 1] in the forward: dv + 1 rounded up to a multiple of
 * 16, zeros after the ones column (whole vectors per row; the products use the dv + 1 columns
 * that matter). */
PF_INTERNAL int pf_favor_dw(int dv);

/* dst (n, dw >= dv+1) row j = w_j [v_j | 1 | 0...], w_j = exp(c_j - ref_j), ref_j = ref[j] if
 * ref is not NULL, else ref0. V is (n, dv). Returns 1 if V holds a NaN or Inf, else 0. */
PF_INTERNAL int pf_favor_weighted_values(float *dst, int dw, const float *V, int dv,
                                         const double *c, const double *ref, double ref0, int n);
/* The causal chunk's two weightings of [V | 1] in one pass over V: dst1 row j
 * e^(c_j - ref1_j) [v_j | 1], dst2 row j e^(c_j - ref2) [v_j | 1], each with the arithmetic of
 * pf_favor_weighted_values (V is checked by the caller). */
PF_INTERNAL void pf_favor_weighted_values2(float *dst1, float *dst2, int dw, const float *V, int dv,
                                           const double *c, const double *ref1, double ref2, int n);

/* Per-thread scratch of the forward (setup.c): blocks of nb rows; C = 0 for bidirectional,
 * else the causal chunk. */
typedef struct pf_favor_ws {
    float *phi;   /* (nb, r + C): features of a block of rows; causal: Q~ and, in the last C
                     columns of a chunk's rows, its masked scores A */
    float *kphi;  /* (nb, r): causal: K~ of the block */
    float *vaug;  /* (nb, dw): bidirectional: weighted [V | 1] rows */
    float *vs;    /* (C, dw): causal: [V | 1] rows weighted for the state update */
    float *o;     /* (nb, dw): numerators and denominators of a block of queries */
    float *state; /* (r + C, dw): K~^T [V | 1] (bidirectional); causal: the state S, then the
                     chunk's weighted [V | 1] rows right below it */
    double *c;    /* (nb): log factors of a block of keys */
    double *cq;   /* (nb): log factors of a block of queries (not needed, they cancel) */
    double *p;    /* (C): prefix maxima of the key log factors (causal) */
    void *mem;
    /* half-precision inputs and outputs (pf_favor_ws_half): their element type (PF_F32 for the
     * plain calls, whose rows are read in place) and a block's rows widened to float32 */
    pf_dtype dt;
    float *xq, *xk, *xv, *xo; /* (nb, d), (nb, d), (nb, dv), (nb, dv) */
    void *xmem;
} pf_favor_ws;

/* Allocates ws for blocks of nb rows (pf_favor_block), chunk C (0: bidirectional), feature
 * width r, value width dv. Returns 0, or -1 when out of memory (ws then owns nothing). */
PF_INTERNAL int pf_favor_ws_alloc(pf_favor_ws *ws, int nb, int C, int r, int dv);
PF_INTERNAL void pf_favor_ws_free(pf_favor_ws *ws);

/* Makes ws read and write rows of dt (PF_F16, PF_BF16) for blocks of nb rows of widths d and dv:
 * the block functions below then take their Q, K, V and out of that type. 0, or -1 when out of
 * memory. */
PF_INTERNAL int pf_favor_ws_half(pf_favor_ws *ws, pf_dtype dt, int nb, int d, int dv);

/* Rows [row0, row0 + n) of width w of X, as ws reads them: in place for float32, else widened
 * into buf. */
static inline const float *pf_favor_rows(const pf_favor_ws *ws, const void *X, size_t row0,
                                         size_t n, size_t w, float *buf) {
    if (ws->dt == PF_F32) return (const float *)X + row0 * w;
    pf_rows_to_f32(buf, (const char *)X + row0 * w * 2, ws->dt, n * w);
    return buf;
}

/* Where a causal scan keeps the features of its rows (each from the scan's row 0), or NULL. */
typedef struct pf_favor_keep {
    float *qf, *qamax, *kf, *kamax; /* (L, r), (L), (L, r), (L) */
    double *kc;                     /* (L) */
    float *A;                       /* (L, C): row i, the masked scores of query i in its chunk */
} pf_favor_keep;

/* Bidirectional queries [0, n): out = (Q~ KV)[:, :dv] / (Q~ KV)[:, dv], in blocks; the features
 * are made in qf (n, r) with their maxima in qamax (n) when qf is not NULL. */
PF_INTERNAL pf_status pf_favor_query_block(const pf_fmap *fm, pf_favor_ws *ws, void *out,
                                           const void *Q, const float *KV, int n, int dv,
                                           float *qf, float *qamax);

/* The stages of one causal chunk of n rows (nk of them valid keys), in the order
 * pf_favor_causal_rows runs them; Qc's rows hold Q~ (r) then the chunk's scores A (ldq = r + C),
 * S (r rows) is followed in memory by Vw (the chunk's weighted values), both of row stride ldo.
 *   prefix  P_j = max(M, c_0..c_j) over the valid keys
 *   scores  A = Q~ K~^T, its lower part
 *   mask    A_ij times e^(P_j - P_i) <= 1 (P never decreases) for j <= i, 0 above; the
 *           backward masks its B the same way
 *   qscale  Q~ row i times e^(M - P_i) (a state exists)
 *   out     O = [e^(M-P) Q~ | A] [S ; Vw] (before the first key: A Vw)
 *   state   S = beta S + K~^T vs, vs the rows e^(c_j - P_last) [v_j | 1] */
PF_INTERNAL void pf_favor_chunk_prefix(double *P, const double *ck, int n, int nk, double M);
PF_INTERNAL void pf_favor_chunk_scores(float *A, int ldq, const float *Qc, const float *Kc, int r,
                                       int n, int nk);
PF_INTERNAL void pf_favor_chunk_mask(float *A, int ldq, const double *P, int n, int nk);
PF_INTERNAL void pf_favor_chunk_qscale(float *Qc, int ldq, int r, const double *P, int n, double M);
PF_INTERNAL void pf_favor_chunk_out(float *O, int ldo, const float *Qc, int ldq, const float *S,
                                    const float *Vw, int r, int n, int nk, int dv, int have_state);
PF_INTERNAL void pf_favor_chunk_state(float *S, int lds, const float *Kc, int r, const float *vs,
                                      int nk, int dv, float beta);

/* The causal scan over L rows of one head, in chunks of C from row 0 and feature blocks of
 * pf_favor_block(1, C) rows, continuing from a state: SV ((r + C), dw) holds in its first r
 * rows S = sum_{earlier keys j} k~_j e^(c_j - M) [v_j | 1 | 0] (the other C rows are scratch), *M
 * the reference (-inf: no key yet, S is ignored). Q, K (L, d), V (L, dv); keys j >= klen are
 * padding (klen >= 1 when *M is -inf); writes out (L, dv) and leaves S and *M advanced past the L
 * rows. ws is from pf_favor_ws_alloc(nb >= pf_favor_block(1, C), C, r, dv). Status as readout: a
 * zero or non-finite denominator (that row zeroed, the scan goes on); PF_ENONFINITE for a NaN or
 * Inf in V or Q/K (or an overflowing projection), which stops the scan part way. keep, if not
 * NULL, receives the rows' features (K~ only of the klen valid keys). kmade (L, r) and cmade (L),
 * if not NULL, are the valid keys' features and log factors made already (by the key phase,
 * from these K rows, checked there): K is then not read, and keep's K~, log factors and max|k~|
 * are taken to be there already. */
PF_INTERNAL pf_status pf_favor_causal_rows(const pf_fmap *fm, pf_favor_ws *ws, int C, float *SV,
                                           double *M, void *out, const void *Q, const void *K,
                                           const void *V, int L, int klen, int dv,
                                           const pf_favor_keep *keep, const float *kmade,
                                           const double *cmade);

/* ---- the decoding state's steps as transactions (state.c) */

/* pf_favor_state_step without the commit: out is written and the step staged, or, on failure,
 * the state is as before the call. A staged step must be committed or aborted before the next
 * stage (PF_EINVAL otherwise); the decoder stages every layer's step and commits them together. */
PF_INTERNAL pf_status pf_favor_state_stage(pf_favor_state *st, float *out, const float *q,
                                           const float *k, const float *v, int n);
/* The same for sequence seq of a state of several (pf_favor_state_stage is sequence 0). */
PF_INTERNAL pf_status pf_favor_state_stage_seq(pf_favor_state *st, int seq, float *out,
                                               const float *q, const float *k, const float *v,
                                               int n);
/* Makes the staged step part of the state (position advanced); nothing when none is staged. */
PF_INTERNAL void pf_favor_state_commit(pf_favor_state *st);
/* Drops the staged step: the state is as before it; nothing when none is staged. */
PF_INTERNAL void pf_favor_state_abort(pf_favor_state *st);

/* ---- FAVOR++ (OPRF) and FAVOR# (SDERF) parameters (fitting: fit.c; binding: features.c) */

/* Storage for one head's OPRF/SDERF parameters, bound into a pf_fmap. */
typedef struct pf_kernel_ws {
    float *A, *B;   /* (d,d): SDERF's matrices */
    float *weff;    /* (m,d): SDERF: rows B w_f */
    float *bias;    /* (m) */
    double *bias64; /* (m) */
    double *dwork;  /* SDERF: the fit's and the binding's scratch */
    float *fwork;   /* SDERF: (2 d d) */
    float *wt;      /* (m d): the map's W transposed, in panels (pf_fmap.Wt; every kernel) */
    int lwork;      /* doubles in dwork for dsyev */
    void *mem;
} pf_kernel_ws;

/* Allocates kw for a kernel (W^T for every map; the parameters of OPRF and SDERF). 0, or -1 (no
 * memory). */
PF_INTERNAL int pf_kernel_ws_alloc(pf_kernel_ws *kw, pf_kernel kernel, int m, int d);
PF_INTERNAL void pf_kernel_ws_free(pf_kernel_ws *kw);

/* OPRF: binds A (< 1/8, finite: checked by the caller) to a map from pf_fmap_make. SDERF: binds
 * A, B (d,d) and log D. Every kernel: the map's W^T, in panels, into kw->wt (fm->Wt), so that
 * its projection runs in pf_mm (pf_fmap_project). The map keeps pointers into kw (and to A, B for
 * SDERF). PF_ENONFINITE if a parameter derived from them is not finite. */
PF_INTERNAL pf_status pf_fmap_bind(pf_fmap *fm, pf_kernel_ws *kw, float oprf_a, const float *A,
                                   const float *B, double log_d);

/* OPRF's A* of one head (pf_oprf_optimal_a's formula) into *A: the statistics in double of
 * x' = x sqrt_s. PF_ENONFINITE if they are not finite, PF_ENOMEM. */
PF_INTERNAL pf_status pf_oprf_a_star(double *A, const float *Q, int Lq, const float *K, int Lk,
                                     int d, float sqrt_s);

/* SDERF's A, B (d,d) into kw->A, kw->B and *log_d (pf_sderf_params's formula), x' = x sqrt_s.
 * PF_ENONFINITE (non-finite input), PF_EDOMAIN (eigensolver failure). */
PF_INTERNAL pf_status pf_sderf_fit(pf_kernel_ws *kw, double *log_d, const float *Q, int Lq,
                                   const float *K, int Lk, int d, float sqrt_s);

/* What an attention does per (batch element, head) before using fm: OPRF with favor->oprf_a, or
 * A* from the head's queries Q (Lq,d) and valid keys K (klen,d); SDERF fitted to them; then
 * pf_fmap_bind (every kernel). Causal passes need oprf_a_given (pf_favor_check sees to it). */
PF_INTERNAL pf_status pf_favor_bind(pf_fmap *fm, pf_kernel_ws *kw, const pf_favor_opts *favor,
                                    const float *Q, int Lq, const float *K, int klen);

/* The heads' maps of a forward or backward. When every head gets the same bound map (one W for
 * all heads, and a binding that reads no head's data: not FAVOR#, not FAVOR++ fitting its A,
 * no sums from outside) one map is bound (pf_favor_bind, no Q or K read) and every head copies
 * it, instead of a W^T and its scratch per head. */
typedef struct pf_favor_maps {
    int one; /* 1: every head's map is map, bound with status st */
    pf_fmap map;
    pf_status st;
} pf_favor_maps;

/* Fills mp and the scratch kw (heads, zeroed): kw[0] and that one map, or every head's kw to
 * bind its own map (pf_favor_bind or pf_favor_bind_sums). sums: the maps bind to sums from
 * outside. PF_OK or PF_ENOMEM. */
PF_INTERNAL pf_status pf_favor_maps_init(pf_favor_maps *mp, pf_kernel_ws *kw, int heads,
                                         const pf_shape *shape, const pf_attn_opts *opts,
                                         const pf_favor_opts *favor, int sums);

/* Head bh's map into *fm: a copy of the one map (with its binding's status), else bound for this
 * head in kw (its own, from pf_favor_maps_init), to its slice of sums when sums is not NULL
 * ((heads, pf_favor_sums_len)), else to its queries Q (Lq rows, or NULL) and its klen keys K. */
PF_INTERNAL pf_status pf_favor_maps_head(const pf_favor_maps *mp, pf_fmap *fm, pf_kernel_ws *kw,
                                         int bh, const pf_shape *shape, const pf_attn_opts *opts,
                                         const pf_favor_opts *favor, const double *sums,
                                         const float *Q, const float *K, int klen);

/* The statistics FAVOR++ (OPRF) and FAVOR# (SDERF) fit their parameters to, as sums over rows
 * that add up across slices of a sequence (doubles per head, 0 for the other maps):
 *   [0] n_q, [1] n_k, [2] sum |q|^2, [3] sum |k|^2, [4, 4+d) sum q, [4+d, 4+2d) sum k,
 *   SDERF also [4+2d, 4+2d+d^2) Q^T Q and then K^T K (each the float product pf_sderf_fit makes)
 * of the unscaled rows. */
PF_INTERNAL size_t pf_favor_sums_len(pf_kernel kernel, int d);

/* The sums of Q (Lq,d) and K (Lk,d) (either count may be 0) into sums (pf_favor_sums_len);
 * fwork (d,d) is scratch (SDERF). */
PF_INTERNAL void pf_favor_sums(double *sums, pf_kernel kernel, const float *Q, int Lq,
                               const float *K, int Lk, int d, float *fwork);

/* pf_favor_bind with the parameters fitted to sums (pf_favor_sums, added over the slices)
 * instead of to one head's rows: the same formulas, so one slice gives pf_favor_bind's bits. */
PF_INTERNAL pf_status pf_favor_bind_sums(pf_fmap *fm, pf_kernel_ws *kw, const pf_favor_opts *favor,
                                         const double *sums);

/* What a slice of a longer sequence (slice.c) takes from outside instead of making it
 * from its own rows, and what it gives out. States are (heads, r, dv+1) with a reference per
 * head (favor.h's S = sum_j k~_j e^(c_j - M) [v_j | 1]); -inf: empty. */
typedef struct pf_favor_ext {
    const double *sums; /* (heads, pf_favor_sums_len): every slice's sums, or NULL */
    const float *S;     /* the state to start from (causal) or the total (bidirectional), or NULL */
    const double *M;    /* (heads) */
    float *Sout;        /* forward: the slice's own key state instead of outputs, or NULL */
    double *Mout;
    const float *R; /* backward: d/dS from later slices (causal, referenced to the state
                       after this slice) or from every slice (bidirectional), or NULL */
    float *dS;      /* backward: only d/dS of this slice's queries (referenced to M) */
} pf_favor_ext;

/* The forward (forward.c) and backward (backward.c) of a slice; arguments checked by
 * the caller (slice.c). */
PF_INTERNAL pf_status pf_favor_forward_ext(float *out, const float *Q, const float *K,
                                           const float *V, const pf_shape *shape,
                                           const pf_attn_opts *opts, const pf_favor_opts *favor,
                                           const pf_favor_ext *ext);
PF_INTERNAL pf_status pf_favor_backward_ext(float *dQ, float *dK, float *dV, const float *dout,
                                            const float *Q, const float *K, const float *V,
                                            const float *out, const pf_shape *shape,
                                            const pf_attn_opts *opts, const pf_favor_opts *favor,
                                            const pf_favor_ext *ext);

/* How a row's attention denominator fails: PF_ENONFINITE when it is not finite, PF_EDOMAIN when
 * it is 0 (no feature of the query meets a key's), else PF_OK. The readout and the backward's
 * dN~ classify their rows by this one rule (the float64 references keep their own). */
static inline pf_status pf_favor_den_status(float den) {
    return !isfinite(den) ? PF_ENONFINITE : den == 0.0f ? PF_EDOMAIN : PF_OK;
}

/* A unit's status that ends its head's work (its output is zeroed): a non-finite input or
 * result, or no memory. Other failures (a zero denominator) leave the rest of the head to run. */
static inline int pf_favor_fatal(int st) {
    return st == PF_ENONFINITE || st == PF_ENOMEM;
}

/* ---- units of work for threads (forward.c, backward.c) ----------------------------- */

/* Cuts L rows into blocks of whole `unit`s, about ceil(target / heads) of them (at least 1, at
 * most one per unit): *len receives the block length; returns the number of blocks. Depends on
 * the shape only, never on the thread count. */
PF_INTERNAL int pf_favor_split(int L, int heads, int unit, int target, int *len);

/* The bidirectional key (and query) blocks of a head of L rows: pf_favor_split with the forward's
 * unit and target; the backward cuts its keys the same way, so its K~^T [V|1] has the forward's
 * bits. */
PF_INTERNAL int pf_favor_bidir_blocks(int L, int heads, int *len);

/* The causal scan blocks of a head of L rows with chunk C (several only when heads is small;
 * whole feature blocks, so chunks stay aligned to position 0); forward and backward alike. */
PF_INTERNAL int pf_favor_scan_blocks(int L, int heads, int C, int *len);

/* The local sum of n valid keys K (n,d), V (n,dv): KVb (r, dw) = sum_j k~_j e^(c_j - Mb)
 * [v_j | 1], *Mb = max_j c_j, features in blocks of FAVOR_BLOCK rows (ws as for bidirectional).
 * If kst is not NULL the features K~ are kept there (n, r), with kc (n) their log factors and
 * kamax (n, may be NULL) their max|k~|. PF_ENONFINITE on NaN/Inf (or overflow) in K or V. */
PF_INTERNAL pf_status pf_favor_key_block(const pf_fmap *fm, pf_favor_ws *ws, float *KVb, double *Mb,
                                         const void *K, const void *V, int n, int dv, float *kst,
                                         double *kc, float *kamax);

/* A running key sum referenced to *M takes keys with log factors c (n): *M becomes
 * max(*M, c[0..n)), and the sum must first be multiplied by the returned factor, e^(old - new)
 * (0 when *M was -inf: nothing to keep; 1 when *M does not move). */
PF_INTERNAL float pf_favor_rebase(double *M, const double *c, int n);

/* S (n floats) referenced to *M becomes S + S2 (referenced to M2), referenced to the larger
 * reference: S = e^(M - M') S + e^(M2 - M') S2. A reference of -inf is an empty sum. */
PF_INTERNAL void pf_favor_combine(float *S, double *M, const float *S2, double M2, size_t n);

/* ---- what a forward keeps for its backward (pf_favor_saved, saved.c) ------------------ */

struct pf_favor_saved {
    pf_shape shape;
    pf_attn_opts opts;   /* as made (key_len: the copy below once filled) */
    pf_favor_opts favor; /* as made */
    int r, dw;
    int nkeep;        /* heads [0, nkeep) have their features kept (the rest recompute) */
    int filled;       /* 1 after a forward whose every head is complete */
    int32_t *key_len; /* (B): the forward's valid key lengths */
    /* of the nkeep kept heads: */
    float *qf, *kf; /* (nkeep, Lq, r), (nkeep, Lk, r): Q~, K~ (rows past the keys unset) */
    float *qamax;   /* (nkeep, Lq): max|q~| before eps */
    float *kamax;   /* (nkeep, Lk) */
    double *kc;     /* (nkeep, Lk): key log factors */
    float *ka;      /* causal: (nkeep, Lq, C) each chunk's masked scores A (the forward's) */
    /* of every head: */
    int C;       /* causal: the chunk */
    float *kv;   /* bidirectional: (B H, r, dw) K~^T [V|1], the forward's bits */
    double *kvm; /* bidirectional: (B H) its reference */
    size_t bytes;
};

/* pf_attn_favor_backward (saved NULL) or pf_attn_favor_backward_saved, with a causal head's
 * scan cut into segments of seg rows (rounded up to whole feature blocks; 0: the library's
 * choice, whole heads while they fit in 64 MiB a thread), when each head is one unit of work.
 * The gradients do not depend on seg. */
PF_INTERNAL pf_status pf_favor_backward_segmented(float *dQ, float *dK, float *dV,
                                                  const float *dout, const float *Q, const float *K,
                                                  const float *V, const float *out,
                                                  const pf_shape *shape, const pf_attn_opts *opts,
                                                  const pf_favor_opts *favor,
                                                  const pf_favor_saved *saved, int seg);

/* 1 if any of x[0..n) is NaN or Inf (a vectorised pf_any_nonfinite). */
PF_INTERNAL int pf_nonfinite_f32(const float *x, size_t n);

#endif
