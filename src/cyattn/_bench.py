"""Timing helpers and the quick benchmark of ``python -m cyattn bench`` (cyattn vs NumPy).

Measurement rules (see bench/README.md in the repository for the full harness):

* Samples of the implementations are **interleaved** (A B A B ...) so that drift in clock speed
  and background load hits both alike; each sample runs a calibrated number of calls (at least
  ``target`` seconds) and records the time per call. We report the median per implementation
  and the **median of the paired ratios** (NumPy time / cyattn time of the same round).
* NumPy's BLAS is pinned to the same thread count as cyattn with ``threadpoolctl`` when it is
  installed (it limits the OpenMP runtime too, which is how :func:`cyattn.softmax`, which has no
  ``n_threads`` argument, gets the same count). Without it, the table says so.
* ``OPENBLAS_CORETYPE`` / ``OPENBLAS_L2_SIZE`` in the environment make OpenBLAS pick slow kernels
  (up to 5x). They act when numpy is loaded, so the bench re-runs itself in a child process
  without them (:func:`blas_env_overrides`, :func:`rerun_without_blas_overrides`) and says so.
* With more than one thread, OpenBLAS workers busy-spin for ~0.1 s after a call, which would
  slow whatever runs next on a small machine: samples are then separated by a pause.
"""
import gc
import math
import os
import statistics
import subprocess
import sys
import sysconfig
import time

import numpy as np

__all__ = ["BLAS_ENV_VARS", "blas_env_overrides", "rerun_without_blas_overrides", "child_env",
           "calibrate", "interleaved", "summary", "paired_ratio", "Progress", "thread_limits",
           "np_softmax", "np_masked_softmax", "np_attention", "quick_cases", "run_quick_bench"]

BLAS_ENV_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_CHILD_MARK = "CYATTN_BENCH_CLEAN_ENV"


# ------------------------------------------------------------------------------------------
# Environment
# ------------------------------------------------------------------------------------------


def blas_env_overrides(environ=None):
    """The OpenBLAS tuning variables set in ``environ`` (default os.environ), as a dict."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in BLAS_ENV_VARS if k in environ}


def child_env(remove=(), extra=None):
    """A copy of os.environ without ``remove``, able to import this same cyattn package.

    When cyattn was imported from a source tree (not from site-packages), that tree is put in
    front of PYTHONPATH so the child does not pick up another install.
    """
    env = {k: v for k, v in os.environ.items() if k not in remove}
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    site_dirs = {os.path.abspath(p) for p in (sysconfig.get_paths()["purelib"],
                                              sysconfig.get_paths()["platlib"])}
    if pkg_parent not in site_dirs:
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if pkg_parent not in parts:
            env["PYTHONPATH"] = os.pathsep.join([pkg_parent] + parts)
    if extra:
        env.update(extra)
    return env


def rerun_without_blas_overrides(args, out=None):
    """If OpenBLAS overrides are set (and this is not already the clean child), run
    ``python <args>`` without them and return its exit code; else return None.

    ``args`` is the argument list after the interpreter, e.g. ``["-m", "cyattn", "bench"]``.
    """
    found = blas_env_overrides()
    if not found or os.environ.get(_CHILD_MARK):
        return None
    out = out or sys.stdout
    names = ", ".join(f"{k}={v}" for k, v in found.items())
    verb, it = ("are", "them") if len(found) > 1 else ("is", "it")
    print(f"bench: {names} {verb} set in the environment and slow{'' if len(found) > 1 else 's'} "
          f"numpy's OpenBLAS; re-running the benchmark in a child process without {it} "
          f"(this process's environment is left as it is)", file=out, flush=True)
    env = child_env(remove=BLAS_ENV_VARS, extra={_CHILD_MARK: "1"})
    return subprocess.call([sys.executable] + list(args), env=env)


class thread_limits:
    """Context manager: limit BLAS and OpenMP thread pools with threadpoolctl if installed.

    ``self.active`` tells whether threadpoolctl was available.
    """

    def __init__(self, n_threads):
        self.n_threads = n_threads
        self.active = False
        self._ctx = None

    def __enter__(self):
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            return self
        self._ctx = threadpool_limits(limits=self.n_threads)
        self._ctx.__enter__()
        self.active = True
        return self

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
        return False


# ------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------


def _time_calls(fn, number):
    gc_was = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - t0) / number
    finally:
        if gc_was:
            gc.enable()


def calibrate(fn, target):
    """Calls per sample so that one sample lasts about ``target`` seconds (at least 1)."""
    fn()                                   # warm up: first-call allocations, page faults
    t = _time_calls(fn, 1)
    if t >= target:
        return 1
    number = max(1, int(target / max(t, 1e-7)))
    t = _time_calls(fn, min(number, 1000))   # refine once with a longer run
    return max(1, int(math.ceil(target / max(t, 1e-9))))


def interleaved(fns, samples=7, target=0.02, pause=0.0, tick=None):
    """Time each callable of ``fns`` (a dict name -> fn) ``samples`` times, interleaved.

    Round r runs every function once in order (A B A B ...), each for a calibrated number of
    calls; returns a dict name -> list of seconds per call, one per round. ``pause`` seconds of
    sleep separate samples; ``tick()`` is called after each round.
    """
    numbers = {name: calibrate(fn, target) for name, fn in fns.items()}
    times = {name: [] for name in fns}
    for _ in range(samples):
        for name, fn in fns.items():
            if pause:
                time.sleep(pause)
            times[name].append(_time_calls(fn, numbers[name]))
        if tick:
            tick()
    return times


def summary(values):
    """(median, min, max) of a list of samples."""
    return statistics.median(values), min(values), max(values)


def paired_ratio(reference, ours):
    """Median over rounds of reference[i] / ours[i] (> 1: ours is faster)."""
    return statistics.median(r / o for r, o in zip(reference, ours))


class Progress:
    """A progress bar on stderr: ``[#####.....] 3/7 softmax (8,128,512)`` redrawn in place on a
    terminal; elsewhere (a log, a pipe) one plain line per new label instead."""

    def __init__(self, total, stream=None, width=24):
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = 0
        self._label = None

    def update(self, label="", step=0):
        self.done += step
        filled = int(self.width * self.done / self.total)
        line = f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {label}"
        if self.tty:
            pad = max(0, self._last - len(line))
            self.stream.write("\r" + line + " " * pad)
            self._last = len(line)
        elif label != self._label:
            self.stream.write("bench: " + line + "\n")
        self._label = label
        self.stream.flush()

    def close(self):
        if self.tty:
            self.stream.write("\r" + " " * self._last + "\r")
            self.stream.flush()


# ------------------------------------------------------------------------------------------
# NumPy references
# ------------------------------------------------------------------------------------------


def np_softmax(x):
    """Stable softmax over the last axis, the way NumPy code usually writes it."""
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_masked_softmax(x, mask):
    """Stable softmax over the last axis of the entries where ``mask`` is True."""
    return np_softmax(np.where(mask, x, np.array(-np.inf, dtype=x.dtype)))


def np_attention(q, k, v, scale, add_mask=None):
    """``softmax(q @ k^T * scale (+ add_mask)) @ v`` in NumPy."""
    s = q @ np.swapaxes(k, -1, -2)
    s *= s.dtype.type(scale)
    if add_mask is not None:
        s += add_mask
    return np_softmax(s) @ v


# ------------------------------------------------------------------------------------------
# The quick benchmark
# ------------------------------------------------------------------------------------------


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
    pinned = ("numpy's BLAS and OpenMP pinned with threadpoolctl" if limits.active else
              "threadpoolctl not installed: numpy's BLAS uses its default thread count")
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
