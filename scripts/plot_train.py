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

    plot_train.py --impls OUT.png [--title TITLE] CSV [CSV ...]
        the CSVs of bench/cuda/train_gpu.py (columns impl, device, dtype, step, loss, val_loss,
        ...): one line per (impl, device, dtype) on three panels, the training loss (a 10-step
        mean over the raw losses), the validation loss, and each run's training loss less the
        CPU float32 run's of `ours` (the reference: how far bfloat16 on the GPU, or another
        attention, moves the curve), 10-step means, over the steps both have

The log's columns: step, lr, train_loss, grad_norm, tokens_per_s, elapsed_s, val_loss,
val_ppl, val_acc (the val_* columns only on evaluation steps); a --task mqar run's log has
val_answer_acc too (the accuracy on the recall answers, plotted in val_acc's place, which it
leaves empty). Needs numpy and matplotlib.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def read_log(path):
    """The log's columns as arrays; "val_acc" is MQAR's val_answer_acc where the log has it,
    and "acc_label" says which accuracy it is."""
    cols = {k: [] for k in ("step", "train_loss", "val_step", "val_loss", "val_acc")}
    acc = "val_acc"
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if "val_answer_acc" in (reader.fieldnames or []):
            acc = "val_answer_acc"
        for row in reader:
            step = int(row["step"])
            if row["train_loss"]:
                cols["step"].append(step)
                cols["train_loss"].append(float(row["train_loss"]))
            if row["val_loss"]:
                cols["val_step"].append(step)
                cols["val_loss"].append(float(row["val_loss"]))
                cols["val_acc"].append(float(row[acc]))
    out = {k: np.asarray(v) for k, v in cols.items()}
    out["acc_label"] = ("validation accuracy on the recall answers" if acc == "val_answer_acc"
                        else "validation next-byte accuracy")
    return out


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
    ax2.set_ylabel(d["acc_label"])
    ax2.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=110, format="png")


def compare(png, title, runs, baseline=None):
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6))
    # curves that overlap are told apart by marker and line style as well as colour
    looks = [("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", "-"), ("P", "--")]
    acc_labels = set()
    for i, (label, path) in enumerate(runs):
        d = read_log(path)
        acc_labels.add(d["acc_label"])
        keep = d["val_step"] > 0
        marker, ls = looks[i % len(looks)]
        for ax, key in ((ax1, "val_loss"), (ax2, "val_acc")):
            ax.plot(d["val_step"][keep], d[key][keep], ls, marker=marker, ms=4, mfc="none",
                    color=f"C{i}", label=label)
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
    ax2.set_xlabel("step")
    ax2.set_ylabel(acc_labels.pop() if len(acc_labels) == 1 else "validation accuracy")
    ax2.grid(alpha=0.3)
    # the legend below the panels, where it covers no curve
    handles, labels = ax1.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(3, len(labels)), fontsize=9,
               frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.06 * ((len(labels) + 2) // 3), 1, 1))
    fig.savefig(png, dpi=110, format="png")


def read_impls(paths):
    """[(label, key, {"step", "loss", "val_step", "val_loss"})] from train_gpu CSVs, one entry
    per (file, impl, device, dtype); the label is "impl device dtype", with the file's name
    when that key is in more than one file."""
    runs = []
    for path in paths:
        mine = {}
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                key = (row["impl"], row["device"], row["dtype"])
                r = mine.setdefault(key, {"step": [], "loss": [], "val_step": [],
                                          "val_loss": []})
                if row["loss"]:
                    r["step"].append(int(row["step"]))
                    r["loss"].append(float(row["loss"]))
                if row["val_loss"]:
                    r["val_step"].append(int(row["step"]))
                    r["val_loss"].append(float(row["val_loss"]))
        for key, r in mine.items():
            runs.append((path, key, {c: np.asarray(v) for c, v in r.items()}))
    count = {}
    for _, key, _ in runs:
        count[key] = count.get(key, 0) + 1
    out = []
    for path, key, r in runs:
        label = " ".join(key)
        if count[key] > 1:
            label += f" ({path.rsplit('/', 1)[-1]})"
        out.append((label, key, r))
    return out


def impls(png, title, paths):
    runs = read_impls(paths)
    if not runs:
        sys.exit("plot_train.py: no rows in " + ", ".join(paths))
    ref = next((r for _, key, r in runs if key == ("ours", "cpu", "fp32")), None)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax1, ax2, ax3 = axes
    n, skip = 10, 25  # the moving mean's length; the axes' range ignores the first steps
    lo, hi = [], []
    for i, (label, key, r) in enumerate(runs):
        style = "--" if key[1] == "cpu" else "-"
        if len(r["step"]):
            sm = smooth(r["loss"], n)
            ax1.plot(r["step"], r["loss"], color=f"C{i}", lw=0.5, alpha=0.25)
            ax1.plot(r["step"], sm, style, color=f"C{i}", lw=1.5, label=label)
            late = r["step"] >= skip
            if late.any():
                lo.append(r["loss"][late].min())
                hi.append(sm[late].max())
        keep = r["val_step"] > 0
        if keep.any():
            ax2.plot(r["val_step"][keep], r["val_loss"][keep], "o" + style, color=f"C{i}",
                     ms=3, label=label)
        if ref is not None and r is not ref and len(r["step"]):
            common, ia, ib = np.intersect1d(r["step"], ref["step"], return_indices=True)
            if len(common):
                diff = r["loss"][ia] - ref["loss"][ib]
                ax3.plot(common, smooth(diff, n), style, color=f"C{i}", lw=1.5,
                         label=f"{label} - ours cpu fp32")
    if lo:
        ax1.set_ylim(min(lo) - 0.05, max(hi) + 0.15)
    ax1.set_xlabel("step")
    ax1.set_ylabel("training cross-entropy (nats per byte)")
    ax1.set_title(f"training loss ({n}-step mean; raw faint; range from step {skip})",
                  fontsize=10)
    ax2.set_xlabel("step")
    ax2.set_ylabel("validation cross-entropy (nats per byte)")
    ax2.set_title("validation loss (after step 0)", fontsize=10)
    ax3.set_xlabel("step")
    ax3.set_ylabel("difference (nats per byte)")
    ax3.set_title(f"training loss less the CPU fp32 run's ({n}-step mean)", fontsize=10)
    ax3.axhline(0.0, color="0.4", lw=0.8)
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=110, format="png")


def main(argv):
    if len(argv) >= 3 and argv[1] == "--impls":
        png, rest, title = argv[2], argv[3:], "train_gpu.py: loss curves"
        if len(rest) >= 2 and rest[0] == "--title":
            title, rest = rest[1], rest[2:]
        if not rest:
            sys.exit("usage: plot_train.py --impls OUT.png [--title T] CSV ...")
        impls(png, title, rest)
    elif len(argv) >= 3 and argv[1] == "--compare":
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
