#!/usr/bin/env python3
"""mqar_gpu.py: multi-query associative recall against state size, on an NVIDIA GPU (or, small,
on the CPU): the sweep that `scripts/mqar_sweep.sh` runs with `performer train --task mqar` on
two cores, at the lengths two cores cannot reach.

    PYTHONPATH=python python3 bench/cuda/mqar_gpu.py --out OUT/mqar_gpu.csv \\
        --curves OUT/mqar_gpu_curves.csv --deadline 540
    /usr/bin/python3 scripts/plot_mqar.py --csv docs/figures/mqar_gpu.csv ...

The data are the tool's: performer.mqar_batch (pf_mqar_batch), step s's batch from (data seed,
s), validation batch i from (data seed, 2^63 + i), as `performer train --task mqar` draws them;
keys 64, a query for every 4 tokens of the window (L / 4 queries, every key asked as often).
The model is `performer train`'s, in torch: byte embedding (tied to the output) + learned
positions -> pre-LayerNorm blocks (attention of one head of width d_model, then an MLP of
4 d_model with tanh-GELU) -> LayerNorm -> 256 logits; GPT-2's initialisation (N(0, 0.02), the
two projections into the residual N(0, 0.02 / sqrt(2 layers)), biases and LayerNorm 0 / 1).
AdamW (betas 0.9 / 0.95, eps 1e-8, no weight decay), linear warm-up over 100 steps then a
constant rate, gradients clipped to norm 1, float32 (TF32 off). Only the answers are scored.

Attention (--attns), q and k scaled by d^-1/4 inside each map as the library does:
  exact    softmax (torch's scaled_dot_product_attention, causal): the ceiling.
  favor    FAVOR+ positive features, m (--ms) orthogonal rows of chi norms, through
           performer.torch.attention: libperformer_cuda on the GPU, the C kernels on the CPU.
  relu     ReLU features relu(Wx)/sqrt(m) + 1e-3, the same path (eps as `performer train`).
  favorpp  FAVOR++ (OPRF) features D/sqrt(m) exp(A|w|^2 + B w.x - |x|^2/2) in torch, with A
           from a running mean of each layer's batch statistic rho (the plain mean of the first
           batches, then momentum 0.99; 0 before the first step; no gradient through A), as
           `performer train --attention favor++` does; not a library kernel on the GPU.
  elu      elu(x) + 1 of q and k themselves (Katharopoulos et al. 2020; no W, the state is
           d x d): in torch.
favorpp and elu evaluate the causal linear attention in its quadratic form
(phi(Q) phi(K)^T masked) / row sums, the same function as the running state's. W is redrawn
every 1000 steps (performer.projection, seed = the W seed, stream = (period << 16) | layer, as
`performer train`). Seeds: --seeds S gives data, initial weights and W the seed S.

A run stops at --steps, or as soon as an evaluation reaches --stop-at (the task is learnt:
nothing more to measure); the table takes each run's best evaluated answer accuracy.

Runs: a coordinator runs --workers runs at a time, each a child process (`--one`), in the order
of the grid (--lengths, then seeds, then --pairs, attentions and m), and stops at --deadline
seconds: a run still going then is killed and written with "complete" 0 and the steps it
reached (the plot and table leave such runs out and count them). --out gets one row per run
(length, pairs, attention, m, seed, steps, best and final answer accuracy, minutes, the step of
the best, ms a training step, complete: scripts/plot_mqar.py reads it), --curves every
evaluation (length, pairs, attention, m, seed, step, loss, accuracy). Both are written to
PATH.partial as the runs finish and renamed to PATH at the end, unless a run failed (exit 1): then
PATH is left as it was and the rows stay in PATH.partial. --out and --curves must be two files.
"""
import argparse
import csv
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

EVAL_STREAM = 2**63
REDRAW = 1000
WARMUP = 100
KEYS = 64
MOMENTUM = 0.99      # FAVOR++'s running statistic, as model.h's FAVORPP_MOMENTUM
RELU_EPS = 1e-3      # as pf_model's favor_eps for the relu kernel
RUN_FIELDS = ["length", "pairs", "attention", "m", "seed", "steps", "best_answer_acc",
              "final_answer_acc", "minutes", "best_step", "ms_per_step", "complete"]
CURVE_FIELDS = ["length", "pairs", "attention", "m", "seed", "step", "val_loss", "val_acc"]
FEATURED = ("favor", "relu", "favorpp")
CHECK_BOUND = 1e-4   # float32 forms against the C kernels (float32, double accumulation)


def log(msg):
    print(msg, flush=True)


# ---- the two maps computed in torch ----------------------------------------------------------

def oprf_log_features(x, W, A):
    """log of FAVOR++'s (OPRF) features of x (..,L,d) for W (m,d) and A, up to a constant:
    A|w|^2 + B w.x' - |x'|^2/2, x' = x d^-1/4, B = sqrt(1 - 4A) (D / sqrt(m) cancels)."""
    xs = x * x.shape[-1] ** -0.25
    u = math.sqrt(1 - 4 * A) * (xs @ W.t()) + A * (W * W).sum(-1)
    return u - 0.5 * (xs * xs).sum(-1, keepdim=True)


def elu_features(torch, x):
    """elu(x') + 1, x' = x d^-1/4: the linear attention of Katharopoulos et al."""
    return torch.nn.functional.elu(x * x.shape[-1] ** -0.25) + 1


def causal_linear(torch, fq, fk, v, log_space):
    """sum_{j<=i} phi_i.phi_j v_j / sum_{j<=i} phi_i.phi_j over the last two axes, with phi =
    exp(fq), exp(fk) (log_space: stabilised by a maximum per query row and one over all keys,
    which cancel) or fq, fk themselves: the causal running state's function, in its quadratic
    form."""
    if log_space:
        fq = (fq - fq.amax(-1, keepdim=True).detach()).exp()
        fk = (fk - fk.amax(dim=(-2, -1), keepdim=True).detach()).exp()
    a = fq @ fk.transpose(-1, -2)
    T = a.shape[-1]
    a = a * torch.ones(T, T, device=a.device, dtype=torch.bool).tril()
    return (a @ v) / a.sum(-1, keepdim=True)


def exact_causal(torch, q, k, v):
    """Softmax attention, causal, scale d^-1/2: torch's fused kernel where it has one."""
    F = torch.nn.functional
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    T = s.shape[-1]
    s = s.masked_fill(~torch.ones(T, T, device=s.device, dtype=torch.bool).tril(), -math.inf)
    return s.softmax(-1) @ v


def check_maps(device):
    """The torch forms of FAVOR++, elu + 1 and exact attention above, and FAVOR+ and ReLU as the
    runs call them on `device`, against the library's C kernels (performer.torch.attention on
    CPU tensors: kernel 'oprf' with the same A, 'elu' with W = I, method 'exact', 'positive',
    'relu'); returns the largest relative error."""
    import torch
    import performer
    import performer.torch as pt
    g = torch.Generator().manual_seed(5)
    worst = 0.0
    for L, d, m, A in ((64, 16, 32, -0.05), (300, 64, 256, -0.2), (1024, 64, 64, 0.0)):
        q, k, v = (torch.randn(2, 1, L, d, generator=g) * 0.7 for _ in range(3))
        W = torch.from_numpy(performer.projection(m, d, seed=3))
        refs = {
            "favorpp": pt.attention(q, k, v, W=W, causal=True, kernel="oprf", oprf_a=A),
            "favor": pt.attention(q, k, v, W=W, causal=True, kernel="positive"),
            "relu": pt.attention(q, k, v, W=W, causal=True, kernel="relu", eps=RELU_EPS),
            "elu": pt.attention(q, k, v, W=torch.eye(d), causal=True, kernel="elu"),
            "exact": pt.attention(q, k, v, causal=True, method="exact"),
        }
        dq, dk, dv, dW = (t.to(device) for t in (q, k, v, W))
        got = {
            "favorpp": causal_linear(torch, oprf_log_features(dq, dW, A),
                                     oprf_log_features(dk, dW, A), dv, True),
            "elu": causal_linear(torch, elu_features(torch, dq), elu_features(torch, dk), dv,
                                 False),
            "exact": exact_causal(torch, dq, dk, dv),
            # the library's own kernels on the device (the C kernels again on the CPU)
            "favor": pt.attention(dq, dk, dv, W=dW, causal=True, kernel="positive"),
            "relu": pt.attention(dq, dk, dv, W=dW, causal=True, kernel="relu", eps=RELU_EPS),
        }
        for name, ref in refs.items():
            r = ref.double()
            err = ((got[name].cpu().double() - r).norm() / r.norm()).item()
            log(f"  check {name:7s} L {L:4d} d {d} m {m} A {A}: relative error {err:.2e}")
            worst = max(worst, err)
    return worst


# ---- the model --------------------------------------------------------------------------------

def build(torch, args, L, attn, m, seed, dev):
    nn, F = torch.nn, torch.nn.functional
    import performer
    import performer.torch as pt
    C, nl = args.d_model, args.layers
    d = C  # one head

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def attend(self, x, W, A):
            q, k, v = self.qkv(x).split(C, dim=-1)
            if attn == "exact":
                return exact_causal(torch, q[:, None], k[:, None], v[:, None])[:, 0]
            if attn in ("favor", "relu"):
                kern = "positive" if attn == "favor" else "relu"
                return pt.attention(q[:, None].contiguous(), k[:, None].contiguous(),
                                    v[:, None].contiguous(), W=W, causal=True, kernel=kern,
                                    eps=RELU_EPS if attn == "relu" else 0.0)[:, 0]
            if attn == "elu":
                return causal_linear(torch, elu_features(torch, q), elu_features(torch, k), v,
                                     False)
            return causal_linear(torch, oprf_log_features(q, W, A), oprf_log_features(k, W, A),
                                 v, True)

        def forward(self, x, W, A):
            x = x + self.proj(self.attend(self.ln1(x), W, A))
            return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(256, C), nn.Embedding(L, C)
            self.blocks = nn.ModuleList(Block() for _ in range(nl))
            self.lnf = nn.LayerNorm(C)
            self.rho = [0.0] * nl  # FAVOR++'s running statistic, per layer
            self.rho_count = 0
            self.W = None
            self.w_period = -1

        def draw_w(self, step):
            period = step // REDRAW
            if attn not in FEATURED or period == self.w_period:
                return
            self.W = [torch.from_numpy(performer.projection(m, d, seed=seed,
                                                            stream=(period << 16) | layer)).to(dev)
                      for layer in range(nl)]
            self.w_period = period

        def forward(self, tok, training):
            T = tok.shape[1]
            x = self.wte(tok) + self.wpe(torch.arange(T, device=tok.device))
            for layer, blk in enumerate(self.blocks):
                rho = self.rho[layer]
                A = 0.0
                if attn == "favorpp" and self.rho_count > 0:
                    A = (1 - 2 * rho - math.sqrt((2 * rho + 1) ** 2 + 8 * rho)) / 16
                if training and attn == "favorpp":
                    # this batch joins the statistic after its own forward used the old A
                    with torch.no_grad():
                        q, k, _ = blk.qkv(blk.ln1(x)).split(C, dim=-1)
                        x_ = ((q * q).sum(-1).mean(-1) + (k * k).sum(-1).mean(-1)
                              + 2 * (q.mean(1) * k.mean(1)).sum(-1)).mean().item()
                        x_ *= d ** -0.5 / d
                    w = max(1.0 / (self.rho_count + 1), 1 - MOMENTUM)
                    self.rho[layer] = rho + (x_ - rho) * w
                x = blk(x, self.W[layer] if self.W is not None else None, A)
            if training and attn == "favorpp":
                self.rho_count += 1
            return self.lnf(x) @ self.wte.weight.t()

    torch.manual_seed(seed)
    model = Model()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("lnf"):
                p.fill_(1.0)
            elif name.endswith("proj.weight"):  # proj and fcproj
                p.normal_(0.0, 0.02 / math.sqrt(2 * nl))
            else:
                p.normal_(0.0, 0.02)
    return model.to(dev)


# ---- one run ----------------------------------------------------------------------------------

def one_run(args):
    import numpy as np
    import torch
    import performer
    L, N, attn, m, seed = args.one
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(args.threads)
    B = max(1, args.tokens // L)
    Q = L // 4
    model = build(torch, args, L, attn, m, seed, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.0)
    val = [performer.mqar_batch(B, L, pairs=N, queries=Q, keys=KEYS, seed=seed,
                                stream=EVAL_STREAM + i) for i in range(args.eval_batches)]
    val = [(torch.from_numpy(t).long().to(dev), torch.from_numpy(g).long().to(dev))
           for t, g in val]

    def evaluate():
        model.eval()
        tot, right, n = 0.0, 0, 0
        with torch.no_grad():
            for t, g in val:
                logits = model(t, False)
                mask = g >= 0
                tot += torch.nn.functional.cross_entropy(logits[mask], g[mask],
                                                         reduction="sum").item()
                right += (logits[mask].argmax(-1) == g[mask]).sum().item()
                n += int(mask.sum().item())
        model.train()
        return tot / n, right / n

    tag = f"L{L} p{N} {attn} m{m} s{seed}"
    best, best_step, last, step = -1.0, 0, 0.0, 0
    t_train = 0.0
    for step in range(args.steps + 1):
        model.draw_w(step)
        if step % args.eval_every == 0 or step == args.steps:
            vl, acc = evaluate()
            print(f"EVAL {step} {vl:.6f} {acc:.6f}", flush=True)
            last = acc
            if acc > best:
                best, best_step = acc, step
            if acc >= args.stop_at or step == args.steps:
                break
        t0 = time.perf_counter()
        tok, tgt = performer.mqar_batch(B, L, pairs=N, queries=Q, keys=KEYS, seed=seed,
                                        stream=step)
        tok = torch.from_numpy(tok).long().to(dev)
        tgt = torch.from_numpy(tgt).long().to(dev)
        for g in opt.param_groups:
            g["lr"] = args.lr * min(1.0, (step + 1) / WARMUP)
        logits = model(tok, True)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), tgt.reshape(-1),
                                                 ignore_index=-1)
        if not torch.isfinite(loss):
            print(f"FAIL {tag}: the loss is {loss.item()} at step {step}", flush=True)
            return 1
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t_train += time.perf_counter() - t0
    ms = 1000 * t_train / max(step, 1)
    print(f"DONE {best:.6f} {last:.6f} {step} {best_step} {ms:.3f}", flush=True)
    return 0


# ---- the coordinator --------------------------------------------------------------------------

def grid(args):
    runs = []
    if args.add:  # the listed settings, by length, then seed, in the order given
        adds = []
        for L, N, a, ms in args.add:
            adds.append((int(L), int(N), a, [int(m) for m in ms.split(",")]))
        for L in sorted({x[0] for x in adds}):
            for s in args.seeds:
                for L_, N, a, ms in adds:
                    if L_ == L:
                        runs += [(L, N, a, m if a in FEATURED else 0, s) for m in ms]
        return runs
    for L in args.lengths:
        for s in args.seeds:
            for N in args.pairs:
                if 2 * N + 2 * (L // 4) > L:
                    continue
                for a in args.attns:
                    for m in (args.ms if a in FEATURED else [0]):
                        runs.append((L, N, a, m, s))
    return runs


def coordinate(args):
    runs = grid(args)
    log(f"mqar_gpu: {len(runs)} runs, {args.workers} at a time, device {args.device}, "
        f"deadline {args.deadline} s")
    t_start = time.time()
    todo, going, rows, failed = list(runs), {}, [], []
    # written as the runs finish to PATH.partial, renamed to PATH at the end: a sweep stopped
    # part-way leaves its finished rows and replaces no earlier file
    for path in (args.out, args.curves):
        if path and os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
    curves = open(args.curves + ".partial", "w", newline="") if args.curves else None
    cw = csv.writer(curves, lineterminator="\n") if curves else None
    if cw:
        cw.writerow(CURVE_FIELDS)
    out = open(args.out + ".partial", "w", newline="")
    ow = csv.writer(out, lineterminator="\n")
    ow.writerow(RUN_FIELDS)
    logdir = args.logs or tempfile.mkdtemp(prefix="mqar_gpu.")
    os.makedirs(logdir, exist_ok=True)

    def log_of(run):
        return os.path.join(logdir, "L{}-p{}-{}-m{}-s{}.log".format(*run))

    def finish(run, p, t0, killed):
        L, N, a, m, s = run
        with open(log_of(run)) as f:
            text = f.read()
        evals = [ln.split()[1:] for ln in text.splitlines() if ln.startswith("EVAL ")]
        done = [ln.split()[1:] for ln in text.splitlines() if ln.startswith("DONE ")]
        for st, vl, acc in evals:
            if cw:
                cw.writerow([L, N, a, m, s, st, vl, acc])
        minutes = (time.time() - t0) / 60
        if done:  # printed at the very end of a run that went well
            best, last, steps, bstep, ms = done[0]
            row = [L, N, a, m, s, steps, best, last, f"{minutes:.2f}", bstep, ms, 1]
        else:
            accs = [float(e[2]) for e in evals]
            best = max(accs) if accs else float("nan")
            bstep = evals[accs.index(best)][0] if accs else 0
            row = [L, N, a, m, s, evals[-1][0] if evals else 0, f"{best:.6f}",
                   evals[-1][2] if evals else "nan", f"{minutes:.2f}", bstep, "", 0]
            why = "killed at the deadline" if killed else f"exit {p.returncode}"
            if not killed:
                failed.append(run)
            log(f"  {'stop' if killed else 'FAIL'} L{L} p{N} {a} m{m} s{s}: {why}; "
                + "; ".join(text.strip().splitlines()[-3:]))
        ow.writerow(row)
        out.flush()
        if curves:
            curves.flush()
        rows.append(row)
        log(f"  {time.time() - t_start:6.0f} s  L{L} p{N} {a:7s} m{m:<4d} s{s}  best "
            f"{float(row[6]):.4f} at {row[9]}, {row[5]} steps, {minutes:.1f} min"
            + ("" if row[11] else " (incomplete)"))

    while todo or going:
        now = time.time()
        while todo and len(going) < args.workers and now - t_start < args.deadline:
            run = todo.pop(0)
            cmd = [sys.executable, os.path.abspath(__file__), "--one", *map(str, run)]
            for k in ("device", "steps", "tokens", "lr", "eval_every", "eval_batches", "stop_at",
                      "d_model", "layers", "threads"):
                cmd += ["--" + k.replace("_", "-"), str(getattr(args, k))]
            with open(log_of(run), "w") as f:  # each run's output, as it goes
                p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
            going[run] = (p, time.time())
        for run, (p, t0) in list(going.items()):
            if p.poll() is not None:
                finish(run, p, t0, False)
                del going[run]
        if time.time() - t_start >= args.deadline:
            for run, (p, t0) in list(going.items()):
                p.kill()
                p.wait()
                finish(run, p, t0, True)
                del going[run]
            break
        time.sleep(0.5)
    out.close()
    if curves:
        curves.close()
    # a sweep with a failed run replaces no earlier file: its rows stay in PATH.partial
    for path in (args.out, args.curves):
        if path and not failed:
            os.replace(path + ".partial", path)
        elif path:
            log(f"mqar_gpu: a run failed: its rows are in {path}.partial ({path} left as it was)")
    left = len(todo)
    complete = sum(1 for r in rows if r[11])
    log(f"mqar_gpu: {complete} runs complete, {len(rows) - complete - len(failed)} stopped at "
        f"the deadline, {left} not "
        f"started, {len(failed)} failed, {time.time() - t_start:.0f} s")
    return 1 if failed else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="the runs' CSV (one row per run)")
    ap.add_argument("--curves", help="every evaluation's CSV")
    ap.add_argument("--logs", help="a folder for each run's output (default: a new temporary one)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--pairs", type=int, nargs="+", default=[16])
    ap.add_argument("--attns", nargs="+", default=["exact", "favor", "relu", "favorpp", "elu"],
                    choices=["exact", "favor", "relu", "favorpp", "elu"])
    ap.add_argument("--ms", type=int, nargs="+", default=[16, 64, 256, 1024])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=8000)
    ap.add_argument("--tokens", type=int, default=16384, help="tokens a step (batch = / L)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-batches", type=int, default=4)
    ap.add_argument("--stop-at", type=float, default=0.99)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch's CPU threads a run")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds")
    ap.add_argument("--add", nargs=4, action="append", metavar=("L", "PAIRS", "ATTN", "MS"),
                    help="a setting to run instead of the grid of --lengths, --pairs, --attns "
                    "and --ms (repeatable): MS a comma-separated list (0 for exact, elu)")
    ap.add_argument("--check", action="store_true",
                    help="only compare the torch maps with the library's kernels, then exit")
    ap.add_argument("--one", nargs=5, metavar=("L", "PAIRS", "ATTN", "M", "SEED"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        a = args.one
        args.one = (int(a[0]), int(a[1]), a[2], int(a[3]), int(a[4]))
        return one_run(args)
    if args.check:
        worst = check_maps(args.device)
        log(f"mqar_gpu: the torch maps against the library's: largest relative error {worst:.2e}"
            f" (bound {CHECK_BOUND:g})")
        return 0 if worst <= CHECK_BOUND else 1
    if not args.out:
        ap.error("--out is required")
    for path in (args.out, args.curves):
        if path and os.path.isdir(path):
            ap.error(f"{path} is a folder: --out and --curves name CSV files")
    if args.curves and os.path.realpath(args.curves) == os.path.realpath(args.out):
        ap.error("--out and --curves name the same file")
    for x in args.lengths + args.pairs + args.ms + [args.steps, args.tokens, args.workers]:
        if x < 1:
            ap.error("lengths, pairs, m, steps, tokens and workers must be positive")
    for L, N, a, ms in args.add or []:
        try:
            ok = int(L) >= 1 and int(N) >= 1 and all(int(m) >= (a in FEATURED)
                                                    for m in ms.split(","))
        except ValueError:
            ok = False
        if not ok or a not in ("exact", "favor", "relu", "favorpp", "elu"):
            ap.error(f"--add {L} {N} {a} {ms}: a length, pairs, an attention and m values")
    return coordinate(args)


if __name__ == "__main__":
    sys.exit(main())
