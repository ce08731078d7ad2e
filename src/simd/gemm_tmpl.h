/* gemm_tmpl.h: the small matrix products of the vector paths (pf_simd_table.gemm), written once
 * over a few macros and included by simd_avx2.c and simd_avx512.c, which define:
 *   VF            the vector type, VW floats wide
 *   VMASK         a lane mask type; v_mask(n) enables lanes [0, n), 1 <= n <= VW
 *   v_zero(), v_set1(x), v_load(p), v_loadm(p, m) (masked-off lanes read as 0, not touched),
 *   v_store(p, v), v_storem(p, v, m), v_fma(a, b, c) = a b + c, v_mul(a, b), v_sum(v) (the sum
 *   of the lanes, in a fixed order); optionally v_sums_tile(acc, alpha, beta, C, ldc), which
 *   finishes a whole DOT_MI x DOT_NJ tile of dot products with the very bits of v_sum
 *   GEMM_MR x GEMM_NB  the register tile of the broadcast kernel: GEMM_MR rows of C by GEMM_NB
 *                      vectors of columns
 *   DOT_MI x DOT_NJ    the register tile of the dot kernel
 *   GEMM_NAME          the function's name
 *
 * C (m x n) = alpha op(A) op(B) + beta C (see pf_simd_table). Every element of C is made by one
 * fixed sequence of operations that depends on its row of op(A), its column of op(B), k, alpha,
 * beta and which of three column kinds it is in (set by n alone) — never on m, on where the
 * element sits in its tile, or on the thread. So a product of one row gives the bits the same
 * row gets in a product of many: a decoding step equals the full pass.
 *
 *   op(B) = B (k x n, rows contiguous): C's rows in groups of GEMM_MR, its columns in vectors;
 *     each step p broadcasts A(i, p) and adds it times B's row p into GEMM_MR x GEMM_NB
 *     vectors of accumulators, p = 0, 1, ..., k-1 in order.
 *     When n mod VW is 1 or 2 (the [V | 1] layout's ones column), those last columns are done
 *     apart, not as a vector of mostly idle lanes (25% more work for dv = 64): by dot products
 *     over p when A's rows are contiguous, by vectors over C's rows when A's columns are.
 *   op(B) = B^T (B n x k, rows contiguous; A's rows contiguous): C(i, j) is a dot product of
 *     two contiguous rows: lanes take p in steps of VW, then v_sum.
 * alpha is applied to the finished sum (not when 1), then beta C is added (C not read when
 * beta is 0). */

#if GEMM_MR < 4 || GEMM_MR > 6 || GEMM_NB < 2 || GEMM_NB > 4
#error "gemm_tmpl.h: tiles of 4 to 6 rows and 2 to 4 vectors (the dispatch switches below)"
#endif

#define GT_CAT2(a, b) a##b
#define GT_CAT(a, b) GT_CAT2(a, b)
#define GT(name) GT_CAT(GEMM_NAME, _##name)

/* alpha s + beta c, the last step of every element */
static inline __attribute__((always_inline)) VF GT(finish)(VF s, float alpha, float beta, VF c) {
    if (alpha != 1.0f) s = v_mul(v_set1(alpha), s);
    return beta == 0.0f ? s : v_fma(v_set1(beta), c, s);
}

static inline __attribute__((always_inline)) float GT(finish1)(float s, float alpha, float beta,
                                                               const float *c) {
    if (alpha != 1.0f) s = alpha * s;
    return beta == 0.0f ? s : __builtin_fmaf(beta, *c, s);
}

/* Lines of the next rows of A to fetch ahead, one per step p of a tile: pf.n lines in all,
 * pf.per of them a row, rows pf.rs floats apart from pf.a (n = 0: none). */
typedef struct {
    const char *a;
    size_t rs;
    int per, n;
} GT(ahead);

/* Step p of a register tile: acc += A(0..MR-1, p) B(p, cols), the last vector masked by last
 * unless full. */
static inline __attribute__((always_inline)) void
GT(step)(int MR, int NB, int full, VMASK last, VF acc[GEMM_MR][GEMM_NB], const float *ap, size_t rs,
         const float *bp) {
    VF bv[GEMM_NB];
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++)
        bv[b] = (full || b < NB - 1) ? v_load(bp + VW * b) : v_loadm(bp + VW * b, last);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        const VF a = v_set1(ap[(size_t)i * rs]);
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) acc[i][b] = v_fma(a, bv[b], acc[i][b]);
    }
}

/* One register tile of the broadcast kernel: MR rows, NB vectors of columns (the last masked by
 * last unless full). MR and NB are constants after inlining. While it runs it fetches the lines
 * of pf (the next tile's rows of A, when A comes from memory: a prefetch in step p, spread
 * over the tile so that the misses overlap the arithmetic, changes no result); the steps after
 * the last fetch run in a loop of their own, with no test of p beside the arithmetic (with 16
 * registers the tile holds every one, and the test's counters went to the stack). */
static inline __attribute__((always_inline)) void
GT(tile)(int MR, int NB, int full, VMASK last, int k, const float *A, size_t rs, size_t cs,
         const float *B, size_t ldb, float alpha, float beta, float *C, size_t ldc, GT(ahead) pf) {
    VF acc[GEMM_MR][GEMM_NB];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) acc[i][b] = v_zero();
    int p = 0;
    if (pf.n > 0) {
        int pl = 0;            /* line within the row */
        const char *pr = pf.a; /* the row */
        for (; p < pf.n; p++) {
            __builtin_prefetch(pr + 64 * pl, 0, 3);
            if (++pl == pf.per) {
                pl = 0;
                pr += pf.rs * sizeof(float);
            }
            GT(step)(MR, NB, full, last, acc, A + (size_t)p * cs, rs, B + (size_t)p * ldb);
        }
    }
    for (; p < k; p++)
        GT(step)(MR, NB, full, last, acc, A + (size_t)p * cs, rs, B + (size_t)p * ldb);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        float *c = C + (size_t)i * ldc;
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) {
            if (full || b < NB - 1) {
                const VF old = beta == 0.0f ? v_zero() : v_load(c + VW * b);
                v_store(c + VW * b, GT(finish)(acc[i][b], alpha, beta, old));
            } else {
                const VF old = beta == 0.0f ? v_zero() : v_loadm(c + VW * b, last);
                v_storem(c + VW * b, GT(finish)(acc[i][b], alpha, beta, old), last);
            }
        }
    }
}

/* The tiles of MR rows (1 <= MR <= GEMM_MR) across n columns, n a multiple of VW or with a
 * masked last vector. */
static inline __attribute__((always_inline)) void GT(rows)(int MR, int n, int k, const float *A,
                                                           size_t rs, size_t cs, const float *B,
                                                           size_t ldb, float alpha, float beta,
                                                           float *C, size_t ldc, GT(ahead) pf) {
    const int step = GEMM_NB * VW;
    int j = 0;
    for (; j + step <= n; j += step) {
        GT(tile)(MR, GEMM_NB, 1, v_mask(VW), k, A, rs, cs, B + j, ldb, alpha, beta, C + j, ldc, pf);
        pf.n = 0; /* (fetched by the first tile) */
    }
    const int left = n - j;
    if (left == 0) return;
    const int nb = (left + VW - 1) / VW;
    const VMASK last = v_mask(left - VW * (nb - 1));
    /* (a switch, so that each tile has constant sizes) */
#define GT_TAIL(NB)                                                                                \
    case NB:                                                                                       \
        GT(tile)(MR, NB, 0, last, k, A, rs, cs, B + j, ldb, alpha, beta, C + j, ldc, pf);          \
        break
    switch (nb) {
#if GEMM_NB > 3
        GT_TAIL(4);
#endif
#if GEMM_NB > 2
        GT_TAIL(3);
#endif
        GT_TAIL(2);
    default:
        GT(tile)(MR, 1, 0, last, k, A, rs, cs, B + j, ldb, alpha, beta, C + j, ldc, pf);
    }
#undef GT_TAIL
}

/* One column of C apart (see the head of this file): column j of B (stride ldb) and of C. Each
 * element is one chain of FMAs over p; COL_G of them go side by side (rows, or groups of VW
 * rows) so that their latencies overlap, each element's own sequence of operations unchanged
 * (the FAVOR+ forward on the AVX2 kernels, L = 4096, 8 heads, one thread: 1.0% faster
 * bidirectional, 1.5% causal; the AVX-512 kernels' unchanged). */
enum { COL_G = 4, COL_SEG = 1024 };

/* G (1 or COL_G) rows of the column from row i on, A's rows contiguous: dot products over p with
 * B's column, copied into col (COL_SEG floats at a time; once for all rows when k <= COL_SEG). */
static inline __attribute__((always_inline)) void
GT(column_rows)(int G, int i, int k, const float *A, size_t rs, const float *Bj, size_t ldb,
                float alpha, float beta, float *Cj, size_t ldc, float *col) {
    VF acc[COL_G];
#pragma GCC unroll 8
    for (int g = 0; g < G; g++) acc[g] = v_zero();
    const float *a = A + (size_t)i * rs;
    for (int p0 = 0; p0 < k; p0 += COL_SEG) {
        const int len = k - p0 < COL_SEG ? k - p0 : COL_SEG;
        if (i == 0 || k > COL_SEG)
            for (int p = 0; p < len; p++) col[p] = Bj[(size_t)(p0 + p) * ldb];
        int p = 0;
        for (; p + VW <= len; p += VW) {
            const VF cv = v_load(col + p);
#pragma GCC unroll 8
            for (int g = 0; g < G; g++)
                acc[g] = v_fma(v_load(a + (size_t)g * rs + p0 + p), cv, acc[g]);
        }
        if (p < len) {
            const VMASK mk = v_mask(len - p);
            const VF cv = v_loadm(col + p, mk);
#pragma GCC unroll 8
            for (int g = 0; g < G; g++)
                acc[g] = v_fma(v_loadm(a + (size_t)g * rs + p0 + p, mk), cv, acc[g]);
        }
    }
#pragma GCC unroll 8
    for (int g = 0; g < G; g++) {
        float *c = Cj + (size_t)(i + g) * ldc;
        *c = GT(finish1)(v_sum(acc[g]), alpha, beta, c);
    }
}

static void GT(column)(int m, int k, const float *A, size_t rs, size_t cs, const float *Bj,
                       size_t ldb, float alpha, float beta, float *Cj, size_t ldc) {
    if (cs == 1) { /* A's rows contiguous: each C(i, j) a dot product over p */
        float col[COL_SEG];
        int i = 0;
        for (; i + COL_G <= m; i += COL_G)
            GT(column_rows)(COL_G, i, k, A, rs, Bj, ldb, alpha, beta, Cj, ldc, col);
        for (; i < m; i++) GT(column_rows)(1, i, k, A, rs, Bj, ldb, alpha, beta, Cj, ldc, col);
        return;
    }
    /* A's columns contiguous (rs == 1, op(A) = A^T): VW rows of C at a time, COL_G such groups
     * side by side while whole */
    int i0 = 0;
    for (; i0 + COL_G * VW <= m; i0 += COL_G * VW) {
        VF acc[COL_G];
#pragma GCC unroll 8
        for (int g = 0; g < COL_G; g++) acc[g] = v_zero();
        for (int p = 0; p < k; p++) {
            const VF b = v_set1(Bj[(size_t)p * ldb]);
            const float *a = A + (size_t)p * cs + (size_t)i0 * rs;
#pragma GCC unroll 8
            for (int g = 0; g < COL_G; g++)
                acc[g] = v_fma(v_load(a + (size_t)(g * VW) * rs), b, acc[g]);
        }
#pragma GCC unroll 8
        for (int g = 0; g < COL_G; g++) {
            float s[VW];
            v_store(s, acc[g]);
            for (int i = 0; i < VW; i++) {
                float *c = Cj + (size_t)(i0 + g * VW + i) * ldc;
                *c = GT(finish1)(s[i], alpha, beta, c);
            }
        }
    }
    for (; i0 < m; i0 += VW) {
        const int len = m - i0 < VW ? m - i0 : VW;
        const VMASK mk = v_mask(len);
        VF acc = v_zero();
        if (len == VW) /* (plain loads: a masked one costs more on some cores) */
            for (int p = 0; p < k; p++)
                acc = v_fma(v_load(A + (size_t)p * cs + (size_t)i0 * rs),
                            v_set1(Bj[(size_t)p * ldb]), acc);
        else
            for (int p = 0; p < k; p++)
                acc = v_fma(v_loadm(A + (size_t)p * cs + (size_t)i0 * rs, mk),
                            v_set1(Bj[(size_t)p * ldb]), acc);
        float s[VW];
        v_store(s, acc);
        for (int i = 0; i < len; i++) {
            float *c = Cj + (size_t)(i0 + i) * ldc;
            *c = GT(finish1)(s[i], alpha, beta, c);
        }
    }
}

/* One dot-kernel tile: MI rows of A by NJ rows of B, k long, both contiguous. */
static inline __attribute__((always_inline)) void GT(dots)(int MI, int NJ, int k, const float *A,
                                                           size_t lda, const float *B, size_t ldb,
                                                           float alpha, float beta, float *C,
                                                           size_t ldc) {
    VF acc[DOT_MI][DOT_NJ];
#pragma GCC unroll 8
    for (int i = 0; i < MI; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NJ; j++) acc[i][j] = v_zero();
    int p = 0;
    for (; p + VW <= k; p += VW) {
        VF a[DOT_MI], b[DOT_NJ];
#pragma GCC unroll 8
        for (int i = 0; i < MI; i++) a[i] = v_load(A + (size_t)i * lda + p);
#pragma GCC unroll 8
        for (int j = 0; j < NJ; j++) b[j] = v_load(B + (size_t)j * ldb + p);
#pragma GCC unroll 8
        for (int i = 0; i < MI; i++)
#pragma GCC unroll 8
            for (int j = 0; j < NJ; j++) acc[i][j] = v_fma(a[i], b[j], acc[i][j]);
    }
    if (p < k) {
        const VMASK mk = v_mask(k - p);
        VF a[DOT_MI], b[DOT_NJ];
#pragma GCC unroll 8
        for (int i = 0; i < MI; i++) a[i] = v_loadm(A + (size_t)i * lda + p, mk);
#pragma GCC unroll 8
        for (int j = 0; j < NJ; j++) b[j] = v_loadm(B + (size_t)j * ldb + p, mk);
#pragma GCC unroll 8
        for (int i = 0; i < MI; i++)
#pragma GCC unroll 8
            for (int j = 0; j < NJ; j++) acc[i][j] = v_fma(a[i], b[j], acc[i][j]);
    }
#ifdef v_sums_tile
    if (MI == DOT_MI && NJ == DOT_NJ) { /* all the tile's sums at once, bits as v_sum's */
        v_sums_tile(acc, alpha, beta, C, ldc);
        return;
    }
#endif
#pragma GCC unroll 8
    for (int i = 0; i < MI; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NJ; j++) {
            float *c = C + (size_t)i * ldc + j;
            *c = GT(finish1)(v_sum(acc[i][j]), alpha, beta, c);
        }
}

/* MI rows of C by dot products (op(B) = B^T): NJ columns a tile, then one at a time. */
static inline __attribute__((always_inline)) void GT(dot_rows)(int MI, int n, int k, const float *A,
                                                               size_t lda, const float *B,
                                                               size_t ldb, float alpha, float beta,
                                                               float *C, size_t ldc) {
    int j = 0;
    for (; j + DOT_NJ <= n; j += DOT_NJ)
        GT(dots)(MI, DOT_NJ, k, A, lda, B + (size_t)j * ldb, ldb, alpha, beta, C + j, ldc);
    for (; j < n; j++)
        GT(dots)(MI, 1, k, A, lda, B + (size_t)j * ldb, ldb, alpha, beta, C + j, ldc);
}

static void GEMM_NAME(int tb, int m, int n, int k, float alpha, const float *A, size_t rs,
                      size_t cs, const float *B, size_t ldb, float beta, float *C, size_t ldc) {
    if (m <= 0 || n <= 0) return;
    if (tb) { /* (cs == 1) */
        int i = 0;
        for (; i + DOT_MI <= m; i += DOT_MI)
            GT(dot_rows)
            (DOT_MI, n, k, A + (size_t)i * rs, rs, B, ldb, alpha, beta, C + (size_t)i * ldc, ldc);
        for (; i < m; i++)
            GT(dot_rows)
            (1, n, k, A + (size_t)i * rs, rs, B, ldb, alpha, beta, C + (size_t)i * ldc, ldc);
        return;
    }
    const int lone = n % VW <= 2 && n > VW ? n % VW : 0; /* columns done apart */
    const int nv = n - lone;
    /* A's rows contiguous (cs == 1): each row group fetches the next one's rows ahead */
    const int per = cs == 1 ? (int)(((size_t)k * sizeof(float) + 63) / 64) : 0;
    /* The order of the tiles. Row groups outer, each across all columns, reads all of B from L2
     * for every group when B is larger than L1: k lines a tile (a line of each row of B's
     * panel), against MR k / 16 for A's rows. So when A's rows are contiguous and B does not fit
     * in L1, panels of one tile's columns go outer: the panel (k x GEMM_NB VW) stays in L1 for
     * every row group and only A's rows come from L2 (Q~ (K~^T [V | 1]), 256 x 65 x 256, and
     * the causal chunk's [Q~ | A] [S ; Vw], 16 x 65 x 272: 2% and 10% faster on AVX2).
     * Where A is read by columns (rs == 1) each tile reads k lines of A too: no gain. Nor for
     * short tiles (k < 128: the projection, 256 x 256 x 64, ran 5-10% slower so on AVX2, whose
     * W^T panel is 4 KiB). Every element keeps its sequence of operations either way. */
    const int panel = cs == 1 && m > GEMM_MR && k >= 128 &&
                              (size_t)k * (size_t)nv * sizeof(float) > 32768
                          ? GEMM_NB * VW
                          : nv;
    for (int j0 = 0; j0 < nv; j0 += panel) {
        const int nc = nv - j0 < panel ? nv - j0 : panel;
        for (int i = 0; i < m; i += GEMM_MR) {
            const int mr = m - i < GEMM_MR ? m - i : GEMM_MR;
            const float *a = A + (size_t)i * rs;
            float *c = C + (size_t)i * ldc + j0;
            const int nxt = m - i - mr < GEMM_MR ? m - i - mr : GEMM_MR; /* next group's rows */
            GT(ahead) pf = {(const char *)(a + (size_t)mr * rs), rs, per, per * nxt};
            if (pf.n > k) pf.n = k;
            /* (a switch, so that each tile has constant sizes) */
#define GT_ROWS(MR)                                                                                \
    case MR:                                                                                       \
        GT(rows)(MR, nc, k, a, rs, cs, B + j0, ldb, alpha, beta, c, ldc, pf);                      \
        break
            switch (mr) {
#if GEMM_MR > 5
                GT_ROWS(6);
                GT_ROWS(5);
#endif
                GT_ROWS(4);
                GT_ROWS(3);
                GT_ROWS(2);
            default:
                GT(rows)(1, nc, k, a, rs, cs, B + j0, ldb, alpha, beta, c, ldc, pf);
            }
#undef GT_ROWS
        }
    }
    for (int j = nv; j < n; j++) GT(column)(m, k, A, rs, cs, B + j, ldb, alpha, beta, C + j, ldc);
}

#undef GT
#undef GT_CAT
#undef GT_CAT2
