"""performer.torch in performer-pytorch's models: patch_performer_pytorch() and
convert_performer_pytorch(), against the real package (performer-pytorch 1.1.4, fetched once
into a cache folder by common.performer_pytorch_dir; skipped, saying why, when it cannot be).

- Built while patched, PerformerLM, Performer (causal or not, softmax or generalized attention)
  hold only performer.torch modules, which performer-pytorch's ProjectionUpdater finds: their
  projections are redrawn after feature_redraw_interval training calls, never in eval mode,
  and still after the patch is undone. A built model, and one whose modules were replaced by
  hand with performer.torch.FastAttention (which performer-pytorch never redraws), is
  converted keeping every weight and projection.
- Forward and backward: a converted model against performer-pytorch's own model computing the
  same formula in float64 (its 1e-4 feature offset and 1e-6 causal denominator offset set to 0,
  so that it computes the FAVOR+ estimator exactly, as performer.torch does): relative error
  of the logits and of every parameter's gradient below 1e-5 (float32 rounding through two
  layers gives about 2e-7 here). Against performer-pytorch as it ships, in float32: within
  1e-3 for softmax attention (its 1e-4 offset moves each feature by up to 1e-4 of the largest
  one: 1e-4 relative here) and 1e-5 for the generalized (ReLU) attention, whose formula is the
  same. A model built while patched, given that model's state_dict, computes the converted
  one's bits; built from the same seed it starts from other weights, as documented.
- Refusals: settings the C kernels do not run are NotImplementedError at construction when
  patched, and naming the module when converting (the model is left as it was); no
  performer-pytorch is ImportError; a model that is no module is TypeError. performer-pytorch's
  files are never changed.
"""
import contextlib
import copy
import io
import sys
import unittest

try:
    import torch
except ImportError:
    raise unittest.SkipTest("torch is not installed (Debian's python3-torch): performer.torch "
                            "not tested")

import performer.torch as pt
from common import performer_pytorch_dir, tree_digest

TOL = 1e-5

PP = None  # performer_pytorch's module performer_pytorch.performer_pytorch, once imported


def import_performer_pytorch():
    """performer_pytorch.performer_pytorch from the fetched folder (put on sys.path), and the
    folder; unittest.SkipTest when it cannot be fetched."""
    global PP
    site = performer_pytorch_dir()
    if site not in sys.path:
        sys.path.insert(0, site)
    import warnings
    with warnings.catch_warnings():  # its distutils.version import
        warnings.simplefilter("ignore", DeprecationWarning)
        from performer_pytorch import performer_pytorch
    PP = performer_pytorch
    return site


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return (torch.linalg.norm(a - b) / torch.linalg.norm(b)).item()


def lm(causal, seed=0, **kw):
    torch.manual_seed(seed)
    args = dict(num_tokens=64, max_seq_len=32, dim=32, depth=2, heads=4, dim_head=8,
                nb_features=16, causal=causal)
    args.update(kw)
    with contextlib.redirect_stdout(io.StringIO()):  # "unable to import cuda code ..." (causal)
        return PP.PerformerLM(**args)


def attentions(model):
    return [m for m in model.modules() if isinstance(m, (PP.FastAttention, pt.FastAttention))]


def formula64(model, x):
    """performer-pytorch's own model in float64 with its offsets (softmax_kernel's eps=1e-4,
    the causal denominators' eps=1e-6) set to 0: the FAVOR+ estimator itself."""
    ref = copy.deepcopy(model).double()
    kw = PP.softmax_kernel.__kwdefaults__
    causal_defaults = PP.causal_linear_attention_noncuda.__defaults__
    eps = kw["eps"]
    kw["eps"] = 0.0
    PP.causal_linear_attention_noncuda.__defaults__ = (causal_defaults[0], 0.0)
    try:
        return ref, ref(x)
    finally:
        kw["eps"] = eps
        PP.causal_linear_attention_noncuda.__defaults__ = causal_defaults


class TestPerformerPytorch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.site = import_performer_pytorch()
        cls.files = tree_digest(cls.site)

    @classmethod
    def tearDownClass(cls):
        if tree_digest(cls.site) != cls.files:
            raise AssertionError(f"performer-pytorch's files in {cls.site} changed")

    def test_patch_builds_ours_everywhere(self):
        base = PP.FastAttention
        import performer_pytorch
        before = lm(True)  # built before: performer-pytorch's own, then and after
        with pt.patch_performer_pytorch() as patch:
            self.assertTrue(patch.active)
            for make in (lambda: performer_pytorch.FastAttention(8, 16),  # either name
                         lambda: PP.FastAttention(8, nb_features=16, causal=True)):
                fa = make()
                self.assertIsInstance(fa, pt.FastAttention)
                self.assertIsInstance(fa, base)
                self.assertIs(type(fa), pt.PerformerPytorchFastAttention)
            for causal in (False, True):
                for gen in (False, True):
                    m = lm(causal, generalized_attention=gen)
                    found = PP.find_modules(m, PP.FastAttention)  # what its updater redraws
                    self.assertEqual(len(found), 2)
                    for fa in found:
                        self.assertIs(type(fa), pt.PerformerPytorchFastAttention)
                        self.assertEqual((fa.causal, fa.generalized_attention), (causal, gen))
            perf = PP.Performer(dim=32, depth=1, heads=4, dim_head=8, causal=True)
            self.assertIs(type(attentions(perf)[0]), pt.PerformerPytorchFastAttention)
            self.assertTrue(all(type(m) is base for m in attentions(before)))
            # copies and pickles of performer-pytorch's own modules stay its own
            self.assertIs(type(copy.deepcopy(attentions(before)[0])), base)
            again = pt.patch_performer_pytorch()  # idempotent: a second hold, one patch
            again.undo()
            again.undo()
            self.assertFalse(again.active)
            self.assertIs(type(base(8, 16)), pt.PerformerPytorchFastAttention)
        self.assertFalse(patch.active)
        self.assertIs(type(base(8, 16)), base)
        self.assertIs(type(PP.SelfAttention(32, heads=4, dim_head=8).fast_attention), base)
        # a model built while patched, saved whole and loaded after the undo, keeps its class
        buf = io.BytesIO()
        torch.save(m, buf)
        buf.seek(0)
        self.assertIs(type(attentions(torch.load(buf))[0]), pt.PerformerPytorchFastAttention)

    def test_forward_and_backward_against_the_formula(self):
        x = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(1))
        for causal in (False, True):
            for gen in (False, True):
                with self.subTest(causal=causal, generalized=gen):
                    theirs = lm(causal, generalized_attention=gen)
                    ours = pt.convert_performer_pytorch(copy.deepcopy(theirs))
                    a, b = attentions(ours), attentions(theirs)
                    self.assertTrue(all(type(m) is pt.PerformerPytorchFastAttention for m in a))
                    for m, n in zip(a, b):
                        self.assertTrue(torch.equal(m.projection_matrix, n.projection_matrix))
                    ref, y_ref = formula64(theirs, x)
                    y = ours(x)
                    self.assertLess(rel(y, y_ref), TOL)
                    bound = 1e-5 if gen else 1e-3  # its 1e-4 feature offset (docstring)
                    self.assertLess(rel(y, theirs(x)), bound)
                    y.square().mean().backward()
                    y_ref.square().mean().backward()
                    for (name, p), (_, p64) in zip(ours.named_parameters(),
                                                   ref.named_parameters()):
                        self.assertLess(rel(p.grad, p64.grad), TOL, name)
                    # built while patched from the same seed: other starting weights; with the
                    # state_dict of the converted one, its bits
                    with pt.patch_performer_pytorch():
                        built = lm(causal, generalized_attention=gen)
                    self.assertTrue(torch.equal(built.token_emb.weight,  # made before
                                                theirs.token_emb.weight))
                    for name in ("performer.net.layers.0.0.fn.to_q.weight", "to_out.weight"):
                        self.assertFalse(torch.equal(built.get_parameter(name),
                                                     theirs.get_parameter(name)), name)
                    built.load_state_dict(ours.state_dict())
                    self.assertTrue(torch.equal(built(x), ours(x)))

    def check_redraws(self, model, what):
        """Projections change at the (interval+1)-th training call, and only then; never in
        eval mode; the new ones are orthogonal blocks of the right shape."""
        x = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(2))
        fas = attentions(model)
        self.assertTrue(fas, what)

        def snap():
            return [f.projection_matrix.clone() for f in fas]

        model.eval()
        w0 = snap()
        for _ in range(5):
            model(x)
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(snap(), w0)), f"{what}: eval")
        model.train()
        for _ in range(2):  # calls_since_last_redraw 0 -> 1 -> 2
            model(x).sum().backward()
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(snap(), w0)), f"{what}: early")
        model(x).sum().backward()  # 2 >= feature_redraw_interval: redrawn, then this call
        for f, a, b in zip(fas, snap(), w0):
            self.assertFalse(torch.equal(a, b), f"{what}: not redrawn")
            self.assertEqual(a.shape, b.shape)
            d = f.dim_heads
            blk = a[:d] / a[:d].norm(dim=1, keepdim=True)
            self.assertLess((blk @ blk.T - torch.eye(d)).abs().max().item(), 1e-5, what)

    def test_redraw_keeps_working(self):
        with pt.patch_performer_pytorch():
            patched = lm(True, feature_redraw_interval=2)
        self.check_redraws(patched, "built while patched, redrawn after the undo")
        self.check_redraws(pt.convert_performer_pytorch(lm(False, feature_redraw_interval=2)),
                           "converted")
        # modules replaced by hand: performer-pytorch's updater never finds them (the silent
        # failure); converted, they are found and redrawn
        hand = lm(True, feature_redraw_interval=2)
        for layer in hand.performer.net.layers:
            attn = layer[0].fn
            attn.fast_attention = pt.FastAttention(8, 16, causal=True)
        self.assertEqual(PP.find_modules(hand, PP.FastAttention), [])
        w = [f.projection_matrix.clone() for f in attentions(hand)]
        hand.train()
        for _ in range(4):
            hand(torch.zeros(1, 8, dtype=torch.long))
        self.assertTrue(all(torch.equal(a, f.projection_matrix)
                            for a, f in zip(w, attentions(hand))))
        hand = pt.convert_performer_pytorch(hand)
        self.assertEqual(len(PP.find_modules(hand, PP.FastAttention)), 2)
        for a, f in zip(w, attentions(hand)):
            self.assertTrue(torch.equal(a, f.projection_matrix))  # kept until a redraw
        hand.performer.proj_updater.calls_since_last_redraw.zero_()
        self.check_redraws(hand, "replaced by hand, then converted")

    def test_convert_shared_module_and_the_module_itself(self):
        torch.manual_seed(4)
        fa = PP.FastAttention(8, 16, causal=True)
        seq = torch.nn.ModuleList([fa, torch.nn.Linear(8, 8), fa])
        out = pt.convert_performer_pytorch(seq)
        self.assertIs(out, seq)
        self.assertIs(seq[0], seq[2])  # still one module, held twice
        self.assertIs(type(seq[0]), pt.PerformerPytorchFastAttention)
        self.assertTrue(torch.equal(seq[0].projection_matrix, fa.projection_matrix))
        one = pt.convert_performer_pytorch(fa)
        self.assertIsNot(one, fa)
        self.assertIs(type(one), pt.PerformerPytorchFastAttention)
        self.assertIs(pt.convert_performer_pytorch(one), one)  # nothing left to convert
        model = lm(True)
        state = torch.get_rng_state()
        pt.convert_performer_pytorch(model)
        self.assertTrue(torch.equal(torch.get_rng_state(), state))  # converting draws nothing

    def test_refusals(self):
        with pt.patch_performer_pytorch():
            with self.assertRaisesRegex(NotImplementedError, "no_projection"):
                lm(False, no_projection=True)
            with self.assertRaisesRegex(NotImplementedError, "Tanh"):
                lm(False, generalized_attention=True, kernel_fn=torch.nn.Tanh())
        for kw, text in ((dict(no_projection=True), "no_projection"),
                         (dict(generalized_attention=True, kernel_fn=torch.nn.Tanh()), "Tanh")):
            m = lm(False, **kw)
            before = attentions(m)
            with self.assertRaises(NotImplementedError) as cm:
                pt.convert_performer_pytorch(m)
            msg = str(cm.exception)
            self.assertIn("performer.net.layers.0.0.fn.fast_attention (FastAttention)", msg)
            self.assertIn(text, msg)
            self.assertIn("nothing was converted", msg)
            self.assertEqual([id(a) for a in attentions(m)], [id(a) for a in before])
            self.assertTrue(all(type(a) is PP.FastAttention for a in attentions(m)))
        with self.assertRaisesRegex(TypeError, "must be a torch.nn.Module, got dict"):
            pt.convert_performer_pytorch({})


class TestWithoutPerformerPytorch(unittest.TestCase):
    def test_import_error(self):
        """Without performer-pytorch both functions say what is missing; importing
        performer.torch never needs it."""
        saved = {k: sys.modules.get(k) for k in ("performer_pytorch",
                                                 "performer_pytorch.performer_pytorch")}
        try:
            for k in saved:
                sys.modules[k] = None  # import raises ImportError
            for fn in (pt.patch_performer_pytorch,
                       lambda: pt.convert_performer_pytorch(torch.nn.Linear(2, 2)),
                       lambda: pt.PerformerPytorchFastAttention):
                with self.assertRaises(ImportError) as cm:
                    fn()
                self.assertIn("performer-pytorch is not importable", str(cm.exception))
                self.assertIn("pip install performer-pytorch", str(cm.exception))
            with self.assertRaises(AttributeError):
                pt.no_such_name
        finally:
            for k, v in saved.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v


if __name__ == "__main__":
    unittest.main()
