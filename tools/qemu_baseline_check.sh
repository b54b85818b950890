#!/usr/bin/env bash
# Prove that an installed cyattn wheel runs on an x86-64 CPU without AVX: the whole Python
# process runs under user-mode QEMU emulating a Westmere CPU (SSE4.2, no AVX/AVX2/FMA), where
# any AVX instruction is an illegal instruction (SIGILL).
#
#   0. control: a small AVX2 program must die with SIGILL under the emulated CPU and run on the
#      real one -- otherwise the emulation would prove nothing;
#   1. python -m cyattn info: the baseline variant is chosen by itself (no CYATTN_BACKEND), the
#      CPU features show no AVX;
#   2. python -m cyattn check: the compiled kernels agree with the oracle; -X importtime lists
#      every module imported, and cyattn._kernels_avx2 must not be among them;
#   3. CYATTN_BACKEND=avx2 is refused with an ImportError that says why (not a crash);
#   4. the test suite (minus slow tests) under emulation. Child interpreters started by the
#      tests (sys.executable) are emulated too, and a guard makes importing the AVX2 module in
#      any of these processes fail and get reported.
#
# Usage: tools/qemu_baseline_check.sh [WHEEL]
#   WHEEL: an x86-64 cyattn wheel (e.g. tools/wheel_check.sh's DIR/wheelhouse/*.whl). Without
#   it, one is built from a staged copy of the source tree with python -m build.
# Environment: PYTHON (default python3) for the venv; CYATTN_QEMU_PYTEST: arguments for step 4
#   (default: -m "not slow" tests; "skip" skips it); CYATTN_QEMU_CPU (default Westmere).
# qemu-user is installed with apt-get when qemu-x86_64 is missing (as root, or with sudo -n).
# Exit status: 0 when every check passed, 1 otherwise.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
wheel=${1:-}
py=${PYTHON:-python3}
cpu=${CYATTN_QEMU_CPU:-Westmere}
check_name=qemu_check
# shellcheck source=tools/_steps.sh
source "$root/tools/_steps.sh"

if [ "$(uname -m)" != x86_64 ]; then
    echo "qemu_check: this check is for x86-64 hosts (this is $(uname -m)); skipped"
    exit 0
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/cyattn-qemu-check.XXXXXX")
ulimit -c 0     # the SIGILL of the control run must not leave a core file behind

step "qemu-user"
if ! command -v qemu-x86_64 >/dev/null; then
    if [ "$(id -u)" = 0 ]; then sudo=(); elif sudo -n true 2>/dev/null; then sudo=(sudo -n);
    else fail "qemu-x86_64 is missing and apt-get needs root: apt-get install qemu-user"; fi
    echo "installing qemu-user with apt-get"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq qemu-user > "$work/apt.log" 2>&1 ||
        { cat "$work/apt.log"; fail "apt-get install qemu-user"; }
fi
qemu-x86_64 -version | head -1
qemu=(qemu-x86_64 -cpu "$cpu")
# TCG prints one warning per CPUID feature it cannot emulate; they say nothing about our code.
quiet() { grep -v "TCG doesn't support requested feature" || true; }

step "control: AVX2 code under -cpu $cpu"
if command -v cc >/dev/null; then
    cat > "$work/avx2_probe.c" <<'EOF'
#include <immintrin.h>
#include <stdio.h>
int main(int argc, char **argv) {
    (void)argv;
    __m256i a = _mm256_set1_epi32(argc), b = _mm256_set1_epi32(41);
    int out[8];
    _mm256_storeu_si256((__m256i *)out, _mm256_add_epi32(a, b));   /* vpaddd ymm: AVX2 */
    printf("%d\n", out[0]);
    return 0;
}
EOF
    cc -O1 -mavx2 "$work/avx2_probe.c" -o "$work/avx2_probe"
    set +e
    native=$("$work/avx2_probe" 2>&1); native_rc=$?
    emulated=$("${qemu[@]}" "$work/avx2_probe" 2>&1 | quiet); emulated_rc=${PIPESTATUS[0]}
    set -e
    echo "native run: exit $native_rc, output ${native:-<none>}"
    echo "emulated $cpu: exit $emulated_rc, ${emulated:-<no output>}"
    if grep -qw avx2 /proc/cpuinfo; then
        [ "$native_rc" = 0 ] && [ "$native" = 42 ] || fail "the AVX2 probe does not run natively"
    fi
    [ "$emulated_rc" = 132 ] ||   # 128 + SIGILL
        fail "AVX2 code did not trap under -cpu $cpu (exit $emulated_rc): the emulation proves nothing"
else
    echo "no C compiler: control skipped"
fi

if [ -z "$wheel" ]; then
    step "no wheel given: build one (python -m build --wheel on a staged copy of the tree)"
    stage_source_tree "$root" "$work"
    "$py" -m venv "$work/build-venv"
    "$work/build-venv/bin/python" -m pip install --quiet --disable-pip-version-check "$build_pin"
    "$work/build-venv/bin/python" -m build --wheel --outdir "$work/dist" "$work/src" > "$work/build.log" 2>&1 ||
        { tail -30 "$work/build.log"; fail "python -m build"; }
    wheel=$(ls "$work"/dist/*.whl)
fi
[ -f "$wheel" ] || fail "no such wheel: $wheel"
case "$(basename "$wheel")" in *x86_64*) ;; *) fail "not an x86-64 wheel: $wheel" ;; esac
echo "wheel: $wheel"

step "fresh venv with the wheel and the test dependencies"
fresh_venv "$work/venv"
pip_install_wheel "$wheel" "$work/pip.log"

# The guard and the wrapper that keep child interpreters under emulation.
mkdir -p "$work/shim" "$work/run"
cat > "$work/shim/sitecustomize.py" <<'EOF'
# Loaded at start-up by every interpreter of this check (PYTHONPATH). Under emulation:
#  * sys.executable points at a wrapper that starts python under the same emulated CPU, so the
#    tests' child interpreters run there too;
#  * importing the AVX2 kernel module is refused and logged (the check fails on any entry).
import importlib.abc
import importlib.machinery
import os
import sys

_wrapper = os.environ.get("CYATTN_QEMU_PYTHON")
if _wrapper:
    sys.executable = _wrapper


class _RefusingLoader(importlib.abc.Loader):
    def __init__(self, name):
        self.name = name

    def create_module(self, spec):
        with open(os.environ["CYATTN_QEMU_IMPORT_LOG"], "a") as fh:
            fh.write(f"pid {os.getpid()}: import {self.name}\n")
        raise ImportError(f"{self.name} imported under an emulated CPU without AVX "
                          "(refused by tools/qemu_baseline_check.sh)")

    def exec_module(self, module):
        raise ImportError(self.name)


class _RefuseAVX2:
    """Finding the module (cyattn._backend asks whether it is built) is allowed; loading is not."""

    def find_spec(self, name, path=None, target=None):
        if name not in ("cyattn._kernels_avx2", "cyattn._kernels_avx512",
                        "cyattn._kernels_avx512bf16"):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None:
            spec.loader = _RefusingLoader(name)
        return spec


if os.environ.get("CYATTN_QEMU_IMPORT_LOG"):
    sys.meta_path.insert(0, _RefuseAVX2())
EOF
cat > "$work/shim/python-$cpu" <<EOF
#!/bin/sh
exec qemu-x86_64 -cpu $cpu "$vpy" "\$@"
EOF
chmod +x "$work/shim/python-$cpu"
: > "$work/avx2-imports.log"
# Emulated runs: no BLAS core-type override (the emulated CPU is the one to detect), the guard,
# and the tests' subprocess hang guards scaled to the emulator (tests/conftest.py timeout_scale).
emu_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE -u CYATTN_BACKEND
         PYTHONPATH="$work/shim" CYATTN_QEMU_PYTHON="$work/shim/python-$cpu"
         CYATTN_QEMU_IMPORT_LOG="$work/avx2-imports.log" CYATTN_TEST_TIMEOUT_SCALE=4)
emu() { "${emu_env[@]}" "${qemu[@]}" "$vpy" "$@"; }
cd "$work/run"

step "python -m cyattn info under -cpu $cpu"
t0=$SECONDS
set +e
emu -m cyattn info > "$work/info.txt" 2>&1
info_rc=$?
set -e
quiet < "$work/info.txt"
[ "$info_rc" = 0 ] || fail "python -m cyattn info exited $info_rc"
grep -qE '^variant:\s+baseline$' "$work/info.txt" || fail "info does not report the baseline variant"
grep -qE '^available_variants:\s+baseline$' "$work/info.txt" || fail "an AVX variant is offered"
if grep -E '^cpu_features:' "$work/info.txt" | grep -qwE 'avx|avx2|fma|os_ymm'; then
    fail "AVX features reported on $cpu"
fi
echo "info: $((SECONDS - t0))s"

step "python -X importtime -m cyattn check under -cpu $cpu"
t0=$SECONDS
set +e
emu -X importtime -m cyattn check > "$work/check.out" 2> "$work/check.err"
check_rc=$?
set -e
cat "$work/check.out"
quiet < "$work/check.err" | grep -v "^import time:" || true
echo "cyattn modules imported (from -X importtime):"
grep -E "^import time:.*\bcyattn(\.|$)" "$work/check.err" | awk -F'|' '{gsub(/^ +/, "", $3); print "  " $3}'
[ "$check_rc" = 0 ] || fail "python -m cyattn check exited $check_rc"
grep -q "cases match the oracle" "$work/check.out" || fail "check printed no result"
grep -q "cyattn._kernels_baseline" "$work/check.err" || fail "the baseline module was not imported"
if grep -qE "cyattn._kernels_avx(2|512)" "$work/check.err"; then fail "an AVX module was imported"; fi
echo "check: $((SECONDS - t0))s"

for forced in avx2 avx512 avx512bf16; do
    step "CYATTN_BACKEND=$forced under -cpu $cpu is an ImportError that says why"
    set +e
    "${emu_env[@]}" CYATTN_BACKEND=$forced "${qemu[@]}" "$vpy" -c "import cyattn" \
        > "$work/forced.out" 2>&1
    forced_rc=$?
    set -e
    quiet < "$work/forced.out" | tail -1
    [ "$forced_rc" = 1 ] || fail "expected exit 1 (ImportError), got $forced_rc"
    grep -q "ImportError: cyattn: this CPU cannot run the '$forced' kernel variant" \
        "$work/forced.out" || fail "the ImportError does not say why"
done

pytest_args=${CYATTN_QEMU_PYTEST:-}
# The hardening, property, corpus and fast-path suites already run every variant natively (the
# baseline one included) and would take most of an hour under emulation; the rest is the
# baseline's correctness on a CPU without AVX.
skip_suites="--ignore=tests/test_hardening.py --ignore=tests/test_properties_hardening.py"
skip_suites="$skip_suites --ignore=tests/test_fuzz_corpus.py --ignore=tests/test_fast_paths.py"
# So do the attention-variant and attention-weights suites (about 2,600 oracle-heavy cases); under
# emulation the baseline's variant code is exercised by test_tanh.py and the SDPA tests that
# remain (tests/test_variants.py runs the baseline variant natively).
skip_suites="$skip_suites --ignore=tests/test_variants.py --ignore=tests/test_properties_variants.py"
skip_suites="$skip_suites --ignore=tests/test_weights.py"
# The grouped decode's oracle grid (289 cases x every variant, the baseline's included), the
# 8-bit K/V grid (388 cases, every variant) and the bf16 fast paths' scalar emulation (the same
# code on every variant: matmul and attention) also run natively.
skip_suites="$skip_suites --ignore=tests/test_decode_grouped.py --ignore=tests/test_bf16_fast.py"
skip_suites="$skip_suites --ignore=tests/test_kv8.py --ignore=tests/test_bf16_attention_fast.py"
# The AMX tiles' model (GEMM and attention through the portable tile model, every variant) and
# the encoder families (torch references) run natively too.
skip_suites="$skip_suites --ignore=tests/test_amx_model.py --ignore=tests/test_amx_attention.py --ignore=tests/test_amx_decode.py"
skip_suites="$skip_suites --ignore=tests/test_encoder_families.py --ignore=tests/test_encoder_rerank.py"
[ -n "$pytest_args" ] || pytest_args="-m 'not slow' tests $skip_suites"
if [ "$pytest_args" != skip ]; then
    step "test suite under -cpu $cpu: pytest $pytest_args"
    enter_tests_copy "$root/tests" "$work/run"
    t0=$SECONDS
    # test_bench_reexecs_without_openblas_overrides sets OPENBLAS_CORETYPE=Haswell for a child:
    # NumPy's OpenBLAS then runs AVX2 code, which a Westmere CPU cannot (SIGILL, by design).
    eval "set -- $pytest_args"
    set +e
    emu -m pytest -q -p no:cacheprovider \
        --deselect tests/test_main.py::test_bench_reexecs_without_openblas_overrides "$@" 2>&1 | quiet
    tests_rc=${PIPESTATUS[0]}
    set -e
    [ "$tests_rc" = 0 ] || fail "tests failed under -cpu $cpu (pytest exit $tests_rc)"
    echo "tests: $((SECONDS - t0))s"
fi

step "no AVX module was imported under emulation"
if [ -s "$work/avx2-imports.log" ]; then cat "$work/avx2-imports.log"; fail "AVX module imported"; fi
echo "no import of cyattn._kernels_avx2 or _kernels_avx512 in any emulated process"
echo "qemu_check: all checks passed in $((SECONDS - start))s"
