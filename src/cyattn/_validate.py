"""Input checks shared by the public functions: one place for each rule.

The dtype policy (DESIGN 3.7): float32 and float64 are computed natively and preserved;
float16 is computed in float32 and returned as float16; mixed float inputs promote with
``np.result_type``; bool, integer, complex, object and other dtypes raise TypeError. Masks do
not take part in promotion: a float mask is cast to the compute dtype, a bool mask selects.
Every message names the function, the argument, what it got and what was expected.
"""
import math
import numbers
import operator

import numpy as np

from . import _backend
from ._backend import in_forked_child, max_threads

_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def is_bfloat16(dtype):
    """True for ``ml_dtypes.bfloat16`` (recognised by name: ml_dtypes stays optional)."""
    return dtype.name == "bfloat16" and dtype.itemsize == 2


def _is_float(dtype):
    return dtype in _FLOATS or is_bfloat16(dtype)


def as_float_array(x, name, fname):
    """``x`` as an ndarray of a supported float dtype (no copy when it already is one)."""
    if isinstance(x, np.ndarray):
        arr = x
    else:
        try:
            arr = np.asarray(x)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{fname}: {name} could not be converted to an array ({exc}); "
                            f"expected an array of float16, float32 or float64") from None
    if not _is_float(arr.dtype):
        if arr.dtype.kind == "f" and arr.dtype.newbyteorder("=") in _FLOATS:
            return arr.astype(arr.dtype.newbyteorder("="))      # byte-swapped: native copy
        hint = " (cast integer data explicitly)" if arr.dtype.kind in "biu" else ""
        raise TypeError(f"{fname}: {name} has dtype {arr.dtype}; expected float16, bfloat16, "
                        f"float32 or float64{hint}")
    return arr


def float_dtypes(*arrays):
    """(compute dtype, result dtype) for float arrays: float16 and bfloat16 compute in float32.

    Promotion is NumPy's, with bfloat16 (ml_dtypes) joining as a half format: bfloat16 with
    bfloat16 stays bfloat16; with float16 or float32 it gives float32, with float64 float64."""
    dtypes = [a.dtype for a in arrays]
    if any(is_bfloat16(d) for d in dtypes):
        if all(is_bfloat16(d) for d in dtypes):
            return np.dtype(np.float32), dtypes[0]
        result = np.result_type(*(np.float32 if is_bfloat16(d) or d == np.float16 else d
                                  for d in dtypes))
        return result, result
    result = np.result_type(*arrays)
    compute = np.dtype(np.float32) if result == np.float16 else result
    return compute, result


# The kernels' codes for 16-bit storage formats (_cyattn_half.h: CYATTN_HALF_*)
HALF_F16, HALF_BF16 = 1, 2


def half_code(dtype):
    """The kernels' code of a 16-bit float dtype: HALF_F16 for float16, HALF_BF16 for
    bfloat16, else 0."""
    if dtype == np.float16:
        return HALF_F16
    return HALF_BF16 if is_bfloat16(dtype) else 0


def half_format(arr, compute):
    """The kernels' code for reading ``arr`` as 16-bit elements (HALF_F16 for float16,
    HALF_BF16 for bfloat16) when the compute dtype is float32, else 0 (it is converted)."""
    return half_code(arr.dtype) if compute == np.float32 else 0


def kernel_ready(arr, dtype):
    """``arr`` in ``dtype`` with aligned data and strides that are multiples of the itemsize.

    Arrays that already qualify are returned as they are (any strides, also negative or zero);
    others (misaligned buffers, fields of packed records, other dtypes) are copied.
    """
    if arr.dtype != dtype:
        arr = arr.astype(dtype)
    item = arr.itemsize
    if not arr.flags.aligned or any(s % item for s in arr.strides):
        # a copy: np.ascontiguousarray returns a C-contiguous but misaligned array unchanged,
        # and the kernels' float loads from it would be undefined behaviour (UBSan caught it)
        arr = np.array(arr, order="C", copy=True)
    return arr


def unit_stride_rows(arr, name, fname):
    """``arr``, or a C-contiguous copy if the elements of its rows are not adjacent (the
    last axis has more than one element and a stride other than the itemsize). Broadcast
    views are copied only when that costs at most twice their distinct elements or 16 MiB,
    so a huge zero-stride view is never materialised. A copy that does not fit in memory
    raises MemoryError naming ``fname`` and ``name``."""
    if arr.shape[-1] <= 1 or arr.strides[-1] == arr.itemsize:
        return arr
    distinct = math.prod(n for n, st in zip(arr.shape, arr.strides) if st != 0)
    if arr.size > 2 * distinct and arr.nbytes > 1 << 24:
        return arr
    try:
        return np.ascontiguousarray(arr)
    except MemoryError:
        raise MemoryError(f"{fname}: could not copy {name} of shape {arr.shape} into "
                          f"contiguous rows") from None


def column_stride(arr):
    """The element stride of ``arr``'s last axis; 1 when that axis has at most one element
    (the stride is then never used, and the kernels treat 1 as adjacent elements)."""
    return 1 if arr.shape[-1] <= 1 else arr.strides[-1] // arr.itemsize


def prepare_mask(mask, name, fname, compute_dtype, bool_meaning="True = take part"):
    """(kind, array): kind 0 none, 1 bool (as a uint8 view, True = keep), 2 additive float.

    ``bool_meaning`` is what True means for this argument, for the error message."""
    if mask is None:
        return 0, None
    arr = mask if isinstance(mask, np.ndarray) else np.asarray(mask)
    if arr.dtype == np.bool_:
        arr = arr if arr.flags.aligned else np.ascontiguousarray(arr)
        return 1, arr.view(np.uint8)
    if arr.dtype.kind == "f" and not arr.dtype.isnative and arr.dtype.newbyteorder() in _FLOATS:
        arr = arr.astype(arr.dtype.newbyteorder())           # byte-swapped floats: convert
    if _is_float(arr.dtype):
        if arr.dtype.itemsize > compute_dtype.itemsize:
            # Finite values beyond the compute dtype's range saturate at its largest finite
            # value instead of overflowing to -inf: a finite additive mask never masks.
            info = np.finfo(compute_dtype)
            arr = np.where(np.isfinite(arr), np.clip(arr, info.min, info.max), arr)
        return 2, kernel_ready(arr, compute_dtype)
    raise TypeError(f"{fname}: {name} has dtype {arr.dtype}; expected bool ({bool_meaning}) or "
                    f"a float dtype (added to the scores). Integer masks are ambiguous: convert "
                    f"explicitly with mask.astype(bool)")


def broadcast_shapes(shapes, what, fname):
    """The broadcast of ``shapes`` (NumPy's rules), or None if they do not broadcast. Shapes
    that do broadcast, but to more elements than an array can index, raise ValueError saying
    so. Written out because ``np.broadcast_shapes`` stops at 32 dimensions (arrays may have 64),
    which would make the general path fail where the kernels' fast paths work."""
    shapes = [tuple(s) for s in shapes]
    ndim = max((len(s) for s in shapes), default=0)
    result = []
    for i in range(ndim):
        size = 1
        for s in shapes:
            j = i - (ndim - len(s))
            if j < 0 or s[j] == 1:
                continue
            if size != 1 and s[j] != size:
                return None
            size = s[j]
        result.append(size)
    if math.prod(result) > np.iinfo(np.intp).max:
        raise ValueError(f"{fname}: {what} {', '.join(str(s) for s in shapes)} broadcast to "
                         f"more elements than an array can hold")
    return tuple(result)


def broadcast_mask(mask, target_shape, name, fname):
    """A read-only view of ``mask`` broadcast to ``target_shape``; it may not enlarge it."""
    shape = broadcast_shapes((mask.shape, target_shape), f"the shapes of {name} and the scores",
                             fname)
    if shape != tuple(target_shape):
        raise ValueError(f"{fname}: {name} has shape {mask.shape}, which does not broadcast to "
                         f"{tuple(target_shape)} without enlarging it")
    return np.broadcast_to(mask, target_shape)


def normalize_axis(axis, ndim, fname):
    if isinstance(axis, (bool, np.bool_)):
        raise TypeError(f"{fname}: axis must be an integer, got bool")
    try:
        ax = operator.index(axis)
    except TypeError:
        raise TypeError(f"{fname}: axis must be an integer, got {type(axis).__name__}") from None
    if not -ndim <= ax < ndim:
        raise ValueError(f"{fname}: axis {axis} is out of bounds for an array of dimension {ndim}")
    return ax % ndim


def check_out(out, shape, dtype, fname):
    """Raise unless ``out`` is a writable ndarray of exactly ``shape`` and ``dtype``."""
    if not isinstance(out, np.ndarray):
        raise ValueError(f"{fname}: out must be a numpy.ndarray, got {type(out).__name__}")
    if out.shape != tuple(shape):
        raise ValueError(f"{fname}: out has shape {out.shape}; expected {tuple(shape)}")
    if out.dtype != dtype:
        raise ValueError(f"{fname}: out has dtype {out.dtype}; expected {np.dtype(dtype)}")
    if not out.flags.writeable:
        raise ValueError(f"{fname}: out is read-only; expected a writable array")


def writes_in_place(out, dtype, inputs):
    """True if a kernel may write straight into ``out``: C-contiguous, aligned, of the compute
    dtype and sharing no memory with any input."""
    return (out.dtype == dtype and out.flags.c_contiguous and out.flags.aligned
            and not any(a is not None and np.may_share_memory(out, a) for a in inputs))


def writes_rows_in_place(out, dtype, inputs):
    """True if a kernel may write straight into ``out`` of shape (..., L, Ev) that is not
    C-contiguous: aligned, of the compute dtype, rows of adjacent elements (unit stride on the
    last axis, a positive row stride) in which no two elements share a byte (a sufficient test:
    the axes of more than one element, ordered by stride magnitude, each step past the block
    of the axes before it), and sharing no memory with any input. The (B, L, H, Ev) buffer
    viewed as (B, H, L, Ev) that transformers asks for is of this kind."""
    if out.dtype != dtype or not out.flags.aligned or out.ndim < 2 or out.size == 0:
        return False
    item = out.itemsize
    L, Ev = out.shape[-2:]
    if ((Ev > 1 and out.strides[-1] != item) or (L > 1 and out.strides[-2] <= 0)
            or any(s % item for s in out.strides)):        # whole elements (the kernels' units)
        return False
    extent = item
    for stride, size in sorted((abs(s), n) for n, s in zip(out.shape, out.strides) if n > 1):
        if stride < extent:
            return False
        extent += stride * (size - 1)
    return not any(a is not None and np.may_share_memory(out, a) for a in inputs)


def resolve_threads(n_threads, fname):
    """The number of OpenMP threads for a call (DESIGN 3.11)."""
    limit = max_threads()
    if n_threads is None:
        return limit
    if isinstance(n_threads, (bool, np.bool_)) or not isinstance(n_threads, numbers.Integral):
        raise TypeError(f"{fname}: n_threads must be an int or None, got "
                        f"{type(n_threads).__name__}")
    n = int(n_threads)
    if n == 0:
        raise ValueError(f"{fname}: n_threads must be nonzero (None for the default, a negative "
                         f"value counts back from the maximum of {limit}), got 0")
    if n < 0:
        n = max(1, limit + 1 + n)
    return 1 if in_forked_child() else n


def as_float_arrays(fname, **arrays):
    """:func:`as_float_array` of each keyword argument in turn (its name is the argument's name);
    returns the arrays as a tuple in the order given."""
    return tuple(as_float_array(x, name, fname) for name, x in arrays.items())


def check_bools(fname, **flags):
    """:func:`check_bool` of each keyword argument in turn; returns the bools as a tuple."""
    return tuple(check_bool(value, name, fname) for name, value in flags.items())


def check_alignment(causal_alignment, fname):
    """Raise ValueError unless ``causal_alignment`` is "top_left" or "bottom_right"."""
    if causal_alignment not in ("top_left", "bottom_right"):
        raise ValueError(f"{fname}: causal_alignment must be 'top_left' or 'bottom_right', "
                         f"got {causal_alignment!r}")


def query_key_dims(fname, query, key):
    """``(L, E, S)`` of ``query`` (..., L, E) and ``key`` (..., S, E), both at least 2-D; raise
    ValueError if their last dimensions E differ."""
    L, E = query.shape[-2:]
    S, Ek = key.shape[-2:]
    if Ek != E:
        raise ValueError(f"{fname}: query has E={E} (shape {query.shape}) but key has E={Ek} "
                         f"(shape {key.shape}); expected equal last dimensions")
    return L, E, S


def require_matrices(fname, dims, **arrays):
    """Raise ValueError unless every array has at least 2 dimensions (``dims`` names them)."""
    for name, arr in arrays.items():
        if arr.ndim < 2:
            raise ValueError(f"{fname}: {name} must have at least 2 dimensions ({dims}), got "
                             f"shape {arr.shape}")


def check_bool(value, name, fname):
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{fname}: {name} must be a bool, got {type(value).__name__}")


def check_real(value, name, fname):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{fname}: {name} must be a real number, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{fname}: {name} is too large for a float64, got {value!r}") from None


def to_result(arr, dtype):
    """``arr`` in the result dtype; rounding float32 results to float16 may overflow to inf,
    which is the answer in float16, so NumPy's overflow warning is silenced.

    A C-contiguous float32 ``arr`` is rounded to float16/bfloat16 by the kernels' conversion
    (the bits of NumPy's and ml_dtypes' ``astype``, to nearest even; ml_dtypes converts one
    element at a time, about 0.8 ns each, 5-20 % of a short half-precision attention call)."""
    if arr.dtype == dtype:
        return arr
    fmt = half_code(dtype) if arr.dtype == np.float32 else 0
    if fmt and arr.flags.c_contiguous:
        res = np.empty(arr.shape, dtype)
        _backend.kernels.float32_to_half(arr.reshape(-1), res.view(np.uint16).reshape(-1), fmt)
        return res
    with np.errstate(over="ignore"):
        return arr.astype(dtype)


def copy_result(out, arr):
    """Copy a computed result into the caller's ``out`` (see to_result for float16)."""
    with np.errstate(over="ignore"):
        np.copyto(out, arr, casting="unsafe")


# Shared read-only offsets for calls without batch dimensions (the kernels take const views).
_NO_BATCH = np.zeros(1, dtype=np.int64)
_NO_BATCH.flags.writeable = False


def batch_offsets(arr, batch_shape, head_group=1):
    """Element offsets of each ``arr[..., :, :]`` matrix, for every index of ``batch_shape`` in
    C order, broadcasting ``arr``'s batch dims (size 1 or missing -> offset 0).

    With ``head_group > 1`` (grouped-query attention) the last batch dim is the head dim and
    index h maps to ``h // head_group`` of ``arr``.
    """
    nb = len(batch_shape)
    if nb == 0:
        return _NO_BATCH
    item = arr.itemsize
    own_shape = arr.shape[:-2]
    own_strides = arr.strides[:-2]
    lead = nb - len(own_shape)
    strides = [0] * nb
    for d, (size, stride) in enumerate(zip(own_shape, own_strides)):
        if size != 1 or (head_group > 1 and lead + d == nb - 1):
            strides[lead + d] = stride // item
    count = math.prod(batch_shape)
    if not any(strides):
        return np.zeros(count, dtype=np.int64)
    idx = np.indices(batch_shape, dtype=np.int64).reshape(nb, -1)
    if head_group > 1:
        idx[nb - 1] //= head_group
    return np.asarray(strides, dtype=np.int64) @ idx


def fast_threads(n_threads):
    """resolve_threads for the fast paths: the thread count for None or a plain positive int
    (1 in a forked child), 0 for anything else (the general path then validates it)."""
    if n_threads is None:
        return max_threads()
    if type(n_threads) is not int or not 0 < n_threads < 65536:
        return 0
    return 1 if in_forked_child() else n_threads


def threads_for_work(n_threads, work, per_thread):
    """At most ``n_threads``, and no more threads than ``work // per_thread``.

    Starting an OpenMP team costs microseconds (far more when the other cores are busy), so
    small calls run on one thread. Work splits never change results, so neither does this cap.
    """
    return max(1, min(n_threads, work // per_thread))


# ------------------------------------------------------------------------------------------
# Attention variants (window, softcap, per-sequence lengths, ALiBi slopes, sinks)
# ------------------------------------------------------------------------------------------

class AttentionVariants:
    """The validated variant arguments of an attention call (see
    scaled_dot_product_attention): window sides (-1 = unbounded), softcap (0.0 = none) and the
    per-batch-entry arrays (None when not given)."""

    __slots__ = ("left", "right", "softcap", "key_lengths", "query_lengths", "slopes", "sinks")

    def __init__(self, fname, batch, L, S, compute_dtype, *, window, softcap, key_lengths,
                 query_lengths, alibi_slopes, sinks):
        self.left, self.right = check_window(window, S + L + 1, fname)
        self.softcap = check_softcap(softcap, compute_dtype, fname)
        self.key_lengths = per_batch_entry(key_lengths, "key_lengths", batch, fname,
                                           integer=True)
        self.query_lengths = per_batch_entry(query_lengths, "query_lengths", batch, fname,
                                             integer=True)
        self.slopes = per_batch_entry(alibi_slopes, "alibi_slopes", batch, fname,
                                      integer=False, compute_dtype=compute_dtype)
        self.sinks = per_batch_entry(sinks, "sinks", batch, fname, integer=False,
                                     compute_dtype=compute_dtype)


def check_window(window, limit, fname):
    """``window=(left, right)`` -> (left, right) with -1 for an unbounded side; sides past
    ``limit`` (S + L + 1, beyond which a side bounds nothing) are clipped to it."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"{fname}: window must be a (left, right) pair of non-negative ints "
                        f"or None, got {window!r}")
    sides = []
    for side, value in zip(("left", "right"), window):
        if value is None:
            sides.append(-1)
            continue
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{fname}: window {side} side must be a non-negative int or None, "
                            f"got {type(value).__name__}")
        value = int(value)
        if value < 0:
            raise ValueError(f"{fname}: window {side} side must be >= 0 (or None for "
                             f"unbounded), got {value}")
        sides.append(min(value, limit))
    return sides[0], sides[1]


def check_softcap(softcap, compute_dtype, fname):
    """``softcap`` -> 0.0 (none) or a positive finite float rounded to the compute dtype."""
    if softcap is None:
        return 0.0
    value = check_real(softcap, "softcap", fname)
    if not (0.0 < value < math.inf):
        raise ValueError(f"{fname}: softcap must be a positive finite number, got {softcap!r}")
    rounded = float(np.asarray(value, dtype=compute_dtype))
    if not (0.0 < rounded < math.inf):
        raise ValueError(f"{fname}: softcap {softcap!r} is not a positive finite "
                         f"{np.dtype(compute_dtype).name}")
    return rounded


def per_batch_entry(value, name, batch, fname, *, integer, compute_dtype=None):
    """One value per batch entry: ``value`` broadcast to ``batch`` (without enlarging it) and
    flattened in C order, as contiguous int64 (``integer``: lengths, >= 0) or float64 holding
    values rounded to ``compute_dtype`` (slopes, sinks). None stays None."""
    if value is None:
        return None
    arr = np.asarray(value)
    if integer:
        if arr.dtype == np.bool_ or arr.dtype.kind not in "iu":
            raise TypeError(f"{fname}: {name} must be an integer array, got dtype "
                            f"{arr.dtype}")
        if arr.size and arr.min() < 0:
            raise ValueError(f"{fname}: {name} must be >= 0, got a minimum of {arr.min()}")
    elif (arr.dtype == np.bool_ or arr.dtype.kind not in "iuf" or arr.dtype == object) \
            and not is_bfloat16(arr.dtype):
        raise TypeError(f"{fname}: {name} must be a real (float) array, got dtype {arr.dtype}")
    shape = broadcast_shapes((arr.shape, batch), f"{name} and the batch shape", fname)
    if shape is None or shape != tuple(batch):
        raise ValueError(f"{fname}: {name} of shape {arr.shape} does not broadcast to the "
                         f"batch shape {tuple(batch)} (one value per batch entry, e.g. per "
                         f"head)")
    arr = np.broadcast_to(arr, batch).reshape(-1)
    if integer:
        if arr.dtype == np.uint64:     # values past int64 act as S (L), like any past it
            arr = np.minimum(arr, np.uint64(np.iinfo(np.int64).max))
        return np.ascontiguousarray(arr, dtype=np.int64)
    with np.errstate(over="ignore"):
        arr = arr.astype(compute_dtype)
    return np.ascontiguousarray(arr, dtype=np.float64)


def attention_batch_shape(fname, enable_gqa, query, **others):
    """(batch shape, GQA head group) of ``query`` and the arrays in ``others`` (``key``, and
    ``value`` for attention; keyword names are used in the messages): their batch dims
    broadcast like ``np.matmul``; with ``enable_gqa`` the head dims (axis -3) of the others
    must be equal and divide the query's, and query head ``h`` uses their head
    ``h // group``."""
    names = ["query", *others]
    arrays = [query, *others.values()]
    shapes = [a.shape[:-2] for a in arrays]
    listed = ", ".join(names[:-1]) + f" and {names[-1]}"
    if not enable_gqa:
        batch = broadcast_shapes(shapes, f"the batch dimensions of {listed}", fname)
        if batch is None:
            got = ", ".join(f"{n} {s}" for n, s in zip(names[:-1], shapes[:-1]))
            raise ValueError(f"{fname}: batch dimensions of {got} and {names[-1]} {shapes[-1]} "
                             f"do not broadcast together")
        return batch, 1
    if min(len(s) for s in shapes) < 1:
        got = ", ".join(str(a.shape) for a in arrays)
        raise ValueError(f"{fname}: enable_gqa needs a head dimension (axis -3) on {listed}; "
                         f"got shapes {got}")
    heads = [s[-1] for s in shapes]
    hq, kv_heads = heads[0], heads[1:]
    if len(set(kv_heads)) != 1 or kv_heads[0] == 0 or hq % kv_heads[0]:
        kv_names = " and ".join(names[1:])
        need = ("must have the same number of heads dividing the query's" if len(kv_heads) > 1
                else "must have a number of heads dividing the query's")
        got = ", ".join(f"{n} {h}" for n, h in zip(names, heads))
        raise ValueError(f"{fname}: with enable_gqa, {kv_names} {need}; got {got} heads")
    outer = broadcast_shapes([s[:-1] for s in shapes], f"the batch dimensions of {listed}",
                             fname)
    if outer is None:
        got = ", ".join(f"{n} {s[:-1]}" for n, s in zip(names[:-1], shapes[:-1]))
        raise ValueError(f"{fname}: batch dimensions of {got} and {names[-1]} "
                         f"{shapes[-1][:-1]} do not broadcast together")
    return outer + (hq,), hq // kv_heads[0]


class AttentionCall:
    """An attention call after its one validation pass (:func:`describe_attention`): the
    checked arrays, shapes, dtypes and options that the kernel paths take. Below this tier
    nothing is validated again.

    ``query``, ``key`` and ``value`` are float arrays (an 8-bit key or value is a zero-stride
    stand-in of the compute dtype: its data and scales are in ``kv8``); ``batch`` is the
    broadcast batch shape and ``group`` the GQA head group; ``mask_kind`` is 0 (none), 1
    (bool, True = take part) or 2 (float, added), ``mask`` the mask broadcast to
    ``batch + (L, S)`` (None without) and ``attn_mask`` the caller's (for the overlap checks
    against ``out``); ``variants`` an :class:`AttentionVariants`; ``out``
    the caller's checked ``out`` or None; ``n_threads`` the resolved thread count."""

    __slots__ = ("fname", "query", "key", "value", "kv8", "batch", "group", "L", "S", "E", "Ev",
                 "compute", "result", "scale", "is_causal", "bottom_right", "enable_gqa",
                 "return_lse", "attn_mask", "mask_kind", "mask", "variants", "out", "n_threads")


def describe_attention(fname, query, key, value, attn_mask, is_causal, scale, causal_alignment,
                       enable_gqa, out, n_threads, *, return_lse=False, window=None,
                       softcap=None, sinks=None, alibi_slopes=None, key_lengths=None,
                       query_lengths=None, key_scale=None, value_scale=None):
    """Validate an attention call once and describe it (:class:`AttentionCall`).

    ``value=None`` describes an :func:`cyattn.attention_weights` call (no value: the result is
    ``batch + (L, S)``); otherwise the result is ``batch + (L, Ev)``, and an 8-bit (int8 or
    float8_e4m3fn) key or value with its scales is checked by :mod:`cyattn._kv8`. The checks
    run in the order the messages were always produced in: 8-bit K/V scales, dtypes, flags,
    alignment, ranks, E, S, batch/GQA, promotion, scale, mask, variants, ``out``, threads.
    Raises the TypeError / ValueError of the first rule broken (each rule's function above)."""
    from . import _kv8
    c = AttentionCall()
    c.fname = f = fname
    c.kv8 = kv8 = (_kv8.Inputs.of(f, key, value, key_scale, value_scale)
                   if value is not None else None)
    if kv8 is not None:
        query = as_float_array(query, "query", f)
        key, value = (np.broadcast_to(np.zeros((), query.dtype), arr.shape) if code
                      else as_float_array(arr, name, f)
                      for arr, code, name in ((kv8.key, kv8.codes[0], "key"),
                                              (kv8.value, kv8.codes[1], "value")))
    elif value is None:
        query, key = as_float_arrays(f, query=query, key=key)
    else:
        query, key, value = as_float_arrays(f, query=query, key=key, value=value)
    if value is None:
        c.is_causal, c.enable_gqa = check_bools(f, is_causal=is_causal, enable_gqa=enable_gqa)
        c.return_lse = False
    else:
        c.is_causal, c.enable_gqa, c.return_lse = check_bools(
            f, is_causal=is_causal, enable_gqa=enable_gqa, return_lse=return_lse)
    check_alignment(causal_alignment, f)
    c.bottom_right = causal_alignment == "bottom_right"
    if value is None:
        require_matrices(f, "..., length, dim", query=query, key=key)
    else:
        require_matrices(f, "..., length, dim", query=query, key=key, value=value)
    c.L, c.E, c.S = L, E, S = query_key_dims(f, query, key)
    if value is None:
        c.Ev = None
        c.batch, c.group = attention_batch_shape(f, c.enable_gqa, query, key=key)
        c.compute, c.result = float_dtypes(query, key)
    else:
        Sv, c.Ev = value.shape[-2:]
        if Sv != S:
            raise ValueError(f"{f}: key has S={S} rows (shape {key.shape}) but value has {Sv} "
                             f"(shape {value.shape}); expected equal")
        c.batch, c.group = attention_batch_shape(f, c.enable_gqa, query, key=key, value=value)
        c.compute, c.result = float_dtypes(query, key, value)
    c.query, c.key, c.value = query, key, value
    if scale is None:
        c.scale = 1.0 / math.sqrt(E) if E > 0 else 1.0
    else:
        c.scale = check_real(scale, "scale", f)
    c.attn_mask = attn_mask
    c.mask_kind, mask = prepare_mask(attn_mask, "attn_mask", f, c.compute)
    c.mask = broadcast_mask(mask, c.batch + (L, S), "attn_mask", f) if c.mask_kind else None
    c.variants = AttentionVariants(f, c.batch, L, S, c.compute, window=window, softcap=softcap,
                                   key_lengths=key_lengths, query_lengths=query_lengths,
                                   alibi_slopes=alibi_slopes, sinks=sinks)
    if out is not None:
        check_out(out, c.batch + (L, S if value is None else c.Ev), c.result, f)
    c.out = out
    c.n_threads = resolve_threads(n_threads, f)
    return c


def positive_int_arg(text):
    """argparse type of the command line's counts (``--threads``, ``--cases``, ...)."""
    import argparse

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n
