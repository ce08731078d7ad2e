/* fit.c: the parameters of FAVOR++ (OPRF) and FAVOR# (SDERF): Likhosherstov et al. 2022, "Chefs'
 * Random Tables", and 2023, "FAVOR#".
 *
 * Both maps are the positive map with a quadratic term in w and a scaled (OPRF) or rotated and
 * scaled (SDERF) projection: phi(x) = D/sqrt(m) exp(u_f - |x'|^2/2), u_f = w_f^T B x' + w_f^T A w_f
 * (OPRF: A, B scalars times I). This file finds A and B from the inputs; binding a map to them
 * (pf_fmap_bind, in features.c beside the maps) precomputes what depends on W only: the bias
 * w_f^T A w_f (in double), and for SDERF the rows B w_f, so that the block path is one product
 * plus a bias per column, exactly as the positive map. So the maps never call this file.
 *
 * The statistics come from the inputs scaled once, x' = x sqrt(s), each side averaged over its
 * own rows (the caller passes only valid ones), and one A serves both sides: the three flaws of
 * the TF "expplus" code (inputs scaled twice, a different A per side when the lengths differ,
 * padding in the statistics) are avoided by construction. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "attn_common.h"
#include "favor.h"

/* LAPACK's symmetric eigensolver (OpenBLAS ships LAPACK), Fortran calling convention: every
 * argument by reference, then the hidden lengths of the two character arguments. */
extern void dsyev_(const char *jobz, const char *uplo, const int *n, double *a, const int *lda,
                   double *w, double *work, const int *lwork, int *info, size_t jobz_len,
                   size_t uplo_len);

/* A*(rho) = (1 - 2 rho - sqrt((2 rho + 1)^2 + 8 rho)) / 16, the smaller root of
 * 16 A^2 + (4 rho - 2) A - rho = 0. For small rho the same value is -rho / (1 - 2 rho + sqrt(.)),
 * which avoids the cancellation of 1 against sqrt(.) ~ 1. */
static double a_star(double rho) {
    const double q = sqrt((2 * rho + 1) * (2 * rho + 1) + 8 * rho);
    return rho <= 1 ? -rho / (1 - 2 * rho + q) : (1 - 2 * rho - q) / 16;
}

/* Column sums (d) in double of n rows of X and the sum of the squared norms, x unscaled. */
static double col_sums(double *sum, const float *X, int n, int d) {
    for (int k = 0; k < d; k++) sum[k] = 0;
    double sq = 0;
    for (int i = 0; i < n; i++) {
        const float *x = X + (size_t)i * (size_t)d;
        double rs = 0;
#pragma omp simd reduction(+ : rs)
        for (int k = 0; k < d; k++) {
            sum[k] += (double)x[k];
            rs += (double)x[k] * (double)x[k];
        }
        sq += rs;
    }
    return sq;
}

/* A* from the sums over each side: sq the sum of |x|^2, sum (d) the column sums, n the rows (x
 * unscaled, s the scale): s_bar = s (sq_q / n_q + sq_k / n_k + 2 mean(q).mean(k)). */
static pf_status oprf_from_sums(double *A, double sqq, const double *mq, double nq, double sqk,
                                const double *mk, double nk, int d, double s) {
    double cross = 0;
    for (int k = 0; k < d; k++) cross += (mq[k] / nq) * (mk[k] / nk);
    /* s_bar = mean |q' + k'|^2 over all pairs */
    const double sbar = s * (sqq / nq + sqk / nk + 2 * cross);
    if (!isfinite(sbar)) return PF_ENONFINITE;
    *A = a_star(fmax(sbar, 0.0) / d);
    return PF_OK;
}

pf_status pf_oprf_a_star(double *A, const float *Q, int Lq, const float *K, int Lk, int d,
                         float sqrt_s) {
    double sq[64], sk[64], *mq = sq, *mk = sk;
    double *heap = NULL;
    if (d > 64) {
        heap = pf_alloc(2 * (size_t)d, sizeof(double));
        if (!heap) return PF_ENOMEM;
        mq = heap;
        mk = heap + d;
    }
    const double s = (double)sqrt_s * (double)sqrt_s;
    const double nq = col_sums(mq, Q, Lq, d), nk = col_sums(mk, K, Lk, d);
    const pf_status st = oprf_from_sums(A, nq, mq, Lq, nk, mk, Lk, d, s);
    pf_free(heap);
    return st;
}

/* SDERF's A, B and log D from the column sums mq, mk (d, already in kw->dwork after P) and the
 * second moments (d,d) of each side, as floats (Mqf, Mkf) or doubles (Mqd, Mkd), over nq and nk
 * rows (x unscaled, s the scale). */
static pf_status sderf_from_sums(pf_kernel_ws *kw, double *log_d, const float *Mqf,
                                 const float *Mkf, const double *Mqd, const double *Mkd, double nq,
                                 double nk, int d, double s) {
    const size_t D = (size_t)d;
    double *P = kw->dwork, *mq = P + D * D, *mk = mq + D, *sig = mk + D, *work = sig + D;
    int bad = 0;
    for (int i = 0; i < d; i++) {
        for (int j = 0; j <= i; j++) {
            const double mqi = mq[i] / nq, mqj = mq[j] / nq, mki = mk[i] / nk, mkj = mk[j] / nk;
            const size_t ij = (size_t)i * D + (size_t)j, ji = (size_t)j * D + (size_t)i;
            /* symmetrised: sgemm need not return an exactly symmetric Q^T Q */
            const double qij = Mqf ? (double)Mqf[ij] : Mqd[ij],
                         qji = Mqf ? (double)Mqf[ji] : Mqd[ji];
            const double kij = Mkf ? (double)Mkf[ij] : Mkd[ij],
                         kji = Mkf ? (double)Mkf[ji] : Mkd[ji];
            const double a = 0.5 * (qij + qji) / nq;
            const double b = 0.5 * (kij + kji) / nk;
            const double v = s * (a + b + mqi * mkj + mki * mqj);
            P[ij] = P[ji] = v;
            bad |= !isfinite(v);
        }
    }
    if (bad) return PF_ENONFINITE;
    int n = d, info = 0;
    dsyev_("V", "U", &n, P, &n, sig, work, &kw->lwork, &info, 1, 1);
    if (info != 0) return PF_EDOMAIN;
    /* P (column-major, as LAPACK writes it) now holds U: column j, U[k][j] = P[j d + k], is the
     * eigenvector of sigma_j. a_j = A*(sigma_j) (P is positive semidefinite: a negative sigma
     * is rounding, taken as 0), b_j = sqrt(1 - 4 a_j). */
    double ld = 0;
    double *a = mq, *b = mk; /* (the means are no longer needed) */
    for (int j = 0; j < d; j++) {
        a[j] = a_star(fmax(sig[j], 0.0));
        b[j] = sqrt(1 - 4 * a[j]);
        ld += 0.25 * log(1 - 4 * a[j]);
    }
    for (int i = 0; i < d; i++) {
        for (int k = 0; k <= i; k++) {
            double sa = 0, sb = 0;
            for (int j = 0; j < d; j++) {
                const double u = P[j * D + i] * P[j * D + k];
                sa += u * a[j];
                sb += u * b[j];
            }
            kw->A[i * D + k] = kw->A[k * D + i] = (float)sa;
            kw->B[i * D + k] = kw->B[k * D + i] = (float)sb;
        }
    }
    *log_d = ld;
    return isfinite(ld) ? PF_OK : PF_ENONFINITE;
}

pf_status pf_sderf_fit(pf_kernel_ws *kw, double *log_d, const float *Q, int Lq, const float *K,
                       int Lk, int d, float sqrt_s) {
    const size_t D = (size_t)d;
    double *mq = kw->dwork + D * D, *mk = mq + D;
    float *Mq = kw->fwork, *Mk = Mq + D * D;
    const double s = (double)sqrt_s * (double)sqrt_s;
    col_sums(mq, Q, Lq, d);
    col_sums(mk, K, Lk, d);
    /* second moments through sgemm (float, one product per side): the fit only has to give both
     * sides one admissible A, which any rounding of P still does */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, Lq, 1.0f, Q, d, Q, d, 0.0f, Mq, d);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, Lk, 1.0f, K, d, K, d, 0.0f, Mk, d);
    return sderf_from_sums(kw, log_d, Mq, Mk, NULL, NULL, Lq, Lk, d, s);
}

size_t pf_favor_sums_len(pf_kernel kernel, int d) {
    const size_t D = (size_t)d;
    if (kernel == PF_KERNEL_OPRF) return 4 + 2 * D;
    if (kernel == PF_KERNEL_SDERF) return 4 + 2 * D + 2 * D * D;
    return 0;
}

void pf_favor_sums(double *sums, pf_kernel kernel, const float *Q, int Lq, const float *K, int Lk,
                   int d, float *fwork) {
    const size_t D = (size_t)d;
    double *mq = sums + 4, *mk = mq + D;
    sums[0] = Lq;
    sums[1] = Lk;
    sums[2] = col_sums(mq, Q, Lq, d); /* (zeros for no rows) */
    sums[3] = col_sums(mk, K, Lk, d);
    if (kernel != PF_KERNEL_SDERF) return;
    double *Mq = mk + D, *Mk = Mq + D * D;
    const float *X[2] = {Q, K};
    const int n[2] = {Lq, Lk};
    double *Mx[2] = {Mq, Mk};
    for (int side = 0; side < 2; side++) {
        /* the products pf_sderf_fit makes, so that one slice gives its bits */
        if (n[side] > 0)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, n[side], 1.0f, X[side], d,
                        X[side], d, 0.0f, fwork, d);
        for (size_t i = 0; i < D * D; i++) Mx[side][i] = n[side] > 0 ? (double)fwork[i] : 0.0;
    }
}

pf_status pf_favor_bind(pf_fmap *fm, pf_kernel_ws *kw, const pf_favor_opts *favor, const float *Q,
                        int Lq, const float *K, int klen) {
    if (fm->kernel == PF_KERNEL_OPRF) {
        float a = favor->oprf_a;
        if (!favor->oprf_a_given) {
            double as = 0;
            pf_status st = pf_oprf_a_star(&as, Q, Lq, K, klen, fm->d, fm->sqrt_s);
            if (st != PF_OK) return st;
            a = (float)as;
        }
        return pf_fmap_bind(fm, kw, a, NULL, NULL, 0.0);
    }
    if (fm->kernel == PF_KERNEL_SDERF) {
        pf_blas_pin(); /* the fit's BLAS and LAPACK calls run in the heads' parallel regions */
        double ld = 0;
        pf_status st = pf_sderf_fit(kw, &ld, Q, Lq, K, klen, fm->d, fm->sqrt_s);
        if (st != PF_OK) return st;
        return pf_fmap_bind(fm, kw, 0.0f, kw->A, kw->B, ld);
    }
    return pf_fmap_bind(fm, kw, 0.0f, NULL, NULL, 0.0);
}

pf_status pf_favor_bind_sums(pf_fmap *fm, pf_kernel_ws *kw, const pf_favor_opts *favor,
                             const double *sums) {
    const int d = fm->d;
    const size_t D = (size_t)d;
    const double s = (double)fm->sqrt_s * (double)fm->sqrt_s;
    if (fm->kernel == PF_KERNEL_OPRF) {
        float a = favor->oprf_a;
        if (!favor->oprf_a_given) {
            double as = 0;
            pf_status st = oprf_from_sums(&as, sums[2], sums + 4, sums[0], sums[3], sums + 4 + D,
                                          sums[1], d, s);
            if (st != PF_OK) return st;
            a = (float)as;
        }
        return pf_fmap_bind(fm, kw, a, NULL, NULL, 0.0);
    }
    if (fm->kernel == PF_KERNEL_SDERF) {
        pf_blas_pin(); /* the fit's BLAS and LAPACK calls run in the heads' parallel regions */
        double ld = 0, *mq = kw->dwork + D * D;
        memcpy(mq, sums + 4, sizeof(double) * 2 * D);
        const double *Mq = sums + 4 + 2 * D;
        pf_status st = sderf_from_sums(kw, &ld, NULL, NULL, Mq, Mq + D * D, sums[0], sums[1], d, s);
        if (st != PF_OK) return st;
        return pf_fmap_bind(fm, kw, 0.0f, kw->A, kw->B, ld);
    }
    return pf_fmap_bind(fm, kw, 0.0f, NULL, NULL, 0.0);
}

/* ---- the public entry points ---------------------------------------------------------------- */

pf_status pf_oprf_optimal_a(float *A, const float *Q, int Lq, const float *K, int Lk, int d,
                            float scale) {
    if (!A || !Q || !K || Lq <= 0 || Lk <= 0 || d <= 0) return PF_EINVAL;
    if (!isfinite(scale) || scale < 0) return PF_EINVAL;
    {
        const pf_span outs[1] = {{A, sizeof(float)}};
        const pf_span ins[2] = {{Q, (size_t)Lq * (size_t)d * sizeof(float)},
                                {K, (size_t)Lk * (size_t)d * sizeof(float)}};
        if (pf_aliased(outs, 1, ins, 2)) return PF_EINVAL;
    }
    if (pf_nonfinite_f32(Q, (size_t)Lq * (size_t)d) || pf_nonfinite_f32(K, (size_t)Lk * (size_t)d))
        return PF_ENONFINITE;
    const float sqrt_s = (float)sqrt((double)pf_effective_scale(scale, d));
    double a = 0;
    pf_status st = pf_oprf_a_star(&a, Q, Lq, K, Lk, d, sqrt_s);
    if (st == PF_OK) *A = (float)a;
    return st;
}

pf_status pf_sderf_params(float *A, float *B, double *log_D, const float *Q, int Lq, const float *K,
                          int Lk, int d, float scale) {
    if (!A || !B || !log_D || !Q || !K || Lq <= 0 || Lk <= 0 || d <= 0) return PF_EINVAL;
    if (!isfinite(scale) || scale < 0) return PF_EINVAL;
    {
        const size_t dd = (size_t)d * (size_t)d * sizeof(float);
        const pf_span outs[3] = {{A, dd}, {B, dd}, {log_D, sizeof(double)}};
        const pf_span ins[2] = {{Q, (size_t)Lq * (size_t)d * sizeof(float)},
                                {K, (size_t)Lk * (size_t)d * sizeof(float)}};
        if (pf_aliased(outs, 3, ins, 2)) return PF_EINVAL;
    }
    if (pf_nonfinite_f32(Q, (size_t)Lq * (size_t)d) || pf_nonfinite_f32(K, (size_t)Lk * (size_t)d))
        return PF_ENONFINITE;
    pf_kernel_ws kw;
    if (pf_kernel_ws_alloc(&kw, PF_KERNEL_SDERF, 1, d) != 0) return PF_ENOMEM;
    const float sqrt_s = (float)sqrt((double)pf_effective_scale(scale, d));
    pf_status st = pf_sderf_fit(&kw, log_D, Q, Lq, K, Lk, d, sqrt_s);
    if (st == PF_OK) {
        memcpy(A, kw.A, sizeof(float) * (size_t)d * (size_t)d);
        memcpy(B, kw.B, sizeof(float) * (size_t)d * (size_t)d);
    }
    pf_kernel_ws_free(&kw);
    return st;
}
