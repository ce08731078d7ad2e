"""The shared library, loaded with ctypes: where it is found, the C structs mirrored from
include/performer.h, every prototype used (argtypes and restype), and statuses as exceptions.

Where libperformer is looked for, first match wins:

1. the environment variable PERFORMER_LIB: the path of the library file itself;
2. next to this package (performer/libperformer.so.0): the copy `pip install ./python` puts
   there from the build folder;
3. the build folder of the source tree this package sits in (python/performer -> ../../build),
   for running from a clone with PYTHONPATH=python after `make`;
4. the system's dynamic linker: libperformer.so.0 by its soname, as `make install` puts it in
   /usr/local/lib (and ldconfig registers it), or on LD_LIBRARY_PATH.

Nothing here allocates or computes: the numpy layer (performer/__init__.py) and the torch layer
(performer/torch.py) call through `lib`. ctypes releases the GIL around each foreign call.
"""
import ctypes
import os

SONAME = "libperformer.so.0"
PF_MAX_THREADS = 1024

_here = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    """(path, how it was found) in the order they are tried."""
    env = os.environ.get("PERFORMER_LIB")
    if env:
        return [(env, "PERFORMER_LIB")]
    out = []
    for name in (SONAME, "libperformer.so"):
        out.append((os.path.join(_here, name), "the package folder"))
    tree = os.path.normpath(os.path.join(_here, "..", "..", "build"))
    for name in (SONAME, "libperformer.so"):
        out.append((os.path.join(tree, name), "the source tree's build folder"))
    out.append((SONAME, "the dynamic linker (make install)"))
    return out


def _load():
    tried = []
    for path, how in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{path} ({how}): no such file")
            continue
        try:
            return ctypes.CDLL(path), path, how
        except OSError as e:
            tried.append(f"{path} ({how}): {e}")
            if how == "PERFORMER_LIB":
                break
    raise ImportError(
        "performer: libperformer not found. Build it (`make`, in the repository), install it "
        "(`make install`), or set PERFORMER_LIB to the library's path. Tried:\n  "
        + "\n  ".join(tried))


lib, library_path, library_found_by = _load()


# ---- structs (include/performer.h), field for field -------------------------------------------

c_int, c_float, c_double, c_size_t = ctypes.c_int, ctypes.c_float, ctypes.c_double, ctypes.c_size_t
c_u64, c_i64 = ctypes.c_uint64, ctypes.c_int64
c_float_p = ctypes.POINTER(ctypes.c_float)
c_i32_p = ctypes.POINTER(ctypes.c_int32)
c_void_p = ctypes.c_void_p


class pf_shape(ctypes.Structure):
    _fields_ = [("B", c_int), ("H", c_int), ("Lq", c_int), ("Lk", c_int), ("d", c_int),
                ("dv", c_int)]


class pf_attn_opts(ctypes.Structure):
    _fields_ = [("scale", c_float), ("causal", c_int), ("key_len", c_void_p),
                ("threads", c_int)]


class pf_favor_opts(ctypes.Structure):
    # kernel is the enum pf_kernel: an int
    _fields_ = [("kernel", c_int), ("W", c_void_p), ("m", c_int), ("w_per_head", c_int),
                ("eps", c_float), ("chunk", c_int), ("oprf_a_given", c_int),
                ("oprf_a", c_float)]


class pf_sampling_opts(ctypes.Structure):
    _fields_ = [("samples", c_int), ("proposals", c_int), ("deterministic", c_int),
                ("seed", c_u64)]


class pf_kernel_params(ctypes.Structure):
    _fields_ = [("oprf_a", c_float), ("sderf_A", c_void_p), ("sderf_B", c_void_p),
                ("sderf_log_D", c_double)]


class pf_model_config(ctypes.Structure):
    # attention, positions and kernel are the enums pf_lm_attention, pf_lm_positions, pf_kernel
    _fields_ = [("context", c_int), ("layers", c_int), ("d_model", c_int), ("heads", c_int),
                ("attention", c_int), ("positions", c_int), ("kernel", c_int),
                ("features", c_int), ("redraw", c_int), ("seed", c_u64), ("w_seed", c_u64),
                ("window", c_int)]


class pf_mqar(ctypes.Structure):
    _fields_ = [("pairs", c_int), ("queries", c_int), ("keys", c_int)]


STRUCTS = (pf_shape, pf_attn_opts, pf_favor_opts, pf_sampling_opts, pf_kernel_params,
           pf_model_config, pf_mqar)

# ---- prototypes: every function the package calls --------------------------------------------

P = c_void_p  # tensors and opaque objects are passed as addresses (int) or None
_shape_p = ctypes.POINTER(pf_shape)
_attn_p = ctypes.POINTER(pf_attn_opts)
_favor_p = ctypes.POINTER(pf_favor_opts)
_samp_p = ctypes.POINTER(pf_sampling_opts)
_params_p = ctypes.POINTER(pf_kernel_params)

_PROTOS = {
    "pf_status_str": (ctypes.c_char_p, [c_int]),
    "pf_version": (ctypes.c_char_p, []),
    "pf_blas_core": (ctypes.c_char_p, []),
    "pf_simd_path": (ctypes.c_char_p, []),
    "pf_kernel_width": (c_int, [c_int, c_int]),
    "pf_kernel_parse": (c_int, [ctypes.c_char_p, ctypes.POINTER(c_int)]),
    "pf_kernel_name": (ctypes.c_char_p, [c_int]),
    "pf_projection_draw": (c_int, [P, c_int, c_int, c_int, c_int, c_u64, c_u64]),
    "pf_projection_stream": (c_u64, [c_u64, c_i64]),
    "pf_features_ex": (c_int, [P, P, P, c_int, c_int, P, c_int, c_int, c_float, c_float,
                               _params_p]),
    "pf_oprf_optimal_a": (c_int, [c_float_p, P, c_int, P, c_int, c_int, c_float]),
    "pf_sderf_params": (c_int, [P, P, ctypes.POINTER(c_double), P, c_int, P, c_int, c_int,
                                c_float]),
    "pf_attn_opts_default": (pf_attn_opts, []),
    "pf_favor_opts_default": (pf_favor_opts, []),
    "pf_sampling_opts_default": (pf_sampling_opts, []),
    "pf_attn_check": (c_int, [_shape_p, _attn_p]),
    "pf_attn_exact": (c_int, [P, P, P, P, P, _shape_p, _attn_p]),
    "pf_attn_favor": (c_int, [P, P, P, P, _shape_p, _attn_p, _favor_p]),
    "pf_attn_favor_dt": (c_int, [P, P, P, P, c_int, _shape_p, _attn_p, _favor_p]),
    "pf_attn_ra": (c_int, [P, P, P, P, _shape_p, _attn_p, _samp_p]),
    "pf_attn_lara": (c_int, [P, P, P, P, _shape_p, _attn_p, _samp_p]),
    "pf_attn_exact_backward": (c_int, [P, P, P, P, P, P, P, P, P, _shape_p, _attn_p]),
    "pf_attn_favor_backward": (c_int, [P, P, P, P, P, P, P, P, _shape_p, _attn_p, _favor_p]),
    "pf_favor_saved_create": (c_int, [ctypes.POINTER(c_void_p), _shape_p, _attn_p, _favor_p,
                                      c_size_t]),
    "pf_favor_saved_free": (None, [P]),
    "pf_favor_saved_bytes": (c_size_t, [P]),
    "pf_favor_saved_heads": (c_int, [P]),
    "pf_favor_saved_clear": (None, [P]),
    "pf_attn_favor_save": (c_int, [P, P, P, P, _shape_p, _attn_p, _favor_p, P]),
    "pf_attn_favor_backward_saved": (c_int, [P, P, P, P, P, P, P, P, _shape_p, _attn_p,
                                             _favor_p, P]),
    "pf_favor_state_create": (c_int, [ctypes.POINTER(c_void_p), c_int, c_int, c_int, c_float,
                                      _favor_p]),
    "pf_favor_state_free": (None, [P]),
    "pf_favor_state_reset": (c_int, [P]),
    "pf_favor_state_step": (c_int, [P, P, P, P, P, c_int]),
    "pf_favor_state_step_dt": (c_int, [P, P, P, P, P, c_int, c_int]),
    "pf_favor_state_position": (c_i64, [P]),
    "pf_favor_state_create_n": (c_int, [ctypes.POINTER(c_void_p), c_int, c_int, c_int, c_int,
                                        c_float, _favor_p]),
    "pf_favor_state_sequences": (c_int, [P]),
    "pf_favor_state_position_of": (c_i64, [P, c_int]),
    "pf_favor_state_step_n": (c_int, [P, P, P, P, P, P, c_int, P]),
    "pf_favor_state_prefill": (c_int, [P, c_int, P, P, P, P, c_int]),
    "pf_favor_state_reset_seq": (c_int, [P, c_int]),
    "pf_favor_state_copy_seq": (c_int, [P, c_int, c_int]),
    "pf_favor_state_snapshot_bytes": (c_size_t, [P]),
    "pf_favor_state_save": (c_int, [P, c_int, P, c_size_t]),
    "pf_favor_state_load": (c_int, [P, c_int, P, c_size_t, ctypes.c_char_p, c_size_t]),
    "pf_favor_state_save_file": (c_int, [P, c_int, ctypes.c_char_p, ctypes.c_char_p, c_size_t]),
    "pf_favor_state_load_file": (c_int, [P, c_int, ctypes.c_char_p, ctypes.c_char_p, c_size_t]),
    "pf_model_config_default": (pf_model_config, []),
    "pf_model_load": (c_int, [ctypes.POINTER(c_void_p), ctypes.c_char_p, ctypes.c_char_p,
                              c_size_t]),
    "pf_model_free": (None, [P]),
    "pf_model_get_config": (pf_model_config, [P]),
    "pf_model_num_params": (c_i64, [P]),
    "pf_model_meta": (ctypes.c_char_p, [P, ctypes.c_char_p]),
    "pf_model_attention_inputs": (c_int, [P, P, P, P, P, c_int, c_int, c_int]),
    "pf_model_set_training": (c_int, [P, c_int]),
    "pf_model_forward": (c_int, [P, P, P, P, P, c_int, c_int]),
    "pf_mqar_default": (pf_mqar, []),
    "pf_mqar_check": (c_int, [ctypes.POINTER(pf_mqar), c_int]),
    "pf_mqar_batch": (c_int, [ctypes.POINTER(pf_mqar), P, P, c_int, c_int, c_u64, c_u64]),
}
for _name, (_res, _args) in _PROTOS.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args

# ---- statuses -------------------------------------------------------------------------------

PF_OK, PF_EINVAL, PF_ENOMEM, PF_ENONFINITE, PF_EDOMAIN, PF_EIO, PF_EFORMAT, PF_ENOTSUP = range(8)
# pf_dtype: the element types of the *_dt calls (and of .npy arrays)
PF_F32, PF_I32, PF_I64, PF_F16, PF_BF16 = range(5)
# the FAVOR+ maps whose half-precision inputs the kernels read in place (FAVOR++ and FAVOR#
# fit on whole tensors: float32 only)
HALF_KERNELS = ("positive", "hyperbolic", "trig", "relu")
STATUS_NAMES = ("PF_OK", "PF_EINVAL", "PF_ENOMEM", "PF_ENONFINITE", "PF_EDOMAIN", "PF_EIO",
                "PF_EFORMAT", "PF_ENOTSUP")


class Error(Exception):
    """A status returned by the library. `status` is its number, `status_name` its name
    ("PF_EINVAL", ...), `function` the C function that returned it; the message starts with
    that function and pf_status_str's text. Each status has a subclass that is also the
    matching built-in exception, so `except ValueError` works as well as `except Error`."""

    def __init__(self, message, status=None, function=None):
        super().__init__(message)
        self.status = status
        self.status_name = STATUS_NAMES[status] if status is not None else None
        self.function = function


class InvalidArgument(Error, ValueError):
    """PF_EINVAL: an argument, dimension or option the library refuses."""


class OutOfMemory(Error, MemoryError):
    """PF_ENOMEM: an allocation failed."""


class NonFinite(Error, FloatingPointError):
    """PF_ENONFINITE: an input holds NaN or Inf, or a result is not finite."""


class UndefinedResult(Error, ArithmeticError):
    """PF_EDOMAIN: a mathematically undefined result (a zero attention denominator)."""


class LibraryIOError(Error, OSError):
    """PF_EIO: a file could not be read or written."""


class FormatError(Error, ValueError):
    """PF_EFORMAT: a file is not in the expected format."""


class NotSupported(Error, NotImplementedError):
    """PF_ENOTSUP: valid, but not supported by this build or method."""


class MissingFile(LibraryIOError, FileNotFoundError):
    """PF_EIO for a path where there is no file: also FileNotFoundError."""


for _c in (Error, InvalidArgument, OutOfMemory, NonFinite, UndefinedResult, LibraryIOError,
           FormatError, NotSupported, MissingFile):
    _c.__module__ = "performer"

_CLASSES = {PF_EINVAL: InvalidArgument, PF_ENOMEM: OutOfMemory, PF_ENONFINITE: NonFinite,
            PF_EDOMAIN: UndefinedResult, PF_EIO: LibraryIOError, PF_EFORMAT: FormatError,
            PF_ENOTSUP: NotSupported}


def status_str(st):
    return lib.pf_status_str(st).decode()


def error(st, function, detail=""):
    """The exception for status st returned by `function` (detail: what the caller knows)."""
    msg = f"{function}: {status_str(st)}"
    if detail:
        msg += f" ({detail})"
    return _CLASSES.get(st, Error)(msg, st, function)


def check(st, function, detail=""):
    if st != PF_OK:
        raise error(st, function, detail)


# ---- names ----------------------------------------------------------------------------------

PROJ_KINDS = {"iid": 0, "orthogonal": 1}
NORMS = {"chi": 0, "sqrtd": 1, "qmc": 2}
KERNEL_NAMES = ("positive", "hyperbolic", "trig", "relu", "oprf", "sderf", "elu")
KERNEL_ELU = 6  # pf_kernel's PF_KERNEL_ELU
LM_ATTENTIONS = ("exact", "favor", "favor++", "local")  # pf_lm_attention, by value
LM_POSITIONS = ("learned", "rotary")  # pf_lm_positions, by value


_KERNEL_IDS = {}


def kernel_id(name):
    """The pf_kernel of a name the library parses (pf_kernel_parse): positive, hyperbolic, trig,
    relu, oprf (favor++), sderf (favor#), elu (elu+1). ValueError for anything else."""
    kid = _KERNEL_IDS.get(name) if isinstance(name, str) else None
    if kid is not None:
        return kid
    if not isinstance(name, str):
        raise TypeError(f"kernel must be a string, one of {', '.join(KERNEL_NAMES)}; "
                        f"got {type(name).__name__}")
    k = c_int()
    if lib.pf_kernel_parse(name.encode(), ctypes.byref(k)) != PF_OK:
        raise ValueError(f"kernel '{name}' is not known: one of {', '.join(KERNEL_NAMES)} "
                         "(or favor++, favor#, elu+1)")
    _KERNEL_IDS[name] = k.value
    return k.value


def choice(what, value, table):
    if value not in table:
        raise ValueError(f"{what} '{value}' is not known: one of {', '.join(table)}")
    return table[value]
