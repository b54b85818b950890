"""Hardening: cyattn under concurrency, fork, long runs, failed calls and extreme sizes.

1. Concurrency: 16 Python threads x 1,000 mixed calls on shared read-only inputs give the serial
   results bit for bit and leave the inputs untouched (also on a free-threaded build).
2. GIL: while a worker thread is demonstrably inside a kernel (its own CPU clock is in the middle
   of the call), the main thread runs Python; two kernel calls run at the same time.
3. Free-threaded CPython: importing cyattn keeps the GIL off, and test 1 runs without it.
4. Fork: children (and a grandchild) of a parent that used OpenMP teams compute the parent's
   results, for every function, with any n_threads, also when another parent thread was inside a
   kernel at the fork.
5. Leaks: RSS is flat over 100,000 small and 1,000 large calls, including calls that raise
   (in a fresh subprocess, after a warm-up).
6. Nothing lost: every error path of every public function leaves ``out`` and every input array
   bit-for-bit unchanged, including the bytes around and between the elements of strided views.
7. Limits: sizes whose element counts or offsets do not fit 32 bits work (or raise a clear error),
   and requests larger than memory raise MemoryError instead of crashing (in subprocesses).

PKG-01 (fork, one SDPA call) and PKG-03 (GIL, longest main-thread stall) in
test_public_cases.py and the concurrency tests in test_threads.py are not repeated here.
"""
import json
import math
import multiprocessing
import os
import re
import subprocess
import sys
import sysconfig
import threading
import time
import traceback

import numpy as np
import pytest
from conftest import FakeTorchMHA, child_env, freeze, run_forked

import cyattn

LINUX = sys.platform.startswith("linux")
SM = "cyattn.softmax"
LSM = "cyattn.log_softmax"
MM = "cyattn.matmul_accumulate"
ATT = "cyattn.scaled_dot_product_attention"
MHA = "cyattn.multi_head_attention"

def _run_python(script, *args, variant=None, timeout=300):
    """Run ``script`` in a fresh interpreter that imports the same cyattn as this process
    (conftest's :func:`child_env`); returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], env=child_env(variant),
                          capture_output=True, text=True, timeout=timeout)


def _result_of(proc):
    """The JSON printed after ``RESULT `` by a subprocess script (which must have exited 0)."""
    assert proc.returncode == 0, (f"subprocess exited with {proc.returncode}\n"
                                  f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"no RESULT line\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    return json.loads(lines[-1][len("RESULT "):])


def _fingerprint(arrays):
    """dtype, shape and bytes of each array: equal fingerprints are bit-identical results
    (NaN payloads and signed zeros included)."""
    return [(a.dtype.str, a.shape, np.ascontiguousarray(a).tobytes()) for a in arrays]


# ------------------------------------------------------------------------------------------
# A mixed workload on shared read-only inputs (tests 1, 3 and 4)
# ------------------------------------------------------------------------------------------

def _workload(seed=1234):
    """(calls, shared): ``calls`` maps a name to ``fn(n_threads) -> tuple of arrays``; every
    input lives in ``shared`` and is read-only. Several calls are large enough for the kernels
    to start a 2-thread OpenMP team (softmax: rows * n >= 2**16; matmul / attention: a few
    hundred thousand multiply-adds per thread)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((256, 257)) * 4
    x[3, 5] = np.nan                                     # a NaN row
    x[7] = -np.inf                                       # a fully masked row without a mask
    x[11, :100] = -np.inf
    x32 = x.astype(np.float32)
    xs = rng.standard_normal((9, 33))
    keep = rng.random((256, 257)) < 0.7
    keep[20] = False                                     # a fully masked row
    col_keep = rng.random(257) < 0.8
    fmask = np.where(rng.random((1, 257)) < 0.2, -np.inf, rng.standard_normal((1, 257)))
    a = rng.standard_normal((96, 80))
    a[4, 4] = np.nan
    b = rng.standard_normal((80, 96))
    mm_base = rng.standard_normal((96, 96))
    a3 = rng.standard_normal((3, 17, 23)).astype(np.float32)
    b2 = rng.standard_normal((23, 19)).astype(np.float32)
    mm3_base = rng.standard_normal((3, 17, 19)).astype(np.float32)
    q = rng.standard_normal((2, 2, 64, 16))
    k = rng.standard_normal((2, 2, 80, 16))
    v = rng.standard_normal((2, 2, 80, 16))
    v[1, 1, 5, 3] = np.nan                               # only read where its weight is nonzero
    kg, vg = np.ascontiguousarray(k[:, :1]), np.ascontiguousarray(v[:, :1])
    bmask = rng.random((2, 1, 64, 80)) < 0.8
    bmask[0, 0, 17] = False
    amask = np.where(rng.random((64, 80)) < 0.3, -np.inf, rng.standard_normal((64, 80)))
    q32, k32, v32 = (t.astype(np.float32) for t in (q, k, v))
    amask32 = amask.astype(np.float32)
    q16 = rng.standard_normal((3, 5, 8)).astype(np.float16)
    k16 = rng.standard_normal((3, 6, 8)).astype(np.float16)
    v16 = rng.standard_normal((3, 6, 4)).astype(np.float16)
    mha = cyattn.MultiHeadAttention(16, 4, batch_first=True, seed=3, dtype=np.float64)
    params = [getattr(mha, n) for n in ("in_proj_weight", "in_proj_bias", "out_proj_weight",
                                        "out_proj_bias")]
    h = rng.standard_normal((2, 7, 16))
    kpm = np.zeros((2, 7), bool)
    kpm[1, 4:] = True                                    # torch polarity: True = ignore
    shared = [x, x32, xs, keep, col_keep, fmask, a, b, mm_base, a3, b2, mm3_base, q, k, v, kg,
              vg, bmask, amask, q32, k32, v32, amask32, q16, k16, v16, h, kpm, *params]
    freeze(*shared)

    def matmul(n):
        out = mm_base.copy()
        cyattn.matmul_accumulate(a, b, out, alpha=0.5, n_threads=n)
        return (out,)

    def matmul_batched(n):
        out = mm3_base.copy()
        cyattn.matmul_accumulate(a3, b2, out, alpha=-2.0, n_threads=n)
        return (out,)

    def matmul_fortran_out(n):
        out = np.asfortranarray(mm_base)
        cyattn.matmul_accumulate(b.T, a.T, out, n_threads=n)
        return (out,)

    def log_softmax_out(n):
        out = np.empty_like(x)
        cyattn.log_softmax(x, mask=col_keep, out=out)
        return (out,)

    def sdpa_out(n):
        out = np.empty((2, 2, 64, 16))
        cyattn.scaled_dot_product_attention(q, k, v, bmask, out=out, n_threads=n)
        return (out,)

    calls = {
        "softmax": lambda n: (cyattn.softmax(x),),
        "softmax_axis0_f32": lambda n: (cyattn.softmax(x32, axis=0),),
        "softmax_bool_mask": lambda n: (cyattn.softmax(x, mask=keep),),
        "softmax_small": lambda n: (cyattn.softmax(xs, axis=0),),
        "log_softmax_float_mask": lambda n: (cyattn.log_softmax(x32, mask=fmask),),
        "log_softmax_out": log_softmax_out,
        "matmul": matmul,
        "matmul_batched_f32": matmul_batched,
        "matmul_fortran_out": matmul_fortran_out,
        "sdpa_bool_lse": lambda n: cyattn.scaled_dot_product_attention(
            q, k, v, bmask, return_lse=True, n_threads=n),
        "sdpa_float_causal_f32": lambda n: (cyattn.scaled_dot_product_attention(
            q32, k32, v32, amask32, is_causal=True, n_threads=n),),
        "sdpa_causal_bottom_right": lambda n: (cyattn.scaled_dot_product_attention(
            q, k, v, is_causal=True, causal_alignment="bottom_right", n_threads=n),),
        "sdpa_gqa_lse": lambda n: cyattn.scaled_dot_product_attention(
            q, kg, vg, enable_gqa=True, return_lse=True, n_threads=n),
        "sdpa_out": sdpa_out,
        "sdpa_f16": lambda n: (cyattn.scaled_dot_product_attention(
            q16, k16, v16, scale=0.3, n_threads=n),),
        "mha": lambda n: mha(h, h, h, key_padding_mask=kpm),
        "mha_causal_no_weights": lambda n: (mha(h, h, h, need_weights=False,
                                                is_causal=True)[0],),
    }
    return calls, shared


THREAD_CHOICES = (1, 2, None)


def _hammer(n_py_threads=16, calls_each=1000, seed=99):
    """Test 1's body: every result of every thread equals the serial one, inputs unchanged."""
    calls, shared = _workload()
    before = _fingerprint(shared)
    names = sorted(calls)
    serial = {name: _fingerprint(calls[name](1)) for name in names}
    for name in names:                       # the serial results do not depend on n_threads
        for n in (2, None):
            assert _fingerprint(calls[name](n)) == serial[name], (name, n)
    rng = np.random.default_rng(seed)
    plans = [list(zip(rng.integers(0, len(names), calls_each).tolist(),
                      rng.integers(0, len(THREAD_CHOICES), calls_each).tolist()))
             for _ in range(n_py_threads)]
    barrier = threading.Barrier(n_py_threads)
    mismatches, errors, finished = [], [], []

    def worker(tid):
        try:
            barrier.wait(timeout=60)
            for i, (j, t) in enumerate(plans[tid]):
                name, n = names[j], THREAD_CHOICES[t]
                if _fingerprint(calls[name](n)) != serial[name]:
                    mismatches.append((tid, i, name, n))
            finished.append(tid)
        except BaseException:                  # reported by the main thread
            errors.append((tid, traceback.format_exc()))

    threads = [threading.Thread(target=worker, args=(tid,), daemon=True)
               for tid in range(n_py_threads)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + 600
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
    hung = [th.name for th in threads if th.is_alive()]
    assert not hung, f"threads still running after 600 s (deadlock?): {hung}"
    assert not errors, errors[0][1]
    assert sorted(finished) == list(range(n_py_threads))
    assert not mismatches, f"{len(mismatches)} results differ from serial, e.g. {mismatches[:5]}"
    assert _fingerprint(shared) == before, "a shared read-only input was modified"
    return sum(len(p) for p in plans)


def test_concurrent_mixed_calls_match_serial(variant):
    """16 Python threads x 1,000 mixed calls with n_threads in (1, 2, None): every result is
    bit-identical to the serial result of the same call; shared inputs are unchanged."""
    assert _hammer() == 16_000


# ------------------------------------------------------------------------------------------
# 3. Free-threaded CPython
# ------------------------------------------------------------------------------------------

FREE_THREADED_BUILD = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


@pytest.mark.skipif(not FREE_THREADED_BUILD, reason="not a free-threaded CPython build")
def test_free_threaded_import_keeps_gil_disabled():
    """The kernel modules declare free-threading support: importing cyattn (after NumPy) must
    not switch the GIL back on."""
    script = ("import sys, json, numpy\n"
              "g0 = sys._is_gil_enabled()\n"
              "import cyattn\n"
              "from cyattn import _backend\n"
              "for v in _backend.available_variants(): _backend.load_variant(v)\n"
              "print('RESULT ' + json.dumps([g0, sys._is_gil_enabled()]))\n")
    env_gil = os.environ.get("PYTHON_GIL")
    if env_gil == "1":
        pytest.skip("PYTHON_GIL=1 forces the GIL on")
    before, after = _result_of(_run_python(script))
    if before:
        pytest.skip("NumPy (or the environment) enabled the GIL already")
    assert after is False, "importing cyattn re-enabled the GIL"


@pytest.mark.skipif(not (hasattr(sys, "_is_gil_enabled") and not sys._is_gil_enabled()),
                    reason="the GIL is enabled (not a free-threaded build, or re-enabled)")
def test_concurrent_mixed_calls_without_gil(variant):
    """Test 1 on a free-threaded interpreter with the GIL off: threads really run Python and
    kernel calls at the same time."""
    assert _hammer(seed=7) == 16_000


# ------------------------------------------------------------------------------------------
# 2. The GIL is released inside the kernels
# ------------------------------------------------------------------------------------------
# Criterion (no wall-clock thresholds): a worker thread reads its own CPU clock just before
# (c0) and just after (c1) one long kernel call. The main thread spins in a Python loop and, on
# every iteration, reads the worker's CPU clock. An iteration whose reading lies in the middle
# 80 % of [c0, c1] ran while the worker was inside the kernel (the worker's Python code around
# the kernel takes microseconds of CPU, the call hundreds of milliseconds). If the kernel held
# the GIL, the main thread could not run a single bytecode then: the count would be exactly 0.

_BUCKET = 1e-4      # main-thread iterations are counted per 0.1 ms of worker CPU time
_MIN_MID_ITERATIONS = 100


def _long_call(kind, rng):
    """A long call (0.03-0.3 s of CPU on this machine); n_threads=1 where the API has it
    (softmax runs on the calling thread's OpenMP default: see _one_openmp_thread). Sizes are
    fixed: the criterion does not depend on the duration as long as the call takes more than
    a few milliseconds."""
    if kind == "sdpa":
        q, k, v = (rng.standard_normal((1, 12, 2048, 64)).astype(np.float32) for _ in range(3))
        return lambda: cyattn.scaled_dot_product_attention(q, k, v, n_threads=1)
    if kind == "sdpa_masked_f64":
        q, k, v = (rng.standard_normal((1, 3, 2048, 64)) for _ in range(3))
        keep = rng.random((2048, 2048)) < 0.9
        return lambda: cyattn.scaled_dot_product_attention(q, k, v, keep, is_causal=True,
                                                           return_lse=True, n_threads=1)
    if kind == "matmul":
        a, b = rng.standard_normal((1200, 1200)), rng.standard_normal((1200, 1200))
        out = np.zeros((1200, 1200))
        return lambda: cyattn.matmul_accumulate(a, b, out, n_threads=1)
    if kind in ("softmax", "log_softmax_masked"):
        x = rng.standard_normal((4096, 2048))
        keep = rng.random((4096, 2048)) < 0.5
        if kind == "softmax":
            return lambda: cyattn.softmax(x)
        return lambda: cyattn.log_softmax(x, mask=keep)
    raise AssertionError(kind)


def _one_openmp_thread():
    """Limit the calling thread's OpenMP team to one thread (threadpoolctl sets the calling
    thread's default, which softmax reads), if threadpoolctl is installed. Two OpenMP threads
    plus the sampling main thread on two cores let external load starve the main thread."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=1, user_api="openmp")


class _Worker(threading.Thread):
    """Runs ``setup`` (if given) and then ``fn`` once, bracketed by readings of its own CPU
    clock, then waits for ``release`` (so that its clock stays readable until the main thread
    is done)."""

    def __init__(self, fn, go, setup=None):
        super().__init__(daemon=True)
        self.fn, self.go, self.setup = fn, go, setup
        self.ready, self.done, self.release = (threading.Event() for _ in range(3))
        self.clock = None
        self.span = None
        self.result = None
        self.error = None

    def run(self):
        try:
            self.clock = time.pthread_getcpuclockid(threading.get_ident())
            if self.setup is not None:
                self.setup()
            self.ready.set()
            self.go.wait()
            c0 = time.clock_gettime(self.clock)
            self.result = self.fn()
            c1 = time.clock_gettime(self.clock)
            self.span = (c0, c1)
        except BaseException as exc:           # re-raised by the main thread
            self.error = exc
        finally:
            self.ready.set()
            self.done.set()
            self.release.wait(120)


def _spin_and_sample(workers):
    """Main-thread Python loop until every worker is done; returns buckets
    [(worker CPU readings at the bucket start), iterations]."""
    clocks = [w.clock for w in workers]
    buckets = []
    last = None
    while not all(w.done.is_set() for w in workers):
        now = tuple(time.clock_gettime(c) for c in clocks)
        if last is None or any(n - p >= _BUCKET for n, p in zip(now, last)):
            buckets.append([now, 0])
            last = now
        buckets[-1][1] += 1
    return buckets


def _mid(span):
    c0, c1 = span
    return c0 + 0.1 * (c1 - c0), c1 - 0.1 * (c1 - c0)


def _run_workers(fns, setup=None):
    go = threading.Event()
    workers = [_Worker(fn, go, setup) for fn in fns]
    for w in workers:
        w.start()
    for w in workers:
        assert w.ready.wait(60)
    if any(w.error for w in workers):
        raise next(w.error for w in workers if w.error)
    go.set()
    try:
        buckets = _spin_and_sample(workers)
    finally:
        for w in workers:
            w.release.set()
        for w in workers:
            w.join(120)
    for w in workers:
        assert not w.is_alive(), "a worker did not finish its kernel call"
        if w.error is not None:
            raise w.error
    return workers, buckets


def _iterations_inside(buckets, spans):
    """Main-thread iterations during which every worker was in the middle of its call."""
    windows = [_mid(s) for s in spans]
    total = 0
    for readings, count in buckets:
        if all(lo <= r and r + _BUCKET <= hi for r, (lo, hi) in zip(readings, windows)):
            total += count
    return total


@pytest.mark.skipif(not hasattr(time, "pthread_getcpuclockid"),
                    reason="needs per-thread CPU clocks (time.pthread_getcpuclockid)")
@pytest.mark.parametrize("kind", ["sdpa", "sdpa_masked_f64", "matmul", "softmax",
                                  "log_softmax_masked"])
def test_main_thread_runs_python_during_kernel(variant, kind):
    """While a worker thread is inside a long kernel call (n_threads=1 where the API has it),
    the main thread keeps executing Python bytecode."""
    fn = _long_call(kind, np.random.default_rng(11))
    setup = _one_openmp_thread if "softmax" in kind else None
    (worker,), buckets = _run_workers([fn], setup)
    c0, c1 = worker.span
    if c1 - c0 < 0.01:
        pytest.skip(f"the call took only {1e3 * (c1 - c0):.1f} ms of CPU: too short to judge")
    inside = _iterations_inside(buckets, [worker.span])
    total = sum(n for _, n in buckets)
    assert inside >= _MIN_MID_ITERATIONS, (
        f"the main thread ran {inside} of its {total} loop iterations while the worker was "
        f"inside the {1e3 * (c1 - c0):.0f} ms (CPU) {kind} call: the kernel holds the GIL")


@pytest.mark.skipif(not hasattr(time, "pthread_getcpuclockid"),
                    reason="needs per-thread CPU clocks (time.pthread_getcpuclockid)")
def test_two_threads_run_kernels_at_the_same_time(variant):
    """Two threads each run a long SDPA call (n_threads=1): both complete with the serial
    result, and the main thread observes moments when both are inside their kernels."""
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal((1, 8, 2048, 64)).astype(np.float32) for _ in range(3))
    keep = rng.random((2048, 2048)) < 0.7
    freeze(q, k, v, keep)

    def first():
        return cyattn.scaled_dot_product_attention(q, k, v, n_threads=1)

    def second():
        return cyattn.scaled_dot_product_attention(k, q, v, keep, n_threads=1)

    workers, buckets = _run_workers([first, second])
    spans = [w.span for w in workers]
    if min(c1 - c0 for c0, c1 in spans) < 0.01:
        pytest.skip("the calls are too short to judge")
    inside = _iterations_inside(buckets, spans)
    assert inside >= _MIN_MID_ITERATIONS, (
        f"only {inside} main-thread iterations saw both workers inside their kernels")
    np.testing.assert_array_equal(workers[0].result, first())
    np.testing.assert_array_equal(workers[1].result, second())


# ------------------------------------------------------------------------------------------
# 4. fork
# ------------------------------------------------------------------------------------------

def _fork_context():
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    try:
        return multiprocessing.get_context("fork")
    except ValueError:
        pytest.skip("the 'fork' start method is not available")


def _child_compute(conn, calls, thread_counts, grandchild):
    """In a forked child: every call with every thread count (and, with ``grandchild``, the
    same from a process forked by this child); sends ("ok", {(name, n): fingerprint})."""
    try:
        results = {}
        for name, fn in calls.items():
            for n in thread_counts:
                results[(name, n)] = _fingerprint(fn(n))
        if grandchild:
            status, payload = _in_forked_child(calls, (2, None), False)
            if status != "ok":
                raise RuntimeError(f"grandchild: {payload}")
            results.update({(name, n, "grandchild"): fp for (name, n), fp in payload.items()})
        conn.send(("ok", results))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _in_forked_child(calls, thread_counts, grandchild, timeout=60):
    """Fork a child running _child_compute; returns (status, payload) or fails on a hang."""
    return run_forked(_child_compute, (calls, thread_counts, grandchild), timeout)


def _parent_reference(calls):
    """Serial results, after running every call with 2 threads (so that the parent's OpenMP
    thread pool exists at the fork); the 2-thread results must equal the serial ones."""
    ref = {name: _fingerprint(fn(1)) for name, fn in calls.items()}
    for name, fn in calls.items():
        assert _fingerprint(fn(2)) == ref[name], name
    big = np.ones((600, 600))
    cyattn.matmul_accumulate(big, big, np.zeros((600, 600)), n_threads=2)
    return ref


def test_fork_child_and_grandchild_match_parent(variant):
    """After the parent ran every function on 2-thread OpenMP teams, a forked child computes
    bit-identical results with n_threads 1, 2, None and -1, and so does a process forked by
    that child; both exit promptly with code 0."""
    _fork_context()
    calls, _ = _workload(seed=4)
    ref = _parent_reference(calls)
    status, payload = _in_forked_child(calls, (1, 2, None, -1), True)
    assert status == "ok", f"forked child failed:\n{payload}"
    assert len(payload) == len(calls) * (4 + 2)
    for key, fp in payload.items():
        assert fp == ref[key[0]], f"forked child: {key} differs from the parent's result"


def test_fork_while_another_thread_is_in_a_kernel(variant):
    """A fork taken while another parent thread keeps running 2-thread kernels (so an OpenMP
    team is usually active at that moment): the child, asking for n_threads=2, still computes
    the parent's results and exits."""
    _fork_context()
    calls, _ = _workload(seed=5)
    ref = _parent_reference(calls)
    rng = np.random.default_rng(6)
    q = rng.standard_normal((2, 4, 512, 32))
    stop = threading.Event()
    started = threading.Event()
    count = [0]
    errors = []

    def busy():
        try:
            while not stop.is_set():
                cyattn.scaled_dot_product_attention(q, q, q, n_threads=2)
                cyattn.matmul_accumulate(q[0, 0], q[0, 0].T, np.zeros((512, 512)), n_threads=2)
                count[0] += 1
                started.set()
        except BaseException:
            errors.append(traceback.format_exc())
            started.set()

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    try:
        assert started.wait(60)
        results = [_in_forked_child(calls, (2,), False) for _ in range(3)]
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors[0]
    assert count[0] >= 1
    for status, payload in results:
        assert status == "ok", f"forked child failed:\n{payload}"
        for (name, n), fp in payload.items():
            assert fp == ref[name], f"forked child: {name} (n_threads={n}) differs"


# ------------------------------------------------------------------------------------------
# 5. Leaks
# ------------------------------------------------------------------------------------------

_LEAK_SCRIPT = r'''
import gc, json, mmap, sys
import numpy as np
import cyattn
from cyattn import _backend

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE

mode, total = sys.argv[1], int(sys.argv[2])
VARIANTS = [_backend.load_variant(v) for v in _backend.available_variants()]
rng = np.random.default_rng(5)
bt = np.broadcast_to
sm, lsm, mm, att = (cyattn.softmax, cyattn.log_softmax, cyattn.matmul_accumulate,
                    cyattn.scaled_dot_product_attention)
if mode == "small":
    x = rng.standard_normal((6, 9)); x[1, 2] = np.nan; x[2] = -np.inf
    x32, x16, xswap = x.astype(np.float32), x.astype(np.float16), x.astype(">f8")
    xint = np.arange(54).reshape(6, 9)
    keep = rng.random((6, 9)) < 0.6
    fm = np.where(keep, 0.0, -np.inf)
    o = np.empty((6, 9))
    o32 = np.empty((6, 9), np.float32)
    a, b, c = rng.standard_normal((5, 7)), rng.standard_normal((7, 4)), np.zeros((5, 4))
    a3 = rng.standard_normal((2, 5, 7)).astype(np.float32)
    b32, c3 = b.astype(np.float32), np.zeros((2, 5, 4), np.float32)
    sq = rng.standard_normal((6, 6))
    ro = np.zeros((5, 4)); ro.flags.writeable = False
    q, k = rng.standard_normal((2, 4, 5, 8)), rng.standard_normal((2, 4, 7, 8))
    v = rng.standard_normal((2, 4, 7, 3))
    v_nan = v.copy(); v_nan[0, 0, 3] = np.nan
    kg, vg = k[:, :2], v[:, :2]
    bm = rng.random((2, 1, 5, 7)) < 0.7; bm[0, 0, 1] = False
    bm_int = bm.astype(np.int64)
    am = np.where(rng.random((5, 7)) < 0.3, -np.inf, 0.1)
    ao, ao_bad = np.empty((2, 4, 5, 3)), np.empty((2, 4, 5, 4))
    q16, k16, v16 = (t.astype(np.float16) for t in (q, k, v))
    # E = 2**31 + 1 on zero-stride views: the packed query block alone needs ~400 GiB
    huge_q, huge_k = bt(np.zeros(1), (1, 2**31 + 1)), bt(np.zeros(1), (3, 2**31 + 1))
    mha = cyattn.MultiHeadAttention(8, 2, batch_first=True, seed=1)
    h = rng.standard_normal((2, 5, 8)).astype(np.float32)
    kpm = np.zeros((2, 5), bool); kpm[1, 3:] = True
    calls = [
        (lambda: sm(x), None),
        (lambda: sm(x32, axis=0, mask=keep), None),
        (lambda: lsm(x, mask=fm, out=o), None),
        (lambda: sm(x16, mask=keep[0]), None),
        (lambda: lsm(xswap), None),
        (lambda: mm(a, b, c, alpha=0.5), None),
        (lambda: mm(a3, b32, c3, n_threads=2), None),
        (lambda: mm(sq, sq, sq), None),
        (lambda: att(q, k, v, bm, return_lse=True), None),
        (lambda: att(q, k, v, am, is_causal=True, causal_alignment="bottom_right"), None),
        (lambda: att(q, kg, vg, enable_gqa=True, out=ao, n_threads=2), None),
        (lambda: att(q16, k16, v16, is_causal=True), None),
        (lambda: att(q, k, v_nan, bm), None),
        (lambda: mha(h, h, h, key_padding_mask=kpm), None),
        (lambda: mha(h, h, h, need_weights=False, is_causal=True), None),
        (lambda: sm(xint), TypeError),
        (lambda: sm(x, mask=keep[:3]), ValueError),
        (lambda: lsm(x, out=o32), ValueError),
        (lambda: mm(a, b, c, n_threads=0), ValueError),
        (lambda: mm(a, a, c), ValueError),
        (lambda: mm(a, b, ro), ValueError),
        (lambda: att(q, k, v, bm_int), TypeError),
        (lambda: att(q, k, v, out=ao_bad), ValueError),
        (lambda: att(q, k, v, n_threads=0), ValueError),
        (lambda: att(q, k[..., :7], v), ValueError),
        (lambda: mha(h, h, h, key_padding_mask=kpm[:, :4]), ValueError),
        (lambda: att(huge_q, huge_k, v[0, 0, :3]), MemoryError),   # scratch allocation fails
    ]
else:
    T, n = 1024, 512
    q, k, v = (rng.standard_normal((1, 1, T, 16)).astype(np.float32) for _ in range(3))
    keep = rng.random((T, T)) < 0.8
    keep8 = keep.astype(np.int8)
    q16 = q.astype(np.float16)
    o_bad = np.empty((1, 1, T, 16), np.float64)
    o_strided = np.empty((1, 1, T, 32), np.float32)[..., ::2]
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    c = np.zeros((n, n), np.float32)
    x = rng.standard_normal((T, n))
    calls = [
        (lambda: att(q, k, v, keep, n_threads=2, return_lse=True), None),
        (lambda: att(q16, k, v, is_causal=True, out=o_strided, n_threads=1), None),
        (lambda: mm(a, b, c, n_threads=2), None),
        (lambda: mm(a, b, a, alpha=1e-3, n_threads=1), None),  # out is a: a copied first
        (lambda: sm(x, mask=keep[:, :n]), None),
        (lambda: lsm(x.T, axis=0), None),
        (lambda: att(q, k, v, out=o_bad), ValueError),
        (lambda: att(q16, k, v, keep8), TypeError),
        (lambda: mm(a, b, c, n_threads=0), ValueError),
        (lambda: mm(a, b, c[:, :-1]), ValueError),
        (lambda: sm(x, mask=keep[:2]), ValueError),
    ]

def run(start, count):
    for i in range(start, start + count):
        _backend.kernels = VARIANTS[(i // len(calls)) % len(VARIANTS)]
        fn, exc = calls[i % len(calls)]
        if exc is None:
            fn()
            continue
        try:
            fn()
        except exc:
            pass
        else:
            raise AssertionError(f"call {i % len(calls)} did not raise {exc.__name__}")

warm = total // 5
run(0, warm)
gc.collect()
start_rss = rss()
samples, done = [], warm
for part in range(4):
    count = (total - warm) // 4
    run(done, count)
    done += count
    gc.collect()
    samples.append(rss())
print("RESULT " + json.dumps({"start": start_rss, "samples": samples, "calls": done}))
'''


@pytest.mark.skipif(not LINUX, reason="reads /proc/self/statm")
@pytest.mark.parametrize("mode,total,allowed_mib", [("small", 100_000, 2), ("large", 1_000, 8)])
def test_rss_flat_over_many_calls(mode, total, allowed_mib):
    """RSS after a warm-up (a fifth of the calls) does not grow by more than a few MiB over the
    remaining calls, nor creep up steadily (by more than 512 KiB, rising in each of the four
    quarters): mixed functions, options, dtypes and both compiled variants, including calls
    that raise TypeError / ValueError / MemoryError (failed scratch allocation)."""
    res = _result_of(_run_python(_LEAK_SCRIPT, mode, total, timeout=600))
    assert res["calls"] >= 0.99 * total
    start, samples = res["start"], res["samples"]
    report = (f"over {res['calls']} {mode} calls: start {start / 2**20:.2f} MiB, then "
              f"{[round(x / 2**20, 2) for x in samples]} MiB")
    assert max(samples) - start <= allowed_mib * 2**20, f"RSS grew {report}"
    steps = [b - a for a, b in zip([start] + samples, samples)]
    assert not (all(d > 0 for d in steps) and samples[-1] - start > 2**19), (
        f"RSS creeps up {report}")


# ------------------------------------------------------------------------------------------
# 6. Nothing lost: failed calls leave out and every input bit-for-bit unchanged
# ------------------------------------------------------------------------------------------

_NAN_PAYLOADS = {  # quiet and signalling NaNs with payloads, both signs
    2: [0x7E01, 0xFD55],
    4: [0x7FC0BEEF, 0xFF800001],
    8: [0x7FF8DEADBEEF0001, 0xFFF0000000000001],
}


def _values(shape, dtype=np.float64, seed=0):
    """Random values of ``dtype`` with NaN payloads, -0.0, +-inf and a subnormal mixed in."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(seed + 7 * len(shape) + sum(shape))
    native = dt.newbyteorder("=")
    vals = rng.standard_normal(shape).astype(native)
    flat = vals.reshape(-1)
    if flat.size >= 8:
        uint = np.dtype(f"u{native.itemsize}")
        bits = flat.view(uint)
        bits[0], bits[3] = _NAN_PAYLOADS[native.itemsize]
        flat[1], flat[4], flat[5] = -0.0, np.inf, -np.inf
        flat[6] = np.finfo(native).smallest_subnormal
    return vals.astype(dt)


class _Guarded:
    """Factory of test arrays that live inside larger random-byte buffers: a strided (every
    other element along the last axis) and, for 2-D and up, reversed view with 64 guard bytes
    on either side. :meth:`snapshot` covers the view, the gaps between its elements and the
    guards, so that any write by a failing call shows."""

    GUARD = 64

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)
        self.raws = []

    def __call__(self, values, dtype=None, strided=True, writeable=True):
        values = np.asarray(values, dtype=dtype)
        dt = values.dtype
        assert dt.kind in "biufc", dt
        shape = values.shape
        strided = strided and values.ndim > 0 and values.size > 0
        inner = shape[:-1] + (2 * shape[-1] + 1,) if strided else shape
        nbytes = math.prod(inner) * dt.itemsize
        raw = self.rng.integers(0, 256, nbytes + 2 * self.GUARD, dtype=np.uint8)
        base = raw[self.GUARD:self.GUARD + nbytes].view(dt).reshape(inner)
        view = base
        if strided:
            view = base[..., 1::2]
            if view.ndim >= 2:
                view = view[::-1]
        view[...] = values
        if dt.kind == "b":
            assert np.array_equal(view, values)
        view.flags.writeable = writeable
        self.raws.append(raw)
        return view

    def snapshot(self):
        return [raw.tobytes() for raw in self.raws]


def _sm_cases(fn, name):
    def x(g, shape=(4, 9), dtype=np.float64):
        return g(_values(shape, dtype))

    def out(g, shape=(4, 9), dtype=np.float64):
        return g(_values(shape, dtype, seed=1))

    return [
        ("x_int", lambda g: (fn, (g(np.arange(36).reshape(4, 9)),), {"out": out(g)},
                             TypeError, f"{name}: x has dtype int64")),
        ("x_bool", lambda g: (fn, (g(np.ones((4, 9), bool)),), {"out": out(g)},
                              TypeError, f"{name}: x has dtype bool")),
        ("x_complex", lambda g: (fn, (g(np.ones((4, 9), complex)),), {"out": out(g)},
                                 TypeError, f"{name}: x has dtype complex128")),
        ("x_object", lambda g: (fn, (np.array([[1.0, None]], dtype=object),),
                                {"out": out(g, (1, 2))}, TypeError, f"{name}: x has dtype object")),
        ("x_ragged", lambda g: (fn, ([[1.0, 2.0], [3.0]],), {"out": out(g, (2, 2))},
                                TypeError, f"{name}: x could not be converted")),
        ("x_0d", lambda g: (fn, (g(np.float64(1.5)),), {"out": g(np.float64(2.5))},
                            ValueError, f"{name}: x must have at least 1 dimension")),
        ("axis_float", lambda g: (fn, (x(g),), {"axis": 1.0, "out": out(g)},
                                  TypeError, f"{name}: axis must be an integer, got float")),
        ("axis_bool", lambda g: (fn, (x(g),), {"axis": True, "out": out(g)},
                                 TypeError, f"{name}: axis must be an integer, got bool")),
        ("axis_range", lambda g: (fn, (x(g),), {"axis": -3, "out": out(g)},
                                  ValueError, f"{name}: axis -3 is out of bounds")),
        ("mask_int", lambda g: (fn, (x(g),), {"mask": g(np.ones((4, 9), np.int64)),
                                              "out": out(g)},
                                TypeError, f"{name}: mask has dtype int64")),
        ("mask_uint8", lambda g: (fn, (x(g),), {"mask": g(np.ones(9, np.uint8)), "out": out(g)},
                                  TypeError, f"{name}: mask has dtype uint8")),
        ("mask_complex", lambda g: (fn, (x(g),), {"mask": g(np.ones(9, complex)),
                                                  "out": out(g)},
                                    TypeError, f"{name}: mask has dtype complex128")),
        ("mask_object", lambda g: (fn, (x(g),), {"mask": np.array([True] * 9, dtype=object),
                                                 "out": out(g)},
                                   TypeError, f"{name}: mask has dtype object")),
        ("mask_list_int", lambda g: (fn, (x(g),), {"mask": [1] * 9, "out": out(g)},
                                     TypeError, f"{name}: mask has dtype int")),
        ("mask_bool_shape", lambda g: (fn, (x(g),), {"mask": g(np.ones((4, 8), bool)),
                                                     "out": out(g)},
                                       ValueError, f"{name}: mask has shape (4, 8), which does "
                                                   f"not broadcast")),
        ("mask_float_enlarges", lambda g: (fn, (x(g),), {"mask": g(_values((2, 4, 9))),
                                                         "out": out(g)},
                                           ValueError, f"{name}: mask has shape (2, 4, 9)")),
        ("out_shape", lambda g: (fn, (x(g),), {"out": out(g, (9, 4))},
                                 ValueError, f"{name}: out has shape (9, 4); expected (4, 9)")),
        ("out_dtype", lambda g: (fn, (x(g),), {"out": out(g, dtype=np.float32)},
                                 ValueError, f"{name}: out has dtype float32; expected float64")),
        ("out_int", lambda g: (fn, (x(g),), {"out": g(np.zeros((4, 9), np.int64))},
                               ValueError, f"{name}: out has dtype int64")),
        ("out_read_only", lambda g: (fn, (x(g),), {"out": g(_values((4, 9)), writeable=False)},
                                     ValueError, f"{name}: out is read-only")),
        ("out_list", lambda g: (fn, (x(g),), {"out": [[0.0] * 9] * 4},
                                ValueError, f"{name}: out must be a numpy.ndarray, got list")),
        ("f16_out_dtype", lambda g: (fn, (x(g, dtype=np.float16),),
                                     {"mask": g(np.ones(9, bool)), "out": out(g, dtype=np.float32)},
                                     ValueError, f"{name}: out has dtype float32; expected "
                                                 f"float16")),
        ("byteswapped_out_dtype", lambda g: (fn, (x(g, dtype=">f8"),),
                                             {"out": out(g, dtype=np.float32)},
                                             ValueError, f"{name}: out has dtype float32")),
        ("out_is_x_bad_mask", lambda g: (lambda t, **kw: fn(t, out=t, **kw), (x(g),),
                                         {"mask": g(np.ones(9, np.int8))},
                                         TypeError, f"{name}: mask has dtype int8")),
    ]


def _mm_cases():
    fn = cyattn.matmul_accumulate

    def ab(g, m=4, k=6, n=5, dtype=np.float64):
        return g(_values((m, k), dtype)), g(_values((k, n), dtype, seed=2))

    def out(g, shape=(4, 5), dtype=np.float64):
        return g(_values(shape, dtype, seed=3))

    def call(**kw):
        return lambda a, b, o: fn(a, b, o, **kw)

    return [
        ("a_int", lambda g: (fn, (g(np.ones((4, 6), np.int64)), ab(g)[1], out(g)), {},
                             TypeError, f"{MM}: a has dtype int64")),
        ("b_bool", lambda g: (fn, (ab(g)[0], g(np.ones((6, 5), bool)), out(g)), {},
                              TypeError, f"{MM}: b has dtype bool")),
        ("b_object", lambda g: (fn, (ab(g)[0], np.ones((6, 5), object), out(g)), {},
                                TypeError, f"{MM}: b has dtype object")),
        ("out_int", lambda g: (fn, (*ab(g), g(np.zeros((4, 5), np.int64))), {},
                               TypeError, f"{MM}: out has dtype int64")),
        ("out_complex", lambda g: (fn, (*ab(g), g(np.zeros((4, 5), complex))), {},
                                   TypeError, f"{MM}: out has dtype complex128")),
        ("out_list", lambda g: (fn, (*ab(g), [[0.0] * 5] * 4), {},
                                ValueError, f"{MM}: out must be a numpy.ndarray, got list")),
        ("alpha_complex", lambda g: (call(alpha=1j), (*ab(g), out(g)), {},
                                     TypeError, f"{MM}: alpha must be a real number")),
        ("alpha_bool", lambda g: (call(alpha=True), (*ab(g), out(g)), {},
                                  TypeError, f"{MM}: alpha must be a real number, got bool")),
        ("alpha_huge", lambda g: (call(alpha=10**400), (*ab(g), out(g)), {},
                                  ValueError, f"{MM}: alpha is too large")),
        ("a_1d", lambda g: (fn, (g(_values((6,))), ab(g)[1], out(g)), {},
                            ValueError, f"{MM}: a must have at least 2 dimensions")),
        ("b_1d", lambda g: (fn, (ab(g)[0], g(_values((6,))), out(g)), {},
                            ValueError, f"{MM}: b must have at least 2 dimensions")),
        ("out_1d", lambda g: (fn, (*ab(g), out(g, (5,))), {},
                              ValueError, f"{MM}: out must have at least 2 dimensions")),
        ("inner_dims", lambda g: (fn, (*ab(g, k=6)[:1], ab(g, k=7)[1], out(g)), {},
                                  ValueError, f"{MM}: a has shape (4, 6) and b has shape (7, 5)")),
        ("batch_no_broadcast", lambda g: (fn, (g(_values((2, 4, 6))), g(_values((3, 6, 5))),
                                               out(g, (2, 4, 5))), {},
                                          ValueError, f"{MM}: out has shape (2, 4, 5)")),
        ("batch_enlarges_out", lambda g: (fn, (g(_values((2, 4, 6))), ab(g)[1], out(g)), {},
                                          ValueError, f"{MM}: out has shape (4, 5)")),
        ("out_wrong_n", lambda g: (fn, (*ab(g), out(g, (4, 6))), {},
                                   ValueError, f"{MM}: out has shape (4, 6)")),
        ("out_float32", lambda g: (fn, (*ab(g), out(g, dtype=np.float32)), {},
                                   ValueError, f"{MM}: out has dtype float32; expected float64")),
        ("mixed_out_float16", lambda g: (fn, (ab(g, dtype=np.float16)[0],
                                              ab(g, dtype=np.float32)[1],
                                              out(g, dtype=np.float16)), {},
                                         ValueError, f"{MM}: out has dtype float16; expected "
                                                     f"float32")),
        ("out_read_only", lambda g: (fn, (*ab(g), g(_values((4, 5)), writeable=False)), {},
                                     ValueError, f"{MM}: out is read-only")),
        ("n_threads_float", lambda g: (call(n_threads=2.0), (*ab(g), out(g)), {},
                                       TypeError, f"{MM}: n_threads must be an int or None")),
        ("n_threads_bool", lambda g: (call(n_threads=True), (*ab(g), out(g)), {},
                                      TypeError, f"{MM}: n_threads must be an int or None, got "
                                                 f"bool")),
        ("n_threads_zero", lambda g: (call(n_threads=0), (*ab(g), out(g)), {},
                                      ValueError, f"{MM}: n_threads must be nonzero")),
        ("n_threads_zero_k0", lambda g: (call(n_threads=0), (*ab(g, k=0), out(g)), {},
                                         ValueError, f"{MM}: n_threads must be nonzero")),
        ("n_threads_zero_empty_out", lambda g: (call(n_threads=0), (*ab(g, m=0), out(g, (0, 5))),
                                                {}, ValueError, f"{MM}: n_threads must be "
                                                                f"nonzero")),
        ("out_is_a_bad_alpha", lambda g: (lambda a, b: fn(a, b, a, alpha="x"),
                                          ab(g, m=6, k=6, n=6), {},
                                          TypeError, f"{MM}: alpha must be a real number")),
        ("out_overlaps_b_n_threads_zero",
         lambda g: (lambda b: fn(b[:, :3], b[:3, :3], b[:, 3:], n_threads=0),
                    (g(_values((6, 6))),), {}, ValueError, f"{MM}: n_threads must be nonzero")),
    ]


def _sdpa_cases():
    fn = cyattn.scaled_dot_product_attention

    def qkv(g, L=3, S=5, E=4, Ev=2, batch=(2,), dtype=np.float64, kv_batch=None):
        kv_batch = batch if kv_batch is None else kv_batch
        return (g(_values(batch + (L, E), dtype)), g(_values(kv_batch + (S, E), dtype, seed=4)),
                g(_values(kv_batch + (S, Ev), dtype, seed=5)))

    def out(g, shape=(2, 3, 2), dtype=np.float64):
        return g(_values(shape, dtype, seed=6))

    def with_out(g, **kw):
        return {"out": out(g), **kw}

    cases = [
        ("query_int", lambda g: (fn, (g(np.ones((2, 3, 4), np.int64)), *qkv(g)[1:]),
                                 with_out(g), TypeError, f"{ATT}: query has dtype int64")),
        ("key_bool", lambda g: (fn, (qkv(g)[0], g(np.ones((2, 5, 4), bool)), qkv(g)[2]),
                                with_out(g), TypeError, f"{ATT}: key has dtype bool")),
        ("value_complex", lambda g: (fn, (*qkv(g)[:2], g(np.ones((2, 5, 2), complex))),
                                     with_out(g), TypeError, f"{ATT}: value has dtype complex")),
        ("key_ragged", lambda g: (fn, (qkv(g)[0], [[1.0, 2.0], [1.0]], qkv(g)[2]), with_out(g),
                                  TypeError, f"{ATT}: key could not be converted")),
        ("is_causal_int", lambda g: (fn, qkv(g), with_out(g, is_causal=1),
                                     TypeError, f"{ATT}: is_causal must be a bool, got int")),
        ("enable_gqa_none", lambda g: (fn, qkv(g), with_out(g, enable_gqa=None),
                                       TypeError, f"{ATT}: enable_gqa must be a bool")),
        ("return_lse_str", lambda g: (fn, qkv(g), with_out(g, return_lse="yes"),
                                      TypeError, f"{ATT}: return_lse must be a bool")),
        ("causal_alignment", lambda g: (fn, qkv(g), with_out(g, is_causal=True,
                                                             causal_alignment="center"),
                                        ValueError, f"{ATT}: causal_alignment must be")),
        ("query_1d", lambda g: (fn, (g(_values((4,))), *qkv(g)[1:]), with_out(g),
                                ValueError, f"{ATT}: query must have at least 2 dimensions")),
        ("value_1d", lambda g: (fn, (*qkv(g)[:2], g(_values((5,)))), with_out(g),
                                ValueError, f"{ATT}: value must have at least 2 dimensions")),
        ("e_mismatch", lambda g: (fn, (qkv(g, E=4)[0], *qkv(g, E=6)[1:]), with_out(g),
                                  ValueError, f"{ATT}: query has E=4")),
        ("s_mismatch", lambda g: (fn, (*qkv(g, S=5)[:2], qkv(g, S=6)[2]), with_out(g),
                                  ValueError, f"{ATT}: key has S=5 rows")),
        ("batch_no_broadcast", lambda g: (fn, (qkv(g)[0], *qkv(g, batch=(3,))[1:]),
                                          with_out(g), ValueError,
                                          f"{ATT}: batch dimensions of query (2,), key (3,)")),
        ("gqa_no_head_dim", lambda g: (fn, qkv(g, batch=()), {"enable_gqa": True,
                                                              "out": out(g, (3, 2))},
                                       ValueError, f"{ATT}: enable_gqa needs a head dimension")),
        ("gqa_heads_not_dividing", lambda g: (fn, (qkv(g, batch=(1, 4))[0],
                                                   *qkv(g, batch=(1, 3))[1:]),
                                              {"enable_gqa": True, "out": out(g, (1, 4, 3, 2))},
                                              ValueError, f"{ATT}: with enable_gqa, key and "
                                                          f"value must have the same number")),
        ("gqa_kv_heads_differ", lambda g: (fn, (qkv(g, batch=(1, 4))[0],
                                                qkv(g, batch=(1, 2))[1],
                                                qkv(g, batch=(1, 1))[2]),
                                           {"enable_gqa": True}, ValueError,
                                           f"{ATT}: with enable_gqa")),
        ("gqa_outer_batch", lambda g: (fn, (qkv(g, batch=(2, 4))[0], *qkv(g, batch=(3, 2))[1:]),
                                       {"enable_gqa": True}, ValueError,
                                       f"{ATT}: batch dimensions of query (2,), key (3,)")),
        ("scale_str", lambda g: (fn, qkv(g), with_out(g, scale="0.5"),
                                 TypeError, f"{ATT}: scale must be a real number, got str")),
        ("scale_array", lambda g: (fn, qkv(g), with_out(g, scale=g(np.float64(0.5))),
                                   TypeError, f"{ATT}: scale must be a real number, got ndarray")),
        ("scale_huge", lambda g: (fn, qkv(g), with_out(g, scale=10**400),
                                  ValueError, f"{ATT}: scale is too large")),
        ("mask_int", lambda g: (fn, (*qkv(g), g(np.ones((3, 5), np.int64))), with_out(g),
                                TypeError, f"{ATT}: attn_mask has dtype int64")),
        ("mask_object", lambda g: (fn, (*qkv(g), np.ones((3, 5), object)), with_out(g),
                                   TypeError, f"{ATT}: attn_mask has dtype object")),
        ("mask_bool_shape", lambda g: (fn, (*qkv(g), g(np.ones((3, 4), bool))), with_out(g),
                                       ValueError, f"{ATT}: attn_mask has shape (3, 4)")),
        ("mask_float_enlarges", lambda g: (fn, (*qkv(g), g(_values((4, 2, 3, 5)))), with_out(g),
                                           ValueError, f"{ATT}: attn_mask has shape "
                                                       f"(4, 2, 3, 5)")),
        ("out_list", lambda g: (fn, qkv(g), {"out": [[0.0] * 2] * 3},
                                ValueError, f"{ATT}: out must be a numpy.ndarray, got list")),
        ("out_shape", lambda g: (fn, qkv(g), {"out": out(g, (2, 3, 4))},
                                 ValueError, f"{ATT}: out has shape (2, 3, 4); expected "
                                             f"(2, 3, 2)")),
        ("out_dtype", lambda g: (fn, qkv(g, dtype=np.float32), {"out": out(g)},
                                 ValueError, f"{ATT}: out has dtype float64; expected float32")),
        ("out_read_only", lambda g: (fn, qkv(g), {"out": g(_values((2, 3, 2)), writeable=False)},
                                     ValueError, f"{ATT}: out is read-only")),
        ("n_threads_float", lambda g: (fn, qkv(g), with_out(g, n_threads=1.5),
                                       TypeError, f"{ATT}: n_threads must be an int or None")),
        ("n_threads_zero", lambda g: (fn, qkv(g), with_out(g, n_threads=0, return_lse=True),
                                      ValueError, f"{ATT}: n_threads must be nonzero")),
        ("n_threads_zero_l0", lambda g: (fn, qkv(g, L=0), {"out": out(g, (2, 0, 2)),
                                                          "n_threads": 0},
                                         ValueError, f"{ATT}: n_threads must be nonzero")),
        ("f16_out_dtype", lambda g: (fn, qkv(g, dtype=np.float16),
                                     {"out": out(g, dtype=np.float32),
                                      "attn_mask": g(_values((3, 5), np.float32))},
                                     ValueError, f"{ATT}: out has dtype float32; expected "
                                                 f"float16")),
        ("byteswapped_n_threads_zero", lambda g: (fn, qkv(g, dtype=">f4"),
                                                  {"out": out(g, dtype=np.float32),
                                                   "n_threads": 0},
                                                  ValueError, f"{ATT}: n_threads must be "
                                                              f"nonzero")),
        ("out_is_value_bad_mask", lambda g: (lambda q, k, v: fn(q, k, v, out=v[:, :3],
                                                                attn_mask=np.ones((3, 5), int)),
                                             qkv(g, Ev=4, L=3), {},
                                             TypeError, f"{ATT}: attn_mask has dtype")),
        ("out_is_query_n_threads_zero", lambda g: (lambda q, k, v: fn(q, k, v, out=q,
                                                                      n_threads=0),
                                                   qkv(g, Ev=4), {},
                                                   ValueError, f"{ATT}: n_threads must be "
                                                               f"nonzero")),
    ]
    return cases


def _mha_base(g, separate=False, batched=True, dtype=np.float64):
    """(query, key, value, kwargs) for multi_head_attention: E=4, H=2, L=3, S=5, N=2."""
    E, L, S, N = 4, 3, 5, 2
    kdim, vdim = (3, 2) if separate else (E, E)
    lead = (lambda n: (n, N)) if batched else (lambda n: (n,))
    q = g(_values(lead(L) + (E,), dtype))
    k = g(_values(lead(S) + (kdim,), dtype, seed=1))
    v = g(_values(lead(S) + (vdim,), dtype, seed=2))
    kw = {"num_heads": 2, "out_proj_weight": g(_values((E, E), dtype, seed=3)),
          "in_proj_bias": g(_values((3 * E,), dtype, seed=4)),
          "out_proj_bias": g(_values((E,), dtype, seed=5))}
    if separate:
        kw.update(q_proj_weight=g(_values((E, E), dtype, seed=6)),
                  k_proj_weight=g(_values((E, kdim), dtype, seed=7)),
                  v_proj_weight=g(_values((E, vdim), dtype, seed=8)))
    else:
        kw["in_proj_weight"] = g(_values((3 * E, E), dtype, seed=9))
    return q, k, v, kw


def _mha_cases():
    fn = cyattn.multi_head_attention

    def case(label, exc, match, change=None, separate=False, batched=True, qkv=None):
        def build(g):
            q, k, v, kw = _mha_base(g, separate, batched)
            if change is not None:
                kw = {**kw, **change(g)}
            if qkv is not None:
                q, k, v = qkv(g, q, k, v)
            return fn, (q, k, v), kw, exc, f"{MHA}: {match}"
        return label, build

    return [
        case("num_heads_float", TypeError, "num_heads must be an int",
             lambda g: {"num_heads": 2.0}),
        case("num_heads_zero", ValueError, "num_heads must be positive",
             lambda g: {"num_heads": 0}),
        case("num_heads_not_dividing", ValueError,
             "embed_dim E=4 (from out_proj_weight) must be divisible by num_heads=3",
             lambda g: {"num_heads": 3}),
        case("need_weights_int", TypeError, "need_weights must be a bool",
             lambda g: {"need_weights": 1}),
        case("average_str", TypeError, "average_attn_weights must be a bool",
             lambda g: {"average_attn_weights": "no"}),
        case("is_causal_none", TypeError, "is_causal must be a bool",
             lambda g: {"is_causal": None}),
        case("batch_first_int", TypeError, "batch_first must be a bool",
             lambda g: {"batch_first": 0}),
        case("query_int", TypeError, "query has dtype int64",
             qkv=lambda g, q, k, v: (g(np.ones((3, 2, 4), np.int64)), k, v)),
        case("key_bool", TypeError, "key has dtype bool",
             qkv=lambda g, q, k, v: (q, g(np.ones((5, 2, 4), bool)), v)),
        case("value_complex", TypeError, "value has dtype complex",
             qkv=lambda g, q, k, v: (q, k, g(np.ones((5, 2, 4), complex)))),
        case("out_proj_weight_int", TypeError, "out_proj_weight has dtype int64",
             lambda g: {"out_proj_weight": g(np.eye(4, dtype=np.int64))}),
        case("out_proj_weight_none", ValueError, "out_proj_weight is required",
             lambda g: {"out_proj_weight": None}),
        case("out_proj_weight_not_square", ValueError, "out_proj_weight has shape (4, 3)",
             lambda g: {"out_proj_weight": g(_values((4, 3)))}),
        case("in_proj_weight_shape", ValueError, "in_proj_weight has shape (12, 3)",
             lambda g: {"in_proj_weight": g(_values((12, 3)))}),
        case("in_proj_weight_int", TypeError, "in_proj_weight has dtype int64",
             lambda g: {"in_proj_weight": g(np.ones((12, 4), np.int64))}),
        case("in_proj_bias_shape", ValueError, "in_proj_bias has shape (4,)",
             lambda g: {"in_proj_bias": g(_values((4,)))}),
        case("out_proj_bias_shape", ValueError, "out_proj_bias has shape (1, 4)",
             lambda g: {"out_proj_bias": g(_values((1, 4)))}),
        case("both_weights", ValueError, "got both in_proj_weight and q_proj_weight",
             lambda g: {"q_proj_weight": g(_values((4, 4)))}),
        case("separate_missing", ValueError, "in_proj_weight is None and v_proj_weight missing",
             lambda g: {"v_proj_weight": None}, separate=True),
        case("q_proj_shape", ValueError, "q_proj_weight has shape (4, 3)",
             lambda g: {"q_proj_weight": g(_values((4, 3)))}, separate=True),
        case("k_proj_shape", ValueError, "k_proj_weight has shape (3, 3)",
             lambda g: {"k_proj_weight": g(_values((3, 3)))}, separate=True),
        case("v_proj_1d", ValueError, "v_proj_weight has shape (4,)",
             lambda g: {"v_proj_weight": g(_values((4,)))}, separate=True),
        case("query_4d", ValueError, "query has shape (1, 3, 2, 4)",
             qkv=lambda g, q, k, v: (g(_values((1, 3, 2, 4))), k, v)),
        case("key_2d", ValueError, "key has shape (5, 4) but query has shape (3, 2, 4)",
             qkv=lambda g, q, k, v: (q, g(_values((5, 4))), v)),
        case("query_e", ValueError, "query has shape (3, 2, 3); expected (L, N, E) with E=4",
             qkv=lambda g, q, k, v: (g(_values((3, 2, 3))), k, v)),
        case("key_batch", ValueError, "key has shape (5, 1, 4)",
             qkv=lambda g, q, k, v: (q, g(_values((5, 1, 4))), v)),
        case("value_s", ValueError, "value has shape (4, 2, 4)",
             qkv=lambda g, q, k, v: (q, k, g(_values((4, 2, 4))))),
        case("value_vdim_separate", ValueError, "value has shape (5, 2, 4)",
             qkv=lambda g, q, k, v: (q, k, g(_values((5, 2, 4)))), separate=True),
        case("kpm_int", TypeError, "key_padding_mask has dtype int64",
             lambda g: {"key_padding_mask": g(np.zeros((2, 5), np.int64))}),
        case("attn_mask_int", TypeError, "attn_mask has dtype int64",
             lambda g: {"attn_mask": g(np.zeros((3, 5), np.int64))}),
        case("kpm_shape", ValueError, "key_padding_mask has shape (5, 2)",
             lambda g: {"key_padding_mask": g(np.zeros((5, 2), bool))}),
        case("kpm_unbatched_shape", ValueError, "key_padding_mask has shape (1, 5)",
             lambda g: {"key_padding_mask": g(_values((1, 5)))}, batched=False),
        case("attn_mask_shape", ValueError, "attn_mask has shape (5, 3)",
             lambda g: {"attn_mask": g(np.zeros((5, 3), bool))}),
        case("attn_mask_3d_shape", ValueError, "attn_mask has shape (2, 3, 5)",
             lambda g: {"attn_mask": g(_values((2, 3, 5)))}),
        case("attn_mask_unbatched", ValueError, "attn_mask has shape (4, 3, 5)",
             lambda g: {"attn_mask": g(_values((4, 3, 5)))}, batched=False),
    ]


ERROR_CASES = ([(f"softmax-{lbl}", b) for lbl, b in _sm_cases(cyattn.softmax, SM)]
               + [(f"log_softmax-{lbl}", b) for lbl, b in _sm_cases(cyattn.log_softmax, LSM)]
               + [(f"matmul-{lbl}", b) for lbl, b in _mm_cases()]
               + [(f"sdpa-{lbl}", b) for lbl, b in _sdpa_cases()]
               + [(f"mha-{lbl}", b) for lbl, b in _mha_cases()])


def _plain_arrays(*containers):
    """ndarrays passed outside the guarded factory (object arrays): (array, copy) pairs."""
    found = []
    for c in containers:
        for a in (c.values() if isinstance(c, dict) else c):
            if isinstance(a, np.ndarray) and a.dtype == object:
                found.append((a, a.copy()))
    return found


@pytest.mark.parametrize("label,build", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_failed_call_changes_nothing(label, build):
    """Every error path: ``out`` and every input (their elements, the bytes between strided
    elements and 64 bytes either side) are bit-for-bit unchanged; NaN payloads included."""
    g = _Guarded(seed=len(label))
    fn, args, kwargs, exc, match = build(g)
    before = g.snapshot()
    assert before, "the case has no guarded arrays"
    plain = _plain_arrays(args, kwargs)
    with pytest.raises(exc, match=re.escape(match)):
        fn(*args, **kwargs)
    assert g.snapshot() == before, "a failing call wrote into an argument (or next to one)"
    for a, copy in plain:
        assert a.tolist() == copy.tolist()


def _module_arrays(module):
    return {name: (getattr(module, name).dtype.str, getattr(module, name).tobytes())
            for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
                         "in_proj_bias", "out_proj_weight", "out_proj_bias")
            if getattr(module, name) is not None}


@pytest.mark.parametrize("separate", [False, True], ids=["packed", "separate"])
def test_failed_module_calls_change_nothing(separate):
    """MultiHeadAttention: a failing forward, load_state_dict or from_torch leaves the module's
    parameters, the inputs and the state arrays bit-for-bit unchanged."""
    g = _Guarded(seed=3)
    kw = {"kdim": 3, "vdim": 2} if separate else {}
    m = cyattn.MultiHeadAttention(4, 2, batch_first=True, dtype=np.float64, seed=0, **kw)
    for name in _module_arrays(m):            # parameters with NaN payloads, in guarded views
        setattr(m, name, g(_values(getattr(m, name).shape, seed=len(name))))
    kd, vd = (3, 2) if separate else (4, 4)
    q, k, v = g(_values((2, 3, 4))), g(_values((2, 5, kd), seed=1)), g(_values((2, 5, vd), seed=2))
    state = {name: g(_values(arr.shape, seed=len(name) + 1))
             for name, arr in m.state_dict().items()}
    first = next(iter(state))
    bad_q = g(_values((2, 3, 5)))
    int_kpm = g(np.zeros((2, 5), np.int64))
    bad_am = g(np.zeros((3, 4), bool))
    bad_first = g(_values((1, 1)))
    int_weight = g(np.ones((4, 4), np.int64))
    bias_k = g(_values((1, 1, 4)))
    failing = [
        (lambda: m(bad_q, k, v), ValueError, "query has shape (2, 3, 5)"),
        (lambda: m(q, k, v, key_padding_mask=int_kpm), TypeError,
         "key_padding_mask has dtype int64"),
        (lambda: m(q, k, v, attn_mask=bad_am), ValueError, "attn_mask has shape (3, 4)"),
        (lambda: m(q, k, v, need_weights="yes"), TypeError, "need_weights must be a bool"),
        (lambda: m.load_state_dict({**state, first: bad_first}), ValueError,
         f"{first!r} has shape (1, 1)"),
        (lambda: m.load_state_dict({**state, "out_proj.weight": int_weight}),
         TypeError, "'out_proj.weight' has dtype int64"),
        (lambda: m.load_state_dict({**state, "bias_k": bias_k}), ValueError,
         "add_bias_kv is not supported"),
        (lambda: m.load_state_dict({k_: a for k_, a in state.items() if k_ != first}),
         ValueError, "missing keys"),
        (lambda: cyattn.MultiHeadAttention.from_torch(FakeTorchMHA(m, _state=state),
                                                      dtype=np.int8),
         TypeError, "dtype must be float16, float32 or float64"),
        (lambda: cyattn.MultiHeadAttention.from_torch(FakeTorchMHA(m, _state=state, dropout=0.5)),
         ValueError, "inference only"),
    ]
    before_params = _module_arrays(m)
    before = g.snapshot()
    for call, exc, match in failing:
        with pytest.raises(exc, match=re.escape(match)):
            call()
        assert _module_arrays(m) == before_params, f"module changed by failing call: {match}"
        assert g.snapshot() == before, f"an argument changed by failing call: {match}"


@pytest.mark.parametrize("fn_name", ["softmax", "log_softmax", "matmul", "sdpa"])
def test_successful_call_writes_only_out(variant, fn_name):
    """The counterpart of the error test: with a strided, reversed ``out``, a successful call
    writes exactly the elements of ``out`` (the gaps and guards keep their bytes) and the
    result equals the one computed without ``out``."""
    g = _Guarded(seed=9)
    rng = np.random.default_rng(9)
    if fn_name in ("softmax", "log_softmax"):
        fn = getattr(cyattn, fn_name)
        x = g(_values((6, 40)))
        mask = g(rng.random(40) < 0.8)
        out = g(_values((6, 40), seed=1))
        expected = fn(np.array(x), mask=np.array(mask))
        call = lambda: fn(x, mask=mask, out=out)
    elif fn_name == "matmul":
        a, b = g(rng.standard_normal((7, 30))), g(rng.standard_normal((30, 9)))
        out = g(rng.standard_normal((7, 9)))
        expected = np.array(out)
        cyattn.matmul_accumulate(np.array(a), np.array(b), expected)
        call = lambda: cyattn.matmul_accumulate(a, b, out, n_threads=2)
    else:
        q, k, v = (g(rng.standard_normal((2, 70, 8))) for _ in range(3))
        mask = g(rng.random((70, 70)) < 0.8)
        out = g(_values((2, 70, 8), seed=2))
        expected = cyattn.scaled_dot_product_attention(*(np.array(t) for t in (q, k, v)),
                                                       np.array(mask))
        call = lambda: cyattn.scaled_dot_product_attention(q, k, v, mask, out=out,
                                                           n_threads=2)
    before = g.snapshot()
    idx = next(i for i, r in enumerate(g.raws) if np.shares_memory(r, out))
    assert call() is out
    np.testing.assert_array_equal(out, expected)
    after = g.snapshot()
    for i, (x0, x1) in enumerate(zip(before, after)):
        if i != idx:
            assert x0 == x1, f"argument buffer {i} changed"
    # In out's own buffer, only out's elements may change.
    raw0 = np.frombuffer(before[idx], np.uint8)
    raw1 = np.frombuffer(after[idx], np.uint8)
    touched = np.zeros(raw0.size, bool)
    start = out.__array_interface__["data"][0] - g.raws[idx].__array_interface__["data"][0]
    for pos in np.ndindex(*out.shape):
        off = start + sum(i * s for i, s in zip(pos, out.strides))
        touched[off:off + out.itemsize] = True
    assert np.array_equal(raw0[~touched], raw1[~touched]), "bytes outside out were written"


# ------------------------------------------------------------------------------------------
# 7. Limits: 32-bit overflow of counts and offsets, requests larger than memory
# ------------------------------------------------------------------------------------------
# Each runs in a subprocess, so that a crash is a test failure and not the end of the run.
# Views with zero strides (np.broadcast_to) and a NORESERVE anonymous mapping (whose untouched
# pages are never backed by memory) give element counts and offsets beyond 2**31 while memory
# use stays at a few MiB. A softmax over more than 2**31 elements is not tried: its result alone
# needs >= 4 GiB.

_ZERO_SIZE_SCRIPT = r'''
import json
import numpy as np
import cyattn
bt = np.broadcast_to
BIG = 2**31 + 1
checked = []

def check(name, got, shapes, dtype=np.float64):
    got = got if isinstance(got, tuple) else (got,)
    assert [g.shape for g in got] == [tuple(s) for s in shapes], (name, [g.shape for g in got])
    assert all(g.dtype == dtype for g in got), name
    checked.append(name)

for fn in (cyattn.softmax, cyattn.log_softmax):
    x = np.empty((0, BIG), np.float32)
    check(fn.__name__ + " (0, BIG)", fn(x), [x.shape], np.float32)
    check(fn.__name__ + " (0, BIG) axis 0 mask", fn(x, axis=0, mask=bt(True, (BIG,))),
          [x.shape], np.float32)
    check(fn.__name__ + " (BIG, 0) axis 0", fn(np.empty((BIG, 0)), axis=0), [(BIG, 0)])
    check(fn.__name__ + " (3, 0, BIG) out", fn(np.empty((3, 0, BIG)), out=np.empty((3, 0, BIG))),
          [(3, 0, BIG)])

sdpa = cyattn.scaled_dot_product_attention
k, v = bt(np.zeros(4), (BIG, 4)), bt(np.ones(2), (BIG, 2))
check("sdpa L=0, S=BIG", sdpa(np.ones((0, 4)), k, v, return_lse=True), [(0, 2), (0,)])
check("sdpa L=0, S=BIG, mask", sdpa(np.ones((0, 4)), k, v, bt(True, (0, BIG)), is_causal=True),
      [(0, 2)])
check("sdpa batch=BIG, L=0", sdpa(np.ones((BIG, 0, 4)), np.ones((3, 4)), np.ones((3, 2)),
                                  return_lse=True), [(BIG, 0, 2), (BIG, 0)])
check("sdpa batch 0, S=BIG", sdpa(np.ones((0, 3, 4)), k, v), [(0, 3, 2)])
check("sdpa out L=0, S=BIG", sdpa(np.ones((0, 4)), k, v, out=np.empty((0, 2))), [(0, 2)])

mm = cyattn.matmul_accumulate
ones = bt(np.float64(1), (BIG, 3))
out = np.zeros((0, 3))
check("matmul M=0, K=BIG", mm(np.empty((0, BIG)), ones, out), [(0, 3)])
check("matmul N=0, K=BIG", mm(bt(np.float64(1), (2, BIG)), np.empty((BIG, 0)), np.zeros((2, 0))),
      [(2, 0)])
check("matmul batch=BIG, N=0", mm(bt(np.zeros((2, 3)), (BIG, 2, 3)), np.empty((3, 0)),
                                   np.empty((BIG, 2, 0))), [(BIG, 2, 0)])
o = np.full((2, 3), 1.5)
check("matmul K=0, batch of a BIG rows", mm(np.empty((2, 0)), np.empty((0, 3)), o), [(2, 3)])
assert (o == 1.5).all()
print("RESULT " + json.dumps(checked))
'''


def test_zero_size_results_with_a_dimension_beyond_int32():
    """A dimension > 2**31 next to a zero-length one: an empty (or unchanged) result of the
    right shape and dtype, no crash, no huge allocation."""
    checked = _result_of(_run_python(_ZERO_SIZE_SCRIPT, timeout=120))
    assert len(checked) == 8 + 5 + 4


_OFFSETS_SCRIPT = r'''
import json, mmap
import numpy as np
import cyattn
from numpy.lib.stride_tricks import as_strided

MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)      # Linux value on x86-64 and arm64
# 256 GiB: the longest single view below spans 188 GiB. The views are interleaved in it
# (each starts a page after the last one's start, moved on until it shares no element with a
# view made before), not laid end to end (1.06 TiB): qemu-user 7.2 keeps about 6 GB of state a
# TiB of guest mapping, touched or not, and a 4 TiB mapping had the host's OOM killer end it.
SIZE = 1 << 38
try:
    m = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE,
                  prot=mmap.PROT_READ | mmap.PROT_WRITE)
except (OSError, OverflowError, ValueError) as exc:            # e.g. strict overcommit
    print("RESULT " + json.dumps({"skip": f"cannot map 256 GiB with MAP_NORESERVE: {exc}"}))
    raise SystemExit(0)
pos = [0]
views = []
rng = np.random.default_rng(17)

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE

def take(dtype, shape, strides, values=None):
    """A view of ``shape`` with element ``strides`` in the mapping, filled with values."""
    dt = np.dtype(dtype)
    span = (sum((n - 1) * s for n, s in zip(shape, strides)) + 1) * dt.itemsize
    start = pos[0]
    while True:
        assert start + span <= SIZE
        flat = np.frombuffer(m, dtype=np.uint8, count=span, offset=start).view(dt)
        arr = as_strided(flat, shape, tuple(s * dt.itemsize for s in strides))
        if not any(np.shares_memory(arr, v, max_work=None) for v in views):   # exact test
            break
        start += mmap.PAGESIZE
    pos[0] = start + mmap.PAGESIZE
    views.append(arr)
    arr[...] = rng.standard_normal(shape) if values is None else values
    return arr

RS = 2**31 + 64          # an element stride whose multiples overflow int32
checked = []

def same(name, got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert np.array_equal(g, w, equal_nan=True), f"{name}: differs from compact copies"
    checked.append(name)

def c(a):
    return None if a is None else np.array(a)        # compact C-contiguous copy

mm, sdpa, sm, lsm = (cyattn.matmul_accumulate, cyattn.scaled_dot_product_attention,
                     cyattn.softmax, cyattn.log_softmax)
start_rss = rss()
for dt in (np.float32, np.float64):
    name = np.dtype(dt).name
    a = take(dt, (3, 5), (RS, 1))
    b = take(dt, (5, 4), (1, RS))
    out = take(dt, (3, 4), (RS, 1))
    want = c(out)
    mm(c(a), c(b), want, alpha=0.5)
    mm(a, b, out, alpha=0.5, n_threads=2)
    same(f"matmul rows/cols/out {RS} apart {name}", np.array(out), want)
    a3 = take(dt, (2, 3, 5), (RS, 5, 1))
    out3 = np.zeros((2, 3, 4), dt)
    want3 = out3.copy()
    mm(c(a3), c(b), want3)
    mm(a3, b, out3)
    same(f"matmul batch {RS} apart {name}", out3, want3)

    q = take(dt, (2, 2, 3, 4), (RS, 12, 4, 1))           # batch entries RS apart
    k = take(dt, (2, 1, 5, 4), (5 * RS, RS, RS, 1))      # key rows RS apart (GQA: 1 kv head)
    v = take(dt, (2, 1, 5, 3), (5 * RS, 1, RS, 1))
    bmask = take(np.bool_, (2, 1, 3, 5), (3 * 2**31, 2**31, 2**31 + 9, 1),
                 rng.random((2, 1, 3, 5)) < 0.7)          # byte offsets beyond 2**32
    fmask = take(dt, (3, 5), (RS, 1),
                 np.where(rng.random((3, 5)) < 0.3, -np.inf, rng.standard_normal((3, 5))))
    for label, mask in (("none", None), ("bool", bmask), ("float", fmask)):
        for causal in (False, True):
            kw = dict(enable_gqa=True, is_causal=causal, causal_alignment="bottom_right",
                      return_lse=True)
            want = sdpa(c(q), c(k), c(v), c(mask), **kw)
            got = sdpa(q, k, v, mask, n_threads=2, **kw)
            same(f"sdpa mask={label} causal={causal} {name}", got, want)
    out = take(dt, (2, 2, 3, 3), (6 * RS, 3 * RS, RS, 1))
    want = sdpa(c(q), c(k), c(v), c(bmask), enable_gqa=True)
    sdpa(q, k, v, bmask, enable_gqa=True, out=out)
    same(f"sdpa out {RS} apart {name}", np.array(out), want)

    x = take(dt, (3, 40), (RS, 1))
    for label, mask in (("none", None), ("bool", take(np.bool_, (3, 40), (2**31 + 3, 1),
                                                      rng.random((3, 40)) < 0.6)),
                        ("float", take(dt, (3, 40), (RS, 1)))):
        for fn in (sm, lsm):
            for axis in (-1, 0):
                same(f"{fn.__name__} mask={label} axis={axis} {name}",
                     fn(x, axis=axis, mask=mask), fn(c(x), axis=axis, mask=c(mask)))
print("RESULT " + json.dumps({"checked": checked, "rss_growth": rss() - start_rss}))
'''


@pytest.mark.skipif(not LINUX, reason="uses a Linux MAP_NORESERVE mapping")
def test_strides_and_offsets_beyond_int32(variant):
    """Arrays whose rows, columns, batch entries and mask rows lie more than 2**31 elements
    apart (views interleaved in 256 GiB of address space, a few pages touched): every function
    gives the result of the same call on compact copies, bit for bit."""
    res = _result_of(_run_python(_OFFSETS_SCRIPT, variant=variant, timeout=300))
    if "skip" in res:
        pytest.skip(res["skip"])
    assert len(res["checked"]) == 2 * (2 + 6 + 1 + 12)
    assert res["rss_growth"] < 256 * 2**20      # the mapping stayed (almost) untouched


_MEMORY_SCRIPT = r'''
import json, resource, sys
LIMIT = 8 * 2**30
resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))   # a safety net on any overcommit policy
import numpy as np
import cyattn
bt = np.broadcast_to
sdpa = cyattn.scaled_dot_product_attention
BIG = 2**31 + 1
outcome = {}

def attempt(name, fn):
    try:
        res = fn()
    except MemoryError as exc:
        outcome[name] = ["MemoryError", str(exc)]
    except BaseException as exc:
        outcome[name] = [type(exc).__name__, str(exc)]
    else:
        res = res if isinstance(res, tuple) else (res,)
        outcome[name] = ["ok", [list(r.shape) for r in res],
                         [float(r.ravel()[0]) if r.size else None for r in res]]

# results of many TiB
attempt("softmax 16 TiB", lambda: cyattn.softmax(bt(np.float32(0), (2**20, 2**22))))
attempt("log_softmax 32 TiB, mask", lambda: cyattn.log_softmax(
    bt(np.float64(0), (2**20, 2**22)), mask=bt(True, (2**22,))))
attempt("sdpa out 32 TiB", lambda: sdpa(bt(np.zeros(4), (2**40, 1, 4)), np.ones((3, 4)),
                                        np.ones((3, 4))))
attempt("sdpa lse 8 TiB", lambda: sdpa(bt(np.zeros(4), (2**40, 1, 4)), np.ones((3, 4)),
                                       np.ones((3, 0)), return_lse=True))
attempt("sdpa float mask, out 16 TiB", lambda: sdpa(
    bt(np.float32(0), (2**30, 2**10, 4)), np.ones((3, 4), np.float32),
    np.ones((3, 4), np.float32), bt(np.float32(0), (2**10, 3))))
attempt("mha weights 96 TiB", lambda: cyattn.MultiHeadAttention(2**21, 1, dtype=np.float64))
attempt("mha projections 2 TiB", lambda: cyattn.multi_head_attention(
    bt(np.zeros(4), (2**36, 1, 4)), np.ones((3, 1, 4)), np.ones((3, 1, 4)), num_heads=2,
    in_proj_weight=np.ones((12, 4)), out_proj_weight=np.eye(4)))
# small results, S or E beyond 2**31: per-thread scratch of ~1 TiB for a kernel whose scratch
# grows with S or E (the S cases run the whole 2**31-key computation and are a slow test)
if "long" in sys.argv[1:]:
    attempt("sdpa S=BIG", lambda: sdpa(np.ones((2, 4)), bt(np.zeros(4), (BIG, 4)),
                                       bt(np.ones(2), (BIG, 2)), n_threads=2))
    attempt("sdpa S=BIG causal", lambda: sdpa(np.ones((2, 4)), bt(np.zeros(4), (BIG, 4)),
                                              bt(np.ones(2), (BIG, 2)), is_causal=True,
                                              causal_alignment="bottom_right", return_lse=True))
    attempt("sdpa S=BIG Ev=0", lambda: sdpa(np.ones((2, 4)), bt(np.zeros(4), (BIG, 4)),
                                            np.empty((BIG, 0))))
    print("RESULT " + json.dumps(outcome))
    sys.exit(0)
attempt("sdpa E=BIG", lambda: sdpa(bt(np.float32(0), (1, BIG)), bt(np.float32(0), (3, BIG)),
                                   np.ones((3, 2), np.float32)))
# absurd thread counts are capped by the work
for n in (2**40, 2**70, -2**70):
    attempt(f"matmul n_threads={n}", lambda: cyattn.matmul_accumulate(
        np.ones((300, 300)), np.ones((300, 300)), np.zeros((300, 300)), n_threads=n))
    attempt(f"sdpa n_threads={n}", lambda: sdpa(np.ones((300, 64)), np.ones((300, 64)),
                                                np.full((300, 64), 2.0), n_threads=n))
print("RESULT " + json.dumps(outcome))
'''

_TIB_CASES = ["softmax 16 TiB", "log_softmax 32 TiB, mask", "sdpa out 32 TiB", "sdpa lse 8 TiB",
              "sdpa float mask, out 16 TiB", "mha weights 96 TiB", "mha projections 2 TiB"]
_SCRATCH_CASES = {"sdpa E=BIG": [1, 2]}
_LONG_SCRATCH_CASES = {"sdpa S=BIG": [2, 2], "sdpa S=BIG causal": [2, 2],
                       "sdpa S=BIG Ev=0": [2, 0]}


def _check_scratch_cases(outcome, cases):
    for name, shape in cases.items():
        kind = outcome[name][0]
        if kind == "ok":
            assert outcome[name][1][0] == shape, (name, outcome[name])
            # every key and value is equal: the output is the value row (or empty)
            assert outcome[name][2][0] in (None, 0.0, 1.0), (name, outcome[name])
        else:
            assert kind == "MemoryError", (name, outcome[name])
            assert "cyattn.scaled_dot_product_attention" in outcome[name][1], outcome[name]


@pytest.mark.slow
@pytest.mark.skipif(not LINUX, reason="sets RLIMIT_AS")
def test_more_than_2_31_keys_work_or_raise_memory_error():
    """S = 2**31 + 1 keys on zero-stride views: the fused/decode kernels need O(tile) scratch,
    so these now run the whole computation (about a minute on this machine)."""
    outcome = _result_of(_run_python(_MEMORY_SCRIPT, "long", timeout=1800))
    _check_scratch_cases(outcome, _LONG_SCRATCH_CASES)


@pytest.mark.skipif(not LINUX, reason="sets RLIMIT_AS")
def test_requests_larger_than_memory_raise_memory_error(variant):
    """Results of many TiB raise MemoryError (not a crash, not a hang); calls whose per-thread
    scratch would exceed memory (S or E > 2**31 on zero-stride views) either work or raise a
    MemoryError naming the function; huge n_threads values are capped by the work."""
    outcome = _result_of(_run_python(_MEMORY_SCRIPT, variant=variant, timeout=300))
    for name in _TIB_CASES:
        assert outcome[name][0] == "MemoryError", (name, outcome[name])
    _check_scratch_cases(outcome, _SCRATCH_CASES)
    for n in (2**40, 2**70, -2**70):
        assert outcome[f"matmul n_threads={n}"] == ["ok", [[300, 300]], [300.0]]
        kind, shapes, first = outcome[f"sdpa n_threads={n}"]
        assert kind == "ok" and shapes == [[300, 64]] and abs(first[0] - 2.0) < 1e-12


_LOGICAL_SCRIPT = r'''
import json
import numpy as np
import cyattn
bt = np.broadcast_to
L = S = 2**16                        # 2**32 (query, key) pairs, ~2**31 of them causal
q = bt(np.float32(0.5), (L, 1))
k = bt(np.float32(1.0), (S, 1))
v = bt(np.float32(2.0), (S, 1))
out, lse = cyattn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
i = np.arange(L)
print("RESULT " + json.dumps({
    "out_ok": bool(np.allclose(out, 2.0, rtol=1e-5, atol=0)),
    "lse_err": float(np.max(np.abs(lse - (0.5 + np.log1p(i))) / (0.5 + np.log1p(i)))),
    "shapes": [list(out.shape), list(lse.shape)]}))
'''


@pytest.mark.slow
def test_attention_over_more_than_2_31_score_pairs():
    """Causal SDPA with L = S = 2**16 on zero-stride inputs (2**32 query-key pairs, about 2**31
    of them permitted, a few hundred KiB of memory): row i averages i + 1 equal scores, so
    out = v and lse = score + log(i + 1) up to rounding. (About 5 s on an idle 2-core machine,
    several times that under load: marked slow.)"""
    res = _result_of(_run_python(_LOGICAL_SCRIPT, timeout=300))
    assert res["shapes"] == [[2**16, 1], [2**16]]
    assert res["out_ok"]
    assert res["lse_err"] < 1e-5


_K_SCRIPT = r'''
import json
import numpy as np
import cyattn
K = 2**31 + 3
out = np.full((1, 1), 0.25)
cyattn.matmul_accumulate(np.broadcast_to(np.float64(1.0), (1, K)),
                         np.broadcast_to(np.float64(0.5), (K, 1)), out, alpha=2.0)
print("RESULT " + json.dumps(float(out[0, 0])))
'''


@pytest.mark.slow
def test_matmul_inner_dimension_beyond_int32():
    """matmul_accumulate with K = 2**31 + 3 on zero-stride operands: the exact float64 sum
    (about 90 s here: the blocked kernel walks K in 256-deep panels)."""
    got = _result_of(_run_python(_K_SCRIPT, timeout=1800))
    assert got == 0.25 + 2.0 * 0.5 * (2**31 + 3)


_BROADCAST_OVERFLOW = {
    "sdpa batch": lambda bt: cyattn.scaled_dot_product_attention(
        bt(np.zeros((1, 1, 1, 4)), (2**40, 1, 1, 4)), bt(np.zeros((1, 1, 3, 4)), (1, 2**40, 3, 4)),
        np.ones((3, 4))),
    "sdpa mask": lambda bt: cyattn.scaled_dot_product_attention(
        bt(np.float32(0), (2**40, 2**20, 1)), bt(np.float32(0), (2**20, 1)),
        bt(np.float32(0), (2**20, 1)), bt(True, (2**20, 2**20))),
}


@pytest.mark.parametrize("case", sorted(_BROADCAST_OVERFLOW))
def test_broadcast_overflow_is_reported_as_too_large(case):
    """Batch (or mask) shapes that broadcast to more than 2**63 elements: a ValueError or
    MemoryError that says the result is too large, not that the shapes do not broadcast."""
    with pytest.raises((ValueError, MemoryError)) as info:
        _BROADCAST_OVERFLOW[case](np.broadcast_to)
    message = str(info.value)
    assert "not broadcast" not in message, message
    assert "broadcast to more elements than an array can hold" in message, message
