"""The Markdown report of a full-harness result (latest.md): the header with the machine and
the peers' versions, the targets table, one table per case group, each case's fraction of the
machine limit, peak memory; and the number formats it uses."""
import math
import statistics

from .cases import _MIB, KV_READ, PEERS, Spec
from .timing import WARM_AFTER_PAUSE, paired_ratio, summary


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

    def pct_sgemm(self, impl):
        """Percent of the best sgemm rate at this thread count (NumPy's BLAS or cyattn's
        matmul_accumulate, whichever was faster)."""
        g = self.gflops(impl)
        best = _best_sgemm(self.meta, self.threads)
        return 100.0 * g / best if g is not None and best else None

    def bytes_moved(self):
        """Softmax: bytes of x and the mask read plus the result written, once each."""
        if self.spec.group != "softmax":
            return None
        n = self.spec.elements
        return n * 4 * 2 + (n if self.spec.kind == "mask" else 0)

    def pct_read_bandwidth(self, impl):
        """Softmax: bytes moved / time as a percent of the streaming read bandwidth at this
        thread count (rows of a few MiB stay partly in cache, so this can pass 100 %)."""
        m, nbytes = self.median(impl), self.bytes_moved()
        bw = self.meta.get("bandwidth_gbs", {}).get(str(self.threads))
        return 100.0 * nbytes / m / 1e9 / bw if m and nbytes and bw else None

    def time_cell(self, impl):
        if impl in self.row.get("differs", ()):
            return "wrong result"
        if impl in self.row.get("errors", {}):
            return "error"
        if not self.has(impl):
            return "-"
        med, lo, hi = summary(self.times[impl])
        return fmt_time(med, lo, hi)

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


def _best_sgemm(meta, threads):
    rates = (meta.get("sgemm_gflops") or {}).get(str(threads))
    return max(rates.values()) if rates else None


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
    peers = [i for i in impls if i in PEERS]
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

    for peer in peers:
        add(f"SDPA T ≥ 512 vs {peer}", is_sdpa("dense", 512), vs(peer, gf, " GFLOP/s"),
            geomean_of=lambda r, peer=peer: r.ratio(peer))
        add(f"SDPA (8,8,128) vs {peer}", lambda s: s.group == "sdpa" and s.kind == "dense"
            and s.shape[:3] == (8, 8, 128), vs(peer, gf, " GFLOP/s"))
        add(f"SDPA causal T = 512..2048 vs {peer} causal", is_sdpa("causal", 512, 2048),
            vs(peer, gf, " GFLOP/s"), geomean_of=lambda r, peer=peer: r.ratio(peer))
        add(f"decode vs {peer}", lambda s: s.group == "decode", vs(peer, tm))

    def sgemm_cell(r):
        pct, best = r.pct_sgemm("cyattn"), _best_sgemm(meta, r.threads)
        if pct is None:
            return "-"
        return f"**{pct:.0f} %** (cyattn {_sig(r.gflops('cyattn'))} of {_sig(best)} GFLOP/s)"
    if meta.get("sgemm_gflops"):
        add("SDPA T ≥ 512: % of the best sgemm rate", is_sdpa("dense", 512), sgemm_cell)

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
        others = [f"{p} {_sig(r.median(p) * 1e6)} µs: **{r.ratio(p):.2f}×**" for p in peers
                  if r.has(p)]
        return txt + (f" ({'; '.join(others)})" if others else "")
    add("tiny: µs per call" + (", vs " + ", ".join(peers) if peers else ""),
        lambda s: s.group == "tiny", tiny_cell)
    for peer in peers:
        add(f"softmax ns/element vs {peer}", lambda s: s.group == "softmax",
            vs(peer, ns, " ns/el"))
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


_TITLES = {"numpy": "NumPy", "torch": "PyTorch", "ort": "ONNX Runtime (ort)", "jax": "JAX"}


def _versions(meta):
    """``, torch 2.x, onnxruntime 1.x, ...`` from the result's peer versions."""
    vers = dict(meta.get("peer_versions") or {})
    if not vers and meta.get("torch"):
        vers["torch"] = meta["torch"]
    return "".join(f", {pkg} {v}" for pkg, v in vers.items())


def _sgemm_lines(meta):
    sg = meta.get("sgemm_gflops") or {}
    if not sg:
        return []
    cells = [f"{n} thread{'s' if n != '1' else ''}: **{_sig(max(r.values()))} GFLOP/s** ("
             + ", ".join(f"{k} {_sig(v)}" for k, v in r.items()) + ")" for n, r in sg.items()]
    return ["- Best sgemm (1024³ float32, the larger of NumPy's `np.matmul(a, b, out=c)` and "
            "`cyattn.matmul_accumulate`, best of 5 calls at the start and 5 at the end): "
            + "; ".join(cells)]


def _limit_rows(rows, meta):
    """Rows of the "fraction of the machine limit" table (cyattn's rate against each limit)."""
    peak = meta.get("fma_peak_gflops")
    body = []
    for r in rows:
        if not r.has("cyattn"):
            continue
        g = r.spec.group
        if g == "softmax":
            m = r.median("cyattn")
            rate = f"{_sig(r.bytes_moved() / m / 1e9)} GB/s"
            pct = r.pct_read_bandwidth("cyattn")
            cells = ["-", "-", "-" if pct is None else f"{pct:.0f} %"]
        elif g == "decode":
            pct = r.pct_bandwidth("cyattn")
            rate = f"{_sig(r.kv_gbs('cyattn'))} GB/s"
            cells = ["-", "-", "-" if pct is None else f"{pct:.0f} %"]
        else:
            rate = f"{_sig(r.gflops('cyattn'))} GFLOP/s"
            pp, ps = r.pct_peak("cyattn"), r.pct_sgemm("cyattn")
            cells = ["-" if pp is None else f"{pp:.0f} %", "-" if ps is None else f"{ps:.0f} %",
                     "-"]
        if not peak:
            cells[0] = "-"
        body.append([r.spec.name, r.threads, rate] + cells)
    return body


def _behind(rows, impls):
    """(case, threads, peer, ratio) wherever a peer was faster than cyattn."""
    out = []
    for r in rows:
        for peer in impls[1:]:
            ratio = r.ratio(peer)
            if ratio is not None and ratio < 1.0:
                out.append([r.spec.name, r.threads, peer, f"{ratio:.2f}×"])
    return out


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
        "# cyattn benchmark: cyattn vs " + " vs ".join(_TITLES.get(i, i) for i in impls[1:]), "",
        f"- {meta['date']}, {meta['cpu']}, {meta['logical_cpus']} logical CPUs, "
        f"Python {meta['python']}"
        + (f"; command: `{meta['command']}`" if meta.get("command") else ""),
        f"- cyattn {meta['cyattn']} variant `{meta['variant']}` (available: "
        f"{', '.join(meta['available_variants'])}; OpenMP {'on' if meta['openmp'] else 'off'}),"
        f" numpy {meta['numpy']}" + _versions(meta),
        "- FMA peak: " + (f"**{_sig(peak)} GFLOP/s per core** (float32, `fma_probe` of the "
                          f"`{meta['variant']}` kernels, one thread, best of 5 runs at the "
                          f"start and 5 at the end of the timings)"
                          if peak else "not measured (this build's kernels have no "
                                       "`fma_probe`): no % of peak"),
        "- Streaming read bandwidth (NumPy `max` over "
        f"{meta['bandwidth_bytes'] / _MIB:.0f} MiB, the size of the decode case's K+V, best "
        "of 7): " + ", ".join(f"**{_sig(v)} GB/s** with {n} thread{'s' if n != '1' else ''}"
                             for n, v in bw.items()),
    ] + _sgemm_lines(meta) + [
        f"- float32. Each time: median of {meta['samples']} sample"
        f"{'s' if meta['samples'] != 1 else ''} (min–max) of at least "
        f"{meta['target'] * 1e3:.0f} ms each (one call if longer), the implementations' samples "
        + (f"interleaved in one process (with more than one thread, a {meta['pause']:g} s pause "
           f"and {WARM_AFTER_PAUSE:g} s of untimed calls before each sample), "
           if meta.get("pause") else "interleaved in one process, ")
        + f"thread count{plural} {', '.join(map(str, meta['threads']))}"
        f" (cyattn `n_threads`; softmax: the OpenMP limit; torch.set_num_threads; ONNX Runtime: "
        f"intra_op_num_threads, inter_op 1, sequential; JAX: XLA's pool via NPROC; NumPy's BLAS "
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

    limit_rows = _limit_rows(rows, meta)
    if limit_rows:
        lines += ["## Fraction of the machine limit (cyattn)", "",
                  "Compute-bound cases (matmul, attention): GFLOP/s against the FMA peak × "
                  "threads and against the best sgemm rate at that thread count. Decode: "
                  "against reading K+V once (the paired NumPy read). Softmax: bytes moved (x "
                  "and the mask read, the result written) / time against the streaming read "
                  "bandwidth at that thread count (x is 0.5-8 MiB and stays partly in cache, "
                  "so this can pass 100 %).", ""]
        lines += _table(["case", "threads", "cyattn rate", "% of FMA peak × threads",
                         "% of best sgemm", "% of read bandwidth"], limit_rows)
        lines.append("")
    behind = _behind(rows, impls)
    lines += ["## Cases where an implementation was faster than cyattn", ""]
    lines += (_table(["case", "threads", "implementation", "ratio (its time / cyattn's)"],
                     behind) if behind else ["None."])
    lines.append("")

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
                        + [_fmt_mib(e["impls"][i]) if i in e["impls"] else "-" for i in impls]
                        + [rel])
        lines += _table(head, body)
        errs = [f"- {e['case']}, {i}: {m['error']}" for e in mem for i, m in e["impls"].items()
                if "error" in m]
        lines += [""] + (errs + [""] if errs else [])

    lines.append(f"Total run time {meta['elapsed_s']:.0f} s.")
    return "\n".join(lines) + "\n"
