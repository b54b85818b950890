#!/usr/bin/env bash
# The check an AMX host must run before the amx variant may become the default (issue 45):
# everything else was built and tested through the portable model on hosts without AMX.
#   bash tools/amx_check.sh            # from the repository root, with the venv active
# 1. confirms the CPU (amx_bf16 in /proc/cpuinfo) and builds the extensions in place;
# 2. shows `info` by default (the bf16 path an Intel CPU gets: exact) and with the amx
#    variant forced (it must load: CPUID, XCR0 and Linux's arch_prctl grant the tiles);
# 3. runs the hardware tests: the tile instruction against the 35,840 recorded bits, the
#    hardware tile GEMM and tile attention against the model bit for bit (1 and 2 threads),
#    the build and rule tests with the amx variant forced, and the bf16 tests of the
#    default variant (vdpbf16ps against its emulation, unchanged);
# 4. a small bench: bf16 matmul_accumulate 1024^3 and 2048^3, precision="fast" (tiles) vs
#    "exact" vs torch's bf16 addmm_, 1 and 2 threads (bench/bench_bf16_matmul.py), and bf16
#    SDPA prefill (bench/bench_bf16_attention.py, its default shapes).
# Exit status: non-zero if a step fails. Paste the whole output into the issue.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! grep -qw amx_bf16 /proc/cpuinfo 2>/dev/null; then
    echo "amx_check: this CPU has no amx_bf16 in /proc/cpuinfo: nothing to check here" >&2
    exit 2
fi
grep -m1 "model name" /proc/cpuinfo
python setup.py build_ext --inplace -j "$(nproc)" >/tmp/amx_check_build.log 2>&1 \
    || { tail -30 /tmp/amx_check_build.log; exit 1; }
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
echo "== info (default variant)"
python -m cyattn info
echo "== info (CYATTN_BACKEND=amx)"
CYATTN_BACKEND=amx python -m cyattn info
echo "== hardware vs recorded bits and vs the model"
python -m pytest -q -rs tests/test_amx_model.py tests/test_amx_attention.py
echo "== build and rule tests with the amx variant forced"
CYATTN_BACKEND=amx python -m pytest -q -rs tests/test_build.py tests/test_bf16_path.py \
    tests/test_amx_model.py tests/test_amx_attention.py
echo "== bf16 tests of the default variant"
python -m pytest -q tests/test_bf16_fast.py tests/test_bf16_attention_fast.py
echo "== bench: bf16 matmul_accumulate on tiles (CYATTN_BACKEND=amx)"
for n in 1024 2048; do
    CYATTN_BACKEND=amx python bench/bench_bf16_matmul.py --threads 1 2 --samples 7 --n "$n"
done
echo "== bench: bf16 SDPA prefill on tiles vs float32 and torch (CYATTN_BACKEND=amx)"
CYATTN_BACKEND=amx python bench/bench_bf16_attention.py
echo "amx_check: all steps passed"
