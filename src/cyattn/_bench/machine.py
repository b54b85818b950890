"""Machine measurements: the single-core FMA peak (the loaded kernels' ``fma_probe``), the
best sgemm rate (NumPy's BLAS and cyattn.matmul_accumulate), the streaming read bandwidth
(NumPy reductions over one or several threads) and the CPU's name. They are the limits the
report divides each case's rate by."""
import math
import platform
import time

import numpy as np


def measure_fma_peak(kernels=None, target=0.15, repeats=5):
    """Single-core float32 FMA peak in GFLOP/s, timing ``kernels.fma_probe`` (best of
    ``repeats`` runs of about ``target`` seconds); None if the module has no probe."""
    if kernels is None:
        from .. import _backend
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
    split over ``n_threads`` Python threads (NumPy releases the GIL in reductions). 2-byte
    arrays (float16, bfloat16) are read as int16, whose max NumPy vectorises."""
    arrays = [a.view(np.int16) if a.itemsize == 2 else a for a in arrays]
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


SGEMM_N = 1024                  # the sgemm rate is measured on n x n x n float32 products


def measure_sgemm(n_threads=1, n=SGEMM_N, repeats=5, pause=0.0):
    """GFLOP/s of an ``n``-cubed float32 product at ``n_threads`` threads: dict with "numpy"
    (``np.matmul(a, b, out=c)``, its BLAS pinned with threadpoolctl when installed) and "cyattn"
    (``cyattn.matmul_accumulate``), each the best of ``repeats`` timed calls after one
    untimed call. With more than one thread, each implementation starts after ``pause`` (the
    harness's) and its warm-up (:func:`settle`): right after NumPy's calls, OpenBLAS's spinning
    workers held the second core, and cyattn's 1024³ product at 2 threads read 222-229 GFLOP/s
    (its 1-thread rate) against 353 in the timed table."""
    import cyattn

    from .timing import settle, thread_limits
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.zeros((n, n), np.float32)
    calls = {"numpy": lambda: np.matmul(a, b, out=c),
             "cyattn": lambda: cyattn.matmul_accumulate(a, b, c, n_threads=n_threads)}
    out = {}
    with thread_limits(n_threads):
        for name, fn in calls.items():
            settle(fn, pause if n_threads > 1 else 0.0)
            best = math.inf
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t0)
            out[name] = 2.0 * n ** 3 / best / 1e9
    return out


def _cpu_name():
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return name
