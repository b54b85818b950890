"""Half-precision attention (issue 19): float16 / bfloat16 inputs against float32 and PyTorch.

Each group times its calls side by side in one process, interleaved (A B A B ...), and prints
the medians and the median of the paired ratios (above 1: the first-named call is faster):

* decode, B=1 H=32 L=1 S=4096 E=128, per half format: cyattn on half K/V against cyattn on
  float32 K/V, against NumPy reading the half-size K+V once (the bandwidth yardstick: int16
  ``max`` over both arrays), and against torch.nn.functional.scaled_dot_product_attention on
  the same half tensors;
* SDPA (1, 8, T, T, 64), T = 512 and 2048, per half format: cyattn against torch on the same
  half tensors, and against cyattn's own float32 call;
* matmul_accumulate (1024, 1024) @ (1024, 1024) into a half out, per half format: cyattn
  against its own float32 call and against torch's ``addmm_`` on the same half tensors;
* peak RSS growth of one SDPA (1, 1, 8192, 64) bfloat16 call in a fresh process, against the
  size of its output (issue 19: at most the output + 8 MiB).

    python bench/bench_half.py [--threads 1 2] [--samples 7]

Needs: cyattn, ml_dtypes for bfloat16 (float16 alone without it); torch for its column.
"""
import argparse
import os
import statistics
import subprocess
import sys

import numpy as np

import cyattn
from cyattn import _backend
from cyattn._bench import interleaved, paired_ratio, read_once

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # optional peer
    torch = F = None


def _formats():
    out = {"float16": np.dtype(np.float16)}
    try:
        import ml_dtypes
    except ImportError:
        print("ml_dtypes is not installed: bfloat16 left out")
        return out
    out["bfloat16"] = np.dtype(ml_dtypes.bfloat16)
    return out


def _torch_view(arr, name):
    return torch.from_numpy(arr.view(np.int16)).view(getattr(torch, name))


def _line(label, times, a, b):
    ma, mb = statistics.median(times[a]), statistics.median(times[b])
    r = paired_ratio(times[b], times[a])
    print(f"  {label:<40}{a:>16} {ma * 1e3:8.3f} ms {b:>16} {mb * 1e3:8.3f} ms  {r:6.2f}x")
    return r


def _rates(label, times, name, flops):
    """Print cyattn's half call against its float32 call and torch, with GFLOP/s."""
    res = {"vs float32": _line(label, times, f"cyattn {name}", "cyattn float32")}
    print(f"  {'':<40}cyattn {flops / statistics.median(times[f'cyattn {name}']) / 1e9:.1f}"
          f" GFLOP/s" + (f", torch {flops / statistics.median(times[f'torch {name}']) / 1e9:.1f}"
                         f" GFLOP/s" if torch is not None else ""))
    if torch is not None:
        res["vs torch"] = _line("", times, f"cyattn {name}", f"torch {name}")
    return res


def decode(name, dtype, n, samples):
    rng = np.random.default_rng(0)
    shape = (1, 32, 1, 4096, 128)
    B, H, L, S, E = shape
    q32 = rng.standard_normal((B, H, L, E)).astype(np.float32)
    k32 = rng.standard_normal((B, H, S, E)).astype(np.float32)
    v32 = rng.standard_normal((B, H, S, E)).astype(np.float32)
    q, k, v = (a.astype(dtype) for a in (q32, k32, v32))
    fns = {f"cyattn {name}": lambda: cyattn.scaled_dot_product_attention(q, k, v, n_threads=n),
           "cyattn float32": lambda: cyattn.scaled_dot_product_attention(q32, k32, v32,
                                                                         n_threads=n),
           "read half K+V": read_once([k, v], n)}
    if torch is not None:
        qt, kt, vt = (_torch_view(a, name) for a in (q, k, v))
        fns[f"torch {name}"] = lambda: F.scaled_dot_product_attention(qt, kt, vt)
    times = interleaved(fns, samples=samples, target=0.05, pause=0.15 if n > 1 else 0.0)
    label = f"decode {shape} {name}"
    res = {"vs float32": _line(label, times, f"cyattn {name}", "cyattn float32"),
           "of read": _line("", times, f"cyattn {name}", "read half K+V")}
    kv = 2 * B * H * S * E * 2
    print(f"  {'':<40}half K+V {kv / 2**20:.0f} MiB: cyattn reads at "
          f"{kv / statistics.median(times[f'cyattn {name}']) / 1e9:.1f} GB/s, NumPy at "
          f"{kv / statistics.median(times['read half K+V']) / 1e9:.1f} GB/s")
    if torch is not None:
        res["vs torch"] = _line("", times, f"cyattn {name}", f"torch {name}")
    return res


def sdpa(name, dtype, T, n, samples):
    rng = np.random.default_rng(1)
    q32, k32, v32 = (rng.standard_normal((1, 8, T, 64)).astype(np.float32) for _ in range(3))
    q, k, v = (a.astype(dtype) for a in (q32, k32, v32))
    fns = {f"cyattn {name}": lambda: cyattn.scaled_dot_product_attention(q, k, v, n_threads=n),
           "cyattn float32": lambda: cyattn.scaled_dot_product_attention(q32, k32, v32,
                                                                         n_threads=n)}
    if torch is not None:
        qt, kt, vt = (_torch_view(a, name) for a in (q, k, v))
        fns[f"torch {name}"] = lambda: F.scaled_dot_product_attention(qt, kt, vt)
    times = interleaved(fns, samples=samples, target=0.05, pause=0.15 if n > 1 else 0.0)
    return _rates(f"sdpa (1,8,{T},64) {name}", times, name, 4.0 * 8 * T * T * 64)


def matmul(name, dtype, n, samples):
    rng = np.random.default_rng(2)
    a32, b32 = (rng.standard_normal((1024, 1024)).astype(np.float32) for _ in range(2))
    a, b = a32.astype(dtype), b32.astype(dtype)
    out, out32 = np.zeros((1024, 1024), dtype), np.zeros((1024, 1024), np.float32)
    fns = {f"cyattn {name}": lambda: cyattn.matmul_accumulate(a, b, out, n_threads=n),
           "cyattn float32": lambda: cyattn.matmul_accumulate(a32, b32, out32, n_threads=n)}
    if torch is not None:
        at, bt, ot = (_torch_view(x, name) for x in (a, b, out.copy()))
        fns[f"torch {name}"] = lambda: ot.addmm_(at, bt)
    times = interleaved(fns, samples=samples, target=0.05, pause=0.15 if n > 1 else 0.0)
    return _rates(f"matmul 1024^3 {name}", times, name, 2.0 * 1024 ** 3)


_MEMORY_CHILD = r"""
import resource, sys
import numpy as np, ml_dtypes, cyattn
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 1, 8192, 64)).astype(ml_dtypes.bfloat16) for _ in range(3))
cyattn.scaled_dot_product_attention(q[..., :64, :], k[..., :64, :], v[..., :64, :])
def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
open("/proc/self/clear_refs", "w").write("5")        # reset VmHWM to the current RSS
before = rss_kib()
out = cyattn.scaled_dot_product_attention(q, k, v, n_threads=int(sys.argv[1]))
peak = max(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(before, peak, out.nbytes)
"""


def memory(n):
    if not sys.platform.startswith("linux"):
        print("  peak memory: Linux only (/proc), skipped")
        return None
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return None
    res = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, str(n)], capture_output=True,
                         text=True, env=dict(os.environ))
    if res.returncode:
        print(f"  peak memory: the child failed: {res.stderr.strip()[-300:]}")
        return None
    before, peak, out_bytes = (int(x) for x in res.stdout.split())
    growth = (peak - before) / 1024
    print(f"  peak RSS growth of SDPA (1,1,8192,64) bfloat16 at {n} thread(s): {growth:.1f} MiB;"
          f" output {out_bytes / 2**20:.1f} MiB; target <= output + 8 MiB = "
          f"{out_bytes / 2**20 + 8:.1f} MiB")
    return growth


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--samples", type=int, default=7)
    args = ap.parse_args(argv)
    from cyattn._bench.machine import _cpu_name
    print(f"cyattn {cyattn.__version__} ({_backend.variant}), numpy {np.__version__}, torch "
          f"{torch.__version__ if torch else 'not installed'}, {_cpu_name()}, "
          f"{os.cpu_count()} CPUs")
    formats = _formats()
    for n in args.threads:
        if torch is not None:
            torch.set_num_threads(n)
        print(f"\n{n} thread(s): ratios above 1 mean the first-named call is faster")
        for name, dtype in formats.items():
            decode(name, dtype, n, args.samples)
        for name, dtype in formats.items():
            for T in (512, 2048):
                sdpa(name, dtype, T, n, args.samples)
        for name, dtype in formats.items():
            matmul(name, dtype, n, args.samples)
        memory(n)


if __name__ == "__main__":
    main()
