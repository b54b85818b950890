"""Half-precision inputs read by the kernels themselves (issue 19): the 16-bit -> float32
widening of every variant; decode calls whose float16 / bfloat16 keys and values are streamed
as they are stored; fused (prefill) calls that widen each query group and key/value block as
they pack it. No float32 copy of Q, K or V is made.

The widening is exact, so a half call does the float32 call's arithmetic on the same values:
its result must equal, bit for bit, the float32 call on the inputs converted to float32
(rounded once to the result dtype).
"""
import tracemalloc

import numpy as np
import pytest

import cyattn
from cyattn import _backend
from conftest import assert_close, numpy_sdpa

ALL_BITS = np.arange(1 << 16, dtype=np.uint16)


def _half_dtypes():
    dtypes = [np.dtype(np.float16)]
    try:
        import ml_dtypes
    except ImportError:
        return dtypes
    return dtypes + [np.dtype(ml_dtypes.bfloat16)]


HALF = _half_dtypes()
FMT = {"float16": 1, "bfloat16": 2}


def _bits(a, dtype):
    return np.asarray(a).view(np.uint16 if dtype.itemsize == 2 else np.uint32)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_widening_is_exact_for_all_65536_patterns(variant, name):
    """Every bit pattern widens to the float32 NumPy / ml_dtypes give (NaN: a NaN of the same
    sign; the portable path also keeps its payload, F16C quiets a signalling one)."""
    if name == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        ref = ALL_BITS.view(ml_dtypes.bfloat16).astype(np.float32)
    else:
        ref = ALL_BITS.view(np.float16).astype(np.float32)
    kernels = _backend.kernels
    for start, stop in ((0, 1 << 16), (3, 1 << 16), (5, 12), (0, 7)):   # unaligned, tails
        src = ALL_BITS[start:stop].copy()
        got = np.full(src.size, 7.0, np.float32)
        kernels.half_to_float32(src, got, FMT[name])
        want = ref[start:stop]
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan)
        assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
        assert np.array_equal(np.signbit(got[nan]), np.signbit(want[nan]))
    if name == "bfloat16":   # a plain shift: NaN payloads survive too
        got = np.empty(1 << 16, np.float32)
        kernels.half_to_float32(ALL_BITS, got, 2)
        assert np.array_equal(got.view(np.uint32), ALL_BITS.astype(np.uint32) << 16)


def test_widening_refuses_bad_buffers():
    with pytest.raises(ValueError, match="half_to_float32"):
        _backend.kernels.half_to_float32(ALL_BITS[:4], np.empty(3, np.float32), 1)
    with pytest.raises(ValueError, match="half_to_float32"):
        _backend.kernels.half_to_float32(ALL_BITS[:4], np.empty(4, np.float32), 3)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_results_are_rounded_like_astype(variant, dtype):
    """Half results are rounded by the kernels' conversion (V.to_result), which must give
    NumPy's / ml_dtypes' astype bits: ties to even, overflow to inf, subnormals, NaN."""
    from cyattn import _validate as V
    rng = np.random.default_rng(21)
    special = np.array([65519.0, 65520.0, 65536.0, 1e6, 3.4e38, -np.inf, np.inf, np.nan,
                        -np.nan, 0.0, -0.0, 2.0 ** -25, 2.0 ** -24 * 1.5, 6e-8, 1e-40,
                        1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -8,
                        1.0 + 3 * 2.0 ** -8], np.float32)
    x = np.concatenate([special, rng.standard_normal(1000).astype(np.float32) * 1e3,
                        rng.standard_normal(1000).astype(np.float32) * 1e-6])
    # all 2^32 float32 bit patterns would take too long: every 65,537th one as well
    x = np.concatenate([x, np.arange(0, 1 << 32, 65537, dtype=np.uint64)
                        .astype(np.uint32).view(np.float32)])
    x = x[:x.size // 2 * 2].reshape(2, -1)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = x.astype(dtype)
    got = V.to_result(x, np.dtype(dtype))
    assert got.dtype == dtype and got.shape == x.shape
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(_bits(got, dtype)[~nan], _bits(expected, dtype)[~nan])


def traced_peak(call):
    """Peak bytes tracemalloc sees during ``call()`` (NumPy reports its buffers to it), after
    one untraced call that warms any caches of the first call."""
    call()
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _decode_inputs(rng, dtype, B=2, Hq=4, Hkv=2, L=1, S=1500, E=64, Ev=48):
    q = rng.standard_normal((B, Hq, L, E)).astype(dtype)
    k = rng.standard_normal((B, Hkv, S, E)).astype(dtype)
    v = rng.standard_normal((B, Hkv, S, Ev)).astype(dtype)
    return q, k, v


def _as32(*arrays):
    return tuple(a.astype(np.float32) for a in arrays)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("L", [1, 3])
def test_decode_equals_float32_call(variant, dtype, L):
    rng = np.random.default_rng(L)
    q, k, v = _decode_inputs(rng, dtype, L=L)
    mask = rng.random((2, 1, L, k.shape[-2])) < 0.9
    cases = [
        dict(),
        dict(attn_mask=mask, enable_gqa=True),
        dict(attn_mask=np.where(mask, 0.0, -np.inf).astype(np.float32), enable_gqa=True),
        dict(is_causal=True, causal_alignment="bottom_right", enable_gqa=True,
             window=(700, 0), softcap=20.0, sinks=np.array([0.5, 1.0, -1.0, 2.0]),
             key_lengths=np.array([[1400], [900]]), return_lse=True),
    ]
    for kw in cases:
        kk, vv = (k, v) if kw.get("enable_gqa") else (np.repeat(k, 2, 1), np.repeat(v, 2, 1))
        got = cyattn.scaled_dot_product_attention(q, kk, vv, **kw)
        ref = cyattn.scaled_dot_product_attention(*_as32(q, kk, vv), **kw)
        got, ref = (got, ref) if kw.get("return_lse") else ((got,), (ref,))
        for g, r in zip(got, ref):
            assert g.dtype == dtype
            assert np.array_equal(_bits(g, dtype), _bits(r.astype(dtype), dtype)), kw


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("L", [1, 4, 40])
def test_plain_half_calls_take_the_low_overhead_path(variant, dtype, L, monkeypatch):
    """Query, key and value of one half dtype, without variant options (the calls of the
    torch and transformers adapters), are served by the low-overhead path: the general path,
    whose Python checks cost more than a small decode step's kernel, is not entered. The bits
    are those of the float32 call, rounded once; out= (a strided view) and lse too."""
    from cyattn import _validate

    def general_path(*args):
        raise AssertionError("the general path was entered")
    rng = np.random.default_rng(L)
    q, k, v = _decode_inputs(rng, dtype, L=L, S=700)
    mask = rng.random((2, 1, L, 700)) < 0.9
    held = np.zeros((2, L, 4, 48), dtype).transpose(0, 2, 1, 3)
    for kw in (dict(is_causal=L > 1), dict(attn_mask=mask), dict(out=held, return_lse=True)):
        ref = cyattn.scaled_dot_product_attention(*_as32(q, k, v), enable_gqa=True,
                                                  **{n: x for n, x in kw.items() if n != "out"})
        with monkeypatch.context() as m:
            m.setattr(_validate, "float_dtypes", general_path)
            # the exact path: bf16 prefill with precision="fast" (issue 40) takes the general
            # path, which computes it on the bf16 dot products
            got = cyattn.scaled_dot_product_attention(q, k, v, enable_gqa=True,
                                                      precision="exact", **kw)
        got, ref = (got, ref) if kw.get("return_lse") else ((got,), (ref,))
        if "out" in kw:
            assert got[0] is held
        for g, r in zip(got, ref):
            assert g.dtype == dtype
            assert np.array_equal(_bits(g, dtype), _bits(r.astype(dtype), dtype)), kw


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_plain_half_call_with_mismatched_shapes_gets_the_shape_error(dtype):
    """A huge broadcast decode query against keys of another head size: the low-overhead
    path must not first copy the query to float32 (a MemoryError instead of the message)."""
    q = np.broadcast_to(np.ones((1, 1, 1, 128), dtype), (100000, 1000, 4, 128))
    k = np.ones((1, 1, 5, 64), dtype)
    with pytest.raises(ValueError, match="E=128"):
        cyattn.scaled_dot_product_attention(q, k, k)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_decode_mixed_and_strided(variant, dtype):
    """float32 query with half K/V (float32 result), strided K/V views and a strided half
    out=: the same bits as the float32 call."""
    rng = np.random.default_rng(5)
    q, k, v = _decode_inputs(rng, dtype, L=2)
    q32 = q.astype(np.float32)
    got = cyattn.scaled_dot_product_attention(q32, k, v, enable_gqa=True)
    assert got.dtype == np.float32
    assert np.array_equal(got, cyattn.scaled_dot_product_attention(q32, *_as32(k, v),
                                                                   enable_gqa=True))
    kt = np.ascontiguousarray(k.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)   # (B,S,H,E) cache
    vs = np.concatenate([v, v], axis=-1)[..., ::2]                             # column stride 2
    held = np.zeros((2, 4, 2, 48), dtype)[..., ::-1]
    res = cyattn.scaled_dot_product_attention(q, kt, vs, enable_gqa=True, out=held)
    ref = cyattn.scaled_dot_product_attention(*_as32(q, kt, vs), enable_gqa=True)
    assert res is held
    assert np.array_equal(_bits(held, dtype), _bits(ref.astype(dtype), dtype))


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_decode_bits_do_not_depend_on_threads(dtype):
    rng = np.random.default_rng(6)
    q, k, v = _decode_inputs(rng, dtype, S=5000)
    one = cyattn.scaled_dot_product_attention(q, k, v, enable_gqa=True, n_threads=1)
    two = cyattn.scaled_dot_product_attention(q, k, v, enable_gqa=True, n_threads=2)
    assert np.array_equal(_bits(one, dtype), _bits(two, dtype))


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_non_finite_rows_are_redone_like_float32(variant, dtype):
    """inf/NaN in permitted K/V, and huge values whose weighted sum overflows float32
    (bfloat16 reaches 3e38), give what the float32 call gives (its two-pass redo)."""
    rng = np.random.default_rng(7)
    q, k, v = _decode_inputs(rng, dtype, B=1, Hq=2, Hkv=2, L=2)
    big = 6e4 if dtype == np.float16 else 3e38       # near each format's largest finite
    k_inf = k.copy()
    k_inf[0, 0, 10, 0] = np.inf
    v_nan = v.copy()
    v_nan[0, 1, 20, 3] = np.nan
    v_big = np.full_like(v, big)
    k_zero = np.zeros_like(k)
    mask = np.ones((1, 1, 2, k.shape[-2]), bool)
    mask[..., 20] = False                       # a masked NaN value is never read
    for kk, vv, kw in ((k_inf, v, {}), (k, v_nan, {}), (k, v_nan, {"attn_mask": mask}),
                       (k_zero, v_big, {})):
        got = cyattn.scaled_dot_product_attention(q, kk, vv, return_lse=True, **kw)
        ref = cyattn.scaled_dot_product_attention(*_as32(q, kk, vv), return_lse=True, **kw)
        for g, r in zip(got, ref):
            assert np.array_equal(_bits(g, dtype), _bits(r.astype(dtype), dtype))
    out = cyattn.scaled_dot_product_attention(q, k_zero, v_big)
    assert np.all(np.isfinite(out.astype(np.float32)))


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_small_calls_and_empty_keys(dtype):
    """Calls too small for the decode path and S = 0 take the float32 route (same bits)."""
    rng = np.random.default_rng(8)
    for S in (0, 1, 9):
        q, k, v = (rng.standard_normal((1, 2, 2, 8)).astype(dtype),
                   rng.standard_normal((1, 2, S, 8)).astype(dtype),
                   rng.standard_normal((1, 2, S, 4)).astype(dtype))
        got = cyattn.scaled_dot_product_attention(q, k, v, sinks=np.array([0.0, 1.0]))
        ref = cyattn.scaled_dot_product_attention(*_as32(q, k, v), sinks=np.array([0.0, 1.0]))
        assert np.array_equal(_bits(got, dtype), _bits(ref.astype(dtype), dtype))


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_decode_makes_no_float32_copy_of_the_cache(dtype):
    """A decode step over a 16 MiB half K/V cache allocates O(output + scratch), not the
    32 MiB a float32 copy of K and V would take (NumPy reports its buffers to tracemalloc)."""
    rng = np.random.default_rng(9)
    q = rng.standard_normal((1, 16, 1, 128)).astype(dtype)
    k = rng.standard_normal((1, 16, 4096, 128)).astype(dtype)
    v = rng.standard_normal((1, 16, 4096, 128)).astype(dtype)
    assert traced_peak(lambda: cyattn.scaled_dot_product_attention(q, k, v)) < (1 << 20)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_prefill_equals_float32_call(variant, dtype):
    """The fused path (more than 4 query rows) on half Q/K/V, strided views, mixed formats,
    masks and variants: the float32 call's bits (precision="exact": the bf16 fast path's
    contract is tested in test_bf16_attention_fast.py)."""
    rng = np.random.default_rng(10)
    q, k, v = _decode_inputs(rng, dtype, L=300, S=700)
    mask = rng.random((2, 1, 300, 700)) < 0.9
    kt = np.ascontiguousarray(k.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    qs = np.concatenate([q, q], axis=-1)[..., ::2]                     # column stride 2
    cases = [
        (q, k, v, dict(enable_gqa=True)),
        (qs, kt, v, dict(attn_mask=mask, enable_gqa=True, is_causal=True)),
        (q, k, v, dict(attn_mask=np.where(mask, 0, -np.inf).astype(np.float32),
                       enable_gqa=True, return_lse=True)),
        (q, k, v, dict(enable_gqa=True, window=(100, 20), softcap=15.0,
                       sinks=np.array([0.5, 1.0, -1.0, 2.0]), alibi_slopes=np.full(4, 0.01),
                       key_lengths=np.array([[650], [300]]),
                       query_lengths=np.array([[290], [120]]), return_lse=True)),
        (q.astype(np.float32), k, v, dict(enable_gqa=True)),            # half K/V only
        (q, k.astype(np.float32), v.astype(np.float32), dict(enable_gqa=True)),  # half Q only
    ]
    for qq, kk, vv, kw in cases:
        got = cyattn.scaled_dot_product_attention(qq, kk, vv, precision="exact", **kw)
        ref = cyattn.scaled_dot_product_attention(*_as32(qq, kk, vv), **kw)
        got, ref = (got, ref) if kw.get("return_lse") else ((got,), (ref,))
        for g, r in zip(got, ref):
            want = r.astype(g.dtype)
            assert np.array_equal(_bits(g, g.dtype), _bits(want, g.dtype)), kw


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_prefill_non_finite_rows_like_float32(variant, dtype):
    rng = np.random.default_rng(11)
    q, k, v = _decode_inputs(rng, dtype, B=1, Hq=2, Hkv=2, L=40, S=300)
    v_nan = v.copy()
    v_nan[0, 0, 7, 1] = np.nan
    k_inf = k.copy()
    k_inf[0, 1, 3, 0] = -np.inf
    mask = np.ones((40, 300), bool)
    mask[:, 7] = False
    for kk, vv, kw in ((k, v_nan, {}), (k, v_nan, {"attn_mask": mask}), (k_inf, v, {}),
                       (k, v_nan, {"is_causal": True})):
        got = cyattn.scaled_dot_product_attention(q, kk, vv, return_lse=True, **kw)
        ref = cyattn.scaled_dot_product_attention(*_as32(q, kk, vv), return_lse=True, **kw)
        for g, r in zip(got, ref):
            assert np.array_equal(_bits(g, dtype), _bits(r.astype(dtype), dtype)), kw


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_prefill_bits_do_not_depend_on_threads(dtype):
    rng = np.random.default_rng(12)
    q, k, v = _decode_inputs(rng, dtype, L=500, S=500)
    one = cyattn.scaled_dot_product_attention(q, k, v, enable_gqa=True, n_threads=1)
    two = cyattn.scaled_dot_product_attention(q, k, v, enable_gqa=True, n_threads=2)
    assert np.array_equal(_bits(one, dtype), _bits(two, dtype))


@pytest.mark.slow      # 2 x 17 GFLOP per format: seconds natively, too long under qemu
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_prefill_peak_memory(dtype):
    """Issue 19's case, SDPA (1, 1, 8192, 64): NumPy allocates the float32 result the kernel
    writes and the rounded half result (3 MiB), no float32 copy of Q, K or V (2 MiB each)."""
    rng = np.random.default_rng(13)
    q, k, v = (rng.standard_normal((1, 1, 8192, 64)).astype(dtype) for _ in range(3))
    cyattn.scaled_dot_product_attention(q, k, v)
    tracemalloc.start()
    try:
        out = cyattn.scaled_dot_product_attention(q, k, v)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.dtype == dtype
    assert peak < 3 * out.nbytes + (1 << 19), peak


@pytest.mark.parametrize("E, Ev", [(1, 7), (8, 8), (31, 33), (48, 80), (65, 100), (130, 64)])
@pytest.mark.parametrize("L", [1, 2, 4])
def test_decode_rows_of_any_head_size(variant, E, Ev, L):
    """The decode key and value passes (1-4 query rows sharing each key and value row; key
    groups of 4 or 2 with their pairwise trees taken in vector registers, a tail of keys one at
    a time, head sizes with a tail past the 32 lanes) against float64 NumPy, and the half calls
    against the float32 call bit for bit. S = 1,027 keys: two full chunks and a partial one,
    whose key count leaves a remainder of 3."""
    rng = np.random.default_rng(E * 1000 + Ev * 10 + L)
    mask = rng.random((2, 1, L, 1027)) < 0.8
    q, k, v = (a.astype(np.float32) for a in _decode_inputs(rng, np.float32, L=L, S=1027,
                                                             E=E, Ev=Ev))
    got = cyattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    ref, _ = numpy_sdpa(q, k, v, mask=mask, enable_gqa=True)
    assert_close(got, ref, np.float32)
    for dtype in HALF:
        qh, kh, vh = (a.astype(dtype) for a in (q, k, v))
        got = cyattn.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=True)
        ref = cyattn.scaled_dot_product_attention(*_as32(qh, kh, vh), attn_mask=mask,
                                                  enable_gqa=True)
        assert np.array_equal(_bits(got, dtype), _bits(ref.astype(dtype), dtype)), dtype
