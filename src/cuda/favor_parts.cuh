/* favor_parts.cuh: what the FAVOR+ forward (favor.cu) and backward (backward.cu) share: the
 * plan of a call and its workspace, the kernels of the feature maps, the running maxima, the
 * weights of [V|1], the prefix of chunk states, the chunk masks and the normalisation, and the
 * host-side helpers (cuBLAS products, the projection, the features of a side, key lengths, the
 * workspace). favor.cu's header comment gives the arithmetic. Included by those two files only;
 * everything here is static to each. */
#ifndef PF_CUDA_FAVOR_PARTS_CUH
#define PF_CUDA_FAVOR_PARTS_CUH

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
        return pf_cuda_fail(f->kernel == PF_KERNEL_OPRF || f->kernel == PF_KERNEL_SDERF ||
                                    f->kernel == PF_KERNEL_ELU
                                ? PF_ENOTSUP
                                : PF_EINVAL,
                            "kernel %d: the GPU runs positive, hyperbolic, trig and relu "
                            "(FAVOR++, FAVOR# and elu run on the CPU library)", (int)f->kernel);
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

/* Carves a workspace: the fixed part first, then buffers of `per` bytes a head for G heads. */
struct ws_carver {
    char *x;
    int G;
    void *take(size_t per) {
        if (per == 0) return NULL;
        void *r = x;
        x += per * (size_t)G;
        return r;
    }
};

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
    b.W = (float *)ws;
    ws_carver cv = {(char *)ws + p->fixed, G};
    auto take = [&](size_t per) { return cv.take(per); };
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
static __global__ void k_copy_w(float *dst, const float *W, size_t n, unsigned *flags) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float w = W[i];
        if (!isfinite(w)) pf_raise(flags, PF_FLAG_INPUT);
        dst[i] = w;
    }
}

/* Half-precision rows widened to float32 (exactly), n elements. */
template <typename Tin>
static __global__ void k_widen(float *dst, const Tin *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = pf_ld(src + i);
}

/* The features of one row by one warp: u (m floats, global or shared memory, already scaled
 * by sqrt(s)) and the row x (d elements of Tin, for h) -> out (r elements of Tc) and, with c not
 * NULL, its log factor *c, with top not NULL, the row's largest phi~ before eps (what eps is
 * relative to; 0 for relu), which the backward needs. A NaN or Inf in x or u is flagged and the
 * row written as zeros (c = -inf, top 0). Every lane of the warp calls it. */
template <typename Tin, typename Tc>
__device__ void feature_row(Tc *out, double *c, float *top_out, const float *u, const Tin *x,
                            int d, double s2, const pf_fmap_dev &fm, unsigned *flags) {
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
        if (top_out && lane == 0) *top_out = 0.0f;
        return;
    }
    mx = warp_max(mx);
    float top_row = 0.0f;
    amx = warp_max(amx);
    double cr = 0;
    switch (fm.kernel) {
    case PF_KERNEL_HYPERBOLIC: {
        float top;
        const float t = pf_fmap_shift(fm, amx, &top);
        const float add = fm.eps > 0 ? fm.eps * top : 0.0f;
        top_row = top;
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
        top_row = top;
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
        /* rounded up where u > 0 and down elsewhere, so that the stored phi~ is above eps exactly
         * where u > 0: the backward takes relu's kink from it (in float32 nothing changes) */
        for (int f = lane; f < m; f += 32)
            pf_st_dir(out + f, (u[f] > 0.0f ? u[f] : 0.0f) * fm.inv_sqrt_m + fm.eps, u[f] > 0.0f);
        cr = 0;
        break;
    default: { /* positive */
        float top;
        const float t = pf_fmap_shift(fm, mx, &top);
        const float add = fm.eps > 0 ? fm.eps * top : 0.0f;
        top_row = top;
        for (int f = lane; f < m; f += 32) pf_st(out + f, expf(u[f] - t) + add);
        cr = (double)t - fm.lnr - h;
        break;
    }
    }
    if (c && lane == 0) *c = cr;
    if (top_out && lane == 0) *top_out = top_row;
}

/* Features of rows [0, rows_alloc) of G heads, one warp a row: X (G heads at stride xs, rows of
 * d), U (G, rows_alloc, m) float32 -> phi (G, rows_alloc, r) Tc and, with c not NULL, the log
 * factors c (G, rows_alloc). Rows at or after the head's valid length (n, or its key length)
 * get zero features and c = -inf. */
template <typename Tin, typename Tc>
static __global__ void k_features(Tc *phi, double *c, float *top, const float *U, const Tin *X, size_t xs, int G,
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
        if (top && lane == 0) top[row] = 0.0f;
        return;
    }
    feature_row<Tin, Tc>(out, c ? c + row : NULL, top ? top + row : NULL, U + row * (size_t)fm.m,
                         X + (size_t)g * xs + (size_t)i * d, d, s2, fm, flags);
}

/* Block-wide max of doubles (blockDim.x <= 1024). */
static __device__ double block_max(double v, double *sh) {
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
static __global__ void k_max(double *M, const double *c, int n) {
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
static __global__ void k_chunk_max(double *cm, const double *c, int rows, int C, int nch, int G) {
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
static __global__ void k_chunk_scan(double *eref, float *alpha, const double *cm, int nch) {
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
static __global__ void k_row_prefix(double *P, const double *c, const double *eref, int Lp, int C,
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
static __global__ void k_weights(Tc *vw, Tc *vs, const Tin *V, size_t vstride, const double *c,
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
static __global__ void k_state_prefix(Tc *Sb, const float *dS, const float *alpha, int G, int nch,
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
static __global__ void k_to_tc(Tc *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        pf_st(dst + i, src[i]);
}

/* The causal chunks' scores: A'_ij = A_ij e^(c_j - P_i) for j <= i with key j valid, else 0
 * (A (G*nch, C, C) float32 -> Tc), one thread an element. */
template <typename Tc>
static __global__ void k_mask(Tc *A, const float *A32, const double *P, const double *c, int G,
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
static __global__ void k_normalise(Tin *out, const float *O, const float *O2, const double *P,
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

/* What a forward keeps for its backward (performer_cuda.h): for every head, the features of the
 * queries and of the keys (rows_q and rows_k rows of r elements of Tc: the plan's rows, padded
 * rows included), the keys' log factors and both sides' tops (feature_row). What it was made for
 * is kept, so that a backward of other arguments is refused. */
struct pf_cuda_favor_saved {
    pf_cuda_ctx *ctx;
    pf_cuda_dtype dtype;
    pf_shape shape;
    int causal;
    float scale;
    pf_favor_opts favor;               /* W: the device pointer it was made for */
    std::vector<int32_t> klen;         /* the key lengths of the filling forward (empty: none) */
    int filled;
    void *mem;
    size_t bytes;
    int rows_q, rows_k, r;
    size_t tc;
    void *phq, *phk;
    double *ck;
    float *topq, *topk;
};

struct favor_run {
    pf_cuda_ctx *ctx;
    const favor_plan *p;
    cudaStream_t stream;
    cudaDataType_t tc_t;
    cublasComputeType_t compute; /* for float32 operands: TF32 only if allowed */
    const int32_t *klen;         /* device key lengths or NULL */
    pf_cuda_favor_saved *sv;     /* the forward fills it / the backward reads it (or NULL) */
};

/* PF_OK if saved was made for these arguments (the key lengths apart), else PF_EINVAL saying
 * which differs. */
static pf_status saved_matches(const pf_cuda_favor_saved *v, const pf_cuda_ctx *ctx,
                               pf_cuda_dtype dtype, const pf_shape *s, const pf_attn_opts *o,
                               const pf_favor_opts *f) {
    const char *what = NULL;
    if (v->ctx != ctx) what = "the context";
    else if (v->dtype != dtype) what = "the dtype";
    else if (v->shape.B != s->B || v->shape.H != s->H || v->shape.Lq != s->Lq ||
             v->shape.Lk != s->Lk || v->shape.d != s->d || v->shape.dv != s->dv)
        what = "the shape";
    else if (v->causal != o->causal) what = "opts.causal";
    else if (v->scale != o->scale) what = "opts.scale";
    else if (v->favor.kernel != f->kernel || v->favor.m != f->m ||
             v->favor.w_per_head != f->w_per_head || v->favor.eps != f->eps ||
             v->favor.chunk != f->chunk)
        what = "the favor options (kernel, m, w_per_head, eps, chunk)";
    else if (v->favor.W != f->W) what = "favor.W (another pointer)";
    if (what)
        return pf_cuda_fail(PF_EINVAL, "the pf_cuda_favor_saved was made for other arguments: "
                                       "%s differs", what);
    return PF_OK;
}

/* Where the features of the G heads from bh0 are made (or, for a backward, read): in the kept
 * features when R.sv is set, else in the group's buffers. */
struct side_ptrs {
    void *phq, *phk;
    double *ck;
    float *topq, *topk;
};

static side_ptrs side_of(const favor_run &R, void *phq, void *phk, double *ck, float *topq,
                         float *topk, int bh0) {
    side_ptrs s = {phq, phk, ck, topq, topk};
    const pf_cuda_favor_saved *v = R.sv;
    if (v) {
        s.phq = (char *)v->phq + (size_t)bh0 * v->rows_q * v->r * v->tc;
        s.phk = (char *)v->phk + (size_t)bh0 * v->rows_k * v->r * v->tc;
        s.ck = v->ck + (size_t)bh0 * v->rows_k;
        s.topq = v->topq + (size_t)bh0 * v->rows_q;
        s.topk = v->topk + (size_t)bh0 * v->rows_k;
    }
    return s;
}

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
        /* (relu: float32, as its gradient jumps at u = 0 and TF32 would move u by 2^-11 of its
         * terms, putting many more u near 0 on the other side than float32 does) */
        ct = p->fm.kernel == PF_KERNEL_RELU ? R.compute : CUBLAS_COMPUTE_32F_FAST_TF32;
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
                          float *top, const void *X, int n, int rows_alloc, int bh0, int G,
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
        phi, c, top, b.u, Xg, (size_t)n * p->d, G, rows_alloc, n, klen, bh0, p->H, p->d, p->s2,
        p->fm, ctx->flags);
    account(ctx, ST_FEATURES, 0,
            rows * (p->m * 4.0 + p->d * p->tin) + (double)nrows * p->r * p->tc);
    return PF_OK;
}



static int overlaps(const void *a, size_t na, const void *b, size_t nb) {
    const char *x = (const char *)a, *y = (const char *)b;
    return x < y + nb && y < x + na;
}

/* The key lengths, read from host or device memory into the context's device copy. */
static pf_status key_lengths(pf_cuda_ctx *ctx, const int32_t *kl, int B, int Lk,
                             cudaStream_t stream, const int32_t **dev,
                             std::vector<int32_t> *host = NULL) {
    *dev = NULL;
    if (host) host->clear();
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
    if (host) *host = h;
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


/* What a forward and a backward do once their arguments are checked: heads at a time G (as many
 * as the workspace limit allows at per_head bytes each, at least one), the workspace, the error
 * flags cleared, cuBLAS on the stream, and R for the call. */
static pf_status run_begin(favor_run *R, int *G, pf_cuda_ctx *ctx, const favor_plan *p,
                           size_t per_head, size_t fixed, const int32_t *klen,
                           pf_cuda_favor_saved *sv, int tc, cudaStream_t stream) {
    const int BH = p->B * p->H;
    size_t g = ctx->ws_limit > fixed + 256 ? (ctx->ws_limit - fixed - 256) / per_head : 0;
    g = std::max((size_t)1, std::min(g, (size_t)std::min(BH, 65535))); /* (a grid's y) */
    *G = (int)g;
    pf_status st = workspace(ctx, fixed + 256 + g * per_head);
    if (st != PF_OK) return st;
    if ((st = pf_cuda_flags_reset(ctx, stream)) != PF_OK) return st;
    cublasStatus_t be = cublasSetStream(ctx->blas, stream);
    if (be != CUBLAS_STATUS_SUCCESS) return pf_cublas_err(be, "cublasSetStream");
    ctx->stream = stream;
    R->ctx = ctx;
    R->p = p;
    R->stream = stream;
    R->tc_t = tc == 4 ? CUDA_R_32F : CUDA_R_16BF;
    R->compute = ctx->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    R->klen = klen;
    R->sv = sv;
    return PF_OK;
}

#endif /* PF_CUDA_FAVOR_PARTS_CUH */
