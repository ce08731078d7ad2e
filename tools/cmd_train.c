/* cmd_train.c: `performer train`: train the byte-level language model on proteins, the King
 * James Bible or any text/FASTA file, with evaluation, a CSV log, a plot and checkpoints that
 * --resume continues bit for bit.
 *
 * Every step is a function of (settings, step): the batch is drawn from (data seed, step), the
 * learning rate from the schedule, FAVOR's W from (W seed, step / redraw), the initial weights
 * from the init seed (--data-seed, --w-seed, --init-seed, each --seed unless given). So a run
 * stopped after its last checkpoint and resumed gives the same parameters as one never stopped.
 *
 * --task mqar trains on multi-query associative recall (pf_mqar_batch) instead of a corpus: the
 * batches are generated from (data seed, step), the validation set from (data seed, EVAL_STREAM
 * + i), and an evaluation reports the accuracy on the answers.
 *
 * For the tests, the environment variable PERFORMER_TRAIN_DUMP=DIR (not in --help) makes a
 * run of one process write into DIR what it starts from: init.safetensors (the model before its
 * first step: weights, W), train_tokens.npy and train_targets.npy (the first step's batch, (B,T)
 * int32), and from its first evaluation eval_tokens.npy, eval_targets.npy (E,B,T) and
 * eval_logits.npy (E,B,T,256), so that they can be checked independently.
 *
 * Under mpirun (the MPI build, performer-mpi: mpi/tool_mpi.h) with --parallel data|sequence, every
 * rank draws the same batch and trains its share of it through pf_mpi_trainer: whole sequences
 * (data) or a slice of every sequence (sequence); the gradients are summed in rank order, so
 * every rank's model stays the same. Rank 0 alone owns the folder: its lock, the log, the
 * checkpoints, the plot and the progress line; the others only read (the data, and the
 * checkpoint to resume from). Every failure is agreed on (tool_mpi_agree) before the next thing
 * that needs every rank, so all ranks stop together with rank 0 printing the message. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpi/tool_mpi.h"
#include "tool.h"

#define CMD "train"
#define PROTEINS "/usr/share/doc/mmseqs2/example-data/DB.fasta.gz"
#define DATA_SEED_MIX UINT64_C(0x9e3779b97f4a7c15) /* data draws apart from weight draws */
#define EVAL_STREAM (UINT64_C(1) << 63)
#define FIT_STREAM (UINT64_C(1) << 62) /* --fit-batches: training batches no step draws */

const char cmd_train_synopsis[] =
    "performer train --out DIR [--data proteins|bible|FILE] [--layers L] [--d-model C]\n"
    "     [--attention exact|favor|favor++|local] [--window W] [--kernel K] [--features M]\n"
    "     [--redraw N] [--positions learned|rotary] [--heads H] [--context T] [--steps S]\n"
    "     [--batch B] [--lr LR] [--warmup W] [--weight-decay WD] [--clip G] [--eval-every N]\n"
    "     [--eval-batches N] [--seed S] [--data-seed S] [--init-seed S] [--w-seed S]\n"
    "     [--task text|mqar] [--mqar-pairs N] [--mqar-queries Q] [--mqar-keys K]\n"
    "     [--threads N] [--resume] [--stop-after N]\n"
    "     [--init-from CHECKPOINT] [--fit-batches N] [--parallel data|sequence]   (under mpirun)\n";

void cmd_train_help(void) {
    printf("usage: %s\n"
           "Trains a decoder-only byte Transformer (pre-norm, GELU MLP, tied embeddings) with\n"
           "exact softmax, FAVOR+, FAVOR++, elu + 1 linear or local-window attention. Writes\n"
           "to DIR: checkpoint.safetensors (weights, AdamW moments, settings; written\n"
           "atomically), log.csv (one row per step, with validation loss, perplexity and\n"
           "next-byte accuracy on evaluation steps) and curves.png (scripts/plot_train.py).\n"
           "A progress line goes to stderr.\n"
           "\n"
           "data:                                                                 [default]\n"
           "  --task NAME         text: next-byte prediction on --data; mqar: associative\n"
           "                      recall sequences the tool generates (below)     [text]\n"
           "  --data NAME|FILE    proteins: Debian's mmseqs2-examples DB.fasta.gz (20,000\n"
           "                      UniProt sequences); bible: the King James text exported by\n"
           "                      the bible program (package bible-kjv; cached in DIR); or a\n"
           "                      FASTA or text file, gzip or plain                [proteins]\n"
           "  --format NAME       auto | fasta | text: how FILE is read           [auto]\n"
           "  --val-fraction F    documents held out for validation, by hash      [0.05]\n"
           "\n"
           "model:\n"
           "  --layers L          Transformer blocks                              [4]\n"
           "  --d-model C         width                                           [128]\n"
           "  --heads H           attention heads (C/H even for rotary)           [4]\n"
           "  --context T         sequence length of the training windows         [256]\n"
           "  --attention NAME    exact | favor | favor++ (OPRF features, A from a running\n"
           "                      average of training batches, frozen for evaluation) |\n"
           "                      local (exact softmax over the last --window keys) [exact]\n"
           "  --kernel NAME       FAVOR map: positive | hyperbolic | trig | relu | elu (elu(x)\n"
           "                      + 1 of q and k themselves: the linear attention of\n"
           "                      Katharopoulos et al.; features = d-model/heads, no W is\n"
           "                      drawn, so --redraw does not apply)                [positive]\n"
           "  --features M        FAVOR projections per layer                     [64]\n"
           "  --redraw N          a new FAVOR W every N steps, 0 = never          [1000]\n"
           "  --window W          local: query t sees keys t-W+1..t (W >= context: exact) [32]\n"
           "  --positions NAME    learned | rotary                                [learned]\n",
           cmd_train_synopsis);
    printf("\n"
           "training:\n"
           "  --steps S           optimizer steps                                 [1000]\n"
           "  --batch B           windows per step                                [8]\n"
           "  --lr LR             peak learning rate (AdamW)                      [1e-3]\n"
           "  --lr-min LR         final learning rate of the cosine               [lr/10]\n"
           "  --warmup W          linear warm-up steps                            [100]\n"
           "  --weight-decay WD   decoupled decay of matrices and embeddings      [0.1]\n"
           "  --clip G            clip the gradient's global norm to G, 0 = off   [1.0]\n"
           "  --eval-every N      evaluate every N steps (and at the end)         [100]\n"
           "  --eval-batches N    validation batches per evaluation (fixed ones)  [8]\n"
           "  --checkpoint-every N  write the checkpoint every N steps            [eval-every]\n"
           "  --seed S            the default of the three seeds below            [1]\n"
           "  --data-seed S       the batches (order and windows; MQAR: the sequences and the\n"
           "                      validation set)                                 [seed]\n"
           "  --init-seed S       the initial weights                             [seed]\n"
           "  --w-seed S          FAVOR's W, every redraw (favor, favor++)        [seed]\n"
           "  --threads N         threads, 0 = OpenMP's default; results do not depend on it [0]\n"
           "  --log-every N       without a terminal, a progress line every N steps [steps/20]\n"
           "  --no-plot           do not draw curves.png\n"
           "\n"
           "continuing:\n"
           "  --resume            continue DIR's run from its checkpoint with its saved\n"
           "                      settings (only --threads, --log-every, --no-plot,\n"
           "                      --stop-after and --parallel may be given); the result is\n"
           "                      bit for bit that of an uninterrupted run (with the same\n"
           "                      number of ranks)\n"
           "  --stop-after N      stop after step N with a checkpoint, as if killed there\n");
    printf("\n"
           "starting from another model's weights:\n"
           "  --init-from CKPT    a new run (not --resume) whose weights start as those of the\n"
           "                      checkpoint CKPT, in this run's configuration: carried are\n"
           "                      every trained tensor (embeddings, positions, layer norms,\n"
           "                      qkv, projections, MLP); new are FAVOR's W (drawn from this\n"
           "                      run's --w-seed), FAVOR++'s running statistic, the AdamW\n"
           "                      moments (0) and the step count (0). --attention, --kernel,\n"
           "                      --features, --redraw, the seeds (--init-seed has nothing to\n"
           "                      seed: refused), --task and the training flags are this\n"
           "                      run's (defaults as above). --layers, --d-model, --heads\n"
           "                      and --positions are CKPT's: leave them out, or give the\n"
           "                      same values. --context is CKPT's unless given: another\n"
           "                      one carries learned positions row t from CKPT's row t mod\n"
           "                      its context (a longer window repeats its rows, as\n"
           "                      Longformer extended RoBERTa's; a curriculum from short\n"
           "                      windows to long ones). The checkpoint's path, CRC-32 and\n"
           "                      step go into this run's metadata (run.init_from*).\n"
           "                      --steps 0 evaluates only: log row 0 and a checkpoint\n"
           "  --fit-batches N     --attention favor++: before step 0's evaluation, fit A (the\n"
           "                      running statistic) on N training batches, changing no weight\n"
           "                      [0]\n");
    printf("\n"
           "multi-query associative recall (--task mqar):\n"
           "  --mqar-pairs N      key-value pairs per window, at most K           [8]\n"
           "  --mqar-queries Q    queries per window (every N ask each key once);\n"
           "                      2N + 2Q must not exceed --context               [N]\n"
           "  --mqar-keys K       key bytes, and as many value bytes: 1..127      [64]\n"
           "\n"
           "--task mqar is MQAR, the recall task of the Zoology study of efficient attention\n"
           "(Arora et al. 2023), on bytes. Each window of --context bytes starts with N\n"
           "key-value pairs k1 v1 ... kN vN (keys: bytes 0..K-1, values: bytes K..2K-1; each\n"
           "distinct within the window); then come Q queries, each a key seen earlier\n"
           "(every N queries ask each key once, in random order) whose next byte must be\n"
           "its value; every other byte is filler (2K..255). The queries take slots of two\n"
           "bytes after the pairs, slot g drawn with weight 1/(g+1) as in Zoology. Only the\n"
           "answers count in the loss; each evaluation reports the accuracy on them (the\n"
           "argmax of the logits is the value): column val_answer_acc of log.csv, whose\n"
           "val_acc stays empty. No --data, --format or --val-fraction: the windows are a\n"
           "function of (--data-seed, step, index), and the validation set is a fixed set of\n"
           "its own.\n");
    printf("\n"
           "across processes (mpirun -np N performer train ...; Open MPI):\n"
           "  --parallel KIND     data: each rank trains whole windows of every batch (--batch\n"
           "                      >= N); sequence: each a slice of every window (--context >=\n"
           "                      N; FAVOR attention only, which exchanges only its states).\n"
           "                      Gradients are summed in rank order: every rank holds the\n"
           "                      same model, equal to one process's to float rounding. Rank 0\n"
           "                      writes DIR's files; --resume works the same. Required under\n"
           "                      mpirun with more than one rank; alone it changes nothing\n"
           "\n"
           "Files: --data must be a regular file of at most 2 GiB (also once inflated). The\n"
           "files in DIR are replaced atomically and must be regular files or absent (a\n"
           "symbolic link or device there is refused); one run at a time holds DIR (locked\n"
           "with flock). A run that fails before its first checkpoint leaves\n"
           "no folder it made behind, and an existing log.csv as it was.\n"
           "\n"
           "Exit status: 0 success, 1 bad data or a failed run, 2 bad command line.\n");
}

/* The shape flags, which --init-from checks against (or takes from) the checkpoint. */
enum { SHAPE_LAYERS = 1, SHAPE_D_MODEL = 2, SHAPE_HEADS = 4, SHAPE_CONTEXT = 8, SHAPE_POSITIONS = 16 };

enum { TASK_TEXT = 0, TASK_MQAR = 1 };

typedef struct train_cfg {
    const char *out, *data;
    int format; /* pf_corpus_format */
    double val_fraction;
    int task;           /* TASK_TEXT or TASK_MQAR */
    pf_mqar mqar;       /* --task mqar's settings */
    uint64_t data_seed; /* the batches'; model.seed the initial weights', model.w_seed W's */
    pf_model_config model;
    int steps, batch, warmup, eval_every, eval_batches, checkpoint_every;
    double lr, lr_min, weight_decay, clip;
    int threads, log_every, no_plot, resume, stop_after;
    const char *init_from; /* --init-from: the checkpoint whose weights start the run */
    int fit_batches;       /* --fit-batches */
    unsigned shapes_given; /* SHAPE_* flags given on the command line */
    int parallel;          /* -1: not given; 0 data, 1 sequence (PF_MPI_DATA, PF_MPI_SEQUENCE) */
    int explicit_settings; /* a model or training flag was given */
    int features_given;    /* --features was given (elu takes d-model/heads otherwise) */
    int task_given;        /* --task was given */
} train_cfg;

/* ---- command line -------------------------------------------------------------------------- */

/* The run's numeric settings: one flag and one checkpoint key each, and one range for both, so
 * a resumed run checks what it reads exactly as the command line would have. */
typedef struct run_setting {
    const char *flag, *key;
    int is_int;
    double lo, hi;
    int lo_open;
    size_t off; /* of the int or double in train_cfg */
} run_setting;

static const run_setting settings[] = {
    /* (0, evaluate only, is for --init-from: parse_args checks) */
    {"--steps", "run.steps", 1, 0, INT_MAX, 0, offsetof(train_cfg, steps)},
    {"--batch", "run.batch", 1, 1, 1 << 20, 0, offsetof(train_cfg, batch)},
    {"--warmup", "run.warmup", 1, 0, INT_MAX, 0, offsetof(train_cfg, warmup)},
    {"--eval-every", "run.eval_every", 1, 1, INT_MAX, 0, offsetof(train_cfg, eval_every)},
    {"--eval-batches", "run.eval_batches", 1, 1, 1 << 20, 0, offsetof(train_cfg, eval_batches)},
    {"--checkpoint-every", "run.checkpoint_every", 1, 1, INT_MAX, 0,
     offsetof(train_cfg, checkpoint_every)},
    {"--val-fraction", "run.val_fraction", 0, 0, 0.5, 1, offsetof(train_cfg, val_fraction)},
    {"--lr", "run.lr", 0, 0, 10, 1, offsetof(train_cfg, lr)},
    {"--lr-min", "run.lr_min", 0, 0, 10, 0, offsetof(train_cfg, lr_min)},
    {"--weight-decay", "run.weight_decay", 0, 0, 10, 0, offsetof(train_cfg, weight_decay)},
    {"--clip", "run.clip", 0, 0, 1e30, 0, offsetof(train_cfg, clip)},
};
enum { N_SETTINGS = (int)(sizeof(settings) / sizeof(settings[0])) };

/* Parses s into c's field for setting k; as name in messages. 1 on success. */
static int parse_setting(tool_args *a, train_cfg *c, int k, const char *name, const char *s) {
    const run_setting *t = &settings[k];
    char *field = (char *)c + t->off;
    if (t->is_int)
        return tool_parse_int(a, name, s, (long)t->lo, (long)t->hi, (int *)(void *)field);
    return tool_parse_double(a, name, s, t->lo, t->hi, t->lo_open, (double *)(void *)field);
}

/* What --parallel needs of the run's settings (the number of ranks included): 0, or a usage
 * error already reported. */
static int parallel_check(const train_cfg *c) {
    const int n = tool_mpi_size();
    if (n > 1 && c->parallel < 0)
        return tool_usage(CMD, "%d ranks: --parallel data or --parallel sequence says how they "
                               "share each step",
                          n);
    if (c->parallel == 1 && c->model.attention != PF_LM_FAVOR)
        return tool_usage(CMD, "--parallel sequence needs --attention favor: %s",
                          c->model.attention == PF_LM_EXACT
                              ? "exact attention's queries need every key of the window"
                          : c->model.attention == PF_LM_LOCAL
                              ? "local attention's queries need the keys before their slice"
                              : "FAVOR++'s running statistic would be each rank's own");
    if (n > 1 && c->parallel == 0 && c->model.attention == PF_LM_FAVORPP)
        return tool_usage(CMD, "--attention favor++ does not train across ranks: its running "
                               "statistic of q and k would be each rank's own");
    if (n > 1 && c->parallel == 0 && c->batch < n)
        return tool_usage(CMD, "--parallel data over %d ranks needs --batch >= %d (whole windows "
                               "per rank), not %d",
                          n, n, c->batch);
    if (n > 1 && c->parallel == 1 && c->model.context < n)
        return tool_usage(CMD, "--parallel sequence over %d ranks needs --context >= %d, not %d",
                          n, n, c->model.context);
    return 0;
}

/* --task mqar: its flags against the others (before the context is known for certain, which
 * --init-from may take from its checkpoint: mqar_fits). 0, or a usage error already reported. */
static int task_check(train_cfg *c, const tool_args *a) {
    static const char *const mqar_flags[] = {"--mqar-pairs", "--mqar-queries", "--mqar-keys"};
    static const char *const text_flags[] = {"--data", "--format", "--val-fraction"};
    for (int k = 0; k < 3; k++) {
        if (c->task == TASK_TEXT && tool_given(a, mqar_flags[k]))
            return tool_usage(CMD, "%s is for --task mqar", mqar_flags[k]);
        if (c->task == TASK_MQAR && tool_given(a, text_flags[k]))
            return tool_usage(CMD, "--task mqar generates its own sequences: %s is for --task "
                                   "text",
                              text_flags[k]);
    }
    if (c->task != TASK_MQAR) return 0;
    c->data = "mqar";
    if (!tool_given(a, "--mqar-queries")) c->mqar.queries = c->mqar.pairs;
    if (c->mqar.pairs > c->mqar.keys)
        return tool_usage(CMD, "--mqar-pairs %d needs %d distinct keys, but --mqar-keys is %d",
                          c->mqar.pairs, c->mqar.pairs, c->mqar.keys);
    return 0;
}

/* --task mqar: the pairs and queries fit the context (2N + 2Q <= T). 0, or a usage error
 * already reported. */
static int mqar_fits(const train_cfg *c) {
    const pf_mqar *q = &c->mqar;
    if (pf_mqar_check(q, c->model.context) == PF_OK) return 0;
    return tool_usage(CMD, "--mqar-pairs %d and --mqar-queries %d need a context of at least %d "
                           "(2 per pair, 2 per query), not %d",
                      q->pairs, q->queries, 2 * q->pairs + 2 * q->queries, c->model.context);
}

static int parse_args(train_cfg *c, int argc, char **argv) {
    static const char *const atts[] = {"exact", "favor", "favor++", "local", NULL};
    static const pf_lm_attention att_of[] = {PF_LM_EXACT, PF_LM_FAVOR, PF_LM_FAVORPP, PF_LM_LOCAL};
    static const char *const kernels[] = {"positive", "hyperbolic", "trig", "relu",
                                          "elu",      "elu+1",      NULL};
    static const char *const poss[] = {"learned", "rotary", NULL};
    static const char *const formats[] = {"auto", "fasta", "text", NULL};
    static const char *const parallels[] = {"data", "sequence", NULL};
    static const char *const tasks[] = {"text", "mqar", NULL};
    int lr_min_given = 0, ckpt_given = 0;
    uint64_t seed = c->model.seed, seeds[3] = {0, 0, 0}; /* --data-seed, --init-seed, --w-seed */
    tool_args a;
    tool_args_init(&a, CMD, argc, argv);
    while (tool_next(&a)) {
        const char *v = NULL;
        int idx, setting = 1;
        pf_model_config *m = &c->model;
        int k = 0;
        while (k < N_SETTINGS && !tool_opt(&a, settings[k].flag, &v)) k++;
        if (k < N_SETTINGS) {
            if (v) parse_setting(&a, c, k, settings[k].flag, v);
            lr_min_given |= strcmp(settings[k].flag, "--lr-min") == 0;
            ckpt_given |= strcmp(settings[k].flag, "--checkpoint-every") == 0;
        } else if (tool_path_opt(&a, "--out", &v)) {
            c->out = v;
            setting = 0;
        } else if (tool_path_opt(&a, "--data", &v)) {
            c->data = v;
        } else if (tool_opt(&a, "--format", &v)) {
            if (v && (idx = tool_parse_choice(&a, "--format", v, formats)) >= 0) c->format = idx;
        } else if (tool_opt(&a, "--layers", &v)) {
            if (v) tool_parse_int(&a, "--layers", v, 1, PF_LM_MAX_LAYERS, &m->layers);
        } else if (tool_opt(&a, "--d-model", &v)) {
            if (v) tool_parse_int(&a, "--d-model", v, 1, PF_LM_MAX_D_MODEL, &m->d_model);
        } else if (tool_opt(&a, "--heads", &v)) {
            if (v) tool_parse_int(&a, "--heads", v, 1, PF_LM_MAX_D_MODEL, &m->heads);
        } else if (tool_opt(&a, "--context", &v)) {
            if (v) tool_parse_int(&a, "--context", v, 1, PF_LM_MAX_CONTEXT, &m->context);
        } else if (tool_opt(&a, "--attention", &v)) {
            if (v && (idx = tool_parse_choice(&a, "--attention", v, atts)) >= 0)
                m->attention = att_of[idx];
        } else if (tool_opt(&a, "--kernel", &v)) {
            if (v && tool_parse_choice(&a, "--kernel", v, kernels) >= 0 &&
                pf_kernel_parse(v, &m->kernel) != PF_OK) {
                tool_fail(CMD, "--kernel: '%s' is not known to this library", v);
                a.failed = 1;
            }
        } else if (tool_opt(&a, "--features", &v)) {
            if (v) tool_parse_int(&a, "--features", v, 1, PF_LM_MAX_FEATURES, &m->features);
            c->features_given = 1;
        } else if (tool_opt(&a, "--window", &v)) {
            if (v) tool_parse_int(&a, "--window", v, 1, PF_LM_MAX_CONTEXT, &m->window);
        } else if (tool_opt(&a, "--redraw", &v)) {
            if (v) tool_parse_int(&a, "--redraw", v, 0, INT_MAX, &m->redraw);
        } else if (tool_opt(&a, "--positions", &v)) {
            if (v && (idx = tool_parse_choice(&a, "--positions", v, poss)) >= 0)
                m->positions = idx == 0 ? PF_LM_LEARNED : PF_LM_ROTARY;
        } else if (tool_opt(&a, "--seed", &v)) {
            if (v) tool_parse_u64(&a, "--seed", v, &seed);
        } else if (tool_opt(&a, "--data-seed", &v)) {
            if (v) tool_parse_u64(&a, "--data-seed", v, &seeds[0]);
        } else if (tool_opt(&a, "--init-seed", &v)) {
            if (v) tool_parse_u64(&a, "--init-seed", v, &seeds[1]);
        } else if (tool_opt(&a, "--w-seed", &v)) {
            if (v) tool_parse_u64(&a, "--w-seed", v, &seeds[2]);
        } else if (tool_opt(&a, "--task", &v)) {
            if (v && (idx = tool_parse_choice(&a, "--task", v, tasks)) >= 0) c->task = idx;
            c->task_given = 1;
        } else if (tool_opt(&a, "--mqar-pairs", &v)) {
            if (v) tool_parse_int(&a, "--mqar-pairs", v, 1, 127, &c->mqar.pairs);
        } else if (tool_opt(&a, "--mqar-queries", &v)) {
            if (v)
                tool_parse_int(&a, "--mqar-queries", v, 1, PF_LM_MAX_CONTEXT / 2,
                               &c->mqar.queries);
        } else if (tool_opt(&a, "--mqar-keys", &v)) {
            if (v) tool_parse_int(&a, "--mqar-keys", v, 1, 127, &c->mqar.keys);
        } else if (tool_opt(&a, "--threads", &v)) {
            if (v) tool_parse_int(&a, "--threads", v, 0, PF_MAX_THREADS, &c->threads);
            setting = 0;
        } else if (tool_opt(&a, "--log-every", &v)) {
            if (v) tool_parse_int(&a, "--log-every", v, 1, INT_MAX, &c->log_every);
            setting = 0;
        } else if (tool_opt(&a, "--stop-after", &v)) {
            if (v) tool_parse_int(&a, "--stop-after", v, 1, INT_MAX, &c->stop_after);
            setting = 0;
        } else if (tool_flag(&a, "--no-plot")) {
            c->no_plot = 1;
            setting = 0;
        } else if (tool_flag(&a, "--resume")) {
            c->resume = 1;
            setting = 0;
        } else if (tool_path_opt(&a, "--init-from", &v)) {
            c->init_from = v;
        } else if (tool_opt(&a, "--fit-batches", &v)) {
            if (v) tool_parse_int(&a, "--fit-batches", v, 0, 1 << 20, &c->fit_batches);
        } else if (tool_opt(&a, "--parallel", &v)) {
            if (v && (idx = tool_parse_choice(&a, "--parallel", v, parallels)) >= 0)
                c->parallel = idx;
            setting = 0;
        } else {
            return tool_unknown(&a);
        }
        if (setting) c->explicit_settings = 1;
    }
    if (a.failed) return TOOL_EXIT_USAGE;
    if (!c->out) return tool_usage(CMD, "missing --out DIR");
    if (c->resume && c->init_from)
        return tool_usage(CMD, "--init-from starts a new run from another checkpoint's weights; "
                               "--resume continues DIR's own run: give one or the other");
    if (c->resume && c->explicit_settings)
        return tool_usage(CMD, "--resume continues with the checkpoint's settings; give only "
                               "--out, --threads, --log-every, --no-plot, --stop-after or "
                               "--parallel");
    if (c->steps == 0 && !c->init_from)
        return tool_usage(CMD, "--steps: expected a positive integer, got '0' (0 evaluates "
                               "only: for --init-from)");
    if (c->fit_batches > 0 && c->model.attention != PF_LM_FAVORPP)
        return tool_usage(CMD, "--fit-batches fits FAVOR++'s A: it is for --attention favor++");
    static const struct {
        const char *flag;
        unsigned bit;
    } shape_flags[] = {{"--layers", SHAPE_LAYERS},
                       {"--d-model", SHAPE_D_MODEL},
                       {"--heads", SHAPE_HEADS},
                       {"--context", SHAPE_CONTEXT},
                       {"--positions", SHAPE_POSITIONS}};
    for (int k = 0; k < 5; k++)
        if (tool_given(&a, shape_flags[k].flag)) c->shapes_given |= shape_flags[k].bit;
    /* the three seeds: each its flag's, or --seed's (which alone gives the bits of the days
     * before they were apart) */
    c->data_seed = tool_given(&a, "--data-seed") ? seeds[0] : seed;
    c->model.seed = tool_given(&a, "--init-seed") ? seeds[1] : seed;
    c->model.w_seed = tool_given(&a, "--w-seed") ? seeds[2] : seed;
    if (c->init_from && tool_given(&a, "--init-seed"))
        return tool_usage(CMD, "--init-seed seeds the initial weights; with --init-from they are "
                               "the checkpoint's: leave it out");
    if (task_check(c, &a) != 0) return TOOL_EXIT_USAGE;
    if (!lr_min_given) c->lr_min = c->lr / 10;
    if (c->lr_min > c->lr) return tool_usage(CMD, "--lr-min must not exceed --lr");
    if (!ckpt_given) c->checkpoint_every = c->eval_every;
    /* (with --init-from the shapes are the checkpoint's: checked once it is read) */
    if (!c->init_from && c->model.d_model % c->model.heads != 0)
        return tool_usage(CMD, "--d-model %d is not a multiple of --heads %d", c->model.d_model,
                          c->model.heads);
    if (!c->init_from && c->model.positions == PF_LM_ROTARY &&
        (c->model.d_model / c->model.heads) % 2)
        return tool_usage(CMD, "rotary positions need an even head width (d-model/heads)");
    /* flags the chosen settings do not use are refused, not ignored */
    static const char *const favor_flags[] = {"--kernel", "--features", "--redraw", "--w-seed"};
    const int no_favor = c->model.attention == PF_LM_EXACT || c->model.attention == PF_LM_LOCAL;
    for (int k = 0; k < 4 && no_favor; k++) {
        if (tool_given(&a, favor_flags[k]))
            return tool_usage(CMD, "%s is for --attention favor or favor++; %s attention does "
                                   "not use it",
                              favor_flags[k],
                              c->model.attention == PF_LM_EXACT ? "exact" : "local");
    }
    if (c->model.attention != PF_LM_LOCAL && tool_given(&a, "--window"))
        return tool_usage(CMD, "--window is for --attention local");
    for (int k = 2; k < 4 && c->model.attention == PF_LM_FAVOR &&
                    c->model.kernel == PF_KERNEL_ELU;
         k++)
        if (tool_given(&a, favor_flags[k]))
            return tool_usage(CMD, "--kernel elu draws no W (it maps q and k themselves): %s "
                                   "does not apply",
                              favor_flags[k]);
    if (c->model.attention == PF_LM_FAVORPP && tool_given(&a, "--kernel"))
        return tool_usage(CMD, "--attention favor++ has its own feature map (OPRF): --kernel is "
                               "for --attention favor");
    /* (a resumed run's attention and sizes, and those taken --init-from, are checked once the
     * checkpoint is read) */
    if (!c->resume && !c->init_from && parallel_check(c) != 0) return TOOL_EXIT_USAGE;
    if (!c->init_from && c->task == TASK_MQAR && mqar_fits(c) != 0) return TOOL_EXIT_USAGE;
    if (tool_given(&a, "--format") && (strcmp(c->data, "proteins") == 0 || strcmp(c->data, "bible") == 0))
        return tool_usage(CMD, "--format is for --data FILE; --data %s has a format of its own",
                          c->data);
    return TOOL_EXIT_OK;
}

/* ---- settings in the checkpoint's metadata ----------------------------------------------- */

/* (values up to a path's length: run.data and run.init_from are file names) */
enum { NRUN = 32, RUN_VAL = PATH_MAX + 64 };
typedef struct run_meta {
    char val[NRUN][RUN_VAL];
    const char *kv[2 * NRUN + 1];
} run_meta;

/* Where a run started from (--init-from), kept in every checkpoint of the run (run.init_from*):
 * set from the command line, or read back by a resumed run. */
typedef struct init_record {
    char path[PATH_MAX];
    char crc32[9];
    char step[32];
    char fit[32]; /* --fit-batches, or "" */
} init_record;
static init_record init_rec;

static void meta_set(run_meta *r, int i, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void meta_set(run_meta *r, int i, const char *key, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->val[i], sizeof(r->val[i]), fmt, ap);
    va_end(ap);
    r->kv[2 * i] = key;
    r->kv[2 * i + 1] = r->val[i];
    r->kv[2 * i + 2] = NULL;
}

/* The run's settings and counters as "run.*" metadata (doubles printed to round-trip). */
static void make_meta(run_meta *r, const train_cfg *c, uint64_t data_hash, double elapsed,
                      int64_t tokens) {
    int i = 0;
    meta_set(r, i++, "run.data", "%s", c->data);
    meta_set(r, i++, "run.format", "%d", c->format);
    meta_set(r, i++, "run.val_fraction", "%.17g", c->val_fraction);
    meta_set(r, i++, "run.steps", "%d", c->steps);
    meta_set(r, i++, "run.batch", "%d", c->batch);
    meta_set(r, i++, "run.lr", "%.17g", c->lr);
    meta_set(r, i++, "run.lr_min", "%.17g", c->lr_min);
    meta_set(r, i++, "run.warmup", "%d", c->warmup);
    meta_set(r, i++, "run.weight_decay", "%.17g", c->weight_decay);
    meta_set(r, i++, "run.clip", "%.17g", c->clip);
    meta_set(r, i++, "run.eval_every", "%d", c->eval_every);
    meta_set(r, i++, "run.eval_batches", "%d", c->eval_batches);
    meta_set(r, i++, "run.checkpoint_every", "%d", c->checkpoint_every);
    meta_set(r, i++, "run.data_hash", "%016llx", (unsigned long long)data_hash);
    meta_set(r, i++, "run.elapsed", "%.17g", elapsed);
    meta_set(r, i++, "run.tokens", "%lld", (long long)tokens);
    /* (pf.seed and pf.w_seed are the model's own) */
    meta_set(r, i++, "run.data_seed", "%llu", (unsigned long long)c->data_seed);
    meta_set(r, i++, "run.task", "%s", c->task == TASK_MQAR ? "mqar" : "text");
    if (c->task == TASK_MQAR) {
        meta_set(r, i++, "run.mqar_pairs", "%d", c->mqar.pairs);
        meta_set(r, i++, "run.mqar_queries", "%d", c->mqar.queries);
        meta_set(r, i++, "run.mqar_keys", "%d", c->mqar.keys);
    }
    if (init_rec.path[0]) {
        meta_set(r, i++, "run.init_from", "%s", init_rec.path);
        meta_set(r, i++, "run.init_from_crc32", "%s", init_rec.crc32);
        meta_set(r, i++, "run.init_from_step", "%s", init_rec.step);
        meta_set(r, i++, "run.init_from_carried", "%s",
                 "every trained tensor: wte, wpe (row t from row t mod the source's context), "
                 "blocks.*, lnf.*");
        meta_set(r, i++, "run.init_from_new", "%s",
                 "favor.W from pf.w_seed, favorpp.rho, AdamW moments, step");
        if (init_rec.fit[0]) meta_set(r, i++, "run.fit_batches", "%s", init_rec.fit);
    }
}

/* A resumed run's data seed and task (run.data_seed, run.task, run.mqar_*), each checked as its
 * flag would be. A checkpoint written before they existed has neither: its batches came from
 * pf.seed, its task was text. 0 or an exit code. */
static int task_from_meta(train_cfg *c, const pf_model *m, const char *path, tool_args *a) {
    char name[4400];
    const char *ds = pf_model_meta(m, "run.data_seed"), *task = pf_model_meta(m, "run.task");
    c->data_seed = c->model.seed;
    snprintf(name, sizeof(name), "%s: run.data_seed", path);
    if (ds && !tool_parse_u64(a, name, ds, &c->data_seed)) return TOOL_EXIT_FAIL;
    c->task = TASK_TEXT;
    if (!task || strcmp(task, "text") == 0) return 0;
    if (strcmp(task, "mqar") != 0)
        return tool_fail(CMD, "%s: run.task '%.40s' is neither text nor mqar", path, task);
    c->task = TASK_MQAR;
    static const char *const keys[] = {"run.mqar_pairs", "run.mqar_queries", "run.mqar_keys"};
    int *const fields[] = {&c->mqar.pairs, &c->mqar.queries, &c->mqar.keys};
    for (int k = 0; k < 3; k++) {
        const char *v = pf_model_meta(m, keys[k]);
        if (!v) return tool_fail(CMD, "%s: %s missing (run.task is mqar)", path, keys[k]);
        snprintf(name, sizeof(name), "%s: %s", path, keys[k]);
        if (!tool_parse_int(a, name, v, 1, k == 1 ? PF_LM_MAX_CONTEXT / 2 : 127, fields[k]))
            return TOOL_EXIT_FAIL;
    }
    if (pf_mqar_check(&c->mqar, c->model.context) != PF_OK)
        return tool_fail(CMD, "%s: run.mqar_pairs %d, run.mqar_queries %d and run.mqar_keys %d "
                              "do not make a task for pf.context %d",
                         path, c->mqar.pairs, c->mqar.queries, c->mqar.keys, c->model.context);
    return 0;
}

/* Restores the settings of a resumed run from the checkpoint at path, each checked as its
 * flag would be (settings[]), the key named in any message. 0 or an exit code. */
static int settings_from_meta(train_cfg *c, const pf_model *m, const char *path,
                              uint64_t *data_hash, double *elapsed, int64_t *tokens) {
    static char data[4096];
    const char *keys[] = {"run.data", "run.data_hash", "run.tokens", "run.format", "run.elapsed"};
    const char *val[5];
    for (int i = 0; i < 5; i++) {
        val[i] = pf_model_meta(m, keys[i]);
        if (!val[i])
            return tool_fail(CMD,
                             "%s: %s missing: not a checkpoint of `performer train` (run.* "
                             "settings missing)",
                             path, keys[i]);
    }
    char name[4400];
    tool_args a;
    tool_args_init(&a, CMD, 0, NULL);
    for (int k = 0; k < N_SETTINGS; k++) {
        const char *s = pf_model_meta(m, settings[k].key);
        snprintf(name, sizeof(name), "%s: %s (as %s)", path, settings[k].key, settings[k].flag);
        if (!s) return tool_fail(CMD, "%s: %s missing", path, settings[k].key);
        if (!parse_setting(&a, c, k, name, s)) return TOOL_EXIT_FAIL;
    }
    uint64_t hash = 0;
    const char *h = val[1];
    int hex = strlen(h) == 16;
    for (int i = 0; hex && i < 16; i++) {
        int d = h[i] >= '0' && h[i] <= '9' ? h[i] - '0' : h[i] >= 'a' && h[i] <= 'f' ? h[i] - 'a' + 10 : -1;
        hex = d >= 0;
        hash = hash << 4 | (uint64_t)(d & 15);
    }
    if (!hex) return tool_fail(CMD, "%s: run.data_hash '%s' is not 16 hex digits", path, h);
    uint64_t ntok;
    int fmt;
    snprintf(name, sizeof(name), "%s: run.tokens", path);
    if (!tool_parse_u64(&a, name, val[2], &ntok) || ntok > INT64_MAX) return TOOL_EXIT_FAIL;
    snprintf(name, sizeof(name), "%s: run.format", path);
    if (!tool_parse_int(&a, name, val[3], PF_CORPUS_AUTO, PF_CORPUS_TEXT, &fmt))
        return TOOL_EXIT_FAIL;
    snprintf(name, sizeof(name), "%s: run.elapsed", path);
    if (!tool_parse_double(&a, name, val[4], 0, 1e12, 0, elapsed)) return TOOL_EXIT_FAIL;
    if (!val[0][0] || strlen(val[0]) >= sizeof(data))
        return tool_fail(CMD, "%s: run.data is empty or too long", path);
    if (c->lr_min > c->lr)
        return tool_fail(CMD, "%s: run.lr_min %g exceeds run.lr %g", path, c->lr_min, c->lr);
    if (pf_model_steps(m) > c->steps)
        return tool_fail(CMD, "%s: pf.step %lld is beyond run.steps %d", path,
                         (long long)pf_model_steps(m), c->steps);
    if (ntok > (uint64_t)INT64_MAX / 4)
        return tool_fail(CMD, "%s: run.tokens %llu is out of range", path, (unsigned long long)ntok);
    /* a run started --init-from keeps saying so */
    const char *ip = pf_model_meta(m, "run.init_from");
    const char *ih = pf_model_meta(m, "run.init_from_crc32");
    const char *is = pf_model_meta(m, "run.init_from_step");
    const char *ifit = pf_model_meta(m, "run.fit_batches");
    if (ip && ih && is && strlen(ip) < sizeof(init_rec.path) && strlen(ih) == 8 &&
        strlen(is) < sizeof(init_rec.step) && (!ifit || strlen(ifit) < sizeof(init_rec.fit))) {
        snprintf(init_rec.path, sizeof(init_rec.path), "%s", ip);
        snprintf(init_rec.crc32, sizeof(init_rec.crc32), "%s", ih);
        snprintf(init_rec.step, sizeof(init_rec.step), "%s", is);
        snprintf(init_rec.fit, sizeof(init_rec.fit), "%s", ifit ? ifit : "");
    } else if (ip) {
        return tool_fail(CMD, "%s: run.init_from* are incomplete or malformed", path);
    }
    snprintf(data, sizeof(data), "%s", val[0]);
    c->data = data;
    c->format = fmt;
    *data_hash = hash;
    *tokens = (int64_t)ntok;
    c->model = pf_model_get_config(m);
    return task_from_meta(c, m, path, &a);
}

/* ---- data -------------------------------------------------------------------------------- */

/* Exports the Bible with `bible` into path (verse text only, one verse per line), atomically. */
static int export_bible(const char *path) {
    tool_text t;
    int rc = tool_text_begin(&t, CMD, path);
    if (rc) return rc;
    /* -f turns pretty-printing off: one verse per line, "Ge1:1 In the beginning..." */
    FILE *in = popen("bible -f Ge1:1-Re22:21 2>/dev/null", "r");
    if (!in) {
        tool_text_end(&t, path, 0);
        return tool_fail(CMD, "cannot run the bible program: %s", strerror(errno));
    }
    char line[65536];
    long verses = 0;
    while (fgets(line, sizeof(line), in)) {
        char *sp = strchr(line, ' ');
        if (!sp) continue;
        fputs(sp + 1, t.f);
        verses++;
    }
    int ok = pclose(in) == 0 && verses >= 30000;
    rc = tool_text_end(&t, path, ok);
    if (!ok)
        return tool_fail(CMD,
                         "exporting the Bible failed (%ld verses): is the bible program "
                         "installed? (Debian package bible-kjv; scripts/setup.sh)",
                         verses);
    return rc;
}

/* The file for --data; may export the Bible. 0 or an exit code. */
static int data_path(const train_cfg *c, char *path, size_t cap, int *format) {
    *format = c->format;
    if (strcmp(c->data, "proteins") == 0) {
        snprintf(path, cap, "%s", PROTEINS);
        if (access(path, R_OK) != 0)
            return tool_fail(CMD,
                             "%s: %s; it comes with Debian's mmseqs2-examples package "
                             "(scripts/setup.sh installs it)",
                             path, strerror(errno));
        *format = PF_CORPUS_FASTA;
    } else if (strcmp(c->data, "bible") == 0) {
        snprintf(path, cap, "%s/bible-kjv.txt", c->out);
        struct stat sb;
        if (stat(path, &sb) != 0 || sb.st_size == 0) {
            fprintf(stderr, "performer train: exporting the King James Bible to %s\n", path);
            int rc = export_bible(path);
            if (rc) return rc;
        }
        *format = PF_CORPUS_TEXT;
    } else {
        snprintf(path, cap, "%s", c->data);
    }
    return 0;
}

/* ---- the log ----------------------------------------------------------------------------- */

/* MQAR runs have a tenth column, the accuracy on the answers (their val_acc, next-byte
 * accuracy over every position, is empty: only the answers have targets). */
static const char *log_header(const train_cfg *c) {
    return c->task == TASK_MQAR ? "step,lr,train_loss,grad_norm,tokens_per_s,elapsed_s,val_loss,"
                                  "val_ppl,val_acc,val_answer_acc\n"
                                : "step,lr,train_loss,grad_norm,tokens_per_s,elapsed_s,val_loss,"
                                  "val_ppl,val_acc\n";
}

/* Keeps the header and the rows of steps <= step (a resumed run rewrites what came after the
 * checkpoint), atomically. 0 or an exit code. */
static int truncate_log(const char *path, const char *header, int64_t step) {
    char msg[1024];
    int64_t size;
    pf_status st;
    int fd = pf_io_open_regular(path, &size, &st, msg, sizeof(msg));
    FILE *in = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (fd >= 0 && !in) close(fd);
    tool_text t;
    int rc = tool_text_begin(&t, CMD, path);
    if (rc) {
        if (in) fclose(in);
        return rc;
    }
    fputs(header, t.f);
    char line[1024];
    while (in && fgets(line, sizeof(line), in)) {
        char *end;
        long long s = strtoll(line, &end, 10);
        if (end != line && *end == ',' && s <= step) fputs(line, t.f);
    }
    if (in) fclose(in);
    return tool_text_end(&t, path, 1);
}

/* ---- evaluation -------------------------------------------------------------------------- */

typedef struct eval_result {
    double loss, acc;
} eval_result;

/* A batch (B,T) of the run's data: windows of the corpus's split, or MQAR sequences (which
 * have no split: the validation set's streams are apart from the training steps'). */
static pf_status draw_batch(const train_cfg *c, const pf_corpus *cor, int split, int32_t *tok,
                            int32_t *tgt, uint64_t seed, uint64_t stream) {
    if (c->task == TASK_MQAR)
        return pf_mqar_batch(&c->mqar, tok, tgt, c->batch, c->model.context, seed, stream);
    return pf_corpus_batch(cor, split, tok, tgt, c->batch, c->model.context, seed, stream);
}

/* PERFORMER_TRAIN_DUMP (the header comment): the folder, or NULL. */
static const char *dump_dir(void) {
    const char *d = getenv("PERFORMER_TRAIN_DUMP");
    return d && d[0] ? d : NULL;
}

/* Writes n int32 (dt PF_I32) or float32 values of shape (ndim) to DIR/name.npy; a failure is a
 * message only (the dump is for tests, which notice a missing file). */
static void dump_array(const char *name, pf_dtype dt, const void *x, int ndim,
                       const int64_t *shape) {
    char path[4400], msg[1024];
    snprintf(path, sizeof(path), "%s/%s.npy", dump_dir(), name);
    pf_array arr = {.dtype = dt, .ndim = ndim, .data = (void *)x};
    for (int i = 0; i < ndim; i++) arr.shape[i] = shape[i];
    if (pf_npy_write(path, &arr, msg, sizeof(msg)) != PF_OK)
        fprintf(stderr, "performer train: PERFORMER_TRAIN_DUMP: %s\n", msg);
}

/* The first evaluation's batches and logits, for PERFORMER_TRAIN_DUMP: (E,B,T) and (E,B,T,256). */
typedef struct eval_dump {
    int32_t *tok, *tgt;
    float *logits;
} eval_dump;

/* Mean loss and accuracy over the fixed validation batches (each rank its share; the counts
 * summed over the ranks): next-byte accuracy over the positions that have a target (text:
 * every one; MQAR: the answers). With dump, the batches and logits are kept there too. */
static pf_status evaluate(pf_model *m, tool_team *tm, const pf_corpus *cor, const train_cfg *c,
                          uint64_t seed, int32_t *tok, int32_t *tgt, float *logits,
                          eval_result *r, eval_dump *dump) {
    const int B = c->batch, T = c->model.context;
    const size_t bt = (size_t)B * T;
    double loss = 0, counts[2] = {0, 0}; /* right, total */
    pf_status st = pf_model_set_training(m, 0);
    for (int i = 0; i < c->eval_batches && st == PF_OK; i++) {
        st = draw_batch(c, cor, PF_SPLIT_VAL, tok, tgt, seed, EVAL_STREAM + (uint64_t)i);
        float l = 0;
        if (st == PF_OK) st = tool_team_forward(tm, m, &l, logits, tok, tgt, B, T);
        if (st != PF_OK) break;
        loss += l;
        /* this rank's positions: rows b0.., positions t0.. of the batch */
        for (int b = 0; b < tm->nb; b++)
            for (int t = 0; t < tm->nt; t++) {
                const float *row = logits + ((size_t)b * tm->nt + t) * PF_LM_VOCAB;
                const int32_t want = tgt[(size_t)(tm->b0 + b) * T + tm->t0 + t];
                if (want < 0) continue; /* no target here (MQAR: not an answer) */
                int best = 0;
                for (int k = 1; k < PF_LM_VOCAB; k++) best = row[k] > row[best] ? k : best;
                counts[0] += best == want;
                counts[1]++;
            }
        if (dump) { /* (one process: the logits are the whole batch's) */
            memcpy(dump->tok + (size_t)i * bt, tok, sizeof(int32_t) * bt);
            memcpy(dump->tgt + (size_t)i * bt, tgt, sizeof(int32_t) * bt);
            memcpy(dump->logits + (size_t)i * bt * PF_LM_VOCAB, logits,
                   sizeof(float) * bt * PF_LM_VOCAB);
        }
    }
    /* (the same on every rank: a failure above was agreed on by the trainer) */
    if (st == PF_OK) st = tool_team_sum(tm, counts, 2);
    pf_status st2 = pf_model_set_training(m, 1);
    if (st == PF_OK) st = st2;
    r->loss = loss / c->eval_batches;
    r->acc = counts[1] > 0 ? counts[0] / counts[1] : 0;
    return st;
}

/* The evaluation columns of a log row, from ",val_loss" on, with its line end (text: val_loss,
 * val_ppl, val_acc; MQAR: val_acc empty, then val_answer_acc), or empty ones without ev. */
static void eval_columns(char *buf, size_t cap, const train_cfg *c, const eval_result *ev) {
    const int mqar = c->task == TASK_MQAR;
    if (!ev)
        snprintf(buf, cap, mqar ? ",,,,\n" : ",,,\n");
    else if (mqar)
        snprintf(buf, cap, ",%.6f,%.6f,,%.6f\n", ev->loss, exp(ev->loss), ev->acc);
    else
        snprintf(buf, cap, ",%.6f,%.6f,%.6f\n", ev->loss, exp(ev->loss), ev->acc);
}

/* ---- progress ---------------------------------------------------------------------------- */

static void fmt_time(char *buf, size_t cap, double s) {
    if (!(s >= 0) || s > 1e8) {
        snprintf(buf, cap, "?");
    } else if (s < 60) {
        snprintf(buf, cap, "%.0fs", s);
    } else if (s < 3600) {
        snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)s % 60);
    } else {
        snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    }
}

/* ---- plotting ---------------------------------------------------------------------------- */


/* "exact", "local, window 32", "linear elu+1", "FAVOR+ positive, m 64", "FAVOR++, m 64": the
 * attention in words. */
static const char *attention_desc(const pf_model_config *m, char *buf, size_t cap) {
    if (m->attention == PF_LM_EXACT)
        snprintf(buf, cap, "exact");
    else if (m->attention == PF_LM_LOCAL)
        snprintf(buf, cap, "local, window %d", m->window);
    else if (m->attention == PF_LM_FAVOR && m->kernel == PF_KERNEL_ELU)
        snprintf(buf, cap, "linear elu+1");
    else if (m->attention == PF_LM_FAVOR)
        snprintf(buf, cap, "FAVOR+ %s, m %d", pf_kernel_name(m->kernel), m->features);
    else
        snprintf(buf, cap, "FAVOR++, m %d", m->features);
    return buf;
}

static void plot(const train_cfg *c, const char *log_path) {
    char script[4200], png[4200], title[256], att[64];
    snprintf(png, sizeof(png), "%s/curves.png", c->out);
    char data[96];
    if (c->task == TASK_MQAR)
        snprintf(data, sizeof(data), "MQAR (%d pairs, %d queries, %d keys)", c->mqar.pairs,
                 c->mqar.queries, c->mqar.keys);
    else
        snprintf(data, sizeof(data), "%.95s", c->data);
    snprintf(title, sizeof(title), "%s, %s%s, %d layers, d_model %d, context %d", data,
             attention_desc(&c->model, att, sizeof(att)),
             c->model.positions == PF_LM_ROTARY ? ", rotary" : "", c->model.layers,
             c->model.d_model, c->model.context);
    const tool_plot_status st =
        tool_plot("plot_train.py", log_path, png, title, NULL, script, sizeof(script));
    if (st == TOOL_PLOT_NO_SCRIPT)
        fprintf(stderr, "performer train: scripts/plot_train.py not found: no plot\n");
    else if (st != TOOL_PLOT_OK)
        fprintf(stderr,
                "performer train: drawing %s failed (needs /usr/bin/python3 with "
                "matplotlib)\n",
                png);
    else
        printf("curves: %s\n", png);
}

/* The files a run writes in DIR. */
static const char *const run_files[] = {"checkpoint.safetensors", "log.csv", "curves.png",
                                        "bible-kjv.txt"};
enum { N_RUN_FILES = (int)(sizeof(run_files) / sizeof(run_files[0])) };

/* Removes the temporary files a killed run may have left ("checkpoint.safetensors.tmp.XXXXXX"
 * and the like, see pf_io_atomic_begin): they are never complete. Called only while holding
 * the folder's lock, so no live run is writing them. */
static void remove_stale_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        /* exactly "<run file>.tmp.XXXXXX" (pf_io_atomic_begin's names), nothing else */
        int ours = 0;
        for (int i = 0; i < N_RUN_FILES; i++) {
            size_t n = strlen(run_files[i]);
            const char *x = e->d_name + n + 5;
            int six = strncmp(e->d_name, run_files[i], n) == 0 &&
                      strncmp(e->d_name + n, ".tmp.", 5) == 0 && strlen(x) == 6;
            for (int k = 0; six && k < 6; k++) six = isalnum((unsigned char)x[k]) != 0;
            ours |= six;
        }
        if (!ours) continue;
        char p[4400];
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
}

/* ---- the run ----------------------------------------------------------------------------- */

/* A run in DIR, on this rank: what it reads, trains and writes, and where it stands. */
typedef struct run_state {
    train_cfg *c;
    int *saved; /* set once this run has written a checkpoint */
    int rank0;  /* this rank writes DIR's files and the progress line */
    char ckpt[4200], log_path[4200], data[4200]; /* DIR's checkpoint and log; the data file */
    tool_team tm;
    pf_model *model;
    pf_model_config src_cfg; /* --init-from's model's, for the summary */
    pf_corpus corpus;
    uint64_t hash;      /* the corpus's (pf_corpus_hash) */
    uint64_t dseed;     /* the batches' seed */
    int32_t *tok, *tgt; /* a batch (B, T) */
    float *logits;      /* (B, T, 256), the evaluations' */
    FILE *log;
    int64_t log_from;   /* at the first row, the log keeps the rows of steps <= this only */
    int64_t step;       /* optimizer steps taken */
    double elapsed;     /* seconds of training and tokens trained on, over every start of the run */
    int64_t tokens;
    double session_t;   /* seconds and steps since this start */
    int64_t session_steps;
    pf_adamw opt;
    eval_result ev; /* the last evaluation */
    int tty, log_every;
    int dump_batch, dump_eval; /* PERFORMER_TRAIN_DUMP: the next batch, evaluation still due */
} run_state;

static void run_free(run_state *r) {
    tool_team_free(&r->tm);
    pf_model_free(r->model);
    pf_corpus_free(&r->corpus);
    free(r->tok);
    free(r->tgt);
    free(r->logits);
    if (r->log) fclose(r->log);
}

/* Writes the checkpoint, with the run's settings and counters. 0 or an exit code. */
static int save(run_state *r) {
    run_meta meta;
    make_meta(&meta, r->c, r->hash, r->elapsed, r->tokens);
    char msg[1024];
    if (pf_model_save(r->model, r->ckpt, meta.kv, 1, msg, sizeof(msg)) != PF_OK)
        return tool_fail(CMD, "%s", msg);
    *r->saved = 1;
    return 0;
}

/* Appends one row to the log, cutting it back to the rows of steps <= log_from (truncate_log)
 * and opening it first if this is the run's first row. Every row reaches the file or the run
 * fails: a full disk is an error, not a log that silently stops. 0 or an exit code. */
static int log_row(run_state *r, const char *row) {
    const char *path = r->log_path;
    if (!r->log) {
        int rc = truncate_log(path, log_header(r->c), r->log_from);
        if (rc) return rc;
        if (!(r->log = fopen(path, "a"))) return tool_fail(CMD, "%s: %s", path, strerror(errno));
    }
    if (fputs(row, r->log) < 0 || fflush(r->log) != 0)
        return tool_fail(CMD, "%s: write error: %s", path, strerror(errno));
    return 0;
}

static int train_in(train_cfg *c, int *saved);

/* The last evaluation in the log at path among the rows of steps <= upto (val_loss, column 7,
 * and the accuracy: val_acc, column 9, or MQAR's val_answer_acc, column 10), or NaN if none: a
 * resumed run's progress lines show it until its own next evaluation, as the run never stopped
 * would. */
static eval_result last_logged_eval(const char *path, int64_t upto, int mqar) {
    eval_result ev = {NAN, NAN};
    FILE *f = fopen(path, "r");
    if (!f) return ev;
    char line[512];
    const int acc_col = mqar ? 9 : 8, need = acc_col + 1;
    while (fgets(line, sizeof(line), f)) {
        char *end;
        const long long st = strtoll(line, &end, 10);
        if (end == line || *end != ',' || st > upto) continue; /* the header, or later */
        const char *field[10] = {line};
        int nf = 1;
        for (char *p = line; *p && nf < need; p++)
            if (*p == ',') field[nf++] = p + 1;
        if (nf < need || field[6][0] == ',') continue; /* no evaluation at that step */
        const double loss = strtod(field[6], NULL), acc = strtod(field[acc_col], NULL);
        if (isfinite(loss) && isfinite(acc)) {
            ev.loss = loss;
            ev.acc = acc;
        }
    }
    fclose(f);
    return ev;
}

/* Rank 0's claim on DIR: made here if missing (*made), then locked (*lfd): one run at a time in
 * a folder, since a second would replace the first's files under it. The folder itself is
 * locked (flock on its descriptor): no lock file to leave behind. 0 or an exit code. */
static int claim_folder(const train_cfg *c, int *made, int *lfd) {
    struct stat sb;
    if (stat(c->out, &sb) != 0) {
        if (c->resume) return tool_fail(CMD, "cannot resume: %s: %s", c->out, strerror(errno));
        if (lstat(c->out, &sb) == 0 && S_ISLNK(sb.st_mode))
            return tool_fail(CMD, "%s: a symbolic link to nothing; give a folder", c->out);
        if (mkdir(c->out, 0777) != 0)
            return tool_fail(CMD, "%s: cannot create: %s", c->out, strerror(errno));
        *made = 1;
    } else if (!S_ISDIR(sb.st_mode)) {
        return tool_fail(CMD, "%s: not a folder", c->out);
    }
    *lfd = open(c->out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (*lfd < 0) return tool_fail(CMD, "%s: cannot lock the folder: %s", c->out, strerror(errno));
    if (flock(*lfd, LOCK_EX | LOCK_NB) != 0)
        return tool_fail(CMD, "%s: another `performer train` is running in this folder", c->out);
    return 0;
}

/* Runs train_in in DIR; a run that fails before its first checkpoint takes away the folder it
 * made, with what it put there, so nothing but a message is left. */
static int train(train_cfg *c) {
    const int rank0 = tool_mpi_rank() == 0;
    int made = 0, lfd = -1, saved = 0;
    int rc = rank0 ? claim_folder(c, &made, &lfd) : 0;
    rc = tool_mpi_agree(rc);
    if (!rc) rc = train_in(c, &saved);
    if (rc && made && !saved) {
        for (int i = 0; i < N_RUN_FILES; i++) {
            char p[4400];
            snprintf(p, sizeof(p), "%s/%s", c->out, run_files[i]);
            unlink(p);
        }
        remove_stale_temps(c->out);
    }
    if (lfd >= 0) close(lfd); /* (the lock goes with it) */
    if (rc && made && !saved) rmdir(c->out);
    return rc;
}

/* Rank 0, before anything is read: what the run will replace must be regular files (a link or a
 * device there is refused now, not replaced later), and the data must not be one of them (the
 * log would replace it). Also clears a killed run's temporaries. 0 or an exit code. */
static int check_outputs(const train_cfg *c) {
    char msg[1024];
    remove_stale_temps(c->out);
    for (int i = 0; i < N_RUN_FILES; i++) {
        char p[4400];
        snprintf(p, sizeof(p), "%s/%s", c->out, run_files[i]);
        if (pf_io_check_dest(p, msg, sizeof(msg)) != PF_OK) return tool_fail(CMD, "%s", msg);
    }
    struct stat ds, rs;
    if (c->task == TASK_TEXT && stat(c->data, &ds) == 0) {
        for (int i = 0; i < N_RUN_FILES; i++) {
            char p[4400];
            snprintf(p, sizeof(p), "%s/%s", c->out, run_files[i]);
            if (stat(p, &rs) == 0 && rs.st_dev == ds.st_dev && rs.st_ino == ds.st_ino)
                return tool_usage(CMD, "--data %s is also an output of the run (%s): an input is "
                                       "never overwritten",
                                  c->data, p);
        }
    }
    return 0;
}

/* The data of the run: loaded, long enough for the context, and (resumed) the same as when the
 * run began (*hash). 0 or an exit code. */
static int load_data(const train_cfg *c, run_state *r, const char *data, int format,
                     uint64_t want_hash, uint64_t *hash) {
    char msg[1024];
    if (pf_corpus_load(&r->corpus, data, (pf_corpus_format)format, c->val_fraction, msg,
                       sizeof(msg)) != PF_OK)
        return tool_fail(CMD, "%s", msg);
    const int T = c->model.context;
    for (int s = 0; s < 2; s++) {
        if (r->corpus.n[s] < (size_t)T + 1)
            return tool_fail(CMD,
                             "%s: the %s split holds %zu bytes (%zu documents); --context %d "
                             "needs at least %d: use more data or a shorter context",
                             data, s ? "validation" : "training", r->corpus.n[s],
                             r->corpus.docs[s], T, T + 1);
    }
    pf_corpus_hash(&r->corpus, hash);
    if (c->resume && *hash != want_hash)
        return tool_fail(CMD,
                         "%s has changed since the run began: it cannot continue the same "
                         "way",
                         data);
    return 0;
}

/* --init-from: reads the checkpoint into *src, takes its shapes into c (or checks those given
 * against them) and records where the run starts from (init_rec). 0 or an exit code. */
static int init_source(train_cfg *c, pf_model **src) {
    char msg[1024], hex[9];
    if (tool_crc32_file(c->init_from, hex, msg, sizeof(msg)) != 0)
        return tool_fail(CMD, "--init-from: %s", msg);
    if (pf_model_load(src, c->init_from, msg, sizeof(msg)) != PF_OK)
        return tool_fail(CMD, "--init-from: %s", msg);
    const pf_model_config s = pf_model_get_config(*src);
    pf_model_config *m = &c->model;
    static const char *const pos_name[] = {"learned", "rotary"};
    if (c->shapes_given & SHAPE_POSITIONS && m->positions != s.positions)
        return tool_usage(CMD, "--positions %s disagrees with %s (%s positions): the carried "
                               "weights need the checkpoint's; leave --positions out to take it",
                          pos_name[m->positions], c->init_from, pos_name[s.positions]);
    m->positions = s.positions;
    const struct {
        unsigned bit;
        const char *flag;
        int *mine;
        int theirs;
    } dims[] = {{SHAPE_LAYERS, "--layers", &m->layers, s.layers},
                {SHAPE_D_MODEL, "--d-model", &m->d_model, s.d_model},
                {SHAPE_HEADS, "--heads", &m->heads, s.heads},
                {SHAPE_CONTEXT, "--context", &m->context, s.context}};
    for (int i = 0; i < 4; i++) {
        if (!(c->shapes_given & dims[i].bit)) {
            *dims[i].mine = dims[i].theirs;
        } else if (*dims[i].mine != dims[i].theirs && dims[i].bit != SHAPE_CONTEXT) {
            /* (another context: rotary positions hold no tensor, learned ones are carried row t
             * from row t mod the checkpoint's context, pf_model_init_from) */
            return tool_usage(CMD, "%s %d disagrees with %s (%s %d): the carried weights need "
                                   "the checkpoint's shapes; leave %s out to take it",
                              dims[i].flag, *dims[i].mine, c->init_from, dims[i].flag + 2,
                              dims[i].theirs, dims[i].flag);
        }
    }
    if (parallel_check(c) != 0) return TOOL_EXIT_USAGE;
    if (c->task == TASK_MQAR && mqar_fits(c) != 0) return TOOL_EXIT_USAGE;
    /* the task is not carried: a recall model evaluated on text by default would say little */
    const char *task = pf_model_meta(*src, "run.task");
    if (!c->task_given && task && strcmp(task, "mqar") == 0 && tool_mpi_rank() == 0)
        fprintf(stderr, "%s: note: %s was trained on --task mqar; this run's task is text (%s): "
                        "give --task mqar and its --mqar-* flags to go on with recall, or "
                        "--task text to silence this\n",
                CMD, c->init_from, c->data);
    char real[PATH_MAX];
    snprintf(init_rec.path, sizeof(init_rec.path), "%s",
             realpath(c->init_from, real) ? real : c->init_from);
    snprintf(init_rec.crc32, sizeof(init_rec.crc32), "%s", hex);
    snprintf(init_rec.step, sizeof(init_rec.step), "%lld", (long long)pf_model_steps(*src));
    if (c->fit_batches > 0) snprintf(init_rec.fit, sizeof(init_rec.fit), "%d", c->fit_batches);
    return 0;
}

/* ---- setting up ---------------------------------------------------------------------------- */
/* In phases that every rank ends together (tool_mpi_agree): a failure on any rank stops them
 * all at the next agreement, with its message printed once. */

/* DIR's checkpoint: a resumed run's, read by every rank (rank 0 writes it only once they all
 * have) with its settings (*want_hash: its data's hash); a new run's must not be there. Then
 * --init-from's checkpoint into *src. 0 or an exit code, agreed. */
static int open_run(run_state *r, uint64_t *want_hash, pf_model **src) {
    train_cfg *c = r->c;
    char msg[1024];
    int rc = r->rank0 ? check_outputs(c) : 0;
    if (!rc && c->resume) {
        if (pf_model_load(&r->model, r->ckpt, msg, sizeof(msg)) != PF_OK)
            rc = tool_fail(CMD, "cannot resume: %s", msg);
        else if ((rc = settings_from_meta(c, r->model, r->ckpt, want_hash, &r->elapsed,
                                          &r->tokens)) == 0)
            rc = parallel_check(c);
    } else if (!rc && r->rank0 && access(r->ckpt, F_OK) == 0) {
        rc = tool_fail(CMD, "%s exists: use --resume to continue that run, or another --out",
                       r->ckpt);
    }
    rc = tool_mpi_agree(rc);
    if (!rc && c->init_from) rc = init_source(c, src);
    return tool_mpi_agree(rc);
}

/* The data: rank 0 first, which may export the Bible into DIR; then the others read it. 0 or an
 * exit code, not yet agreed. */
static int read_data(run_state *r, uint64_t want_hash) {
    int format = 0;
    int rc = r->rank0 ? data_path(r->c, r->data, sizeof(r->data), &format) : 0;
    rc = tool_mpi_agree(rc);
    if (!rc && !r->rank0) rc = data_path(r->c, r->data, sizeof(r->data), &format);
    if (!rc) rc = load_data(r->c, r, r->data, format, want_hash, &r->hash);
    return rc;
}

/* A new run's model, its weights carried from src (--init-from) if not NULL. 0 or an exit
 * code. */
static int create_model(run_state *r, const pf_model *src) {
    char msg[1024];
    pf_model_config *mc = &r->c->model;
    if (mc->attention == PF_LM_FAVOR && mc->kernel == PF_KERNEL_ELU) {
        /* (here, once --init-from has given the shapes) elu + 1 maps the head's q' and k': its
         * W is the identity, one feature per head coordinate */
        const int hd = mc->d_model / mc->heads;
        if (r->c->features_given && mc->features != hd)
            return tool_usage(CMD, "--kernel elu has one feature per head coordinate: "
                                   "--features must be d-model/heads = %d (or left out), not %d",
                              hd, mc->features);
        mc->features = hd;
    }
    pf_status st = pf_model_create(&r->model, &r->c->model);
    if (st != PF_OK) return tool_fail(CMD, "cannot create the model: %s", pf_status_str(st));
    if (src && pf_model_init_from(r->model, src, msg, sizeof(msg)) != PF_OK)
        return tool_fail(CMD, "--init-from %s: %s", r->c->init_from, msg);
    return 0;
}

/* Everything before the first step: the checkpoint, the data, the model, a batch's buffers and
 * the team of ranks. 0 or an exit code, agreed. */
static int set_up(run_state *r) {
    const train_cfg *c = r->c;
    uint64_t want_hash = 0;
    pf_model *src = NULL; /* --init-from's model, until its weights are carried over */
    int rc = open_run(r, &want_hash, &src);
    if (!rc && c->task == TASK_TEXT) rc = read_data(r, want_hash); /* (MQAR: generated) */
    if (!rc && !c->resume) rc = create_model(r, src);
    r->src_cfg = pf_model_get_config(src);
    pf_model_free(src);
    const size_t bt = (size_t)c->batch * (size_t)c->model.context;
    if (!rc) {
        r->tok = malloc(sizeof(int32_t) * bt);
        r->tgt = malloc(sizeof(int32_t) * bt);
        r->logits = malloc(sizeof(float) * bt * PF_LM_VOCAB);
        if (!r->tok || !r->tgt || !r->logits) rc = tool_fail(CMD, "out of memory");
    }
    rc = tool_mpi_agree(rc);
    /* (collective: fails alike on every rank) */
    if (!rc) rc = tool_team_start(&r->tm, r->model, c->parallel == 1, c->batch, c->model.context,
                                  CMD);
    return tool_mpi_agree(rc);
}

/* Whether the attention of c draws a W (FAVOR+ and its other maps, FAVOR++; not exact, local or
 * elu + 1, whose W is the identity). */
static int draws_w(const pf_model_config *c) {
    return (c->attention == PF_LM_FAVOR && c->kernel != PF_KERNEL_ELU) ||
           c->attention == PF_LM_FAVORPP;
}

/* What the run is, on stdout: the data, the model, where its weights came from, the ranks. */
static void print_run(const run_state *r) {
    const train_cfg *c = r->c;
    const pf_model_config *mc = &c->model;
    char att[64];
    if (c->task == TASK_MQAR)
        printf("data: MQAR: %d key-value pairs and %d queries per window of %d (keys bytes "
               "0..%d, values %d..%d, filler %d..255); the loss counts the %d answers only\n",
               c->mqar.pairs, c->mqar.queries, mc->context, c->mqar.keys - 1, c->mqar.keys,
               2 * c->mqar.keys - 1, 2 * c->mqar.keys, c->mqar.queries);
    else
        printf("data: %s: %zu training bytes (%zu documents), %zu validation bytes (%zu)\n",
               r->data, r->corpus.n[0], r->corpus.docs[0], r->corpus.n[1], r->corpus.docs[1]);
    printf("model: %lld parameters, %d layers, d_model %d, %d heads, context %d, %s attention, "
           "%s positions\n",
           (long long)pf_model_num_params(r->model), mc->layers, mc->d_model, mc->heads,
           mc->context, attention_desc(mc, att, sizeof(att)),
           mc->positions == PF_LM_ROTARY ? "rotary" : "learned");
    if (c->init_from) {
        char satt[64];
        printf("init: every trained tensor from %s (step %s, %s attention); new: ",
               init_rec.path, init_rec.step, attention_desc(&r->src_cfg, satt, sizeof(satt)));
        if (draws_w(mc))
            printf("FAVOR's W (seed %llu), ", (unsigned long long)mc->w_seed);
        if (mc->attention == PF_LM_FAVORPP) printf("FAVOR++'s statistic, ");
        printf("AdamW moments, step 0\n");
        if (mc->positions == PF_LM_LEARNED && mc->context != r->src_cfg.context)
            printf("init: learned positions: row t from the checkpoint's row t mod %d (its "
                   "context; this run's is %d)\n",
                   r->src_cfg.context, mc->context);
    }
    printf("seeds: data %llu, initial weights %llu", (unsigned long long)c->data_seed,
           (unsigned long long)mc->seed);
    if (init_rec.path[0]) printf(" (unused: the weights are carried)");
    if (draws_w(mc)) printf(", W %llu", (unsigned long long)mc->w_seed);
    printf("\n");
    if (r->tm.size > 1)
        printf("parallel: %d ranks, %s: each trains %s\n", r->tm.size,
               c->parallel == 1 ? "sequence" : "data",
               c->parallel == 1 ? "a slice of every window" : "whole windows of every batch");
    fflush(stdout);
}

/* Where the steps start: the model's step count, the optimizer's settings, the progress line's
 * and (resumed) the last evaluation the log holds. */
static void start_steps(run_state *r) {
    const train_cfg *c = r->c;
    r->step = pf_model_steps(r->model);
    r->tty = r->rank0 && isatty(2);
    r->log_every = c->log_every ? c->log_every : (c->steps >= 20 ? c->steps / 20 : 1);
    r->opt = pf_adamw_default();
    r->opt.weight_decay = (float)c->weight_decay;
    r->opt.clip = (float)c->clip;
    r->ev = (eval_result){NAN, NAN};
    if (c->resume && r->rank0)
        r->ev = last_logged_eval(r->log_path, r->step, c->task == TASK_MQAR);
}

/* ---- training ------------------------------------------------------------------------------ */

/* An evaluation of the run's model into r->ev; the first of this start also dumped, with
 * PERFORMER_TRAIN_DUMP. */
static pf_status run_evaluation(run_state *r) {
    const train_cfg *c = r->c;
    eval_dump d = {NULL, NULL, NULL};
    const size_t n = (size_t)c->eval_batches * c->batch * c->model.context;
    if (r->dump_eval) {
        d.tok = malloc(sizeof(int32_t) * n);
        d.tgt = malloc(sizeof(int32_t) * n);
        d.logits = malloc(sizeof(float) * n * PF_LM_VOCAB);
    }
    const int dumping = d.tok && d.tgt && d.logits;
    pf_status st = evaluate(r->model, &r->tm, &r->corpus, c, r->dseed, r->tok, r->tgt,
                            r->logits, &r->ev, dumping ? &d : NULL);
    if (r->dump_eval && st == PF_OK) {
        const int64_t shape[4] = {c->eval_batches, c->batch, c->model.context, PF_LM_VOCAB};
        if (dumping) {
            dump_array("eval_tokens", PF_I32, d.tok, 3, shape);
            dump_array("eval_targets", PF_I32, d.tgt, 3, shape);
            dump_array("eval_logits", PF_F32, d.logits, 4, shape);
        } else {
            fprintf(stderr, "performer train: PERFORMER_TRAIN_DUMP: out of memory\n");
        }
        r->dump_eval = 0;
    }
    free(d.tok);
    free(d.tgt);
    free(d.logits);
    return st;
}

/* --fit-batches (FAVOR++, one process: parallel_check): A fitted on training batches of their
 * own, in training mode without targets, so no weight moves; their statistic is in the
 * checkpoint. 0 or an exit code; *st the library's status. */
static int fit_favorpp(run_state *r, pf_status *st) {
    const train_cfg *c = r->c;
    const int B = c->batch, T = c->model.context;
    int rc = 0;
    for (int i = 0; *st == PF_OK && i < c->fit_batches; i++) {
        *st = pf_model_set_training(r->model, 1);
        if (*st == PF_OK)
            *st = draw_batch(c, &r->corpus, PF_SPLIT_TRAIN, r->tok, r->tgt, r->dseed,
                             FIT_STREAM + (uint64_t)i);
        if (*st == PF_OK) *st = pf_model_forward(r->model, NULL, NULL, r->tok, NULL, B, T);
        if (*st != PF_OK) rc = tool_fail(CMD, "fitting FAVOR++'s A: %s", pf_status_str(*st));
    }
    if (c->fit_batches > 0 && !rc) pf_model_set_training(r->model, 0);
    return rc;
}

/* A new run's evaluation before its first step (log row 0), or a finished run's: with --steps 0
 * (--init-from evaluating only) the evaluation is the run, and its checkpoint the carried model.
 * 0 or an exit code, agreed; *st the library's status. */
static int first_evaluation(run_state *r, pf_status *st) {
    const train_cfg *c = r->c;
    int rc = 0;
    *st = run_evaluation(r);
    /* (row 0 is a new run's: a resumed run at step 0 is an evaluation-only run, done) */
    if (*st == PF_OK && r->step == 0 && !c->resume && r->rank0) {
        char row[512];
        int n = snprintf(row, sizeof(row), "0,,,,,0");
        eval_columns(row + n, sizeof(row) - (size_t)n, c, &r->ev);
        rc = log_row(r, row);
        if (!rc && c->steps == 0) rc = save(r);
    }
    return tool_mpi_agree(rc);
}

/* One optimizer step at learning rate lr on step r->step's batch: every rank draws the whole
 * batch and takes its share (the same batch as alone). */
static pf_status train_step(run_state *r, double lr, float *loss, float *gnorm) {
    const int B = r->c->batch, T = r->c->model.context;
    pf_status st = draw_batch(r->c, &r->corpus, PF_SPLIT_TRAIN, r->tok, r->tgt, r->dseed,
                              (uint64_t)r->step);
    if (st == PF_OK && r->dump_batch) { /* PERFORMER_TRAIN_DUMP: this start's first batch */
        const int64_t shape[2] = {B, T};
        dump_array("train_tokens", PF_I32, r->tok, 2, shape);
        dump_array("train_targets", PF_I32, r->tgt, 2, shape);
        r->dump_batch = 0;
    }
    if (st == PF_OK) st = tool_team_forward(&r->tm, r->model, loss, NULL, r->tok, r->tgt, B, T);
    if (st == PF_OK) st = tool_team_backward(&r->tm, r->model);
    r->opt.lr = (float)lr;
    /* (the summed gradients are the same bits on every rank: so is this step) */
    if (st == PF_OK) st = pf_model_step(r->model, &r->opt, gnorm);
    return st;
}

/* Rank 0's part of a step: its log row, the progress line, the checkpoint when one is due. 0 or
 * an exit code. */
static int report_step(run_state *r, const char *row, float loss, int evaluated, int stop) {
    const train_cfg *c = r->c;
    const double bt = (double)c->batch * c->model.context;
    int rc = log_row(r, row);
    double tps = (double)r->session_steps * bt / r->session_t;
    char eta[32];
    fmt_time(eta, sizeof(eta), (double)(c->steps - r->step) * r->session_t / r->session_steps);
    if (!rc && (r->tty || r->step % r->log_every == 0 || r->step == c->steps || evaluated)) {
        char val[64] = "val -"; /* before the run's first evaluation */
        if (!isnan(r->ev.loss))
            snprintf(val, sizeof(val), "val %.4f (%s %.3f)", r->ev.loss,
                     c->task == TASK_MQAR ? "answer acc" : "acc", r->ev.acc);
        fprintf(stderr, "%sstep %lld/%d  loss %.4f  %s  %.0f tok/s  left %s%s",
                r->tty ? "\r" : "", (long long)r->step, c->steps, loss, val, tps, eta,
                r->tty ? "   " : "\n");
    }
    if (!rc && (r->step % c->checkpoint_every == 0 || r->step == c->steps || stop)) rc = save(r);
    return rc;
}

/* The steps, up to --steps (or --stop-after): each logged, evaluated every --eval-every,
 * checkpointed every --checkpoint-every; the ranks agree after each. 0 or an exit code; *st the
 * library's status of a step that failed. */
static int train_steps(run_state *r, pf_status *st) {
    const train_cfg *c = r->c;
    const int64_t bt = (int64_t)c->batch * c->model.context;
    int rc = 0;
    while (*st == PF_OK && !rc && r->step < c->steps) {
        double t0 = tool_now_ms();
        double lr = pf_lr_schedule(r->step, c->steps, c->warmup, c->lr, c->lr_min);
        float loss = NAN, gnorm = NAN;
        if ((*st = train_step(r, lr, &loss, &gnorm)) != PF_OK) break;
        double dt = (tool_now_ms() - t0) / 1e3;
        r->elapsed += dt;
        r->session_t += dt;
        r->session_steps++;
        r->tokens += bt;
        r->step++;
        int do_eval = r->step % c->eval_every == 0 || r->step == c->steps;
        char row[512];
        int n = snprintf(row, sizeof(row), "%lld,%.6g,%.6f,%.6g,%.1f,%.3f", (long long)r->step,
                         lr, loss, gnorm, (double)bt / dt, r->elapsed);
        if (do_eval) {
            *st = run_evaluation(r);
            if (*st != PF_OK) break;
            eval_columns(row + n, sizeof(row) - (size_t)n, c, &r->ev);
        } else {
            eval_columns(row + n, sizeof(row) - (size_t)n, c, NULL);
        }
        int stop = c->stop_after && r->step >= c->stop_after;
        if (r->rank0) rc = report_step(r, row, loss, do_eval, stop); /* the files are rank 0's */
        /* (every rank's elapsed time is rank 0's: the checkpoint's, for a resumed run alike) */
        if (r->tm.size > 1) r->elapsed = tool_mpi_max(r->elapsed);
        rc = tool_mpi_agree(rc);
        if (stop) break;
    }
    return rc;
}

/* The end, on every rank: why the steps stopped, the log closed, the ranks agreed; then rank 0's
 * summary and curves. rc and st: the exit code and library status so far. */
static int finish_run(run_state *r, pf_status st, int rc) {
    const train_cfg *c = r->c;
    if (r->tty) fputc('\n', stderr);
    if (st != PF_OK) {
        if (st == PF_ENONFINITE)
            tool_fail(CMD,
                      "step %lld: the loss or gradient is not finite (diverged; try a "
                      "lower --lr or a smaller --clip); the last checkpoint is kept",
                      (long long)r->step + 1);
        else
            tool_fail(CMD, "step %lld: %s", (long long)r->step + 1, pf_status_str(st));
        rc = TOOL_EXIT_FAIL;
    }
    if (r->log && fclose(r->log) != 0 && !rc)
        rc = tool_fail(CMD, "%s: write error: %s", r->log_path, strerror(errno));
    r->log = NULL;
    rc = tool_mpi_agree(rc);
    if (!rc && r->rank0) {
        printf("step %lld/%d: validation loss %.4f (perplexity %.3f, %s %.4f); %.0f "
               "training tokens/s over %.1f s\n",
               (long long)r->step, c->steps, r->ev.loss, exp(r->ev.loss),
               c->task == TASK_MQAR ? "answer accuracy" : "accuracy", r->ev.acc,
               r->elapsed > 0 ? (double)r->tokens / r->elapsed : 0.0, r->elapsed);
        printf("checkpoint: %s\nlog: %s\n", r->ckpt, r->log_path);
        if (!c->no_plot) plot(c, r->log_path);
    }
    return rc;
}

/* The run in DIR (claimed by train): set up, the first evaluation, the steps, the end. */
static int train_in(train_cfg *c, int *saved) {
    run_state r;
    memset(&r, 0, sizeof(r));
    r.c = c;
    r.saved = saved;
    r.rank0 = tool_mpi_rank() == 0;
    r.tm.rank = tool_mpi_rank();
    r.tm.size = tool_mpi_size();
    snprintf(r.ckpt, sizeof(r.ckpt), "%s/checkpoint.safetensors", c->out);
    snprintf(r.log_path, sizeof(r.log_path), "%s/log.csv", c->out);
    int rc = set_up(&r);
    if (rc) {
        run_free(&r);
        return rc;
    }
    /* the log is cut back (to the checkpoint's step, or to nothing for a new run) only when the
     * first row is ready: a run that fails before that leaves an existing log as it was */
    r.log_from = c->resume ? pf_model_steps(r.model) : -1;
    r.dseed = c->data_seed ^ DATA_SEED_MIX;
    print_run(&r);
    start_steps(&r);
    if (dump_dir() && r.tm.size == 1) { /* (one process: its logits are the whole batch's) */
        char p[4400], msg[1024];
        snprintf(p, sizeof(p), "%s/init.safetensors", dump_dir());
        if (pf_model_save(r.model, p, NULL, 0, msg, sizeof(msg)) != PF_OK)
            fprintf(stderr, "performer train: PERFORMER_TRAIN_DUMP: %s\n", msg);
        r.dump_batch = r.dump_eval = 1;
    }
    pf_status st = PF_OK;
    if (!c->resume) rc = fit_favorpp(&r, &st);
    if (!rc && (r.step == 0 || r.step >= c->steps)) /* a new run, or a finished one */
        rc = first_evaluation(&r, &st);
    pf_model_set_training(r.model, 1);
    if (!rc) rc = train_steps(&r, &st);
    rc = finish_run(&r, st, rc);
    run_free(&r);
    return rc;
}

int cmd_train(int argc, char **argv) {
    train_cfg c;
    memset(&c, 0, sizeof(c));
    c.data = "proteins";
    c.format = PF_CORPUS_AUTO;
    c.val_fraction = 0.05;
    c.model = pf_model_config_default();
    c.steps = 1000;
    c.batch = 8;
    c.lr = 1e-3;
    c.warmup = 100;
    c.weight_decay = 0.1;
    c.clip = 1.0;
    c.eval_every = 100;
    c.eval_batches = 8;
    c.parallel = -1;
    c.task = TASK_TEXT;
    c.mqar = pf_mqar_default();
    int rc = parse_args(&c, argc, argv);
    if (rc) return rc;
    tool_set_threads(c.threads);
    return train(&c);
}
