/* data.h: byte corpora for the language model: reading FASTA and text files (src/io/text.c),
 * the deterministic train/validation split and batches of windows (data.c). Not installed.
 *
 * A corpus is a list of documents: a FASTA file's sequences (the amino-acid letters, each
 * followed by '\n') or a text file cut at line ends into pieces of about PF_TEXT_DOC bytes.
 * Each document goes to the validation split when a hash of its bytes says so, so the split
 * depends on the contents only (not on the order, and duplicates land on the same side). */
#ifndef PF_DATA_H
#define PF_DATA_H

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

typedef enum pf_corpus_format {
    PF_CORPUS_AUTO = 0, /* FASTA if the first non-space byte is '>', else text */
    PF_CORPUS_FASTA = 1,
    PF_CORPUS_TEXT = 2
} pf_corpus_format;

enum { PF_SPLIT_TRAIN = 0, PF_SPLIT_VAL = 1 };

/* The two splits, each its documents concatenated in file order. */
typedef struct pf_corpus {
    uint8_t *bytes[2];
    size_t n[2];
    size_t docs[2];
} pf_corpus;

/* A document's 64-bit hash (FNV-1a, then a splitmix64 finaliser). */
PF_INTERNAL uint64_t pf_doc_hash(const uint8_t *p, size_t n);

/* Splits documents: doc goes to validation when (hash >> 11) 2^-53 < val_fraction. If that
 * leaves a split empty while there are >= 2 documents, the document with the smallest (for
 * validation) or largest (for training) hash moves over, so both splits exist. */
PF_INTERNAL pf_status pf_corpus_from_docs(pf_corpus *c, const pf_docs *d, double val_fraction);

/* pf_file_read, the parser for `format`, then the split. */
PF_INTERNAL pf_status pf_corpus_load(pf_corpus *c, const char *path, pf_corpus_format format,
                                     double val_fraction, char *errmsg, size_t errlen);

PF_INTERNAL void pf_corpus_free(pf_corpus *c);

/* B windows of T + 1 bytes of a split at offsets drawn from (seed, stream): tokens (B,T) are
 * the first T bytes, targets (B,T) the last T. PF_EINVAL if the split has fewer than T + 1
 * bytes. */
PF_INTERNAL pf_status pf_corpus_batch(const pf_corpus *c, int split, int32_t *tokens,
                                      int32_t *targets, int B, int T, uint64_t seed,
                                      uint64_t stream);

#endif
