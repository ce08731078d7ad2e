/* test_safetensors.c: the safetensors reader and writer, and model checkpoints.
 *
 * - round trip of tensors (ranks 0 to 3, an empty one) and metadata with characters JSON must
 *   escape;
 * - an independent reader (Python's json module and numpy.frombuffer) reads our file and
 *   checks every value and the metadata; a file written by Python (tensors out of order, no
 *   padding, escapes) reads back in C;
 * - damaged files: empty, short, header length past the end, truncated data, extra bytes,
 *   gaps, overlaps, wrong dtype, wrong offsets, bad JSON, duplicate names: each PF_EFORMAT with
 *   a message saying why; a missing file is PF_EIO;
 * - model checkpoints: save/load gives the same bits (weights, moments, step, W, forward),
 *   metadata comes back, a non-model file and a configuration mismatch are refused, a failed
 *   save leaves nothing behind; the W seed (pf.w_seed) round-trips apart from the weights' seed,
 *   a checkpoint without it (written before it existed) loads with W's seed = pf.seed, and a
 *   malformed one is refused. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "io/safetensors.h"
#include "model/model.h"

static char dir[256];

static const char *tpath(const char *name) {
    static char buf[4][512];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir, name);
    return buf[k];
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = xmalloc((size_t)sz + 1);
    *n = fread(b, 1, (size_t)sz, f);
    fclose(f);
    return b;
}

/* A file from a header string and n data bytes (values 0..n-1). */
static void make_file(const char *path, const char *header, size_t ndata) {
    size_t h = strlen(header);
    unsigned char *b = xmalloc(8 + h + ndata);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    for (size_t i = 0; i < ndata; i++) b[8 + h + i] = (unsigned char)i;
    write_bytes(path, b, 8 + h + ndata);
    free(b);
}

/* Expects a failure with status want and a message containing `needle`. */
static void expect_bad(const char *path, pf_status want, const char *needle) {
    pf_st_file f;
    char msg[512];
    pf_status st = pf_st_read(path, &f, msg, sizeof(msg));
    CHECK(st == want, "%s: status %s, expected %s (%s)", path, pf_status_str(st),
          pf_status_str(want), msg);
    CHECK(strstr(msg, needle) != NULL, "message '%s' lacks '%s'", msg, needle);
    CHECK(f.n == 0 && f.buf == NULL, "failed read left data");
}

static float val(int t, size_t i) {
    return (float)t * 100.0f + (float)i * 0.5f - 3.0f; /* exact in float and in Python */
}

static void test_round_trip_and_python(void) {
    float a[1] = {val(0, 0)}, b[6], c[24];
    for (int i = 0; i < 6; i++) b[i] = val(1, (size_t)i);
    for (int i = 0; i < 24; i++) c[i] = val(2, (size_t)i);
    pf_st_entry t[4] = {{.name = "scalar", .ndim = 0, .data = a},
                        {.name = "vec.b", .ndim = 1, .shape = {6}, .data = b},
                        {.name = "cube \"c\"", .ndim = 3, .shape = {2, 3, 4}, .data = c},
                        {.name = "empty", .ndim = 2, .shape = {0, 5}, .data = NULL}};
    const char *meta[] = {"quote\"back\\slash", "line\nfeed\ttab", "unicode",
                          "\xc3\xa9t\xc3\xa9 \xe2\x82\xac", NULL};
    char msg[512];
    const char *path = tpath("rt.safetensors");
    CHECK_STATUS(pf_st_write(path, t, 4, meta, msg, sizeof(msg)), PF_OK);
    pf_st_file f;
    CHECK_STATUS(pf_st_read(path, &f, msg, sizeof(msg)), PF_OK);
    CHECK(f.n == 4, "read %d tensors", f.n);
    for (int i = 0; i < 4 && f.n == 4; i++) {
        const pf_st_tensor *r = pf_st_find(&f, t[i].name);
        CHECK(r != NULL, "tensor %s missing", t[i].name);
        if (!r) continue;
        int same = r->ndim == t[i].ndim;
        for (int d = 0; same && d < r->ndim; d++) same = r->shape[d] == t[i].shape[d];
        CHECK(same, "tensor %s: shape differs", t[i].name);
        CHECK(r->count == (i == 0 ? 1u : i == 1 ? 6u : i == 2 ? 24u : 0u), "count %zu", r->count);
        if (r->count) CHECK(memcmp(r->data, t[i].data, r->count * 4) == 0, "data differs");
    }
    CHECK(pf_st_meta(&f, "quote\"back\\slash") &&
              strcmp(pf_st_meta(&f, "quote\"back\\slash"), "line\nfeed\ttab") == 0,
          "escaped metadata did not survive");
    CHECK(pf_st_meta(&f, "unicode") && strcmp(pf_st_meta(&f, "unicode"), meta[3]) == 0,
          "UTF-8 metadata did not survive");
    CHECK(pf_st_meta(&f, "absent") == NULL, "absent key found");
    size_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | f.buf[i];
    CHECK(hl % 8 == 0, "header length %zu not padded to 8", hl);
    pf_st_free(&f);
    pf_st_free(&f); /* twice is harmless */

    /* Python reads our file with json + numpy only and checks every value. */
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "/usr/bin/python3 - '%s' <<'EOF'\n"
             "import json, struct, sys\n"
             "import numpy as np\n"
             "b = open(sys.argv[1], 'rb').read()\n"
             "n = struct.unpack('<Q', b[:8])[0]\n"
             "h = json.loads(b[8:8 + n])\n"
             "data = b[8 + n:]\n"
             "m = h.pop('__metadata__')\n"
             "assert m == {'quote\"back\\\\slash': 'line\\nfeed\\ttab',\n"
             "             'unicode': '\\u00e9t\\u00e9 \\u20ac'}, m\n"
             "want = {'scalar': (0, []), 'vec.b': (1, [6]), 'cube \"c\"': (2, [2, 3, 4]),\n"
             "        'empty': (3, [0, 5])}\n"
             "assert set(h) == set(want), h.keys()\n"
             "for k, (t, shape) in want.items():\n"
             "    e = h[k]\n"
             "    assert e['dtype'] == 'F32' and e['shape'] == shape, e\n"
             "    s, t_end = e['data_offsets']\n"
             "    x = np.frombuffer(data[s:t_end], dtype='<f4').reshape(shape)\n"
             "    ref = t * 100.0 + np.arange(x.size) * 0.5 - 3.0\n"
             "    assert np.array_equal(x.ravel(), ref.astype(np.float32)), (k, x)\n"
             "print('python reader: ok')\n"
             "EOF",
             path);
    int rc = system(cmd);
    CHECK(rc == 0, "the Python reader rejected our file (exit %d)", rc);

    /* Python writes a file its own way: tensors out of offset order, no padding, escapes. */
    const char *ppath = tpath("py.safetensors");
    snprintf(cmd, sizeof(cmd),
             "/usr/bin/python3 - '%s' <<'EOF'\n"
             "import json, struct, sys\n"
             "import numpy as np\n"
             "x = np.arange(6, dtype='<f4') * 1.5\n"
             "y = np.array([[-1, 2], [3, -4]], dtype='<f4')\n"
             "h = {'y': {'dtype': 'F32', 'shape': [2, 2], 'data_offsets': [24, 40]},\n"
             "     '__metadata__': {'k\\u00e9y': 'v\\\\al\"ue'},\n"
             "     'x': {'dtype': 'F32', 'shape': [6], 'data_offsets': [0, 24]}}\n"
             "j = json.dumps(h).encode()\n"
             "open(sys.argv[1], 'wb').write(struct.pack('<Q', len(j)) + j + x.tobytes()"
             " + y.tobytes())\n"
             "EOF",
             ppath);
    rc = system(cmd);
    CHECK(rc == 0, "python writer failed (exit %d)", rc);
    CHECK_STATUS(pf_st_read(ppath, &f, msg, sizeof(msg)), PF_OK);
    const pf_st_tensor *x = pf_st_find(&f, "x"), *y = pf_st_find(&f, "y");
    CHECK(x && y && x->count == 6 && y->count == 4, "python file tensors wrong");
    if (x && y) {
        float xv[6], yv[4];
        memcpy(xv, x->data, sizeof(xv));
        memcpy(yv, y->data, sizeof(yv));
        CHECK(xv[5] == 7.5f && yv[0] == -1.0f && yv[3] == -4.0f, "python file values wrong");
    }
    CHECK(pf_st_meta(&f, "k\xc3\xa9y") && strcmp(pf_st_meta(&f, "k\xc3\xa9y"), "v\\al\"ue") == 0,
          "python metadata wrong");
    pf_st_free(&f);
}

static void test_damaged(void) {
    char msg[512];
    pf_st_file f;
    CHECK_STATUS(pf_st_read(tpath("does-not-exist"), &f, msg, sizeof(msg)), PF_EIO);
    CHECK(strstr(msg, "does-not-exist") != NULL, "message '%s' does not name the file", msg);

    write_bytes(tpath("empty"), "", 0);
    expect_bad(tpath("empty"), PF_EFORMAT, "shorter than the 8-byte");
    write_bytes(tpath("short"), "abc", 3);
    expect_bad(tpath("short"), PF_EFORMAT, "shorter than the 8-byte");
    /* header length beyond the file */
    unsigned char big[16] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    write_bytes(tpath("hlen"), big, 10);
    expect_bad(tpath("hlen"), PF_EFORMAT, "header length 200");

    const char *good = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}";
    make_file(tpath("good"), good, 16);
    CHECK_STATUS(pf_st_read(tpath("good"), &f, msg, sizeof(msg)), PF_OK);
    pf_st_free(&f);
    make_file(tpath("trunc"), good, 15);
    expect_bad(tpath("trunc"), PF_EFORMAT, "data_offsets");
    make_file(tpath("extra"), good, 17);
    expect_bad(tpath("extra"), PF_EFORMAT, "extra bytes");
    /* a real checkpoint cut short: every length below the full one fails */
    size_t n = 0;
    unsigned char *b = read_bytes(tpath("rt.safetensors"), &n);
    int all_fail = 1;
    for (size_t cut = 0; b && cut < n; cut += (cut < 64 ? 1 : 7)) {
        write_bytes(tpath("cut"), b, cut);
        pf_status st = pf_st_read(tpath("cut"), &f, msg, sizeof(msg));
        if (st != PF_EFORMAT) all_fail = 0;
        if (st == PF_OK) pf_st_free(&f);
    }
    CHECK(all_fail, "a truncated file was accepted");
    free(b);

    make_file(tpath("dtype"), "{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}",
              4);
    expect_bad(tpath("dtype"), PF_EFORMAT, "only F32");
    make_file(tpath("shape"), "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}",
              8);
    expect_bad(tpath("shape"), PF_EFORMAT, "do not hold 3");
    /* 2^31 x 2^31 floats are 2^64 bytes, 0 in a wrapping size_t: must not pass as empty */
    make_file(tpath("wrap"),
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[2147483648,2147483648],"
              "\"data_offsets\":[0,0]}}",
              0);
    expect_bad(tpath("wrap"), PF_EFORMAT, "shape too large");
    make_file(tpath("wrap2"),
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,1073741824],"
              "\"data_offsets\":[0,0]}}",
              0);
    expect_bad(tpath("wrap2"), PF_EFORMAT, "shape too large");
    make_file(tpath("gap"),
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
              12);
    expect_bad(tpath("gap"), PF_EFORMAT, "gap");
    make_file(tpath("overlap"),
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
              8);
    expect_bad(tpath("overlap"), PF_EFORMAT, "overlaps");
    make_file(tpath("dup"),
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
              8);
    expect_bad(tpath("dup"), PF_EFORMAT, "twice");
    make_file(tpath("json"), "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4);
    expect_bad(tpath("json"), PF_EFORMAT, "bad header JSON");
    make_file(tpath("neg"), "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4);
    expect_bad(tpath("neg"), PF_EFORMAT, "non-negative integer");
    make_file(tpath("metanum"), "{\"__metadata__\":{\"k\":1}}", 0);
    expect_bad(tpath("metanum"), PF_EFORMAT, "must be strings");
    make_file(tpath("nulstr"), "{\"__metadata__\":{\"k\":\"a\\u0000b\"}}", 0);
    expect_bad(tpath("nulstr"), PF_EFORMAT, "u0000");
    make_file(tpath("key"),
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":[]}}", 4);
    expect_bad(tpath("key"), PF_EFORMAT, "unexpected");

    /* writer: bad arguments and an unwritable place leave nothing */
    pf_st_entry t = {.name = "a", .ndim = 1, .shape = {2}, .data = NULL};
    CHECK_STATUS(pf_st_write(tpath("w1"), &t, 1, NULL, msg, sizeof(msg)), PF_EINVAL);
    float v[2] = {1, 2};
    pf_st_entry t2[2] = {{.name = "a", .ndim = 1, .shape = {2}, .data = v},
                         {.name = "a", .ndim = 1, .shape = {2}, .data = v}};
    CHECK_STATUS(pf_st_write(tpath("w2"), t2, 2, NULL, msg, sizeof(msg)), PF_EINVAL);
    CHECK_STATUS(pf_st_write(tpath("no/such/dir/x"), t2, 1, NULL, msg, sizeof(msg)), PF_EIO);
    CHECK(access(tpath("w1"), F_OK) != 0 && access(tpath("w2"), F_OK) != 0,
          "a failed write left a file");
}

/* ---- model checkpoints ------------------------------------------------------------------- */

static void test_checkpoint(pf_lm_attention att, pf_lm_positions pos, pf_kernel kern) {
    pf_model_config c = pf_model_config_default();
    c.kernel = kern;
    c.window = 5;
    c.context = 16;
    c.layers = 2;
    c.d_model = 16;
    c.heads = 2;
    c.attention = att;
    c.positions = pos;
    c.features = 8;
    c.redraw = 3;
    c.seed = 11;
    c.w_seed = 13;
    pf_model *m = NULL;
    CHECK_STATUS(pf_model_create(&m, &c), PF_OK);
    if (!m) return;
    int32_t tok[32], tgt[32];
    for (int i = 0; i < 32; i++) {
        tok[i] = (i * 7) % 256;
        tgt[i] = (i * 7 + 7) % 256;
    }
    /* a few training steps so moments, step and W are not their initial values */
    pf_adamw o = pf_adamw_default();
    pf_model_set_training(m, 1);
    for (int s = 0; s < 4; s++) {
        float loss;
        pf_model_forward(m, &loss, NULL, tok, tgt, 2, 16);
        pf_model_backward(m);
        pf_model_step(m, &o, NULL);
    }
    char msg[512];
    const char *meta[] = {"run.lr", "0.001", "note", "x", NULL};
    const char *path = tpath("model.safetensors");
    CHECK_STATUS(pf_model_save(m, path, meta, 1, msg, sizeof(msg)), PF_OK);
    pf_model *r = NULL;
    CHECK_STATUS(pf_model_load(&r, path, msg, sizeof(msg)), PF_OK);
    if (!r) {
        fprintf(stderr, "%s\n", msg);
        pf_model_free(m);
        return;
    }
    pf_model_config rc = pf_model_get_config(r);
    CHECK(rc.context == c.context && rc.layers == c.layers && rc.d_model == c.d_model &&
              rc.heads == c.heads && rc.attention == c.attention && rc.positions == c.positions &&
              rc.redraw == c.redraw && rc.seed == c.seed && rc.w_seed == c.w_seed &&
              rc.window == c.window && rc.kernel == c.kernel,
          "configuration differs after load (seed %llu, w_seed %llu)",
          (unsigned long long)rc.seed, (unsigned long long)rc.w_seed);
    size_t n = m->num_params;
    CHECK(memcmp(m->params_memory, r->params_memory, 4 * n) == 0, "weights differ");
    CHECK(memcmp(m->m_memory, r->m_memory, 4 * n) == 0, "first moments differ");
    CHECK(memcmp(m->v_memory, r->v_memory, 4 * n) == 0, "second moments differ");
    CHECK(pf_model_steps(r) == 4, "step %lld", (long long)pf_model_steps(r));
    CHECK(r->w_stream == m->w_stream, "W stream differs");
    if (att == PF_LM_FAVOR || att == PF_LM_FAVORPP)
        CHECK(memcmp(m->W, r->W, sizeof(float) * 2 * 8 * 8) == 0, "W differs");
    if (att == PF_LM_FAVORPP) {
        /* A is the last forward's; the next forward's comes from rho, as after the load */
        lm_favorpp_refresh(m);
        CHECK(r->rho_count == 4 && memcmp(m->rho, r->rho, sizeof(float) * 2) == 0 &&
                  memcmp(m->A, r->A, sizeof(float) * 2) == 0 && r->A[0] < 0,
              "FAVOR++ statistic differs after load");
    }
    CHECK(pf_model_meta(r, "run.lr") && strcmp(pf_model_meta(r, "run.lr"), "0.001") == 0,
          "user metadata lost");
    CHECK(pf_model_meta(m, "run.lr") == NULL, "a created model has metadata");
    /* the next training step is the same bits in both */
    float l1, l2;
    pf_model_set_training(r, 1);
    pf_model_forward(m, &l1, NULL, tok, tgt, 2, 16);
    pf_model_forward(r, &l2, NULL, tok, tgt, 2, 16);
    pf_model_backward(m);
    pf_model_backward(r);
    pf_model_step(m, &o, NULL);
    pf_model_step(r, &o, NULL);
    CHECK(memcmp(&l1, &l2, 4) == 0 && memcmp(m->params_memory, r->params_memory, 4 * n) == 0,
          "training diverges after a reload");
    pf_model_free(r);

    /* without the optimizer: weights only, moments start at zero */
    CHECK_STATUS(pf_model_save(m, tpath("w.safetensors"), NULL, 0, msg, sizeof(msg)), PF_OK);
    CHECK_STATUS(pf_model_load(&r, tpath("w.safetensors"), msg, sizeof(msg)), PF_OK);
    if (r) {
        CHECK(memcmp(m->params_memory, r->params_memory, 4 * n) == 0, "weights differ");
        float z = 0;
        for (size_t i = 0; i < n; i++) z += r->m_memory[i] * r->m_memory[i];
        CHECK(z == 0, "moments not zero without the optimizer");
        pf_model_free(r);
    }
    /* reserved metadata keys, and a failed save (no folder) leaves nothing behind */
    const char *bad[] = {"pf.step", "9", NULL};
    CHECK_STATUS(pf_model_save(m, tpath("bad.safetensors"), bad, 1, msg, sizeof(msg)), PF_EINVAL);
    /* a key given twice would make a file the loader refuses: refused when saving */
    const char *twice[] = {"note", "x", "other", "y", "note", "z", NULL};
    CHECK_STATUS(pf_model_save(m, tpath("bad.safetensors"), twice, 1, msg, sizeof(msg)),
                 PF_EINVAL);
    CHECK(strstr(msg, "twice") && strstr(msg, "note"), "message '%s'", msg);
    CHECK(access(tpath("bad.safetensors"), F_OK) != 0, "a refused save left a file");
    CHECK_STATUS(pf_model_save(m, tpath("nodir/m.safetensors"), NULL, 1, msg, sizeof(msg)), PF_EIO);
    pf_model_free(m);
}

/* Copies checkpoint src to dst with the first `from` of its JSON header replaced by `to`
 * (the header length updated; data offsets are relative to the header's end). */
static int edit_header(const char *src, const char *dst, const char *from, const char *to) {
    size_t n = 0;
    unsigned char *b = read_bytes(src, &n);
    if (!b) return 0;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
    char *h = xmalloc(hl + 1);
    memcpy(h, b + 8, hl);
    h[hl] = '\0';
    char *p = strstr(h, from);
    if (!p) {
        free(h);
        free(b);
        return 0;
    }
    size_t nf = strlen(from), nt = strlen(to), nh = hl - nf + nt;
    unsigned char *o = xmalloc(8 + nh + (n - 8 - hl));
    for (int i = 0; i < 8; i++) o[i] = (unsigned char)((uint64_t)nh >> (8 * i));
    size_t pre = (size_t)(p - h);
    memcpy(o + 8, h, pre);
    memcpy(o + 8 + pre, to, nt);
    memcpy(o + 8 + pre + nt, p + nf, hl - pre - nf);
    memcpy(o + 8 + nh, b + 8 + hl, n - 8 - hl);
    write_bytes(dst, o, 8 + nh + (n - 8 - hl));
    free(o);
    free(h);
    free(b);
    return 1;
}

/* Loading `edited` fails with PF_EFORMAT, a message holding `needle`, no model, and without
 * allocating what the edited metadata claims (the peak resident size grows by < 64 MB). */
static void expect_refused_checkpoint(const char *from, const char *to, const char *needle) {
    char msg[512];
    const char *path = tpath("edited.safetensors");
    CHECK(edit_header(tpath("model.safetensors"), path, from, to), "'%s' not in the header", from);
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    pf_model *m = NULL;
    CHECK_STATUS(pf_model_load(&m, path, msg, sizeof(msg)), PF_EFORMAT);
    getrusage(RUSAGE_SELF, &r1);
    CHECK(m == NULL, "%s: a model was returned", to);
    pf_model_free(m);
    CHECK(strstr(msg, needle) != NULL, "%s: message '%s' lacks '%s'", to, msg, needle);
    CHECK(r1.ru_maxrss - r0.ru_maxrss < 64 * 1024, "%s: peak resident size grew by %ld kB", to,
          r1.ru_maxrss - r0.ru_maxrss);
}

/* pf_model_create refuses any field out of range whatever the attention, so that everything
 * pf_model_save writes pf_model_load reads (exact attention with redraw -1 or kernel 99 was
 * created, saved, and then refused by the loader). */
static void test_create_round_trip(void) {
    pf_model_config bad[9];
    for (int i = 0; i < 9; i++) bad[i] = pf_model_config_default(); /* exact attention */
    bad[0].redraw = -1;
    bad[1].features = -5;
    bad[2].features = PF_LM_MAX_FEATURES + 1;
    bad[3].kernel = (pf_kernel)99;
    bad[4].attention = PF_LM_FAVORPP;
    bad[4].kernel = (pf_kernel)99;
    bad[5].window = 0; /* whatever the attention */
    bad[6].attention = PF_LM_LOCAL;
    bad[6].window = -3;
    bad[7].window = PF_LM_MAX_CONTEXT + 1;
    bad[8].attention = PF_LM_FAVOR; /* elu maps q', k' themselves: m = d_model/heads = 32 */
    bad[8].kernel = PF_KERNEL_ELU;
    bad[8].features = 64;
    for (int i = 0; i < 9; i++) {
        pf_model *m = NULL;
        CHECK_STATUS(pf_model_create(&m, &bad[i]), PF_EINVAL);
        pf_model_free(m);
    }
    /* what is accepted round-trips: exact attention with features 0 and a FAVOR+ kernel */
    pf_model_config ok = pf_model_config_default();
    ok.context = 8;
    ok.layers = 1;
    ok.d_model = 8;
    ok.heads = 2;
    ok.features = 0;
    ok.kernel = PF_KERNEL_TRIG;
    pf_model *m = NULL, *r = NULL;
    char msg[512];
    CHECK_STATUS(pf_model_create(&m, &ok), PF_OK);
    CHECK_STATUS(pf_model_save(m, tpath("exact0.safetensors"), NULL, 0, msg, sizeof(msg)), PF_OK);
    CHECK_STATUS(pf_model_load(&r, tpath("exact0.safetensors"), msg, sizeof(msg)), PF_OK);
    pf_model_free(m);
    pf_model_free(r);
}

static void test_checkpoint_refusals(void) {
    test_create_round_trip();
    /* metadata claiming a model far larger than the file's tensors: refused from the shapes
     * before anything is allocated (d_model 1024 and 16 layers once allocated 3.1 GB) */
    expect_refused_checkpoint("\"pf.d_model\":\"16\"", "\"pf.d_model\":\"4096\"", "disagrees");
    expect_refused_checkpoint("\"pf.layers\":\"2\"", "\"pf.layers\":\"1024\"", "disagrees");
    expect_refused_checkpoint("\"pf.context\":\"16\"", "\"pf.context\":\"1048576\"",
                              "disagrees");
    expect_refused_checkpoint("\"pf.features\":\"8\"", "\"pf.features\":\"65536\"",
                              "disagrees");
    /* each pf.* value range-checked, the key named */
    expect_refused_checkpoint("\"pf.layers\":\"2\"", "\"pf.layers\":\"0\"", "pf.layers");
    expect_refused_checkpoint("\"pf.d_model\":\"16\"", "\"pf.d_model\":\"65537\"",
                              "pf.d_model");
    expect_refused_checkpoint("\"pf.heads\":\"2\"", "\"pf.heads\":\"3\"", "pf.heads");
    expect_refused_checkpoint("\"pf.context\":\"16\"", "\"pf.context\":\"-1\"", "pf.context");
    expect_refused_checkpoint("\"pf.redraw\":\"3\"", "\"pf.redraw\":\"x\"", "pf.redraw");
    expect_refused_checkpoint("\"pf.step\":\"4\"", "\"pf.step\":\"-4\"", "pf.step");
    expect_refused_checkpoint("\"pf.heads\"", "\"pf.hxads\"", "pf.heads");
    expect_refused_checkpoint("\"pf.step\":\"4\"", "\"pf.step\":\"9223372036854775807\"",
                              "pf.step");
    expect_refused_checkpoint("\"pf.window\":\"5\"", "\"pf.window\":\"0\"", "pf.window");
    expect_refused_checkpoint("\"pf.window\":\"5\"", "\"pf.window\":\"w\"", "pf.window");
    expect_refused_checkpoint("\"pf.attention\":\"favor++\"", "\"pf.attention\":\"locals\"",
                              "pf.attention");
    {
        /* a file from before the window was stored: the default window, 32 */
        char m2[512];
        pf_model *old = NULL;
        CHECK(edit_header(tpath("model.safetensors"), tpath("nowindow.safetensors"),
                          "\"pf.window\"", "\"pf.wxndow\""),
              "pf.window not in the header");
        CHECK_STATUS(pf_model_load(&old, tpath("nowindow.safetensors"), m2, sizeof(m2)), PF_OK);
        CHECK(old && pf_model_get_config(old).window == 32, "window of a file without one: %d",
              old ? pf_model_get_config(old).window : -1);
        pf_model_free(old);
    }

    expect_refused_checkpoint("\"pf.w_seed\":\"13\"", "\"pf.w_seed\":\"x\"", "pf.w_seed");
    expect_refused_checkpoint("\"pf.w_seed\":\"13\"", "\"pf.w_seed\":\"-13\"", "pf.w_seed");
    expect_refused_checkpoint("\"pf.w_seed\":\"13\"",
                              "\"pf.w_seed\":\"18446744073709551616\"", "pf.w_seed");

    char msg[512];
    pf_model *r = NULL;
    /* a checkpoint from before W had a seed of its own: no pf.w_seed, W's seed is pf.seed */
    CHECK(edit_header(tpath("model.safetensors"), tpath("old.safetensors"),
                      "\"pf.w_seed\":\"13\",", ""),
          "pf.w_seed not in the header");
    CHECK_STATUS(pf_model_load(&r, tpath("old.safetensors"), msg, sizeof(msg)), PF_OK);
    if (r) {
        CHECK(r->config.seed == 11 && r->config.w_seed == 11,
              "old checkpoint: seed %llu, w_seed %llu", (unsigned long long)r->config.seed,
              (unsigned long long)r->config.w_seed);
        pf_model_free(r);
        r = NULL;
    }
    /* a valid safetensors file that is not a model */
    CHECK_STATUS(pf_model_load(&r, tpath("rt.safetensors"), msg, sizeof(msg)), PF_EFORMAT);
    CHECK(strstr(msg, "not a performer") != NULL, "message '%s'", msg);
    CHECK_STATUS(pf_model_load(&r, tpath("missing.safetensors"), msg, sizeof(msg)), PF_EIO);
    /* a model whose metadata disagrees with its tensors: rewrite d_model in the header */
    size_t n = 0;
    unsigned char *b = read_bytes(tpath("model.safetensors"), &n);
    if (b) {
        char *p = strstr((char *)b + 8, "\"pf.layers\":\"2\"");
        CHECK(p != NULL, "pf.layers not found in the header");
        if (p) {
            p[13] = '3'; /* 3 layers, while the tensors hold 2 */
            write_bytes(tpath("mismatch.safetensors"), b, n);
            CHECK_STATUS(pf_model_load(&r, tpath("mismatch.safetensors"), msg, sizeof(msg)),
                         PF_EFORMAT);
            CHECK(strstr(msg, "disagrees") != NULL, "message '%s'", msg);
            p[13] = '2';
        }
        /* a NaN in the weights */
        unsigned char *c = xmalloc(n);
        memcpy(c, b, n);
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = hl << 8 | c[i];
        float nan = NAN;
        memcpy(c + 8 + hl, &nan, 4);
        write_bytes(tpath("nan.safetensors"), c, n);
        CHECK_STATUS(pf_model_load(&r, tpath("nan.safetensors"), msg, sizeof(msg)), PF_EFORMAT);
        CHECK(strstr(msg, "NaN") != NULL, "message '%s'", msg);
        free(c);
        free(b);
    }
    CHECK(r == NULL, "a failed load returned a model");
}

static void cleanup(void) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[600];
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

int main(void) {
    snprintf(dir, sizeof(dir), "/tmp/pf_test_st_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_round_trip_and_python();
    test_damaged();
    test_checkpoint(PF_LM_EXACT, PF_LM_LEARNED, PF_KERNEL_POSITIVE);
    test_checkpoint(PF_LM_FAVOR, PF_LM_ROTARY, PF_KERNEL_POSITIVE);
    test_checkpoint(PF_LM_LOCAL, PF_LM_ROTARY, PF_KERNEL_POSITIVE);
    test_checkpoint(PF_LM_FAVOR, PF_LM_LEARNED, PF_KERNEL_ELU); /* features 8 = d_model/heads */
    test_checkpoint(PF_LM_FAVORPP, PF_LM_LEARNED, PF_KERNEL_POSITIVE); /* (the file edited below) */
    test_checkpoint_refusals();
    /* no temporary file survived any write */
    DIR *d = opendir(dir);
    int tmp_left = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) tmp_left |= strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    CHECK(!tmp_left, "a temporary file was left in %s", dir);
    cleanup();
    TEST_MAIN_END();
}
