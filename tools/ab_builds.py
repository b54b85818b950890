"""Interleaved A/B of two builds of cyattn on the bench's ``--quick`` cases, per kernel variant.

Usage (from a checkout, both builds importable from a directory that holds a ``cyattn`` package:
a checkout built in place (``python setup.py build_ext --inplace``; give the checkout or its
``src``), a venv's site-packages, or an unpacked wheel)::

    python tools/ab_builds.py OLD NEW                       # every variant the host runs, 1 thread
    python tools/ab_builds.py OLD NEW --variants avx2 --threads 1,2 --rounds 6
    python tools/ab_builds.py OLD NEW --only matmul --only decode --cases-extra

For every round, variant and thread count, OLD and NEW run in fresh subprocesses one after the
other (ABBA order across rounds, so neither build always runs second), each timing every case
for ``--samples`` calibrated samples (their median, or with ``--stat min`` their minimum, is
that round's time). The ratio of a case in
a round is OLD time / NEW time (> 1: NEW is faster); the table gives the median ratio over the
rounds and its range. A case is flagged ``SLOWER`` when even the best round's ratio is below
1 - ``--noise`` (default 0.03), and ``faster`` when the worst round's ratio is above 1 + noise.

The cases are those of ``python -m cyattn bench --full --quick`` (:func:`build_specs` of the
NEW build's harness, which both builds' children load, so the same timed calls run on both and
OLD may predate the harness), cyattn's own call only, with
``CYATTN_BACKEND`` set to the variant. ``--cases-extra`` adds a batched decode
(8, 32, 1, 4096, 128) and a dense SDPA (1, 8, 2048, 64). Both builds must have the same
variants; a variant the host cannot run is skipped with a note. Exit status 1 if a case is
flagged SLOWER (a kernel change should not land with one unexplained), 0 otherwise.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

# The child: imports cyattn from the build under test and the bench harness (cyattn._bench)
# from the NEW build, times the cases, prints one JSON line {case name: seconds per call}. The
# harness calls only cyattn's public functions, so a build older than the harness runs too.
_CHILD = r"""
import json, os, sys, time
site, harness, cases_json, n_threads, samples, target = sys.argv[1:7]
sys.path.insert(0, site)
import importlib.util
import numpy as np
import cyattn
from cyattn import _backend
if not os.path.abspath(cyattn.__file__).startswith(os.path.abspath(site) + os.sep):
    raise SystemExit(f"cyattn came from {cyattn.__file__}, not from {site}")
# the harness of the NEW build, whatever this build has: both builds run the same timed calls
spec = importlib.util.spec_from_file_location(
    "cyattn._bench", os.path.join(harness, "__init__.py"), submodule_search_locations=[harness])
bench = importlib.util.module_from_spec(spec)
sys.modules["cyattn._bench"] = bench
spec.loader.exec_module(bench)
from cyattn._bench.cases import Spec, prepare
from cyattn._bench.timing import calibrate
n_threads, samples, target = int(n_threads), int(samples), float(target)
try:
    from threadpoolctl import threadpool_limits
    limits = threadpool_limits(n_threads)
except ImportError:
    limits = None
out = {"variant": _backend.variant, "times": {}}
for d in json.loads(cases_json):
    spec = Spec(d["group"], tuple(d["shape"]), d["kind"])
    make, _ = prepare(spec, impls=("cyattn",))
    fn = make(n_threads)["cyattn"]
    number = calibrate(fn, target)
    per_call = []
    for _ in range(samples):
        fn()
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        per_call.append((time.perf_counter() - t0) / number)
    out["times"][spec.name] = sorted(per_call)
print(json.dumps(out))
"""


def _site(path):
    """The directory to put first on sys.path for the build at ``path``."""
    path = os.path.abspath(path)
    for cand in (path, os.path.join(path, "src")):
        if os.path.isfile(os.path.join(cand, "cyattn", "__init__.py")):
            return cand
    raise SystemExit(f"ab_builds: no cyattn package in {path!r} or {path!r}/src")


def _variants_of(site):
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from cyattn import _backend; "
            "print(','.join(_backend.available_variants()))")
    out = subprocess.run([sys.executable, "-c", code, site], capture_output=True, text=True,
                         check=True, cwd=tempfile.gettempdir(), env=_env(None))
    return out.stdout.strip().split(",")


def _env(variant):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("CYATTN_BACKEND", None)
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):   # as the bench does
        env.pop(name, None)
    if variant:
        env["CYATTN_BACKEND"] = variant
    return env


def _case_list(site, only, extra):
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); "
            "from cyattn._bench.cases import build_specs, select_specs; "
            "print(json.dumps([s.to_json() for s in select_specs(build_specs(quick=True), "
            "json.loads(sys.argv[2]))]))")
    out = subprocess.run([sys.executable, "-c", code, site, json.dumps(only)],
                         capture_output=True, text=True, check=True, cwd=tempfile.gettempdir(),
                         env=_env(None))
    cases = json.loads(out.stdout)
    if extra:
        more = [{"group": "decode", "shape": [8, 32, 1, 4096, 128], "kind": "dense"},
                {"group": "sdpa", "shape": [1, 8, 2048, 2048, 64], "kind": "dense"}]
        cases += [c for c in more if not only or any(w.lower() in
                  f"{c['group']} {tuple(c['shape'])} {c['kind']}".lower() for w in only)]
    return cases


def _run_child(site, harness, variant, cases, n_threads, samples, target, stat):
    res = subprocess.run([sys.executable, "-c", _CHILD, site, harness, json.dumps(cases),
                          str(n_threads),
                          str(samples), str(target)], capture_output=True, text=True,
                         cwd=tempfile.gettempdir(), env=_env(variant))
    if res.returncode != 0:
        raise SystemExit(f"ab_builds: the child for {site} ({variant}) failed:\n{res.stderr}")
    data = json.loads(res.stdout.strip().splitlines()[-1])
    if data["variant"] != variant:
        raise SystemExit(f"ab_builds: {site} ran {data['variant']}, not {variant}")
    pick = (lambda xs: xs[0]) if stat == "min" else (lambda xs: xs[len(xs) // 2])
    return {name: pick(xs) for name, xs in data["times"].items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old", help="the reference build (checkout, src/ or site-packages)")
    ap.add_argument("new", help="the build under test")
    ap.add_argument("--variants", default="", help="comma-separated (default: every variant "
                    "both builds have and this host runs)")
    ap.add_argument("--threads", default="1", help="thread counts, e.g. 1,2 (default 1)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds (default 4)")
    ap.add_argument("--samples", type=int, default=3, help="samples per case per child "
                    "(default 3; the median is the round's time)")
    ap.add_argument("--min-time", type=float, default=0.03, help="seconds per sample")
    ap.add_argument("--stat", choices=("median", "min"), default="median", help="a round's "
                    "time from its samples: median (default), or min on a host shared with "
                    "other work (time slices lost to other processes only add time)")
    ap.add_argument("--noise", type=float, default=0.03, help="flag threshold (default 0.03)")
    ap.add_argument("--only", action="append", default=[], help="keep cases whose name "
                    "contains this text (repeatable)")
    ap.add_argument("--cases-extra", action="store_true", help="add decode (8,32,1,4096,"
                    "128) and dense SDPA (1,8,2048,64)")
    ap.add_argument("--json", help="also write every round's times to this file")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.samples < 1:
        ap.error("--rounds and --samples must be >= 1")
    old, new = _site(args.old), _site(args.new)
    if old == new:
        ap.error(f"OLD and NEW are the same directory ({old})")
    have = [v for v in _variants_of(new) if v in _variants_of(old)]
    wanted = [v for v in args.variants.split(",") if v] or have
    for v in wanted:
        if v not in have:
            print(f"note: variant {v} skipped: not runnable here or not in both builds "
                  f"(both have and run: {', '.join(have)})")
    wanted = [v for v in wanted if v in have]
    threads = [int(t) for t in args.threads.split(",") if t]
    cases = _case_list(new, args.only, args.cases_extra)
    harness = os.path.join(new, "cyattn", "_bench")
    if not cases or not wanted:
        ap.error("nothing to run (no case or no variant left)")
    print(f"A/B: OLD {old}\n     NEW {new}\nvariants {', '.join(wanted)}; threads "
          f"{', '.join(map(str, threads))}; {args.rounds} rounds x {args.samples} samples; "
          f"ratio = OLD time / NEW time (> 1: NEW faster)", flush=True)
    rounds = {}          # (variant, threads, case) -> list of (old, new)
    for r in range(args.rounds):
        for v in wanted:
            for t in threads:
                order = [("old", old), ("new", new)]
                if r % 2:
                    order.reverse()
                got = {label: _run_child(site, harness, v, cases, t, args.samples,
                                         args.min_time, args.stat)
                       for label, site in order}
                for name in got["new"]:
                    rounds.setdefault((v, t, name), []).append((got["old"][name],
                                                                got["new"][name]))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    slower = 0
    width = max(len(k[2]) for k in rounds)
    print(f"\n| variant | threads | {'case':<{width}} | old | new | ratio (median) | range | |")
    print(f"|---|---|{'-' * (width + 2)}|---|---|---|---|---|")
    for (v, t, name), pairs in rounds.items():
        ratios = [a / b for a, b in pairs]
        med = statistics.median(ratios)
        flag = ""
        if max(ratios) < 1 - args.noise:
            flag, slower = "SLOWER", slower + 1
        elif min(ratios) > 1 + args.noise:
            flag = "faster"
        o = statistics.median(a for a, _ in pairs)
        n = statistics.median(b for _, b in pairs)
        print(f"| {v} | {t} | {name:<{width}} | {o * 1e6:.1f} µs | {n * 1e6:.1f} µs | "
              f"{med:.3f} | {min(ratios):.3f}-{max(ratios):.3f} | {flag} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"old": old, "new": new, "rounds": [
                {"variant": v, "threads": t, "case": c, "pairs": p}
                for (v, t, c), p in rounds.items()]}, fh, indent=1)
    print(f"\n{slower} case(s) slower beyond noise" if slower else "\nno case slower beyond noise")
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
