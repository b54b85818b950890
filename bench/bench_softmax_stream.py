"""Softmax rows past the caches (issue 46): cyattn against ONNX Runtime and the copy bandwidth.

Interleaved in one process, for rows of 512 and 2048 (16,384 rows each: 32 and 128 MiB in and
out), 1 and 2 threads: per round and thread count, each implementation in turn takes a pause
of 0.2 s (a peer's pool threads stop spinning), one untimed call, then ``--calls`` timed calls
(their median is the round's time); the table gives the median over the rounds of each time
and of the paired ratios. The outputs come from a pool of preallocated arrays, one per
implementation, dealt out afresh each round (round r gives implementation i array (i + r) mod
the pool's size), so that every implementation writes into every array equally often: on Zen 3
the same kernel ran 10 % slower into one of four arrays of the same shape and alignment than
into another (their pages' placement; the arrays are large enough for NumPy to ask for huge
pages), a bias a fixed array per implementation would carry into every ratio. The
implementations:

- ``cyattn``: ``cyattn.softmax(x, out=out)`` (threads through threadpoolctl), the host's rule
  for non-temporal stores (``softmax_stream_min_bytes()``);
- ``cyattn-ord``: the kernel entry with the rule switched off (ordinary stores, the pipelined
  rows of main), unless ``--no-ord``;
- ``cyattn-nt`` (``--nt``): the kernel entry with streaming forced (``stream_min`` 0: the
  non-temporal rows whatever the size and variant), to try the rule where it is off;
- ``ort``: ONNX Runtime's opset-23 Softmax through an IOBinding (``cyattn._bench.peers``);
- ``copy``: ``np.copyto(out, x)`` over the same bytes (one thread whatever the column).

GB/s counts the bytes read and written (2 x 4 x rows x n). Usage::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_softmax_stream.py
    python bench/bench_softmax_stream.py --rows-of 2048 --threads 1 --rounds 9 --log
"""
import argparse
import functools
import statistics
import sys
import time

import numpy as np


def _time(fn, calls):
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _call(name, x, out, nt, log, fn, kern, peers):
    """Implementation ``name``'s call on ``x`` into ``out`` (ONNX Runtime: a session bound to
    ``out``, made once)."""
    if name == "cyattn":
        return functools.partial(fn, x, out=out)
    if name in ("cyattn-ord", "cyattn-nt"):
        return functools.partial(kern.softmax_fast, x, out, log, nt, np.empty,
                                 1 << 62 if name == "cyattn-ord" else 0)
    if name == "ort":
        return peers.ort_softmax(x, None, nt, out=out)[0]
    return functools.partial(np.copyto, out, x)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--rows-of", type=int, action="append", help="row lengths (512, 2048)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--log", action="store_true", help="log_softmax instead of softmax")
    ap.add_argument("--no-ord", action="store_true", help="skip the ordinary-store kernel")
    ap.add_argument("--nt", action="store_true", help="add the kernel with streaming forced")
    ap.add_argument("--no-ort", action="store_true")
    args = ap.parse_args(argv)
    import cyattn
    from cyattn import _backend
    from cyattn._bench import peers
    from threadpoolctl import threadpool_limits
    kern = _backend.kernels
    fn = cyattn.log_softmax if args.log else cyattn.softmax
    lens = args.rows_of or [512, 2048]
    threads = [int(t) for t in args.threads.split(",")]
    print(f"cyattn {cyattn.__file__} variant {_backend.variant}; stream from "
          f"{kern.softmax_stream_min_bytes() / 2**20:.1f} MiB; rows {args.rows}; "
          f"{'log_softmax' if args.log else 'softmax'}; rounds {args.rounds} x {args.calls} calls")
    rng = np.random.default_rng(0)
    for n in lens:
        x = rng.standard_normal((args.rows, n), dtype=np.float32)
        gb = 2 * x.nbytes / 1e9
        for nt in threads:
            names = ["cyattn"] + ([] if args.no_ord else ["cyattn-ord"]) + (
                ["cyattn-nt"] if args.nt else []) + (
                ["ort"] if not args.no_ort and not args.log and peers.ort_module() is not None
                else []) + ["copy"]
            pool = [np.zeros_like(x) for _ in names]
            impls = {k: [_call(k, x, out, nt, args.log, fn, kern, peers) for out in pool]
                     for k in names}
            times = {k: [] for k in impls}
            with threadpool_limits(nt):
                for r in range(args.rounds):
                    order = list(impls) if r % 2 == 0 else list(impls)[::-1]
                    for k in order:
                        call = impls[k][(list(impls).index(k) + r) % len(pool)]
                        time.sleep(0.2)
                        call()
                        times[k].append(_time(call, args.calls))
                impls["cyattn"][0]()
                for k in ("cyattn-ord", "cyattn-nt"):
                    if k in impls:
                        impls[k][1]()
                        assert np.array_equal(pool[0], pool[1]), f"{k}: bits differ"
            del impls, pool
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"\nrows of {n} ({x.nbytes / 2**20:.0f} MiB in and out), {nt} thread(s)")
            for k, v in med.items():
                print(f"  {k:11s} {v * 1e3:8.2f} ms  {gb / v:6.2f} GB/s")
            for peer in ("ort", "cyattn-ord", "cyattn-nt", "copy"):
                if peer in times:
                    rat = [p / c for p, c in zip(times[peer], times["cyattn"])]
                    print(f"  {peer} / cyattn (time ratio, >1: cyattn faster): median "
                          f"{statistics.median(rat):.3f} [{min(rat):.3f}, {max(rat):.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
