"""Command line of the full harness (``python -m cyattn bench --full`` and bench/run.py): the
options, where the results go, and :func:`full_main`, which runs, writes and prints them."""
import json
import os
import sys
from pathlib import Path

from .cases import FULL_GROUPS, build_specs, select_specs
from .plot import PLOT_NAME, write_plot
from .report import render_markdown
from .runner import run_full
from .timing import _CHILD_MARK, rerun_without_blas_overrides

# samples per implementation, seconds per sample, pause between samples with > 1 thread
FULL_SETTINGS = {"full": (7, 0.03, 0.2), "quick": (5, 0.01, 0.2)}


def checkout_root():
    """The repository root when cyattn is imported from a checkout's src/, else None."""
    root = Path(__file__).resolve().parents[3]       # <root>/src/cyattn/_bench/cli.py
    if (root / "pyproject.toml").is_file() and (root / "bench").is_dir() and \
            (root / "src" / "cyattn").is_dir():
        return root
    return None


def default_outdir():
    """bench/results of the checkout cyattn was imported from, else the current directory."""
    from . import checkout_root as root_of_checkout   # the package's name, which tests replace
    root = root_of_checkout()
    return root / "bench" / "results" if root is not None else Path.cwd()


def parse_thread_list(text):
    """``"1,2"`` -> [1, 2]; ValueError unless all are positive integers."""
    threads = [int(t) for t in str(text).split(",") if t.strip()]
    if not threads or min(threads) < 1:
        raise ValueError(f"expected comma-separated positive integers, got {text!r}")
    return threads


def add_full_arguments(parser, common=True):
    """Add the full harness's options to ``parser`` (``common``: also --quick and
    --threads, which ``python -m cyattn bench`` defines itself)."""
    if common:
        parser.add_argument("--quick", action="store_true",
                            help="fewer cases (softmax L=512, matmul n=64/256/1024, SDPA (8,8,128)"
                                 " and (1,8,512), decode, tiny) and 5 shorter samples")
        parser.add_argument("--threads", default="1,2",
                            help="comma-separated thread counts (default 1,2)")
    parser.add_argument("--cases", default=None,
                        help=f"comma-separated case groups among {','.join(FULL_GROUPS)} "
                             f"(default all)")
    parser.add_argument("--only", action="append", default=None, metavar="TEXT",
                        help="keep only cases whose name contains TEXT, e.g. 'sdpa (1,1,8192' "
                             "(repeat for several)")
    parser.add_argument("--samples", type=int, default=None,
                        help="samples per implementation (default 7, --quick 5)")
    parser.add_argument("--min-time", type=float, default=None, metavar="SECONDS",
                        help="minimum duration of one sample (default 0.03, --quick 0.01)")
    parser.add_argument("--no-memory", action="store_true",
                        help="skip the peak-memory measurements (fresh processes)")
    parser.add_argument("--no-torch", action="store_true",
                        help="leave PyTorch out even if it is installed")
    parser.add_argument("--no-ort", action="store_true",
                        help="leave ONNX Runtime out even if it is installed")
    parser.add_argument("--no-jax", action="store_true",
                        help="leave JAX out even if it is installed")
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG plot")
    parser.add_argument("--blas-coretype", default=None, metavar="NAME",
                        help="run NumPy's OpenBLAS with OPENBLAS_CORETYPE=NAME (e.g. Haswell: "
                             "its AVX2 kernels, beside CYATTN_BACKEND=avx2 on an AVX-512 host "
                             "as the proxy for an AVX2 host); default: no override")
    parser.add_argument("--outdir", default=None,
                        help="directory for latest.md, latest.json and the PNG (default: "
                             "bench/results of a checkout, else the current directory)")


def check_full_arguments(parser, args):
    """Validate and normalise the options of :func:`add_full_arguments` (parser.error on
    bad ones): ``args.threads`` becomes a list, ``args.cases`` a tuple."""
    if isinstance(args.threads, str) or args.threads is None:
        try:
            args.threads = parse_thread_list(args.threads or "1,2")
        except ValueError as exc:
            parser.error(f"--threads: {exc}")
    cases = [c.strip() for c in (args.cases or ",".join(FULL_GROUPS)).split(",") if c.strip()]
    unknown = sorted(set(cases) - set(FULL_GROUPS))
    if unknown or not cases:
        parser.error(f"--cases: unknown group(s) {unknown}; choose among {', '.join(FULL_GROUPS)}")
    args.cases = tuple(cases)
    if args.samples is not None and args.samples < 1:
        parser.error("--samples: expected a positive integer")
    if args.min_time is not None and args.min_time < 0:
        parser.error("--min-time: expected a non-negative number of seconds")
    return args


def command_line(rerun_args):
    """``python -m cyattn bench --full ...`` (or ``python bench/run.py ...``): the command that
    produced a result, from its arguments after the interpreter, for the report's header."""
    import shlex
    args = list(rerun_args)
    if args and not args[0].startswith("-"):
        root = checkout_root()
        try:            # bench/run.py relative to the checkout
            args[0] = str(Path(args[0]).resolve().relative_to(root)) if root else args[0]
        except ValueError:
            pass
    return "python " + " ".join(shlex.quote(a) for a in args)


def full_main(args, rerun_args, outdir=None, out=None):
    """Run the full harness with parsed and checked options ``args``; write latest.md,
    latest.json and the PNG into ``args.outdir`` (else ``outdir``, else
    :func:`default_outdir`). ``rerun_args``: this command's arguments after the interpreter,
    for the re-run without OpenBLAS overrides. Returns the exit code."""
    out = out or sys.stdout
    coretype = getattr(args, "blas_coretype", None)
    rc = rerun_without_blas_overrides(rerun_args, out=out, coretype=coretype)
    if rc is not None:
        return rc
    notes = []
    if coretype:
        notes.append(f"NumPy's OpenBLAS forced to its {coretype} kernels "
                     f"(OPENBLAS_CORETYPE={coretype}, --blas-coretype).")
    elif os.environ.get(_CHILD_MARK):
        notes.append("Re-run in a child process without OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE "
                     "(they were set in the parent's environment and slow numpy's OpenBLAS).")
    specs = select_specs(build_specs(args.cases, args.quick), args.only)
    if not specs:
        print("bench --full: no case matches --cases/--only", file=sys.stderr)
        return 2
    samples, target, pause = FULL_SETTINGS["quick" if args.quick else "full"]
    samples = args.samples or samples
    target = target if args.min_time is None else args.min_time
    outdir = Path(args.outdir or outdir or default_outdir())
    result = run_full(specs, threads=args.threads, samples=samples, target=target, pause=pause,
                      use_torch=not args.no_torch, use_ort=not args.no_ort,
                      use_jax=not args.no_jax, memory=not args.no_memory, notes=notes)
    result["meta"]["command"] = command_line(rerun_args)
    text = render_markdown(result)
    outdir.mkdir(parents=True, exist_ok=True)
    md, js = outdir / "latest.md", outdir / "latest.json"
    md.write_text(text, encoding="utf-8")
    js.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    written = [md, js]
    plot_msg = None
    if args.no_plot:
        plot_msg = "PNG plot skipped (--no-plot)"
    elif not any(r["spec"]["group"] == "sdpa" for r in result["rows"]):
        plot_msg = "PNG plot skipped (no SDPA case)"
    elif write_plot(result, outdir / PLOT_NAME) is None:
        plot_msg = ("PNG plot skipped: matplotlib is not installed "
                    "(pip install 'cyattn[bench]' or matplotlib)")
    else:
        written.append(outdir / PLOT_NAME)
    print(text, file=out)
    if plot_msg:
        print(f"bench: {plot_msg}", file=out)
    print("bench: wrote " + ", ".join(str(p) for p in written), file=out, flush=True)
    return 0
