"""``out + alpha * (a @ b)`` of the oracle (:func:`matmul_accumulate`), summed exactly."""

from ._common import _as_float, _check_batch, _is_seq, _matrix, _shape, _split_batch, _sum


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

