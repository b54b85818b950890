"""Tiny matmul_accumulate calls (issue 46): cyattn against NumPy's ``out += a @ b`` at n = 16 and
32 (float32, one thread), for two builds interleaved (OLD, NEW alternately in fresh
subprocesses, ABBA order across rounds); within a child the two calls alternate too. Prints,
per build and n, the median time per call and the median (and range) over rounds of the
paired NumPy / cyattn time ratio (> 1: cyattn faster). Usage::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_tiny_matmul.py OLD/src NEW/src 4
"""
import sys, time, statistics, subprocess, json
# interleaved: base vs new, in subprocesses alternately, n=16,32, numpy in each
CHILD = r'''
import sys, time, statistics, numpy as np
sys.path.insert(0, sys.argv[1])
import cyattn
out = {}
for n in (16, 32):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32); b = rng.standard_normal((n, n), dtype=np.float32)
    o = np.zeros((n, n), np.float32); on = np.zeros((n, n), np.float32)
    f1 = lambda: cyattn.matmul_accumulate(a, b, o); f2 = lambda: on.__iadd__(a @ b)
    rc, rn = [], []
    for r in range(15):
        for f, acc in ((f1, rc), (f2, rn)) if r % 2 == 0 else ((f2, rn), (f1, rc)):
            f()
            t0 = time.perf_counter()
            for _ in range(3000): f()
            acc.append((time.perf_counter() - t0) / 3000)
    out[n] = (statistics.median(rc), statistics.median(rn), statistics.median([x / y for x, y in zip(rn, rc)]))
print(repr(out))
'''
res = {}
for r in range(int(sys.argv[3])):
    for name, site in ((("base", sys.argv[1]), ("new", sys.argv[2])) if r % 2 == 0 else (("new", sys.argv[2]), ("base", sys.argv[1]))):
        o = subprocess.run([sys.executable, "-c", CHILD, site], capture_output=True, text=True,
                           env={**__import__("os").environ, "OPENBLAS_NUM_THREADS": "1"})
        if o.returncode: print(o.stderr); raise SystemExit(1)
        res.setdefault(name, []).append(eval(o.stdout))
for n in (16, 32):
    for name in ("base", "new"):
        rows = [d[n] for d in res[name]]
        print(f"n={n} {name}: cyattn {statistics.median(x[0] for x in rows)*1e9:.0f} ns, numpy {statistics.median(x[1] for x in rows)*1e9:.0f} ns, numpy/cyattn (per-round paired median) {statistics.median(x[2] for x in rows):.3f} [{min(x[2] for x in rows):.3f}, {max(x[2] for x in rows):.3f}]")
