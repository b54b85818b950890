"""The kernels' tanh (the logit softcap ``c * tanh(s / c)``): accuracy and special values.

Bound: 3 ulp against a correctly rounded tanh (measured: 2.62 ulp over every float32, 2.8 ulp
on float64 samples; see the note atop tanh in src/cyattn/_exp.pxi).
"""
import numpy as np
import pytest

from cyattn import _backend

ULP_BOUND = 3.0


def _ulp_error(got, ref, mant_bits, min_exp):
    """|got - ref| in units of the last place of ``ref`` (a float64 or long double array)."""
    _, e = np.frexp(ref)
    ulp = np.ldexp(np.ones_like(ref), np.maximum(e.astype(np.int64) - mant_bits, min_exp))
    return np.abs(got.astype(ref.dtype) - ref) / ulp


def _check32(kern, xs):
    got = np.empty_like(xs)
    kern.tanh_values(xs, got)
    ref = np.tanh(xs.astype(np.float64))        # float64 tanh: << 1 float32 ulp of error
    err = _ulp_error(got, ref, 24, -149)
    worst = int(np.argmax(err))
    assert err[worst] <= ULP_BOUND, (xs[worst], got[worst], ref[worst], err[worst])
    # odd: tanh(-x) == -tanh(x) bit for bit
    neg = np.empty_like(xs)
    kern.tanh_values(-xs, neg)
    assert np.array_equal(neg.view(np.uint32), (-got).view(np.uint32))


def _f32_range(lo_bits, hi_bits, step):
    return np.arange(lo_bits, hi_bits, step, dtype=np.uint32).view(np.float32)


CLAMP_BITS = int(np.float32(9.5).view(np.uint32))


def test_tanh_float32_sweep(variant):
    kern = _backend.kernels
    # every 61st float32 magnitude up to 9.5 (all exponents, subnormals included), and dense
    # around the places where the formula changes regime (n = 0 -> 1 near 0.17, the clamp)
    _check32(kern, _f32_range(0, CLAMP_BITS, 61))
    _check32(kern, np.concatenate([
        _f32_range(int(np.float32(0.15).view(np.uint32)),
                   int(np.float32(0.30).view(np.uint32)), 1),
        _f32_range(int(np.float32(8.5).view(np.uint32)), CLAMP_BITS, 1),
    ]))


@pytest.mark.slow
def test_tanh_float32_every_value(variant):
    """Every float32 magnitude below 9.5 (larger ones give exactly 1): ~1.1e9 values, each
    within 3 float32 steps of the correctly rounded tanh (|error| <= 2.62 ulp measured), by
    integer distance of the bit patterns (positive floats are ordered like their bits)."""
    kern = _backend.kernels
    for start in range(0, CLAMP_BITS, 1 << 24):
        xs = _f32_range(start, min(CLAMP_BITS, start + (1 << 24)), 1)
        got = np.empty_like(xs)
        kern.tanh_values(xs, got)
        ref = np.tanh(xs.astype(np.float64)).astype(np.float32)
        steps = np.abs(got.view(np.int32).astype(np.int64) - ref.view(np.int32))
        worst = int(np.argmax(steps))
        assert steps[worst] <= ULP_BOUND, (xs[worst], got[worst], ref[worst])


def test_tanh_float64_samples(variant):
    kern = _backend.kernels
    rng = np.random.default_rng(7)
    xs = np.concatenate([
        np.linspace(-25.0, 25.0, 200_001),
        rng.standard_normal(100_000) * np.exp(rng.uniform(-40.0, 3.0, 100_000)),
        np.array([5e-324, 1e-310, 2.2250738585072014e-308, 1e-20, 0.17, 0.1733, 19.4, 19.6]),
    ])
    got = np.empty_like(xs)
    kern.tanh_values(xs, got)
    longdouble = np.finfo(np.longdouble).nmant > np.finfo(np.float64).nmant
    ref = np.tanh(xs.astype(np.longdouble)) if longdouble else np.tanh(xs)
    # without a wider long double the reference is glibc's float64 tanh (< 1 ulp itself)
    err = _ulp_error(got, ref, 53, -1074)
    worst = int(np.argmax(err))
    assert err[worst] <= ULP_BOUND + (0 if longdouble else 1), (xs[worst], err[worst])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tanh_special_values(variant, dtype):
    kern = _backend.kernels
    xs = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 30.0, -30.0,
                   np.finfo(dtype).max, -np.finfo(dtype).max,
                   np.finfo(dtype).smallest_subnormal], dtype=dtype)
    got = np.empty_like(xs)
    kern.tanh_values(xs, got)
    assert got[0] == 0 and not np.signbit(got[0])
    assert got[1] == 0 and np.signbit(got[1])
    assert got[2] == 1 and got[3] == -1
    assert np.isnan(got[4])
    assert got[5] == 1 and got[6] == -1 and got[7] == 1 and got[8] == -1
    assert got[9] == xs[9]                       # tanh(x) = x for the tiniest x
