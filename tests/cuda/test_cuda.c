/* test_cuda.c: libperformer_cuda (include/performer_cuda.h) against the CPU library.
 *
 * Every GPU output is compared with the CPU library given the same W (the same floats, copied
 * to the device): pf_attn_favor (float32, itself checked against float64 in test_favor_forward.c) or
 * pf_attn_favor_ref (float64). The error is normwise, max|gpu - cpu| / max|cpu| over the whole
 * output (a NaN or Inf in the GPU's output counts as infinite), and every case prints a line
 * with it, so that the log of a GPU run shows the figures.
 *
 * a. float32 (TF32 off, the default): every map (relu with eps 1e-3), bidirectional (Lq != Lk
 *    too) and causal, W shared and per head, B = 2 and H = 3, d = 16, 24, 64, 128, dv != d,
 *    m = 32, 256 and 266, L from 1 to 4099 (not multiples of the chunk), chunk 0 (128), 16
 *    and 1, scale 0 and 0.3; then TF32 on (within 1e-2) and off again.
 * b. bfloat16 and float16 inputs: Q, K, V rounded to the dtype on the host and the rounded
 *    values given to pf_attn_favor_ref (float64; pf_attn_favor at L = 4099, where float64 is
 *    slow: its own error, 1e-5, is nothing beside the tolerance); outputs in the dtype. Every
 *    map, bidirectional (Lq != Lk too) and causal, chunk 128 and 16, every other run padded.
 * c. Long and large: L = 65536 (8192 with --quick), B = 1, H = 2, d = 64, m = 256, causal and
 *    bidirectional, float16 and bfloat16, rows of q and k of norms 8..12 and values up to 100
 *    in size. This is where float16 implementations overflow: their features reach e^9 and
 *    more unstabilised (|x'|^2/2 is up to 9), so one key's feature times its value passes
 *    65504, float16's largest value, and the key sums over 65536 rows approach it (the line
 *    above the results prints both). The output must be finite and match pf_attn_favor
 *    (float32, on the same rounded inputs: float64 would take minutes here).
 * d. Strict causality: keys and values after position t replaced (keys of norm 50, values
 *    x100), t inside a chunk, at a chunk's end and in a later chunk: rows 0..t keep every
 *    bit (memcmp of the output bytes), every map and dtype.
 * e. Padding: bidirectional with key_len (host and device memory) equals the run on K and V
 *    cut to those lengths, and the CPU's; causal with key_len equals the CPU's.
 * f. Decoding: N = 5 sequences of H = 3 heads stepped with an active mask (sequences advance at
 *    different times, one pauses, one step passes NULL: all), some reset midway (a `which`
 *    array): every row equals the causal pf_cuda_favor pass and pf_attn_favor on that
 *    sequence's tokens since its last reset; rows of inactive sequences keep their bytes;
 *    positions agree. Some runs carry a NaN or Inf in one sequence's q, k or v at one step:
 *    PF_ENONFINITE, that sequence's row zero and its state unchanged (its later rows equal a
 *    reference that never saw the token, its position does not move), the others' rows right.
 * g. Every refused argument: the status, a non-empty pf_cuda_last_error(), out untouched;
 *    NaN/Inf inputs (PF_ENONFINITE) and a zero denominator (PF_EDOMAIN) leave no NaN in out.
 * h. The workspace: pf_cuda_favor_workspace is linear in L; a limit of 1 byte (one head at a
 *    time) gives the default's results; W rewritten in place between calls is read again;
 *    managed memory; K the same pointer as Q; the stage profile.
 *
 * Tolerances. float32, 1e-5: both sides compute in float32, summed in other orders, and each
 * is within ~2e-6 of float64 on these inputs (the CPU's, measured on the cases of a), which are
 * kept well conditioned: the positive, hyperbolic and relu features are positive, so every
 * denominator is a sum of positive terms; for trig, |x'| = |x| sqrt(scale) <= 0.25, so each
 * query-key estimate e^((|q'|^2 + |k'|^2)/2) (1/m) sum_f cos(w_f.(q' - k')) stays near its mean
 * e^(q'.k') > 0 and no denominator cancels (other maps: |x'| in 0.3..1.2).
 * Half precision, 1e-2 (the bound the GPU library promises against float64): the output's own
 * rounding is up to 2^-9 of an element in bfloat16 (2^-12 in float16); the products read
 * features, the chunk scores A' (which carry each key's weight) and states rounded to bfloat16,
 * each a relative 2^-9 more, and a key that dominates its row has the same rounding in the
 * numerator and the denominator; the projection of half inputs runs on TF32 (W to 2^-11). An
 * emulation of that arithmetic in numpy (the shapes of b, 30 seeds each) stayed under 7.3e-3 in
 * bfloat16 and 3e-3 in float16 (an H100 measured at most 5.1e-3). The large norms of c are held
 * to 1.5e-2, the bound this test states for them: their weights are peaked, so a row's output
 * is a few keys' values, whose weights in the numerator and in the denominator (the ones
 * column) are rounded apart in the key state, and the projection's TF32 rounding reaches the
 * exponent; an H100 measured 5e-3 to 8.7e-3 at L = 65536 and once 1.1e-2 at L = 8192. Decoding keeps its state in float32: its half rows
 * are held to 1e-2 against the CPU, and to twice that against the GPU's half-precision pass.
 * Where two GPU runs differ only in how many heads go at a time, cuBLAS may pick other kernels
 * for the other batch count, so the results are held to the dtype's tolerance and the line says
 * whether the bits were the same.
 *
 * Seeds: fresh each run (from the clock), printed, and taken from PF_TEST_SEED if set, so a
 * failure can be replayed (with the same --quick; --only LETTERS runs some of the cases, with
 * the inputs they have in a whole run). --quick: smaller sizes, every kind of case
 * (for compute-sanitizer's memcheck, 10-100x slower). Before every GPU call the output is filled
 * with 0xFF bytes (NaN in float32, bfloat16 and float16), so a row the GPU fails to write
 * shows. Without a GPU the program says so and passes. */
#include "cuda_check.h"

static const double TOL_F32 = 1e-5;    /* float32 against the CPU */
static const double TOL_BF16 = 1e-2;   /* bfloat16 against the CPU */
static const double TOL_F16 = 1e-2;    /* float16 against the CPU */
static const double LARGE = 1.5;       /* c (rows of norm 8..12): times the dtype's tolerance */
static const double TOL_DECODE = 1e-2; /* decoded half rows against the CPU */
static const double TOL_TF32 = 1e-2;   /* float32 with TF32 products ("about 1e-3") */

static double tol_of(pf_cuda_dtype dt) {
    return dt == PF_CUDA_F32 ? TOL_F32 : dt == PF_CUDA_BF16 ? TOL_BF16 : TOL_F16;
}

/* ---- 0. the converters ----------------------------------------------------------------------- */

static void test_converters(void) {
    int bad16 = 0, badbf = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        const uint16_t x = (uint16_t)i;
        float f = f16_to_f32(x);
        uint16_t y = f32_to_f16(f);
        bad16 += isnan(f) ? !((y & 0x7C00u) == 0x7C00u && (y & 0x3FFu)) : y != x;
        f = bf16_to_f32(x);
        y = f32_to_bf16(f);
        badbf += isnan(f) ? !((y & 0x7F80u) == 0x7F80u && (y & 0x7Fu)) : y != x;
    }
    CHECK(bad16 == 0, "%d float16 values do not survive float and back", bad16);
    CHECK(badbf == 0, "%d bfloat16 values do not survive float and back", badbf);
    /* rounding to nearest even, overflow, subnormals, signs */
    static const struct {
        float x;
        uint16_t f16, bf16;
    } known[] = {
        {1.0f, 0x3C00, 0x3F80},
        {-2.0f, 0xC000, 0xC000},
        {-0.0f, 0x8000, 0x8000},
        {1.0f + 0x1p-11f, 0x3C00, 0x3F80}, /* float16 tie: to even */
        {1.0f + 0x3p-11f, 0x3C02, 0x3F80}, /* float16 tie: to even (up) */
        {1.0f + 0x1p-8f, 0x3C04, 0x3F80},  /* bfloat16 tie: to even */
        {1.0f + 0x3p-8f, 0x3C0C, 0x3F82},  /* bfloat16 tie: to even (up) */
        {65504.0f, 0x7BFF, 0x4780},
        {65519.0f, 0x7BFF, 0x4780},
        {65520.0f, 0x7C00, 0x4780}, /* float16 overflow: Inf */
        {0x1p-24f, 0x0001, 0x3380},
        {0x1p-25f, 0x0000, 0x3300}, /* tie with 0: to even */
        {0x3p-26f, 0x0001, 0x3340},
        {0x3p-25f, 0x0002, 0x33C0}, /* 1.5 units: to 2 */
        {0x5p-25f, 0x0002, 0x3420}, /* 2.5 units: to 2 */
        {0x1p-14f, 0x0400, 0x3880},
        {0x1p-14f - 0x1p-25f, 0x0400, 0x3880},    /* 1023.5 units: to the smallest normal */
        {3.4028234663852886e38f, 0x7C00, 0x7F80}, /* FLT_MAX: Inf in both */
        {INFINITY, 0x7C00, 0x7F80},
        {-INFINITY, 0xFC00, 0xFF80},
        {1e-40f, 0x0000, 0x0001}, /* a float32 subnormal */
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        const uint16_t h = f32_to_f16(known[i].x), b = f32_to_bf16(known[i].x);
        CHECK(h == known[i].f16, "float16(%a) = 0x%04X, expected 0x%04X", (double)known[i].x,
              (unsigned)h, (unsigned)known[i].f16);
        CHECK(b == known[i].bf16, "bfloat16(%a) = 0x%04X, expected 0x%04X", (double)known[i].x,
              (unsigned)b, (unsigned)known[i].bf16);
    }
    uint16_t h = f32_to_f16(NAN);
    CHECK((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu), "float16(NaN) = 0x%04X", (unsigned)h);
    h = f32_to_bf16(NAN);
    CHECK((h & 0x7F80u) == 0x7F80u && (h & 0x7Fu), "bfloat16(NaN) = 0x%04X", (unsigned)h);
    CHECK(pf_cuda_dtype_size(PF_CUDA_F32) == 4 && pf_cuda_dtype_size(PF_CUDA_BF16) == 2 &&
              pf_cuda_dtype_size(PF_CUDA_F16) == 2 && pf_cuda_dtype_size((pf_cuda_dtype)7) == 0,
          "pf_cuda_dtype_size");
    printf(
        "0. host converters: every float16 and bfloat16 value round trips; %zu known roundings\n",
        sizeof known / sizeof known[0]);
}

/* ---- a. float32 ------------------------------------------------------------------------------ */

static void test_fp32(void) {
    static const dims full[] = {
        {2, 3, 1, 1, 16, 16, 32},         {2, 3, 7, 7, 24, 40, 32},
        {2, 3, 7, 129, 16, 16, 266},      {2, 3, 129, 129, 64, 64, 256},
        {2, 3, 1000, 1000, 128, 40, 266}, {2, 3, 1000, 1, 24, 40, 32},
        {1, 2, 4099, 4099, 64, 64, 256},  {1, 1, 4099, 1000, 128, 128, 32},
    };
    static const dims small[] = {
        {2, 3, 1, 1, 16, 16, 32},      {2, 3, 7, 7, 24, 40, 32},       {2, 3, 7, 129, 16, 16, 266},
        {2, 3, 129, 129, 64, 64, 256}, {1, 2, 300, 300, 128, 40, 266}, {2, 3, 300, 1, 24, 40, 32},
    };
    const dims *cs = quick_ ? small : full;
    const int nc =
        quick_ ? (int)(sizeof small / sizeof small[0]) : (int)(sizeof full / sizeof full[0]);
    printf("a. float32 (TF32 off) against pf_attn_favor given the same W\n");
    double worst = 0;
    int runs = 0;
    for (int ci = 0; ci < nc; ci++) {
        const dims *c = &cs[ci];
        for (int k = 0; k < 4; k++) {
            const int wph = (ci + k) % 2;
            const float scale = (ci + k / 2) % 2 ? 0.3f : 0.0f;
            problem p = problem_for(c, (pf_kernel)k, wph, scale);
            dev g = dev_make(&p, PF_CUDA_F32);
            float *ref = xmalloc(sizeof(float) * p.no), *got = xmalloc(sizeof(float) * p.no);
            pf_favor_opts f = favor_of(&p, (pf_kernel)k, wph);
            for (int causal = 0; causal <= (c->Lq == c->Lk); causal++) {
                pf_attn_opts o = pf_attn_opts_default();
                o.scale = scale;
                o.causal = causal;
                f.chunk = 0;
                if (!check_ok(pf_attn_favor(ref, p.Q, p.K, p.V, &p.s, &o, &f), "pf_attn_favor"))
                    continue;
                /* chunk 1 only up to L = 1000: its chunk states take L r dv floats per head */
                static const int chunks[3] = {0, 16, 1};
                const int nch = !causal ? 1 : c->Lq <= 1000 ? 3 : 2;
                for (int i = 0; i < nch; i++) {
                    char what[200];
                    f.chunk = chunks[i];
                    describe(what, sizeof what, "a.", PF_CUDA_F32, (pf_kernel)k, &p.s, p.m, causal,
                             wph, scale, f.chunk);
                    pf_status st = dev_run(&g, got, &o, &f, pick_stream(ci + k + i));
                    if (!check_ok(st, what)) continue;
                    double e = nerr(got, ref, p.no);
                    report(what, e, TOL_F32);
                    worst = fmax(worst, e);
                    runs++;
                }
            }
            free(ref);
            free(got);
            dev_free(&g);
            problem_free(&p);
        }
    }
    printf("a. %d runs, worst error %.2e\n", runs, worst);

    /* TF32 products: "agree with the CPU to about 1e-3"; then off again, float32 again */
    const dims c = {2, 3, quick_ ? 300 : 1000, quick_ ? 300 : 1000, 64, 64, 256};
    problem p = problem_for(&c, PF_KERNEL_POSITIVE, 1, 0);
    dev g = dev_make(&p, PF_CUDA_F32);
    float *ref = xmalloc(sizeof(float) * p.no), *got = xmalloc(sizeof(float) * p.no);
    pf_favor_opts f = favor_of(&p, PF_KERNEL_POSITIVE, 1);
    for (int causal = 0; causal < 2; causal++) {
        pf_attn_opts o = pf_attn_opts_default();
        o.causal = causal;
        check_ok(pf_attn_favor(ref, p.Q, p.K, p.V, &p.s, &o, &f), "pf_attn_favor");
        for (int tf32 = 1; tf32 >= 0; tf32--) {
            char what[200];
            check_ok(pf_cuda_ctx_set_tf32(ctx_, tf32), "pf_cuda_ctx_set_tf32");
            describe(what, sizeof what, tf32 ? "a. TF32 on " : "a. TF32 off", PF_CUDA_F32,
                     PF_KERNEL_POSITIVE, &p.s, p.m, causal, 1, 0, 0);
            if (check_ok(dev_run(&g, got, &o, &f, stream_), what))
                report(what, nerr(got, ref, p.no), tf32 ? TOL_TF32 : TOL_F32);
        }
    }
    free(ref);
    free(got);
    dev_free(&g);
    problem_free(&p);
}

/* ---- b. bfloat16 and float16 ----------------------------------------------------------------- */

static void test_half(void) {
    static const dims full[] = {
        {2, 3, 7, 7, 16, 40, 32},
        {2, 3, 129, 300, 64, 64, 256},
        {2, 2, 700, 700, 64, 40, 266},
        {1, 2, 4099, 4099, 128, 64, 256},
    };
    static const dims small[] = {
        {2, 3, 7, 7, 16, 40, 32},
        {2, 3, 129, 300, 64, 64, 256},
        {1, 2, 300, 300, 64, 40, 266},
    };
    const dims *cs = quick_ ? small : full;
    const int nc =
        quick_ ? (int)(sizeof small / sizeof small[0]) : (int)(sizeof full / sizeof full[0]);
    static const pf_cuda_dtype dts[2] = {PF_CUDA_BF16, PF_CUDA_F16};
    printf("b. bfloat16 and float16 against pf_attn_favor_ref on the rounded inputs\n");
    double worst[2] = {0, 0};
    for (int di = 0; di < 2; di++) {
        const pf_cuda_dtype dt = dts[di];
        for (int ci = 0; ci < nc; ci++) {
            const dims *c = &cs[ci];
            /* float64 costs ~L r (d + dv) per head, on one thread: float32 past 8000 rows */
            const int f64 = (size_t)c->B * c->H * c->Lq <= 8000;
            for (int k = 0; k < 4; k++) {
                const int wph = (ci + k + di) % 2;
                const float scale = (ci + k / 2) % 2 ? 0.3f : 0.0f;
                problem p = problem_for(c, (pf_kernel)k, wph, scale);
                problem_round(&p, dt);
                dev g = dev_make(&p, dt);
                float *ref = xmalloc(sizeof(float) * p.no), *got = xmalloc(sizeof(float) * p.no);
                pf_favor_opts f = favor_of(&p, (pf_kernel)k, wph);
                /* every other run pads batch element 1: key_len in host memory */
                const int32_t kl[2] = {c->Lk, c->Lk - c->Lk / 3};
                const int pad = ((k ^ (k >> 1)) + ci + di) % 2 == 1 && c->B == 2;
                for (int causal = 0; causal <= (c->Lq == c->Lk); causal++) {
                    pf_attn_opts o = pf_attn_opts_default();
                    o.scale = scale;
                    o.causal = causal;
                    o.key_len = pad ? kl : NULL;
                    f.chunk = 0;
                    pf_status rs = f64 ? pf_attn_favor_ref(ref, p.Q, p.K, p.V, &p.s, &o, &f)
                                       : pf_attn_favor(ref, p.Q, p.K, p.V, &p.s, &o, &f);
                    if (!check_ok(rs, f64 ? "pf_attn_favor_ref" : "pf_attn_favor")) continue;
                    f.chunk = causal && (ci + k) % 2 ? 16 : 0;
                    char what[200];
                    describe(what, sizeof what, f64 ? "b." : "b.*", dt, (pf_kernel)k, &p.s, p.m,
                             causal, wph, scale, f.chunk);
                    if (pad) {
                        const size_t n = strlen(what);
                        snprintf(what + n, sizeof what - n, " key_len %d,%d", kl[0], kl[1]);
                    }
                    if (!check_ok(dev_run(&g, got, &o, &f, pick_stream(ci + k)), what)) continue;
                    double e = nerr(got, ref, p.no);
                    report(what, e, tol_of(dt));
                    worst[di] = fmax(worst[di], e);
                }
                free(ref);
                free(got);
                dev_free(&g);
                problem_free(&p);
            }
        }
    }
    printf("b. worst error bf16 %.2e, f16 %.2e (* against pf_attn_favor, float32)\n", worst[0],
           worst[1]);
}

/* ---- c. long and large ----------------------------------------------------------------------- */

static void test_large(void) {
    const int B = 1, H = 2, L = quick_ ? 8192 : 65536, d = 64, dv = 64, m = 256;
    static const pf_cuda_dtype dts[2] = {PF_CUDA_F16, PF_CUDA_BF16};
    printf("c. L = %d, rows of q and k of norms 8..12, |v| up to 100, against pf_attn_favor\n", L);
    for (int di = 0; di < 2; di++) {
        const pf_cuda_dtype dt = dts[di];
        problem p = problem_make(B, H, L, L, d, dv, m, H, 8.0, 12.0, 1);
        pf_rng rng;
        pf_rng_init(&rng, seed_, draws_++);
        for (size_t i = 0; i < p.nv; i++)
            p.V[i] = (float)(100.0 * (2.0 * pf_rng_uniform(&rng) - 1.0));
        problem_round(&p, dt);
        if (di == 0) {
            /* what a float16 sum would meet: the unstabilised key features of head 0 summed */
            const int r = pf_kernel_width(PF_KERNEL_POSITIVE, m);
            float *phi = xmalloc(sizeof(float) * (size_t)L * r);
            pf_status st = pf_features(phi, NULL, p.K, L, d, p.W, m, PF_KERNEL_POSITIVE,
                                       (float)(1.0 / sqrt((double)d)), 0);
            if (st == PF_OK) {
                /* z_f = sum_j phi_f(k_j) and S_fc = sum_j phi_f(k_j) v_jc for 8 columns c */
                double zmax = 0, smax = 0;
                double *acc = xmalloc(sizeof(double) * 9 * r);
                memset(acc, 0, sizeof(double) * 9 * r);
                for (int j = 0; j < L; j++) {
                    const float *pj = phi + (size_t)j * r, *vj = p.V + (size_t)j * dv;
                    for (int f = 0; f < r; f++) {
                        acc[f] += pj[f];
                        for (int c = 0; c < 8; c++) acc[(size_t)(c + 1) * r + f] += pj[f] * vj[c];
                    }
                }
                for (int f = 0; f < r; f++) zmax = fmax(zmax, acc[f]);
                for (int f = r; f < 9 * r; f++) smax = fmax(smax, fabs(acc[f]));
                printf("  head 0 unstabilised: the largest key sum sum_j phi_f(k_j) %.3g, the "
                       "largest |sum_j phi_f(k_j) v_jc| (8 columns) %.3g; float16 ends at 65504\n",
                       zmax, smax);
                free(acc);
            } else {
                printf("  the unstabilised key features of head 0 overflow float32 (%s)\n",
                       pf_status_str(st));
            }
            free(phi);
        }
        dev g = dev_make(&p, dt);
        float *ref = xmalloc(sizeof(float) * p.no), *got = xmalloc(sizeof(float) * p.no);
        pf_favor_opts f = favor_of(&p, PF_KERNEL_POSITIVE, 1);
        for (int causal = 0; causal < 2; causal++) {
            pf_attn_opts o = pf_attn_opts_default();
            o.causal = causal;
            double t0 = now_s();
            if (!check_ok(pf_attn_favor(ref, p.Q, p.K, p.V, &p.s, &o, &f), "pf_attn_favor (CPU)"))
                continue;
            double t1 = now_s();
            char what[200];
            describe(what, sizeof what, "c.", dt, PF_KERNEL_POSITIVE, &p.s, m, causal, 1, 0, 0);
            pf_status st = dev_run(&g, got, &o, &f, pick_stream(causal));
            double t2 = now_s();
            if (!check_ok(st, what)) continue;
            size_t nonfinite = 0;
            for (size_t i = 0; i < p.no; i++) nonfinite += !isfinite(got[i]);
            CHECK(nonfinite == 0, "%s: %zu outputs not finite", what, nonfinite);
            report(what, nerr(got, ref, p.no), LARGE * tol_of(dt));
            printf("    (2-norm relative error %.2e; CPU %.2f s, GPU call %.3f s)\n",
                   rel_err(got, ref, p.no), t1 - t0, t2 - t1);
        }
        free(ref);
        free(got);
        dev_free(&g);
        problem_free(&p);
    }
}

/* ---- d. strict causality --------------------------------------------------------------------- */

static void test_causality(void) {
    const int B = 1, H = 2, L = 300, d = 16, dv = 8, m = 32;
    static const struct {
        int chunk, t; /* chunk 0 is 128: t = 40 inside the first, 127 its end, 200 the second */
    } cuts[] = {{0, 0}, {0, 40}, {0, 127}, {0, 200}, {16, 40}, {16, 47}, {16, 100}};
    const int ncuts = (int)(sizeof cuts / sizeof cuts[0]);
    static const pf_cuda_dtype dts[3] = {PF_CUDA_F32, PF_CUDA_BF16, PF_CUDA_F16};
    printf("d. strict causality: keys after t of norm 50, values x100, rows 0..t the same bits\n");
    for (int di = 0; di < 3; di++) {
        const pf_cuda_dtype dt = dts[di];
        for (int k = 0; k < 4; k++) {
            const dims c = {B, H, L, L, d, dv, m};
            problem p = problem_for(&c, (pf_kernel)k, 1, 0);
            problem_round(&p, dt);
            dev g = dev_make(&p, dt);
            float *K2 = xmalloc(sizeof(float) * p.nk), *V2 = xmalloc(sizeof(float) * p.nv);
            unsigned char *base = xmalloc(g.bo);
            pf_favor_opts f = favor_of(&p, (pf_kernel)k, 1);
            pf_attn_opts o = pf_attn_opts_default();
            o.causal = 1;
            const size_t es = esize(dt);
            int same = 0, tried = 0, chunk = -1;
            char statuses[200] = "";
            for (int ci = 0; ci < ncuts; ci++) {
                const int t = cuts[ci].t;
                if (cuts[ci].chunk != chunk) {
                    chunk = f.chunk = cuts[ci].chunk;
                    upload(g.K, p.K, p.nk, dt);
                    upload(g.V, p.V, p.nv, dt);
                    if (!check_ok(dev_run(&g, NULL, &o, &f, 0), "d. the first run")) break;
                    memcpy(base, g.raw, g.bo);
                }
                memcpy(K2, p.K, sizeof(float) * p.nk);
                memcpy(V2, p.V, sizeof(float) * p.nv);
                for (int h = 0; h < H; h++) {
                    float *Kh = K2 + (size_t)h * L * d, *Vh = V2 + (size_t)h * L * dv;
                    fill_normal(Kh + (size_t)(t + 1) * d, (size_t)(L - t - 1) * d, 1, seed_,
                                draws_++);
                    set_row_norms(Kh + (size_t)(t + 1) * d, (size_t)(L - t - 1), d, 50.0, 50.0);
                    for (size_t e = (size_t)(t + 1) * dv; e < (size_t)L * dv; e++) Vh[e] *= 100.0f;
                }
                round_to(K2, p.nk, dt);
                round_to(V2, p.nv, dt);
                upload(g.K, K2, p.nk, dt);
                upload(g.V, V2, p.nv, dt);
                /* the later rows may see a trig denominator near zero, or (float16) an output
                 * past 65504: a status for them, but rows 0..t must keep their bits */
                pf_status st = dev_run(&g, NULL, &o, &f, pick_stream(ci));
                CHECK(st == PF_OK || st == PF_ENONFINITE || st == PF_EDOMAIN,
                      "d. %s %s t=%d: %s (%s)", dt_name(dt), pf_kernel_name((pf_kernel)k), t,
                      pf_status_str(st), pf_cuda_last_error());
                if (st != PF_OK) {
                    size_t n = strlen(statuses);
                    snprintf(statuses + n, sizeof statuses - n, " t=%d %s", t, st_name(st));
                }
                for (int h = 0; h < H; h++) {
                    const size_t off = (size_t)h * L * dv * es, len = (size_t)(t + 1) * dv * es;
                    int ok = memcmp(base + off, g.raw + off, len) == 0;
                    CHECK(ok, "d. %s %s chunk %d: rows 0..%d of head %d changed by later keys",
                          dt_name(dt), pf_kernel_name((pf_kernel)k), chunk, t, h);
                    same += ok;
                    tried++;
                }
            }
            printf("  d. %-4s %-10s %d of %d (cut, head) pairs keep their bits%s%s\n", dt_name(dt),
                   pf_kernel_name((pf_kernel)k), same, tried, statuses[0] ? "; changed runs:" : "",
                   statuses);
            free(K2);
            free(V2);
            free(base);
            dev_free(&g);
            problem_free(&p);
        }
    }
}

/* ---- e. padding ------------------------------------------------------------------------------ */

/* Batch element b of p with its keys and values cut to len rows: (1, H, Lq, len). */
static problem problem_cut(const problem *p, int b, int len) {
    const pf_shape s = p->s;
    problem t;
    t.s = (pf_shape){1, s.H, s.Lq, len, s.d, s.dv};
    t.m = p->m;
    t.wh = p->wh;
    t.nq = (size_t)s.H * s.Lq * s.d;
    t.nk = (size_t)s.H * len * s.d;
    t.nv = (size_t)s.H * len * s.dv;
    t.no = (size_t)s.H * s.Lq * s.dv;
    t.nw = p->nw;
    t.Q = xmalloc(sizeof(float) * t.nq);
    t.K = xmalloc(sizeof(float) * t.nk);
    t.V = xmalloc(sizeof(float) * t.nv);
    t.W = xmalloc(sizeof(float) * t.nw);
    memcpy(t.Q, p->Q + (size_t)b * t.nq, sizeof(float) * t.nq);
    for (int h = 0; h < s.H; h++) {
        const size_t bh = (size_t)b * s.H + h;
        memcpy(t.K + (size_t)h * len * s.d, p->K + bh * s.Lk * s.d, sizeof(float) * len * s.d);
        memcpy(t.V + (size_t)h * len * s.dv, p->V + bh * s.Lk * s.dv, sizeof(float) * len * s.dv);
    }
    memcpy(t.W, p->W, sizeof(float) * t.nw);
    return t;
}

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
            dev g = dev_make(&p, PF_CUDA_F32);
            float *got = xmalloc(sizeof(float) * p.no), *ref = xmalloc(sizeof(float) * p.no),
                  *cut = xmalloc(sizeof(float) * p.no);
            pf_favor_opts f = favor_of(&p, (pf_kernel)k, wph);
            for (int where = 0; where < 2; where++) {
                int32_t hl[2] = {lens[causal][where][0], lens[causal][where][1]};
                int32_t *dl = where ? dlen : hl;
                if (where) h2d(dlen, hl, sizeof hl);
                pf_attn_opts o = pf_attn_opts_default();
                o.causal = causal;
                o.key_len = dl;
                char what[200];
                snprintf(what, sizeof what, "e. %s %s key_len {%d, %d} in %s memory, vs CPU",
                         pf_kernel_name((pf_kernel)k), causal ? "causal" : "bidir", hl[0], hl[1],
                         where ? "device" : "host");
                if (!check_ok(dev_run(&g, got, &o, &f, pick_stream(where)), what)) continue;
                pf_attn_opts oc = o;
                oc.key_len = hl;
                if (!check_ok(pf_attn_favor(ref, p.Q, p.K, p.V, &p.s, &oc, &f), "pf_attn_favor"))
                    continue;
                report(what, nerr(got, ref, p.no), TOL_F32);
                if (causal) continue;
                /* bidirectional: the same as K and V cut to the lengths */
                for (int b = 0; b < B; b++) {
                    problem t = problem_cut(&p, b, hl[b]);
                    dev tg = dev_make(&t, PF_CUDA_F32);
                    pf_attn_opts ot = pf_attn_opts_default();
                    check_ok(dev_run(&tg, cut + (size_t)b * t.no, &ot, &f, 0), "e. a cut run");
                    dev_free(&tg);
                    problem_free(&t);
                }
                snprintf(what, sizeof what,
                         "e. %s bidir key_len {%d, %d} in %s memory, vs cut K, V",
                         pf_kernel_name((pf_kernel)k), hl[0], hl[1], where ? "device" : "host");
                report(what, nerr(got, cut, p.no), TOL_F32);
            }
            free(got);
            free(ref);
            free(cut);
            dev_free(&g);
            problem_free(&p);
        }
    }
    CU(cudaFree(dlen));
}

/* ---- f. decoding ----------------------------------------------------------------------------- */

typedef struct seq_hist {
    int len;              /* tokens since the last reset */
    float *q, *k, *v, *o; /* (H, T, d), (H, T, d), (H, T, dv), (H, T, dv): tokens and rows */
} seq_hist;

typedef struct dec_case {
    pf_cuda_dtype dt;
    pf_kernel kernel;
    int wph;
    float scale;
    int N, H, d, dv, m, T;
    const float *W; /* host (wh, m, d) */
    double worst_cpu, worst_gpu;
    int segments, rows;
} dec_case;

/* Sequence n's rows since its last reset against the causal pass on its tokens: on the GPU
 * (pf_cuda_favor, the same dtype) and the CPU (pf_attn_favor, float32 on the same values). */
static void dec_verify(dec_case *c, seq_hist *s, int n) {
    const int L = s->len, H = c->H, d = c->d, dv = c->dv, T = c->T;
    if (L == 0) return;
    problem p;
    p.s = (pf_shape){1, H, L, L, d, dv};
    p.m = c->m;
    p.wh = c->wph ? H : 1;
    p.nq = p.nk = (size_t)H * L * d;
    p.nv = p.no = (size_t)H * L * dv;
    p.nw = (size_t)p.wh * c->m * d;
    p.Q = xmalloc(sizeof(float) * p.nq);
    p.K = xmalloc(sizeof(float) * p.nk);
    p.V = xmalloc(sizeof(float) * p.nv);
    p.W = xmalloc(sizeof(float) * p.nw);
    float *rows = xmalloc(sizeof(float) * p.no), *cpu = xmalloc(sizeof(float) * p.no),
          *gpu = xmalloc(sizeof(float) * p.no);
    for (int h = 0; h < H; h++) {
        memcpy(p.Q + (size_t)h * L * d, s->q + (size_t)h * T * d, sizeof(float) * L * d);
        memcpy(p.K + (size_t)h * L * d, s->k + (size_t)h * T * d, sizeof(float) * L * d);
        memcpy(p.V + (size_t)h * L * dv, s->v + (size_t)h * T * dv, sizeof(float) * L * dv);
        memcpy(rows + (size_t)h * L * dv, s->o + (size_t)h * T * dv, sizeof(float) * L * dv);
    }
    memcpy(p.W, c->W, sizeof(float) * p.nw);
    pf_attn_opts o = pf_attn_opts_default();
    o.causal = 1;
    o.scale = c->scale;
    pf_favor_opts f = favor_of(&p, c->kernel, c->wph);
    const int half = c->dt != PF_CUDA_F32;
    if (check_ok(pf_attn_favor(cpu, p.Q, p.K, p.V, &p.s, &o, &f), "f. pf_attn_favor")) {
        double e = nerr(rows, cpu, p.no);
        CHECK(e <= (half ? TOL_DECODE : TOL_F32),
              "f. decode %s %s: sequence %d, %d tokens: rows against the CPU: error %.3g",
              dt_name(c->dt), pf_kernel_name(c->kernel), n, L, e);
        c->worst_cpu = fmax(c->worst_cpu, e);
    }
    dev g = dev_make(&p, c->dt);
    if (check_ok(dev_run(&g, gpu, &o, &f, 0), "f. the causal pf_cuda_favor pass")) {
        double e = nerr(rows, gpu, p.no);
        CHECK(e <= (half ? TOL_DECODE + tol_of(c->dt) : TOL_F32),
              "f. decode %s %s: sequence %d, %d tokens: rows against pf_cuda_favor: error %.3g",
              dt_name(c->dt), pf_kernel_name(c->kernel), n, L, e);
        c->worst_gpu = fmax(c->worst_gpu, e);
    }
    c->segments++;
    c->rows += L;
    dev_free(&g);
    problem_free(&p);
    free(rows);
    free(cpu);
    free(gpu);
    s->len = 0;
}

/* One decoding run (see f. at the top). with_bad: a NaN in sequence 2's q at step 8, an Inf
 * in sequence 0's k at step 17, a NaN in sequence 4's v at step T - 5. */
static void dec_run(pf_cuda_dtype dt, pf_kernel kernel, int wph, float scale, int with_bad,
                    int dv) {
    enum { N = 5 };
    const int H = 3, d = 16, m = 32, T = quick_ ? 24 : 40;
    const int wh = wph ? H : 1;
    const size_t es = esize(dt), nqk = (size_t)N * H * d, nvo = (size_t)N * H * dv;
    float *W = xmalloc(sizeof(float) * wh * m * d);
    for (int h = 0; h < wh; h++)
        pf_projection_draw(W + (size_t)h * m * d, m, d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, seed_,
                           draws_++);
    dec_case c = {dt, kernel, wph, scale, N, H, d, dv, m, T, W, 0, 0, 0, 0};
    float *dW = to_device(W, (size_t)wh * m * d, PF_CUDA_F32);
    pf_favor_opts f = pf_favor_opts_default();
    f.kernel = kernel;
    f.W = dW;
    f.m = m;
    f.w_per_head = wph;
    f.eps = kernel == PF_KERNEL_RELU ? 1e-3f : 0.0f;
    pf_cuda_favor_state *st = NULL;
    if (!check_ok(pf_cuda_favor_state_create(&st, ctx_, N, H, d, dv, scale, &f),
                  "f. pf_cuda_favor_state_create")) {
        CU(cudaFree(dW));
        free(W);
        return;
    }
    /* the states hold their own copy of W: the caller's may change after create */
    CU(cudaMemset(dW, 0, sizeof(float) * wh * m * d));
    CU(cudaDeviceSynchronize());
    check_ok(pf_cuda_favor_state_reset(st, NULL, stream_), "f. reset of empty states");

    seq_hist hist[N];
    for (int n = 0; n < N; n++) {
        hist[n].len = 0;
        hist[n].q = xmalloc(sizeof(float) * H * T * d);
        hist[n].k = xmalloc(sizeof(float) * H * T * d);
        hist[n].v = xmalloc(sizeof(float) * H * T * dv);
        hist[n].o = xmalloc(sizeof(float) * H * T * dv);
    }
    float *q = xmalloc(sizeof(float) * nqk), *k = xmalloc(sizeof(float) * nqk),
          *v = xmalloc(sizeof(float) * nvo), *o = xmalloc(sizeof(float) * nvo);
    unsigned char *raw = xmalloc(nvo * es);
    void *dq = dmalloc(nqk * es), *dk = dmalloc(nqk * es), *dv_ = dmalloc(nvo * es),
         *dout = dmalloc(nvo * es);
    int32_t *dact = dmalloc(sizeof(int32_t) * N);
    double lo, hi;
    norms_for(kernel, d, scale, &lo, &hi);
    int bad_steps = 0, held = 0;
    for (int s = 0; s < T; s++) {
        /* resets: the finished segments are checked first */
        int which[N] = {0, 0, 0, 0, 0}, any = 0;
        if (s == T / 3) which[1] = which[3] = any = 1;
        if (s == 2 * T / 3) which[0] = which[4] = any = 1;
        if (any) {
            for (int n = 0; n < N; n++)
                if (which[n]) dec_verify(&c, &hist[n], n);
            check_ok(pf_cuda_favor_state_reset(st, which, pick_stream(s)), "f. reset");
        }
        /* who steps: sequence n skips every (n+2)-th step, sequence 4 pauses for 6 steps, and
         * step 5 passes active = NULL (all) */
        const int all = s == 5;
        int32_t act[N];
        for (int n = 0; n < N; n++) {
            act[n] = all || (s + n) % (n + 2) != 0;
            if (!all && n == 4 && s >= T / 2 && s < T / 2 + 6) act[n] = 0;
        }
        int bad = -1;
        if (with_bad) bad = s == 8 ? 2 : s == 17 ? 0 : s == T - 5 ? 4 : -1;
        if (bad >= 0) act[bad] = 1;
        fill_normal(q, nqk, 1, seed_, draws_++);
        fill_normal(k, nqk, 1, seed_, draws_++);
        fill_normal(v, nvo, 1, seed_, draws_++);
        set_row_norms(q, nqk / d, d, lo, hi);
        set_row_norms(k, nqk / d, d, lo, hi);
        round_to(q, nqk, dt);
        round_to(k, nqk, dt);
        round_to(v, nvo, dt);
        if (bad == 2) q[((size_t)2 * H + 1) * d + 3] = NAN;
        if (bad == 0) k[0] = INFINITY;
        if (bad == 4) v[((size_t)4 * H + 2) * dv + dv - 1] = NAN;
        upload(dq, q, nqk, dt);
        upload(dk, k, nqk, dt);
        upload(dv_, v, nvo, dt);
        h2d(dact, act, sizeof act);
        poison(dout, nvo * es);
        pf_status r = pf_cuda_favor_state_step(st, dout, dq, dk, dv_, all ? NULL : dact, dt,
                                               pick_stream(s + 1));
        const pf_status want = bad >= 0 ? PF_ENONFINITE : PF_OK;
        CHECK(r == want, "f. decode %s %s step %d: %s, expected %s (%s)", dt_name(dt),
              pf_kernel_name(kernel), s, pf_status_str(r), pf_status_str(want),
              pf_cuda_last_error());
        bad_steps += bad >= 0;
        d2h(raw, dout, nvo * es);
        decode(o, raw, nvo, dt);
        for (int n = 0; n < N; n++) {
            const size_t row = (size_t)n * H * dv;
            if (!act[n]) {
                CHECK(all_bytes(raw + row * es, (size_t)H * dv * es, 0xFF),
                      "f. decode %s %s step %d: the row of inactive sequence %d was written",
                      dt_name(dt), pf_kernel_name(kernel), s, n);
                held++;
                continue;
            }
            if (n == bad) {
                int zero = 1;
                for (size_t e = 0; e < (size_t)H * dv; e++) zero &= o[row + e] == 0.0f;
                CHECK(zero,
                      "f. decode %s %s step %d: sequence %d's bad token left a row that is "
                      "not zero",
                      dt_name(dt), pf_kernel_name(kernel), s, n);
                continue; /* its state must be as before: its history does not take the token */
            }
            seq_hist *h = &hist[n];
            for (int hh = 0; hh < H; hh++) {
                const size_t at = (size_t)hh * T + h->len, src = (size_t)n * H + hh;
                memcpy(h->q + at * d, q + src * d, sizeof(float) * d);
                memcpy(h->k + at * d, k + src * d, sizeof(float) * d);
                memcpy(h->v + at * dv, v + src * dv, sizeof(float) * dv);
                memcpy(h->o + at * dv, o + src * dv, sizeof(float) * dv);
            }
            h->len++;
        }
        int64_t pos[N];
        if (check_ok(pf_cuda_favor_state_positions(st, pos, pick_stream(s)), "f. positions"))
            for (int n = 0; n < N; n++)
                CHECK(pos[n] == hist[n].len,
                      "f. decode %s %s step %d: sequence %d at position "
                      "%" PRId64 ", expected %d",
                      dt_name(dt), pf_kernel_name(kernel), s, n, pos[n], hist[n].len);
    }
    for (int n = 0; n < N; n++) dec_verify(&c, &hist[n], n);
    int64_t pos[N];
    check_ok(pf_cuda_favor_state_reset(st, NULL, 0), "f. reset of every state");
    if (check_ok(pf_cuda_favor_state_positions(st, pos, 0), "f. positions"))
        for (int n = 0; n < N; n++)
            CHECK(pos[n] == 0, "f. after reset(NULL): sequence %d at %" PRId64, n, pos[n]);
    printf("  f. decode %-4s %-10s %s s%-4g dv %d, %d steps, %d segments, %d rows, %d inactive "
           "rows kept, %d bad tokens: vs CPU %.2e (tol %.0e), vs pf_cuda_favor %.2e (tol %.0e)\n",
           dt_name(dt), pf_kernel_name(kernel), wph ? "W/head" : "W     ", (double)scale, dv, T,
           c.segments, c.rows, held, bad_steps, c.worst_cpu,
           dt == PF_CUDA_F32 ? TOL_F32 : TOL_DECODE, c.worst_gpu,
           dt == PF_CUDA_F32 ? TOL_F32 : TOL_DECODE + tol_of(dt));
    pf_cuda_favor_state_free(st);
    for (int n = 0; n < N; n++) {
        free(hist[n].q);
        free(hist[n].k);
        free(hist[n].v);
        free(hist[n].o);
    }
    free(q);
    free(k);
    free(v);
    free(o);
    free(raw);
    free(W);
    CU(cudaFree(dq));
    CU(cudaFree(dk));
    CU(cudaFree(dv_));
    CU(cudaFree(dout));
    CU(cudaFree(dact));
    CU(cudaFree(dW));
}

static void test_decode(void) {
    static const pf_cuda_dtype dts[3] = {PF_CUDA_F32, PF_CUDA_BF16, PF_CUDA_F16};
    printf("f. decoding N = 5 sequences x H = 3 heads against the causal passes\n");
    /* dv = 24 takes the step's general path, dv = 32 and 64 its float4 path (dv dividing 1024) */
    static const int dvs[3] = {24, 32, 64};
    for (int di = 0; di < 3; di++)
        for (int k = 0; k < 4; k++)
            dec_run(dts[di], (pf_kernel)k, k % 2 == 0, k >= 2 ? 0.25f : 0.0f, k % 2 == 1,
                    dvs[(di + k) % 3]);
    pf_cuda_favor_state_free(NULL);
}

/* ---- g. refused arguments, non-finite inputs, zero denominators ------------------------------ */

static void test_errors(void) {
    const int B = 2, H = 2, L = 20, d = 8, dv = 8, m = 16;
    problem p = problem_make(B, H, L, L, d, dv, m, H, 0.5, 2.0, 1);
    dev g = dev_make(&p, PF_CUDA_F32);
    const pf_cuda_dtype F32 = PF_CUDA_F32;
    const pf_shape s = p.s;
    pf_attn_opts o = pf_attn_opts_default();
    pf_favor_opts f = favor_of(&p, PF_KERNEL_POSITIVE, 1);
    f.W = g.W;
    printf("g. refused arguments: status and pf_cuda_last_error()\n");
    CHECK(
        pf_cuda_kernel_supported(PF_KERNEL_POSITIVE) && pf_cuda_kernel_supported(PF_KERNEL_TRIG) &&
            pf_cuda_kernel_supported(PF_KERNEL_HYPERBOLIC) &&
            pf_cuda_kernel_supported(PF_KERNEL_RELU) && !pf_cuda_kernel_supported(PF_KERNEL_OPRF) &&
            !pf_cuda_kernel_supported(PF_KERNEL_SDERF) && !pf_cuda_kernel_supported(PF_KERNEL_ELU),
        "pf_cuda_kernel_supported");
    CHECK(pf_cuda_ctx_device(ctx_) == 0, "pf_cuda_ctx_device: %d", pf_cuda_ctx_device(ctx_));
    void *hout = xmalloc(g.bo), *hQ = xmalloc(g.bq), *hK = xmalloc(g.bk), *hV = xmalloc(g.bv);
    memcpy(hQ, p.Q, g.bq);
    memcpy(hK, p.K, g.bk);
    memcpy(hV, p.V, g.bv);
    poison(g.out, g.bo);
    /* NULLs */
    EXPECT_FAIL(pf_cuda_favor(NULL, g.out, g.Q, g.K, g.V, F32, &s, &o, &f, 0), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor(ctx_, NULL, g.Q, g.K, g.V, F32, &s, &o, &f, 0), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, NULL, g.K, g.V, F32, &s, &o, &f, 0), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, NULL, g.V, F32, &s, &o, &f, 0), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, NULL, F32, &s, &o, &f, 0), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, NULL, &o, &f, 0), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &s, NULL, &f, 0), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &s, &o, NULL, 0), PF_EINVAL);
    pf_favor_opts fb = f;
    fb.W = NULL;
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &s, &o, &fb, 0), PF_EINVAL);
    /* host memory where device memory is needed */
    EXPECT_FAIL(pf_cuda_favor(ctx_, hout, g.Q, g.K, g.V, F32, &s, &o, &f, 0), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, hQ, g.K, g.V, F32, &s, &o, &f, 0), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, hK, g.V, F32, &s, &o, &f, 0), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, hV, F32, &s, &o, &f, 0), PF_EINVAL);
    fb = f;
    fb.W = p.W;
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &s, &o, &fb, 0), PF_EINVAL);
    /* shapes */
    const pf_shape empty[6] = {{0, H, L, L, d, dv}, {B, 0, L, L, d, dv}, {B, H, 0, L, d, dv},
                               {B, H, L, 0, d, dv}, {B, H, L, L, 0, dv}, {B, H, L, L, d, 0}};
    for (int i = 0; i < 6; i++)
        EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &empty[i], &o, &f, 0),
                    PF_EINVAL);
    pf_shape sb = s;
    sb.H = -1;
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &sb, &o, &f, 0), PF_EINVAL);
    sb = s;
    sb.Lk = L / 2; /* fits the buffers; causal needs Lq == Lk */
    pf_attn_opts ob = o;
    ob.causal = 1;
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &sb, &ob, &f, 0), PF_EINVAL);
    /* dtype, scale, m, the map's options */
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, (pf_cuda_dtype)7, &s, &o, &f, 0),
                PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, (pf_cuda_dtype)-1, &s, &o, &f, 0),
                PF_EINVAL);
    ob = o;
    ob.scale = -1;
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &s, &ob, &f, 0), PF_EINVAL);
    ob.scale = NAN;
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &s, &ob, &f, 0), PF_EINVAL);
    fb = f;
    fb.m = 0;
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &s, &o, &fb, 0), PF_EINVAL);
    fb.m = -4;
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &s, &o, &fb, 0), PF_EINVAL);
    fb = f;
    fb.eps = -1e-3f;
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &s, &o, &fb, 0), PF_EINVAL);
    fb = f;
    fb.chunk = -1;
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &s, &o, &fb, 0), PF_EINVAL);
    fb = f;
    fb.w_per_head = 2;
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &s, &o, &fb, 0), PF_EINVAL);
    fb = f;
    fb.kernel = (pf_kernel)7;
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &s, &o, &fb, 0), PF_EINVAL);
    fb.kernel = PF_KERNEL_ELU;
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &s, &o, &fb, 0), PF_ENOTSUP);
    fb.kernel = PF_KERNEL_OPRF;
    fb.oprf_a_given = 1;
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &s, &o, &fb, 0), PF_ENOTSUP);
    fb.kernel = PF_KERNEL_SDERF;
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &s, &o, &fb, 0), PF_ENOTSUP);
    /* key lengths out of [1, Lk], in host and in device memory */
    int32_t *dl = dmalloc(sizeof(int32_t) * B);
    static const int32_t badlen[2][2] = {{20, 0}, {20, 21}};
    for (int i = 0; i < 2; i++) {
        ob = o;
        ob.key_len = badlen[i];
        EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &s, &ob, &f, 0), PF_EINVAL);
        h2d(dl, badlen[i], sizeof(int32_t) * B);
        ob.key_len = dl;
        EXPECT_FAIL(pf_cuda_favor(ctx_, g.out, g.Q, g.K, g.V, F32, &s, &ob, &f, 0), PF_EINVAL);
    }
    /* none of those wrote into out */
    d2h(g.raw, g.out, g.bo);
    CHECK(all_bytes(g.raw, g.bo, 0xFF), "g. a refused call wrote into out");
    /* out overlapping an input: part of Q, all of K, all of V */
    unsigned char *both = dmalloc(g.bq + g.bo);
    h2d(both, p.Q, g.bq);
    EXPECT_FAIL(pf_cuda_favor(ctx_, both + g.bq / 2, both, g.K, g.V, F32, &s, &o, &f, 0),
                PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.K, g.Q, g.K, g.V, F32, &s, &o, &f, 0), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor(ctx_, g.V, g.Q, g.K, g.V, F32, &s, &o, &f, 0), PF_EINVAL);
    upload(g.K, p.K, p.nk, F32);
    upload(g.V, p.V, p.nv, F32);
    CU(cudaFree(both));
    /* the context's own functions */
    pf_cuda_ctx *c2 = NULL;
    EXPECT_FAIL(pf_cuda_ctx_create(&c2, 999), PF_ENOTSUP);
    EXPECT_FAIL(pf_cuda_ctx_create(NULL, 0), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_ctx_set_tf32(NULL, 0), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_ctx_set_tf32(ctx_, 2), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_ctx_set_workspace_limit(NULL, 1), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_ctx_profile(NULL, 1), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_ctx_stages(NULL, NULL, NULL, NULL, NULL), PF_EINVAL);
    size_t ph = 0, fx = 0;
    EXPECT_FAIL(pf_cuda_favor_workspace(&ph, &fx, (pf_cuda_dtype)7, &s, &o, &f), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor_workspace(&ph, &fx, F32, NULL, &o, &f), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor_workspace(&ph, &fx, F32, &empty[2], &o, &f), PF_EINVAL);
    fb = f;
    fb.kernel = PF_KERNEL_OPRF;
    EXPECT_FAIL(pf_cuda_favor_workspace(&ph, &fx, F32, &s, &o, &fb), PF_ENOTSUP);
    pf_cuda_ctx_free(NULL);

    /* decoding */
    const int N = 3;
    pf_cuda_favor_state *st = NULL;
    EXPECT_FAIL(pf_cuda_favor_state_create(NULL, ctx_, N, H, d, dv, 0, &f), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor_state_create(&st, NULL, N, H, d, dv, 0, &f), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor_state_create(&st, ctx_, 0, H, d, dv, 0, &f), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor_state_create(&st, ctx_, -1, H, d, dv, 0, &f), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor_state_create(&st, ctx_, N, 0, d, dv, 0, &f), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor_state_create(&st, ctx_, N, H, 0, dv, 0, &f), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor_state_create(&st, ctx_, N, H, d, 0, 0, &f), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor_state_create(&st, ctx_, N, H, d, dv, -1, &f), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor_state_create(&st, ctx_, N, H, d, dv, NAN, &f), PF_EINVAL);
    EXPECT_FAIL(pf_cuda_favor_state_create(&st, ctx_, N, H, d, dv, 0, NULL), PF_EINVAL);
    fb = f;
    fb.W = NULL;
    EXPECT_FAIL(pf_cuda_favor_state_create(&st, ctx_, N, H, d, dv, 0, &fb), PF_EINVAL);
    fb.W = p.W;
    EXPECT_FAIL(pf_cuda_favor_state_create(&st, ctx_, N, H, d, dv, 0, &fb), PF_EINVAL);
    fb = f;
    fb.m = 0;
    EXPECT_FAIL(pf_cuda_favor_state_create(&st, ctx_, N, H, d, dv, 0, &fb), PF_EINVAL);
    fb = f;
    fb.kernel = PF_KERNEL_OPRF;
    fb.oprf_a_given = 1;
    EXPECT_FAIL(pf_cuda_favor_state_create(&st, ctx_, N, H, d, dv, 0, &fb), PF_ENOTSUP);
    st = NULL;
    if (check_ok(pf_cuda_favor_state_create(&st, ctx_, N, H, d, dv, 0, &f), "g. state create")) {
        const size_t nqk = (size_t)N * H * d, nvo = (size_t)N * H * dv;
        void *dq = dmalloc(nqk * 4), *dk = dmalloc(nqk * 4), *dvv = dmalloc(nvo * 4),
             *dout = dmalloc(nvo * 4);
        float *hq = xmalloc(nqk * 4), *hk = xmalloc(nqk * 4), *hv = xmalloc(nvo * 4),
              *ho = xmalloc(nvo * 4);
        int32_t *hact = xmalloc(sizeof(int32_t) * N);
        fill_normal(hq, nqk, 0.3f, seed_, draws_++);
        fill_normal(hk, nqk, 0.3f, seed_, draws_++);
        fill_normal(hv, nvo, 1, seed_, draws_++);
        for (int n = 0; n < N; n++) hact[n] = 1;
        h2d(dq, hq, nqk * 4);
        h2d(dk, hk, nqk * 4);
        h2d(dvv, hv, nvo * 4);
        poison(dout, nvo * 4);
        EXPECT_FAIL(pf_cuda_favor_state_step(NULL, dout, dq, dk, dvv, NULL, F32, 0), PF_EINVAL);
        EXPECT_FAIL(pf_cuda_favor_state_step(st, NULL, dq, dk, dvv, NULL, F32, 0), PF_EINVAL);
        EXPECT_FAIL(pf_cuda_favor_state_step(st, dout, NULL, dk, dvv, NULL, F32, 0), PF_EINVAL);
        EXPECT_FAIL(pf_cuda_favor_state_step(st, dout, dq, NULL, dvv, NULL, F32, 0), PF_EINVAL);
        EXPECT_FAIL(pf_cuda_favor_state_step(st, dout, dq, dk, NULL, NULL, F32, 0), PF_EINVAL);
        EXPECT_FAIL(pf_cuda_favor_state_step(st, ho, dq, dk, dvv, NULL, F32, 0), PF_EINVAL);
        EXPECT_FAIL(pf_cuda_favor_state_step(st, dout, hq, dk, dvv, NULL, F32, 0), PF_EINVAL);
        EXPECT_FAIL(pf_cuda_favor_state_step(st, dout, dq, hk, dvv, NULL, F32, 0), PF_EINVAL);
        EXPECT_FAIL(pf_cuda_favor_state_step(st, dout, dq, dk, hv, NULL, F32, 0), PF_EINVAL);
        EXPECT_FAIL(pf_cuda_favor_state_step(st, dout, dq, dk, dvv, hact, F32, 0), PF_EINVAL);
        EXPECT_FAIL(pf_cuda_favor_state_step(st, dout, dq, dk, dvv, NULL, (pf_cuda_dtype)7, 0),
                    PF_EINVAL);
        EXPECT_FAIL(pf_cuda_favor_state_step(st, dq, dq, dk, dvv, NULL, F32, 0), PF_EINVAL);
        EXPECT_FAIL(pf_cuda_favor_state_reset(NULL, NULL, 0), PF_EINVAL);
        int64_t pos[3] = {-1, -1, -1};
        EXPECT_FAIL(pf_cuda_favor_state_positions(NULL, pos, 0), PF_EINVAL);
        EXPECT_FAIL(pf_cuda_favor_state_positions(st, NULL, 0), PF_EINVAL);
        if (check_ok(pf_cuda_favor_state_positions(st, pos, 0), "g. positions"))
            CHECK(pos[0] == 0 && pos[1] == 0 && pos[2] == 0,
                  "g. refused steps moved the states: positions %" PRId64 " %" PRId64 " %" PRId64,
                  pos[0], pos[1], pos[2]);
        unsigned char *raw = xmalloc(nvo * 4);
        d2h(raw, dout, nvo * 4);
        CHECK(all_bytes(raw, nvo * 4, 0xFF), "g. a refused step wrote into out");
        /* q as out's twin is refused above; now a valid step still works */
        check_ok(pf_cuda_favor_state_step(st, dout, dq, dk, dvv, NULL, F32, 0), "g. a step");
        free(raw);
        free(hq);
        free(hk);
        free(hv);
        free(ho);
        free(hact);
        CU(cudaFree(dq));
        CU(cudaFree(dk));
        CU(cudaFree(dvv));
        CU(cudaFree(dout));
        pf_cuda_favor_state_free(st);
    }

    /* NaN and Inf in the inputs: PF_ENONFINITE, no NaN left in out; a NaN query row is zero */
    printf("g. non-finite inputs and zero denominators\n");
    static const pf_cuda_dtype dts[2] = {PF_CUDA_F32, PF_CUDA_F16};
    const size_t qbad = (((size_t)1 * H + 1) * L + 7) * d + 3; /* b 1, h 1, row 7 */
    const size_t kbad = (((size_t)0 * H + 1) * L + 12) * d;    /* b 0, h 1, row 12 */
    const size_t vbad = (((size_t)1 * H + 0) * L + 0) * dv + dv - 1;
    float *out = xmalloc(sizeof(float) * p.no);
    for (int di = 0; di < 2; di++) {
        const pf_cuda_dtype dt = dts[di];
        dev gd = dev_make(&p, dt);
        for (int causal = 0; causal < 2; causal++) {
            for (int which = 0; which < 3; which++) {
                float *x = which == 0 ? p.Q : which == 1 ? p.K : p.V;
                const size_t at = which == 0 ? qbad : which == 1 ? kbad : vbad;
                const size_t n = which == 0 ? p.nq : which == 1 ? p.nk : p.nv;
                void *dx = which == 0 ? gd.Q : which == 1 ? gd.K : gd.V;
                const float keep = x[at];
                x[at] = which == 1 ? INFINITY : NAN;
                upload(dx, x, n, dt);
                pf_attn_opts on = o;
                on.causal = causal;
                pf_status r = dev_run(&gd, out, &on, &f, pick_stream(which));
                char what[160];
                snprintf(what, sizeof what, "g. %s %s %s in %s", dt_name(dt),
                         causal ? "causal" : "bidir", which == 1 ? "Inf" : "NaN",
                         which == 0   ? "Q"
                         : which == 1 ? "K"
                                      : "V");
                CHECK(r == PF_ENONFINITE, "%s: %s (%s)", what, pf_status_str(r),
                      pf_cuda_last_error());
                size_t nonfinite = 0;
                for (size_t i = 0; i < p.no; i++) nonfinite += !isfinite(out[i]);
                CHECK(nonfinite == 0, "%s: %zu outputs not finite", what, nonfinite);
                if (which == 0) {
                    const float *row = out + (qbad / d) * dv;
                    int zero = 1;
                    for (int e = 0; e < dv; e++) zero &= row[e] == 0.0f;
                    CHECK(zero, "%s: the query's row is not zero", what);
                }
                printf("    %-32s %s, %zu non-finite outputs\n", what, pf_status_str(r), nonfinite);
                x[at] = keep;
                upload(dx, x, n, dt);
            }
            /* relu with eps 0 and every key zero: relu(0) = 0, every denominator 0 */
            float *zeros = calloc(p.nk, sizeof(float));
            upload(gd.K, zeros, p.nk, dt);
            pf_favor_opts fz = f;
            fz.kernel = PF_KERNEL_RELU;
            fz.eps = 0;
            pf_attn_opts on = o;
            on.causal = causal;
            pf_status r = dev_run(&gd, out, &on, &fz, 0);
            char what[160];
            snprintf(what, sizeof what, "g. %s %s relu eps 0, keys all zero", dt_name(dt),
                     causal ? "causal" : "bidir");
            CHECK(r == PF_EDOMAIN, "%s: %s (%s)", what, pf_status_str(r), pf_cuda_last_error());
            size_t nonzero = 0;
            for (size_t i = 0; i < p.no; i++) nonzero += out[i] != 0.0f;
            CHECK(nonzero == 0, "%s: %zu outputs not zero", what, nonzero);
            printf("    %-32s %s, %zu outputs not zero\n", what, pf_status_str(r), nonzero);
            /* eps > 0: the features are positive again */
            fz.eps = 1e-3f;
            check_ok(dev_run(&gd, out, &on, &fz, 0), "g. relu eps 1e-3, keys all zero");
            upload(gd.K, p.K, p.nk, dt);
            free(zeros);
        }
        dev_free(&gd);
    }
    printf("g. (a NaN or Inf token in decoding: f, the runs with bad tokens)\n");
    free(out);
    free(hout);
    free(hQ);
    free(hK);
    free(hV);
    CU(cudaFree(dl));
    dev_free(&g);
    problem_free(&p);
}

/* ---- h. workspace, memory, profile ----------------------------------------------------------- */

static void test_workspace(void) {
    printf("h. workspace, memory kinds, profile\n");
    /* pf_cuda_favor_workspace: linear in L (W is not read, but given) */
    float *dW = dmalloc(sizeof(float) * 256 * 64);
    CU(cudaMemset(dW, 0, sizeof(float) * 256 * 64));
    for (int causal = 0; causal < 2; causal++) {
        pf_attn_opts o = pf_attn_opts_default();
        o.causal = causal;
        pf_favor_opts f = pf_favor_opts_default();
        f.W = dW;
        f.m = 256;
        size_t ph[3] = {0, 0, 0}, fx = 0;
        for (int i = 0; i < 3; i++) {
            const int L = 4096 << i;
            pf_shape s = {1, 8, L, L, 64, 64};
            check_ok(pf_cuda_favor_workspace(&ph[i], &fx, PF_CUDA_BF16, &s, &o, &f),
                     "pf_cuda_favor_workspace");
        }
        /* per head: a + b L, up to the alignment of each buffer */
        const double d1 = (double)ph[1] - (double)ph[0], d2 = (double)ph[2] - (double)ph[1];
        printf("  h. workspace %s bf16 d64 m256 per head: %zu, %zu, %zu bytes at L = 4096, 8192, "
               "16384; fixed %zu\n",
               causal ? "causal" : "bidir", ph[0], ph[1], ph[2], fx);
        CHECK(ph[0] > 0 && d1 > 0 && d2 > 0, "h. per-head workspace does not grow with L");
        CHECK(fabs(d2 - 2 * d1) <= 0.01 * d2 + 65536,
              "h. per-head workspace not linear in L: "
              "%zu, %zu, %zu",
              ph[0], ph[1], ph[2]);
        CHECK(ph[0] >= (size_t)4096 * 64 && ph[0] < (size_t)4096 * 64 * 1024,
              "h. per-head workspace at L = 4096: %zu bytes", ph[0]);
        pf_shape s = {1, 8, 4096, 4096, 64, 64};
        check_ok(pf_cuda_favor_workspace(NULL, NULL, PF_CUDA_F32, &s, &o, &f),
                 "pf_cuda_favor_workspace(NULL, NULL, ...)");
    }
    CU(cudaFree(dW));

    /* a limit of 1 byte: one head at a time, the default's results; the context then holds less */
    const dims c = {2, 3, quick_ ? 300 : 1000, quick_ ? 300 : 1000, 64, 40, 256};
    static const pf_cuda_dtype dts[2] = {PF_CUDA_F32, PF_CUDA_BF16};
    for (int di = 0; di < 2; di++) {
        const pf_cuda_dtype dt = dts[di];
        problem p = problem_for(&c, PF_KERNEL_POSITIVE, 1, 0);
        problem_round(&p, dt);
        dev g = dev_make(&p, dt);
        float *a = xmalloc(sizeof(float) * p.no), *b = xmalloc(sizeof(float) * p.no),
              *ref = xmalloc(sizeof(float) * p.no);
        unsigned char *bits = xmalloc(g.bo);
        pf_favor_opts f = favor_of(&p, PF_KERNEL_POSITIVE, 1);
        pf_attn_opts o = pf_attn_opts_default();
        o.causal = 1;
        check_ok(pf_cuda_ctx_set_workspace_limit(ctx_, (size_t)1 << 30), "workspace limit 1 GiB");
        pf_cuda_ctx_trim(ctx_);
        check_ok(dev_run(&g, a, &o, &f, 0), "h. default limit");
        memcpy(bits, g.raw, g.bo);
        const size_t held_default = pf_cuda_ctx_bytes(ctx_);
        pf_cuda_ctx_trim(ctx_);
        const size_t held_trim = pf_cuda_ctx_bytes(ctx_);
        check_ok(pf_cuda_ctx_set_workspace_limit(ctx_, 1), "workspace limit 1");
        check_ok(dev_run(&g, b, &o, &f, stream_), "h. limit 1 byte");
        const size_t held_one = pf_cuda_ctx_bytes(ctx_);
        check_ok(pf_cuda_ctx_set_workspace_limit(ctx_, (size_t)1 << 30), "workspace limit 1 GiB");
        check_ok(pf_attn_favor(ref, p.Q, p.K, p.V, &p.s, &o, &f), "pf_attn_favor");
        const double tol = tol_of(dt);
        char what[200];
        snprintf(what, sizeof what,
                 "h. %s causal B2 H3 L%d: limit 1 byte against the default "
                 "(bits %s)",
                 dt_name(dt), c.Lq, memcmp(bits, g.raw, g.bo) ? "differ" : "same");
        report(what, nerr(b, a, p.no), tol);
        snprintf(what, sizeof what, "h. %s causal B2 H3 L%d: limit 1 byte against the CPU",
                 dt_name(dt), c.Lq);
        report(what, nerr(b, ref, p.no), tol);
        printf("    context bytes: %zu after the default run, %zu trimmed, %zu after the limited "
               "run\n",
               held_default, held_trim, held_one);
        CHECK(held_trim <= held_default, "h. trim grew the context: %zu -> %zu", held_default,
              held_trim);
        CHECK(held_one < held_default, "h. one head at a time held %zu bytes, all at once %zu",
              held_one, held_default);
        free(a);
        free(b);
        free(ref);
        free(bits);
        dev_free(&g);
        problem_free(&p);
    }

    /* W rewritten in place between two calls (a context must not keep a stale copy); managed
     * memory; K the same pointer as Q */
    {
        const dims c2 = {2, 3, 129, 129, 32, 32, 64};
        problem p = problem_for(&c2, PF_KERNEL_HYPERBOLIC, 0, 0);
        dev g = dev_make(&p, PF_CUDA_BF16);
        problem_round(&p, PF_CUDA_BF16);
        float *got = xmalloc(sizeof(float) * p.no), *ref = xmalloc(sizeof(float) * p.no);
        pf_favor_opts f = favor_of(&p, PF_KERNEL_HYPERBOLIC, 0);
        pf_attn_opts o = pf_attn_opts_default();
        o.causal = 1;
        check_ok(dev_run(&g, got, &o, &f, 0), "h. first W");
        pf_projection_draw(p.W, p.m, p.s.d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, seed_, draws_++);
        h2d(g.W, p.W, sizeof(float) * p.nw);
        check_ok(pf_attn_favor(ref, p.Q, p.K, p.V, &p.s, &o, &f), "pf_attn_favor");
        if (check_ok(dev_run(&g, got, &o, &f, stream_), "h. W rewritten"))
            report("h. bf16 causal: W rewritten in place, against the CPU with the new W",
                   nerr(got, ref, p.no), TOL_BF16);
        dev_free(&g);

        /* managed memory, float32 */
        problem q = problem_for(&c2, PF_KERNEL_POSITIVE, 1, 0);
        float *mQ, *mK, *mV, *mO, *mW;
        CU(cudaMallocManaged((void **)&mQ, sizeof(float) * q.nq, cudaMemAttachGlobal));
        CU(cudaMallocManaged((void **)&mK, sizeof(float) * q.nk, cudaMemAttachGlobal));
        CU(cudaMallocManaged((void **)&mV, sizeof(float) * q.nv, cudaMemAttachGlobal));
        CU(cudaMallocManaged((void **)&mO, sizeof(float) * q.no, cudaMemAttachGlobal));
        CU(cudaMallocManaged((void **)&mW, sizeof(float) * q.nw, cudaMemAttachGlobal));
        CU(cudaDeviceSynchronize());
        memcpy(mQ, q.Q, sizeof(float) * q.nq);
        memcpy(mK, q.K, sizeof(float) * q.nk);
        memcpy(mV, q.V, sizeof(float) * q.nv);
        memcpy(mW, q.W, sizeof(float) * q.nw);
        memset(mO, 0xFF, sizeof(float) * q.no);
        pf_favor_opts fm = favor_of(&q, PF_KERNEL_POSITIVE, 1);
        float *rq = xmalloc(sizeof(float) * q.no);
        check_ok(pf_attn_favor(rq, q.Q, q.K, q.V, &q.s, &o, &fm), "pf_attn_favor");
        fm.W = mW;
        if (check_ok(pf_cuda_favor(ctx_, mO, mQ, mK, mV, PF_CUDA_F32, &q.s, &o, &fm, stream_),
                     "h. managed memory")) {
            CU(cudaDeviceSynchronize());
            report("h. f32 causal: tensors in managed memory, against the CPU", nerr(mO, rq, q.no),
                   TOL_F32);
        }
        /* self-attention with K the same buffer as Q (inputs may alias; only out may not) */
        memset(mO, 0xFF, sizeof(float) * q.no);
        fm.W = q.W;
        check_ok(pf_attn_favor(rq, q.Q, q.Q, q.V, &q.s, &o, &fm), "pf_attn_favor");
        fm.W = mW;
        if (check_ok(pf_cuda_favor(ctx_, mO, mQ, mQ, mV, PF_CUDA_F32, &q.s, &o, &fm, 0),
                     "h. K = Q")) {
            CU(cudaDeviceSynchronize());
            report("h. f32 causal: K the same pointer as Q, against the CPU", nerr(mO, rq, q.no),
                   TOL_F32);
        }
        CU(cudaFree(mQ));
        CU(cudaFree(mK));
        CU(cudaFree(mV));
        CU(cudaFree(mO));
        CU(cudaFree(mW));
        free(rq);
        problem_free(&q);
        free(got);
        free(ref);
        problem_free(&p);
    }

    /* the stage profile */
    {
        static const char *const want[PF_CUDA_STAGES] = {"project",      "features", "weights",
                                                         "chunk_states", "prefix",   "scores",
                                                         "readout_mm",   "normalise"};
        const dims c3 = {1, 4, 2000, 2000, 64, 64, 256};
        problem p = problem_for(&c3, PF_KERNEL_POSITIVE, 0, 0);
        dev g = dev_make(&p, PF_CUDA_F16);
        pf_favor_opts f = favor_of(&p, PF_KERNEL_POSITIVE, 0);
        pf_attn_opts o = pf_attn_opts_default();
        o.causal = 1;
        check_ok(pf_cuda_ctx_profile(ctx_, 1), "pf_cuda_ctx_profile on");
        check_ok(dev_run(&g, NULL, &o, &f, stream_), "h. a profiled run");
        const char *names[PF_CUDA_STAGES];
        double ms[PF_CUDA_STAGES], flops[PF_CUDA_STAGES], bytes[PF_CUDA_STAGES], total = 0;
        if (check_ok(pf_cuda_ctx_stages(ctx_, names, ms, flops, bytes), "pf_cuda_ctx_stages")) {
            printf("    stages:");
            for (int i = 0; i < PF_CUDA_STAGES; i++) {
                CHECK(names[i] && strcmp(names[i], want[i]) == 0, "h. stage %d is \"%s\", not %s",
                      i, names[i] ? names[i] : "(NULL)", want[i]);
                CHECK(ms[i] >= 0 && isfinite(ms[i]) && flops[i] >= 0 && bytes[i] >= 0,
                      "h. stage %s: %g ms, %g flops, %g bytes", want[i], ms[i], flops[i], bytes[i]);
                total += ms[i];
                printf(" %s %.3f ms", want[i], ms[i]);
            }
            printf("\n");
            CHECK(total > 0, "h. the profiled stages took no time");
            CHECK(flops[0] > 0, "h. the projection did no flops");
        }
        check_ok(pf_cuda_ctx_stages(ctx_, NULL, NULL, NULL, NULL), "pf_cuda_ctx_stages(NULLs)");
        check_ok(pf_cuda_ctx_profile(ctx_, 0), "pf_cuda_ctx_profile off");
        dev_free(&g);
        problem_free(&p);
    }
}

/* ---- main ------------------------------------------------------------------------------------ */

/* What is refused before any GPU is touched (so these run everywhere): shapes whose chunk
 * rounding, widths or workspace would overflow, and the other argument checks of the plan,
 * through pf_cuda_favor_workspace; a NULL context. */
static void test_host_checks(void) {
    pf_shape s = {1, 2, 1000, 1000, 64, 64};
    pf_attn_opts o = pf_attn_opts_default();
    pf_favor_opts f = pf_favor_opts_default();
    f.m = 256;
    size_t per = 0, fixed = 0;
    CHECK_STATUS(pf_cuda_favor_workspace(&per, &fixed, PF_CUDA_BF16, &s, &o, &f), PF_OK);
    CHECK(per > 1000 * 256 * 2 && fixed >= 256 * 64 * 4, "workspace: per head %zu, fixed %zu",
          per, fixed);
    o.causal = 1;
    s.Lq = s.Lk = INT32_MAX; /* rounded up to chunks of 128, past INT32_MAX */
    CHECK_STATUS(pf_cuda_favor_workspace(&per, NULL, PF_CUDA_BF16, &s, &o, &f), PF_EINVAL);
    CHECK(strstr(pf_cuda_last_error(), "too large") != NULL, "Lq = INT32_MAX: '%s'",
          pf_cuda_last_error());
    o.causal = 0;
    s.Lk = INT32_MAX - 1000; /* a workspace past 2^50 bytes (L x m floats alone: 2^49) */
    s.Lq = 16;
    f.m = 65536;
    CHECK_STATUS(pf_cuda_favor_workspace(&per, NULL, PF_CUDA_F32, &s, &o, &f), PF_EINVAL);
    CHECK(strstr(pf_cuda_last_error(), "2^50") != NULL, "huge workspace: '%s'",
          pf_cuda_last_error());
    f.m = 256;
    o.causal = 1;
    s.Lq = s.Lk = 16;
    s.dv = INT32_MAX;
    CHECK_STATUS(pf_cuda_favor_workspace(&per, NULL, PF_CUDA_F32, &s, &o, &f), PF_EINVAL);
    s.dv = 64;
    s.B = 1 << 20, s.H = 1 << 10, s.d = 1 << 30; /* byte counts past size_t */
    CHECK_STATUS(pf_cuda_favor_workspace(&per, NULL, PF_CUDA_F32, &s, &o, &f), PF_EINVAL);
    s.B = 1, s.H = 2, s.d = 64;
    CHECK_STATUS(pf_cuda_favor_workspace(&per, NULL, (pf_cuda_dtype)7, &s, &o, &f), PF_EINVAL);
    f.kernel = PF_KERNEL_OPRF;
    CHECK_STATUS(pf_cuda_favor_workspace(&per, NULL, PF_CUDA_F32, &s, &o, &f), PF_ENOTSUP);
    f.kernel = PF_KERNEL_POSITIVE;
    CHECK_STATUS(pf_cuda_favor(NULL, NULL, NULL, NULL, NULL, PF_CUDA_F32, &s, &o, &f, 0),
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
        printf("test_cuda: skipped: no GPU (%s); the host-side checks: %d, %d failed\n",
               pf_cuda_last_error(), check_count_, check_failed_);
        return check_failed_ ? 1 : 0;
    }
    if (cuda_test_seed("test_cuda") != 0) return 2;
    test_converters();
    if (!check_ok(pf_cuda_ctx_create(&ctx_, 0), "pf_cuda_ctx_create")) TEST_MAIN_END();
    CU(cudaStreamCreate(&stream_));
    static void (*const cases[])(void) = {test_fp32,    test_half,   test_large,  test_causality,
                                          test_padding, test_decode, test_errors, test_workspace};
    cuda_test_cases("test_cuda", cases, names, only);
    CU(cudaStreamDestroy(stream_));
    pf_cuda_ctx_free(ctx_);
    TEST_MAIN_END();
}
