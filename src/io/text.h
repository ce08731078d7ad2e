/* text.h: corpora as documents, read from files (text.c): any file through zlib (gzip or
 * plain), FASTA records and plain text. The language model's data (model/data.h) is built on
 * these; reading knows nothing of models. Not installed.
 *
 * A corpus is a list of documents: a FASTA file's sequences (the amino-acid letters, each
 * followed by '\n') or a text file cut at line ends into pieces of about PF_TEXT_DOC bytes. */
#ifndef PF_IO_TEXT_H
#define PF_IO_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

#define PF_TEXT_DOC 2048 /* a text document ends at the first line end after this many bytes */

/* Documents: doc i is bytes[start[i] .. start[i] + len[i]), its terminating '\n' included. */
typedef struct pf_docs {
    uint8_t *bytes;
    size_t n;
    size_t *start, *len;
    size_t count;
} pf_docs;

/* The largest corpus read: 2 GiB, before and after inflating (a gzip bomb stops there). */
#define PF_FILE_MAX ((size_t)1 << 31)

/* Reads a whole regular file into *data (malloc'd, *n bytes); gzip files (one member or
 * several in a row) are inflated, plain files read as they are. PF_EIO if it cannot be opened
 * or read or is not a regular file (a FIFO or /dev/zero is refused at once); PF_EFORMAT for a
 * damaged or truncated gzip stream, bytes after its last member, or more than PF_FILE_MAX
 * bytes; errmsg names the file. */
PF_INTERNAL pf_status pf_file_read(const char *path, uint8_t **data, size_t *n, char *errmsg,
                                   size_t errlen);

/* FASTA: '>' header lines, then sequence lines (letters, '*', '-', '.'; CR and spaces at line
 * ends ignored); a record's lines joined into one document plus '\n'. Records without a
 * sequence are skipped. PF_EFORMAT (naming `name` and the line) for data before the first
 * header, another byte in a sequence, or no sequence at all. */
PF_INTERNAL pf_status pf_docs_fasta(pf_docs *d, const uint8_t *text, size_t n, const char *name,
                                    char *errmsg, size_t errlen);

/* Plain text cut into documents at line ends after every `min_doc` bytes (the last line gets
 * a '\n' if it lacks one). PF_EFORMAT if empty (nothing but white space) or holding a NUL byte
 * (a binary file). */
PF_INTERNAL pf_status pf_docs_text(pf_docs *d, const uint8_t *text, size_t n, size_t min_doc,
                                   const char *name, char *errmsg, size_t errlen);

PF_INTERNAL void pf_docs_free(pf_docs *d);

#endif
