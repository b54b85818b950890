#!/usr/bin/env python
"""Side-by-side benchmark: cyattn vs a NumPy reference vs PyTorch (when installed).

A thin command line over the harness in cyattn._bench (which ``python -m cyattn bench --full``
runs too). Writes bench/results/latest.md (also printed), latest.json (raw samples) and
sdpa_gflops.png (needs matplotlib). See bench/README.md for what is measured and how to read it.

    python bench/run.py                       # every case, 1 and 2 threads (a while)
    python bench/run.py --quick               # fewer cases and samples
    python bench/run.py --threads 1 --cases sdpa --only "(1,8,"

The installed cyattn is used; if none is importable, the in-place build in ../src is.
"""
import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

try:
    import cyattn  # noqa: F401
except ImportError:  # not installed: use the in-place build of this checkout
    sys.path.insert(0, str(HERE.parent / "src"))
    import cyattn  # noqa: F401
from cyattn import _bench


def main(argv=None):
    parser = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n\n")[0])
    _bench.add_full_arguments(parser)
    args = _bench.check_full_arguments(parser, parser.parse_args(argv))
    rerun = [str(Path(__file__).resolve())] + (sys.argv[1:] if argv is None else list(argv))
    return _bench.full_main(args, rerun, outdir=HERE / "results")


if __name__ == "__main__":
    sys.exit(main())
