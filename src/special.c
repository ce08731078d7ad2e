/* special.c: the regularised incomplete gamma function, its inverse, and chi quantiles (for the
 * quasi-Monte-Carlo row norms of the projections, pf_projection_draw).
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
#define PF_PI 3.14159265358979323846

/* log(1 + t) - t, accurate also where the two nearly cancel (|t| small). */
static double log1pmx(double t) {
    if (fabs(t) > 0.25) return log1p(t) - t;
    /* -t^2/2 + t^3/3 - ... = -sum_{n>=2} (-t)^n / n: terms fall by at least 4x */
    double term = -t, sum = 0;
    for (int n = 2; n < 60; n++) {
        term *= -t;
        double add = -term / n;
        sum += add;
        if (fabs(add) <= fabs(sum) * GAMMA_EPS) break;
    }
    return sum;
}

/* log of the common prefactor x^a e^-x / Gamma(a). For large a the three terms are each
 * about a log a and cancel near x = a: there it is written a (log(1+t) - t) + log(a/2pi)/2
 * - S(a), with t = (x - a)/a and S Stirling's correction lgamma(a) - (a - 1/2) log a + a -
 * log(2 pi)/2, whose series is exact to double precision from a = 100 on. */
static double gamma_log_prefactor(double a, double x) {
    /* elsewhere the plain form is accurate (small a), or the result underflows anyway */
    if (a < 100 || fabs(x - a) > 0.5 * a) return a * log(x) - x - lgamma(a);
    double r = 1.0 / a, r2 = r * r;
    double S = r * (1.0 / 12 - r2 * (1.0 / 360 - r2 * (1.0 / 1260 - r2 / 1680)));
    return a * log1pmx((x - a) / a) + 0.5 * log(a / (2 * PF_PI)) - S;
}

/* Beyond this a, the series and continued fraction below need O(sqrt a) terms near x = a. */
#define GAMMA_TEMME_A 1e8

/* P and Q for large a by Temme's uniform asymptotic expansion (DLMF 8.12.3-8.12.8): with
 * lambda = x/a and eta = sign(lambda - 1) sqrt(2 (lambda - 1 - log lambda)),
 * Q = erfc(eta sqrt(a/2)) / 2 + exp(-a eta^2 / 2) / sqrt(2 pi a) (c0(eta) + O(1/a)),
 * c0 = 1/(lambda - 1) - 1/eta. The dropped terms are below 1e-14 for a > 1e8. */
static void gamma_pq_temme(double a, double x, double *P, double *Q) {
    double mu = (x - a) / a; /* lambda - 1 */
    double eta2 = -2.0 * log1pmx(mu);
    double eta = mu < 0 ? -sqrt(eta2) : sqrt(eta2);
    double c0;
    if (fabs(mu) < 1e-3) /* 1/(lambda-1) - 1/eta cancels: its series in eta (DLMF 8.12.9) */
        c0 = -1.0 / 3 + eta * (1.0 / 12 + eta * (-2.0 / 135 + eta / 864));
    else
        c0 = 1.0 / mu - 1.0 / eta;
    double r = exp(-0.5 * a * eta2) / sqrt(2 * PF_PI * a) * c0;
    double z = eta * sqrt(0.5 * a);
    if (eta >= 0) { /* Q is the small side */
        *Q = 0.5 * erfc(z) + r;
        *P = 1.0 - *Q;
    } else {
        *P = 0.5 * erfc(-z) - r;
        *Q = 1.0 - *P;
    }
}

/* P and Q by the power series or the continued fraction. */
static void gamma_pq_sums(double a, double x, double *P, double *Q);

/* P and Q at a > 0, x > 0 (finite), each in [0, 1] (rounding can take a sum just past 1). */
static void gamma_pq(double a, double x, double *P, double *Q) {
    if (a > GAMMA_TEMME_A)
        gamma_pq_temme(a, x, P, Q);
    else
        gamma_pq_sums(a, x, P, Q);
    *P = fmin(fmax(*P, 0.0), 1.0);
    *Q = fmin(fmax(*Q, 0.0), 1.0);
}

static void gamma_pq_sums(double a, double x, double *P, double *Q) {
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
