#!/usr/bin/python3
"""targets.py: this CPU against the speed the library holds itself to, in one run.

    /usr/bin/python3 bench/targets.py [--build DIR] [--quick] [--md FILE]
    PF_SIMD=avx2 /usr/bin/python3 bench/targets.py     (the AVX2 kernels on an AVX-512 CPU,
                                                        and OpenBLAS's AVX2 "Haswell" set)

Each target is a fraction of the machine's fp32 FMA peak, as the benchmarks measure it in the
same run (bench/peak.h, for the vector set of the kernels in use), at B = 1, H = 8, d = 64,
m = 256, positive features:

  FAVOR+ bidirectional forward   >= 75% of the peak at every L from 2048 to 65536, all threads
  FAVOR+ causal forward          <= 1.15x the bidirectional one at every L
  backward from kept features    >= 70% in its own FLOPs, one thread, L = 4096, both directions
  decoding a token, 8 heads      <= 2x its arithmetic at the one-thread peak, every context
  language-model training        >= 50% in model FLOPs (4 layers, d_model 256, 4 heads,
                                    256 features, context 1024, FAVOR+)
  exact attention forward        >= 60% (bidirectional, its products in OpenBLAS)

It runs bench_attn, profile_favor --backward (both directions), bench_decode and bench_train,
prints what each printed, then a table of target, measured and verdict, naming the CPU, the
vector kernels and OpenBLAS's kernel set. --quick: L = 2048 and 4096 only, fewer repeats (a
first look, about 5 minutes on 2 cores; the full run takes about 20). --md FILE also writes
the table there (whole or not at all; through a symlink, to its target; nothing but a regular
file is written over). Exit status: 0 when it measured everything (whatever the
verdicts), 1 when a benchmark failed or was killed, 2 for bad arguments, 130 when
interrupted. The machine's other work moves
every figure: on a shared machine run it twice.
"""
import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile

FULL_LENGTHS = [2048, 4096, 8192, 16384, 32768, 65536]
QUICK_LENGTHS = [2048, 4096]
EXACT_MAX = 4096  # exact attention's O(L^2) time: measured up to here


def die(msg, code=1):
    print(f"targets.py: {msg}", file=sys.stderr)
    sys.exit(code)


def run(cmd, env, log):
    """Runs cmd with stderr passed through (progress) and stdout echoed and kept in log."""
    print("$ " + " ".join(cmd), flush=True)
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    except OSError as e:
        die(f"cannot run {cmd[0]}: {e.strerror}")
    sys.stdout.write(p.stdout)
    sys.stdout.flush()
    with open(log, "a", encoding="utf-8") as f:
        f.write(p.stdout)
    if p.returncode < 0:
        die(f"{os.path.basename(cmd[0])} was killed by signal {-p.returncode}")
    if p.returncode != 0:
        die(f"{os.path.basename(cmd[0])} exited with status {p.returncode}")
    return p.stdout


def read_csv(path, what):
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        die(f"{what} wrote no table ({path}: {e.strerror})")
    if not rows:
        die(f"{what}'s table is empty")
    return rows


def blas_env(build):
    """The environment the benchmarks run in: OpenBLAS's kernels as the tool sets them (when
    OpenBLAS's own choice is slower on this CPU), as `make bench` does, or its AVX2 set
    ("Haswell") under PF_SIMD=avx2, so that exact attention and the model's linear layers run
    at the AVX2 width too; the user's OPENBLAS_CORETYPE stands."""
    env = dict(os.environ)
    if "OPENBLAS_CORETYPE" in env:
        return env
    if env.get("PF_SIMD") == "avx2":
        env["OPENBLAS_CORETYPE"] = "Haswell"
        return env
    tool = os.path.join(build, "performer")
    try:
        out = subprocess.run([tool, "--version"], stdout=subprocess.PIPE, text=True,
                             env=env).stdout
    except OSError:
        return env
    m = re.search(r"OpenBLAS kernels: (\w+), set by performer over", out)
    if m:
        env["OPENBLAS_CORETYPE"] = m.group(1)
    return env


def kept_backward(text):
    """The '% peak' of 'backward from kept features' in profile_favor --backward's table."""
    m = re.search(r"^backward from kept features\s+([\d.]+)\s+([\d.]+)\s*$", text, re.M)
    if not m:
        die("profile_favor --backward printed no 'backward from kept features' row")
    return float(m.group(1)), float(m.group(2)) / 100


def pct(x):
    return f"{100 * x:.0f}%"


def span(values, fmt):
    lo, hi = min(values), max(values)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}-{fmt(hi)}"


def verdict(ok):
    return "yes" if ok else "**no**"


def main():
    ap = argparse.ArgumentParser(
        description="This CPU against the library's speed targets (bench/targets.py's header).")
    ap.add_argument("--build", default="build", help="the build folder [build]")
    ap.add_argument("--quick", action="store_true", help="L = 2048 and 4096, fewer repeats")
    ap.add_argument("--md", metavar="FILE", help="also write the table to FILE")
    a = ap.parse_args()
    bench = os.path.join(a.build, "bench")
    need = ["bench_attn", "profile_favor", "bench_decode", "bench_train"]
    missing = [b for b in need if not os.access(os.path.join(bench, b), os.X_OK)]
    if missing:
        make = " ".join(os.path.join(bench, b) for b in missing)
        die(f"not built: {', '.join(missing)} in {bench} (make {make})", 2)
    # --md: checked before the long run. A symlink's target is what gets written (the link
    # stays); anything there but a regular file (a folder, a FIFO, a device) is refused.
    md = os.path.realpath(a.md) if a.md else None
    if md and os.path.exists(md) and not os.path.isfile(md):
        die(f"--md {a.md}: {'a folder' if os.path.isdir(md) else 'not a regular file'}", 2)
    if md and not os.path.isdir(os.path.dirname(md)):
        die(f"--md {a.md}: no folder {os.path.dirname(md)}", 2)

    env = blas_env(a.build)
    lengths = QUICK_LENGTHS if a.quick else FULL_LENGTHS
    with tempfile.TemporaryDirectory(prefix="pf-targets-") as tmp:
        log = os.path.join(tmp, "log")
        attn_csv, dec_csv, train_csv = (os.path.join(tmp, n) for n in
                                        ("attn.csv", "decode.csv", "train.csv"))
        # (--quick first: it sets bench_attn's lengths, and --lengths after it sets them again)
        cmd = [os.path.join(bench, "bench_attn")] + (["--quick"] if a.quick else [])
        run(cmd + ["--csv", attn_csv, "--lengths", ",".join(map(str, lengths)),
                   "--max-exact", str(EXACT_MAX)], env, log)
        kept = {}
        for causal in (0, 1):
            cmd = [os.path.join(bench, "profile_favor"), "--backward", "--L", "4096"]
            cmd += ["--causal"] if causal else []
            cmd += ["--reps", "3"] if a.quick else []
            kept[causal] = kept_backward(run(cmd, env, log))
        run([os.path.join(bench, "bench_decode"), "--csv", dec_csv] +
            (["--quick"] if a.quick else []), env, log)
        run([os.path.join(bench, "bench_train"), "--csv", train_csv, "--contexts", "1024",
             "--layers", "4", "--d-model", "256", "--heads", "4", "--features", "256"] +
            (["--budget", "5"] if a.quick else []), env, log)
        attn = read_csv(attn_csv, "bench_attn")
        dec = read_csv(dec_csv, "bench_decode")
        train = read_csv(train_csv, "bench_train")

    machine = attn[0]["machine"]
    fav = {(int(r["L"]), int(r["causal"])): r for r in attn if r["method"] == "favor"}
    ex = [r for r in attn if r["method"] == "exact" and r["causal"] == "0"]
    lens = sorted({L for L, _ in fav if (L, 0) in fav and (L, 1) in fav})
    if not lens:
        die("bench_attn's table has no FAVOR+ rows")
    fwd = [float(fav[(L, 0)]["fma_fraction"]) for L in lens]
    ratio = [float(fav[(L, 1)]["fwd_seconds"]) / float(fav[(L, 0)]["fwd_seconds"]) for L in lens]
    one = [r for r in dec if r["threads"] == "1"]
    if not one:
        die("bench_decode's table has no one-thread rows")
    dmul = [float(r["peak_multiple"]) for r in one]
    dus = [1e6 * float(r["seconds_per_token"]) for r in one]
    tf = [r for r in train if r["method"] == "favor" and r["status"] == "ok"]
    te = [r for r in train if r["method"] == "exact" and r["status"] == "ok"]
    if not tf:
        die("bench_train's FAVOR+ step did not run: " +
            "; ".join(f"{r['method']}: {r['status']} {r['note']}" for r in train))
    tfrac = float(tf[0]["fma_fraction"])
    exf = [float(r["fma_fraction"]) for r in ex]

    per_l = ", ".join(f"{pct(f)} at {L}" for L, f in zip(lens, fwd))
    per_r = ", ".join(f"{r:.2f}x at {L}" for L, r in zip(lens, ratio))
    rows = [
        ("FAVOR+ bidirectional forward >= 75%, all threads, every L", per_l,
         verdict(min(fwd) >= 0.75)),
        ("causal <= 1.15x bidirectional, every L", per_r, verdict(max(ratio) <= 1.15)),
        ("backward from kept features >= 70%, 1 thread, L = 4096",
         f"bidirectional {pct(kept[0][1])} ({kept[0][0]:.1f} ms), "
         f"causal {pct(kept[1][1])} ({kept[1][0]:.1f} ms)",
         verdict(min(kept[0][1], kept[1][1]) >= 0.70)),
        ("decoding a token, 8 heads, <= 2x its arithmetic, 1 thread",
         f"{span(dmul, lambda x: f'{x:.2f}x')} ({span(dus, lambda x: f'{x:.1f}')} us a token, "
         f"contexts {one[0]['context']}-{one[-1]['context']})", verdict(max(dmul) <= 2.0)),
        ("training (4 layers, d_model 256, context 1024) >= 50%",
         f"FAVOR+ {pct(tfrac)} ({float(tf[0]['seconds_per_step']):.2f} s a step)" +
         (f"; exact {pct(float(te[0]['fma_fraction']))}" if te else ""), verdict(tfrac >= 0.50)),
        ("exact attention forward >= 60% (OpenBLAS)",
         ", ".join(f"{pct(f)} at {r['L']}" for f, r in zip(exf, ex)) or "not run",
         verdict(bool(exf) and min(exf) >= 0.60)),
    ]
    lines = [f"Targets on {machine}" + (" (--quick)" if a.quick else "") + ":", "",
             "| target (% of the FMA peak) | measured | met? |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {v} |" for t, m, v in rows]
    table = "\n".join(lines) + "\n"
    print("\n" + table, end="")
    if md:
        try:
            fd, tmp = tempfile.mkstemp(prefix=".targets-", dir=os.path.dirname(md))
        except OSError as e:
            die(f"--md {a.md}: {e.strerror}")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(table)
            os.replace(tmp, md)
        except OSError as e:
            die(f"--md {a.md}: {e.strerror}")
        finally:  # (written or not, no temporary file is left behind)
            if os.path.exists(tmp):
                os.unlink(tmp)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # (the benchmark got the signal too; --md is left as it was)
        die("interrupted", 130)
