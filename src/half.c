/* half.c: float16 and bfloat16 rows to and from float32, for the calls that take half-precision
 * inputs (pf_attn_favor_dt, pf_favor_state_step_dt). The kernels convert a block of rows at a
 * time into their scratch, so no whole float32 copy of a tensor is made; the arithmetic and the
 * state stay float32.
 *
 * float16 -> float32 is exact; float32 -> float16 and -> bfloat16 round to nearest, ties to even,
 * with overflow to Inf and NaN kept a NaN (IEEE 754's conversion). Where the CPU has F16C (x86-64
 * since Ivy Bridge) float16 goes through it, 8 values an instruction, with the same results as
 * the portable path, which every CPU runs otherwise (and PF_SIMD=ref forces). */
#include <string.h>

#include "internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

size_t pf_dtype_size(pf_dtype dt) {
    switch (dt) {
    case PF_F32:
    case PF_I32: return 4;
    case PF_I64: return 8;
    case PF_F16:
    case PF_BF16: return 2;
    }
    return 0;
}

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float f32_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float pf_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) return f32_of(sign | 0x7f800000u | (m << 13)); /* Inf, NaN (payload kept) */
    if (e != 0) return f32_of(sign | ((e + 112) << 23) | (m << 13));
    if (m == 0) return f32_of(sign);
    /* subnormal: m 2^-24, exact in float32 */
    const float v = (float)m * 0x1p-24f;
    return sign ? -v : v;
}

uint16_t pf_f32_to_f16(float f) {
    const uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000;
    const uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) /* Inf or NaN (a quiet NaN stays a NaN) */
        return (uint16_t)(sign | 0x7c00 | (a > 0x7f800000u ? 0x200 | ((a >> 13) & 0x3ff) : 0));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds past 65504: Inf */
    if (a < 0x38800000u) {                                  /* below 2^-14: subnormal or 0 */
        /* a = 1.m 2^(e-127): the result is round(a 2^24) units of 2^-24 */
        const int e = (int)(a >> 23);
        if (e < 102) return (uint16_t)sign; /* below half of 2^-24: 0 */
        const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
        const int shift = 126 - e; /* 14 .. 24 */
        const uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        const uint32_t r = q + (rem > half || (rem == half && (q & 1)));
        return (uint16_t)(sign | r);
    }
    /* normal: drop 13 bits of mantissa, rounding to nearest even (a carry into the exponent is
     * the right result) */
    const uint32_t b = a - 0x38000000u; /* rebias 127 -> 15 */
    const uint32_t r = (b + 0xfffu + ((b >> 13) & 1)) >> 13;
    return (uint16_t)(sign | r);
}

float pf_bf16_to_f32(uint16_t b) {
    return f32_of((uint32_t)b << 16);
}

uint16_t pf_f32_to_bf16(float f) {
    const uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) static void f16_rows_f16c(float *dst, const uint16_t *src,
                                                                size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = pf_f16_to_f32(src[i]);
}

__attribute__((target("avx,f16c"))) static void f16_store_f16c(uint16_t *dst, const float *src,
                                                                size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = pf_f32_to_f16(src[i]);
}

/* F16C where the library runs its AVX2 or AVX-512 kernels: every CPU with AVX2 has it (Intel
 * since Ivy Bridge, AMD since Piledriver), and the dispatch has checked the rest (the OS saving
 * ymm state, PF_SIMD); PF_SIMD=ref gives the portable conversions too. */
static int use_f16c(void) {
    const char *name = pf_simd()->name;
    return strcmp(name, "avx2") == 0 || strcmp(name, "avx512") == 0;
}
#endif

void pf_rows_to_f32(float *dst, const void *src, pf_dtype dt, size_t n) {
    const uint16_t *h = (const uint16_t *)src;
    switch (dt) {
    case PF_F16:
#if defined(__x86_64__)
        if (use_f16c()) {
            f16_rows_f16c(dst, h, n);
            return;
        }
#endif
        for (size_t i = 0; i < n; i++) dst[i] = pf_f16_to_f32(h[i]);
        return;
    case PF_BF16:
        for (size_t i = 0; i < n; i++) dst[i] = pf_bf16_to_f32(h[i]);
        return;
    default:
        memcpy(dst, src, sizeof(float) * n);
        return;
    }
}

void pf_rows_from_f32(void *dst, pf_dtype dt, const float *src, size_t n) {
    uint16_t *h = (uint16_t *)dst;
    switch (dt) {
    case PF_F16:
#if defined(__x86_64__)
        if (use_f16c()) {
            f16_store_f16c(h, src, n);
            return;
        }
#endif
        for (size_t i = 0; i < n; i++) h[i] = pf_f32_to_f16(src[i]);
        return;
    case PF_BF16:
        for (size_t i = 0; i < n; i++) h[i] = pf_f32_to_bf16(src[i]);
        return;
    default:
        memcpy(dst, src, sizeof(float) * n);
        return;
    }
}

int pf_nonfinite_dt(const void *x, pf_dtype dt, size_t n) {
    if (dt == PF_F32) {
        const float *f = (const float *)x;
        int bad = 0;
        for (size_t i = 0; i < n; i++) bad |= (f32_bits(f[i]) & 0x7f800000u) == 0x7f800000u;
        return bad;
    }
    const uint16_t *h = (const uint16_t *)x, mask = dt == PF_F16 ? 0x7c00 : 0x7f80;
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad |= (h[i] & mask) == mask;
    return bad;
}

pf_status pf_convert(void *dst, pf_dtype to, const void *src, pf_dtype from, size_t n) {
    const int ok_to = to == PF_F32 || to == PF_F16 || to == PF_BF16;
    const int ok_from = from == PF_F32 || from == PF_F16 || from == PF_BF16;
    if (!ok_to || !ok_from || (n > 0 && (!dst || !src))) return PF_EINVAL;
    if (n == 0) return PF_OK;
    if (from == to) {
        if (dst != src) memmove(dst, src, n * pf_dtype_size(to));
        return PF_OK;
    }
    if (from == PF_F32) {
        pf_rows_from_f32(dst, to, (const float *)src, n);
    } else if (to == PF_F32) {
        pf_rows_to_f32((float *)dst, src, from, n);
    } else { /* half to the other half, through float32 in pieces */
        float buf[256];
        for (size_t i = 0; i < n; i += 256) {
            const size_t k = n - i < 256 ? n - i : 256;
            pf_rows_to_f32(buf, (const char *)src + 2 * i, from, k);
            pf_rows_from_f32((char *)dst + 2 * i, to, buf, k);
        }
    }
    return PF_OK;
}
