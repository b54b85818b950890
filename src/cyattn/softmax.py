"""Masked, numerically stable softmax and log-softmax over one axis."""
import numpy as np

from . import _backend
from . import _validate as V

__all__ = ["softmax", "log_softmax"]

_ndarray = np.ndarray
_empty = np.empty


def _fast_call(x, axis, mask, out, log_out, n_threads=None):
    """The common call: a C-contiguous, aligned float32/float64 ndarray over its last axis,
    without a mask, into a new array or a matching C-contiguous ``out`` that shares no memory
    with ``x``. The kernel module checks the buffers in one pass; None means the call must take
    the general path (which also produces every error message)."""
    if not (mask is None and type(x) is _ndarray and type(axis) is int and axis == -1
            and (out is None or type(out) is _ndarray)):
        return None
    return _backend.kernels.softmax_fast(x, out, log_out, V.fast_threads(n_threads), _empty)


def _row_masks(kind, marr, ax, last, rows, n):
    """(bmask, amask, b_rs, b_cs, a_rs, a_cs) for the row kernels: the broadcast mask with the
    softmax axis last, as (rows, n) with element strides (None and zeros for no mask)."""
    if not kind:
        return None, None, 0, 0, 0, 0
    m2 = (marr if last else np.moveaxis(marr, ax, -1)).reshape(rows, n)
    rs, cs = m2.strides[0] // m2.itemsize, m2.strides[1] // m2.itemsize
    if kind == 1:
        return m2, None, rs, cs, 0, 0
    return None, m2, 0, 0, rs, cs


def _softmax(fname, x, axis, mask, out, log_out, n_threads=None):
    x = V.as_float_array(x, "x", fname)
    if x.ndim == 0:
        raise ValueError(f"{fname}: x must have at least 1 dimension, got a 0-d array")
    compute, result = V.float_dtypes(x)
    ax = V.normalize_axis(axis, x.ndim, fname)
    x_fmt = V.half_format(x, compute)
    if x_fmt:
        return _softmax_half(fname, x, x_fmt, ax, mask, out, log_out, n_threads)
    kind, marr = V.prepare_mask(mask, "mask", fname, compute)
    if kind:
        marr = V.broadcast_mask(marr, x.shape, "mask", fname)
    if out is not None:
        V.check_out(out, x.shape, result, fname)
    n = x.shape[ax]
    rows = x.size // n if n else 0
    last = ax == x.ndim - 1
    moved = x if last else np.moveaxis(x, ax, -1)
    if out is not None and last and V.writes_in_place(out, compute, (x, mask)):
        res = out
    else:
        res = np.empty(moved.shape, dtype=compute)
    if rows and n:
        # the kernel reads x directly: contiguous and aligned (a misaligned buffer is copied)
        xc = V.kernel_ready(np.ascontiguousarray(moved, dtype=compute), compute)
        bm, am, b_rs, b_cs, a_rs, a_cs = _row_masks(kind, marr, ax, last, rows, n)
        _backend.kernels.softmax_rows(xc.reshape(rows, n), res.reshape(rows, n), bm, am,
                             b_rs, b_cs, a_rs, a_cs, log_out,
                             V.threads_for_work(V.resolve_threads(n_threads, fname), rows * n,
                                                1 << 15))
    if res is out:                      # the kernel wrote the caller's out directly
        return out
    if not last:
        res = np.moveaxis(res, -1, ax)
    if out is None:
        return V.to_result(res, result)
    V.copy_result(out, res)
    return out


def _softmax_half(fname, x, x_fmt, ax, mask, out, log_out, n_threads):
    """float16 / bfloat16 x: the kernel widens each row as it reads it, computes in float32 in
    a per-thread row and rounds the result once as it writes it (a 16-bit mask is read the same
    way): no float32 copy of x, the mask or the result."""
    a_fmt = 0
    marr = None
    if mask is not None:
        m = mask if isinstance(mask, np.ndarray) else np.asarray(mask)
        a_fmt = V.half_format(m, np.dtype(np.float32))
        if a_fmt:
            marr = V.kernel_ready(m, m.dtype)
            kind = 2
    if not a_fmt:
        kind, marr = V.prepare_mask(mask, "mask", fname, np.dtype(np.float32))
    if kind:
        marr = V.broadcast_mask(marr, x.shape, "mask", fname)
    if out is not None:
        V.check_out(out, x.shape, x.dtype, fname)
    n = x.shape[ax]
    rows = x.size // n if n else 0
    last = ax == x.ndim - 1
    moved = x if last else np.moveaxis(x, ax, -1)
    if out is not None and last and V.writes_in_place(out, x.dtype, (x, mask)):
        res = out
    else:
        res = np.empty(moved.shape, dtype=x.dtype)
    if rows and n:
        xc = V.kernel_ready(np.ascontiguousarray(moved), x.dtype)
        bm, am, b_rs, b_cs, a_rs, a_cs = _row_masks(kind, marr, ax, last, rows, n)
        if a_fmt:
            am = am.view(np.uint16)
        _backend.kernels.softmax_rows_half(
            xc.reshape(rows, n).view(np.uint16), res.reshape(rows, n).view(np.uint16), x_fmt,
            x_fmt, bm, am, a_fmt, b_rs, b_cs, a_rs, a_cs, log_out,
            V.threads_for_work(V.resolve_threads(n_threads, fname), rows * n, 1 << 15))
    if res is out:
        return out
    if not last:
        res = np.moveaxis(res, -1, ax)
    if out is None:
        return res
    V.copy_result(out, res)
    return out


def softmax(x, axis=-1, *, mask=None, out=None):
    r"""Numerically stable softmax ``exp(x - max) / sum(exp(x - max))`` along ``axis``.

    Parameters
    ----------
    x : array_like of float16, bfloat16, float32 or float64, shape (..., n, ...)
        Logits. float32 and float64 are computed natively; float16 and bfloat16
        (``ml_dtypes``) are computed in float32 and returned in their dtype.
    axis : int, optional
        Axis to normalise over (default -1, negative values count from the end).
    mask : array_like of bool or float, optional
        Broadcastable to ``x.shape`` (it may not enlarge it). **bool**: True = the entry takes
        part; a False entry gets exactly zero weight and its ``x`` value is never read (a NaN
        there cannot leak). **float**: added to ``x`` before the softmax (cast to the compute
        dtype; finite values beyond its range saturate at its largest finite value); ``-inf``
        removes an entry, a finite value such as ``-1e9`` only shifts it. Integer masks raise
        TypeError.
    out : ndarray, optional
        Writable array of ``x``'s shape and result dtype to hold the result.

    Returns
    -------
    ndarray
        Same shape as ``x``, dtype float32/float64 as ``x`` (float16/bfloat16 for those). Each
        non-empty row sums to 1 (up to rounding).

    Raises
    ------
    TypeError
        If ``x`` is not a float array (bool, int, complex, object), ``mask`` has an integer or
        other non-bool, non-float dtype, or ``axis`` is not an integer.
    ValueError
        If ``x`` is 0-d, ``axis`` is out of range, ``mask`` does not broadcast to ``x.shape``
        without enlarging it, or ``out`` is not a writable ndarray of the result shape and
        dtype. A call that raises leaves ``out`` untouched.

    Notes
    -----
    The maximum of the permitted entries is subtracted before ``exp``; IEEE infinities, NaN
    and subnormal results are honoured (no fast-math). A row in which no entry is permitted
    or every permitted entry is ``-inf`` (with or without a mask) is *fully masked*: its
    result is all zeros, never NaN, and no warning is raised. A NaN or ``+inf`` in a
    permitted entry makes the whole row NaN. Rows are processed in parallel with OpenMP
    (default thread count, see ``cyattn.show_config``); results do not depend on the thread
    count. The GIL is released while the kernel runs.

    Source: the standard max-subtracted softmax (e.g. Goodfellow, Bengio and Courville,
    *Deep Learning*, 2016, section 4.1).

    Examples
    --------
    >>> import numpy as np, cyattn
    >>> cyattn.softmax(np.array([2.0, 1.0, 0.0])).round(3)
    array([0.665, 0.245, 0.09 ])
    >>> cyattn.softmax(np.array([[1.0, 2.0], [-np.inf, -np.inf]]))
    array([[0.26894142, 0.73105858],
           [0.        , 0.        ]])
    >>> cyattn.softmax(np.array([1.0, 5.0, 2.0]), mask=np.array([True, False, True])).round(4)
    array([0.2689, 0.    , 0.7311])
    """
    fast = _fast_call(x, axis, mask, out, False)
    if fast is not None:
        return fast
    return _softmax("cyattn.softmax", x, axis, mask, out, False)


def log_softmax(x, axis=-1, *, mask=None, out=None):
    r"""Numerically stable log-softmax ``x - max - log(sum(exp(x - max)))`` along ``axis``.

    Parameters
    ----------
    x : array_like of float16, bfloat16, float32 or float64
        Logits (float16 and bfloat16 are computed in float32, returned in their dtype).
    axis : int, optional
        Axis to normalise over (default -1).
    mask : array_like of bool or float, optional
        As in :func:`softmax`: bool True = take part (False entries give ``-inf`` and are never
        read); float values are added to ``x``.
    out : ndarray, optional
        Writable array of ``x``'s shape and result dtype.

    Returns
    -------
    ndarray
        Same shape and dtype as :func:`softmax` would return; ``exp`` of it is the softmax.

    Raises
    ------
    TypeError
        For non-float ``x``, integer or other non-bool, non-float masks, non-integer ``axis``.
    ValueError
        For 0-d ``x``, an out-of-range ``axis``, a mask that does not broadcast to ``x.shape``,
        or a bad ``out`` (left untouched).

    Notes
    -----
    A fully masked row (no permitted entry, or all ``-inf``) gives ``-inf`` everywhere (the
    log of the zero weights), never NaN. A NaN or ``+inf`` permitted entry makes the row NaN.
    Source: as :func:`softmax`.

    Examples
    --------
    >>> import numpy as np, cyattn
    >>> cyattn.log_softmax(np.array([0.0, 0.0])).round(4)
    array([-0.6931, -0.6931])
    """
    fast = _fast_call(x, axis, mask, out, True)
    if fast is not None:
        return fast
    return _softmax("cyattn.log_softmax", x, axis, mask, out, True)
