"""plot_mpi.py CSV|TXT PNG: bench_mpi's measurements (its CSV, or its printed tables as a saved
run keeps them: docs/bench_mpi.txt) and the scaling model of docs/mpi.md.

Left: bytes each rank sends and receives per call against L (measured): flat.
Right: time per forward+backward call against the number of ranks N at L = 2^20 tokens per
sequence, from the measured per-rank compute rate (one thread a rank, this machine) and a stated
network, with the measured points at N = 1, 2. The model, per call:

    T(N) = T1 * L / (N * L1)                       compute, from the measured one-rank time
         + k * ceil(log2 N) * (alpha + S / beta)   the state exchanges, S the state bytes
         + 8 * ceil(log2 N) * alpha                 the small agreements (4 a call)

with k = 3 causal (the forward's prefix, the backward's prefix again and its gradient suffix,
each ceil(log2 N) rounds of recursive doubling) and 6 bidirectional (each also broadcast from
the last rank), S = B H (r (dv + 1) 4 + 8) bytes. Communication matters where it reaches the compute: the crossover
tokens per rank L/N = rate * comm time.
"""
import csv
import math
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

B, H, R, DV = 1, 8, 256, 64
S = B * H * (R * (DV + 1) * 4 + 8)  # bytes of one state exchange (per message pair)
NETS = [("100 Gb/s, 2 us (InfiniBand class)", 12.5e9, 2e-6),
        ("10 Gb/s, 20 us (Ethernet)", 1.25e9, 20e-6)]
L_MODEL = 1 << 20


def read_text(path):
    """The rows the CSV would hold, read back from bench_mpi's printed tables (a saved run such
    as docs/bench_mpi.txt): each "bench_mpi: N rank(s)" header, then its bytes table (mode, L,
    forward and backward bytes) and its time table (L from its title; mode, forward, backward
    and communication ms, ...)."""
    rows, np_, section, L = [], None, None, None
    for line in open(path):
        m = re.match(r"bench_mpi: (\d+) ranks?", line)
        if m:
            np_, section = m.group(1), None
            continue
        if line.startswith("bench_mpi_train"):
            np_ = None  # the training benchmark's tables: not this one's
        if line.startswith("bytes sent"):
            section = "bytes"
        m = re.match(r"time per call, L = (\d+)", line)
        if m:
            section, L = "time", m.group(1)
        f = line.split()
        if not np_ or not f or f[0] not in ("causal", "bidir"):
            continue
        if section == "bytes" and len(f) == 4:
            rows.append({"what": "bytes", "np": np_, "mode": f[0], "L": f[1], "fwd_bytes": f[2],
                         "bwd_bytes": f[3]})
        elif section == "time" and len(f) >= 4:
            rows.append({"what": "time", "np": np_, "mode": f[0], "L": L,
                         "fwd_s": float(f[1]) / 1e3, "bwd_s": float(f[2]) / 1e3})
    if not rows:
        sys.exit(f"plot_mpi.py: no bench_mpi table in {path}")
    return rows


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_mpi.py CSV|TXT PNG (TXT: bench_mpi's printed tables)")
    rows = (read_text(sys.argv[1]) if sys.argv[1].endswith(".txt") else
            list(csv.DictReader(open(sys.argv[1]))))
    out = sys.argv[2]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 5.2))
    for mode, mk in (("causal", "o"), ("bidir", "s")):
        for np_ in sorted({r["np"] for r in rows}):
            pts = [(int(r["L"]), int(r["fwd_bytes"]) + int(r["bwd_bytes"])) for r in rows
                   if r["what"] == "bytes" and r["mode"] == mode and r["np"] == np_]
            if not pts:
                continue
            pts.sort()
            # hollow at 1 rank: both modes' points lie on 0 there, one inside the other
            a1.plot([p[0] for p in pts], [p[1] / 1e6 for p in pts], marker=mk,
                    markersize=9 if mode == "bidir" else 6,
                    fillstyle="none" if np_ == "1" else "full",
                    label=f"{mode}, {np_} rank{'s' if np_ != '1' else ''}")
    a1.set_xscale("log", base=2)
    a1.set_xlabel("L (tokens in all)")
    a1.set_ylabel("MB sent + received by rank 0, forward + backward")
    a1.set_title("Bytes per call: flat in L (measured)")
    a1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2,
               frameon=False)  # below: off the lines (the 1-rank ones lie on 0)
    a1.set_ylim(bottom=-0.1)
    print(f"model: state exchange S = {S} bytes (B {B}, H {H}, r {R}, dv {DV})")
    for mode, ls in (("causal", "-"), ("bidir", "--")):
        t1 = [r for r in rows if r["what"] == "time" and r["mode"] == mode and r["np"] == "1"]
        if not t1:
            continue
        L1 = int(t1[0]["L"])
        T1 = float(t1[0]["fwd_s"]) + float(t1[0]["bwd_s"])
        rate = L1 / T1  # tokens a second on one rank, forward + backward
        print(f"{mode}: measured at one rank, L = {L1}: {T1 * 1e3:.1f} ms forward + backward, "
              f"{rate:.3g} tokens/s a rank")
        ns = [2 ** i for i in range(7)]
        for ni, (name, beta, alpha) in enumerate(NETS):
            k = 3 + (3 if mode == "bidir" else 0)
            ts = [T1 * L_MODEL / (n * L1) + math.ceil(math.log2(n)) * (k * (alpha + S / beta)
                                                                       + 8 * alpha)
                  for n in ns]
            # the networks' lines nearly coincide: the first drawn wide, the second thin on it
            a2.plot(ns, ts, ls, marker=".", lw=3.5 if ni == 0 else 1.2, alpha=0.6 if ni == 0 else 1,
                    label=f"{mode}, model, {name}")
            if mode == "bidir":  # (the larger exchange: its communication alone, dotted)
                cs = [max(math.ceil(math.log2(n)) * (k * (alpha + S / beta) + 8 * alpha), 1e-6)
                      for n in ns]
                a2.plot(ns[1:], cs[1:], ":", label=f"bidir, communication alone, {name}")
            comm = math.ceil(math.log2(64)) * (k * (alpha + S / beta) + 8 * alpha)
            print(f"  {name}: N = 64, L = 2^20: compute {T1 * L_MODEL / (64 * L1):.3f} s, "
                  f"communication {comm * 1e3:.2f} ms; communication equals compute at "
                  f"{rate * comm:.0f} tokens a rank (L = {rate * comm * 64:.3g} over 64 ranks)")
        meas = [(int(r["np"]), (float(r["fwd_s"]) + float(r["bwd_s"])) * L_MODEL / int(r["L"]))
                for r in rows if r["what"] == "time" and r["mode"] == mode]
        a2.plot([m[0] for m in meas], [m[1] for m in meas], "k" + ("o" if mode == "causal" else "s"),
                fillstyle="none", label=f"{mode}, measured here (scaled to 2^20)")
    a2.set_xscale("log", base=2)
    a2.set_yscale("log")
    a2.set_xlabel("ranks N")
    a2.set_ylabel("seconds per forward + backward")
    a2.set_title("L = 2^20 tokens: model from the measured rate")
    a2.set_ylim(1e-4, None)
    a2.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2,
               frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
