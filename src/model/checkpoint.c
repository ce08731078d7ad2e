/* checkpoint.c: a model to and from a safetensors file.
 *
 * Tensors: the parameters by name (model.c's param_names, llm.c's stacked (L, ...) layout),
 * "favor.W" (L, m, hd) the current projections, "favorpp.rho" (L) the running statistic, and
 * with the optimizer "adamw.m.<name>" and "adamw.v.<name>". The "__metadata__" holds
 * "format" = "performer-lm-1", the configuration and counters as "pf.<key>" strings, and any
 * pairs the caller adds (a training run's settings). Everything a run needs to continue bit for
 * bit is there: weights, moments, step, W and its stream (and seed: pf.w_seed; a file without
 * it, from before W had a seed of its own, reads as w_seed = seed). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "model/model.h"

#define FORMAT "performer-lm-1"
#define MAX_META 64

static pf_status fail(pf_status st, char *errmsg, size_t errlen, const char *path, const char *msg,
                      const char *arg) {
    if (errmsg && errlen > 0) snprintf(errmsg, errlen, "%s: %s%s", path ? path : "", msg, arg);
    return st;
}

static const char *attention_name(pf_lm_attention a) {
    return a == PF_LM_EXACT   ? "exact"
           : a == PF_LM_FAVOR ? "favor"
           : a == PF_LM_LOCAL ? "local"
                              : "favor++";
}

pf_status pf_model_save(const pf_model *m, const char *path, const char *const *meta,
                        int with_optimizer, char *errmsg, size_t errlen) {
    if (errmsg && errlen > 0) errmsg[0] = '\0';
    if (!m || !path || (with_optimizer != 0 && with_optimizer != 1))
        return fail(PF_EINVAL, errmsg, errlen, path, "bad argument", "");
    const pf_model_config *c = &m->config;
    int hd = c->d_model / c->heads;

    /* metadata: ours, then the caller's */
    char vals[14][32];
    const char *kv[2 * MAX_META + 1];
    int k = 0;
    kv[k++] = "format";
    kv[k++] = FORMAT;
#define META_INT(key, fmt, v, slot)                                                                \
    do {                                                                                           \
        snprintf(vals[slot], sizeof(vals[slot]), fmt, v);                                          \
        kv[k++] = key;                                                                             \
        kv[k++] = vals[slot];                                                                      \
    } while (0)
    META_INT("pf.context", "%d", c->context, 0);
    META_INT("pf.layers", "%d", c->layers, 1);
    META_INT("pf.d_model", "%d", c->d_model, 2);
    META_INT("pf.heads", "%d", c->heads, 3);
    kv[k++] = "pf.attention";
    kv[k++] = attention_name(c->attention);
    kv[k++] = "pf.positions";
    kv[k++] = c->positions == PF_LM_ROTARY ? "rotary" : "learned";
    kv[k++] = "pf.kernel";
    kv[k++] = pf_kernel_name(c->kernel);
    META_INT("pf.features", "%d", c->features, 4);
    META_INT("pf.redraw", "%d", c->redraw, 5);
    META_INT("pf.seed", "%" PRIu64, c->seed, 6);
    META_INT("pf.w_seed", "%" PRIu64, c->w_seed, 10);
    META_INT("pf.step", "%" PRId64, m->step, 7);
    META_INT("pf.w_stream", "%" PRId64, m->w_stream, 8);
    META_INT("pf.rho_count", "%" PRId64, m->rho_count, 9);
    META_INT("pf.window", "%d", c->window, 12);
#undef META_INT
    for (int i = 0; meta && meta[i]; i += 2) {
        if (!meta[i + 1] || strncmp(meta[i], "pf.", 3) == 0 || strcmp(meta[i], "format") == 0)
            return fail(PF_EINVAL, errmsg, errlen, path, "bad or reserved metadata key: ", meta[i]);
        for (int j = 0; j < i; j += 2) {
            if (strcmp(meta[j], meta[i]) == 0) /* the loader would refuse the file */
                return fail(PF_EINVAL, errmsg, errlen, path, "metadata key given twice: ",
                            meta[i]);
        }
        if (k + 2 > 2 * MAX_META)
            return fail(PF_EINVAL, errmsg, errlen, path, "too many metadata pairs", "");
        kv[k++] = meta[i];
        kv[k++] = meta[i + 1];
    }
    kv[k] = NULL;

    /* tensors */
    enum { MAX_T = 3 * LM_NUM_PARAMS + 2 };
    pf_st_entry t[MAX_T];
    char names[2][LM_NUM_PARAMS][64];
    int n = 0;
    for (int pass = 0; pass < (with_optimizer ? 3 : 1); pass++) {
        const float *mem = pass == 0 ? m->params_memory : pass == 1 ? m->m_memory : m->v_memory;
        size_t off = 0;
        for (int i = 0; i < LM_NUM_PARAMS; i++) {
            const char *name;
            pf_st_entry *e = &t[n];
            e->ndim = lm_param_shape(c, i, &name, e->shape);
            e->data = mem + off;
            off += m->param_sizes[i];
            if (m->param_sizes[i] == 0) continue; /* no wpe with rotary positions */
            if (pass > 0) {
                snprintf(names[pass - 1][i], sizeof(names[0][0]), "adamw.%s.%s",
                         pass == 1 ? "m" : "v", name);
                name = names[pass - 1][i];
            }
            e->name = name;
            n++;
        }
    }
    if (lm_uses_favor(c)) {
        t[n] = (pf_st_entry){.name = "favor.W", .ndim = 3, .data = m->W};
        t[n].shape[0] = c->layers;
        t[n].shape[1] = c->features;
        t[n].shape[2] = hd;
        n++;
        t[n] = (pf_st_entry){.name = "favorpp.rho", .ndim = 1, .data = m->rho};
        t[n].shape[0] = c->layers;
        n++;
    }
    return pf_st_write(path, t, n, kv, errmsg, errlen);
}

/* ---------------------------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------------------------ */

/* A metadata integer in [lo, hi], or PF_EFORMAT with a message naming the key and its value
 * (the limits are the command line's and pf_model_create's). */
static pf_status meta_int(const pf_st_file *f, const char *key, int64_t lo, int64_t hi,
                          int64_t *out, const char *path, char *errmsg, size_t errlen) {
    const char *s = pf_st_meta(f, key);
    if (!s) return fail(PF_EFORMAT, errmsg, errlen, path, "missing in __metadata__: ", key);
    char *end;
    errno = 0;
    long long v = s[0] == '-' || (s[0] >= '0' && s[0] <= '9') ? strtoll(s, &end, 10) : 0;
    if (!(s[0] == '-' || (s[0] >= '0' && s[0] <= '9')) || *end || errno || v < lo || v > hi) {
        if (errmsg && errlen > 0)
            snprintf(errmsg, errlen, "%s: %s = '%.40s' is not an integer in [%lld, %lld]", path,
                     key, s, (long long)lo, (long long)hi);
        return PF_EFORMAT;
    }
    *out = v;
    return PF_OK;
}

/* Tensor `name` is there with this shape; else PF_EFORMAT naming it. Shapes are checked
 * before the model is made: the file's tensors lie within its bytes, so a configuration
 * that agrees with them cannot ask for more memory than the file's size (a 97 KB file
 * claiming d_model 4096 is refused before anything is allocated). */
static pf_status check_tensor(const pf_st_file *f, const char *name, int ndim,
                              const int64_t *shape, const char *path, char *errmsg,
                              size_t errlen) {
    const pf_st_tensor *t = pf_st_find(f, name);
    if (!t) return fail(PF_EFORMAT, errmsg, errlen, path, "missing tensor ", name);
    int same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same)
        return fail(PF_EFORMAT, errmsg, errlen, path,
                    "shape disagrees with the configuration: tensor ", name);
    return PF_OK;
}

/* Every tensor config c needs (with_opt: the AdamW moments too), by check_tensor. */
static pf_status check_tensors(const pf_st_file *f, const pf_model_config *c, int with_opt,
                               const char *path, char *errmsg, size_t errlen) {
    pf_status st = PF_OK;
    for (int i = 0; i < LM_NUM_PARAMS && st == PF_OK; i++) {
        const char *name;
        int64_t shape[3];
        int nd = lm_param_shape(c, i, &name, shape);
        int64_t n = 1;
        for (int j = 0; j < nd; j++) n *= shape[j];
        if (n == 0) continue; /* wpe with rotary positions */
        st = check_tensor(f, name, nd, shape, path, errmsg, errlen);
        for (int pass = 1; pass <= 2 && with_opt && st == PF_OK; pass++) {
            char oname[80];
            snprintf(oname, sizeof(oname), "adamw.%s.%s", pass == 1 ? "m" : "v", name);
            st = check_tensor(f, oname, nd, shape, path, errmsg, errlen);
        }
    }
    if (st == PF_OK && lm_uses_favor(c)) {
        int64_t ws[3] = {c->layers, c->features, c->d_model / c->heads}, rs[1] = {c->layers};
        st = check_tensor(f, "favor.W", 3, ws, path, errmsg, errlen);
        if (st == PF_OK) st = check_tensor(f, "favorpp.rho", 1, rs, path, errmsg, errlen);
    }
    return st;
}

/* Copies tensor `name` (its shape checked by check_tensors) into dst; refuses NaN and Inf, and
 * with nonneg any negative value (AdamW's second moments and FAVOR++'s statistic are means of
 * squares). */
static pf_status load_tensor(const pf_st_file *f, const char *name, float *dst, int nonneg,
                             const char *path, char *errmsg, size_t errlen) {
    const pf_st_tensor *t = pf_st_find(f, name);
    if (!t) return fail(PF_EFORMAT, errmsg, errlen, path, "missing tensor ", name);
    memcpy(dst, t->data, sizeof(float) * t->count);
    if (pf_any_nonfinite(dst, t->count))
        return fail(PF_EFORMAT, errmsg, errlen, path, "NaN or Inf in tensor ", name);
    for (size_t i = 0; nonneg && i < t->count; i++) {
        if (dst[i] < 0) return fail(PF_EFORMAT, errmsg, errlen, path, "a negative value in ", name);
    }
    return PF_OK;
}

/* The counters a run continues from: pf_model's step, w_stream and rho_count. */
typedef struct lm_counters {
    int64_t step, w_stream, rho_count;
} lm_counters;

/* The metadata's format, then its integers: the configuration's into c, the counters into n. */
static pf_status read_ints(const pf_st_file *f, pf_model_config *c, lm_counters *n,
                           const char *path, char *errmsg, size_t errlen) {
    const char *fmt = pf_st_meta(f, "format");
    if (!fmt || strcmp(fmt, FORMAT) != 0)
        return fail(
            PF_EFORMAT, errmsg, errlen, path,
            "not a performer language-model checkpoint (no format=" FORMAT " in __metadata__)", "");
    int64_t v[6];
    static const struct {
        const char *key;
        int64_t lo, hi;
    } ints[] = {{"pf.context", 1, PF_LM_MAX_CONTEXT},   {"pf.layers", 1, PF_LM_MAX_LAYERS},
                {"pf.d_model", 1, PF_LM_MAX_D_MODEL},   {"pf.heads", 1, PF_LM_MAX_D_MODEL},
                {"pf.features", 0, PF_LM_MAX_FEATURES}, {"pf.redraw", 0, INT32_MAX}};
    pf_status st = PF_OK;
    for (int i = 0; i < 6 && st == PF_OK; i++)
        st = meta_int(f, ints[i].key, ints[i].lo, ints[i].hi, &v[i], path, errmsg, errlen);
    /* counters stay far below INT64_MAX, so that adding to them cannot overflow */
    if (st == PF_OK) st = meta_int(f, "pf.step", 0, INT64_MAX / 4, &n->step, path, errmsg, errlen);
    if (st == PF_OK)
        st = meta_int(f, "pf.w_stream", -1, INT64_MAX / 4, &n->w_stream, path, errmsg, errlen);
    if (st == PF_OK)
        st = meta_int(f, "pf.rho_count", 0, INT64_MAX / 4, &n->rho_count, path, errmsg, errlen);
    /* the local window (files from before it have none: the default stays) */
    int64_t w = c->window;
    if (st == PF_OK && pf_st_meta(f, "pf.window"))
        st = meta_int(f, "pf.window", 1, PF_LM_MAX_CONTEXT, &w, path, errmsg, errlen);
    if (st != PF_OK) return st;
    c->window = (int)w;
    c->context = (int)v[0];
    c->layers = (int)v[1];
    c->d_model = (int)v[2];
    c->heads = (int)v[3];
    c->features = (int)v[4];
    c->redraw = (int)v[5];
    return PF_OK;
}

/* The names pf.attention, pf.positions and pf.kernel (att, pos, kern) into c. */
static pf_status parse_names(pf_model_config *c, const char *att, const char *pos,
                             const char *kern, const char *path, char *errmsg, size_t errlen) {
    if (strcmp(att, "exact") == 0)
        c->attention = PF_LM_EXACT;
    else if (strcmp(att, "favor") == 0)
        c->attention = PF_LM_FAVOR;
    else if (strcmp(att, "favor++") == 0)
        c->attention = PF_LM_FAVORPP;
    else if (strcmp(att, "local") == 0)
        c->attention = PF_LM_LOCAL;
    else
        return fail(PF_EFORMAT, errmsg, errlen, path, "unknown pf.attention: ", att);
    if (strcmp(pos, "learned") == 0)
        c->positions = PF_LM_LEARNED;
    else if (strcmp(pos, "rotary") == 0)
        c->positions = PF_LM_ROTARY;
    else
        return fail(PF_EFORMAT, errmsg, errlen, path, "unknown pf.positions: ", pos);
    if (pf_kernel_parse(kern, &c->kernel) != PF_OK)
        return fail(PF_EFORMAT, errmsg, errlen, path, "unknown pf.kernel: ", kern);
    return PF_OK;
}

/* The configuration and counters from the metadata: read_ints, the seed, then the names. */
static pf_status read_config(const pf_st_file *f, pf_model_config *c, lm_counters *n,
                             const char *path, char *errmsg, size_t errlen) {
    pf_status st = read_ints(f, c, n, path, errmsg, errlen);
    if (st != PF_OK) return st;
    const char *seed = pf_st_meta(f, "pf.seed");
    const char *att = pf_st_meta(f, "pf.attention"), *pos = pf_st_meta(f, "pf.positions");
    const char *kern = pf_st_meta(f, "pf.kernel");
    const char *absent = !seed ? "pf.seed" : !att ? "pf.attention" : !pos ? "pf.positions"
                                                                        : !kern ? "pf.kernel"
                                                                                : NULL;
    if (absent) return fail(PF_EFORMAT, errmsg, errlen, path, "missing in __metadata__: ", absent);
    char *end;
    errno = 0;
    c->seed = strtoull(seed, &end, 10);
    if (*end || errno || seed[0] < '0' || seed[0] > '9')
        return fail(PF_EFORMAT, errmsg, errlen, path, "malformed pf.seed: ", seed);
    /* pf.w_seed: absent from files written before W had a seed of its own, whose W was seed's */
    const char *wseed = pf_st_meta(f, "pf.w_seed");
    errno = 0;
    c->w_seed = wseed ? strtoull(wseed, &end, 10) : c->seed;
    if (wseed && (*end || errno || wseed[0] < '0' || wseed[0] > '9'))
        return fail(PF_EFORMAT, errmsg, errlen, path, "malformed pf.w_seed: ", wseed);
    if (c->d_model % c->heads != 0) {
        if (errmsg && errlen > 0)
            snprintf(errmsg, errlen, "%s: pf.d_model %d is not a multiple of pf.heads %d", path,
                     c->d_model, c->heads);
        return PF_EFORMAT;
    }
    return parse_names(c, att, pos, kern, path, errmsg, errlen);
}

/* What a model of configuration c (read_config's from f) needs beyond its fields' ranges;
 * c->features becomes 1 where exact attention leaves it 0. Messages quote f's own names. */
static pf_status check_config(pf_model_config *c, const pf_st_file *f, const char *path,
                              char *errmsg, size_t errlen) {
    if (!lm_uses_favor(c) && c->features < 1) c->features = 1;
    if (c->positions == PF_LM_ROTARY && (c->d_model / c->heads) % 2)
        return fail(PF_EFORMAT, errmsg, errlen, path,
                    "rotary positions need an even head width (pf.d_model / pf.heads)", "");
    if (lm_uses_favor(c) && c->features < 1)
        return fail(PF_EFORMAT, errmsg, errlen, path, "pf.features must be >= 1 with ",
                    "FAVOR attention");
    if (c->attention == PF_LM_FAVOR && c->kernel != PF_KERNEL_POSITIVE &&
        c->kernel != PF_KERNEL_HYPERBOLIC && c->kernel != PF_KERNEL_TRIG &&
        c->kernel != PF_KERNEL_RELU && c->kernel != PF_KERNEL_ELU)
        return fail(PF_EFORMAT, errmsg, errlen, path, "pf.kernel is not a FAVOR+ map: ",
                    pf_st_meta(f, "pf.kernel"));
    pf_status st = lm_config_check(c);
    if (st == PF_ENOTSUP)
        return fail(st, errmsg, errlen, path, "this build cannot run attention ",
                    pf_st_meta(f, "pf.attention"));
    if (st != PF_OK) return fail(PF_EFORMAT, errmsg, errlen, path, "invalid configuration", "");
    return PF_OK;
}

/* Every tensor of m from f (with_opt: the AdamW moments too), by load_tensor. */
static pf_status load_tensors(pf_model *m, const pf_st_file *f, int with_opt, const char *path,
                              char *errmsg, size_t errlen) {
    pf_status st = PF_OK;
    size_t off = 0;
    for (int i = 0; i < LM_NUM_PARAMS && st == PF_OK; i++) {
        const char *name;
        int64_t shape[3];
        lm_param_shape(&m->config, i, &name, shape);
        if (m->param_sizes[i] > 0) {
            st = load_tensor(f, name, m->params_memory + off, 0, path, errmsg, errlen);
            for (int pass = 1; pass <= 2 && with_opt && st == PF_OK; pass++) {
                char oname[80];
                snprintf(oname, sizeof(oname), "adamw.%s.%s", pass == 1 ? "m" : "v", name);
                st = load_tensor(f, oname, (pass == 1 ? m->m_memory : m->v_memory) + off,
                                 pass == 2, path, errmsg, errlen);
            }
        }
        off += m->param_sizes[i];
    }
    if (st == PF_OK && lm_uses_favor(&m->config)) {
        st = load_tensor(f, "favor.W", m->W, 0, path, errmsg, errlen);
        if (st == PF_OK) st = load_tensor(f, "favorpp.rho", m->rho, 1, path, errmsg, errlen);
    }
    return st;
}

/* Every metadata pair of f into m->meta, for pf_model_meta. */
static pf_status copy_meta(pf_model *m, const pf_st_file *f, const char *path, char *errmsg,
                           size_t errlen) {
    m->meta = calloc((size_t)(2 * f->nmeta + 1), sizeof(char *));
    if (!m->meta) return fail(PF_ENOMEM, errmsg, errlen, path, "out of memory", "");
    for (int i = 0; i < 2 * f->nmeta; i++) {
        m->meta[i] = strdup(f->meta[i]);
        if (!m->meta[i]) return fail(PF_ENOMEM, errmsg, errlen, path, "out of memory", "");
    }
    return PF_OK;
}

static pf_status load_into(pf_model **out, const pf_st_file *f, const char *path, char *errmsg,
                           size_t errlen) {
    pf_model_config c = pf_model_config_default();
    lm_counters n = {0, 0, 0};
    pf_status st = read_config(f, &c, &n, path, errmsg, errlen);
    if (st == PF_OK) st = check_config(&c, f, path, errmsg, errlen);
    if (st != PF_OK) return st;
    int with_opt = pf_st_find(f, "adamw.m.wte") != NULL;
    st = check_tensors(f, &c, with_opt, path, errmsg, errlen);
    if (st != PF_OK) return st;
    pf_model *m = NULL;
    st = pf_model_create(&m, &c);
    if (st != PF_OK)
        return fail(st, errmsg, errlen, path, "cannot create the model: ", pf_status_str(st));
    st = load_tensors(m, f, with_opt, path, errmsg, errlen);
    if (st == PF_OK) {
        if (lm_uses_favor(&c)) m->w_stream = n.w_stream;
        m->step = n.step;
        m->rho_count = n.rho_count;
        lm_favorpp_refresh(m);
        st = copy_meta(m, f, path, errmsg, errlen);
    }
    if (st != PF_OK) {
        pf_model_free(m);
        return st;
    }
    *out = m;
    return PF_OK;
}

pf_status pf_model_load(pf_model **model, const char *path, char *errmsg, size_t errlen) {
    if (errmsg && errlen > 0) errmsg[0] = '\0';
    if (!model || !path) return fail(PF_EINVAL, errmsg, errlen, path, "bad argument", "");
    *model = NULL;
    pf_st_file f;
    pf_status st = pf_st_read(path, &f, errmsg, errlen);
    if (st != PF_OK) return st;
    st = load_into(model, &f, path, errmsg, errlen);
    pf_st_free(&f);
    return st;
}

const char *pf_model_meta(const pf_model *m, const char *key) {
    if (!m || !key || !m->meta) return NULL;
    for (char **p = m->meta; p[0]; p += 2) {
        if (strcmp(p[0], key) == 0) return p[1];
    }
    return NULL;
}
