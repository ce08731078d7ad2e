/* text.c: reading corpora: any file through zlib (gzip or plain), FASTA records and plain text
 * as documents (io/text.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "io/io.h"
#include "io/text.h"

/* Inflates the gzip members in[0, n) into a growing buffer of at most PF_FILE_MAX bytes.
 * Members may follow one another (as `cat a.gz b.gz` makes, which gzip reads as one); any
 * other byte after the last member is an error (zlib's gzread would ignore it silently). */
static pf_status gunzip(const uint8_t *in, size_t n, uint8_t **out, size_t *len, const char *path,
                        char *errmsg, size_t errlen) {
    z_stream z;
    memset(&z, 0, sizeof(z));
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK)
        return pf_io_fail(PF_ENOMEM, errmsg, errlen, path, "out of memory");
    size_t cap = n < (1u << 20) ? (1u << 20) : n, used = 0, pos = 0;
    uint8_t *buf = malloc(cap);
    pf_status st = buf ? PF_OK : pf_io_fail(PF_ENOMEM, errmsg, errlen, path, "out of memory");
    while (st == PF_OK) {
        if (used == cap) {
            if (cap >= PF_FILE_MAX) {
                st = pf_io_fail(PF_EFORMAT, errmsg, errlen, path,
                                "inflates to more than %llu bytes, the limit for a corpus",
                                (unsigned long long)PF_FILE_MAX);
                break;
            }
            size_t ncap = cap * 2 > PF_FILE_MAX ? PF_FILE_MAX : cap * 2;
            uint8_t *nb = realloc(buf, ncap);
            if (!nb) {
                st = pf_io_fail(PF_ENOMEM, errmsg, errlen, path, "out of memory");
                break;
            }
            buf = nb;
            cap = ncap;
        }
        size_t in_now = n - pos > (1u << 30) ? (1u << 30) : n - pos;
        size_t out_now = cap - used > (1u << 30) ? (1u << 30) : cap - used;
        z.next_in = (Bytef *)(uintptr_t)(in + pos);
        z.avail_in = (uInt)in_now;
        z.next_out = buf + used;
        z.avail_out = (uInt)out_now;
        int r = inflate(&z, Z_NO_FLUSH);
        pos += in_now - z.avail_in;
        used += out_now - z.avail_out;
        if (r == Z_STREAM_END) {
            if (pos == n) break;
            if (n - pos >= 2 && in[pos] == 0x1f && in[pos + 1] == 0x8b) {
                inflateReset(&z); /* the next member */
                continue;
            }
            st = pf_io_fail(PF_EFORMAT, errmsg, errlen, path,
                            "%zu bytes after the end of the gzip data (at byte %zu) that are "
                            "not another gzip member",
                            n - pos, pos);
        } else if (r == Z_BUF_ERROR && pos == n) {
            st = pf_io_fail(PF_EFORMAT, errmsg, errlen, path,
                            "damaged gzip data: unexpected end of file");
        } else if (r != Z_OK && r != Z_BUF_ERROR) {
            st = pf_io_fail(r == Z_MEM_ERROR ? PF_ENOMEM : PF_EFORMAT, errmsg, errlen, path,
                            "damaged gzip data: %s", z.msg ? z.msg : "inflate failed");
        }
    }
    inflateEnd(&z);
    if (st != PF_OK) {
        free(buf);
        return st;
    }
    *out = buf;
    *len = used;
    return PF_OK;
}

pf_status pf_file_read(const char *path, uint8_t **data, size_t *n, char *errmsg, size_t errlen) {
    if (errmsg && errlen > 0) errmsg[0] = '\0';
    if (!path || !data || !n) return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "NULL argument");
    *data = NULL;
    *n = 0;
    int64_t size;
    pf_status st;
    int fd = pf_io_open_regular(path, &size, &st, errmsg, errlen);
    if (fd < 0) return st;
    if ((uint64_t)size > PF_FILE_MAX) {
        close(fd);
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, path,
                          "%lld bytes, more than %llu, the limit for a corpus", (long long)size,
                          (unsigned long long)PF_FILE_MAX);
    }
    uint8_t *raw = malloc(size ? (size_t)size : 1);
    if (!raw) {
        close(fd);
        return pf_io_fail(PF_ENOMEM, errmsg, errlen, path, "out of memory");
    }
    st = pf_io_read_all(fd, raw, (size_t)size, path, errmsg, errlen);
    close(fd);
    if (st != PF_OK) {
        free(raw);
        return st;
    }
    size_t got = (size_t)size;
    if (got >= 2 && raw[0] == 0x1f && raw[1] == 0x8b) {
        st = gunzip(raw, got, data, n, path, errmsg, errlen);
        free(raw);
        return st;
    }
    *data = raw;
    *n = got;
    return PF_OK;
}

void pf_docs_free(pf_docs *d) {
    if (!d) return;
    free(d->bytes);
    free(d->start);
    free(d->len);
    memset(d, 0, sizeof(*d));
}

/* Appends a document [s, s + len) of d->bytes, growing the index. */
static int add_doc(pf_docs *d, size_t *cap, size_t s, size_t len) {
    if (d->count == *cap) {
        size_t nc = *cap ? *cap * 2 : 1024;
        size_t *ns = realloc(d->start, sizeof(size_t) * nc);
        if (!ns) return 0;
        d->start = ns;
        size_t *nl = realloc(d->len, sizeof(size_t) * nc);
        if (!nl) return 0;
        d->len = nl;
        *cap = nc;
    }
    d->start[d->count] = s;
    d->len[d->count] = len;
    d->count++;
    return 1;
}

static int is_space(uint8_t c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

static int is_residue(uint8_t c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '*' || c == '-' || c == '.';
}

pf_status pf_docs_fasta(pf_docs *d, const uint8_t *text, size_t n, const char *name, char *errmsg,
                        size_t errlen) {
    if (errmsg && errlen > 0) errmsg[0] = '\0';
    if (!d || (!text && n)) return pf_io_fail(PF_EINVAL, errmsg, errlen, name, "NULL argument");
    memset(d, 0, sizeof(*d));
    /* the output is never longer than the input plus one '\n' per record */
    d->bytes = malloc(n + 1);
    if (!d->bytes) return pf_io_fail(PF_ENOMEM, errmsg, errlen, name, "out of memory");
    size_t cap = 0, out = 0, doc0 = 0, line = 0;
    int in_record = 0;
    pf_status st = PF_OK;
    for (size_t i = 0; i < n && st == PF_OK;) {
        size_t e = i;
        while (e < n && text[e] != '\n') e++;
        line++;
        size_t le = e; /* the line without trailing white space */
        while (le > i && is_space(text[le - 1])) le--;
        if (le > i && text[i] == '>') {
            if (in_record && out > doc0) {
                d->bytes[out++] = '\n';
                if (!add_doc(d, &cap, doc0, out - doc0)) st = PF_ENOMEM;
            }
            in_record = 1;
            doc0 = out;
        } else if (le > i) {
            if (!in_record) {
                st = pf_io_fail(PF_EFORMAT, errmsg, errlen, name,
                          "line %zu: sequence data before the first '>' header (not FASTA?)", line);
                break;
            }
            for (size_t k = i; k < le; k++) {
                if (!is_residue(text[k])) {
                    st = pf_io_fail(PF_EFORMAT, errmsg, errlen, name,
                              "line %zu, column %zu: byte 0x%02x is not a sequence letter", line,
                              k - i + 1, text[k]);
                    break;
                }
                d->bytes[out++] = text[k];
            }
        }
        i = e + 1;
    }
    if (st == PF_OK && in_record && out > doc0) {
        d->bytes[out++] = '\n';
        if (!add_doc(d, &cap, doc0, out - doc0)) st = PF_ENOMEM;
    }
    if (st == PF_OK && d->count == 0)
        st = pf_io_fail(PF_EFORMAT, errmsg, errlen, name, "%s",
                  n ? "no sequences (FASTA records)" : "empty file");
    if (st == PF_ENOMEM) pf_io_fail(st, errmsg, errlen, name, "out of memory");
    if (st != PF_OK) {
        pf_docs_free(d);
        return st;
    }
    d->n = out;
    return PF_OK;
}

pf_status pf_docs_text(pf_docs *d, const uint8_t *text, size_t n, size_t min_doc, const char *name,
                       char *errmsg, size_t errlen) {
    if (errmsg && errlen > 0) errmsg[0] = '\0';
    if (!d || (!text && n) || min_doc < 1)
        return pf_io_fail(PF_EINVAL, errmsg, errlen, name, "bad argument");
    memset(d, 0, sizeof(*d));
    const uint8_t *nul = n ? memchr(text, 0, n) : NULL;
    if (nul)
        return pf_io_fail(PF_EFORMAT, errmsg, errlen, name,
                    "a NUL byte at offset %zu: a binary file, not text", (size_t)(nul - text));
    size_t k = 0;
    while (k < n && is_space(text[k])) k++;
    if (k == n) return pf_io_fail(PF_EFORMAT, errmsg, errlen, name, "empty (no text)");
    d->bytes = malloc(n + 1);
    if (!d->bytes) return pf_io_fail(PF_ENOMEM, errmsg, errlen, name, "out of memory");
    memcpy(d->bytes, text, n);
    d->n = n;
    if (text[n - 1] != '\n') d->bytes[d->n++] = '\n';
    size_t cap = 0, s = 0;
    for (size_t i = 0; i < d->n; i++) {
        if (d->bytes[i] == '\n' && (i + 1 - s >= min_doc || i + 1 == d->n)) {
            if (!add_doc(d, &cap, s, i + 1 - s)) {
                pf_docs_free(d);
                return pf_io_fail(PF_ENOMEM, errmsg, errlen, name, "out of memory");
            }
            s = i + 1;
        }
    }
    return PF_OK;
}
