"""float16 / bfloat16 softmax and log_softmax read and written by the kernels (issue 19): each
row is widened as it is read, computed in float32 in a per-thread row and rounded once, to
nearest even, as it is written; a 16-bit additive mask is widened the same way. No float32
copy of x, the mask or the result is made.

The widening is exact and the rounding is NumPy's / ml_dtypes' (tested over the float32 bit
patterns below), so a half call must equal, bit for bit, the float32 call on the inputs
converted to float32, rounded with astype.
"""
import tracemalloc

import numpy as np
import pytest

import cyattn
from cyattn import _backend
from test_half_kv import FMT, HALF




def _bits(a):
    return np.asarray(a).view(np.uint16)


def _narrowing_mismatches(bits, dtype):
    """Patterns of `bits` (uint32) whose kernel rounding to dtype differs from astype's,
    signalling NaNs aside (the F16C instruction quiets them; every NaN a kernel computes is
    quiet)."""
    x = bits.view(np.float32)
    got = np.empty(x.size, np.uint16)
    _backend.kernels.float32_to_half(x, got, FMT[dtype.name])
    with np.errstate(all="ignore"):
        ref = x.astype(dtype).view(np.uint16)
    signalling = np.isnan(x) & ((bits & 0x400000) == 0)
    return bits[(got != ref) & ~signalling]


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_rounding_equals_astype(variant, dtype):
    """Every 65,537th float32 pattern, and around every rounding boundary of both formats: the
    16 low-bit patterns nearest each halfway point (ties to even), for every high half."""
    high = np.arange(1 << 16, dtype=np.uint32) << 16
    low = np.array([0, 1, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000, 0x7fff, 0x8000,
                    0x8001, 0xbfff, 0xc000, 0xefff, 0xf000, 0xffff], dtype=np.uint32)
    bits = np.concatenate([(high[:, None] | low[None, :]).ravel(),
                           np.arange(0, 1 << 32, 65537, dtype=np.uint64).astype(np.uint32)])
    assert _narrowing_mismatches(bits, dtype).size == 0


@pytest.mark.slow       # 2-15 s per variant and format (NumPy's float16 rounding is the slow part)
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_rounding_equals_astype_sweep(variant, dtype):
    """Every 23rd float32 bit pattern (187 million)."""
    for start in range(0, 1 << 32, 1 << 28):
        bits = np.arange(start, start + (1 << 28), 23, dtype=np.uint64).astype(np.uint32)
        bad = _narrowing_mismatches(bits, dtype)
        assert bad.size == 0, [hex(b) for b in bad[:5]]


def test_rounding_refuses_bad_buffers():
    with pytest.raises(ValueError, match="float32_to_half"):
        _backend.kernels.float32_to_half(np.zeros(4, np.float32), np.empty(3, np.uint16), 1)
    with pytest.raises(ValueError, match="float32_to_half"):
        _backend.kernels.float32_to_half(np.zeros(4, np.float32), np.empty(4, np.uint16), 0)
    with pytest.raises(ValueError, match="softmax_rows_half"):
        _backend.kernels.softmax_rows_half(np.zeros((2, 3), np.uint16), np.zeros((2, 4), np.uint16),
                                           1, 1, None, None, 0, 0, 0, 0, 0, False, 1)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("fn", [cyattn.softmax, cyattn.log_softmax], ids=lambda f: f.__name__)
def test_equals_float32_call_rounded_once(variant, dtype, fn):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 7, 300)) * 4).astype(dtype)
    x[0, 0] = -np.inf                                   # a fully masked row
    x[0, 1, 3] = np.nan                                 # a NaN row
    x[0, 2, :5] = -np.inf
    x[1, 0, 7] = np.inf                                 # a +inf row
    x[1, 1] = (rng.standard_normal(300) * 1e4).astype(dtype)   # huge spread (the full exp)
    bool_mask = rng.random((7, 300)) < 0.7
    masks = [None, bool_mask, np.where(bool_mask, 0.0, -np.inf).astype(dtype),
             (rng.standard_normal(300) * 2).astype(dtype),            # broadcast 16-bit mask
             np.where(bool_mask, 0.5, -np.inf).astype(np.float32), [True] * 299 + [False]]
    for mask in masks:
        for axis in (-1, 1, 0):
            if mask is not None and axis != -1:
                continue
            got = fn(x, axis=axis, mask=mask)
            widened = mask if mask is None or isinstance(mask, list) or mask.dtype == bool \
                else mask.astype(np.float32)
            ref = fn(x.astype(np.float32), axis=axis, mask=widened)
            assert got.dtype == dtype
            assert np.array_equal(_bits(got), _bits(ref.astype(dtype))), (mask, axis)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_out_of_any_strides_and_untouched_on_error(dtype):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 64)).astype(dtype)
    ref = cyattn.softmax(x)
    held = np.zeros((64, 4), dtype).T                   # a transposed (strided) out
    assert cyattn.softmax(x, out=held) is held
    assert np.array_equal(_bits(held), _bits(ref))
    direct = np.zeros((4, 64), dtype)                   # C-contiguous: written by the kernel
    assert cyattn.softmax(x, out=direct) is direct and np.array_equal(_bits(direct), _bits(ref))
    before = held.copy()
    with pytest.raises(ValueError, match="mask"):
        cyattn.softmax(x, mask=np.ones((3, 64), bool), out=held)
    with pytest.raises(TypeError, match="mask"):
        cyattn.softmax(x, mask=np.ones(64, np.int32), out=held)
    with pytest.raises(ValueError, match="out"):
        cyattn.softmax(x, out=np.zeros((4, 64), np.float32))
    assert np.array_equal(_bits(held), _bits(before))


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_bits_do_not_depend_on_threads(dtype):
    """softmax has no n_threads argument: the kernel's thread count is driven directly."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 2048)).astype(dtype).view(np.uint16)
    mask = rng.standard_normal((64, 2048)).astype(dtype).view(np.uint16)
    results = []
    for n in (1, 2, 3):
        out = np.empty_like(x)
        _backend.kernels.softmax_rows_half(x, out, FMT[dtype.name], FMT[dtype.name], None, mask,
                                           FMT[dtype.name], 0, 0, 2048, 1, False, n)
        results.append(out)
    assert all(np.array_equal(results[0], r) for r in results[1:])
    assert np.array_equal(results[0], _bits(cyattn.softmax(x.view(dtype), mask=mask.view(dtype))))


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_no_float32_copies(dtype):
    """A softmax of a 16 MiB half array with a 16 MiB half mask allocates the 16 MiB result
    and O(rows) more, not the 32 MiB of a float32 copy of either (NumPy reports its buffers to
    tracemalloc)."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2048, 4096)).astype(dtype)
    mask = rng.standard_normal((2048, 4096)).astype(dtype)
    cyattn.softmax(x[:2], mask=mask[:2])
    tracemalloc.start()
    try:
        res = cyattn.softmax(x, mask=mask)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < res.nbytes + (1 << 20), peak
