"""Peak memory growth of one call, one case and implementation per fresh Python process
(Linux ``/proc``: VmHWM after ``clear_refs``, else ``ru_maxrss``)."""
import gc
import json
import subprocess
import sys

from .cases import IMPLS, Spec, prepare, torch_module
from .peers import JAX_ENV
from .timing import child_env, thread_limits

_MEM_MARK = "CYATTN_BENCH_MEMORY "


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
        fns = make(n_threads)
        if impl not in fns and impl in IMPLS:   # NumPy, ORT, JAX on the half-precision cases
            print(_MEM_MARK + json.dumps({"skipped": f"no {impl} implementation of this case"}),
                  flush=True)
            return
        fn = fns[impl]
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
    earlier peak), with ``skipped`` when ``impl`` has no implementation of the case, or with
    ``error``."""
    code = ("import sys; from cyattn._bench import memory; "
            "memory._memory_child(sys.argv[1], sys.argv[2], int(sys.argv[3]))")
    try:
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(spec.to_json()), impl,
                               str(n_threads)], env=child_env(extra={JAX_ENV: str(n_threads)}),
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(_MEM_MARK):
            return json.loads(line[len(_MEM_MARK):])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"exit code {proc.returncode}: {tail}"}
