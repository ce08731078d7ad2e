/* test_rng.c: Philox4x32-10 known answers, stream layout, determinism, and the moments of the
 * uniform and normal outputs.
 *
 * Statistical bounds: every moment check compares a sample mean over n draws with its exact
 * value and allows 5 standard errors, SE = sqrt(Var / n) with Var the exact variance of the
 * summand. By the CLT a correct generator fails one such check with probability ~6e-7; the
 * seeds are fixed, so the test is deterministic. */
#include <stdint.h>
#include <string.h>

#include "check.h"

#define N_SAMPLES 1000000

static void test_kat(void) {
    /* Random123's known-answer vectors for philox4x32_10 (its tests/kat_vectors; the same
     * three are in TensorFlow's Philox tests): zeros, all ones, and the digits of pi. */
    static const struct { uint32_t ctr[4], key[2], out[4]; } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        pf_philox4x32_10(kat[i].ctr, kat[i].key, out);
        for (int j = 0; j < 4; j++) {
            CHECK(out[j] == kat[i].out[j], "kat %d word %d: got %08x, expected %08x", i, j,
                  out[j], kat[i].out[j]);
        }
    }
}

/* The generator's words are philox(ctr = (block lo, block hi, stream lo, stream hi),
 * key = (seed lo, seed hi)), block after block, four words each. */
static void test_layout(void) {
    const uint64_t seed = 0x0123456789abcdefULL, stream = 0xfedcba9876543210ULL;
    pf_rng rng;
    CHECK_STATUS(pf_rng_init(&rng, seed, stream), PF_OK);
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    for (uint32_t b = 0; b < 3; b++) {
        uint32_t ctr[4] = {b, 0, (uint32_t)stream, (uint32_t)(stream >> 32)}, ref[4];
        pf_philox4x32_10(ctr, key, ref);
        for (int j = 0; j < 4; j++) {
            uint32_t got = pf_rng_u32(&rng);
            CHECK(got == ref[j], "block %u word %d: %08x vs %08x", b, j, got, ref[j]);
        }
    }
    /* the block counter is 64 bits: after block 2^32 - 1 comes block 2^32 = (0, 1) */
    rng.ctr[0] = 0xffffffffu;
    rng.ctr[1] = 0;
    rng.used = 4;
    for (int j = 0; j < 4; j++) pf_rng_u32(&rng);
    uint32_t ctr[4] = {0, 1, (uint32_t)stream, (uint32_t)(stream >> 32)}, ref[4];
    pf_philox4x32_10(ctr, key, ref);
    CHECK(pf_rng_u32(&rng) == ref[0], "counter carry into the high word");
}

/* The uniform mapping and Box-Muller against an independent Python implementation (Philox
 * written from the paper with Python integers, u = (k + 0.5) 2^-52 from the top 52 bits of two
 * words, math.log/sqrt/sin/cos): the first values of (seed 42, stream 7) and of
 * (seed 0x0123456789abcdef, stream 3). Libms may differ by an ulp or so: rtol 1e-14. */
static void test_python_reference(void) {
    static const double z_ref[8] = {-1.1917784202360697, 0.6185121369693382,
                                    -0.42958519782987814, -0.17553083470643774,
                                    -1.0569981046932508, 1.6599074888162972,
                                    -1.02792033814408,    -0.18566238149452632};
    static const double u_ref[4] = {0.30902115284826526, 0.18124978638711797,
                                    0.9369088003208826, 0.2055169486254086};
    pf_rng rng;
    pf_rng_init(&rng, 42, 7);
    for (int i = 0; i < 8; i++) CHECK_CLOSE(pf_rng_normal(&rng), z_ref[i], 0, 1e-14);
    pf_rng_init(&rng, 0x0123456789abcdefULL, 3);
    for (int i = 0; i < 4; i++) CHECK_CLOSE(pf_rng_uniform(&rng), u_ref[i], 0, 0);
}

static void test_determinism(void) {
    enum { n = 4096 };
    static uint32_t a[n], b[n], c[n], e[n];
    pf_rng r1, r2, r3, r4;
    pf_rng_init(&r1, 42, 7);
    pf_rng_init(&r2, 42, 7);
    pf_rng_init(&r3, 42, 8);
    pf_rng_init(&r4, 43, 7);
    for (int i = 0; i < n; i++) {
        a[i] = pf_rng_u32(&r1);
        b[i] = pf_rng_u32(&r2);
        c[i] = pf_rng_u32(&r3);
        e[i] = pf_rng_u32(&r4);
    }
    CHECK(memcmp(a, b, sizeof(a)) == 0, "same (seed, stream) must give the same words");
    int same_stream = 0, same_seed = 0;
    for (int i = 0; i < n; i++) {
        same_stream += a[i] == c[i];
        same_seed += a[i] == e[i];
    }
    /* independent 32-bit words agree with probability 2^-32: expect 0 of 4096 */
    CHECK(same_stream <= 1, "streams 7 and 8 agree in %d of %d words", same_stream, n);
    CHECK(same_seed <= 1, "seeds 42 and 43 agree in %d of %d words", same_seed, n);

    /* normals too, including the Box-Muller spare */
    pf_rng_init(&r1, 5, 0);
    pf_rng_init(&r2, 5, 0);
    int eq = 1;
    for (int i = 0; i < 1001; i++) eq &= pf_rng_normal(&r1) == pf_rng_normal(&r2);
    CHECK(eq, "normal sequences differ for the same (seed, stream)");
}

static void test_uniform(void) {
    pf_rng rng;
    pf_rng_init(&rng, 2024, 1);
    double s1 = 0, s2 = 0, lo = 1, hi = 0;
    enum { bins = 100 };
    long count[bins] = {0};
    for (int i = 0; i < N_SAMPLES; i++) {
        double u = pf_rng_uniform(&rng);
        s1 += u;
        s2 += (u - 0.5) * (u - 0.5);
        lo = fmin(lo, u);
        hi = fmax(hi, u);
        count[(int)(u * bins)]++;
    }
    double n = N_SAMPLES;
    double mean = s1 / n, var = s2 / n;
    CHECK(lo > 0 && hi < 1, "uniform out of (0,1): min %g max %g", lo, hi);
    /* Var(U) = 1/12; Var((U - 1/2)^2) = 1/80 - 1/144 = 1/180 */
    double se_mean = sqrt(1.0 / 12 / n), se_var = sqrt(1.0 / 180 / n);
    CHECK_CLOSE(mean, 0.5, 5 * se_mean, 0);
    CHECK_CLOSE(var, 1.0 / 12, 5 * se_var, 0);
    /* Pearson chi-square over 100 equal bins: 99 degrees of freedom, mean 99, sd sqrt(198);
     * 99 + 5 sd = 169 */
    double chi2 = 0, expect = n / bins;
    for (int b = 0; b < bins; b++) chi2 += (count[b] - expect) * (count[b] - expect) / expect;
    CHECK(chi2 < 99 + 5 * sqrt(198.0), "uniform histogram chi2 = %.1f", chi2);
    printf("uniform, n = %d: mean %.6f (%.2f SE), var %.6f (%.2f SE), chi2(99) = %.1f\n",
           N_SAMPLES, mean, (mean - 0.5) / se_mean, var, (var - 1.0 / 12) / se_var, chi2);

    /* the extremes of the mapping: all-zero bits and all-one bits stay inside (0,1) */
    pf_rng_init(&rng, 0, 0);
    rng.buf[0] = rng.buf[1] = 0;
    rng.used = 0;
    double u0 = pf_rng_uniform(&rng);
    rng.buf[0] = rng.buf[1] = 0xffffffffu;
    rng.used = 0;
    double u1 = pf_rng_uniform(&rng);
    CHECK(u0 > 0 && u0 == 0x1p-53, "smallest uniform %a", u0);
    CHECK(u1 < 1 && u1 == 1 - 0x1p-53, "largest uniform %a", u1);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void test_normal(void) {
    pf_rng rng;
    pf_rng_init(&rng, 99, 3);
    double s1 = 0, s2 = 0, s4 = 0, s11 = 0, tail = 0;
    for (int i = 0; i < N_SAMPLES; i += 2) {
        double z0 = pf_rng_normal(&rng), z1 = pf_rng_normal(&rng);  /* one Box-Muller pair */
        s1 += z0 + z1;
        s2 += z0 * z0 + z1 * z1;
        s4 += z0 * z0 * z0 * z0 + z1 * z1 * z1 * z1;
        s11 += z0 * z1;
        tail += (fabs(z0) > 3) + (fabs(z1) > 3);
    }
    double n = N_SAMPLES;
    double m1 = s1 / n, m2 = s2 / n, m4 = s4 / n, c01 = s11 / (n / 2), pt = tail / n;
    /* Var Z = 1, Var Z^2 = 3 - 1 = 2, Var Z^4 = 105 - 9 = 96, Var(z0 z1) = 1 (independent);
     * Pr[|Z| > 3] = erfc(3/sqrt 2) = 0.0026998, a binomial proportion */
    double p3 = erfc(3 / sqrt(2.0));
    CHECK_CLOSE(m1, 0, 5 * sqrt(1 / n), 0);
    CHECK_CLOSE(m2, 1, 5 * sqrt(2 / n), 0);
    CHECK_CLOSE(m4, 3, 5 * sqrt(96 / n), 0);
    CHECK_CLOSE(c01, 0, 5 * sqrt(1 / (n / 2)), 0);
    CHECK_CLOSE(pt, p3, 5 * sqrt(p3 * (1 - p3) / n), 0);
    printf("normal, n = %d: mean %.5f, E z^2 %.5f, E z^4 %.4f, E z0 z1 %.5f, P(|z|>3) %.6f "
           "(ref %.6f)\n", N_SAMPLES, m1, m2, m4, c01, pt, p3);

    /* Kolmogorov-Smirnov against Phi on 100000 draws: sqrt(n) D < 1.95 (level 0.001) */
    enum { nks = 100000 };
    double *z = xmalloc(sizeof(double) * nks);
    for (int i = 0; i < nks; i++) z[i] = pf_rng_normal(&rng);
    qsort(z, nks, sizeof(double), cmp_double);
    double dmax = 0;
    for (int i = 0; i < nks; i++) {
        double F = 0.5 * erfc(-z[i] / sqrt(2.0));
        dmax = fmax(dmax, fmax(fabs(F - (double)i / nks), fabs((double)(i + 1) / nks - F)));
    }
    CHECK(sqrt((double)nks) * dmax < 1.95, "KS: sqrt(n) D = %.3f", sqrt((double)nks) * dmax);
    printf("normal KS, n = %d: sqrt(n) D = %.3f (bound 1.95)\n", nks, sqrt((double)nks) * dmax);
    free(z);
}

static void test_fill(void) {
    float buf[37];
    pf_rng rng, ref;
    CHECK_STATUS(pf_rng_init(NULL, 1, 2), PF_EINVAL);
    pf_rng_init(&rng, 11, 12);
    CHECK_STATUS(pf_rng_fill_normal(NULL, buf, 37), PF_EINVAL);
    CHECK_STATUS(pf_rng_fill_normal(&rng, NULL, 37), PF_EINVAL);
    CHECK_STATUS(pf_rng_fill_normal(&rng, buf, 0), PF_OK);
    CHECK_STATUS(pf_rng_fill_normal(&rng, buf, 37), PF_OK);
    pf_rng_init(&ref, 11, 12);
    int eq = 1;
    for (int i = 0; i < 37; i++) eq &= buf[i] == (float)pf_rng_normal(&ref);
    CHECK(eq, "fill_normal differs from pf_rng_normal one by one");
}

int main(void) {
    test_kat();
    test_layout();
    test_python_reference();
    test_determinism();
    test_uniform();
    test_normal();
    test_fill();
    TEST_MAIN_END();
}
