/* context.cu: the context (device, cuBLAS handle, workspace, error word), errors in words,
 * device-pointer checks and the stage profile. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <new>

#include "internal.cuh"

#define PF_CUDA_API extern "C" __attribute__((visibility("default")))

static thread_local char last_error[512];

void pf_cuda_clear_error(void) {
    last_error[0] = '\0';
}

pf_status pf_cuda_fail(pf_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

pf_status pf_cuda_err(cudaError_t e, const char *what) {
    cudaGetLastError(); /* clear the sticky-free error state */
    pf_status st = PF_EINVAL;
    if (e == cudaErrorMemoryAllocation)
        st = PF_ENOMEM;
    else if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
             e == cudaErrorInvalidDevice || e == cudaErrorInitializationError ||
             e == cudaErrorCompatNotSupportedOnDevice || e == cudaErrorSystemDriverMismatch ||
             e == cudaErrorNoKernelImageForDevice || e == cudaErrorUnsupportedPtxVersion)
        st = PF_ENOTSUP;
    return pf_cuda_fail(st, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

pf_status pf_cublas_err(cublasStatus_t e, const char *what) {
    pf_status st = e == CUBLAS_STATUS_ALLOC_FAILED      ? PF_ENOMEM
                   : e == CUBLAS_STATUS_NOT_SUPPORTED   ? PF_ENOTSUP
                   : e == CUBLAS_STATUS_ARCH_MISMATCH   ? PF_ENOTSUP
                   : e == CUBLAS_STATUS_NOT_INITIALIZED ? PF_ENOTSUP
                                                        : PF_EINVAL;
    return pf_cuda_fail(st, "%s: cuBLAS %s (%s)", what, cublasGetStatusString(e),
                        cublasGetStatusName(e));
}

PF_CUDA_API const char *pf_cuda_last_error(void) {
    return last_error;
}

PF_CUDA_API size_t pf_cuda_dtype_size(pf_cuda_dtype dtype) {
    switch (dtype) {
    case PF_CUDA_F32: return 4;
    case PF_CUDA_BF16:
    case PF_CUDA_F16: return 2;
    }
    return 0;
}

PF_CUDA_API int pf_cuda_device_count(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        pf_cuda_err(e, "no usable GPU");
        return 0;
    }
    if (n == 0) pf_cuda_fail(PF_ENOTSUP, "no GPU: cudaGetDeviceCount found none");
    return n;
}

pf_fmap_dev pf_fmap_dev_make(const pf_favor_opts *f, int d, float scale, float *sqrt_s,
                             double *s2) {
    const float sc = scale > 0 ? scale : (float)(1.0 / sqrt((double)d));
    *sqrt_s = (float)sqrt((double)sc);
    *s2 = (double)*sqrt_s * (double)*sqrt_s;
    pf_fmap_dev fm;
    fm.kernel = f->kernel;
    fm.m = f->m;
    fm.r = pf_kernel_width(f->kernel, f->m);
    fm.eps = f->eps;
    fm.inv_sqrt_m = (float)(1.0 / sqrt((double)f->m));
    fm.lnr = 0.5 * log((double)(f->kernel == PF_KERNEL_HYPERBOLIC ? 2 * f->m : f->m));
    return fm;
}

PF_CUDA_API int pf_cuda_kernel_supported(pf_kernel kernel) {
    return kernel == PF_KERNEL_POSITIVE || kernel == PF_KERNEL_HYPERBOLIC ||
           kernel == PF_KERNEL_TRIG || kernel == PF_KERNEL_RELU;
}

int pf_cuda_is_device(const void *p) {
    cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

pf_status pf_cuda_check_ptr(const pf_cuda_ctx *ctx, const void *p, const char *name) {
    if (!p) return pf_cuda_fail(PF_EINVAL, "%s is NULL", name);
    cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) return pf_cuda_err(e, name);
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
        return pf_cuda_fail(PF_EINVAL,
                            "%s is not device memory (a host pointer?): pass memory from "
                            "cudaMalloc on device %d",
                            name, ctx->device);
    if (a.type == cudaMemoryTypeDevice && a.device != ctx->device)
        return pf_cuda_fail(PF_ENOTSUP, "%s is on device %d, the context on device %d", name,
                            a.device, ctx->device);
    return PF_OK;
}

PF_CUDA_API pf_status pf_cuda_ctx_create(pf_cuda_ctx **out, int device) {
    pf_cuda_clear_error();
    if (!out) return pf_cuda_fail(PF_EINVAL, "pf_cuda_ctx_create: ctx is NULL");
    *out = NULL;
    int n = pf_cuda_device_count();
    if (n == 0) return PF_ENOTSUP;
    if (device < 0 || device >= n)
        return pf_cuda_fail(PF_ENOTSUP, "no device %d: this process sees %d GPU(s)", device, n);
    pf_device_guard guard(device);
    if (!guard.ok) return pf_cuda_err(cudaGetLastError(), "cudaSetDevice");
    pf_cuda_ctx *c = new (std::nothrow) pf_cuda_ctx();
    if (!c) return pf_cuda_fail(PF_ENOMEM, "pf_cuda_ctx_create: out of host memory");
    c->device = device;
    c->ws_limit = (size_t)1 << 30;
    cudaError_t e;
    cublasStatus_t be = cublasCreate(&c->blas);
    if (be != CUBLAS_STATUS_SUCCESS) {
        delete c;
        return pf_cublas_err(be, "cublasCreate");
    }
    if ((e = cudaHostAlloc((void **)&c->flags_host, sizeof(unsigned) * PF_FLAG_WORDS,
                           cudaHostAllocMapped)) != cudaSuccess ||
        (e = cudaHostGetDevicePointer((void **)&c->flags, c->flags_host, 0)) != cudaSuccess) {
        pf_status st = pf_cuda_err(e, "pf_cuda_ctx_create");
        pf_cuda_ctx_free(c);
        return st;
    }
    *out = c;
    return PF_OK;
}

PF_CUDA_API void pf_cuda_ctx_free(pf_cuda_ctx *c) {
    if (!c) return;
    pf_device_guard guard(c->device);
    cudaDeviceSynchronize();
    if (c->blas) cublasDestroy(c->blas);
    cudaFree(c->ws);
    cudaFree(c->klen);
    if (c->flags_host) cudaFreeHost(c->flags_host);
    for (cudaEvent_t ev : c->events) cudaEventDestroy(ev);
    delete c;
}

PF_CUDA_API int pf_cuda_ctx_device(const pf_cuda_ctx *c) {
    return c ? c->device : -1;
}

PF_CUDA_API pf_status pf_cuda_ctx_set_tf32(pf_cuda_ctx *c, int allow) {
    pf_cuda_clear_error();
    if (!c || (allow != 0 && allow != 1))
        return pf_cuda_fail(PF_EINVAL, "pf_cuda_ctx_set_tf32: a context and 0 or 1");
    c->tf32 = allow;
    return PF_OK;
}

PF_CUDA_API pf_status pf_cuda_ctx_set_workspace_limit(pf_cuda_ctx *c, size_t bytes) {
    pf_cuda_clear_error();
    if (!c) return pf_cuda_fail(PF_EINVAL, "pf_cuda_ctx_set_workspace_limit: ctx is NULL");
    c->ws_limit = bytes;
    return PF_OK;
}

PF_CUDA_API size_t pf_cuda_ctx_bytes(const pf_cuda_ctx *c) {
    return c ? c->ws_bytes + sizeof(int32_t) * (size_t)c->klen_cap : 0;
}

PF_CUDA_API void pf_cuda_ctx_trim(pf_cuda_ctx *c) {
    if (!c) return;
    pf_device_guard guard(c->device);
    cudaDeviceSynchronize();
    cudaFree(c->ws);
    c->ws = NULL;
    c->ws_bytes = 0;
}

pf_status pf_cuda_flags_reset(pf_cuda_ctx *c, cudaStream_t stream) {
    (void)stream;
    for (int i = 0; i < PF_FLAG_WORDS; i++) c->flags_host[i] = 0;
    return PF_OK;
}

pf_status pf_cuda_flags_read(pf_cuda_ctx *c, cudaStream_t stream) {
    cudaError_t e = cudaGetLastError(); /* a launch that failed (bad configuration) */
    if (e != cudaSuccess) return pf_cuda_err(e, "kernel launch");
    e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) return pf_cuda_err(e, "waiting for the GPU");
    unsigned f = 0;
    for (int i = 0; i < PF_FLAG_WORDS; i++) f |= ((volatile unsigned *)c->flags_host)[i] << i;
    if (f & PF_FLAG_INPUT)
        return pf_cuda_fail(PF_ENONFINITE, "a NaN or Inf in the inputs (or W), or a projection "
                                           "that overflows float32");
    if (f & PF_FLAG_BAD_DEN)
        return pf_cuda_fail(PF_ENONFINITE, "a denominator or an output is not finite");
    if (f & PF_FLAG_ZERO_DEN)
        return pf_cuda_fail(PF_EDOMAIN, "a denominator is zero (a query whose features are "
                                        "orthogonal to every key's)");
    return PF_OK;
}

/* ---- stage profile ---------------------------------------------------------------------- */

static const char *const stage_names[PF_CUDA_STAGES] = {
    "project", "features", "weights", "chunk_states", "prefix", "scores", "readout_mm",
    "normalise"};

void pf_cuda_mark(pf_cuda_ctx *c, int stage) {
    if (!c->profile) return;
    if (c->nmarks == (int)c->events.size()) {
        cudaEvent_t ev;
        if (cudaEventCreate(&ev) != cudaSuccess) {
            cudaGetLastError();
            return;
        }
        c->events.push_back(ev);
        c->marks.push_back(-1);
    }
    cudaEventRecord(c->events[c->nmarks], c->stream);
    c->marks[c->nmarks] = stage;
    c->nmarks++;
}

void pf_cuda_marks_collect(pf_cuda_ctx *c) {
    if (!c->profile || c->nmarks == 0) return;
    cudaEventSynchronize(c->events[c->nmarks - 1]);
    for (int i = 0; i + 1 < c->nmarks; i++) {
        const int s = c->marks[i];
        float ms = 0;
        if (s >= 0 && cudaEventElapsedTime(&ms, c->events[i], c->events[i + 1]) == cudaSuccess)
            c->stage_ms[s] += ms;
    }
    cudaGetLastError();
    c->nmarks = 0;
}

PF_CUDA_API pf_status pf_cuda_ctx_profile(pf_cuda_ctx *c, int on) {
    pf_cuda_clear_error();
    if (!c || (on != 0 && on != 1))
        return pf_cuda_fail(PF_EINVAL, "pf_cuda_ctx_profile: a context and 0 or 1");
    c->profile = on;
    c->nmarks = 0;
    for (int s = 0; s < PF_CUDA_STAGES; s++)
        c->stage_ms[s] = c->stage_flops[s] = c->stage_bytes[s] = 0;
    return PF_OK;
}

PF_CUDA_API pf_status pf_cuda_ctx_stages(pf_cuda_ctx *c, const char **names, double *ms,
                                         double *flops, double *bytes) {
    pf_cuda_clear_error();
    if (!c) return pf_cuda_fail(PF_EINVAL, "pf_cuda_ctx_stages: ctx is NULL");
    for (int s = 0; s < PF_CUDA_STAGES; s++) {
        if (names) names[s] = stage_names[s];
        if (ms) ms[s] = c->stage_ms[s];
        if (flops) flops[s] = c->stage_flops[s];
        if (bytes) bytes[s] = c->stage_bytes[s];
        c->stage_ms[s] = c->stage_flops[s] = c->stage_bytes[s] = 0;
    }
    return PF_OK;
}
