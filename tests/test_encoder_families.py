"""cyattn.encoder's model families (issue 48) against transformers and sentence-transformers.

Families: BERT, XLM-RoBERTa, ModernBERT (4 layers: global, local, local, global, with a
sliding window of 8 keys, so most texts are longer than the window), Qwen3 (causal, GQA 4/2
heads of 16, last-token pooling).

No model hub: each family is a seeded tiny random model (tests/tiny_models.py) saved with a
tokenizer built in a temporary folder; sentence-transformers saves the sentence-transformers
layout around it (its 6.x pooling config format; the older ``pooling_mode_*_tokens`` keys are
written by hand). cyattn must give sentence-transformers' embeddings (cosine >= 0.99999 in
float32) for a padded batch of mixed lengths, texts truncated at max_seq_length, and one text.
"""
import json
import shutil

import numpy as np
import pytest

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")
pytest.importorskip("torch")
pytest.importorskip("transformers")
st_mod = pytest.importorskip("sentence_transformers")

import tiny_models

import cyattn.encoder

MIN_COSINE = 0.99999
MAX_ABS_DIFF = 1e-5
MAX_SEQ = 64
POOLING = {"qwen3": "lasttoken"}
CLASSES = {"bert": "BertEncoder", "xlm-roberta": "XLMRobertaEncoder",
           "modernbert": "ModernBertEncoder", "qwen3": "Qwen3Encoder"}


def _texts():
    """Mixed lengths, repeated lengths, an empty text, and two longer than MAX_SEQ tokens."""
    out = tiny_models.texts(30, seed=1)
    return out + [" ".join(tiny_models.WORDS * 4), "offline " * 80]


def check_close(got, want):
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert g.shape == w.shape
    cos = (g * w).sum(1) / (np.linalg.norm(g, axis=1) * np.linalg.norm(w, axis=1))
    assert cos.min() >= MIN_COSINE and np.abs(g - w).max() <= MAX_ABS_DIFF, (
        cos.min(), np.abs(g - w).max())


@pytest.fixture(scope="module", params=["bert", "xlm-roberta", "modernbert", "qwen3"])
def st_model(request, tmp_path_factory):
    """(family, sentence-transformers model, its folder) with mean pooling (Qwen3: last
    token), Normalize and a query prompt."""
    root = tmp_path_factory.mktemp(request.param)
    tiny_models.save_model(root / "hf", request.param, seed=3)
    st = tiny_models.sentence_transformer(root / "hf", root / "st",
                                          pooling=POOLING.get(request.param, "mean"),
                                          prompts={"query": "query: ", "document": ""},
                                          max_seq_length=MAX_SEQ)
    return request.param, st, root / "st"


def test_family_matches_sentence_transformers(st_model):
    family, st, folder = st_model
    enc = cyattn.encoder.load(folder)
    assert type(enc).__name__ == CLASSES[family]
    assert enc.max_seq_length == MAX_SEQ and enc.normalize
    assert enc.pooling == (POOLING.get(family, "mean"),)
    texts = _texts()
    assert max(len(t) for t in enc.tokenize(texts)) == MAX_SEQ       # truncated
    check_close(enc.encode(texts, batch_size=8, n_threads=2),
                st.encode(texts, batch_size=8))
    one = ["my printer is offline"]
    check_close(enc.encode(one, n_threads=1), st.encode(one))
    # a text alone and in a padded batch of mixed lengths: the same row
    np.testing.assert_allclose(enc.encode(texts[:1], n_threads=1)[0],
                               enc.encode(texts, n_threads=1)[0], rtol=0, atol=1e-6)


def test_prompts(st_model):
    _, st, folder = st_model
    enc = cyattn.encoder.load(folder)
    assert enc.prompts == {"query": "query: ", "document": ""}
    texts = _texts()[:9]
    check_close(enc.encode(texts, prompt_name="query"), st.encode(texts, prompt_name="query"))
    check_close(enc.encode_query(texts), st.encode_query(texts))
    check_close(enc.encode_document(texts), st.encode_document(texts))
    check_close(enc.encode(texts, prompt="passage: "), st.encode(texts, prompt="passage: "))
    with pytest.raises(ValueError, match=r"prompt_name 'passage' is not one of.*'document'"):
        enc.encode(texts, prompt_name="passage")
    with pytest.raises(TypeError, match="prompt must be a str, got int"):
        enc.encode(texts, prompt=3)


def _rewrite(folder, name, change):
    path = folder / name
    cfg = json.loads(path.read_text())
    path.write_text(json.dumps(change(cfg)))


def test_pooling_config_formats(st_model, tmp_path):
    """sentence-transformers 6.2 writes {"embedding_dimension", "pooling_mode",
    "include_prompt"}; older versions one pooling_mode_*_tokens key per mode. Both load and
    give the same bits."""
    family, st, folder = st_model
    mode = POOLING.get(family, "mean")
    pool = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pool == {"embedding_dimension": 32, "pooling_mode": mode, "include_prompt": True}
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    (old / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 32, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_lasttoken": mode == "lasttoken"}))
    texts = _texts()
    new_enc, old_enc = cyattn.encoder.load(folder), cyattn.encoder.load(old)
    assert old_enc.pooling == new_enc.pooling == (mode,)
    np.testing.assert_array_equal(old_enc.encode(texts), new_enc.encode(texts))
    check_close(old_enc.encode(texts), st_mod.SentenceTransformer(str(old), device="cpu")
                .encode(texts))


@pytest.mark.parametrize("modes", [["cls", "lasttoken", "max"], ["mean_sqrt_len_tokens"]])
def test_pooling_modes_in_the_new_format(st_model, tmp_path, modes):
    """A list of modes is concatenated in its order, as sentence-transformers does."""
    family, _, folder = st_model
    if family != "bert":
        pytest.skip("pooling is shared by the families: one is enough")
    d = tmp_path / "m"
    shutil.copytree(folder, d)
    _rewrite(d, "1_Pooling/config.json", lambda c: dict(c, pooling_mode=modes))
    want = st_mod.SentenceTransformer(str(d), device="cpu").encode(_texts())
    enc = cyattn.encoder.load(d)
    assert enc.dim == 32 * len(modes)
    check_close(enc.encode(_texts()), want)


@pytest.mark.parametrize("file, change, exc, match", [
    ("1_Pooling/config.json", lambda c: dict(c, pooling_mode="weightedmean"), ValueError,
     r"pooling_mode \['weightedmean'\] is not implemented"),
    ("1_Pooling/config.json", lambda c: dict(c, embedding_dimension=48), ValueError,
     "embedding_dimension 48 is not config.json hidden_size 32"),
    ("config.json", lambda c: dict(c, model_type="t5", architectures=["T5EncoderModel"]),
     ValueError, r"architecture 't5' \(T5EncoderModel\) is not implemented.*'xlm-roberta'"),
    ("config_sentence_transformers.json", lambda c: dict(c, default_prompt_name="passage"),
     ValueError, "default_prompt_name 'passage' is not one of its prompts"),
])
def test_folder_errors_name_the_file(st_model, tmp_path, file, change, exc, match):
    d = tmp_path / "m"
    shutil.copytree(st_model[2], d)
    _rewrite(d, file, change)
    with pytest.raises(exc, match=match):
        cyattn.encoder.load(d)


def test_include_prompt_false_refuses_a_prompt(st_model, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(st_model[2], d)
    _rewrite(d, "1_Pooling/config.json", lambda c: dict(c, include_prompt=False))
    enc = cyattn.encoder.load(d)
    enc.encode(["no prompt is fine"])
    with pytest.raises(ValueError, match="include_prompt false"):
        enc.encode(["x"], prompt_name="query")


def test_default_prompt_name_is_used(st_model, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(st_model[2], d)
    _rewrite(d, "config_sentence_transformers.json",
             lambda c: dict(c, default_prompt_name="query"))
    enc = cyattn.encoder.load(d)
    texts = _texts()[:5]
    np.testing.assert_array_equal(enc.encode(texts), enc.encode(texts, prompt_name="query"))
    check_close(enc.encode(texts), st_mod.SentenceTransformer(str(d), device="cpu")
                .encode(texts))


def test_embed_cli_with_a_prompt(st_model, tmp_path, capsys):
    from cyattn.__main__ import main
    _, _, folder = st_model
    src = tmp_path / "t.txt"
    texts = _texts()[:6]
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "e.npy"
    rc = main(["embed", str(src), "--model", str(folder), "--prompt-name", "query", "-o",
               str(out)])
    assert rc == 0, capsys.readouterr().err
    np.testing.assert_array_equal(np.load(out), cyattn.encoder.load(folder).encode(
        texts, prompt_name="query"))


def _modernbert_hub(cfg):
    cfg = {k: v for k, v in cfg.items() if k not in ("layer_types", "rope_parameters")}
    return dict(cfg, global_attn_every_n_layers=3, global_rope_theta=160000.0,
                local_rope_theta=10000.0)


def _qwen3_hub(cfg):
    cfg = {k: v for k, v in cfg.items() if k not in ("layer_types", "rope_parameters")}
    return dict(cfg, rope_theta=10000.0)


HUB_CONFIGS = {"modernbert": (_modernbert_hub, dict(local_rope_theta=20000.0)),
               "qwen3": (_qwen3_hub, dict(rope_theta=20000.0))}


def test_hub_config_format(st_model, tmp_path):
    """Configs on the hub predate transformers 5's layer_types and rope_parameters: ModernBERT
    gives global_attn_every_n_layers, global_rope_theta and local_rope_theta, Qwen3
    rope_theta (the same model here: the same bits; another theta: other bits)."""
    family, _, folder = st_model
    if family not in HUB_CONFIGS:
        pytest.skip("no other config format")
    legacy, other = HUB_CONFIGS[family]
    d = tmp_path / "m"
    shutil.copytree(folder, d)
    _rewrite(d, "config.json", legacy)
    texts = _texts()
    want = cyattn.encoder.load(folder).encode(texts)
    np.testing.assert_array_equal(cyattn.encoder.load(d).encode(texts), want)
    _rewrite(d, "config.json", lambda c: dict(c, **other))
    assert not np.array_equal(cyattn.encoder.load(d).encode(texts), want)


def test_bfloat16_weights(st_model, tmp_path):
    """A model saved in bfloat16 loads (widened exactly to float32): the same bits as the
    float32 folder holding the same rounded values, and sentence-transformers' result there."""
    import torch
    from safetensors.torch import load_file, save_file
    _, _, folder = st_model
    tensors = load_file(str(folder / "model.safetensors"))
    bf16, rounded = tmp_path / "bf16", tmp_path / "rounded"
    for d, dtype in ((bf16, torch.bfloat16), (rounded, torch.float32)):
        shutil.copytree(folder, d)
        save_file({k: v.to(torch.bfloat16).to(dtype).contiguous() for k, v in tensors.items()},
                  str(d / "model.safetensors"), metadata={"format": "pt"})
    texts = _texts()
    got = cyattn.encoder.load(bf16).encode(texts)
    np.testing.assert_array_equal(got, cyattn.encoder.load(rounded).encode(texts))
    check_close(got, st_mod.SentenceTransformer(str(rounded), device="cpu").encode(texts))


def test_a_text_without_tokens_is_refused(st_model, tmp_path):
    """A tokenizer without a post-processor adds no special tokens: "" has no token to pool."""
    d = tmp_path / "m"
    shutil.copytree(st_model[2], d)
    _rewrite(d, "tokenizer.json", lambda c: dict(c, post_processor=None))
    enc = cyattn.encoder.load(d)
    assert enc.encode(["ok"]).shape == (1, 32)
    with pytest.raises(ValueError, match=r"input 1 \(''\) has no tokens"):
        enc.encode(["ok", ""])
