"""Attention variants (issue 24): sliding window, softcap, sinks, ALiBi, key lengths.

Each line times cyattn calls side by side in one process, interleaved (A B A B ...), and gives
the median of the paired ratios (above 1: the first-named call is faster):

* window=(255, 0) + causal on (1, 8, 8192, 64) against the same call without a window, and
  against torch.nn.functional.scaled_dot_product_attention given the equivalent bool mask;
* decode, L = 1, S = 32768, window=(4095, 0) + bottom_right causal, against a decode call over
  only the last 4096 keys (a contiguous copy of them);
* softcap / sinks / alibi_slopes on T = 512 and 2048 (B=1, H=8, E=64) against the plain call;
* key_lengths against the equivalent bool key-padding mask (B=4, H=8, L=S=1024, lengths
  1024/768/512/256).

    python bench/bench_variants.py [--threads 1] [--samples 7]

Needs: cyattn; torch for the torch column (skipped with a note without it).
"""
import argparse
import statistics

import numpy as np

import cyattn
from cyattn._bench import interleaved, paired_ratio

try:
    import torch
except ImportError:  # optional peer
    torch = None


def _qkv(rng, B, H, L, S, E, dtype=np.float32):
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, H, S, E)).astype(dtype)
    v = rng.standard_normal((B, H, S, E)).astype(dtype)
    return q, k, v


def _line(label, times, a, b):
    ma, mb = statistics.median(times[a]), statistics.median(times[b])
    r = paired_ratio(times[b], times[a])
    print(f"{label:<46}{a:>14} {ma * 1e3:9.3f} ms {b:>14} {mb * 1e3:9.3f} ms  {r:6.2f}x")
    return r


def run(n, samples):
    rng = np.random.default_rng(0)
    pause = 0.15 if n > 1 else 0.0
    results = {}
    if torch is not None:
        torch.set_num_threads(n)
    print(f"threads={n}; ratio = second / first (above 1: the first is faster)")

    # 1. sliding window on a long causal prefill
    q, k, v = _qkv(rng, 1, 8, 8192, 8192, 64)
    i = np.arange(8192)[:, None]
    j = np.arange(8192)[None, :]
    band = (j <= i) & (j >= i - 255)

    def win():
        return cyattn.scaled_dot_product_attention(q, k, v, is_causal=True, window=(255, 0),
                                                   n_threads=n)

    def full():
        return cyattn.scaled_dot_product_attention(q, k, v, is_causal=True, n_threads=n)

    fns = {"window": win, "no window": full}
    ref = cyattn.scaled_dot_product_attention(q, k, v, band, n_threads=n)
    np.testing.assert_allclose(win(), ref, rtol=1e-5, atol=1e-6)
    if torch is not None:
        tq, tk, tv, tm = (torch.from_numpy(x) for x in (q, k, v, band))

        def th():
            with torch.inference_mode():
                return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, tm)

        np.testing.assert_allclose(th().numpy(), ref, rtol=1e-4, atol=1e-5)
        fns["torch mask"] = th
    t = interleaved(fns, samples=samples, target=0.05, pause=pause)
    results["window_vs_full"] = _line("window (255,0) causal (1,8,8192,64)", t, "window",
                                      "no window")
    if torch is not None:
        results["window_vs_torch"] = _line("  vs torch SDPA + bool band mask", t, "window",
                                           "torch mask")
    del q, k, v, band, ref

    # 2. decode with a window
    q, k, v = _qkv(rng, 1, 32, 1, 32768, 128)
    k_last = np.ascontiguousarray(k[:, :, -4096:])
    v_last = np.ascontiguousarray(v[:, :, -4096:])

    def dwin():
        return cyattn.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                   causal_alignment="bottom_right",
                                                   window=(4095, 0), n_threads=n)

    def dlast():
        return cyattn.scaled_dot_product_attention(q, k_last, v_last, n_threads=n)

    np.testing.assert_allclose(dwin(), dlast(), rtol=1e-5, atol=1e-6)
    t = interleaved({"window": dwin, "last 4096": dlast}, samples=samples, target=0.05,
                    pause=pause)
    results["decode_window"] = _line("decode (1,32,1,32768,128) window 4096", t, "last 4096",
                                     "window")

    # 3. softcap, sinks, ALiBi against the plain call
    for T in (512, 2048):
        q, k, v = _qkv(rng, 1, 8, T, T, 64)
        sinks = rng.standard_normal(8)
        slopes = 2.0 ** -np.arange(1, 9)
        calls = {
            "plain": lambda: cyattn.scaled_dot_product_attention(q, k, v, n_threads=n),
            "softcap": lambda: cyattn.scaled_dot_product_attention(q, k, v, softcap=20.0,
                                                                    n_threads=n),
            "sinks": lambda: cyattn.scaled_dot_product_attention(q, k, v, sinks=sinks,
                                                                  n_threads=n),
            "alibi": lambda: cyattn.scaled_dot_product_attention(q, k, v, alibi_slopes=slopes,
                                                                  n_threads=n),
        }
        t = interleaved(calls, samples=samples, target=0.05, pause=pause)
        for name in ("softcap", "sinks", "alibi"):
            results[f"{name}_{T}"] = _line(f"{name} (1,8,{T},64): plain / {name}", t, "plain",
                                           name)

    # 4. key_lengths against a bool padding mask
    lengths = np.array([1024, 768, 512, 256])
    q, k, v = _qkv(rng, 4, 8, 1024, 1024, 64)
    pad = (np.arange(1024)[None, :] < lengths[:, None])[:, None, None, :]

    def by_len():
        return cyattn.scaled_dot_product_attention(q, k, v, key_lengths=lengths[:, None],
                                                   n_threads=n)

    def by_mask():
        return cyattn.scaled_dot_product_attention(q, k, v, pad, n_threads=n)

    np.testing.assert_allclose(by_len(), by_mask(), rtol=1e-6, atol=1e-7)
    t = interleaved({"key_lengths": by_len, "bool mask": by_mask}, samples=samples,
                    target=0.05, pause=pause)
    results["key_lengths"] = _line("key_lengths (4,8,1024,64) vs bool padding mask", t,
                                   "key_lengths", "bool mask")
    return results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1])
    p.add_argument("--samples", type=int, default=7)
    args = p.parse_args(argv)
    if torch is None:
        print("torch not installed: the torch column is skipped")
    for n in args.threads:
        run(n, args.samples)


if __name__ == "__main__":
    main()
