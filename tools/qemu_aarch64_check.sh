#!/usr/bin/env bash
# Build cyattn for aarch64 on an x86-64 host and test it under user-mode QEMU (no aarch64
# hardware needed). Everything comes from Debian's packages and PyPI's aarch64 wheels:
#
#   1. tools: qemu-aarch64(-static), debootstrap, the aarch64 cross gcc and binutils;
#   2. an arm64 Debian bookworm root file system (debootstrap --foreign, its packages unpacked
#      without running their scripts: python3.11 and its headers, libgomp) and the test
#      dependencies as aarch64 wheels (pip install --platform ... --target: NumPy 2, pytest,
#      hypothesis, threadpoolctl, ml_dtypes), both kept in the cache folder when one is given;
#   3. cross-compile: setup.py build_ext with aarch64-linux-gnu-gcc against the root file
#      system's Python headers (Cython runs on the host; about 30 s per variant instead of about
#      5 minutes under emulation); every extension must be an aarch64 ELF object;
#   4. the shape of the neon micro-kernel's k loop in the disassembly (aarch64_disasm_check.py),
#      and of neonbf16's float32 and BFDOT tiles;
#      control: a BFDOT program must run under -cpu max and die with SIGILL under the fall-back
#      CPU -- otherwise the fall-back run would not prove that the dispatch avoids bf16 code;
#   5. per emulated CPU (-cpu max: every aarch64 variant; the fall-back CPU, an Armv8.0
#      Cortex-A72 without FP16/BF16 by default): python -m cyattn info (the variant the
#      dispatcher picks by itself), python -m cyattn check (the oracle self-check), and the
#      kernel suites (tests/test_kernels.py per variant, plus the selection below); on -cpu max
#      the opt-in neonbf16 variant's BFDOT against its model (tests/test_bf16_arm.py) and, not
#      in --quick, its self-check; on the fall-back CPU, that neonbf16 is refused. Child
#      interpreters started by the tests (sys.executable) run under the same emulated CPU.
#
# Usage: tools/qemu_aarch64_check.sh [--cache DIR] [--quick | --insn-per-flop]
#   --quick (CI): the kernel suites of step 5 cut to the neon variant's GEMM, softmax and
#   attention tests of tests/test_kernels.py on -cpu max and its GEMM tests on the fall-back CPU
#   (the CYATTN_QEMU_PYTEST_* variables still override); the rest by hand.
#   --insn-per-flop (by hand): after step 4, count the instructions the baseline and neon
#   variants execute per useful flop under qemu (tools/insn_per_flop.py), with the x86-64
#   baseline and avx2 counts beside them when PYTHON can import cyattn from src/ (an in-place
#   build), then stop.
#   DIR keeps the root file system and the wheels between runs (about 400 MB; the second run
#   skips step 2). Without it everything goes to a temporary folder removed on exit.
# Environment: PYTHON (default python3, must be CPython 3.11 with Cython >= 3.1 and setuptools,
#   as the cross build imports the host's Cython and setuptools; the target is bookworm's 3.11);
#   CYATTN_QEMU_FALLBACK_CPU (default cortex-a72); CYATTN_QEMU_PYTEST_MAX /
#   CYATTN_QEMU_PYTEST_FALLBACK: pytest arguments of step 5 per CPU ("skip" skips them);
#   CYATTN_QEMU_TIMEOUT (default 1500): seconds the whole check may take before it is stopped
#   (timeout(1) per emulated command, each given what is left).
# Exit status: 0 when every check passed, 1 otherwise (the failing step is named).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-python3}
cache=""
quick=0
insn=0
fallback_cpu=${CYATTN_QEMU_FALLBACK_CPU:-cortex-a72}
budget=${CYATTN_QEMU_TIMEOUT:-1500}
check_name=qemu_aarch64_check
# shellcheck source=tools/_steps.sh
source "$root/tools/_steps.sh"
while [ $# -gt 0 ]; do
    case "$1" in
        --cache) [ $# -ge 2 ] || usage_error "--cache needs a folder"; cache=$2; shift 2 ;;
        --quick) quick=1; shift ;;
        --insn-per-flop) insn=1; shift ;;
        -h|--help) print_help; exit 0 ;;
        *) usage_error "unknown argument $1 (see --help)" ;;
    esac
done

if [ "$(uname -m)" != x86_64 ]; then
    echo "$check_name: this check cross-builds on x86-64 hosts (this is $(uname -m)); skipped"
    exit 0
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/cyattn-qemu-aarch64.XXXXXX")
if [ -n "$cache" ]; then mkdir -p "$cache" && cache=$(cd "$cache" && pwd); else cache=$work/cache; fi
ulimit -c 0     # the SIGILL of the control run must not leave a core file behind

# left: seconds of the budget still unspent (at least 1)
left() { local l=$((budget - (SECONDS - start))); [ "$l" -gt 0 ] || l=1; echo "$l"; }

# Pinned so that a new release cannot change the verdict on the same tree.
suite=bookworm
mirror=${CYATTN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
target_pkgs=python3,libpython3.11-dev,libgomp1
wheel_pins=(numpy==2.4.6 pytest==9.2.0 hypothesis==6.170.27 threadpoolctl==3.8.0 ml_dtypes==0.7.0)

step "tools: qemu-user, debootstrap, aarch64 cross gcc and binutils"
missing=()
command -v qemu-aarch64-static >/dev/null || command -v qemu-aarch64 >/dev/null ||
    missing+=(qemu-user-static)
# the instruction counts load a TCG plugin, which the static build cannot
[ "$insn" = 0 ] || command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu)
command -v aarch64-linux-gnu-objdump >/dev/null || missing+=(binutils-aarch64-linux-gnu)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then sudo=(); elif sudo -n true 2>/dev/null; then sudo=(sudo -n);
    else fail "missing ${missing[*]} and apt-get needs root: apt-get install ${missing[*]}"; fi
    echo "installing ${missing[*]} with apt-get"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" \
        > "$work/apt.log" 2>&1 || { cat "$work/apt.log"; fail "apt-get install ${missing[*]}"; }
fi
qemu_bin=$(command -v qemu-aarch64-static || command -v qemu-aarch64)
debootstrap_bin=$(command -v debootstrap || echo /usr/sbin/debootstrap)
"$qemu_bin" -version | head -1
aarch64-linux-gnu-gcc --version | head -1

rootfs=$cache/rootfs
step "arm64 Debian $suite root file system in $rootfs"
if [ ! -f "$rootfs/.cyattn-ready" ]; then
    rm -rf "$rootfs"
    # --foreign: download and unpack only, no second stage (that would need binfmt_misc, which
    # a container seldom has). The packages --include names are unpacked here by dpkg-deb; their
    # maintainer scripts never run (python3 needs none to start; its .pyc files are not built).
    "$debootstrap_bin" --foreign --arch=arm64 --variant=minbase --include="$target_pkgs" \
        "$suite" "$rootfs" "$mirror" > "$work/debootstrap.log" 2>&1 ||
        { tail -30 "$work/debootstrap.log"; fail "debootstrap"; }
    for deb in "$rootfs"/var/cache/apt/archives/*.deb; do
        dpkg-deb --fsys-tarfile "$deb" | tar -x --keep-directory-symlink -C "$rootfs" ||
            fail "unpacking $(basename "$deb")"
    done
    rm -f "$rootfs"/var/cache/apt/archives/*.deb
    # qemu -L looks a path up in the root file system first: /tmp must be the host's.
    rmdir "$rootfs/tmp" 2>/dev/null || rm -rf "${rootfs:?}/tmp"
    touch "$rootfs/.cyattn-ready"
else
    echo "cached"
fi
tpy=$rootfs/usr/bin/python3.11
[ -x "$tpy" ] || fail "no python3.11 in $rootfs"
[ -f "$rootfs/usr/include/python3.11/Python.h" ] || fail "no Python headers in $rootfs"

site=$cache/site
step "aarch64 wheels of the test dependencies in $site (${wheel_pins[*]})"
if [ ! -f "$site/.cyattn-ready" ]; then
    rm -rf "$site"
    "$py" -m pip install --quiet --disable-pip-version-check --no-compile --only-binary=:all: \
        --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 \
        --python-version 3.11 --implementation cp --abi cp311 --target "$site" \
        "${wheel_pins[@]}" > "$work/pip.log" 2>&1 || { cat "$work/pip.log"; fail "pip install"; }
    touch "$site/.cyattn-ready"
else
    echo "cached"
fi

step "cross-compile the extensions with aarch64-linux-gnu-gcc"
stage_source_tree "$root" "$work"
t0=$SECONDS
# _PYTHON_HOST_PLATFORM makes setup.py build the aarch64 variants; -idirafter finds the
# multiarch pyconfig.h of the target after the cross compiler's own headers.
(cd "$work/src" && nice env _PYTHON_HOST_PLATFORM=linux-aarch64 CC=aarch64-linux-gnu-gcc \
    LDSHARED="aarch64-linux-gnu-gcc -shared" LDFLAGS="" \
    CFLAGS="-I$rootfs/usr/include/python3.11 -idirafter $rootfs/usr/include" \
    "$py" setup.py build_ext --inplace -j 2 > "$work/build.log" 2>&1) ||
    { grep -E "error|Error" "$work/build.log" | head -30; fail "cross build (log: $work/build.log)"; }
grep -E "^cyattn: compiler=" "$work/build.log" || true
host_suffix=$("$py" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
target_suffix=.cpython-311-aarch64-linux-gnu.so
built=()
for so in "$work"/src/src/cyattn/_kernels_*"$host_suffix"; do
    [ -f "$so" ] || fail "no extension was built"
    name=$(basename "$so" "$host_suffix")
    mv "$so" "$work/src/src/cyattn/$name$target_suffix"
    machine=$(aarch64-linux-gnu-readelf -h "$work/src/src/cyattn/$name$target_suffix" |
              sed -n 's/^ *Machine: *//p')
    [ "$machine" = AArch64 ] || fail "$name is not an aarch64 object ($machine)"
    built+=("${name#_kernels_}")
done
echo "built (aarch64): ${built[*]} in $((SECONDS - t0))s"
case " ${built[*]} " in
    *" neon "*)
        step "disassembly: the neon GEMM micro-kernel's k loop (tools/aarch64_disasm_check.py)"
        "$py" "$root/tools/aarch64_disasm_check.py" "$work"/src/src/cyattn/_kernels_neon"$target_suffix" ||
            fail "the neon micro-kernel's k loop is not the 8 x 12 shape" ;;
esac
case " ${built[*]} " in
    *" neonbf16 "*)
        step "disassembly: the neonbf16 GEMM and BFDOT tiles' k loops (tools/aarch64_disasm_check.py)"
        "$py" "$root/tools/aarch64_disasm_check.py" "$work"/src/src/cyattn/_kernels_neonbf16"$target_suffix" ||
            fail "a neonbf16 micro-kernel's k loop is not of its shape" ;;
esac
if [ "$insn" = 1 ]; then
    step "instructions per useful flop under qemu (tools/insn_per_flop.py)"
    x86=()
    if (cd "$root" && PYTHONPATH=src "$py" -c "import cyattn" 2>/dev/null); then
        x86=(--x86)
    else
        echo "no in-place x86-64 build in $root/src for $py: aarch64 counts only"
    fi
    # the plugin is a shared object: the static qemu cannot load it
    qemu_dyn=$(command -v qemu-aarch64) ||
        fail "--insn-per-flop needs qemu-aarch64 (Debian: qemu-user), not only the static build"
    (cd "$root" && PYTHONPATH=src "$py" tools/insn_per_flop.py "${x86[@]}" \
        --aarch64 "$qemu_dyn" "$rootfs" "$tpy" "$work/src/src:$site") || fail "insn_per_flop"
    echo "$check_name: instruction counts done in $((SECONDS - start))s"
    exit 0
fi

# The variant the dispatcher picks by itself: the baseline on every aarch64 CPU, as neon is
# opt-in (cyattn._backend.OPT_IN: it has run under qemu only); the tests still run every
# variant the CPU runs, neon included (conftest: available_variants() + runnable_opt_in()).
best_max=baseline; best_fallback=baseline

step "control: BFDOT under -cpu max and -cpu $fallback_cpu"
cat > "$work/bf16_probe.c" <<'EOF'
#include <arm_neon.h>
#include <stdio.h>
int main(int argc, char **argv) {
    (void)argv;
    /* 1.0 in bf16, not a constant (else gcc may make it an FP16 fmov) */
    bfloat16x8_t a = vreinterpretq_bf16_u16(vdupq_n_u16((unsigned short)(0x3f7f + argc)));
    float32x4_t acc = vdupq_n_f32((float)argc);
    acc = vbfdotq_f32(acc, a, a);                                     /* BFDOT: FEAT_BF16 */
    printf("%g\n", (double)vgetq_lane_f32(acc, 0));
    return 0;
}
EOF
aarch64-linux-gnu-gcc -O1 -march=armv8.2-a+bf16 "$work/bf16_probe.c" -o "$work/bf16_probe"
set +e
on_max=$("$qemu_bin" -cpu max -L "$rootfs" "$work/bf16_probe" 2>&1); max_rc=$?
on_fb=$("$qemu_bin" -cpu "$fallback_cpu" -L "$rootfs" "$work/bf16_probe" 2>&1); fb_rc=$?
set -e
echo "-cpu max: exit $max_rc, output ${on_max:-<none>}"
echo "-cpu $fallback_cpu: exit $fb_rc, ${on_fb:-<no output>}"
[ "$max_rc" = 0 ] && [ "$on_max" = 3 ] || fail "the BFDOT probe does not run under -cpu max"
[ "$fb_rc" = 132 ] ||   # 128 + SIGILL
    fail "BFDOT did not trap under -cpu $fallback_cpu (exit $fb_rc): the fall-back proves nothing"

# The interpreter wrapper that keeps child interpreters under the same emulated CPU.
mkdir -p "$work/shim" "$work/run"
cat > "$work/shim/sitecustomize.py" <<'EOF'
# Loaded at start-up by every interpreter of this check (PYTHONPATH): sys.executable points at
# a wrapper that starts python under the same emulated CPU, so the tests' children run there.
import os
import sys

_wrapper = os.environ.get("CYATTN_QEMU_PYTHON")
if _wrapper:
    sys.executable = _wrapper
EOF
enter_tests_copy "$root/tests" "$work/run"

# run_cpu CPU EXPECTED PYTEST_ARGS: info, check and the kernel suites under -cpu CPU.
run_cpu() {
    local cpu=$1 expected=$2 pytest_args=$3 rc t0
    local wrapper=$work/shim/python-$cpu
    printf '#!/bin/sh\nexec %s -cpu %s -L %s %s "$@"\n' "$qemu_bin" "$cpu" "$rootfs" "$tpy" \
        > "$wrapper"
    chmod +x "$wrapper"
    local emu=(env -u CYATTN_BACKEND -u OPENBLAS_CORETYPE PYTHONNOUSERSITE=1
               PYTHONPATH="$work/shim:$work/src/src:$site" CYATTN_QEMU_PYTHON="$wrapper"
               timeout "$(left)" "$wrapper")

    step "python -m cyattn info under -cpu $cpu"
    "${emu[@]}" -m cyattn info > "$work/info-$cpu.txt" 2>&1 ||
        { cat "$work/info-$cpu.txt"; fail "python -m cyattn info under -cpu $cpu"; }
    cat "$work/info-$cpu.txt"
    grep -qE "^variant:\s+$expected$" "$work/info-$cpu.txt" ||
        fail "the dispatcher did not pick $expected under -cpu $cpu"
    # the feature detection (getauxval) must see FEAT_BF16 on max and not on the fall-back
    if [ "$cpu" = max ]; then
        grep -E "^cpu_features:" "$work/info-$cpu.txt" | grep -qw bf16 ||
            fail "no bf16 among the CPU features under -cpu max"
    elif grep -E "^cpu_features:" "$work/info-$cpu.txt" | grep -qw bf16; then
        fail "bf16 reported under -cpu $cpu"
    fi

    step "python -m cyattn check under -cpu $cpu (variant $expected)"
    t0=$SECONDS
    "${emu[@]}" -m cyattn check > "$work/check-$cpu.txt" 2>&1 ||
        { cat "$work/check-$cpu.txt"; fail "python -m cyattn check under -cpu $cpu"; }
    cat "$work/check-$cpu.txt"
    grep -q "cases match the oracle" "$work/check-$cpu.txt" || fail "check printed no result"
    echo "check: $((SECONDS - t0))s"
    # the opt-in neon variant, forced (the dispatcher never picks it by itself)
    case " ${built[*]} " in
        *" neon "*)
            step "CYATTN_BACKEND=neon python -m cyattn check under -cpu $cpu"
            "${emu[@]:0:5}" CYATTN_BACKEND=neon "${emu[@]:5}" -m cyattn check \
                > "$work/check-neon-$cpu.txt" 2>&1 ||
                { cat "$work/check-neon-$cpu.txt"; fail "neon check under -cpu $cpu"; }
            cat "$work/check-neon-$cpu.txt"
            grep -q "cases match the oracle" "$work/check-neon-$cpu.txt" ||
                fail "check printed no result" ;;
    esac
    # the opt-in neonbf16 variant: on -cpu max its BFDOT against the model (tests/test_bf16_arm.py,
    # none skipped) and, by hand, the self-check; elsewhere the dispatcher must refuse it
    case " ${built[*]} " in
        *" neonbf16 "*)
            if [ "$cpu" = max ]; then
                if [ "$quick" = 0 ]; then
                    step "CYATTN_BACKEND=neonbf16 python -m cyattn check under -cpu $cpu"
                    "${emu[@]:0:5}" CYATTN_BACKEND=neonbf16 "${emu[@]:5}" -m cyattn check \
                        > "$work/check-neonbf16.txt" 2>&1 ||
                        { cat "$work/check-neonbf16.txt"; fail "neonbf16 check under -cpu $cpu"; }
                    cat "$work/check-neonbf16.txt"
                    grep -q "cases match the oracle" "$work/check-neonbf16.txt" ||
                        fail "check printed no result"
                fi
                step "CYATTN_BACKEND=neonbf16 pytest tests/test_bf16_arm.py under -cpu $cpu"
                t0=$SECONDS
                set +e
                "${emu[@]:0:5}" CYATTN_BACKEND=neonbf16 "${emu[@]:5}" -m pytest -q \
                    -p no:cacheprovider tests/test_bf16_arm.py > "$work/pytest-neonbf16.txt" 2>&1
                rc=$?
                set -e
                tail -5 "$work/pytest-neonbf16.txt"
                [ "$rc" = 0 ] || fail "tests/test_bf16_arm.py failed on neonbf16 (exit $rc)"
                ! grep -q skipped "$work/pytest-neonbf16.txt" ||
                    fail "tests/test_bf16_arm.py skipped tests on neonbf16: BFDOT not compared"
                echo "tests: $((SECONDS - t0))s"
            else
                step "CYATTN_BACKEND=neonbf16 refused under -cpu $cpu (no FEAT_BF16)"
                if "${emu[@]:0:5}" CYATTN_BACKEND=neonbf16 "${emu[@]:5}" -c "import cyattn" \
                        > "$work/neonbf16-$cpu.txt" 2>&1; then
                    fail "the neonbf16 variant loaded under -cpu $cpu, which has no FEAT_BF16"
                fi
                grep -q "ImportError.*bf16" "$work/neonbf16-$cpu.txt" ||
                    { cat "$work/neonbf16-$cpu.txt"; fail "no ImportError naming bf16"; }
                tail -1 "$work/neonbf16-$cpu.txt"
            fi ;;
    esac

    if [ "$pytest_args" != skip ]; then
        step "kernel suites under -cpu $cpu: pytest $pytest_args"
        t0=$SECONDS
        eval "set -- $pytest_args"
        set +e
        "${emu[@]}" -m pytest -q -p no:cacheprovider "$@" > "$work/pytest-$cpu.txt" 2>&1
        rc=$?
        set -e
        tail -15 "$work/pytest-$cpu.txt"
        [ "$rc" = 0 ] || fail "tests failed under -cpu $cpu (pytest exit $rc$([ "$rc" = 124 ] &&
            echo ": out of time, CYATTN_QEMU_TIMEOUT=$budget"))"
        echo "tests: $((SECONDS - t0))s"
    fi
}

# -cpu max: every variant (the fixture `variant` runs each test once per variant the CPU runs).
# By default the kernel suite and the thread-count invariance tests of every variant but the
# baseline (whose loops are the portable code that the x86 baseline already tests natively:
# CYATTN_QEMU_PYTEST_MAX=tests/test_kernels.py adds it, about 640 tests more).
if [ "$quick" = 1 ]; then
    # neon, not neonbf16 (whose float32 kernels are the same source; its BFDOT is checked by
    # tests/test_bf16_arm.py above)
    max_default="tests/test_kernels.py -k 'neon and not neonbf16 and (matmul or gemm or softmax or attention)'"
    fallback_default="tests/test_kernels.py -k 'neon and not neonbf16 and (matmul or gemm)'"
else
    # not the slow tests (as the README's test command): test_exp_float32_every_value alone
    # (2.1e9 values, minutes natively) ran for hours under emulation
    max_default="tests/test_kernels.py tests/test_threads.py -m 'not slow' -k 'not baseline'"
    fallback_default="tests/test_kernels.py -m 'not slow' -k 'not baseline and (matmul or gemm)'"
fi
run_cpu max "$best_max" "${CYATTN_QEMU_PYTEST_MAX:-$max_default}"
# The fall-back CPU: the dispatcher must avoid the bf16 variant; the matmul (micro-kernel) tests
# of the non-bf16 variants run on an Armv8.0 core (no instruction of a later architecture may
# have slipped in).
run_cpu "$fallback_cpu" "$best_fallback" \
    "${CYATTN_QEMU_PYTEST_FALLBACK:-$fallback_default}"

echo
echo "$check_name: all checks passed in $((SECONDS - start))s (variants: ${built[*]})"
