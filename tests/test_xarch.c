/* test_xarch.c: the same inputs give the same results on every architecture (x86-64, aarch64).
 *
 * tests/data/xarch_ref.txt holds, as C99 hex floats and integers (exact, diffable):
 *   - Philox4x32-10 words of two (seed, stream) pairs, and W (m,d) for three projection kinds:
 *     both must match bit for bit (pf_projection_draw's contract: same arguments, same numbers
 *     on every machine). The library's own arithmetic is ISO C without contraction (-std=c11
 *     gives -ffp-contract=off), so only libm's double log, sin and cos (Box-Muller) could move
 *     a bit; glibc's are within an ulp of double, far below float's rounding of W;
 *   - outputs of the float64 paths (pf_attn_favor_ref bidirectional and causal, pf_attn_exact_ref)
 *     for inputs made from Philox words by exact arithmetic (no libm): written by this program on
 *     x86-64 (`test_xarch --write FILE`), never by a fast path.
 * Checks, on whatever architecture runs it:
 *   - Philox and W: equal bits;
 *   - the float64 paths against the file: |got - ref| <= 1e-6 + 1e-5 |ref| (float rounding of a
 *     float64 result, plus libm's double exp/log differing by an ulp between architectures);
 *   - the fast paths (pf_attn_favor, pf_attn_exact; whichever vector path the CPU runs, PF_SIMD
 *     to force one) against the file: the relative error of the whole output below 1e-5 (FAVOR+)
 *     and 1e-5 (exact), the bounds test_favor_forward and test_attn_exact hold on x86-64 against
 *     their own float64 evaluation (float accumulation over d, r and L of at most a few hundred);
 *   - the fast paths at 1 and 2 threads: equal bits. */
#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

enum { B = 1, H = 2, L = 40, D = 16, DV = 8, M = 32 };
#define NQ ((size_t)B * H * L * D)
#define NV ((size_t)B * H * L * DV)

/* n floats uniform in [-a, a) from Philox words: (u >> 8) 2^-23 - 1 is exact in float, and so is
 * the product by a power of two a */
static void fill_uniform(float *x, size_t n, float a, uint64_t stream) {
    pf_rng g;
    pf_rng_init(&g, 2024, stream);
    for (size_t i = 0; i < n; i++) x[i] = a * ((float)(pf_rng_u32(&g) >> 8) * 0x1p-23f - 1.0f);
}

typedef struct {
    float Q[NQ], K[NQ], V[NV];
    float W[3][M * D];
    uint32_t words[2][8];
    float favor[2][NV], exact[NV];
} results;

static const struct {
    pf_proj_kind kind;
    pf_norm_kind norm;
} proj[3] = {{PF_PROJ_IID, PF_NORM_CHI}, {PF_PROJ_ORTHOGONAL, PF_NORM_CHI},
             {PF_PROJ_ORTHOGONAL, PF_NORM_QMC}};

/* The outputs of the float64 paths (fast = 0) or the fast ones (fast = 1) at `threads`. */
static void compute(results *r, int fast, int threads) {
    for (int s = 0; s < 2; s++) {
        pf_rng g;
        pf_rng_init(&g, s ? 0x0123456789abcdefULL : 42, s ? 7 : 0);
        for (int i = 0; i < 8; i++) r->words[s][i] = pf_rng_u32(&g);
    }
    for (int p = 0; p < 3; p++)
        CHECK_STATUS(pf_projection_draw(r->W[p], M, D, proj[p].kind, proj[p].norm, 11, 3), PF_OK);
    fill_uniform(r->Q, NQ, 1.0f, 1);
    fill_uniform(r->K, NQ, 1.0f, 2);
    fill_uniform(r->V, NV, 2.0f, 3);
    pf_shape sh = {B, H, L, L, D, DV};
    pf_attn_opts o = pf_attn_opts_default();
    o.threads = threads;
    pf_favor_opts f = pf_favor_opts_default();
    f.W = r->W[1];
    f.m = M;
    f.chunk = 16; /* three chunks, the last one partial */
    for (int causal = 0; causal < 2; causal++) {
        o.causal = causal;
        CHECK_STATUS(fast ? pf_attn_favor(r->favor[causal], r->Q, r->K, r->V, &sh, &o, &f)
                          : pf_attn_favor_ref(r->favor[causal], r->Q, r->K, r->V, &sh, &o, &f),
                     PF_OK);
    }
    o.causal = 1;
    CHECK_STATUS(fast ? pf_attn_exact(r->exact, NULL, r->Q, r->K, r->V, &sh, &o)
                      : pf_attn_exact_ref(r->exact, NULL, r->Q, r->K, r->V, &sh, &o),
                 PF_OK);
}

static void put_floats(FILE *fp, const char *name, const float *x, size_t n) {
    fprintf(fp, "%s %zu\n", name, n);
    for (size_t i = 0; i < n; i++) fprintf(fp, "%a\n", (double)x[i]);
}

static int write_ref(const char *path) {
    static results r;
    compute(&r, 0, 1);
    FILE *fp = fopen(path, "w");
    if (!fp) return 1;
    fprintf(fp, "# tests/data/xarch_ref.txt: written by `test_xarch --write` (float64 paths; "
                "see tests/test_xarch.c)\n");
    for (int s = 0; s < 2; s++) {
        fprintf(fp, "philox%d 8\n", s);
        for (int i = 0; i < 8; i++) fprintf(fp, "%08" PRIx32 "\n", r.words[s][i]);
    }
    for (int p = 0; p < 3; p++) {
        char name[16];
        snprintf(name, sizeof name, "W%d", p);
        put_floats(fp, name, r.W[p], (size_t)M * D);
    }
    put_floats(fp, "favor", r.favor[0], NV);
    put_floats(fp, "favor_causal", r.favor[1], NV);
    put_floats(fp, "exact_causal", r.exact, NV);
    return fclose(fp) != 0;
}

/* Reads the next section, which must be `name n`, into x (floats, or words when w is set). */
static int get_section(FILE *fp, const char *name, float *x, uint32_t *w, size_t n) {
    char got[32];
    size_t count;
    if (fscanf(fp, " %31s %zu", got, &count) != 2 || strcmp(got, name) != 0 || count != n) {
        fprintf(stderr, "xarch_ref: expected section %s of %zu\n", name, n);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        double v;
        if (w ? fscanf(fp, " %" SCNx32, &w[i]) != 1 : fscanf(fp, " %la", &v) != 1) return 1;
        if (!w) x[i] = (float)v;
    }
    return 0;
}

static int read_ref(const char *path, results *r) {
    FILE *fp = fopen(path, "r");
    if (!fp) {
        fprintf(stderr, "cannot open %s\n", path);
        return 1;
    }
    int c, bad = 0;
    while ((c = fgetc(fp)) == '#')
        while ((c = fgetc(fp)) != '\n' && c != EOF) {}
    ungetc(c, fp);
    bad |= get_section(fp, "philox0", NULL, r->words[0], 8);
    bad |= get_section(fp, "philox1", NULL, r->words[1], 8);
    bad |= get_section(fp, "W0", r->W[0], NULL, (size_t)M * D);
    bad |= get_section(fp, "W1", r->W[1], NULL, (size_t)M * D);
    bad |= get_section(fp, "W2", r->W[2], NULL, (size_t)M * D);
    bad |= get_section(fp, "favor", r->favor[0], NULL, NV);
    bad |= get_section(fp, "favor_causal", r->favor[1], NULL, NV);
    bad |= get_section(fp, "exact_causal", r->exact, NULL, NV);
    fclose(fp);
    return bad;
}

static void check_ref(const float *got, const float *ref, size_t n, const char *what) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double tol = 1e-6 + 1e-5 * fabs(ref[i]);
        if (!(fabs((double)got[i] - ref[i]) <= tol) && bad++ < 5)
            CHECK_CLOSE(got[i], ref[i], 1e-6, 1e-5);
    }
    CHECK(bad == 0, "%s: %d of %zu elements off the reference", what, bad, n);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write") == 0) return write_ref(argv[2]);
    const char *dir = getenv("PF_TEST_DATA");
    char path[512];
    snprintf(path, sizeof path, "%s/xarch_ref.txt", dir ? dir : "tests/data");
    static results want, ref, fast1, fast2;
    if (read_ref(path, &want)) {
        CHECK(0, "could not read %s", path);
        TEST_MAIN_END();
    }

    compute(&ref, 0, 1);
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 8; i++)
            CHECK(ref.words[s][i] == want.words[s][i], "philox%d word %d: %08" PRIx32
                  " != %08" PRIx32, s, i, ref.words[s][i], want.words[s][i]);
    for (int p = 0; p < 3; p++) {
        int diff = 0;
        for (int i = 0; i < M * D; i++) diff += memcmp(&ref.W[p][i], &want.W[p][i], 4) != 0;
        CHECK(diff == 0, "W%d (kind %d, norm %d): %d of %d entries differ in their bits", p,
              (int)proj[p].kind, (int)proj[p].norm, diff, M * D);
    }
    check_ref(ref.favor[0], want.favor[0], NV, "pf_attn_favor_ref");
    check_ref(ref.favor[1], want.favor[1], NV, "pf_attn_favor_ref causal");
    check_ref(ref.exact, want.exact, NV, "pf_attn_exact_ref causal");

    compute(&fast1, 1, 1);
    compute(&fast2, 1, 2);
    const char *name[3] = {"pf_attn_favor", "pf_attn_favor causal", "pf_attn_exact causal"};
    const float *got[3] = {fast1.favor[0], fast1.favor[1], fast1.exact};
    const float *two[3] = {fast2.favor[0], fast2.favor[1], fast2.exact};
    const float *wnt[3] = {want.favor[0], want.favor[1], want.exact};
    for (int c = 0; c < 3; c++) {
        double e = rel_err(got[c], wnt[c], NV);
        CHECK(e < 1e-5, "%s (%s) vs the float64 reference: rel err %.3g", name[c],
              pf_simd_path(), e);
        CHECK(memcmp(got[c], two[c], sizeof(float) * NV) == 0, "%s: 1 and 2 threads differ",
              name[c]);
        printf("%s (%s path) vs the committed float64 reference: rel err %.3g\n", name[c],
               pf_simd_path(), e);
    }
    TEST_MAIN_END();
}
