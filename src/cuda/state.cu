/* state.cu: decoding on the GPU. N sequences x H heads of causal FAVOR+ state, each
 *     S = sum_j phi~(k_j) e^(c_j - M) v_j^T  (r x dv),   z = sum_j phi~(k_j) e^(c_j - M)  (r),
 * referenced to M, the running maximum of the key log factors (decoding keeps only
 * (S, z, running max)). One launch advances every active sequence by one token: a block per
 * (sequence, head) makes the token's features, rebases the state to M' = max(M, c_k) and reads
 * the row out of the updated state:
 *     S' = e^(M - M') S + e^(c_k - M') phi~(k) v^T,   out = phi~(q) S' / phi~(q) z'.
 * The query's own factor cancels. Row i is the causal pass's row i (its reference is P_i = M'). */
#include <string.h>

#include <algorithm>
#include <new>

#include "internal.cuh"

#define PF_CUDA_API extern "C" __attribute__((visibility("default")))

struct pf_cuda_favor_state {
    pf_cuda_ctx *ctx;
    int N, H, d, dv, m, r, w_per_head;
    float sqrt_s;
    double s2;
    pf_fmap_dev fm;
    float *Wt;     /* (H or 1, d, m): W turned round, so that a block's threads read it a row at
                      a time */
    float *S;      /* (N, H, r, dv) */
    float *z;      /* (N, H, r) */
    double *M;     /* (N, H), -inf when empty */
    int64_t *pos;  /* (N) */
    int *which;    /* (N) reset mask, device */
};

/* 128 threads a (sequence, head): at the step's 64 registers a thread, an SM holds 1024 of
 * them, so that 64 x 16 states (1024 blocks) run in one wave on a 132-SM GPU (256 threads a
 * block took two waves and 91 us on an H100, 1.3x this). */
enum { DEC_THREADS = 128, DEC_TX = 32, DEC_TY = DEC_THREADS / DEC_TX };

__global__ void k_transpose_w(float *Wt, const float *W, int rows, int m, int d,
                              unsigned *flags) {
    const size_t n = (size_t)rows * d;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t blk = i / ((size_t)m * d), rest = i % ((size_t)m * d);
        const int f = (int)(rest / d), k = (int)(rest % d);
        const float w = W[i];
        if (!isfinite(w)) pf_raise(flags, PF_FLAG_INPUT);
        Wt[blk * (size_t)m * d + (size_t)k * m + f] = w;
    }
}

__global__ void k_reset(float *S, float *z, double *M, int64_t *pos, const int *which, int H,
                        size_t per_s, int r) {
    const int n = blockIdx.x;
    if (which && !which[n]) return;
    for (size_t i = threadIdx.x; i < (size_t)H * per_s; i += blockDim.x)
        S[(size_t)n * H * per_s + i] = 0.0f;
    for (int i = threadIdx.x; i < H * r; i += blockDim.x) z[(size_t)n * H * r + i] = 0.0f;
    for (int h = threadIdx.x; h < H; h += blockDim.x) M[(size_t)n * H + h] = -INFINITY;
    if (threadIdx.x == 0) pos[n] = 0;
}

/* Block sums and maxima over DEC_THREADS threads. */
template <typename T, typename Op>
__device__ T block_reduce(T v, T *sh, Op op) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    T acc = sh[0];
    for (int i = 1; i < DEC_THREADS / 32; i++) acc = op(acc, sh[i]);
    return acc;
}

struct op_max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct op_sumd {
    __device__ double operator()(double a, double b) const { return a + b; }
};
struct op_sumf {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct op_or {
    __device__ int operator()(int a, int b) const { return a | b; }
};

/* u = sqrt(s) W x for the query and the key at once (one pass over W, which every block reads
 * from L2): uq, uk (m floats each, shared), from xq, xk (d floats, shared). */
__device__ void dec_project(float *uq, float *uk, const float *xq, const float *xk,
                            const float *Wt, int d, int m, float sqrt_s) {
    for (int f = threadIdx.x; f < m; f += DEC_THREADS) {
        float aq = 0.0f, ak = 0.0f;
#pragma unroll 8
        for (int k = 0; k < d; k++) {
            const float w = Wt[(size_t)k * m + f];
            aq = fmaf(w, xq[k], aq);
            ak = fmaf(w, xk[k], ak);
        }
        uq[f] = aq * sqrt_s;
        uk[f] = ak * sqrt_s;
    }
    __syncthreads();
}

/* The features of x (d floats, shared) into phi (r floats, shared) from its projection u (m
 * floats, shared, dec_project), by the map (internal.cuh); returns c, or NaN when x or u is not
 * finite. */
__device__ double dec_features(float *phi, const float *u, const float *x, int d,
                               double s2, const pf_fmap_dev &fm, float *shf, double *shd) {
    const int m = fm.m;
    double sq = 0;
    for (int k = threadIdx.x; k < d; k += DEC_THREADS) sq += (double)x[k] * x[k];
    sq = block_reduce(sq, shd, op_sumd());
    float mx = -INFINITY, amx = 0.0f;
    int bad = 0;
    for (int f = threadIdx.x; f < m; f += DEC_THREADS) {
        const float acc = u[f];
        bad |= !isfinite(acc);
        mx = fmaxf(mx, acc);
        amx = fmaxf(amx, fabsf(acc));
    }
    bad = block_reduce(bad, (int *)shf, op_or());
    if (bad || !isfinite(sq)) return NAN;
    mx = block_reduce(mx, shf, op_max());
    amx = block_reduce(amx, shf, op_max());
    const double h = 0.5 * s2 * sq;
    switch (fm.kernel) {
    case PF_KERNEL_HYPERBOLIC: {
        float top;
        const float t = pf_fmap_shift(fm, amx, &top);
        const float add = fm.eps > 0 ? fm.eps * top : 0.0f;
        for (int f = threadIdx.x; f < m; f += DEC_THREADS) {
            phi[f] = expf(u[f] - t) + add;
            phi[m + f] = expf(-u[f] - t) + add;
        }
        __syncthreads();
        return (double)t - fm.lnr - h;
    }
    case PF_KERNEL_TRIG: {
        float top = 0.0f;
        for (int f = threadIdx.x; f < m; f += DEC_THREADS) {
            float sn, cs;
            sincosf(u[f], &sn, &cs);
            phi[f] = sn * fm.inv_sqrt_m;
            phi[m + f] = cs * fm.inv_sqrt_m;
            top = fmaxf(top, fmaxf(fabsf(phi[f]), fabsf(phi[m + f])));
        }
        top = block_reduce(top, shf, op_max());
        if (fm.eps > 0) {
            for (int f = threadIdx.x; f < m; f += DEC_THREADS) {
                phi[f] += fm.eps * top;
                phi[m + f] += fm.eps * top;
            }
        }
        __syncthreads();
        return h;
    }
    case PF_KERNEL_RELU:
        for (int f = threadIdx.x; f < m; f += DEC_THREADS)
            phi[f] = (u[f] > 0.0f ? u[f] : 0.0f) * fm.inv_sqrt_m + fm.eps;
        __syncthreads();
        return 0.0;
    default: {
        float top;
        const float t = pf_fmap_shift(fm, mx, &top);
        const float add = fm.eps > 0 ? fm.eps * top : 0.0f;
        for (int f = threadIdx.x; f < m; f += DEC_THREADS) phi[f] = expf(u[f] - t) + add;
        __syncthreads();
        return (double)t - fm.lnr - h;
    }
    }
}

/* One token for sequence n = blockIdx.x / H, head h = blockIdx.x % H. Shared memory: q, k, v
 * (d, d, dv floats), u of each (m each), phi~(q), phi~(k) (r each), partial sums (DEC_TY x DEC_TX). */
template <typename T>
__global__ void __launch_bounds__(DEC_THREADS) k_step(T *out, const T *q, const T *k, const T *v, const int32_t *active,
                       pf_cuda_favor_state st, unsigned *flags) {
    extern __shared__ float sm[];
    __shared__ float shf[DEC_THREADS / 32];
    __shared__ double shd[DEC_THREADS / 32];
    __shared__ float part[DEC_TY][DEC_TX];
    const int n = blockIdx.x / st.H, h = blockIdx.x % st.H;
    if (active && !active[n]) return;
    const int d = st.d, dv = st.dv, r = st.r, H = st.H;
    float *xq = sm, *xk = xq + d, *xv = xk + d, *uq = xv + dv, *uk = uq + st.m, *pq = uk + st.m,
          *pk = pq + r;
    /* the whole sequence's inputs are checked, so that a bad token leaves every head of its
     * sequence as it was */
    int bad = 0;
    for (int i = threadIdx.x; i < H * (2 * d + dv); i += DEC_THREADS) {
        const int hh = i / (2 * d + dv), e = i % (2 * d + dv);
        float x;
        if (e < d)
            x = pf_ld(q + ((size_t)n * H + hh) * d + e);
        else if (e < 2 * d)
            x = pf_ld(k + ((size_t)n * H + hh) * d + (e - d));
        else
            x = pf_ld(v + ((size_t)n * H + hh) * dv + (e - 2 * d));
        bad |= !isfinite(x);
        if (hh == h) {
            if (e < d)
                xq[e] = x;
            else if (e < 2 * d)
                xk[e - d] = x;
            else
                xv[e - 2 * d] = x;
        }
    }
    bad = block_reduce(bad, (int *)shf, op_or());
    T *o = out + ((size_t)n * H + h) * dv;
    if (bad) {
        if (threadIdx.x == 0 && h == 0) pf_raise(flags, PF_FLAG_INPUT);
        for (int e = threadIdx.x; e < dv; e += DEC_THREADS) pf_st(o + e, 0.0f);
        return;
    }
    __syncthreads();
    const float *Wt = st.Wt + (st.w_per_head ? (size_t)h * d * st.m : 0);
    dec_project(uq, uk, xq, xk, Wt, d, st.m, st.sqrt_s);
    const double cq = dec_features(pq, uq, xq, d, st.s2, st.fm, shf, shd);
    __syncthreads();
    const double ck = dec_features(pk, uk, xk, d, st.s2, st.fm, shf, shd);
    if (isnan(cq) || isnan(ck)) {
        if (threadIdx.x == 0) pf_raise(flags, PF_FLAG_INPUT);
        for (int e = threadIdx.x; e < dv; e += DEC_THREADS) pf_st(o + e, 0.0f);
        return;
    }
    const size_t sh = (size_t)n * H + h;
    const double M = st.M[sh], Mn = fmax(M, ck);
    const float alpha = M == -INFINITY ? 0.0f : (M == Mn ? 1.0f : expf((float)(M - Mn)));
    const float beta = ck == Mn ? 1.0f : expf((float)(ck - Mn));
    /* z' = alpha z + beta phi~(k); den = phi~(q).z' */
    float *z = st.z + sh * r;
    float den = 0.0f;
    for (int f = threadIdx.x; f < r; f += DEC_THREADS) {
        const float zn = alpha * z[f] + beta * pk[f];
        z[f] = zn;
        den += pq[f] * zn;
    }
    den = block_reduce(den, shf, op_sumf());
    /* S' = alpha S + beta phi~(k) v^T, num = phi~(q) S', 32 columns at a time */
    float *S = st.S + sh * (size_t)r * dv;
    const int tx = threadIdx.x % DEC_TX, ty = threadIdx.x / DEC_TX;
    const float inv = 1.0f / den;
    const unsigned dbad = !isfinite(den) ? PF_FLAG_BAD_DEN
                          : den == 0.0f  ? PF_FLAG_ZERO_DEN
                          : !isfinite(inv) ? PF_FLAG_BAD_DEN
                                           : 0u;
    if (dv % 4 == 0 && (4 * DEC_THREADS) % dv == 0) {
        /* the state as float4: thread t owns columns e0..e0+3 (e0 = 4t mod dv) of the rows
         * f0, f0 + fstep, ... (f0 = 4t / dv): 16-byte loads, several in flight (dv divides
         * 4 DEC_THREADS = 512) */
        __shared__ float4 part4[DEC_THREADS];
        const int e0 = (4 * threadIdx.x) % dv, f0 = (4 * threadIdx.x) / dv;
        const int fstep = (4 * DEC_THREADS) / dv;
        const float4 bv = make_float4(beta * xv[e0], beta * xv[e0 + 1], beta * xv[e0 + 2],
                                      beta * xv[e0 + 3]);
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
        for (int f = f0; f < r; f += fstep) {
            float4 *p4 = (float4 *)(S + (size_t)f * dv + e0);
            float4 sv = *p4;
            const float kf = pk[f], qf = pq[f];
            sv.x = alpha * sv.x + kf * bv.x;
            sv.y = alpha * sv.y + kf * bv.y;
            sv.z = alpha * sv.z + kf * bv.z;
            sv.w = alpha * sv.w + kf * bv.w;
            *p4 = sv;
            acc.x += qf * sv.x;
            acc.y += qf * sv.y;
            acc.z += qf * sv.z;
            acc.w += qf * sv.w;
        }
        part4[threadIdx.x] = acc;
        __syncthreads();
        const int nq = dv / 4;
        if ((int)threadIdx.x < nq) {
            float4 num = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int k = threadIdx.x; k < DEC_THREADS; k += nq) {
                num.x += part4[k].x;
                num.y += part4[k].y;
                num.z += part4[k].z;
                num.w += part4[k].w;
            }
            const float nv[4] = {num.x, num.y, num.z, num.w};
            for (int j = 0; j < 4; j++) {
                const float y = dbad ? 0.0f : nv[j] * inv + 0.0f;
                if (!isfinite(y)) pf_raise(flags, PF_FLAG_BAD_DEN);
                pf_st(o + 4 * threadIdx.x + j, isfinite(y) ? y : 0.0f);
            }
        }
    } else {
        for (int e0 = 0; e0 < dv; e0 += DEC_TX) {
            const int e = e0 + tx;
            float acc = 0.0f;
            if (e < dv) {
                const float ve = beta * xv[e];
#pragma unroll 4
                for (int f = ty; f < r; f += DEC_TY) {
                    float *s = S + (size_t)f * dv + e;
                    const float sn = alpha * *s + pk[f] * ve;
                    *s = sn;
                    acc += pq[f] * sn;
                }
            }
            part[ty][tx] = acc;
            __syncthreads();
            if (ty == 0 && e < dv) {
                float num = 0.0f;
                for (int i = 0; i < DEC_TY; i++) num += part[i][tx];
                const float y = dbad ? 0.0f : num * inv + 0.0f;
                if (!isfinite(y)) pf_raise(flags, PF_FLAG_BAD_DEN);
                pf_st(o + e, isfinite(y) ? y : 0.0f);
            }
            __syncthreads();
        }
    }
    if (threadIdx.x == 0) {
        if (dbad) pf_raise(flags, dbad);
        st.M[sh] = Mn;
        if (h == 0) st.pos[n] += 1;
    }
}

static size_t step_smem(const pf_cuda_favor_state *s) {
    return sizeof(float) * (2 * (size_t)s->d + (size_t)s->dv + 2 * (size_t)s->m + 2 * (size_t)s->r);
}

PF_CUDA_API void pf_cuda_favor_state_free(pf_cuda_favor_state *s) {
    if (!s) return;
    pf_device_guard guard(s->ctx->device);
    cudaDeviceSynchronize();
    cudaFree(s->Wt);
    cudaFree(s->S);
    cudaFree(s->z);
    cudaFree(s->M);
    cudaFree(s->pos);
    cudaFree(s->which);
    delete s;
}

PF_CUDA_API pf_status pf_cuda_favor_state_create(pf_cuda_favor_state **out, pf_cuda_ctx *ctx,
                                                 int N, int H, int d, int dv, float scale,
                                                 const pf_favor_opts *favor) {
    pf_cuda_clear_error();
    if (!out) return pf_cuda_fail(PF_EINVAL, "pf_cuda_favor_state_create: state is NULL");
    *out = NULL;
    if (!ctx || !favor)
        return pf_cuda_fail(PF_EINVAL, "pf_cuda_favor_state_create: ctx and favor are needed");
    if (N < 1 || H < 1 || d < 1 || dv < 1 || (int64_t)N * H > INT32_MAX)
        return pf_cuda_fail(PF_EINVAL, "N=%d, H=%d, d=%d, dv=%d: each must be >= 1", N, H, d, dv);
    if (!isfinite(scale) || scale < 0)
        return pf_cuda_fail(PF_EINVAL, "scale must be finite and >= 0 (0: 1/sqrt(d))");
    if (!pf_cuda_kernel_supported(favor->kernel))
        return pf_cuda_fail(favor->kernel == PF_KERNEL_OPRF || favor->kernel == PF_KERNEL_SDERF ||
                                    favor->kernel == PF_KERNEL_ELU
                                ? PF_ENOTSUP
                                : PF_EINVAL,
                            "kernel %d: the GPU runs positive, hyperbolic, trig and relu",
                            (int)favor->kernel);
    if (favor->m < 1 || favor->m > PF_LM_MAX_FEATURES || (favor->w_per_head != 0 &&
                                                          favor->w_per_head != 1) ||
        !isfinite(favor->eps) || favor->eps < 0)
        return pf_cuda_fail(PF_EINVAL, "favor: m in [1, %d], w_per_head 0 or 1, eps >= 0",
                            PF_LM_MAX_FEATURES);
    pf_device_guard guard(ctx->device);
    if (!guard.ok) return pf_cuda_err(cudaGetLastError(), "cudaSetDevice");
    pf_status st = pf_cuda_check_ptr(ctx, favor->W, "favor.W");
    if (st != PF_OK) return st;
    pf_cuda_favor_state *s = new (std::nothrow) pf_cuda_favor_state();
    if (!s) return pf_cuda_fail(PF_ENOMEM, "out of host memory");
    s->ctx = ctx;
    s->N = N;
    s->H = H;
    s->d = d;
    s->dv = dv;
    s->m = favor->m;
    s->r = pf_kernel_width(favor->kernel, favor->m);
    s->w_per_head = favor->w_per_head;
    s->fm = pf_fmap_dev_make(favor, d, scale, &s->sqrt_s, &s->s2);
    if (step_smem(s) > 48 * 1024) {
        delete s;
        return pf_cuda_fail(PF_ENOTSUP, "decoding keeps one head's q, k, v and features in "
                                        "48 KiB of shared memory: 2d + dv + 2m + 2r floats must "
                                        "fit (d=%d, dv=%d, m=%d)", d, dv, favor->m);
    }
    if ((double)N * H * s->r * ((double)dv + 1) * 4 + (double)H * s->m * d * 4 > 0x1p50) {
        const int r = s->r;
        delete s;
        return pf_cuda_fail(PF_EINVAL, "N=%d x H=%d states of %d x %lld floats: past 2^50 bytes",
                            N, H, r, (long long)dv + 1);
    }
    const size_t NH = (size_t)N * H, wrows = (size_t)(s->w_per_head ? H : 1) * s->m;
    cudaError_t e;
    if ((e = cudaMalloc((void **)&s->Wt, sizeof(float) * wrows * d)) != cudaSuccess ||
        (e = cudaMalloc((void **)&s->S, sizeof(float) * NH * s->r * dv)) != cudaSuccess ||
        (e = cudaMalloc((void **)&s->z, sizeof(float) * NH * s->r)) != cudaSuccess ||
        (e = cudaMalloc((void **)&s->M, sizeof(double) * NH)) != cudaSuccess ||
        (e = cudaMalloc((void **)&s->pos, sizeof(int64_t) * N)) != cudaSuccess ||
        (e = cudaMalloc((void **)&s->which, sizeof(int) * N)) != cudaSuccess) {
        st = pf_cuda_err(e, "allocating decoding states");
        pf_cuda_favor_state_free(s);
        return st;
    }
    if ((st = pf_cuda_flags_reset(ctx, 0)) == PF_OK) {
        const size_t n = wrows * d;
        k_transpose_w<<<(unsigned)std::min((n + 255) / 256, (size_t)65535), 256>>>(
            s->Wt, favor->W, (int)wrows, s->m, d, ctx->flags);
        k_reset<<<N, 256>>>(s->S, s->z, s->M, s->pos, NULL, H, (size_t)s->r * dv, s->r);
        st = pf_cuda_flags_read(ctx, 0);
    }
    if (st != PF_OK) {
        pf_cuda_favor_state_free(s);
        return st == PF_ENONFINITE ? pf_cuda_fail(st, "favor.W holds a NaN or Inf") : st;
    }
    *out = s;
    return PF_OK;
}

PF_CUDA_API pf_status pf_cuda_favor_state_reset(pf_cuda_favor_state *s, const int *which,
                                                cudaStream_t stream) {
    pf_cuda_clear_error();
    if (!s) return pf_cuda_fail(PF_EINVAL, "pf_cuda_favor_state_reset: state is NULL");
    pf_device_guard guard(s->ctx->device);
    const int *dev = NULL;
    if (which) {
        if (pf_cuda_is_device(which) == 1)
            return pf_cuda_fail(PF_EINVAL, "pf_cuda_favor_state_reset: `which` is device "
                                           "memory; it must be N ints in host memory");
        cudaError_t e = cudaMemcpyAsync(s->which, which, sizeof(int) * s->N,
                                        cudaMemcpyHostToDevice, stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
        if (e != cudaSuccess) return pf_cuda_err(e, "pf_cuda_favor_state_reset");
        dev = s->which;
    }
    k_reset<<<s->N, 256, 0, stream>>>(s->S, s->z, s->M, s->pos, dev, s->H, (size_t)s->r * s->dv,
                                      s->r);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? PF_OK : pf_cuda_err(e, "pf_cuda_favor_state_reset");
}

PF_CUDA_API pf_status pf_cuda_favor_state_step(pf_cuda_favor_state *s, void *out, const void *q,
                                               const void *k, const void *v,
                                               const int32_t *active, pf_cuda_dtype dtype,
                                               cudaStream_t stream) {
    pf_cuda_clear_error();
    if (!s) return pf_cuda_fail(PF_EINVAL, "pf_cuda_favor_state_step: state is NULL");
    if (pf_cuda_dtype_size(dtype) == 0)
        return pf_cuda_fail(PF_EINVAL, "unknown dtype %d", (int)dtype);
    pf_cuda_ctx *ctx = s->ctx;
    pf_device_guard guard(ctx->device);
    if (!guard.ok) return pf_cuda_err(cudaGetLastError(), "cudaSetDevice");
    const void *ptrs[5] = {out, q, k, v, active};
    const char *names[5] = {"out", "q", "k", "v", "active"};
    for (int i = 0; i < 5; i++) {
        if (i == 4 && !active) continue;
        pf_status st = pf_cuda_check_ptr(ctx, ptrs[i], names[i]);
        if (st != PF_OK) return st;
    }
    const size_t es = pf_cuda_dtype_size(dtype), NH = (size_t)s->N * s->H;
    const size_t ob = NH * s->dv * es;
    const size_t ib[3] = {NH * s->d * es, NH * s->d * es, NH * s->dv * es};
    for (int i = 1; i < 4; i++) {
        const char *a = (const char *)out, *b = (const char *)ptrs[i];
        if (a < b + ib[i - 1] && b < a + ob)
            return pf_cuda_fail(PF_EINVAL, "out overlaps %s", names[i]);
    }
    pf_status st = pf_cuda_flags_reset(ctx, stream);
    if (st != PF_OK) return st;
    const size_t smem = step_smem(s);
    const unsigned grid = (unsigned)NH;
    switch (dtype) {
    case PF_CUDA_F32:
        k_step<float><<<grid, DEC_THREADS, smem, stream>>>(
            (float *)out, (const float *)q, (const float *)k, (const float *)v, active, *s,
            ctx->flags);
        break;
    case PF_CUDA_BF16:
        k_step<__nv_bfloat16><<<grid, DEC_THREADS, smem, stream>>>(
            (__nv_bfloat16 *)out, (const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k,
            (const __nv_bfloat16 *)v, active, *s, ctx->flags);
        break;
    case PF_CUDA_F16:
        k_step<__half><<<grid, DEC_THREADS, smem, stream>>>(
            (__half *)out, (const __half *)q, (const __half *)k, (const __half *)v, active, *s,
            ctx->flags);
        break;
    }
    return pf_cuda_flags_read(ctx, stream);
}

PF_CUDA_API pf_status pf_cuda_favor_state_positions(const pf_cuda_favor_state *s, int64_t *pos,
                                                    cudaStream_t stream) {
    pf_cuda_clear_error();
    if (!s || !pos) return pf_cuda_fail(PF_EINVAL, "pf_cuda_favor_state_positions: NULL");
    pf_device_guard guard(s->ctx->device);
    cudaError_t e = cudaMemcpyAsync(pos, s->pos, sizeof(int64_t) * s->N, cudaMemcpyDeviceToHost,
                                    stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    return e == cudaSuccess ? PF_OK : pf_cuda_err(e, "pf_cuda_favor_state_positions");
}
