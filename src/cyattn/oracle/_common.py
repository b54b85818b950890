"""Shared helpers of the oracle: nested lists, exact sums, the row softmax, validation.

Nested-list shape, flatten / unflatten, real-number and mask-kind checks, the exactly rounded
:func:`_sum` (IEEE rules for non-finite values), the row softmax :func:`_softmax_row` used by
both the softmax and the attention functions, and the 2-D / 1-D / axis / batch validation
helpers. Standard library only.
"""

import math
import numbers

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


def _nested_shape(value, name, expected):
    """Shape of the nested list ``value``; ValueError saying it must be ``expected`` if it is not a
    list or tuple (a scalar)."""
    if not _is_seq(value):
        raise ValueError(f"{name} must be {expected}; got {type(value).__name__}")
    return _shape(value, name)


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
    shape = _nested_shape(x, name, "a 2-D nested list")
    if len(shape) != 2 and shape != (0,):
        raise ValueError(f"{name} must be 2-D; got a nested list of shape {shape}")
    if rows is not None and len(x) != rows:
        raise ValueError(f"{name} must have {rows} rows; got shape {shape}")
    if cols is not None and len(x) > 0 and shape[1] != cols:
        raise ValueError(f"{name} must have {cols} columns; got shape {shape}")
    return [[_as_float(v, name) for v in row] for row in x]


def _vector(x, name, length):
    shape = _nested_shape(x, name, "a 1-D list")
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

