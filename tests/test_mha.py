"""cyattn.multi_head_attention and cyattn.MultiHeadAttention.

Ground truth is ``cyattn.oracle.multi_head_attention`` (unbatched, pure Python, exactly rounded
sums), called once per batch element. torch.nn.MultiheadAttention is a second reference when
torch is installed (those tests skip otherwise; rows fully masked are left out there, since torch
gives NaN where cyattn gives weights 0 and ``out_proj_bias``).
"""
import math
import zlib

import numpy as np
import pytest
from conftest import FakeTorchMHA, mha_params

import cyattn
from cyattn import oracle

# Tolerances (one place). float64 vs the exactly rounded oracle: a few ulps of O(1) values.
TOL = {
    np.float64: dict(rtol=1e-12, atol=1e-12),
    np.float32: dict(rtol=1e-5, atol=1e-6),
}
TORCH_TOL = {np.float64: dict(rtol=1e-10, atol=1e-10), np.float32: dict(rtol=1e-5, atol=1e-5)}


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

def make_params(rng, E, kdim=None, vdim=None, bias=True, dtype=np.float64):
    """Keyword arguments for multi_head_attention (packed when kdim == vdim == E)."""
    p = mha_params(rng, E, kdim or E, vdim or E, bias_in=bias, bias_out=bias)
    return {k: v.astype(dtype) for k, v in p.items()}


def make_inputs(rng, N, L, S, E, kdim, vdim, batch_first, dtype=np.float64):
    """query, key, value in the requested layout (N=None: unbatched)."""
    def arr(length, dim):
        if N is None:
            shape = (length, dim)
        else:
            shape = (N, length, dim) if batch_first else (length, N, dim)
        return rng.standard_normal(shape).astype(dtype)
    return arr(L, E), arr(S, kdim), arr(S, vdim)


def mha_problem(seed, E, N, L, S, kdim=None, vdim=None, batch_first=False, dtype=np.float64):
    """``(rng, params, (q, k, v))``: :func:`make_params` then :func:`make_inputs` drawn from
    ``np.random.default_rng(seed)``; later draws (masks) continue from the returned ``rng``."""
    rng = np.random.default_rng(seed)
    params = make_params(rng, E, kdim, vdim, dtype=dtype)
    return rng, params, make_inputs(rng, N, L, S, E, kdim or E, vdim or E, batch_first, dtype)


def bool_mask(rng, shape, p=0.3):
    return rng.random(shape) < p


def float_mask(rng, shape):
    m = rng.standard_normal(shape)
    m[rng.random(shape) < 0.2] = -np.inf
    return m


MASK_CASES = [
    "none", "kpm_bool", "kpm_float", "am2_bool", "am2_float", "am3_bool", "am3_float",
    "kpm_bool+am2_bool", "kpm_float+am3_float", "kpm_bool+am2_float", "kpm_float+am3_bool",
    "kpm_float+am2_float", "causal", "causal+kpm_bool", "causal+am2_float",
    "causal+kpm_float+am3_bool", "full_kpm_bool", "full_am_bool", "full_am_float",
    "full_causal",
]


def make_masks(case, rng, N, H, L, S):
    """(key_padding_mask, attn_mask, is_causal) in torch polarity (bool True = ignore).

    N=None gives unbatched masks ((S,) and (H, L, S)). The "full_*" cases contain fully
    masked rows (or a fully masked batch element).
    """
    kpm_shape = (S,) if N is None else (N, S)
    am3_shape = (H, L, S) if N is None else (N * H, L, S)
    kpm = am = None
    parts = case.split("+")
    causal = "causal" in parts
    for part in parts:
        if part == "kpm_bool":
            kpm = bool_mask(rng, kpm_shape)
        elif part == "kpm_float":
            kpm = float_mask(rng, kpm_shape)
        elif part == "am2_bool":
            am = bool_mask(rng, (L, S))
        elif part == "am2_float":
            am = float_mask(rng, (L, S))
        elif part == "am3_bool":
            am = bool_mask(rng, am3_shape)
        elif part == "am3_float":
            am = float_mask(rng, am3_shape)
        elif part == "full_kpm_bool":
            kpm = bool_mask(rng, kpm_shape)
            kpm[..., :] = True if N is None else False
            if N is not None:
                kpm[0] = True                      # batch element 0: every key ignored
        elif part == "full_am_bool":
            am = bool_mask(rng, am3_shape)
            am[..., 0, :] = True                   # query 0 ignores every key, every head
        elif part == "full_am_float":
            am = float_mask(rng, (L, S))
            am[-1, :] = -np.inf                    # last query: every score -inf
        elif part == "full_causal":
            causal = True
            am = bool_mask(rng, (L, S), p=0.0)
            am[0, 0] = True                        # query 0 may only see key 0: now none
    return kpm, am, causal


def oracle_mha(query, key, value, params, num_heads, kpm=None, am=None, is_causal=False,
               need_weights=True, average_attn_weights=True, batch_first=False):
    """The oracle per batch element (float64 nested lists), stacked like cyattn's result."""
    plist = {k: v.astype(np.float64).tolist() for k, v in params.items()}

    def one(q, k, v, kpm_n, am_n):
        return oracle.multi_head_attention(
            q.astype(np.float64).tolist(), k.astype(np.float64).tolist(),
            v.astype(np.float64).tolist(), num_heads=num_heads, **plist,
            key_padding_mask=None if kpm_n is None else kpm_n.tolist(),
            attn_mask=None if am_n is None else am_n.tolist(), need_weights=need_weights,
            average_attn_weights=average_attn_weights, is_causal=is_causal)

    if query.ndim == 2:
        out, w = one(query, key, value, kpm, am)
        return np.array(out), (None if w is None else np.array(w))
    if not batch_first:
        query, key, value = (np.swapaxes(a, 0, 1) for a in (query, key, value))
    outs, ws = [], []
    for n in range(query.shape[0]):
        am_n = am if am is None or am.ndim == 2 else am[n * num_heads:(n + 1) * num_heads]
        out, w = one(query[n], key[n], value[n], None if kpm is None else kpm[n], am_n)
        outs.append(np.array(out).reshape(query.shape[1], query.shape[2]))
        ws.append(w)
    out = np.stack(outs)
    if not batch_first:
        out = np.swapaxes(out, 0, 1)
    return out, (None if not need_weights else np.array(ws))


def assert_close(actual, expected, dtype=np.float64):
    np.testing.assert_allclose(actual, expected, **TOL[dtype])


# --------------------------------------------------------------------------------------------
# functional form vs the oracle
# --------------------------------------------------------------------------------------------

SHAPES = [  # (E, H, L, S, kdim, vdim, N)
    (4, 1, 3, 5, None, None, 2),
    (8, 2, 4, 4, None, None, 3),
    (8, 4, 5, 3, 6, 3, 2),
    (12, 2, 1, 6, 12, 5, 2),
]
WEIGHT_MODES = [(True, True), (True, False), (False, True)]  # need_weights, average


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "E{}H{}L{}S{}k{}v{}N{}".format(*s))
@pytest.mark.parametrize("mask_case", MASK_CASES)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("weight_mode", WEIGHT_MODES, ids=["avg", "per_head", "no_weights"])
def test_batched_matches_oracle_float64(shape, mask_case, batch_first, weight_mode):
    E, H, L, S, kdim, vdim, N = shape
    need_weights, average = weight_mode
    rng, params, (q, k, v) = mha_problem(
        zlib.crc32(repr((shape, mask_case)).encode()), E, N, L, S, kdim, vdim, batch_first)
    kpm, am, causal = make_masks(mask_case, rng, N, H, L, S)
    out, w = cyattn.multi_head_attention(
        q, k, v, num_heads=H, **params, key_padding_mask=kpm, attn_mask=am,
        need_weights=need_weights, average_attn_weights=average, is_causal=causal,
        batch_first=batch_first)
    ref_out, ref_w = oracle_mha(q, k, v, params, H, kpm, am, causal, need_weights, average,
                                batch_first)
    assert out.dtype == np.float64 and out.shape == q.shape[:-1] + (E,)
    assert np.isfinite(out).all()
    assert_close(out, ref_out)
    if not need_weights:
        assert w is None
    else:
        assert w.shape == ((N, L, S) if average else (N, H, L, S))
        assert_close(w, ref_w)


@pytest.mark.parametrize("mask_case", MASK_CASES)
@pytest.mark.parametrize("weight_mode", WEIGHT_MODES, ids=["avg", "per_head", "no_weights"])
@pytest.mark.parametrize("separate", [False, True])
def test_unbatched_matches_oracle_float64(mask_case, weight_mode, separate):
    E, H, L, S = 8, 2, 4, 6
    kdim, vdim = (5, 7) if separate else (E, E)
    need_weights, average = weight_mode
    rng, params, (q, k, v) = mha_problem(7, E, None, L, S, kdim, vdim)
    kpm, am, causal = make_masks(mask_case, rng, None, H, L, S)
    out, w = cyattn.multi_head_attention(
        q, k, v, num_heads=H, **params, key_padding_mask=kpm, attn_mask=am,
        need_weights=need_weights, average_attn_weights=average, is_causal=causal)
    ref_out, ref_w = oracle_mha(q, k, v, params, H, kpm, am, causal, need_weights, average)
    assert out.shape == (L, E)
    assert_close(out, ref_out)
    if need_weights:
        assert w.shape == ((L, S) if average else (H, L, S))
        assert_close(w, ref_w)
    else:
        assert w is None


@pytest.mark.parametrize("mask_case", ["none", "kpm_bool+am2_float", "causal+am3_bool",
                                       "full_am_bool", "kpm_float+am3_float"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_float32_matches_oracle(mask_case, batch_first):
    E, H, L, S, N = 16, 4, 5, 7, 2
    rng, params, (q, k, v) = mha_problem(3, E, N, L, S, batch_first=batch_first, dtype=np.float32)
    kpm, am, causal = make_masks(mask_case, rng, N, H, L, S)
    for need_weights in (True, False):
        out, w = cyattn.multi_head_attention(
            q, k, v, num_heads=H, **params, key_padding_mask=kpm, attn_mask=am,
            is_causal=causal, batch_first=batch_first, need_weights=need_weights)
        ref_out, ref_w = oracle_mha(q, k, v, params, H, kpm, am, causal, need_weights,
                                    True, batch_first)
        assert out.dtype == np.float32
        assert_close(out, ref_out, np.float32)
        if need_weights:
            assert w.dtype == np.float32
            assert_close(w, ref_w, np.float32)


@pytest.mark.parametrize("rows", [1, 2, 3, 48, 49, 130])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_both_product_forms(rows, bias, dtype):
    # float32 products of 2..48 rows take the swapped form (W @ x.T, copied out with the bias);
    # both forms must give x @ W.T + b, C-contiguous, in the compute dtype.
    from cyattn.mha import _linear
    rng = np.random.default_rng(rows)
    x, w = rng.standard_normal((rows, 3, 40)).astype(dtype), rng.standard_normal((24, 40))
    w = w.astype(dtype)
    b = rng.standard_normal(24).astype(dtype) if bias else np.zeros(24, dtype)
    y = _linear(x, w, b if bias else None, np.dtype(dtype))
    assert y.shape == (rows, 3, 24) and y.dtype == dtype and y.flags.c_contiguous
    # any summation order of a length-40 dot product plus the bias: within (K + 2) eps of the
    # sum of magnitudes (Higham's gamma bound), whatever the BLAS kernel (FMA or not)
    x64, w64, b64 = x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)
    ref = x64 @ w64.T + b64
    bound = 42 * np.finfo(dtype).eps * (np.abs(x64) @ np.abs(w64).T + np.abs(b64))
    assert np.all(np.abs(y - ref) <= bound)


def test_attention_kernels_run_on_the_calling_thread(monkeypatch):
    # The projections use NumPy's BLAS threads. Our OpenMP team spinning on the same cores made
    # a (1, 42, 384) forward 15x slower, so the attention and softmax kernels get one thread.
    import cyattn.mha as mha_mod
    seen = []

    def spy(name):
        real = getattr(mha_mod, name)

        def call(*args, **kwargs):
            seen.append((name, kwargs.get("n_threads")))
            return real(*args, **kwargs)
        monkeypatch.setattr(mha_mod, name, call)

    for name in ("scaled_dot_product_attention", "_softmax_fast_call", "_softmax"):
        spy(name)
    rng = np.random.default_rng(4)
    m = cyattn.MultiHeadAttention(16, 4, seed=0)
    x = rng.standard_normal((5, 2, 16))
    m(x, x, x, need_weights=False)
    m(x, x, x, need_weights=True)                     # unmasked: softmax's fast path
    m(x, x, x, key_padding_mask=np.zeros((2, 5), bool), need_weights=True)
    assert seen == [("scaled_dot_product_attention", 1), ("_softmax_fast_call", 1),
                    ("_softmax_fast_call", 1), ("_softmax", 1)]


def test_fully_masked_rows_give_out_proj_bias():
    E, H, L, S, N = 8, 2, 3, 4, 2
    rng, params, (q, k, v) = mha_problem(0, E, N, L, S, batch_first=True)
    kpm = np.zeros((N, S), bool)
    kpm[1] = True
    for need_weights in (True, False):
        out, w = cyattn.multi_head_attention(q, k, v, num_heads=H, **params, batch_first=True,
                                             key_padding_mask=kpm, need_weights=need_weights)
        np.testing.assert_array_equal(out[1], np.broadcast_to(params["out_proj_bias"], (L, E)))
        assert np.isfinite(out).all()
        if need_weights:
            np.testing.assert_array_equal(w[1], 0.0)
            np.testing.assert_allclose(w[0].sum(-1), 1.0, rtol=1e-12)
    # a fully masked row in one head only: that head contributes 0, the other attends
    am = np.zeros((N * H, L, S), bool)
    am[0, 0] = True                                # batch 0, head 0, query 0
    _, w = cyattn.multi_head_attention(q, k, v, num_heads=H, **params, batch_first=True,
                                       attn_mask=am, average_attn_weights=False)
    np.testing.assert_array_equal(w[0, 0, 0], 0.0)
    np.testing.assert_allclose(w[0, 1, 0].sum(), 1.0, rtol=1e-12)


def test_s_zero_and_l_zero():
    E, H = 4, 2
    rng = np.random.default_rng(0)
    params = make_params(rng, E)
    q = rng.standard_normal((3, E))
    out, w = cyattn.multi_head_attention(q, np.zeros((0, E)), np.zeros((0, E)), num_heads=H,
                                         **params)
    np.testing.assert_allclose(out, np.broadcast_to(params["out_proj_bias"], (3, E)),
                               rtol=0, atol=0)
    assert w.shape == (3, 0)
    out, w = cyattn.multi_head_attention(np.zeros((0, 2, E)), rng.standard_normal((5, 2, E)),
                                         rng.standard_normal((5, 2, E)), num_heads=H,
                                         **params, need_weights=False)
    assert out.shape == (0, 2, E) and w is None


def test_need_weights_paths_agree_and_average_is_head_mean():
    E, H, L, S, N = 16, 4, 6, 9, 3
    rng, params, (q, k, v) = mha_problem(11, E, N, L, S, kdim=5, vdim=10)
    kpm = bool_mask(rng, (N, S), 0.2)
    am = float_mask(rng, (N * H, L, S))
    kw = dict(num_heads=H, **params, key_padding_mask=kpm, attn_mask=am, is_causal=True)
    out_fused, none = cyattn.multi_head_attention(q, k, v, need_weights=False, **kw)
    out_avg, w_avg = cyattn.multi_head_attention(q, k, v, **kw)
    out_heads, w_heads = cyattn.multi_head_attention(q, k, v, average_attn_weights=False, **kw)
    assert none is None
    np.testing.assert_allclose(out_fused, out_avg, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(out_avg, out_heads)
    np.testing.assert_allclose(w_avg, w_heads.mean(axis=1), rtol=1e-14, atol=1e-15)


def test_batch_first_is_a_transpose():
    E, H, L, S, N = 8, 2, 4, 5, 3
    rng, params, (q, k, v) = mha_problem(5, E, N, L, S)
    kpm = bool_mask(rng, (N, S), 0.2)
    a, wa = cyattn.multi_head_attention(q, k, v, num_heads=H, **params, key_padding_mask=kpm)
    b, wb = cyattn.multi_head_attention(*(np.swapaxes(x, 0, 1) for x in (q, k, v)),
                                        num_heads=H, **params, key_padding_mask=kpm,
                                        batch_first=True)
    np.testing.assert_allclose(a, np.swapaxes(b, 0, 1), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(wa, wb, rtol=1e-13, atol=1e-14)


def test_unbatched_equals_batch_of_one():
    E, H, L, S = 8, 4, 3, 5
    rng, params, (q, k, v) = mha_problem(6, E, None, L, S)
    kpm = bool_mask(rng, (S,), 0.3)
    am = float_mask(rng, (H, L, S))
    a, wa = cyattn.multi_head_attention(q, k, v, num_heads=H, **params, key_padding_mask=kpm,
                                        attn_mask=am, average_attn_weights=False)
    b, wb = cyattn.multi_head_attention(q[:, None], k[:, None], v[:, None], num_heads=H,
                                        **params, key_padding_mask=kpm[None], attn_mask=am,
                                        average_attn_weights=False)
    np.testing.assert_array_equal(a, b[:, 0])
    np.testing.assert_array_equal(wa, wb[0])


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("masks", ["kpm_bool", "kpm_bool+am2_float", "am2_bool+kpm_float"])
def test_masked_nan_keys_and_values_do_not_leak(need_weights, masks):
    """A key ignored by a bool mask is never read: NaN/inf in it cannot reach the result."""
    E, H, L, S, N = 8, 2, 3, 5, 2
    rng, params, (q, k, v) = mha_problem(9, E, N, L, S, batch_first=True)
    kpm = np.zeros((N, S), bool)
    am = None
    if masks == "am2_bool+kpm_float":
        am = np.zeros((L, S), bool)
        am[:, 2] = True
        kpm = rng.standard_normal((N, S))
    else:
        kpm[:, 2] = True
        if masks == "kpm_bool+am2_float":
            am = rng.standard_normal((L, S))
    clean_out, clean_w = cyattn.multi_head_attention(
        q, k, v, num_heads=H, **params, batch_first=True, key_padding_mask=kpm, attn_mask=am,
        need_weights=need_weights)
    k_bad, v_bad = k.copy(), v.copy()
    k_bad[:, 2] = np.nan
    v_bad[:, 2, 0] = np.inf
    v_bad[:, 2, 1] = np.nan
    out, w = cyattn.multi_head_attention(
        q, k_bad, v_bad, num_heads=H, **params, batch_first=True, key_padding_mask=kpm,
        attn_mask=am, need_weights=need_weights)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, clean_out, rtol=1e-13, atol=1e-14)
    if need_weights:
        np.testing.assert_allclose(w, clean_w, rtol=1e-13, atol=1e-14)


def test_nan_in_permitted_value_propagates_only_where_read():
    E, H, L, S = 4, 1, 3, 3
    rng, params, (q, k, v) = mha_problem(2, E, None, L, S)
    v[2, 0] = np.inf                               # only query 2 sees key 2 (causal)
    ref_out, _ = oracle_mha(q, k, v, params, H, is_causal=True)
    for need_weights in (True, False):
        out, _ = cyattn.multi_head_attention(q, k, v, num_heads=H, **params, is_causal=True,
                                             need_weights=need_weights)
        assert np.isfinite(out[:2]).all() and not np.isfinite(out[2]).all()
        assert_close(out, ref_out)


def test_inputs_not_modified_and_noncontiguous_inputs():
    E, H, L, S, N = 8, 2, 4, 5, 2
    rng, params, (q, k, v) = mha_problem(4, E, N, L, S)
    kpm = float_mask(rng, (N, S))
    am = bool_mask(rng, (L, S))
    copies = [x.copy() for x in (q, k, v, kpm, am, *params.values())]
    ref = cyattn.multi_head_attention(q, k, v, num_heads=H, **params, key_padding_mask=kpm,
                                      attn_mask=am)
    for before, after in zip(copies, (q, k, v, kpm, am, *params.values())):
        np.testing.assert_array_equal(before, after)
    fq, fk, fv = (np.asfortranarray(x) for x in (q, k, v))
    fparams = {n: np.asfortranarray(p) for n, p in params.items()}
    got = cyattn.multi_head_attention(fq, fk, fv, num_heads=H, **fparams,
                                      key_padding_mask=kpm[:, ::-1][:, ::-1],
                                      attn_mask=np.asfortranarray(am))
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-13, atol=1e-14)
    # nested lists are accepted too
    lst = cyattn.multi_head_attention(q.tolist(), k.tolist(), v.tolist(), num_heads=H,
                                      **params, key_padding_mask=kpm.tolist(),
                                      attn_mask=am.tolist())
    np.testing.assert_array_equal(lst[0], ref[0])


# --------------------------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dtype_preserved(dtype):
    E, H, L, S, N = 8, 2, 3, 4, 2
    rng, params, (q, k, v) = mha_problem(1, E, N, L, S, dtype=dtype)
    kpm = float_mask(rng, (N, S)).astype(np.float64)       # masks do not promote
    for need_weights in (True, False):
        out, w = cyattn.multi_head_attention(q, k, v, num_heads=H, **params,
                                             key_padding_mask=kpm, need_weights=need_weights)
        assert out.dtype == dtype
        if need_weights:
            assert w.dtype == dtype
    mha = cyattn.MultiHeadAttention(E, H, dtype=dtype, seed=0)
    out, w = mha(q, k, v)
    assert out.dtype == dtype and w.dtype == dtype


def test_float16_computed_in_float32():
    E, H, L, S, N = 8, 2, 3, 4, 2
    rng, params, (q, k, v) = mha_problem(1, E, N, L, S, dtype=np.float16)
    out16, w16 = cyattn.multi_head_attention(q, k, v, num_heads=H, **params)
    p32 = {n: p.astype(np.float32) for n, p in params.items()}
    out32, w32 = cyattn.multi_head_attention(q.astype(np.float32), k.astype(np.float32),
                                             v.astype(np.float32), num_heads=H, **p32)
    np.testing.assert_array_equal(out16, out32.astype(np.float16))
    np.testing.assert_array_equal(w16, w32.astype(np.float16))


def test_mixed_dtypes_promote():
    E, H = 4, 2
    rng = np.random.default_rng(1)
    mha = cyattn.MultiHeadAttention(E, H, dtype=np.float32, seed=0)
    x32 = rng.standard_normal((3, E)).astype(np.float32)
    out, w = mha(x32.astype(np.float64), x32, x32)
    assert out.dtype == np.float64 and w.dtype == np.float64
    mha16 = cyattn.MultiHeadAttention(E, H, dtype=np.float16, seed=0)
    assert mha16(x32, x32, x32)[0].dtype == np.float32


# --------------------------------------------------------------------------------------------
# MultiHeadAttention: construction, forward, state dicts
# --------------------------------------------------------------------------------------------

def test_constructor_attributes_and_init():
    m = cyattn.MultiHeadAttention(64, 8, seed=0)
    assert (m.embed_dim, m.num_heads, m.head_dim, m.kdim, m.vdim) == (64, 8, 8, 64, 64)
    assert m.batch_first is False and m.dtype == np.float32 and m.bias
    assert m.in_proj_weight.shape == (192, 64) and m.in_proj_weight.dtype == np.float32
    assert m.q_proj_weight is None and m.k_proj_weight is None and m.v_proj_weight is None
    assert m.in_proj_bias.shape == (192,) and not m.in_proj_bias.any()
    assert m.out_proj_bias.shape == (64,) and not m.out_proj_bias.any()
    xavier = math.sqrt(6.0 / (64 + 192))
    assert np.abs(m.in_proj_weight).max() <= xavier
    assert np.abs(m.in_proj_weight).max() > 0.9 * xavier
    assert np.abs(m.out_proj_weight).max() <= 1 / 8 and np.abs(m.out_proj_weight).max() > 0.1
    # deterministic with a seed, different without
    again = cyattn.MultiHeadAttention(64, 8, seed=0)
    np.testing.assert_array_equal(m.in_proj_weight, again.in_proj_weight)
    np.testing.assert_array_equal(m.out_proj_weight, again.out_proj_weight)
    other = cyattn.MultiHeadAttention(64, 8, seed=np.random.default_rng(1))
    assert not np.array_equal(m.in_proj_weight, other.in_proj_weight)
    assert "embed_dim=64" in repr(m) and "num_heads=8" in repr(m)


def test_constructor_separate_weights_and_no_bias():
    m = cyattn.MultiHeadAttention(8, 2, kdim=3, vdim=5, bias=False, batch_first=True,
                                  dtype=np.float64, seed=1)
    assert m.in_proj_weight is None and m.in_proj_bias is None and m.out_proj_bias is None
    assert m.q_proj_weight.shape == (8, 8) and m.k_proj_weight.shape == (8, 3)
    assert m.v_proj_weight.shape == (8, 5) and m.dtype == np.float64
    assert np.abs(m.k_proj_weight).max() <= math.sqrt(6.0 / 11)
    assert list(m.state_dict()) == ["q_proj_weight", "k_proj_weight", "v_proj_weight",
                                    "out_proj.weight"]
    # only vdim differing also gives separate weights
    assert cyattn.MultiHeadAttention(8, 2, vdim=4).in_proj_weight is None
    assert cyattn.MultiHeadAttention(8, 2, kdim=8, vdim=8).in_proj_weight.shape == (24, 8)


@pytest.mark.parametrize("batch_first", [False, True])
def test_module_forward_matches_functional_and_oracle(batch_first):
    E, H, L, S, N = 8, 4, 3, 6, 2
    m = cyattn.MultiHeadAttention(E, H, kdim=5, vdim=7, batch_first=batch_first,
                                  dtype=np.float64, seed=3)
    m.in_proj_bias = np.random.default_rng(0).standard_normal(3 * E)
    rng = np.random.default_rng(8)
    q, k, v = make_inputs(rng, N, L, S, E, 5, 7, batch_first)
    kpm = bool_mask(rng, (N, S))
    am = float_mask(rng, (N * H, L, S))
    out, w = m(q, k, v, key_padding_mask=kpm, attn_mask=am, average_attn_weights=False,
               is_causal=True)
    out2, w2 = m.forward(q, k, v, kpm, True, am, False, True)
    np.testing.assert_array_equal(out, out2)
    np.testing.assert_array_equal(w, w2)
    params = {n.replace("out_proj.", "out_proj_"): p for n, p in m.state_dict().items()}
    ref_out, ref_w = oracle_mha(q, k, v, params, H, kpm, am, True, True, False, batch_first)
    assert_close(out, ref_out)
    assert_close(w, ref_w)


def test_state_dict_round_trip():
    a = cyattn.MultiHeadAttention(8, 2, seed=0, dtype=np.float64)
    a.in_proj_bias[:] = np.arange(24)
    b = cyattn.MultiHeadAttention(8, 2, seed=1, dtype=np.float64)
    state = a.state_dict()
    assert list(state) == ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]
    b.load_state_dict(state)
    for name, value in b.state_dict().items():
        np.testing.assert_array_equal(value, state[name])
    x = np.random.default_rng(0).standard_normal((3, 2, 8))
    np.testing.assert_array_equal(a(x, x, x)[0], b(x, x, x)[0])
    # copies: neither the loaded dict nor the returned one aliases the parameters
    state["in_proj_weight"][:] = 0
    assert b.in_proj_weight.any()
    b.state_dict()["out_proj.weight"][:] = 0
    assert b.out_proj_weight.any()
    # lists and other dtypes are cast to the module dtype
    c = cyattn.MultiHeadAttention(8, 2, seed=0, dtype=np.float32)
    c.load_state_dict({k: v.tolist() for k, v in a.state_dict().items()})
    assert c.in_proj_weight.dtype == np.float32
    np.testing.assert_array_equal(c.in_proj_weight, a.in_proj_weight.astype(np.float32))


def test_state_dict_round_trip_separate():
    a = cyattn.MultiHeadAttention(6, 3, kdim=4, vdim=2, seed=0)
    b = cyattn.MultiHeadAttention(6, 3, kdim=4, vdim=2, seed=9)
    b.load_state_dict(a.state_dict())
    assert list(b.state_dict()) == ["q_proj_weight", "k_proj_weight", "v_proj_weight",
                                    "in_proj_bias", "out_proj.weight", "out_proj.bias"]
    for name, value in a.state_dict().items():
        np.testing.assert_array_equal(b.state_dict()[name], value)


# --------------------------------------------------------------------------------------------
# errors (every documented Raises entry, with its message)
# --------------------------------------------------------------------------------------------

def _fn_args(E=4, H=2, L=3, S=5, N=2, separate=False):
    rng, params, (q, k, v) = mha_problem(0, E, N, L, S, *((3, 2) if separate else (None, None)))
    return q, k, v, dict(num_heads=H, **params)


def _set(**changes):
    """A FN_ERRORS mutation that changes keyword arguments only."""
    return lambda q, k, v, kw: (q, k, v, {**kw, **changes})


FN_ERRORS = [
    # (label, mutate(q, k, v, kw) -> (q, k, v, kw), exception, match)
    ("num_heads type", _set(num_heads=2.0),
     TypeError, "num_heads must be an int, got float"),
    ("num_heads bool", _set(num_heads=True),
     TypeError, "num_heads must be an int, got bool"),
    ("num_heads zero", _set(num_heads=0),
     ValueError, "num_heads must be positive, got 0"),
    ("not divisible", _set(num_heads=3),
     ValueError, r"embed_dim E=4 \(from out_proj_weight\) must be divisible by num_heads=3"),
    ("int query", lambda q, k, v, kw: (q.astype(np.int64), k, v, kw),
     TypeError, "query has dtype int64; expected float16, bfloat16, float32 or float64"),
    ("bool key", lambda q, k, v, kw: (q, k > 0, v, kw),
     TypeError, "key has dtype bool"),
    ("complex value", lambda q, k, v, kw: (q, k, v.astype(complex), kw),
     TypeError, "value has dtype complex128"),
    ("int weight", _set(out_proj_weight=np.eye(4, dtype=np.int64)),
     TypeError, "out_proj_weight has dtype int64"),
    ("int kpm", _set(key_padding_mask=np.zeros((2, 5), np.int64)),
     TypeError, "key_padding_mask has dtype int64; expected bool"),
    ("int attn_mask", _set(attn_mask=np.zeros((3, 5), np.int64)),
     TypeError, "attn_mask has dtype int64; expected bool"),
    ("need_weights type", _set(need_weights=1),
     TypeError, "need_weights must be a bool, got int"),
    ("average type", _set(average_attn_weights="yes"),
     TypeError, "average_attn_weights must be a bool, got str"),
    ("is_causal type", _set(is_causal=None),
     TypeError, "is_causal must be a bool, got NoneType"),
    ("batch_first type", _set(batch_first=0),
     TypeError, "batch_first must be a bool, got int"),
    ("query 4-D", lambda q, k, v, kw: (q[None], k, v, kw),
     ValueError, r"query has shape \(1, 3, 2, 4\); expected 3-D \(L, N, E\)"),
    ("query 1-D", lambda q, k, v, kw: (q[0, 0], k, v, kw),
     ValueError, r"query has shape \(4,\); expected 3-D"),
    ("key 2-D", lambda q, k, v, kw: (q, k[:, 0], v, kw),
     ValueError, r"key has shape \(5, 4\) but query has shape \(3, 2, 4\); expected key of "
                 r"shape \(S, N, kdim\)"),
    ("value 2-D", lambda q, k, v, kw: (q[:, 0], k[:, 0], v, kw),
     ValueError, r"value has shape \(5, 2, 4\) but query has shape \(3, 4\); expected value "
                 r"of shape \(S, vdim\)"),
    ("query E", lambda q, k, v, kw: (q[..., :3], k, v, kw),
     ValueError, r"query has shape \(3, 2, 3\); expected \(L, N, E\) with E=4"),
    ("key batch", lambda q, k, v, kw: (q, k[:, :1], v, kw),
     ValueError, r"key has shape \(5, 1, 4\); expected \(S, N, kdim\) with N=2 \(from query\) "
                 r"and kdim=4"),
    ("key kdim", lambda q, k, v, kw: (q, k[..., :3], v, kw),
     ValueError, r"key has shape \(5, 2, 3\); expected \(S, N, kdim\) with N=2"),
    ("value S", lambda q, k, v, kw: (q, k, v[:4], kw),
     ValueError, r"value has shape \(4, 2, 4\); expected \(S, N, vdim\) with N=2 \(from "
                 r"query\), S=5 \(from key\) and vdim=4"),
    ("value batch_first", lambda q, k, v, kw: (q, k, v[:, :1], {**kw, "batch_first": True}),
     ValueError, r"key has shape \(5, 2, 4\); expected \(N, S, kdim\) with N=3"),
    ("out_proj_weight None", _set(out_proj_weight=None),
     ValueError, r"out_proj_weight is required, got None; expected shape \(E, E\)"),
    ("out_proj_weight shape", _set(out_proj_weight=np.ones((4, 3))),
     ValueError, r"out_proj_weight has shape \(4, 3\); expected a square \(E, E\) matrix"),
    ("in_proj_weight shape", _set(in_proj_weight=np.ones((12, 3))),
     ValueError, r"in_proj_weight has shape \(12, 3\); expected \(12, 4\)"),
    ("in_proj_bias shape", _set(in_proj_bias=np.ones(4)),
     ValueError, r"in_proj_bias has shape \(4,\); expected \(12,\)"),
    ("out_proj_bias shape", _set(out_proj_bias=np.ones((1, 4))),
     ValueError, r"out_proj_bias has shape \(1, 4\); expected \(4,\)"),
    ("both weights", _set(q_proj_weight=np.eye(4)),
     ValueError, "got both in_proj_weight and q_proj_weight/k_proj_weight/v_proj_weight"),
    ("no weights", lambda q, k, v, kw: (q, k, v, {**kw, "in_proj_weight": None,
                                                  "k_proj_weight": np.eye(4)}),
     ValueError, "in_proj_weight is None and q_proj_weight, v_proj_weight missing"),
    ("kpm shape", _set(key_padding_mask=np.zeros((5, 2), bool)),
     ValueError, r"key_padding_mask has shape \(5, 2\); expected \(N, S\) = \(2, 5\)"),
    ("kpm unbatched shape", lambda q, k, v, kw: (q[:, 0], k[:, 0], v[:, 0],
                                                 {**kw, "key_padding_mask": np.zeros((1, 5))}),
     ValueError, r"key_padding_mask has shape \(1, 5\); expected \(S,\) = \(5,\)"),
    ("attn_mask 2-D shape", _set(attn_mask=np.zeros((5, 3), bool)),
     ValueError, r"attn_mask has shape \(5, 3\); expected \(L, S\) = \(3, 5\) or "
                 r"\(N \* num_heads, L, S\) = \(4, 3, 5\)"),
    ("attn_mask 3-D shape", _set(attn_mask=np.zeros((2, 3, 5))),
     ValueError, r"attn_mask has shape \(2, 3, 5\); expected"),
    ("attn_mask unbatched", lambda q, k, v, kw: (q[:, 0], k[:, 0], v[:, 0],
                                                 {**kw, "attn_mask": np.zeros((4, 3, 5))}),
     ValueError, r"\(num_heads, L, S\) = \(2, 3, 5\)"),
]


@pytest.mark.parametrize("label,mutate,exc,match", FN_ERRORS, ids=[e[0] for e in FN_ERRORS])
def test_functional_errors(label, mutate, exc, match):
    q, k, v, kw = mutate(*_fn_args())
    with pytest.raises(exc, match=match):
        cyattn.multi_head_attention(q, k, v, **kw)


def test_functional_errors_separate_weights():
    q, k, v, kw = _fn_args(separate=True)
    cyattn.multi_head_attention(q, k, v, **kw)          # the valid call
    with pytest.raises(ValueError, match=r"k_proj_weight has shape \(3, 3\); expected \(E, "
                                         r"kdim\) with E=4"):
        cyattn.multi_head_attention(q, k, v, **{**kw, "k_proj_weight": np.ones((3, 3))})
    with pytest.raises(ValueError, match=r"v_proj_weight has shape \(4,\); expected \(E, vdim\)"):
        cyattn.multi_head_attention(q, k, v, **{**kw, "v_proj_weight": np.ones(4)})
    with pytest.raises(ValueError, match=r"q_proj_weight has shape \(4, 3\); expected \(4, 4\)"):
        cyattn.multi_head_attention(q, k, v, **{**kw, "q_proj_weight": np.ones((4, 3))})
    with pytest.raises(ValueError, match=r"value has shape \(5, 2, 4\); expected \(S, N, vdim\) "
                                         r"with N=2 \(from query\), S=5 \(from key\) and "
                                         r"vdim=2"):
        cyattn.multi_head_attention(q, k, np.ones((5, 2, 4)), **kw)


CTOR_ERRORS = [
    (dict(embed_dim=8.0, num_heads=2), TypeError, "embed_dim must be an int, got float"),
    (dict(embed_dim=8, num_heads="2"), TypeError, "num_heads must be an int, got str"),
    (dict(embed_dim=0, num_heads=1), ValueError, "embed_dim must be positive, got 0"),
    (dict(embed_dim=8, num_heads=-2), ValueError, "num_heads must be positive, got -2"),
    (dict(embed_dim=10, num_heads=4), ValueError,
     "embed_dim=10 must be divisible by num_heads=4"),
    (dict(embed_dim=8, num_heads=2, kdim=0), ValueError, "kdim must be positive, got 0"),
    (dict(embed_dim=8, num_heads=2, vdim=2.5), TypeError, "vdim must be an int, got float"),
    (dict(embed_dim=8, num_heads=2, bias=1), TypeError, "bias must be a bool, got int"),
    (dict(embed_dim=8, num_heads=2, batch_first="no"), TypeError,
     "batch_first must be a bool, got str"),
    (dict(embed_dim=8, num_heads=2, dtype=np.int32), TypeError,
     "dtype must be float16, float32 or float64, got"),
    (dict(embed_dim=8, num_heads=2, dtype="bogus"), TypeError,
     "dtype must be float16, float32 or float64, got 'bogus'"),
]


@pytest.mark.parametrize("kwargs,exc,match", CTOR_ERRORS, ids=[m for _, _, m in CTOR_ERRORS])
def test_constructor_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        cyattn.MultiHeadAttention(**kwargs)


def test_module_forward_errors_name_the_argument():
    m = cyattn.MultiHeadAttention(4, 2, batch_first=True, seed=0)
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=r"query has shape \(2, 3, 5\); expected \(N, L, E\) "
                                         r"with E=4"):
        m(np.zeros((2, 3, 5), np.float32), x, x)
    with pytest.raises(TypeError, match="key_padding_mask has dtype int64"):
        m(x, x, x, key_padding_mask=np.zeros((2, 3), np.int64))


def test_load_state_dict_errors():
    m = cyattn.MultiHeadAttention(4, 2, seed=0)
    good = m.state_dict()
    before = m.state_dict()
    with pytest.raises(ValueError, match="add_bias_kv is not supported"):
        m.load_state_dict({**good, "bias_k": np.zeros((1, 1, 4)), "bias_v": np.zeros((1, 1, 4))})
    with pytest.raises(ValueError, match=r"missing keys \['out_proj.bias'\], unexpected keys "
                                         r"\[\]"):
        m.load_state_dict({k: v for k, v in good.items() if k != "out_proj.bias"})
    with pytest.raises(ValueError, match=r"missing keys \[\], unexpected keys "
                                         r"\['q_proj_weight'\]"):
        m.load_state_dict({**good, "q_proj_weight": np.zeros((4, 4))})
    bad = {**good, "in_proj_bias": np.zeros(11)}
    bad["out_proj.weight"] = good["out_proj.weight"] * 0     # must not be loaded either
    with pytest.raises(ValueError, match=r"'in_proj_bias' has shape \(11,\); expected \(12,\)"):
        m.load_state_dict(bad)
    with pytest.raises(ValueError, match=r"'in_proj_weight' has shape \(4, 12\); expected "
                                         r"\(12, 4\)"):
        m.load_state_dict({**good, "in_proj_weight": good["in_proj_weight"].T})
    with pytest.raises(TypeError, match="'out_proj.weight' has dtype int64"):
        m.load_state_dict({**good, "out_proj.weight": np.zeros((4, 4), np.int64)})
    with pytest.raises(TypeError, match="state must be a mapping of parameter names to arrays, "
                                        "got list"):
        m.load_state_dict(list(good.items()))
    for name, value in m.state_dict().items():               # nothing was loaded
        np.testing.assert_array_equal(value, before[name])
    nobias = cyattn.MultiHeadAttention(4, 2, bias=False, seed=0)
    with pytest.raises(ValueError, match=r"unexpected keys \['in_proj_bias', 'out_proj.bias'\]"):
        nobias.load_state_dict(good)


def test_from_torch_duck_typed_without_torch():
    src = cyattn.MultiHeadAttention(6, 3, kdim=4, vdim=5, batch_first=True, dtype=np.float64,
                                    seed=2)
    m = cyattn.MultiHeadAttention.from_torch(FakeTorchMHA(src))
    assert (m.embed_dim, m.num_heads, m.kdim, m.vdim, m.batch_first) == (6, 3, 4, 5, True)
    assert m.dtype == np.float64
    for name, value in src.state_dict().items():
        np.testing.assert_array_equal(m.state_dict()[name], value)
    assert cyattn.MultiHeadAttention.from_torch(FakeTorchMHA(src),
                                                dtype=np.float32).dtype == np.float32
    # dropout is accepted in eval mode (torch applies none there)
    assert cyattn.MultiHeadAttention.from_torch(FakeTorchMHA(src, dropout=0.1,
                                                              training=False)).num_heads == 3


@pytest.mark.parametrize("attrs,match", [
    (dict(bias_k=np.zeros((1, 1, 6)), bias_v=np.zeros((1, 1, 6))),
     "uses add_bias_kv=True, which is not supported"),
    (dict(add_zero_attn=True), "uses add_zero_attn=True, which is not supported"),
    (dict(dropout=0.1, training=True), r"dropout=0.1 and is in training mode; "
                                       r"cyattn.MultiHeadAttention is inference only"),
])
def test_from_torch_errors_without_torch(attrs, match):
    src = cyattn.MultiHeadAttention(6, 3, seed=2)
    with pytest.raises(ValueError, match=match):
        cyattn.MultiHeadAttention.from_torch(FakeTorchMHA(src, **attrs))


def test_from_torch_dtype_error_without_torch():
    src = cyattn.MultiHeadAttention(6, 3, seed=2)
    with pytest.raises(TypeError, match="dtype must be float16, float32 or float64"):
        cyattn.MultiHeadAttention.from_torch(FakeTorchMHA(src), dtype=np.int8)


# --------------------------------------------------------------------------------------------
# torch.nn.MultiheadAttention (only when torch is installed)
# --------------------------------------------------------------------------------------------

def _torch_case(torch, dtype, batch_first, kdim, vdim, bias, seed=0):
    torch.manual_seed(seed)
    E, H, L, S, N = 16, 4, 5, 7, 3
    t = torch.nn.MultiheadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim,
                                    batch_first=batch_first, dropout=0.1)
    t = t.to(torch.float64 if dtype == np.float64 else torch.float32).eval()
    with torch.no_grad():
        if bias:     # torch initialises biases to 0: make them matter
            t.in_proj_bias.normal_()
            t.out_proj.bias.normal_()
    rng = np.random.default_rng(seed)
    q, k, v = make_inputs(rng, N, L, S, E, kdim or E, vdim or E, batch_first, dtype)
    return t, (E, H, L, S, N), (q, k, v)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("dims", [(None, None), (6, 10)], ids=["packed", "kdim_vdim"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("masks", ["none", "kpm_bool", "kpm_float+am2_float", "am3_bool",
                                   "kpm_bool+am2_bool", "causal", "causal+kpm_bool"])
@pytest.mark.parametrize("weight_mode", WEIGHT_MODES, ids=["avg", "per_head", "no_weights"])
def test_matches_torch(dtype, batch_first, dims, bias, masks, weight_mode):
    torch = pytest.importorskip("torch")
    t, (E, H, L, S, N), (q, k, v) = _torch_case(torch, dtype, batch_first, *dims, bias)
    m = cyattn.MultiHeadAttention.from_torch(t)
    assert m.dtype == dtype and m.batch_first == batch_first
    assert (m.kdim, m.vdim) == ((dims[0] or E), (dims[1] or E))
    rng = np.random.default_rng(1)
    kpm, am, causal = make_masks(masks, rng, N, H, L, S)
    if kpm is not None and kpm.dtype == bool:
        kpm[:, 0] = False                                    # no fully masked row
    if am is not None and am.dtype == bool:
        am[..., 0] = False
    if am is not None and am.dtype != bool:
        am[..., 0] = 0.0
    if kpm is not None and kpm.dtype != bool:
        kpm[:, 0] = 0.0
    # torch wants float masks in the data dtype
    kpm, am = (m if m is None or m.dtype == bool else m.astype(dtype) for m in (kpm, am))
    need_weights, average = weight_mode
    out, w = m(q, k, v, key_padding_mask=kpm, attn_mask=am, is_causal=causal,
               need_weights=need_weights, average_attn_weights=average)

    tkw = dict(need_weights=need_weights, average_attn_weights=average)
    t_am = am
    if causal:      # torch needs the causal mask itself; is_causal is only a hint there
        upper = np.triu(np.ones((L, S), bool), 1)
        t_am = upper if am is None else (am | upper)
        tkw["is_causal"] = True
    to_t = lambda a: None if a is None else torch.from_numpy(np.ascontiguousarray(a))
    with torch.no_grad():
        t_out, t_w = t(to_t(q), to_t(k), to_t(v), key_padding_mask=to_t(kpm),
                       attn_mask=to_t(t_am), **tkw)
    tol = TORCH_TOL[dtype]
    assert out.dtype == dtype
    np.testing.assert_allclose(out, t_out.numpy(), **tol)
    if need_weights:
        np.testing.assert_allclose(w, t_w.numpy(), **tol)
    else:
        assert w is None and t_w is None


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_matches_torch_unbatched(dtype):
    torch = pytest.importorskip("torch")
    t, (E, H, L, S, N), (q, k, v) = _torch_case(torch, dtype, False, 6, 10, True, seed=4)
    q, k, v = q[:, 0], k[:, 0], v[:, 0]
    m = cyattn.MultiHeadAttention.from_torch(t)
    rng = np.random.default_rng(2)
    kpm = bool_mask(rng, (S,))
    kpm[0] = False
    am = float_mask(rng, (H, L, S)).astype(dtype)
    am[..., 0] = 1.0
    out, w = m(q, k, v, key_padding_mask=kpm, attn_mask=am, average_attn_weights=False)
    with torch.no_grad():
        t_out, t_w = t(*(torch.from_numpy(x) for x in (q, k, v)),
                       key_padding_mask=torch.from_numpy(kpm), attn_mask=torch.from_numpy(am),
                       average_attn_weights=False)
    np.testing.assert_allclose(out, t_out.numpy(), **TORCH_TOL[dtype])
    np.testing.assert_allclose(w, t_w.numpy(), **TORCH_TOL[dtype])


def test_from_torch_reads_state_and_copies():
    torch = pytest.importorskip("torch")
    t = torch.nn.MultiheadAttention(8, 2, kdim=3, vdim=5).double()
    m = cyattn.MultiHeadAttention.from_torch(t, dtype=np.float32)
    assert m.dtype == np.float32 and m.in_proj_weight is None
    for name, tensor in t.state_dict().items():
        np.testing.assert_array_equal(m.state_dict()[name], tensor.numpy().astype(np.float32))
    with torch.no_grad():
        t.q_proj_weight.zero_()
    assert m.q_proj_weight.any()
    # torch's state_dict (converted by the caller) loads directly
    m2 = cyattn.MultiHeadAttention(8, 2, kdim=3, vdim=5, dtype=np.float64)
    m2.load_state_dict({k: v.detach().numpy() for k, v in t.state_dict().items()})
    assert not m2.q_proj_weight.any()


def test_from_torch_errors_with_torch():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="add_bias_kv=True, which is not supported"):
        cyattn.MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(ValueError, match="add_zero_attn=True, which is not supported"):
        cyattn.MultiHeadAttention.from_torch(
            torch.nn.MultiheadAttention(8, 2, add_zero_attn=True))
    with pytest.raises(ValueError, match="inference only"):
        cyattn.MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(8, 2, dropout=0.1))
    t = torch.nn.MultiheadAttention(8, 2, dropout=0.1).eval()
    assert cyattn.MultiHeadAttention.from_torch(t).embed_dim == 8
    bf16 = torch.nn.MultiheadAttention(8, 2).bfloat16()
    with pytest.raises(TypeError, match=r"'in_proj_weight' has dtype torch.bfloat16, which NumPy "
                                        r"cannot hold; pass dtype="):
        cyattn.MultiHeadAttention.from_torch(bf16)
    m = cyattn.MultiHeadAttention.from_torch(bf16, dtype=np.float32)
    np.testing.assert_array_equal(m.in_proj_weight, bf16.in_proj_weight.detach().float().numpy())
