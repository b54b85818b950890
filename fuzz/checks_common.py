"""What the fuzz harness's function families share (see fuzz/api_checks.py, which combines them).

The byte decoder (:class:`ByteReader`), grid values with NaN/inf sprinkled in, the raw buffers
every array is a view of and the memory layouts built on them, the :class:`Case` that records a
decoded call with its deliberate faults, the comparison with a reference, the ``out=`` builder
of softmax and attention, and their float masks. Reference helpers and tolerances come from
``tests/conftest.py`` (``CT``).
"""
import importlib.util
import math
import os
import pathlib
import sys

import numpy as np

from cyattn import _backend

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


def pick_threads(r, case, kwargs, big=False, plain=False):
    """Set ``kwargs["n_threads"]`` (or leave it out): 2 or -1 in a big case (several threads
    must run); a valid count or none in a plain one (the fast paths); elsewhere any valid
    value, or now and then a deliberate fault (0 or a wrong type)."""
    if big:
        kwargs["n_threads"] = r.pick((2, -1))
        return
    if plain:
        nt = r.pick((None, 1, 2, 3, 64))
        if nt is not None:
            kwargs["n_threads"] = nt
        return
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


FLAG_TYPE = (1, "yes", None, 0.0)   # not bool: a TypeError for a bool flag


def pick_bad_dtype(r, case, name):
    """A dtype the function must refuse for its argument ``name``, recorded as a fault (a
    TypeError naming the argument)."""
    dt = r.pick(BAD_DTYPES)
    case.fault(f"{name} dtype {dt}", TypeError, name)
    return dt


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
# Float masks for softmax and attention
# ------------------------------------------------------------------------------------------

MASK_SPECIALS = (-INF, -INF, -INF, NAN, INF, -1e9, "min", -1e30)


def gen_float_mask(r, shape, default_dtype):
    mdt = r.pick((default_dtype, np.dtype(np.float64), np.dtype(np.float32),
                  np.dtype(np.float16)))
    specials = r.pick((1, 2, 0))
    sv = [(-np.finfo(mdt).max if s == "min" else s) for s in MASK_SPECIALS]
    if not r.chance(1, 3):
        sv = [s for s in sv if s in (-INF, NAN) or (isinstance(s, float) and math.isinf(s))]
    return grid(r, shape, 1 / 32, specials, tuple(sv)), mdt
