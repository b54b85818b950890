"""matmul_accumulate on float16 / bfloat16 operands read by the kernel (issue 19): A and B are
widened while their panels are packed, a 16-bit ``out`` is accumulated tile by tile in float32
and rounded once. No float32 copy of an operand is made.

The widening is exact and the packed panels are those of the float32 call, so a half call must
equal, bit for bit, the float32 call on the same values with the result rounded once to the
result dtype; and, within the conftest tolerance of that dtype, the exact oracle.
"""
import numpy as np
import pytest

import cyattn
from cyattn import oracle
from conftest import BFLOAT16_TOLERANCE, assert_close, to_oracle
from test_half_kv import HALF, _bits, traced_peak

# (M, N, K): one element; partial tiles; K over one KC = 256 block; M over MC = 144 and N over
# the 1024-column tile a 16-bit out is accumulated in (several tiles, repacked panels)
SHAPES = [(1, 1, 1), (3, 5, 7), (9, 40, 600), (37, 70, 300), (150, 1100, 260), (1, 2100, 40)]


def _float32_rounded(a, b, out, alpha):
    """The float32 call on the same values, rounded once to out's dtype."""
    ref = out.astype(np.float32)
    cyattn.matmul_accumulate(a.astype(np.float32), b.astype(np.float32), ref, alpha=alpha)
    with np.errstate(over="ignore"):
        return ref.astype(out.dtype)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_half_matmul_equals_float32_call_rounded_once(variant, dtype, shape):
    M, N, K = shape
    rng = np.random.default_rng(M * 7 + N)
    a = rng.standard_normal((M, K)).astype(dtype)
    for b in (rng.standard_normal((K, N)).astype(dtype),           # row-major
              rng.standard_normal((N, K)).astype(dtype).T):        # column-major (k^T)
        out = rng.standard_normal((M, N)).astype(dtype)
        expected = _float32_rounded(a, b, out, 0.75)
        for n_threads in (1, 2, 3):
            got = out.copy()
            assert cyattn.matmul_accumulate(a, b, got, alpha=0.75, n_threads=n_threads) is got
            assert got.dtype == dtype
            np.testing.assert_array_equal(_bits(got, dtype), _bits(expected, dtype))


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_matmul_within_tolerance_of_the_oracle(variant, dtype):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((6, 300)).astype(dtype)
    b = rng.standard_normal((300, 5)).astype(dtype)
    out = rng.standard_normal((6, 5)).astype(dtype)
    exact = np.array(oracle.matmul_accumulate(to_oracle(a.astype(np.float64)),
                                              to_oracle(b.astype(np.float64)),
                                              to_oracle(out.astype(np.float64)), alpha=0.5))
    cyattn.matmul_accumulate(a, b, out, alpha=0.5)
    if dtype == np.float16:
        assert_close(out, exact, dtype, k=300)
    else:
        np.testing.assert_allclose(out.astype(np.float64), exact, **BFLOAT16_TOLERANCE)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_matmul_any_strides_batches_and_aliasing(variant, dtype):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 1, 40, 2 * 30)).astype(dtype)[..., ::-2]  # negative stride
    b = rng.standard_normal((4, 30, 50)).astype(dtype)
    base = rng.standard_normal((3, 4, 40, 100)).astype(dtype)
    gaps = base[..., ::2].copy()
    out = base[..., 1::2]                                               # strided out
    expected = _float32_rounded(a, b, out, 1.0)
    cyattn.matmul_accumulate(a, b, out, n_threads=2)
    np.testing.assert_array_equal(_bits(out, dtype), _bits(expected, dtype))
    np.testing.assert_array_equal(_bits(base[..., ::2], dtype), _bits(gaps, dtype))
    square = rng.standard_normal((70, 70)).astype(dtype)
    expected = _float32_rounded(square, square, square, 1.0)
    cyattn.matmul_accumulate(square, square, square)                    # out is a and b
    np.testing.assert_array_equal(_bits(square, dtype), _bits(expected, dtype))


def test_mixed_operand_formats_promote_as_documented(variant):
    rng = np.random.default_rng(7)
    a16 = rng.standard_normal((20, 300)).astype(np.float16)
    b32 = rng.standard_normal((300, 40)).astype(np.float32)
    others = [b32]
    if len(HALF) > 1:
        others.append(rng.standard_normal((300, 40)).astype(HALF[1]))   # bfloat16 + float16
    for b in others:
        out = np.zeros((20, 40), np.float32)
        ref = np.zeros((20, 40), np.float32)
        cyattn.matmul_accumulate(a16, b, out)
        cyattn.matmul_accumulate(a16.astype(np.float32), b.astype(np.float32), ref)
        np.testing.assert_array_equal(out, ref)
        with pytest.raises(ValueError, match="dtype"):
            cyattn.matmul_accumulate(a16, b, np.zeros((20, 40), np.float16))


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_matmul_non_finite_values_and_alpha(variant, dtype):
    rng = np.random.default_rng(11)
    a = rng.standard_normal((9, 600)).astype(dtype)
    b = rng.standard_normal((600, 33)).astype(dtype)
    a[2, 5] = np.inf
    a[4, 7] = np.nan
    b[3, 1] = -np.inf
    big = np.full((9, 33), 6e4 if dtype == np.float16 else 3e38, dtype)   # overflows to inf
    for alpha in (1.0, np.inf):
        for out in (rng.standard_normal((9, 33)).astype(dtype), big.copy()):
            with np.errstate(invalid="ignore", over="ignore"):
                expected = _float32_rounded(a, b, out, alpha)
            got = out.copy()
            cyattn.matmul_accumulate(a, b, got, alpha=alpha)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
            ok = ~np.isnan(expected)
            np.testing.assert_array_equal(_bits(got, dtype)[ok], _bits(expected, dtype)[ok])


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_failed_half_call_leaves_out_untouched(dtype):
    a = np.ones((4, 6), dtype)
    out = np.full((4, 5), 3, dtype)
    for b, kw in ((np.ones((7, 5), dtype), {}), (np.ones((6, 5), dtype), {"n_threads": 0}),
                  (np.ones((6, 5), dtype), {"alpha": "x"})):
        with pytest.raises((TypeError, ValueError)):
            cyattn.matmul_accumulate(a, b, out, **kw)
        assert (out.astype(np.float32) == 3).all()


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_matmul_makes_no_float32_copy(dtype):
    """A (512, 1024) @ (1024, 1024) product with a 16-bit out makes no float32 copy of a, b or
    out (2, 4 and 2 MiB): NumPy reports its buffers to tracemalloc. (The kernel's own panels
    and float32 tile, under 1.5 MiB per worker, come from C malloc and are not counted.)"""
    rng = np.random.default_rng(13)
    a = rng.standard_normal((512, 1024)).astype(dtype)
    b = rng.standard_normal((1024, 1024)).astype(dtype)
    out = np.zeros((512, 1024), dtype)
    assert traced_peak(lambda: cyattn.matmul_accumulate(a, b, out)) < (1 << 20)
