#!/usr/bin/env python
"""Side-by-side benchmark: cyattn vs a NumPy reference vs PyTorch (when installed).

Runs every case at each requested thread count, interleaving the implementations' samples in
one process (cyattn, numpy, torch, cyattn, numpy, torch, ...), and writes a Markdown table to
bench/results/latest.md (also printed). See bench/README.md for how to read it.

    python bench/run.py                       # all cases, 1 and 2 threads (~2-3 minutes)
    python bench/run.py --quick               # fewer cases and samples (~30 s)
    python bench/run.py --threads 1 --cases sdpa

The installed cyattn is used; if none is importable, the in-place build in ../src is.
"""
import argparse
import datetime
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

try:
    import cyattn
except ImportError:  # not installed: use the in-place build of this checkout
    sys.path.insert(0, str(HERE.parent / "src"))
    import cyattn
from cyattn import _bench as B

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

CASE_GROUPS = ("softmax", "matmul", "sdpa")
SOFTMAX_L = (128, 512, 2048)
MATMUL_N = (16, 64, 256, 512, 1024)
SDPA_BHT = ((1, 1, 128), (8, 8, 128), (1, 8, 512), (1, 8, 1024))
HEAD_DIM = 64
QUICK = {"softmax": (512,), "matmul": (64, 256, 1024), "sdpa": ((8, 8, 128), (1, 8, 512))}

# samples per implementation, seconds per sample, pause between samples with > 1 thread
SETTINGS = {"full": (7, 0.03, 0.2), "quick": (5, 0.01, 0.2)}


class Case:
    """``impls(n_threads)`` -> dict name -> callable; ``results()`` -> dict name -> array."""

    def __init__(self, group, name, impls, results, flops=None, elements=None):
        self.group, self.name = group, name
        self.impls, self.results = impls, results
        self.flops, self.elements = flops, elements

    def rate(self, seconds):
        if self.flops:
            return self.flops / seconds / 1e9
        return seconds / self.elements * 1e9

    @property
    def unit(self):
        return "GFLOP/s" if self.flops else "ns/el"


def _t(x):
    return torch.from_numpy(x) if torch is not None else None


def softmax_case(L, masked, rng):
    x = rng.standard_normal((8, 128, L)).astype(np.float32)
    mask = rng.random(x.shape) < 0.8 if masked else None
    if masked:
        mask[..., 0] = True                          # no fully masked rows (numpy would NaN)
    xt, mt = _t(x), _t(mask) if masked else None

    def impls(n_threads):
        d = {"cyattn": lambda: cyattn.softmax(x, mask=mask)}
        if masked:
            d["numpy"] = lambda: B.np_masked_softmax(x, mask)
            if torch is not None:
                d["torch"] = lambda: torch.softmax(xt.masked_fill(~mt, -math.inf), -1)
        else:
            d["numpy"] = lambda: B.np_softmax(x)
            if torch is not None:
                d["torch"] = lambda: torch.softmax(xt, -1)
        return d

    def results():
        return {k: np.asarray(f()) for k, f in impls(None).items()}
    name = f"softmax (8,128,{L})" + (" bool mask" if masked else "")
    return Case("softmax", name, impls, results, elements=x.size)


def matmul_case(n, rng):
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    outs = {k: np.zeros((n, n), np.float32) for k in ("cyattn", "numpy", "torch")}
    at, bt, ot = _t(a), _t(b), _t(outs["torch"])

    def impls(n_threads):
        oc, on = outs["cyattn"], outs["numpy"]
        d = {"cyattn": lambda: cyattn.matmul_accumulate(a, b, oc, n_threads=n_threads),
             "numpy": lambda: on.__iadd__(a @ b)}
        if torch is not None:
            d["torch"] = lambda: ot.add_(torch.matmul(at, bt))
        return d

    def results():
        r = {"cyattn": cyattn.matmul_accumulate(a, b, np.zeros((n, n), np.float32)),
             "numpy": a @ b}
        if torch is not None:
            r["torch"] = torch.matmul(at, bt).numpy()
        return r
    return Case("matmul", f"matmul_accumulate n={n}", impls, results, flops=2.0 * n ** 3)


def sdpa_case(Bn, H, T, causal, rng):
    q, k, v = (rng.standard_normal((Bn, H, T, HEAD_DIM)).astype(np.float32) for _ in range(3))
    scale = 1.0 / math.sqrt(HEAD_DIM)
    add = np.triu(np.full((T, T), -np.inf, np.float32), 1) if causal else None
    qt, kt, vt = _t(q), _t(k), _t(v)

    def impls(n_threads):
        d = {"cyattn": lambda: cyattn.scaled_dot_product_attention(
                 q, k, v, is_causal=causal, n_threads=n_threads),
             "numpy": lambda: B.np_attention(q, k, v, scale, add)}
        if torch is not None:
            d["torch"] = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        return d

    def results():
        return {name: np.asarray(f()) for name, f in impls(None).items()}
    pairs = T * (T + 1) // 2 if causal else T * T          # (query, key) pairs computed
    name = f"sdpa ({Bn},{H},{T},{HEAD_DIM})" + (" causal" if causal else "")
    return Case("sdpa", name, impls, results, flops=4.0 * Bn * H * pairs * HEAD_DIM)


def build_cases(groups, quick, seed=0):
    rng = np.random.default_rng(seed)
    cases = []
    if "softmax" in groups:
        for L in (QUICK["softmax"] if quick else SOFTMAX_L):
            cases += [softmax_case(L, False, rng), softmax_case(L, True, rng)]
    if "matmul" in groups:
        cases += [matmul_case(n, rng) for n in (QUICK["matmul"] if quick else MATMUL_N)]
    if "sdpa" in groups:
        for bht in (QUICK["sdpa"] if quick else SDPA_BHT):
            cases += [sdpa_case(*bht, False, rng), sdpa_case(*bht, True, rng)]
    return cases


def set_torch_threads(n):
    if torch is not None:
        torch.set_num_threads(n)


def check_results(case):
    """Names of implementations whose result differs from cyattn's (float32 tolerances)."""
    res = case.results()
    ref = res["cyattn"]
    return [name for name, r in res.items()
            if name != "cyattn" and not np.allclose(r, ref, rtol=2e-3, atol=2e-4)]


def run(cases, thread_counts, quick):
    samples, target, pause = SETTINGS["quick" if quick else "full"]
    bar = B.Progress(len(cases) * len(thread_counts) * samples)
    rows = []
    limits_active = False
    for n in thread_counts:
        set_torch_threads(n)
        with B.thread_limits(n) as limits:
            limits_active = limits.active
            for case in cases:
                label = f"{n}T {case.name}"
                bar.update(label)
                bad = check_results(case)
                times = B.interleaved(case.impls(n), samples=samples, target=target,
                                      pause=pause if n > 1 else 0.0,
                                      tick=lambda label=label: bar.update(label, 1))
                rows.append((n, case, times, bad))
                if n > 1:
                    time.sleep(pause)
    bar.close()
    return rows, samples, limits_active


_SHORT = {"numpy": "np", "torch": "torch"}


def _fmt_ms(seconds):
    ms = seconds * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def markdown(rows, samples, limits_active, notes, elapsed):
    impls = ["cyattn", "numpy"] + (["torch"] if torch is not None else [])
    cfg = cyattn.config()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    lines = ["# cyattn benchmark: cyattn vs NumPy" + (" vs PyTorch" if torch is not None else ""),
             "",
             f"- {datetime.datetime.now().isoformat(timespec='seconds')}, {cpu}, "
             f"{os.cpu_count()} logical CPUs, Python {platform.python_version()}",
             f"- cyattn {cfg['version']} variant `{cfg['variant']}` (available: "
             f"{', '.join(cfg['available_variants'])}; OpenMP {'on' if cfg['openmp'] else 'off'}),"
             f" numpy {np.__version__}"
             + (f", torch {torch.__version__}" if torch is not None else ", torch not installed"),
             f"- float32. Each cell: median time of {samples} samples (min-max), samples of the "
             f"implementations interleaved in one process. Threads: cyattn `n_threads` "
             f"(softmax: the OpenMP limit), torch.set_num_threads, numpy's BLAS via "
             + ("threadpoolctl." if limits_active else "nothing (threadpoolctl not installed: "
                                                       "numpy's BLAS used its default)."),
             "- `np/cy` and `torch/cy`: median over rounds of (other time / cyattn time); "
             "**> 1 means cyattn is faster**. Rates: GFLOP/s (sdpa causal counts only the "
             "computed half) or ns per element (softmax), from the medians.",
             ] + [f"- {note}" for note in notes] + [""]
    head = ["threads", "case"] + [f"{i} ms" for i in impls] + \
        [f"{_SHORT[i]}/cy" for i in impls[1:]] + ["rate " + " / ".join(impls)]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join("---:" if i > 1 else "---" for i in range(len(head))) + "|")
    for n, case, times, bad in rows:
        cells = [str(n), case.name]
        for impl in impls:
            if impl not in times:
                cells.append("-")
                continue
            med, lo, hi = B.summary(times[impl])
            flag = " (differs!)" if impl in bad else ""
            cells.append(f"{_fmt_ms(med)} ({_fmt_ms(lo)}-{_fmt_ms(hi)}){flag}")
        for impl in impls[1:]:
            cells.append(f"{B.paired_ratio(times[impl], times['cyattn']):.2f}"
                         if impl in times else "-")
        rates = [f"{case.rate(B.summary(times[i])[0]):.1f}" if i in times else "-"
                 for i in impls]
        cells.append(" / ".join(rates) + " " + case.unit)
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Total run time {elapsed:.0f} s."]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer cases and samples")
    p.add_argument("--threads", default="1,2",
                   help="comma-separated thread counts (default 1,2)")
    p.add_argument("--cases", default=",".join(CASE_GROUPS),
                   help="comma-separated groups among softmax,matmul,sdpa (default all)")
    p.add_argument("--output", default=str(HERE / "results" / "latest.md"),
                   help="Markdown file to write (default bench/results/latest.md)")
    args = p.parse_args(argv)
    try:
        args.threads = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        p.error(f"--threads: expected comma-separated integers, got {args.threads!r}")
    if not args.threads or min(args.threads) < 1:
        p.error("--threads: expected positive thread counts")
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(args.cases) - set(CASE_GROUPS))
    if unknown or not args.cases:
        p.error(f"--cases: unknown group(s) {unknown}; choose among {', '.join(CASE_GROUPS)}")
    return args


def main(argv=None):
    args = parse_args(argv)
    rc = B.rerun_without_blas_overrides([str(Path(__file__).resolve())] +
                                        (sys.argv[1:] if argv is None else list(argv)))
    if rc is not None:
        return rc
    notes = []
    if os.environ.get("CYATTN_BENCH_CLEAN_ENV"):
        notes.append("Re-run in a child process without OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE "
                     "(they were set in the parent's environment and slow numpy's OpenBLAS).")
    if torch is None:
        notes.append("PyTorch is not installed: no torch column.")
    if max(args.threads) > (os.cpu_count() or 1):
        notes.append(f"More threads requested ({max(args.threads)}) than logical CPUs "
                     f"({os.cpu_count()}): expect oversubscription.")
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    t0 = time.perf_counter()
    cases = build_cases(args.cases, args.quick)
    rows, samples, limits_active = run(cases, args.threads, args.quick)
    elapsed = time.perf_counter() - t0
    if load0 is not None:
        load1 = os.getloadavg()[0]
        busy = load0 > 0.5 or load1 > max(args.threads) + 0.5   # our own run adds ~threads
        notes.append(f"Load average (1 min) {load0:.2f} at the start, {load1:.2f} at the end"
                     + ("; other processes were running, so timings (especially with 2 "
                        "threads) are less reliable." if busy else "."))
    text = markdown(rows, samples, limits_active, notes, elapsed)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print(f"(written to {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
