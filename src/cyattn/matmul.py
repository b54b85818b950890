"""Blocked matrix multiply-accumulate ``out += alpha * (a @ b)``."""
import math

import numpy as np

from . import _backend
from . import _validate as V

__all__ = ["matmul_accumulate"]

_FNAME = "cyattn.matmul_accumulate"


_ndarray = np.ndarray

PRECISIONS = ("exact", "fast")


def _resolve_precision(precision, fname=_FNAME, tiles=True):
    """``precision`` checked: "exact" or "fast"; None picks "fast" where the loaded kernels
    multiply bfloat16 on AMX tiles (the opt-in amx variant; ``tiles``: this operation has a
    tile kernel), or on vdpbf16ps where the CPU runs it faster than widening (AMD Zen 4 and
    later, not Intel: _backend.bf16_path), else "exact" (the emulation of the fast path is
    slower than the exact path). ``fname`` names the public function in the ValueError
    (matmul_accumulate, scaled_dot_product_attention)."""
    if precision is None:
        return "fast" if _backend.bf16_fast_by_default(_backend.kernels, tiles) else "exact"
    if not (isinstance(precision, str) and precision in PRECISIONS):
        raise ValueError(f"{fname}: precision must be None, 'exact' or 'fast', got "
                         f"{precision!r}")
    return precision


def default_bf16_path():
    """One line for ``python -m cyattn info``: which path a bfloat16 ``matmul_accumulate``
    takes by default with the loaded kernels, why (_backend.bf16_path's reason), and what
    ``precision="fast"`` runs."""
    path, why = _backend.default_bf16_path()
    if path == "amx":
        return f"fast on AMX tiles (tdpbf16ps) by default [{why}]; precision='exact': float32 FMAs"
    if path == "fast":
        return (f"fast ({_dot_name()}) by default [{why}]; precision='exact': float32 FMAs")
    return f"exact (float32 FMAs) by default [{why}]; precision='fast': {_dot_name()}"


def _dot_name(kernels=None):
    """What precision="fast" multiplies bfloat16 on with ``kernels`` (default: the loaded
    ones), apart from AMX tiles: an instruction, or the portable model of this build's rule."""
    k = _backend.kernels if kernels is None else kernels
    if getattr(k, "BF16_ARM", False):
        return "BFDOT, FEAT_BF16"
    if getattr(k, "BF16_DOT", False):
        return "vdpbf16ps, AVX512-BF16"
    if getattr(k, "BF16_RULE", "x86") == "arm":
        return "portable model of BFDOT"
    return "portable emulation of vdpbf16ps"


_EMULATIONS = (False, True, "amx", "arm")


def _bf16_arm(emulate):
    """Whether a bf16 dot-product call follows BFDOT's rule (isa/_cyattn_bf16_arm.h):
    ``emulate="arm"`` (its model, on any host), or, with ``emulate`` False or True, the loaded
    build's own rule (BFDOT's in aarch64 builds, vdpbf16ps's in x86-64 ones)."""
    if emulate == "arm":
        return True
    return emulate != "amx" and getattr(_backend.kernels, "BF16_RULE", "x86") == "arm"


def _fast_call(a, b, out, alpha, n_threads):
    """The common call: C-contiguous, aligned, non-empty 2-D float32/float64 arrays of one
    dtype, a writable ``out`` that overlaps neither input, a finite ``alpha``, a positive or
    default ``n_threads``. The kernel module checks the buffers in one pass; False means the
    general path must run (and produce any error message)."""
    if type(alpha) is int and -(1 << 62) < alpha < (1 << 62):
        alpha = float(alpha)
    if not (type(a) is _ndarray and type(b) is _ndarray and type(out) is _ndarray
            and type(alpha) is float and alpha - alpha == 0.0):
        return False
    n_threads = V.fast_threads(n_threads)
    return n_threads > 0 and _backend.kernels.matmul_fast(a, b, out, alpha, n_threads)


def matmul_accumulate(a, b, out, *, alpha=1.0, precision=None, n_threads=None):
    r"""Accumulate a matrix product in place: ``out += alpha * (a @ b)``.

    Parameters
    ----------
    a : array_like of float, shape (..., M, K)
    b : array_like of float, shape (..., K, N)
        Batch dimensions of ``a`` and ``b`` broadcast like :func:`numpy.matmul`; the
        broadcast batch shape must fit ``out``'s without enlarging it.
    out : ndarray, shape (..., M, N)
        Writable, of dtype ``np.result_type(a, b)``; any strides. It may be (or overlap)
        ``a`` or ``b``: the product is then formed from the old values (copied first).
    alpha : float, optional
        Scale of the product (default 1.0).
    precision : {None, "exact", "fast"}, optional
        How bfloat16 ``a`` and ``b`` (both bfloat16) are multiplied; other dtypes ignore it.
        ``"exact"``: as the float32 call on the same values, rounded once into ``out``.
        ``"fast"``: on the CPU's bf16 dot products (AVX512-BF16 ``vdpbf16ps``; on a CPU or
        build without them, a portable emulation with the same bits, slower than
        ``"exact"``), or on AMX tiles (``tdpbf16ps``) in the opt-in ``amx`` variant
        (``CYATTN_BACKEND=amx``): products exact, float32 sums, subnormals flushed (see
        Notes). None (default): a rule on CPUID's vendor, family and features, never a
        timing (``python -m cyattn info`` prints the path and why): ``"fast"`` on AMD Zen 4
        and later (``vdpbf16ps`` at about 2x the float32 FMA rate) and in the ``amx``
        variant (tiles), ``"exact"`` on Intel (``vdpbf16ps`` at 0.5x the float32 FMA rate:
        slower than widening) and wherever the instruction is missing. Away from subnormals
        the ``vdpbf16ps`` path and ``"exact"`` give the same float32 sums on a CPU with FMA
        (each step is one rounding of ``sum + a_k b_k``, k in order), so that default costs
        no accuracy.
    n_threads : int, optional
        OpenMP threads: None for the default (see :func:`cyattn.show_config`), a positive
        count, or a negative value counting back from the maximum (-1 = all).

    Returns
    -------
    ndarray
        ``out`` itself.

    Raises
    ------
    TypeError
        If ``a``, ``b`` or ``out`` is not float16/bfloat16/float32/float64, ``alpha`` is not a real
        number or ``n_threads`` is not an int.
    ValueError
        If an operand has fewer than 2 dimensions, the inner dimensions differ, the batch
        shapes do not broadcast into ``out``'s, ``out`` has the wrong shape or dtype or is
        read-only, ``precision`` is not None, "exact" or "fast", or ``n_threads == 0``. A
        call that raises leaves ``out`` untouched.

    Notes
    -----
    BLIS-style blocking (Van Zee and van de Geijn, "BLIS: A Framework for Rapidly
    Instantiating BLAS Functionality", ACM TOMS 2015): packed panels of ``a`` and ``b``, a
    register-blocked micro-kernel, cache blocks over M, N and K. Threads split the output
    tiles only, never K, so the result is bit-identical for any thread count. float16 and
    bfloat16 (``ml_dtypes.bfloat16``) operands are read as they are stored and widened to
    float32 (exactly) while their panels are packed; a float16/bfloat16 ``out`` is accumulated
    over all of K in a float32 tile per thread and rounded once, to nearest even. The result is
    the float32 call on the same values, rounded once, and no float32 copy of an operand is
    made (except the product buffer of an infinite ``alpha``). The GIL is released while the
    kernel runs.

    ``precision="fast"`` with bfloat16 ``a`` and ``b`` follows ``vdpbf16ps`` as measured on
    an AMD Zen 5 (the emulation reproduces it bit for bit): the bits are read as stored
    (no widened copy) and packed into pairs of consecutive k; per element of ``out`` and per
    block of 256 k, ``s = 0``, then for k in order ``s = FTZ(RNE(s + a_k b_k))`` with the
    product exact (no overflow or underflow of its own), bfloat16 subnormal inputs read as
    zero (DAZ) and results that are tiny after rounding flushed to zero (FTZ), whatever the
    MXCSR says; each block's ``s`` is added as ``fma(alpha, s, out)`` in float32, and a
    bfloat16 ``out`` is rounded once at the end. Error bound against the exact
    ``out + alpha * (a @ b)`` (the tests check it against a float64 oracle), u = 2^-24:
    ``(K + 2) u (|alpha| sum_k |a_k b_k| + |out|) + 2^-126 |alpha| (sum_k (|a_k| + |b_k|)
    + K)`` before a bfloat16 ``out``'s final rounding (2^-8 relative); the second term is
    what DAZ and FTZ may lose. NaN signs and payloads are not specified. Results are
    bit-identical for any thread count on a host.

    On AMX tiles (the ``amx`` variant; its portable model, the same bits, on every host for
    the tests) the order differs, as ``tdpbf16ps`` sums: per element and per chunk of 32 k
    (K padded with zeros), two float32 partial sums from zero, of the even and of the odd
    k's products, each in k order with one rounding per product (DAZ/FTZ as above), then
    ``C = C + (even + odd)``; all of K is accumulated in the tile and added once as
    ``fma(alpha, C, out)``. The same bound holds (each product passes through at most
    K + 2 roundings).

    Examples
    --------
    >>> import numpy as np, cyattn
    >>> out = np.ones((2, 2))
    >>> cyattn.matmul_accumulate(np.array([[1.0, 2.0], [3.0, 4.0]]), np.eye(2), out)
    array([[2., 3.],
           [4., 5.]])
    """
    # The tiny call first (issue 46): default options, ndarrays and a finite float alpha go
    # straight to the kernel module, which takes them only where the product runs on one
    # thread anyway (n_threads 0) and checks the buffers in one pass; n = 16 took 0.83x
    # NumPy's time through the layers below (_matmul, _resolve_precision, _fast_call,
    # fast_threads: five Python calls before the kernel's). Anything it declines takes the
    # general path, with its errors.
    if (n_threads is None and precision is None and type(alpha) is float
            and type(a) is _ndarray and type(b) is _ndarray and type(out) is _ndarray
            and alpha - alpha == 0.0 and _backend.kernels.matmul_fast(a, b, out, alpha, 0)):
        return out
    return _matmul(a, b, out, alpha, precision, n_threads)


def _matmul(a, b, out, alpha, precision, n_threads, emulate=False):
    """matmul_accumulate; ``emulate`` runs the fast bf16 path's emulation even where the
    kernels have the instruction (for the tests that compare the two bit for bit):
    True for the model of this build's rule (vdpbf16ps's on x86-64, BFDOT's on aarch64),
    ``"amx"`` for the AMX tiles' model (the tile path on every host: the amx variant's bits),
    ``"arm"`` for BFDOT's model (the neonbf16 variant's bits, on every host). Without it, the
    fast path runs on tiles in the amx variant, on BFDOT in the neonbf16 variant and on
    vdpbf16ps (or the model of the build's rule) elsewhere."""
    if emulate not in _EMULATIONS:
        raise ValueError(f"{_FNAME}: emulate must be False, True, 'amx' or 'arm', got "
                         f"{emulate!r}")
    precision = _resolve_precision(precision)
    if _fast_call(a, b, out, alpha, n_threads):
        return out
    a = V.as_float_array(a, "a", _FNAME)
    b = V.as_float_array(b, "b", _FNAME)
    if not isinstance(out, np.ndarray):
        raise ValueError(f"{_FNAME}: out must be a numpy.ndarray, got {type(out).__name__}")
    out_arr = V.as_float_array(out, "out", _FNAME)
    alpha = V.check_real(alpha, "alpha", _FNAME)
    V.require_matrices(_FNAME, "..., rows, cols", a=a, b=b, out=out_arr)
    M, K = a.shape[-2:]
    K2, N = b.shape[-2:]
    if K != K2:
        raise ValueError(f"{_FNAME}: a has shape {a.shape} and b has shape {b.shape}; "
                         f"expected a (..., M, K) and b (..., K, N) with equal K")
    if a.ndim == b.ndim == out.ndim == 2:
        batch = ()
    else:
        batch = V.broadcast_shapes((a.shape[:-2], b.shape[:-2], out.shape[:-2]),
                                   "the batch dimensions of a, b and out", _FNAME)
    if batch != out.shape[:-2] or out.shape[-2:] != (M, N):
        raise ValueError(f"{_FNAME}: out has shape {out.shape}; a {a.shape} @ b {b.shape} "
                         f"needs out of shape (..., {M}, {N}) whose batch dims a's and b's "
                         f"broadcast to")
    compute, result = V.float_dtypes(a, b)
    V.check_out(out, out.shape, result, _FNAME)
    n_threads = V.resolve_threads(n_threads, _FNAME)
    if out.size == 0:
        return out
    if K == 0:
        # a @ b is all zeros; alpha * 0 is 0 unless alpha is inf or NaN (then NaN, as NumPy)
        if not math.isfinite(alpha):
            out += np.asarray(alpha * 0.0, dtype=out.dtype)
        return out
    n_threads = V.threads_for_work(n_threads, out.size * K, 1 << 18)
    # float16/bfloat16 operands are read as they are: the kernel widens them while packing
    # and rounds a 16-bit out once, so no float32 copy of an operand is made
    a_fmt, b_fmt, c_fmt = (V.half_format(x, compute) for x in (a, b, out))
    a = V.kernel_ready(a, a.dtype if a_fmt else compute)
    b = V.kernel_ready(b, b.dtype if b_fmt else compute)
    # bf16 a and b on the bf16 dot product (the fast path reads them as they are, like the
    # exact path; out is float32 or bf16)
    fast = precision == "fast" and V.is_bfloat16(a.dtype) and V.is_bfloat16(b.dtype)

    def run(a, b, target, c_fmt, alpha):
        ops = [(x, x.view(np.uint16) if fmt else x, x.itemsize)
               for x, fmt in ((a, a_fmt), (b, b_fmt), (target, c_fmt))]
        args = []
        for x, view, item in ops:
            args += [view, V.batch_offsets(x, batch), x.strides[-2] // item,
                     x.strides[-1] // item]
        if fast and (emulate == "amx"
                     or (emulate is False and getattr(_backend.kernels, "AMX", False))):
            _backend.kernels.matmul_accumulate_amx(*args, M, N, K, alpha, n_threads,
                                                   c_fmt=c_fmt, emulate=emulate == "amx")
        elif fast:
            _backend.kernels.matmul_accumulate_bf16(*args, M, N, K, alpha, n_threads,
                                                    c_fmt=c_fmt, emulate=emulate is not False,
                                                    arm=_bf16_arm(emulate))
        else:
            _backend.kernels.matmul_accumulate(*args, M, N, K, alpha, n_threads,
                                               a_fmt=a_fmt, b_fmt=b_fmt, c_fmt=c_fmt)

    if not math.isfinite(alpha):
        # The kernel applies alpha to each KC-deep block's partial sum; an infinite alpha
        # would then turn partial sums of opposite signs into inf - inf = NaN where
        # alpha * (a @ b) is +-inf. Form a @ b first (a temporary of out's size, only here).
        product = np.zeros(out.shape, dtype=compute)
        run(a, b, product, 0, 1.0)
        with np.errstate(invalid="ignore", over="ignore"):
            V.copy_result(out, out + alpha * product)
        return out
    if c_fmt:
        # a 16-bit out is accumulated tile by tile in float32 and rounded once by the kernel;
        # an input it overlaps is copied (in its own dtype) so the product sees the old values
        if np.may_share_memory(out, a):
            a = np.array(a, order="C")
        if np.may_share_memory(out, b):
            b = np.array(b, order="C")
        target = V.kernel_ready(out, out.dtype)     # out itself unless misaligned
    else:
        direct = (out.dtype == compute and out.flags.aligned
                  and not any(s % out.itemsize for s in out.strides)
                  and not np.may_share_memory(out, a) and not np.may_share_memory(out, b))
        target = out if direct else np.array(out, dtype=compute, order="C")
    run(a, b, target, c_fmt, alpha)
    if target is not out:
        V.copy_result(out, target)
    return out


class _PackedB:
    """A float32 matrix B (K, N) packed once into the kernel's panels, for repeated products
    ``out += a @ B`` (:func:`_matmul_packed`): the sentence encoder's weights.

    A few-row product (one short text) against weights that come from memory spent more time
    packing B, or reading it unpacked with one stream per K row, than multiplying; packed
    once, each product reads B as one contiguous stream. The panels belong to the kernel
    module in use when packing (their width is the variant's), which the products then use.
    The bits are those of :func:`matmul_accumulate` with the unpacked B (same panels, same
    order of the sums). Private: the layout is the kernels', not an interchange format; a
    pickle holds B itself and is packed again, for the kernels of the process that loads it.
    """

    __slots__ = ("kernels", "shape", "data")

    def __init__(self, b):
        if not (isinstance(b, np.ndarray) and b.dtype == np.float32 and b.ndim == 2):
            raise TypeError(f"cyattn: a packed B must be a 2-D float32 ndarray, got "
                            f"{type(b).__name__} {getattr(b, 'dtype', '')} "
                            f"{getattr(b, 'shape', '')}")
        b = V.kernel_ready(b, np.float32)
        self.kernels = _backend.kernels
        self.shape = b.shape
        K, N = b.shape
        self.data = np.empty(max(self.kernels.packed_b_size(K, N), 1), np.float32)
        self.kernels.pack_b_whole_into(b, b.strides[0] // 4, b.strides[1] // 4, K, N,
                                       self.data)
        self.data.flags.writeable = False

    def unpacked(self):
        """B itself, (K, N) float32, rebuilt from the panels: the block of rows at depth pc
        holds its kc rows as panels of nr columns, ``data[pc * cols + j * kc + p * nr + i]``
        = ``B[pc + p, j + i]`` (j a multiple of nr, cols = N rounded up to nr)."""
        K, N = self.shape
        kc_max, nr = self.kernels.packed_b_layout()
        cols = -(-N // nr) * nr
        b = np.empty((K, N), np.float32)
        for pc in range(0, K, kc_max):
            kc = min(kc_max, K - pc)
            panels = self.data[pc * cols:(pc + kc) * cols].reshape(cols // nr, kc, nr)
            b[pc:pc + kc] = panels.transpose(1, 0, 2).reshape(kc, cols)[:, :N]
        return b

    def __reduce__(self):
        return (_PackedB, (self.unpacked(),))


def _matmul_packed(a, packed, out, n_threads=None):
    """``out += a @ B`` for ``packed = _PackedB(B)``: ``a`` (M, K) and ``out`` (M, N) aligned
    float32 ndarrays with strides that are multiples of 4 bytes, ``out`` disjoint from ``a``;
    n_threads as in :func:`matmul_accumulate`. Returns ``out``."""
    K, N = packed.shape
    if not (a.dtype == out.dtype == np.float32 and a.ndim == out.ndim == 2
            and a.shape[1] == K and out.shape == (a.shape[0], N)
            and a.flags.aligned and out.flags.aligned and out.flags.writeable
            and not any(s % 4 for s in a.strides + out.strides)):
        raise ValueError(f"cyattn: a packed ({K}, {N}) product needs aligned float32 a "
                         f"(M, {K}) and writable out (M, {N}), got a {a.dtype} {a.shape} "
                         f"and out {out.dtype} {out.shape}")
    M = a.shape[0]
    n_threads = V.fast_threads(n_threads) or V.resolve_threads(n_threads, _FNAME)
    n_threads = V.threads_for_work(n_threads, M * N * K, 1 << 18)
    packed.kernels.matmul_packed_b(a, a.strides[0] // 4, a.strides[1] // 4, packed.data, out,
                                   out.strides[0] // 4, out.strides[1] // 4, M, N, K, 1.0,
                                   n_threads)
    return out
