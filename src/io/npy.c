/* npy.c: NumPy .npy files (NEP 1's format), read and written without numpy.
 *
 * The format (numpy/lib/format.py, NEP 1): the magic "\x93NUMPY", a major and a minor version
 * byte, the header length (little-endian u16 for version 1.0, u32 for 2.0 and 3.0), then the
 * header: a Python dict literal with exactly the keys 'descr', 'fortran_order' and 'shape',
 * padded with spaces and ending in '\n'; then the raw array bytes in C (or Fortran) order.
 * Version 3.0 only changes the header's encoding (UTF-8 instead of latin-1), which is the same
 * for every header we accept.
 *
 * What we read: dtype '<f4', '<i4', '<i8'; fortran_order False; 0 to PF_NPY_MAX_DIMS dims.
 * Everything else is PF_EFORMAT with a message naming the file and the problem. We are strict
 * where numpy is lenient in one place: bytes after the array data are refused, because a file
 * longer than its header says is a sign that the header and the data disagree (numpy ignores
 * them).
 *
 * What we write: version 1.0, header padded so the data starts at a multiple of 64 bytes (as
 * numpy does), written to a fresh temporary file in the destination's folder and renamed over
 * the destination, so a reader never sees a partial file and a failure leaves nothing behind. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "io/io.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_PREFIX_V1 10          /* magic, version, u16 length */
#define NPY_PREFIX_V2 12          /* magic, version, u32 length */
#define NPY_MAX_HEADER (1u << 20) /* far above any real header (numpy's own limit is 10000) */
#define NPY_ALIGN 64

/* ---- errors ----------------------------------------------------------------------------- */


/* ---- arrays ----------------------------------------------------------------------------- */

static size_t dtype_size(pf_dtype t) {
    return t == PF_BF16 ? 0 : pf_dtype_size(t); /* (bfloat16 has no .npy type) */
}

static const char *dtype_descr(pf_dtype t) {
    switch (t) {
    case PF_F32:
        return "<f4";
    case PF_I32:
        return "<i4";
    case PF_I64:
        return "<i8";
    case PF_F16:
        return "<f2";
    case PF_BF16:
        return NULL;
    }
    return NULL;
}

/* An empty array: no data, shape (0,), so pf_array_size() is 0. */
static void array_clear(pf_array *a) {
    memset(a, 0, sizeof(*a));
    a->dtype = PF_F32;
    a->ndim = 1;
    a->shape[0] = 0;
    a->data = NULL;
}

/* The element count of ndim dims, or -1 if a dim is negative or the count (in bytes, with
 * elements of `esize` bytes) would not fit in both int64 and size_t. */
static int64_t shape_count(const int64_t *shape, int ndim, size_t esize) {
    uint64_t limit = (uint64_t)INT64_MAX;
    if ((uint64_t)SIZE_MAX < limit) limit = (uint64_t)SIZE_MAX;
    limit /= esize ? esize : 1;
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        uint64_t x = (uint64_t)shape[i];
        if (x != 0 && n > limit / x) return -1;
        n *= x;
    }
    return (int64_t)n;
}

int64_t pf_array_size(const pf_array *a) {
    if (!a) return 0;
    if (a->ndim < 0 || a->ndim > PF_NPY_MAX_DIMS) return -1;
    return shape_count(a->shape, a->ndim, 1);
}

void pf_array_free(pf_array *a) {
    if (!a) return;
    if (a->map_)
        munmap(a->map_, a->map_len_);
    else
        pf_free(a->data);
    array_clear(a);
}

/* ---- byte order ------------------------------------------------------------------------- */

static int host_is_little_endian(void) {
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* Reverses the bytes of each of n elements of `size` bytes (4 or 8), in place. */
static void swap_bytes(void *data, size_t n, size_t size) {
    unsigned char *p = data;
    for (size_t i = 0; i < n; i++, p += size) {
        for (size_t j = 0; j < size / 2; j++) {
            unsigned char t = p[j];
            p[j] = p[size - 1 - j];
            p[size - 1 - j] = t;
        }
    }
}

/* ---- header parsing --------------------------------------------------------------------- */

/* A cursor over the header text; err holds the first problem found. */
typedef struct parser {
    const char *s, *end;
    char err[256];
} parser;

static void skip_space(parser *p) {
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r'))
        p->s++;
}

static int parse_fail(parser *p, const char *fmt, ...) {
    if (!p->err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err, sizeof(p->err), fmt, ap);
        va_end(ap);
    }
    return 0;
}

static int expect(parser *p, char c) {
    skip_space(p);
    if (p->s >= p->end || *p->s != c) return parse_fail(p, "header: expected '%c'", c);
    p->s++;
    return 1;
}

/* A Python string literal in single or double quotes, without escapes (numpy never writes
 * any in the three keys or the dtypes we accept). Copies at most cap-1 chars to out. */
static int parse_string(parser *p, char *out, size_t cap) {
    skip_space(p);
    if (p->s >= p->end || (*p->s != '\'' && *p->s != '"'))
        return parse_fail(p, "header: expected a quoted string");
    char q = *p->s++;
    size_t n = 0;
    while (p->s < p->end && *p->s != q) {
        if (*p->s == '\\') return parse_fail(p, "header: escapes in strings are not supported");
        if (n + 1 >= cap) return parse_fail(p, "header: string too long");
        out[n++] = *p->s++;
    }
    if (p->s >= p->end) return parse_fail(p, "header: unterminated string");
    p->s++;
    out[n] = '\0';
    return 1;
}

static int parse_word(parser *p, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(p->end - p->s) >= n && memcmp(p->s, word, n) == 0) {
        p->s += n;
        return 1;
    }
    return 0;
}

/* A non-negative decimal integer that fits in int64 (Python 2 headers may end it in 'L'). */
static int parse_dim(parser *p, int64_t *out) {
    skip_space(p);
    if (p->s >= p->end || *p->s < '0' || *p->s > '9') {
        if (p->s < p->end && *p->s == '-') return parse_fail(p, "shape has a negative dimension");
        return parse_fail(p, "header: expected a dimension in 'shape'");
    }
    int64_t v = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
        int digit = *p->s++ - '0';
        if (v > (INT64_MAX - digit) / 10) return parse_fail(p, "shape has a dimension too large");
        v = v * 10 + digit;
    }
    if (p->s < p->end && *p->s == 'L') p->s++;
    *out = v;
    return 1;
}

/* A tuple of 0..PF_NPY_MAX_DIMS dims: "()", "(3,)", "(3, 4)", "(3, 4,)". */
static int parse_shape(parser *p, int64_t *shape, int *ndim) {
    skip_space(p);
    if (p->s >= p->end || *p->s != '(') return parse_fail(p, "header: 'shape' is not a tuple");
    p->s++;
    int n = 0;
    for (;;) {
        skip_space(p);
        if (p->s < p->end && *p->s == ')') {
            p->s++;
            break;
        }
        if (n == PF_NPY_MAX_DIMS)
            return parse_fail(p, "shape has more than %d dimensions", PF_NPY_MAX_DIMS);
        if (!parse_dim(p, &shape[n])) return 0;
        n++;
        skip_space(p);
        if (p->s < p->end && *p->s == ',') {
            p->s++;
        } else if (p->s < p->end && *p->s == ')') {
            /* "(3)" is not a tuple in Python, but it is unambiguous and numpy never writes
             * it; a 1-tuple needs its comma, so insist as numpy's literal_eval would. */
            if (n == 1) return parse_fail(p, "header: 'shape' (n) is not a tuple; expected (n,)");
        } else {
            return parse_fail(p, "header: expected ',' or ')' in 'shape'");
        }
    }
    *ndim = n;
    return 1;
}

/* What a descr means to us: 1 and *dtype set if accepted, else 0 and a message in p. */
static int check_descr(parser *p, const char *descr, pf_dtype *dtype) {
    if (strcmp(descr, "<f4") == 0) {
        *dtype = PF_F32;
        return 1;
    }
    if (strcmp(descr, "<i4") == 0) {
        *dtype = PF_I32;
        return 1;
    }
    if (strcmp(descr, "<i8") == 0) {
        *dtype = PF_I64;
        return 1;
    }
    if (strcmp(descr, "<f2") == 0) {
        *dtype = PF_F16;
        return 1;
    }
    static const char *const expected =
        "expected float32 ('<f4'), float16 ('<f2'), int32 ('<i4') or int64 ('<i8')";
    if (descr[0] == '>')
        return parse_fail(p, "dtype '%s' is big-endian, which is not supported; %s", descr,
                          expected);
    if (strcmp(descr, "|O") == 0)
        return parse_fail(p,
                          "dtype '%s' is an object array (pickled), which is not supported; "
                          "%s",
                          descr, expected);
    /* floats of another width: say how to convert, the usual fix */
    const char *hint = descr[1] == 'f' ? "; convert with .astype(numpy.float32)" : "";
    return parse_fail(p, "dtype '%s' is not supported; %s%s", descr, expected, hint);
}

/* Parses the whole header dict into dtype and shape. */
static int parse_header(parser *p, pf_dtype *dtype, int64_t *shape, int *ndim) {
    int have_descr = 0, have_order = 0, have_shape = 0;
    skip_space(p);
    if (p->s >= p->end || *p->s != '{') return parse_fail(p, "header is not a dict");
    p->s++;
    for (;;) {
        skip_space(p);
        if (p->s < p->end && *p->s == '}') {
            p->s++;
            break;
        }
        char key[32];
        if (!parse_string(p, key, sizeof(key))) return 0;
        if (!expect(p, ':')) return 0;
        skip_space(p);
        if (strcmp(key, "descr") == 0) {
            if (have_descr++) return parse_fail(p, "header: duplicate key 'descr'");
            if (p->s < p->end && *p->s == '[')
                return parse_fail(p, "structured dtypes (records) are not supported; expected "
                                     "float32 ('<f4'), int32 ('<i4') or int64 ('<i8')");
            char descr[32];
            if (!parse_string(p, descr, sizeof(descr))) return 0;
            if (!check_descr(p, descr, dtype)) return 0;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (have_order++) return parse_fail(p, "header: duplicate key 'fortran_order'");
            if (parse_word(p, "True"))
                return parse_fail(p, "Fortran-ordered arrays are not supported; save a "
                                     "C-ordered array (numpy.ascontiguousarray)");
            if (!parse_word(p, "False"))
                return parse_fail(p, "header: 'fortran_order' is neither True nor False");
        } else if (strcmp(key, "shape") == 0) {
            if (have_shape++) return parse_fail(p, "header: duplicate key 'shape'");
            if (!parse_shape(p, shape, ndim)) return 0;
        } else {
            return parse_fail(p, "header: unexpected key '%s'", key);
        }
        skip_space(p);
        if (p->s < p->end && *p->s == ',') {
            p->s++;
        } else if (!(p->s < p->end && *p->s == '}')) {
            return parse_fail(p, "header: expected ',' or '}'");
        }
    }
    if (!have_descr) return parse_fail(p, "header has no 'descr'");
    if (!have_order) return parse_fail(p, "header has no 'fortran_order'");
    if (!have_shape) return parse_fail(p, "header has no 'shape'");
    /* numpy pads with spaces and ends with '\n'; anything else after the dict is not ours. */
    skip_space(p);
    if (p->s != p->end) return parse_fail(p, "header: unexpected text after the dict");
    return 1;
}

/* ---- reading ---------------------------------------------------------------------------- */

static uint32_t le_u16(const unsigned char *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8;
}

static uint32_t le_u32(const unsigned char *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* Arrays from this many bytes on are mapped by pf_npy_map (smaller ones are read: a mapping
 * costs whole pages and a system call or two). */
#define NPY_MAP_MIN (1u << 20)

/* Reads a whole file (map: maps the data of a large one instead, pf_npy_map); both reading and
 * checking happen here so a fails cleanly on any path. */
static pf_status npy_read_file(FILE *f, const char *path, pf_array *a, int map, char *errmsg,
                               size_t errlen) {
    unsigned char pre[NPY_PREFIX_V2];
    size_t got = fread(pre, 1, NPY_PREFIX_V1, f);
    if (ferror(f)) return pf_io_fail(PF_EIO, errmsg, errlen, path, "read failed: %s", strerror(errno));
    if (got < NPY_MAGIC_LEN || memcmp(pre, NPY_MAGIC, NPY_MAGIC_LEN) != 0)
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, path,
                    "not a .npy file (the magic string \\x93NUMPY is missing)");
    if (got < NPY_PREFIX_V1) return pf_io_fail(PF_EFORMAT, errmsg, errlen, path, "truncated header");
    int major = pre[6], minor = pre[7];
    if (major < 1 || major > 3 || minor != 0)
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, path,
                    ".npy format version %d.%d is not supported (1.0, 2.0, 3.0 are)", major, minor);
    uint32_t hlen;
    long data_off;
    if (major == 1) {
        hlen = le_u16(pre + 8);
        data_off = NPY_PREFIX_V1 + (long)hlen;
    } else {
        if (fread(pre + NPY_PREFIX_V1, 1, 2, f) != 2)
            return pf_io_fail(PF_EFORMAT, errmsg, errlen, path, "truncated header");
        hlen = le_u32(pre + 8);
        if (hlen > NPY_MAX_HEADER)
            return pf_io_fail(PF_EFORMAT, errmsg, errlen, path,
                        "header length %lu is implausibly large (limit %u bytes)",
                        (unsigned long)hlen, NPY_MAX_HEADER);
        data_off = NPY_PREFIX_V2 + (long)hlen;
    }

    char *text = malloc(hlen ? hlen : 1);
    if (!text) return pf_io_fail(PF_ENOMEM, errmsg, errlen, path, "out of memory reading the header");
    if (fread(text, 1, hlen, f) != hlen) {
        free(text);
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, path, "truncated header");
    }
    parser p = {.s = text, .end = text + hlen, .err = {0}};
    pf_dtype dtype = PF_F32;
    int64_t shape[PF_NPY_MAX_DIMS] = {0};
    int ndim = 0;
    int ok = parse_header(&p, &dtype, shape, &ndim);
    free(text);
    if (!ok) return pf_io_fail(PF_EFORMAT, errmsg, errlen, path, "%s", p.err);

    size_t esize = dtype_size(dtype);
    int64_t count = shape_count(shape, ndim, esize);
    if (count < 0)
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, path,
                    "shape is too large (the element count overflows)");
    size_t bytes = (size_t)count * esize;

    /* Compare with the file's size before allocating, so a corrupt shape cannot make us
     * allocate gigabytes only to find the data missing. */
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode)) {
        uint64_t have = st.st_size > data_off ? (uint64_t)(st.st_size - data_off) : 0;
        if (have < bytes)
            return pf_io_fail(PF_EFORMAT, errmsg, errlen, path,
                        "truncated data: the shape needs %zu bytes, the file has %llu", bytes,
                        (unsigned long long)have);
        if (have > bytes)
            return pf_io_fail(PF_EFORMAT, errmsg, errlen, path,
                        "%llu bytes of unexpected data after the array (the header says %zu)",
                        (unsigned long long)(have - bytes), bytes);
    }

    /* A mapping instead of a copy: private (writes through a.data stay in this process),
     * little-endian data aligned for its type; populated at once where the system can. */
    if (map && bytes >= NPY_MAP_MIN && host_is_little_endian() && data_off % (long)esize == 0) {
        size_t len = (size_t)data_off + bytes;
        int flags = MAP_PRIVATE;
#ifdef MAP_POPULATE
        flags |= MAP_POPULATE;
#endif
        void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, fileno(f), 0);
        if (base != MAP_FAILED) {
            a->dtype = dtype;
            a->ndim = ndim;
            memset(a->shape, 0, sizeof(a->shape));
            for (int i = 0; i < ndim; i++) a->shape[i] = shape[i];
            a->data = (char *)base + data_off;
            a->map_ = base;
            a->map_len_ = len;
            return PF_OK;
        }
        /* no mapping (a file system without mmap): read it as pf_npy_read does */
    }

    void *data = pf_alloc(bytes ? bytes : 1, 1);
    if (!data) return pf_io_fail(PF_ENOMEM, errmsg, errlen, path, "out of memory (%zu bytes)", bytes);
    got = fread(data, 1, bytes, f);
    if (got != bytes) {
        int eio = ferror(f);
        int e = errno;
        pf_free(data);
        if (eio) return pf_io_fail(PF_EIO, errmsg, errlen, path, "read failed: %s", strerror(e));
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, path,
                    "truncated data: the shape needs %zu bytes, the file has %zu", bytes, got);
    }
    if (fgetc(f) != EOF) { /* only reached for non-regular files (pipes) */
        pf_free(data);
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, path, "unexpected data after the array");
    }
    if (!host_is_little_endian()) swap_bytes(data, (size_t)count, esize);

    a->dtype = dtype;
    a->ndim = ndim;
    memset(a->shape, 0, sizeof(a->shape));
    for (int i = 0; i < ndim; i++) a->shape[i] = shape[i];
    a->data = data;
    return PF_OK;
}

static pf_status npy_open_read(const char *path, pf_array *a, int map, char *errmsg,
                               size_t errlen) {
    if (errmsg && errlen > 0) errmsg[0] = '\0';
    if (a) array_clear(a);
    if (!path || !a) return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "NULL argument");
    int64_t size;
    pf_status st;
    int fd = pf_io_open_regular(path, &size, &st, errmsg, errlen);
    if (fd < 0) return st;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return pf_io_fail(PF_EIO, errmsg, errlen, path, "cannot open: %s", strerror(errno));
    }
    st = npy_read_file(f, path, a, map, errmsg, errlen);
    fclose(f);
    return st;
}

pf_status pf_npy_read(const char *path, pf_array *a, char *errmsg, size_t errlen) {
    return npy_open_read(path, a, 0, errmsg, errlen);
}

pf_status pf_npy_map(const char *path, pf_array *a, char *errmsg, size_t errlen) {
    return npy_open_read(path, a, 1, errmsg, errlen);
}

/* ---- writing ---------------------------------------------------------------------------- */

/* The version 1.0 header for a: dict, spaces, '\n', so 10 + length is a multiple of 64.
 * Returns the header length (without the 10-byte prefix) or 0 if it does not fit. */
static size_t make_header(char *buf, size_t cap, const pf_array *a) {
    char shape[PF_NPY_MAX_DIMS * 24 + 4];
    size_t n = 0;
    shape[n++] = '(';
    for (int i = 0; i < a->ndim; i++) {
        n += (size_t)snprintf(shape + n, sizeof(shape) - n, i ? ", %lld" : "%lld",
                              (long long)a->shape[i]);
    }
    if (a->ndim == 1) shape[n++] = ',';
    shape[n++] = ')';
    shape[n] = '\0';
    int len = snprintf(buf, cap, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                       dtype_descr(a->dtype), shape);
    if (len < 0) return 0;
    size_t total = ((size_t)len + 1 + NPY_PREFIX_V1 + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
    size_t hlen = total - NPY_PREFIX_V1;
    if (hlen + 1 > cap || hlen > 65535) return 0;
    memset(buf + len, ' ', hlen - (size_t)len - 1);
    buf[hlen - 1] = '\n';
    return hlen;
}


/* The data in little-endian order: as is on a little-endian host, else swapped in pieces. */
static int write_data(int fd, const pf_array *a, size_t count) {
    size_t esize = dtype_size(a->dtype);
    if (host_is_little_endian()) return pf_io_write_all(fd, a->data, count * esize);
    unsigned char buf[1 << 16];
    const unsigned char *src = a->data;
    size_t per = sizeof(buf) / esize;
    for (size_t i = 0; i < count; i += per) {
        size_t k = count - i < per ? count - i : per;
        memcpy(buf, src + i * esize, k * esize);
        swap_bytes(buf, k, esize);
        int e = pf_io_write_all(fd, buf, k * esize);
        if (e) return e;
    }
    return 0;
}


pf_status pf_npy_write(const char *path, const pf_array *a, char *errmsg, size_t errlen) {
    if (errmsg && errlen > 0) errmsg[0] = '\0';
    if (!path || !a || !path[0]) return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "NULL argument");
    if (a->ndim < 0 || a->ndim > PF_NPY_MAX_DIMS)
        return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "cannot write an array of %d dimensions",
                    a->ndim);
    size_t esize = dtype_size(a->dtype);
    if (!esize) return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "unknown dtype %d", (int)a->dtype);
    int64_t count = shape_count(a->shape, a->ndim, esize);
    if (count < 0)
        return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "invalid shape (negative or too large)");
    if (count > 0 && !a->data) return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "array has no data");

    char header[1024];
    size_t hlen = make_header(header, sizeof(header), a);
    if (!hlen) return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "header does not fit");
    unsigned char pre[NPY_PREFIX_V1] = {0x93,
                                        'N',
                                        'U',
                                        'M',
                                        'P',
                                        'Y',
                                        1,
                                        0,
                                        (unsigned char)(hlen & 0xff),
                                        (unsigned char)(hlen >> 8)};

    pf_io_atomic w;
    pf_status st = pf_io_atomic_begin(&w, path, errmsg, errlen);
    if (st != PF_OK) return st;
    int e = pf_io_write_all(w.fd, pre, sizeof(pre));
    if (!e) e = pf_io_write_all(w.fd, header, hlen);
    if (!e) e = write_data(w.fd, a, (size_t)count);
    return pf_io_atomic_finish(&w, path, e, errmsg, errlen);
}
