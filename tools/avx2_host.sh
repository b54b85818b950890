#!/usr/bin/env bash
# Run a command as on an AVX2 host (no AVX-512, no AMX) on an AVX-512 x86-64 Linux machine:
# every library in the process (cyattn's variant choice, NumPy's OpenBLAS, ONNX Runtime,
# PyTorch) dispatches its kernels from a CPUID without the AVX-512 bits. See tools/avx2_host.c.
#   bash tools/avx2_host.sh python -m cyattn bench --full --quick
#   bash tools/avx2_host.sh python tools/ab_builds.py OLD NEW
# Needs a C compiler and CPUID faulting (cpuid_fault in /proc/cpuinfo); exits 2 without them.
set -euo pipefail
if [ $# -eq 0 ]; then
    echo "usage: bash tools/avx2_host.sh COMMAND [ARGS...]" >&2
    exit 2
fi
if ! grep -qw cpuid_fault /proc/cpuinfo 2>/dev/null; then
    echo "avx2_host: this CPU or kernel has no CPUID faulting (no cpuid_fault in /proc/cpuinfo)" >&2
    exit 2
fi
shim_dir=$(mktemp -d)
trap 'rm -rf "$shim_dir"' EXIT
"${CC:-cc}" -O2 -shared -fPIC -o "$shim_dir/avx2_host.so" "$(dirname "$0")/avx2_host.c"
LD_PRELOAD="$shim_dir/avx2_host.so${LD_PRELOAD:+:$LD_PRELOAD}" "$@"
