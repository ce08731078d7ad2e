/* decode_tmpl.h: a decoding step's fused pass over one head's state (pf_simd_table.decode),
 * written over gemm_tmpl.h's macros (VF, VW, VMASK, v_*) and included after it by simd_avx2.c
 * and simd_avx512.c, which also define
 *   v_add(a, b)  a + b (bits as v_fma(1, a, b): one rounding of the exact sum)
 *   DEC_NB       the vectors of columns one pass over the rows keeps (accumulators, w)
 *   DECODE_NAME  the function's name
 *
 * The causal step of one token (attn_favor.c, pf_favor_causal_rows with one row) reads out
 * o = [q | a] [S ; w] (its query's features against the state, then its score a with its own
 * key times that key's weighted [v | 1] row w) and then updates S = beta S + k w. As two products
 * that is two passes over S (r x (dv + 1) floats, 80 KiB at r = 256, dv = 64: the step's memory
 * traffic); here each block of columns makes one pass, reading a row of S for the readout and
 * writing it back updated. Every element keeps the sequence of operations gemm_tmpl.h gives it:
 *   readout, vector columns  acc = 0; acc = fma(q_p, S_pj, acc), p = 0..r-1; acc = fma(a, w_j, acc)
 *   readout, lone columns    (n mod VW = 1 or 2, n > VW) a dot product over p in lanes p mod VW
 *                            (the last block masked), then v_sum
 *   update, every column     x = fma(k_p, w_j, 0); S_pj = beta 0: x, else fma(beta, S_pj, x)
 *                            (beta 1: S_pj + x, the same bits, on the adder)
 * so a step by this pass gives the bits of the two products. */

#if DEC_NB < 2 || DEC_NB > 4
#error "decode_tmpl.h: blocks of 2 to 4 vectors (the switch below)"
#endif

#define GD_CAT2(a, b) a##b
#define GD_CAT(a, b) GD_CAT2(a, b)
#define GD(name) GD_CAT(DECODE_NAME, _##name)

/* Rows 0..r-1 of NB vectors of columns (the last masked by last unless full): the readout's
 * sums over p < r go on in acc, and each row is written back updated. MODE 0: beta = 0, 1:
 * beta = 1, 2: any other beta. MODE, NB and full are constants after inlining. */
static inline __attribute__((always_inline)) void GD(rows)(int MODE, int NB, int full, VMASK last,
                                                           float *S, size_t lds, int r,
                                                           const float *qa, const float *k,
                                                           const VF *wv, float beta, VF *acc) {
    const VF vb = v_set1(beta);
    for (int p = 0; p < r; p++) {
        float *s = S + (size_t)p * lds;
        const VF qv = v_set1(qa[p]), kv = v_set1(k[p]);
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) {
            const int whole = full || b < NB - 1;
            const VF sv = whole ? v_load(s + VW * b) : v_loadm(s + VW * b, last);
            acc[b] = v_fma(qv, sv, acc[b]);
            const VF x = v_fma(kv, wv[b], v_zero());
            const VF ns = MODE == 0 ? x : MODE == 1 ? v_add(sv, x) : v_fma(vb, sv, x);
            if (whole)
                v_store(s + VW * b, ns);
            else
                v_storem(s + VW * b, ns, last);
        }
    }
}

/* One block of NB vectors of columns: its pass over the rows, then the score's term. */
static inline __attribute__((always_inline)) void GD(block)(int NB, int full, VMASK last, float *S,
                                                            size_t lds, int r, const float *qa,
                                                            const float *k, const float *w,
                                                            float beta, float *o) {
    VF acc[DEC_NB], wv[DEC_NB];
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) {
        acc[b] = v_zero();
        wv[b] = (full || b < NB - 1) ? v_load(w + VW * b) : v_loadm(w + VW * b, last);
    }
    if (beta == 0.0f)
        GD(rows)(0, NB, full, last, S, lds, r, qa, k, wv, beta, acc);
    else if (beta == 1.0f)
        GD(rows)(1, NB, full, last, S, lds, r, qa, k, wv, beta, acc);
    else
        GD(rows)(2, NB, full, last, S, lds, r, qa, k, wv, beta, acc);
    const VF av = v_set1(qa[r]);
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) {
        const VF f = v_fma(av, wv[b], acc[b]);
        if (full || b < NB - 1)
            v_store(o + VW * b, f);
        else
            v_storem(o + VW * b, f, last);
    }
}

/* Rows [p0, p0 + len) of a lone column j: each S_pj into col[] (the readout's operand) and
 * updated; MODE as for rows(). */
static inline __attribute__((always_inline)) void GD(lone_rows)(int MODE, float *S, size_t lds,
                                                                int p0, int len, int j,
                                                                const float *k, float wj,
                                                                float beta, float *col) {
    for (int l = 0; l < len; l++) {
        const int p = p0 + l;
        float *s = S + (size_t)p * lds + j;
        const float sv = *s, x = __builtin_fmaf(k[p], wj, 0.0f);
        col[l] = sv;
        *s = MODE == 0 ? x : MODE == 1 ? sv + x : __builtin_fmaf(beta, sv, x);
    }
}

/* A lone column j: the readout's dot product over p = 0..r (the column of S, then w_j) in lanes
 * p mod VW, as gemm_tmpl.h's column() makes it, each S_pj updated once read. */
static inline __attribute__((always_inline)) void GD(lone_mode)(int MODE, float *S, size_t lds,
                                                                int r, int j, const float *qa,
                                                                const float *k, const float *w,
                                                                float beta, float *o) {
    VF acc = v_zero();
    float col[VW];
    int p0 = 0;
    for (; p0 + VW <= r; p0 += VW) {
        GD(lone_rows)(MODE, S, lds, p0, VW, j, k, w[j], beta, col);
        acc = v_fma(v_load(qa + p0), v_load(col), acc);
    }
    /* the last rows and w_j: 1 to VW lanes */
    const int len = r - p0;
    GD(lone_rows)(MODE, S, lds, p0, len, j, k, w[j], beta, col);
    col[len] = w[j];
    if (len + 1 == VW) {
        acc = v_fma(v_load(qa + p0), v_load(col), acc);
    } else {
        const VMASK mk = v_mask(len + 1);
        acc = v_fma(v_loadm(qa + p0, mk), v_loadm(col, mk), acc);
    }
    o[j] = v_sum(acc);
}

static void GD(lone)(float *S, size_t lds, int r, int j, const float *qa, const float *k,
                     const float *w, float beta, float *o) {
    if (beta == 0.0f)
        GD(lone_mode)(0, S, lds, r, j, qa, k, w, beta, o);
    else if (beta == 1.0f)
        GD(lone_mode)(1, S, lds, r, j, qa, k, w, beta, o);
    else
        GD(lone_mode)(2, S, lds, r, j, qa, k, w, beta, o);
}

static void DECODE_NAME(float *S, size_t lds, int r, int n, const float *qa, const float *k,
                        const float *w, float beta, float *o) {
    if (r <= 0 || n <= 0) return;
    /* the columns gemm does apart (gemm_tmpl.h), and the vector columns in blocks of DEC_NB */
    const int lone = n % VW <= 2 && n > VW ? n % VW : 0;
    const int nv = n - lone;
    for (int j = nv; j < n; j++) GD(lone)(S, lds, r, j, qa, k, w, beta, o);
    const int step = DEC_NB * VW;
    int j = 0;
    for (; j + step <= nv; j += step)
        GD(block)(DEC_NB, 1, v_mask(VW), S + j, lds, r, qa, k, w + j, beta, o + j);
    const int left = nv - j;
    if (left == 0) return;
    const int nb = (left + VW - 1) / VW;
    const VMASK last = v_mask(left - VW * (nb - 1));
    /* (a switch, so that each block has constant sizes) */
#define GD_TAIL(NB)                                                                                \
    case NB:                                                                                       \
        GD(block)(NB, 0, last, S + j, lds, r, qa, k, w + j, beta, o + j);                          \
        break
    switch (nb) {
#if DEC_NB > 3
        GD_TAIL(4);
#endif
#if DEC_NB > 2
        GD_TAIL(3);
#endif
        GD_TAIL(2);
    default:
        GD(block)(1, 0, last, S + j, lds, r, qa, k, w + j, beta, o + j);
    }
#undef GD_TAIL
}

#undef GD
#undef GD_CAT
#undef GD_CAT2
