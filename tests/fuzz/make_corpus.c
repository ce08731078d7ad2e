/* make_corpus.c: writes the fuzz targets' seed corpus, tests/fuzz/corpus/<target>/ (`make
 * fuzz-corpus` builds and runs it; the files it writes are committed). Small valid inputs of
 * each kind the readers accept, mostly written by the library's own writers, so that the
 * fuzzer starts from inside the formats:
 *   fuzz_npy          each dtype at ranks 1 to 4, a rank-0 and an empty array (pf_npy_write),
 *                     and headers of format versions 2.0 and 3.0 (written here)
 *   fuzz_safetensors  tensors of rank 0 to 4, an empty one, metadata, names needing JSON
 *                     escapes, and a file of metadata only (pf_st_write)
 *   fuzz_checkpoint   tiny models (context 8, 1 layer, C 8, 2 heads), exact with learned
 *                     positions and FAVOR+ with rotary ones (pf_model_save)
 *   fuzz_text         FASTA (plain, gzip, CRLF line ends and odd records) and plain text
 * Every file is the same on every run (fixed seeds; gzip headers carry no time).
 *
 * Usage: make_corpus DIR (DIR/<target>/ must not hold files of other names you want gone). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "io/safetensors.h"
#include "performer.h"

static const char *root;

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "make_corpus: %s: %s\n", what, detail);
    exit(1);
}

/* root/target/name, with the folder made. */
static const char *path_of(const char *target, const char *name) {
    static char p[4096];
    snprintf(p, sizeof(p), "%s/%s", root, target);
    if (mkdir(p, 0777) != 0 && errno != EEXIST) fail(p, strerror(errno));
    snprintf(p, sizeof(p), "%s/%s/%s", root, target, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) fail(path, "cannot write");
}

/* Values 1, -2, 3, ... as the dtype wants them. */
static void fill(void *data, pf_dtype t, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        int64_t v = (i % 2 ? -1 : 1) * (i + 1);
        if (t == PF_F32) ((float *)data)[i] = (float)v * 0.5f;
        if (t == PF_I32) ((int32_t *)data)[i] = (int32_t)v;
        if (t == PF_I64) ((int64_t *)data)[i] = v * 1000000007;
    }
}

static void npy(const char *name, pf_dtype t, int ndim, const int64_t *shape) {
    pf_array a = {.dtype = t, .ndim = ndim};
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= a.shape[i] = shape[i];
    a.data = malloc(n > 0 ? (size_t)n * 8 : 1);
    if (!a.data) fail(name, "out of memory");
    fill(a.data, t, n);
    char err[256];
    if (pf_npy_write(path_of("fuzz_npy", name), &a, err, sizeof(err)) != PF_OK) fail(name, err);
    free(a.data);
}

/* A version 2.0 or 3.0 file (u32 header length), padded to 64 bytes as numpy pads. */
static void npy_version(const char *name, int major, const char *descr, const char *shape,
                        const void *data, size_t nbytes) {
    char dict[256], file[512];
    int dl = snprintf(dict, sizeof(dict), "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                      descr, shape);
    size_t hl = (size_t)dl + 1;
    while ((12 + hl) % 64) hl++;
    memcpy(file, "\x93NUMPY", 6);
    file[6] = (char)major;
    file[7] = 0;
    for (int i = 0; i < 4; i++) file[8 + i] = (char)((hl >> (8 * i)) & 0xff);
    memcpy(file + 12, dict, (size_t)dl);
    memset(file + 12 + dl, ' ', hl - 1 - (size_t)dl);
    file[12 + hl - 1] = '\n';
    memcpy(file + 12 + hl, data, nbytes);
    write_bytes(path_of("fuzz_npy", name), file, 12 + hl + nbytes);
}

static void make_npy(void) {
    static const int64_t shapes[4][4] = {{3}, {2, 3}, {2, 1, 2}, {1, 2, 1, 2}};
    static const char *const names[3] = {"f4", "i4", "i8"};
    for (int t = 0; t < 3; t++) {
        for (int r = 1; r <= 4; r++) {
            char name[64];
            snprintf(name, sizeof(name), "%s_rank%d.npy", names[t], r);
            npy(name, (pf_dtype)t, r, shapes[r - 1]);
        }
    }
    npy("f4_rank0.npy", PF_F32, 0, NULL);
    npy("i8_empty.npy", PF_I64, 1, (const int64_t[]){0});
    npy("i4_empty_2x0.npy", PF_I32, 2, (const int64_t[]){2, 0});
    float f[2] = {1.5f, -0.25f};
    int32_t i[3] = {7, -8, 9};
    npy_version("f4_v2.npy", 2, "<f4", "(2,)", f, sizeof(f));
    npy_version("i4_v3.npy", 3, "<i4", "(3, 1)", i, sizeof(i));
}

static void st(const char *name, const pf_st_entry *t, int n, const char *const *meta) {
    char err[256];
    if (pf_st_write(path_of("fuzz_safetensors", name), t, n, meta, err, sizeof(err)) != PF_OK)
        fail(name, err);
}

static void make_safetensors(void) {
    static const float x[24] = {1,    -2,    3,      -4,    5,    -6,   7,  -8, 9, -10, 11, -12,
                                0.5f, 0.25f, 0.125f, 1e-3f, 1e3f, 3.5f, -7, 0,  1, 2,   3,  4};
    const char *const meta[] = {"format", "pt", "note", "seed \"corpus\"\n", NULL};
    pf_st_entry two[2] = {{.name = "weight", .ndim = 2, .shape = {2, 3}, .data = x},
                          {.name = "bias", .ndim = 1, .shape = {3}, .data = x + 6}};
    st("two.safetensors", two, 2, meta);
    pf_st_entry ranks[4] = {{.name = "scalar", .ndim = 0, .data = x},
                            {.name = "empty", .ndim = 2, .shape = {0, 3}, .data = NULL},
                            {.name = "r3", .ndim = 3, .shape = {1, 2, 2}, .data = x + 1},
                            {.name = "r4", .ndim = 4, .shape = {1, 2, 1, 3}, .data = x + 5}};
    st("ranks.safetensors", ranks, 4, NULL);
    pf_st_entry odd[2] = {{.name = "a \"quoted\" \\ name", .ndim = 1, .shape = {2}, .data = x},
                          {.name = "caf\xc3\xa9\t\x01", .ndim = 1, .shape = {1}, .data = x + 2}};
    st("names.safetensors", odd, 2, NULL);
    st("meta_only.safetensors", NULL, 0, meta);
}

static void model(const char *name, pf_lm_attention att, pf_lm_positions pos) {
    pf_model_config c = pf_model_config_default();
    c.context = 8;
    c.layers = 1;
    c.d_model = 8;
    c.heads = 2;
    c.attention = att;
    c.positions = pos;
    c.features = 4;
    c.redraw = 10;
    c.seed = 7;
    pf_model *m = NULL;
    char err[256];
    if (pf_model_create(&m, &c) != PF_OK) fail(name, "cannot create the model");
    const char *const meta[] = {"note", "fuzz seed", NULL};
    if (pf_model_save(m, path_of("fuzz_checkpoint", name), meta, 0, err, sizeof(err)) != PF_OK)
        fail(name, err);
    pf_model_free(m);
}

static const char fasta[] = ">sp|P1|ONE first protein\n"
                            "MKTAYIAKQRQISFVKSHFSRQ\n"
                            "LEERLGLIEVQAPILSRVGDGT\n"
                            ">sp|P2|TWO\n"
                            "MSDNGPQNQRNAPRITFGGPSD\n"
                            ">empty record\n"
                            ">P3\n"
                            "gattaca*\n";

static void make_text(void) {
    const char *p = path_of("fuzz_text", "protein.fasta");
    write_bytes(p, fasta, sizeof(fasta) - 1);
    p = path_of("fuzz_text", "protein.fasta.gz");
    gzFile gz = gzopen(p, "wb9");
    if (!gz || gzwrite(gz, fasta, sizeof(fasta) - 1) != (int)sizeof(fasta) - 1 ||
        gzclose(gz) != Z_OK)
        fail(p, "cannot write");
    static const char crlf[] = "\r\n>r1 CRLF line ends\r\nACDE-FGH \r\nIK.LM\r\n>r2\r\n\r\nW\r\n";
    write_bytes(path_of("fuzz_text", "crlf.fasta"), crlf, sizeof(crlf) - 1);
    static const char text[] =
        "In the beginning God created the heaven and the earth.\n"
        "And the earth was without form, and void; and darkness was upon the face of the deep.\n"
        "And the Spirit of God moved upon the face of the waters.\n"
        "\n"
        "And God said, Let there be light: and there was light.";
    write_bytes(path_of("fuzz_text", "genesis.txt"), text, sizeof(text) - 1);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: make_corpus DIR\n");
        return 2;
    }
    root = argv[1];
    if (mkdir(root, 0777) != 0 && errno != EEXIST) fail(root, strerror(errno));
    make_npy();
    make_safetensors();
    model("exact_learned.safetensors", PF_LM_EXACT, PF_LM_LEARNED);
    model("favor_rotary.safetensors", PF_LM_FAVOR, PF_LM_ROTARY);
    make_text();
    return 0;
}
