"""ModernBERT on cyattn (``config.json`` model_type ``"modernbert"``): gte-modernbert-base,
modernbert-embed-base.

Per layer (pre-norm, no biases): ``x += Wo attention(rotary(Wqkv LN(x)))`` (layer 0 without
the LayerNorm), then ``x += Wo_mlp (GELU(a) * g)`` with ``[a | g] = Wi LN(x)`` (GeGLU); a
LayerNorm after the embeddings and a final one. Every ``global_attn_every_n_layers``-th layer
(from layer 0; or config.json's ``layer_types``) attends globally with rotary base
``global_rope_theta``; the others attend to the keys within ``local_attention // 2`` on each
side (transformers' ``|i - j| <= sliding_window``), cyattn's ``window=(W, W)``: key blocks
outside every row's window are never computed, with base ``local_rope_theta``. The LayerNorm
and GELU row passes are BERT's kernels (:mod:`._bert`); attention, rotary and the GEMMs are
:mod:`._layers`'.
"""
from __future__ import annotations

import numpy as np

from .. import _backend
from ._base import Encoder, check_choice, check_heads
from ._bert import _GELU_P
from ._layers import Rotary, linear, padded_attention

__all__ = ["ModernBertEncoder"]


def _layer_kinds(d, cfg):
    """Per layer: True for a sliding-window ("local") layer."""
    kinds = cfg.get("layer_types")
    n = cfg["num_hidden_layers"]
    if kinds is None:
        every = cfg.get("global_attn_every_n_layers", 3)
        return [bool(i % every) for i in range(n)]
    if len(kinds) != n or any(k not in ("sliding_attention", "full_attention") for k in kinds):
        raise ValueError(f"model folder {d}: config.json layer_types must list "
                         f"'sliding_attention' or 'full_attention' for each of the {n} layers, "
                         f"got {kinds!r}")
    return [k == "sliding_attention" for k in kinds]


def _rope_theta(d, cfg, kind):
    """Rotary base of the "full_attention" or "sliding_attention" layers."""
    params = (cfg.get("rope_parameters") or {}).get(kind) or {}
    if params.get("rope_type", "default") != "default":
        raise ValueError(f"model folder {d}: config.json rope_parameters {kind} rope_type "
                         f"{params['rope_type']!r} is not implemented ('default' only)")
    legacy = cfg.get("global_rope_theta" if kind == "full_attention" else "local_rope_theta")
    return float(params.get("rope_theta") or legacy
                 or (160000.0 if kind == "full_attention" else 10000.0))


class ModernBertEncoder(Encoder):
    """ModernBERT: rotary positions, GeGLU, pre-norm, no biases, global and sliding-window
    layers. See :class:`cyattn.encoder.Encoder` for the parameters."""

    _WEIGHT_PREFIXES = ("model.",)
    _POSITIVE_KEYS = Encoder._POSITIVE_KEYS + ("local_attention",)

    @classmethod
    def _check_config(cls, d, cfg):
        check_choice(d, cfg, "hidden_activation", "gelu", ("gelu",))   # exact erf
        for key in ("attention_bias", "mlp_bias"):
            if cfg.get(key):
                raise ValueError(f"model folder {d}: config.json {key} true is not "
                                 f"implemented (ModernBERT's layers have no biases)")
        check_heads(d, cfg)
        _layer_kinds(d, cfg)
        for kind in ("full_attention", "sliding_attention"):
            _rope_theta(d, cfg, kind)
        return cfg["max_position_embeddings"]

    def _load_weights(self, cfg, w):
        d = self.model_dir
        self.eps = float(cfg.get("norm_eps", 1e-5))
        E, F, D = self.hidden, self.intermediate, self.head_dim
        bias = bool(cfg.get("norm_bias", False))

        def norm(name):
            return (w.get(name + ".weight", (E,)),
                    w.get(name + ".bias", (E,)) if bias else np.zeros(E, np.float32))

        vocab = int(cfg.get("vocab_size") or w.shape("embeddings.tok_embeddings.weight")[0])
        self.tok_emb = w.get("embeddings.tok_embeddings.weight", (vocab, E))
        self.emb_norm = norm("embeddings.norm")
        self.final_norm = norm("final_norm")
        self.local = _layer_kinds(d, cfg)
        self.half_window = int(cfg["local_attention"]) // 2
        n = int(cfg["max_position_embeddings"])
        self.rotary = {local: Rotary(_rope_theta(d, cfg, kind), D, n)
                       for local, kind in ((False, "full_attention"),
                                           (True, "sliding_attention"))}
        self.layers = []
        for i in range(self.n_layers):
            p = f"layers.{i}."
            wi = w.get(p + "mlp.Wi.weight", (2 * F, E))
            lay = {
                "qkv_wT": np.ascontiguousarray(w.get(p + "attn.Wqkv.weight", (3 * E, E)).T),
                "out_wT": np.ascontiguousarray(w.get(p + "attn.Wo.weight", (E, E)).T),
                "mlp_norm": norm(p + "mlp_norm"),
                "in_wT": np.ascontiguousarray(wi[:F].T),       # GeGLU: GELU(input) * gate
                "gate_wT": np.ascontiguousarray(wi[F:].T),
                "down_wT": np.ascontiguousarray(w.get(p + "mlp.Wo.weight", (E, F)).T),
            }
            if i > 0:                          # layer 0 has no attention norm
                lay["attn_norm"] = norm(p + "attn_norm")
            self.layers.append(lay)

    def _globals(self):
        return (self.tok_emb, *self.emb_norm, *self.final_norm)

    def _hidden(self, ids, type_ids, lengths, starts, threads, clock, work):
        kernels = _backend.kernels
        T = int(lengths.sum())
        B, L = len(ids), int(lengths.max())
        E, F, H, D = self.hidden, self.intermediate, self.heads, self.head_dim
        eps = self.eps
        tokens = np.fromiter((t for seq in ids for t in seq), dtype=np.int64, count=T)
        x = work.take("x", (T, E))
        h = work.take("h", (T, E))
        qkv = work.take("qkv", (T, 3 * E))
        ctx = work.take("ctx", (T, E))
        mid = work.take("ffn_mid", (T, F))
        gate = work.take("ffn_gate", (T, F))
        scratch = work.take("rope", (B, L, H, D))
        np.take(self.tok_emb, tokens, axis=0, out=x)
        kernels.layer_norm_rows(x, *self.emb_norm, eps, threads())
        clock("layernorm")
        for lay, local in zip(self.layers, self.local):
            src = x
            if "attn_norm" in lay:
                src = h
                np.copyto(h, x)
                kernels.layer_norm_rows(h, *lay["attn_norm"], eps, threads())
                clock("layernorm")
            linear(src, lay["qkv_wT"], qkv, threads())
            clock("linear")
            rotary = self.rotary[local]

            def prepare(q, k, n, rotary=rotary):
                rotary.apply_(q, n, scratch)
                rotary.apply_(k, n, scratch)

            padded_attention(qkv, lengths, starts, H, H, D, ctx, work, threads,
                             window=(self.half_window, self.half_window) if local else None,
                             prepare=prepare)
            clock("attention")
            linear(ctx, lay["out_wT"], x, threads(), accumulate=True)
            np.copyto(h, x)
            kernels.layer_norm_rows(h, *lay["mlp_norm"], eps, threads())
            clock("layernorm")
            linear(h, lay["in_wT"], mid, threads())
            linear(h, lay["gate_wT"], gate, threads())
            clock("linear")
            kernels.gelu_rows(mid, None, _GELU_P, threads())
            mid *= gate
            clock("gelu")
            linear(mid, lay["down_wT"], x, threads(), accumulate=True)
            clock("linear")
        kernels.layer_norm_rows(x, *self.final_norm, eps, threads())
        clock("layernorm")
        return x
