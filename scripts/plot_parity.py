#!/usr/bin/python3
"""plot_parity.py: the table, CSV and figure of scripts/lm_parity.sh.

    plot_parity.py --out PREFIX --runs-dir DIR --steps S --unigram U --runs NAME... --seeds N...
    plot_parity.py --out PREFIX --curves PREFIX_curves.csv --steps S --unigram U --runs ... --seeds ...

Reads DIR/NAME-sSEED/log.csv (`performer train`'s log) for every run and seed, or the curves a
previous call kept (--curves), and writes PREFIX_curves.csv (every evaluation of every run:
what the figure is drawn from, small enough to commit), PREFIX.csv (one row per run and seed:
final validation loss and accuracy, the share of the exact model's gap closed, training time),
PREFIX.md (per run: mean +- sd over seeds, and the difference from exact attention paired by
seed) and PREFIX.png (validation loss against steps: the mean over seeds, a band from the lowest
to the highest seed, the no-context loss dashed).

The share of the gap closed by a run of seed s is (U - loss) / (U - loss of exact, seed s), U the
byte frequencies' loss: 1 is exact attention's loss, 0 is what no context gives. Runs of one seed
share their batches and initial weights, so the paired differences take the seeds' common part
out. Needs numpy and matplotlib (Debian's)."""
import argparse
import csv
import os
import re
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

LABELS = {
    "exact": "exact softmax",
    "favor64": "FAVOR+, m = 64",
    "favor256": "FAVOR+, m = 256",
    "favorpp": "FAVOR++, m = 64",
    "relu": "ReLU features, m = 64",
    "elu": "ELU+1 linear (r = 64, no W)",
    "local32": "local softmax, window 32",
}
STYLES = {  # colour, line style, marker: lines that overlap stay apart
    "exact": ("black", "-", None),
    "favor64": ("tab:blue", "-", "o"),
    "favor256": ("tab:cyan", "--", "s"),
    "favorpp": ("tab:purple", "-.", "^"),
    "relu": ("tab:orange", "-", "v"),
    "elu": ("tab:green", "--", "D"),
    "local32": ("tab:red", ":", "x"),
}


def label(run):
    """A run's name in the table and legend: LABELS, else read from the name (favorM, favorppM,
    reluM, localW, as lm_parity.sh takes them)."""
    if run in LABELS:
        return LABELS[run]
    m = re.fullmatch(r"(favorpp|favor|relu|local)(\d+)", run)
    if not m:
        return run
    return {"favorpp": "FAVOR++, m = %s", "favor": "FAVOR+, m = %s",
            "relu": "ReLU features, m = %s", "local": "local softmax, window %s"}[m.group(1)] % \
        m.group(2)


def style(run):
    """A run's colour, line style and marker: STYLES, else its kind's (favor128 as favor64)."""
    if run in STYLES:
        return STYLES[run]
    m = re.fullmatch(r"(favorpp|favor|relu|local)(\d+)", run)
    kind = {"favorpp": "favorpp", "favor": "favor64", "relu": "relu", "local": "local32"}
    return STYLES.get(kind[m.group(1)] if m else "", (None, "-", None))


def read_log(path):
    """Evaluation steps, losses, accuracies; the last training step and its elapsed time."""
    steps, loss, acc, last, elapsed = [], [], [], 0, 0.0
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["val_loss"]:
                steps.append(int(row["step"]))
                loss.append(float(row["val_loss"]))
                acc.append(float(row["val_acc"]))
            if row["train_loss"]:
                last, elapsed = int(row["step"]), float(row["elapsed_s"])
    return steps, loss, acc, last, elapsed


def mean_sd(xs):
    xs = np.asarray(xs, dtype=float)
    return float(xs.mean()), float(xs.std(ddof=1)) if len(xs) > 1 else float("nan")


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--runs-dir")
    src.add_argument("--curves")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--unigram", type=float, required=True)
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--seeds", nargs="+", type=int, required=True)
    ap.add_argument("--title", default="")
    a = ap.parse_args(argv[1:])
    if "exact" not in a.runs:
        sys.exit("plot_parity.py: the runs must include exact (the shares are of its gap)")
    logs = {}
    if a.curves:
        with open(a.curves, newline="") as f:
            for r in csv.DictReader(f):
                key = (r["run"], int(r["seed"]))
                steps, loss, acc, _ = logs.setdefault(key, ([], [], [], float(r["train_s"])))
                steps.append(int(r["step"]))
                loss.append(float(r["val_loss"]))
                acc.append(float(r["val_acc"]))
    for run in a.runs:
        for seed in a.seeds:
            if a.curves:
                if (run, seed) not in logs or logs[run, seed][0][-1] != a.steps:
                    sys.exit(f"plot_parity.py: {a.curves} has no run {run} seed {seed} to step "
                             f"{a.steps}")
                continue
            path = os.path.join(a.runs_dir, f"{run}-s{seed}", "log.csv")
            steps, loss, acc, last, elapsed = read_log(path)
            if last != a.steps or not steps or steps[-1] != a.steps:
                sys.exit(f"plot_parity.py: {path} stops at step {last}, not {a.steps}")
            logs[run, seed] = (steps, loss, acc, elapsed)
    tmp = a.out + "_curves.csv.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "seed", "step", "val_loss", "val_acc", "train_s"])
        for run in a.runs:
            for seed in a.seeds:
                steps, loss, acc, elapsed = logs[run, seed]
                for st, lo, ac in zip(steps, loss, acc):
                    w.writerow([run, seed, st, f"{lo:.6f}", f"{ac:.6f}", f"{elapsed:.3f}"])
    if os.path.abspath(tmp[:-4]) != os.path.abspath(a.curves or ""):
        os.replace(tmp, a.out + "_curves.csv")
    else:
        os.remove(tmp)
    U = a.unigram
    rows = []
    for run in a.runs:
        for seed in a.seeds:
            steps, loss, acc, elapsed = logs[run, seed]
            ex = logs["exact", seed][1][-1]
            rows.append({"run": run, "seed": seed, "val_loss": loss[-1], "val_acc": acc[-1],
                         "share_of_gap": (U - loss[-1]) / (U - ex),
                         "diff_vs_exact": loss[-1] - ex, "train_s": elapsed})
    tmp = a.out + ".csv.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6f}" if isinstance(v, float) else v) for k, v in r.items()})
    os.replace(tmp, a.out + ".csv")

    n = len(a.seeds)
    md = [a.title + "\n" if a.title else "",
          f"Validation loss after {a.steps} steps, mean +- sd over {n} seeds "
          f"({', '.join(map(str, a.seeds))}); no context (byte frequencies): {U:.4f} nats/byte.",
          "Share of the gap: (no-context loss - loss) / (no-context loss - exact's loss), seed "
          "by seed (1 = exact attention, 0 = no context). Difference: loss - exact's loss of "
          "the same seed (same batches, same initial weights).\n",
          "| attention | val loss | share of the gap | difference from exact | next-byte accuracy "
          "| training time (min, mean) |",
          "|---|--:|--:|--:|--:|--:|"]
    for run in a.runs:
        rs = [r for r in rows if r["run"] == run]
        lm, ls = mean_sd([r["val_loss"] for r in rs])
        sm, ss = mean_sd([r["share_of_gap"] for r in rs])
        dm, ds = mean_sd([r["diff_vs_exact"] for r in rs])
        am, _ = mean_sd([r["val_acc"] for r in rs])
        tm, _ = mean_sd([r["train_s"] for r in rs])
        diff = "-" if run == "exact" else f"{dm:+.4f} +- {ds:.4f}"
        md.append(f"| {label(run)} | {lm:.4f} +- {ls:.4f} | {sm:.3f} +- {ss:.3f} | "
                  f"{diff} | {am:.4f} | {tm / 60:.1f} |")
    md.append("")
    tmp = a.out + ".md.tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(md))
    os.replace(tmp, a.out + ".md")

    fig, ax = plt.subplots(figsize=(10, 5.2))
    for run in a.runs:
        col, ls, mk = style(run)
        steps = np.array(logs[run, a.seeds[0]][0])
        keep = steps > 0  # the untrained value would flatten the curves
        L = np.array([logs[run, s][1] for s in a.seeds])[:, keep]
        ax.plot(steps[keep], L.mean(axis=0), color=col, linestyle=ls, marker=mk, markersize=4,
                label=label(run))
        ax.fill_between(steps[keep], L.min(axis=0), L.max(axis=0), color=col, alpha=0.15,
                        linewidth=0)
    ax.axhline(U, color="grey", linestyle="--", linewidth=1)
    ax.text(a.steps, U, "no context (byte frequencies)", ha="right", va="bottom", fontsize=8,
            color="grey")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("validation loss (nats/byte)")
    title = a.title or (f"the demo model trained from scratch: mean of {n} seeds, band = "
                        "lowest to highest seed")
    ax.set_title(textwrap.fill(title, 100), fontsize=10)  # a long title would run off the figure
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    tmp = a.out + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, a.out + ".png")
    print(f"plot_parity.py: wrote {a.out}.png, .md, .csv")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
