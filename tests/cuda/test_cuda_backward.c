/* test_cuda_backward.c: the FAVOR+ backward of libperformer_cuda (pf_cuda_favor_backward,
 * include/performer_cuda.h) against the CPU library.
 *
 * Every GPU gradient is compared with the CPU's given the same W and the same inputs (the same
 * floats, copied to the device): pf_attn_favor_backward (float32, itself checked against
 * float64 and finite differences in test_favor_backward.c) or pf_attn_favor_backward_ref
 * (float64, used where its single-threaded cost is small: REF_COST). The error of each
 * gradient is normwise per batch element, max|gpu - cpu| / max|cpu| over the element's rows, the
 * worst over the batch (a NaN or Inf in the GPU's counts as infinite); where every query of an
 * element sees a single key its dQ and dK are zero in exact arithmetic, and their error is taken
 * relative to max|dout| max|V| instead (grad_err). Each case prints a line with the errors of
 * dQ, dK and dV.
 *
 * a. float32 (TF32 off, the default): positive, hyperbolic, trig, relu (eps 1e-3) and positive
 *    with eps 0.01 (the gradient of the row maximum), bidirectional (Lq < Lk and Lq > Lk too)
 *    and causal, W shared and per head, B = 2, H = 3, d = 16 and 64, dv != d, m = 32, 256 and
 *    266, L = 1, 2, 127, 128, 129, 1000, 4099, chunk 0 (128), 16 and 1, scale 0 and 0.3.
 * b. bfloat16 and float16: Q, K, V and dout rounded to the dtype on the host and the rounded
 *    values given to the CPU (float64 where small, float32 at larger sizes: its own error,
 *    ~1e-6, is nothing beside the tolerance); every map, bidirectional (Lq != Lk too) and
 *    causal, chunk 128 and 16, every other run padded.
 * c. Kept or recomputed: pf_cuda_favor_save's out is pf_cuda_favor's, bit for bit; the saved
 *    holds what pf_cuda_favor_saved_size said; the backward from it agrees with the one that
 *    recomputes (the line says whether the bits are the same) and with the CPU; a saved filled
 *    again by new inputs serves them; a saved made for another shape, dtype, causality,
 *    kernel, m, W or key lengths, a saved never filled and one whose save failed (NaN in Q:
 *    left empty) are PF_EINVAL, with the gradients untouched.
 * d. Strict causality of the gradients: keys and values after position t replaced (keys of 3
 *    times the largest norm, values x10) and dout's rows after t redrawn x10: dQ's rows 0..t
 *    keep every bit (memcmp); queries and dout's rows before t redrawn: dK's and dV's rows
 *    t.. change by rounding at most (TOL_LATER in float32; in half precision two units in the
 *    dtype's last place, normwise, as a float32 sum that moves by rounding may round to a
 *    neighbouring half value); the line says whether their bits stayed. t inside a chunk, at
 *    its end, at the next one's start, past it.
 * e. Padding: key_len in host and in device memory: the CPU's gradients (float32 and float64),
 *    and the padded keys' rows of dK and dV exactly zero.
 * f. Long: L = 65536 (8192 with --quick), B = 1, H = 2, d = 64, m = 256, bfloat16, causal and
 *    bidirectional: finite and within the half tolerance of the CPU's float32 backward on the
 *    rounded inputs; pf_cuda_favor_backward_workspace's bytes printed, per head linear in L
 *    (per_head(2L) <= 2.1 per_head(L)).
 * g. Every refused argument (NULLs, host pointers, shapes, dtypes, options, FAVOR++/FAVOR#,
 *    key lengths, outputs overlapping inputs or each other): the status, a non-empty
 *    pf_cuda_last_error(), the gradients untouched; NaN or Inf in dout, Q, K, V or W:
 *    PF_ENONFINITE and zero gradients; relu with eps 0 and every key zero (every feature 0):
 *    PF_EDOMAIN and zero gradients, never a NaN.
 * h. A workspace limit of 1 byte (one head at a time), recomputed and kept: the default's
 *    results within the tolerance (the line says whether the bits are the same).
 *
 * Tolerances. float32, 1e-5 (TOL_F32): both sides compute in float32 with sums in other orders,
 * on inputs kept well conditioned as test_cuda.c's (norms_for: positive features, or trig
 * estimates that stay near e^(q'.k') > 0, so no denominator cancels); the CPU's float32
 * backward is itself within ~1e-6 of float64 on such inputs. Half precision, 4e-2 (TOL_HALF):
 * the gradients are stored in the dtype (a relative 2^-8 at most in bfloat16), the products
 * read features, [V|1], the states, A', B' and dN rounded to bfloat16 (2^-8 each), and the
 * projection of half inputs runs on TF32. A gradient is a difference of such terms (dN's two
 * parts, G/D and -(G.out)/D, rounded apart, meet [V|1] in one product: g.(v_j - out_i)/D), so
 * its normwise error exceeds the output's where few keys and features make it small: the
 * GPU's roundings emulated in tests/cuda/emulate_backward.py at this program's smallest shapes
 * (d = 16, m = 32, L = 7 and 64) reach 2.2e-2 (40 seeds; 2.9e-2 once in 150), an H100 measured
 * 2.4e-2 once at L = 7 (float16, hyperbolic), 1.7e-3 to 8.9e-3 at L = 300 to 4099 (relu
 * 1.3e-2) and 2.6e-3 to 6.5e-3 at L = 65536; 4e-2 holds them
 * all with the margin of the TF32 projection and the output's own rounding, which the
 * emulation leaves out. Where two GPU runs differ only in kept or recomputed
 * features or in heads at a time, cuBLAS may pick other kernels: the dtype's tolerance, bits
 * reported.
 *
 * Seeds: fresh each run (from the clock), printed, and taken from PF_TEST_SEED if set, so a
 * failure can be replayed (with the same --quick; --only LETTERS runs some of the cases, with
 * the inputs they have in a whole run). --quick: smaller sizes and fewer combinations, every
 * kind of case (for compute-sanitizer's memcheck, 10-100x slower). Before every GPU call the
 * gradients are filled with 0xFF bytes (NaN in float32, bfloat16 and float16), so a row the GPU
 * fails to write shows. Without a GPU the program says so and passes. */
#include "cuda_check.h"

static const double TOL_F32 = 1e-5;   /* float32 gradients against the CPU */
static const double TOL_HALF = 4e-2;  /* bfloat16 and float16 gradients against the CPU */
static const double TOL_LATER = 1e-6; /* d: float32 rows t.. when rows before t change */
/* The float64 reference where B H (Lq + Lk) (m d + r (dv + 1)) is at most this: it runs at
 * ~5e8 of these units a second on one core, so each call costs at most ~0.1 s. */
static const double REF_COST = 5e7;

static const char *const GNAME[3] = {"dQ", "dK", "dV"};

static double tol_of(pf_cuda_dtype dt) {
    return dt == PF_CUDA_F32 ? TOL_F32 : TOL_HALF;
}

/* ---- gradients on the host and on the device ------------------------------------------------- */

typedef struct grads {
    float *t[3]; /* dQ (B,H,Lq,d), dK (B,H,Lk,d), dV (B,H,Lk,dv) */
    size_t n[3];
} grads;

static grads grads_make(const problem *p) {
    grads r;
    r.n[0] = p->nq;
    r.n[1] = p->nk;
    r.n[2] = p->nv;
    for (int t = 0; t < 3; t++) r.t[t] = xmalloc(sizeof(float) * r.n[t]);
    return r;
}

static void grads_free(grads *r) {
    for (int t = 0; t < 3; t++) free(r->t[t]);
}

/* A problem on the device (dev: Q, K, V, W, out) with an upstream gradient dout, N(0, 1)
 * rounded to the dtype (host copy G), and the three gradients. */
typedef struct bdev {
    dev g;
    float *G;              /* host dout (B,H,Lq,dv), the values the GPU reads */
    void *dG;              /* device dout */
    void *d[3];            /* device dQ, dK, dV */
    size_t n[3], bytes[3]; /* their elements and bytes */
    unsigned char *raw[3]; /* the last gradients' bytes */
} bdev;

static bdev bdev_make(const problem *p, pf_cuda_dtype dt) {
    bdev b;
    b.g = dev_make(p, dt);
    b.G = xmalloc(sizeof(float) * p->no);
    fill_normal(b.G, p->no, 1, seed_, draws_++);
    round_to(b.G, p->no, dt);
    b.dG = to_device(b.G, p->no, dt);
    b.n[0] = p->nq;
    b.n[1] = p->nk;
    b.n[2] = p->nv;
    for (int t = 0; t < 3; t++) {
        b.bytes[t] = b.n[t] * esize(dt);
        b.d[t] = dmalloc(b.bytes[t]);
        b.raw[t] = xmalloc(b.bytes[t]);
    }
    return b;
}

static void bdev_free(bdev *b) {
    dev_free(&b->g);
    free(b->G);
    CU(cudaFree(b->dG));
    for (int t = 0; t < 3; t++) {
        CU(cudaFree(b->d[t]));
        free(b->raw[t]);
    }
}

/* f with W replaced by the device copy. */
static pf_favor_opts on_device(const bdev *b, const pf_favor_opts *f) {
    pf_favor_opts fd = *f;
    fd.W = b->g.W;
    return fd;
}

/* pf_cuda_favor_backward on b (f's W replaced by the device copy), the gradients poisoned
 * first; b->raw gets their bytes and out, if not NULL, their values. */
static pf_status bdev_run(bdev *b, grads *out, const pf_attn_opts *o, const pf_favor_opts *f,
                          const pf_cuda_favor_saved *saved, cudaStream_t stream) {
    const pf_favor_opts fd = on_device(b, f);
    for (int t = 0; t < 3; t++) poison(b->d[t], b->bytes[t]);
    pf_status st = pf_cuda_favor_backward(ctx_, b->d[0], b->d[1], b->d[2], b->dG, b->g.Q, b->g.K,
                                          b->g.V, b->g.dt, &b->g.s, o, &fd, saved, stream);
    for (int t = 0; t < 3; t++) {
        d2h(b->raw[t], b->d[t], b->bytes[t]);
        if (out) decode(out->t[t], b->raw[t], b->n[t], b->g.dt);
    }
    return st;
}

/* Whether every byte of the three gradients is still 0xFF (a refused call wrote nothing). */
static int bdev_untouched(bdev *b) {
    int ok = 1;
    for (int t = 0; t < 3; t++) {
        d2h(b->raw[t], b->d[t], b->bytes[t]);
        ok &= all_bytes(b->raw[t], b->bytes[t], 0xFF);
    }
    return ok;
}

static void bdev_poison(bdev *b) {
    for (int t = 0; t < 3; t++) poison(b->d[t], b->bytes[t]);
}

/* Copies of the last gradients' bytes, and whether two such copies are the same. */
static void raw_keep(unsigned char *keep[3], const bdev *b) {
    for (int t = 0; t < 3; t++) {
        keep[t] = xmalloc(b->bytes[t]);
        memcpy(keep[t], b->raw[t], b->bytes[t]);
    }
}

static int raw_same(unsigned char *const keep[3], const bdev *b) {
    int same = 1;
    for (int t = 0; t < 3; t++) same &= memcmp(keep[t], b->raw[t], b->bytes[t]) == 0;
    return same;
}

static void raw_free(unsigned char *keep[3]) {
    for (int t = 0; t < 3; t++) free(keep[t]);
}

/* The CPU's gradients for p with upstream gradient G: pf_attn_favor_backward (float32) or,
 * with f64, pf_attn_favor_backward_ref (float64). */
static int cpu_grads(grads *r, const problem *p, const float *G, const pf_attn_opts *o,
                     const pf_favor_opts *f, int f64) {
    pf_status st = f64 ? pf_attn_favor_backward_ref(r->t[0], r->t[1], r->t[2], G, p->Q, p->K, p->V,
                                                    &p->s, o, f)
                       : pf_attn_favor_backward(r->t[0], r->t[1], r->t[2], G, p->Q, p->K, p->V,
                                                NULL, &p->s, o, f);
    return check_ok(st, f64 ? "pf_attn_favor_backward_ref" : "pf_attn_favor_backward");
}

/* Whether the float64 reference is cheap enough for this shape (REF_COST). */
static int ref_small(const pf_shape *s, int m, pf_kernel k) {
    const double r = pf_kernel_width(k, m);
    return (double)s->B * s->H * (s->Lq + s->Lk) * (m * (double)s->d + r * (s->dv + 1)) <= REF_COST;
}

/* The normwise error of one gradient (n elements of B equal blocks, one per batch element,
 * each a problem of its own): per batch element, max|got - ref| / max|ref| over its rows, the
 * worst over the batch. Where every query of an element sees one key (key length 1), its output
 * is that key's value whatever the queries and keys, so its dQ and dK vanish exactly and what
 * either side computes is the rounding of a cancelling sum: their error is then relative to the
 * element's max|dout| max|V| (lows: the denominator's least value). */
static double grad_err(const float *got, const float *ref, size_t n, int B, const double *lows) {
    const size_t per = n / (size_t)B;
    double worst = 0;
    for (int b = 0; b < B; b++) {
        double num = 0, den = 0;
        for (size_t i = (size_t)b * per; i < (size_t)(b + 1) * per; i++) {
            if (!isfinite(got[i])) return INFINITY;
            num = fmax(num, fabs((double)got[i] - (double)ref[i]));
            den = fmax(den, fabs((double)ref[i]));
        }
        den = lows ? fmax(den, lows[b]) : den;
        worst = fmax(worst, den > 0 ? num / den : num);
    }
    return worst;
}

/* One line: the errors of dQ, dK and dV against ref (grad_err: p's shape, its V and the upstream
 * gradient G, key lengths klen in host memory or NULL), and a check of each. Returns the worst. */
static double report3(const char *what, const grads *got, const grads *ref, double tol,
                      const problem *p, const float *G, const int32_t *klen) {
    const pf_shape s = p->s;
    double *lows = xmalloc(sizeof(double) * s.B);
    int single = 0;
    for (int b = 0; b < s.B; b++) {
        lows[b] = 0;
        if ((klen ? klen[b] : s.Lk) != 1) continue;
        const size_t no = p->no / s.B, nv = p->nv / s.B;
        double gmax = 0, vmax = 0;
        for (size_t i = 0; i < no; i++) gmax = fmax(gmax, fabs(G[(size_t)b * no + i]));
        for (size_t i = 0; i < nv; i++) vmax = fmax(vmax, fabs(p->V[(size_t)b * nv + i]));
        lows[b] = gmax * vmax;
        single = 1;
    }
    double e[3], worst = 0;
    for (int t = 0; t < 3; t++) {
        e[t] = grad_err(got->t[t], ref->t[t], got->n[t], s.B, t < 2 && single ? lows : NULL);
        worst = fmax(worst, e[t]);
    }
    free(lows);
    printf("  %-72s dQ %.2e dK %.2e dV %.2e (tol %.0e)%s\n", what, e[0], e[1], e[2], tol,
           worst <= tol ? "" : "  FAIL");
    for (int t = 0; t < 3; t++)
        CHECK(e[t] <= tol, "%s: %s normwise error %.3g > %.3g", what, GNAME[t], e[t], tol);
    return worst;
}

/* Non-finite and nonzero elements of the three gradients. */
static void count_grads(const grads *g, size_t *nonfinite, size_t *nonzero) {
    *nonfinite = *nonzero = 0;
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < g->n[t]; i++) {
            *nonfinite += !isfinite(g->t[t][i]);
            *nonzero += g->t[t][i] != 0.0f;
        }
}

/* s added at the end of buf (len bytes). */
static void append(char *buf, size_t len, const char *s) {
    const size_t n = strlen(buf);
    snprintf(buf + n, len - n, "%s", s);
}

/* ---- a. float32 ------------------------------------------------------------------------------ */

/* The maps of a and their eps: the four, and positive with eps 0.01 (the row maximum's term).
 * Not larger: that term's rounding in dQ grows with eps (the CPU's float32 dQ is 8e-6 from
 * float64 at eps 0.05, L = 4099, bidirectional, 1.5e-6 at 0.01, 9e-7 without it). */
enum { NMAPS = 5 };

static pf_kernel map_kernel(int kv) {
    return kv < 4 ? (pf_kernel)kv : PF_KERNEL_POSITIVE;
}

static float map_eps(int kv) {
    return kv == PF_KERNEL_RELU ? 1e-3f : kv == 4 ? 0.01f : 0.0f;
}

static void test_fp32(void) {
    static const dims full[] = {
        {2, 3, 1, 1, 16, 24, 32},        {2, 3, 2, 2, 64, 40, 266},
        {2, 3, 127, 127, 16, 24, 256},   {2, 3, 128, 128, 64, 40, 32},
        {2, 3, 129, 129, 16, 40, 266},   {2, 3, 129, 300, 64, 24, 32},
        {2, 3, 1000, 127, 16, 24, 256},  {2, 3, 1000, 1000, 64, 40, 256},
        {2, 3, 4099, 4099, 64, 40, 266},
    };
    static const dims small[] = {
        {2, 3, 1, 1, 16, 24, 32},     {2, 3, 2, 2, 64, 40, 266},     {2, 3, 129, 129, 16, 40, 266},
        {2, 3, 129, 300, 64, 24, 32}, {1, 2, 300, 300, 64, 40, 256},
    };
    const dims *cs = quick_ ? small : full;
    const int nc =
        quick_ ? (int)(sizeof small / sizeof small[0]) : (int)(sizeof full / sizeof full[0]);
    printf("a. float32 (TF32 off) against pf_attn_favor_backward (f32) and, where small, "
           "pf_attn_favor_backward_ref (f64), given the same W\n");
    double worst = 0, worst64 = 0;
    int runs = 0;
    for (int ci = 0; ci < nc; ci++) {
        const dims *c = &cs[ci];
        for (int kv = 0; kv < NMAPS; kv++) {
            const pf_kernel k = map_kernel(kv);
            const int wph = (ci + kv) % 2;
            const float scale = (ci + kv / 2) % 2 ? 0.3f : 0.0f;
            problem p = problem_for(c, k, wph, scale);
            bdev b = bdev_make(&p, PF_CUDA_F32);
            grads ref = grads_make(&p), ref64 = grads_make(&p), got = grads_make(&p);
            pf_favor_opts f = favor_of(&p, k, wph);
            f.eps = map_eps(kv);
            const int f64 = ref_small(&p.s, p.m, k);
            for (int causal = 0; causal <= (c->Lq == c->Lk); causal++) {
                pf_attn_opts o = pf_attn_opts_default();
                o.scale = scale;
                o.causal = causal;
                f.chunk = 0;
                if (!cpu_grads(&ref, &p, b.G, &o, &f, 0)) continue;
                if (f64 && !cpu_grads(&ref64, &p, b.G, &o, &f, 1)) continue;
                /* chunk 1 only up to L = 1000 (129 with --quick): its chunk states take
                 * L r dv floats per head */
                static const int chunks[3] = {0, 16, 1};
                const int nch = !causal ? 1 : c->Lq <= (quick_ ? 129 : 1000) ? 3 : 2;
                for (int i = 0; i < nch; i++) {
                    char what[200];
                    f.chunk = chunks[i];
                    describe(what, sizeof what, "a.", PF_CUDA_F32, k, &p.s, p.m, causal, wph, scale,
                             f.chunk);
                    if (kv == 4) append(what, sizeof what, " eps.01");
                    pf_status st = bdev_run(&b, &got, &o, &f, NULL, pick_stream(ci + kv + i));
                    if (!check_ok(st, what)) continue;
                    worst = fmax(worst, report3(what, &got, &ref, TOL_F32, &p, b.G, NULL));
                    if (f64) {
                        append(what, sizeof what, " vs f64");
                        worst64 =
                            fmax(worst64, report3(what, &got, &ref64, TOL_F32, &p, b.G, NULL));
                    }
                    runs++;
                }
            }
            grads_free(&ref);
            grads_free(&ref64);
            grads_free(&got);
            bdev_free(&b);
            problem_free(&p);
        }
    }
    printf("a. %d runs, worst error %.2e against float32, %.2e against float64\n", runs, worst,
           worst64);
}

/* ---- b. bfloat16 and float16 ----------------------------------------------------------------- */

static void test_half(void) {
    static const dims full[] = {
        {2, 3, 7, 7, 16, 40, 32},
        {2, 3, 129, 300, 64, 24, 256},
        {2, 2, 700, 700, 64, 40, 266},
        {1, 2, 4099, 4099, 64, 64, 256},
    };
    static const dims small[] = {
        {2, 3, 7, 7, 16, 40, 32},
        {2, 3, 129, 300, 64, 24, 256},
        {1, 2, 300, 300, 64, 40, 266},
    };
    const dims *cs = quick_ ? small : full;
    const int nc =
        quick_ ? (int)(sizeof small / sizeof small[0]) : (int)(sizeof full / sizeof full[0]);
    static const pf_cuda_dtype dts[2] = {PF_CUDA_BF16, PF_CUDA_F16};
    printf("b. bfloat16 and float16 against the CPU on the rounded inputs (float64; * float32)\n");
    double worst[2] = {0, 0};
    for (int di = 0; di < 2; di++) {
        const pf_cuda_dtype dt = dts[di];
        for (int ci = 0; ci < nc; ci++) {
            const dims *c = &cs[ci];
            for (int k = 0; k < 4; k++) {
                const int wph = (ci + k + di) % 2;
                const float scale = (ci + k / 2) % 2 ? 0.3f : 0.0f;
                problem p = problem_for(c, (pf_kernel)k, wph, scale);
                problem_round(&p, dt);
                bdev b = bdev_make(&p, dt);
                grads ref = grads_make(&p), got = grads_make(&p);
                pf_favor_opts f = favor_of(&p, (pf_kernel)k, wph);
                const int f64 = ref_small(&p.s, p.m, (pf_kernel)k);
                /* every other run pads batch element 1: key_len in host memory */
                const int32_t kl[2] = {c->Lk, c->Lk - c->Lk / 3};
                const int pad = ((k ^ (k >> 1)) + ci + di) % 2 == 1 && c->B == 2;
                for (int causal = 0; causal <= (c->Lq == c->Lk); causal++) {
                    pf_attn_opts o = pf_attn_opts_default();
                    o.scale = scale;
                    o.causal = causal;
                    o.key_len = pad ? kl : NULL;
                    f.chunk = 0;
                    if (!cpu_grads(&ref, &p, b.G, &o, &f, f64)) continue;
                    f.chunk = !causal ? 0 : (ci + k + di) % 2 ? 16 : 128;
                    char what[200];
                    describe(what, sizeof what, f64 ? "b." : "b.*", dt, (pf_kernel)k, &p.s, p.m,
                             causal, wph, scale, f.chunk);
                    if (pad) {
                        const size_t n = strlen(what);
                        snprintf(what + n, sizeof what - n, " key_len %d,%d", kl[0], kl[1]);
                    }
                    pf_status st = bdev_run(&b, &got, &o, &f, NULL, pick_stream(ci + k));
                    if (!check_ok(st, what)) continue;
                    worst[di] =
                        fmax(worst[di], report3(what, &got, &ref, TOL_HALF, &p, b.G, o.key_len));
                }
                grads_free(&ref);
                grads_free(&got);
                bdev_free(&b);
                problem_free(&p);
            }
        }
    }
    printf("b. worst error bf16 %.2e, f16 %.2e\n", worst[0], worst[1]);
}

/* ---- c. kept or recomputed ------------------------------------------------------------------- */

/* A backward with saved for arguments other than it was made for: PF_EINVAL, nothing written. */
static void refused_saved(bdev *b, const pf_shape *s, pf_cuda_dtype dt, const pf_attn_opts *o,
                          const pf_favor_opts *fd, const pf_cuda_favor_saved *saved,
                          const char *what) {
    bdev_poison(b);
    pf_status st = pf_cuda_favor_backward(ctx_, b->d[0], b->d[1], b->d[2], b->dG, b->g.Q, b->g.K,
                                          b->g.V, dt, s, o, fd, saved, 0);
    const char *msg = pf_cuda_last_error();
    check_count_++;
    if (st != PF_EINVAL || !msg[0]) {
        check_failed_++;
        fprintf(stderr, "FAIL %s:%d: c. saved %s: %s, expected EINVAL; pf_cuda_last_error \"%s\"\n",
                __FILE__, __LINE__, what, pf_status_str(st), msg);
    } else {
        printf("    saved %-28s %s %s\n", what, pf_status_str(st), msg);
    }
    CHECK(bdev_untouched(b), "c. saved %s: a refused backward wrote into the gradients", what);
}

/* Another saved's arguments (made for the first ones, used with these): each PF_EINVAL. */
static void test_saved_mismatch(bdev *b, const problem *p, const pf_attn_opts *o,
                                const pf_favor_opts *f, pf_cuda_favor_saved *saved) {
    const pf_favor_opts fd = on_device(b, f);
    const pf_cuda_dtype dt = b->g.dt;
    pf_shape s = p->s;
    s.B = 1;
    refused_saved(b, &s, dt, o, &fd, saved, "for another B");
    s = p->s;
    s.H = s.H - 1;
    refused_saved(b, &s, dt, o, &fd, saved, "for another H");
    if (!o->causal) {
        s = p->s;
        s.Lk = s.Lk - 1;
        refused_saved(b, &s, dt, o, &fd, saved, "for another Lk");
    }
    s = p->s;
    s.dv = s.dv - 1;
    refused_saved(b, &s, dt, o, &fd, saved, "for another dv");
    /* (a dtype whose elements are no larger: the buffers hold what it would read) */
    const pf_cuda_dtype other = dt == PF_CUDA_BF16 ? PF_CUDA_F16 : PF_CUDA_BF16;
    refused_saved(b, &p->s, other, o, &fd, saved, "for another dtype");
    if (p->s.Lq == p->s.Lk) {
        pf_attn_opts oc = *o;
        oc.causal = !o->causal;
        refused_saved(b, &p->s, dt, &oc, &fd, saved, "for the other causality");
    }
    pf_favor_opts fo = fd;
    fo.kernel = fd.kernel == PF_KERNEL_HYPERBOLIC ? PF_KERNEL_POSITIVE : PF_KERNEL_HYPERBOLIC;
    fo.eps = 0;
    refused_saved(b, &p->s, dt, o, &fo, saved, "for another kernel");
    fo = fd;
    fo.m = fd.m - 1;
    refused_saved(b, &p->s, dt, o, &fo, saved, "for another m");
    /* another W: another draw, in another buffer */
    float *W2 = xmalloc(sizeof(float) * p->nw);
    for (int h = 0; h < p->wh; h++)
        pf_projection_draw(W2 + (size_t)h * p->m * p->s.d, p->m, p->s.d, PF_PROJ_ORTHOGONAL,
                           PF_NORM_CHI, seed_, draws_++);
    float *dW2 = to_device(W2, p->nw, PF_CUDA_F32);
    fo = fd;
    fo.W = dW2;
    refused_saved(b, &p->s, dt, o, &fo, saved, "for another W");
    CU(cudaFree(dW2));
    free(W2);
    /* other key lengths: one shorter, or none (all Lk) */
    int32_t kl[2] = {p->s.Lk, p->s.Lk};
    if (o->key_len) memcpy(kl, o->key_len, sizeof kl);
    kl[1] = kl[1] > 1 ? kl[1] - 1 : 2;
    pf_attn_opts ok = *o;
    ok.key_len = kl;
    refused_saved(b, &p->s, dt, &ok, &fd, saved, "for other key lengths");
    if (o->key_len) {
        ok.key_len = NULL;
        refused_saved(b, &p->s, dt, &ok, &fd, saved, "for no key lengths");
    }
    /* the forward refuses it too, and leaves out as it was */
    s = p->s;
    s.B = 1;
    poison(b->g.out, b->g.bo);
    EXPECT_FAIL(
        pf_cuda_favor_save(ctx_, b->g.out, b->g.Q, b->g.K, b->g.V, dt, &s, o, &fd, saved, 0),
        PF_EINVAL);
    d2h(b->g.raw, b->g.out, b->g.bo);
    CHECK(all_bytes(b->g.raw, b->g.bo, 0xFF), "c. a refused save wrote into out");
}

static void test_saved(void) {
    const dims c = {2, 3, quick_ ? 129 : 300, quick_ ? 129 : 300, 64, 40, 256};
    static const pf_cuda_dtype dts[3] = {PF_CUDA_F32, PF_CUDA_BF16, PF_CUDA_F16};
    printf("c. kept (pf_cuda_favor_save) or recomputed features\n");
    for (int di = 0; di < 3; di++) {
        const pf_cuda_dtype dt = dts[di];
        for (int causal = 0; causal < 2; causal++) {
            const pf_kernel k = (pf_kernel)((di + 2 * causal) % 4);
            const int wph = (di + causal) % 2;
            problem p = problem_for(&c, k, wph, 0);
            problem_round(&p, dt);
            bdev b = bdev_make(&p, dt);
            grads kept = grads_make(&p), rec = grads_make(&p), ref = grads_make(&p);
            pf_favor_opts f = favor_of(&p, k, wph);
            const pf_favor_opts fd = on_device(&b, &f);
            const int32_t kl[2] = {c.Lk, c.Lk - c.Lk / 3};
            pf_attn_opts o = pf_attn_opts_default();
            o.causal = causal;
            o.key_len = (di + causal) % 2 ? kl : NULL;
            const double tol = tol_of(dt);
            char what[200], tag[200];
            describe(tag, sizeof tag, "c.", dt, k, &p.s, p.m, causal, wph, 0, 0);
            if (o.key_len) append(tag, sizeof tag, " padded");
            size_t want = 0;
            check_ok(pf_cuda_favor_saved_size(&want, dt, &p.s, &o, &fd),
                     "pf_cuda_favor_saved_size");
            pf_cuda_favor_saved *sv = NULL;
            if (!check_ok(pf_cuda_favor_saved_create(&sv, ctx_, dt, &p.s, &o, &fd),
                          "pf_cuda_favor_saved_create")) {
                grads_free(&kept);
                grads_free(&rec);
                grads_free(&ref);
                bdev_free(&b);
                problem_free(&p);
                continue;
            }
            const size_t held = pf_cuda_favor_saved_bytes(sv);
            printf("  %s: saved %zu bytes (pf_cuda_favor_saved_size %zu)\n", tag, held, want);
            CHECK(held == want && want > 0, "%s: the saved holds %zu bytes, its size said %zu", tag,
                  held, want);
            /* never filled */
            refused_saved(&b, &p.s, dt, &o, &fd, sv, "never filled");
            /* the forward that fills it: the same out as pf_cuda_favor, bit for bit */
            check_ok(dev_run(&b.g, NULL, &o, &f, 0), "c. pf_cuda_favor");
            unsigned char *plain = xmalloc(b.g.bo);
            memcpy(plain, b.g.raw, b.g.bo);
            poison(b.g.out, b.g.bo);
            pf_status st = pf_cuda_favor_save(ctx_, b.g.out, b.g.Q, b.g.K, b.g.V, dt, &p.s, &o, &fd,
                                              sv, stream_);
            check_ok(st, "c. pf_cuda_favor_save");
            d2h(b.g.raw, b.g.out, b.g.bo);
            const int out_same = memcmp(plain, b.g.raw, b.g.bo) == 0;
            CHECK(out_same, "%s: pf_cuda_favor_save's out is not pf_cuda_favor's", tag);
            /* kept against recomputed, both against the CPU */
            f.chunk = 0;
            check_ok(bdev_run(&b, &kept, &o, &f, sv, stream_), "c. backward, kept");
            unsigned char *bits[3];
            raw_keep(bits, &b);
            check_ok(bdev_run(&b, &rec, &o, &f, NULL, 0), "c. backward, recomputed");
            const int same = raw_same(bits, &b);
            raw_free(bits);
            snprintf(what, sizeof what, "%s kept vs recomputed (bits %s; out %s)", tag,
                     same ? "same" : "differ", out_same ? "same" : "DIFFERS");
            report3(what, &kept, &rec, tol, &p, b.G, o.key_len);
            const int f64 = ref_small(&p.s, p.m, k);
            if (cpu_grads(&ref, &p, b.G, &o, &f, f64)) {
                snprintf(what, sizeof what, "%s kept vs CPU %s", tag, f64 ? "f64" : "f32");
                report3(what, &kept, &ref, tol, &p, b.G, o.key_len);
            }
            /* arguments that are not the saved's */
            if (di == 0 || causal == 1) test_saved_mismatch(&b, &p, &o, &f, sv);
            /* filled again from other queries: the backward serves the new ones */
            fill_normal(p.Q, p.nq, 1, seed_, draws_++);
            double lo, hi;
            norms_for(k, p.s.d, 0, &lo, &hi);
            set_row_norms(p.Q, p.nq / p.s.d, p.s.d, lo, hi);
            round_to(p.Q, p.nq, dt);
            upload(b.g.Q, p.Q, p.nq, dt);
            check_ok(
                pf_cuda_favor_save(ctx_, b.g.out, b.g.Q, b.g.K, b.g.V, dt, &p.s, &o, &fd, sv, 0),
                "c. pf_cuda_favor_save again");
            check_ok(bdev_run(&b, &kept, &o, &f, sv, 0), "c. backward, kept again");
            check_ok(bdev_run(&b, &rec, &o, &f, NULL, stream_), "c. backward, recomputed again");
            snprintf(what, sizeof what, "%s filled again by new Q: kept vs recomputed", tag);
            report3(what, &kept, &rec, tol, &p, b.G, o.key_len);
            /* a save that fails (NaN in Q) leaves it empty */
            const float keep = p.Q[5];
            p.Q[5] = NAN;
            upload(b.g.Q, p.Q, p.nq, dt);
            st = pf_cuda_favor_save(ctx_, b.g.out, b.g.Q, b.g.K, b.g.V, dt, &p.s, &o, &fd, sv, 0);
            CHECK(st == PF_ENONFINITE, "%s: a save with NaN in Q: %s", tag, pf_status_str(st));
            p.Q[5] = keep;
            upload(b.g.Q, p.Q, p.nq, dt);
            refused_saved(&b, &p.s, dt, &o, &fd, sv, "whose save failed");
            pf_cuda_favor_saved_free(sv);
            free(plain);
            grads_free(&kept);
            grads_free(&rec);
            grads_free(&ref);
            bdev_free(&b);
            problem_free(&p);
        }
    }
    pf_cuda_favor_saved_free(NULL);
    CHECK(pf_cuda_favor_saved_bytes(NULL) == 0, "pf_cuda_favor_saved_bytes(NULL)");
}

/* ---- d. strict causality --------------------------------------------------------------------- */

/* The normwise error of rows [r0, L) of every head of a (H,L,w) tensor (dtype dt, raw bytes),
 * against the same rows of base, and whether their bytes are the same. */
static double rows_err(const unsigned char *got, const unsigned char *base, int H, int L, int w,
                       int r0, pf_cuda_dtype dt, int *same) {
    const size_t es = esize(dt), n = (size_t)(L - r0) * w;
    float *a = xmalloc(sizeof(float) * n), *b = xmalloc(sizeof(float) * n);
    double num = 0, den = 0;
    *same = 1;
    for (int h = 0; h < H; h++) {
        const size_t off = ((size_t)h * L + r0) * w * es;
        decode(a, got + off, n, dt);
        decode(b, base + off, n, dt);
        *same &= memcmp(got + off, base + off, n * es) == 0;
        for (size_t i = 0; i < n; i++) {
            if (!isfinite(a[i])) num = INFINITY;
            num = fmax(num, fabs((double)a[i] - (double)b[i]));
            den = fmax(den, fabs((double)b[i]));
        }
    }
    free(a);
    free(b);
    return den > 0 ? num / den : num;
}

static void test_causality(void) {
    const int B = 1, H = 2, L = 300, d = 16, dv = 8, m = 32;
    static const struct {
        int chunk, t; /* chunk 0 is 128: t = 40 inside the first, 127 its end, 128 the next */
    } full[] = {{0, 0}, {0, 40}, {0, 127}, {0, 128}, {0, 200}, {16, 40}, {16, 47}, {16, 48}},
      small[] = {{0, 40}, {0, 127}, {16, 47}};
    const int ncuts = quick_ ? 3 : (int)(sizeof full / sizeof full[0]);
    static const pf_cuda_dtype dts[3] = {PF_CUDA_F32, PF_CUDA_BF16, PF_CUDA_F16};
    /* later rows of a half gradient may round to a neighbouring value: two units in the last
     * place of the dtype at 1 (bfloat16's is 2^-7, float16's 2^-10), normwise */
    const double later_tol[3] = {TOL_LATER, 0x1p-6, 0x1p-9};
    printf("d. strict causality: later keys, values and dout leave dQ's rows 0..t as they were; "
           "earlier queries and dout leave dK's and dV's rows t.. (to rounding)\n");
    for (int di = 0; di < 3; di++) {
        const pf_cuda_dtype dt = dts[di];
        for (int k = 0; k < 4; k++) {
            /* --quick: every map in float32, two in each half dtype */
            if (quick_ && di > 0 && (k + di) % 2) continue;
            const dims c = {B, H, L, L, d, dv, m};
            problem p = problem_for(&c, (pf_kernel)k, 1, 0);
            problem_round(&p, dt);
            bdev b = bdev_make(&p, dt);
            float *Q2 = xmalloc(sizeof(float) * p.nq), *K2 = xmalloc(sizeof(float) * p.nk),
                  *V2 = xmalloc(sizeof(float) * p.nv), *G2 = xmalloc(sizeof(float) * p.no);
            unsigned char *base[3];
            for (int t = 0; t < 3; t++) base[t] = xmalloc(b.bytes[t]);
            pf_favor_opts f = favor_of(&p, (pf_kernel)k, 1);
            pf_attn_opts o = pf_attn_opts_default();
            o.causal = 1;
            double lo, hi;
            norms_for((pf_kernel)k, d, 0, &lo, &hi);
            const size_t es = esize(dt);
            int same = 0, tried = 0, later_same = 0, later_tried = 0, chunk = -1;
            double later_worst = 0;
            for (int ci = 0; ci < ncuts; ci++) {
                const int t = quick_ ? small[ci].t : full[ci].t;
                const int cc = quick_ ? small[ci].chunk : full[ci].chunk;
                if (cc != chunk) {
                    chunk = f.chunk = cc;
                    if (!check_ok(bdev_run(&b, NULL, &o, &f, NULL, 0), "d. the first run")) break;
                    for (int g = 0; g < 3; g++) memcpy(base[g], b.raw[g], b.bytes[g]);
                }
                /* keys and values after t, and dout's rows after t */
                memcpy(K2, p.K, sizeof(float) * p.nk);
                memcpy(V2, p.V, sizeof(float) * p.nv);
                memcpy(G2, b.G, sizeof(float) * p.no);
                const size_t rest = (size_t)(L - t - 1);
                for (int h = 0; h < H; h++) {
                    float *Kh = K2 + (size_t)h * L * d, *Vh = V2 + (size_t)h * L * dv;
                    float *Gh = G2 + (size_t)h * L * dv;
                    fill_normal(Kh + (size_t)(t + 1) * d, rest * d, 1, seed_, draws_++);
                    set_row_norms(Kh + (size_t)(t + 1) * d, rest, d, 3 * hi, 3 * hi);
                    for (size_t e = (size_t)(t + 1) * dv; e < (size_t)L * dv; e++) Vh[e] *= 10.0f;
                    fill_normal(Gh + (size_t)(t + 1) * dv, rest * dv, 10, seed_, draws_++);
                }
                round_to(K2, p.nk, dt);
                round_to(V2, p.nv, dt);
                round_to(G2, p.no, dt);
                upload(b.g.K, K2, p.nk, dt);
                upload(b.g.V, V2, p.nv, dt);
                upload(b.dG, G2, p.no, dt);
                pf_status st = bdev_run(&b, NULL, &o, &f, NULL, pick_stream(ci));
                CHECK(st == PF_OK, "d. %s %s t=%d, later inputs changed: %s (%s)", dt_name(dt),
                      pf_kernel_name((pf_kernel)k), t, pf_status_str(st), pf_cuda_last_error());
                for (int h = 0; h < H; h++) {
                    const size_t off = (size_t)h * L * d * es, len = (size_t)(t + 1) * d * es;
                    const int ok = memcmp(base[0] + off, b.raw[0] + off, len) == 0;
                    CHECK(ok, "d. %s %s chunk %d: dQ rows 0..%d of head %d changed by later inputs",
                          dt_name(dt), pf_kernel_name((pf_kernel)k), chunk, t, h);
                    same += ok;
                    tried++;
                }
                upload(b.g.K, p.K, p.nk, dt);
                upload(b.g.V, p.V, p.nv, dt);
                upload(b.dG, b.G, p.no, dt);
                if (t == 0) continue;
                /* queries and dout's rows before t */
                memcpy(Q2, p.Q, sizeof(float) * p.nq);
                memcpy(G2, b.G, sizeof(float) * p.no);
                for (int h = 0; h < H; h++) {
                    float *Qh = Q2 + (size_t)h * L * d, *Gh = G2 + (size_t)h * L * dv;
                    fill_normal(Qh, (size_t)t * d, 1, seed_, draws_++);
                    set_row_norms(Qh, (size_t)t, d, lo, hi);
                    fill_normal(Gh, (size_t)t * dv, 1, seed_, draws_++);
                }
                round_to(Q2, p.nq, dt);
                round_to(G2, p.no, dt);
                upload(b.g.Q, Q2, p.nq, dt);
                upload(b.dG, G2, p.no, dt);
                st = bdev_run(&b, NULL, &o, &f, NULL, pick_stream(ci + 1));
                CHECK(st == PF_OK, "d. %s %s t=%d, earlier inputs changed: %s (%s)", dt_name(dt),
                      pf_kernel_name((pf_kernel)k), t, pf_status_str(st), pf_cuda_last_error());
                for (int g = 1; g < 3; g++) {
                    int bits;
                    const double e =
                        rows_err(b.raw[g], base[g], H, L, g == 1 ? d : dv, t, dt, &bits);
                    CHECK(e <= later_tol[di],
                          "d. %s %s chunk %d: %s rows %d.. moved by %.3g (normwise) when rows "
                          "before %d changed",
                          dt_name(dt), pf_kernel_name((pf_kernel)k), chunk, GNAME[g], t, e, t);
                    later_worst = fmax(later_worst, e);
                    later_same += bits;
                    later_tried++;
                }
                upload(b.g.Q, p.Q, p.nq, dt);
                upload(b.dG, b.G, p.no, dt);
            }
            printf("  d. %-4s %-10s dQ: %d of %d (cut, head) pairs keep their bits; dK, dV rows "
                   "t..: %d of %d keep their bits, moved at most %.2e (tol %.1e)\n",
                   dt_name(dt), pf_kernel_name((pf_kernel)k), same, tried, later_same, later_tried,
                   later_worst, later_tol[di]);
            free(Q2);
            free(K2);
            free(V2);
            free(G2);
            for (int g = 0; g < 3; g++) free(base[g]);
            bdev_free(&b);
            problem_free(&p);
        }
    }
}

/* ---- e. padding ------------------------------------------------------------------------------ */

static void test_padding(void) {
    const int B = 2, H = 3, Lq = 129, Lk = 300, d = 24, dv = 40, m = 32;
    /* bidirectional, host: all and 137, device: 211 and 1; causal (Lq = Lk = 129), host: all
     * and 100, device: 57 and 1 */
    static const int32_t lens[2][2][2] = {{{Lk, 137}, {211, 1}}, {{Lq, 100}, {57, 1}}};
    int32_t *dlen = dmalloc(sizeof(int32_t) * B);
    printf("e. padding: key_len in host and device memory\n");
    for (int k = 0; k < 4; k++) {
        const int wph = k % 2;
        for (int causal = 0; causal < 2; causal++) {
            const dims c = {B, H, Lq, causal ? Lq : Lk, d, dv, m};
            problem p = problem_for(&c, (pf_kernel)k, wph, 0);
            bdev b = bdev_make(&p, PF_CUDA_F32);
            grads got = grads_make(&p), ref = grads_make(&p), ref64 = grads_make(&p);
            pf_favor_opts f = favor_of(&p, (pf_kernel)k, wph);
            const int f64 = ref_small(&p.s, p.m, (pf_kernel)k);
            for (int where = 0; where < 2; where++) {
                int32_t hl[2] = {lens[causal][where][0], lens[causal][where][1]};
                if (where) h2d(dlen, hl, sizeof hl);
                pf_attn_opts o = pf_attn_opts_default();
                o.causal = causal;
                o.key_len = where ? dlen : hl;
                char what[200];
                snprintf(what, sizeof what, "e. %s %s key_len {%d, %d} in %s memory, vs CPU f32",
                         pf_kernel_name((pf_kernel)k), causal ? "causal" : "bidir", hl[0], hl[1],
                         where ? "device" : "host");
                if (!check_ok(bdev_run(&b, &got, &o, &f, NULL, pick_stream(where)), what)) continue;
                pf_attn_opts oc = o;
                oc.key_len = hl;
                if (cpu_grads(&ref, &p, b.G, &oc, &f, 0))
                    report3(what, &got, &ref, TOL_F32, &p, b.G, hl);
                if (f64 && cpu_grads(&ref64, &p, b.G, &oc, &f, 1)) {
                    what[strlen(what) - 3] = '\0';
                    append(what, sizeof what, "f64");
                    report3(what, &got, &ref64, TOL_F32, &p, b.G, hl);
                }
                /* the padded keys' rows: exactly zero */
                size_t nonzero = 0;
                const pf_shape *s = &p.s;
                for (int bb = 0; bb < B; bb++)
                    for (int h = 0; h < H; h++)
                        for (int j = hl[bb]; j < s->Lk; j++) {
                            const size_t row = ((size_t)bb * H + h) * s->Lk + j;
                            for (int e = 0; e < d; e++) nonzero += got.t[1][row * d + e] != 0.0f;
                            for (int e = 0; e < dv; e++) nonzero += got.t[2][row * dv + e] != 0.0f;
                        }
                CHECK(nonzero == 0, "%s: %zu elements of padded keys' dK, dV rows not zero", what,
                      nonzero);
            }
            grads_free(&got);
            grads_free(&ref);
            grads_free(&ref64);
            bdev_free(&b);
            problem_free(&p);
        }
    }
    CU(cudaFree(dlen));
}

/* ---- f. long --------------------------------------------------------------------------------- */

static void test_long(void) {
    const int B = 1, H = 2, L = quick_ ? 8192 : 65536, d = 64, dv = 64, m = 256;
    const pf_cuda_dtype dt = PF_CUDA_BF16;
    printf("f. L = %d, bf16, against pf_attn_favor_backward (float32) on the rounded inputs\n", L);
    const dims c = {B, H, L, L, d, dv, m};
    problem p = problem_for(&c, PF_KERNEL_POSITIVE, 1, 0);
    problem_round(&p, dt);
    bdev b = bdev_make(&p, dt);
    grads got = grads_make(&p), ref = grads_make(&p);
    pf_favor_opts f = favor_of(&p, PF_KERNEL_POSITIVE, 1);
    for (int causal = 0; causal < 2; causal++) {
        pf_attn_opts o = pf_attn_opts_default();
        o.causal = causal;
        /* the workspace: per head linear in L */
        const pf_favor_opts fd = on_device(&b, &f);
        size_t ph[2] = {0, 0}, fx = 0, kept = 0;
        for (int i = 0; i < 2; i++) {
            const pf_shape s = {B, H, L << i, L << i, d, dv};
            check_ok(pf_cuda_favor_backward_workspace(&ph[i], &fx, dt, &s, &o, &fd),
                     "pf_cuda_favor_backward_workspace");
        }
        check_ok(pf_cuda_favor_saved_size(&kept, dt, &p.s, &o, &fd), "pf_cuda_favor_saved_size");
        const double ratio = ph[0] ? (double)ph[1] / (double)ph[0] : INFINITY;
        printf("  f. backward workspace %s bf16 d64 m256: per head %zu bytes at L = %d, %zu at "
               "2L (ratio %.3f), fixed %zu; a saved holds %zu\n",
               causal ? "causal" : "bidir", ph[0], L, ph[1], ratio, fx, kept);
        CHECK(ph[0] > 0 && ratio <= 2.1, "f. per-head workspace not linear in L: %zu, %zu", ph[0],
              ph[1]);
        const double t0 = now_s();
        if (!cpu_grads(&ref, &p, b.G, &o, &f, 0)) continue;
        const double t1 = now_s();
        char what[200];
        describe(what, sizeof what, "f.", dt, PF_KERNEL_POSITIVE, &p.s, m, causal, 1, 0, 0);
        pf_status st = bdev_run(&b, &got, &o, &f, NULL, pick_stream(causal));
        const double t2 = now_s();
        if (!check_ok(st, what)) continue;
        size_t nonfinite, nonzero;
        count_grads(&got, &nonfinite, &nonzero);
        CHECK(nonfinite == 0, "%s: %zu gradients not finite", what, nonfinite);
        report3(what, &got, &ref, TOL_HALF, &p, b.G, NULL);
        printf("    (2-norm relative errors dQ %.2e dK %.2e dV %.2e; CPU %.2f s, GPU call "
               "%.3f s)\n",
               rel_err(got.t[0], ref.t[0], got.n[0]), rel_err(got.t[1], ref.t[1], got.n[1]),
               rel_err(got.t[2], ref.t[2], got.n[2]), t1 - t0, t2 - t1);
    }
    grads_free(&got);
    grads_free(&ref);
    bdev_free(&b);
    problem_free(&p);
}

/* ---- g. refused arguments, non-finite inputs, zero denominators ------------------------------ */

/* The backward with the given pointers (b's where NULL is not meant): a call that must fail. */
#define BWD(dq, dk, dv_, g, q, k, v, dt, s, o, f, sv)                                              \
    pf_cuda_favor_backward(ctx_, dq, dk, dv_, g, q, k, v, dt, s, o, f, sv, 0)

static void test_errors(void) {
    const int B = 2, H = 2, L = 20, d = 8, dv = 8, m = 16;
    problem p = problem_make(B, H, L, L, d, dv, m, H, 0.5, 2.0, 1);
    bdev b = bdev_make(&p, PF_CUDA_F32);
    const pf_cuda_dtype F32 = PF_CUDA_F32;
    const pf_shape s = p.s;
    pf_attn_opts o = pf_attn_opts_default();
    pf_favor_opts fh = favor_of(&p, PF_KERNEL_POSITIVE, 1);
    const pf_favor_opts f = on_device(&b, &fh);
    void *dQ = b.d[0], *dK = b.d[1], *dV = b.d[2], *G = b.dG, *Q = b.g.Q, *K = b.g.K, *V = b.g.V;
    printf("g. refused arguments: status and pf_cuda_last_error()\n");
    void *hQ = xmalloc(b.g.bq), *hK = xmalloc(b.g.bk), *hV = xmalloc(b.g.bv), *hG = xmalloc(b.g.bo);
    memcpy(hQ, p.Q, b.g.bq);
    memcpy(hK, p.K, b.g.bk);
    memcpy(hV, p.V, b.g.bv);
    memcpy(hG, b.G, b.g.bo);
    bdev_poison(&b);
    /* NULLs */
    EXPECT_FAIL(pf_cuda_favor_backward(NULL, dQ, dK, dV, G, Q, K, V, F32, &s, &o, &f, NULL, 0),
                PF_EINVAL);
    EXPECT_FAIL(BWD(NULL, dK, dV, G, Q, K, V, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, NULL, dV, G, Q, K, V, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, dK, NULL, G, Q, K, V, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, dK, dV, NULL, Q, K, V, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, dK, dV, G, NULL, K, V, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, NULL, V, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, NULL, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, NULL, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &s, NULL, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &s, &o, NULL, NULL), PF_EINVAL);
    pf_favor_opts fb = f;
    fb.W = NULL;
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &s, &o, &fb, NULL), PF_EINVAL);
    /* host memory where device memory is needed */
    float *hdQ = xmalloc(b.bytes[0]), *hdK = xmalloc(b.bytes[1]), *hdV = xmalloc(b.bytes[2]);
    EXPECT_FAIL(BWD(hdQ, dK, dV, G, Q, K, V, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, hdK, dV, G, Q, K, V, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, dK, hdV, G, Q, K, V, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, dK, dV, hG, Q, K, V, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, dK, dV, G, hQ, K, V, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, hK, V, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, hV, F32, &s, &o, &f, NULL), PF_EINVAL);
    fb = f;
    fb.W = p.W;
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &s, &o, &fb, NULL), PF_EINVAL);
    /* shapes */
    const pf_shape empty[6] = {{0, H, L, L, d, dv}, {B, 0, L, L, d, dv}, {B, H, 0, L, d, dv},
                               {B, H, L, 0, d, dv}, {B, H, L, L, 0, dv}, {B, H, L, L, d, 0}};
    for (int i = 0; i < 6; i++)
        EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &empty[i], &o, &f, NULL), PF_EINVAL);
    pf_shape sb = s;
    sb.H = -1;
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &sb, &o, &f, NULL), PF_EINVAL);
    sb = s;
    sb.Lk = L / 2; /* fits the buffers; causal needs Lq == Lk */
    pf_attn_opts ob = o;
    ob.causal = 1;
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &sb, &ob, &f, NULL), PF_EINVAL);
    /* dtype, scale, m, the map's options */
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, (pf_cuda_dtype)7, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, (pf_cuda_dtype)-1, &s, &o, &f, NULL), PF_EINVAL);
    ob = o;
    ob.scale = -1;
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &s, &ob, &f, NULL), PF_EINVAL);
    ob.scale = NAN;
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &s, &ob, &f, NULL), PF_EINVAL);
    fb = f;
    fb.m = 0;
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &s, &o, &fb, NULL), PF_EINVAL);
    fb.m = -4;
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &s, &o, &fb, NULL), PF_EINVAL);
    fb = f;
    fb.eps = -1e-3f;
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &s, &o, &fb, NULL), PF_EINVAL);
    fb = f;
    fb.chunk = -1;
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &s, &o, &fb, NULL), PF_EINVAL);
    fb = f;
    fb.w_per_head = 2;
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &s, &o, &fb, NULL), PF_EINVAL);
    fb = f;
    fb.kernel = (pf_kernel)7;
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &s, &o, &fb, NULL), PF_EINVAL);
    fb.kernel = PF_KERNEL_OPRF;
    fb.oprf_a_given = 1;
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &s, &o, &fb, NULL), PF_ENOTSUP);
    fb.kernel = PF_KERNEL_SDERF;
    EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &s, &o, &fb, NULL), PF_ENOTSUP);
    /* key lengths out of [1, Lk], in host and in device memory */
    int32_t *dl = dmalloc(sizeof(int32_t) * B);
    static const int32_t badlen[2][2] = {{20, 0}, {20, 21}};
    for (int i = 0; i < 2; i++) {
        ob = o;
        ob.key_len = badlen[i];
        EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &s, &ob, &f, NULL), PF_EINVAL);
        h2d(dl, badlen[i], sizeof(int32_t) * B);
        ob.key_len = dl;
        EXPECT_FAIL(BWD(dQ, dK, dV, G, Q, K, V, F32, &s, &ob, &f, NULL), PF_EINVAL);
    }
    /* outputs overlapping inputs, or each other (d = dv here, so dK and dV have one size) */
    unsigned char *both = dmalloc(b.g.bq + b.bytes[0]);
    h2d(both, p.Q, b.g.bq);
    EXPECT_FAIL(BWD(both + b.g.bq / 2, dK, dV, G, both, K, V, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, K, dV, G, Q, K, V, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, dK, V, G, Q, K, V, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(G, dK, dV, G, Q, K, V, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, dK, dK, G, Q, K, V, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(BWD(dQ, dQ, dV, G, Q, K, V, F32, &s, &o, &f, NULL), PF_EINVAL);
    EXPECT_FAIL(
        BWD(dQ, dK, (unsigned char *)dQ + b.bytes[0] / 2, G, Q, K, V, F32, &s, &o, &f, NULL),
        PF_EINVAL);
    CU(cudaFree(both));
    /* an output over W: W (H,m,d) floats, then room for dQ after its middle */
    const size_t bw = sizeof(float) * p.nw;
    unsigned char *wq = dmalloc(bw + b.bytes[0]);
    h2d(wq, p.W, bw);
    fb = f;
    fb.W = (const float *)wq;
    EXPECT_FAIL(BWD(wq + bw / 2, dK, dV, G, Q, K, V, F32, &s, &o, &fb, NULL), PF_EINVAL);
    CU(cudaFree(wq));
    /* the inputs are intact after all this */
    upload(K, p.K, p.nk, F32);
    upload(V, p.V, p.nv, F32);
    upload(G, b.G, p.no, F32);
    /* none of those wrote into the gradients */
    CHECK(bdev_untouched(&b), "g. a refused call wrote into the gradients");
    /* the workspace, the saved's functions */
    size_t ph = 0, fx = 0;
    EXPECT_FAIL(pf_cuda_favor_backward_workspace(&ph, &fx, (pf_cuda_dtype)7, &s, &o, &f),
                PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor_backward_workspace(&ph, &fx, F32, NULL, &o, &f), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor_backward_workspace(&ph, &fx, F32, &empty[2], &o, &f), PF_EINVAL);
    ob = o;
    ob.causal = 1;
    EXPECT_FAIL(pf_cuda_favor_backward_workspace(&ph, &fx, F32, &sb, &ob, &f), PF_EINVAL);
    fb = f;
    fb.kernel = PF_KERNEL_OPRF;
    fb.oprf_a_given = 1;
    EXPECT_FAIL(pf_cuda_favor_backward_workspace(&ph, &fx, F32, &s, &o, &fb), PF_ENOTSUP);
    check_ok(pf_cuda_favor_backward_workspace(NULL, NULL, F32, &s, &o, &f),
             "pf_cuda_favor_backward_workspace(NULL, NULL, ...)");
    pf_cuda_favor_saved *sv = NULL;
    size_t bytes = 0;
    EXPECT_FAIL(pf_cuda_favor_saved_size(&bytes, (pf_cuda_dtype)7, &s, &o, &f), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor_saved_size(&bytes, F32, &s, &o, &fb), PF_ENOTSUP);
    EXPECT_FAIL(pf_cuda_favor_saved_create(NULL, ctx_, F32, &s, &o, &f), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor_saved_create(&sv, NULL, F32, &s, &o, &f), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor_saved_create(&sv, ctx_, (pf_cuda_dtype)7, &s, &o, &f), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor_saved_create(&sv, ctx_, F32, &empty[0], &o, &f), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor_saved_create(&sv, ctx_, F32, &s, &o, &fb), PF_ENOTSUP);
    poison(b.g.out, b.g.bo);
    EXPECT_FAIL(pf_cuda_favor_save(ctx_, b.g.out, Q, K, V, F32, &s, &o, &f, NULL, 0), PF_EINVAL);
    d2h(b.g.raw, b.g.out, b.g.bo);
    CHECK(all_bytes(b.g.raw, b.g.bo, 0xFF), "g. a save refused for a NULL saved wrote into out");

    /* NaN and Inf: PF_ENONFINITE, zero gradients, no NaN */
    printf("g. non-finite inputs and zero denominators\n");
    static const pf_cuda_dtype dts[2] = {PF_CUDA_F32, PF_CUDA_F16};
    static const char *const where[5] = {"dout", "Q", "K", "V", "W"};
    const size_t at[5] = {
        (((size_t)1 * H + 0) * L + 3) * dv + 2,                         /* dout: b 1, h 0, row 3 */
        (((size_t)1 * H + 1) * L + 7) * d + 3,                          /* Q: b 1, h 1, row 7 */
        (((size_t)0 * H + 1) * L + 12) * d,                             /* K: b 0, h 1, row 12 */
        (((size_t)1 * H + 0) * L + 0) * dv + dv - 1, (size_t)m * d + 5, /* W: head 1's block */
    };
    for (int di = 0; di < 2; di++) {
        const pf_cuda_dtype dt = dts[di];
        bdev bd = bdev_make(&p, dt);
        grads got = grads_make(&p);
        for (int causal = 0; causal < 2; causal++) {
            pf_attn_opts on = o;
            on.causal = causal;
            for (int w = 0; w < 5; w++) {
                float *x = w == 0 ? bd.G : w == 1 ? p.Q : w == 2 ? p.K : w == 3 ? p.V : p.W;
                void *dx = w == 0   ? bd.dG
                           : w == 1 ? bd.g.Q
                           : w == 2 ? bd.g.K
                           : w == 3 ? bd.g.V
                                    : bd.g.W;
                const size_t n = w == 0   ? p.no
                                 : w == 1 ? p.nq
                                 : w == 2 ? p.nk
                                 : w == 3 ? p.nv
                                          : p.nw;
                const pf_cuda_dtype xt = w == 4 ? PF_CUDA_F32 : dt;
                const float keep = x[at[w]];
                x[at[w]] = w == 2 ? INFINITY : NAN;
                upload(dx, x, n, xt);
                pf_status r = bdev_run(&bd, &got, &on, &fh, NULL, pick_stream(w));
                char what[160];
                snprintf(what, sizeof what, "g. %s %s %s in %s", dt_name(dt),
                         causal ? "causal" : "bidir", w == 2 ? "Inf" : "NaN", where[w]);
                CHECK(r == PF_ENONFINITE, "%s: %s (%s)", what, pf_status_str(r),
                      pf_cuda_last_error());
                size_t nonfinite, nonzero;
                count_grads(&got, &nonfinite, &nonzero);
                CHECK(nonfinite == 0 && nonzero == 0, "%s: %zu gradients not finite, %zu not zero",
                      what, nonfinite, nonzero);
                printf("    %-40s %s, %zu non-finite, %zu nonzero gradients\n", what,
                       pf_status_str(r), nonfinite, nonzero);
                x[at[w]] = keep;
                upload(dx, x, n, xt);
            }
            /* relu with eps 0 and every key zero: relu(0) = 0, every denominator 0 */
            float *zeros = calloc(p.nk, sizeof(float));
            upload(bd.g.K, zeros, p.nk, dt);
            pf_favor_opts fz = fh;
            fz.kernel = PF_KERNEL_RELU;
            fz.eps = 0;
            pf_status r = bdev_run(&bd, &got, &on, &fz, NULL, 0);
            char what[160];
            snprintf(what, sizeof what, "g. %s %s relu eps 0, keys all zero", dt_name(dt),
                     causal ? "causal" : "bidir");
            CHECK(r == PF_EDOMAIN, "%s: %s (%s)", what, pf_status_str(r), pf_cuda_last_error());
            size_t nonfinite, nonzero;
            count_grads(&got, &nonfinite, &nonzero);
            CHECK(nonfinite == 0 && nonzero == 0, "%s: %zu gradients not finite, %zu not zero",
                  what, nonfinite, nonzero);
            printf("    %-40s %s, %zu non-finite, %zu nonzero gradients\n", what, pf_status_str(r),
                   nonfinite, nonzero);
            /* eps > 0: the features are positive again */
            fz.eps = 1e-3f;
            check_ok(bdev_run(&bd, NULL, &on, &fz, NULL, 0), "g. relu eps 1e-3, keys all zero");
            upload(bd.g.K, p.K, p.nk, dt);
            free(zeros);
        }
        grads_free(&got);
        bdev_free(&bd);
    }
    free(hQ);
    free(hK);
    free(hV);
    free(hG);
    free(hdQ);
    free(hdK);
    free(hdV);
    CU(cudaFree(dl));
    bdev_free(&b);
    problem_free(&p);
}

/* ---- h. workspace limit ---------------------------------------------------------------------- */

static void test_workspace(void) {
    const dims c = {2, 3, quick_ ? 300 : 1000, quick_ ? 300 : 1000, 64, 40, 256};
    static const pf_cuda_dtype dts[2] = {PF_CUDA_F32, PF_CUDA_BF16};
    printf("h. a workspace limit of 1 byte (one head at a time) against the default\n");
    for (int di = 0; di < 2; di++) {
        const pf_cuda_dtype dt = dts[di];
        problem p = problem_for(&c, PF_KERNEL_POSITIVE, 1, 0);
        problem_round(&p, dt);
        bdev b = bdev_make(&p, dt);
        grads a = grads_make(&p), one = grads_make(&p), ref = grads_make(&p);
        pf_favor_opts f = favor_of(&p, PF_KERNEL_POSITIVE, 1);
        const pf_favor_opts fd = on_device(&b, &f);
        for (int causal = 0; causal < 2; causal++) {
            pf_attn_opts o = pf_attn_opts_default();
            o.causal = causal;
            pf_cuda_favor_saved *sv = NULL;
            if (!check_ok(pf_cuda_favor_saved_create(&sv, ctx_, dt, &p.s, &o, &fd),
                          "h. pf_cuda_favor_saved_create"))
                continue;
            check_ok(pf_cuda_ctx_set_workspace_limit(ctx_, (size_t)1 << 30),
                     "workspace limit 1 GiB");
            pf_cuda_ctx_trim(ctx_);
            check_ok(
                pf_cuda_favor_save(ctx_, b.g.out, b.g.Q, b.g.K, b.g.V, dt, &p.s, &o, &fd, sv, 0),
                "h. pf_cuda_favor_save");
            const double tol = tol_of(dt);
            cpu_grads(&ref, &p, b.G, &o, &f, 0);
            for (int kept = 0; kept < 2; kept++) {
                const pf_cuda_favor_saved *use = kept ? sv : NULL;
                check_ok(pf_cuda_ctx_set_workspace_limit(ctx_, (size_t)1 << 30),
                         "workspace limit 1 GiB");
                check_ok(bdev_run(&b, &a, &o, &f, use, 0), "h. default limit");
                unsigned char *bits[3];
                raw_keep(bits, &b);
                const size_t held_default = pf_cuda_ctx_bytes(ctx_);
                pf_cuda_ctx_trim(ctx_);
                check_ok(pf_cuda_ctx_set_workspace_limit(ctx_, 1), "workspace limit 1");
                check_ok(bdev_run(&b, &one, &o, &f, use, stream_), "h. limit 1 byte");
                const size_t held_one = pf_cuda_ctx_bytes(ctx_);
                const int same = raw_same(bits, &b);
                raw_free(bits);
                char what[200];
                snprintf(what, sizeof what,
                         "h. %s %s B2 H3 L%d %s: limit 1 byte vs default (bits %s)", dt_name(dt),
                         causal ? "causal" : "bidir", c.Lq, kept ? "kept" : "recomputed",
                         same ? "same" : "differ");
                report3(what, &one, &a, tol, &p, b.G, NULL);
                snprintf(what, sizeof what, "h. %s %s B2 H3 L%d %s: limit 1 byte vs the CPU",
                         dt_name(dt), causal ? "causal" : "bidir", c.Lq,
                         kept ? "kept" : "recomputed");
                report3(what, &one, &ref, tol, &p, b.G, NULL);
                printf("    context bytes: %zu after the default run, %zu after the limited run\n",
                       held_default, held_one);
                /* recomputed, each head's rows dominate the workspace */
                CHECK(kept || held_one < held_default,
                      "h. one head at a time held %zu bytes, all at once %zu", held_one,
                      held_default);
            }
            pf_cuda_favor_saved_free(sv);
        }
        check_ok(pf_cuda_ctx_set_workspace_limit(ctx_, (size_t)1 << 30), "workspace limit 1 GiB");
        grads_free(&a);
        grads_free(&one);
        grads_free(&ref);
        bdev_free(&b);
        problem_free(&p);
    }
}

/* ---- main ------------------------------------------------------------------------------------ */

/* What is checked before any GPU is touched (so these run everywhere): the backward's
 * workspace for valid and refused arguments (W is not read, NULL is fine); a NULL context. */
static void test_host_checks(void) {
    pf_shape s = {1, 2, 1000, 1000, 64, 64};
    pf_attn_opts o = pf_attn_opts_default();
    pf_favor_opts f = pf_favor_opts_default();
    f.m = 256;
    size_t per = 0, fixed = 0;
    for (int causal = 0; causal < 2; causal++) {
        o.causal = causal;
        CHECK_STATUS(pf_cuda_favor_backward_workspace(&per, &fixed, PF_CUDA_BF16, &s, &o, &f),
                     PF_OK);
        CHECK(per > 0, "backward workspace (causal %d): per head %zu, fixed %zu", causal, per,
              fixed);
    }
    CHECK_STATUS(pf_cuda_favor_backward_workspace(&per, NULL, (pf_cuda_dtype)7, &s, &o, &f),
                 PF_EINVAL);
    f.kernel = PF_KERNEL_OPRF;
    f.oprf_a_given = 1;
    CHECK_STATUS(pf_cuda_favor_backward_workspace(&per, NULL, PF_CUDA_F32, &s, &o, &f), PF_ENOTSUP);
    f.kernel = PF_KERNEL_POSITIVE;
    s.Lk = 500; /* causal needs Lq == Lk */
    CHECK_STATUS(pf_cuda_favor_backward_workspace(&per, NULL, PF_CUDA_F32, &s, &o, &f), PF_EINVAL);
    s.Lk = 1000;
    CHECK_STATUS(pf_cuda_favor_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, PF_CUDA_F32,
                                        &s, &o, &f, NULL, 0),
                 PF_EINVAL);
    CHECK(pf_cuda_last_error()[0] != '\0', "a refused call says why");
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* each case's line beside the FAILs it caused */
    static const char names[] = "abcdefgh";
    const char *only;
    const int rc = cuda_test_args(argc, argv, names, &only);
    if (rc >= 0) return rc;
    test_host_checks();
    if (pf_cuda_device_count() == 0) {
        printf("test_cuda_backward: skipped: no GPU (%s); the host-side checks: %d, %d failed\n",
               pf_cuda_last_error(), check_count_, check_failed_);
        return check_failed_ ? 1 : 0;
    }
    if (cuda_test_seed("test_cuda_backward") != 0) return 2;
    if (!check_ok(pf_cuda_ctx_create(&ctx_, 0), "pf_cuda_ctx_create")) TEST_MAIN_END();
    CU(cudaStreamCreate(&stream_));
    static void (*const cases[])(void) = {test_fp32,    test_half, test_saved,  test_causality,
                                          test_padding, test_long, test_errors, test_workspace};
    cuda_test_cases("test_cuda_backward", cases, names, only);
    CU(cudaStreamDestroy(stream_));
    pf_cuda_ctx_free(ctx_);
    TEST_MAIN_END();
}
