"""Cross-encoder rerankers on cyattn: score (query, passage) pairs (``load_reranker``).

A cross-encoder is a transformer of one of the families (BERT: ms-marco-MiniLM-L6-v2;
XLM-RoBERTa: bge-reranker-base / v2-m3) whose ``config.json`` lists a
``*ForSequenceClassification`` architecture: the pair is one input (``[CLS] query [SEP] passage
[SEP]``, the passage token type 1 where the model has two types; truncated longest first), and
a head on the first token's hidden state gives the logits. The head is BERT's pooler (dense +
tanh, ``bert.pooler.dense``) then ``classifier``, or RoBERTa's ``classifier.dense`` + tanh then
``classifier.out_proj``: the same computation under two sets of names. The scores are the
logits through the model's activation (sentence-transformers' rule: ``activation_fn`` in
config.json's ``sentence_transformers`` entry, else sigmoid for one label, identity for more).

The body, its tokenizer and the batching/thread plan are the family encoder's
(:class:`cyattn.encoder.Encoder`): pairs are sorted by token count, cut into batches, and the
batches share the threads as :meth:`Encoder.encode`'s do.
"""
from __future__ import annotations

import numpy as np

from ._base import Weights, _Clock, _folder, _read_json, family_of

__all__ = ["CrossEncoder"]

# architecture -> (dense of the head, its output layer), tensor names without ".weight"
_HEADS = {
    "BertForSequenceClassification": ("bert.pooler.dense", "classifier"),
    "XLMRobertaForSequenceClassification": ("classifier.dense", "classifier.out_proj"),
    "RobertaForSequenceClassification": ("classifier.dense", "classifier.out_proj"),
}
_ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "identity", "Tanh": "tanh"}


def _activation(d, cfg, num_labels):
    """The activation sentence-transformers' CrossEncoder applies to this model's logits."""
    st = cfg.get("sentence_transformers") or {}
    path = st.get("activation_fn") or cfg.get("sbert_ce_default_activation_function")
    if path is None:
        return "sigmoid" if num_labels == 1 else "identity"
    name = str(path).rsplit(".", 1)[-1]
    if name not in _ACTIVATIONS:
        raise ValueError(f"model folder {d}: config.json activation_fn {path!r} is not "
                         f"implemented ({', '.join(_ACTIVATIONS)} only)")
    return _ACTIVATIONS[name]


class CrossEncoder:
    """A cross-encoder reranker: scores (query, passage) pairs, as sentence-transformers'
    ``CrossEncoder`` does. Build it with :func:`cyattn.encoder.load_reranker`.

    Parameters
    ----------
    model_dir : path-like
        Folder of a transformers sequence-classification model: ``config.json``
        (architectures ``BertForSequenceClassification``,
        ``XLMRobertaForSequenceClassification`` or ``RobertaForSequenceClassification``),
        ``model.safetensors``, ``tokenizer.json`` and optionally ``tokenizer_config.json``
        (``model_max_length``).
    linear : {"cyattn", "numpy"}
        Backend of the dense layers (see :class:`cyattn.encoder.Encoder`).

    Attributes
    ----------
    model_dir : pathlib.Path
    body : Encoder
        The transformer (its family's encoder, without pooling).
    num_labels : int
        Logits per pair.
    activation : {"sigmoid", "identity", "tanh"}
        Applied to the logits by :meth:`predict`.
    max_length : int
        Pairs are truncated to this many tokens (longest text first), special tokens included.

    Raises
    ------
    FileNotFoundError
        If the folder or a required file is missing (named in the message).
    ValueError
        If config.json's architecture is not a supported sequence classifier, a head tensor
        is missing or misshapen, or the activation is not implemented.
    ImportError
        If ``tokenizers`` or ``safetensors`` is missing.
    """

    def __init__(self, model_dir, *, linear="cyattn"):
        d = self.model_dir = _folder(model_dir)
        cfg = _read_json(d / "config.json", "the transformer's configuration")
        archs = cfg.get("architectures") or []
        head = next((_HEADS[a] for a in archs if a in _HEADS), None)
        if head is None:
            raise ValueError(f"model folder {d}: config.json architectures {archs} has no "
                             f"cross-encoder cyattn.encoder runs (one of {', '.join(_HEADS)}); "
                             f"a sentence embedding model loads with cyattn.encoder.load")
        labels = cfg.get("id2label")
        self.num_labels = int(cfg.get("num_labels") or (len(labels) if labels else 2))
        self.activation = _activation(d, cfg, self.num_labels)
        family = family_of(d, cfg)
        self.body = family(d, linear=linear, _sentence_transformers=False)
        E = self.body.hidden
        w = Weights(d)
        self._head = (np.ascontiguousarray(w.raw(head[0] + ".weight", (E, E)).T),
                      w.raw(head[0] + ".bias", (E,)),
                      np.ascontiguousarray(w.raw(head[1] + ".weight", (self.num_labels, E)).T),
                      w.raw(head[1] + ".bias", (self.num_labels,)))
        for arr in self._head:
            arr.flags.writeable = False
        self.max_length = self.body.max_seq_length

    def __repr__(self):
        return (f"CrossEncoder({str(self.model_dir)!r}, {type(self.body).__name__}, "
                f"num_labels={self.num_labels}, activation={self.activation})")

    def _scores(self, ids, type_ids, threads, timings, work, apply_softmax):
        """Scores of one batch of tokenized pairs: the head on each pair's first token."""
        threads = threads if callable(threads) else (lambda n=threads: n)
        clock = _Clock(timings)
        x, starts, _ = self.body._hidden_packed(ids, type_ids, threads, clock, work)
        w1, b1, w2, b2 = self._head
        h = np.tanh(x[starts] @ w1 + b1)
        logits = h @ w2 + b2
        if self.activation == "sigmoid":
            logits = 1.0 / (1.0 + np.exp(-logits))
        elif self.activation == "tanh":
            logits = np.tanh(logits)
        if apply_softmax and self.num_labels > 1:
            logits = np.exp(logits - logits.max(axis=1, keepdims=True))
            logits /= logits.sum(axis=1, keepdims=True)
        clock("other")
        return logits.astype(np.float32, copy=False)

    def predict(self, pairs, batch_size=32, *, apply_softmax=False, n_threads=None,
                progress=False, timings=None):
        """Scores of (query, passage) pairs, in input order.

        Parameters
        ----------
        pairs : sequence of (str, str), or one (str, str)
            The pairs; a single pair (a tuple or list of two str) gives a single score.
        batch_size : int
            Pairs per forward pass (>= 1).
        apply_softmax : bool
            With more than one label, a softmax over each pair's scores (after the
            activation), as sentence-transformers' ``apply_softmax``.
        n_threads : int, optional
            Threads for this call (see :meth:`cyattn.encoder.Encoder.encode`); None: cyattn's
            default.
        progress : bool
            Show a progress bar (tqdm) when installed.
        timings : dict, optional
            Seconds per stage are added to it (as :meth:`Encoder.encode`).

        Returns
        -------
        ndarray, float32
            ``(n,)`` for a one-label model, ``(n, num_labels)`` otherwise; for a single pair,
            its score (a float32 scalar, or ``(num_labels,)``).

        Raises
        ------
        TypeError
            If ``pairs`` is not a sequence of pairs of str (the message names the first bad
            one), or ``batch_size``/``n_threads`` is not an int.
        ValueError
            If ``batch_size < 1`` or ``n_threads < 1``.
        """
        single = _is_pair(pairs)
        pairs = _check_pairs([pairs] if single else pairs)
        out = np.empty((len(pairs), self.num_labels), np.float32)

        def run(ids, types, threads, lane_timings, work):
            return self._scores(ids, types, threads, lane_timings, work, apply_softmax)

        scores = self.body._run(pairs, run, out, batch_size, n_threads, progress, timings)
        if self.num_labels == 1:
            scores = scores[:, 0]
        return scores[0] if single else scores

    def rank(self, query, documents, top_k=None, *, return_documents=False, batch_size=32,
             n_threads=None):
        """The documents ranked by their score with ``query``, best first (as
        sentence-transformers' ``CrossEncoder.rank``).

        Parameters
        ----------
        query : str
        documents : sequence of str
        top_k : int, optional
            Return the best ``top_k`` (>= 1); None: all.
        return_documents : bool
            Add each document's text under ``"text"``.
        batch_size, n_threads
            As :meth:`predict`.

        Returns
        -------
        list of dict
            ``{"corpus_id": index in documents, "score": float}`` (and ``"text"``), sorted
            by score, highest first (ties keep the documents' order).

        Raises
        ------
        TypeError
            If ``query`` is not a str, a document is not a str, or ``top_k`` is not an int.
        ValueError
            If ``top_k < 1``, or the model has more than one label (no single score to rank
            by).
        """
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, got {type(query).__name__}")
        if isinstance(documents, str) or not hasattr(documents, "__iter__"):
            raise TypeError(f"documents must be a sequence of str, got "
                            f"{type(documents).__name__}")
        documents = list(documents)
        if top_k is not None:
            if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)):
                raise TypeError(f"top_k must be an int >= 1 or None, got "
                                f"{type(top_k).__name__} {top_k!r}")
            if top_k < 1:
                raise ValueError(f"top_k must be >= 1, got {top_k}")
        if self.num_labels != 1:
            raise ValueError(f"rank needs a one-label model; {self.model_dir} has "
                             f"{self.num_labels} labels (use predict)")
        scores = self.predict([(query, doc) for doc in documents], batch_size,
                              n_threads=n_threads)
        order = np.argsort(-scores, kind="stable")[:top_k]
        results = [{"corpus_id": int(i), "score": float(scores[i])} for i in order]
        if return_documents:
            for r in results:
                r["text"] = documents[r["corpus_id"]]
        return results

    rerank = rank


def _is_pair(pairs):
    return (isinstance(pairs, (tuple, list)) and len(pairs) == 2
            and all(isinstance(t, str) for t in pairs))


def _check_pairs(pairs):
    """``pairs`` as a list of (str, str) tuples; TypeError naming the first bad one."""
    if isinstance(pairs, (str, bytes)) or pairs is None or not hasattr(pairs, "__iter__"):
        raise TypeError(f"pairs must be a sequence of (query, passage) pairs of str, got "
                        f"{type(pairs).__name__}")
    out = []
    for i, p in enumerate(pairs):
        if not _is_pair(p):
            raise TypeError(f"pairs[{i}] is {p!r}; every pair must be a (str, str) tuple or "
                            f"list")
        out.append((p[0], p[1]))
    return out
