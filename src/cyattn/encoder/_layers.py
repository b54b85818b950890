"""Layers shared by the rotary families of :mod:`cyattn.encoder` (ModernBERT, Qwen3).

- :func:`linear`: ``out (+)= a @ w`` on cyattn's packed GEMM (``linear="cyattn"``) or NumPy's
  BLAS, the one GEMM path of every family.
- :class:`Rotary`: rotary position tables (transformers' "default" rope: ``inv_freq =
  theta ** -(2i / D)`` in float32, angles ``position * inv_freq`` in float32, halves rotated as
  ``rotate_half``) and their application in place.
- :func:`padded_attention`: the packed ``(T, ...)`` projections of a batch scattered once
  into a ``(B, L, ...)`` layout, attended by ``cyattn.scaled_dot_product_attention`` on strided
  ``(B, heads, L, D)`` views with each text's length as its key and query length (keys past
  it are never read, rows past it not computed), a sliding ``window=``, ``is_causal`` and
  grouped-query heads (``enable_gqa``: K/V are read once per group, never repeated per head);
  the context goes back to packed rows.
- :func:`rms_norm`: RMSNorm rows (Qwen3).
"""
from __future__ import annotations

import numpy as np

import cyattn

from ..matmul import _matmul_packed, _PackedB

__all__ = ["Rotary", "linear", "padded_attention", "rms_norm"]


def linear(a, w, out, threads, accumulate=False):
    """``out = a @ w`` (or ``out += a @ w`` with ``accumulate``): ``w`` an (in, out) float32
    array, or the same packed for cyattn's GEMM (:class:`cyattn.matmul._PackedB`)."""
    if isinstance(w, _PackedB):
        if not accumulate:
            out[...] = 0.0
        _matmul_packed(a, w, out, threads)
    elif accumulate:
        out += a @ w
    else:
        np.matmul(a, w, out=out)
    return out


def rms_norm(x, weight, eps, out):
    """``out = x / sqrt(mean(x^2, last axis) + eps) * weight`` (float32, as transformers'
    RMSNorm computes it in float32)."""
    ms = np.einsum("...i,...i->...", x, x)[..., None]
    ms /= np.float32(x.shape[-1])
    ms += np.float32(eps)
    np.multiply(x, 1.0 / np.sqrt(ms), out=out)
    out *= weight
    return out


class Rotary:
    """Rotary position tables for head size ``D``, base ``theta``, positions ``0..n-1``."""

    __slots__ = ("cos", "sin", "half")

    def __init__(self, theta, D, n):
        inv = np.float32(1.0) / (np.float32(theta)
                                 ** (np.arange(0, D, 2, dtype=np.float32) / np.float32(D)))
        angles = np.arange(n, dtype=np.float32)[:, None] * inv[None, :]      # (n, D/2) float32
        self.cos = np.cos(angles)
        self.sin = np.sin(angles)
        self.half = D // 2
        self.cos.flags.writeable = False
        self.sin.flags.writeable = False

    def apply_(self, x, L, scratch):
        """Rotate ``x`` ``(B, L, heads, D)`` in place by the positions ``0..L-1`` of its rows;
        ``scratch``: a float32 array of ``x``'s shape, its first half of D used."""
        h = self.half
        cos = self.cos[:L, None, :]
        sin = self.sin[:L, None, :]
        x1, x2 = x[..., :h], x[..., h:]
        t = scratch[..., :h]
        np.multiply(x1, cos, out=t)
        t -= x2 * sin                      # x1 cos - x2 sin
        x2 *= cos
        x2 += x1 * sin                     # x2 cos + x1 sin
        x1[...] = t


def padded_attention(qkv, lengths, starts, heads, kv_heads, D, ctx, work, threads, *,
                     window=None, causal=False, prepare=None):
    """Attention of a packed batch: ``ctx (T, heads * D) = attention(q, k, v)``.

    ``qkv`` ``(T, (heads + 2 kv_heads) D)``: the packed projections, q then k then v. They are
    scattered into a ``(B, L, ...)`` buffer of the workspace (L the longest text), where
    ``prepare(q, k, L)`` may change q ``(B, L, heads, D)`` and k ``(B, L, kv_heads, D)`` in
    place (norms, rotary); rows past a text's length are zeros that are never read.
    """
    B = len(lengths)
    L = int(lengths.max())
    width = qkv.shape[1]
    pad = work.take("attn_pad", (B, L, width))
    for b in range(B):
        s, n = int(starts[b]), int(lengths[b])
        pad[b, :n] = qkv[s:s + n]
        pad[b, n:] = 0.0                   # never read; zeros keep the rotary finite
    per_head = pad.reshape(B, L, width // D, D)            # a view: pad is contiguous
    q = per_head[:, :, :heads]
    k = per_head[:, :, heads:heads + kv_heads]
    v = per_head[:, :, heads + kv_heads:]
    if prepare is not None:
        prepare(q, k, L)
    out = work.take("attn_out", (B, L, heads, D))
    n = lengths[:, None]
    cyattn.scaled_dot_product_attention(
        q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
        is_causal=causal, enable_gqa=kv_heads != heads, window=window, key_lengths=n,
        query_lengths=n, out=out.transpose(0, 2, 1, 3), n_threads=threads())
    for b in range(B):
        s, m = int(starts[b]), int(lengths[b])
        ctx[s:s + m] = out[b, :m].reshape(m, heads * D)
    return ctx
