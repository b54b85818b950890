"""SDPA at 1 and 2 threads against ONNX Runtime, all four interleaved in one process (issue 46).

Per round, each of cyattn at 1 thread, ONNX Runtime at 1 thread, cyattn at 2 threads and ONNX
Runtime at 2 threads in turn, timed by the bench harness's ``interleaved`` (a pause of 0.05 s,
untimed calls, then calls for about ``--target`` seconds). Prints each one's median time, the
median over rounds of the paired ratios ONNX Runtime / cyattn at each thread count (> 1:
cyattn faster) and each engine's 2-thread speed-up. float32, no mask, scale 1 / sqrt(E).
Usage::

    PYTHONPATH=src python bench/bench_sdpa_threads.py --shape 8,8,128,64
    PYTHONPATH=src python bench/bench_sdpa_threads.py --shape 1,8,2048,64 --rounds 7
"""
import argparse
import statistics

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8,8,128,64", help="B,H,L,E (S = L, Ev = E)")
    ap.add_argument("--target", type=float, default=0.05, help="seconds of calls a sample")
    ap.add_argument("--rounds", type=int, default=11)
    args = ap.parse_args(argv)
    import cyattn
    from cyattn._bench import peers
    from cyattn._bench.timing import interleaved, paired_ratio
    shape = tuple(int(a) for a in args.shape.split(","))
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    out = np.empty_like(q)
    fns = {}
    for t in (1, 2):
        fns[f"cyattn {t}"] = (lambda t=t: cyattn.scaled_dot_product_attention(
            q, k, v, out=out, n_threads=t))
        ort = peers.ort_attention(q, k, v, None, False, 1 / np.sqrt(shape[-1]), t)
        fns[f"ort {t}"] = ort[0] if isinstance(ort, tuple) else ort
    res = interleaved(fns, samples=args.rounds, target=args.target, pause=0.05)

    def ratio(a, b):
        return paired_ratio(res[a], res[b])

    print(f"sdpa {shape} float32; {args.rounds} rounds of about {args.target} s a sample")
    for name in fns:
        print(f"  {name:<9} {statistics.median(res[name]) * 1e3:8.3f} ms")
    print(f"  ort / cyattn: {ratio('ort 1', 'cyattn 1'):.3f} at 1 thread, "
          f"{ratio('ort 2', 'cyattn 2'):.3f} at 2 (> 1: cyattn faster)")
    print(f"  2-thread speed-up: cyattn {ratio('cyattn 1', 'cyattn 2'):.3f}, "
          f"ort {ratio('ort 1', 'ort 2'):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
