/* data.c: the train/validation split by document hash and batches of random windows. */
#include <stdlib.h>
#include <string.h>

#include "io/io.h"
#include "model/data.h"

uint64_t pf_doc_hash(const uint8_t *p, size_t n) {
    uint64_t h = UINT64_C(14695981039346656037); /* FNV-1a 64 */
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= UINT64_C(1099511628211);
    }
    h ^= h >> 30; /* splitmix64's finaliser: FNV's high bits alone mix poorly */
    h *= UINT64_C(0xbf58476d1ce4e5b9);
    h ^= h >> 27;
    h *= UINT64_C(0x94d049bb133111eb);
    h ^= h >> 31;
    return h;
}

static double unit(uint64_t h) {
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

pf_status pf_corpus_from_docs(pf_corpus *c, const pf_docs *d, double val_fraction) {
    if (!c || !d || !(val_fraction >= 0 && val_fraction < 1)) return PF_EINVAL;
    memset(c, 0, sizeof(*c));
    if (d->count == 0) return PF_EINVAL;
    uint8_t *side = malloc(d->count);
    if (!side) return PF_ENOMEM;
    size_t nval = 0, lo = 0, hi = 0;
    double ulo = 2, uhi = -1;
    for (size_t i = 0; i < d->count; i++) {
        double u = unit(pf_doc_hash(d->bytes + d->start[i], d->len[i]));
        side[i] = u < val_fraction ? PF_SPLIT_VAL : PF_SPLIT_TRAIN;
        nval += side[i];
        if (u < ulo) ulo = u, lo = i;
        if (u > uhi) uhi = u, hi = i;
    }
    /* both splits non-empty when there are two documents or more */
    if (d->count >= 2 && val_fraction > 0 && nval == 0) side[lo] = PF_SPLIT_VAL;
    if (d->count >= 2 && nval == d->count) side[hi] = PF_SPLIT_TRAIN;
    size_t bytes[2] = {0, 0};
    for (size_t i = 0; i < d->count; i++) bytes[side[i]] += d->len[i];
    for (int s = 0; s < 2; s++) {
        c->bytes[s] = malloc(bytes[s] ? bytes[s] : 1);
        if (!c->bytes[s]) {
            free(side);
            pf_corpus_free(c);
            return PF_ENOMEM;
        }
    }
    for (size_t i = 0; i < d->count; i++) {
        int s = side[i];
        memcpy(c->bytes[s] + c->n[s], d->bytes + d->start[i], d->len[i]);
        c->n[s] += d->len[i];
        c->docs[s]++;
    }
    free(side);
    return PF_OK;
}

pf_status pf_corpus_load(pf_corpus *c, const char *path, pf_corpus_format format,
                         double val_fraction, char *errmsg, size_t errlen) {
    if (!c) return PF_EINVAL;
    memset(c, 0, sizeof(*c));
    if (!path || (format != PF_CORPUS_AUTO && format != PF_CORPUS_FASTA &&
                  format != PF_CORPUS_TEXT) || !(val_fraction >= 0 && val_fraction < 1))
        return pf_io_fail(PF_EINVAL, errmsg, errlen, path ? path : "(null)",
                          "a NULL path, or the format or validation fraction out of range");
    uint8_t *raw = NULL;
    size_t n = 0;
    pf_status st = pf_file_read(path, &raw, &n, errmsg, errlen);
    if (st != PF_OK) return st;
    if (format == PF_CORPUS_AUTO) {
        size_t k = 0;
        while (k < n && (raw[k] == ' ' || raw[k] == '\t' || raw[k] == '\r' || raw[k] == '\n')) k++;
        format = k < n && raw[k] == '>' ? PF_CORPUS_FASTA : PF_CORPUS_TEXT;
    }
    pf_docs d;
    if (format == PF_CORPUS_FASTA)
        st = pf_docs_fasta(&d, raw, n, path, errmsg, errlen);
    else
        st = pf_docs_text(&d, raw, n, PF_TEXT_DOC, path, errmsg, errlen);
    free(raw);
    if (st != PF_OK) return st;
    st = pf_corpus_from_docs(c, &d, val_fraction);
    pf_docs_free(&d);
    return st;
}

pf_status pf_corpus_hash(const pf_corpus *c, uint64_t *hash) {
    if (!c || !hash) return PF_EINVAL;
    *hash = pf_doc_hash(c->bytes[PF_SPLIT_TRAIN], c->n[PF_SPLIT_TRAIN]) ^
            pf_doc_hash(c->bytes[PF_SPLIT_VAL], c->n[PF_SPLIT_VAL]);
    return PF_OK;
}

void pf_corpus_free(pf_corpus *c) {
    if (!c) return;
    free(c->bytes[0]);
    free(c->bytes[1]);
    memset(c, 0, sizeof(*c));
}

pf_status pf_corpus_batch(const pf_corpus *c, int split, int32_t *tokens, int32_t *targets, int B,
                          int T, uint64_t seed, uint64_t stream) {
    if (!c || (split != PF_SPLIT_TRAIN && split != PF_SPLIT_VAL) || !tokens || !targets || B < 1 ||
        T < 1)
        return PF_EINVAL;
    size_t n = c->n[split];
    if (n < (size_t)T + 1) return PF_EINVAL;
    uint64_t starts = (uint64_t)(n - (size_t)T); /* windows [o, o + T] with o + T < n */
    pf_rng rng;
    pf_rng_init(&rng, seed, stream);
    for (int b = 0; b < B; b++) {
        uint64_t hi = pf_rng_u32(&rng);
        uint64_t r = hi << 32 | pf_rng_u32(&rng);
        size_t o = (size_t)(r % starts); /* bias below starts / 2^64: negligible */
        const uint8_t *w = c->bytes[split] + o;
        for (int t = 0; t < T; t++) {
            tokens[(size_t)b * T + t] = w[t];
            targets[(size_t)b * T + t] = w[t + 1];
        }
    }
    return PF_OK;
}
