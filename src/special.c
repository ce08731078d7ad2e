/* special.c: the regularised incomplete gamma function, its inverse, and chi quantiles (for the
 * quasi-Monte-Carlo row norms of SPEC §3).
 *
 * P(a, x) = gamma(a, x) / Gamma(a) and Q = 1 - P. Following the classic split (Numerical
 * Recipes §6.2): a power series for x < a + 1, where it converges fast and P is the small side,
 * and Lentz's continued fraction for Q otherwise, where Q is the small side. Both sides are
 * kept so the inverse can solve against whichever tail is small, without cancellation. */
#include <float.h>
#include <math.h>

#include "internal.h"

#define GAMMA_MAX_ITER 100000
#define GAMMA_EPS (DBL_EPSILON / 4)

/* log of the common prefactor x^a e^-x / Gamma(a). */
static double gamma_log_prefactor(double a, double x) {
    return a * log(x) - x - lgamma(a);
}

/* P and Q at a > 0, x > 0 (finite). */
static void gamma_pq(double a, double x, double *P, double *Q) {
    double lpre = gamma_log_prefactor(a, x);
    if (x < a + 1.0) {
        /* P = x^a e^-x / Gamma(a+1) * sum_{n>=0} x^n / ((a+1)...(a+n)): all terms positive,
         * ratios x/(a+n) < 1, so the sum converges geometrically. */
        double ap = a, term = 1.0 / a, sum = term;
        for (int n = 0; n < GAMMA_MAX_ITER; n++) {
            ap += 1.0;
            term *= x / ap;
            sum += term;
            if (fabs(term) < fabs(sum) * GAMMA_EPS) break;
        }
        *P = sum * exp(lpre);
        *Q = 1.0 - *P;
    } else {
        /* Q = x^a e^-x / Gamma(a) * 1/(x+1-a- 1(1-a)/(x+3-a- 2(2-a)/(x+5-a- ...))),
         * evaluated by the modified Lentz method. */
        const double tiny = DBL_MIN / DBL_EPSILON;
        double b = x + 1.0 - a, c = 1.0 / tiny, dd = 1.0 / b, h = dd;
        for (int i = 1; i < GAMMA_MAX_ITER; i++) {
            double an = -i * (i - a);
            b += 2.0;
            dd = an * dd + b;
            if (fabs(dd) < tiny) dd = tiny;
            c = b + an / c;
            if (fabs(c) < tiny) c = tiny;
            dd = 1.0 / dd;
            double del = dd * c;
            h *= del;
            if (fabs(del - 1.0) < GAMMA_EPS) break;
        }
        *Q = exp(lpre) * h;
        *P = 1.0 - *Q;
    }
}

double pf_gamma_p(double a, double x) {
    if (!(a > 0) || !(x >= 0) || isinf(a)) return NAN;  /* also catches NaN */
    if (x == 0) return 0.0;
    if (isinf(x)) return 1.0;
    double P, Q;
    gamma_pq(a, x, &P, &Q);
    return P;
}

/* A starting point for P(a, x) = p (Numerical Recipes §6.2.1): for a > 1 the Wilson-Hilferty
 * cube-root normal approximation, for a <= 1 a two-piece fit of the small-x power law and the
 * exponential tail. */
static double gamma_inv_guess(double a, double p) {
    if (a > 1.0) {
        double pp = p < 0.5 ? p : 1.0 - p;
        double t = sqrt(-2.0 * log(pp));
        double z = (2.30753 + t * 0.27061) / (1.0 + t * (0.99229 + t * 0.04481)) - t;
        if (p < 0.5) z = -z;
        double w = 1.0 - 1.0 / (9.0 * a) - z / (3.0 * sqrt(a));
        return fmax(1e-3, a * w * w * w);
    }
    double t = 1.0 - a * (0.253 + a * 0.12);
    if (p < t) return pow(p / t, 1.0 / a);
    return 1.0 - log(1.0 - (p - t) / (1.0 - t));
}

double pf_gamma_p_inv(double a, double p) {
    if (!(a > 0) || isinf(a) || !(p >= 0 && p <= 1)) return NAN;
    if (p == 0) return 0.0;
    if (p == 1) return INFINITY;
    /* Solve in the smaller tail: f(x) = P(x) - p, or q - Q(x) when p > 1/2 (q = 1 - p is
     * exact there), so a p within 1e-12 of 1 keeps its full relative accuracy. f increases
     * in x with f' = x^(a-1) e^-x / Gamma(a) and f''/f' = (a-1)/x - 1: Halley's method, kept
     * inside a bracket [lo, hi] that every evaluation narrows, bisecting when a step leaves
     * it. */
    int upper = p > 0.5;
    double q = 1.0 - p;
    double lo = 0.0, hi = INFINITY;
    double x = gamma_inv_guess(a, p);
    double lga = lgamma(a);
    for (int it = 0; it < 200; it++) {
        double P, Q;
        gamma_pq(a, x, &P, &Q);
        double f = upper ? q - Q : P - p;
        if (f == 0) return x;
        if (f < 0) {
            lo = x;
        } else {
            hi = x;
        }
        double dens = exp((a - 1.0) * log(x) - x - lga);
        double u = f / dens;  /* the Newton step */
        if (!isfinite(u)) u = NAN;
        /* Halley's correction 1 - (u/2) f''/f'; only when it is a small correction, else
         * plain Newton (a far-off start must not flip or stall the step) */
        double corr = 0.5 * u * ((a - 1.0) / x - 1.0);
        double step = fabs(corr) < 0.5 ? u / (1.0 - corr) : u;
        double xn = x - step;
        if (fabs(u) <= 2.0 * DBL_EPSILON * x) return xn;
        if (!(xn > lo && xn < hi)) xn = isinf(hi) ? 2.0 * x : 0.5 * (lo + hi);
        if (isfinite(hi) && hi - lo <= 2.0 * DBL_EPSILON * hi) return xn;
        x = xn;
    }
    return x;
}

double pf_chi_quantile(int k, double p) {
    if (k <= 0) return NAN;
    double g = pf_gamma_p_inv(0.5 * k, p);
    return sqrt(2.0 * g);
}
