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
  slow whatever runs next on a small machine: samples are then separated by a pause, and an
  untimed call after the pause keeps the slow first call after a sleep out of the sample.

The full harness (``python -m cyattn bench --full``, ``bench/run.py`` in a checkout) lives here
too, so that it runs from an installed package: cyattn vs NumPy vs PyTorch (when installed) on
the cases of :func:`build_specs`, with the machine's FMA peak (:func:`measure_fma_peak`) and
streaming read bandwidth (:func:`measure_read_bandwidth`), peak memory growth per case in a fresh
process (:func:`measure_memory`), a Markdown report (:func:`render_markdown`) and a PNG plot
(:func:`write_plot`, needs matplotlib). Only NumPy is required; torch, threadpoolctl and
matplotlib are used when installed.
"""
import datetime
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import sysconfig
import time
import zlib
from pathlib import Path

import numpy as np

__all__ = ["BLAS_ENV_VARS", "blas_env_overrides", "rerun_without_blas_overrides", "child_env",
           "calibrate", "interleaved", "summary", "paired_ratio", "Progress", "thread_limits",
           "np_softmax", "np_masked_softmax", "np_attention", "quick_cases", "run_quick_bench",
           "FULL_GROUPS", "Spec", "sdpa_flops", "build_specs", "select_specs", "prepare",
           "measure_fma_peak", "measure_read_bandwidth", "measure_memory", "run_full",
           "render_markdown", "write_plot", "add_full_arguments", "check_full_arguments",
           "full_main", "checkout_root", "default_outdir", "parse_thread_list"]

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
    sleep separate samples, each followed by one untimed call: here the first call after a
    sleep ran 1.5-2.5x slower for every implementation (decode at 2 threads: 9-15 ms, then
    5-6 ms), which with a few calls per sample decided the ratio. ``tick()`` is called after
    each round.
    """
    numbers = {name: calibrate(fn, target) for name, fn in fns.items()}
    times = {name: [] for name in fns}
    for _ in range(samples):
        for name, fn in fns.items():
            if pause:
                time.sleep(pause)
                fn()
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
              "threadpoolctl not installed: numpy's BLAS and the OpenMP runtime, so also "
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


# ==========================================================================================
# The full harness: ``python -m cyattn bench --full`` and bench/run.py (a thin CLI over this)
# ==========================================================================================

IMPLS = ("cyattn", "numpy", "torch")
KV_READ = "read K+V"         # decode only: NumPy reading K and V once, the bandwidth yardstick
FULL_GROUPS = ("softmax", "matmul", "sdpa", "decode", "tiny")
SOFTMAX_L = (128, 512, 2048)                       # x of shape (8, 128, L)
MATMUL_N = (16, 64, 256, 512, 1024)
SDPA_BHT = ((1, 1, 128), (8, 8, 128), (1, 8, 512), (1, 8, 1024), (1, 8, 2048), (1, 1, 4096),
            (1, 1, 8192))
SDPA_KINDS = ("dense", "causal", "padding")
HEAD_DIM = 64
DECODE_SHAPE = (1, 32, 1, 4096, 128)               # (B, H, L, S, E)
DECODE_SHORT_SHAPE = (1, 32, 1, 512, 128)          # early in generation: 512 cached positions
TINY_SHAPE = (1, 1, 8, 8, 8)                       # (B, H, L, S, E)
QUICK_SELECTION = {"softmax": (512,), "matmul": (64, 256, 1024),
                   "sdpa": ((8, 8, 128), (1, 8, 512))}
# samples per implementation, seconds per sample, pause between samples with > 1 thread
FULL_SETTINGS = {"full": (7, 0.03, 0.2), "quick": (5, 0.01, 0.2)}
PLOT_NAME = "sdpa_gflops.png"
_MEM_MARK = "CYATTN_BENCH_MEMORY "
_MIB = 1024.0 * 1024.0


def sdpa_flops(B, H, L, S, E, causal=False):
    """Floating-point operations of attention: ``4 B H L S E`` (Q K^T and P V, a multiply and
    an add each), half of that when causal. A padding mask does not change the count."""
    flops = 4.0 * B * H * L * S * E
    return flops / 2 if causal else flops


class Spec:
    """One case of the full harness, rebuilt from ``(group, shape, kind)`` (also in a child
    process, see :func:`measure_memory`).

    ``group``: softmax (shape (8, 128, L), kind "" or "mask"), matmul (shape (n,)), sdpa /
    decode / tiny (shape (B, H, L, S, E), kind "dense", "causal" or "padding").
    """

    __slots__ = ("group", "shape", "kind")

    def __init__(self, group, shape, kind=""):
        if group not in FULL_GROUPS:
            raise ValueError(f"unknown case group {group!r}")
        self.group, self.shape, self.kind = group, tuple(int(s) for s in shape), kind

    def to_json(self):
        return {"group": self.group, "shape": list(self.shape), "kind": self.kind}

    @classmethod
    def from_json(cls, d):
        return cls(d["group"], d["shape"], d.get("kind", ""))

    def __repr__(self):
        return f"Spec({self.group!r}, {self.shape}, {self.kind!r})"

    @property
    def attention(self):
        return self.group in ("sdpa", "decode", "tiny")

    @property
    def name(self):
        s = self.shape
        if self.group == "softmax":
            return f"softmax ({s[0]},{s[1]},{s[2]})" + (" bool mask" if self.kind == "mask" else "")
        if self.group == "matmul":
            return f"matmul n={s[0]}"
        B, H, L, S, E = s
        if self.group == "decode":
            return f"decode B={B} H={H} L={L} S={S} E={E}"
        if self.group == "tiny":
            return f"tiny ({B},{H},{L},{E})"
        return f"sdpa ({B},{H},{L},{E})" + {"dense": "", "causal": " causal",
                                           "padding": " padding mask"}[self.kind]

    @property
    def flops(self):
        """Floating-point operations per call (None for softmax: rated in ns per element)."""
        if self.group == "softmax":
            return None
        if self.group == "matmul":
            return 2.0 * self.shape[0] ** 3
        return sdpa_flops(*self.shape, causal=self.kind == "causal")

    @property
    def elements(self):
        return math.prod(self.shape) if self.group == "softmax" else None

    @property
    def kv_bytes(self):
        """Bytes of K and V (attention groups), each read once by an ideal kernel."""
        if not self.attention:
            return None
        B, H, L, S, E = self.shape
        return 2 * B * H * S * E * 4

    @property
    def out_bytes(self):
        """Bytes of the result (float32)."""
        if self.group == "softmax":
            return math.prod(self.shape) * 4
        if self.group == "matmul":
            return self.shape[0] ** 2 * 4
        B, H, L, S, E = self.shape
        return B * H * L * E * 4

    @property
    def seq_len(self):
        return self.shape[2] if self.attention else None


def build_specs(groups=FULL_GROUPS, quick=False):
    """The cases of the full harness (``quick``: a subset), in report order."""
    specs = []
    if "softmax" in groups:
        for L in (QUICK_SELECTION["softmax"] if quick else SOFTMAX_L):
            specs += [Spec("softmax", (8, 128, L)), Spec("softmax", (8, 128, L), "mask")]
    if "matmul" in groups:
        specs += [Spec("matmul", (n,)) for n in (QUICK_SELECTION["matmul"] if quick else MATMUL_N)]
    if "sdpa" in groups:
        for B, H, T in (QUICK_SELECTION["sdpa"] if quick else SDPA_BHT):
            specs += [Spec("sdpa", (B, H, T, T, HEAD_DIM), kind) for kind in SDPA_KINDS]
    if "decode" in groups:
        specs.append(Spec("decode", DECODE_SHAPE, "dense"))
        if not quick:
            specs.append(Spec("decode", DECODE_SHORT_SHAPE, "dense"))
    if "tiny" in groups:
        specs.append(Spec("tiny", TINY_SHAPE, "dense"))
    return specs


def select_specs(specs, only):
    """The specs whose name contains one of the strings ``only`` (a string or a list; case
    insensitive); all of them if ``only`` is empty."""
    if not only:
        return list(specs)
    words = [only.lower()] if isinstance(only, str) else [w.lower() for w in only]
    return [s for s in specs if any(w in s.name.lower() for w in words)]


# ------------------------------------------------------------------------------------------
# Optional PyTorch
# ------------------------------------------------------------------------------------------

_torch_cache = []


def torch_module():
    """The torch module if it is installed (imported once), else None."""
    if not _torch_cache:
        try:
            import torch
        except ImportError:
            torch = None
        _torch_cache.append(torch)
    return _torch_cache[0]


# ------------------------------------------------------------------------------------------
# Case inputs and implementations
# ------------------------------------------------------------------------------------------


def prepare(spec, impls=IMPLS, seed=0):
    """Allocate the inputs of ``spec`` and return ``(make, reference)``.

    ``make(n_threads)`` -> dict impl -> zero-argument callable (the timed call);
    ``reference()`` -> dict impl -> zero-argument callable returning a result to compare
    (differs from the timed call only for matmul, whose timed call accumulates in place).
    Inputs are random (seeded by ``seed`` and the case name), float32.
    """
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    torch = torch_module() if "torch" in impls else None
    impls = tuple(i for i in impls if i != "torch" or torch is not None)
    builder = {"softmax": _prepare_softmax, "matmul": _prepare_matmul}.get(spec.group,
                                                                          _prepare_attention)
    make, reference = builder(spec, impls, rng, torch)
    return make, reference


def _keep(d, impls):
    return {k: f for k, f in d.items() if k in impls}


def _prepare_softmax(spec, impls, rng, torch):
    import cyattn
    x = rng.standard_normal(spec.shape, dtype=np.float32)
    mask = None
    if spec.kind == "mask":
        mask = rng.random(x.shape) < 0.8
        mask[..., 0] = True                      # no fully masked row (NumPy would give NaN)
    xt = torch.from_numpy(x) if torch is not None else None
    mt = torch.from_numpy(mask) if torch is not None and mask is not None else None

    # cyattn writes into a preallocated out= (rows in cache, the measure): a fresh
    # 4 MiB NumPy result costs ~1000 page faults per call, more than the softmax itself, while
    # torch's caching allocator hands back the same block. NumPy's reference allocates.
    out = np.empty_like(x)

    def make(n_threads):
        d = {"cyattn": lambda: cyattn.softmax(x, mask=mask, out=out)}
        if mask is not None:
            d["numpy"] = lambda: np_masked_softmax(x, mask)
            if torch is not None:
                d["torch"] = lambda: torch.softmax(xt.masked_fill(~mt, -math.inf), -1)
        else:
            d["numpy"] = lambda: np_softmax(x)
            if torch is not None:
                d["torch"] = lambda: torch.softmax(xt, -1)
        return _keep(d, impls)
    return make, lambda: make(None)


def _prepare_matmul(spec, impls, rng, torch):
    import cyattn
    n = spec.shape[0]
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    oc, on = np.zeros((n, n), np.float32), np.zeros((n, n), np.float32)
    if torch is not None:
        at, bt, ot = torch.from_numpy(a), torch.from_numpy(b), torch.zeros((n, n))

    def make(n_threads):
        d = {"cyattn": lambda: cyattn.matmul_accumulate(a, b, oc, n_threads=n_threads),
             "numpy": lambda: on.__iadd__(a @ b)}
        if torch is not None:
            d["torch"] = lambda: ot.add_(torch.matmul(at, bt))
        return _keep(d, impls)

    def reference():
        d = {"cyattn": lambda: cyattn.matmul_accumulate(a, b, np.zeros((n, n), np.float32)),
             "numpy": lambda: a @ b}
        if torch is not None:
            d["torch"] = lambda: torch.matmul(at, bt)
        return _keep(d, impls)
    return make, reference


def padding_keep(B, S):
    """Key padding mask (B, 1, 1, S), True = take part: even batch entries keep the first
    3/4 of the keys, odd ones the first 7/8."""
    keep = np.ones((B, 1, 1, S), dtype=bool)
    for b in range(B):
        keep[b, ..., S - (S // 4 if b % 2 == 0 else S // 8):] = False
    return keep


def _prepare_attention(spec, impls, rng, torch):
    import cyattn
    B, H, L, S, E = spec.shape
    q = rng.standard_normal((B, H, L, E), dtype=np.float32)
    k = rng.standard_normal((B, H, S, E), dtype=np.float32)
    v = rng.standard_normal((B, H, S, E), dtype=np.float32)
    scale = 1.0 / math.sqrt(E)
    causal = spec.kind == "causal"
    keep = padding_keep(B, S) if spec.kind == "padding" else None
    add = None
    if "numpy" in impls:
        if causal:
            add = np.triu(np.full((L, S), -np.inf, np.float32), 1)
        elif keep is not None:
            add = np.where(keep, np.float32(0), np.float32(-np.inf)).astype(np.float32)
    if torch is not None:
        import torch.nn.functional as F
        qt, kt, vt = (torch.from_numpy(t) for t in (q, k, v))
        mt = torch.from_numpy(keep) if keep is not None else None

    def make(n_threads):
        d = {"cyattn": lambda: cyattn.scaled_dot_product_attention(
                 q, k, v, attn_mask=keep, is_causal=causal, n_threads=n_threads),
             "numpy": lambda: np_attention(q, k, v, scale, add)}
        if torch is not None:
            d["torch"] = lambda: F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mt,
                                                                 is_causal=causal)
        if spec.group == "decode" and KV_READ in impls:
            d[KV_READ] = read_once([k, v], n_threads or 1)
        return _keep(d, impls)
    return make, lambda: _keep(make(None), IMPLS)


def check_case(reference):
    """Run each reference call once: (names whose result differs from cyattn's, dict name ->
    error message for those that raised)."""
    results, errors = {}, {}
    for name, fn in reference().items():
        try:
            results[name] = np.asarray(fn())
        except Exception as exc:  # a failing implementation is reported, not fatal
            errors[name] = f"{type(exc).__name__}: {exc}"
    ref = results.get("cyattn")
    differs = [] if ref is None else [
        name for name, r in results.items()
        if name != "cyattn" and (r.shape != ref.shape or
                                 not np.allclose(r, ref, rtol=2e-3, atol=2e-4))]
    return differs, errors


# ------------------------------------------------------------------------------------------
# Machine measurements
# ------------------------------------------------------------------------------------------


def measure_fma_peak(kernels=None, target=0.15, repeats=5):
    """Single-core float32 FMA peak in GFLOP/s, timing ``kernels.fma_probe`` (best of
    ``repeats`` runs of about ``target`` seconds); None if the module has no probe."""
    if kernels is None:
        from . import _backend
        kernels = _backend.kernels
    probe = getattr(kernels, "fma_probe", None)
    if probe is None:
        return None
    iters = 1000
    while True:
        t0 = time.perf_counter()
        probe(iters)
        dt = time.perf_counter() - t0
        if dt >= min(0.01, target) or iters >= 1 << 40:
            break
        iters *= 8
    iters = max(1, int(iters * target / max(dt, 1e-9)))
    best, flops = math.inf, 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        flops, _checksum = probe(iters)
        best = min(best, time.perf_counter() - t0)
    return flops / best / 1e9


_pools = {}


def read_once(arrays, n_threads=1):
    """A callable that reads every element of ``arrays`` once (NumPy ``max`` reductions),
    split over ``n_threads`` Python threads (NumPy releases the GIL in reductions)."""
    if n_threads <= 1:
        def read():
            for a in arrays:
                a.max()
        return read
    from concurrent.futures import ThreadPoolExecutor
    pool = _pools.get(n_threads)
    if pool is None:
        pool = _pools[n_threads] = ThreadPoolExecutor(max_workers=n_threads)
    chunks = [c for a in arrays for c in np.array_split(a.reshape(-1), n_threads) if c.size]
    return lambda: list(pool.map(np.max, chunks))


def measure_read_bandwidth(nbytes, n_threads=1, repeats=7):
    """Streaming read bandwidth in GB/s: best of ``repeats`` reads (:func:`read_once`) of a
    float32 array of ``nbytes``."""
    a = np.ones(max(1, nbytes // 4), dtype=np.float32)
    read = read_once([a], n_threads)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        read()
        best = min(best, time.perf_counter() - t0)
    return a.nbytes / best / 1e9


# ------------------------------------------------------------------------------------------
# Peak memory growth, one case and implementation per fresh process
# ------------------------------------------------------------------------------------------


def _status_kib(field):
    """A ``kB`` field of /proc/self/status (VmRSS, VmHWM) or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _reset_peak_rss():
    """Reset VmHWM to the current RSS (Linux >= 4.0); True if that worked."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_kib("VmHWM") is not None
    except OSError:
        return False


def _maxrss_kib():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss     # KiB on Linux


def _memory_child(spec_json, impl, n_threads):
    """Body of the child process of :func:`measure_memory`: prints one JSON line."""
    spec = Spec.from_json(json.loads(spec_json))
    if impl == "torch":
        torch_module().set_num_threads(n_threads)
    with thread_limits(n_threads):
        make, _ = prepare(spec, (impl,))
        fn = make(n_threads)[impl]
        gc.collect()
        before = _status_kib("VmRSS")
        maxrss_before = _maxrss_kib()
        exact = _reset_peak_rss()
        result = fn()
        peak = _status_kib("VmHWM") if exact else _maxrss_kib()
        del result
    upper_bound = not exact and peak <= maxrss_before   # the call never exceeded the old peak
    print(_MEM_MARK + json.dumps({
        "growth_mib": max(0, peak - before) / 1024.0, "rss_before_mib": before / 1024.0,
        "method": "VmHWM after clear_refs" if exact else "ru_maxrss",
        "upper_bound": upper_bound}), flush=True)


def memory_supported():
    return sys.platform.startswith("linux") and _status_kib("VmRSS") is not None


def measure_memory(spec, impl, n_threads, timeout=1800):
    """Peak RSS growth (MiB) of one call of ``impl`` on ``spec`` in a fresh Python process,
    measured from the RSS with the inputs allocated. Returns a dict with ``growth_mib`` (and
    ``upper_bound`` when only ``ru_maxrss`` was available and the call stayed below an
    earlier peak), or with ``error``."""
    code = ("import sys; from cyattn import _bench; "
            "_bench._memory_child(sys.argv[1], sys.argv[2], int(sys.argv[3]))")
    try:
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(spec.to_json()), impl,
                               str(n_threads)], env=child_env(), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(_MEM_MARK):
            return json.loads(line[len(_MEM_MARK):])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"exit code {proc.returncode}: {tail}"}


# ------------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------------


def _cpu_name():
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return name


def run_full(specs, threads=(1, 2), samples=7, target=0.03, pause=0.2, use_torch=True,
             memory=True, notes=(), progress=True, seed=0):
    """Measure ``specs`` at each thread count; returns the result dict that
    :func:`render_markdown` and :func:`write_plot` take (and that is saved as JSON)."""
    import cyattn
    from . import _backend
    t_start = time.perf_counter()
    torch = torch_module() if use_torch else None
    impls = ("cyattn", "numpy") + (("torch",) if torch is not None else ())
    notes = list(notes)
    if use_torch and torch is None:
        notes.append("PyTorch is not installed: no torch column.")
    memory = memory and bool(specs)
    if memory and not memory_supported():
        notes.append("Peak memory growth not measured (needs Linux /proc).")
        memory = False
    mem_threads = max(threads)
    n_mem = len(specs) * len(impls) if memory else 0
    bar = Progress(len(specs) * len(threads) * samples + n_mem + 2) if progress else None
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

    # the machine: FMA peak of the loaded kernel variant, streaming read bandwidth
    if bar:
        bar.update("machine: FMA peak, read bandwidth")
    peak = measure_fma_peak(_backend.kernels)
    bw_bytes = Spec("decode", DECODE_SHAPE, "dense").kv_bytes
    bandwidth = {str(n): measure_read_bandwidth(bw_bytes, n) for n in threads}
    if bar:
        bar.update("machine: FMA peak, read bandwidth", 1)

    rows, limits_active = [], False
    for n in threads:
        if torch is not None:
            torch.set_num_threads(n)
        with thread_limits(n) as limits:
            limits_active = limits.active
            for spec in specs:
                label = f"{n}T {spec.name}"
                if bar:
                    bar.update(label)
                make, reference = prepare(spec, impls + (KV_READ,), seed)
                differs, errors = check_case(reference)
                fns = {k: f for k, f in make(n).items() if k not in errors}
                times = interleaved(fns, samples=samples, target=target,
                                    pause=pause if n > 1 else 0.0,
                                    tick=(lambda label=label: bar.update(label, 1)) if bar
                                    else None)
                rows.append({"case": spec.name, "spec": spec.to_json(), "threads": n,
                             "times": times, "differs": differs, "errors": errors})
                del make, reference, fns
                if n > 1:
                    time.sleep(pause)

    # the FMA peak again (a busy machine only ever lowers it): the larger of the two counts
    if bar:
        bar.update("machine: FMA peak")
    peak_end = measure_fma_peak(_backend.kernels)
    if bar:
        bar.update("machine: FMA peak", 1)
    if peak is not None and peak_end is not None:
        peak = max(peak, peak_end)

    mem = []
    if memory:
        for spec in specs:
            label = f"memory {spec.name}"
            if bar:
                bar.update(label)
            entry = {"case": spec.name, "spec": spec.to_json(), "threads": mem_threads,
                     "out_mib": spec.out_bytes / _MIB, "impls": {}}
            for impl in impls:
                entry["impls"][impl] = measure_memory(spec, impl, mem_threads)
                if bar:
                    bar.update(label, 1)
            mem.append(entry)
    if bar:
        bar.close()

    elapsed = time.perf_counter() - t_start
    if load0 is not None:
        load1 = os.getloadavg()[0]
        busy = load0 > 0.5 or load1 > max(threads) + 0.5      # our own run adds ~threads
        notes.append(f"Load average (1 min) {load0:.2f} at the start, {load1:.2f} at the end"
                     + ("; other processes were running, so timings (especially with 2 "
                        "threads) are less reliable." if busy else "."))
    if max(threads) > (os.cpu_count() or 1):
        notes.append(f"More threads requested ({max(threads)}) than logical CPUs "
                     f"({os.cpu_count()}): expect oversubscription.")
    cfg = cyattn.config()
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu": _cpu_name(), "logical_cpus": os.cpu_count(),
        "python": platform.python_version(), "numpy": np.__version__,
        "torch": torch.__version__ if torch is not None else None,
        "cyattn": cfg["version"], "variant": cfg["variant"],
        "available_variants": cfg["available_variants"], "cpu_features": cfg["cpu_features"],
        "openmp": cfg["openmp"], "impls": list(impls), "threads": list(threads),
        "samples": samples, "target": target, "pause": pause, "limits_active": limits_active,
        "fma_peak_gflops": peak, "bandwidth_gbs": bandwidth, "bandwidth_bytes": bw_bytes,
        "memory_threads": mem_threads if memory else None, "notes": notes,
        "elapsed_s": elapsed,
    }
    return {"meta": meta, "rows": rows, "memory": mem}


# ------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------

_TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))


def _sig(x):
    """Three significant digits, no exponent."""
    ax = abs(x)
    return f"{x:.0f}" if ax >= 100 else f"{x:.1f}" if ax >= 10 else f"{x:.2f}" if ax >= 1 \
        else f"{x:.3f}"


def fmt_time(seconds, lo=None, hi=None):
    """``4.56 ms`` or, with ``lo``/``hi``, ``4.56 ms (4.40–4.90)`` in one unit."""
    scale, unit = next(((s, u) for s, u in _TIME_UNITS if seconds >= s), _TIME_UNITS[-1])
    text = f"{_sig(seconds / scale)} {unit}"
    if lo is not None and hi is not None:
        text += f" ({_sig(lo / scale)}–{_sig(hi / scale)})"
    return text


class _Row:
    """Derived numbers of one result row."""

    def __init__(self, row, meta):
        self.row, self.meta = row, meta
        self.spec = Spec.from_json(row["spec"])
        self.threads = row["threads"]
        self.times = row["times"]

    def has(self, impl):
        return bool(self.times.get(impl))

    def median(self, impl):
        return statistics.median(self.times[impl]) if self.has(impl) else None

    def ratio(self, impl):
        """Median over rounds of impl time / cyattn time (> 1: cyattn is faster)."""
        if not (self.has(impl) and self.has("cyattn")):
            return None
        return paired_ratio(self.times[impl], self.times["cyattn"])

    def gflops(self, impl):
        m = self.median(impl)
        return self.spec.flops / m / 1e9 if m and self.spec.flops else None

    def pct_peak(self, impl):
        g, peak = self.gflops(impl), self.meta.get("fma_peak_gflops")
        return 100.0 * g / (peak * self.threads) if g is not None and peak else None

    def ns_per_element(self, impl):
        m = self.median(impl)
        return m / self.spec.elements * 1e9 if m and self.spec.elements else None

    def kv_gbs(self, impl):
        m = self.median(impl)
        return self.spec.kv_bytes / m / 1e9 if m and self.spec.kv_bytes else None

    def pct_bandwidth(self, impl):
        """Percent of the speed of reading K and V once: median over rounds of the NumPy
        read's time / impl time (the header's bandwidth when the read was not timed)."""
        if self.has(KV_READ) and self.has(impl):
            return 100.0 * paired_ratio(self.times[KV_READ], self.times[impl])
        g = self.kv_gbs(impl)
        bw = self.meta.get("bandwidth_gbs", {}).get(str(self.threads))
        return 100.0 * g / bw if g is not None and bw else None

    def time_cell(self, impl):
        if impl in self.row.get("errors", {}):
            return "error"
        if not self.has(impl):
            return "-"
        med, lo, hi = summary(self.times[impl])
        return fmt_time(med, lo, hi) + (" (differs!)" if impl in self.row.get("differs", ())
                                        else "")

    def rate_cell(self, impl):
        g = self.spec.group
        if not self.has(impl):
            return "-"
        if g == "softmax":
            return _ns(self.ns_per_element(impl))
        if g == "decode":
            pct = self.pct_bandwidth(impl)
            return f"{_sig(self.kv_gbs(impl))}" + (f" ({pct:.0f} %)" if pct is not None else "")
        pct = self.pct_peak(impl)
        return f"{_sig(self.gflops(impl))}" + (f" ({pct:.0f} %)" if pct is not None else "")


def _ns(v):
    return f"{v:.2f}" if v < 10 else _sig(v)


def _ratio_text(r):
    return "-" if r is None else f"{r:.2f}×"


def _geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _targets(rows, mem, meta):
    """Rows (target, case, {threads: cell}) of the summary table."""
    impls = meta["impls"]
    has_torch = "torch" in impls
    by = {}
    for r in rows:
        by.setdefault(r.spec.name, {})[r.threads] = r
    out = []

    def add(target, spec_filter, cell, geomean_of=None):
        picked = [name for name, per in by.items() if spec_filter(next(iter(per.values())).spec)]
        for name in picked:
            out.append((target, name, {n: cell(r) for n, r in by[name].items()}))
        if geomean_of and len(picked) > 1:
            cells = {}
            for n in meta["threads"]:
                g = _geomean([geomean_of(by[name][n]) for name in picked if n in by[name]])
                cells[n] = f"**{g:.2f}×**" if g else "-"
            out.append((target, "geometric mean", cells))

    def vs(other, rate, unit=""):
        def cell(r):
            ratio = r.ratio(other)
            if ratio is None:
                return "-"
            return (f"**{ratio:.2f}×** (cyattn {rate(r, 'cyattn')}, {other} {rate(r, other)}"
                    f"{unit})")
        return cell

    def gf(r, impl):
        g = r.gflops(impl)
        return "-" if g is None else _sig(g)

    def tm(r, impl):
        m = r.median(impl)
        return "-" if m is None else fmt_time(m)

    def ns(r, impl):
        v = r.ns_per_element(impl)
        return "-" if v is None else _ns(v)

    def is_sdpa(kind, lo=0, hi=math.inf):
        return lambda s: s.group == "sdpa" and s.kind == kind and lo <= s.seq_len <= hi

    if has_torch:
        add("SDPA T ≥ 512 vs torch", is_sdpa("dense", 512), vs("torch", gf, " GFLOP/s"),
            geomean_of=lambda r: r.ratio("torch"))
        add("SDPA (8,8,128) vs torch", lambda s: s.group == "sdpa" and s.kind == "dense"
            and s.shape[:3] == (8, 8, 128), vs("torch", gf, " GFLOP/s"))
        add("SDPA causal T = 512..2048 vs torch causal", is_sdpa("causal", 512, 2048),
            vs("torch", gf, " GFLOP/s"), geomean_of=lambda r: r.ratio("torch"))
        add("decode vs torch", lambda s: s.group == "decode", vs("torch", tm))

    def bw_cell(r):
        parts = []
        for impl in impls:
            g, pct = r.kv_gbs(impl), r.pct_bandwidth(impl)
            if g is None:
                continue
            txt = f"{impl} {_sig(g)} GB/s" + (f" = {pct:.0f} %" if pct is not None else "")
            parts.append(f"**{txt}**" if impl == "cyattn" else txt)
        ref = r.kv_gbs(KV_READ)
        if ref is not None:
            return "; ".join(parts) + f" (NumPy reads K+V at {_sig(ref)} GB/s)"
        bw = meta.get("bandwidth_gbs", {}).get(str(r.threads))
        return "; ".join(parts) + (f" (of {_sig(bw)} GB/s)" if bw else "")
    add("decode: K+V bytes / time, % of the speed of reading K+V once",
        lambda s: s.group == "decode", bw_cell)

    def tiny_cell(r):
        m = r.median("cyattn")
        if m is None:
            return "-"
        txt = f"**{_sig(m * 1e6)} µs**"
        if has_torch and r.has("torch"):
            txt += f" (torch {_sig(r.median('torch') * 1e6)} µs: **{r.ratio('torch'):.2f}×**)"
        return txt
    add("tiny: µs per call" + (", vs torch" if has_torch else ""),
        lambda s: s.group == "tiny", tiny_cell)
    if has_torch:
        add("softmax ns/element vs torch", lambda s: s.group == "softmax",
            vs("torch", ns, " ns/el"))
    add("matmul_accumulate vs NumPy a @ b", lambda s: s.group == "matmul",
        vs("numpy", gf, " GFLOP/s"))

    for entry in mem:
        spec = Spec.from_json(entry["spec"])
        if not (spec.group == "sdpa" and spec.shape[:2] == (1, 1) and spec.seq_len >= 8192):
            continue
        cy = entry["impls"].get("cyattn", {})
        if "growth_mib" not in cy:
            cell = "error"
        else:
            cell = (f"**{_fmt_mib(cy)} = {cy['growth_mib'] / entry['out_mib']:.1f}×** the "
                    f"{fmt_size(entry['out_mib'])} output")
            others = [f"{impl} {_fmt_mib(entry['impls'][impl])}" for impl in impls[1:]
                      if "growth_mib" in entry["impls"].get(impl, {})]
            if others:
                cell += " (" + ", ".join(others) + ")"
        out.append((f"SDPA peak memory growth, one head (fresh process, {entry['threads']} "
                    f"thread{'s' if entry['threads'] != 1 else ''})", entry["case"],
                    {entry["threads"]: cell}))
    return out


def fmt_size(mib):
    """``256 B``, ``145 KiB``, ``2.09 MiB``, ``1.02 GiB`` from a size in MiB."""
    n = mib * _MIB
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= scale:
            return f"{_sig(n / scale)} {unit}"
    return f"{n:.0f} B"


def _fmt_mib(m):
    if "growth_mib" not in m:
        return "error"
    return ("≤ " if m.get("upper_bound") else "") + fmt_size(m["growth_mib"])


_SECTIONS = (
    ("softmax", "Softmax", "ns per element (lower is better)"),
    ("matmul", "matmul_accumulate", "GFLOP/s (% of FMA peak × threads)"),
    ("sdpa", "Scaled dot-product attention, head dim 64", "GFLOP/s (% of FMA peak × threads)"),
    ("decode", "Decode step", "GB/s of K+V (% of the speed of reading K+V once)"),
    ("tiny", "Tiny call", "GFLOP/s (% of FMA peak × threads)"),
)


def _table(head, rows):
    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join("---" if i < 2 else "---:" for i in range(len(head))) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def render_markdown(result):
    """The Markdown report of a :func:`run_full` result."""
    meta = result["meta"]
    impls = meta["impls"]
    rows = [_Row(r, meta) for r in result["rows"]]
    order = {}
    for r in rows:
        order.setdefault(r.spec.name, len(order))
    rows.sort(key=lambda r: (order[r.spec.name], r.threads))
    peak = meta.get("fma_peak_gflops")
    bw = meta.get("bandwidth_gbs") or {}
    plural = "s" if len(meta["threads"]) != 1 else ""
    lines = [
        "# cyattn benchmark: cyattn vs NumPy" + (" vs PyTorch" if "torch" in impls else ""), "",
        f"- {meta['date']}, {meta['cpu']}, {meta['logical_cpus']} logical CPUs, "
        f"Python {meta['python']}",
        f"- cyattn {meta['cyattn']} variant `{meta['variant']}` (available: "
        f"{', '.join(meta['available_variants'])}; OpenMP {'on' if meta['openmp'] else 'off'}),"
        f" numpy {meta['numpy']}" + (f", torch {meta['torch']}" if meta.get("torch") else ""),
        "- FMA peak: " + (f"**{_sig(peak)} GFLOP/s per core** (float32, `fma_probe` of the "
                          f"`{meta['variant']}` kernels, one thread, best of 5 runs at the "
                          f"start and 5 at the end of the timings)"
                          if peak else "not measured (this build's kernels have no "
                                       "`fma_probe`): no % of peak"),
        "- Streaming read bandwidth (NumPy `max` over "
        f"{meta['bandwidth_bytes'] / _MIB:.0f} MiB, the size of the decode case's K+V, best "
        "of 7): " + ", ".join(f"**{_sig(v)} GB/s** with {n} thread{'s' if n != '1' else ''}"
                             for n, v in bw.items()),
        f"- float32. Each time: median of {meta['samples']} sample"
        f"{'s' if meta['samples'] != 1 else ''} (min–max) of at least "
        f"{meta['target'] * 1e3:.0f} ms each (one call if longer), the implementations' samples "
        f"interleaved in one process, thread count{plural} {', '.join(map(str, meta['threads']))}"
        f" (cyattn `n_threads`; softmax: the OpenMP limit; torch.set_num_threads; NumPy's BLAS "
        + ("via threadpoolctl)." if meta["limits_active"] else
           "not limited: threadpoolctl is not installed)."),
        "- **" + ", ".join(f"`vs {i}`" for i in impls[1:]) + ": median over rounds of (other "
        "time / cyattn time) in the same round; > 1 means cyattn is faster.** GFLOP/s: "
        "4·B·H·L·S·E for attention (half for causal; a padding mask counts as dense), 2n³ for "
        "matmul, from the median time.",
    ] + [f"- {note}" for note in meta["notes"]] + [""]

    targets = _targets(rows, result.get("memory", []), meta)
    if targets:
        lines += ["## Targets", ""]
        head = ["target", "case"] + [f"{n} thread{'s' if n != 1 else ''}"
                                     for n in meta["threads"]]
        extra = sorted({n for _, _, cells in targets for n in cells} - set(meta["threads"]))
        head += [f"{n} threads" for n in extra]
        cols = list(meta["threads"]) + extra
        lines += _table(head, [[t, c] + [cells.get(n, "-") for n in cols]
                               for t, c, cells in targets])
        lines.append("")

    for group, title, unit in _SECTIONS:
        sect = [r for r in rows if r.spec.group == group]
        if not sect:
            continue
        lines += [f"## {title}: time per call, {unit}", ""]
        extra = [KV_READ] if any(r.has(KV_READ) for r in sect) else []
        head = ["case", "threads"] + impls + [f"vs {i}" for i in impls[1:]] + \
            [f"{i} rate" for i in impls] + [f"{i} (NumPy max)" for i in extra]
        body = []
        for r in sect:
            body.append([r.spec.name, r.threads] + [r.time_cell(i) for i in impls]
                        + [_ratio_text(r.ratio(i)) for i in impls[1:]]
                        + [r.rate_cell(i) for i in impls]
                        + [f"{r.time_cell(i)}, {_sig(r.kv_gbs(i))} GB/s" if r.has(i) else "-"
                           for i in extra])
        lines += _table(head, body)
        errors = [f"- {r.spec.name}, {r.threads} thread(s), {impl}: {msg}"
                  for r in sect for impl, msg in r.row.get("errors", {}).items()]
        lines += [""] + (errors + [""] if errors else [])

    mem = result.get("memory") or []
    if mem:
        n = mem[0]["threads"]
        lines += [f"## Peak memory growth of one call (fresh process per case and "
                  f"implementation, {n} thread{'s' if n != 1 else ''})", "",
                  "Peak RSS during the call minus RSS with the inputs allocated; includes the "
                  "result. `≤`: an upper bound (the call stayed below an earlier peak).", ""]
        head = ["case", "output"] + impls + ["cyattn / output"]
        body = []
        for e in mem:
            cy = e["impls"].get("cyattn", {})
            rel = (f"{cy['growth_mib'] / e['out_mib']:.1f}×" if "growth_mib" in cy
                   and e["out_mib"] else "-")
            body.append([e["case"], fmt_size(e["out_mib"])]
                        + [_fmt_mib(e["impls"].get(i, {})) for i in impls] + [rel])
        lines += _table(head, body)
        errs = [f"- {e['case']}, {i}: {m['error']}" for e in mem for i, m in e["impls"].items()
                if "error" in m]
        lines += [""] + (errs + [""] if errs else [])

    lines.append(f"Total run time {meta['elapsed_s']:.0f} s.")
    return "\n".join(lines) + "\n"


def write_plot(result, path):
    """PNG: SDPA GFLOP/s vs sequence length per implementation and thread count (one panel per
    dense / causal / padding). Returns the path, or None when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    meta = result["meta"]
    rows = [_Row(r, meta) for r in result["rows"]]
    sdpa = [r for r in rows if r.spec.group == "sdpa"]
    kinds = [k for k in SDPA_KINDS if any(r.spec.kind == k for r in sdpa)]
    if not kinds:
        return None
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 4.4), sharey=True,
                             squeeze=False)
    colors = {"cyattn": "C0", "numpy": "C1", "torch": "C2"}
    styles = ["-", "--", ":", "-."]
    per_len = {}
    for r in sdpa:                       # per T, plot the case with the most heads x batch
        bh = r.spec.shape[0] * r.spec.shape[1]
        per_len[r.spec.seq_len] = max(per_len.get(r.spec.seq_len, 0), bh)
    peak = meta.get("fma_peak_gflops")
    for ax, kind in zip(axes[0], kinds):
        for impl in meta["impls"]:
            for ti, n in enumerate(meta["threads"]):
                pts = sorted((r.spec.seq_len, r.gflops(impl)) for r in sdpa
                             if r.spec.kind == kind and r.threads == n and r.has(impl)
                             and r.spec.shape[0] * r.spec.shape[1] == per_len[r.spec.seq_len])
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts],
                            marker="os^D"[ti % 4], markersize=5,
                            markerfacecolor=colors.get(impl) if ti == 0 else "none",
                            color=colors.get(impl), linestyle=styles[ti % len(styles)],
                            label=f"{impl}, {n} thread{'s' if n != 1 else ''}")
        if peak:
            for ti, n in enumerate(meta["threads"]):
                ax.axhline(peak * n, color="0.6", linewidth=0.8,
                           linestyle=styles[ti % len(styles)],
                           label=f"FMA peak × {n}" if ax is axes[0][0] else None)
        ax.set_xscale("log", base=2)
        ticks = sorted(per_len)
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
        title = {"dense": "dense", "causal": "causal (half the FLOPs counted)",
                 "padding": "padding mask (FLOPs counted dense)"}[kind]
        ax.set_title(f"SDPA {title}, E = {HEAD_DIM}", fontsize=10)
        ax.set_xlabel("sequence length T (L = S)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("GFLOP/s")
    axes[0][0].legend(fontsize=7, loc="best")
    bh = ", ".join(f"T={t}: {per_len[t]}" for t in sorted(per_len))
    fig.suptitle(f"cyattn {meta['variant']} vs numpy" + (" vs torch" if "torch" in meta["impls"]
                                                         else "")
                 + f", float32, {meta['cpu']}, {meta['date']}\nB·H per point: {bh}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------
# Command line (bench/run.py and ``python -m cyattn bench --full``)
# ------------------------------------------------------------------------------------------


def checkout_root():
    """The repository root when cyattn is imported from a checkout's src/, else None."""
    root = Path(__file__).resolve().parent.parent.parent
    if (root / "pyproject.toml").is_file() and (root / "bench").is_dir() and \
            (root / "src" / "cyattn").is_dir():
        return root
    return None


def default_outdir():
    """bench/results of the checkout cyattn was imported from, else the current directory."""
    root = checkout_root()
    return root / "bench" / "results" if root is not None else Path.cwd()


def parse_thread_list(text):
    """``"1,2"`` -> [1, 2]; ValueError unless all are positive integers."""
    threads = [int(t) for t in str(text).split(",") if t.strip()]
    if not threads or min(threads) < 1:
        raise ValueError(f"expected comma-separated positive integers, got {text!r}")
    return threads


def add_full_arguments(parser, common=True):
    """Add the full harness's options to ``parser`` (``common``: also --quick and
    --threads, which ``python -m cyattn bench`` defines itself)."""
    if common:
        parser.add_argument("--quick", action="store_true",
                            help="fewer cases (softmax L=512, matmul n=64/256/1024, SDPA (8,8,128)"
                                 " and (1,8,512), decode, tiny) and 5 shorter samples")
        parser.add_argument("--threads", default="1,2",
                            help="comma-separated thread counts (default 1,2)")
    parser.add_argument("--cases", default=None,
                        help=f"comma-separated case groups among {','.join(FULL_GROUPS)} "
                             f"(default all)")
    parser.add_argument("--only", action="append", default=None, metavar="TEXT",
                        help="keep only cases whose name contains TEXT, e.g. 'sdpa (1,1,8192' "
                             "(repeat for several)")
    parser.add_argument("--samples", type=int, default=None,
                        help="samples per implementation (default 7, --quick 5)")
    parser.add_argument("--min-time", type=float, default=None, metavar="SECONDS",
                        help="minimum duration of one sample (default 0.03, --quick 0.01)")
    parser.add_argument("--no-memory", action="store_true",
                        help="skip the peak-memory measurements (fresh processes)")
    parser.add_argument("--no-torch", action="store_true",
                        help="leave PyTorch out even if it is installed")
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG plot")
    parser.add_argument("--outdir", default=None,
                        help="directory for latest.md, latest.json and the PNG (default: "
                             "bench/results of a checkout, else the current directory)")


def check_full_arguments(parser, args):
    """Validate and normalise the options of :func:`add_full_arguments` (parser.error on
    bad ones): ``args.threads`` becomes a list, ``args.cases`` a tuple."""
    if isinstance(args.threads, str) or args.threads is None:
        try:
            args.threads = parse_thread_list(args.threads or "1,2")
        except ValueError as exc:
            parser.error(f"--threads: {exc}")
    cases = [c.strip() for c in (args.cases or ",".join(FULL_GROUPS)).split(",") if c.strip()]
    unknown = sorted(set(cases) - set(FULL_GROUPS))
    if unknown or not cases:
        parser.error(f"--cases: unknown group(s) {unknown}; choose among {', '.join(FULL_GROUPS)}")
    args.cases = tuple(cases)
    if args.samples is not None and args.samples < 1:
        parser.error("--samples: expected a positive integer")
    if args.min_time is not None and args.min_time < 0:
        parser.error("--min-time: expected a non-negative number of seconds")
    return args


def full_main(args, rerun_args, outdir=None, out=None):
    """Run the full harness with parsed and checked options ``args``; write latest.md,
    latest.json and the PNG into ``args.outdir`` (else ``outdir``, else
    :func:`default_outdir`). ``rerun_args``: this command's arguments after the interpreter,
    for the re-run without OpenBLAS overrides. Returns the exit code."""
    out = out or sys.stdout
    rc = rerun_without_blas_overrides(rerun_args, out=out)
    if rc is not None:
        return rc
    notes = []
    if os.environ.get(_CHILD_MARK):
        notes.append("Re-run in a child process without OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE "
                     "(they were set in the parent's environment and slow numpy's OpenBLAS).")
    specs = select_specs(build_specs(args.cases, args.quick), args.only)
    if not specs:
        print("bench --full: no case matches --cases/--only", file=sys.stderr)
        return 2
    samples, target, pause = FULL_SETTINGS["quick" if args.quick else "full"]
    samples = args.samples or samples
    target = target if args.min_time is None else args.min_time
    outdir = Path(args.outdir or outdir or default_outdir())
    result = run_full(specs, threads=args.threads, samples=samples, target=target, pause=pause,
                      use_torch=not args.no_torch, memory=not args.no_memory, notes=notes)
    text = render_markdown(result)
    outdir.mkdir(parents=True, exist_ok=True)
    md, js = outdir / "latest.md", outdir / "latest.json"
    md.write_text(text, encoding="utf-8")
    js.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    written = [md, js]
    plot_msg = None
    if args.no_plot:
        plot_msg = "PNG plot skipped (--no-plot)"
    elif not any(r["spec"]["group"] == "sdpa" for r in result["rows"]):
        plot_msg = "PNG plot skipped (no SDPA case)"
    elif write_plot(result, outdir / PLOT_NAME) is None:
        plot_msg = ("PNG plot skipped: matplotlib is not installed "
                    "(pip install 'cyattn[bench]' or matplotlib)")
    else:
        written.append(outdir / PLOT_NAME)
    print(text, file=out)
    if plot_msg:
        print(f"bench: {plot_msg}", file=out)
    print("bench: wrote " + ", ".join(str(p) for p in written), file=out, flush=True)
    return 0
