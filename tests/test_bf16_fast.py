"""bfloat16 matmul_accumulate on the CPU's bf16 dot products (issue 40, precision="fast").

* The one-instruction semantics (``bf16_dot_lanes``): the emulation on cases whose result was
  measured on an AMD Zen 5 (exact products, one rounding per product to nearest even, DAZ,
  FTZ after rounding), and the instruction against the emulation bit for bit on random and
  adversarial pairs where the CPU has AVX512-BF16.
* The GEMM: the emulation within the documented bound of a float64 oracle; the hardware
  kernel against the emulation bit for bit (shapes either side of the 8 x 32 tile, odd K,
  strides, batches, alpha, bf16 and float32 out, subnormal and special values); the exact
  path unchanged; 1, 2 and 3 threads bit-identical; the default; bad ``precision`` values.
"""
import numpy as np
import pytest
from conftest import bf16_gemm_bound

import cyattn
from cyattn import _backend
from cyattn import matmul as M

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
HW = getattr(_backend.kernels, "BF16_DOT", False)
needs_hw = pytest.mark.skipif(not HW, reason="the loaded kernels have no AVX512-BF16 "
                              "(vdpbf16ps): nothing to compare the emulation with")
SIZES = (1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65)


def _bits(x):
    return np.ascontiguousarray(x).view(np.uint16 if x.dtype.itemsize == 2 else np.uint32)


def _same_bits(x, y):
    """Equal bits, except that any NaN equals any NaN (signs and payloads not specified)."""
    xf, yf = x.astype(np.float32), y.astype(np.float32)
    nan = np.isnan(xf)
    assert np.array_equal(nan, np.isnan(yf))
    assert np.array_equal(_bits(x)[~nan], _bits(y)[~nan])


def _lanes(acc, a, b, emulate):
    out = np.empty(len(acc), np.float32)
    _backend.kernels.bf16_dot_lanes(np.asarray(acc, np.float32), np.asarray(a, np.uint32),
                                    np.asarray(b, np.uint32), out, emulate)
    return out


def _pair(first, second):
    """A uint32 pair of bf16 bit patterns: ``first`` (multiplied first) in the high half."""
    return (np.uint32(first) << np.uint32(16)) | np.uint32(second)


# --- one instruction -------------------------------------------------------------------------

H = float.fromhex

# (acc, first a, first b, second a, second b as bf16 bits, the result measured on Zen 5)
MEASURED = [
    (1.0, 0x3380, 0x3fc0, 0, 0, H("0x1.000002p0")),  # 1 + 1.5 * 2^-24: nearest even, up
    (1.0, 0x3380, 0x3f80, 0x3380, 0x3f80, 1.0),  # two roundings, not one (1 + 2^-23)
    (0.0, 0x0040, 0x3f80, 0, 0, 0.0),  # a subnormal bf16 input is zero
    (2.0 ** -130, 0, 0, 0, 0, 0.0),  # a subnormal accumulator is zero
    (0.0, 0x0080, 0x3f00, 0x0080, 0x3f00, 0.0),  # a subnormal step result is flushed
    (H("0x1.8p-126"), 0x0080, 0xbf00, 0, 0, H("0x1p-126")),  # a subnormal product is not flushed
    (-H("0x1.fffffep127"), 0x7f00, 0x4040, 0, 0, H("0x1.000002p127")),  # 1.5 * 2^128: no overflow
    (1.0, 0x0d80, 0x0d80, 0, 0, 1.0),  # 2^-200 added exactly
    (H("0x1p-126"), 0x0d80, 0xa600, 0, 0, H("0x1p-126")),  # 2^-126 - 2^-151: rounds up, stays
    (H("0x1p-126"), 0x0d80, 0xa680, 0, 0, 0.0),  # 2^-126 - 2^-150: tiny after rounding
    (-0.0, 0x3f80, 0x8000, 0x3f80, 0x8000, -0.0),  # -0 + (-0) + (-0)
    (0.0, 0x3f80, 0x8000, 0, 0, 0.0),  # +0 + (-0)
    (0.0, 0x7f00, 0x7f00, 0xff00, 0x7f00, np.inf),  # 2^254 first: inf, then inf - 2^254
]


@pytest.mark.parametrize("emulate", [True, pytest.param(False, marks=needs_hw)])
def test_measured_cases(emulate):
    acc, a1, b1, a0, b0, want = (np.array(col) for col in zip(*MEASURED))
    got = _lanes(acc, [_pair(x, y) for x, y in zip(a1, a0)],
                 [_pair(x, y) for x, y in zip(b1, b0)], emulate)
    np.testing.assert_array_equal(_bits(got), _bits(want.astype(np.float32)))


def test_emulation_nan_and_inf():
    one = 0x3f80
    got = _lanes([0.0, 0.0, 1.0, np.inf], [_pair(0x7f80, 0), _pair(0x7f80, 0x7f80),
                                           _pair(0x7fc1, 0), _pair(0, 0)],
                 [_pair(0, 0), _pair(one, 0xbf80), _pair(one, 0), _pair(0, 0)], True)
    assert np.isnan(got[:3]).all() and got[3] == np.inf


def _random_pairs(rng, n):
    """Pairs and accumulators over the ranges where the instruction's rules differ: ordinary
    values, cancellation against the accumulator and between the two products, subnormal and
    tiny values, huge products, zeros, infinities and NaNs."""
    def bf(lo, hi, size):
        e = rng.integers(lo, hi + 1, size)
        return ((rng.integers(0, 2, size) << 15) | (e << 7) | rng.integers(0, 128, size))
    k = n // 6
    parts = []
    for lo, hi in ((120, 134), (0, 70), (0, 2), (200, 254), (100, 160)):
        a = [bf(lo, hi, k) for _ in range(4)]
        acc = (rng.standard_normal(k) * 2.0 ** rng.integers(-20, 20, k)).astype(np.float32)
        parts.append((acc, a))
    a = [bf(120, 134, k) for _ in range(4)]
    a[2], a[3] = a[0], a[1] ^ 0x8000               # second product = -first
    parts.append((rng.standard_normal(k).astype(np.float32) * np.float32(1e-3), a))
    acc = np.concatenate([p[0] for p in parts])
    a1, a0, b1, b0 = (np.concatenate([p[1][i] for p in parts]) for i in range(4))
    # cancellation: acc = -(first product), slightly perturbed
    sel = rng.random(len(acc)) < 0.3
    with np.errstate(all="ignore"):
        prod = ((a1.astype(np.uint32) << 16).view(np.float32)
                * (b1.astype(np.uint32) << 16).view(np.float32))
        acc[sel] = -prod[sel] * np.float32(1 + 2.0 ** -20)
    specials = np.array([0, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x0001, 0x807f, 0x0080])
    sel = rng.random(len(acc)) < 0.02
    a1[sel] = rng.choice(specials, sel.sum())
    return acc, _pair(a1, a0), _pair(b1, b0)


@needs_hw
def test_instruction_matches_emulation_bit_for_bit():
    rng = np.random.default_rng(40)
    acc, a, b = _random_pairs(rng, 600_000)
    _same_bits(_lanes(acc, a, b, False), _lanes(acc, a, b, True))


# --- the GEMM --------------------------------------------------------------------------------

def _gemm_f32(a, b, out, alpha=1.0, emulate=False, n_threads=1):
    """out (float32, 2-D) += alpha * a @ b (bf16, 2-D, any strides) through the kernel entry
    of the fast path, which also takes a float32 out."""
    item = 2
    z = np.zeros(1, np.int64)
    k = _backend.kernels
    k.matmul_accumulate_bf16(a.view(np.uint16), z, a.strides[0] // item, a.strides[1] // item,
                             b.view(np.uint16), z, b.strides[0] // item, b.strides[1] // item,
                             out, z, out.strides[0] // 4, out.strides[1] // 4,
                             a.shape[0], b.shape[1], a.shape[1], alpha, n_threads, 0, emulate,
                             False)     # vdpbf16ps's rule on every build (aarch64's: BFDOT's)
    return out


_bound = bf16_gemm_bound


@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 9, 15), (33, 65, 17), (64, 31, 513),
                                   (9, 40, 1000)])
def test_emulation_within_bound_of_float64_oracle(shape):
    m, n, k = shape
    rng = np.random.default_rng(m * 1000 + n)
    a = rng.standard_normal((m, k)).astype(BF16)
    b = (rng.standard_normal((k, n)) * 3).astype(BF16)
    out0 = rng.standard_normal((m, n)).astype(np.float32)
    got = _gemm_f32(a, b, out0.copy(), alpha=-0.7, emulate=True)
    exact = out0.astype(np.float64) - 0.7 * (a.astype(np.float64) @ b.astype(np.float64))
    assert (np.abs(got - exact) <= _bound(a, b, out0, -0.7)).all()


def test_emulation_within_bound_with_subnormals():
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((20, 300)) * 2.0 ** -120).astype(BF16)   # many subnormals
    b = rng.standard_normal((300, 20)).astype(BF16)
    out0 = np.zeros((20, 20), np.float32)
    got = _gemm_f32(a, b, out0.copy(), emulate=True)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert (np.abs(got - exact) <= _bound(a, b, out0, 1.0)).all()


@needs_hw
@pytest.mark.parametrize("m", SIZES)
def test_hardware_matches_emulation_float32_out(m):
    rng = np.random.default_rng(m)
    for n in SIZES:
        k = int(rng.choice([1, 2, 3, 7, 8, 9, 31, 33, 255, 256, 257, 513]))
        a = rng.standard_normal((m, k)).astype(BF16)
        b = rng.standard_normal((k, n)).astype(BF16)
        out0 = rng.standard_normal((m, n)).astype(np.float32)
        hw = _gemm_f32(a, b, out0.copy(), alpha=1.25)
        em = _gemm_f32(a, b, out0.copy(), alpha=1.25, emulate=True)
        _same_bits(hw, em)


def _layouts(x):
    yield x
    yield np.asfortranarray(x)
    yield np.ascontiguousarray(x.T).T                      # transposed view
    big = np.zeros((x.shape[0] * 2, x.shape[1] * 3), x.dtype)
    big[::2, ::3] = x
    yield big[::2, ::3]                                     # strided
    r, c = x.shape
    wide = np.zeros((r, c + 1 + (c + 1) % 2), x.dtype)     # an even row stride, and rows
    wide[:, 1:c + 1] = x                                    # starting 2 bytes off a 4-byte
    yield wide[:, 1:c + 1]                                  # boundary (pairs unaligned)


@needs_hw
def test_hardware_matches_emulation_any_layout_and_batch():
    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 37, 70)).astype(BF16)    # 37 rows: 4 full 8-row panels
    b = rng.standard_normal((3, 70, 45)).astype(BF16)
    for aa in _layouts(a[1]):
        for bb in _layouts(b[1]):
            o1 = np.zeros((37, 45), BF16)
            o2 = o1.copy()
            M._matmul(aa, bb, o1, 0.5, "fast", 1)
            M._matmul(aa, bb, o2, 0.5, "fast", 1, emulate=True)
            _same_bits(o1, o2)
    o1 = rng.standard_normal((3, 37, 45)).astype(BF16)
    o2 = o1.copy()
    M._matmul(a, b, o1, 1.0, "fast", 2)
    M._matmul(a, b, o2, 1.0, "fast", 2, emulate=True)
    _same_bits(o1, o2)


@needs_hw
def test_hardware_matches_emulation_special_values():
    rng = np.random.default_rng(11)
    a = rng.standard_normal((40, 67)).astype(np.float32)
    b = rng.standard_normal((67, 50)).astype(np.float32)
    a[rng.random(a.shape) < 0.2] *= 2.0 ** -125        # subnormal in bf16 (DAZ)
    b[rng.random(b.shape) < 0.1] *= 2.0 ** -20          # products near the FTZ limit
    a[3, 5], a[7, 0], b[2, 9], b[60, 30] = np.inf, np.nan, -np.inf, 0.0
    a[10, :] = -0.0
    a, b = a.astype(BF16), b.astype(BF16)
    for out in (np.zeros((40, 50), np.float32), np.full((40, 50), -0.0, np.float32)):
        _same_bits(_gemm_f32(a, b, out.copy()), _gemm_f32(a, b, out.copy(), emulate=True))
    o1 = np.zeros((40, 50), BF16)
    o2 = o1.copy()
    M._matmul(a, b, o1, 1.0, "fast", 1)
    M._matmul(a, b, o2, 1.0, "fast", 1, emulate=True)
    _same_bits(o1, o2)


@pytest.mark.parametrize("emulate", [False, True])
def test_threads_bit_identical(emulate):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((2, 130, 300)).astype(BF16)
    b = rng.standard_normal((2, 300, 97)).astype(BF16)
    out0 = rng.standard_normal((2, 130, 97)).astype(BF16)
    results = []
    for threads in (1, 2, 3):
        out = out0.copy()
        M._matmul(a, b, out, 1.0, "fast", threads, emulate=emulate)
        results.append(out)
    for r in results[1:]:
        _same_bits(r, results[0])


def test_exact_path_unchanged(variant):
    """precision='exact': the float32 call on the same values, rounded once."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal((33, 77)).astype(BF16)
    b = rng.standard_normal((77, 65)).astype(BF16)
    out0 = rng.standard_normal((33, 65)).astype(BF16)
    out = out0.copy()
    cyattn.matmul_accumulate(a, b, out, alpha=0.3, precision="exact")
    ref = out0.astype(np.float32)
    cyattn.matmul_accumulate(a.astype(np.float32), b.astype(np.float32), ref, alpha=0.3)
    np.testing.assert_array_equal(_bits(out), _bits(ref.astype(BF16)))


def test_fast_runs_on_every_variant(variant):
    """The fast path runs everywhere (the emulation where the variant has no instruction)
    and gives the same bits as the emulation of the loaded default variant."""
    rng = np.random.default_rng(13)
    a = rng.standard_normal((17, 33)).astype(BF16)
    b = rng.standard_normal((33, 31)).astype(BF16)
    out = np.zeros((17, 31), BF16)
    cyattn.matmul_accumulate(a, b, out, precision="fast")
    ref = np.zeros((17, 31), BF16)
    M._matmul(a, b, ref, 1.0, "fast", 1, emulate=True)
    _same_bits(out, ref)


def test_default_precision():
    rng = np.random.default_rng(17)
    a = rng.standard_normal((9, 2 ** 9)).astype(BF16)
    b = rng.standard_normal((2 ** 9, 8)).astype(BF16)
    a[0, 0] = 2.0 ** -130                               # a subnormal: the paths differ here
    outs = {}
    for precision in (None, "fast", "exact"):
        outs[precision] = np.zeros((9, 8), BF16)
        cyattn.matmul_accumulate(a, b, outs[precision], precision=precision)
    # the default follows the CPU (issue 45: fast on AMD Zen 4+, exact on Intel; test_bf16_path)
    fast = _backend.bf16_fast_by_default(_backend.kernels)
    _same_bits(outs[None], outs["fast" if fast else "exact"])


def test_precision_ignored_for_other_dtypes():
    rng = np.random.default_rng(19)
    for dtype in (np.float32, np.float64, np.float16):
        a = rng.standard_normal((20, 30)).astype(dtype)
        b = rng.standard_normal((30, 10)).astype(dtype)
        outs = []
        for precision in (None, "fast", "exact"):
            out = np.zeros((20, 10), dtype)
            cyattn.matmul_accumulate(a, b, out, precision=precision)
            outs.append(out)
        for o in outs[1:]:
            np.testing.assert_array_equal(o, outs[0])
    # mixed bfloat16 and float32: computed in float32 whatever precision says
    a = rng.standard_normal((20, 30)).astype(BF16)
    b = rng.standard_normal((30, 10)).astype(np.float32)
    o1, o2 = np.zeros((20, 10), np.float32), np.zeros((20, 10), np.float32)
    cyattn.matmul_accumulate(a, b, o1, precision="fast")
    cyattn.matmul_accumulate(a, b, o2, precision="exact")
    np.testing.assert_array_equal(o1, o2)


def test_fast_alpha_infinite_and_k_zero():
    a = np.ones((3, 4), BF16)
    b = np.ones((4, 2), BF16)
    out = np.zeros((3, 2), BF16)
    cyattn.matmul_accumulate(a, b, out, alpha=np.inf, precision="fast")
    assert (out.astype(np.float32) == np.inf).all()
    out = np.ones((3, 2), BF16)
    cyattn.matmul_accumulate(a[:, :0], b[:0], out, precision="fast")
    assert (out.astype(np.float32) == 1).all()


@pytest.mark.parametrize("bad", ["FAST", "highest", "", 1, True, b"fast"])
def test_bad_precision_raises(bad):
    a = np.ones((2, 2), BF16)
    out = np.zeros((2, 2), BF16)
    before = out.copy()
    with pytest.raises(ValueError, match=r"precision must be None, 'exact' or 'fast', got"):
        cyattn.matmul_accumulate(a, a, out, precision=bad)
    np.testing.assert_array_equal(_bits(out), _bits(before))
    with pytest.raises(ValueError, match="precision"):
        cyattn.matmul_accumulate(np.ones((2, 2)), np.ones((2, 2)), np.zeros((2, 2)),
                                 precision=bad)


def test_info_names_the_bf16_path():
    line = M.default_bf16_path()
    if _backend.kernels.BF16_RULE == "arm":
        pytest.skip("aarch64: the rule is BFDOT's (tests/test_bf16_arm.py)")
    assert ("vdpbf16ps" in line) and ("emulation" not in line) == HW
    assert line.startswith("fast") == _backend.bf16_fast_by_default(_backend.kernels)


def test_fast_equals_exact_on_fma_variants_without_subnormals(variant):
    """Away from subnormals each fast step is one rounding of sum + a_k b_k, k in order, in
    blocks of KC = 256, as the float32 path's FMAs: the same bits where the variant has FMA
    (the docstring's reason for the default). The baseline variant has no FMA."""
    if variant == "baseline":
        pytest.skip("no FMA in the baseline variant: its exact path rounds each product")
    if _backend.kernels.BF16_RULE == "arm":
        pytest.skip("aarch64 builds follow BFDOT's rule (pairs summed first, rounded to odd: "
                    "tests/test_bf16_arm.py), not one rounding per product")
    rng = np.random.default_rng(23)
    for m, n, k in ((1, 1, 1), (5, 7, 3), (33, 65, 257), (100, 130, 1000), (300, 40, 64)):
        a = rng.standard_normal((m, k)).astype(BF16)
        b = rng.standard_normal((k, n)).astype(BF16)
        out0 = rng.standard_normal((m, n)).astype(BF16)
        fast, exact = out0.copy(), out0.copy()
        M._matmul(a, b, fast, 0.7, "fast", 2)
        M._matmul(a, b, exact, 0.7, "exact", 2)
        np.testing.assert_array_equal(_bits(fast), _bits(exact))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_b_packed_once_per_worker_same_bits(threads):
    """Tiles of one column range reuse B packed whole (a bf16 out: 144-row tiles); several
    column ranges and batches repack it; the bits are the one-thread emulation's either
    way."""
    rng = np.random.default_rng(29)
    for shape_a, shape_b in (((600, 300), (300, 70)), ((2, 160, 300), (2, 300, 1100))):
        a = rng.standard_normal(shape_a).astype(BF16)
        b = rng.standard_normal(shape_b).astype(BF16)
        out0 = rng.standard_normal(shape_a[:-1] + shape_b[-1:]).astype(BF16)
        o1, o2 = out0.copy(), out0.copy()
        M._matmul(a, b, o1, 1.0, "fast", threads)
        M._matmul(a, b, o2, 1.0, "fast", 1, emulate=True)
        np.testing.assert_array_equal(_bits(o1), _bits(o2))
