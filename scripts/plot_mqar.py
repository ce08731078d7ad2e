#!/usr/bin/python3
"""plot_mqar.py: the CSV, table and figure of scripts/mqar_sweep.sh and bench/cuda/mqar_gpu.py.

    plot_mqar.py --runs DIR --out PREFIX     read the runs, write PREFIX.csv, .md and .png
    plot_mqar.py --runs DIR... --merge --out PREFIX   the runs of every DIR, and the rows of
                                                   PREFIX.csv that none of them has a run for
    plot_mqar.py --csv PREFIX.csv --out PREFIX     redraw .md and .png from the CSV alone
    plot_mqar.py --csv mqar_gpu.csv --out PREFIX   mqar_gpu.py's CSV (its incomplete runs,
                                                   stopped by its deadline, are left out)
    plot_mqar.py --swap PREFIX_swap.csv --out PREFIX_swap   scripts/mqar_swap.sh's CSV

DIR holds L<length>-p<pairs>/<attention>-m<m>-s<seed>/log.csv (`performer train --task mqar`'s
logs; m is 0 for attention without W: exact, elu). PREFIX.csv has one row per run: its length,
pairs, attention, m, seed, steps done, the best and the last evaluated answer accuracy, and its
training minutes. PREFIX.md gives, per length and pairs, each attention's best accuracy, mean
+- sd over seeds, each seed's, and how many seeds learnt the task, against m; PREFIX.png one
panel per length and pairs: accuracy against m (a line through the median over seeds and a
small marker for each seed, since a task learnt by one seed of three makes the spread
bimodal), exact attention's as the ceiling (dashed), elu + 1 at its state's width (the head
width: it has no m). Needs numpy and matplotlib (Debian's)."""
import argparse
import csv
import math
import os
import re
import sys
import textwrap

ATTN = {  # label, colour, marker
    "exact": ("exact softmax (the ceiling)", "black", None),
    "favor": ("FAVOR+ (positive)", "tab:blue", "o"),
    "favorpp": ("FAVOR++", "tab:purple", "^"),
    "relu": ("ReLU features", "tab:orange", "v"),
    "elu": ("ELU+1 linear (no W)", "tab:green", "D"),
}
SHORT = {"exact": "exact", "favor": "FAVOR+", "favorpp": "FAVOR++", "relu": "ReLU",
         "elu": "ELU+1"}
DODGE = {"favor": 0.9, "favorpp": 1.0, "relu": 1.1, "elu": 1.2}  # x factors, markers apart
HEADER = ["length", "pairs", "attention", "m", "seed", "steps", "best_answer_acc",
          "final_answer_acc", "minutes"]
SHARP_HEADER = ["length", "pairs", "attention", "m", "seed", "layer", "entropy_at_answers",
                "uniform_entropy", "top_score", "top_q_plus_k_sq"]


def kept_rows(path, header, have):
    """--merge: the rows of the earlier table at path (columns header; none if there is no such
    file) whose run (length, pairs, attention, m, seed: the first five columns) is not in have,
    those columns as int, str, int, int, int and the rest as written."""
    if not os.path.isfile(path):
        return []
    with open(path, newline="") as f:
        old = list(csv.reader(f))
    if old and old[0] != header:
        sys.exit("plot_mqar.py: %s is not a table of %s" % (path, ",".join(header)))
    kept = []
    for r in old[1:]:
        try:
            if len(r) != len(header):
                raise ValueError("%d columns, not %d" % (len(r), len(header)))
            r = [int(r[0]), int(r[1]), r[2], int(r[3]), int(r[4])] + r[5:]
        except ValueError as e:
            sys.exit("plot_mqar.py: %s: a row that is not a run (%s)" % (path, e))
        if tuple(r[:5]) not in have:
            kept.append(r)
    return kept


def read_runs(root):
    if not os.path.isdir(root):
        sys.exit("plot_mqar.py: %s: no such directory of runs" % root)
    rows = []
    for group in sorted(os.listdir(root)):
        g = re.fullmatch(r"L(\d+)-p(\d+)", group)
        if not g or not os.path.isdir(os.path.join(root, group)):
            continue
        for run in sorted(os.listdir(os.path.join(root, group))):
            r = re.fullmatch(r"([a-z]+)-m(\d+)-s(\d+)", run)
            log = os.path.join(root, group, run, "log.csv")
            if not r or not os.path.isfile(log):
                continue
            accs, step, secs = [], 0, 0.0
            with open(log, newline="") as f:
                for row in csv.DictReader(f):
                    step = int(row["step"])
                    if row["elapsed_s"]:
                        secs = float(row["elapsed_s"])
                    if row["val_answer_acc"]:
                        accs.append(float(row["val_answer_acc"]))
            if not accs:
                continue
            rows.append([int(g.group(1)), int(g.group(2)), r.group(1), int(r.group(2)),
                         int(r.group(3)), step, "%.6f" % max(accs), "%.6f" % accs[-1],
                         "%.2f" % (secs / 60)])
    return rows


def g_acc(g, att):
    """The best accuracies of attention att's runs in group g (rows of one length and pairs)."""
    return [r["best"] for r in g if r["attention"] == att]


def mean_sd(xs):
    m = sum(xs) / len(xs)
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0)


def swap_plot(path, out, head_width, title):
    """--swap: scripts/mqar_swap.sh's CSV -> out.md and out.png (accuracy against m of the
    trained models, all of one attention, with their attention swapped; median over models and
    W seeds, the interquartile range as a band; exact's, elu + 1's and, for models trained
    with random features, their own last evaluation as lines, chance as a dotted one)."""
    with open(path, newline="") as f:
        rows = [dict(r) for r in csv.DictReader(f)]
    if not rows:
        sys.exit("plot_mqar.py: %s has no rows" % path)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    for r in rows:
        for k in ("length", "pairs", "seed", "m", "w_seed"):
            r[k] = int(r[k])
        r["acc"], r["loss"] = float(r["answer_acc"]), float(r["val_loss"])
        r.setdefault("model", "exact-m0-s%d" % r["seed"])  # the CSVs before the column
    # the attention the models were trained with (their run names' first word), one kind a CSV
    trained = sorted({r["model"].split("-")[0] for r in rows})
    if len(trained) != 1 or trained[0] not in ATTN:
        sys.exit("plot_mqar.py: %s mixes or does not name the trained attention: %s" % (
            path, ", ".join(trained)))
    trained = trained[0]
    tlabel = ATTN[trained][0].split(" (")[0]
    own = [r for r in rows if r["attention"] == "trained"]
    rows = [r for r in rows if r["attention"] != "trained"]
    groups = sorted({(r["length"], r["pairs"]) for r in rows})
    lines = ["Models trained with %s attention that learnt the task (%s): answer accuracy "
             "with their attention swapped (weights unchanged), mean +- sd over models and W "
             "draws (n); validation loss on the answers likewise." % (
                 tlabel, ", ".join(sorted({r["model"] for r in rows}))), "",
             "| length | pairs | attention | m | answer accuracy | loss (nats) | n |",
             "|--:|--:|---|--:|--:|--:|--:|"]
    for r in own:
        lines.append("| %d | %d | %s as trained (its last W) | %d | %.3f | %.2f | 1 |" % (
            r["length"], r["pairs"], tlabel, r["m"], r["acc"], r["loss"]))
    fig, axes = plt.subplots(1, len(groups), figsize=(6.4 * len(groups), 5.8), squeeze=False)
    for gi, (L, N) in enumerate(groups):
        ax = axes[0][gi]
        g = [r for r in rows if r["length"] == L and r["pairs"] == N]
        models = sorted({r["model"] for r in g})
        for r in own:
            if (r["length"], r["pairs"]) == (L, N):
                ax.axhline(r["acc"], color=ATTN[trained][1], ls="--", lw=1.2,
                           label="%s m %d as trained (%s, its last W)" % (tlabel, r["m"],
                                                                         r["model"]))
        for att in ("exact", "elu", "favor", "favorpp", "relu"):
            label, col, mk = ATTN[att]
            if att == "exact" and trained != "exact":
                label = "exact softmax (swapped in)"
            ms = sorted({r["m"] for r in g if r["attention"] == att})
            pts = []
            for m in ms:
                sel = [r for r in g if r["attention"] == att and r["m"] == m]
                acc = [r["acc"] for r in sel]
                lines.append("| %d | %d | %s | %s | %.3f +- %.3f | %.2f +- %.2f | %d |" % (
                    L, N, label, m or "-", *mean_sd(acc), *mean_sd([r["loss"] for r in sel]),
                    len(sel)))
                pts.append((m, np.median(acc), np.percentile(acc, 25), np.percentile(acc, 75)))
            if not pts:
                continue
            if att in ("exact", "elu"):
                ax.axhline(pts[0][1], color=col, ls="--" if att == "exact" else "-.", lw=1.2,
                           label=("%s, unswapped" % label if trained == "exact" else label)
                           if att == "exact" else
                           "ELU+1 linear (state %d x %d)" % (head_width, head_width))
            else:
                x = [p[0] for p in pts]
                ax.plot(x, [p[1] for p in pts], color=col, marker=mk, label=label)
                ax.fill_between(x, [p[2] for p in pts], [p[3] for p in pts], color=col,
                                alpha=0.15)
        ax.axhline(1.0 / N, color="grey", ls=":", lw=1, label="chance among the pairs (1/%d)" % N)
        ax.set_xscale("log", base=2)
        # the feature counts of the panel, a factor 2 of room each side (one m alone would
        # otherwise leave matplotlib a span of nothing around it)
        xs = [r["m"] for r in g if r["m"] > 0] + \
            ([a.head_width] if any(r["attention"] == "elu" for r in g) else [])
        if xs:
            ax.set_xlim(min(xs) / 2, max(xs) * 2)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("features m per layer (rows of W; the state is m x head width)")
        ax.set_ylabel("answer accuracy")
        ax.set_title("length %d, %d key-value pairs, %d %s model(s) x W draws" % (
            L, N, len(models), tlabel), fontsize=10)
        ax.grid(alpha=0.3)
    fig.suptitle(textwrap.fill(title or "Recall learnt with %s attention, the attention "
                               "swapped for random features (median, interquartile band)" % (
                                   "softmax" if trained == "exact" else tlabel),
                               60 * len(groups)), fontsize=11)
    handles, labels = [], []  # one legend below the panels, off the data
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.2, 1, 0.92))
    fig.savefig(out + ".tmp.png", dpi=110)
    os.replace(out + ".tmp.png", out + ".png")
    text = "\n".join(lines) + "\n"
    with open(out + ".md.tmp", "w") as f:
        f.write(text)
    os.replace(out + ".md.tmp", out + ".md")
    print(text)


def sharpness(paths, out, merge=False):
    """--sharpness: how sharp the attention of trained MQAR models is where it answers. For each
    checkpoint .../L<length>-p<pairs>/<attention>-m<m>-s<seed>/checkpoint.safetensors, on its
    first validation batch (the sequences `performer train` scored it on): per layer, at the
    answer positions, the mean entropy of the attention row (nats; log(i + 1) is a uniform row),
    the median top score q'.k' (x' = x d^-1/4, so softmax weights are exp(q'.k')), and the
    median of |q' + k'|^2 for the top key k': FAVOR+'s one-feature estimate of exp(q'.k') has a
    relative variance of exp(|q' + k'|^2) - 1 (iid rows), so m features leave a relative
    standard error of about exp(|q' + k'|^2 / 2) / sqrt(m) on the weight of the key that holds
    the answer. For a model trained with random features the same numbers describe the softmax
    attention its features estimate (its q and k read exactly), which says how hard that
    estimate is. Appends the table to out (a Markdown file), writes its rows to
    out_sharpness.csv beside it (merge: keeping the rows of that file's earlier runs that paths
    has no checkpoint for) and prints it."""
    import numpy as np
    import performer
    dst = (out[:-3] if out.endswith(".md") else out) + "_sharpness.csv"
    rows = []  # SHARP_HEADER's columns
    lines = ["", "Attention at the answers of the trained models (first validation batch; "
             "`plot_mqar.py --sharpness`): mean row entropy (nats), median top score q'.k' "
             "and median |q'+k'|^2 for the top key (FAVOR+'s relative variance per feature is "
             "exp of it, minus 1).", "",
             "| length | pairs | attention | m | seed | layer | entropy at answers (uniform) | "
             "top q'.k' | \\|q'+k'\\|^2 |", "|--:|--:|---|--:|--:|--:|--:|--:|--:|"]
    def order(path):  # length, pairs, attention as in ATTN, m, seed
        nums = [int(x) for x in re.findall(r"\d+", path.split("/L")[-1])]
        run = os.path.basename(os.path.dirname(os.path.abspath(path))).split("-")[0]
        return nums[:2], list(ATTN).index(run) if run in ATTN else len(ATTN), nums[2:]
    for path in sorted(paths, key=order):
        run = os.path.basename(os.path.dirname(os.path.abspath(path)))
        group = os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(path))))
        g = re.fullmatch(r"L(\d+)-p(\d+)", group)
        r = re.fullmatch(r"([a-z]+)-m(\d+)-s(\d+)", run)
        if not g or not r:
            sys.exit("plot_mqar.py: %s is not .../L<length>-p<pairs>/<attention>-m<m>-s<seed>/"
                     "checkpoint.safetensors" % path)
        L, N, S = int(g.group(1)), int(g.group(2)), int(r.group(3))
        attn, M = r.group(1), int(r.group(2))
        tok, tgt = performer.mqar_batch(max(1, 4096 // L), L, pairs=N, queries=L // 4, keys=64,
                                        seed=S, stream=2**63)
        ans = tgt != -1
        with performer.Model(path) as m:
            for layer in range(m.config.layers):
                q, k, _ = m.attention_inputs(tok, layer)            # (B,H,T,d)
                d = q.shape[-1]
                h = performer.attention_entropy(q, k)               # (B,H,T)
                qs, ks = q.astype(np.float64) * d ** -0.25, k.astype(np.float64) * d ** -0.25
                sc = np.einsum("bhid,bhjd->bhij", qs, ks)
                sc[..., ~np.tril(np.ones((L, L), bool))] = -np.inf
                top = sc.argmax(-1)                                 # (B,H,T)
                kt = np.take_along_axis(ks, top[..., None], axis=2)  # (B,H,T,d)
                x = ((qs + kt) ** 2).sum(-1)
                a = np.broadcast_to(ans[:, None, :], h.shape)
                uni = np.log(np.nonzero(ans)[1] + 1.0).mean()
                rows.append([L, N, attn, M, S, layer, "%.4f" % h[a].mean(), "%.3f" % uni,
                             "%.2f" % np.median(sc.max(-1)[a]), "%.2f" % np.median(x[a])])
    if merge:
        rows += [r[:5] + [int(r[5])] + r[6:]
                 for r in kept_rows(dst, SHARP_HEADER, {tuple(r[:5]) for r in rows})]
    rank = {k: i for i, k in enumerate(ATTN)}
    rows.sort(key=lambda r: (r[0], r[1], rank.get(r[2], len(ATTN)), r[3], r[4], r[5]))
    with open(dst + ".tmp", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(SHARP_HEADER)
        w.writerows(rows)
    os.replace(dst + ".tmp", dst)
    for L, N, attn, M, S, layer, ent, uni, top, x in rows:
        lines.append("| %d | %d | %s | %s | %d | %d | %.3f (%.2f) | %.1f | %.1f |" % (
            L, N, SHORT.get(attn, attn), M or "-", S, layer, float(ent), float(uni),
            float(top), float(x)))
    text = "\n".join(lines) + "\n"
    with open(out, "a") as f:
        f.write(text)
    print(text)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", nargs="+", metavar="DIR")
    ap.add_argument("--csv")
    ap.add_argument("--out", required=True)
    ap.add_argument("--head-width", type=int, default=64, help="elu + 1's x position")
    ap.add_argument("--title", help="the figure's title")
    ap.add_argument("--steps", type=int, nargs="+",
                    help="--runs: leave out the runs that stopped at any other step (short of "
                    "their end)")
    ap.add_argument("--merge", action="store_true",
                    help="--runs: keep the rows of the existing PREFIX.csv (runs made before, "
                    "their directories gone) that DIR has no run of the same length, pairs, "
                    "attention, m and seed for; --sharpness: likewise the rows of "
                    "PREFIX_sharpness.csv")
    ap.add_argument("--swap", metavar="CSV", help="scripts/mqar_swap.sh's CSV: draw that")
    ap.add_argument("--sharpness", nargs="+", metavar="CKPT",
                    help="trained MQAR checkpoints: append their attention's sharpness at the "
                    "answers to --out (a .md file)")
    a = ap.parse_args(argv)
    if a.merge and not (a.runs or a.sharpness):
        ap.error("--merge goes with --runs or --sharpness")
    if a.sharpness:
        return sharpness(a.sharpness, a.out, a.merge)
    if a.swap:
        return swap_plot(a.swap, a.out, a.head_width, a.title)
    if bool(a.runs) == bool(a.csv):
        ap.error("give --runs DIR or --csv FILE (or --swap CSV)")
    if a.runs:
        rows = [r for d in a.runs for r in read_runs(d)]
        if a.steps:  # runs still going (or stopped) are not results yet
            short = [r for r in rows if r[5] not in a.steps]
            rows = [r for r in rows if r[5] in a.steps]
            for r in short:
                print("plot_mqar.py: L%d p%d %s m%d s%d is at step %d, not %s: left out" % (
                    *r[:5], r[5], " or ".join(map(str, a.steps))), file=sys.stderr)
        if a.merge:
            rows = sorted(rows + kept_rows(a.out + ".csv", HEADER, {tuple(r[:5]) for r in rows}),
                          key=lambda r: r[:5])
        if not rows:
            sys.exit("plot_mqar.py: no finished run under %s" % " or ".join(a.runs))
        with open(a.out + ".csv.tmp", "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(HEADER)
            w.writerows(rows)
        os.replace(a.out + ".csv.tmp", a.out + ".csv")
    with open(a.csv or a.out + ".csv", newline="") as f:
        rows = [dict(r) for r in csv.DictReader(f)]
    # bench/cuda/mqar_gpu.py's rows say whether the run reached its end ("complete"): a run
    # stopped by the sweep's deadline is left out, and counted
    left_out = [r for r in rows if r.get("complete", "1") == "0"]
    rows = [r for r in rows if r.get("complete", "1") != "0"]
    if not rows:
        sys.exit("plot_mqar.py: no complete run in the CSV")
    for r in rows:
        for k in ("length", "pairs", "m", "seed", "steps"):
            r[k] = int(r[k])
        r["best"] = float(r["best_answer_acc"])

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    groups = sorted({(r["length"], r["pairs"]) for r in rows})
    lines = ["Best evaluated answer accuracy (share of queries answered with their value), mean "
             "+- sd over seeds (n), each seed's (in seed order), and how many seeds learnt the "
             "task (best above 0.5), by sequence length, key-value pairs and feature count m; "
             "exact and elu + 1 have no m.", "",
             "| length | pairs | attention | m | best answer accuracy | n | each seed | learnt "
             "| steps | minutes (mean) |", "|--:|--:|---|--:|--:|--:|---|--:|--:|--:|"]
    if left_out:
        lines[1:1] = ["", "Left out: %d run(s) stopped before their end (%s)." % (
            len(left_out), ", ".join("L%s p%s %s m%s s%s" % (r["length"], r["pairs"],
                                     r["attention"], r["m"], r["seed"]) for r in left_out))]
    cols = min(3, len(groups))
    nrow = (len(groups) + cols - 1) // cols
    fig, axes = plt.subplots(nrow, cols, figsize=(max(7.5, 5.2 * cols), 4.2 * nrow + 0.6),
                             squeeze=False)
    for gi, (L, N) in enumerate(groups):
        ax = axes[gi // cols][gi % cols]
        g = [r for r in rows if r["length"] == L and r["pairs"] == N]
        for att in ATTN:
            label, col, mk = ATTN[att]
            ms = sorted({r["m"] for r in g if r["attention"] == att})
            pts = []
            for m in ms:
                sel = sorted((r for r in g if r["attention"] == att and r["m"] == m),
                             key=lambda r: r["seed"])
                acc = [r["best"] for r in sel]
                mins = [float(r["minutes"]) for r in sel]
                steps = sorted({r["steps"] for r in sel})
                lines.append("| %d | %d | %s | %s | %.3f +- %.3f | %d | %s | %d/%d | %s | %.1f |"
                             % (L, N, label, m or "-", *mean_sd(acc), len(acc),
                                ", ".join("%.3f" % x for x in acc),
                                sum(x > 0.5 for x in acc), len(acc),
                                "/".join(str(s) for s in steps), sum(mins) / len(mins)))
                pts.append((m, np.median(acc), min(acc), max(acc)))
                # every seed's own point, so one seed that learnt is not lost in the median
                xs = m * DODGE[att] if att != "exact" else None
                if xs is not None and att != "elu":
                    ax.plot([xs] * len(acc), acc, color=col, marker=mk, ls="none", ms=3.5,
                            alpha=0.5)
            if not pts:
                continue
            if att == "exact":
                _, med, lo, hi = pts[0]
                ax.axhline(med, color=col, ls="--", lw=1.2, label=label)
                ax.axhspan(lo, hi, color=col, alpha=0.08)
            elif att == "elu":
                _, med, lo, hi = pts[0]
                ax.errorbar([a.head_width * DODGE[att]], [med], yerr=[[med - lo], [hi - med]],
                            color=col, marker=mk, ls="none", capsize=3,
                            label=label + " (r = head width)")
                ax.plot([a.head_width * DODGE[att]] * len(g_acc(g, att)), g_acc(g, att),
                        color=col, marker=mk, ls="none", ms=3.5, alpha=0.5)
            else:
                # each map's points a little to the side, so that equal accuracies stay apart
                x = [p[0] * DODGE[att] for p in pts]
                ax.plot(x, [p[1] for p in pts], color=col, marker=mk, label=label)
        ax.axhline(1.0 / N, color="grey", ls=":", lw=1,
                   label="1/pairs: the window's values known, not which is whose")
        ax.set_xscale("log", base=2)
        # the feature counts of the panel, a factor 2 of room each side (one m alone would
        # otherwise leave matplotlib a span of nothing around it)
        xs = [r["m"] for r in g if r["m"] > 0] + \
            ([a.head_width] if any(r["attention"] == "elu" for r in g) else [])
        if xs:
            ax.set_xlim(min(xs) / 2, max(xs) * 2)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel(textwrap.fill("features m (FAVOR's W rows per layer; ReLU, FAVOR+: r = m; "
                                    "each map's markers set a little apart)",
                                    200 if cols == 1 else 60), fontsize=9)
        ax.set_ylabel("answer accuracy (best evaluation)")
        ax.set_title("length %d, %d key-value pairs" % (L, N), fontsize=10)
        ax.grid(alpha=0.3)
    for j in range(len(groups), nrow * cols):
        axes[j // cols][j % cols].set_visible(False)
    handles, labels = [], []
    for ax in axes.flat:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    fig.legend(handles, labels, loc="lower center", ncol=2 if cols == 1 else 3, fontsize=8,
               frameon=False)
    fig.suptitle(textwrap.fill(a.title or "Multi-query associative recall against the feature "
                               "count (line: median over seeds; small markers: each seed)",
                               60 * cols),
                 fontsize=11)
    fig.tight_layout(rect=(0, 0.14, 1, 0.93))
    fig.savefig(a.out + ".tmp.png", dpi=110)
    os.replace(a.out + ".tmp.png", a.out + ".png")
    text = "\n".join(lines) + "\n"
    with open(a.out + ".md.tmp", "w") as f:
        f.write(text)
    os.replace(a.out + ".md.tmp", a.out + ".md")
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
