"""Environment and timing of the bench: the interleaved, paired-ratio harness.

* :func:`interleaved` times several implementations in rounds (A B A B ...), each sample a
  calibrated number of calls (:func:`calibrate`); :func:`paired_ratio` is the median over rounds
  of one implementation's time over another's, :func:`summary` the (median, min, max).
* :class:`thread_limits` pins NumPy's BLAS and the OpenMP runtime with threadpoolctl when it is
  installed; :class:`Progress` draws the progress bar on stderr.
* ``OPENBLAS_CORETYPE`` / ``OPENBLAS_L2_SIZE`` slow NumPy's OpenBLAS and act when numpy is
  loaded, so :func:`rerun_without_blas_overrides` re-runs the bench in a child process without
  them (:func:`child_env` makes that child import this same cyattn).
"""
import gc
import math
import os
import statistics
import subprocess
import sys
import sysconfig
import time

BLAS_ENV_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
# The thread counts the BLAS libraries NumPy may link (and the OpenMP runtime) read when they load
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                   "BLIS_NUM_THREADS")
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
    # this file is <parent>/cyattn/_bench/timing.py
    pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    site_dirs = {os.path.abspath(p) for p in (sysconfig.get_paths()["purelib"],
                                              sysconfig.get_paths()["platlib"])}
    if pkg_parent not in site_dirs:
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if pkg_parent not in parts:
            env["PYTHONPATH"] = os.pathsep.join([pkg_parent] + parts)
    if extra:
        env.update(extra)
    return env


def have_threadpoolctl():
    """Whether threadpoolctl (which :class:`thread_limits` needs) can be imported."""
    try:
        import threadpoolctl  # noqa: F401
    except ImportError:
        return False
    return True


def env_thread_pins(n_threads, environ=None):
    """The :data:`THREAD_ENV_VARS` set to ``n_threads`` in ``environ`` (default os.environ)."""
    environ = os.environ if environ is None else environ
    return [k for k in THREAD_ENV_VARS if environ.get(k) == str(n_threads)]


def rerun_without_blas_overrides(args, out=None, coretype=None, threads=None):
    """If OpenBLAS overrides are set (and this is not already the clean child), run
    ``python <args>`` without them and return its exit code; else return None.

    ``args`` is the argument list after the interpreter, e.g. ``["-m", "cyattn", "bench"]``.
    ``coretype``: the child runs with ``OPENBLAS_CORETYPE=coretype`` alone instead (re-run
    unless the environment is already exactly that), e.g. ``"Haswell"`` so that NumPy's
    OpenBLAS runs its AVX2 kernels beside cyattn's forced avx2 variant on an AVX-512 host.
    ``threads``: the one thread count of the bench; when threadpoolctl is not installed (so
    NumPy's BLAS cannot be limited once loaded), the child also gets every
    :data:`THREAD_ENV_VARS` set to it (re-run unless they already are), so that NumPy's BLAS
    runs on as many threads as cyattn instead of on all the cores.
    """
    found = blas_env_overrides()
    want = {"OPENBLAS_CORETYPE": coretype} if coretype else {}
    pin = {}
    if threads is not None and not have_threadpoolctl():
        pin = {k: str(threads) for k in THREAD_ENV_VARS}
    pinned = all(os.environ.get(k) == v for k, v in pin.items())
    if os.environ.get(_CHILD_MARK) or (found == want and pinned):
        return None
    out = out or sys.stdout
    if not pinned:
        print(f"bench: threadpoolctl is not installed, so numpy's BLAS cannot be limited once "
              f"loaded; re-running the benchmark in a child process with "
              f"{', '.join(f'{k}={threads}' for k in THREAD_ENV_VARS)} "
              f"(`pip install threadpoolctl` avoids the re-run)", file=out, flush=True)
    if found:
        names = ", ".join(f"{k}={v}" for k, v in found.items())
        verb, it = ("are", "them") if len(found) > 1 else ("is", "it")
        print(f"bench: {names} {verb} set in the environment and "
              f"slow{'' if len(found) > 1 else 's'} numpy's OpenBLAS; re-running the benchmark "
              f"in a child process without {it}"
              + (f", with OPENBLAS_CORETYPE={coretype} (--blas-coretype)" if coretype else "")
              + " (this process's environment is left as it is)", file=out, flush=True)
    env = child_env(remove=BLAS_ENV_VARS, extra={_CHILD_MARK: "1", **want, **pin})
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


# Seconds of untimed calls after each pause of interleaved() (see there).
WARM_AFTER_PAUSE = 0.1


def settle(fn, pause, warm=WARM_AFTER_PAUSE):
    """What precedes a sample of ``fn`` (see :func:`interleaved`): ``pause`` seconds of sleep,
    if any, then untimed calls of ``fn``: for ``warm`` seconds after a pause, else one."""
    if pause:
        time.sleep(pause)
    seconds = warm if pause else 0.0
    t0 = time.perf_counter()
    fn()
    while time.perf_counter() - t0 < seconds:
        fn()


def interleaved(fns, samples=7, target=0.02, pause=0.0, tick=None, warm=WARM_AFTER_PAUSE):
    """Time each callable of ``fns`` (a dict name -> fn) ``samples`` times, interleaved.

    Round r runs every function once in order (A B A B ...), each for a calibrated number of
    calls; returns a dict name -> list of seconds per call, one per round. ``tick()`` is called
    after each round. Each sample is preceded by one untimed call of its function, so that what
    the previous function left running does not land in it: after a jitted JAX attention
    returned, the next call of cyattn (45 ms alone, one call per sample) ran 20-30 ms slower,
    and only that call (one thread; we take it for JAX freeing its buffers after returning).

    ``pause`` seconds of sleep separate samples, and the untimed calls then last ``warm``
    seconds (at least one call; default :data:`WARM_AFTER_PAUSE`):

    * here the first call after a sleep ran 1.5-2.5x slower for every implementation (decode
      at 2 threads: 9-15 ms, then 5-6 ms), which with a few calls per sample decided the ratio;
    * on a 2-vCPU VM (Zen 5 host) 2-thread calls stalled for 10-45 ms in all within the first
      50-100 ms after a 0.2 s sleep (a 33 µs softmax averaged 0.2-0.9 ms per call over 50
      calls), so that samples of small cases measured the stall (a median of 1.03 ms against a
      minimum of 33 µs). After 0.1 s of calls no stall was left.
    """
    numbers = {name: calibrate(fn, target) for name, fn in fns.items()}
    times = {name: [] for name in fns}
    for _ in range(samples):
        for name, fn in fns.items():
            settle(fn, pause, warm)
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
