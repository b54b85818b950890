#!/usr/bin/env bash
# Fuzz cyattn's public API for a bounded time with atheris (libFuzzer for Python) and fail on
# the first contract violation, crash, hang or memory blow-up:
#
#   1. atheris: imported from the current environment, or pip installed (pinned) if missing;
#   2. the cyattn that `python` imports (an installed one, or PYTHONPATH=src for an in-place
#      build) is reported with its kernel variants;
#   3. fuzz/fuzz_api.py runs single-process for SECONDS (default 60) from a scratch copy of the
#      seed corpus fuzz/corpus/ (new inputs go to the copy, never into the checkout), with a
#      per-input time limit (a hang fails) and an RSS limit; libFuzzer's final statistics give
#      the number of executions.
#
# Usage: tools/fuzz_check.sh [SECONDS]
# Environment:
#   PYTHON            interpreter (default python3); cyattn must be importable by it
#   FUZZ_TIMEOUT      seconds one input may take before it counts as a hang (default 30)
#   FUZZ_RSS_MB       RSS limit in MB (default 4096)
#   FUZZ_ARGS         extra libFuzzer flags, e.g. "-seed=1234"
#   FUZZ_ARTIFACTS    folder for crash/timeout/oom inputs (default: a new folder under /tmp,
#                     removed when the run passes, kept and printed when it fails)
#   FUZZ_KEEP_CORPUS  folder to keep the grown corpus in (to merge new inputs into fuzz/corpus
#                     by hand: python fuzz/fuzz_api.py -merge=1 fuzz/corpus FOLDER)
#   CYATTN_FUZZ_AVOID known-bug tags the decoder stops generating (see fuzz/checks_common.py)
# A failing input is replayed and explained without atheris by
#   python fuzz/api_checks.py ARTIFACT
# Exit status: 0 when the run finished without a failure, 1 otherwise (the step is named).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-60}
py=${PYTHON:-python3}
check_name=fuzz_check
# shellcheck source=tools/_steps.sh
source "$root/tools/_steps.sh"
case "$seconds" in
    -h|--help) print_help; exit 0 ;;
    ''|*[!0-9]*) usage_error "SECONDS must be a positive integer, got '$seconds'" ;;
esac
[ "$seconds" -gt 0 ] || usage_error "SECONDS must be positive"
# atheris 3.0.0 is the newest release the package index serves here (cp38-cp312 manylinux
# wheels that bundle libFuzzer, so no clang is needed); a source build would need clang and
# libFuzzer.
atheris_pin=atheris==3.0.0
work=$(mktemp -d "${TMPDIR:-/tmp}/cyattn-fuzz.XXXXXX")

# ---------------------------------------------------------------------------------------------
step "atheris"
if ! "$py" -c "import atheris" 2>/dev/null; then
    echo "atheris is not installed in $("$py" -c 'import sys; print(sys.prefix)'); installing $atheris_pin"
    "$py" -m pip install --quiet --disable-pip-version-check "$atheris_pin" ||
        fail "pip install $atheris_pin (a Python without an atheris wheel needs clang + libFuzzer)"
fi
"$py" -c "import importlib.metadata as m; print('atheris', m.version('atheris'))"

step "cyattn under test"
"$py" -c "import cyattn; c = cyattn.config(); print('cyattn', c['version'], 'from', cyattn.__file__); print('variants:', ', '.join(c['available_variants']), '(loaded:', c['variant'] + ')')" ||
    fail "cyattn is not importable by $py"

# ---------------------------------------------------------------------------------------------
step "fuzz for ${seconds}s (single process)"
art=${FUZZ_ARTIFACTS:-$work/artifacts}
mkdir -p "$art" "$work/corpus"
art=$(cd "$art" && pwd)
seeds=$(find "$root/fuzz/corpus" -type f | wc -l)
echo "seed corpus: $seeds inputs in fuzz/corpus; new inputs go to a scratch copy"
[ -z "${CYATTN_FUZZ_AVOID:-}" ] || echo "CYATTN_FUZZ_AVOID=$CYATTN_FUZZ_AVOID (known bugs not generated)"
rc=0
# shellcheck disable=SC2086  # FUZZ_ARGS is a list of flags
"$py" "$root/fuzz/fuzz_api.py" "$work/corpus" "$root/fuzz/corpus" \
    -max_total_time="$seconds" -timeout="${FUZZ_TIMEOUT:-30}" -rss_limit_mb="${FUZZ_RSS_MB:-4096}" \
    -max_len=2048 -print_final_stats=1 -artifact_prefix="$art/" ${FUZZ_ARGS:-} \
    > "$work/fuzz.log" 2>&1 || rc=$?
grep -E "^INFO: Seed:|INITED|DONE" "$work/fuzz.log" || true
grep -E "^stat::" "$work/fuzz.log" || true
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log" | tail -1)
# crash-, timeout- and oom- files are failures; slow-unit- files (> 10 s) are only reported
crashes=$(find "$art" -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) | wc -l)
slow=$(find "$art" -type f -name 'slow-unit-*' | wc -l)
[ "$slow" -eq 0 ] || echo "note: $slow input(s) took more than 10 s (libFuzzer slow-unit files in $art)"
if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    echo "---- last lines of the libFuzzer log"
    tail -60 "$work/fuzz.log"
    for f in "$art"/*; do
        [ -f "$f" ] || continue
        echo "---- $f"
        "$py" "$root/fuzz/api_checks.py" "$f" || true
    done
    if [ -z "${FUZZ_ARTIFACTS:-}" ]; then
        kept=$(mktemp -d "${TMPDIR:-/tmp}/cyattn-fuzz-artifacts.XXXXXX")
        cp -p "$art"/* "$kept"/ 2>/dev/null || true
        art=$kept
    fi
    fail "the fuzzer stopped with exit $rc after ${execs:-?} executions; failing inputs kept in $art"
fi
[ -n "$execs" ] || fail "no final statistics in the libFuzzer log"
if [ -n "${FUZZ_KEEP_CORPUS:-}" ]; then
    mkdir -p "$FUZZ_KEEP_CORPUS"
    cp -p "$work"/corpus/* "$FUZZ_KEEP_CORPUS"/ 2>/dev/null || true
    echo "grown corpus kept in $FUZZ_KEEP_CORPUS"
fi
echo "fuzz_check: $execs executions in ${seconds}s, no failure ($(find "$work/corpus" -type f | wc -l) new inputs)"
