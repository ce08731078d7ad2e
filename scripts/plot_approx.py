#!/usr/bin/python3
"""Plots one CSV of `performer approx`.

    plot_approx.py RESULT.csv OUT.png [TITLE [YLABEL]]

The CSV has one row per (panel, series, x): panel, series, xvar, x, draws, failed, mse_mean,
mse_std, mse_median, zero_mse, mse_q25, mse_q75, bias2, variance. Each panel becomes one
subplot; each series a line (the median over the draws) with a band (the interquartile range),
on a log y axis (a mean +- std band on a log axis runs down to the floor whenever std > mean
and hides the data); the grey dotted line is the error of answering 0 (for attention, the mean
square of the exact output). A series keeps its colour, marker and line style in every plot;
trig and hyperbolic maps have r = 2m features at m projections, and their labels say so. The
real experiment (TITLE starting "real:") gets a second row: the share of the mean MSE that is
squared bias. OUT is written as PNG whatever its name. Exit 3 if numpy or matplotlib is missing.
"""
import csv
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
except ImportError as e:  # the tool turns exit 3 into "no matplotlib: no plots"
    print(f"plot_approx.py: {e}", file=sys.stderr)
    sys.exit(3)

# One look for every plot: series name -> (colour, marker, line style).
STYLE = {
    "positive orth": ("#1f77b4", "o", "-"),
    "FAVOR+": ("#1f77b4", "o", "-"),
    "chi": ("#1f77b4", "o", "-"),
    "positive iid": ("#17becf", "s", "--"),
    "RFA": ("#17becf", "s", "--"),
    "trig orth": ("#d62728", "^", "-"),
    "trig iid": ("#ff7f0e", "v", "--"),
    "hyperbolic orth": ("#2ca02c", "D", "-."),
    "FAVOR++": ("#9467bd", "P", "-"),
    "positive theory": ("#1f77b4", "", ":"),
    "FAVOR++ theory": ("#9467bd", "", ":"),
    "FAVOR#": ("#8c564b", "X", "--"),
    "sqrtd": ("#e377c2", "d", "-."),
    "qmc": ("#bcbd22", "h", "--"),
    "RA": ("#7f7f7f", "*", "-"),
    "LARA": ("#ff7f0e", "p", "-"),
    "LARA eps=0": ("#ff7f0e", "p", ":"),
    "relu orth": ("#8c564b", "x", ":"),
    "iid prediction": ("#17becf", "", ":"),
}
# What a series is, where its name alone does not say it.
LABEL = {
    "trig orth": "trig orth (r = 2m features)",
    "trig iid": "trig iid (r = 2m features)",
    "hyperbolic orth": "hyperbolic orth (r = 2m features)",
    "positive theory": "positive: iid closed form",
    "FAVOR++ theory": "FAVOR++: iid closed form",
    "LARA eps=0": "LARA, eps = 0 (deterministic)",
    "relu orth": "relu orth (not a softmax estimate)",
    "iid prediction": "positive iid: the iid-projection prediction (Lemma 2, first order)",
}
FALLBACK = ["#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173"]

XLABEL = {
    "m": "random projections m (features r = m; trig, hyperbolic: r = 2m)",
    "L": "sequence length L",
    "samples": "samples: m = r features (RFA, FAVOR+, FAVOR++),\n"
    "S per query (RA), C proposals (LARA)",
    "sigma": "sigma: std of the entries of q and k (logit std ~ sigma^2)",
}
LOG2_X = {"m", "L", "samples"}


def read(path):
    panels = {}  # panel -> series -> list of rows; insertion order kept
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            p = panels.setdefault(r["panel"], {})
            p.setdefault(r["series"], []).append(r)
    return panels


def col(rows, key):
    return np.array([float(r[key]) if r.get(key) not in (None, "") else np.nan for r in rows])


def main(argv):
    if len(argv) not in (3, 4, 5):
        sys.exit(__doc__)
    csv_path, png = argv[1], argv[2]
    title = argv[3] if len(argv) >= 4 else csv_path
    ylabel = argv[4] if len(argv) == 5 else "MSE against exact attention"
    panels = read(csv_path)
    if not panels:
        sys.exit(f"plot_approx.py: {csv_path}: no rows")
    draws = sorted({int(r["draws"]) for p in panels.values() for s in p.values() for r in s})
    n = len(panels)
    bias_row = title.startswith("real:")
    ncols = n if bias_row else min(n, 3)
    nrows = 2 if bias_row else (n + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(7.5, 5.0 * ncols), 4.3 * nrows),
                             squeeze=False)
    handles = {}
    extra = 0
    for ax, (pname, series) in zip(axes.flat, panels.items()):
        lines = []  # (name, label, style, x, mean, sd)
        xvar, ref = None, None
        for sname, rows in series.items():
            rows = sorted(rows, key=lambda r: float(r["x"]))
            xvar = rows[0]["xvar"]
            x, med = col(rows, "x"), col(rows, "mse_median")
            q25, q75 = col(rows, "mse_q25"), col(rows, "mse_q75")
            failed = int(sum(int(r["failed"]) for r in rows))
            if sname not in STYLE:
                STYLE[sname] = (FALLBACK[extra % len(FALLBACK)], "o", "-")
                extra += 1
            label = LABEL.get(sname, sname) + (f" ({failed} failed draws)" if failed else "")
            ok = np.isfinite(med) & (med > 0)
            lines.append((sname, label, STYLE[sname], x[ok], med[ok], q25[ok], q75[ok]))
            if ref is None:
                ref = (x, col(rows, "zero_mse"))
        tops = sorted((ln[4].max(), ln[0]) for ln in lines if ln[4].size)
        bottoms = [ln[4].min() for ln in lines if ln[4].size]
        lo = min(bottoms) / 4 if bottoms else 0.25
        hi = tops[-1][0] * 4 if tops else 4.0
        if ref is not None:
            lo, hi = min(lo, ref[1].min() / 4), max(hi, ref[1].max() * 4)
        # Series many decades above the typical one would flatten the rest: cut the axis at
        # 1e8 (real: 1e3) times the median series top and say which series go beyond it.
        note = None
        cap = float(np.median([t for t, _ in tops])) * (1e3 if bias_row else 1e8) if tops else hi
        over = [(t, name) for t, name in tops if t > cap]
        if over and len(over) < len(tops):
            hi = max(t for t, _ in tops if t <= cap) * (4 if bias_row else 100)
            if ref is not None:
                hi = max(hi, ref[1].max() * 4)
            names = ", ".join(name for _, name in over)
            note = f"off the top: {names} (up to {max(t for t, _ in over):.0e})"
        for sname, label, (color, marker, ls), x, med, q25, q75 in lines:
            (h,) = ax.plot(x, med, ls, color=color, marker=marker, ms=4.5, lw=1.6, label=label,
                           mfc="none" if ls != "-" else color)
            handles.setdefault(label, h)
            band = np.isfinite(q25) & np.isfinite(q75) & (q75 > q25)
            if band.any():
                ax.fill_between(x[band], np.maximum(q25[band], lo), np.minimum(q75[band], hi * 10),
                                color=color, alpha=0.15, lw=0)
        if ref is not None:
            (h,) = ax.plot(ref[0], ref[1], ":", color="0.45", lw=1.2,
                           label="the error of answering 0")
            handles.setdefault(h.get_label(), h)
        if note:
            ax.text(0.02, 0.97, note, transform=ax.transAxes, va="top", fontsize=8.5,
                    color="0.25")
        ax.set_yscale("log")
        ax.set_ylim(lo, hi)
        if xvar in LOG2_X:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(XLABEL.get(xvar, xvar))
        ax.set_ylabel(ylabel)
        ax.set_title(pname, fontsize=10)
        ax.grid(alpha=0.3, which="both", lw=0.5)
    if bias_row:
        for ax, (pname, series) in zip(axes[1], panels.items()):
            for sname, rows in series.items():
                rows = sorted(rows, key=lambda r: float(r["x"]))
                x, b2, mean = col(rows, "x"), col(rows, "bias2"), col(rows, "mse_mean")
                ok = np.isfinite(b2) & np.isfinite(mean) & (mean > 0)
                if not ok.any():
                    continue
                color, marker, ls = STYLE[sname]
                ax.plot(x[ok], b2[ok] / mean[ok], ls, color=color, marker=marker, ms=4.5, lw=1.6,
                        mfc="none" if ls != "-" else color)
            # the squared error of a mean of n draws holds variance / n even without bias
            nd = max(draws)
            h = ax.axhline(1 / nd, ls="--", color="0.55", lw=1,
                           label=f"bias share of an unbiased estimator: 1/n, n = {nd} draws")
            handles.setdefault(h.get_label(), h)
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, 1.05)
            ax.set_xlabel(XLABEL["m"].replace(" (features", "\n(features"))
            ax.set_ylabel("squared bias / mean MSE")
            layer = pname.split(":")[0]
            ax.set_title(f"{layer}: share of the MSE that is squared bias", fontsize=9)
            ax.grid(alpha=0.3, which="both", lw=0.5)
    else:
        for ax in list(axes.flat)[n:]:
            ax.set_visible(False)
    dr = ", ".join(str(d) for d in draws)
    fig.suptitle(f"{title}\n{dr} draws per point; line: median, band: interquartile range "
                 "over the draws", fontsize=11)
    per_row = 2 if ncols == 1 else 4
    fig.legend(list(handles.values()), list(handles.keys()), loc="lower center",
               ncol=min(per_row, len(handles)), fontsize=9, frameon=False)
    rows_legend = (len(handles) + per_row - 1) // per_row
    fig.tight_layout(rect=(0, 0.035 + 0.045 * rows_legend / nrows, 1, 1))
    fig.savefig(png, dpi=110, format="png")


if __name__ == "__main__":
    main(sys.argv)
