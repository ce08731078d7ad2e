/* fuzz_checkpoint.c: libFuzzer target for pf_model_load (include/performer.h).
 *
 * A model that loads runs one short forward pass (B = 1, T = min(4, context), with targets, so
 * the loss too) and is freed; a load that fails hands back no model and says why. */
#include <string.h>

#include "harness.h"
#include "performer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_input_file(data, size);
    char err[512];
    pf_model *m = NULL;
    pf_status st = pf_model_load(&m, path, err, sizeof(err));
    if (st != PF_OK) {
        FUZZ_CHECK(m == NULL);
        FUZZ_CHECK(err[0] != '\0');
        return 0;
    }
    FUZZ_CHECK(m != NULL);
    pf_model_config c = pf_model_get_config(m);
    FUZZ_CHECK(c.context >= 1);
    int T = c.context < 4 ? c.context : 4;
    int32_t tokens[4], targets[4];
    for (int t = 0; t < T; t++) {
        tokens[t] = size > (size_t)t ? data[t] : t; /* any bytes: the first of the file */
        targets[t] = t == T - 1 ? -1 : tokens[t] ^ 0x55;
    }
    float loss = -1, logits[4 * PF_LM_VOCAB];
    st = pf_model_forward(m, &loss, logits, tokens, targets, 1, T);
    /* the weights are finite (the loader checks), but large ones may overflow to Inf */
    if (st != PF_OK) fprintf(stderr, "pf_model_forward: %s\n", pf_status_str(st));
    FUZZ_CHECK(st == PF_OK || st == PF_ENONFINITE || st == PF_EDOMAIN);
    (void)pf_model_meta(m, "format");
    pf_model_free(m);
    return 0;
}

/* Mutations that keep the header's length field true (harness.h). */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    return fuzz_mutate_safetensors(data, size, max_size, seed);
}
