/* fuzz_safetensors.c: libFuzzer target for pf_st_read (src/io/safetensors.h).
 *
 * Beyond the sanitizers it checks the contract: a failure leaves the file empty and says why; a
 * file read has every tensor's bytes inside the buffer (each byte read here, so that
 * AddressSanitizer sees them), element counts equal to the products of the shapes, names found
 * by pf_st_find (they are unique) and every metadata key found by pf_st_meta. */
#include <string.h>

#include "harness.h"
#include "io/safetensors.h"

/* Where the bytes read end up, so that the reads are not optimised away. */
static volatile unsigned sink;

static int empty_file(const pf_st_file *f) {
    return f->buf == NULL && f->size == 0 && f->tensors == NULL && f->n == 0 && f->meta == NULL &&
           f->nmeta == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_input_file(data, size);
    char err[512];
    pf_st_file f;
    memset(&f, 0xab, sizeof(f)); /* the reader must not depend on f's old contents */
    pf_status st = pf_st_read(path, &f, err, sizeof(err));
    if (st != PF_OK) {
        FUZZ_CHECK(empty_file(&f));
        FUZZ_CHECK(err[0] != '\0');
        pf_st_free(&f);
        return 0;
    }
    FUZZ_CHECK(f.n >= 0 && f.nmeta >= 0);
    FUZZ_CHECK(f.n == 0 || f.tensors != NULL);
    const unsigned char *lo = f.buf, *hi = f.buf + f.size;
    unsigned sum = 0;
    for (int i = 0; i < f.n; i++) {
        const pf_st_tensor *t = &f.tensors[i];
        FUZZ_CHECK(t->name != NULL);
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= PF_ST_MAX_DIMS);
        size_t count = 1;
        for (int k = 0; k < t->ndim; k++) {
            FUZZ_CHECK(t->shape[k] >= 0);
            FUZZ_CHECK(t->shape[k] == 0 || count <= SIZE_MAX / (size_t)t->shape[k]);
            count *= (size_t)t->shape[k];
        }
        FUZZ_CHECK(count == t->count);
        if (t->count > 0) {
            const unsigned char *p = t->data;
            FUZZ_CHECK(p >= lo && p <= hi && t->count <= (size_t)(hi - p) / sizeof(float));
            for (size_t b = 0; b < t->count * sizeof(float); b++) sum += p[b];
        }
        FUZZ_CHECK(pf_st_find(&f, t->name) == t);
    }
    sink = sum;
    for (int i = 0; i < f.nmeta; i++) {
        FUZZ_CHECK(f.meta[2 * i] != NULL && f.meta[2 * i + 1] != NULL);
        FUZZ_CHECK(pf_st_meta(&f, f.meta[2 * i]) != NULL);
    }
    FUZZ_CHECK(f.meta == NULL || f.meta[2 * f.nmeta] == NULL);
    (void)pf_st_find(&f, "");
    (void)pf_st_meta(&f, "");
    pf_st_free(&f);
    FUZZ_CHECK(empty_file(&f));
    pf_st_free(&f); /* harmless on a freed file */
    return 0;
}

/* Mutations that keep the header's length field true (harness.h). */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    return fuzz_mutate_safetensors(data, size, max_size, seed);
}
