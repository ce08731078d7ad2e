/* text.c: reading corpora: any file through zlib (gzip or plain), FASTA records and plain text
 * as documents (model/data.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "io/io.h"
#include "model/data.h"



pf_status pf_file_read(const char *path, uint8_t **data, size_t *n, char *errmsg, size_t errlen) {
    if (errmsg && errlen > 0) errmsg[0] = '\0';
    if (!path || !data || !n) return pf_io_fail(PF_EINVAL, errmsg, errlen, path, "NULL argument");
    *data = NULL;
    *n = 0;
    struct stat sb;
    if (stat(path, &sb) != 0) return pf_io_fail(PF_EIO, errmsg, errlen, path, "%s", strerror(errno));
    if (S_ISDIR(sb.st_mode)) return pf_io_fail(PF_EIO, errmsg, errlen, path, "is a folder");
    gzFile gz = gzopen(path, "rb");
    if (!gz) return pf_io_fail(PF_EIO, errmsg, errlen, path, "cannot open: %s", strerror(errno));
    size_t cap = 1 << 20, len = 0;
    uint8_t *buf = malloc(cap);
    pf_status st = buf ? PF_OK : PF_ENOMEM;
    while (st == PF_OK) {
        if (cap - len < (1u << 20)) {
            if (cap > ((size_t)1 << 40)) {
                st = pf_io_fail(PF_EFORMAT, errmsg, errlen, path, "larger than 1 TiB");
                break;
            }
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) {
                st = PF_ENOMEM;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        int got = gzread(gz, buf + len, 1u << 20);
        if (got < 0) {
            int zerr;
            const char *why = gzerror(gz, &zerr);
            st = pf_io_fail(zerr == Z_ERRNO ? PF_EIO : PF_EFORMAT, errmsg, errlen, path,
                      "damaged gzip data: %s", zerr == Z_ERRNO ? strerror(errno) : why);
            break;
        }
        if (got == 0) break;
        len += (size_t)got;
    }
    if (st == PF_OK) {
        /* a stream cut short reads to its end and then reports the error */
        int zerr;
        const char *why = gzerror(gz, &zerr);
        if (zerr != Z_OK && zerr != Z_STREAM_END)
            st = pf_io_fail(PF_EFORMAT, errmsg, errlen, path, "damaged gzip data: %s", why);
    }
    gzclose(gz);
    if (st == PF_ENOMEM) pf_io_fail(st, errmsg, errlen, path, "out of memory");
    if (st != PF_OK) {
        free(buf);
        return st;
    }
    *data = buf;
    *n = len;
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
