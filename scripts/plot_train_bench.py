#!/usr/bin/python3
"""The figure and table of `make bench-train`: a training step of the byte LM against the
context, exact attention against FAVOR+ (tokens per second and peak memory, log-log).

usage: plot_train_bench.py CSV PNG [MD]

CSV is bench_train --csv (context, method, batch, tokens, status, note, seconds_per_step,
tokens_per_second, forward_seconds, backward_seconds, optimizer_seconds, steps, peak_mib, ...,
gflops, fma_fraction, exact_over_favor_time, exact_over_favor_memory, ..., machine). Writes PNG
(two panels: tokens/s and peak resident MiB against the context; cases that were not run or
failed are hollow markers on the x axis, their reason in the CSV's note) and, if given, MD: the table in Markdown.
Each file is written to a temporary name and renamed.
"""
import csv
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {"exact": ("exact", "#444444", "s"), "favor": ("FAVOR+", "#1f77b4", "o")}
NAMES = {"exact": "exact", "favor": "FAVOR+"}


def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def read(path):
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        sys.exit(f"plot_train_bench.py: cannot read {path}: {e.strerror}")
    if not rows:
        sys.exit(f"plot_train_bench.py: {path} has no rows")
    need = {"context", "method", "status", "tokens_per_second", "peak_mib", "machine"}
    missing = need - set(rows[0])
    if missing:
        sys.exit(f"plot_train_bench.py: {path} lacks columns {sorted(missing)}")
    return rows


def plot(rows, path):
    r0 = rows[0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    panels = [("tokens_per_second", "tokens per second (training step)", 1.0),
              ("peak_mib", "peak resident memory (MiB)", 1.0)]
    for ax, (key, ylabel, scale) in zip(axes, panels):
        for meth, (label, color, marker) in STYLE.items():
            pts = sorted((int(r["context"]), num(r[key]) * scale) for r in rows
                         if r["method"] == meth and r["status"] == "ok" and num(r[key]) > 0)
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, "-", color=color, marker=marker, ms=4, label=label)
            # cases that were not run or failed: a hollow marker at the bottom of the panel
            gone = sorted(int(r["context"]) for r in rows
                          if r["method"] == meth and r["status"] != "ok")
            if gone:
                ax.plot(gone, [0.0] * len(gone), linestyle="none", marker=marker, mfc="none",
                        color=color, ms=7, clip_on=False,
                        transform=ax.get_xaxis_transform(),
                        label=f"{label}: not run or failed (CSV note)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ys = [num(r[key]) for r in rows if r["status"] == "ok" and num(r[key]) > 0]
        if ys:  # at least a factor of 4 shown, so that a flat curve looks flat
            lo, hi = min(ys), max(ys)
            mid = math.sqrt(lo * hi)
            span = max(hi / lo, 4.0)
            ax.set_ylim(mid / math.sqrt(span) / 1.3, mid * math.sqrt(span) * 1.3)
        ax.set_xlabel("context T (tokens a step fixed)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title("speed")
    axes[1].set_title("memory")
    axes[1].text(0.02, 0.02, "exact attention keeps no T x T matrix (blockwise backward):\n"
                 "at fixed tokens a step its memory does not grow with T",
                 transform=axes[1].transAxes, fontsize=7.5, va="bottom")
    fig.suptitle(
        f"byte LM training step, {r0.get('layers', '?')} layers, d_model {r0.get('d_model', '?')}, "
        f"{r0.get('heads', '?')} heads, FAVOR+ m = {r0.get('features', '?')}, "
        f"{r0.get('tokens', '?')} tokens a step\n{r0['machine']}, {r0.get('threads', '?')} threads",
        fontsize=9)
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def fmt(x, spec, suffix=""):
    v = num(x)
    return "-" if not math.isfinite(v) else format(v, spec) + suffix


def markdown(rows, path):
    r0 = rows[0]
    cpu = "cores_busy" in r0  # (CSVs of bench_train before its CPU-time columns have none)
    cols = [("ms/step", lambda r: fmt(num(r["seconds_per_step"]) * 1e3, ".0f")),
            ("tokens/s", lambda r: fmt(r["tokens_per_second"], ".0f")),
            ("fwd ms", lambda r: fmt(num(r["forward_seconds"]) * 1e3, ".0f")),
            ("bwd ms", lambda r: fmt(num(r["backward_seconds"]) * 1e3, ".0f")),
            ("opt ms", lambda r: fmt(num(r["optimizer_seconds"]) * 1e3, ".1f")),
            ("peak MiB", lambda r: fmt(r["peak_mib"], ".0f")),
            ("GFLOP/s", lambda r: fmt(r["gflops"], ".1f")),
            ("of FMA", lambda r: fmt(num(r["fma_fraction"]) * 100, ".1f", "%"))]
    if cpu:
        cols += [("cores", lambda r: fmt(r["cores_busy"], ".2f")),
                 ("per CPU", lambda r: fmt(num(r["fma_fraction_per_cpu"]) * 100, ".1f", "%"))]
    cols += [("x time", lambda r: fmt(r["exact_over_favor_time"], ".2f", "x")),
             ("x mem", lambda r: fmt(r["exact_over_favor_memory"], ".2f", "x"))]
    intro = (
        f"Training step of the byte LM ({r0.get('layers')} layers, d_model {r0.get('d_model')}, "
        f"{r0.get('heads')} heads, FAVOR+ positive features m = {r0.get('features')}), "
        f"{r0.get('tokens')} tokens a step (batch = tokens / context), against the context: "
        f"`bench_train` on {r0['machine']}, {r0.get('threads')} threads. "
        f"\"of FMA\": model GFLOP/s over the fp32 FMA peak measured in the same run "
        f"({fmt(r0.get('fma_peak_gflops'), '.1f')} GFLOP/s on all threads); ")
    if cpu:
        intro += (
            f"cores: the step's CPU seconds over its wall seconds; per CPU: the model's FLOPs per "
            f"CPU second over the FMA loop's per second of its thread's CPU time "
            f"({fmt(r0.get('fma_peak_gflops_per_cpu_second'), '.1f')} GFLOP/s), which the "
            f"machine's other work does not lower; ")
    intro += "x time, x mem: exact's over FAVOR+'s at the same context."
    lines = [intro, "",
             "| context | method | batch | " + " | ".join(c for c, _ in cols) + " |",
             "|---:|:---|---:|" + "---:|" * len(cols)]
    for r in rows:
        name = NAMES.get(r["method"], r["method"])
        head = f"| {r['context']} | {name} | {r['batch']} | "
        if r["status"] != "ok":
            lines.append(head + r["note"] + " |" + " |" * (len(cols) - 1))
        else:
            lines.append(head + " | ".join(f(r) for _, f in cols) + " |")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


def main(argv):
    if len(argv) not in (3, 4):
        sys.stderr.write(__doc__)
        return 2
    rows = read(argv[1])
    plot(rows, argv[2])
    if len(argv) == 4:
        markdown(rows, argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
