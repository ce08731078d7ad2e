/* safetensors.c: the safetensors format (huggingface/safetensors, docs "Format"), F32 tensors.
 *
 *   8 bytes    N, the header length, unsigned little-endian
 *   N bytes    UTF-8 JSON: {"__metadata__": {"k": "v", ...},
 *                           "name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...}
 *   the rest   the tensors' bytes; [b, e) relative to the end of the header
 *
 * The reader is strict where a lenient one would hide damage: the tensors must tile the data
 * exactly (no gap, no overlap, nothing after), each e - b must equal 4 * prod(shape), names are
 * unique, metadata values are strings. The writer pads the header with spaces to a multiple of
 * 8 bytes (as the reference implementation does), so every tensor starts 4-byte aligned, and
 * writes to a temporary file that is flushed and renamed over the destination. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io/io.h"
#include "io/safetensors.h"

#define ST_MAX_HEADER (100u << 20) /* the reference implementation's limit */
#define ST_MAX_DEPTH 4

static int little_endian(void) {
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* ---------------------------------------------------------------------------------------------
 * A small JSON reader for the header: objects, arrays, strings, non-negative integers.
 * ------------------------------------------------------------------------------------------ */

typedef struct jreader {
    const char *start, *p, *end;
    char why[160]; /* the first error */
} jreader;

static int jfail(jreader *j, const char *what) {
    if (!j->why[0]) {
        snprintf(j->why, sizeof(j->why), "bad header JSON at byte %ld: %s", (long)(j->p - j->start),
                 what);
    }
    return 0;
}

/* Replaces the error with one the grammar does not name (a fault of the file's content, or
 * out of memory), without the position; returns 0. */
static int jsay(jreader *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int jsay(jreader *j, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->why, sizeof(j->why), fmt, ap);
    va_end(ap);
    return 0;
}

static void jws(jreader *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int jexpect(jreader *j, char c) {
    jws(j);
    if (j->p >= j->end || *j->p != c) {
        char msg[32];
        snprintf(msg, sizeof(msg), "expected '%c'", c);
        return jfail(j, msg);
    }
    j->p++;
    return 1;
}

/* 1 and advances if the next non-space byte is c. */
static int jpeek(jreader *j, char c) {
    jws(j);
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return 1;
    }
    return 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex4(jreader *j, unsigned *u) {
    if (j->end - j->p < 4) return jfail(j, "short \\u escape");
    *u = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(j->p[i]);
        if (h < 0) return jfail(j, "bad \\u escape");
        *u = *u * 16 + (unsigned)h;
    }
    j->p += 4;
    return 1;
}

/* Appends code point u as UTF-8. */
static size_t put_utf8(char *o, unsigned u) {
    if (u < 0x80) {
        o[0] = (char)u;
        return 1;
    }
    if (u < 0x800) {
        o[0] = (char)(0xC0 | (u >> 6));
        o[1] = (char)(0x80 | (u & 0x3F));
        return 2;
    }
    if (u < 0x10000) {
        o[0] = (char)(0xE0 | (u >> 12));
        o[1] = (char)(0x80 | ((u >> 6) & 0x3F));
        o[2] = (char)(0x80 | (u & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (u >> 18));
    o[1] = (char)(0x80 | ((u >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((u >> 6) & 0x3F));
    o[3] = (char)(0x80 | (u & 0x3F));
    return 4;
}

/* After "\u": the code point of \uXXXX, or of a surrogate pair \uD8xx\uDCxx; never 0. */
static int junicode(jreader *j, unsigned *out) {
    unsigned u, lo;
    if (!read_hex4(j, &u)) return 0;
    if (u >= 0xD800 && u < 0xDC00) {
        if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u')
            return jfail(j, "lone surrogate");
        j->p += 2;
        if (!read_hex4(j, &lo) || lo < 0xDC00 || lo >= 0xE000)
            return jfail(j, "bad surrogate pair");
        u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
    } else if (u >= 0xDC00 && u < 0xE000) {
        return jfail(j, "lone surrogate");
    }
    if (u == 0) return jfail(j, "\\u0000 in a string");
    *out = u;
    return 1;
}

/* After a backslash: the escape decoded, its UTF-8 bytes appended to s at *n. */
static int jescape(jreader *j, char *s, size_t *n) {
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    char e = *j->p++;
    const char *k = e ? strchr(from, e) : NULL; /* strchr would find the terminating 0 */
    if (k) {
        s[(*n)++] = to[k - from];
        return 1;
    }
    unsigned u;
    if (e != 'u') return jfail(j, "bad escape");
    if (!junicode(j, &u)) return 0;
    *n += put_utf8(s + *n, u);
    return 1;
}

/* A string into a new allocation (*out), escapes decoded. */
static int jstring(jreader *j, char **out) {
    *out = NULL;
    if (!jexpect(j, '"')) return 0;
    /* the decoded string is never longer than the encoded one */
    const char *q = j->p;
    while (q < j->end && *q != '"') q += (*q == '\\' && q + 1 < j->end) ? 2 : 1;
    if (q >= j->end) return jfail(j, "unterminated string");
    char *s = malloc((size_t)(q - j->p) + 1);
    if (!s) return jfail(j, "out of memory");
    size_t n = 0;
    while (*j->p != '"') {
        unsigned char c = (unsigned char)*j->p++;
        int ok = 1;
        if (c < 0x20)
            ok = jfail(j, "control character in a string");
        else if (c == '\\')
            ok = jescape(j, s, &n);
        else
            s[n++] = (char)c;
        if (!ok) {
            free(s);
            return 0;
        }
    }
    j->p++; /* the closing quote */
    s[n] = '\0';
    *out = s;
    return 1;
}

/* A non-negative integer below 2^53 (no sign, fraction or exponent). */
static int jint(jreader *j, int64_t *out) {
    jws(j);
    const char *q = j->p;
    int64_t v = 0;
    while (q < j->end && *q >= '0' && *q <= '9') {
        if (v > (INT64_C(1) << 53) / 10) return jfail(j, "integer too large");
        v = v * 10 + (*q - '0');
        q++;
    }
    if (q == j->p) return jfail(j, "expected a non-negative integer");
    if (q < j->end && (*q == '.' || *q == 'e' || *q == 'E')) return jfail(j, "not an integer");
    if (q - j->p > 1 && *j->p == '0') return jfail(j, "leading zero");
    j->p = q;
    *out = v;
    return 1;
}

/* An array of at most cap integers; *n receives the count. */
static int jint_array(jreader *j, int64_t *v, int cap, int *n) {
    *n = 0;
    if (!jexpect(j, '[')) return 0;
    if (jpeek(j, ']')) return 1;
    do {
        if (*n >= cap) return jfail(j, "too many numbers in an array");
        if (!jint(j, &v[*n])) return 0;
        (*n)++;
    } while (jpeek(j, ','));
    return jexpect(j, ']');
}

/* ---------------------------------------------------------------------------------------------
 * Reading
 * ------------------------------------------------------------------------------------------ */

void pf_st_free(pf_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) free(f->tensors[i].name);
    free(f->tensors);
    if (f->meta) {
        for (int i = 0; i < 2 * f->nmeta; i++) free(f->meta[i]);
        free(f->meta);
    }
    free(f->buf);
    memset(f, 0, sizeof(*f));
}

const pf_st_tensor *pf_st_find(const pf_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    for (int i = 0; i < f->n; i++) {
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    }
    return NULL;
}

const char *pf_st_meta(const pf_st_file *f, const char *key) {
    if (!f || !key || !f->meta) return NULL;
    for (int i = 0; i < f->nmeta; i++) {
        if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
    }
    return NULL;
}

/* Parses the "__metadata__" object into f->meta. */
static int parse_meta(jreader *j, pf_st_file *f) {
    if (f->meta) return jfail(j, "__metadata__ given twice");
    int cap = 8;
    f->meta = calloc((size_t)(2 * cap + 1), sizeof(char *));
    if (!f->meta) return jfail(j, "out of memory");
    if (!jexpect(j, '{')) return 0;
    if (jpeek(j, '}')) return 1;
    do {
        if (f->nmeta == cap) {
            char **m = realloc(f->meta, sizeof(char *) * (size_t)(4 * cap + 1));
            if (!m) return jfail(j, "out of memory");
            f->meta = m;
            cap *= 2;
        }
        char **kv = f->meta + 2 * f->nmeta;
        kv[0] = kv[1] = kv[2] = NULL;
        if (!jstring(j, &kv[0])) return 0;
        f->nmeta++; /* counted now, so pf_st_free frees the key even if the value fails */
        if (!jexpect(j, ':')) return 0;
        jws(j);
        if (j->p >= j->end || *j->p != '"') return jfail(j, "metadata values must be strings");
        if (!jstring(j, &kv[1])) return 0;
        kv[2] = NULL;
        for (int i = 0; i < f->nmeta - 1; i++) {
            if (strcmp(f->meta[2 * i], kv[0]) == 0) return jfail(j, "duplicate metadata key");
        }
    } while (jpeek(j, ','));
    return jexpect(j, '}');
}

/* Parses one tensor's {"dtype", "shape", "data_offsets"} into t (name already set). */
static int parse_tensor(jreader *j, pf_st_tensor *t, int64_t *begin, int64_t *end) {
    int have_dtype = 0, have_shape = 0, have_off = 0;
    if (!jexpect(j, '{')) return 0;
    if (jpeek(j, '}')) return jfail(j, "empty tensor entry");
    do {
        char *key = NULL;
        if (!jstring(j, &key)) return 0;
        int ok = jexpect(j, ':');
        if (ok && strcmp(key, "dtype") == 0 && !have_dtype) {
            char *dt = NULL;
            ok = jstring(j, &dt);
            if (ok && strcmp(dt, "F32") != 0)
                ok = jsay(j, "tensor '%.60s' has dtype %.16s; only F32 is supported", t->name, dt);
            free(dt);
            have_dtype = 1;
        } else if (ok && strcmp(key, "shape") == 0 && !have_shape) {
            ok = jint_array(j, t->shape, PF_ST_MAX_DIMS, &t->ndim);
            have_shape = 1;
        } else if (ok && strcmp(key, "data_offsets") == 0 && !have_off) {
            int64_t o[2];
            int n = 0;
            ok = jint_array(j, o, 2, &n);
            if (ok && n != 2) ok = jfail(j, "data_offsets needs two numbers");
            *begin = o[0];
            *end = o[1];
            have_off = 1;
        } else if (ok) {
            ok = jsay(j, "tensor '%.60s': unexpected or repeated key '%.40s'", t->name, key);
        }
        free(key);
        if (!ok) return 0;
    } while (jpeek(j, ','));
    if (!jexpect(j, '}')) return 0;
    if (!have_dtype || !have_shape || !have_off)
        return jsay(j, "tensor '%.60s' lacks dtype, shape or data_offsets", t->name);
    return 1;
}

static int cmp_begin(const void *a, const void *b) {
    const int64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

/* The header's length from the file's first 8 bytes, read from fd (at its start; size: the
 * file's) into len8 and checked against the file's size before anything else is read: a file
 * that is not a safetensors file is refused before its bytes are (a multi-gigabyte file would
 * otherwise be loaded whole to find out). */
static pf_status read_header_len(int fd, size_t size, unsigned char len8[8], size_t *hlen,
                                 const char *path, char *errmsg, size_t errlen) {
    if (size < 8)
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, path,
                          "not a safetensors file: %zu bytes, shorter than the 8-byte header "
                          "length",
                          size);
    pf_status st = pf_io_read_all(fd, len8, 8, path, errmsg, errlen);
    if (st != PF_OK) return st;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | len8[i];
    if (hl > ST_MAX_HEADER || hl > size - 8 || hl < 2)
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, path,
                          "not a safetensors file or truncated: header length %llu, file %zu "
                          "bytes",
                          (unsigned long long)hl, size);
    *hlen = (size_t)hl;
    return PF_OK;
}

/* The whole file into f->buf and f->size, and its header's length into *hlen
 * (read_header_len). The rest is read after the 8 bytes already read rather than from the
 * start again, so the length checked is the one in f->buf. */
static pf_status read_file(const char *path, pf_st_file *f, size_t *hlen, char *errmsg,
                           size_t errlen) {
    int64_t fsize;
    pf_status st;
    int fd = pf_io_open_regular(path, &fsize, &st, errmsg, errlen);
    if (fd < 0) return st;
    size_t size = (size_t)fsize;
    unsigned char len8[8], *buf = NULL;
    if ((uint64_t)fsize > SIZE_MAX / 2)
        st = pf_io_fail(PF_EFORMAT, errmsg, errlen, path, "too large (%lld bytes)",
                        (long long)fsize);
    else
        st = read_header_len(fd, size, len8, hlen, path, errmsg, errlen);
    if (st == PF_OK && !(buf = malloc(size)))
        st = pf_io_fail(PF_ENOMEM, errmsg, errlen, path, "out of memory (%zu bytes)", size);
    if (st == PF_OK) {
        memcpy(buf, len8, 8);
        st = pf_io_read_all(fd, buf + 8, size - 8, path, errmsg, errlen);
    }
    close(fd);
    if (st != PF_OK) {
        free(buf);
        return st;
    }
    f->buf = buf;
    f->size = size;
    return PF_OK;
}

/* The header being parsed: the reader over its JSON, the file it fills, and range[i], the
 * [begin, end) of f->tensors[i] within the data (kept apart for check_tiling's sort). */
typedef struct st_header {
    jreader j;
    pf_st_file *f;
    int64_t (*range)[2];
    int cap;                   /* entries allocated in f->tensors and range */
    const unsigned char *data; /* the data: data_size bytes after the header */
    size_t data_size;
} st_header;

/* Room in f->tensors and range for one more tensor. */
static int grow_tables(st_header *h) {
    if (h->f->n < h->cap) return 1;
    pf_st_tensor *nt = realloc(h->f->tensors, sizeof(pf_st_tensor) * (size_t)h->cap * 2);
    int64_t(*nr)[2] = realloc(h->range, sizeof(int64_t[2]) * (size_t)h->cap * 2);
    if (nt) h->f->tensors = nt;
    if (nr) h->range = nr;
    if (!nt || !nr) return jsay(&h->j, "out of memory");
    h->cap *= 2;
    return 1;
}

/* t->count from t's shape, at most 2^61 so that count * 4 cannot wrap (a shape
 * [2^31, 2^31] would make it 2^64, 0 in size_t, and match an empty range). */
static int tensor_count(jreader *j, pf_st_tensor *t) {
    size_t count = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] != 0 && count > ((size_t)1 << 61) / (size_t)t->shape[d])
            return jsay(j, "tensor '%.60s': shape too large", t->name);
        count *= (size_t)t->shape[d];
    }
    t->count = count;
    return 1;
}

/* t->data, where t's data_offsets [b, e) lie within the data and hold its count floats. */
static int place_tensor(st_header *h, pf_st_tensor *t, int64_t b, int64_t e) {
    if (b > e || (uint64_t)e > h->data_size || (uint64_t)(e - b) != t->count * 4)
        return jsay(&h->j,
                    "tensor '%.60s': data_offsets [%lld, %lld] do not hold %zu float32 values "
                    "within the %zu data bytes",
                    t->name, (long long)b, (long long)e, t->count, h->data_size);
    t->data = h->data + b;
    return 1;
}

/* The tensor called name (which it takes): its entry parsed and checked against the data. */
static int add_tensor(st_header *h, char *name) {
    pf_st_file *f = h->f;
    if (!grow_tables(h)) {
        free(name);
        return 0;
    }
    pf_st_tensor *t = &f->tensors[f->n];
    int64_t *r = h->range[f->n];
    memset(t, 0, sizeof(*t));
    t->name = name;
    f->n++; /* counted now, so that pf_st_free frees the name whatever follows */
    if (pf_st_find(f, name) != t) return jsay(&h->j, "tensor '%.60s' appears twice", name);
    return parse_tensor(&h->j, t, &r[0], &r[1]) && tensor_count(&h->j, t) &&
           place_tensor(h, t, r[0], r[1]);
}

/* One "name": value pair of the header's object: the metadata or a tensor. */
static int parse_entry(st_header *h) {
    char *name = NULL;
    if (!jstring(&h->j, &name) || !jexpect(&h->j, ':')) {
        free(name);
        return 0;
    }
    if (strcmp(name, "__metadata__") == 0) {
        free(name);
        return parse_meta(&h->j, h->f);
    }
    return add_tensor(h, name);
}

/* The header's object, and nothing after it but spaces. */
static int parse_header(st_header *h) {
    if (!jexpect(&h->j, '{')) return 0;
    if (!jpeek(&h->j, '}')) {
        do {
            if (!parse_entry(h)) return 0;
        } while (jpeek(&h->j, ','));
        if (!jexpect(&h->j, '}')) return 0;
    }
    jws(&h->j);
    if (h->j.p != h->j.end) return jfail(&h->j, "bytes after the header object");
    return 1;
}

/* The n tensors' ranges (sorted here) tile [0, data_size) exactly: no gap, no overlap,
 * nothing after. */
static int check_tiling(jreader *j, int64_t (*range)[2], int n, size_t data_size) {
    qsort(range, (size_t)n, sizeof(int64_t[2]), cmp_begin);
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        if (range[i][0] != at)
            return jsay(j, "tensor data %s at byte %lld (expected %lld)",
                        range[i][0] > at ? "has a gap" : "overlaps", (long long)range[i][0],
                        (long long)at);
        at = range[i][1];
    }
    if ((uint64_t)at != data_size)
        return jsay(j, "%s: the header describes %lld data bytes, the file holds %zu",
                    (uint64_t)at > data_size ? "truncated" : "extra bytes after the tensors",
                    (long long)at, data_size);
    return 1;
}

pf_status pf_st_read(const char *path, pf_st_file *f, char *errmsg, size_t errlen) {
    if (errmsg && errlen > 0) errmsg[0] = '\0';
    if (!f) return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "NULL argument");
    memset(f, 0, sizeof(*f));
    if (!path) return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "NULL argument");
    if (!little_endian()) return pf_io_fail(PF_ENOTSUP, errmsg, errlen, path, "big-endian host");
    size_t hlen = 0;
    pf_status st = read_file(path, f, &hlen, errmsg, errlen);
    if (st != PF_OK) return st;

    const char *json = (const char *)f->buf + 8;
    st_header h = {.j = {.start = json, .p = json, .end = json + hlen, .why = ""},
                   .f = f,
                   .cap = 16,
                   .data = f->buf + 8 + hlen,
                   .data_size = f->size - 8 - hlen};
    f->tensors = calloc((size_t)h.cap, sizeof(pf_st_tensor));
    h.range = malloc(sizeof(int64_t[2]) * (size_t)h.cap);
    int ok = f->tensors && h.range ? 1 : jsay(&h.j, "out of memory");
    ok = ok && parse_header(&h) && check_tiling(&h.j, h.range, f->n, h.data_size);
    free(h.range);
    if (!ok) {
        pf_st_free(f);
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, path, "%s",
                          h.j.why[0] ? h.j.why : "bad header");
    }
    return PF_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------------------------ */

typedef struct sbuf {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(tmp)) {
        b->oom = 1;
        return;
    }
    sb_put(b, tmp, (size_t)n);
}

/* A JSON string literal: quotes, backslashes and control characters escaped. */
static void sb_json_string(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char e[2] = {'\\', (char)*p};
            sb_put(b, e, 2);
        } else if (*p < 0x20) {
            sb_printf(b, "\\u%04x", *p);
        } else {
            sb_put(b, (const char *)p, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* Checks the n entries (a name, not "__metadata__" and not repeated; a rank; a shape; data
 * unless empty) and puts each one's element count in counts. */
static pf_status entry_counts(const pf_st_entry *t, int n, size_t *counts, const char *path,
                              char *errmsg, size_t errlen) {
    for (int i = 0; i < n; i++) {
        if (!t[i].name || !t[i].name[0] || strcmp(t[i].name, "__metadata__") == 0 ||
            t[i].ndim < 0 || t[i].ndim > PF_ST_MAX_DIMS)
            return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "tensor %d: bad name or rank", i);
        size_t c = 1;
        for (int d = 0; d < t[i].ndim; d++) {
            if (t[i].shape[d] < 0 ||
                (t[i].shape[d] > 0 && c > ((size_t)1 << 60) / (size_t)t[i].shape[d]))
                return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "tensor '%s': bad shape",
                                  t[i].name);
            c *= (size_t)t[i].shape[d];
        }
        if (c > 0 && !t[i].data)
            return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "tensor '%s' has no data",
                              t[i].name);
        for (int k = 0; k < i; k++) {
            if (strcmp(t[k].name, t[i].name) == 0)
                return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "tensor '%s' twice", t[i].name);
        }
        counts[i] = c;
    }
    return PF_OK;
}

/* The header's "__metadata__" entry (meta: key, value, ..., NULL), if meta holds a pair. */
static pf_status put_meta(sbuf *b, const char *const *meta, const char *path, char *errmsg,
                          size_t errlen) {
    if (!meta || !meta[0]) return PF_OK;
    sb_json_string(b, "__metadata__");
    sb_put(b, ":{", 2);
    for (int i = 0; meta[i]; i += 2) {
        if (!meta[i + 1])
            return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "metadata key '%s' has no value",
                              meta[i]);
        for (int k = 0; k < i; k += 2) {
            if (strcmp(meta[k], meta[i]) == 0) /* pf_st_read refuses such a file */
                return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "metadata key '%s' given twice",
                                  meta[i]);
        }
        if (i) sb_put(b, ",", 1);
        sb_json_string(b, meta[i]);
        sb_put(b, ":", 1);
        sb_json_string(b, meta[i + 1]);
    }
    sb_put(b, "}", 1);
    return PF_OK;
}

/* The header into b: the metadata, then the n tensors (counts[i] elements each) laid end to
 * end, padded with spaces to a multiple of 8 bytes. */
static pf_status make_header(sbuf *b, const pf_st_entry *t, int n, const size_t *counts,
                             const char *const *meta, const char *path, char *errmsg,
                             size_t errlen) {
    sb_put(b, "{", 1);
    pf_status st = put_meta(b, meta, path, errmsg, errlen);
    if (st != PF_OK) return st;
    int first = !(meta && meta[0]);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        if (!first) sb_put(b, ",", 1);
        first = 0;
        sb_json_string(b, t[i].name);
        const char *mid = ":{\"dtype\":\"F32\",\"shape\":[";
        sb_put(b, mid, strlen(mid));
        for (int d = 0; d < t[i].ndim; d++)
            sb_printf(b, d ? ",%lld" : "%lld", (long long)t[i].shape[d]);
        uint64_t e = off + (uint64_t)counts[i] * 4;
        sb_printf(b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                  (unsigned long long)e);
        off = e;
    }
    sb_put(b, "}", 1);
    while (!b->oom && b->n % 8 != 0) sb_put(b, " ", 1);
    if (b->oom) return pf_io_fail(PF_ENOMEM, errmsg, errlen, path, "out of memory");
    if (b->n > ST_MAX_HEADER)
        return pf_io_fail(PF_EINVAL, errmsg, errlen, path,
                          "a header of %zu bytes is more than readers accept (%u)", b->n,
                          ST_MAX_HEADER);
    return PF_OK;
}

pf_status pf_st_write(const char *path, const pf_st_entry *t, int n, const char *const *meta,
                      char *errmsg, size_t errlen) {
    if (errmsg && errlen > 0) errmsg[0] = '\0';
    if (!path || !path[0] || (n > 0 && !t) || n < 0)
        return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "NULL argument");
    if (!little_endian()) return pf_io_fail(PF_ENOTSUP, errmsg, errlen, path, "big-endian host");
    size_t *counts = malloc(sizeof(size_t) * (size_t)(n > 0 ? n : 1));
    if (!counts) return pf_io_fail(PF_ENOMEM, errmsg, errlen, path, "out of memory");
    sbuf b = {0};
    pf_io_atomic w;
    pf_status st = entry_counts(t, n, counts, path, errmsg, errlen);
    if (st == PF_OK) st = make_header(&b, t, n, counts, meta, path, errmsg, errlen);
    if (st == PF_OK) st = pf_io_atomic_begin(&w, path, errmsg, errlen);
    if (st == PF_OK) {
        unsigned char len8[8];
        for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)b.n >> (8 * i));
        int e = pf_io_write_all(w.fd, len8, 8);
        if (!e) e = pf_io_write_all(w.fd, b.s, b.n);
        for (int i = 0; i < n && !e; i++) e = pf_io_write_all(w.fd, t[i].data, counts[i] * 4);
        st = pf_io_atomic_finish(&w, path, e, errmsg, errlen);
    }
    free(counts);
    free(b.s);
    return st;
}
