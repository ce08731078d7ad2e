/* decode_tmpl.h: a decoding step's fused pass over one head's state (pf_simd_table.decode),
 * written over gemm_tmpl.h's macros (VF, VW, VMASK, v_*) and included after it by simd_avx2.c
 * and simd_avx512.c, which also define
 *   v_add(a, b)  a + b (bits as v_fma(1, a, b): one rounding of the exact sum)
 *   DEC_NB       the vectors of columns one pass over the rows keeps (accumulators, w)
 *   DEC_WMEM     1: the pending w' read from memory (L1) in every row instead of kept in
 *                registers, so that DEC_NB accumulators fit in 16 registers (AVX2)
 *   DECODE_NAME  the function's name
 *
 * The causal step of one token (favor/scan.c, pf_favor_causal_rows with one row) reads out
 * o = [q | a] [S ; w] (its query's features against the state, then its score a with its own
 * key times that key's weighted [v | 1] row w) and then updates S = beta S + k w. The decoding
 * state (favor/state.c) keeps that update pending until the next step, so that a step that fails
 * has changed nothing: the pass first applies the previous token's update S = beta' S + k' w'
 * (k' = NULL: none pending) to a row of S, writes it back, and reads the updated row out. As
 * products that is two passes over S (r x (dv + 1) floats, 80 KiB at r = 256, dv = 64); here each
 * block of columns makes one pass (the lone columns, below, within the first block's): two FMAs
 * and an add per element, about as fast with S in L2 as in L1 (Zen 4). Every element keeps the
 * sequence of operations gemm_tmpl.h gives it:
 *   update, every column     x = fma(k'_p, w'_j, 0); S_pj = beta' 0: x, else fma(beta', S_pj, x)
 *                            (beta' 1: S_pj + x, the same bits, on the adder)
 *   readout, vector columns  acc = 0; acc = fma(q_p, S_pj, acc), p = 0..r-1; acc = fma(a, w_j, acc)
 *   readout, lone columns    (n mod VW = 1 or 2, n > VW) a dot product over p in lanes p mod VW
 *                            (the last block masked), then v_sum
 * so a step by this pass gives the bits of the two products. */

#ifndef DEC_WMEM
#define DEC_WMEM 0
#endif
#if DEC_NB < 2 || DEC_NB > 8
#error "decode_tmpl.h: blocks of 2 to 8 vectors (the switches below)"
#endif

#define GD_CAT2(a, b) a##b
#define GD_CAT(a, b) GD_CAT2(a, b)
#define GD(name) GD_CAT(DECODE_NAME, _##name)

/* Rows 0..r-1 of NB vectors of columns (the last masked by last unless full), and of NL lone
 * columns (0 to 2) at Sl with w's entries wl: each row is updated by the pending k' w' (wv, wl)
 * and written back, then read out: the sums over p < r go on in acc, and for a lone column c in
 * accl[c][p mod VW], the very fma lane p mod VW of gemm_tmpl.h's column() makes (finished by
 * lone_sum). MODE 0: beta = 0, 1: beta = 1, 2: any other beta, 3: nothing pending (S is only
 * read). MODE, NB, full and NL are constants after inlining. */
static inline __attribute__((always_inline)) void
GD(rows)(int MODE, int NB, int full, int NL, VMASK last, float *S, size_t lds, int r,
         const float *qa, const float *k, const VF *wv, const float *wk, float beta, VF *acc,
         float *Sl, const float *wl, float (*accl)[VW]) {
    const VF vb = v_set1(beta);
    const float wl0 = NL > 0 ? wl[0] : 0.0f, wl1 = NL > 1 ? wl[1] : 0.0f;
    for (int p = 0; p < r; p++) {
        float *s = S + (size_t)p * lds;
        const VF qv = v_set1(qa[p]), kv = v_set1(MODE == 3 ? 0.0f : k[p]);
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) {
            const int whole = full || b < NB - 1;
            const VF sv = whole ? v_load(s + VW * b) : v_loadm(s + VW * b, last);
            VF ns = sv;
            if (MODE != 3) {
                const VF wb = !DEC_WMEM ? wv[b]
                              : whole   ? v_load(wk + VW * b)
                                        : v_loadm(wk + VW * b, last);
                const VF x = v_fma(kv, wb, v_zero());
                ns = MODE == 0 ? x : MODE == 1 ? v_add(sv, x) : v_fma(vb, sv, x);
                if (whole)
                    v_store(s + VW * b, ns);
                else
                    v_storem(s + VW * b, ns, last);
            }
            acc[b] = v_fma(qv, ns, acc[b]);
        }
#pragma GCC unroll 2
        for (int c = 0; c < NL; c++) {
            float *sl = Sl + (size_t)p * lds + c;
            float ns = *sl;
            if (MODE != 3) {
                const float x = __builtin_fmaf(k[p], c ? wl1 : wl0, 0.0f);
                ns = MODE == 0 ? x : MODE == 1 ? ns + x : __builtin_fmaf(beta, ns, x);
                *sl = ns;
            }
            accl[c][p & (VW - 1)] = __builtin_fmaf(qa[p], ns, accl[c][p & (VW - 1)]);
        }
    }
}

/* The end of a lone column's dot product over p = 0..r: the term p = r (the score times w_j),
 * then as gemm_tmpl.h's column() with k = r + 1: the lanes past k in its last (masked) block get
 * fma(0, 0, acc), and v_sum adds the lanes. */
static inline __attribute__((always_inline)) float GD(lone_sum)(float *al, int r, const float *qa,
                                                                float wj) {
    al[r & (VW - 1)] = __builtin_fmaf(qa[r], wj, al[r & (VW - 1)]);
    const int used = (r + 1) & (VW - 1); /* lanes of the last block; 0: it is whole */
    if (used)
        for (int l = used; l < VW; l++) al[l] = __builtin_fmaf(0.0f, 0.0f, al[l]);
    return v_sum(v_load(al));
}

/* One block of NB vectors of columns (and NL lone columns): its pass over the rows, then the
 * score's term. wk: the pending w' (read only when k is not NULL); w: the readout's. */
static inline __attribute__((always_inline)) void
GD(block)(int NB, int full, int NL, VMASK last, float *S, size_t lds, int r, const float *qa,
          const float *k, const float *wk, float beta, const float *w, float *o, float *Sl,
          const float *wl, float (*accl)[VW]) {
    VF acc[DEC_NB], wv[DEC_NB];
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) {
        acc[b] = v_zero();
        if (!DEC_WMEM)
            wv[b] = (full || b < NB - 1) ? v_load(wk + VW * b) : v_loadm(wk + VW * b, last);
    }
    if (!k)
        GD(rows)(3, NB, full, NL, last, S, lds, r, qa, k, wv, wk, beta, acc, Sl, wl, accl);
    else if (beta == 0.0f)
        GD(rows)(0, NB, full, NL, last, S, lds, r, qa, k, wv, wk, beta, acc, Sl, wl, accl);
    else if (beta == 1.0f)
        GD(rows)(1, NB, full, NL, last, S, lds, r, qa, k, wv, wk, beta, acc, Sl, wl, accl);
    else
        GD(rows)(2, NB, full, NL, last, S, lds, r, qa, k, wv, wk, beta, acc, Sl, wl, accl);
    const VF av = v_set1(qa[r]);
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++) {
        const int whole = full || b < NB - 1;
        const VF f = v_fma(av, whole ? v_load(w + VW * b) : v_loadm(w + VW * b, last), acc[b]);
        if (whole)
            v_store(o + VW * b, f);
        else
            v_storem(o + VW * b, f, last);
    }
}

/* The first block of nv vector columns (nv > 0), with the lone ones: NB and full from nv. */
static inline __attribute__((always_inline)) void
GD(first)(int NL, int nv, float *S, size_t lds, int r, const float *qa, const float *k,
          const float *wk, float beta, const float *w, float *o, float (*accl)[VW]) {
    float *Sl = S + nv;
    const float *wl = wk + nv;
    if (nv >= DEC_NB * VW) {
        GD(block)(DEC_NB, 1, NL, v_mask(VW), S, lds, r, qa, k, wk, beta, w, o, Sl, wl, accl);
        return;
    }
    const int nb = (nv + VW - 1) / VW; /* 1 to DEC_NB, the last vector masked */
    const VMASK last = v_mask(nv - VW * (nb - 1));
    /* (a switch, so that each block has constant sizes; every nb up to DEC_NB has its case) */
#define GD_FIRST(NB)                                                                               \
    case NB:                                                                                       \
        GD(block)(NB, 0, NL, last, S, lds, r, qa, k, wk, beta, w, o, Sl, wl, accl);                \
        break
    switch (nb) {
#if DEC_NB > 7
        GD_FIRST(8);
#endif
#if DEC_NB > 6
        GD_FIRST(7);
#endif
#if DEC_NB > 5
        GD_FIRST(6);
#endif
#if DEC_NB > 4
        GD_FIRST(5);
#endif
#if DEC_NB > 3
        GD_FIRST(4);
#endif
#if DEC_NB > 2
        GD_FIRST(3);
#endif
        GD_FIRST(2);
    default:
        GD(block)(1, 0, NL, last, S, lds, r, qa, k, wk, beta, w, o, Sl, wl, accl);
    }
#undef GD_FIRST
}

static void DECODE_NAME(float *S, size_t lds, int r, int n, const float *qa, const float *k,
                        const float *wk, float beta, const float *w, float *o) {
    if (r <= 0 || n <= 0) return;
    if (!k) wk = w; /* (loaded, never used) */
    /* the columns gemm does apart (gemm_tmpl.h), in the first block's pass (there is one:
     * n > VW), and the others in blocks of DEC_NB vectors */
    const int lone = n % VW <= 2 && n > VW ? n % VW : 0;
    const int nv = n - lone;
    float accl[2][VW];
    for (int c = 0; c < 2; c++)
        for (int l = 0; l < VW; l++) accl[c][l] = 0.0f;
    if (lone == 1)
        GD(first)(1, nv, S, lds, r, qa, k, wk, beta, w, o, accl);
    else if (lone == 2)
        GD(first)(2, nv, S, lds, r, qa, k, wk, beta, w, o, accl);
    else
        GD(first)(0, nv, S, lds, r, qa, k, wk, beta, w, o, accl);
    const int step = DEC_NB * VW;
    int j = nv < step ? nv : step;
    for (; j + step <= nv; j += step)
        GD(block)(DEC_NB, 1, 0, v_mask(VW), S + j, lds, r, qa, k, wk + j, beta, w + j, o + j,
                  NULL, NULL, NULL);
    const int left = nv - j;
    if (left > 0) {
        const int nb = (left + VW - 1) / VW;
        const VMASK last = v_mask(left - VW * (nb - 1));
        /* (a switch, so that each block has constant sizes) */
#define GD_TAIL(NB)                                                                                \
    case NB:                                                                                       \
        GD(block)(NB, 0, 0, last, S + j, lds, r, qa, k, wk + j, beta, w + j, o + j, NULL, NULL,    \
                  NULL);                                                                           \
        break
        switch (nb) {
#if DEC_NB > 7
            GD_TAIL(8);
#endif
#if DEC_NB > 6
            GD_TAIL(7);
#endif
#if DEC_NB > 5
            GD_TAIL(6);
#endif
#if DEC_NB > 4
            GD_TAIL(5);
#endif
#if DEC_NB > 3
            GD_TAIL(4);
#endif
#if DEC_NB > 2
            GD_TAIL(3);
#endif
            GD_TAIL(2);
        default:
            GD(block)(1, 0, 0, last, S + j, lds, r, qa, k, wk + j, beta, w + j, o + j, NULL, NULL,
                      NULL);
        }
#undef GD_TAIL
    }
    for (int c = 0; c < lone; c++) o[nv + c] = GD(lone_sum)(accl[c], r, qa, w[nv + c]);
}

#undef GD
#undef GD_CAT
#undef GD_CAT2
#undef DEC_WMEM
