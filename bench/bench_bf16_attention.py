"""bfloat16 scaled_dot_product_attention on bf16 dot products (issue 40): precision="fast"
against cyattn's float32 call on the same values, precision="exact" (optional) and torch's bf16
SDPA (same tensors, same thread count).

Shapes (1, BH, T, E) for T in --T (default 512 1024 2048), E in --E (64 128), dense and causal.
The calls are interleaved (A B C A B C ...) with an untimed call before each sample; prints
medians, GFLOP/s (4 T^2 E BH, halved for causal) and the median of the paired ratios (above 1:
cyattn fast is faster). The 1-minute load average is printed before and after each thread
count: the host may be shared. Name the CPU with the figures.

    python bench/bench_bf16_attention.py [--threads 1 2] [--samples 7] [--T 512 1024 2048]
        [--E 64 128] [--bh 8] [--exact] [--decode | --decode-only]

``--decode`` (issue 45's decode target; ``--decode-only``: that alone): grouped bf16 decode,
(8, 32 query / 8 K/V heads, S = --decode-S (4096), E = 128), L = 1 and L = 4 (bottom-right
causal): precision="fast" (AMX tiles in the amx variant: the query heads of a group as the
tiles' rows), "exact" (widened to float32, the decode path every other variant takes), torch's
bf16 SDPA, and NumPy reading the same K and V once; printed: each call's median time and the
fast call's K+V read rate as a fraction of NumPy's read (target: >= 90 %), and the paired
ratios of the others' times to the fast call's.

Needs ml_dtypes; torch for its column.
"""
import argparse
import os
import statistics

import numpy as np

import cyattn
from cyattn import _backend
from cyattn._bench import interleaved, paired_ratio, read_once

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


def run_decode(L, S, threads, samples):
    import ml_dtypes
    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(S + L)
    B, Hq, Hk, E = 8, 32, 8, 128
    q = rng.standard_normal((B, Hq, L, E)).astype(bf16)
    k, v = (rng.standard_normal((B, Hk, S, E)).astype(bf16) for _ in range(2))
    kw = dict(enable_gqa=True, n_threads=threads)
    if L > 1:
        kw.update(is_causal=True, causal_alignment="bottom_right")
    fns = {"cyattn fast": lambda: cyattn.scaled_dot_product_attention(q, k, v, precision="fast",
                                                                      **kw),
           "cyattn exact": lambda: cyattn.scaled_dot_product_attention(q, k, v,
                                                                       precision="exact", **kw),
           "read K+V": read_once([k, v], threads)}
    if torch is not None:
        torch.set_num_threads(threads)
        qt, kt, vt = (torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) for x in (q, k, v))
        F = torch.nn.functional
        fns["torch bf16"] = lambda: F.scaled_dot_product_attention(
            qt, kt, vt, enable_gqa=True, is_causal=L > 1)
    times = interleaved(fns, samples=samples, target=0.1, pause=0.15 if threads > 1 else 0.0)
    med = {name: statistics.median(t) for name, t in times.items()}
    gbs = (k.nbytes + v.nbytes) / med["cyattn fast"] / 1e9
    label = f"decode ({B},{Hq}q/{Hk}kv,{S},{E}) L={L}"
    parts = [f"{name} {t * 1e3:.3f} ms" for name, t in med.items()]
    ratios = [f"{ref} {paired_ratio(times[ref], times['cyattn fast']):5.2f}x"
              for ref in times if ref not in ("cyattn fast", "read K+V")]
    print(f"  {label}: {', '.join(parts)}; fast reads K+V at {gbs:.1f} GB/s = "
          f"{med['read K+V'] / med['cyattn fast']:.0%} of NumPy's read; time over fast's: "
          f"{', '.join(ratios)}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--samples", type=int, default=7)
    ap.add_argument("--T", type=int, nargs="+", default=[512, 1024, 2048])
    ap.add_argument("--E", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--bh", type=int, default=8)
    ap.add_argument("--exact", action="store_true", help="also time precision='exact'")
    ap.add_argument("--decode", action="store_true", help="also the grouped decode cases")
    ap.add_argument("--decode-only", action="store_true", help="only the grouped decode cases")
    ap.add_argument("--decode-S", type=int, default=4096)
    args = ap.parse_args(argv)
    from cyattn._bench.machine import _cpu_name
    print(f"cyattn {cyattn.__version__} ({_backend.variant}; BF16_DOT="
          f"{getattr(_backend.kernels, 'BF16_DOT', False)}), torch "
          f"{torch.__version__ if torch else 'not installed'}, {_cpu_name()}, "
          f"{os.cpu_count()} CPUs")
    for threads in args.threads:
        print(f"\n{threads} thread(s); load average (1 min) before: {_load():.2f}")
        for T in ([] if args.decode_only else args.T):
            for E in args.E:
                for causal in (False, True):
                    run(T, E, causal, args.bh, threads, args.samples, args.exact)
        if args.decode or args.decode_only:
            for L in (1, 4):
                run_decode(L, args.decode_S, threads, args.samples)
        print(f"  load average (1 min) after: {_load():.2f}")


if __name__ == "__main__":
    main()
