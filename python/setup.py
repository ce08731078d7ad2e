"""Builds the performer package: pure Python over ctypes, plus a copy of the built C library.

The library file is taken from the build folder (the environment variable PERFORMER_BUILD, else
../build beside this folder: run `make` first) and installed inside the package as
performer/libperformer.so.0, where performer/_lib.py looks for it second (after PERFORMER_LIB).
The CUDA library, where `make` built it (nvcc found), goes beside it as
performer/libperformer_cuda.so.0 (performer/_cuda.py loads it when a CUDA tensor first needs it;
it finds libperformer.so.0 beside itself, and the CUDA runtime and cuBLAS where it was linked).
The package's version is the library's (its file name, libperformer.so.X.Y.Z, or the header's
PF_VERSION_*). With no built library the package is installed without one, and finds the
library at run time through PERFORMER_LIB or the dynamic linker (after `make install`).
"""
import atexit
import glob
import os
import re
import shutil
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("PERFORMER_BUILD") or os.path.join(HERE, "..", "build")
HEADER = os.path.join(HERE, "..", "include", "performer.h")


def built_library():
    """(path, version) of the built libperformer.so.X.Y.Z, or (None, None)."""
    for path in sorted(glob.glob(os.path.join(BUILD, "libperformer.so.*.*.*"))):
        m = re.search(r"libperformer\.so\.(\d+\.\d+\.\d+)$", path)
        if m and os.path.isfile(path):
            return path, m.group(1)
    return None, None


def built_cuda_library():
    """The path of the built libperformer_cuda.so.X.Y.Z, or None (a build without nvcc)."""
    for path in sorted(glob.glob(os.path.join(BUILD, "libperformer_cuda.so.*.*.*"))):
        if re.search(r"libperformer_cuda\.so\.\d+\.\d+\.\d+$", path) and os.path.isfile(path):
            return path
    return None


def header_version():
    try:
        with open(HEADER) as f:
            parts = dict(re.findall(r"#define PF_VERSION_(MAJOR|MINOR|PATCH) (\d+)", f.read()))
        return "{MAJOR}.{MINOR}.{PATCH}".format(**parts)
    except (OSError, KeyError):
        return None


LIBRARY, LIB_VERSION = built_library()
CUDA_LIBRARY = built_cuda_library() if LIBRARY else None
VERSION = LIB_VERSION or header_version()
if VERSION is None:
    raise SystemExit(f"performer: no built library in {BUILD} and no {HEADER}: run `make` first, "
                     "or set PERFORMER_BUILD to the build folder")


class BuildWithLibrary(build_py):
    """build_py that also copies the C library into the package."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "performer", "libperformer.so.0")
        if LIBRARY:
            self.announce(f"copying {LIBRARY} -> {target}", level=2)
            shutil.copyfile(LIBRARY, target)
            os.chmod(target, 0o755)
            if CUDA_LIBRARY:
                cuda = os.path.join(self.build_lib, "performer", "libperformer_cuda.so.0")
                self.announce(f"copying {CUDA_LIBRARY} -> {cuda}", level=2)
                shutil.copyfile(CUDA_LIBRARY, cuda)
                os.chmod(cuda, 0o755)
        else:
            print(f"performer: no built library in {BUILD}; the package will look for "
                  "PERFORMER_LIB or an installed libperformer.so.0 (make install)")


class BinaryDistribution(Distribution):
    """The package carries a shared library: a platform wheel, not a pure one."""

    def has_ext_modules(self):
        return LIBRARY is not None


# Build files and metadata go to a temporary folder, not into the source tree (pip builds in
# place): installing from a clone leaves it as it was.
SCRATCH = tempfile.mkdtemp(prefix="performer-py-build-")
atexit.register(shutil.rmtree, SCRATCH, True)

setup(version=VERSION, cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution,
      options={"build": {"build_base": SCRATCH}, "egg_info": {"egg_base": SCRATCH}})
