"""bench/bench_python.py says what it ran: in part 2 every side runs the threads its header says
(C as pf_attn_opts.threads; performer.torch called with threads=None and pure torch, both after
torch.set_num_threads; pure torch's OpenBLAS products as the header says for the build loaded),
each row prints them (C/pt/torch/OpenBLAS), read in the run, and the run exits 0; a run whose
sides ran other threads marks them and exits 1. At L = 128, one repeat, 1 and 2 threads: nothing
here is a timing (timings never go in tests), and the bench writes no file.
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

try:
    import torch  # noqa: F401  (part 2 needs it)
except ImportError:
    raise unittest.SkipTest("torch is not installed (Debian's python3-torch): bench_python's "
                            "part 2 not tested")

from common import TOOL, tree_digest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BENCH = os.path.join(ROOT, "bench", "bench_python.py")


def build_dir():
    if TOOL:
        return os.path.dirname(os.path.abspath(TOOL))
    lib = os.environ.get("PERFORMER_LIB")
    return os.path.dirname(os.path.abspath(lib)) if lib else os.path.join(ROOT, "build")


class TestBenchPython(unittest.TestCase):
    def run_bench(self, *args):
        """(exit status, stdout, stderr) of the bench run in a scratch folder holding one file;
        checks that no file there or in the repository's bench/ and docs/ changed."""
        with tempfile.TemporaryDirectory(prefix="pf_bench_") as d:
            with open(os.path.join(d, "note.txt"), "w") as f:
                f.write("left alone\n")
            folders = (d, os.path.join(ROOT, "bench"), os.path.join(ROOT, "docs"))
            before = [tree_digest(x) for x in folders]
            r = subprocess.run([sys.executable, BENCH, "--build", build_dir(), *args], cwd=d,
                               capture_output=True, text=True, timeout=600)
            self.assertEqual([tree_digest(x) for x in folders], before, "files changed")
        return r.returncode, r.stdout, r.stderr

    def test_every_side_runs_the_threads_the_header_says(self):
        for n in (1, 2):
            with self.subTest(threads=n):
                rc, out, err = self.run_bench("--parts", "2", "--lengths", "128", "--repeats",
                                              "1", "--threads", str(n))
                self.assertEqual(rc, 0, out + err)
                self.assertIn(f"threads: {n} on every side", out)
                self.assertIn(f"torch.set_num_threads({n})", out)
                m = re.search(r"pure torch's matrix products in OpenBLAS: (.*?)\. ", out)
                self.assertIsNotNone(m, out)
                blas = {"the OpenMP build": str(n), "the serial build": "1"}
                want = next((v for k, v in blas.items() if m.group(1).startswith(k)), "1")
                rows = [line.split() for line in out.splitlines()
                        if re.match(r"\s+128 (bidir|causal) ", line)]
                self.assertEqual(len(rows), 4, out)
                for row in rows:  # L, pass (2 words), 3 times, 3 ratios, threads
                    self.assertEqual(row[9], f"{n}/{n}/{n}/{want}", " ".join(row))
                self.assertNotIn("!", out)
                self.assertEqual(err.strip(), "")

    def test_parts_refused(self):
        rc, out, err = self.run_bench("--parts", "4")
        self.assertEqual(rc, 2)
        self.assertIn("--parts: a list of 1, 2, 3", err)
        self.assertEqual(out, "")


if __name__ == "__main__":
    unittest.main()
