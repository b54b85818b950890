"""Instructions per useful flop of cyattn's kernels, counted under QEMU: aarch64 against x86-64.

No aarch64 CPU is at hand to time the neon variant, so this counts what it executes instead. A
small QEMU plugin (tools/qemu_insn_count.c, built here with the host's gcc) counts the guest
instructions; the workload (this file, ``run``) marks the count before and after REPS calls of
each operation, so the figures are per call and leave out the interpreter's start-up and the
first call. The same plugin and the same workload run under qemu-aarch64 (baseline and neon)
and qemu-x86_64 -cpu max (baseline and avx2; QEMU 7.2 emulates AVX2 but not AVX-512), one
thread each.

Operations (float32): ``gemm`` matmul_accumulate 256 x 256 x 256 (2 M N K flops); ``attention``
scaled_dot_product_attention, 2 heads, L = S = 256, E = 64 (4 H L S E flops: Q K^T and P V);
``decode`` one query per head, 8 heads, S = 2048, E = 64 (4 H S E flops); ``softmax`` rows of
1024 (instructions per element: it has no flop count worth the name).

Printed per variant: instructions per call, per useful flop, and per flop times the vector
width in float32 lanes (AVX2 8, NEON 4, baseline: what the compiler made of SSE2 or NEON, 4),
which takes out the width: a 128-bit NEON FMA does half the work of a 256-bit one, so the
plain ratio neon/avx2 cannot go below 2 for the same code shape.

What it proves: how many instructions each build executes for the same work, which exposes
extra loads, spills, scalar tails and loop overhead. What it does not: speed. An instruction is
not a cycle; QEMU models no pipeline, cache or latency, and the counts include every
instruction alike (an FMA, a load and a branch count one each).

Usage (host):
  python tools/insn_per_flop.py [--x86] [--aarch64 QEMU ROOTFS PYTHON PATH] [--reps N]
      --x86: qemu-x86_64 -cpu max running this interpreter (cyattn importable, e.g.
          PYTHONPATH=src after setup.py build_ext --inplace);
      --aarch64: the arm64 root file system, its python and a PYTHONPATH holding the
          cross-built cyattn and NumPy (tools/qemu_aarch64_check.sh --insn-per-flop passes
          them).
  python tools/insn_per_flop.py run REPS OPS...   (the workload; runs under the emulator)
Exit status 0 when every count was taken, 1 otherwise.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

MARK = 0x6379617474          # CYATTN_INSN_MARK in qemu_insn_count.c
OPS = ("gemm", "attention", "decode", "softmax")
LANES = {"avx2": 8, "avx512": 16, "neon": 4, "baseline": 4}
GEMM_N = 256                  # M = N = K
ATTENTION = (2, 256, 64)      # heads, L = S, E
DECODE = (8, 2048, 64)        # heads, S, E (one query per head)
SOFTMAX = (256, 1024)         # rows, row length
# (useful flops, elements) per call
SIZES = {"gemm": (2 * GEMM_N ** 3, GEMM_N ** 2),
         "attention": (4 * ATTENTION[0] * ATTENTION[1] ** 2 * ATTENTION[2],
                       ATTENTION[0] * ATTENTION[1] ** 2),
         "decode": (4 * DECODE[0] * DECODE[1] * DECODE[2], DECODE[0] * DECODE[1]),
         "softmax": (None, SOFTMAX[0] * SOFTMAX[1])}


def work(op):
    """The call of one operation (shapes above; its flops and elements: SIZES)."""
    import numpy as np

    import cyattn

    rng = np.random.default_rng(0)
    f32 = np.float32
    if op == "gemm":
        m = n = k = GEMM_N
        a, b = rng.standard_normal((m, k), f32), rng.standard_normal((k, n), f32)
        out = np.zeros((m, n), f32)
        return lambda: cyattn.matmul_accumulate(a, b, out, n_threads=1)
    if op == "attention":
        h, seq, e = ATTENTION
        q, kk, v = (rng.standard_normal((1, h, seq, e), f32) for _ in range(3))
        return lambda: cyattn.scaled_dot_product_attention(q, kk, v, n_threads=1)
    if op == "decode":
        h, s, e = DECODE
        q = rng.standard_normal((1, h, 1, e), f32)
        kk, v = (rng.standard_normal((1, h, s, e), f32) for _ in range(2))
        return lambda: cyattn.scaled_dot_product_attention(q, kk, v, n_threads=1)
    if op == "softmax":
        x = rng.standard_normal(SOFTMAX, f32)
        out = np.empty_like(x)
        return lambda: cyattn.softmax(x, out=out)
    raise ValueError(f"op: got {op!r}, expected one of {OPS}")


def build_plugin(dest):
    """Compile tools/qemu_insn_count.c with the host's gcc into dest (a path)."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "qemu_insn_count.c")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", src, "-o", str(dest)], check=True,
                   timeout=120)


def mark():
    try:
        os.lseek(-1, MARK, 0)
    except OSError:
        pass


def run(reps, ops):
    import cyattn

    print(f"variant {cyattn.config()['variant']}", flush=True)
    for op in ops:
        call = work(op)
        call()                    # first call: lazy set-up, page faults of the buffers
        mark()
        for _ in range(reps):
            call()
        mark()


def count(cmd, env, reps, ops):
    """{op: instructions per call} from one emulated run of the workload."""
    proc = subprocess.run(cmd + [os.path.abspath(__file__), "run", str(reps), *ops], env=env,
                          capture_output=True, text=True, timeout=3600)
    marks = [int(m) for m in re.findall(r"^insn_mark: (\d+)$", proc.stderr, re.M)]
    got = re.search(r"^variant (\S+)$", proc.stdout, re.M)
    if proc.returncode != 0 or len(marks) != 2 * len(ops) or not got:
        raise RuntimeError(f"{' '.join(cmd)} (exit {proc.returncode}):\n{proc.stdout}"
                           f"\n{proc.stderr[-3000:]}")
    return got.group(1), {op: (marks[2 * i + 1] - marks[2 * i]) / reps
                          for i, op in enumerate(ops)}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        run(int(sys.argv[2]), sys.argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--x86", action="store_true")
    ap.add_argument("--aarch64", nargs=4, metavar=("QEMU", "ROOTFS", "PYTHON", "PATH"))
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if not (args.x86 or args.aarch64):
        ap.error("name --x86, --aarch64 or both")
    tmp = tempfile.mkdtemp()
    try:
        plugin = os.path.join(tmp, "libqemu_insn_count.so")
        build_plugin(plugin)
        runs = []      # (target, variant, command, environment)
        base = {k: v for k, v in os.environ.items() if k != "CYATTN_BACKEND"}
        base.update(OMP_NUM_THREADS="1", PYTHONNOUSERSITE="1")
        if args.x86:
            qemu = shutil.which("qemu-x86_64")
            if not qemu:
                ap.error("--x86: no qemu-x86_64 on PATH (Debian: qemu-user)")
            for v in ("baseline", "avx2"):
                runs.append(("x86-64", v, [qemu, "-cpu", "max", "-plugin", plugin,
                                           sys.executable], dict(base, CYATTN_BACKEND=v)))
        if args.aarch64:
            qemu, rootfs, python, path = args.aarch64
            for v in ("baseline", "neon"):
                runs.append(("aarch64", v, [qemu, "-cpu", "max", "-L", rootfs, "-plugin", plugin,
                                            python], dict(base, CYATTN_BACKEND=v,
                                                          PYTHONPATH=path)))
        results = {}
        for target, v, cmd, env in runs:
            got, per_call = count(cmd, env, args.reps, OPS)
            if got != v:
                raise RuntimeError(f"{target}: asked for variant {v}, the workload ran {got}")
            results[(target, v)] = per_call
        print(f"instructions executed per call (QEMU, one thread, mean of {args.reps} calls)")
        print(f"{'target':8} {'variant':9} {'op':10} {'insn/call':>12} {'insn/flop':>10} "
              f"{'x lanes':>8} {'insn/elem':>10}")
        for (target, v), per_call in results.items():
            for op in OPS:
                flops, elems = SIZES[op]
                n = per_call[op]
                ipf = f"{n / flops:10.4f}" if flops else f"{'':>10}"
                lanes = f"{n / flops * LANES[v]:8.3f}" if flops else f"{'':>8}"
                print(f"{target:8} {v:9} {op:10} {n:12.0f} {ipf} {lanes} {n / elems:10.2f}")
        pairs = [(("aarch64", "neon"), ("x86-64", "avx2")),
                 (("aarch64", "baseline"), ("x86-64", "baseline"))]
        for a, b in pairs:
            if a in results and b in results:
                print(f"\n{a[0]} {a[1]} / {b[0]} {b[1]}: instruction ratio "
                      f"(and per lane: times {LANES[a[1]]}/{LANES[b[1]]})")
                for op in OPS:
                    r = results[a][op] / results[b][op]
                    print(f"  {op:10} {r:6.2f}  (per lane {r * LANES[a[1]] / LANES[b[1]]:5.2f})")
        return 0
    except (RuntimeError, subprocess.SubprocessError) as exc:
        print(f"insn_per_flop: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
