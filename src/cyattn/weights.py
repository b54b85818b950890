"""Attention weights ``softmax(scale * Q K^T + mask)``, as scaled_dot_product_attention uses them.

The weights are formed in three steps on the compiled kernels, in one (..., L, S) buffer of the
compute dtype (no float64 detour):

1. scores: ``scale * Q K^T`` by the GEMM kernel of :func:`cyattn.matmul_accumulate`;
2. the bias/mask step (:func:`_apply_variants`), per batch entry: softcap and ALiBi, the float
   mask, then every "take part" rule (bool mask, causal, window, lengths) writes ``-inf`` where
   a key is removed, so a removed score is never read, whatever it held (NaN from a NaN key,
   ``-inf + inf``);
3. the row softmax kernel of :func:`cyattn.softmax`, in place: ``-inf`` positions get exactly
   0, a row with no finite score is all 0.
"""
import math

import numpy as np

from . import _backend
from . import _validate as V

__all__ = ["attention_weights"]

_FNAME = "cyattn.attention_weights"


def attention_weights(query, key, attn_mask=None, is_causal=False, scale=None, *,
                      causal_alignment="top_left", enable_gqa=False, out=None, n_threads=None,
                      window=None, softcap=None, sinks=None, alibi_slopes=None,
                      key_lengths=None, query_lengths=None):
    r"""Attention weights ``softmax(scale * query @ key^T + mask)``, shape (..., L, S).

    The weights :func:`cyattn.scaled_dot_product_attention` multiplies ``value`` by, with the
    same arguments and rules: ``attention_weights(q, k, m, ...) @ v`` equals
    ``scaled_dot_product_attention(q, k, v, m, ...)`` to rounding.

    Parameters
    ----------
    query : array_like of float, shape (..., L, E)
    key : array_like of float, shape (..., S, E)
        Batch dimensions broadcast like :func:`numpy.matmul`. float32 and float64 are computed
        natively, float16 and bfloat16 in float32 (returned in their dtype); mixed float
        dtypes promote with ``np.result_type`` (bfloat16 with float16 gives float32).
    attn_mask : array_like of bool or float, optional
        Broadcastable to ``(..., L, S)`` without enlarging the result. **bool**: True = the
        query may attend to the key; a False position gets weight exactly 0 and its score is
        never read. **float**: added to the scaled scores (cast to the compute dtype; finite
        values beyond its range saturate); ``-inf`` removes a position, ``-1e9`` only shifts
        it. Integer masks raise TypeError.
    is_causal : bool, optional
        Restrict query ``i`` to keys ``j <= i`` (``"top_left"``) or ``j <= i + S - L``
        (``"bottom_right"``). Composes with ``attn_mask`` by AND.
    scale : float, optional
        Multiplies ``query @ key^T`` (never the mask). Default ``1 / sqrt(E)`` (1.0 when
        E = 0); an explicit value, including 0.0, is honoured.
    causal_alignment : {"top_left", "bottom_right"}, keyword-only
        Alignment of the causal diagonal when L != S (as in scaled_dot_product_attention).
    enable_gqa : bool, keyword-only
        Grouped-query attention: the head dimension (axis -3) of ``key`` may divide the
        query's; query head ``h`` uses key head ``h // (Hq // Hkv)``.
    out : ndarray, keyword-only, optional
        Writable array of shape ``(..., L, S)`` and the result dtype; any strides.
    n_threads : int, keyword-only, optional
        OpenMP threads: None for the default, a positive count, or negative to count back from
        the maximum (-1 = all).
    window, softcap, sinks, alibi_slopes, key_lengths, query_lengths : keyword-only, optional
        The attention variants, exactly as in :func:`cyattn.scaled_dot_product_attention`
        (see there): a window, key lengths and ``is_causal`` remove keys, rows at or past a
        query length are all 0, the softcap and ALiBi transform the scores before the masks,
        and a sink takes its share ``exp(sink - lse)`` of each row's weight (a NaN sink makes
        every row of its head NaN, also one with no permitted key).

    Returns
    -------
    weights : ndarray, shape (..., L, S)
        Dtype float32/float64 as the promoted inputs (float16/bfloat16 for those). Removed positions
        are exactly 0; each row with a permitted finite score sums to 1 (up to rounding;
        ``1 - exp(sink - lse)`` with a sink); a fully masked row is all 0.

    Raises
    ------
    TypeError
        If ``query`` or ``key`` is not a float array, the mask is an integer (or other
        non-bool, non-float) array, ``scale`` is not a real number, ``is_causal`` or
        ``enable_gqa`` is not a bool, ``n_threads`` is not an int, or a variant argument has
        the wrong type (as in scaled_dot_product_attention).
    ValueError
        If an input has fewer than 2 dimensions, E differs between ``query`` and ``key``, the
        batch dimensions do not broadcast (or, with ``enable_gqa``, the query heads are not a
        multiple of the key heads), the mask does not broadcast to ``(..., L, S)`` without
        enlarging it, ``causal_alignment`` is unknown, ``out`` is not a writable ndarray of
        the result shape and dtype, ``n_threads == 0``, or a variant argument has a bad value
        or shape (as in scaled_dot_product_attention). A call that raises leaves ``out``
        untouched.
    MemoryError
        If NumPy cannot allocate the (..., L, S) result.

    Notes
    -----
    Unlike scaled_dot_product_attention, which never forms the L x S scores, this function
    materialises them: memory grows as ``batch x L x S``. Use it to inspect attention (see
    :mod:`cyattn.plot`), not in a model's forward pass. A weight says how much a query row
    drew on a key's value in this layer; it is a diagnostic of what attention did (is the
    padding removed, is the causal mask aligned as intended), not an explanation of a
    prediction: a high weight is not a cause.

    A row with no permitted key (bool mask all False, causal, ``S = 0``, or every score
    ``-inf``) is fully masked: its weights are 0, never NaN, without a warning. A NaN or
    ``+inf`` score in a permitted position makes that row NaN.

    The scores come from the blocked GEMM kernel (threads split output tiles only) and the
    row softmax kernel (threads split rows), so the result is bit-identical for any thread
    count; the GIL is released while they run.

    Source: Vaswani et al., "Attention Is All You Need", NeurIPS 2017 (eq. 1). The masking and
    fully-masked-row semantics follow PyTorch >= 2.5 ``scaled_dot_product_attention``.

    Examples
    --------
    >>> import numpy as np, cyattn
    >>> q = np.array([[1.0]]); k = np.array([[2.0], [1.0], [0.0]])
    >>> cyattn.attention_weights(q, k, scale=1.0).round(3)
    array([[0.665, 0.245, 0.09 ]])
    >>> cyattn.attention_weights(np.ones((2, 1)), np.ones((3, 1)), is_causal=True,
    ...                          causal_alignment="bottom_right").round(3)
    array([[0.5  , 0.5  , 0.   ],
           [0.333, 0.333, 0.333]])
    """
    c = V.describe_attention(_FNAME, query, key, None, attn_mask, is_causal, scale,
                             causal_alignment, enable_gqa, out, n_threads, window=window,
                             softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes,
                             key_lengths=key_lengths, query_lengths=query_lengths)
    query, key, compute, variants = c.query, c.key, c.compute, c.variants
    shape = c.batch + (c.L, c.S)
    if out is not None and V.writes_in_place(out, compute, (query, key, attn_mask)):
        scores = out
        scores.fill(0)
    else:
        scores = np.zeros(shape, dtype=compute)
    if scores.size:
        _scores(scores, query, key, c.batch, c.group, c.scale, c.n_threads)
        lse = _apply_variants(scores, c.mask.view(np.bool_) if c.mask_kind == 1 else None,
                              c.mask if c.mask_kind == 2 else None, c.is_causal,
                              c.bottom_right, variants)
        _softmax_rows(scores, c.n_threads)
        if lse is not None:
            _sink_shares(scores, lse, variants.sinks)
    if out is not None:
        if scores is not out:
            V.copy_result(out, scores)
        return out
    return V.to_result(scores, c.result)


def _scores(scores, query, key, batch, group, scale, n_threads):
    """``scores += scale * query @ key^T`` on the GEMM kernel (``scores`` holds zeros, is
    C-contiguous and of the compute dtype; E = 0 leaves the zeros)."""
    L, E = query.shape[-2:]
    S = key.shape[-2]
    if E == 0:
        return
    query = V.kernel_ready(query, scores.dtype)
    key_t = np.swapaxes(V.kernel_ready(key, scores.dtype), -1, -2)        # (..., E, S) view
    item = scores.itemsize
    count = math.prod(batch)
    _backend.kernels.matmul_accumulate(
        query, V.batch_offsets(query, batch), query.strides[-2] // item,
        query.strides[-1] // item,
        key_t, V.batch_offsets(key_t, batch, group), key_t.strides[-2] // item,
        key_t.strides[-1] // item,
        scores, V.batch_offsets(scores, batch), S, 1, L, S, E, scale,
        V.threads_for_work(n_threads, count * L * S * E, 1 << 18))


def _apply_variants(scores, keep, bias, is_causal, bottom_right, var):
    """The score transforms and every "take part" rule of SDPA's kernels, in place on the
    scaled scores (..., L, S), one batch entry at a time (the same order as the kernels:
    softcap, ALiBi, float mask, then the removals). Returns the lse of each row, (batch, L)
    float64, when there are sinks (their share is taken after the softmax), else None."""
    L, S = scores.shape[-2:]
    flat = scores.reshape(-1, L, S)
    dtype = scores.dtype.type
    if var.softcap > 0:
        c = dtype(var.softcap)
        flat *= dtype(1) / c
        rows = flat.reshape(-1)
        _backend.kernels.tanh_values(rows, rows)          # the kernels' own tanh
        flat *= c
    if bias is not None:
        bias = np.broadcast_to(bias, scores.shape).reshape(-1, L, S)
    if keep is not None:
        keep = np.broadcast_to(keep, scores.shape).reshape(-1, L, S)
    i = np.arange(L)[:, None]
    j = np.arange(S)[None, :]
    lse = np.empty((flat.shape[0], L)) if var.sinks is not None else None
    for b in range(flat.shape[0]):
        entry = flat[b]
        k_len = S if var.key_lengths is None else min(int(var.key_lengths[b]), S)
        q_len = L if var.query_lengths is None else min(int(var.query_lengths[b]), L)
        pos = i + (k_len - q_len if bottom_right else 0)    # aligned position p(i)
        if var.slopes is not None:
            entry -= dtype(var.slopes[b]) * np.abs(pos - j).astype(scores.dtype)
        if bias is not None:
            entry += bias[b]
        removed = (j >= k_len) | (i >= q_len)
        if is_causal:
            removed = removed | (j > pos)
        if var.left >= 0:
            removed = removed | (j < pos - var.left)
        if var.right >= 0:
            removed = removed | (j > pos + var.right)
        if keep is not None:
            removed = removed | ~keep[b]
        np.copyto(entry, -np.inf, where=removed)
        if lse is not None and np.isnan(var.sinks[b]):
            entry[:q_len] = np.nan      # a NaN sink makes its rows NaN, also those with no key
        if lse is not None:
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                m = entry.max(axis=-1, initial=-np.inf).astype(np.float64)
                shift = np.where(np.isfinite(m), m, 0.0)
                lse[b] = shift + np.log(np.exp(entry - shift[:, None]).sum(axis=-1))
    return lse


def _sink_shares(weights, lse, sinks):
    """Scale each row's weights by its share left by the sink: 1 / (1 + exp(sink - lse))
    (0 for an infinite sink, 1 for a -inf one); rows with no permitted key stay 0 (but a NaN
    sink has made its rows NaN in _apply_variants)."""
    L, S = weights.shape[-2:]
    flat = weights.reshape(-1, L, S)
    with np.errstate(over="ignore", invalid="ignore"):
        share = 1.0 / (1.0 + np.exp(sinks[:, None] - lse))
    share = np.where(np.isneginf(lse), 1.0, share)              # fully masked rows: all 0
    flat *= share[..., None].astype(weights.dtype)


def _softmax_rows(scores, n_threads):
    """Row softmax of the masked scores, in place, by the softmax kernel."""
    rows2d = scores.reshape(-1, scores.shape[-1])          # C-contiguous: a view
    _backend.kernels.softmax_rows(rows2d, rows2d, None, None, 0, 0, 0, 0, False,
                                  V.threads_for_work(n_threads, rows2d.size, 1 << 15))
