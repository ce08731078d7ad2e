/* test_alias.c: outputs that overlap an input or another output are refused with PF_EINVAL,
 * before anything is written (performer.h, "Aliasing"), by every function that takes tensors:
 * exact, FAVOR+, RA and LARA forwards and their references, the backwards, the slices, the
 * features, the FAVOR++/FAVOR# fits, the decoding state and the language model's forward. Each is called with an output equal to each input in turn
 * and with an output overlapping another output by one element; the inputs must keep their
 * bytes (nothing was computed into them). pf_exp (y == x allowed) and pf_favor_slice_combine
 * (S2 == S allowed: an elementwise update) are the documented exceptions, checked too. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"

enum { B = 1, H = 2, L = 24, D = 8, DV = 8, M = 16 };
#define NQ ((size_t)B * H * L * D)
#define NO ((size_t)B * H * L * DV)

/* One arena for every tensor: Q, K, V, out, dout, dQ, dK, dV, lse, W, S, then spare. */
static float *arena;
static float *Q, *K, *V, *out, *dout, *dQ, *dK, *dV, *lse, *W, *S;
static double Ms[B * H];

static void fill(void) {
    fill_normal(Q, NQ, 0.5f, 1, 1);
    fill_normal(K, NQ, 0.5f, 1, 2);
    fill_normal(V, NO, 1.0f, 1, 3);
    fill_normal(dout, NO, 1.0f, 1, 4);
    fill_normal(out, NO, 1.0f, 1, 5);
    for (int i = 0; i < B * H * L; i++) lse[i] = 1.0f;
    pf_projection_draw(W, M, D, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 7, 0);
}

/* A copy of every input's bytes, to check that a refused call wrote nothing into them. */
static float *saved_inputs;
static size_t arena_n;
static void save(void) {
    memcpy(saved_inputs, arena, sizeof(float) * arena_n);
}
static int unchanged(void) {
    return memcmp(saved_inputs, arena, sizeof(float) * arena_n) == 0;
}

#define REFUSED(call, what)                                                                    \
    do {                                                                                       \
        fill();                                                                                \
        save();                                                                                \
        CHECK_STATUS(call, PF_EINVAL);                                                         \
        CHECK(unchanged(), "%s: a refused call changed memory", what);                         \
    } while (0)

int main(void) {
    const size_t parts[11] = {NQ, NQ, NO, NO, NO, NQ, NQ, NO, (size_t)B * H * L, (size_t)M * D,
                              (size_t)B * H * M * (DV + 1)};
    arena_n = 0;
    for (int i = 0; i < 11; i++) arena_n += parts[i];
    arena_n += 64;
    arena = calloc(arena_n, sizeof(float));
    saved_inputs = calloc(arena_n, sizeof(float));
    float **slot[11] = {&Q, &K, &V, &out, &dout, &dQ, &dK, &dV, &lse, &W, &S};
    size_t at = 0;
    for (int i = 0; i < 11; i++) {
        *slot[i] = arena + at;
        at += parts[i];
    }
    fill();
    pf_shape s = {B, H, L, L, D, DV};
    pf_attn_opts o = pf_attn_opts_default();
    pf_favor_opts f = pf_favor_opts_default();
    f.W = W;
    f.m = M;
    pf_sampling_opts sp = pf_sampling_opts_default();
    sp.proposals = 2;

    /* the calls work as given (no overlap) */
    CHECK_STATUS(pf_attn_favor(out, Q, K, V, &s, &o, &f), PF_OK);
    CHECK_STATUS(pf_attn_exact(out, lse, Q, K, V, &s, &o), PF_OK);

    /* forwards: out onto each input, and onto W; lse onto out */
    const float *ins[3] = {Q, K, V};
    const char *names[3] = {"Q", "K", "V"};
    for (int i = 0; i < 3; i++) {
        float *x = (float *)ins[i];
        printf("out = %s\n", names[i]);
        REFUSED(pf_attn_exact(x, NULL, Q, K, V, &s, &o), "exact");
        REFUSED(pf_attn_exact_ref(x, NULL, Q, K, V, &s, &o), "exact_ref");
        REFUSED(pf_attn_favor(x, Q, K, V, &s, &o, &f), "favor");
        REFUSED(pf_attn_favor_ref(x, Q, K, V, &s, &o, &f), "favor_ref");
        REFUSED(pf_attn_ra(x, Q, K, V, &s, &o, &sp), "ra");
        REFUSED(pf_attn_lara(x, Q, K, V, &s, &o, &sp), "lara");
        REFUSED(pf_attn_lara_ref(x, Q, K, V, &s, &o, &sp), "lara_ref");
    }
    REFUSED(pf_attn_favor(W, Q, K, V, &s, &o, &f), "favor: out onto W");
    REFUSED(pf_attn_exact(out, out + 1, Q, K, V, &s, &o), "exact: lse inside out");
    /* a partial overlap: out starting in V's last element */
    REFUSED(pf_attn_favor(V + NO - 1, Q, K, V, &s, &o, &f), "favor: out over V's end");
    int32_t kl[B] = {L};
    o.key_len = kl;
    REFUSED(pf_attn_favor((float *)(void *)kl, Q, K, V, &s, &o, &f), "favor: out onto key_len");
    o.key_len = NULL;

    /* backwards: each gradient onto each input, and onto one another */
    const float *bins[5] = {dout, Q, K, V, out};
    for (int gi = 0; gi < 3; gi++) {
        for (int i = 0; i < 5; i++) {
            float *g[3] = {dQ, dK, dV};
            g[gi] = (float *)bins[i];
            REFUSED(pf_attn_favor_backward(g[0], g[1], g[2], dout, Q, K, V, out, &s, &o, &f),
                    "favor_backward");
            REFUSED(pf_attn_exact_backward(g[0], g[1], g[2], dout, Q, K, V, out, lse, &s, &o),
                    "exact_backward");
            if (i == 4) continue; /* the references take no out */
            REFUSED(pf_attn_favor_backward_ref(g[0], g[1], g[2], dout, Q, K, V, &s, &o, &f),
                    "favor_backward_ref");
            REFUSED(pf_attn_exact_backward_ref(g[0], g[1], g[2], dout, Q, K, V, &s, &o),
                    "exact_backward_ref");
        }
    }
    REFUSED(pf_attn_favor_backward(dQ, dQ, dV, dout, Q, K, V, out, &s, &o, &f), "dK = dQ");
    REFUSED(pf_attn_exact_backward(dQ, dK, lse, dout, Q, K, V, out, lse, &s, &o), "dV = lse");

    /* kept features: the saved forward and backward refuse the same */
    pf_favor_saved *sv = NULL;
    CHECK_STATUS(pf_favor_saved_create(&sv, &s, &o, &f, 0), PF_OK);
    REFUSED(pf_attn_favor_save(K, Q, K, V, &s, &o, &f, sv), "favor_save");
    CHECK_STATUS(pf_attn_favor_save(out, Q, K, V, &s, &o, &f, sv), PF_OK);
    REFUSED(pf_attn_favor_backward_saved(dQ, dK, V, dout, Q, K, V, out, &s, &o, &f, sv),
            "favor_backward_saved");
    pf_favor_saved_free(sv);

    /* slices: the state, its gradient, the outputs */
    for (int h = 0; h < B * H; h++) Ms[h] = -INFINITY;
    o.causal = 1;
    REFUSED(pf_favor_slice_state(K, Ms, K, V, &s, &o, &f, NULL), "slice_state: S = K");
    REFUSED(pf_favor_slice_attn(S, Q, K, V, S, Ms, &s, &o, &f, NULL), "slice_attn: out = S");
    REFUSED(pf_favor_slice_attn(V, Q, K, V, S, Ms, &s, &o, &f, NULL), "slice_attn: out = V");
    REFUSED(pf_favor_slice_dstate(S, dout, Q, K, V, out, S, Ms, &s, &o, &f, NULL),
            "slice_dstate: dS = S");
    REFUSED(pf_favor_slice_backward(dQ, dK, out, dout, Q, K, V, out, S, Ms, NULL, &s, &o, &f, NULL),
            "slice_backward: dV = out");
    o.causal = 0;

    /* features: phi onto X or W, logscale inside phi */
    REFUSED(pf_features(Q, NULL, Q, L, D, W, M, PF_KERNEL_POSITIVE, 0.0f, 0.0f), "features: phi = X");
    REFUSED(pf_features(dQ, dQ + 3, Q, L, D, W, M, PF_KERNEL_POSITIVE, 0.0f, 0.0f),
            "features: logscale in phi");
    REFUSED(pf_features(W, NULL, Q, 4, D, W, M, PF_KERNEL_POSITIVE, 0.0f, 0.0f), "features: phi = W");

    /* decoding: out onto q, k or v */
    pf_favor_state *st = NULL;
    CHECK_STATUS(pf_favor_state_create(&st, H, D, DV, 0.0f, &f), PF_OK);
    REFUSED(pf_favor_state_step(st, Q, Q, K, V, 1), "state_step: out = q");
    REFUSED(pf_favor_state_step(st, V, Q, K, V, 1), "state_step: out = v");
    CHECK(pf_favor_state_position(st) == 0, "a refused step moved the position");
    CHECK_STATUS(pf_favor_state_step(st, out, Q, K, V, 1), PF_OK);
    pf_favor_state_free(st);

    /* the FAVOR++ / FAVOR# fits and the slices' sums */
    REFUSED(pf_oprf_optimal_a(Q + 5, Q, L, K, L, D, 0.0f), "oprf_optimal_a: A in Q");
    REFUSED(pf_sderf_params(dQ, dQ + 4, (double *)(void *)dK, Q, L, K, L, D, 0.0f),
            "sderf_params: B in A");
    REFUSED(pf_sderf_params(dQ, dK, (double *)(void *)K, Q, L, K, L, D, 0.0f),
            "sderf_params: log_D in K");
    f.kernel = PF_KERNEL_OPRF;
    REFUSED(pf_favor_slice_sums((double *)(void *)K, Q, K, &s, &o, &f), "slice_sums: sums = K");
    f.kernel = PF_KERNEL_POSITIVE;

    /* the language model: logits over the tokens, q over k */
    pf_model_config mc = pf_model_config_default();
    mc.layers = 1;
    mc.d_model = 16;
    mc.heads = 2;
    mc.context = 16;
    pf_model *lm = NULL;
    CHECK_STATUS(pf_model_create(&lm, &mc), PF_OK);
    int32_t *tok = (int32_t *)(void *)dV; /* 8 tokens, then logits of 8 x 256 floats elsewhere */
    for (int i = 0; i < 8; i++) tok[i] = 'a' + i;
    float *logits = calloc((size_t)8 * PF_LM_VOCAB + 16, sizeof(float));
    CHECK_STATUS(pf_model_forward(lm, NULL, logits, tok, NULL, 1, 8), PF_OK);
    CHECK_STATUS(pf_model_forward(lm, NULL, (float *)(void *)tok, tok, NULL, 1, 8), PF_EINVAL);
    CHECK_STATUS(pf_model_forward(lm, logits + 1, logits, tok, tok, 1, 8), PF_EINVAL);
    CHECK_STATUS(pf_model_attention_inputs(lm, logits, logits + 8, dQ, tok, 1, 8, 0), PF_EINVAL);
    CHECK_STATUS(pf_model_attention_inputs(lm, logits, logits + 256, logits + 512, tok, 1, 8, 0),
                 PF_OK);
    free(logits);
    pf_model_free(lm);

    /* the documented exceptions: pf_exp in place, a state combined with itself */
    float x[4] = {0.0f, 1.0f, -1.0f, 2.0f};
    pf_exp(x, x, 4);
    CHECK_CLOSE(x[1], exp(1.0), 1e-6, 1e-6);
    float a[2] = {1, 2};
    double ma = 0.0;
    CHECK_STATUS(pf_favor_slice_combine(a, &ma, a, &ma, 1, 1, 1), PF_OK);
    CHECK(a[0] == 2 && a[1] == 4 && ma == 0.0, "a state combined with itself doubles");

    free(arena);
    free(saved_inputs);
    TEST_MAIN_END();
}
