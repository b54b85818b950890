"""bfloat16 matmul_accumulate on bf16 dot products (issue 40): precision="fast" against
precision="exact" and torch's bf16 ``addmm_`` (same tensors, same thread count).

Sizes n^3 (default 1024), out bfloat16 (out += a @ b), interleaved (A B C A B C ...) with an
untimed call before each sample; prints medians, minimums, GFLOP/s and the median of the
paired ratios (above 1: the first-named call is faster). Name the CPU with the figures.

    python bench/bench_bf16_matmul.py [--threads 1 2] [--samples 15] [--n 1024]

Needs ml_dtypes; torch for its column.
"""
import argparse
import os
import statistics

import numpy as np

import cyattn
from cyattn import _backend
from cyattn._bench import interleaved, paired_ratio

try:
    import torch
except ImportError:  # optional peer
    torch = None


def run(n, threads, samples):
    import ml_dtypes
    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(2)
    a, b = (rng.standard_normal((n, n)).astype(bf16) for _ in range(2))
    outs = {k: np.zeros((n, n), bf16) for k in ("fast", "exact")}
    fns = {f"cyattn {p}": (lambda p=p: cyattn.matmul_accumulate(a, b, outs[p], precision=p,
                                                                 n_threads=threads))
           for p in ("fast", "exact")}
    if torch is not None:
        torch.set_num_threads(threads)
        at, bt, ot = (torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
                      for x in (a, b, np.zeros((n, n), bf16)))
        fns["torch addmm_"] = lambda: ot.addmm_(at, bt)
    times = interleaved(fns, samples=samples, target=0.05, pause=0.15 if threads > 1 else 0.0)
    flops = 2.0 * n ** 3
    print(f"\n{threads} thread(s), {n}^3, bf16 in and out")
    for name, t in times.items():
        print(f"  {name:<14} median {statistics.median(t) * 1e3:8.3f} ms  min "
              f"{min(t) * 1e3:8.3f} ms  {flops / statistics.median(t) / 1e9:7.1f} GFLOP/s "
              f"(best {flops / min(t) / 1e9:.1f})")
    for ref in [k for k in times if k != "cyattn fast"]:
        print(f"  cyattn fast vs {ref:<14} {paired_ratio(times[ref], times['cyattn fast']):6.2f}x"
              f" (median of paired ratios)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--n", type=int, default=1024)
    args = ap.parse_args(argv)
    from cyattn._bench.machine import _cpu_name
    print(f"cyattn {cyattn.__version__} ({_backend.variant}; bf16: "
          f"{cyattn.config()['bf16_matmul']}), torch "
          f"{torch.__version__ if torch else 'not installed'}, {_cpu_name()}, "
          f"{os.cpu_count()} CPUs")
    for threads in args.threads:
        run(args.n, threads, args.samples)


if __name__ == "__main__":
    main()
