#!/bin/sh
# Installs the Debian packages performer needs, only those that are missing.
#   gcc, make         the compiler and build (C11, OpenMP)
#   libopenblas-openmp-dev  cblas_sgemm and LAPACK's ssyev; the OpenMP build: the library runs
#                     its own OpenMP threads around BLAS calls, each on its calling thread, and
#                     this build starts no threads of its own (the Makefile says why)
#   zlib1g-dev        reading gzip-compressed FASTA (the protein data)
#   python3-numpy     test fixtures and independent references in the end-to-end tests
#   python3-matplotlib  plots of benchmarks and experiments
#   mmseqs2-examples  20,000 UniProt protein sequences (DB.fasta.gz): the language model's data
#   bible-kjv         the King James Bible and its `bible` program: the language model's text
#   pkg-config        the install test builds programs with performer.pc's flags
#   g++               the install test compiles a C++ program against the installed header
#   cmake             the install test builds C and C++ projects with find_package(performer)
#   groff-base, man-db  the install test formats the man page with warnings on (groff, man)
#   libopenmpi-dev, openmpi-bin  Open MPI: mpicc builds libperformer_mpi (sequence-parallel
#                     FAVOR+, include/performer_mpi.h) and mpirun runs its tests and benchmark
#   python3-torch     the Python package's PyTorch layer (performer.torch) and its tests: gradients
#                     against torch autograd, a small model trained through the C kernels
#   python3-venv, python3-setuptools, python3-wheel  the Python test installs the package with
#                     pip into a venv, offline (Debian's setuptools builds it; no PyPI)
#   clang             builds the fuzz targets (make fuzz): libFuzzer is clang's
#   libclang-rt-14-dev  clang's runtimes: libFuzzer, ASan and UBSan (libclang_rt.fuzzer-x86_64.a)
# and, for `make test-aarch64` on an x86-64 machine (a cross build tested under emulation; a
# failure here only makes that target skip, saying what is missing):
#   gcc-aarch64-linux-gnu  the cross compiler
#   qemu-user              qemu-aarch64, which runs the aarch64 test programs
#   libopenblas-openmp-dev:arm64, zlib1g-dev:arm64  the arm64 BLAS and zlib (multiarch: dpkg
#                     --add-architecture arm64), with libc6:arm64, the loader qemu runs them on
set -e
cross() {
    [ "$(dpkg --print-architecture)" = amd64 ] || return 0
    cneed=""
    for p in gcc-aarch64-linux-gnu qemu-user libopenblas-openmp-dev:arm64 zlib1g-dev:arm64; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
            cneed="$cneed $p"
    done
    [ -z "$cneed" ] && return 0
    echo "setup: installing$cneed (make test-aarch64)"
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
    dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
        --no-install-recommends $cneed ||
        echo "setup: the aarch64 cross packages did not install: make test-aarch64 will skip"
}
need=""
for p in gcc make libc6-dev libopenblas-openmp-dev zlib1g-dev python3-numpy python3-matplotlib \
         mmseqs2-examples bible-kjv pkg-config g++ cmake groff-base man-db python3-torch \
         python3-venv python3-setuptools python3-wheel clang libclang-rt-14-dev libopenmpi-dev \
         openmpi-bin; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need="$need $p"
done
if [ -n "$need" ]; then
    echo "setup: installing$need"
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $need
fi
cross || true
