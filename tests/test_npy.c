/* test_npy.c: .npy reading and writing against numpy itself.
 *
 * - our files round-trip (every dtype, ranks 0..4, an empty array) and numpy reads them back to
 *   the values it computes itself;
 * - files numpy writes in formats 1.0, 2.0 and 3.0 (every dtype, ranks 0..8) read back byte for
 *   byte equal to numpy's own tobytes();
 * - headers written by hand: keys in any order, spacing, trailing commas, quotes;
 * - every refusal: other dtypes, big-endian, Fortran order, object and structured arrays, bad
 *   magic or version, truncated header or data, trailing bytes, too many dims, overflowing
 *   shapes, huge headers; each with PF_EFORMAT and a message naming the file and the problem;
 * - I/O failures (missing file, unwritable folder) give PF_EIO, and a failed write leaves
 *   nothing behind: no file at the path, no temporary file in the folder. */
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "io/io.h"

#define PY "/usr/bin/python3"

static char dir[256];

static void path_in(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", dir, name);
}

static int write_file(const char *path, const void *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t w = fwrite(buf, 1, n, f);
    return fclose(f) == 0 && w == n;
}

/* The whole file in a malloc'd buffer, or NULL. */
static unsigned char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = xmalloc((size_t)len + 1);
    *n = fread(buf, 1, (size_t)len, f);
    fclose(f);
    return buf;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* How many names in folder d contain ".tmp." (our temporary files). */
static int count_temp_files(const char *d) {
    DIR *dp = opendir(d);
    if (!dp) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(dp);
    return n;
}

/* Runs a Python script (with numpy) in the test folder; its exit status (0 = success). */
static int run_python(const char *name, const char *script) {
    char path[512], cmd[1200];
    path_in(path, sizeof(path), name);
    if (!write_file(path, script, strlen(script))) return -1;
    snprintf(cmd, sizeof(cmd), "cd '%s' && " PY " '%s'", dir, path);
    return system(cmd);
}

static int is_empty(const pf_array *a) {
    return a->data == NULL && pf_array_size(a) == 0;
}

/* ---- our files, round trip and read by numpy ------------------------------------------- */

static const int n_shapes = 6;
static const int ranks[] = {0, 1, 2, 3, 4, 2};
static const int64_t shapes[][4] = {{0}, {5}, {3, 4}, {2, 3, 4}, {2, 1, 3, 2}, {0, 3}};
static const char *const dt_names[] = {"f4", "i4", "i8"};

/* Value i of the test arrays; the Python check below computes the same. */
static void fill(pf_array *a) {
    int64_t n = pf_array_size(a);
    for (int64_t i = 0; i < n; i++) {
        if (a->dtype == PF_F32) ((float *)a->data)[i] = (float)i * 0.5f - 3.25f;
        if (a->dtype == PF_I32) ((int32_t *)a->data)[i] = (int32_t)(i * 7 - 100);
        if (a->dtype == PF_I64) ((int64_t *)a->data)[i] = i * 3000000000LL - 5;
    }
}

static void test_round_trip(void) {
    char path[512], msg[512];
    for (int t = 0; t < 3; t++) {
        for (int s = 0; s < n_shapes; s++) {
            pf_array a = {.dtype = (pf_dtype)t, .ndim = ranks[s]};
            for (int i = 0; i < ranks[s]; i++) a.shape[i] = shapes[s][i];
            int64_t n = pf_array_size(&a);
            size_t esize = t == PF_I64 ? 8 : 4;
            a.data = xmalloc((size_t)n * esize);
            fill(&a);
            char name[64];
            snprintf(name, sizeof(name), "rt_%s_%d.npy", dt_names[t], s);
            path_in(path, sizeof(path), name);
            CHECK_STATUS(pf_npy_write(path, &a, msg, sizeof(msg)), PF_OK);

            /* Format 1.0, header padded so the data starts at a multiple of 64, ending '\n'. */
            size_t len = 0;
            unsigned char *raw = read_file(path, &len);
            CHECK(raw != NULL, "%s not written", path);
            if (raw) {
                size_t hlen = (size_t)raw[8] | (size_t)raw[9] << 8;
                CHECK(len >= 10 && memcmp(raw, "\x93NUMPY\x01\x00", 8) == 0, "%s: prefix", name);
                CHECK((10 + hlen) % 64 == 0, "%s: data offset %zu", name, 10 + hlen);
                CHECK(raw[10 + hlen - 1] == '\n', "%s: header does not end in newline", name);
                CHECK(len == 10 + hlen + (size_t)n * esize, "%s: size %zu", name, len);
                free(raw);
            }

            pf_array b;
            CHECK_STATUS(pf_npy_read(path, &b, msg, sizeof(msg)), PF_OK);
            CHECK(b.dtype == a.dtype && b.ndim == a.ndim, "%s: dtype/ndim", name);
            for (int i = 0; i < a.ndim; i++) CHECK(b.shape[i] == a.shape[i], "%s: dim %d", name, i);
            CHECK(pf_array_size(&b) == n, "%s: size", name);
            CHECK(n == 0 || memcmp(a.data, b.data, (size_t)n * esize) == 0, "%s: data", name);
            pf_array_free(&b);
            free(a.data);
        }
    }
    CHECK(count_temp_files(dir) == 0, "temporary files left after successful writes");

    /* numpy reads what we wrote and finds the values it computes itself. */
    int rc = run_python("check_ours.py",
                        "import numpy as np, sys\n"
                        "shapes = [(), (5,), (3, 4), (2, 3, 4), (2, 1, 3, 2), (0, 3)]\n"
                        "bad = 0\n"
                        "for dt in ['f4', 'i4', 'i8']:\n"
                        "    for s, shape in enumerate(shapes):\n"
                        "        a = np.load('rt_%s_%d.npy' % (dt, s))\n"
                        "        i = np.arange(int(np.prod(shape)), dtype=np.int64)\n"
                        "        if dt == 'f4': ref = (i.astype(np.float32) * np.float32(0.5)"
                        " - np.float32(3.25))\n"
                        "        elif dt == 'i4': ref = (i * 7 - 100).astype(np.int32)\n"
                        "        else: ref = i * 3000000000 - 5\n"
                        "        ref = ref.astype('<' + dt).reshape(shape)\n"
                        "        if a.dtype != ref.dtype or a.shape != ref.shape or "
                        "not np.array_equal(a, ref) or not a.flags.c_contiguous:\n"
                        "            print('numpy disagrees on', dt, shape, a.dtype, a.shape)\n"
                        "            bad += 1\n"
                        "sys.exit(1 if bad else 0)\n");
    CHECK(rc == 0, "numpy could not read our files back (python status %d)", rc);
}

/* ---- numpy's files -------------------------------------------------------------------- */

static void test_numpy_files(void) {
    int rc =
        run_python("make_numpy.py",
                   "import numpy as np\n"
                   "rng = np.random.default_rng(7)\n"
                   "shapes = [(), (7,), (3, 5), (2, 3, 4), (2, 1, 3, 2),"
                   " (1, 2, 1, 2, 1, 2, 1, 2), (0,)]\n"
                   "with open('manifest.txt', 'w') as m:\n"
                   "    for v in [(1, 0), (2, 0), (3, 0)]:\n"
                   "        for dt in ['<f4', '<i4', '<i8']:\n"
                   "            for k, shape in enumerate(shapes):\n"
                   "                if dt == '<f4': a = rng.standard_normal(shape)\n"
                   "                else: a = rng.integers(-2**31, 2**31, shape)\n"
                   "                a = np.asarray(a).astype(dt)\n"
                   "                name = 'np_%d_%s_%d' % (v[0], dt[1:], k)\n"
                   "                with open(name + '.npy', 'wb') as f:\n"
                   "                    np.lib.format.write_array(f, a, version=v)\n"
                   "                with open(name + '.raw', 'wb') as f: f.write(a.tobytes())\n"
                   "                m.write('%s %s %d %s\\n' % (name, dt, a.ndim,"
                   " ' '.join(str(x) for x in a.shape)))\n");
    CHECK(rc == 0, "python failed to write the numpy fixtures (status %d)", rc);
    if (rc != 0) return;

    char mpath[512];
    path_in(mpath, sizeof(mpath), "manifest.txt");
    FILE *m = fopen(mpath, "r");
    CHECK(m != NULL, "no manifest");
    if (!m) return;
    char line[256];
    int files = 0;
    while (fgets(line, sizeof(line), m)) {
        char name[64], dt[8];
        int ndim, off = 0;
        if (sscanf(line, "%63s %7s %d%n", name, dt, &ndim, &off) != 3) continue;
        int64_t shape[PF_NPY_MAX_DIMS] = {0};
        char *p = line + off;
        for (int i = 0; i < ndim; i++) shape[i] = strtoll(p, &p, 10);
        pf_dtype want = strcmp(dt, "<f4") == 0 ? PF_F32 : strcmp(dt, "<i4") == 0 ? PF_I32 : PF_I64;

        char path[512], rawpath[512], msg[512];
        snprintf(path, sizeof(path), "%s/%s.npy", dir, name);
        snprintf(rawpath, sizeof(rawpath), "%s/%s.raw", dir, name);
        pf_array a;
        CHECK_STATUS(pf_npy_read(path, &a, msg, sizeof(msg)), PF_OK);
        CHECK(msg[0] == '\0' || a.data == NULL, "%s: message on success: %s", name, msg);
        CHECK(a.dtype == want && a.ndim == ndim, "%s: dtype %d ndim %d", name, a.dtype, a.ndim);
        for (int i = 0; i < ndim; i++) CHECK(a.shape[i] == shape[i], "%s: dim %d", name, i);
        size_t rawlen = 0;
        unsigned char *raw = read_file(rawpath, &rawlen);
        size_t esize = want == PF_I64 ? 8 : 4;
        CHECK(raw && rawlen == (size_t)pf_array_size(&a) * esize, "%s: size", name);
        CHECK(raw && a.data && (rawlen == 0 || memcmp(raw, a.data, rawlen) == 0),
              "%s: data differ from numpy's tobytes()", name);
        free(raw);
        pf_array_free(&a);
        files++;
    }
    fclose(m);
    CHECK(files == 3 * 3 * 7, "read %d numpy files, expected 63", files);
}

/* Files numpy writes that we must refuse, each with a phrase the message must contain. */
static void test_numpy_refusals(void) {
    int rc = run_python("make_refused.py",
                        "import numpy as np\n"
                        "a = np.arange(6, dtype='<f4').reshape(2, 3)\n"
                        "np.save('f8.npy', a.astype('<f8'))\n"
                        "np.save('u2.npy', a.astype('<u2'))\n"
                        "np.save('f2ok.npy', a.astype('<f2'))\n"
                        "np.save('u4.npy', a.astype('<u4'))\n"
                        "np.save('b1.npy', a > 2)\n"
                        "np.save('be.npy', a.astype('>f4'))\n"
                        "np.save('fortran.npy', np.asfortranarray(a))\n"
                        "np.save('object.npy', np.array([1, 'x'], dtype=object),"
                        " allow_pickle=True)\n"
                        "np.save('record.npy', np.zeros(3, dtype=[('x', '<f4'), ('y', '<i4')]))\n");
    CHECK(rc == 0, "python failed to write the refused fixtures (status %d)", rc);
    static const char *const cases[][2] = {
        {"f8.npy", "dtype '<f8' is not supported; expected float32 ('<f4')"},
        {"u2.npy", "'<u2'"},
        {"u4.npy", "'<u4'"},
        {"b1.npy", "'|b1'"},
        {"be.npy", "big-endian"},
        {"fortran.npy", "Fortran"},
        {"object.npy", "object"},
        {"record.npy", "structured"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char path[512], msg[512];
        path_in(path, sizeof(path), cases[i][0]);
        pf_array a;
        CHECK_STATUS(pf_npy_read(path, &a, msg, sizeof(msg)), PF_EFORMAT);
        CHECK(strncmp(msg, path, strlen(path)) == 0, "message does not start with the path: %s",
              msg);
        CHECK(strstr(msg, cases[i][1]) != NULL, "message lacks \"%s\": %s", cases[i][1], msg);
        CHECK(is_empty(&a), "%s: array not left empty", cases[i][0]);
    }
    /* float16 is read (numpy's '<f2': 0..5 are the codes below) */
    char path[512], msg[512];
    path_in(path, sizeof(path), "f2ok.npy");
    pf_array a;
    CHECK_STATUS(pf_npy_read(path, &a, msg, sizeof(msg)), PF_OK);
    static const uint16_t want[6] = {0x0000, 0x3c00, 0x4000, 0x4200, 0x4400, 0x4500};
    CHECK(a.dtype == PF_F16 && a.ndim == 2 && a.shape[0] == 2 && a.shape[1] == 3 &&
              memcmp(a.data, want, sizeof want) == 0,
          "numpy's float16 .npy read wrong");
    pf_array_free(&a);
}

/* ---- hand-made headers ----------------------------------------------------------------- */

/* A file: version major.minor, header text exactly as given (no padding added), then ndata
 * bytes 0, 1, 2, ... For version >= 2 the length is u32, else u16. hlen_override, if not 0,
 * replaces the length field. */
static void make_npy(const char *path, int major, int minor, const char *header, size_t ndata,
                     uint32_t hlen_override) {
    size_t h = strlen(header);
    size_t pre = major >= 2 ? 12 : 10;
    unsigned char *buf = xmalloc(pre + h + ndata);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    buf[7] = (unsigned char)minor;
    uint32_t len = hlen_override ? hlen_override : (uint32_t)h;
    buf[8] = len & 0xff;
    buf[9] = (len >> 8) & 0xff;
    if (major >= 2) {
        buf[10] = (len >> 16) & 0xff;
        buf[11] = (len >> 24) & 0xff;
    }
    memcpy(buf + pre, header, h);
    for (size_t i = 0; i < ndata; i++) buf[pre + h + i] = (unsigned char)i;
    CHECK(write_file(path, buf, pre + h + ndata), "cannot write %s", path);
    free(buf);
}

static void test_handmade_accepted(void) {
    struct {
        const char *header;
        int major;
        size_t ndata;
        pf_dtype dtype;
        int ndim;
        int64_t shape[8];
    } ok[] = {
        {"{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}\n", 1, 24, PF_F32, 2, {2, 3}},
        {"{ \"descr\" : \"<i4\" ,  'fortran_order':False,'shape':( 4 , ) , }   \n",
         1,
         16,
         PF_I32,
         1,
         {4}},
        {"{'descr': '<i8', 'fortran_order': False, 'shape': (), }", 2, 8, PF_I64, 0, {0}},
        {"{'fortran_order': False, 'descr': '<f4', 'shape': (1, 1, 1, 1, 1, 1, 1, 2,)}\n",
         3,
         8,
         PF_F32,
         8,
         {1, 1, 1, 1, 1, 1, 1, 2}},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (3L, 1L), }\n",
         1,
         12,
         PF_F32,
         2,
         {3, 1}},
        {"{'descr':'<f4','fortran_order':False,'shape':(0,5)}", 1, 0, PF_F32, 2, {0, 5}},
    };
    for (size_t c = 0; c < sizeof(ok) / sizeof(ok[0]); c++) {
        char path[512], msg[512];
        snprintf(path, sizeof(path), "%s/ok_%zu.npy", dir, c);
        make_npy(path, ok[c].major, 0, ok[c].header, ok[c].ndata, 0);
        pf_array a;
        pf_status st = pf_npy_read(path, &a, msg, sizeof(msg));
        CHECK(st == PF_OK, "case %zu: %s", c, msg);
        if (st != PF_OK) continue;
        CHECK(a.dtype == ok[c].dtype && a.ndim == ok[c].ndim, "case %zu: dtype/ndim", c);
        for (int i = 0; i < a.ndim; i++) CHECK(a.shape[i] == ok[c].shape[i], "case %zu: dim", c);
        unsigned char *d = a.data;
        for (size_t i = 0; i < ok[c].ndata; i++) CHECK(d[i] == (unsigned char)i, "case %zu", c);
        pf_array_free(&a);
    }
}

static void test_handmade_refused(void) {
    static const char *const good = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n";
    struct {
        const char *header;
        int major, minor;
        size_t ndata;
        uint32_t hlen;
        const char *phrase;
    } bad[] = {
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }\n", 1, 0, 8, 0, "Fortran"},
        {"{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }\n", 1, 0, 16, 0, "'<f8'"},
        {"{'descr': '>i8', 'fortran_order': False, 'shape': (2,), }\n", 1, 0, 16, 0, "big-endian"},
        {"{'descr': '|O', 'fortran_order': False, 'shape': (2,), }\n", 1, 0, 16, 0, "object"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }\n", 1, 0, 4, 0,
         "more than 8 dimensions"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }\n", 1, 0, 8, 0, "negative"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4), }\n", 1, 0,
         8, 0, "too large"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }\n", 1, 0, 8,
         0, "too large"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2), }\n", 1, 0, 8, 0, "tuple"},
        {"{'descr': '<f4', 'shape': (2,), }\n", 1, 0, 8, 0, "no 'fortran_order'"},
        {"{'fortran_order': False, 'shape': (2,), }\n", 1, 0, 8, 0, "no 'descr'"},
        {"{'descr': '<f4', 'fortran_order': False, }\n", 1, 0, 8, 0, "no 'shape'"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}\n", 1, 0, 8, 0,
         "duplicate"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}\n", 1, 0, 8, 0,
         "unexpected key 'x'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } junk\n", 1, 0, 8, 0,
         "after the dict"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)\n", 1, 0, 8, 0, "header"},
        {"['descr', '<f4']\n", 1, 0, 8, 0, "not a dict"},
        {"{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,)}\n", 1, 0, 8, 0,
         "neither True nor False"},
        {good, 4, 0, 8, 0, "version 4.0"},
        {good, 1, 1, 8, 0, "version 1.1"},
        {good, 2, 0, 8, 0xFFFFFFF0u, "implausibly large"},
        {good, 1, 0, 8, 200, "truncated header"},
        {good, 2, 0, 8, 5000, "truncated header"},
        {good, 1, 0, 7, 0, "truncated data"},
        {good, 1, 0, 0, 0, "truncated data"},
        {good, 1, 0, 9, 0, "after the array"},
    };
    for (size_t c = 0; c < sizeof(bad) / sizeof(bad[0]); c++) {
        char path[512], msg[512];
        snprintf(path, sizeof(path), "%s/bad_%zu.npy", dir, c);
        make_npy(path, bad[c].major, bad[c].minor, bad[c].header, bad[c].ndata, bad[c].hlen);
        pf_array a;
        CHECK_STATUS(pf_npy_read(path, &a, msg, sizeof(msg)), PF_EFORMAT);
        CHECK(strncmp(msg, path, strlen(path)) == 0, "case %zu: message lacks the path: %s", c,
              msg);
        CHECK(strstr(msg, bad[c].phrase) != NULL, "case %zu: message lacks \"%s\": %s", c,
              bad[c].phrase, msg);
        CHECK(is_empty(&a), "case %zu: array not left empty", c);
    }

    /* Not .npy at all: wrong magic, an empty file, a file shorter than the prefix. */
    static const char *const junk[] = {"\x93NUMPZ\x01\x00\x10\x00", "", "\x93NUMPY\x01"};
    static const size_t junk_len[] = {10, 0, 7};
    static const char *const junk_phrase[] = {"not a .npy file", "not a .npy file",
                                              "truncated header"};
    for (int c = 0; c < 3; c++) {
        char path[512], msg[512];
        snprintf(path, sizeof(path), "%s/junk_%d.npy", dir, c);
        CHECK(write_file(path, junk[c], junk_len[c]), "cannot write %s", path);
        pf_array a;
        CHECK_STATUS(pf_npy_read(path, &a, msg, sizeof(msg)), PF_EFORMAT);
        CHECK(strstr(msg, junk_phrase[c]) != NULL, "junk %d: %s", c, msg);
        CHECK(is_empty(&a), "junk %d: array not left empty", c);
    }
}

/* ---- I/O errors and atomic writes --------------------------------------------------------- */

/* A write that must fail with PF_EIO and leave no file at path and no temporary in folder. */
static void check_write_fails(const char *path, const char *folder, const char *what) {
    float x[4] = {1, 2, 3, 4};
    pf_array a = {.dtype = PF_F32, .ndim = 1, .shape = {4}, .data = x};
    char msg[512];
    struct stat before;
    int existed = stat(path, &before) == 0;
    CHECK_STATUS(pf_npy_write(path, &a, msg, sizeof(msg)), PF_EIO);
    CHECK(strncmp(msg, path, strlen(path)) == 0 && strlen(msg) > strlen(path) + 2,
          "%s: message: %s", what, msg);
    struct stat after;
    if (existed)
        CHECK(stat(path, &after) == 0 && S_ISDIR(after.st_mode) == S_ISDIR(before.st_mode),
              "%s: what was at the path changed", what);
    else
        CHECK(!file_exists(path), "%s: a file was left at %s", what, path);
    if (folder) CHECK(count_temp_files(folder) == 0, "%s: temporary file left in %s", what, folder);
}

static void test_io_errors(void) {
    char path[1024], msg[1024];
    pf_array a;

    path_in(path, sizeof(path), "does_not_exist.npy");
    CHECK_STATUS(pf_npy_read(path, &a, msg, sizeof(msg)), PF_EIO);
    CHECK(strstr(msg, path) && strstr(msg, strerror(ENOENT)), "missing file: %s", msg);
    CHECK(is_empty(&a), "missing file: array not left empty");

    CHECK_STATUS(pf_npy_read(dir, &a, msg, sizeof(msg)), PF_EIO); /* a folder */
    CHECK(is_empty(&a), "folder: array not left empty");

    /* A folder that does not exist. */
    path_in(path, sizeof(path), "no/such/folder/x.npy");
    check_write_fails(path, dir, "missing folder");

    /* The path is a folder: the temporary file is written, the rename fails, and the
     * temporary must be removed. */
    path_in(path, sizeof(path), "a_folder");
    CHECK(mkdir(path, 0755) == 0, "mkdir %s", path);
    check_write_fails(path, dir, "path is a folder");

    /* A read-only folder. Root ignores permissions, so there use a folder no one can create
     * files in: /proc. */
    char ro[512];
    path_in(ro, sizeof(ro), "readonly");
    CHECK(mkdir(ro, 0755) == 0 && chmod(ro, 0555) == 0, "mkdir/chmod %s", ro);
    if (geteuid() != 0) {
        snprintf(path, sizeof(path), "%s/x.npy", ro);
        check_write_fails(path, ro, "read-only folder");
    }
    check_write_fails("/proc/pf_test_npy_x.npy", NULL, "/proc");
    chmod(ro, 0755);

    /* Invalid arrays are PF_EINVAL and write nothing. */
    float x[2] = {1, 2};
    path_in(path, sizeof(path), "invalid.npy");
    pf_array bad = {.dtype = PF_F32, .ndim = 9, .shape = {1}, .data = x};
    CHECK_STATUS(pf_npy_write(path, &bad, msg, sizeof(msg)), PF_EINVAL);
    bad.ndim = 1;
    bad.shape[0] = -1;
    CHECK_STATUS(pf_npy_write(path, &bad, msg, sizeof(msg)), PF_EINVAL);
    bad.shape[0] = 2;
    bad.data = NULL;
    CHECK_STATUS(pf_npy_write(path, &bad, msg, sizeof(msg)), PF_EINVAL);
    bad.data = x;
    bad.dtype = (pf_dtype)7;
    CHECK_STATUS(pf_npy_write(path, &bad, msg, sizeof(msg)), PF_EINVAL);
    CHECK_STATUS(pf_npy_write(NULL, &bad, msg, sizeof(msg)), PF_EINVAL);
    CHECK_STATUS(pf_npy_write(path, NULL, msg, sizeof(msg)), PF_EINVAL);
    CHECK_STATUS(pf_npy_read(NULL, &a, msg, sizeof(msg)), PF_EINVAL);
    CHECK_STATUS(pf_npy_read(path, NULL, NULL, 0), PF_EINVAL);
    CHECK(!file_exists(path), "an invalid array left a file");
    CHECK(count_temp_files(dir) == 0, "temporary files left");

    /* Overwriting replaces the file whole; the new file gets the usual umask'd mode. */
    path_in(path, sizeof(path), "overwrite.npy");
    float y[3] = {5, 6, 7};
    pf_array first = {.dtype = PF_F32, .ndim = 1, .shape = {2}, .data = x};
    pf_array second = {.dtype = PF_F32, .ndim = 1, .shape = {3}, .data = y};
    CHECK_STATUS(pf_npy_write(path, &first, msg, sizeof(msg)), PF_OK);
    CHECK_STATUS(pf_npy_write(path, &second, msg, sizeof(msg)), PF_OK);
    CHECK_STATUS(pf_npy_read(path, &a, NULL, 0), PF_OK);
    CHECK(a.shape[0] == 3 && ((float *)a.data)[2] == 7.0f, "overwrite did not replace");
    pf_array_free(&a);
    mode_t mask = umask(022);
    umask(mask);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == (0666 & ~mask), "mode %o, expected %o",
          (unsigned)(st.st_mode & 0777), (unsigned)(0666 & ~mask));
    CHECK(count_temp_files(dir) == 0, "temporary files left");

    /* Only a regular file (or a new name) is replaced: a symbolic link, a FIFO or a device
     * at the path is refused and left as it was (a rename would replace the node itself;
     * as root, /dev/null). Reading a FIFO is refused at once instead of waiting for a
     * writer. */
    char target[1024], link[1024], fifo[1024];
    path_in(target, sizeof(target), "target.npy");
    path_in(link, sizeof(link), "link.npy");
    path_in(fifo, sizeof(fifo), "fifo.npy");
    CHECK_STATUS(pf_npy_write(target, &first, msg, sizeof(msg)), PF_OK);
    CHECK(symlink("target.npy", link) == 0, "symlink");
    CHECK_STATUS(pf_npy_write(link, &second, msg, sizeof(msg)), PF_EIO);
    CHECK(strstr(msg, "symbolic link") && strstr(msg, link), "symlink message: %s", msg);
    struct stat lst;
    CHECK(lstat(link, &lst) == 0 && S_ISLNK(lst.st_mode), "the link was replaced");
    CHECK_STATUS(pf_npy_read(target, &a, NULL, 0), PF_OK);
    CHECK(a.shape[0] == 2, "the link's target was changed");
    pf_array_free(&a);
    CHECK(mkfifo(fifo, 0600) == 0, "mkfifo");
    CHECK_STATUS(pf_npy_write(fifo, &second, msg, sizeof(msg)), PF_EIO);
    CHECK(strstr(msg, "FIFO"), "fifo message: %s", msg);
    CHECK(lstat(fifo, &lst) == 0 && S_ISFIFO(lst.st_mode), "the FIFO was replaced");
    CHECK_STATUS(pf_npy_read(fifo, &a, msg, sizeof(msg)), PF_EIO);
    CHECK(strstr(msg, "FIFO") && is_empty(&a), "fifo read: %s", msg);
    CHECK_STATUS(pf_npy_write("/dev/null", &second, msg, sizeof(msg)), PF_EIO);
    CHECK(lstat("/dev/null", &lst) == 0 && S_ISCHR(lst.st_mode), "/dev/null was replaced");
    CHECK_STATUS(pf_npy_read("/dev/zero", &a, msg, sizeof(msg)), PF_EIO);
    CHECK(strstr(msg, "device"), "/dev/zero read: %s", msg);
    CHECK(count_temp_files(dir) == 0, "temporary files left");

    /* A name of NAME_MAX (255) bytes is legal: its temporary name is shortened to fit. */
    char longname[300], longpath[1400];
    memset(longname, 'n', 251);
    memcpy(longname + 251, ".npy", 5);
    path_in(longpath, sizeof(longpath), longname);
    CHECK_STATUS(pf_npy_write(longpath, &second, msg, sizeof(msg)), PF_OK);
    CHECK_STATUS(pf_npy_write(longpath, &first, msg, sizeof(msg)), PF_OK);
    CHECK_STATUS(pf_npy_read(longpath, &a, msg, sizeof(msg)), PF_OK);
    CHECK(a.shape[0] == 2, "the long name was not replaced");
    pf_array_free(&a);
    CHECK(count_temp_files(dir) == 0, "temporary files left");

    /* A message that does not fit is cut, never overflows; NULL errmsg is fine. */
    char tiny[8];
    path_in(path, sizeof(path), "does_not_exist.npy");
    CHECK_STATUS(pf_npy_read(path, &a, tiny, sizeof(tiny)), PF_EIO);
    CHECK(strlen(tiny) == 7, "truncated message length %zu", strlen(tiny));
    CHECK_STATUS(pf_npy_read(path, &a, NULL, 0), PF_EIO);
}

/* pf_npy_map: the same arrays as pf_npy_read, mapped from 1 MiB on (writes through the mapping
 * stay private: the file is unchanged), read below that; the same refusals; pf_array_free
 * unmaps (ASan and the resident size would show a leak or a double free). */
static void test_map(void) {
    char path[512], msg[512];
    static const int64_t lens[3] = {7, 262144, 300001}; /* 28 B, 1 MiB, 1.2 MB of float32 */
    for (int i = 0; i < 3; i++) {
        for (int t = 0; t < 3; t++) {
            pf_array a = {.dtype = (pf_dtype)t, .ndim = 2, .shape = {lens[i], 1}};
            size_t esize = t == PF_I64 ? 8 : 4, n = (size_t)lens[i];
            a.data = xmalloc(n * esize);
            fill(&a);
            path_in(path, sizeof(path), "map.npy");
            CHECK_STATUS(pf_npy_write(path, &a, msg, sizeof(msg)), PF_OK);
            size_t flen = 0;
            unsigned char *before = read_file(path, &flen);
            pf_array m, r;
            CHECK_STATUS(pf_npy_map(path, &m, msg, sizeof(msg)), PF_OK);
            CHECK_STATUS(pf_npy_read(path, &r, msg, sizeof(msg)), PF_OK);
            int mapped = m.map_ != NULL;
            CHECK(mapped == (n * esize >= (1u << 20)), "%lld x %s: mapped %d",
                  (long long)lens[i], dt_names[t], mapped);
            CHECK(m.dtype == a.dtype && m.ndim == 2 && m.shape[0] == lens[i] && m.shape[1] == 1,
                  "map: dtype/shape");
            CHECK(m.data && memcmp(m.data, a.data, n * esize) == 0 &&
                      memcmp(r.data, a.data, n * esize) == 0,
                  "%lld x %s: mapped data differ", (long long)lens[i], dt_names[t]);
            ((unsigned char *)m.data)[0] ^= 0xff; /* private: the file must not change */
            size_t flen2 = 0;
            unsigned char *after = read_file(path, &flen2);
            CHECK(before && after && flen == flen2 && memcmp(before, after, flen) == 0,
                  "a write through the mapping reached the file");
            free(before);
            free(after);
            pf_array_free(&m);
            CHECK(is_empty(&m) && m.map_ == NULL, "pf_array_free left a mapped array");
            pf_array_free(&r);
            free(a.data);
        }
    }
    /* the refusals are pf_npy_read's */
    pf_array m;
    path_in(path, sizeof(path), "map_fifo.npy");
    CHECK(mkfifo(path, 0600) == 0, "mkfifo");
    CHECK_STATUS(pf_npy_map(path, &m, msg, sizeof(msg)), PF_EIO);
    CHECK(strstr(msg, "FIFO") && is_empty(&m), "map of a FIFO: %s", msg);
    unlink(path);
    path_in(path, sizeof(path), "map_short.npy");
    static float x[300000];
    pf_array big = {.dtype = PF_F32, .ndim = 1, .shape = {300000}, .data = x};
    CHECK_STATUS(pf_npy_write(path, &big, msg, sizeof(msg)), PF_OK);
    CHECK(truncate(path, 1000000) == 0, "truncate");
    CHECK_STATUS(pf_npy_map(path, &m, msg, sizeof(msg)), PF_EFORMAT);
    CHECK(strstr(msg, "truncated") && is_empty(&m), "map of a truncated file: %s", msg);
    CHECK_STATUS(pf_npy_map(NULL, &m, msg, sizeof(msg)), PF_EINVAL);
}

/* A write in progress when a signal stops the process: the handler the tool installs calls
 * pf_io_temp_remove_all, which removes the temporary file (nothing half-written is left) and
 * leaves the destination as it was. Run in a child killed by SIGTERM. */
static void on_term(int sig) {
    pf_io_temp_remove_all();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void test_signal_cleanup(void) {
    char path[512];
    path_in(path, sizeof(path), "sig.npy");
    float x[4] = {1, 2, 3, 4};
    pf_array a = {.dtype = PF_F32, .ndim = 1, .shape = {4}, .data = x};
    CHECK_STATUS(pf_npy_write(path, &a, NULL, 0), PF_OK);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGTERM, on_term);
        pf_io_atomic w;
        if (pf_io_atomic_begin(&w, path, NULL, 0) != PF_OK) _exit(3);
        if (write(w.fd, "half", 4) != 4) _exit(4);
        raise(SIGTERM); /* stopped mid-write */
        _exit(5);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM, "child status %d", status);
    CHECK(count_temp_files(dir) == 0, "a temporary file survived the signal");
    pf_array b;
    CHECK_STATUS(pf_npy_read(path, &b, NULL, 0), PF_OK);
    CHECK(b.shape[0] == 4 && ((float *)b.data)[3] == 4.0f, "the destination changed");
    pf_array_free(&b);
}

static void test_array_helpers(void) {
    pf_array_free(NULL);
    pf_array a = {.dtype = PF_F32, .ndim = 0, .data = NULL};
    CHECK(pf_array_size(&a) == 1, "rank 0 has one element");
    CHECK(pf_array_size(NULL) == 0, "NULL has none");
    a.data = malloc(4); /* pf_array_free frees with free() */
    pf_array_free(&a);
    CHECK(is_empty(&a), "freed array is empty");
    pf_array_free(&a); /* twice is harmless */
    a.ndim = 3;
    a.shape[0] = 2, a.shape[1] = -1, a.shape[2] = 2;
    CHECK(pf_array_size(&a) == -1, "negative dim");
    a.shape[1] = INT64_MAX / 2;
    CHECK(pf_array_size(&a) == -1, "overflow");
    a.ndim = 9;
    CHECK(pf_array_size(&a) == -1, "ndim 9");
}

int main(void) {
    snprintf(dir, sizeof(dir), "/tmp/pf_test_npy_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_array_helpers();
    test_round_trip();
    test_map();
    test_signal_cleanup();
    test_numpy_files();
    test_numpy_refusals();
    test_handmade_accepted();
    test_handmade_refused();
    test_io_errors();
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "chmod -R u+w '%s'; rm -rf '%s'", dir, dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    TEST_MAIN_END();
}
