/* rng.c: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2,
 * 3", SC 2011), a counter-based generator: block n of stream s under seed k is
 * philox(ctr = (n_lo, n_hi, s_lo, s_hi), key = (k_lo, k_hi)), so any block can be computed
 * without the ones before it and a (seed, stream) pair means the same numbers everywhere. */
#include <math.h>

#include "internal.h"

#define PHILOX_M0 0xD2511F53u /* round multipliers */
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u /* Weyl key increments: golden ratio, sqrt(3) - 1 */
#define PHILOX_W1 0xBB67AE85u

static inline void mulhilo32(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

/* One Philox S-box round: two 32x32->64 multiplies, the high halves mixed with the other
 * words and the round key, then the words permuted. */
static inline void philox_round(uint32_t x[4], const uint32_t k[2]) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(PHILOX_M0, x[0], &hi0, &lo0);
    mulhilo32(PHILOX_M1, x[2], &hi1, &lo1);
    uint32_t y0 = hi1 ^ x[1] ^ k[0];
    uint32_t y2 = hi0 ^ x[3] ^ k[1];
    x[0] = y0;
    x[1] = lo1;
    x[2] = y2;
    x[3] = lo0;
}

void pf_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t x[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k[2] = {key[0], key[1]};
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k[0] += PHILOX_W0;
            k[1] += PHILOX_W1;
        }
        philox_round(x, k);
    }
    out[0] = x[0];
    out[1] = x[1];
    out[2] = x[2];
    out[3] = x[3];
}

pf_status pf_rng_init(pf_rng *rng, uint64_t seed, uint64_t stream) {
    if (!rng) return PF_EINVAL;
    rng->key[0] = (uint32_t)seed;
    rng->key[1] = (uint32_t)(seed >> 32);
    rng->ctr[0] = 0;
    rng->ctr[1] = 0;
    rng->ctr[2] = (uint32_t)stream;
    rng->ctr[3] = (uint32_t)(stream >> 32);
    rng->buf[0] = rng->buf[1] = rng->buf[2] = rng->buf[3] = 0;
    rng->used = 4;
    rng->has_spare = 0;
    rng->spare = 0.0;
    return PF_OK;
}

uint32_t pf_rng_u32(pf_rng *rng) {
    if (rng->used >= 4) {
        pf_philox4x32_10(rng->ctr, rng->key, rng->buf);
        /* 64-bit block counter in ctr[0..1]: 2^64 blocks per stream never wrap in practice */
        if (++rng->ctr[0] == 0) rng->ctr[1]++;
        rng->used = 0;
    }
    return rng->buf[rng->used++];
}

double pf_rng_uniform(pf_rng *rng) {
    /* 52 random bits k, u = (k + 0.5) 2^-52: exact in double, in [2^-53, 1 - 2^-53], so never
     * 0 (log(u) is finite) and never 1. (53 bits would round 1 - 2^-54 up to 1.) */
    uint64_t hi = pf_rng_u32(rng);
    uint64_t lo = pf_rng_u32(rng);
    uint64_t k = ((hi << 32) | lo) >> 12;
    return ((double)k + 0.5) * 0x1p-52;
}

double pf_rng_normal(pf_rng *rng) {
    if (rng->has_spare) {
        rng->has_spare = 0;
        return rng->spare;
    }
    /* Box-Muller: for u1, u2 uniform, r = sqrt(-2 log u1), t = 2 pi u2 give two independent
     * N(0,1): r cos t and r sin t. */
    const double two_pi = 6.283185307179586476925286766559;
    double u1 = pf_rng_uniform(rng);
    double u2 = pf_rng_uniform(rng);
    double r = sqrt(-2.0 * log(u1));
    double t = two_pi * u2;
    rng->spare = r * sin(t);
    rng->has_spare = 1;
    return r * cos(t);
}

pf_status pf_rng_fill_normal(pf_rng *rng, float *out, size_t n) {
    if (!rng || !out) return PF_EINVAL;
    for (size_t i = 0; i < n; i++) out[i] = (float)pf_rng_normal(rng);
    return PF_OK;
}
