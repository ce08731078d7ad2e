/* test_half.c: half-precision inputs on the CPU (pf_attn_favor_dt, pf_favor_state_step_dt, .npy
 * float16).
 *
 * 1. Conversions. float16 -> float32 for all 65536 codes against the value decoded in double
 *    (sign, exponent, mantissa: exact); float32 -> float16 and -> bfloat16 against the nearest
 *    representable value found by search (ties to the even code), on special values, every
 *    halfway case near the boundaries, subnormals, overflow and a million random bit patterns;
 *    the row converters (F16C where the CPU has it) against the element functions.
 * 2. pf_attn_favor_dt against pf_attn_favor on the same inputs widened to float32, its output
 *    rounded to the dtype: bit for bit (the same kernels run on the same values), for every map
 *    that takes half inputs, bidirectional (Lq != Lk) and causal, padded keys, W per head,
 *    lengths over several blocks, at 1 and 2 threads; and within 1e-2 of the float64 reference.
 * 3. pf_favor_state_step_dt against pf_favor_state_step on the widened inputs: bit for bit.
 * 4. Refusals: an unknown or integer dtype, FAVOR++ and FAVOR#, out overlapping an input (as
 *    half-size elements), NULLs; a NaN or Inf in a half input is PF_ENONFINITE with no NaN out.
 * 5. .npy float16: written with descr '<f2' and read back with the same bits. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "internal.h"

/* ---- 1. conversions --------------------------------------------------------------------------- */

static double f16_value(uint16_t h) { /* the code's value, decoded independently */
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : (e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25));
    return s ? -v : v;
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The float16 code nearest to x (ties to the even code), by binary search over the positive
 * finite codes; |x| at or past 65520 (halfway to 2^16) is Inf. */
static uint16_t f16_nearest(float x) {
    const uint16_t sign = signbit(x) ? 0x8000 : 0;
    const double a = fabs((double)x);
    if (isnan(x)) return 0;
    if (a >= 65520.0) return sign | 0x7c00;
    int lo = 0, hi = 0x7bff;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (f16_value((uint16_t)mid) <= a) lo = mid;
        else hi = mid;
    }
    const double dl = a - f16_value((uint16_t)lo), dh = f16_value((uint16_t)hi) - a;
    int code = dl < dh ? lo : (dh < dl ? hi : ((lo & 1) ? hi : lo));
    if (a < f16_value((uint16_t)lo)) code = lo; /* (a below the first code: 0) */
    return (uint16_t)(sign | code);
}

static uint16_t bf16_nearest(float x) {
    const uint32_t u = bits(x);
    const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
    /* (past bfloat16's largest value the next step is 2^128, which rounds to Inf) */
    const double next = (hi & 0x7fffffffu) == 0x7f800000u ? ldexp(1.0, 128) : fabs((double)of_bits(hi));
    const double a = fabs((double)x), dl = a - fabs((double)of_bits(lo)), dh = next - a;
    const uint32_t pick = dl < dh ? lo : (dh < dl ? hi : ((lo >> 16) & 1 ? hi : lo));
    return (uint16_t)(pick >> 16);
}

static void test_conversions(void) {
    static float wide[65536];
    static uint16_t codes[65536];
    for (int h = 0; h < 65536; h++) codes[h] = (uint16_t)h;
    pf_rows_to_f32(wide, codes, PF_F16, 65536);
    int bad = 0;
    for (int h = 0; h < 65536; h++) {
        const double v = f16_value((uint16_t)h);
        const float f = pf_f16_to_f32((uint16_t)h);
        const int ok = isnan(v) ? isnan(f) && isnan(wide[h])
                                : (double)f == v && !signbit(f) == !signbit(v) &&
                                      bits(wide[h]) == bits(f);
        bad += !ok;
    }
    CHECK(bad == 0, "float16 -> float32: %d of 65536 codes wrong", bad);

    enum { NX = 1 << 20 };
    float *x = xmalloc(sizeof(float) * (NX + 64));
    int n = 0;
    const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.996f, 65520.0f, 65536.0f,
                             1e9f, -1e9f, INFINITY, -INFINITY, 0x1p-14f, 0x1p-24f, 0x1p-25f,
                             0x1.8p-25f, 0x1p-26f, 0x1.ff8p-15f, 3.0f * 0x1p-25f, 1e-40f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) x[n++] = special[i];
    /* halfway cases: midway between neighbouring float16 codes, every exponent */
    for (int h = 0; h < 0x7bff; h += 37) {
        x[n++] = (float)((f16_value((uint16_t)h) + f16_value((uint16_t)(h + 1))) / 2);
        if (n >= NX / 2) break;
    }
    uint64_t s = 0x9e3779b97f4a7c15ull;
    while (n < NX) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        const uint32_t u = (uint32_t)(s >> 11);
        const float f = of_bits(u);
        if (isnan(f)) continue;
        x[n++] = (u & 1) ? f : ldexpf(f, -100 + (int)((s >> 40) % 120)); /* near float16's range */
    }
    uint16_t *h16 = xmalloc(sizeof(uint16_t) * (size_t)n), *hb = xmalloc(sizeof(uint16_t) * (size_t)n);
    pf_rows_from_f32(h16, PF_F16, x, (size_t)n);
    pf_rows_from_f32(hb, PF_BF16, x, (size_t)n);
    int bad16 = 0, badrow = 0, badbf = 0;
    for (int i = 0; i < n; i++) {
        const uint16_t want = f16_nearest(x[i]), got = pf_f32_to_f16(x[i]);
        if (got != want) {
            if (bad16 < 5) printf("  float16 of %a: 0x%04x, expected 0x%04x\n", x[i], got, want);
            bad16++;
        }
        badrow += h16[i] != got;
        badbf += hb[i] != bf16_nearest(x[i]) || pf_f32_to_bf16(x[i]) != hb[i];
    }
    CHECK(bad16 == 0, "float32 -> float16: %d of %d wrong", bad16, n);
    CHECK(badrow == 0, "float32 -> float16 rows (F16C where present): %d differ", badrow);
    CHECK(badbf == 0, "float32 -> bfloat16: %d of %d wrong", badbf, n);
    /* NaN stays NaN both ways */
    const float qn = NAN;
    CHECK(isnan(pf_f16_to_f32(pf_f32_to_f16(qn))) && isnan(pf_bf16_to_f32(pf_f32_to_bf16(qn))),
          "NaN does not survive a round trip");
    printf("conversions: %d float16 codes, %d float32 values to float16 and bfloat16\n", 65536, n);
    free(x);
    free(h16);
    free(hb);
}

/* ---- 2. the attention call -------------------------------------------------------------------- */

static void round_rows(float *x, size_t n, pf_dtype dt, void *half) {
    pf_rows_from_f32(half, dt, x, n);
    pf_rows_to_f32(x, half, dt, n);
}

static void test_attention(void) {
    const pf_kernel kernels[4] = {PF_KERNEL_POSITIVE, PF_KERNEL_HYPERBOLIC, PF_KERNEL_TRIG,
                                  PF_KERNEL_RELU};
    const int lens[3] = {1, 37, 600};
    int cases = 0;
    double worst = 0;
    for (int dti = 0; dti < 2; dti++) {
        const pf_dtype dt = dti ? PF_BF16 : PF_F16;
        for (int k = 0; k < 4; k++)
            for (int li = 0; li < 3; li++)
                for (int causal = 0; causal < 2; causal++) {
                    const int B = 2, H = 3, L = lens[li], Lk = causal ? L : L + 5, d = 16,
                              dv = 12, m = 32, wph = (k + li) % 2;
                    pf_shape s = {B, H, L, Lk, d, dv};
                    const size_t nq = (size_t)B * H * L * d, nk = (size_t)B * H * Lk * d,
                                 nv = (size_t)B * H * Lk * dv, no = (size_t)B * H * L * dv;
                    float *Q = xmalloc(4 * nq), *K = xmalloc(4 * nk), *V = xmalloc(4 * nv);
                    float *o32 = xmalloc(4 * no), *W = xmalloc(4 * (size_t)H * m * d);
                    double *oref = NULL;
                    uint16_t *hq = xmalloc(2 * nq), *hk = xmalloc(2 * nk), *hv = xmalloc(2 * nv);
                    uint16_t *ho = xmalloc(2 * no), *want = xmalloc(2 * no);
                    const float sc = kernels[k] == PF_KERNEL_TRIG ? 0.3f : 0.5f;
                    fill_normal(Q, nq, sc, 7, (uint64_t)cases * 4);
                    fill_normal(K, nk, sc, 7, (uint64_t)cases * 4 + 1);
                    fill_normal(V, nv, 1.0f, 7, (uint64_t)cases * 4 + 2);
                    for (int h = 0; h < (wph ? H : 1); h++)
                        pf_projection_draw(W + (size_t)h * m * d, m, d, PF_PROJ_ORTHOGONAL,
                                           PF_NORM_CHI, 11, (uint64_t)h);
                    round_rows(Q, nq, dt, hq);
                    round_rows(K, nk, dt, hk);
                    round_rows(V, nv, dt, hv);
                    pf_attn_opts o = pf_attn_opts_default();
                    o.causal = causal;
                    int32_t klen[2] = {Lk, Lk > 3 ? Lk - 3 : Lk};
                    o.key_len = (li + k) % 2 ? klen : NULL;
                    pf_favor_opts f = pf_favor_opts_default();
                    f.kernel = kernels[k];
                    f.W = W;
                    f.m = m;
                    f.w_per_head = wph;
                    f.eps = kernels[k] == PF_KERNEL_RELU ? 1e-3f : 0.0f;
                    CHECK_STATUS(pf_attn_favor(o32, Q, K, V, &s, &o, &f), PF_OK);
                    pf_rows_from_f32(want, dt, o32, no);
                    for (int t = 1; t <= 2; t++) {
                        o.threads = t;
                        memset(ho, 0xff, 2 * no);
                        CHECK_STATUS(pf_attn_favor_dt(ho, hq, hk, hv, dt, &s, &o, &f), PF_OK);
                        CHECK(memcmp(ho, want, 2 * no) == 0,
                              "%s %s causal=%d L=%d threads=%d: not the float32 pass's bits",
                              dti ? "bf16" : "f16", pf_kernel_name(f.kernel), causal, L, t);
                    }
                    o.threads = 0;
                    if (L <= 37) { /* the float64 reference on the same rounded inputs */
                        float *oref32 = xmalloc(4 * no);
                        CHECK_STATUS(pf_attn_favor_ref(oref32, Q, K, V, &s, &o, &f), PF_OK);
                        double num = 0, den = 0;
                        for (size_t i = 0; i < no; i++) {
                            const float g = dti ? pf_bf16_to_f32(ho[i]) : pf_f16_to_f32(ho[i]);
                            num = fmax(num, fabs((double)g - oref32[i]));
                            den = fmax(den, fabs((double)oref32[i]));
                        }
                        const double e = num / den;
                        worst = fmax(worst, e);
                        CHECK(e < 1e-2, "%s %s causal=%d L=%d: %.3g from float64",
                              dti ? "bf16" : "f16", pf_kernel_name(f.kernel), causal, L, e);
                        free(oref32);
                    }
                    cases++;
                    free(Q), free(K), free(V), free(o32), free(W), free(oref);
                    free(hq), free(hk), free(hv), free(ho), free(want);
                }
    }
    printf("pf_attn_favor_dt: %d cases, the float32 pass's bits; %.3g at most from float64\n",
           cases, worst);
}

/* ---- 3. decoding ------------------------------------------------------------------------------ */

static void test_state(void) {
    const int H = 2, d = 16, dv = 8, m = 32, steps = 40;
    float *W = xmalloc(sizeof(float) * m * d);
    pf_projection_draw(W, m, d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 5, 0);
    pf_favor_opts f = pf_favor_opts_default();
    f.W = W;
    f.m = m;
    for (int dti = 0; dti < 2; dti++) {
        const pf_dtype dt = dti ? PF_BF16 : PF_F16;
        pf_favor_state *a = NULL, *b = NULL;
        CHECK_STATUS(pf_favor_state_create(&a, H, d, dv, 0.0f, &f), PF_OK);
        CHECK_STATUS(pf_favor_state_create(&b, H, d, dv, 0.0f, &f), PF_OK);
        int same = 1;
        for (int t = 0; t < steps; t++) {
            const int n = t % 7 == 3 ? 5 : 1; /* some multi-token steps */
            const size_t nq = (size_t)H * n * d, nv = (size_t)H * n * dv;
            float *q = xmalloc(4 * nq), *k = xmalloc(4 * nq), *v = xmalloc(4 * nv),
                  *o = xmalloc(4 * nv);
            uint16_t *hq = xmalloc(2 * nq), *hk = xmalloc(2 * nq), *hv = xmalloc(2 * nv),
                     *ho = xmalloc(2 * nv), *want = xmalloc(2 * nv);
            fill_normal(q, nq, 0.5f, 9, (uint64_t)t * 3);
            fill_normal(k, nq, 0.5f, 9, (uint64_t)t * 3 + 1);
            fill_normal(v, nv, 1.0f, 9, (uint64_t)t * 3 + 2);
            round_rows(q, nq, dt, hq);
            round_rows(k, nq, dt, hk);
            round_rows(v, nv, dt, hv);
            CHECK_STATUS(pf_favor_state_step(a, o, q, k, v, n), PF_OK);
            pf_rows_from_f32(want, dt, o, nv);
            CHECK_STATUS(pf_favor_state_step_dt(b, ho, hq, hk, hv, n, dt), PF_OK);
            same &= memcmp(ho, want, 2 * nv) == 0;
            free(q), free(k), free(v), free(o), free(hq), free(hk), free(hv), free(ho), free(want);
        }
        CHECK(same, "%s decoding: not pf_favor_state_step's bits", dti ? "bf16" : "f16");
        CHECK(pf_favor_state_position(b) == pf_favor_state_position(a), "positions differ");
        /* refusals */
        uint16_t buf[64] = {0};
        CHECK_STATUS(pf_favor_state_step_dt(b, buf, buf, buf, buf, 1, dt), PF_EINVAL); /* aliased */
        CHECK_STATUS(pf_favor_state_step_dt(b, buf, NULL, buf, buf, 1, dt), PF_EINVAL);
        CHECK_STATUS(pf_favor_state_step_dt(b, buf, buf + 32, buf + 32, buf + 32, 1, PF_I32),
                     PF_EINVAL);
        pf_favor_state_free(a);
        pf_favor_state_free(b);
    }
    free(W);
}

/* ---- 4. refusals ------------------------------------------------------------------------------ */

static void test_refusals(void) {
    const int B = 1, H = 2, L = 20, d = 8, dv = 8, m = 16;
    pf_shape s = {B, H, L, L, d, dv};
    const size_t n = (size_t)B * H * L * d;
    float W[16 * 8];
    pf_projection_draw(W, m, d, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 3, 0);
    float *x = xmalloc(4 * n);
    fill_normal(x, n, 0.5f, 4, 0);
    uint16_t *q = xmalloc(2 * n), *k = xmalloc(2 * n), *v = xmalloc(2 * n), *o = xmalloc(4 * n);
    pf_rows_from_f32(q, PF_F16, x, n);
    memcpy(k, q, 2 * n);
    memcpy(v, q, 2 * n);
    pf_attn_opts opts = pf_attn_opts_default();
    pf_favor_opts f = pf_favor_opts_default();
    f.W = W;
    f.m = m;
    CHECK_STATUS(pf_attn_favor_dt(o, q, k, v, PF_I32, &s, &opts, &f), PF_EINVAL);
    CHECK_STATUS(pf_attn_favor_dt(o, q, k, v, (pf_dtype)9, &s, &opts, &f), PF_EINVAL);
    CHECK_STATUS(pf_attn_favor_dt(NULL, q, k, v, PF_F16, &s, &opts, &f), PF_EINVAL);
    CHECK_STATUS(pf_attn_favor_dt(q, q, k, v, PF_F16, &s, &opts, &f), PF_EINVAL);
    /* out right after Q's half-size elements is not an overlap */
    uint16_t *two = xmalloc(4 * n);
    memcpy(two, q, 2 * n);
    CHECK_STATUS(pf_attn_favor_dt(two + n, two, k, v, PF_F16, &s, &opts, &f), PF_OK);
    /* ... one element into it is */
    CHECK_STATUS(pf_attn_favor_dt(two + n - 1, two, k, v, PF_F16, &s, &opts, &f), PF_EINVAL);
    pf_favor_opts fp = f;
    fp.kernel = PF_KERNEL_OPRF;
    CHECK_STATUS(pf_attn_favor_dt(o, q, k, v, PF_F16, &s, &opts, &fp), PF_ENOTSUP);
    fp.kernel = PF_KERNEL_SDERF;
    CHECK_STATUS(pf_attn_favor_dt(o, q, k, v, PF_BF16, &s, &opts, &fp), PF_ENOTSUP);
    /* a NaN (float16 0x7e00) or an Inf in K or V: PF_ENONFINITE, no NaN out */
    for (int c = 0; c < 2; c++) {
        for (int causal = 0; causal < 2; causal++) {
            uint16_t *bad = c ? v : k;
            const uint16_t keep = bad[37];
            bad[37] = c ? 0x7c00 : 0x7e00;
            opts.causal = causal;
            CHECK_STATUS(pf_attn_favor_dt(o, q, k, v, PF_F16, &s, &opts, &f), PF_ENONFINITE);
            int nan = 0;
            for (size_t i = 0; i < (size_t)B * H * L * dv; i++) nan |= (o[i] & 0x7c00) == 0x7c00;
            CHECK(!nan, "a NaN or Inf in the output after PF_ENONFINITE");
            bad[37] = keep;
        }
    }
    free(x), free(q), free(k), free(v), free(o), free(two);
}

/* ---- 5. .npy float16 ------------------------------------------------------------------------ */

static void test_npy(void) {
    char path[] = "/tmp/pf_test_half_XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    close(fd);
    uint16_t data[6] = {0x3c00, 0xbc00, 0x7bff, 0x0001, 0x8000, 0x3555};
    pf_array a = {.dtype = PF_F16, .ndim = 2, .shape = {2, 3}, .data = data};
    char err[256];
    CHECK_STATUS(pf_npy_write(path, &a, err, sizeof err), PF_OK);
    FILE *fp = fopen(path, "rb");
    char head[128] = {0};
    if (fp) {
        CHECK(fread(head, 1, sizeof head - 1, fp) > 20, "short file");
        fclose(fp);
    }
    CHECK(strstr(head + 10, "'descr': '<f2'") != NULL, "header: %s", head + 10);
    pf_array b;
    CHECK_STATUS(pf_npy_read(path, &b, err, sizeof err), PF_OK);
    CHECK(b.dtype == PF_F16 && b.ndim == 2 && b.shape[0] == 2 && b.shape[1] == 3 &&
              memcmp(b.data, data, sizeof data) == 0,
          "float16 .npy read back differs");
    pf_array_free(&b);
    pf_array c = {.dtype = PF_BF16, .ndim = 1, .shape = {6}, .data = data};
    CHECK(pf_npy_write(path, &c, err, sizeof err) == PF_EINVAL, "bfloat16 .npy written");
    unlink(path);
}

int main(void) {
    CHECK(pf_dtype_size(PF_F32) == 4 && pf_dtype_size(PF_F16) == 2 &&
              pf_dtype_size(PF_BF16) == 2 && pf_dtype_size(PF_I64) == 8 &&
              pf_dtype_size((pf_dtype)9) == 0,
          "pf_dtype_size");
    test_conversions();
    test_attention();
    test_state();
    test_refusals();
    test_npy();
    TEST_MAIN_END();
}
