#!/usr/bin/python3
"""Plots one CSV of `performer approx`.

    plot_approx.py RESULT.csv OUT.png [TITLE [YLABEL]]

The CSV has one row per (panel, series, x): panel, series, xvar, x, draws, failed, mse_mean,
mse_std, mse_median, zero_mse. Each panel becomes one subplot; each series a line (the mean
over the draws) with a band (mean +- std), on a log y axis; the grey dotted line is the error
of answering 0 (for attention, the mean square of the exact output). A series keeps its colour
and marker in every plot. OUT is written as PNG whatever its name. Exit 3 if numpy or
matplotlib is missing.
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
    "hyperbolic orth": ("#2ca02c", "D", "-"),
    "FAVOR++": ("#9467bd", "P", "-"),
    "positive theory": ("#1f77b4", "", ":"),
    "FAVOR++ theory": ("#9467bd", "", ":"),
    "FAVOR#": ("#8c564b", "X", "-"),
    "sqrtd": ("#e377c2", "d", "-"),
    "qmc": ("#bcbd22", "h", "-"),
    "RA": ("#7f7f7f", "*", "-"),
    "LARA": ("#ff7f0e", "p", "-"),
    "LARA eps=0": ("#ff7f0e", "p", ":"),
}
FALLBACK = ["#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173"]

XLABEL = {
    "m": "random projections m",
    "L": "sequence length L",
    "samples": "samples: m (RFA, FAVOR), S per query (RA), C proposals (LARA)",
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
    return np.array([float(r[key]) for r in rows])


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
    ncols = min(n, 3)
    nrows = (n + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(7.5, 5.4 * ncols), 4.3 * nrows),
                             squeeze=False)
    handles = {}
    extra = 0
    for ax, (pname, series) in zip(axes.flat, panels.items()):
        lines = []  # (name, label, style, x, mean, sd)
        xvar, ref = None, None
        for sname, rows in series.items():
            rows = sorted(rows, key=lambda r: float(r["x"]))
            xvar = rows[0]["xvar"]
            x, mean, sd = col(rows, "x"), col(rows, "mse_mean"), col(rows, "mse_std")
            failed = int(sum(int(r["failed"]) for r in rows))
            if sname not in STYLE:
                STYLE[sname] = (FALLBACK[extra % len(FALLBACK)], "o", "-")
                extra += 1
            label = sname + (f" ({failed} failed draws)" if failed else "")
            ok = np.isfinite(mean) & (mean > 0)
            lines.append((sname, label, STYLE[sname], x[ok], mean[ok], sd[ok]))
            if ref is None:
                ref = (x, col(rows, "zero_mse"))
        tops = sorted((ln[4].max(), ln[0]) for ln in lines if ln[4].size)
        bottoms = [ln[4].min() for ln in lines if ln[4].size]
        lo = min(bottoms) / 4 if bottoms else 0.25
        hi = tops[-1][0] * 4 if tops else 4.0
        if ref is not None:
            lo, hi = min(lo, ref[1].min() / 4), max(hi, ref[1].max() * 4)
        # Series many decades above the typical one would flatten the rest: cut the axis at
        # 1e8 times the median series top and say which series go beyond it.
        note = None
        cap = float(np.median([t for t, _ in tops])) * 1e8 if tops else hi
        over = [(t, name) for t, name in tops if t > cap]
        if over and len(over) < len(tops):
            hi = max(t for t, _ in tops if t <= cap) * 100
            if ref is not None:
                hi = max(hi, ref[1].max() * 4)
            names = ", ".join(name for _, name in over)
            note = f"off the top: {names} (up to {max(t for t, _ in over):.0e})"
        for sname, label, (color, marker, ls), x, mean, sd in lines:
            (h,) = ax.plot(x, mean, ls, color=color, marker=marker, ms=4.5, lw=1.6, label=label)
            handles.setdefault(label, h)
            # on a log axis a band's lower edge at or below 0 is drawn down to the bottom
            ax.fill_between(x, np.maximum(mean - sd, lo), np.minimum(mean + sd, hi * 10),
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
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    dr = ", ".join(str(d) for d in draws)
    fig.suptitle(f"{title}\n{dr} draws per point; line: mean, band: mean \u00b1 std",
                 fontsize=11)
    per_row = 2 if ncols == 1 else 4
    fig.legend(list(handles.values()), list(handles.keys()), loc="lower center",
               ncol=min(per_row, len(handles)), fontsize=9, frameon=False)
    rows_legend = (len(handles) + per_row - 1) // per_row
    fig.tight_layout(rect=(0, 0.035 + 0.045 * rows_legend / nrows, 1, 1))
    fig.savefig(png, dpi=110, format="png")


if __name__ == "__main__":
    main(sys.argv)
