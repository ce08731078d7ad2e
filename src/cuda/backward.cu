/* backward.cu: the FAVOR+ backward on the GPU, bidirectional and causal, and the
 * features a forward keeps for it (pf_cuda_favor_saved).
 *
 * The CPU library's backward (src/favor/backward.c) in the forward's GPU layout (favor.cu): per
 * head, stabilised features q~, k~ (Tc, as the products read them), key log factors c_j, and
 * [v | 1 | 0..] rows V1 (dw columns). With O_i = [n_i | D_i] the forward's numerators and
 * denominator and G = dout:
 *
 *   dN_i = [G_i / D_i | -(G_i . out_i) / D_i | 0..]                    ("dnorm", a kernel)
 *
 * bidirectional (key weights w_j = e^(c_j - M), Vs = w V1, S = K~^T Vs as in the forward):
 *   dQ~ = dN S^T;  dS = Q~^T dN;  dK~ = Vs dS^T;  dV_j = w_j (k~_j dS)[:dv]
 *
 * causal, the forward's chunks (P_i the running key maximum, E_t its value at the end of chunk
 * t, Sb_t the prefix state before chunk t referenced to E_(t-1), f_i = e^(E_(t-1) - P_i), Vs_j =
 * e^(c_j - E_t(j)) V1_j, A' the forward's masked scores), and dNf_i = f_i dN_i:
 *   B_t = dN_t V1_t^T, B'_ij = B_ij e^(c_j - P_i) for j <= i with key j valid, else 0 (k_mask)
 *   dQ~_t = dNf_t Sb_t^T + B'_t K~_t                    (the earlier chunks, then this one)
 *   dR_u = Q~_u^T dNf_u, the later queries' gradient reaching the keys, summed from the end:
 *   R_(nch-1) = 0, R_(t-1) = alpha_t R_t + dR_t (alpha_t = e^(E_(t-1) - E_t), the forward's),
 *          so that R_t = sum_{i after chunk t} e^(E_t - P_i) q~_i dN_i^T ("suffix")
 *   dK~_t = Vs_t R_t^T + B'_t^T Q~_t
 *   dV_t  = (w_t (K~_t R_t) + A'_t^T dN_t)[:dv]   (w_j = e^(c_j - E_t(j)))
 * Every factor is <= 1, as in the forward; nothing is recovered by subtraction, and a row sees
 * only the keys it saw in the forward, through the exact zeros of A' and B'.
 *
 * Through the feature maps (pf_fmap_rows_backward): out is homogeneous of degree 0 in a query's
 * features and in the keys' (for a fixed reference), so the gradient with respect to phi~ with
 * the log factors held gives a_f = dphi~_f g_f (g = phi~ before eps) and, with the map's h term,
 * b; then dX = sqrt(s) a W + s b x, a cuBLAS product ("unproject") and a kernel. eps > 0 (added
 * relative to the row's largest phi~) passes eps sign(g*) sum(dphi~) to the argmax f*.
 *
 * Memory: the forward's buffers, plus dN, the features' gradients (L x r float32 each side), the
 * masked B' and the suffix states: linear in L, in groups of heads that fit the workspace limit.
 * With a pf_cuda_favor_saved, the features, the keys' log factors and the tops come from it and
 * the two projections and feature maps are not run again. */
#include <new>

#include "favor_parts.cuh"

/* ---- the plan: the forward's, and the backward's buffers ---------------------------------- */

struct bwd_plan {
    favor_plan f;
    int rq, rk; /* rows of a head's queries and keys (causal: Lp both) */
    size_t b_u, b_phq, b_phk, b_topq, b_topk, b_c, b_p, b_vw, b_vs, b_st, b_sb, b_rb, b_a32,
        b_a, b_bm, b_o, b_o2, b_y, b_dn, b_dnf, b_gq, b_gk, b_x, b_bco, b_ref;
    size_t per_head, fixed;
};

static pf_status bwd_plan_make(bwd_plan *bp, pf_cuda_dtype dtype, const pf_shape *s,
                               const pf_attn_opts *o, const pf_favor_opts *f) {
    memset(bp, 0, sizeof *bp);
    pf_status st = plan_make(&bp->f, dtype, s, o, f);
    if (st != PF_OK) return st;
    const favor_plan *p = &bp->f;
    const int causal = p->causal;
    bp->rq = causal ? p->Lp : p->Lq;
    bp->rk = causal ? p->Lp : p->Lk;
    const size_t rq = (size_t)bp->rq, rk = (size_t)bp->rk, rmax = std::max(rq, rk);
    const size_t r = (size_t)p->r, m = (size_t)p->m, dw = (size_t)p->dw, tc = p->tc;
    const size_t d = (size_t)p->d, C = (size_t)p->C, nst = causal ? (size_t)p->nch : 1;
    bp->b_u = align256(rmax * m * 4); /* the projection, then the feature maps' gradients a */
    bp->b_phq = align256(rq * r * tc);
    bp->b_phk = align256(rk * r * tc);
    bp->b_topq = align256(rq * 4);
    bp->b_topk = align256(rk * 4);
    bp->b_c = align256(rk * 8);
    bp->b_p = align256(causal ? rk * 8 : 8);
    bp->b_vw = causal ? align256(rk * dw * tc) : 0;
    bp->b_vs = align256(rk * dw * tc);
    bp->b_st = align256(nst * r * dw * 4); /* S or the chunks' states, then dS or dR */
    bp->b_sb = align256(nst * r * dw * tc);
    bp->b_rb = align256(nst * r * dw * tc);
    bp->b_a32 = causal ? align256(rk * C * 4) : 0;
    bp->b_a = causal ? align256(rk * C * tc) : 0;
    bp->b_bm = bp->b_a;
    bp->b_o = align256(rq * dw * 4);                  /* O (causal: then K~ R) */
    bp->b_o2 = causal ? align256(rk * dw * 4) : 0;    /* causal: O2, then A'^T dN */
    bp->b_y = causal ? 0 : align256(rk * dw * 4);     /* bidirectional: K~ dS */
    bp->b_dn = align256(rq * dw * tc);
    bp->b_dnf = causal ? align256(rq * dw * tc) : 0;
    bp->b_gq = align256(rq * r * 4);
    bp->b_gk = align256(rk * r * 4);
    bp->b_x = align256(rmax * d * 4); /* half inputs widened, then sqrt(s) a W */
    bp->b_bco = align256(rmax * 8);
    bp->b_ref = causal ? align256(nst * 20) : align256((size_t)p->ncm * 8);
    bp->per_head = bp->b_u + bp->b_phq + bp->b_phk + bp->b_topq + bp->b_topk + bp->b_c + bp->b_p +
                   bp->b_vw + bp->b_vs + bp->b_st + bp->b_sb + bp->b_rb + bp->b_a32 + bp->b_a +
                   bp->b_bm + bp->b_o + bp->b_o2 + bp->b_y + bp->b_dn + bp->b_dnf + bp->b_gq +
                   bp->b_gk + bp->b_x + bp->b_bco + bp->b_ref;
    bp->fixed = p->fixed;
    return PF_OK;
}

/* A group's buffers (every one holds G heads back to back). */
struct bwd_bufs {
    float *u, *topq, *topk, *st, *a32, *o, *o2, *y, *gq, *gk, *x, *alpha, *W;
    void *phq, *phk, *vw, *vs, *sb, *rb, *a, *bm, *dn, *dnf;
    double *c, *P, *bco, *eref, *cm;
};

static bwd_bufs bwd_carve(const bwd_plan *bp, void *ws, int G) {
    bwd_bufs b;
    memset(&b, 0, sizeof b);
    b.W = (float *)ws;
    ws_carver cv = {(char *)ws + bp->fixed, G};
    auto take = [&](size_t per) { return cv.take(per); };
    b.u = (float *)take(bp->b_u);
    b.phq = take(bp->b_phq);
    b.phk = take(bp->b_phk);
    b.topq = (float *)take(bp->b_topq);
    b.topk = (float *)take(bp->b_topk);
    b.c = (double *)take(bp->b_c);
    b.P = (double *)take(bp->b_p);
    b.vw = take(bp->b_vw);
    b.vs = take(bp->b_vs);
    b.st = (float *)take(bp->b_st);
    b.sb = take(bp->b_sb);
    b.rb = take(bp->b_rb);
    b.a32 = (float *)take(bp->b_a32);
    b.a = take(bp->b_a);
    b.bm = take(bp->b_bm);
    b.o = (float *)take(bp->b_o);
    b.o2 = (float *)take(bp->b_o2);
    b.y = (float *)take(bp->b_y);
    b.dn = take(bp->b_dn);
    b.dnf = take(bp->b_dnf);
    b.gq = (float *)take(bp->b_gq);
    b.gk = (float *)take(bp->b_gk);
    b.x = (float *)take(bp->b_x);
    b.bco = (double *)take(bp->b_bco);
    double *ref = (double *)take(bp->b_ref);
    if (bp->f.causal) {
        b.eref = ref;
        b.cm = ref + (size_t)bp->f.nch * G;
        b.alpha = (float *)(b.cm + (size_t)bp->f.nch * G);
    } else {
        b.cm = ref;
    }
    return b;
}

/* ---- kernels ---------------------------------------------------------------------------------- */

/* The weight of key j of head g in the state: e^(c_j - M_g) (bidirectional, P NULL) or
 * e^(c_j - E_t(j)) (causal: P at the end of j's chunk); 0 for a padded key. As k_weights. */
__device__ __forceinline__ float key_weight(const double *c, const double *P, const double *M,
                                            size_t g, int j, int rows_alloc, int C) {
    const double cj = c[g * rows_alloc + j];
    if (!(cj > -INFINITY)) return 0.0f;
    double ref;
    if (P) {
        const int tend = min(rows_alloc, (j / C + 1) * C) - 1;
        ref = P[g * rows_alloc + tend];
    } else {
        ref = M[g];
    }
    return ref == cj ? 1.0f : expf((float)(cj - ref));
}

/* dN (and, causal, dNf = f dN) of rows [0, rows_alloc) of G heads from the forward's O (and O2,
 * with the rebase f as k_normalise) and dout (G heads of L rows of dv); rows at or after L and
 * the columns after dv are zero. A NaN or Inf in dout is flagged (PF_FLAG_INPUT); a zero or
 * non-finite denominator is flagged as the forward flags it, and its row passes no gradient.
 * Block (32, 8): a warp a row. */
template <typename Tin, typename Tc>
__global__ void k_dnorm(Tc *dn, Tc *dnf, const float *O, const float *O2, const double *P,
                        const double *eref, const Tin *dout, int C, int nch, int G, int rows_alloc,
                        int L, int dv, int dw, unsigned *flags) {
    const size_t row = blockIdx.x * (size_t)blockDim.y + threadIdx.y;
    if (row >= (size_t)G * rows_alloc) return;
    const int lane = threadIdx.x;
    const size_t g = row / rows_alloc;
    const int i = (int)(row % rows_alloc);
    Tc *d1 = dn + row * (size_t)dw;
    Tc *d2 = dnf ? dnf + row * (size_t)dw : NULL;
    if (i >= L) {
        for (int e = lane; e < dw; e += 32) {
            pf_st(d1 + e, 0.0f);
            if (d2) pf_st(d2 + e, 0.0f);
        }
        return;
    }
    const float *o = O + row * (size_t)dw;
    const float *o2 = O2 ? O2 + row * (size_t)dw : NULL;
    float f = 1.0f;
    if (O2) {
        const double E = eref[g * nch + i / C], pi = P[row];
        f = E == pi ? 1.0f : (E == -INFINITY ? 0.0f : expf((float)(E - pi)));
    }
    const float den = o2 ? f * o[dv] + o2[dv] : o[dv];
    const float inv = 1.0f / den;
    const unsigned bad = !isfinite(den) ? PF_FLAG_BAD_DEN
                         : den == 0.0f  ? PF_FLAG_ZERO_DEN
                         : !isfinite(inv) ? PF_FLAG_BAD_DEN
                                          : 0u;
    const Tin *gr = dout + (g * L + i) * (size_t)dv;
    double dot = 0;
    int nonfinite = 0;
    for (int e = lane; e < dv; e += 32) {
        const float ge = pf_ld(gr + e);
        nonfinite |= !isfinite(ge);
        const float num = o2 ? f * o[e] + o2[e] : o[e];
        dot += (double)ge * (double)(num * inv);
    }
    dot = warp_sum(dot);
    nonfinite = warp_any(nonfinite);
    if (lane == 0) {
        if (nonfinite) pf_raise(flags, PF_FLAG_INPUT);
        if (bad) pf_raise(flags, bad);
    }
    const int zero = nonfinite || bad || !isfinite(dot);
    for (int e = lane; e < dw; e += 32) {
        float v = 0.0f;
        if (!zero) v = e < dv ? pf_ld(gr + e) * inv : (e == dv ? (float)(-dot) * inv : 0.0f);
        pf_st(d1 + e, v);
        if (d2) pf_st(d2 + e, f * v);
    }
}

__device__ __forceinline__ void argmax_lowest(float &v, int &idx) {
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        if (v2 > v || (v2 == v && i2 < idx)) {
            v = v2;
            idx = i2;
        }
    }
}

/* The gradient through the feature map of rows [0, rows_alloc) of G heads, a warp a row:
 * dphi (float32, rows of r) and phi~ (Tc) with the row's top -> a (float32, rows of m) and the
 * coefficient b of the h term (pf_fmap_rows_backward's arithmetic). Rows at or after n, and keys
 * whose log factor is -inf (c not NULL: padded), get a = 0, b = 0. */
template <typename Tc>
__global__ void k_fmap_bwd(float *A, double *bco, const float *dphi, const Tc *phi,
                           const float *top, const double *c, int G, int rows_alloc, int n,
                           pf_fmap_dev fm) {
    const int lane = threadIdx.x & 31;
    const size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
    if (row >= (size_t)G * rows_alloc) return;
    const int i = (int)(row % rows_alloc);
    const int m = fm.m, r = fm.r;
    float *a = A + row * (size_t)m;
    if (i >= n || (c && !(c[row] > -INFINITY))) {
        for (int f = lane; f < m; f += 32) a[f] = 0.0f;
        if (lane == 0) bco[row] = 0;
        return;
    }
    const float *dp = dphi + row * (size_t)r;
    const Tc *p = phi + row * (size_t)r;
    const int relu = fm.kernel == PF_KERNEL_RELU;
    const float sub = relu ? fm.eps : fm.eps * top[row];
    int fs = -1;
    float adj = 0.0f;
    if (fm.eps > 0 && !relu) {
        float best = -1.0f;
        int bi = 0x7fffffff;
        double dsum = 0;
        for (int f = lane; f < r; f += 32) {
            const float g = fabsf(pf_ld(p + f) - sub);
            if (g > best) {
                best = g;
                bi = f;
            }
            dsum += (double)dp[f];
        }
        argmax_lowest(best, bi);
        dsum = warp_sum(dsum);
        fs = bi;
        adj = (float)((double)fm.eps * (pf_ld(p + fs) - sub < 0 ? -dsum : dsum));
    }
    double sum = 0;
    for (int f = lane; f < m; f += 32) {
        float d1 = dp[f] + (f == fs ? adj : 0.0f);
        const float g1 = pf_ld(p + f) - sub;
        float av;
        switch (fm.kernel) {
        case PF_KERNEL_HYPERBOLIC: {
            const float d2 = dp[m + f] + (m + f == fs ? adj : 0.0f);
            const float g2 = pf_ld(p + m + f) - sub;
            const float t1 = d1 * g1, t2 = d2 * g2;
            av = t1 - t2;
            sum += (double)(t1 + t2);
            break;
        }
        case PF_KERNEL_TRIG: {
            const float d2 = dp[m + f] + (m + f == fs ? adj : 0.0f);
            const float g2 = pf_ld(p + m + f) - sub;
            av = d1 * g2 - d2 * g1;
            sum += (double)(d1 * g1 + d2 * g2);
            break;
        }
        case PF_KERNEL_RELU:
            av = g1 > 0.0f ? d1 * fm.inv_sqrt_m : 0.0f;
            break;
        default: /* positive */
            av = d1 * g1;
            sum += (double)av;
            break;
        }
        a[f] = av;
    }
    sum = warp_sum(sum);
    if (lane == 0)
        bco[row] = fm.kernel == PF_KERNEL_TRIG ? sum : (relu ? 0.0 : -sum);
}

/* dX (G heads of n rows of d, Tin) = T + s2 b x, T = sqrt(s) a W (float32, rows_alloc rows a
 * head), x the rows of X; a NaN or Inf is flagged. One thread an element. */
template <typename Tin>
__global__ void k_dx(Tin *dX, const float *T, const double *bco, const Tin *X, int G,
                     int rows_alloc, int n, int d, double s2, unsigned *flags) {
    const size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)G * n * d) return;
    const int k = (int)(idx % d);
    const size_t gi = idx / d;
    const size_t g = gi / n, i = gi % n;
    const size_t ra = g * rows_alloc + i;
    float v = T[ra * d + k];
    const double b = bco[ra];
    if (b != 0) v += (float)(s2 * b) * pf_ld(X + idx);
    if (!isfinite(v)) {
        pf_raise(flags, PF_FLAG_INPUT);
        v = 0.0f;
    }
    pf_st(dX + idx, v);
}

/* dV (G heads of L rows of dv) = w_j Y_j + Z_j (Z NULL: 0), Y and Z rows of dw (rows_alloc a
 * head), w the key's weight (key_weight). One thread an element. */
template <typename Tin>
__global__ void k_dv(Tin *dV, const float *Y, const float *Z, const double *c, const double *P,
                     const double *M, int G, int rows_alloc, int L, int C, int dv, int dw) {
    const size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)G * L * dv) return;
    const int e = (int)(idx % dv);
    const size_t gj = idx / dv;
    const size_t g = gj / L;
    const int j = (int)(gj % L);
    const size_t ra = g * rows_alloc + j;
    float v = 0.0f;
    if (c[ra] > -INFINITY) {
        const float w = key_weight(c, P, M, g, j, rows_alloc, C);
        v = w * Y[ra * dw + e];
        if (Z) v += Z[ra * dw + e];
    }
    pf_st(dV + idx, v);
}

/* The suffix of the chunks' state gradients: R_(nch-1) = 0, R_(t-1) = alpha_t R_t + dR_t; each
 * thread one element of one head, walking the chunks from the last (k_state_prefix reversed). */
template <typename Tc>
__global__ void k_state_suffix(Tc *Rb, const float *dR, const float *alpha, int G, int nch,
                               size_t per) {
    const size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)G * per) return;
    const size_t g = idx / per, e = idx % per;
    const float *a = alpha + g * nch;
    const float *src = dR + g * nch * per + e;
    Tc *dst = Rb + g * nch * per + e;
    float cur = 0.0f;
    int t = nch - 1;
    for (; t - 3 >= 0; t -= 4) {
        float x[4], al[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            x[k] = __ldg(src + (size_t)(t - k) * per);
            al[k] = __ldg(a + t - k);
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            pf_st(dst + (size_t)(t - k) * per, cur);
            cur = al[k] * cur + x[k];
        }
    }
    for (; t >= 0; t--) {
        pf_st(dst + (size_t)t * per, cur);
        cur = a[t] * cur + src[(size_t)t * per];
    }
}

/* ---- the host side ----------------------------------------------------------------------------- */

struct bwd_io {
    void *dQ, *dK, *dV;
    const void *dout, *Q, *K, *V;
};

/* T (G, rows_alloc, d) = sqrt(s) A W for the G heads from bh0, A (G, rows_alloc, m) float32 (the
 * projection's transpose: one batched product per run of heads of one W). Half inputs on TF32
 * tensor cores as their projection; float32 as the context allows. */
static pf_status unproject(const favor_run &R, const float *W, const float *A, float *T, int n,
                           int rows_alloc, int bh0, int G) {
    const favor_plan *p = R.p;
    const cublasComputeType_t ct =
        p->tin == 2 && p->fm.kernel != PF_KERNEL_RELU ? CUBLAS_COMPUTE_32F_FAST_TF32 : R.compute;
    int g = 0;
    while (g < G) {
        int run = G - g, woff = 0;
        long long sw = 0;
        if (p->w_per_head) {
            const int h = (bh0 + g) % p->H;
            run = std::min(run, p->H - h);
            woff = h;
            sw = (long long)p->m * p->d;
        }
        const size_t off = (size_t)g * rows_alloc;
        /* column-major T^T (d x n) = W^T (d x m) A^T (m x n) */
        pf_status st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_N, p->d, n, p->m, p->sqrt_s,
                            W + (size_t)woff * p->m * p->d, CUDA_R_32F, p->d, sw,
                            A + off * p->m, p->m, (long long)rows_alloc * p->m, 0.0f,
                            T + off * p->d, p->d, (long long)rows_alloc * p->d, run,
                            "feature gradient a W", ct);
        if (st != PF_OK) return st;
        g += run;
    }
    return PF_OK;
}

/* dX of one side: through its feature map (k_fmap_bwd into b.u), then sqrt(s) a W into b.x, then
 * the h term into dX. c: the keys' log factors (padded keys), or NULL for queries. */
template <typename Tin, typename Tc>
static pf_status side_backward(const favor_run &R, const bwd_bufs &b, void *dX, const void *X,
                               const float *dphi, const Tc *phi, const float *top,
                               const double *c, int n, int rows_alloc, int bh0, int G) {
    const favor_plan *p = R.p;
    const size_t rows = (size_t)G * rows_alloc;
    k_fmap_bwd<Tc><<<grid_for(rows * 32, 256), 256, 0, R.stream>>>(b.u, b.bco, dphi, phi, top, c,
                                                                    G, rows_alloc, n, p->fm);
    pf_status st = unproject(R, b.W, b.u, b.x, n, rows_alloc, bh0, G);
    if (st != PF_OK) return st;
    const size_t xs = (size_t)n * p->d;
    k_dx<Tin><<<grid_for((size_t)G * xs, 256), 256, 0, R.stream>>>(
        (Tin *)dX + (size_t)bh0 * xs, b.x, b.bco, (const Tin *)X + (size_t)bh0 * xs, G, rows_alloc,
        n, p->d, p->s2, R.ctx->flags);
    return PF_OK;
}

/* The features of both sides (unless kept): the forward's features() on the group's buffers. */
template <typename Tin, typename Tc>
static pf_status both_sides(const favor_run &R, const bwd_bufs &b, const side_ptrs &sp,
                            const bwd_io &io, int rq, int rk, int bh0, int G) {
    if (R.sv) return PF_OK;
    favor_bufs fb;
    memset(&fb, 0, sizeof fb);
    fb.u = b.u;
    fb.x = b.x;
    fb.W = b.W;
    const favor_plan *p = R.p;
    pf_status st = features<Tin, Tc>(R, fb, (Tc *)sp.phk, sp.ck, sp.topk, io.K, p->Lk, rk, bh0, G,
                                     R.klen);
    if (st != PF_OK) return st;
    return features<Tin, Tc>(R, fb, (Tc *)sp.phq, NULL, sp.topq, io.Q, p->Lq, rq, bh0, G, NULL);
}

template <typename Tin, typename Tc>
static pf_status bwd_bidirectional(const favor_run &R, const bwd_bufs &b, const bwd_io &io,
                                   int bh0, int G) {
    const favor_plan *p = R.p;
    pf_cuda_ctx *ctx = R.ctx;
    const int Lq = p->Lq, Lk = p->Lk, r = p->r, dw = p->dw, dv = p->dv;
    const long long per = (long long)r * dw;
    pf_status st;
    const side_ptrs sp = side_of(R, b.phq, b.phk, b.c, b.topq, b.topk, bh0);
    const Tc *phq = (const Tc *)sp.phq, *phk = (const Tc *)sp.phk;
    if ((st = both_sides<Tin, Tc>(R, b, sp, io, Lq, Lk, bh0, G)) != PF_OK) return st;
    /* the forward again up to O: M, Vs, S = K~^T Vs, O = Q~ S */
    k_chunk_max<<<grid_for((size_t)G * p->ncm * 32, 256), 256, 0, R.stream>>>(
        b.cm, sp.ck, Lk, MAX_ROWS, p->ncm, G);
    k_max<<<G, 256, 0, R.stream>>>(b.P, b.cm, p->ncm);
    k_weights<Tin, Tc><<<grid_for((size_t)G * Lk, 8), dim3(32, 8), 0, R.stream>>>(
        NULL, (Tc *)b.vs, (const Tin *)io.V + (size_t)bh0 * Lk * dv, (size_t)Lk * dv, sp.ck, NULL,
        b.P, G, Lk, Lk, 1, dv, dw, ctx->flags);
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_T, dw, r, Lk, 1.0f, b.vs, R.tc_t, dw,
                   (long long)Lk * dw, phk, r, (long long)Lk * r, 0.0f, b.st, dw, per, G,
                   "key state phi(K)^T [V|1]")) != PF_OK)
        return st;
    const void *S = b.st;
    if (p->tc == 2) {
        const size_t n = (size_t)G * per;
        k_to_tc<Tc><<<grid_for(n, 256), 256, 0, R.stream>>>((Tc *)b.sb, b.st, n);
        S = b.sb;
    }
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_N, dw, Lq, r, 1.0f, S, R.tc_t, dw, per, phq, r,
                   (long long)Lq * r, 0.0f, b.o, dw, (long long)Lq * dw, G,
                   "readout phi(Q) S")) != PF_OK)
        return st;
    k_dnorm<Tin, Tc><<<grid_for((size_t)G * Lq, 8), dim3(32, 8), 0, R.stream>>>(
        (Tc *)b.dn, NULL, b.o, NULL, NULL, NULL, (const Tin *)io.dout + (size_t)bh0 * Lq * dv, 1,
        1, G, Lq, Lq, dv, dw, ctx->flags);
    /* dQ~ = dN S^T: column-major dQ~^T (r x Lq) = S (r x dw) dN^T */
    if ((st = gemm(R, CUBLAS_OP_T, CUBLAS_OP_N, r, Lq, dw, 1.0f, S, R.tc_t, dw, per, b.dn, dw,
                   (long long)Lq * dw, 0.0f, b.gq, r, (long long)Lq * r, G,
                   "query features' gradient dN S^T")) != PF_OK)
        return st;
    /* dS = Q~^T dN: column-major dS^T (dw x r) = dN^T Q~ (b.st: S is read by then) */
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_T, dw, r, Lq, 1.0f, b.dn, R.tc_t, dw,
                   (long long)Lq * dw, phq, r, (long long)Lq * r, 0.0f, b.st, dw, per, G,
                   "state gradient phi(Q)^T dN")) != PF_OK)
        return st;
    const void *dS = b.st;
    if (p->tc == 2) {
        const size_t n = (size_t)G * per;
        k_to_tc<Tc><<<grid_for(n, 256), 256, 0, R.stream>>>((Tc *)b.rb, b.st, n);
        dS = b.rb;
    }
    /* dK~ = Vs dS^T: column-major dK~^T (r x Lk) = dS (r x dw) Vs^T */
    if ((st = gemm(R, CUBLAS_OP_T, CUBLAS_OP_N, r, Lk, dw, 1.0f, dS, R.tc_t, dw, per, b.vs, dw,
                   (long long)Lk * dw, 0.0f, b.gk, r, (long long)Lk * r, G,
                   "key features' gradient Vs dS^T")) != PF_OK)
        return st;
    /* Y = K~ dS: column-major Y^T (dw x Lk) = dS^T K~^T */
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_N, dw, Lk, r, 1.0f, dS, R.tc_t, dw, per, phk, r,
                   (long long)Lk * r, 0.0f, b.y, dw, (long long)Lk * dw, G,
                   "value gradient phi(K) dS")) != PF_OK)
        return st;
    k_dv<Tin><<<grid_for((size_t)G * Lk * dv, 256), 256, 0, R.stream>>>(
        (Tin *)io.dV + (size_t)bh0 * Lk * dv, b.y, NULL, sp.ck, NULL, b.P, G, Lk, Lk, 1, dv, dw);
    if ((st = side_backward<Tin, Tc>(R, b, io.dQ, io.Q, b.gq, phq, sp.topq, NULL, Lq, Lq, bh0,
                                     G)) != PF_OK)
        return st;
    return side_backward<Tin, Tc>(R, b, io.dK, io.K, b.gk, phk, sp.topk, sp.ck, Lk, Lk, bh0, G);
}

template <typename Tin, typename Tc>
static pf_status bwd_causal(const favor_run &R, const bwd_bufs &b, const bwd_io &io, int bh0,
                            int G) {
    const favor_plan *p = R.p;
    pf_cuda_ctx *ctx = R.ctx;
    const int L = p->Lq, Lp = p->Lp, C = p->C, nch = p->nch, r = p->r, dw = p->dw, dv = p->dv;
    const size_t per = (size_t)r * dw;
    const long long sC = (long long)C * r, sV = (long long)C * dw, sA = (long long)C * C;
    const int nb = G * nch;
    pf_status st;
    const side_ptrs sp = side_of(R, b.phq, b.phk, b.c, b.topq, b.topk, bh0);
    const Tc *phq = (const Tc *)sp.phq, *phk = (const Tc *)sp.phk;
    if ((st = both_sides<Tin, Tc>(R, b, sp, io, Lp, Lp, bh0, G)) != PF_OK) return st;
    /* the forward again up to O and O2 (favor.cu's group_causal) */
    k_chunk_max<<<grid_for((size_t)G * nch * 32, 256), 256, 0, R.stream>>>(b.cm, sp.ck, Lp, C,
                                                                            nch, G);
    k_chunk_scan<<<G, 1024, 0, R.stream>>>(b.eref, b.alpha, b.cm, nch);
    k_row_prefix<<<grid_for((size_t)G * nch * 32, 256), 256, 0, R.stream>>>(b.P, sp.ck, b.eref,
                                                                             Lp, C, nch, G);
    k_weights<Tin, Tc><<<grid_for((size_t)G * Lp, 8), dim3(32, 8), 0, R.stream>>>(
        (Tc *)b.vw, (Tc *)b.vs, (const Tin *)io.V + (size_t)bh0 * L * dv, (size_t)L * dv, sp.ck,
        b.P, NULL, G, Lp, L, C, dv, dw, ctx->flags);
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_T, dw, r, C, 1.0f, b.vs, R.tc_t, dw, sV, phk, r, sC,
                   0.0f, b.st, dw, (long long)per, nb, "chunk states phi(K_t)^T [V_t|1]")) !=
        PF_OK)
        return st;
    k_state_prefix<Tc><<<grid_for((size_t)G * per, 256), 256, 0, R.stream>>>(
        (Tc *)b.sb, b.st, b.alpha, G, nch, per);
    if ((st = gemm(R, CUBLAS_OP_T, CUBLAS_OP_N, C, C, r, 1.0f, phk, R.tc_t, r, sC, phq, r, sC,
                   0.0f, b.a32, C, sA, nb, "chunk scores phi(Q_t) phi(K_t)^T")) != PF_OK)
        return st;
    const size_t nmask = (size_t)G * Lp * C;
    k_mask<Tc><<<grid_for(nmask, 256), 256, 0, R.stream>>>((Tc *)b.a, b.a32, b.P, sp.ck, G, Lp, C);
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_N, dw, C, r, 1.0f, b.sb, R.tc_t, dw, (long long)per,
                   phq, r, sC, 0.0f, b.o, dw, sV, nb, "chunk readout phi(Q_t) Sb_t")) != PF_OK)
        return st;
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_N, dw, C, C, 1.0f, b.vw, R.tc_t, dw, sV, b.a, C, sA,
                   0.0f, b.o2, dw, sV, nb, "chunk readout A'_t V1_t")) != PF_OK)
        return st;
    k_dnorm<Tin, Tc><<<grid_for((size_t)G * Lp, 8), dim3(32, 8), 0, R.stream>>>(
        (Tc *)b.dn, (Tc *)b.dnf, b.o, b.o2, b.P, b.eref,
        (const Tin *)io.dout + (size_t)bh0 * L * dv, C, nch, G, Lp, L, dv, dw, ctx->flags);
    /* queries: dQ~_t = dNf_t Sb_t^T + B'_t K~_t, B_t = dN_t V1_t^T masked as A' */
    if ((st = gemm(R, CUBLAS_OP_T, CUBLAS_OP_N, r, C, dw, 1.0f, b.sb, R.tc_t, dw, (long long)per,
                   b.dnf, dw, sV, 0.0f, b.gq, r, sC, nb, "query gradient dNf_t Sb_t^T")) != PF_OK)
        return st;
    if ((st = gemm(R, CUBLAS_OP_T, CUBLAS_OP_N, C, C, dw, 1.0f, b.vw, R.tc_t, dw, sV, b.dn, dw, sV,
                   0.0f, b.a32, C, sA, nb, "chunk gradient scores dN_t V1_t^T")) != PF_OK)
        return st;
    k_mask<Tc><<<grid_for(nmask, 256), 256, 0, R.stream>>>((Tc *)b.bm, b.a32, b.P, sp.ck, G, Lp,
                                                           C);
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_N, r, C, C, 1.0f, phk, R.tc_t, r, sC, b.bm, C, sA,
                   1.0f, b.gq, r, sC, nb, "query gradient B'_t phi(K_t)")) != PF_OK)
        return st;
    /* keys: the suffix states R_t from dR_u = Q~_u^T dNf_u (b.st: the chunks' states are read) */
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_T, dw, r, C, 1.0f, b.dnf, R.tc_t, dw, sV, phq, r, sC,
                   0.0f, b.st, dw, (long long)per, nb, "chunk state gradients phi(Q_u)^T dNf_u")) !=
        PF_OK)
        return st;
    k_state_suffix<Tc><<<grid_for((size_t)G * per, 256), 256, 0, R.stream>>>(
        (Tc *)b.rb, b.st, b.alpha, G, nch, per);
    /* dK~_t = Vs_t R_t^T + B'_t^T Q~_t */
    if ((st = gemm(R, CUBLAS_OP_T, CUBLAS_OP_N, r, C, dw, 1.0f, b.rb, R.tc_t, dw, (long long)per,
                   b.vs, dw, sV, 0.0f, b.gk, r, sC, nb, "key gradient Vs_t R_t^T")) != PF_OK)
        return st;
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_T, r, C, C, 1.0f, phq, R.tc_t, r, sC, b.bm, C, sA,
                   1.0f, b.gk, r, sC, nb, "key gradient B'_t^T phi(Q_t)")) != PF_OK)
        return st;
    /* values: Y_t = K~_t R_t (into O's buffer), Z_t = A'_t^T dN_t (into O2's) */
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_N, dw, C, r, 1.0f, b.rb, R.tc_t, dw, (long long)per,
                   phk, r, sC, 0.0f, b.o, dw, sV, nb, "value gradient phi(K_t) R_t")) != PF_OK)
        return st;
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_T, dw, C, C, 1.0f, b.dn, R.tc_t, dw, sV, b.a, C, sA,
                   0.0f, b.o2, dw, sV, nb, "value gradient A'_t^T dN_t")) != PF_OK)
        return st;
    k_dv<Tin><<<grid_for((size_t)G * L * dv, 256), 256, 0, R.stream>>>(
        (Tin *)io.dV + (size_t)bh0 * L * dv, b.o, b.o2, sp.ck, b.P, NULL, G, Lp, L, C, dv, dw);
    if ((st = side_backward<Tin, Tc>(R, b, io.dQ, io.Q, b.gq, phq, sp.topq, NULL, L, Lp, bh0,
                                     G)) != PF_OK)
        return st;
    return side_backward<Tin, Tc>(R, b, io.dK, io.K, b.gk, phk, sp.topk, sp.ck, L, Lp, bh0, G);
}

template <typename Tin, typename Tc>
static pf_status bwd_all(const favor_run &R, const bwd_plan *bp, const bwd_io &io, const float *W,
                         int G) {
    const favor_plan *p = R.p;
    pf_cuda_ctx *ctx = R.ctx;
    const size_t wn = (size_t)(p->w_per_head ? p->H : 1) * p->m * p->d;
    bwd_bufs b = bwd_carve(bp, ctx->ws, G);
    k_copy_w<<<grid_for(wn, 256), 256, 0, R.stream>>>(b.W, W, wn, ctx->flags);
    const int BH = p->B * p->H;
    for (int bh0 = 0; bh0 < BH; bh0 += G) {
        const int g = std::min(G, BH - bh0);
        pf_status st = p->causal ? bwd_causal<Tin, Tc>(R, b, io, bh0, g)
                                 : bwd_bidirectional<Tin, Tc>(R, b, io, bh0, g);
        if (st != PF_OK) return st;
    }
    return PF_OK;
}

PF_CUDA_API pf_status pf_cuda_favor_backward_workspace(size_t *per_head, size_t *fixed,
                                                       pf_cuda_dtype dtype, const pf_shape *shape,
                                                       const pf_attn_opts *opts,
                                                       const pf_favor_opts *favor) {
    pf_cuda_clear_error();
    bwd_plan bp;
    pf_status st = bwd_plan_make(&bp, dtype, shape, opts, favor);
    if (st != PF_OK) return st;
    if (per_head) *per_head = bp.per_head;
    if (fixed) *fixed = bp.fixed + 256;
    return PF_OK;
}

PF_CUDA_API pf_status pf_cuda_favor_backward(pf_cuda_ctx *ctx, void *dQ, void *dK, void *dV,
                                             const void *dout, const void *Q, const void *K,
                                             const void *V, pf_cuda_dtype dtype,
                                             const pf_shape *shape, const pf_attn_opts *opts,
                                             const pf_favor_opts *favor,
                                             const pf_cuda_favor_saved *saved,
                                             cudaStream_t stream) {
    pf_cuda_clear_error();
    if (!ctx) return pf_cuda_fail(PF_EINVAL, "pf_cuda_favor_backward: ctx is NULL");
    bwd_plan bp;
    pf_status st = bwd_plan_make(&bp, dtype, shape, opts, favor);
    if (st != PF_OK) return st;
    const favor_plan &p = bp.f;
    pf_device_guard guard(ctx->device);
    if (!guard.ok) return pf_cuda_err(cudaGetLastError(), "cudaSetDevice");
    const size_t bh = (size_t)p.B * p.H;
    const struct {
        const void *ptr;
        const char *name;
        size_t bytes;
    } t[8] = {
        {dQ, "dQ", bh * p.Lq * p.d * p.tin},
        {dK, "dK", bh * p.Lk * p.d * p.tin},
        {dV, "dV", bh * p.Lk * p.dv * p.tin},
        {dout, "dout", bh * p.Lq * p.dv * p.tin},
        {Q, "Q", bh * p.Lq * p.d * p.tin},
        {K, "K", bh * p.Lk * p.d * p.tin},
        {V, "V", bh * p.Lk * p.dv * p.tin},
        {favor->W, "favor.W", (size_t)(p.w_per_head ? p.H : 1) * p.m * p.d * sizeof(float)},
    };
    for (int i = 0; i < 8; i++)
        if ((st = pf_cuda_check_ptr(ctx, t[i].ptr, t[i].name)) != PF_OK) return st;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 8; j++)
            if (j != i && overlaps(t[i].ptr, t[i].bytes, t[j].ptr, t[j].bytes))
                return pf_cuda_fail(PF_EINVAL, "%s overlaps %s: each gradient needs memory of "
                                               "its own", t[i].name, t[j].name);
    const int32_t *klen = NULL;
    std::vector<int32_t> klen_host;
    if ((st = key_lengths(ctx, opts->key_len, p.B, p.Lk, stream, &klen, &klen_host)) != PF_OK)
        return st;
    if (saved) {
        if ((st = saved_matches(saved, ctx, dtype, shape, opts, favor)) != PF_OK) return st;
        if (!saved->filled)
            return pf_cuda_fail(PF_EINVAL, "the pf_cuda_favor_saved is empty: pf_cuda_favor_save "
                                           "fills it (a failed forward leaves it empty)");
        if (saved->klen != klen_host)
            return pf_cuda_fail(PF_EINVAL, "the pf_cuda_favor_saved was filled with other key "
                                           "lengths (opts.key_len)");
    }
    favor_run R;
    int G;
    /* (saved is read only here) */
    if ((st = run_begin(&R, &G, ctx, &p, bp.per_head, bp.fixed, klen,
                        (pf_cuda_favor_saved *)saved, (int)p.tc, stream)) != PF_OK)
        return st;
    /* the stage profile is the forward's: the backward's features are not counted in it */
    const int profile = ctx->profile;
    ctx->profile = 0;
    const bwd_io io = {dQ, dK, dV, dout, Q, K, V};
    const float *W = favor->W;
    switch (dtype) {
    case PF_CUDA_F32: st = bwd_all<float, float>(R, &bp, io, W, G); break;
    case PF_CUDA_BF16: st = bwd_all<__nv_bfloat16, __nv_bfloat16>(R, &bp, io, W, G); break;
    case PF_CUDA_F16: st = bwd_all<__half, __nv_bfloat16>(R, &bp, io, W, G); break;
    }
    ctx->profile = profile;
    if (st != PF_OK) {
        cudaStreamSynchronize(stream);
        cudaGetLastError();
        return st;
    }
    st = pf_cuda_flags_read(ctx, stream);
    if (st != PF_OK && ctx->flags_host[0]) { /* PF_FLAG_INPUT: every gradient is zeroed */
        for (int i = 0; i < 3; i++) cudaMemsetAsync((void *)t[i].ptr, 0, t[i].bytes, stream);
        cudaStreamSynchronize(stream);
    }
    return st;
}

/* ---- kept features ---------------------------------------------------------------------------- */

/* The regions of a saved for plan p: per head rows_q and rows_k rows. Returns the bytes; the
 * offsets go to off[5] (phq, phk, ck, topq, topk). 0 when too large. */
static size_t saved_layout(const favor_plan *p, size_t off[5]) {
    const size_t bh = (size_t)p->B * p->H;
    const size_t rq = (size_t)(p->causal ? p->Lp : p->Lq), rk = (size_t)(p->causal ? p->Lp : p->Lk);
    const double est = (double)bh * ((double)(rq + rk) * p->r * p->tc + rk * 12.0 + rq * 4.0);
    if (est > 0x1p52) return 0;
    const size_t sz[5] = {align256(bh * rq * p->r * p->tc), align256(bh * rk * p->r * p->tc),
                          align256(bh * rk * 8), align256(bh * rq * 4), align256(bh * rk * 4)};
    size_t at = 0;
    for (int i = 0; i < 5; i++) {
        off[i] = at;
        at += sz[i];
    }
    return at;
}

PF_CUDA_API pf_status pf_cuda_favor_saved_size(size_t *bytes, pf_cuda_dtype dtype,
                                               const pf_shape *shape, const pf_attn_opts *opts,
                                               const pf_favor_opts *favor) {
    pf_cuda_clear_error();
    if (!bytes) return pf_cuda_fail(PF_EINVAL, "pf_cuda_favor_saved_size: bytes is NULL");
    favor_plan p;
    pf_status st = plan_make(&p, dtype, shape, opts, favor);
    if (st != PF_OK) return st;
    size_t off[5];
    *bytes = saved_layout(&p, off);
    if (*bytes == 0) return pf_cuda_fail(PF_EINVAL, "the kept features would pass 2^52 bytes");
    return PF_OK;
}

PF_CUDA_API pf_status pf_cuda_favor_saved_create(pf_cuda_favor_saved **saved, pf_cuda_ctx *ctx,
                                                 pf_cuda_dtype dtype, const pf_shape *shape,
                                                 const pf_attn_opts *opts,
                                                 const pf_favor_opts *favor) {
    pf_cuda_clear_error();
    if (!saved) return pf_cuda_fail(PF_EINVAL, "pf_cuda_favor_saved_create: saved is NULL");
    *saved = NULL;
    if (!ctx) return pf_cuda_fail(PF_EINVAL, "pf_cuda_favor_saved_create: ctx is NULL");
    favor_plan p;
    pf_status st = plan_make(&p, dtype, shape, opts, favor);
    if (st != PF_OK) return st;
    size_t off[5];
    const size_t bytes = saved_layout(&p, off);
    if (bytes == 0) return pf_cuda_fail(PF_EINVAL, "the kept features would pass 2^52 bytes");
    pf_device_guard guard(ctx->device);
    if (!guard.ok) return pf_cuda_err(cudaGetLastError(), "cudaSetDevice");
    pf_cuda_favor_saved *v = new (std::nothrow) pf_cuda_favor_saved();
    if (!v) return pf_cuda_fail(PF_ENOMEM, "pf_cuda_favor_saved_create: out of host memory");
    cudaError_t e = cudaMalloc(&v->mem, bytes);
    if (e != cudaSuccess) {
        delete v;
        return pf_cuda_err(e, "allocating the kept features");
    }
    v->ctx = ctx;
    v->dtype = dtype;
    v->shape = *shape;
    v->causal = opts->causal;
    v->scale = opts->scale;
    v->favor = *favor;
    v->filled = 0;
    v->bytes = bytes;
    v->rows_q = p.causal ? p.Lp : p.Lq;
    v->rows_k = p.causal ? p.Lp : p.Lk;
    v->r = p.r;
    v->tc = p.tc;
    char *base = (char *)v->mem;
    v->phq = base + off[0];
    v->phk = base + off[1];
    v->ck = (double *)(base + off[2]);
    v->topq = (float *)(base + off[3]);
    v->topk = (float *)(base + off[4]);
    *saved = v;
    return PF_OK;
}

PF_CUDA_API void pf_cuda_favor_saved_free(pf_cuda_favor_saved *saved) {
    if (!saved) return;
    pf_device_guard guard(saved->ctx->device);
    cudaDeviceSynchronize();
    cudaFree(saved->mem);
    delete saved;
}

PF_CUDA_API size_t pf_cuda_favor_saved_bytes(const pf_cuda_favor_saved *saved) {
    return saved ? saved->bytes : 0;
}
