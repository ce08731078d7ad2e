#!/usr/bin/python3
"""Plots the CSV log of `performer train`.

    plot_train.py LOG.csv OUT.png [TITLE]
        one run: training loss (raw and smoothed) and validation loss against steps, and
        validation accuracy

    plot_train.py --compare OUT.png [--title TITLE] [--baseline VALUE LABEL]
                  LABEL=LOG.csv [LABEL=LOG.csv ...]       (each split at its last "=")
        several runs: validation loss and accuracy against steps, one line per run, from the
        first evaluation after step 0 (the untrained value would flatten the curves), and a
        dashed reference line at VALUE on the loss panel

The log's columns: step, lr, train_loss, grad_norm, tokens_per_s, elapsed_s, val_loss,
val_ppl, val_acc (the val_* columns only on evaluation steps). Needs numpy and matplotlib.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def read_log(path):
    cols = {k: [] for k in ("step", "train_loss", "val_step", "val_loss", "val_acc")}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            step = int(row["step"])
            if row["train_loss"]:
                cols["step"].append(step)
                cols["train_loss"].append(float(row["train_loss"]))
            if row["val_loss"]:
                cols["val_step"].append(step)
                cols["val_loss"].append(float(row["val_loss"]))
                cols["val_acc"].append(float(row["val_acc"]))
    return {k: np.asarray(v) for k, v in cols.items()}


def smooth(y, n):
    """Moving average over n points (shorter at the start)."""
    if len(y) == 0 or n <= 1:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    out = np.empty(len(y))
    for i in range(len(y)):
        lo = max(0, i + 1 - n)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


def one(log_path, png, title):
    d = read_log(log_path)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    if len(d["step"]):
        ax1.plot(d["step"], d["train_loss"], color="0.8", lw=0.8, label="training (per step)")
        n = max(1, len(d["step"]) // 50)
        ax1.plot(d["step"], smooth(d["train_loss"], n), color="C0", lw=1.5,
                 label=f"training ({n}-step mean)")
    if len(d["val_step"]):
        ax1.plot(d["val_step"], d["val_loss"], "o-", color="C3", ms=3, label="validation")
        ax2.plot(d["val_step"], d["val_acc"], "o-", color="C3", ms=3)
    ax1.set_xlabel("step")
    ax1.set_ylabel("cross-entropy (nats per byte)")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.set_xlabel("step")
    ax2.set_ylabel("validation next-byte accuracy")
    ax2.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=110, format="png")


def compare(png, title, runs, baseline=None):
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (label, path) in enumerate(runs):
        d = read_log(path)
        keep = d["val_step"] > 0
        ax1.plot(d["val_step"][keep], d["val_loss"][keep], "o-", ms=2.5, color=f"C{i}",
                 label=label)
        ax2.plot(d["val_step"][keep], d["val_acc"][keep], "o-", ms=2.5, color=f"C{i}",
                 label=label)
    if baseline is not None:
        lo, hi = ax1.get_ylim()
        if lo <= baseline[0] <= hi + 0.5 * (hi - lo):
            ax1.axhline(baseline[0], color="0.4", ls="--", lw=1, label=baseline[1])
        else:  # far off the curves: say it rather than squash them
            ax1.plot([], [], color="0.4", ls="--", lw=1,
                     label=f"{baseline[1]}: {baseline[0]:.3f}, off the scale")
    ax1.set_xlabel("step")
    ax1.set_ylabel("validation cross-entropy (nats per byte)")
    ax1.grid(alpha=0.3)
    ax1.legend(loc="upper right")
    ax2.set_xlabel("step")
    ax2.set_ylabel("validation next-byte accuracy")
    ax2.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=110, format="png")


def main(argv):
    if len(argv) >= 3 and argv[1] == "--compare":
        png, rest, title, baseline = argv[2], argv[3:], "validation curves", None
        if len(rest) >= 2 and rest[0] == "--title":
            title, rest = rest[1], rest[2:]
        if len(rest) >= 3 and rest[0] == "--baseline":
            baseline, rest = (float(rest[1]), rest[2]), rest[3:]
        runs = [tuple(r.rsplit("=", 1)) for r in rest]
        if not runs or any(len(r) != 2 for r in runs):
            sys.exit("usage: plot_train.py --compare OUT.png [--title T] [--baseline V LABEL] "
                     "LABEL=LOG.csv ...")
        compare(png, title, runs, baseline)
    elif len(argv) in (3, 4):
        one(argv[1], argv[2], argv[3] if len(argv) == 4 else argv[1])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
