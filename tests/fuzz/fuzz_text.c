/* fuzz_text.c: libFuzzer target for the corpus readers (src/io/text.h): pf_file_read (through
 * zlib, so gzip inputs are inflated), then pf_docs_fasta and pf_docs_text on its bytes, and the
 * language model's split, pf_corpus_from_docs (src/model/data.h), on each result.
 *
 * Beyond the sanitizers it checks the contracts: every document lies inside the bytes and ends
 * in '\n'; the two splits together hold every document and byte once, and both exist when there
 * are two documents or more; a failure says why. */
#include <string.h>

#include "harness.h"
#include "io/text.h"
#include "model/data.h"

/* Where the bytes read end up, so that the reads are not optimised away. */
static volatile unsigned sink;

static void check_docs(const pf_docs *d) {
    FUZZ_CHECK(d->count >= 1 && d->bytes != NULL);
    size_t total = 0;
    for (size_t i = 0; i < d->count; i++) {
        FUZZ_CHECK(d->len[i] >= 1 && d->start[i] <= d->n && d->len[i] <= d->n - d->start[i]);
        FUZZ_CHECK(d->bytes[d->start[i] + d->len[i] - 1] == '\n');
        total += d->len[i];
    }
    FUZZ_CHECK(total == d->n); /* the documents tile the bytes */
}

static void check_split(const pf_docs *d) {
    pf_corpus c;
    pf_status st = pf_corpus_from_docs(&c, d, 0.25);
    FUZZ_CHECK(st == PF_OK);
    size_t total = 0;
    for (size_t i = 0; i < d->count; i++) total += d->len[i];
    FUZZ_CHECK(c.docs[0] + c.docs[1] == d->count);
    FUZZ_CHECK(c.n[0] + c.n[1] == total);
    if (d->count >= 2) FUZZ_CHECK(c.docs[0] >= 1 && c.docs[1] >= 1);
    unsigned sum = 0;
    for (int s = 0; s < 2; s++) {
        for (size_t k = 0; k < c.n[s]; k++) sum += c.bytes[s][k];
    }
    sink = sum;
    pf_corpus_free(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_input_file(data, size);
    char err[512];
    uint8_t *raw = NULL;
    size_t n = 0;
    pf_status st = pf_file_read(path, &raw, &n, err, sizeof(err));
    if (st != PF_OK) {
        FUZZ_CHECK(raw == NULL && n == 0);
        FUZZ_CHECK(err[0] != '\0');
        return 0;
    }
    FUZZ_CHECK(n == 0 || raw != NULL);

    pf_docs d;
    st = pf_docs_fasta(&d, raw, n, "fuzz", err, sizeof(err));
    if (st == PF_OK) {
        check_docs(&d);
        /* a record's document is its letters and one '\n': never longer than the input */
        FUZZ_CHECK(d.n <= n + 1);
        check_split(&d);
        pf_docs_free(&d);
    } else {
        FUZZ_CHECK(err[0] != '\0');
    }
    /* small documents, so that even short inputs split into several */
    st = pf_docs_text(&d, raw, n, 32, "fuzz", err, sizeof(err));
    if (st == PF_OK) {
        check_docs(&d);
        FUZZ_CHECK(d.n == n || d.n == n + 1);
        check_split(&d);
        pf_docs_free(&d);
    } else {
        FUZZ_CHECK(err[0] != '\0');
    }
    free(raw);
    return 0;
}
