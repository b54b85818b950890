"""Softmax rows past the caches (issue 46): cyattn against ONNX Runtime and the copy bandwidth.

Interleaved in one process, for rows of 512 and 2048 (16,384 rows each: 32 and 128 MiB in and
out), 1 and 2 threads: per round and thread count, each implementation in turn takes a pause
of 0.2 s (a peer's pool threads stop spinning), one untimed call, then ``--calls`` timed calls
(their median is the round's time); the table gives the median over the rounds of each time
and of the paired ratios. Every implementation writes into its own preallocated output:

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
        outs = {k: np.empty_like(x) for k in ("cyattn", "cyattn-ord", "cyattn-nt", "ort", "copy")}
        for nt in threads:
            impls = {"cyattn": functools.partial(fn, x, out=outs["cyattn"])}
            if not args.no_ord:
                impls["cyattn-ord"] = functools.partial(
                    kern.softmax_fast, x, outs["cyattn-ord"], args.log, nt, np.empty, 1 << 62)
            if args.nt:
                impls["cyattn-nt"] = functools.partial(
                    kern.softmax_fast, x, outs["cyattn-nt"], args.log, nt, np.empty, 0)
            if not args.no_ort and not args.log and peers.ort_module() is not None:
                impls["ort"] = peers.ort_softmax(x, None, nt)[0]
            impls["copy"] = functools.partial(np.copyto, outs["copy"], x)
            times = {k: [] for k in impls}
            with threadpool_limits(nt):
                for r in range(args.rounds):
                    order = list(impls) if r % 2 == 0 else list(impls)[::-1]
                    for k in order:
                        time.sleep(0.2)
                        impls[k]()
                        times[k].append(_time(impls[k], args.calls))
            for k in ("cyattn-ord", "cyattn-nt"):
                if k in impls:
                    assert np.array_equal(outs["cyattn"], outs[k]), f"{k}: bits differ"
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
