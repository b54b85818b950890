"""Tiny matmul_accumulate calls (issue 46): cyattn against NumPy's ``out += a @ b`` at n = 16 and
32 (float32, one thread), for two builds interleaved (OLD, NEW alternately in fresh
subprocesses, ABBA order across rounds); within a child the two calls alternate too. Prints,
per build and n, the median time per call and the median (and range) over rounds of the
paired NumPy / cyattn time ratio (> 1: cyattn faster). Usage::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_tiny_matmul.py OLD/src NEW/src 4
"""
import ast
import os
import statistics
import subprocess
import sys

# The child: imports cyattn from the build given, times both calls, prints {n: (cyattn s,
# numpy s, median of numpy / cyattn over its rounds)}.
CHILD = r'''
import sys, time, statistics, numpy as np
sys.path.insert(0, sys.argv[1])
import cyattn
out = {}
for n in (16, 32):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    o, on = np.zeros((n, n), np.float32), np.zeros((n, n), np.float32)
    calls = [lambda: cyattn.matmul_accumulate(a, b, o), lambda: on.__iadd__(a @ b)]
    times = [[], []]
    for r in range(15):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            calls[i]()
            t0 = time.perf_counter()
            for _ in range(3000):
                calls[i]()
            times[i].append((time.perf_counter() - t0) / 3000)
    out[n] = (statistics.median(times[0]), statistics.median(times[1]),
              statistics.median([y / x for x, y in zip(*times)]))
print(repr(out))
'''


def main(argv):
    old, new, rounds = argv[0], argv[1], int(argv[2]) if len(argv) > 2 else 4
    res = {"base": [], "new": []}
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    for r in range(rounds):
        order = [("base", old), ("new", new)]
        if r % 2:
            order.reverse()
        for name, site in order:
            o = subprocess.run([sys.executable, "-c", CHILD, site], capture_output=True,
                               text=True, env=env)
            if o.returncode:
                print(o.stderr)
                return 1
            res[name].append(ast.literal_eval(o.stdout))
    for n in (16, 32):
        for name in ("base", "new"):
            rows = [d[n] for d in res[name]]
            rat = [x[2] for x in rows]
            print(f"n={n} {name}: cyattn {statistics.median(x[0] for x in rows) * 1e9:.0f} ns, "
                  f"numpy {statistics.median(x[1] for x in rows) * 1e9:.0f} ns, numpy/cyattn "
                  f"(per-round paired median) {statistics.median(rat):.3f} "
                  f"[{min(rat):.3f}, {max(rat):.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
