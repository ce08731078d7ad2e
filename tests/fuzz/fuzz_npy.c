/* fuzz_npy.c: libFuzzer target for pf_npy_read (include/performer.h).
 *
 * Beyond the sanitizers it checks the contract: a failure leaves the array empty and says why;
 * an array read is written back by pf_npy_write and read again, and the two agree in dtype,
 * shape and every byte. */
#include <string.h>

#include "harness.h"
#include "performer.h"

/* Same dtype, rank, shape and data bytes. */
static int same_array(const pf_array *a, const pf_array *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++) {
        if (a->shape[i] != b->shape[i]) return 0;
    }
    int64_t n = pf_array_size(a);
    if (n < 0 || pf_array_size(b) != n) return 0;
    return n == 0 || memcmp(a->data, b->data, (size_t)n * pf_dtype_size(a->dtype)) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_input_file(data, size);
    char err[512];
    pf_array a;
    memset(&a, 0xab, sizeof(a)); /* the reader must not depend on a's old contents */
    pf_status st = pf_npy_read(path, &a, err, sizeof(err));
    if (st != PF_OK) {
        FUZZ_CHECK(a.data == NULL && pf_array_size(&a) == 0);
        FUZZ_CHECK(err[0] != '\0');
        return 0;
    }
    FUZZ_CHECK(a.dtype == PF_F32 || a.dtype == PF_I32 || a.dtype == PF_I64 || a.dtype == PF_F16);
    FUZZ_CHECK(a.ndim >= 0 && a.ndim <= PF_NPY_MAX_DIMS);
    int64_t n = pf_array_size(&a);
    FUZZ_CHECK(n >= 0);
    FUZZ_CHECK(n == 0 || a.data != NULL);

    const char *out = fuzz_output_path();
    st = pf_npy_write(out, &a, err, sizeof(err));
    if (st != PF_OK) fprintf(stderr, "pf_npy_write: %s\n", err);
    FUZZ_CHECK(st == PF_OK);
    pf_array b;
    st = pf_npy_read(out, &b, err, sizeof(err));
    if (st != PF_OK) fprintf(stderr, "pf_npy_read of the written file: %s\n", err);
    FUZZ_CHECK(st == PF_OK);
    FUZZ_CHECK(same_array(&a, &b));
    pf_array_free(&b);
    pf_array_free(&a);
    pf_array_free(&a); /* harmless twice */
    return 0;
}

/* Mutations that keep the header's length field true (harness.h). */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    return fuzz_mutate_npy(data, size, max_size, seed);
}
