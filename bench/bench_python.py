#!/usr/bin/python3
"""bench_python.py: what the Python package costs, and what performer.torch buys over pure torch.

    /usr/bin/python3 bench/bench_python.py [--build build] [--lengths 1024,4096,16384]
                                           [--repeats N] [--threads N] [--torch-blas-threads N]
                                           [--max-gb G] [--quick] [--cpu-time]
                                           [--extra-coretype NAME] [--extra-lengths L,..]
                                           [--parts 1,2,3]

1. The wrapper's fixed cost: a tiny call (H = 1, L = 16, d = 16, m = 16, one thread) through
   performer.attention, performer.torch.attention and the autograd function's forward+backward,
   against the same C functions called through ctypes with every argument made beforehand (the
   C call itself plus ctypes' own few hundred ns; forward+backward keeps its features in one
   pf_favor_saved made once, as a C training loop does). Medians of 21 rounds of 300 calls,
   in us, every function taking turns round by round. Forward+backward through autograd is
   split into what torch charges any Python torch.autograd.Function doing the same around its
   work (an empty one that allocates the output and three gradients and saves five tensors),
   the C calls, and the rest: performer.torch's own cost. Target: under 50 us of overhead a
   call.
2. FAVOR+ three ways, forward and forward+backward, bidirectional and causal, B = 1, H = 4,
   d = 64, m = 256, at each length: the C library called directly through ctypes with its
   arguments made beforehand (forward: pf_attn_favor; forward+backward: pf_attn_favor_save +
   pf_attn_favor_backward_saved on a pf_favor_saved made once), performer.torch.attention, and
   FAVOR+ written in pure torch the way performer-pytorch computes it (its softmax_kernel with
   the data normaliser d^-1/4, the 1e-4 and the detached maxima; linear_attention; and, causal,
   causal_linear_attention_noncuda, its default path on the CPU: cumulative sums over 128
   pieces of the sequence, every prefix state materialised). Medians, and three ratios: pure
   torch / C (the speed-up the library itself shows), pure torch / performer.torch (what the
   package delivers; target >= 10x forward+backward) and performer.torch / C (the wrapper's
   share). Each case runs in a fresh process that times the three interleaved, call by call (C,
   performer.torch, pure torch, C, ...; each call after a pause of PAUSE s, so that no thread
   of the call before, OpenBLAS's spinning workers say, runs into it): the machine is shared,
   and a change of load then moves the three alike.
   Threads: every side uses --threads threads, by default every core this process may run on
   (os.sched_getaffinity): the C calls get it as their pf_attn_opts.threads; performer.torch is
   called as a user calls it (threads=None: torch.get_num_threads()) and pure torch runs on
   torch's threads, both set by torch.set_num_threads. Pure torch's matrix products run in the
   OpenBLAS that Debian's torch loads (libblas.so.3 over libopenblas.so.0, whichever build the
   alternatives system chose). The pthread build has threads of its own: on one by default
   (--torch-blas-threads N; 0: --threads), since with both pools on every core torch's OpenMP
   threads and OpenBLAS's spinning pthreads take the 2 cores from each other (one pure-torch
   case, L = 1024, bidirectional forward, took 27 to 134 ms in six runs against 27 to 39 ms
   with OpenBLAS on one thread, which was also the faster on average; L = 4096
   forward+backward: 170 against 218-238 ms). The OpenMP build has none: a product runs on the
   calling thread's OpenMP count, torch's, and it is left alone, since there
   openblas_set_num_threads(n) is omp_set_num_threads(n), torch's count too (pinning it to one
   thread once left performer.torch and pure torch on one thread under a header promising
   every core, and performer.torch 1.3-2.4x the C call it wraps). Each row prints the threads
   each side ran, read in the run (thr: C/pt/torch/OpenBLAS); a row where any differs from the
   header is marked ! and the run exits 1. torch's own default would be 1 thread on a 2-core
   VM: torch 1.13 takes OMP_NUM_THREADS, else MKL_NUM_THREADS, else half of
   std::thread::hardware_concurrency() (it assumes two hardware threads a core, which a VM
   without SMT does not have).
3. Peak memory of every forward+backward (the causal one is where pure torch's grows): one call
   in a process of its own, which reports its peak resident size (ru_maxrss) less its resident
   size once torch is loaded and the inputs made: the computation's own memory, kept features
   included. Pure torch's causal backward keeps every prefix state, about 3 B H L m dv floats
   with what is made from them; a case whose estimate exceeds --max-gb (default: a third of the
   available memory, at most 8) is not run, and the table says so.
--cpu-time times with the process's CPU time (user + system, every thread) instead of the wall
clock: with --threads 1 that is the work itself, however busy the machine is, which a 2-thread
run on a shared 2-core machine cannot promise (a thread of a parallel region descheduled by
another job makes the whole region wait; pure torch, with a region per operation, suffers most).
--extra-coretype NAME (e.g. Prescott) times pure torch again with OPENBLAS_CORETYPE=NAME, at
--extra-lengths: the generic SSE3 kernels OpenBLAS 0.3.21 falls back to on CPUs its table does
not know (an Intel family 6 model 207 got them), as an extra table against the same run's C
and performer.torch columns.
--parts picks parts (default 1,2,3; 3 adds part 2's memory columns).
The header names the CPU, the load average, the library's kernel sets (`performer --version`),
OpenBLAS's kernel set and build under torch and torch's version. All ratios come from one run.
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
PAUSE = 0.2  # s before each timed call of part 2


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


def cores():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


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


def openblas():
    """The OpenBLAS this process has loaded (numpy and torch load Debian's libopenblas.so.0,
    the pthread or the OpenMP build, whichever the alternatives system chose), or None."""
    try:
        ob = ctypes.CDLL("libopenblas.so.0")
        ob.openblas_get_corename.restype = ctypes.c_char_p
        ob.openblas_get_num_threads.restype = ctypes.c_int
        ob.openblas_get_parallel.restype = ctypes.c_int
        return ob
    except (OSError, AttributeError):
        return None


def blas_build(ob):
    """"pthread", "openmp" or "serial": how the loaded OpenBLAS runs its threads. In the OpenMP
    build openblas_set_num_threads(n) is omp_set_num_threads(n), which sets the calling
    thread's OpenMP thread count, torch's own (torch.get_num_threads() reads it back), and a
    product called outside a parallel region runs on the caller's OpenMP thread count."""
    return {1: "pthread", 2: "openmp"}.get(ob.openblas_get_parallel(), "serial") if ob else None


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

def c_direct(q, k, v, dout, W, causal, backward, threads):
    """The C library through ctypes, every argument made beforehand: a function running one
    forward (pf_attn_favor) or forward+backward (pf_attn_favor_save and
    pf_attn_favor_backward_saved on storage made once, within performer.torch's default budget),
    and what to free afterwards."""
    import torch
    import performer.torch as pt
    from performer import _lib
    L, P = _lib.lib, ctypes.byref
    Lx = q.shape[-2]
    sh = _lib.pf_shape(B_, H_, Lx, Lx, D_, D_)
    opts = _lib.pf_attn_opts(0.0, 1 if causal else 0, None, threads)  # its threads: opts.threads
    fav = _lib.pf_favor_opts(0, W.data_ptr(), M_, 0, 0.0, 0, 0, 0.0)
    out = torch.empty_like(q)
    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
    a = (P(sh), P(opts), P(fav))
    fwd = (out.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr()) + a
    keep = (out, dq, dk, dv)  # the pointers above are into these: held by run()
    if not backward:
        def run():
            _lib.check(L.pf_attn_favor(*fwd), "pf_attn_favor")
            return keep
        run.threads = opts.threads
        return run, None
    saved = ctypes.c_void_p()
    _lib.check(L.pf_favor_saved_create(P(saved), *a, pt.SAVE_BYTES), "pf_favor_saved_create")
    bwd = (dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), dout.data_ptr(), q.data_ptr(),
           k.data_ptr(), v.data_ptr(), out.data_ptr()) + a + (saved,)

    def run():
        _lib.check(L.pf_attn_favor_save(*fwd, saved), "pf_attn_favor_save")
        _lib.check(L.pf_attn_favor_backward_saved(*bwd), "pf_attn_favor_backward_saved")
        return keep
    run.threads = opts.threads
    return run, lambda: L.pf_favor_saved_free(saved)


def child(spec):
    """One case (L, causal, backward) in a fresh process. mode "time": every impl in spec's
    list, interleaved round by round (C, performer.torch, pure torch, C, ...), each call after
    a pause of PAUSE s (so that no thread of the call before, such as OpenBLAS's spinning
    workers, runs into it); prints a JSON line of each impl's median ms, the threads each ran
    (see below), OpenBLAS's build and kernel set. mode "memory": one call of the one impl
    listed; prints its peak resident size less the size with the inputs made.

    Threads, as the header of part 2 says: spec's threads on every side. C gets them as its
    pf_attn_opts.threads; performer.torch is called as a user calls it (threads=None), so it
    follows torch.get_num_threads(), and so does pure torch: torch.set_num_threads(threads),
    set again after everything else here is set up, and read back at each call. Pure torch's
    products run in OpenBLAS: the pthread build has threads of its own, pinned to
    spec's blas_threads (after the library's first call, which pins it to one); the OpenMP
    build has none (a product outside a parallel region runs on the calling thread's OpenMP
    count, torch's) and is left alone, since its openblas_set_num_threads would be
    omp_set_num_threads, which sets torch's count too (it once left pure torch and
    performer.torch on one thread under a header promising every core). Reported per impl: the
    thread counts its calls ran with (C: pf_attn_opts.threads; performer.torch: the
    pf_attn_opts.threads of the plans its calls made; pure torch: torch.get_num_threads() at
    each call) and, for pure torch, OpenBLAS's."""
    import torch
    import performer
    import performer.torch as pt
    L, causal, backward, repeats, threads = (
        spec[k] for k in ("L", "causal", "backward", "repeats", "threads"))
    clock = time.process_time if spec["cpu_time"] else time.perf_counter
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B_, H_, L, D_, generator=g) * 0.5 for _ in range(3))
    dout = torch.randn(B_, H_, L, D_, generator=g)
    W = torch.from_numpy(performer.projection(M_, D_, seed=0))
    ob = openblas()
    build = blas_build(ob)
    runs, done, seen, blas_seen = {}, [], {}, set()
    for impl in spec["impls"]:
        seen[impl] = set()
        if impl == "c":
            runs[impl], free = c_direct(q, k, v, dout, W, causal, backward, threads)
            done.append(free)
            continue
        xs = [t.detach().clone().requires_grad_(backward) for t in (q, k, v)]

        def run(impl=impl, xs=xs):
            for t in xs:
                t.grad = None
            if impl == "performer":
                out = pt.attention(*xs, W=W, causal=causal)  # threads=None, as a user calls it
            else:
                seen[impl].add(torch.get_num_threads())
                blas_seen.add(ob.openblas_get_num_threads() if build == "pthread" else
                              torch.get_num_threads() if build == "openmp" else 1)
                out = pp_fast_attention(*xs, W, causal)
            if backward:
                out.backward(dout)
        runs[impl] = run
    if spec["mode"] == "time" and ("c" in runs or "performer" in runs):
        runs.get("c", runs.get("performer"))()  # the library's first call pins a pthread
    if build == "pthread":  # OpenBLAS to one thread; pure torch's products get what is asked
        ob.openblas_set_num_threads(spec["blas_threads"])
    torch.set_num_threads(threads)
    base = rss_mb()
    times = {impl: [] for impl in runs}
    with torch.set_grad_enabled(backward):
        if spec["mode"] == "memory":
            next(iter(runs.values()))()
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(json.dumps({"peak_mb": peak - base}))
            return
        rounds = {}
        for impl, run in runs.items():  # warm-up; a slow impl (over 5 s) gets 2 rounds
            time.sleep(PAUSE)
            t0 = time.perf_counter()
            run()
            rounds[impl] = repeats if time.perf_counter() - t0 <= 5 else min(repeats, 2)
        for r in range(repeats):
            for impl, run in runs.items():
                if r >= rounds[impl]:
                    continue
                time.sleep(PAUSE)
                t0 = clock()
                run()
                times[impl].append((clock() - t0) * 1e3)
    for free in done:
        if free:
            free()
    if "c" in runs:
        seen["c"].add(runs["c"].threads)
    if "performer" in runs:
        seen["performer"].update(p.opts.threads for p in pt._PLANS.values())
    print(json.dumps({
        "ms": {impl: statistics.median(t) for impl, t in times.items()},
        "threads": {impl: sorted(t) for impl, t in seen.items()},
        "blas_threads": sorted(blas_seen),
        "blas_build": build,
        "blas_core": ob.openblas_get_corename().decode() if ob else None}))


def run_child(spec, env_extra=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(HERE, "..", "python")] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    env.update(env_extra or {})
    r = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        return {"failed": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else
                f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_case(args, L, causal, backward, impls=("c", "performer", "torch"), env_extra=None):
    """{impl: {"ms": .., "peak_mb": .., "threads": [..]} or {"skipped": GB} or {"failed": why}},
    plus "blas": (pure torch's OpenBLAS threads [..], OpenBLAS's build, its kernels). Memory is
    measured for forward+backward only (part 3), in a process per impl."""
    spec = dict(L=L, causal=causal, backward=backward, threads=args.threads, mode="time",
                blas_threads=args.torch_blas_threads, cpu_time=args.cpu_time,
                repeats=args.repeats if L < 16384 else max(3, args.repeats // 2))
    out = {}
    if "torch" in impls and pp_bytes(L, causal, backward) > args.max_gb * 2**30:
        out["torch"] = {"skipped": pp_bytes(L, causal, backward) / 2**30}
        impls = tuple(i for i in impls if i != "torch")
    r = run_child(dict(spec, impls=list(impls)), env_extra)
    for impl in impls:
        out[impl] = ({"ms": r["ms"][impl], "threads": r["threads"][impl]} if "ms" in r
                     else dict(r))
    out["blas"] = (r.get("blas_threads"), r.get("blas_build"), r.get("blas_core"))
    if backward and "ms" in r and "3" in args.parts:
        for impl in impls:
            if impl != "c":
                m = run_child(dict(spec, impls=[impl], mode="memory"), env_extra)
                out[impl]["peak_mb"] = m.get("peak_mb")
    return out


# ---- the wrapper's fixed cost -----------------------------------------------------------------

CLOCK_NS = time.perf_counter_ns  # part 1's clock (--cpu-time: time.process_time_ns)


def per_call_us(fn, n=2000, rounds=7):
    fn()
    meds = []
    for _ in range(rounds):
        t0 = CLOCK_NS()
        for _ in range(n):
            fn()
        meds.append((CLOCK_NS() - t0) / n / 1e3)
    return statistics.median(meds)


def interleaved(fns, rounds=21, n=300):
    """Median us per call of each function, timed in short rounds taking turns: a change of
    load (which moves even CPU time here: whole seconds in which every call takes twice as
    long) then moves them all alike."""
    times = [[] for _ in fns]
    for _ in range(rounds):
        for t, fn in zip(times, fns):
            t.append(per_call_us(fn, n=n, rounds=1))
    return [statistics.median(t) for t in times]


def overhead(has_torch):
    """Rows (what, us, overhead us or None) of part 1."""
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
    a = (P(sh), P(opts), P(fav))
    ptrs = [x.ctypes.data for x in (out, q, k, v)]

    def c_fwd():
        st = L.pf_attn_favor(*ptrs, *a)
        if st:
            raise _lib.error(st, "pf_attn_favor")

    fns = [lambda: L.pf_kernel_width(0, 16), c_fwd,
           lambda: performer.attention(q, k, v, W=W, threads=1, out=out),
           lambda: performer.attention(q, k, v, W=W, threads=1)]
    if not has_torch:
        triv, c_fwd, t_out, t_np = interleaved(fns)
        return [("ctypes call of a trivial function (pf_kernel_width)", triv, None),
                ("C forward through ctypes, arguments made beforehand", c_fwd, None),
                ("performer.attention(q, k, v, W=W, out=out)", t_out, t_out - c_fwd),
                ("performer.attention(q, k, v, W=W)", t_np, t_np - c_fwd)]
    import torch
    import performer.torch as pt
    tq, tk, tv, tW = (torch.from_numpy(x) for x in (q, k, v, W))
    dq, dk, dv = (np.empty_like(q) for _ in range(3))
    dout = r.standard_normal(q.shape, dtype=np.float32)
    gp = [x.ctypes.data for x in (dq, dk, dv, dout)]
    s = ctypes.c_void_p()
    L.pf_favor_saved_create(P(s), *a, 0)

    def c_both():
        if L.pf_attn_favor_save(*ptrs, *a, s) or \
                L.pf_attn_favor_backward_saved(*gp, *ptrs[1:], ptrs[0], *a, s):
            raise RuntimeError("C forward+backward failed")

    def c_both_alloc():
        s2 = ctypes.c_void_p()
        st = L.pf_favor_saved_create(P(s2), *a, 0) or L.pf_attn_favor_save(*ptrs, *a, s2) or \
            L.pf_attn_favor_backward_saved(*gp, *ptrs[1:], ptrs[0], *a, s2)
        L.pf_favor_saved_free(s2)
        if st:
            raise RuntimeError("C forward+backward failed")

    gq, gk, gv = (x.clone().requires_grad_() for x in (tq, tk, tv))
    tdout = torch.from_numpy(dout)

    def t_both():
        gq.grad = gk.grad = gv.grad = None
        pt.attention(gq, gk, gv, W=tW, threads=1).backward(tdout)

    class Empty(torch.autograd.Function):  # torch's own cost of a Python autograd function
        @staticmethod
        def forward(ctx, a, b, c, w):
            out = a.new_empty(a.shape)
            ctx.save_for_backward(a, b, c, out, w)
            return out

        @staticmethod
        def backward(ctx, d):
            a, b, c, _, _ = ctx.saved_tensors
            return torch.empty_like(a), torch.empty_like(b), torch.empty_like(c), None

    def t_empty():
        gq.grad = gk.grad = gv.grad = None
        Empty.apply(gq, gk, gv, tW).backward(tdout)

    fns += [lambda: pt.attention(tq, tk, tv, W=tW, threads=1), c_both, c_both_alloc, t_both,
            t_empty]
    triv, c_fwd, t_out, t_np, t_ng, c_fb, c_fba, tb, te = interleaved(fns)
    L.pf_favor_saved_free(s)
    return [("ctypes call of a trivial function (pf_kernel_width)", triv, None),
            ("C forward through ctypes, arguments made beforehand", c_fwd, None),
            ("performer.attention(q, k, v, W=W, out=out)", t_out, t_out - c_fwd),
            ("performer.attention(q, k, v, W=W)", t_np, t_np - c_fwd),
            ("performer.torch.attention, no grad", t_ng, t_ng - c_fwd),
            ("C forward+backward through ctypes, kept features' storage made once", c_fb, None),
            ("  the same making and freeing the storage at each call", c_fba, c_fba - c_fb),
            ("performer.torch.attention forward+backward (autograd)", tb, tb - c_fb),
            ("  of it: any autograd.Function doing the same (empty)", te, None),
            ("  of it: the C calls (as above)", c_fb, None),
            ("  of it: performer.torch's own cost", tb - te - c_fb, None)]


def fmt_ms(r):
    return f"{r['ms']:.2f}" if "ms" in r else ("—" if "skipped" in r else "failed")


def ratio(a, b):
    return f"{a['ms'] / b['ms']:.1f}x" if "ms" in a and "ms" in b else "—"


def fmt_threads(r, want):
    """The thread counts a side ran ("2", or "1,2" if they changed), and whether they are all
    `want`; "-" (and True) for a side that did not run."""
    got = r.get("threads") if isinstance(r, dict) else r
    if not got:
        return "-", True
    return ",".join(str(t) for t in got), list(got) == [want]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--lengths", default="1024,4096,16384", help="'' runs part 1 only")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-gb", type=float, default=min(8.0, mem_available_gb() / 3))
    ap.add_argument("--threads", type=int, default=0,
                    help="threads of every side in part 2 (default 0: every core this process "
                    "may run on)")
    ap.add_argument("--torch-blas-threads", type=int, default=1,
                    help="threads of the pthread OpenBLAS for pure torch's products (default 1; "
                    "0: --threads); the OpenMP build runs them on torch's threads")
    ap.add_argument("--extra-coretype", default="",
                    help="also time pure torch with OPENBLAS_CORETYPE set to this (e.g. Prescott)")
    ap.add_argument("--extra-lengths", default="1024,4096")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time with the process's CPU time (all its threads) instead of the "
                    "wall clock: with --threads 1, the work itself whatever else runs")
    ap.add_argument("--parts", default="1,2,3",
                    help="which parts to run: 1 fixed cost, 2 times, 3 memory (default all)")
    ap.add_argument("--quick", action="store_true", help="lengths 1024,4096; 3 repeats")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        return child(json.loads(args.child))
    if args.quick:
        args.lengths, args.repeats = "1024,4096", 3
    args.parts = {x.strip() for x in args.parts.split(",") if x.strip()}
    if not args.parts or not args.parts <= {"1", "2", "3"}:
        ap.error("--parts: a list of 1, 2, 3")
    global CLOCK_NS
    if args.cpu_time:
        CLOCK_NS = time.process_time_ns
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
    ob = openblas()
    blas = blas_build(ob)
    print(f"  library {performer.library_path}; numpy {__import__('numpy').__version__}; "
          + (f"torch {torch.__version__} (its default threads here: "
             f"{torch.get_num_threads()}; OMP_NUM_THREADS "
             f"{os.environ.get('OMP_NUM_THREADS', 'unset')})" if has_torch
             else "no torch (python3-torch)")
          + (f"; OpenBLAS in this process: {ob.openblas_get_corename().decode()} kernels, "
             f"{blas} build" if ob else ""))
    print()
    what = ("CPU time of the process (--cpu-time)" if args.cpu_time else "wall-clock time")
    print(f"times: {what}")
    if "1" in args.parts:
        print()
        print("1. fixed cost of a call: H = 1, L = 16, d = 16, m = 16, one thread "
              "(medians of 21 rounds of 300 calls, every call below taking turns)")
        print(f"  {'call':<70} {'us':>8} {'overhead us':>12}")
        for name, us, over in overhead(has_torch):
            print(f"  {name:<70} {us:8.2f} {'' if over is None else f'{over:12.2f}'}")
    if not has_torch:
        print("\nno torch: parts 2 and 3 (performer.torch against pure torch) not run")
        return
    if args.threads <= 0:
        args.threads = cores()
    if blas != "pthread":  # its products run on torch's OpenMP threads (openmp) or on one
        args.torch_blas_threads = args.threads if blas == "openmp" else 1
    elif args.torch_blas_threads <= 0:
        args.torch_blas_threads = args.threads
    lengths = [int(x) for x in args.lengths.split(",") if x]
    if not lengths or "2" not in args.parts:
        return
    T, BT = args.threads, args.torch_blas_threads
    blas_how = {"pthread": f"{BT} of the pthread build's own threads (--torch-blas-threads)",
                "openmp": f"the OpenMP build, on torch's {T} threads (it has none of its own)",
                "serial": "the serial build, one thread"}.get(blas, "not found")
    print()
    print(f"2. FAVOR+ three ways: the C library called directly (C), performer.torch.attention "
          f"(pt) and pure torch as performer-pytorch computes it (torch); B = {B_}, H = {H_}, "
          f"d = {D_}, m = {M_}; medians of {args.repeats} (3 at L >= 16384, 2 where a call "
          "takes over 5 s)")
    print(f"   threads: {T} on every side (--threads; default: every core this process may run "
          f"on): C as its pf_attn_opts.threads; pt called as a user calls it (threads=None), "
          f"following torch.get_num_threads(), and pure torch, both after "
          f"torch.set_num_threads({T}); pure torch's matrix products in OpenBLAS: {blas_how}. "
          "The thr column is what each ran, read in the run: C/pt/torch/OpenBLAS")
    print("   ms; torch/C = the library's own speed-up, torch/pt = what performer.torch "
          "delivers, pt/C = the wrapper's share; MB = each process's peak resident size less "
          "its size with the inputs made")
    print(f"  {'L':>6} {'pass':<15} {'C ms':>9} {'pt ms':>9} {'torch ms':>10} {'torch/C':>8} "
          f"{'torch/pt':>9} {'pt/C':>6} {'thr':>9} {'pt MB':>6} {'torch MB':>9}")
    results, wrong = {}, []
    for L in lengths:
        for causal in (False, True):
            for backward in (False, True):
                r = run_case(args, L, causal, backward)
                results[L, causal, backward] = r
                c, a, b = r["c"], r["performer"], r["torch"]
                kind = ("causal" if causal else "bidir") + (" fwd+bwd" if backward else " fwd")
                if "skipped" in b:
                    tail = f" not run: needs ~{b['skipped']:.0f} GB > --max-gb {args.max_gb:.0f}"
                elif "failed" in b:
                    tail = "  " + b["failed"][:60]
                else:
                    tail = f"{b['peak_mb']:9.0f}" if b.get("peak_mb") is not None else ""
                amb = f"{a['peak_mb']:6.0f}" if a.get("peak_mb") is not None else f"{'':6}"
                cols = [fmt_threads(x, want) for x, want in
                        ((c, T), (a, T), (b, T), (r["blas"][0] if "ms" in b else None, BT))]
                thr = "/".join(t for t, _ in cols)
                if not all(ok for _, ok in cols):
                    thr += "!"
                    wrong.append(f"{L} {kind}")
                print(f"  {L:>6} {kind:<15} {fmt_ms(c):>9} {fmt_ms(a):>9} {fmt_ms(b):>10} "
                      f"{ratio(b, c):>8} {ratio(b, a):>9} {ratio(a, c):>6} {thr:>9} {amb} "
                      f"{tail}", flush=True)
    kernels = sorted({r["blas"][2] for r in results.values() if r["blas"][2]})
    print(f"   OpenBLAS under pure torch: {', '.join(kernels) or 'not found'} kernels")
    if wrong:
        print(f"bench_python: threads other than the header's ({T} a side, OpenBLAS {BT}) in: "
              f"{'; '.join(wrong)} (marked !)", file=sys.stderr)
    if args.extra_coretype:
        print()
        print(f"extra: pure torch with OPENBLAS_CORETYPE={args.extra_coretype} (OpenBLAS's "
              "kernels for a CPU its table does not know), in its own process, against the C "
              "and pt columns above")
        print(f"  {'L':>6} {'pass':<15} {'torch ms':>10} {'kernels':>10} {'torch/C':>8} "
              f"{'torch/pt':>9} {'thr':>5}")
        for L in [int(x) for x in args.extra_lengths.split(",") if x]:
            for causal in (False, True):
                for backward in (False, True):
                    if (L, causal, backward) not in results:
                        continue
                    r0 = results[L, causal, backward]
                    r = run_case(args, L, causal, backward, ("torch",),
                                 {"OPENBLAS_CORETYPE": args.extra_coretype})
                    b = r["torch"]
                    kind = (("causal" if causal else "bidir")
                            + (" fwd+bwd" if backward else " fwd"))
                    cols = [fmt_threads(b, T),
                            fmt_threads(r["blas"][0] if "ms" in b else None, BT)]
                    thr = "/".join(t for t, _ in cols)
                    if not all(ok for _, ok in cols):
                        thr += "!"
                        wrong.append(f"extra {L} {kind}")
                    print(f"  {L:>6} {kind:<15} {fmt_ms(b):>10} {r['blas'][2] or '':>10} "
                          f"{ratio(b, r0['c']):>8} {ratio(b, r0['performer']):>9} {thr:>5}",
                          flush=True)
    if wrong:
        sys.exit(1)


if __name__ == "__main__":
    main()
