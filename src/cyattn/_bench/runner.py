"""The full harness's run: every case at every thread count through the interleaved harness,
the machine measurements before and after, the memory phase; returns the result dict that the
report, the plot and latest.json are made from."""
import datetime
import os
import platform
import time

import numpy as np

from .cases import _MIB, DECODE_SHAPE, KV_READ, Spec, check_case, prepare, torch_module
from .machine import _cpu_name, measure_fma_peak, measure_read_bandwidth
from .memory import measure_memory, memory_supported
from .timing import Progress, interleaved, thread_limits


def run_full(specs, threads=(1, 2), samples=7, target=0.03, pause=0.2, use_torch=True,
             memory=True, notes=(), progress=True, seed=0):
    """Measure ``specs`` at each thread count; returns the result dict that
    :func:`render_markdown` and :func:`write_plot` take (and that is saved as JSON)."""
    import cyattn
    from .. import _backend
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
