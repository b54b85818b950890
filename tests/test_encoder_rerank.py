"""cyattn.encoder.load_reranker (issue 48): cross-encoders against transformers' own
AutoModelForSequenceClassification forward and sentence-transformers' CrossEncoder, on seeded
tiny BERT and XLM-RoBERTa classifiers saved with a tokenizer built in a temporary folder (no
model hub); and the ``rerank`` command."""
import json
import sys

import numpy as np
import pytest

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import tiny_models

import cyattn.encoder

MAX_ABS_DIFF = 2e-6      # scores (sigmoid of logits of order 1) in float32


def _pairs():
    """Queries with passages of mixed lengths, a pair longer than max_length, an empty one."""
    texts = tiny_models.texts(16, seed=5)
    pairs = [(texts[i % 4], texts[i]) for i in range(len(texts))]
    return pairs + [("why", " ".join(tiny_models.WORDS * 5)), ("", "")]


@pytest.fixture(scope="module", params=[("bert", 1), ("xlm-roberta", 1), ("bert", 3)],
                ids=["bert", "xlm-roberta", "bert-3-labels"])
def classifier(request, tmp_path_factory):
    """(torch model, HF tokenizer, folder) of a seeded tiny sequence classifier."""
    from transformers import AutoTokenizer
    family, labels = request.param
    folder = tmp_path_factory.mktemp(family)
    model = tiny_models.save_model(folder, family, seed=7, head="classification",
                                   num_labels=labels)
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.model_max_length = model.config.max_position_embeddings - (
        2 if family == "xlm-roberta" else 0)
    return model, tok, folder


def _reference_logits(model, tok, pairs, max_length):
    enc = tok([p[0] for p in pairs], [p[1] for p in pairs], padding=True, truncation=True,
              max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        return model(**enc).logits.numpy()


def test_predict_matches_transformers(classifier):
    model, tok, folder = classifier
    ranker = cyattn.encoder.load_reranker(folder)
    assert ranker.num_labels == model.config.num_labels
    pairs = _pairs()
    logits = _reference_logits(model, tok, pairs, ranker.max_length)
    want = 1 / (1 + np.exp(-logits[:, 0])) if ranker.num_labels == 1 else logits
    assert ranker.activation == ("sigmoid" if ranker.num_labels == 1 else "identity")
    got = ranker.predict(pairs, batch_size=5, n_threads=2)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=MAX_ABS_DIFF)
    # one pair alone: the same score as in the padded batch
    np.testing.assert_allclose(ranker.predict(pairs[3], n_threads=1), got[3], rtol=0,
                               atol=1e-6)


def test_matches_sentence_transformers_cross_encoder(classifier):
    st_mod = pytest.importorskip("sentence_transformers")
    model, _, folder = classifier
    ce = st_mod.CrossEncoder(str(folder), device="cpu",
                             max_length=cyattn.encoder.load_reranker(folder).max_length)
    ranker = cyattn.encoder.load_reranker(folder)
    pairs = _pairs()
    np.testing.assert_allclose(ranker.predict(pairs), ce.predict(pairs), rtol=0,
                               atol=MAX_ABS_DIFF)
    if ranker.num_labels > 1:
        np.testing.assert_allclose(ranker.predict(pairs, apply_softmax=True),
                                   ce.predict(pairs, apply_softmax=True), rtol=0,
                                   atol=MAX_ABS_DIFF)
        with pytest.raises(ValueError, match="one-label model"):
            ranker.rank("q", ["a"])
        return
    query, docs = "printer offline", [p[1] for p in pairs]
    want = ce.rank(query, docs, top_k=5, return_documents=True)
    got = ranker.rerank(query, docs, top_k=5, return_documents=True)
    assert [r["corpus_id"] for r in got] == [r["corpus_id"] for r in want]
    assert [r["text"] for r in got] == [r["text"] for r in want]
    np.testing.assert_allclose([r["score"] for r in got], [r["score"] for r in want],
                               rtol=0, atol=MAX_ABS_DIFF)
    assert len(ranker.rank(query, docs)) == len(docs)


@pytest.mark.parametrize("call, exc, match", [
    (lambda r: r.predict("text"), TypeError, "pairs must be a sequence"),
    (lambda r: r.predict([("a", "b"), ("c", None)]), TypeError, r"pairs\[1\] is \('c', None\)"),
    (lambda r: r.predict([("a", "b")], batch_size=0), ValueError, "batch_size must be >= 1"),
    (lambda r: r.rank(3, ["a"]), TypeError, "query must be a str, got int"),
    (lambda r: r.rank("q", ["a"], top_k=0), ValueError, "top_k must be >= 1, got 0"),
    (lambda r: r.rank("q", "abc"), TypeError, "documents must be a sequence of str"),
])
def test_bad_arguments(classifier, call, exc, match):
    if classifier[0].config.num_labels != 1:
        pytest.skip("one model is enough")
    with pytest.raises(exc, match=match):
        call(cyattn.encoder.load_reranker(classifier[2]))


def test_an_embedding_model_is_not_a_reranker(tmp_path):
    tiny_models.save_model(tmp_path, "bert")
    with pytest.raises(ValueError, match=r"architectures \['BertModel'\] has no cross-encoder"):
        cyattn.encoder.load_reranker(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(architectures=["BertForSequenceClassification"],
               sentence_transformers={"activation_fn": "my.module.Swish"})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="activation_fn 'my.module.Swish' is not implemented"):
        cyattn.encoder.load_reranker(tmp_path)
    cfg["sentence_transformers"]["activation_fn"] = "torch.nn.modules.activation.Sigmoid"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="no tensor 'bert.pooler.dense.weight'"):
        cyattn.encoder.load_reranker(tmp_path)


def test_rerank_cli(classifier, tmp_path, capsys):
    from cyattn.__main__ import main
    model, _, folder = classifier
    if model.config.num_labels != 1:
        pytest.skip("rank needs one label")
    docs = [p[1] for p in _pairs()[:6]]
    src = tmp_path / "docs.txt"
    src.write_text("\n".join(docs) + "\n", encoding="utf-8")
    out = tmp_path / "ranked.jsonl"
    capsys.readouterr()
    rc = main(["rerank", "--model", str(folder), "--query", "printer offline", str(src),
               "-o", str(out), "--top-k", "4"])
    assert rc == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    want = cyattn.encoder.load_reranker(folder).rank("printer offline", docs, top_k=4,
                                                     return_documents=True)
    assert rows == want
    rc = main(["rerank", "--model", str(tmp_path), "--query", "q", str(src)])
    assert rc == 1 and "model.safetensors" in capsys.readouterr().err
    assert sys.modules.get("cyattn.encoder._reranker") is not None
