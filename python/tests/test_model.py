"""performer.Model (a trained checkpoint's attention inputs, logits and losses) and
performer.attention_entropy.

Against independent references: layer 0's q, k, v and the whole model's logits recomputed in
float64 numpy from the tensors of the checkpoint, read here with json and numpy (the safetensors
layout: an 8-byte little-endian header length, a JSON header, the raw data); the checkpoint's own
metadata for the config; token losses against -log of the reference's softmax and closed forms;
a FAVOR+ model the tool trains here for causality and batching; attention_entropy against a
plain loop over rows in Python floats and against closed forms.
"""
import dataclasses
import json
import math
import os
import struct
import subprocess
import tempfile
import unittest

import numpy as np

import performer
from common import TOOL, normal, rng

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CKPT = os.path.join(ROOT, "data", "demo-kjv.safetensors")
VAL = os.path.join(ROOT, "data", "demo-kjv-val.txt")


def read_safetensors(path):
    """(tensors as float64 arrays by name, the __metadata__ dict)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        assert e["dtype"] == "F32", (name, e["dtype"])
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(data[a:b], "<f4").reshape(e["shape"]).astype(np.float64)
    return out, meta


def write_safetensors(path, tensors, meta=None):
    """A safetensors file of float32 tensors (and metadata strings)."""
    header, blobs, off = {}, [], 0
    if meta is not None:
        header["__metadata__"] = meta
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, "<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def text_tokens(B, T):
    with open(VAL, "rb") as f:
        text = f.read(B * T)
    return np.frombuffer(text, np.uint8).reshape(B, T).astype(np.int64)


def layer0_reference(t, tokens, H):
    """q, k, v (B,H,T,hd) of layer 0 in float64: token + learned position embeddings, LayerNorm
    (biased variance, eps 1e-5), the qkv projection x W^T + b, columns [q | k | v], each split
    into H heads of hd columns."""
    B, T = tokens.shape
    x = t["wte"][tokens] + t["wpe"][:T]
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    ln = (x - mu) / np.sqrt(var + 1e-5) * t["blocks.ln1.weight"][0] + t["blocks.ln1.bias"][0]
    qkv = ln @ t["blocks.attn.qkv.weight"][0].T + t["blocks.attn.qkv.bias"][0]
    C = x.shape[-1]
    return tuple(qkv[..., i * C:(i + 1) * C].reshape(B, T, H, C // H).transpose(0, 2, 1, 3)
                 for i in range(3))


def layernorm(x, w, b):
    """LayerNorm over the last axis: biased variance, eps 1e-5 (layers.c)."""
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w + b


def gelu_tanh(x):
    """GPT-2's GELU, the tanh approximation (layers.c)."""
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf(x):
    """The exact GELU, x Phi(x): not the model's, to show the reference tells them apart."""
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def model_reference(t, tokens, H, gelu=gelu_tanh):
    """The logits (B,T,256) in float64 of an exact-attention model with learned positions
    (model.c): token + position embeddings; per block, pre-norm causal softmax attention (scores
    q.k / sqrt(hd)), heads merged, output projection, residual, then pre-norm MLP (fc, GELU,
    proj), residual; a final LayerNorm; logits against the tied token embeddings."""
    B, T = tokens.shape
    x = t["wte"][tokens] + t["wpe"][:T]
    C = x.shape[-1]
    hd = C // H
    future = np.triu(np.ones((T, T), bool), 1)
    for l in range(t["blocks.ln1.weight"].shape[0]):
        ln = layernorm(x, t["blocks.ln1.weight"][l], t["blocks.ln1.bias"][l])
        qkv = ln @ t["blocks.attn.qkv.weight"][l].T + t["blocks.attn.qkv.bias"][l]
        q, k, v = (qkv[..., i * C:(i + 1) * C].reshape(B, T, H, hd).transpose(0, 2, 1, 3)
                   for i in range(3))
        s = np.where(future, -np.inf, q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd))
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        y = (p @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ t["blocks.attn.proj.weight"][l].T + t["blocks.attn.proj.bias"][l]
        ln = layernorm(x, t["blocks.ln2.weight"][l], t["blocks.ln2.bias"][l])
        h = gelu(ln @ t["blocks.mlp.fc.weight"][l].T + t["blocks.mlp.fc.bias"][l])
        x = x + h @ t["blocks.mlp.proj.weight"][l].T + t["blocks.mlp.proj.bias"][l]
    return layernorm(x, t["lnf.weight"], t["lnf.bias"]) @ t["wte"].T


def cross_entropy(z, targets):
    """-log p[target] with p the softmax of float64 logits z (..,256)."""
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return -np.log(np.take_along_axis(p, targets[..., None], axis=-1)[..., 0])


class TestModel(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tensors, cls.meta = read_safetensors(CKPT)
        cls.model = performer.Model(CKPT)

    @classmethod
    def tearDownClass(cls):
        cls.model.close()

    def test_config_is_the_checkpoints(self):
        c, meta = self.model.config, self.meta
        self.assertIsInstance(c, performer.ModelConfig)
        for key in ("context", "layers", "d_model", "heads", "features", "redraw", "seed"):
            self.assertEqual(getattr(c, key), int(meta["pf." + key]), key)
        for key in ("attention", "positions", "kernel"):
            self.assertEqual(getattr(c, key), meta["pf." + key], key)
        # the demo predates pf.w_seed and pf.window: w_seed reads as seed, window the default
        self.assertNotIn("pf.w_seed", meta)
        self.assertEqual(c.w_seed, c.seed)
        self.assertEqual(c.window, performer._lib.lib.pf_model_config_default().window)
        self.assertEqual(c.head_dim, c.d_model // c.heads)
        self.assertEqual(self.tensors["wpe"].shape, (c.context, c.d_model))
        self.assertEqual(self.tensors["blocks.attn.qkv.weight"].shape,
                         (c.layers, 3 * c.d_model, c.d_model))
        d = dataclasses.asdict(c)
        self.assertEqual(d["layers"], c.layers)
        with self.assertRaises(dataclasses.FrozenInstanceError):
            c.layers = 1

    def test_num_params_and_meta(self):
        self.assertEqual(self.model.num_params, sum(a.size for a in self.tensors.values()))
        self.assertEqual(self.model.meta("format"), self.meta["format"])
        self.assertEqual(self.model.meta("run.data"), self.meta["run.data"])
        self.assertIsNone(self.model.meta("no such key"))
        self.assertRaises(TypeError, self.model.meta, 1)

    def test_layer0_against_float64(self):
        """q, k, v of layer 0 within float32 rounding of the float64 recomputation: |error| <=
        1e-5 (1 + |ref|) (the largest seen is about 6e-7 (1 + |ref|), at |ref| up to 5.6)."""
        c = self.model.config
        tok = text_tokens(3, c.context)
        got = self.model.attention_inputs(tok, 0)
        want = layer0_reference(self.tensors, tok, c.heads)
        for name, g, w in zip("qkv", got, want):
            self.assertEqual(g.dtype, np.float32)
            self.assertEqual(g.shape, (3, c.heads, c.context, c.head_dim))
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=name)
        # the reference is sharp enough to tell the tensors apart: q is not k, positions matter
        self.assertGreater(np.abs(got[0] - want[1]).max(), 0.1)
        x = self.tensors["wpe"].copy()
        self.tensors["wpe"][:] = 0
        try:
            nopos = layer0_reference(self.tensors, tok, c.heads)
        finally:
            self.tensors["wpe"][:] = x
        self.assertGreater(np.abs(got[0] - nopos[0]).max(), 0.1)

    def test_bytes_and_token_dtypes(self):
        text = b"In the beginning God created the heaven and the earth."
        want = self.model.attention_inputs(np.frombuffer(text, np.uint8)[None].astype(np.int64), 1)
        for tokens in (text, bytearray(text), memoryview(text), [list(text)],
                       np.frombuffer(text, np.uint8)[None], np.array([list(text)], np.int16),
                       np.array([list(text)], np.uint64),
                       np.repeat(np.array([list(text)], np.int32), 2, axis=1)[:, ::2]):
            got = self.model.attention_inputs(tokens, 1)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)

    def test_later_layers(self):
        c = self.model.config
        tok = text_tokens(2, 100)
        first = self.model.attention_inputs(tok, 0)
        last = self.model.attention_inputs(tok, c.layers - 1)
        for a, b in zip(first, last):
            self.assertEqual(b.shape, (2, c.heads, 100, c.head_dim))
            self.assertTrue(np.isfinite(b).all())
            self.assertGreater(np.abs(a - b).max(), 0.1)
        # the last layer's heads attend: its rows are sharper than uniform ones, on average
        h = performer.attention_entropy(last[0], last[1])
        uniform = np.log(np.arange(1, 101)).mean()
        self.assertTrue(((h >= 0) & (h <= np.log(np.arange(1, 101)) + 1e-12)).all())
        self.assertLess(h.mean(), uniform)

    def test_logits_against_float64(self):
        """The whole model's logits within float32 rounding of the float64 recomputation:
        |error| <= 5e-5 (1 + |ref|) (the largest seen is about 4e-6 (1 + |ref|), 1.3e-5 absolute,
        at |ref| up to 18)."""
        m, c = self.model, self.model.config
        tok = text_tokens(2, 64)
        before = m.attention_inputs(tok, 1)
        got = m.logits(tok)
        self.assertEqual(got.dtype, np.float32)
        self.assertEqual(got.shape, (2, 64, 256))
        want = model_reference(self.tensors, tok, c.heads)
        tol = 5e-5 * (1 + np.abs(want))
        self.assertTrue((np.abs(got - want) <= tol).all(), np.abs(got - want).max())
        # sharp enough to tell the GELUs apart: the exact one (erf) misses by more
        erf = model_reference(self.tensors, tok, c.heads, gelu_erf)
        self.assertFalse((np.abs(got - erf) <= tol).all())
        # a trained model: the text's next bytes score well above chance (log 256 = 5.55)
        self.assertLess(cross_entropy(want[:, :-1], tok[:, 1:]).mean(), 3.0)
        # the forward left the model as it was: attention_inputs gives what it gave before
        for x, y in zip(m.attention_inputs(tok, 1), before):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(m.logits(tok), got)
        # a bytes object is one window; alone it gets what it gets in the batch, to rounding
        np.testing.assert_allclose(m.logits(bytes(tok[1].astype(np.uint8)))[0], got[1],
                                   rtol=1e-5, atol=1e-5)

    def test_token_losses(self):
        m, c = self.model, self.model.config
        tok = text_tokens(2, 64)
        want = model_reference(self.tensors, tok, c.heads)
        # the default: each position's next token, the last position left out
        got = m.token_losses(tok)
        self.assertEqual(got.dtype, np.float64)
        self.assertEqual(got.shape, (2, 63))
        np.testing.assert_allclose(got, cross_entropy(want[:, :-1], tok[:, 1:]), rtol=5e-5,
                                   atol=5e-5)
        # targets given: (B,T), each position's own; the shifted ones give the default's
        shifted = np.concatenate([tok[:, 1:], tok[:, :1]], axis=1)
        given = m.token_losses(tok, shifted)
        self.assertEqual(given.shape, (2, 64))
        np.testing.assert_allclose(given[:, :-1], got, rtol=1e-14, atol=0)
        np.testing.assert_allclose(given, cross_entropy(want, shifted), rtol=5e-5, atol=5e-5)
        text = b"In the beginning God created the heaven and the earth."
        np.testing.assert_allclose(m.token_losses(text, text.upper()),
                                   m.token_losses([list(text)], [list(text.upper())]),
                                   rtol=1e-14, atol=0)

    def test_token_losses_closed_forms(self):
        """One window scored against every byte: exp(-loss) sums to 1 over the 256 bytes (a
        softmax), each loss is >= 0, two bytes' losses differ by their logits' difference, and
        the smallest loss is the largest logit's. (One call per byte: calls of one shape give the
        same logits, bit for bit.)"""
        m = self.model
        tok = text_tokens(1, 16)
        loss = np.concatenate([m.token_losses(tok, np.full((1, 16), j)) for j in range(256)])
        z = m.logits(tok)[0].astype(np.float64)  # (16, 256); loss[j, t]: position t, byte j
        self.assertEqual(loss.shape, (256, 16))
        np.testing.assert_allclose(np.exp(-loss).sum(axis=0), 1.0, rtol=1e-12)
        self.assertTrue((loss >= 0).all())
        np.testing.assert_allclose(loss - loss[0], z[:, :1].T - z.T, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(loss.argmin(axis=0), z.argmax(axis=1))

    def test_bad_targets(self):
        m = self.model
        tok = text_tokens(2, 10)
        for targets in (tok[:1], tok[:, :9], np.concatenate([tok, tok], axis=1), b"0123456789"):
            self.assertRaisesRegex(ValueError, r"targets has shape .*: expected tokens' shape "
                                   r"\(2, 10\)", m.token_losses, tok, targets)
        bad = tok.copy()
        bad[1, 4] = 256
        self.assertRaisesRegex(ValueError, r"targets\[1, 4\] = 256 is not a byte",
                               m.token_losses, tok, bad)
        bad[1, 4] = -1  # pf_model_forward's "ignore this position" is not taken here
        self.assertRaisesRegex(ValueError, r"targets\[1, 4\] = -1 is not a byte",
                               m.token_losses, tok, bad)
        for targets in (tok.astype(np.float64), tok.astype(bool), [["a"] * 10] * 2):
            self.assertRaisesRegex(TypeError, "targets: dtype", m.token_losses, tok, targets)
        for targets in (tok[0], tok[None]):
            self.assertRaisesRegex(ValueError, r"targets has shape .*: expected \(B,T\)",
                                   m.token_losses, tok, targets)
        self.assertRaisesRegex(ValueError, "T >= 1", m.token_losses, tok, np.zeros((2, 0), int))
        # one token has no next one to score: the default needs T >= 2
        self.assertRaisesRegex(ValueError, r"T = 1: the next-token targets need T >= 2",
                               m.token_losses, b"a")
        self.assertEqual(m.token_losses(b"a", b"b").shape, (1, 1))

    def test_forward_refusal(self):
        """A batch too large for the forward's int offsets ((B T) 4C (L + 1) must fit an int:
        B T <= 838860 here) is refused by pf_model_forward, before it allocates anything, as
        performer.InvalidArgument naming it."""
        m, c = self.model, self.model.config
        B = (2**31 - 1) // 4 // c.d_model // (c.layers + 1) // c.context + 1
        tok = np.zeros((B, c.context), np.int32)
        for call in (m.logits, m.token_losses):
            with self.assertRaisesRegex(ValueError, "^pf_model_forward: ") as e:
                call(tok)
            self.assertIsInstance(e.exception, performer.InvalidArgument)
        self.assertEqual(m.logits(tok[:1]).shape, (1, c.context, 256))  # still usable

    def test_batch_gives_each_sequence_its_own(self):
        """Each window of a batch gets what it gets alone, to float rounding: not always bit for
        bit (at B = 7, T = 129 the projections' matrix products split the rows in blocks that
        fall elsewhere in each sequence, and differ in the last bits)."""
        c = self.model.config
        B, T = 7, 129
        tok = text_tokens(B, T)
        for layer in (0, c.layers - 1):
            batch = self.model.attention_inputs(tok, layer)
            for b in range(B):
                alone = self.model.attention_inputs(tok[b:b + 1], layer)
                for x, y in zip(batch, alone):
                    np.testing.assert_allclose(x[b], y[0], rtol=1e-5, atol=1e-5)
            # and causal: a prefix's inputs are the first rows of the whole window's
            pre = self.model.attention_inputs(tok[:, :50], layer)
            for x, y in zip(batch, pre):
                np.testing.assert_allclose(x[:, :, :50], y, rtol=1e-5, atol=1e-5)

    def test_bad_tokens(self):
        """attention_inputs, logits and token_losses check tokens alike."""
        m = self.model
        for name, call in (("attention_inputs", lambda x: m.attention_inputs(x, 0)),
                           ("logits", m.logits), ("token_losses", m.token_losses),
                           ("token_losses with targets", lambda x: m.token_losses(x, x))):
            with self.subTest(name):
                self.check_bad_tokens(call)

    def check_bad_tokens(self, call):
        c = self.model.config
        ok = text_tokens(1, 10)
        with self.assertRaisesRegex(ValueError, r"tokens\[0, 3\] = 256 is not a byte"):
            bad = ok.copy()
            bad[0, 3] = 256
            call(bad)
        bad = np.concatenate([ok, ok])
        bad[1, 0] = -1
        self.assertRaisesRegex(ValueError, r"tokens\[1, 0\] = -1 is not a byte", call, bad)
        bad = ok.copy()
        bad[0, 0] = 2**32 + 65  # not wrapped into a byte by the int32 conversion
        self.assertRaisesRegex(ValueError, "is not a byte", call, bad)
        with self.assertRaisesRegex(ValueError, f"context is {c.context}"):
            call(text_tokens(1, c.context + 1))
        for empty in (b"", np.zeros((1, 0), np.int32), np.zeros((0, 5), np.int32)):
            self.assertRaisesRegex(ValueError, "T >= 1", call, empty)
        for shape in ((10,), (1, 1, 10), ()):
            self.assertRaisesRegex(ValueError, r"expected \(B,T\)", call,
                                   np.zeros(shape, np.int32))
        for tokens in (ok.astype(np.float32), ok.astype(bool), [["a", "b"]], [[None, 1]],
                       ok.astype(np.complex64)):
            self.assertRaisesRegex(TypeError, "tokens: dtype", call, tokens)

    def test_bad_layer(self):
        m, L = self.model, self.model.config.layers
        for layer in (-1, L, L + 7):
            self.assertRaisesRegex(ValueError, rf"layer must be in \[0, {L - 1}\]",
                                   m.attention_inputs, b"abc", layer)
        for layer in ("0", 1.0, None, True):
            self.assertRaisesRegex(TypeError, "layer must be an integer", m.attention_inputs,
                                   b"abc", layer)
        np.testing.assert_array_equal(m.attention_inputs(b"abc", np.int64(L - 1))[0],
                                      m.attention_inputs(b"abc", L - 1)[0])

    def test_missing_and_malformed_files(self):
        with tempfile.TemporaryDirectory() as d:
            missing = os.path.join(d, "none.safetensors")
            with self.assertRaises(FileNotFoundError) as e:
                performer.Model(missing)
            self.assertIsInstance(e.exception, performer.LibraryIOError)
            self.assertIn(missing, str(e.exception))
            self.assertIn("No such file", str(e.exception))
            self.assertEqual(e.exception.function, "pf_model_load")
            # a folder: not readable as a file, but there is something there
            with self.assertRaises(performer.LibraryIOError) as e:
                performer.Model(d)
            self.assertNotIsInstance(e.exception, FileNotFoundError)
            self.assertIn("folder", str(e.exception))

            text = os.path.join(d, "text.safetensors")
            with open(text, "wb") as f:
                f.write(b"not a checkpoint at all, just some text\n")
            with open(CKPT, "rb") as f:
                whole = f.read()
            cut = os.path.join(d, "cut.safetensors")
            with open(cut, "wb") as f:
                f.write(whole[:len(whole) // 2])
            other = os.path.join(d, "other.safetensors")  # safetensors, not a model
            write_safetensors(other, {"x": np.zeros(3)}, {"format": "something else"})
            nometa = os.path.join(d, "nometa.safetensors")
            write_safetensors(nometa, {"x": np.zeros(3)})
            for path in (text, cut, other, nometa):
                with self.assertRaises(ValueError) as e:
                    performer.Model(path)
                self.assertIsInstance(e.exception, performer.FormatError, path)
                self.assertIn(path, str(e.exception))
                self.assertTrue(str(e.exception).startswith("pf_model_load: "), str(e.exception))
        self.assertRaises(TypeError, performer.Model, 3)

    def test_close(self):
        with performer.Model(CKPT) as m:
            q = m.attention_inputs(b"abc", 0)[0]
            self.assertEqual(q.shape[2], 3)
        for call in (lambda: m.attention_inputs(b"abc", 0), lambda: m.num_params,
                     lambda: m.meta("format"), lambda: m.logits(b"abc"),
                     lambda: m.token_losses(b"abc"), lambda: m.token_losses(b"abc", b"bcd")):
            self.assertRaisesRegex(ValueError, "this Model is closed", call)
        m.close()  # twice: harmless
        self.assertEqual(m.config.layers, self.model.config.layers)  # still readable


class TestFavorModel(unittest.TestCase):
    """Logits of a small FAVOR+ model the tool trains here (2 steps: the weights are barely
    trained, which the properties below do not need)."""

    @classmethod
    def setUpClass(cls):
        if not TOOL or not os.access(TOOL, os.X_OK):
            raise unittest.SkipTest("PERFORMER (the tool's path) is not set")
        cls.dir = tempfile.TemporaryDirectory(prefix="pf_py_favor_")
        data = os.path.join(cls.dir.name, "text.txt")
        with open(VAL, "rb") as f, open(data, "wb") as g:
            g.write(f.read(8000))
        out = os.path.join(cls.dir.name, "run")
        r = subprocess.run([TOOL, "train", "--out", out, "--data", data, "--format", "text",
                            "--attention", "favor", "--features", "16", "--layers", "1",
                            "--d-model", "32", "--heads", "2", "--context", "32", "--batch", "2",
                            "--steps", "2", "--eval-every", "2", "--eval-batches", "1",
                            "--threads", "1", "--no-plot"], capture_output=True, text=True)
        if r.returncode != 0:
            cls.dir.cleanup()
            raise RuntimeError(f"performer train failed ({r.returncode}): {r.stderr}")
        cls.model = performer.Model(os.path.join(out, "checkpoint.safetensors"))

    @classmethod
    def tearDownClass(cls):
        cls.model.close()
        cls.dir.cleanup()

    def test_config(self):
        c = self.model.config
        self.assertEqual((c.attention, c.kernel, c.features, c.layers, c.d_model, c.heads,
                          c.context), ("favor", "positive", 16, 1, 32, 2, 32))

    def test_logits(self):
        m = self.model
        B, T = 5, 32
        tok = text_tokens(B, T)
        z = m.logits(tok)
        self.assertEqual((z.dtype, z.shape), (np.float32, (B, T, 256)))
        self.assertTrue(np.isfinite(z).all())
        self.assertGreater(z.std(axis=-1).min(), 0)  # not a constant row
        # evaluation mode keeps W: the same call gives the same bits
        np.testing.assert_array_equal(m.logits(tok), z)
        # each window of a batch gets what it gets alone, to float rounding
        for b in range(B):
            np.testing.assert_allclose(m.logits(tok[b:b + 1])[0], z[b], rtol=1e-5, atol=1e-5)
        # causal: changing the last token leaves every earlier position's logits as they were,
        # and a prefix's logits are the first rows of the whole window's
        other = tok.copy()
        other[:, -1] = (other[:, -1] + 1) % 256
        w = m.logits(other)
        np.testing.assert_array_equal(w[:, :-1], z[:, :-1])
        self.assertGreater(np.abs(w[:, -1] - z[:, -1]).max(), 1e-6)
        np.testing.assert_allclose(m.logits(tok[:, :20]), z[:, :20], rtol=1e-5, atol=1e-5)
        # and the losses are those of these logits
        np.testing.assert_allclose(m.token_losses(tok), cross_entropy(
            z[:, :-1].astype(np.float64), tok[:, 1:]), rtol=1e-12, atol=1e-12)
        q = m.attention_inputs(tok, 0)[0]  # still works after the forwards
        self.assertEqual(q.shape, (B, 2, T, 16))


def naive_entropy(q, k, causal, scale):
    """Row by row in Python floats: -sum p log p of the softmax of scale * q_i.k_j."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    lead = q.shape[:-2]
    Lq, Lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    s = (1 / math.sqrt(d)) if scale is None else scale
    out = np.empty(lead + (Lq,))
    for idx in np.ndindex(*lead):
        for i in range(Lq):
            seen = range(i + 1) if causal else range(Lk)
            x = [s * float(np.dot(q[idx + (i,)], k[idx + (j,)])) for j in seen]
            top = max(x)
            w = [math.exp(v - top) for v in x]
            z = sum(w)
            out[idx + (i,)] = -sum(p / z * math.log(p / z) for p in w if p > 0)
    return out


class TestAttentionEntropy(unittest.TestCase):

    def test_against_loop(self):
        r = rng(3)
        for shape_q, shape_k, causal, scale in (((2, 3, 9, 5), (2, 3, 9, 5), True, None),
                                                ((2, 3, 9, 5), (2, 3, 9, 5), False, None),
                                                ((4, 7, 6), (4, 11, 6), False, 0.3),
                                                ((12, 4), (12, 4), True, 2.0)):
            q, k = normal(r, shape_q, 1.5), normal(r, shape_k, 1.5)
            got = performer.attention_entropy(q, k, causal=causal, scale=scale)
            self.assertEqual(got.shape, shape_q[:-1])
            self.assertEqual(got.dtype, np.float64)
            np.testing.assert_allclose(got, naive_entropy(q, k, causal, scale), rtol=1e-12,
                                       atol=1e-13)
            # float32 input is widened exactly: the float64 copy gives the same bits
            np.testing.assert_array_equal(
                got, performer.attention_entropy(q.astype(np.float64), k, causal=causal,
                                                 scale=scale))

    def test_model_rows_against_loop(self):
        with performer.Model(CKPT) as m:
            q, k, _ = m.attention_inputs(text_tokens(1, 40), 2)
        np.testing.assert_allclose(performer.attention_entropy(q, k),
                                   naive_entropy(q, k, True, None), rtol=1e-12, atol=1e-13)

    def test_closed_forms(self):
        L, d = 20, 8
        q, k = np.zeros((2, L, d)), normal(rng(1), (2, L, d))  # every score 0: uniform rows
        np.testing.assert_allclose(performer.attention_entropy(q, k),
                                   np.broadcast_to(np.log(np.arange(1, L + 1)), (2, L)),
                                   rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(performer.attention_entropy(q, k, causal=False),
                                   np.full((2, L), np.log(L)), rtol=1e-14)
        # one key takes (almost) all the weight: row i scores it 50 and i others 0, so
        # H = log(1 + i e^-50) + 50 i e^-50 / (1 + i e^-50) < 51 i e^-50 < 1e-18; row 0 sees one
        # key alone: exactly 0
        q = np.zeros((L, d))
        q[:, 0] = 50.0
        k = np.zeros((L, d))
        k[0, 0] = 1.0
        h = performer.attention_entropy(q, k, scale=1.0)
        self.assertEqual(h[0], 0.0)
        self.assertTrue((h >= 0).all() and (h < 1e-18).all(), h)
        # two equal dominant keys (0 and 5): log 2 from row 5 on, to 1e-18 as above
        k[5, 0] = 1.0
        h = performer.attention_entropy(q, k, scale=1.0)
        np.testing.assert_allclose(h[5:], np.log(2), rtol=1e-12)

    def test_blocks_of_rows(self):
        """Long rows go a block of rows at a time: the result is that of the whole matrix."""
        r = rng(7)
        L, d = 2100, 4  # blocks of 998 rows: three, the last short
        q, k = normal(r, (L, d)), normal(r, (L, d))
        x = (q.astype(np.float64) @ k.astype(np.float64).T) / 2.0
        x[np.triu_indices(L, 1)] = -np.inf
        p = np.exp(x - x.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        want = -np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0).sum(axis=1)
        np.testing.assert_allclose(performer.attention_entropy(q, k), want, rtol=1e-10,
                                   atol=1e-12)

    def test_errors(self):
        r = rng(2)
        q, k = normal(r, (2, 6, 4)), normal(r, (2, 6, 4))
        E = performer.attention_entropy
        self.assertRaisesRegex(ValueError, "causal attention needs as many queries as keys",
                               E, q, k[:, :5])
        E(q, k[:, :5], causal=False)  # bidirectional: fine
        self.assertRaisesRegex(ValueError, r"\(L,d\), \(H,L,d\) or \(B,H,L,d\)", E, q, k[0])
        self.assertRaisesRegex(ValueError, r"\(L,d\), \(H,L,d\) or \(B,H,L,d\)", E, q[0, 0],
                               k[0, 0])
        self.assertRaisesRegex(ValueError, r"\(L,d\), \(H,L,d\) or \(B,H,L,d\)",
                               E, q[None, None], k[None, None])
        self.assertRaisesRegex(ValueError, "width d", E, q, k[..., :3])
        self.assertRaisesRegex(ValueError, "leading dimensions", E, q, np.concatenate([k, k]))
        self.assertRaisesRegex(ValueError, "non-empty", E, q[:, :0], k[:, :0])
        self.assertRaisesRegex(ValueError, "non-empty", E, q[..., :0], k[..., :0])
        for bad in (q.astype(np.complex64), q.astype(bool), q.astype(object), q.astype(str)):
            self.assertRaisesRegex(TypeError, "q: dtype", E, bad, k)
        self.assertRaisesRegex(TypeError, "k: dtype", E, q, k.astype(np.complex128))
        for scale in (0.0, -1.0, float("nan"), float("inf")):
            self.assertRaisesRegex(ValueError, "scale must be a positive finite number", E, q, k,
                                   scale=scale)
        self.assertRaisesRegex(TypeError, "scale must be a number", E, q, k, scale="1")
        bad = k.copy()
        bad[1, 2, 3] = np.nan
        with self.assertRaisesRegex(FloatingPointError, r"k holds nan at index \(1, 2, 3\)") as e:
            E(q, bad)
        self.assertIsInstance(e.exception, performer.NonFinite)
        big = np.full((3, 2), 1e200)
        self.assertRaisesRegex(FloatingPointError, "overflows float64", E, big, big)


if __name__ == "__main__":
    unittest.main()
