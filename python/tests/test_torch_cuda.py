"""performer.torch on CUDA tensors (libperformer_cuda's forward): every kernel, causal or not,
padded keys, float32/bfloat16/float16 against the CPU performer.torch.attention on the same
inputs and W, FastAttention moved to the GPU, layouts, streams, TF32, the W device copies, stage
profiling, and every refusal. Skipped, saying why, without torch's CUDA, libperformer_cuda
(built by `make` only where nvcc is found) or a GPU.

Tolerances, as normwise max-abs errors max|gpu - cpu| / max|cpu| on inputs of norm about 1
(entries N(0, 0.5^2), values N(0, 1)) where every denominator is well away from 0:
- float32 with TF32 off: below 1e-5. Both sides compute in float32 in different orders; the
  CPU's own error against float64 is at most 1.4e-6 on these inputs (measured for each kernel),
  so the two differ by about that much.
- bfloat16 and float16: below 1e-2. The reference takes the same rounded inputs; the GPU
  rounds the features and the key state to bfloat16 as tensor-core inputs (8 bits: 2^-9
  relative) and the output to the dtype, which, emulated in float64 for these inputs, gives
  1e-3 to 4.3e-3.
- TF32 on: below 1e-2 (10-bit mantissas in the products, about bfloat16's error).
"""
import contextlib
import copy
import unittest

import numpy as np

try:
    import torch
except ImportError:  # the whole module is skipped, with this message
    raise unittest.SkipTest("torch is not installed (Debian's python3-torch): performer.torch's "
                            "CUDA path not tested")

import performer
import performer.torch as pt
from performer import _cuda

if not torch.cuda.is_available():
    raise unittest.SkipTest(
        "torch has no CUDA (a CPU build of torch): performer.torch's CUDA path not tested"
        if torch.version.cuda is None else
        "torch sees no GPU (torch.cuda.is_available() is False): performer.torch's CUDA path "
        "not tested")
try:
    _cuda.lib()
except RuntimeError as e:
    raise unittest.SkipTest("libperformer_cuda is not built (make builds it where nvcc is "
                            "found): " + str(e).splitlines()[0])
if _cuda.device_count() < 1:
    raise unittest.SkipTest(f"libperformer_cuda sees no GPU: {_cuda.last_error()}")

DEV = torch.device("cuda", torch.cuda.current_device())
KERNELS = ("positive", "hyperbolic", "trig", "relu")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def err(got, ref):
    """Normwise max-abs error of got (any device and dtype) against ref (CPU)."""
    g, r = got.detach().cpu().double(), ref.detach().cpu().double()
    return ((g - r).abs().max() / r.abs().max()).item()


@contextlib.contextmanager
def tf32(allow):
    """torch's TF32 switch for float32 cuBLAS products, restored after. Through
    set_float32_matmul_precision, which sets allow_tf32 and (from torch 2.9) fp32_precision
    together: setting one of those alone makes a mix torch 2.9 refuses to read back."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if allow else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def same(a, b):
    """Whether two GPU results of one computation agree: the library has no atomics, and cuBLAS
    gives the same bits on one GPU from run to run, but it does not promise them across streams
    (nor do we ask it to): float32 to 1e-6, half types to their own TOL (a few ulps)."""
    return err(a, b) < (1e-6 if a.dtype is torch.float32 else TOL[a.dtype])


def inputs(seed, B=2, H=3, Lq=200, Lk=200, d=16, dv=12, sigma=0.5, dtype=torch.float32):
    """q, k, v on the CPU, rounded to dtype and back to float32 (what the CPU reference takes:
    the GPU gets the same numbers in dtype)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Lq, d, generator=g) * sigma
    k = torch.randn(B, H, Lk, d, generator=g) * sigma
    v = torch.randn(B, H, Lk, dv, generator=g)
    return tuple(x.to(dtype).float() for x in (q, k, v))


def gpu(dtype, *xs):
    return tuple(x.to(device=DEV, dtype=dtype) for x in xs)


def projection(m, d, seed):
    return torch.from_numpy(performer.projection(m, d, seed=seed))


class TestAgainstCPU(unittest.TestCase):
    def setUp(self):
        self.tf32 = tf32(False)
        self.tf32.__enter__()

    def tearDown(self):
        self.tf32.__exit__(None, None, None)

    def compare(self, dtype, q, k, v, what, **kw):
        """pt.attention on the GPU in dtype against the CPU on the same (rounded) inputs."""
        ref = pt.attention(q, k, v, **kw)
        with torch.no_grad():
            out = pt.attention(*gpu(dtype, q, k, v), **kw)
        self.assertEqual(out.device, DEV, what)
        self.assertEqual(out.dtype, dtype, what)
        self.assertEqual(tuple(out.shape), tuple(ref.shape), what)
        self.assertTrue(bool(torch.isfinite(out).all()), what)
        e = err(out, ref)
        self.assertLess(e, TOL[dtype], f"{what}: normwise max-abs error {e:.3g}")
        return out

    def test_every_dtype_kernel_causal_or_not(self):
        W = projection(32, 16, seed=1)
        for dtype in DTYPES:
            q, k, v = inputs(1, dtype=dtype)
            for kernel in KERNELS:
                for causal in (False, True):
                    eps = 1e-3 if kernel == "relu" else 0.0
                    with self.subTest(dtype=str(dtype), kernel=kernel, causal=causal):
                        self.compare(dtype, q, k, v, f"{dtype} {kernel} causal={causal}", W=W,
                                     kernel=kernel, causal=causal, eps=eps)

    def test_key_lengths_chunks_scale_per_head_w(self):
        lens = [200, 77]
        for dtype in DTYPES:
            q, k, v = inputs(2, dtype=dtype)
            W = projection(32, 16, seed=2)
            Wh = torch.from_numpy(np.stack([performer.projection(32, 16, seed=s)
                                            for s in (3, 4, 5)]))
            cases = [("list", dict(W=W, key_lengths=lens)),
                     ("numpy", dict(W=W, key_lengths=np.array(lens, np.int64), causal=True)),
                     ("CPU tensor", dict(W=W, key_lengths=torch.tensor(lens))),
                     ("CUDA tensor", dict(W=W, key_lengths=torch.tensor(lens, device=DEV),
                                          causal=True)),
                     ("chunk 32", dict(W=W, causal=True, chunk=32, key_lengths=lens)),
                     ("chunk 1", dict(W=W, causal=True, chunk=1)),
                     ("scale", dict(W=W, scale=0.2)),
                     ("per-head W", dict(W=Wh, causal=True)),
                     ("per-head W, bidirectional", dict(W=Wh, key_lengths=lens))]
            for name, kw in cases:
                with self.subTest(dtype=str(dtype), case=name):
                    self.compare(dtype, q, k, v, f"{dtype} {name}", **kw)

    def test_cross_attention_and_ranks(self):
        W = projection(32, 16, seed=6)
        for dtype in DTYPES:
            q, k, v = inputs(3, Lq=50, Lk=130, dtype=dtype)
            self.compare(dtype, q, k, v, "cross", W=W)
            self.compare(dtype, q[0], k[0], v[0], "(H,L,d)", W=W, causal=False)
            self.compare(dtype, q[0, 0], k[0, 0], v[0, 0], "(L,d)", W=W)

    def test_larger(self):
        """d = 64, m = 256, L = 1024: several causal chunks of the default 128."""
        q, k, v = inputs(4, B=1, H=2, Lq=1024, Lk=1024, d=64, dv=64)
        W = projection(256, 64, seed=7)
        for dtype in DTYPES:
            qd, kd, vd = (x.to(dtype).float() for x in (q, k, v))
            for causal in (False, True):
                with self.subTest(dtype=str(dtype), causal=causal):
                    self.compare(dtype, qd, kd, vd, f"L=1024 {dtype} causal={causal}", W=W,
                                 causal=causal)

    def test_noncontiguous_inputs(self):
        """Views (a permuted projection, a transposed copy) are made contiguous: same output."""
        torch.manual_seed(0)
        x = torch.randn(2, 40, 3, 4, 16) * 0.5
        W = projection(32, 16, seed=8)
        for dtype in DTYPES:
            xd = x.to(device=DEV, dtype=dtype)
            q, k, v = xd.permute(2, 0, 3, 1, 4)  # (B,H,L,d) views, not contiguous
            self.assertFalse(q.is_contiguous())
            with torch.no_grad():
                got = pt.attention(q, k, v, W=W, causal=True)
                want = pt.attention(q.contiguous(), k.contiguous(), v.contiguous(), W=W,
                                    causal=True)
                qt = q.transpose(-1, -2).contiguous().transpose(-1, -2)
                self.assertFalse(qt.is_contiguous())
                also = pt.attention(qt, k, v, W=W, causal=True)
            self.assertTrue(same(got, want), f"{dtype}")
            self.assertTrue(same(also, want), f"{dtype}")
            ref = pt.attention(*(t.cpu().float() for t in (q, k, v)), W=W, causal=True)
            self.assertLess(err(got, ref), TOL[dtype])

    def test_fast_attention_on_the_gpu(self):
        q, k, v = inputs(5, B=2, H=3, Lq=100, Lk=100, d=16, dv=16)
        for causal in (False, True):
            for generalized in (False, True):
                with self.subTest(causal=causal, generalized=generalized):
                    fa = pt.FastAttention(16, nb_features=32, causal=causal,
                                          generalized_attention=generalized)
                    fg = copy.deepcopy(fa).cuda()
                    self.assertEqual(fg.projection_matrix.device, DEV)
                    self.assertTrue(torch.equal(fg.projection_matrix.cpu(),
                                                fa.projection_matrix))
                    ref = fa(q, k, v).detach()
                    for dtype in DTYPES:
                        qd, kd, vd = (x.to(dtype).float() for x in (q, k, v))
                        with torch.no_grad():
                            out = fg(*gpu(dtype, qd, kd, vd))
                        self.assertEqual(out.dtype, dtype)
                        r = fa(qd, kd, vd).detach() if dtype is not torch.float32 else ref
                        self.assertLess(err(out, r), TOL[dtype], f"{dtype}")
        # a projection drawn for the GPU is the CPU's draw moved there; a redraw is in place
        fa = pt.FastAttention(16, nb_features=32)
        torch.manual_seed(4)
        Wg = fa.create_projection(device=DEV)
        torch.manual_seed(4)
        Wc = fa.create_projection()
        self.assertEqual(Wg.device, DEV)
        self.assertTrue(torch.equal(Wg.cpu(), Wc))
        fg = fa.cuda()
        buf = fg.projection_matrix
        old = buf.clone()
        fg.redraw_projection_matrix(DEV)
        self.assertIs(fg.projection_matrix, buf)
        self.assertEqual(buf.device, DEV)
        self.assertFalse(torch.equal(buf, old))
        with torch.no_grad():
            out = fg(*gpu(torch.float32, q, k, v))
        ref = pt.attention(q, k, v, W=buf.cpu())
        self.assertLess(err(out, ref), 1e-5)

    def test_inference_mode_and_no_grad(self):
        q, k, v = inputs(6)
        W = projection(32, 16, seed=9)
        qg, kg, vg = gpu(torch.bfloat16, q, k, v)
        with torch.no_grad():
            a = pt.attention(qg, kg, vg, W=W, causal=True)
        with torch.inference_mode():
            b = pt.attention(qg, kg, vg, W=W, causal=True)
            fa = pt.FastAttention(16, nb_features=32, causal=True).to(DEV)  # inference buffer
            c = fa(qg, kg, vg)
            c2 = fa(qg, kg, vg)
        self.assertTrue(same(b, a))
        self.assertTrue(same(c2, c))
        # inputs that do not require grad run in grad mode too
        self.assertTrue(same(pt.attention(qg, kg, vg, W=W, causal=True), a))
        self.assertTrue(torch.is_inference(b))

    def test_non_default_stream(self):
        q, k, v = inputs(7)
        W = projection(32, 16, seed=10)
        for dtype in DTYPES:
            qg, kg, vg = gpu(dtype, q, k, v)
            with torch.no_grad():
                want = pt.attention(qg, kg, vg, W=W, causal=True, key_lengths=[200, 150])
                s = torch.cuda.Stream(device=DEV)
                s.wait_stream(torch.cuda.current_stream(DEV))  # the inputs were made there
                with torch.cuda.stream(s):
                    got = pt.attention(qg, kg, vg, W=W, causal=True, key_lengths=[200, 150])
                    got2 = pt.attention(qg.transpose(-1, -2).contiguous().transpose(-1, -2),
                                        kg, vg, W=W.double(), causal=True,
                                        key_lengths=[200, 150])
                s.synchronize()
            # the same computation on another stream: the same numbers (see same())
            self.assertTrue(same(got, want), f"{dtype}")
            self.assertTrue(same(got2, want), f"{dtype} (a copied W, a view)")
            ref = pt.attention(q.to(dtype).float(), k.to(dtype).float(), v.to(dtype).float(),
                               W=W, causal=True, key_lengths=[200, 150])
            self.assertLess(err(got, ref), TOL[dtype], f"{dtype}")

    def test_tf32_follows_torch(self):
        q, k, v = inputs(8)
        W = projection(32, 16, seed=11)
        ref = pt.attention(q, k, v, W=W)
        qg, kg, vg = gpu(torch.float32, q, k, v)
        ctx = _cuda.ctx(DEV.index)
        with torch.no_grad():
            with tf32(True):
                on = pt.attention(qg, kg, vg, W=W)
                self.assertEqual(ctx.tf32, 1)
            with tf32(False):
                off = pt.attention(qg, kg, vg, W=W)
                self.assertEqual(ctx.tf32, 0)
        self.assertLess(err(on, ref), 1e-2)
        self.assertLess(err(off, ref), 1e-5)


class TestWCopies(unittest.TestCase):
    """W's device copy is made once per W and version, and made again after an in-place change
    (torch's, or through numpy for a W on the CPU); a float32 W on the device is not copied."""

    def setUp(self):
        pt.empty_cache()
        self.tf32 = tf32(False)
        self.tf32.__enter__()

    def tearDown(self):
        self.tf32.__exit__(None, None, None)
        pt.empty_cache()

    def run_both(self, q, k, v, W, what):
        with torch.no_grad():
            out = pt.attention(*gpu(torch.float32, q, k, v), W=W, causal=True)
        ref = pt.attention(q, k, v, W=W.cpu(), causal=True)
        self.assertLess(err(out, ref), 1e-5, what)

    def test_cached_and_refreshed(self):
        q, k, v = inputs(9)
        W = projection(32, 16, seed=12)
        self.run_both(q, k, v, W, "first")
        self.assertEqual(len(pt._W_CACHE), 1)
        (copy1,) = [e[3] for e in pt._W_CACHE.values()]
        self.run_both(q, k, v, W, "again")
        (copy2,) = [e[3] for e in pt._W_CACHE.values()]
        self.assertIs(copy1, copy2)  # not copied again
        W.mul_(0.7)  # torch counts it
        self.run_both(q, k, v, W, "after W.mul_")
        W.copy_(projection(32, 16, seed=13))
        self.run_both(q, k, v, W, "after W.copy_")
        W.numpy()[:] *= 0.5  # torch does not count it: the CPU W's bits are compared
        self.run_both(q, k, v, W, "after a change through numpy")
        self.assertEqual(len(pt._W_CACHE), 1)
        for Wx, what in ((W.double(), "float64 W"), (W.half(), "float16 W"),
                         (W.to(DEV, torch.float64), "float64 W on the GPU"),
                         (W.t().contiguous().t(), "a transposed view")):
            self.run_both(q, k, v, Wx, what)
        Wg = W.to(DEV)
        self.run_both(q, k, v, Wg, "float32 W on the GPU")
        n = len(pt._W_CACHE)
        self.run_both(q, k, v, Wg, "float32 W on the GPU, again")
        self.assertEqual(len(pt._W_CACHE), n)  # used as it is, never kept
        Wg.mul_(2.0)
        self.run_both(q, k, v, Wg, "float32 W on the GPU, changed")
        Wg64 = W.to(DEV, torch.float64)
        self.run_both(q, k, v, Wg64, "float64 W on the GPU")
        Wg64.mul_(0.5)
        self.run_both(q, k, v, Wg64, "float64 W on the GPU, changed in place")
        Wp = torch.nn.Parameter(W.clone())  # requires grad: a constant here
        self.run_both(q, k, v, Wp, "W a Parameter")
        self.assertIsNone(Wp.grad)
        pt.empty_cache()
        self.assertEqual(len(pt._W_CACHE), 0)

    def test_bounded(self):
        q, k, v = inputs(10, B=1, H=1, Lq=20, Lk=20)
        Ws = [projection(32, 16, seed=s) for s in range(pt._W_CACHE_MAX + 4)]
        for W in Ws:
            self.run_both(q, k, v, W, "many Ws")
        self.assertLessEqual(len(pt._W_CACHE), pt._W_CACHE_MAX)
        del Ws, W
        self.run_both(q, k, v, projection(32, 16, seed=99), "after the Ws are gone")
        self.assertEqual(len(pt._W_CACHE), 1)  # entries of dead Ws are dropped


class TestRefusals(unittest.TestCase):
    def test_grad_is_refused_early(self):
        q, k, v = gpu(torch.float32, *inputs(11))
        W = projection(32, 16, seed=14)
        for name in ("q", "k", "v"):
            args = dict(q=q, k=k, v=v)
            args[name] = args[name].clone().requires_grad_()
            with self.subTest(requires_grad=name):
                with self.assertRaises(NotImplementedError) as cm:
                    pt.attention(args["q"], args["k"], args["v"], W=W)
                self.assertEqual(str(cm.exception),
                                 "the CUDA backward of FAVOR+ is not implemented yet: run under "
                                 "torch.no_grad() / inference_mode, or on CPU tensors for "
                                 "training")
                with torch.no_grad():
                    pt.attention(args["q"], args["k"], args["v"], W=W)
        fa = pt.FastAttention(16, nb_features=32).cuda()
        with self.assertRaisesRegex(NotImplementedError, "CUDA backward"):
            fa(q.clone().requires_grad_(), k, v)
        # before any work: refused even where the arguments are wrong in other ways too
        with self.assertRaisesRegex(NotImplementedError, "CUDA backward"):
            pt.attention(q.clone().requires_grad_(), k, v, W=None, kernel="oprf")

    def test_devices_dtypes_methods_kernels(self):
        q, k, v = inputs(12)
        qg, kg, vg = gpu(torch.float32, q, k, v)
        W = projection(32, 16, seed=15)
        cases = [
            (ValueError, "q is on cpu, k on cuda", dict(q=q)),
            (ValueError, "v on cpu", dict(v=v)),
            (TypeError, "one dtype", dict(k=kg.bfloat16())),
            (TypeError, "one dtype", dict(v=vg.half())),
            (TypeError, "float64", dict(q=qg.double(), k=kg.double(), v=vg.double())),
            (TypeError, ".float()", dict(q=qg.double(), k=kg.double(), v=vg.double())),
            (TypeError, "torch.int64", dict(q=qg.long(), k=kg.long(), v=vg.long())),
            (NotImplementedError, "scaled_dot_product_attention", dict(method="exact", W=None)),
            (ValueError, "method 'ra'", dict(method="ra")),
            (NotImplementedError, "positive, hyperbolic, trig, relu",
             dict(kernel="oprf", oprf_a=-0.05)),
            (NotImplementedError, "positive, hyperbolic, trig, relu", dict(kernel="sderf")),
            (ValueError, "kernel 'gauss'", dict(kernel="gauss")),
            (ValueError, "needs W", dict(W=None)),
            (ValueError, "W has shape", dict(W=projection(32, 8, seed=1))),
            (TypeError, "W must be a torch.Tensor", dict(W=W.numpy())),
            (ValueError, "same width", dict(k=kg[..., :8])),
            (ValueError, "key_lengths[1] = 201", dict(key_lengths=[3, 201])),
            (ValueError, "causal attention needs as many queries as keys",
             dict(q=qg[:, :, :10], causal=True)),
            (ValueError, "save_bytes", dict(save_bytes=-1)),
            (TypeError, "chunk must be an integer", dict(chunk=1.5)),
        ]
        if torch.cuda.device_count() > 1:
            other = torch.device("cuda", (DEV.index + 1) % torch.cuda.device_count())
            cases.append((ValueError, f"k on {other}", dict(k=kg.to(other))))
        for exc, text, kw in cases:
            args = dict(q=qg, k=kg, v=vg, W=W)
            args.update(kw)
            with self.subTest(text):
                with torch.no_grad():
                    with self.assertRaises(exc) as cm:
                        pt.attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)
                self.assertIn(text, str(cm.exception))

    def test_nonfinite_input(self):
        q, k, v = gpu(torch.float32, *inputs(13))
        W = projection(32, 16, seed=16)
        for dtype in DTYPES:
            bad = q.to(dtype).clone()
            bad[1, 1, 2, 3] = float("nan")
            for causal in (False, True):
                with self.subTest(dtype=str(dtype), causal=causal):
                    with torch.no_grad():
                        with self.assertRaises(FloatingPointError) as cm:
                            pt.attention(bad, k.to(dtype), v.to(dtype), W=W, causal=causal)
                    e = cm.exception
                    self.assertIsInstance(e, performer.NonFinite)
                    self.assertEqual(e.status_name, "PF_ENONFINITE")
                    self.assertEqual(e.function, "pf_cuda_favor")
                    self.assertIn("q holds nan at index (1, 1, 2, 3)", str(e))
        # the context is still usable after the error
        with torch.no_grad():
            out = pt.attention(q, k, v, W=W)
        self.assertTrue(bool(torch.isfinite(out).all()))


class TestLibrary(unittest.TestCase):
    def test_available_profile_and_contexts(self):
        self.assertTrue(pt.cuda_available())
        self.assertTrue(_cuda.is_loaded())
        q, k, v = gpu(torch.bfloat16, *inputs(14))
        W = projection(32, 16, seed=17)
        pt.cuda_profile(True)
        try:
            pt.cuda_stage_times()  # resets the sums
            with torch.no_grad():
                for causal in (False, True):
                    pt.attention(q, k, v, W=W, causal=causal)
            st = pt.cuda_stage_times(DEV)
        finally:
            pt.cuda_profile(False, DEV.index)
        self.assertEqual([s.name for s in st],
                         ["project", "features", "weights", "chunk_states", "prefix", "scores",
                          "readout_mm", "normalise"])
        self.assertGreater(sum(s.ms for s in st), 0)
        self.assertTrue(all(s.ms >= 0 and s.flops >= 0 and s.bytes >= 0 for s in st))
        self.assertGreater(st[0].flops, 0)  # the projection is a matrix product
        self.assertIn(DEV.index, _cuda.contexts())
        self.assertGreater(_cuda.ctx_bytes(DEV.index), 0)
        pt.empty_cache()  # trims the workspace; the next call allocates again
        with torch.no_grad():
            pt.attention(q, k, v, W=W)
        with self.assertRaisesRegex(ValueError, "a CUDA device"):
            pt.cuda_stage_times("cpu")


if __name__ == "__main__":
    unittest.main()
