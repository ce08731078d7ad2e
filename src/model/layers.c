/* layers.c: forward and backward of each layer of the language model (model.h has the
 * contracts). Shapes are in comments; N = B*T rows. Reductions over rows run in a fixed order,
 * parallel loops split work into blocks that depend only on the shapes. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* Channels per block of the embeddings' gradient reduction. Fixed, so the same sums happen
 * whatever the thread count. */
enum { CHAN_BLOCK = 32 };

/* The threads for a loop touching `work` floats: one below 32K, where waking a team costs more
 * than it saves (a decoder step works on single rows); else OpenMP's count. The partition of the
 * work does not depend on it, so neither do the results. Each thread of a loop that calls sgemm
 * first pins BLAS to itself (pf_blas_pin), which our threads calling sgemm concurrently need. */
static int threads_for(size_t work) {
    int nt = pf_threads(0);
    return work < ((size_t)1 << 15) ? 1 : nt;
}

static int nblocks(int n, int block) {
    return (n + block - 1) / block;
}

/* Rows per sgemm block of a linear layer's products (a function of N only): 512 once that
 * leaves 8 blocks or more, else 128. Each call packs the whole weight, so wider blocks pack it
 * less often (at 128 rows that packing was 3% of a training step). */
static int row_block(int N) {
    return N >= 8 * 512 ? 512 : 128;
}

/* ---------------------------------------------------------------------------------------------
 * Encoder: token and position embeddings
 * ------------------------------------------------------------------------------------------ */

void encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                     int T, int C) {
    const int nt = threads_for((size_t)B * T * C);
    (void)nt;
    // out is (B,T,C), inp (B,T), wte (V,C), wpe (context,C) or NULL
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        int t = (int)(bt % T);
        float *o = out + bt * C;
        const float *e = wte + (size_t)inp[bt] * C;
        if (wpe) {
            const float *p = wpe + (size_t)t * C;
#pragma omp simd
            for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
        } else {
            memcpy(o, e, sizeof(float) * (size_t)C);
        }
    }
}

void encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T,
                      int C) {
    const int nt = threads_for((size_t)B * T * C);
    (void)nt;
    // dout is (B,T,C). Tokens repeat, so rows of dwte collect from many (b,t): each thread owns
    // a block of channels and walks every (b,t) in order (a fixed summation order).
    int nb = nblocks(C, CHAN_BLOCK);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int cb = 0; cb < nb; cb++) {
        int c0 = cb * CHAN_BLOCK, c1 = pf_imin(C, c0 + CHAN_BLOCK);
        for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
            const float *d = dout + bt * C;
            float *g = dwte + (size_t)inp[bt] * C;
            for (int c = c0; c < c1; c++) g[c] += d[c];
        }
        if (dwpe) {
            for (int t = 0; t < T; t++) {
                float *g = dwpe + (size_t)t * C;
                for (int b = 0; b < B; b++) {
                    const float *d = dout + ((size_t)b * T + t) * C;
                    for (int c = c0; c < c1; c++) g[c] += d[c];
                }
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * LayerNorm
 * ------------------------------------------------------------------------------------------ */

void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                       const float *bias, int N, int C) {
    const int nt = threads_for((size_t)N * C);
    (void)nt;
    // out, inp are (N,C); mean, rstd (N); weight, bias (C)
    const double eps = 1e-5;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        double m = 0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        double v = 0;
        for (int c = 0; c < C; c++) {
            double e = x[c] - m;
            v += e * e;
        }
        v /= C;
        float s = (float)(1.0 / sqrt(v + eps));
        float mf = (float)m;
        float *o = out + (size_t)i * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = (x[c] - mf) * s * weight[c] + bias[c];
        mean[i] = mf;
        rstd[i] = s;
    }
}

/* Rows per block of layernorm_backward: each block's parameter-gradient sums are taken in the
 * pass over its rows, then the blocks' sums are added in order. */
enum { LN_ROWS = 256, SUM_CHUNK = 256 };

/* One row's terms of the parameter gradients, n channels: pw += dout n, pb += dout (double). */
static inline void layernorm_param_row(double *restrict pw, double *restrict pb, const float *x,
                                       const float *d, float m, float s, int n) {
#pragma omp simd
    for (int c = 0; c < n; c++) {
        pw[c] += (double)d[c] * (double)((x[c] - m) * s);
        pb[c] += d[c];
    }
}

void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, const float *mean, const float *rstd,
                        int N, int C) {
    const int nt = threads_for((size_t)N * C);
    (void)nt;
    // Input gradient, row by row. With n = (x - mean) rstd and out = n w + b:
    //   dinp = rstd (dn - mean(dn) - n mean(dn n)),  dn = dout w
    // Parameter gradients: dweight += sum_i dout n, dbias += sum_i dout: each block of LN_ROWS
    // rows sums its rows in order, in the pass that reads them (into part: the block's sums of
    // dout n, then of dout), then the blocks' sums are added in order. Without memory for part,
    // the blocks' sums are taken again afterwards, a chunk of channels at a time: the same sums.
    const int nb = nblocks(N, LN_ROWS);
    double *part = malloc(sizeof(double) * 2 * (size_t)C * (size_t)nb);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int rb = 0; rb < nb; rb++) {
        const int r1 = pf_imin(N, (rb + 1) * LN_ROWS);
        double *pw = part ? part + (size_t)rb * 2 * C : NULL, *pb = pw ? pw + C : NULL;
        if (pw)
            for (int c = 0; c < 2 * C; c++) pw[c] = 0;
        for (int i = rb * LN_ROWS; i < r1; i++) {
            const float *x = inp + (size_t)i * C;
            const float *d = dout + (size_t)i * C;
            float *g = dinp + (size_t)i * C;
            float m = mean[i], s = rstd[i];
            double dn_mean = 0, dnn_mean = 0;
#pragma omp simd reduction(+ : dn_mean, dnn_mean)
            for (int c = 0; c < C; c++) {
                double n = (double)((x[c] - m) * s);
                double dn = (double)weight[c] * d[c];
                dn_mean += dn;
                dnn_mean += dn * n;
            }
            dn_mean /= C;
            dnn_mean /= C;
#pragma omp simd
            for (int c = 0; c < C; c++) {
                double n = (double)((x[c] - m) * s);
                double dn = (double)weight[c] * d[c];
                g[c] += (float)(s * (dn - dn_mean - n * dnn_mean));
            }
            if (pw) layernorm_param_row(pw, pb, x, d, m, s, C);
        }
    }
    for (int c0 = 0; c0 < C; c0 += SUM_CHUNK) {
        const int n = pf_imin(C - c0, SUM_CHUNK);
        double aw[SUM_CHUNK] = {0}, ab[SUM_CHUNK] = {0}, tw[SUM_CHUNK], tb[SUM_CHUNK];
        for (int rb = 0; rb < nb; rb++) {
            const double *pw = tw, *pb = tb;
            if (part) {
                pw = part + (size_t)rb * 2 * C + c0;
                pb = pw + C;
            } else {
                for (int c = 0; c < n; c++) tw[c] = tb[c] = 0;
                for (int i = rb * LN_ROWS; i < pf_imin(N, (rb + 1) * LN_ROWS); i++)
                    layernorm_param_row(tw, tb, inp + (size_t)i * C + c0,
                                        dout + (size_t)i * C + c0, mean[i], rstd[i], n);
            }
#pragma omp simd
            for (int c = 0; c < n; c++) {
                aw[c] += pw[c];
                ab[c] += pb[c];
            }
        }
        for (int c = 0; c < n; c++) {
            dweight[c0 + c] += (float)aw[c];
            dbias[c0 + c] += (float)ab[c];
        }
    }
    free(part);
}

/* ---------------------------------------------------------------------------------------------
 * Matmul (a linear layer), every product in cblas_sgemm
 * ------------------------------------------------------------------------------------------ */

void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                    int C, int OC) {
    const int nt = threads_for((size_t)N * C * OC);
    (void)nt;
    // out is (N,OC), inp (N,C), weight (OC,C), bias (OC): out = inp weight^T + bias,
    // in blocks of row_block(N) rows (one sgemm each)
    const int rows_per = row_block(N), nb = nblocks(N, rows_per);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int rb = 0; rb < nb; rb++) {
        pf_blas_pin();
        int r0 = rb * rows_per, rows = pf_imin(N, r0 + rows_per) - r0;
        float *o = out + (size_t)r0 * OC;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, OC, C, 1.0f,
                    inp + (size_t)r0 * C, C, weight, C, 0.0f, o, OC);
        if (bias) {
            for (int i = 0; i < rows; i++) {
#pragma omp simd
                for (int j = 0; j < OC; j++) o[(size_t)i * OC + j] += bias[j];
            }
        }
    }
}

/* The weight gradient dweight (OC,C) += dout^T inp is WGRAD_BLOCKS sgemm calls, each a block of
 * the larger of OC and C (a multiple of 16 wide, at least WGRAD_MIN): every call packs the whole
 * of the other operand (inp when OC is split, dout when C is), so few wide blocks pack least;
 * at 64 output channels a block, inp was packed OC / 64 times, a quarter of the sgemm time. */
enum { WGRAD_BLOCKS = 4, WGRAD_MIN = 64 };

static int wgrad_width(int n) {
    int w = (n + WGRAD_BLOCKS - 1) / WGRAD_BLOCKS;
    w = (w + 15) / 16 * 16;
    return w < WGRAD_MIN ? WGRAD_MIN : w;
}

/* s[0..n) = the column sums of rows x n of d (row stride ld), in double over the rows in order. */
static void column_sums(double *restrict s, const float *d, int rows, int ld, int n) {
    for (int j = 0; j < n; j++) s[j] = 0;
    for (int i = 0; i < rows; i++) {
        const float *r = d + (size_t)i * ld;
#pragma omp simd
        for (int j = 0; j < n; j++) s[j] += r[j];
    }
}

void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC) {
    const int nt = threads_for((size_t)N * C * OC);
    (void)nt;
    // backward of out = inp weight^T + bias, dout (N,OC):
    //   dinp (N,C) = dout weight        (row blocks)
    //   dweight (OC,C) += dout^T inp    (blocks of OC or of C, the sum over N in one sgemm)
    //   dbias (OC) += sum_i dout[i]     (each row block's column sums in double, taken after its
    //                                    dinp product has read the block, then the blocks'
    //                                    sums in order; without memory for them (part), or
    //                                    without dinp, the same sums taken afterwards)
    const int rows = row_block(N), nrb = nblocks(N, rows);
    double *part = dbias && dinp ? malloc(sizeof(double) * (size_t)OC * (size_t)nrb) : NULL;
    const int split_oc = OC >= C, dim = split_oc ? OC : C;
    const int w = wgrad_width(dim), nb = nblocks(dim, w);
    // one team for both products (they are independent: no barrier between them)
#pragma omp parallel num_threads(nt)
    {
        pf_blas_pin();
        if (dinp) {
#pragma omp for schedule(static) nowait
            for (int rb = 0; rb < nrb; rb++) {
                int r0 = rb * rows, n = pf_imin(N, r0 + rows) - r0;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, OC, 1.0f,
                            dout + (size_t)r0 * OC, OC, weight, C, 0.0f, dinp + (size_t)r0 * C,
                            C);
                if (part) column_sums(part + (size_t)rb * OC, dout + (size_t)r0 * OC, n, OC, OC);
            }
        }
#pragma omp for schedule(static)
        for (int b = 0; b < nb; b++) {
            int k0 = b * w, n = pf_imin(dim, k0 + w) - k0;
            if (split_oc)
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, C, N, 1.0f, dout + k0, OC,
                            inp, C, 1.0f, dweight + (size_t)k0 * C, C);
            else
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, n, N, 1.0f, dout, OC,
                            inp + k0, C, 1.0f, dweight + k0, C);
        }
    }
    if (dbias) {
        for (int j0 = 0; j0 < OC; j0 += SUM_CHUNK) {
            const int n = pf_imin(OC - j0, SUM_CHUNK);
            double acc[SUM_CHUNK] = {0}, tmp[SUM_CHUNK];
            for (int rb = 0; rb < nrb; rb++) {
                const double *p = tmp;
                if (part)
                    p = part + (size_t)rb * OC + j0;
                else
                    column_sums(tmp, dout + (size_t)rb * rows * OC + j0,
                                pf_imin(N, (rb + 1) * rows) - rb * rows, OC, n);
#pragma omp simd
                for (int j = 0; j < n; j++) acc[j] += p[j];
            }
            for (int j = 0; j < n; j++) dbias[j0 + j] += (float)acc[j];
        }
    }
    free(part);
}

/* ---------------------------------------------------------------------------------------------
 * GELU (tanh approximation, as GPT-2) and the residual
 * ------------------------------------------------------------------------------------------ */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
enum { GELU_BLOCK = 2048 };

/* t[i] = tanh(k (x + 0.044715 x^3)) for a block, as 1 - 2 / (exp(2u) + 1) with the library's
 * vector exp: libm's tanhf is scalar and was a fifth of a training step. The absolute error
 * stays at float rounding (exp's relative error times at most 1/2); exp(2u) = inf gives 1. */
static void gelu_tanh(float *t, const float *x, int n) {
#pragma omp simd
    for (int i = 0; i < n; i++) t[i] = 2.0f * GELU_K * (x[i] + 0.044715f * x[i] * x[i] * x[i]);
    pf_exp(t, t, (size_t)n);
#pragma omp simd
    for (int i = 0; i < n; i++) t[i] = 1.0f - 2.0f / (t[i] + 1.0f);
}

void gelu_forward(float *out, const float *inp, size_t n) {
    // out = 0.5 x (1 + tanh(k (x + 0.044715 x^3)))
    const int nt = threads_for(n);
    (void)nt;
    int64_t nb = (int64_t)((n + GELU_BLOCK - 1) / GELU_BLOCK);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        size_t i0 = (size_t)b * GELU_BLOCK;
        int len = (int)(n - i0 < GELU_BLOCK ? n - i0 : GELU_BLOCK);
        float th[GELU_BLOCK];
        gelu_tanh(th, inp + i0, len);
#pragma omp simd
        for (int i = 0; i < len; i++) out[i0 + i] = 0.5f * inp[i0 + i] * (1.0f + th[i]);
    }
}

void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    // d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u) + 0.5 x sech^2(u) k (1 + 3 0.044715 x^2)
    const int nt = threads_for(n);
    (void)nt;
    int64_t nb = (int64_t)((n + GELU_BLOCK - 1) / GELU_BLOCK);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        size_t i0 = (size_t)b * GELU_BLOCK;
        int len = (int)(n - i0 < GELU_BLOCK ? n - i0 : GELU_BLOCK);
        float th[GELU_BLOCK];
        const float *x = inp + i0;
        gelu_tanh(th, x, len);
#pragma omp simd
        for (int i = 0; i < len; i++) {
            float sech2 = 1.0f - th[i] * th[i];
            float g = 0.5f * (1.0f + th[i]) +
                      0.5f * x[i] * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x[i] * x[i]);
            dinp[i0 + i] = g * dout[i0 + i];
        }
    }
}

void residual_forward(float *out, const float *a, const float *b, size_t n) {
    const int nt = threads_for(n);
    (void)nt;
#pragma omp parallel for simd num_threads(nt) schedule(static)
    for (int64_t i = 0; i < (int64_t)n; i++) out[i] = a[i] + b[i];
}

/* ---------------------------------------------------------------------------------------------
 * Rotary positions (Su et al. 2021), interleaved pairs
 * ------------------------------------------------------------------------------------------ */

void rope_angle(int64_t t, int i, int hd, float *c, float *s) {
    // theta_i = 10000^(-2i/hd), angle = t theta_i, in float64 then rounded
    double theta = pow(10000.0, -2.0 * i / hd);
    double a = (double)t * theta;
    *c = (float)cos(a);
    *s = (float)sin(a);
}

void rope_table(float *cos_sin, int T, int hd) {
    // cos_sin is (T, hd/2, 2)
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < hd / 2; i++) {
            float *cs = cos_sin + ((size_t)t * (hd / 2) + i) * 2;
            rope_angle(t, i, hd, &cs[0], &cs[1]);
        }
    }
}

/* Rotates every row of x (B,H,T,hd) by sign * angle(t). */
static void rope_apply(float *x, const float *cos_sin, int B, int H, int T, int hd, float sign) {
    const int nt = threads_for((size_t)B * H * T * hd);
    (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t bht = 0; bht < (int64_t)B * H * T; bht++) {
        int t = (int)(bht % T);
        float *r = x + bht * hd;
        const float *cs = cos_sin + (size_t)t * (hd / 2) * 2;
        for (int i = 0; i < hd / 2; i++) {
            float c = cs[2 * i], s = sign * cs[2 * i + 1];
            float x0 = r[2 * i], x1 = r[2 * i + 1];
            r[2 * i] = x0 * c - x1 * s;
            r[2 * i + 1] = x0 * s + x1 * c;
        }
    }
}

void rope_forward(float *x, const float *cos_sin, int B, int H, int T, int hd) {
    // x' = R(t) x, R a rotation of each pair
    rope_apply(x, cos_sin, B, H, T, hd, 1.0f);
}

void rope_backward(float *dx, const float *cos_sin, int B, int H, int T, int hd) {
    // dx = R(t)^T dx' = R(-t) dx'
    rope_apply(dx, cos_sin, B, H, T, hd, -1.0f);
}

/* ---------------------------------------------------------------------------------------------
 * Attention: (B,T,3C) <-> (B,H,T,hd) and the library's causal attention
 * ------------------------------------------------------------------------------------------ */

/* dst (B,H,T,hd) = columns [off + h*hd, off + (h+1)*hd) of src (B,T,ld). */
static void split_heads(float *dst, const float *src, int ld, int off, int B, int T, int H,
                        int hd) {
    const int nt = threads_for((size_t)B * H * T * hd);
    (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t bht = 0; bht < (int64_t)B * H * T; bht++) {
        int t = (int)(bht % T);
        int h = (int)((bht / T) % H);
        int64_t b = bht / ((int64_t)T * H);
        memcpy(dst + bht * hd, src + (b * T + t) * ld + off + (size_t)h * hd,
               sizeof(float) * (size_t)hd);
    }
}

/* The inverse: columns [off + h*hd, ...) of dst (B,T,ld) = src (B,H,T,hd). */
static void merge_heads(float *dst, const float *src, int ld, int off, int B, int T, int H,
                        int hd) {
    const int nt = threads_for((size_t)B * H * T * hd);
    (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        int t = (int)(bt % T);
        int64_t b = bt / T;
        for (int h = 0; h < H; h++) {
            memcpy(dst + bt * ld + off + (size_t)h * hd, src + ((b * H + h) * T + t) * hd,
                   sizeof(float) * (size_t)hd);
        }
    }
}

static void attn_setup(const lm_attn_spec *spec, int B, int T, int H, int hd, pf_shape *shape,
                       pf_attn_opts *opts, pf_favor_opts *fav) {
    shape->B = B;
    shape->H = H;
    shape->Lq = T;
    shape->Lk = T;
    shape->d = hd;
    shape->dv = hd;
    *opts = pf_attn_opts_default();
    opts->causal = 1;
    *fav = pf_favor_opts_default();
    fav->kernel = spec->kernel;
    fav->W = spec->W;
    fav->m = spec->m;
    fav->eps = spec->eps;
    if (spec->kind == PF_LM_FAVORPP) {
        /* FAVOR++: OPRF features with the model's A (causal: A must be given, as it may not look
         * at the sequence) */
        fav->kernel = PF_KERNEL_OPRF;
        fav->oprf_a_given = 1;
        fav->oprf_a = spec->A;
    }
}

pf_status attention_forward(float *out, float *q, float *k, float *v, float *att, float *lse,
                            const float *qkv, const float *cos_sin, const lm_attn_spec *spec, int B,
                            int T, int C, int H) {
    // qkv is (B,T,3C); q, k, v, att (B,H,T,hd); lse (B,H,T); out (B,T,C)
    int hd = C / H;
    split_heads(q, qkv, 3 * C, 0, B, T, H, hd);
    split_heads(k, qkv, 3 * C, C, B, T, H, hd);
    split_heads(v, qkv, 3 * C, 2 * C, B, T, H, hd);
    if (cos_sin) {
        rope_forward(q, cos_sin, B, H, T, hd);
        rope_forward(k, cos_sin, B, H, T, hd);
    }
    pf_shape shape;
    pf_attn_opts opts;
    pf_favor_opts fav;
    attn_setup(spec, B, T, H, hd, &shape, &opts, &fav);
    pf_status st;
    switch (spec->kind) {
    case PF_LM_EXACT:
        st = pf_attn_exact(att, lse, q, k, v, &shape, &opts);
        break;
    case PF_LM_LOCAL:
        st = local_attention_forward(att, lse, q, k, v, B, H, T, hd, spec->window);
        break;
    case PF_LM_FAVOR:
    case PF_LM_FAVORPP:
        if (spec->parallel) {
            /* the whole sequence across the processes; the backward recomputes */
            if (spec->saved) pf_favor_saved_clear(*spec->saved);
            st = spec->parallel->attn_forward(spec->parallel->ctx, att, q, k, v, &shape, &opts,
                                              &fav);
        } else if (spec->saved && spec->keep) {
            /* training: keep the features for the backward (made again when B or T changed) */
            pf_favor_saved **sv = spec->saved;
            if (*sv && pf_favor_saved_match(*sv, &shape, &opts, &fav, 0) != PF_OK) {
                pf_favor_saved_free(*sv);
                *sv = NULL;
            }
            st = *sv ? PF_OK : pf_favor_saved_create(sv, &shape, &opts, &fav, 0);
            if (st == PF_OK) st = pf_attn_favor_save(att, q, k, v, &shape, &opts, &fav, *sv);
        } else {
            /* (a backward after this forward must not see an older forward's features) */
            if (spec->saved) pf_favor_saved_clear(*spec->saved);
            st = pf_attn_favor(att, q, k, v, &shape, &opts, &fav);
        }
        break;
    default:
        st = PF_EINVAL;
    }
    if (st != PF_OK) return st;
    merge_heads(out, att, C, 0, B, T, H, hd);
    return PF_OK;
}

pf_status attention_backward(float *dqkv, float *datt, float *dq, float *dk, float *dv,
                             const float *dout, const float *q, const float *k, const float *v,
                             const float *att, const float *lse, const float *cos_sin,
                             const lm_attn_spec *spec, int B, int T, int C, int H) {
    // dout is (B,T,C); datt, dq, dk, dv scratch (B,H,T,hd); dqkv (B,T,3C) overwritten
    int hd = C / H;
    split_heads(datt, dout, C, 0, B, T, H, hd);
    pf_shape shape;
    pf_attn_opts opts;
    pf_favor_opts fav;
    attn_setup(spec, B, T, H, hd, &shape, &opts, &fav);
    pf_status st;
    switch (spec->kind) {
    case PF_LM_EXACT:
        st = pf_attn_exact_backward(dq, dk, dv, datt, q, k, v, att, lse, &shape, &opts);
        break;
    case PF_LM_LOCAL:
        st = local_attention_backward(dq, dk, dv, datt, q, k, v, lse, B, H, T, hd, spec->window);
        break;
    case PF_LM_FAVOR:
    case PF_LM_FAVORPP:
        if (spec->parallel)
            st = spec->parallel->attn_backward(spec->parallel->ctx, dq, dk, dv, datt, q, k, v, att,
                                               &shape, &opts, &fav);
        else if (spec->saved && *spec->saved &&
            pf_favor_saved_match(*spec->saved, &shape, &opts, &fav, 1) == PF_OK)
            st = pf_attn_favor_backward_saved(dq, dk, dv, datt, q, k, v, att, &shape, &opts, &fav,
                                              *spec->saved);
        else
            st = pf_attn_favor_backward(dq, dk, dv, datt, q, k, v, att, &shape, &opts, &fav);
        break;
    default:
        st = PF_EINVAL;
    }
    if (st != PF_OK) return st;
    if (cos_sin) {
        // q' = R q, so dq = R^T dq'
        rope_backward(dq, cos_sin, B, H, T, hd);
        rope_backward(dk, cos_sin, B, H, T, hd);
    }
    merge_heads(dqkv, dq, 3 * C, 0, B, T, H, hd);
    merge_heads(dqkv, dk, 3 * C, C, B, T, H, hd);
    merge_heads(dqkv, dv, 3 * C, 2 * C, B, T, H, hd);
    return PF_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Local-window attention (a baseline): exact softmax over the last `window` keys
 *
 *     out_t = sum_j p_tj v_j,  p_tj = exp(s q_t.k_j - lse_t),  t - window < j <= t
 *
 * A query row costs O(window hd), so the layer O(T window hd), never a T x T matrix. Products of
 * float inputs are summed in double (dot_f64's fixed lanes), the softmax and the weighted sum
 * too, and each output is rounded once; each row of an output is written by one loop iteration
 * that reads only inputs, so the bits do not depend on the thread count. The backward works a
 * head at a time: a pass over its queries keeps p_tj and ds_tj (T x window doubles) for a pass
 * over its keys, which sums them into dk and dv.
 * ------------------------------------------------------------------------------------------ */

/* Row j of a (rows, hd) array, or of a ring of `ring` rows. */
static const float *ring_row(const float *X, int64_t j, int ring, int hd) {
    return X + (size_t)(ring > 0 ? j % ring : j) * (size_t)hd;
}

/* sum_c a_c b_c in double: four lanes in a fixed order (so -O2 vectorises it, and every caller
 * gets the same bits), then their pairwise sum and the tail */
static double dot_f64(const float *restrict a, const float *restrict b, int n) {
    double l[4] = {0, 0, 0, 0};
    int c = 0;
    for (; c + 4 <= n; c += 4)
        for (int k = 0; k < 4; k++) l[k] += (double)a[c + k] * (double)b[c + k];
    double tail = 0;
    for (; c < n; c++) tail += (double)a[c] * (double)b[c];
    return ((l[0] + l[1]) + (l[2] + l[3])) + tail;
}

/* acc (n) += a x (n) */
static void axpy_f64(double *restrict acc, double a, const float *restrict x, int n) {
    for (int c = 0; c < n; c++) acc[c] += a * (double)x[c];
}

void local_row(float *out, float *lse, const float *q, const float *K, const float *V, int64_t j0,
               int64_t j1, int ring, int hd, double s, double *p) {
    const int n = (int)(j1 - j0 + 1);
    double *acc = p + n; // (hd)
    double mx = -INFINITY;
    for (int a = 0; a < n; a++) {
        p[a] = s * dot_f64(q, ring_row(K, j0 + a, ring, hd), hd);
        mx = p[a] > mx ? p[a] : mx;
    }
    double sum = 0;
    for (int c = 0; c < hd; c++) acc[c] = 0;
    // out = sum_j p_j v_j / sum_j p_j, keys in order
    for (int a = 0; a < n; a++) {
        p[a] = exp(p[a] - mx);
        sum += p[a];
        axpy_f64(acc, p[a], ring_row(V, j0 + a, ring, hd), hd);
    }
    for (int c = 0; c < hd; c++) out[c] = (float)(acc[c] / sum);
    *lse = (float)(mx + log(sum));
}

pf_status local_attention_forward(float *att, float *lse, const float *q, const float *k,
                                  const float *v, int B, int H, int T, int hd, int window) {
    // q, k, v, att (B,H,T,hd); lse (B,H,T)
    const double s = (double)pf_effective_scale(0.0f, hd);
    const int w = window < T ? window : T;
    const int nt = threads_for((size_t)B * H * T * w * hd);
    (void)nt;
    const size_t per = (size_t)w + (size_t)hd; // local_row's scratch
    double *scr = pf_alloc((size_t)pf_threads(0) * per, sizeof(double));
    if (!scr) return PF_ENOMEM;
    int bad = 0;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(| : bad)
    for (int64_t bht = 0; bht < (int64_t)B * H * T; bht++) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        const int t = (int)(bht % T);
        const int64_t head = bht - t; // row 0 of this (b, h)
        const int64_t j0 = t - w + 1 > 0 ? t - w + 1 : 0;
        float *o = att + bht * hd;
        local_row(o, lse + bht, q + bht * hd, k + head * hd, v + head * hd, j0, t, 0, hd, s,
                  scr + (size_t)tid * per);
        bad |= pf_any_nonfinite(o, (size_t)hd) || !isfinite(lse[bht]);
    }
    pf_free(scr);
    return bad ? PF_ENONFINITE : PF_OK;
}

/* The backward of one head: q, k, v, dout, dq, dk, dv (T,hd), lse (T). P and DS: (T, w)
 * scratch, entry (t, j - t + w - 1) for the keys t - w < j <= t; acc: 2 hd doubles. */
static void local_head_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                const float *k, const float *v, const float *lse, int T, int hd,
                                int w, double s, double *P, double *DS, double *acc) {
    // pass 1, queries: p_tj, dp_tj = do_t.v_j, D_t = sum_j p_tj dp_tj, ds_tj = p_tj (dp_tj - D_t),
    // dq_t = s sum_j ds_tj k_j
    for (int t = 0; t < T; t++) {
        const float *qt = q + (size_t)t * hd, *go = dout + (size_t)t * hd;
        double *pt = P + (size_t)t * w, *dst = DS + (size_t)t * w;
        const int j0 = t - w + 1 > 0 ? t - w + 1 : 0, off = w - 1 - t;
        double D = 0;
        for (int j = j0; j <= t; j++) {
            pt[j + off] = exp(s * dot_f64(qt, k + (size_t)j * hd, hd) - (double)lse[t]);
            dst[j + off] = dot_f64(go, v + (size_t)j * hd, hd); // dp, for now
            D += pt[j + off] * dst[j + off];
        }
        double *g = acc;
        for (int c = 0; c < hd; c++) g[c] = 0;
        for (int j = j0; j <= t; j++) {
            dst[j + off] = pt[j + off] * (dst[j + off] - D);
            axpy_f64(g, dst[j + off], k + (size_t)j * hd, hd);
        }
        for (int c = 0; c < hd; c++) dq[(size_t)t * hd + c] = (float)(s * g[c]);
    }
    // pass 2, keys: dv_j = sum_t p_tj do_t, dk_j = s sum_t ds_tj q_t over t = j..j + w - 1
    for (int j = 0; j < T; j++) {
        double *gk = acc, *gv = acc + hd;
        for (int c = 0; c < hd; c++) gk[c] = gv[c] = 0;
        const int t1 = j + w - 1 < T - 1 ? j + w - 1 : T - 1;
        for (int t = j; t <= t1; t++) {
            const size_t e = (size_t)t * w + (size_t)(j - t + w - 1);
            axpy_f64(gv, P[e], dout + (size_t)t * hd, hd);
            axpy_f64(gk, DS[e], q + (size_t)t * hd, hd);
        }
        for (int c = 0; c < hd; c++) {
            dk[(size_t)j * hd + c] = (float)(s * gk[c]);
            dv[(size_t)j * hd + c] = (float)gv[c];
        }
    }
}

pf_status local_attention_backward(float *dq, float *dk, float *dv, const float *datt,
                                   const float *q, const float *k, const float *v, const float *lse,
                                   int B, int H, int T, int hd, int window) {
    // Forward: s_tj = s q_t.k_j, p_tj = exp(s_tj - lse_t), out_t = sum_j p_tj v_j. With
    // dp_tj = do_t.v_j and D_t = sum_j p_tj dp_tj:
    //   dv_j = sum_t p_tj do_t,  ds_tj = p_tj (dp_tj - D_t),  dq_t = s sum_j ds_tj k_j,
    //   dk_j = s sum_t ds_tj q_t   (t over the queries that see key j: j <= t < j + window)
    const double s = (double)pf_effective_scale(0.0f, hd);
    const int w = window < T ? window : T;
    const int64_t heads = (int64_t)B * H;
    int nt = threads_for((size_t)heads * T * w * hd);
    if (nt > heads) nt = (int)heads;
    const size_t per = 2 * (size_t)T * (size_t)w + 2 * (size_t)hd; // P, DS, acc
    double *scr = pf_alloc((size_t)nt * per, sizeof(double));
    if (!scr) return PF_ENOMEM;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t bh = 0; bh < heads; bh++) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        double *P = scr + (size_t)tid * per, *DS = P + (size_t)T * w, *acc = DS + (size_t)T * w;
        const size_t o = (size_t)bh * T * hd;
        local_head_backward(dq + o, dk + o, dv + o, datt + o, q + o, k + o, v + o,
                            lse + (size_t)bh * T, T, hd, w, s, P, DS, acc);
    }
    pf_free(scr);
    const size_t n = (size_t)heads * T * hd;
    if (pf_any_nonfinite(dq, n) || pf_any_nonfinite(dk, n) || pf_any_nonfinite(dv, n))
        return PF_ENONFINITE;
    return PF_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Softmax cross-entropy
 * ------------------------------------------------------------------------------------------ */

int64_t crossentropy_forward(float *probs, float *losses, const float *logits,
                             const int32_t *targets, int N, int V) {
    const int nt = threads_for((size_t)N * V);
    (void)nt;
    // logits, probs are (N,V); losses, targets (N). loss = logsumexp(l) - l[target]
    int64_t counted = 0;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(+ : counted)
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * V;
        float *p = probs + (size_t)i * V;
        float mx = l[0];
        for (int j = 1; j < V; j++) mx = l[j] > mx ? l[j] : mx;
        double sum = 0;
        for (int j = 0; j < V; j++) {
            double e = exp((double)l[j] - mx);
            p[j] = (float)e;
            sum += e;
        }
        float inv = (float)(1.0 / sum);
        for (int j = 0; j < V; j++) p[j] *= inv;
        int tg = targets ? targets[i] : -1;
        if (tg >= 0) {
            losses[i] = (float)(log(sum) + mx - l[tg]);
            counted++;
        } else {
            losses[i] = 0.0f;
        }
    }
    return counted;
}

void crossentropy_backward(float *dlogits, const float *probs, const int32_t *targets, float scale,
                           int N, int V) {
    const int nt = threads_for((size_t)N * V);
    (void)nt;
    // d loss_i / d logit_j = p_j - [j == target]
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int i = 0; i < N; i++) {
        float *d = dlogits + (size_t)i * V;
        const float *p = probs + (size_t)i * V;
        int tg = targets[i];
        if (tg < 0) {
            memset(d, 0, sizeof(float) * (size_t)V);
            continue;
        }
#pragma omp simd
        for (int j = 0; j < V; j++) d[j] = (p[j] - (j == tg ? 1.0f : 0.0f)) * scale;
    }
}

/* ---------------------------------------------------------------------------------------------
 * FAVOR++ statistics (Likhosherstov et al. 2022)
 * ------------------------------------------------------------------------------------------ */

double favorpp_rho(const float *q, const float *k, int B, int H, int T, int hd, float scale) {
    // Per sequence and head, the mean over pairs (i, j) of |q'_i + k'_j|^2 is
    //   mean|q'|^2 + mean|k'|^2 + 2 mean(q').mean(k'),  x' = x sqrt(s_eff);
    // averaged over (b, h), divided by hd. Sequential float64 sums (a fixed order).
    double s_eff = scale > 0 ? scale : 1.0 / sqrt((double)hd);
    if (hd > 1024 || B * H * T == 0) return 0;
    double total = 0;
    for (int64_t bh = 0; bh < (int64_t)B * H; bh++) {
        double qq = 0, kk = 0, qbar[1024] = {0}, kbar[1024] = {0};
        for (int t = 0; t < T; t++) {
            const float *a = q + (bh * T + t) * hd, *b = k + (bh * T + t) * hd;
            for (int j = 0; j < hd; j++) {
                qq += (double)a[j] * a[j];
                kk += (double)b[j] * b[j];
                qbar[j] += a[j];
                kbar[j] += b[j];
            }
        }
        double cross = 0;
        for (int j = 0; j < hd; j++) cross += (qbar[j] / T) * (kbar[j] / T);
        total += qq / T + kk / T + 2 * cross;
    }
    return s_eff * total / ((double)B * H) / hd;
}

double favorpp_a(double rho) {
    return (1.0 - 2.0 * rho - sqrt((2.0 * rho + 1.0) * (2.0 * rho + 1.0) + 8.0 * rho)) / 16.0;
}

float favorpp_update(float rho, double x, int64_t n) {
    double w = 1.0 / (double)(n > 0 ? n : 1);
    if (w < 1.0 - FAVORPP_MOMENTUM) w = 1.0 - FAVORPP_MOMENTUM;
    return (float)((double)rho + (x - (double)rho) * w);
}
