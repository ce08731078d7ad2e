/* favor.cu: the FAVOR+ forward on the GPU, bidirectional and causal.
 *
 * Per head, with Tc the type the products read (float32 for float32 inputs, bfloat16 for half
 * inputs: its exponent range is float32's, so features, weights and states rounded to it never
 * overflow or underflow where float32 would not) and every product accumulating in float32:
 *
 *   U = sqrt(s) X W^T                 cuBLAS, float32 out              ("project")
 *     (half inputs: widened to float32, which is exact, and multiplied on TF32 tensor cores:
 *     W keeps 2^-11 of relative precision there, which the exponential of the features needs;
 *     in bfloat16 it would carry 2^-8 of its size into u.)
 *   phi~(X), c(X)                     own kernel, one warp a row       ("features")
 *
 * bidirectional
 *   M = max_j c_j over valid keys; Vs_j = e^(c_j - M) [v_j | 1 | 0..]  ("weights")
 *   S = phi~(K)^T Vs                  (r x dw, float32)                ("chunk_states")
 *   O = phi~(Q) S                     (Lq x dw, float32)               ("readout_mm")
 *   out_i = O_i[:dv] / O_i[dv]                                         ("normalise")
 *
 * causal, chunks of C rows (t = 0, 1, ...), P_i = max_{j <= i} c_j (a running maximum that
 * looks at no later key), E_t = P at the end of chunk t (E_-1 = -inf):
 *   V1_j = [v_j | 1 | 0..], Vs_j = e^(c_j - E_t(j)) [v_j|1]            ("weights")
 *   dS_t = phi~(K_t)^T Vs_t           every chunk at once, batched     ("chunk_states")
 *   Sb_t = sum_{u < t} e^(E_u - E_(t-1)) dS_u, the state before chunk t, referenced to E_(t-1):
 *          Sb_(t+1) = e^(E_(t-1) - E_t) Sb_t + dS_t                    ("prefix")
 *   A_t = phi~(Q_t) phi~(K_t)^T, A'_ij = A_ij e^(c_j - P_i) for j <= i, else exactly 0;
 *   phi~(Q_t) rows scaled by e^(E_(t-1) - P_i)                         ("scores")
 *   O_t = phi~(Q_t)' Sb_t + A'_t V1_t                                  ("readout_mm")
 * The weight of key j in row i rides in A' (rounded once, as A' is anyway), not in the values:
 * [v_j | 1] stays exact, and a key that dominates its row has the same rounding in the row's
 * numerator and denominator.
 * Every factor is <= 1, and row i reads only keys j <= i through exact zeros of A', so a later
 * key changes no bit of it. This is the CPU library's causal chunk (src/favor/scan.c) with the
 * chunks' states made by one batched product and a prefix instead of one after another.
 *
 * Heads are processed in groups that fit the context's workspace limit: memory is linear in L
 * per head in flight, whatever B*H. */
#include "favor_parts.cuh"

PF_CUDA_API pf_status pf_cuda_favor_workspace(size_t *per_head, size_t *fixed, pf_cuda_dtype dtype,
                                              const pf_shape *shape, const pf_attn_opts *opts,
                                              const pf_favor_opts *favor) {
    pf_cuda_clear_error();
    favor_plan p;
    pf_status st = plan_make(&p, dtype, shape, opts, favor);
    if (st != PF_OK) return st;
    if (per_head) *per_head = p.per_head;
    if (fixed) *fixed = p.fixed + 256;
    return PF_OK;
}


template <typename Tin, typename Tc>
static pf_status group_bidirectional(const favor_run &R, const favor_bufs &b, void *out,
                                     const void *Q, const void *K, const void *V, int bh0, int G) {
    const favor_plan *p = R.p;
    pf_cuda_ctx *ctx = R.ctx;
    const int Lq = p->Lq, Lk = p->Lk, r = p->r, dw = p->dw;
    const double tin = (double)p->tin, tc = (double)p->tc;
    pf_status st;
    const side_ptrs sp = side_of(R, b.phq, b.phk, b.c, NULL, NULL, bh0);
    Tc *phk = (Tc *)sp.phk, *phq = (Tc *)sp.phq;
    if ((st = features<Tin, Tc>(R, b, phk, sp.ck, sp.topk, K, Lk, Lk, bh0, G, R.klen)) != PF_OK)
        return st;
    k_chunk_max<<<grid_for((size_t)G * p->ncm * 32, 256), 256, 0, R.stream>>>(
        b.cm, sp.ck, Lk, MAX_ROWS, p->ncm, G);
    k_max<<<G, 256, 0, R.stream>>>(b.P, b.cm, p->ncm);
    pf_cuda_mark(ctx, ST_WEIGHTS);
    k_weights<Tin, Tc><<<grid_for((size_t)G * Lk, 8), dim3(32, 8), 0, R.stream>>>(
        NULL, (Tc *)b.vs, (const Tin *)V + (size_t)bh0 * Lk * p->dv, (size_t)Lk * p->dv, sp.ck,
        NULL, b.P, G, Lk, Lk, 1, p->dv, dw, ctx->flags);
    account(ctx, ST_WEIGHTS, 0, G * (Lk * p->dv * tin + Lk * dw * tc));
    pf_cuda_mark(ctx, ST_CHUNK);
    /* S (r x dw) = phi~(K)^T Vs: column-major S^T (dw x r) = Vs^T phi~(K) */
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_T, dw, r, Lk, 1.0f, b.vs, R.tc_t, dw,
                   (long long)Lk * dw, phk, r, (long long)Lk * r, 0.0f, b.st, dw,
                   (long long)r * dw, G, "key state phi(K)^T [V|1]")) != PF_OK)
        return st;
    account(ctx, ST_CHUNK, 2.0 * G * Lk * r * dw, G * (Lk * (r + dw) * tc + r * dw * 4.0));
    if ((st = features<Tin, Tc>(R, b, phq, NULL, sp.topq, Q, Lq, Lq, bh0, G, NULL)) != PF_OK)
        return st;
    const void *S = b.st;
    pf_cuda_mark(ctx, ST_PREFIX);
    if (p->tc == 2) {
        const size_t n = (size_t)G * r * dw;
        k_to_tc<Tc><<<grid_for(n, 256), 256, 0, R.stream>>>((Tc *)b.sb, b.st, n);
        S = b.sb;
        account(ctx, ST_PREFIX, 0, n * (4.0 + tc));
    }
    pf_cuda_mark(ctx, ST_READOUT);
    /* O (Lq x dw) = phi~(Q) S: column-major O^T = S^T phi~(Q)^T */
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_N, dw, Lq, r, 1.0f, S, R.tc_t, dw, (long long)r * dw,
                   phq, r, (long long)Lq * r, 0.0f, b.o, dw, (long long)Lq * dw, G,
                   "readout phi(Q) S")) != PF_OK)
        return st;
    account(ctx, ST_READOUT, 2.0 * G * Lq * r * dw, G * (Lq * r * tc + r * dw * tc + Lq * dw * 4.0));
    pf_cuda_mark(ctx, ST_NORM);
    k_normalise<Tin><<<grid_for((size_t)G * Lq, 8), dim3(32, 8), 0, R.stream>>>(
        (Tin *)out + (size_t)bh0 * Lq * p->dv, b.o, NULL, NULL, NULL, 1, 1, G, Lq, Lq, p->dv, dw,
        ctx->flags);
    account(ctx, ST_NORM, 0, G * (Lq * dw * 4.0 + Lq * p->dv * tin));
    return PF_OK;
}

template <typename Tin, typename Tc>
static pf_status group_causal(const favor_run &R, const favor_bufs &b, void *out, const void *Q,
                              const void *K, const void *V, int bh0, int G) {
    const favor_plan *p = R.p;
    pf_cuda_ctx *ctx = R.ctx;
    const int L = p->Lq, Lp = p->Lp, C = p->C, nch = p->nch, r = p->r, dw = p->dw;
    const double tin = (double)p->tin, tc = (double)p->tc;
    const size_t per = (size_t)r * dw;
    pf_status st;
    const side_ptrs sp = side_of(R, b.phq, b.phk, b.c, NULL, NULL, bh0);
    Tc *phk = (Tc *)sp.phk, *phq = (Tc *)sp.phq;
    /* keys: features, log factors, running maxima, weighted values */
    if ((st = features<Tin, Tc>(R, b, phk, sp.ck, sp.topk, K, L, Lp, bh0, G, R.klen)) != PF_OK)
        return st;
    k_chunk_max<<<grid_for((size_t)G * nch * 32, 256), 256, 0, R.stream>>>(b.cm, sp.ck, Lp, C,
                                                                            nch, G);
    k_chunk_scan<<<G, 1024, 0, R.stream>>>(b.eref, b.alpha, b.cm, nch);
    k_row_prefix<<<grid_for((size_t)G * nch * 32, 256), 256, 0, R.stream>>>(b.P, sp.ck, b.eref,
                                                                             Lp, C, nch, G);
    account(ctx, ST_FEATURES, 0, G * Lp * 16.0);
    if ((st = features<Tin, Tc>(R, b, phq, NULL, sp.topq, Q, L, Lp, bh0, G, NULL)) != PF_OK)
        return st;
    pf_cuda_mark(ctx, ST_WEIGHTS);
    k_weights<Tin, Tc><<<grid_for((size_t)G * Lp, 8), dim3(32, 8), 0, R.stream>>>(
        (Tc *)b.vw, (Tc *)b.vs, (const Tin *)V + (size_t)bh0 * L * p->dv, (size_t)L * p->dv, sp.ck,
        b.P, NULL, G, Lp, L, C, p->dv, dw, ctx->flags);
    account(ctx, ST_WEIGHTS, 0, G * (L * p->dv * tin + 2.0 * Lp * dw * tc));
    /* dS_t (r x dw) = phi~(K_t)^T Vs_t for every chunk; column-major dS^T = Vs_t^T phi~(K_t).
     * (b.st is the projection's buffer, free now that both sides' features are made.) */
    pf_cuda_mark(ctx, ST_CHUNK);
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_T, dw, r, C, 1.0f, b.vs, R.tc_t, dw,
                   (long long)C * dw, phk, r, (long long)C * r, 0.0f, b.st, dw,
                   (long long)per, G * nch, "chunk states phi(K_t)^T [V_t|1]")) != PF_OK)
        return st;
    account(ctx, ST_CHUNK, 2.0 * G * Lp * r * dw, G * (Lp * (r + dw) * tc + nch * per * 4.0));
    pf_cuda_mark(ctx, ST_PREFIX);
    k_state_prefix<Tc><<<grid_for((size_t)G * per, 256), 256, 0, R.stream>>>(
        (Tc *)b.sb, b.st, b.alpha, G, nch, per);
    account(ctx, ST_PREFIX, 0, G * nch * per * (4.0 + tc));
    /* A_t (C x C) = phi~(Q_t) phi~(K_t)^T; column-major A^T = phi~(K_t) phi~(Q_t)^T */
    pf_cuda_mark(ctx, ST_SCORES);
    if ((st = gemm(R, CUBLAS_OP_T, CUBLAS_OP_N, C, C, r, 1.0f, phk, R.tc_t, r,
                   (long long)C * r, phq, r, (long long)C * r, 0.0f, b.a32, C,
                   (long long)C * C, G * nch, "chunk scores phi(Q_t) phi(K_t)^T")) != PF_OK)
        return st;
    {
        const size_t n = (size_t)G * Lp * C;
        k_mask<Tc><<<grid_for(n, 256), 256, 0, R.stream>>>((Tc *)b.a, b.a32, b.P, sp.ck, G, Lp, C);
    }
    account(ctx, ST_SCORES, 2.0 * G * Lp * C * r,
            G * (2.0 * Lp * r * tc + Lp * C * (8.0 + tc)));
    /* O_t = phi~(Q_t) Sb_t and O2_t = A'_t V1_t (the normalisation rebases and adds them);
     * column-major O^T = Sb^T phi~(Q_t)^T, O2^T = V1^T A'^T */
    pf_cuda_mark(ctx, ST_READOUT);
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_N, dw, C, r, 1.0f, b.sb, R.tc_t, dw, (long long)per,
                   phq, r, (long long)C * r, 0.0f, b.o, dw, (long long)C * dw, G * nch,
                   "chunk readout phi(Q_t) Sb_t")) != PF_OK)
        return st;
    if ((st = gemm(R, CUBLAS_OP_N, CUBLAS_OP_N, dw, C, C, 1.0f, b.vw, R.tc_t, dw,
                   (long long)C * dw, b.a, C, (long long)C * C, 0.0f, b.o2, dw, (long long)C * dw,
                   G * nch, "chunk readout A'_t V1_t")) != PF_OK)
        return st;
    account(ctx, ST_READOUT, 2.0 * G * Lp * dw * (r + C),
            G * (Lp * r * tc + nch * per * tc + Lp * C * tc + Lp * dw * (tc + 8.0)));
    pf_cuda_mark(ctx, ST_NORM);
    k_normalise<Tin><<<grid_for((size_t)G * L, 8), dim3(32, 8), 0, R.stream>>>(
        (Tin *)out + (size_t)bh0 * L * p->dv, b.o, b.o2, b.P, b.eref, C, nch, G, Lp, L, p->dv, dw,
        ctx->flags);
    account(ctx, ST_NORM, 0, G * (2.0 * L * dw * 4.0 + L * p->dv * tin));
    return PF_OK;
}

template <typename Tin, typename Tc>
static pf_status run_all(const favor_run &R, void *out, const void *Q, const void *K,
                         const void *V, const float *W, int G) {
    const favor_plan *p = R.p;
    pf_cuda_ctx *ctx = R.ctx;
    const size_t wn = (size_t)(p->w_per_head ? p->H : 1) * p->m * p->d;
    favor_bufs b = bufs_carve(p, ctx->ws, G);
    pf_cuda_mark(ctx, ST_PROJECT);
    k_copy_w<<<grid_for(wn, 256), 256, 0, R.stream>>>(b.W, W, wn, ctx->flags);
    const int BH = p->B * p->H;
    for (int bh0 = 0; bh0 < BH; bh0 += G) {
        const int g = std::min(G, BH - bh0);
        pf_status st = p->causal ? group_causal<Tin, Tc>(R, b, out, Q, K, V, bh0, g)
                                 : group_bidirectional<Tin, Tc>(R, b, out, Q, K, V, bh0, g);
        if (st != PF_OK) return st;
    }
    pf_cuda_mark(ctx, -1);
    return PF_OK;
}

/* pf_cuda_favor, and with saved not NULL pf_cuda_favor_save. */
static pf_status favor_call(pf_cuda_ctx *ctx, void *out, const void *Q, const void *K,
                            const void *V, pf_cuda_dtype dtype, const pf_shape *shape,
                            const pf_attn_opts *opts, const pf_favor_opts *favor,
                            pf_cuda_favor_saved *saved, cudaStream_t stream) {
    pf_cuda_clear_error();
    if (!ctx) return pf_cuda_fail(PF_EINVAL, "pf_cuda_favor: ctx is NULL");
    favor_plan p;
    pf_status st = plan_make(&p, dtype, shape, opts, favor);
    if (st != PF_OK) return st;
    if (saved) {
        saved->filled = 0;
        if ((st = saved_matches(saved, ctx, dtype, shape, opts, favor)) != PF_OK) return st;
    }
    pf_device_guard guard(ctx->device);
    if (!guard.ok) return pf_cuda_err(cudaGetLastError(), "cudaSetDevice");
    const struct {
        const void *ptr;
        const char *name;
        size_t bytes;
    } t[5] = {
        {out, "out", (size_t)p.B * p.H * p.Lq * p.dv * p.tin},
        {Q, "Q", (size_t)p.B * p.H * p.Lq * p.d * p.tin},
        {K, "K", (size_t)p.B * p.H * p.Lk * p.d * p.tin},
        {V, "V", (size_t)p.B * p.H * p.Lk * p.dv * p.tin},
        {favor->W, "favor.W", (size_t)(p.w_per_head ? p.H : 1) * p.m * p.d * sizeof(float)},
    };
    for (int i = 0; i < 5; i++)
        if ((st = pf_cuda_check_ptr(ctx, t[i].ptr, t[i].name)) != PF_OK) return st;
    for (int i = 1; i < 5; i++)
        if (overlaps(out, t[0].bytes, t[i].ptr, t[i].bytes))
            return pf_cuda_fail(PF_EINVAL, "out overlaps %s: the output needs memory of its own",
                                t[i].name);
    const int32_t *klen = NULL;
    std::vector<int32_t> klen_host;
    if ((st = key_lengths(ctx, opts->key_len, p.B, p.Lk, stream, &klen, &klen_host)) != PF_OK)
        return st;
    favor_run R;
    int G;
    if ((st = run_begin(&R, &G, ctx, &p, p.per_head, p.fixed, klen, saved, (int)p.tc, stream)) !=
        PF_OK)
        return st;
    ctx->nmarks = 0;
    const float *W = favor->W;
    switch (dtype) {
    case PF_CUDA_F32: st = run_all<float, float>(R, out, Q, K, V, W, G); break;
    case PF_CUDA_BF16: st = run_all<__nv_bfloat16, __nv_bfloat16>(R, out, Q, K, V, W, G); break;
    case PF_CUDA_F16: st = run_all<__half, __nv_bfloat16>(R, out, Q, K, V, W, G); break;
    }
    if (st != PF_OK) {
        cudaStreamSynchronize(stream);
        cudaGetLastError();
        ctx->nmarks = 0;
        return st;
    }
    st = pf_cuda_flags_read(ctx, stream);
    pf_cuda_marks_collect(ctx);
    if (st == PF_ENONFINITE || st == PF_EDOMAIN) {
        /* rows were written as zeros where a denominator failed; an input NaN can leave other
         * rows with values computed from zeroed features: the whole output is zeroed */
        if (ctx->flags_host[0]) { /* PF_FLAG_INPUT */
            cudaMemsetAsync(out, 0, t[0].bytes, stream);
            cudaStreamSynchronize(stream);
        }
    }
    if (saved && (st == PF_OK || st == PF_EDOMAIN) && !ctx->flags_host[0]) {
        saved->klen = klen_host;
        saved->filled = 1;
    }
    return st;
}

PF_CUDA_API pf_status pf_cuda_favor(pf_cuda_ctx *ctx, void *out, const void *Q, const void *K,
                                    const void *V, pf_cuda_dtype dtype, const pf_shape *shape,
                                    const pf_attn_opts *opts, const pf_favor_opts *favor,
                                    cudaStream_t stream) {
    return favor_call(ctx, out, Q, K, V, dtype, shape, opts, favor, NULL, stream);
}

PF_CUDA_API pf_status pf_cuda_favor_save(pf_cuda_ctx *ctx, void *out, const void *Q, const void *K,
                                         const void *V, pf_cuda_dtype dtype,
                                         const pf_shape *shape, const pf_attn_opts *opts,
                                         const pf_favor_opts *favor, pf_cuda_favor_saved *saved,
                                         cudaStream_t stream) {
    pf_cuda_clear_error();
    if (!saved) return pf_cuda_fail(PF_EINVAL, "pf_cuda_favor_save: saved is NULL");
    return favor_call(ctx, out, Q, K, V, dtype, shape, opts, favor, saved, stream);
}
