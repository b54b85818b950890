"""Qwen3 embedding models on cyattn (``config.json`` model_type ``"qwen3"``):
Qwen3-Embedding-0.6B and the like.

A decoder used as an encoder: per layer (pre-norm RMSNorm, no biases),
``x += Wo attention(rotary(RMSNorm_q(Wq h)), rotary(RMSNorm_k(Wk h)), Wv h)`` with ``h =
RMSNorm(x)``, causal, grouped-query heads (``num_key_value_heads`` K/V heads, each read by its
group of query heads: cyattn's ``enable_gqa``, no K/V copied per head), then
``x += Wdown (SiLU(Wgate h) * Wup h)`` with ``h = RMSNorm(x)`` (SwiGLU); a final RMSNorm. The
sentence embedding is the last token's hidden state (the pooling config's ``lasttoken``; the
tokenizer appends ``<|endoftext|>``), and queries take an instruction prompt from
``config_sentence_transformers.json`` (``encode(prompt_name="query")``). Rotary, attention and
the GEMMs are :mod:`._layers`'.
"""
from __future__ import annotations

import numpy as np

from ._base import Encoder, check_choice
from ._layers import Rotary, linear, padded_attention, rms_norm

__all__ = ["Qwen3Encoder"]


def _rope_theta(d, cfg):
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise ValueError(f"model folder {d}: config.json rope_type {kind!r} is not implemented "
                         f"('default' only)")
    return float(params.get("rope_theta") or cfg.get("rope_theta") or 10000.0)


class Qwen3Encoder(Encoder):
    """Qwen3 (embedding): causal, GQA, q/k RMSNorm, rotary, SwiGLU. See
    :class:`cyattn.encoder.Encoder` for the parameters."""

    _WEIGHT_PREFIXES = ("model.",)
    _POSITIVE_KEYS = Encoder._POSITIVE_KEYS + ("num_key_value_heads",)

    @classmethod
    def _check_config(cls, d, cfg):
        check_choice(d, cfg, "hidden_act", "silu", ("silu",))
        if cfg.get("attention_bias"):
            raise ValueError(f"model folder {d}: config.json attention_bias true is not "
                             f"implemented")
        if cfg.get("use_sliding_window") or any(
                k != "full_attention" for k in cfg.get("layer_types") or ()):
            raise ValueError(f"model folder {d}: sliding-window layers (use_sliding_window, "
                             f"layer_types) are not implemented for qwen3")
        if cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
            raise ValueError(f"model folder {d}: num_attention_heads "
                             f"{cfg['num_attention_heads']} is not a multiple of "
                             f"num_key_value_heads {cfg['num_key_value_heads']}")
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        if head_dim % 2:
            raise ValueError(f"model folder {d}: head_dim {head_dim} must be even (rotary)")
        _rope_theta(d, cfg)
        return cfg["max_position_embeddings"]

    def _load_weights(self, cfg, w):
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        E, F, H, D = self.hidden, self.intermediate, self.heads, self.head_dim
        Hkv = self.kv_heads = int(cfg["num_key_value_heads"])
        vocab = int(cfg.get("vocab_size") or w.shape("embed_tokens.weight")[0])
        self.tok_emb = w.get("embed_tokens.weight", (vocab, E))
        self.final_norm = w.get("norm.weight", (E,))
        self.rotary = Rotary(_rope_theta(self.model_dir, cfg), D,
                             int(cfg["max_position_embeddings"]))
        self.layers = []
        for i in range(self.n_layers):
            p = f"layers.{i}."
            wq = w.get(p + "self_attn.q_proj.weight", (H * D, E))
            wk = w.get(p + "self_attn.k_proj.weight", (Hkv * D, E))
            wv = w.get(p + "self_attn.v_proj.weight", (Hkv * D, E))
            self.layers.append({
                "input_norm": w.get(p + "input_layernorm.weight", (E,)),
                "qkv_wT": np.ascontiguousarray(np.concatenate([wq, wk, wv]).T),
                "q_norm": w.get(p + "self_attn.q_norm.weight", (D,)),
                "k_norm": w.get(p + "self_attn.k_norm.weight", (D,)),
                "out_wT": np.ascontiguousarray(w.get(p + "self_attn.o_proj.weight",
                                                     (E, H * D)).T),
                "post_norm": w.get(p + "post_attention_layernorm.weight", (E,)),
                "gate_wT": np.ascontiguousarray(w.get(p + "mlp.gate_proj.weight", (F, E)).T),
                "up_wT": np.ascontiguousarray(w.get(p + "mlp.up_proj.weight", (F, E)).T),
                "down_wT": np.ascontiguousarray(w.get(p + "mlp.down_proj.weight", (E, F)).T),
            })

    def _globals(self):
        return (self.tok_emb, self.final_norm)

    def _hidden(self, ids, type_ids, lengths, starts, threads, clock, work):
        T = int(lengths.sum())
        B, L = len(ids), int(lengths.max())
        E, F, H, D, Hkv = self.hidden, self.intermediate, self.heads, self.head_dim, self.kv_heads
        eps = self.eps
        tokens = np.fromiter((t for seq in ids for t in seq), dtype=np.int64, count=T)
        x = work.take("x", (T, E))
        h = work.take("h", (T, E))
        qkv = work.take("qkv", (T, (H + 2 * Hkv) * D))
        ctx = work.take("ctx", (T, H * D))
        gate = work.take("ffn_gate", (T, F))
        up = work.take("ffn_mid", (T, F))
        scratch = work.take("rope", (B, L, H, D))
        rotary = self.rotary
        np.take(self.tok_emb, tokens, axis=0, out=x)
        clock("other")
        for lay in self.layers:
            rms_norm(x, lay["input_norm"], eps, h)
            clock("layernorm")
            linear(h, lay["qkv_wT"], qkv, threads())
            clock("linear")

            def prepare(q, k, n, lay=lay):
                rms_norm(q, lay["q_norm"], eps, q)
                rms_norm(k, lay["k_norm"], eps, k)
                rotary.apply_(q, n, scratch)
                rotary.apply_(k, n, scratch[:, :, :Hkv])

            padded_attention(qkv, lengths, starts, H, Hkv, D, ctx, work, threads, causal=True,
                             prepare=prepare)
            clock("attention")
            linear(ctx, lay["out_wT"], x, threads(), accumulate=True)
            rms_norm(x, lay["post_norm"], eps, h)
            clock("layernorm")
            linear(h, lay["gate_wT"], gate, threads())
            linear(h, lay["up_wT"], up, threads())
            clock("linear")
            up *= gate
            np.negative(gate, out=gate)        # SiLU(g) * u = g * u / (1 + exp(-g))
            np.exp(gate, out=gate)
            gate += np.float32(1.0)
            up /= gate
            clock("gelu")
            linear(up, lay["down_wT"], x, threads(), accumulate=True)
            clock("linear")
        rms_norm(x, self.final_norm, eps, x)
        clock("layernorm")
        return x
