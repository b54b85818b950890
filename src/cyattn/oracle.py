"""Pure-Python reference implementation of cyattn (the test suite's ground truth).

This module re-implements every public computation of cyattn -- masked row softmax and log-softmax,
``out + alpha * (a @ b)``, scaled dot-product attention and multi-head attention -- with nothing but
the Python standard library: nested lists of Python floats, :func:`math.exp`, :func:`math.log` and
:func:`math.fsum`. It is written for clarity, not speed, and every sum is an exactly rounded
:func:`math.fsum`, so its results are the most accurate float64 values the formulas allow. The
compiled kernels are tested against it.

Inputs are nested lists (or tuples) of Python numbers; ``x.tolist()`` of a NumPy array is the
intended way to build them. Data entries may be ``float`` or ``int`` (converted to float); ``bool``
data is a ``TypeError``. Masks hold either only ``bool`` or only ``float`` values; an integer mask
entry is a ``TypeError``. Results are new nested lists of Python floats; inputs are never modified.

Semantics (identical to the compiled kernels)
---------------------------------------------
Row softmax of scores ``s_j``:

* bool mask: True = take part. A masked (False) position is never read and gets weight exactly 0.
* float mask: added to the scores (``s_j = x_j + mask_j``); ``-inf`` removes a position; finite
  values, even ``-1e9``, are plain arithmetic and do not mask.
* The *candidates* are the permitted positions. If any candidate score is NaN or ``+inf``, the whole
  row is NaN.
* Else, if there is no candidate or every candidate score is ``-inf``, the row is *fully masked*:
  weights all 0, log-softmax all ``-inf``, attention output 0, lse ``-inf``. No NaN, no warning;
  the same holds without a mask.
* Else ``m = max(candidates)``, ``e_j = exp(s_j - m)``, ``Z = fsum(e_j)``, ``w_j = e_j / Z`` (0 for
  non-candidates) and ``log_softmax_j = s_j - m - log(Z)`` (``-inf`` for non-candidates).

Attention, per query row ``i`` (one head):

* Key ``j`` is permitted if the bool mask is True there (when a bool mask is given) and, with
  ``is_causal``, ``j <= i + off`` with ``off = 0`` for ``causal_alignment="top_left"`` and
  ``off = S - L`` for ``"bottom_right"``.
* ``s_j = scale * fsum(q_i * k_j)`` for permitted ``j`` only (plus the float mask value when the
  mask is float). Non-permitted keys are never read. ``scale`` defaults to ``1 / sqrt(E)``; when
  ``E == 0`` the scores are 0 and the default scale is 1.0 (the result is the mean of V). An
  explicit scale, even 0.0, is honoured and multiplies ``Q K^T`` only, never the mask.
* ``w`` is the row softmax above, ``out_i = fsum(w_j * v_j)`` over the ``j`` with ``w_j != 0`` (a
  key whose weight is exactly 0 is never read, so NaN/inf in masked values cannot leak), and
  ``lse_i = m + log(Z)`` (``-inf`` for a fully masked row, NaN for a NaN row).
* ``S == 0`` is a fully masked row (zeros); ``L == 0`` gives an empty result.

Attention variants (keyword arguments of :func:`scaled_dot_product_attention`; without them the
results are exactly the above). Per batch entry ``b``: ``K_b = min(key_lengths[b], S)`` (S when
not given), ``L_b = min(query_lengths[b], L)`` (L when not given), and the *aligned position*
of query row ``i`` is ``p(i) = i`` for ``"top_left"`` and ``p(i) = i + K_b - L_b`` for
``"bottom_right"`` (``i + S - L`` without lengths, the rule above).

* Key ``j`` is permitted iff ``j < K_b``, the causal rule ``j <= p(i)`` (with ``is_causal``),
  the window rule ``p(i) - left <= j <= p(i) + right`` (with ``window=(left, right)``, ``None``
  = unbounded side) and the bool mask all permit it.
* Rows ``i >= L_b`` give output 0 and lse ``-inf`` (also with sinks).
* Score of a permitted key: ``s = scale * q.k``; with ``softcap=c``: ``s = c * tanh(s / c)``;
  with ALiBi slope ``a``: ``s = s + (-a) * |p(i) - j|``; then the float mask is added.
* A sink logit ``t`` joins the denominator with no value: ``m' = max(m, t)``,
  ``Z = fsum(exp(s_j - m')) + exp(t - m')``, ``w_j = exp(s_j - m') / Z``, ``lse = m' + log(Z)``.
  A row with no candidate (or all ``-inf``) gives output 0 and lse ``t``; ``t = -inf`` has no
  effect; ``t = +inf`` gives output 0 and lse ``+inf`` unless a candidate is NaN or ``+inf``
  (row NaN); a NaN sink makes the row NaN.

Source: Vaswani et al. 2017, "Attention Is All You Need" (scaled dot-product and multi-head
attention). Variants: Beltagy et al. 2020 (Longformer) and Jiang et al. 2023 (Mistral 7B) for
sliding windows, Gemma Team 2024 (Gemma 2) for the logit softcap, Press et al. 2022 (ALiBi),
OpenAI 2025 (gpt-oss) and Xiao et al. 2024 (attention sinks) for sinks.

Notes
-----
Empty nested lists do not carry their full shape (``[]`` may be ``(0,)`` or ``(0, 5)``). The oracle
reads the shape from the nesting and the other arguments; in the rare case where a batched call has
empty inner dimensions that make the 2-D reading inconsistent, it retries the call as batched.
"""

import itertools
import math
import numbers

__all__ = [
    "softmax",
    "log_softmax",
    "matmul_accumulate",
    "scaled_dot_product_attention",
    "multi_head_attention",
]

_CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")


# --------------------------------------------------------------------------------------------
# Nested-list helpers
# --------------------------------------------------------------------------------------------


def _is_seq(x):
    return isinstance(x, (list, tuple))


def _shape(x, name):
    """Shape of a rectangular nested list; ``()`` for a scalar. Raises ValueError if ragged."""
    if not _is_seq(x):
        return ()
    if len(x) == 0:
        return (0,)
    sub_shapes = [_shape(item, name) for item in x]
    first = sub_shapes[0]
    for index, sub in enumerate(sub_shapes):
        if sub != first:
            raise ValueError(
                f"{name} is a ragged nested list: element 0 has shape {first} but element "
                f"{index} has shape {sub}; expected a rectangular nested list"
            )
    return (len(x),) + first


def _flatten(x):
    """Leaves of a nested list in row-major order."""
    if not _is_seq(x):
        return [x]
    flat = []
    for item in x:
        flat.extend(_flatten(item))
    return flat


def _unflatten(flat, shape, start=0):
    """Inverse of :func:`_flatten` for a known shape (``len(shape) >= 1``)."""
    if len(shape) == 1:
        return list(flat[start:start + shape[0]])
    inner = 1
    for size in shape[1:]:
        inner *= size
    return [_unflatten(flat, shape[1:], start + i * inner) for i in range(shape[0])]


def _as_float(value, name):
    """A data entry as a Python float: real numbers only, bool rejected."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} holds {value!r} of type {type(value).__name__}; expected real numbers "
            "(float or int)"
        )
    return float(value)


def _mask_kind(flat, name):
    """'bool' or 'float' for the leaves of a mask; integers, mixtures and others are TypeError."""
    kinds = set()
    for value in flat:
        if isinstance(value, bool):
            kinds.add("bool")
        elif isinstance(value, numbers.Integral):
            raise TypeError(
                f"{name} holds the integer {value!r}; integer masks are not accepted, expected "
                "bool (a selection) or float (added to the scores)"
            )
        elif isinstance(value, numbers.Real):
            kinds.add("float")
        else:
            raise TypeError(
                f"{name} holds {value!r} of type {type(value).__name__}; expected bool or float"
            )
    if len(kinds) > 1:
        raise TypeError(f"{name} mixes bool and float entries; expected all bool or all float")
    return kinds.pop() if kinds else "bool"


def _sum(values):
    """Exactly rounded sum that follows IEEE arithmetic for non-finite values.

    :func:`math.fsum` raises on ``inf + -inf`` and on intermediate overflow; here the first gives
    NaN (as IEEE addition does) and the second is summed exactly at a power-of-two scale, which
    rounds to ``+-inf`` only if the exact sum itself overflows.
    """
    values = list(values)
    if any(not math.isfinite(v) for v in values):
        if any(math.isnan(v) for v in values):
            return math.nan
        has_pos = any(v == math.inf for v in values)
        has_neg = any(v == -math.inf for v in values)
        if has_pos and has_neg:
            return math.nan
        return math.inf if has_pos else -math.inf
    try:
        return math.fsum(values)
    except OverflowError:
        scaled = math.fsum(math.ldexp(v, -64) for v in values)
        return scaled * 2.0 ** 64  # float multiplication rounds to +-inf instead of raising


def _softmax_row(scores, sink=None):
    """Row softmax of ``scores`` (None marks a non-candidate position).

    ``sink``, when not None, is an extra logit that joins the denominator with no position of
    its own (attention sinks). Returns ``(weights, log_weights, lse)`` as in the module
    docstring.
    """
    n = len(scores)
    candidates = [s for s in scores if s is not None]
    if any(math.isnan(s) or s == math.inf for s in candidates):
        return [math.nan] * n, [math.nan] * n, math.nan
    if sink is not None:
        if math.isnan(sink):
            return [math.nan] * n, [math.nan] * n, math.nan
        if sink == math.inf:  # all the weight goes to the sink
            return [0.0] * n, [-math.inf] * n, math.inf
        if sink == -math.inf:  # exp(-inf) = 0: no effect
            sink = None
    if not candidates or all(s == -math.inf for s in candidates):
        if sink is not None:
            return [0.0] * n, [-math.inf] * n, sink
        return [0.0] * n, [-math.inf] * n, -math.inf
    row_max = max(candidates) if sink is None else max(max(candidates), sink)
    exps = [None if s is None else math.exp(s - row_max) for s in scores]
    row_sum = math.fsum([e for e in exps if e is not None]
                        + ([] if sink is None else [math.exp(sink - row_max)]))
    log_sum = math.log(row_sum)
    weights = [0.0 if e is None else e / row_sum for e in exps]
    log_weights = [-math.inf if s is None else (s - row_max) - log_sum for s in scores]
    return weights, log_weights, row_max + log_sum


def _matrix(x, name, rows=None, cols=None):
    """Validate a 2-D nested list and convert it to a list of lists of floats.

    ``[]`` is accepted as a matrix with zero rows. ``rows`` / ``cols``, when not None, are the
    expected sizes (``cols`` is only checkable when there is at least one row).
    """
    if not _is_seq(x):
        raise ValueError(f"{name} must be a 2-D nested list; got {type(x).__name__}")
    shape = _shape(x, name)
    if len(shape) != 2 and shape != (0,):
        raise ValueError(f"{name} must be 2-D; got a nested list of shape {shape}")
    if rows is not None and len(x) != rows:
        raise ValueError(f"{name} must have {rows} rows; got shape {shape}")
    if cols is not None and len(x) > 0 and shape[1] != cols:
        raise ValueError(f"{name} must have {cols} columns; got shape {shape}")
    return [[_as_float(v, name) for v in row] for row in x]


def _vector(x, name, length):
    if not _is_seq(x):
        raise ValueError(f"{name} must be a 1-D list; got {type(x).__name__}")
    shape = _shape(x, name)
    if shape != (length,):
        raise ValueError(f"{name} must have shape ({length},); got {shape}")
    return [_as_float(v, name) for v in x]


def _normalize_axis(axis, ndim):
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis must be an int; got {axis!r} of type {type(axis).__name__}")
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"axis {axis} is out of range for x with {ndim} dimension(s); expected "
            f"{-ndim} <= axis < {ndim}"
        )
    return axis % ndim


def _split_batch(name_value_pairs):
    """True if every given argument is a non-scalar list whose items are all lists, equal length."""
    lengths = set()
    for _, value in name_value_pairs:
        if value is None:
            continue
        if not _is_seq(value) or not all(_is_seq(item) for item in value):
            return False
        lengths.add(len(value))
    return len(lengths) == 1


def _check_batch(name_value_pairs):
    """Batched arguments must all have the same leading length; returns it."""
    lengths = {}
    for name, value in name_value_pairs:
        if value is None:
            continue
        if not _is_seq(value):
            raise ValueError(f"{name} must be a nested list; got {type(value).__name__}")
        lengths[name] = len(value)
    if len(set(lengths.values())) > 1:
        got = ", ".join(f"{name} has {n}" for name, n in lengths.items())
        raise ValueError(
            f"batched arguments must have identical leading batch dimensions; got {got}"
        )
    return next(iter(lengths.values()))


# --------------------------------------------------------------------------------------------
# Softmax
# --------------------------------------------------------------------------------------------


def _softmax_nd(x, axis, mask, want_log):
    if not _is_seq(x):
        raise ValueError(
            f"x must be a nested list with at least 1 dimension; got {type(x).__name__}"
        )
    shape = _shape(x, "x")
    ndim = len(shape)
    axis = _normalize_axis(axis, ndim)
    flat = [_as_float(v, "x") for v in _flatten(x)]

    mask_kind = None
    mask_flat = None
    if mask is not None:
        mask_shape = _shape(mask, "mask") if _is_seq(mask) else ()
        if mask_shape != shape:
            raise ValueError(
                f"mask must have the same shape as x {shape}; got {mask_shape}"
            )
        mask_flat = _flatten(mask)
        mask_kind = _mask_kind(mask_flat, "mask")

    strides = [1] * ndim
    for d in range(ndim - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    other_axes = [d for d in range(ndim) if d != axis]

    result = [0.0] * len(flat)
    for index in itertools.product(*(range(shape[d]) for d in other_axes)):
        base = sum(i * strides[d] for i, d in zip(index, other_axes))
        positions = [base + j * strides[axis] for j in range(shape[axis])]
        scores = []
        for p in positions:
            if mask_kind == "bool" and not mask_flat[p]:
                scores.append(None)  # not a candidate: never read
            elif mask_kind == "float":
                scores.append(flat[p] + float(mask_flat[p]))
            else:
                scores.append(flat[p])
        weights, log_weights, _ = _softmax_row(scores)
        for p, value in zip(positions, log_weights if want_log else weights):
            result[p] = value
    return _unflatten(result, shape)


def softmax(x, axis=-1, *, mask=None):
    """Masked, numerically stable softmax along ``axis``: ``exp(x - max) / sum(exp(x - max))``.

    Parameters
    ----------
    x : nested list of float, any depth >= 1
        The scores. A plain list of floats is 1-D. Not modified.
    axis : int, default -1
        The axis along which each row is normalised; negative values count from the end.
    mask : nested list of bool or of float, same shape as ``x``, optional
        bool: True = the position takes part; a False position is never read and gets weight 0.
        float: added to ``x`` before the softmax (``-inf`` removes a position; finite values, even
        ``-1e9``, only shift the score).

    Returns
    -------
    list
        A new nested list of floats with the shape of ``x``. Each row that is not fully masked sums
        to 1 (up to rounding).

    Raises
    ------
    ValueError
        If ``x`` is a scalar or ragged, ``axis`` is out of range, or ``mask`` has a different shape.
    TypeError
        If ``axis`` is not an int, ``x`` holds non-real or bool entries, or ``mask`` holds integers,
        a mix of bool and float, or other types.

    Notes
    -----
    A row with a NaN or ``+inf`` candidate score is entirely NaN. A row with no candidate, or whose
    candidate scores are all ``-inf`` (with or without a mask), is fully masked and gives zeros.
    The denominator is summed with :func:`math.fsum`. Source: Vaswani et al. 2017.

    Examples
    --------
    >>> [round(w, 3) for w in softmax([2.0, 1.0, 0.0])]
    [0.665, 0.245, 0.09]
    >>> softmax([1.0, 5.0, 1.0], mask=[True, False, True])
    [0.5, 0.0, 0.5]
    >>> softmax([-math.inf, -math.inf])
    [0.0, 0.0]
    """
    return _softmax_nd(x, axis, mask, want_log=False)


def log_softmax(x, axis=-1, *, mask=None):
    """Masked log-softmax along ``axis``: ``x - max - log(sum(exp(x - max)))``.

    Parameters
    ----------
    x : nested list of float, any depth >= 1
        The scores. A plain list of floats is 1-D. Not modified.
    axis : int, default -1
        The axis along which each row is normalised; negative values count from the end.
    mask : nested list of bool or of float, same shape as ``x``, optional
        bool: True = the position takes part; a False position is never read and gets ``-inf``.
        float: added to ``x`` before the log-softmax.

    Returns
    -------
    list
        A new nested list of floats with the shape of ``x``; equal to ``log(softmax(x))`` up to
        rounding, but computed without the ``log`` of a rounded weight.

    Raises
    ------
    ValueError
        If ``x`` is a scalar or ragged, ``axis`` is out of range, or ``mask`` has a different shape.
    TypeError
        If ``axis`` is not an int, ``x`` holds non-real or bool entries, or ``mask`` holds integers,
        a mix of bool and float, or other types.

    Notes
    -----
    A row with a NaN or ``+inf`` candidate score is entirely NaN; a fully masked row is entirely
    ``-inf``. Source: Vaswani et al. 2017.

    Examples
    --------
    >>> log_softmax([0.0, 0.0]) == [-math.log(2.0)] * 2
    True
    >>> log_softmax([3.0, 1.0], mask=[False, True])
    [-inf, 0.0]
    """
    return _softmax_nd(x, axis, mask, want_log=True)


# --------------------------------------------------------------------------------------------
# Matmul-accumulate
# --------------------------------------------------------------------------------------------


def _matmul_2d(a, b, out, alpha):
    a_rows = _matrix(a, "a")
    b_rows = _matrix(b, "b")
    out_rows = _matrix(out, "out")
    m, k = len(a_rows), len(b_rows)
    if m > 0 and len(a_rows[0]) != k:
        raise ValueError(
            f"a has {len(a_rows[0])} columns but b has {k} rows; expected a (M, K) and b (K, N)"
        )
    if len(out_rows) != m:
        raise ValueError(f"out has {len(out_rows)} rows but a has {m}; expected out (M, N)")
    if m == 0:
        return []
    n = len(out_rows[0])
    if k > 0 and len(b_rows[0]) != n:
        raise ValueError(
            f"b has {len(b_rows[0])} columns but out has {n}; expected b (K, N) and out (M, N)"
        )
    return [
        [
            out_rows[i][j] + alpha * _sum(a_rows[i][p] * b_rows[p][j] for p in range(k))
            for j in range(n)
        ]
        for i in range(m)
    ]


def _matmul_any(a, b, out, alpha):
    args = (("a", a), ("b", b), ("out", out))
    for name, value in args:
        if not _is_seq(value):
            raise ValueError(
                f"{name} must be a nested list with at least 2 dimensions; got "
                f"{type(value).__name__}"
            )
    ndims = [len(_shape(value, name)) for name, value in args]
    if max(ndims) >= 3:
        return _matmul_batched(a, b, out, alpha)
    try:
        return _matmul_2d(a, b, out, alpha)
    except ValueError:
        if _split_batch(args):
            try:
                return _matmul_batched(a, b, out, alpha)
            except ValueError:
                pass
        raise


def _matmul_batched(a, b, out, alpha):
    batch = _check_batch((("a", a), ("b", b), ("out", out)))
    return [_matmul_any(a[i], b[i], out[i], alpha) for i in range(batch)]


def matmul_accumulate(a, b, out, *, alpha=1.0):
    """Return ``out + alpha * (a @ b)`` as a new nested list, each dot product summed exactly.

    Element ``[i][j]`` is ``out[i][j] + alpha * fsum(a[i][k] * b[k][j] for k)``.

    Parameters
    ----------
    a : nested list of float, shape (..., M, K)
    b : nested list of float, shape (..., K, N)
    out : nested list of float, shape (..., M, N)
        The accumulator. Not modified: the result is a new list.
    alpha : float, default 1.0
        Multiplies the product (not ``out``).

    Returns
    -------
    list
        Nested list of shape (..., M, N).

    Raises
    ------
    ValueError
        If an argument is not a nested list of at least 2 dimensions, is ragged, or the shapes are
        inconsistent (inner dimensions differ, or the leading batch dimensions of ``a``, ``b`` and
        ``out`` are not identical; the oracle does not broadcast batch dimensions).
    TypeError
        If an entry or ``alpha`` is not a real number (or is a bool).

    Notes
    -----
    Each product ``a[i][k] * b[k][j]`` is rounded once; their sum is exactly rounded
    (:func:`math.fsum`; ``inf - inf`` gives NaN as in IEEE arithmetic). Source: Vaswani et al. 2017
    (the projections of attention are such products).

    Examples
    --------
    >>> matmul_accumulate([[1.0, 2.0]], [[3.0], [4.0]], [[10.0]], alpha=2.0)
    [[32.0]]
    """
    alpha = _as_float(alpha, "alpha")
    return _matmul_any(a, b, out, alpha)


# --------------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------------


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
        out.append(
            [
                _sum(row_weights[j] * v_rows[j][d] for j in range(n_keys) if row_weights[j] != 0.0)
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


def _sdpa_2d(query, key, value, attn_mask, is_causal, scale, causal_alignment, value_dim,
             options, per_batch):
    q_rows = _matrix(query, "query")
    k_rows = _matrix(key, "key")
    v_rows = _matrix(value, "value")
    n_queries, n_keys = len(q_rows), len(k_rows)
    if len(v_rows) != n_keys:
        raise ValueError(
            f"key has {n_keys} rows but value has {len(v_rows)}; expected key (S, E) and "
            "value (S, Ev)"
        )
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
        if not _is_seq(attn_mask):
            raise ValueError(
                f"attn_mask must be a nested list of shape (L, S) = ({n_queries}, {n_keys}); "
                f"got {type(attn_mask).__name__}"
            )
        mask_shape = _shape(attn_mask, "attn_mask")
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


# --------------------------------------------------------------------------------------------
# Multi-head attention (torch.nn.MultiheadAttention parity, unbatched)
# --------------------------------------------------------------------------------------------


def _linear(x_rows, weight_rows, bias):
    """``x W^T + b`` with each output element summed exactly (bias included in the sum)."""
    return [
        [
            _sum([x[c] * w[c] for c in range(len(x))] + [bias[o]])
            for o, w in enumerate(weight_rows)
        ]
        for x in x_rows
    ]


def multi_head_attention(
    query,
    key,
    value,
    *,
    num_heads,
    in_proj_weight=None,
    in_proj_bias=None,
    out_proj_weight,
    out_proj_bias=None,
    q_proj_weight=None,
    k_proj_weight=None,
    v_proj_weight=None,
    key_padding_mask=None,
    attn_mask=None,
    need_weights=True,
    average_attn_weights=True,
    is_causal=False,
):
    """Multi-head attention ``concat_h(softmax(Q_h K_h^T / sqrt(d) + mask) V_h) W_o^T + b_o``.

    **Masks use torch.nn.MultiheadAttention's polarity: a bool ``key_padding_mask`` or
    ``attn_mask`` entry True means IGNORE that key** (the opposite of
    :func:`scaled_dot_product_attention`). Float masks are added to the scaled scores.

    Unbatched only (torch's 2-D inputs); loop over the batch for batched inputs.

    Parameters
    ----------
    query : nested list of float, shape (L, E)
    key : nested list of float, shape (S, kdim)
    value : nested list of float, shape (S, vdim)
    num_heads : int
        Number of heads H; ``E % H == 0``, head_dim ``d = E // H``, scale ``1 / sqrt(d)``
        (1.0 when ``d == 0``).
    in_proj_weight : nested list of float, shape (3E, E), optional
        Rows ``[W_q; W_k; W_v]`` (requires ``kdim == vdim == E``). Give either this or all three
        of ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight``.
    in_proj_bias : list of float, shape (3E,), optional
        ``[b_q; b_k; b_v]``; zeros when None.
    out_proj_weight : nested list of float, shape (E, E)
    out_proj_bias : list of float, shape (E,), optional
        Zeros when None.
    q_proj_weight, k_proj_weight, v_proj_weight : nested lists of float, optional
        Shapes (E, E), (E, kdim), (E, vdim), used when ``in_proj_weight`` is None.
    key_padding_mask : list of bool or of float, shape (S,), optional
        bool: True = ignore the key; float: added to the scores of every query and head.
    attn_mask : nested list of bool or of float, shape (L, S) or (H, L, S), optional
        bool: True = ignore; float: added. A 3-D mask gives one (L, S) mask per head.
    need_weights : bool, default True
        Return the attention weights.
    average_attn_weights : bool, default True
        Average the weights over the heads (else return them per head).
    is_causal : bool, default False
        Also restrict query ``i`` to keys ``j <= i`` (top-left), composed by AND with the masks.

    Returns
    -------
    out : list, shape (L, E)
    weights : list or None
        None if not ``need_weights``; shape (L, S) if ``average_attn_weights`` (the fsum over the
        heads divided by H), else (H, L, S).

    Raises
    ------
    ValueError
        If the shapes are inconsistent, ``num_heads`` is not a positive divisor of E, neither or
        both of ``in_proj_weight`` and the separate projection weights are given, or a mask has
        the wrong shape.
    TypeError
        If ``num_heads`` is not an int, an entry is not a real number (or is a bool), or a mask
        holds integers or mixes bool and float.

    Notes
    -----
    Two float masks are summed first (``attn_mask + key_padding_mask``) and then added to the
    scaled scores. A row in which every key of a head is removed is fully masked: that head's
    weights and output are 0 (so the final output row is ``out_proj_bias`` when all heads are
    fully masked), never NaN. Projections are summed exactly (:func:`math.fsum`, bias included).
    Source: Vaswani et al. 2017, section 3.2.2.

    Examples
    --------
    >>> out, w = multi_head_attention([[1.0]], [[1.0], [1.0]], [[2.0], [4.0]], num_heads=1,
    ...                               in_proj_weight=[[1.0], [1.0], [1.0]],
    ...                               out_proj_weight=[[1.0]])
    >>> out, w
    ([[3.0]], [[0.5, 0.5]])
    >>> multi_head_attention([[1.0]], [[1.0], [1.0]], [[2.0], [4.0]], num_heads=1,
    ...                      in_proj_weight=[[1.0], [1.0], [1.0]], out_proj_weight=[[1.0]],
    ...                      key_padding_mask=[False, True])[0]
    [[2.0]]
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, numbers.Integral):
        raise TypeError(f"num_heads must be an int; got {num_heads!r}")
    if num_heads <= 0:
        raise ValueError(f"num_heads must be positive; got {num_heads}")
    num_heads = int(num_heads)

    if not _is_seq(out_proj_weight):
        raise ValueError(
            "out_proj_weight must be a 2-D nested list (E, E); got "
            f"{type(out_proj_weight).__name__}"
        )
    embed_dim = len(out_proj_weight)
    w_out = _matrix(out_proj_weight, "out_proj_weight", rows=embed_dim, cols=embed_dim)
    if embed_dim % num_heads != 0:
        raise ValueError(
            f"embed_dim E={embed_dim} (from out_proj_weight) must be divisible by "
            f"num_heads={num_heads}"
        )
    head_dim = embed_dim // num_heads

    if _is_seq(query) and len(_shape(query, "query")) >= 3:
        raise ValueError(
            f"query must be unbatched (L, E); got shape {_shape(query, 'query')}; call once per "
            "batch element"
        )
    q_in = _matrix(query, "query", cols=embed_dim)
    k_in = _matrix(key, "key")
    v_in = _matrix(value, "value")
    n_queries, n_keys = len(q_in), len(k_in)
    if len(v_in) != n_keys:
        raise ValueError(
            f"key has {n_keys} rows but value has {len(v_in)}; expected key (S, kdim) and "
            "value (S, vdim)"
        )

    separate = (q_proj_weight, k_proj_weight, v_proj_weight)
    if in_proj_weight is not None:
        if any(w is not None for w in separate):
            raise ValueError(
                "give either in_proj_weight or q_proj_weight/k_proj_weight/v_proj_weight, "
                "not both"
            )
        w_in = _matrix(in_proj_weight, "in_proj_weight", rows=3 * embed_dim, cols=embed_dim)
        w_q = w_in[:embed_dim]
        w_k = w_in[embed_dim:2 * embed_dim]
        w_v = w_in[2 * embed_dim:]
        k_dim = v_dim = embed_dim
    else:
        if any(w is None for w in separate):
            raise ValueError(
                "in_proj_weight is None, so q_proj_weight, k_proj_weight and v_proj_weight "
                "are all required"
            )
        w_q = _matrix(q_proj_weight, "q_proj_weight", rows=embed_dim, cols=embed_dim)
        w_k = _matrix(k_proj_weight, "k_proj_weight", rows=embed_dim)
        w_v = _matrix(v_proj_weight, "v_proj_weight", rows=embed_dim)
        k_dim = len(w_k[0]) if embed_dim else (len(k_in[0]) if n_keys else 0)
        v_dim = len(w_v[0]) if embed_dim else (len(v_in[0]) if n_keys else 0)
    if n_keys and len(k_in[0]) != k_dim:
        raise ValueError(f"key must have kdim={k_dim} columns; got {len(k_in[0])}")
    if n_keys and len(v_in[0]) != v_dim:
        raise ValueError(f"value must have vdim={v_dim} columns; got {len(v_in[0])}")

    if in_proj_bias is None:
        b_in = [0.0] * (3 * embed_dim)
    else:
        b_in = _vector(in_proj_bias, "in_proj_bias", 3 * embed_dim)
    b_out = [0.0] * embed_dim if out_proj_bias is None else _vector(
        out_proj_bias, "out_proj_bias", embed_dim
    )

    # Masks -> per head: keep[h][i][j] (bool, True = take part) and add[h][i][j] (float).
    keep = [[[True] * n_keys for _ in range(n_queries)] for _ in range(num_heads)]
    add = [[[0.0] * n_keys for _ in range(n_queries)] for _ in range(num_heads)]
    any_float = False
    attn_add = None  # float attn_mask per head, summed with the float key_padding_mask below
    if attn_mask is not None:
        if not _is_seq(attn_mask):
            raise ValueError(f"attn_mask must be a nested list; got {type(attn_mask).__name__}")
        mask_shape = _shape(attn_mask, "attn_mask")
        if mask_shape == (num_heads, n_queries, n_keys) and len(mask_shape) == 3:
            per_head = [attn_mask[h] for h in range(num_heads)]
        elif mask_shape == (n_queries, n_keys) or (n_queries == 0 and mask_shape == (0,)):
            per_head = [attn_mask] * num_heads
        elif n_queries == 0 and mask_shape == (num_heads, 0):
            per_head = [[]] * num_heads
        else:
            raise ValueError(
                f"attn_mask must have shape (L, S) = ({n_queries}, {n_keys}) or "
                f"(num_heads, L, S) = ({num_heads}, {n_queries}, {n_keys}); got {mask_shape}"
            )
        if _mask_kind(_flatten(attn_mask), "attn_mask") == "bool":
            for h in range(num_heads):
                for i in range(n_queries):
                    for j in range(n_keys):
                        if per_head[h][i][j]:
                            keep[h][i][j] = False
        else:
            any_float = True
            attn_add = [[[float(v) for v in row] for row in per_head[h]] for h in range(num_heads)]
    kpm_add = None
    if key_padding_mask is not None:
        if not _is_seq(key_padding_mask):
            raise ValueError(
                f"key_padding_mask must be a list of shape (S,); got "
                f"{type(key_padding_mask).__name__}"
            )
        kpm_shape = _shape(key_padding_mask, "key_padding_mask")
        if kpm_shape != (n_keys,):
            raise ValueError(
                f"key_padding_mask must have shape (S,) = ({n_keys},); got {kpm_shape}"
            )
        if _mask_kind(key_padding_mask, "key_padding_mask") == "bool":
            for h in range(num_heads):
                for i in range(n_queries):
                    for j in range(n_keys):
                        if key_padding_mask[j]:
                            keep[h][i][j] = False
        else:
            any_float = True
            kpm_add = [float(v) for v in key_padding_mask]
    if any_float:
        for h in range(num_heads):
            for i in range(n_queries):
                for j in range(n_keys):
                    if attn_add is not None and kpm_add is not None:
                        add[h][i][j] = attn_add[h][i][j] + kpm_add[j]
                    elif attn_add is not None:
                        add[h][i][j] = attn_add[h][i][j]
                    else:
                        add[h][i][j] = kpm_add[j]

    q_proj = _linear(q_in, w_q, b_in[:embed_dim])
    k_proj = _linear(k_in, w_k, b_in[embed_dim:2 * embed_dim])
    v_proj = _linear(v_in, w_v, b_in[2 * embed_dim:])

    scale = 1.0 / math.sqrt(head_dim) if head_dim else 1.0
    head_outputs, head_weights = [], []
    for h in range(num_heads):
        cols = slice(h * head_dim, (h + 1) * head_dim)
        out_h, _, weights_h = _attend(
            [row[cols] for row in q_proj],
            [row[cols] for row in k_proj],
            [row[cols] for row in v_proj],
            head_dim,
            scale,
            keep=keep[h],
            add=add[h] if any_float else None,
            causal_offset=0 if is_causal else None,
        )
        head_outputs.append(out_h)
        head_weights.append(weights_h)

    concat = [
        [v for h in range(num_heads) for v in head_outputs[h][i]] for i in range(n_queries)
    ]
    out = _linear(concat, w_out, b_out)

    if not need_weights:
        return out, None
    if not average_attn_weights:
        return out, head_weights
    averaged = [
        [
            _sum(head_weights[h][i][j] for h in range(num_heads)) / num_heads
            for j in range(n_keys)
        ]
        for i in range(n_queries)
    ]
    return out, averaged
