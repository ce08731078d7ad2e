/* data.h: byte corpora for the language model: documents read by src/io/text.c (io/text.h),
 * the deterministic train/validation split and batches of windows (data.c). Not installed.
 *
 * Each document goes to the validation split when a hash of its bytes says so, so the split
 * depends on the contents only (not on the order, and duplicates land on the same side). */
#ifndef PF_DATA_H
#define PF_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"
#include "io/text.h"

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
