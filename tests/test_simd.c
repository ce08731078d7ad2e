/* test_simd.c: every vector-kernel path this CPU can run, against libm in double.
 *
 * exp is checked on a dense grid over the whole range where float exp is finite and normal,
 * [-87.3, 88.7], plus the edges: subnormal results, overflow to +inf, underflow to 0, NaN and
 * +/-inf inputs. The bound: max relative error 2^-22 (about 2.4e-7, i.e. 2 ulp) for normal
 * results (measured here: 1 ulp; the Cephes polynomial with a Cody-Waite split). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "check.h"
#include "internal.h"

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

int main(void) {
    const char *names[] = {"ref", "avx2", "avx512"};
    int ran = 0;
    for (int i = 0; i < 3; i++) {
        const pf_simd_table *t = pf_simd_get(names[i]);
        if (!t) {
            printf("%s: not supported by this CPU, skipped\n", names[i]);
            continue;
        }
        CHECK(strcmp(t->name, names[i]) == 0, "table name %s", t->name);
        check_table(t);
        ran++;
    }
    CHECK(ran >= 1, "no table ran");
    CHECK(pf_simd() != NULL, "no table chosen");
    printf("chosen: %s\n", pf_simd()->name);
    TEST_MAIN_END();
}
