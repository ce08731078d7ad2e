"""performer.torch on CUDA tensors (libperformer_cuda): the forward of every kernel, causal or
not, padded keys, float32/bfloat16/float16 against the CPU performer.torch.attention on the same
inputs and W, FastAttention moved to the GPU, layouts, streams, TF32, the W device copies, stage
profiling, and every refusal; the backward (training) against torch autograd through a float64
formula (test_torch's), gradcheck, the CPU library's gradients, autocast, kept and recomputed
features, retain_graph, and its errors. Skipped, saying why, without torch's CUDA,
libperformer_cuda (built by `make` only where nvcc is found) or a GPU.

Forward tolerances, as normwise max-abs errors max|gpu - cpu| / max|cpu| on inputs of norm about
1 (entries N(0, 0.5^2), values N(0, 1)) where every denominator is well away from 0:
- float32 with TF32 off: below 1e-5. Both sides compute in float32 in different orders; the
  CPU's own error against float64 is at most 1.4e-6 on these inputs (measured for each kernel),
  so the two differ by about that much.
- bfloat16 and float16: below 1e-2. The reference takes the same rounded inputs; the GPU
  rounds the features and the key state to bfloat16 as tensor-core inputs (8 bits: 2^-9
  relative) and the output to the dtype, which, emulated in float64 for these inputs, gives
  1e-3 to 4.3e-3.
- TF32 on: below 1e-2 (10-bit mantissas in the products, about bfloat16's error).

Backward tolerances, as relative errors ||x - ref|| / ||ref|| of the output and of each
gradient, on the same kind of inputs, the reference taking the inputs and the upstream gradient
rounded to the dtype:
- float32 with TF32 off, against float64 and against the CPU library: below 1e-5 (the CPU
  library's own error against float64 on these cases is at most 3.6e-7).
- bfloat16 and float16: below 2e-2. Rounding the features to bfloat16 (as tensor-core inputs)
  and the output and gradients to the dtype, emulated in float64 on these cases, gives 0.7e-3
  to 3e-3. The relu kernel's gradients jump where a feature's w.x' crosses 0, which the half
  types' TF32 projection can move by 2e-3: its inputs are drawn away from that (off_the_kink).
- kept against recomputed features, and a second backward (which recomputes): below 1e-6 in
  float32 (the same kernels; cuBLAS may pick others for another number of heads at a time),
  below 1e-2 in the half types (a gradient rounded the other way is 2^-8 of it).
"""
import contextlib
import copy
import gc
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
from test_torch import ref_attention  # the float64 formula (python/tests on sys.path)

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


# ---- the backward ------------------------------------------------------------------------------

GRAD_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}
SAME_TOL = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def rel(got, ref):
    """Relative (normwise) error ||got - ref|| / ||ref||, in float64 on the CPU."""
    g, r = got.detach().cpu().double(), ref.detach().cpu().double()
    return (torch.linalg.norm(g - r) / torch.linalg.norm(r)).item()


def upstream(seed, shape, dtype=torch.float32):
    """A fixed upstream gradient on the CPU, rounded to dtype and back to float32."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).float()


def leaves(dtype, *xs):
    """GPU copies of xs in dtype that require grad (leaves)."""
    return tuple(x.to(device=DEV, dtype=dtype).requires_grad_() for x in xs)


def backward(out, G, xs):
    """sum(out * G) backpropagated into xs: their gradients (cleared first)."""
    for x in xs:
        x.grad = None
    out.backward(G.to(device=out.device, dtype=out.dtype))
    return [x.grad for x in xs]


def per_head_w(H, m, d, seed):
    return torch.from_numpy(np.stack([performer.projection(m, d, seed=seed + h)
                                      for h in range(H)]))


def off_the_kink(x, W, dtype, seed, margin=1e-2):
    """x (B,H,L,d), entries N(0, 0.5^2), rounded to dtype (and back to float32), with every row
    for which some feature's w.x' (x' = x d^(-1/4)) lies within margin of 0 drawn again, until
    none does. The relu kernel's gradient jumps at w.x' = 0: the GPU projects half inputs with
    TF32 products (2^-11 of each term: up to about 2e-3 of w.x' here), so a w.x' that close to
    0 may fall on the other side than in float64, and its whole term of dq or dk is then lost
    or gained (one such feature out of 8192 gives a relative error of 3e-2 on its own)."""
    g = torch.Generator().manual_seed(seed)
    x, Wd = x.clone(), W.double()
    for _ in range(100):
        u = (x.to(dtype).double() * x.shape[-1] ** -0.25) @ Wd.transpose(-1, -2)
        bad = (u.abs() < margin).any(-1)  # (B,H,L)
        if not bool(bad.any()):
            return x.to(dtype).float()
        x[bad] = torch.randn(int(bad.sum()), x.shape[-1], generator=g) * 0.5
    raise AssertionError("inputs off the relu kink not found")


class TestBackward(unittest.TestCase):
    """Training on CUDA tensors: gradients against float64 autograd, the CPU library and finite
    differences; kept and recomputed features; retain_graph; errors."""

    def setUp(self):
        self.tf32 = tf32(False)
        self.tf32.__enter__()

    def tearDown(self):
        self.tf32.__exit__(None, None, None)

    def against_float64(self, dtype, q, k, v, G, W, what, kernel="positive", causal=False,
                        lens=None, eps=0.0, **kw):
        """pt.attention's output and gradients on the GPU in dtype against torch autograd
        through the float64 formula on the same (rounded) inputs and upstream gradient."""
        xs = leaves(dtype, q, k, v)
        out = pt.attention(*xs, W=W, kernel=kernel, causal=causal, key_lengths=lens, eps=eps,
                           **kw)
        self.assertEqual(out.dtype, dtype, what)
        got = backward(out, G, xs)
        ys = leaves(torch.float64, q, k, v)
        ref = ref_attention(*ys, W, kernel, causal, lens, eps=eps)
        want = backward(ref, G, ys)
        self.assertLess(rel(out, ref), GRAD_TOL[dtype], f"{what}: output")
        for name, a, b in zip(("dq", "dk", "dv"), got, want):
            self.assertEqual(a.dtype, dtype, f"{what}: {name}")
            self.assertTrue(bool(torch.isfinite(a).all()), f"{what}: {name}")
            e = rel(a, b)
            self.assertLess(e, GRAD_TOL[dtype], f"{what}: {name}: relative error {e:.3g}")
        if lens is not None:  # padded keys get exactly zero gradients
            for b, n in enumerate(lens):
                for name, g in (("dk", got[1]), ("dv", got[2])):
                    self.assertEqual(g[b, :, n:].abs().sum().item(), 0.0, f"{what}: {name} pad")
        return got

    def test_every_dtype_kernel_causal_or_not_padded_w(self):
        """Every kernel, causal (one chunk, and chunks of 16) or not, padded keys, W shared and
        per head, in float32, bfloat16 and float16."""
        q, k, v = inputs(20, B=2, H=2, Lq=64, Lk=64, d=16, dv=16)
        G = upstream(21, (2, 2, 64, 16))
        Ws = (("W shared", projection(32, 16, seed=20)), ("W per head", per_head_w(2, 32, 16, 21)))
        lens = [64, 41]
        for dtype in DTYPES:
            qd, kd, vd, Gd = (x.to(dtype).float() for x in (q, k, v, G))
            for kernel in KERNELS:
                eps = 1e-3 if kernel == "relu" else 0.0
                for wname, W in Ws:
                    qk = (qd, kd) if kernel != "relu" else \
                        (off_the_kink(q, W, dtype, 1), off_the_kink(k, W, dtype, 2))
                    for causal, chunk in ((False, 0), (True, 0), (True, 16)):
                        what = f"{dtype} {kernel} causal={causal} chunk={chunk} {wname}"
                        with self.subTest(what):
                            self.against_float64(dtype, *qk, vd, Gd, W, what, kernel=kernel,
                                                 causal=causal, lens=lens, eps=eps, chunk=chunk)

    def test_cross_attention_and_scale(self):
        q, k, v = inputs(22, B=2, H=3, Lq=40, Lk=70, d=16, dv=8)
        G = upstream(23, (2, 3, 40, 8))
        W = per_head_w(3, 24, 16, 22)
        for dtype in DTYPES:
            qd, kd, vd, Gd = (x.to(dtype).float() for x in (q, k, v, G))
            with self.subTest(dtype=str(dtype)):
                xs = leaves(dtype, qd, kd, vd)
                out = pt.attention(*xs, W=W, scale=0.2, key_lengths=[70, 33])
                got = backward(out, Gd, xs)
                ys = leaves(torch.float64, qd, kd, vd)
                ref = ref_attention(*ys, W, "positive", False, [70, 33], scale=0.2)
                for a, b in zip([out] + got, [ref] + backward(ref, Gd, ys)):
                    self.assertLess(rel(a, b), GRAD_TOL[dtype], f"{dtype}")

    def test_gradcheck(self):
        """torch.autograd.gradcheck on a tiny case. The CUDA function takes float32 at most, so
        the function checked casts float64 inputs to float32 and its output back: its values
        carry float32 rounding (about 6e-8 relative), which finite differences with step eps
        turn into an error of about 6e-8 / eps on each derivative, and the step itself, rounded
        to float32, is off by up to 3e-5 of it. With eps = 1e-3 that is about 1e-4, against a
        truncation error of eps^2 times the third derivatives (about 1e-6 here): atol 1e-3 and
        rtol 1e-2 hold with a margin, and a wrong gradient misses by far more (its errors are
        of the gradient's own size, about 1). nondet_tol 1e-5: gradcheck backpropagates the same
        graph several times, the first time with the kept features and then recomputing them,
        which agree to float32 rounding, not bit for bit. The float64 formula the other tests
        compare with is gradchecked too (with gradcheck's float64 defaults), on the device."""
        g = torch.Generator().manual_seed(24)
        q, k = (torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64) * 0.5 for _ in "qk")
        v = torch.randn(1, 2, 6, 3, generator=g, dtype=torch.float64)
        W = projection(8, 4, seed=24)
        for kernel in KERNELS:
            eps = 1e-3 if kernel == "relu" else 0.0
            for causal in (False, True):
                for save_bytes in (None, 1):
                    def f(q, k, v):
                        return pt.attention(q.float(), k.float(), v.float(), W=W, kernel=kernel,
                                            causal=causal, eps=eps, key_lengths=[5],
                                            save_bytes=save_bytes).double()

                    xs = tuple(x.to(DEV).requires_grad_() for x in (q, k, v))
                    with self.subTest(kernel=kernel, causal=causal, save_bytes=save_bytes):
                        self.assertTrue(torch.autograd.gradcheck(
                            f, xs, eps=1e-3, atol=1e-3, rtol=1e-2, nondet_tol=1e-5))

                def ref(q, k, v):
                    return ref_attention(q, k, v, W, kernel, causal, [5], eps=eps)

                xs = tuple(x.to(DEV).requires_grad_() for x in (q, k, v))
                with self.subTest(kernel=kernel, causal=causal, reference=True):
                    self.assertTrue(torch.autograd.gradcheck(ref, xs))

    def test_equals_the_cpu_library(self):
        """float32 on the GPU against performer.torch.attention on CPU float32 tensors with the
        same W: outputs and gradients to float32 rounding."""
        q, k, v = inputs(25, B=2, H=2, Lq=96, Lk=96, d=16, dv=16)
        G = upstream(26, (2, 2, 96, 16))
        lens = [96, 50]
        for kernel in KERNELS:
            eps = 1e-3 if kernel == "relu" else 0.0
            for causal in (False, True):
                for W in (projection(32, 16, seed=25), per_head_w(2, 32, 16, 26)):
                    what = f"{kernel} causal={causal} W {tuple(W.shape)}"
                    kw = dict(W=W, kernel=kernel, causal=causal, key_lengths=lens, eps=eps)
                    xs = leaves(torch.float32, q, k, v)
                    out = pt.attention(*xs, **kw)
                    got = [out] + backward(out, G, xs)
                    cs = tuple(x.clone().requires_grad_() for x in (q, k, v))
                    ref = pt.attention(*cs, **kw)
                    want = [ref] + backward(ref, G, cs)
                    with self.subTest(what):
                        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
                            e = rel(a, b)
                            self.assertLess(e, 1e-5, f"{what}: {name}: {e:.3g}")

    def test_fast_attention_on_the_gpu_under_autograd(self):
        q, k, v = inputs(27, B=2, H=3, Lq=80, Lk=80, d=16, dv=16)
        G = upstream(28, (2, 3, 80, 16))
        for causal in (False, True):
            for generalized in (False, True):
                with self.subTest(causal=causal, generalized=generalized):
                    fa = pt.FastAttention(16, nb_features=32, causal=causal,
                                          generalized_attention=generalized)
                    fg = copy.deepcopy(fa).cuda()
                    cs = tuple(x.clone().requires_grad_() for x in (q, k, v))
                    ref = fa(*cs)
                    want = [ref] + backward(ref, G, cs)
                    xs = leaves(torch.float32, q, k, v)
                    out = fg(*xs)
                    got = [out] + backward(out, G, xs)
                    for a, b in zip(got, want):
                        self.assertLess(rel(a, b), 1e-5)
                    self.assertIsNone(fg.projection_matrix.grad)

    def test_kept_and_recomputed(self):
        """save_bytes 0 keeps the features whatever their size, 1 never (they are recomputed in
        the backward), None within SAVE_BYTES: the same results, to float rounding. What is kept
        lives from the forward to the first backward, or to the end of a graph never
        backpropagated."""
        q, k, v = inputs(29, B=2, H=2, Lq=100, Lk=100, d=16, dv=16)
        G = upstream(30, (2, 2, 100, 16))
        W = projection(32, 16, seed=29)
        live = _cuda.ctx(DEV.index).saved  # the Saved alive now
        gc.collect()
        before = set(live)
        for dtype in DTYPES:
            qd, kd, vd, Gd = (x.to(dtype).float() for x in (q, k, v, G))
            for causal in (False, True):
                res = {}
                for save_bytes in (0, 1, None):
                    xs = leaves(dtype, qd, kd, vd)
                    out = pt.attention(*xs, W=W, causal=causal, save_bytes=save_bytes)
                    kept = list(set(live) - before)
                    self.assertEqual(len(kept), 0 if save_bytes == 1 else 1, f"{save_bytes}")
                    if kept:
                        self.assertGreater(kept[0].nbytes, 0)
                    del kept
                    res[save_bytes] = [out] + backward(out, Gd, xs)
                    self.assertEqual(set(live), before, "the backward frees what was kept")
                for a, b, c in zip(res[0], res[1], res[None]):
                    with self.subTest(dtype=str(dtype), causal=causal):
                        self.assertTrue(torch.equal(a, c))  # the same call
                        self.assertLess(rel(a, b), SAME_TOL[dtype])
        # a graph dropped without a backward frees its kept features
        xs = leaves(torch.float32, q, k, v)
        out = pt.attention(*xs, W=W, save_bytes=0)
        self.assertEqual(len(set(live) - before), 1)
        del out
        gc.collect()
        self.assertEqual(set(live), before)

    def test_retain_graph_and_double_backward(self):
        """A second backward of one graph (retain_graph=True) recomputes the features the first
        one freed: the same gradients to float rounding; a third after the graph is freed is
        torch's error; a gradient of a gradient is refused (once_differentiable)."""
        q, k, v = inputs(31, B=2, H=2, Lq=64, Lk=64, d=16, dv=16)
        G = upstream(32, (2, 2, 64, 16))
        W = projection(32, 16, seed=31)
        for dtype in DTYPES:
            Gd = G.to(device=DEV, dtype=dtype)
            xs = leaves(dtype, *(x.to(dtype).float() for x in (q, k, v)))
            out = pt.attention(*xs, W=W, causal=True)
            first = torch.autograd.grad(out, xs, Gd, retain_graph=True)
            second = torch.autograd.grad(out, xs, Gd, retain_graph=True)
            third = torch.autograd.grad(out, xs, Gd)
            for a, b, c in zip(first, second, third):
                self.assertLess(rel(b, a), SAME_TOL[dtype], f"{dtype}")
                self.assertTrue(torch.equal(b, c), f"{dtype}")  # both recomputed
            with self.assertRaisesRegex(RuntimeError, "backward through the graph a second"):
                torch.autograd.grad(out, xs, Gd)
        xs = leaves(torch.float32, q, k, v)
        out = pt.attention(*xs, W=W)
        # dout requiring grad: else the first gradient would be a constant with no graph
        (dq,) = torch.autograd.grad(out, xs[0], G.to(DEV).requires_grad_(), create_graph=True)
        with self.assertRaisesRegex(RuntimeError, "once_differentiable"):
            dq.sum().backward()

    def test_upstream_gradient_layouts_and_streams(self):
        """A non-contiguous dout (out.sum()'s expanded ones, a transposed view) is made
        contiguous; a forward and backward on another stream give the default stream's
        gradients; only the inputs requiring grad get one."""
        q, k, v = inputs(33, B=2, H=2, Lq=50, Lk=50, d=16, dv=16)
        W = projection(32, 16, seed=33)
        for dtype in DTYPES:
            xs = leaves(dtype, *(x.to(dtype).float() for x in (q, k, v)))
            a = torch.autograd.grad(pt.attention(*xs, W=W, causal=True).sum(), xs)
            ones = torch.ones(2, 2, 50, 16)
            b = backward(pt.attention(*xs, W=W, causal=True), ones, xs)
            for x, y in zip(a, b):
                self.assertTrue(same(x, y), f"{dtype}")
            Gt = upstream(34, (2, 2, 16, 50), dtype).to(device=DEV, dtype=dtype)
            out = pt.attention(*xs, W=W, causal=True)
            c = torch.autograd.grad(out, xs, Gt.transpose(-1, -2))
            d = torch.autograd.grad(pt.attention(*xs, W=W, causal=True), xs,
                                    Gt.transpose(-1, -2).contiguous())
            for x, y in zip(c, d):
                self.assertTrue(same(x, y), f"{dtype}")
            s = torch.cuda.Stream(device=DEV)
            s.wait_stream(torch.cuda.current_stream(DEV))
            with torch.cuda.stream(s):  # new leaves: their gradients are made on s
                ys = tuple(x.detach().clone().requires_grad_() for x in xs)
                e = torch.autograd.grad(pt.attention(*ys, W=W, causal=True).sum(), ys)
            torch.cuda.current_stream(DEV).wait_stream(s)
            for x, y in zip(a, e):
                self.assertTrue(same(x, y), f"{dtype} on another stream")
        qd, kd, vd = gpu(torch.float32, q, k, v)
        vr = vd.clone().requires_grad_()
        out = pt.attention(qd, kd, vr, W=W)
        out.sum().backward()
        self.assertIsNotNone(vr.grad)
        self.assertFalse(qd.requires_grad or kd.requires_grad)

    def test_errors(self):
        """A NaN in dout or in an input is FloatingPointError (the context still works after);
        an input or W changed in place between the forward and the backward is torch's
        RuntimeError; nothing kept is left behind."""
        q, k, v = inputs(35, B=2, H=2, Lq=40, Lk=40, d=16, dv=16)
        G = upstream(36, (2, 2, 40, 16))
        W = projection(32, 16, seed=35)
        live = _cuda.ctx(DEV.index).saved
        gc.collect()
        before = set(live)
        for dtype in DTYPES:
            for save_bytes in (None, 1):
                xs = leaves(dtype, q, k, v)
                out = pt.attention(*xs, W=W, causal=True, save_bytes=save_bytes)
                bad = G.to(device=DEV, dtype=dtype)
                bad[1, 0, 7, 3] = float("nan")
                with self.subTest(dtype=str(dtype), save_bytes=save_bytes):
                    with self.assertRaises(FloatingPointError) as cm:
                        out.backward(bad)
                    e = cm.exception
                    self.assertIsInstance(e, performer.NonFinite)
                    self.assertEqual(e.status_name, "PF_ENONFINITE")
                    self.assertEqual(e.function, "pf_cuda_favor_backward")
                    self.assertIn("dout holds nan at index (1, 0, 7, 3)", str(e))
                    self.assertEqual(set(live), before)
            xs = leaves(dtype, q, k, v)
            with torch.no_grad():
                xs[0][0, 1, 2, 3] = float("inf")
            with self.assertRaises(FloatingPointError) as cm:
                pt.attention(*xs, W=W)
            self.assertEqual(cm.exception.function, "pf_cuda_favor_save")
            self.assertIn("q holds inf at index (0, 1, 2, 3)", str(cm.exception))
            self.assertEqual(set(live), before)
        Wd = W.to(DEV)  # a float32 W on the device is used as it is: saved for the backward
        for name in ("q", "k", "v", "W"):
            xs = leaves(torch.float32, q, k, v)
            out = pt.attention(*xs, W=Wd)
            with torch.no_grad():
                dict(q=xs[0], k=xs[1], v=xs[2], W=Wd)[name].mul_(1.001)
            with self.subTest(changed=name):
                with self.assertRaisesRegex(RuntimeError, "modified by an inplace"):
                    out.backward(G.to(DEV))
            del out
        gc.collect()
        self.assertEqual(set(live), before)
        self.against_float64(torch.float32, q, k, v, G, W, "after the errors")


class TestAutocast(unittest.TestCase):
    """Inside torch.autocast("cuda", dtype=bfloat16 or float16) q, k and v are cast to the
    autocast dtype (float64 is not, and is refused), the call runs and returns in it, and the
    gradients come back in the inputs' dtypes."""

    def setUp(self):
        self.tf32 = tf32(False)
        self.tf32.__enter__()

    def tearDown(self):
        self.tf32.__exit__(None, None, None)

    def test_inputs_are_cast(self):
        q, k, v = inputs(40, B=2, H=2, Lq=64, Lk=64, d=16, dv=16)
        G = upstream(41, (2, 2, 64, 16))
        W = projection(32, 16, seed=40)
        for ac in (torch.bfloat16, torch.float16):
            other = torch.float16 if ac is torch.bfloat16 else torch.bfloat16
            qa, ka, va, Ga = (x.to(ac).float() for x in (q, k, v, G))
            for dts in ((torch.float32,) * 3, (other, torch.float32, ac)):
                xs = tuple(x.to(DEV, dt).requires_grad_() for x, dt in zip((q, k, v), dts))
                with self.subTest(autocast=str(ac), inputs=str(dts)):
                    with torch.autocast("cuda", dtype=ac):
                        out = pt.attention(*xs, W=W, causal=True)
                    self.assertEqual(out.dtype, ac)
                    got = backward(out, Ga, xs)
                    for x, g in zip(xs, got):
                        self.assertEqual(g.dtype, x.dtype)
                    # the reference takes the inputs as autocast rounded them
                    ys = leaves(torch.float64, *(x.detach().to(ac).float() for x in xs))
                    ref = ref_attention(*ys, W, "positive", True, None)
                    for a, b in zip([out] + got, [ref] + backward(ref, Ga, ys)):
                        self.assertLess(rel(a, b), GRAD_TOL[ac])
            with torch.autocast("cuda", dtype=ac):
                with torch.no_grad():
                    self.assertEqual(pt.attention(*gpu(torch.float32, q, k, v), W=W).dtype, ac)
                with self.assertRaisesRegex(TypeError, "float64"):
                    pt.attention(*gpu(torch.float64, q, k, v), W=W)
                with self.assertRaisesRegex(TypeError, "inside autocast"):
                    pt.attention(*gpu(torch.float32, q, k), v.to(DEV, torch.float64), W=W)
                with torch.autocast("cuda", enabled=False):
                    out = pt.attention(*leaves(torch.float32, q, k, v), W=W)
                self.assertEqual(out.dtype, torch.float32)

    def test_a_small_model_trains_a_step(self):
        """Linear -> FastAttention -> Linear trained one SGD step under autocast: the attention
        runs in the autocast dtype, the gradients are finite and within 2e-2 (relative) of the
        float32 run's, the step changes every weight."""
        torch.manual_seed(42)
        B, L, D, H, dh = 2, 64, 32, 2, 16

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inp = torch.nn.Linear(D, 3 * H * dh)
                self.attn = pt.FastAttention(dh, nb_features=32, causal=True)
                self.out = torch.nn.Linear(H * dh, D)

            def forward(self, x):
                qkv = self.inp(x).view(B, L, 3, H, dh).permute(2, 0, 3, 1, 4)  # (3,B,H,L,dh)
                a = self.attn(qkv[0], qkv[1], qkv[2])
                self.seen = a.dtype
                return self.out(a.transpose(1, 2).reshape(B, L, H * dh))

        base = Model().to(DEV)
        g = torch.Generator().manual_seed(43)
        x = torch.randn(B, L, D, generator=g).to(DEV)
        target = torch.randn(B, L, D, generator=g).to(DEV)

        def step(model, ac):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            opt.zero_grad()
            with torch.autocast("cuda", dtype=ac or torch.float16, enabled=ac is not None):
                y = model(x)
                loss = (y.float() * target).mean()  # dloss/dy exact in any dtype
            loss.backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            opt.step()
            for n, p in model.named_parameters():
                self.assertFalse(torch.equal(p.detach(), before[n]), f"{ac}: {n} unchanged")
            return model.seen, grads

        seen, g32 = step(copy.deepcopy(base), None)
        self.assertEqual(seen, torch.float32)
        for ac in (torch.bfloat16, torch.float16):
            with self.subTest(autocast=str(ac)):
                seen, gac = step(copy.deepcopy(base), ac)
                self.assertEqual(seen, ac)
                for n in g32:
                    self.assertTrue(bool(torch.isfinite(gac[n]).all()), f"{ac}: {n}")
                    e = rel(gac[n], g32[n])
                    self.assertLess(e, 2e-2, f"{ac}: {n}: relative error {e:.3g}")


class TestRefusals(unittest.TestCase):
    def test_in_grad_mode(self):
        """Inputs requiring grad are checked as in no-grad mode: method 'exact' and FAVOR++ are
        still refused on the GPU, before any work."""
        q, k, v = gpu(torch.float32, *inputs(11))
        W = projection(32, 16, seed=14)
        qr = q.clone().requires_grad_()
        with self.assertRaisesRegex(NotImplementedError, "scaled_dot_product_attention"):
            pt.attention(qr, k, v, method="exact")
        with self.assertRaisesRegex(NotImplementedError, "positive, hyperbolic, trig, relu"):
            pt.attention(qr, k, v, W=W, kernel="oprf", oprf_a=-0.05)
        with self.assertRaisesRegex(TypeError, "float64"):
            pt.attention(qr.double(), k.double(), v.double(), W=W)
        with self.assertRaisesRegex(ValueError, "save_bytes"):
            pt.attention(qr, k, v, W=W, save_bytes=-1)

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
