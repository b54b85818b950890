"""XLM-RoBERTa and RoBERTa on cyattn (``config.json`` model_type ``"xlm-roberta"``/``"roberta"``).

The BERT encoder (:mod:`._bert`: the same layers, embeddings, LayerNorm and GELU) with two
differences in the embeddings: positions start after the padding index (the first token of a
text takes row ``pad_token_id + 1`` of the position table, as transformers'
``create_position_ids_from_input_ids`` does for a text without padding), and there is one
token type (``type_vocab_size`` 1; a pair's second text is type 0 as well). The tokenizer
(SentencePiece Unigram for XLM-RoBERTa, byte-level BPE for RoBERTa) comes whole from
``tokenizer.json``; multilingual-e5 and bge-m3 are such models.
"""
from __future__ import annotations

from ._bert import BertEncoder

__all__ = ["XLMRobertaEncoder"]


class XLMRobertaEncoder(BertEncoder):
    """XLM-RoBERTa / RoBERTa: BERT with positions from ``pad_token_id + 1``. See
    :class:`cyattn.encoder.Encoder` for the parameters."""

    _WEIGHT_PREFIXES = ("roberta.",)

    @classmethod
    def _position_offset(cls, cfg):
        pad = cfg.get("pad_token_id", 1)
        return (1 if pad is None else int(pad)) + 1
