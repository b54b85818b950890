"""Multi-head attention with ``torch.nn.MultiheadAttention`` parity (inference only).

The in- and out-projections are NumPy matrix products (BLAS: they sit outside the attention
kernel, and NumPy's BLAS measured 1.2-3x faster than :func:`cyattn.matmul_accumulate` for
them at typical sizes); the attention itself is :func:`cyattn.scaled_dot_product_attention`
on ``(N, H, L, head_dim)`` views, or, when the weights are wanted, :func:`cyattn.softmax`
over the explicitly formed scaled scores.
"""
import math
import numbers

import numpy as np

from . import _validate as V
from .attention import scaled_dot_product_attention
from .softmax import _fast_call as _softmax_fast_call, _softmax

__all__ = ["multi_head_attention", "MultiHeadAttention"]

_FNAME = "cyattn.multi_head_attention"
_PARAM_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_CLS = "cyattn.MultiHeadAttention"


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

def _check_positive_int(value, name, fname, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{fname}: {name} must be an int, got {type(value).__name__}")
    value = int(value)
    if value <= 0:
        raise ValueError(f"{fname}: {name} must be positive, got {value}")
    return value


def _param(arr, name, shape, fname):
    """A float parameter array of exactly ``shape`` (ValueError naming it otherwise)."""
    arr = V.as_float_array(arr, name, fname)
    if arr.shape != tuple(shape):
        raise ValueError(f"{fname}: {name} has shape {arr.shape}; expected {tuple(shape)}")
    return arr


def _mask(mask, name, compute):
    """(ignore, add) for a torch-polarity mask: bool True = ignore, float = added."""
    if mask is None:
        return None, None
    kind, arr = V.prepare_mask(mask, name, _FNAME, compute, bool_meaning="True = ignore")
    if kind == 1:
        return arr.view(np.bool_), None
    return None, arr


# NumPy's float32 BLAS (OpenBLAS) computes ``x @ W.T`` for a few rows of x 1.1-2x slower than
# the same product with the operands' roles swapped, ``W @ x.T``, even counting the pass that
# copies its transpose out (with the bias added): measured for 2 to 48 rows, widths 384-1152,
# on 1 and 2 threads. From ~64 rows on, and in float64 at any size, the direct form is faster.
_SWAPPED_ROWS = (2, 48)


def _linear(x, weight, bias, dtype):
    """``x @ weight.T + bias`` over the last axis of ``x`` (NumPy BLAS), C-contiguous."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).astype(dtype, copy=False)
    w = weight.astype(dtype, copy=False)
    b = None if bias is None else bias.astype(dtype, copy=False)
    rows = x2.shape[0]
    if dtype == np.float32 and _SWAPPED_ROWS[0] <= rows <= _SWAPPED_ROWS[1]:
        y = np.empty((rows, w.shape[0]), dtype)
        y_t = np.matmul(w, x2.T).T
        if b is None:
            np.copyto(y, y_t)
        else:
            np.add(y_t, b, out=y)
    else:
        y = x2 @ w.T
        if b is not None:
            y += b
    return y.reshape(lead + (w.shape[0],))


def _heads(x, num_heads, batch_first):
    """(L, N, E) or (N, L, E) -> a (N, H, L, d) view."""
    a, b, e = x.shape
    x = x.reshape(a, b, num_heads, e // num_heads)
    return x.transpose(0, 2, 1, 3) if batch_first else x.transpose(1, 2, 0, 3)


def _unheads(x, batch_first):
    """(N, H, L, d) -> (N, L, E) or (L, N, E) (a C-contiguous copy)."""
    n, h, length, d = x.shape
    x = x.transpose(0, 2, 1, 3) if batch_first else x.transpose(2, 0, 1, 3)
    return np.ascontiguousarray(x).reshape(x.shape[0], x.shape[1], h * d)


def _weights_times_value(weights, v):
    """``weights @ v`` where a value entry of a key with weight exactly 0 is never read (so a
    NaN or inf there cannot leak, as in the attention kernel)."""
    finite = np.isfinite(v)
    if finite.all():
        return weights @ v
    out = weights @ np.where(finite, v, 0)
    n, h, j, c = np.nonzero(~finite)
    w = weights[n, h, :, j]                                  # (K, L)
    contrib = np.where(w != 0, w * v[n, h, j, c][:, None], 0)
    np.add.at(out.transpose(0, 1, 3, 2), (n, h, c), contrib)
    return out


# --------------------------------------------------------------------------------------------
# functional form
# --------------------------------------------------------------------------------------------

def multi_head_attention(query, key, value, *, num_heads, in_proj_weight=None,
                         in_proj_bias=None, out_proj_weight, out_proj_bias=None,
                         q_proj_weight=None, k_proj_weight=None, v_proj_weight=None,
                         key_padding_mask=None, attn_mask=None, need_weights=True,
                         average_attn_weights=True, is_causal=False, batch_first=False):
    r"""Multi-head attention ``concat_h(softmax(Q_h K_h^T / sqrt(d) + mask) V_h) W_o^T + b_o``.

    **Masks use torch.nn.MultiheadAttention's polarity: a bool ``key_padding_mask`` or
    ``attn_mask`` entry True means IGNORE that key** -- the opposite of
    :func:`cyattn.scaled_dot_product_attention`, whose bool True means take part. Float masks
    are added to the scaled scores.

    With ``Q = query W_q^T + b_q``, ``K = key W_k^T + b_k``, ``V = value W_v^T + b_v`` split
    into ``H = num_heads`` heads of ``d = E // H`` columns, head ``h`` computes
    ``softmax(Q_h K_h^T / sqrt(d) + mask) V_h``; the heads are concatenated and projected by
    ``W_o``, ``b_o``.

    Parameters
    ----------
    query : array_like of float, shape (L, N, E), (N, L, E) with ``batch_first``, or (L, E)
    key : array_like of float, shape (S, N, kdim), (N, S, kdim) or (S, kdim)
    value : array_like of float, shape (S, N, vdim), (N, S, vdim) or (S, vdim)
        All batched (3-D) or all unbatched (2-D). ``kdim == vdim == E`` with
        ``in_proj_weight``. float32/float64 are computed natively, float16 in float32
        (returned as float16); mixed float dtypes (inputs and parameters) promote with
        ``np.result_type``.
    num_heads : int, keyword-only
        H, a positive divisor of E. The scale is ``1 / sqrt(E // H)``.
    in_proj_weight : array_like of float, shape (3E, E), optional
        Rows ``[W_q; W_k; W_v]``. Give either this or all three of ``q_proj_weight``,
        ``k_proj_weight``, ``v_proj_weight``.
    in_proj_bias : array_like of float, shape (3E,), optional
        ``[b_q; b_k; b_v]``; no bias when None.
    out_proj_weight : array_like of float, shape (E, E), keyword-only
        ``W_o``; E is read from its shape.
    out_proj_bias : array_like of float, shape (E,), optional
        ``b_o``; no bias when None.
    q_proj_weight, k_proj_weight, v_proj_weight : array_like of float, optional
        Shapes (E, E), (E, kdim), (E, vdim); used when ``in_proj_weight`` is None.
    key_padding_mask : array_like of bool or float, shape (N, S), or (S,) unbatched, optional
        bool: **True = ignore** that key for every query and head. float: added to the scores.
    attn_mask : array_like of bool or float, optional
        Shape (L, S) (shared by all batch elements and heads), or (N * H, L, S) (batched; index
        ``n * H + h``), or (H, L, S) (unbatched). bool: **True = ignore**; float: added.
    need_weights : bool, optional
        Also return the attention weights (default True); formed explicitly with
        :func:`cyattn.softmax`, so this path materialises the (N, H, L, S) scores.
    average_attn_weights : bool, optional
        Average the returned weights over the heads (default True).
    is_causal : bool, optional
        Restrict query ``i`` to keys ``j <= i`` (top-left aligned), composed by AND with the
        masks. Unlike torch, no ``attn_mask`` is required.
    batch_first : bool, optional
        Batched inputs and output are (N, L, E) instead of (L, N, E).

    Returns
    -------
    attn_output : ndarray, shape (L, N, E), (N, L, E) with ``batch_first``, or (L, E)
    attn_weights : ndarray or None
        None unless ``need_weights``. Averaged: (N, L, S), or (L, S) unbatched; per head
        (``average_attn_weights=False``): (N, H, L, S), or (H, L, S) unbatched. Same dtype as
        the output.

    Raises
    ------
    TypeError
        If an input or parameter is not a float array, a mask is an integer (or other
        non-bool, non-float) array, ``num_heads`` is not an int, or a flag is not a bool.
    ValueError
        If ``num_heads`` is not positive or does not divide E, the inputs are not all 2-D or
        all 3-D, their batch, length or feature sizes disagree with each other or with the
        parameters, neither or both of ``in_proj_weight`` and the separate projection weights
        are given, a parameter has the wrong shape, or a mask has the wrong shape. Each
        message names the argument, what it got and what was expected.

    Notes
    -----
    A query row in which every key of a head is removed (bool/causal masks, ``-inf`` float
    masks, or ``S = 0``) is fully masked: that head's weights and output are 0, never NaN, so
    a row masked in every head gives ``out_proj_bias`` (torch gives NaN there). A masked key
    (bool or causal) is never read into the result. Both float masks present: they are summed
    (``attn_mask + key_padding_mask``) and then added to the scores, as torch does. One bool
    and one float mask: the scores are formed explicitly (as with ``need_weights``) so that
    the bool mask still selects rather than adding ``-inf``. Otherwise, without
    ``need_weights``, the combined mask is passed to the fused kernel and no L x S array is
    formed per head. Inference only: no dropout, no ``add_bias_kv``/``add_zero_attn``.

    Threads: the projections are NumPy matrix products on NumPy's BLAS threads, and the
    attention kernel runs on the calling thread. With both cyattn's OpenMP team and the BLAS
    pool busy-waiting on the same cores, a forward was 1.4-15x slower (measured on 2 cores).

    Source: Vaswani et al., "Attention Is All You Need", NeurIPS 2017, section 3.2.2;
    parity with ``torch.nn.functional.multi_head_attention_forward`` (PyTorch 2.x).

    Examples
    --------
    >>> import numpy as np, cyattn
    >>> out, w = cyattn.multi_head_attention(
    ...     np.array([[1.0]]), np.array([[1.0], [1.0]]), np.array([[2.0], [4.0]]), num_heads=1,
    ...     in_proj_weight=np.ones((3, 1)), out_proj_weight=np.ones((1, 1)))
    >>> out, w
    (array([[3.]]), array([[0.5, 0.5]]))
    >>> cyattn.multi_head_attention(
    ...     np.array([[1.0]]), np.array([[1.0], [1.0]]), np.array([[2.0], [4.0]]), num_heads=1,
    ...     in_proj_weight=np.ones((3, 1)), out_proj_weight=np.ones((1, 1)),
    ...     key_padding_mask=np.array([False, True]))[0]   # True = ignore the second key
    array([[2.]])
    """
    f = _FNAME
    if isinstance(num_heads, (bool, np.bool_)) or not isinstance(num_heads, numbers.Integral):
        raise TypeError(f"{f}: num_heads must be an int, got {type(num_heads).__name__}")
    num_heads = int(num_heads)
    if num_heads <= 0:
        raise ValueError(f"{f}: num_heads must be positive, got {num_heads}")
    need_weights, average_attn_weights, is_causal, batch_first = V.check_bools(
        f, need_weights=need_weights, average_attn_weights=average_attn_weights,
        is_causal=is_causal, batch_first=batch_first)

    query, key, value = V.as_float_arrays(f, query=query, key=key, value=value)

    # ---- parameters
    if out_proj_weight is None:
        raise ValueError(f"{f}: out_proj_weight is required, got None; expected shape (E, E)")
    out_proj_weight = V.as_float_array(out_proj_weight, "out_proj_weight", f)
    if out_proj_weight.ndim != 2 or out_proj_weight.shape[0] != out_proj_weight.shape[1]:
        raise ValueError(f"{f}: out_proj_weight has shape {out_proj_weight.shape}; expected a "
                         f"square (E, E) matrix")
    E = out_proj_weight.shape[0]
    if E % num_heads:
        raise ValueError(f"{f}: embed_dim E={E} (from out_proj_weight) must be divisible by "
                         f"num_heads={num_heads}")
    separate = (q_proj_weight, k_proj_weight, v_proj_weight)
    if in_proj_weight is not None:
        if any(w is not None for w in separate):
            raise ValueError(f"{f}: got both in_proj_weight and q_proj_weight/k_proj_weight/"
                             f"v_proj_weight; expected one or the other")
        in_proj_weight = _param(in_proj_weight, "in_proj_weight", (3 * E, E), f)
        w_q, w_k, w_v = in_proj_weight[:E], in_proj_weight[E:2 * E], in_proj_weight[2 * E:]
    else:
        if any(w is None for w in separate):
            missing = [n for n, w in zip(("q_proj_weight", "k_proj_weight", "v_proj_weight"),
                                         separate) if w is None]
            raise ValueError(f"{f}: in_proj_weight is None and {', '.join(missing)} missing; "
                             f"expected in_proj_weight (3E, E) or all of q_proj_weight (E, E), "
                             f"k_proj_weight (E, kdim), v_proj_weight (E, vdim)")
        w_q = _param(q_proj_weight, "q_proj_weight", (E, E), f)
        w_k = V.as_float_array(k_proj_weight, "k_proj_weight", f)
        w_v = V.as_float_array(v_proj_weight, "v_proj_weight", f)
        for name, w in (("k_proj_weight", w_k), ("v_proj_weight", w_v)):
            if w.ndim != 2 or w.shape[0] != E:
                raise ValueError(f"{f}: {name} has shape {w.shape}; expected (E, "
                                 f"{name[0]}dim) with E={E}")
    kdim, vdim = w_k.shape[1], w_v.shape[1]
    b_q = b_k = b_v = None
    if in_proj_bias is not None:
        in_proj_bias = _param(in_proj_bias, "in_proj_bias", (3 * E,), f)
        b_q, b_k, b_v = in_proj_bias[:E], in_proj_bias[E:2 * E], in_proj_bias[2 * E:]
    if out_proj_bias is not None:
        out_proj_bias = _param(out_proj_bias, "out_proj_bias", (E,), f)

    # ---- input shapes
    if query.ndim not in (2, 3):
        raise ValueError(f"{f}: query has shape {query.shape}; expected 3-D (L, N, E) / "
                         f"(N, L, E) with batch_first, or 2-D (L, E) unbatched")
    batched = query.ndim == 3
    if batched:
        layout = "(N, {0}, {1})" if batch_first else "({0}, N, {1})"
    else:
        layout = "({0}, {1})"
    for name, arr, dim_name in (("key", key, "kdim"), ("value", value, "vdim")):
        if arr.ndim != query.ndim:
            raise ValueError(f"{f}: {name} has shape {arr.shape} but query has shape "
                             f"{query.shape}; expected {name} of shape "
                             f"{layout.format('S', dim_name)}")
    if not batched:
        query, key, value = query[None], key[None], value[None]
        batch_first_int = True
    else:
        batch_first_int = batch_first
    if batch_first_int:
        (N, L, Eq), (Nk, S, Ek), (Nv, Sv, Ev) = query.shape, key.shape, value.shape
    else:
        (L, N, Eq), (S, Nk, Ek), (Sv, Nv, Ev) = query.shape, key.shape, value.shape
    if Eq != E:
        raise ValueError(f"{f}: query has shape {query.shape[not batched:]}; expected "
                         f"{layout.format('L', 'E')} with E={E} (from out_proj_weight)")
    if Nk != N or Ek != kdim:
        raise ValueError(f"{f}: key has shape {key.shape[not batched:]}; expected "
                         f"{layout.format('S', 'kdim')} with"
                         f"{f' N={N} (from query) and' if batched else ''} kdim={kdim}")
    if Nv != N or Sv != S or Ev != vdim:
        raise ValueError(f"{f}: value has shape {value.shape[not batched:]}; expected "
                         f"{layout.format('S', 'vdim')} with"
                         f"{f' N={N} (from query),' if batched else ''} S={S} (from key) "
                         f"and vdim={vdim}")

    params = [p for p in (w_q, w_k, w_v, out_proj_weight, in_proj_bias, out_proj_bias)
              if p is not None]
    compute, result = V.float_dtypes(query, key, value, *params)

    # ---- masks -> (N, H, L, S)-broadcastable ignore (bool) and add (float) parts
    H = num_heads
    kpm_ignore, kpm_add = _mask(key_padding_mask, "key_padding_mask", compute)
    kpm = kpm_ignore if kpm_ignore is not None else kpm_add
    if kpm is not None:
        want = (N, S) if batched else (S,)
        if kpm.shape != want:
            raise ValueError(f"{f}: key_padding_mask has shape {kpm.shape}; expected "
                             f"{'(N, S)' if batched else '(S,)'} = {want}")
        kpm = kpm.reshape(N, 1, 1, S)
        kpm_ignore, kpm_add = (kpm, None) if kpm_ignore is not None else (None, kpm)
    am_ignore, am_add = _mask(attn_mask, "attn_mask", compute)
    am = am_ignore if am_ignore is not None else am_add
    if am is not None:
        want3 = (N * H, L, S) if batched else (H, L, S)
        if am.shape == (L, S):
            am = am.reshape(1, 1, L, S)
        elif am.shape == want3:
            am = am.reshape(N, H, L, S)
        else:
            raise ValueError(f"{f}: attn_mask has shape {am.shape}; expected (L, S) = {(L, S)} "
                             f"or {'(N * num_heads, L, S)' if batched else '(num_heads, L, S)'}"
                             f" = {want3}")
        am_ignore, am_add = (am, None) if am_ignore is not None else (None, am)
    ignore = None
    if kpm_ignore is not None and am_ignore is not None:
        ignore = kpm_ignore | am_ignore
    elif kpm_ignore is not None or am_ignore is not None:
        ignore = kpm_ignore if kpm_ignore is not None else am_ignore
    add = None
    if kpm_add is not None and am_add is not None:
        # Two finite masks add to a finite mask: a sum beyond the dtype's range saturates at
        # its largest finite value instead of overflowing to -inf (DESIGN 3.2), silently.
        with np.errstate(over="ignore", invalid="ignore"):
            add = am_add + kpm_add
        info = np.finfo(add.dtype)
        add = np.where(np.isfinite(am_add) & np.isfinite(kpm_add),
                       np.clip(add, info.min, info.max), add)
    elif kpm_add is not None or am_add is not None:
        add = kpm_add if kpm_add is not None else am_add
    keep = None if ignore is None else ~ignore

    # ---- projections (NumPy BLAS) and the attention. IEEE results (inf, NaN) are kept
    # without RuntimeWarnings, as in the compiled kernels.
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        out, weights = _attend(query, key, value, (w_q, w_k, w_v), (b_q, b_k, b_v),
                               out_proj_weight, out_proj_bias, keep, add, is_causal,
                               need_weights, H, compute, batch_first_int)
    if not batched:
        out = out[0]
    out = V.to_result(out, result)
    if not need_weights:
        return out, None
    if average_attn_weights:
        weights = weights.sum(axis=1) / H
    if not batched:
        weights = weights[0]
    return out, V.to_result(weights, result)


def _attend(query, key, value, in_weights, in_biases, w_o, b_o, keep, add, is_causal,
            need_weights, H, compute, batch_first):
    """Projections, per-head attention and the output projection: (output, weights or None).

    ``keep`` (bool, True = take part) and ``add`` (float) broadcast to (N, H, L, S).
    """
    (w_q, w_k, w_v), (b_q, b_k, b_v) = in_weights, in_biases
    q = _heads(_linear(query, w_q, b_q, compute), H, batch_first)
    k = _heads(_linear(key, w_k, b_k, compute), H, batch_first)
    v = _heads(_linear(value, w_v, b_v, compute), H, batch_first)
    L, S, d = q.shape[2], k.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(d) if d else 1.0
    weights = None
    if need_weights or (keep is not None and add is not None):
        # explicit scores; a bool mask still selects (is never read) when a float one is added
        scores = np.matmul(q, k.transpose(0, 1, 3, 2))
        scores *= scale
        if add is not None:
            scores += add
        if is_causal:
            causal = np.tri(L, S, dtype=np.bool_)
            keep = causal if keep is None else keep & causal
        weights = _softmax_fast_call(scores, -1, keep, None, False, n_threads=1)
        if weights is None:
            weights = _softmax(_FNAME, scores, -1, keep, None, False, n_threads=1)
        heads = _weights_times_value(weights, v)
    else:
        heads = scaled_dot_product_attention(q, k, v, keep if add is None else add,
                                             is_causal=is_causal, scale=scale, n_threads=1)
    return _linear(_unheads(heads, batch_first), w_o, b_o, compute), weights


# --------------------------------------------------------------------------------------------
# module form
# --------------------------------------------------------------------------------------------

class MultiHeadAttention:
    r"""Multi-head attention layer with ``torch.nn.MultiheadAttention`` parity (inference).

    **Masks use torch's polarity: a bool ``key_padding_mask`` or ``attn_mask`` entry True
    means IGNORE that key** -- the opposite of :func:`cyattn.scaled_dot_product_attention`.
    Float masks are added to the scaled scores.

    Computes ``concat_h(softmax(Q_h K_h^T / sqrt(d) + mask) V_h) W_o^T + b_o`` with
    ``d = embed_dim // num_heads``; :meth:`forward` delegates to
    :func:`cyattn.multi_head_attention`.

    Parameters
    ----------
    embed_dim : int
        E, the model width (positive).
    num_heads : int
        H, a positive divisor of ``embed_dim``.
    bias : bool, keyword-only
        Whether the in- and out-projections have biases (default True).
    kdim, vdim : int, keyword-only, optional
        Feature sizes of ``key`` and ``value`` (default ``embed_dim``). When either differs
        from ``embed_dim`` the projections are separate matrices (``in_proj_weight`` is None).
    batch_first : bool, keyword-only
        Batched inputs and outputs are (N, L, E) instead of (L, N, E) (default False).
    dtype : float16, float32 or float64, keyword-only
        dtype of the parameters (default float32).
    seed : int, numpy.random.Generator or None, keyword-only
        Seed for :func:`numpy.random.default_rng` used to initialise the parameters.

    Attributes
    ----------
    embed_dim, num_heads, head_dim, kdim, vdim, batch_first, dtype
    in_proj_weight : ndarray (3E, E) or None
        ``[W_q; W_k; W_v]`` when ``kdim == vdim == embed_dim``, else None.
    q_proj_weight, k_proj_weight, v_proj_weight : ndarray or None
        (E, E), (E, kdim), (E, vdim) when ``kdim`` or ``vdim`` differs from ``embed_dim``,
        else None.
    in_proj_bias : ndarray (3E,) or None
    out_proj_weight : ndarray (E, E)
    out_proj_bias : ndarray (E,) or None

    Raises
    ------
    TypeError
        If ``embed_dim``, ``num_heads``, ``kdim`` or ``vdim`` is not an int, ``bias`` or
        ``batch_first`` is not a bool, or ``dtype`` is not float16/float32/float64.
    ValueError
        If ``embed_dim``, ``num_heads``, ``kdim`` or ``vdim`` is not positive, or
        ``embed_dim % num_heads != 0``.

    Notes
    -----
    Initialisation follows torch: ``xavier_uniform`` (Glorot and Bengio 2010) for the
    in-projection weights -- ``U(-a, a)`` with ``a = sqrt(6 / (fan_in + fan_out))``, computed
    for the packed (3E, E) matrix as torch does, or per matrix when separate --, zero in- and
    out-projection biases, and ``out_proj_weight`` from ``torch.nn.Linear``'s default
    ``U(-1/sqrt(E), 1/sqrt(E))`` (torch's MultiheadAttention does not re-initialise it). The
    values come from NumPy's Generator, so they differ from torch's for the same seed; use
    :meth:`load_state_dict` or :meth:`from_torch` for trained weights.

    Inference only: no dropout, ``add_bias_kv`` or ``add_zero_attn``. Fully masked query
    rows give weights 0 and the output row ``out_proj_bias`` (torch gives NaN).

    Threads: the projections use NumPy's BLAS threads and the attention kernel the calling
    thread, as in :func:`multi_head_attention`.

    Source: Vaswani et al., "Attention Is All You Need", NeurIPS 2017, section 3.2.2; API and
    parameter layout of ``torch.nn.MultiheadAttention`` (PyTorch 2.x).

    Examples
    --------
    >>> import numpy as np, cyattn
    >>> mha = cyattn.MultiHeadAttention(8, 2, batch_first=True, seed=0)
    >>> x = np.random.default_rng(1).standard_normal((3, 5, 8)).astype(np.float32)
    >>> out, w = mha(x, x, x)
    >>> out.shape, out.dtype, w.shape
    ((3, 5, 8), dtype('float32'), (3, 5, 5))
    >>> bool(np.allclose(w.sum(-1), 1.0))
    True
    >>> pad = np.zeros((3, 5), dtype=bool); pad[:, 3:] = True   # True = ignore keys 3, 4
    >>> out, w = mha(x, x, x, key_padding_mask=pad)
    >>> float(abs(w[..., 3:]).max())
    0.0
    """

    def __init__(self, embed_dim, num_heads, *, bias=True, kdim=None, vdim=None,
                 batch_first=False, dtype=np.float32, seed=None):
        c = _CLS
        embed_dim = _check_positive_int(embed_dim, "embed_dim", c)
        num_heads = _check_positive_int(num_heads, "num_heads", c)
        if embed_dim % num_heads:
            raise ValueError(f"{c}: embed_dim={embed_dim} must be divisible by "
                             f"num_heads={num_heads}")
        kdim = _check_positive_int(kdim, "kdim", c, allow_none=True) or embed_dim
        vdim = _check_positive_int(vdim, "vdim", c, allow_none=True) or embed_dim
        bias = V.check_bool(bias, "bias", c)
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.kdim = kdim
        self.vdim = vdim
        self.batch_first = V.check_bool(batch_first, "batch_first", c)
        self.dtype = _check_dtype(dtype, c)

        try:
            rng = np.random.default_rng(seed)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{c}: seed must be None, a non-negative int or a numpy Generator/"
                            f"SeedSequence, got {seed!r} ({exc})") from None
        E = embed_dim

        def xavier(rows, cols):
            bound = math.sqrt(6.0 / (rows + cols))
            return rng.uniform(-bound, bound, (rows, cols)).astype(self.dtype)

        if self._qkv_same_embed_dim:
            self.in_proj_weight = xavier(3 * E, E)
            self.q_proj_weight = self.k_proj_weight = self.v_proj_weight = None
        else:
            self.in_proj_weight = None
            self.q_proj_weight = xavier(E, E)
            self.k_proj_weight = xavier(E, kdim)
            self.v_proj_weight = xavier(E, vdim)
        bound = 1.0 / math.sqrt(E)
        self.out_proj_weight = rng.uniform(-bound, bound, (E, E)).astype(self.dtype)
        self.in_proj_bias = np.zeros(3 * E, self.dtype) if bias else None
        self.out_proj_bias = np.zeros(E, self.dtype) if bias else None

    @property
    def _qkv_same_embed_dim(self):
        return self.kdim == self.embed_dim and self.vdim == self.embed_dim

    @property
    def bias(self):
        """Whether the projections have biases."""
        return self.in_proj_bias is not None

    def __repr__(self):
        extra = "" if self._qkv_same_embed_dim else f", kdim={self.kdim}, vdim={self.vdim}"
        return (f"MultiHeadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"bias={self.bias}{extra}, batch_first={self.batch_first}, "
                f"dtype={self.dtype.name})")

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        r"""Attend ``query`` to ``key``/``value``; returns ``(attn_output, attn_weights)``.

        **Bool masks: True = IGNORE** (torch's polarity, the opposite of
        :func:`cyattn.scaled_dot_product_attention`); float masks are added to the scores.

        Parameters
        ----------
        query : array_like of float, shape (L, N, E), (N, L, E) if ``batch_first``, or (L, E)
        key : array_like of float, shape (S, N, kdim), (N, S, kdim) or (S, kdim)
        value : array_like of float, shape (S, N, vdim), (N, S, vdim) or (S, vdim)
        key_padding_mask : array_like of bool or float, shape (N, S) or (S,), optional
            bool True = ignore that key; float added.
        need_weights : bool, optional
            Return the attention weights (default True).
        attn_mask : array_like of bool or float, shape (L, S), (N * H, L, S) or (H, L, S)
            bool True = ignore; float added. Optional.
        average_attn_weights : bool, optional
            Average the weights over the heads (default True).
        is_causal : bool, optional
            Top-left causal mask, composed by AND with the masks (no ``attn_mask`` needed).

        Returns
        -------
        attn_output : ndarray, query's layout with E features
        attn_weights : ndarray or None
            (N, L, S) / (L, S) averaged, (N, H, L, S) / (H, L, S) per head, None without
            ``need_weights``.

        Raises
        ------
        TypeError, ValueError
            As :func:`cyattn.multi_head_attention`.

        Notes
        -----
        Result dtype: ``np.result_type`` of the inputs and the parameters (float16 computed in
        float32). Fully masked rows give ``out_proj_bias``, not NaN. Source: Vaswani et al.
        2017, section 3.2.2.

        Examples
        --------
        >>> import numpy as np, cyattn
        >>> mha = cyattn.MultiHeadAttention(4, 2, seed=0, dtype=np.float64)
        >>> x = np.zeros((3, 4))                         # unbatched (L, E)
        >>> out, w = mha.forward(x, x, x, is_causal=True)
        >>> w.round(3)
        array([[1.   , 0.   , 0.   ],
               [0.5  , 0.5  , 0.   ],
               [0.333, 0.333, 0.333]])
        """
        return multi_head_attention(
            query, key, value, num_heads=self.num_heads, in_proj_weight=self.in_proj_weight,
            in_proj_bias=self.in_proj_bias, out_proj_weight=self.out_proj_weight,
            out_proj_bias=self.out_proj_bias, q_proj_weight=self.q_proj_weight,
            k_proj_weight=self.k_proj_weight, v_proj_weight=self.v_proj_weight,
            key_padding_mask=key_padding_mask, attn_mask=attn_mask, need_weights=need_weights,
            average_attn_weights=average_attn_weights, is_causal=is_causal,
            batch_first=self.batch_first)

    __call__ = forward

    def _expected_shapes(self):
        E = self.embed_dim
        shapes = {}
        if self._qkv_same_embed_dim:
            shapes["in_proj_weight"] = (3 * E, E)
        else:
            shapes["q_proj_weight"] = (E, E)
            shapes["k_proj_weight"] = (E, self.kdim)
            shapes["v_proj_weight"] = (E, self.vdim)
        if self.bias:
            shapes["in_proj_bias"] = (3 * E,)
        shapes["out_proj.weight"] = (E, E)
        if self.bias:
            shapes["out_proj.bias"] = (E,)
        return shapes

    _ATTRS = {"in_proj_weight": "in_proj_weight", "q_proj_weight": "q_proj_weight",
              "k_proj_weight": "k_proj_weight", "v_proj_weight": "v_proj_weight",
              "in_proj_bias": "in_proj_bias", "out_proj.weight": "out_proj_weight",
              "out_proj.bias": "out_proj_bias"}

    def state_dict(self):
        """The parameters under ``torch.nn.MultiheadAttention``'s key names.

        Returns
        -------
        dict of str to ndarray
            Copies of ``in_proj_weight`` (or ``q_proj_weight``, ``k_proj_weight``,
            ``v_proj_weight``), ``in_proj_bias``, ``out_proj.weight``, ``out_proj.bias`` (the
            biases only when ``bias``), in torch's order.

        Examples
        --------
        >>> import cyattn
        >>> list(cyattn.MultiHeadAttention(4, 2, seed=0).state_dict())
        ['in_proj_weight', 'in_proj_bias', 'out_proj.weight', 'out_proj.bias']
        """
        return {name: getattr(self, self._ATTRS[name]).copy()
                for name in self._expected_shapes()}

    def load_state_dict(self, state):
        """Load parameters saved under ``torch.nn.MultiheadAttention``'s key names.

        Parameters
        ----------
        state : mapping of str to array_like of float
            Exactly the keys of :meth:`state_dict` for this configuration (``in_proj_weight``
            or ``q_proj_weight``/``k_proj_weight``/``v_proj_weight``, ``out_proj.weight``, and
            with ``bias`` ``in_proj_bias``/``out_proj.bias``). Values are anything
            :func:`numpy.asarray` accepts (for torch tensors pass ``t.detach().cpu().numpy()``);
            they are copied and cast to the module's ``dtype``.

        Raises
        ------
        ValueError
            If ``state`` holds ``bias_k``/``bias_v`` (``add_bias_kv`` is not supported), a key
            is missing or unexpected, or a value has the wrong shape (the message names the
            key, the shape it got and the one expected). Nothing is loaded then.
        TypeError
            If ``state`` is not a mapping or a value is not a float array.

        Examples
        --------
        >>> import cyattn
        >>> a = cyattn.MultiHeadAttention(4, 2, seed=0); b = cyattn.MultiHeadAttention(4, 2)
        >>> b.load_state_dict(a.state_dict())
        >>> bool((b.out_proj_weight == a.out_proj_weight).all())
        True
        """
        fname = f"{_CLS}.load_state_dict"
        if not hasattr(state, "keys") or not hasattr(state, "__getitem__"):
            raise TypeError(f"{fname}: state must be a mapping of parameter names to arrays, "
                            f"got {type(state).__name__}")
        if "bias_k" in state or "bias_v" in state:
            raise ValueError(f"{fname}: state holds bias_k/bias_v; add_bias_kv is not "
                             f"supported by cyattn.MultiHeadAttention")
        expected = self._expected_shapes()
        missing = [k for k in expected if k not in state]
        unexpected = [k for k in state if k not in expected]
        if missing or unexpected:
            raise ValueError(f"{fname}: state does not match this module "
                             f"({self!r}): missing keys {missing}, unexpected keys "
                             f"{unexpected}; expected exactly {list(expected)}")
        loaded = {}
        for name, shape in expected.items():
            arr = V.as_float_array(state[name], repr(name), fname)
            if arr.shape != shape:
                raise ValueError(f"{fname}: {name!r} has shape {arr.shape}; expected {shape}")
            loaded[name] = np.array(arr, dtype=self.dtype, copy=True)
        for name, arr in loaded.items():
            setattr(self, self._ATTRS[name], arr)

    @classmethod
    def from_torch(cls, module, *, dtype=None):
        """A :class:`MultiHeadAttention` with the configuration and weights of a
        ``torch.nn.MultiheadAttention``.

        torch is not imported: the module is read by duck typing (``embed_dim``,
        ``num_heads``, ``batch_first``, ``kdim``, ``vdim``, ``dropout``, ``training``,
        ``bias_k``, ``add_zero_attn`` and ``state_dict()`` tensors, converted with
        ``.detach().cpu().numpy()``).

        Parameters
        ----------
        module : torch.nn.MultiheadAttention
        dtype : float16, float32 or float64, keyword-only, optional
            dtype of the new module's parameters; default the dtype of the torch weights.

        Returns
        -------
        MultiHeadAttention

        Raises
        ------
        ValueError
            If the module uses ``add_bias_kv`` or ``add_zero_attn`` (not supported), or has
            ``dropout > 0`` and is in training mode (cyattn is inference only: dropout is a
            random training-time operation; call ``module.eval()`` first, where torch
            applies no dropout and the results agree).
        TypeError
            If the weights are not float16/float32/float64 (e.g. bfloat16) and no ``dtype``
            is given, or ``dtype`` is not one of them. With a ``dtype``, bfloat16 weights are
            converted through float32.

        Notes
        -----
        The module's state is copied; later changes to either do not affect the other.

        Examples
        --------
        >>> import numpy as np, cyattn
        >>> torch = __import__("pytest").importorskip("torch")
        >>> t = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
        >>> m = cyattn.MultiHeadAttention.from_torch(t)
        >>> x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
        >>> ref = t(*(torch.from_numpy(x),) * 3)[0].detach().numpy()
        >>> bool(np.allclose(m(x, x, x)[0], ref, atol=1e-6))
        True
        """
        fname = f"{_CLS}.from_torch"
        if getattr(module, "bias_k", None) is not None or getattr(module, "bias_v", None) \
                is not None:
            raise ValueError(f"{fname}: the module uses add_bias_kv=True, which is not "
                             f"supported by cyattn.MultiHeadAttention")
        if getattr(module, "add_zero_attn", False):
            raise ValueError(f"{fname}: the module uses add_zero_attn=True, which is not "
                             f"supported by cyattn.MultiHeadAttention")
        dropout = float(getattr(module, "dropout", 0.0) or 0.0)
        if dropout > 0 and getattr(module, "training", True):
            raise ValueError(f"{fname}: the module has dropout={dropout} and is in training "
                             f"mode; cyattn.MultiHeadAttention is inference only (no dropout). "
                             f"Call module.eval() first: torch then applies no dropout")
        state = {}
        for name, tensor in module.state_dict().items():
            if hasattr(tensor, "detach"):
                tensor = tensor.detach().cpu()
                try:
                    tensor = tensor.numpy()
                except TypeError:          # e.g. bfloat16, which NumPy has no dtype for
                    if dtype is None:
                        raise TypeError(f"{fname}: {name!r} has dtype {tensor.dtype}, which "
                                        f"NumPy cannot hold; pass dtype=np.float32 (or "
                                        f"float64) to convert it") from None
                    tensor = tensor.float().numpy()
            state[name] = np.asarray(tensor)
        if dtype is None:
            ref = state.get("in_proj_weight", state.get("q_proj_weight"))
            dtype = ref.dtype if ref is not None else np.float32
        embed_dim = int(module.embed_dim)
        kdim = int(getattr(module, "kdim", None) or embed_dim)
        vdim = int(getattr(module, "vdim", None) or embed_dim)
        new = cls(embed_dim, int(module.num_heads),
                  bias=state.get("in_proj_bias") is not None, kdim=kdim, vdim=vdim,
                  batch_first=bool(getattr(module, "batch_first", False)),
                  dtype=_check_dtype(dtype, fname), seed=0)
        new.load_state_dict(state)
        return new


def _check_dtype(dtype, fname):
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt not in _PARAM_DTYPES:   # (np.dtype('f8') == None is True)
        raise TypeError(f"{fname}: dtype must be float16, float32 or float64, got {dtype!r}")
    return dt
