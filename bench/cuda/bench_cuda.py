#!/usr/bin/env python3
"""bench_cuda.py: FAVOR+ on an NVIDIA GPU (libperformer_cuda) against FlashAttention, FAVOR+ in
pure torch and flash-linear-attention, forward, forward + backward and decoding, every ratio from
the same run.

    PYTHONPATH=python python3 bench/cuda/bench_cuda.py --out docs/bench_cuda.txt [--csv FILE]
                                                       [--budget SECONDS] [--no-fla]
                                                       [--only all|fwd|fwdbwd]
    PYTHONPATH=python /usr/bin/python3 bench/cuda/bench_cuda.py --dry-run   # CPU, tiny sizes

1. Header: the GPU (name, SMs, memory, clocks, driver), CUDA, torch, triton and fla versions,
   the date, the libraries' paths and the repository's commit.
2. Yardsticks measured in this run: cuBLAS bf16 GEMM (torch.matmul, 8192 x 8192 x 8192; TFLOP/s)
   and device-to-device copy bandwidth (1 GiB, bytes read + written per second). Every rate
   below is also given as a fraction of one of them.
3. FAVOR+ forward, bidirectional and causal, bf16, B = 1 and 8, H = 16, d = dv = 64 and 128,
   m = 256, L = 1024 ... 131072, W = performer.projection(256, d, seed=0) on the GPU. "ours" is
   performer.torch.attention(q, k, v, W=W, causal=..., kernel="positive") under no_grad (or, if
   performer.torch refuses CUDA tensors, pf_cuda_favor through ctypes on a context of our own;
   the Setup section says which, and what performer.torch adds to a small call).
   Against it, on the same q, k, v:
     SDPA   torch's scaled_dot_product_attention held to the FlashAttention backend
            (sdpa_kernel(SDPBackend.FLASH_ATTENTION)), is_causal for causal: exact softmax.
     torch  performer-pytorch's FAVOR+ (lucidrains/performer-pytorch) written out in pure torch
            and run in bf16 as a user would: softmax_kernel with the data normaliser d^-1/4,
            the ratio m^-1/2, the detached stabilisers (each query row's maximum, the maximum
            over a head's keys) and eps 1e-4; linear_attention with einsums; causal as its
            causal_linear_attention_noncuda: the sequence cut by torch.chunk(128) (128 pieces
            of L/128 rows: performer-pytorch passes its chunk_size to torch.chunk, which takes
            a number of pieces), the cumulative sum of k v^T inside each piece plus the last
            context of the piece before, eps 1e-6 in the denominator.
     fla    flash-linear-attention's chunk_linear_attn(q, k, v, scale=1.0, normalize=True)
            (fla.ops.linear_attn; head-last (B, L, H, K) tensors) given phi(Q), phi(K) made by
            the pure-torch softmax_kernel above (not timed: "phi ms" times them on their own,
            and "x fla+phi" adds them), causal only. Its Triton kernels are autotuned over at
            most FLA_CONFIGS of each kernel's configurations (the time budget does not hold
            fla's full sweep, up to 48 configurations a kernel), on the first call of each
            shape, which is not timed (its wall time is reported).
   Times: CUDA events around each call, after a warm-up call, repeated until 0.3 s or 20 runs
   (at least 3), median; a call predicted to take over 0.25 s gets no warm-up (the median of 3
   absorbs a slow first run). Tokens/s = B L / time. Memory: the peak of torch's allocator
   during the case less what was allocated before it (inputs excluded; outputs included; fla's
   features included), plus, for ours, the library's own workspace, cudaMalloc'd outside
   torch's allocator: pf_cuda_ctx_bytes (performer._cuda.ctx_bytes) of the context that runs
   ours after one call of the shape, the workspace trimmed before it. Ratios are peer time
   / ours (> 1: ours is faster). Correctness guard, one small case per method, against the pure
   torch formulation in float32: normwise differences ||a - b|| / ||b||, reported, never failed.
4. FAVOR+ forward + backward (the gradients of sum(out * dout) for Q, K, V; dout N(0, 1)), the
   same sizes, modes and dtype, in phases after the forward's (--only fwdbwd: alone). Ours
   through ctypes on our own context: "ours" pf_cuda_favor_save + pf_cuda_favor_backward on a
   pf_cuda_favor_saved made once per shape (kept features), "rc" pf_cuda_favor +
   pf_cuda_favor_backward with saved NULL (features recomputed), "fwd" pf_cuda_favor alone (for
   fwd+bwd / fwd); "pt" performer.torch.attention under autograd where it runs on CUDA tensors;
   SDPA (FlashAttention backend) and the pure-torch formulation under torch's autograd,
   torch.autograd.grad(out, (q, k, v), dout). Each call allocates its output and gradients
   (torch's allocator). Memory: torch's peak over the inputs and dout (the output and gradients
   included) plus the library's own bytes (the context's workspace after one call of the shape,
   trimmed before, and the saved's pf_cuda_favor_saved_bytes), and per token (/ B L): flat or
   falling as L grows is memory linear in L. Correctness guard: the gradients of one small case
   of each method against the pure-torch formulation in float32 with eps 0 (the estimator's own
   gradients), SDPA's against exact softmax's.
5. Stage profile of our forward at the largest L that fits at B = 1, d = 64, both modes, from
   pf_cuda_ctx_profile / pf_cuda_ctx_stages on performer.torch's context (performer._cuda
   .profile / .stages, what pt.cuda_profile / pt.cuda_stage_times call; else a context of our
   own driving pf_cuda_favor): per stage the median ms over 5 forwards, each read on its own,
   TFLOP/s against the GEMM yardstick (matrix stages) and GB/s against the copy bandwidth.
6. Decoding: pf_cuda_favor_state_step on N = 1, 64, 256 sequences x H = 16 heads, d = dv = 64,
   m = 256, bf16 and fp32; the median over 200 steps of each call's wall time (a step waits for
   its stream, as the API does), tokens/s, and the state bytes each step reads and writes
   (2 N H r (dv + 1) 4) as a fraction of the copy bandwidth.
7. Targets, PASS/MISS: causal FAVOR+ faster than SDPA from L = 4096 on and >= 10x at L = 65536;
   >= 5x the pure-torch formulation, causal; one decode step of 64 x 16 (bf16) under 50 us.
   Forward + backward: causal ours (kept features) faster than SDPA from L = 8192 on; ours at
   most 3x fwd, both modes; memory linear in L (ours and rc: bytes per token at most 1.1x those
   at the L before, in every series).

Time budget (--budget, default 200 s of wall time from the start of the process): the cases
run in priority order (causal B = 1, bidirectional B = 1, causal B = 8, bidirectional B = 8;
the forward's phases, then the forward + backward's), each phase given a share of what is
left; ours always runs (it is cheap) while the budget lasts; a peer case runs only if its
cost, predicted from the same method's time at the next shorter L (scaled by L^2 for SDPA, L
otherwise) and taken SAFETY times, fits in its phase's share, and only if its memory estimate
fits in what the GPU has free (ours too); a skipped case is printed with its reason.
--only fwd runs the forward's sections (guard, decoding, stage profile, sweep), --only fwdbwd
the forward + backward's (its guard and sweep; no fla), for a short GPU call.
After the phases, a fill-in pass runs the cases skipped for time that still fit, in the same
order. END_RESERVE_S is kept for the report. Memory errors are caught and reported as "oom";
fla's first call of each (B, d) (Triton compile and autotune) needs --fla-first-s seconds
left in its phase, and a failing fla shape is not tried again. The report file (and CSV) is
rewritten after every section and phase, so a run cut short still leaves what it measured.

flash-linear-attention on a machine without network: the fla-core wheel (pure Python on
Triton) is fetched beforehand into .whl/ (git-ignored) and installed there with
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
            --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PYTHONPATH
(fla-core alone: the flash-linear-attention wheel adds only fla.layers and fla.models, which
need transformers >= 5.6.2 and are imported by `import fla` when present).

--dry-run runs the same code on the CPU at tiny sizes (H = 2, d = 16 and 32, m = 32, L <= 512;
SDPA replaced by a plain softmax where torch has none; CUDA-only parts need a libperformer_cuda,
e.g. bench/cuda/host_stub.c, the CPU library behind the same functions on host memory, named by
PERFORMER_CUDA_LIB) to find errors before a GPU run.
"""
import argparse
import csv
import ctypes
import datetime
import io
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time

T0 = time.monotonic()
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

FLA_CONFIGS = 4          # autotune configurations kept per fla Triton kernel
TARGET_S = 0.3           # repeat a case until this much time (or MAX_RUNS)
MIN_RUNS, MAX_RUNS = 3, 20
NO_WARMUP_S = 0.25       # calls predicted longer than this get no warm-up
END_RESERVE_S = 6.0      # kept at the end of the budget for the report
SAFETY = 1.3             # a case runs only if SAFETY x its predicted cost fits
QK_SCALE = 0.25          # q, k entries N(0, 1/16): logits of O(1), as trained models have
PIECES = 128             # performer-pytorch's causal chunk_size, a number of pieces
PHASE_WEIGHTS = (3.0, 2.0, 3.0, 2.0)
CUDA_SONAME = "libperformer_cuda.so.0"
PF_CUDA_STAGES = 8
DTYPES = {"fp32": 0, "bf16": 1, "fp16": 2}
# forward + backward: ours alone (fwd), with kept features (ours), recomputed (rc), through
# performer.torch's autograd (pt), SDPA and pure torch under torch's autograd
FB_METHODS = ("fb:fwd", "fb:ours", "fb:rc", "fb:pt", "fb:sdpa", "fb:torch")
FB_OURS = ("fb:fwd", "fb:ours", "fb:rc")
FB_FROM_L = 8192         # target: causal forward + backward faster than SDPA from this L on
FB_OVER_FWD = 3.0        # target: forward + backward at most this many times the forward
FB_MEM_GROWTH = 1.1      # target: bytes per token from one L to the next grow at most this much


def now():
    return time.monotonic() - T0


class BudgetExceeded(BaseException):
    """Raised by the alarm at the end of the budget; a BaseException, so that no case's
    `except Exception` takes it."""


def log(msg=""):
    print(f"[{now():6.1f} s] {msg}", flush=True)


# ---- pure torch, the way performer-pytorch computes FAVOR+ ------------------------------------

def pp_features(x, W, is_query, eps=1e-4):
    """performer-pytorch's softmax_kernel: x (B,H,L,d), W (m,d) -> (B,H,L,m),
    m^-1/2 (exp(x' w - |x'|^2 / 2 - c) + eps) with x' = x d^-1/4 and the detached stabiliser c:
    each query row's largest x' w, or the largest over all of a head's keys and features."""
    import torch
    d, m = x.shape[-1], W.shape[0]
    norm = d ** -0.25
    B, H = x.shape[:2]
    proj = W.to(x.dtype).expand(B, H, m, d)
    u = torch.einsum("...ld,...md->...lm", x * norm, proj)
    half_sq = ((x * x).sum(dim=-1, keepdim=True) * (0.5 * norm * norm))
    if is_query:
        c = torch.amax(u, dim=-1, keepdim=True).detach()
    else:
        c = torch.amax(u, dim=(-2, -1), keepdim=True).detach()
    return m ** -0.5 * (torch.exp(u - half_sq - c) + eps)


def pp_linear(qf, kf, v):
    """performer-pytorch's linear_attention (bidirectional): einsums over the key state."""
    import torch
    ksum = kf.sum(dim=-2)
    d_inv = 1.0 / torch.einsum("...lm,...m->...l", qf, ksum.type_as(qf))
    ctx = torch.einsum("...lm,...le->...me", kf, v)
    return torch.einsum("...me,...lm,...l->...le", ctx, qf, d_inv)


def pp_causal(qf, kf, v, pieces=PIECES, eps=1e-6):
    """performer-pytorch's causal_linear_attention_noncuda: torch.chunk(pieces) along L, inside
    each piece the cumulative sums of k and of k v^T (every prefix state made), plus the last
    ones of the piece before."""
    import torch
    last_k, last_ctx, outs = 0, 0, []
    for qc, kc, vc in zip(qf.chunk(pieces, dim=-2), kf.chunk(pieces, dim=-2),
                          v.chunk(pieces, dim=-2)):
        kcum = last_k + kc.cumsum(dim=-2)
        d_inv = 1.0 / torch.einsum("...lm,...lm->...l", qc, kcum.type_as(qc) + eps)
        ctx = torch.einsum("...lm,...le->...lme", kc, vc)
        ctx_cum = last_ctx + ctx.cumsum(dim=-3)
        outs.append(torch.einsum("...lme,...lm,...l->...le", ctx_cum, qc, d_inv))
        last_k = kcum[..., -1:, :]
        last_ctx = ctx_cum[..., -1:, :, :]
    return torch.cat(outs, dim=-2)


def pp_attention(q, k, v, W, causal, eps=1e-4):
    qf, kf = pp_features(q, W, True, eps), pp_features(k, W, False, eps)
    return (pp_causal if causal else pp_linear)(qf, kf, v)


def exact_softmax(q, k, v, causal):
    """Plain softmax attention (float32 reference; the dry run's stand-in for SDPA)."""
    import torch
    s = torch.einsum("...id,...jd->...ij", q, k) * q.shape[-1] ** -0.5
    if causal:
        L = q.shape[-2]
        mask = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    return torch.einsum("...ij,...je->...ie", torch.softmax(s, dim=-1), v)


def rel_diff(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


# ---- flash-linear-attention ----------------------------------------------------------------

def _prune_configs(configs, keep):
    """At most `keep` of an autotuner's configurations: the two largest tile shapes, taken in
    turn, each with (warps, stages) in the order (4,3), (8,3), (4,2), (8,2), (2,3), ..."""
    if configs is None or len(configs) <= keep:
        return configs
    pref = [(4, 3), (8, 3), (4, 2), (8, 2), (2, 3), (4, 4), (8, 4), (2, 2), (1, 3), (2, 4),
            (1, 2), (4, 1), (8, 1), (2, 1), (1, 1), (1, 4)]

    def tiles(c):
        return tuple(sorted((k, v) for k, v in c.kwargs.items() if isinstance(v, int)))

    def area(t):
        return -sum(math.log2(v) for _, v in t if v > 0)

    shapes = sorted({tiles(c) for c in configs}, key=lambda t: (area(t), t))[:2]
    groups = []
    for s in shapes:
        g = [c for c in configs if tiles(c) == s]
        g.sort(key=lambda c: pref.index((c.num_warps, c.num_stages))
               if (c.num_warps, c.num_stages) in pref else len(pref))
        groups.append(g)
    out = []
    for i in range(max(len(g) for g in groups)):
        for g in groups:
            if i < len(g) and len(out) < keep:
                out.append(g[i])
    return out


def import_fla(keep):
    """fla's chunk_linear_attn with its autotuners cut to `keep` configurations, and its
    version; or (None, reason)."""
    if "TRITON_CACHE_DIR" not in os.environ and not os.access(os.path.expanduser("~"), os.W_OK):
        os.environ["TRITON_CACHE_DIR"] = f"/tmp/triton-cache-{os.getuid()}"  # compiled kernels
    try:
        from triton.runtime import autotuner as at
    except Exception as e:  # noqa: BLE001 - any failure means: not importable
        return None, f"triton: {type(e).__name__}: {e}"
    orig = at.Autotuner.__init__

    def init(self, fn, arg_names, configs, *a, **kw):
        orig(self, fn, arg_names, _prune_configs(configs, keep), *a, **kw)

    at.Autotuner.__init__ = init
    try:
        import fla
        from fla.ops.linear_attn import chunk_linear_attn
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"
    finally:
        at.Autotuner.__init__ = orig
    return chunk_linear_attn, getattr(fla, "__version__", "?")


# ---- libperformer_cuda through ctypes ------------------------------------------------------

def _cdll_with(mod, symbol):
    for v in list(vars(mod).values()):
        if isinstance(v, ctypes.CDLL):
            try:
                getattr(v, symbol)
                return v
            except AttributeError:
                pass
    return None


def find_cuda_lib(explicit):
    """(path, how it was found) of libperformer_cuda: the one performer._cuda loads (the loader
    performer.torch uses); else one a performer module has loaded; else PERFORMER_CUDA_LIB, the
    package folder, the source tree's build folder and the dynamic linker, as performer._cuda
    and performer._lib look."""
    import importlib
    import importlib.util
    if explicit:
        return explicit, "--lib"
    why = ""
    try:
        import performer._cuda as pc
        path = pc.library_path()
        how = pc._loaded[0][2] if getattr(pc, "_loaded", None) else "?"
        return path, f"performer._cuda: {how}"
    except ImportError:
        pass
    except Exception as e:  # noqa: BLE001 - its RuntimeError says what it tried
        why = f"performer._cuda could not load it: {str(e).splitlines()[-1].strip()}; "
    for name in ("performer._lib", "performer.torch", "performer", "performer._cuda",
                 "performer.cuda", "performer._lib_cuda", "performer._cuda_lib"):
        mod = sys.modules.get(name)
        if mod is None:
            try:
                if importlib.util.find_spec(name) is None:
                    continue
                mod = importlib.import_module(name)
            except Exception:  # noqa: BLE001
                continue
        lib = _cdll_with(mod, "pf_cuda_favor")
        if lib is not None:
            return lib._name, why + f"loaded by {name}"
    import performer._lib as pl
    env = os.environ.get("PERFORMER_CUDA_LIB")
    if env:
        return env, why + "PERFORMER_CUDA_LIB"
    pkg = os.path.dirname(os.path.abspath(pl.__file__))
    tried = []
    for path, how in ((os.path.join(pkg, CUDA_SONAME), "the package folder"),
                      (os.path.join(pkg, "..", "..", "build", CUDA_SONAME),
                       "the source tree's build folder")):
        path = os.path.normpath(path)
        if os.path.exists(path):
            return path, why + how
        tried.append(f"{path}: no such file")
    return CUDA_SONAME, why + "the dynamic linker (tried " + "; ".join(tried) + ")"


class CudaLib:
    """The CUDA library's functions used here, with their prototypes (on our own CDLL object,
    so that performer's are left as they are)."""

    def __init__(self, path):
        from performer import _lib as pl
        self.pl = pl
        self.path = path
        self.lib = ctypes.CDLL(path)
        P, I, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        sh, op, fv = (ctypes.POINTER(pl.pf_shape), ctypes.POINTER(pl.pf_attn_opts),
                      ctypes.POINTER(pl.pf_favor_opts))
        dp = ctypes.POINTER(ctypes.c_double)
        protos = {
            "pf_cuda_device_count": (I, []),
            "pf_cuda_last_error": (ctypes.c_char_p, []),
            "pf_cuda_ctx_create": (I, [ctypes.POINTER(P), I]),
            "pf_cuda_ctx_free": (None, [P]),
            "pf_cuda_ctx_device": (I, [P]),
            "pf_cuda_ctx_bytes": (S, [P]),
            "pf_cuda_ctx_trim": (None, [P]),
            "pf_cuda_favor_workspace": (I, [ctypes.POINTER(S), ctypes.POINTER(S), I, sh, op,
                                            fv]),
            "pf_cuda_favor": (I, [P, P, P, P, P, I, sh, op, fv, P]),
            "pf_cuda_ctx_profile": (I, [P, I]),
            "pf_cuda_ctx_stages": (I, [P, ctypes.POINTER(ctypes.c_char_p), dp, dp, dp]),
            "pf_cuda_favor_state_create": (I, [ctypes.POINTER(P), P, I, I, I, I,
                                               ctypes.c_float, fv]),
            "pf_cuda_favor_state_free": (None, [P]),
            "pf_cuda_favor_state_step": (I, [P, P, P, P, P, P, I, P]),
            # ctx, out, Q, K, V, dtype, shape, opts, favor, saved, stream
            "pf_cuda_favor_save": (I, [P, P, P, P, P, I, sh, op, fv, P, P]),
            # ctx, dQ, dK, dV, dout, Q, K, V, dtype, shape, opts, favor, saved (or NULL), stream
            "pf_cuda_favor_backward": (I, [P, P, P, P, P, P, P, P, I, sh, op, fv, P, P]),
            "pf_cuda_favor_saved_create": (I, [ctypes.POINTER(P), P, I, sh, op, fv]),
            "pf_cuda_favor_saved_free": (None, [P]),
            "pf_cuda_favor_saved_bytes": (S, [P]),
        }
        self.missing = []
        for name, (res, args) in protos.items():
            try:
                f = getattr(self.lib, name)
            except AttributeError:
                self.missing.append(name)
                continue
            f.restype, f.argtypes = res, args
            setattr(self, name[3:], f)  # pf_cuda_favor -> self.cuda_favor

    def has(self, *names):
        return all(n not in self.missing for n in names)

    def err(self, st, fn):
        detail = ""
        if self.has("pf_cuda_last_error"):
            detail = (self.cuda_last_error() or b"").decode(errors="replace")
        return f"{fn}: {self.pl.status_str(st)}" + (f" ({detail})" if detail else "")

    def check(self, st, fn):
        if st != 0:
            raise RuntimeError(self.err(st, fn))


def structs(pl, B, H, L, d, dv, causal, W_ptr, m):
    sh = pl.pf_shape(B, H, L, L, d, dv)
    opts = pl.lib.pf_attn_opts_default()
    opts.causal = 1 if causal else 0
    fav = pl.lib.pf_favor_opts_default()
    fav.kernel, fav.W, fav.m, fav.eps, fav.chunk = 0, W_ptr, m, 0.0, 0
    return sh, opts, fav


# ---- timing ---------------------------------------------------------------------------------

class Timing:
    __slots__ = ("med", "lo", "hi", "runs", "warm", "wall", "first")


class Clock:
    """Times one call: CUDA events on the current stream (GPU), perf_counter (CPU)."""

    def __init__(self, torch, cuda):
        self.torch, self.cuda = torch, cuda
        if cuda:
            self.e0 = torch.cuda.Event(enable_timing=True)
            self.e1 = torch.cuda.Event(enable_timing=True)

    def once(self, fn):
        if self.cuda:
            self.e0.record()
            r = fn()
            self.e1.record()
            self.e1.synchronize()
            del r
            return self.e0.elapsed_time(self.e1) / 1e3
        t = time.perf_counter()
        r = fn()
        del r
        return time.perf_counter() - t

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def bench(self, fn, warmup=1):
        t0 = time.perf_counter()
        first = None
        for _ in range(warmup):
            t = self.once(fn)
            first = t if first is None else first
        ts = []
        while len(ts) < MAX_RUNS:
            ts.append(self.once(fn))
            if len(ts) >= MIN_RUNS and sum(ts) >= TARGET_S:
                break
        r = Timing()
        r.med, r.lo, r.hi = statistics.median(ts), min(ts), max(ts)
        r.runs, r.warm, r.wall, r.first = len(ts), warmup, time.perf_counter() - t0, first
        return r


def case_cost(t):
    """Wall seconds a case with calls of t seconds takes (warm-up included)."""
    warm = 1 if t < NO_WARMUP_S else 0
    n = min(MAX_RUNS, max(MIN_RUNS, math.ceil(TARGET_S / max(t, 1e-9))))
    return t * (warm + n) + 0.02


# ---- the report -----------------------------------------------------------------------------

class Res:
    """One method at one configuration."""

    def __init__(self, status, t=None, peak=None, ws=None, note=""):
        self.status, self.t, self.peak, self.ws, self.note = status, t, peak, ws, note

    @property
    def ms(self):
        return self.t.med * 1e3 if self.t is not None else None


def fmt(x, w=9, unit=""):
    if x is None:
        return "-".rjust(w)
    if isinstance(x, str):
        return x.rjust(w)
    a = abs(x)
    s = (f"{x:.4f}" if a < 1 else f"{x:.3f}" if a < 10 else f"{x:.2f}" if a < 100
         else f"{x:.1f}" if a < 10000 else f"{x:.0f}")
    return (s + unit).rjust(w)


def fmt_ratio(x, w=8):
    if x is None:
        return "-".rjust(w)
    return (f"{x:.2f}x" if x < 100 else f"{x:.0f}x").rjust(w)


class Bench:
    def __init__(self, args):
        self.args = args
        self.header, self.yard, self.setup, self.guard = [], [], [], []
        self.fwd = {}          # (mode, B, d, L) -> {method: Res}
        self.fb = {}           # (mode, B, d, L) -> {"fb:...": Res}, forward + backward
        self.fb_guard = []
        self.phi = {}          # (B, d, L) -> Res of the features in torch
        self.skips = []        # (mode, B, d, L, method, reason)
        self.fla_first = []    # lines: the first call of each fla shape
        self.profile, self.decode, self.targets = [], [], []
        self.csv = []
        self.gemm_tflops = self.copy_gbs = None
        self.complete = False
        self.gpu_label = "CPU (dry run)"

    # -- csv ----------------------------------------------------------------------------------
    FIELDS = ["section", "mode", "method", "dtype", "B", "H", "L", "d", "dv", "m", "N",
              "status", "ms_median", "ms_min", "ms_max", "runs", "warmup", "tokens_per_s",
              "peak_mib", "workspace_mib", "ratio_peer_over_ours", "value", "unit", "note"]

    def row(self, **kw):
        self.csv.append({k: kw.get(k, "") for k in self.FIELDS})

    # -- text ---------------------------------------------------------------------------------
    def render(self):
        a = self.args
        out = io.StringIO()
        w = out.write
        for line in self.header:
            w(line + "\n")
        if not self.complete:
            w("\nINCOMPLETE: the run stopped (or is still running) after the sections below\n")
        w(f"\n== Yardsticks (this run, {self.gpu_label}) ==\n")
        for line in self.yard:
            w(line + "\n")
        w("\n== Setup ==\n")
        for line in self.setup:
            w(line + "\n")
        if self.guard:
            w("\n== Correctness guard (normwise ||a - b|| / ||b||; reported, not failed) ==\n")
            for line in self.guard:
                w(line + "\n")
        if self.fb_guard:
            w("\n== Correctness guard, gradients (normwise; reported, not failed) ==\n")
            for line in self.fb_guard:
                w(line + "\n")
        for mode in ("causal", "bidirectional"):
            keys = sorted(k for k in self.fwd if k[0] == mode)
            if not keys:
                continue
            self._render_mode(w, mode, keys)
        for mode in ("causal", "bidirectional"):
            keys = sorted(k for k in self.fb if k[0] == mode)
            if keys:
                self._render_fb(w, mode, keys)
        if self.fla_first:
            w("\nflash-linear-attention, first call of each shape (Triton compile + autotune "
              f"over <= {FLA_CONFIGS} configs a kernel; not in the times above):\n")
            for line in self.fla_first:
                w("  " + line + "\n")
        if self.skips:
            w("\nSkipped or failed cases:\n")
            for mode, B, d, L, meth, why in self.skips:
                w(f"  {mode:13s} B={B} d={d:3d} L={L:6d} {meth:8s}: {why}\n")
        if self.profile:
            w(f"\n== Stage profile of our forward ({self.gpu_label}) ==\n")
            for line in self.profile:
                w(line + "\n")
        if self.decode:
            w(f"\n== Decoding: pf_cuda_favor_state_step ({self.gpu_label}) ==\n")
            for line in self.decode:
                w(line + "\n")
        if self.targets:
            w("\n== Targets ==\n")
            for line in self.targets:
                w(line + "\n")
        w(f"\nwall time of the run: {now():.1f} s (budget {a.budget:.0f} s)\n")
        return out.getvalue()

    def _render_mode(self, w, mode, keys):
        causal = mode == "causal"
        H, m = self.args.heads, self.args.features
        w(f"\n== FAVOR+ forward, {mode}, {self.args.dtype}, H = {H}, m = {m}, dv = d "
          f"({self.gpu_label}) ==\n")
        w("median ms per call; x PEER = peer time / ours (> 1: ours faster)"
          + ("; fla is given phi(Q), phi(K), x fla+phi adds the time to make them in torch"
             if causal else "") + "\n\n")
        hdr = f"{'B':>2} {'d':>4} {'L':>7}  {'ours ms':>9} {'SDPA ms':>9} {'x SDPA':>8}" \
              f" {'torch ms':>9} {'x torch':>8}"
        if causal:
            hdr += f" {'fla ms':>9} {'x fla':>8} {'x fla+phi':>9}"
        w(hdr + "\n")

        def cell(r):
            if r is None:
                return "-".rjust(9)
            if r.status != "ok":
                return r.status.rjust(9)
            return fmt(r.ms)

        def ratio(r, ours, extra=0.0):
            if r is None or ours is None or r.status != "ok" or ours.status != "ok":
                return None
            return (r.t.med + extra) / ours.t.med

        for k in keys:
            _, B, d, L = k
            rs = self.fwd[k]
            o = rs.get("ours")
            line = f"{B:>2} {d:>4} {L:>7}  {cell(o)} {cell(rs.get('sdpa'))} " \
                   f"{fmt_ratio(ratio(rs.get('sdpa'), o))} {cell(rs.get('torch'))} " \
                   f"{fmt_ratio(ratio(rs.get('torch'), o))}"
            if causal:
                f = rs.get("fla")
                ph = self.phi.get((B, d, L))
                extra = ph.t.med if ph is not None and ph.status == "ok" else None
                line += f" {cell(f)} {fmt_ratio(ratio(f, o))} " \
                        f"{fmt_ratio(ratio(f, o, extra) if extra is not None else None, 9)}"
            w(line + "\n")
        w("\nthroughput (million tokens/s = B L / time) and peak memory (MiB over the inputs;"
          " ours: torch's\nallocator + the library's workspace, ws)\n\n")
        hdr = f"{'B':>2} {'d':>4} {'L':>7}  {'ours':>8} {'SDPA':>8} {'torch':>8}"
        if causal:
            hdr += f" {'fla':>8}"
        hdr += f" | {'ours MiB':>8} {'ws MiB':>7} {'SDPA MiB':>8} {'torch MiB':>9}"
        if causal:
            hdr += f" {'fla MiB':>8} {'phi ms':>7}"
        w(hdr + "\n")
        for k in keys:
            _, B, d, L = k
            rs = self.fwd[k]

            def tok(r):
                if r is None or r.status != "ok":
                    return fmt(None, 8)
                return fmt(B * L / r.t.med / 1e6, 8)

            def mib(r, wd=8):
                if r is None or r.status != "ok" or r.peak is None:
                    return fmt(None, wd)
                return fmt(r.peak / 2**20 + (r.ws or 0) / 2**20, wd)

            o = rs.get("ours")
            ws = None if o is None or o.ws is None else o.ws / 2**20
            line = f"{B:>2} {d:>4} {L:>7}  {tok(o)} {tok(rs.get('sdpa'))} {tok(rs.get('torch'))}"
            if causal:
                line += f" {tok(rs.get('fla'))}"
            line += f" | {mib(o)} {fmt(ws, 7)} {mib(rs.get('sdpa'))} {mib(rs.get('torch'), 9)}"
            if causal:
                ph = self.phi.get((B, d, L))
                line += f" {mib(rs.get('fla'))} " \
                        f"{fmt(ph.ms if ph is not None and ph.status == 'ok' else None, 7)}"
            w(line + "\n")

    def _render_fb(self, w, mode, keys):
        a = self.args
        w(f"\n== FAVOR+ forward + backward, {mode}, {a.dtype}, H = {a.heads}, m = {a.features}, "
          f"dv = d ({self.gpu_label}) ==\n")
        w("median ms of one forward and backward (the gradients of sum(out * dout) for Q, K and "
          "V). ours: pf_cuda_favor_save +\npf_cuda_favor_backward (kept features); rc: "
          "pf_cuda_favor + pf_cuda_favor_backward, saved NULL (recomputed);\nfwd: pf_cuda_favor "
          "alone; /fwd: that method's time / fwd's; pt: performer.torch.attention under "
          "autograd;\nSDPA, torch: torch.autograd.grad after the forward. x PEER = peer time / "
          "ours (> 1: ours faster).\n")
        w(f"targets: causal ours faster than SDPA from L = {FB_FROM_L}; ours <= {FB_OVER_FWD:g}x"
          f" fwd; memory linear in L\n\n")
        w(f"{'B':>2} {'d':>4} {'L':>7}  {'fwd ms':>8} {'ours ms':>9} {'/fwd':>5} "
          f"{'rc ms':>9} {'/fwd':>5} {'pt ms':>9} {'SDPA ms':>9} {'x SDPA':>7} "
          f"{'torch ms':>9} {'x torch':>7}\n")

        def ok(r):
            return r is not None and r.status == "ok"

        def cell(r, wd=9):
            if r is None:
                return "-".rjust(wd)
            return fmt(r.ms, wd) if r.status == "ok" else r.status.rjust(wd)

        def ratio(r, base, wd):
            return fmt_ratio(r.t.med / base.t.med if ok(r) and ok(base) else None, wd)

        for k in keys:
            _, B, d, L = k
            rs = self.fb[k]
            f, o, rc = rs.get("fb:fwd"), rs.get("fb:ours"), rs.get("fb:rc")
            sd, tt = rs.get("fb:sdpa"), rs.get("fb:torch")
            w(f"{B:>2} {d:>4} {L:>7}  {cell(f, 8)} {cell(o)} {ratio(o, f, 5)} {cell(rc)} "
              f"{ratio(rc, f, 5)} {cell(rs.get('fb:pt'))} {cell(sd)} {ratio(sd, o, 7)} "
              f"{cell(tt)} {ratio(tt, o, 7)}\n")
        w("\npeak memory of a forward + backward: MiB over the inputs and dout (4 B H L d "
          "elements), torch's allocator\n(the output and gradients included) + the library's "
          "own (lib: workspace, and for ours the saved features);\nKiB/tok = that / (B L): "
          "memory linear in L keeps it flat or falling as L grows\n\n")
        meths = (("fb:ours", "ours"), ("fb:rc", "rc"), ("fb:pt", "pt"), ("fb:sdpa", "SDPA"),
                 ("fb:torch", "torch"))
        w(f"{'B':>2} {'d':>4} {'L':>7}  {'lib MiB':>8}"
          + "".join(f" | {nm + ' MiB':>9} {'KiB/tok':>7}" for _, nm in meths) + "\n")
        for k in keys:
            _, B, d, L = k
            rs = self.fb[k]
            o = rs.get("fb:ours")
            lib = o.ws / 2**20 if ok(o) and o.ws is not None else None
            line = f"{B:>2} {d:>4} {L:>7}  {fmt(lib, 8)}"
            for meth, _ in meths:
                r = rs.get(meth)
                if ok(r) and r.peak is not None:
                    tot = r.peak + (r.ws or 0)
                    line += f" | {fmt(tot / 2**20, 9)} {fmt(tot / (B * L) / 1024, 7)}"
                else:
                    line += f" | {fmt(None, 9)} {fmt(None, 7)}"
            w(line + "\n")

    def write(self, final=False):
        """The report (--out) and the CSV (--csv), each written whole to a temporary name and
        renamed. While the run goes on, and when it stops short, they go to OUT.partial and
        CSV.partial: only a complete run's final write replaces OUT and CSV (and removes the
        .partial files), so a run that fails leaves an earlier report where it was."""
        text = self.render()
        done = final and self.complete

        def put(path, fill):
            if not path:
                return
            dest = path if done else path + ".partial"
            tmp = dest + ".tmp"
            with open(tmp, "w", newline="") as f:
                fill(f)
            os.replace(tmp, dest)
            if done and os.path.exists(path + ".partial"):
                os.remove(path + ".partial")

        def rows(f):
            wr = csv.DictWriter(f, fieldnames=self.FIELDS)
            wr.writeheader()
            wr.writerows(self.csv)

        put(self.args.out, lambda f: f.write(text))
        put(self.args.csv, rows)
        return text


# ---- the run --------------------------------------------------------------------------------

def sh_out(cmd, timeout=10):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


class Run:
    def __init__(self, args):
        import torch
        self.torch = torch
        self.args = args
        self.cuda = args.device == "cuda"
        self.dev = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16,
                      "fp32": torch.float32}[args.dtype]
        self.clock = Clock(torch, self.cuda)
        self.rep = Bench(args)
        self.hard_deadline = args.budget - END_RESERVE_S
        self.oom = getattr(torch.cuda, "OutOfMemoryError", None) or RuntimeError
        self.pred = {}         # (method, mode, B, d) -> (L, seconds per call)
        self.fla = None
        self.fla_seen = set()  # shapes (B, d) fla has compiled for
        self.fla_fail = {}     # (B, d) -> why fla failed there (not tried again)
        self.cu = None
        self.ctx = None        # our own pf_cuda_ctx
        self.pc = None         # performer._cuda, when it has loaded the library
        self.pt_ctx = None     # performer.torch's context on device 0 (its pointer), and lock
        self.pt_lock = None
        self.ours_via = None   # "performer.torch" or "pf_cuda_favor"
        self.dead = False      # the CUDA context is unusable: stop
        self.decode64 = None   # seconds of one bf16 decode step of 64 sequences
        self.fb_why = "not set up"     # why ours cannot run forward + backward (None: it can)
        self.pt_fb_why = "not set up"  # likewise performer.torch under autograd

    # -- memory -------------------------------------------------------------------------------
    def free_bytes(self):
        t = self.torch
        if not self.cuda:
            return 1 << 62
        t.cuda.synchronize()
        free, _ = t.cuda.mem_get_info()
        return free + t.cuda.memory_reserved() - t.cuda.memory_allocated()

    def mem_start(self):
        t = self.torch
        if not self.cuda:
            return 0
        t.cuda.synchronize()
        t.cuda.empty_cache()
        t.cuda.reset_peak_memory_stats()
        return t.cuda.memory_allocated()

    def mem_peak(self, base):
        if not self.cuda:
            return None
        return self.torch.cuda.max_memory_allocated() - base

    def alive(self):
        if not self.cuda:
            return True
        try:
            self.torch.zeros(1, device=self.dev).add_(1).item()
            return True
        except Exception:  # noqa: BLE001
            return False

    # -- inputs -------------------------------------------------------------------------------
    def inputs(self, B, H, L, d, dv, seed):
        t = self.torch
        g = t.Generator(device=self.dev).manual_seed(seed)
        out = []
        for i, (w, s) in enumerate(((d, QK_SCALE), (d, QK_SCALE), (dv, 1.0))):
            x = t.randn((B, H, L, w), generator=g, device=self.dev, dtype=t.float32)
            out.append((x * s).to(self.dtype))
            del x
        return out

    def weights(self, d):
        import performer
        W = performer.projection(self.args.features, d, seed=0)
        return self.torch.from_numpy(W).to(self.dev)

    # -- header and yardsticks ----------------------------------------------------------------
    def header(self):
        t, rep, a = self.torch, self.rep, self.args
        import performer
        from performer import _lib as pl
        h = rep.header
        h.append("bench_cuda.py: FAVOR+ forward, forward + backward and decoding on the GPU "
                 "against FlashAttention (SDPA), performer-pytorch")
        h.append("in pure torch and flash-linear-attention; every ratio from this one run")
        h.append(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
        if self.cuda:
            p = t.cuda.get_device_properties(0)
            name = t.cuda.get_device_name(0)
            rep.gpu_label = f"{name}, {p.multi_processor_count} SMs"
            h.append(f"GPU: {name}, {p.multi_processor_count} SMs, "
                     f"{p.total_memory / 2**30:.1f} GiB, compute capability {p.major}.{p.minor}")
            q = sh_out(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.max.sm,"
                        "clocks.mem,power.limit,temperature.gpu", "--format=csv,noheader"])
            if q:
                f = [x.strip() for x in q.splitlines()[0].split(",")]
                if len(f) >= 6:
                    h.append(f"driver {f[0]}; SM clock {f[1]} (max {f[2]}), memory clock {f[3]},"
                             f" power limit {f[4]}, {f[5]} C at start")
                else:
                    h.append(f"nvidia-smi: {q}")
            else:
                h.append(f"driver: CUDA driver API {self._driver_api()} (nvidia-smi not found)")
        else:
            h.append("device: CPU (dry run: tiny sizes, no GPU timings)")
        try:
            import triton
            tv = triton.__version__
        except Exception:  # noqa: BLE001
            tv = "not importable"
        cudnn = t.backends.cudnn.version() if self.cuda else None
        h.append(f"torch {t.__version__} (CUDA {t.version.cuda}, cuDNN {cudnn}), triton {tv}, "
                 f"python {platform.python_version()}")
        h.append(f"host: {platform.node()}, {cpu_name()}, {os.cpu_count()} CPUs")
        h.append(f"performer {performer.version()}: {pl.library_path} "
                 f"({pl.library_found_by})")
        commit = sh_out(["git", "-C", REPO, "rev-parse", "--short=12", "HEAD"])
        if commit:
            dirty = sh_out(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"])
            commit += " (with uncommitted changes)" if dirty else ""
        h.append(f"repository commit: {commit or 'unknown (no git)'}")
        h.append(f"sizes: B {a.batches}, H {a.heads}, d = dv {a.dims}, m {a.features}, "
                 f"L {a.lengths[0]}..{a.lengths[-1]}, {a.dtype}; budget {a.budget:.0f} s; "
                 f"--only {a.only}")
        for line in h:
            print(line, flush=True)

    def _driver_api(self):
        try:
            cuda = ctypes.CDLL("libcuda.so.1")
            v = ctypes.c_int()
            if cuda.cuDriverGetVersion(ctypes.byref(v)) == 0:
                return f"{v.value // 1000}.{v.value % 1000 // 10}"
        except OSError:
            pass
        return "unknown"

    def yardsticks(self):
        self._gemm()
        self._copy()
        for line in self.rep.yard:
            log(line)

    def _gemm(self):
        t, rep = self.torch, self.rep
        n = 8192 if self.cuda else 512
        dt = t.bfloat16 if self.cuda else t.float32
        a = t.randn(n, n, device=self.dev).to(dt)
        b = t.randn(n, n, device=self.dev).to(dt)
        self.clock.once(lambda: t.matmul(a, b))
        r = self.clock.bench(lambda: t.matmul(a, b), warmup=2)
        rep.gemm_tflops = 2 * n ** 3 / r.med / 1e12
        rep.yard.append(f"GEMM: torch.matmul {n} x {n} x {n} {str(dt)[6:]}"
                        f"{' (cuBLAS)' if self.cuda else ''}: "
                        f"{rep.gemm_tflops:.1f} TFLOP/s (median of {r.runs}, {r.med * 1e3:.3f} ms)")
        rep.row(section="yardstick", method="gemm", dtype=str(dt)[6:], status="ok",
                ms_median=r.med * 1e3, runs=r.runs, value=rep.gemm_tflops, unit="TFLOP/s")

    def _copy(self):
        t, rep = self.torch, self.rep
        nbytes = (1 << 30) if self.cuda else (64 << 20)
        src = t.empty(nbytes, dtype=t.uint8, device=self.dev).fill_(1)
        dst = t.empty_like(src)
        r = self.clock.bench(lambda: dst.copy_(src), warmup=2)
        rep.copy_gbs = 2 * nbytes / r.med / 1e9
        rep.yard.append(f"copy: device-to-device {nbytes >> 20} MiB: {rep.copy_gbs:.0f} GB/s "
                        f"read + written (median of {r.runs}, {r.med * 1e3:.3f} ms)")
        rep.row(section="yardstick", method="copy", status="ok", ms_median=r.med * 1e3,
                runs=r.runs, value=rep.copy_gbs, unit="GB/s")

    # -- ours ---------------------------------------------------------------------------------
    def setup_ours(self):
        """Finds the CUDA library, makes our own context, and checks that performer.torch
        takes CUDA tensors; picks how "ours" is called."""
        t, rep, a = self.torch, self.rep, self.args
        import performer.torch as pt
        self.pt = pt
        path, how = find_cuda_lib(a.lib)
        try:
            self.cu = CudaLib(path)
            rep.setup.append(f"libperformer_cuda: {path} ({how})")
            if self.cu.missing:
                rep.setup.append("  missing functions: " + ", ".join(self.cu.missing))
        except OSError as e:
            self.cu = None
            rep.setup.append(f"libperformer_cuda: not loaded ({how}: {e})")
        if self.cu is not None and self.cu.has("pf_cuda_ctx_create"):
            ctx = ctypes.c_void_p()
            st = self.cu.cuda_ctx_create(ctypes.byref(ctx), 0)
            if st == 0:
                self.ctx = ctx
            else:
                rep.setup.append("  own context: " + self.cu.err(st, "pf_cuda_ctx_create"))
        # performer.torch on this device
        H, d = 2, 32 if not self.cuda else 64
        q, k, v = self.inputs(1, H, 256, d, d, seed=7)
        W = self.weights(d)
        why = None
        try:
            if a.ours == "direct":
                raise RuntimeError("--ours direct")
            o = pt.attention(q, k, v, W=W, causal=True, kernel="positive")
            if tuple(o.shape) != (1, H, 256, d) or o.device != q.device:
                why = f"returned shape {tuple(o.shape)} on {o.device}"
            elif not bool(t.isfinite(o.float()).all()):
                why = "returned non-finite values"
        except Exception as e:  # noqa: BLE001
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        direct_ok = self.ctx is not None and self.cu.has("pf_cuda_favor")
        if why is None:
            self.ours_via = "performer.torch"
            rep.setup.append("ours: performer.torch.attention(q, k, v, W=W, causal=..., "
                             "kernel='positive') under no_grad")
        elif direct_ok and a.ours != "torch":
            self.ours_via = "pf_cuda_favor"
            rep.setup.append("ours: pf_cuda_favor through ctypes on our own context (" +
                             ("--ours direct)" if a.ours == "direct" else
                              f"performer.torch refused {self.dev.type} tensors: {why})"))
        else:
            rep.setup.append(f"ours: NOT AVAILABLE (performer.torch: {why}; "
                             "libperformer_cuda not usable)")
        # performer.torch's context (performer._cuda.ctx), when the library is performer's
        try:
            import performer._cuda as pc
            if pc.is_loaded() and os.path.realpath(pc.library_path()) == \
                    os.path.realpath(self.cu.path if self.cu else ""):
                c = pc.ctx(0)
                self.pc, self.pt_ctx, self.pt_lock = pc, c.ptr, c.lock
                rep.setup.append("performer.torch's context: performer._cuda.ctx(0)")
        except Exception as e:  # noqa: BLE001
            rep.setup.append(f"performer.torch's context: not reachable ({e})")
        if self.ours_via == "performer.torch" and self.pc is not None:
            rep.setup.append("workspace (ws) of ours: performer._cuda.ctx_bytes(0) "
                             "(pf_cuda_ctx_bytes) after one call of the shape, trimmed before")
        elif self.ctx is not None:
            rep.setup.append("workspace (ws) of ours: pf_cuda_ctx_bytes of our own context "
                             "after one pf_cuda_favor of the same shape, trimmed before")
        # wrapper overhead at a small size: performer.torch against pf_cuda_favor, same call
        if self.ours_via == "performer.torch" and direct_ok and a.only != "fwdbwd":
            self.wrapper_overhead()
        for line in rep.setup:
            log(line)

    def direct(self, q, k, v, W, causal, ctx=None, lock=None):
        """pf_cuda_favor on our context (or ctx, holding lock around the call): a function of
        no arguments giving out."""
        t, cu = self.torch, self.cu
        B, H, L, d = q.shape
        dv = v.shape[-1]
        sh, opts, fav = structs(cu.pl, B, H, L, d, dv, causal, W.data_ptr(), W.shape[0])
        out = t.empty((B, H, L, dv), dtype=q.dtype, device=q.device)
        code = {t.float32: 0, t.bfloat16: 1, t.float16: 2}[q.dtype]
        stream = t.cuda.current_stream().cuda_stream if self.cuda else None
        args = (ctx or self.ctx, out.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                code, ctypes.byref(sh), ctypes.byref(opts), ctypes.byref(fav), stream)
        keep = (sh, opts, fav, q, k, v, W)

        def run():
            if lock is None:
                st = cu.cuda_favor(*args)
            else:
                with lock:
                    st = cu.cuda_favor(*args)
            cu.check(st, "pf_cuda_favor")
            return out
        run.keep = keep
        return run

    def ours_fn(self, q, k, v, W, causal):
        if self.ours_via == "performer.torch":
            pt = self.pt
            return lambda: pt.attention(q, k, v, W=W, causal=causal, kernel="positive")
        return self.direct(q, k, v, W, causal)

    def workspace(self, q, k, v, W, causal):
        """Bytes the context that runs ours holds after one call of this shape alone (None if
        unknown)."""
        if self.ours_via == "performer.torch" and self.pc is not None and self.cuda:
            try:
                self.pc.trim()
                self.ours_fn(q, k, v, W, causal)()
                return self.pc.ctx_bytes(0)
            except Exception as e:  # noqa: BLE001
                log(f"  workspace probe failed: {e}")
                return None
        if self.ctx is None or not self.cu.has("pf_cuda_ctx_bytes", "pf_cuda_ctx_trim"):
            return None
        try:
            self.cu.cuda_ctx_trim(self.ctx)
            self.direct(q, k, v, W, causal)()
            n = self.cu.cuda_ctx_bytes(self.ctx)
            self.cu.cuda_ctx_trim(self.ctx)
            return n
        except Exception as e:  # noqa: BLE001
            log(f"  workspace probe failed: {e}")
            return None

    def wrapper_overhead(self):
        a = self.args
        d = a.dims[0]
        L = a.lengths[0]
        q, k, v = self.inputs(1, a.heads, L, d, d, seed=11)
        W = self.weights(d)
        for causal in (False, True):
            try:
                r1 = self.clock.bench(self.ours_fn(q, k, v, W, causal))
                r2 = self.clock.bench(self.direct(q, k, v, W, causal, self.pt_ctx,
                                                  self.pt_lock))
                r3 = self.clock.bench(self.ours_fn(q, k, v, W, causal))
                t1 = min(r1.med, r3.med)
                self.rep.setup.append(
                    f"performer.torch against pf_cuda_favor called directly, B=1 H={a.heads} "
                    f"L={L} d={d} {'causal' if causal else 'bidirectional'}: {t1 * 1e6:.0f} us"
                    f" vs {r2.med * 1e6:.0f} us (+{(t1 - r2.med) * 1e6:.0f} us a call)")
                self.rep.row(section="wrapper", mode="causal" if causal else "bidirectional",
                             method="performer.torch-minus-direct", B=1, H=a.heads, L=L, d=d,
                             dv=d, m=a.features, status="ok", ms_median=t1 * 1e3,
                             value=(t1 - r2.med) * 1e6, unit="us")
            except Exception as e:  # noqa: BLE001
                self.rep.setup.append(f"wrapper overhead: failed ({e})")

    # -- correctness guard --------------------------------------------------------------------
    def correctness(self):
        a, rep = self.args, self.rep
        B, H, d = 1, a.heads, a.dims[0]
        L = a.lengths[0]
        q, k, v = self.inputs(B, H, L, d, d, seed=3)
        W = self.weights(d)
        qf, kf, vf = q.float(), k.float(), v.float()
        rep.guard.append(f"B={B} H={H} L={L} d={d} m={a.features}, {a.dtype} inputs; ref = the "
                         "pure-torch formulation in float32 (eps 1e-4), ref0 = the same with")
        rep.guard.append("eps 0 (the FAVOR+ estimator itself, which ours computes; stabilisers "
                         "differ, the result does not)")
        for causal in (False, True):
            mode = "causal" if causal else "bidirectional"
            ref = pp_attention(qf, kf, vf, W, causal)
            ref0 = pp_attention(qf, kf, vf, W, causal, eps=0.0)
            exact = exact_softmax(qf, kf, vf, causal)
            items = []
            if self.ours_via:
                try:
                    o = self.ours_fn(q, k, v, W, causal)()
                    items.append(("ours", "ref", rel_diff(o, ref)))
                    items.append(("ours", "ref0", rel_diff(o, ref0)))
                except Exception as e:  # noqa: BLE001
                    items.append(("ours", f"failed: {e}", None))
            items.append(("torch", "ref", rel_diff(pp_attention(q, k, v, W, causal), ref)))
            if causal and self.fla is not None:
                try:
                    t0 = time.perf_counter()
                    o = self.fla_fn(q, k, v, W)()
                    self.clock.sync()
                    if (B, d) not in self.fla_seen:
                        self.fla_seen.add((B, d))
                        dt = time.perf_counter() - t0
                        rep.fla_first.append(f"B={B} H={H} d={d} (K={a.features}, V={d}) at "
                                             f"L={L}: {dt:.1f} s (in the guard)")
                        rep.row(section="fla_first_call", B=B, H=H, L=L, d=d, dv=d,
                                m=a.features, status="ok", value=dt, unit="s")
                        log(f"fla first call (compile + autotune): {dt:.1f} s")
                    items.append(("fla", "ref", rel_diff(o.transpose(1, 2), ref)))
                except Exception as e:  # noqa: BLE001
                    msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                    self.fla_fail[(B, d)] = f"failed in the guard: {msg[:160]}"
                    items.append(("fla", f"failed: {msg[:200]}", None))
            try:
                with self.sdpa_backend():
                    s = self.sdpa_fn(q, k, v, causal)()
                items.append(("SDPA", "exact softmax (fp32)", rel_diff(s, exact)))
            except Exception as e:  # noqa: BLE001
                items.append(("SDPA", f"failed: {type(e).__name__}: {e}", None))
            items.append(("ref0", "exact softmax (fp32): the estimator's own error at this m",
                          rel_diff(ref0, exact)))
            for meth, against, val in items:
                txt = f"{val:.2e}" if val is not None else ""
                rep.guard.append(f"  {mode:13s} {meth:5s} vs {against}: {txt}")
                rep.row(section="guard", mode=mode, method=meth, dtype=a.dtype, B=B, H=H, L=L,
                        d=d, dv=d, m=a.features, status="ok" if val is not None else "fail",
                        value=val if val is not None else "", unit="rel_l2", note=against)
        for line in rep.guard:
            log(line)

    # -- peers --------------------------------------------------------------------------------
    def sdpa_fn(self, q, k, v, causal):
        """SDPA on q, k, v; call it inside sdpa_backend() (entered outside the timed calls, so
        that its few microseconds of Python are not charged to each call)."""
        t = self.torch
        F = t.nn.functional
        if not hasattr(F, "scaled_dot_product_attention"):
            if self.cuda:
                raise RuntimeError(f"torch {t.__version__} has no scaled_dot_product_attention")
            return lambda: exact_softmax(q, k, v, causal)
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def sdpa_backend(self):
        """The context holding SDPA to FlashAttention (GPU); nothing on the CPU."""
        import contextlib
        if not self.cuda:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)

    def fla_fn(self, q, k, v, W):
        """A function running fla's chunk_linear_attn on phi(Q), phi(K) and V made here, head
        last ((B, L, H, .), as fla takes them); it returns (B, L, H, dv)."""
        qf = pp_features(q, W, True).transpose(1, 2).contiguous()
        kf = pp_features(k, W, False).transpose(1, 2).contiguous()
        vt = v.transpose(1, 2).contiguous()
        fla = self.fla

        def run():
            return fla(qf, kf, vt, scale=1.0, normalize=True)[0]
        return run

    # -- estimates ----------------------------------------------------------------------------
    def mem_estimate(self, meth, B, H, L, d, m, causal):
        e = 2 if self.dtype != self.torch.float32 else 4
        BHL = B * H * L
        F = BHL * m * e
        if meth == "ours":
            return BHL * d * e + (1 << 30)
        if meth == "sdpa":
            return BHL * d * e + BHL * 4
        if meth == "torch":
            feats = 4 * F
            if causal:
                loop = 2 * F + 4 * (BHL // PIECES) * m * d * e + 2 * BHL * d * e
            else:
                loop = 3 * F + BHL * d * e
            return max(feats, loop)
        if meth == "fla":
            # phi(Q), phi(K) head-last, the chunk states h (B, L/64, H, m, dv) in the input
            # dtype, the running key sum and the two temporaries of its normaliser
            # (q * scale * k_cum), o and o / denominator
            h = B * H * (-(-L // 64)) * m * d * e
            return max(4 * F, 5 * F + h + 2 * BHL * d * e)
        # forward + backward: the output and three gradients, besides what each keeps
        grads = 4 * BHL * d * e
        if meth == "fb:fwd":
            return BHL * d * e + (1 << 30)
        if meth == "fb:rc":
            return grads + (1 << 30)
        if meth in ("fb:ours", "fb:pt"):
            return grads + self.saved_estimate(B, H, L, m) + (1 << 30)
        if meth == "fb:sdpa":
            # the log-sum-exp, and dQ accumulated in float32
            return grads + BHL * d * 4 + 2 * BHL * 4
        if meth == "fb:torch":
            # the autograd graph keeps the features and their exponentials; causal also every
            # piece's prefix states k v^T (L m dv in all), which the last einsum saves
            if causal:
                return BHL * m * d * e + 8 * F + 2 * grads
            return 10 * F + 2 * grads
        return 0

    def saved_estimate(self, B, H, L, m):
        """Device bytes of a pf_cuda_favor_saved (the header's count: 2 L r features, bfloat16
        for half inputs, float32 otherwise, and 3 L floats a head)."""
        e = 2 if self.dtype != self.torch.float32 else 4
        return B * H * L * (2 * m * e + 12)

    def predict(self, meth, mode, B, d, L):
        """Seconds per call predicted from the same method's last time in this series (or at
        the other batch size), scaled by L^2 for SDPA and L otherwise; None if never run."""
        p = 2 if meth in ("sdpa", "fb:sdpa") else 1
        known = self.pred.get((meth, mode, B, d))
        if known is not None:
            L0, t0 = known
            return t0 * (L / L0) ** p
        for (m2, mo2, B2, d2), (L0, t0) in self.pred.items():
            if m2 == meth and mo2 == mode and d2 == d:
                return t0 * (L / L0) ** p * B / B2
        return None

    # -- one configuration --------------------------------------------------------------------
    def table(self, meth):
        """The results table and CSV section of a method: the forward sweep's, or the forward +
        backward one's for the methods named "fb:..."."""
        if meth.startswith("fb:"):
            return self.rep.fb, "fwdbwd"
        return self.rep.fwd, "forward"

    def forget(self, key, meth):
        """Drops what was recorded for meth at key (a skip that is being retried)."""
        mode, B, d, L = key
        tab, section = self.table(meth)
        self.rep.skips = [x for x in self.rep.skips if x[:5] != (mode, B, d, L, meth)]
        drop = {meth, "phi"} if meth == "fla" else {meth}
        self.rep.csv = [r for r in self.rep.csv if not (
            r["section"] == section and (r["mode"], r["B"], r["d"], r["L"]) == (mode, B, d, L)
            and r["method"] in drop)]
        tab.get(key, {}).pop(meth, None)

    def skip(self, key, meth, why, status="skip"):
        mode, B, d, L = key
        tab, section = self.table(meth)
        self.forget(key, meth)
        tab.setdefault(key, {})[meth] = Res(status, note=why)
        self.rep.skips.append((mode, B, d, L, meth, why))
        self.rep.row(section=section, mode=mode, method=meth, dtype=self.args.dtype, B=B,
                     H=self.args.heads, L=L, d=d, dv=d, m=self.args.features, status=status,
                     note=why)
        log(f"  {meth}: {status}: {why}")

    def measure(self, key, meth, fn, pred, ws=None, base=None):
        """Times fn as the case key/meth, records it and returns the Res (or None). Memory is
        counted from base (default: what is allocated when the case starts); ws is what the
        library holds outside torch's allocator (a number, or a function called after the
        timing that gives it)."""
        mode, B, d, L = key
        a = self.args
        tab, section = self.table(meth)
        ref = "fb:ours" if section == "fwdbwd" else "ours"
        b0 = self.mem_start()
        base = b0 if base is None else base
        warm = 0 if (pred is not None and pred >= NO_WARMUP_S) else 1
        try:
            r = self.clock.bench(fn, warmup=warm)
        except self.oom as e:
            del e
            self.torch.cuda.empty_cache() if self.cuda else None
            self.skip(key, meth, "out of memory", "oom")
            return None
        except Exception as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
            if "out of memory" in msg.lower():
                self.skip(key, meth, msg, "oom")
            else:
                self.skip(key, meth, msg, "fail")
            if not self.alive():
                self.dead = True
                log("the CUDA context no longer works: stopping the sweep")
            return None
        peak = self.mem_peak(base)
        if callable(ws):
            ws = ws()
        res = Res("ok", r, peak, ws)
        tab.setdefault(key, {})[meth] = res
        self.pred[(meth, mode, B, d)] = (L, r.med)
        ours = tab[key].get(ref)
        ratio = ""
        if meth not in (ref, "fb:fwd") and ours is not None and ours.status == "ok":
            ratio = r.med / ours.t.med
        self.rep.row(section=section, mode=mode, method=meth, dtype=a.dtype, B=B, H=a.heads,
                     L=L, d=d, dv=d, m=a.features, status="ok", ms_median=r.med * 1e3,
                     ms_min=r.lo * 1e3, ms_max=r.hi * 1e3, runs=r.runs, warmup=r.warm,
                     tokens_per_s=B * L / r.med,
                     peak_mib="" if peak is None else peak / 2**20,
                     workspace_mib="" if ws is None else ws / 2**20,
                     ratio_peer_over_ours=ratio, note="" if warm else "no warm-up")
        extra = f", x{ratio:.2f}" if ratio != "" else ""
        mem = "" if peak is None else f", {peak / 2**20:.0f} MiB"
        log(f"  {meth:8s} {r.med * 1e3:10.3f} ms (median of {r.runs}{extra}{mem}; "
            f"case {r.wall:.2f} s)")
        return res

    def gate(self, key, meth, phase_deadline, causal):
        """None if the peer case may run, else why not."""
        mode, B, d, L = key
        a = self.args
        need = self.mem_estimate(meth, B, a.heads, L, d, a.features, causal)
        free = self.free_bytes()
        if need > 0.9 * free:
            return (f"memory: needs about {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free")
        t = self.predict(meth, mode, B, d, L)
        if t is None:
            return None
        cost = SAFETY * case_cost(t)
        left = min(phase_deadline, self.hard_deadline) - now()
        if cost > left:
            return (f"time: predicted {cost:.1f} s for the case ({t * 1e3:.0f} ms a call), "
                    f"{max(left, 0):.1f} s left in this phase's share of the budget")
        return None

    def config(self, mode, B, d, L, phase_deadline, methods=("ours", "sdpa", "torch", "fla")):
        t, a = self.torch, self.args
        causal = mode == "causal"
        key = (mode, B, d, L)
        H = a.heads
        log(f"{mode} B={B} H={H} d={d} L={L}" + ("" if "ours" in methods else
                                                 f" (again: {', '.join(methods)})"))
        self.rep.fwd.setdefault(key, {})
        need = sum(self.mem_estimate(x, B, H, L, d, a.features, causal) for x in ("ours",))
        need += 3 * B * H * L * d * (2 if self.dtype != t.float32 else 4)
        if need > 0.9 * self.free_bytes():
            for meth in methods:
                if causal or meth != "fla":
                    self.skip(key, meth, "memory: the inputs and our output do not fit")
            return
        q, k, v = self.inputs(B, H, L, d, d, seed=1000 * B + 10 * d + int(math.log2(L)))
        W = self.weights(d)
        # ours: always, unless the whole budget is gone
        if "ours" not in methods:
            pass
        elif self.ours_via is None:
            self.skip(key, "ours", "not available (see Setup)", "fail")
        else:
            tp = self.predict("ours", mode, B, d, L)
            if tp is not None and now() + SAFETY * case_cost(tp) > self.hard_deadline:
                self.skip(key, "ours", "time: the budget is spent")
            else:
                ws = self.workspace(q, k, v, W, causal)
                self.measure(key, "ours", self.ours_fn(q, k, v, W, causal), tp, ws)
        if self.dead:
            return
        # SDPA
        why = self.gate(key, "sdpa", phase_deadline, causal) if "sdpa" in methods else ""
        if why:
            self.skip(key, "sdpa", why)
        elif "sdpa" in methods:
            try:
                fn = self.sdpa_fn(q, k, v, causal)
                with self.sdpa_backend():
                    self.measure(key, "sdpa", fn, self.predict("sdpa", mode, B, d, L))
            except Exception as e:  # noqa: BLE001
                self.skip(key, "sdpa", f"{type(e).__name__}: {e}"[:160], "fail")
        if self.dead:
            return
        # pure torch
        why = self.gate(key, "torch", phase_deadline, causal) if "torch" in methods else ""
        if why:
            self.skip(key, "torch", why)
        elif "torch" in methods:
            self.measure(key, "torch", lambda: pp_attention(q, k, v, W, causal),
                         self.predict("torch", mode, B, d, L))
        if self.dead:
            return
        if causal and "fla" in methods:
            self.fla_case(key, q, k, v, W, phase_deadline)

    def fla_case(self, key, q, k, v, W, phase_deadline):
        mode, B, d, L = key
        if self.fla is None:
            self.rep.fwd[key]["fla"] = Res("n/a", note=self.fla_why)
            return
        shape = (B, d)
        if shape in self.fla_fail:
            self.skip(key, "fla", self.fla_fail[shape], "fail")
            return
        why = self.gate(key, "fla", phase_deadline, True)
        first = shape not in self.fla_seen
        if why is None and first:
            left = min(phase_deadline, self.hard_deadline) - now()
            if left < self.args.fla_first_s:
                why = (f"time: the first call of this shape compiles and autotunes Triton "
                       f"kernels (allowed {self.args.fla_first_s:.0f} s), {max(left, 0):.1f} s "
                       "left in this phase's share")
        if why:
            self.skip(key, "fla", why)
            return
        try:
            base = self.mem_start()
            run = self.fla_fn(q, k, v, W)
            if first:
                t0 = time.perf_counter()
                run()
                self.clock.sync()
                dt = time.perf_counter() - t0
                self.fla_seen.add(shape)
                self.rep.fla_first.append(f"B={B} H={self.args.heads} d={d} (K={self.args.features}"
                                          f", V={d}) at L={L}: {dt:.1f} s")
                self.rep.row(section="fla_first_call", B=B, H=self.args.heads, L=L, d=d, dv=d,
                             m=self.args.features, status="ok", value=dt, unit="s")
                log(f"  fla first call (compile + autotune): {dt:.1f} s")
            # memory counted from before the features were made: fla needs them
            self.measure(key, "fla", run, self.predict("fla", mode, B, d, L), base=base)
            del run
        except self.oom:
            if self.cuda:
                self.torch.cuda.empty_cache()
            self.skip(key, "fla", "out of memory (making its inputs)", "oom")
            return
        except Exception as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
            self.fla_fail[shape] = f"failed at L={L}: {msg}"
            self.skip(key, "fla", msg, "fail")
            return
        r = self.rep.fwd.get(key, {}).get("fla")
        if r is not None and r.status == "fail":  # measure() caught it
            self.fla_fail[shape] = f"failed at L={L}: {r.note}"
            return
        # the features on their own
        try:
            def feats():
                return pp_features(q, W, True), pp_features(k, W, False)
            r = self.clock.bench(feats)
            self.rep.phi[(B, d, L)] = Res("ok", r)
            self.rep.row(section="forward", mode=mode, method="phi", dtype=self.args.dtype, B=B,
                         H=self.args.heads, L=L, d=d, dv=d, m=self.args.features, status="ok",
                         ms_median=r.med * 1e3, runs=r.runs,
                         note="phi(Q), phi(K) in torch (given to fla)")
        except Exception as e:  # noqa: BLE001
            log(f"  phi: failed ({e})")

    # -- forward + backward -------------------------------------------------------------------
    def setup_fb(self):
        """Which forward + backward methods can run: ours through ctypes needs the library's
        backward functions and a context of our own; performer.torch under autograd is tried
        on a small case of this device."""
        t, rep = self.torch, self.rep
        need = ("pf_cuda_favor", "pf_cuda_favor_save", "pf_cuda_favor_backward",
                "pf_cuda_favor_saved_create", "pf_cuda_favor_saved_free",
                "pf_cuda_favor_saved_bytes")
        if self.cu is None or self.ctx is None:
            self.fb_why = "libperformer_cuda or a context of our own missing (see above)"
        elif not self.cu.has(*need):
            self.fb_why = "libperformer_cuda lacks " + ", ".join(
                n for n in need if not self.cu.has(n))
        else:
            self.fb_why = None
        if self.fb_why is None:
            rep.setup.append("forward + backward, ours: pf_cuda_favor_save + "
                             "pf_cuda_favor_backward (kept features) and pf_cuda_favor + "
                             "pf_cuda_favor_backward with saved NULL (rc: recomputed), through "
                             "ctypes on our own context; fwd: pf_cuda_favor alone, the same "
                             "context")
        else:
            rep.setup.append(f"forward + backward, ours: NOT AVAILABLE ({self.fb_why})")
        H, d = 2, 32 if not self.cuda else 64
        q, k, v = self.inputs(1, H, 256, d, d, seed=9)
        dout = self.cotangent(1, H, 256, d, seed=10)
        W = self.weights(d)
        try:
            g = self.pt_fb(q, k, v, W, True, dout)()
            bad = [n for n, x, y in zip(("dq", "dk", "dv"), g, (q, k, v))
                   if x is None or tuple(x.shape) != tuple(y.shape) or x.device != y.device
                   or not bool(t.isfinite(x.float()).all())]
            self.pt_fb_why = f"gradients {', '.join(bad)} wrong" if bad else None
        except Exception as e:  # noqa: BLE001
            self.pt_fb_why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if self.pt_fb_why is None:
            rep.setup.append("forward + backward, pt: performer.torch.attention(q, k, v, W=W, "
                             "causal=..., kernel='positive') under autograd, "
                             "torch.autograd.grad(out, (q, k, v), dout)")
        else:
            rep.setup.append(f"forward + backward, pt: not run (performer.torch under autograd "
                             f"on {self.dev.type}: {self.pt_fb_why[:200]})")
        rep.setup.append("forward + backward, SDPA and torch: torch.autograd.grad(out, (q, k, v),"
                         " dout) after the forward, SDPA held to the FlashAttention backend")
        log(rep.setup[-3])
        log(rep.setup[-2])

    def cotangent(self, B, H, L, dv, seed):
        """dout (B,H,L,dv): N(0, 1) entries in the run's dtype."""
        t = self.torch
        g = t.Generator(device=self.dev).manual_seed(seed)
        return t.randn((B, H, L, dv), generator=g, device=self.dev).to(self.dtype)

    def direct_fb(self, q, k, v, W, causal, dout, keep):
        """A function of no arguments running one forward and backward on our context, giving
        (out, dQ, dK, dV): pf_cuda_favor_save + pf_cuda_favor_backward on a saved made here
        (keep), else pf_cuda_favor + pf_cuda_favor_backward with saved NULL. Returns it and the
        saved (None unless keep), which the caller frees (cu.cuda_favor_saved_free)."""
        t, cu, ctx = self.torch, self.cu, self.ctx
        B, H, L, d = q.shape
        dv = v.shape[-1]
        sh, opts, fav = structs(cu.pl, B, H, L, d, dv, causal, W.data_ptr(), W.shape[0])
        code = {t.float32: 0, t.bfloat16: 1, t.float16: 2}[q.dtype]
        stream = t.cuda.current_stream().cuda_stream if self.cuda else None
        common = (code, ctypes.byref(sh), ctypes.byref(opts), ctypes.byref(fav))
        saved = None
        if keep:
            saved = ctypes.c_void_p()
            cu.check(cu.cuda_favor_saved_create(ctypes.byref(saved), ctx, *common),
                     "pf_cuda_favor_saved_create")
        qp, kp, vp, gp = q.data_ptr(), k.data_ptr(), v.data_ptr(), dout.data_ptr()

        def run():
            out = t.empty((B, H, L, dv), dtype=q.dtype, device=q.device)
            dq, dk, dvv = t.empty_like(q), t.empty_like(k), t.empty_like(v)
            if keep:
                cu.check(cu.cuda_favor_save(ctx, out.data_ptr(), qp, kp, vp, *common, saved,
                                            stream), "pf_cuda_favor_save")
            else:
                cu.check(cu.cuda_favor(ctx, out.data_ptr(), qp, kp, vp, *common, stream),
                         "pf_cuda_favor")
            cu.check(cu.cuda_favor_backward(ctx, dq.data_ptr(), dk.data_ptr(), dvv.data_ptr(),
                                            gp, qp, kp, vp, *common, saved, stream),
                     "pf_cuda_favor_backward")
            return out, dq, dk, dvv
        run.keep = (sh, opts, fav, q, k, v, W, dout)
        return run, saved

    def autograd_fb(self, f, q, k, v, dout):
        """A function of no arguments running out = f(q, k, v) under autograd and giving
        torch.autograd.grad(out, (q, k, v), dout) (leaves sharing q, k, v's storage)."""
        t = self.torch
        qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))

        def run():
            with t.enable_grad():
                o = f(qg, kg, vg)
                return t.autograd.grad(o, (qg, kg, vg), dout)
        return run

    def pt_fb(self, q, k, v, W, causal, dout):
        pt = self.pt
        return self.autograd_fb(
            lambda a, b, c: pt.attention(a, b, c, W=W, causal=causal, kernel="positive"),
            q, k, v, dout)

    def lib_bytes(self, run, saved=None):
        """Bytes our context holds after one run of this shape alone (trimmed before), plus the
        saved's; None if unknown."""
        cu = self.cu
        if not cu.has("pf_cuda_ctx_bytes", "pf_cuda_ctx_trim"):
            return None
        try:
            cu.cuda_ctx_trim(self.ctx)
            run()
            n = cu.cuda_ctx_bytes(self.ctx)
            cu.cuda_ctx_trim(self.ctx)
        except Exception as e:  # noqa: BLE001
            log(f"  workspace probe failed: {e}")
            return None
        return n + (cu.cuda_favor_saved_bytes(saved) if saved is not None else 0)

    def pt_bytes(self, run):
        """What performer.torch's context holds after one run alone (None if unreachable)."""
        if self.pc is None or not self.cuda:
            return None
        try:
            self.pc.trim()
            run()
            return self.pc.ctx_bytes(0)
        except Exception as e:  # noqa: BLE001
            log(f"  workspace probe failed: {e}")
            return None

    def fb_guard(self):
        """Gradients of one small case of each method against the pure-torch formulation in
        float32 (eps 0: the FAVOR+ estimator's own gradients) and, for SDPA, exact softmax's."""
        a, rep = self.args, self.rep
        B, H, d = 1, a.heads, a.dims[0]
        L = a.lengths[0]
        q, k, v = self.inputs(B, H, L, d, d, seed=13)
        dout = self.cotangent(B, H, L, d, seed=14)
        W = self.weights(d)
        f32 = [x.float() for x in (q, k, v)]
        g32 = dout.float()
        rep.fb_guard.append(f"B={B} H={H} L={L} d={d} m={a.features}, {a.dtype} inputs and dout;"
                            " normwise ||g - g_ref|| / ||g_ref|| of dQ, dK, dV; ref0: the "
                            "pure-torch formulation with eps 0 in float32, ref: with its eps")
        for causal in (False, True):
            mode = "causal" if causal else "bidirectional"

            def grads(f, xs, dy):
                return self.autograd_fb(f, *xs, dy)()
            ref0 = grads(lambda x, y, z: pp_attention(x, y, z, W, causal, eps=0.0), f32, g32)
            ref = grads(lambda x, y, z: pp_attention(x, y, z, W, causal), f32, g32)
            exact = grads(lambda x, y, z: exact_softmax(x, y, z, causal), f32, g32)
            items = []
            kept = None
            for meth, keep in (("ours", True), ("rc", False)):
                if self.fb_why is not None:
                    items.append((meth, f"not run: {self.fb_why}", None))
                    continue
                saved = None
                try:
                    run, saved = self.direct_fb(q, k, v, W, causal, dout, keep)
                    g = run()[1:]
                    items.append((meth, "ref0", [rel_diff(x, y) for x, y in zip(g, ref0)]))
                    if kept is None:
                        kept = g
                    else:
                        items.append((meth, "ours (kept)",
                                      [rel_diff(x, y) for x, y in zip(g, kept)]))
                except Exception as e:  # noqa: BLE001
                    items.append((meth, f"failed: {e}"[:200], None))
                finally:
                    if saved is not None:
                        self.cu.cuda_favor_saved_free(saved)
            if self.pt_fb_why is None:
                try:
                    g = self.pt_fb(q, k, v, W, causal, dout)()
                    items.append(("pt", "ref0", [rel_diff(x, y) for x, y in zip(g, ref0)]))
                except Exception as e:  # noqa: BLE001
                    items.append(("pt", f"failed: {e}"[:200], None))
            g = grads(lambda x, y, z: pp_attention(x, y, z, W, causal), (q, k, v), dout)
            items.append(("torch", "ref", [rel_diff(x, y) for x, y in zip(g, ref)]))
            try:
                sd = self.sdpa_fn  # sdpa_fn(q, k, v, causal) closes over its tensors: rebuild
                with self.sdpa_backend():
                    g = grads(lambda x, y, z: sd(x, y, z, causal)(), (q, k, v), dout)
                items.append(("SDPA", "exact softmax (fp32)",
                              [rel_diff(x, y) for x, y in zip(g, exact)]))
            except Exception as e:  # noqa: BLE001
                items.append(("SDPA", f"failed: {type(e).__name__}: {e}"[:200], None))
            items.append(("ref0", "exact softmax (fp32): the estimator's own error",
                          [rel_diff(x, y) for x, y in zip(ref0, exact)]))
            for meth, against, vals in items:
                txt = ("" if vals is None else
                       "dQ {:.2e}  dK {:.2e}  dV {:.2e}  ".format(*vals))
                rep.fb_guard.append(f"  {mode:13s} {meth:5s} "
                                    + (against if vals is None else f"{txt}vs {against}"))
                rep.row(section="guard_fwdbwd", mode=mode, method=meth, dtype=a.dtype, B=B,
                        H=H, L=L, d=d, dv=d, m=a.features,
                        status="ok" if vals is not None else "fail",
                        value="" if vals is None else max(vals), unit="rel_l2 (largest)",
                        note=against if vals is None else
                        f"{against}; dQ {vals[0]:.3e} dK {vals[1]:.3e} dV {vals[2]:.3e}")
        for line in rep.fb_guard:
            log(line)

    def config_fb(self, mode, B, d, L, phase_deadline, methods=FB_METHODS):
        """Forward + backward of every method at one configuration."""
        t, a = self.torch, self.args
        causal = mode == "causal"
        key = (mode, B, d, L)
        H = a.heads
        log(f"fwd+bwd {mode} B={B} H={H} d={d} L={L}" + (
            "" if "fb:ours" in methods else f" (again: {', '.join(methods)})"))
        self.rep.fb.setdefault(key, {})
        e = 2 if self.dtype != t.float32 else 4
        need = 4 * B * H * L * d * e + self.mem_estimate("fb:rc", B, H, L, d, a.features, causal)
        if need > 0.9 * self.free_bytes():
            for meth in methods:
                self.skip(key, meth, "memory: the inputs, dout, our output and gradients do "
                          "not fit")
            return
        seed = 2000 * B + 10 * d + int(math.log2(L))
        q, k, v = self.inputs(B, H, L, d, d, seed=seed)
        dout = self.cotangent(B, H, L, d, seed=seed + 1)
        W = self.weights(d)
        for meth in methods:
            if self.dead:
                return
            ours = meth in ("fb:fwd", "fb:ours", "fb:rc")
            if (ours and self.fb_why) or (meth == "fb:pt" and self.pt_fb_why):
                self.rep.fb[key][meth] = Res("n/a", note=self.fb_why or self.pt_fb_why)
                continue
            why = self.gate(key, meth, self.hard_deadline if ours else phase_deadline, causal)
            if why:
                self.skip(key, meth, why)
                continue
            pred = self.predict(meth, mode, B, d, L)
            saved = None
            try:
                if meth == "fb:fwd":
                    fn = self.direct(q, k, v, W, causal)
                    self.measure(key, meth, fn, pred, ws=lambda: self.lib_bytes(fn))
                elif meth in ("fb:ours", "fb:rc"):
                    fn, saved = self.direct_fb(q, k, v, W, causal, dout, meth == "fb:ours")
                    self.measure(key, meth, fn, pred,
                                 ws=lambda: self.lib_bytes(fn, saved))
                elif meth == "fb:pt":
                    fn = self.pt_fb(q, k, v, W, causal, dout)
                    self.measure(key, meth, fn, pred, ws=lambda: self.pt_bytes(fn))
                elif meth == "fb:sdpa":
                    fn = self.autograd_fb(lambda x, y, z: self.sdpa_fn(x, y, z, causal)(),
                                          q, k, v, dout)
                    with self.sdpa_backend():
                        self.measure(key, meth, fn, pred)
                elif meth == "fb:torch":
                    fn = self.autograd_fb(lambda x, y, z: pp_attention(x, y, z, W, causal),
                                          q, k, v, dout)
                    self.measure(key, meth, fn, pred)
            except self.oom:
                if self.cuda:
                    t.cuda.empty_cache()
                self.skip(key, meth, "out of memory", "oom")
            except Exception as e:  # noqa: BLE001
                self.skip(key, meth, f"{type(e).__name__}: {e}"[:160], "fail")
            finally:
                if saved is not None:
                    self.cu.cuda_favor_saved_free(saved)
            if self.cuda:
                t.cuda.empty_cache()

    # -- sweep --------------------------------------------------------------------------------
    def sweep(self):
        """The phases in priority order: the forward's (causal B=1, bidirectional B=1, causal
        B=8, ...), then the forward + backward's in the same order (--only keeps one kind), each
        given a share of the budget left; then the fill-in."""
        a = self.args
        kinds = {"all": ("fwd", "fb"), "fwd": ("fwd",), "fwdbwd": ("fb",)}[a.only]
        phases = []
        for kind in kinds:
            for B in a.batches:
                for mode in ("causal", "bidirectional"):
                    phases.append((kind, mode, B))
        weights = [PHASE_WEIGHTS[i % len(PHASE_WEIGHTS)] for i in range(len(phases))]
        for i, (kind, mode, B) in enumerate(phases):
            left = self.hard_deadline - now()
            share = left * weights[i] / sum(weights[i:])
            deadline = now() + share
            what = "forward" if kind == "fwd" else "forward + backward"
            log(f"== phase {i + 1}/{len(phases)}: {what}, {mode}, B={B}: {share:.0f} s of the "
                f"{left:.0f} s left")
            for L in a.lengths:
                for d in a.dims:
                    if self.dead:
                        break
                    (self.config if kind == "fwd" else self.config_fb)(mode, B, d, L, deadline)
                    if self.cuda:
                        self.torch.cuda.empty_cache()
            self.rep.write()
            if self.dead:
                break
        if not self.dead:
            self.fill_in(phases)
            self.rep.write()

    def fill_in(self, phases):
        """Runs again, while the budget lasts, the peer cases a phase's share skipped for time,
        in the phases' order and by increasing L."""
        order = {p: i for i, p in enumerate(phases)}
        todo = {}
        for mode, B, d, L, meth, why in self.rep.skips:
            if why.startswith("time:") and meth != "ours" and meth not in FB_OURS:
                kind = "fb" if meth.startswith("fb:") else "fwd"
                todo.setdefault((kind, mode, B, d, L), []).append(meth)
        if not todo:
            return
        log(f"== fill-in: {sum(map(len, todo.values()))} peer cases skipped for time, "
            f"{self.hard_deadline - now():.0f} s left")
        for item in sorted(todo, key=lambda k: (order[k[:3]], k[4], k[3])):
            kind, mode, B, d, L = item
            key = (mode, B, d, L)
            if self.dead or now() > self.hard_deadline - 1:
                break
            peers = ("sdpa", "torch", "fla") if kind == "fwd" else ("fb:pt", "fb:sdpa",
                                                                     "fb:torch")
            meths = [m for m in peers if m in todo[item]
                     and self.gate(key, m, self.hard_deadline, mode == "causal") is None]
            if meths:
                (self.config if kind == "fwd" else self.config_fb)(
                    mode, B, d, L, self.hard_deadline, tuple(meths))
                if self.cuda:
                    self.torch.cuda.empty_cache()

    # -- stage profile ------------------------------------------------------------------------
    def stage_profile(self):
        a, rep, cu = self.args, self.rep, self.cu
        d, B, H = a.dims[0], 1, a.heads
        L = None
        for Lc in reversed(a.lengths):
            need = 4 * B * H * Lc * d * 2 + (1 << 30)
            if need < 0.8 * self.free_bytes():
                L = Lc
                break
        if L is None:
            rep.profile.append("not run: no length fits")
            return
        names = (ctypes.c_char_p * PF_CUDA_STAGES)()
        dbl = ctypes.c_double * PF_CUDA_STAGES
        pc = self.pc
        if pc is not None and hasattr(pc, "profile") and hasattr(pc, "stages"):
            # performer.torch's context: pt.cuda_profile / pt.cuda_stage_times call these
            def prof(on):
                pc.profile(0, on)

            def read():
                return [tuple(x) for x in pc.stages(0)]
            via_pt = self.cuda and self.ours_via == "performer.torch"
            where = ("performer.torch's (performer._cuda.ctx(0)), read with performer._cuda."
                     "profile / stages (what pt.cuda_profile / pt.cuda_stage_times call); "
                     "forwards: " + ("performer.torch.attention" if via_pt
                                     else "pf_cuda_favor on that context"))
        elif self.ctx is not None and cu.has("pf_cuda_ctx_profile", "pf_cuda_ctx_stages"):
            via_pt = False

            def prof(on):
                cu.check(cu.cuda_ctx_profile(self.ctx, 1 if on else 0), "pf_cuda_ctx_profile")

            def read():
                ms, fl, by = dbl(), dbl(), dbl()
                cu.check(cu.cuda_ctx_stages(self.ctx, names, ms, fl, by), "pf_cuda_ctx_stages")
                return [((names[i] or b"?").decode(), ms[i], fl[i], by[i])
                        for i in range(PF_CUDA_STAGES)]
            where = ("our own, driving pf_cuda_favor (performer.torch's context is not "
                     "reachable)")
        else:
            rep.profile.append("not run: no context with pf_cuda_ctx_profile / _stages")
            return
        rep.profile.append(f"B={B} H={H} L={L} d={d} m={a.features}, {a.dtype}; context: "
                           + where)
        rep.profile.append("median over 5 forwards of each stage's time; TFLOP/s against the "
                           f"GEMM yardstick ({rep.gemm_tflops or 0:.0f}), GB/s against the copy "
                           f"bandwidth ({rep.copy_gbs or 0:.0f})")
        q, k, v = self.inputs(B, H, L, d, d, seed=5)
        W = self.weights(d)
        for causal in (False, True):
            mode = "causal" if causal else "bidirectional"
            if via_pt:
                fn = self.ours_fn(q, k, v, W, causal)
            elif pc is not None:
                fn = self.direct(q, k, v, W, causal, self.pt_ctx, self.pt_lock)
            else:
                fn = self.direct(q, k, v, W, causal)
            try:
                plain = self.clock.bench(fn)
                prof(True)
                try:
                    fn()
                    read()  # resets the sums
                    reads = []
                    for _ in range(5):
                        fn()
                        reads.append(read())
                    profiled = self.clock.bench(fn)
                finally:
                    prof(False)
            except Exception as e:  # noqa: BLE001
                rep.profile.append(f"{mode}: failed ({type(e).__name__}: {e})")
                continue
            rep.profile.append("")
            rep.profile.append(f"{mode}: forward {plain.med * 1e3:.3f} ms unprofiled, "
                               f"{profiled.med * 1e3:.3f} ms with the stage events")
            rep.profile.append(f"  {'stage':14s} {'ms':>9} {'share':>6} {'GFLOP':>9} "
                               f"{'TFLOP/s':>8} {'of GEMM':>8} {'MB':>9} {'GB/s':>7} "
                               f"{'of copy':>8}")
            rows = []
            for i in range(len(reads[0])):
                nm = reads[0][i][0] or "?"
                sm, f, b = (statistics.median(r[i][j] for r in reads) for j in (1, 2, 3))
                rows.append((nm, sm, f, b))
            tot = sum(r[1] for r in rows)
            for nm, sm, f, b in rows:
                sec = sm * 1e-3
                tf = f / sec / 1e12 if sec > 0 and f > 0 else None
                gb = b / sec / 1e9 if sec > 0 and b > 0 else None
                ofg = tf / rep.gemm_tflops if tf and rep.gemm_tflops else None
                ofc = gb / rep.copy_gbs if gb and rep.copy_gbs else None
                rep.profile.append(
                    f"  {nm:14s} {fmt(sm)} {fmt(100 * sm / tot if tot else None, 5)}% "
                    f"{fmt(f / 1e9 if f else None)} {fmt(tf, 8)} "
                    f"{fmt(None if ofg is None else f'{100 * ofg:.0f}%', 8)} "
                    f"{fmt(b / 1e6 if b else None)} {fmt(gb, 7)} "
                    f"{fmt(None if ofc is None else f'{100 * ofc:.0f}%', 8)}")
                rep.row(section="stages", mode=mode, method=nm, dtype=a.dtype, B=B, H=H, L=L,
                        d=d, dv=d, m=a.features, status="ok", ms_median=sm,
                        value=tf if tf is not None else (gb if gb is not None else ""),
                        unit="TFLOP/s" if tf is not None else ("GB/s" if gb is not None
                                                                else ""),
                        note=f"flops={f:.4g} bytes={b:.4g}")
            rep.profile.append(f"  {'sum':14s} {fmt(tot)}")
        for line in rep.profile:
            log(line)

    # -- decoding -----------------------------------------------------------------------------
    def decoding(self):
        t, a, rep, cu = self.torch, self.args, self.rep, self.cu
        ctx = self.ctx if self.ctx is not None else self.pt_ctx
        if cu is None or ctx is None or not cu.has("pf_cuda_favor_state_create",
                                                    "pf_cuda_favor_state_step"):
            rep.decode.append("not run: libperformer_cuda, a context or its decoding functions "
                              "missing")
            return
        import performer
        H, d, m = a.heads, a.dims[0], a.features
        r = performer.kernel_width("positive", m)
        W = self.weights(d)
        steps = a.decode_steps
        rep.decode.append(f"H={H} d=dv={d} m={m} (r={r}); median over {steps} steps after 20 "
                          "warm-up steps of each call's wall time (the call waits for its "
                          "stream)")
        rep.decode.append("state bytes = 2 N H r (dv + 1) 4 (read + written), against the copy "
                          f"bandwidth ({rep.copy_gbs or 0:.0f} GB/s)")
        rep.decode.append("")
        rep.decode.append(f"  {'dtype':5s} {'N':>5} {'us/step':>9} {'min us':>8} "
                          f"{'tokens/s':>11} {'state MB':>9} {'GB/s':>7} {'of copy':>8}")
        stream = t.cuda.current_stream().cuda_stream if self.cuda else None
        for dtn in ("bf16", "fp32"):
            dt = {"bf16": t.bfloat16, "fp32": t.float32}[dtn]
            for N in a.decode_n:
                st_p = ctypes.c_void_p()
                fav = cu.pl.lib.pf_favor_opts_default()
                fav.kernel, fav.W, fav.m, fav.eps = 0, W.data_ptr(), m, 0.0
                try:
                    cu.check(cu.cuda_favor_state_create(ctypes.byref(st_p), ctx, N, H, d, d,
                                                        0.0, ctypes.byref(fav)),
                             "pf_cuda_favor_state_create")
                except Exception as e:  # noqa: BLE001
                    rep.decode.append(f"  {dtn:5s} {N:>5} failed: {e}")
                    continue
                try:
                    g = t.Generator(device=self.dev).manual_seed(N)
                    q, k, v = ((t.randn((N, H, d), generator=g, device=self.dev) * s).to(dt)
                               for s in (QK_SCALE, QK_SCALE, 1.0))
                    out = t.empty((N, H, d), dtype=dt, device=self.dev)
                    args = (st_p, out.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), None,
                            DTYPES[dtn], stream)
                    step = cu.cuda_favor_state_step
                    self.clock.sync()
                    for _ in range(20):
                        cu.check(step(*args), "pf_cuda_favor_state_step")
                    ts = []
                    pc = time.perf_counter
                    for _ in range(steps):
                        t0 = pc()
                        s = step(*args)
                        ts.append(pc() - t0)
                        if s:
                            cu.check(s, "pf_cuda_favor_state_step")
                    med = statistics.median(ts)
                    nbytes = 2 * N * H * r * (d + 1) * 4
                    gbs = nbytes / med / 1e9
                    of = gbs / rep.copy_gbs if rep.copy_gbs else None
                    rep.decode.append(
                        f"  {dtn:5s} {N:>5} {fmt(med * 1e6)} {fmt(min(ts) * 1e6, 8)} "
                        f"{N / med:>11.3g} {fmt(nbytes / 1e6)} {fmt(gbs, 7)} "
                        f"{fmt(None if of is None else f'{100 * of:.1f}%', 8)}")
                    rep.row(section="decode", method="pf_cuda_favor_state_step", dtype=dtn,
                            H=H, d=d, dv=d, m=m, N=N, status="ok", ms_median=med * 1e3,
                            ms_min=min(ts) * 1e3, runs=steps, tokens_per_s=N / med, value=gbs,
                            unit="GB/s state", note=f"state bytes {nbytes}")
                    if dtn == "bf16" and N == 64 and H == 16:
                        self.decode64 = med
                except Exception as e:  # noqa: BLE001
                    rep.decode.append(f"  {dtn:5s} {N:>5} failed: {e}")
                finally:
                    cu.cuda_favor_state_free(st_p)
        for line in rep.decode:
            log(line)

    # -- targets ------------------------------------------------------------------------------
    def targets(self):
        rep, a = self.rep, self.args
        out = rep.targets

        def verdict(ok):
            return "PASS" if ok else "MISS"

        def ratios(meth, pred, ref="ours", table=None, modes=("causal",)):
            """(time of meth / time of ref, B, d, L) over the cases of table where both ran."""
            res = []
            for (mode, B, d, L), rs in sorted((rep.fwd if table is None else table).items()):
                if mode not in modes or not pred(L):
                    continue
                o, p = rs.get(ref), rs.get(meth)
                if o is not None and p is not None and o.status == "ok" and p.status == "ok":
                    res.append((p.t.med / o.t.med, B, d, L))
            return res

        def line(name, rs, bound, full, most=False):
            """PASS when the lowest ratio is >= bound (most: the highest is <= bound)."""
            if not rs:
                out.append(f"NOT MEASURED  {name}")
                rep.row(section="target", method=name, status="not measured")
                return
            worst = max(rs) if most else min(rs)
            ok = worst[0] <= bound if most else worst[0] >= bound
            where = f"B={worst[1]} d={worst[2]} L={worst[3]}" + "".join(
                f" {x}" for x in worst[4:])
            out.append(f"{verdict(ok)}  {name}: {'highest' if most else 'lowest'} "
                       f"{worst[0]:.2f}x ({where}) over {len(rs)} cases"
                       f"{'' if full else ' measured'}")
            rep.row(section="target", method=name, status=verdict(ok), value=worst[0],
                    unit="x", note=f"{where}; {len(rs)} cases")

        def info(name, rs, most=False):
            if rs:
                worst = max(rs) if most else min(rs)
                out.append(f"      {name}: {'highest' if most else 'lowest'} {worst[0]:.2f}x "
                           f"(B={worst[1]} d={worst[2]} L={worst[3]}) over {len(rs)} cases")

        if a.only != "fwdbwd":
            big = 4096 if self.cuda else a.lengths[0]
            at = 65536 if self.cuda else a.lengths[-1]
            line(f"causal FAVOR+ faster than SDPA (flash) from L = {big} on",
                 ratios("sdpa", lambda L: L >= big), 1.0 + 1e-9, False)
            line(f"causal FAVOR+ >= 10x SDPA (flash) at L = {at}",
                 ratios("sdpa", lambda L: L == at), 10.0, False)
            line("causal FAVOR+ >= 5x the pure-torch formulation (performer-pytorch, bf16)",
                 ratios("torch", lambda L: True), 5.0, False)
            t64 = self.decode64
            if t64 is None:
                out.append("NOT MEASURED  one decode step of 64 x 16 (bf16) under 50 us")
            else:
                ok = t64 < 50e-6
                out.append(f"{verdict(ok)}  one decode step of 64 x {a.heads} (bf16) under "
                           f"50 us: {t64 * 1e6:.1f} us")
                rep.row(section="target", method="decode step 64 x 16 bf16 < 50 us",
                        status=verdict(ok), value=t64 * 1e6, unit="us")
        if a.only != "fwd":
            fb = rep.fb
            both = ("causal", "bidirectional")
            big = FB_FROM_L if self.cuda else a.lengths[0]
            line(f"causal forward + backward faster than SDPA (flash) from L = {big} on "
                 "(ours, kept features)",
                 ratios("fb:sdpa", lambda L: L >= big, "fb:ours", fb), 1.0 + 1e-9, False)
            info("recomputed features (rc)", ratios("fb:sdpa", lambda L: L >= big, "fb:rc", fb))
            line(f"forward + backward <= {FB_OVER_FWD:g}x the forward (ours, kept features; "
                 "both modes)",
                 ratios("fb:ours", lambda L: True, "fb:fwd", fb, both), FB_OVER_FWD, False,
                 most=True)
            info("recomputed features (rc)",
                 ratios("fb:rc", lambda L: True, "fb:fwd", fb, both), most=True)
            growth = []
            for meth in ("fb:ours", "fb:rc"):
                series = {}
                for (mode, B, d, L), rs in sorted(fb.items()):
                    r = rs.get(meth)
                    if r is not None and r.status == "ok" and r.peak is not None:
                        series.setdefault((mode, B, d), []).append(
                            (L, (r.peak + (r.ws or 0)) / (B * L)))
                for (mode, B, d), pts in series.items():
                    for (L0, b0), (L1, b1) in zip(pts, pts[1:]):
                        growth.append((b1 / b0, B, d, L1, mode, meth[3:]))
            line(f"memory linear in L (ours, kept and recomputed): bytes per token at most "
                 f"{FB_MEM_GROWTH:g}x those at the L before, in every series",
                 growth, FB_MEM_GROWTH, False, most=True)
        for x in out:
            print(x, flush=True)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the report here too, at the end of a complete run "
                    "(OUT.partial while it runs, and if it stops short)")
    ap.add_argument("--csv", help="write every measurement here (likewise CSV.partial)")
    ap.add_argument("--budget", type=float, default=200.0,
                    help="seconds of wall time for the whole run (default 200)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None)
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, tiny sizes: checks the code paths without a GPU")
    ap.add_argument("--lengths", help="comma-separated L (default 1024..131072)")
    ap.add_argument("--batches", help="comma-separated B (default 1,8)")
    ap.add_argument("--dims", help="comma-separated d = dv (default 64,128)")
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--features", type=int, default=None, help="m (default 256)")
    ap.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    ap.add_argument("--lib", help="libperformer_cuda's path (default: as performer finds it)")
    ap.add_argument("--no-fla", action="store_true", help="leave flash-linear-attention out")
    ap.add_argument("--ours", choices=("auto", "torch", "direct"), default="auto",
                    help="how ours is called: performer.torch.attention, else pf_cuda_favor "
                         "through ctypes (auto); only the one (torch); always the latter")
    ap.add_argument("--fla-first-s", type=float, default=25.0,
                    help="time a phase must have left to start fla's first call of a shape")
    ap.add_argument("--decode-steps", type=int, default=200)
    ap.add_argument("--only", choices=("all", "fwd", "fwdbwd"), default="all",
                    help="fwd: the forward sweep, its guard, the stage profile and decoding; "
                         "fwdbwd: the forward + backward sweep and its guard; all: both "
                         "(default)")
    a = ap.parse_args(argv)
    if a.device is None:
        a.device = "cpu" if a.dry_run else "cuda"
    dry = a.device == "cpu"

    def ints(s, default):
        return [int(x) for x in s.split(",")] if s else list(default)

    a.lengths = sorted(ints(a.lengths, (128, 256, 512) if dry
                            else [1024 << i for i in range(8)]))
    a.batches = ints(a.batches, (1, 2) if dry else (1, 8))
    a.dims = ints(a.dims, (16, 32) if dry else (64, 128))
    a.heads = a.heads or (2 if dry else 16)
    a.features = a.features or (32 if dry else 256)
    a.decode_n = (1, 4) if dry else (1, 64, 256)
    return a


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch
    torch.set_grad_enabled(False)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_cuda: torch sees no CUDA device (use --dry-run on a machine without one)",
              file=sys.stderr, flush=True)
        return 2
    run = Run(args)
    rep = run.rep

    def alarm(signum, frame):
        raise BudgetExceeded()
    signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, max(1.0, args.budget - 3.0 - now()))
    try:
        return _main(args, run, rep)
    except BudgetExceeded:
        rep.complete = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        log(f"budget of {args.budget:.0f} s reached: writing what was measured")
        try:
            rep.targets = []
            run.targets()
        except Exception as e:  # noqa: BLE001
            log(f"targets: {e}")
        text = rep.write()
        print("\n" + text, flush=True)
        return 3
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _main(args, run, rep):
    run.header()
    rep.write()
    run.yardsticks()
    rep.write()
    if args.no_fla or args.only == "fwdbwd":
        run.fla, run.fla_why = None, ("left out (--no-fla)" if args.no_fla
                                      else "left out (--only fwdbwd)")
    else:
        t0 = time.perf_counter()
        fn, info = import_fla(FLA_CONFIGS)
        if fn is None:
            run.fla, run.fla_why = None, f"not importable ({info})"
            rep.setup.append(f"flash-linear-attention: not importable ({info})")
        else:
            run.fla, run.fla_why = fn, ""
            rep.setup.append(f"flash-linear-attention {info}: fla.ops.linear_attn."
                             "chunk_linear_attn(q, k, v, scale=1.0, normalize=True) on (B, L, H, "
                             f"K) tensors; imported in {time.perf_counter() - t0:.1f} s")
        print(rep.setup[-1], flush=True)
    run.setup_ours()
    rep.write()
    if args.only != "fwd":
        run.setup_fb()
        rep.write()
    if args.only != "fwdbwd":
        run.correctness()
        rep.write()
    if args.only != "fwd":
        run.fb_guard()
        rep.write()
    if args.only != "fwdbwd":
        run.decoding()
        rep.write()
        run.stage_profile()
        rep.write()
    run.sweep()
    run.targets()
    rep.complete = not run.dead
    if run.ctx is not None and run.cu is not None and run.cu.has("pf_cuda_ctx_free"):
        run.cu.cuda_ctx_free(run.ctx)
    text = rep.write(final=True)
    print("\n" + text, flush=True)
    return 0 if run.ours_via and not run.dead else 1


if __name__ == "__main__":
    sys.exit(main())
