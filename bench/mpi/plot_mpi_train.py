"""plot_mpi_train.py CSV|TXT PNG: bench_mpi_train's measurements (its CSV, or its printed tables
as a saved run keeps them: docs/bench_mpi.txt) and the training scaling model of
docs/mpi.md ("Training across ranks").

Left: bytes rank 0 sends and receives per training step against the context T (measured): flat.
Middle: time per step against T at N = 1, 2 ranks, beside the single process, and at 2 ranks
rank 0's processor time a step (measured).
Right: time per sequence-parallel step against the number of ranks N at L = 2^20 tokens per
sequence (B = 2), from the per-rank compute rate measured at one rank (its largest T) and a
stated network (bandwidth beta, latency alpha), with the measured points scaled to 2^20.

The model, per step, counting the messages as src/mpi/train_mpi.c and performer_mpi.c send
them (lam = ceil(log2 N), n_l layers, S the bytes of one layer's attention state, P parameters):

    T(N) = B L / (N rate)                                  compute
         + lam alpha (5 + 9 n_l)                           small agreements (recursive doubling):
                                                           5 a step, 4 + 5 per layer's attention
         + 3 n_l lam (2 alpha + S / beta)                  the states: the forward's prefix, the
                                                           backward's prefix again and its
                                                           gradient suffix, each lam rounds of
                                                           two messages (references, state)
         + 2 (N - 1) (alpha + 4 P / (N beta))              the gradient sum: MPI_Alltoallv
                                                           (pairwise) + MPI_Allgatherv (ring)

Communication does not depend on L; it matters where it reaches the compute.
"""
import csv
import math
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# the benchmark's model (bench_mpi_train.c): 4 layers, d_model 128, 4 heads, positive m 64
B, LAYERS, HEADS, DH, R = 2, 4, 4, 32, 64
S = B * HEADS * (R * (DH + 1) * 4 + 8)  # bytes of one layer's state exchange
NETS = [("100 Gb/s, 2 us", 12.5e9, 2e-6), ("10 Gb/s, 20 us", 1.25e9, 20e-6)]
L_MODEL = 1 << 20


def comm_parts(n, P, beta, alpha):
    """The model's communication per sequence-parallel step at n ranks: (small, states, grads)."""
    if n <= 1:
        return 0.0, 0.0, 0.0
    lam = math.ceil(math.log2(n))
    small = lam * alpha * (5 + 9 * LAYERS)
    states = 3 * LAYERS * lam * (2 * alpha + S / beta)
    grads = 2 * (n - 1) * (alpha + 4 * P / (n * beta))
    return small, states, grads


def comm(n, P, beta, alpha):
    return sum(comm_parts(n, P, beta, alpha))


def crossover_ranks(P, beta, alpha, rate):
    """The fewest ranks at which communication takes as long as compute at L = 2^20."""
    lo, hi = 1, L_MODEL
    if comm(hi, P, beta, alpha) < B * L_MODEL / (hi * rate):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if comm(mid, P, beta, alpha) >= B * L_MODEL / (mid * rate):
            hi = mid
        else:
            lo = mid + 1
    return lo


def read_text(path):
    """The rows the CSV would hold, read back from bench_mpi_train's printed tables (a saved run
    such as docs/bench_mpi.txt): each "bench_mpi_train: N rank(s); ... P parameters" header,
    then its table's rows (mode, T, R, fwd and bwd bytes, messages, step, fwd, comm, cpu and
    single-process ms, ...)."""
    rows, np_, params = [], None, None
    for line in open(path):
        m = re.match(r"bench_mpi_train: (\d+) ranks?;.*?(\d+) parameters", line)
        if m:
            np_, params = m.group(1), m.group(2)
            continue
        if line.startswith("bench_mpi:"):
            np_ = None  # the attention benchmark's tables: not this one's
        f = line.split()
        if np_ and len(f) >= 11 and f[0] in ("data", "sequence") and f[1].isdigit():
            rows.append({"np": np_, "params": params, "mode": f[0], "T": f[1],
                         "fwd_bytes": f[3], "bwd_bytes": f[4], "step_s": float(f[6]) / 1e3,
                         "cpu_s": float(f[9]) / 1e3, "single_step_s": float(f[10]) / 1e3})
    if not rows:
        sys.exit(f"plot_mpi_train.py: no bench_mpi_train table in {path}")
    return rows


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_mpi_train.py CSV|TXT PNG (TXT: bench_mpi_train's printed tables)")
    rows = (read_text(sys.argv[1]) if sys.argv[1].endswith(".txt") else
            list(csv.DictReader(open(sys.argv[1]))))
    out = sys.argv[2]
    P = int(rows[0]["params"])
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(15, 6.2))
    nps = sorted({r["np"] for r in rows}, key=int)
    marks = {"data": "s", "sequence": "o"}
    for mode in ("data", "sequence"):
        for np_ in nps:
            pts = sorted((int(r["T"]), int(r["fwd_bytes"]) + int(r["bwd_bytes"]),
                          float(r["step_s"]), float(r["single_step_s"]), float(r["cpu_s"]))
                         for r in rows if r["mode"] == mode and r["np"] == np_)
            if not pts:
                continue
            lab = f"{mode}, {np_} rank{'s' if np_ != '1' else ''}"
            a1.plot([p[0] for p in pts], [max(p[1], 1) / 1e6 for p in pts], marker=marks[mode],
                    ls="-" if np_ != "1" else ":", label=lab)
            a2.plot([p[0] for p in pts], [p[2] for p in pts], marker=marks[mode],
                    ls="-" if np_ != "1" else ":", label=lab)
            if np_ != "1":  # (below the step's time: rank 0 was off its core for the difference)
                a2.plot([p[0] for p in pts], [p[4] for p in pts], ls=":", lw=1, marker="+",
                        color=a2.lines[-1].get_color(), label=f"{lab}: rank 0's processor time")
            if mode == "sequence":
                a2.plot([p[0] for p in pts], [p[3] for p in pts],
                        "k" + ("--" if np_ != "1" else ":"), marker="x",
                        label=f"single process (in the {lab[10:]} run)")
    a1.set_xscale("log", base=2)
    a1.set_yscale("log")
    a1.set_xlabel("context T (tokens a sequence, B = 2)")
    a1.set_ylabel("MB sent + received by rank 0 per step")
    a1.set_title("Bytes per training step: flat in T (measured)")
    a1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    a2.set_xscale("log", base=2)
    a2.set_yscale("log")
    a2.set_xlabel("context T (tokens a sequence, B = 2)")
    a2.set_ylabel("seconds per step (forward, backward, AdamW)")
    a2.set_title("Time per step, this machine (2 shared cores)")
    a2.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)  # below: off the curves

    print(f"training model: P = {P} parameters, state exchange S = {S} bytes a layer "
          f"(B {B}, H {HEADS}, r {R}, dv {DH}), {LAYERS} layers")
    one = [r for r in rows if r["mode"] == "sequence" and r["np"] == "1"]
    if not one:
        fig.tight_layout()
        fig.savefig(out, dpi=110)
        return
    r1 = max(one, key=lambda r: int(r["T"]))
    T1, step1 = int(r1["T"]), float(r1["step_s"])
    rate = B * T1 / step1  # tokens a second on one rank, a whole training step
    print(f"measured at one rank, sequence parallel, T = {T1}: {step1:.3f} s a step, "
          f"{rate:.4g} tokens/s a rank")
    ns = [2 ** i for i in range(15)]
    a3.plot(ns, [B * L_MODEL / (n * rate) for n in ns], "k:", label="compute alone")
    for (name, beta, alpha), col in zip(NETS, ("C0", "C3")):
        ts = [B * L_MODEL / (n * rate) + comm(n, P, beta, alpha) for n in ns]
        a3.plot(ns, ts, "-", color=col, marker=".", label=f"model, {name}")
        a3.plot(ns[1:], [comm(n, P, beta, alpha) for n in ns[1:]], "--", color=col,
                label=f"communication alone, {name}")
        sm, st, gr = comm_parts(64, P, beta, alpha)
        c64 = sm + st + gr
        comp64 = B * L_MODEL / (64 * rate)
        nx = crossover_ranks(P, beta, alpha, rate)
        print(f"  {name}: N = 64, L = 2^20: compute {comp64:.3f} s; communication "
              f"{c64 * 1e3:.2f} ms (agreements {sm * 1e3:.2f}, states {st * 1e3:.2f}, gradient "
              f"sum {gr * 1e3:.2f}), {100 * c64 / comp64:.2f}% of the compute; communication "
              f"equals compute at {rate * c64:.0f} tokens a rank at 64 ranks, and at L = 2^20 "
              f"from N = {nx} ranks ({B * L_MODEL / nx:.0f} tokens a rank)")
        if nx:
            a3.plot([nx], [comm(nx, P, beta, alpha)], "x", color=col, ms=10, mew=2,
                    label=f"crossover, {name}")
    meas = sorted((int(r["np"]), float(r["step_s"]) * L_MODEL / int(r["T"]))
                  for r in rows if r["mode"] == "sequence" and int(r["T"]) == T1)
    a3.plot([m[0] for m in meas], [m[1] for m in meas], "ko", fillstyle="none",
            label=f"measured here at T = {T1} (scaled to 2^20)")
    a3.axvline(64, color="0.6", lw=0.8)
    a3.set_xscale("log", base=2)
    a3.set_yscale("log")
    a3.set_xlabel("ranks N")
    a3.set_ylabel("seconds per step")
    a3.set_title("Model: sequence parallel, L = 2^20, B = 2")
    a3.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
