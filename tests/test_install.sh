#!/bin/sh
# test_install.sh: `make install` and `make uninstall`, and programs built against what they
# install, run without LD_LIBRARY_PATH.
#
#   PERFORMER=build/performer BUILD=build sh tests/test_install.sh
#
# - make install DESTDIR=stage PREFIX=/usr/local puts exactly the files the README lists there
#   (modes, links, soname libperformer.so.MAJOR, the version of the header and of pf_version()),
#   runs no ldconfig, and does it again over its own files; make uninstall removes exactly those
#   files and leaves others in the same folders;
# - the README's example.c, taken from README.md, built with the README's command line and the
#   flags of the staged performer.pc (PKG_CONFIG_SYSROOT_DIR), plus an rpath to the staged lib
#   (the one thing /usr/local/lib and ldconfig give a real install), starts and prints FAVOR+'s
#   error against exact attention; the program needs libperformer.so.MAJOR, not the static lib;
# - make install PREFIX=tmp/prefix (a real install, no DESTDIR): ldconfig runs if root; the same
#   program linked shared (+ rpath) and -static with `pkg-config --static` (Libs.private) runs;
# - a C++ program (g++ -std=c++11 -pedantic -Werror) includes the installed header and calls the
#   library: exact attention with Q = 0 gives the mean of V's rows;
# - the README's two link lines for build/ without installing give programs that start;
# - the installed tool needs libperformer.so.MAJOR (performer-mpi libperformer_mpi.so.MAJOR too),
#   loads the installed one without LD_LIBRARY_PATH, staged and in PREFIX, and runs; its man
#   page formats without a warning and names every option of every command's --help;
# - where mpicc is (the Makefile builds the MPI library there): make install also puts
#   performer_mpi.h, libperformer_mpi (.a, .so.X.Y.Z named libperformer_mpi.so.MAJOR, needing
#   libperformer.so.MAJOR), performer_mpi.pc and performer-mpi there; a small MPI program built
#   with `pkg-config --cflags --libs performer_mpi` (staged: by mpicc, since the sysroot would be
#   prepended to MPI's own paths too; in PREFIX: by cc, the .pc alone) runs under mpirun -np 2
#   without LD_LIBRARY_PATH and matches one process; `mpirun -np 2 performer` starts the
#   installed performer-mpi.
# - the CMake package (performerConfig.cmake and its version file), from a staged install with
#   LIBDIR and INCLUDEDIR moved: find_package(performer MAJOR.MINOR REQUIRED) with
#   CMAKE_PREFIX_PATH into the stage gives performer::performer (the README's example.c links
#   libperformer.so.MAJOR, finds the moved header and runs), performer::performer_static (the
#   same program holding the library, no libperformer needed at run time) and, in a C++17
#   project, the C++ program above; where the MPI library is installed, COMPONENTS mpi gives
#   performer::performer_mpi and the MPI program runs under mpirun -np 2 (the same for CUDA and
#   performer::performer_cuda); a component not installed, an unknown one, the next major and
#   the next minor version are refused with a reason, a range around the version is not; make
#   uninstall removes both files and their folder. Skipped, saying so, without cmake.
# Under a sanitizer build (BUILD=build-asan) the programs are linked with the same sanitizers,
# and the -static link is left out (the sanitizers do not link statically).
set -eu

BUILD=${BUILD:-build}
P=${PERFORMER:-$BUILD/performer}
root=$(pwd)
case "$BUILD" in /*) build=$BUILD ;; *) build=$root/$BUILD ;; esac
case "$P" in /*) ;; *) P="$root/$P" ;; esac
unset LD_LIBRARY_PATH PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_LIBDIR 2>/dev/null || true

T=$(mktemp -d "${TMPDIR:-/tmp}/pf_test_install.XXXXXX")
trap 'rm -rf "$T"' EXIT
trap 'exit 1' INT TERM

fails=0
checks=0
ok() { checks=$((checks + 1)); }
fail() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }
check() { # check "what" command...: the command must succeed
    what=$1; shift
    if "$@"; then ok; else fail "$what"; fi
}
same() { # same "what" expected got
    if [ "$2" = "$3" ]; then ok; else fail "$1: expected '$2', got '$3'"; fi
}

# The sub-make installs the objects already built in BUILD (with the flags they were built with:
# MAKEFLAGS carries a parent make's command-line variables).
mk() { make -s --no-print-directory BUILD="$BUILD" "$@"; }

version=$(sed -n 's/^#define PF_VERSION_[A-Z]* *\([0-9][0-9]*\).*/\1/p' include/performer.h |
          paste -sd. -)
major=${version%%.*}
# loaded_from PROGRAM LIB: the file the dynamic linker loads for LIB when PROGRAM starts, with
# links and .. resolved ("" if none)
loaded_from() {
    f=$(env -u LD_LIBRARY_PATH ldd "$1" 2>/dev/null |
        sed -n "s/^[[:space:]]*$2 => \(.*\) (0x.*/\1/p")
    [ -n "$f" ] && realpath "$f"
}
# check_tool PROGRAM LIBDIR: PROGRAM (an installed performer) needs libperformer.so.MAJOR and
# loads LIBDIR's, and starts without LD_LIBRARY_PATH, printing the version
check_tool() {
    check "$1 needs libperformer.so.$major" \
        sh -c "readelf -d '$1' | grep -q 'NEEDED.*\[libperformer.so.$major\]'"
    same "$1 loads the installed libperformer.so.$major" "$(realpath "$2/libperformer.so.$major")" \
        "$(loaded_from "$1" "libperformer.so.$major")"
    same "$1 --version" "$version" \
        "$(env -u LD_LIBRARY_PATH "$1" --version 2>&1 | sed -n '1s/^performer \([^ ]*\).*/\1/p')"
}

same "pf_version() (performer --version) is the header's version" \
    "$version" "$("$P" --version | sed -n '1s/^performer \([^ ]*\).*/\1/p')"

# Sanitizer builds: every program linked against the library needs the same runtime.
san=""
if nm "$build/libperformer.a" 2>/dev/null | grep -q '__asan_\|__ubsan_'; then
    san="-fsanitize=address,undefined"
    echo "note: sanitizer build: programs linked with $san; no -static link"
fi

# The README's example program and its build line, as the README has them.
sed -n '/^\/\* example\.c:/,/^```$/p' README.md | sed '$d' >"$T/example.c"
check "README has the example program" grep -q 'pf_attn_favor' "$T/example.c"
check "README has the example program" grep -q '^}$' "$T/example.c"
build_line=$(grep '^cc .* example\.c \$(pkg-config --cflags --libs performer)' README.md | head -1)
same "README has the example's build line" \
    'cc -O2 -o example example.c $(pkg-config --cflags --libs performer) -lm' "$build_line"

# check_example NAME: runs $T/NAME (no LD_LIBRARY_PATH) and checks what it prints.
check_example() {
    if ! out=$(env -u LD_LIBRARY_PATH "$T/$1" 2>"$T/$1.err"); then
        fail "$1 did not run: $(cat "$T/$1.err")"
        return
    fi
    echo "  $1: $out"
    case "$out" in
    "performer $version: FAVOR+ (m = 256) vs exact attention, L = 1024, d = 64: relative error "*)
        ok ;;
    *) fail "$1 printed '$out'" ;;
    esac
    # FAVOR+ with m = 256 at this input scale: about 0.37 (the README's run); a broken library
    # gives 1 (zeros) or nonsense.
    err=${out##* }
    check "$1: relative error $err in [0.25, 0.5]" \
        awk -v e="$err" 'BEGIN { exit !(e >= 0.25 && e <= 0.5) }'
}

# build_example NAME EXTRA...: the README's build line in $T, output NAME, extra flags after.
build_example() {
    name=$1; shift
    line=$(printf '%s' "$build_line" | sed "s/-o example /-o $name /")
    if (cd "$T" && eval "$line $san $*") >"$T/$name.log" 2>&1; then ok; else
        fail "building $name: $line $san $*"; cat "$T/$name.log"; return 1
    fi
}

# 1. A staged install: DESTDIR=stage, PREFIX=/usr/local.
S=$T/stage
mkdir -p "$S/usr/local/lib" "$S/usr/local/share/man/man1"
echo other >"$S/usr/local/lib/libother.so"                 # not ours: must survive uninstall
echo other >"$S/usr/local/share/man/man1/other.1"
mk install DESTDIR="$S" PREFIX=/usr/local LDCONFIG="echo ldconfig ran" >"$T/install.log" 2>&1 ||
    { cat "$T/install.log"; fail "make install DESTDIR"; exit 1; }
check "no ldconfig with DESTDIR" sh -c "! grep -q 'ldconfig ran' '$T/install.log'"
mk install DESTDIR="$S" PREFIX=/usr/local LDCONFIG=true >"$T/install2.log" 2>&1 ||
    { cat "$T/install2.log"; fail "make install DESTDIR, a second time over the first"; }

expected="./usr/local/bin/performer 755 f
./usr/local/include/performer.h 644 f
./usr/local/lib/cmake/performer/performerConfig.cmake 644 f
./usr/local/lib/cmake/performer/performerConfigVersion.cmake 644 f
./usr/local/lib/libother.so 644 f
./usr/local/lib/libperformer.a 644 f
./usr/local/lib/libperformer.so 777 l libperformer.so.$major
./usr/local/lib/libperformer.so.$major 777 l libperformer.so.$version
./usr/local/lib/libperformer.so.$version 644 f
./usr/local/lib/pkgconfig/performer.pc 644 f
./usr/local/share/man/man1/other.1 644 f
./usr/local/share/man/man1/performer.1 644 f"
# where mpicc is (as the Makefile finds it), the MPI library and the tool's MPI build too
mpi=""
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
    mpi=yes
    expected="$expected
./usr/local/bin/performer-mpi 755 f
./usr/local/include/performer_mpi.h 644 f
./usr/local/lib/libperformer_mpi.a 644 f
./usr/local/lib/libperformer_mpi.so 777 l libperformer_mpi.so.$major
./usr/local/lib/libperformer_mpi.so.$major 777 l libperformer_mpi.so.$version
./usr/local/lib/libperformer_mpi.so.$version 644 f
./usr/local/lib/pkgconfig/performer_mpi.pc 644 f"
else
    echo "note: no mpicc or mpirun: the MPI library's install is not checked"
fi
# where the build holds the CUDA library (nvcc found, and not a CUDA=0 build such as the
# sanitizer one), its files too (built and installed without a GPU)
cuda=""
if [ -f "$build/libperformer_cuda.a" ]; then
    cuda=yes
    expected="$expected
./usr/local/include/performer_cuda.h 644 f
./usr/local/lib/libperformer_cuda.a 644 f
./usr/local/lib/libperformer_cuda.so 777 l libperformer_cuda.so.$major
./usr/local/lib/libperformer_cuda.so.$major 777 l libperformer_cuda.so.$version
./usr/local/lib/libperformer_cuda.so.$version 644 f
./usr/local/lib/pkgconfig/performer_cuda.pc 644 f"
else
    echo "note: no libperformer_cuda in $BUILD (no nvcc, or CUDA=0): its install is not checked"
fi
expected=$(printf '%s\n' "$expected" | sort)
got=$(cd "$S" && find . ! -type d -printf '%p %m %y %l\n' | sed 's/ $//' | sort)
same "the installed files, modes and links" "$expected" "$got"

L=$S/usr/local/lib
same "soname" "libperformer.so.$major" \
    "$(readelf -d "$L/libperformer.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
if [ -n "$cuda" ]; then
    same "libperformer_cuda's soname" "libperformer_cuda.so.$major" \
        "$(readelf -d "$L/libperformer_cuda.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
    check "libperformer_cuda needs libperformer.so.$major and cuBLAS" sh -c "readelf -d \
        '$L/libperformer_cuda.so.$version' | grep -q 'NEEDED.*\[libperformer.so.$major\]' &&
        readelf -d '$L/libperformer_cuda.so.$version' | grep -q 'NEEDED.*\[libcublas.so'"
    same "the installed CUDA header is the source's" "" \
        "$(cmp "$S/usr/local/include/performer_cuda.h" include/performer_cuda.h 2>&1)"
fi
same "the installed header is the source's" "" \
    "$(cmp "$S/usr/local/include/performer.h" include/performer.h 2>&1)"

# pkg-config on the staged tree: the sysroot is prepended to the .pc's /usr/local paths.
export PKG_CONFIG_PATH="$L/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$S"
same "pkg-config --modversion" "$version" "$(pkg-config --modversion performer)"
same "pkg-config --cflags" "-I$S/usr/local/include" "$(pkg-config --cflags performer | xargs)"
same "pkg-config --libs" "-L$L -lperformer" "$(pkg-config --libs performer | xargs)"
same "the .pc names its libdir" "$S/usr/local/lib" "$(pkg-config --variable=libdir performer)"
if build_example example_staged -Wl,-rpath,"$L"; then
    check_example example_staged
    check "example_staged needs libperformer.so.$major" \
        sh -c "readelf -d '$T/example_staged' | grep -q 'NEEDED.*\[libperformer.so.$major\]'"
    check "example_staged holds no copy of the library" \
        sh -c "! nm '$T/example_staged' | grep -q ' T pf_attn_favor$'"
fi
# The MPI library: a program that cuts a causal sequence across the ranks and compares each
# rank's rows with one process's (pf_attn_favor on the whole sequence), built against the
# install with pkg-config and run under mpirun -np 2.
if [ -n "$mpi" ]; then
    # Open MPI's own leaks at exit are not ours; loopback only, as tests/test_mpi.sh
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    export OMPI_MCA_btl="self,vader,tcp" OMPI_MCA_btl_tcp_if_include=lo \
        OMPI_MCA_oob_tcp_if_include=lo
    cat >"$T/mpi_example.c" <<'EOF'
/* mpi_example.c: causal FAVOR+ with the sequence cut across the ranks, each rank's rows against
 * one process's. */
#include <math.h>
#include <stdio.h>

#include <performer_mpi.h>

enum { L = 96, D = 16, M = 32 };
static float Q[L * D], K[L * D], V[L * D], ref[L * D], out[L * D], W[M * D];

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 0; i < L * D; i++) {
        Q[i] = 0.4f * sinf(0.7f * i);
        K[i] = 0.4f * cosf(1.3f * i);
        V[i] = sinf(0.11f * i);
    }
    pf_status st = pf_projection_draw(W, M, D, PF_PROJ_ORTHOGONAL, PF_NORM_CHI, 1, 0);
    pf_favor_opts fav = pf_favor_opts_default();
    fav.W = W;
    fav.m = M;
    pf_attn_opts opts = pf_attn_opts_default();
    opts.causal = 1;
    pf_shape all = {1, 1, L, L, D, D};
    if (st == PF_OK) st = pf_attn_favor(ref, Q, K, V, &all, &opts, &fav);
    int o = L * rank / size, n = L * (rank + 1) / size - o;
    pf_shape mine = {1, 1, n, n, D, D};
    pf_mpi_info info;
    pf_status sm = pf_mpi_attn_favor(out, Q + o * D, K + o * D, V + o * D, &mine, &opts, &fav,
                                     MPI_COMM_WORLD, &info);
    double e = 0, r = 0;
    for (int i = 0; i < n * D; i++) {
        e += (out[i] - ref[o * D + i]) * (double)(out[i] - ref[o * D + i]);
        r += ref[o * D + i] * (double)ref[o * D + i];
    }
    printf("rank %d of %d: %s, rows %d to %d, relative error %.3g\n", rank, size,
           st == PF_OK && sm == PF_OK ? "ok" : sm != PF_OK ? info.message : pf_status_str(st), o,
           o + n - 1, sqrt(e / r));
    MPI_Finalize();
    return st == PF_OK && sm == PF_OK && sqrt(e / r) <= 1e-5 ? 0 : 1;
}
EOF
    # run_mpi NAME: NAME under mpirun -np 2, no LD_LIBRARY_PATH; each rank says ok
    run_mpi() {
        if out=$(env -u LD_LIBRARY_PATH timeout 120 mpirun --allow-run-as-root --oversubscribe \
                -np 2 "$T/$1" 2>"$T/$1.err"); then
            echo "$out" | sed "s/^/  $1: /"
            same "$1: two ranks say ok" 2 "$(echo "$out" | grep -c ': ok, rows')"
        else
            fail "mpirun -np 2 $1: $out $(cat "$T/$1.err")"
        fi
    }
    same "pkg-config --modversion performer_mpi" "$version" \
        "$(pkg-config --modversion performer_mpi)"
    same "libperformer_mpi's soname" "libperformer_mpi.so.$major" \
        "$(readelf -d "$L/libperformer_mpi.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
    check "libperformer_mpi needs libperformer.so.$major" sh -c "readelf -d \
        '$L/libperformer_mpi.so.$version' | grep -q 'NEEDED.*\[libperformer.so.$major\]'"
    same "the installed performer_mpi.h is the source's" "" \
        "$(cmp "$S/usr/local/include/performer_mpi.h" include/performer_mpi.h 2>&1)"
    # staged: the sysroot is prepended to every path of the flags, MPI's own too, so mpicc
    # gives MPI's flags and the .pc performer_mpi's
    if (cd "$T" && mpicc -O2 -o mpi_staged mpi_example.c \
            $(pkg-config --cflags --libs performer_mpi) -Wl,-rpath,"$L" -lm $san) \
            >"$T/mpi_staged.log" 2>&1; then
        ok
        check "mpi_staged needs libperformer_mpi.so.$major" sh -c \
            "readelf -d '$T/mpi_staged' | grep -q 'NEEDED.*\[libperformer_mpi.so.$major\]'"
        run_mpi mpi_staged
    else
        fail "mpicc against the staged performer_mpi.pc"; cat "$T/mpi_staged.log"
    fi
    check "the installed performer-mpi needs libperformer_mpi.so.$major" sh -c "readelf -d \
        '$S/usr/local/bin/performer-mpi' | grep -q 'NEEDED.*\[libperformer_mpi.so.$major\]'"
    same "the installed performer-mpi loads the installed libperformer_mpi.so.$major" \
        "$(realpath "$L/libperformer_mpi.so.$major")" \
        "$(loaded_from "$S/usr/local/bin/performer-mpi" "libperformer_mpi.so.$major")"
    # the installed performer, started by mpirun with 2 ranks, starts the installed performer-mpi
    v=$(env -u LD_LIBRARY_PATH timeout 60 mpirun --allow-run-as-root --oversubscribe -np 2 \
        "$S/usr/local/bin/performer" --version 2>&1 || true)
    case "$v" in *"MPI build"*", 2 ranks;"*) ok ;;
        *) fail "mpirun -np 2 (installed) performer --version: $v" ;; esac
fi
# A program against the staged performer_cuda.pc: it links the CUDA runtime as the .pc says and
# runs (without a GPU it says so). The sysroot prefixes the toolkit's own -I and -L too, so they
# are given again as they are.
if [ -n "$cuda" ]; then
    cat >"$T/cuda_example.c" <<'EOF'
#include <stdio.h>

#include <cuda_runtime_api.h>
#include <performer_cuda.h>

int main(void) {
    const int n = pf_cuda_device_count();
    if (n == 0) {
        printf("no GPU: %s\n", pf_cuda_last_error());
        return 0;
    }
    pf_cuda_ctx *ctx;
    pf_status st = pf_cuda_ctx_create(&ctx, 0);
    void *p = NULL;
    if (st == PF_OK && cudaMalloc(&p, 64) != cudaSuccess) st = PF_ENOMEM;
    cudaFree(p);
    pf_cuda_ctx_free(ctx);
    printf("%d GPU(s): %s\n", n, pf_status_str(st));
    return st == PF_OK ? 0 : 1;
}
EOF
    ch=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
    if (cd "$T" && cc -O2 -o cuda_staged cuda_example.c $(pkg-config --cflags --libs performer_cuda) \
            -I"$ch/include" -L"$ch/lib64" -Wl,-rpath,"$L" $san) >"$T/cuda_staged.log" 2>&1; then
        ok
        check "cuda_staged needs libperformer_cuda.so.$major" sh -c \
            "readelf -d '$T/cuda_staged' | grep -q 'NEEDED.*\[libperformer_cuda.so.$major\]'"
        if out=$(env -u LD_LIBRARY_PATH "$T/cuda_staged" 2>&1); then
            ok; echo "  cuda_staged: $out"
        else
            fail "cuda_staged: $out"
        fi
    else
        fail "cc against the staged performer_cuda.pc"; cat "$T/cuda_staged.log"
    fi
    same "pkg-config --modversion performer_cuda" "$version" \
        "$(pkg-config --modversion performer_cuda)"
fi
unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR

# The installed tool: linked to the shared library, which it finds beside it, in the staged tree
# ($ORIGIN/../lib), without LD_LIBRARY_PATH.
check_tool "$S/usr/local/bin/performer" "$L"

# The man page: no formatter warnings (-ww: all of them), and every option the help has.
M=$S/usr/local/share/man/man1/performer.1
same "groff -ww -man warnings" "" "$(groff -ww -man -Tutf8 "$M" 2>&1 >/dev/null)"
if command -v man >/dev/null 2>&1; then
    same "man --warnings -l warnings" "" "$(MANPAGER=cat man --warnings -l "$M" 2>&1 >/dev/null)"
fi
groff -man -Tascii -rLL=1000n -P-cbou "$M" 2>/dev/null >"$T/man.txt"
check "the man page has a NAME line" grep -q "performer - fast attention" "$T/man.txt"
commands=$("$P" --help | sed -n '/^commands:/,/^$/p' | awk 'NF && !/:$/ { print $1 }')
check "--help lists commands" test -n "$commands"
for c in $commands; do
    check "man page: section for $c" grep -q "^PERFORMER $(echo "$c" | tr a-z A-Z)\$" "$T/man.txt"
    for opt in $("$P" "$c" --help | grep -o -- '--[a-z][a-z0-9-]*' | sort -u); do
        check "man page: performer $c $opt" grep -q -- "$opt\\b" "$T/man.txt"
    done
done

# make uninstall: the installed files go, the others stay.
mk uninstall DESTDIR="$S" PREFIX=/usr/local LDCONFIG="echo ldconfig ran" >"$T/uninstall.log" 2>&1 ||
    { cat "$T/uninstall.log"; fail "make uninstall DESTDIR"; }
same "what is left after make uninstall" \
    "./usr/local/lib/libother.so ./usr/local/share/man/man1/other.1" \
    "$(cd "$S" && find . ! -type d | sort | xargs)"
check "no ldconfig with DESTDIR (uninstall)" sh -c "! grep -q 'ldconfig ran' '$T/uninstall.log'"

# 2. A real install into a temporary PREFIX: the .pc's paths are the real ones.
R=$T/prefix
mk install PREFIX="$R" LDCONFIG="echo ldconfig ran" >"$T/install3.log" 2>&1 ||
    { cat "$T/install3.log"; fail "make install PREFIX"; exit 1; }
# $R/lib is not a folder the dynamic linker searches: no ldconfig (it would do nothing for it),
# and the install says how programs find the library instead; as root or not
check "no ldconfig for a LIBDIR off the linker's path" \
    sh -c "! grep -q 'ldconfig ran' '$T/install3.log'"
if [ "$(id -u)" -eq 0 ]; then
    check "the install says $R/lib is off the linker's path" \
        grep -q "$R/lib is not on the dynamic linker's path.*-Wl,-rpath,$R/lib" "$T/install3.log"
fi
check "the install says what it installed" grep -q "^installed under $R: the performer tool" \
    "$T/install3.log"
if [ -n "$mpi" ]; then
    check "... the MPI library with it" grep -q "^installed under.*libperformer_mpi.*mpicc was found" \
        "$T/install3.log"
fi
if [ -n "$cuda" ]; then
    check "... the CUDA library with it" grep -q "^installed under.*libperformer_cuda.*nvcc was found" \
        "$T/install3.log"
fi
check_tool "$R/bin/performer" "$R/lib"
export PKG_CONFIG_PATH="$R/lib/pkgconfig"
libdir=$(pkg-config --variable=libdir performer)
same "the .pc's libdir" "$R/lib" "$libdir"
same "pkg-config --libs" "-L$R/lib -lperformer" "$(pkg-config --libs performer | xargs)"
# $R/lib is not on the dynamic linker's path, as /usr/local/lib is (after ldconfig): an rpath.
if build_example example_prefix -Wl,-rpath,"$libdir"; then
    check_example example_prefix
fi
if [ -n "$mpi" ]; then
    # no sysroot here: the .pc alone (performer's and MPI's through Requires) is enough for cc
    same "performer_mpi.pc's libdir" "$R/lib" "$(pkg-config --variable=libdir performer_mpi)"
    if (cd "$T" && cc -O2 -o mpi_prefix mpi_example.c $(pkg-config --cflags --libs performer_mpi) \
            -Wl,-rpath,"$libdir" -lm $san) >"$T/mpi_prefix.log" 2>&1; then
        ok
        run_mpi mpi_prefix
    else
        fail "cc against the installed performer_mpi.pc"; cat "$T/mpi_prefix.log"
    fi
fi
if [ -z "$san" ]; then
    # pkg-config --static adds Libs.private: OpenBLAS, OpenMP, zlib, libm.
    line=$(printf '%s' "$build_line" | sed 's/-o example /-static -o example_static /;
                                            s/--cflags --libs/--cflags --libs --static/')
    if (cd "$T" && eval "$line") >"$T/static.log" 2>&1; then
        ok
        check "example_static is static" sh -c "! readelf -d '$T/example_static' | grep -q NEEDED"
        check_example example_static
    else
        fail "static link: $line"; cat "$T/static.log"
    fi
fi

# 3. C++ against the installed header and library.
cat >"$T/cxx.cc" <<'EOF'
// Exact attention with Q = 0: every key gets the same weight, so each output row is the mean
// of V's rows.
#include <cmath>
#include <cstdio>
#include <vector>

#include <performer.h>

int main() {
    const int L = 5, d = 3;
    pf_shape shape = {1, 1, L, L, d, d};
    std::vector<float> Q(L * d, 0.0f), K(L * d), V(L * d), out(L * d);
    for (int i = 0; i < L * d; i++) {
        K[i] = 0.1f * i;
        V[i] = float(i % 7);
    }
    pf_attn_opts opts = pf_attn_opts_default();
    pf_status st = pf_attn_exact(out.data(), nullptr, Q.data(), K.data(), V.data(), &shape, &opts);
    if (st != PF_OK) {
        std::printf("pf_attn_exact: %s\n", pf_status_str(st));
        return 1;
    }
    for (int c = 0; c < d; c++) {
        double mean = 0;
        for (int j = 0; j < L; j++) mean += V[j * d + c] / double(L);
        for (int i = 0; i < L; i++) {
            if (std::fabs(out[i * d + c] - mean) > 1e-5 + 1e-5 * std::fabs(mean)) {
                std::printf("out[%d][%d] = %g, expected %g\n", i, c, out[i * d + c], mean);
                return 1;
            }
        }
    }
    std::printf("C++: performer %s: ok\n", pf_version());
    return 0;
}
EOF
if (cd "$T" && g++ -std=c++11 -Wall -Wextra -pedantic -Werror -o cxx cxx.cc \
        $(pkg-config --cflags --libs performer) -Wl,-rpath,"$libdir" $san) >"$T/cxx.log" 2>&1; then
    ok
    same "the C++ program" "C++: performer $version: ok" \
        "$(env -u LD_LIBRARY_PATH "$T/cxx" 2>&1 || true)"
else
    fail "g++ against the installed header"; cat "$T/cxx.log"
fi
unset PKG_CONFIG_PATH
mk uninstall PREFIX="$R" LDCONFIG=true >/dev/null 2>&1 || fail "make uninstall PREFIX"
same "nothing left after make uninstall PREFIX" "" "$(cd "$R" && find . ! -type d)"

# 4. The README's link lines for build/ without installing (the section before Install).
sed -n '/^Programs built against `build\/`/,/^## Install/p' README.md |
    sed -n '/^```sh$/,/^```$/p' | sed '1d;$d' >"$T/intree.sh"
check "README has the build/ link lines" grep -q -- '-Lbuild -lperformer' "$T/intree.sh"
# In this test: BUILD for build/, files in $T; each cc writes its own program.
sed -e "s#\"\$PWD/build\"#\"$build\"#g" -e "s#-Lbuild #-L$build #g" \
    -e "s#build/libperformer#$build/libperformer#g" -e "s#-Iinclude#-I$root/include#g" \
    -e "s# -lm\$# -lm $san#" "$T/intree.sh" |
    awk '/-o example / { n++; sub(/-o example /, "-o example_intree" n " ") } { print }' \
    >"$T/intree_run.sh"
if (cd "$T" && sh -e intree_run.sh) >"$T/intree.log" 2>&1; then ok; else
    fail "the README's build/ link lines"; cat "$T/intree_run.sh" "$T/intree.log"
fi
for n in 1 2; do
    if [ -x "$T/example_intree$n" ]; then check_example "example_intree$n"; else
        fail "no example_intree$n"; fi
done

# 5. Install folders with a space or a tab are refused before anything is touched: the recipes
# use them unquoted, and make uninstall PREFIX="/a b" once removed the file /a (and x/... here).
mkdir -p "$T/ws" && echo keep >"$T/ws/some"
before=$(cd "$root" && ls -A)
for args in "PREFIX=$T/ws/some dir x" "DESTDIR=$T/ws/some	x"; do
    for goal in uninstall install; do
        rc=0
        out=$(mk "$goal" "$args" LDCONFIG=true 2>&1) || rc=$?
        same "make $goal '$args': exit status" 2 "$rc"
        case $out in *"must not contain spaces or tabs"*"nothing was installed or removed"*) ok ;;
            *) fail "make $goal '$args': $out" ;; esac
    done
done
same "the file whose name began the path is untouched" keep "$(cat "$T/ws/some")"
same "nothing made beside it" "some" "$(ls -A "$T/ws")"
same "nothing made in the source tree" "$before" "$(cd "$root" && ls -A)"

# 6. The CMake package, from staged installs: the package's paths are relative to its own folder,
# so found in a stage it names the stage's files. One install has the default layout; another
# moves LIBDIR, INCLUDEDIR and CMAKEDIR, so that each of the package's relative paths is tried
# (on Debian, find_package does not look in lib64: its CMAKEDIR is share/cmake/performer).
if command -v cmake >/dev/null 2>&1; then
    CPRE=/opt/performer
    C=$T/cmake-stage                 # the default layout
    M=$T/cmake-moved                 # the folders moved
    moved="LIBDIR=$CPRE/lib64 INCLUDEDIR=$CPRE/include/pf CMAKEDIR=$CPRE/share/cmake/performer"
    # the consumers' builds run make too: the calling make's flags and jobserver are not theirs
    cm() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL "$@"; }
    # cm_project NAME LANGUAGE FIND BODY: $T/cm/NAME/CMakeLists.txt, find_package(performer FIND)
    cm_project() {
        mkdir -p "$T/cm/$1"
        printf '%s\n' "cmake_minimum_required(VERSION 3.19)" "project($1 $2)" \
            "find_package(performer $3)" \
            'message(STATUS "performer ${performer_VERSION} found")' "$4" \
            >"$T/cm/$1/CMakeLists.txt"
    }
    # cm_configure NAME STAGE: configures $T/cm/NAME with CMAKE_PREFIX_PATH in STAGE; its
    # programs are to be written to $T
    cm_configure() {
        cm cmake -S "$T/cm/$1" -B "$T/cm/$1/build" -DCMAKE_PREFIX_PATH="$2$CPRE" \
            -DCMAKE_RUNTIME_OUTPUT_DIRECTORY="$T" -DCMAKE_C_FLAGS="$san" \
            -DCMAKE_CXX_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san" >"$T/cm_$1.log" 2>&1
    }
    # cm_build NAME STAGE: configures and builds it
    cm_build() {
        if cm_configure "$1" "$2" && cm cmake --build "$T/cm/$1/build" >>"$T/cm_$1.log" 2>&1
        then ok; else
            fail "the CMake project $1:"; cat "$T/cm/$1/CMakeLists.txt" "$T/cm_$1.log"; return 1
        fi
    }
    # cm_refused NAME KEYWORD: configuring NAME (default layout) fails, saying KEYWORD
    cm_refused() {
        if cm_configure "$1" "$C"; then
            fail "CMake project $1 was configured: $(cat "$T/cm/$1/CMakeLists.txt")"
        elif ! tr -s ' \n' ' ' <"$T/cm_$1.log" | grep -q -- "$2"; then
            fail "CMake project $1: no '$2' in: $(cat "$T/cm_$1.log")"
        else
            ok
        fi
    }
    minor=${version#*.}; minor=${minor%%.*}
    want="$major.$minor"
    mk install DESTDIR="$C" PREFIX=$CPRE LDCONFIG=true >"$T/cm_install.log" 2>&1 ||
        { cat "$T/cm_install.log"; fail "make install DESTDIR=$C PREFIX=$CPRE"; }
    mk install DESTDIR="$M" PREFIX=$CPRE $moved LDCONFIG=true >"$T/cm_install2.log" 2>&1 ||
        { cat "$T/cm_install2.log"; fail "make install DESTDIR=$M PREFIX=$CPRE $moved"; }
    mkdir -p "$T/cm"
    cp "$T/example.c" "$T/cxx.cc" "$T/cm/"

    # C: the shared library, the static one; the moved layout
    cm_project c C "$want REQUIRED" '
add_executable(cmake_c ../example.c)
target_link_libraries(cmake_c PRIVATE performer::performer m)
add_executable(cmake_static ../example.c)
target_link_libraries(cmake_static PRIVATE performer::performer_static m)'
    if cm_build c "$C"; then
        check "find_package gives version $version" \
            grep -q "performer $version found" "$T/cm_c.log"
        check_example cmake_c
        check "cmake_c needs libperformer.so.$major" \
            sh -c "readelf -d '$T/cmake_c' | grep -q 'NEEDED.*\[libperformer.so.$major\]'"
        check_example cmake_static
        check "cmake_static holds the library (needs no libperformer)" \
            sh -c "! readelf -d '$T/cmake_static' | grep -q 'NEEDED.*libperformer'"
    fi
    cm_project moved C "$want REQUIRED" '
get_target_property(inc performer::performer INTERFACE_INCLUDE_DIRECTORIES)
get_target_property(lib performer::performer IMPORTED_LOCATION)
message(STATUS "performer: ${inc} ${lib}")
add_executable(cmake_moved ../example.c)
target_link_libraries(cmake_moved PRIVATE performer::performer m)'
    if cm_build moved "$M"; then
        check "performer::performer names the moved folders" grep -q \
            "performer: $M$CPRE/include/pf $M$CPRE/lib64/libperformer.so.$version\$" \
            "$T/cm_moved.log"
        check_example cmake_moved
    fi
    # C++17
    cm_project cxx CXX "$want REQUIRED" '
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
add_executable(cmake_cxx ../cxx.cc)
target_compile_options(cmake_cxx PRIVATE -Wall -Wextra -pedantic -Werror)
target_link_libraries(cmake_cxx PRIVATE performer::performer)'
    if cm_build cxx "$C"; then
        same "the C++17 program (CMake)" "C++: performer $version: ok" \
            "$(env -u LD_LIBRARY_PATH "$T/cmake_cxx" 2>&1 || true)"
    fi
    # MPI and CUDA where installed; refused, saying why, where not
    if [ -n "$mpi" ]; then
        cp "$T/mpi_example.c" "$T/cm/"
        cm_project mpi C "$want REQUIRED COMPONENTS mpi" '
add_executable(cmake_mpi ../mpi_example.c)
target_link_libraries(cmake_mpi PRIVATE performer::performer_mpi m)'
        if cm_build mpi "$C"; then
            check "cmake_mpi needs libperformer_mpi.so.$major" sh -c \
                "readelf -d '$T/cmake_mpi' | grep -q 'NEEDED.*\[libperformer_mpi.so.$major\]'"
            run_mpi cmake_mpi
        fi
    else
        cm_project nompi C "REQUIRED COMPONENTS mpi" ""
        cm_refused nompi "component mpi: libperformer_mpi is not installed"
    fi
    if [ -n "$cuda" ]; then
        cp "$T/cuda_example.c" "$T/cm/"
        cm_project cuda C "$want REQUIRED COMPONENTS cuda" '
add_executable(cmake_cuda ../cuda_example.c)
target_link_libraries(cmake_cuda PRIVATE performer::performer_cuda)'
        if cm_build cuda "$C"; then
            if out=$(env -u LD_LIBRARY_PATH "$T/cmake_cuda" 2>&1); then
                ok; echo "  cmake_cuda: $out"
            else
                fail "cmake_cuda: $out"
            fi
        fi
    else
        cm_project nocuda NONE "REQUIRED COMPONENTS cuda" ""
        cm_refused nocuda "component cuda: libperformer_cuda is not installed"
    fi
    # The version rule (CMake's SameMajorVersion, as the soname's): the next major and the next
    # minor are refused, a range around this version is taken; an unknown component is refused.
    cm_project v_major NONE "$((major + 1)).0 REQUIRED" ""
    cm_refused v_major "compatible with requested version \"$((major + 1)).0\""
    cm_project v_minor NONE "$major.$((minor + 1)) REQUIRED" ""
    cm_refused v_minor "compatible with requested version \"$major.$((minor + 1))\""
    cm_project v_range NONE "$want...<$((major + 1)) REQUIRED" ""
    if cm_configure v_range "$C" && grep -q "performer $version found" "$T/cm_v_range.log"
    then ok; else fail "find_package(performer $want...<$((major + 1))): $(cat "$T/cm_v_range.log")"
    fi
    cm_project v_comp NONE "$want REQUIRED COMPONENTS nonesuch" ""
    cm_refused v_comp "component nonesuch: no such component"

    mk uninstall DESTDIR="$C" PREFIX=$CPRE LDCONFIG=true >"$T/cm_uninstall.log" 2>&1 ||
        { cat "$T/cm_uninstall.log"; fail "make uninstall DESTDIR=$C PREFIX=$CPRE"; }
    mk uninstall DESTDIR="$M" PREFIX=$CPRE $moved LDCONFIG=true >"$T/cm_uninstall2.log" 2>&1 ||
        { cat "$T/cm_uninstall2.log"; fail "make uninstall DESTDIR=$M PREFIX=$CPRE $moved"; }
    same "nothing left after make uninstall (CMake layouts)" "" \
        "$(cd "$T" && find cmake-stage cmake-moved ! -type d)"
    check "make uninstall removes the package's folder" \
        test ! -d "$C$CPRE/lib/cmake/performer" -a ! -d "$M$CPRE/share/cmake/performer"
else
    echo "note: no cmake (scripts/setup.sh installs it): the CMake package is not checked"
fi

echo "test_install: $checks checks, $fails failed"
[ "$fails" -eq 0 ]
