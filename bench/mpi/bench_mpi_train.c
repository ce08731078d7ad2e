/* bench_mpi_train: the language model trained across ranks (pf_mpi_trainer, performer_mpi.h)
 * under `mpirun -np N` (bench/mpi/run.sh runs N = 1 and 2 on this machine, loopback).
 *
 * The model of `performer train` with FAVOR attention and rotary positions: 4 layers, d_model
 * 128, 4 heads, positive features m 64, the tool's other defaults; a batch of B = 2 sequences
 * of T tokens, T = 256, 1024, 4096 and 16384 (--quick: up to 4096). Data parallel (each rank
 * whole sequences: one each at 2 ranks) and sequence parallel (each rank a slice of both).
 *
 *   1. Bytes rank 0 sent and received per step (pf_mpi_info of pf_mpi_trainer_forward and
 *      _backward): the gradient sum, 2 x 4 P (N-1)/N bytes each way for P parameters, and,
 *      sequence parallel, each layer's attention states: flat in T.
 *   2. Time per step (forward, backward with the gradient sum, pf_model_step), median of a few
 *      after a warm-up, the slowest rank's, one thread a rank; beside the single process's step
 *      on the whole batch (rank 0 alone, one thread, the other ranks waiting in a barrier),
 *      measured in the same run, a step of each in turn. Its ratio is what the ranks gain; the
 *      tokens a second a rank are what docs/mpi.md's scaling model builds on.
 *
 *   bench_mpi_train [--csv FILE] [--quick]   (rank 0 prints the table and appends to the CSV) */
#include <math.h>
#include <omp.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench.h"
#include "performer_mpi.h"

enum { B = 2, LAYERS = 4, DMODEL = 128, HEADS = 4, FEATURES = 64 };

static int rank, nranks;

static void die(const char *what, pf_status st, const pf_mpi_info *info) {
    fprintf(stderr, "bench_mpi_train: rank %d: %s: %s%s%s\n", rank, what, pf_status_str(st),
            info && info->message[0] ? ": " : "", info ? info->message : "");
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static pf_model_config config(int T) {
    pf_model_config c = pf_model_config_default();
    c.context = T;
    c.layers = LAYERS;
    c.d_model = DMODEL;
    c.heads = HEADS;
    c.attention = PF_LM_FAVOR;
    c.positions = PF_LM_ROTARY;
    c.kernel = PF_KERNEL_POSITIVE;
    c.features = FEATURES;
    return c;
}

/* The batch (B, T): bytes of a fixed generator with some repeats, targets the next byte. Every
 * rank makes the whole batch and takes its share. */
static void batch(int32_t *tok, int32_t *tgt, int T) {
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int b = 0; b < B; b++) {
        int32_t prev = 65;
        for (int t = 0; t <= T; t++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            int32_t x = (s >> 60) < 4 ? prev : (int32_t)((s >> 33) % 60 + 40);
            if (t < T) tok[(size_t)b * T + t] = x;
            if (t > 0) tgt[(size_t)b * T + t - 1] = x;
            prev = x;
        }
    }
}

static void take(int32_t *dst, const int32_t *src, int T, int b0, int nb, int t0, int nt) {
    for (int b = 0; b < nb; b++)
        memcpy(dst + (size_t)b * nt, src + (size_t)(b0 + b) * T + t0, sizeof(int32_t) * nt);
}

/* One rank's part of a run: its model and trainer, and its share of the batch. */
typedef struct part {
    pf_model *m;
    pf_mpi_trainer *tr;
    int32_t *tok, *tgt;
} part;

static part part_make(pf_mpi_parallel kind, int T, const int32_t *tok, const int32_t *tgt) {
    part p = {0};
    const pf_model_config c = config(T);
    pf_status st = pf_model_create(&p.m, &c);
    if (st != PF_OK) die("pf_model_create", st, NULL);
    pf_model_set_training(p.m, 1);
    pf_mpi_info info;
    st = pf_mpi_trainer_create(&p.tr, p.m, kind, MPI_COMM_WORLD, &info);
    if (st != PF_OK) die("pf_mpi_trainer_create", st, &info);
    int b0, nb, t0, nt;
    st = pf_mpi_trainer_share(p.tr, B, T, &b0, &nb, &t0, &nt);
    if (st != PF_OK) die("pf_mpi_trainer_share", st, NULL);
    p.tok = xmalloc(sizeof(int32_t) * (size_t)nb * nt);
    p.tgt = xmalloc(sizeof(int32_t) * (size_t)nb * nt);
    take(p.tok, tok, T, b0, nb, t0, nt);
    take(p.tgt, tgt, T, b0, nb, t0, nt);
    return p;
}

static void part_free(part *p) {
    pf_mpi_trainer_free(p->tr);
    pf_model_free(p->m);
    free(p->tok);
    free(p->tgt);
}

typedef struct meas {
    double step, fwd, bwd; /* seconds, median (each repeat's slowest rank) */
    double comm;           /* seconds in communication, rank 0, median */
    double cpu;            /* processor seconds of rank 0 (its process), median */
    uint64_t fwd_bytes, bwd_bytes, sent, received, messages; /* rank 0, one step */
    float loss;                                              /* the warm-up step's */
} meas;

/* Processor seconds of this process (a rank waiting in MPI polls, and is counted). */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One step across the ranks: forward, backward (with the gradient sum), AdamW. */
static void step_ranks(part *p, int T, const pf_adamw *opt, double *tf, double *tb, double *tc,
                       double *tcpu, meas *m) {
    pf_mpi_info fi, bi;
    float loss = 0, gn = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    const double c0 = cpu_now(), t0 = now();
    pf_status st = pf_mpi_trainer_forward(p->tr, &loss, NULL, p->tok, p->tgt, B, T, &fi);
    if (st != PF_OK) die("pf_mpi_trainer_forward", st, &fi);
    const double t1 = now();
    st = pf_mpi_trainer_backward(p->tr, &bi);
    if (st != PF_OK) die("pf_mpi_trainer_backward", st, &bi);
    st = pf_model_step(p->m, opt, &gn);
    if (st != PF_OK) die("pf_model_step", st, NULL);
    const double t2 = now();
    *tcpu = cpu_now() - c0;
    *tf = t1 - t0;
    *tb = t2 - t1;
    *tc = fi.comm_seconds + bi.comm_seconds;
    m->fwd_bytes = fi.bytes_sent + fi.bytes_received;
    m->bwd_bytes = bi.bytes_sent + bi.bytes_received;
    m->sent = fi.bytes_sent + bi.bytes_sent;
    m->received = fi.bytes_received + bi.bytes_received;
    m->messages = fi.messages + bi.messages;
    m->loss = loss;
}

/* One step of the single process on the whole batch (rank 0). */
static void step_one(pf_model *m, const int32_t *tok, const int32_t *tgt, int T,
                     const pf_adamw *opt, double *tf, double *tb, float *loss) {
    float gn = 0;
    const double t0 = now();
    pf_status st = pf_model_forward(m, loss, NULL, tok, tgt, B, T);
    if (st != PF_OK) die("pf_model_forward", st, NULL);
    const double t1 = now();
    st = pf_model_backward(m);
    if (st == PF_OK) st = pf_model_step(m, opt, &gn);
    if (st != PF_OK) die("pf_model_backward/step", st, NULL);
    *tf = t1 - t0;
    *tb = now() - t1;
}

/* Each repeat's time is the slowest rank's (the step ends when the last rank's does); then the
 * median of the repeats. t: (reps) this rank's, replaced. */
static double slowest_median(double *t, int reps) {
    MPI_Allreduce(MPI_IN_PLACE, t, reps, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return median(t, reps);
}

/* Every rank waits here for the others without holding a core: a nonblocking barrier tested
 * every millisecond, the rank asleep in between. (In MPI_Barrier a rank polls, yielding at best:
 * on 2 shared cores the single process on rank 0 then shares the machine with a polling rank.) */
static void wait_asleep(void) {
    MPI_Request rq;
    MPI_Ibarrier(MPI_COMM_WORLD, &rq);
    int done = 0;
    const struct timespec ms = {0, 1000000};
    for (MPI_Test(&rq, &done, MPI_STATUS_IGNORE); !done; MPI_Test(&rq, &done, MPI_STATUS_IGNORE))
        nanosleep(&ms, NULL);
}

/* The gradient sum's exchange alone, as pf_mpi_trainer_backward makes it (an MPI_Alltoallv of
 * every rank's block of n floats, then an MPI_Allgatherv of the summed blocks), after a barrier
 * so that the ranks arrive together: what the wire costs here, without waiting for a slower rank.
 * Median of `reps`, the slowest rank's. */
static double gradient_exchange(size_t n, int reps) {
    const int N = nranks;
    float *x = xmalloc(sizeof(float) * n);
    float *recv = xmalloc(sizeof(float) * (n / (size_t)N + 1) * (size_t)N);
    int *cnt = xmalloc(sizeof(int) * 4 * (size_t)N);
    int *scnt = cnt, *sdis = cnt + N, *rcnt = cnt + 2 * N, *rdis = cnt + 3 * N;
    fill(x, n, 500 + (uint64_t)rank, 1.0f);
    for (int j = 0; j < N; j++) {
        const size_t lo = n * (size_t)j / (size_t)N, hi = n * (size_t)(j + 1) / (size_t)N;
        scnt[j] = (int)(hi - lo);
        sdis[j] = (int)lo;
    }
    for (int j = 0; j < N; j++) rcnt[j] = scnt[rank], rdis[j] = j * scnt[rank];
    double *t = xmalloc(sizeof(double) * (size_t)(reps + 1));
    for (int r = 0; r <= reps; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = now();
        MPI_Alltoallv(x, scnt, sdis, MPI_FLOAT, recv, rcnt, rdis, MPI_FLOAT, MPI_COMM_WORLD);
        MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, x, scnt, sdis, MPI_FLOAT, MPI_COMM_WORLD);
        t[r] = now() - t0;
    }
    const double m = slowest_median(t + 1, reps);
    free(t), free(x), free(recv), free(cnt);
    return m;
}

/* The load average (1 minute), or -1. */
static double loadavg(void) {
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f && fscanf(f, "%lf", &l) != 1) l = -1;
    if (f) fclose(f);
    return l;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    omp_set_num_threads(1); /* one thread a rank (OpenBLAS's OpenMP build: one for BLAS too) */
    const char *csv = NULL;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
            csv = argv[++i];
        } else if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else {
            if (rank == 0) fprintf(stderr, "usage: bench_mpi_train [--csv FILE] [--quick]\n");
            MPI_Finalize();
            return 2;
        }
    }
    FILE *f = NULL;
    if (rank == 0 && csv) {
        f = fopen(csv, "a");
        if (!f) {
            fprintf(stderr, "bench_mpi_train: cannot write %s\n", csv);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        fseek(f, 0, SEEK_END);
        if (ftell(f) == 0)
            fprintf(f, "np,mode,T,B,params,step_s,fwd_s,bwd_s,comm_s,cpu_s,fwd_bytes,bwd_bytes,"
                       "sent,received,messages,single_step_s,single_fwd_s,single_bwd_s,loss,"
                       "single_loss\n");
    }
    const int Ts[] = {256, 1024, 4096, 16384};
    const int nT = quick ? 3 : 4;
    int64_t params = 0;
    {
        pf_model *m = NULL;
        const pf_model_config c = config(256);
        if (pf_model_create(&m, &c) != PF_OK) die("pf_model_create", PF_ENOMEM, NULL);
        params = pf_model_num_params(m);
        pf_model_free(m);
    }
    char cpu[128];
    const double load0 = loadavg();
    if (rank == 0)
        printf("bench_mpi_train: %d rank%s; model %d layers, d_model %d, %d heads, FAVOR "
               "positive m %d, rotary, %lld parameters; B %d; one thread a rank; %s\n",
               nranks, nranks > 1 ? "s" : "", LAYERS, DMODEL, HEADS, FEATURES, (long long)params, B,
               cpu_name(cpu, sizeof cpu));
    if (rank == 0)
        printf("\nper step (forward, backward with the gradient sum, AdamW): bytes rank 0 sent + "
               "received; time, median of R after a warm-up (slowest rank), against the single "
               "process on the whole batch at one thread in the same run\n"
               "(cpu ms: rank 0's processor time a step; speedup: one ms / step ms)\n"
               "%8s %6s %2s %10s %10s %5s %9s %9s %8s %9s %9s %7s %12s\n",
               "mode", "T", "R", "fwd bytes", "bwd bytes", "msgs", "step ms", "fwd ms", "comm ms",
               "cpu ms", "one ms", "speedup", "tok/s a rank");
    pf_adamw opt = pf_adamw_default();
    opt.lr = 1e-3f; /* (performer train's) */
    double worst_loss = 0;
    for (int it = 0; it < nT; it++) {
        const int T = Ts[it];
        /* a few repeats, fewer for long contexts (this machine's 2 cores are shared) */
        const int reps = quick ? 3 : T >= 16384 ? 3 : T >= 4096 ? 5 : 9;
        int32_t *tok = xmalloc(sizeof(int32_t) * B * (size_t)T);
        int32_t *tgt = xmalloc(sizeof(int32_t) * B * (size_t)T);
        batch(tok, tgt, T);
        pf_model *one = NULL;
        if (rank == 0) {
            const pf_model_config c = config(T);
            pf_status st = pf_model_create(&one, &c);
            if (st != PF_OK) die("pf_model_create", st, NULL);
            pf_model_set_training(one, 1);
        }
        /* per repeat (r = 0: the warm-up): the ranks' forward, backward and communication,
         * and the single process's forward and backward, one of its steps after each of theirs
         * (the same load on both) */
        double *t = xmalloc(sizeof(double) * 7 * (size_t)(reps + 1));
        double *xf = t, *xb = t + (reps + 1), *xc = t + 2 * (reps + 1);
        double *of = t + 3 * (reps + 1), *ob = t + 4 * (reps + 1), *tot = t + 5 * (reps + 1);
        double *xp = t + 6 * (reps + 1);
        float one_loss = 0;
        for (int kind = 0; kind < 2; kind++) {
            if (kind == PF_MPI_DATA && B < nranks) continue; /* (a sequence a rank at least) */
            part p = part_make((pf_mpi_parallel)kind, T, tok, tgt);
            meas m = {0};
            float l0 = 0;
            for (int r = 0; r <= reps; r++) {
                step_ranks(&p, T, &opt, xf + r, xb + r, xc + r, xp + r, &m);
                if (r == 0) l0 = m.loss;
                float l = 0;
                if (rank == 0) step_one(one, tok, tgt, T, &opt, of + r, ob + r, &l);
                wait_asleep();                             /* (the other ranks wait here, asleep) */
                if (r == 0 && one_loss == 0) one_loss = l; /* (its first step: fresh, as theirs) */
            }
            part_free(&p);
            for (int r = 0; r < reps; r++) tot[r] = xf[r + 1] + xb[r + 1];
            m.step = slowest_median(tot, reps);
            m.fwd = slowest_median(xf + 1, reps);
            m.bwd = slowest_median(xb + 1, reps);
            m.comm = median(xc + 1, reps);
            m.cpu = median(xp + 1, reps);
            m.loss = l0;
            /* (the single process runs on rank 0 only: its own medians) */
            for (int r = 0; r < reps; r++) tot[r] = of[r + 1] + ob[r + 1];
            const double one_s = median(tot, reps), one_f = median(of + 1, reps);
            const double one_b = median(ob + 1, reps);
            if (rank == 0) {
                const char *name = kind == PF_MPI_DATA ? "data" : "sequence";
                const double rel = fabs((double)m.loss - one_loss) / one_loss;
                if (rel > worst_loss) worst_loss = rel;
                printf("%8s %6d %2d %10llu %10llu %5llu %9.1f %9.1f %8.2f %9.1f %9.1f %7.2f "
                       "%12.3g\n",
                       name, T, reps, (unsigned long long)m.fwd_bytes,
                       (unsigned long long)m.bwd_bytes, (unsigned long long)m.messages,
                       1e3 * m.step, 1e3 * m.fwd, 1e3 * m.comm, 1e3 * m.cpu, 1e3 * one_s,
                       one_s / m.step, (double)B * T / nranks / m.step);
                fflush(stdout);
                if (f)
                    fprintf(f,
                            "%d,%s,%d,%d,%lld,%.6g,%.6g,%.6g,%.6g,%.6g,%llu,%llu,%llu,%llu,%llu,"
                            "%.6g,%.6g,%.6g,%.9g,%.9g\n",
                            nranks, name, T, B, (long long)params, m.step, m.fwd, m.bwd, m.comm,
                            m.cpu, (unsigned long long)m.fwd_bytes, (unsigned long long)m.bwd_bytes,
                            (unsigned long long)m.sent, (unsigned long long)m.received,
                            (unsigned long long)m.messages, one_s, one_f, one_b, (double)m.loss,
                            (double)one_loss);
            }
        }
        free(t);
        pf_model_free(one);
        free(tok);
        free(tgt);
    }
    if (nranks > 1) {
        const double g = gradient_exchange((size_t)params, 7);
        if (rank == 0)
            printf("the gradient sum's exchange alone (MPI_Alltoallv + MPI_Allgatherv of %lld "
                   "floats, the ranks arriving together): %.2f ms, median of 7\n",
                   (long long)params, 1e3 * g);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long other = rank > 0 ? ru.ru_maxrss : 0, others = 0; /* (KiB) */
    MPI_Reduce(&other, &others, 1, MPI_LONG, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0 && nranks > 1)
        printf("peak memory (resident): rank 0 %.0f MiB (with the single process's model), the "
               "other ranks at most %.0f MiB\n",
               ru.ru_maxrss / 1024.0, others / 1024.0);
    else if (rank == 0)
        printf("peak memory (resident): %.0f MiB (with the single process's model)\n",
               ru.ru_maxrss / 1024.0);
    if (rank == 0)
        printf("load average (1 min): %.1f at the start, %.1f at the end\n", load0, loadavg());
    if (rank == 0)
        printf("first step's loss, ranks against the single process: worst relative difference "
               "%.2g\n",
               worst_loss);
    if (f) fclose(f);
    MPI_Finalize();
    return 0;
}
