#!/bin/sh
# run_aarch64.sh BUILD TESTS...: runs the aarch64 test programs BUILD/tests/NAME (cross-built by
# `make test-aarch64`) under qemu-user (those named in PER_PATH on every vector path the emulated
# CPU runs, by PF_SIMD), then the tool's --version and its end-to-end tests; prints one line per
# run and "aarch64: N passed, N failed" (counts in BUILD/test-counts). Exit 1 on a failure.
#
# The programs run on Debian's arm64 libraries (libc6:arm64, libopenblas0-openmp:arm64, found
# through the multiarch loader /lib/ld-linux-aarch64.so.1), not with QEMU_LD_PREFIX set to the
# cross toolchain's /usr/aarch64-linux-gnu: that tree's libc is another build than libc6:arm64,
# and a loader and libc of different builds hang the first pthread_create (OpenMP's threads).
build=${1:?build folder}
shift
qemu=${QEMU_AARCH64:-qemu-aarch64}
unset QEMU_LD_PREFIX
log="$build/test-logs"
mkdir -p "$log"
pass=0
fail=0
run() { # name log-suffix command...
    name=$1 suffix=$2
    shift 2
    start=$(date +%s)
    if timeout 300 "$@" >"$log/$name$suffix.log" 2>&1; then
        pass=$((pass + 1)); echo "  ok    $name$suffix ($(($(date +%s) - start)) s)"
    else
        fail=$((fail + 1)); echo "  FAIL  $name$suffix (log: $log/$name$suffix.log)"
        tail -n 20 "$log/$name$suffix.log" | sed 's/^/        /'
    fi
}
paths=$(for p in ${PF_SIMD_PATHS:-neon ref}; do
    PF_SIMD=$p "$qemu" "$build/performer" --version 2>/dev/null |
        grep -q "vector kernels: $p[;)]" && echo $p
done)
echo "  (emulated by $("$qemu" --version | head -n 1); vector paths: $(echo ${paths:-ref}))"
# Programs that test every vector path themselves (test_simd, test_blas) run once; those named
# in PER_PATH once on each path.
for name in "$@"; do
    case " ${PER_PATH-} " in
        *" $name "*) for p in ${paths:-ref}; do
                run "$name" ".$p" env PF_SIMD="$p" "$qemu" "$build/tests/$name"
            done ;;
        *) run "$name" "" "$qemu" "$build/tests/$name" ;;
    esac
done
run performer_version "" "$qemu" "$build/performer" --version
# The tool's end-to-end tests (tests/test_tool.sh: numpy's formulas against the aarch64 tool, its
# refusals and files) through a wrapper that runs it under qemu; the demo's checks, about native
# timings, are left out (PF_TOOL_EMULATED).
wrap="$build/performer-qemu"
printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$(command -v "$qemu")" "$(cd "$build" && pwd)/performer" \
    >"$wrap" && chmod +x "$wrap"
run test_tool "" env PERFORMER="$wrap" PF_TOOL_ARCH=aarch64 PF_TOOL_EMULATED=1 \
    BUILD="$build" sh tests/test_tool.sh
echo "$pass $fail" >"$build/test-counts"
echo "aarch64: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
