#!/usr/bin/env python3
"""train_gpu.py: a byte-level Transformer trained on the King James Bible through
performer.torch.FastAttention, on the CPU in float32 (the reference loss curve) or on an NVIDIA
GPU under torch.autocast(bfloat16), where the same model is also trained with performer-pytorch's
FAVOR+ in pure torch and with exact attention (SDPA), for their speed and loss curves.

    PYTHONPATH=python /usr/bin/python3 bench/cuda/train_gpu.py --device cpu --dtype fp32 \\
        --csv docs/train_gpu_cpu_fp32.csv --report docs/train_gpu_cpu_fp32.txt
    PYTHONPATH=python python3 bench/cuda/train_gpu.py --device cuda --dtype bf16 \\
        --csv OUT/train_gpu_cuda_bf16.csv --report OUT/train_gpu_cuda_bf16.txt \\
        --reference docs/train_gpu_cpu_fp32.csv
    /usr/bin/python3 scripts/plot_train.py --impls docs/figures/train_gpu.png \\
        docs/train_gpu_cpu_fp32.csv OUT/train_gpu_cuda_bf16.csv

The data: the whole KJV, verse text only, one verse per line (as `performer train --data bible`
exports it), in --data (default build/bible-kjv.txt, git-ignored; about 4.2 MB). Where the file
is missing it is made with the `bible` program (Debian's bible-kjv); a machine without it (the
GPU machine) must be given the file. The first 95% of the bytes are trained on, the last 5% are
the validation split (from Hebrews on).

The model (defaults): bytes -> embedding + learned positions -> 4 pre-LayerNorm blocks (causal
attention of 4 heads of width 64, m = 256 features; an MLP of 4 x 256 with GELU) -> LayerNorm ->
256 logits; d_model 256, context 512, 4 windows a step (2048 tokens), 300 steps, AdamW (lr 2e-3,
betas 0.9 / 0.95, weight decay 0.01), linear warm-up over 30 steps then a cosine to a tenth,
gradients clipped to norm 1. One seed fixes the weights, the projection W (drawn by
performer.torch from torch's generator), the windows of every step and the validation windows;
the model is built on the CPU and moved, so every run starts from the same bits.

Attention, --impls (the cuda default runs all three, ours first, one after the other, each
from the same initial weights and seeing the same windows):
  ours   performer.torch.FastAttention(dim_heads, nb_features, causal=True): the C kernels on
         the CPU (forward and backward), libperformer_cuda on CUDA tensors (autograd there too).
  torch  performer-pytorch's FAVOR+ in pure torch (bench_cuda.py's pp_attention: softmax_kernel
         with its 1e-4 and detached stabilisers, causal_linear_attention_noncuda in 128 pieces)
         on the same W: the formulation a user of performer-pytorch runs without its CUDA
         extension.
  sdpa   torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True): exact
         softmax attention (FlashAttention on the GPU for bf16); not on torch without it.
On CUDA the whole step runs under torch.autocast("cuda", torch.bfloat16) (weights and AdamW in
float32); on the CPU in float32 (--dtype fp32) without autocast.

Timing: every step is synchronised (torch.cuda.synchronize) and timed with perf_counter; the
report gives the median step after the first WARMUP steps, tokens/s = batch x context / median,
and the peak of torch's allocator (CUDA; the library's own workspace is outside it). Evaluation
(every --eval-every steps, --eval-windows windows of the validation split) is not timed.
--max-seconds stops an implementation's training early (saying so), so that a GPU run stays
inside its time.

Output: the CSV (impl, device, dtype, step, loss, val_loss, lr, time_s, step_ms; loss is the
training batch's loss before the step's update, val_loss only on evaluation steps, time_s the
training time so far) and the report (the machine, the setup, per implementation the losses,
tokens/s and memory; with --reference, the curve of `ours` against the reference CSV's).
"""
import argparse
import csv
import datetime
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

WARMUP = 10             # steps left out of the median step time
DEFAULT_DATA = os.path.join("build", "bible-kjv.txt")
VAL_FRACTION = 0.05
FIELDS = ["impl", "device", "dtype", "step", "loss", "val_loss", "lr", "time_s", "step_ms"]


def log(msg):
    print(msg, flush=True)


# ---- data -----------------------------------------------------------------------------------

def export_bible(path):
    """Writes the KJV to path, verse text only, one verse a line (the tool's export), from the
    `bible` program; atomically."""
    exe = shutil.which("bible")
    if exe is None:
        sys.exit(f"train_gpu: {path} is missing and there is no `bible` program to make it "
                 "(Debian package bible-kjv): make it on a machine that has one and bring the "
                 "file along")
    r = subprocess.run([exe, "-f", "Ge1:1-Re22:21"], capture_output=True, check=True)
    lines = []
    for line in r.stdout.split(b"\n"):
        ref, sp, text = line.partition(b" ")
        if sp:
            lines.append(text + b"\n")
    if len(lines) < 30000:
        sys.exit(f"train_gpu: `bible` gave {len(lines)} verses, expected 31102")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.writelines(lines)
    os.replace(tmp, path)
    log(f"exported the KJV ({len(lines)} verses) to {path}")


def load_data(path):
    if not os.path.exists(path):
        export_bible(path)
    with open(path, "rb") as f:
        raw = f.read()
    n_val = int(len(raw) * VAL_FRACTION)
    return raw[:len(raw) - n_val], raw[len(raw) - n_val:]


def unigram_nats(train, val):
    """Cross-entropy (nats/byte) of the validation split under the training split's byte
    frequencies (add-one smoothed): what a model without context reaches."""
    import numpy as np
    cnt = np.bincount(np.frombuffer(train, dtype=np.uint8), minlength=256) + 1.0
    p = cnt / cnt.sum()
    v = np.bincount(np.frombuffer(val, dtype=np.uint8), minlength=256)
    return float(-(v * np.log(p)).sum() / v.sum())


# ---- the model ------------------------------------------------------------------------------

def build_model(torch, a):
    import performer.torch as pt
    from bench_cuda import pp_attention
    F = torch.nn.functional
    nn = torch.nn
    C, H = a.d_model, a.heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.out = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
            self.attn = pt.FastAttention(dim_heads=C // H, nb_features=a.features, causal=True)

        def attend(self, q, k, v, impl):
            # q, k, v (B,H,T,d) -> (B,H,T,d)
            if impl == "ours":
                return self.attn(q, k, v)
            if impl == "torch":
                return pp_attention(q, k, v, self.attn.projection_matrix, True)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def forward(self, x, impl):
            # x (B,T,C)
            B, T, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
            y = self.attend(q, k, v, impl).transpose(1, 2).reshape(B, T, C)
            x = x + self.proj(y)
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class Model(nn.Module):
        """bytes (B,T) -> logits (B,T,256)"""

        def __init__(self):
            super().__init__()
            self.emb, self.pos = nn.Embedding(256, C), nn.Embedding(a.context, C)
            self.blocks = nn.ModuleList(Block() for _ in range(a.layers))
            self.ln, self.head = nn.LayerNorm(C), nn.Linear(C, 256)
            self.impl = "ours"

        def forward(self, x):
            h = self.emb(x) + self.pos(torch.arange(x.shape[1], device=x.device))
            for b in self.blocks:
                h = b(h, self.impl)
            return self.head(self.ln(h))

    return Model()


# ---- one training run -----------------------------------------------------------------------

def lr_at(a, step):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    p = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))


def train_one(torch, a, impl, init_state, data, windows, val_x, rows):
    """Trains the model with attention impl from init_state; appends CSV rows; returns a dict
    of results."""
    import contextlib
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    F = torch.nn.functional
    model = build_model(torch, a)
    model.load_state_dict(init_state)
    model.impl = impl
    model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    if cuda and a.dtype == "bf16":
        def amp():
            return torch.autocast("cuda", dtype=torch.bfloat16)
    else:
        amp = contextlib.nullcontext
    ar = torch.arange(a.context + 1, device=dev)
    data = data.to(dev)

    def batch(starts):
        w = data[starts.to(dev)[:, None] + ar]          # (B,T+1) bytes
        return w[:, :-1].long(), w[:, 1:].long()

    def evaluate():
        model.eval()
        tot, n = 0.0, 0
        with torch.no_grad(), amp():
            for i in range(0, len(val_x), a.batch):
                x, y = batch(val_x[i:i + a.batch])
                logits = model(x)
                tot += float(F.cross_entropy(logits.float().flatten(0, 1), y.flatten(),
                                             reduction="sum"))
                n += y.numel()
        model.train()
        return tot / n

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    res = {"impl": impl, "steps": 0, "stopped": None, "val": [], "loss": [], "times": [],
           "train_s": 0.0}
    t_start = time.perf_counter()
    try:
        steps(torch, a, impl, model, opt, amp, batch, evaluate, windows, rows, res, t_start)
    except Exception as e:  # noqa: BLE001 - a failing step ends this run, keeping its curve
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
        res["stopped"] = f"failed at step {res['steps']}: {msg}"
        log(f"  {impl}: {res['stopped']}")
    res["wall_s"] = time.perf_counter() - t_start
    res["peak"] = torch.cuda.max_memory_allocated() if cuda else None
    t = res["times"][WARMUP:] or res["times"]
    res["step_med"] = statistics.median(t) if t else None
    return res


def steps(torch, a, impl, model, opt, amp, batch, evaluate, windows, rows, res, t_start):
    """The training loop of train_one: evaluations, steps, CSV rows; res updated as it goes."""
    F = torch.nn.functional
    cuda = a.device == "cuda"
    train_s = 0.0
    for step in range(a.steps + 1):
        if step % a.eval_every == 0 or step == a.steps:
            v = evaluate()
            res["val"].append((step, v))
            rows.append(dict(impl=impl, device=a.device, dtype=a.dtype, step=step, loss="",
                             val_loss=f"{v:.5f}", lr="", time_s=f"{train_s:.3f}", step_ms=""))
            log(f"  {impl:5s} step {step:4d}: validation {v:.4f} nats/byte "
                f"({train_s:.1f} s of training)")
        if step == a.steps:
            break
        if a.max_seconds and time.perf_counter() - t_start > a.max_seconds:
            res["stopped"] = f"stopped at step {step}: --max-seconds {a.max_seconds:g} reached"
            log(f"  {impl}: stopped at step {step}: --max-seconds {a.max_seconds:.0f} reached")
            v = evaluate()
            res["val"].append((step, v))
            rows.append(dict(impl=impl, device=a.device, dtype=a.dtype, step=step, loss="",
                             val_loss=f"{v:.5f}", lr="", time_s=f"{train_s:.3f}", step_ms=""))
            break
        lr = lr_at(a, step)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batch(windows[step])
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with amp():
            logits = model(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        train_s += dt
        lv = float(loss)
        if not math.isfinite(lv):
            res["stopped"] = f"stopped at step {step}: loss {lv}"
            log(f"  {impl}: {res['stopped']}")
            break
        res["loss"].append((step, lv))
        res["times"].append(dt)
        res["steps"] = step + 1
        rows.append(dict(impl=impl, device=a.device, dtype=a.dtype, step=step,
                         loss=f"{lv:.5f}", val_loss="", lr=f"{lr:.6g}", time_s=f"{train_s:.3f}",
                         step_ms=f"{dt * 1e3:.3f}"))
        res["train_s"] = train_s
        if step % 50 == 0:
            log(f"  {impl:5s} step {step:4d}: loss {lv:.4f}  {dt * 1e3:.1f} ms")


# ---- the report -----------------------------------------------------------------------------

def cpu_desc():
    name, fam, model = "unknown CPU", "?", "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                k, v = k.strip(), v.strip()
                if k == "model name" and name == "unknown CPU":
                    name = v
                elif k == "cpu family" and fam == "?":
                    fam = v
                elif k == "model" and model == "?":
                    model = v
    except OSError:
        name = platform.processor() or name
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name} (family {fam}, model {model}), {cores} CPUs usable"


def config_line(a, n_bytes):
    """What must be equal for two runs' curves to be comparable."""
    keys = ("layers", "d_model", "heads", "features", "context", "batch", "steps", "lr",
            "warmup", "seed", "eval_every", "eval_windows")
    return " ".join(f"{k}={getattr(a, k)}" for k in keys) + f" data_bytes={n_bytes}"


def reference_config(path):
    """The config line of the report beside a reference CSV (None if there is none)."""
    txt = os.path.splitext(path)[0] + ".txt"
    try:
        with open(txt) as f:
            for line in f:
                if line.startswith("config: "):
                    return line[len("config: "):].strip()
    except OSError:
        pass
    return None


def read_reference(path):
    """{step: loss} and {step: val_loss} of impl ours in a CSV of this script."""
    loss, val = {}, {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["impl"] != "ours":
                continue
            if r["loss"]:
                loss[int(r["step"])] = float(r["loss"])
            if r["val_loss"]:
                val[int(r["step"])] = float(r["val_loss"])
    return loss, val


def num(x, spec, width):
    return ("-" if x is None else format(x, spec)).rjust(width)


def report(torch, a, results, base_nats, n_train, n_val, wall):
    out = []
    w = out.append
    w("train_gpu.py: a byte-level Transformer on the KJV through performer.torch.FastAttention"
      + (" and, for comparison, performer-pytorch's FAVOR+ in pure torch and SDPA"
         if len(results) > 1 else ""))
    w(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    w(f"machine: {cpu_desc()}; {platform.node()}")
    if a.device == "cuda":
        p = torch.cuda.get_device_properties(0)
        w(f"GPU: {torch.cuda.get_device_name(0)}, {p.multi_processor_count} SMs, "
          f"{p.total_memory / 2**30:.1f} GiB")
    else:
        w(f"device: CPU, torch threads {torch.get_num_threads()} (performer.torch's attention "
          "runs on as many)")
    import performer
    w(f"torch {torch.__version__}"
      + (f" (CUDA {torch.version.cuda})" if a.device == "cuda" else "")
      + f", python {platform.python_version()}, performer {performer.version()}")
    commit = None
    try:
        commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short=12", "HEAD"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    w(f"repository commit: {commit or 'unknown'}")
    w("")
    w(f"data: {a.data} ({n_train + n_val:,} bytes): training split {n_train:,} bytes, "
      f"validation split (the last {VAL_FRACTION:.0%}) {n_val:,} bytes")
    w(f"model: {a.layers} layers, d_model {a.d_model}, {a.heads} heads of width "
      f"{a.d_model // a.heads}, m = {a.features} features, context {a.context}, "
      f"{a.n_params:,} parameters")
    w(f"training: {a.steps} steps of {a.batch} windows ({a.batch * a.context} tokens a step), "
      f"AdamW lr {a.lr} (warm-up {a.warmup}, cosine to a tenth), clip 1.0, seed {a.seed}; "
      f"{a.device} {a.dtype}"
      + (" (torch.autocast bfloat16; weights and AdamW float32)" if a.dtype == "bf16" else ""))
    w(f"validation: {a.eval_windows} windows of the validation split every {a.eval_every} "
      f"steps; no-context baseline (training byte frequencies) {base_nats:.4f} nats/byte")
    w(f"config: {config_line(a, n_train + n_val)}")
    if a.device == "cpu":
        w("note: step times on a machine whose cores other work may share vary from run to run;"
          " the losses do not (a run on the CPU repeats bit for bit)")
    elif "sdpa" in a.impls:
        b = torch.backends.cuda
        flags = [n for n, f in (("flash", "flash_sdp_enabled"), ("cudnn", "cudnn_sdp_enabled"),
                                ("mem_efficient", "mem_efficient_sdp_enabled"),
                                ("math", "math_sdp_enabled"))
                 if getattr(b, f, lambda: False)()]
        w(f"sdpa: torch's own choice among the enabled backends ({', '.join(flags)})")
    w("")
    w(f"{'impl':6s} {'steps':>5} {'train loss':>10} {'val loss':>9} {'step ms':>8} "
      f"{'tokens/s':>10} {'t/ours':>7} {'peak MiB':>9} {'train s':>8}")
    ours = next((r for r in results if r["impl"] == "ours"), None)
    for r in results:
        last = [x for _, x in r["loss"][-20:]]
        tl = statistics.mean(last) if last else None
        vl = r["val"][-1][1] if r["val"] else None
        med = r["step_med"]
        tps = a.batch * a.context / med if med else None
        rel = (med / ours["step_med"] if ours and ours["step_med"] and med else None)
        peak = None if r["peak"] is None else r["peak"] / 2**20
        w(f"{r['impl']:6s} {r['steps']:>5} {num(tl, '.4f', 10)} {num(vl, '.4f', 9)} "
          f"{num(med and med * 1e3, '.2f', 8)} {num(tps, ',.0f', 10)} {num(rel, '.2f', 7)} "
          f"{num(peak, '.0f', 9)} {r['train_s']:>8.1f}")
        if r["stopped"] is not None:
            w(f"       {r['stopped']}")
    w("train loss: the mean of the last 20 steps' batch losses; val loss: the last evaluation; "
      f"step ms: median after {WARMUP} steps, synchronised; t/ours: this one's step time / "
      "ours's (> 1: ours is faster); peak: torch's allocator (libperformer_cuda's workspace is "
      "outside it)")
    if a.reference and ours is not None:
        rl, rv = read_reference(a.reference)
        w("")
        w(f"ours against the reference {a.reference}:")
        theirs = reference_config(a.reference)
        mine = config_line(a, n_train + n_val)
        if theirs is None:
            w("  (its report, beside it with .txt, is missing: the same config is assumed)")
        elif theirs == mine:
            w("  the same model, data, windows and seed (its report's config line is this one's)")
        else:
            w(f"  ANOTHER CONFIG: its report says\n    {theirs}\n  this run's is\n    {mine}")
        common = [(s, x, rl[s]) for s, x in ours["loss"] if s in rl]
        if common:
            diffs = [x - y for _, x, y in common]
            w(f"  training loss, {len(common)} common steps: mean difference "
              f"{statistics.mean(diffs):+.4f}, mean |difference| "
              f"{statistics.mean(abs(d) for d in diffs):.4f}, largest |difference| "
              f"{max(abs(d) for d in diffs):.4f} nats/byte")
            for lo in range(0, a.steps, 100):
                seg = [x - y for s, x, y in common if lo <= s < lo + 100]
                if seg:
                    w(f"    steps {lo:3d}-{lo + 99:3d}: mean difference "
                      f"{statistics.mean(seg):+.4f}")
        vc = [(s, x, rv[s]) for s, x in ours["val"] if s in rv]
        for s, x, y in vc:
            w(f"  validation at step {s:4d}: {x:.4f} here, {y:.4f} there ({x - y:+.4f})")
    w("")
    w(f"wall time of the run: {wall:.1f} s")
    return "\n".join(out) + "\n"


# ---- main -----------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default=None,
                    help="fp32 (cpu default) or bf16 autocast (cuda default)")
    ap.add_argument("--impls", help="comma-separated of ours, torch, sdpa (cpu: ours; cuda: "
                    "ours,sdpa,torch)")
    ap.add_argument("--data", default=DEFAULT_DATA, help=f"the text (default {DEFAULT_DATA}; "
                    "made with `bible` if missing)")
    ap.add_argument("--make-data", action="store_true", help="only write --data and exit")
    ap.add_argument("--csv", help="the CSV (default build/train_gpu_DEVICE_DTYPE.csv)")
    ap.add_argument("--report", help="the report (default the CSV's name with .txt)")
    ap.add_argument("--reference", help="a CSV of this script (the CPU fp32 run) to compare "
                    "ours with")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--features", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--eval-windows", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads (default: every CPU this process may run on)")
    ap.add_argument("--max-seconds", type=float, default=0.0,
                    help="stop an implementation's training after this many seconds (0: never)")
    a = ap.parse_args(argv)
    a.dtype = a.dtype or ("fp32" if a.device == "cpu" else "bf16")
    if a.device == "cpu" and a.dtype != "fp32":
        ap.error("on the CPU the reference runs in fp32")
    a.impls = (a.impls or ("ours" if a.device == "cpu" else "ours,sdpa,torch")).split(",")
    for i in a.impls:
        if i not in ("ours", "torch", "sdpa"):
            ap.error(f"unknown impl {i}")
    if a.d_model % a.heads:
        ap.error("d_model must be a multiple of heads")
    if not a.csv:
        a.csv = os.path.join("build", f"train_gpu_{a.device}_{a.dtype}.csv")
    if not a.report:
        a.report = os.path.splitext(a.csv)[0] + ".txt"
    return a


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.make_data:
        export_bible(a.data)
        return 0
    t_run = time.perf_counter()
    import torch
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("train_gpu: torch sees no CUDA device")
    if a.device == "cpu":
        torch.set_num_threads(a.threads or len(os.sched_getaffinity(0)))
    if "sdpa" in a.impls and not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        sys.exit(f"train_gpu: torch {torch.__version__} has no scaled_dot_product_attention")
    train, val = load_data(a.data)
    base = unigram_nats(train, val)
    data = torch.frombuffer(bytearray(train + val), dtype=torch.uint8)
    n_train = len(train)
    g = torch.Generator().manual_seed(a.seed + 1)
    windows = torch.randint(0, n_train - a.context - 1, (a.steps, a.batch), generator=g)
    gv = torch.Generator().manual_seed(a.seed + 2)
    val_x = n_train + torch.randint(0, len(val) - a.context - 1, (a.eval_windows,), generator=gv)
    torch.manual_seed(a.seed)
    model0 = build_model(torch, a)
    a.n_params = sum(p.numel() for p in model0.parameters())
    init = {k: v.clone() for k, v in model0.state_dict().items()}
    del model0
    log(f"train_gpu: {a.device} {a.dtype}, impls {', '.join(a.impls)}; {a.steps} steps of "
        f"{a.batch} x {a.context} bytes; data {a.data} ({len(train) + len(val):,} bytes)")
    results, rows = [], []
    os.makedirs(os.path.dirname(os.path.abspath(a.csv)), exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.report)), exist_ok=True)

    def write():
        tmp = a.csv + ".tmp"
        with open(tmp, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=FIELDS)
            wr.writeheader()
            wr.writerows(rows)
        os.replace(tmp, a.csv)
        if results:
            text = report(torch, a, results, base, len(train), len(val),
                          time.perf_counter() - t_run)
            with open(a.report + ".tmp", "w") as f:
                f.write(text)
            os.replace(a.report + ".tmp", a.report)
            return text
        return ""

    for impl in a.impls:
        log(f"== {impl}")
        try:
            results.append(train_one(torch, a, impl, init, data, windows, val_x, rows))
        except Exception as e:  # noqa: BLE001 - one implementation failing leaves the others
            log(f"  {impl}: failed: {type(e).__name__}: {e}")
            results.append({"impl": impl, "steps": 0, "stopped": f"failed: {e}"[:200],
                            "val": [], "loss": [], "times": [], "train_s": 0.0, "peak": None,
                            "step_med": None})
        write()
    text = write()
    print("\n" + text, flush=True)
    log(f"CSV: {a.csv}\nreport: {a.report}")
    # a run stopped by --max-seconds is a chosen end, not a failure
    return 0 if all(r["steps"] == a.steps or "--max-seconds" in (r["stopped"] or "")
                    for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
