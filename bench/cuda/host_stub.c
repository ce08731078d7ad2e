/*
 * host_stub.c: a stand-in for libperformer_cuda on a machine without a GPU, for
 * bench_cuda.py --dry-run: the functions the benchmark calls through ctypes (context, forward,
 * forward that keeps its features, backward kept or recomputed), computed on *host* memory by
 * the CPU library (pf_attn_favor, pf_attn_favor_save, pf_attn_favor_backward[_saved]).
 * bfloat16 and float16 tensors are widened to float32 around each call and the results
 * narrowed back (round to nearest even), as the GPU library stores them. It checks the calling
 * code's arguments and their order, not the GPU's arithmetic; decoding and profiling are
 * absent (the benchmark says so and goes on).
 *
 *     cc -std=c11 -O2 -shared -fPIC -Iinclude -I/usr/local/cuda/include \
 *        -o build/libperformer_cuda_stub.so bench/cuda/host_stub.c \
 *        -Lbuild -lperformer -Wl,-rpath,$PWD/build
 *     PERFORMER_CUDA_LIB=$PWD/build/libperformer_cuda_stub.so PYTHONPATH=python \
 *        /usr/bin/python3 bench/cuda/bench_cuda.py --dry-run --no-fla
 *
 * (performer_cuda.h includes cuda_runtime_api.h, for cudaStream_t: the CUDA toolkit's headers
 * are needed, not its libraries.)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "performer.h"
#include "performer_cuda.h"

struct pf_cuda_ctx {
    int device;
};

struct pf_cuda_favor_saved {
    pf_favor_saved *cpu;
    pf_shape shape;
    pf_cuda_dtype dtype;
};

static _Thread_local const char *last_error = "";

static pf_status fail(pf_status st, const char *why) {
    last_error = why;
    return st;
}

const char *pf_cuda_last_error(void) {
    return last_error;
}

int pf_cuda_device_count(void) {
    return 1;
}

size_t pf_cuda_dtype_size(pf_cuda_dtype dtype) {
    return dtype == PF_CUDA_F32 ? 4 : (dtype == PF_CUDA_BF16 || dtype == PF_CUDA_F16) ? 2 : 0;
}

pf_status pf_cuda_ctx_create(pf_cuda_ctx **ctx, int device) {
    if (!ctx) return fail(PF_EINVAL, "ctx is NULL");
    *ctx = calloc(1, sizeof **ctx);
    if (!*ctx) return PF_ENOMEM;
    (*ctx)->device = device;
    return PF_OK;
}

void pf_cuda_ctx_free(pf_cuda_ctx *ctx) {
    free(ctx);
}

int pf_cuda_ctx_device(const pf_cuda_ctx *ctx) {
    return ctx ? ctx->device : -1;
}

size_t pf_cuda_ctx_bytes(const pf_cuda_ctx *ctx) {
    (void)ctx;
    return 0;
}

void pf_cuda_ctx_trim(pf_cuda_ctx *ctx) {
    (void)ctx;
}

/* ---- dtype conversion ---- */

static float half_to_float(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, bits;
    if (e == 0 && m == 0) {
        bits = s;
    } else if (e == 0) { /* subnormal: normalise */
        e = 113;
        while (!(m & 1024)) {
            m <<= 1;
            e--;
        }
        bits = s | (e << 23) | ((m & 1023) << 13);
    } else if (e == 31) {
        bits = s | 0x7f800000u | (m << 13);
    } else {
        bits = s | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t s = (x >> 16) & 0x8000u;
    int e = (int)((x >> 23) & 255) - 127 + 15;
    uint32_t m = x & 0x7fffffu;
    if (((x >> 23) & 255) == 255) return (uint16_t)(s | 0x7c00u | (m ? 0x200u : 0));
    if (e >= 31) return (uint16_t)(s | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return (uint16_t)s;
        m |= 0x800000u;
        int shift = 14 - e;
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(s | r);
    }
    uint32_t r = ((uint32_t)e << 10) | (m >> 13), rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) r++;
    return (uint16_t)(s | r);
}

static float *widen(const void *x, size_t n, pf_cuda_dtype dtype) {
    float *f = malloc((n ? n : 1) * sizeof *f);
    if (!f) return NULL;
    const uint16_t *h = x;
    for (size_t i = 0; i < n; i++) {
        if (dtype == PF_CUDA_BF16) {
            uint32_t bits = (uint32_t)h[i] << 16;
            memcpy(&f[i], &bits, 4);
        } else {
            f[i] = half_to_float(h[i]);
        }
    }
    return f;
}

static void narrow(void *dst, const float *f, size_t n, pf_cuda_dtype dtype) {
    uint16_t *h = dst;
    for (size_t i = 0; i < n; i++) {
        if (dtype == PF_CUDA_BF16) {
            uint32_t x;
            memcpy(&x, &f[i], 4);
            if ((x & 0x7fffffffu) > 0x7f800000u) {
                h[i] = (uint16_t)((x >> 16) | 0x40);
            } else {
                x += 0x7fffu + ((x >> 16) & 1);
                h[i] = (uint16_t)(x >> 16);
            }
        } else {
            h[i] = float_to_half(f[i]);
        }
    }
}

/* The float32 views of up to 7 tensors: the tensor itself for float32, else a widened copy
 * (inputs) or a scratch buffer narrowed back at the end (outputs). */
typedef struct {
    pf_cuda_dtype dtype;
    int n;
    void *orig[7];
    float *f[7];
    size_t len[7];
    int out[7];
} views;

static const float *in_view(views *v, const void *x, size_t n) {
    int i = v->n++;
    v->orig[i] = (void *)x;
    v->len[i] = n;
    v->out[i] = 0;
    v->f[i] = v->dtype == PF_CUDA_F32 ? (float *)x : widen(x, n, v->dtype);
    return v->f[i];
}

static float *out_view(views *v, void *x, size_t n) {
    int i = v->n++;
    v->orig[i] = x;
    v->len[i] = n;
    v->out[i] = 1;
    v->f[i] = v->dtype == PF_CUDA_F32 ? (float *)x : calloc(n ? n : 1, sizeof(float));
    return v->f[i];
}

static int views_ok(const views *v) {
    for (int i = 0; i < v->n; i++)
        if (!v->f[i]) return 0;
    return 1;
}

static void views_end(views *v, int write) {
    for (int i = 0; i < v->n; i++) {
        if (v->dtype == PF_CUDA_F32) continue;
        if (write && v->out[i] && v->f[i]) narrow(v->orig[i], v->f[i], v->len[i], v->dtype);
        free(v->f[i]);
    }
}

static pf_status check(pf_cuda_ctx *ctx, pf_cuda_dtype dtype, const pf_shape *shape) {
    if (!ctx) return fail(PF_EINVAL, "ctx is NULL");
    if (!shape) return fail(PF_EINVAL, "shape is NULL");
    if (pf_cuda_dtype_size(dtype) == 0) return fail(PF_EINVAL, "unknown dtype");
    return PF_OK;
}

/* ---- forward and backward ---- */

static pf_status forward(pf_cuda_ctx *ctx, void *out, const void *Q, const void *K, const void *V,
                         pf_cuda_dtype dtype, const pf_shape *s, const pf_attn_opts *opts,
                         const pf_favor_opts *favor, pf_cuda_favor_saved *saved) {
    pf_status st = check(ctx, dtype, s);
    if (st) return st;
    last_error = "";
    size_t nq = (size_t)s->B * s->H * s->Lq, nk = (size_t)s->B * s->H * s->Lk;
    views v = {.dtype = dtype};
    const float *q = in_view(&v, Q, nq * s->d), *k = in_view(&v, K, nk * s->d);
    const float *vv = in_view(&v, V, nk * s->dv);
    float *o = out_view(&v, out, nq * s->dv);
    if (!views_ok(&v)) {
        views_end(&v, 0);
        return PF_ENOMEM;
    }
    if (saved) {
        if (saved->dtype != dtype || memcmp(&saved->shape, s, sizeof *s) != 0)
            st = fail(PF_EINVAL, "saved was made for other arguments");
        else
            st = pf_attn_favor_save(o, q, k, vv, s, opts, favor, saved->cpu);
    } else {
        st = pf_attn_favor(o, q, k, vv, s, opts, favor);
    }
    views_end(&v, st == PF_OK);
    return st;
}

pf_status pf_cuda_favor(pf_cuda_ctx *ctx, void *out, const void *Q, const void *K, const void *V,
                        pf_cuda_dtype dtype, const pf_shape *shape, const pf_attn_opts *opts,
                        const pf_favor_opts *favor, cudaStream_t stream) {
    (void)stream;
    return forward(ctx, out, Q, K, V, dtype, shape, opts, favor, NULL);
}

pf_status pf_cuda_favor_save(pf_cuda_ctx *ctx, void *out, const void *Q, const void *K,
                             const void *V, pf_cuda_dtype dtype, const pf_shape *shape,
                             const pf_attn_opts *opts, const pf_favor_opts *favor,
                             pf_cuda_favor_saved *saved, cudaStream_t stream) {
    (void)stream;
    if (!saved) return fail(PF_EINVAL, "saved is NULL");
    return forward(ctx, out, Q, K, V, dtype, shape, opts, favor, saved);
}

pf_status pf_cuda_favor_backward(pf_cuda_ctx *ctx, void *dQ, void *dK, void *dV, const void *dout,
                                 const void *Q, const void *K, const void *V, pf_cuda_dtype dtype,
                                 const pf_shape *s, const pf_attn_opts *opts,
                                 const pf_favor_opts *favor, const pf_cuda_favor_saved *saved,
                                 cudaStream_t stream) {
    (void)stream;
    pf_status st = check(ctx, dtype, s);
    if (st) return st;
    last_error = "";
    size_t nq = (size_t)s->B * s->H * s->Lq, nk = (size_t)s->B * s->H * s->Lk;
    views v = {.dtype = dtype};
    const float *q = in_view(&v, Q, nq * s->d), *k = in_view(&v, K, nk * s->d);
    const float *vv = in_view(&v, V, nk * s->dv), *g = in_view(&v, dout, nq * s->dv);
    float *dq = out_view(&v, dQ, nq * s->d), *dk = out_view(&v, dK, nk * s->d);
    float *dv = out_view(&v, dV, nk * s->dv);
    if (!views_ok(&v)) {
        views_end(&v, 0);
        return PF_ENOMEM;
    }
    if (saved) {
        if (saved->dtype != dtype || memcmp(&saved->shape, s, sizeof *s) != 0)
            st = fail(PF_EINVAL, "saved was made for other arguments");
        else
            st = pf_attn_favor_backward_saved(dq, dk, dv, g, q, k, vv, NULL, s, opts, favor,
                                              saved->cpu);
    } else {
        st = pf_attn_favor_backward(dq, dk, dv, g, q, k, vv, NULL, s, opts, favor);
    }
    views_end(&v, st == PF_OK);
    return st;
}

pf_status pf_cuda_favor_saved_create(pf_cuda_favor_saved **saved, pf_cuda_ctx *ctx,
                                     pf_cuda_dtype dtype, const pf_shape *shape,
                                     const pf_attn_opts *opts, const pf_favor_opts *favor) {
    if (!saved) return fail(PF_EINVAL, "saved is NULL");
    pf_status st = check(ctx, dtype, shape);
    if (st) return st;
    pf_cuda_favor_saved *s = calloc(1, sizeof *s);
    if (!s) return PF_ENOMEM;
    st = pf_favor_saved_create(&s->cpu, shape, opts, favor, 0);
    if (st) {
        free(s);
        return st;
    }
    s->shape = *shape;
    s->dtype = dtype;
    *saved = s;
    return PF_OK;
}

void pf_cuda_favor_saved_free(pf_cuda_favor_saved *saved) {
    if (!saved) return;
    pf_favor_saved_free(saved->cpu);
    free(saved);
}

size_t pf_cuda_favor_saved_bytes(const pf_cuda_favor_saved *saved) {
    return saved ? pf_favor_saved_bytes(saved->cpu) : 0;
}
