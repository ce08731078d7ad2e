/* bench_mpi: sequence-parallel FAVOR+ (performer_mpi.h) under `mpirun -np N` (bench/mpi/run.sh
 * runs N = 1 and 2 on this machine, loopback).
 *
 *   1. Bytes per call against L: what each rank sent and received (pf_mpi_info) in a causal and
 *      a bidirectional forward and backward, at L = 2^10 .. 2^16 tokens in all: flat, since only
 *      states (B H r (dv+1) floats) move.
 *   2. Time per call at L = 2^14 in all (median of repeats after a warm-up), one thread a rank,
 *      beside the single process's pf_attn_favor (pf_attn_favor_backward) on the whole sequence at
 *      one thread measured in the same run (rank 0): the ratio is what the ranks gain, and the
 *      per-rank compute rate (tokens a second) is what docs/mpi.md's scaling model builds on.
 *
 *   bench_mpi [--csv FILE] [--quick]   (rank 0 prints the table and writes the CSV) */
#include <math.h>
#include <string.h>

#include "bench.h"
#include "performer_mpi.h"

enum { B = 1, H = 8, D = 64, DV = 64, MF = 256 };

static int rank, nranks;

static double bcast_median(double *t, int n) {
    double m = median(t, n);
    /* the slowest rank's median: the call ends when the last rank's does */
    double mx = m;
    MPI_Allreduce(&m, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return mx;
}

typedef struct meas {
    double fwd, bwd;          /* seconds, median, slowest rank */
    double fwd_comm, bwd_comm; /* seconds in communication, rank 0 */
    uint64_t fwd_bytes, bwd_bytes; /* sent + received, rank 0 */
} meas;

static meas run(int L, int causal, int reps) {
    const int lo = (int)((long)L * rank / nranks), n = (int)((long)L * (rank + 1) / nranks) - lo;
    const size_t nq = (size_t)B * H * n;
    float *Q = xmalloc(4 * nq * D), *K = xmalloc(4 * nq * D), *V = xmalloc(4 * nq * DV);
    float *O = xmalloc(4 * nq * DV), *G = xmalloc(4 * nq * DV), *dQ = xmalloc(4 * nq * D);
    float *dK = xmalloc(4 * nq * D), *dV = xmalloc(4 * nq * DV), *W = xmalloc(4 * MF * D);
    fill(Q, nq * D, 100 + (uint64_t)rank, 0.5f);
    fill(K, nq * D, 200 + (uint64_t)rank, 0.5f);
    fill(V, nq * DV, 300 + (uint64_t)rank, 1.0f);
    fill(G, nq * DV, 400 + (uint64_t)rank, 1.0f);
    pf_projection_draw(W, MF, D, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 1, 0);
    pf_favor_opts fv = pf_favor_opts_default();
    fv.W = W;
    fv.m = MF;
    pf_attn_opts o = pf_attn_opts_default();
    o.causal = causal;
    o.threads = 1;
    pf_shape s = {B, H, n, n, D, DV};
    pf_mpi_info info;
    meas m = {0};
    double *tf = xmalloc(sizeof(double) * (size_t)(reps + 1)), *tb = xmalloc(sizeof(double) * (size_t)(reps + 1));
    for (int r = 0; r <= reps; r++) { /* (r = 0: warm-up) */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        if (pf_mpi_attn_favor(O, Q, K, V, &s, &o, &fv, MPI_COMM_WORLD, &info) != PF_OK) {
            fprintf(stderr, "bench_mpi: %s\n", info.message);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        tf[r] = now() - t0;
        m.fwd_comm = info.comm_seconds;
        m.fwd_bytes = info.bytes_sent + info.bytes_received;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = now();
        if (pf_mpi_attn_favor_backward(dQ, dK, dV, G, Q, K, V, O, &s, &o, &fv, MPI_COMM_WORLD,
                                       &info) != PF_OK) {
            fprintf(stderr, "bench_mpi: %s\n", info.message);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        tb[r] = now() - t0;
        m.bwd_comm = info.comm_seconds;
        m.bwd_bytes = info.bytes_sent + info.bytes_received;
    }
    m.fwd = bcast_median(tf + 1, reps);
    m.bwd = bcast_median(tb + 1, reps);
    free(tf), free(tb), free(Q), free(K), free(V), free(O), free(G), free(dQ), free(dK), free(dV);
    free(W);
    return m;
}

/* The single process on the whole sequence at one thread (rank 0 alone). */
static void single(int L, int causal, int reps, double *fwd, double *bwd) {
    const size_t nq = (size_t)B * H * L;
    float *Q = xmalloc(4 * nq * D), *K = xmalloc(4 * nq * D), *V = xmalloc(4 * nq * DV);
    float *O = xmalloc(4 * nq * DV), *G = xmalloc(4 * nq * DV), *dQ = xmalloc(4 * nq * D);
    float *dK = xmalloc(4 * nq * D), *dV = xmalloc(4 * nq * DV), *W = xmalloc(4 * MF * D);
    fill(Q, nq * D, 100, 0.5f);
    fill(K, nq * D, 200, 0.5f);
    fill(V, nq * DV, 300, 1.0f);
    fill(G, nq * DV, 400, 1.0f);
    pf_projection_draw(W, MF, D, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 1, 0);
    pf_favor_opts fv = pf_favor_opts_default();
    fv.W = W;
    fv.m = MF;
    pf_attn_opts o = pf_attn_opts_default();
    o.causal = causal;
    o.threads = 1;
    pf_shape s = {B, H, L, L, D, DV};
    double *tf = xmalloc(sizeof(double) * (size_t)(reps + 1)), *tb = xmalloc(sizeof(double) * (size_t)(reps + 1));
    for (int r = 0; r <= reps; r++) {
        double t0 = now();
        pf_attn_favor(O, Q, K, V, &s, &o, &fv);
        tf[r] = now() - t0;
        t0 = now();
        pf_attn_favor_backward(dQ, dK, dV, G, Q, K, V, O, &s, &o, &fv);
        tb[r] = now() - t0;
    }
    *fwd = median(tf + 1, reps);
    *bwd = median(tb + 1, reps);
    free(tf), free(tb), free(Q), free(K), free(V), free(O), free(G), free(dQ), free(dK), free(dV);
    free(W);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    const char *csv = NULL;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc) csv = argv[++i];
        else if (strcmp(argv[i], "--quick") == 0) quick = 1;
    }
    FILE *f = NULL;
    if (rank == 0 && csv) {
        f = fopen(csv, "a");
        if (!f) {
            fprintf(stderr, "bench_mpi: cannot write %s\n", csv);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        fseek(f, 0, SEEK_END);
        if (ftell(f) == 0)
            fprintf(f, "what,np,mode,L,fwd_s,bwd_s,fwd_comm_s,bwd_comm_s,fwd_bytes,bwd_bytes,"
                       "single_fwd_s,single_bwd_s\n");
    }
    char cpu[128];
    if (rank == 0)
        printf("bench_mpi: %d rank%s, B %d H %d d %d dv %d m %d, positive map, one thread a rank; "
               "%s\n", nranks, nranks > 1 ? "s" : "", B, H, D, DV, MF, cpu_name(cpu, sizeof cpu));
    /* 1. bytes against L (a few repeats: the count does not vary) */
    if (rank == 0) printf("\nbytes sent + received by rank 0 per call\n%8s %8s %12s %12s\n", "mode", "L", "forward", "backward");
    for (int causal = 0; causal < 2; causal++)
        for (int lg = 10; lg <= (quick ? 12 : 16); lg += 2) {
            const int L = 1 << lg;
            meas m = run(L, causal, 1);
            if (rank == 0) {
                printf("%8s %8d %12llu %12llu\n", causal ? "causal" : "bidir", L,
                       (unsigned long long)m.fwd_bytes, (unsigned long long)m.bwd_bytes);
                if (f)
                    fprintf(f, "bytes,%d,%s,%d,%.6g,%.6g,%.6g,%.6g,%llu,%llu,,\n", nranks,
                            causal ? "causal" : "bidir", L, m.fwd, m.bwd, m.fwd_comm, m.bwd_comm,
                            (unsigned long long)m.fwd_bytes, (unsigned long long)m.bwd_bytes);
            }
        }
    /* 2. time at L = 2^14 (2^12 quick) in all */
    const int L = quick ? 1 << 12 : 1 << 14, reps = quick ? 3 : 7;
    if (rank == 0)
        printf("\ntime per call, L = %d in all, median of %d (slowest rank), against the single "
               "process at one thread\n%8s %10s %10s %10s %10s %9s %9s %12s\n", L, reps, "mode",
               "fwd ms", "bwd ms", "comm ms", "one fwd", "fwd x", "bwd x", "tok/s a rank");
    for (int causal = 0; causal < 2; causal++) {
        meas m = run(L, causal, reps);
        double sf = 0, sb = 0;
        if (rank == 0) single(L, causal, reps, &sf, &sb);
        if (rank == 0) {
            printf("%8s %10.2f %10.2f %10.3f %10.2f %9.2f %9.2f %12.3g\n",
                   causal ? "causal" : "bidir", 1e3 * m.fwd, 1e3 * m.bwd,
                   1e3 * (m.fwd_comm), 1e3 * sf, sf / m.fwd, sb / m.bwd,
                   (double)L / nranks / m.fwd);
            if (f)
                fprintf(f, "time,%d,%s,%d,%.6g,%.6g,%.6g,%.6g,%llu,%llu,%.6g,%.6g\n", nranks,
                        causal ? "causal" : "bidir", L, m.fwd, m.bwd, m.fwd_comm, m.bwd_comm,
                        (unsigned long long)m.fwd_bytes, (unsigned long long)m.bwd_bytes, sf,
                        sb);
        }
    }
    if (f) fclose(f);
    MPI_Finalize();
    return 0;
}
