# lib.sh: what the end-to-end tests share. A test sets TEST (its name) and sources this file:
#
#   TEST=test_x; . "$(dirname "$0")/lib.sh"
#
# It gives P (the performer binary: $PERFORMER, default build/performer, made absolute), PY
# (/usr/bin/python3, which has numpy), T (a scratch folder removed at exit, even a read-only
# one), pass and fail (counted; fail prints its message), and finish, which prints
# "TEST: N checks, M failed" and fails if any check did. Checks do not stop the test: every
# one runs.
P=${PERFORMER:-build/performer}
case "$P" in /*) ;; *) P="$(pwd)/$P" ;; esac
PY=/usr/bin/python3
checks=0
fails=0

T=$(mktemp -d "${TMPDIR:-/tmp}/pf_$TEST.XXXXXX") || { echo "mktemp failed"; exit 1; }
cleanup() { chmod -R u+w "$T" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
trap 'exit 1' INT TERM

pass() { checks=$((checks + 1)); }
fail() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }
finish() {
    echo "$TEST.sh: $checks checks, $fails failed"
    [ "$fails" -eq 0 ]
}

if [ ! -x "$P" ]; then echo "FAIL: no performer binary at $P"; exit 1; fi
