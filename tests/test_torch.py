"""cyattn against PyTorch's CPU kernels (skipped when torch is not installed).

PyTorch is a reference here, never a dependency of cyattn. Cases avoid fully masked rows,
where the libraries' policies may differ (cyattn: zeros; see test_kernels for that policy).
"""
import numpy as np
import pytest

import cyattn

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOL = {np.float64: dict(rtol=1e-10, atol=1e-11), np.float32: dict(rtol=2e-5, atol=2e-6)}


def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def _rand(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def _qkv(rng, q_shape, k_shape, v_shape, dtype):
    return _rand(rng, q_shape, dtype), _rand(rng, k_shape, dtype), _rand(rng, v_shape, dtype)


def _assert_sdpa_matches_torch(q, k, v, dtype, mask=None, **kwargs):
    """cyattn's SDPA equals torch's within TOL[dtype]; ``kwargs`` (is_causal, scale,
    enable_gqa) mean the same to both. Returns cyattn's result."""
    ours = cyattn.scaled_dot_product_attention(q, k, v, mask, **kwargs)
    ref = F.scaled_dot_product_attention(_t(q), _t(k), _t(v),
                                         attn_mask=None if mask is None else _t(mask),
                                         **kwargs).numpy()
    np.testing.assert_allclose(ours, ref, **TOL[dtype])
    return ours


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("B,H,L,S,E,Ev", [(1, 1, 1, 1, 1, 1), (2, 3, 17, 33, 16, 8),
                                          (1, 2, 65, 64, 64, 64), (2, 1, 130, 97, 32, 48)])
def test_sdpa_dense(dtype, B, H, L, S, E, Ev):
    rng = np.random.default_rng(L * 7 + S)
    q, k, v = _qkv(rng, (B, H, L, E), (B, H, S, E), (B, H, S, Ev), dtype)
    ours = _assert_sdpa_matches_torch(q, k, v, dtype)
    assert ours.dtype == dtype


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("L,S", [(8, 8), (70, 70), (5, 40)])
def test_sdpa_causal_top_left(dtype, L, S):
    rng = np.random.default_rng(L + 100 * S)
    q, k, v = _qkv(rng, (2, 2, L, 16), (2, 2, S, 16), (2, 2, S, 16), dtype)
    _assert_sdpa_matches_torch(q, k, v, dtype, is_causal=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sdpa_bool_mask_and_scale(dtype):
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, (2, 3, 20, 8), (2, 3, 30, 8), (2, 3, 30, 5), dtype)
    mask = rng.random((2, 1, 20, 30)) < 0.6
    mask[..., 0] = True                     # no fully masked row
    _assert_sdpa_matches_torch(q, k, v, dtype, mask, scale=0.3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sdpa_float_mask(dtype):
    rng = np.random.default_rng(6)
    q, k, v = _qkv(rng, (1, 2, 33, 16), (1, 2, 17, 16), (1, 2, 17, 16), dtype)
    mask = np.where(rng.random((33, 17)) < 0.3, -np.inf, rng.standard_normal((33, 17)))
    mask[:, 3] = 0.0
    mask = mask.astype(dtype)
    _assert_sdpa_matches_torch(q, k, v, dtype, mask)


@pytest.mark.parametrize("hkv", [1, 2])
def test_sdpa_gqa(hkv):
    rng = np.random.default_rng(7)
    q, k, v = _qkv(rng, (2, 4, 9, 8), (2, hkv, 12, 8), (2, hkv, 12, 6), np.float64)
    _assert_sdpa_matches_torch(q, k, v, np.float64, enable_gqa=True)


def test_sdpa_bottom_right_matches_torch_causal_lower_right():
    from torch.nn.attention.bias import causal_lower_right
    rng = np.random.default_rng(8)
    q, k, v = _qkv(rng, (1, 2, 4, 8), (1, 2, 11, 8), (1, 2, 11, 8), np.float64)
    ours = cyattn.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               causal_alignment="bottom_right")
    ref = F.scaled_dot_product_attention(_t(q), _t(k), _t(v),
                                         attn_mask=causal_lower_right(4, 11)).numpy()
    np.testing.assert_allclose(ours, ref, **TOL[np.float64])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_and_log_softmax(dtype, axis):
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((7, 33, 65)) * 10).astype(dtype)
    np.testing.assert_allclose(cyattn.softmax(x, axis=axis),
                               torch.softmax(_t(x), dim=axis).numpy(), **TOL[dtype])
    np.testing.assert_allclose(cyattn.log_softmax(x, axis=axis),
                               torch.log_softmax(_t(x), dim=axis).numpy(),
                               rtol=TOL[dtype]["rtol"], atol=TOL[dtype]["rtol"] * 10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (31, 65, 17), (130, 97, 300)])
def test_matmul_accumulate(dtype, M, N, K):
    rng = np.random.default_rng(M + N + K)
    a, b, c = _rand(rng, (M, K), dtype), _rand(rng, (K, N), dtype), _rand(rng, (M, N), dtype)
    ref = (_t(c) + torch.matmul(_t(a), _t(b))).numpy()
    cyattn.matmul_accumulate(a, b, c)
    tol = dict(TOL[dtype])
    tol["atol"] *= np.sqrt(K)
    np.testing.assert_allclose(c, ref, **tol)
