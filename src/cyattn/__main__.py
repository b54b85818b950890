"""``python -m cyattn`` (also the ``cyattn`` command): configuration, self-check and benchmark.

Subcommands::

    info                              version, kernel variant, CPU features, OpenMP, threads
    check [--cases N] [--seed S]      compiled kernels vs the pure-Python oracle (exit 1 on a
                                      mismatch)
    bench [--full] [--threads N] [--quick]
                                      quick table of cyattn vs NumPy (--full: the repository's
                                      bench/run.py harness, with PyTorch when installed)

Without a subcommand: info, the 3-score example, check, and a short bench (``--quick`` makes
the bench tiny). The pieces live in :mod:`cyattn._selfcheck` and :mod:`cyattn._bench`.
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import cyattn
from cyattn import _bench, _selfcheck

# The 3-score example (DESIGN 5): softmax of the scores and attention over three values.
_SCORES = [2.0, 1.0, 0.0]
_VALUES = [(1.0, 0.0), (0.0, 2.0), (3.0, 1.0)]
_WEIGHTS = [0.665, 0.245, 0.090]
_OUTPUT = [0.935, 0.579]


def _count(text):
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m cyattn",
        description="cyattn: show the configuration, check the compiled kernels against the "
                    "pure-Python oracle, and benchmark them against NumPy. Without a "
                    "subcommand: info, a worked example, check and a short bench.")
    parser.add_argument("--quick", action="store_true",
                        help="without a subcommand: run a tiny bench (a few seconds)")
    parser.add_argument("--threads", type=_count, default=1,
                        help="without a subcommand: threads for the bench (default 1)")
    sub = parser.add_subparsers(dest="command", metavar="{info,check,bench}")
    sub.add_parser("info", help="version, kernel variant, CPU features, OpenMP, threads")
    check = sub.add_parser("check", help="compare the compiled kernels with cyattn.oracle")
    check.add_argument("--cases", type=_count, default=300,
                       help="number of random cases (default 300)")
    check.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    bench = sub.add_parser("bench", help="time cyattn against a NumPy reference")
    bench.add_argument("--full", action="store_true",
                       help="run the full harness bench/run.py of the source repository "
                            "(NumPy and PyTorch, 1 and 2 threads, a few minutes)")
    bench.add_argument("--threads", type=_count, default=None,
                       help="threads for cyattn and numpy's BLAS (default 1; with --full: "
                            "the harness's default, 1 and 2)")
    bench.add_argument("--quick", action="store_true",
                       help="a few tiny cases (for tests); with --full: the harness's --quick")
    bench.add_argument("--mode", choices=("standard", "short", "quick"), default=None,
                       help=argparse.SUPPRESS)
    return parser


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


def _full_harness():
    """bench/run.py of the source tree this package was imported from, or None."""
    root = Path(cyattn.__file__).resolve().parent.parent.parent
    run = root / "bench" / "run.py"
    return run if run.is_file() and (root / "pyproject.toml").is_file() else None


def cmd_bench(threads=None, mode="standard", full=False):
    if full:
        run = _full_harness()
        if run is None:
            print("bench --full: the full harness (bench/run.py) is not available in an installed "
                  "package; run it from a checkout of the cyattn repository, or use "
                  "'python -m cyattn bench' for the quick table", file=sys.stderr)
            return 1
        args = ([str(run)] + (["--threads", str(threads)] if threads else [])
                + (["--quick"] if mode == "quick" else []))
        print(f"bench --full: running {run}", flush=True)
        return subprocess.call([sys.executable] + args, env=_bench.child_env())
    threads = threads or 1
    rc = _bench.rerun_without_blas_overrides(
        ["-m", "cyattn", "bench", "--mode", mode, "--threads", str(threads)])
    if rc is not None:
        return rc
    return _bench.run_quick_bench(n_threads=threads, mode=mode)


def main(argv=None):
    """Entry point of ``python -m cyattn`` and the ``cyattn`` command; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.command == "info":
        return cmd_info()
    if args.command == "check":
        return cmd_check(args.cases, args.seed)
    if args.command == "bench":
        mode = args.mode or ("quick" if args.quick else "standard")
        return cmd_bench(args.threads, mode, args.full)
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
