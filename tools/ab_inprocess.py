"""In-process A/B of builds of one kernel variant: each build's ``_kernels_<variant>`` module
loaded side by side and swapped in as cyattn's kernels, round by round.

``tools/ab_builds.py`` runs each build in a fresh subprocess; on a host whose memory is shared
with other machines its rounds move by more than the few per cent a kernel change is worth
(ratios of 0.5-2 between two identical builds). Here every build runs in the same process, in
turns (the order reversed every other round), on the same inputs, and for softmax into output
arrays rotated between the builds every round (a kernel can run 10 % slower into one array of
several of the same shape: bench/bench_softmax_stream.py). A round's time of a build is the
minimum of ``--samples`` timings of enough calls for about 50 ms; the ratio of a build is the
FIRST build's time / its time (> 1: faster than the first), printed as the median over the
rounds and its range. SDPA and matmul results must have the same bits in every build (one
call each after the timing, checked).

``--windows`` prints, for each build, where the loops with 12 or more FMAs of the float32
GEMM micro-kernel (``micro_kernel_f32`` and its clones) start within a 64-byte line and how
many 64-byte fetch windows they span (``objdump`` from binutils), the layout that cost SDPA
1-8 % on Zen 3 when it moved (bench/results/x86_peers.md, sixth and seventh sessions).

Usage (from a checkout built in place; the builds' module files copied anywhere)::

    PYTHONPATH=src python tools/ab_inprocess.py main.so new.so --case sdpa:8,8,128,64 --threads 1
    PYTHONPATH=src python tools/ab_inprocess.py main.so new.so --case matmul:1024 --rounds 12
    OMP_NUM_THREADS=1 PYTHONPATH=src python tools/ab_inprocess.py a.so b.so --case softmax:128,512
    python tools/ab_inprocess.py main.so new.so --windows

The variant is read from the first build's file name (``_kernels_avx2...so``: avx2) unless
``--variant`` names it; every build must be that variant, built for this Python.
"""
import argparse
import importlib.machinery
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import time


def load_build(path, variant, index):
    """The module in ``path`` under a name of its own (its init is PyInit__kernels_<variant>)."""
    name = f"cyattn_ab{index}._kernels_{variant}"
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    try:
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except ImportError as exc:
        raise SystemExit(f"{path}: not loadable as _kernels_{variant} ({exc}); every build must "
                         f"be that variant, built for this Python") from None
    if getattr(module, "VARIANT", None) != variant:
        raise SystemExit(f"{path}: variant {getattr(module, 'VARIANT', None)!r}, not {variant!r}")
    return module


def parse_case(text):
    kind, _, dims = text.partition(":")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        shape = ()
    want = {"sdpa": 4, "matmul": 1, "softmax": 2}
    if kind not in want or len(shape) != want[kind] or min(shape) < 1:
        raise argparse.ArgumentTypeError(
            f"got {text!r}, expected sdpa:B,H,L,E, matmul:N or softmax:ROWS,N")
    return kind, shape


def make_call(kind, shape, n_outs, n_threads):
    import numpy as np
    import cyattn
    rng = np.random.default_rng(0)
    if kind == "sdpa":
        q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
        outs = [np.empty_like(q) for _ in range(n_outs)]
        return outs, lambda out: cyattn.scaled_dot_product_attention(q, k, v, out=out,
                                                                     n_threads=n_threads)
    if kind == "matmul":
        n = shape[0]
        a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        outs = [np.zeros((n, n), np.float32) for _ in range(n_outs)]
        # timed with alpha 0: the product runs in full and out stays zeros; checked with 1
        return outs, lambda out, alpha=0.0: cyattn.matmul_accumulate(a, b, out, alpha=alpha,
                                                                     n_threads=n_threads)
    x = rng.standard_normal(shape, dtype=np.float32) * 4
    outs = [np.empty_like(x) for _ in range(n_outs)]
    return outs, lambda out: cyattn.softmax(x, out=out)       # threads: OMP_NUM_THREADS


def windows(paths):
    for path in paths:
        dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True,
                              text=True, check=True).stdout
        func, insns = None, {}
        for line in dump.splitlines():
            m = re.match(r"^([0-9a-f]+) <(.*)>:$", line)
            if m:
                func = m.group(2) if "micro_kernel_f32" in m.group(2) else None
                if func:
                    insns[func] = []
                continue
            m = re.match(r"^\s+([0-9a-f]+):\s+(\S+)\s*(.*)$", line)
            if m and func:
                insns[func].append((int(m.group(1), 16), m.group(2), m.group(3)))
        print(path)
        for func, body in insns.items():
            addrs = [a for a, _, _ in body]
            for k, (a, op, arg) in enumerate(body):
                t = re.match(r"([0-9a-f]+) <", arg)
                if not (op.startswith("j") and op != "jmp" and t):
                    continue
                start = int(t.group(1), 16)
                loop = [x for x in body if start <= x[0] <= a]
                fmas = sum("fmadd" in x[1] for x in loop)
                end = body[k + 1][0] if k + 1 < len(body) else a + 2
                if start < a and start in addrs and 12 <= fmas <= 16 and end - start < 256:
                    n_win = (start % 64 + end - start - 1) // 64 + 1
                    print(f"  {func.split('_kernels_')[-1]:40s} loop at byte {start % 64:2d} of a "
                          f"line, {end - start} bytes, {fmas} FMAs: {n_win} fetch windows")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("builds", nargs="+", help="the builds' _kernels_<variant> module files")
    ap.add_argument("--case", type=parse_case, default=("sdpa", (8, 8, 128, 64)))
    ap.add_argument("--threads", type=int, default=1, help="n_threads (sdpa, matmul)")
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--variant", help="default: from the first build's file name")
    ap.add_argument("--windows", action="store_true", help="print the k loops' fetch windows")
    args = ap.parse_args(argv)
    for path in args.builds:
        if not os.path.isfile(path):
            ap.error(f"build {path!r} is not a file")
    if args.windows:
        windows(args.builds)
        return 0
    if len(args.builds) < 2 or args.rounds < 1 or args.samples < 1 or args.threads < 1:
        ap.error("need two builds or more, and --rounds, --samples, --threads >= 1")
    variant = args.variant or re.sub(r"\..*", "", os.path.basename(args.builds[0]))[9:]
    import numpy as np
    from cyattn import _backend
    mods = [load_build(p, variant, i) for i, p in enumerate(args.builds)]
    kind, shape = args.case
    outs, call = make_call(kind, shape, len(mods), args.threads)
    rot = [0]

    def run(i, n):
        _backend.kernels = mods[i]
        out = outs[(i + rot[0]) % len(outs)] if kind == "softmax" else outs[i]
        t0 = time.perf_counter()
        for _ in range(n):
            call(out)
        return (time.perf_counter() - t0) / n

    for i in range(len(mods)):
        run(i, 2)
    n = max(2, int(0.05 / run(0, 2)))
    ratios = [[] for _ in mods]
    for r in range(args.rounds):
        rot[0] = r
        order = range(len(mods)) if r % 2 == 0 else reversed(range(len(mods)))
        t = {i: min(run(i, n) for _ in range(args.samples)) for i in order}
        for i in range(len(mods)):
            ratios[i].append(t[0] / t[i])
    if kind != "softmax":                   # each build once more, into zeros, alpha 1
        results = []
        for i in range(len(mods)):
            _backend.kernels = mods[i]
            out = np.zeros_like(outs[0])
            call(out, alpha=1.0) if kind == "matmul" else call(out)
            results.append(out)
            if not np.array_equal(results[0], out):
                raise SystemExit(f"{args.builds[i]}: its results' bits differ from the first's")
    print(f"{kind} {shape}, {args.threads} thread(s), {args.rounds} rounds; ratio = time of "
          f"{args.builds[0]} / time of the build (> 1: faster)")
    for i in range(1, len(mods)):
        r = ratios[i]
        print(f"  {args.builds[i]}: median {statistics.median(r):.3f} "
              f"({min(r):.3f}-{max(r):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
