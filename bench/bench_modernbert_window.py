"""ModernBERT on 2,048-token texts: a sliding-window layer against a global one (issue 48).

Two one-layer ModernBERT models of gte-modernbert-base's width (hidden 768, 12 heads of 64,
GeGLU FFN 1152, ``local_attention`` 128, so ``window=(64, 64)``; seeded weights, the tiny
vocabulary of ``tests/tiny_models.py``), one whose layer is ``full_attention`` and one
``sliding_attention``, run ``Encoder.forward`` on the same batch of ``--batch`` texts of
``--tokens`` tokens, alternately, ``--rounds`` times per thread count. Reported (medians):

- the layer: the forward's time less its embedding LayerNorm and final LayerNorm (the
  encoder's own per-stage timings), global and windowed, and their ratio;
- its stages: the GEMMs ("linear": Wqkv, Wo, Wi, Wo_mlp), "attention" (the scatter into the
  padded layout, the rotary and the attention call), GELU and LayerNorm;
- attention alone: ``cyattn.scaled_dot_product_attention`` on (batch, 12, tokens, 64) with and
  without ``window=(64, 64)``.

    python bench/bench_modernbert_window.py [--tokens 2048] [--batch 1] [--rounds 7]
        [--threads 1 2]

Needs: cyattn, safetensors, tokenizers, torch and transformers (to write the seeded models).
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import tiny_models  # noqa: E402

import cyattn  # noqa: E402
import cyattn.encoder  # noqa: E402

WIDTH = dict(hidden_size=768, num_hidden_layers=1, num_attention_heads=12,
             intermediate_size=1152, local_attention=128, max_position_embeddings=8192)


def build(root, kind):
    tiny_models.save_model(root / kind / "hf", "modernbert", seed=0, layer_types=[kind], **WIDTH)
    tiny_models.sentence_transformer(root / kind / "hf", root / kind / "st",
                                     max_seq_length=8192)
    return cyattn.encoder.load(root / kind / "st")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args(argv)
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        enc = {kind: build(Path(tmp), kind) for kind in ("full_attention", "sliding_attention")}
    assert enc["full_attention"].local == [False] and enc["sliding_attention"].local == [True]
    rng = np.random.default_rng(0)
    vocab = enc["full_attention"].tok_emb.shape[0]
    ids = [[2] + rng.integers(5, vocab, args.tokens - 2).tolist() + [3]
           for _ in range(args.batch)]
    B, H, L, D = args.batch, 12, args.tokens, 64
    q, k, v = (rng.standard_normal((B, H, L, D), dtype=np.float32) for _ in range(3))
    print(f"cyattn {cyattn.__version__} ({cyattn.config()['variant']}); {B} x {L} tokens, "
          f"hidden 768, 12 heads of 64, window (64, 64); medians of {args.rounds} rounds, ms")
    print(f"{'thr':>3} {'global layer':>12} {'window layer':>12} {'ratio':>6}   "
          f"{'linear':>13} {'attention':>15} {'gelu+ln':>13}   {'attn alone':>15} {'ratio':>6}")
    for n in args.threads:
        t = {kind: [] for kind in enc}
        stages = {kind: [] for kind in enc}
        alone = {False: [], True: []}
        for e in enc.values():             # warm-up
            e.forward(ids, n)
        for _ in range(args.rounds):
            for kind, e in enc.items():
                timings = {}
                e.forward(ids, n, timings)
                # the layer: all stages but the embedding and final LayerNorms, timed apart
                t0 = time.perf_counter()
                x = np.empty((B * L, 768), np.float32)
                for _ in range(2):
                    x[...] = 1.0
                    cyattn._backend.kernels.layer_norm_rows(x, *e.emb_norm, e.eps, n)
                norms = time.perf_counter() - t0
                stages[kind].append(timings)
                t[kind].append(sum(v for s, v in timings.items() if s != "other") - norms)
            for windowed in (False, True):
                t0 = time.perf_counter()
                cyattn.scaled_dot_product_attention(q, k, v, window=(64, 64) if windowed
                                                    else None, n_threads=n)
                alone[windowed].append(time.perf_counter() - t0)
            load.append(os.getloadavg()[0])

        def med(kind, *names, stages=stages):
            return 1e3 * statistics.median(sum(s.get(x, 0.0) for x in names)
                                           for s in stages[kind])

        g, w = (1e3 * statistics.median(t[k]) for k in enc)
        ag, aw = (1e3 * statistics.median(alone[x]) for x in (False, True))
        cols = [f"{med('full_attention', *s):.1f}/{med('sliding_attention', *s):.1f}"
                for s in (("linear",), ("attention",), ("gelu", "layernorm"))]
        print(f"{n:>3} {g:>12.1f} {w:>12.1f} {w / g:>5.2f}x   {cols[0]:>13} {cols[1]:>15} "
              f"{cols[2]:>13}   {f'{ag:.1f}/{aw:.1f}':>15} {aw / ag:>5.2f}x", flush=True)
    print(f"(stage columns: global/windowed; load average (1 min) {min(load):.1f}-"
          f"{max(load):.1f})")


if __name__ == "__main__":
    main()
