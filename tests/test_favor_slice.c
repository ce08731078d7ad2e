/* test_favor_slice: FAVOR+ in slices (performer.h, "FAVOR+ in slices") against the single
 * process. A sequence is cut into contiguous slices of unequal lengths; each slice's sums,
 * key state and d/dS are combined in slice order as a sequence-parallel run would (here in one
 * process), and the assembled outputs and gradients are compared with pf_attn_favor and
 * pf_attn_favor_backward on the whole sequence: the same bits for one slice, float rounding
 * for several (the worst relative error is printed), for every feature map, bidirectional
 * (also Lq != Lk) and causal, with key padding; the same bits at 1 and 2 threads; the errors
 * the slice functions refuse. */
#include <math.h>
#include <string.h>

#include "check.h"

enum { B = 2, H = 2, D = 16, DV = 8, M_FEAT = 32 };

typedef struct cfg {
    pf_kernel kernel;
    int causal, Lq, Lk;
    int nq, cutq[5]; /* query slices */
    int nk, cutk[5]; /* key slices (causal: the query slices) */
    int pad;         /* key_len = {Lk, Lk - pad} */
    int a_given;     /* OPRF */
} cfg;

/* rows [o, o + n) of every (b, h) of X (B,H,L,w) into Y (B,H,n,w), or back (dir 1) */
static void rows(float *Y, float *X, int L, int w, int o, int n, int back) {
    for (int bh = 0; bh < B * H; bh++) {
        float *x = X + ((size_t)bh * L + o) * w, *y = Y + (size_t)bh * n * w;
        if (back)
            memcpy(x, y, sizeof(float) * n * w);
        else
            memcpy(y, x, sizeof(float) * n * w);
    }
}

static int bits_equal(const float *a, const float *b, size_t n) {
    return memcmp(a, b, sizeof(float) * n) == 0;
}


typedef struct result {
    float *out, *dQ, *dK, *dV;
} result;

/* The sliced run: every slice's sums, states, outputs, d/dS and gradients, combined in slice
 * order. Returns the worst status. */
static pf_status run_slices(result *res, const cfg *c, const float *Q, const float *K,
                            const float *V, const float *G, const int32_t *klen,
                            const pf_favor_opts *fv, int threads) {
    const int r = pf_kernel_width(fv->kernel, fv->m), heads = B * H;
    const size_t ns = (size_t)heads * r * (DV + 1);
    pf_attn_opts o = pf_attn_opts_default();
    o.causal = c->causal;
    o.threads = threads;
    const int nq = c->nq, nk = c->causal ? c->nq : c->nk;
    const int *cq = c->cutq, *ck = c->causal ? c->cutq : c->cutk;
    /* slice p: queries [qo[p], qo[p] + cq[p]), keys [ko[p], ko[p] + ck[p]) (bidirectional: the
     * query and key slices are separate lists; index p runs over each) */
    int qo[6] = {0}, ko[6] = {0};
    for (int p = 0; p < nq; p++) qo[p + 1] = qo[p] + cq[p];
    for (int p = 0; p < nk; p++) ko[p + 1] = ko[p] + ck[p];
    const int ns_max = nq > nk ? nq : nk;
    float *Sk[5], *dSq[5];
    double Mk[5][B * H], Mq[5][B * H];
    const size_t slen = pf_favor_slice_sums_len(&(pf_shape){B, H, 1, 1, D, DV}, fv);
    double *sums = calloc(slen * heads + 1, sizeof(double)), *part = malloc(sizeof(double) * (slen * heads + 1));
    pf_status worst = PF_OK;
#define WORST(x)                                                                               \
    do {                                                                                       \
        pf_status s_ = (x);                                                                    \
        if (s_ > worst) worst = s_;                                                            \
    } while (0)
    /* the sums: each query slice's and key slice's, added in order (bidirectional: a query
     * slice and a key slice are given together as slice p, the shorter list padded by empty
     * ones) */
    int32_t kl[B];
    float *buf = malloc(sizeof(float) * (size_t)heads * (c->Lq > c->Lk ? c->Lq : c->Lk) * 64);
    float *bq = malloc(sizeof(float) * (size_t)heads * c->Lq * D);
    float *bk = malloc(sizeof(float) * (size_t)heads * c->Lk * D);
    float *bv = malloc(sizeof(float) * (size_t)heads * c->Lk * DV);
    float *bo = malloc(sizeof(float) * (size_t)heads * c->Lq * DV);
    float *bg = malloc(sizeof(float) * (size_t)heads * c->Lq * DV);
    float *bdq = malloc(sizeof(float) * (size_t)heads * c->Lq * D);
    float *bdk = malloc(sizeof(float) * (size_t)heads * c->Lk * D);
    float *bdv = malloc(sizeof(float) * (size_t)heads * c->Lk * DV);
    (void)buf;
    for (int p = 0; p < ns_max; p++) {
        Sk[p] = calloc(ns, sizeof(float));
        dSq[p] = calloc(ns, sizeof(float));
    }
    for (int p = 0; slen && p < ns_max; p++) {
        /* (a query slice of 0 rows or key slice of 0 rows are not expressible: give each side
         * its own call with the other side's rows taken from its slice 0, counted as none) */
        const int lq = p < nq ? cq[p] : 0, lk = p < nk ? ck[p] : 0;
        pf_shape s = {B, H, lq ? lq : 1, lk ? lk : 1, D, DV};
        if (lq) rows(bq, (float *)Q, c->Lq, D, qo[p], lq, 0);
        if (lk) rows(bk, (float *)K, c->Lk, D, ko[p], lk, 0);
        if (!lq) rows(bq, (float *)Q, c->Lq, D, 0, 1, 0);
        for (int b = 0; b < B; b++) {
            int v = lk ? klen[b] - ko[p] : 0;
            kl[b] = v < 0 ? 0 : (v > s.Lk ? s.Lk : v);
        }
        if (!lk) rows(bk, (float *)K, c->Lk, D, 0, 1, 0);
        pf_attn_opts so = o;
        so.key_len = kl;
        so.causal = 0; /* (the sums need no causal shape) */
        WORST(pf_favor_slice_sums(part, bq, bk, &s, &so, fv));
        for (size_t i = 0; i < slen * heads; i++) {
            /* take only the sides this slice has */
            const size_t k = i % slen, D2 = (size_t)D;
            int qside = k == 0 || k == 2 || (k >= 4 && k < 4 + D2) ||
                        (k >= 4 + 2 * D2 && k < 4 + 2 * D2 + D2 * D2);
            if ((qside && lq) || (!qside && lk)) sums[i] += part[i];
        }
    }
    /* key states, and the state each query slice reads: bidirectional the total, causal the
     * prefix of the slices before it */
    float *tot = calloc(ns, sizeof(float));
    double Mt[B * H];
    for (int h = 0; h < heads; h++) Mt[h] = -INFINITY;
    float *pre[5];
    double Mp[5][B * H];
    for (int p = 0; p < nk; p++) {
        pf_shape s = {B, H, ck[p], ck[p], D, DV};
        rows(bk, (float *)K, c->Lk, D, ko[p], ck[p], 0);
        rows(bv, (float *)V, c->Lk, DV, ko[p], ck[p], 0);
        for (int b = 0; b < B; b++) {
            int v = klen[b] - ko[p];
            kl[b] = v < 0 ? 0 : (v > ck[p] ? ck[p] : v);
        }
        pf_attn_opts so = o;
        so.key_len = kl;
        pre[p] = malloc(sizeof(float) * ns);
        memcpy(pre[p], tot, sizeof(float) * ns);
        memcpy(Mp[p], Mt, sizeof Mt);
        WORST(pf_favor_slice_state(Sk[p], Mk[p], bk, bv, &s, &so, fv, slen ? sums : NULL));
        WORST(pf_favor_slice_combine(tot, Mt, Sk[p], Mk[p], heads, r, DV));
    }
    /* outputs and d/dS of each query slice */
    for (int p = 0; p < nq; p++) {
        const int lk = c->causal ? cq[p] : c->Lk, k0 = c->causal ? qo[p] : 0;
        pf_shape s = {B, H, cq[p], lk, D, DV};
        rows(bq, (float *)Q, c->Lq, D, qo[p], cq[p], 0);
        rows(bk, (float *)K, c->Lk, D, k0, lk, 0);
        rows(bv, (float *)V, c->Lk, DV, k0, lk, 0);
        rows(bg, (float *)G, c->Lq, DV, qo[p], cq[p], 0);
        for (int b = 0; b < B; b++) {
            int v = klen[b] - k0;
            kl[b] = v < 0 ? 0 : (v > lk ? lk : v);
        }
        pf_attn_opts so = o;
        so.key_len = kl;
        const float *S = c->causal ? pre[p] : tot;
        const double *Ms = c->causal ? Mp[p] : Mt;
        WORST(pf_favor_slice_attn(bo, bq, bk, bv, S, Ms, &s, &so, fv, slen ? sums : NULL));
        rows(bo, res->out, c->Lq, DV, qo[p], cq[p], 1);
        /* (out NULL: the denominators' bits as pf_attn_favor_backward's without out) */
        WORST(pf_favor_slice_dstate(dSq[p], bg, bq, bk, bv, NULL, S, Ms, &s, &so, fv,
                                    slen ? sums : NULL));
        for (int h = 0; h < heads; h++) Mq[p][h] = Ms[h];
    }
    /* gradients: bidirectional, every d/dS summed (all referenced to the total's reference);
     * causal, slice p gets the later slices' */
    float *R = calloc(ns, sizeof(float));
    double MR[B * H];
    if (!c->causal) {
        for (int h = 0; h < heads; h++) MR[h] = INFINITY;
        for (int p = 0; p < nq; p++) WORST(pf_favor_slice_dcombine(R, MR, dSq[p], Mq[p], heads, r, DV));
    }
    if (!c->causal) {
        /* dQ from each query slice (R total), dK, dV from each key slice */
        for (int p = 0; p < nq; p++) {
            pf_shape s = {B, H, cq[p], c->Lk, D, DV};
            rows(bq, (float *)Q, c->Lq, D, qo[p], cq[p], 0);
            rows(bg, (float *)G, c->Lq, DV, qo[p], cq[p], 0);
            pf_attn_opts so = o;
            so.key_len = klen;
            WORST(pf_favor_slice_backward(bdq, bdk, bdv, bg, bq, K, V, NULL, tot, Mt, R, &s, &so,
                                          fv, slen ? sums : NULL));
            rows(bdq, res->dQ, c->Lq, D, qo[p], cq[p], 1);
        }
        for (int p = 0; p < nk; p++) {
            pf_shape s = {B, H, c->Lq, ck[p], D, DV};
            rows(bk, (float *)K, c->Lk, D, ko[p], ck[p], 0);
            rows(bv, (float *)V, c->Lk, DV, ko[p], ck[p], 0);
            for (int b = 0; b < B; b++) {
                int v = klen[b] - ko[p];
                kl[b] = v < 0 ? 0 : (v > ck[p] ? ck[p] : v);
            }
            pf_attn_opts so = o;
            so.key_len = kl;
            WORST(pf_favor_slice_backward(bdq, bdk, bdv, G, Q, bk, bv, NULL, tot, Mt, R, &s, &so,
                                          fv, slen ? sums : NULL));
            rows(bdk, res->dK, c->Lk, D, ko[p], ck[p], 1);
            rows(bdv, res->dV, c->Lk, DV, ko[p], ck[p], 1);
        }
    } else {
        for (int p = 0; p < nq; p++) {
            for (int h = 0; h < heads; h++) MR[h] = INFINITY;
            memset(R, 0, sizeof(float) * ns);
            for (int q = p + 1; q < nq; q++)
                WORST(pf_favor_slice_dcombine(R, MR, dSq[q], Mq[q], heads, r, DV));
            pf_shape s = {B, H, cq[p], cq[p], D, DV};
            rows(bq, (float *)Q, c->Lq, D, qo[p], cq[p], 0);
            rows(bk, (float *)K, c->Lk, D, qo[p], cq[p], 0);
            rows(bv, (float *)V, c->Lk, DV, qo[p], cq[p], 0);
            rows(bg, (float *)G, c->Lq, DV, qo[p], cq[p], 0);
            for (int b = 0; b < B; b++) {
                int v = klen[b] - qo[p];
                kl[b] = v < 0 ? 0 : (v > cq[p] ? cq[p] : v);
            }
            pf_attn_opts so = o;
            so.key_len = kl;
            WORST(pf_favor_slice_backward(bdq, bdk, bdv, bg, bq, bk, bv, NULL, pre[p], Mp[p],
                                          p < nq - 1 ? R : NULL, &s, &so, fv, slen ? sums : NULL));
            rows(bdq, res->dQ, c->Lq, D, qo[p], cq[p], 1);
            rows(bdk, res->dK, c->Lk, D, qo[p], cq[p], 1);
            rows(bdv, res->dV, c->Lk, DV, qo[p], cq[p], 1);
        }
    }
    for (int p = 0; p < ns_max; p++) {
        free(Sk[p]);
        free(dSq[p]);
    }
    for (int p = 0; p < nk; p++) free(pre[p]);
    free(tot);
    free(R);
    free(sums);
    free(part);
    free(buf);
    free(bq), free(bk), free(bv), free(bo), free(bg), free(bdq), free(bdk), free(bdv);
    return worst;
}

static double worst_err = 0;

static void run_case(const cfg *c, const char *name) {
    const size_t nq = (size_t)B * H * c->Lq, nk = (size_t)B * H * c->Lk;
    float *Q = malloc(sizeof(float) * nq * D), *K = malloc(sizeof(float) * nk * D);
    float *V = malloc(sizeof(float) * nk * DV), *G = malloc(sizeof(float) * nq * DV);
    fill_normal(Q, nq * D, 0.7f, 11, 1);
    fill_normal(K, nk * D, 0.7f, 11, 2);
    fill_normal(V, nk * DV, 1.0f, 11, 3);
    fill_normal(G, nq * DV, 1.0f, 11, 4);
    float *W = malloc(sizeof(float) * M_FEAT * D);
    pf_projection_draw(W, M_FEAT, D, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 5, 0);
    pf_favor_opts fv = pf_favor_opts_default();
    fv.kernel = c->kernel;
    fv.W = W;
    fv.m = M_FEAT;
    fv.chunk = 8;
    if (c->kernel == PF_KERNEL_RELU) fv.eps = 1e-3f;
    if (c->kernel == PF_KERNEL_OPRF && c->a_given) {
        fv.oprf_a_given = 1;
        fv.oprf_a = -0.05f;
    }
    int32_t klen[B] = {c->Lk, c->Lk - c->pad};
    pf_shape s = {B, H, c->Lq, c->Lk, D, DV};
    pf_attn_opts o = pf_attn_opts_default();
    o.causal = c->causal;
    o.key_len = klen;
    result ref = {malloc(sizeof(float) * nq * DV), malloc(sizeof(float) * nq * D),
                  malloc(sizeof(float) * nk * D), malloc(sizeof(float) * nk * DV)};
    CHECK_STATUS(pf_attn_favor(ref.out, Q, K, V, &s, &o, &fv), PF_OK);
    CHECK_STATUS(pf_attn_favor_backward(ref.dQ, ref.dK, ref.dV, G, Q, K, V, NULL, &s, &o, &fv),
                 PF_OK);
    /* the float64 formula: how far the single process itself is from it sets the rounding
     * level the slices are held to */
    result f64 = {malloc(sizeof(float) * nq * DV), malloc(sizeof(float) * nq * D),
                  malloc(sizeof(float) * nk * D), malloc(sizeof(float) * nk * DV)};
    CHECK_STATUS(pf_attn_favor_ref(f64.out, Q, K, V, &s, &o, &fv), PF_OK);
    CHECK_STATUS(pf_attn_favor_backward_ref(f64.dQ, f64.dK, f64.dV, G, Q, K, V, &s, &o, &fv),
                 PF_OK);
    result got[2];
    for (int t = 0; t < 2; t++) {
        got[t] = (result){calloc(nq * DV, 4), calloc(nq * D, 4), calloc(nk * D, 4),
                          calloc(nk * DV, 4)};
        CHECK_STATUS(run_slices(&got[t], c, Q, K, V, G, klen, &fv, t + 1), PF_OK);
    }
    const float *g[4] = {got[0].out, got[0].dQ, got[0].dK, got[0].dV};
    const float *g2[4] = {got[1].out, got[1].dQ, got[1].dK, got[1].dV};
    const float *rf[4] = {ref.out, ref.dQ, ref.dK, ref.dV};
    const float *r64[4] = {f64.out, f64.dQ, f64.dK, f64.dV};
    const size_t n[4] = {nq * DV, nq * D, nk * D, nk * DV};
    const char *what[4] = {"out", "dQ", "dK", "dV"};
    const int one = c->nq == 1 && (c->causal || c->nk == 1);
    for (int i = 0; i < 4; i++) {
        CHECK(bits_equal(g[i], g2[i], n[i]), "%s %s: 1 and 2 threads differ", name, what[i]);
        /* normwise relative errors: slices against the single process, and the single process
         * against float64 (its own rounding: trig's features change sign, so its sums cancel
         * and its rounding is larger than the positive maps') */
        const double e = rel_err(g[i], rf[i], n[i]), e64 = rel_err(rf[i], r64[i], n[i]);
        const double tol = fmax(1e-6, 4 * e64);
        if (one) {
            CHECK(bits_equal(g[i], rf[i], n[i]), "%s %s: one slice is not the single process's "
                  "bits (rel %.3g)", name, what[i], e);
        } else {
            /* float rounding: sums associated per slice, chunks cut from each slice's start */
            CHECK(e <= tol, "%s %s: ||slices - one|| / ||one|| = %.3g > %.3g (single process "
                  "against float64: %.3g)", name, what[i], e, tol, e64);
        }
        if (e > worst_err) worst_err = e;
        printf("  %-34s %-3s rel %.2e (one process vs float64 %.2e)%s\n", name, what[i], e, e64,
               one ? " one slice" : "");
    }
    for (int t = 0; t < 2; t++) {
        free(got[t].out), free(got[t].dQ), free(got[t].dK), free(got[t].dV);
    }
    free(ref.out), free(ref.dQ), free(ref.dK), free(ref.dV);
    free(f64.out), free(f64.dQ), free(f64.dK), free(f64.dV);
    free(Q), free(K), free(V), free(G), free(W);
}

static void errors(void) {
    enum { L = 20 };
    const int r = M_FEAT;
    float *Q = calloc((size_t)B * H * L * D, 4), *K = calloc((size_t)B * H * L * D, 4);
    float *V = calloc((size_t)B * H * L * DV, 4), *out = calloc((size_t)B * H * L * DV, 4);
    float *W = malloc(sizeof(float) * M_FEAT * D);
    float *S = calloc((size_t)B * H * r * (DV + 1), 4);
    double Ms[B * H];
    fill_normal(Q, (size_t)B * H * L * D, 0.5f, 3, 1);
    fill_normal(K, (size_t)B * H * L * D, 0.5f, 3, 2);
    fill_normal(V, (size_t)B * H * L * DV, 1.0f, 3, 3);
    pf_projection_draw(W, M_FEAT, D, PF_PROJ_IID, PF_NORM_CHI, 5, 0);
    pf_favor_opts fv = pf_favor_opts_default();
    fv.W = W;
    fv.m = M_FEAT;
    pf_shape s = {B, H, L, L, D, DV};
    pf_attn_opts o = pf_attn_opts_default();
    o.causal = 1;
    int32_t kl[B] = {0, L};
    o.key_len = kl;
    for (int h = 0; h < B * H; h++) Ms[h] = -INFINITY;
    /* a slice with no state before it and no valid first key sees nothing */
    CHECK_STATUS(pf_favor_slice_attn(out, Q, K, V, S, Ms, &s, &o, &fv, NULL), PF_EINVAL);
    /* 0 valid keys is fine with a state to start from */
    for (int h = 0; h < B * H; h++) Ms[h] = 0;
    for (size_t i = 0; i < (size_t)B * H * r * (DV + 1); i++) S[i] = 1.0f;
    CHECK_STATUS(pf_favor_slice_attn(out, Q, K, V, S, Ms, &s, &o, &fv, NULL), PF_OK);
    /* key lengths outside [0, Lk], NaN or +inf references, non-finite states */
    kl[0] = L + 1;
    CHECK_STATUS(pf_favor_slice_attn(out, Q, K, V, S, Ms, &s, &o, &fv, NULL), PF_EINVAL);
    kl[0] = -1;
    CHECK_STATUS(pf_favor_slice_state(S, Ms, K, V, &s, &o, &fv, NULL), PF_EINVAL);
    kl[0] = L;
    Ms[1] = NAN;
    CHECK_STATUS(pf_favor_slice_attn(out, Q, K, V, S, Ms, &s, &o, &fv, NULL), PF_EINVAL);
    Ms[1] = INFINITY;
    CHECK_STATUS(pf_favor_slice_attn(out, Q, K, V, S, Ms, &s, &o, &fv, NULL), PF_EINVAL);
    Ms[1] = 0;
    S[5] = NAN;
    CHECK_STATUS(pf_favor_slice_attn(out, Q, K, V, S, Ms, &s, &o, &fv, NULL), PF_ENONFINITE);
    S[5] = 1;
    /* a NaN in the keys of the last head: the failure empties every head, as the header says
     * (S = 0, M = -inf), not only the head that failed */
    const size_t nS = (size_t)B * H * r * (DV + 1);
    const size_t klast = ((size_t)B * H - 1) * L * D + 7;
    const float k_was = K[klast];
    K[klast] = NAN;
    for (size_t i = 0; i < nS; i++) S[i] = 7.0f;
    for (int h = 0; h < B * H; h++) Ms[h] = 3.0;
    CHECK_STATUS(pf_favor_slice_state(S, Ms, K, V, &s, &o, &fv, NULL), PF_ENONFINITE);
    size_t nonzero = 0;
    for (size_t i = 0; i < nS; i++) nonzero += S[i] != 0.0f;
    int refs = 0;
    for (int h = 0; h < B * H; h++) refs += Ms[h] == -INFINITY;
    CHECK(nonzero == 0 && refs == B * H, "failed slice state: %zu nonzero of S, %d of %d refs -inf",
          nonzero, refs, B * H);
    K[klast] = k_was;
    for (int h = 0; h < B * H; h++) Ms[h] = 0;
    /* fitted maps need the sums; maps that fit nothing have none */
    fv.kernel = PF_KERNEL_SDERF;
    o.causal = 0;
    CHECK_STATUS(pf_favor_slice_state(S, Ms, K, V, &s, &o, &fv, NULL), PF_EINVAL);
    CHECK(pf_favor_slice_sums_len(&s, &fv) == 4 + 2 * D + 2 * D * D, "SDERF sums length");
    fv.kernel = PF_KERNEL_POSITIVE;
    double sums[8];
    CHECK(pf_favor_slice_sums_len(&s, &fv) == 0, "positive needs no sums");
    CHECK_STATUS(pf_favor_slice_sums(sums, Q, K, &s, &o, &fv), PF_EINVAL);
    /* the bidirectional backward needs the total d/dS */
    float *dQ = calloc((size_t)B * H * L * D, 4), *dK = calloc((size_t)B * H * L * D, 4);
    float *dV = calloc((size_t)B * H * L * DV, 4);
    CHECK_STATUS(pf_favor_slice_backward(dQ, dK, dV, out, Q, K, V, NULL, S, Ms, NULL, &s, &o, &fv,
                                         NULL),
                 PF_EINVAL);
    /* combining: -inf is an empty state, +inf and -inf empty gradients */
    float a[2 * 2] = {1, 2, 3, 4}, b2[2 * 2] = {10, 20, 30, 40};
    double ma = -INFINITY, mb = 0.5;
    CHECK_STATUS(pf_favor_slice_combine(a, &ma, b2, &mb, 1, 1, 1), PF_OK);
    CHECK(ma == 0.5 && a[0] == 10 && a[1] == 20, "combine into an empty state copies");
    double mc = INFINITY;
    float cg[2] = {7, 8};
    CHECK_STATUS(pf_favor_slice_dcombine(a, &ma, cg, &mc, 1, 1, 1), PF_OK);
    CHECK(ma == 0.5 && a[0] == 10, "an empty gradient changes nothing");
    double md = 1.5;
    CHECK_STATUS(pf_favor_slice_dcombine(a, &ma, cg, &md, 1, 1, 1), PF_OK);
    CHECK(ma == 0.5 && fabs(a[0] - (10 + 7 * exp(-1.0))) < 1e-5, "gradients to the smaller ref");
    /* NaN references are refused (and +inf for states), nothing changed, as slice_attn does */
    const float a0 = a[0];
    double bad[3] = {NAN, INFINITY, NAN};
    for (int i = 0; i < 2; i++) {
        double m1 = ma;
        CHECK_STATUS(pf_favor_slice_combine(a, &m1, b2, &bad[i], 1, 1, 1), PF_EINVAL);
        CHECK_STATUS(pf_favor_slice_combine(b2, &bad[i], a, &m1, 1, 1, 1), PF_EINVAL);
        CHECK(m1 == ma && a[0] == a0, "a refused combine changes nothing");
    }
    CHECK_STATUS(pf_favor_slice_dcombine(a, &ma, cg, &bad[2], 1, 1, 1), PF_EINVAL);
    CHECK_STATUS(pf_favor_slice_dcombine(cg, &bad[2], a, &ma, 1, 1, 1), PF_EINVAL);
    CHECK(ma == 0.5 && a[0] == a0, "a refused dcombine changes nothing");
    free(Q), free(K), free(V), free(out), free(W), free(S), free(dQ), free(dK), free(dV);
}

int main(void) {
    const pf_kernel kernels[6] = {PF_KERNEL_POSITIVE, PF_KERNEL_HYPERBOLIC, PF_KERNEL_TRIG,
                                  PF_KERNEL_RELU,     PF_KERNEL_OPRF,       PF_KERNEL_SDERF};
    for (int k = 0; k < 6; k++) {
        char name[96];
        const char *kn = pf_kernel_name(kernels[k]);
        for (int causal = 0; causal < 2; causal++) {
            if (causal && kernels[k] == PF_KERNEL_SDERF) continue; /* (no causal form) */
            for (int part = 0; part < 3; part++) {
                cfg c = {.kernel = kernels[k], .causal = causal, .Lq = 300, .Lk = 300, .pad = 70,
                         .a_given = causal};
                if (part == 0) { /* one slice */
                    c.nq = c.nk = 1;
                    c.cutq[0] = c.cutk[0] = 300;
                } else if (part == 1) { /* unequal, a slice of one row, padding across two */
                    c.nq = c.nk = 4;
                    int cut[4] = {97, 1, 150, 52};
                    memcpy(c.cutq, cut, sizeof cut);
                    memcpy(c.cutk, cut, sizeof cut);
                } else { /* bidirectional: Lq != Lk, different cuts; causal: three slices */
                    c.nq = 3;
                    int cq[3] = {40, 200, 60};
                    memcpy(c.cutq, cq, sizeof cq);
                    if (!causal) {
                        c.Lk = 217;
                        c.pad = 100;
                        c.nk = 2;
                        c.cutk[0] = 17;
                        c.cutk[1] = 200;
                    }
                }
                snprintf(name, sizeof name, "%s %s %d slice%s", kn,
                         causal ? "causal" : "bidir", c.nq, c.nq > 1 ? "s" : "");
                run_case(&c, name);
            }
        }
    }
    /* FAVOR++ with a given A, bidirectional */
    cfg c = {.kernel = PF_KERNEL_OPRF, .Lq = 300, .Lk = 300, .pad = 3, .a_given = 1, .nq = 2,
             .nk = 2, .cutq = {150, 150}, .cutk = {123, 177}};
    run_case(&c, "oprf bidir given A 2 slices");
    errors();
    printf("worst relative error, several slices against one process: %.3g\n", worst_err);
    TEST_MAIN_END();
}
