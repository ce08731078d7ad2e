/* projection.c: random projections W (m,d) for the feature maps (orthogonal random features,
 * Choromanski et al. 2020).
 *
 * Two generators come from one (seed, stream): the directions use Philox blocks 0, 1, 2, ...
 * and the row lengths use blocks 2^63, 2^63 + 1, ... of the same stream, so the two sequences
 * never overlap and each is consumed in a fixed order. All arithmetic is in double with no
 * dependence on threads; W is rounded to float at the very end. So the same arguments give the
 * same W on any machine whose libm computes log, sin and cos identically. */
#include <math.h>
#include <string.h>

#include "internal.h"

/* The generator for the row lengths: block counter started at 2^63. */
static void rng_for_lengths(pf_rng *rng, uint64_t seed, uint64_t stream) {
    pf_rng_init(rng, seed, stream);
    rng->ctr[1] = 0x80000000u;
}

/* A uniform integer in [0, n), n >= 1, without modulo bias: limit = 2^32 - 1 - (2^32 - 1) % n is
 * a multiple of n, and a u32 is redrawn until it falls below it. */
static uint32_t rng_below(pf_rng *rng, uint32_t n) {
    uint32_t limit = UINT32_MAX - UINT32_MAX % n;
    uint32_t u;
    do {
        u = pf_rng_u32(rng);
    } while (u >= limit);
    return u % n;
}

/* The length of an independent N(0, I_d) vector: a chi_d draw. */
static double chi_draw(pf_rng *rng, int d) {
    double s = 0;
    for (int j = 0; j < d; j++) {
        double z = pf_rng_normal(rng);
        s += z * z;
    }
    return sqrt(s);
}

/* Q (d,d) of a d x d standard Gaussian G = QR, with the sign fix Q := Q diag(sign(diag R)) that
 * makes Q Haar-distributed (Mezzadri, "How to generate random matrices from the classical
 * compact groups", 2007). Householder QR: H_{d-1} ... H_0 G = R, Q = H_0 ... H_{d-1}.
 *
 * A and the accumulated Q (qcm) are stored column-major (A[j*d + i] is A_ij) so every
 * reflection runs over contiguous memory; G's entries are drawn in that order, G_ij being the
 * (j*d + i)-th normal. Q is written row-major to out (d,d). Scratch: A, qcm (d*d each),
 * work (2d). */
static void haar_orthogonal(double *out, double *A, double *qcm, double *work, int d,
                            pf_rng *rng) {
    size_t dd = (size_t)d * d;
    double *beta = work, *sgn = work + d;
    for (size_t t = 0; t < dd; t++) A[t] = pf_rng_normal(rng);

    /* Column k's reflection H = I - beta v v^T maps x = A[k:, k] to alpha e_1 with
     * alpha = -sign(x_0)|x| (the sign that avoids cancellation in v = x - alpha e_1) and
     * beta = 2/|v|^2; R_kk = alpha. v overwrites A[k:, k]. */
    for (int k = 0; k < d; k++) {
        double *x = A + (size_t)k * d + k;
        int n = d - k;
        double xx = 0;
        for (int i = 0; i < n; i++) xx += x[i] * x[i];
        double norm = sqrt(xx);
        if (norm == 0) {  /* probability zero for a Gaussian G: the identity reflection */
            beta[k] = 0;
            sgn[k] = 1;
            continue;
        }
        double alpha = x[0] >= 0 ? -norm : norm;
        double vv = xx - 2.0 * alpha * x[0] + alpha * alpha;  /* |x - alpha e_1|^2 */
        x[0] -= alpha;
        beta[k] = 2.0 / vv;
        sgn[k] = alpha < 0 ? -1.0 : 1.0;
        for (int j = k + 1; j < d; j++) {
            double *y = A + (size_t)j * d + k;
            double s = 0;
            for (int i = 0; i < n; i++) s += x[i] * y[i];
            s *= beta[k];
            for (int i = 0; i < n; i++) y[i] -= s * x[i];
        }
    }
    /* Q = H_0 (H_1 (... (H_{d-1} I))): H_k mixes rows k..d-1 only, and at that point the
     * columns j < k of the partial product are still e_j, which H_k leaves alone. */
    memset(qcm, 0, sizeof(double) * dd);
    for (int j = 0; j < d; j++) qcm[(size_t)j * d + j] = 1.0;
    for (int k = d - 1; k >= 0; k--) {
        if (beta[k] == 0) continue;
        const double *v = A + (size_t)k * d + k;
        int n = d - k;
        for (int j = k; j < d; j++) {
            double *y = qcm + (size_t)j * d + k;
            double s = 0;
            for (int i = 0; i < n; i++) s += v[i] * y[i];
            s *= beta[k];
            for (int i = 0; i < n; i++) y[i] -= s * v[i];
        }
    }
    /* out (row-major) = Q diag(sign(R_jj)): out[i*d + j] = Q_ij sgn_j */
    for (int j = 0; j < d; j++) {
        const double *col = qcm + (size_t)j * d;
        for (int i = 0; i < d; i++) out[(size_t)i * d + j] = col[i] * sgn[j];
    }
}

pf_status pf_projection_draw(float *W, int m, int d, pf_proj_kind kind, pf_norm_kind norm,
                             uint64_t seed, uint64_t stream) {
    if (!W || m <= 0 || d <= 0) return PF_EINVAL;
    if (kind != PF_PROJ_IID && kind != PF_PROJ_ORTHOGONAL) return PF_EINVAL;
    if (norm != PF_NORM_CHI && norm != PF_NORM_SQRTD && norm != PF_NORM_QMC) return PF_EINVAL;

    pf_rng rng, rlen;
    pf_rng_init(&rng, seed, stream);
    rng_for_lengths(&rlen, seed, stream);

    /* Row lengths for qmc: chi_d quantiles at i/(m+1), shuffled over the rows (Fisher-Yates,
     * from the lengths generator). */
    double *len = NULL;
    if (norm == PF_NORM_QMC) {
        len = pf_alloc((size_t)m, sizeof(double));
        if (!len) return PF_ENOMEM;
        for (int i = 0; i < m; i++) len[i] = pf_chi_quantile(d, (i + 1.0) / (m + 1.0));
        for (int i = m - 1; i > 0; i--) {
            uint32_t j = rng_below(&rlen, (uint32_t)i + 1);
            double t = len[i];
            len[i] = len[j];
            len[j] = t;
        }
    }

    pf_status st = PF_OK;
    if (kind == PF_PROJ_IID) {
        double *row = pf_alloc((size_t)d, sizeof(double));
        if (!row) {
            pf_free(len);
            return PF_ENOMEM;
        }
        for (int r = 0; r < m; r++) {
            double ss = 0;
            for (int j = 0; j < d; j++) {
                row[j] = pf_rng_normal(&rng);
                ss += row[j] * row[j];
            }
            double scale = 1.0;  /* chi: the row as drawn already has a chi_d length */
            if (norm != PF_NORM_CHI) {
                double target = norm == PF_NORM_SQRTD ? sqrt((double)d) : len[r];
                scale = ss > 0 ? target / sqrt(ss) : 0.0;
            }
            float *w = W + (size_t)r * d;
            for (int j = 0; j < d; j++) w[j] = (float)(row[j] * scale);
        }
        pf_free(row);
    } else {
        size_t dd = (size_t)d * d;
        double *A = pf_alloc(dd, sizeof(double));
        double *qcm = pf_alloc(dd, sizeof(double));
        double *Qb = pf_alloc(dd, sizeof(double));
        double *work = pf_alloc(2 * (size_t)d, sizeof(double));
        if (!A || !qcm || !Qb || !work) {
            st = PF_ENOMEM;
        } else {
            for (int r0 = 0; r0 < m; r0 += d) {
                haar_orthogonal(Qb, A, qcm, work, d, &rng);
                int rows = m - r0 < d ? m - r0 : d;  /* the last block is cut */
                for (int i = 0; i < rows; i++) {
                    int r = r0 + i;
                    double target;  /* each row of Q is a unit vector */
                    if (norm == PF_NORM_CHI) {
                        target = chi_draw(&rlen, d);
                    } else if (norm == PF_NORM_SQRTD) {
                        target = sqrt((double)d);
                    } else {
                        target = len[r];
                    }
                    const double *q = Qb + (size_t)i * d;
                    float *w = W + (size_t)r * d;
                    for (int j = 0; j < d; j++) w[j] = (float)(q[j] * target);
                }
            }
        }
        pf_free(A);
        pf_free(qcm);
        pf_free(Qb);
        pf_free(work);
    }
    pf_free(len);
    return st;
}

uint64_t pf_projection_stream(uint64_t step, int64_t every) {
    if (every <= 0) return 0;
    return step / (uint64_t)every;
}
