/* mqar.c: multi-query associative recall sequences (performer.h, pf_mqar_*): Zoology's synthetic
 * recall task (zoology/data/associative_recall.py, multiquery_ar) on bytes.
 *
 * Every draw is integer arithmetic on Philox words (no floating point at all), so a sequence has
 * the same bytes on every machine and with every compiler. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MQAR_MAX_KEYS 127 /* keys and values take 2K bytes; filler needs one at least */
#define SLOT_ONE (UINT64_C(1) << 40) /* slot g weighs floor(2^40 / (g + 1)) */

pf_mqar pf_mqar_default(void) {
    pf_mqar t = {.pairs = 8, .queries = 8, .keys = 64};
    return t;
}

pf_status pf_mqar_check(const pf_mqar *t, int T) {
    if (!t || t->keys < 1 || t->keys > MQAR_MAX_KEYS || t->pairs < 1 || t->pairs > t->keys ||
        t->queries < 1 || T < 1)
        return PF_EINVAL;
    /* N pairs take 2N positions; each query a slot of two (its key, then filler) */
    if ((int64_t)2 * t->pairs + (int64_t)2 * t->queries > T) return PF_EINVAL;
    return PF_OK;
}

/* Uniform in [0, n), n >= 1, without modulo bias (rejection). */
static uint64_t below(pf_rng *rng, uint64_t n) {
    const uint64_t lim = UINT64_MAX - UINT64_MAX % n; /* [0, lim) is a whole number of n's */
    uint64_t r;
    do {
        r = (uint64_t)pf_rng_u32(rng) << 32;
        r |= pf_rng_u32(rng);
    } while (r >= lim);
    return r % n;
}

/* The first k entries of a uniform random permutation of [0, n) into out (k <= n): a partial
 * Fisher-Yates shuffle of the identity in perm (n entries of scratch). */
static void choose(pf_rng *rng, int *out, int k, int n, int *perm) {
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = 0; i < k; i++) {
        int j = i + (int)below(rng, (uint64_t)(n - i));
        int x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
        out[i] = perm[i];
    }
}

/* Scratch for one sequence: a Fenwick tree over the S query slots' weights (S + 1 entries,
 * 1-based) and the pair each query asks (Q). */
typedef struct mqar_scratch {
    uint64_t *tree;
    int *asked;
} mqar_scratch;

/* Takes a slot at random with probability proportional to its remaining weight, then gives it
 * weight 0 (sampling without replacement); total: the remaining weights' sum, exact. Returns the
 * slot (0-based). */
static int take_slot(pf_rng *rng, uint64_t *tree, int S, int top, uint64_t *total) {
    uint64_t u = below(rng, *total);
    int pos = 0; /* the largest pos whose prefix sum is <= u: the slot is pos (0-based) */
    for (int step = top; step > 0; step >>= 1) {
        if (pos + step <= S && tree[pos + step] <= u) {
            pos += step;
            u -= tree[pos];
        }
    }
    const uint64_t w = SLOT_ONE / (uint64_t)(pos + 1);
    for (int i = pos + 1; i <= S; i += i & -i) tree[i] -= w;
    *total -= w;
    return pos;
}

/* One sequence of T tokens from rng. */
static void sequence(const pf_mqar *t, int32_t *tok, int32_t *tgt, int T, pf_rng *rng,
                     const mqar_scratch *sc) {
    const int N = t->pairs, Q = t->queries, K = t->keys;
    const int S = (T - 2 * N) / 2;
    int keys[MQAR_MAX_KEYS], vals[MQAR_MAX_KEYS], perm[MQAR_MAX_KEYS];
    choose(rng, keys, N, K, perm);
    choose(rng, vals, N, K, perm);
    /* the pairs the queries ask, in draw order: every N queries a fresh permutation of the N
     * (Q <= N: Q different keys) */
    for (int j = 0; j < Q; j += N) choose(rng, sc->asked + j, Q - j < N ? Q - j : N, N, perm);
    for (int p = 0; p < T; p++) {
        tok[p] = -1;
        tgt[p] = -1;
    }
    for (int i = 0; i < N; i++) {
        tok[2 * i] = keys[i];
        tok[2 * i + 1] = K + vals[i];
    }
    /* the query slots: Q draws without replacement, slot g with weight 2^40 / (g + 1) */
    uint64_t total = 0;
    for (int i = 1; i <= S; i++) sc->tree[i] = 0;
    for (int i = 1; i <= S; i++) {
        const uint64_t w = SLOT_ONE / (uint64_t)i;
        total += w;
        for (int k = i; k <= S; k += k & -k) sc->tree[k] += w;
    }
    int top = 1;
    while (top * 2 <= S) top *= 2;
    for (int j = 0; j < Q; j++) {
        const int p = 2 * N + 2 * take_slot(rng, sc->tree, S, top, &total);
        tok[p] = keys[sc->asked[j]];
        tgt[p] = K + vals[sc->asked[j]];
    }
    /* filler everywhere else, in position order */
    const uint64_t nfill = (uint64_t)(PF_LM_VOCAB - 2 * K);
    for (int p = 0; p < T; p++)
        if (tok[p] < 0) tok[p] = 2 * K + (int32_t)below(rng, nfill);
}

pf_status pf_mqar_batch(const pf_mqar *t, int32_t *tokens, int32_t *targets, int B, int T,
                        uint64_t seed, uint64_t stream) {
    if (!t || !tokens || !targets || B < 1 || pf_mqar_check(t, T) != PF_OK) return PF_EINVAL;
    const int S = (T - 2 * t->pairs) / 2;
    mqar_scratch sc = {malloc(sizeof(uint64_t) * ((size_t)S + 1)),
                       malloc(sizeof(int) * (size_t)t->queries)};
    pf_status st = sc.tree && sc.asked ? PF_OK : PF_ENOMEM;
    for (int b = 0; b < B && st == PF_OK; b++) {
        pf_rng rng;
        pf_rng_init(&rng, seed, stream);
        rng.ctr[1] = (uint32_t)b; /* blocks b 2^32 onward: sequence b's own, whatever B */
        sequence(t, tokens + (size_t)b * T, targets + (size_t)b * T, T, &rng, &sc);
    }
    free(sc.tree);
    free(sc.asked);
    return st;
}
