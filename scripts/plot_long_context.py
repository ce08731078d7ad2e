#!/usr/bin/python3
"""plot_long_context.py: the loss by position in the window, for scripts/long_context.sh.

    plot_long_context.py --runs DIR --out PREFIX --datas bible proteins --seeds 1 2 3
                         --short 1024 --long 8192 [--lib build/libperformer.so]
    plot_long_context.py --csv PREFIX.csv --out PREFIX      (redraw from the CSV alone)

For each data set, DIR/DATA/windows/eval_tokens.npy holds the validation windows of LONG bytes
(E, B, LONG); DIR/DATA/RUN-sSEED/checkpoint.safetensors each model (RUN: exact-cSHORT,
favor-cSHORT, favor-cLONG). Every model's cross-entropy of each next byte
(performer.Model.token_losses) is averaged over the windows, position by position: the long
models on whole windows, the short ones on each window cut into SHORT-byte pieces. PREFIX.csv
holds those means in bins of positions doubling in width (1, 2-3, 4-7, ...), one row per data,
run, seed and bin; PREFIX.md the table (mean +- sd over seeds) and each run's final validation
loss from its log. PREFIX_runs.csv: one row per data, run and seed: the final validation loss
on the run's own windows (its log), the mean loss over all positions of the common windows, and
the training time. PREFIX.png one panel per data set: loss against position (log axis), the
median over seeds and their range. Needs numpy and matplotlib (Debian's)."""
import argparse
import csv
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
STYLE = {"exact": ("black", "-", None), "favor-short": ("tab:blue", "--", "o"),
         "favor-long": ("tab:red", "-", "s")}


def kind(run, short):
    return "exact" if run.startswith("exact") else (
        "favor-short" if run == "favor-c%d" % short else "favor-long")


def bins(n):
    """[lo, hi) position bins doubling in width, positions 1..n-1 (position t predicts byte
    t + 1 from t + 1 bytes: the bin says how far into the window)."""
    out, lo = [], 1
    while lo < n:
        out.append((lo, min(2 * lo, n)))
        lo *= 2
    return out


def collect(a):
    os.environ["PERFORMER_LIB"] = os.path.abspath(a.lib)
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
    import performer
    rows, runs = [], []
    for data in a.datas:
        win = np.load(os.path.join(a.runs, data, "windows", "eval_tokens.npy"))
        win = win.reshape(-1, win.shape[-1]).astype(np.int32)  # (N, LONG)
        for run in ("exact-c%d" % a.short, "favor-c%d" % a.short, "favor-c%d" % a.long):
            T = a.short if run.endswith("-c%d" % a.short) else a.long
            pieces = win.reshape(-1, T)  # short models: each window cut into pieces
            for s in a.seeds:
                path = os.path.join(a.runs, data, "%s-s%d" % (run, s), "checkpoint.safetensors")
                with performer.Model(path) as m:
                    loss = np.mean([m.token_losses(p[None])[0] for p in pieces], axis=0)
                # loss[t]: the loss of byte t + 1 given bytes 0..t: position t + 1 in the window
                for lo, hi in bins(T):
                    rows.append([data, run, s, lo, hi, "%.6f" % loss[lo - 1:hi - 1].mean()])
                with open(os.path.join(os.path.dirname(path), "log.csv"), newline="") as f:
                    last = list(csv.DictReader(f))[-1]
                runs.append([data, run, s, T, last["step"], last["val_loss"], "%.6f" % loss.mean(),
                             last["elapsed_s"]])
            print("collect: %s %s done" % (data, run), file=sys.stderr)
    with open(a.out + ".csv.tmp", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["data", "run", "seed", "pos_lo", "pos_hi", "loss"])
        w.writerows(rows)
    os.replace(a.out + ".csv.tmp", a.out + ".csv")
    with open(a.out + "_runs.csv.tmp", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["data", "run", "seed", "context", "steps", "val_loss", "common_loss",
                    "train_s"])
        w.writerows(runs)
    os.replace(a.out + "_runs.csv.tmp", a.out + "_runs.csv")


def mean_sd(xs):
    m = sum(xs) / len(xs)
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0)


def runs_table(a, data, runs):
    """The runs' own numbers for DATA from PREFIX_runs.csv (if there), as markdown lines."""
    path = (a.csv or a.out + ".csv")[:-len(".csv")] + "_runs.csv"
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        rs = [r for r in csv.DictReader(f) if r["data"] == data]
    out = ["| run | final validation loss (own windows) | mean loss, common windows | "
           "training minutes |", "|---|--:|--:|--:|"]
    for run in runs:
        x = [r for r in rs if r["run"] == run]
        if x:
            out.append("| %s | %.4f +- %.4f | %.4f +- %.4f | %.1f |" % (
                run, *mean_sd([float(r["val_loss"]) for r in x]),
                *mean_sd([float(r["common_loss"]) for r in x]),
                sum(float(r["train_s"]) for r in x) / len(x) / 60))
    return out + [""]


def plot(a):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(a.csv or a.out + ".csv", newline="") as f:
        rows = list(csv.DictReader(f))
    datas = list(dict.fromkeys(r["data"] for r in rows))
    runs = list(dict.fromkeys(r["run"] for r in rows))
    short = min(int(r["run"].split("-c")[1]) for r in rows)
    fig, axes = plt.subplots(1, len(datas), figsize=(6.5 * len(datas), 4.8), squeeze=False)
    lines = ["Loss by position in the window (nats/byte, mean over the validation windows; mean "
             "+- sd over seeds): the byte at positions lo..hi-1 predicted from all bytes before "
             "it in its window.", ""]
    for ax, data in zip(axes[0], datas):
        lines += ["%s:" % data, "", "| positions | " + " | ".join(runs) + " |",
                  "|---|" + "--:|" * len(runs)]
        table = {}
        for run in runs:
            col, ls, mk = STYLE[kind(run, short)]
            rs = [r for r in rows if r["data"] == data and r["run"] == run]
            bs = sorted({(int(r["pos_lo"]), int(r["pos_hi"])) for r in rs})
            ys = [[float(r["loss"]) for r in rs if (int(r["pos_lo"]), int(r["pos_hi"])) == b]
                  for b in bs]
            x = [math.sqrt(lo * (hi - 1)) if hi - 1 > lo else lo for lo, hi in bs]
            ax.plot(x, [np.median(y) for y in ys], color=col, ls=ls, marker=mk, markersize=4,
                    label=run.replace("exact-c", "exact softmax, context ").replace(
                        "favor-c", "FAVOR+, context "))
            ax.fill_between(x, [min(y) for y in ys], [max(y) for y in ys], color=col, alpha=0.15)
            for b, y in zip(bs, ys):
                table.setdefault(b, {})[run] = "%.3f +- %.3f" % mean_sd(y)
        for b in sorted(table):
            lines.append("| %d-%d | %s |" % (b[0], b[1] - 1, " | ".join(
                table[b].get(r, "-") for r in runs)))
        lines.append("")
        lines += runs_table(a, data, runs)
        ax.axvline(short, color="gray", lw=0.8, ls=":")
        ax.text(short, ax.get_ylim()[1], " the short context ends", fontsize=7, color="gray",
                va="top")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("position in the window (bytes of context before the byte predicted)")
        ax.set_ylabel("loss (nats/byte)")
        ax.set_title(data, fontsize=10)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("Does the far context pay? Loss by position in the window, on the same validation "
                 "windows (median over seeds, their range as a band;\nthe first positions' bins hold"
                 " few bytes, so they are noisy)", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(a.out + ".tmp.png", dpi=110)
    os.replace(a.out + ".tmp.png", a.out + ".png")
    with open(a.out + ".md.tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(a.out + ".md.tmp", a.out + ".md")
    print("\n".join(lines))


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs")
    ap.add_argument("--csv")
    ap.add_argument("--out", required=True)
    ap.add_argument("--datas", nargs="+")
    ap.add_argument("--seeds", nargs="+", type=int)
    ap.add_argument("--short", type=int, default=1024)
    ap.add_argument("--long", type=int, default=8192)
    ap.add_argument("--lib", default=os.path.join(HERE, "..", "build", "libperformer.so"))
    a = ap.parse_args(argv)
    if bool(a.runs) == bool(a.csv):
        ap.error("give --runs DIR (with --datas and --seeds) or --csv FILE")
    if a.runs:
        if not a.datas or not a.seeds:
            ap.error("--runs needs --datas and --seeds")
        collect(a)
    plot(a)


if __name__ == "__main__":
    main(sys.argv[1:])
