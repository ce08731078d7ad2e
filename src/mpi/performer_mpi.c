/* performer_mpi.c: sequence-parallel FAVOR+ over MPI (performer_mpi.h).
 *
 * A user of the public header like any other: the arithmetic is the core's pf_favor_slice_*
 * functions; this file only agrees on arguments, moves states and agrees on the outcome.
 *
 * A call, on every rank, runs the same sequence of collectives whatever happens, so no rank can
 * wait for one that gave up:
 *   1. agree: allgather a descriptor (the rank's own verdict on its arguments, its shape, every
 *      option, hashes of W and key_len); every rank reads the same table and reaches the same
 *      verdict; a bad one ends the call on every rank before any data moves;
 *   2. FAVOR++ (A fitted) and FAVOR#: the fit statistics of the whole sequence (a total);
 *   3. the key states: bidirectional the total, causal each rank's exclusive prefix; the
 *      backward also the state gradients (total, or each rank's exclusive suffix);
 *   4. agree on the outcome: the worst status of any rank (MPI_MAXLOC), so every rank returns it.
 * A rank whose computation failed in 2 or 3 still takes part, with an empty state.
 *
 * Totals and prefixes run in a fixed tree: recursive doubling by rank (round k: send to rank
 * p + 2^k, receive from p - 2^k and combine; ceil(log2 N) rounds), a total then broadcast from
 * the last rank. The core's combines are commutative bit for bit, so the bits depend on the
 * number of ranks only, never on timing or threads. Bytes per rank and call: the state size
 * (B H r (dv+1) floats and B H doubles) times the rounds, plus one broadcast: independent of L. */
#include "performer_mpi.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- counting ----------------------------------------------------------------------------- */

typedef struct ctx {
    MPI_Comm comm;
    int rank, size;
    pf_mpi_info *info;
} ctx;

static void count(ctx *c, uint64_t sent, uint64_t received, uint64_t messages) {
    c->info->bytes_sent += sent;
    c->info->bytes_received += received;
    c->info->messages += messages;
}

static void set_message(ctx *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->info->message, sizeof c->info->message, fmt, ap);
    va_end(ap);
}

/* ---- ordered combines ---------------------------------------------------------------------- */

/* A buffer of n doubles (references, or sums) then f floats (states). */
typedef struct part {
    double *d;
    float *f;
    size_t nd, nf;
} part;

typedef enum kind { SUMS, STATES, GRADS } kind;

typedef struct plan {
    kind k;
    int heads, r, dv;
} plan;

/* acc := acc (+) in, for the kind of buffer. */
static void combine(const plan *pl, part *acc, const part *in) {
    switch (pl->k) {
    case SUMS:
        for (size_t i = 0; i < acc->nd; i++) acc->d[i] = acc->d[i] + in->d[i];
        break;
    case STATES:
        pf_favor_slice_combine(acc->f, acc->d, in->f, in->d, pl->heads, pl->r, pl->dv);
        break;
    case GRADS:
        pf_favor_slice_dcombine(acc->f, acc->d, in->f, in->d, pl->heads, pl->r, pl->dv);
        break;
    }
}

/* The empty element: zeros, references -inf (states) or +inf (gradients). */
static void empty(const plan *pl, part *x) {
    const double e = pl->k == STATES ? -INFINITY : pl->k == GRADS ? INFINITY : 0.0;
    for (size_t i = 0; i < x->nd; i++) x->d[i] = e;
    memset(x->f, 0, sizeof(float) * x->nf);
}

static int part_alloc(part *x, size_t nd, size_t nf) {
    x->nd = nd;
    x->nf = nf;
    x->d = malloc(sizeof(double) * (nd ? nd : 1));
    x->f = malloc(sizeof(float) * (nf ? nf : 1));
    return x->d && x->f ? 0 : -1;
}

static void part_free(part *x) {
    free(x->d);
    free(x->f);
}

/* One round's exchange: x to rank `to`, y from rank `from` (MPI_PROC_NULL: none). */
static int sendrecv(ctx *c, const part *x, int to, part *y, int from) {
    const double t0 = MPI_Wtime();
    int e = MPI_Sendrecv(x->d, (int)x->nd, MPI_DOUBLE, to, 71, y->d, (int)y->nd, MPI_DOUBLE, from,
                         71, c->comm, MPI_STATUS_IGNORE);
    if (e == MPI_SUCCESS && x->nf)
        e = MPI_Sendrecv(x->f, (int)x->nf, MPI_FLOAT, to, 72, y->f, (int)y->nf, MPI_FLOAT, from,
                         72, c->comm, MPI_STATUS_IGNORE);
    c->info->comm_seconds += MPI_Wtime() - t0;
    const uint64_t bytes = sizeof(double) * x->nd + sizeof(float) * x->nf;
    const uint64_t msgs = x->nf ? 2 : 1;
    count(c, to != MPI_PROC_NULL ? bytes : 0, from != MPI_PROC_NULL ? bytes : 0,
          (to != MPI_PROC_NULL ? msgs : 0) + (from != MPI_PROC_NULL ? msgs : 0));
    return e == MPI_SUCCESS ? 0 : -1;
}

typedef enum scan_kind { TOTAL, PREFIX, SUFFIX } scan_kind;

/* TOTAL: x becomes the combination over every rank (the same bits on all). PREFIX: out becomes
 * the combination over the ranks below this one (empty on rank 0); SUFFIX: over the ranks above
 * (empty on the last). x is overwritten; y, e are scratch of x's size. Recursive doubling on
 * the rank (reversed for SUFFIX): the association depends on the number of ranks only. */
static int scan(ctx *c, const plan *pl, scan_kind sk, part *x, part *out, part *y) {
    const int n = c->size, me = sk == SUFFIX ? n - 1 - c->rank : c->rank;
    if (out) empty(pl, out);
    for (int dist = 1; dist < n; dist *= 2) {
        const int to = me + dist < n ? me + dist : -1, from = me - dist >= 0 ? me - dist : -1;
        const int rto = to < 0 ? MPI_PROC_NULL : sk == SUFFIX ? n - 1 - to : to;
        const int rfrom = from < 0 ? MPI_PROC_NULL : sk == SUFFIX ? n - 1 - from : from;
        if (sendrecv(c, x, rto, y, rfrom) != 0) return -1;
        if (from >= 0) {
            if (out) combine(pl, out, y);
            combine(pl, x, y);
        }
    }
    if (sk != TOTAL) return 0;
    /* the last rank holds the total */
    const double t0 = MPI_Wtime();
    int e = MPI_Bcast(x->d, (int)x->nd, MPI_DOUBLE, n - 1, c->comm);
    if (e == MPI_SUCCESS && x->nf) e = MPI_Bcast(x->f, (int)x->nf, MPI_FLOAT, n - 1, c->comm);
    c->info->comm_seconds += MPI_Wtime() - t0;
    if (n > 1) {
        const uint64_t bytes = sizeof(double) * x->nd + sizeof(float) * x->nf;
        const uint64_t msgs = x->nf ? 2 : 1;
        if (c->rank == n - 1)
            count(c, bytes, 0, msgs);
        else
            count(c, 0, bytes, msgs);
    }
    return e == MPI_SUCCESS ? 0 : -1;
}

/* ---- agreeing on the arguments ------------------------------------------------------------- */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

static int64_t float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (int64_t)u;
}

enum {
    F_STATUS, F_B, F_H, F_D, F_DV, F_LQ, F_LK, F_CAUSAL, F_KERNEL, F_M, F_WPH, F_CHUNK, F_EPS,
    F_SCALE, F_AGIVEN, F_A, F_WHASH, F_KLHASH, F_NFIELDS
};

static const char *const field_name[F_NFIELDS] = {
    "status", "B", "H", "d", "dv", "Lq", "Lk", "causal", "kernel", "m", "w_per_head", "chunk",
    "eps", "scale", "oprf_a_given", "oprf_a", "W (its hash)", "key_len (its hash)"};

/* This rank's descriptor: its own verdict on its arguments, then what every rank must share. */
static void describe(int64_t *f, pf_status local, const pf_shape *s, const pf_attn_opts *o,
                     const pf_favor_opts *fv) {
    memset(f, 0, sizeof(int64_t) * F_NFIELDS);
    f[F_STATUS] = local;
    if (!s || !o || !fv) return;
    f[F_B] = s->B, f[F_H] = s->H, f[F_D] = s->d, f[F_DV] = s->dv, f[F_LQ] = s->Lq,
    f[F_LK] = s->Lk;
    f[F_CAUSAL] = o->causal, f[F_KERNEL] = fv->kernel, f[F_M] = fv->m;
    f[F_WPH] = fv->w_per_head, f[F_CHUNK] = fv->chunk, f[F_EPS] = float_bits(fv->eps);
    f[F_SCALE] = float_bits(o->scale), f[F_AGIVEN] = fv->oprf_a_given;
    f[F_A] = fv->oprf_a_given ? float_bits(fv->oprf_a) : 0;
    if (local != PF_OK) return;
    const size_t nw = (size_t)fv->m * (size_t)s->d * (fv->w_per_head ? (size_t)s->H : 1);
    f[F_WHASH] = (int64_t)fnv1a(14695981039346656037ull, fv->W, sizeof(float) * nw);
    f[F_KLHASH] = o->key_len ? (int64_t)fnv1a(14695981039346656037ull, o->key_len,
                                              sizeof(int32_t) * (size_t)s->B)
                             : -1;
}

/* The local checks: the slice functions' own, on this rank's slice (key lengths are global:
 * checked once the total length is known). */
static pf_status local_check(const pf_shape *s, const pf_attn_opts *o, const pf_favor_opts *fv,
                             int pointers_ok) {
    if (!pointers_ok || !s || !o) return PF_EINVAL;
    pf_attn_opts lo = *o;
    lo.key_len = NULL;
    return pf_favor_slice_check(s, &lo, fv);
}

/* Step 1 on every rank: the table of descriptors, and the verdict every rank reaches from it.
 * lq0, lk0 receive this rank's first query and key rows, *lk_total the key rows of all. */
static pf_status agree(ctx *c, pf_status local, const pf_shape *s, const pf_attn_opts *o,
                       const pf_favor_opts *fv, int64_t *lq0, int64_t *lk0, int64_t *lk_total) {
    int64_t mine[F_NFIELDS];
    describe(mine, local, s, o, fv);
    int64_t *all = malloc(sizeof(int64_t) * F_NFIELDS * (size_t)c->size);
    int nomem = all == NULL, anynomem = 0;
    /* (a rank that cannot hold the table says so first, so that none waits in the allgather) */
    MPI_Allreduce(&nomem, &anynomem, 1, MPI_INT, MPI_MAX, c->comm);
    count(c, sizeof(int), sizeof(int), 2);
    if (anynomem) {
        free(all);
        set_message(c, "a rank could not allocate the descriptor table");
        return PF_ENOMEM;
    }
    const double t0 = MPI_Wtime();
    MPI_Allgather(mine, F_NFIELDS, MPI_INT64_T, all, F_NFIELDS, MPI_INT64_T, c->comm);
    c->info->comm_seconds += MPI_Wtime() - t0;
    count(c, sizeof mine, sizeof mine * (size_t)(c->size - 1), (uint64_t)c->size);
    pf_status st = PF_OK;
    /* the worst rank's own verdict (the lowest such rank) */
    for (int p = 0; p < c->size; p++) {
        const int64_t v = all[(size_t)p * F_NFIELDS + F_STATUS];
        if (v > st) {
            st = (pf_status)v;
            c->info->failed_rank = p;
        }
    }
    if (st != PF_OK) {
        set_message(c, "rank %d: %s (its arguments)", c->info->failed_rank, pf_status_str(st));
        free(all);
        return st;
    }
    /* every shared field as rank 0's */
    for (int p = 1; p < c->size && st == PF_OK; p++) {
        for (int f = F_B; f < F_NFIELDS; f++) {
            if (f == F_LQ || f == F_LK) continue;
            const int64_t a = all[f], b = all[(size_t)p * F_NFIELDS + f];
            if (a != b) {
                st = PF_EINVAL;
                c->info->failed_rank = p;
                if (f == F_WHASH || f == F_KLHASH || f == F_EPS || f == F_SCALE || f == F_A)
                    set_message(c, "rank %d disagrees with rank 0 about %s", p, field_name[f]);
                else
                    set_message(c, "rank %d disagrees with rank 0 about %s (%lld, not %lld)", p,
                                field_name[f], (long long)b, (long long)a);
                break;
            }
        }
    }
    int64_t q0 = 0, k0 = 0, kt = 0;
    for (int p = 0; p < c->size; p++) kt += all[(size_t)p * F_NFIELDS + F_LK];
    for (int p = 0; p < c->rank; p++) {
        q0 += all[(size_t)p * F_NFIELDS + F_LQ];
        k0 += all[(size_t)p * F_NFIELDS + F_LK];
    }
    *lq0 = q0, *lk0 = k0, *lk_total = kt;
    /* global key lengths: the same on every rank (hash above), in [1, total] */
    if (st == PF_OK && o->key_len) {
        for (int b = 0; b < s->B; b++) {
            if (o->key_len[b] < 1 || o->key_len[b] > kt) {
                st = PF_EINVAL;
                c->info->failed_rank = 0;
                set_message(c, "key_len[%d] = %d is outside [1, %lld], the keys of all ranks", b,
                            (int)o->key_len[b], (long long)kt);
                break;
            }
        }
    }
    if (st == PF_OK && kt > INT32_MAX) {
        st = PF_EINVAL;
        set_message(c, "the ranks hold %lld keys in all, more than 2^31 - 1", (long long)kt);
    }
    free(all);
    return st;
}

/* Step 4: the worst status of any rank (the lowest rank on ties), on every rank. */
static pf_status outcome(ctx *c, pf_status mine) {
    int in[2] = {(int)mine, c->rank}, out[2] = {0, 0};
    const double t0 = MPI_Wtime();
    if (MPI_Allreduce(in, out, 1, MPI_2INT, MPI_MAXLOC, c->comm) != MPI_SUCCESS) out[0] = PF_EIO;
    c->info->comm_seconds += MPI_Wtime() - t0;
    count(c, sizeof in, sizeof in, 2);
    if (out[0] != PF_OK) {
        c->info->failed_rank = out[1];
        set_message(c, "rank %d: %s", out[1], pf_status_str((pf_status)out[0]));
    }
    return (pf_status)out[0];
}

/* ---- the calls ------------------------------------------------------------------------------ */

/* What forward and backward share: the agreed slice, its local key lengths, the fit sums and
 * the state each rank reads (bidirectional total, causal prefix). */
typedef struct run {
    ctx c;
    pf_mpi_info own;
    pf_shape s;
    pf_attn_opts o;   /* key_len: this rank's local lengths */
    int32_t *klen;    /* (B) */
    double *sums;     /* total fit sums, or NULL */
    plan pst;         /* states */
    part mine;        /* this rank's key state; then scratch */
    part st, y;       /* the state read (total or prefix); scratch */
    int r, heads;
    size_t ns;
} run;

static void run_free(run *u) {
    free(u->klen);
    free(u->sums);
    part_free(&u->mine);
    part_free(&u->st);
    part_free(&u->y);
}

/* Steps 1 to 3 of the forward (the backward's start too): on return *work is this rank's status
 * so far and the return value is the agreed one of step 1 (the call ends there if it is bad). */
static pf_status begin(run *u, const pf_shape *shape, const pf_attn_opts *opts,
                       const pf_favor_opts *favor, const float *Q, const float *K,
                       const float *V, int pointers_ok, MPI_Comm comm, pf_mpi_info *info,
                       pf_status *work) {
    memset(u, 0, sizeof *u);
    u->c.comm = comm;
    u->c.info = info ? info : &u->own;
    memset(u->c.info, 0, sizeof *u->c.info);
    u->c.info->failed_rank = -1;
    MPI_Comm_rank(comm, &u->c.rank);
    MPI_Comm_size(comm, &u->c.size);
    *work = PF_OK;
    int64_t q0, k0, kt;
    pf_status st = agree(&u->c, local_check(shape, opts, favor, pointers_ok), shape, opts, favor,
                         &q0, &k0, &kt);
    if (st != PF_OK) return st;
    (void)q0;
    u->s = *shape;
    u->o = *opts;
    u->heads = shape->B * shape->H;
    u->r = pf_kernel_width(favor->kernel, favor->m);
    u->ns = (size_t)u->heads * (size_t)u->r * ((size_t)shape->dv + 1);
    u->pst = (plan){STATES, u->heads, u->r, shape->dv};
    /* this slice's valid keys: the global length less the slice's first key, clamped */
    u->klen = malloc(sizeof(int32_t) * (size_t)shape->B);
    const size_t slen = pf_favor_slice_sums_len(shape, favor);
    part sm = {0}, sy = {0};
    int ok = u->klen && part_alloc(&u->mine, (size_t)u->heads, u->ns) == 0 &&
             part_alloc(&u->st, (size_t)u->heads, u->ns) == 0 &&
             part_alloc(&u->y, (size_t)u->heads, u->ns) == 0;
    if (slen) ok = ok && part_alloc(&sm, slen * (size_t)u->heads, 0) == 0 &&
                   part_alloc(&sy, slen * (size_t)u->heads, 0) == 0;
    /* (an allocation failure here is agreed on before anything that depends on it moves) */
    int nomem = !ok, anynomem = 0;
    MPI_Allreduce(&nomem, &anynomem, 1, MPI_INT, MPI_MAX, comm);
    count(&u->c, sizeof(int), sizeof(int), 2);
    if (anynomem) {
        part_free(&sm);
        part_free(&sy);
        set_message(&u->c, "a rank is out of memory");
        return PF_ENOMEM;
    }
    for (int b = 0; b < shape->B; b++) {
        int64_t v = (opts->key_len ? opts->key_len[b] : kt) - k0;
        u->klen[b] = (int32_t)(v < 0 ? 0 : (v > shape->Lk ? shape->Lk : v));
    }
    u->o.key_len = u->klen;
    /* 2: the fit statistics of the whole sequence */
    if (slen) {
        pf_status s2 = pf_favor_slice_sums(sm.d, Q, K, shape, &u->o, favor);
        if (s2 != PF_OK) {
            /* (a bad rank adds nothing; the call fails anyway) */
            memset(sm.d, 0, sizeof(double) * sm.nd);
            *work = s2;
        }
        const plan ps = {SUMS, u->heads, 0, 0};
        if (scan(&u->c, &ps, TOTAL, &sm, NULL, &sy) != 0) *work = PF_EIO;
        u->sums = sm.d;
        sm.d = NULL;
        part_free(&sm);
        part_free(&sy);
    }
    /* 3: this rank's key state, then the one it reads. Causal: no rank reads the last rank's
     * (it is above every other), so the last rank does not make it (an empty state, never sent;
     * its scan still checks its keys) */
    if (opts->causal && u->c.rank == u->c.size - 1) {
        empty(&u->pst, &u->mine);
    } else {
        pf_status s3 =
            pf_favor_slice_state(u->mine.f, u->mine.d, K, V, shape, &u->o, favor, u->sums);
        if (s3 > *work) *work = s3;
    }
    if (opts->causal) {
        if (scan(&u->c, &u->pst, PREFIX, &u->mine, &u->st, &u->y) != 0) *work = PF_EIO;
    } else {
        memcpy(u->st.d, u->mine.d, sizeof(double) * u->mine.nd);
        memcpy(u->st.f, u->mine.f, sizeof(float) * u->mine.nf);
        if (scan(&u->c, &u->pst, TOTAL, &u->st, NULL, &u->y) != 0) *work = PF_EIO;
    }
    return PF_OK;
}

pf_status pf_mpi_attn_favor(float *out, const float *Q, const float *K, const float *V,
                            const pf_shape *shape, const pf_attn_opts *opts,
                            const pf_favor_opts *favor, MPI_Comm comm, pf_mpi_info *info) {
    run u;
    pf_status work;
    pf_status st = begin(&u, shape, opts, favor, Q, K, V, out && Q && K && V, comm, info, &work);
    if (st != PF_OK) {
        run_free(&u);
        return st;
    }
    if (work == PF_OK)
        work = pf_favor_slice_attn(out, Q, K, V, u.st.f, u.st.d, &u.s, &u.o, favor, u.sums);
    st = outcome(&u.c, work);
    run_free(&u);
    return st;
}

pf_status pf_mpi_attn_favor_backward(float *dQ, float *dK, float *dV, const float *dout,
                                     const float *Q, const float *K, const float *V,
                                     const float *out, const pf_shape *shape,
                                     const pf_attn_opts *opts, const pf_favor_opts *favor,
                                     MPI_Comm comm, pf_mpi_info *info) {
    run u;
    pf_status work;
    pf_status st = begin(&u, shape, opts, favor, Q, K, V, dQ && dK && dV && dout && Q && K && V,
                         comm, info, &work);
    if (st != PF_OK) {
        run_free(&u);
        return st;
    }
    /* d/dS of this rank's queries (referenced to the state it read), then the gradient that
     * reaches it: bidirectional every rank's (all referenced to the total's reference), causal
     * the higher ranks' (referenced to the state after this rank) */
    part g = {u.mine.d, u.mine.f, u.mine.nd, u.mine.nf}, R = {0};
    const plan pg = {GRADS, u.heads, u.r, shape->dv};
    int ok = part_alloc(&R, (size_t)u.heads, u.ns) == 0;
    if (!ok && work == PF_OK) work = PF_ENOMEM;
    if (ok) {
        pf_status s4 = work == PF_OK ? pf_favor_slice_dstate(g.f, dout, Q, K, V, out, u.st.f,
                                                             u.st.d, &u.s, &u.o, favor, u.sums)
                                     : work;
        for (int h = 0; h < u.heads; h++) g.d[h] = u.st.d[h]; /* (its reference) */
        if (s4 != PF_OK) {
            empty(&pg, &g);
            work = s4;
        }
    }
    /* (every rank takes part in the exchange, even one that failed: agreed on below) */
    int nomem = !ok, anynomem = 0;
    MPI_Allreduce(&nomem, &anynomem, 1, MPI_INT, MPI_MAX, comm);
    count(&u.c, sizeof(int), sizeof(int), 2);
    int have_r = 0;
    if (!anynomem) {
        if (opts->causal) {
            if (scan(&u.c, &pg, SUFFIX, &g, &R, &u.y) != 0) work = PF_EIO;
            have_r = u.c.rank < u.c.size - 1;
        } else {
            memcpy(R.d, g.d, sizeof(double) * g.nd);
            memcpy(R.f, g.f, sizeof(float) * g.nf);
            if (scan(&u.c, &pg, TOTAL, &R, NULL, &u.y) != 0) work = PF_EIO;
            have_r = 1;
        }
    } else if (work == PF_OK) {
        work = PF_ENOMEM;
    }
    if (work == PF_OK)
        work = pf_favor_slice_backward(dQ, dK, dV, dout, Q, K, V, out, u.st.f, u.st.d,
                                       have_r ? R.f : NULL, &u.s, &u.o, favor, u.sums);
    part_free(&R);
    st = outcome(&u.c, work);
    run_free(&u);
    return st;
}
