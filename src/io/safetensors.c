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
        if (c < 0x20) {
            free(s);
            return jfail(j, "control character in a string");
        }
        if (c != '\\') {
            s[n++] = (char)c;
            continue;
        }
        char e = *j->p++;
        switch (e) {
        case '"':
            s[n++] = '"';
            break;
        case '\\':
            s[n++] = '\\';
            break;
        case '/':
            s[n++] = '/';
            break;
        case 'b':
            s[n++] = '\b';
            break;
        case 'f':
            s[n++] = '\f';
            break;
        case 'n':
            s[n++] = '\n';
            break;
        case 'r':
            s[n++] = '\r';
            break;
        case 't':
            s[n++] = '\t';
            break;
        case 'u': {
            unsigned u, lo;
            if (!read_hex4(j, &u)) {
                free(s);
                return 0;
            }
            if (u >= 0xD800 && u < 0xDC00) {
                /* a surrogate pair: \uD8xx\uDCxx */
                if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u') {
                    free(s);
                    return jfail(j, "lone surrogate");
                }
                j->p += 2;
                if (!read_hex4(j, &lo) || lo < 0xDC00 || lo >= 0xE000) {
                    free(s);
                    return jfail(j, "bad surrogate pair");
                }
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            } else if (u >= 0xDC00 && u < 0xE000) {
                free(s);
                return jfail(j, "lone surrogate");
            }
            if (u == 0) {
                free(s);
                return jfail(j, "\\u0000 in a string");
            }
            n += put_utf8(s + n, u);
            break;
        }
        default:
            free(s);
            return jfail(j, "bad escape");
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
            if (ok && strcmp(dt, "F32") != 0) {
                snprintf(j->why, sizeof(j->why),
                         "tensor '%.60s' has dtype %.16s; only F32 is "
                         "supported",
                         t->name, dt);
                ok = 0;
            }
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
            snprintf(j->why, sizeof(j->why), "tensor '%.60s': unexpected or repeated key '%.40s'",
                     t->name, key);
            ok = 0;
        }
        free(key);
        if (!ok) return 0;
    } while (jpeek(j, ','));
    if (!jexpect(j, '}')) return 0;
    if (!have_dtype || !have_shape || !have_off) {
        snprintf(j->why, sizeof(j->why), "tensor '%.60s' lacks dtype, shape or data_offsets",
                 t->name);
        return 0;
    }
    return 1;
}

static int cmp_begin(const void *a, const void *b) {
    const int64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

pf_status pf_st_read(const char *path, pf_st_file *f, char *errmsg, size_t errlen) {
    if (errmsg && errlen > 0) errmsg[0] = '\0';
    if (!f) return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "NULL argument");
    memset(f, 0, sizeof(*f));
    if (!path) return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "NULL argument");
    if (!little_endian()) return pf_io_fail(PF_ENOTSUP, errmsg, errlen, path, "big-endian host");

    int64_t fsize;
    pf_status st;
    int fd = pf_io_open_regular(path, &fsize, &st, errmsg, errlen);
    if (fd < 0) return st;
    if ((uint64_t)fsize > SIZE_MAX / 2) {
        close(fd);
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, path, "too large (%lld bytes)",
                          (long long)fsize);
    }
    size_t size = (size_t)fsize;
    /* the header's length first: a file that is not a safetensors file is refused before its
     * bytes are read (a multi-gigabyte file would otherwise be loaded whole to find out) */
    unsigned char len8[8];
    if (size >= 8) {
        st = pf_io_read_all(fd, len8, 8, path, errmsg, errlen);
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = hl << 8 | len8[i];
        if (st == PF_OK && (hl > ST_MAX_HEADER || hl > size - 8 || hl < 2))
            st = pf_io_fail(PF_EFORMAT, errmsg, errlen, path,
                            "not a safetensors file or truncated: header length %llu, file %zu "
                            "bytes",
                            (unsigned long long)hl, size);
        if (st == PF_OK && lseek(fd, 0, SEEK_SET) != 0)
            st = pf_io_fail(PF_EIO, errmsg, errlen, path, "cannot read: %s", strerror(errno));
        if (st != PF_OK) {
            close(fd);
            return st;
        }
    }
    unsigned char *buf = malloc(size ? size : 1);
    if (!buf) {
        close(fd);
        return pf_io_fail(PF_ENOMEM, errmsg, errlen, path, "out of memory (%zu bytes)", size);
    }
    st = pf_io_read_all(fd, buf, size, path, errmsg, errlen);
    close(fd);
    if (st != PF_OK) {
        free(buf);
        return st;
    }
    f->buf = buf;
    f->size = size;

    if (size < 8) {
        pf_st_free(f);
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, path,
                    "not a safetensors file: %zu bytes, shorter than the 8-byte header length",
                    size);
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    if (hlen > ST_MAX_HEADER || hlen > size - 8 || hlen < 2) {
        pf_st_free(f);
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, path,
                    "not a safetensors file or truncated: header length %llu, file %zu bytes",
                    (unsigned long long)hlen, size);
    }
    const char *h = (const char *)buf + 8;
    size_t data_off = 8 + (size_t)hlen, data_size = size - data_off;

    jreader j = {.start = h, .p = h, .end = h + hlen, .why = ""};
    int cap = 16;
    f->tensors = calloc((size_t)cap, sizeof(pf_st_tensor));
    int64_t(*range)[2] = malloc(sizeof(int64_t[2]) * (size_t)cap);
    int ok = f->tensors && range;
    if (!ok) snprintf(j.why, sizeof(j.why), "out of memory");
    ok = ok && jexpect(&j, '{');
    if (ok && !jpeek(&j, '}')) {
        do {
            char *name = NULL;
            ok = jstring(&j, &name) && jexpect(&j, ':');
            if (!ok) {
                free(name);
                break;
            }
            if (strcmp(name, "__metadata__") == 0) {
                free(name);
                ok = parse_meta(&j, f);
                if (!ok) break;
                continue;
            }
            if (f->n == cap) {
                pf_st_tensor *nt = realloc(f->tensors, sizeof(pf_st_tensor) * (size_t)cap * 2);
                int64_t(*nr)[2] = realloc(range, sizeof(int64_t[2]) * (size_t)cap * 2);
                if (nt) f->tensors = nt;
                if (nr) range = nr;
                if (!nt || !nr) {
                    free(name);
                    snprintf(j.why, sizeof(j.why), "out of memory");
                    ok = 0;
                    break;
                }
                cap *= 2;
            }
            pf_st_tensor *t = &f->tensors[f->n];
            memset(t, 0, sizeof(*t));
            t->name = name;
            f->n++;
            if (pf_st_find(f, name) != t) {
                snprintf(j.why, sizeof(j.why), "tensor '%.60s' appears twice", name);
                ok = 0;
                break;
            }
            ok = parse_tensor(&j, t, &range[f->n - 1][0], &range[f->n - 1][1]);
            if (!ok) break;
            /* element count, at most 2^61 so that count * 4 cannot wrap (a shape
             * [2^31, 2^31] would make it 2^64, 0 in size_t, and match an empty range) */
            size_t count = 1;
            for (int d = 0; d < t->ndim && ok; d++) {
                if (t->shape[d] != 0 && count > ((size_t)1 << 61) / (size_t)t->shape[d]) {
                    snprintf(j.why, sizeof(j.why), "tensor '%.60s': shape too large", name);
                    ok = 0;
                }
                count *= (size_t)t->shape[d];
            }
            int64_t b = range[f->n - 1][0], e = range[f->n - 1][1];
            if (ok && (b > e || (uint64_t)e > data_size || (uint64_t)(e - b) != count * 4)) {
                snprintf(j.why, sizeof(j.why),
                         "tensor '%.60s': data_offsets [%lld, %lld] do not hold %zu float32 "
                         "values within the %zu data bytes",
                         name, (long long)b, (long long)e, count, data_size);
                ok = 0;
            }
            t->count = count;
            t->data = buf + data_off + b;
        } while (ok && jpeek(&j, ','));
        ok = ok && jexpect(&j, '}');
    }
    jws(&j);
    if (ok && j.p != j.end) ok = jfail(&j, "bytes after the header object");
    /* the tensors must tile [0, data_size) exactly */
    if (ok) {
        qsort(range, (size_t)f->n, sizeof(int64_t[2]), cmp_begin);
        int64_t at = 0;
        for (int i = 0; i < f->n && ok; i++) {
            if (range[i][0] != at) {
                snprintf(j.why, sizeof(j.why), "tensor data %s at byte %lld (expected %lld)",
                         range[i][0] > at ? "has a gap" : "overlaps", (long long)range[i][0],
                         (long long)at);
                ok = 0;
            }
            at = range[i][1];
        }
        if (ok && (uint64_t)at != data_size) {
            snprintf(j.why, sizeof(j.why),
                     "%s: the header describes %lld data bytes, the file holds %zu",
                     (uint64_t)at > data_size ? "truncated" : "extra bytes after the tensors",
                     (long long)at, data_size);
            ok = 0;
        }
    }
    free(range);
    if (!ok) {
        pf_st_free(f);
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, path, "%s", j.why[0] ? j.why : "bad header");
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



pf_status pf_st_write(const char *path, const pf_st_entry *t, int n, const char *const *meta,
                      char *errmsg, size_t errlen) {
    if (errmsg && errlen > 0) errmsg[0] = '\0';
    if (!path || !path[0] || (n > 0 && !t) || n < 0)
        return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "NULL argument");
    if (!little_endian()) return pf_io_fail(PF_ENOTSUP, errmsg, errlen, path, "big-endian host");
    size_t *counts = malloc(sizeof(size_t) * (size_t)(n > 0 ? n : 1));
    if (!counts) return pf_io_fail(PF_ENOMEM, errmsg, errlen, path, "out of memory");
    for (int i = 0; i < n; i++) {
        if (!t[i].name || !t[i].name[0] || strcmp(t[i].name, "__metadata__") == 0 ||
            t[i].ndim < 0 || t[i].ndim > PF_ST_MAX_DIMS) {
            free(counts);
            return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "tensor %d: bad name or rank", i);
        }
        size_t c = 1;
        for (int d = 0; d < t[i].ndim; d++) {
            if (t[i].shape[d] < 0 ||
                (t[i].shape[d] > 0 && c > ((size_t)1 << 60) / (size_t)t[i].shape[d])) {
                free(counts);
                return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "tensor '%s': bad shape", t[i].name);
            }
            c *= (size_t)t[i].shape[d];
        }
        if (c > 0 && !t[i].data) {
            free(counts);
            return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "tensor '%s' has no data", t[i].name);
        }
        for (int k = 0; k < i; k++) {
            if (strcmp(t[k].name, t[i].name) == 0) {
                free(counts);
                return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "tensor '%s' twice", t[i].name);
            }
        }
        counts[i] = c;
    }

    /* the header */
    sbuf b = {0};
    sb_put(&b, "{", 1);
    int first = 1;
    if (meta && meta[0]) {
        sb_json_string(&b, "__metadata__");
        sb_put(&b, ":{", 2);
        for (int i = 0; meta[i]; i += 2) {
            if (!meta[i + 1]) {
                free(counts);
                free(b.s);
                return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "metadata key '%s' has no value",
                            meta[i]);
            }
            for (int k = 0; k < i; k += 2) {
                if (strcmp(meta[k], meta[i]) == 0) { /* pf_st_read refuses such a file */
                    free(counts);
                    free(b.s);
                    return pf_io_fail(PF_EINVAL, errmsg, errlen, path,
                                      "metadata key '%s' given twice", meta[i]);
                }
            }
            if (i) sb_put(&b, ",", 1);
            sb_json_string(&b, meta[i]);
            sb_put(&b, ":", 1);
            sb_json_string(&b, meta[i + 1]);
        }
        sb_put(&b, "}", 1);
        first = 0;
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        if (!first) sb_put(&b, ",", 1);
        first = 0;
        sb_json_string(&b, t[i].name);
        const char *mid = ":{\"dtype\":\"F32\",\"shape\":[";
        sb_put(&b, mid, strlen(mid));
        for (int d = 0; d < t[i].ndim; d++)
            sb_printf(&b, d ? ",%lld" : "%lld", (long long)t[i].shape[d]);
        uint64_t e = off + (uint64_t)counts[i] * 4;
        sb_printf(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                  (unsigned long long)e);
        off = e;
    }
    sb_put(&b, "}", 1);
    while (!b.oom && b.n % 8 != 0) sb_put(&b, " ", 1);
    if (b.oom) {
        free(counts);
        free(b.s);
        return pf_io_fail(PF_ENOMEM, errmsg, errlen, path, "out of memory");
    }
    if (b.n > ST_MAX_HEADER) {
        free(counts);
        free(b.s);
        return pf_io_fail(PF_EINVAL, errmsg, errlen, path,
                          "a header of %zu bytes is more than readers accept (%u)", b.n,
                          ST_MAX_HEADER);
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)b.n >> (8 * i));

    pf_io_atomic w;
    pf_status st = pf_io_atomic_begin(&w, path, errmsg, errlen);
    if (st != PF_OK) {
        free(counts);
        free(b.s);
        return st;
    }
    int e = pf_io_write_all(w.fd, len8, 8);
    if (!e) e = pf_io_write_all(w.fd, b.s, b.n);
    for (int i = 0; i < n && !e; i++) e = pf_io_write_all(w.fd, t[i].data, counts[i] * 4);
    free(counts);
    free(b.s);
    return pf_io_atomic_finish(&w, path, e, errmsg, errlen);
}
