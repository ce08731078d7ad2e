"""performer: fast attention with random features (FAVOR+), from Python.

A thin layer over the C library libperformer (include/performer.h), loaded with ctypes: no
compiler is needed to install it, and every number is computed by the same C code the
`performer` tool runs, so the results are the tool's, bit for bit, given the same W.

    import numpy as np, performer
    q, k, v = (np.random.default_rng(0).standard_normal((8, 1024, 64), np.float32)
               for _ in range(3))
    out = performer.attention(q, k, v, causal=True, features=256, seed=0)   # FAVOR+
    ref = performer.attention(q, k, v, causal=True, method="exact")

Arrays. Tensors are (L,d) one head, (H,L,d) heads, or (B,H,L,d) a batch, as `performer attn`
takes them: q (..,Lq,d), k (..,Lk,d), v (..,Lk,dv), all of one rank, out (..,Lq,dv). A float32
array in C order is passed to C as it is (no copy); any other real floating or integer array
(float64, a transposed view, ...) is converted to a float32 C-order copy once. Complex, bool,
object and string arrays are refused with TypeError.

Errors. Python-side checks (ranks, shapes, names, options that do not apply) raise ValueError
or TypeError with a message saying what is wrong. A status from the library raises a subclass
of `performer.Error` that is also the built-in exception for it, carrying pf_status_str's
message: PF_EINVAL ValueError, PF_ENOMEM MemoryError, PF_ENONFINITE FloatingPointError (NaN or
Inf in an input, named), PF_EDOMAIN ArithmeticError (a zero attention denominator), PF_ENOTSUP
NotImplementedError.

Threads: `threads=0` is OpenMP's default (OMP_NUM_THREADS or every core); results never depend
on the thread count. ctypes releases the GIL during each call, so calls from several Python
threads run in parallel (each DecodeState must stay with one thread at a time).

Trained language models (`performer train`'s checkpoints): Model loads one and gives what each
layer's attention takes (q, k, v), the next-byte logits and each position's loss;
attention_entropy measures how sharp softmax attention on them is.

performer.torch (import it explicitly) has an autograd function and performer-pytorch's
FastAttention running on the same kernels.
"""
import ctypes
import dataclasses
import functools
import math
import os
import threading

import numpy as np

from . import _lib
from ._lib import (STATUS_NAMES, Error, FormatError, InvalidArgument, LibraryIOError, NonFinite,
                   NotSupported, OutOfMemory, UndefinedResult, library_path)

__all__ = ["attention", "attention_grad", "projection", "features", "oprf_optimal_a",
           "sderf_params", "kernel_width", "attention_entropy", "mqar_batch", "DecodeState", "Model",
           "ModelConfig", "Error", "InvalidArgument",
           "OutOfMemory", "NonFinite", "UndefinedResult", "NotSupported", "FormatError",
           "LibraryIOError", "STATUS_NAMES", "version", "simd_path", "blas_core",
           "library_path"]

_L = _lib.lib
__version__ = _L.pf_version().decode()
_INT_MAX = 2**31 - 1
_FLT_MAX = float(np.finfo(np.float32).max)
_FLT_MIN = float(np.finfo(np.float32).tiny)
_METHODS = ("favor", "exact", "ra", "lara")


def version():
    """The C library's version, "MAJOR.MINOR.PATCH"."""
    return __version__


def simd_path():
    """The vector path of the library's kernels: "avx512", "avx2" or "ref"."""
    return _L.pf_simd_path().decode()


def blas_core():
    """The OpenBLAS kernel set exact attention, RA and LARA run on ("Haswell", ...)."""
    return _L.pf_blas_core().decode()


def kernel_width(kernel, m):
    """The feature width r of a kernel with m projections: m, or 2m (hyperbolic, trig)."""
    return _L.pf_kernel_width(_lib.kernel_id(kernel), int(m))


# ---- argument conversion --------------------------------------------------------------------

def _f32(x, name):
    """x as a float32 C-order array: itself when it already is one (zero copy), else one copy.
    TypeError for what is not real numbers."""
    if type(x) is np.ndarray and x.dtype == np.float32 and x.flags.c_contiguous \
            and x.flags.aligned:
        return x
    a = np.asarray(x)
    if a.dtype.kind not in "fiu":
        raise TypeError(f"{name}: dtype {a.dtype} is not supported: real numbers only (float32 "
                        "is used as it is; other floating and integer types are converted)")
    return np.ascontiguousarray(a, dtype=np.float32)


def _ptr(a):
    return None if a is None else a.ctypes.data


def _scale(scale):
    if scale is None:
        return 0.0
    if isinstance(scale, (str, bytes, bool)):
        raise TypeError(f"scale must be a number, got {type(scale).__name__} {scale!r}")
    s = float(scale)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    if s > _FLT_MAX or s < _FLT_MIN:
        raise ValueError(f"scale {s:g} is outside float32's normal range")
    return s


def _nonneg(value, name):
    x = float(value)
    if not (math.isfinite(x) and x >= 0) or x > _FLT_MAX:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return x


def _int(value, name, lo, hi):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
    return int(value)


def _shape(q, k, v, causal):
    """The pf_shape of q, k, v (ValueError naming what disagrees)."""
    qs, ks, vs = tuple(q.shape), tuple(k.shape), tuple(v.shape)
    r = len(qs)
    if r not in (2, 3, 4):
        raise ValueError(f"q has shape {qs}: expected (L,d), (H,L,d) or (B,H,L,d)")
    if len(ks) != r or len(vs) != r:
        raise ValueError(f"q, k and v must have the same rank: shapes {qs}, {ks}, {vs}")
    if not (qs[:-2] == ks[:-2] == vs[:-2]):
        raise ValueError(f"q, k and v must agree in their leading (batch, head) dimensions: "
                         f"shapes {qs}, {ks}, {vs}")
    if qs[-1] != ks[-1]:
        raise ValueError(f"q and k must have the same width d: shapes {qs}, {ks}")
    if ks[-2] != vs[-2]:
        raise ValueError(f"k and v must have the same length Lk: shapes {ks}, {vs}")
    dims = qs + ks[-2:] + vs[-1:]
    if min(dims) < 1 or max(dims) > _INT_MAX:
        raise ValueError(f"every dimension must be in [1, 2^31 - 1]: shapes {qs}, {ks}, {vs}")
    Lq, Lk = qs[-2], ks[-2]
    if causal and Lq != Lk:
        raise ValueError(f"causal attention needs as many queries as keys (Lq = {Lq}, "
                         f"Lk = {Lk})")
    return _lib.pf_shape(qs[0] if r == 4 else 1, qs[-3] if r >= 3 else 1, Lq, Lk, qs[-1],
                         vs[-1])


def _key_lengths(key_lengths, sh):
    """key_lengths as an int32 (B,) array with every value in [1, Lk], or None. Always a copy of
    its own: a caller's int32 buffer changed after the call must not reach a plan that keeps it
    (performer.torch caches plans by the values)."""
    if key_lengths is None:
        return None
    a = np.asarray(key_lengths)
    if a.size == 0:
        raise ValueError(f"key_lengths is empty: expected ({sh.B},), one length per batch item")
    if a.dtype.kind not in "iu":
        raise TypeError(f"key_lengths must hold integers, got dtype {a.dtype}")
    if a.ndim == 0:
        a = a.reshape(1)
    if a.shape != (sh.B,):
        raise ValueError(f"key_lengths has shape {a.shape}: expected ({sh.B},), one length per "
                         "batch item")
    if a.min() < 1 or a.max() > sh.Lk:
        bad = int(np.flatnonzero((a < 1) | (a > sh.Lk))[0])
        raise ValueError(f"key_lengths[{bad}] = {int(a[bad])} is out of range [1, {sh.Lk}]")
    return np.array(a, dtype=np.int32, order="C", copy=True)


def _attn_opts(sh, scale, causal, key_len, threads):
    return _lib.pf_attn_opts(_scale(scale), 1 if causal else 0, _ptr(key_len),
                             _int(threads, "threads", 0, _lib.PF_MAX_THREADS))


@functools.lru_cache(maxsize=16)
def _drawn_w(m, d, kind, norm, seed):
    W = projection(m, d, kind=kind, norm=norm, seed=seed)
    W.flags.writeable = False
    return W


def _favor_opts(sh, *, kernel, W, features, proj, norm, seed, eps, chunk, oprf_a, causal):
    """(pf_favor_opts, W array it points into)."""
    kid = _lib.kernel_id(kernel)
    if W is None and kid == _lib.KERNEL_ELU:
        # elu + 1 of each row itself: W = I, nothing drawn
        if features not in (256, sh.d):
            raise ValueError(f"kernel='elu' without W maps each row itself (W = I): features "
                             f"must be d = {sh.d}, got {features}")
        if proj != "orthogonal" or norm != "chi" or seed != 0:
            raise ValueError("kernel='elu' draws no W (W = I unless W is given): proj, norm and "
                             "seed do not apply")
        W = np.eye(sh.d, dtype=np.float32)
    elif W is None:
        m = _int(features, "features", 1, _INT_MAX)
        _lib.choice("proj", proj, _lib.PROJ_KINDS)
        _lib.choice("norm", norm, _lib.NORMS)
        W = _drawn_w(m, sh.d, proj, norm, _int(seed, "seed", 0, 2**64 - 1))
    else:
        if proj != "orthogonal" or norm != "chi" or seed != 0:
            raise ValueError("W is given: proj, norm and seed (which draw a W) do not apply")
        W = _f32(W, "W")
        ok = (W.ndim == 2 or (W.ndim == 3 and W.shape[0] == sh.H)) and W.shape[-1] == sh.d
        if not ok or W.shape[-2] < 1:
            raise ValueError(f"W has shape {W.shape}: expected (m, {sh.d}) or ({sh.H}, m, "
                             f"{sh.d}) (one W per head)")
        if features not in (256, W.shape[-2]):
            raise ValueError(f"features={features} disagrees with W's m = {W.shape[-2]}")
    if oprf_a is not None and kid != 4:
        raise ValueError("oprf_a is for kernel='oprf' only")
    if kid == 4 and causal and oprf_a is None:
        raise ValueError("kernel='oprf' with causal=True needs oprf_a: a causal A must be fixed "
                         "beforehand, not fitted to the sequence (whose later keys a query must "
                         "not see)")
    if kid == 5 and causal:
        raise NotSupported("kernel='sderf' is bidirectional only: its A is fitted to the "
                           "sequence's own queries and keys, which a causal query must not see; "
                           "use kernel='oprf' with oprf_a", _lib.PF_ENOTSUP, None)
    a = 0.0
    if oprf_a is not None:
        a = float(oprf_a)
        if not (math.isfinite(a) and a < 0.125):
            raise ValueError(f"oprf_a must be a finite number below 1/8, got {oprf_a!r}")
    fav = _lib.pf_favor_opts(kid, _ptr(W), W.shape[-2], 1 if W.ndim == 3 else 0,
                             _nonneg(eps, "eps"), _int(chunk, "chunk", 0, _INT_MAX),
                             1 if oprf_a is not None else 0, a)
    return fav, W


def _nonfinite_detail(named, function=""):
    for name, a in named:
        if a is not None and not np.isfinite(a).all():
            idx = np.unravel_index(int(np.argmin(np.isfinite(a))), a.shape)
            return f"{name} holds {a[idx]} at index {tuple(int(i) for i in idx)}"
    if "exact" in function:  # no feature map to change: the scores themselves overflowed
        return "a result is not finite: the scores overflow float32; try a smaller scale"
    return ("a result is not finite: try kernel='positive', a smaller scale, or eps > 0")


def _raise(st, function, named=()):
    detail = ""
    if st == _lib.PF_ENONFINITE:
        detail = _nonfinite_detail(named, function)
    elif st == _lib.PF_EDOMAIN:
        if "exact" in function:
            detail = "a query sees no key (every key of its row padded, or a zero denominator)"
        else:
            detail = ("a softmax or feature denominator is zero or not finite: try "
                      "kernel='positive', a smaller scale, or eps > 0")
    raise _lib.error(st, function, detail)


def _out(out, shape, inputs):
    if out is None:
        return np.empty(shape, np.float32)
    if not (type(out) is np.ndarray and out.dtype == np.float32 and out.flags.c_contiguous
            and out.flags.writeable and out.shape == shape):
        raise ValueError(f"out must be a writable float32 C-order array of shape {shape}")
    for a in inputs:
        if a is not None and np.may_share_memory(out, a):
            raise ValueError("out must not overlap an input")
    return out


# ---- attention ------------------------------------------------------------------------------

_FAVOR_ONLY = ("kernel", "features", "W", "proj", "norm", "eps", "chunk", "oprf_a")


def _check_method(method, kernel="positive", features=256, W=None, proj="orthogonal",
                  norm="chi", eps=0.0, chunk=0, oprf_a=None, seed=0, samples=None,
                  proposals=None, deterministic=False):
    """ValueError for an unknown method, or an option given away from its default that the
    method does not use (the tool refuses such flags too)."""
    if method not in _METHODS:
        raise ValueError(f"method '{method}' is not known: one of {', '.join(_METHODS)}")
    if method != "favor":
        moved = (kernel != "positive", features != 256, W is not None, proj != "orthogonal",
                 norm != "chi", eps != 0, chunk != 0, oprf_a is not None)
        if any(moved):
            name = _FAVOR_ONLY[moved.index(True)]
            raise ValueError(f"{name} is for method='favor' only; method='{method}' does not "
                             "use it")
    for name, moved, users in (("seed", seed != 0, ("favor", "ra", "lara")),
                               ("samples", samples is not None, ("ra", "lara")),
                               ("proposals", proposals is not None, ("lara",)),
                               ("deterministic", bool(deterministic), ("lara",))):
        if moved and method not in users:
            raise ValueError(f"{name} is for method='{' or '.join(users)}' only; "
                             f"method='{method}' does not use it")


def attention(q, k, v, *, method="favor", causal=False, kernel="positive", features=256, W=None,
              seed=0, scale=None, key_lengths=None, threads=0, proj="orthogonal", norm="chi",
              eps=0.0, chunk=0, oprf_a=None, samples=None, proposals=None, deterministic=False,
              out=None):
    """Attention of q on k and v: out (..,Lq,dv). Shapes (L,d), (H,L,d) or (B,H,L,d).

    method   "favor" (FAVOR+ random features, the default), "exact" (softmax, online, never an
             L x L matrix), "ra" (randomized attention), "lara" (bidirectional only).
    causal   query i sees keys j <= i only (needs Lq == Lk).
    scale    the logit scale s in exp(s q.k); None is 1/sqrt(d).
    key_lengths  B valid key lengths in [1, Lk] (the keys after them are padding), or None.
    threads  0: OpenMP's default; the result does not depend on it.
    out      an optional float32 C-order array of the output's shape to write into.

    float16 q, k and v (C order) with method "favor" and kernel positive, hyperbolic, trig or
    relu (and no out) are read in place, a block of rows widened to float32 at a time
    (pf_attn_favor_dt), and the output is float16: the float32 computation's, rounded once.
    Other dtypes are converted to float32 (one copy) and the output is float32.

    FAVOR+ (method "favor"):
    kernel   "positive" (FAVOR+), "hyperbolic", "trig", "relu", "oprf" (FAVOR++: A fitted per
             head, or oprf_a given; causal needs oprf_a), "sderf" (FAVOR#, bidirectional),
             "elu" (elu(Wx) + 1; W None is W = I, nothing drawn: the linear attention of
             Katharopoulos et al. 2020).
    W        the projection, (m,d) or (H,m,d) one per head, used as it is. None draws
             projection(features, d, kind=proj, norm=norm, seed=seed), the W `performer attn
             --features M --proj P --norm N --seed S` draws (the last 16 are cached).
    eps      kernel epsilon (see pf_features); chunk: causal chunk length (0: chosen).

    RA and LARA: seed, samples (per query / per proposal: 16 / 1), proposals (LARA: 16 or
    fewer), deterministic (LARA, samples 1).

    An option the chosen method does not use is refused (ValueError), as the tool does.
    Raises ValueError/TypeError for bad arguments; the library's statuses as the module
    docstring says (FloatingPointError names an input holding NaN or Inf).
    """
    _check_method(method, kernel, features, W, proj, norm, eps, chunk, oprf_a, seed, samples,
                  proposals, deterministic)
    if method == "favor" and out is None and kernel in _lib.HALF_KERNELS and \
            all(_f16_in_place(x) for x in (q, k, v)):
        return _favor_f16(q, k, v, causal, kernel, features, W, seed, scale, key_lengths,
                          threads, proj, norm, eps, chunk)
    q, k, v = _f32(q, "q"), _f32(k, "k"), _f32(v, "v")
    sh = _shape(q, k, v, causal)
    key_len = _key_lengths(key_lengths, sh)
    opts = _attn_opts(sh, scale, causal, key_len, threads)
    o = _out(out, q.shape[:-1] + (sh.dv,), (q, k, v))
    P = ctypes.byref
    if method == "favor":
        fav, Wa = _favor_opts(sh, kernel=kernel, W=W, features=features, proj=proj, norm=norm,
                              seed=seed, eps=eps, chunk=chunk, oprf_a=oprf_a, causal=causal)
        st = _L.pf_attn_favor(o.ctypes.data, q.ctypes.data, k.ctypes.data, v.ctypes.data,
                              P(sh), P(opts), P(fav))
        name, named = "pf_attn_favor", (("q", q), ("k", k), ("v", v), ("W", Wa))
    elif method == "exact":
        st = _L.pf_attn_exact(o.ctypes.data, None, q.ctypes.data, k.ctypes.data,
                              v.ctypes.data, P(sh), P(opts))
        name, named = "pf_attn_exact", (("q", q), ("k", k), ("v", v))
    else:
        if causal:
            raise NotSupported(f"method='{method}' is bidirectional only: causal randomized "
                               "attention is an open research question", _lib.PF_ENOTSUP, None)
        for name, a in (("q", q), ("k", k), ("v", v)):
            if not np.isfinite(a).all():
                _raise(_lib.PF_ENONFINITE, f"pf_attn_{method}", ((name, a),))
        samp = _sampling_opts(method, sh, key_len, seed, samples, proposals, deterministic)
        fn = _L.pf_attn_ra if method == "ra" else _L.pf_attn_lara
        st = fn(o.ctypes.data, q.ctypes.data, k.ctypes.data, v.ctypes.data, P(sh), P(opts),
                P(samp))
        name, named = f"pf_attn_{method}", (("q", q), ("k", k), ("v", v))
    if st != 0:
        _raise(st, name, named)
    return o


def _f16_in_place(x):
    return type(x) is np.ndarray and x.dtype == np.float16 and x.flags.c_contiguous and \
        x.flags.aligned


def _favor_f16(q, k, v, causal, kernel, features, W, seed, scale, key_lengths, threads, proj,
               norm, eps, chunk):
    """attention() of float16 q, k, v: pf_attn_favor_dt reads them in place (a block of rows
    widened at a time) and writes a float16 output, pf_attn_favor's on the widened inputs
    rounded once."""
    sh = _shape(q, k, v, causal)
    key_len = _key_lengths(key_lengths, sh)
    opts = _attn_opts(sh, scale, causal, key_len, threads)
    o = np.empty(q.shape[:-1] + (sh.dv,), np.float16)
    fav, Wa = _favor_opts(sh, kernel=kernel, W=W, features=features, proj=proj, norm=norm,
                          seed=seed, eps=eps, chunk=chunk, oprf_a=None, causal=causal)
    P = ctypes.byref
    st = _L.pf_attn_favor_dt(o.ctypes.data, q.ctypes.data, k.ctypes.data, v.ctypes.data,
                             _lib.PF_F16, P(sh), P(opts), P(fav))
    if st != 0:
        _raise(st, "pf_attn_favor_dt", (("q", q), ("k", k), ("v", v), ("W", Wa)))
    return o


def _sampling_opts(method, sh, key_len, seed, samples, proposals, deterministic):
    fit = min(sh.Lq, sh.Lk, int(key_len.min()) if key_len is not None else sh.Lk)
    s = _int(samples, "samples", 1, _INT_MAX) if samples is not None else \
        (16 if method == "ra" else 1)
    c = _int(proposals, "proposals", 1, _INT_MAX) if proposals is not None else min(fit, 16)
    if deterministic and s != 1:
        raise ValueError(f"deterministic takes one sample per proposal (omega = mu): samples "
                         f"must be 1, got {s}")
    if method == "lara" and c > fit:
        raise ValueError(f"proposals={c}: LARA needs every chunk to hold a query and a valid "
                         f"key, so at most {fit} here")
    return _lib.pf_sampling_opts(s, c, 1 if deterministic else 0,
                                 _int(seed, "seed", 0, 2**64 - 1))


def attention_grad(q, k, v, dout, *, method="favor", causal=False, kernel="positive",
                   features=256, W=None, seed=0, scale=None, key_lengths=None, threads=0,
                   proj="orthogonal", norm="chi", eps=0.0, chunk=0, oprf_a=None):
    """The forward and the gradients of sum(out * dout): (out, dq, dk, dv), each shaped like
    the array it belongs to. method "favor" (the forward keeps its features for the backward,
    pf_attn_favor_save; the gradients are the bits of pf_attn_favor_backward) or "exact" (the
    flash-style backward from the forward's log-sum-exp). Options as in attention(); the
    bits of `performer attn --grad-out DO --grad-prefix P` given the same W."""
    if method not in ("favor", "exact"):
        raise ValueError(f"method '{method}' has no backward pass: 'favor' or 'exact'")
    _check_method(method, kernel, features, W, proj, norm, eps, chunk, oprf_a, seed)
    q, k, v, dout = _f32(q, "q"), _f32(k, "k"), _f32(v, "v"), _f32(dout, "dout")
    sh = _shape(q, k, v, causal)
    oshape = q.shape[:-1] + (sh.dv,)
    if dout.shape != oshape:
        raise ValueError(f"dout has shape {dout.shape}: expected the output's shape {oshape}")
    key_len = _key_lengths(key_lengths, sh)
    opts = _attn_opts(sh, scale, causal, key_len, threads)
    o = np.empty(oshape, np.float32)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    P = ctypes.byref
    named = (("q", q), ("k", k), ("v", v), ("dout", dout))
    if method == "exact":
        lse = np.empty(q.shape[:-1], np.float32)
        st = _L.pf_attn_exact(o.ctypes.data, lse.ctypes.data, q.ctypes.data, k.ctypes.data,
                              v.ctypes.data, P(sh), P(opts))
        if st:
            _raise(st, "pf_attn_exact", named)
        st = _L.pf_attn_exact_backward(dq.ctypes.data, dk.ctypes.data, dv.ctypes.data,
                                       dout.ctypes.data, q.ctypes.data, k.ctypes.data,
                                       v.ctypes.data, o.ctypes.data, lse.ctypes.data, P(sh),
                                       P(opts))
        if st:
            _raise(st, "pf_attn_exact_backward", named)
        return o, dq, dk, dv
    fav, Wa = _favor_opts(sh, kernel=kernel, W=W, features=features, proj=proj, norm=norm,
                          seed=seed, eps=eps, chunk=chunk, oprf_a=oprf_a, causal=causal)
    named += (("W", Wa),)
    saved = _Saved(sh, opts, fav, 0)
    st = _L.pf_attn_favor_save(o.ctypes.data, q.ctypes.data, k.ctypes.data, v.ctypes.data,
                               P(sh), P(opts), P(fav), saved.ptr)
    if st:
        _raise(st, "pf_attn_favor_save", named)
    st = _L.pf_attn_favor_backward_saved(dq.ctypes.data, dk.ctypes.data, dv.ctypes.data,
                                         dout.ctypes.data, q.ctypes.data, k.ctypes.data,
                                         v.ctypes.data, o.ctypes.data, P(sh), P(opts), P(fav),
                                         saved.ptr)
    saved.free()
    if st:
        _raise(st, "pf_attn_favor_backward_saved", named)
    return o, dq, dk, dv


class _Saved:
    """A pf_favor_saved: the features a FAVOR+ forward keeps for its backward, for as many
    heads as fit in max_bytes (0: every head); nbytes is what it holds. Freed by free() or
    when collected."""

    __slots__ = ("ptr", "nbytes")

    def __init__(self, sh, opts, fav, max_bytes):
        p = ctypes.c_void_p()
        st = _L.pf_favor_saved_create(ctypes.byref(p), ctypes.byref(sh), ctypes.byref(opts),
                                      ctypes.byref(fav), max_bytes)
        if st:
            _raise(st, "pf_favor_saved_create")
        self.ptr = p.value
        self.nbytes = _L.pf_favor_saved_bytes(self.ptr)

    @property
    def bytes(self):
        return _L.pf_favor_saved_bytes(self.ptr)

    @property
    def heads(self):
        return _L.pf_favor_saved_heads(self.ptr)

    def free(self):
        if self.ptr:
            _L.pf_favor_saved_free(self.ptr)
            self.ptr = None

    def __del__(self):
        try:
            self.free()
        except Exception:  # at interpreter exit the module may be gone: the process frees all
            pass


# ---- projections and features ---------------------------------------------------------------

def projection(m, d, kind="orthogonal", norm="chi", seed=0, stream=0):
    """A random projection W (m,d), float32, from the counter-based generator: the same
    (seed, stream) gives the same W on every machine and thread count.

    kind  "orthogonal" (stacked Haar-random orthogonal d x d blocks, the last one cut) or "iid"
          (every entry N(0,1)).
    norm  row lengths: "chi" (each that of an independent N(0,I_d) vector, so each row is
          marginally N(0,I): unbiased), "sqrtd" (every row sqrt(d)), "qmc" (chi quantiles at
          i/(m+1), permuted). For iid with chi the rows are used as drawn.
    """
    m, d = _int(m, "m", 1, _INT_MAX), _int(d, "d", 1, _INT_MAX)
    W = np.empty((m, d), np.float32)
    st = _L.pf_projection_draw(W.ctypes.data, m, d, _lib.choice("kind", kind, _lib.PROJ_KINDS),
                               _lib.choice("norm", norm, _lib.NORMS),
                               _int(seed, "seed", 0, 2**64 - 1),
                               _int(stream, "stream", 0, 2**64 - 1))
    if st:
        _raise(st, "pf_projection_draw")
    return W


def _kernel_params(kid, d, oprf_a, sderf):
    if kid == 4:
        if oprf_a is None:
            raise ValueError("kernel='oprf' needs oprf_a (oprf_optimal_a gives the best one)")
        return _lib.pf_kernel_params(float(oprf_a), None, None, 0.0), ()
    if oprf_a is not None:
        raise ValueError("oprf_a is for kernel='oprf' only")
    if kid == 5:
        if sderf is None:
            raise ValueError("kernel='sderf' needs sderf=(A, B, log_D), as sderf_params gives")
        A, B, log_D = sderf
        A, B = _f32(A, "sderf A"), _f32(B, "sderf B")
        if A.shape != (d, d) or B.shape != (d, d):
            raise ValueError(f"sderf's A and B must be ({d}, {d}), got {A.shape}, {B.shape}")
        return _lib.pf_kernel_params(0.0, A.ctypes.data, B.ctypes.data, float(log_D)), (A, B)
    if sderf is not None:
        raise ValueError("sderf is for kernel='sderf' only")
    return None, ()


def features(x, W, kernel="positive", *, scale=None, eps=0.0, stabilize=False, oprf_a=None,
             sderf=None):
    """The random features phi(x) (..,r) of rows x (..,d) with W (m,d), r = kernel_width(kernel,
    m), such that phi(q).phi(k) estimates exp(scale q.k) (scale None: 1/sqrt(d); inputs are
    scaled by sqrt(scale) first). Maps as in performer.h: positive exp(Wx - |x|^2/2)/sqrt(m),
    hyperbolic, trig, relu relu(Wx)/sqrt(m) + eps, oprf (oprf_a=A), sderf
    (sderf=(A, B, log_D) from sderf_params), elu elu(Wx) + 1 + eps (W = np.eye(d): the linear
    attention's map elu(x) + 1).

    stabilize False returns phi itself (FloatingPointError if it overflows float32); True
    returns (phi / exp(c), c) with c (..,) the removed log factor of each row, chosen so the
    row's largest |feature| is O(1) (0 for relu and elu)."""
    kid = _lib.kernel_id(kernel)
    x, W = _f32(x, "x"), _f32(W, "W")
    if x.ndim < 1 or W.ndim != 2 or W.shape[1] != x.shape[-1]:
        raise ValueError(f"x (..,d) and W (m,d) must share d: shapes {x.shape}, {W.shape}")
    n, d, m = x.size // max(x.shape[-1], 1), x.shape[-1], W.shape[0]
    if n < 1 or d < 1 or m < 1 or max(n, d, m) > _INT_MAX:
        raise ValueError(f"x {x.shape} and W {W.shape} must be non-empty")
    params, keep = _kernel_params(kid, d, oprf_a, sderf)
    r = _L.pf_kernel_width(kid, m)
    phi = np.empty(x.shape[:-1] + (r,), np.float32)
    c = np.empty(x.shape[:-1], np.float32) if stabilize else None
    st = _L.pf_features_ex(phi.ctypes.data, _ptr(c), x.ctypes.data, n, d, W.ctypes.data, m, kid,
                           _scale(scale), _nonneg(eps, "eps"),
                           ctypes.byref(params) if params is not None else None)
    if st:
        _raise(st, "pf_features_ex", (("x", x), ("W", W)) + tuple(zip(("A", "B"), keep)))
    return (phi, c) if stabilize else phi


def _two_sides(q, k):
    q, k = _f32(q, "q"), _f32(k, "k")
    if q.ndim != 2 or k.ndim != 2 or q.shape[1] != k.shape[1] or min(q.shape + k.shape) < 1:
        raise ValueError(f"q (Lq,d) and k (Lk,d) must be non-empty and share d: shapes "
                         f"{q.shape}, {k.shape}")
    return q, k


def oprf_optimal_a(q, k, scale=None):
    """FAVOR++'s A minimising the features' variance for queries q (Lq,d) and keys k (Lk,d)
    (pass the valid rows only): a float <= 0."""
    q, k = _two_sides(q, k)
    a = ctypes.c_float()
    st = _L.pf_oprf_optimal_a(ctypes.byref(a), q.ctypes.data, q.shape[0], k.ctypes.data,
                              k.shape[0], q.shape[1], _scale(scale))
    if st:
        _raise(st, "pf_oprf_optimal_a", (("q", q), ("k", k)))
    return a.value


def sderf_params(q, k, scale=None):
    """FAVOR#'s parameters for queries q (Lq,d) and keys k (Lk,d) (valid rows only):
    (A (d,d), B (d,d), log_D), for features(..., kernel="sderf", sderf=...)."""
    q, k = _two_sides(q, k)
    d = q.shape[1]
    A, B, log_D = np.empty((d, d), np.float32), np.empty((d, d), np.float32), ctypes.c_double()
    st = _L.pf_sderf_params(A.ctypes.data, B.ctypes.data, ctypes.byref(log_D), q.ctypes.data,
                            q.shape[0], k.ctypes.data, k.shape[0], d, _scale(scale))
    if st:
        _raise(st, "pf_sderf_params", (("q", q), ("k", k)))
    return A, B, log_D.value


# ---- inspecting attention ------------------------------------------------------------------

def _f64(x, name):
    """x as a float64 C-order array (TypeError for what is not real numbers)."""
    a = np.asarray(x)
    if a.dtype.kind not in "fiu":
        raise TypeError(f"{name}: dtype {a.dtype} is not supported: real numbers only")
    return np.ascontiguousarray(a, dtype=np.float64)


def attention_entropy(q, k, *, causal=True, scale=None):
    """The entropy in nats of each row of softmax attention of q on k: (..,Lq), float64.

    q (..,Lq,d) and k (..,Lk,d), shapes (L,d), (H,L,d) or (B,H,L,d) as attention() takes them
    (causal needs Lq == Lk). With s the scale (None: 1/sqrt(d), as the library's attention) and
    row i seeing keys j in J_i (j <= i when causal, every key otherwise),

        p_ij = exp(s q_i.k_j) / Z_i,  Z_i = sum over j in J_i of exp(s q_i.k_j),
        H_i  = -sum over j in J_i of p_ij log p_ij  =  log Z_i - sum over j in J_i of p_ij s q_i.k_j

    computed in float64 (the scores less their row's largest, so nothing overflows), a block of
    rows at a time. 0 <= H_i <= log |J_i|: 0 when one key takes all the weight, log |J_i| (log(i
    + 1) for causal row i) when the weights are uniform; a layer's mean H against the uniform
    rows' mean says how sharp its attention is. FloatingPointError if q or k holds NaN or Inf."""
    q, k = _f64(q, "q"), _f64(k, "k")
    qs, ks = q.shape, k.shape
    if q.ndim not in (2, 3, 4) or k.ndim != q.ndim:
        raise ValueError(f"q and k must both be (L,d), (H,L,d) or (B,H,L,d): shapes {qs}, {ks}")
    if qs[:-2] != ks[:-2] or qs[-1] != ks[-1]:
        raise ValueError(f"q and k must agree in their leading dimensions and width d: shapes "
                         f"{qs}, {ks}")
    if min(qs + ks) < 1:
        raise ValueError(f"q and k must be non-empty: shapes {qs}, {ks}")
    Lq, Lk, d = qs[-2], ks[-2], qs[-1]
    if causal and Lq != Lk:
        raise ValueError(f"causal attention needs as many queries as keys (Lq = {Lq}, "
                         f"Lk = {Lk})")
    s = _scale(scale) or 1.0 / math.sqrt(d)
    for name, a in (("q", q), ("k", k)):
        if not np.isfinite(a).all():
            _raise(_lib.PF_ENONFINITE, "attention_entropy", ((name, a),))
    qf, kt = q.reshape(-1, Lq, d), k.reshape(-1, Lk, d).transpose(0, 2, 1)
    n = qf.shape[0]
    out = np.empty((n, Lq), np.float64)
    rows = max(1, (1 << 21) // (n * Lk))  # a block's scores: about 16 MiB
    j = np.arange(Lk)
    for i0 in range(0, Lq, rows):
        i1 = min(Lq, i0 + rows)
        with np.errstate(over="ignore", invalid="ignore"):      # found below, said there
            x = s * np.matmul(qf[:, i0:i1], kt)                  # (n, rows, Lk)
        if not np.isfinite(x).all():
            raise NonFinite("attention_entropy: a score overflows float64; try a smaller scale",
                            _lib.PF_ENONFINITE, "attention_entropy")
        unseen = j[None, :] > np.arange(i0, i1)[:, None] if causal else None
        if unseen is not None:
            x[:, unseen] = -np.inf
        x -= x.max(axis=-1, keepdims=True)                       # <= 0, the largest 0
        e = np.exp(x)
        z = e.sum(axis=-1)                                       # >= 1
        if unseen is not None:
            x[:, unseen] = 0.0                                   # (their weights are 0)
        out[:, i0:i1] = np.log(z) - (e * x).sum(axis=-1) / z
    return out.reshape(qs[:-1])


# ---- training data: multi-query associative recall --------------------------------------------

def mqar_batch(batch, context, *, pairs=8, queries=None, keys=64, seed=0, stream=0):
    """MQAR sequences as `performer train --task mqar` trains on them (pf_mqar_batch): tokens and
    targets, two int32 arrays (batch, context). Each sequence opens with `pairs` key-value pairs
    (keys are bytes [0, keys), values [keys, 2 keys)); `queries` of the keys (default: pairs)
    come back later, each at a position whose target is its value; every other target is -1
    (not scored) and every other token filler [2 keys, 256). Sequence b is a function of (seed,
    stream, b) alone, whatever the batch: the same arguments give the same sequences on every
    machine. (`performer train` draws step s's batch from (data seed, s) and its validation
    batch i from (data seed, 2^63 + i).) InvalidArgument where 1 <= pairs <= keys <= 127,
    queries >= 1 or 2 pairs + 2 queries <= context does not hold.
    """
    batch = _int(batch, "batch", 1, _INT_MAX)
    context = _int(context, "context", 1, _INT_MAX)
    lo = -_INT_MAX - 1  # any C int: pf_mqar_check says what it refuses
    task = _lib.pf_mqar(_int(pairs, "pairs", lo, _INT_MAX),
                        _int(pairs if queries is None else queries, "queries", lo, _INT_MAX),
                        _int(keys, "keys", lo, _INT_MAX))
    if _L.pf_mqar_check(ctypes.byref(task), context) != _lib.PF_OK:
        raise InvalidArgument(
            f"mqar_batch: {task.pairs} pairs, {task.queries} queries and {task.keys} keys do not "
            f"fit sequences of {context}: 1 <= pairs <= keys <= 127, queries >= 1 and "
            "2 pairs + 2 queries <= context", _lib.PF_EINVAL, "pf_mqar_check")
    if batch * context > 2**40:
        raise InvalidArgument(f"mqar_batch: {batch} x {context} tokens is too many",
                              _lib.PF_EINVAL, "pf_mqar_batch")
    tokens = np.empty((batch, context), np.int32)
    targets = np.empty((batch, context), np.int32)
    st = _L.pf_mqar_batch(ctypes.byref(task), tokens.ctypes.data, targets.ctypes.data, batch,
                          context, _int(seed, "seed", 0, 2**64 - 1),
                          _int(stream, "stream", 0, 2**64 - 1))
    if st:
        _raise(st, "pf_mqar_batch")
    return tokens, targets


# ---- decoding -------------------------------------------------------------------------------

class _Closing:
    """A `with` block closes it, and so does collection (close() is the subclass's)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # at interpreter exit the module may be gone: the process frees all
            pass


class DecodeState(_Closing):
    """Causal FAVOR+ one token (or a few) at a time: the running state (S, z, key maximum) of
    `heads` heads of one sequence -- or of `sequences` of them, each at its own position --
    pf_favor_state_*. Memory and time per token O(heads r dv) whatever the context length; the
    rows are those the causal attention() gives (bit for bit for steps of whole chunks under
    performer.h's conditions, else to float rounding). A step that fails changes nothing.

        st = performer.DecodeState(8, 64, 64, W)      # heads, d, dv, W (m,d) or (8,m,d)
        st.prefill(q[:, :n], k[:, :n], v[:, :n])      # a prompt at once (heads,n,d) -> (heads,n,dv)
        for t in range(n, T):
            o = st.step(q[:, t], k[:, t], v[:, t])    # (8,64) each -> (8,64)

    Serving several sequences (beams, users): DecodeState(..., sequences=N); step_many() steps
    all or some by a token, each succeeding or failing alone; copy(dst, src) branches a sequence,
    reset(seq) empties one; save()/load() (bytes) and save_file()/load_file() snapshot a
    sequence, refusing one of another shape, map or W.

    W is copied by the library. kernel: positive, hyperbolic, trig, relu, elu, or oprf with oprf_a
    (a causal A is fixed beforehand). scale None is 1/sqrt(d). Not to be shared by threads
    without a lock. close() (or a `with` block) frees it at once; it is freed when collected
    anyway."""

    def __init__(self, heads, d, dv, W, *, sequences=1, kernel="positive", scale=None, eps=0.0,
                 chunk=0, oprf_a=None):
        self._ptr = None
        if W is None:
            raise ValueError("DecodeState needs W, the projection the model's attention uses: "
                             "performer.projection(m, d, seed=...) draws one (a default W would "
                             "silently decode with other features than the model's)")
        H = _int(heads, "heads", 1, _INT_MAX)
        self.heads, self.d, self.dv = H, _int(d, "d", 1, _INT_MAX), _int(dv, "dv", 1, _INT_MAX)
        sh = _lib.pf_shape(1, H, 1, 1, self.d, self.dv)
        fav, _ = _favor_opts(sh, kernel=kernel, W=W, features=256, proj="orthogonal",
                             norm="chi", seed=0, eps=eps, chunk=chunk, oprf_a=oprf_a,
                             causal=True)
        self.sequences = _int(sequences, "sequences", 1, _INT_MAX)
        p = ctypes.c_void_p()
        st = _L.pf_favor_state_create_n(ctypes.byref(p), self.sequences, H, self.d, self.dv,
                                        _scale(scale), ctypes.byref(fav))
        if st:
            _raise(st, "pf_favor_state_create_n", (("W", _f32(W, "W")),))
        self._ptr = p.value

    @property
    def position(self):
        """Tokens consumed since creation or the last reset() (sequence 0's)."""
        return _L.pf_favor_state_position(self._live())

    @property
    def positions(self):
        """Every sequence's position, a list."""
        ptr = self._live()
        return [_L.pf_favor_state_position_of(ptr, i) for i in range(self.sequences)]

    def _seq(self, seq):
        return _int(seq, "seq", 0, self.sequences - 1)

    def _live(self):
        if not self._ptr:
            raise ValueError("this DecodeState is closed")
        return self._ptr

    def reset(self, seq=None):
        """Empties every sequence (position 0), keeping W; or sequence `seq` alone."""
        if seq is None:
            st = _L.pf_favor_state_reset(self._live())
        else:
            st = _L.pf_favor_state_reset_seq(self._live(), self._seq(seq))
        if st:
            _raise(st, "pf_favor_state_reset")

    def prefill(self, q, k, v, seq=0):
        """A prompt of n tokens into sequence `seq` by the chunked causal pass: q, k (heads,n,d),
        v (heads,n,dv) -> out (heads,n,dv). Decoding after it gives what stepping each token
        would, to float rounding."""
        ptr, s1 = self._live(), self._seq(seq)
        q, k, v = _f32(q, "q"), _f32(k, "k"), _f32(v, "v")
        H, d, dv = self.heads, self.d, self.dv
        n = q.shape[1] if q.ndim == 3 else 0
        want = ((H, n, d), (H, n, d), (H, n, dv))
        if (q.shape, k.shape, v.shape) != want or n < 1:
            raise ValueError(f"prefill takes q, k (heads,n,d), v (heads,n,dv) with heads={H}, "
                             f"d={d}, dv={dv}, n >= 1; got shapes {q.shape}, {k.shape}, "
                             f"{v.shape}")
        out = np.empty(want[2], np.float32)
        st = _L.pf_favor_state_prefill(ptr, s1, out.ctypes.data, q.ctypes.data, k.ctypes.data,
                                       v.ctypes.data, n)
        if st:
            _raise(st, "pf_favor_state_prefill", (("q", q), ("k", k), ("v", v)))
        return out

    def step_many(self, q, k, v, seqs=None):
        """One token for each of `count` sequences: q, k (count,heads,d), v (count,heads,dv) ->
        (out (count,heads,dv), statuses), seqs the sequences (None: 0..count-1), each once.
        statuses (an int32 array; performer.STATUS_NAMES names them) says how each sequence
        fared: one that failed is left as it was (its rows zeros), the others advance.
        ValueError for bad arguments (nothing stepped)."""
        ptr = self._live()
        q, k, v = _f32(q, "q"), _f32(k, "k"), _f32(v, "v")
        H, d, dv = self.heads, self.d, self.dv
        count = q.shape[0] if q.ndim == 3 else 0
        want = ((count, H, d), (count, H, d), (count, H, dv))
        if (q.shape, k.shape, v.shape) != want or not 1 <= count <= self.sequences:
            raise ValueError(f"step_many takes q, k (count,heads,d), v (count,heads,dv) with "
                             f"heads={H}, d={d}, dv={dv}, 1 <= count <= {self.sequences}; got "
                             f"shapes {q.shape}, {k.shape}, {v.shape}")
        if seqs is not None:
            seqs = np.asarray(seqs)
            if seqs.shape != (count,) or seqs.dtype.kind not in "iu":
                raise ValueError(f"seqs must be {count} sequence numbers (integers), got "
                                 f"{seqs.dtype} of shape {seqs.shape}")
            if len(set(seqs.tolist())) != count or seqs.min() < 0 or seqs.max() >= self.sequences:
                raise ValueError(f"seqs must name distinct sequences in 0..{self.sequences - 1}, "
                                 f"got {seqs.tolist()}")
            seqs = np.ascontiguousarray(seqs, np.int32)
        out = np.empty(want[2], np.float32)
        statuses = np.zeros(count, np.int32)
        st = _L.pf_favor_state_step_n(ptr, out.ctypes.data, q.ctypes.data, k.ctypes.data,
                                      v.ctypes.data, None if seqs is None else seqs.ctypes.data,
                                      count, statuses.ctypes.data)
        if st == _lib.PF_EINVAL or st == _lib.PF_ENOMEM:
            _raise(st, "pf_favor_state_step_n")
        return out, statuses

    def copy(self, dst, src):
        """Sequence dst becomes a copy of sequence src (it continues src's context)."""
        st = _L.pf_favor_state_copy_seq(self._live(), self._seq(dst), self._seq(src))
        if st:
            _raise(st, "pf_favor_state_copy_seq")

    def save(self, seq=0):
        """A snapshot of sequence `seq` (bytes): its position and state, with the shape, map and
        a fingerprint of W, under a CRC-32."""
        ptr, s1 = self._live(), self._seq(seq)
        n = _L.pf_favor_state_snapshot_bytes(ptr)
        buf = ctypes.create_string_buffer(n)
        st = _L.pf_favor_state_save(ptr, s1, buf, n)
        if st:
            _raise(st, "pf_favor_state_save")
        return buf.raw

    def load(self, data, seq=0):
        """Restores sequence `seq` from save()'s bytes; one of another shape, map or W, truncated
        or corrupted is refused (ValueError, with why) and nothing changes."""
        ptr, s1 = self._live(), self._seq(seq)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ValueError(f"load takes the bytes save() gave, not {type(data).__name__}")
        data = bytes(data)
        msg = ctypes.create_string_buffer(512)
        st = _L.pf_favor_state_load(ptr, s1, data, len(data), msg, 512)
        if st:
            raise _lib.error(st, "pf_favor_state_load", msg.value.decode(errors="replace"))

    def save_file(self, path, seq=0):
        """save() into a file, atomically (a temporary file renamed over path)."""
        msg = ctypes.create_string_buffer(512)
        st = _L.pf_favor_state_save_file(self._live(), self._seq(seq), os.fsencode(path), msg, 512)
        if st:
            raise _lib.error(st, "pf_favor_state_save_file", msg.value.decode(errors="replace"))

    def load_file(self, path, seq=0):
        """load() from a file save_file() wrote."""
        msg = ctypes.create_string_buffer(512)
        st = _L.pf_favor_state_load_file(self._live(), self._seq(seq), os.fsencode(path), msg, 512)
        if st:
            raise _lib.error(st, "pf_favor_state_load_file", msg.value.decode(errors="replace"))

    def step(self, q, k, v):
        """Feeds tokens: q, k (heads,d) and v (heads,dv) for one token, giving out (heads,dv);
        or (heads,n,d), (heads,n,dv) for n tokens, giving (heads,n,dv). Each row attends to
        every earlier token and itself. float16 q, k and v (C order) go to
        pf_favor_state_step_dt as they are and give a float16 out (the state stays float32);
        other dtypes are converted to float32."""
        ptr = self._live()
        half = all(_f16_in_place(x) for x in (q, k, v))
        if not half:
            q, k, v = _f32(q, "q"), _f32(k, "k"), _f32(v, "v")
        one = q.ndim == 2
        H, d, dv = self.heads, self.d, self.dv
        n = 1 if one else (q.shape[1] if q.ndim == 3 else 0)
        want = ((H, d), (H, d), (H, dv)) if one else ((H, n, d), (H, n, d), (H, n, dv))
        if (q.shape, k.shape, v.shape) != want or n < 1:
            raise ValueError(f"step takes q, k (heads,d), v (heads,dv) or q, k (heads,n,d), "
                             f"v (heads,n,dv) with heads={H}, d={d}, dv={dv}; got shapes "
                             f"{q.shape}, {k.shape}, {v.shape}")
        if half:
            out = np.empty(want[2], np.float16)
            st = _L.pf_favor_state_step_dt(ptr, out.ctypes.data, q.ctypes.data, k.ctypes.data,
                                           v.ctypes.data, n, _lib.PF_F16)
            fn = "pf_favor_state_step_dt"
        else:
            out = np.empty(want[2], np.float32)
            st = _L.pf_favor_state_step(ptr, out.ctypes.data, q.ctypes.data, k.ctypes.data,
                                        v.ctypes.data, n)
            fn = "pf_favor_state_step"
        if st:
            _raise(st, fn, (("q", q), ("k", k), ("v", v)))
        return out

    def close(self):
        if self._ptr:
            _L.pf_favor_state_free(self._ptr)
            self._ptr = None


# ---- language models ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A model's configuration, pf_model_config's fields (performer.h): context (the longest
    sequence T), layers, d_model (C), heads (H), attention ("exact", "favor", "favor++",
    "local"), positions ("learned", "rotary"), kernel (FAVOR+'s map: "positive", ...),
    features (m, the rows of each layer's W), redraw, seed, w_seed, window (local attention's).
    dataclasses.asdict(config) gives them as a dict."""
    context: int
    layers: int
    d_model: int
    heads: int
    attention: str
    positions: str
    kernel: str
    features: int
    redraw: int
    seed: int
    w_seed: int
    window: int

    @property
    def head_dim(self):
        """hd = d_model / heads, the width of each head's q, k and v."""
        return self.d_model // self.heads


def _name_of(names, value, what):
    return names[value] if 0 <= value < len(names) else f"{what} {value}"


class Model(_Closing):
    """A trained byte-level language model read from a checkpoint `performer train` wrote (a
    safetensors file; pf_model_load), for looking at what each layer's attention sees and what
    the model predicts:

        m = performer.Model("data/demo-kjv.safetensors")
        q, k, v = m.attention_inputs(b"In the beginning God created", layer=0)   # (1,H,T,hd)
        h = performer.attention_entropy(q, k)                                  # (1,H,T)
        z = m.logits(b"In the beginning God created")                          # (1,T,256)
        nats = m.token_losses(b"In the beginning God created")                 # (1,T-1)

    config is its ModelConfig. A file that cannot be read raises performer.LibraryIOError (an
    OSError; FileNotFoundError too when there is no file), one that is not a checkpoint
    performer.FormatError (a ValueError), each with the library's message. Calls on one Model
    take turns (a lock); close() (or a `with` block) frees it at once; it is freed when
    collected anyway."""

    def __init__(self, path):
        self._ptr = None
        self._lock = threading.Lock()
        bpath = os.fsencode(path)
        p = ctypes.c_void_p()
        msg = ctypes.create_string_buffer(1024)
        st = _L.pf_model_load(ctypes.byref(p), bpath, msg, len(msg))
        if st:
            e = _lib.error(st, "pf_model_load", msg.value.decode(errors="replace"))
            if st == _lib.PF_EIO and not os.path.lexists(bpath):
                e = _lib.MissingFile(str(e), st, "pf_model_load")
            raise e
        self._ptr = p.value
        c = _L.pf_model_get_config(self._ptr)
        self.path = os.fsdecode(bpath)
        self.config = ModelConfig(
            context=c.context, layers=c.layers, d_model=c.d_model, heads=c.heads,
            attention=_name_of(_lib.LM_ATTENTIONS, c.attention, "attention"),
            positions=_name_of(_lib.LM_POSITIONS, c.positions, "positions"),
            kernel=_name_of(_lib.KERNEL_NAMES, c.kernel, "kernel"), features=c.features,
            redraw=c.redraw, seed=c.seed, w_seed=c.w_seed, window=c.window)

    def _live(self):
        if not self._ptr:
            raise ValueError("this Model is closed")
        return self._ptr

    @property
    def num_params(self):
        """The trainable parameters (every float of the weights)."""
        with self._lock:
            return _L.pf_model_num_params(self._live())

    def meta(self, key):
        """A value of the checkpoint's "__metadata__" (a string), or None."""
        if not isinstance(key, str):
            raise TypeError(f"key must be a string, got {type(key).__name__}")
        with self._lock:
            r = _L.pf_model_meta(self._live(), key.encode())
        return None if r is None else r.decode(errors="replace")

    def _tokens(self, tokens, name="tokens"):
        """tokens as an int32 (B,T) C-order array of bytes, T <= context (name: what the
        messages call it)."""
        if isinstance(tokens, (bytes, bytearray, memoryview)):
            a = np.frombuffer(bytes(tokens), np.uint8).reshape(1, -1)
        else:
            a = np.asarray(tokens)
            if a.dtype.kind not in "iu":
                raise TypeError(f"{name}: dtype {a.dtype} is not supported: integers (bytes "
                                "0..255), or a bytes object")
        if a.ndim != 2:
            raise ValueError(f"{name} has shape {a.shape}: expected (B,T) ({name}[None] for one "
                             "sequence), or a bytes object")
        B, T = a.shape
        if B < 1 or T < 1:
            raise ValueError(f"{name} has shape {a.shape}: expected B >= 1 sequences of T >= 1 "
                             "tokens")
        if T > self.config.context:
            raise ValueError(f"{name} has T = {T} tokens a sequence: the model's context is "
                             f"{self.config.context}")
        if B > _INT_MAX:
            raise ValueError(f"{name} has B = {B} sequences: at most 2^31 - 1")
        bad = (a < 0) | (a > 255)
        if bad.any():
            idx = np.unravel_index(int(np.argmax(bad)), a.shape)
            raise ValueError(f"{name}[{idx[0]}, {idx[1]}] = {a[idx]} is not a byte (0..255)")
        return np.ascontiguousarray(a, dtype=np.int32)

    def attention_inputs(self, tokens, layer):
        """What layer `layer` (0-based) feeds its attention for tokens (B,T), T <= context,
        integers in 0..255 (or a bytes object, B = 1): (q, k, v), float32 (B,H,T,hd), the heads
        split as the attention gets them (q and k rotated by position with rotary positions; the
        attention scales q.k by 1/sqrt(hd) itself). pf_model_attention_inputs: the model's
        forward in evaluation mode, every sequence on its own."""
        tok = self._tokens(tokens)
        c = self.config
        B, T = tok.shape
        shape = (B, c.heads, T, c.head_dim)
        q, k, v = (np.empty(shape, np.float32) for _ in range(3))
        with self._lock:
            ptr = self._live()
            lay = _int(layer, "layer", 0, c.layers - 1)
            st = _L.pf_model_attention_inputs(ptr, q.ctypes.data, k.ctypes.data, v.ctypes.data,
                                              tok.ctypes.data, B, T, lay)
        if st:
            _raise(st, "pf_model_attention_inputs")
        return q, k, v

    def logits(self, tokens):
        """The next-byte logits of tokens (B,T), T <= context, integers in 0..255 (or a bytes
        object, B = 1): float32 (B,T,256), row t scoring the byte after tokens[:, t] from
        tokens[:, :t + 1] alone (the model is causal). pf_model_forward without targets, in
        evaluation mode (FAVOR's W and FAVOR++'s statistic as the checkpoint left them), every
        sequence on its own."""
        tok = self._tokens(tokens)
        B, T = tok.shape
        out = np.empty((B, T, 256), np.float32)
        with self._lock:
            ptr = self._live()
            _L.pf_model_set_training(ptr, 0)  # (it is already; fails only on a NULL model)
            st = _L.pf_model_forward(ptr, None, out.ctypes.data, tok.ctypes.data, None, B, T)
        if st:
            _raise(st, "pf_model_forward")
        return out

    def token_losses(self, tokens, targets=None):
        """The cross-entropy in nats of each position, float64: -log softmax(logits)[target],
        from logits(tokens) by a log-sum-exp in float64 numpy.

        targets None: each position's target is the next token, so the last position has none:
        (B,T-1), entry [b, t] the loss of predicting tokens[b, t + 1] from tokens[b, :t + 1]
        (T >= 2 needed). targets given: bytes 0..255 of tokens' shape (B,T) (a bytes object for
        B = 1), entry [b, t] the loss of predicting targets[b, t] from tokens[b, :t + 1]: (B,T).
        Their mean over many windows, by position, says how much a position gains from the
        context before it."""
        tok = self._tokens(tokens)
        if targets is None:
            if tok.shape[1] < 2:
                raise ValueError(f"tokens has T = {tok.shape[1]}: the next-token targets need "
                                 "T >= 2 (or give targets)")
            z = self.logits(tok)[:, :-1]
            tgt = tok[:, 1:]
        else:
            tgt = self._tokens(targets, "targets")
            if tgt.shape != tok.shape:
                raise ValueError(f"targets has shape {tgt.shape}: expected tokens' shape "
                                 f"{tok.shape}")
            z = self.logits(tok)
        z = z.astype(np.float64)
        top = z.max(axis=-1)
        lse = top + np.log(np.exp(z - top[..., None]).sum(axis=-1))
        return lse - np.take_along_axis(z, tgt[..., None].astype(np.intp), axis=-1)[..., 0]

    def close(self):
        with self._lock:
            if self._ptr:
                _L.pf_model_free(self._ptr)
                self._ptr = None
