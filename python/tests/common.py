"""What the Python tests share: the tool (PERFORMER), fixed-seed inputs, resident memory, and
performer-pytorch fetched for the tests against it."""
import hashlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

import numpy as np

TOOL = os.environ.get("PERFORMER")
ASAN = os.environ.get("PF_TEST_ASAN") == "1"  # the library is an ASan build: fewer repeats


def rng(seed):
    return np.random.default_rng(seed)


def normal(r, shape, sigma=1.0):
    return (r.standard_normal(shape) * sigma).astype(np.float32)


def same_bits(a, b):
    """True if a and b have the same shape, dtype and bytes (so -0.0 != 0.0, NaN == NaN)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def rss_bytes():
    """The resident set size now (/proc/self/statm, second field, in pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


class ToolRunner:
    """Runs `performer attn` on arrays in a scratch folder and reads its outputs back."""

    def __init__(self):
        if not TOOL or not os.access(TOOL, os.X_OK):
            raise unittest.SkipTest("PERFORMER (the tool's path) is not set")
        self.dir = tempfile.TemporaryDirectory(prefix="pf_py_tool_")
        self.n = 0

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def save(self, a, name=None):
        self.n += 1
        p = self.path(name or f"a{self.n}.npy")
        np.save(p, a)
        return p

    def attn(self, q, k, v, *flags, **arrays):
        """`performer attn` on q, k, v; arrays (w, key_lengths, grad_out) become file flags.
        Returns the output, or (out, dq, dk, dv) when grad_out is given."""
        out = self.path("out.npy")
        cmd = [TOOL, "attn", "--q", self.save(q), "--k", self.save(k), "--v", self.save(v),
               "--out", out]
        for name, a in arrays.items():
            cmd += ["--" + name.replace("_", "-"), self.save(a)]
        prefix = self.path("g")
        if "grad_out" in arrays:
            cmd += ["--grad-prefix", prefix]
        cmd += [str(f) for f in flags]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr}")
        o = np.load(out)
        if "grad_out" in arrays:
            return (o,) + tuple(np.load(f"{prefix}.{x}.npy") for x in ("dq", "dk", "dv"))
        return o

    def close(self):
        self.dir.cleanup()


# ---- performer-pytorch, for the tests against the real package ---------------------------------

PP_REQUIREMENTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "performer_pytorch.txt")


def performer_pytorch_dir():
    """A folder holding performer-pytorch 1.1.4 and the packages it imports (the wheels of
    performer_pytorch.txt unpacked), to put on sys.path: PF_PERFORMER_PYTORCH if set, else a
    cache folder (PF_TEST_CACHE, else ~/.cache/performer-tests), fetched there with
    `pip download` the first time. Raises unittest.SkipTest saying why when it cannot be had
    (no network, no pip)."""
    given = os.environ.get("PF_PERFORMER_PYTORCH")
    if given:
        if not os.path.isdir(os.path.join(given, "performer_pytorch")):
            raise unittest.SkipTest(f"PF_PERFORMER_PYTORCH={given} holds no performer_pytorch")
        return given
    cache = os.environ.get("PF_TEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "performer-tests")
    with open(PP_REQUIREMENTS, "rb") as f:  # a new list of wheels is a new folder
        tag = hashlib.sha256(f.read()).hexdigest()[:12]
    target = os.path.join(cache, f"performer-pytorch-{tag}")
    if os.path.isdir(os.path.join(target, "performer_pytorch")):
        return target
    with tempfile.TemporaryDirectory(prefix="pf_pp_") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--require-hashes", "--retries", "0", "--timeout", "20",
               "--disable-pip-version-check", "-d", tmp, "-r", PP_REQUIREMENTS]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            why = None if r.returncode == 0 else \
                (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        except (OSError, subprocess.TimeoutExpired) as e:
            why = str(e)
        if why is not None:
            raise unittest.SkipTest(f"performer-pytorch 1.1.4 could not be fetched ({why}): "
                                    "the tests against it need the network once, or "
                                    "PF_PERFORMER_PYTORCH naming a folder of its unpacked wheels")
        part = f"{target}.part{os.getpid()}"
        shutil.rmtree(part, ignore_errors=True)
        for name in sorted(os.listdir(tmp)):
            with zipfile.ZipFile(os.path.join(tmp, name)) as z:
                z.extractall(part)
        try:
            os.rename(part, target)
        except OSError:  # another run got there first
            shutil.rmtree(part, ignore_errors=True)
    return target


def tree_digest(folder):
    """{relative path: sha256} of every file under folder, to show that nothing changed it."""
    out = {}
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            p = os.path.join(root, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out
