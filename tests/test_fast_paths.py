"""The attention kernel's internal paths, each against the float64 NumPy reference:

* the fused online-softmax path over several key blocks (KB = 256 keys) and query groups
  (up to 1024 rows, 256 for heads with E + Ev > 256, fewer when the threads need more tasks), with
  causal block skipping in both alignments and bool-mask block skipping;
* the decode path (L <= 16 unit-stride query rows unless the whole problem is tiny, the keys
  split into fixed chunks of 512, 128-512 where GQA heads share a K/V head or L > 4);
* the two-pass path that redoes rows whose fused result is not finite (huge finite values,
  NaN, inf), which must give the documented results and leave the other rows untouched.

Sizes are chosen to land on and either side of the block, group and chunk boundaries.
"""
import numpy as np
import pytest
from conftest import assert_close, numpy_sdpa

import cyattn

sdpa = cyattn.scaled_dot_product_attention
DTYPES = [np.float32, np.float64]


def _qkv(rng, B, H, L, S, E, Ev=None, dtype=np.float32, Hk=None):
    Ev = E if Ev is None else Ev
    Hk = H if Hk is None else Hk
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, Hk, S, E)).astype(dtype)
    v = rng.standard_normal((B, Hk, S, Ev)).astype(dtype)
    return q, k, v


def _check(q, k, v, mask=None, **kw):
    out, lse = sdpa(q, k, v, mask, return_lse=True, **kw)
    kw.pop("n_threads", None)
    ref, ref_lse = numpy_sdpa(q, k, v, mask, **kw)
    S = k.shape[-2]
    assert_close(out, ref, q.dtype, k=S)
    assert_close(lse, ref_lse, q.dtype, k=S)
    return out, lse


# ------------------------------------------------------------------------------------------
# fused path: key blocks, query groups, causal and mask block skipping
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("L,S", [(1, 255), (5, 256), (33, 257), (255, 513), (257, 700),
                                 (300, 300), (513, 129), (64, 1000)])
def test_fused_blocks_dense(variant, dtype, L, S):
    rng = np.random.default_rng(L * 1000 + S)
    q, k, v = _qkv(rng, 1, 2, L, S, 24, 40, dtype)
    if L <= 16:                     # unit-stride rows would take the decode path
        q = np.asfortranarray(q)
    _check(q, k, v)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_fused_dense_groups_of_1024_rows(variant, dtype):
    # Without a causal mask a task takes up to 1024 query rows (fewer when the threads need
    # more tasks); rows on either side of the 1024 boundary, 1 and 2 threads, the same bits.
    rng = np.random.default_rng(43)
    q, k, v = _qkv(rng, 1, 1, 1100, 300, 16, 24, dtype)
    out, lse = _check(q, k, v, n_threads=1)
    got, got_lse = sdpa(q, k, v, return_lse=True, n_threads=2)
    np.testing.assert_array_equal(got, out)
    np.testing.assert_array_equal(got_lse, lse)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("L,S", [(300, 300), (257, 700), (700, 257), (520, 520), (40, 600)])
def test_fused_causal_block_skipping(variant, dtype, align, L, S):
    rng = np.random.default_rng(L + 7 * S)
    q, k, v = _qkv(rng, 1, 2, L, S, 16, 8, dtype)
    out, lse = _check(q, k, v, is_causal=True, causal_alignment=align)
    if align == "bottom_right" and L > S:          # the first L - S rows see no key
        assert np.all(out[..., : L - S, :] == 0) and np.all(lse[..., : L - S] == -np.inf)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_fused_padding_mask_skips_whole_blocks(variant, dtype):
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, 2, 3, 300, 900, 16, dtype=dtype)
    keep = np.ones((2, 1, 1, 900), dtype=bool)
    keep[0, ..., 250:] = False                     # blocks 1-3 of batch 0 are skipped
    keep[1, ..., 256:512] = False                  # exactly block 1 of batch 1
    k[0, :, 600:] = np.nan                         # never read: skipped with its block
    v[1, :, 300:400] = np.inf
    out = sdpa(q, k, v, keep)
    k_ref, v_ref = k.copy(), v.copy()
    k_ref[0, :, 600:] = 0
    v_ref[1, :, 300:400] = 0
    ref, _ = numpy_sdpa(q, k_ref, v_ref, keep)
    assert_close(out, ref, dtype, k=900)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_fused_general_masks_and_gqa(variant, dtype):
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, 2, 4, 270, 530, 8, 12, dtype, Hk=2)
    keep = rng.random((2, 4, 270, 530)) < 0.3
    keep[0, 1, 17] = False                         # a fully masked row
    keep[1, :, :, 256:512] = False                 # a block masked for every row
    _check(q, k, v, keep, enable_gqa=True, is_causal=True, causal_alignment="bottom_right")
    add = np.where(keep, rng.standard_normal(keep.shape), -np.inf).astype(dtype)
    _check(q, k, v, add, enable_gqa=True, is_causal=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_fused_strided_inputs(variant, dtype):
    rng = np.random.default_rng(9)
    q, k, v = _qkv(rng, 1, 3, 280, 600, 20, dtype=dtype)
    qs = np.asfortranarray(q)
    ks = k[..., ::-1, :]
    vs = np.swapaxes(np.ascontiguousarray(np.swapaxes(v, -1, -2)), -1, -2)
    _check(qs, ks, vs, is_causal=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("L, S", [(300, 600), (1, 4097), (3, 1100), (5, 40)],
                         ids=["fused", "decode", "decode-3", "small"])
def test_head_interleaved_out_written_in_place(variant, dtype, L, S):
    """out= as a (B, L, H, Ev) buffer viewed as (B, H, L, Ev), the layout transformers asks
    for, gets the bits of a C-contiguous call, written by the kernel (no result-sized
    temporary), with the buffer's other elements untouched; also when rows are redone (inf
    values). An out that overlaps an input still gets the right result (through a copy)."""
    import tracemalloc
    rng = np.random.default_rng(11)
    B, H, Hk, E, Ev = 2, 4, 2, 24, 20
    q, k, v = _qkv(rng, B, H, L, S, E, Ev, dtype=dtype, Hk=Hk)
    v[1, 0, S // 2, 3] = np.inf
    # the low-overhead path, and the general one (a variant option)
    for causal, kw in ((False, {}), (True, {}), (True, {"softcap": 5.0, "window": (40, 0)})):
        ref = sdpa(q, k, v, is_causal=causal, enable_gqa=True, **kw)
        buf = np.full((B, L, H, Ev + 3), 7.0, dtype=dtype)
        out = buf[..., :Ev].transpose(0, 2, 1, 3)
        assert sdpa(q, k, v, is_causal=causal, enable_gqa=True, out=out, n_threads=2,
                    **kw) is out
        np.testing.assert_array_equal(out, ref)
        assert np.all(buf[..., Ev:] == 7.0)
        tracemalloc.start()
        try:
            sdpa(q, k, v, is_causal=causal, enable_gqa=True, out=out, **kw)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        if out.nbytes >= 1 << 16:       # else the call's small bookkeeping dominates
            assert peak < out.nbytes // 2, (kw, peak)
    # out overlapping the query: the result is computed from the inputs as they were
    qb = np.empty((B, L, H, max(E, Ev)), dtype=dtype)
    qo = qb[..., :E].transpose(0, 2, 1, 3)
    qo[...] = q
    ref = sdpa(q, k, v, enable_gqa=True)
    res = sdpa(qo, k, v, enable_gqa=True, out=qb[..., :Ev].transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(res, ref)


def test_out_sharing_memory_with_lengths_gets_the_right_result():
    """key_lengths that live in out's own buffer (the kernel would overwrite them with the
    first batch entry's output before the second reads its length): the result is computed
    before out is written, as for any input out shares memory with."""
    rng = np.random.default_rng(12)
    q = rng.standard_normal((2, 1, 4, 4))
    k = rng.standard_normal((2, 1, 8, 4))
    ref = sdpa(q, k, k, key_lengths=np.array([[8], [2]]))
    for layout in ("contiguous", "interleaved"):
        buf = np.zeros((2, 4, 1, 4))
        out = buf.transpose(0, 2, 1, 3) if layout == "interleaved" else buf.reshape(2, 1, 4, 4)
        lengths = buf.reshape(-1)[:2].view(np.int64)
        lengths[:] = [8, 2]
        assert sdpa(q, k, k, out=out, key_lengths=lengths[:, None]) is out
        np.testing.assert_array_equal(out, ref)


# ------------------------------------------------------------------------------------------
# decode path
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("L", [1, 2, 4, 5])
@pytest.mark.parametrize("S", [1, 7, 64, 511, 512, 513, 1024, 1537, 4097])
def test_decode_dense(variant, dtype, L, S):
    rng = np.random.default_rng(L * S)
    _check(*_qkv(rng, 2, 3, L, S, 64, 32, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("S", [40, 2000])
def test_decode_causal_masks_gqa(variant, dtype, align, S):
    rng = np.random.default_rng(11)
    q, k, v = _qkv(rng, 2, 4, 3, S, 40, 24, dtype, Hk=2)
    keep = rng.random((2, 1, 3, S)) < 0.5
    keep[0, 0, 1] = False                          # a fully masked row
    _check(q, k, v, keep, is_causal=True, causal_alignment=align, enable_gqa=True)
    add = np.where(keep, -3.0, -np.inf).astype(dtype)
    add[1, 0, 2, :S // 3] = 5.0
    _check(q, k, v, add, causal_alignment=align, enable_gqa=True)
    _check(q, k, v, is_causal=True, causal_alignment=align, enable_gqa=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_decode_fully_masked_and_nan_rules(variant, dtype):
    rng = np.random.default_rng(12)
    q, k, v = _qkv(rng, 1, 2, 2, 3000, 16, dtype=dtype)
    keep = np.ones((1, 2, 2, 3000), dtype=bool)
    keep[0, 0, 0] = False                          # fully masked row
    keep[0, 1, :, 1000:2100] = False               # masked keys hold NaN/inf: never read
    k[0, 1, 1000:2100] = np.nan
    v[0, 1, 1500:1600] = np.inf
    v[0, 1, 1600:1700] = np.nan
    out, lse = sdpa(q, k, v, keep, return_lse=True)
    assert np.all(out[0, 0, 0] == 0) and lse[0, 0, 0] == -np.inf
    assert np.all(np.isfinite(out[0, 1])) and np.all(np.isfinite(lse[0, 1]))
    k_ref, v_ref = k.copy(), v.copy()
    k_ref[0, 1, 1000:2100] = 0
    v_ref[0, 1, 1500:1700] = 0
    ref, ref_lse = numpy_sdpa(q, k_ref, v_ref, keep)
    assert_close(out, ref, dtype, k=3000)
    assert_close(lse, ref_lse, dtype, k=3000)
    # a NaN in a permitted position makes (only) its row NaN
    q2 = q.copy()
    q2[0, 0, 1, 3] = np.nan
    out2 = sdpa(q2, k, v, keep)
    assert np.all(np.isnan(out2[0, 0, 1]))
    np.testing.assert_array_equal(out2[0, 1], out[0, 1])


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("S", [64, 1500])
def test_decode_any_layout_same_bits(variant, dtype, S):
    # The decode path reads rows of adjacent elements; a query, key or value whose rows are
    # strided (Fortran order, transposed, reversed, broadcast along E) must still give the bits
    # of C-contiguous copies, for every L the decode path may take.
    rng = np.random.default_rng(S)
    for L in (1, 2, 3, 4):
        q, k, v = _qkv(rng, 2, 3, L, S, 24, 40, dtype)
        want = sdpa(q, k, v, return_lse=True)
        for qq, kk, vv in ((np.asfortranarray(q), k, v), (q, np.asfortranarray(k), v),
                           (q, k, np.asfortranarray(v)), (q[..., ::-1].copy()[..., ::-1], k,
                                                          v[..., ::-1].copy()[..., ::-1])):
            got = sdpa(qq, kk, vv, return_lse=True)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
        qb = np.broadcast_to(q[..., :1], q.shape)          # every element of a row equal
        got = sdpa(qb, k, v, return_lse=True)
        want = sdpa(np.ascontiguousarray(qb), k, v, return_lse=True)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("S", [64, 1500])
def test_decode_masked_values_never_read(variant, dtype, S):
    # A value whose weight is exactly 0 (bool-masked, or -inf additive) is skipped, not
    # multiplied by 0: inf/NaN there give the same bits as clean values, without the two-pass
    # redo (which would round differently).
    rng = np.random.default_rng(S + 1)
    q, k, v = _qkv(rng, 1, 2, 3, S, 16, 8, dtype)
    keep = rng.random((1, 2, 3, S)) < 0.5
    free = ~keep.any(-2)                                   # keys no query row may use
    add = np.where(keep, 0.0, -np.inf).astype(dtype)
    for mask in (keep, add):
        want = sdpa(q, k, v, mask, return_lse=True)
        vp = v.copy()
        vp[np.broadcast_to(free[..., None], vp.shape)] = np.nan
        vp[0, 0, np.flatnonzero(free[0, 0])[::2]] = np.inf
        got = sdpa(q, k, vp, mask, return_lse=True)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("path", ["fused", "decode"])
def test_huge_finite_values_do_not_overflow(variant, path):
    """Online softmax accumulates unnormalised weights; with values near float32's maximum
    that sum overflows, and the rows are redone by the two-pass path, which normalises first."""
    rng = np.random.default_rng(13)
    L, S = (70, 600) if path == "fused" else (2, 1500)
    q, k, v = _qkv(rng, 1, 1, L, S, 8, dtype=np.float32)
    q *= 0.01                                      # nearly uniform weights
    v[:] = 3.0e38
    v[..., 1::2, :] = 2.0e38
    out = sdpa(q, k, v)
    assert np.all(np.isfinite(out))
    ref, _ = numpy_sdpa(q, k, v)
    np.testing.assert_allclose(out, ref, rtol=1e-5)


@pytest.mark.parametrize("path", ["fused", "decode"])
def test_nonfinite_rows_redo_leaves_other_rows_bit_identical(variant, path):
    rng = np.random.default_rng(14)
    L, S = (300, 700) if path == "fused" else (4, 2000)
    q, k, v = _qkv(rng, 1, 2, L, S, 16, dtype=np.float32)
    clean = sdpa(q, k, v, is_causal=True, causal_alignment="bottom_right")
    q2 = q.copy()
    q2[0, 1, L // 2, 0] = np.inf                   # +inf score (or NaN): that row is NaN
    got = sdpa(q2, k, v, is_causal=True, causal_alignment="bottom_right")
    assert np.all(np.isnan(got[0, 1, L // 2]))
    mask = np.ones(got.shape[:-1], dtype=bool)
    mask[0, 1, L // 2] = False
    np.testing.assert_array_equal(got[mask], clean[mask])


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("S", [300, 512])
def test_fused_shortened_exp_matches_general_path(variant, dtype, S):
    # A key block with no masked score takes the shortened exp (exp_nonpos); one with a masked
    # (-inf) key too, with the masked lanes zeroed; one with a finite score far below the
    # others (beyond EXP_NORMAL) takes the general exp. An extra key that the mask removes, or
    # whose weight underflows, adds exact zeros, so the results must be the same bits
    # whichever exp ran.
    rng = np.random.default_rng(41)
    q, k, v = _qkv(rng, 1, 2, 70, S, 32, dtype=dtype)
    q *= 2
    base, base_lse = sdpa(q, k, v, return_lse=True)
    k2 = np.concatenate([k, rng.standard_normal((1, 2, 1, 32)).astype(dtype)], axis=2)
    v2 = np.concatenate([v, rng.standard_normal((1, 2, 1, 32)).astype(dtype)], axis=2)
    keep = np.ones((70, S + 1), bool)
    keep[:, -1] = False
    got, lse = sdpa(q, k2, v2, keep, return_lse=True)
    np.testing.assert_array_equal(got, base)
    np.testing.assert_array_equal(lse, base_lse)
    k3 = np.concatenate([k2, rng.standard_normal((1, 2, 1, 32)).astype(dtype)], axis=2)
    v3 = np.concatenate([v2, rng.standard_normal((1, 2, 1, 32)).astype(dtype)], axis=2)
    add = np.zeros((70, S + 2), dtype)
    add[:, -2] = -np.inf
    add[:, -1] = -2000.0                       # exp underflows to exactly 0 in both dtypes
    got, lse = sdpa(q, k3, v3, add, return_lse=True)
    np.testing.assert_array_equal(got, base)
    np.testing.assert_array_equal(lse, base_lse)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_fused_masked_block_keeps_nan_scores(variant, dtype):
    # A key block whose only out-of-range scores are masked (-inf) takes the shortened exp
    # with those lanes zeroed; a NaN score in the same block must still make its row NaN (a
    # draft zeroed every lane that was not > -inf, NaN included, and returned finite rows).
    rng = np.random.default_rng(43)
    q, k, v = _qkv(rng, 1, 1, 40, 300, 16, dtype=dtype)
    k[0, 0, 7, :] = np.nan                     # key 7 scores NaN for every query
    keep = np.ones((40, 300), bool)
    keep[:, 3] = False
    keep[:20, 250] = False
    add = np.where(keep, 0.0, -np.inf).astype(dtype)
    for mask in (keep, add):
        assert np.isnan(sdpa(q, k, v, mask)).all()
    keep[:, 7] = False                         # masked, the NaN key is never weighed
    out = sdpa(q, k, v, keep)
    ref, _ = numpy_sdpa(q, np.nan_to_num(k), v, keep)
    assert_close(out, ref, dtype, k=300)


@pytest.mark.parametrize("shape", [(1, 3, 2, 5000, 32), (2, 2, 300, 800, 16), (1, 1, 520, 520, 8)])
@pytest.mark.parametrize("causal", [False, True])
def test_paths_bit_identical_for_any_thread_count(variant, shape, causal):
    B, H, L, S, E = shape
    rng = np.random.default_rng(15)
    q, k, v = _qkv(rng, B, H, L, S, E, dtype=np.float32)
    keep = rng.random((B, 1, 1, S)) < 0.9
    ref = sdpa(q, k, v, keep, is_causal=causal, n_threads=1)
    for n in (2, 3, -1):
        np.testing.assert_array_equal(sdpa(q, k, v, keep, is_causal=causal, n_threads=n), ref)
    # and a batch entry computed on its own
    np.testing.assert_array_equal(sdpa(q[-1:], k[-1:], v[-1:], keep[-1:], is_causal=causal), ref[-1:])
