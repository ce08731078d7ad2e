#!/bin/sh
# test_python.sh: the Python package, python/performer (ctypes over BUILD/libperformer.so).
#
#   PERFORMER=build/performer BUILD=build sh tests/test_python.sh
#
# - the library is found in the documented order (performer/_lib.py): PERFORMER_LIB, a copy
#   inside the installed package, the source tree's build folder, the dynamic linker (where
#   `make install` puts it); a package with none of them fails to import, saying what it tried;
# - `pip install` works offline into a venv made with --system-site-packages (Debian's pip and
#   setuptools, --no-build-isolation --no-index), copies the library into the package, leaves
#   the source folder as it was, and the installed package computes what the tree's does;
# - the unit tests, python/tests/*.py, run by /usr/bin/python3 -m unittest: results equal to
#   this build's `performer attn` bit for bit, gradients of performer.torch against torch
#   autograd in float64, FastAttention, a small model trained through FastAttention, every
#   error path, resident memory over 1000 calls. Without torch (Debian's python3-torch) its
#   tests are skipped, saying so; everything else runs.
# - performer.torch on CUDA tensors (python/tests/test_torch_cuda.py) against its CPU results,
#   with this BUILD's libperformer_cuda (PERFORMER_CUDA_LIB; `make` builds it where nvcc is
#   found, the ASan build never): skipped, saying why, without torch's CUDA, that library or a
#   GPU.
#
# Under the ASan build (libperformer.so holding __asan_init) python runs with the ASan runtime
# preloaded (LD_PRELOAD, as an instrumented library loaded by an uninstrumented program needs,
# and libstdc++ with it, for the C++ exceptions torch throws),
# leak detection off (the interpreter keeps objects until exit) and allocator_may_return_null=1
# (a test asks for 1 TiB and expects PF_ENOMEM): the package's risk is exactly what ASan sees,
# struct layouts and buffer sizes handed to C. The resident-memory checks (ASan's quarantine
# keeps freed memory resident) and the training run (minutes under ASan, nothing new to check)
# are skipped there, saying so.
# No `set -e`: every check runs, failures are counted, exit 1 if any.

TEST=test_python; . "$(dirname "$0")/lib.sh"
root=$(pwd)
B=${BUILD:-build}
case "$B" in /*) ;; *) B="$root/$B" ;; esac
LIB="$B/libperformer.so"
if [ ! -f "$LIB" ]; then fail "no $LIB (make BUILD=... all first)"; finish; exit 1; fi
if ! $PY -c 'import numpy' 2>/dev/null; then fail "$PY has no numpy"; finish; exit 1; fi

if nm -D "$LIB" 2>/dev/null | grep -q __asan_init; then
    rt=$(gcc -print-file-name=libasan.so)
    # libstdc++ too: ASan's __cxa_throw interceptor finds the real one when it starts, so a C++
    # exception torch throws (an input changed in place before a backward) needs it loaded then
    export LD_PRELOAD="$rt $(gcc -print-file-name=libstdc++.so.6)"
    export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    export PF_TEST_ASAN=1
    echo "note: ASan build: python runs with $rt preloaded (ASAN_OPTIONS=$ASAN_OPTIONS)"
fi
if $PY -c 'import torch' 2>/dev/null; then has_torch=1; else
    has_torch=0; echo "note: no torch for $PY (python3-torch): performer.torch's tests skipped"
fi

# where_found ENV... -- PYTHON: "how|path" of the library the package loaded
where_found() {
    env "$@" -c 'import performer._lib as l; print(l.library_found_by + "|" + l.library_path)' \
        2>"$T/err"
}

# 1. from the tree: PERFORMER_LIB first; without it, the tree's build folder (a tree made here
# whose build/ is this BUILD, so the check holds for any BUILD)
got=$(where_found PYTHONPATH=python PERFORMER_LIB="$LIB" $PY)
if [ "$got" = "PERFORMER_LIB|$LIB" ]; then pass; else
    fail "PYTHONPATH=python PERFORMER_LIB=$LIB: found '$got': $(cat "$T/err")"; fi
mkdir "$T/tree"
ln -s "$root/python" "$T/tree/python"
ln -s "$B" "$T/tree/build"
got=$(cd / && where_found -u PERFORMER_LIB PYTHONPATH="$T/tree/python" $PY)
if [ "$got" = "the source tree's build folder|$T/tree/build/libperformer.so.0" ]; then pass; else
    fail "from a tree without PERFORMER_LIB: found '$got': $(cat "$T/err")"; fi

# 2. pip install, offline, into a venv seeing Debian's packages, from a copy of the source
# (python/ and include/ as in the repository); the copy must be left as it was
mkdir "$T/src"
cp -R python include "$T/src/"
rm -rf "$T/src/python/tests/__pycache__" "$T/src/python/performer/__pycache__"
(cd "$T/src" && find . -type f | sort | xargs sha256sum) >"$T/src.before"
if $PY -m venv --system-site-packages "$T/venv" >"$T/venv.log" 2>&1 &&
    PERFORMER_BUILD="$B" "$T/venv/bin/pip" install --no-build-isolation --no-index \
        "$T/src/python" >"$T/pip.log" 2>&1; then pass; else
    fail "venv + pip install: $(tail -n 15 "$T/venv.log" "$T/pip.log")"; fi
(cd "$T/src" && find . -type f | sort | xargs sha256sum) >"$T/src.after"
if cmp -s "$T/src.before" "$T/src.after"; then pass; else
    fail "pip install changed the source folder: $(diff "$T/src.before" "$T/src.after" | head)"; fi
site=$("$T/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
got=$(cd / && where_found -u PERFORMER_LIB "$T/venv/bin/python")
if [ "$got" = "the package folder|$site/performer/libperformer.so.0" ]; then pass; else
    fail "installed package: found '$got': $(cat "$T/err")"; fi
if cmp -s "$site/performer/libperformer.so.0" "$B/libperformer.so"; then pass; else
    fail "the installed library is not $B/libperformer.so"; fi
got=$(cd / && where_found PERFORMER_LIB="$LIB" "$T/venv/bin/python")
if [ "$got" = "PERFORMER_LIB|$LIB" ]; then pass; else
    fail "installed package with PERFORMER_LIB: found '$got': $(cat "$T/err")"; fi
# the CUDA library, where this build has one, is installed beside it and found there (loading
# needs no GPU: the CUDA runtime it links is beside nvcc)
if [ -f "$B/libperformer_cuda.so" ]; then
    if cmp -s "$site/performer/libperformer_cuda.so.0" "$B/libperformer_cuda.so"; then pass; else
        fail "pip install did not copy $B/libperformer_cuda.so into the package"; fi
    got=$(cd / && env -u PERFORMER_CUDA_LIB "$T/venv/bin/python" -c \
        'import performer._cuda as c; print(c.library_path())' 2>"$T/err")
    if [ "$got" = "$site/performer/libperformer_cuda.so.0" ]; then pass; else
        fail "installed package: libperformer_cuda found at '$got': $(cat "$T/err")"; fi
fi
same='import numpy as np, performer, sys
r = np.random.default_rng(0)
q, k, v = (r.standard_normal((2, 100, 16), dtype=np.float32) for _ in range(3))
np.save(sys.argv[1], performer.attention(q, k, v, causal=True, features=64, seed=3))'
(cd / && env -u PERFORMER_LIB "$T/venv/bin/python" -c "$same" "$T/o_venv.npy") &&
    PYTHONPATH=python PERFORMER_LIB="$LIB" $PY -c "$same" "$T/o_tree.npy" &&
    cmp -s "$T/o_venv.npy" "$T/o_tree.npy"
if [ $? -eq 0 ]; then pass; else fail "the installed package computes other bits than the tree's"
fi
if [ $has_torch -eq 1 ]; then
    if (cd / && "$T/venv/bin/python" -c 'import performer.torch') 2>"$T/err"; then pass; else
        fail "installed package: import performer.torch: $(cat "$T/err")"; fi
fi

# 3. a package installed without a library (no build folder) finds it through the dynamic
# linker, as after `make install` (a folder on LD_LIBRARY_PATH stands for /usr/local/lib)
if PERFORMER_BUILD="$T/nowhere" "$T/venv/bin/pip" install --no-build-isolation --no-index \
    --force-reinstall --no-deps "$T/src/python" >"$T/pip2.log" 2>&1; then pass; else
    fail "pip install without a build folder: $(tail -n 15 "$T/pip2.log")"; fi
mkdir "$T/lib"
cp "$B/libperformer.so" "$T/lib/libperformer.so.0"
got=$(cd / && where_found -u PERFORMER_LIB LD_LIBRARY_PATH="$T/lib" "$T/venv/bin/python")
if [ "$got" = "the dynamic linker (make install)|libperformer.so.0" ]; then pass; else
    fail "installed package without a library: found '$got': $(cat "$T/err")"; fi
(cd / && env -u PERFORMER_LIB "$T/venv/bin/python" -c 'import performer') 2>"$T/err"
if [ $? -ne 0 ] && grep -q "libperformer not found" "$T/err" && grep -q "PERFORMER_LIB" "$T/err"
then pass; else fail "no library anywhere: import should fail saying why: $(cat "$T/err")"; fi

# 4. the unit tests
PERFORMER="$P" PERFORMER_LIB="$LIB" PERFORMER_CUDA_LIB="$B/libperformer_cuda.so" \
    PYTHONPATH=python $PY -m unittest discover -s python/tests -v >"$T/unit.log" 2>&1
rc=$?
grep -E "^  train:|\.\.\. skipped" "$T/unit.log"
tail -n 3 "$T/unit.log"
if [ $rc -eq 0 ]; then pass; else
    fail "python unit tests: $(grep -B 2 -A 25 -E '^(FAIL|ERROR):' "$T/unit.log" | head -n 120)"
fi

finish
