"""performer.Model (a trained checkpoint's attention inputs) and performer.attention_entropy.

Against independent references: layer 0's q, k, v recomputed in float64 numpy from the tensors of
the checkpoint, read here with json and numpy (the safetensors layout: an 8-byte little-endian
header length, a JSON header, the raw data); the checkpoint's own metadata for the config;
attention_entropy against a plain loop over rows in Python floats and against closed forms.
"""
import dataclasses
import json
import math
import os
import struct
import tempfile
import unittest

import numpy as np

import performer
from common import normal, rng

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
        m, c = self.model, self.model.config
        ok = text_tokens(1, 10)
        with self.assertRaisesRegex(ValueError, r"tokens\[0, 3\] = 256 is not a byte"):
            bad = ok.copy()
            bad[0, 3] = 256
            m.attention_inputs(bad, 0)
        bad = np.concatenate([ok, ok])
        bad[1, 0] = -1
        self.assertRaisesRegex(ValueError, r"tokens\[1, 0\] = -1 is not a byte",
                               m.attention_inputs, bad, 0)
        bad = ok.copy()
        bad[0, 0] = 2**32 + 65  # not wrapped into a byte by the int32 conversion
        self.assertRaisesRegex(ValueError, "is not a byte", m.attention_inputs, bad, 0)
        with self.assertRaisesRegex(ValueError, f"context is {c.context}"):
            m.attention_inputs(text_tokens(1, c.context + 1), 0)
        for empty in (b"", np.zeros((1, 0), np.int32), np.zeros((0, 5), np.int32)):
            self.assertRaisesRegex(ValueError, "T >= 1", m.attention_inputs, empty, 0)
        for shape in ((10,), (1, 1, 10), ()):
            self.assertRaisesRegex(ValueError, r"expected \(B,T\)", m.attention_inputs,
                                   np.zeros(shape, np.int32), 0)
        for tokens in (ok.astype(np.float32), ok.astype(bool), [["a", "b"]], [[None, 1]],
                       ok.astype(np.complex64)):
            self.assertRaisesRegex(TypeError, "tokens: dtype", m.attention_inputs, tokens, 0)

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
                     lambda: m.meta("format")):
            self.assertRaisesRegex(ValueError, "this Model is closed", call)
        m.close()  # twice: harmless
        self.assertEqual(m.config.layers, self.model.config.layers)  # still readable


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
