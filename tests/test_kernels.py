"""The compiled kernels against the pure-Python oracle (and NumPy float64 for big sizes).

Every public function x dtype x compiled variant, on sizes either side of the vector and block
widths, plus the documented semantics: masks, fully masked rows, causal alignment, GQA, lse,
scale, empty dimensions, broadcasting, axis, out=, memory layouts, NaN/inf and exp accuracy.
Tolerances come from conftest.TOLERANCES (via ``assert_close``/``tol``) only.
"""
import functools
import importlib
import math
import pickle
import warnings

import numpy as np
import pytest
from conftest import (
    assert_close,
    call_checked,
    grid_values,
    layout_variants,
    no_warnings,
    numpy_matmul,
    numpy_sdpa,
    oracle_matmul,
    oracle_sdpa,
    oracle_softmax,
)

import cyattn
from cyattn import _backend

SIZES = (1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 97, 127, 128, 129)
DTYPES = (np.float32, np.float64, np.float16)
DTYPE_IDS = ("f32", "f64", "f16")
NATIVE = (np.float32, np.float64)
NATIVE_IDS = ("f32", "f64")
ORACLE_BUDGET = 200_000      # multiply-adds per oracle call; larger problems use NumPy float64

softmax_fns = pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
all_dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
native_dtypes = pytest.mark.parametrize("dtype", NATIVE, ids=NATIVE_IDS)


def _sm(log):
    return cyattn.log_softmax if log else cyattn.softmax


def sdpa(*args, **kwargs):
    return call_checked(cyattn.scaled_dot_product_attention, *args, **kwargs)


# ------------------------------------------------------------------------------------------
# Sizes either side of vector and block widths
# ------------------------------------------------------------------------------------------

@softmax_fns
@pytest.mark.parametrize("n", SIZES)
@all_dtypes
def test_softmax_sizes(variant, dtype, n, log):
    rng = np.random.default_rng(1000 + n)
    x = (rng.standard_normal((5, n)) * 4).astype(dtype)
    x[3, rng.random(n) < 0.3] = -np.inf              # some removed entries
    x[4, :] = -np.inf                                 # fully masked row without a mask
    fn = _sm(log)

    got = call_checked(fn, x)
    assert got.dtype == dtype and got.shape == x.shape
    assert_close(got, oracle_softmax(x, log=log), dtype, k=n)

    keep = rng.random((5, n)) < 0.7
    keep[1] = False                                   # fully masked row (bool)
    got = call_checked(fn, x, mask=keep)
    assert got.dtype == dtype
    assert_close(got, oracle_softmax(x, mask=keep, log=log), dtype, k=n)

    add = rng.standard_normal((5, n)).astype(dtype)
    add[rng.random((5, n)) < 0.3] = -np.inf
    add[2] = -np.inf                                  # fully masked row (float)
    got = call_checked(fn, x, mask=add)
    assert_close(got, oracle_softmax(x, mask=add, log=log), dtype, k=n)
    if not log:
        sums = got.astype(np.float64).sum(axis=-1)
        assert sums[2] == 0 and sums[4] == 0


MM_SHAPES = [(n, n, n) for n in SIZES] + [
    (1, 129, 7), (129, 1, 65), (65, 17, 128), (3, 97, 33), (64, 9, 127), (17, 128, 1),
    (128, 63, 2), (9, 2, 129), (33, 65, 64), (2, 3, 97), (97, 31, 15), (8, 16, 63),
]


@functools.cache
def _mm_case(M, N, K):
    rng = np.random.default_rng(M * 10007 + N * 101 + K)
    a, b, out = grid_values(rng, (M, K)), grid_values(rng, (K, N)), grid_values(rng, (M, N))
    alpha = -0.75
    if M * N * K <= ORACLE_BUDGET:
        ref = oracle_matmul(a, b, out, alpha)
    else:
        # Grid inputs (multiples of 2**-8 in [-2, 2]): every product is a multiple of 2**-16
        # below 4 and every sum stays below 2**10, so the float64 matmul is exact and equals
        # the oracle's exactly rounded result (test_grid_matmul_reference_is_exact checks it).
        ref = numpy_matmul(a, b, out, alpha)
    return a, b, out, alpha, ref


def test_grid_matmul_reference_is_exact():
    rng = np.random.default_rng(5)
    a, b, out = grid_values(rng, (40, 129)), grid_values(rng, (129, 37)), grid_values(rng, (40, 37))
    np.testing.assert_array_equal(numpy_matmul(a, b, out, -0.75),
                                  oracle_matmul(a, b, out, -0.75))


@pytest.mark.parametrize("shape", MM_SHAPES, ids=lambda s: "x".join(map(str, s)))
@all_dtypes
def test_matmul_sizes(variant, dtype, shape):
    M, N, K = shape
    a, b, out0, alpha, ref = _mm_case(M, N, K)
    a, b, out = a.astype(dtype), b.astype(dtype), out0.astype(dtype)
    res = call_checked(cyattn.matmul_accumulate, a, b, out, alpha=alpha)
    assert res is out and out.dtype == dtype
    assert_close(out, ref, dtype, k=K)


@pytest.mark.parametrize("shape", [(64, 64, 64), (13, 50, 70), (5, 64, 256), (3, 40, 1),
                                   (96, 96, 96), (7, 24, 9), (1, 300, 600), (3, 70, 513),
                                   (4, 64, 1000), (2, 1000, 300), (1, 1, 257), (1, 600, 70),
                                   (1, 512, 300), (1, 1100, 40), (15, 1536, 384),
                                   (24, 384, 1536), (17, 1152, 300), (9, 100, 300),
                                   (25, 384, 384)],
                         ids=lambda s: "x".join(map(str, s)))
@native_dtypes
def test_matmul_unpacked_small_path_same_bits(variant, dtype, shape):
    # Small products of row-major operands skip packing (gemm_small, with zero rows and a
    # packed last panel at the edges; one row runs whole tiles of accumulators along the row),
    # and so do products of up to 24 rows with K > KC (in KC blocks) in the avx512 variant; an A
    # whose columns are not adjacent takes the packed path. Both must sum every element in the
    # same order, so the bits are equal.
    M, N, K = shape
    rng = np.random.default_rng(M * 7 + N * 3 + K)
    a = rng.standard_normal((M, K)).astype(dtype)
    b = rng.standard_normal((K, N)).astype(dtype)
    out0 = rng.standard_normal((M, N)).astype(dtype)
    a_cols_apart = np.zeros((M, 2 * K), dtype)[:, ::2]
    a_cols_apart[...] = a
    direct, packed = out0.copy(), out0.copy()
    cyattn.matmul_accumulate(a, b, direct, alpha=-0.75, n_threads=1)
    cyattn.matmul_accumulate(a_cols_apart, b, packed, alpha=-0.75, n_threads=1)
    np.testing.assert_array_equal(direct, packed)
    assert_close(direct, numpy_matmul(a, b, out0, -0.75), dtype, k=K)


@pytest.mark.parametrize("shape", [(1, 1, 1), (15, 1152, 384), (12, 384, 1536), (7, 33, 600),
                                   (150, 4100, 70), (300, 40, 257), (2, 3, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_matmul_with_b_packed_once_same_bits(variant, shape):
    # The encoder packs its weights once (matmul._PackedB: every KC block of rows as the
    # variant's panels) and multiplies by them many times (_matmul_packed). The panels are
    # those matmul_accumulate packs per call, so the bits must be equal, for any strides of B
    # and any thread count; the packed data is read-only.
    from cyattn.matmul import _matmul_packed, _PackedB
    M, N, K = shape
    rng = np.random.default_rng(M + N + K)
    a = rng.standard_normal((M, K)).astype(np.float32)
    for b in (rng.standard_normal((K, N)).astype(np.float32),
              rng.standard_normal((N, K)).astype(np.float32).T):
        packed = _PackedB(b)
        assert not packed.data.flags.writeable
        out0 = rng.standard_normal((M, N)).astype(np.float32)
        for n_threads in (1, 2, 3):
            expected, got = out0.copy(), out0.copy()
            cyattn.matmul_accumulate(a, b, expected, n_threads=n_threads)
            assert _matmul_packed(a, packed, got, n_threads) is got
            np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(packed.unpacked(), b)        # the layout, read back
        again = pickle.loads(pickle.dumps(packed))                 # a pickle holds B itself
        assert again.kernels is _backend.kernels
        np.testing.assert_array_equal(again.data, packed.data)
    with pytest.raises(TypeError, match="2-D float32"):
        _PackedB(b.astype(np.float64))
    with pytest.raises(ValueError, match=rf"packed \({K}, {N}\) product"):
        _matmul_packed(a[:, :K - 1] if K > 1 else a.astype(np.float64), packed, out0)


ATT_COMBOS = [  # (L, S, E, Ev)
    (1, 1, 1, 1), (2, 3, 7, 8), (3, 2, 8, 9), (7, 9, 15, 16), (8, 17, 16, 15),
    (9, 31, 17, 7), (15, 16, 31, 33), (16, 15, 33, 31), (17, 33, 9, 8), (31, 7, 63, 2),
    (33, 64, 3, 1), (63, 65, 8, 9), (64, 63, 9, 8), (65, 64, 7, 16), (97, 17, 16, 3),
    (127, 8, 33, 2), (128, 31, 1, 17), (129, 128, 2, 3), (65, 129, 1, 1), (129, 9, 32, 129),
    (2, 3, 129, 64), (3, 2, 128, 65), (5, 4, 127, 97), (4, 5, 97, 128), (130, 66, 4, 5),
]
ATT_MODES = ("plain", "bool", "float", "causal_tl", "causal_br", "causal_and_bool")


@functools.cache
def _att_case(L, S, E, Ev, mode):
    assert L * S * (E + Ev) <= ORACLE_BUDGET
    rng = np.random.default_rng(L * 1_000_003 + S * 1009 + E * 31 + Ev)
    q, k, v = grid_values(rng, (L, E)), grid_values(rng, (S, E)), grid_values(rng, (S, Ev))
    kw = {}
    if mode in ("bool", "causal_and_bool"):
        mask = rng.random((L, S)) < 0.6
        mask[L // 2] = False                      # a fully masked row
        kw["attn_mask"] = mask
    if mode == "float":
        mask = grid_values(rng, (L, S), -4, 4, 0.5)
        mask[rng.random((L, S)) < 0.3] = -np.inf
        mask[L - 1] = -np.inf                     # a fully masked row
        kw["attn_mask"] = mask
    if mode.startswith("causal"):
        kw["is_causal"] = True
        kw["causal_alignment"] = "bottom_right" if mode == "causal_br" else "top_left"
    ref = oracle_sdpa(q, k, v, kw.get("attn_mask"), kw.get("is_causal", False), None,
                      kw.get("causal_alignment", "top_left"))
    return q, k, v, kw, ref


@pytest.mark.parametrize("combo", ATT_COMBOS, ids=lambda c: "L{}S{}E{}Ev{}".format(*c))
@all_dtypes
def test_sdpa_sizes(variant, dtype, combo):
    L, S, E, Ev = combo
    for mode in ATT_MODES:
        q, k, v, kw, (ref_out, ref_lse) = _att_case(L, S, E, Ev, mode)
        if "attn_mask" in kw and kw["attn_mask"].dtype != np.bool_:
            kw = dict(kw, attn_mask=kw["attn_mask"].astype(dtype))
        out, lse = sdpa(q.astype(dtype), k.astype(dtype), v.astype(dtype), return_lse=True, **kw)
        assert out.dtype == dtype and lse.dtype == dtype
        assert out.shape == (L, Ev) and lse.shape == (L,)
        assert_close(out, ref_out, dtype, k=E + S, err_msg=mode)
        assert_close(lse, ref_lse, dtype, k=E + S, err_msg=mode)


# ------------------------------------------------------------------------------------------
# Larger sizes against NumPy float64
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(300, 257, 260), (2, 4100, 3), (150, 30, 600), (5, 2, 1)],
                         ids=lambda s: "x".join(map(str, s)))
@all_dtypes
def test_matmul_large_vs_numpy(variant, dtype, shape):
    M, N, K = shape
    rng = np.random.default_rng(M + N + K)
    a = rng.standard_normal((M, K)).astype(dtype)
    b = rng.standard_normal((K, N)).astype(dtype)
    out = rng.standard_normal((M, N)).astype(dtype)
    ref = numpy_matmul(a, b, out, 0.5)
    call_checked(cyattn.matmul_accumulate, a, b, out, alpha=0.5)
    assert_close(out, ref, dtype, k=K)


@pytest.mark.parametrize("mode", ["plain", "causal_br", "bool", "float"])
@all_dtypes
def test_sdpa_large_vs_numpy(variant, dtype, mode):
    rng = np.random.default_rng(7)
    B, H, L, S, E, Ev = 2, 2, 300, 300, 64, 48
    if mode == "causal_br":
        S = 320
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, H, S, E)).astype(dtype)
    v = rng.standard_normal((B, H, S, Ev)).astype(dtype)
    kw = {}
    if mode == "causal_br":
        kw = {"is_causal": True, "causal_alignment": "bottom_right"}
    elif mode == "bool":
        kw = {"attn_mask": rng.random((B, 1, L, S)) < 0.5}
    elif mode == "float":
        kw = {"attn_mask": rng.standard_normal((L, S)).astype(dtype)}
    ref_out, ref_lse = numpy_sdpa(q, k, v, kw.get("attn_mask"), kw.get("is_causal", False),
                                  causal_alignment=kw.get("causal_alignment", "top_left"))
    out, lse = sdpa(q, k, v, return_lse=True, **kw)
    assert_close(out, ref_out, dtype, k=E + S)
    assert_close(lse, ref_lse, dtype, k=E + S)


@pytest.mark.parametrize("L,S,E,Ev,kw", [
    (5, 7, 300, 4, {}),                                               # E > KC: split QK^T depth
    (3, 5, 8, 4100, {}),                                              # Ev > NC: split P V width
    (300, 100, 16, 8, {"is_causal": True, "causal_alignment": "bottom_right"}),   # L > S
    (100, 300, 520, 8, {"is_causal": True}),                          # S > KC, causal
], ids=["E300", "Ev4100", "L300S100_br", "S300E520_tl"])
@native_dtypes
def test_sdpa_wide_vs_numpy(variant, dtype, L, S, E, Ev, kw):
    rng = np.random.default_rng(L + S + E + Ev)
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in ((L, E), (S, E), (S, Ev)))
    ref_out, ref_lse = numpy_sdpa(q, k, v, **kw)
    out, lse = sdpa(q, k, v, return_lse=True, **kw)
    assert_close(out, ref_out, dtype, k=E + S)
    assert_close(lse, ref_lse, dtype, k=E + S)


def test_sdpa_long_keys_vs_numpy(variant):
    """S beyond the packing width NC of the GEMM (4032 columns)."""
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal(s) for s in ((3, 8), (4100, 8), (4100, 5)))
    ref_out, ref_lse = numpy_sdpa(q, k, v)
    out, lse = sdpa(q, k, v, return_lse=True)
    assert_close(out, ref_out, np.float64, k=4108)
    assert_close(lse, ref_lse, np.float64, k=4108)


# ------------------------------------------------------------------------------------------
# Masks, fully masked rows, causal
# ------------------------------------------------------------------------------------------

@softmax_fns
@native_dtypes
def test_softmax_fully_masked_rows(variant, dtype, log):
    x = np.array([[1.0, 2.0, 3.0], [-np.inf, -np.inf, -np.inf], [0.5, np.nan, 1.0]], dtype)
    fill = -np.inf if log else 0.0
    with no_warnings():
        got = call_checked(_sm(log), x, mask=np.array([[False] * 3, [True] * 3, [False] * 3]))
        np.testing.assert_array_equal(got, np.full((3, 3), fill, dtype))
        got = call_checked(_sm(log), x, mask=np.full(3, -np.inf, dtype))
        np.testing.assert_array_equal(got[:2], np.full((2, 3), fill, dtype))
        assert np.isnan(got[2]).all()                 # NaN + -inf is NaN: a NaN row
        got = call_checked(_sm(log), x[1:2])
        np.testing.assert_array_equal(got, np.full((1, 3), fill, dtype))


@native_dtypes
def test_softmax_bool_mask_never_reads_masked_entries(variant, dtype):
    x = np.array([[1.0, np.nan, 2.0, np.inf, -3.0]], dtype)
    keep = np.array([True, False, True, False, True])
    got = call_checked(cyattn.softmax, x, mask=keep)
    exp = oracle_softmax(x, mask=keep)
    assert got[0, 1] == 0 and got[0, 3] == 0
    assert_close(got, exp, dtype)
    got = call_checked(cyattn.log_softmax, x, mask=keep)
    assert_close(got, oracle_softmax(x, mask=keep, log=True), dtype)


@native_dtypes
def test_softmax_float_mask_is_added(variant, dtype):
    x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype)
    add = np.array([0.0, -1e9, np.finfo(dtype).min, -np.inf], dtype)
    got = call_checked(cyattn.softmax, x, mask=add)
    np.testing.assert_array_equal(got, np.array([[1, 0, 0, 0]], dtype))
    got = call_checked(cyattn.softmax, x, mask=np.array([0.0, 0.0, 0.0, -1.0], dtype))
    assert_close(got, oracle_softmax(x, mask=np.array([0.0, 0.0, 0.0, -1.0], dtype)), dtype)


@native_dtypes
def test_sdpa_fully_masked_rows(variant, dtype):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in ((4, 5), (6, 5), (6, 3)))
    keep = np.ones((4, 6), bool)
    keep[1] = False
    add = np.zeros((4, 6), dtype)
    add[2] = -np.inf
    with no_warnings():
        for mask, row in ((keep, 1), (add, 2)):
            out, lse = sdpa(q, k, v, mask, return_lse=True)
            np.testing.assert_array_equal(out[row], 0)
            assert lse[row] == -np.inf
            ref_out, ref_lse = oracle_sdpa(q, k, v, mask)
            assert_close(out, ref_out, dtype, k=11)
            assert_close(lse, ref_lse, dtype, k=11)
        # bottom_right with L > S: the first L - S rows see no key
        out, lse = sdpa(q, k[:2], v[:2], is_causal=True, causal_alignment="bottom_right",
                        return_lse=True)
        np.testing.assert_array_equal(out[:2], 0)
        np.testing.assert_array_equal(lse[:2], -np.inf)
        assert np.isfinite(out[2:]).all()


CAUSAL_SHAPES = [(5, 9), (9, 5), (7, 7), (70, 3), (3, 70), (66, 130), (130, 66), (1, 64)]


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("LS", CAUSAL_SHAPES, ids=lambda t: "L{}S{}".format(*t))
@native_dtypes
def test_sdpa_causal(variant, dtype, LS, align):
    L, S = LS
    rng = np.random.default_rng(L * 1000 + S)
    E, Ev = 6, 5
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in ((2, L, E), (2, S, E), (2, S, Ev)))
    keep = rng.random((2, L, S)) < 0.7
    add = rng.standard_normal((L, S)).astype(dtype)
    add[rng.random((L, S)) < 0.2] = -np.inf
    for mask in (None, keep, add):
        out, lse = sdpa(q, k, v, mask, True, causal_alignment=align, return_lse=True)
        ref_out, ref_lse = oracle_sdpa(q, k, v, mask, True, causal_alignment=align)
        assert_close(out, ref_out, dtype, k=E + S)
        assert_close(lse, ref_lse, dtype, k=E + S)
    # is_causal AND a bool mask == the combined bool mask (equal up to rounding: the causal
    # path sums each row's softmax over the causal prefix only, so the partial sums differ)
    off = 0 if align == "top_left" else S - L
    causal = np.arange(S)[None, :] <= np.arange(L)[:, None] + off
    a, lse_a = sdpa(q, k, v, keep, True, causal_alignment=align, return_lse=True)
    b, lse_b = sdpa(q, k, v, keep & causal, return_lse=True)
    assert_close(a, b, dtype, k=E + S)
    assert_close(lse_a, lse_b, dtype, k=E + S)
    np.testing.assert_array_equal(a == 0, b == 0)


def test_causal_alignment_equal_lengths_agree(variant):
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((3, 70, 8)) for _ in range(3))
    a = sdpa(q, k, v, is_causal=True)
    b = sdpa(q, k, v, is_causal=True, causal_alignment="bottom_right")
    np.testing.assert_array_equal(a, b)
    # row 0 sees only key 0
    np.testing.assert_array_equal(a[:, 0], v[:, 0])


# ------------------------------------------------------------------------------------------
# GQA, lse, scale
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("hkv", [4, 2, 1])
@all_dtypes
def test_sdpa_gqa(variant, dtype, hkv):
    rng = np.random.default_rng(hkv)
    B, Hq, L, S, E, Ev = 2, 4, 5, 7, 8, 3
    q = grid_values(rng, (B, Hq, L, E)).astype(dtype)
    k = grid_values(rng, (B, hkv, S, E)).astype(dtype)
    v = grid_values(rng, (B, hkv, S, Ev)).astype(dtype)
    keep = rng.random((B, 1, L, S)) < 0.7
    for kw in ({}, {"attn_mask": keep}, {"is_causal": True, "causal_alignment": "bottom_right"}):
        out, lse = sdpa(q, k, v, enable_gqa=True, return_lse=True, **kw)
        assert out.shape == (B, Hq, L, Ev) and out.dtype == dtype
        rep = Hq // hkv
        out2, lse2 = sdpa(q, np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1),
                          return_lse=True, **kw)
        np.testing.assert_array_equal(out, out2)
        np.testing.assert_array_equal(lse, lse2)
        ref_out, ref_lse = oracle_sdpa(q, k, v, kw.get("attn_mask"), kw.get("is_causal", False),
                                       None, kw.get("causal_alignment", "top_left"),
                                       enable_gqa=True)
        assert_close(out, ref_out, dtype, k=E + S)
        assert_close(lse, ref_lse, dtype, k=E + S)


def test_sdpa_gqa_broadcast_kv_batch(variant):
    rng = np.random.default_rng(11)
    q = rng.standard_normal((3, 4, 5, 6))
    k = rng.standard_normal((2, 7, 6))          # no batch dim, 2 kv heads
    v = rng.standard_normal((1, 2, 7, 4))
    out = sdpa(q, k, v, enable_gqa=True)
    ref, _ = oracle_sdpa(q, k[None], v, enable_gqa=True)
    assert out.shape == (3, 4, 5, 4)
    assert_close(out, ref, np.float64, k=13)


@native_dtypes
def test_sdpa_lse_matches_oracle(variant, dtype):
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in ((6, 4), (9, 4), (9, 2)))
    keep = rng.random((6, 9)) < 0.5
    keep[0] = False
    q[3, 1] = np.nan
    out, lse = sdpa(q, k, v, keep, return_lse=True, scale=0.7)
    ref_out, ref_lse = oracle_sdpa(q, k, v, keep, scale=0.7)
    assert lse[0] == -np.inf and np.isnan(lse[3]) and np.isnan(out[3]).all()
    assert_close(lse, ref_lse, dtype, k=13)
    assert_close(out, ref_out, dtype, k=13)
    # lse is the log-sum-exp of the scaled, masked scores
    s = 0.7 * q.astype(np.float64) @ k.astype(np.float64).T
    for i in (1, 2, 4, 5):
        if keep[i].any():
            assert_close(lse[i], np.log(np.exp(s[i][keep[i]]).sum()), dtype, k=13)


@pytest.mark.parametrize("scale", [0.0, 0.5, 2.0, -1.0, 1e-3])
@native_dtypes
def test_sdpa_explicit_scale(variant, dtype, scale):
    rng = np.random.default_rng(13)
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in ((2, 5, 4), (2, 6, 4), (2, 6, 3)))
    add = rng.standard_normal((5, 6)).astype(dtype)
    for mask in (None, add):
        out, lse = sdpa(q, k, v, mask, scale=scale, return_lse=True)
        ref_out, ref_lse = oracle_sdpa(q, k, v, mask, scale=scale)
        assert_close(out, ref_out, dtype, k=10)
        assert_close(lse, ref_lse, dtype, k=10)
    # scale 0: weights are softmax(mask) (the scale never multiplies the mask)
    if scale == 0.0:
        out = sdpa(q, k, v, scale=0.0)
        assert_close(out, np.broadcast_to(v.astype(np.float64).mean(axis=1, keepdims=True),
                                          out.shape), dtype, k=6)
        out = sdpa(q, k, v, add, scale=0.0)
        w = np.exp(add.astype(np.float64))
        w /= w.sum(axis=-1, keepdims=True)
        assert_close(out, w @ v.astype(np.float64), dtype, k=10)


def test_sdpa_default_scale(variant):
    rng = np.random.default_rng(14)
    q, k, v = (rng.standard_normal(s) for s in ((5, 9), (6, 9), (6, 3)))
    np.testing.assert_array_equal(sdpa(q, k, v), sdpa(q, k, v, scale=1 / 3))


# ------------------------------------------------------------------------------------------
# Empty dimensions
# ------------------------------------------------------------------------------------------

@all_dtypes
def test_sdpa_e_zero(variant, dtype):
    rng = np.random.default_rng(15)
    q, k = np.zeros((2, 3, 0), dtype), np.zeros((2, 5, 0), dtype)
    v = rng.standard_normal((2, 5, 4)).astype(dtype)
    mean = np.broadcast_to(v.astype(np.float64).mean(axis=1, keepdims=True), (2, 3, 4))
    for scale in (None, 0.0, 3.0):
        out, lse = sdpa(q, k, v, scale=scale, return_lse=True)
        assert out.shape == (2, 3, 4) and out.dtype == dtype
        assert_close(out, mean, dtype, k=5)
        assert_close(lse, np.full((2, 3), np.log(5.0)), dtype, k=5)
        ref_out, ref_lse = oracle_sdpa(q, k, v, scale=scale)
        assert_close(out, ref_out, dtype, k=5)
        assert_close(lse, ref_lse, dtype, k=5)
    keep = np.array([True, False, True, False, False])
    out = sdpa(q, k, v, keep)
    assert_close(out, np.broadcast_to(v[:, [0, 2]].astype(np.float64).mean(axis=1,
                                                                          keepdims=True),
                                      (2, 3, 4)), dtype, k=5)


@all_dtypes
def test_sdpa_s_zero(variant, dtype):
    q = np.ones((2, 3, 4), dtype)
    k, v = np.zeros((2, 0, 4), dtype), np.zeros((2, 0, 5), dtype)
    with no_warnings():
        for kw in ({}, {"attn_mask": np.zeros((3, 0), bool)}, {"is_causal": True}):
            out, lse = sdpa(q, k, v, return_lse=True, **kw)
            assert out.shape == (2, 3, 5) and out.dtype == dtype
            np.testing.assert_array_equal(out, 0)
            np.testing.assert_array_equal(lse, -np.inf)
    ref_out, ref_lse = oracle_sdpa(q, k, v)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(lse, ref_lse)


@all_dtypes
def test_sdpa_l_zero_and_batch_zero(variant, dtype):
    q, k, v = np.ones((2, 0, 4), dtype), np.ones((2, 6, 4), dtype), np.ones((2, 6, 5), dtype)
    out, lse = sdpa(q, k, v, return_lse=True, is_causal=True)
    assert out.shape == (2, 0, 5) and lse.shape == (2, 0) and out.dtype == dtype
    q, k, v = np.ones((0, 3, 4, 4), dtype), np.ones((0, 3, 6, 4), dtype), np.ones((1, 3, 6, 5),
                                                                                  dtype)
    out, lse = sdpa(q, k, v, np.ones((4, 6), bool), return_lse=True)
    assert out.shape == (0, 3, 4, 5) and lse.shape == (0, 3, 4)
    q = np.ones((2, 3, 0), dtype)
    out = sdpa(q, np.ones((2, 0, 0), dtype), np.ones((2, 0, 0), dtype))
    assert out.shape == (2, 3, 0)
    out = sdpa(np.ones((2, 3, 4), dtype), np.ones((2, 6, 4), dtype), np.ones((2, 6, 0), dtype))
    assert out.shape == (2, 3, 0)


@softmax_fns
@all_dtypes
def test_softmax_empty(variant, dtype, log):
    for shape, axis in (((0, 5), -1), ((5, 0), -1), ((5, 0), 0), ((0,), 0), ((2, 0, 3), 1),
                        ((2, 0, 3), 2)):
        x = np.ones(shape, dtype)
        got = call_checked(_sm(log), x, axis=axis)
        assert got.shape == shape and got.dtype == dtype


@all_dtypes
def test_matmul_empty(variant, dtype):
    for M, N, K in ((0, 3, 4), (3, 0, 4), (3, 4, 0), (0, 0, 0)):
        a, b = np.ones((M, K), dtype), np.ones((K, N), dtype)
        out = np.full((M, N), 2.5, dtype)
        assert cyattn.matmul_accumulate(a, b, out) is out
        np.testing.assert_array_equal(out, np.full((M, N), 2.5, dtype))
    out = np.ones((0, 3, 4), dtype)
    cyattn.matmul_accumulate(np.ones((0, 3, 2), dtype), np.ones((2, 4), dtype), out)
    assert out.shape == (0, 3, 4)


# ------------------------------------------------------------------------------------------
# Broadcasting
# ------------------------------------------------------------------------------------------

@native_dtypes
def test_sdpa_batch_broadcast(variant, dtype):
    rng = np.random.default_rng(16)
    B, H, L, S, E, Ev = 3, 2, 5, 6, 4, 3
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((1, H, S, E)).astype(dtype)
    v = rng.standard_normal((H, S, Ev)).astype(dtype)
    out = sdpa(q, k, v)
    assert out.shape == (B, H, L, Ev)
    ref, _ = oracle_sdpa(q, k, v)
    assert_close(out, ref, dtype, k=E + S)
    explicit = sdpa(q, np.broadcast_to(k, (B, H, S, E)).copy(),
                    np.broadcast_to(v, (B, H, S, Ev)).copy())
    np.testing.assert_array_equal(out, explicit)
    # the query broadcasts too
    out = sdpa(q[:1], np.broadcast_to(k, (B, H, S, E)).copy(), v)
    assert out.shape == (B, H, L, Ev)
    ref, _ = oracle_sdpa(q[:1], np.broadcast_to(k, (B, H, S, E)), v)
    assert_close(out, ref, dtype, k=E + S)


@pytest.mark.parametrize("mask_shape", [(6,), (5, 6), (3, 1, 1, 6), (1, 2, 5, 6), (3, 2, 5, 6),
                                        (2, 1, 6), (1, 5, 1)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_sdpa_mask_broadcast(variant, mask_shape, kind):
    rng = np.random.default_rng(17)
    q, k, v = (rng.standard_normal(s) for s in ((3, 2, 5, 4), (3, 2, 6, 4), (3, 2, 6, 3)))
    if kind == "bool":
        mask = rng.random(mask_shape) < 0.6
    else:
        mask = rng.standard_normal(mask_shape)
        mask[rng.random(mask_shape) < 0.3] = -np.inf
    out, lse = sdpa(q, k, v, mask, return_lse=True)
    ref_out, ref_lse = oracle_sdpa(q, k, v, mask)
    assert_close(out, ref_out, np.float64, k=10)
    assert_close(lse, ref_lse, np.float64, k=10)
    full = np.broadcast_to(mask, (3, 2, 5, 6)).copy()
    np.testing.assert_array_equal(out, sdpa(q, k, v, full))


@pytest.mark.parametrize("mask_shape", [(5,), (4, 5), (3, 1, 5), (1, 4, 1), (3, 4, 5)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", ["bool", "float"])
@softmax_fns
def test_softmax_mask_broadcast(variant, mask_shape, kind, log):
    rng = np.random.default_rng(18)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    mask = (rng.random(mask_shape) < 0.6 if kind == "bool"
            else rng.standard_normal(mask_shape).astype(np.float32))
    got = call_checked(_sm(log), x, mask=mask)
    assert_close(got, oracle_softmax(x, mask=mask, log=log), np.float32, k=5)
    np.testing.assert_array_equal(got, _sm(log)(x, mask=np.broadcast_to(mask, x.shape).copy()))


@native_dtypes
def test_matmul_batch_broadcast(variant, dtype):
    rng = np.random.default_rng(19)
    cases = [((4, 3), (2, 3, 5), (2, 4, 5)),
             ((2, 1, 4, 3), (3, 3, 5), (2, 3, 4, 5)),
             ((1, 4, 3), (3, 5), (6, 4, 5)),
             ((2, 4, 3), (2, 3, 5), (2, 4, 5))]
    for sa, sb, so in cases:
        a, b = rng.standard_normal(sa).astype(dtype), rng.standard_normal(sb).astype(dtype)
        out = rng.standard_normal(so).astype(dtype)
        ref = oracle_matmul(a, b, out, 1.5)
        call_checked(cyattn.matmul_accumulate, a, b, out, alpha=1.5)
        assert_close(out, ref, dtype, k=3)


# ------------------------------------------------------------------------------------------
# softmax axis
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
@softmax_fns
@all_dtypes
def test_softmax_axis(variant, dtype, axis, log):
    rng = np.random.default_rng(20)
    x = (rng.standard_normal((5, 6, 7)) * 3).astype(dtype)
    keep = rng.random((5, 6, 7)) < 0.7
    for mask in (None, keep, keep[0]):
        got = call_checked(_sm(log), x, axis=axis, mask=mask)
        assert got.shape == x.shape and got.dtype == dtype
        assert_close(got, oracle_softmax(x, axis=axis, mask=mask, log=log), dtype, k=7)
        moved = np.moveaxis(x, axis, -1)
        mm = None if mask is None else np.moveaxis(np.broadcast_to(mask, x.shape), axis, -1)
        np.testing.assert_array_equal(got, np.moveaxis(_sm(log)(moved, mask=mm), -1, axis))


# ------------------------------------------------------------------------------------------
# out=
# ------------------------------------------------------------------------------------------

@softmax_fns
@all_dtypes
def test_softmax_out(variant, dtype, log):
    rng = np.random.default_rng(21)
    x = rng.standard_normal((6, 9)).astype(dtype)
    keep = rng.random((6, 9)) < 0.7
    expected = _sm(log)(x, mask=keep)
    out = np.empty_like(x)
    assert call_checked(_sm(log), x, mask=keep, out=out) is out
    np.testing.assert_array_equal(out, expected)
    big = np.full((6, 20), 7.0, dtype)
    view = big[:, 1::2][:, :9]
    assert call_checked(_sm(log), x, mask=keep, out=view) is view
    np.testing.assert_array_equal(view, expected)
    assert (big[:, ::2] == 7.0).all() and (big[:, 19] == 7.0).all()
    fo = np.empty(x.shape, dtype, order="F")
    _sm(log)(x, mask=keep, out=fo)
    np.testing.assert_array_equal(fo, expected)
    # out is x itself (in place), and along axis 0
    y = x.copy()
    assert _sm(log)(y, mask=keep, out=y) is y
    np.testing.assert_array_equal(y, expected)
    y = x.copy()
    _sm(log)(y, axis=0, out=y)
    np.testing.assert_array_equal(y, _sm(log)(x, axis=0))
    # out overlapping x shifted by one row
    buf = np.concatenate([x, x[:1]])
    _sm(log)(buf[:6], out=buf[1:])
    np.testing.assert_array_equal(buf[1:], _sm(log)(x))


@softmax_fns
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_softmax_unmasked_rows_match_the_general_path_bits(variant, dtype, log):
    # Unmasked rows whose spread stays within EXP_NORMAL (-87 / -708) take the shortened
    # exp; a mask of all True takes the general path. Both must give the same bits, on both
    # sides of the threshold, for every lane count.
    rng = np.random.default_rng(23)
    edge = 87.0 if dtype == np.float32 else 708.0
    for n in (1, 5, 31, 32, 33, 64, 100, 257):
        x = rng.standard_normal((12, n)).astype(dtype) * 4
        for i, spread in enumerate((edge - 0.01, edge, edge + 0.01, 2 * edge, 0.5)):
            if n > 1:
                x[i, :] = np.linspace(0.0, -spread, n, dtype=dtype) + dtype(3.0)
        # an additive mask of zeros changes no score and takes the general path (masked copy,
        # then in place); a bool mask of all True takes the explicit-vector path (float32)
        general = _sm(log)(x, mask=np.zeros(x.shape, dtype))
        np.testing.assert_array_equal(_sm(log)(x), general)
        np.testing.assert_array_equal(_sm(log)(x, out=np.empty_like(x)), general)
        np.testing.assert_array_equal(_sm(log)(x, mask=np.ones(x.shape, bool)), general)


@softmax_fns
def test_softmax_exp_of_every_argument_range_matches_the_general_path_bits(variant, log):
    # The float32 rows' exp for arguments in [EXP_NORMAL_F32, 0] (the avx2 variant applies 2**n
    # by an integer add to the exponent field, the other explicit vectors as one factor, the
    # general path as two scalings): a row of 0
    # (its maximum) and 63 scores spread over every 4099th float32 in [-87, 0] by bit
    # pattern (about 273,000), so each score is its own exp argument, in rows of 64 and 512
    # (the streamed rows take the same exp:
    # test_softmax_streamed_rows_match_the_pipelined_rows_bits).
    bits = np.arange(0x80000000, 0xC2AE0000 + 1, 4099, dtype=np.uint64).astype(np.uint32)
    vals = bits.view(np.float32)
    vals = vals[(vals >= -87.0) & (vals <= 0.0)]
    for n in (64, 512):
        rows = -(-vals.size // (n - 1))
        x = np.zeros((rows, n), np.float32)
        x[:, 1:].flat[:vals.size] = vals
        general = _sm(log)(x, mask=np.zeros(x.shape, np.float32))
        np.testing.assert_array_equal(_sm(log)(x), general)


@softmax_fns
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_softmax_bool_masked_rows_match_the_general_path_bits(variant, dtype, log):
    # float32 rows under a bool mask of unit column stride take cyattn_softmax_row_f32's
    # explicit vectors (masked lanes add +0 to the sums); the same mask as an additive -inf /
    # 0 mask takes the general path (masked copy, then in place). Same bits, in place or not,
    # for every lane count and on both sides of the EXP_NORMAL threshold; rows fully masked,
    # with a kept NaN, or with a masked NaN / inf (never read) among them.
    rng = np.random.default_rng(29)
    edge = 87.0 if dtype == np.float32 else 708.0
    for n in (32, 33, 63, 64, 100, 257, 1030):
        x = (rng.standard_normal((10, n)) * 4).astype(dtype)
        keep = rng.random((10, n)) < 0.7
        keep[:, 0] = True
        x[0, :] = np.linspace(0.0, -(edge - 0.01), n, dtype=dtype)
        x[1, :] = np.linspace(0.0, -(edge + 0.01), n, dtype=dtype)
        keep[2, :] = False
        x[3, 1], keep[3, 1] = np.nan, True
        x[4, 2], keep[4, 2] = np.nan, False
        x[5, 3], keep[5, 3] = np.inf, False
        additive = np.where(keep, dtype(0), dtype(-np.inf)).astype(dtype)
        x_add = np.where(keep, x, dtype(0))          # -inf + a masked inf would be NaN
        general = _sm(log)(x_add, mask=additive)
        np.testing.assert_array_equal(_sm(log)(x, mask=keep), general)
        inplace = x.copy()
        _sm(log)(inplace, mask=keep, out=inplace)
        np.testing.assert_array_equal(inplace, general)
        # a kept score far below the maximum makes the row fall back: the same bits as the
        # row without it, where the extra score contributes an exact 0 (n % 32 kept, so the
        # other scores keep their lanes)
        far = np.concatenate([x, np.full((10, 1), dtype(-5 * edge))], axis=1)
        keep_far = np.concatenate([keep, np.ones((10, 1), bool)], axis=1)
        if n % 32 != 31:
            np.testing.assert_array_equal(_sm(log)(far, mask=keep_far)[:, :n], general)
            np.testing.assert_array_equal(_sm(log)(far[5:])[:, :n], _sm(log)(x[5:]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_softmax_rows_in_pairs_match_rows_alone(variant, dtype):
    # Unmasked rows go through the kernel two at a time (softmax_pair_to, fused loops) and an
    # odd last row alone; every row must get the bits it gets alone, whatever its partner
    # (special rows -- NaN, +-inf, all -inf, a spread past EXP_NORMAL -- make the pair fall
    # back to one row at a time), with one thread and with several (big inputs).
    rng = np.random.default_rng(24)
    edge = 87.0 if dtype == np.float32 else 708.0
    for rows, n in ((7, 32), (6, 33), (9, 64), (5, 100), (4, 257), (129, 1024)):
        x = (rng.standard_normal((rows, n)) * 3).astype(dtype)
        x[1, 5] = np.nan
        x[2, :] = -np.inf
        x[3, 7] = np.inf
        x[-1, 0] = dtype(-2 * edge)
        alone = np.concatenate([cyattn.softmax(x[i:i + 1]) for i in range(rows)])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            np.testing.assert_array_equal(cyattn.softmax(x), alone)
        np.testing.assert_array_equal(cyattn.softmax(x[::-1]), alone[::-1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_log_softmax_into_a_distinct_row_matches_the_general_path_bits(variant, dtype):
    # An unmasked log-softmax into a distinct out takes three passes from x (log_softmax_row_to:
    # max, exp-sum, (x - max) - log(sum)) instead of a copy and two shifts in place; every row,
    # special ones included (a NaN, +inf, all -inf, a score far below the maximum), must keep
    # the bits of the general path (an additive mask of zeros).
    rng = np.random.default_rng(37)
    edge = 87.0 if dtype == np.float32 else 708.0
    for n in (1, 7, 31, 32, 65, 300, 2048):
        x = (rng.standard_normal((6, n)) * 4).astype(dtype)
        x[1, n // 2] = np.nan
        x[2, n - 1] = np.inf
        x[3, :] = -np.inf
        x[4, 0] = dtype(-3 * edge)
        general = cyattn.log_softmax(x, mask=np.zeros_like(x))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            np.testing.assert_array_equal(cyattn.log_softmax(x), general)
            np.testing.assert_array_equal(cyattn.log_softmax(x, out=np.empty_like(x)), general)


@softmax_fns
@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_softmax_pipelined_runs_match_the_general_path_bits(variant, n_threads, log):
    # Unmasked float32 rows of 32 or more elements run in pipelined runs of rows (the exp pass
    # of one row with the max pass of the next and the scale or log pass of the one before,
    # cyattn_softmax_rows_f32); a row the run declines (no finite maximum, +inf, NaN, a score
    # more than 87 below the maximum) ends the run and takes the general rules. Every row must
    # get the bits of the general path (an additive mask of zeros), wherever the declined
    # rows fall (first, last, next to each other, at a thread's share boundary), in place or
    # not, for every tail length.
    rng = np.random.default_rng(31)
    for rows, n in ((1, 32), (2, 33), (7, 64), (9, 100), (16, 512), (11, 2053)):
        x = (rng.standard_normal((rows, n)) * 4).astype(np.float32)
        declined = {0: (0, np.nan), 3: (n - 1, np.inf), 4: (1, -200.0), 8: (0, -np.inf),
                    rows - 1: (n // 2, -100.0)}
        for i, (j, value) in declined.items():
            if 0 < i < rows or (i == 0 and rows > 2):
                x[i, j] = value
        if rows > 8:
            x[8, :] = -np.inf
        general = _sm(log)(x, mask=np.zeros_like(x))

        def rows_kernel(src, out):          # the kernel entry, past the small-work thread cap
            cyattn._backend.kernels.softmax_rows(src, out, None, None, 0, 0, 0, 0, log,
                                                 n_threads)
            return out

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            np.testing.assert_array_equal(rows_kernel(x, np.empty_like(x)), general)
            inplace = x.copy()
            np.testing.assert_array_equal(rows_kernel(inplace, inplace), general)
            np.testing.assert_array_equal(rows_kernel(x[1:], np.empty_like(x[1:])),
                                          general[1:])
        np.testing.assert_array_equal(_sm(log)(x), general)


@softmax_fns
@pytest.mark.parametrize("n_threads", [1, 2])
def test_softmax_streamed_rows_match_the_pipelined_rows_bits(variant, n_threads, log):
    # An output of at least softmax_stream_min_bytes() (half the last-level cache) is written
    # by non-temporal stores from a scratch row (cyattn_softmax_rows_f32_nt): the stores only
    # differ, so the bits must be those of the ordinary pipelined rows. stream_min (0: always
    # stream, huge: never) takes either path on small arrays; outputs at every alignment of
    # the vector stores (an offset of 1-15 floats) and just before a page boundary, declined
    # rows (NaN, +inf, a score more than 87 below the maximum, all -inf) between streamed
    # ones, in place or not, and the public call above the host's threshold.
    kern = cyattn._backend.kernels
    assert kern.softmax_stream_min_bytes() > 0
    rng = np.random.default_rng(46)
    for rows, n in ((1, 32), (5, 33), (9, 100), (13, 512), (4, 2053), (40, 48), (6, 2048)):
        x = (rng.standard_normal((rows, n)) * 4).astype(np.float32)
        if rows > 4:
            x[1, 0], x[2, n - 1], x[3, 1], x[4, :] = np.nan, np.inf, -200.0, -np.inf
        for off in (0, 1, 7, 15):
            ref = np.empty_like(x)
            kern.softmax_rows(x, ref, None, None, 0, 0, 0, 0, log, n_threads, 1 << 62)
            got = np.empty(x.size + off, np.float32)[off:].reshape(x.shape)
            kern.softmax_rows(x, got, None, None, 0, 0, 0, 0, log, n_threads, 0)
            np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
            fast = np.empty(x.size + off, np.float32)[off:].reshape(x.shape)
            if off == 0:
                assert kern.softmax_fast(x, fast, log, n_threads, np.empty, 0) is fast
                np.testing.assert_array_equal(fast.view(np.uint32), ref.view(np.uint32))
        # each row's scratch row starts at that row of y's offset in its 4 KiB page, up to the
        # page's last float (cyattn_softmax_rows_f32_nt): outputs that start 1-16 floats
        # before a page boundary
        for back in (1, 3, 16):
            buf = np.empty(x.size + 2048, np.float32)
            start = (-(buf.ctypes.data // 4) - back) % 1024
            got = buf[start:start + x.size].reshape(x.shape)
            assert (got.ctypes.data + 4 * back) % 4096 == 0
            kern.softmax_rows(x, got, None, None, 0, 0, 0, 0, log, n_threads, 0)
            np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
        inplace = x.copy()
        kern.softmax_rows(inplace, inplace, None, None, 0, 0, 0, 0, log, n_threads, 0)
        np.testing.assert_array_equal(inplace.view(np.uint32), ref.view(np.uint32))
    if kern.softmax_stream_min_bytes() > 1 << 30:       # the variant never streams by rule
        return
    n = max(256, kern.softmax_stream_min_row())                 # rows the rule streams
    rows = kern.softmax_stream_min_bytes() // (4 * n) + 1       # past the host's threshold
    x = rng.standard_normal((rows, n)).astype(np.float32)
    ref = np.empty_like(x)
    kern.softmax_rows(x, ref, None, None, 0, 0, 0, 0, log, n_threads, 1 << 62)
    np.testing.assert_array_equal(_sm(log)(x).view(np.uint32), ref.view(np.uint32))


@softmax_fns
@pytest.mark.parametrize("n_threads", [1, 2])
def test_softmax_nan_payloads_spread(variant, n_threads, log):
    # A NaN score makes its row NaN, whatever its payload. The unmasked float32 rows let a NaN
    # through their max / min pass (vmaxps / vminps return the other operand) and count on the
    # exp to spread it; a trial of the avx2 rows that applied 2**n by an integer add to the
    # exponent field turned NaNs with payload bits in the low 9 into numbers (the row summed
    # to a finite total and came out as weights). numpy's own NaN (0x7FC00000) has none of
    # those bits, so the other tests never saw it. Every path: the pipelined rows, the
    # streamed rows, one row at a time, the public call; the other rows keep their bits.
    kern = cyattn._backend.kernels
    rng = np.random.default_rng(460)
    payloads = (0x7FC00001, 0x7FC001FF, 0xFFC00003, 0x7F800001, 0x7FFFFFFF, 0xFFBFFFFF)
    for rows, n in ((5, 32), (5, 100), (6, 512), (4, 2053)):
        for i, bits in enumerate(payloads):
            x = (rng.standard_normal((rows, n)) * 4).astype(np.float32)
            r, j = 1 + i % (rows - 2), (i * 37) % n
            x.view(np.uint32)[r, j] = bits
            assert np.isnan(x[r, j])
            general = _sm(log)(x, mask=np.zeros_like(x))
            assert np.isnan(general[r]).all()
            for stream_min in (1 << 62, 0):
                got = np.empty_like(x)
                kern.softmax_rows(x, got, None, None, 0, 0, 0, 0, log, n_threads, stream_min)
                assert np.isnan(got[r]).all(), (hex(bits), n, stream_min)
                keep = np.arange(rows) != r
                np.testing.assert_array_equal(got[keep], general[keep])
            one = np.empty_like(x[r:r + 1])
            kern.softmax_rows(x[r:r + 1], one, None, None, 0, 0, 0, 0, log, n_threads)
            assert np.isnan(one).all(), (hex(bits), n)
            assert np.isnan(_sm(log)(x)[r]).all(), (hex(bits), n)


@softmax_fns
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_softmax_out_written_directly(variant, dtype, log, monkeypatch):
    # A C-contiguous out of the compute dtype (float16 is computed in float32, so it is
    # copied), along the last axis, is the kernel's target:
    # no second pass copies the result into it (an earlier version copied out onto itself).
    rng = np.random.default_rng(22)
    x = rng.standard_normal((5, 70)).astype(dtype)
    keep = rng.random((5, 70)) < 0.6
    expected = _sm(log)(x, mask=keep)
    expected_plain = _sm(log)(x)

    def no_copy(out, arr):
        raise AssertionError("out was filled by a copy, not by the kernel")

    monkeypatch.setattr(cyattn._validate, "copy_result", no_copy)
    out = np.empty_like(x)
    assert _sm(log)(x, mask=keep, out=out) is out
    np.testing.assert_array_equal(out, expected)
    assert _sm(log)(x, axis=-1, out=out) is out
    np.testing.assert_array_equal(out, expected_plain)


@softmax_fns
@native_dtypes
def test_softmax_fast_path_matches_general_path(variant, dtype, log, monkeypatch):
    # Calls without a mask on C-contiguous, aligned float32/float64 arrays over the last axis
    # (with or without a matching out) skip the Python checks (softmax_fast); the result must be
    # the general path's, bit for bit. The general path is reached with axis=ndim-1 (the fast
    # path takes only the default -1), so both run the same kernel on the same rows.
    rng = np.random.default_rng(25)
    calls = []
    module = importlib.import_module("cyattn.softmax")    # cyattn.softmax is the function
    real = module._softmax

    def counted(*args):
        calls.append(args[0])
        return real(*args)

    monkeypatch.setattr(module, "_softmax", counted)
    for shape in ((1,), (7,), (1, 33), (5, 64), (3, 4, 129), (2, 1, 3, 1000)):
        x = (rng.standard_normal(shape) * 5).astype(dtype)
        x.reshape(-1)[::7] = -np.inf                       # fully masked rows included
        if len(shape) > 1:
            x[(0,) * (len(shape) - 1)] = -np.inf
        general = _sm(log)(x, axis=x.ndim - 1)
        n_general = len(calls)
        assert n_general > 0
        got = call_checked(_sm(log), x)
        assert got.dtype == dtype and got.shape == x.shape and got.flags.c_contiguous
        np.testing.assert_array_equal(got, general)
        out = np.full(shape, 7.0, dtype)
        assert call_checked(_sm(log), x, out=out) is out
        np.testing.assert_array_equal(out, general)
        assert len(calls) == n_general, "the fast path was not taken"


@softmax_fns
def test_softmax_fast_path_declines_other_inputs(variant, log):
    # Whatever the fast path does not take goes to the general path, with its results and
    # errors: float16, other layouts, misaligned or byte-swapped buffers, subclasses, empty
    # arrays, and an out that overlaps x, has another dtype or shape, or is read-only.
    rng = np.random.default_rng(26)
    x = rng.standard_normal((4, 40)).astype(np.float32)
    ref = _sm(log)(x.astype(np.float64))
    tol = dict(rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(_sm(log)(x.astype(np.float16)), ref, rtol=2e-3, atol=2e-3)
    assert _sm(log)(x.astype(np.float16)).dtype == np.float16
    np.testing.assert_allclose(_sm(log)(np.asfortranarray(x)), ref, **tol)
    raw = np.zeros(x.size * 4 + 1, np.uint8)
    mis = raw[1:].view(np.float32).reshape(x.shape)
    mis[...] = x
    np.testing.assert_allclose(_sm(log)(mis), ref, **tol)
    np.testing.assert_allclose(_sm(log)(x.astype(">f4")), ref, **tol)
    np.testing.assert_allclose(np.asarray(_sm(log)(np.ma.masked_array(x))), ref, **tol)
    assert _sm(log)(np.empty((3, 0), np.float32)).shape == (3, 0)
    assert _sm(log)(np.empty((0, 5), np.float32)).shape == (0, 5)
    # out overlapping x (x itself, and shifted by one row): computed as if out were separate
    y = x.copy()
    assert _sm(log)(y, out=y) is y
    np.testing.assert_allclose(y, ref, **tol)
    buf = np.concatenate([x, x[:1]])
    _sm(log)(buf[:4], out=buf[1:])
    np.testing.assert_allclose(buf[1:], ref, **tol)
    for bad, err in ((np.empty((4, 40), np.float64), ValueError),
                     (np.empty((4, 41), np.float32), ValueError),
                     (np.empty((40, 4), np.float32).T, None)):
        if err is None:                        # a transposed (Fortran) out is fine
            assert _sm(log)(x, out=bad) is bad
            np.testing.assert_allclose(bad, ref, **tol)
            continue
        bad[...] = 3.0
        with pytest.raises(err, match="out"):
            _sm(log)(x, out=bad)
        assert (bad == 3.0).all()
    ro = np.full(x.shape, 3.0, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out"):
        _sm(log)(x, out=ro)
    assert (ro == 3.0).all()


@native_dtypes
def test_matmul_tiny_calls_take_the_kernel_directly(variant, dtype, monkeypatch):
    # A call with default options on ndarrays and a finite float alpha goes straight to
    # matmul_fast with n_threads 0 (the default count), which takes a product that runs on one
    # thread anyway and declines a larger one; either way the result is the general path's,
    # bit for bit, and whatever is declined (other dtypes, layouts, an overlapping out,
    # options) reaches the general path with its errors.
    module = importlib.import_module("cyattn.matmul")
    rng = np.random.default_rng(46)
    seen = []
    real = _backend.kernels.matmul_fast

    def spy(a, b, out, alpha, n_threads):
        seen.append(n_threads)
        return real(a, b, out, alpha, n_threads)

    monkeypatch.setattr(_backend.kernels, "matmul_fast", spy)
    for n in (1, 16, 32, 64, 65, 130):
        a, b, c = (rng.standard_normal((n, n)).astype(dtype) for _ in range(3))
        seen.clear()
        got = c.copy()
        assert cyattn.matmul_accumulate(a, b, got, alpha=0.5) is got
        assert seen[0] == 0 and (len(seen) == 1) == (n * n * n < 2 << 18)
        with monkeypatch.context() as m:
            m.setattr(module, "_fast_call", lambda *args: False)
            ref = c.copy()
            module._matmul(a, b, ref, 0.5, None, None)
        np.testing.assert_array_equal(got, ref)
    a = rng.standard_normal((16, 16)).astype(dtype)
    with pytest.raises(ValueError, match="out"):
        cyattn.matmul_accumulate(a, a, np.zeros((16, 15), dtype))
    with pytest.raises(ValueError, match="precision"):
        cyattn.matmul_accumulate(a, a, np.zeros((16, 16), dtype), precision="exactly")
    with pytest.raises(ValueError, match="n_threads"):
        cyattn.matmul_accumulate(a, a, np.zeros((16, 16), dtype), n_threads=0)
    with pytest.raises(TypeError):
        cyattn.matmul_accumulate(a, a, np.zeros((16, 16), dtype), alpha="1")


def _sdpa_both_paths(monkeypatch, q, k, v, mask, out=None, **kw):
    """(fast, general): sdpa's (result, lse) with the kernel module's one-pass path (asserting
    that it was taken; it writes ``out``) and with that path switched off, so the Python checks
    build the call (it writes a copy of ``out``)."""
    module = importlib.import_module("cyattn.attention")
    with monkeypatch.context() as m:
        m.setattr(module, "_fast_call", lambda *args: None)
        general = cyattn.scaled_dot_product_attention(
            q, k, v, mask, return_lse=True, out=None if out is None else out.copy(), **kw)
    with monkeypatch.context() as m:
        def general_kernel(*args):
            raise AssertionError("the fast path was not taken")
        m.setattr(_backend.kernels, "attention", general_kernel)
        fast = call_checked(cyattn.scaled_dot_product_attention, q, k, v, mask,
                            return_lse=True, out=out, **kw)
    assert out is None or fast[0] is out
    return fast, general


@native_dtypes
@pytest.mark.parametrize("causal", ["", "top_left", "bottom_right"])
def test_sdpa_fast_path_matches_general_path(variant, dtype, causal, monkeypatch):
    # C-contiguous, aligned inputs of one native dtype take attention_fast, which checks the
    # buffers in one pass and computes the offsets and strides in C: with a bool mask, or a
    # float mask of the data dtype, that broadcasts to (..., L, S) without enlarging it (any
    # layout), with GQA, with an out= it can write directly. Every case must give the general
    # path's bits.
    rng = np.random.default_rng(27)
    B, H, L, S, E = 2, 3, 37, 45, 16
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, H, S, E)).astype(dtype)
    v = rng.standard_normal((B, H, S, E + 3)).astype(dtype)
    kw = dict(is_causal=True, causal_alignment=causal) if causal else {}
    full = rng.random((B, H, L, S)) < 0.7
    full[0, 1, 5] = False                                     # a fully masked row
    big = rng.random((2 * S, 2 * L)) < 0.6
    bools = [full, full[0, 0], full[1, :, :1], full[:1, :1, 3], full[:, :1, :1, :],
             full[:1], np.array(True), np.array(False), big[::2, ::2].T, big[:L, :S][::-1],
             full[..., ::-1], np.broadcast_to(full[0, 0, 0], (L, S))]
    floats = [np.where(m, dtype(0), dtype(-np.inf)) + rng.standard_normal(m.shape).astype(dtype)
              for m in (full, full[0, 0], full[:, :1, :1, :])]
    floats += [np.asfortranarray(floats[1]), floats[0][:, ::-1],
               rng.standard_normal((L, 2 * S)).astype(dtype)[:, ::2]]
    for mask in [None] + bools + floats:
        (out, lse), (g_out, g_lse) = _sdpa_both_paths(monkeypatch, q, k, v, mask, **kw)
        np.testing.assert_array_equal(out, g_out)
        np.testing.assert_array_equal(lse, g_lse)
        assert out.dtype == dtype and lse.dtype == dtype
        res = np.full(out.shape, 7.0, dtype)
        (out, lse), (g_out, g_lse) = _sdpa_both_paths(monkeypatch, q, k, v, mask, res, **kw)
        np.testing.assert_array_equal(out, g_out)
        np.testing.assert_array_equal(lse, g_lse)
    # no batch dims, and one
    for qq, kk, vv, mask in ((q[0, 0], k[0, 0], v[0, 0], full[0, 0]),
                             (q[0], k[0], v[0], full[0, :1]),
                             (q[0], k[0], v[0], full[0, 0])):
        (out, lse), (g_out, g_lse) = _sdpa_both_paths(monkeypatch, qq, kk, vv, mask, **kw)
        np.testing.assert_array_equal(out, g_out)
        np.testing.assert_array_equal(lse, g_lse)
    # GQA: 6 query heads on 3, 2 or 1 key/value heads (also 6: no grouping)
    q6 = rng.standard_normal((B, 6, L, E)).astype(dtype)
    for hk in (6, 3, 2, 1):
        for mask in (None, full[:, :1], full[0, 0], floats[2]):
            (out, lse), (g_out, g_lse) = _sdpa_both_paths(
                monkeypatch, q6, k[:, :hk].copy() if hk <= H else np.concatenate([k, k], 1),
                v[:, :hk].copy() if hk <= H else np.concatenate([v, v], 1), mask,
                enable_gqa=True, **kw)
            np.testing.assert_array_equal(out, g_out)
            np.testing.assert_array_equal(lse, g_lse)


@native_dtypes
@pytest.mark.parametrize("causal", ["", "top_left", "bottom_right"])
def test_sdpa_fast_path_takes_head_views(variant, dtype, causal, monkeypatch):
    # Multi-head attention hands the kernel (B, H, L, D) views of a fused QKV projection
    # (rows of adjacent elements, other strides anything) and often an out= view of the
    # (B, L, H, D) context buffer. The fast path takes them, with the general path's bits and
    # those of C-contiguous copies (DESIGN 3.8), and writes only out's own elements.
    rng = np.random.default_rng(29)
    B, H, D = 2, 3, 8
    kw = dict(is_causal=True, causal_alignment=causal) if causal else {}
    for L in (37, 3):                                         # fused and decode paths
        S = L if L > 4 else 300
        fused_q = rng.standard_normal((B, L, H, D)).astype(dtype)
        fused_kv = rng.standard_normal((B, S, 2, H, D)).astype(dtype)
        q = fused_q.transpose(0, 2, 1, 3)
        k, v = (fused_kv[:, :, i].transpose(0, 2, 1, 3) for i in range(2))
        keep = rng.random((B, 1, L, S)) < 0.8
        ctx = np.full((B, L, H, D + 2), 5.0, dtype)
        out = ctx[..., 1:-1].transpose(0, 2, 1, 3)            # strided, inside a bigger buffer
        contiguous = [np.ascontiguousarray(x) for x in (q, k, v)]
        for mask in (None, keep):
            want = sdpa(*contiguous, mask, return_lse=True, **kw)
            for o in (None, np.zeros((B, H, L, D), dtype), out):
                (got, lse), (g_out, g_lse) = _sdpa_both_paths(monkeypatch, q, k, v, mask, o,
                                                             **kw)
                np.testing.assert_array_equal(got, g_out)
                np.testing.assert_array_equal(lse, g_lse)
                np.testing.assert_array_equal(got, want[0])
                np.testing.assert_array_equal(lse, want[1])
            assert (ctx[..., 0] == 5).all() and (ctx[..., -1] == 5).all()
        # reversed rows, a key/value broadcast over the batch (zero stride), GQA on views
        rev = np.ascontiguousarray(q[:, :, ::-1])[:, :, ::-1]
        (got, _), (g_out, _) = _sdpa_both_paths(monkeypatch, rev, k, v, keep, **kw)
        np.testing.assert_array_equal(got, g_out)
        np.testing.assert_array_equal(got, want[0])
        kb, vb = (np.broadcast_to(x[:1], x.shape) for x in (k, v))
        (got, _), (g_out, _) = _sdpa_both_paths(monkeypatch, q, kb, vb, None, **kw)
        np.testing.assert_array_equal(got, g_out)
        np.testing.assert_array_equal(
            got, sdpa(contiguous[0], np.ascontiguousarray(kb), np.ascontiguousarray(vb), **kw))
        q6 = rng.standard_normal((B, L, 2 * H, D)).astype(dtype).transpose(0, 2, 1, 3)
        (got, _), (g_out, _) = _sdpa_both_paths(monkeypatch, q6, k, v, keep, enable_gqa=True,
                                                **kw)
        np.testing.assert_array_equal(got, g_out)
        np.testing.assert_array_equal(
            got, sdpa(np.ascontiguousarray(q6), *contiguous[1:], keep, enable_gqa=True, **kw))
    # columns not adjacent: declined (the general path copies them); a strided out that is
    # the query itself: written after the kernel has read every input. Same results.
    q = fused_q.transpose(0, 2, 1, 3)
    every_other = rng.standard_normal((B, H, L, 2 * D)).astype(dtype)[..., ::2]
    np.testing.assert_array_equal(sdpa(every_other, k, v, **kw),
                                  sdpa(np.ascontiguousarray(every_other), k, v, **kw))
    expect = sdpa(np.ascontiguousarray(q), k, v, **kw)
    assert sdpa(q, k, v, out=q, **kw) is q
    np.testing.assert_array_equal(q, expect)
    # an out whose elements share memory (out[b, h, 0, e] is buf[b + 2 h + e]): declined, so
    # the bytes left are those of the general path's copy (found by an adversarial helper)
    qs, ks, vs = (np.ascontiguousarray(x[:, :2, :1, :2]) for x in (q, k, v))
    bufs = []
    for general in (False, True):
        buf = np.zeros(6, dtype)
        shared = np.lib.stride_tricks.as_strided(
            buf, (2, 2, 1, 2), tuple(buf.itemsize * s for s in (1, 2, 2, 1)), writeable=True)
        with monkeypatch.context() as m:
            if general:
                m.setattr(importlib.import_module("cyattn.attention"), "_fast_call",
                          lambda *args: None)
            assert cyattn.scaled_dot_product_attention(qs, ks, vs, out=shared, **kw) is shared
        bufs.append(buf)
    np.testing.assert_array_equal(bufs[0], bufs[1])


@native_dtypes
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_out_does_not_depend_on_return_lse(variant, dtype, causal):
    # Without return_lse the fused kernel skips the log of each row's sum and keeps max + sum
    # in its lse scratch, which must flag exactly the rows that the two-pass redo recomputes
    # (inf/NaN scores or values, huge logits). The output must be the same bits either way,
    # on the fast path (C-contiguous), the general path (strided query) and the decode path.
    rng = np.random.default_rng(41)
    B, H, L, S, E = 2, 2, 37, 45, 8
    keep = rng.random((B, H, L, S)) < 0.8
    keep[0, 0, 3] = False                                     # a fully masked row
    for L_, S_ in ((L, S), (3, 700)):
        q = rng.standard_normal((B, H, L_, E)).astype(dtype)
        k = rng.standard_normal((B, H, S_, E)).astype(dtype)
        v = rng.standard_normal((B, H, S_, E)).astype(dtype)
        q[0, 1, 1, 2] = np.inf                                # +inf and NaN scores
        k[1, 0, 4, 0] = np.nan
        v[1, 1, 7, 3] = -np.inf                               # a non-finite value
        q[1, 0, 2] *= dtype(1e30 if dtype == np.float64 else 1e18)   # huge logits
        mask = keep[..., :L_, :S_] if S_ == S else None
        for qq in (q, np.asfortranarray(q)):
            with np.errstate(all="ignore"):
                out, lse = sdpa(qq, k, v, mask, is_causal=causal, return_lse=True)
                only = sdpa(qq, k, v, mask, is_causal=causal)
            assert type(only) is np.ndarray and only.dtype == dtype
            assert np.isnan(out).any() and np.isnan(lse).any()     # the redo path ran
            np.testing.assert_array_equal(only, out)


def test_sdpa_fast_path_declines_other_inputs(variant):
    # What the fast path does not take reaches the general path, with its casts and errors:
    # float masks of another dtype (cast), byte-swapped, misaligned or strided by a non-multiple
    # of the itemsize (copied), subclasses and lists, integer masks, masks that would enlarge
    # the scores; an out that overlaps an input (the result goes through a temporary), or has
    # the wrong shape or dtype, or is read-only (raises, untouched).
    rng = np.random.default_rng(28)
    L, S, E = 19, 23, 8
    q = rng.standard_normal((2, L, E)).astype(np.float32)
    k = rng.standard_normal((2, S, E)).astype(np.float32)
    v = rng.standard_normal((2, S, E)).astype(np.float32)
    add = np.where(rng.random((L, S)) < 0.7, 0, -np.inf).astype(np.float32)
    add += rng.standard_normal((L, S)).astype(np.float32)
    keep = np.isfinite(add)
    sdpa = cyattn.scaled_dot_product_attention
    want = sdpa(q, k, v, add)
    raw = np.zeros(add.size * 4 + 1, np.uint8)
    mis = raw[1:].view(np.float32).reshape(add.shape)
    mis[...] = add
    raw6 = np.zeros(add.size * 6, np.uint8)
    odd = np.lib.stride_tricks.as_strided(raw6[:4].view(np.float32), add.shape, (6 * S, 6))
    odd[...] = add
    for other in (add.astype(np.float64), add.astype(">f4"), mis, odd, np.ma.masked_array(add),
                  add.tolist()):
        np.testing.assert_array_equal(sdpa(q, k, v, other), want)
    assert_close(sdpa(q, k, v, add.astype(np.float16)),
                 sdpa(q, k, v, add.astype(np.float16).astype(np.float32)), np.float32)
    np.testing.assert_array_equal(sdpa(q, k, v, keep.tolist()), sdpa(q, k, v, keep))
    with pytest.raises(TypeError, match="attn_mask has dtype int64"):
        sdpa(q, k, v, keep.astype(np.int64))
    for shape in ((L + 1, S), (L, 1, S), (2, L, 2), (1, 2, L, S), (3, L, S)):
        with pytest.raises(ValueError, match=r"attn_mask has shape"):
            sdpa(q, k, v, np.ones(shape, bool))
    # out overlapping q, and out overlapping a reversed mask only below the mask's first
    # element (a check of [first element, + size) would miss it): batch entry 0's output
    # would overwrite mask rows that entry 1 still reads
    qq = q.copy()
    assert sdpa(qq, k, v, add, out=qq, n_threads=1) is qq
    np.testing.assert_array_equal(qq, want)
    buf = np.zeros(L * E + L * S, np.float32)
    region = buf[L * E - 10:L * E - 10 + L * S]
    rmask = region.reshape(L, S)[::-1]
    rmask[...] = add
    res = buf[:2 * L * E].reshape(2, L, E)
    assert sdpa(q, k, v, rmask, out=res, n_threads=1) is res
    np.testing.assert_array_equal(res, want)
    fo = np.zeros((E, L, 2), np.float32).T
    assert sdpa(q, k, v, add, out=fo) is fo
    np.testing.assert_array_equal(fo, want)
    ro = np.full(want.shape, 3.0, np.float32)
    ro.flags.writeable = False
    for bad in (np.full(want.shape, 3.0, np.float64), np.full((2, L, E + 1), 3.0, np.float32),
                np.full((1, L, E), 3.0, np.float32), ro):
        with pytest.raises(ValueError, match="out"):
            sdpa(q, k, v, add, out=bad)
        assert (bad == 3.0).all()
    # GQA the fast path does not take: broadcast outer batch dims; heads that do not divide
    one = sdpa(q, np.repeat(k[:1], 2, 0), np.repeat(v[:1], 2, 0), add)
    got = sdpa(np.stack([q] * 3), k[None, :1], v[None, :1], add, enable_gqa=True)
    for i in range(3):
        np.testing.assert_array_equal(got[i], one)
    with pytest.raises(ValueError, match="enable_gqa"):
        sdpa(q.reshape(1, 2, L, E), np.zeros((1, 3, S, E), np.float32),
             np.zeros((1, 3, S, E), np.float32), enable_gqa=True)


def test_more_than_32_dims_on_every_path(variant, monkeypatch):
    # np.broadcast_shapes stops at 32 dimensions, arrays go to 64: the general path (float16,
    # masks, batch broadcasting) once raised RuntimeError where the fast path worked.
    rng = np.random.default_rng(29)
    lead = (1,) * 36
    q = rng.standard_normal(lead + (2, 3, 5, 4)).astype(np.float32)
    k = rng.standard_normal(lead + (2, 3, 6, 4)).astype(np.float32)
    v = rng.standard_normal(lead + (2, 3, 6, 2)).astype(np.float32)
    keep = rng.random((5, 6)) < 0.7
    (out, lse), (g_out, g_lse) = _sdpa_both_paths(monkeypatch, q, k, v, keep)
    np.testing.assert_array_equal(out, g_out)
    np.testing.assert_array_equal(lse, g_lse)
    ref, ref_lse = numpy_sdpa(q.reshape(2, 3, 5, 4), k.reshape(2, 3, 6, 4),
                              v.reshape(2, 3, 6, 2), keep)
    assert_close(out.reshape(ref.shape), ref, np.float32, k=6)
    half = cyattn.scaled_dot_product_attention(q.astype(np.float16), k, v, keep[None])
    assert half.shape == out.shape and half.dtype == np.float32
    assert_close(half, out, np.float16)
    x = rng.standard_normal(lead + (3, 7)).astype(np.float32)
    mask = rng.random(7) < 0.6
    mask[0] = True
    assert_close(cyattn.softmax(x, mask=mask).reshape(3, 7),
                 oracle_softmax(x.reshape(3, 7), mask=np.broadcast_to(mask, (3, 7))),
                 np.float32)
    a = rng.standard_normal(lead + (2, 3, 4)).astype(np.float32)
    b = rng.standard_normal((4, 5)).astype(np.float32)
    c = np.zeros(lead + (2, 3, 5), np.float32)
    cyattn.matmul_accumulate(a, b, c)
    assert_close(c.reshape(2, 3, 5), a.reshape(2, 3, 4) @ b, np.float32, k=4)


@all_dtypes
def test_matmul_out_layouts_and_aliasing(variant, dtype):
    rng = np.random.default_rng(22)
    M, K = 37, 29
    a = grid_values(rng, (M, K)).astype(dtype)
    b = grid_values(rng, (K, K)).astype(dtype)          # dense square b: out may be a
    base = grid_values(rng, (M, K)).astype(dtype)
    expected = base.copy()
    cyattn.matmul_accumulate(a, b, expected, alpha=0.5)
    assert_close(expected, oracle_matmul(a, b, base, 0.5), dtype, k=K)
    # strided view, Fortran, reversed view
    big = np.full((2 * M, 2 * K), 3.0, dtype)
    view = big[::2, 1::2]
    view[...] = base
    call_checked(cyattn.matmul_accumulate, a, b, view, alpha=0.5)
    np.testing.assert_array_equal(view, expected)
    assert (big[1::2] == 3.0).all() and (big[::2, ::2] == 3.0).all()
    fo = np.asfortranarray(base)
    cyattn.matmul_accumulate(a, b, fo, alpha=0.5)
    np.testing.assert_array_equal(fo, expected)
    rev = base[::-1, ::-1].copy()[::-1, ::-1]
    cyattn.matmul_accumulate(a, b, rev, alpha=0.5)
    np.testing.assert_array_equal(rev, expected)
    # out is a itself: a <- a + 0.5 a @ b
    aa = a.copy()
    ref = oracle_matmul(a, b, a, 0.5)
    assert call_checked(cyattn.matmul_accumulate, aa, b, aa, alpha=0.5) is aa
    assert_close(aa, ref, dtype, k=K)
    # out is b itself: b <- b + c @ b with square c
    c = grid_values(rng, (K, K)).astype(dtype)
    bb = b.copy()
    ref = oracle_matmul(c, b, b, 1.0)
    cyattn.matmul_accumulate(c, bb, bb)
    assert_close(bb, ref, dtype, k=K)
    # out overlaps a (a is a shifted window of the same buffer)
    buf = grid_values(rng, (M + 1, K)).astype(dtype)
    a2, o2 = buf[:M].copy(), buf[1:].copy()
    ref = oracle_matmul(a2, b, o2, 1.0)
    cyattn.matmul_accumulate(buf[:M], b, buf[1:])
    assert_close(buf[1:], ref, dtype, k=K)


@all_dtypes
def test_sdpa_out(variant, dtype):
    rng = np.random.default_rng(23)
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in ((2, 7, 5), (2, 7, 5), (2, 7, 5)))
    keep = rng.random((7, 7)) < 0.7
    expected, lse_expected = sdpa(q, k, v, keep, return_lse=True)
    out = np.empty_like(q)
    res, lse = sdpa(q, k, v, keep, out=out, return_lse=True)
    assert res is out
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(lse, lse_expected)
    big = np.full((2, 14, 10), 9.0, dtype)
    view = big[:, ::2, 1::2]
    assert sdpa(q, k, v, keep, out=view) is view
    np.testing.assert_array_equal(view, expected)
    assert (big[:, 1::2] == 9).all() and (big[:, :, ::2] == 9).all()
    for alias in ("query", "key", "value"):
        qq, kk, vv = q.copy(), k.copy(), v.copy()
        target = {"query": qq, "key": kk, "value": vv}[alias]
        res = cyattn.scaled_dot_product_attention(qq, kk, vv, keep, out=target)
        assert res is target
        np.testing.assert_array_equal(target, expected)


# ------------------------------------------------------------------------------------------
# Memory layouts give the same result as contiguous copies
# ------------------------------------------------------------------------------------------

@softmax_fns
@all_dtypes
def test_softmax_layouts(variant, dtype, log):
    rng = np.random.default_rng(24)
    x = rng.standard_normal((4, 6, 33)).astype(dtype)
    keep = rng.random((4, 6, 33)) < 0.7
    add = rng.standard_normal((6, 33)).astype(dtype)
    for axis in (-1, 1):
        for mask in (None, keep, add):
            expected = _sm(log)(x, axis=axis, mask=mask)
            for name, xl in layout_variants(x):
                got = call_checked(_sm(log), xl, axis=axis, mask=mask)
                np.testing.assert_array_equal(got, expected, err_msg=name)
            if mask is not None:
                for name, ml in layout_variants(mask):
                    got = call_checked(_sm(log), x, axis=axis, mask=ml)
                    np.testing.assert_array_equal(got, expected, err_msg="mask " + name)


@all_dtypes
def test_matmul_layouts(variant, dtype):
    rng = np.random.default_rng(25)
    a = grid_values(rng, (2, 35, 27)).astype(dtype)
    b = grid_values(rng, (2, 27, 30)).astype(dtype)
    base = grid_values(rng, (2, 35, 30)).astype(dtype)
    expected = base.copy()
    cyattn.matmul_accumulate(a, b, expected, alpha=-1.25)
    for which in ("a", "b"):
        for name, arr in layout_variants(a if which == "a" else b):
            out = base.copy()
            args = (arr, b) if which == "a" else (a, arr)
            call_checked(cyattn.matmul_accumulate, *args, out, alpha=-1.25)
            np.testing.assert_array_equal(out, expected, err_msg=f"{which} {name}")
    for name, out in layout_variants(base):
        if not out.flags.writeable:
            continue
        cyattn.matmul_accumulate(a, b, out, alpha=-1.25)
        np.testing.assert_array_equal(out, expected, err_msg="out " + name)


@all_dtypes
def test_sdpa_layouts(variant, dtype):
    rng = np.random.default_rng(26)
    q = rng.standard_normal((2, 3, 70, 9)).astype(dtype)
    k = rng.standard_normal((2, 3, 11, 9)).astype(dtype)
    v = rng.standard_normal((2, 3, 11, 5)).astype(dtype)
    keep = rng.random((70, 11)) < 0.7
    add = rng.standard_normal((2, 1, 70, 11)).astype(dtype)
    for mask in (None, keep, add):
        expected, lse_e = sdpa(q, k, v, mask, return_lse=True, is_causal=True,
                               causal_alignment="bottom_right")
        for pos in range(4 if mask is not None else 3):
            src = (q, k, v, mask)[pos]
            for name, arr in layout_variants(src):
                args = [q, k, v, mask]
                args[pos] = arr
                got, lse = sdpa(*args, return_lse=True, is_causal=True,
                                causal_alignment="bottom_right")
                np.testing.assert_array_equal(got, expected, err_msg=f"arg {pos} {name}")
                np.testing.assert_array_equal(lse, lse_e, err_msg=f"arg {pos} {name}")


# ------------------------------------------------------------------------------------------
# Dtypes
# ------------------------------------------------------------------------------------------

def test_mixed_dtypes_promote(variant):
    rng = np.random.default_rng(27)
    q32 = rng.standard_normal((4, 3)).astype(np.float32)
    k64 = rng.standard_normal((5, 3))
    v16 = rng.standard_normal((5, 2)).astype(np.float16)
    out = sdpa(q32, k64, v16)
    assert out.dtype == np.float64
    ref, _ = oracle_sdpa(q32, k64, v16)
    assert_close(out, ref, np.float64, k=8)
    out = sdpa(q32, q32[:2].astype(np.float16), v16[:2])
    assert out.dtype == np.float32
    # float64 mask does not promote float32 data
    assert sdpa(q32, q32, q32, np.zeros((4, 4))).dtype == np.float32
    assert cyattn.softmax(q32, mask=np.zeros(3)).dtype == np.float32
    out = np.zeros((4, 2))
    cyattn.matmul_accumulate(q32, v16[:3].astype(np.float64), out)
    assert_close(out, q32.astype(np.float64) @ v16[:3].astype(np.float64), np.float64, k=3)
    out = np.zeros((4, 2), np.float32)
    cyattn.matmul_accumulate(q32, v16[:3], out)
    assert_close(out, q32.astype(np.float64) @ v16[:3].astype(np.float64), np.float32, k=3)


def test_array_likes_accepted(variant):
    got = cyattn.softmax([1.0, 2.0, 3.0])
    assert got.dtype == np.float64
    assert_close(got, oracle_softmax(np.array([1.0, 2.0, 3.0])), np.float64)
    q, k, v = [[1.0]], [[2.0], [1.0], [0.0]], [[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]]
    out = cyattn.scaled_dot_product_attention(q, k, v, scale=1.0)
    assert out.dtype == np.float64
    assert_close(out, oracle_sdpa(np.array(q), np.array(k), np.array(v), scale=1.0)[0],
                 np.float64)
    out = np.zeros((1, 1))
    cyattn.matmul_accumulate([[1.0, 2.0]], [[3.0], [4.0]], out)
    assert out[0, 0] == 11.0


# ------------------------------------------------------------------------------------------
# NaN / inf semantics
# ------------------------------------------------------------------------------------------

@softmax_fns
@all_dtypes
def test_softmax_nan_inf(variant, dtype, log):
    x = np.array([[1.0, np.nan, 2.0],       # NaN permitted -> NaN row
                  [1.0, np.inf, 2.0],       # +inf -> NaN row
                  [-np.inf, -np.inf, -np.inf],  # all -inf -> zeros / -inf
                  [0.0, -np.inf, 1.0],      # -inf entry -> weight 0
                  [np.inf, np.inf, 0.0],
                  [np.nan, -np.inf, -np.inf]], dtype)
    got = call_checked(_sm(log), x)
    assert np.isnan(got[[0, 1, 4, 5]]).all()
    np.testing.assert_array_equal(got[2], np.full(3, -np.inf if log else 0.0, dtype))
    assert got[3, 1] == (-np.inf if log else 0.0)
    assert_close(got, oracle_softmax(x, log=log), dtype)
    # the same NaN/inf entries masked out by a bool mask do not leak
    keep = np.array([True, False, True])
    got = call_checked(_sm(log), x[:2], mask=keep)
    assert np.isfinite(got[:, [0, 2]]).all()
    assert_close(got, oracle_softmax(x[:2], mask=keep, log=log), dtype)


@native_dtypes
def test_softmax_subnormal_results(variant, dtype):
    got = cyattn.softmax(np.array([0.0, -100.0], dtype))
    tiny = np.exp(np.float64(-100.0))
    assert got[1] > 0
    if dtype == np.float32:
        assert got[1] < np.finfo(np.float32).tiny          # a float32 subnormal
        assert abs(float(got[1]) - tiny) <= 2 * 2.0 ** -149
    got = cyattn.softmax(np.array([0.0, -740.0]))
    assert got[1] > 0 and got[1] < np.finfo(np.float64).tiny
    assert abs(got[1] - math.exp(-740.0)) <= 2 * 2.0 ** -1074


@native_dtypes
def test_sdpa_nan_inf(variant, dtype):
    rng = np.random.default_rng(28)
    L, S, E, Ev = 5, 6, 4, 3
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in ((L, E), (S, E), (S, Ev)))
    keep = np.ones((L, S), bool)
    keep[:, 2] = False
    # NaN / inf in a masked key and value do not leak
    for bad in (np.nan, np.inf, -np.inf):
        kb, vb = k.copy(), v.copy()
        kb[2, 1] = bad
        vb[2, 0] = bad
        out, lse = sdpa(q, kb, vb, keep, return_lse=True)
        assert np.isfinite(out).all() and np.isfinite(lse).all()
        ref_out, ref_lse = oracle_sdpa(q, kb, vb, keep)
        assert_close(out, ref_out, dtype, k=10)
        assert_close(lse, ref_lse, dtype, k=10)
    # NaN in a value a causal mask removes does not leak
    vb = v.copy()
    vb[S - 1] = np.nan
    out = sdpa(q, k, vb, is_causal=True)
    assert np.isfinite(out).all()
    assert_close(out, oracle_sdpa(q, k, vb, None, True)[0], dtype, k=10)
    # NaN in a value whose weight underflows to exactly 0 is not read (oracle: w == 0 skipped)
    qq = np.zeros((1, 1), dtype)
    qq[0, 0] = 1
    kk = np.array([[0.0], [-1e4]], dtype)
    vv = np.array([[1.0], [np.nan]], dtype)
    out = sdpa(qq, kk, vv, scale=1.0)
    np.testing.assert_array_equal(out, [[1.0]])
    # NaN in a permitted key -> that row NaN; NaN in a permitted value -> NaN output
    kb = k.copy()
    kb[0, 0] = np.nan
    out, lse = sdpa(q, kb, v, is_causal=True, return_lse=True)
    assert np.isnan(out).all() and np.isnan(lse).all()       # key 0 is seen by every row
    assert_close(out, oracle_sdpa(q, kb, v, None, True)[0], dtype, k=10)
    qb = q.copy()
    qb[3, 0] = np.nan
    out, lse = sdpa(qb, k, v, return_lse=True)
    assert np.isnan(out[3]).all() and np.isnan(lse[3]) and np.isfinite(np.delete(out, 3, 0)).all()
    # +inf score -> NaN row (float mask +inf at a permitted position)
    add = np.zeros((L, S), dtype)
    add[1, 4] = np.inf
    out, lse = sdpa(q, k, v, add, return_lse=True)
    assert np.isnan(out[1]).all() and np.isnan(lse[1])
    assert np.isfinite(np.delete(out, 1, 0)).all()
    assert_close(out, oracle_sdpa(q, k, v, add)[0], dtype, k=10)
    # all -inf float-mask row -> zeros, lse -inf
    add = np.zeros((L, S), dtype)
    add[2] = -np.inf
    out, lse = sdpa(q, k, v, add, return_lse=True)
    np.testing.assert_array_equal(out[2], 0)
    assert lse[2] == -np.inf
    # inf in a permitted value -> inf/NaN as the oracle says
    vb = v.copy()
    vb[1, 1] = np.inf
    out = sdpa(q, k, vb)
    assert_close(out, oracle_sdpa(q, k, vb)[0], dtype, k=10)


# ------------------------------------------------------------------------------------------
# exp accuracy (the kernels' exp_values)
# ------------------------------------------------------------------------------------------

def _ulp_error(got, ref, dtype):
    """|got - ref| in units of the last place of ``ref`` (in ``dtype``; float64 ``ref``)."""
    got = got.astype(np.float64)
    mant_bits, min_exp = (24, -149) if dtype == np.float32 else (53, -1074)
    _, e = np.frexp(ref)
    ulp = np.ldexp(1.0, np.maximum(e.astype(np.int64) - mant_bits, min_exp))
    with np.errstate(invalid="ignore"):
        return np.abs(got - ref) / ulp


def _exp_ref(xs):
    """math.exp of every entry (inf where it overflows)."""
    out = []
    for v in xs.tolist():
        try:
            out.append(math.exp(v))
        except OverflowError:
            out.append(math.inf)
    return np.array(out)


def _check_exp32(kern, xs):
    got = np.empty_like(xs)
    kern.exp_values(xs, got)
    ref = np.exp(xs.astype(np.float64))   # correctly rounded to << 1 float32 ulp
    with np.errstate(over="ignore"):
        ref32 = ref.astype(np.float32)
    over = np.isinf(ref32)
    assert np.isinf(got[over]).all() and (got[over] > 0).all()
    err = _ulp_error(got[~over], ref[~over], np.float32)
    worst = int(np.argmax(err)) if err.size else 0
    assert err.size == 0 or err[worst] <= 2.0, (xs[~over][worst], got[~over][worst],
                                                ref[~over][worst], err[worst])
    return got


def _f32_range(lo_bits, hi_bits, step):
    return np.arange(lo_bits, hi_bits, step, dtype=np.uint32).view(np.float32)


POS_MAX = int(np.float32(89.0).view(np.uint32))
NEG_MIN = int(np.float32(-104.0).view(np.uint32))


def test_exp_float32_sweep(variant):
    kern = _backend.kernels
    # every 127th float32 in [0, 89] and [-104, -0] (all exponents), against math.exp
    xs = np.concatenate([_f32_range(0, POS_MAX + 1, 127), _f32_range(0x80000000, NEG_MIN + 1, 127)])
    got = np.empty_like(xs)
    kern.exp_values(xs, got)
    sample = xs[::23]
    ref = _exp_ref(sample.astype(np.float64))
    with np.errstate(over="ignore"):
        over = np.isinf(ref.astype(np.float32))
    err = _ulp_error(got[::23][~over], ref[~over], np.float32)
    assert err.max() <= 2.0
    _check_exp32(kern, xs)
    # dense: every float32 in the subnormal-result zone, near overflow and around 0
    _check_exp32(kern, np.concatenate([
        _f32_range(int(np.float32(-87.5).view(np.uint32)), NEG_MIN + 1, 1),
        _f32_range(int(np.float32(88.0).view(np.uint32)), POS_MAX + 1, 1),
        _f32_range(int(np.float32(0.5).view(np.uint32)), int(np.float32(1.5).view(np.uint32)), 3),
        _f32_range(0x80000000 | int(np.float32(0.5).view(np.uint32)),
                   0x80000000 | int(np.float32(1.5).view(np.uint32)), 3),
    ]))


@pytest.mark.slow
def test_exp_float32_every_value(variant):
    """Every float32 in [-104, 89] (the rest clamps to 0 / inf): ~2.1e9 values, minutes."""
    kern = _backend.kernels
    for lo, hi in ((0, POS_MAX + 1), (0x80000000, NEG_MIN + 1)):
        for start in range(lo, hi, 1 << 24):
            _check_exp32(kern, _f32_range(start, min(hi, start + (1 << 24)), 1))


NONPOS_LO = int(np.float32(-87.0).view(np.uint32))


def _check_exp_nonpos_bits(kern, xs):
    """The shortened exp of arguments in [EXP_NORMAL, 0] gives exp's own bits."""
    full = np.empty_like(xs)
    short = np.empty_like(xs)
    kern.exp_values(xs, full)
    kern.exp_values(xs, short, True)
    bad = full.view(np.uint32 if xs.dtype == np.float32 else np.uint64) != short.view(
        np.uint32 if xs.dtype == np.float32 else np.uint64)
    assert not bad.any(), (xs[bad][:5], full[bad][:5], short[bad][:5])


def test_exp_nonpos_same_bits(variant):
    # softmax and attention rows with no masked or far-off score use exp_nonpos
    kern = _backend.kernels
    _check_exp_nonpos_bits(kern, np.concatenate([
        _f32_range(0x80000000, NONPOS_LO + 1, 97),             # every 97th in [-87, -0]
        _f32_range(NONPOS_LO - 200_000, NONPOS_LO + 1, 1),      # just above -87 (tiny results)
        _f32_range(0x80000000, 0x80000000 + 200_000, 1),       # just below 0
        _f32_range(int(np.float32(-0.35).view(np.uint32)), int(np.float32(-0.34).view(
            np.uint32)), 1),                                   # around the -ln2/2 reduction edge
        np.array([0.0], np.float32)]))
    rng = np.random.default_rng(31)
    _check_exp_nonpos_bits(kern, np.concatenate([
        rng.uniform(-708.0, 0.0, 400_000), np.linspace(-708.0, -700.0, 100_001),
        -rng.random(50_000) * 1e-6, np.array([0.0, -0.0, -708.0])]))


@pytest.mark.slow
def test_exp_nonpos_every_float32(variant):
    """Every float32 in [-87, 0]: the shortened exp gives exp's bits (~1.1e9 values)."""
    kern = _backend.kernels
    for start in range(0x80000000, NONPOS_LO + 1, 1 << 24):
        _check_exp_nonpos_bits(kern, _f32_range(start, min(NONPOS_LO + 1, start + (1 << 24)), 1))


def test_exp_float64_sweep(variant):
    kern = _backend.kernels
    rng = np.random.default_rng(29)
    xs = np.concatenate([np.linspace(-746.0, 709.7, 400_001), rng.uniform(-746, 710, 200_000),
                         rng.uniform(-1, 1, 50_000), np.linspace(-745.2, -707.0, 50_001),
                         np.linspace(709.0, 709.782712893384, 10_001),
                         rng.standard_normal(50_000) * 1e-6])
    got = np.empty_like(xs)
    kern.exp_values(xs, got)
    ref = _exp_ref(xs)
    over = np.isinf(ref)
    assert np.isinf(got[over]).all()
    err = _ulp_error(got[~over], ref[~over], np.float64)
    worst = int(np.argmax(err))
    assert err[worst] <= 2.0, (xs[~over][worst], got[~over][worst], ref[~over][worst])
    # subnormal results are kept
    sub = (ref > 0) & (ref < np.finfo(np.float64).tiny)
    assert sub.sum() > 1000 and (got[sub] > 0).all()


@pytest.mark.parametrize("dtype", NATIVE, ids=NATIVE_IDS)
def test_exp_special_values(variant, dtype):
    kern = _backend.kernels
    big = 1e30 if dtype == np.float32 else 1e300
    xs = np.array([-np.inf, np.inf, np.nan, -big, big, 0.0, -0.0, -100.0], dtype)
    got = np.empty_like(xs)
    kern.exp_values(xs, got)
    assert got[0] == 0 and not np.signbit(got[0])
    assert got[1] == np.inf and np.isnan(got[2]) and got[3] == 0 and got[4] == np.inf
    assert got[5] == 1 and got[6] == 1
    assert 0 < got[7] and abs(float(got[7]) - math.exp(-100.0)) <= 2 * np.spacing(
        dtype(math.exp(-100.0)))
    if dtype == np.float32:
        assert got[7] < np.finfo(np.float32).tiny
        got = np.empty(1, dtype)
        kern.exp_values(np.array([-103.9], dtype), got)
        assert got[0] > 0            # the smallest subnormals survive
    else:
        got = np.empty(2, dtype)
        kern.exp_values(np.array([-745.0, -744.0], dtype), got)
        assert (got > 0).all()                        # the smallest subnormals survive
        assert (np.abs(got - [math.exp(-745.0), math.exp(-744.0)]) <= 2 * 5e-324).all()


# ------------------------------------------------------------------------------------------
# Values we got wrong once (found by this suite, fixed since; each stays as a test)
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,big", [(np.float64, 1e308), (np.float32, 2e38)],
                         ids=["f64", "f32"])
def test_sdpa_output_of_huge_finite_values_stays_finite(variant, dtype, big):
    q = np.zeros((1, 1), dtype)
    k = np.zeros((2, 1), dtype)
    v = np.full((2, 1), big, dtype)
    ref, _ = oracle_sdpa(q, k, v)                     # weights 0.5, 0.5 -> big
    out = sdpa(q, k, v)
    assert np.isfinite(out).all()
    assert_close(out, ref, dtype)


def test_sdpa_value_with_exactly_zero_weight_is_not_read(variant):
    q = np.ones((1, 1))
    k = np.array([[0.0], [0.0], [-744.44]])         # exp(-744.44) = 5e-324; / 2 -> 0.0
    v = np.array([[1.0], [3.0], [np.nan]])
    weights = cyattn.softmax(k[:, 0])
    assert weights[2] == 0.0                          # the key's weight is exactly 0
    ref, _ = oracle_sdpa(q, k, v, scale=1.0)
    np.testing.assert_array_equal(ref, [[2.0]])
    np.testing.assert_array_equal(sdpa(q, k, v, scale=1.0), ref)


@pytest.mark.parametrize("fn", ["sdpa", "softmax", "log_softmax"])
def test_float_mask_cast_to_compute_dtype_without_warning(variant, fn):
    x = np.ones((2, 3), np.float32)
    mask = np.array([[0.0, -1e300, 0.0], [-1e300, -1e300, -1e300]])
    log = fn == "log_softmax"
    # documented: the mask is cast to float32 saturating at finfo.min, so -1e300 stays finite
    # and row 1 is the plain mean (as the oracle computes it in float64), not fully masked
    kv = np.arange(9, dtype=np.float32).reshape(3, 3)
    if fn == "sdpa":
        expected = oracle_sdpa(x, kv, kv, mask)[0]
    else:
        expected = oracle_softmax(x, mask=mask, log=log)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if fn == "sdpa":
            out = cyattn.scaled_dot_product_attention(x, kv, kv, mask)
        else:
            out = _sm(log)(x, mask=mask)
    assert out.dtype == np.float32
    assert_close(out, expected, np.float32)


@pytest.mark.parametrize("alpha", [np.inf, np.nan])
def test_matmul_k_zero_with_nonfinite_alpha(variant, alpha):
    a, b = np.zeros((2, 0)), np.zeros((0, 3))
    out = np.ones((2, 3))
    expected = oracle_matmul(a, b, out, alpha)
    with np.errstate(invalid="ignore"):
        assert np.isnan(numpy_matmul(a, b, out, alpha)).all()
    assert np.isnan(expected).all()
    cyattn.matmul_accumulate(a, b, out, alpha=alpha)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("alpha", [np.inf, -np.inf])
def test_matmul_infinite_alpha_over_several_k_blocks(variant, dtype, alpha):
    """alpha * (a @ b), not the sum of alpha * each KC-block's partial sum: with partial sums
    of opposite signs the latter was inf - inf = NaN (found by hypothesis, K = 257)."""
    K = 257
    a = np.ones((2, K), dtype)
    a[:, -1] = -1000                  # block 1 sums to +256, block 2 to -1000
    a[1] = 0                          # a zero row: inf * 0 is NaN, as in NumPy and the oracle
    b = np.ones((K, 3), dtype)
    out = np.ones((2, 3), dtype)
    expected = oracle_matmul(a, b, out, alpha)
    cyattn.matmul_accumulate(a, b, out, alpha=alpha)
    np.testing.assert_array_equal(out, np.asarray(expected, dtype))
    assert np.isinf(out[0]).all() and (np.sign(out[0]) == -np.sign(alpha)).all()
    assert np.isnan(out[1]).all()


# ------------------------------------------------------------------------------------------
# The encoder's row passes (_encoder_rows.pxi): bias + GELU and LayerNorm
# ------------------------------------------------------------------------------------------

def test_gelu_matches_exact_erf_gelu(variant):
    from cyattn.encoder import gelu_
    x = np.linspace(-12, 12, 240001, dtype=np.float32)
    x = np.concatenate([x, np.float32([0.0, -0.0, 1e-30, -1e-30, 30.0, -30.0, 1e4, -1e4])])
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # no overflow warning escapes
        got = gelu_(x.copy())
        huge = gelu_(np.float32([3e38, -3e38, 1e30, -1e30, np.inf]))
    np.testing.assert_array_equal(huge, np.float32([3e38, 0, 1e30, 0, np.inf]))
    assert np.isnan(gelu_(np.float32([np.nan]))).all()
    exact = np.array([0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x.tolist()])
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got[np.abs(x) <= 1], exact[np.abs(x) <= 1], rtol=4e-7, atol=1e-12)


def test_gelu_rejects_what_it_cannot_write():
    from cyattn.encoder import gelu_
    with pytest.raises(ValueError, match="float32"):
        gelu_(np.zeros(4))
    with pytest.raises(ValueError, match="contiguous"):
        gelu_(np.zeros((4, 4), np.float32)[:, ::2])
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        gelu_(ro)


ROW_WIDTHS = [1, 7, 31, 32, 33, 64, 100, 384, 1000]


@pytest.mark.parametrize("n", ROW_WIDTHS)
def test_gelu_rows_bias_is_added_first(variant, n):
    from cyattn.encoder import _bert
    rng = np.random.default_rng(n)
    h = (rng.standard_normal((5, n)) * 3).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    fused = h.copy()
    _backend.kernels.gelu_rows(fused, bias, _bert._GELU_P, 1)
    np.testing.assert_array_equal(fused, _bert.gelu_(h + bias))


@pytest.mark.parametrize("n", ROW_WIDTHS)
def test_layer_norm_rows_match_float64(variant, n):
    # torch.nn.LayerNorm's definition: biased variance, eps inside the square root; rows far
    # from zero mean (the centring must not lose them), tiny-variance and constant rows
    rng = np.random.default_rng(100 + n)
    x = (rng.standard_normal((6, n)) * rng.uniform(0.01, 20, (6, 1))
         + rng.uniform(-50, 50, (6, 1))).astype(np.float32)
    x[4] = np.float32(3.25)
    x[5] = x[5] * np.float32(1e-4) + np.float32(7)
    weight = rng.standard_normal(n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    for eps in (1e-12, 1e-5):
        got = x.copy()
        _backend.kernels.layer_norm_rows(got, weight, bias, eps, 1)
        x64 = x.astype(np.float64)
        centred = x64 - x64.mean(axis=1, keepdims=True)
        var = (centred * centred).mean(axis=1, keepdims=True)
        expected = centred / np.sqrt(var + np.float32(eps)) * weight + bias
        # a row's mean and variance are n-term float32 sums; the constant row is exact
        assert_close(got, expected, np.float32, k=n)
        np.testing.assert_array_equal(got[4], bias)


@pytest.mark.parametrize("threads", [2, 3])
def test_encoder_row_passes_same_bits_for_any_thread_count_and_batch(variant, threads):
    from cyattn.encoder import _bert
    rng = np.random.default_rng(threads)
    rows, n = 301, 384                     # enough elements for every thread to get rows
    x = (rng.standard_normal((rows, n)) * 4).astype(np.float32)
    w, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    K = _backend.kernels
    one, many, alone = x.copy(), x.copy(), x[150:151].copy()
    K.layer_norm_rows(one, w, b, 1e-12, 1)
    K.layer_norm_rows(many, w, b, 1e-12, threads)
    K.layer_norm_rows(alone, w, b, 1e-12, threads)
    np.testing.assert_array_equal(one, many)
    np.testing.assert_array_equal(alone[0], one[150])
    one, many, alone = x.copy(), x.copy(), x[150:151].copy()
    K.gelu_rows(one, b, _bert._GELU_P, 1)
    K.gelu_rows(many, b, _bert._GELU_P, threads)
    K.gelu_rows(alone, b, _bert._GELU_P, threads)
    np.testing.assert_array_equal(one, many)
    np.testing.assert_array_equal(alone[0], one[150])
