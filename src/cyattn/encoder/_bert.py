"""BERT (and, by :mod:`._xlm_roberta`, RoBERTa and XLM-RoBERTa) on cyattn: ``model_type "bert"``.

A from-scratch forward pass of a sentence-transformers BERT model (e.g. all-MiniLM-L6-v2:
6 layers, hidden 384, 12 heads of 32, exact-erf GELU, post-LayerNorm), followed by the model's
pooling (mean, CLS or max over the real tokens) and L2 normalisation. Self-attention is
cyattn's: per run of equal-length texts without padding, or, for a batch of several lengths, one
ragged kernel call over all its (text, head) pairs with each text's length as its key and query
length (keys past it are never read, rows past it are not computed; no padded copy of the
projection).
Moved here from ``examples/minilm/embed.py`` (issue 25).

Weights come from ``model.safetensors`` only (``safetensors.numpy``; never a pickle file) and the
tokenizer from ``tokenizer.json`` (``tokenizers``); nothing is fetched from a model hub.

Layout of a batch. The dense layers (projections, FFN, LayerNorm, GELU) are row-wise, so they
run on the *packed* tokens of the batch (T = sum of the lengths, no padding rows). Like
sentence-transformers, the texts are sorted by length before batching, so a batch holds a few
runs of equal-length texts. A batch of one run attends on ``(texts, heads, n, head_dim)`` strided
views of the fused QKV projection, and cyattn writes the context straight into the packed rows
(no padding, no mask, no copy). A batch of several runs attends in one kernel call whose
(text, head) tasks read q/k/v in place from the packed projection by offsets; its context is
copied back to packed rows per text.

Speed (1 thread). Each GEMM runs on all T tokens of the batch: GEMMs are fastest at large M
(row blocks of 64-256 tokens, to keep the FFN activation in L2, made the dense layers 20-80%
slower: the weights are re-packed per block). GELU (with its bias) and LayerNorm are compiled
row passes of cyattn's kernels (``_encoder_rows.pxi``; 2x and 4.6x faster than the NumPy
passes they replaced, on a Zen 5 core), into buffers reused from batch to batch
(:class:`_Workspace`).

Linear layers use ``cyattn.matmul_accumulate``'s kernel (bias and residual are fused into its
``out +=``); it was measured against NumPy's BLAS (``x @ W.T``) on the model's shapes
(``bench/bench_minilm.py --linear``): the two tie per layer at 1 thread (170-195 GFLOP/s on a
SkylakeX-class core) and the encoder runs 3-7% faster with matmul_accumulate. The weights are
packed into the kernel's panels once, at load (``cyattn.matmul._PackedB``; the same bits as
packing per call): a one-text request multiplies a few rows by 42 MB of weights that come from
memory, and packing them per call cost more than the products (1.3-1.5x faster GEMMs there).
``linear="numpy"`` switches back to NumPy's BLAS.

Threads (the plan; ``python -m cyattn info --plan`` prints it for a call shape). ``encode``
runs ``lanes = min(n_threads, batches)`` batches at once, longest first, and shares the
threads among the lanes still running (:class:`_ThreadShares`): each lane's kernels get
``n_threads // lanes`` threads (the first lanes, with the longest batches, one more where they
do not divide evenly), and when a lane finds no batch left, its threads go to the lanes still
running at their next kernel. So batches run concurrently while there are enough of them,
and the threads then work inside the batches left (attention over (text, head) tasks, the
GEMMs over finer output tiles, GELU and LayerNorm over rows): 13 batches on 16 threads leave
no thread idle, and one 256-token batch beside two short ones is not left to one thread. One
batch (a request) has all the threads. The bits do not depend on any of it: each kernel's
result does not depend on its thread count, and the batches are the same.
"""
from __future__ import annotations

import math

import numpy as np

import cyattn

from .. import _backend, _validate
from ..matmul import _matmul_packed
# the shared machinery, importable from here as before the families were split out
from ._base import (Encoder, _ThreadShares, _Workspace, check_columns,  # noqa: F401
                    check_choice, check_heads, check_model_folder, default_model_dir)

__all__ = ["BertEncoder", "Encoder", "check_model_folder", "default_model_dir", "gelu_"]

# Exact GELU, x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)). With u = atanh(erf(x / sqrt 2)),
# Phi(x) = (1 + tanh u) / 2 = 1 / (1 + exp(-2u)), so GELU(x) = x / (1 + exp(-2 x P(x^2))) where
# x P(x^2) approximates u. P (degree 6) is a minimax fit, weighted by the sensitivity of the
# GELU output, on x in [0, 6.5] (u is odd). P has no real roots, so u keeps the sign of x and
# grows without bound: Phi saturates at 1 and 0 (GELU = x exactly for large positive x, -0 for
# large negative x); no clipping is needed. It runs in the kernels' row pass
# (_encoder_rows.pxi, with their exp, fused with the bias add). Max abs error of that float32
# evaluation against the exact GELU: 6.0e-7 over [-12, 12] (float32 rounding of x for
# |x| > 4), 3.6e-7 relative for |x| <= 1; PyTorch's own float32 GELU is within 1.2e-6. The 18
# NumPy passes it replaced (with NumPy's tanh: 5.5e-7 and 3.2e-7) cost 1.2 ns per element on a
# Zen 5 core, the row pass 0.6.
_GELU_P = np.array([
    1.7322632554748773e-09, -1.3128745243344574e-07, 3.95320964926667e-06,
    -5.527071363995472e-05, -3.247741681985323e-05, 0.03633248768773263,
    0.7978852916161274], dtype=np.float32)   # highest power first (Horner)
_GELU_P.flags.writeable = False


def gelu_(h):
    """In place exact GELU ``0.5 h (1 + erf(h / sqrt 2))`` of a C-contiguous float32 array.

    Evaluated by cyattn's compiled row kernel as ``h / (1 + exp(-2 h P(h^2)))`` with the
    minimax polynomial ``P`` above and the kernels' float32 exp (max abs error 6.0e-7 against
    the exact GELU on [-12, 12], 3.6e-7 relative for ``|h| <= 1``; Hendrycks & Gimpel,
    "Gaussian Error Linear Units", 2016, for the definition).

    Parameters
    ----------
    h : ndarray, float32, C-contiguous, any shape
        Overwritten with GELU(h).

    Returns
    -------
    ndarray
        ``h`` itself.

    Raises
    ------
    ValueError
        If ``h`` is not float32 or not C-contiguous, or is read-only.
    """
    if not isinstance(h, np.ndarray) or h.dtype != np.float32 or not h.flags.c_contiguous:
        raise ValueError(f"gelu_ needs a C-contiguous float32 array, got "
                         f"{getattr(h, 'dtype', type(h).__name__)} (contiguous: "
                         f"{getattr(getattr(h, 'flags', None), 'c_contiguous', False)})")
    if not h.flags.writeable:
        raise ValueError("gelu_ writes its argument in place, got a read-only array")
    _backend.kernels.gelu_rows(h.reshape(1, -1), None, _GELU_P, 1)
    return h


# Texts of 2-4 tokens attend one call per text. For L = S <= 4, cyattn's attention rounds a
# (G >= 2, heads, L, head_dim) call differently from the same text alone (by up to 7e-7 in its
# output; measured with cyattn at 8d80475, L = S = 5..39 are bit-identical), so a one-word
# text's embedding would depend on the batch around it (by ~1e-7). One call per text costs
# cyattn's per-call overhead only for such tiny texts.
_SHORT_RUN = 4


class BertEncoder(Encoder):
    """BERT (``config.json`` model_type ``"bert"``): learned absolute positions, token types,
    post-LayerNorm, exact-erf GELU. See :class:`cyattn.encoder.Encoder` for the parameters."""

    _WEIGHT_PREFIXES = ("bert.",)

    @classmethod
    def _position_offset(cls, cfg):
        """Row of the position table of a text's first token (BERT: 0)."""
        return 0

    @classmethod
    def _check_config(cls, d, cfg):
        check_choice(d, cfg, "hidden_act", "gelu", ("gelu",))        # exact erf
        check_choice(d, cfg, "position_embedding_type", "absolute", ("absolute",))
        check_heads(d, cfg)
        max_len = cfg["max_position_embeddings"] - cls._position_offset(cfg)
        if max_len < 1:
            raise ValueError(f"model folder {d}: max_position_embeddings "
                             f"{cfg['max_position_embeddings']} leaves no position after the "
                             f"offset {cls._position_offset(cfg)} (pad_token_id + 1)")
        return max_len

    def _load_weights(self, cfg, w):
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        E, F = self.hidden, self.intermediate
        vocab = cfg.get("vocab_size")
        if vocab is None and w.has("embeddings.word_embeddings.weight"):
            vocab = w.shape("embeddings.word_embeddings.weight")[0]
        self.word_emb = w.get("embeddings.word_embeddings.weight", (int(vocab or 0), E))
        n_pos = int(cfg["max_position_embeddings"])
        n_types = int(cfg.get("type_vocab_size", 2))
        # position + token type, added in one pass: (types, positions, E), the positions from
        # the offset of the first token on
        pos = w.get("embeddings.position_embeddings.weight", (n_pos, E))
        types = w.get("embeddings.token_type_embeddings.weight", (n_types, E))
        self.pos_type_emb = pos[None, self._position_offset(cfg):] + types[:, None]
        self.emb_ln = (w.get("embeddings.LayerNorm.weight", (E,)),
                       w.get("embeddings.LayerNorm.bias", (E,)))
        self.layers = []
        for i in range(self.n_layers):
            p = f"encoder.layer.{i}."
            wq, wk, wv = (w.get(p + f"attention.self.{n}.weight", (E, E))
                          for n in ("query", "key", "value"))
            bq, bk, bv = (w.get(p + f"attention.self.{n}.bias", (E,))
                          for n in ("query", "key", "value"))
            self.layers.append({
                # weights stored transposed, (in, out) C-contiguous: y = x @ wT + b
                "qkv_wT": np.ascontiguousarray(np.concatenate([wq, wk, wv]).T),
                "qkv_b": np.concatenate([bq, bk, bv]),
                "out_wT": np.ascontiguousarray(
                    w.get(p + "attention.output.dense.weight", (E, E)).T),
                "out_b": w.get(p + "attention.output.dense.bias", (E,)),
                "ln1": (w.get(p + "attention.output.LayerNorm.weight", (E,)),
                        w.get(p + "attention.output.LayerNorm.bias", (E,))),
                "ff1_wT": np.ascontiguousarray(
                    w.get(p + "intermediate.dense.weight", (F, E)).T),
                "ff1_b": w.get(p + "intermediate.dense.bias", (F,)),
                "ff2_wT": np.ascontiguousarray(w.get(p + "output.dense.weight", (E, F)).T),
                "ff2_b": w.get(p + "output.dense.bias", (E,)),
                "ln2": (w.get(p + "output.LayerNorm.weight", (E,)),
                        w.get(p + "output.LayerNorm.bias", (E,))),
            })

    def _globals(self):
        return (self.word_emb, self.pos_type_emb, *self.emb_ln)

    def _hidden(self, ids, type_ids, lengths, starts, threads, clock, work):
        B = len(ids)
        T = int(lengths.sum())
        L = int(lengths.max())
        H, D, E, F = self.heads, self.head_dim, self.hidden, self.intermediate
        tokens = np.fromiter((t for seq in ids for t in seq), dtype=np.int64, count=T)
        pos = np.arange(T, dtype=np.int64) - np.repeat(starts, lengths)
        # Attention layout. Consecutive texts of equal length (the sorted batches of encode())
        # form runs. A batch of one run (or of texts of at most _SHORT_RUN tokens) is one
        # cyattn call per run on (G, H, n, D) strided views of the packed projection, without
        # lengths, mask or copies. A batch of several runs is one kernel call over all its
        # (text, head) pairs ("ragged"): q, k and v are read in place from the packed
        # projection by per-pair offsets, each text's length is its key and query length (keys
        # past it are never read, rows past it are not computed), and the context goes to a
        # (B, L, H, D) buffer, copied back to the packed rows per text. One call keeps all
        # B x H tasks in one team (one call per run had G x H tasks each, too few to split:
        # the 7 runs of a 32-text request ran on one thread each), and nothing is copied in
        # (the padded layout it replaced copied every text's rows in and out, per layer).
        run_starts = [0] + [i for i in range(1, B) if lengths[i] != lengths[i - 1]]
        ragged = len(run_starts) > 1 and L > _SHORT_RUN

        # Buffers. x: hidden state of the packed tokens (no padding rows); qkv, ffn_mid, ctx,
        # proj: outputs of the QKV projection, the FFN's first layer, attention, and the
        # output projection or the FFN's second layer. ctx_pad, lse: the ragged call's context
        # (B * L rows) and its per-row scratch.
        x = work.take("x", (T, E))
        qkv = work.take("qkv", (T, 3 * E))
        ffn_mid = work.take("ffn_mid", (T, F))
        ctx = work.take("ctx", (T, E))
        proj = work.take("proj", (T, E))
        attention_calls = []
        if ragged:
            text = np.repeat(np.arange(B, dtype=np.int64), H)        # pair -> text
            head_col = np.tile(np.arange(H, dtype=np.int64) * D, B)   # pair -> head's column
            q_off = starts[text] * (3 * E) + head_col
            ragged_call = (q_off, q_off + E, q_off + 2 * E, text * (L * E) + head_col,
                           np.ascontiguousarray(lengths[text]))
            ctx_pad = work.take("ctx_pad", (B * L, E))
            lse = work.take("lse", (B * H, L))
            # each text's rows: (packed start, end, padded start, end); per-text slice copies
            # took half the time of one np.take over all rows (44 vs 100 us, 32 texts of 25-60)
            gather = [(int(s), int(s + n), b * L, b * L + int(n))
                      for b, (s, n) in enumerate(zip(starts, lengths))]
            # the kernel's work, as attention's own thread cap counts it (real lengths only)
            attn_work = H * int((lengths * lengths).sum()) * (2 * D + 8)
            scale = 1.0 / math.sqrt(D)
            no_mask = np.zeros(1, np.int64)
        else:
            for r, b in enumerate(run_starts):
                n = int(lengths[b])
                rows = slice(int(starts[b]),
                             int(starts[run_starts[r + 1]]) if r + 1 < len(run_starts) else T)
                heads = qkv[rows].reshape(-1, n, 3, H, D)
                q_k_v = [heads[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]
                out_view = ctx[rows].reshape(-1, n, H, D).transpose(0, 2, 1, 3)
                # texts of <= _SHORT_RUN tokens: one call each (see _SHORT_RUN)
                step = 1 if n <= _SHORT_RUN else out_view.shape[0]
                for g in range(0, out_view.shape[0], step):
                    attention_calls.append((*(a[g:g + step] for a in q_k_v),
                                            out_view[g:g + step]))
        # GEMMs run on all T tokens at once: BLAS is fastest at large M (row blocks of 256,
        # 128 and 64 tokens made the dense layers 20%, 45% and 80% slower: the weights are
        # re-read and re-packed per block).
        # The element-wise passes after a GEMM (GELU, LayerNorm) are the kernels' row passes
        # (_encoder_rows.pxi), split over rows across n_threads.
        kernels = _backend.kernels
        eps = float(self.eps)
        fused = self.linear == "cyattn"        # bias and residual go into matmul's out +=

        def dense(a, w_t, bias, out):
            """out = a @ w_t (+ bias when fused; otherwise the caller adds it)."""
            if fused:
                out[...] = bias
                _matmul_packed(a, w_t, out, threads())
            else:
                np.matmul(a, w_t, out=out)
            clock("linear")

        def dense_residual(a, w_t, bias):
            """proj = a @ w_t, or, fused, x += a @ w_t + bias."""
            if fused:
                np.add(x, bias, out=x)
                _matmul_packed(a, w_t, x, threads())
            else:
                np.matmul(a, w_t, out=proj)
            clock("linear")

        def norm_rows(bias, ln, add):
            """x = LayerNorm(x + proj + bias) (add=False: x already holds the sum)."""
            if add:
                np.add(proj, bias, out=proj)
                np.add(x, proj, out=x)
            kernels.layer_norm_rows(x, ln[0], ln[1], eps, threads())
            clock("layernorm")

        # embeddings: word + (position + token type 0), then LayerNorm
        np.take(self.word_emb, tokens, axis=0, out=x)
        if type_ids is None or self.pos_type_emb.shape[0] == 1:
            x += self.pos_type_emb[0][pos]
        else:                                  # a (text, text) pair: types 0 and 1
            types = np.fromiter((t for seq in type_ids for t in seq), dtype=np.int64, count=T)
            x += self.pos_type_emb[types, pos]
        clock("other")
        norm_rows(None, self.emb_ln, False)

        for lay in self.layers:
            dense(x, lay["qkv_wT"], lay["qkv_b"], qkv)
            if not fused:
                qkv += lay["qkv_b"]
            clock("other")
            if ragged:
                q_off, k_off, v_off, o_off, seq = ragged_call
                kernels.attention(qkv, q_off, 3 * E, 1, qkv, k_off, 3 * E, 1, qkv, v_off,
                                  3 * E, 1, None, 0, no_mask, 0, 0, ctx_pad, lse, L, L, D, D,
                                  scale, False, False, False,
                                  _validate.threads_for_work(threads(), attn_work, 1 << 18),
                                  -1, -1, 0.0, seq,
                                  seq, None, None, o_off=o_off, o_rs=E)
                clock("attention")
                for s0, s1, p0, p1 in gather:
                    ctx[s0:s1] = ctx_pad[p0:p1]
                clock("other")
            else:
                for q, k, v, out in attention_calls:
                    cyattn.scaled_dot_product_attention(q, k, v, out=out, n_threads=threads())
                clock("attention")
            dense_residual(ctx, lay["out_wT"], lay["out_b"])
            norm_rows(lay["out_b"], lay["ln1"], not fused)
            dense(x, lay["ff1_wT"], lay["ff1_b"], ffn_mid)
            kernels.gelu_rows(ffn_mid, None if fused else lay["ff1_b"], _GELU_P, threads())
            clock("gelu")
            dense_residual(ffn_mid, lay["ff2_wT"], lay["ff2_b"])
            norm_rows(lay["ff2_b"], lay["ln2"], not fused)

        return x
