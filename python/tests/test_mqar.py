"""performer.mqar_batch: the structure every MQAR sequence must have (checked position by
position here, not by the library), sequences that depend on (seed, stream, b) alone, and the
refused arguments."""
import csv
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import performer  # noqa: E402
from common import ASAN, TOOL  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "bench", "cuda", "mqar_gpu.py")
try:
    import torch  # noqa: F401
    HAS_TORCH = True
except ImportError:
    HAS_TORCH = False


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


@unittest.skipUnless(HAS_TORCH, "no torch (python3-torch): bench/cuda/mqar_gpu.py needs it")
class TestMqarGpuScript(unittest.TestCase):
    """bench/cuda/mqar_gpu.py, the recall sweep of the GPU machine, on the CPU: its torch forms
    of FAVOR++, elu + 1 and exact attention against the library's C kernels, and a sweep of a
    few steps through its coordinator (the CSV it writes, the runs it stops at the deadline)."""

    def run_script(self, *args, timeout=300):
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                              env=env, timeout=timeout, cwd=REPO)

    def test_maps_match_the_library(self):
        r = self.run_script("--check", "--device", "cpu")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        errs = [float(ln.split()[-1]) for ln in r.stdout.splitlines()
                if "relative error" in ln and ln.strip().startswith("check")]
        self.assertEqual(len(errs), 15)  # 5 attentions x 3 shapes
        self.assertLess(max(errs), 1e-5)

    @unittest.skipIf(ASAN, "minutes under ASan, nothing the check above does not reach")
    def test_a_small_sweep(self):
        with tempfile.TemporaryDirectory() as d:
            out, curves = os.path.join(d, "runs.csv"), os.path.join(d, "c", "curves.csv")
            r = self.run_script("--device", "cpu", "--add", "32", "2", "exact", "0",
                                "--add", "32", "2", "favor", "8,16", "--add", "32", "2",
                                "favorpp", "8", "--add", "32", "2", "elu", "0", "--seeds", "1",
                                "2", "--steps", "4", "--tokens", "128", "--eval-every", "2",
                                "--eval-batches", "1", "--workers", "2", "--out", out,
                                "--curves", curves)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(out) as f:
                rows = list(csv.DictReader(f))
            self.assertEqual(len(rows), 10)
            self.assertEqual({(x["attention"], x["m"], x["seed"]) for x in rows},
                             {(a, m, s) for a, m in (("exact", "0"), ("favor", "8"),
                                                     ("favor", "16"), ("favorpp", "8"),
                                                     ("elu", "0")) for s in ("1", "2")})
            for x in rows:
                self.assertEqual((x["complete"], x["steps"]), ("1", "4"))
                self.assertTrue(0 <= float(x["best_answer_acc"]) <= 1)
                self.assertGreaterEqual(float(x["best_answer_acc"]),
                                        float(x["final_answer_acc"]))
            with open(curves) as f:
                self.assertEqual(len(list(csv.DictReader(f))), 10 * 3)  # steps 0, 2, 4
            self.assertFalse(os.path.exists(out + ".partial"))
            # a deadline that stops the first run: its row says so, the two runs never started
            # have none, and the exit is still 0
            r = self.run_script("--device", "cpu", "--add", "32", "2", "favor", "8",
                                "--steps", "100000", "--tokens", "128", "--workers", "1",
                                "--deadline", "3", "--out", out)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(out) as f:
                rows = list(csv.DictReader(f))
            self.assertEqual([(x["complete"], x["attention"], x["seed"]) for x in rows],
                             [("0", "favor", "1")])
            self.assertIn("1 stopped at the deadline, 2 not started", r.stdout)

    @unittest.skipIf(ASAN, "a training run under ASan: slow, and nothing new for it to see")
    def test_a_failed_run_replaces_nothing(self):
        """A run that goes non-finite (lr 1e30) fails the sweep (exit 1), and the CSV that
        was there before is left as it was; the sweep's rows go to PATH.partial."""
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "runs.csv")
            with open(out, "w") as f:
                f.write("an earlier sweep\n")
            r = self.run_script("--device", "cpu", "--add", "32", "2", "favor", "8", "--seeds",
                                "1", "--steps", "6", "--tokens", "128", "--eval-every", "2",
                                "--lr", "1e30", "--out", out)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertRegex(r.stdout, "non-finite|not finite")
            with open(out) as f:
                self.assertEqual(f.read(), "an earlier sweep\n")
            with open(out + ".partial") as f:
                rows = list(csv.DictReader(f))
            self.assertEqual([x["complete"] for x in rows], ["0"])

    def test_refused_arguments(self):
        for args in (["--add", "32", "2", "softmax", "0", "--out", "x.csv"],
                     ["--add", "32", "2", "favor", "0", "--out", "x.csv"],
                     ["--steps", "0", "--out", "x.csv"], ["--device", "cpu"],
                     ["--out", REPO], ["--out", "x.csv", "--curves", "./x.csv"]):
            r = self.run_script(*args)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn("error", r.stderr)


PLOT = os.path.join(REPO, "scripts", "plot_mqar.py")


def scale_qk(path, factor):
    """Multiplies the query and key weights of every layer of a checkpoint by factor, in place
    (same shapes, so the safetensors header stands): a model 3 steps old has scores near 0,
    where a wrong scale or a wrong key would not show."""
    with open(path, "rb") as f:
        b = bytearray(f.read())
    n = int.from_bytes(b[:8], "little")
    head = json.loads(b[8:8 + n])
    t = head["blocks.attn.qkv.weight"]
    lo, hi = (8 + n + o for o in t["data_offsets"])
    w = np.frombuffer(bytes(b[lo:hi]), np.float32).reshape(t["shape"]).copy()
    d = t["shape"][1] // 3
    w[:, :2 * d] *= factor                          # rows: q, then k, then v
    b[lo:hi] = w.tobytes()
    with open(path, "wb") as f:
        f.write(b)


@unittest.skipUnless(TOOL, "PERFORMER (the tool) not set: these tests train a model with it")
class TestSharpness(unittest.TestCase):
    """scripts/plot_mqar.py --sharpness on two tiny trained models (exact and FAVOR+ m 8, 3
    steps at length 16, their q and k weights then scaled by 4): each table entry against a
    float64 loop over the answer positions written here, rows in the order length, pairs,
    attention, m (a number), seed, layer; a checkpoint outside the sweep's folder layout
    refused."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.cks = []
        os.mkdir(os.path.join(cls.tmp.name, "L16-p2"))
        for run, flags in (("favor-m8-s2", ["--attention", "favor", "--features", "8"]),
                           ("exact-m0-s2", ["--attention", "exact"])):
            d = os.path.join(cls.tmp.name, "L16-p2", run)
            r = subprocess.run([TOOL, "train", "--out", d, "--task", "mqar", "--mqar-pairs", "2",
                                "--mqar-queries", "4", "--mqar-keys", "64", "--context", "16",
                                "--layers", "2", "--d-model", "16", "--heads", "1", "--batch",
                                "4", "--steps", "3", "--lr", "3e-2", "--seed", "2",
                                "--eval-batches", "1", "--no-plot"], capture_output=True,
                               text=True, timeout=300)
            assert r.returncode == 0, r.stdout + r.stderr
            cls.cks.append(os.path.join(d, "checkpoint.safetensors"))
            scale_qk(cls.cks[-1], 4.0)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def sharpness(self, *paths):
        out = os.path.join(self.tmp.name, "sharp.md")
        if os.path.exists(out):
            os.remove(out)
        r = subprocess.run([sys.executable, PLOT, "--out", out, "--sharpness", *paths],
                           capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "python")))
        return r, out

    def test_against_a_loop(self):
        r, out = self.sharpness(*self.cks)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(out) as f:
            rows = [[c.strip() for c in ln.strip().strip("|").split("|")]
                    for ln in f if ln.startswith("| 16 ")]
        self.assertEqual([row[2:6] for row in rows], [["exact", "-", "2", "0"],
                                                      ["exact", "-", "2", "1"],
                                                      ["FAVOR+", "8", "2", "0"],
                                                      ["FAVOR+", "8", "2", "1"]])
        # the validation batch the tool scored: batch 4096 // 16, stream 2^63, the run's seed
        tok, tgt = performer.mqar_batch(256, 16, pairs=2, queries=4, keys=64, seed=2,
                                        stream=2**63)
        for row, ck in zip(rows, [self.cks[1]] * 2 + [self.cks[0]] * 2):
            layer = int(row[5])
            with performer.Model(ck) as m:
                q, k, _ = m.attention_inputs(tok, layer)
            ents, tops, sums, unis = [], [], [], []
            for b, t in zip(*np.nonzero(tgt != -1)):
                qs = q[b, 0, t].astype(np.float64) / 16 ** 0.25
                ks = k[b, 0, :t + 1].astype(np.float64) / 16 ** 0.25
                sc = ks @ qs
                w = np.exp(sc - sc.max())
                w /= w.sum()
                ents.append(-(w[w > 0] * np.log(w[w > 0])).sum())
                tops.append(sc.max())
                sums.append(((qs + ks[sc.argmax()]) ** 2).sum())
                unis.append(np.log(t + 1.0))
            ent, uni = row[6].split()
            self.assertAlmostEqual(float(ent), np.mean(ents), delta=1.5e-3)
            self.assertAlmostEqual(float(uni.strip("()")), np.mean(unis), delta=0.006)
            self.assertAlmostEqual(float(row[7]), np.median(tops), delta=0.06)
            self.assertAlmostEqual(float(row[8]), np.median(sums), delta=0.06)

    def test_refuses_a_path_outside_the_layout(self):
        r, out = self.sharpness(os.path.join(self.tmp.name, "checkpoint.safetensors"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("is not .../L<length>-p<pairs>", r.stderr)
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main()
