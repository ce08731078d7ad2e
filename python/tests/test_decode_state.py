"""DecodeState serving a model: prefill, many sequences, branching and snapshots.

Against independent references: a one-sequence state stepped token by token (the rows of every
sequence of a many-sequence state must have its bits), the causal attention() (prefill within
float rounding of it), and the state's own earlier rows (a restored snapshot repeats them).
"""
import os
import tempfile
import unittest

import numpy as np

import performer
from common import normal, rng, same_bits


def tokens(seed, H, L, d):
    r = rng(seed)
    return (normal(r, (H, L, d), 0.7) for _ in range(3))


class TestDecodeState(unittest.TestCase):
    H, d, m = 4, 16, 32

    def setUp(self):
        self.W = performer.projection(self.m, self.d, seed=5)

    def state(self, **kw):
        return performer.DecodeState(self.H, self.d, self.d, self.W, chunk=16, **kw)

    def test_prefill_then_decode(self):
        H, L = self.H, 60
        q, k, v = tokens(1, H, L, self.d)
        full = performer.attention(q, k, v, W=self.W, causal=True, chunk=16)
        with self.state() as st:
            a = st.prefill(q[:, :37], k[:, :37], v[:, :37])
            self.assertEqual(st.position, 37)
            b = np.stack([st.step(q[:, t], k[:, t], v[:, t]) for t in range(37, L)], axis=1)
            got = np.concatenate([a, b], axis=1)
            self.assertLess(np.abs(got - full).max() / np.abs(full).max(), 1e-5)
            # prefills cut at multiples of the chunk: the bits of one
            st.reset()
            c = np.concatenate([st.prefill(q[:, :32], k[:, :32], v[:, :32]),
                                st.prefill(q[:, 32:37], k[:, 32:37], v[:, 32:37])], axis=1)
            self.assertTrue(same_bits(c, a))
            self.assertRaises(ValueError, st.prefill, q[:, :0], k[:, :0], v[:, :0])
            self.assertRaises(ValueError, st.prefill, q, k, v[:, :3])
            self.assertRaises(ValueError, st.prefill, q[:, :3], k[:, :3], v[:, :3], seq=1)

    def test_many_sequences(self):
        H, L, N = self.H, 10, 5
        seqs = [tuple(tokens(10 + s, H, L, self.d)) for s in range(N)]
        ref = []
        for q, k, v in seqs:  # each alone, token by token
            with self.state() as one:
                ref.append(np.stack([one.step(q[:, t], k[:, t], v[:, t]) for t in range(L)]))
        with self.state(sequences=N) as st:
            self.assertEqual(st.positions, [0] * N)
            pos = [0] * N
            for rnd in range(2 * L):
                pick = [s for s in reversed(range(N)) if (s + rnd) % 2 == 0 and pos[s] < L]
                if not pick:
                    continue
                q = np.stack([seqs[s][0][:, pos[s]] for s in pick])
                k = np.stack([seqs[s][1][:, pos[s]] for s in pick])
                v = np.stack([seqs[s][2][:, pos[s]] for s in pick])
                out, status = st.step_many(q, k, v, seqs=pick)
                self.assertEqual(status.tolist(), [0] * len(pick))
                for i, s in enumerate(pick):
                    self.assertTrue(same_bits(out[i], ref[s][pos[s]]), (rnd, s))
                    pos[s] += 1
            self.assertEqual(st.positions, pos)
            # a NaN in one sequence fails it alone
            q = np.stack([seqs[s][0][:, 0] for s in (0, 1)])
            k = np.stack([seqs[s][1][:, 0] for s in (0, 1)])
            v = np.stack([seqs[s][2][:, 0] for s in (0, 1)])
            k[1, 0, 0] = np.nan
            before = st.positions
            out, status = st.step_many(q, k, v, seqs=[0, 1])
            self.assertEqual([performer.STATUS_NAMES[s] for s in status],
                             ["PF_OK", "PF_ENONFINITE"])
            self.assertEqual(st.positions[1], before[1])
            self.assertEqual(st.positions[0], before[0] + 1)
            self.assertTrue(np.all(out[1] == 0))
            # copy and reset
            st.copy(3, 0)
            self.assertEqual(st.positions[3], st.positions[0])
            st.reset(2)
            self.assertEqual(st.positions[2], 0)
            for bad in ([0, 0], [0, N], [-1, 0], [0.5, 1]):
                self.assertRaises(ValueError, st.step_many, q, k, v, seqs=bad)
            self.assertRaises(ValueError, st.step_many, q[:0], k[:0], v[:0])
            self.assertRaises(ValueError, st.copy, 0, N)
            self.assertRaises(ValueError, st.reset, N)
            self.assertRaises(TypeError, st.reset, "1")

    def test_snapshots(self):
        H, L = self.H, 30
        q, k, v = tokens(3, H, L, self.d)
        with self.state(sequences=2) as st, tempfile.TemporaryDirectory() as tmp:
            st.prefill(q[:, :11], k[:, :11], v[:, :11])
            st.step(q[:, 11], k[:, 11], v[:, 11])        # (an update pending at the save)
            snap = st.save()
            first = st.step(q[:, 12], k[:, 12], v[:, 12])
            st.load(snap)                                 # rollback
            self.assertEqual(st.position, 12)
            self.assertTrue(same_bits(st.step(q[:, 12], k[:, 12], v[:, 12]), first))
            st.load(snap, seq=1)                          # onto another sequence
            out, _ = st.step_many(q[None, :, 12], k[None, :, 12], v[None, :, 12], seqs=[1])
            self.assertTrue(same_bits(out[0], first))
            path = os.path.join(tmp, "s.pfstate")
            st.save_file(path, seq=1)
            with self.state() as other:                   # another process would do the same
                other.load_file(path)
                self.assertEqual(other.position, 13)
            # refused, the sequence unchanged
            before = st.positions
            self.assertRaises(ValueError, st.load, snap[:-1])
            bad = bytearray(snap)
            bad[len(bad) // 2] ^= 0x40
            with self.assertRaisesRegex(ValueError, "CRC"):
                st.load(bytes(bad))
            with self.assertRaises(ValueError):
                st.load("not bytes")
            W2 = self.W.copy()
            W2[0, 0] = np.nextafter(W2[0, 0], np.float32(1))
            with performer.DecodeState(H, self.d, self.d, W2, chunk=16) as other:
                with self.assertRaisesRegex(ValueError, "another W"):
                    other.load(snap)
                self.assertEqual(other.position, 0)
            with performer.DecodeState(H, self.d, self.d, self.W, kernel="relu") as other:
                self.assertRaisesRegex(ValueError, "feature map|another W", other.load, snap)
            with performer.DecodeState(H + 1, self.d, self.d,
                                       performer.projection(self.m, self.d, seed=5)) as other:
                self.assertRaisesRegex(ValueError, "H=", other.load, snap)
            self.assertEqual(st.positions, before)
            with open(path, "r+b") as f:
                f.truncate(100)
            with self.assertRaisesRegex(ValueError, "truncated"):
                st.load_file(path)
            self.assertRaises(OSError, st.load_file, tmp)                # a folder
            self.assertRaises(OSError, st.save_file, os.path.join(tmp, "no", "x"))
            self.assertEqual(st.positions, before)



class TestHalfSteps(unittest.TestCase):
    def test_float16_steps(self):
        """float16 q, k, v: pf_favor_state_step_dt, a float16 out with the bits of the float32
        step on the same (exactly widened) values, rounded once; the state stays float32."""
        g = np.random.default_rng(21)
        W = performer.projection(32, 16, seed=2)
        a = performer.DecodeState(heads=2, d=16, dv=8, W=W)
        b = performer.DecodeState(heads=2, d=16, dv=8, W=W)
        for t in range(30):
            n = 4 if t % 9 == 4 else 1
            shape = (2, 16) if n == 1 else (2, n, 16)
            vshape = (2, 8) if n == 1 else (2, n, 8)
            q, k = ((g.normal(size=shape) * 0.5).astype(np.float16) for _ in range(2))
            v = g.normal(size=vshape).astype(np.float16)
            o = b.step(q, k, v)
            r = a.step(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32))
            self.assertEqual(o.dtype, np.float16)
            self.assertTrue((o.view(np.uint16) == r.astype(np.float16).view(np.uint16)).all(), t)
        self.assertEqual(a.position, b.position)
        bad = np.full((2, 16), np.nan, np.float16)
        with self.assertRaises(FloatingPointError):
            b.step(bad, bad, np.zeros((2, 8), np.float16))

if __name__ == "__main__":
    unittest.main()
