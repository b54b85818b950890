"""cyattn.encoder's families (issue 48) against sentence-transformers (PyTorch, CPU).

For each family (BERT, XLM-RoBERTa, ModernBERT, Qwen3) a seeded random model of MiniLM's
size (6 layers, hidden 384, 12 heads of 32, FFN 1536; ModernBERT: local window 128 keys and
every third layer global; Qwen3: 8/2 heads of 64, FFN 1024) is saved with the tiny tokenizer
of ``tests/tiny_models.py`` into a temporary folder, with sentence-transformers' layout around
it. Both engines embed the same held mix of texts (``--texts`` texts of 5 to ``--max-words``
words, some long, batch 32) at 1 and 2 threads; rounds alternate between the engines and the
median of the rounds is reported (texts per second and the ratio).

    python bench/bench_encoder_families.py [--rounds 5] [--texts 256] [--threads 1 2]
        [--families bert xlm-roberta modernbert qwen3]

Needs: cyattn, safetensors, tokenizers, torch, transformers, sentence-transformers.
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import tiny_models  # noqa: E402

import cyattn.encoder  # noqa: E402

SIZE = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
            intermediate_size=1536, max_position_embeddings=512)
FAMILY_SIZE = {
    "xlm-roberta": dict(max_position_embeddings=514),
    "modernbert": dict(local_attention=128, num_hidden_layers=6, intermediate_size=1152,
                       max_position_embeddings=512),
    "qwen3": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                  num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                  max_position_embeddings=512),
}


def build(family, root):
    kw = FAMILY_SIZE[family] if family == "qwen3" else dict(SIZE, **FAMILY_SIZE.get(family, {}))
    tiny_models.save_model(root / "hf", family, seed=0, **kw)
    st = tiny_models.sentence_transformer(
        root / "hf", root / "st", pooling="lasttoken" if family == "qwen3" else "mean",
        max_seq_length=256)
    return st, cyattn.encoder.load(root / "st")


def texts(n, max_words, seed=0):
    rng = np.random.default_rng(seed)
    lengths = np.where(rng.random(n) < 0.1, rng.integers(max_words // 2, max_words, n),
                       rng.integers(5, 30, n))
    return [" ".join(rng.choice(tiny_models.WORDS, size=int(k))) for k in lengths]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--max-words", type=int, default=200)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--families", nargs="+",
                    default=["bert", "xlm-roberta", "modernbert", "qwen3"])
    args = ap.parse_args(argv)
    import torch
    data = texts(args.texts, args.max_words)
    print(f"{'family':12} {'threads':>7} {'cyattn/s':>10} {'st/s':>10} {'ratio':>7}  cosine")
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families:
            root = Path(tmp) / family
            st, enc = build(family, root)
            cos = None
            for n in args.threads:
                torch.set_num_threads(n)
                times = {"cyattn": [], "st": []}
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    got = enc.encode(data, 32, n_threads=n)
                    times["cyattn"].append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    want = st.encode(data, batch_size=32)
                    times["st"].append(time.perf_counter() - t0)
                if cos is None:
                    cos = float(((got * want).sum(1) / np.linalg.norm(got, axis=1)
                                 / np.linalg.norm(want, axis=1)).min())
                c, s = (len(data) / statistics.median(times[k]) for k in ("cyattn", "st"))
                print(f"{family:12} {n:>7} {c:>10.1f} {s:>10.1f} {c / s:>6.2f}x  {cos:.7f}",
                      flush=True)


if __name__ == "__main__":
    main()
