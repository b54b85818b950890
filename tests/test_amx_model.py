"""bfloat16 on AMX tiles, built and tested without an AMX CPU (issue 45).

* The portable model of TDPBF16PS (isa/_cyattn_amx_model.h, through the ``amx_tile_product``
  probe of every variant) against 140 tile products recorded on an Intel Xeon with AMX-BF16
  (tests/data/amx_bf16_golden.bin, from shared/amx/golden.c; 35,840 values): bit for bit for
  the input kinds whose products stay inside float32's range (kinds 0-4: normal, wide
  exponents, cancellation, subnormal-heavy, specials; 25,600 values), and non-finite wherever
  the hardware gave a non-finite value for kinds 5-6 (random bit patterns, products past
  float32's range: the hardware keeps a wider range inside; this model does too, and in fact
  matches those bits as well, which the test reports but does not require).
* bf16 ``matmul_accumulate`` on tiles through the model (``emulate="amx"``, every variant):
  within the documented bound of a float64 oracle, the tile loop's order against a NumPy
  model of it, bit-identical for 1, 2 and 3 threads, any layout, batches, bf16 out.
* On an AMX host with the amx variant loadable (``CYATTN_BACKEND=amx``; tools/amx_check.sh):
  the hardware against the recorded bits and against the model; skipped elsewhere.
"""
from pathlib import Path

import numpy as np
import pytest
from conftest import bf16_gemm_bound

from cyattn import _backend
from cyattn import matmul as M

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
GOLDEN = Path(__file__).parent / "data" / "amx_bf16_golden.bin"
IN_RANGE_KINDS = (0, 1, 2, 3, 4)


def _amx_kernels():
    """The amx variant's module where this host runs it (else None)."""
    if _backend.variant == "amx":
        return _backend.kernels
    try:
        return _backend.load_variant("amx")
    except ImportError:
        return None


AMX_K = _amx_kernels()
needs_amx = pytest.mark.skipif(AMX_K is None, reason="no AMX here: the amx variant cannot load "
                               f"({_backend.amx_status()})")


def load_golden():
    raw = GOLDEN.read_bytes()
    assert raw[:8] == b"AMXBF16G"
    n = int(np.frombuffer(raw[8:12], np.int32)[0])
    rec = 1024 * 2 + 256 * 4 * 3
    assert len(raw) == 12 + n * rec
    cases = []
    for i in range(n):
        b = raw[12 + i * rec:12 + (i + 1) * rec]
        cases.append((np.frombuffer(b[0:1024], np.uint16).copy(),
                      np.frombuffer(b[1024:2048], np.uint16).copy(),
                      np.frombuffer(b[2048:3072], np.uint32).copy(),
                      np.frombuffer(b[3072:4096], np.uint32).copy()))
    return cases


def _tile_product(kernels, a, b, c0, emulate):
    out = np.empty(256, np.uint32)
    kernels.amx_tile_product(a, b, c0, out, emulate)
    return out


def _check_golden(kernels, emulate):
    """(exact matches, values) per kind; asserts the contract."""
    cases = load_golden()
    assert len(cases) == 140
    exact = [0] * 7
    for i, (a, b, c0, want) in enumerate(cases):
        kind = i % 7
        got = _tile_product(kernels, a, b, c0, emulate)
        gf, wf = got.view(np.float32), want.view(np.float32)
        same = (got == want) | (np.isnan(gf) & np.isnan(wf))
        exact[kind] += int(same.sum())
        if kind in IN_RANGE_KINDS:
            assert same.all(), (i, kind, np.flatnonzero(~same)[:5])
        else:
            assert not np.isfinite(gf[~np.isfinite(wf)]).any(), (i, kind)
    return exact


@pytest.mark.parametrize("name", _backend.available_variants())
def test_model_matches_recorded_hardware_bits(name):
    exact = _check_golden(_backend.load_variant(name), emulate=True)
    assert sum(exact[k] for k in IN_RANGE_KINDS) == 25600
    print(f"{name}: model == recorded bits for {sum(exact)} of 35840 values "
          f"(per kind: {exact})")


def test_probe_checks_sizes():
    k = _backend.kernels
    with pytest.raises(ValueError, match="512 elements"):
        k.amx_tile_product(np.zeros(10, np.uint16), np.zeros(512, np.uint16),
                           np.zeros(256, np.uint32), np.zeros(256, np.uint32), True)


def test_model_semantics_single_cases():
    """Two partial sums from zero (even and odd k), then C + (even + odd); DAZ; FTZ."""
    k = _backend.kernels
    one, tiny_in, big = 0x3F80, 0x0040, 0x4B80          # 1.0, a bf16 subnormal, 2^24

    def run(a_row, b_pairs, c=0.0):
        a = np.zeros(512, np.uint16)
        b = np.zeros(512, np.uint16)
        a[:len(a_row)] = a_row                          # row 0: element 2k + p
        for kk, (e, o) in enumerate(b_pairs):           # row kk, column 0: (even, odd)
            b[kk * 32], b[kk * 32 + 1] = e, o
        c0 = np.zeros(256, np.float32)
        c0[0] = c
        return _tile_product(k, a, b, c0.view(np.uint32), True).view(np.float32)[0]

    # even chain: 2^24, + 1 (rounds back to 2^24), + 1 again: 2^24; odd chain: 0 + 1 + 1 = 2;
    # then 2^24 + 2, exact. One chain of steps over k (vdpbf16ps's order) would give 2^24.
    assert run([big, one, one, one, one, one], [(one, 0), (one, one), (one, one)]) == 2 ** 24 + 2
    assert run([tiny_in, one], [(one, one)]) == 1.0          # subnormal input read as zero
    assert run([0, 0], [(0, 0)], c=2.0 ** -130) == 0.0      # subnormal C read as zero


# --- bf16 matmul_accumulate on tiles ---------------------------------------------------------

_bound = bf16_gemm_bound


def _tiles(a, b, out, alpha=1.0, n_threads=1, kernels=None, emulate=True):
    """out (float32, 2-D) += alpha * a @ b (bf16, 2-D, any strides) through the kernel entry of
    the tile path (the public call takes a bf16 out with bf16 operands): the model unless
    ``emulate`` is False."""
    z = np.zeros(1, np.int64)
    k = kernels or _backend.kernels
    k.matmul_accumulate_amx(a.view(np.uint16), z, a.strides[0] // 2, a.strides[1] // 2,
                            b.view(np.uint16), z, b.strides[0] // 2, b.strides[1] // 2,
                            out, z, out.strides[0] // 4, out.strides[1] // 4,
                            a.shape[0], b.shape[1], a.shape[1], alpha, n_threads, 0, emulate)
    return out


def _numpy_tiles(a, b, out0, alpha):
    """The tile loop's sums in NumPy float32 (no subnormals in the data): per 32-k chunk the
    even and odd products summed from zero in k order, C += (even + odd), then
    out = fma(alpha, C, out) (float64 then float32: exact for the fma of float32 values)."""
    m, k = a.shape
    kp = -(-k // 32) * 32
    a32 = np.zeros((m, kp), np.float32)
    a32[:, :k] = a.astype(np.float32)
    b32 = np.zeros((kp, b.shape[1]), np.float32)
    b32[:k] = b.astype(np.float32)
    c = np.zeros((m, b.shape[1]), np.float32)
    for k0 in range(0, kp, 32):
        even = np.zeros_like(c)
        odd = np.zeros_like(c)
        for q in range(16):
            ke, ko = k0 + 2 * q, k0 + 2 * q + 1
            even = even + a32[:, ke:ke + 1] * b32[ke:ke + 1]
            odd = odd + a32[:, ko:ko + 1] * b32[ko:ko + 1]
        c = c + (even + odd)
    return (np.float64(np.float32(alpha)) * c.astype(np.float64) + out0.astype(np.float64)).astype(
        np.float32)


@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 9, 15), (33, 65, 17), (64, 31, 513),
                                   (40, 33, 64), (9, 40, 1000)])
def test_tiles_within_bound_of_float64_oracle(shape):
    m, n, k = shape
    rng = np.random.default_rng(m * 1000 + n)
    a = rng.standard_normal((m, k)).astype(BF16)
    b = (rng.standard_normal((k, n)) * 3).astype(BF16)
    out0 = rng.standard_normal((m, n)).astype(np.float32)
    got = _tiles(a, b, out0.copy(), alpha=-0.7)
    exact = out0.astype(np.float64) - 0.7 * (a.astype(np.float64) @ b.astype(np.float64))
    assert (np.abs(got - exact) <= _bound(a, b, out0, -0.7)).all()
    np.testing.assert_array_equal(got.view(np.uint32),
                                  _numpy_tiles(a, b, out0, -0.7).view(np.uint32))


def test_tiles_within_bound_with_subnormals():
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((37, 70)) * 2.0 ** -120).astype(BF16)
    b = (rng.standard_normal((70, 35)) * 2.0 ** -8).astype(BF16)
    out0 = np.zeros((37, 35), np.float32)
    got = _tiles(a, b, out0.copy())
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert (np.abs(got - exact) <= _bound(a, b, out0, 1.0)).all()


@pytest.mark.parametrize("shape", [(300, 70, 100), (33, 130, 65), (600, 40, 40)])
def test_tiles_bit_identical_across_threads(shape):
    m, n, k = shape
    rng = np.random.default_rng(k)
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((k, n)).astype(BF16)
    outs = [_tiles(a, b, np.ones((m, n), np.float32), 0.5, t) for t in (1, 2, 3)]
    for o in outs[1:]:
        np.testing.assert_array_equal(outs[0].view(np.uint32), o.view(np.uint32))
    # batched, bf16 out, through matmul_accumulate's switch to the model
    a2 = rng.standard_normal((2, m, k)).astype(BF16)
    o16 = [M._matmul(a2, b, np.ones((2, m, n), BF16), 0.5, "fast", t, emulate="amx")
           for t in (1, 2, 3)]
    for o in o16[1:]:
        np.testing.assert_array_equal(o16[0].view(np.uint16), o.view(np.uint16))


def test_tiles_any_layout_batch_and_bf16_out():
    rng = np.random.default_rng(11)
    a = rng.standard_normal((45, 50)).astype(BF16)
    b = rng.standard_normal((50, 37)).astype(BF16)
    want = _tiles(a, b, np.zeros((45, 37), np.float32))
    got = _tiles(np.asfortranarray(a), np.asfortranarray(b), np.zeros((45, 37), np.float32),
                 n_threads=2)
    np.testing.assert_array_equal(want.view(np.uint32), got.view(np.uint32))
    out_t = np.zeros((37, 45), np.float32).T                                # strided out
    _tiles(a, b, out_t)
    np.testing.assert_array_equal(want.view(np.uint32),
                                  np.ascontiguousarray(out_t).view(np.uint32))
    # bf16 out, batched: accumulated in float32 over all of K, rounded once
    a3 = np.stack([a, -a, a[::-1]])
    o16 = np.full((3, 45, 37), 0.25, BF16)
    M._matmul(a3, b, o16, 1.0, "fast", 2, emulate="amx")
    for i in range(3):
        ref = _tiles(np.ascontiguousarray(a3[i]), b, np.full((45, 37), 0.25, np.float32))
        np.testing.assert_array_equal(o16[i].view(np.uint16), ref.astype(BF16).view(np.uint16))


def test_tiles_specials_and_empty():
    a = np.array([[np.inf, 1.0], [np.nan, 0.0]], BF16)
    b = np.array([[1.0, 0.0], [2.0, 3.0]], BF16)
    got = _tiles(a, b, np.zeros((2, 2), np.float32))
    assert np.isinf(got[0, 0]) and np.isnan(got[0, 1]) and np.isnan(got[1]).all()
    out = np.ones((3, 0), BF16)
    M._matmul(np.zeros((3, 4), BF16), np.zeros((4, 0), BF16), out, 1.0, "fast", 1, "amx")
    out = np.ones((3, 2), BF16)
    M._matmul(np.zeros((3, 0), BF16), np.zeros((0, 2), BF16), out, 1.0, "fast", 1, "amx")
    assert (out == 1).all()


def test_bad_emulate_value():
    with pytest.raises(ValueError, match="emulate"):
        M._matmul(np.zeros((2, 2)), np.zeros((2, 2)), np.zeros((2, 2)), 1.0, None, 1,
                  emulate="tiles")


def test_forcing_amx_without_amx_is_a_clear_import_error():
    if AMX_K is not None:
        pytest.skip("this host runs the amx variant")
    with pytest.raises(ImportError) as err:
        _backend.load_variant("amx")
    msg = str(err.value)
    assert "amx" in msg
    feats = set(_backend.cpu_features())
    if "amx_bf16" not in feats and _backend._built("amx"):
        assert "amx_bf16" in msg          # names the missing feature


def test_amx_never_the_default():
    assert "amx" not in _backend.available_variants()
    assert "amx" in _backend.OPT_IN


# --- on an AMX host ----------------------------------------------------------------------

@needs_amx
def test_hardware_matches_recorded_bits():
    exact = _check_golden(AMX_K, emulate=False)
    print(f"hardware == recorded bits for {sum(exact)} of 35840 values (per kind: {exact})")


@needs_amx
@pytest.mark.parametrize("shape", [(1, 1, 1), (33, 65, 17), (64, 31, 513), (300, 70, 100),
                                   (128, 128, 1024)])
def test_hardware_matches_model(shape, monkeypatch):
    m, n, k = shape
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((k, n)).astype(BF16)
    a[0, 0] = 2.0 ** -130
    for threads in (1, 2):
        hw = _tiles(a, b, np.ones((m, n), np.float32), 0.5, threads, AMX_K, emulate=False)
        model = _tiles(a, b, np.ones((m, n), np.float32), 0.5, threads, AMX_K, emulate=True)
        np.testing.assert_array_equal(hw.view(np.uint32), model.view(np.uint32))
    # bf16 out through matmul_accumulate: the default (precision=None) in the amx variant is
    # the tile path on the hardware, and gives the model's bits
    monkeypatch.setattr(_backend, "kernels", AMX_K)
    dflt = M.matmul_accumulate(a, b, np.ones((m, n), BF16), alpha=0.5)
    model16 = M._matmul(a, b, np.ones((m, n), BF16), 0.5, "fast", 2, emulate="amx")
    np.testing.assert_array_equal(dflt.view(np.uint16), model16.view(np.uint16))
