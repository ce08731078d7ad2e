"""What the Python tests share: the tool (PERFORMER), fixed-seed inputs, resident memory."""
import os
import resource
import subprocess
import tempfile
import unittest

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
