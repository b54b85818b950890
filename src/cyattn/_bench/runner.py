"""The full harness's run: every case at every thread count through the interleaved harness,
the machine measurements before and after, the memory phase; returns the result dict that the
report, the plot and latest.json are made from.

Before a case is timed, each implementation's result is compared with cyattn's
(:func:`time_case`): one that differs, or raises, is reported in the row and not timed. When
JAX is a peer, each thread count's column runs in a fresh process with XLA's thread pool pinned
(:data:`cyattn._bench.peers.JAX_ENV`, which must be set before jax is imported), and all the
implementations of that column are interleaved there.
"""
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

from . import peers as _peers
from .cases import _MIB, DECODE_SHAPE, KV_READ, Spec, check_case, prepare, torch_module
from .machine import _cpu_name, measure_fma_peak, measure_read_bandwidth, measure_sgemm
from .memory import measure_memory, memory_supported
from .timing import Progress, child_env, interleaved, thread_limits

PEER_NAMES = {"torch": "PyTorch", "ort": "ONNX Runtime", "jax": "JAX"}
_OWN = ("cyattn", "numpy", KV_READ)


def time_case(make, reference, n_threads, samples, target, pause=0.0, tick=None):
    """Check, then time one case at ``n_threads``: returns ``{"times", "differs", "errors"}``.

    ``reference()`` runs each implementation once (:func:`check_case`); an implementation
    whose result differs from cyattn's is listed in ``differs`` (with what differs in
    ``errors``) and one that raises has its message in ``errors``: neither is timed. The rest
    of ``make(n_threads)`` is timed by :func:`interleaved`; the timed calls of the peers built
    for this thread count run once first, and one that raises is reported the same way.
    """
    details = {}
    differs, errors = check_case(reference, details)
    errors = dict(errors)
    errors.update({name: f"wrong result, not timed: {why}" for name, why in details.items()})
    fns = {}
    for name, fn in make(n_threads).items():
        if name in errors:
            continue
        if name in _OWN:                             # cannot fail where the reference ran
            fns[name] = fn
            continue
        try:
            fn()                                     # the timed call itself must run too
        except Exception as exc:  # reported, not fatal
            errors[name] = f"{type(exc).__name__}: {exc}"
            continue
        fns[name] = fn
    times = interleaved(fns, samples=samples, target=target, pause=pause, tick=tick)
    return {"times": times, "differs": differs, "errors": errors}


def _run_column(specs, n, impls, samples, target, pause, seed, bar):
    """Rows of every case in ``specs`` at ``n`` threads (in this process); also whether
    threadpoolctl pinned NumPy's BLAS."""
    torch = torch_module() if "torch" in impls else None
    if torch is not None:
        torch.set_num_threads(n)
    rows = []
    with thread_limits(n) as limits:
        for spec in specs:
            label = f"{n}T {spec.name}"
            if bar:
                bar.update(label)
            make, reference = prepare(spec, tuple(impls) + (KV_READ,), seed)
            row = time_case(make, reference, n, samples, target, pause if n > 1 else 0.0,
                            tick=(lambda label=label: bar.update(label, 1)) if bar else None)
            rows.append({"case": spec.name, "spec": spec.to_json(), "threads": n, **row})
            del make, reference
            if n > 1:
                time.sleep(pause)
    return rows, limits.active


def _column_child(in_path, out_path):
    """Body of the process of :func:`_run_column_in_child`: reads its arguments from the JSON
    file ``in_path``, writes ``{"rows", "limits_active"}`` to ``out_path``."""
    with open(in_path, encoding="utf-8") as f:
        a = json.load(f)
    specs = [Spec.from_json(s) for s in a["specs"]]
    bar = Progress(len(specs) * a["samples"]) if a["progress"] else None
    rows, active = _run_column(specs, a["n"], a["impls"], a["samples"], a["target"],
                               a["pause"], a["seed"], bar)
    if bar:
        bar.close()
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"rows": rows, "limits_active": active}, f)


def _run_column_in_child(specs, n, impls, samples, target, pause, seed, progress):
    """:func:`_run_column` in a fresh Python process whose environment pins XLA's CPU pool to
    ``n`` threads; returns (rows, limits_active) or raises RuntimeError."""
    with tempfile.TemporaryDirectory(prefix="cyattn-bench-") as tmp:
        in_path, out_path = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.json")
        with open(in_path, "w", encoding="utf-8") as f:
            json.dump({"specs": [s.to_json() for s in specs], "n": n, "impls": list(impls),
                       "samples": samples, "target": target, "pause": pause, "seed": seed,
                       "progress": progress}, f)
        code = ("import sys; from cyattn._bench import runner; "
                "runner._column_child(sys.argv[1], sys.argv[2])")
        proc = subprocess.run([sys.executable, "-c", code, in_path, out_path],
                              env=child_env(extra={_peers.JAX_ENV: str(n)}))
        if proc.returncode != 0 or not os.path.exists(out_path):
            raise RuntimeError(f"the {n}-thread column's process exited with code "
                               f"{proc.returncode}")
        with open(out_path, encoding="utf-8") as f:
            res = json.load(f)
    return res["rows"], res["limits_active"]


def _choose_peers(use, notes):
    """The installed peers among those asked for (``use``: peer -> bool), with a note for each
    one asked for but not installed."""
    chosen = []
    for peer, wanted in use.items():
        if not wanted:
            continue
        if _peers.installed(peer):
            chosen.append(peer)
        else:
            pkg = {"torch": "torch", "ort": "onnxruntime and onnx", "jax": "jax"}[peer]
            notes.append(f"{PEER_NAMES[peer]} is not installed ({pkg}): no {peer} column.")
    return chosen


def run_full(specs, threads=(1, 2), samples=7, target=0.03, pause=0.2, use_torch=True,
             memory=True, notes=(), progress=True, seed=0, use_ort=True, use_jax=True):
    """Measure ``specs`` at each thread count; returns the result dict that
    :func:`render_markdown` and :func:`write_plot` take (and that is saved as JSON)."""
    import cyattn
    from .. import _backend
    t_start = time.perf_counter()
    notes = list(notes)
    peers = _choose_peers({"torch": use_torch, "ort": use_ort, "jax": use_jax}, notes)
    impls = ("cyattn", "numpy") + tuple(peers)
    if "jax" in peers:
        notes.append(f"JAX: each thread count's column ran in its own process with "
                     f"{_peers.JAX_ENV}=<threads> set before jax was imported (XLA sizes its "
                     f"CPU thread pool once, at import), all implementations of the column "
                     f"interleaved there.")
    memory = memory and bool(specs)
    if memory and not memory_supported():
        notes.append("Peak memory growth not measured (needs Linux /proc).")
        memory = False
    mem_threads = max(threads)
    n_mem = len(specs) * len(impls) if memory else 0
    bar = Progress(len(specs) * len(threads) * samples + n_mem + 2) if progress else None
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

    # the machine: FMA peak of the loaded kernel variant, best sgemm, streaming read bandwidth
    # at each thread count and on all cores
    label = "machine: FMA peak, sgemm, read bandwidth"
    if bar:
        bar.update(label)
    peak = measure_fma_peak(_backend.kernels)
    bw_bytes = Spec("decode", DECODE_SHAPE, "dense").kv_bytes
    bw_threads = sorted(set(threads) | {os.cpu_count() or 1})
    bandwidth = {str(n): measure_read_bandwidth(bw_bytes, n) for n in bw_threads}
    sgemm = {str(n): measure_sgemm(n, pause=pause) for n in threads}
    if bar:
        bar.update(label, 1)

    rows, limits_active = [], False
    for n in threads:
        if "jax" in impls:
            done = bar.done if bar else 0
            try:
                col, limits_active = _run_column_in_child(specs, n, impls, samples, target,
                                                          pause, seed, progress)
            except RuntimeError as exc:
                notes.append(f"{exc}: the column was re-run in this process without JAX.")
                col, limits_active = _run_column(specs, n, [i for i in impls if i != "jax"],
                                                 samples, target, pause, seed, None)
            if bar:
                bar.done = done
                bar.update(f"{n}T column done", len(specs) * samples)
        else:
            col, limits_active = _run_column(specs, n, impls, samples, target, pause, seed, bar)
        rows += col

    # the FMA peak and sgemm again (a busy machine only ever lowers them): the larger counts
    if bar:
        bar.update(label)
    peak_end = measure_fma_peak(_backend.kernels)
    for n in threads:
        again = measure_sgemm(n, pause=pause)
        sgemm[str(n)] = {k: max(v, again[k]) for k, v in sgemm[str(n)].items()}
    if bar:
        bar.update(label, 1)
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
                m = measure_memory(spec, impl, mem_threads)
                if "skipped" not in m:          # the tables show "-" for a missing impl
                    entry["impls"][impl] = m
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
    versions = _peers.versions(peers)
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu": _cpu_name(), "logical_cpus": os.cpu_count(),
        "python": platform.python_version(), "numpy": np.__version__,
        "torch": versions.get("torch"), "peer_versions": versions,
        "cyattn": cfg["version"], "variant": cfg["variant"],
        "available_variants": cfg["available_variants"], "cpu_features": cfg["cpu_features"],
        "openmp": cfg["openmp"], "impls": list(impls), "threads": list(threads),
        "samples": samples, "target": target, "pause": pause, "limits_active": limits_active,
        "fma_peak_gflops": peak, "bandwidth_gbs": bandwidth, "bandwidth_bytes": bw_bytes,
        "sgemm_gflops": sgemm, "memory_threads": mem_threads if memory else None,
        "notes": notes, "elapsed_s": elapsed,
    }
    return {"meta": meta, "rows": rows, "memory": mem}
