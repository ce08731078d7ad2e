"""The numpy layer: the ctypes structs against the C compiler's layout, results equal to the
`performer attn` tool's bit for bit given the same W (and the same drawn W), features against a
float64 numpy formula, decoding against the causal pass, every error path's exception, and
resident memory over 1000 calls.

    PERFORMER=build/performer PERFORMER_LIB=build/libperformer.so PYTHONPATH=python \\
        /usr/bin/python3 -m unittest discover -s python/tests
"""
import ctypes
import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np

import performer
from performer import _lib
from common import ASAN, ToolRunner, normal, rng, rss_bytes, same_bits

INCLUDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include")


class TestLoading(unittest.TestCase):
    def test_found_where_told(self):
        env = os.environ.get("PERFORMER_LIB")
        if env:
            self.assertEqual(performer.library_path, env)
            self.assertEqual(_lib.library_found_by, "PERFORMER_LIB")
        self.assertRegex(performer.__version__, r"^\d+\.\d+\.\d+$")
        self.assertIn(performer.simd_path(), ("avx512", "avx2", "ref"))

    def test_struct_layout_matches_c(self):
        """Every field's offset and every struct's size as the C compiler lays them out."""
        cc = shutil.which("cc") or shutil.which("gcc")
        if not cc or not os.path.exists(os.path.join(INCLUDE, "performer.h")):
            self.skipTest("no C compiler or no include/performer.h")
        lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "performer.h"',
                 'int main(void) {']
        for s in _lib.STRUCTS:
            lines.append(f'printf("{s.__name__} size %zu\\n", sizeof({s.__name__}));')
            for f, _ in s._fields_:
                lines.append(f'printf("{s.__name__}.{f} %zu\\n", offsetof({s.__name__}, {f}));')
        lines += ["return 0;", "}"]
        with tempfile.TemporaryDirectory() as d:
            src, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
            with open(src, "w") as f:
                f.write("\n".join(lines))
            subprocess.run([cc, "-std=c11", "-I", INCLUDE, "-o", exe, src], check=True)
            env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
            got = subprocess.run([exe], capture_output=True, text=True, check=True, env=env)
        want = []
        for s in _lib.STRUCTS:
            want.append(f"{s.__name__} size {ctypes.sizeof(s)}")
            want += [f"{s.__name__}.{f} {getattr(s, f).offset}" for f, _ in s._fields_]
        self.assertEqual(got.stdout.split("\n")[:-1], want)

    def test_defaults_round_trip(self):
        """Structs returned by value come back with the header's documented defaults."""
        o = _lib.lib.pf_attn_opts_default()
        self.assertEqual((o.scale, o.causal, o.key_len, o.threads), (0.0, 0, None, 0))
        f = _lib.lib.pf_favor_opts_default()
        self.assertEqual((f.kernel, f.W, f.m, f.w_per_head, f.eps, f.chunk, f.oprf_a_given,
                          f.oprf_a), (0, None, 0, 0, 0.0, 0, 0, 0.0))
        s = _lib.lib.pf_sampling_opts_default()
        self.assertEqual((s.samples, s.proposals, s.deterministic, s.seed), (1, 1, 0, 0))
        c = _lib.lib.pf_model_config_default()  # performer.h: exact, learned, positive (0s)
        self.assertEqual([getattr(c, f) for f, _ in c._fields_],
                         [256, 4, 128, 4, 0, 0, 0, 64, 1000, 1, 1, 32])
        # and a struct filled here is read by C as written: pf_attn_check sees causal, Lq != Lk
        sh = _lib.pf_shape(1, 1, 4, 5, 8, 8)
        o.causal = 1
        self.assertEqual(_lib.lib.pf_attn_check(ctypes.byref(sh), ctypes.byref(o)),
                         _lib.PF_EINVAL)
        o.causal = 0
        self.assertEqual(_lib.lib.pf_attn_check(ctypes.byref(sh), ctypes.byref(o)), _lib.PF_OK)
        lens = np.array([6], np.int32)  # a key length above Lk is refused through the pointer
        o.key_len = lens.ctypes.data
        self.assertEqual(_lib.lib.pf_attn_check(ctypes.byref(sh), ctypes.byref(o)),
                         _lib.PF_EINVAL)

    def test_missing_library_is_import_error(self):
        env = dict(os.environ, PERFORMER_LIB="/nonexistent/libperformer.so")
        env.pop("LD_PRELOAD", None)
        r = subprocess.run(["/usr/bin/python3", "-c", "import performer"], env=env,
                           capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("ImportError", r.stderr)
        self.assertIn("/nonexistent/libperformer.so (PERFORMER_LIB)", r.stderr)


class TestToolBits(unittest.TestCase):
    """performer.attention and attention_grad against `performer attn`, byte for byte."""

    @classmethod
    def setUpClass(cls):
        cls.tool = ToolRunner()

    @classmethod
    def tearDownClass(cls):
        cls.tool.close()

    def check(self, q, k, v, flags, **kw):
        arrays = {}
        if kw.get("W") is not None:
            arrays["w"] = kw["W"]
        if kw.get("key_lengths") is not None:
            arrays["key_lengths"] = np.asarray(kw["key_lengths"], np.int32)
        want = self.tool.attn(q, k, v, *flags, **arrays)
        got = performer.attention(q, k, v, **kw)
        self.assertTrue(same_bits(got, want), f"{flags} {sorted(kw)}: max diff "
                        f"{np.abs(got - want).max()}")

    def test_favor_every_kernel(self):
        r = rng(1)
        q, k, v = (normal(r, (2, 3, 37, 16), 0.7) for _ in range(3))
        W = performer.projection(24, 16, seed=5)
        lens = [37, 30]
        for kernel in ("positive", "hyperbolic", "trig", "relu"):
            for causal in (False, True):
                flags = ["--kernel", kernel] + (["--causal"] if causal else [])
                with self.subTest(kernel=kernel, causal=causal):
                    self.check(q, k, v, flags, W=W, kernel=kernel, causal=causal,
                               key_lengths=lens)
        self.check(q, k, v, ["--kernel", "relu", "--eps", "0.001", "--causal"], W=W,
                   kernel="relu", eps=1e-3, causal=True)
        self.check(q, k, v, ["--kernel", "oprf"], W=W, kernel="oprf", key_lengths=lens)
        self.check(q, k, v, ["--kernel", "oprf", "--oprf-a", "-0.1", "--causal"], W=W,
                   kernel="oprf", oprf_a=-0.1, causal=True)
        self.check(q, k, v, ["--kernel", "sderf"], W=W, kernel="sderf", key_lengths=lens)
        # elu + 1: W = I when none is given (tool and package alike), or the W given
        for causal in (False, True):
            flags = ["--kernel", "elu"] + (["--causal"] if causal else [])
            with self.subTest(kernel="elu", causal=causal):
                self.check(q, k, v, flags, kernel="elu", causal=causal, key_lengths=lens)
        self.check(q, k, v, ["--kernel", "elu"], W=W, kernel="elu")

    def test_elu_against_float64(self):
        """kernel='elu' without W is the linear attention of elu(x') + 1, x' = x d^-1/4."""
        r = rng(11)
        q, k, v = (normal(r, (2, 29, 8), 1.5) for _ in range(3))
        def phi(x):
            x = x.astype(np.float64) * 8 ** -0.25
            return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))
        a = phi(q) @ np.swapaxes(phi(k), -1, -2)
        for causal in (False, True):
            w = np.tril(a) if causal else a
            want = (w @ v.astype(np.float64)) / w.sum(-1, keepdims=True)
            got = performer.attention(q, k, v, kernel="elu", causal=causal)
            self.assertLess(np.abs(got - want).max(), 1e-5)
        x = normal(r, (5, 8), 3.0)
        got = performer.features(x, np.eye(8, dtype=np.float32), "elu", scale=1.0)
        self.assertLess(np.abs(got - phi(x * 8 ** 0.25)).max() / np.abs(got).max(), 1e-6)
        with self.assertRaises(ValueError):
            performer.attention(q, k, v, kernel="elu", features=16)
        with self.assertRaises(ValueError):
            performer.attention(q, k, v, kernel="elu", seed=3)

    def test_ranks_shapes_and_options(self):
        r = rng(2)
        q, k, v = normal(r, (45, 8)), normal(r, (60, 8)), normal(r, (60, 5))  # Lq != Lk, dv != d
        W = performer.projection(16, 8, seed=1)
        self.check(q, k, v, [], W=W)
        self.check(q, k, v, ["--scale", "0.2"], W=W, scale=0.2)
        self.check(q, k, v, ["--method", "exact"], method="exact")
        q3, k3, v3 = (normal(r, (4, 33, 8)) for _ in range(3))
        Wh = np.stack([performer.projection(16, 8, seed=s) for s in range(4)])  # one per head
        self.check(q3, k3, v3, ["--causal"], W=Wh, causal=True)
        self.check(q3, k3, v3, ["--causal", "--chunk", "8"], W=W, causal=True, chunk=8)
        self.check(q3, k3, v3, ["--method", "exact", "--causal"], method="exact", causal=True)

    def test_drawn_w_is_the_tools(self):
        r = rng(3)
        q, k, v = (normal(r, (2, 50, 16)) for _ in range(3))
        self.check(q, k, v, ["--features", "40", "--seed", "7"], features=40, seed=7)
        self.check(q, k, v, ["--features", "20", "--proj", "iid", "--norm", "qmc", "--seed",
                             "3", "--causal"], features=20, proj="iid", norm="qmc", seed=3,
                   causal=True)
        saved = self.tool.path("w_saved.npy")
        self.tool.attn(q, k, v, "--features", "40", "--seed", "7", "--norm", "sqrtd",
                       "--save-w", saved)
        self.assertTrue(same_bits(np.load(saved),
                                  performer.projection(40, 16, norm="sqrtd", seed=7)))

    def test_exact_ra_lara(self):
        r = rng(4)
        q, k, v = (normal(r, (2, 2, 40, 8)) for _ in range(3))
        lens = [40, 25]
        self.check(q, k, v, ["--method", "exact"], method="exact", key_lengths=lens)
        self.check(q, k, v, ["--method", "ra", "--samples", "8", "--seed", "3"], method="ra",
                   samples=8, seed=3, key_lengths=lens)
        self.check(q, k, v, ["--method", "lara", "--proposals", "5", "--samples", "2",
                             "--seed", "9"], method="lara", proposals=5, samples=2, seed=9)
        self.check(q, k, v, ["--method", "lara", "--deterministic"], method="lara",
                   deterministic=True, key_lengths=lens)

    def test_gradients(self):
        r = rng(5)
        q, k, v = (normal(r, (2, 2, 41, 16), 0.7) for _ in range(3))
        dO = normal(r, (2, 2, 41, 16))
        W = performer.projection(32, 16, seed=2)
        lens = np.array([41, 29], np.int32)
        for flags, kw in ((["--causal"], dict(causal=True, W=W)),
                          (["--kernel", "hyperbolic"], dict(kernel="hyperbolic", W=W)),
                          (["--method", "exact", "--causal"], dict(method="exact", causal=True)),
                          (["--method", "exact"], dict(method="exact"))):
            with self.subTest(flags=flags):
                arrays = dict(grad_out=dO, key_lengths=lens)
                if "W" in kw:
                    arrays["w"] = W
                want = self.tool.attn(q, k, v, *flags, **arrays)
                got = performer.attention_grad(q, k, v, dO, key_lengths=lens, **kw)
                for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
                    self.assertTrue(same_bits(g, w), f"{name}: max diff {np.abs(g - w).max()}")


def ref_features(x, W, kernel, scale, eps=0.0):
    """phi(x) in float64, straight from performer.h's formulas (no stabiliser)."""
    x, W = x.astype(np.float64) * np.sqrt(scale), W.astype(np.float64)
    m = W.shape[0]
    u, h = x @ W.T, (x * x).sum(-1, keepdims=True) / 2
    if kernel == "positive":
        phi = np.exp(u - h) / np.sqrt(m)
    elif kernel == "hyperbolic":
        phi = np.exp(-h) / np.sqrt(2 * m) * np.concatenate([np.exp(u), np.exp(-u)], -1)
    elif kernel == "trig":
        phi = np.exp(h) / np.sqrt(m) * np.concatenate([np.sin(u), np.cos(u)], -1)
    else:
        return np.maximum(u, 0) / np.sqrt(m) + eps
    return phi + eps * np.abs(phi).max(-1, keepdims=True)


class TestFunctions(unittest.TestCase):
    def test_features_against_float64(self):
        r = rng(6)
        x, W = normal(r, (3, 20, 16), 0.8), performer.projection(32, 16, seed=4)
        for kernel in ("positive", "hyperbolic", "trig", "relu"):
            for scale, eps in ((None, 0.0), (0.1, 1e-3)):
                with self.subTest(kernel=kernel, scale=scale, eps=eps):
                    s = 1 / 4 if scale is None else scale
                    want = ref_features(x, W, kernel, s, eps)
                    got = performer.features(x, W, kernel, scale=scale, eps=eps)
                    self.assertEqual(got.shape, (3, 20, performer.kernel_width(kernel, 32)))
                    err = np.linalg.norm(got - want) / np.linalg.norm(want)
                    self.assertLess(err, 1e-6)
                    phi, c = performer.features(x, W, kernel, scale=scale, eps=eps,
                                                stabilize=True)
                    err = np.linalg.norm(phi * np.exp(c[..., None]) - want) / np.linalg.norm(want)
                    self.assertLess(err, 1e-6)

    def test_oprf_and_sderf_features(self):
        r = rng(7)
        q, k, W = normal(r, (30, 8), 0.6), normal(r, (25, 8), 0.6), performer.projection(16, 8)
        a = performer.oprf_optimal_a(q, k)
        self.assertLessEqual(a, 0.0)
        s = 8 ** -0.5  # A's formula (Likhosherstov et al. 2022) on inputs scaled by sqrt(s)
        qs, ks = q.astype(np.float64) * np.sqrt(s), k.astype(np.float64) * np.sqrt(s)
        rho = ((qs ** 2).sum(1).mean() + (ks ** 2).sum(1).mean()
               + 2 * qs.mean(0) @ ks.mean(0)) / 8
        self.assertAlmostEqual(a, (1 - 2 * rho - np.sqrt((2 * rho + 1) ** 2 + 8 * rho)) / 16,
                               places=6)
        phi = performer.features(q, W, "oprf", oprf_a=a).astype(np.float64)
        B, D = np.sqrt(1 - 4 * a), (1 - 4 * a) ** (8 / 4)
        w = W.astype(np.float64)
        want = D / 4 * np.exp(a * (w * w).sum(1) + B * qs @ w.T
                              - (qs * qs).sum(1, keepdims=True) / 2)
        self.assertLess(np.linalg.norm(phi - want) / np.linalg.norm(want), 1e-6)
        A, Bm, log_D = performer.sderf_params(q, k)
        self.assertTrue(np.allclose(A, A.T) and np.allclose(Bm @ Bm, np.eye(8) - 4 * A,
                                                            atol=1e-5))
        phi = performer.features(q, W, "sderf", sderf=(A, Bm, log_D)).astype(np.float64)
        want = np.exp(log_D) / 4 * np.exp(np.einsum("fi,ij,fj->f", w, A, w) + qs @ Bm @ w.T
                                          - (qs * qs).sum(1, keepdims=True) / 2)
        self.assertLess(np.linalg.norm(phi - want) / np.linalg.norm(want), 1e-5)

    def test_projection(self):
        W = performer.projection(40, 16, seed=3)
        self.assertEqual((W.shape, W.dtype), ((40, 16), np.float32))
        U = W[:16] / np.linalg.norm(W[:16], axis=1, keepdims=True)  # one block: orthonormal
        self.assertLess(np.abs(U @ U.T - np.eye(16)).max(), 1e-5)
        self.assertTrue(same_bits(W, performer.projection(40, 16, seed=3)))
        self.assertFalse(same_bits(W, performer.projection(40, 16, seed=3, stream=1)))
        S = performer.projection(40, 16, norm="sqrtd")
        self.assertLess(np.abs(np.linalg.norm(S, axis=1) - 4).max(), 1e-5)

    def test_decode_state(self):
        r = rng(8)
        H, L, d, m = 4, 70, 16, 32
        q, k, v = (normal(r, (H, L, d), 0.7) for _ in range(3))
        W = performer.projection(m, d, seed=1)
        full = performer.attention(q, k, v, W=W, causal=True, chunk=16)
        with performer.DecodeState(H, d, d, W, chunk=16) as st:
            # steps of whole chunks (H >= 4): the causal pass's bits (performer.h)
            got = np.concatenate([st.step(q[:, i:i + 16], k[:, i:i + 16], v[:, i:i + 16])
                                  for i in range(0, L, 16)], axis=1)
            self.assertTrue(same_bits(got, full))
            self.assertEqual(st.position, L)
            st.reset()
            one = np.stack([st.step(q[:, t], k[:, t], v[:, t]) for t in range(L)], axis=1)
            self.assertLess(np.abs(one - full).max() / np.abs(full).max(), 1e-5)
        self.assertRaises(ValueError, lambda: st.position)  # closed

    def test_threads_do_not_change_bits(self):
        r = rng(9)
        q, k, v = (normal(r, (1, 2, 300, 16)) for _ in range(3))
        for method in ("favor", "exact"):
            a = performer.attention(q, k, v, method=method, causal=True, threads=1)
            b = performer.attention(q, k, v, method=method, causal=True, threads=2)
            self.assertTrue(same_bits(a, b), method)

    def test_zero_copy_and_conversion(self):
        r = rng(10)
        q = normal(r, (2, 30, 8))
        self.assertIs(performer._f32(q, "q"), q)            # float32 C order: passed as is
        self.assertIsNot(performer._f32(q[:, ::2], "q"), q)  # a strided view: one copy
        out = np.empty((2, 30, 8), np.float32)
        self.assertIs(performer.attention(q, q, q, out=out), out)
        q64 = q.astype(np.float64)                           # converted once: same result
        self.assertTrue(same_bits(performer.attention(q64, q64, q64), out))
        qt = np.asfortranarray(q)
        self.assertTrue(same_bits(performer.attention(qt, qt, qt), out))


class TestHalf(unittest.TestCase):
    def test_float16_in_place(self):
        """float16 q, k, v: pf_attn_favor_dt reads them in place; the float16 output is the
        float32 computation on the same (exactly widened) values, rounded once: the same bits."""
        g = rng(31)
        for kernel in ("positive", "hyperbolic", "trig", "relu"):
            for causal in (False, True):
                L, Lk = 300, (300 if causal else 290)
                sc = 0.3 if kernel == "trig" else 0.5
                q = (normal(g, (2, 3, L, 16)) * sc).astype(np.float16)
                k = (normal(g, (2, 3, Lk, 16)) * sc).astype(np.float16)
                v = normal(g, (2, 3, Lk, 8)).astype(np.float16)
                kw = dict(causal=causal, kernel=kernel, features=32, key_lengths=[Lk, Lk - 9],
                          eps=1e-3 if kernel == "relu" else 0.0)
                o = performer.attention(q, k, v, **kw)
                self.assertEqual(o.dtype, np.float16)
                r = performer.attention(q.astype(np.float32), k.astype(np.float32),
                                        v.astype(np.float32), **kw)
                self.assertTrue(same_bits(o, r.astype(np.float16)), (kernel, causal))
        # what cannot be read in place is converted to float32 (a float32 output)
        q = normal(g, (2, 20, 8)).astype(np.float16)
        self.assertEqual(performer.attention(q, q.astype(np.float32), q).dtype, np.float32)
        self.assertEqual(performer.attention(q, q, q, kernel="oprf").dtype, np.float32)
        self.assertEqual(performer.attention(q[:, ::2], q[:, ::2], q[:, ::2]).dtype, np.float32)
        # a NaN in a float16 input names it
        bad = q.copy()
        bad[1, 3, 2] = np.nan
        with self.assertRaisesRegex(FloatingPointError, "k"):
            performer.attention(q, bad, q)


class TestErrors(unittest.TestCase):
    """Every documented error path raises its documented exception."""

    def setUp(self):
        r = rng(11)
        self.q, self.k, self.v = (normal(r, (2, 3, 20, 8)) for _ in range(3))

    def raises(self, exc, text, fn, *a, **kw):
        with self.assertRaises(exc) as cm:
            fn(*a, **kw)
        self.assertIn(text, str(cm.exception))
        return cm.exception

    def test_python_side_checks(self):
        q, k, v, A = self.q, self.k, self.v, performer.attention
        self.raises(ValueError, "same rank", A, q, k[0], v)
        self.raises(ValueError, "expected (L,d)", A, q[0, 0, 0], k[0, 0, 0], v[0, 0, 0])
        self.raises(ValueError, "leading", A, q, k[:1], v[:1])
        self.raises(ValueError, "same width", A, q, k[..., :4], v)
        self.raises(ValueError, "same length", A, q, k, v[:, :, :5])
        self.raises(ValueError, "causal attention needs", A, q, k[:, :, :7], v[:, :, :7],
                    causal=True)
        self.raises(ValueError, "[1, 2^31 - 1]", A, q[:, :, :0], k, v)
        self.raises(ValueError, "key_lengths is empty", A, q, k, v, key_lengths=[])
        self.raises(TypeError, "scale must be a number", A, q, k, v, scale="1")
        self.raises(TypeError, "scale must be a number", A, q, k, v, scale=True)
        self.raises(ValueError, "DecodeState needs W", performer.DecodeState, 2, 8, 8, None)
        # exact attention has no kernel to change: its overflow says so
        big = np.full_like(q, 1e20)  # finite, but q.k overflows float32
        e = self.raises(FloatingPointError, "smaller scale", A, big, big, big, method="exact")
        self.assertNotIn("kernel", str(e))
        self.raises(TypeError, "complex", A, q.astype(np.complex64), k, v)
        self.raises(TypeError, "object", A, np.array([[None]]), k, v)
        self.raises(ValueError, "method 'fast'", A, q, k, v, method="fast")
        self.raises(ValueError, "kernel 'cosine'", A, q, k, v, kernel="cosine")
        self.raises(TypeError, "kernel must be a string", A, q, k, v, kernel=1)
        self.raises(ValueError, "proj 'gauss'", A, q, k, v, proj="gauss")
        self.raises(ValueError, "norm 'l2'", A, q, k, v, norm="l2")
        self.raises(ValueError, "kernel is for method='favor'", A, q, k, v, method="exact",
                    kernel="trig")
        self.raises(ValueError, "samples is for method='ra or lara'", A, q, k, v, samples=3)
        self.raises(ValueError, "W is given", A, q, k, v, W=performer.projection(8, 8), seed=3)
        self.raises(ValueError, "W has shape", A, q, k, v, W=np.ones((8, 5), np.float32))
        self.raises(ValueError, "features=9", A, q, k, v, W=np.ones((8, 8), np.float32),
                    features=9)
        self.raises(ValueError, "key_lengths has shape", A, q, k, v, key_lengths=[3])
        self.raises(ValueError, "key_lengths[1] = 21", A, q, k, v, key_lengths=[3, 21])
        self.raises(ValueError, "key_lengths[0] = 0", A, q, k, v, key_lengths=[0, 2])
        self.raises(TypeError, "key_lengths must hold integers", A, q, k, v,
                    key_lengths=[1.5, 2])
        self.raises(ValueError, "threads must be in [0, 1024]", A, q, k, v, threads=1025)
        self.raises(TypeError, "threads must be an integer", A, q, k, v, threads=1.0)
        self.raises(ValueError, "scale must be a positive", A, q, k, v, scale=-1)
        self.raises(ValueError, "normal range", A, q, k, v, scale=1e-40)
        self.raises(ValueError, "eps must be", A, q, k, v, eps=float("nan"))
        self.raises(ValueError, "needs oprf_a", A, q, k, v, kernel="oprf", causal=True)
        self.raises(ValueError, "oprf_a is for kernel='oprf'", A, q, k, v, oprf_a=-0.1)
        self.raises(ValueError, "below 1/8", A, q, k, v, kernel="oprf", oprf_a=0.2)
        self.raises(ValueError, "at most 20", A, q, k, v, method="lara", proposals=21)
        self.raises(ValueError, "samples must be 1", A, q, k, v, method="lara",
                    deterministic=True, samples=2)
        self.raises(ValueError, "out must be", A, q, k, v, out=np.empty((2, 3, 20, 8)))
        self.raises(ValueError, "overlap", A, q, k, v, out=q)
        self.raises(ValueError, "no backward pass", performer.attention_grad, q, k, v, q,
                    method="ra")
        self.raises(ValueError, "dout has shape", performer.attention_grad, q, k, v, q[0])
        self.raises(ValueError, "share d", performer.features, q, np.ones((4, 5), np.float32))
        self.raises(ValueError, "needs oprf_a", performer.features, q, np.ones((4, 8)), "oprf")
        self.raises(ValueError, "needs sderf", performer.features, q, np.ones((4, 8)), "sderf")
        self.raises(ValueError, "m must be in", performer.projection, 0, 8)
        self.raises(ValueError, "step takes", performer.DecodeState(3, 8, 8, np.ones((4, 8))).step,
                    q[0], k[0], v[0, :, :1])

    def test_not_supported(self):
        q, k, v = self.q, self.k, self.v
        e = self.raises(NotImplementedError, "bidirectional only", performer.attention, q, k,
                        v, kernel="sderf", causal=True)
        self.assertIsInstance(e, performer.NotSupported)
        self.raises(NotImplementedError, "bidirectional only", performer.attention, q, k, v,
                    method="lara", causal=True)

    def test_library_statuses(self):
        """Statuses from C: each is a performer.Error and the matching built-in exception."""
        q, k, v = self.q.copy(), self.k, self.v
        q[1, 2, 3, 4] = np.inf
        e = self.raises(FloatingPointError, "non-finite value (NaN or Inf)", performer.attention,
                        q, k, v)
        self.assertIsInstance(e, performer.NonFinite)
        self.assertEqual((e.status_name, e.function), ("PF_ENONFINITE", "pf_attn_favor"))
        self.assertIn("q holds inf at index (1, 2, 3, 4)", str(e))
        for method in ("exact", "ra", "lara"):
            self.raises(FloatingPointError, "q holds inf", performer.attention, q, k, v,
                        method=method)
        W = performer.projection(8, 8)
        W[2, 3] = np.nan
        self.raises(FloatingPointError, "W holds nan at index (2, 3)", performer.attention,
                    self.q, k, v, W=W)
        self.raises(FloatingPointError, "non-finite", performer.features, q, np.ones((4, 8)))
        # positive features overflow float32 without the stabiliser
        self.raises(FloatingPointError, "a result is not finite", performer.features,
                    np.full((1, 8), 3, np.float32), np.full((4, 8), 10.0), scale=1.0)
        # relu features all zero: a zero denominator is PF_EDOMAIN, never a NaN
        pos = np.abs(self.q) + 0.1
        e = self.raises(ArithmeticError, "undefined result", performer.attention, pos, pos, v,
                        kernel="relu", W=-np.ones((4, 8), np.float32))
        self.assertIsInstance(e, performer.UndefinedResult)
        self.assertNotIsInstance(e, FloatingPointError)
        # threads is checked by Python first; the library's own refusal is PF_EINVAL
        sh = _lib.pf_shape(1, 1, 4, 4, 8, 8)
        o = _lib.pf_attn_opts(0.0, 0, None, 5000)
        e = _lib.error(_lib.lib.pf_attn_check(ctypes.byref(sh), ctypes.byref(o)),
                       "pf_attn_check")
        self.assertIsInstance(e, ValueError)
        self.assertIsInstance(e, performer.InvalidArgument)
        self.assertEqual(str(e), "pf_attn_check: invalid argument")
        # a state of 2^20 heads x 2^12 values x 64 features (1 TiB) cannot be allocated
        e = self.raises(MemoryError, "out of memory", performer.DecodeState, 2 ** 20, 8,
                        2 ** 12, np.ones((64, 8), np.float32))
        self.assertIsInstance(e, performer.OutOfMemory)


class TestMemory(unittest.TestCase):
    """1000 calls do not grow the resident set: after 100 warm-up calls, 1000 more may add at
    most 4 MiB. Every call here allocates at least 16 KiB (outputs, features kept by the
    forward, a decoding state), so a leak of any of them would add 16 MiB or more."""

    BOUND = 4 << 20

    def grow(self, fn, n=1000, warm=100):
        for _ in range(warm):
            fn()
        before = rss_bytes()
        for _ in range(n):
            fn()
        return rss_bytes() - before

    def test_calls_do_not_leak(self):
        if ASAN:
            self.skipTest("ASan build: its quarantine keeps freed memory resident, so the "
                          "resident set grows by design (ASan checks the memory itself)")
        r = rng(12)
        q, k, v = (normal(r, (2, 128, 16)) for _ in range(3))  # out 16 KiB
        W = performer.projection(32, 16)
        n = 1000
        cases = {
            "attention favor": lambda: performer.attention(q, k, v, W=W, causal=True),
            "attention exact": lambda: performer.attention(q, k, v, method="exact"),
            "attention_grad": lambda: performer.attention_grad(q, k, v, q, W=W, causal=True),
            "features": lambda: performer.features(q, W),
            "DecodeState": lambda: performer.DecodeState(2, 16, 16, W).step(q[:, 0], k[:, 0],
                                                                           v[:, 0]),
            "errors": lambda: self.assertRaises(ValueError, performer.attention, q, k, v,
                                                key_lengths=[0]),
        }
        for name, fn in cases.items():
            with self.subTest(name):
                g = self.grow(fn, n)
                self.assertLess(g, self.BOUND, f"{name}: resident set grew by {g} bytes over "
                                f"{n} calls")


if __name__ == "__main__":
    unittest.main()
