/* cmd_sample.c: `performer sample`: continue a prompt with a trained language model.
 *
 * The model decodes one byte at a time (pf_decoder): exact attention with a key/value cache,
 * FAVOR+ with its recurrent state (constant memory and time per byte). When a model with
 * learned positions or exact attention reaches its context, the decoder restarts on the last
 * half-context of bytes (a sliding window). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tool.h"

#define CMD "sample"

const char cmd_sample_synopsis[] =
    "performer sample --checkpoint FILE [--prompt TEXT] [--tokens N] [--temperature T]\n"
    "     [--top-k K] [--seed S] [--threads N] [--escape auto|yes|no]\n";

void cmd_sample_help(void) {
    printf("usage: %s\n"
           "Writes the prompt and N sampled bytes to stdout; the speed goes to stderr.\n"
           "\n"
           "  --checkpoint FILE   a model written by `performer train`\n"
           "                                                                      [default]\n"
           "  --prompt TEXT       the start; empty begins a new document (a '\\n')  [\"\"]\n"
           "  --tokens N          bytes to generate                               [200]\n"
           "  --temperature T     softmax temperature, 0 = always the likeliest   [0.8]\n"
           "  --top-k K           draw among the K likeliest bytes, 0 = all       [40]\n"
           "  --seed S            the draws (same seed, same text)                [0]\n"
           "  --threads N         threads, 0 = OpenMP's default; one byte is too   [1]\n"
           "                      little work to share (threads only wait)\n"
           "  --escape WHEN       write bytes other than printable ASCII, newline and tab\n"
           "                      as \\xNN: yes, no (the raw bytes), or auto: yes when\n"
           "                      stdout is a terminal (a model can emit control\n"
           "                      sequences)                                      [auto]\n"
           "\n"
           "Exit status: 0 success, 1 bad checkpoint or failed decoding, 2 bad command line.\n",
           cmd_sample_synopsis);
}

/* Writes byte c, as \xNN when escaping and it is not printable ASCII, '\n' or '\t'. */
static void put_byte(int c, int escape) {
    if (escape && !(c >= 0x20 && c < 0x7f) && c != '\n' && c != '\t')
        printf("\\x%02x", c);
    else
        fputc(c, stdout);
}

/* What feeding the decoder took: tokens prefilled and the time of it, single steps. */
typedef struct feed_stats {
    int64_t prefilled, steps;
    double prefill_ms;
} feed_stats;

/* Feeds text[*fed..n) to the decoder: what was not yet seen (the prompt, or the window kept on a
 * restart) by one prefill, a new byte by a step; when the position reaches limit the decoder
 * restarts on the last half-context. logits end as the scores after text[n - 1]. */
static pf_status feed(pf_decoder *d, const int32_t *text, size_t n, size_t *fed, int64_t limit,
                      int context, float *logits, feed_stats *fs) {
    pf_status st = PF_OK;
    while (*fed < n && st == PF_OK) {
        const int64_t pos = pf_decoder_position(d);
        if (pos >= limit) {
            size_t keep = (size_t)(context / 2 > 0 ? context / 2 : 1);
            st = pf_decoder_reset(d);
            *fed = n > keep ? n - keep : 0;
            continue;
        }
        int64_t k = (int64_t)(n - *fed);
        if (k > limit - pos) k = limit - pos;
        if (k > (1 << 20)) k = 1 << 20;
        if (k == 1) {
            st = pf_decoder_step(d, logits, text[(*fed)++]);
            fs->steps++;
            continue;
        }
        const double tp = tool_now_ms();
        st = pf_decoder_prefill(d, logits, text + *fed, (int)k);
        fs->prefill_ms += tool_now_ms() - tp;
        *fed += (size_t)k;
        fs->prefilled += k;
    }
    return st;
}

int cmd_sample(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = "";
    int tokens = 200, top_k = 40, threads = 1;
    double temperature = 0.8;
    uint64_t seed = 0;
    int escape = -1; /* -1: auto */
    static const char *const whens[] = {"auto", "yes", "no", NULL};
    tool_args a;
    tool_args_init(&a, CMD, argc, argv);
    while (tool_next(&a)) {
        const char *v = NULL;
        if (tool_path_opt(&a, "--checkpoint", &v)) {
            ckpt = v;
        } else if (tool_opt(&a, "--prompt", &v)) {
            if (v) prompt = v;
        } else if (tool_opt(&a, "--tokens", &v)) {
            if (v) tool_parse_int(&a, "--tokens", v, 0, INT_MAX, &tokens);
        } else if (tool_opt(&a, "--temperature", &v)) {
            if (v) tool_parse_double(&a, "--temperature", v, 0, 100, 0, &temperature);
        } else if (tool_opt(&a, "--top-k", &v)) {
            if (v) tool_parse_int(&a, "--top-k", v, 0, PF_LM_VOCAB, &top_k);
        } else if (tool_opt(&a, "--seed", &v)) {
            if (v) tool_parse_u64(&a, "--seed", v, &seed);
        } else if (tool_opt(&a, "--escape", &v)) {
            int w = v ? tool_parse_choice(&a, "--escape", v, whens) : -1;
            if (w >= 0) escape = w == 0 ? -1 : w == 1;
        } else if (tool_opt(&a, "--threads", &v)) {
            if (v) tool_parse_int(&a, "--threads", v, 0, PF_MAX_THREADS, &threads);
        } else {
            return tool_unknown(&a);
        }
    }
    if (a.failed) return TOOL_EXIT_USAGE;
    if (!ckpt) return tool_usage(CMD, "missing --checkpoint FILE");
    if (temperature == 0 && (tool_given(&a, "--top-k") || tool_given(&a, "--seed")))
        return tool_usage(CMD, "%s does not apply with --temperature 0, which always takes the "
                               "likeliest byte",
                          tool_given(&a, "--top-k") ? "--top-k" : "--seed");
    if (escape < 0) escape = isatty(1);
    tool_set_threads(threads);

    char msg[1024];
    pf_model *m = NULL;
    if (pf_model_load(&m, ckpt, msg, sizeof(msg)) != PF_OK) return tool_fail(CMD, "%s", msg);
    pf_model_config c = pf_model_get_config(m);
    pf_decoder *d = NULL;
    pf_status st = pf_decoder_create(&d, m);
    if (st != PF_OK) {
        pf_model_free(m);
        return tool_fail(CMD, "cannot decode with this model: %s", pf_status_str(st));
    }
    /* the decoder can go past the context only with FAVOR or local attention and rotary
     * positions */
    int64_t limit =
        c.attention != PF_LM_EXACT && c.positions == PF_LM_ROTARY ? INT64_MAX : c.context;
    size_t plen = strlen(prompt);
    size_t cap = plen + (size_t)tokens + 1;
    int32_t *text = malloc(sizeof(int32_t) * cap);
    if (!text) {
        pf_decoder_free(d);
        pf_model_free(m);
        return tool_fail(CMD, "out of memory");
    }
    size_t n = 0;
    if (plen == 0) text[n++] = '\n';
    for (size_t i = 0; i < plen; i++) text[n++] = (unsigned char)prompt[i];
    for (size_t i = 0; i < plen; i++) put_byte((unsigned char)prompt[i], escape);

    float logits[PF_LM_VOCAB];
    pf_rng rng;
    pf_rng_init(&rng, seed, 0);
    size_t fed = 0; /* text[0..fed) is in the decoder */
    double t0 = tool_now_ms();
    feed_stats fs = {0, 0, 0};
    for (int i = 0; i < tokens && st == PF_OK; i++) {
        st = feed(d, text, n, &fed, limit, c.context, logits, &fs);
        if (st != PF_OK) break;
        int32_t next;
        st = pf_sample_logits(&next, logits, PF_LM_VOCAB, (float)temperature, top_k, &rng);
        if (st != PF_OK) break;
        text[n++] = next;
        put_byte(next, escape);
        if (fflush(stdout) != 0) break; /* stdout is gone (main reports it): stop */
    }
    double ms = tool_now_ms() - t0;
    if (st == PF_OK) {
        if (n > 0 && text[n - 1] != '\n') fputc('\n', stdout);
        fflush(stdout);
        fprintf(stderr,
                "performer sample: %lld bytes prefilled in %.2f ms, then %d bytes, %lld decoder "
                "steps, %.2f ms per step (%s)\n",
                (long long)fs.prefilled, fs.prefill_ms, tokens, (long long)fs.steps,
                fs.steps ? (ms - fs.prefill_ms) / (double)fs.steps : 0.0,
                c.attention == PF_LM_EXACT   ? "exact attention, key/value cache"
                : c.attention == PF_LM_LOCAL ? "local attention, key/value cache of the window"
                : c.attention == PF_LM_FAVOR
                    ? (c.kernel == PF_KERNEL_ELU ? "linear elu+1, recurrent state"
                                                 : "FAVOR+, recurrent state")
                    : "FAVOR++, recurrent state");
    }
    free(text);
    pf_decoder_free(d);
    pf_model_free(m);
    if (st != PF_OK) return tool_fail(CMD, "decoding failed: %s", pf_status_str(st));
    return TOOL_EXIT_OK;
}
