/* internal.cuh: what the CUDA library's files share: the context, errors, argument checks, the
 * element types and the feature map of one row (used by the forward and by decoding alike). */
#ifndef PF_CUDA_INTERNAL_CUH
#define PF_CUDA_INTERNAL_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>

#include <vector>

#include "performer_cuda.h"

#define PF_CUDA_INTERNAL __attribute__((visibility("hidden")))

/* What the kernels report: each condition has a word of the context's error flags (mapped,
 * pinned host memory: a kernel stores 1 into it, nothing is copied back), cleared by the host
 * before a call and read after its stream has finished. pf_raise takes the condition's bit. */
enum { PF_FLAG_WORDS = 4 };
enum {
    PF_FLAG_INPUT = 1u,   /* a NaN or Inf in Q, K, V, W, or a projection that overflowed */
    PF_FLAG_ZERO_DEN = 2u, /* a denominator that is exactly zero */
    PF_FLAG_BAD_DEN = 4u  /* a denominator or an output that is not finite */
};

__device__ __forceinline__ void pf_raise(unsigned *flags, unsigned bit) {
    flags[__ffs((int)bit) - 1] = 1u;
}

struct pf_cuda_ctx {
    int device;
    cublasHandle_t blas;
    int tf32;
    size_t ws_limit;      /* the most workspace a forward may use */
    void *ws;             /* the workspace, ws_bytes long (cudaMalloc) */
    size_t ws_bytes;
    unsigned *flags;      /* the error flags as the device addresses them (PF_FLAG_WORDS) */
    unsigned *flags_host; /* the same words, mapped pinned host memory */
    int32_t *klen;        /* device copy of the key lengths (klen_cap ints) */
    int klen_cap;
    /* profiling: an event at each stage boundary of a call, attributed to the stage after it */
    int profile;
    std::vector<cudaEvent_t> events;
    std::vector<int> marks; /* stage of the interval starting at events[i] (-1: none) */
    int nmarks;
    double stage_ms[PF_CUDA_STAGES], stage_flops[PF_CUDA_STAGES], stage_bytes[PF_CUDA_STAGES];
    cudaStream_t stream;  /* the stream of the call in progress */
};

/* Errors: the thread's message for pf_cuda_last_error. */
PF_CUDA_INTERNAL void pf_cuda_clear_error(void);
PF_CUDA_INTERNAL pf_status pf_cuda_fail(pf_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A CUDA runtime error as a status (PF_ENOMEM for cudaErrorMemoryAllocation, PF_ENOTSUP for no
 * device or driver, PF_EINVAL otherwise), with its text and `what`; the error is cleared. */
PF_CUDA_INTERNAL pf_status pf_cuda_err(cudaError_t e, const char *what);
PF_CUDA_INTERNAL pf_status pf_cublas_err(cublasStatus_t e, const char *what);

/* Makes ctx's device current for the scope and restores the caller's at its end. */
struct pf_device_guard {
    int prev;
    int ok;
    explicit pf_device_guard(int device) {
        ok = cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(device) == cudaSuccess;
    }
    ~pf_device_guard() {
        if (ok) cudaSetDevice(prev);
    }
};

/* PF_OK if p points to `bytes` of device (or managed) memory on ctx's device, else PF_EINVAL
 * (NULL, a host pointer) or PF_ENOTSUP (another device), with `name` in the message. */
PF_CUDA_INTERNAL pf_status pf_cuda_check_ptr(const pf_cuda_ctx *ctx, const void *p,
                                             const char *name);
/* Whether p is device memory (1), host memory (0), or unknown (-1). */
PF_CUDA_INTERNAL int pf_cuda_is_device(const void *p);

/* Clears the error flags (no work on the stream: every call has waited for its own end); reads
 * them at the end, waiting for the stream, as a status. */
PF_CUDA_INTERNAL pf_status pf_cuda_flags_reset(pf_cuda_ctx *ctx, cudaStream_t stream);
PF_CUDA_INTERNAL pf_status pf_cuda_flags_read(pf_cuda_ctx *ctx, cudaStream_t stream);

/* Profiling marks: stage s starts now on ctx->stream (-1 ends the last). No-ops unless on. */
PF_CUDA_INTERNAL void pf_cuda_mark(pf_cuda_ctx *ctx, int stage);
PF_CUDA_INTERNAL void pf_cuda_marks_collect(pf_cuda_ctx *ctx);

/* ---- element types -------------------------------------------------------------------------- */

__device__ __forceinline__ float pf_ld(const float *p) { return *p; }
__device__ __forceinline__ float pf_ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float pf_ld(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ void pf_st(float *p, float x) { *p = x; }
__device__ __forceinline__ void pf_st(__nv_bfloat16 *p, float x) { *p = __float2bfloat16_rn(x); }
__device__ __forceinline__ void pf_st(__half *p, float x) { *p = __float2half_rn(x); }
/* Stores rounded toward +inf (up) or -inf (down): relu's features, whose kink the backward reads
 * from the stored value (phi~ > eps exactly where u > 0, whatever eps's rounding). */
__device__ __forceinline__ void pf_st_dir(float *p, float x, int) { *p = x; }
__device__ __forceinline__ void pf_st_dir(__nv_bfloat16 *p, float x, int up) {
    *p = up ? __float2bfloat16_ru(x) : __float2bfloat16_rd(x);
}
__device__ __forceinline__ void pf_st_dir(__half *p, float x, int up) {
    *p = up ? __float2half_ru(x) : __float2half_rd(x);
}

/* ---- the feature map of one row (as the CPU library's pf_fmap_map_rows) ----------------
 * Given u_f = sqrt(s) w_f.x (f < m) and h = s' |x|^2 / 2 (s' = float(sqrt(s))^2, in double),
 * the stabilised features phi~ (r values, the largest O(1)) and the log factor c with
 * phi(x) = phi~ e^c:
 *   positive    t = fl(max u + ln sqrt(m)), phi~_f = exp(u_f - t), c = t - ln sqrt(m) - h
 *   hyperbolic  a = max |u|, t = fl(a + ln sqrt(2m)), phi~ = [exp(u - t), exp(-u - t)],
 *               c = t - ln sqrt(2m) - h
 *   trig        phi~ = [sin u, cos u] / sqrt(m), c = h
 *   relu        phi~ = relu(u) / sqrt(m) + eps, c = 0
 * and eps added to the softmax maps relative to the row's largest |phi~| (its value before eps:
 * exp(max - t) for positive and hyperbolic, max |phi~| for trig). The kernels call these with
 * the row's maximum (or max |u|) already reduced. */
struct pf_fmap_dev {
    pf_kernel kernel;
    int m, r;
    float eps;
    float inv_sqrt_m; /* float(1/sqrt(m)) */
    double lnr;       /* ln sqrt(m), or ln sqrt(2m) for hyperbolic */
};

/* The map of favor's kernel, m and eps for queries and keys of width d with scale `scale` (0:
 * 1/sqrt(d)), and the scale as the CPU library rounds it: *sqrt_s = float(sqrt(s)) and
 * *s2 = sqrt_s^2 in double (h = s2 |x|^2 / 2). The forward and decoding make theirs here. */
PF_CUDA_INTERNAL pf_fmap_dev pf_fmap_dev_make(const pf_favor_opts *favor, int d, float scale,
                                              float *sqrt_s, double *s2);

/* The shift t and the value top (the largest phi~ before eps) of a positive or hyperbolic row
 * whose max u (or max |u|) is mx. */
__device__ __forceinline__ float pf_fmap_shift(const pf_fmap_dev &f, float mx, float *top) {
    const float t = (float)((double)mx + f.lnr);
    *top = (float)exp((double)mx - (double)t);
    return t;
}

#endif /* PF_CUDA_INTERNAL_CUH */
