"""libperformer_cuda (include/performer_cuda.h), loaded with ctypes on first use: where it is
found, every prototype (argtypes and restype), one context per device, statuses as exceptions.

Nothing here is loaded when the package is imported: performer.torch calls lib() when a CUDA
tensor first reaches it, so a machine without a GPU, or a build made without nvcc, never needs
the library. Where it is looked for, first match wins (as _lib.py finds libperformer):

1. the environment variable PERFORMER_CUDA_LIB: the path of the library file itself;
2. next to this package (performer/libperformer_cuda.so.0, which `pip install ./python` copies
   there from the build folder when it holds one);
3. the build folder of the source tree this package sits in (python/performer -> ../../build),
   where `make` puts it when nvcc is found;
4. the system's dynamic linker: libperformer_cuda.so.0 by its soname (`make install`, or
   LD_LIBRARY_PATH).

libperformer_cuda needs libperformer.so.0, which _lib has loaded by then (the dynamic linker
matches the soname of the loaded copy). The structs are _lib's (pf_shape, pf_attn_opts,
pf_favor_opts), cudaStream_t is a void pointer, and the statuses are the core library's: a
failing call raises _lib's exception for its status (InvalidArgument, NonFinite, ...), with
pf_cuda_last_error()'s words in the message.

Contexts: one pf_cuda_ctx per device index, created on first use (ctx(device)) and freed at
exit. A context is for one host thread at a time (it holds a cuBLAS handle and a workspace):
callers hold its lock around every call that uses it (Context.lock). Saved wraps a
pf_cuda_favor_saved (a forward's kept features) made with a context: freed by free(), when it
is garbage-collected, or with its context at exit, whichever comes first.
"""
import atexit
import ctypes
import os
import threading
import weakref

from . import _lib

SONAME = "libperformer_cuda.so.0"
PF_CUDA_F32, PF_CUDA_BF16, PF_CUDA_F16 = 0, 1, 2
PF_CUDA_STAGES = 8

_here = os.path.dirname(os.path.abspath(__file__))

P = ctypes.c_void_p  # device and host addresses, opaque objects, cudaStream_t
c_int, c_float, c_double, c_size_t = ctypes.c_int, ctypes.c_float, ctypes.c_double, ctypes.c_size_t
_shape_p = ctypes.POINTER(_lib.pf_shape)
_attn_p = ctypes.POINTER(_lib.pf_attn_opts)
_favor_p = ctypes.POINTER(_lib.pf_favor_opts)
_double_p = ctypes.POINTER(c_double)
_size_p = ctypes.POINTER(c_size_t)

# every function of performer_cuda.h, as (restype, argtypes); enums (pf_status, pf_cuda_dtype,
# pf_kernel) are ints
_PROTOS = {
    "pf_cuda_dtype_size": (c_size_t, [c_int]),
    "pf_cuda_device_count": (c_int, []),
    "pf_cuda_last_error": (ctypes.c_char_p, []),
    "pf_cuda_ctx_create": (c_int, [ctypes.POINTER(P), c_int]),
    "pf_cuda_ctx_free": (None, [P]),
    "pf_cuda_ctx_device": (c_int, [P]),
    "pf_cuda_ctx_set_tf32": (c_int, [P, c_int]),
    "pf_cuda_ctx_set_workspace_limit": (c_int, [P, c_size_t]),
    "pf_cuda_ctx_bytes": (c_size_t, [P]),
    "pf_cuda_ctx_trim": (None, [P]),
    "pf_cuda_favor_workspace": (c_int, [_size_p, _size_p, c_int, _shape_p, _attn_p, _favor_p]),
    "pf_cuda_kernel_supported": (c_int, [c_int]),
    # ctx, out, Q, K, V, dtype, shape, opts, favor, stream
    "pf_cuda_favor": (c_int, [P, P, P, P, P, c_int, _shape_p, _attn_p, _favor_p, P]),
    "pf_cuda_ctx_profile": (c_int, [P, c_int]),
    "pf_cuda_ctx_stages": (c_int, [P, ctypes.POINTER(ctypes.c_char_p), _double_p, _double_p,
                                   _double_p]),
    # state, ctx, N, H, d, dv, scale, favor
    "pf_cuda_favor_state_create": (c_int, [ctypes.POINTER(P), P, c_int, c_int, c_int, c_int,
                                           c_float, _favor_p]),
    "pf_cuda_favor_state_free": (None, [P]),
    "pf_cuda_favor_state_reset": (c_int, [P, P, P]),  # state, which (N host ints), stream
    # state, out, q, k, v, active (N device int32 or NULL), dtype, stream
    "pf_cuda_favor_state_step": (c_int, [P, P, P, P, P, P, c_int, P]),
    "pf_cuda_favor_state_positions": (c_int, [P, P, P]),  # state, pos (N host int64), stream
    # the backward: per_head, fixed, dtype, shape, opts, favor
    "pf_cuda_favor_backward_workspace": (c_int, [_size_p, _size_p, c_int, _shape_p, _attn_p,
                                                 _favor_p]),
    # ctx, dQ, dK, dV, dout, Q, K, V, dtype, shape, opts, favor, saved (or NULL), stream
    "pf_cuda_favor_backward": (c_int, [P, P, P, P, P, P, P, P, c_int, _shape_p, _attn_p,
                                       _favor_p, P, P]),
    # bytes, dtype, shape, opts, favor
    "pf_cuda_favor_saved_size": (c_int, [_size_p, c_int, _shape_p, _attn_p, _favor_p]),
    # saved, ctx, dtype, shape, opts, favor
    "pf_cuda_favor_saved_create": (c_int, [ctypes.POINTER(P), P, c_int, _shape_p, _attn_p,
                                           _favor_p]),
    "pf_cuda_favor_saved_free": (None, [P]),
    "pf_cuda_favor_saved_bytes": (c_size_t, [P]),
    # ctx, out, Q, K, V, dtype, shape, opts, favor, saved, stream
    "pf_cuda_favor_save": (c_int, [P, P, P, P, P, c_int, _shape_p, _attn_p, _favor_p, P, P]),
}

_load_lock = threading.Lock()
_loaded = []  # [(lib, path, how)] once loaded, [RuntimeError] once it could not be


def candidates():
    """(path, how it was found) in the order they are tried."""
    env = os.environ.get("PERFORMER_CUDA_LIB")
    if env:
        return [(env, "PERFORMER_CUDA_LIB")]
    out = [(os.path.join(_here, n), "the package folder")
           for n in (SONAME, "libperformer_cuda.so")]
    tree = os.path.normpath(os.path.join(_here, "..", "..", "build"))
    out += [(os.path.join(tree, n), "the source tree's build folder")
            for n in (SONAME, "libperformer_cuda.so")]
    out.append((SONAME, "the dynamic linker (make install)"))
    return out


def open_library(cands):
    """(CDLL with every prototype set, path, how) from the first candidate that loads, or
    RuntimeError saying libperformer_cuda is not there and how to get it."""
    tried = []
    for path, how in cands:
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{path} ({how}): no such file")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({how}): {e}")
            if how == "PERFORMER_CUDA_LIB":
                break
            continue
        missing = [n for n in _PROTOS if not hasattr(lib, n)]
        if missing:
            tried.append(f"{path} ({how}): lacks {', '.join(missing)} (an older build? run "
                         "`make` again)")
            if how == "PERFORMER_CUDA_LIB":
                break
            continue
        for name, (res, args) in _PROTOS.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        return lib, path, how
    raise RuntimeError(
        "performer: CUDA tensors need libperformer_cuda, which was not found: it is built by "
        "`make` only where nvcc is found (the CUDA toolkit), so a build without nvcc has none. "
        "Install the CUDA toolkit (nvcc on PATH) and run `make` again (then `pip install "
        "./python` again if the package is installed), or set PERFORMER_CUDA_LIB to the "
        "library's path; or move the tensors to the CPU with .cpu(). Tried:\n  "
        + "\n  ".join(tried))


def lib():
    """The loaded libperformer_cuda (loading it on the first call), or the RuntimeError of
    open_library, raised again at every call."""
    if not _loaded:
        with _load_lock:
            if not _loaded:
                try:
                    _loaded.append(open_library(candidates()))
                except RuntimeError as e:
                    _loaded.append(e)
    got = _loaded[0]
    if isinstance(got, RuntimeError):
        raise RuntimeError(str(got))
    return got[0]


def library_path():
    """The path libperformer_cuda was loaded from (loading it), or RuntimeError."""
    lib()
    return _loaded[0][1]


def is_loaded():
    """Whether libperformer_cuda has been loaded (without trying to)."""
    return bool(_loaded) and not isinstance(_loaded[0], RuntimeError)


def device_count():
    """Devices libperformer_cuda can use: 0 when it cannot be loaded, or there is no GPU or no
    driver. Never raises."""
    try:
        return lib().pf_cuda_device_count()
    except RuntimeError:
        return 0


def last_error():
    """pf_cuda_last_error() of this thread, as str ("" when the library is not loaded)."""
    if not is_loaded():
        return ""
    s = lib().pf_cuda_last_error()
    return s.decode(errors="replace") if s else ""


def error(st, function, detail=""):
    """The exception for status st returned by `function` (as _lib.error), with this thread's
    pf_cuda_last_error() text and the caller's detail in the message."""
    words = [w for w in (last_error(), detail) if w]
    return _lib.error(st, function, "; ".join(words))


def check(st, function, detail=""):
    if st != _lib.PF_OK:
        raise error(st, function, detail)


# ---- contexts: one per device ---------------------------------------------------------------

class Context:
    """A pf_cuda_ctx on one device: ptr (the address), device, lock (held around each call
    that uses it: a context is for one host thread at a time), tf32 (the last setting made),
    saved (the live Saved made with it, freed before it is).

    The lock is reentrant: a Saved dropped by the garbage collector frees itself under it, and
    the collector may run in a thread that holds it already (between two calls, never inside
    one: ctypes calls run no Python code)."""

    __slots__ = ("ptr", "device", "lock", "tf32", "saved")

    def __init__(self, device):
        p = ctypes.c_void_p()
        check(lib().pf_cuda_ctx_create(ctypes.byref(p), device), "pf_cuda_ctx_create",
              f"device {device}")
        self.ptr, self.device, self.lock, self.tf32 = p.value, device, threading.RLock(), None
        self.saved = weakref.WeakSet()

    def set_tf32(self, allow):
        """pf_cuda_ctx_set_tf32 when allow differs from the last setting (hold self.lock)."""
        allow = 1 if allow else 0
        if allow != self.tf32:
            check(lib().pf_cuda_ctx_set_tf32(self.ptr, allow), "pf_cuda_ctx_set_tf32")
            self.tf32 = allow

    def free(self):
        """Frees the kept features made with the context, then the context (the header: the
        context must outlive them)."""
        with self.lock:
            for s in list(self.saved):
                s.free()
            if self.ptr:
                lib().pf_cuda_ctx_free(self.ptr)
                self.ptr = None


class Saved:
    """A pf_cuda_favor_saved: what a forward keeps for its backward (the features of every
    head), nbytes of device memory on ctx's device. Saved(ctx, dtype, shape, opts, favor), the
    last three as the C calls take them (pointers to the structs), makes an empty one for those
    arguments (pf_cuda_favor_saved_create; the library's exception when it cannot, MemoryError
    for device memory); pf_cuda_favor_save fills it, pf_cuda_favor_backward reads it (as ptr).
    free() gives the memory back (pf_cuda_favor_saved_free, under the context's lock, which
    waits for the device); so does the garbage collector when the object is dropped, and
    Context.free before it frees the context. free() twice is harmless."""

    __slots__ = ("ptr", "ctx", "nbytes", "__weakref__")

    def __init__(self, c, dtype, shape, opts, favor):
        self.ptr, self.ctx, self.nbytes = None, c, 0
        p = ctypes.c_void_p()
        with c.lock:
            check(lib().pf_cuda_favor_saved_create(ctypes.byref(p), c.ptr, dtype, shape, opts,
                                                   favor), "pf_cuda_favor_saved_create")
            self.ptr = p.value
            self.nbytes = lib().pf_cuda_favor_saved_bytes(self.ptr)
            c.saved.add(self)

    def free(self):
        c = self.ctx
        if self.ptr is None:
            return
        with c.lock:
            if self.ptr is not None:
                if c.ptr:  # else Context.free has run (it frees its Saved first)
                    lib().pf_cuda_favor_saved_free(self.ptr)
                self.ptr = None
                self.nbytes = 0
                c.saved.discard(self)

    def __del__(self):
        try:
            self.free()
        except Exception:  # at interpreter exit, ctypes or the lock may be gone: the OS frees
            pass


_contexts = {}
_ctx_lock = threading.Lock()


def ctx(device):
    """The Context of device index `device`, created on first use (loading the library: its
    RuntimeError if it cannot be)."""
    c = _contexts.get(device)
    if c is None:
        lib()
        with _ctx_lock:
            c = _contexts.get(device)
            if c is None:
                c = Context(device)
                if not _contexts:
                    atexit.register(free_all)
                _contexts[device] = c
    return c


def contexts():
    """The contexts made so far, {device: Context}."""
    return dict(_contexts)


def free_all():
    """Frees every context and the kept features made with it (each waits for the work it
    queued). At exit, before the CUDA runtime is torn down (Python's exit handlers run
    first)."""
    with _ctx_lock:
        cs = list(_contexts.values())
        _contexts.clear()
    for c in cs:
        try:
            c.free()
        except Exception:  # at exit: the process frees all
            pass


def trim():
    """Frees every context's workspace (pf_cuda_ctx_trim); the next call allocates again."""
    for c in list(_contexts.values()):
        with c.lock:
            if c.ptr:
                lib().pf_cuda_ctx_trim(c.ptr)


def profile(device, on):
    """Turns stage timing (pf_cuda_ctx_profile) on or off for device's context."""
    c = ctx(device)
    with c.lock:
        check(lib().pf_cuda_ctx_profile(c.ptr, 1 if on else 0), "pf_cuda_ctx_profile")


def stages(device):
    """[(name, ms, flops, bytes)] of the PF_CUDA_STAGES stages, summed over device's forwards
    since profiling was turned on or since the last call (pf_cuda_ctx_stages, which resets the
    sums and waits for the context's last stream)."""
    c = ctx(device)
    names = (ctypes.c_char_p * PF_CUDA_STAGES)()
    ms, flops, nbytes = ((c_double * PF_CUDA_STAGES)() for _ in range(3))
    with c.lock:
        check(lib().pf_cuda_ctx_stages(c.ptr, names, ms, flops, nbytes), "pf_cuda_ctx_stages")
    return [((names[i] or b"").decode(), ms[i], flops[i], nbytes[i])
            for i in range(PF_CUDA_STAGES)]


def ctx_bytes(device):
    """Device bytes device's context holds now (workspace and W copies)."""
    c = ctx(device)
    with c.lock:
        return lib().pf_cuda_ctx_bytes(c.ptr)
