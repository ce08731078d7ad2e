/* cmd_attn.c: `performer attn`: exact, FAVOR+, RA or LARA attention on .npy inputs, optionally
 * (exact, FAVOR+) with the gradients of sum(out * dO).
 *
 * Everything is checked before any computing (files, dtypes, ranks, shapes, NaN/Inf, key
 * lengths, W, the outputs: tool_outputs), every flag must apply to the chosen method, and the
 * outputs are written to temporary names once every result is ready and renamed into place
 * together, so a failed run leaves every file that was there before as it was. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpi/tool_mpi.h"
#include "tool.h"

#define CMD "attn"
/* The most random features --features draws: 2^20 (W alone is then 4 MiB a unit of d, and a
 * head's features 4 MiB a row; more would fail only after seconds of drawing). */
#define MAX_FEATURES (1 << 20)

const char cmd_attn_synopsis[] =
    "performer attn --q Q.npy --k K.npy --v V.npy --out O.npy [--method exact|favor|ra|lara]\n"
    "     [--causal] [--kernel positive|hyperbolic|trig|relu|oprf|sderf|elu] [--oprf-a A]\n"
    "     [--features M] [--proj orthogonal|iid] [--norm chi|sqrtd|qmc] [--seed S]\n"
    "     [--scale S] [--eps E] [--w W.npy] [--save-w W.npy] [--key-lengths LENS.npy]\n"
    "     [--threads N] [--chunk C] [--grad-out DO.npy --grad-prefix P] [--samples S]\n"
    "     [--proposals C] [--deterministic] [--timings]\n";

void cmd_attn_help(void) {
    printf("usage: %s\n"
           "Attention of queries Q on keys K and values V, exact, FAVOR+ (random features) or\n"
           "sampled (RA, LARA), written to O. Inputs are float32 .npy arrays, all of the same\n"
           "rank: (L,d) one head, (H,L,d) H heads, or (B,H,L,d) a batch of B,\n"
           "with Q (..,Lq,d), K (..,Lk,d), V (..,Lk,dv); the output is (..,Lq,dv). float16\n"
           "inputs are widened to float32 (exactly); when Q, K and V are all float16 the\n"
           "output is written in float16 (rounded once), the gradients in float32.\n"
           "\n"
           "required:\n"
           "  --q FILE            queries\n"
           "  --k FILE            keys\n"
           "  --v FILE            values\n"
           "  --out FILE          the output (written atomically; nothing is left on failure)\n"
           "\n"
           "options:                                                              [default]\n"
           "  --method NAME       exact | favor | ra | lara                       [favor]\n"
           "  --causal            query i sees keys j <= i only; needs Lq == Lk   [off]\n"
           "  --scale S           the logit scale s in exp(s q.k), S > 0          [1/sqrt(d)]\n"
           "  --key-lengths FILE  int32 or int64 (B,): valid keys per batch item, each in\n"
           "                      [1, Lk]; the keys after them are padding        [all Lk]\n"
           "  --threads N         threads, 0 = OpenMP's default; results do not depend on it [0]\n"
           "  --timings           print the time spent reading, computing and writing\n"
           "\n"
           "FAVOR+, FAVOR++ and FAVOR# (--method favor):\n"
           "  --kernel NAME       positive | hyperbolic | trig | relu (FAVOR+ maps), or\n"
           "                      oprf (FAVOR++, alias favor++) | sderf (FAVOR#, alias favor#):\n"
           "                      positive features with a quadratic term in w fitted to\n"
           "                      Q and K (Likhosherstov et al. 2022, 2023) | elu (alias\n"
           "                      elu+1): elu(Wx) + 1, with W = I (no draw, unless --w) the\n"
           "                      linear attention of Katharopoulos et al. 2020   [positive]\n"
           "  --oprf-a A          FAVOR++'s A, A < 1/8 (0 is FAVOR+); required with --causal\n"
           "                      (a causal A must not look at the sequence)  [fitted per head]\n"
           "  --features M        random projections m, at most 2^20 (r = m features, 2m\n"
           "                      for hyperbolic and trig)                        [256]\n"
           "  --proj NAME         orthogonal | iid: how W's rows are drawn        [orthogonal]\n"
           "  --norm NAME         chi | sqrtd | qmc: W's row lengths              [chi]\n"
           "  --seed S            the seed W (or RA's and LARA's samples) is drawn from\n"
           "                      (the same on every machine and thread count)    [0]\n"
           "  --eps E             kernel epsilon, E >= 0 (see pf_features)        [0]\n"
           "  --chunk C           causal chunk length (--causal only), 0: chosen  [0]\n"
           "  --w FILE            use this W, (m,d), or (H,m,d) for one per head, instead\n"
           "                      of drawing one (--features, --proj, --norm, --seed\n"
           "                      are then refused)                               [drawn]\n"
           "  --save-w FILE       write the W used, so another implementation can use it\n"
           "\n"
           "RA and LARA (--method ra|lara; bidirectional only, no --causal, no gradients):\n"
           "  --samples S         samples per query (RA) or per proposal (LARA)  [16 / 1]\n"
           "  --proposals C       LARA: C contiguous chunks of queries and keys give the\n"
           "                      proposals; C <= Lq and C <= every key length   [16 or less]\n"
           "  --deterministic     LARA: omega_c = mu_c (no noise); needs --samples 1  [off]\n"
           "\n"
           "gradients (both or neither; exact and favor):\n"
           "  --grad-out FILE     dO, float32, the output's shape\n"
           "  --grad-prefix P     writes P.dq.npy, P.dk.npy, P.dv.npy: the gradients of\n"
           "                      sum(out * dO) with respect to Q, K and V\n"
           "\n"
           "Files: inputs must be regular files (a FIFO or device is refused). Each output\n"
           "must be a new name or a regular file: a symbolic link, device, FIFO or folder\n"
           "there is refused, never replaced nor written through; no output may be an input\n"
           "or another output. Outputs are written to temporary names beside them and renamed\n"
           "into place together once all are ready: a failed or interrupted run leaves every\n"
           "file as it was.\n"
           "\n"
           "Exit status: 0 success, 1 bad input file or failed computation, 2 bad command line.\n",
           cmd_attn_synopsis);
}

typedef struct attn_cfg {
    const char *q, *k, *v, *out;
    const char *w, *save_w, *key_lengths, *grad_out, *grad_prefix;
    int favor;     /* 1: FAVOR+, 0: exact, RA or LARA */
    int method;    /* 0 exact, 1 favor, 2 ra, 3 lara */
    int samples;   /* RA, LARA; 0: the method's default */
    int proposals; /* LARA; 0: 16 or fewer */
    int deterministic;
    int causal;
    pf_kernel kernel;
    int m;
    pf_proj_kind proj;
    pf_norm_kind norm;
    uint64_t seed;
    double scale; /* 0: the library's default 1/sqrt(d) */
    double eps;
    int threads;
    int chunk;
    unsigned given; /* bit i: method_flags[i] was given */
    int oprf_a_given;
    double oprf_a;
    int timings;       /* --timings */
    int features_over; /* --features above MAX_FEATURES */
} attn_cfg;

/* ---- command line -------------------------------------------------------------------------- */

static const char *const method_names[] = {"exact", "favor", "ra", "lara", NULL};

/* The flags that apply to some methods only, and which (bit i: method_names[i]). A flag given
 * with a method that does not use it is refused, never silently ignored. */
enum { M_EXACT = 1, M_FAVOR = 2, M_RA = 4, M_LARA = 8 };
static const struct {
    const char *flag;
    unsigned methods;
} method_flags[] = {
    {"--kernel", M_FAVOR},           {"--features", M_FAVOR},      {"--proj", M_FAVOR},
    {"--oprf-a", M_FAVOR},
    {"--norm", M_FAVOR},             {"--eps", M_FAVOR},           {"--chunk", M_FAVOR},
    {"--w", M_FAVOR},                {"--save-w", M_FAVOR},        {"--seed", M_FAVOR | M_RA | M_LARA},
    {"--samples", M_RA | M_LARA},    {"--proposals", M_LARA},      {"--deterministic", M_LARA},
    {"--grad-out", M_EXACT | M_FAVOR}, {"--grad-prefix", M_EXACT | M_FAVOR},
};
enum { N_METHOD_FLAGS = (int)(sizeof(method_flags) / sizeof(method_flags[0])) };

/* Records that argument `arg` ("--kernel" or "--kernel=trig") was given, if it is one of
 * method_flags. */
static void note_flag(attn_cfg *c, const char *arg) {
    for (int i = 0; i < N_METHOD_FLAGS; i++) {
        size_t n = strlen(method_flags[i].flag);
        if (strncmp(arg, method_flags[i].flag, n) == 0 && (arg[n] == '\0' || arg[n] == '='))
            c->given |= 1u << i;
    }
}

/* 0, or a usage error naming the first flag the chosen method does not use. */
static int check_flags_apply(const attn_cfg *c) {
    for (int i = 0; i < N_METHOD_FLAGS; i++) {
        if (!(c->given >> i & 1) || (method_flags[i].methods >> c->method & 1)) continue;
        char users[64] = "";
        for (int m = 0; method_names[m]; m++) {
            if (!(method_flags[i].methods >> m & 1)) continue;
            strcat(users, users[0] ? " or " : "");
            strcat(users, method_names[m]);
        }
        if (strncmp(method_flags[i].flag, "--grad", 6) == 0)
            return tool_usage(CMD, "--method %s has no backward pass: %s is for --method %s only",
                              method_names[c->method], method_flags[i].flag, users);
        return tool_usage(CMD, "%s is for --method %s only; --method %s does not use it",
                          method_flags[i].flag, users, method_names[c->method]);
    }
    return 0;
}

static int parse_args(attn_cfg *c, int argc, char **argv) {
    static const char *const kernels[] = {"positive", "hyperbolic", "trig",  "relu",
                                          "oprf",     "sderf",      "favor++", "favor#",
                                          "elu",      "elu+1",      NULL};
    static const char *const projs[] = {"orthogonal", "iid", NULL};
    static const char *const norms[] = {"chi", "sqrtd", "qmc", NULL};
    tool_args a;
    tool_args_init(&a, CMD, argc, argv);
    while (tool_next(&a)) {
        const char *v = NULL;
        int idx;
        note_flag(c, a.argv[a.i]);
        if (tool_path_opt(&a, "--q", &v))
            c->q = v;
        else if (tool_path_opt(&a, "--k", &v))
            c->k = v;
        else if (tool_path_opt(&a, "--v", &v))
            c->v = v;
        else if (tool_path_opt(&a, "--out", &v))
            c->out = v;
        else if (tool_path_opt(&a, "--w", &v))
            c->w = v;
        else if (tool_path_opt(&a, "--save-w", &v))
            c->save_w = v;
        else if (tool_path_opt(&a, "--key-lengths", &v))
            c->key_lengths = v;
        else if (tool_path_opt(&a, "--grad-out", &v))
            c->grad_out = v;
        else if (tool_path_opt(&a, "--grad-prefix", &v))
            c->grad_prefix = v;
        else if (tool_flag(&a, "--causal"))
            c->causal = 1;
        else if (tool_opt(&a, "--method", &v)) {
            if (v && (idx = tool_parse_choice(&a, "--method", v, method_names)) >= 0) {
                c->method = idx;
                c->favor = idx == 1;
            }
        } else if (tool_opt(&a, "--kernel", &v)) {
            /* the names are the library's (pf_kernel_parse); the list is for the message */
            if (v && (idx = tool_parse_choice(&a, "--kernel", v, kernels)) >= 0 &&
                pf_kernel_parse(v, &c->kernel) != PF_OK) {
                tool_fail(CMD, "--kernel: '%s' is not known to this library", v);
                a.failed = 1;
            }
        } else if (tool_opt(&a, "--oprf-a", &v)) {
            if (v && tool_parse_double(&a, "--oprf-a", v, -1e6, 0.125, 0, &c->oprf_a)) {
                if (c->oprf_a >= 0.125) { /* the range is [-1e6, 1/8): A = 1/8 has no B */
                    tool_usage(CMD, "--oprf-a: A must be below 1/8, got '%s'", v);
                    a.failed = 1;
                }
                c->oprf_a_given = 1;
            }
        } else if (tool_opt(&a, "--proj", &v)) {
            if (v && (idx = tool_parse_choice(&a, "--proj", v, projs)) >= 0)
                c->proj = idx == 0 ? PF_PROJ_ORTHOGONAL : PF_PROJ_IID;
        } else if (tool_opt(&a, "--norm", &v)) {
            if (v && (idx = tool_parse_choice(&a, "--norm", v, norms)) >= 0)
                c->norm = idx == 0 ? PF_NORM_CHI : idx == 1 ? PF_NORM_SQRTD : PF_NORM_QMC;
        } else if (tool_opt(&a, "--features", &v)) {
            if (v && tool_parse_int(&a, "--features", v, 1, INT_MAX, &c->m))
                c->features_over = c->m > MAX_FEATURES;
        } else if (tool_opt(&a, "--seed", &v)) {
            if (v) tool_parse_u64(&a, "--seed", v, &c->seed);
        } else if (tool_opt(&a, "--scale", &v)) {
            if (v) tool_parse_double(&a, "--scale", v, 0, HUGE_VAL, 1, &c->scale);
        } else if (tool_opt(&a, "--eps", &v)) {
            if (v) tool_parse_double(&a, "--eps", v, 0, HUGE_VAL, 0, &c->eps);
        } else if (tool_opt(&a, "--threads", &v)) {
            if (v) tool_parse_int(&a, "--threads", v, 0, PF_MAX_THREADS, &c->threads);
        } else if (tool_opt(&a, "--chunk", &v)) {
            if (v) tool_parse_int(&a, "--chunk", v, 0, INT_MAX, &c->chunk);
        } else if (tool_opt(&a, "--samples", &v)) {
            if (v) tool_parse_int(&a, "--samples", v, 1, INT_MAX, &c->samples);
        } else if (tool_opt(&a, "--proposals", &v)) {
            if (v) tool_parse_int(&a, "--proposals", v, 1, INT_MAX, &c->proposals);
        } else if (tool_flag(&a, "--timings")) {
            c->timings = 1;
        } else if (tool_flag(&a, "--deterministic")) {
            c->deterministic = 1;
        } else {
            return tool_unknown(&a);
        }
    }
    if (a.failed) return TOOL_EXIT_USAGE;

    const char *missing = !c->q ? "--q" : !c->k ? "--k" : !c->v ? "--v" : !c->out ? "--out" : NULL;
    if (missing) return tool_usage(CMD, "missing %s", missing);
    if (!c->grad_out != !c->grad_prefix)
        return tool_usage(CMD, "--grad-out and --grad-prefix go together");
    int rc = check_flags_apply(c);
    if (rc) return rc;
    if (tool_given(&a, "--chunk") && !c->causal)
        return tool_usage(CMD, "--chunk is the causal scan's chunk: it is for --causal only");
    static const char *const drawn[] = {"--features", "--proj", "--norm", "--seed"};
    for (int k = 0; k < 4 && c->w; k++) {
        if (tool_given(&a, drawn[k]))
            return tool_usage(CMD, "%s is for drawing W; with --w, W is given", drawn[k]);
    }
    for (int k = 0; k < 4 && c->favor && c->kernel == PF_KERNEL_ELU && !c->w; k++) {
        if (tool_given(&a, drawn[k]))
            return tool_usage(CMD, "%s is for drawing W; --kernel elu draws none (W = I: "
                                   "elu(x) + 1 of each row), unless --w gives one",
                              drawn[k]);
    }
    if (c->features_over) /* checked here, after --w, which makes --features moot */
        return tool_usage(CMD, "--features: at most %d", MAX_FEATURES);
    if (c->oprf_a_given && c->kernel != PF_KERNEL_OPRF)
        return tool_usage(CMD, "--oprf-a is for --kernel oprf only");
    if (c->favor && c->causal && c->kernel == PF_KERNEL_OPRF && !c->oprf_a_given)
        return tool_usage(CMD, "--kernel oprf --causal needs --oprf-a A: a causal A must be fixed "
                               "beforehand, not fitted to the sequence (whose later keys a query "
                               "must not see)");
    if (c->favor && c->causal && c->kernel == PF_KERNEL_SDERF)
        return tool_usage(CMD, "--kernel sderf is bidirectional only: its A is fitted to the "
                               "sequence's own queries and keys, which a causal query must not "
                               "see; use --kernel oprf --oprf-a A");
    const int sampler = c->method == 2 || c->method == 3;
    if (sampler && c->causal)
        return tool_usage(CMD,
                          "--method %s is bidirectional only: --causal is not supported "
                          "(causal randomized attention is an open research question)",
                          c->method == 2 ? "ra" : "lara");
    if (c->deterministic && c->samples > 1)
        return tool_usage(CMD,
                          "--deterministic takes one sample per proposal (omega = mu): "
                          "--samples must be 1, got %d",
                          c->samples);
    /* The library takes floats: refuse what would become Inf or (for the scale, where 0 means
     * the default) 0 in float. */
    if (c->eps > FLT_MAX) return tool_usage(CMD, "--eps: %g is too large for float32", c->eps);
    if (c->scale > FLT_MAX || (c->scale > 0 && c->scale < FLT_MIN))
        return tool_usage(CMD, "--scale: %g is outside float32's normal range", c->scale);
    /* under mpirun (performer-mpi), FAVOR+ alone cuts the sequence: its ranks exchange states */
    if (!c->favor && tool_mpi_size() > 1)
        return tool_usage(CMD,
                          "--method %s does not run under mpirun with more than one rank (%d "
                          "here): %s; only --method favor cuts the sequence across ranks "
                          "(or start it without mpirun)",
                          method_names[c->method], tool_mpi_size(),
                          c->method == 0 ? "exact attention needs every key on every rank "
                                           "(each query's softmax runs over all of them)"
                                         : "its samples are drawn from every key, which every "
                                           "rank would need");
    return TOOL_EXIT_OK;
}

/* ---- input checks -------------------------------------------------------------------------- */

static const char *dtype_desc(pf_dtype t) {
    switch (t) {
    case PF_F32:
        return "float32 ('<f4')";
    case PF_I32:
        return "int32 ('<i4')";
    case PF_I64:
        return "int64 ('<i8')";
    case PF_F16:
        return "float16 ('<f2')";
    case PF_BF16:
        return "bfloat16";
    }
    return "unknown";
}

/* Reads a float32 array, or a float16 one widened to float32 (exactly; *half set, if not NULL,
 * to whether it was); 0 or an exit code (after the message). */
static int load_f32(const char *path, pf_array *a, int *half) {
    char msg[1024];
    if (half) *half = 0;
    /* mapped, not copied: the inputs are only read */
    if (pf_npy_map(path, a, msg, sizeof(msg)) != PF_OK) return tool_fail(CMD, "%s", msg);
    if (a->dtype == PF_F16) {
        const int64_t n = pf_array_size(a);
        float *w = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
        if (!w) {
            pf_array_free(a);
            return tool_fail(CMD, "%s: out of memory widening float16 to float32", path);
        }
        pf_convert(w, PF_F32, a->data, PF_F16, (size_t)n);
        pf_array wide = *a;
        a->ndim = 0; /* (its shape is kept in wide) */
        pf_array_free(a);
        wide.dtype = PF_F32;
        wide.data = w;
        wide.map_ = NULL;
        wide.map_len_ = 0;
        *a = wide;
        if (half) *half = 1;
        return 0;
    }
    if (a->dtype != PF_F32) {
        tool_fail(CMD, "%s: dtype %s is not supported here; expected float32 ('<f4') or float16 "
                       "('<f2')", path, dtype_desc(a->dtype));
        pf_array_free(a);
        return TOOL_EXIT_FAIL;
    }
    return 0;
}

/* The flat index of the first NaN or Inf in rows [o, o + n) of every (.., L, w) block of a
 * (its last two dimensions L and w), or INT64_MAX if there is none. */
static int64_t first_nonfinite_rows(const pf_array *a, int o, int n) {
    const float *x = a->data;
    int64_t w = a->shape[a->ndim - 1], L = a->shape[a->ndim - 2];
    int64_t blocks = pf_array_size(a) / (L * w);
    for (int64_t b = 0; b < blocks; b++) {
        for (int64_t i = (b * L + o) * w, end = i + (int64_t)n * w; i < end; i++) {
            if (!isfinite(x[i])) return i;
        }
    }
    return INT64_MAX;
}

/* Reports element i of a (path) as NaN or Inf, with its flat and multi-index. */
static int report_nonfinite(const char *path, const pf_array *a, int64_t i) {
    int64_t idx[PF_NPY_MAX_DIMS], r = i;
    for (int j = a->ndim - 1; j >= 0; j--) {
        idx[j] = r % a->shape[j];
        r /= a->shape[j];
    }
    char where[256];
    tool_shape_str(where, sizeof(where), idx, a->ndim);
    return tool_fail(CMD, "%s: contains NaN or Inf at index %lld (element %s)", path, (long long)i,
                     where);
}

/* The first NaN or Inf of a float32 array of rank 2 or more, reported. */
static int check_finite(const char *path, const pf_array *a) {
    int64_t i = first_nonfinite_rows(a, 0, (int)a->shape[a->ndim - 2]);
    return i == INT64_MAX ? 0 : report_nonfinite(path, a, i);
}

/* Exact attention and FAVOR+ refuse a NaN or Inf in Q, K, V or dO themselves (PF_ENONFINITE)
 * in a pass they make anyway, so the tool does not read the inputs once more to look. */
static int finite_checked_by_library(const attn_cfg *c) {
    return c->method == 0 || c->method == 1;
}

/* Every dim of a is in [1, INT_MAX]. */
static int check_dims(const char *path, const pf_array *a) {
    char s[256];
    for (int j = 0; j < a->ndim; j++) {
        if (a->shape[j] < 1)
            return tool_fail(CMD, "%s: shape %s has an empty dimension", path,
                             tool_shape_str(s, sizeof(s), a->shape, a->ndim));
        if (a->shape[j] > INT_MAX)
            return tool_fail(CMD, "%s: shape %s has a dimension above %d", path,
                             tool_shape_str(s, sizeof(s), a->shape, a->ndim), INT_MAX);
    }
    return 0;
}

typedef struct attn_inputs {
    pf_array q, k, v, w, lens, dout;
    int32_t *key_len; /* B lengths, or NULL */
    pf_shape shape;
    int rank; /* 2, 3 or 4 */
    int half; /* Q, K and V were float16 (widened): the output is written in float16 */
} attn_inputs;

static void free_inputs(attn_inputs *in) {
    pf_array_free(&in->q);
    pf_array_free(&in->k);
    pf_array_free(&in->v);
    pf_array_free(&in->w);
    pf_array_free(&in->lens);
    pf_array_free(&in->dout);
    free(in->key_len);
    in->key_len = NULL;
}

/* Q, K, V: read, type, rank, shapes against each other, values. */
static int load_qkv(const attn_cfg *c, attn_inputs *in) {
    int rc;
    char s1[256], s2[256];
    int h[3];
    if ((rc = load_f32(c->q, &in->q, &h[0])) || (rc = load_f32(c->k, &in->k, &h[1])) ||
        (rc = load_f32(c->v, &in->v, &h[2])))
        return rc;
    in->half = h[0] && h[1] && h[2]; /* float16 in: the output is written in float16 */
    const pf_array *arr[3] = {&in->q, &in->k, &in->v};
    const char *path[3] = {c->q, c->k, c->v};
    for (int t = 0; t < 3; t++) {
        if (arr[t]->ndim < 2 || arr[t]->ndim > 4)
            return tool_fail(CMD,
                             "%s: shape %s has rank %d; expected (L,d), (H,L,d) or "
                             "(B,H,L,d)",
                             path[t], tool_shape_str(s1, sizeof(s1), arr[t]->shape, arr[t]->ndim),
                             arr[t]->ndim);
        if ((rc = check_dims(path[t], arr[t]))) return rc;
    }
    int r = in->q.ndim;
    for (int t = 1; t < 3; t++) {
        if (arr[t]->ndim != r)
            return tool_fail(CMD,
                             "%s has rank %d but %s has rank %d; Q, K and V must have the "
                             "same rank",
                             path[t], arr[t]->ndim, c->q, r);
        for (int j = 0; j < r - 2; j++) {
            if (arr[t]->shape[j] != in->q.shape[j])
                return tool_fail(CMD,
                                 "%s: shape %s and %s: shape %s differ in the leading "
                                 "(batch, head) dimensions",
                                 c->q, tool_shape_str(s1, sizeof(s1), in->q.shape, r), path[t],
                                 tool_shape_str(s2, sizeof(s2), arr[t]->shape, r));
        }
    }
    int64_t d = in->q.shape[r - 1], dk = in->k.shape[r - 1];
    int64_t Lk = in->k.shape[r - 2], Lv = in->v.shape[r - 2];
    if (d != dk)
        return tool_fail(CMD, "%s and %s: the query and key widths differ (d = %lld vs %lld)", c->q,
                         c->k, (long long)d, (long long)dk);
    if (Lk != Lv)
        return tool_fail(CMD, "%s and %s: the key and value lengths differ (Lk = %lld vs %lld)",
                         c->k, c->v, (long long)Lk, (long long)Lv);
    in->rank = r;
    in->shape.B = r == 4 ? (int)in->q.shape[0] : 1;
    in->shape.H = r >= 3 ? (int)in->q.shape[r - 3] : 1;
    in->shape.Lq = (int)in->q.shape[r - 2];
    in->shape.Lk = (int)Lk;
    in->shape.d = (int)d;
    in->shape.dv = (int)in->v.shape[r - 1];
    if (c->causal && in->shape.Lq != in->shape.Lk)
        return tool_fail(CMD, "--causal needs as many queries as keys (Lq = %d, Lk = %d)",
                         in->shape.Lq, in->shape.Lk);
    /* exact attention and FAVOR+ check their inputs where they read them anyway (a NaN or Inf
     * is PF_ENONFINITE, then located by find_nonfinite); RA and LARA are checked here */
    for (int t = 0; t < 3 && !finite_checked_by_library(c); t++) {
        if ((rc = check_finite(path[t], arr[t]))) return rc;
    }
    return 0;
}

/* --key-lengths: (B,) of int32 or int64, each in [1, Lk]. */
static int load_key_lengths(const attn_cfg *c, attn_inputs *in) {
    char msg[1024], s[256];
    pf_array *a = &in->lens;
    if (pf_npy_read(c->key_lengths, a, msg, sizeof(msg)) != PF_OK) return tool_fail(CMD, "%s", msg);
    if (a->dtype != PF_I32 && a->dtype != PF_I64)
        return tool_fail(CMD,
                         "%s: dtype %s is not supported here; expected int32 ('<i4') or "
                         "int64 ('<i8')",
                         c->key_lengths, dtype_desc(a->dtype));
    int B = in->shape.B;
    if (a->ndim != 1 || a->shape[0] != B)
        return tool_fail(CMD, "%s: shape %s; expected (%d,), one length per batch item",
                         c->key_lengths, tool_shape_str(s, sizeof(s), a->shape, a->ndim), B);
    in->key_len = malloc(sizeof(int32_t) * (size_t)B);
    if (!in->key_len) return tool_fail(CMD, "out of memory");
    for (int b = 0; b < B; b++) {
        int64_t x =
            a->dtype == PF_I32 ? ((const int32_t *)a->data)[b] : ((const int64_t *)a->data)[b];
        if (x < 1 || x > in->shape.Lk)
            return tool_fail(CMD, "%s: key length %lld at index %d is out of range [1, %d]",
                             c->key_lengths, (long long)x, b, in->shape.Lk);
        in->key_len[b] = (int32_t)x;
    }
    return 0;
}

/* --w: (m,d) or (H,m,d), finite. */
static int load_w(const attn_cfg *c, attn_inputs *in) {
    int rc;
    char s[256];
    if ((rc = load_f32(c->w, &in->w, NULL))) return rc;
    const pf_array *w = &in->w;
    int ok = (w->ndim == 2 || w->ndim == 3) && w->shape[w->ndim - 1] == in->shape.d &&
             (w->ndim == 2 || w->shape[0] == in->shape.H);
    if (!ok)
        return tool_fail(CMD, "%s: shape %s; expected (m, %d) or (%d, m, %d) (one W per head)",
                         c->w, tool_shape_str(s, sizeof(s), w->shape, w->ndim), in->shape.d,
                         in->shape.H, in->shape.d);
    if ((rc = check_dims(c->w, w))) return rc;
    return check_finite(c->w, w);
}

/* --grad-out: the output's shape, float32, finite. */
static int load_dout(const attn_cfg *c, attn_inputs *in, const int64_t *oshape) {
    int rc;
    char s1[256], s2[256];
    if ((rc = load_f32(c->grad_out, &in->dout, NULL))) return rc;
    int same = in->dout.ndim == in->rank;
    for (int j = 0; same && j < in->rank; j++) same = in->dout.shape[j] == oshape[j];
    if (!same)
        return tool_fail(CMD, "%s: shape %s; expected the output's shape %s", c->grad_out,
                         tool_shape_str(s1, sizeof(s1), in->dout.shape, in->dout.ndim),
                         tool_shape_str(s2, sizeof(s2), oshape, in->rank));
    return finite_checked_by_library(c) ? 0 : check_finite(c->grad_out, &in->dout);
}

/* ---- outputs ------------------------------------------------------------------------------- */

/* The outputs, checked before any input is read (tool_outputs_add), and no input among them.
 * 0 or an exit code. */
static int plan_outputs(const attn_cfg *c, tool_outputs *outs) {
    int rc;
    tool_outputs_init(outs, CMD);
    if ((rc = tool_outputs_add(outs, "--out", c->out))) return rc;
    if (c->save_w && (rc = tool_outputs_add(outs, "--save-w", c->save_w))) return rc;
    if (c->grad_prefix) {
        static const char *const ext[3] = {"dq", "dk", "dv"};
        for (int t = 0; t < 3; t++) {
            char path[4096];
            int n = snprintf(path, sizeof(path), "%s.%s.npy", c->grad_prefix, ext[t]);
            if (n < 0 || (size_t)n >= sizeof(path))
                return tool_usage(CMD, "--grad-prefix: path too long");
            if ((rc = tool_outputs_add(outs, "--grad-prefix", path))) return rc;
        }
    }
    const char *flag[6] = {"--q", "--k", "--v", "--w", "--key-lengths", "--grad-out"};
    const char *path[6] = {c->q, c->k, c->v, c->w, c->key_lengths, c->grad_out};
    for (int i = 0; i < 6; i++) {
        if ((rc = tool_outputs_check_input(outs, flag[i], path[i]))) return rc;
    }
    return 0;
}

/* Writes outs->o[i] from a to its temporary name. 0 or an exit code. */
static int stage_npy(tool_outputs *outs, int i, const pf_array *a) {
    char msg[1024];
    const char *tmp = tool_outputs_stage(outs, i);
    if (!tmp) return TOOL_EXIT_FAIL;
    if (pf_npy_write(tmp, a, msg, sizeof(msg)) != PF_OK)
        return tool_fail(CMD, "%s: %s", outs->o[i].path, msg);
    return 0;
}

/* ---- this process's rows ------------------------------------------------------------------- */

/* The rows of the sequence this process computes: all of them, or, FAVOR+ in performer-mpi, its
 * rank's slice: rows [L p / N, L (p + 1) / N) of the queries and of the keys of rank p of N. The
 * inputs are mapped, so a rank reads only the pages of its own rows. */
typedef struct attn_rows {
    int split;                     /* the sequence is cut across the ranks (pf_mpi_attn_favor) */
    int qo, qn, ko, kn;            /* query rows [qo, qo + qn), key rows [ko, ko + kn) */
    pf_shape shape;                /* the inputs' shape with Lq = qn, Lk = kn */
    const float *q, *k, *v, *dout; /* (B,H,qn,d), (B,H,kn,d), (B,H,kn,dv), (B,H,qn,dv) */
    float *copy[4];                /* the rows copied out of the inputs, when not contiguous */
} attn_rows;

/* The number of (.., L, w) blocks of a: the product of its leading dimensions. */
static size_t blocks_of(const pf_array *a) {
    size_t blocks = 1;
    for (int j = 0; j < a->ndim - 2; j++) blocks *= (size_t)a->shape[j];
    return blocks;
}

/* Rows [o, o + n) of every (.., L, w) block of a: a pointer into a when they are contiguous
 * (one block, or all the rows), else a copy, left in *copy. NULL if out of memory. */
static const float *rows_of(const pf_array *a, int o, int n, float **copy) {
    const float *x = a->data;
    size_t w = (size_t)a->shape[a->ndim - 1], L = (size_t)a->shape[a->ndim - 2];
    size_t blocks = blocks_of(a), rw = (size_t)n * w;
    if (blocks == 1 || (o == 0 && (size_t)n == L)) return x + (size_t)o * w;
    *copy = malloc(sizeof(float) * blocks * rw);
    if (!*copy) return NULL;
    for (size_t b = 0; b < blocks; b++)
        memcpy(*copy + b * rw, x + (b * L + (size_t)o) * w, sizeof(float) * rw);
    return *copy;
}

/* This process's rows of the inputs (split: its rank's). 0, or an exit code after a message. */
static int take_rows(const attn_cfg *c, attn_rows *rw, const attn_inputs *in, int split) {
    const pf_shape *sh = &in->shape;
    rw->split = split;
    rw->shape = *sh;
    rw->qn = sh->Lq;
    rw->kn = sh->Lk;
    if (split) {
        int N = tool_mpi_size(), p = tool_mpi_rank();
        if (sh->Lq < N || sh->Lk < N)
            return tool_fail(CMD,
                             "%s: %d %s cannot be cut across %d ranks: each rank takes one row "
                             "of the queries and one of the keys at least; start at most %d ranks",
                             sh->Lq < N ? c->q : c->k, sh->Lq < N ? sh->Lq : sh->Lk,
                             sh->Lq < N ? "queries" : "keys", N, sh->Lq < sh->Lk ? sh->Lq : sh->Lk);
        if ((size_t)sh->B * (size_t)sh->H > INT_MAX)
            return tool_fail(CMD, "B x H = %d x %d: more blocks than MPI can count", sh->B, sh->H);
        tool_mpi_cut(sh->Lq, p, N, &rw->qo, &rw->qn);
        tool_mpi_cut(sh->Lk, p, N, &rw->ko, &rw->kn);
        rw->shape.Lq = rw->qn;
        rw->shape.Lk = rw->kn;
    }
    rw->q = rows_of(&in->q, rw->qo, rw->qn, &rw->copy[0]);
    rw->k = rows_of(&in->k, rw->ko, rw->kn, &rw->copy[1]);
    rw->v = rows_of(&in->v, rw->ko, rw->kn, &rw->copy[2]);
    rw->dout = in->dout.data ? rows_of(&in->dout, rw->qo, rw->qn, &rw->copy[3]) : NULL;
    if (!rw->q || !rw->k || !rw->v || (in->dout.data && !rw->dout))
        return tool_fail(CMD, "out of memory for the rows of this rank");
    return 0;
}

static void free_rows(attn_rows *rw) {
    for (int t = 0; t < 4; t++) free(rw->copy[t]);
}

/* After PF_ENONFINITE: the first NaN or Inf among the inputs, reported as check_finite does,
 * or 0 if they are all finite (the computation overflowed). Split, each rank looks at its own
 * rows and the ranks take the first of all (collective): the element one process names. */
static int find_nonfinite(const attn_cfg *c, const attn_inputs *in, const attn_rows *rw) {
    const pf_array *arr[4] = {&in->q, &in->k, &in->v, &in->dout};
    const char *path[4] = {c->q, c->k, c->v, c->grad_out};
    const int o[4] = {rw->qo, rw->ko, rw->ko, rw->qo}, n[4] = {rw->qn, rw->kn, rw->kn, rw->qn};
    int64_t at[4];
    for (int t = 0; t < 4; t++)
        at[t] = arr[t]->data ? first_nonfinite_rows(arr[t], o[t], n[t]) : INT64_MAX;
    tool_mpi_min_i64(at, 4);
    for (int t = 0; t < 4; t++) {
        if (at[t] != INT64_MAX) return report_nonfinite(path[t], arr[t], at[t]);
    }
    return 0;
}

/* A failed library call; detail, if not empty, is what the ranks agreed went wrong. */
static int library_error(const char *what, pf_status st, const char *detail) {
    const char *hint = "";
    if (st == PF_EDOMAIN || st == PF_ENONFINITE)
        hint = " (a softmax or feature denominator is zero or not finite: try --kernel positive, "
               "a smaller --scale, or --eps > 0)";
    if (st == PF_ENOTSUP) hint = " (not available in this build yet)";
    return tool_fail(CMD, "%s failed: %s%s%s%s%s", what, pf_status_str(st), *detail ? " (" : "",
                     detail, *detail ? ")" : "", hint);
}

static int first_nonfinite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) return 1;
    }
    return 0;
}

/* Stages output i, the array a whose data are this process's rows of each block (rows, (.., n, w)
 * of the (.., L, w) of a's shape). Split, every rank's rows are gathered into full on rank 0
 * first: collective, so every rank calls it for every output whatever rc (the exit code so far;
 * a run that failed stages nothing more), and none waits for another. Returns the exit code. */
static int stage_rows(tool_outputs *outs, int i, pf_array a, const float *rows, float *full,
                      const attn_rows *rw, int rc, int half) {
    if (rw->split) {
        int L = (int)a.shape[a.ndim - 2], w = (int)a.shape[a.ndim - 1];
        if (tool_mpi_gather_rows(full, rows, blocks_of(&a), L, w) != 0 && !rc)
            rc = tool_fail(CMD, "gathering the rows on rank 0 failed");
        rows = full;
    }
    a.data = (void *)rows;
    a.map_ = NULL;
    uint16_t *h = NULL;
    if (!rc && half && tool_mpi_rank() == 0) { /* float16, rounded once to nearest even */
        const int64_t n = pf_array_size(&a);
        if (!(h = malloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1))))
            rc = tool_fail(CMD, "out of memory for the float16 output");
        else {
            pf_convert(h, PF_F16, rows, PF_F32, (size_t)n);
            a.dtype = PF_F16;
            a.data = h;
        }
    }
    if (!rc && tool_mpi_rank() == 0) rc = stage_npy(outs, i, &a);
    free(h);
    return rc;
}

/* ---- the command --------------------------------------------------------------------------- */

/* One run: its inputs, the options made from them and the flags, and its results, freed together
 * by state_free. */
typedef struct attn_state {
    const attn_cfg *c;
    /* performer-mpi: FAVOR+ cuts the sequence across the ranks (one rank: all of it, the same
     * bits as one process), rank 0 checks and writes the outputs; otherwise one process */
    int split, writer;
    tool_outputs *outs;
    attn_inputs in;
    attn_rows rw;
    int64_t oshape[4]; /* the output's shape: in.rank dimensions */
    pf_attn_opts opts;
    pf_favor_opts fav;
    pf_sampling_opts samp;
    float *W;          /* the W drawn (m, d), or NULL (--w, or not FAVOR+) */
    int64_t wshape[3]; /* fav.W's shape: wrank dimensions */
    int wrank;
    float *out, *lse;     /* this process's rows of the output; exact's log-sum-exp (gradients) */
    float *dq, *dk, *dv;  /* this process's rows of the gradients */
    float *full;          /* split, rank 0: an output gathered whole */
    pf_favor_saved *saved; /* FAVOR+'s features kept for the backward, or NULL */
    char detail[256];     /* split: what the ranks agreed went wrong */
    double t0, t_read, t_work;
} attn_state;

static void state_free(attn_state *s) {
    if (s->outs) tool_outputs_discard(s->outs);
    free_rows(&s->rw);
    free_inputs(&s->in);
    free(s->out);
    free(s->lse);
    free(s->W);
    free(s->dq);
    free(s->dk);
    free(s->dv);
    free(s->full);
    free(s->outs);
    pf_favor_saved_free(s->saved);
}

/* Floats in this process's rows of every (B, H) block: rows of width w. */
static size_t rows_count(const attn_state *s, int rows, int w) {
    return (size_t)s->in.shape.B * (size_t)s->in.shape.H * (size_t)rows * (size_t)w;
}

/* 1. The outputs, then the inputs, all checked before any computing; the output's shape. */
static int read_inputs(attn_state *s) {
    const attn_cfg *c = s->c;
    int rc = 0;
    if (s->writer) rc = plan_outputs(c, s->outs);
    if (!rc) rc = load_qkv(c, &s->in);
    if (!rc && c->key_lengths) rc = load_key_lengths(c, &s->in);
    if (!rc && c->w) rc = load_w(c, &s->in);
    if (rc) return rc;
    const int r = s->in.rank;
    for (int j = 0; j < r - 2; j++) s->oshape[j] = s->in.q.shape[j];
    s->oshape[r - 2] = s->in.shape.Lq;
    s->oshape[r - 1] = s->in.shape.dv;
    return c->grad_out ? load_dout(c, &s->in, s->oshape) : 0;
}

/* 2. The attention's options, checked against the inputs, and RA's and LARA's sampling. */
static int set_options(attn_state *s) {
    const attn_cfg *c = s->c;
    const pf_shape *sh = &s->in.shape;
    s->opts.scale = (float)c->scale;
    s->opts.causal = c->causal;
    s->opts.key_len = s->in.key_len;
    s->opts.threads = c->threads;
    pf_status st = pf_attn_check(sh, &s->opts);
    if (st != PF_OK)
        return tool_fail(CMD, "these inputs and options do not go together (%s)",
                         pf_status_str(st));
    if (c->method != 2 && c->method != 3) return 0;
    /* LARA's proposals: C contiguous chunks, each holding a query and a valid key */
    int fit = sh->Lq < sh->Lk ? sh->Lq : sh->Lk;
    for (int b = 0; s->in.key_len && b < sh->B; b++)
        fit = s->in.key_len[b] < fit ? s->in.key_len[b] : fit;
    s->samp.seed = c->seed;
    s->samp.samples = c->samples ? c->samples : c->method == 2 ? 16 : 1;
    s->samp.deterministic = c->deterministic;
    s->samp.proposals = c->proposals ? c->proposals : fit < 16 ? fit : 16;
    if (c->method == 3 && s->samp.proposals > fit)
        return tool_fail(CMD,
                         "--proposals %d: LARA needs every chunk to hold a query and a valid "
                         "key, so at most %d here (Lq = %d, shortest key length %d)",
                         s->samp.proposals, fit, sh->Lq, fit);
    return 0;
}

/* 3. FAVOR+'s options and W: --w's, or drawn (split: every rank draws the same, from the same
 * seed). */
static int set_favor(attn_state *s) {
    const attn_cfg *c = s->c;
    const attn_inputs *in = &s->in;
    const int d = in->shape.d;
    pf_favor_opts *fav = &s->fav;
    fav->kernel = c->kernel;
    fav->oprf_a_given = c->oprf_a_given;
    fav->oprf_a = (float)c->oprf_a;
    fav->eps = (float)c->eps;
    fav->chunk = c->chunk;
    if (c->w) {
        fav->W = in->w.data;
        fav->m = (int)in->w.shape[in->w.ndim - 2];
        fav->w_per_head = in->w.ndim == 3;
        s->wrank = in->w.ndim;
        for (int j = 0; j < s->wrank; j++) s->wshape[j] = in->w.shape[j];
        return 0;
    }
    /* elu + 1 without --w: the map of each row itself, W = I (d rows) */
    const int m = c->kernel == PF_KERNEL_ELU ? d : c->m;
    if (!(s->W = malloc(sizeof(float) * (size_t)m * (size_t)d)))
        return tool_fail(CMD, "out of memory for W (%d x %d)", m, d);
    if (c->kernel == PF_KERNEL_ELU) {
        for (size_t i = 0; i < (size_t)m * (size_t)d; i++) s->W[i] = 0.0f;
        for (int i = 0; i < d; i++) s->W[(size_t)i * (size_t)d + (size_t)i] = 1.0f;
    } else {
        pf_status st = pf_projection_draw(s->W, m, d, c->proj, c->norm, c->seed, 0);
        if (st != PF_OK) return library_error("drawing W", st, "");
    }
    fav->W = s->W;
    fav->m = m;
    s->wshape[0] = m;
    s->wshape[1] = d;
    return 0;
}

/* After a failed library call: the first NaN or Inf among the inputs if that was it (split: a
 * collective search), else the library's error. The exit code. */
static int call_failed(const attn_state *s, const char *what, pf_status st) {
    int rc = st == PF_ENONFINITE ? find_nonfinite(s->c, &s->in, &s->rw) : 0;
    return rc ? rc : library_error(what, st, s->detail);
}

/* The chosen method on this process's rows into s->out (split: collective, the status and
 * s->detail the same on every rank). */
static pf_status attention(attn_state *s) {
    const attn_cfg *c = s->c;
    const pf_shape *sh = &s->in.shape;
    const float *Q = s->rw.q, *K = s->rw.k, *V = s->rw.v;
    if (s->split)
        return tool_mpi_attn_favor(s->out, Q, K, V, &s->rw.shape, &s->opts, &s->fav, s->detail,
                                   sizeof(s->detail));
    switch (c->method) {
    case 1:
        return s->saved ? pf_attn_favor_save(s->out, Q, K, V, sh, &s->opts, &s->fav, s->saved)
                        : pf_attn_favor(s->out, Q, K, V, sh, &s->opts, &s->fav);
    case 2:
        return pf_attn_ra(s->out, Q, K, V, sh, &s->opts, &s->samp);
    case 3:
        return pf_attn_lara(s->out, Q, K, V, sh, &s->opts, &s->samp);
    default:
        return pf_attn_exact(s->out, s->lse, Q, K, V, sh, &s->opts);
    }
}

/* 4. The attention on this process's rows, its result checked; the ranks agree. */
static int forward(attn_state *s) {
    static const char *const what[4] = {"exact attention", "FAVOR+ attention",
                                        "randomized attention (RA)", "LARA"};
    const attn_cfg *c = s->c;
    const pf_shape *sh = &s->in.shape;
    const size_t no = rows_count(s, s->rw.shape.Lq, sh->dv);
    const int want_lse = c->grad_out && !c->favor;
    int rc = 0;
    s->out = malloc(sizeof(float) * no);
    if (want_lse) s->lse = malloc(sizeof(float) * rows_count(s, sh->Lq, 1));
    if (!s->out || (want_lse && !s->lse)) rc = tool_fail(CMD, "out of memory for the output");
    if ((rc = tool_mpi_agree(rc))) return rc;
    /* with gradients, FAVOR+ keeps its features for the backward (or, short of memory for
     * them, the backward recomputes them: the same bits) */
    if (!s->split && c->favor && c->grad_out &&
        pf_favor_saved_create(&s->saved, sh, &s->opts, &s->fav, 0) != PF_OK)
        s->saved = NULL;
    /* (split: the ranks agree on the status and its message: all of them stop here together) */
    pf_status st = attention(s);
    if (st != PF_OK) return call_failed(s, what[c->method], st);
    if (first_nonfinite(s->out, no))
        rc = tool_fail(CMD, "the result contains NaN or Inf; nothing written");
    return tool_mpi_agree(rc);
}

/* 5. --grad-out: the gradients of sum(out * dO) on this process's rows, checked; the ranks
 * agree. */
static int backward(attn_state *s) {
    const attn_cfg *c = s->c;
    const pf_shape *sh = &s->in.shape, *ls = &s->rw.shape;
    const size_t nq = rows_count(s, ls->Lq, sh->d), nk = rows_count(s, ls->Lk, sh->d);
    const size_t nv = rows_count(s, ls->Lk, sh->dv);
    int rc = 0;
    s->dq = malloc(sizeof(float) * nq);
    s->dk = malloc(sizeof(float) * nk);
    s->dv = malloc(sizeof(float) * nv);
    if (!s->dq || !s->dk || !s->dv) rc = tool_fail(CMD, "out of memory for the gradients");
    if ((rc = tool_mpi_agree(rc))) return rc;
    const float *Q = s->rw.q, *K = s->rw.k, *V = s->rw.v, *dO = s->rw.dout;
    pf_status st;
    if (s->split)
        st = tool_mpi_attn_favor_backward(s->dq, s->dk, s->dv, dO, Q, K, V, s->out, ls, &s->opts,
                                          &s->fav, s->detail, sizeof(s->detail));
    else if (s->saved)
        st = pf_attn_favor_backward_saved(s->dq, s->dk, s->dv, dO, Q, K, V, s->out, sh, &s->opts,
                                          &s->fav, s->saved);
    else if (c->favor)
        st = pf_attn_favor_backward(s->dq, s->dk, s->dv, dO, Q, K, V, s->out, sh, &s->opts,
                                    &s->fav);
    else
        st = pf_attn_exact_backward(s->dq, s->dk, s->dv, dO, Q, K, V, s->out, s->lse, sh,
                                    &s->opts);
    if (st != PF_OK)
        return call_failed(s, c->favor ? "the FAVOR+ backward pass" : "the exact backward pass",
                           st);
    if (first_nonfinite(s->dq, nq) || first_nonfinite(s->dk, nk) || first_nonfinite(s->dv, nv))
        rc = tool_fail(CMD, "the gradients contain NaN or Inf; nothing written");
    return tool_mpi_agree(rc);
}

/* 6. The outputs, all or none: each to its temporary name, then all renamed (split: rank 0
 * gathers every rank's rows of each into full, stages it, and renames them all at the end). */
static int write_outputs(attn_state *s) {
    const attn_cfg *c = s->c;
    const pf_shape *sh = &s->in.shape;
    int rc = 0;
    if (s->split && s->writer) {
        size_t most = rows_count(s, sh->Lq, sh->dv);
        if (c->grad_out) {
            size_t g = rows_count(s, sh->Lq > sh->Lk ? sh->Lq : sh->Lk,
                                  sh->d > sh->dv ? sh->d : sh->dv);
            most = g > most ? g : most;
        }
        if (!(s->full = malloc(sizeof(float) * most)))
            rc = tool_fail(CMD, "out of memory for the outputs (rank 0 writes them whole)");
    }
    if ((rc = tool_mpi_agree(rc))) return rc;
    pf_array a = {.dtype = PF_F32, .ndim = s->in.rank};
    memcpy(a.shape, s->oshape, sizeof(int64_t) * (size_t)s->in.rank);
    int i = 0;
    rc = stage_rows(s->outs, i++, a, s->out, s->full, &s->rw, rc, s->in.half);
    if (c->save_w) {
        a = (pf_array){.dtype = PF_F32, .ndim = s->wrank, .data = (void *)s->fav.W};
        memcpy(a.shape, s->wshape, sizeof(int64_t) * (size_t)s->wrank);
        if (!rc && s->writer) rc = stage_npy(s->outs, i, &a);
        i++;
    }
    if (c->grad_prefix) {
        const pf_array *src[3] = {&s->in.q, &s->in.k, &s->in.v};
        float *g[3] = {s->dq, s->dk, s->dv};
        for (int t = 0; t < 3; t++)
            rc = stage_rows(s->outs, i++, *src[t], g[t], s->full, &s->rw, rc, 0);
    }
    if (!rc && s->writer) rc = tool_outputs_commit(s->outs);
    return tool_mpi_agree(rc);
}

/* --timings (collective: the slowest rank's compute time). */
static void print_timings(const attn_state *s) {
    double t_end = tool_now_ms();
    double slowest = tool_mpi_max(s->t_work - s->t_read);
    char ranks[96] = "";
    if (tool_mpi_size() > 1)
        snprintf(ranks, sizeof(ranks), " (rank 0 of %d; the slowest rank computed %.2f ms)",
                 tool_mpi_size(), slowest);
    if (s->writer)
        fprintf(stderr,
                "performer attn: read and check %.2f ms, compute %.2f ms, write %.2f ms%s\n",
                s->t_read - s->t0, s->t_work - s->t_read, t_end - s->t_work, ranks);
}

/* Under mpirun (performer-mpi) every rank runs this; the ranks agree (tool_mpi_agree) after each
 * step that can fail on some of them, so a failure anywhere ends every rank at the same point,
 * with one message. */
static int run(const attn_cfg *c) {
    attn_state s;
    memset(&s, 0, sizeof(s));
    s.c = c;
    s.split = tool_mpi_build && c->favor;
    s.writer = tool_mpi_rank() == 0;
    s.opts = pf_attn_opts_default();
    s.fav = pf_favor_opts_default();
    s.samp = pf_sampling_opts_default();
    s.wrank = 2;
    s.outs = malloc(sizeof(tool_outputs));
    int rc = s.outs ? 0 : tool_fail(CMD, "out of memory");
    if (s.outs) tool_outputs_init(s.outs, CMD);
    s.t0 = tool_now_ms();
    if (!rc) rc = read_inputs(&s);
    if (!rc) rc = set_options(&s);
    if (!rc && c->favor) rc = set_favor(&s);
    if (!rc) rc = take_rows(c, &s.rw, &s.in, s.split);
    if (!(rc = tool_mpi_agree(rc))) {
        s.t_read = tool_now_ms();
        rc = forward(&s);
    }
    if (!rc && c->grad_out) rc = backward(&s);
    if (!rc) {
        s.t_work = tool_now_ms();
        rc = write_outputs(&s);
    }
    if (!rc && c->timings) print_timings(&s);
    state_free(&s);
    return rc;
}

int cmd_attn(int argc, char **argv) {
    attn_cfg c = {.favor = 1,
                  .method = 1,
                  .kernel = PF_KERNEL_POSITIVE,
                  .m = 256,
                  .proj = PF_PROJ_ORTHOGONAL,
                  .norm = PF_NORM_CHI};
    int rc = parse_args(&c, argc, argv);
    if (rc) return rc;
    return run(&c);
}
