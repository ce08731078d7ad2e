"""performer.torch: FAVOR+ and exact attention for PyTorch, forward and backward in the C kernels.

    import torch, performer, performer.torch as pt
    W = torch.from_numpy(performer.projection(256, 64, seed=0))
    out = pt.attention(q, k, v, W=W, causal=True)      # q, k, v (B,H,L,d), requires_grad
    out.sum().backward()                               # pf_attn_favor_backward_saved

    attn = pt.FastAttention(dim_heads=64, causal=True)  # performer-pytorch's module, same call
    out = attn(q, k, v)

    with pt.patch_performer_pytorch():                 # performer-pytorch's models on it
        model = performer_pytorch.PerformerLM(...)
    model = pt.convert_performer_pytorch(built_model)  # or convert one already built

    qc, kc, vc = (x.cuda().requires_grad_() for x in (q, k, v))  # CUDA tensors: on the GPU
    out = pt.attention(qc, kc, vc, W=W, causal=True)   # pf_cuda_favor_save
    out.sum().backward()                               # pf_cuda_favor_backward
    with torch.autocast("cuda", dtype=torch.bfloat16):  # q, k, v cast to bfloat16, as a matmul's
        out = attn.cuda()(qc, kc, vc)

Tensors: CPU, strided. float32 in C order is passed to C as it is (zero copy); float64,
float16 and bfloat16 are converted to float32 (by a differentiable .to(), so gradients come
back in the input's dtype, and the output is in q's dtype); a non-contiguous tensor is made
contiguous once. Without grad, contiguous float16 or bfloat16 q, k, v (one dtype) with a
FAVOR+ map other than FAVOR++/FAVOR# are read in place by pf_attn_favor_dt, a block of rows
widened to float32 at a time, no copy: the output is the float32 computation's rounded once. Other dtypes (integers, complex) and tensors on another device (meta, ...)
are refused with TypeError. Shapes as in performer.attention: (L,d), (H,L,d) or (B,H,L,d).

CUDA tensors run FAVOR+ forward and backward in libperformer_cuda (include/performer_cuda.h,
built by `make` where nvcc is found; loaded on the first CUDA call, never by importing this
module, and a RuntimeError saying how to get it when it is missing). q, k and v on one CUDA
device (else ValueError naming their devices) and of one dtype, float32, bfloat16 or float16,
used as they are (TypeError for a mix, or float64: cast it); the output is in that dtype,
allocated by torch on the device. Inside torch.autocast("cuda", dtype=bfloat16 or float16) the
inputs are first cast to the autocast dtype (by a differentiable .to(), as autocast casts a
matmul's: float32 and the other half type are cast, float64 is not, and is refused), so the call
runs and returns in it. The calls run on the device's current stream
(torch.cuda.current_stream, so inside `with torch.cuda.stream(s)` on s; a backward on its
forward's stream, as torch's autograd runs it) and return when that stream has finished them:
the library reads its error flags back at the end. float32 products use TF32 when torch allows
it for cuBLAS matmuls (torch.backends.cuda.matmul.allow_tf32, or fp32_precision = "tf32"), read
at each call, backward included. Kernels positive, hyperbolic, trig and relu (FAVOR++ and
FAVOR# are CPU only); method "exact" is NotImplementedError on the GPU
(torch.nn.functional.scaled_dot_product_attention is exact attention there). W, a constant, may
be on the CPU or any CUDA device in any float dtype: a float32 contiguous W on q's device is
used as it is, any other is copied there once and the copy kept until W changes (see _cuda_w).
cuda_available(), cuda_profile() and cuda_stage_times() say whether the GPU path can run and
what its forward stages cost.

Training on CUDA tensors (grad mode on and q, k or v requiring grad): the forward keeps every
head's features on the device for the backward (pf_cuda_favor_save: 2 L r elements a head,
bfloat16 for half inputs, float32 otherwise, and 3 L floats) when pf_cuda_favor_saved_size says
they fit save_bytes (None: SAVE_BYTES; 0: always), and when the device has the memory; else
the backward recomputes them from q, k and W (pf_cuda_favor_backward with no saved features;
the same gradients to float rounding, for the cost of the two projections again). Unlike the
CPU's budget, which keeps as many heads as fit, the GPU keeps all or none. The first backward
frees the kept features as soon as it has run (the memory goes back to the device during the
backward pass, layer by layer); a second backward of the same graph (retain_graph=True)
recomputes them. Features kept by a forward never backpropagated are freed with its graph.
Gradients come in the inputs' dtype (dout is cast to the forward's dtype and made contiguous
first); products accumulate in float32. q, k, v and W are saved for the backward, so changing
one in place before it is torch's RuntimeError; a NaN or Inf in the upstream gradient is
FloatingPointError. Double backward is not supported (as on the CPU).

Threads: `threads=None`, the default, is torch.get_num_threads() read at each call in the
calling thread (a backward runs on its forward's count): the threads torch's own CPU operators
use, set by torch.set_num_threads(n) (or OMP_NUM_THREADS before torch starts), so the attention
runs on the threads the rest of the model runs on, and a process told to use n threads (one of
several training processes on a machine, say) uses n here too. torch's default may be fewer than
the cores: torch 1.13 takes OMP_NUM_THREADS, else MKL_NUM_THREADS, else half of the logical
CPUs on x86 (it assumes two hardware threads a core), so 1 on a 2-CPU machine without SMT; call
torch.set_num_threads(len(os.sched_getaffinity(0))) for every core, or pass threads=n. Whatever
sets the calling thread's OpenMP count changes it too: with Debian's OpenMP build of OpenBLAS
(libopenblas0-openmp), openblas_set_num_threads(n) is omp_set_num_threads(n), torch's count.
Results do not depend on it (the GPU ignores it). ctypes releases the GIL during the C call.

Errors are performer's (performer.Error subclasses that are ValueError, MemoryError,
FloatingPointError, ... as the status says; on the GPU with pf_cuda_last_error()'s words in the
message).

Repeated calls: a call with the shapes and options of an earlier one (and the same W tensor,
or one at the same address) reuses its checked arguments and C structs, and a FAVOR+ forward
reuses the kept-feature storage an earlier backward of the same plan handed back, as a C
training loop keeps one pf_favor_saved: the results are the same bits. The storage held
between calls is bounded by POOL_BYTES (1 GiB) in all; empty_cache() frees it and the plans
(and, on the GPU, the device copies of W and the library's workspaces), pooled_bytes() says
how much is held.
"""
import collections
import ctypes
import math
import threading
import weakref

import numpy as np
import torch
from torch.autograd.function import once_differentiable

import performer as _pf
from . import _cuda, _lib

__all__ = ["attention", "FastAttention", "SAVE_BYTES", "POOL_BYTES", "empty_cache",
           "pooled_bytes", "cuda_available", "cuda_profile", "cuda_stage_times", "StageTime",
           "patch_performer_pytorch", "convert_performer_pytorch", "PerformerPytorchPatch"]

_L = _lib.lib
_P = ctypes.byref

#: The default memory budget of one FAVOR+ call's kept features (bytes): heads whose features
#: fit are kept for the backward (6 units of L d r matrix work instead of 9, bidirectional),
#: the others recomputed there (the same bits). 0 means no limit.
SAVE_BYTES = 1 << 30

#: Kept-feature storage held between calls for reuse (bytes, every plan's pool together): a
#: backward hands its storage back and the next forward of the same shapes and options fills it
#: again, as a C training loop keeps one pf_favor_saved. empty_cache() frees it.
POOL_BYTES = 1 << 30

_CONVERTED = (torch.float64, torch.float16, torch.bfloat16)


def _t32(x, name):
    """x as a contiguous float32 CPU tensor (itself if it is one), through differentiable ops."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_cpu:
        raise TypeError(f"{name} is on {x.device}: performer.torch runs on the CPU, or on CUDA "
                        "when q, k and v are CUDA tensors; move it with .cpu()")
    if x.layout is not torch.strided:
        raise TypeError(f"{name} has layout {x.layout}: dense (strided) tensors only")
    if x.dtype is not torch.float32:
        if x.dtype not in _CONVERTED:
            raise TypeError(f"{name}: dtype {x.dtype} is not supported: float32 (used as it "
                            "is), or float64, float16, bfloat16 (converted to float32)")
        x = x.to(torch.float32)
    return x if x.is_contiguous() else x.contiguous()


def _threads(threads):
    return torch.get_num_threads() if threads is None else threads


def _nonfinite(st, function, named):
    arrays = tuple((n, t.detach().numpy()) for n, t in named if t is not None)
    _pf._raise(st, function, arrays)


class _Plan:
    """The C structs of one call and what they point into (kept alive with them): sh, opts,
    fav, key_len; args, the pointers to the structs as the C calls take them (made once);
    W, the float32 copy of a converted W (None when the caller's W is used as it is); pool,
    cleared kept-feature storage for this plan's next forwards; live, whether the plan is in
    the cache (storage given back to a plan out of it is freed)."""

    __slots__ = ("sh", "opts", "fav", "key_len", "oshape", "budget", "W", "args", "pool", "live")


def _plan(q, k, v, W, *, method, causal, kernel, key_lengths, scale, eps, chunk, oprf_a,
          threads, save_bytes):
    p = _Plan()
    p.sh = _pf._shape(q, k, v, causal)
    if isinstance(key_lengths, torch.Tensor):
        key_lengths = key_lengths.detach().cpu().numpy()
    p.key_len = _pf._key_lengths(key_lengths, p.sh)
    p.opts = _pf._attn_opts(p.sh, scale, causal, p.key_len, _threads(threads))
    p.oshape = tuple(q.shape[:-1]) + (p.sh.dv,)
    p.fav, p.W, p.pool, p.live = None, None, [], False
    if method == "favor":
        if W is None:
            raise ValueError("method='favor' needs W (m,d) or (H,m,d): performer.projection(m, d) "
                             "or a FastAttention's projection_matrix")
        Wt = _t32(W, "W")
        p.fav, _ = _pf._favor_opts(p.sh, kernel=kernel, W=Wt.detach().numpy(), features=256,
                                   proj="orthogonal", norm="chi", seed=0, eps=eps, chunk=chunk,
                                   oprf_a=oprf_a, causal=causal)
        if Wt is not W:  # a converted copy: the plan keeps it (fav points into it)
            p.W = Wt.detach()
        p.budget = SAVE_BYTES if save_bytes is None else int(save_bytes)
        if p.budget < 0:
            raise ValueError(f"save_bytes must be >= 0, got {save_bytes}")
        p.args = (_P(p.sh), _P(p.opts), _P(p.fav))
    elif method == "exact":
        if W is not None or kernel != "positive" or eps != 0 or chunk != 0 or oprf_a is not None:
            raise ValueError("W, kernel, eps, chunk and oprf_a are for method='favor' only")
        p.args = (_P(p.sh), _P(p.opts))
    else:
        raise ValueError(f"method '{method}' is not known here: 'favor' or 'exact'")
    return p


# ---- plans kept for repeated calls ------------------------------------------------------------
#
# A training or inference loop calls attention() with the same shapes and options again and
# again. Checking them and making the C structs costs more than the C call on small inputs, so
# a plan is kept under a key of everything it was made from, and a call that finds its key runs
# at once. What may go into a key is what compares by value: numbers, strings and None (an
# option of any other type, a tensor as scale say, is checked and planned at every call), key
# lengths as a tuple of ints (from a list of ints or a 1-D integer tensor or array), and W by its
# address and shape when it is used as it is (float32, contiguous, CPU): the structs hold only
# that address and shape, nothing computed from W's values, so W may change in place between
# calls (a redrawn projection) and a key that matches is right by construction. A W that must
# be converted is converted at every call (not kept). At most _PLANS_MAX plans are kept, the
# oldest dropped first. The kept features' storage (pf_favor_saved) is pooled per plan: a
# backward hands it back cleared (pf_favor_saved_clear) and the next forward of that plan fills
# it again, instead of allocating and first touching up to SAVE_BYTES at each call (tens of
# milliseconds at L = 4096); POOL_BYTES bounds what the pools hold between calls, empty_cache()
# frees it.

_PLANS = {}
_PLANS_MAX = 64
_LOCK = threading.Lock()
_pooled = [0]  # bytes held by every plan's pool
_PLAIN = frozenset((type(None), bool, int, float, str))
_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _key_lengths_key(kl):
    """key_lengths as a hashable tuple of ints, None for None, or False when it cannot be one
    (the call is then planned without the cache, and its checks say what is wrong)."""
    if kl is None:
        return None
    if isinstance(kl, torch.Tensor):
        ok = kl.ndim == 1 and kl.dtype in _INT_DTYPES
    elif isinstance(kl, np.ndarray):
        ok = kl.ndim == 1 and kl.dtype.kind in "iu"
    elif isinstance(kl, (list, tuple)):
        ok = all(type(x) is int for x in kl)
    else:
        ok = False
    return tuple(kl.tolist() if hasattr(kl, "tolist") else kl) if ok else False


def _plan_key(q, k, v, W, method, causal, kernel, key_lengths, scale, eps, chunk, oprf_a, th,
              save_bytes):
    """The cache key of a call, or None when it has none (see above)."""
    if type(chunk) is not int or type(th) is not int:
        return None
    for x in (method, kernel, scale, eps, oprf_a, save_bytes):
        if type(x) not in _PLAIN:
            return None
    if W is None:
        wkey = None
    elif isinstance(W, torch.Tensor) and W.dtype is torch.float32 and W.is_cpu \
            and W.layout is torch.strided and W.is_contiguous():
        wkey = (W.data_ptr(), W.shape)
    else:
        return None
    kl = _key_lengths_key(key_lengths)
    if kl is False:
        return None
    return (method, kernel, True if causal else False, q.shape, k.shape, v.shape, kl, scale,
            eps, chunk, oprf_a, th, SAVE_BYTES if save_bytes is None else save_bytes, wkey)


def _drain(p):
    """Takes p out of use: its pooled storage is freed (the caller holds _LOCK)."""
    p.live = False
    for s in p.pool:
        _pooled[0] -= s.nbytes
        s.free()
    p.pool.clear()


def _remember(key, p):
    with _LOCK:
        if key in _PLANS:
            return _PLANS[key]
        while len(_PLANS) >= _PLANS_MAX:
            _drain(_PLANS.pop(next(iter(_PLANS))))
        p.live = True
        _PLANS[key] = p
    return p


def _take_saved(p):
    """Cleared kept-feature storage for a forward of p: from its pool, else new."""
    if p.pool:
        with _LOCK:
            if p.pool:
                s = p.pool.pop()
                _pooled[0] -= s.nbytes
                return s
    return _pf._Saved(p.sh, p.opts, p.fav, p.budget)


def _give_back(p, s):
    """Returns storage a forward filled: cleared into p's pool while it fits, else freed."""
    _L.pf_favor_saved_clear(s.ptr)
    with _LOCK:
        if p.live and len(p.pool) < 4 and _pooled[0] + s.nbytes <= POOL_BYTES:
            p.pool.append(s)
            _pooled[0] += s.nbytes
            return
    s.free()


def empty_cache():
    """Frees what performer.torch keeps between calls: the plans and the pooled kept-feature
    storage (at most POOL_BYTES), and on the GPU the device copies of W and libperformer_cuda's
    workspaces (its contexts stay). Calls after it plan and allocate again; a backward still to
    come frees its own storage."""
    with _LOCK:
        for p in _PLANS.values():
            _drain(p)
        _PLANS.clear()
        _W_CACHE.clear()
    if _cuda.is_loaded():
        _cuda.trim()


def pooled_bytes():
    """Bytes of kept-feature storage pooled for reuse now (at most POOL_BYTES)."""
    return _pooled[0]


def _named(q, k, v, W):
    return (("q", q), ("k", k), ("v", v), ("W", W))


def _dout32(dout):
    if dout.dtype is not torch.float32:
        dout = dout.to(torch.float32)
    return dout if dout.is_contiguous() else dout.contiguous()


def _favor_backward(ctx, dout):
    q, k, v, out, W = ctx.saved_tensors  # torch checks that none was changed in place since
    p = ctx.plan
    dout = _dout32(dout)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    args = (dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), dout.data_ptr(), q.data_ptr(),
            k.data_ptr(), v.data_ptr(), out.data_ptr()) + p.args
    kept, ctx.kept = ctx.kept, None
    if kept is not None:
        st = _L.pf_attn_favor_backward_saved(*args, kept.ptr)
        _give_back(p, kept)
        fn = "pf_attn_favor_backward_saved"
    else:
        st = _L.pf_attn_favor_backward(*args)
        fn = "pf_attn_favor_backward"
    if st:
        _nonfinite(st, fn, (("q", q), ("k", k), ("v", v), ("dout", dout)))
    return dq, dk, dv, None


_favor_backward_once = once_differentiable(_favor_backward)


class _FavorFunction(torch.autograd.Function):
    """FAVOR+ whose forward keeps the features (pf_attn_favor_save, within the plan's budget)
    and whose backward is pf_attn_favor_backward_saved. The kept features go back to the
    plan's pool after the first backward; a second one (retain_graph=True) recomputes them
    with pf_attn_favor_backward, which gives the same bits. W is a constant (no gradient): it
    comes with the plan, pw = (plan, W as the C call reads it), and is saved for the backward
    like q, k and v, so an in-place change to any of them before the backward is an error."""

    @staticmethod
    def forward(ctx, q, k, v, pw):
        p, W = pw
        saved = _take_saved(p)
        out = torch.empty(p.oshape, dtype=torch.float32)
        st = _L.pf_attn_favor_save(out.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                   *p.args, saved.ptr)
        if st:
            _give_back(p, saved)
            _nonfinite(st, "pf_attn_favor_save", _named(q, k, v, W))
        ctx.save_for_backward(q, k, v, out, W)
        ctx.plan, ctx.kept = p, saved
        return out

    @staticmethod
    def backward(ctx, dout):
        # create_graph=True runs the backward in grad mode: once_differentiable then makes a
        # second differentiation an error; otherwise its wrapper (a no_grad block) is skipped
        if torch.is_grad_enabled():
            return _favor_backward_once(ctx, dout)
        return _favor_backward(ctx, dout)


def _exact_backward(ctx, dout):
    q, k, v, out, lse = ctx.saved_tensors
    p = ctx.plan
    dout = _dout32(dout)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    st = _L.pf_attn_exact_backward(dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), dout.data_ptr(),
                                   q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                   lse.data_ptr(), *p.args)
    if st:
        _nonfinite(st, "pf_attn_exact_backward", (("q", q), ("k", k), ("v", v), ("dout", dout)))
    return dq, dk, dv, None


_exact_backward_once = once_differentiable(_exact_backward)


class _ExactFunction(torch.autograd.Function):
    """Exact softmax attention: online-softmax forward keeping the log-sum-exp of each row,
    flash-style backward (pf_attn_exact_backward) recomputing the scores block by block."""

    @staticmethod
    def forward(ctx, q, k, v, p):
        lse = torch.empty(tuple(q.shape[:-1]), dtype=torch.float32)
        out = torch.empty(p.oshape, dtype=torch.float32)
        st = _L.pf_attn_exact(out.data_ptr(), lse.data_ptr(), q.data_ptr(), k.data_ptr(),
                              v.data_ptr(), *p.args)
        if st:
            _nonfinite(st, "pf_attn_exact", _named(q, k, v, None))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan = p
        return out

    @staticmethod
    def backward(ctx, dout):
        if torch.is_grad_enabled():
            return _exact_backward_once(ctx, dout)
        return _exact_backward(ctx, dout)


_HALF = {torch.float16: _lib.PF_F16, torch.bfloat16: _lib.PF_BF16}


def _half_in_place(q, k, v):
    """Whether q, k, v are CPU tensors of one half dtype (float16, bfloat16), contiguous: then
    the kernels read them in place."""
    ts = (q, k, v)
    return all(isinstance(x, torch.Tensor) and x.is_cpu and x.layout is torch.strided and
               x.dtype in _HALF and x.dtype is q.dtype and x.is_contiguous() for x in ts)


def _favor_half(q, k, v, W, causal, kernel, key_lengths, scale, eps, chunk, threads):
    """attention() of float16 or bfloat16 CPU tensors without grad: pf_attn_favor_dt reads them
    in place (a block of rows widened to float32 at a time) and writes the output in their
    dtype, the float32 computation's rounded once."""
    p = _plan(q, k, v, W, method="favor", causal=causal, kernel=kernel, key_lengths=key_lengths,
              scale=scale, eps=eps, chunk=chunk, oprf_a=None, threads=threads, save_bytes=None)
    out = torch.empty(p.oshape, dtype=q.dtype)
    st = _L.pf_attn_favor_dt(out.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                             _HALF[q.dtype], *p.args)
    if st:
        _nonfinite(st, "pf_attn_favor_dt", (("q", q.float()), ("k", k.float()),
                                            ("v", v.float())))
    return out


def _forward_nograd(p, q, k, v, W):
    out = torch.empty(p.oshape, dtype=torch.float32)
    if p.fav is not None:
        st = _L.pf_attn_favor(out.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), *p.args)
        fn = "pf_attn_favor"
    else:
        st = _L.pf_attn_exact(out.data_ptr(), None, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                              *p.args)
        fn = "pf_attn_exact"
    if st:
        _nonfinite(st, fn, _named(q, k, v, W))
    return out


def attention(q, k, v, *, W=None, causal=False, kernel="positive", method="favor",
              key_lengths=None, scale=None, eps=0.0, chunk=0, oprf_a=None, threads=None,
              save_bytes=None):
    """Attention of q on k and v through the C kernels, differentiable in q, k and v.

    method "favor": FAVOR+ with the projection W (m,d), or (H,m,d) one per head, a constant
    (no gradient flows into it); kernel "positive" (default), "hyperbolic", "trig", "relu",
    "oprf" (FAVOR++: oprf_a given, or fitted per head when bidirectional), "sderf" (FAVOR#,
    bidirectional) or "elu" (elu(Wx) + 1; W = torch.eye(d) is the linear attention of
    Katharopoulos et al.). The forward keeps the features for the backward (pf_attn_favor_save) for
    as many heads as fit in save_bytes (None: SAVE_BYTES, 1 GiB; 0: every head), the backward
    is pf_attn_favor_backward_saved; heads beyond the budget are recomputed (the same bits).
    method "exact": softmax attention, online forward keeping the log-sum-exp, flash-style
    backward (pf_attn_exact_backward); W and the kernel options do not apply.

    causal: query i sees keys j <= i. key_lengths: B valid key lengths (a list, array or
    tensor) in [1, Lk]; padded keys get zero gradients. scale: None is 1/sqrt(d). eps, chunk:
    as in performer.attention. threads: None is torch.get_num_threads() at the call (the
    module docstring says why, and what torch's default is); the bits never depend on it.

    The output is float32, or q's dtype when q is float64, float16 or bfloat16. Without grad
    mode, or when no input requires grad, the plain forward runs (nothing is kept). Double
    backward is not supported.

    CUDA tensors (q, k, v on one CUDA device, one dtype of float32, bfloat16, float16): FAVOR+
    forward and backward in libperformer_cuda on the device's current stream, output and
    gradients in that dtype (inside torch.autocast("cuda"), the inputs are cast to its dtype
    first); kernels positive, hyperbolic, trig and relu; the features are kept for the backward
    when they fit save_bytes (all heads or none), else recomputed there; W anywhere, copied to
    the device once while unchanged; threads is checked and not used. The module docstring has
    the details."""
    if _on_cuda(q) or _on_cuda(k) or _on_cuda(v):
        return _cuda_attention(q, k, v, W=W, causal=causal, kernel=kernel, method=method,
                               key_lengths=key_lengths, scale=scale, eps=eps, chunk=chunk,
                               oprf_a=oprf_a, threads=threads, save_bytes=save_bytes)
    q0 = q
    grad = torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                           for x in (q, k, v))
    if not grad and method == "favor" and kernel in _lib.HALF_KERNELS and _half_in_place(q, k, v):
        return _favor_half(q, k, v, W, causal, kernel, key_lengths, scale, eps, chunk, threads)
    q, k, v = _t32(q, "q"), _t32(k, "k"), _t32(v, "v")
    th = torch.get_num_threads() if threads is None else threads
    key = _plan_key(q, k, v, W, method, causal, kernel, key_lengths, scale, eps, chunk, oprf_a,
                    th, save_bytes)
    p = None if key is None else _PLANS.get(key)
    if p is None:
        p = _plan(q, k, v, W, method=method, causal=causal, kernel=kernel,
                  key_lengths=key_lengths, scale=scale, eps=eps, chunk=chunk, oprf_a=oprf_a,
                  threads=th, save_bytes=save_bytes)
        if key is not None:
            p = _remember(key, p)
    Wc = W if p.W is None else p.W  # W as the C call reads it
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        if p.fav is not None:
            out = _FavorFunction.apply(q, k, v, (p, Wc))
        else:
            out = _ExactFunction.apply(q, k, v, p)
    else:
        out = _forward_nograd(p, q, k, v, Wc)
    return out if q0.dtype is torch.float32 else out.to(q0.dtype)


# ---- CUDA tensors: libperformer_cuda's forward and backward ---------------------------------
#
# What a call does, in order: checks (types, devices, dtypes (autocast's where a region is on),
# method, kernel, shapes, options; nothing is computed or copied before they pass), loads
# libperformer_cuda if this is the first CUDA call (RuntimeError if it is not there), takes the
# device's pf_cuda_ctx (made on first use, one per device, freed at exit), casts q, k, v to
# autocast's dtype and makes them contiguous (and 16-byte aligned) on the device's current
# stream where they are not (differentiable copies), finds W's device copy (below), allocates
# the output with torch.empty on the device, and, holding the context's lock (a context is for
# one host thread at a time), sets its TF32 switch from torch's and calls pf_cuda_favor on the
# current stream, which returns when the stream has finished the call (it reads the kernels'
# error flags back). Everything a call queued has therefore run when it returns: the inputs' and
# the output's memory can be reused at once by torch's caching allocator, on any stream.
#
# In grad mode with an input requiring grad, _CudaFavorFunction makes the same call with
# pf_cuda_favor_save into a _cuda.Saved (the features, within the budget), and its backward
# calls pf_cuda_favor_backward the same way, with the arguments the forward checked (a
# _CudaCall, kept by the autograd graph).
#
# W: a float32 contiguous (and 16-byte aligned) W on q's device is passed as it is. Any other
# (on the CPU, on another GPU, another dtype, a view) is copied to q's device as float32 and the
# copy kept in _W_CACHE under W's address, device, dtype, shape and strides, with W's version
# counter (torch's count of in-place changes: W.copy_, W.mul_, ... move it, so a changed W is
# copied again) and a weak reference to W (a dead W's address may be reused by another tensor:
# its entry is never used again, and dropped). For a W on the CPU the entry also keeps a copy of
# its bits, compared at each use: a change torch does not count (through numpy, as W.numpy()[:]
# = ...) is seen too. A CUDA W changed behind torch's back (through DLPack, say) is not: call
# empty_cache() then. The copy is made on the current stream, which is then synchronised once,
# so a later call on any stream reads the finished copy. At most _W_CACHE_MAX copies are kept.

_CUDA_DTYPES = {torch.float32: _cuda.PF_CUDA_F32, torch.bfloat16: _cuda.PF_CUDA_BF16,
                torch.float16: _cuda.PF_CUDA_F16}
_CUDA_KERNELS = ("positive", "hyperbolic", "trig", "relu")  # pf_kernel 0..3
_ALIGN = 16  # bytes: what vector loads of float4 / 8 halves need
_W_CACHE = {}
_W_CACHE_MAX = 8


def _on_cuda(x):
    return isinstance(x, torch.Tensor) and x.is_cuda


def _tf32_allowed():
    """Whether torch lets float32 cuBLAS products use TF32 now. From torch 2.9 every setting
    (allow_tf32, set_float32_matmul_precision, fp32_precision) is recorded in fp32_precision,
    and reading allow_tf32 warns that it is deprecated (and fails after a mix of the two APIs):
    read fp32_precision where it exists, allow_tf32 before."""
    m = torch.backends.cuda.matmul
    try:
        prec = m.fp32_precision
    except (AttributeError, AssertionError):  # torch < 2.9 (an AssertionError before 2.x)
        return bool(m.allow_tf32)
    return prec == "tf32"


def _w_version(W):
    try:
        return W._version
    except RuntimeError:  # an inference tensor: no version counter
        return None


def _cuda_w(W, dev):
    """W (m,d) or (H,m,d) as a float32 contiguous tensor on device dev: W itself, or its kept
    device copy (see above)."""
    src, W = W, W.detach()  # the same memory and version counter; the entry refers to src
    if W.device == dev and W.dtype is torch.float32 and W.is_contiguous() \
            and W.data_ptr() % _ALIGN == 0:
        return W
    on_cpu = W.device.type == "cpu"
    key = (W.data_ptr(), W.device, W.dtype, tuple(W.shape), W.stride(), dev)
    ver = _w_version(W)
    e = _W_CACHE.get(key)
    if e is not None:
        ref, v, snap, Wd = e
        if ref() is src and v == ver and (snap is None or torch.equal(W, snap)):
            return Wd
    Wd = W.to(device=dev, dtype=torch.float32)
    if Wd.data_ptr() == W.data_ptr() or not Wd.is_contiguous() or Wd.data_ptr() % _ALIGN:
        Wd = Wd.clone(memory_format=torch.contiguous_format)
    # the copy is queued on the current stream(s): finished before a call on any stream reads it
    torch.cuda.current_stream(dev).synchronize()
    if W.is_cuda and W.device != dev:
        torch.cuda.current_stream(W.device).synchronize()
    if ver is None and not on_cpu:
        return Wd  # an inference tensor on a GPU: no version to check a copy by, none kept
    snap = W.clone() if on_cpu else None
    with _LOCK:
        for k in [k for k, e in _W_CACHE.items() if e[0]() is None]:
            del _W_CACHE[k]  # their W is gone: its address may be another tensor's now
        _W_CACHE.pop(key, None)
        while len(_W_CACHE) >= _W_CACHE_MAX:
            del _W_CACHE[next(iter(_W_CACHE))]
        _W_CACHE[key] = (weakref.ref(src), ver, snap, Wd)
    return Wd


def _cuda_nonfinite(named):
    """Where the first NaN or Inf of the named device tensors is, in _pf._raise's words."""
    for name, t in named:
        bad = ~torch.isfinite(t)
        if bool(bad.any()):
            i = int(bad.reshape(-1).nonzero()[0, 0])
            idx = np.unravel_index(i, tuple(t.shape))
            return (f"{name} holds {t.reshape(-1)[i].item()} at index "
                    f"{tuple(int(j) for j in idx)}")
    return "a result is not finite: try kernel='positive', a smaller scale, or eps > 0"


def _cuda_raise(st, function, named):
    """The library's exception for status st of `function`, as _pf._raise makes it, with
    pf_cuda_last_error()'s words (read in the calling thread, right after the call)."""
    words = _cuda.last_error()
    detail = ""
    if st == _lib.PF_ENONFINITE:
        detail = _cuda_nonfinite(named)
    elif st == _lib.PF_EDOMAIN:
        detail = ("a feature denominator is zero or not finite: try kernel='positive', a "
                  "smaller scale, or eps > 0")
    raise _lib.error(st, function, "; ".join(w for w in (words, detail) if w))


def _cuda_attention(q, k, v, *, W, causal, kernel, method, key_lengths, scale, eps, chunk,
                    oprf_a, threads, save_bytes):
    """attention() of CUDA tensors: checks, then pf_cuda_favor, or _CudaFavorFunction where a
    gradient is needed (see the comment above)."""
    named = (("q", q), ("k", k), ("v", v))
    for name, x in named:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    dev = q.device
    if not (_on_cuda(q) and k.device == dev and v.device == dev):
        raise ValueError(f"q, k and v must be on one device: q is on {q.device}, k on "
                         f"{k.device}, v on {v.device}")
    for name, x in named:
        if x.layout is not torch.strided:
            raise TypeError(f"{name} has layout {x.layout}: dense (strided) tensors only")
    # inside torch.autocast("cuda"), the dtypes q, k, v will be cast to (as autocast casts a
    # matmul's inputs: every floating dtype but float64); the casts are made after the checks
    ac = _autocast_dtype()
    if ac not in _CUDA_DTYPES:
        ac = None
    dts = [ac if ac is not None and x.dtype.is_floating_point and x.dtype is not torch.float64
           else x.dtype for x in (q, k, v)]
    dt = dts[0]
    if dt not in _CUDA_DTYPES:
        hint = (": cast to float32 (.float()), or bfloat16 / float16 for tensor cores"
                if dt is torch.float64 else "")
        raise TypeError(f"q: dtype {dt} is not supported on CUDA: float32, bfloat16 or "
                        f"float16{hint}")
    if dts[1] is not dt or dts[2] is not dt:
        raise TypeError(f"q, k and v must have one dtype on CUDA (float32, bfloat16 or "
                        f"float16): q is {q.dtype}, k {k.dtype}, v {v.dtype}"
                        + (f" (inside autocast to {ac})" if ac is not None else ""))
    if method == "exact":
        raise NotImplementedError("method='exact' has no CUDA kernel here: on the GPU use "
                                  "torch.nn.functional.scaled_dot_product_attention, or move "
                                  "the tensors to the CPU")
    if method != "favor":
        raise ValueError(f"method '{method}' is not known here: 'favor' or 'exact'")
    kid = _lib.kernel_id(kernel)
    if kid >= len(_CUDA_KERNELS):
        raise NotImplementedError(f"kernel '{kernel}' does not run on CUDA: the GPU runs "
                                  f"{', '.join(_CUDA_KERNELS)}; FAVOR++ (oprf), FAVOR# "
                                  "(sderf) and elu run on CPU tensors")
    if oprf_a is not None:
        raise ValueError("oprf_a is for kernel='oprf' only")
    if W is None:
        raise ValueError("method='favor' needs W (m,d) or (H,m,d): performer.projection(m, d) "
                         "or a FastAttention's projection_matrix")
    if not isinstance(W, torch.Tensor):
        raise TypeError(f"W must be a torch.Tensor, got {type(W).__name__}")
    if W.layout is not torch.strided or not W.dtype.is_floating_point or W.is_complex():
        raise TypeError(f"W: dtype {W.dtype} ({W.layout}) is not supported: a dense floating "
                        "tensor (copied to float32)")
    if W.device.type not in ("cpu", "cuda"):
        raise TypeError(f"W is on {W.device}: on the CPU or a CUDA device")
    sh = _pf._shape(q, k, v, causal)
    ok = (W.ndim == 2 or (W.ndim == 3 and W.shape[0] == sh.H)) and W.shape[-1] == sh.d
    if not ok or W.shape[-2] < 1:
        raise ValueError(f"W has shape {tuple(W.shape)}: expected (m, {sh.d}) or ({sh.H}, m, "
                         f"{sh.d}) (one W per head)")
    if isinstance(key_lengths, torch.Tensor):
        key_lengths = key_lengths.detach().cpu().numpy()
    key_len = _pf._key_lengths(key_lengths, sh)  # host int32: the library reads it once
    opts = _pf._attn_opts(sh, scale, causal, key_len, 0 if threads is None else threads)
    if save_bytes is not None and int(save_bytes) < 0:
        raise ValueError(f"save_bytes must be >= 0, got {save_bytes}")
    eps = _pf._nonneg(eps, "eps")
    chunk = _pf._int(chunk, "chunk", 0, 2**31 - 1)
    c = _CudaCall()
    c.dev, c.dt, c.sh, c.opts, c.key_len = dev, _CUDA_DTYPES[dt], sh, opts, key_len
    c.oshape = tuple(q.shape[:-1]) + (sh.dv,)
    c.budget = SAVE_BYTES if save_bytes is None else int(save_bytes)
    _cuda.lib()  # RuntimeError when libperformer_cuda is not there
    c.ctx = _cuda.ctx(dev.index)
    with torch.cuda.device(dev):
        q, k, v = (_aligned(x if x.dtype is dt else x.to(dt)) for x in (q, k, v))
        c.Wd = _cuda_w(W, dev)
        c.fav = _lib.pf_favor_opts(kid, c.Wd.data_ptr(), W.shape[-2], 1 if W.ndim == 3 else 0,
                                   eps, chunk, 0, 0.0)
        c.args = (_P(c.sh), _P(c.opts), _P(c.fav))
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            return _CudaFavorFunction.apply(q, k, v, c)
        out = torch.empty(c.oshape, dtype=dt, device=dev)
        _cuda_forward(c, out, q, k, v, None)
    return out


def _aligned(x):
    """x contiguous and 16-byte aligned on its device: itself, or a copy (differentiable)."""
    if x.is_contiguous() and x.data_ptr() % _ALIGN == 0:
        return x
    return x.clone(memory_format=torch.contiguous_format)


def _autocast_dtype():
    """The dtype torch.autocast("cuda") casts to inside an enabled region, else None. torch 2.4
    names the device (is_autocast_enabled("cuda"), get_autocast_dtype("cuda")) and deprecates
    the CUDA-only calls (is_autocast_enabled(), get_autocast_gpu_dtype()), all torch 1.13 has."""
    get = getattr(torch, "get_autocast_dtype", None)
    if get is not None:
        try:
            return get("cuda") if torch.is_autocast_enabled("cuda") else None
        except TypeError:  # a torch between the two APIs
            pass
    return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None


class _CudaCall:
    """One CUDA call's arguments as libperformer_cuda takes them, kept alive together for the
    forward and its backward: ctx (the device's _cuda.Context), dev, dt (the pf_cuda_dtype), sh,
    opts, key_len (host int32 that opts points into, or None), Wd (float32 W on dev, which fav
    points into), fav, args (pointers to sh, opts, fav), oshape (the output's shape), budget
    (save_bytes as a number: 0 keeps the features whatever their size)."""

    __slots__ = ("ctx", "dev", "dt", "sh", "opts", "key_len", "Wd", "fav", "args", "oshape",
                 "budget")


def _cuda_forward(c, out, q, k, v, saved):
    """pf_cuda_favor into out on dev's current stream, or pf_cuda_favor_save filling saved (a
    _cuda.Saved) as well; statuses raised."""
    L = _cuda.lib()
    stream = torch.cuda.current_stream(c.dev).cuda_stream
    allow = _tf32_allowed()
    ptrs = (out.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), c.dt) + c.args
    with c.ctx.lock:
        c.ctx.set_tf32(allow)
        if saved is None:
            st, fn = L.pf_cuda_favor(c.ctx.ptr, *ptrs, stream), "pf_cuda_favor"
        else:
            st, fn = L.pf_cuda_favor_save(c.ctx.ptr, *ptrs, saved.ptr, stream), \
                "pf_cuda_favor_save"
        if st:
            _cuda_raise(st, fn, (("q", q), ("k", k), ("v", v), ("W", c.Wd)))


def _cuda_saved(c):
    """A _cuda.Saved for call c when its kept features fit c.budget (pf_cuda_favor_saved_size)
    and the device's memory; None to recompute them in the backward."""
    n = ctypes.c_size_t()
    st = _cuda.lib().pf_cuda_favor_saved_size(_P(n), c.dt, *c.args)
    if st:
        _cuda_raise(st, "pf_cuda_favor_saved_size", ())
    if c.budget and n.value > c.budget:
        return None
    try:
        return _cuda.Saved(c.ctx, c.dt, *c.args)
    except MemoryError:  # no room on the device: the backward recomputes (the same results)
        return None


def _cuda_backward(ctx, dout):
    c = ctx.call
    kept, ctx.kept = ctx.kept, None  # a later backward (retain_graph) recomputes
    try:
        q, k, v = ctx.saved_tensors[:3]  # torch checks that none was changed in place since
        if dout.dtype is not q.dtype:
            dout = dout.to(q.dtype)
        with torch.cuda.device(c.dev):
            dout = _aligned(dout)
            dq, dk, dv = (torch.empty_like(x, memory_format=torch.contiguous_format)
                          for x in (q, k, v))
            L = _cuda.lib()
            stream = torch.cuda.current_stream(c.dev).cuda_stream
            allow = _tf32_allowed()
            with c.ctx.lock:
                c.ctx.set_tf32(allow)
                st = L.pf_cuda_favor_backward(c.ctx.ptr, dq.data_ptr(), dk.data_ptr(),
                                              dv.data_ptr(), dout.data_ptr(), q.data_ptr(),
                                              k.data_ptr(), v.data_ptr(), c.dt, *c.args,
                                              None if kept is None else kept.ptr, stream)
                if st:
                    _cuda_raise(st, "pf_cuda_favor_backward", (("q", q), ("k", k), ("v", v),
                                                               ("W", c.Wd), ("dout", dout)))
    finally:
        if kept is not None:
            kept.free()  # the call has finished on the stream: its memory goes back at once
    return dq, dk, dv, None


_cuda_backward_once = once_differentiable(_cuda_backward)


class _CudaFavorFunction(torch.autograd.Function):
    """FAVOR+ on CUDA tensors, differentiable in q, k and v (contiguous, aligned, of one dtype).
    The forward keeps the features (pf_cuda_favor_save into a _cuda.Saved) when
    pf_cuda_favor_saved_size is within the call's budget, else runs pf_cuda_favor; the backward
    is pf_cuda_favor_backward with the kept features, which it frees at once, or with NULL
    (recomputing them from q, k and W: a second backward, retain_graph=True, does that; the
    results agree to float rounding). Kept features never backpropagated are freed with the
    graph. W is a constant: the call holds it as the library reads it, and saves it with q, k
    and v (when it has a version counter: not an inference tensor), so an in-place change to
    any of them before the backward is an error."""

    @staticmethod
    def forward(ctx, q, k, v, c):
        out = torch.empty(c.oshape, dtype=q.dtype, device=c.dev)
        saved = _cuda_saved(c)
        try:
            _cuda_forward(c, out, q, k, v, saved)
        except BaseException:
            if saved is not None:
                saved.free()
            raise
        if _w_version(c.Wd) is None:
            ctx.save_for_backward(q, k, v)
        else:
            ctx.save_for_backward(q, k, v, c.Wd)
        ctx.call, ctx.kept = c, saved
        return out

    @staticmethod
    def backward(ctx, dout):
        # as _FavorFunction: once_differentiable only where the backward runs in grad mode
        if torch.is_grad_enabled():
            return _cuda_backward_once(ctx, dout)
        return _cuda_backward(ctx, dout)


def cuda_available():
    """True when libperformer_cuda loads and finds at least one device (loading it). Never
    raises: False without the library, a GPU or a driver."""
    return _cuda.device_count() >= 1


def _device_index(device):
    if device is None:
        return torch.cuda.current_device()
    d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if d.type != "cuda":
        raise ValueError(f"device {d}: a CUDA device")
    return torch.cuda.current_device() if d.index is None else d.index


def cuda_profile(on, device=None):
    """Turns the stage timing of the CUDA forwards on device (None: the current one) on or off
    (pf_cuda_ctx_profile: a CUDA event around each stage of every later forward, which costs a
    little). cuda_stage_times() reads the sums."""
    _cuda.profile(_device_index(device), on)


StageTime = collections.namedtuple("StageTime", "name ms flops bytes")


def cuda_stage_times(device=None):
    """The stages of the CUDA forwards on device (None: the current one) since cuda_profile(True)
    or the last call of this function, which resets the sums (pf_cuda_ctx_stages; it waits for
    the device's last call): a list of StageTime(name, ms, flops, bytes), in the library's order
    ("project", "features", "weights", "chunk_states", "prefix", "scores", "readout_mm",
    "normalise"): milliseconds summed over the forwards, the flops of the matrix products (2 per
    multiply-add; 0 for the elementwise stages), the bytes each stage reads and writes."""
    return [StageTime(*t) for t in _cuda.stages(_device_index(device))]


# ---- performer-pytorch's FastAttention ------------------------------------------------------

def _is_relu(fn):
    return isinstance(fn, torch.nn.ReLU) or fn in (torch.relu, torch.nn.functional.relu)


class FastAttention(torch.nn.Module):
    """performer-pytorch's FastAttention (lucidrains/performer-pytorch), same constructor and
    call, computed by the C kernels: a model built on it swaps one import,

        from performer_pytorch import FastAttention     # before
        from performer.torch import FastAttention       # after

    FastAttention(dim_heads, nb_features=None, ortho_scaling=0, causal=False,
                  generalized_attention=False, kernel_fn=torch.nn.ReLU(), no_projection=False)
    forward(q, k, v) on (B,H,L,dim_heads) (v (B,H,Lk,dv)) -> (B,H,Lq,dv).

    - nb_features: None is int(dim_heads * ln(dim_heads)), as there.
    - projection_matrix: a buffer (nb_features, dim_heads) of orthogonal random rows (stacked
      Haar-random dim_heads x dim_heads blocks, the last one cut) with lengths chi-distributed
      (ortho_scaling=0: each row as long as an N(0,I) vector) or all sqrt(dim_heads)
      (ortho_scaling=1); any other value is ValueError, as there. It is drawn by the library
      (performer.projection) from a seed taken from torch's default generator, so
      torch.manual_seed reproduces it; the numbers differ from performer-pytorch's (which QRs
      torch.randn blocks, without the sign fix that makes them exactly Haar), the distribution
      is the same. redraw_projection_matrix(device=None) draws a new one in place.
    - Softmax attention (the default): the FAVOR+ estimate of softmax(q k^T / sqrt(d)) v with
      positive features exp(w.x' - |x'|^2/2)/sqrt(m), x' = x d^(-1/4), exactly that formula.
      performer-pytorch differs in two ways, both on purpose here: it adds 1e-4 (times
      m^(-1/2)) to every *stabilised* feature, so its result depends on the stabilisers, and
      its key stabiliser is one maximum over all keys of the head, which in causal mode lets
      future keys change earlier outputs (through that 1e-4). Here keys are stabilised by a
      running maximum (causal) and nothing is added: the result is the estimator itself, and
      causal outputs never depend on later tokens.
    - generalized_attention=True: features kernel_fn(w.x') + 1e-3, x' = x d^(-1/4), exactly
      performer-pytorch's (computed as (relu(w.x') + 1e-3)/sqrt(m), the same attention: a
      constant factor cancels). Only kernel_fn = ReLU runs in the C kernels: another kernel_fn
      is NotImplementedError.
    - Causal: performer-pytorch's CPU path adds 1e-6 to every running key sum in the
      denominator; here the denominator is the plain sum (a zero one is an error, never a NaN).
    - no_projection=True (softmax-normalised q and k, no random features) is not a FAVOR+
      computation and is NotImplementedError.
    - forward also takes key_lengths (B valid key lengths, padding after them), which
      performer-pytorch lacks (it masks values in its SelfAttention instead).
    Gradients flow to q, k and v (through pf_attn_favor_save / _backward_saved), never to
    projection_matrix, as there (it is a buffer). CPU tensors: float64/16 converted. CUDA
    tensors (forward and backward): module.cuda() moves the buffer to the GPU, where it is used
    as it is (a buffer left on the CPU is copied to the device once, and again after each
    redraw); float32, bfloat16 or float16 inputs, output in their dtype (or autocast's), as
    attention() says.
    Extra keyword arguments: threads (None: torch.get_num_threads() at each call, as
    attention()), save_bytes (the kept features' budget per call, None: SAVE_BYTES).

    In performer-pytorch's own models (PerformerLM, Performer, ...), which build their attention
    through a name of their module and redraw only instances of their class, use
    patch_performer_pytorch() to build them or convert_performer_pytorch() on a built one: both
    put in PerformerPytorchFastAttention, this class that is also performer-pytorch's, so that
    feature_redraw_interval keeps working. A module of this class put in such a model by hand is
    never redrawn there.
    """

    def __init__(self, dim_heads, nb_features=None, ortho_scaling=0, causal=False,
                 generalized_attention=False, kernel_fn=torch.nn.ReLU(), no_projection=False,
                 *, threads=None, save_bytes=None):
        # nn.Module's, not super()'s: in PerformerPytorchFastAttention the next class is
        # performer-pytorch's FastAttention, whose __init__ must not run (it draws a projection)
        torch.nn.Module.__init__(self)
        self._configure(dim_heads, nb_features, ortho_scaling, causal, generalized_attention,
                        kernel_fn, no_projection, threads, save_bytes)
        self.register_buffer("projection_matrix", self.create_projection())

    def _configure(self, dim_heads, nb_features, ortho_scaling, causal, generalized_attention,
                   kernel_fn, no_projection, threads, save_bytes):
        """Checks the settings and keeps them (everything __init__ does but the projection)."""
        if nb_features is None:
            nb_features = int(dim_heads * math.log(dim_heads))
        if ortho_scaling not in (0, 1):
            raise ValueError(f"Invalid scaling {ortho_scaling}: 0 (chi row norms) or 1 "
                             "(sqrt(dim_heads))")
        if not (isinstance(dim_heads, int) and dim_heads >= 1):
            raise ValueError(f"dim_heads must be a positive integer, got {dim_heads!r}")
        if not (isinstance(nb_features, int) and nb_features >= 1):
            raise ValueError(f"nb_features must be a positive integer, got {nb_features!r} "
                             "(the default int(dim_heads * ln(dim_heads)) is 0 for dim_heads 1)")
        if no_projection:
            raise NotImplementedError("no_projection=True (softmax-normalised q and k without "
                                      "random features) is not a FAVOR+ computation; the C "
                                      "kernels do not run it")
        if generalized_attention and not _is_relu(kernel_fn):
            raise NotImplementedError(f"generalized_attention runs kernel_fn = ReLU in the C "
                                      f"kernels; {kernel_fn!r} is not supported")
        self.dim_heads = dim_heads
        self.nb_features = nb_features
        self.ortho_scaling = ortho_scaling
        self.causal = causal
        self.generalized_attention = generalized_attention
        self.kernel_fn = kernel_fn
        self.no_projection = no_projection
        self.threads = threads
        self.save_bytes = save_bytes

    def create_projection(self, device=None):
        """A new (nb_features, dim_heads) float32 projection, from a seed drawn from torch's
        default generator, drawn on the CPU by the library (the same bits whatever the device)
        and moved to device (None or a CPU device: left on the CPU; a CUDA device)."""
        if device is not None and torch.device(device).type not in ("cpu", "cuda"):
            raise TypeError(f"device {device}: performer.torch runs on the CPU or on CUDA")
        seed = int(torch.randint(0, 2**62, (1,)).item())
        W = _pf.projection(self.nb_features, self.dim_heads, kind="orthogonal",
                           norm="chi" if self.ortho_scaling == 0 else "sqrtd", seed=seed)
        W = torch.from_numpy(W)
        return W if device is None else W.to(device)

    @torch.no_grad()
    def redraw_projection_matrix(self, device=None):
        """Draws a new projection into the buffer, in place, wherever the buffer is (device
        only checks and stages it: the buffer keeps its device and dtype)."""
        self.projection_matrix.copy_(self.create_projection(device))

    def extra_repr(self):
        kind = "generalized relu" if self.generalized_attention else "softmax (positive)"
        return (f"dim_heads={self.dim_heads}, nb_features={self.nb_features}, "
                f"causal={self.causal}, kernel={kind}")

    def forward(self, q, k, v, key_lengths=None):
        if q.ndim != 4 or q.shape[-1] != self.dim_heads:
            raise ValueError(f"q has shape {tuple(q.shape)}: expected (B, H, L, "
                             f"{self.dim_heads})")
        if self.generalized_attention:
            kernel, eps = "relu", 1e-3 / math.sqrt(self.nb_features)
        else:
            kernel, eps = "positive", 0.0
        return attention(q, k, v, W=self.projection_matrix, causal=self.causal, kernel=kernel,
                         eps=eps, key_lengths=key_lengths, threads=self.threads,
                         save_bytes=self.save_bytes)


# ---- performer-pytorch models ---------------------------------------------------------------
#
# performer-pytorch (not a dependency: imported only by the functions below) builds its attention
# in SelfAttention / CrossAttention through the name FastAttention of the module
# performer_pytorch.performer_pytorch, and its ProjectionUpdater (kept by Performer and
# PerformerLM) redraws the projections of find_modules(model, FastAttention): the modules that
# are instances of performer-pytorch's class. So rebinding performer_pytorch.FastAttention
# changes nothing (SelfAttention reads the other name), and a module of another class put in a
# built model is never redrawn. PerformerPytorchFastAttention is performer.torch's FastAttention
# made a subclass of performer-pytorch's as well: that isinstance check finds it whatever either
# name is bound to. patch_performer_pytorch() makes performer-pytorch's class construct it (a
# __new__ on that class, so every name and every builder of it is covered, and nothing else
# about the class changes); convert_performer_pytorch() replaces the modules of a built model.

_PP_LOCK = threading.Lock()
_PP_SWAP = {}  # performer-pytorch's FastAttention -> its PerformerPytorchFastAttention
_PP_HOLDS = {}  # performer-pytorch's FastAttention -> patches of it not undone


def _pp_base():
    """performer-pytorch's FastAttention class (importing performer_pytorch), or ImportError
    saying what to do."""
    try:
        from performer_pytorch import performer_pytorch as m
        return m.FastAttention
    except ImportError as e:
        raise ImportError(f"performer-pytorch is not importable ({e}): install it (pip install "
                          "performer-pytorch; performer itself does not need it) to patch or "
                          "convert its models") from e


def _pp_swap(base):
    """PerformerPytorchFastAttention for performer-pytorch's class base (made once)."""
    with _PP_LOCK:
        cls = _PP_SWAP.get(base)
        if cls is None:
            cls = type("PerformerPytorchFastAttention", (FastAttention, base), {
                "__module__": __name__, "__qualname__": "PerformerPytorchFastAttention",
                "__doc__": "performer.torch.FastAttention that is also an instance of "
                           "performer-pytorch's FastAttention (so its ProjectionUpdater redraws "
                           "it): what patch_performer_pytorch() and "
                           "convert_performer_pytorch() put in its models."})
            _PP_SWAP[base] = cls
    return cls


def __getattr__(name):
    # PerformerPytorchFastAttention exists once performer-pytorch is imported; by this name a
    # pickled model (torch.save of the module itself) finds the class again
    if name == "PerformerPytorchFastAttention":
        return _pp_swap(_pp_base())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class PerformerPytorchPatch:
    """What patch_performer_pytorch() returns: undo() (or the end of a `with` block) ends this
    hold on the patch; performer-pytorch's class builds its own modules again once every hold
    is undone. undo() twice is harmless. `active` says whether this hold is still on."""

    def __init__(self, base):
        self.base, self.active = base, True

    def undo(self):
        with _PP_LOCK:
            if self.active:
                self.active = False
                _PP_HOLDS[self.base] -= 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.undo()

    def __repr__(self):
        return (f"<performer-pytorch patch: {'on' if self.active else 'undone'}; "
                f"{_PP_HOLDS.get(self.base, 0)} hold(s) in all>")


def _pp_install(base, swap):
    """Gives performer-pytorch's class base a __new__ that constructs swap while a patch holds
    (the caller holds _PP_LOCK). It stays when the patches are undone, doing then what the
    default does (object.__new__(cls)): deleting it again would leave CPython's slot calling
    object.__new__ with the constructor's arguments, a TypeError."""
    if base in _PP_HOLDS:
        return
    if "__new__" in vars(base):
        raise RuntimeError("performer_pytorch's FastAttention already has a __new__ of its own: "
                           "not patched (convert_performer_pytorch converts built models)")

    def __new__(cls, *args, **kwargs):
        # a construction has arguments (dim_heads at least); copy.deepcopy and unpickling call
        # cls.__new__(cls) alone, and keep the class they copy
        if cls is base and (args or kwargs) and _PP_HOLDS[base] > 0:
            cls = swap
        return object.__new__(cls)

    base.__new__ = staticmethod(__new__)
    _PP_HOLDS[base] = 0


def patch_performer_pytorch():
    """Makes performer-pytorch build its attention with performer.torch, until undone:

        import performer.torch as pt
        from performer_pytorch import PerformerLM
        with pt.patch_performer_pytorch():         # or: patch = ...; later patch.undo()
            model = PerformerLM(num_tokens=256, max_seq_len=1024, dim=512, depth=6, heads=8,
                                causal=True)

    While the patch holds, constructing performer-pytorch's FastAttention by any name
    (performer_pytorch.FastAttention, performer_pytorch.performer_pytorch.FastAttention, and so
    in its SelfAttention, CrossAttention, Performer, PerformerLM and PerformerEncDec) makes a
    PerformerPytorchFastAttention: performer.torch.FastAttention with the same arguments, and
    an instance of performer-pytorch's class too, so the model's ProjectionUpdater finds it and
    redraws its projection every feature_redraw_interval calls in training mode, as before.
    Models built while it held keep their modules (and their redraws) after undo; models built
    before it keep performer-pytorch's: convert_performer_pytorch(model) converts a built
    model. Copies and unpickling of performer-pytorch's own modules are left alone.

    Returns a PerformerPytorchPatch: undo() it, or use it as a context manager. Calling again
    while patched adds a hold on the same patch (it is idempotent); the class is restored when
    every hold is undone. ImportError when performer-pytorch is not importable.

    Settings the C kernels do not run fail at construction: no_projection=True, and
    generalized_attention with a kernel_fn other than ReLU, are NotImplementedError. What
    differs from performer-pytorch's computation is in FastAttention's docstring.

    The same seed draws different starting weights: performer.torch draws each projection from
    one torch.randint (the library then draws W from that seed) where performer-pytorch draws
    torch.randn blocks, so torch's generator is at another place for every parameter made
    after it (to_q, to_k, to_v, to_out, the feed-forwards, ...). To compare the two on one
    model, load one model's state_dict into the other (the keys are the same), or build with
    performer-pytorch and convert_performer_pytorch() it, which keeps every weight and
    projection."""
    base = _pp_base()
    swap = _pp_swap(base)
    with _PP_LOCK:
        _pp_install(base, swap)
        _PP_HOLDS[base] += 1
    return PerformerPytorchPatch(base)


def _pp_converted(mod, swap, name):
    """A PerformerPytorchFastAttention with mod's settings, training mode and a copy of its
    projection_matrix (its device and dtype); the errors name the module."""
    new = swap.__new__(swap)
    torch.nn.Module.__init__(new)
    try:
        new._configure(mod.dim_heads, mod.nb_features, mod.ortho_scaling, mod.causal,
                       mod.generalized_attention, mod.kernel_fn, mod.no_projection,
                       getattr(mod, "threads", None), getattr(mod, "save_bytes", None))
    except (ValueError, NotImplementedError) as e:
        raise type(e)(f"{name or 'the model'} ({type(mod).__name__}): {e}; nothing was "
                      "converted") from None
    new.register_buffer("projection_matrix", mod.projection_matrix.detach().clone())
    new.train(mod.training)
    return new


def convert_performer_pytorch(model):
    """Converts a built performer-pytorch model (or any module holding its FastAttention) to
    performer.torch, in place, and returns it:

        model = convert_performer_pytorch(PerformerLM(num_tokens=256, max_seq_len=1024,
                                                      dim=512, depth=6, heads=8, causal=True))

    Every module of the model that is performer-pytorch's FastAttention, or a
    performer.torch.FastAttention put there by hand (which its ProjectionUpdater never finds, so
    never redraws), is replaced, wherever the model holds it, by a PerformerPytorchFastAttention
    with the same settings, training mode and projection_matrix (copied): the model keeps every
    weight and projection, and the ProjectionUpdater redraws the new modules as it did the old.
    model itself may be one such module: the new one is returned. Hooks registered on the
    replaced modules are not carried over.

    Every module is checked before any is replaced: one the C kernels do not run
    (no_projection=True, generalized_attention with a kernel_fn other than ReLU) is
    NotImplementedError naming it, and the model is left as it was. TypeError when model is not
    a torch.nn.Module; ImportError when performer-pytorch is not importable. Conversion draws
    nothing from torch's generator."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    base = _pp_base()
    swap = _pp_swap(base)
    new = {}  # id of an old module -> its replacement
    for name, mod in model.named_modules():
        if isinstance(mod, (base, FastAttention)) and not isinstance(mod, swap):
            new[id(mod)] = _pp_converted(mod, swap, name)
    for parent in list(model.modules()):
        for cname, child in list(parent._modules.items()):
            if child is not None and id(child) in new:
                setattr(parent, cname, new[id(child)])
    return new.get(id(model), model)
