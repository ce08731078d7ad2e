/* data.h: what data.c (the public pf_corpus_*: performer.h) shares with the tests: the hash
 * and the split of documents read by src/io/text.c (io/text.h). Not installed. */
#ifndef PF_DATA_H
#define PF_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"
#include "io/text.h"

/* A document's 64-bit hash (FNV-1a, then a splitmix64 finaliser). */
PF_INTERNAL uint64_t pf_doc_hash(const uint8_t *p, size_t n);

/* Splits documents: doc goes to validation when (hash >> 11) 2^-53 < val_fraction. If that
 * leaves a split empty while there are >= 2 documents, the document with the smallest (for
 * validation) or largest (for training) hash moves over, so both splits exist. */
PF_INTERNAL pf_status pf_corpus_from_docs(pf_corpus *c, const pf_docs *d, double val_fraction);

#endif
