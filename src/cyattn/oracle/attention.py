"""Scaled dot-product attention of the oracle with its variant arguments.

:func:`scaled_dot_product_attention` (masks, causal alignment, lse, sliding window, softcap,
sinks, ALiBi slopes, key / query lengths), the per-row kernel :func:`_attend` that
:mod:`.mha` reuses, and the :class:`_Variant` options of one (batch entry, head).
"""

import math
import numbers

from ._common import (
    _as_float, _check_batch, _flatten, _is_seq, _mask_kind, _matrix, _nested_shape, _shape,
    _softmax_row, _split_batch, _sum,
)

_CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")


def _attend(q_rows, k_rows, v_rows, ev, scale, keep=None, add=None, causal_offset=None,
            variant=None):
    """Single-head attention on validated float matrices.

    ``keep`` (L, S) bools or None; ``add`` (L, S) floats or None; ``causal_offset`` None (not
    causal) or ``off`` with key ``j`` permitted for query ``i`` iff ``j <= i + off``.
    ``variant`` None or a :class:`_Variant` (aligned offset, window, softcap, ALiBi slope, sink
    and the sequence's key / query lengths).
    Returns ``(out (L, ev), lse (L,), weights (L, S))``.
    """
    n_keys = len(k_rows)
    out, lse, weights = [], [], []
    for i, q in enumerate(q_rows):
        if variant is not None and i >= variant.n_queries:
            # a padding query row past the sequence's query length: zeros, lse -inf
            out.append([0.0] * ev)
            lse.append(-math.inf)
            weights.append([0.0] * n_keys)
            continue
        scores = []
        for j in range(n_keys):
            if keep is not None and not keep[i][j]:
                scores.append(None)
                continue
            if causal_offset is not None and j > i + causal_offset:
                scores.append(None)
                continue
            if variant is not None and not variant.permits(i, j):
                scores.append(None)
                continue
            if len(q) == 0:
                score = 0.0  # E == 0: the scores are 0 whatever the scale
            else:
                score = scale * _sum(q[e] * k_rows[j][e] for e in range(len(q)))
            if variant is not None:
                score = variant.adjust(score, i, j)
            if add is not None:
                score = score + add[i][j]
            scores.append(score)
        row_weights, _, row_lse = _softmax_row(
            scores, None if variant is None else variant.sink
        )
        if math.isnan(row_lse):  # a NaN row, also one with no key at all (S = 0, NaN sink)
            out.append([math.nan] * ev)
        else:
            out.append(
                [
                    _sum(row_weights[j] * v_rows[j][d] for j in range(n_keys)
                         if row_weights[j] != 0.0)
                    for d in range(ev)
                ]
            )
        lse.append(row_lse)
        weights.append(row_weights)
    return out, lse, weights


class _Variant:
    """The attention-variant options of one (batch entry, head): see the module docstring.

    ``offset``: aligned position ``p(i) = i + offset``; ``window``: ``(left, right)``, each an
    int or None; ``softcap``: float or None; ``slope``: ALiBi slope or None; ``sink``: sink
    logit or None; ``n_keys`` / ``n_queries``: the clipped key and query lengths ``K_b``, ``L_b``.
    """

    def __init__(self, offset, window, softcap, slope, sink, n_keys, n_queries):
        self.offset = offset
        self.window = window
        self.softcap = softcap
        self.slope = slope
        self.sink = sink
        self.n_keys = n_keys
        self.n_queries = n_queries

    def permits(self, i, j):
        """Key length and window rules (the causal rule and the masks are checked apart)."""
        if j >= self.n_keys:
            return False
        if self.window is not None:
            left, right = self.window
            position = i + self.offset
            if left is not None and j < position - left:
                return False
            if right is not None and j > position + right:
                return False
        return True

    def adjust(self, score, i, j):
        """Softcap, then the ALiBi bias, applied to the scaled score of a permitted key."""
        if self.softcap is not None:
            score = self.softcap * math.tanh(score / self.softcap)
        if self.slope is not None:
            score = score + (-self.slope) * float(abs(i + self.offset - j))
        return score


def _qkv_matrices(query, key, value, query_cols=None, widths=("E", "Ev")):
    """``query``, ``key``, ``value`` as float matrices (``query_cols``: the width query must have,
    if known); key and value must have the same number of rows. ``widths`` names the widths of
    key and value in that error message."""
    q_rows = _matrix(query, "query", cols=query_cols)
    k_rows = _matrix(key, "key")
    v_rows = _matrix(value, "value")
    if len(v_rows) != len(k_rows):
        raise ValueError(
            f"key has {len(k_rows)} rows but value has {len(v_rows)}; expected key "
            f"(S, {widths[0]}) and value (S, {widths[1]})"
        )
    return q_rows, k_rows, v_rows


def _sdpa_2d(query, key, value, attn_mask, is_causal, scale, causal_alignment, value_dim,
             options, per_batch):
    q_rows, k_rows, v_rows = _qkv_matrices(query, key, value)
    n_queries, n_keys = len(q_rows), len(k_rows)
    e_query = len(q_rows[0]) if n_queries else None
    e_key = len(k_rows[0]) if n_keys else None
    if e_query is not None and e_key is not None and e_query != e_key:
        raise ValueError(
            f"query has E={e_query} columns but key has {e_key}; expected query (L, E) and "
            "key (S, E)"
        )
    head_dim = e_query if e_query is not None else e_key

    keep = add = None
    if attn_mask is not None:
        mask_shape = _nested_shape(
            attn_mask, "attn_mask", f"a nested list of shape (L, S) = ({n_queries}, {n_keys})"
        )
        expected = (n_queries, n_keys) if n_queries else (0,)
        if mask_shape != expected:
            raise ValueError(
                f"attn_mask must have shape (L, S) = ({n_queries}, {n_keys}); got {mask_shape}"
            )
        kind = _mask_kind(_flatten(attn_mask), "attn_mask")
        if kind == "bool":
            keep = [list(row) for row in attn_mask]
        else:
            add = [[float(v) for v in row] for row in attn_mask]

    if n_queries == 0:
        return [], []
    if n_keys > 0:
        ev = len(v_rows[0])
    elif value_dim is None:
        raise ValueError(
            "value has no rows (S == 0), so its width Ev cannot be inferred; pass value_dim=Ev"
        )
    else:
        ev = value_dim

    if scale is None:
        scale = 1.0 / math.sqrt(head_dim) if head_dim else 1.0
    variant = _make_variant(options, per_batch, n_queries, n_keys, causal_alignment)
    causal_offset = None
    if is_causal:
        if variant is not None:
            causal_offset = variant.offset
        else:
            causal_offset = 0 if causal_alignment == "top_left" else n_keys - n_queries
    out, lse, _ = _attend(q_rows, k_rows, v_rows, ev, scale, keep, add, causal_offset, variant)
    return out, lse


def _make_variant(options, per_batch, n_queries, n_keys, causal_alignment):
    """The :class:`_Variant` of one 2-D problem, or None when no variant option is given."""
    window, softcap = options
    for name, value in per_batch.items():
        if _is_seq(value):
            raise ValueError(
                f"{name} does not broadcast to the batch dimensions of query, key and value; "
                "expected one entry per batch entry (and head)"
            )
    if window is None and softcap is None and all(v is None for v in per_batch.values()):
        return None
    key_length = per_batch["key_lengths"]
    query_length = per_batch["query_lengths"]
    n_valid_keys = n_keys if key_length is None else min(key_length, n_keys)
    n_valid_queries = n_queries if query_length is None else min(query_length, n_queries)
    offset = 0 if causal_alignment == "top_left" else n_valid_keys - n_valid_queries
    return _Variant(offset, window, softcap, per_batch["alibi_slopes"], per_batch["sinks"],
                    n_valid_keys, n_valid_queries)


def _sdpa_any(query, key, value, attn_mask, is_causal, scale, causal_alignment, value_dim,
              options, per_batch):
    args = (("query", query), ("key", key), ("value", value), ("attn_mask", attn_mask))
    ndims = []
    for name, arg in args:
        if arg is None:
            continue
        if not _is_seq(arg):
            raise ValueError(
                f"{name} must be a nested list with at least 2 dimensions; got "
                f"{type(arg).__name__}"
            )
        ndims.append(len(_shape(arg, name)))
    rest = (is_causal, scale, causal_alignment, value_dim, options, per_batch)
    if max(ndims) >= 3:
        return _sdpa_batched(query, key, value, attn_mask, *rest)
    try:
        return _sdpa_2d(query, key, value, attn_mask, *rest)
    except ValueError:
        if _split_batch(args):
            try:
                return _sdpa_batched(query, key, value, attn_mask, *rest)
            except ValueError:
                pass
        raise


def _sdpa_batched(query, key, value, attn_mask, *rest):
    batch = _check_batch(
        (("query", query), ("key", key), ("value", value), ("attn_mask", attn_mask))
    )
    *rest, per_batch = rest
    outs, lses = [], []
    for b in range(batch):
        mask_b = None if attn_mask is None else attn_mask[b]
        per_batch_b = {}
        for name, arg in per_batch.items():
            if _is_seq(arg):
                if len(arg) != batch:
                    raise ValueError(
                        f"{name} does not broadcast to the batch dimensions: it has {len(arg)} "
                        f"entries where the batch has {batch}"
                    )
                arg = arg[b]
            per_batch_b[name] = arg
        out_b, lse_b = _sdpa_any(query[b], key[b], value[b], mask_b, *rest, per_batch_b)
        outs.append(out_b)
        lses.append(lse_b)
    return outs, lses


def _dequantize(x, scale, name, scale_name):
    """``x`` (nested list, shape (..., S, E)) times ``scale`` broadcast (NumPy's rules) to
    ``x``'s shape[:-1] + (1,): per token and head, per head, or one number. The products are
    exact for 8-bit values and float32 scales (at most 4 + 24 significant bits)."""
    shape = _nested_shape(x, name, "a nested list (..., length, dim)")
    if len(shape) < 2:
        raise ValueError(f"{name} must have at least 2 dimensions (..., length, dim); got shape "
                         f"{shape}")
    sshape = _shape(scale, scale_name) if _is_seq(scale) else ()
    for v in (_flatten(scale) if _is_seq(scale) else [scale]):
        if not math.isfinite(_as_float(v, scale_name)):
            raise ValueError(f"{scale_name} holds {v!r}; expected finite scales")
    target = shape[:-1] + (1,)
    if len(sshape) > len(target) or any(
            n not in (1, t) for n, t in zip(reversed(sshape), reversed(target))):
        raise ValueError(f"{scale_name} has shape {sshape}, which does not broadcast to "
                         f"{target} ({name}'s shape[:-1] + (1,))")
    lead = len(shape) - len(sshape)

    def scaled(xn, sn, depth):
        if depth == len(shape):
            return _as_float(xn, name) * float(sn)
        j = depth - lead
        return [scaled(xi, sn if j < 0 else sn[0 if sshape[j] == 1 else i], depth + 1)
                for i, xi in enumerate(xn)]

    return scaled(x, scale, 0)


def _check_window(window):
    """``window`` as ``None`` or a ``(left, right)`` tuple of non-negative ints or None."""
    if window is None:
        return None
    if not _is_seq(window):
        raise TypeError(
            f"window must be a (left, right) pair of non-negative ints or None; got "
            f"{window!r} of type {type(window).__name__}"
        )
    if len(window) != 2:
        raise ValueError(
            f"window must be a (left, right) pair; got {len(window)} entries: {window!r}"
        )
    sides = []
    for side, value in zip(("left", "right"), window):
        if value is None:
            sides.append(None)
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(
                f"window {side} side must be a non-negative int or None; got {value!r} of "
                f"type {type(value).__name__}"
            )
        if value < 0:
            raise ValueError(f"window {side} side must be >= 0 (or None); got {value}")
        sides.append(int(value))
    return tuple(sides)


def _check_softcap(softcap):
    """``softcap`` as None or a finite float > 0."""
    if softcap is None:
        return None
    softcap = _as_float(softcap, "softcap")
    if not (softcap > 0.0 and math.isfinite(softcap)):
        raise ValueError(f"softcap must be a finite number > 0; got {softcap!r}")
    return softcap


def _batch_dims(query, key, value):
    """Batch dimensions of the attention inputs: those of the input with the most dimensions
    (the oracle does not broadcast them; empty inner lists may hide trailing dimensions)."""
    best = ()
    for arg in (query, key, value):
        if _is_seq(arg):
            shape = _shape(arg, "input")
            if len(shape) > len(best):
                best = shape
    return best[:-2] if len(best) >= 2 else ()


def _per_batch(value, name, batch, integer):
    """A per-batch argument broadcast (NumPy rules) to the nested-list shape ``batch``.

    ``integer``: entries must be non-negative ints (lengths), else real numbers (floats).
    Returns None for None, a Python scalar for ``batch == ()``.
    """
    if value is None:
        return None
    shape = _shape(value, name) if _is_seq(value) else ()
    if len(shape) > len(batch) or any(
        d != 1 and d != b for d, b in zip(reversed(shape), reversed(batch))
    ):
        raise ValueError(
            f"{name} has shape {shape}, which does not broadcast to the batch dimensions "
            f"{batch} of query, key and value"
        )

    def convert(leaf):
        if integer:
            if isinstance(leaf, bool) or not isinstance(leaf, numbers.Integral):
                raise TypeError(
                    f"{name} holds {leaf!r} of type {type(leaf).__name__}; expected integers"
                )
            if leaf < 0:
                raise ValueError(f"{name} must be >= 0; got {leaf}")
            return int(leaf)
        return _as_float(leaf, name)

    flat = [convert(leaf) for leaf in _flatten(value)]
    shape = (1,) * (len(batch) - len(shape)) + shape

    def expand(flat_index_base, depth):
        if depth == len(batch):
            return flat[flat_index_base]
        inner = 1
        for size in shape[depth + 1:]:
            inner *= size
        return [
            expand(flat_index_base + (0 if shape[depth] == 1 else b) * inner, depth + 1)
            for b in range(batch[depth])
        ]

    return expand(0, 0)  # an empty batch dimension gives empty lists, never reading ``flat``


def scaled_dot_product_attention(
    query,
    key,
    value,
    attn_mask=None,
    is_causal=False,
    scale=None,
    *,
    causal_alignment="top_left",
    return_lse=False,
    value_dim=None,
    window=None,
    softcap=None,
    sinks=None,
    alibi_slopes=None,
    key_lengths=None,
    query_lengths=None,
    key_scale=None,
    value_scale=None,
):
    """Scaled dot-product attention: ``softmax(scale * Q K^T + mask) V``, one row at a time.

    Parameters
    ----------
    query : nested list of float, shape (..., L, E)
    key : nested list of float, shape (..., S, E)
    value : nested list of float, shape (..., S, Ev)
        Leading batch dimensions, if any, must be identical on all three (no broadcasting).
    attn_mask : nested list of bool or of float, shape (..., L, S), optional
        Already broadcast: it has the same leading dimensions as ``query``. bool: True = the key
        takes part (a False key is never read); float: added to the scaled scores.
    is_causal : bool, default False
        Restrict query ``i`` to keys ``j <= i + off`` (composed with a bool mask by AND).
    scale : float, optional
        Multiplies ``Q K^T`` (never the mask). Default ``1 / sqrt(E)``, or 1.0 when ``E == 0``.
        An explicit value, including 0.0, is honoured.
    causal_alignment : {"top_left", "bottom_right"}, default "top_left"
        ``off = 0`` for "top_left" (PyTorch, JAX); ``off = S - L`` for "bottom_right"
        (flash-attn >= 2.1, decoding with a KV cache).
    return_lse : bool, default False
        Also return the log-sum-exp of each row.
    value_dim : int, optional
        Ev, used only when ``S == 0`` (an empty ``value`` does not carry its width).
    window : (left, right), optional
        Sliding window: query ``i`` may see key ``j`` only if
        ``p(i) - left <= j <= p(i) + right`` (``p(i)`` the aligned position, see below); each side
        a non-negative int or None (unbounded). Hugging Face's ``sliding_window=W`` with
        ``is_causal=True`` is ``window=(W - 1, 0)``.
    softcap : float, optional
        Logit softcap ``c`` (finite, > 0): each scaled score ``s`` becomes ``c * tanh(s / c)``
        before ALiBi and the float mask.
    sinks : float or nested list of float, optional
        Sink logit per batch entry (e.g. per head), broadcastable (NumPy rules) to the batch
        dimensions: joins each row's softmax denominator with no value; lse includes it.
    alibi_slopes : float or nested list of float, optional
        ALiBi slope per batch entry, broadcastable to the batch dimensions: ``-slope * |p(i) - j|``
        is added to the scores after the softcap.
    key_lengths, query_lengths : int or nested list of int, optional
        Per batch entry, broadcastable to the batch dimensions, >= 0 (clipped to S / L): keys
        ``j >= key_lengths`` take no part; query rows ``i >= query_lengths`` give output 0 and lse
        ``-inf``. With ``"bottom_right"`` they set the aligned position
        ``p(i) = i + K_b - L_b``.
    key_scale, value_scale : float or nested list of float, optional
        Dequantisation scales of an 8-bit K/V cache (int8 or float8_e4m3fn values given as
        numbers), broadcastable (NumPy rules) to ``key``'s (``value``'s) shape[:-1] + (1,):
        per token and head, per head, or one number. The key used is exactly
        ``key * key_scale`` (float64; exact for 8-bit values and float32 scales), likewise the
        value; everything else is as without them. Non-finite scales or a shape that does not
        broadcast raise ValueError, non-real entries TypeError.

    Returns
    -------
    out : list, shape (..., L, Ev)
    lse : list, shape (..., L)
        Only with ``return_lse=True``: ``m + log(Z)`` of the scaled, masked scores (and the sink);
        ``-inf`` for a fully masked row, NaN for a NaN row.

    Raises
    ------
    ValueError
        If the shapes are inconsistent (E of query and key, S of key and value, mask shape, batch
        dimensions), ``causal_alignment`` is not one of the two names, ``S == 0`` with ``L > 0``
        and no ``value_dim``, ``value_dim`` is negative, ``window`` is not a pair or has a side
        < 0, ``softcap`` is not finite and > 0, a length is negative, or ``sinks`` /
        ``alibi_slopes`` / ``key_lengths`` / ``query_lengths`` does not broadcast to the batch
        dimensions.
    TypeError
        If an entry is not a real number (or is a bool), a mask holds integers or mixes bool and
        float, ``scale`` / ``value_dim`` / ``softcap`` has the wrong type, ``window`` is not a
        sequence or a side is not an int or None, ``sinks`` / ``alibi_slopes`` hold non-real
        entries, or ``key_lengths`` / ``query_lengths`` hold non-integers (bool included).

    Notes
    -----
    A row whose keys are all removed (bool mask, causal rule, ``-inf`` float mask, or ``S == 0``)
    is fully masked: output 0 and lse ``-inf``. A NaN or ``+inf`` permitted score makes the row
    NaN. Keys whose weight is exactly 0 are skipped in the output sum, so NaN/inf in masked keys or
    values cannot leak. All sums use :func:`math.fsum`. Source: Vaswani et al. 2017, eq. (1).

    The aligned position of row ``i`` is ``p(i) = i`` (``"top_left"``) or ``i + K_b - L_b``
    (``"bottom_right"``; ``K_b``, ``L_b`` the clipped key and query lengths, S and L when not
    given); the causal rule is ``j <= p(i)``. Keys past ``K_b`` or outside the window are
    removed like bool-masked keys (never read). With a sink ``t``, a row with no permitted key
    gives output 0 and lse ``t``; ``t = +inf`` gives output 0 and lse ``+inf`` (unless the row
    is NaN), a NaN sink a NaN row. The variant semantics and their sources are in the module
    docstring.

    Examples
    --------
    >>> out = scaled_dot_product_attention([[1.0]], [[2.0], [1.0], [0.0]],
    ...                                    [[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]], scale=1.0)
    >>> [[round(v, 3) for v in row] for row in out]
    [[0.935, 0.579]]
    >>> scaled_dot_product_attention([[1.0]], [[1.0]], [[5.0]], attn_mask=[[False]],
    ...                              return_lse=True)
    ([[0.0]], [-inf])
    >>> scaled_dot_product_attention([[0.0]], [[0.0]], [[4.0]], sinks=0.0, return_lse=True)
    ([[2.0]], [0.6931471805599453])
    >>> scaled_dot_product_attention([[0.0], [0.0]], [[0.0], [0.0]], [[1.0], [3.0]],
    ...                              is_causal=True, window=(0, 0))
    [[1.0], [3.0]]
    """
    if causal_alignment not in _CAUSAL_ALIGNMENTS:
        raise ValueError(
            f"causal_alignment must be 'top_left' or 'bottom_right'; got {causal_alignment!r}"
        )
    if scale is not None:
        scale = _as_float(scale, "scale")
    if value_dim is not None:
        if isinstance(value_dim, bool) or not isinstance(value_dim, numbers.Integral):
            raise TypeError(f"value_dim must be an int; got {value_dim!r}")
        if value_dim < 0:
            raise ValueError(f"value_dim must be >= 0; got {value_dim}")
        value_dim = int(value_dim)
    if key_scale is not None:
        key = _dequantize(key, key_scale, "key", "key_scale")
    if value_scale is not None:
        value = _dequantize(value, value_scale, "value", "value_scale")
    options = (_check_window(window), _check_softcap(softcap))
    per_batch = {"sinks": sinks, "alibi_slopes": alibi_slopes, "key_lengths": key_lengths,
                 "query_lengths": query_lengths}
    if any(v is not None for v in per_batch.values()):
        batch = _batch_dims(query, key, value)
        for name in per_batch:
            per_batch[name] = _per_batch(per_batch[name], name, batch,
                                         integer=name.endswith("_lengths"))
    out, lse = _sdpa_any(
        query, key, value, attn_mask, bool(is_causal), scale, causal_alignment, value_dim,
        options, per_batch,
    )
    return (out, lse) if return_lse else out

