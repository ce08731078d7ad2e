#!/usr/bin/python3
"""Plots of `make bench`: time and memory against L (log-log), the forward's fraction of the
machine's FMA peak against L, and decode time per token.

usage: plot_bench.py ATTN_CSV [DECODE_CSV] OUTDIR

ATTN_CSV is bench_attn --csv (L, method, causal, fwd_seconds, fwdbwd_seconds, ..., fwd_mib,
fwdbwd_mib, ..., fma_fraction, fma_peak_gflops, sgemm_gflops, machine); DECODE_CSV is
bench_decode --csv (context, threads, seconds_per_token, ..., peak_seconds_per_token, ...,
machine).
Writes OUTDIR/bench_time.png, OUTDIR/bench_memory.png, OUTDIR/bench_peak.png (not from a CSV
older than the FMA peak's columns) and OUTDIR/bench_decode.png, each naming the machine (CPU and
kernel sets) the run was on.
"""
import csv
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    ("exact", "0"): ("exact", "#444444", "-"),
    ("exact", "1"): ("exact, causal", "#444444", "--"),
    ("favor", "0"): ("FAVOR+", "#1f77b4", "-"),
    ("favor", "1"): ("FAVOR+, causal", "#1f77b4", "--"),
}


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(x):
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def series(data, key):
    out = {}
    for r in data:
        k = (r["method"], r["causal"])
        v = num(r[key])
        if math.isfinite(v) and v > 0:
            out.setdefault(k, []).append((int(r["L"]), v))
    return out


def setup(ax, title, ylabel):
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel("sequence length L")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)


def plot_curves(ax, data, key, scale, kept=False):
    """One curve per (method, causal) of column `key` times `scale`. kept: the FAVOR+ rows of
    the features-kept backward (pf_favor_saved), the recomputing curve's colour with hollow
    markers."""
    if not data or key not in data[0]:
        return
    for k, pts in sorted(series(data, key).items()):
        label, color, ls = STYLE[k]
        xs, ys = zip(*sorted(pts))
        style = dict(ms=4, mfc="none", alpha=0.8) if kept else dict(ms=3)
        ax.plot(xs, [y * scale for y in ys], ls, color=color, marker="o",
                label=label + (", features kept" if kept else ""), **style)


def plot_pair(data, path, cols, scale, ylabel, suptitle, extra=None, legend_size=None,
              legend_loc="best"):
    """Forward and forward+backward side by side; cols = (forward, forward+backward, kept)
    column names; extra(ax, data) adds to each panel."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in ((axes[0], cols[0], "forward"),
                           (axes[1], cols[1], "forward + backward")):
        plot_curves(ax, data, key, scale)
        if key == cols[1]:
            plot_curves(ax, data, cols[2], scale, kept=True)
        if extra:
            extra(ax, data)
        setup(ax, title, ylabel)
        ax.legend(fontsize=legend_size, loc=legend_loc)
    fig.suptitle(suptitle)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def score_matrix(ax, data):
    """What a naive implementation would hold: the L x L score matrix of 8 heads."""
    Ls = sorted({int(r["L"]) for r in data})
    ax.plot(Ls, [8 * L * L * 4 / 2**20 for L in Ls], ":", color="#d62728",
            label="an L×L score matrix (naive exact)")


def machine(data, wrap=False):
    """The CPU and kernel sets of the run, as its CSV names them ('' for an older CSV); wrap puts
    the kernel sets on a line of their own (narrow figures)."""
    m = data[0].get("machine") if data else None
    if m and wrap:
        m = m.replace(", vector kernels", ",\nvector kernels", 1)
    return "\n" + m if m else ""


def plot_time(data, path):
    plot_pair(data, path, ("fwd_seconds", "fwdbwd_seconds", "saved_seconds"), 1e3,
              "time (ms, median)",
              "attention time, B=1 H=8 d=64 m=256, 2 threads" + machine(data),
              legend_size=8, legend_loc="lower right")


def plot_memory(data, path):
    plot_pair(data, path, ("fwd_mib", "fwdbwd_mib", "saved_mib"), 1.0, "working memory (MiB)",
              "peak memory beyond the caller's tensors, B=1 H=8 d=64 m=256" + machine(data),
              score_matrix, 8)


def plot_peak(data, path):
    """The forward's GFLOP/s (bench_attn's FLOP model) over the FMA peak at the same thread count
    (bench/peak.h), against L, with the sgemm probe's fraction for reference."""
    if not data or "fma_fraction" not in data[0]:
        return
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    top = 1.0
    for k, pts in sorted(series(data, "fma_fraction").items()):
        label, color, ls = STYLE[k]
        xs, ys = zip(*sorted(pts))
        ys = [100 * y for y in ys]
        top = max(top, max(ys))
        ax.plot(xs, ys, ls, color=color, marker="o", ms=3, label=label + ", forward")
    peak, sg = num(data[0].get("fma_peak_gflops")), num(data[0].get("sgemm_gflops"))
    if math.isfinite(peak) and math.isfinite(sg) and peak > 0:
        ax.axhline(100 * sg / peak, color="#2ca02c", ls=":",
                   label="OpenBLAS sgemm 1024³ (%.0f%%)" % (100 * sg / peak))
    ax.axhline(80, color="#d62728", ls="-.", lw=0.8, label="80%")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, max(100, top * 1.1))
    title = "forward as a fraction of the fp32 FMA peak, B=1 H=8 d=64 m=256"
    if math.isfinite(peak):
        title += "\n(peak %.0f GFLOP/s, all threads)" % peak
    ax.set_title(title + machine(data, True), fontsize=9)
    ax.set_xlabel("sequence length L")
    ax.set_ylabel("% of FMA peak (median time)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_decode(data, path):
    """One line per thread count (a CSV without the threads column is one thread), each with
    its arithmetic's time at the FMA peak of those threads."""
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    counts = sorted({int(r.get("threads") or 1) for r in data})
    colors = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b"]
    top = 0.0
    for i, n in enumerate(counts):
        sel = [r for r in data if int(r.get("threads") or 1) == n]
        xs = [int(r["context"]) for r in sel]
        ys = [num(r["seconds_per_token"]) * 1e6 for r in sel]
        color = colors[i % len(colors)]
        name = "%d thread%s" % (n, "s" if n > 1 else "")
        ax.plot(xs, ys, "-", color=color, marker="o", ms=3, label="FAVOR+ streaming state, " + name)
        at_peak = num(sel[0].get("peak_seconds_per_token")) * 1e6 if sel else math.nan
        if math.isfinite(at_peak):
            ax.axhline(at_peak, color=color, ls="-.", lw=0.8,
                       label="its arithmetic at the %s FMA peak (%.1f µs)" % (name, at_peak))
        top = max([top] + [y for y in ys if math.isfinite(y)])
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, top * 1.8 if top > 0 else 1)
    ax.set_title("decoding: time per token, H=8 d=64 m=256" + machine(data, True), fontsize=9)
    ax.set_xlabel("context length (tokens already decoded)")
    ax.set_ylabel("µs per token (median)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv):
    if len(argv) not in (3, 4):
        sys.stderr.write(__doc__)
        return 2
    outdir = argv[-1]
    os.makedirs(outdir, exist_ok=True)
    attn = rows(argv[1])
    plot_time(attn, os.path.join(outdir, "bench_time.png"))
    plot_memory(attn, os.path.join(outdir, "bench_memory.png"))
    plot_peak(attn, os.path.join(outdir, "bench_peak.png"))
    if len(argv) == 4 and os.path.exists(argv[2]):
        plot_decode(rows(argv[2]), os.path.join(outdir, "bench_decode.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
