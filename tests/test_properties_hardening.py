"""Hardening property tests (hypothesis) over every public function: softmax, log_softmax,
matmul_accumulate, scaled_dot_product_attention, multi_head_attention and MultiHeadAttention.

Complements ``test_properties.py`` (which covers the basic shape/mask/layout space) with:

* random shapes with 0 and 1 everywhere (L, S, E, Ev, M, N, K, batch = 0), batch dims that
  broadcast (different numbers of batch dims, size-1 dims, zero-stride ``broadcast_to`` views);
* input layouts beyond ``conftest.LAYOUTS``: permuted axes, negative steps > 1, byte-swapped,
  misaligned *and* transposed, read-only reversed views;
* ``out=`` in every layout (Fortran, transposed, reversed, stepped, negative steps, misaligned)
  inside a sentinel byte buffer (no byte outside ``out``'s elements may change), and ``out``
  aliasing an input (the input itself, a reversed view of it, or a float mask);
* mixed dtypes (``np.result_type``) and float masks of a different dtype than the data
  (saturation of finite values beyond the compute dtype's range);
* bool and float masks with fully masked rows, ``-inf``, NaN and huge finite values; NaN and
  +-inf sprinkled into the data (permitted positions: the row is NaN; masked positions: never
  leak, checked bit for bit against an unpoisoned call);
* causal with both alignments composed with masks, GQA (also MQA and 0 query heads),
  ``return_lse``, ``n_threads`` (bit-identical results for 1 and 2 threads, and for any layout
  vs a C-contiguous call);
* multi_head_attention / MultiHeadAttention against a NumPy float64 reference of the MHA math
  (always) and torch.nn.MultiheadAttention (when torch is importable);
* no warnings and no floating-point exceptions from any call (DESIGN 3.3, 3.9).

Small problems are compared with ``cyattn.oracle`` (via conftest), larger ones with NumPy
float64 references, always with the tolerances of ``conftest.TOLERANCES`` (via ``assert_close``
/ ``tol``). The kernel variant is drawn per example (both compiled variants are exercised
without doubling the example count). Examples are derandomized so CI is stable; array values
come from a NumPy generator seeded by a drawn integer (cheaper than drawing every element).
"""
import contextlib
import math
import warnings

import numpy as np
import pytest
from conftest import (
    LAYOUTS,
    _mask_for_oracle,
    assert_close,
    call_checked,
    compute_dtype,
    grid_values,
    mha_params,
    misaligned,
    numpy_matmul,
    numpy_sdpa,
    oracle_matmul,
    oracle_sdpa,
    oracle_softmax,
    with_layout,
)
from conftest import no_warnings as _no_warnings
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import cyattn
from cyattn import _backend

VARIANTS = tuple(_backend.available_variants())
FLOATS = (np.float16, np.float32, np.float64)
DTYPE = st.sampled_from(FLOATS)
SEED = st.integers(0, 2**32 - 1)
NAN, INF = float("nan"), float("inf")


def hsettings(n):
    return settings(deadline=None, max_examples=n, derandomize=True, print_blob=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


# ------------------------------------------------------------------------------------------
# helpers: variant, warnings, layouts, out buffers, specials
# ------------------------------------------------------------------------------------------

@contextlib.contextmanager
def use_variant(name):
    """Run the block on kernel variant ``name`` (what conftest's ``variant`` fixture does)."""
    saved = _backend.kernels
    _backend.kernels = _backend.load_variant(name)
    try:
        yield
    finally:
        _backend.kernels = saved


def no_warnings():
    """conftest's ``no_warnings`` letting underflow pass (NumPy ignores it by default: rounding
    a float32 result to float16 underflows for tiny weights, and that is the right answer).
    The calls inside the tests stay ``no_warnings()``: hypothesis derives its derandomized
    seed from a test's source, so a changed call would change the examples drawn."""
    return _no_warnings(underflow="ignore")


def run(variant, fn, *args, **kwargs):
    """``call_checked(fn, ...)`` on ``variant`` without warnings (inputs must stay bit-equal)."""
    with use_variant(variant), no_warnings():
        return call_checked(fn, *args, **kwargs)


# Input layouts: conftest's plus these (all hold the same values as the source array).
EXTRA_LAYOUTS = ("permuted", "neg_step3", "byteswapped", "misaligned_transposed",
                 "read_only_reversed")
IN_LAYOUTS = LAYOUTS + EXTRA_LAYOUTS
WRITABLE_LAYOUTS = tuple(n for n in IN_LAYOUTS if n not in ("read_only", "read_only_reversed",
                                                             "byteswapped"))
MASK_LAYOUTS = IN_LAYOUTS


def layout(arr, name):
    """A new array with ``arr``'s values in the memory layout ``name`` (C order where it does
    not apply). Never ``arr`` itself, so a call writing into it cannot change ``arr``."""
    arr = np.array(arr)
    if name in LAYOUTS:
        return with_layout(arr, name)
    if arr.ndim == 0:
        return np.array(arr)
    if name == "permuted":            # memory order: axes rotated by one
        perm = tuple(range(1, arr.ndim)) + (0,)
        res = np.ascontiguousarray(arr.transpose(perm)).transpose(np.argsort(perm))
    elif name == "neg_step3":          # every third element of a bigger buffer, backwards
        big = np.full(tuple(3 * s + 2 for s in arr.shape), 77, dtype=arr.dtype)
        sl = tuple(slice(3 * s, 0, -3) if s else slice(0, 0) for s in arr.shape)
        res = big[sl]
        res[...] = arr
    elif name == "byteswapped":
        if arr.dtype == np.bool_:
            return np.array(arr)
        res = arr.astype(arr.dtype.newbyteorder())
    elif name == "misaligned_transposed":
        res = (np.swapaxes(misaligned(np.swapaxes(arr, -1, -2)), -1, -2) if arr.ndim >= 2
               else misaligned(arr))
    elif name == "read_only_reversed":
        rev = np.ascontiguousarray(arr[(slice(None, None, -1),) * arr.ndim])
        res = rev[(slice(None, None, -1),) * arr.ndim]
        res.flags.writeable = False
    else:
        raise AssertionError(name)
    assert res.shape == arr.shape and np.array_equal(res, arr, equal_nan=arr.dtype != np.bool_)
    return res


OUT_KINDS = ("c", "fortran", "transposed", "reversed", "step2", "neg_step3", "misaligned",
             "misaligned_fortran", "permuted")


class OutBuffer:
    """An ``out`` array of ``shape`` and ``dtype`` in memory layout ``kind``, a view into a
    byte buffer filled with a sentinel: :meth:`check_outside` asserts that no byte outside
    ``out``'s elements changed."""

    SENTINEL = 0xA5

    def __init__(self, shape, dtype, kind):
        shape, dtype = tuple(shape), np.dtype(dtype)
        nd, item = len(shape), dtype.itemsize
        step = {"step2": 2, "neg_step3": 3}.get(kind, 1)
        order = list(range(nd))                   # axes from slowest to fastest in memory
        if kind in ("fortran", "misaligned_fortran"):
            order = order[::-1]
        elif kind == "transposed" and nd >= 2:
            order[-2], order[-1] = order[-1], order[-2]
        elif kind == "permuted" and nd >= 2:
            order = order[1:] + order[:1]
        strides = [0] * nd
        s = step * item
        for ax in reversed(order):
            strides[ax] = s
            s *= max(shape[ax], 1) * step
        if kind in ("reversed", "neg_step3"):
            strides = [-x for x in strides]
        extent = sum((n - 1) * abs(x) for n, x in zip(shape, strides) if n > 0)
        self.raw = np.full(extent + item + 160, self.SENTINEL, np.uint8)
        base = (-self.raw.ctypes.data) % 64 + (1 if kind.startswith("misaligned") else 0)
        if kind in ("reversed", "neg_step3"):
            base += extent
        self.offset, self.strides, self.shape, self.dtype = base, tuple(strides), shape, dtype
        self.out = np.ndarray(shape, dtype, buffer=self.raw, offset=base, strides=self.strides)
        if kind.startswith("misaligned") and item > 1 and self.out.size:
            assert not self.out.flags.aligned

    def check_outside(self):
        copy = self.raw.copy()
        mine = np.ndarray(self.shape + (self.dtype.itemsize,), np.uint8, buffer=copy,
                          offset=self.offset, strides=self.strides + (1,))
        mine[...] = self.SENTINEL
        assert (copy == self.SENTINEL).all(), "a byte outside out's elements changed"


def sprinkle(rng, arr, p, values=(NAN, INF, -INF)):
    """A copy of ``arr`` with about a fraction ``p`` of its entries set to one of ``values``."""
    arr = np.array(arr)
    if p and arr.size:
        sel = rng.random(arr.shape) < p
        arr[sel] = rng.choice(np.array(values, dtype=np.float64), size=int(sel.sum()))
    return arr


def reduce_shape(draw, shape, drop=True):
    """A shape that broadcasts to ``shape`` without enlarging it: some dims set to 1 and, with
    ``drop``, some leading dims dropped."""
    dims = [1 if d == 1 else draw(st.sampled_from([d, d, 1])) for d in shape]
    k = draw(st.integers(0, len(dims))) if drop else 0
    return tuple(dims[k:])


def expand_view(arr, target_batch):
    """A zero-stride read-only ``broadcast_to`` view of ``arr`` whose size-1 batch dims are
    grown to ``target_batch``'s (the call's broadcast batch shape is unchanged)."""
    nb = arr.ndim - 2
    lead = len(target_batch) - nb
    if lead < 0:
        return arr
    new = tuple(target_batch[lead + i] if arr.shape[i] == 1 else arr.shape[i] for i in range(nb))
    return np.broadcast_to(arr, new + arr.shape[-2:])


def draw_mask(draw, rng, target, *, min_dims=0, float_dtype=None, kind=None, nan_specials=True):
    """None, a bool mask (True = take part) or a float mask (added), broadcastable to
    ``target`` (never enlarging it), with fully masked rows forced in now and then."""
    kind = kind or draw(st.sampled_from(["none", "bool", "bool", "float", "float"]))
    if kind == "none":
        return None
    shape = reduce_shape(draw, target)
    if len(shape) < min_dims:
        shape = tuple(target[len(target) - min_dims:])
    kill = draw(st.sampled_from([0.0, 0.0, 0.2, 0.6]))          # fraction of dead rows
    if kind == "bool":
        p_keep = draw(st.sampled_from([0.0, 0.3, 0.7, 0.9, 1.0]))
        m = rng.random(shape) < p_keep
        if kill and m.ndim >= 1 and m.size:
            rows = m.reshape(-1, shape[-1])
            rows[rng.random(rows.shape[0]) < kill] = False
        return m
    dt = np.dtype(float_dtype or draw(DTYPE))
    m = grid_values(rng, shape, -4.0, 4.0, 1.0 / 16)
    m = sprinkle(rng, m, draw(st.sampled_from([0.0, 0.1, 0.4])), (-INF,))
    huge = [float(np.finfo(dt).min), -1e300, -1e6] if dt == np.float64 else (
        [float(np.finfo(dt).min), -1e6] if dt == np.float32 else [float(np.finfo(dt).min)])
    m = sprinkle(rng, m, draw(st.sampled_from([0.0, 0.0, 0.05])), huge)
    if nan_specials:
        m = sprinkle(rng, m, draw(st.sampled_from([0.0, 0.0, 0.0, 0.02])), (NAN, INF))
    if kill and m.ndim >= 1 and m.size:
        rows = m.reshape(-1, shape[-1])
        rows[rng.random(rows.shape[0]) < kill] = -INF
    return m.astype(dt)


def in_result_dtype(ref, dtype):
    """The float64 reference, except where rounding it to the result dtype overflows: there
    the result is +-inf (float16 results are computed in float32 and rounded once, and e.g. a
    log-softmax of -65530 is -inf in float16), so the reference is too."""
    ref = np.asarray(ref, dtype=np.float64)
    with np.errstate(over="ignore"):
        rounded = ref.astype(dtype).astype(np.float64)
    return np.where(np.isinf(rounded) & np.isfinite(ref), rounded, ref)


def mask_event(mask):
    if mask is None:
        return "mask: none"
    return "mask: bool" if mask.dtype == np.bool_ else f"mask: float ({mask.dtype.name})"


def assert_same(a, b, what):
    """Equal values (NaN == NaN, -0.0 == 0.0), same shape and dtype."""
    assert a.shape == b.shape and a.dtype == b.dtype, (what, a.shape, b.shape, a.dtype, b.dtype)
    np.testing.assert_array_equal(a, b, err_msg=what)


# ------------------------------------------------------------------------------------------
# softmax / log_softmax
# ------------------------------------------------------------------------------------------

def numpy_softmax(x, axis=-1, mask=None, log=False):
    """float64 NumPy reference of the documented (log-)softmax semantics (NaN/inf included)."""
    x = np.asarray(x)
    compute = compute_dtype(x.dtype)
    s = np.moveaxis(x.astype(np.float64), axis, -1)
    cand = np.ones(s.shape, bool)
    with np.errstate(all="ignore"):
        if mask is not None:
            m = np.moveaxis(np.broadcast_to(_mask_for_oracle(mask, compute), x.shape), axis, -1)
            if m.dtype == np.bool_:
                cand = m.copy()
            else:
                s = s + m.astype(np.float64)
        s = np.where(cand, s, -INF)
        nan_row = (cand & (np.isnan(s) | (s == INF))).any(-1, keepdims=True)
        dead = ~(cand & (s > -INF)).any(-1, keepdims=True) & ~nan_row
        ok = ~(nan_row | dead)
        mx = np.where(ok, np.where(np.isnan(s), -INF, s).max(-1, keepdims=True)
                      if s.shape[-1] else 0.0, 0.0)
        e = np.where(cand, np.exp(s - mx), 0.0)
        z = np.where(ok, e.sum(-1, keepdims=True), 1.0)
        if log:
            res = np.where(cand, s - mx - np.log(z), -INF)
            res = np.where(dead, -INF, res)
        else:
            res = np.where(dead, 0.0, e / z)
        res = np.where(nan_row, NAN, res)
    return np.moveaxis(res, -1, axis)


@st.composite
def softmax_cases(draw, large=False):
    dtype = draw(DTYPE)
    rng = np.random.default_rng(draw(SEED))
    if large:
        n = draw(st.sampled_from([63, 64, 65, 127, 128, 129, 1023, 1025, 4095, 4097]))
        rows = draw(st.sampled_from([1, 2, 3, 5]))
        shape = [rows, n] if draw(st.booleans()) else [n, rows]
        if draw(st.booleans()):
            shape.insert(0, draw(st.sampled_from([1, 2])))
        shape = tuple(shape)
    else:
        ndim = draw(st.integers(1, 4))
        shape = tuple(draw(st.lists(st.sampled_from([0, 1, 1, 2, 3, 5, 8, 9, 17, 33]),
                                    min_size=ndim, max_size=ndim)))
        while math.prod(shape) > 2500:
            shape = shape[1:]
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    lo = draw(st.sampled_from([30.0, 30.0, 120.0]))            # 120: float32 exp underflow
    x = grid_values(rng, shape, -lo, lo, 1.0 / 8)
    if not large:
        x = sprinkle(rng, x, draw(st.sampled_from([0.0, 0.0, 0.05, 0.3])))
    else:
        x = sprinkle(rng, x, draw(st.sampled_from([0.0, 0.01])), (-INF,))
    x = x.astype(dtype)
    mask = draw_mask(draw, rng, shape)
    out_kind = draw(st.sampled_from(("none", "none") + OUT_KINDS + ("x", "x_reversed", "mask")))
    if out_kind == "mask" and (mask is None or mask.dtype == np.bool_ or mask.shape != shape
                               or mask.dtype != dtype):
        mask = draw_mask(draw, rng, shape, kind="float", float_dtype=dtype)
        mask = np.broadcast_to(mask, shape).copy()
    return {
        "dtype": dtype, "x": x, "axis": axis, "mask": mask, "log": draw(st.booleans()),
        "x_layout": draw(st.sampled_from(WRITABLE_LAYOUTS if out_kind.startswith("x")
                                         else IN_LAYOUTS)),
        "mask_layout": draw(st.sampled_from(WRITABLE_LAYOUTS if out_kind == "mask"
                                            else MASK_LAYOUTS)),
        "out": out_kind, "variant": draw(st.sampled_from(VARIANTS)),
    }


def check_softmax(case, reference):
    dtype, x, axis, mask, log = case["dtype"], case["x"], case["axis"], case["mask"], case["log"]
    fn = cyattn.log_softmax if log else cyattn.softmax
    expected = in_result_dtype(reference(x, axis=axis, mask=mask, log=log), dtype)
    xl = layout(x, case["x_layout"])
    ml = None if mask is None else layout(mask, case["mask_layout"])
    kwargs, buf, out = {"axis": axis, "mask": ml}, None, None
    kind = case["out"]
    if kind in OUT_KINDS:
        buf = OutBuffer(x.shape, dtype, kind)
        out = buf.out
        out[...] = np.nan
    elif kind == "x":
        out = xl
    elif kind == "x_reversed" and x.ndim:
        out = xl[::-1]
    elif kind == "mask" and ml is not None:
        out = ml
    if out is not None:
        kwargs["out"] = out
    note(f"x {x.dtype}{x.shape} axis={axis} mask={None if mask is None else mask.dtype} "
         f"{None if mask is None else mask.shape} out={kind}")
    event(f"out: {kind}")
    event(mask_event(mask))
    event("x has NaN/inf" if (~np.isfinite(x)).any() else "x finite")
    event("empty" if x.size == 0 else "non-empty")
    got = run(case["variant"], fn, xl, **kwargs)
    if out is not None:
        assert got is out
    assert got.shape == x.shape and got.dtype == dtype
    assert_close(got, expected, dtype, k=x.shape[axis])
    if buf is not None:
        buf.check_outside()
    # the same bits as a C-contiguous call, and bool-masked entries are never read
    plain_mask = None if mask is None else np.ascontiguousarray(mask)
    with use_variant(case["variant"]), no_warnings():
        clean = fn(np.ascontiguousarray(x), axis=axis, mask=plain_mask)
        assert_same(np.asarray(got), clean, "layout / out changed the result")
        if mask is not None and mask.dtype == np.bool_ and x.size:
            rng = np.random.default_rng(x.size)
            poisoned = np.array(x)
            off = ~np.broadcast_to(mask, x.shape)
            poisoned[off] = rng.choice(np.array([NAN, INF, -INF]), size=int(off.sum()))
            assert_same(fn(poisoned, axis=axis, mask=plain_mask), clean,
                        "a bool-masked entry leaked")


@hsettings(1000)
@given(case=softmax_cases())
def test_softmax_vs_oracle(case):
    check_softmax(case, oracle_softmax)


@hsettings(150)
@given(case=softmax_cases(large=True))
def test_softmax_large_vs_numpy(case):
    check_softmax(case, numpy_softmax)


# ------------------------------------------------------------------------------------------
# matmul_accumulate
# ------------------------------------------------------------------------------------------

ORACLE_MATMUL_BUDGET = 40_000


@st.composite
def matmul_cases(draw):
    rng = np.random.default_rng(draw(SEED))
    dta, dtb = draw(DTYPE), draw(DTYPE)
    if draw(st.booleans()):
        dtb = dta
    batch = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 1, 2, 0]), max_size=2)))
    big = draw(st.integers(0, 4)) == 0
    if big:
        M = draw(st.sampled_from([1, 3, 4, 5, 143, 144, 145]))
        N = draw(st.sampled_from([1, 23, 24, 25, 47, 49]))
        K = draw(st.sampled_from([1, 255, 256, 257]))
    else:
        M, N, K = (draw(st.sampled_from([1, 2, 3, 4, 5, 8, 9, 1, 2, 3, 7, 0])) for _ in range(3))
    out_kind = draw(st.sampled_from(("c",) + OUT_KINDS + ("a", "b", "a_reversed")))
    ab, bb = reduce_shape(draw, batch), reduce_shape(draw, batch)
    if out_kind in ("a", "a_reversed"):        # out is a (or a reversed view): N == K
        N, ab, dtb = K, batch, dta
    elif out_kind == "b":                      # out is b: M == K
        M, bb, dtb = K, batch, dta
    dto = np.result_type(dta, dtb)
    out_batch = np.broadcast_shapes(batch, ab, bb)
    size = math.prod(out_batch) * M * N * max(K, 1)
    use_oracle = size <= ORACLE_MATMUL_BUDGET
    a = grid_values(rng, ab + (M, K), -2.0, 2.0, 1.0 / 64)
    b = grid_values(rng, bb + (K, N), -2.0, 2.0, 1.0 / 64)
    o = grid_values(rng, out_batch + (M, N), -2.0, 2.0, 1.0 / 64)
    alphas = [1.0, -0.5, 0.0, 3.0, 2.0**-10]
    if use_oracle:                             # NaN/inf only where the oracle is the reference
        p = draw(st.sampled_from([0.0, 0.0, 0.0, 0.05, 0.2]))
        a, b, o = (sprinkle(rng, t, p * draw(st.sampled_from([0, 1]))) for t in (a, b, o))
        alphas += [INF, -INF, NAN]
    alpha = draw(st.sampled_from(alphas))
    return {
        "a": a.astype(dta), "b": b.astype(dtb), "out0": o.astype(dto), "dtype": dto,
        "alpha": alpha, "out_kind": out_kind, "oracle": use_oracle,
        "layouts": [draw(st.sampled_from(WRITABLE_LAYOUTS if out_kind.startswith(n)
                                         else IN_LAYOUTS)) for n in ("a", "b")],
        "threads": draw(st.sampled_from([None, 1, 2, -1])),
        "variant": draw(st.sampled_from(VARIANTS)),
    }


@hsettings(900)
@given(case=matmul_cases())
def test_matmul_accumulate_hardening(case):
    a, b, dtype, alpha, kind = case["a"], case["b"], case["dtype"], case["alpha"], case["out_kind"]
    al, bl = layout(a, case["layouts"][0]), layout(b, case["layouts"][1])
    buf = None
    if kind in OUT_KINDS:
        buf = OutBuffer(case["out0"].shape, dtype, kind)
        out = buf.out
        out[...] = case["out0"]
    elif kind == "a":
        out = al
    elif kind == "a_reversed":
        out = al[..., ::-1, :]
    else:
        out = bl
    out0 = np.array(out)                       # the accumulator's values before the call
    ref_fn = oracle_matmul if case["oracle"] else numpy_matmul
    expected = in_result_dtype(ref_fn(np.array(al), np.array(bl), out0, alpha), dtype)
    note(f"a {a.dtype}{a.shape} b {b.dtype}{b.shape} out {dtype}{out.shape} {kind} "
         f"alpha={alpha}")
    event(f"out: {kind}")
    event("reference: oracle" if case["oracle"] else "reference: numpy")
    event("mixed dtypes" if a.dtype != b.dtype else "one dtype")
    event("empty" if out.size == 0 or a.shape[-1] == 0 else "non-empty")
    event("NaN/inf" if not all(np.isfinite(t).all() for t in (a, b, out0)) or
          not math.isfinite(alpha) else "finite")
    res = run(case["variant"], cyattn.matmul_accumulate, al, bl, out, alpha=alpha,
              n_threads=case["threads"])
    assert res is out and out.dtype == dtype and out.shape == out0.shape
    assert_close(out, expected, dtype, k=a.shape[-1])
    if buf is not None:
        buf.check_outside()
        # any out layout and thread count gives the bits of a C-contiguous call
        plain = np.array(out0, order="C")
        with use_variant(case["variant"]), no_warnings():
            cyattn.matmul_accumulate(np.ascontiguousarray(a), np.ascontiguousarray(b), plain,
                                     alpha=alpha, n_threads=1)
        assert_same(np.array(out), plain, "layout / threads changed the result")


# ------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# ------------------------------------------------------------------------------------------

ORACLE_SDPA_BUDGET = 60_000
SCALES = [None, None, 0.0, 0.25, 1.0, -0.5, 0.125]


def causal_keep(L, S, is_causal, align):
    keep = np.ones((L, S), bool)
    if is_causal:
        off = 0 if align == "top_left" else S - L
        keep = np.arange(S)[None, :] <= np.arange(L)[:, None] + off
    return keep


def unused_kv(used_full, kv_batch, gqa_group):
    """Per stored key/value row (shape ``kv_batch + (S,)``): True where no query row of any
    batch entry that maps to it uses the key. ``used_full``: ``batch + (S,)``."""
    used = used_full
    if gqa_group:                              # query head h uses kv head h // group
        *lead, H, S = used.shape
        hkv = H // gqa_group
        used = used.reshape(*lead, hkv, gqa_group, S).any(axis=-2)
    nb = used.ndim - 1
    extra = nb - len(kv_batch)
    if extra:
        used = used.any(axis=tuple(range(extra)))
    for d, size in enumerate(kv_batch):
        if size == 1 and used.shape[d] != 1:
            used = used.any(axis=d, keepdims=True)
    return ~np.broadcast_to(used, tuple(kv_batch) + used.shape[-1:])


@st.composite
def sdpa_cases(draw, large=False):
    rng = np.random.default_rng(draw(SEED))
    base = draw(DTYPE)
    dq = dk = dv = base
    if draw(st.integers(0, 2)) == 0:
        dq, dk, dv = draw(DTYPE), draw(DTYPE), draw(DTYPE)
    gqa = draw(st.booleans())
    out_kind = draw(st.sampled_from(("none", "none") + OUT_KINDS
                                    + ("query", "query_reversed", "value", "mask")))
    if out_kind in ("query", "query_reversed", "value", "mask"):
        dq = dk = dv = base
        if out_kind == "value":
            gqa = False
    if large:
        outer = tuple(draw(st.lists(st.sampled_from([1, 2]), max_size=1)))
        L = draw(st.sampled_from([1, 63, 64, 65, 127, 129]))
        S = draw(st.sampled_from([1, 63, 65, 200, 257]))
        E = draw(st.sampled_from([1, 7, 8, 16, 33, 64]))
        Ev = draw(st.sampled_from([1, 8, 17, 64]))
    else:
        outer = tuple(draw(st.lists(st.sampled_from([1, 2, 2, 3, 1, 2, 3, 0]), max_size=2)))
        L = draw(st.sampled_from([1, 1, 2, 3, 4, 5, 7, 8, 9, 64, 65, 1, 3, 0]))
        S = draw(st.sampled_from([1, 1, 2, 3, 5, 8, 12, 17, 2, 4, 7, 0]))
        E = draw(st.sampled_from([1, 2, 3, 4, 8, 9, 1, 2, 5, 7, 0]))
        Ev = draw(st.sampled_from([1, 2, 3, 5, 1, 2, 4, 0]))
    if out_kind == "value":
        S = L
    if gqa:
        hkv = draw(st.sampled_from([1, 2, 3]))
        hq = hkv * draw(st.sampled_from([1, 1, 2, 3, 0] if not large else [1, 2, 4]))
        qb = reduce_shape(draw, outer) + (hq,)
        kb = reduce_shape(draw, outer) + (hkv,)
        vb = reduce_shape(draw, outer) + (hkv,)
        batch = np.broadcast_shapes(qb[:-1], kb[:-1], vb[:-1]) + (hq,)
    else:
        full = outer + ((draw(st.integers(1, 3)),) if draw(st.booleans()) else ())
        qb, kb, vb = (reduce_shape(draw, full) for _ in range(3))
        batch = np.broadcast_shapes(qb, kb, vb)
    batch = tuple(batch)
    if out_kind in ("query", "query_reversed"):
        qb, Ev = batch, E
    elif out_kind == "value":
        vb = batch
    if not large:
        while math.prod(batch) * L * S * (E + Ev + 1) > ORACLE_SDPA_BUDGET:
            L //= 2
            if out_kind == "value":
                S = L
    mask = draw_mask(draw, rng, batch + (L, S), nan_specials=not large)
    if out_kind == "mask":
        Ev = S
        mask = draw_mask(draw, rng, batch + (L, S), kind="float", float_dtype=base,
                         nan_specials=not large)
        mask = np.broadcast_to(mask, batch + (L, S)).copy()
    bound = 2.0 if not large else 1.0          # |scores| <= 36: no float32 exp underflow
    q = grid_values(rng, qb + (L, E), -bound, bound, 1.0 / 64)
    k = grid_values(rng, kb + (S, E), -bound, bound, 1.0 / 64)
    v = grid_values(rng, vb + (S, Ev), -2.0, 2.0, 1.0 / 64)
    if not large:
        specials = draw(st.sampled_from([(), (), (), (NAN,), (NAN, INF, -INF)]))
        if specials:
            q, k, v = (sprinkle(rng, t, draw(st.sampled_from([0.0, 0.03, 0.15])), specials)
                       for t in (q, k, v))
    q, k, v = q.astype(dq), k.astype(dk), v.astype(dv)
    writable = ("query", "query_reversed", "value")
    return {
        "q": q, "k": k, "v": v, "mask": mask, "gqa": gqa, "batch": batch,
        "dtype": np.result_type(dq, dk, dv),
        "is_causal": draw(st.booleans()),
        "align": draw(st.sampled_from(["top_left", "bottom_right"])),
        "scale": draw(st.sampled_from(SCALES)),
        "return_lse": draw(st.booleans()),
        "layouts": [draw(st.sampled_from(WRITABLE_LAYOUTS if out_kind.startswith(n)
                                         else IN_LAYOUTS)) for n in ("query", "key", "value")]
        + [draw(st.sampled_from(WRITABLE_LAYOUTS if out_kind == "mask" else MASK_LAYOUTS))],
        "expand": [draw(st.booleans()) and out_kind not in writable for _ in range(3)],
        "out": out_kind, "threads": draw(st.sampled_from([None, 1, 2, -1])),
        "variant": draw(st.sampled_from(VARIANTS)),
        "large": large,
    }


def check_sdpa(case):
    q, k, v, mask, dtype = case["q"], case["k"], case["v"], case["mask"], case["dtype"]
    batch, gqa, causal, align = case["batch"], case["gqa"], case["is_causal"], case["align"]
    scale, variant = case["scale"], case["variant"]
    L, E, S, Ev = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    compute = compute_dtype(q.dtype, k.dtype, v.dtype)
    if case["large"]:
        # (conftest.numpy_sdpa takes its batch shape from q @ k^T: give q and k the full one)
        kv_batch = batch[:-1] + k.shape[-3:-2] if gqa else batch
        ref_out, ref_lse = numpy_sdpa(np.broadcast_to(q, batch + q.shape[-2:]),
                                      np.broadcast_to(k, kv_batch + k.shape[-2:]),
                                      np.broadcast_to(v, kv_batch + v.shape[-2:]),
                                      _mask_for_oracle(mask, compute), causal, scale,
                                      align, enable_gqa=gqa)
    else:
        ref_out, ref_lse = oracle_sdpa(q, k, v, mask, causal, scale, align, enable_gqa=gqa)
    dead = np.isneginf(np.broadcast_to(ref_lse, batch + (L,)))       # fully masked rows
    ref_out = in_result_dtype(np.broadcast_to(ref_out, batch + (L, Ev)), dtype)
    ref_lse = in_result_dtype(np.broadcast_to(ref_lse, batch + (L,)), dtype)

    args = []
    for arr, lay, expand in zip((q, k, v), case["layouts"], case["expand"]):
        arr = layout(arr, lay)
        if expand:
            arr = expand_view(arr, batch[:-1] + arr.shape[-3:-2] if gqa else batch)
        args.append(arr)
    ql, kl, vl = args
    ml = None if mask is None else layout(mask, case["layouts"][3])
    kind = case["out"]
    kwargs = {"causal_alignment": align, "enable_gqa": gqa, "return_lse": case["return_lse"],
              "n_threads": case["threads"]}
    buf = out = None
    if kind in OUT_KINDS:
        buf = OutBuffer(batch + (L, Ev), dtype, kind)
        out = buf.out
        out[...] = np.nan
    elif kind == "query":
        out = ql
    elif kind == "query_reversed":
        out = ql[..., ::-1, :]
    elif kind == "value":
        out = vl
    elif kind == "mask":
        out = ml
    if out is not None:
        kwargs["out"] = out
    note(f"q {ql.dtype}{ql.shape} k {kl.dtype}{kl.shape} v {vl.dtype}{vl.shape} mask "
         f"{None if mask is None else (mask.dtype, mask.shape)} batch={batch} gqa={gqa} "
         f"causal={causal}/{align} scale={scale} out={kind} layouts={case['layouts']}")
    event(f"out: {kind}")
    event(mask_event(mask))
    event("gqa" if gqa else "no gqa")
    event(f"causal {align}" if causal else "not causal")
    event("mixed dtypes" if len({q.dtype, k.dtype, v.dtype}) > 1 else "one dtype")
    event("NaN/inf in q/k/v" if not all(np.isfinite(t).all() for t in (q, k, v)) else "finite")
    event("some dim 0" if 0 in batch + (L, S, E, Ev) else "no dim 0")
    res = run(variant, cyattn.scaled_dot_product_attention, ql, kl, vl, ml, causal, scale,
              **kwargs)
    got, lse = res if case["return_lse"] else (res, None)
    if out is not None:
        assert got is out
    assert got.shape == batch + (L, Ev) and got.dtype == dtype
    k_len = E + S
    keep = np.broadcast_to(causal_keep(L, S, causal, align), batch + (L, S))
    if mask is not None and mask.dtype == np.bool_:
        keep = keep & mask
    cmp = np.asarray(got)
    if mask is not None and mask.dtype != np.bool_ and L and S:
        # Rows whose every weighted score carries a huge finite mask value (-1e6, finfo.min
        # of a narrower dtype, ...): adding it in the compute dtype loses eps * |mask| of the
        # score (float32: 0.06 at 1e6), so these rows are ill-conditioned for any
        # implementation; they are excluded from the tolerance comparison and only checked
        # to be finite where the reference is. Rows that also have a normal-sized score give
        # the huge ones weight 0 and are compared as usual.
        mc = np.broadcast_to(_mask_for_oracle(mask, compute), batch + (L, S))
        live = keep & ~np.isneginf(mc)
        with np.errstate(invalid="ignore"):
            normal = live & (np.abs(mc.astype(np.float64)) <= 1e3)
        ill = live.any(-1) & ~normal.any(-1) & ~np.isnan(ref_lse)
        if ill.any():
            note(f"{int(ill.sum())} ill-conditioned rows excluded")
            assert np.isfinite(cmp[ill & np.isfinite(ref_out).all(-1)]).all()
            cmp = np.where(ill[..., None], ref_out, cmp)
    assert_close(cmp, ref_out, dtype, k=k_len, err_msg="output")
    if lse is not None:
        assert lse.shape == batch + (L,) and lse.dtype == dtype
        assert_close(lse, ref_lse, dtype, k=k_len, err_msg="lse")
    if buf is not None:
        buf.check_outside()

    # semantics, stated directly: fully masked rows are exactly 0 (lse -inf); a NaN in a query
    # row or in a key the row may attend to makes the row NaN
    assert np.all(np.asarray(got)[dead] == 0)
    if lse is not None:
        assert np.all(np.isneginf(lse[dead]))
    if math.prod(batch) and L and S:
        kk = np.repeat(k, batch[-1] // k.shape[-3], axis=-3) if gqa else k
        nan_key = np.broadcast_to(np.isnan(kk).any(-1)[..., None, :], batch + (L, S))
        nan_query = np.broadcast_to(np.isnan(q).any(-1)[..., :, None], batch + (L, S))
        nan_rows = (keep & (nan_key | nan_query)).any(-1)
        if Ev:
            assert np.isnan(np.asarray(got)[nan_rows]).all(), "a NaN score did not give a NaN row"
        if lse is not None:
            assert np.isnan(lse[nan_rows]).all()

    # same bits as C-contiguous inputs and another thread count; masked keys never leak
    plain = [np.ascontiguousarray(t) for t in (q, k, v)]
    pm = None if mask is None else np.ascontiguousarray(mask)
    kw = {"causal_alignment": align, "enable_gqa": gqa, "return_lse": True}
    with use_variant(variant), no_warnings():
        c_out, c_lse = cyattn.scaled_dot_product_attention(*plain, pm, causal, scale,
                                                           n_threads=1, **kw)
        assert_same(np.asarray(got), c_out, "layout / threads changed the output")
        if lse is not None:
            assert_same(lse, c_lse, "layout / threads changed the lse")
        if not S or not L:
            return
        # keys no query may use (bool mask / causal) and values with weight exactly 0
        # (float mask -inf) can hold anything
        keep_k = keep
        keep_v = keep
        if mask is not None and mask.dtype != np.bool_:
            mc = _mask_for_oracle(mask, compute)
            keep_v = keep & ~np.isneginf(np.broadcast_to(mc, batch + (L, S)))
        group = (batch[-1] // k.shape[-3]) if gqa else 0
        if gqa and not batch[-1]:
            return
        free_k = unused_kv(keep_k.any(-2), k.shape[:-2], group)
        free_v = unused_kv(keep_v.any(-2), v.shape[:-2], group)
        p_out = None
        if free_k.any():                  # NaN keys: the same bits
            event("poisoned masked keys")
            kp = np.array(plain[1])
            kp[np.broadcast_to(free_k[..., None], kp.shape)] = NAN
            p_out, p_lse = cyattn.scaled_dot_product_attention(plain[0], kp, plain[2], pm,
                                                               causal, scale, n_threads=2, **kw)
            assert_same(p_out, c_out, "a masked key leaked into the output")
            assert_same(p_lse, c_lse, "a masked key leaked into the lse")
        if free_v.any():                  # NaN/inf values: never leak
            event("poisoned masked values")
            rng = np.random.default_rng(q.size + k.size)
            vp = np.array(plain[2])
            sel = np.broadcast_to(free_v[..., None], vp.shape)
            vp[sel] = rng.choice(np.array([NAN, INF, -INF]), size=int(sel.sum()))
            p_out, p_lse = cyattn.scaled_dot_product_attention(plain[0], plain[1], vp, pm,
                                                               causal, scale, n_threads=2, **kw)
            # A masked value is never read: the same bits as with clean values.
            assert_same(p_out, c_out, "a masked value leaked")
            assert_same(p_lse, c_lse, "a masked value changed lse")


@hsettings(1100)
@given(case=sdpa_cases())
def test_sdpa_vs_oracle(case):
    check_sdpa(case)


@hsettings(200)
@given(case=sdpa_cases(large=True))
def test_sdpa_large_vs_numpy(case):
    check_sdpa(case)


# ------------------------------------------------------------------------------------------
# multi_head_attention / MultiHeadAttention
# ------------------------------------------------------------------------------------------

def _f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


def numpy_mha(query, key, value, *, num_heads, params, kpm=None, am=None, is_causal=False,
              need_weights=True, average=True, batch_first=False, compute=np.float64):
    """float64 NumPy reference of the MHA math with cyattn's documented semantics (bool masks
    True = ignore; fully masked head rows give weight 0; zero-weight values never read)."""
    batched = np.ndim(query) == 3
    q, k, v = (_f64(t) for t in (query, key, value))
    if not batched:
        q, k, v = q[None], k[None], v[None]
    elif not batch_first:
        q, k, v = (np.swapaxes(t, 0, 1) for t in (q, k, v))
    N, L, E = q.shape
    S = k.shape[1]
    H = num_heads
    d = E // H
    p = {n: _f64(a) for n, a in params.items()}
    if p.get("in_proj_weight") is not None:
        w = p["in_proj_weight"]
        wq, wk, wv = w[:E], w[E:2 * E], w[2 * E:]
    else:
        wq, wk, wv = p["q_proj_weight"], p["k_proj_weight"], p["v_proj_weight"]
    b = p.get("in_proj_bias")
    b = np.zeros(3 * E) if b is None else b
    bo = p.get("out_proj_bias")
    bo = np.zeros(E) if bo is None else bo

    with np.errstate(all="ignore"):
        def lin(x, weight, bias):                # einsum: no BLAS zero-skipping with NaN
            return np.einsum("nlc,oc->nlo", x, weight) + bias

        def heads(x):
            return x.reshape(x.shape[0], x.shape[1], H, d).transpose(0, 2, 1, 3)

        Q, K, V = heads(lin(q, wq, b[:E])), heads(lin(k, wk, b[E:2 * E])), \
            heads(lin(v, wv, b[2 * E:]))
        scores = np.einsum("nhld,nhsd->nhls", Q, K) * (1.0 / math.sqrt(d))
        keep = np.ones((N, H, L, S), bool)
        add = None
        for m, is_kpm in ((am, False), (kpm, True)):
            if m is None:
                continue
            m = np.asarray(m)
            if is_kpm:
                m4 = m.reshape(N, 1, 1, S)
            else:
                m4 = m.reshape(1, 1, L, S) if m.shape == (L, S) else m.reshape(N, H, L, S)
            if m4.dtype == np.bool_:
                keep = keep & ~m4
            else:
                mc = _mask_for_oracle(m4, compute)
                add = mc if add is None else (add + mc)   # summed in the compute dtype
        if is_causal:
            keep = keep & np.tri(L, S, dtype=bool)
        s = scores if add is None else scores + add.astype(np.float64)
        s = np.where(keep, s, -INF)
        nan_row = (keep & (np.isnan(s) | (s == INF))).any(-1, keepdims=True)
        dead = ~(keep & (s > -INF)).any(-1, keepdims=True) & ~nan_row
        ok = ~(nan_row | dead)
        mx = np.where(ok, np.where(np.isnan(s), -INF, s).max(-1, keepdims=True)
                      if S else 0.0, 0.0)
        e = np.where(keep, np.exp(s - mx), 0.0)
        z = np.where(ok, e.sum(-1, keepdims=True), 1.0)
        w = np.where(nan_row, NAN, np.where(dead, 0.0, e / z))
        contrib = np.where(w[..., None] != 0, w[..., None] * V[:, :, None, :, :], 0.0)
        o = contrib.sum(axis=-2)                  # (N, H, L, d)
        concat = o.transpose(0, 2, 1, 3).reshape(N, L, E)
        out = lin(concat, p["out_proj_weight"], bo)
    if batched and not batch_first:
        out = np.swapaxes(out, 0, 1)
    if not batched:
        out = out[0]
    if not need_weights:
        return out, None
    weights = w.sum(axis=1) / H if average else w
    return out, (weights if batched else weights[0])


def mha_tol_k(E, kdim, vdim, d, S):
    """Length of the chain of sums behind an MHA output element: in-projection (+ bias),
    scores and the weighted sum (as attention's E + S), out-projection (+ bias)."""
    return max(E, kdim, vdim) + 1 + d + S + E + 1


def make_params(rng, E, kdim, vdim, bias_in, bias_out, dtypes):
    p = mha_params(rng, E, kdim, vdim, packed=dtypes["packed"], bias_in=bias_in,
                   bias_out=bias_out, bias_scale=0.5)
    return {n: a.astype(dtypes.get(n, dtypes["default"])) for n, a in p.items()}


@st.composite
def mha_cases(draw, for_torch=False):
    rng = np.random.default_rng(draw(SEED))
    H, d = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    E = H * d
    separate = draw(st.booleans())
    kdim, vdim = (draw(st.integers(1, 7)), draw(st.integers(1, 7))) if separate else (E, E)
    module = for_torch or draw(st.booleans())
    bias_in = draw(st.booleans())
    bias_out = bias_in if module else draw(st.booleans())
    batched = draw(st.booleans())
    lo = 1 if for_torch else 0
    N = draw(st.integers(lo, 3)) if batched else None
    L, S = draw(st.integers(lo, 6)), draw(st.integers(lo, 7))
    batch_first = draw(st.booleans())
    if for_torch:
        base = draw(st.sampled_from([np.float32, np.float64]))
        in_dts = (base,) * 3
        pdt = {"default": base}
    else:
        base = draw(DTYPE)
        mixed = draw(st.integers(0, 2)) == 0
        in_dts = tuple(draw(DTYPE) if mixed else base for _ in range(3))
        pdt = {"default": draw(DTYPE) if mixed else base}
        if mixed and not module:
            for n in ("in_proj_weight", "q_proj_weight", "out_proj_weight", "out_proj_bias"):
                pdt[n] = draw(DTYPE)
    if module:                                 # the module packs iff kdim == vdim == E
        pdt["packed"] = kdim == E and vdim == E
    else:
        pdt["packed"] = not separate and draw(st.integers(0, 3)) > 0
    params = make_params(rng, E, kdim, vdim, bias_in, bias_out, pdt)

    def shaped(length, dim):
        if N is None:
            return (length, dim)
        return (N, length, dim) if batch_first else (length, N, dim)

    q = grid_values(rng, shaped(L, E), -1.0, 1.0, 1.0 / 64)
    k = grid_values(rng, shaped(S, kdim), -1.0, 1.0, 1.0 / 64)
    v = grid_values(rng, shaped(S, vdim), -1.0, 1.0, 1.0 / 64)
    # masks in torch polarity: bool True = ignore
    poison = "none"
    if not for_torch:
        # NaN in whole query rows or single entries; NaN/inf in key/value rows that a bool
        # key_padding_mask ignores (must not leak); now and then NaN in a used key/value
        poison = draw(st.sampled_from(["none", "none", "query", "ignored", "ignored", "used"]))
    kpm_kind = "bool" if poison == "ignored" else draw(st.sampled_from(["none", "bool", "float"]))
    am_kind = draw(st.sampled_from(["none", "bool", "float"]))
    am3 = draw(st.booleans())
    kpm_shape = (S,) if N is None else (N, S)
    am_shape = ((H, L, S) if N is None else (N * H, L, S)) if am3 else (L, S)
    mask_dt = base if for_torch else None

    def make_mask(kind, shape):
        if kind == "none":
            return None
        kill = draw(st.sampled_from([0.0, 0.0, 0.3]))
        if kind == "bool":
            m = rng.random(shape) < draw(st.sampled_from([0.0, 0.3, 0.6]))
            if poison == "ignored" and shape == kpm_shape and m.size:
                m.flat[rng.integers(m.size)] = True
            if kill and m.size:
                rows = m.reshape(-1, shape[-1])
                rows[rng.random(rows.shape[0]) < kill] = True
            return m
        # (huge finite values such as -1e6 are left to the SDPA tests: a row made only of
        # them is ill-conditioned in the compute dtype, see check_sdpa)
        dt = mask_dt or draw(DTYPE)
        m = grid_values(rng, shape, -3.0, 3.0, 1.0 / 16)
        m = sprinkle(rng, m, draw(st.sampled_from([0.0, 0.2])), (-INF,))
        if kill and m.size:
            rows = m.reshape(-1, shape[-1])
            rows[rng.random(rows.shape[0]) < kill] = -INF
        return m.astype(dt)

    kpm, am = make_mask(kpm_kind, kpm_shape), make_mask(am_kind, am_shape)
    if not for_torch:
        if poison == "query" and q.size:
            q = sprinkle(rng, q, 0.1, (NAN,))
        elif poison == "ignored" and kpm is not None and kpm.dtype == np.bool_ and kpm.any():
            kb = np.moveaxis(k, 0, 1) if (N is not None and not batch_first) else k
            vb = np.moveaxis(v, 0, 1) if (N is not None and not batch_first) else v
            kb[kpm] = rng.choice(np.array([NAN, INF, -INF]), size=kb[kpm].shape)
            vb[kpm] = rng.choice(np.array([NAN, INF, -INF]), size=vb[kpm].shape)
        elif poison == "used":
            k = sprinkle(rng, k, 0.05, (NAN,))
            v = sprinkle(rng, v, 0.05, (NAN,))
        else:
            poison = "none"
    q, k, v = (t.astype(dt) for t, dt in zip((q, k, v), in_dts))
    return {
        "H": H, "E": E, "d": d, "kdim": kdim, "vdim": vdim, "N": N, "L": L, "S": S,
        "q": q, "k": k, "v": v, "params": params, "kpm": kpm, "am": am,
        "is_causal": draw(st.booleans()), "need_weights": draw(st.booleans()),
        "average": draw(st.booleans()), "batch_first": batch_first, "module": module,
        "bias": bias_in, "poison": poison,
        "layouts": {n: draw(st.sampled_from(MASK_LAYOUTS if n in ("kpm", "am") else IN_LAYOUTS))
                    for n in ("q", "k", "v", "kpm", "am", *params)},
        "variant": draw(st.sampled_from(VARIANTS)),
    }


def mha_call(case, q, k, v, kpm, am):
    """(output, weights) of cyattn for ``case`` with the given (laid out) inputs, through the
    module or the functional form; checks that inputs and parameters are unmodified."""
    p = case["params"]
    kw = {"key_padding_mask": kpm, "attn_mask": am, "need_weights": case["need_weights"],
          "average_attn_weights": case["average"], "is_causal": case["is_causal"]}
    if case["module"]:
        m = cyattn.MultiHeadAttention(case["E"], case["H"], bias=case["bias"], kdim=case["kdim"],
                                      vdim=case["vdim"], batch_first=case["batch_first"],
                                      dtype=next(iter(p.values())).dtype, seed=1)
        m.load_state_dict({n.replace("out_proj_", "out_proj."): layout(a, case["layouts"][n])
                           for n, a in p.items()})
        before = {n: a.tobytes() for n, a in m.state_dict().items()}
        res = run(case["variant"], m.forward, q, k, v, **kw)
        assert {n: a.tobytes() for n, a in m.state_dict().items()} == before
        return res
    lp = {n: layout(a, case["layouts"][n]) for n, a in p.items()}
    return run(case["variant"], cyattn.multi_head_attention, q, k, v, num_heads=case["H"],
               batch_first=case["batch_first"], **lp, **kw)


def laid_out(case):
    lay = case["layouts"]
    return [None if case[n] is None else layout(case[n], lay[n])
            for n in ("q", "k", "v", "kpm", "am")]


@hsettings(800)
@given(case=mha_cases())
def test_mha_vs_numpy_reference(case):
    q, k, v, kpm, am = case["q"], case["k"], case["v"], case["kpm"], case["am"]
    p, H, E, S, L, N = case["params"], case["H"], case["E"], case["S"], case["L"], case["N"]
    dtype = np.result_type(q, k, v, *p.values())
    compute = compute_dtype(dtype)
    note(f"E={E} H={H} kdim={case['kdim']} vdim={case['vdim']} N={N} L={L} S={S} "
         f"batch_first={case['batch_first']} module={case['module']} dtypes "
         f"{[t.dtype.name for t in (q, k, v)]} {[a.dtype.name for a in p.values()]} kpm="
         f"{None if kpm is None else kpm.dtype} am={None if am is None else (am.dtype, am.shape)}"
         f" causal={case['is_causal']} poison={case['poison']}")
    ref_out, ref_w = numpy_mha(q, k, v, num_heads=H, params=p, kpm=kpm, am=am,
                               is_causal=case["is_causal"], need_weights=case["need_weights"],
                               average=case["average"], batch_first=case["batch_first"],
                               compute=compute)
    event("module" if case["module"] else "functional")
    event(f"kpm: {mask_event(kpm)[6:]}, attn_mask: {mask_event(am)[6:]}")
    event(f"poison: {case['poison']}")
    event("mixed dtypes" if len({t.dtype for t in (q, k, v, *p.values())}) > 1 else "one dtype")
    event("batched" if N is not None else "unbatched")
    out, w = mha_call(case, *laid_out(case))
    assert out.dtype == dtype and out.shape == q.shape[:-1] + (E,)
    kk = mha_tol_k(E, case["kdim"], case["vdim"], case["d"], S)
    assert_close(out, ref_out, dtype, k=kk, err_msg="MHA output")
    if not case["need_weights"]:
        assert w is None
    else:
        lead = () if N is None else (N,)
        assert w.shape == lead + ((L, S) if case["average"] else (H, L, S))
        assert w.dtype == dtype
        assert_close(w, ref_w, dtype, k=max(E, case["kdim"]) + 1 + case["d"] + S,
                     err_msg="MHA weights")
    if case["poison"] == "ignored":           # ignored keys' NaN/inf must not leak at all
        clean = dict(case)
        ignored = kpm
        kc, vc = np.array(k), np.array(v)
        kb = np.moveaxis(kc, 0, 1) if (N is not None and not case["batch_first"]) else kc
        vb = np.moveaxis(vc, 0, 1) if (N is not None and not case["batch_first"]) else vc
        kb[ignored] = 0.5
        vb[ignored] = -0.25
        clean["k"], clean["v"] = kc, vc
        c_out, c_w = mha_call(clean, *laid_out(clean))
        # within the tolerance, not bit for bit: see the note in check_sdpa
        assert_close(out, c_out, dtype, k=kk, err_msg="an ignored key/value leaked")
        if w is not None:
            assert_same(w, c_w, "an ignored key leaked into the MHA weights")


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@hsettings(400)
@given(case=mha_cases(for_torch=True))
def test_mha_vs_torch(torch, case):
    q, k, v, kpm, am = case["q"], case["k"], case["v"], case["kpm"], case["am"]
    E, H, L, S = case["E"], case["H"], case["L"], case["S"]
    dtype = q.dtype
    tdt = torch.float64 if dtype == np.float64 else torch.float32
    torch.manual_seed(int(q.size + k.size + E))
    t = torch.nn.MultiheadAttention(E, H, bias=case["bias"], kdim=case["kdim"],
                                    vdim=case["vdim"], batch_first=case["batch_first"],
                                    dtype=tdt).eval()
    with torch.no_grad():
        if case["bias"]:
            t.in_proj_bias.uniform_(-0.5, 0.5)
            t.out_proj.bias.uniform_(-0.5, 0.5)
    state = {n: a.detach().numpy().copy() for n, a in t.state_dict().items()}
    if case["H"] % 2:                          # both ways of getting torch's weights
        m = cyattn.MultiHeadAttention.from_torch(t)
    else:
        m = cyattn.MultiHeadAttention(E, H, bias=case["bias"], kdim=case["kdim"],
                                      vdim=case["vdim"], batch_first=case["batch_first"],
                                      dtype=dtype)
        m.load_state_dict({n: layout(a, case["layouts"]["q"]) for n, a in state.items()})
    ql, kl, vl, kpml, aml = laid_out(case)
    kw = {"need_weights": case["need_weights"], "average_attn_weights": case["average"]}
    out, w = run(case["variant"], m.forward, ql, kl, vl, key_padding_mask=kpml, attn_mask=aml,
                 is_causal=case["is_causal"], **kw)
    t_am = am
    if case["is_causal"]:
        # torch needs the causal mask itself, and NOT is_causal=True: that is only a hint that
        # attn_mask *is* the causal mask, and without need_weights/key_padding_mask torch then
        # drops attn_mask (a float mask composed with causal would be silently ignored)
        upper = np.triu(np.ones((L, S), bool), 1)
        if am is None:
            t_am = upper
        elif am.dtype == np.bool_:
            t_am = am | upper
        else:
            t_am = np.where(upper, -INF, am).astype(am.dtype)

    def to_t(a):
        return None if a is None else torch.from_numpy(np.ascontiguousarray(a))

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t_out, t_w = t(to_t(q), to_t(k), to_t(v), key_padding_mask=to_t(kpm),
                       attn_mask=to_t(t_am), **kw)
    t_out = t_out.numpy()
    assert out.dtype == dtype and out.shape == t_out.shape
    assert np.isfinite(out).all()              # torch gives NaN for fully masked rows
    rows = np.isfinite(t_out).all(axis=-1)
    event("torch NaN rows excluded" if not rows.all() else "all rows compared")
    event(f"kpm: {mask_event(kpm)[6:]}, attn_mask: {mask_event(am)[6:]}")
    kk = mha_tol_k(E, case["kdim"], case["vdim"], case["d"], S)
    assert_close(out[rows], t_out[rows], dtype, k=kk, err_msg="vs torch output")
    if case["need_weights"]:
        t_w = t_w.numpy()
        assert w.shape == t_w.shape and w.dtype == dtype
        wrows = np.isfinite(t_w).all(axis=-1)
        assert_close(w[wrows], t_w[wrows], dtype, k=max(E, case["kdim"]) + 1 + case["d"] + S,
                     err_msg="vs torch weights")
    else:
        assert w is None and t_w is None


# ------------------------------------------------------------------------------------------
# error paths: random bad out / dtypes, right exception type, nothing modified
# ------------------------------------------------------------------------------------------

@st.composite
def error_cases(draw):
    fn = draw(st.sampled_from(["softmax", "log_softmax", "matmul", "sdpa"]))
    problem = draw(st.sampled_from(["out_shape", "out_dtype", "out_read_only", "out_list",
                                    "int_data", "bool_data", "int_mask"]))
    if fn == "matmul" and problem == "int_mask":
        problem = "out_shape"
    dtype = draw(DTYPE)
    seed = draw(SEED)
    dims = [draw(st.integers(0, 4)) for _ in range(4)]
    return {"fn": fn, "problem": problem, "dtype": dtype, "seed": seed, "dims": dims,
            "out_kind": draw(st.sampled_from(OUT_KINDS)),
            "variant": draw(st.sampled_from(VARIANTS))}


@hsettings(200)
@given(case=error_cases())
def test_errors_have_the_documented_type_and_modify_nothing(case):
    rng = np.random.default_rng(case["seed"])
    dtype, problem = case["dtype"], case["problem"]
    a, b, c, e = case["dims"]
    if case["fn"] in ("softmax", "log_softmax"):
        fn = getattr(cyattn, case["fn"])
        x = grid_values(rng, (a, b + 1), -3, 3).astype(dtype)
        args, out_shape = [x], x.shape
        mask_kw = "mask"
    elif case["fn"] == "matmul":
        fn = cyattn.matmul_accumulate
        args = [grid_values(rng, (a, c), -1, 1).astype(dtype),
                grid_values(rng, (c, e), -1, 1).astype(dtype)]
        out_shape, mask_kw = (a, e), None
    else:
        fn = cyattn.scaled_dot_product_attention
        args = [grid_values(rng, shape, -1, 1).astype(dtype)
                for shape in ((2, a, c), (2, b, c), (2, b, e))]
        out_shape, mask_kw = (2, a, e), "attn_mask"
    kwargs, buf = {}, None
    bad_shape = tuple(s + 1 if i == len(out_shape) - 1 else s for i, s in enumerate(out_shape))
    exc = ValueError
    if problem.startswith("out") or fn is cyattn.matmul_accumulate:
        shape = bad_shape if problem == "out_shape" else out_shape
        odt = np.float64 if (problem == "out_dtype" and dtype != np.float64) else (
            np.float32 if problem == "out_dtype" else dtype)
        buf = OutBuffer(shape, odt, case["out_kind"])
        out = buf.out
        out[...] = 1.5
        if problem == "out_read_only":
            out.flags.writeable = False
        if problem == "out_list":
            out = np.asarray(out).tolist()
        kwargs["out"] = out
    if problem in ("int_data", "bool_data"):
        bad = args[0].astype(np.int64 if problem == "int_data" else np.bool_)
        args[0] = layout(bad, case["out_kind"] if case["out_kind"] in IN_LAYOUTS
                         else "c_contiguous")
        exc = TypeError
    elif problem == "int_mask":
        kwargs[mask_kw] = np.ones(out_shape[:-1] + (args[0].shape[-1] if mask_kw == "mask"
                                                    else args[1].shape[-2],), np.int32)
        exc = TypeError
    call_args = list(args)
    if fn is cyattn.matmul_accumulate:
        call_args.append(kwargs.pop("out"))
    snaps = [(np.ascontiguousarray(t).tobytes(), t.strides) for t in call_args + list(
        kwargs.values()) if isinstance(t, np.ndarray)]
    raw_before = None if buf is None else buf.raw.copy()
    with use_variant(case["variant"]), pytest.raises(exc):
        fn(*call_args, **kwargs)
    after = [(np.ascontiguousarray(t).tobytes(), t.strides) for t in call_args + list(
        kwargs.values()) if isinstance(t, np.ndarray)]
    assert after == snaps, "a failing call modified an argument"
    if raw_before is not None:
        assert np.array_equal(buf.raw, raw_before), "a failing call wrote into out's buffer"


# ------------------------------------------------------------------------------------------
# values we got wrong once (found by these property tests, fixed, kept as tests)
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", ["softmax", "sdpa", "mha"])
def test_byteswapped_float_mask_is_accepted(fn):
    mask = np.array([[0.0, -np.inf, 1.0]]).astype(">f8")
    native = mask.astype("<f8")
    if fn == "softmax":
        x = np.array([[1.0, 2.0, 3.0]])
        np.testing.assert_array_equal(cyattn.softmax(x, mask=mask), cyattn.softmax(x, mask=native))
    elif fn == "sdpa":
        q, k, v = np.ones((1, 2)), np.ones((3, 2)), np.arange(6.0).reshape(3, 2)
        np.testing.assert_array_equal(cyattn.scaled_dot_product_attention(q, k, v, mask),
                                      cyattn.scaled_dot_product_attention(q, k, v, native))
    else:
        m = cyattn.MultiHeadAttention(2, 1, dtype=np.float64, seed=0)
        x = np.ones((1, 2))
        kv = np.arange(6.0).reshape(3, 2)
        np.testing.assert_array_equal(m(x, kv, kv, attn_mask=mask)[0],
                                      m(x, kv, kv, attn_mask=native)[0])


def test_mha_two_huge_finite_float_masks_do_not_warn():
    m = cyattn.MultiHeadAttention(2, 1, dtype=np.float32, seed=0)
    x = np.ones((1, 2), np.float32)
    kv = np.arange(4, dtype=np.float32).reshape(2, 2)
    big = np.finfo(np.float32).min
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m(x, kv, kv, attn_mask=np.array([[big, 0.0]], np.float32),
          key_padding_mask=np.array([big, 0.0], np.float32))


@pytest.mark.parametrize("variant", VARIANTS)
def test_masked_nonfinite_values_do_not_change_output_bits(variant):
    r = np.random.default_rng(1)
    q = r.standard_normal((1, 1)).astype(np.float32)
    k = r.standard_normal((63, 1)).astype(np.float32)
    v = r.standard_normal((63, 1)).astype(np.float32)
    keep = r.random((1, 63)) < 0.5
    poisoned = v.copy()
    poisoned[~keep[0]] = np.nan
    with use_variant(variant):
        clean = cyattn.scaled_dot_product_attention(q, k, v, keep, return_lse=True)
        got = cyattn.scaled_dot_product_attention(q, k, poisoned, keep, return_lse=True)
    assert [a.tobytes() for a in clean] == [a.tobytes() for a in got], (clean, got)
