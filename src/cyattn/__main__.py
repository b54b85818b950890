"""``python -m cyattn`` (also the ``cyattn`` command): configuration, self-check and benchmark.

Subcommands::

    info                              version, kernel variant, CPU features, OpenMP, threads
    info --plan [--threads 16,64]     the thread plan of the bench's shapes (tasks, the largest
                                      task's share, the busiest thread; cyattn._plan)
    check [--cases N] [--seed S]      compiled kernels vs the pure-Python oracle (exit 1 on a
                                      mismatch)
    bench [--threads N] [--quick]     quick table of cyattn vs NumPy
    bench --full [--threads 1,2] [--quick] [--cases ...] [--outdir DIR] ...
                                      the full harness (cyattn._bench): NumPy, PyTorch, ONNX
                                      Runtime and JAX side by side (those installed), FMA peak,
                                      best sgemm, bandwidth, peak memory, a
                                      Markdown table and a PNG plot
    plot --demo OUT.png               a figure of the mask kinds (needs matplotlib)
    embed [INPUT] -o OUT.npy|OUT.parquet
                                      sentence embeddings of a text file, stdin or a Parquet
                                      column (cyattn.encoder; pip install 'cyattn[encoder]')
    rerank --model DIR --query Q [INPUT] [--top-k K] [-o OUT.jsonl]
                                      passages ranked by a cross-encoder's score with Q
                                      (cyattn.encoder.load_reranker), JSON lines

Without a subcommand: info, the 3-score example, check, and a short bench (``--quick`` makes
the bench tiny). The pieces live in :mod:`cyattn._selfcheck` and :mod:`cyattn._bench`.
"""
import argparse
import os
import sys
from pathlib import Path

import numpy as np

import cyattn
from cyattn import _bench, _selfcheck
from cyattn._validate import positive_int_arg
from cyattn.encoder import _cli as _embed_cli

# The 3-score example (DESIGN 5): softmax of the scores and attention over three values.
_SCORES = [2.0, 1.0, 0.0]
_VALUES = [(1.0, 0.0), (0.0, 2.0), (3.0, 1.0)]
_WEIGHTS = [0.665, 0.245, 0.090]
_OUTPUT = [0.935, 0.579]


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m cyattn",
        description="cyattn: show the configuration, check the compiled kernels against the "
                    "pure-Python oracle, and benchmark them against NumPy. Without a "
                    "subcommand: info, a worked example, check and a short bench.")
    parser.add_argument("--quick", action="store_true",
                        help="without a subcommand: run a tiny bench (a few seconds)")
    parser.add_argument("--threads", type=positive_int_arg, default=1,
                        help="without a subcommand: threads for the bench (default 1)")
    sub = parser.add_subparsers(dest="command", metavar="{info,check,bench,plot,embed,rerank}")
    info = sub.add_parser("info", help="version, kernel variant, CPU features, OpenMP, threads")
    info.add_argument("--plan", action="store_true",
                      help="print how the kernels and the sentence encoder split the bench's "
                           "shapes among threads: tasks, the largest task, the busiest thread "
                           "(computed, not measured: any thread count on any machine)")
    info.add_argument("--threads", default=None,
                      help="with --plan: comma-separated thread counts (default 16,64)")
    check = sub.add_parser("check", help="compare the compiled kernels with cyattn.oracle")
    check.add_argument("--cases", type=positive_int_arg, default=300,
                       help="number of random cases (default 300)")
    check.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    bench = sub.add_parser(
        "bench", help="time cyattn against a NumPy reference (--full: and the installed peers)",
        description="Without --full: a short table of cyattn vs NumPy at one thread count. "
                    "With --full: the full harness (NumPy, PyTorch, ONNX Runtime and JAX, those "
                    "installed, side by side, 1 and 2 "
                    "threads, FMA peak, read bandwidth, peak memory per case; writes "
                    "latest.md, latest.json and a PNG plot into bench/results of a checkout, "
                    "else --outdir or the current directory). The options after --quick are "
                    "for --full only.")
    bench.add_argument("--full", action="store_true",
                       help="run the full harness (NumPy and PyTorch, 1 and 2 threads; a "
                            "while)")
    bench.add_argument("--threads", default=None,
                       help="threads for cyattn, numpy's BLAS and torch (default 1; with "
                            "--full: a comma-separated list, default 1,2)")
    bench.add_argument("--quick", action="store_true",
                       help="a few tiny cases (for tests); with --full: fewer cases and "
                            "samples")
    bench.add_argument("--mode", choices=("standard", "short", "quick"), default=None,
                       help=argparse.SUPPRESS)
    _bench.add_full_arguments(bench, common=False)
    plot = sub.add_parser("plot", help="draw the mask kinds as a PNG (needs matplotlib)")
    plot.add_argument("--demo", metavar="OUT.png", required=True,
                      help="write the figure of the mask kinds (causal top-left and "
                           "bottom-right, padding, window, a fully masked row) to this file")
    _embed_cli.add_arguments(sub.add_parser(
        "embed", help="sentence embeddings of a text file, stdin or a Parquet column",
        description=_embed_cli.__doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]))
    _embed_cli.add_rerank_arguments(sub.add_parser(
        "rerank", help="passages ranked by a cross-encoder's score with a query",
        description=_embed_cli.__doc__.rsplit("\n\n", 1)[1]))
    return parser


# options of the full harness that mean nothing to the quick bench, and their defaults
_FULL_ONLY = {"cases": None, "only": None, "samples": None, "min_time": None,
              "no_memory": False, "no_torch": False, "no_ort": False, "no_jax": False,
              "no_plot": False, "outdir": None}


def cmd_plan(threads):
    """``info --plan``: cyattn._plan's table of the bench's shapes at each thread count."""
    from cyattn import _plan
    print(f"cyattn {cyattn.__version__} ({cyattn.config()['variant']}): the thread plan, computed "
          f"from the kernels' split rules (cyattn._plan)")
    print(_plan.report(threads))
    return 0


def cmd_info():
    cfg = cyattn.config()
    forced = os.environ.get("CYATTN_BACKEND", "").strip()
    rows = [
        ("version", cfg["version"]),
        ("variant", cfg["variant"] + (f" (forced by CYATTN_BACKEND={forced})" if forced else "")),
        ("available_variants", ", ".join(cfg["available_variants"]) or "-"),
        ("cpu_features", ", ".join(cfg["cpu_features"]) or "-"),
        ("openmp", "on" if cfg["openmp"] else "off (kernels run single-threaded)"),
        ("default_threads", cfg["default_threads"]),
        ("cpu_count", cfg["cpu_count"]),
        ("bf16_matmul", cfg["bf16_matmul"]),
        ("bf16_attention", cfg["bf16_attention"]),
        ("amx", cfg["amx"]),
        ("python", sys.version.split()[0]),
        ("numpy", np.__version__),
    ]
    print(f"cyattn {cfg['version']} ({Path(cyattn.__file__).parent})")
    for key, value in rows:
        print(f"{key + ':':<20}{value}")
    return 0


def _fmt3(values):
    return "[" + ", ".join(f"{float(x):.3f}" for x in values) + "]"


def cmd_example():
    """Print the 3-score example computed by cyattn; 0 if it matches the expected numbers."""
    weights = cyattn.softmax(np.array(_SCORES))
    out = cyattn.scaled_dot_product_attention(np.array([[1.0]]), np.array([[s] for s in _SCORES]),
                                              np.array(_VALUES), scale=1.0)[0]
    print(f"example: scores {_SCORES} -> softmax weights {_fmt3(weights)}")
    print(f"example: values {_VALUES} -> attention output {_fmt3(out)}")
    ok = True
    for name, got, want in (("softmax weights", weights, _WEIGHTS),
                            ("attention output", out, _OUTPUT),
                            ("weights @ values", weights @ np.array(_VALUES), _OUTPUT)):
        if [round(float(x), 3) for x in got] != want:
            print(f"example: FAILED: {name} {_fmt3(got)}, expected {_fmt3(want)}")
            ok = False
    return 0 if ok else 1


def cmd_check(cases=300, seed=0):
    return 1 if _selfcheck.run_check(cases, seed) else 0


def cmd_bench(threads=None, mode="standard"):
    """The quick bench (cyattn vs NumPy) at ``threads`` (default 1)."""
    threads = threads or 1
    rc = _bench.rerun_without_blas_overrides(
        ["-m", "cyattn", "bench", "--mode", mode, "--threads", str(threads)], threads=threads)
    if rc is not None:
        return rc
    return _bench.run_quick_bench(n_threads=threads, mode=mode)


def cmd_bench_full(parser, args, argv=None):
    """``bench --full``: the full harness of :mod:`cyattn._bench`, in this process."""
    args = _bench.check_full_arguments(parser, args)
    rerun = ["-m", "cyattn"] + (sys.argv[1:] if argv is None else list(argv))
    if args.outdir is None and _bench.checkout_root() is None:
        print(f"bench --full: cyattn is not imported from a checkout; results go to the "
              f"current directory {Path.cwd()} (choose with --outdir)", flush=True)
    return _bench.full_main(args, rerun)


def cmd_plot(path):
    """Write cyattn.plot.mask_kinds_figure() to ``path``; 2 when matplotlib is missing."""
    try:
        import cyattn.plot
    except ImportError as exc:
        print(f"python -m cyattn plot: {exc}", file=sys.stderr)
        return 2
    cyattn.plot.mask_kinds_figure().savefig(path, dpi=80)
    print(f"wrote {path}")
    return 0


def main(argv=None):
    """Entry point of ``python -m cyattn`` and the ``cyattn`` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "info":
        if args.plan:
            try:
                threads = _bench.parse_thread_list(args.threads or "16,64")
            except ValueError as exc:
                parser.error(f"info --threads: {exc}")
            return cmd_plan(threads)
        if args.threads is not None:
            parser.error("info: --threads needs --plan")
        return cmd_info()
    if args.command == "check":
        return cmd_check(args.cases, args.seed)
    if args.command == "plot":
        return cmd_plot(args.demo)
    if args.command == "embed":
        return _embed_cli.run(args)
    if args.command == "rerank":
        return _embed_cli.run_rerank(args)
    if args.command == "bench":
        if args.full:
            return cmd_bench_full(parser, args, argv)
        given = [name for name, default in _FULL_ONLY.items() if getattr(args, name) != default]
        if given:
            parser.error(f"bench: --{given[0].replace('_', '-')} needs --full")
        threads = None
        if args.threads is not None:
            try:
                threads = _bench.parse_thread_list(args.threads)
            except ValueError as exc:
                parser.error(f"bench --threads: {exc}")
            if len(threads) != 1:
                parser.error("bench --threads: the quick bench takes one thread count (a list "
                             "needs --full)")
            threads = threads[0]
        mode = args.mode or ("quick" if args.quick else "standard")
        return cmd_bench(threads, mode)
    cmd_info()
    print()
    status = cmd_example()
    print()
    status |= cmd_check()
    print()
    if status:
        print("bench: skipped because the checks above failed")
        return 1
    sys.stdout.flush()
    return cmd_bench(args.threads, "quick" if args.quick else "short")


if __name__ == "__main__":
    sys.exit(main())
