/* stream_generate.c: several sequences generated at once from one trained language model, as an
 * inference engine serves its open requests, through the public header alone.
 *
 *   build/examples/stream_generate CHECKPOINT PROMPT [TOKENS [SEQUENCES [SEED]]]
 *
 * Loads CHECKPOINT (written by `performer train`) and starts SEQUENCES sequences (default 3),
 * each with its own decoder (its layers' state: a FAVOR+ state, or an exact key/value cache) and
 * its own generator: sequence s draws with seed SEED + s (default SEED 1). Each is fed PROMPT in
 * one prefill, then draws TOKENS bytes (default 64), one at a time, each fed back to give the
 * next one's scores. The sequences run side by side, one per thread; they share only the model,
 * which decoders read and never change, so a sequence's bytes depend on its seed alone. At the
 * end, one line per sequence: "sequence S (seed N): ", PROMPT and its bytes, each byte that is
 * not printable ASCII (and the backslash) written \xNN, so that a sequence stays on its line.
 *
 * Exit status: 0; 1 if the checkpoint cannot be loaded or a sequence fails; 2 for bad arguments.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <performer.h>

/* Drawing as `performer sample` does by default: softmax(logits / 0.8) over the 40 likeliest. */
static const float temperature = 0.8f;
static const int top_k = 40;

enum { MAX_TOKENS = 1 << 20, MAX_SEQUENCES = 1024 };

typedef struct sequence {
    pf_decoder *decoder;
    pf_rng rng;
    uint64_t seed;
    float logits[PF_LM_VOCAB]; /* the scores of the next byte */
    unsigned char *text;       /* the bytes drawn so far: n of them */
    int n;
    pf_status status; /* PF_OK, or why the sequence stopped */
} sequence;

/* Starts a sequence: its generator, its decoder on model, the prompt (n tokens) fed in one go,
 * which leaves the scores of the first byte to draw in s->logits. */
static pf_status sequence_start(sequence *s, const pf_model *model, const int32_t *prompt, int n,
                                uint64_t seed, int tokens) {
    s->seed = seed;
    pf_rng_init(&s->rng, seed, 0);
    s->text = malloc(tokens > 0 ? (size_t)tokens : 1);
    if (!s->text) return PF_ENOMEM;
    pf_status st = pf_decoder_create(&s->decoder, model);
    if (st == PF_OK) st = pf_decoder_prefill(s->decoder, s->logits, prompt, n);
    return st;
}

/* Draws the next byte from the sequence's scores and feeds it, which gives the next scores. */
static pf_status sequence_next(sequence *s) {
    int32_t token;
    pf_status st = pf_sample_logits(&token, s->logits, PF_LM_VOCAB, temperature, top_k, &s->rng);
    if (st == PF_OK) st = pf_decoder_step(s->decoder, s->logits, token);
    if (st == PF_OK) s->text[s->n++] = (unsigned char)token;
    return st;
}

/* Writes n bytes on one line: printable ASCII as it is, anything else (and '\') as \xNN. */
static void put_bytes(const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (b[i] >= 0x20 && b[i] < 0x7f && b[i] != '\\')
            putchar(b[i]);
        else
            printf("\\x%02x", b[i]);
    }
}

/* Says what is wrong with the command line, and how it goes: exit status 2. */
static int usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "stream_generate: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nusage: stream_generate CHECKPOINT PROMPT [TOKENS [SEQUENCES [SEED]]]\n");
    return 2;
}

/* Reads argv[i], if given, as a whole number in [lo, hi] into *v; 0, or -1 if it is not one. */
static int number(int argc, char **argv, int i, long long lo, long long hi, long long *v) {
    if (i >= argc) return 0;
    char *end;
    errno = 0;
    long long x = strtoll(argv[i], &end, 10);
    if (errno || end == argv[i] || *end || x < lo || x > hi) return -1;
    *v = x;
    return 0;
}

int main(int argc, char **argv) {
    long long tokens = 64, count = 3, seed = 1;
    if (argc < 3 || argc > 6) return usage("expected 2 to 5 arguments");
    if (argv[2][0] == '\0') return usage("PROMPT is empty (a sequence needs a first byte)");
    if (number(argc, argv, 3, 0, MAX_TOKENS, &tokens))
        return usage("TOKENS '%s' is not a whole number in [0, %d]", argv[3], MAX_TOKENS);
    if (number(argc, argv, 4, 1, MAX_SEQUENCES, &count))
        return usage("SEQUENCES '%s' is not a whole number in [1, %d]", argv[4], MAX_SEQUENCES);
    if (number(argc, argv, 5, 0, INT64_MAX, &seed))
        return usage("SEED '%s' is not a whole number in [0, 2^63)", argv[5]);
    const size_t plen = strlen(argv[2]);
    if (plen > MAX_TOKENS) return usage("PROMPT is longer than %d bytes", MAX_TOKENS);

    char msg[512];
    pf_model *model = NULL;
    pf_status st = pf_model_load(&model, argv[1], msg, sizeof(msg));
    if (st != PF_OK) {
        fprintf(stderr, "stream_generate: cannot load the model (%s): %s\n", pf_status_str(st),
                msg);
        return 1;
    }
    /* Exact attention keeps a cache of `context` positions and learned positions a table as
     * long; only FAVOR+ with rotary positions decodes past it, in constant memory. */
    const pf_model_config c = pf_model_get_config(model);
    if ((c.attention == PF_LM_EXACT || c.positions == PF_LM_LEARNED) &&
        plen + (size_t)tokens > (size_t)c.context) {
        fprintf(stderr,
                "stream_generate: the prompt (%zu bytes) and %lld tokens do not fit in this "
                "model's context of %d bytes\n",
                plen, tokens, c.context);
        pf_model_free(model);
        return 2;
    }

    const int n = (int)count;
    sequence *seqs = calloc((size_t)n, sizeof(sequence));
    int32_t *prompt = malloc(sizeof(int32_t) * plen);
    if (!seqs || !prompt) {
        fprintf(stderr, "stream_generate: out of memory\n");
        free(seqs), free(prompt), pf_model_free(model);
        return 1;
    }
    for (size_t i = 0; i < plen; i++) prompt[i] = (unsigned char)argv[2][i];

        /* One sequence per thread: a decoder is used by one thread at a time. One byte of one
         * sequence is too little work to share, and so the library's calls inside this loop run on
         * their thread alone (OpenMP's default of one active level), as `performer sample` does. A
         * sequence that fails stops; the others go on. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n; i++) {
        sequence *s = &seqs[i];
        s->status =
            sequence_start(s, model, prompt, (int)plen, (uint64_t)seed + (uint64_t)i, (int)tokens);
        for (int t = 0; t < tokens && s->status == PF_OK; t++) s->status = sequence_next(s);
    }

    int failed = 0;
    for (int i = 0; i < n; i++) {
        if (seqs[i].status != PF_OK) {
            fprintf(stderr, "stream_generate: sequence %d failed after %d bytes: %s\n", i,
                    seqs[i].n, pf_status_str(seqs[i].status));
            failed = 1;
            continue;
        }
        printf("sequence %d (seed %llu): ", i, (unsigned long long)seqs[i].seed);
        put_bytes((const unsigned char *)argv[2], plen);
        put_bytes(seqs[i].text, (size_t)seqs[i].n);
        putchar('\n');
    }
    for (int i = 0; i < n; i++) {
        pf_decoder_free(seqs[i].decoder);
        free(seqs[i].text);
    }
    free(seqs);
    free(prompt);
    pf_model_free(model);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "stream_generate: cannot write the output: %s\n", strerror(errno));
        return 1;
    }
    return failed;
}
