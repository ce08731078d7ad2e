#!/bin/sh
# test_readme.sh: README.md runs as written. Every fenced block marked sh, bash or shell and
# every c block is taken from README.md, in order, and run as a reader pasting it would.
#
#   PERFORMER=build/performer BUILD=build sh tests/test_readme.sh
#
# Conventions (README.md says them in one comment near its top):
# - Shell blocks run one after the other in ONE scratch folder that looks like the repository's
#   root: every top-level entry is a symlink to the real one, except `build`, a symlink to BUILD.
#   So `build/performer`, `scripts/...`, `make ...` work as written, and whatever a block writes
#   (q.npy, runs/, approx-out/, example) lands in the scratch folder. Each block runs under
#   `sh -ex` with a time limit (PF_README_TIMEOUT, 300 s); a failure prints the block's README
#   lines and the tail of its trace and stderr. HOME is a folder in the scratch (so
#   `make install PREFIX=$HOME/.local` installs there) and PKG_CONFIG_PATH and CMAKE_PREFIX_PATH
#   point into it, as the README tells a reader who installed there; BUILD, PERFORMER and
#   MAKEFLAGS (a calling make's) are dropped (a reader has none) and LDCONFIG=true (no root
#   install touches the system).
# - A block preceded directly by the line `<!-- not run: REASON -->` is not run: only for what
#   cannot run here (root, or the top-level commands that CI runs itself). Its commands must
#   still exist: each `make TARGET` must pass `make -n TARGET`, each `sh FILE` must be a file,
#   each other program must be on PATH.
# - Smaller settings: SUBST below maps README text to what the test runs (literal, in every
#   shell block), e.g. 1000 training steps to 2. A rule that matches nothing fails, so the table
#   cannot go stale.
# - A c block whose first line is `/* NAME.c: ...` is saved as NAME.c in the scratch folder
#   before any block runs (the README refers to example.c before it shows it).
# - A c block with `main` is compiled against BUILD (the static library, the Makefile's LDLIBS,
#   -Wall -Wextra -Werror) and run. The blocks without `main` are fragments: all of them, in
#   order, are joined into one main() after a prelude here that declares what they take from
#   their caller (L and the tensors), then compiled and run; the outputs must be finite.
# Under a sanitizer build nothing runs (the README's link lines do not name the sanitizers).
# No `set -e`: every check runs, failures are counted, exit 1 if any.

TEST=test_readme; . "$(dirname "$0")/lib.sh"

BUILD=${BUILD:-build}
root=$(pwd)
case "$BUILD" in /*) build=$BUILD ;; *) build=$root/$BUILD ;; esac
timeout_s=${PF_README_TIMEOUT:-300}

if [ ! -f README.md ] || [ ! -f "$build/libperformer.a" ]; then
    fail "no README.md here or no $build/libperformer.a (run from the repository root)"
    finish
    exit
fi
if nm "$build/libperformer.a" 2>/dev/null | grep -q '__asan_\|__ubsan_'; then
    echo "note: sanitizer build ($BUILD): the README's commands are for the plain build; not run"
    finish
    exit
fi

# The smaller settings: README text => what the test runs, and why.
#   approx: `--all` takes 30 s to minutes, `real` half a minute; --quick runs every experiment at
#     tiny sizes.
#   train: 1000 steps take minutes; 2 steps of 2 windows, one validation batch, write the same
#     files (checkpoint, log, curves) for `performer sample`.
#   DESTDIR=/tmp/stage: a fixed path every run on the machine would share; here in the scratch.
#   pkg-config's link line: the README's example assumes the root install (not run here); the
#     test installed into $HOME/.local instead and, as the README says for that PREFIX, adds an
#     rpath (PKG_CONFIG_PATH is set for every block).
SUBST='approx --all --out => approx --all --quick --out
approx real --out => approx real --quick --out
--draws 30 --out => --draws 3 --quick --out
--steps 1000 => --steps 2 --batch 2 --eval-batches 1
--steps 300 --lr 5e-4 => --steps 2 --batch 2 --eval-batches 1 --lr 5e-4
DESTDIR=/tmp/stage => DESTDIR=$PWD/stage
performer) -lm => performer) -lm -Wl,-rpath,$(pkg-config --variable=libdir performer)'

# ---- the blocks ---------------------------------------------------------------------------------
# $T/blocks/NNN.sh or NNN.c: the block's text; $T/blocks/list: "NNN KIND FIRST_LINE SKIP_REASON",
# FIRST_LINE the README line of the block's first line.
mkdir -p "$T/blocks"
awk -v dir="$T/blocks" '
    !inblk && /^```/ {
        lang = $0; sub(/^```[ \t]*/, "", lang); sub(/[ \t].*$/, "", lang)
        kind = (lang == "sh" || lang == "bash" || lang == "shell") ? "sh" : ""
        if (lang == "c") kind = "c"
        inblk = 1
        if (kind != "") {
            n++
            file = sprintf("%s/%03d.%s", dir, n, kind)
            printf "" >file
            skip = "-"
            if (prev ~ /^<!-- not run: .* -->[ \t]*$/) {
                skip = prev; sub(/^<!-- not run: /, "", skip); sub(/ -->[ \t]*$/, "", skip)
            }
            printf "%03d %s %d %s\n", n, kind, NR + 1, skip >(dir "/list")
        }
        prev = $0
        next
    }
    inblk && /^```[ \t]*$/ { inblk = 0; if (kind != "") close(file); kind = ""; prev = $0; next }
    inblk && kind != "" { print >file }
    { prev = $0 }
' README.md
touch "$T/blocks/list"
nsh=$(awk '$2 == "sh"' "$T/blocks/list" | wc -l)
nc=$(awk '$2 == "c"' "$T/blocks/list" | wc -l)
echo "README.md: $nsh shell blocks, $nc c blocks"
if [ "$nsh" -gt 0 ] && [ "$nc" -gt 0 ]; then pass; else fail "README.md: no sh or no c blocks"; fi

# Apply SUBST to every shell block; each rule must match at least once.
printf '%s\n' "$SUBST" >"$T/subst"
for f in "$T"/blocks/*.sh; do
    [ -f "$f" ] || continue
    awk -v rules="$T/subst" -v hits="$f.hits" '
        BEGIN {
            while ((getline r <rules) > 0) {
                i = index(r, " => "); if (!i) continue
                nr++; from[nr] = substr(r, 1, i - 1); to[nr] = substr(r, i + 4)
            }
        }
        {
            line = $0
            for (k = 1; k <= nr; k++) {
                out = ""
                while ((i = index(line, from[k])) > 0) {
                    out = out substr(line, 1, i - 1) to[k]
                    line = substr(line, i + length(from[k]))
                    hit[k]++
                }
                line = out line
            }
            print line
        }
        END { for (k = 1; k <= nr; k++) if (hit[k]) print from[k] >hits }
    ' "$f" >"$f.run"
done
while IFS= read -r rule; do
    from=${rule%% => *}
    if cat "$T"/blocks/*.hits 2>/dev/null | grep -qxF -- "$from"; then pass; else
        fail "SUBST rule '$from' matches no shell block of README.md (stale: update the table)"
    fi
done <"$T/subst"

# ---- the scratch folder: the repository's root as a reader sees it ------------------------------
S=$T/scratch
mkdir -p "$S" "$T/home"
for e in "$root"/*; do
    name=$(basename "$e")
    case $name in build | build-*) continue ;; esac
    ln -s "$e" "$S/$name"
done
ln -s "$build" "$S/build"
# Files the README names in a c block's first line, saved before any block runs.
for f in "$T"/blocks/*.c; do
    [ -f "$f" ] || continue
    name=$(sed -n '1s|^/\* *\([A-Za-z0-9_.-]*\.c\):.*|\1|p' "$f")
    [ -n "$name" ] && cp "$f" "$S/$name"
done

# readme_env CMD...: CMD in the scratch, with the environment a reader has: not this test's
# BUILD and PERFORMER (make would take BUILD from it), nor a calling make's variables; LDCONFIG
# (the Makefile's) is `true`, so that an install as root leaves the system's library cache alone.
readme_env() {
    (cd "$S" && env -u BUILD -u PERFORMER -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MAKEOVERRIDES \
        -u LD_LIBRARY_PATH HOME="$T/home" PKG_CONFIG_PATH="$T/home/.local/lib/pkgconfig" \
        CMAKE_PREFIX_PATH="$T/home/.local" LDCONFIG=true "$@")
}

# show_block NNN: the block's README lines, numbered.
show_block() {
    first=$(awk -v n="$1" '$1 == n { print $3 }' "$T/blocks/list")
    ext=$(awk -v n="$1" '$1 == n { print $2 }' "$T/blocks/list")
    awk -v s="$first" '{ printf "    README.md:%d: %s\n", s + NR - 1, $0 }' "$T/blocks/$1.$ext"
}

# check_skipped NNN: each command of a block that is not run still exists.
check_skipped() {
    sed 's/[ \t]#.*$//; s/^#.*$//' "$T/blocks/$1.sh" | tr ';|&' '\n\n\n' |
        sed 's/^[ \t]*//; s/^sudo[ \t][ \t]*//; s/[ \t]*$//' | grep -v '^$' >"$T/skipped.cmds"
    while IFS= read -r cmd; do
        set -f; set -- $cmd; set +f
        prog=$1; shift
        case $prog in
        make)
            targets=""
            for a in "$@"; do case $a in -* | *=*) ;; *) targets="$targets $a" ;; esac; done
            if readme_env make -n $targets >"$T/make-n.log" 2>&1 </dev/null; then
                pass; echo "  make -n$targets: ok"
            else
                fail "README.md:$line (not run): 'make -n$targets' fails:"
                tail -n 5 "$T/make-n.log" | sed 's/^/    /'
            fi ;;
        sh)
            if [ -f "$S/$1" ]; then pass; echo "  $1: a file"; else
                fail "README.md:$line (not run): no file $1"; fi ;;
        *)
            if command -v "$prog" >/dev/null 2>&1 || [ -x "$S/$prog" ]; then
                pass; echo "  $prog: on PATH"
            else
                fail "README.md:$line (not run): no program $prog"; fi ;;
        esac
    done <"$T/skipped.cmds"
}

# ---- shell blocks, in order, in the scratch folder ----------------------------------------------
t0=$(date +%s)
while read -r n kind line reason; do
    [ "$kind" = sh ] || continue
    if [ "$reason" != "-" ]; then
        echo "README.md:$line: not run: $reason; its commands must exist"
        check_skipped "$n"
        continue
    fi
    b0=$(date +%s)
    readme_env timeout -k 10 "$timeout_s" sh -ex "$T/blocks/$n.sh.run" \
        >"$T/blocks/$n.out" 2>"$T/blocks/$n.err" </dev/null
    rc=$?
    echo "README.md:$line: exit $rc, $(($(date +%s) - b0)) s"
    if [ "$rc" -eq 0 ]; then pass; else
        [ "$rc" -eq 124 ] && rc="$rc (timed out after $timeout_s s)"
        fail "README.md:$line: the block exits $rc:"
        show_block "$n"
        if ! cmp -s "$T/blocks/$n.sh" "$T/blocks/$n.sh.run"; then
            echo "  run as (SUBST):"; sed 's/^/    /' "$T/blocks/$n.sh.run"
        fi
        echo "  stdout (tail):"; tail -n 5 "$T/blocks/$n.out" | sed 's/^/    /'
        echo "  trace and stderr (tail):"; tail -n 15 "$T/blocks/$n.err" | sed 's/^/    /'
    fi
done <"$T/blocks/list"
echo "shell blocks: $(($(date +%s) - t0)) s"

# ---- c blocks -----------------------------------------------------------------------------------
C=$T/c
mkdir -p "$C"
ldlibs=$(cd "$root" && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s --no-print-directory \
         --eval='pf-readme-ldlibs: ; @echo $(LDLIBS)' pf-readme-ldlibs 2>/dev/null)
case $ldlibs in *-lopenblas*) pass ;; *) fail "the Makefile's LDLIBS: '$ldlibs'" ;; esac
CFLAGS_README="-std=c11 -D_POSIX_C_SOURCE=200809L -O2 -Wall -Wextra -Werror -I$root/include"

# build_and_run NAME SOURCE WHAT: compile SOURCE into $C/NAME, run it; stdout shown, stderr must
# be empty.
build_and_run() {
    if ! cc $CFLAGS_README -o "$C/$1" "$2" "$build/libperformer.a" $ldlibs >"$C/$1.cc.log" 2>&1
    then
        fail "$3: does not compile:"; sed 's/^/    /' "$C/$1.cc.log" | head -n 30; return
    fi
    pass
    if (cd "$C" && timeout -k 10 "$timeout_s" "./$1") >"$C/$1.out" 2>"$C/$1.err" </dev/null; then
        pass
        sed "s|^|    $1: |" "$C/$1.out" | head -n 5
    else
        fail "$3: exits non-zero:"; tail -n 10 "$C/$1.out" "$C/$1.err" | sed 's/^/    /'
        return
    fi
    if [ -s "$C/$1.err" ]; then fail "$3: writes to stderr:"; sed 's/^/    /' "$C/$1.err"; else
        pass; fi
}

frag_lines=""
while read -r n kind line reason; do
    [ "$kind" = c ] || continue
    if [ "$reason" != "-" ]; then echo "README.md:$line: c block not run ($reason)"; continue; fi
    if grep -q '^int main *(' "$T/blocks/$n.c"; then
        { echo "#line $line \"README.md\""; cat "$T/blocks/$n.c"; } >"$C/prog$n.c"
        build_and_run "prog$n" "$C/prog$n.c" "README.md:$line (c program)"
    else
        # A fragment: its #include lines go to the top, the rest into main().
        grep '^#include' "$T/blocks/$n.c" >>"$C/frag.inc"
        { echo "#line $line \"README.md\""
          sed 's/^#include.*$//' "$T/blocks/$n.c"; } >>"$C/frag.body"
        frag_lines="$frag_lines $line"
    fi
done <"$T/blocks/list"

if [ -n "$frag_lines" ]; then
    # What the fragments take from their caller: a length L and the caller's tensors, shaped as
    # the README's fragments shape them (B = 1, H = 8, d = dv = 64); outputs start as NaN.
    {
        cat <<'EOF'
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
EOF
        sort -u "$C/frag.inc"
        cat <<'EOF'
static float *tensor(size_t n, int seed) {
    float *x = malloc(sizeof(float) * n);
    unsigned s = 2463534242u + (unsigned)seed;
    for (size_t i = 0; x && i < n; i++) {            /* xorshift32, uniform in [-1, 1) */
        s ^= s << 13, s ^= s >> 17, s ^= s << 5;
        x[i] = seed < 0 ? NAN : (float)(s >> 8) / 8388608.0f - 1.0f;
    }
    return x;
}

static int finite_all(const char *name, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) {
            fprintf(stderr, "%s[%zu] = %g after the fragments\n", name, i, x[i]);
            return 0;
        }
    }
    return 1;
}

int main(void) {
    int L = 1000;
    size_t n = (size_t)8 * 1000 * 64;
    float *Q = tensor(n, 1), *K = tensor(n, 2), *V = tensor(n, 3), *dout = tensor(n, 4);
    float *out = tensor(n, -1), *dQ = tensor(n, -1), *dK = tensor(n, -1), *dV = tensor(n, -1);
    if (!Q || !K || !V || !dout || !out || !dQ || !dK || !dV) return 1;
    (void)L;
EOF
        cat "$C/frag.body"
        cat <<'EOF'
#line 1 "test_readme.sh: after the fragments"
    if ((size_t)shape.B * shape.H * shape.Lq * shape.d > n) {
        fprintf(stderr, "the fragments' shape is larger than the prelude's tensors\n");
        return 1;
    }
    int ok = finite_all("out", out, n) && finite_all("dQ", dQ, n) && finite_all("dK", dK, n) &&
             finite_all("dV", dV, n);
    printf("fragments ran: out, dQ, dK, dV finite\n");
    free(Q), free(K), free(V), free(dout), free(out), free(dQ), free(dK), free(dV);
    return ok ? 0 : 1;
}
EOF
    } >"$C/fragments.c"
    build_and_run fragments "$C/fragments.c" "README.md:$frag_lines (c fragments, joined)"
fi

finish
