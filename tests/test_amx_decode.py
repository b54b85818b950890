"""bfloat16 decode on AMX tiles (issue 45): up to 16 query rows per head, the query heads of a
K/V group (times L) as the tiles' rows, through the tiles' portable model on every host
(``emulate="amx"``), and on the hardware where the amx variant loads.

* Within the bound of ``precision="fast"`` (scaled_dot_product_attention's Notes; nb counts the
  key chunks of 128-512) against the float64 reference on the same bf16 values: group sizes
  1-16, L = 1-16, odd E and Ev, and every option of the grouped decode (bool and float masks,
  both causal alignments, windows, key lengths with NaN past them, query lengths, softcap,
  ALiBi, sinks, lse).
* The tile decode really runs: its bits equal a NumPy model of its sums (chunks of 128 keys,
  TDPBF16PS's even and odd sums per 32 keys, the chunks merged in order) where the weights
  are exact; 1, 2 and 3 threads bit-identical; strided inputs give the contiguous bits; a
  non-finite result is computed again on the exact path; a few-row call too small to decode
  takes the prefill tiles.
* On an AMX host (tools/amx_check.sh): the hardware equals the model bit for bit.
"""
import numpy as np
import pytest
from conftest import bf16_attention_bound
from test_amx_attention import check_hardware_equals_model, needs_amx
from test_bf16_attention_fast import _bits, _qkv, _sdpa
from test_decode_grouped import OPTIONS, _case

import cyattn
from cyattn import _backend

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)


def _check(q, k, v, mask=None, threads=(1, 2, 3), **kw):
    """The tile decode (the model) on 1, 2 and 3 threads, bit-identical, and within the
    documented bound of the float64 reference; returns (out, lse)."""
    res = [_sdpa(q, k, v, mask, emulate="amx", return_lse=True, n_threads=t, **kw)
           for t in threads]
    out, lse = res[0]
    for o, s in res[1:]:
        assert np.array_equal(_bits(o), _bits(out)) and np.array_equal(_bits(s), _bits(lse))
    assert out.dtype == BF16 and lse.dtype == BF16
    # keys no row may see may hold NaN (never read): the bound's sums must not see them
    kf, vf = (np.nan_to_num(t.astype(np.float64)) for t in (k, v))
    o, b, ref_lse, lse_b = bf16_attention_bound(q, kf, vf, mask, key_chunk=128, **kw)
    err = np.abs(out.astype(np.float64) - o)
    assert np.all(err <= b), (err.max(), (err / b).max())
    lse64 = lse.astype(np.float64)
    inf = ~np.isfinite(ref_lse)
    assert np.array_equal(lse64[inf], ref_lse[inf])
    assert np.all(np.abs(lse64[~inf] - ref_lse[~inf]) <= lse_b[~inf])
    return out, lse


# (B, Hq, Hk, L, S, E, Ev): groups of 1, 2, 3, 4, 8 and 16 heads; L of 1-16 (a task's rows:
# 16 // L whole heads); E and Ev off the tiles' 32 and 16; one key past a chunk of 128
SHAPES = [(2, 8, 2, 1, 300, 64, 64), (1, 32, 8, 1, 700, 128, 128), (1, 4, 4, 3, 257, 40, 33),
          (1, 16, 1, 1, 300, 33, 7), (1, 2, 2, 16, 300, 72, 40), (2, 6, 2, 5, 129, 17, 20),
          (1, 8, 1, 4, 200, 1, 1), (1, 3, 1, 7, 600, 65, 130)]


@pytest.mark.parametrize("B,Hq,Hk,L,S,E,Ev", SHAPES)
def test_decode_tiles_within_bound(B, Hq, Hk, L, S, E, Ev):
    rng = np.random.default_rng(B * 100 + Hq * 10 + L)
    q, k, v = _qkv(rng, B, Hq, Hk, L, S, E, Ev, scale=2.0)
    _check(q, k, v, enable_gqa=Hq != Hk, threads=(1, 3))


DCASES = [(1, 2, 4, 1, 300), (1, 2, 8, 4, 300), (2, 1, 4, 16, 260), (1, 3, 2, 7, 300),
          (1, 2, 1, 5, 300)]


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("case", DCASES, ids=lambda c: "B{}-Hkv{}-g{}-L{}-S{}".format(*c))
def test_decode_tiles_options_within_bound(case, option):
    q, k, v, kw = _case(*case, option)
    kw.pop("return_lse")
    if option == "key-lengths-nan":
        # NaN keys and values past the longest length of each group's heads: no head may see
        # them, so the tiles must not read them (a redo would also pass: the lse bits say)
        B, Hkv, g = case[:3]
        longest = kw["key_lengths"].reshape(B, Hkv, g).max(axis=-1)
        for b, h in np.ndindex(B, Hkv):
            k[b, h, longest[b, h]:] = np.nan
            v[b, h, longest[b, h]:] = np.nan
    mask = kw.pop("attn_mask", None)
    if mask is not None and mask.dtype != np.bool_:
        mask = mask.astype(np.float32)
    q, k, v = (t.astype(BF16) for t in (q, k, v))
    _check(q, k, v, mask, **kw)


def _model_zero_scores(v, keep, chunk=128):
    """The tile decode's float32 output for one row whose scores are all 0 (q = 0): weights
    exactly 1 where ``keep``, else 0. Per chunk of ``chunk`` keys from key 0, per 32 keys the
    even and the odd keys' products summed from +0 in order, the chunk's accumulator (from
    +0) plus (even + odd); the chunks merged in order (weight exp(0) = 1, or 0 for a chunk
    with no key), divided by the count as o * (1 / count)."""
    S, Ev = v.shape
    v32 = v.astype(np.float32)
    o = np.zeros(Ev, np.float32)
    total = np.float32(0)
    for c0 in range(0, S, chunk):
        acc = np.zeros(Ev, np.float32)
        for b0 in range(c0, min(c0 + chunk, S), 32):
            n = min(32, S - b0)
            p = np.zeros(32, np.float32)
            vv = np.zeros((32, Ev), np.float32)
            p[:n] = keep[b0:b0 + n]
            vv[:n] = v32[b0:b0 + n]
            even = np.zeros(Ev, np.float32)
            odd = np.zeros(Ev, np.float32)
            for i in range(16):
                even = even + p[2 * i] * vv[2 * i]
                odd = odd + p[2 * i + 1] * vv[2 * i + 1]
            acc = acc + (even + odd)
        count = np.float32(keep[c0:c0 + chunk].sum())
        if count:
            total = total + count
            o = o + acc
    return o * (np.float32(1) / total)


def test_decode_tiles_bits_equal_numpy_model_of_its_sums():
    """q = 0: every weight is exactly 1 or 0 (bool mask), so the float32 output's bits are
    those of the tiles' sums and the chunk merge alone (the kernel entry, before the bf16
    rounding of the result); one sum over all keys (the prefill tiles' order) differs."""
    rng = np.random.default_rng(40)
    H, S, E, Ev = 4, 300, 24, 40                # 3 chunks of 128 (1 group of 4 heads)
    q = np.zeros((H, 1, E), np.uint16)
    k = rng.standard_normal((S, E)).astype(BF16)
    # values over a wide range of exponents, so that the float32 sums round (sums of bf16
    # values of like size are exact in float32, in any order)
    v = (rng.standard_normal((S, Ev)) * 2.0 ** rng.integers(-12, 13, (S, Ev))).astype(BF16)
    mask = rng.random((H, 1, S)) < 0.7
    mask[2, 0, 128:256] = False                 # a chunk with no key for head 2
    out = np.zeros((H, 1, Ev), np.float32)
    lse = np.zeros((H, 1), np.float32)
    zero = np.zeros(H, np.int64)
    redo = _backend.kernels.attention_bf16(
        q, np.arange(H, dtype=np.int64) * E, E, 1, k.view(np.uint16), zero, E, 1,
        v.view(np.uint16), zero, Ev, 1, mask.view(np.uint8), 1,
        np.arange(H, dtype=np.int64) * S, S, 1, out, lse, 1, S, E, Ev, E ** -0.5, False, False,
        True, 2, emulate=True, tiles=True)
    assert not redo
    differs = False
    for h in range(H):
        want = _model_zero_scores(v, mask[h, 0])
        assert np.array_equal(out[h, 0].view(np.uint32), want.view(np.uint32)), h
        differs |= not np.array_equal(want, _model_zero_scores(v, mask[h, 0], chunk=S))
    assert differs


def test_decode_tiles_strided_inputs_give_contiguous_bits():
    rng = np.random.default_rng(41)
    base = rng.standard_normal((2, 8, 2, 2 * 65)).astype(BF16)
    q = base[..., ::2][:, ::-1]                                 # column and head strides
    k = np.asfortranarray(rng.standard_normal((2, 2, 300, 65)).astype(BF16))
    v = rng.standard_normal((2, 300, 2, 33)).astype(BF16).transpose(0, 2, 1, 3)
    got = _check(q, k, v, enable_gqa=True, is_causal=True, causal_alignment="bottom_right")
    same = _sdpa(*(np.ascontiguousarray(t) for t in (q, k, v)), emulate="amx",
                 return_lse=True, enable_gqa=True, is_causal=True,
                 causal_alignment="bottom_right")
    assert np.array_equal(_bits(got[0]), _bits(same[0]))
    assert np.array_equal(_bits(got[1]), _bits(same[1]))


def test_decode_tiles_nonfinite_redone_on_exact_path():
    """A NaN value at a key that a row may not see but its task reads (another head sees it)
    reaches the tiles through a +0 weight: the call is computed again on the exact path,
    which never reads it; a NaN at a key a row sees makes the row NaN."""
    rng = np.random.default_rng(42)
    q, k, v = _qkv(rng, 1, 4, 1, 1, 300, 32, 16)
    mask = np.ones((1, 4, 1, 300), bool)
    mask[0, 1, 0, 7] = False
    v[0, 0, 7, 3] = np.nan
    out = _sdpa(q, k, v, mask, emulate="amx", enable_gqa=True)
    exact = _sdpa(q, k, v, mask, precision="exact", enable_gqa=True)
    assert np.array_equal(_bits(out), _bits(exact))
    assert np.isfinite(out[0, 1].astype(np.float32)).all()
    assert np.isnan(out[0, 0, 0, 3].astype(np.float32))


def test_decode_tiles_fully_masked_and_empty_rows():
    rng = np.random.default_rng(43)
    q, k, v = _qkv(rng, 1, 4, 2, 2, 300, 32, 16)
    mask = rng.random((1, 4, 2, 300)) < 0.5
    mask[0, 3] = False
    out, lse = _check(q, k, v, mask, enable_gqa=True, key_lengths=np.array([[300, 0, 5, 300]]))
    assert not np.any(out[0, 1].astype(np.float32)) and not np.any(out[0, 3].astype(np.float32))
    assert np.all(np.isneginf(lse[0, 1].astype(np.float32)))


def test_few_rows_too_small_to_decode_take_the_prefill_tiles():
    """L = 8 against 40 keys (fewer than 16 per row: the exact path would not decode): the
    prefill tiles, within their bound."""
    rng = np.random.default_rng(44)
    q, k, v = _qkv(rng, 1, 2, 2, 8, 40, 32, 16)
    out, lse = _sdpa(q, k, v, emulate="amx", return_lse=True)
    o, b, ref_lse, lse_b = bf16_attention_bound(q, k, v)
    assert np.all(np.abs(out.astype(np.float64) - o) <= b)
    exact = _sdpa(q, k, v, precision="exact")
    assert not np.array_equal(_bits(out), _bits(exact))


def test_vdpbf16ps_fast_path_still_decodes_exactly():
    """Off the tiles, precision="fast" leaves few-row calls on the exact path (unchanged)."""
    rng = np.random.default_rng(45)
    q, k, v = _qkv(rng, 1, 8, 2, 1, 400, 64, 64)
    exact = cyattn.scaled_dot_product_attention(q, k, v, enable_gqa=True, precision="exact")
    got = _sdpa(q, k, v, emulate=True, enable_gqa=True)
    assert np.array_equal(_bits(got), _bits(exact))


HW_CASES = [(dict(enable_gqa=True), (1, 32, 8, 1, 700, 128, 128)),
            (dict(enable_gqa=True, is_causal=True, causal_alignment="bottom_right",
                  window=(200, 0), softcap=3.0), (2, 8, 2, 4, 520, 72, 40)),
            (dict(sinks=np.array([1.0, -2.0]), alibi_slopes=np.array([0.5, 0.1]),
                  key_lengths=np.array([300, 7])), (1, 2, 2, 16, 300, 64, 64))]


@needs_amx
@pytest.mark.parametrize("i", range(len(HW_CASES)))
def test_hardware_decode_tiles_equal_model(i, monkeypatch):
    kw, shape = HW_CASES[i]
    check_hardware_equals_model(kw, shape, 50 + i, monkeypatch)
