"""8-bit K/V caches (issue 39): which dtypes are 8-bit K/V, their scales' checks, and the
dequantised copy for the calls the kernels do not read in place.

An 8-bit key or value is ``int8`` (with a float32 scale, required) or
``ml_dtypes.float8_e4m3fn`` (scale optional, default 1). Its scale broadcasts to
``arr.shape[:-1] + (1,)``: per token and head, per head ``(..., H, 1, 1)`` or per tensor. The
element's value is ``scale * element``. 8-bit arrays do not take part in dtype promotion (as
masks do not): they are dequantised into the compute dtype of the other inputs.
"""
import numbers

import numpy as np

# The kernels' codes (_cyattn_kv8.h: CYATTN_KV8_*)
KV8_I8, KV8_E4M3 = 3, 4

_INT8 = np.dtype(np.int8)
_FLOAT32 = np.dtype(np.float32)
_EXACT_IN_FLOAT32 = (np.dtype(np.float16), _FLOAT32)


def kv8_code(dtype):
    """The kernels' code of an 8-bit K/V dtype: KV8_I8 for int8, KV8_E4M3 for
    ``ml_dtypes.float8_e4m3fn`` (recognised by name: ml_dtypes stays optional), else 0."""
    if dtype == _INT8:
        return KV8_I8
    if dtype.name == "float8_e4m3fn" and dtype.itemsize == 1:
        return KV8_E4M3
    return 0


def _as_array(x):
    return x if isinstance(x, np.ndarray) else None


def check_scale(scale, name, arr, arr_name, fname):
    """The validated scale of ``arr`` (None, or a C-contiguous float32 array whose shape
    broadcasts to ``arr.shape[:-1] + (1,)``).

    A Python or NumPy real scalar, or a list of Python numbers, is rounded to float32; arrays
    must be float32 (float16 and bfloat16 are widened, exactly); float64 arrays (whose
    rounding the caller should choose) and other dtypes raise ValueError, as do a
    shape that does not broadcast and non-finite values. A scale for a key or value that is
    not 8-bit raises TypeError, as does an int8 one without a scale."""
    code = kv8_code(arr.dtype)
    if scale is None:
        if code == KV8_I8:
            raise TypeError(f"{fname}: {arr_name} has dtype int8 but {name} is None; an int8 "
                            f"{arr_name} is a quantised cache and needs its float32 {name} "
                            f"(broadcastable to {arr.shape[:-1] + (1,)})")
        return None
    if not code:
        raise TypeError(f"{fname}: {name} applies only to an int8 or float8_e4m3fn "
                        f"{arr_name}, but {arr_name} has dtype {arr.dtype}; pass {name}=None "
                        f"(or dequantise the {arr_name} yourself)")
    target = arr.shape[:-1] + (1,)
    if isinstance(scale, (bool, np.bool_)):
        raise ValueError(f"{fname}: {name} must be a float32 array or a real number, got bool")
    if isinstance(scale, numbers.Real) and not isinstance(scale, np.ndarray):
        with np.errstate(over="ignore"):
            s = np.asarray(float(scale), dtype=_FLOAT32)
    else:
        s = _as_array(scale)
        if s is None:           # a (nested) list of Python numbers: rounded, as a scalar is
            try:
                s = np.asarray(scale)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{fname}: {name} could not be converted to an array ({exc}); "
                                 f"expected float32 scales") from None
            if s.dtype.kind in "iuf" and s.dtype.itemsize > 1:
                with np.errstate(over="ignore"):
                    s = s.astype(_FLOAT32)
        if s.dtype.kind == "f" and not s.dtype.isnative:
            s = s.astype(s.dtype.newbyteorder("="))
        if s.dtype in _EXACT_IN_FLOAT32 or (s.dtype.name == "bfloat16" and s.dtype.itemsize == 2):
            s = s.astype(_FLOAT32, copy=False)
        else:
            raise ValueError(f"{fname}: {name} has dtype {s.dtype}; expected float32 (float16 "
                             f"and bfloat16 are widened; cast float64 scales with "
                             f".astype(np.float32))")
    if s.ndim > len(target) or any(
            n not in (1, t) for n, t in zip(s.shape[::-1], target[::-1])):
        raise ValueError(f"{fname}: {name} has shape {s.shape}, which does not broadcast to "
                         f"{target} ({arr_name}.shape[:-1] + (1,): per token and head, per "
                         f"head, or one scale)")
    if not np.isfinite(s).all():
        raise ValueError(f"{fname}: {name} has a non-finite value ({s[~np.isfinite(s)][0]!r}); "
                         f"expected finite scales")
    if not (s.flags.c_contiguous and s.flags.aligned):
        s = np.array(s, order="C", copy=True)     # (ascontiguousarray keeps a misaligned one)
    return s


def dequantize(arr, scale, dtype):
    """``scale * arr`` in ``dtype`` (float32 or float64), a new array of arr's shape: every
    8-bit value is exact in float32, so each element is the exact product rounded once."""
    res = arr.astype(dtype)
    if scale is not None:
        res *= scale.astype(dtype, copy=False)
    return res


class Inputs:
    """The key and value of an attention call of which one at least is 8-bit (or has a scale):
    the arrays as given, their codes and validated scales, and what the kernels get."""

    __slots__ = ("key", "value", "codes", "scales", "_dequantised")

    def __init__(self, key, value, codes, scales):
        self.key, self.value, self.codes, self.scales = key, value, codes, scales
        self._dequantised = None

    @classmethod
    def of(cls, fname, key, value, key_scale, value_scale):
        """Inputs for a call with an 8-bit key or value or a scale, else None. Raises
        TypeError for an int8 key/value without its scale or a scale of a float one, and
        ValueError for a bad scale (see check_scale)."""
        if key_scale is None and value_scale is None and not (
                (isinstance(key, np.ndarray) and kv8_code(key.dtype))
                or (isinstance(value, np.ndarray) and kv8_code(value.dtype))):
            return None
        arrays, codes, scales = [], [], []
        for arr, scale, name in ((key, key_scale, "key"), (value, value_scale, "value")):
            if not isinstance(arr, np.ndarray):
                arr = np.asarray(arr) if scale is not None else arr
            if isinstance(arr, np.ndarray):
                if kv8_code(arr.dtype) and arr.ndim < 2:
                    raise ValueError(f"{fname}: {name} must have at least 2 dimensions "
                                     f"(..., length, dim), got shape {arr.shape}")
                scales.append(check_scale(scale, f"{name}_scale", arr, name, fname))
                codes.append(kv8_code(arr.dtype))
            else:
                scales.append(None)
                codes.append(0)
            arrays.append(arr)
        return cls(arrays[0], arrays[1], tuple(codes), tuple(scales))

    def real_arrays(self):
        """The key and value as given (for the overlap checks against ``out``)."""
        return self.key, self.value

    def fmt(self, compute, L, max_rows):
        """The kernels' kv_fmt for reading both in place (the decode path, float32 compute,
        key and value of one 8-bit dtype), else 0 (dequantised copies)."""
        c0, c1 = self.codes
        if c0 and c0 == c1 and compute == _FLOAT32 and 0 < L <= max_rows:
            return c0
        return 0

    def kernel_arrays(self, kv_fmt, compute, kernel_ready):
        """(key, value) as the kernels read them: with kv_fmt the 8-bit arrays (as uint8),
        else each 8-bit one dequantised to ``compute`` (a copy, made once per call) and a
        float one through ``kernel_ready``."""
        if kv_fmt:
            return self.key.view(np.uint8), self.value.view(np.uint8)
        if self._dequantised is None:
            self._dequantised = tuple(
                dequantize(arr, scale, compute) if code else kernel_ready(arr, compute)
                for arr, code, scale in zip((self.key, self.value), self.codes, self.scales))
        return self._dequantised

    def kernel_scales(self, kv_fmt, batch, group, batch_offsets):
        """The scale keywords of the kernels' attention() for kv_fmt (none without)."""
        if not kv_fmt:
            return {}
        kw = {}
        for arr, scale, p in ((self.key, self.scales[0], "k"), (self.value, self.scales[1], "v")):
            if scale is None:
                continue
            view = np.broadcast_to(scale, arr.shape[:-1] + (1,))
            kw[f"{p}_scale"] = scale.reshape(-1)
            kw[f"{p}_scale_off"] = batch_offsets(view, batch, group)
            kw[f"{p}_scale_rs"] = view.strides[-2] // view.itemsize
        return kw
