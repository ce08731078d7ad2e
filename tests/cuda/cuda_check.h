/* cuda_check.h: what the CUDA test programs (test_cuda.c, test_cuda_backward.c) share.
 *
 * The run's state (--quick, the seed and the next pf_rng stream, the context, a stream of our
 * own), CUDA runtime helpers (CU, dmalloc, h2d, d2h, poison: 0xFF bytes, NaN in every dtype),
 * bfloat16 and float16 on the host (round to nearest even, as the GPU's __float2bfloat16_rn and
 * __float2half_rn), normwise errors and one-line reports, calls that must fail (EXPECT_FAIL:
 * the status and a non-empty pf_cuda_last_error()), problems (Q, K, V, W on the host, rows of
 * chosen norms) and their device copies (dev), and the start of main: --quick, --only LETTERS,
 * the seed (PF_TEST_SEED, else the clock) and the line that names the GPU and the seed. */
#ifndef PF_TEST_CUDA_CHECK_H
#define PF_TEST_CUDA_CHECK_H

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "check.h"
#include "performer_cuda.h"
#include "ref.h"

static int quick_;           /* --quick: smaller sizes */
static uint64_t seed_;       /* this run's seed */
static uint64_t draws_;      /* the next pf_rng stream: every draw has its own */
static pf_cuda_ctx *ctx_;    /* the context every case uses (device 0) */
static cudaStream_t stream_; /* a stream of our own; calls alternate it with the legacy 0 */

/* ---- CUDA runtime and small helpers ---------------------------------------------------------- */

/* A CUDA runtime call of the test itself failing: nothing sensible can follow. */
static inline void cu_check(cudaError_t e, const char *what, const char *file, int line) {
    if (e != cudaSuccess) {
        fprintf(stderr, "FAIL %s:%d: %s: %s\n", file, line, what, cudaGetErrorString(e));
        exit(1);
    }
}
#define CU(x) cu_check((x), #x, __FILE__, __LINE__)

static inline void *dmalloc(size_t bytes) {
    void *p = NULL;
    CU(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

static inline void h2d(void *dst, const void *src, size_t bytes) {
    CU(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

static inline void d2h(void *dst, const void *src, size_t bytes) {
    CU(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

/* 0xFF bytes: NaN as float32, bfloat16 and float16. */
static inline void poison(void *p, size_t bytes) {
    CU(cudaMemset(p, 0xFF, bytes));
    CU(cudaDeviceSynchronize());
}

static inline int all_bytes(const unsigned char *p, size_t n, unsigned char b) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != b) return 0;
    return 1;
}

static inline double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline cudaStream_t pick_stream(int i) {
    return (i & 1) ? stream_ : (cudaStream_t)0;
}

static inline const char *st_name(pf_status st) {
    static const char *const names[] = {"OK",      "EINVAL", "ENOMEM",  "ENONFINITE",
                                        "EDOMAIN", "EIO",    "EFORMAT", "ENOTSUP"};
    return (unsigned)st < sizeof names / sizeof names[0] ? names[st] : "?";
}

static inline const char *dt_name(pf_cuda_dtype dt) {
    return dt == PF_CUDA_F32 ? "f32" : dt == PF_CUDA_BF16 ? "bf16" : "f16";
}

/* ---- bfloat16 and float16 on the host ---------------------------------------------------------
 * Round to nearest even, as __float2bfloat16_rn and __float2half_rn: overflow to Inf,
 * subnormals kept, NaN stays a (quiet) NaN. */

static inline uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7FFFu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline float bf16_to_f32(uint16_t h) {
    const uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return (uint16_t)(sign | 0x7E00u);  /* NaN */
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520: Inf */
    if (ax < 0x38800000u) {
        /* below 2^-14: a subnormal, in units of 2^-24 (the product is exact; nearbyintf rounds
         * to nearest even); 1024 is the smallest normal, whose encoding it also is */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint16_t)nearbyintf(a * 16777216.0f));
    }
    const uint32_t e = (ax >> 23) - 127 + 15, mant = ax & 0x7FFFFFu, rest = mant & 0x1FFFu;
    uint32_t h = (e << 10) | (mant >> 13);
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* a carry moves the exponent */
    return (uint16_t)(sign | h);
}

static inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
    uint32_t x;
    if (e == 0) {
        const float v = ldexpf((float)mant, -24);
        return sign ? -v : v;
    }
    if (e == 31)
        x = sign | 0x7F800000u | (mant << 13);
    else
        x = sign | ((e - 15 + 127) << 23) | (mant << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static inline size_t esize(pf_cuda_dtype dt) {
    return dt == PF_CUDA_F32 ? 4 : 2;
}

/* n floats to dtype dt (dst: n elements of it). */
static inline void encode(void *dst, const float *x, size_t n, pf_cuda_dtype dt) {
    if (dt == PF_CUDA_F32) {
        memcpy(dst, x, sizeof(float) * n);
        return;
    }
    uint16_t *h = dst;
    for (size_t i = 0; i < n; i++) h[i] = dt == PF_CUDA_BF16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
}

static inline void decode(float *dst, const void *src, size_t n, pf_cuda_dtype dt) {
    if (dt == PF_CUDA_F32) {
        memcpy(dst, src, sizeof(float) * n);
        return;
    }
    const uint16_t *h = src;
    for (size_t i = 0; i < n; i++)
        dst[i] = dt == PF_CUDA_BF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
}

/* x rounded to dt in place: the values the GPU will read. */
static inline void round_to(float *x, size_t n, pf_cuda_dtype dt) {
    if (dt == PF_CUDA_BF16)
        for (size_t i = 0; i < n; i++) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
    if (dt == PF_CUDA_F16)
        for (size_t i = 0; i < n; i++) x[i] = f16_to_f32(f32_to_f16(x[i]));
}

/* A device copy of n floats in dtype dt. */
static inline void *to_device(const float *x, size_t n, pf_cuda_dtype dt) {
    void *tmp = xmalloc(n * esize(dt)), *d = dmalloc(n * esize(dt));
    encode(tmp, x, n, dt);
    h2d(d, tmp, n * esize(dt));
    free(tmp);
    return d;
}

/* Overwrites a device tensor of n elements of dt with x. */
static inline void upload(void *d, const float *x, size_t n, pf_cuda_dtype dt) {
    void *tmp = xmalloc(n * esize(dt));
    encode(tmp, x, n, dt);
    h2d(d, tmp, n * esize(dt));
    free(tmp);
}

/* ---- errors and reports ---------------------------------------------------------------------- */

/* max|got - ref| / max|ref| (max|got - ref| if ref is all zeros); +inf if got holds a NaN or
 * an Inf. */
static inline double nerr(const float *got, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        num = fmax(num, fabs((double)got[i] - (double)ref[i]));
        den = fmax(den, fabs((double)ref[i]));
    }
    return den > 0 ? num / den : num;
}

/* One line per case: its error and tolerance; a check. */
static inline void report(const char *what, double e, double tol) {
    printf("  %-72s err %.2e (tol %.1e)%s\n", what, e, tol, e <= tol ? "" : "  FAIL");
    CHECK(e <= tol, "%s: normwise error %.3g > %.3g", what, e, tol);
}

/* A call that must succeed. */
static inline int check_ok(pf_status st, const char *what) {
    CHECK(st == PF_OK, "%s: %s (%s)", what, pf_status_str(st), pf_cuda_last_error());
    return st == PF_OK;
}

/* A call that must fail with `want` and say why. */
static inline void expect_fail_(pf_status got, pf_status want, const char *expr, const char *file,
                                int line) {
    const char *msg = pf_cuda_last_error();
    check_count_++;
    if (got != want || !msg || !msg[0]) {
        check_failed_++;
        fprintf(stderr, "FAIL %s:%d: %s: got %s, expected %s; pf_cuda_last_error \"%s\"\n", file,
                line, expr, pf_status_str(got), pf_status_str(want), msg ? msg : "(NULL)");
    } else {
        printf("    %-20s %s\n", pf_status_str(got), msg);
    }
}
#define EXPECT_FAIL(expr, want) expect_fail_((expr), (want), #expr, __FILE__, __LINE__)

/* ---- problems -------------------------------------------------------------------------------- */

typedef struct problem {
    pf_shape s;
    int m, wh;            /* rows of W per head; W blocks: 1 (shared) or H (w_per_head) */
    float *Q, *K, *V, *W; /* host: (B,H,Lq,d), (B,H,Lk,d), (B,H,Lk,dv), (wh,m,d) */
    size_t nq, nk, nv, no, nw;
} problem;

/* Q and K rows of norms lo..hi (set_row_norms), V entries N(0, vsig^2), W orthogonal with chi
 * norms, one block per head or one for all. */
static inline problem problem_make(int B, int H, int Lq, int Lk, int d, int dv, int m, int wh,
                                   double lo, double hi, float vsig) {
    problem p;
    p.s = (pf_shape){B, H, Lq, Lk, d, dv};
    p.m = m;
    p.wh = wh;
    p.nq = (size_t)B * H * Lq * d;
    p.nk = (size_t)B * H * Lk * d;
    p.nv = (size_t)B * H * Lk * dv;
    p.no = (size_t)B * H * Lq * dv;
    p.nw = (size_t)wh * m * d;
    p.Q = xmalloc(sizeof(float) * p.nq);
    p.K = xmalloc(sizeof(float) * p.nk);
    p.V = xmalloc(sizeof(float) * p.nv);
    p.W = xmalloc(sizeof(float) * p.nw);
    fill_normal(p.Q, p.nq, 1, seed_, draws_++);
    fill_normal(p.K, p.nk, 1, seed_, draws_++);
    fill_normal(p.V, p.nv, vsig, seed_, draws_++);
    set_row_norms(p.Q, p.nq / d, d, lo, hi);
    set_row_norms(p.K, p.nk / d, d, lo, hi);
    for (int h = 0; h < wh; h++) {
        pf_status st = pf_projection_draw(p.W + (size_t)h * m * d, m, d, PF_PROJ_ORTHOGONAL,
                                          PF_NORM_CHI, seed_, draws_++);
        if (st != PF_OK) {
            fprintf(stderr, "FAIL: pf_projection_draw: %s\n", pf_status_str(st));
            exit(1);
        }
    }
    return p;
}

static inline void problem_free(problem *p) {
    free(p->Q);
    free(p->K);
    free(p->V);
    free(p->W);
}

/* Q, K, V rounded to dt: what the GPU reads, and what the reference is given. */
static inline void problem_round(problem *p, pf_cuda_dtype dt) {
    round_to(p->Q, p->nq, dt);
    round_to(p->K, p->nk, dt);
    round_to(p->V, p->nv, dt);
}

/* Row norms with |x'| = |x| sqrt(scale) in the kernel's range (see the tolerances above). */
static inline void norms_for(pf_kernel k, int d, float scale, double *lo, double *hi) {
    const double s = scale > 0 ? scale : 1.0 / sqrt((double)d);
    *lo = (k == PF_KERNEL_TRIG ? 0.1 : 0.3) / sqrt(s);
    *hi = (k == PF_KERNEL_TRIG ? 0.25 : 1.2) / sqrt(s);
}

typedef struct dims {
    int B, H, Lq, Lk, d, dv, m;
} dims;

static inline problem problem_for(const dims *c, pf_kernel k, int wph, float scale) {
    double lo, hi;
    norms_for(k, c->d, scale, &lo, &hi);
    return problem_make(c->B, c->H, c->Lq, c->Lk, c->d, c->dv, c->m, wph ? c->H : 1, lo, hi, 1);
}

static inline pf_favor_opts favor_of(const problem *p, pf_kernel k, int wph) {
    pf_favor_opts f = pf_favor_opts_default();
    f.kernel = k;
    f.W = p->W;
    f.m = p->m;
    f.w_per_head = wph;
    f.eps = k == PF_KERNEL_RELU ? 1e-3f : 0.0f;
    return f;
}

/* The problem on the device in dtype dt, with an output buffer and a host copy of its bytes. */
typedef struct dev {
    pf_shape s;
    pf_cuda_dtype dt;
    size_t no, bq, bk, bv, bo; /* output elements; bytes of Q, K, V, out */
    void *Q, *K, *V, *out;
    float *W;
    unsigned char *raw; /* the last output's bytes */
} dev;

static inline dev dev_make(const problem *p, pf_cuda_dtype dt) {
    dev g;
    g.s = p->s;
    g.dt = dt;
    g.no = p->no;
    g.bq = p->nq * esize(dt);
    g.bk = p->nk * esize(dt);
    g.bv = p->nv * esize(dt);
    g.bo = p->no * esize(dt);
    g.Q = to_device(p->Q, p->nq, dt);
    g.K = to_device(p->K, p->nk, dt);
    g.V = to_device(p->V, p->nv, dt);
    g.W = to_device(p->W, p->nw, PF_CUDA_F32);
    g.out = dmalloc(g.bo);
    g.raw = xmalloc(g.bo);
    return g;
}

static inline void dev_free(dev *g) {
    CU(cudaFree(g->Q));
    CU(cudaFree(g->K));
    CU(cudaFree(g->V));
    CU(cudaFree(g->W));
    CU(cudaFree(g->out));
    free(g->raw);
}

/* pf_cuda_favor on g (f's W replaced by g's device copy), out poisoned first; g->raw gets the
 * output's bytes and out_h, if not NULL, its values. */
static inline pf_status dev_run(dev *g, float *out_h, const pf_attn_opts *o, const pf_favor_opts *f,
                                cudaStream_t stream) {
    pf_favor_opts fd = *f;
    fd.W = g->W;
    poison(g->out, g->bo);
    pf_status st = pf_cuda_favor(ctx_, g->out, g->Q, g->K, g->V, g->dt, &g->s, o, &fd, stream);
    d2h(g->raw, g->out, g->bo);
    if (out_h) decode(out_h, g->raw, g->no, g->dt);
    return st;
}

static inline void describe(char *buf, size_t len, const char *tag, pf_cuda_dtype dt, pf_kernel k,
                            const pf_shape *s, int m, int causal, int wph, float scale, int chunk) {
    snprintf(buf, len, "%s %s %s %s B%d H%d L%dx%d d%d dv%d m%d %s s%g C%d", tag, dt_name(dt),
             pf_kernel_name(k), causal ? "causal" : "bidir", s->B, s->H, s->Lq, s->Lk, s->d, s->dv,
             m, wph ? "W/head" : "W", (double)scale, chunk);
}

/* ---- main ------------------------------------------------------------------------------------ */

/* --quick and --only LETTERS (some of the cases `letters`; *only keeps every one otherwise).
 * -1 to go on, else main's exit status (2: a usage error, said on stderr). */
static inline int cuda_test_args(int argc, char **argv, const char *letters, const char **only) {
    *only = letters;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick_ = 1;
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            *only = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--quick] [--only LETTERS (cases %c..%c)]\n", argv[0],
                    letters[0], letters[strlen(letters) - 1]);
            return 2;
        }
    }
    return -1;
}

/* The seed, from PF_TEST_SEED or fresh from the clock, and the line that names the GPU and
 * says how to replay the run. 0, or 2 when PF_TEST_SEED is not a number. */
static inline int cuda_test_seed(const char *prog) {
    const char *env = getenv("PF_TEST_SEED");
    if (env && *env) {
        char *end;
        seed_ = strtoull(env, &end, 0);
        if (*end) {
            fprintf(stderr, "%s: PF_TEST_SEED=%s is not a number\n", prog, env);
            return 2;
        }
    } else {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        seed_ = (uint64_t)t.tv_sec * 1000003u ^ (uint64_t)t.tv_nsec;
    }
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("%s: %s, %d GPU(s); seed %" PRIu64 " (replay: PF_TEST_SEED=%" PRIu64
           " %s%s [--only LETTERS])\n",
           prog, prop.name, pf_cuda_device_count(), seed_, seed_, prog, quick_ ? " --quick" : "");
    fflush(stdout);
    return 0;
}

/* Runs the cases whose letter (names[i]) is in only, each on its own pf_rng streams (so that
 * --only replays a case with the inputs it has in a whole run), each followed by its time. */
static inline void cuda_test_cases(const char *prog, void (*const *cases)(void), const char *names,
                                   const char *only) {
    const double start = now_s();
    for (size_t i = 0; names[i]; i++) {
        if (!strchr(only, names[i])) continue;
        draws_ = (uint64_t)(i + 1) << 32;
        const double t0 = now_s();
        cases[i]();
        printf("%c: %.1f s\n", names[i], now_s() - t0);
        fflush(stdout);
    }
    printf("%s: %.1f s in all\n", prog, now_s() - start);
}

#endif
