"""cyattn.torch.scaled_dot_product_attention: PyTorch's signature on CPU tensors.

Compared with torch.nn.functional.scaled_dot_product_attention (float32/float64 directly,
float16/bfloat16 against torch in float64 on the same rounded inputs); zero copy checked by
spying on the arrays handed to the core; errors pinned by message.
"""
import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cyattn
import cyattn.torch as ct
from conftest import BFLOAT16_TOLERANCE, bf16_attention_bound, tol

F = torch.nn.functional
HAS_VARIANTS = "softcap" in inspect.signature(cyattn.scaled_dot_product_attention).parameters
needs_variants = pytest.mark.skipif(
    not HAS_VARIANTS, reason="the core cyattn.scaled_dot_product_attention has no window/softcap/"
                             "sinks options yet (issue 'variants')")

_NP = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}
ALL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _values(t):
    """A tensor (or None) as a NumPy array of the same values (bfloat16 as float32)."""
    if t is None:
        return None
    return t.float().numpy() if t.dtype is torch.bfloat16 else t.numpy()


def _assert_close(got, want, dtype, k, call=None):
    """``got`` (a tensor of ``dtype``) against a float64 tensor ``want``. bfloat16 with
    ``call`` = (q, k, v, mask, core options): the bound of the bf16 fast path (issue 40: the
    default where the kernels have vdpbf16ps; P is rounded to bfloat16, so the error is
    relative to sum_j w_j |v_j|, not to the output), which the exact path's error also meets."""
    assert got.dtype == dtype
    if dtype is torch.bfloat16 and call is not None:
        q, k_, v, mask, kw = call
        _, bound, _, _ = bf16_attention_bound(_values(q), _values(k_), _values(v),
                                              _values(mask), **kw)
        err = np.abs(got.double().numpy() - want.double().numpy())
        # 1e-12: torch's float64 reference against cyattn's, on which the bound is computed
        assert np.all(err <= bound + 1e-12), (err.max(), (err / bound).max())
        return
    if dtype is torch.bfloat16:
        rtol, atol = BFLOAT16_TOLERANCE["rtol"], BFLOAT16_TOLERANCE["atol"]
    else:
        rtol, atol = tol(_NP[dtype], k)
    np.testing.assert_allclose(got.double().numpy(), want.double().numpy(), rtol=rtol, atol=atol)


def _reference(q, k, v, dtype, **kw):
    """torch's SDPA: in ``dtype`` for float32/float64, in float64 on the same rounded inputs
    for float16/bfloat16 (their results are then within one rounding of it)."""
    if dtype in (torch.float32, torch.float64):
        return F.scaled_dot_product_attention(q, k, v, **kw)
    mask = kw.get("attn_mask")
    if mask is not None and mask.dtype != torch.bool:
        kw = dict(kw, attn_mask=mask.double())
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kw)


def _qkv(shape_q, shape_k, ev, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(shape_q, generator=g).to(dtype)
    k = torch.randn(shape_k, generator=g).to(dtype)
    v = torch.randn(shape_k[:-1] + (ev,), generator=g).to(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("B,H,Hkv,L,S,E,Ev", [(1, 1, 1, 1, 1, 1, 1), (2, 4, 2, 17, 33, 16, 8),
                                              (1, 8, 1, 1, 70, 32, 32), (2, 2, 2, 65, 40, 64, 64)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_torch(dtype, B, H, Hkv, L, S, E, Ev, is_causal):
    q, k, v = _qkv((B, H, L, E), (B, Hkv, S, E), Ev, dtype, L * 31 + S)
    gqa = H != Hkv
    got = ct.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=gqa)
    want = _reference(q, k, v, dtype, is_causal=is_causal, enable_gqa=gqa)
    assert got.shape == (B, H, L, Ev)
    _assert_close(got, want, dtype, E + S,
                  (q, k, v, None, dict(is_causal=is_causal, enable_gqa=gqa)))


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_masks_scale_and_strided_head_views(dtype):
    """bool and float masks, an explicit scale, and q/k/v as transpose(1, 2) views of
    (B, L, H, E) projections, as transformers hands them over."""
    g = torch.Generator().manual_seed(3)
    B, H, L, S, E = 2, 3, 20, 30, 8
    q = torch.randn(B, L, H, E, generator=g).to(dtype).transpose(1, 2)
    k = torch.randn(B, S, H, E, generator=g).to(dtype).transpose(1, 2)
    v = torch.randn(B, S, H, E, generator=g).to(dtype).transpose(1, 2)
    bool_mask = torch.rand(B, 1, L, S, generator=g) < 0.6
    bool_mask[..., 0] = True                        # no fully masked row
    float_mask = torch.randn(L, S, generator=g).to(dtype)
    for mask in (bool_mask, float_mask):
        got = ct.scaled_dot_product_attention(q, k, v, mask, scale=0.3)
        want = _reference(q, k, v, dtype, attn_mask=mask, scale=0.3)
        _assert_close(got, want, dtype, E + S, (q, k, v, mask, dict(scale=0.3)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mask_and_is_causal_compose_as_torch_does(dtype):
    """torch 2.13 on CPU applies both an attn_mask and is_causal (AND); so does the wrapper."""
    q, k, v = _qkv((1, 2, 6, 4), (1, 2, 9, 4), 4, dtype, 11)
    mask = torch.ones(6, 9, dtype=torch.bool)
    mask[3, 0] = mask[5, 2] = False
    got = ct.scaled_dot_product_attention(q, k, v, mask, is_causal=True)
    causal = torch.ones(6, 9, dtype=torch.bool).tril()
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask & causal)
    _assert_close(got, want, dtype, 13)
    np.testing.assert_array_equal(
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True).numpy(),
        want.numpy())                                   # the torch behaviour matched here


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_fully_masked_rows_are_zero_like_torch(dtype):
    """A query row with no permitted key: cyattn gives 0; torch 2.13's CPU SDPA also gives 0
    (for bool and -inf float masks), so here the libraries agree."""
    q, k, v = _qkv((1, 2, 3, 4), (1, 2, 5, 4), 4, dtype, 2)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    got = ct.scaled_dot_product_attention(q, k, v, mask)
    assert torch.count_nonzero(got[:, :, 1]) == 0
    assert torch.count_nonzero(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)[:, :, 1]) == 0
    assert torch.isfinite(got).all()


def test_return_lse_matches_logsumexp():
    q, k, v = _qkv((2, 2, 7, 8), (2, 2, 11, 8), 8, torch.float64, 5)
    out, lse = ct.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
    scores = (q @ k.transpose(-1, -2)) / 8 ** 0.5
    scores = scores.masked_fill(~torch.ones(7, 11, dtype=torch.bool).tril(), float("-inf"))
    np.testing.assert_allclose(lse.numpy(), torch.logsumexp(scores, -1).numpy(),
                               **dict(zip(("rtol", "atol"), tol(np.float64, 19))))
    assert lse.shape == (2, 2, 7)


# ------------------------------------------------------------------------------------------
# Zero copy
# ------------------------------------------------------------------------------------------

@pytest.fixture
def spy(monkeypatch):
    """Records the arguments the wrapper hands to the core and what the core returns."""
    calls = []
    core = ct._core_sdpa

    def recording(*args, **kwargs):
        res = core(*args, **kwargs)
        calls.append((args, kwargs, res))
        return res

    monkeypatch.setattr(ct, "_core_sdpa", recording)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zero_copy_in_and_out(dtype, spy):
    B, L, H, Hkv, E = 2, 9, 4, 2, 16
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(B, L, H + 2 * Hkv, E, generator=g).to(dtype)     # a fused projection
    q = qkv[:, :, :H].transpose(1, 2)
    k = qkv[:, :, H:H + Hkv].transpose(1, 2)
    v = qkv[:, :, H + Hkv:].transpose(1, 2)
    assert not q.is_contiguous()
    got = ct.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    (qa, ka, va, *_), kwargs, res = spy[-1]
    for arr, t in ((qa, q), (ka, k), (va, v)):
        assert isinstance(arr, np.ndarray) and arr.dtype == _NP[dtype]
        assert arr.ctypes.data == t.data_ptr() and arr.strides == tuple(
            s * t.element_size() for s in t.stride())
        assert np.shares_memory(arr, qkv.numpy())
    assert got.data_ptr() == res.ctypes.data                  # the result is not copied
    assert kwargs["n_threads"] == torch.get_num_threads()

    # out=: (B, H, L, Ev) view of a (B, L, H, Ev) buffer, and a C-contiguous tensor
    buf = torch.empty(B, L, H, E, dtype=dtype)
    r = ct.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                        out=buf.transpose(1, 2))
    assert r.data_ptr() == buf.data_ptr() and r.shape == (B, H, L, E)
    assert np.shares_memory(spy[-1][1]["out"], buf.numpy())
    np.testing.assert_array_equal(buf.transpose(1, 2).numpy(), got.numpy())
    flat = torch.empty(B, H, L, E, dtype=dtype)
    r = ct.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, out=flat)
    assert r is flat and spy[-1][2] is spy[-1][1]["out"]        # the kernel wrote it in place
    assert np.shares_memory(spy[-1][1]["out"], flat.numpy())
    np.testing.assert_array_equal(flat.numpy(), got.numpy())


def test_bfloat16_is_passed_without_a_copy(spy):
    """bfloat16 tensors reach the core as ml_dtypes.bfloat16 views of their buffers (issue
    19/20: no float32 copies), out= included; a decode call's K/V are then read in place."""
    pytest.importorskip("ml_dtypes")
    for L in (5, 1):
        q, k, v = _qkv((1, 2, L, 8), (1, 2, 700, 8), 8, torch.bfloat16, 1)
        out = torch.empty(1, L, 2, 8, dtype=torch.bfloat16).transpose(1, 2)     # strided
        r = ct.scaled_dot_product_attention(q, k, v, out=out)
        assert r is out
        args, kwargs = spy[-1][0], spy[-1][1]
        for arr, t in zip(args[:3], (q, k, v)):
            assert arr.dtype.name == "bfloat16"
            assert np.shares_memory(arr.view(np.int16), t.view(torch.int16).numpy())
        assert np.shares_memory(kwargs["out"].view(np.int16), out.view(torch.int16).numpy())
        want = ct.scaled_dot_product_attention(q.float(), k.float(), v.float())
        np.testing.assert_array_equal(out.float().numpy(),
                                      want.to(torch.bfloat16).float().numpy())
        got = ct.scaled_dot_product_attention(q, k, v)
        assert got.dtype is torch.bfloat16
        assert np.shares_memory(got.view(torch.int16).numpy(), spy[-1][2].view(np.int16))
        np.testing.assert_array_equal(got.float().numpy(), out.float().numpy())


def test_bfloat16_without_ml_dtypes_uses_float32_copies(spy, monkeypatch):
    monkeypatch.setattr(ct, "_BF16", None)
    q, k, v = _qkv((1, 2, 5, 8), (1, 2, 7, 8), 8, torch.bfloat16, 1)
    out = torch.empty(1, 2, 5, 8, dtype=torch.bfloat16)
    r, lse = ct.scaled_dot_product_attention(q, k, v, out=out, return_lse=True)
    assert r is out and lse.dtype is torch.bfloat16
    args = spy[-1][0]
    assert all(a.dtype == np.float32 for a in args[:3])
    want = ct.scaled_dot_product_attention(q.float(), k.float(), v.float())
    np.testing.assert_array_equal(out.float().numpy(), want.to(torch.bfloat16).float().numpy())


def test_n_threads_is_passed(spy):
    q, k, v = _qkv((1, 1, 3, 4), (1, 1, 3, 4), 4, torch.float32, 0)
    ct.scaled_dot_product_attention(q, k, v, n_threads=1)
    assert spy[-1][1]["n_threads"] == 1


def test_inference_mode_and_no_grad_inputs():
    q, k, v = _qkv((1, 1, 3, 4), (1, 1, 3, 4), 4, torch.float32, 0)
    want = F.scaled_dot_product_attention(q, k, v)
    with torch.inference_mode():
        got = ct.scaled_dot_product_attention(q, k, v)
    _assert_close(got, want, torch.float32, 7)
    with torch.no_grad():
        got = ct.scaled_dot_product_attention(q.requires_grad_(), k, v)
    _assert_close(got, want, torch.float32, 7)


# ------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------

def _small(dtype=torch.float32):
    return _qkv((1, 2, 3, 4), (1, 2, 5, 4), 4, dtype, 0)


def test_error_meta_device():
    q, k, v = _small()
    with pytest.raises(ValueError, match=r"query is on device 'meta'; cyattn runs on CPU"):
        ct.scaled_dot_product_attention(q.to("meta"), k, v)
    with pytest.raises(ValueError, match=r"key is on device 'meta'"):
        ct.scaled_dot_product_attention(q, k.to("meta"), v)


def test_error_dropout():
    q, k, v = _small()
    with pytest.raises(ValueError, match=r"dropout_p must be 0.0 .*got 0.1.*for training"):
        ct.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    with pytest.raises(TypeError, match=r"dropout_p must be a real number, got str"):
        ct.scaled_dot_product_attention(q, k, v, dropout_p="0")


def test_error_requires_grad_with_grad_mode():
    q, k, v = _small()
    with pytest.raises(ValueError, match=r"value requires grad and grad mode is on.*no backward"
                                         r".*torch.nn.functional.scaled_dot_product_attention "
                                         r"for training"):
        ct.scaled_dot_product_attention(q, k, v.requires_grad_())


def test_error_dtypes():
    q, k, v = _small()
    with pytest.raises(TypeError, match=r"same dtype, got torch.float32, torch.float64 and "
                                        r"torch.float32"):
        ct.scaled_dot_product_attention(q, k.double(), v)
    qi = torch.ones(1, 2, 3, 4, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"query has dtype torch.int32; expected torch.float32"):
        ct.scaled_dot_product_attention(qi, qi, qi)
    with pytest.raises(TypeError, match=r"key must be a torch.Tensor, got ndarray"):
        ct.scaled_dot_product_attention(q, k.numpy(), v)
    with pytest.raises(TypeError, match=r"attn_mask has dtype int"):
        ct.scaled_dot_product_attention(q, k, v, torch.ones(3, 5, dtype=torch.int64))


def test_error_sparse():
    q, k, v = _small()
    with pytest.raises(TypeError, match=r"query has layout torch.sparse_coo; expected a dense"):
        ct.scaled_dot_product_attention(q.to_sparse(), k, v)


def test_error_out():
    q, k, v = _small()
    out = torch.zeros(1, 2, 3, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"out has dtype torch.float64; expected the query's "
                                         r"dtype torch.float32"):
        ct.scaled_dot_product_attention(q, k, v, out=out)
    bad = torch.zeros(1, 2, 3, 5)
    with pytest.raises(ValueError, match=r"out"):
        ct.scaled_dot_product_attention(q, k, v, out=bad)
    assert torch.count_nonzero(bad) == 0
    qb, kb, vb = _small(torch.bfloat16)
    with pytest.raises(ValueError, match=r"out has shape \(1, 2, 3, 5\); expected \(1, 2, 3, 4\)"):
        ct.scaled_dot_product_attention(qb, kb, vb, out=bad.to(torch.bfloat16))


@pytest.mark.skipif(HAS_VARIANTS, reason="the core has the variant options")
def test_error_variant_option_missing_from_core():
    q, k, v = _small()
    with pytest.raises(TypeError, match=r"softcap= needs a cyattn whose "
                                        r"cyattn.scaled_dot_product_attention has the 'softcap'"):
        ct.scaled_dot_product_attention(q, k, v, softcap=30.0)


def test_signature_is_torchs():
    ours = list(inspect.signature(ct.scaled_dot_product_attention).parameters.values())
    positional = [p for p in ours if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert [(p.name, p.default) for p in positional] == [
        ("query", inspect.Parameter.empty), ("key", inspect.Parameter.empty),
        ("value", inspect.Parameter.empty), ("attn_mask", None), ("dropout_p", 0.0),
        ("is_causal", False), ("scale", None), ("enable_gqa", False)]
    # and torch's documented signature has these names in this order
    doc = F.scaled_dot_product_attention.__doc__
    assert "scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0," in doc
    assert "is_causal=False, scale=None, enable_gqa=False)" in doc


# ------------------------------------------------------------------------------------------
# Variant options (window, softcap, sinks): references written with torch ops
# ------------------------------------------------------------------------------------------

def _eager(q, k, v, mask=None, softcap=None, sinks=None):
    """Attention in float64 torch ops: scores, soft-cap, mask, optional sink logit per head."""
    s = (q.double() @ k.double().transpose(-1, -2)) / q.shape[-1] ** 0.5
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        sink = sinks.double().reshape(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)
        w = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
    else:
        w = torch.softmax(s, -1)
    return w @ v.double()


@needs_variants
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_softcap_and_window(dtype):
    q, k, v = _qkv((1, 2, 40, 16), (1, 2, 40, 16), 16, dtype, 8)
    q = q * 4                                          # large scores: the cap matters
    W = 7
    i, j = torch.arange(40)[:, None], torch.arange(40)[None, :]
    band = (j <= i) & (j >= i - (W - 1))
    got = ct.scaled_dot_product_attention(q, k, v, softcap=5.0, window=(W - 1, 0))
    _assert_close(got, _eager(q, k, v, band, softcap=5.0), dtype, 56,
                  (q, k, v, None, dict(softcap=5.0, window=(W - 1, 0))))


@needs_variants
def test_window_bottom_right_decode_skips_blocks_equal_band_mask():
    """Sliding window with a long cache (many 256-key blocks outside the window)."""
    q, k, v = _qkv((1, 2, 3, 16), (1, 2, 2000, 16), 16, torch.float64, 9)
    W = 100
    i, j = torch.arange(3)[:, None] + 1997, torch.arange(2000)[None, :]
    band = (j <= i) & (j >= i - (W - 1))
    got = ct.scaled_dot_product_attention(q, k, v, window=(W - 1, 0),
                                          causal_alignment="bottom_right")
    _assert_close(got, _eager(q, k, v, band), torch.float64, 2016)


@needs_variants
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_sinks(dtype):
    q, k, v = _qkv((2, 4, 5, 8), (2, 4, 9, 8), 8, dtype, 10)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0]).to(dtype)
    got = ct.scaled_dot_product_attention(q, k, v, sinks=sinks, is_causal=True)
    causal = torch.ones(5, 9, dtype=torch.bool).tril()
    _assert_close(got, _eager(q, k, v, causal, sinks=sinks), dtype, 17)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("mask_kind", [None, "per batch", "per head", "float per head"])
def test_decode_gqa_packs_query_heads(dtype, mask_kind, spy):
    """One query row with GQA: the query heads of a key/value head are handed to the core as
    the rows of one problem (views, no copy), with the same result as torch."""
    B, H, Hkv, S, E = 2, 8, 2, 40, 16
    g = torch.Generator().manual_seed(12)
    q = torch.randn(B, 1, H, E, generator=g).to(dtype).transpose(1, 2)   # (B, H, 1, E) view
    k = torch.randn(B, Hkv, S, E, generator=g).to(dtype)
    v = torch.randn(B, Hkv, S, E, generator=g).to(dtype)
    mask = {None: None,
            "per batch": torch.rand(B, 1, 1, S, generator=g) < 0.7,
            "per head": torch.rand(B, H, 1, S, generator=g) < 0.7,
            "float per head": torch.randn(B, H, 1, S, generator=g).to(dtype)}[mask_kind]
    if mask is not None and mask.dtype == torch.bool:
        mask[..., 0] = True
    buf = torch.empty(B, 1, H, E, dtype=dtype)
    got = ct.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True,
                                          out=buf.transpose(1, 2))
    want = _reference(q, k, v, dtype, attn_mask=mask, enable_gqa=True)
    _assert_close(got, want, dtype, E + S)
    args, kwargs, _ = spy[-1]
    assert args[0].shape == (B, Hkv, H // Hkv, E) and kwargs["enable_gqa"] is False
    if dtype is not torch.bfloat16:
        assert np.shares_memory(args[0], q.numpy()) and np.shares_memory(kwargs["out"],
                                                                         buf.numpy())
    out, lse = ct.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True, return_lse=True)
    assert out.shape == (B, H, 1, E) and lse.shape == (B, H, 1)
    _assert_close(out, want, dtype, E + S)


def test_docstring_examples_run():
    import doctest
    result = doctest.testmod(ct, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_import_cyattn_imports_neither_torch_nor_transformers():
    import subprocess
    import sys
    code = ("import sys, cyattn; bad = [m for m in ('torch', 'transformers') if m in "
            "sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_variants
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_key_lengths_and_alibi_slopes_tensors(dtype):
    """Integer and float tensors for the per-batch options reach the core as arrays."""
    B, H, L, S, E = 3, 4, 6, 10, 8
    q, k, v = _qkv((B, H, L, E), (B, H, S, E), E, dtype, 13)
    lengths = torch.tensor([[10], [7], [3]])                  # (B, 1): broadcast over heads
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625]).to(dtype)
    got = ct.scaled_dot_product_attention(q, k, v, key_lengths=lengths, alibi_slopes=slopes)
    i, j = torch.arange(L)[:, None], torch.arange(S)[None, :]
    bias = -slopes.double().reshape(1, H, 1, 1) * (i - j).abs()
    keep = (j < lengths.reshape(B, 1, 1, 1))
    s = (q.double() @ k.double().transpose(-1, -2)) / E ** 0.5 + bias
    want = torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v.double()
    _assert_close(got, want, dtype, E + S)


def test_bfloat16_precision_reaches_the_core():
    """precision= is handed to the core (issue 40); None keeps the core's default."""
    pytest.importorskip("ml_dtypes")
    q, k, v = _qkv((1, 2, 40, 16), (1, 2, 50, 16), 16, torch.bfloat16, 4)
    arrays = [ct._to_numpy(t) for t in (q, k, v)]
    for precision in (None, "exact", "fast"):
        got = ct.scaled_dot_product_attention(q, k, v, precision=precision)
        want = cyattn.scaled_dot_product_attention(*arrays, precision=precision)
        np.testing.assert_array_equal(got.view(torch.int16).numpy(), want.view(np.int16))
    with pytest.raises(ValueError, match="precision must be None, 'exact' or 'fast'"):
        ct.scaled_dot_product_attention(q, k, v, precision="fastest")
