"""Seeded tiny random models of each cyattn.encoder family, saved to a folder with a tokenizer
built there (no model hub): helpers of tests/test_encoder_families.py.

Each builder writes a transformers model (``save_pretrained``) and a tokenizer made with the
``tokenizers`` library (a WordPiece vocabulary of letters and a few words for BERT, a Unigram
one with SentencePiece's ``▁`` for XLM-RoBERTa), so any lowercase ASCII text tokenizes.

Importing it sets ``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE``: everything is local.
"""
import os
import string

import numpy as np

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

WORDS = ["the", "printer", "is", "offline", "refund", "please", "my", "app", "crashes",
         "login", "broken", "again", "query", "passage", "invoice", "server", "network",
         "password", "order", "update", "error", "account", "why", "ok"]


def texts(n, seed=0, max_words=40):
    """``n`` texts of 1 to ``max_words`` words (mixed lengths, some equal), plus an empty one."""
    rng = np.random.default_rng(seed)
    out = [" ".join(rng.choice(WORDS + list("abcxyz"), size=int(k)))
           for k in rng.integers(1, max_words, size=n - 1)]
    return out + [""]


def _fast(tok, **special):
    from transformers import PreTrainedTokenizerFast
    return PreTrainedTokenizerFast(tokenizer_object=tok, **special)


def qwen3_tokenizer():
    """The WordPiece vocabulary with a decoder's template: ``A [SEP]`` (the end-of-text token
    last, as Qwen3-Embedding's tokenizer appends ``<|endoftext|>``), no token types."""
    from tokenizers import processors
    fast, n = bert_tokenizer(types=False)
    fast.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="$A [SEP]", pair="$A [SEP] $B:1 [SEP]:1", special_tokens=[("[SEP]", 3)])
    return fast, n


def bert_tokenizer(types=True):
    """A BERT WordPiece tokenizer ([CLS] A [SEP] B [SEP], types 0 then 1) as transformers';
    ``types=False``: it returns no token_type_ids (ModernBERT's)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = (specials + list(string.ascii_lowercase) + list(string.digits)
             + ["##" + c for c in string.ascii_lowercase + string.digits] + WORDS
             + list(".,:;!?'-"))
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return _fast(tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                 model_input_names=(["input_ids", "token_type_ids", "attention_mask"] if types
                                    else ["input_ids", "attention_mask"]),
                 sep_token="[SEP]", mask_token="[MASK]"), len(vocab)


def xlmr_tokenizer():
    """An XLM-RoBERTa-style Unigram tokenizer (<s> A </s></s> B </s>; <pad> is id 1)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, decoders
    pieces = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    pieces += [("▁" + w, -1.0) for w in WORDS]
    pieces += [(c, -3.0) for c in string.ascii_lowercase + string.digits + ".,:;!?'-"]
    pieces += [("▁" + c, -3.5) for c in string.ascii_lowercase]
    tok = Tokenizer(models.Unigram(pieces, unk_id=3, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)])
    return _fast(tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                 cls_token="<s>", sep_token="</s>", mask_token="<unk>"), len(pieces)


def save_model(folder, family, seed=0, head=None, **overrides):
    """A seeded tiny ``family`` model ("bert", "xlm-roberta") and its tokenizer in ``folder``.

    ``head``: None (the bare model, AutoModel) or "classification" (a sequence-classification
    head, ``num_labels`` from ``overrides``, default 1). Returns the torch model (eval mode)."""
    import torch
    import transformers as tf
    tok, vocab = {"bert": bert_tokenizer, "xlm-roberta": xlmr_tokenizer,
                  "modernbert": lambda: bert_tokenizer(types=False),
                  "qwen3": qwen3_tokenizer}[family]()
    kw = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=64, max_position_embeddings=96)
    if family == "xlm-roberta":
        kw.update(type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                  max_position_embeddings=98)
    if family == "modernbert":             # 4 layers: global, local, local, global
        kw.update(num_hidden_layers=4, intermediate_size=48, max_position_embeddings=128,
                  local_attention=8, pad_token_id=0, cls_token_id=2, sep_token_id=3,
                  bos_token_id=2, eos_token_id=3, norm_eps=1e-5)
    if family == "qwen3":                  # GQA 4/2 heads of 16 (head_dim != hidden / heads)
        kw = dict(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=128, rms_norm_eps=1e-6, pad_token_id=0,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if head is not None:
        kw.setdefault("num_labels", 1)
    kw.update(overrides)
    config, bare, classify = {
        "bert": (tf.BertConfig, tf.BertModel, tf.BertForSequenceClassification),
        "xlm-roberta": (tf.XLMRobertaConfig, tf.XLMRobertaModel,
                        tf.XLMRobertaForSequenceClassification),
        "modernbert": (tf.ModernBertConfig, tf.ModernBertModel,
                       tf.ModernBertForSequenceClassification),
        "qwen3": (tf.Qwen3Config, tf.Qwen3Model, tf.Qwen3ForSequenceClassification)}[family]
    torch.manual_seed(seed)
    model = (classify if head else bare)(config(**kw)).eval()
    with torch.no_grad():                  # LayerNorms away from their (1, 0) start
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "norm" in name.split(".")[-2]:
                p.add_(0.1 * torch.randn_like(p))
            elif name.startswith(("classifier", "bert.pooler")):
                p.mul_(40.0)               # logits of order 1, not 0.02
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model


def sentence_transformer(hf_folder, folder, pooling="mean", normalize=True, prompts=None,
                         max_seq_length=None):
    """Save a sentence-transformers model (Transformer, Pooling, optionally Normalize) built on
    the transformers folder ``hf_folder`` into ``folder``; returns it."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    body = Transformer(str(hf_folder), max_seq_length=max_seq_length)
    modules = [body, Pooling(body.get_embedding_dimension(), pooling)]
    if normalize:
        modules.append(Normalize())
    st = SentenceTransformer(modules=modules, device="cpu", prompts=prompts)
    st.save(str(folder))
    return st
