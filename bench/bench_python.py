#!/usr/bin/python3
"""bench_python.py: what the Python package costs, and what performer.torch buys over pure torch.

    /usr/bin/python3 bench/bench_python.py [--build build] [--lengths 1024,4096,16384]
                                           [--repeats N] [--threads N] [--max-gb G] [--quick]

1. The wrapper's fixed cost: a tiny call (H = 1, L = 16, d = 16, m = 16, one thread) through
   performer.attention, performer.torch.attention and the autograd function's forward+backward,
   against the same C functions called through ctypes with every argument made beforehand (the
   C call itself plus ctypes' own few hundred ns). Medians of 7 rounds of 2000 calls, in us.
   Target: under 50 us of overhead a call. An empty torch.autograd.Function is timed too: what
   any Python autograd function costs in torch itself.
2. performer.torch.attention against FAVOR+ written in pure torch the way performer-pytorch
   computes it (its softmax_kernel with the data normaliser d^-1/4, the 1e-4 and the detached
   maxima; linear_attention; and, causal, causal_linear_attention_noncuda, its default path on
   the CPU: cumulative sums over 128 pieces of the sequence, every prefix state materialised),
   forward and forward+backward, bidirectional and causal, B = 1, H = 4, d = 64, m = 256, at
   each length: medians, and ratios pure torch / performer (the speed-up; target >= 10x for
   forward+backward). Both sides run on --threads threads (torch.set_num_threads, which
   performer.torch follows), by default torch's own default (torch.get_num_threads(): 1 with
   Debian's torch on this 2-core machine). One thread a side is also what a shared machine
   measures steadily: at two, each side's OpenMP barriers wait on threads the other jobs
   deschedule, and the same case varied 10x between runs here.
3. Peak memory of the causal forward+backward: each case runs in its own process, which
   reports its peak resident size (ru_maxrss) less its resident size once torch is loaded and
   the inputs made: the computation's own memory. Pure torch's causal backward keeps every
   prefix state, about 3 B H L m dv floats with what is made from them; a case whose estimate
   exceeds --max-gb (default: a third of the available memory, at most 8) is not run, and the
   table says so.
The header names the CPU, the load average, the library's kernel sets (`performer --version`)
and torch's version. All ratios come from one run (the machine is shared and noisy).
"""
import argparse
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
B_, H_, D_, M_ = 1, 4, 64, 256


def cpu_name():
    name, fam, model = "unknown CPU", "", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                k, v = k.strip(), v.strip()
                if k == "model name" and name == "unknown CPU":
                    name = v
                elif k == "cpu family" and not fam:
                    fam = v
                elif k == "model" and not model:
                    model = v
    except OSError:
        pass
    return f"{name} (family {fam}, model {model})" if fam else name


def mem_available_gb():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 8.0


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


# ---- pure torch, the way performer-pytorch computes FAVOR+ ------------------------------------

def pp_softmax_kernel(data, projection_matrix, is_query, eps=1e-4):
    import torch
    b, h = data.shape[:2]
    data_normalizer = data.shape[-1] ** -0.25
    ratio = projection_matrix.shape[0] ** -0.5
    projection = projection_matrix.expand(b, h, *projection_matrix.shape).type_as(data)
    data_dash = torch.einsum("...id,...jd->...ij", data_normalizer * data, projection)
    diag_data = (data ** 2).sum(dim=-1)
    diag_data = ((diag_data / 2.0) * (data_normalizer ** 2)).unsqueeze(dim=-1)
    if is_query:
        stab = torch.amax(data_dash, dim=-1, keepdim=True).detach()
    else:
        stab = torch.amax(data_dash, dim=(-1, -2), keepdim=True).detach()
    return ratio * (torch.exp(data_dash - diag_data - stab) + eps)


def pp_linear_attention(q, k, v):
    import torch
    k_cumsum = k.sum(dim=-2)
    D_inv = 1.0 / torch.einsum("...nd,...d->...n", q, k_cumsum.type_as(q))
    context = torch.einsum("...nd,...ne->...de", k, v)
    return torch.einsum("...de,...nd,...n->...ne", context, q, D_inv)


def pp_causal_linear_attention_noncuda(q, k, v, chunk_size=128, eps=1e-6):
    import torch
    last_k_cumsum, last_context_cumsum, outs = 0, 0, []
    for q, k, v in zip(*map(lambda t: t.chunk(chunk_size, dim=-2), (q, k, v))):
        k_cumsum = last_k_cumsum + k.cumsum(dim=-2)
        D_inv = 1.0 / torch.einsum("...nd,...nd->...n", q, k_cumsum.type_as(q) + eps)
        context = torch.einsum("...nd,...ne->...nde", k, v)
        context_cumsum = last_context_cumsum + context.cumsum(dim=-3)
        outs.append(torch.einsum("...nde,...nd,...n->...ne", context_cumsum, q, D_inv))
        last_k_cumsum = k_cumsum[:, :, -1:]
        last_context_cumsum = context_cumsum[:, :, -1:]
    return torch.cat(outs, dim=-2)


def pp_fast_attention(q, k, v, W, causal):
    qf = pp_softmax_kernel(q, W, True)
    kf = pp_softmax_kernel(k, W, False)
    fn = pp_causal_linear_attention_noncuda if causal else pp_linear_attention
    return fn(qf, kf, v)


def pp_bytes(L, causal, backward):
    """Pure torch's memory, roughly: features and their exponentials (a few B H L m floats);
    causal with grad also keeps every prefix state and the products made from them, about
    3 B H L m dv floats (measured: 3.1 GB at L = 4096)."""
    n = 6 * B_ * H_ * L * M_ * 4
    if causal and backward:
        n += 3 * B_ * H_ * L * M_ * D_ * 4
    elif causal:
        n += 2 * B_ * H_ * (L // 128 + 1) * M_ * D_ * 4
    return n


# ---- one case, in a child process -------------------------------------------------------------

def child(spec):
    """Runs one (impl, L, causal, backward) case and prints a JSON line of medians and memory."""
    import torch
    import performer
    import performer.torch as pt
    impl, L, causal, backward, repeats, threads = (
        spec[k] for k in ("impl", "L", "causal", "backward", "repeats", "threads"))
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B_, H_, L, D_, generator=g) * 0.5 for _ in range(3))
    dout = torch.randn(B_, H_, L, D_, generator=g)
    W = torch.from_numpy(performer.projection(M_, D_, seed=0))
    for t in (q, k, v):
        t.requires_grad_(backward)
    base = rss_mb()

    def run():
        for t in (q, k, v):
            t.grad = None
        if impl == "performer":
            out = pt.attention(q, k, v, W=W, causal=causal)
        else:
            out = pp_fast_attention(q, k, v, W, causal)
        if backward:
            out.backward(dout)
        return out

    times = []
    with torch.set_grad_enabled(backward):
        t0 = time.perf_counter()
        run()  # warm-up
        if time.perf_counter() - t0 > 5:  # a slow case: fewer repeats keep the run short
            repeats = min(repeats, 2)
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e3)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"ms": statistics.median(times), "peak_mb": peak - base}))


def run_case(args, impl, L, causal, backward):
    spec = dict(impl=impl, L=L, causal=causal, backward=backward, threads=args.threads,
                repeats=args.repeats if L < 16384 else max(3, args.repeats // 2))
    if impl == "torch" and pp_bytes(L, causal, backward) > args.max_gb * 2**30:
        return {"skipped": pp_bytes(L, causal, backward) / 2**30}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(HERE, "..", "python")] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    r = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        return {"failed": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else
                f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---- the wrapper's fixed cost -----------------------------------------------------------------

def per_call_us(fn, n=2000, rounds=7):
    fn()
    meds = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        meds.append((time.perf_counter_ns() - t0) / n / 1e3)
    return statistics.median(meds)


def overhead(has_torch):
    import numpy as np
    import performer
    from performer import _lib
    L = _lib.lib
    r = np.random.default_rng(0)
    q, k, v = (r.standard_normal((1, 16, 16), dtype=np.float32) for _ in range(3))
    W = performer.projection(16, 16, seed=0)
    out = np.empty_like(q)
    sh = _lib.pf_shape(1, 1, 16, 16, 16, 16)
    opts = _lib.pf_attn_opts(0.0, 0, None, 1)
    fav = _lib.pf_favor_opts(0, W.ctypes.data, 16, 0, 0.0, 0, 0, 0.0)
    P = ctypes.byref
    ptrs = [a.ctypes.data for a in (out, q, k, v)]
    rows = []
    c_fwd = per_call_us(lambda: L.pf_attn_favor(*ptrs, P(sh), P(opts), P(fav)))
    rows.append(("ctypes call of a trivial function (pf_kernel_width)",
                 per_call_us(lambda: L.pf_kernel_width(0, 16)), None))
    rows.append(("C forward through ctypes, arguments made beforehand", c_fwd, None))
    t = per_call_us(lambda: performer.attention(q, k, v, W=W, threads=1, out=out))
    rows.append(("performer.attention(q, k, v, W=W, out=out)", t, t - c_fwd))
    t = per_call_us(lambda: performer.attention(q, k, v, W=W, threads=1))
    rows.append(("performer.attention(q, k, v, W=W)", t, t - c_fwd))
    if not has_torch:
        return rows
    import torch
    import performer.torch as pt
    tq, tk, tv, tW = (torch.from_numpy(a) for a in (q, k, v, W))
    t = per_call_us(lambda: pt.attention(tq, tk, tv, W=tW, threads=1))
    rows.append(("performer.torch.attention, no grad", t, t - c_fwd))
    dq, dk, dv, dout = (np.empty_like(q) for _ in range(4))
    gp = [a.ctypes.data for a in (dq, dk, dv, dout)]

    def c_both():
        s = ctypes.c_void_p()
        L.pf_favor_saved_create(P(s), P(sh), P(opts), P(fav), 0)
        L.pf_attn_favor_save(*ptrs, P(sh), P(opts), P(fav), s)
        L.pf_attn_favor_backward_saved(*gp, *ptrs[1:], ptrs[0], P(sh), P(opts), P(fav), s)
        L.pf_favor_saved_free(s)

    c_fb = per_call_us(c_both, n=1000)
    rows.append(("C forward+backward through ctypes (saved features)", c_fb, None))
    gq, gk, gv = (x.clone().requires_grad_() for x in (tq, tk, tv))
    tdout = torch.from_numpy(dout)

    def t_both():
        gq.grad = gk.grad = gv.grad = None
        pt.attention(gq, gk, gv, W=tW, threads=1).backward(tdout)

    t = per_call_us(t_both, n=1000)
    rows.append(("performer.torch.attention forward+backward (autograd)", t, t - c_fb))

    class Empty(torch.autograd.Function):  # torch's own cost of a Python autograd function
        @staticmethod
        def forward(ctx, a, b, c):
            out = torch.empty_like(a)
            ctx.save_for_backward(a, b, c, out)
            return out

        @staticmethod
        def backward(ctx, d):
            a, b, c, _ = ctx.saved_tensors
            return torch.empty_like(a), torch.empty_like(b), torch.empty_like(c)

    def t_empty():
        gq.grad = gk.grad = gv.grad = None
        Empty.apply(gq, gk, gv).backward(tdout)

    rows.append(("for scale: an empty torch.autograd.Function, forward+backward",
                 per_call_us(t_empty, n=1000), None))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--lengths", default="1024,4096,16384", help="'' runs part 1 only")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-gb", type=float, default=min(8.0, mem_available_gb() / 3))
    ap.add_argument("--threads", type=int, default=0,
                    help="threads of both sides in part 2 (default: torch's own default)")
    ap.add_argument("--quick", action="store_true", help="lengths 1024,4096; 3 repeats")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        return child(json.loads(args.child))
    if args.quick:
        args.lengths, args.repeats = "1024,4096", 3
    build = os.path.abspath(args.build)
    os.environ.setdefault("PERFORMER_LIB", os.path.join(build, "libperformer.so"))
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
    try:
        import torch
        has_torch = True
    except ImportError:
        has_torch = False
    import performer

    version = subprocess.run([os.path.join(build, "performer"), "--version"],
                             capture_output=True, text=True).stdout.strip()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"bench_python: {cpu_name()}, {os.cpu_count()} cores (load average {load}); "
          f"{version}")
    print(f"  library {performer.library_path}; numpy {__import__('numpy').__version__}; "
          + (f"torch {torch.__version__}" if has_torch else "no torch (python3-torch)"))
    print()
    print("1. fixed cost of a call: H = 1, L = 16, d = 16, m = 16, one thread "
          "(median of 7 x 2000 calls)")
    print(f"  {'call':<58} {'us':>8} {'overhead us':>12}")
    for name, us, over in overhead(has_torch):
        print(f"  {name:<58} {us:8.2f} {'' if over is None else f'{over:12.2f}'}")
    if not has_torch:
        print("\nno torch: parts 2 and 3 (performer.torch against pure torch) not run")
        return
    if args.threads <= 0:
        args.threads = torch.get_num_threads()
    lengths = [int(x) for x in args.lengths.split(",") if x]
    if not lengths:
        return
    print()
    print(f"2. performer.torch.attention vs pure-torch FAVOR+ as performer-pytorch computes it: "
          f"B = {B_}, H = {H_}, d = {D_}, m = {M_}, {args.threads} threads each, medians "
          f"of {args.repeats} (3 at L >= 16384, 2 where a call takes over 5 s)")
    print("   ms; speed-up = pure torch / performer; MB = each process's peak resident size "
          "less its size with the inputs made")
    hdr = (f"  {'L':>6} {'pass':<16} {'performer ms':>12} {'torch ms':>10} {'speed-up':>9}"
           f" {'performer MB':>13} {'torch MB':>9}")
    print(hdr)
    for L in lengths:
        for causal in (False, True):
            for backward in (False, True):
                a = run_case(args, "performer", L, causal, backward)
                b = run_case(args, "torch", L, causal, backward)
                kind = ("causal" if causal else "bidir") + (" fwd+bwd" if backward else " fwd")
                pa = f"{a['ms']:12.2f}" if "ms" in a else f"{'failed':>12}"
                if "ms" in b:
                    pb, ratio = f"{b['ms']:10.2f}", f"{b['ms'] / a['ms']:8.1f}x" if "ms" in a \
                        else ""
                    mb = f"{b['peak_mb']:9.0f}"
                elif "skipped" in b:
                    pb, ratio, mb = f"{'—':>10}", f"{'—':>9}", \
                        f" not run: needs ~{b['skipped']:.0f} GB > --max-gb {args.max_gb:.0f}"
                else:
                    pb, ratio, mb = f"{'failed':>10}", f"{'—':>9}", "  " + b["failed"][:60]
                ma = f"{a['peak_mb']:13.0f}" if "ms" in a else ""
                print(f"  {L:>6} {kind:<16} {pa} {pb} {ratio:>9} {ma} {mb}", flush=True)


if __name__ == "__main__":
    main()
