#!/usr/bin/python3
"""plot_reuse.py: the CSVs, tables and figures of scripts/reuse_study.sh.

    plot_reuse.py collect --out RUNS --parity DIR --fig FIG --seeds 1 2 3 --steps-at 200 500 1000
                          --ft-from 200 500 --total 1000 [--lib build/libperformer.so]
    plot_reuse.py plot --fig FIG [--unigram U]

collect reads the runs (`performer train` logs) and the source snapshots and writes three CSVs,
small enough to commit, that plot draws everything from:
  FIG/reuse_jump.csv      one row per swapped evaluation: source step and seed, attention, W
                          draw, validation loss, the snapshot's own exact loss on the same
                          windows, the jump (their difference)
  FIG/reuse_entropy.csv   one row per snapshot, layer and head: the mean entropy (nats) of its
                          causal softmax rows on WINDOWS windows of the Bible, and the mean of
                          log(i + 1), what uniform rows would have (performer.Model and
                          performer.attention_entropy, through the library at --lib)
  FIG/reuse_finetune.csv  every evaluation of the curves: exact (the sources), FAVOR+ m = 64 from
                          scratch, and fine-tuned from each snapshot step, at the total step
                          (the source's steps included)
plot writes FIG/reuse_jump.{png,md} and FIG/reuse_finetune.{png,md}. Needs numpy and matplotlib
(Debian's)."""
import argparse
import csv
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
WINDOWS, T = 16, 256  # the entropy's windows: 16 of 256 bytes, evenly spaced over the text
SWAPS = ["favor64", "favor256", "relu64", "elu", "favorpp64"]
LABELS = {
    "exact": "exact softmax",
    "favor64": "FAVOR+, m = 64",
    "favor256": "FAVOR+, m = 256",
    "relu64": "ReLU features, m = 64",
    "elu": "ELU+1 linear (no W)",
    "favorpp64": "FAVOR++, m = 64 (A fitted)",
}
STYLES = {
    "favor64": ("tab:blue", "o"),
    "favor256": ("tab:cyan", "s"),
    "relu64": ("tab:orange", "v"),
    "elu": ("tab:green", "D"),
    "favorpp64": ("tab:purple", "^"),
}


def read_log(path):
    """(step, val_loss) of every evaluation in DIR/log.csv."""
    with open(os.path.join(path, "log.csv"), newline="") as f:
        return [(int(r["step"]), float(r["val_loss"])) for r in csv.DictReader(f) if r["val_loss"]]


def write_csv(path, header, rows):
    with open(path + ".tmp", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
    os.replace(path + ".tmp", path)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_text(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def collect(a):
    jump = []
    for at in a.steps_at:
        for s in a.seeds:
            ex = read_log(os.path.join(a.out, "swap", "step%d-s%d-exact-w1" % (at, s)))[0][1]
            for name in sorted(os.listdir(os.path.join(a.out, "swap"))):
                pre = "step%d-s%d-" % (at, s)
                if not name.startswith(pre) or name.endswith(".out") or "-exact-" in name:
                    continue
                att, w = name[len(pre):].rsplit("-w", 1)
                loss = read_log(os.path.join(a.out, "swap", name))[0][1]
                jump.append([at, s, att, int(w), "%.6f" % loss, "%.6f" % ex, "%.6f" % (loss - ex)])
    write_csv(os.path.join(a.fig, "reuse_jump.csv"),
              ["source_step", "seed", "attention", "w_seed", "val_loss", "exact_val_loss", "jump"],
              jump)

    # the attention's entropy, through the Python package
    os.environ["PERFORMER_LIB"] = os.path.abspath(a.lib)
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
    import performer
    text = open(os.path.join(a.out, "bible-kjv.txt"), "rb").read()
    starts = np.linspace(0, len(text) - T - 1, WINDOWS).astype(np.int64)
    tok = np.array([list(text[o:o + T]) for o in starts], dtype=np.int32)
    uniform = float(np.mean(np.log(np.arange(1, T + 1))))
    ent = []
    for at in a.steps_at:
        for s in a.seeds:
            with performer.Model(os.path.join(a.out, "src", "s%d-step%d.safetensors" % (s, at))) \
                    as m:
                for layer in range(m.config.layers):
                    q, k, _ = m.attention_inputs(tok, layer)
                    e = performer.attention_entropy(q, k, causal=True)  # (B, H, T)
                    for h in range(e.shape[1]):
                        ent.append([at, s, layer + 1, h + 1, "%.6f" % float(e[:, h].mean()),
                                    "%.6f" % uniform])
    write_csv(os.path.join(a.fig, "reuse_entropy.csv"),
              ["source_step", "seed", "layer", "head", "entropy", "uniform_entropy"], ent)

    curves = []
    for s in a.seeds:
        for st, loss in read_log(os.path.join(a.parity, "exact-s%d" % s)):
            curves.append(["exact", s, st, "%.6f" % loss])
        for st, loss in read_log(os.path.join(a.parity, "favor64-s%d" % s)):
            curves.append(["scratch", s, st, "%.6f" % loss])
        for f in a.ft_from:
            for redraw in (0, 100):
                d = os.path.join(a.out, "ft", "from%d-s%d-redraw%d" % (f, s, redraw))
                if not os.path.isdir(d):
                    continue
                for st, loss in read_log(d):
                    curves.append(["from%d%s" % (f, "" if redraw == 0 else "-redraw%d" % redraw),
                                   s, f + st, "%.6f" % loss])
    write_csv(os.path.join(a.fig, "reuse_finetune.csv"), ["run", "seed", "step", "val_loss"],
              curves)
    print("collect: %d swapped evaluations, %d entropies, %d curve points" %
          (len(jump), len(ent), len(curves)))


def mean_sd(xs):
    xs = [float(x) for x in xs]
    m = sum(xs) / len(xs)
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0)


def first_reach(steps, losses, target):
    """The first step at which the curve reaches target, interpolated linearly between
    evaluations; None if it never does."""
    for i, (st, l) in enumerate(zip(steps, losses)):
        if l <= target:
            if i == 0:
                return float(st)
            s0, l0 = steps[i - 1], losses[i - 1]
            return s0 + (st - s0) * (l0 - target) / (l0 - l)
    return None


def finish(fig, legend_of, ncol, title, bottom, png):
    """The legend of axes legend_of below the panels (off the curves), the title; written
    atomically to png."""
    import matplotlib.pyplot as plt
    handles, labels = legend_of.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, bottom, 1, 0.96))
    fig.savefig(png + ".tmp.png", dpi=110)
    os.replace(png + ".tmp.png", png)
    plt.close(fig)


def plot(a):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jump = read_csv(os.path.join(a.fig, "reuse_jump.csv"))
    ent = read_csv(os.path.join(a.fig, "reuse_entropy.csv"))
    curves = read_csv(os.path.join(a.fig, "reuse_finetune.csv"))
    steps_at = sorted({int(r["source_step"]) for r in jump})
    seeds = sorted({int(r["seed"]) for r in jump})
    layers = sorted({int(r["layer"]) for r in ent})
    uniform = float(ent[0]["uniform_entropy"])

    def entropy_of(at, s, layer=None):
        xs = [float(r["entropy"]) for r in ent if int(r["source_step"]) == at and
              int(r["seed"]) == s and (layer is None or int(r["layer"]) == layer)]
        return sum(xs) / len(xs)

    def jump_of(at, s, att):  # mean over the W draws
        xs = [float(r["jump"]) for r in jump if int(r["source_step"]) == at and
              int(r["seed"]) == s and r["attention"] == att]
        return sum(xs) / len(xs)

    # ---- the jump against the entropy ---------------------------------------------------------
    fig, ax = plt.subplots(1, 2, figsize=(12.5, 4.8))
    for li, layer in enumerate(layers):
        ys = [[entropy_of(at, s, layer) for s in seeds] for at in steps_at]
        med = [np.median(y) for y in ys]
        ax[0].plot(steps_at, med, marker="os^Dv"[li % 5], label="layer %d" % layer)
        ax[0].fill_between(steps_at, [min(y) for y in ys], [max(y) for y in ys], alpha=0.15)
    ax[0].axhline(uniform, color="gray", ls="--", lw=1)
    ax[0].text(steps_at[0], uniform, " uniform rows (mean log(i+1))", va="bottom", fontsize=8,
               color="gray")
    ax[0].set_xlabel("step of the exact run (the snapshot)")
    ax[0].set_ylabel("attention entropy (nats, mean over rows and heads)")
    ax[0].set_title("each layer's attention entropy (median, range over %d seeds)" %
                    len(seeds), fontsize=10)
    ax[0].legend(fontsize=8, loc="lower left")
    ax[0].set_ylim(0, uniform * 1.08)
    span = max(entropy_of(at, s) for at in steps_at for s in seeds) - \
        min(entropy_of(at, s) for at in steps_at for s in seeds)
    for i, att in enumerate(SWAPS):  # each attention a little to the side, so none hides another
        col, mk = STYLES[att]
        dx = (i - (len(SWAPS) - 1) / 2) * 0.006 * span
        xs = [entropy_of(at, s) + dx for at in steps_at for s in seeds]
        ys = [jump_of(at, s, att) for at in steps_at for s in seeds]
        ax[1].scatter(xs, ys, color=col, marker=mk, s=28, label=LABELS[att])
    for at in steps_at:  # which snapshot each cluster is, above it
        x = np.mean([entropy_of(at, s) for s in seeds])
        top = max(jump_of(at, s, att) for s in seeds for att in SWAPS)
        ax[1].annotate("step %d" % at, (x, top), xytext=(0, 8), textcoords="offset points",
                       ha="center", fontsize=8, color="gray")
    ax[1].set_ylim(top=max(jump_of(at, s, att) for at in steps_at for s in seeds
                           for att in SWAPS) * 1.12)
    ax[1].axhline(0, color="black", lw=0.8)
    ax[1].set_xlabel("the snapshot's attention entropy (nats, mean over layers, heads, rows)")
    ax[1].set_ylabel("loss jump with no training (nats/byte)")
    ax[1].set_title("loss jump against entropy (a point: a seed, mean over W draws)",
                    fontsize=10)
    ax[1].grid(alpha=0.3)
    finish(fig, ax[1], 5, "Reuse: an exact model's weights under other attention, by how far "
           "it trained (demo configuration, %d seeds)" % len(seeds), 0.07,
           os.path.join(a.fig, "reuse_jump.png"))

    lines = ["Swapped attention with no training, at each snapshot of the exact runs: the jump in "
             "validation loss (nats/byte) over the snapshot's own, mean +- sd over %d seeds (each "
             "seed's jump the mean over its W draws); the entropy is the snapshot's, mean over "
             "layers, heads and rows (uniform rows: %.3f)." % (len(seeds), uniform), "",
             "| source step | exact val loss | entropy | " +
             " | ".join(LABELS[s] for s in SWAPS) + " |",
             "|--:|--:|--:|" + "--:|" * len(SWAPS)]
    for at in steps_at:
        ex = mean_sd([r["exact_val_loss"] for r in jump if int(r["source_step"]) == at and
                      r["attention"] == "favor64" and r["w_seed"] == "1"])
        en = mean_sd([entropy_of(at, s) for s in seeds])
        cells = ["%+.3f +- %.3f" % mean_sd([jump_of(at, s, att) for s in seeds]) for att in SWAPS]
        lines.append("| %d | %.4f +- %.4f | %.3f +- %.3f | %s |" % ((at,) + ex + en +
                                                                     (" | ".join(cells),)))
    lines += ["", "Entropy by layer (nats, mean +- sd over seeds):", "",
              "| source step | " + " | ".join("layer %d" % l for l in layers) + " |",
              "|--:|" + "--:|" * len(layers)]
    for at in steps_at:
        lines.append("| %d | %s |" % (at, " | ".join(
            "%.3f +- %.3f" % mean_sd([entropy_of(at, s, l) for s in seeds]) for l in layers)))
    write_text(os.path.join(a.fig, "reuse_jump.md"), "\n".join(lines) + "\n")
    print("\n".join(lines))

    # ---- fine-tuned against from scratch ------------------------------------------------------
    runs = []
    for r in curves:
        if r["run"] not in runs:
            runs.append(r["run"])

    def curve(run, s):
        pts = sorted((int(r["step"]), float(r["val_loss"])) for r in curves
                     if r["run"] == run and int(r["seed"]) == s)
        return [p[0] for p in pts], [p[1] for p in pts]

    def label(run):
        if run == "exact":
            return "exact softmax (the sources)"
        if run == "scratch":
            return "FAVOR+ m = 64 from scratch"
        f = run[4:].split("-")[0]
        return "FAVOR+ m = 64 from exact's step %s%s" % (
            f, ", new W every 100 steps" if "redraw" in run else ", W fixed")

    style = {"exact": ("black", "-"), "scratch": ("tab:blue", "-"),
             "from200": ("tab:red", "--"), "from500": ("tab:green", "--"),
             "from500-redraw100": ("tab:olive", ":")}
    fig, ax = plt.subplots(1, 2, figsize=(12.5, 4.8))
    lo = min(float(r["val_loss"]) for r in curves)
    for run in runs:
        col, ls = style.get(run, ("gray", "-"))
        cs = [curve(run, s) for s in seeds]
        st = cs[0][0]
        ys = np.array([c[1] for c in cs if c[0] == st])
        for axis in ax[:1]:
            axis.plot(st, np.median(ys, axis=0), color=col, ls=ls, label=label(run))
            axis.fill_between(st, ys.min(axis=0), ys.max(axis=0), color=col, alpha=0.15)
    ax[0].set_ylim(lo - 0.05, lo + 0.9)
    ax[0].set_xlabel("total step (the exact steps before a swap included)")
    ax[0].set_ylabel("validation loss (nats/byte)")
    ax[0].set_title("median and range over %d seeds" % len(seeds), fontsize=10)
    ax[0].grid(alpha=0.3)
    # steps to reach each loss target
    ref = [curve("scratch", s)[1][-1] for s in seeds]
    targets = np.linspace(max(ref) + 0.25, min(ref), 12)
    reach_rows = []
    for run in runs:
        col, ls = style.get(run, ("gray", "-"))
        med = []
        for t in targets:
            r = [first_reach(*curve(run, s), t) for s in seeds]
            med.append(np.median(r) if all(x is not None for x in r) else np.nan)
        ax[1].plot(targets, med, color=col, ls=ls, marker=".", label=label(run))
        reach_rows.append((run, med))
    ax[1].invert_xaxis()
    ax[1].set_xlabel("validation loss to reach (nats/byte)")
    ax[1].set_ylabel("total steps to reach it (median over seeds)")
    ax[1].set_title("steps to reach a loss (missing: not reached by every seed)", fontsize=10)
    ax[1].grid(alpha=0.3)
    finish(fig, ax[0], 3, "Reuse: FAVOR+ fine-tuned from an exact run's weights against "
           "trained from scratch, to the same total steps (demo configuration)", 0.1,
           os.path.join(a.fig, "reuse_finetune.png"))

    total = max(int(r["step"]) for r in curves)
    lines = ["Validation loss at step %d (nats/byte), mean +- sd over %d seeds; difference from "
             "FAVOR+ from scratch paired by seed; the share of the gap exact attention closes "
             "over no context (%s nats/byte: the byte frequencies), seed by seed; total steps to "
             "reach loss targets (median over seeds, '-' where a seed never does)." %
             (total, len(seeds), "%.4f" % a.unigram if a.unigram is not None else "not given"),
             "",
             "| run | val loss at %d | share of exact's gap | difference from scratch |" %
             total, "|---|--:|--:|--:|"]
    final = {run: [curve(run, s)[1][-1] for s in seeds] for run in runs}
    for run in runs:
        d = "-" if run == "scratch" else "%+.4f +- %.4f" % mean_sd(
            [x - y for x, y in zip(final[run], final["scratch"])])
        # (U - loss) / (U - exact's loss), seed by seed: 1 is exact attention, 0 no context
        share = "-" if a.unigram is None else "%.3f +- %.3f" % mean_sd(
            [(a.unigram - x) / (a.unigram - e) for x, e in zip(final[run], final["exact"])])
        lines.append("| %s | %.4f +- %.4f | %s | %s |" % ((label(run),) + mean_sd(final[run]) +
                                                          (share, d)))
    lines += ["", "| loss target | " + " | ".join(label(r) for r, _ in reach_rows) + " |",
              "|--:|" + "--:|" * len(reach_rows)]
    for i, t in enumerate(targets):
        lines.append("| %.3f | %s |" % (t, " | ".join(
            "-" if np.isnan(m[i]) else "%.0f" % m[i] for _, m in reach_rows)))
    write_text(os.path.join(a.fig, "reuse_finetune.md"), "\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--out", required=True)
    c.add_argument("--parity", required=True)
    c.add_argument("--fig", required=True)
    c.add_argument("--seeds", type=int, nargs="+", required=True)
    c.add_argument("--steps-at", type=int, nargs="+", required=True)
    c.add_argument("--ft-from", type=int, nargs="+", required=True)
    c.add_argument("--total", type=int, required=True)
    c.add_argument("--lib", default=os.path.join(HERE, "..", "build", "libperformer.so"))
    p = sub.add_parser("plot")
    p.add_argument("--fig", required=True)
    p.add_argument("--unigram", type=float, help="the no-context loss, for the shares")
    a = ap.parse_args(argv)
    collect(a) if a.what == "collect" else plot(a)


if __name__ == "__main__":
    main(sys.argv[1:])
