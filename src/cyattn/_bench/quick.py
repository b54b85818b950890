"""The quick benchmark of ``python -m cyattn bench`` (and of the default command): cyattn vs
NumPy on a few cases at one thread count, printed as a table."""
import math
import sys
import time

import numpy as np

from .cases import np_attention, np_softmax
from .timing import (Progress, env_thread_pins, interleaved, paired_ratio, summary,
                     thread_limits)


class BenchCase:
    """A benchmark case: ``make(n_threads)`` -> dict impl name -> zero-argument callable;
    ``verify()`` -> (cyattn result, NumPy result) for a correctness spot check.

    ``flops`` (floating-point operations per call) gives GFLOP/s; else ``elements`` gives
    ns/element.
    """

    def __init__(self, name, make, verify, flops=None, elements=None):
        self.name = name
        self.make = make
        self.verify = verify
        self.flops = flops
        self.elements = elements

    def rate(self, seconds):
        if self.flops:
            return f"{self.flops / seconds / 1e9:6.1f} GFLOP/s"
        return f"{seconds / self.elements * 1e9:6.2f} ns/el"


def _softmax_case(rows, n, rng):
    import cyattn
    x = rng.standard_normal((8, rows, n)).astype(np.float32)

    def make(n_threads):
        return {"cyattn": lambda: cyattn.softmax(x), "numpy": lambda: np_softmax(x)}
    return BenchCase(f"softmax (8,{rows},{n})", make,
                     lambda: (cyattn.softmax(x), np_softmax(x)), elements=x.size)


def _matmul_case(n, rng):
    import cyattn
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    out_c = np.zeros((n, n), np.float32)
    out_n = np.zeros((n, n), np.float32)

    def make(n_threads):
        def ours():
            cyattn.matmul_accumulate(a, b, out_c, n_threads=n_threads)

        def ref():
            out_n.__iadd__(a @ b)
        return {"cyattn": ours, "numpy": ref}

    def verify():
        return cyattn.matmul_accumulate(a, b, np.zeros((n, n), np.float32)), a @ b
    return BenchCase(f"matmul_accumulate n={n}", make, verify, flops=2.0 * n ** 3)


def _sdpa_case(B, H, T, E, rng):
    import cyattn
    q, k, v = (rng.standard_normal((B, H, T, E)).astype(np.float32) for _ in range(3))
    scale = 1.0 / math.sqrt(E)

    def make(n_threads):
        return {"cyattn": lambda: cyattn.scaled_dot_product_attention(q, k, v,
                                                                      n_threads=n_threads),
                "numpy": lambda: np_attention(q, k, v, scale)}

    def verify():
        return cyattn.scaled_dot_product_attention(q, k, v), np_attention(q, k, v, scale)
    return BenchCase(f"sdpa ({B},{H},{T},{E})", make, verify, flops=4.0 * B * H * T * T * E)


def quick_cases(mode="standard", seed=0):
    """The quick bench's cases. ``mode``: "standard" (the ``bench`` subcommand), "short" (the
    default command) or "quick" (a few tiny cases, for tests)."""
    rng = np.random.default_rng(seed)
    if mode == "quick":
        return [_softmax_case(16, 128, rng), _matmul_case(64, rng), _sdpa_case(1, 2, 64, 32, rng)]
    if mode == "short":
        return [_softmax_case(128, 512, rng), _matmul_case(256, rng),
                _sdpa_case(1, 8, 512, 64, rng)]
    return [_softmax_case(128, 512, rng), _softmax_case(128, 2048, rng), _matmul_case(64, rng),
            _matmul_case(256, rng), _matmul_case(512, rng), _sdpa_case(1, 8, 512, 64, rng),
            _sdpa_case(8, 8, 128, 64, rng)]


_MODES = {  # samples, seconds per sample, pause between samples with > 1 thread
    "standard": (7, 0.03, 0.12),
    "short": (7, 0.02, 0.12),
    "quick": (5, 0.003, 0.05),
}


def _check_close(results, name):
    """A warning string if cyattn's result differs from NumPy's (float32 tolerances)."""
    a, b = (np.asarray(r) for r in results)
    if not np.allclose(a, b, rtol=2e-3, atol=2e-4):
        return f"warning: {name}: cyattn and numpy results differ (max |diff| " \
               f"{float(np.abs(a - b).max()):.3g})"
    return None


def run_quick_bench(n_threads=1, mode="standard", out=None, progress=True):
    """Run the quick bench and print its table to ``out``; returns 0."""
    import cyattn
    out = out or sys.stdout
    samples, target, pause = _MODES[mode]
    if n_threads <= 1:
        pause = 0.0
    cases = quick_cases(mode)
    bar = Progress(len(cases) * samples) if progress else None
    rows, warnings = [], []
    t_start = time.perf_counter()
    with thread_limits(n_threads) as limits:
        for case in cases:
            fns = case.make(n_threads)
            w = _check_close(case.verify(), case.name)
            if w:
                warnings.append(w)
            if bar:
                bar.update(case.name)
            times = interleaved(fns, samples=samples, target=target, pause=pause,
                                tick=(lambda name=case.name: bar.update(name, 1)) if bar else None)
            ours, _, _ = summary(times["cyattn"])
            ref, _, _ = summary(times["numpy"])
            rows.append((case.name, ours, ref, paired_ratio(times["numpy"], times["cyattn"]),
                         case.rate(ours), case.rate(ref)))
    if bar:
        bar.close()
    elapsed = time.perf_counter() - t_start
    env_pins = env_thread_pins(n_threads)
    if limits.active:
        pinned = "numpy's BLAS and OpenMP pinned with threadpoolctl"
    elif env_pins:
        pinned = (f"threadpoolctl not installed: numpy's BLAS and the OpenMP runtime pinned "
                  f"by {', '.join(f'{k}={n_threads}' for k in env_pins)}")
    else:
        pinned = ("threadpoolctl not installed: numpy's BLAS and the OpenMP runtime, so also "
                  "cyattn.softmax, use their default thread counts")
    print(f"bench: float32, {n_threads} thread{'s' if n_threads != 1 else ''} ({pinned}); "
          f"variant {cyattn.config()['variant']}; median of {samples} interleaved samples",
          file=out)
    head = (f"{'case':<26}{'cyattn':>11}{'numpy':>11}{'speedup':>9}"
            f"{'cyattn rate':>17}{'numpy rate':>17}")
    print(head, file=out)
    print("-" * len(head), file=out)
    for name, ours, ref, ratio, r_ours, r_ref in rows:
        print(f"{name:<26}{_fmt_time(ours):>11}{_fmt_time(ref):>11}{ratio:>8.2f}x"
              f"{r_ours:>17}{r_ref:>17}", file=out)
    print(f"speedup = numpy time / cyattn time, median of the paired samples (> 1: cyattn "
          f"is faster); {elapsed:.1f} s", file=out)
    for w in warnings:
        print(w, file=out)
    return 0


def _fmt_time(seconds):
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"
