/* test_simd.c: every vector-kernel path this CPU can run, against libm in double.
 *
 * exp is checked on a dense grid over the whole range where float exp is finite and normal,
 * [-87.3, 88.7], plus the edges: subnormal results, overflow to +inf, underflow to 0, NaN and
 * +/-inf inputs. The bound: max relative error 2^-22 (about 2.4e-7, i.e. 2 ulp) for normal
 * results (measured here: 1 ulp; the Cephes polynomial with a Cody-Waite split).
 *
 * The vector paths' exp are the same bits (check_exp_paths: a float in every 97 bit patterns).
 *
 * sincos: see check_sincos (absolute error 2^-23 for |x| <= 1e4, 2 ulp for |x| <= pi/4, libm's
 * own floats beyond 8192 and for Inf and NaN, every tail length, in place). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "internal.h"
#include "simd/simd.h"

static void check_table(const pf_simd_table *t) {
    const size_t n = 1u << 20;
    float *x = xmalloc(n * sizeof *x), *y = xmalloc(n * sizeof *y);
    const double lo = -87.3, hi = 88.7;
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * (double)i / (double)(n - 1));
    t->exp(y, x, n);
    double worst = 0;
    float worst_x = 0;
    for (size_t i = 0; i < n; i++) {
        double ref = exp((double)x[i]);
        double e = fabs((double)y[i] - ref) / ref;
        if (!(e <= worst)) {
            worst = e;
            worst_x = x[i];
        }
    }
    printf("%s: exp max relative error %.3g (%.2f ulp) at x = %.7g\n", t->name, worst,
           worst / FLT_EPSILON, worst_x);
    CHECK(worst < ldexp(1.0, -22), "%s: exp max rel error %.3g at x=%.7g", t->name, worst,
          worst_x);

    /* Edges. Subnormal results keep an absolute error of a few subnormal ulps. */
    float ex[] = {NAN, INFINITY, -INFINITY, 89.0f, 100.0f, -104.0f, -200.0f, 0.0f, -0.0f,
                  88.72f, -87.5f, -95.0f, -100.0f, 1e-30f, -1e-30f};
    size_t ne = sizeof ex / sizeof ex[0];
    float ey[sizeof ex / sizeof ex[0]];
    t->exp(ey, ex, ne);
    CHECK(isnan(ey[0]), "%s: exp(NaN) = %g", t->name, ey[0]);
    CHECK(isinf(ey[1]) && ey[1] > 0, "%s: exp(+inf) = %g", t->name, ey[1]);
    CHECK(ey[2] == 0.0f, "%s: exp(-inf) = %g", t->name, ey[2]);
    CHECK(isinf(ey[3]) && isinf(ey[4]), "%s: exp(89), exp(100) = %g, %g", t->name, ey[3], ey[4]);
    CHECK(ey[5] == 0.0f && ey[6] == 0.0f, "%s: exp(-104), exp(-200) = %g, %g", t->name, ey[5],
          ey[6]);
    CHECK(ey[7] == 1.0f && ey[8] == 1.0f, "%s: exp(+-0) = %g, %g", t->name, ey[7], ey[8]);
    CHECK_CLOSE(ey[9], exp((double)ex[9]), 0, 1e-6);
    for (size_t i = 10; i < 13; i++) CHECK_CLOSE(ey[i], exp((double)ex[i]), 8 * 1.4e-45, 1e-6);
    CHECK(ey[13] == 1.0f && ey[14] == 1.0f, "%s: exp(tiny) = %g, %g", t->name, ey[13], ey[14]);

    /* Every tail length: the vector paths handle n mod 8/16 separately. exp_sub_sum's sum is
     * compared with a double sum of libm values. */
    for (size_t len = 0; len <= 40; len++) {
        float xs[40], ys[40];
        double ref_sum = 0;
        for (size_t i = 0; i < len; i++) {
            xs[i] = (float)(0.37 * (double)i - 5.0);
            ref_sum += exp((double)xs[i] - 2.5);
        }
        double s = t->exp_sub_sum(ys, xs, 2.5f, len);
        CHECK_CLOSE(s, ref_sum, 1e-30, 1e-6);
        for (size_t i = 0; i < len; i++) CHECK_CLOSE(ys[i], exp((double)xs[i] - 2.5), 0, 5e-7);
        float m = t->max(xs, len);
        float mref = -INFINITY;
        for (size_t i = 0; i < len; i++) mref = xs[i] > mref ? xs[i] : mref;
        CHECK(m == mref, "%s: max of %zu = %g, expected %g", t->name, len, m, mref);
    }
    free(x);
    free(y);
}

/* ---- sincos ------------------------------------------------------------------------------ */

/* The spacing of floats at |v| (v a double): 2^(e-24) for |v| in [2^(e-1), 2^e), 2^-149 below
 * FLT_MIN. */
static double float_ulp(double v) {
    v = fabs(v);
    if (v < FLT_MIN) return ldexp(1.0, -149);
    int e;
    frexp(v, &e);
    return ldexp(1.0, e - 24);
}

typedef struct {
    double abs, ulp;    /* max |y - ref| and max |y - ref| / ulp(ref), y in {sin x, cos x} */
    float abs_x, ulp_x; /* where */
} sc_worst;

static void sc_measure(sc_worst *w, const float *x, const float *s, const float *c, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const double xd = (double)x[i], ref[2] = {sin(xd), cos(xd)};
        const float y[2] = {s[i], c[i]};
        for (int k = 0; k < 2; k++) {
            const double e = fabs((double)y[k] - ref[k]), u = e / float_ulp(ref[k]);
            if (!(e <= w->abs)) {
                w->abs = e;
                w->abs_x = x[i];
            }
            if (!(u <= w->ulp)) {
                w->ulp = u;
                w->ulp_x = x[i];
            }
        }
    }
}

/* sin and cos against libm in double.
 *
 * range: |x| <= 1e4 (what the trig map meets, and more: |u| = |w.x'| is rarely above 50): a
 * uniform grid over [-1e4, 1e4], a finer one over [-2 pi, 2 pi], and the floats nearest
 * k pi/2 (k <= 6500) with their neighbours, where the reduction cancels most. The bound is
 * absolute, 2^-23 = 1.2e-7: two float ulps at 1, i.e. the features are float roundings of the
 * exact values (the reduction rounds twice at 2^-24 relative to |r| <= pi/4, the polynomials
 * add 1e-8 relative, the result rounds once; the analysis is in src/simd/simd.h).
 * The AVX2 and AVX-512 paths (FMA: a 3-part split of 24-bit floats) also stay within 2 ulp of
 * the result itself there; the portable one (no FMA: the Cephes split) is off by up to 1e-11
 * absolute, which is many ulps of sin x only where x is within 1e-8 of a multiple of pi.
 * small: |x| <= pi/4 (no reduction: r = x), including [1e-30, 1e-3] where sin x ~ x must be
 * relatively accurate: the bound is 2 ulp of the result itself.
 * fallback: |x| > PF_SINCOS_MAX (8192), huge, Inf, NaN: the libm floats themselves. */
static void check_sincos(const pf_simd_table *t) {
    const size_t n1 = 1u << 21, n2 = 1u << 20, nk = 6500, n3 = 1u << 16;
    const size_t nr = n1 + n2 + nk * 2 * 5, ns = 2 * n3 + n2;
    float *x = xmalloc(nr * sizeof *x), *s = xmalloc(nr * sizeof *s);
    float *c = xmalloc(nr * sizeof *c);
    const double pi = 3.14159265358979323846;

    /* range */
    size_t n = 0;
    for (size_t i = 0; i < n1; i++) x[n++] = (float)(-1e4 + 2e4 * (double)i / (double)(n1 - 1));
    for (size_t i = 0; i < n2; i++)
        x[n++] = (float)(-2 * pi + 4 * pi * (double)i / (double)(n2 - 1));
    for (size_t k = 1; k <= nk; k++) {
        for (int sg = -1; sg <= 1; sg += 2) {
            float v = (float)(sg * (double)k * pi / 2);
            x[n++] = v;
            x[n++] = nextafterf(v, INFINITY);
            x[n++] = nextafterf(nextafterf(v, INFINITY), INFINITY);
            x[n++] = nextafterf(v, -INFINITY);
            x[n++] = nextafterf(nextafterf(v, -INFINITY), -INFINITY);
        }
    }
    CHECK(n == nr, "grid size %zu", n);
    t->sincos(s, c, x, n);
    sc_worst wr = {0, 0, 0, 0};
    sc_measure(&wr, x, s, c, n);
    printf("%s: sincos |x| <= 1e4: max abs error %.3g (%.2f x 2^-24) at x = %.9g; "
           "max %.3g ulp of the result at x = %.9g\n",
           t->name, wr.abs, wr.abs / ldexp(1.0, -24), wr.abs_x, wr.ulp, wr.ulp_x);
    CHECK(wr.abs <= ldexp(1.0, -23), "%s: sincos abs error %.3g at x = %.9g", t->name, wr.abs,
          wr.abs_x);
    /* with FMA the reduction is accurate relative to r too (simd.h): 2 ulp of the result (the
     * NEON path runs the portable sincos, so the portable bound) */
    if (strcmp(t->name, "ref") != 0 && strcmp(t->name, "neon") != 0)
        CHECK(wr.ulp <= 2.0, "%s: sincos error %.3g ulp at x = %.9g", t->name, wr.ulp, wr.ulp_x);

    /* small */
    n = 0;
    for (size_t i = 0; i < n3; i++) {
        const float v = (float)pow(10.0, -30.0 + 27.0 * (double)i / (double)(n3 - 1));
        x[n++] = v;
        x[n++] = -v;
    }
    for (size_t i = 0; i < n2; i++) x[n++] = (float)(-pi / 4 + pi / 2 * (double)i / (double)n2);
    CHECK(n == ns, "grid size %zu", n);
    t->sincos(s, c, x, n);
    sc_worst ws = {0, 0, 0, 0};
    sc_measure(&ws, x, s, c, n);
    printf("%s: sincos |x| <= pi/4: max %.3g ulp of the result at x = %.9g\n", t->name, ws.ulp,
           ws.ulp_x);
    CHECK(ws.ulp <= 2.0, "%s: sincos error %.3g ulp at x = %.9g", t->name, ws.ulp, ws.ulp_x);

    /* fallback and special values */
    const float fx[] = {8192.0f, -8192.0f, 8192.001f,  -8192.001f, 8193.0f,  1e4f,
                        -1e4f,   1e5f,     -123456.7f, 1e10f,      3e38f,    -FLT_MAX,
                        FLT_MAX, 0.0f,     -0.0f,      FLT_MIN,    -FLT_MIN, 1e-45f,
                        -1e-45f, INFINITY, -INFINITY,  NAN};
    const size_t nf = sizeof fx / sizeof fx[0];
    float fs[sizeof fx / sizeof fx[0]], fc[sizeof fx / sizeof fx[0]];
    t->sincos(fs, fc, fx, nf);
    for (size_t i = 0; i < nf; i++) {
        if (!(fabsf(fx[i]) > PF_SINCOS_MAX)) continue;
        if (isnan(sinf(fx[i]))) {
            CHECK(isnan(fs[i]) && isnan(fc[i]), "%s: sincos(%g) = %g, %g", t->name, fx[i],
                  fs[i], fc[i]);
        } else {
            CHECK(fs[i] == sinf(fx[i]) && fc[i] == cosf(fx[i]),
                  "%s: sincos(%.9g) = %.9g, %.9g; libm %.9g, %.9g", t->name, fx[i], fs[i], fc[i],
                  sinf(fx[i]), cosf(fx[i]));
        }
    }
    for (size_t i = 0; i < nf; i++) {
        if (!isfinite(fx[i])) continue;
        CHECK_CLOSE(fs[i], sin((double)fx[i]), ldexp(1.0, -23), 0);
        CHECK_CLOSE(fc[i], cos((double)fx[i]), ldexp(1.0, -23), 0);
    }
    CHECK(fs[13] == 0.0f && !signbit(fs[13]) && fc[13] == 1.0f, "%s: sincos(+0) = %g, %g",
          t->name, fs[13], fc[13]);
    CHECK(fs[14] == 0.0f && signbit(fs[14]) && fc[14] == 1.0f, "%s: sincos(-0) = %g, %g",
          t->name, fs[14], fc[14]);
    CHECK(fs[17] == 1e-45f && fs[18] == -1e-45f, "%s: sin(+-1e-45) = %g, %g", t->name, fs[17],
          fs[18]);
    for (size_t i = nf - 3; i < nf; i++)
        CHECK(isnan(fs[i]) && isnan(fc[i]), "%s: sincos(%g) = %g, %g", t->name, fx[i], fs[i],
              fc[i]);

    /* Every tail length, with lanes for libm among the others, out of place and in place (s or
     * c is x): the same bits, and nothing written past n. */
    for (size_t len = 0; len <= 40; len++) {
        float xs[48], ss[48], cs[48], b1[48], c1[48], b2[48], s2[48];
        for (size_t i = 0; i < 48; i++) {
            xs[i] = i % 7 == 3 ? (float)(1e5 + 977.0 * (double)i) : (float)(0.37 * (double)i - 5);
            if (i == 12) xs[i] = NAN;
            ss[i] = cs[i] = c1[i] = s2[i] = 777.0f;
        }
        memcpy(b1, xs, sizeof xs);
        memcpy(b2, xs, sizeof xs);
        t->sincos(ss, cs, xs, len);
        t->sincos(b1, c1, b1, len); /* s is x */
        t->sincos(s2, b2, b2, len); /* c is x */
        int ok = 1;
        for (size_t i = 0; i < len; i++) {
            const double xd = (double)xs[i];
            if (i == 12) {
                ok &= isnan(ss[i]) && isnan(cs[i]);
            } else {
                ok &= fabs((double)ss[i] - sin(xd)) <= ldexp(1.0, -23);
                ok &= fabs((double)cs[i] - cos(xd)) <= ldexp(1.0, -23);
            }
            ok &= memcmp(&b1[i], &ss[i], sizeof(float)) == 0;
            ok &= memcmp(&c1[i], &cs[i], sizeof(float)) == 0;
            ok &= memcmp(&s2[i], &ss[i], sizeof(float)) == 0;
            ok &= memcmp(&b2[i], &cs[i], sizeof(float)) == 0;
        }
        for (size_t i = len; i < 48; i++)
            ok &= ss[i] == 777.0f && cs[i] == 777.0f && c1[i] == 777.0f && s2[i] == 777.0f &&
                  memcmp(&b1[i], &xs[i], sizeof(float)) == 0;
        CHECK(ok, "%s: sincos of %zu values (out of place, in place)", t->name, len);
    }
    free(x);
    free(s);
    free(c);
}

/* stream_rows copies exactly: rows of every width up to 40 (whole vectors and not), source row
 * strides longer than the width, destinations aligned to 64 bytes and not (the fallback), and
 * nothing past the n rows is written. */
static void check_stream_rows(const pf_simd_table *t) {
    enum { ROWS = 7, MAXR = 40, LDS = 53 };
    float *src = xmalloc(sizeof(float) * ROWS * LDS);
    float *buf = pf_alloc((size_t)ROWS * MAXR + 64, sizeof(float));
    CHECK(buf != NULL, "alloc");
    if (!buf) return;
    for (int i = 0; i < ROWS * LDS; i++) src[i] = (float)i * 0.5f - 3.0f;
    int bad = 0;
    for (int shift = 0; shift <= 3; shift++) { /* 0: 64-byte aligned; 1..3 floats off */
        for (int r = 1; r <= MAXR; r++) {
            for (int n = 0; n <= ROWS; n++) {
                float *dst = buf + shift;
                for (int i = 0; i < ROWS * MAXR + 60; i++) buf[i] = -999.0f;
                t->stream_rows(dst, src, LDS, (size_t)n, (size_t)r);
                for (int i = 0; i < n; i++)
                    for (int k = 0; k < r; k++)
                        if (dst[i * r + k] != src[i * LDS + k]) bad++;
                for (int i = n * r + shift; i < ROWS * MAXR + 60; i++)
                    if (buf[i] != -999.0f) bad++;
                for (int i = 0; i < shift; i++)
                    if (buf[i] != -999.0f) bad++;
            }
        }
    }
    CHECK(bad == 0, "%s: stream_rows: %d wrong floats", t->name, bad);
    free(src);
    pf_free(buf);
}

/* The vector paths' exp give the same bits (simd.h), NaN for NaN: a float in 97 of every bit
 * pattern, in vectors that mix the AVX2 kernel's two ways (every x in [-86.5, 88], or not). */
static void check_exp_paths(const pf_simd_table *a, const pf_simd_table *b) {
    const size_t n = 1u << 20;
    float *x = xmalloc(n * sizeof *x), *ya = xmalloc(n * sizeof *ya), *yb = xmalloc(n * sizeof *yb);
    uint64_t u = 0, bad = 0, seen = 0;
    while (u < (1ull << 32)) {
        size_t len = 0;
        for (; len < n && u < (1ull << 32); len++, u += 97) {
            const uint32_t bits = (uint32_t)u;
            memcpy(&x[len], &bits, sizeof bits);
        }
        a->exp(ya, x, len);
        b->exp(yb, x, len);
        for (size_t i = 0; i < len; i++)
            if (memcmp(&ya[i], &yb[i], sizeof(float)) != 0 && !(isnan(ya[i]) && isnan(yb[i])))
                bad++;
        seen += len;
    }
    CHECK(bad == 0, "exp: %s and %s differ in %llu of %llu floats", a->name, b->name,
          (unsigned long long)bad, (unsigned long long)seen);
    free(x), free(ya), free(yb);
}

int main(void) {
    const char *names[] = {"ref", "avx2", "avx512", "neon"};
    int ran = 0;
    for (int i = 0; i < 4; i++) {
        const pf_simd_table *t = pf_simd_get(names[i]);
        if (!t) {
            printf("%s: not supported by this CPU, skipped\n", names[i]);
            continue;
        }
        CHECK(strcmp(t->name, names[i]) == 0, "table name %s", t->name);
        check_table(t);
        check_sincos(t);
        check_stream_rows(t);
        ran++;
    }
    CHECK(ran >= 1, "no table ran");
    if (pf_simd_get("avx2") && pf_simd_get("avx512"))
        check_exp_paths(pf_simd_get("avx2"), pf_simd_get("avx512"));
    CHECK(pf_simd() != NULL, "no table chosen");
    printf("chosen: %s\n", pf_simd()->name);
    /* pf_exp, the public face of the chosen table's exp: its bits, in place too, and within
     * 2 ulp of double's exp over [-104, 88.7] */
    enum { N = 1003 };
    static float x[N], y[N], z[N];
    for (int i = 0; i < N; i++) x[i] = -104.0f + 192.7f * (float)i / (N - 1);
    pf_exp(y, x, N);
    pf_simd()->exp(z, x, N);
    CHECK(memcmp(y, z, sizeof(y)) == 0, "pf_exp differs from the table's exp");
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double r = exp((double)x[i]);
        if (r > 1e-37) worst = fmax(worst, fabs((double)y[i] - r) / r);
    }
    CHECK(worst <= 2.5e-7, "pf_exp: worst relative error %.3g", worst);
    memcpy(z, x, sizeof(z));
    pf_exp(z, z, N);
    CHECK(memcmp(y, z, sizeof(y)) == 0, "pf_exp in place differs");
    pf_exp(NULL, NULL, 0); /* nothing to do */
    TEST_MAIN_END();
}
