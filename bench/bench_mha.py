"""Multi-head attention forward: cyattn.MultiHeadAttention vs torch.nn.MultiheadAttention.

float32, ``batch_first``, self-attention (query = key = value), ``need_weights=False``, the same
weights in both (``MultiHeadAttention.from_torch``). For each shape (N, L, E, heads) and thread
count the two forwards run interleaved in one process (A B A B ...); the table gives medians per
call and the median of the paired ratios (torch / cyattn: above 1 means cyattn is faster).

Threads: NumPy's BLAS and torch's pool are set to the count with threadpoolctl and
torch.set_num_threads; cyattn's attention kernel runs on the calling thread (see the
MultiHeadAttention docstring), so its projections get the BLAS threads. Samples are separated
by a pause on 2 threads, because OpenBLAS's idle threads spin for a while after a call.

    python bench/bench_mha.py [--threads 1 2] [--samples 7]

Needs: cyattn, threadpoolctl, torch.
"""
import argparse
import statistics

import numpy as np
import torch
from threadpoolctl import threadpool_limits

import cyattn
from cyattn._bench import interleaved, paired_ratio

SHAPES = [(1, 1, 384, 12), (1, 16, 384, 12), (1, 42, 384, 12), (8, 42, 384, 12),
          (1, 256, 512, 8), (1, 1024, 512, 8)]


def run(threads, samples):
    rows = []
    for n in threads:
        torch.set_num_threads(n)
        with threadpool_limits(limits=n):
            for (N, L, E, H) in SHAPES:
                torch.manual_seed(0)
                ref = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
                ours = cyattn.MultiHeadAttention.from_torch(ref)
                x = np.random.default_rng(0).standard_normal((N, L, E)).astype(np.float32)
                tx = torch.from_numpy(x)

                def cy(x=x, ours=ours):
                    return ours(x, x, x, need_weights=False)[0]

                def th(tx=tx, ref=ref):
                    with torch.inference_mode():
                        return ref(tx, tx, tx, need_weights=False)[0]

                np.testing.assert_allclose(cy(), th().numpy(), rtol=1e-4, atol=1e-5)
                t = interleaved({"cyattn": cy, "torch": th}, samples=samples, target=0.03,
                                pause=0.15 if n > 1 else 0.0)
                rows.append((n, (N, L, E, H), statistics.median(t["cyattn"]),
                             statistics.median(t["torch"]), paired_ratio(t["torch"], t["cyattn"])))
    print(f"{'threads':>7}  {'(N, L, E, heads)':<20}{'cyattn':>12}{'torch':>12}{'torch/cyattn':>14}")
    for n, shape, a, b, r in rows:
        print(f"{n:>7}  {str(shape):<20}{a * 1e6:>10.0f}us{b * 1e6:>10.0f}us{r:>13.2f}x")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--samples", type=int, default=7)
    args = p.parse_args(argv)
    run(args.threads, args.samples)


if __name__ == "__main__":
    main()
