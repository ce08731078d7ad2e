"""performer.mqar_batch: the structure every MQAR sequence must have (checked position by
position here, not by the library), sequences that depend on (seed, stream, b) alone, and the
refused arguments."""
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import performer  # noqa: E402


def check_sequence(tc, tok, tgt, pairs, queries, keys):
    """Asserts the layout of pf_mqar_batch's header comment on one sequence."""
    T = len(tok)
    k, v = tok[0:2 * pairs:2], tok[1:2 * pairs:2]
    tc.assertTrue(((k >= 0) & (k < keys)).all(), "keys in [0, K)")
    tc.assertTrue(((v >= keys) & (v < 2 * keys)).all(), "values in [K, 2K)")
    tc.assertEqual(len(set(k.tolist())), pairs, "the keys of a sequence are distinct")
    tc.assertEqual(len(set(v.tolist())), pairs, "and so are its values")
    value_of = dict(zip(k.tolist(), v.tolist()))
    tc.assertTrue((tgt[:2 * pairs] == -1).all(), "the pairs themselves are not scored")
    asked = []
    for t in range(2 * pairs, T):
        if tgt[t] == -1:
            tc.assertGreaterEqual(int(tok[t]), 2 * keys, f"filler at {t} is no key or value")
            tc.assertLess(int(tok[t]), 256)
        else:
            tc.assertEqual((t - 2 * pairs) % 2, 0, "queries sit at even offsets after the pairs")
            tc.assertIn(int(tok[t]), value_of, f"the token at query {t} is a key of the pairs")
            tc.assertEqual(int(tgt[t]), value_of[int(tok[t])], "its target is that key's value")
            asked.append(int(tok[t]))
    tc.assertEqual(len(asked), queries)
    # every `pairs` queries ask a fresh permutation of the keys: each key is asked
    # floor(Q/N) or ceil(Q/N) times, and Q <= N asks Q different keys
    counts = [asked.count(key) for key in value_of]
    tc.assertTrue(all(queries // pairs <= c <= -(-queries // pairs) for c in counts), counts)

class TestMqarBatch(unittest.TestCase):
    def test_structure(self):
        for pairs, queries, keys, T in ((1, 1, 1, 4), (4, 4, 64, 32), (4, 16, 64, 64),
                                        (8, 3, 10, 64), (16, 64, 64, 256), (127, 127, 127, 508)):
            tok, tgt = performer.mqar_batch(6, T, pairs=pairs, queries=queries, keys=keys,
                                            seed=11, stream=2)
            self.assertEqual((tok.shape, tok.dtype, tgt.shape, tgt.dtype),
                             ((6, T), np.int32, (6, T), np.int32))
            for b in range(6):
                check_sequence(self, tok[b], tgt[b], pairs, queries, keys)

    def test_queries_default_to_pairs(self):
        tok, tgt = performer.mqar_batch(3, 40, pairs=5, keys=20, seed=1)
        self.assertEqual(((tgt != -1).sum(axis=1)).tolist(), [5, 5, 5])

    def test_queries_reach_far(self):
        """The query slots are drawn with weights 1/(g+1) over the whole window: over many
        sequences some answers lie in the last quarter of a long window."""
        tok, tgt = performer.mqar_batch(64, 1024, pairs=8, queries=64, seed=5)
        pos = np.nonzero(tgt != -1)[1]
        self.assertGreater(int((pos >= 768).sum()), 0)
        self.assertGreater(int((pos < 256).sum()), int((pos >= 768).sum()))

    def test_a_function_of_seed_stream_and_index(self):
        a = performer.mqar_batch(5, 64, pairs=4, queries=8, seed=7, stream=3)
        b = performer.mqar_batch(2, 64, pairs=4, queries=8, seed=7, stream=3)
        self.assertTrue((a[0][:2] == b[0]).all() and (a[1][:2] == b[1]).all())
        c = performer.mqar_batch(5, 64, pairs=4, queries=8, seed=7, stream=3)
        self.assertTrue((a[0] == c[0]).all() and (a[1] == c[1]).all())
        for other in (dict(seed=8, stream=3), dict(seed=7, stream=4)):
            d = performer.mqar_batch(5, 64, pairs=4, queries=8, **other)
            self.assertFalse((a[0] == d[0]).all(), f"{other} gave the same tokens")
        # the streams `performer train` uses: 2^63 + i for validation batches
        e = performer.mqar_batch(1, 64, pairs=4, seed=1, stream=2**63 + 7)
        self.assertEqual(e[0].shape, (1, 64))

    def test_refused(self):
        bad = [dict(pairs=0), dict(pairs=-3), dict(keys=0), dict(pairs=65, keys=64), dict(keys=128, pairs=8),
               dict(queries=0), dict(pairs=8, queries=9, context=33)]
        for kw in bad:
            T = kw.pop("context", 64)
            with self.assertRaises(performer.InvalidArgument, msg=str(kw)):
                performer.mqar_batch(2, T, **kw)
        # the smallest context that fits 8 pairs and 8 queries is 32
        performer.mqar_batch(1, 32, pairs=8)
        with self.assertRaises(performer.InvalidArgument):
            performer.mqar_batch(1, 31, pairs=8)
        for kw, err in ((dict(batch=0), ValueError), (dict(batch=2.0), TypeError),
                        (dict(seed=-1), ValueError), (dict(stream=2**64), ValueError),
                        (dict(batch=True), TypeError)):
            args = dict(batch=2, context=64)
            args.update(kw)
            with self.assertRaises(err, msg=str(kw)):
                performer.mqar_batch(args.pop("batch"), args.pop("context"), **args)


if __name__ == "__main__":
    unittest.main()
