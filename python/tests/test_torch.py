"""performer.torch: gradients of attention() (every kernel, causal or not, padded keys) against
torch autograd through a float64 formula written here, FastAttention against the same formula
with its own projection_matrix (and performer-pytorch's generalized kernel), the bits of the
numpy layer (which test_numpy holds to the tool's), dtypes and devices, budgets, threads,
errors, and resident memory over 1000 forward+backward calls.

Tolerances: the C kernels compute in float32, the reference in float64, on inputs of norm
about 1 (entries N(0, 0.5^2)) where every denominator is well away from 0; the relative
error ||x - ref|| / ||ref|| of outputs and of each gradient must be below 1e-5 (float32
rounding through a few sums of at most a few hundred terms gives about 1e-6).
"""
import math
import os
import subprocess
import sys
import unittest

import numpy as np

try:
    import torch
except ImportError:  # the whole module is skipped, with this message
    raise unittest.SkipTest("torch is not installed (Debian's python3-torch): performer.torch "
                            "not tested")

import performer
import performer.torch as pt
from common import ASAN, rss_bytes, same_bits
from performer import _cuda

TOL = 1e-5


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return (torch.linalg.norm(a - b) / torch.linalg.norm(b)).item()


def ref_phi(x, W, kernel, scale, eps=0.0, A=None, sderf=None):
    """phi(x) in float64 from performer.h's formulas. x (..,H,L,d); W (m,d) or (H,m,d), moved
    to x's device."""
    x = x.double() * math.sqrt(scale)
    W = W.to(device=x.device, dtype=torch.float64)
    m, d = W.shape[-2], W.shape[-1]
    Wh = W  # (H,m,d): its leading H meets x's heads in the batched product
    if sderf is not None:
        Am, Bm, logD = sderf
        u = x @ Bm.T @ Wh.transpose(-1, -2) + torch.einsum("fi,ij,fj->f", W, Am, W)
    else:
        u = x @ Wh.transpose(-1, -2)
    h = (x * x).sum(-1, keepdim=True) / 2
    if kernel == "positive":
        phi = torch.exp(u - h) / math.sqrt(m)
    elif kernel == "hyperbolic":
        phi = torch.cat([torch.exp(u - h), torch.exp(-u - h)], -1) / math.sqrt(2 * m)
    elif kernel == "trig":
        phi = torch.exp(h) * torch.cat([torch.sin(u), torch.cos(u)], -1) / math.sqrt(m)
    elif kernel == "relu":
        return torch.relu(u) / math.sqrt(m) + eps
    elif kernel == "oprf":  # A: a number, or a (B,H) tensor of one A per head
        A = torch.as_tensor(A, dtype=torch.float64)[..., None, None]
        wsq = (W * W).sum(-1)
        phi = ((1 - 4 * A) ** (d / 4) / math.sqrt(m)
               * torch.exp(A * wsq + torch.sqrt(1 - 4 * A) * u - h))
    elif kernel == "sderf":
        phi = math.exp(sderf[2]) / math.sqrt(m) * torch.exp(u - h)
    return phi + eps * phi.abs().amax(-1, keepdim=True)


def ref_linear(pq, pk, v, causal, lens):
    """out = (pq pk^T masked) v / row sums, float64; pq (B,H,Lq,r), pk (B,H,Lk,r), on any one
    device."""
    Lq, Lk, dev = pq.shape[-2], pk.shape[-2], pq.device
    if lens is not None:
        keep = (torch.arange(Lk, device=dev)[None, :]
                < torch.as_tensor(lens, device=dev)[:, None])  # (B,Lk)
        pk = pk * keep[:, None, :, None]
    S = pq @ pk.transpose(-1, -2)
    if causal:
        S = S * torch.tril(torch.ones(Lq, Lk, dtype=S.dtype, device=dev))
    return (S @ v.double()) / S.sum(-1, keepdim=True)


def ref_attention(q, k, v, W, kernel, causal, lens, scale=None, eps=0.0, A=None, sderf=None):
    s = scale or 1 / math.sqrt(q.shape[-1])
    return ref_linear(ref_phi(q, W, kernel, s, eps, A, sderf[0] if sderf else None),
                      ref_phi(k, W, kernel, s, eps, A, sderf[1] if sderf else None),
                      v, causal, lens)


def ref_exact(q, k, v, causal, lens):
    s = 1 / math.sqrt(q.shape[-1])
    S = (q.double() @ k.double().transpose(-1, -2)) * s
    Lq, Lk = S.shape[-2:]
    mask = torch.ones(q.shape[0], 1, Lq, Lk, dtype=torch.bool)
    if causal:
        mask &= torch.tril(torch.ones(Lq, Lk, dtype=torch.bool))
    if lens is not None:
        mask &= (torch.arange(Lk)[None, :] < torch.as_tensor(lens)[:, None])[:, None, None]
    return torch.softmax(S.masked_fill(~mask, -math.inf), -1) @ v.double()


def inputs(seed, B=2, H=2, Lq=24, Lk=24, d=8, dv=8, sigma=0.5):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, H, Lq, d, generator=g) * sigma).requires_grad_()
    k = (torch.randn(B, H, Lk, d, generator=g) * sigma).requires_grad_()
    v = torch.randn(B, H, Lk, dv, generator=g).requires_grad_()
    G = torch.randn(B, H, Lq, dv, generator=g)  # the upstream gradient
    return q, k, v, G


def grads(out, G, *xs):
    for x in xs:
        x.grad = None
    (out * G).sum().backward()
    return [x.grad.clone() for x in xs]


class TestGradients(unittest.TestCase):
    def compare(self, ours, ref, q, k, v, G, what, lens=None):
        self.assertLess(rel(ours, ref), TOL, f"{what}: output")
        g1 = grads(ours, G, q, k, v)
        g2 = grads(ref, G.double(), q, k, v)
        for name, a, b in zip(("dq", "dk", "dv"), g1, g2):
            self.assertLess(rel(a, b), TOL, f"{what}: {name}")
        if lens is not None:  # padded keys get exactly zero gradients
            for b, n in enumerate(lens):
                self.assertEqual(g1[1][b, :, n:].abs().sum().item(), 0.0, f"{what}: dk pad")
                self.assertEqual(g1[2][b, :, n:].abs().sum().item(), 0.0, f"{what}: dv pad")
        return g1

    def test_every_kernel_causal_or_not_padded(self):
        q, k, v, G = inputs(1)
        W = torch.from_numpy(performer.projection(16, 8, seed=3))
        lens = [24, 17]
        for kernel in ("positive", "hyperbolic", "trig", "relu", "oprf"):
            for causal in (False, True):
                eps = 1e-3 if kernel == "relu" else 0.0
                A = -0.05 if kernel == "oprf" else None
                with self.subTest(kernel=kernel, causal=causal):
                    ours = pt.attention(q, k, v, W=W, kernel=kernel, causal=causal,
                                        key_lengths=lens, eps=eps, oprf_a=A)
                    ref = ref_attention(q, k, v, W, kernel, causal, lens, eps=eps, A=A)
                    self.compare(ours, ref, q, k, v, G, f"{kernel} causal={causal}", lens)

    def test_reference_gradcheck(self):
        """The float64 reference's own gradients (torch autograd through it, what every gradient
        test here and in test_torch_cuda compares with) against finite differences: gradcheck's
        defaults (eps 1e-6, atol 1e-5, rtol 1e-3) suit float64 on inputs of norm about 1."""
        g = torch.Generator().manual_seed(20)
        q, k = (torch.randn(2, 2, 6, 4, generator=g, dtype=torch.float64) * 0.5 for _ in "qk")
        v = torch.randn(2, 2, 6, 3, generator=g, dtype=torch.float64)
        W = torch.from_numpy(performer.projection(8, 4, seed=20))
        Wh = torch.from_numpy(np.stack([performer.projection(8, 4, seed=s) for s in (21, 22)]))
        for kernel in ("positive", "hyperbolic", "trig", "relu"):
            for causal in (False, True):
                eps = 1e-3 if kernel == "relu" else 0.0
                with self.subTest(kernel=kernel, causal=causal):
                    for Wx in (W, Wh):
                        def f(q, k, v):
                            return ref_attention(q, k, v, Wx, kernel, causal, [6, 4], eps=eps)
                        xs = tuple(x.clone().requires_grad_() for x in (q, k, v))
                        self.assertTrue(torch.autograd.gradcheck(f, xs))

    def test_fitted_oprf_and_sderf(self):
        """Bidirectional FAVOR++ and FAVOR# fit their A per head to the valid rows (a constant of
        the forward: no gradient flows through it); the reference takes the same A."""
        q, k, v, G = inputs(2)
        W = torch.from_numpy(performer.projection(16, 8, seed=4))
        lens = [24, 15]
        qn, kn = q.detach().numpy(), k.detach().numpy()
        A = torch.tensor([[performer.oprf_optimal_a(qn[b, h], kn[b, h, :lens[b]])
                           for h in range(2)] for b in range(2)], dtype=torch.float64)
        ours = pt.attention(q, k, v, W=W, kernel="oprf", key_lengths=lens)
        self.compare(ours, ref_attention(q, k, v, W, "oprf", False, lens, A=A), q, k, v, G,
                     "oprf fitted", lens)
        ours = pt.attention(q, k, v, W=W, kernel="sderf", key_lengths=lens)
        s = 1 / math.sqrt(8)
        ref = torch.empty_like(ours, dtype=torch.float64)
        for b in range(2):
            for h in range(2):
                A_, B_, logD = performer.sderf_params(qn[b, h], kn[b, h, :lens[b]])
                p = (torch.from_numpy(A_).double(), torch.from_numpy(B_).double(), logD)
                pq = ref_phi(q[b, h], W, "sderf", s, sderf=p)
                pk = ref_phi(k[b, h], W, "sderf", s, sderf=p)
                ref[b, h] = ref_linear(pq[None, None], pk[None, None], v[b, h][None, None],
                                       False, [lens[b]])[0, 0]
        self.compare(ours, ref, q, k, v, G, "sderf fitted", lens)

    def test_exact(self):
        q, k, v, G = inputs(3)
        lens = [24, 11]
        for causal in (False, True):
            with self.subTest(causal=causal):
                ours = pt.attention(q, k, v, method="exact", causal=causal, key_lengths=lens)
                self.compare(ours, ref_exact(q, k, v, causal, lens), q, k, v, G,
                             f"exact causal={causal}", lens)

    def test_cross_attention_per_head_w_and_scale(self):
        q, k, v, G = inputs(4, Lq=19, Lk=30, dv=5)
        W = torch.from_numpy(np.stack([performer.projection(12, 8, seed=s) for s in (1, 2)]))
        ours = pt.attention(q, k, v, W=W, scale=0.2, key_lengths=torch.tensor([30, 21]))
        ref = ref_attention(q, k, v, W, "positive", False, [30, 21], scale=0.2)
        self.compare(ours, ref, q, k, v, G, "cross, per-head W", [30, 21])

    def test_bits_of_the_numpy_layer(self):
        """Output and gradients are the bits of performer.attention_grad (and so the tool's)."""
        q, k, v, G = inputs(5)
        W = performer.projection(16, 8, seed=5)
        lens = np.array([24, 20], np.int32)
        for causal in (False, True):
            for method in ("favor", "exact"):
                kw = dict(W=W) if method == "favor" else {}
                o = pt.attention(q, k, v, causal=causal, method=method, key_lengths=lens,
                                 **{a: torch.from_numpy(b) for a, b in kw.items()})
                got = [o] + grads(o, G, q, k, v)
                want = performer.attention_grad(q.detach().numpy(), k.detach().numpy(),
                                                v.detach().numpy(), G.numpy(), method=method,
                                                causal=causal, key_lengths=lens, **kw)
                for a, b in zip(got, want):
                    self.assertTrue(same_bits(a.detach().numpy(), b), f"{method} {causal}")

    def test_budget_retain_graph_and_no_grad(self):
        """A budget that keeps fewer heads, a second backward (recomputing: the kept features
        are freed by the first) and the no-grad forward all give the same bits."""
        q, k, v, G = inputs(6, B=2, H=3, Lq=40, Lk=40)
        W = torch.from_numpy(performer.projection(16, 8, seed=6))
        base = pt.attention(q, k, v, W=W, causal=True)
        g0 = grads(base, G, q, k, v)
        small = pt.attention(q, k, v, W=W, causal=True, save_bytes=1)
        self.assertTrue(torch.equal(small, base))
        for a, b in zip(grads(small, G, q, k, v), g0):
            self.assertTrue(torch.equal(a, b))
        o = pt.attention(q, k, v, W=W, causal=True)
        for x in (q, k, v):
            x.grad = None
        (o * G).sum().backward(retain_graph=True)
        first = [x.grad.clone() for x in (q, k, v)]
        for x in (q, k, v):
            x.grad = None
        (o * G).sum().backward()
        for a, b, c in zip(first, (q.grad, k.grad, v.grad), g0):
            self.assertTrue(torch.equal(a, c) and torch.equal(b, c))
        with torch.no_grad():
            self.assertTrue(torch.equal(pt.attention(q, k, v, W=W, causal=True), base))

    def test_dtypes_layouts_threads(self):
        q, k, v, G = inputs(7)
        W = torch.from_numpy(performer.projection(16, 8, seed=7))
        o32 = pt.attention(q, k, v, W=W)
        g32 = grads(o32, G, q, k, v)
        q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
        o64 = pt.attention(q64, k64, v64, W=W.double())
        self.assertEqual(o64.dtype, torch.float64)
        self.assertTrue(torch.equal(o64, o32.double()))
        for a, b in zip(grads(o64, G.double(), q64, k64, v64), g32):
            self.assertEqual(a.dtype, torch.float64)
            self.assertTrue(torch.equal(a, b.double()))
        self.assertEqual(pt.attention(q.bfloat16(), k, v, W=W).dtype, torch.bfloat16)
        # a non-contiguous view is made contiguous once: same result
        qt = q.detach().transpose(-1, -2).contiguous().transpose(-1, -2)
        self.assertFalse(qt.is_contiguous())
        self.assertTrue(torch.equal(pt.attention(qt, k, v, W=W), o32))
        # threads follow torch.get_num_threads() unless given; bits never depend on them
        old = torch.get_num_threads()
        try:
            for n in (1, 2):
                torch.set_num_threads(n)
                p = pt._plan(q, k, v, W, method="favor", causal=False, kernel="positive",
                             key_lengths=None, scale=None, eps=0.0, chunk=0, oprf_a=None,
                             threads=None, save_bytes=None)
                self.assertEqual(p.opts.threads, n)
                self.assertTrue(torch.equal(pt.attention(q, k, v, W=W), o32))
            self.assertTrue(torch.equal(pt.attention(q, k, v, W=W, threads=2), o32))
        finally:
            torch.set_num_threads(old)

    def test_half_in_place_without_grad(self):
        """float16 and bfloat16 q, k, v without grad: read in place by pf_attn_favor_dt, the
        output in their dtype with the bits of the float32 computation rounded once; with grad,
        the differentiable conversion as before."""
        g = torch.Generator().manual_seed(5)
        W = torch.from_numpy(performer.projection(32, 16, seed=5))
        for dt in (torch.float16, torch.bfloat16):
            for causal in (False, True):
                q, k, v = (torch.randn(2, 3, 300, 16, generator=g).mul(0.5).to(dt)
                           for _ in range(3))
                with torch.no_grad():
                    o = pt.attention(q, k, v, W=W, causal=causal)
                    r = pt.attention(q.float(), k.float(), v.float(), W=W, causal=causal)
                self.assertEqual(o.dtype, dt)
                self.assertTrue(torch.equal(o, r.to(dt)), (dt, causal))
            qg = q.detach().requires_grad_()
            o = pt.attention(qg, k, v, W=W)
            o.float().sum().backward()
            self.assertEqual(o.dtype, dt)
            self.assertEqual(qg.grad.dtype, dt)

    def test_default_threads_are_torchs_at_each_call(self):
        """threads=None (FastAttention, through attention) is torch.get_num_threads() read at the
        call, in the calling thread, and the backward runs on its forward's count (the module
        docstring's contract); outputs and gradients are the same bits at every count."""
        import threading
        q, k, v, G = inputs(11)
        old = torch.get_num_threads()
        fa = pt.FastAttention(8, nb_features=16, causal=True)
        seen, bits = [], []

        def spy(fn):  # the pf_attn_opts.threads each C call of a plan gets
            def call(*args):
                seen.append(args[-3]._obj.threads)  # (..., sh, opts, fav, saved)
                return getattr(pt._lib.lib, fn)(*args)
            return call

        class Lib:
            pf_attn_favor_save = staticmethod(spy("pf_attn_favor_save"))
            pf_attn_favor_backward_saved = staticmethod(spy("pf_attn_favor_backward_saved"))

            def __getattr__(self, name):
                return getattr(pt._lib.lib, name)

        real, pt._L = pt._L, Lib()
        try:
            for n in (1, 2, 3):
                torch.set_num_threads(n)
                seen.clear()
                out = fa(q, k, v)
                torch.set_num_threads(1 if n > 1 else 2)  # changed between forward and backward
                bits.append([out] + grads(out, G, q, k, v))
                self.assertEqual(seen, [n, n], f"torch.set_num_threads({n})")
            torch.set_num_threads(2)
            seen.clear()
            worker = threading.Thread(target=lambda: grads(fa(q, k, v), G, q, k, v))
            worker.start()
            worker.join()
            self.assertEqual(seen, [2, 2], "a call from another Python thread")
        finally:
            pt._L = real
            torch.set_num_threads(old)
        for b in bits[1:]:
            for x, y in zip(b, bits[0]):
                self.assertTrue(torch.equal(x, y))


class TestRepeatedCalls(unittest.TestCase):
    """A call with the shapes and options of an earlier one reuses its plan (the C structs) and
    the kept features' storage (pooled): every result must still be the bits of a fresh call
    through the numpy layer (performer.attention_grad, which keeps nothing between calls), W may
    change in place between calls, an input changed in place between a forward and its backward
    is still an error, and a cached plan never lets through an option its checks refuse."""

    def setUp(self):
        pt.empty_cache()

    def tearDown(self):
        pt.empty_cache()

    def check(self, q, k, v, G, W, what, **kw):
        o = pt.attention(q, k, v, W=W, **kw)
        got = [o] + grads(o, G, q, k, v)
        want = performer.attention_grad(q.detach().numpy(), k.detach().numpy(),
                                        v.detach().numpy(), G.numpy(), W=W.detach().numpy(),
                                        **{a: b for a, b in kw.items() if a != "threads"})
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            self.assertTrue(same_bits(a.detach().numpy(), b), f"{what}: {name}")

    def test_w_changed_in_place_between_calls(self):
        q, k, v, G = inputs(11)
        W = torch.from_numpy(performer.projection(16, 8, seed=1))
        for causal in (False, True):
            self.check(q, k, v, G, W, "first", causal=causal)
            self.check(q, k, v, G, W, "again", causal=causal)
            W.copy_(torch.from_numpy(performer.projection(16, 8, seed=2)))  # torch sees it
            self.check(q, k, v, G, W, "W copied into", causal=causal)
            W.numpy()[:] *= 0.5  # through numpy: torch's version counter does not move
            self.check(q, k, v, G, W, "W changed through numpy", causal=causal)
        fa = pt.FastAttention(8, nb_features=16, causal=True)
        with torch.no_grad():
            before = fa(q, k, v)
            fa.redraw_projection_matrix()
            after = fa(q, k, v)
        want = performer.attention(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(),
                                   W=fa.projection_matrix.numpy(), causal=True)
        self.assertTrue(same_bits(after.numpy(), want))
        self.assertFalse(torch.equal(before, after))

    def test_key_lengths_changed_in_place_between_calls(self):
        """A plan made from key lengths in an int32 tensor or array keeps its own copy: the
        caller's buffer changed after the call, and the same values passed again in another
        buffer, give the first call's bits (the cached plan once read the changed buffer)."""
        q, k, v, G = inputs(12)
        W = torch.from_numpy(performer.projection(16, 8, seed=1))
        L = q.shape[2]
        for make in (lambda: torch.tensor([L, L - 5], dtype=torch.int32),
                     lambda: np.array([L, L - 5], dtype=np.int32)):
            for causal in (False, True):
                pt.empty_cache()
                kl = make()
                self.check(q, k, v, G, W, "first", causal=causal, key_lengths=kl)
                kl[1] = 2  # in place, after the call
                self.check(q, k, v, G, W, "the same values in a new buffer", causal=causal,
                           key_lengths=make())
                self.check(q, k, v, G, W, "the changed buffer", causal=causal, key_lengths=kl)

    def test_inputs_changed_in_place_before_backward(self):
        for method in ("favor", "exact"):
            for name in ("q", "k", "v", "W") if method == "favor" else ("q", "k", "v"):
                q, k, v, G = inputs(12)
                W = torch.from_numpy(performer.projection(16, 8, seed=3))
                kw = dict(W=W) if method == "favor" else {}
                for attempt in range(2):  # the second one through the cached plan
                    out = pt.attention(q, k, v, method=method, **kw)
                    with torch.no_grad():
                        dict(q=q, k=k, v=v, W=W)[name].mul_(1.001)
                    with self.subTest(method=method, changed=name, attempt=attempt):
                        with self.assertRaisesRegex(RuntimeError, "modified by an inplace"):
                            (out * G).sum().backward()
                if method == "favor":  # the plan and the pool still give the right bits
                    self.check(q, k, v, G, W, f"after {name} changed")

    def test_pooled_storage(self):
        q, k, v, G = inputs(13, B=1, H=2, Lq=64, Lk=64)
        W = torch.from_numpy(performer.projection(16, 8, seed=4))
        self.assertEqual(pt.pooled_bytes(), 0)
        self.check(q, k, v, G, W, "first")
        one = pt.pooled_bytes()
        self.assertGreater(one, 64 * 16 * 2 * 4)  # the features of q and k at least
        self.check(q, k, v, G, W, "from the pool")
        self.assertEqual(pt.pooled_bytes(), one)
        # two forwards before their backwards: the second makes new storage, both come back
        o1, o2 = pt.attention(q, k, v, W=W), pt.attention(q, k, v, W=W)
        self.assertEqual(pt.pooled_bytes(), 0)
        g1, g2 = grads(o1, G, q, k, v), grads(o2, G, q, k, v)
        self.assertEqual(pt.pooled_bytes(), 2 * one)
        for a, b in zip(g1, g2):
            self.assertTrue(torch.equal(a, b))
        # a backward after empty_cache() frees its storage instead of pooling it
        o = pt.attention(q, k, v, W=W)
        pt.empty_cache()
        self.assertEqual(pt.pooled_bytes(), 0)
        for a, b in zip(grads(o, G, q, k, v), g1):
            self.assertTrue(torch.equal(a, b))
        self.assertEqual(pt.pooled_bytes(), 0)
        old = pt.POOL_BYTES
        try:
            pt.POOL_BYTES = one - 1  # too small to pool one: freed after each backward
            self.check(q, k, v, G, W, "pool too small")
            self.assertEqual(pt.pooled_bytes(), 0)
        finally:
            pt.POOL_BYTES = old
        # double backward stays an error (once_differentiable), the first gradient is right
        o = pt.attention(q, k, v, W=W)
        gq, = torch.autograd.grad((o * G.clone().requires_grad_()).sum(), q, create_graph=True)
        self.assertTrue(torch.equal(gq, g1[0]))
        self.assertTrue(gq.requires_grad)
        with self.assertRaisesRegex(RuntimeError, "once_differentiable"):
            gq.sum().backward()

    def test_options_in_the_key(self):
        q, k, v, G = inputs(14)
        W = torch.from_numpy(performer.projection(16, 8, seed=5))
        for lens in ([24, 17], torch.tensor([24, 17]), np.array([24, 17], np.int64),
                     (24, 17), torch.tensor([24, 17], dtype=torch.int16)):
            self.check(q, k, v, G, W, f"key_lengths {type(lens).__name__}", key_lengths=lens)
        self.check(q, k, v, G, W, "key_lengths 24, 9", key_lengths=[24, 9])
        refused = [(TypeError, "key_lengths must hold integers",
                    dict(key_lengths=torch.tensor([24.0, 17.0]))),
                   (TypeError, "key_lengths must hold integers", dict(key_lengths=[24.0, 17])),
                   (TypeError, "threads must be an integer", dict(threads=True)),
                   (TypeError, "chunk must be an integer", dict(chunk=True))]
        pt.attention(q, k, v, W=W, key_lengths=[24, 17], threads=1, chunk=1)  # cached first
        for exc, text, kw in refused:
            args = dict(key_lengths=[24, 17], threads=1, chunk=1)
            args.update(kw)
            with self.subTest(text, **{a: str(b) for a, b in kw.items()}):
                with self.assertRaisesRegex(exc, text):
                    pt.attention(q, k, v, W=W, **args)
        # SAVE_BYTES is read at each call: a smaller budget keeps less
        self.check(q, k, v, G, W, "budget")
        full = pt.pooled_bytes()
        old = pt.SAVE_BYTES
        try:
            pt.empty_cache()
            pt.SAVE_BYTES = 1
            self.check(q, k, v, G, W, "budget 1")
            self.assertLess(pt.pooled_bytes(), full)
        finally:
            pt.SAVE_BYTES = old
        # a W that is converted (float64), a per-head W, a W that requires grad
        self.check(q, k, v, G, W.double(), "float64 W")
        Wh = torch.from_numpy(np.stack([performer.projection(16, 8, seed=s) for s in (6, 7)]))
        self.check(q, k, v, G, Wh, "per-head W")
        W2 = torch.from_numpy(performer.projection(16, 8, seed=9))  # same shape, elsewhere
        for w in (W, W2, W):
            self.check(q, k, v, G, w, "two Ws of one shape")
        Wp = torch.nn.Parameter(W.clone() * 0.9)
        self.check(q, k, v, G, Wp, "W a Parameter")
        self.assertIsNone(Wp.grad)

    def test_cache_is_bounded(self):
        W = torch.from_numpy(performer.projection(16, 8, seed=8))
        for L in range(1, pt._PLANS_MAX + 20):
            q, k, v, G = inputs(L, B=1, H=1, Lq=L, Lk=L)
            grads(pt.attention(q, k, v, W=W, causal=True), G, q, k, v)
        self.assertEqual(len(pt._PLANS), pt._PLANS_MAX)
        self.assertEqual(pt.pooled_bytes(),
                         sum(s.nbytes for p in pt._PLANS.values() for s in p.pool))
        self.check(q, k, v, G, W, "after evictions", causal=True)


class TestErrors(unittest.TestCase):
    def test_refusals(self):
        q, k, v, _ = inputs(8)
        W = torch.from_numpy(performer.projection(16, 8))
        cases = [
            (TypeError, "runs on the CPU", dict(q=torch.empty(2, 2, 24, 8, device="meta"))),
            (TypeError, "dtype torch.int64", dict(q=torch.ones(2, 2, 24, 8, dtype=torch.long))),
            (TypeError, "dtype torch.complex64", dict(q=torch.ones(2, 2, 24, 8,
                                                                   dtype=torch.complex64))),
            (TypeError, "must be a torch.Tensor", dict(q=q.detach().numpy())),
            (ValueError, "needs W", dict(W=None)),
            (ValueError, "for method='favor' only", dict(method="exact")),
            (ValueError, "method 'ra'", dict(method="ra")),
            (ValueError, "same width", dict(k=k[..., :4])),
            (ValueError, "key_lengths[1] = 25", dict(key_lengths=[3, 25])),
            (ValueError, "save_bytes", dict(save_bytes=-1)),
            (ValueError, "kernel 'gauss'", dict(kernel="gauss")),
        ]
        for exc, text, kw in cases:
            args = dict(q=q, k=k, v=v, W=W)
            args.update(kw)
            with self.subTest(text):
                with self.assertRaises(exc) as cm:
                    pt.attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)
                self.assertIn(text, str(cm.exception))
        bad = q.detach().clone()
        bad[1, 1, 2, 3] = float("nan")
        for method, kw in (("favor", dict(W=W)), ("exact", {})):
            with self.assertRaises(FloatingPointError) as cm:
                pt.attention(bad.requires_grad_(), k, v, method=method, **kw)
            self.assertIn("q holds nan at index (1, 1, 2, 3)", str(cm.exception))
            self.assertIsInstance(cm.exception, performer.NonFinite)
        with self.assertRaises(ArithmeticError):  # relu features all 0: zero denominator
            pt.attention(q.abs() + 0.1, q.abs() + 0.1, v, W=-W.abs() - 0.1, kernel="relu")
        with self.assertRaises(NotImplementedError):
            pt.attention(q, k, v, W=W, kernel="sderf", causal=True)

    def test_fast_attention_refusals(self):
        with self.assertRaisesRegex(ValueError, "Invalid scaling 2"):
            pt.FastAttention(16, ortho_scaling=2)
        with self.assertRaisesRegex(NotImplementedError, "no_projection"):
            pt.FastAttention(16, no_projection=True)
        with self.assertRaisesRegex(NotImplementedError, "GELU"):
            pt.FastAttention(16, generalized_attention=True, kernel_fn=torch.nn.GELU())
        with self.assertRaisesRegex(ValueError, "nb_features"):
            pt.FastAttention(1)
        fa = pt.FastAttention(8)
        with self.assertRaisesRegex(ValueError, r"expected \(B, H, L, 8\)"):
            fa(torch.ones(2, 24, 8), torch.ones(2, 24, 8), torch.ones(2, 24, 8))
        with self.assertRaisesRegex(TypeError, "CPU or on CUDA"):
            fa.redraw_projection_matrix("meta")


class TestFastAttention(unittest.TestCase):
    def test_constructor_and_projection(self):
        fa = pt.FastAttention(64)
        self.assertEqual(fa.nb_features, int(64 * math.log(64)))  # 266, as performer-pytorch
        self.assertEqual(tuple(fa.projection_matrix.shape), (266, 64))
        self.assertIn("projection_matrix", fa.state_dict())
        self.assertEqual(list(fa.parameters()), [])
        W = fa.projection_matrix
        blk = W[:64] / W[:64].norm(dim=1, keepdim=True)  # rows of one block are orthonormal
        self.assertLess((blk @ blk.T - torch.eye(64)).abs().max().item(), 1e-5)
        f1 = pt.FastAttention(16, nb_features=40, ortho_scaling=1)
        self.assertLess((f1.projection_matrix.norm(dim=1) - 4).abs().max().item(), 1e-5)
        torch.manual_seed(3)
        a = pt.FastAttention(16).projection_matrix.clone()
        torch.manual_seed(3)
        self.assertTrue(torch.equal(pt.FastAttention(16).projection_matrix, a))
        buf = fa.projection_matrix
        old = buf.clone()
        fa.redraw_projection_matrix()
        self.assertIs(fa.projection_matrix, buf)  # redrawn in place
        self.assertFalse(torch.equal(buf, old))

    def test_against_float64_with_its_projection(self):
        q, k, v, G = inputs(9, B=2, H=3, Lq=32, Lk=32, d=16, dv=16)
        for causal in (False, True):
            for generalized in (False, True):
                fa = pt.FastAttention(16, causal=causal, generalized_attention=generalized)
                ours = fa(q, k, v)
                W = fa.projection_matrix
                if generalized:  # performer-pytorch's generalized_kernel, as written there
                    phi = [torch.relu((x.double() * 16 ** -0.25) @ W.double().T) + 1e-3
                           for x in (q, k)]
                    ref = ref_linear(phi[0], phi[1], v, causal, None)
                else:
                    ref = ref_attention(q, k, v, W, "positive", causal, None)
                with self.subTest(causal=causal, generalized=generalized):
                    TestGradients.compare(self, ours, ref, q, k, v, G,
                                          f"FastAttention causal={causal} gen={generalized}")

    def test_in_a_module(self):
        """Used as performer-pytorch's is: built once, called on (B,H,L,d) projections."""
        torch.manual_seed(0)
        lin = torch.nn.Linear(32, 96)
        fa = pt.FastAttention(8, nb_features=16, causal=True)
        x = torch.randn(2, 20, 32)
        q, k, v = lin(x).view(2, 20, 3, 4, 8).permute(2, 0, 3, 1, 4)  # non-contiguous views
        out = fa(q, k, v)
        self.assertEqual(tuple(out.shape), (2, 4, 20, 8))
        out.square().mean().backward()
        self.assertTrue(torch.isfinite(lin.weight.grad).all())
        self.assertGreater(lin.weight.grad.abs().sum().item(), 0)


class TestCudaLibraryIsOptional(unittest.TestCase):
    """libperformer_cuda is loaded when a CUDA tensor first reaches performer.torch, never by
    importing it or by CPU calls; where it cannot be loaded, the GPU path says so and how to get
    it, and cuda_available() is False. (test_torch_cuda runs the GPU path, where there is one.)"""

    def run_python(self, code):
        env = dict(os.environ, PERFORMER_CUDA_LIB="/nonexistent/libperformer_cuda.so.0")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout.strip()

    def test_import_and_cpu_calls_do_not_load_it(self):
        got = self.run_python(
            "import torch, performer, performer.torch as pt, performer._cuda as c\n"
            "q = torch.randn(1, 2, 8, 4)\n"
            "W = torch.from_numpy(performer.projection(8, 4))\n"
            "pt.attention(q, q, q, W=W, causal=True)\n"
            "pt.attention(q.requires_grad_(), q, q, W=W).sum().backward()\n"
            "pt.FastAttention(4, nb_features=8)(q, q, q)\n"
            "pt.empty_cache()\n"
            "print(c._loaded == [] and c.contexts() == {})\n")
        self.assertEqual(got, "True")

    def test_missing_library_is_a_clear_error(self):
        with self.assertRaises(RuntimeError) as cm:
            _cuda.open_library([("/nonexistent/libperformer_cuda.so.0", "PERFORMER_CUDA_LIB")])
        msg = str(cm.exception)
        for text in ("libperformer_cuda", "nvcc", "`make`", "PERFORMER_CUDA_LIB",
                     "/nonexistent/libperformer_cuda.so.0 (PERFORMER_CUDA_LIB): no such file"):
            self.assertIn(text, msg)
        with self.assertRaisesRegex(RuntimeError, "lacks pf_cuda_"):  # not the CUDA library
            _cuda.open_library([(performer.library_path, "PERFORMER_CUDA_LIB")])
        got = self.run_python(
            "import performer.torch as pt, performer._cuda as c\n"
            "print(pt.cuda_available(), c.device_count())\n"
            "for f in (c.lib, lambda: pt.cuda_profile(True, 0), lambda: pt.cuda_stage_times(0)):\n"
            "    try:\n"
            "        f()\n"
            "    except RuntimeError as e:\n"
            "        print('was not found' in str(e) and 'nvcc' in str(e))\n")
        self.assertEqual(got.split(), ["False", "0", "True", "True", "True"])

    def test_projection_devices(self):
        fa = pt.FastAttention(8, nb_features=16)
        torch.manual_seed(1)
        a = fa.create_projection()
        torch.manual_seed(1)
        b = fa.create_projection("cpu")
        self.assertTrue(torch.equal(a, b))
        self.assertEqual((a.dtype, a.device.type), (torch.float32, "cpu"))


class TestMemory(unittest.TestCase):
    """1000 forward+backward calls add at most 4 MiB to the resident set after 100 warm-up
    calls; each call allocates at least 64 KiB (inputs' gradients, output, kept features)."""

    def test_calls_do_not_leak(self):
        if ASAN:
            self.skipTest("ASan build: its quarantine keeps freed memory resident")
        q, k, v, G = inputs(10, B=1, H=2, Lq=128, Lk=128, d=16, dv=16)
        W = torch.from_numpy(performer.projection(32, 16))
        fa = pt.FastAttention(16, causal=True)

        def favor():
            grads(pt.attention(q, k, v, W=W, causal=True), G, q, k, v)

        def exact():
            grads(pt.attention(q, k, v, method="exact"), G, q, k, v)

        def module():
            grads(fa(q, k, v), G, q, k, v)

        for name, fn in (("favor", favor), ("exact", exact), ("FastAttention", module)):
            for _ in range(100):
                fn()
            before = rss_bytes()
            for _ in range(1000):
                fn()
            grew = rss_bytes() - before
            with self.subTest(name):
                self.assertLess(grew, 4 << 20, f"{name}: resident set grew by {grew} bytes")


if __name__ == "__main__":
    unittest.main()
