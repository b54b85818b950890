"""Masked row softmax and log-softmax of the oracle (:func:`softmax`, :func:`log_softmax`)."""

import itertools
import math  # noqa: F401  (the doctests use math.inf)

from ._common import (
    _as_float, _flatten, _is_seq, _mask_kind, _normalize_axis, _shape,
    _softmax_row, _unflatten,
)


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
        The scores, as in :func:`softmax` (a plain list of floats is 1-D; not modified).
    axis : int, default -1
        The axis of each row (negative values count from the end).
    mask : nested list of bool or of float, same shape as ``x``, optional
        As in :func:`softmax`: bool True = take part (a False position is never read and gets
        ``-inf``); float values are added to ``x`` before the log-softmax.

    Returns
    -------
    list
        A new nested list of floats with the shape of ``x``; equal to ``log(softmax(x))`` up to
        rounding, but computed without the ``log`` of a rounded weight.

    Raises
    ------
    ValueError
        As :func:`softmax`: a scalar or ragged ``x``, an out-of-range ``axis``, or a ``mask`` of
        another shape.
    TypeError
        As :func:`softmax`: a non-int ``axis``, non-real or bool entries in ``x``, or a ``mask``
        holding integers, a mix of bool and float, or other types.

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

