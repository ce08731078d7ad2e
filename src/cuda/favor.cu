/* favor.cu: the FAVOR+ forward on the GPU (SPEC §4, §4b), bidirectional and causal.
 *
 * Per head, with Tc the type the products read (float32 for float32 inputs, bfloat16 for half
 * inputs: its exponent range is float32's, so features, weights and states rounded to it never
 * overflow or underflow where float32 would not) and every product accumulating in float32:
 *
 *   U = sqrt(s) X W^T                 cuBLAS, float32 out              ("project")
 *     (half inputs: widened to float32, which is exact, and multiplied on TF32 tensor cores:
 *     W keeps 2^-11 of relative precision there, which the exponential of the features needs;
 *     in bfloat16 it would carry 2^-8 of its size into u.)
 *   phi~(X), c(X)                     own kernel, one warp a row       ("features")
 *
 * bidirectional
 *   M = max_j c_j over valid keys; Vs_j = e^(c_j - M) [v_j | 1 | 0..]  ("weights")
 *   S = phi~(K)^T Vs                  (r x dw, float32)                ("chunk_states")
 *   O = phi~(Q) S                     (Lq x dw, float32)               ("readout_mm")
 *   out_i = O_i[:dv] / O_i[dv]                                         ("normalise")
 *
 * causal, chunks of C rows (t = 0, 1, ...), P_i = max_{j <= i} c_j (a running maximum that
 * looks at no later key), E_t = P at the end of chunk t (E_-1 = -inf):
 *   V1_j = [v_j | 1 | 0..], Vs_j = e^(c_j - E_t(j)) [v_j|1]            ("weights")
 *   dS_t = phi~(K_t)^T Vs_t           every chunk at once, batched     ("chunk_states")
 *   Sb_t = sum_{u < t} e^(E_u - E_(t-1)) dS_u, the state before chunk t, referenced to E_(t-1):
 *          Sb_(t+1) = e^(E_(t-1) - E_t) Sb_t + dS_t                    ("prefix")
 *   A_t = phi~(Q_t) phi~(K_t)^T, A'_ij = A_ij e^(c_j - P_i) for j <= i, else exactly 0;
 *   phi~(Q_t) rows scaled by e^(E_(t-1) - P_i)                         ("scores")
 *   O_t = phi~(Q_t)' Sb_t + A'_t V1_t                                  ("readout_mm")
 * The weight of key j in row i rides in A' (rounded once, as A' is anyway), not in the values:
 * [v_j | 1] stays exact, and a key that dominates its row has the same rounding in the row's
 * numerator and denominator.
 * Every factor is <= 1, and row i reads only keys j <= i through exact zeros of A', so a later
 * key changes no bit of it. This is the CPU library's causal chunk (src/favor/scan.c) with the
 * chunks' states made by one batched product and a prefix instead of one after another.
 *
 * Heads are processed in groups that fit the context's workspace limit: memory is linear in L
 * per head in flight, whatever B*H. */
#include <string.h>

#include <algorithm>

#include "internal.cuh"

#define PF_CUDA_API extern "C" __attribute__((visibility("default")))

enum { ST_PROJECT, ST_FEATURES, ST_WEIGHTS, ST_CHUNK, ST_PREFIX, ST_SCORES, ST_READOUT, ST_NORM };

static const int DEFAULT_CHUNK = 128;
/* Bidirectional: the key log factors' maximum is taken over blocks of MAX_ROWS rows (a warp
 * each), then over the blocks. */
static const int MAX_ROWS = 128;


/* ---- the plan: sizes and the workspace's layout --------------------------------------------- */

struct favor_plan {
    int B, H, Lq, Lk, d, dv, m, r, dw; /* dw: [v | 1] padded to a multiple of 8 columns */
    int causal, C, nch, Lp;            /* causal: chunk, chunks, rows padded to nch * C */
    size_t tin, tc;                    /* element sizes of the inputs and of Tc */
    float sqrt_s;                      /* float(sqrt(scale)) as the CPU library rounds it */
    double s2;                         /* sqrt_s^2 in double: h = s2 |x|^2 / 2 */
    pf_fmap_dev fm;
    int w_per_head;
    /* bytes per head of each buffer (in this order in a group's workspace) and fixed bytes */
    size_t b_u, b_phq, b_phk, b_c, b_p, b_vw, b_vs, b_st, b_sb, b_a, b_ref;
    int ncm;      /* chunks of the running maxima (causal: nch; bidirectional: of MAX_ROWS) */
    size_t per_head, fixed;
};

static size_t align256(size_t x) {
    return (x + 255) & ~(size_t)255;
}

static pf_status plan_make(favor_plan *p, pf_cuda_dtype dtype, const pf_shape *s,
                           const pf_attn_opts *o, const pf_favor_opts *f) {
    memset(p, 0, sizeof *p);
    if (!s || !o || !f) return pf_cuda_fail(PF_EINVAL, "shape, opts and favor must not be NULL");
    if (pf_cuda_dtype_size(dtype) == 0)
        return pf_cuda_fail(PF_EINVAL, "unknown dtype %d: PF_CUDA_F32, PF_CUDA_BF16 or "
                                       "PF_CUDA_F16", (int)dtype);
    if (s->B < 1 || s->H < 1 || s->Lq < 1 || s->Lk < 1 || s->d < 1 || s->dv < 1)
        return pf_cuda_fail(PF_EINVAL, "shape (B=%d, H=%d, Lq=%d, Lk=%d, d=%d, dv=%d): every "
                                       "size must be >= 1", s->B, s->H, s->Lq, s->Lk, s->d,
                            s->dv);
    if ((int64_t)s->B * s->H > INT32_MAX)
        return pf_cuda_fail(PF_EINVAL, "B*H = %lld is too large", (long long)s->B * s->H);
    if (o->causal != 0 && o->causal != 1)
        return pf_cuda_fail(PF_EINVAL, "opts.causal must be 0 or 1, got %d", o->causal);
    if (o->causal && s->Lq != s->Lk)
        return pf_cuda_fail(PF_EINVAL, "causal attention needs Lq == Lk (got %d and %d)", s->Lq,
                            s->Lk);
    if (!isfinite(o->scale) || o->scale < 0)
        return pf_cuda_fail(PF_EINVAL, "opts.scale must be finite and >= 0 (0: 1/sqrt(d)), "
                                       "got %g", (double)o->scale);
    if (!pf_cuda_kernel_supported(f->kernel))
        return pf_cuda_fail(f->kernel == PF_KERNEL_OPRF || f->kernel == PF_KERNEL_SDERF
                                ? PF_ENOTSUP
                                : PF_EINVAL,
                            "kernel %d: the GPU runs positive, hyperbolic, trig and relu "
                            "(FAVOR++ and FAVOR# run on the CPU library)", (int)f->kernel);
    if (f->m < 1 || f->m > PF_LM_MAX_FEATURES)
        return pf_cuda_fail(PF_EINVAL, "favor.m must be in [1, %d], got %d", PF_LM_MAX_FEATURES,
                            f->m);
    if (f->w_per_head != 0 && f->w_per_head != 1)
        return pf_cuda_fail(PF_EINVAL, "favor.w_per_head must be 0 or 1");
    if (!isfinite(f->eps) || f->eps < 0)
        return pf_cuda_fail(PF_EINVAL, "favor.eps must be finite and >= 0");
    if (f->chunk < 0 || f->chunk > 4096)
        return pf_cuda_fail(PF_EINVAL, "favor.chunk must be in [0, 4096], got %d", f->chunk);
    /* the core's own checks of the sizes (every tensor's byte count fits size_t); key_len is
     * checked apart, as it may be device memory */
    pf_attn_opts o2 = *o;
    o2.key_len = NULL;
    o2.threads = 0;
    if (pf_attn_check(s, &o2) != PF_OK)
        return pf_cuda_fail(PF_EINVAL, "shape (B=%d, H=%d, Lq=%d, Lk=%d, d=%d, dv=%d): too large "
                                       "(its tensors' byte counts overflow)",
                            s->B, s->H, s->Lq, s->Lk, s->d, s->dv);
    if ((int64_t)s->dv + 8 > INT32_MAX)
        return pf_cuda_fail(PF_EINVAL, "dv = %d is too large", s->dv);
    p->B = s->B;
    p->H = s->H;
    p->Lq = s->Lq;
    p->Lk = s->Lk;
    p->d = s->d;
    p->dv = s->dv;
    p->m = f->m;
    p->r = pf_kernel_width(f->kernel, f->m);
    p->dw = (s->dv + 1 + 7) / 8 * 8;
    p->causal = o->causal;
    p->tin = pf_cuda_dtype_size(dtype);
    p->tc = dtype == PF_CUDA_F32 ? 4 : 2;
    p->w_per_head = f->w_per_head;
    p->fm = pf_fmap_dev_make(f, s->d, o->scale, &p->sqrt_s, &p->s2);
    const size_t r = (size_t)p->r, m = (size_t)p->m, dw = (size_t)p->dw, tc = p->tc;
    if (p->causal) {
        p->C = f->chunk > 0 ? f->chunk : DEFAULT_CHUNK;
        if (p->C > s->Lq) p->C = s->Lq;
        const int64_t nch64 = ((int64_t)s->Lq + p->C - 1) / p->C;
        if (nch64 * p->C > INT32_MAX)
            return pf_cuda_fail(PF_EINVAL, "Lq = %d rounded up to chunks of %d is too large",
                                s->Lq, p->C);
        p->nch = (int)nch64;
        p->Lp = p->nch * p->C;
        const size_t Lp = (size_t)p->Lp, C = (size_t)p->C, nch = (size_t)p->nch;
        /* the projection's rows and, after the features, the chunks' states share one buffer */
        /* The U region holds, one after the other: the projection U, the chunks' states dS,
         * the scores A in float32, then O and O2. The region of A' holds the widened inputs
         * (half inputs) before the scores. */
        p->b_u = align256(std::max(std::max(Lp * m, nch * r * dw), std::max(Lp * C, 2 * Lp * dw)) * 4);
        p->b_phq = p->b_phk = align256(Lp * r * tc);
        p->b_c = p->b_p = align256(Lp * 8);
        p->b_vw = p->b_vs = align256(Lp * dw * tc);
        p->b_sb = align256(nch * r * dw * tc);
        p->b_a = align256(std::max(Lp * C * tc, p->tin == 2 ? Lp * (size_t)p->d * 4 : 0));
        p->ncm = p->nch;
        /* E_(t-1) and the chunks' maxima (double), the rebase factors (float) */
        p->b_ref = align256(nch * 20);
    } else {
        const size_t Lq = (size_t)p->Lq, Lk = (size_t)p->Lk;
        p->b_u = align256(std::max(Lq, Lk) * m * 4);
        p->b_phq = align256(Lq * r * tc);
        p->b_phk = align256(Lk * r * tc);
        p->b_c = align256(Lk * 8);
        p->b_p = align256(8);
        p->b_vs = align256(Lk * dw * tc);
        p->b_st = align256(r * dw * 4);
        p->b_sb = align256(r * dw * tc);
        /* U, then O (made once the queries' features are): one region; the widened inputs
         * (half) in A's */
        p->b_u = align256(std::max(std::max(Lq, Lk) * m, Lq * dw) * 4);
        p->b_a = p->tin == 2 ? align256(std::max(Lq, Lk) * (size_t)p->d * 4) : 0;
        p->ncm = (p->Lk + MAX_ROWS - 1) / MAX_ROWS;
        p->b_ref = align256((size_t)p->ncm * 8);
    }
    p->per_head = p->b_u + p->b_phq + p->b_phk + p->b_c + p->b_p + p->b_vw + p->b_vs + p->b_st +
                  p->b_sb + p->b_a + p->b_ref;
    const size_t wrows = (size_t)(f->w_per_head ? s->H : 1) * m;
    p->fixed = align256(wrows * (size_t)s->d * 4);
    /* the same sums in double: a shape whose workspace would pass 2^50 bytes (far beyond any
     * GPU) is refused here, before a size_t product above could have wrapped round */
    const double L = (double)std::max(p->Lq, p->Lk) + (p->causal ? p->C : 0);
    const double est =
        L * ((double)m + 2.0 * r + 4.0 * dw + 2.0 * p->C + (double)p->d + 4.0) * 4 +
        (double)(p->causal ? p->nch : 1) * (double)r * (double)dw * 8 +
        (double)wrows * (double)s->d * 4 + 16 * 256.0;
    if (est > 0x1p50)
        return pf_cuda_fail(PF_EINVAL, "shape (Lq=%d, Lk=%d, d=%d, dv=%d, m=%d): its workspace "
                                       "would pass 2^50 bytes", s->Lq, s->Lk, s->d, s->dv, f->m);
    return PF_OK;
}

/* A group's buffers: every buffer holds G heads back to back. */
struct favor_bufs {
    float *u, *st, *a32, *o, *o2;
    void *phq, *phk, *vw, *vs, *sb, *a;
    double *c, *P, *eref, *cm;
    float *alpha;
    float *x; /* half inputs: a side's rows widened to float32 for the projection */
    float *W; /* the fixed part: W, checked */
};

static favor_bufs bufs_carve(const favor_plan *p, void *ws, int G) {
    favor_bufs b;
    memset(&b, 0, sizeof b);
    char *x = (char *)ws;
    b.W = (float *)x;
    x += p->fixed;
    auto take = [&](size_t per) -> void * {
        if (per == 0) return NULL;
        void *r = x;
        x += per * (size_t)G;
        return r;
    };
    b.u = (float *)take(p->b_u);
    b.phq = take(p->b_phq);
    b.phk = take(p->b_phk);
    b.c = (double *)take(p->b_c);
    b.P = (double *)take(p->b_p);
    b.vw = take(p->b_vw);
    b.vs = take(p->b_vs);
    b.st = (float *)take(p->b_st);
    b.sb = take(p->b_sb);
    b.a = take(p->b_a);
    double *ref = (double *)take(p->b_ref);
    b.x = (float *)b.a; /* half inputs widened, before A' is made (plan_make) */
    /* the U region (G b_u bytes): U; causal: then dS, A in float32, then O and O2 (every head's
     * O, then every head's O2); bidirectional: then O. Each is dead before the next is made. */
    b.o = b.u;
    if (p->causal) {
        b.eref = ref;
        b.cm = ref + (size_t)p->nch * G;
        b.alpha = (float *)(b.cm + (size_t)p->nch * G);
        b.st = b.u;
        b.a32 = b.u;
        b.o2 = b.u + (size_t)G * p->Lp * p->dw;
    } else {
        b.cm = ref;
    }
    return b;
}

PF_CUDA_API pf_status pf_cuda_favor_workspace(size_t *per_head, size_t *fixed, pf_cuda_dtype dtype,
                                              const pf_shape *shape, const pf_attn_opts *opts,
                                              const pf_favor_opts *favor) {
    pf_cuda_clear_error();
    favor_plan p;
    pf_status st = plan_make(&p, dtype, shape, opts, favor);
    if (st != PF_OK) return st;
    if (per_head) *per_head = p.per_head;
    if (fixed) *fixed = p.fixed + 256;
    return PF_OK;
}

/* ---- kernels ---------------------------------------------------------------------------------- */

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ int warp_any(int v) {
    return __any_sync(0xffffffffu, v);
}

/* W (n floats) copied into dst, flagging a NaN or Inf (the products read the copy, so that W
 * cannot change under a call). */
__global__ void k_copy_w(float *dst, const float *W, size_t n, unsigned *flags) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float w = W[i];
        if (!isfinite(w)) pf_raise(flags, PF_FLAG_INPUT);
        dst[i] = w;
    }
}

/* Half-precision rows widened to float32 (exactly), n elements. */
template <typename Tin>
__global__ void k_widen(float *dst, const Tin *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = pf_ld(src + i);
}

/* The features of one row by one warp: u (m floats, global or shared memory, already scaled
 * by sqrt(s)) and the row x (d elements of Tin, for h) -> out (r elements of Tc) and, with c not
 * NULL, its log factor *c. A NaN or Inf in x or u is flagged and the row written as zeros
 * (c = -inf). Every lane of the warp calls it. */
template <typename Tin, typename Tc>
__device__ void feature_row(Tc *out, double *c, const float *u, const Tin *x, int d, double s2,
                            const pf_fmap_dev &fm, unsigned *flags) {
    const int lane = threadIdx.x & 31;
    const int m = fm.m, r = fm.r;
    double sq = 0;
    for (int k = lane; k < d; k += 32) {
        const double v = (double)pf_ld(x + k);
        sq += v * v;
    }
    sq = warp_sum(sq);
    const double h = 0.5 * s2 * sq;
    float mx = -INFINITY, amx = 0.0f;
    int bad = !isfinite(sq);
    for (int f = lane; f < m; f += 32) {
        const float v = u[f];
        bad |= !isfinite(v);
        mx = fmaxf(mx, v);
        amx = fmaxf(amx, fabsf(v));
    }
    if (warp_any(bad)) {
        if (lane == 0) pf_raise(flags, PF_FLAG_INPUT);
        for (int f = lane; f < r; f += 32) pf_st(out + f, 0.0f);
        if (c && lane == 0) *c = -INFINITY;
        return;
    }
    mx = warp_max(mx);
    amx = warp_max(amx);
    double cr = 0;
    switch (fm.kernel) {
    case PF_KERNEL_HYPERBOLIC: {
        float top;
        const float t = pf_fmap_shift(fm, amx, &top);
        const float add = fm.eps > 0 ? fm.eps * top : 0.0f;
        for (int f = lane; f < m; f += 32) {
            pf_st(out + f, expf(u[f] - t) + add);
            pf_st(out + m + f, expf(-u[f] - t) + add);
        }
        cr = (double)t - fm.lnr - h;
        break;
    }
    case PF_KERNEL_TRIG: {
        float top = 0.0f;
        for (int f = lane; f < m; f += 32) {
            float sn, cs;
            sincosf(u[f], &sn, &cs);
            top = fmaxf(top, fmaxf(fabsf(sn * fm.inv_sqrt_m), fabsf(cs * fm.inv_sqrt_m)));
        }
        top = warp_max(top);
        const float add = fm.eps > 0 ? fm.eps * top : 0.0f;
        for (int f = lane; f < m; f += 32) {
            float sn, cs;
            sincosf(u[f], &sn, &cs);
            pf_st(out + f, sn * fm.inv_sqrt_m + add);
            pf_st(out + m + f, cs * fm.inv_sqrt_m + add);
        }
        cr = h;
        break;
    }
    case PF_KERNEL_RELU:
        for (int f = lane; f < m; f += 32)
            pf_st(out + f, (u[f] > 0.0f ? u[f] : 0.0f) * fm.inv_sqrt_m + fm.eps);
        cr = 0;
        break;
    default: { /* positive */
        float top;
        const float t = pf_fmap_shift(fm, mx, &top);
        const float add = fm.eps > 0 ? fm.eps * top : 0.0f;
        for (int f = lane; f < m; f += 32) pf_st(out + f, expf(u[f] - t) + add);
        cr = (double)t - fm.lnr - h;
        break;
    }
    }
    if (c && lane == 0) *c = cr;
}

/* Features of rows [0, rows_alloc) of G heads, one warp a row: X (G heads at stride xs, rows of
 * d), U (G, rows_alloc, m) float32 -> phi (G, rows_alloc, r) Tc and, with c not NULL, the log
 * factors c (G, rows_alloc). Rows at or after the head's valid length (n, or its key length)
 * get zero features and c = -inf. */
template <typename Tin, typename Tc>
__global__ void k_features(Tc *phi, double *c, const float *U, const Tin *X, size_t xs, int G,
                           int rows_alloc, int n, const int32_t *klen, int bh0, int H, int d,
                           double s2, pf_fmap_dev fm, unsigned *flags) {
    const int lane = threadIdx.x & 31;
    const size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
    if (row >= (size_t)G * rows_alloc) return;
    const int g = (int)(row / rows_alloc), i = (int)(row % rows_alloc);
    const int valid = klen ? min(n, (int)klen[(bh0 + g) / H]) : n;
    Tc *out = phi + row * (size_t)fm.r;
    if (i >= valid) {
        for (int f = lane; f < fm.r; f += 32) pf_st(out + f, 0.0f);
        if (c && lane == 0) c[row] = -INFINITY;
        return;
    }
    feature_row<Tin, Tc>(out, c ? c + row : NULL, U + row * (size_t)fm.m,
                         X + (size_t)g * xs + (size_t)i * d, d, s2, fm, flags);
}

/* Block-wide max of doubles (blockDim.x <= 1024). */
__device__ double block_max(double v, double *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < (int)(blockDim.x >> 5) ? sh[lane] : -INFINITY;
        for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    v = sh[0];
    __syncthreads();
    return v;
}

/* M[g] = max_j c[g][j] over n values. One block a head. */
__global__ void k_max(double *M, const double *c, int n) {
    __shared__ double sh[32];
    const double *cg = c + (size_t)blockIdx.x * n;
    double v = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) v = fmax(v, cg[j]);
    v = block_max(v, sh);
    if (threadIdx.x == 0) M[blockIdx.x] = v;
}

__device__ __forceinline__ double warp_maxd(double v) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* cm[g][t] = the largest c of rows [t C, min((t + 1) C, rows)) of head g (c: G heads of rows
 * values), one warp a (head, block of rows). */
__global__ void k_chunk_max(double *cm, const double *c, int rows, int C, int nch, int G) {
    const size_t w = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
    if (w >= (size_t)G * nch) return;
    const int lane = threadIdx.x & 31, t = (int)(w % nch);
    const double *cg = c + (w / nch) * rows;
    const int end = min(rows, (t + 1) * C);
    double v = -INFINITY;
    for (int i = t * C + lane; i < end; i += 32) v = fmax(v, cg[i]);
    v = warp_maxd(v);
    if (lane == 0) cm[w] = v;
}

/* Causal, per head (one block of up to 1024 threads, each a contiguous run of chunks): from the
 * chunks' maxima cm, E_t = max(cm_0..cm_t), the state's reference before chunk t,
 * eref[t] = E_(t-1) (-inf for t = 0), and the rebase factor alpha_t = e^(E_(t-1) - E_t) (0
 * before any key). */
__global__ void k_chunk_scan(double *eref, float *alpha, const double *cm, int nch) {
    __shared__ double seg[1024];
    const size_t g = blockIdx.x;
    const double *cg = cm + g * nch;
    const int T = blockDim.x, per = (nch + T - 1) / T;
    const int t0 = threadIdx.x * per, t1 = min(nch, t0 + per);
    double run = -INFINITY;
    for (int t = t0; t < t1; t++) run = fmax(run, cg[t]);
    seg[threadIdx.x] = run;
    __syncthreads();
    for (int o = 1; o < T; o <<= 1) { /* inclusive scan of the runs' maxima (Hillis-Steele) */
        const double v = threadIdx.x >= (unsigned)o ? seg[threadIdx.x - o] : -INFINITY;
        __syncthreads();
        seg[threadIdx.x] = fmax(seg[threadIdx.x], v);
        __syncthreads();
    }
    run = threadIdx.x > 0 ? seg[threadIdx.x - 1] : -INFINITY;
    for (int t = t0; t < t1; t++) {
        const double prev = run;
        run = fmax(run, cg[t]);
        eref[g * nch + t] = prev;
        alpha[g * nch + t] =
            prev == -INFINITY ? 0.0f : (prev == run ? 1.0f : expf((float)(prev - run)));
    }
}

/* Causal: P[g][i] = max(E_(t-1), c over the rows of chunk t up to i) = max_{j <= i} c[g][j],
 * one warp a (head, chunk), a warp scan 32 rows at a time. */
__global__ void k_row_prefix(double *P, const double *c, const double *eref, int Lp, int C,
                             int nch, int G) {
    const size_t w = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
    if (w >= (size_t)G * nch) return;
    const int lane = threadIdx.x & 31, t = (int)(w % nch);
    const size_t base = (w / nch) * Lp;
    const int end = (t + 1) * C;
    double run = eref[w];
    for (int i0 = t * C; i0 < end; i0 += 32) {
        const int i = i0 + lane;
        double v = i < end ? c[base + i] : -INFINITY;
        for (int o = 1; o < 32; o <<= 1) {
            const double y = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) v = fmax(v, y);
        }
        v = fmax(v, run);
        if (i < end) P[base + i] = v;
        run = __shfl_sync(0xffffffffu, v, 31);
    }
}

/* Weighted values: row j of head g, columns [0, dw): w [v_j | 1 | 0...], w = e^(c_j - ref).
 * Bidirectional: vs with ref = M[g]. Causal: vw unweighted (w = 1) and vs with ref = E_t(j)
 * (the running max at the end of j's chunk). Rows past the valid keys (c = -inf) are zero. A NaN or
 * Inf in a valid row of V is flagged. Block (32, 8): x walks the columns, y the rows. */
template <typename Tin, typename Tc>
__global__ void k_weights(Tc *vw, Tc *vs, const Tin *V, size_t vstride, const double *c,
                          const double *P, const double *M, int G, int rows_alloc, int L, int C,
                          int dv, int dw, unsigned *flags) {
    const size_t row = blockIdx.x * (size_t)blockDim.y + threadIdx.y;
    if (row >= (size_t)G * rows_alloc) return;
    const int g = (int)(row / rows_alloc), j = (int)(row % rows_alloc);
    const double cj = c[row];
    float ws = 0.0f, ww = 0.0f;
    if (cj > -INFINITY) {
        if (P) {
            const size_t gp = (size_t)g * rows_alloc;
            const int tend = min(rows_alloc, (j / C + 1) * C) - 1;
            ww = 1.0f;
            ws = P[gp + tend] == cj ? 1.0f : expf((float)(cj - P[gp + tend]));
        } else {
            ws = M[g] == cj ? 1.0f : expf((float)(cj - M[g]));
        }
    }
    const Tin *v = V + (size_t)g * vstride + (size_t)j * dv;
    Tc *os = vs + row * (size_t)dw;
    Tc *ow = vw ? vw + row * (size_t)dw : NULL;
    const int live = cj > -INFINITY && j < L;
    for (int e = threadIdx.x; e < dw; e += blockDim.x) {
        float x = 0.0f;
        if (e < dv && live) {
            x = pf_ld(v + e);
            if (!isfinite(x)) pf_raise(flags, PF_FLAG_INPUT);
        } else if (e == dv) {
            x = 1.0f;
        }
        pf_st(os + e, ws * x);
        if (ow) pf_st(ow + e, ww * x);
    }
}

/* Prefix of the chunks' states: Sb_0 = 0, Sb_(t+1) = alpha_t Sb_t + dS_t (alpha_t rebases the
 * running sum from E_(t-1) to E_t); each thread one element of one head, walking the chunks,
 * four chunks' loads issued before their sums (the walk is latency-bound otherwise). */
template <typename Tc>
__global__ void k_state_prefix(Tc *Sb, const float *dS, const float *alpha, int G, int nch,
                               size_t per) {
    const size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)G * per) return;
    const size_t g = idx / per, e = idx % per;
    const float *a = alpha + g * nch;
    const float *src = dS + g * nch * per + e;
    Tc *dst = Sb + g * nch * per + e;
    float cur = 0.0f;
    int t = 0;
    for (; t + 4 <= nch; t += 4) {
        float x[4], al[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            x[k] = __ldg(src + (size_t)(t + k) * per);
            al[k] = __ldg(a + t + k);
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            pf_st(dst + (size_t)(t + k) * per, cur);
            cur = al[k] * cur + x[k];
        }
    }
    for (; t < nch; t++) {
        pf_st(dst + (size_t)t * per, cur);
        cur = a[t] * cur + src[(size_t)t * per];
    }
}

/* float32 -> Tc, n elements. */
template <typename Tc>
__global__ void k_to_tc(Tc *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        pf_st(dst + i, src[i]);
}

/* The causal chunks' scores: A'_ij = A_ij e^(c_j - P_i) for j <= i with key j valid, else 0
 * (A (G*nch, C, C) float32 -> Tc), one thread an element. */
template <typename Tc>
__global__ void k_mask(Tc *A, const float *A32, const double *P, const double *c, int G,
                       int Lp, int C) {
    const size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t n = (size_t)G * Lp * C;
    if (idx >= n) return;
    const int j = (int)(idx % C);
    const size_t rowg = idx / C; /* row of the head's Lp rows, over every head */
    const int i = (int)(rowg % Lp) % C;
    const size_t kj = rowg - i + j; /* key j of the same chunk and head */
    float v = 0.0f;
    if (j <= i && c[kj] > -INFINITY) {
        const double pi = P[rowg], cj = c[kj];
        v = A32[idx];
        if (cj != pi) v *= expf((float)(cj - pi));
    }
    pf_st(A + idx, v);
}

/* out_i = O_i[:dv] / O_i[dv] for rows i < L of G heads (O rows at stride dw, rows_alloc per
 * head); a zero or non-finite denominator or output is flagged and its row written as zeros.
 * Causal (O2 not NULL): O holds the state term phi~(q_i) Sb_t and O2 the chunk's own keys'
 * A'_t V1_t, and the row is e^(E_(t-1) - P_i) O_i + O2_i (the factor rebases the state to the
 * row's reference P_i; 0 before any key). */
template <typename Tin>
__global__ void k_normalise(Tin *out, const float *O, const float *O2, const double *P,
                            const double *eref, int C, int nch, int G, int rows_alloc, int L,
                            int dv, int dw, unsigned *flags) {
    const size_t row = blockIdx.x * (size_t)blockDim.y + threadIdx.y;
    if (row >= (size_t)G * L) return;
    const size_t g = row / L, i = row % L;
    const float *o = O + (g * rows_alloc + i) * dw;
    const float *o2 = O2 ? O2 + (g * rows_alloc + i) * dw : NULL;
    float f = 1.0f;
    if (O2) {
        const double E = eref[g * nch + i / C], pi = P[g * rows_alloc + i];
        f = E == pi ? 1.0f : (E == -INFINITY ? 0.0f : expf((float)(E - pi)));
    }
    Tin *dst = out + row * (size_t)dv;
    const float den = o2 ? f * o[dv] + o2[dv] : o[dv];
    const float inv = 1.0f / den;
    unsigned bad = !isfinite(den) ? PF_FLAG_BAD_DEN
                   : den == 0.0f  ? PF_FLAG_ZERO_DEN
                   : !isfinite(inv) ? PF_FLAG_BAD_DEN
                                    : 0u;
    for (int e = threadIdx.x; e < dv; e += blockDim.x) {
        const float num = o2 ? f * o[e] + o2[e] : o[e];
        const float y = bad ? 0.0f : num * inv + 0.0f;
        if (!isfinite(y)) {
            pf_raise(flags, PF_FLAG_BAD_DEN);
            pf_st(dst + e, 0.0f);
        } else {
            pf_st(dst + e, y);
        }
    }
    if (bad && threadIdx.x == 0) pf_raise(flags, bad);
}

/* ---- the host side ----------------------------------------------------------------------------- */

struct favor_run {
    pf_cuda_ctx *ctx;
    const favor_plan *p;
    cudaStream_t stream;
    cudaDataType_t tc_t;
    cublasComputeType_t compute; /* for float32 operands: TF32 only if allowed */
    const int32_t *klen;         /* device key lengths or NULL */
};

/* C (rows of ldc) = alpha op(A) op(B) + beta C, column-major, batched with strides, float32 out. */
static pf_status gemm(const favor_run &R, cublasOperation_t ta, cublasOperation_t tb, int M,
                      int N, int K, float alpha, const void *A, cudaDataType_t at, int lda,
                      long long sa, const void *B, int ldb, long long sb, float beta, float *C,
                      int ldc, long long sc, int batch, const char *what,
                      cublasComputeType_t f32 = CUBLAS_COMPUTE_32F) {
    /* float32 operands: f32 if given (the projection of half inputs), else as allowed */
    const cublasComputeType_t ct =
        at != CUDA_R_32F ? CUBLAS_COMPUTE_32F
                         : (f32 == CUBLAS_COMPUTE_32F_FAST_TF32 ? f32 : R.compute);
    cublasStatus_t e = cublasGemmStridedBatchedEx(R.ctx->blas, ta, tb, M, N, K, &alpha, A, at, lda,
                                                  sa, B, at, ldb, sb, &beta, C, CUDA_R_32F, ldc,
                                                  sc, batch, ct, CUBLAS_GEMM_DEFAULT);
    return e == CUBLAS_STATUS_SUCCESS ? PF_OK : pf_cublas_err(e, what);
}

static unsigned grid_for(size_t threads, int block) {
    size_t g = (threads + block - 1) / block;
    return (unsigned)std::min(g, (size_t)INT32_MAX);
}

/* U (G, ldrows, m) = sqrt(s) X W^T for the G heads from bh0, X (bh, n, d) in Tin. W per head
 * runs one batched product per run of heads of one batch element. Half inputs are widened to
 * float32 first and multiplied on TF32 tensor cores (float32 inputs: TF32 only if allowed). */
template <typename Tin>
static pf_status project(const favor_run &R, const favor_bufs &b, const void *X, int n,
                         int ldrows, int bh0, int G) {
    const favor_plan *p = R.p;
    const size_t xs = (size_t)n * p->d;
    const long long su = (long long)ldrows * p->m;
    const char *xbase = (const char *)X + (size_t)bh0 * xs * p->tin;
    size_t xes = p->tin;
    cublasComputeType_t ct = R.compute;
    if (p->tin == 2) {
        const size_t nx = (size_t)G * xs;
        k_widen<Tin><<<grid_for(nx, 256), 256, 0, R.stream>>>(b.x, (const Tin *)xbase, nx);
        xbase = (const char *)b.x;
        xes = 4;
        ct = CUBLAS_COMPUTE_32F_FAST_TF32;
    }
    int g = 0;
    while (g < G) {
        int run = G - g, woff = 0;
        long long sw = 0;
        if (p->w_per_head) {
            const int h = (bh0 + g) % p->H;
            run = std::min(run, p->H - h);
            woff = h;
            sw = (long long)p->m * p->d;
        }
        const char *x = xbase + (size_t)g * xs * xes;
        const float *w = b.W + (size_t)woff * p->m * p->d;
        pf_status st = gemm(R, CUBLAS_OP_T, CUBLAS_OP_N, p->m, n, p->d, p->sqrt_s, w, CUDA_R_32F,
                            p->d, sw, x, p->d, (long long)xs, 0.0f, b.u + (size_t)g * su, p->m,
                            su, run, "projection X W^T", ct);
        if (st != PF_OK) return st;
        g += run;
    }
    return PF_OK;
}

/* The stages' work, as the profile reports it. */
static void account(pf_cuda_ctx *ctx, int stage, double flops, double bytes) {
    if (!ctx->profile) return;
    ctx->stage_flops[stage] += flops;
    ctx->stage_bytes[stage] += bytes;
}

/* The features phi~ (G, rows_alloc, r) and, with c not NULL, the log factors of the rows X of
 * the G heads from bh0 (n valid rows, klen: key lengths or NULL): the projection through
 * cuBLAS into U, then the features from it. */
template <typename Tin, typename Tc>
static pf_status features(const favor_run &R, const favor_bufs &b, Tc *phi, double *c,
                          const void *X, int n, int rows_alloc, int bh0, int G,
                          const int32_t *klen) {
    const favor_plan *p = R.p;
    pf_cuda_ctx *ctx = R.ctx;
    const double rows = (double)G * n;
    const Tin *Xg = (const Tin *)X + (size_t)bh0 * n * p->d;
    pf_cuda_mark(ctx, ST_PROJECT);
    pf_status st = project<Tin>(R, b, X, n, rows_alloc, bh0, G);
    if (st != PF_OK) return st;
    account(ctx, ST_PROJECT, 2.0 * rows * p->m * p->d, rows * (p->d * p->tin + p->m * 4.0));
    pf_cuda_mark(ctx, ST_FEATURES);
    const size_t nrows = (size_t)G * rows_alloc;
    k_features<Tin, Tc><<<grid_for(nrows * 32, 256), 256, 0, R.stream>>>(
        phi, c, b.u, Xg, (size_t)n * p->d, G, rows_alloc, n, klen, bh0, p->H, p->d, p->s2,
        p->fm, ctx->flags);
    account(ctx, ST_FEATURES, 0,
            rows * (p->m * 4.0 + p->d * p->tin) + (double)nrows * p->r * p->tc);
    return PF_OK;
}


template <typename Tin, typename Tc>
static pf_status group_bidirectional(const favor_run &R, const favor_bufs &b, void *out,
                                     const void *Q, const void *K, const void *V, int bh0, int G) {
    const favor_plan *p = R.p;
    pf_cuda_ctx *ctx = R.ctx;
    const int Lq = p->Lq, Lk = p->Lk, r = p->r, dw = p->dw;
    const double tin = (double)p->tin, tc = (double)p->tc;
    pf_status st;
    if ((st = features<Tin, Tc>(R, b, (Tc *)b.phk, b.c, K, Lk, Lk, bh0, G, R.klen)) != PF_OK)
        return st;
    k_chunk_max<<<grid_for((size_t)G * p->ncm * 32, 256), 256, 0, R.stream>>>(
        b.cm, b.c, Lk, MAX_ROWS, p->ncm, G);
    k_max<<<G, 256, 0, R.stream>>>(b.P, b.cm, p->ncm);
    pf_cuda_mark(ctx, ST_WEIGHTS);
    k_weights<Tin, Tc><<<grid_for((size_t)G * Lk, 8), dim3(32, 8), 0, R.stream>>>(
        NULL, (Tc *)b.vs, (const Tin *)V + (size_t)bh0 * Lk * p->dv, (size_t)Lk * p->dv, b.c,
        NULL, b.P, G, Lk, Lk, 1, p->dv, dw, ctx->flags);
    account(ctx, ST_WEIGHTS, 0, G * (Lk * p->dv * tin + Lk * dw * tc));
    pf_cuda_mark(ctx, ST_CHUNK);
    /* S (r x dw) = phi~(K)^T Vs: column-major S^T (dw x r) = Vs^T phi~(K) */
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_T, dw, r, Lk, 1.0f, b.vs, R.tc_t, dw,
                   (long long)Lk * dw, b.phk, r, (long long)Lk * r, 0.0f, b.st, dw,
                   (long long)r * dw, G, "key state phi(K)^T [V|1]")) != PF_OK)
        return st;
    account(ctx, ST_CHUNK, 2.0 * G * Lk * r * dw, G * (Lk * (r + dw) * tc + r * dw * 4.0));
    if ((st = features<Tin, Tc>(R, b, (Tc *)b.phq, NULL, Q, Lq, Lq, bh0, G, NULL)) != PF_OK)
        return st;
    const void *S = b.st;
    pf_cuda_mark(ctx, ST_PREFIX);
    if (p->tc == 2) {
        const size_t n = (size_t)G * r * dw;
        k_to_tc<Tc><<<grid_for(n, 256), 256, 0, R.stream>>>((Tc *)b.sb, b.st, n);
        S = b.sb;
        account(ctx, ST_PREFIX, 0, n * (4.0 + tc));
    }
    pf_cuda_mark(ctx, ST_READOUT);
    /* O (Lq x dw) = phi~(Q) S: column-major O^T = S^T phi~(Q)^T */
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_N, dw, Lq, r, 1.0f, S, R.tc_t, dw, (long long)r * dw,
                   b.phq, r, (long long)Lq * r, 0.0f, b.o, dw, (long long)Lq * dw, G,
                   "readout phi(Q) S")) != PF_OK)
        return st;
    account(ctx, ST_READOUT, 2.0 * G * Lq * r * dw, G * (Lq * r * tc + r * dw * tc + Lq * dw * 4.0));
    pf_cuda_mark(ctx, ST_NORM);
    k_normalise<Tin><<<grid_for((size_t)G * Lq, 8), dim3(32, 8), 0, R.stream>>>(
        (Tin *)out + (size_t)bh0 * Lq * p->dv, b.o, NULL, NULL, NULL, 1, 1, G, Lq, Lq, p->dv, dw,
        ctx->flags);
    account(ctx, ST_NORM, 0, G * (Lq * dw * 4.0 + Lq * p->dv * tin));
    return PF_OK;
}

template <typename Tin, typename Tc>
static pf_status group_causal(const favor_run &R, const favor_bufs &b, void *out, const void *Q,
                              const void *K, const void *V, int bh0, int G) {
    const favor_plan *p = R.p;
    pf_cuda_ctx *ctx = R.ctx;
    const int L = p->Lq, Lp = p->Lp, C = p->C, nch = p->nch, r = p->r, dw = p->dw;
    const double tin = (double)p->tin, tc = (double)p->tc;
    const size_t per = (size_t)r * dw;
    pf_status st;
    /* keys: features, log factors, running maxima, weighted values */
    if ((st = features<Tin, Tc>(R, b, (Tc *)b.phk, b.c, K, L, Lp, bh0, G, R.klen)) != PF_OK)
        return st;
    k_chunk_max<<<grid_for((size_t)G * nch * 32, 256), 256, 0, R.stream>>>(b.cm, b.c, Lp, C,
                                                                            nch, G);
    k_chunk_scan<<<G, 1024, 0, R.stream>>>(b.eref, b.alpha, b.cm, nch);
    k_row_prefix<<<grid_for((size_t)G * nch * 32, 256), 256, 0, R.stream>>>(b.P, b.c, b.eref,
                                                                             Lp, C, nch, G);
    account(ctx, ST_FEATURES, 0, G * Lp * 16.0);
    if ((st = features<Tin, Tc>(R, b, (Tc *)b.phq, NULL, Q, L, Lp, bh0, G, NULL)) != PF_OK)
        return st;
    pf_cuda_mark(ctx, ST_WEIGHTS);
    k_weights<Tin, Tc><<<grid_for((size_t)G * Lp, 8), dim3(32, 8), 0, R.stream>>>(
        (Tc *)b.vw, (Tc *)b.vs, (const Tin *)V + (size_t)bh0 * L * p->dv, (size_t)L * p->dv, b.c,
        b.P, NULL, G, Lp, L, C, p->dv, dw, ctx->flags);
    account(ctx, ST_WEIGHTS, 0, G * (L * p->dv * tin + 2.0 * Lp * dw * tc));
    /* dS_t (r x dw) = phi~(K_t)^T Vs_t for every chunk; column-major dS^T = Vs_t^T phi~(K_t).
     * (b.st is the projection's buffer, free now that both sides' features are made.) */
    pf_cuda_mark(ctx, ST_CHUNK);
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_T, dw, r, C, 1.0f, b.vs, R.tc_t, dw,
                   (long long)C * dw, b.phk, r, (long long)C * r, 0.0f, b.st, dw,
                   (long long)per, G * nch, "chunk states phi(K_t)^T [V_t|1]")) != PF_OK)
        return st;
    account(ctx, ST_CHUNK, 2.0 * G * Lp * r * dw, G * (Lp * (r + dw) * tc + nch * per * 4.0));
    pf_cuda_mark(ctx, ST_PREFIX);
    k_state_prefix<Tc><<<grid_for((size_t)G * per, 256), 256, 0, R.stream>>>(
        (Tc *)b.sb, b.st, b.alpha, G, nch, per);
    account(ctx, ST_PREFIX, 0, G * nch * per * (4.0 + tc));
    /* A_t (C x C) = phi~(Q_t) phi~(K_t)^T; column-major A^T = phi~(K_t) phi~(Q_t)^T */
    pf_cuda_mark(ctx, ST_SCORES);
    if ((st = gemm(R, CUBLAS_OP_T, CUBLAS_OP_N, C, C, r, 1.0f, b.phk, R.tc_t, r,
                   (long long)C * r, b.phq, r, (long long)C * r, 0.0f, b.a32, C,
                   (long long)C * C, G * nch, "chunk scores phi(Q_t) phi(K_t)^T")) != PF_OK)
        return st;
    {
        const size_t n = (size_t)G * Lp * C;
        k_mask<Tc><<<grid_for(n, 256), 256, 0, R.stream>>>((Tc *)b.a, b.a32, b.P, b.c, G, Lp, C);
    }
    account(ctx, ST_SCORES, 2.0 * G * Lp * C * r,
            G * (2.0 * Lp * r * tc + Lp * C * (8.0 + tc)));
    /* O_t = phi~(Q_t) Sb_t and O2_t = A'_t V1_t (the normalisation rebases and adds them);
     * column-major O^T = Sb^T phi~(Q_t)^T, O2^T = V1^T A'^T */
    pf_cuda_mark(ctx, ST_READOUT);
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_N, dw, C, r, 1.0f, b.sb, R.tc_t, dw, (long long)per,
                   b.phq, r, (long long)C * r, 0.0f, b.o, dw, (long long)C * dw, G * nch,
                   "chunk readout phi(Q_t) Sb_t")) != PF_OK)
        return st;
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_N, dw, C, C, 1.0f, b.vw, R.tc_t, dw,
                   (long long)C * dw, b.a, C, (long long)C * C, 0.0f, b.o2, dw, (long long)C * dw,
                   G * nch, "chunk readout A'_t V1_t")) != PF_OK)
        return st;
    account(ctx, ST_READOUT, 2.0 * G * Lp * dw * (r + C),
            G * (Lp * r * tc + nch * per * tc + Lp * C * tc + Lp * dw * (tc + 8.0)));
    pf_cuda_mark(ctx, ST_NORM);
    k_normalise<Tin><<<grid_for((size_t)G * L, 8), dim3(32, 8), 0, R.stream>>>(
        (Tin *)out + (size_t)bh0 * L * p->dv, b.o, b.o2, b.P, b.eref, C, nch, G, Lp, L, p->dv, dw,
        ctx->flags);
    account(ctx, ST_NORM, 0, G * (2.0 * L * dw * 4.0 + L * p->dv * tin));
    return PF_OK;
}

template <typename Tin, typename Tc>
static pf_status run_all(const favor_run &R, void *out, const void *Q, const void *K,
                         const void *V, const float *W, int G) {
    const favor_plan *p = R.p;
    pf_cuda_ctx *ctx = R.ctx;
    const size_t wn = (size_t)(p->w_per_head ? p->H : 1) * p->m * p->d;
    favor_bufs b = bufs_carve(p, ctx->ws, G);
    pf_cuda_mark(ctx, ST_PROJECT);
    k_copy_w<<<grid_for(wn, 256), 256, 0, R.stream>>>(b.W, W, wn, ctx->flags);
    const int BH = p->B * p->H;
    for (int bh0 = 0; bh0 < BH; bh0 += G) {
        const int g = std::min(G, BH - bh0);
        pf_status st = p->causal ? group_causal<Tin, Tc>(R, b, out, Q, K, V, bh0, g)
                                 : group_bidirectional<Tin, Tc>(R, b, out, Q, K, V, bh0, g);
        if (st != PF_OK) return st;
    }
    pf_cuda_mark(ctx, -1);
    return PF_OK;
}

/* Whether [a, a + na) and [b, b + nb) overlap. */
static int overlaps(const void *a, size_t na, const void *b, size_t nb) {
    const char *x = (const char *)a, *y = (const char *)b;
    return x < y + nb && y < x + na;
}

/* The key lengths, read from host or device memory into the context's device copy. */
static pf_status key_lengths(pf_cuda_ctx *ctx, const int32_t *kl, int B, int Lk,
                             cudaStream_t stream, const int32_t **dev) {
    *dev = NULL;
    if (!kl) return PF_OK;
    std::vector<int32_t> h((size_t)B);
    const int where = pf_cuda_is_device(kl);
    if (where == 1) {
        cudaError_t e = cudaMemcpyAsync(h.data(), kl, sizeof(int32_t) * B, cudaMemcpyDeviceToHost,
                                        stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
        if (e != cudaSuccess) return pf_cuda_err(e, "reading opts.key_len");
    } else {
        memcpy(h.data(), kl, sizeof(int32_t) * B);
    }
    for (int b = 0; b < B; b++)
        if (h[b] < 1 || h[b] > Lk)
            return pf_cuda_fail(PF_EINVAL, "opts.key_len[%d] = %d is outside [1, Lk = %d]", b,
                                (int)h[b], Lk);
    if (ctx->klen_cap < B) {
        cudaFree(ctx->klen);
        ctx->klen = NULL;
        ctx->klen_cap = 0;
        cudaError_t e = cudaMalloc((void **)&ctx->klen, sizeof(int32_t) * B);
        if (e != cudaSuccess) return pf_cuda_err(e, "key lengths");
        ctx->klen_cap = B;
    }
    cudaError_t e = cudaMemcpyAsync(ctx->klen, h.data(), sizeof(int32_t) * B,
                                    cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream); /* h is about to go */
    if (e != cudaSuccess) return pf_cuda_err(e, "key lengths");
    *dev = ctx->klen;
    return PF_OK;
}

/* Grows the workspace to `bytes` (waiting for the device first: the old one may be in use). */
static pf_status workspace(pf_cuda_ctx *ctx, size_t bytes) {
    if (ctx->ws_bytes >= bytes) return PF_OK;
    cudaDeviceSynchronize();
    cudaFree(ctx->ws);
    ctx->ws = NULL;
    ctx->ws_bytes = 0;
    cudaError_t e = cudaMalloc(&ctx->ws, bytes);
    if (e != cudaSuccess)
        return pf_cuda_err(e, "allocating the workspace (pf_cuda_ctx_set_workspace_limit sets "
                              "how much a call may use)");
    ctx->ws_bytes = bytes;
    return PF_OK;
}

PF_CUDA_API pf_status pf_cuda_favor(pf_cuda_ctx *ctx, void *out, const void *Q, const void *K,
                                    const void *V, pf_cuda_dtype dtype, const pf_shape *shape,
                                    const pf_attn_opts *opts, const pf_favor_opts *favor,
                                    cudaStream_t stream) {
    pf_cuda_clear_error();
    if (!ctx) return pf_cuda_fail(PF_EINVAL, "pf_cuda_favor: ctx is NULL");
    favor_plan p;
    pf_status st = plan_make(&p, dtype, shape, opts, favor);
    if (st != PF_OK) return st;
    pf_device_guard guard(ctx->device);
    if (!guard.ok) return pf_cuda_err(cudaGetLastError(), "cudaSetDevice");
    const struct {
        const void *ptr;
        const char *name;
        size_t bytes;
    } t[5] = {
        {out, "out", (size_t)p.B * p.H * p.Lq * p.dv * p.tin},
        {Q, "Q", (size_t)p.B * p.H * p.Lq * p.d * p.tin},
        {K, "K", (size_t)p.B * p.H * p.Lk * p.d * p.tin},
        {V, "V", (size_t)p.B * p.H * p.Lk * p.dv * p.tin},
        {favor->W, "favor.W", (size_t)(p.w_per_head ? p.H : 1) * p.m * p.d * sizeof(float)},
    };
    for (int i = 0; i < 5; i++)
        if ((st = pf_cuda_check_ptr(ctx, t[i].ptr, t[i].name)) != PF_OK) return st;
    for (int i = 1; i < 5; i++)
        if (overlaps(out, t[0].bytes, t[i].ptr, t[i].bytes))
            return pf_cuda_fail(PF_EINVAL, "out overlaps %s: the output needs memory of its own",
                                t[i].name);
    const int32_t *klen = NULL;
    if ((st = key_lengths(ctx, opts->key_len, p.B, p.Lk, stream, &klen)) != PF_OK) return st;
    /* heads at a time: as many as the limit allows, at least one */
    const int BH = p.B * p.H;
    size_t G = ctx->ws_limit > p.fixed + 256 ? (ctx->ws_limit - p.fixed - 256) / p.per_head : 0;
    G = std::max((size_t)1, std::min(G, (size_t)std::min(BH, 65535))); /* (a grid's y) */
    if ((st = workspace(ctx, p.fixed + 256 + G * p.per_head)) != PF_OK) return st;
    if ((st = pf_cuda_flags_reset(ctx, stream)) != PF_OK) return st;
    cublasStatus_t be = cublasSetStream(ctx->blas, stream);
    if (be != CUBLAS_STATUS_SUCCESS) return pf_cublas_err(be, "cublasSetStream");
    ctx->stream = stream;
    favor_run R;
    R.ctx = ctx;
    R.p = &p;
    R.stream = stream;
    R.tc_t = p.tc == 4 ? CUDA_R_32F : CUDA_R_16BF;
    R.compute = ctx->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    R.klen = klen;
    ctx->nmarks = 0;
    const float *W = favor->W;
    switch (dtype) {
    case PF_CUDA_F32: st = run_all<float, float>(R, out, Q, K, V, W, (int)G); break;
    case PF_CUDA_BF16: st = run_all<__nv_bfloat16, __nv_bfloat16>(R, out, Q, K, V, W, (int)G); break;
    case PF_CUDA_F16: st = run_all<__half, __nv_bfloat16>(R, out, Q, K, V, W, (int)G); break;
    }
    if (st != PF_OK) {
        cudaStreamSynchronize(stream);
        cudaGetLastError();
        ctx->nmarks = 0;
        return st;
    }
    st = pf_cuda_flags_read(ctx, stream);
    pf_cuda_marks_collect(ctx);
    if (st == PF_ENONFINITE || st == PF_EDOMAIN) {
        /* rows were written as zeros where a denominator failed; an input NaN can leave other
         * rows with values computed from zeroed features: the whole output is zeroed */
        if (ctx->flags_host[0]) { /* PF_FLAG_INPUT */
            cudaMemsetAsync(out, 0, t[0].bytes, stream);
            cudaStreamSynchronize(stream);
        }
    }
    return st;
}
