#!/usr/bin/env bash
# Run a subset of the kernel tests under valgrind memcheck against the normal (unsanitized,
# -O3) build of cyattn, so that invalid reads and writes, uses of uninitialised memory and bad
# frees in the compiled kernels fail the check -- a second opinion next to
# tools/sanitize_check.sh that needs no special build and also sees the shipped code:
#
#   0. control: a read one byte past a NumPy array's buffer (through ctypes) must be reported,
#      with the same valgrind options -- otherwise a clean run below would prove nothing;
#   1. stage a copy of the source tree (tracked files plus new files not ignored by .gitignore)
#      and pip install it, with the test dependencies, into a fresh virtual environment;
#   2. python -m pytest on the subset under valgrind, from a directory that holds only a copy of
#      tests/, with PYTHONMALLOC=malloc (CPython's small-object allocator would hide the Python
#      objects' memory from memcheck and produce false reports), every kernel variant the
#      (virtual) CPU has, and two OpenMP threads.
#
# The subset (default; about 280 tests, ~5 minutes under valgrind): from tests/test_kernels.py,
# the size sweeps (sizes either side of the vector and block widths) of softmax in float32,
# matmul in float32 and float64 (each has its own micro-kernel tile) and attention in float32,
# and the edge-case tests (masks, causal, GQA, empty and zero dims, layouts including
# misaligned buffers, out= and aliasing, NaN/inf, lse) in float64. Child processes are not
# traced; torch is not installed. Valgrind's virtual CPU has no AVX-512, so an avx512 variant
# is not exercised here (tools/sanitize_check.sh runs it).
#
# Suppressions: tools/valgrind-python.supp, for known glibc-loader/glibc/CPython noise only
# (each entry says why); nothing that can match a report whose innermost frame is in cyattn's
# kernels. Leak checking is off: CPython does not free all its memory at exit.
#
# Usage: tools/valgrind_check.sh [--outdir DIR]
#   DIR (default: a new temporary directory, removed at the end) keeps the venv and logs.
# Environment: PYTHON (default python3) for the venv; CYATTN_VALGRIND_PYTEST: pytest arguments
#   (default: the subset above); VALGRIND (default valgrind).
# Exit status: 0 when valgrind reported no error and the tests passed, 1 otherwise.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=""
py=${PYTHON:-python3}
vg=${VALGRIND:-valgrind}
# The default subset; see the header. float16 runs the float32 kernels, so it is left out.
# The four largest attention shapes are left out too: their pure-Python oracle alone takes
# ~4 minutes under valgrind, and smaller shapes already span several query and key blocks.
default_subset='tests/test_kernels.py -k "not large and not L130S66 and not L66S130 and not L129S9E and not L129S128E and ((softmax_sizes and f32 and not log_softmax) or (matmul_sizes and not f16) or (sdpa_sizes and f32) or (not sizes and f64 and not log_softmax and (causal or masked or gqa or empty or zero or layouts or out or nan_inf or lse)))"'
pytest_args=${CYATTN_VALGRIND_PYTEST:-$default_subset}
supp=$root/tools/valgrind-python.supp
check_name=valgrind_check
# shellcheck source=tools/_steps.sh
source "$root/tools/_steps.sh"
parse_args "$@"
set_outdir valgrind-check        # without --outdir: removed on exit

# ---------------------------------------------------------------------------------------------
step "valgrind"
command -v "$vg" >/dev/null || fail "$vg not found (apt-get install valgrind)"
"$vg" --version
[ -f "$supp" ] || fail "suppressions file $supp is missing"
# No --track-origins (it doubles the run time): to see where an uninitialised value came
# from, rerun with VALGRIND_OPTS=--track-origins=yes (valgrind reads that variable itself).
vg_opts=(--tool=memcheck --error-exitcode=1 --leak-check=no --num-callers=40
         --gen-suppressions=all "--suppressions=$supp")
echo "options: ${vg_opts[*]}"
export PYTHONMALLOC=malloc OMP_NUM_THREADS=2

# ---------------------------------------------------------------------------------------------
stage_step venv run

step "fresh venv; pip install the staged copy (normal build) and the test dependencies"
fresh_venv "$out/venv"
pip_install_staged "$out/build.log" -u CYATTN_SANITIZE
show_versions

# ---------------------------------------------------------------------------------------------
step "control: a read past a NumPy buffer is reported"
rc=0
"$vg" "${vg_opts[@]}" --log-file="$out/control.log" "$vpy" -c '
import ctypes, numpy as np
row = np.ones(7)                                   # 56 bytes of heap
ctypes.string_at(row.ctypes.data, row.nbytes + 1)  # reads one byte past the block
' || rc=$?
control=$(grep -E "ERROR SUMMARY" "$out/control.log" | tail -1 | sed 's/^==[0-9]*== //')
if [ "$rc" -ne 1 ] || ! grep -q "Invalid read" "$out/control.log"; then
    cat "$out/control.log"
    fail "the control was not reported (exit $rc; $control)"
fi
echo "reported as expected (exit $rc): $control"

# ---------------------------------------------------------------------------------------------
step "tests under valgrind memcheck: pytest $pytest_args"
enter_tests_copy "$out/src/tests" "$out/run"
assert_venv_cyattn
eval "set -- $pytest_args"
rc=0
"$vg" "${vg_opts[@]}" --log-file="$out/valgrind.log" \
    "$vpy" -m pytest -q -p no:cacheprovider --durations=5 "$@" 2>&1 | tee "$out/pytest.log" ||
    rc=${PIPESTATUS[0]}
cd "$root"

# ---------------------------------------------------------------------------------------------
step "summary"
summary=$(grep -E "ERROR SUMMARY" "$out/valgrind.log" | tail -1 | sed 's/^==[0-9]*== //')
[ -n "$summary" ] || { tail -30 "$out/valgrind.log"; fail "no ERROR SUMMARY in $out/valgrind.log (exit $rc)"; }
tests_line=$(pytest_summary "$out/pytest.log")
n_errors=$(echo "$summary" | sed -n 's/^ERROR SUMMARY: \([0-9]*\) errors.*/\1/p')
echo "valgrind: $summary"
if [ "${n_errors:-1}" != 0 ]; then
    # The first three reports, 14 lines each; all of them (and a suppression template for
    # each) are in the log.
    awk '/^==[0-9]+== [A-Z][a-z]/ && !/^==[0-9]+== (Memcheck|Copyright|Using|Command|Parent|For |Use --|ERROR SUMMARY)/ {
             if (++n > 3) exit; left = 14 }
         left > 0 && /^==[0-9]+==/ { print; left-- }' "$out/valgrind.log"
    in_cyattn=$(grep -c -E "_kernels_(baseline|avx2|avx512)" "$out/valgrind.log" || true)
    fail "$summary ($in_cyattn stack lines in cyattn's kernels; log: $out/valgrind.log); pytest: ${tests_line:-no summary}; $((SECONDS - start))s"
fi
[ "$rc" -eq 0 ] || fail "pytest exit $rc under valgrind with no valgrind error: ${tests_line:-no summary}; $((SECONDS - start))s"
echo "valgrind_check: PASSED: $summary; pytest: $tests_line; $((SECONDS - start))s"
