"""bfloat16 scaled_dot_product_attention on bf16 dot products (issue 40): precision="fast"
against cyattn's float32 call on the same values, precision="exact" (optional) and torch's bf16
SDPA (same tensors, same thread count).

Shapes (1, BH, T, E) for T in --T (default 512 1024 2048), E in --E (64 128), dense and causal.
The calls are interleaved (A B C A B C ...) with an untimed call before each sample; prints
medians, GFLOP/s (4 T^2 E BH, halved for causal) and the median of the paired ratios (above 1:
cyattn fast is faster). The 1-minute load average is printed before and after each thread
count: the host may be shared. Name the CPU with the figures.

    python bench/bench_bf16_attention.py [--threads 1 2] [--samples 7] [--T 512 1024 2048]
        [--E 64 128] [--bh 8] [--exact]

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


def _load():
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def run(T, E, causal, bh, threads, samples, exact):
    import ml_dtypes
    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(T + E)
    q, k, v = (rng.standard_normal((1, bh, T, E)).astype(bf16) for _ in range(3))
    q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))

    def sdpa(a, b, c, **kw):
        return lambda: cyattn.scaled_dot_product_attention(a, b, c, is_causal=causal,
                                                          n_threads=threads, **kw)
    fns = {"cyattn fast": sdpa(q, k, v, precision="fast"),
           "cyattn float32": sdpa(q32, k32, v32)}
    if exact:
        fns["cyattn exact"] = sdpa(q, k, v, precision="exact")
    if torch is not None:
        torch.set_num_threads(threads)
        qt, kt, vt = (torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) for x in (q, k, v))
        F = torch.nn.functional
        fns["torch bf16"] = lambda: F.scaled_dot_product_attention(qt, kt, vt,
                                                                   is_causal=causal)
    times = interleaved(fns, samples=samples, target=0.1, pause=0.15 if threads > 1 else 0.0)
    flops = 4.0 * bh * T * T * E * (0.5 if causal else 1.0)
    label = f"(1,{bh},{T},{E}) {'causal' if causal else 'dense '}"
    parts = [f"{name} {flops / statistics.median(t) / 1e9:6.1f}" for name, t in times.items()]
    ratios = [f"vs {ref} {paired_ratio(times[ref], times['cyattn fast']):5.2f}x"
              for ref in times if ref != "cyattn fast"]
    print(f"  {label}  GFLOP/s: {', '.join(parts)};  fast {', '.join(ratios)}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--samples", type=int, default=7)
    ap.add_argument("--T", type=int, nargs="+", default=[512, 1024, 2048])
    ap.add_argument("--E", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--bh", type=int, default=8)
    ap.add_argument("--exact", action="store_true", help="also time precision='exact'")
    args = ap.parse_args(argv)
    from cyattn._bench.machine import _cpu_name
    print(f"cyattn {cyattn.__version__} ({_backend.variant}; BF16_DOT="
          f"{getattr(_backend.kernels, 'BF16_DOT', False)}), torch "
          f"{torch.__version__ if torch else 'not installed'}, {_cpu_name()}, "
          f"{os.cpu_count()} CPUs")
    for threads in args.threads:
        print(f"\n{threads} thread(s); load average (1 min) before: {_load():.2f}")
        for T in args.T:
            for E in args.E:
                for causal in (False, True):
                    run(T, E, causal, args.bh, threads, args.samples, args.exact)
        print(f"  load average (1 min) after: {_load():.2f}")


if __name__ == "__main__":
    main()
