/* test_mpi_train: the language model trained across ranks (pf_mpi_trainer, performer_mpi.h)
 * against one process, run by tests/test_mpi.sh under `mpirun -np N` for N = 1, 2, 3.
 *
 * Every rank makes the same batches itself and also trains a second copy of the model alone on
 * the whole batch: the reference. Three AdamW steps data parallel (exact and FAVOR attention,
 * learned positions) and sequence parallel (FAVOR, learned and rotary positions; each rank a
 * slice of every sequence, unequal when T is not a multiple of N), then:
 *   - every step's loss equals the reference's (relative 2e-6);
 *   - the validation loss after the three steps equals the reference's (relative 1e-5), and so
 *     do the parameters (normwise relative 1e-5);
 *   - every rank holds the same parameter bits (the gradients are summed in rank order);
 *   - at one rank, the parameters are the reference's bits;
 *   - the bytes a rank moves per step do not grow with the context (T 16 against 64);
 * and the errors, each the same status on every rank, never a hang: FAVOR++ and sequence
 * parallel exact attention refused, ranks whose models differ, a batch with fewer rows than
 * ranks, and a token out of range on the last rank only. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "performer_mpi.h"

enum { B = 4, T = 24, STEPS = 3 };

static int rank, nranks;

static pf_model_config config(pf_lm_attention att, pf_lm_positions pos, int context) {
    pf_model_config c = pf_model_config_default();
    c.context = context;
    c.layers = 2;
    c.d_model = 32;
    c.heads = 2;
    c.attention = att;
    c.positions = pos;
    c.features = 16;
    c.redraw = 2; /* a new W within the three steps */
    c.seed = 11;
    return c;
}

/* Batch `i` (B, Tn): bytes from a fixed generator, targets the next byte (-1 at the end of a
 * sequence's last window, so that counts differ from B T). */
static void batch(int32_t *tok, int32_t *tgt, int Tn, int i) {
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
    int32_t seq[B][65];
    for (int b = 0; b < B; b++)
        for (int t = 0; t <= Tn; t++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            /* a little structure to learn: mostly small bytes, some repeats */
            seq[b][t] = t > 0 && (s >> 60) < 4 ? seq[b][t - 1] : (int32_t)((s >> 33) % 40 + 60);
        }
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tn; t++) {
            tok[b * Tn + t] = seq[b][t];
            tgt[b * Tn + t] = b == B - 1 && t == Tn - 1 ? -1 : seq[b][t + 1];
        }
}

/* This rank's share of a (B, Tn) batch, copied out. */
static void take(int32_t *dst, const int32_t *src, int Tn, int b0, int nb, int t0, int nt) {
    for (int b = 0; b < nb; b++)
        memcpy(dst + (size_t)b * nt, src + (size_t)(b0 + b) * Tn + t0, sizeof(int32_t) * nt);
}

static double rel_norm(const float *a, const float *r, size_t n) {
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)a[i] - r[i]) * ((double)a[i] - r[i]);
        s += (double)r[i] * r[i];
    }
    return sqrt(e / (s > 0 ? s : 1));
}

/* 1 if every rank holds the bits of rank 0's parameters. */
static int same_everywhere(const pf_model *m) {
    size_t n;
    const float *p = pf_model_parameters(m, &n);
    float *r0 = malloc(sizeof(float) * n);
    memcpy(r0, p, sizeof(float) * n);
    MPI_Bcast(r0, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
    int same = memcmp(r0, p, sizeof(float) * n) == 0, all = 0;
    MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    free(r0);
    return all;
}

static const char *kind_name(pf_mpi_parallel k) { return k == PF_MPI_DATA ? "data" : "sequence"; }

static double worst_param = 0, worst_loss = 0;

static void one_run(pf_mpi_parallel kind, pf_lm_attention att, pf_lm_positions pos) {
    const pf_model_config c = config(att, pos, 32);
    pf_model *m = NULL, *ref = NULL;
    CHECK_STATUS(pf_model_create(&m, &c), PF_OK);
    CHECK_STATUS(pf_model_create(&ref, &c), PF_OK);
    pf_model_set_training(m, 1);
    pf_model_set_training(ref, 1);
    pf_mpi_trainer *tr = NULL;
    pf_mpi_info info;
    CHECK_STATUS(pf_mpi_trainer_create(&tr, m, kind, MPI_COMM_WORLD, &info), PF_OK);
    if (!tr) goto out;
    int b0, nb, t0, nt;
    CHECK_STATUS(pf_mpi_trainer_share(tr, B, T, &b0, &nb, &t0, &nt), PF_OK);
    int32_t tok[B * T], tgt[B * T], mtok[B * T], mtgt[B * T];
    pf_adamw opt = pf_adamw_default();
    opt.lr = 3e-3f;
    for (int s = 0; s < STEPS; s++) {
        batch(tok, tgt, T, s);
        take(mtok, tok, T, b0, nb, t0, nt);
        take(mtgt, tgt, T, b0, nb, t0, nt);
        float loss = 0, rloss = 0, gn = 0, rgn = 0;
        CHECK_STATUS(pf_mpi_trainer_forward(tr, &loss, NULL, mtok, mtgt, B, T, &info), PF_OK);
        CHECK_STATUS(pf_mpi_trainer_backward(tr, &info), PF_OK);
        CHECK_STATUS(pf_model_step(m, &opt, &gn), PF_OK);
        CHECK_STATUS(pf_model_forward(ref, &rloss, NULL, tok, tgt, B, T), PF_OK);
        CHECK_STATUS(pf_model_backward(ref), PF_OK);
        CHECK_STATUS(pf_model_step(ref, &opt, &rgn), PF_OK);
        CHECK_CLOSE(loss, rloss, 0, 2e-6);
        CHECK_CLOSE(gn, rgn, 0, 1e-5);
        if (fabs(loss - rloss) / rloss > worst_loss) worst_loss = fabs(loss - rloss) / rloss;
    }
    /* validation: a batch never trained on, in evaluation mode */
    pf_model_set_training(m, 0);
    pf_model_set_training(ref, 0);
    batch(tok, tgt, T, 99);
    take(mtok, tok, T, b0, nb, t0, nt);
    take(mtgt, tgt, T, b0, nb, t0, nt);
    float vl = 0, rvl = 0;
    CHECK_STATUS(pf_mpi_trainer_forward(tr, &vl, NULL, mtok, mtgt, B, T, NULL), PF_OK);
    CHECK_STATUS(pf_model_forward(ref, &rvl, NULL, tok, tgt, B, T), PF_OK);
    CHECK_CLOSE(vl, rvl, 0, 1e-5);
    size_t n, rn;
    const float *p = pf_model_parameters(m, &n), *rp = pf_model_parameters(ref, &rn);
    CHECK(n == rn, "parameter counts %zu, %zu", n, rn);
    const double e = rel_norm(p, rp, n);
    CHECK(e <= 1e-5, "%s parallel: parameters after %d steps differ from one process's by %.3g",
          kind_name(kind), STEPS, e);
    if (e > worst_param) worst_param = e;
    if (nranks == 1)
        CHECK(memcmp(p, rp, sizeof(float) * n) == 0, "one rank: not the single process's bits");
    CHECK(same_everywhere(m), "%s parallel: the ranks' parameters differ", kind_name(kind));
    if (rank == 0)
        printf("  %-8s %-5s %-7s: validation loss %.7f (one process %.7f), parameters %.2g\n",
               kind_name(kind), att == PF_LM_EXACT ? "exact" : "favor",
               pos == PF_LM_ROTARY ? "rotary" : "learned", vl, rvl, e);
out:
    pf_mpi_trainer_free(tr);
    pf_model_free(m);
    pf_model_free(ref);
}

/* Bytes a rank moves in one step at context Tn. */
static uint64_t step_bytes(pf_mpi_parallel kind, int Tn) {
    const pf_model_config c = config(PF_LM_FAVOR, PF_LM_ROTARY, 64);
    pf_model *m = NULL;
    pf_mpi_trainer *tr = NULL;
    uint64_t bytes = 0;
    if (pf_model_create(&m, &c) != PF_OK) return 0;
    pf_model_set_training(m, 1);
    if (pf_mpi_trainer_create(&tr, m, kind, MPI_COMM_WORLD, NULL) == PF_OK) {
        int32_t tok[B * 64], tgt[B * 64], mt[B * 64], mg[B * 64];
        int b0, nb, t0, nt;
        pf_mpi_trainer_share(tr, B, Tn, &b0, &nb, &t0, &nt);
        batch(tok, tgt, Tn, 0);
        take(mt, tok, Tn, b0, nb, t0, nt);
        take(mg, tgt, Tn, b0, nb, t0, nt);
        pf_mpi_info f, g;
        float loss;
        if (pf_mpi_trainer_forward(tr, &loss, NULL, mt, mg, B, Tn, &f) == PF_OK &&
            pf_mpi_trainer_backward(tr, &g) == PF_OK)
            bytes = f.bytes_sent + f.bytes_received + g.bytes_sent + g.bytes_received;
    }
    pf_mpi_trainer_free(tr);
    pf_model_free(m);
    return bytes;
}

/* A status every rank must return alike, with a message naming what. */
static void same_status(pf_status got, pf_status want, const pf_mpi_info *info, const char *what) {
    CHECK(got == want, "%s: status %s, expected %s", what, pf_status_str(got),
          pf_status_str(want));
    int mine = (int)got, lo = 0, hi = 0;
    MPI_Allreduce(&mine, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    CHECK(lo == hi, "%s: the ranks returned different statuses", what);
    if (info && want != PF_OK) CHECK(info->message[0] != 0, "%s: no message", what);
    if (rank == 0 && info) printf("  %s: every rank: %s\n", what, info->message);
}

static void errors(void) {
    pf_mpi_info info;
    pf_mpi_trainer *tr = NULL;
    pf_model *m = NULL;
    pf_model_config c = config(PF_LM_FAVORPP, PF_LM_LEARNED, 32);
    pf_model_create(&m, &c);
    same_status(pf_mpi_trainer_create(&tr, m, PF_MPI_DATA, MPI_COMM_WORLD, &info), PF_ENOTSUP,
                &info, "FAVOR++ data parallel");
    CHECK(tr == NULL, "a failed create left a trainer");
    pf_model_free(m);

    c = config(PF_LM_EXACT, PF_LM_LEARNED, 32);
    pf_model_create(&m, &c);
    same_status(pf_mpi_trainer_create(&tr, m, PF_MPI_SEQUENCE, MPI_COMM_WORLD, &info),
                PF_ENOTSUP, &info, "exact attention sequence parallel");
    pf_model_free(m);

    if (nranks > 1) {
        c = config(PF_LM_FAVOR, PF_LM_LEARNED, 32);
        if (rank == nranks - 1) c.seed = 12; /* other weights */
        pf_model_create(&m, &c);
        same_status(pf_mpi_trainer_create(&tr, m, PF_MPI_DATA, MPI_COMM_WORLD, &info), PF_EINVAL,
                    &info, "the last rank's model differs");
        pf_model_free(m);
    }

    /* a token out of range on the last rank only: every rank fails the step, sequence parallel
     * (whose forward talks in every layer) and data parallel (whose does not) */
    for (int k = 0; k < 2; k++) {
        const pf_mpi_parallel kind = k ? PF_MPI_SEQUENCE : PF_MPI_DATA;
        c = config(PF_LM_FAVOR, PF_LM_ROTARY, 32);
        pf_model_create(&m, &c);
        tr = NULL;
        CHECK_STATUS(pf_mpi_trainer_create(&tr, m, kind, MPI_COMM_WORLD, NULL), PF_OK);
        int32_t tok[B * T], tgt[B * T], mt[B * T], mg[B * T];
        int b0, nb, t0, nt;
        pf_mpi_trainer_share(tr, B, T, &b0, &nb, &t0, &nt);
        batch(tok, tgt, T, 0);
        take(mt, tok, T, b0, nb, t0, nt);
        take(mg, tgt, T, b0, nb, t0, nt);
        if (rank == nranks - 1) mt[nb * nt - 1] = 300;
        float loss;
        char what[80];
        snprintf(what, sizeof what, "a byte 300 on the last rank, %s parallel", kind_name(kind));
        same_status(pf_mpi_trainer_forward(tr, &loss, NULL, mt, mg, B, T, &info), PF_EINVAL,
                    &info, what);
        snprintf(what, sizeof what, "a backward after that, %s parallel", kind_name(kind));
        same_status(pf_mpi_trainer_backward(tr, &info), PF_EINVAL, &info, what);
        /* and the trainer still works after it */
        if (rank == nranks - 1) mt[nb * nt - 1] = 65;
        snprintf(what, sizeof what, "the next step, %s parallel", kind_name(kind));
        same_status(pf_mpi_trainer_forward(tr, &loss, NULL, mt, mg, B, T, &info), PF_OK, NULL,
                    what);
        same_status(pf_mpi_trainer_backward(tr, &info), PF_OK, NULL, what);
        pf_mpi_trainer_free(tr);
        pf_model_free(m);
    }
    if (nranks > 1) {
        c = config(PF_LM_FAVOR, PF_LM_LEARNED, 32);
        pf_model_create(&m, &c);
        tr = NULL;
        CHECK_STATUS(pf_mpi_trainer_create(&tr, m, PF_MPI_DATA, MPI_COMM_WORLD, NULL), PF_OK);
        int b0, nb, t0, nt;
        CHECK_STATUS(pf_mpi_trainer_share(tr, nranks - 1, T, &b0, &nb, &t0, &nt), PF_EINVAL);
        int32_t tok[B * T] = {0};
        same_status(pf_mpi_trainer_forward(tr, NULL, NULL, tok, NULL, nranks - 1, T, &info),
                    PF_EINVAL, &info, "fewer sequences than ranks, data parallel");
        pf_mpi_trainer_free(tr);
        pf_model_free(m);
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    one_run(PF_MPI_DATA, PF_LM_EXACT, PF_LM_LEARNED);
    one_run(PF_MPI_DATA, PF_LM_FAVOR, PF_LM_ROTARY);
    one_run(PF_MPI_SEQUENCE, PF_LM_FAVOR, PF_LM_LEARNED);
    one_run(PF_MPI_SEQUENCE, PF_LM_FAVOR, PF_LM_ROTARY);
    for (int k = 0; k < 2; k++) {
        const pf_mpi_parallel kind = k ? PF_MPI_SEQUENCE : PF_MPI_DATA;
        const uint64_t b16 = step_bytes(kind, 16), b64 = step_bytes(kind, 64);
        CHECK(b16 > 0 && b16 == b64, "%s parallel: bytes per step %llu at T 16, %llu at T 64",
              kind_name(kind), (unsigned long long)b16, (unsigned long long)b64);
        if (rank == 0)
            printf("  %s parallel: %llu bytes moved per step by rank 0 at T = 16 and %llu at 64\n",
                   kind_name(kind), (unsigned long long)b16, (unsigned long long)b64);
    }
    errors();
    if (rank == 0)
        printf("  np %d: worst relative error against one process: loss %.3g, parameters %.3g\n",
               nranks, worst_loss, worst_param);
    int failed = check_failed_, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    if (rank == 0 || failed) printf("%s: %d checks, %d failed\n", argv[0], check_count_, failed);
    return any ? 1 : 0;
}
