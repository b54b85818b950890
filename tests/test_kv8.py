"""8-bit K/V caches (issue 39): int8 K/V with float32 scales and float8_e4m3fn K/V with
optional scales, ``key_scale=`` / ``value_scale=`` broadcastable to ``key.shape[:-1] + (1,)``.

The decode path (at most 16 query rows) reads them in place; other calls dequantise them to
float32 copies. Every case is compared with ``cyattn.oracle`` on the exactly dequantised values
(``k8 * key_scale`` in float64), on every compiled variant, for group sizes 1, 2, 3 (not
dividing 2 threads), 4 and 8, per-token, per-head and per-tensor scales, every decode option,
at 1, 2 and 3 threads with bit-identical results.

Tolerance: the float32 one of conftest, with the float32 K/V suites' k = S + E. Every int8 and
e4m3fn value is exact in float32, so the kernels compute in float32 on exactly the dequantised
values, except that a key's scale multiplies its score and a value's scale its weight: one
extra float32 rounding (2^-24 relative) per score and per weight, the size of the rounding of
one element of a float32 K/V. Power-of-two scales make those products exact: such calls must
then give the bits of the float32 call on the dequantised arrays.
"""
import math
import tracemalloc

import numpy as np
import pytest
from conftest import (
    add_decode_entry_options, assert_close, decode_option_kwargs, grid_values, numpy_sdpa,
    numpy_sdpa_variants, oracle_sdpa_variants,
)

import cyattn
from cyattn import _backend, oracle

try:
    import ml_dtypes
    F8 = np.dtype(ml_dtypes.float8_e4m3fn)
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:          # the float8 tests skip
    ml_dtypes = F8 = BF16 = None

needs_f8 = pytest.mark.skipif(F8 is None, reason="ml_dtypes is not installed")
KINDS = ["int8", pytest.param("float8", marks=needs_f8)]
F32 = np.dtype(np.float32)
E, EV = 8, 12


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


def _quantised(rng, kind, shape):
    """8-bit values of ``kind``: int8 over the full range, or e4m3fn of about unit size."""
    if kind == "int8":
        return rng.integers(-127, 128, size=shape).astype(np.int8)
    return (rng.standard_normal(shape) * 1.5).astype(F8)


def _scales(rng, kind, layout, shape):
    """Scales of ``layout`` for 8-bit values of ``shape`` (..., S, E): 'token' (..., S, 1),
    'head' (..., 1, 1), 'tensor' (a Python float), 'pow2' per token and powers of two, or
    'none' (float8 only). int8 scales bring the values to about unit size."""
    unit = 1.0 / 64 if kind == "int8" else 1.0
    if layout == "none":
        return None
    if layout == "tensor":
        return float(np.float32(unit * 1.3))
    sshape = shape[:-1] + (1,) if layout in ("token", "pow2") else shape[:-2] + (1, 1)
    if layout == "pow2":
        return (unit * 2.0 ** rng.integers(-2, 3, size=sshape)).astype(np.float32)
    return (unit * (0.5 + rng.random(sshape))).astype(np.float32)


@pytest.fixture
def in_place(monkeypatch):
    """The calls of the test must read the 8-bit K/V in place: dequantising fails it."""
    from cyattn import _kv8

    def refuse(*args):
        raise AssertionError("an 8-bit decode call dequantised K or V")
    monkeypatch.setattr(_kv8, "dequantize", refuse)


def _dequantised(x8, scale):
    x = x8.astype(np.float64)
    return x if scale is None else x * np.asarray(scale, dtype=np.float64)


# (B, Hkv, g, L, S), as test_decode_grouped: g = 1 (with L <= 4 the ungrouped shape), 2, 3, 4
# and 8; several chunks of keys per call
CASES = [(1, 2, 1, 1, 300), (2, 1, 1, 4, 300), (1, 2, 2, 3, 300), (1, 1, 3, 2, 700),
         (1, 2, 4, 1, 300), (2, 1, 4, 16, 260), (1, 1, 8, 5, 300)]

OPTIONS = {
    "plain": {},
    "bool-mask": {"mask": "bool"},
    "float-mask": {"mask": "float"},
    "causal-br": {"is_causal": True, "causal_alignment": "bottom_right"},
    "window-br": {"causal_alignment": "bottom_right", "window": (90, 3), "is_causal": True},
    "key-lengths": {"key_lengths": True, "is_causal": True, "causal_alignment": "bottom_right"},
    "query-lengths": {"query_lengths": True, "mask": "bool"},
    "softcap-alibi-sinks": {"softcap": 2.5, "alibi_slopes": True, "sinks": True,
                            "is_causal": True, "causal_alignment": "bottom_right"},
}


def _case(B, Hkv, g, L, S, kind, layout, option, seed=0, e=E, ev=EV):
    """(q, k8, v8, key_scale, value_scale, kwargs) of one call."""
    rng = np.random.default_rng([seed, B, Hkv, g, L, S, len(option), len(layout), len(kind)])
    Hq = Hkv * g
    q = grid_values(rng, (B, Hq, L, e), step=1.0 / 64).astype(np.float32)
    k8 = _quantised(rng, kind, (B, Hkv, S, e))
    v8 = _quantised(rng, kind, (B, Hkv, S, ev))
    ks = _scales(rng, kind, layout, k8.shape)
    vs = _scales(rng, kind, "head" if layout == "token" else layout, v8.shape)
    spec = OPTIONS[option]
    kw = decode_option_kwargs(spec)
    if spec.get("mask") == "bool":
        kw["attn_mask"] = rng.random((Hq, L, S)) < 0.8
    elif spec.get("mask") == "float":
        m = grid_values(rng, (L, S)).astype(np.float32)
        m[rng.random((L, S)) < 0.2] = -np.inf
        kw["attn_mask"] = m
    add_decode_entry_options(rng, spec, kw, B, Hq, L, S)
    return q, k8, v8, ks, vs, kw


def _reference(q, k8, v8, ks, vs, kw, use_oracle=True):
    kw = {n: a for n, a in kw.items() if n != "return_lse"}
    mask = kw.pop("attn_mask", None)
    ref = oracle_sdpa_variants if use_oracle else numpy_sdpa_variants
    return ref(q, _dequantised(k8, ks), _dequantised(v8, vs), mask, **kw)


def _call(q, k8, v8, ks, vs, kw, n_threads):
    return cyattn.scaled_dot_product_attention(q, k8, v8, key_scale=ks, value_scale=vs,
                                               n_threads=n_threads, **kw)


def _check(got, want, S, e, msg):
    assert_close(got[0], want[0], F32, S + e, err_msg=f"out {msg}")
    assert_close(got[1], want[1], F32, S + e, err_msg=f"lse {msg}")


def _thread_identical(results, msg):
    for got in results[1:]:
        assert np.array_equal(_bits(got[0]), _bits(results[0][0])), msg
        assert np.array_equal(_bits(got[1]), _bits(results[0][1])), msg


# ------------------------------------------------------------------------------------------
# widening
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_widening_is_exact_for_all_256_patterns(variant, kind):
    """Every 8-bit pattern widens to its float32 value (the e4m3fn NaNs 0x7f/0xff to NaN),
    on runs of every length class (vector blocks and scalar tails) and unaligned starts."""
    kernels = _backend.kernels
    allbits = np.arange(256, dtype=np.uint8)
    if kind == "int8":
        ref, fmt = allbits.view(np.int8).astype(np.float32), 3
    else:
        ref, fmt = allbits.view(F8).astype(np.float32), 4
    for start, stop in ((0, 256), (1, 256), (3, 12), (5, 6), (200, 255)):
        src = allbits[start:stop].copy()
        got = np.empty(stop - start, np.float32)
        kernels.kv8_to_float32(src, got, fmt)
        want = ref[start:stop]
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan)
        assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    with pytest.raises(ValueError, match="kv8_to_float32"):
        kernels.kv8_to_float32(allbits[:4], np.empty(3, np.float32), 3)
    with pytest.raises(ValueError, match="kv8_to_float32"):
        kernels.kv8_to_float32(allbits[:4], np.empty(4, np.float32), 2)


# ------------------------------------------------------------------------------------------
# against the oracle
# ------------------------------------------------------------------------------------------

_ORACLE = {}


@pytest.mark.parametrize("layout", ["token", "head", "tensor"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-Hkv{}-g{}-L{}-S{}".format(*c))
def test_decode_matches_oracle(variant, in_place, case, kind, layout):
    S = case[-1]
    for option in OPTIONS:
        q, k8, v8, ks, vs, kw = _case(*case, kind, layout, option)
        key = (case, kind, layout, option)
        if key not in _ORACLE:
            _ORACLE[key] = _reference(q, k8, v8, ks, vs, kw)
        results = [_call(q, k8, v8, ks, vs, kw, n) for n in (1, 2, 3)]
        _thread_identical(results, option)
        _check(results[0], _ORACLE[key], S, E, f"{option} {case} {kind} {layout}")


@needs_f8
@pytest.mark.parametrize("case", CASES[::2], ids=lambda c: "B{}-Hkv{}-g{}-L{}-S{}".format(*c))
def test_float8_without_scales_matches_oracle(variant, in_place, case):
    S = case[-1]
    for option in ("plain", "causal-br", "softcap-alibi-sinks"):
        q, k8, v8, ks, vs, kw = _case(*case, "float8", "none", option)
        want = _reference(q, k8, v8, ks, vs, kw)
        results = [_call(q, k8, v8, None, None, kw, n) for n in (1, 3)]
        _thread_identical(results, option)
        _check(results[0], want, S, E, f"{option} {case}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", [c for c in CASES if c[2] > 1],
                         ids=lambda c: "B{}-Hkv{}-g{}-L{}-S{}".format(*c))
def test_power_of_two_scales_give_the_float32_bits(variant, case, kind):
    """With power-of-two scales the folded products are exact, so an 8-bit call must give the
    bits of the float32 call on the dequantised arrays (both on the grouped path)."""
    for option in ("plain", "float-mask", "key-lengths", "softcap-alibi-sinks"):
        q, k8, v8, ks, vs, kw = _case(*case, kind, "pow2", option)
        got = _call(q, k8, v8, ks, vs, kw, 2)
        ref = cyattn.scaled_dot_product_attention(
            q, _dequantised(k8, ks).astype(np.float32), _dequantised(v8, vs).astype(np.float32),
            n_threads=2, **kw)
        assert np.array_equal(_bits(got[0]), _bits(ref[0])), option
        assert np.array_equal(_bits(got[1]), _bits(ref[1])), option


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("e,ev", [(128, 128), (67, 45)])
def test_power_of_two_scales_wide_heads(variant, in_place, kind, e, ev):
    """As above with heads wide enough for the passes' vector loops, odd row counts (an odd
    last query row) and key counts that leave 1-3 keys of a block."""
    for g, L, S in ((3, 1, 301), (2, 3, 259), (5, 1, 514)):
        q, k8, v8, ks, vs, kw = _case(1, 2, g, L, S, kind, "pow2", "causal-br", e=e, ev=ev)
        got = _call(q, k8, v8, ks, vs, kw, 3)
        ref = cyattn.scaled_dot_product_attention(
            q, _dequantised(k8, ks).astype(np.float32), _dequantised(v8, vs).astype(np.float32),
            n_threads=3, **kw)
        assert np.array_equal(_bits(got[0]), _bits(ref[0])), (g, L, S)
        assert np.array_equal(_bits(got[1]), _bits(ref[1])), (g, L, S)


@pytest.mark.parametrize("L", range(1, 17))
@pytest.mark.parametrize("g", [1, 2, 4, 8])
def test_every_row_count_and_group(in_place, L, g):
    """L = 1..16 rows per head for each group size, int8 with per-token scales, bottom-right
    causal with per-head key lengths, against the oracle and across 1, 2 and 3 threads."""
    B, Hkv, S = 1, 2, 420
    q, k8, v8, ks, vs, kw = _case(B, Hkv, g, L, S, "int8", "token", "causal-br", seed=L)
    kw["key_lengths"] = np.repeat(np.array([S - 7, S - 300]), g)[None]
    want = _reference(q, k8, v8, ks, vs, kw)
    results = [_call(q, k8, v8, ks, vs, kw, n) for n in (1, 2, 3)]
    _thread_identical(results, f"L={L} g={g}")
    _check(results[0], want, S, E, f"L={L} g={g}")


# ------------------------------------------------------------------------------------------
# shapes, layouts, non-finite values, the dequantised paths
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("e,ev", [(1, 1), (7, 9), (33, 17), (130, 128), (128, 130)])
def test_head_sizes(variant, in_place, kind, e, ev):
    """Head sizes on and off the widening's 8-element blocks and the passes' vector widths."""
    for g, L in ((1, 1), (3, 2), (4, 9)):
        q, k8, v8, ks, vs, kw = _case(1, 2, g, L, 600, kind, "token", "causal-br", e=e, ev=ev)
        results = [_call(q, k8, v8, ks, vs, kw, n) for n in (1, 3)]
        _thread_identical(results, f"g={g} L={L}")
        _check(results[0], _reference(q, k8, v8, ks, vs, kw, use_oracle=False), 600, e,
               f"E={e} Ev={ev} g={g} L={L}")


@pytest.mark.parametrize("kind", KINDS)
def test_strided_layouts(kind):
    """K/V and scales as strided views (every other row, a head-interleaved (B, S, H, E)
    buffer, Fortran order, reversed rows) give the results of C-contiguous copies."""
    rng = np.random.default_rng(11)
    q = grid_values(rng, (2, 8, 3, 40), step=1.0 / 64).astype(np.float32)
    base_k = _quantised(rng, kind, (2, 1200, 2, 40))
    base_v = _quantised(rng, kind, (2, 1200, 2, 24))
    base_s = _scales(rng, kind, "token", (2, 1200, 2, 40))
    views = {
        "interleaved": (base_k.transpose(0, 2, 1, 3), base_v.transpose(0, 2, 1, 3),
                        base_s.transpose(0, 2, 1, 3)),
        "every-other": (base_k.transpose(0, 2, 1, 3)[:, :, ::2],
                        base_v.transpose(0, 2, 1, 3)[:, :, ::2],
                        base_s.transpose(0, 2, 1, 3)[:, :, ::2]),
        "reversed": (base_k.transpose(0, 2, 1, 3)[:, :, ::-1],
                     base_v.transpose(0, 2, 1, 3)[:, :, ::-1],
                     base_s.transpose(0, 2, 1, 3)[:, :, ::-1]),
        "fortran": (np.asfortranarray(base_k.transpose(0, 2, 1, 3)),
                    np.asfortranarray(base_v.transpose(0, 2, 1, 3)),
                    np.asfortranarray(base_s.transpose(0, 2, 1, 3))),
    }
    kw = dict(enable_gqa=True, is_causal=True, causal_alignment="bottom_right", return_lse=True)
    for name, (k8, v8, ks) in views.items():
        got = cyattn.scaled_dot_product_attention(q, k8, v8, key_scale=ks, value_scale=0.03,
                                                  **kw)
        ref = cyattn.scaled_dot_product_attention(
            q, np.ascontiguousarray(k8), np.ascontiguousarray(v8),
            key_scale=np.ascontiguousarray(ks), value_scale=0.03, **kw)
        assert np.array_equal(_bits(got[0]), _bits(ref[0])), name
        assert np.array_equal(_bits(got[1]), _bits(ref[1])), name


@needs_f8
def test_float8_nan_makes_its_row_nan_and_is_never_read_when_masked():
    """An e4m3fn NaN key in a permitted position makes the row NaN (as the oracle); NaN keys
    and values past key_lengths are never read."""
    rng = np.random.default_rng(12)
    q = grid_values(rng, (1, 4, 1, 16), step=1.0 / 64).astype(np.float32)
    k8 = _quantised(rng, "float8", (1, 2, 500, 16))
    v8 = _quantised(rng, "float8", (1, 2, 500, 16))
    nan = np.array(0x7f, np.uint8).view(F8)
    k8[:, :, 400:] = nan
    v8[:, :, 400:] = nan
    got = cyattn.scaled_dot_product_attention(q, k8, v8, enable_gqa=True,
                                              key_lengths=np.array([400]))
    assert np.isfinite(got).all()
    want = numpy_sdpa(q, k8.astype(np.float64)[..., :400, :], v8.astype(np.float64)[..., :400, :],
                      enable_gqa=True)
    assert_close(got, want[0], F32, 400 + 16)
    k8[0, 1, 10, 3] = nan
    got = cyattn.scaled_dot_product_attention(q, k8, v8, enable_gqa=True,
                                              key_lengths=np.array([400]))
    assert np.isfinite(got[0, :2]).all() and np.isnan(got[0, 2:]).all()


@pytest.mark.parametrize("kind", KINDS)
def test_long_query_and_float64_take_the_dequantised_path(kind):
    """More than 16 query rows (prefill), float64 and half-precision queries, and mixed K/V
    (one 8-bit, one float) dequantise: the results of the dequantised arrays."""
    q, k8, v8, ks, vs, kw = _case(1, 2, 2, 40, 300, kind, "token", "causal-br")
    kw.pop("return_lse")
    kd, vd = _dequantised(k8, ks), _dequantised(v8, vs)
    got = _call(q, k8, v8, ks, vs, kw, 2)
    ref = cyattn.scaled_dot_product_attention(q, kd.astype(np.float32), vd.astype(np.float32),
                                              n_threads=2, **kw)
    assert np.array_equal(_bits(got), _bits(ref))
    got64 = _call(q.astype(np.float64), k8, v8, ks, vs, kw, 2)
    assert got64.dtype == np.float64
    assert_close(got64, numpy_sdpa(q, kd, vd, is_causal=True, causal_alignment="bottom_right",
                                   enable_gqa=True)[0], np.float64, 300 + E)
    mixed = cyattn.scaled_dot_product_attention(q[..., :3, :], k8, vd.astype(np.float32),
                                                key_scale=ks, **kw)
    want = numpy_sdpa(q[..., :3, :], kd, vd, is_causal=True, causal_alignment="bottom_right",
                      enable_gqa=True)[0]
    assert mixed.dtype == np.float32
    assert_close(mixed, want, F32, 300 + E)
    if BF16 is not None:
        qb = q[..., :3, :].astype(BF16)
        got = _call(qb, k8, v8, ks, vs, kw, 2)
        assert got.dtype == BF16          # 8-bit K/V do not take part in the promotion
        ref = _call(q[..., :3, :], k8, v8, ks, vs, kw, 2)
        assert np.array_equal(_bits(got), _bits(ref.astype(BF16)))


@pytest.mark.skipif(BF16 is None, reason="ml_dtypes is not installed")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("precision", [None, "fast", "exact"])
def test_bfloat16_prefill_over_an_8bit_cache(kind, precision):
    """A bfloat16 query of 40 rows over an 8-bit cache: the bf16 fast path (bfloat16 query,
    key and value only) never takes it, whatever ``precision`` (it once read the 8-bit
    arrays' dtype stand-ins): the float32 call on the query's values, rounded once."""
    q, k8, v8, ks, vs, kw = _case(1, 2, 2, 40, 300, kind, "token", "causal-br")
    kw.pop("return_lse")
    qb = q.astype(BF16)
    got = cyattn.scaled_dot_product_attention(qb, k8, v8, key_scale=ks, value_scale=vs,
                                              n_threads=2, precision=precision, **kw)
    ref = _call(qb.astype(np.float32), k8, v8, ks, vs, kw, 2)
    assert got.dtype == BF16
    assert np.array_equal(_bits(got), _bits(ref.astype(BF16)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("L", [1, 8])
def test_decode_makes_no_copy_of_k_or_v(kind, L):
    """A GQA decode step over 8-bit caches allocates O(output + scratch): no copy of K or V,
    nor a float32 one (NumPy reports its buffers to tracemalloc)."""
    rng = np.random.default_rng(14)
    q = rng.standard_normal((2, 16, L, 128)).astype(np.float32)
    k8 = _quantised(rng, kind, (2, 4, 4096, 128))
    v8 = _quantised(rng, kind, (2, 4, 4096, 128))
    ks = _scales(rng, kind, "token", k8.shape)
    vs = _scales(rng, kind, "head", v8.shape)

    def call():
        return cyattn.scaled_dot_product_attention(q, k8, v8, key_scale=ks, value_scale=vs,
                                                   enable_gqa=True, is_causal=True,
                                                   causal_alignment="bottom_right")
    call()
    tracemalloc.start()
    try:
        call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < k8.nbytes // 8, peak
    # the same check sees a dequantising call's copy
    q_long = rng.standard_normal((2, 16, 17, 128)).astype(np.float32)
    tracemalloc.start()
    try:
        cyattn.scaled_dot_product_attention(q_long, k8, v8, key_scale=ks, value_scale=vs,
                                            enable_gqa=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak >= 4 * k8.nbytes, peak


# ------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------

def _bad_inputs():
    rng = np.random.default_rng(15)
    q = rng.standard_normal((1, 4, 1, 8)).astype(np.float32)
    k8 = rng.integers(-127, 128, size=(1, 2, 64, 8)).astype(np.int8)
    v8 = rng.integers(-127, 128, size=(1, 2, 64, 8)).astype(np.int8)
    s = np.full((1, 2, 64, 1), 0.01, np.float32)
    return q, k8, v8, s


def _raises(exc, match, *args, **kw):
    out = np.full((1, 4, 1, 8), 7.0, np.float32)
    with pytest.raises(exc, match=match):
        cyattn.scaled_dot_product_attention(*args, enable_gqa=True, out=out, **kw)
    assert (out == 7.0).all()          # a failed call leaves out untouched


def test_int8_without_its_scale_is_a_type_error():
    q, k8, v8, s = _bad_inputs()
    _raises(TypeError, r"key has dtype int8 but key_scale is None", q, k8, v8, value_scale=s)
    _raises(TypeError, r"value has dtype int8 but value_scale is None", q, k8, v8, key_scale=s)


def test_scale_of_a_float_key_is_a_type_error():
    q, k8, v8, s = _bad_inputs()
    kf = k8.astype(np.float32)
    _raises(TypeError, r"key_scale applies only to an int8 or float8_e4m3fn key, but key has "
            r"dtype float32", q, kf, kf, key_scale=s)
    _raises(TypeError, r"value_scale applies only .* value has dtype float32", q, k8, kf,
            key_scale=s, value_scale=s)


@pytest.mark.parametrize("shape", [(1, 2, 64, 8), (2, 64, 2), (64,), (3, 1, 1), (1, 2, 63, 1)])
def test_scale_of_the_wrong_shape(shape):
    q, k8, v8, _ = _bad_inputs()
    _raises(ValueError, r"key_scale has shape .* which does not broadcast to \(1, 2, 64, 1\)",
            q, k8, v8, key_scale=np.ones(shape, np.float32), value_scale=0.1)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.bool_, np.complex64])
def test_scale_of_the_wrong_dtype(dtype):
    q, k8, v8, s = _bad_inputs()
    _raises(ValueError, r"value_scale has dtype .*; expected float32", q, k8, v8, key_scale=s,
            value_scale=np.ones((2, 1, 1), dtype))


def test_misaligned_and_listed_scales():
    """A float32 scale array at an odd address is copied to aligned memory (the kernels load
    it as float); a list of Python numbers is rounded to float32 like a scalar."""
    q, k8, v8, s = _bad_inputs()
    buf = np.zeros(4 * s.size + 1, np.uint8)
    odd = buf[1:].view(np.float32).reshape(s.shape)
    odd[:] = np.linspace(0.01, 0.02, s.size, dtype=np.float32).reshape(s.shape)
    assert not odd.flags.aligned
    got = cyattn.scaled_dot_product_attention(q, k8, v8, key_scale=odd, value_scale=odd,
                                              enable_gqa=True)
    ref = cyattn.scaled_dot_product_attention(q, k8, v8, key_scale=odd.copy(),
                                              value_scale=odd.copy(), enable_gqa=True)
    assert np.array_equal(_bits(got), _bits(ref))
    listed = cyattn.scaled_dot_product_attention(q, k8, v8, key_scale=odd.astype(float).tolist(),
                                                 value_scale=odd.tolist(), enable_gqa=True)
    assert np.array_equal(_bits(listed), _bits(ref))


@pytest.mark.parametrize("S,E_,L", [(0, 8, 1), (5, 8, 0), (300, 0, 1), (300, 8, 1)])
def test_empty_dims_and_out(S, E_, L):
    """S = 0 (zeros, lse -inf), L = 0, E = 0 (scores 0: the mean of the values) and out=."""
    rng = np.random.default_rng(17)
    q = rng.standard_normal((2, 4, L, E_)).astype(np.float32)
    k8 = rng.integers(-9, 10, size=(2, 2, S, E_)).astype(np.int8)
    v8 = rng.integers(-9, 10, size=(2, 2, S, 3)).astype(np.int8)
    vs = np.full((2, 2, S, 1), 0.25, np.float32)
    out = np.full((2, 4, L, 3), 7.0, np.float32)
    res, lse = cyattn.scaled_dot_product_attention(q, k8, v8, key_scale=0.5, value_scale=vs,
                                                   enable_gqa=True, return_lse=True, out=out)
    assert res is out
    want = numpy_sdpa(q, k8 * 0.5, v8 * 0.25, enable_gqa=True) if S and L else None
    if S == 0:
        assert (res == 0).all() and (lse == -np.inf).all()
    elif want is not None:
        assert_close(res, want[0], F32, S + E_)
        assert_close(lse, want[1], F32, S + E_)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_scale(bad):
    q, k8, v8, s = _bad_inputs()
    s = s.copy()
    s[0, 1, 5] = bad
    _raises(ValueError, r"key_scale has a non-finite value", q, k8, v8, key_scale=s,
            value_scale=0.1)
    _raises(ValueError, r"value_scale has a non-finite value", q, k8, v8, key_scale=0.1,
            value_scale=float(bad))


def test_accepted_scale_forms_agree():
    """A Python float, a NumPy scalar, a 0-d, (1, 1) or per-head float32 array, float16
    scales (widened exactly) and a nested list give the same result for the same values."""
    q, k8, v8, _ = _bad_inputs()
    forms = [0.125, np.float32(0.125), np.float64(0.125), np.array(0.125, np.float32),
             np.full((1, 1), 0.125, np.float32), np.full((2, 1, 1), 0.125, np.float32),
             np.full((1, 2, 64, 1), 0.125, np.float16), [[[0.125]], [[0.125]]]]
    res = [cyattn.scaled_dot_product_attention(q, k8, v8, key_scale=f, value_scale=f,
                                               enable_gqa=True) for f in forms]
    for r in res[1:]:
        assert np.array_equal(_bits(r), _bits(res[0]))


# ------------------------------------------------------------------------------------------
# the oracle's scales
# ------------------------------------------------------------------------------------------

def test_oracle_scales_dequantise_exactly():
    rng = np.random.default_rng(16)
    q = grid_values(rng, (2, 3, 4))
    k8 = rng.integers(-127, 128, size=(2, 5, 4))
    v8 = rng.integers(-127, 128, size=(2, 5, 3))
    ks = (rng.random((2, 5, 1)) / 64).astype(np.float32)
    vs = (rng.random((2, 1, 1)) / 64).astype(np.float32)
    got = oracle.scaled_dot_product_attention(q.tolist(), k8.tolist(), v8.tolist(),
                                              key_scale=ks.tolist(), value_scale=vs.tolist(),
                                              return_lse=True)
    want = oracle.scaled_dot_product_attention(
        q.tolist(), (k8 * ks.astype(np.float64)).tolist(),
        (v8 * vs.astype(np.float64)).tolist(), return_lse=True)
    assert got == want
    one = oracle.scaled_dot_product_attention(q.tolist(), k8.tolist(), v8.tolist(),
                                              key_scale=0.5, value_scale=[[[2.0]]])
    assert one == oracle.scaled_dot_product_attention(q.tolist(), (k8 * 0.5).tolist(),
                                                      (v8 * 2.0).tolist())
    with pytest.raises(ValueError, match="key_scale has shape"):
        oracle.scaled_dot_product_attention(q.tolist(), k8.tolist(), v8.tolist(),
                                            key_scale=[1.0, 2.0])
    with pytest.raises(ValueError, match="value_scale holds nan"):
        oracle.scaled_dot_product_attention(q.tolist(), k8.tolist(), v8.tolist(),
                                            value_scale=math.nan)
    with pytest.raises(TypeError, match="key_scale"):
        oracle.scaled_dot_product_attention(q.tolist(), k8.tolist(), v8.tolist(),
                                            key_scale="x")

