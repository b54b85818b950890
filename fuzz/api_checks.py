"""Decode fuzzer bytes into one call of a cyattn public function and check it (no atheris here).

``check_one(data)`` is the whole harness: ``fuzz/fuzz_api.py`` (atheris / libFuzzer) calls it for
every input, and ``tests/test_fuzz_corpus.py`` replays ``fuzz/corpus/`` through it with pytest.
It returns a short label of what ran and raises :class:`FuzzFailure` (an AssertionError) when
cyattn broke its contract (DESIGN sections 2-3):

* only TypeError / ValueError may be raised, and only when the decoded call has a deliberate
  fault (bad dtype, shape, mask, ``out``, flag, scale, axis, alpha or ``n_threads``); the type
  must be the documented one and the message must name the argument; a call without a fault
  must not raise at all;
* after a raise, every buffer (inputs, ``out`` and the bytes around them) is bit-for-bit as
  before; after a success only the bytes of ``out`` changed (inputs never, also when ``out``
  overlaps an input, and never the gaps of a strided ``out``);
* a success returns the documented object, shape and dtype (``out`` itself when given), no
  warning, and values that agree with ``cyattn.oracle`` (pure Python, exactly rounded sums)
  within the tolerances of ``tests/conftest.py``, with NaN and infinities in the same places:
  a NaN or inf at a masked position never leaks, fully masked rows are 0 with lse -inf;
  entries the reference has exactly 0 (softmax) / -inf (log_softmax) are exact, and subnormal
  softmax results are not flushed to 0;
* in the rare "big" cases (sizes that run on several threads) the result is bit-identical to
  an ``n_threads=1`` call, and agrees with a NumPy float64 reference.

Two allowances keep legitimate rounding from being reported: in a row whose largest permitted
score is a huge finite shift (a -1e9 or finfo.min float mask) only the NaN/inf pattern is
compared, and an attention row is not compared where a NaN/inf value sits at a key whose weight
underflows to 0 in the compute dtype but not in float64 (whether it is read then depends on
that rounding).

Kinds of case: everyday "plain" calls (which cyattn serves on fast paths), general calls with
every option, "long" attention rows (several 256-key blocks, the decode path's 512-key chunks
for L <= 4 and S >= 1024; values from a generator seeded by the input), "big" multi-threaded
calls, and calls with one deliberate fault. Each input also picks the kernel variant (of those
this machine runs), so a corpus file may exercise another variant on another machine.

Decoding: :class:`ByteReader` reads the input from the front, one decision at a time; an
exhausted input reads as zero bytes, and every choice list starts with its plainest option, so
any byte string (including the empty one) decodes to a valid case. It is a small
FuzzedDataProvider of our own, not atheris's, so that the corpus decodes identically without
atheris installed. Values are on a dyadic grid (exactly representable in float16, float32 and
float64; dot products of them are exact in float32), with NaN / +-inf / huge finite mask values
sprinkled in where a case asks for them.

Reference helpers and tolerances are imported from ``tests/conftest.py`` (the one place they are
set); the checkout's ``tests/`` folder must therefore sit next to ``fuzz/``.
"""
import fractions
import importlib.util
import math
import os
import pathlib
import sys
import warnings

import numpy as np

import cyattn
from cyattn import _backend, oracle

_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load_conftest():
    name = "_cyattn_fuzz_conftest"
    if name in sys.modules:
        return sys.modules[name]
    path = _ROOT / "tests" / "conftest.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


CT = _load_conftest()

# Known cyattn bugs whose inputs the decoder stops generating, so that a long fuzz run looks
# for new ones: CYATTN_FUZZ_AVOID=tag[,tag...]. Tags: "bswap-mask" (a byte-swapped float mask,
# e.g. dtype '>f4', raises TypeError although it is a float mask), "mha-mask-warning"
# (multi_head_attention with two float masks, +inf in one and -inf in the other at one
# position: NumPy's RuntimeWarning from their sum is not silenced). Empty by default.
AVOID = frozenset(t.strip() for t in os.environ.get("CYATTN_FUZZ_AVOID", "").split(",")
                  if t.strip())
VARIANTS = _backend.available_variants()
FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))

__all__ = ["check_one", "describe", "FuzzFailure", "ByteReader"]


class FuzzFailure(AssertionError):
    """cyattn broke its contract on a fuzz input."""


# ------------------------------------------------------------------------------------------
# Byte decoding
# ------------------------------------------------------------------------------------------

class ByteReader:
    """Consumes ``data`` from the front; past its end every byte reads as 0."""

    def __init__(self, data):
        self.data = bytes(data)
        self.pos = 0

    def byte(self):
        if self.pos < len(self.data):
            b = self.data[self.pos]
            self.pos += 1
            return b
        return 0

    def take(self, n):
        chunk = self.data[self.pos:self.pos + n]
        self.pos += len(chunk)
        return chunk + bytes(n - len(chunk))

    def int(self, lo, hi):
        """An int in [lo, hi] (inclusive)."""
        span = hi - lo
        if span <= 0:
            return lo
        v = 0
        for _ in range((span.bit_length() + 7) // 8):
            v = (v << 8) | self.byte()
        return lo + v % (span + 1)

    def bool(self):
        return bool(self.byte() & 1)

    def chance(self, num, den):
        """True with probability num/den for random bytes (False for exhausted input)."""
        return self.int(0, den - 1) >= den - num

    def pick(self, seq):
        return seq[self.int(0, len(seq) - 1)]


# ------------------------------------------------------------------------------------------
# Values
# ------------------------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")
VALUE_SPECIALS = (NAN, INF, -INF)


def grid(r, shape, unit, specials=0, special_values=VALUE_SPECIALS):
    """float64 values ``k * unit`` with k in [-128, 127] (byte 0 -> 0.0); ``specials`` 1 or 2
    turns the top 8 or 32 byte values into ``special_values`` (sparse / dense)."""
    n = math.prod(shape)
    b = np.frombuffer(r.take(n), dtype=np.uint8).astype(np.int64)
    vals = (((b + 128) % 256) - 128) * float(unit)
    if specials:
        hit = b >= (248 if specials == 1 else 224)
        if hit.any():
            sv = np.array(special_values, dtype=np.float64)
            vals = np.where(hit, sv[b % len(sv)], vals)
    return vals.reshape(shape)


def bits(r, shape, density):
    """Bool array, each entry True with probability ``density`` (in 1/256 steps)."""
    n = math.prod(shape)
    b = np.frombuffer(r.take(n), dtype=np.uint8)
    return (b < round(density * 256)).reshape(shape) if density < 1 else np.ones(shape, bool)


def reduce_shape(r, shape, allow_empty=True):
    """A shape that broadcasts to ``shape`` without enlarging it: some dims set to 1, some
    leading dims dropped."""
    dims = [1 if r.chance(1, 3) else d for d in shape]
    drop = r.int(0, len(dims) if allow_empty else max(0, len(dims) - 1))
    if not r.chance(1, 2):
        drop = 0
    return tuple(dims[drop:])


# ------------------------------------------------------------------------------------------
# Memory: every array is a view of a raw uint8 buffer we own, filled with 0xFF (NaN) first so
# that reads outside a view show up as NaN, and writes anywhere are seen by a byte compare.
# ------------------------------------------------------------------------------------------

class Mem:
    def __init__(self):
        self.raws = []

    def alloc(self, nbytes, slack=0):
        raw = np.full(int(nbytes) + 64 + slack, 0xFF, dtype=np.uint8)
        self.raws.append(raw)
        return raw

    def snapshot(self):
        return [raw.copy() for raw in self.raws]

    def owner(self, arr):
        if not isinstance(arr, np.ndarray):
            return None
        p = arr.__array_interface__["data"][0]
        for raw in self.raws:
            start = raw.__array_interface__["data"][0]
            if start <= p <= start + raw.size:
                return raw
        return None


def covered(raw, arr):
    """Bool mask of the bytes of ``raw`` that ``arr`` (a view into it) covers."""
    mark = np.zeros(raw.size, dtype=np.uint8)
    if arr.size:
        off = arr.__array_interface__["data"][0] - raw.__array_interface__["data"][0]
        view = np.ndarray(arr.shape + (arr.itemsize,), np.uint8, buffer=mark, offset=off,
                          strides=arr.strides + (1,))
        view[...] = 1
    return mark.astype(bool)


IN_LAYOUTS = ("C", "F", "T", "rev", "step", "unaligned", "be", "neg1", "bcast", "list",
              "field")
OUT_LAYOUTS = ("C", "F", "T", "rev", "step", "unaligned", "neg1", "field")


def _cast(values, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind in "biu":
        v = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0, posinf=7, neginf=-7)
        return np.round(v).astype(dtype) if dtype.kind != "b" else v != 0
    if dtype.kind == "O":
        return np.array(np.asarray(values).tolist(), dtype=object).reshape(np.shape(values))
    with np.errstate(all="ignore"):
        return np.asarray(values).astype(dtype)


RAGGED = [[0.0, 1.0], [2.0]]        # np.asarray raises on it: a TypeError for data arguments


def build_array(r, mem, values, dtype, layout, read_only=False, slack=0):
    """``values`` (float64 or bool) as an array of ``dtype`` in memory ``layout``.

    Returns the argument to pass (an ndarray, or a nested list for "list"; RAGGED for the
    pseudo-dtype "ragged")."""
    if isinstance(dtype, str) and dtype == "ragged":
        return RAGGED
    dtype = np.dtype(dtype)
    shape = tuple(values.shape)
    nd = len(shape)
    if dtype.kind == "O":               # (as a list it would be valid float data)
        arr = _cast(values, dtype)
        if read_only:
            arr.flags.writeable = False
        return arr
    if layout == "list" and 0 in shape:
        layout = "C"                    # nested lists lose the dims after a 0
    if layout == "list":
        return _cast(values, dtype).tolist()
    item = dtype.itemsize
    nbytes = math.prod(shape) * item
    if layout == "T" and nd < 2 or nd == 0 and layout in ("rev", "neg1", "step"):
        layout = "C"
    if layout == "bcast" and not any(s > 1 for s in shape):
        layout = "C"
    if layout == "be":
        dtype = dtype.newbyteorder(">") if item > 1 else dtype
    if layout in ("C", "be", "unaligned"):
        off = 1 if layout == "unaligned" else 0
        raw = mem.alloc(nbytes + off, slack)
        arr = np.ndarray(shape, dtype, buffer=raw, offset=off)
    elif layout == "F":
        raw = mem.alloc(nbytes, slack)
        arr = np.ndarray(shape, dtype, buffer=raw, order="F")
    elif layout == "T":
        tshape = shape[:-2] + (shape[-1], shape[-2])
        raw = mem.alloc(nbytes, slack)
        arr = np.ndarray(tshape, dtype, buffer=raw).swapaxes(-1, -2)
    elif layout == "rev":
        raw = mem.alloc(nbytes, slack)
        arr = np.ndarray(shape, dtype, buffer=raw)[(slice(None, None, -1),) * nd]
    elif layout == "neg1":
        raw = mem.alloc(nbytes, slack)
        ax = r.int(0, max(nd - 1, 0))
        arr = np.ndarray(shape, dtype, buffer=raw)
        if nd:
            arr = arr[(slice(None),) * ax + (slice(None, None, -1),)]
    elif layout == "step":
        steps = [r.pick((2, 1, 3)) for _ in shape]
        bshape = tuple(s * st for s, st in zip(shape, steps))
        raw = mem.alloc(math.prod(bshape) * item, slack)
        base = np.ndarray(bshape, dtype, buffer=raw)
        arr = base[tuple(slice(None, None, st) for st in steps)]
    elif layout == "field":
        # a field of a packed record array: strides are not multiples of the itemsize
        rec = np.dtype([("v", dtype), ("pad", np.uint8)])
        raw = mem.alloc(math.prod(shape) * rec.itemsize, slack)
        arr = np.ndarray(shape, rec, buffer=raw)["v"]
    elif layout == "bcast":
        axes = [i for i, s in enumerate(shape) if s > 1]
        ax = axes[r.int(0, len(axes) - 1)]
        bshape = shape[:ax] + (1,) + shape[ax + 1:]
        raw = mem.alloc(math.prod(bshape) * item, slack)
        base = np.ndarray(bshape, dtype, buffer=raw)
        base[...] = _cast(np.take(values, [0], axis=ax), dtype)
        arr = np.broadcast_to(base, shape)
        return arr
    else:
        raise AssertionError(layout)
    arr[...] = _cast(values, dtype)
    if read_only:
        arr.flags.writeable = False
    return arr


def build_mask(r, mem, values, dtype, layout, read_only=False):
    """build_array for a mask; a byte-swapped float mask is skipped while
    CYATTN_FUZZ_AVOID names "bswap-mask" (see AVOID)."""
    if layout == "be" and "bswap-mask" in AVOID:
        layout = "C"
    return build_array(r, mem, values, dtype, layout, read_only)


def ref_copy(arg):
    """What cyattn sees for an argument, as a private native-byte-order copy (or None)."""
    if arg is None:
        return None
    if arg is RAGGED:
        return np.array([0], dtype=object)
    a = np.asarray(arg)
    if a.dtype.kind == "f" and not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    return np.array(a, copy=True)


def describe_arg(name, a):
    if isinstance(a, np.ndarray):
        flags = []
        if not a.flags.writeable:
            flags.append("read-only")
        if not a.flags.aligned:
            flags.append("unaligned")
        if not a.dtype.isnative:
            flags.append("byte-swapped")
        if a.flags.c_contiguous:
            flags.append("C")
        elif a.flags.f_contiguous:
            flags.append("F")
        return (f"{name}: ndarray shape={a.shape} dtype={a.dtype} strides={a.strides} "
                f"{' '.join(flags)}")
    if a is RAGGED:
        return f"{name}: ragged list {a!r}"
    if isinstance(a, list):
        return f"{name}: list shape={np.shape(a)}"
    return f"{name}: {a!r}"


# ------------------------------------------------------------------------------------------
# Case description and expectations
# ------------------------------------------------------------------------------------------

class Case:
    def __init__(self, fname):
        self.fname = fname
        self.fn = None
        self.args = []
        self.kwargs = {}
        self.must = {}           # exception type -> names the message may use
        self.may = {}            # tolerated (not required) exceptions, same form
        self.faults = []
        self.notes = []
        self.mem = Mem()
        self.out = None          # the out= argument (to check the returned object)
        self.verify = None       # callable(result) on success

    def fault(self, label, exc, *names):
        self.faults.append(label)
        self.must.setdefault(exc, []).extend(names)

    def maybe(self, label, exc, *names):
        self.notes.append(f"may raise: {label}")
        self.may.setdefault(exc, []).extend(names)

    def describe(self):
        lines = [f"cyattn.{self.fname} (variant {self.notes[0] if self.notes else '?'})"]
        for i, a in enumerate(self.args):
            lines.append("  " + describe_arg(f"arg{i}", a))
        for k, a in self.kwargs.items():
            lines.append("  " + describe_arg(k, a))
        if self.faults:
            lines.append(f"  faults: {self.faults}")
        lines.extend("  " + n for n in self.notes[1:])
        return "\n".join(lines)


def fail(case, msg):
    raise FuzzFailure(f"{msg}\n{case.describe()}")


N_THREADS_OK = (None, 1, 2, -1, 3, -2, -100, np.int64(2), 64, 10**30, -10**30)
N_THREADS_TYPE = (1.5, "2", True, np.bool_(True), 2.0)


def pick_threads(r, case, kwargs):
    if r.chance(1, 12):
        if r.bool():
            case.fault("n_threads=0", ValueError, "n_threads")
            kwargs["n_threads"] = 0
        else:
            bad = r.pick(N_THREADS_TYPE)
            case.fault(f"n_threads={bad!r}", TypeError, "n_threads")
            kwargs["n_threads"] = bad
        return
    nt = r.pick(N_THREADS_OK)
    if nt is not None or r.bool():
        kwargs["n_threads"] = nt


def pick_float(r):
    return r.pick((np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)))


BAD_DTYPES = (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.bool_),
              np.dtype(np.complex128), np.dtype(object), np.dtype(np.uint8), "ragged",
              np.dtype(np.longdouble))


def pick_in_layout(r, allow_bcast=True):
    lay = r.pick(IN_LAYOUTS) if r.chance(1, 2) else "C"
    if lay == "bcast" and not allow_bcast:
        lay = "C"
    return lay, r.chance(1, 5)


# ------------------------------------------------------------------------------------------
# Comparison
# ------------------------------------------------------------------------------------------

def _as_result(ref, dtype):
    """The reference as it must read in the result dtype: finite values beyond its range are
    +-inf there (float16 rounding overflows)."""
    ref = np.asarray(ref, dtype=np.float64)
    if np.dtype(dtype) == np.float16:
        with np.errstate(over="ignore"):
            r16 = ref.astype(np.float16).astype(np.float64)
        ref = np.where(np.isinf(r16) & np.isfinite(ref), r16, ref)
    return ref


def compare(case, what, got, ref, dtype, k=1, skip=None, loose=None):
    """``got`` agrees with ``ref`` within tol(dtype, k); entries where ``skip`` is True are not
    compared; where ``loose`` is True only the NaN / inf pattern is compared."""
    got = np.asarray(got, dtype=np.float64)
    ref = _as_result(ref, dtype)
    if got.shape != ref.shape:
        fail(case, f"{what}: shape {got.shape}, reference {ref.shape}")
    if skip is not None:
        skip = np.broadcast_to(skip, got.shape)
        got = np.where(skip, 0.0, got)
        ref = np.where(skip, 0.0, ref)
    if loose is not None:
        loose = np.broadcast_to(loose, got.shape)
        lg, lr = got[loose], ref[loose]
        if (not np.array_equal(np.isnan(lg), np.isnan(lr))
                or not np.array_equal(np.isposinf(lg), np.isposinf(lr))
                or not np.array_equal(np.isneginf(lg), np.isneginf(lr))):
            fail(case, f"{what}: NaN/inf pattern differs in rows with a huge mask shift\n"
                       f"got {lg}\nref {lr}")
        got = np.where(loose, 0.0, got)
        ref = np.where(loose, 0.0, ref)
    rtol, atol = CT.tol(dtype, k)
    try:
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as exc:
        fail(case, f"{what} differs from the reference (rtol={rtol}, atol={atol}):\n{exc}")


def check_no_alias(case, result, inputs):
    for name, a in inputs:
        if isinstance(a, np.ndarray) and np.may_share_memory(result, a):
            fail(case, f"the new result shares memory with input {name}")


# ------------------------------------------------------------------------------------------
# softmax / log_softmax
# ------------------------------------------------------------------------------------------

DIMS = (1, 2, 3, 4, 5, 0, 7, 8, 9, 17, 33, 31, 32, 64, 65, 100)
MASK_SPECIALS = (-INF, -INF, -INF, NAN, INF, -1e9, "min", -1e30)


def gen_float_mask(r, shape, default_dtype):
    mdt = r.pick((default_dtype, np.dtype(np.float64), np.dtype(np.float32),
                  np.dtype(np.float16)))
    specials = r.pick((1, 2, 0))
    sv = [(-np.finfo(mdt).max if s == "min" else s) for s in MASK_SPECIALS]
    if not r.chance(1, 3):
        sv = [s for s in sv if s in (-INF, NAN) or (isinstance(s, float) and math.isinf(s))]
    return grid(r, shape, 1 / 32, specials, tuple(sv)), mdt


def _moved_rows(arr, axis):
    return np.moveaxis(arr, axis, -1)


def build_softmax(r, case, log):
    fname = case.fname
    dtype = pick_float(r)
    ndim = r.int(1, 4)
    shape = [r.pick(DIMS) for _ in range(ndim)]
    while math.prod(shape) > 600:
        shape[shape.index(max(shape))] //= 2
    shape = tuple(shape)
    axis_default = r.chance(1, 3)
    axis = r.int(-ndim, ndim - 1)
    scale = r.pick((1.0, 8.0, 0.125, 32.0, 1024.0))    # 32: exp underflows to subnormals
    x = grid(r, shape, scale / 32, r.pick((0, 1, 2)))

    mask_kind = r.pick(("none", "bool", "float", "none"))
    mask = mdt = None
    if mask_kind != "none":
        mshape = reduce_shape(r, shape)
        if mask_kind == "bool":
            mask = bits(r, mshape, r.pick((0.5, 0.875, 0.125, 1.0)))
            mdt = np.dtype(np.bool_)
            if r.chance(1, 2) and mask.ndim and mask.size:
                # kill a whole row along the axis (a fully masked row)
                ax = axis % ndim - (ndim - mask.ndim)
                if ax >= 0:
                    idx = [r.int(0, max(s - 1, 0)) for s in mask.shape]
                    idx[ax] = slice(None)
                    mask[tuple(idx)] = False
            if r.chance(1, 2):
                # poison every position the mask removes
                full = np.broadcast_to(mask, shape)
                x = np.where(full, x, r.pick((NAN, INF, -INF)))
        else:
            mask, mdt = gen_float_mask(r, mshape, dtype)

    # faults
    x_dtype = dtype
    if r.chance(1, 6):
        which = r.int(0, 7)
        if which == 0:
            x_dtype = r.pick(BAD_DTYPES)
            case.fault(f"x dtype {x_dtype}", TypeError, "x")
        elif which == 1:
            x = x.reshape(-1)[:1].reshape(()) if x.size else np.zeros(())
            mask = None
            case.fault("x 0-d", ValueError, "x")
        elif which == 2:
            axis_default = False
            axis = r.pick((ndim, -ndim - 1, 10**20))
            case.fault(f"axis={axis}", ValueError, "axis")
        elif which == 3:
            axis_default = False
            axis = r.pick((1.0, True, "0", None))
            case.fault(f"axis={axis!r}", TypeError, "axis")
        elif which == 4:
            mask = np.zeros(shape, np.float64) if mask is None else mask
            mdt = r.pick((np.dtype(np.int64), np.dtype(np.uint8), np.dtype(np.complex64)))
            case.fault(f"mask dtype {mdt}", TypeError, "mask")
        elif which == 5:
            mask = np.ones((2,) + shape, bool)
            mdt = np.dtype(np.bool_)
            case.fault("mask enlarges", ValueError, "mask")
        elif which == 6 and ndim:
            mshape = shape[:-1] + (shape[-1] + 2,)     # never broadcasts (also for 0)
            mask = np.ones(mshape, bool)
            mdt = np.dtype(np.bool_)
            case.fault("mask shape", ValueError, "mask")

    xl, ro = pick_in_layout(r)
    if x.ndim == 0 and xl not in ("C", "list"):
        xl = "C"
    x_arg = build_array(r, case.mem, x, x_dtype, xl, ro, slack=r.pick((0, 64)))
    mask_arg = None
    if mask is not None:
        ml, mro = pick_in_layout(r)
        mask_arg = build_mask(r, case.mem, mask, mdt, ml, mro)

    x_ref = ref_copy(x_arg)
    result_dtype = x_ref.dtype if x_ref.dtype in FLOATS else None
    kwargs = {}
    if not axis_default:
        as_np = (r.chance(1, 4) and isinstance(axis, int) and not isinstance(axis, bool)
                 and abs(axis) < 2**62)
        kwargs["axis"] = np.int64(axis) if as_np else axis
    if mask is not None:
        kwargs["mask"] = mask_arg
    out = make_out(r, case, shape, result_dtype, inputs=[("x", x_arg), ("mask", mask_arg)])
    if out is not _NO_OUT:
        kwargs["out"] = out
        case.out = out
    case.fn = cyattn.log_softmax if log else cyattn.softmax
    case.args = [x_arg]
    case.kwargs = kwargs
    mask_ref = ref_copy(mask_arg)

    def verify(result):
        if case.out is not None and result is not case.out:
            fail(case, "with out=, the result is not out")
        if not isinstance(result, np.ndarray):
            fail(case, f"result is {type(result).__name__}")
        if result.shape != x_ref.shape or result.dtype != result_dtype:
            fail(case, f"result shape/dtype {result.shape} {result.dtype}; expected "
                       f"{x_ref.shape} {result_dtype}")
        if case.out is None:
            check_no_alias(case, result, [("x", x_arg), ("mask", mask_arg)])
        ax = kwargs.get("axis", -1)
        ax = int(ax) % x_ref.ndim
        expected = CT.oracle_softmax(x_ref, axis=ax, mask=mask_ref, log=log)
        loose = None
        if mask_ref is not None and mask_ref.dtype != np.bool_ and x_ref.size:
            # rows whose largest permitted score is a huge finite shift: the compute dtype
            # rounds every score of the row, so only the NaN / inf pattern is checked there
            compute = CT.compute_dtype(x_ref.dtype)
            m = np.broadcast_to(CT._mask_for_oracle(mask_ref, compute).astype(np.float64),
                                x_ref.shape)
            with np.errstate(all="ignore"):
                z = x_ref.astype(np.float64) + m
            zf = np.where(np.isfinite(z), z, -np.inf)
            rmax = _moved_rows(zf, ax).max(axis=-1, keepdims=True) if x_ref.shape[ax] else None
            if rmax is not None:
                loose = np.moveaxis(np.broadcast_to(np.abs(rmax) > 1e4,
                                                    _moved_rows(zf, ax).shape), -1, ax)
        compare(case, fname, result, expected, result_dtype, k=x_ref.shape[ax], loose=loose)
        # exact zeros (masked entries, fully masked rows, float64 underflow) stay exact
        zero = (expected == -np.inf) if log else (expected == 0)
        if loose is not None:
            zero &= ~loose
        bad = zero & ~(np.asarray(result) == (-np.inf if log else 0))
        if bad.any():
            fail(case, f"{fname}: entries that must be exactly {'-inf' if log else '0'} are "
                       f"{np.asarray(result)[bad][:5]}")
        if not log:
            # subnormal results are kept (no flush to zero)
            tiny = np.finfo(result_dtype).smallest_subnormal
            flushed = (expected >= 4 * float(tiny)) & (np.asarray(result) == 0)
            if loose is not None:
                flushed &= ~loose
            if flushed.any():
                fail(case, f"{fname}: results flushed to 0 where the reference is "
                           f"{expected[flushed][:5]}")

    case.verify = verify
    return case


# ------------------------------------------------------------------------------------------
# out= for softmax and attention
# ------------------------------------------------------------------------------------------

_NO_OUT = object()


def make_out(r, case, shape, result_dtype, inputs, overlap=True):
    """An out= argument (or _NO_OUT), possibly faulty or overlapping an input."""
    choice = r.int(0, 15)
    if choice < 6:
        return _NO_OUT
    if choice >= 10 and not overlap:
        choice = 9
    shape = tuple(shape)
    rd = result_dtype if result_dtype is not None else np.dtype(np.float32)
    init = np.full(shape, 7.0)
    if choice < 10:
        lay = r.pick(OUT_LAYOUTS)
        case.notes.append(f"out layout {lay}")
        return build_array(r, case.mem, init, rd, lay)
    if choice < 12:
        # out overlaps (or is) an input of the result dtype
        cands = [(n, a) for n, a in inputs if isinstance(a, np.ndarray) and a.dtype == rd
                 and a.dtype.isnative and case.mem.owner(a) is not None]
        if cands:
            name, a = cands[r.int(0, len(cands) - 1)]
            raw = case.mem.owner(a)
            if a.shape == shape and a.flags.writeable and r.bool():
                case.notes.append(f"out is {name}")
                return a
            item = rd.itemsize
            start = a.__array_interface__["data"][0] - raw.__array_interface__["data"][0]
            off = start + item * r.int(-2, 4)
            off -= off % item
            need = math.prod(shape) * item
            if off >= 0 and off + need <= raw.size:
                case.notes.append(f"out overlaps {name} (byte offset {off - start})")
                return np.ndarray(shape, rd, buffer=raw, offset=off)
        case.notes.append("out C (no overlap candidate)")
        return build_array(r, case.mem, init, rd, "C")
    which = r.int(0, 4)
    if which == 0:
        bad = shape[:-1] + (shape[-1] + 1,) if shape else (1,)
        case.fault("out wrong shape", ValueError, "out")
        return build_array(r, case.mem, np.full(bad, 7.0), rd, "C")
    if which == 1:
        dt = r.pick(tuple(d for d in FLOATS if d != rd) + (np.dtype(np.int32),))
        case.fault(f"out dtype {dt}", ValueError, "out")
        return build_array(r, case.mem, init, dt, "C")
    if which == 2:
        case.fault("out read-only", ValueError, "out")
        return build_array(r, case.mem, init, rd, "C", read_only=True)
    if which == 3:
        case.fault("out is a list", ValueError, "out")
        return init.tolist()
    case.maybe("out byte-swapped", ValueError, "out")
    return build_array(r, case.mem, init, rd, "be")


# ------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# ------------------------------------------------------------------------------------------

SCALES = (None, None, 1.0, 0.5, 0.25, 0.0, -0.5, 2.0, 0.125, -0.0, -1.0, 8.0, 2,
          np.float32(0.5), np.float16(0.25), fractions.Fraction(1, 3), INF, NAN, -INF, 1e-30)
SCALE_TYPE = ("1.0", True, 1j, [1.0], np.bool_(False))
FLAG_TYPE = (1, "yes", None, 0.0)
BAD_ALIGN = ("bottom-right", "TOP_LEFT", None, "", 1)


def sdpa_row_flags(q, k, v, mask, is_causal, scale, align, gqa, compute):
    """Per (batch..., L) row: (loose, skip_out).

    loose: the largest permitted score is a huge finite value (a -1e9-style mask shifts the
    whole row), so the compute dtype rounds the scores and only the NaN / inf pattern is
    checked. skip_out: a permitted key whose weight underflows to 0 in the compute dtype but
    not in float64 has an inf/NaN value; whether it is read is decided by that rounding."""
    with np.errstate(all="ignore"):
        q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
        k, v = CT.expand_kv_heads(q, k, v, gqa)
        batch = CT.sdpa_batch_shape(q, k, v)
        L, E = q.shape[-2:]
        S = k.shape[-2]
        q = np.broadcast_to(q, batch + q.shape[-2:])
        k = np.broadcast_to(k, batch + k.shape[-2:])
        v = np.broadcast_to(v, batch + v.shape[-2:])
        sc = (1.0 / math.sqrt(E) if E else 1.0) if scale is None else float(scale)
        s = sc * np.matmul(q, np.swapaxes(k, -1, -2)) if E else np.full(batch + (L, S), sc * 0.0)
        keep = np.ones((L, S), dtype=bool)
        if is_causal:
            off = 0 if align == "top_left" else S - L
            keep = np.arange(S)[None, :] <= np.arange(L)[:, None] + off
        keep = np.broadcast_to(keep, batch + (L, S))
        if mask is not None and mask.dtype == np.bool_:
            keep = keep & np.broadcast_to(mask, batch + (L, S))
        elif mask is not None:
            s = s + CT._mask_for_oracle(mask, compute).astype(np.float64)
        pf = keep & np.isfinite(s)
        sf = np.where(pf, s, -np.inf)
        rmax = sf.max(axis=-1) if S else np.full(batch + (L,), -np.inf)
        loose = np.isfinite(rmax) & (np.abs(rmax) > 1e4)
        thresh = 95.0 if compute != np.float64 else 740.0
        far = pf & ((rmax[..., None] - sf) > thresh)
        vbad = ~np.isfinite(v).all(axis=-1) if v.shape[-1] else np.zeros(batch + (S,), bool)
        skip = (far & vbad[..., None, :]).any(axis=-1) if S else np.zeros(batch + (L,), bool)
    return loose, skip


def build_sdpa(r, case):
    big = r.chance(1, 40)
    # plain: the everyday call (no mask, GQA or out; one float32/float64 dtype; equal batch
    # shapes; C-contiguous arrays; plain options), which cyattn may serve on a fast path
    plain = r.chance(1, 4)
    dts = [pick_float(r)] * 3
    if r.chance(1, 5):
        dts = [pick_float(r) for _ in range(3)]
    if plain:
        dts = [r.pick((np.dtype(np.float32), np.dtype(np.float64)))] * 3
        case.notes.append("plain call")
    gqa = r.chance(1, 4) and not plain
    outer = tuple(0 if r.chance(1, 16) else r.pick((1, 2, 3)) for _ in range(r.int(0, 2)))
    if gqa:
        hkv = r.pick((1, 2))
        hq = hkv * r.pick((1, 2, 3))
        kv_outer = reduce_shape(r, outer)
        qb, kb, vb = outer + (hq,), kv_outer + (hkv,), kv_outer + (hkv,)
    else:
        qfull = outer + ((r.pick((1, 2, 3)),) if r.bool() else ())
        kb, vb = reduce_shape(r, qfull), reduce_shape(r, qfull)
        qb = reduce_shape(r, qfull) if r.chance(1, 3) else qfull
        if plain:
            qb = kb = vb = qfull
    L = r.pick((1, 2, 3, 4, 5, 0, 8, 9, 65, 17, 64))
    S = r.pick((1, 2, 3, 4, 5, 0, 7, 9, 16, 25, 33, 48))
    E = r.pick((1, 2, 3, 4, 8, 0, 16, 17, 33))
    Ev = r.pick((1, 2, 3, 5, 0, 17, 24, 25))
    long = not big and r.chance(1, 8)
    if long:
        # the fused kernel's regimes: several 256-key blocks (online rescaling, block
        # skipping) and, with L <= 4 and S >= 1024, the decode path's 512-key chunks
        L = r.pick((1, 2, 3, 4, 5, 8, 65))
        S = r.pick((257, 300, 512, 513, 767, 1024, 1025, 1100, 1537, 2050))
        E, Ev = r.pick((1, 2, 3, 4, 8)), r.pick((1, 2, 3, 5, 8))
        if gqa:
            qb, kb, vb = (2,), (1,), (1,)
        else:
            qb = r.pick(((), (1,), (2,)))
            kb = vb = qb if plain or r.bool() else ()
        case.notes.append("long rows")
    if big:
        qb, kb, vb = ((2, 2),) * 3 if plain else ((2, 2), (2, 1), (2, 1))
        L, S, E, Ev = (130, 600, 16, 16) if r.bool() else (2, 4096, 16, 16)
        gqa = False
    batch = CT.sdpa_batch_shape(np.empty(qb + (1, 1)), np.empty(kb + (1, 1)),
                                np.empty(vb + (1, 1)), gqa)
    if long:
        while math.prod(batch) * L * S * (E + Ev + 1) > 40000:
            if L > 1:
                L //= 2
            elif E + Ev > 2:
                E, Ev = max(E // 2, 1), max(Ev // 2, 1)
            else:
                S = max(S // 2, 257)
    while not big and not long and math.prod(batch) * L * max(S, 1) * (E + Ev + 1) > 12000:
        L, S = max(L // 2, 1), max(S // 2, 1)
    rng = np.random.default_rng(int.from_bytes(r.take(4), "little"))
    if big or long:
        # too many values for the input bytes: a generator seeded by them, plus a few
        # specials at chosen positions
        q = rng.integers(-128, 128, qb + (L, E)) / 64
        k = rng.integers(-128, 128, kb + (S, E)) / 64
        v = rng.integers(-128, 128, vb + (S, Ev)) / 32
        for _ in range(0 if big else r.pick((0, 1, 2, 3))):
            arr = r.pick((q, k, v))
            if arr.size:
                arr.reshape(-1)[r.int(0, arr.size - 1)] = r.pick(VALUE_SPECIALS)
    else:
        specials = r.pick((0, 1, 0, 2))
        q = grid(r, qb + (L, E), 1 / 64, specials)
        k = grid(r, kb + (S, E), 1 / 64, specials)
        v = grid(r, vb + (S, Ev), 1 / 32, specials)
    if not big and r.chance(1, 8) and dts[2] in FLOATS:
        # huge finite values: a weighted sum of them must not overflow (non-negative, so
        # that no cancellation makes the reference comparison ill-conditioned)
        v = np.abs(v) * float(np.finfo(dts[2]).max / 8)
        case.notes.append("huge values")
    compute = CT.compute_dtype(*dts)

    mask_kind = r.pick(("none", "bool", "float", "bool"))
    if plain:
        mask_kind = "none"
    mask = mdt = None
    if mask_kind != "none":
        mshape = reduce_shape(r, batch + (L, S))
        if mask_kind == "bool":
            density = r.pick((0.5, 0.875, 0.125, 1.0))
            if long:
                mask = rng.random(mshape) < density
            else:
                mask = bits(r, mshape, density)
            mdt = np.dtype(np.bool_)
            if r.chance(1, 2) and mask.ndim >= 2 and mask.size:
                idx = tuple(r.int(0, s - 1) for s in mask.shape[:-1])
                mask[idx] = False            # a fully masked row
        else:
            mask, mdt = gen_float_mask(r, mshape, compute)
            if long or big:
                mask = np.where(mask == 0, rng.integers(-128, 128, mshape) / 32, mask)
            if big:     # the NumPy reference of big cases knows -inf and finite values only
                mask = np.where(np.isnan(mask) | (np.isinf(mask) & (mask > 0)), 0.0, mask)
                mask = np.where(np.abs(mask) > 1e4, -np.inf, mask)
        if (long or big) and mask.ndim and mask.shape[-1] > 1 and r.bool():
            # a run of removed keys: whole key blocks can be skipped
            start = r.int(0, mask.shape[-1] - 1)
            stop = start + r.pick((256, 512, 1, 100, S, 255, 257))
            mask[..., start:stop] = False if mask.dtype == np.bool_ else -np.inf
    is_causal = r.chance(1, 3)
    align = r.pick(("top_left", "bottom_right"))
    if is_causal or mask_kind == "bool":
        if r.chance(1, 2) and not big:
            # poison what no row may read: keys (k and v) and rows without any permitted key
            keep = np.ones((L, S), bool)
            if is_causal:
                off = 0 if align == "top_left" else S - L
                keep = np.arange(S)[None, :] <= np.arange(L)[:, None] + off
            full = np.broadcast_to(keep, batch + (L, S))
            if mask_kind == "bool":
                full = full & np.broadcast_to(mask, batch + (L, S))
            flat = full.reshape(math.prod(batch), L, S)
            unused = ~flat.any(axis=(0, 1))
            dead = ~flat.any(axis=(0, 2))
            k[..., unused, :] = r.pick((NAN, INF, -INF))
            v[..., unused, :] = r.pick((NAN, INF, -INF))
            q[..., dead, :] = r.pick((NAN, INF, -INF))
    scale = r.pick(SCALES)
    if big and scale is not None and not math.isfinite(float(scale)):
        scale = None
    return_lse = r.bool()

    # faults
    names = ["query", "key", "value"]
    arrays = [q, k, v]
    bad_flag = None
    if not big and not plain and r.chance(1, 6):
        which = r.int(0, 13)
        if which == 0:
            i = r.int(0, 2)
            dts[i] = r.pick(BAD_DTYPES)
            case.fault(f"{names[i]} dtype {dts[i]}", TypeError, names[i])
        elif which == 1:
            i = r.int(0, 2)
            arrays[i] = arrays[i].reshape(-1)[:3]
            case.fault(f"{names[i]} 1-D", ValueError, names[i])
        elif which == 2:
            arrays[1] = grid(r, kb + (S, E + 1), 1 / 64)
            case.fault("E mismatch", ValueError, "key", "query")
        elif which == 3:
            arrays[2] = grid(r, vb + (S + 1, Ev), 1 / 32)
            case.fault("S mismatch", ValueError, "value", "key")
        elif which == 4:
            arrays[0] = np.zeros((2, 1, L, E))
            arrays[1] = np.zeros((3, 1, S, E))
            case.fault("batch mismatch", ValueError, "query", "batch")
        elif which == 5:
            gqa = True
            hq, hk = r.pick(((3, 2), (2, 3), (4, 3), (1, 0)))
            hv = hk if r.bool() else hk + 1
            arrays = [np.zeros((hq, L, E)), np.zeros((hk, S, E)), np.zeros((hv, S, Ev))]
            case.fault("gqa heads", ValueError, "enable_gqa", "heads")
        elif which == 6:
            gqa = True
            arrays = [np.zeros(a.shape[-2:]) for a in arrays]
            case.fault("gqa without head dim", ValueError, "enable_gqa")
        elif which == 7:
            mask = np.zeros(batch + (L, S)) if mask is None else mask
            mdt = r.pick((np.dtype(np.int64), np.dtype(np.int8), np.dtype(np.complex128)))
            case.fault(f"attn_mask dtype {mdt}", TypeError, "attn_mask")
        elif which == 8:
            mask = np.ones((2,) + batch + (L, S), bool)
            mdt = np.dtype(np.bool_)
            case.fault("attn_mask enlarges", ValueError, "attn_mask")
        elif which == 9:
            scale = r.pick(SCALE_TYPE)
            case.fault(f"scale={scale!r}", TypeError, "scale")
        elif which == 10:
            scale = 10**400
            case.fault("scale=10**400", ValueError, "scale")
        elif which == 11:
            bad_flag = r.pick(("is_causal", "enable_gqa", "return_lse"))
            case.fault(f"{bad_flag} not bool", TypeError, bad_flag)
        elif which == 12:
            align = r.pick(BAD_ALIGN)
            case.fault(f"causal_alignment={align!r}", ValueError, "causal_alignment")
        else:
            mask = np.ones(batch + (L, S + 2), bool)      # never broadcasts (also S = 0)
            mdt = np.dtype(np.bool_)
            case.fault("attn_mask shape", ValueError, "attn_mask")
    q, k, v = arrays

    args = []
    for a, dt in zip(arrays, dts):
        lay, ro = pick_in_layout(r, allow_bcast=not big)
        if big:
            lay = "C" if lay == "list" else lay
        if plain:
            lay = "C"
        args.append(build_array(r, case.mem, a, dt, lay, ro, slack=r.pick((0, 64, 256))))
    mask_arg = None
    if mask is not None:
        ml, mro = pick_in_layout(r)
        mask_arg = build_mask(r, case.mem, mask, mdt, ml, mro)
    refs = [ref_copy(a) for a in args]
    mask_ref = ref_copy(mask_arg)
    try:
        result_dtype = np.result_type(*refs) if all(a.dtype in FLOATS for a in refs) else None
    except TypeError:
        result_dtype = None
    if result_dtype is not None:
        result_dtype = np.dtype(result_dtype)
    flags = {"is_causal": is_causal, "enable_gqa": gqa, "return_lse": return_lse}
    if bad_flag:
        flags[bad_flag] = r.pick(FLAG_TYPE)
    kwargs = {}
    pos = list(args)
    if r.chance(1, 3):          # attn_mask, is_causal, scale positionally
        pos += [mask_arg, flags["is_causal"], scale]
    else:                       # by keyword, defaults sometimes left out
        for name, val, default in (("attn_mask", mask_arg, None),
                                   ("is_causal", flags["is_causal"], False),
                                   ("scale", scale, None)):
            if val is not default or r.bool():
                kwargs[name] = val
    if is_causal or align != "top_left" or r.bool():
        kwargs["causal_alignment"] = align
    for name in ("enable_gqa", "return_lse"):
        if flags[name] is not False or r.bool():
            kwargs[name] = flags[name]
    out_shape = batch + (L, v.shape[-1] if v.ndim else 0)
    out = _NO_OUT if plain else make_out(r, case, out_shape, result_dtype,
                                         inputs=list(zip(names, args)) + [("attn_mask", mask_arg)],
                                         overlap=not big)
    if out is not _NO_OUT:
        kwargs["out"] = out
        case.out = out
    if plain:
        kwargs.pop("enable_gqa", None)
    if big:
        kwargs["n_threads"] = r.pick((2, -1))
    elif plain:
        nt = r.pick((None, 1, 2, 3, 64))
        if nt is not None:
            kwargs["n_threads"] = nt
    else:
        pick_threads(r, case, kwargs)
    case.fn = cyattn.scaled_dot_product_attention
    case.args = pos
    case.kwargs = kwargs
    ev = out_shape[-1]

    def verify(result):
        if return_lse:
            if not (isinstance(result, tuple) and len(result) == 2):
                fail(case, f"return_lse=True returned {type(result).__name__}")
            res, lse = result
        else:
            res, lse = result, None
        if case.out is not None and res is not case.out:
            fail(case, "with out=, the output is not out")
        for what, arr, shp in (("output", res, out_shape), ("lse", lse, out_shape[:-1])):
            if arr is None:
                continue
            if not isinstance(arr, np.ndarray) or arr.shape != shp or arr.dtype != result_dtype:
                fail(case, f"{what}: {type(arr).__name__} {getattr(arr, 'shape', None)} "
                           f"{getattr(arr, 'dtype', None)}; expected {shp} {result_dtype}")
            if case.out is None or what == "lse":
                check_no_alias(case, arr, list(zip(names, args)) + [("attn_mask", mask_arg)])
        sc = None if scale is None else float(scale)
        kk = E + S
        if big:
            ref_out, ref_lse = CT.numpy_sdpa(
                refs[0], refs[1], refs[2],
                None if mask_ref is None else (
                    mask_ref if mask_ref.dtype == np.bool_
                    else CT._mask_for_oracle(mask_ref, compute)),
                is_causal, sc, align, gqa)
            compare(case, "output", res, ref_out, result_dtype, kk)
            if lse is not None:
                compare(case, "lse", lse, ref_lse, result_dtype, kk)
            kw1 = dict(kwargs, n_threads=1)
            kw1.pop("out", None)
            one = case.fn(*pos, **kw1)
            one_out = one[0] if return_lse else one
            if not np.array_equal(np.asarray(one_out).view(np.uint8),
                                  np.ascontiguousarray(res).view(np.uint8)):
                fail(case, "output with n_threads=1 differs bitwise")
            return
        finite = (all(np.isfinite(x).all() for x in refs) and (sc is None or math.isfinite(sc))
                  and (mask_ref is None or mask_ref.dtype == np.bool_
                       or not (np.isnan(mask_ref).any() or np.isposinf(mask_ref).any())))
        if long and finite:
            # long rows without NaN/+inf: the NumPy float64 reference (the oracle's pure-Python
            # loops would dominate the run time); it knows -inf and finite masks
            ref_out, ref_lse = CT.numpy_sdpa(
                refs[0], refs[1], refs[2],
                None if mask_ref is None else (
                    mask_ref if mask_ref.dtype == np.bool_
                    else CT._mask_for_oracle(mask_ref, compute)),
                is_causal, sc, align, gqa)
        else:
            ref_out, ref_lse = CT.oracle_sdpa(refs[0], refs[1], refs[2], mask_ref, is_causal,
                                              sc, align, enable_gqa=gqa)
        loose, skip = sdpa_row_flags(refs[0], refs[1], refs[2], mask_ref, is_causal, sc, align,
                                     gqa, compute)
        compare(case, "output", res, ref_out, result_dtype, kk,
                skip=np.broadcast_to(skip[..., None], out_shape),
                loose=np.broadcast_to((loose & ~skip)[..., None], out_shape))
        if lse is not None:
            compare(case, "lse", lse, ref_lse, result_dtype, kk, loose=loose)
        dead = np.isneginf(ref_lse) & ~skip
        if ev and not np.all(np.asarray(res)[dead] == 0):
            fail(case, "a fully masked row is not exactly 0")
        if lse is not None and not np.all(np.isneginf(lse[dead])):
            fail(case, "a fully masked row has lse != -inf")

    case.verify = verify
    return case


# ------------------------------------------------------------------------------------------
# matmul_accumulate
# ------------------------------------------------------------------------------------------

MM_DIMS = (1, 2, 3, 4, 5, 0, 8, 13, 17, 33, 24, 25, 48)
ALPHAS = (1.0, -0.5, 0.0, 3.0, 1e-3, -0.0, 2, np.float32(0.5), fractions.Fraction(1, 4),
          INF, NAN, -INF, np.float16(2.0))
ALPHA_TYPE = ("1", None, True, 1j, [1.0])


def build_matmul(r, case):
    big = r.chance(1, 40)
    # plain: 2-D C-contiguous float32/float64 operands of one dtype, a fresh C out, a float
    # alpha: the everyday call, which cyattn may serve on a fast path
    plain = r.chance(1, 4)
    dta = pick_float(r)
    dtb = dta if not r.chance(1, 4) else pick_float(r)
    ob = tuple(0 if r.chance(1, 16) else r.pick((1, 2, 3)) for _ in range(r.int(0, 2)))
    ab, bb = reduce_shape(r, ob), reduce_shape(r, ob)
    if r.chance(1, 6):
        ob = (2,) + ob              # out may have more batch dims than a and b
    M, N, K = r.pick(MM_DIMS), r.pick(MM_DIMS), r.pick(MM_DIMS)
    if plain:
        dta = dtb = r.pick((np.dtype(np.float32), np.dtype(np.float64)))
        ab = bb = ob = ()
        case.notes.append("plain call")
    if big:
        ab, bb, ob = ((), (), ()) if plain else ((2,), (), (2,))
        M, N, K = 150, 72, 300          # > MC = 144 rows, > KC = 256 deep
    while not big and math.prod(ob) * M * N * max(K, 1) > 12000:
        M, N, K = max(M // 2, 1), max(N // 2, 1), max(K // 2, 1)
    specials = 0 if big else r.pick((0, 1, 0, 2))
    unit = r.pick((1, 1, 64)) / 32          # 64: results beyond float16's range
    a = grid(r, ab + (M, K), unit, specials)
    b = grid(r, bb + (K, N), unit, specials)
    out0 = grid(r, ob + (M, N), unit, specials)
    alpha = r.pick(ALPHAS) if not big else r.pick((1.0, -0.5, 0.25))
    alpha_default = alpha == 1.0 and r.bool()
    out_dt = "result"

    arrays = [a, b]
    dts = [dta, dtb]
    out_fault = None
    if not big and not plain and r.chance(1, 6):
        which = r.int(0, 10)
        if which == 0:
            i = r.int(0, 1)
            dts[i] = r.pick(BAD_DTYPES)
            case.fault(f"{'ab'[i]} dtype {dts[i]}", TypeError, "ab"[i])
        elif which == 1:
            out_dt = r.pick((np.dtype(np.int32), np.dtype(np.bool_), np.dtype(np.complex64)))
            case.fault(f"out dtype {out_dt}", TypeError, "out")
        elif which == 2:
            out_dt = "other float"
            case.fault("out dtype another float", ValueError, "out")
        elif which == 3:
            out0 = np.zeros(ob + (M, N + 1))
            case.fault("out shape", ValueError, "out")
        elif which == 4:
            out_fault = r.pick(("ro", "list"))
            case.fault(f"out {out_fault}", ValueError, "out")
        elif which == 5:
            i = r.int(0, 1)
            arrays[i] = arrays[i].reshape(-1)[:2]
            case.fault(f"{'ab'[i]} 1-D", ValueError, "ab"[i])
        elif which == 6:
            arrays[1] = grid(r, bb + (K + 1, N), 1 / 32)
            case.fault("K mismatch", ValueError, "a", "b")
        elif which == 7:
            arrays = [np.zeros((2, 1, M, K)), np.zeros((3, 1, K, N))]
            case.fault("batch mismatch", ValueError, "out", "batch")
        elif which == 8:
            alpha_default = False
            alpha = r.pick(ALPHA_TYPE)
            case.fault(f"alpha={alpha!r}", TypeError, "alpha")
        elif which == 9:
            alpha_default = False
            alpha = 10**400
            case.fault("alpha=10**400", ValueError, "alpha")
        else:
            # a has batch (3,), out has none or (2,): the product does not fit out
            arrays = [np.zeros((3, M, K)), np.zeros((K, N))]
            out0 = np.zeros(r.pick(((), (2,))) + (M, N))
            case.fault("out batch cannot hold a @ b", ValueError, "out")
    a, b = arrays

    args = []
    for arr, dt in zip(arrays, dts):
        lay, ro = pick_in_layout(r, allow_bcast=not big)
        lay = "C" if plain else lay
        args.append(build_array(r, case.mem, arr, dt, lay, ro, slack=r.pick((0, 64, 512))))
    eff = [ref_copy(x).dtype for x in args]
    result = np.result_type(*eff) if all(d in FLOATS for d in eff) else np.dtype(np.float64)
    if out_dt == "result":
        out_dt = np.dtype(result)
    elif out_dt == "other float":
        out_dt = r.pick(tuple(d for d in FLOATS if d != result))
    out_mode = r.int(0, 9)
    out = None
    if out_fault == "ro":
        out = build_array(r, case.mem, out0, out_dt, "C", read_only=True)
    elif out_fault == "list":
        out = out0.tolist()
    elif out_mode >= 7 and not case.faults and not plain and not big:
        cands = [(n, x) for n, x in zip("ab", args) if isinstance(x, np.ndarray)
                 and x.dtype == out_dt and case.mem.owner(x) is not None]
        if cands:
            name, x = cands[r.int(0, len(cands) - 1)]
            raw = case.mem.owner(x)
            shape = ob + (M, N)
            item = out_dt.itemsize
            if x.shape == shape and x.flags.writeable and r.bool():
                out = x
                case.notes.append(f"out is {name}")
            else:
                start = x.__array_interface__["data"][0] - raw.__array_interface__["data"][0]
                off = start + item * r.int(-3, 5)
                off -= off % item
                if off >= 0 and off + math.prod(shape) * item <= raw.size:
                    out = np.ndarray(shape, out_dt, buffer=raw, offset=off)
                    case.notes.append(f"out overlaps {name} (byte offset {off - start})")
    if out is None:
        lay = r.pick(OUT_LAYOUTS) if r.chance(1, 2) and not plain and not big else "C"
        case.notes.append(f"out layout {lay}")
        out = build_array(r, case.mem, out0, out_dt, lay)
    refs = [ref_copy(x) for x in args]
    out_ref = ref_copy(out)
    kwargs = {}
    if not alpha_default:
        kwargs["alpha"] = alpha
    if big:
        kwargs["n_threads"] = r.pick((2, -1))
    elif plain:
        nt = r.pick((None, 1, 2, 3, 64))
        if nt is not None:
            kwargs["n_threads"] = nt
    else:
        pick_threads(r, case, kwargs)
    case.fn = cyattn.matmul_accumulate
    case.args = [args[0], args[1], out]
    case.kwargs = kwargs
    case.out = out

    def verify(result):
        if result is not out:
            fail(case, "matmul_accumulate did not return out")
        al = float(alpha)
        finite = all(np.isfinite(x).all() for x in (refs[0], refs[1], out_ref))
        work = out_ref.size * max(refs[0].shape[-1], 1)
        with np.errstate(all="ignore"):
            if (finite and math.isfinite(al)) or work > 20000:
                ref = CT.numpy_matmul(refs[0], refs[1], out_ref, al)
            else:
                ref = CT.oracle_matmul(refs[0], refs[1], out_ref.astype(np.float64), al)
        compare(case, "out", out, ref, out.dtype, k=refs[0].shape[-1])
        if big:
            again = np.array(out_ref, copy=True)       # out is C-contiguous in big cases
            case.fn(args[0], args[1], again, alpha=alpha, n_threads=1)
            if not np.array_equal(again.view(np.uint8),
                                  np.ascontiguousarray(out).view(np.uint8)):
                fail(case, "out with n_threads=1 differs bitwise")

    case.verify = verify
    return case


# ------------------------------------------------------------------------------------------
# multi_head_attention
# ------------------------------------------------------------------------------------------

MHA_FLAGS = ("need_weights", "average_attn_weights", "is_causal", "batch_first")


def _mha_via_class(E, H, kdim, vdim, bias, batch_first, dtype, pargs):
    def call(query, key, value, **kwargs):
        module = cyattn.MultiHeadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim,
                                           batch_first=batch_first, dtype=dtype, seed=0)
        state = {}
        if kdim == E and vdim == E:
            state["in_proj_weight"] = pargs.get("in_proj_weight")
            if state["in_proj_weight"] is None:
                state["in_proj_weight"] = np.concatenate(
                    [np.asarray(pargs[n]) for n in ("q_proj_weight", "k_proj_weight",
                                                   "v_proj_weight")])
        else:
            for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                state[n] = pargs[n]
        state["out_proj.weight"] = pargs["out_proj_weight"]
        if bias:
            state["in_proj_bias"] = pargs["in_proj_bias"]
            state["out_proj.bias"] = pargs["out_proj_bias"]
        module.load_state_dict(state)
        return module(query, key, value, **kwargs)
    call.__name__ = "MultiHeadAttention.forward"
    return call


def gen_mha_mask(r, shape):
    kind = r.pick(("none", "bool", "float", "bool"))
    if kind == "none":
        return None, None
    if kind == "bool":
        return bits(r, shape, r.pick((0.5, 0.125, 0.875, 0.0))), np.dtype(np.bool_)
    mdt = r.pick((np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)))
    return grid(r, shape, 1 / 64, r.pick((1, 2, 0)), (-INF, -INF, NAN, INF)), mdt


def build_mha(r, case):
    batched = not r.chance(1, 4)
    N = r.pick((1, 2, 3))
    L = r.pick((1, 2, 3, 0, 4, 5))
    S = r.pick((1, 2, 3, 0, 4))
    H = r.pick((1, 2, 4))
    E = H * r.pick((1, 2))
    separate = r.chance(1, 3)
    kdim = r.pick((E, 1, 2, 3)) if separate else E
    vdim = r.pick((E, 1, 3)) if separate else E
    flags = {"need_weights": r.bool(), "average_attn_weights": r.bool(),
             "is_causal": r.chance(1, 3), "batch_first": r.bool()}
    dt = pick_float(r)
    pdt = dt if not r.chance(1, 5) else pick_float(r)
    specials = r.pick((0, 1, 0, 2))
    q = grid(r, (N, L, E), 1 / 64, specials)
    k = grid(r, (N, S, kdim), 1 / 64, specials)
    v = grid(r, (N, S, vdim), 1 / 64, specials)
    params = {}
    if separate:
        params["q_proj_weight"] = grid(r, (E, E), 1 / 1024)
        params["k_proj_weight"] = grid(r, (E, kdim), 1 / 1024)
        params["v_proj_weight"] = grid(r, (E, vdim), 1 / 1024)
    else:
        params["in_proj_weight"] = grid(r, (3 * E, E), 1 / 1024)
    if r.bool():
        params["in_proj_bias"] = grid(r, (3 * E,), 1 / 1024)
    params["out_proj_weight"] = grid(r, (E, E), 1 / 1024)
    if r.bool():
        params["out_proj_bias"] = grid(r, (E,), 1 / 1024)
    kpm, kpm_dt = gen_mha_mask(r, (N, S))
    am3 = r.chance(1, 3)
    am, am_dt = gen_mha_mask(r, (N * H, L, S) if am3 else (L, S))
    if kpm is not None and kpm_dt == np.bool_ and r.chance(1, 2):
        # poison the ignored keys' inputs: they must not leak
        k = np.where(kpm[:, :, None], r.pick((NAN, INF, -INF)), k)
        v = np.where(kpm[:, :, None], r.pick((NAN, INF, -INF)), v)
    num_heads = H
    key_ndim_fault = False

    query_4d = False
    if r.chance(1, 6):
        which = r.int(0, 15)
        if which == 0:
            num_heads = r.pick((float(H), True, "2", None))
            case.fault(f"num_heads={num_heads!r}", TypeError, "num_heads")
        elif which == 1:
            num_heads = r.pick((0, -1, E + 1 if E > 1 else 0))
            case.fault(f"num_heads={num_heads}", ValueError, "num_heads")
        elif which == 2:
            dt = r.pick(BAD_DTYPES)
            case.fault(f"query dtype {dt}", TypeError, "query")
        elif which == 3:
            kpm, kpm_dt = np.zeros((N, S + 1), bool), np.dtype(np.bool_)
            case.fault("key_padding_mask shape", ValueError, "key_padding_mask")
        elif which == 4:
            am, am_dt = np.zeros((L + 1, S), bool), np.dtype(np.bool_)
            case.fault("attn_mask shape", ValueError, "attn_mask")
        elif which == 5:
            kpm, kpm_dt = np.zeros((N, S)), r.pick((np.dtype(np.int64), np.dtype(np.uint8)))
            case.fault(f"key_padding_mask dtype {kpm_dt}", TypeError, "key_padding_mask")
        elif which == 6:
            key_ndim_fault = True
            case.fault("key ndim", ValueError, "key")
        elif which == 7:
            name = "k_proj_weight" if separate else "in_proj_weight"
            w = params[name]
            params[name] = np.zeros((w.shape[0] + 1, w.shape[1]))
            case.fault(f"{name} shape", ValueError, name)
        elif which == 8:
            f = r.pick(MHA_FLAGS)
            flags[f] = r.pick(FLAG_TYPE)
            case.fault(f"{f} not bool", TypeError, f)
        elif which == 9:
            if separate:
                params["in_proj_weight"] = np.zeros((3 * E, E))
            else:
                params["q_proj_weight"] = np.zeros((E, E))
            case.fault("both weight forms", ValueError, "in_proj_weight")
        elif which == 10:
            params["out_proj_weight"] = r.pick((np.zeros((E, E + 1)), np.zeros(E), None))
            case.fault("out_proj_weight not (E, E)", ValueError, "out_proj_weight")
        elif which == 11:
            query_4d = True
            case.fault("query 4-D", ValueError, "query")
        elif which == 12:
            q = grid(r, (N, L, E + 1), 1 / 64)
            case.fault("query E mismatch", ValueError, "query")
        elif which == 13:
            v = grid(r, (N, S + 1, vdim), 1 / 64)
            case.fault("value S mismatch", ValueError, "value")
        elif which == 14:
            name = r.pick(("q_proj_weight", "k_proj_weight", "v_proj_weight"))
            if separate:
                del params[name]
                case.fault(f"{name} missing", ValueError, name)
            else:
                params["in_proj_bias"] = np.zeros(3 * E + 1)
                case.fault("in_proj_bias shape", ValueError, "in_proj_bias")
        else:
            if r.bool():
                q = q.astype(np.float64).tolist() if q.size else q
                case.notes.append("ragged query")
                query_4d = "ragged"
            else:
                params["out_proj_bias"] = np.zeros(E + 2)
                case.fault("out_proj_bias shape", ValueError, "out_proj_bias")
            if query_4d == "ragged":
                case.fault("ragged query", TypeError, "query")

    bf = flags["batch_first"] if isinstance(flags["batch_first"], bool) else True

    def layout_input(x):
        if not batched:
            return x[0] if x.ndim == 3 else x
        return x if bf else np.swapaxes(x, 0, 1)

    if query_4d == "ragged":
        q = np.zeros((N, L, E))
    inputs = {"query": layout_input(q), "key": layout_input(k), "value": layout_input(v)}
    if key_ndim_fault:
        inputs["key"] = k[0] if batched else k      # 2-D with 3-D query, or the reverse
    if query_4d is True:
        x = inputs["query"]
        inputs["query"] = x.reshape((1,) * (4 - x.ndim) + x.shape)
    args = {}
    for name, x in inputs.items():
        lay, ro = pick_in_layout(r)
        args[name] = build_array(r, case.mem, x, dt if name == "query" else
                                 (dt if dt in FLOATS else np.dtype(np.float64)), lay, ro)
    if query_4d == "ragged":
        args["query"] = RAGGED
    pargs = {}
    for name, x in params.items():
        lay, ro = pick_in_layout(r)
        pargs[name] = None if x is None else build_array(r, case.mem, x, pdt, lay, ro)
    margs = {}
    for name, m, mdt in (("key_padding_mask", kpm, kpm_dt), ("attn_mask", am, am_dt)):
        if m is None:
            continue
        if name == "key_padding_mask" and not batched and m.ndim == 2:
            m = m[0]
        if name == "attn_mask" and not batched and m.ndim == 3 and m.shape[0] == N * H:
            m = m[:H]
        lay, ro = pick_in_layout(r)
        margs[name] = build_mask(r, case.mem, m, mdt, lay, ro)
    kwargs = {"num_heads": num_heads}
    kwargs.update(pargs)
    kwargs.update(margs)
    for f, val in flags.items():
        if val is not (f in ("need_weights", "average_attn_weights")) or r.bool():
            kwargs[f] = val
    case.fn = cyattn.multi_head_attention
    case.args = [args["query"], args["key"], args["value"]]
    case.kwargs = kwargs
    refs = {n: ref_copy(a) for n, a in {**args, **pargs, **margs}.items()}
    has_bias = ("in_proj_bias" in params) + ("out_proj_bias" in params)
    via_class = not case.faults and has_bias != 1 and r.chance(1, 3)
    if via_class:
        # the same call through MultiHeadAttention(...).load_state_dict(...)(...): parameters
        # are cast to the module dtype pdt
        case.notes.append(f"via MultiHeadAttention(dtype={pdt})")
        refs.update({n: np.asarray(refs[n], dtype=pdt) for n in pargs})
        case.fn = _mha_via_class(E, H, kdim, vdim, bool(has_bias), flags["batch_first"], pdt,
                                 pargs)
        case.kwargs = {n: v for n, v in kwargs.items() if n in margs or n in MHA_FLAGS
                       and n != "batch_first"}

    def verify(result):
        if not (isinstance(result, tuple) and len(result) == 2):
            fail(case, f"returned {type(result).__name__}, expected (output, weights)")
        out, w = result
        floats = [refs[n] for n in ("query", "key", "value") + tuple(pargs)]
        rdt = np.dtype(np.result_type(*floats))
        compute = CT.compute_dtype(*[f.dtype for f in floats])
        qn, kn, vn = refs["query"], refs["key"], refs["value"]
        if batched and not bf:
            qn, kn, vn = (np.swapaxes(x, 0, 1) for x in (qn, kn, vn))
        if not batched:
            qn, kn, vn = qn[None], kn[None], vn[None]
        plist = {n: refs[n].astype(np.float64).tolist() for n in pargs}
        kp, amr = refs.get("key_padding_mask"), refs.get("attn_mask")

        def olist(m):
            if m is None:
                return None
            if m.dtype == np.bool_:
                return m.tolist()
            return CT._mask_for_oracle(m, compute).astype(np.float64).tolist()

        outs, ws = [], []
        for n in range(N):
            kp_n = None if kp is None else (kp[n] if batched else kp)
            am_n = amr
            if amr is not None and amr.ndim == 3 and batched:
                am_n = amr[n * H:(n + 1) * H]
            o, wt = oracle.multi_head_attention(
                qn[n].astype(np.float64).tolist(), kn[n].astype(np.float64).tolist(),
                vn[n].astype(np.float64).tolist(), num_heads=H, **plist,
                key_padding_mask=olist(kp_n), attn_mask=olist(am_n),
                need_weights=flags["need_weights"],
                average_attn_weights=flags["average_attn_weights"],
                is_causal=flags["is_causal"])
            outs.append(np.array(o, dtype=np.float64).reshape(L, E))
            if flags["need_weights"]:
                wshape = (L, S) if flags["average_attn_weights"] else (H, L, S)
                ws.append(np.array(wt, dtype=np.float64).reshape(wshape))
            if not batched:
                break
        ref_out = np.stack(outs)
        if not batched:
            ref_out = ref_out[0]
        elif not bf:
            ref_out = np.swapaxes(ref_out, 0, 1)
        if not isinstance(out, np.ndarray) or out.dtype != rdt or out.shape != ref_out.shape:
            fail(case, f"output {getattr(out, 'shape', None)} {getattr(out, 'dtype', None)}; "
                       f"expected {ref_out.shape} {rdt}")
        kk = 3 * E + S + max(kdim, vdim)
        compare(case, "output", out, ref_out, rdt, kk)
        if not flags["need_weights"]:
            if w is not None:
                fail(case, "need_weights=False but weights were returned")
            return
        ref_w = np.stack(ws) if batched else ws[0]
        if not isinstance(w, np.ndarray) or w.dtype != rdt or w.shape != ref_w.shape:
            fail(case, f"weights {getattr(w, 'shape', None)} {getattr(w, 'dtype', None)}; "
                       f"expected {ref_w.shape} {rdt}")
        compare(case, "weights", w, ref_w, rdt, kk)

    case.verify = verify
    return case


# ------------------------------------------------------------------------------------------
# The harness
# ------------------------------------------------------------------------------------------

FUNCTIONS = ("scaled_dot_product_attention", "softmax", "matmul_accumulate",
             "multi_head_attention", "log_softmax", "scaled_dot_product_attention")


def _checks_variants():
    """fuzz/checks_variants.py, loaded by path (this module itself may be loaded that way)."""
    name = "_cyattn_fuzz_checks_variants"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _ROOT / "fuzz" / "checks_variants.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def build_case(data):
    r = ByteReader(data)
    fname = r.pick(FUNCTIONS)
    variant = VARIANTS[r.int(0, len(VARIANTS) - 1)]
    case = Case(fname)
    case.notes.append(variant)
    case.variant = variant
    if fname in ("softmax", "log_softmax"):
        build_softmax(r, case, fname == "log_softmax")
    elif fname == "matmul_accumulate":
        build_matmul(r, case)
    elif fname == "scaled_dot_product_attention":
        variants = _checks_variants()
        if variants.selected(r):    # issue 24's arguments: fuzz/checks_variants.py
            variants.build(r, case, sys.modules[__name__])
        else:
            build_sdpa(r, case)
    else:
        build_mha(r, case)
    return case


def describe(data):
    """A readable summary of the call ``data`` decodes to."""
    return build_case(data).describe()


def _names_ok(exc, names):
    msg = str(exc)
    return any(n in msg for n in names)


def check_one(data):
    """Decode ``data`` into one cyattn call, run it and check the contract (see the module
    docstring). Returns "ok:<fname>" or "raised:<fname>:<ExcType>"; raises FuzzFailure."""
    case = build_case(data)
    before = case.mem.snapshot()
    saved = _backend.kernels
    _backend.kernels = _backend.load_variant(case.variant)
    err = None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                result = case.fn(*case.args, **case.kwargs)
            except (TypeError, ValueError) as exc:
                err = exc
            except Exception as exc:    # noqa: BLE001 - any other type breaks the contract
                fail(case, f"raised {type(exc).__name__}: {exc}")
        if err is not None:
            allowed = dict(case.must)
            for t, n in case.may.items():
                allowed.setdefault(t, []).extend(n)
            if not allowed:
                fail(case, f"a valid call raised {type(err).__name__}: {err}")
            names = [n for t, ns in allowed.items() if isinstance(err, t) for n in ns]
            if not names:
                fail(case, f"raised {type(err).__name__} ({err}); expected "
                           f"{sorted(t.__name__ for t in allowed)}")
            if not _names_ok(err, names):
                fail(case, f"the message does not name any of {names}: {err}")
            for raw, old in zip(case.mem.raws, before):
                if not np.array_equal(raw, old):
                    fail(case, f"{type(err).__name__} raised, but a buffer changed "
                               f"(input or out): {err}")
            return f"raised:{case.fname}:{type(err).__name__}"
        if case.must:
            fail(case, f"expected {sorted(t.__name__ for t in case.must)}, but the call "
                       f"succeeded")
        out = case.out if isinstance(case.out, np.ndarray) else None
        for raw, old in zip(case.mem.raws, before):
            if out is not None and case.mem.owner(out) is raw:
                region = covered(raw, out)
                if not np.array_equal(raw[~region], old[~region]):
                    fail(case, "bytes outside out (an input or a gap of out) changed")
            elif not np.array_equal(raw, old):
                fail(case, "an input buffer changed")
        if caught and not (case.fname == "multi_head_attention" and "mha-mask-warning" in AVOID
                           and all(isinstance(m, np.ndarray) and m.dtype.kind == "f"
                                   for m in (case.kwargs.get("key_padding_mask"),
                                             case.kwargs.get("attn_mask")))):
            fail(case, f"warning: {caught[0].category.__name__}: {caught[0].message}")
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")       # the references' own NaN arithmetic
            case.verify(result)
        return f"ok:{case.fname}"
    finally:
        _backend.kernels = saved


def _main(argv):
    """python fuzz/api_checks.py FILE...: describe and check each input file."""
    status = 0
    for path in argv:
        data = pathlib.Path(path).read_bytes()
        print(f"== {path} ({len(data)} bytes)")
        print(describe(data))
        try:
            print("->", check_one(data))
        except FuzzFailure as exc:
            status = 1
            print("-> FAILED:", exc)
    return status


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
