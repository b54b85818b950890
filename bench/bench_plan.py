"""Issue 41's 2-core proxy of the encoder's thread plan: interleaved 1 vs 2 threads, medians.

Cases (all-MiniLM-L6-v2, cyattn.encoder, batch 32):

- ``spread``: 3 batches of 32 texts of 256, 64 and 16 tokens (target: 2 threads >= 1.7x 1
  thread). Also run with the plan before issue 41 (``one-per-batch``: each batch on one
  thread, at most n_threads at once; emulated here with ``Encoder._forward``), interleaved.
- ``request``: one request of 32 short texts of 8-14 tokens (bench_minilm.short_texts(32);
  target: 2 threads >= 1.6x 1 thread).

Each round runs every (case, variant, threads) once, in turn; the table gives the median and
the best of the rounds and the 1-thread / 2-thread ratio of each. On a shared machine take the
medians of several runs. ``--plan`` also prints cyattn._plan's modelled plan of the cases;
``--serial`` the request's time outside the kernels (every kernel replaced by a no-op: the
Python and NumPy steps between them, which no thread count shortens; tokenizing included).

    python bench/bench_plan.py [--rounds 15] [--threads 1 2] [--plan] [--serial]
"""
import argparse
import concurrent.futures
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cyattn.encoder  # noqa: E402
from bench_minilm import short_texts  # noqa: E402
from cyattn import _plan  # noqa: E402

WORDS = ("printer", "invoice", "login", "refund", "update", "error", "account", "server",
         "network", "password", "order", "token")


def texts_of_tokens(enc, n_tokens, count, seed=0):
    """``count`` texts of exactly ``n_tokens`` tokens ([CLS] and [SEP] included)."""
    words = [w for w in WORDS if len(enc.tokenize([w])[0]) == 3]
    rng = np.random.default_rng(seed + n_tokens)
    texts = [" ".join(rng.choice(words, size=n_tokens - 2)) for _ in range(count)]
    assert {len(t) for t in enc.tokenize(texts)} == {n_tokens}
    return texts


def one_per_batch(enc, texts, n_threads, batch_size=32):
    """encode's plan before issue 41: min(n_threads, batches) batches at once, one thread each
    (longest first); one batch: all threads inside it."""
    ids = enc.tokenize(texts)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    batches = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    out = np.empty((len(texts), enc.dim), np.float32)
    if n_threads == 1 or len(batches) == 1:
        work = cyattn.encoder._bert._Workspace()
        for idx in batches:
            out[idx] = enc._forward([ids[i] for i in idx], n_threads, None, work)
        return out

    def run(idx):
        return enc._forward([ids[i] for i in idx], 1, None, cyattn.encoder._bert._Workspace())
    with concurrent.futures.ThreadPoolExecutor(min(n_threads, len(batches))) as pool:
        for idx, vec in zip(batches, pool.map(run, batches)):
            out[idx] = vec
    return out


def serial_time(enc, texts, reps=30):
    """(ms of encode(texts) at 1 thread, ms of it with every kernel a no-op), best of reps."""
    bert = cyattn.encoder._bert
    kernels, matmul = bert._backend.kernels, bert._matmul_packed

    class Hollow:
        def __getattr__(self, name):
            return getattr(kernels, name)

        def attention(self, *args, **kw):
            return False

        def gelu_rows(self, *args):
            pass

        def layer_norm_rows(self, *args):
            pass

    def best():
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            enc.encode(texts, n_threads=1)
            times.append(time.perf_counter() - t0)
        return min(times) * 1e3
    full = best()
    bert._backend.kernels, bert._matmul_packed = Hollow(), lambda a, p, out, n=None: out
    try:
        hollow = best()
    finally:
        bert._backend.kernels, bert._matmul_packed = kernels, matmul
    return full, hollow


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, nargs=2, default=[1, 2], metavar=("A", "B"))
    ap.add_argument("--plan", action="store_true", help="also print cyattn._plan's model")
    ap.add_argument("--serial", action="store_true",
                    help="also the request's time outside the kernels (1 thread)")
    args = ap.parse_args(argv)
    enc = cyattn.encoder.load()
    spread = (texts_of_tokens(enc, 256, 32) + texts_of_tokens(enc, 64, 32)
              + texts_of_tokens(enc, 16, 32))
    request = short_texts(32)
    runs = {("spread", "plan"): lambda n: enc.encode(spread, n_threads=n),
            ("spread", "one-per-batch"): lambda n: one_per_batch(enc, spread, n),
            ("request", "plan"): lambda n: enc.encode(request, n_threads=n)}
    reps = {"spread": 1, "request": 10}          # a request is ~50 ms: 10 calls per sample
    ref = {c: enc.encode(spread if c == "spread" else request, n_threads=1) for c in reps}
    for (case, variant), fn in runs.items():     # warm-up; the bits do not depend on threads
        for n in args.threads:
            assert np.array_equal(fn(n), ref[case]), (case, variant, n)
    times = {(k, n): [] for k in runs for n in args.threads}
    for _ in range(args.rounds):
        for key, fn in runs.items():
            for n in args.threads:
                r = reps[key[0]]
                t0 = time.perf_counter()
                for _ in range(r):
                    fn(n)
                times[key, n].append((time.perf_counter() - t0) / r)
    a, b = args.threads
    print(f"cyattn {cyattn.__version__} ({cyattn.config()['variant']}), {args.rounds} "
          f"interleaved rounds; ms: median (best)")
    print(f"{'case':<10} {'plan':<14} {f'{a} thread(s)':>16} {f'{b} threads':>16} "
          f"{'median ratio':>13} {'best ratio':>11}")
    for key in runs:
        ta, tb = times[key, a], times[key, b]
        print(f"{key[0]:<10} {key[1]:<14} "
              f"{statistics.median(ta) * 1e3:>8.1f} ({min(ta) * 1e3:>5.1f}) "
              f"{statistics.median(tb) * 1e3:>8.1f} ({min(tb) * 1e3:>5.1f}) "
              f"{statistics.median(ta) / statistics.median(tb):>12.2f}x "
              f"{min(ta) / min(tb):>10.2f}x")
    if args.serial:
        full, hollow = serial_time(enc, request)
        print(f"\nrequest at 1 thread: {full:.2f} ms, of which outside the kernels "
              f"{hollow:.2f} ms ({hollow / full:.1%}; best of 30)")
    if args.plan:
        print()
        print(_plan.report(args.threads, lambda n: [
            ("encode: 3 batches of 256/64/16", _plan.EncodePlan(_plan.SPREAD, n)),
            ("encode: request of 32 short texts", _plan.EncodePlan([_plan.REQUEST], n))]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
