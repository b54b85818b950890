"""cyattn.attention_weights: against the oracle, against scaled_dot_product_attention (weights @
value on each of its paths), the masking rules, ``out=``, invariances and the errors.

The oracle has no weights function of its own; its attention with ``value`` the S x S identity
returns, row by row, exactly the weights it multiplies ``value`` by (``out_i = fsum(w_ij *
I_jd)`` over the ``j`` with ``w_ij != 0`` is ``w_id``), so it is the reference here.
"""
import re

import numpy as np
import pytest
from conftest import (LAYOUTS, assert_close, call_checked, grid_values, layout_variants,
                      numpy_sdpa_variants,
                      oracle_sdpa, with_layout)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import cyattn

aw = cyattn.attention_weights
sdpa = cyattn.scaled_dot_product_attention
FN = "cyattn.attention_weights"
ALIGNMENTS = ("top_left", "bottom_right")


def oracle_weights(q, k, mask=None, is_causal=False, scale=None, causal_alignment="top_left",
                   enable_gqa=False):
    """The oracle's weights (float64): its attention over an identity ``value``."""
    S = k.shape[-2]
    eye = np.broadcast_to(np.eye(S), k.shape[:-2] + (S, S))
    out, _ = oracle_sdpa(q, k, eye, mask, is_causal, scale, causal_alignment, enable_gqa)
    return out


def make_mask(rng, kind, shape):
    if kind is None:
        return None
    if kind == "bool":
        return rng.random(shape) < 0.7
    if kind == "float":
        m = grid_values(rng, shape, -2.0, 2.0)
        m[rng.random(shape) < 0.2] = -np.inf
        return m
    raise AssertionError(kind)


def sdpa_reference(w, v, enable_gqa):
    """``w @ v`` in float64, GQA value heads repeated."""
    if enable_gqa:
        v = np.repeat(v, w.shape[-3] // v.shape[-3], axis=-3)
    return np.asarray(w, np.float64) @ np.asarray(v, np.float64)


# ------------------------------------------------------------------------------------------
# against the oracle
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "top_left"),
                                          (True, "bottom_right")])
@pytest.mark.parametrize("L,S", [(1, 1), (3, 7), (7, 3), (9, 17), (17, 9)])
def test_matches_oracle(variant, dtype, mask_kind, causal, align, L, S):
    rng = np.random.default_rng(L * 100 + S)
    E = 5
    q = grid_values(rng, (2, L, E)).astype(dtype)
    k = grid_values(rng, (2, S, E)).astype(dtype)
    mask = make_mask(rng, mask_kind, (2, L, S))
    got = call_checked(aw, q, k, mask, causal, causal_alignment=align)
    assert got.dtype == dtype and got.shape == (2, L, S)
    ref = oracle_weights(q, k, mask, causal, causal_alignment=align)
    assert_close(got, ref, dtype, k=E + S)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("align", ALIGNMENTS)
def test_matches_oracle_gqa_broadcast_scale(variant, dtype, align):
    rng = np.random.default_rng(3)
    q = grid_values(rng, (2, 6, 5, 4)).astype(dtype)           # 6 query heads
    k = grid_values(rng, (1, 2, 8, 4)).astype(dtype)           # 2 key heads, batch broadcast
    mask = rng.random((2, 1, 5, 8)) < 0.8                       # broadcast over heads
    got = aw(q, k, mask, True, 0.75, causal_alignment=align, enable_gqa=True)
    assert got.shape == (2, 6, 5, 8)
    ref = oracle_weights(q, np.broadcast_to(k, (2, 2, 8, 4)), mask, True, 0.75,
                         causal_alignment=align, enable_gqa=True)
    assert_close(got, ref, dtype, k=4 + 8)
    # query head h uses key head h // 3: heads 0-2 equal the non-GQA call on key head 0
    plain = aw(q[:, :3], np.broadcast_to(k[:, :1], (2, 1, 8, 4)), mask, True, 0.75,
               causal_alignment=align)
    np.testing.assert_array_equal(got[:, :3], plain)


def test_mixed_dtypes_promote(variant):
    rng = np.random.default_rng(5)
    q = grid_values(rng, (3, 4)).astype(np.float32)
    k = grid_values(rng, (6, 4))
    got = aw(q, k)
    assert got.dtype == np.float64
    assert_close(got, oracle_weights(q, k), np.float64, k=10)


@st.composite
def weights_problems(draw):
    """(query, key, mask, kwargs): broadcast batch dims, GQA, masks broadcast from any
    shape, any layouts and dtypes, causal in both alignments."""
    dtype = draw(st.sampled_from([np.float16, np.float32, np.float64]))
    L, S, E = (draw(st.integers(0, 9)) for _ in range(3))
    gqa = draw(st.booleans())
    if gqa:
        hk = draw(st.integers(1, 3))
        hq = hk * draw(st.integers(1, 3))
        qb, kb = (draw(st.sampled_from([(), (2,)])) + (hq,),
                  draw(st.sampled_from([(), (1,), (2,)])) + (hk,))
    else:
        qb = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
        kb = tuple(draw(st.sampled_from([d, 1])) for d in qb)[draw(st.integers(0, len(qb))):]
    batch = np.broadcast_shapes(qb[:-1], kb[:-1]) + qb[-1:] if gqa else \
        np.broadcast_shapes(qb, kb)
    elements = st.floats(-4, 4, width=np.dtype(dtype).itemsize * 8)
    q = draw(hnp.arrays(dtype, qb + (L, E), elements=elements))
    k = draw(hnp.arrays(dtype, kb + (S, E), elements=elements))
    q = with_layout(q, draw(st.sampled_from(LAYOUTS)))
    k = with_layout(k, draw(st.sampled_from(LAYOUTS)))
    target = batch + (L, S)
    kind = draw(st.sampled_from(["none", "bool", "float"]))
    mask = None
    if kind != "none":
        dims = [draw(st.sampled_from([d, 1])) for d in target]
        shape = tuple(dims[draw(st.integers(0, len(dims) - 1)):])
        if kind == "bool":
            mask = draw(hnp.arrays(np.bool_, shape))
        else:
            mask = draw(hnp.arrays(np.float64, shape, elements=st.one_of(
                st.floats(-4, 4), st.just(-np.inf))))
    kwargs = {"is_causal": draw(st.booleans()),
              "causal_alignment": draw(st.sampled_from(ALIGNMENTS)), "enable_gqa": gqa}
    if draw(st.booleans()):
        kwargs["scale"] = draw(st.floats(0, 2))
    return q, k, mask, kwargs


@settings(deadline=None, max_examples=80, derandomize=True, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(weights_problems())
def test_property_matches_oracle(problem):
    q, k, mask, kwargs = problem
    got = call_checked(aw, q, k, mask, **kwargs)
    ref = oracle_weights(q, np.broadcast_to(k, k.shape), mask, kwargs["is_causal"],
                         kwargs.get("scale"), kwargs["causal_alignment"], kwargs["enable_gqa"])
    assert got.dtype == np.result_type(q, k)
    assert_close(got, ref, got.dtype, k=q.shape[-1] + k.shape[-2])


# ------------------------------------------------------------------------------------------
# weights @ value == scaled_dot_product_attention, on each of its paths
# ------------------------------------------------------------------------------------------

# (B, H, Hk, L, S, E, Ev, query layout): the tiny problem (few rows, fused path), decode
# (L <= 4 unit-stride rows, keys in chunks of 512), the fused path over several key blocks of
# 256 and query groups, and a product past matmul's unpacked small path (96^3).
PATHS = {
    "tiny": (1, 2, 2, 2, 5, 8, 8, "C"),
    "decode": (1, 4, 2, 3, 1100, 32, 16, "C"),
    "decode_one_row": (2, 2, 1, 1, 700, 16, 16, "C"),
    "fused_small": (1, 2, 2, 9, 33, 16, 8, "C"),
    "fused_blocks": (1, 2, 1, 130, 600, 24, 40, "C"),
    "fused_fortran_query": (1, 1, 1, 3, 300, 8, 8, "F"),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "top_left"),
                                          (True, "bottom_right")])
@pytest.mark.parametrize("path", list(PATHS))
def test_times_value_equals_sdpa(variant, dtype, mask_kind, causal, align, path):
    B, H, Hk, L, S, E, Ev, layout = PATHS[path]
    rng = np.random.default_rng(B + H + L + S)
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, Hk, S, E)).astype(dtype)
    v = rng.standard_normal((B, Hk, S, Ev)).astype(dtype)
    if layout == "F":
        q = np.asfortranarray(q)
    gqa = H != Hk
    mask = make_mask(rng, mask_kind, (B, 1, L, S))
    w = aw(q, k, mask, causal, causal_alignment=align, enable_gqa=gqa)
    out = sdpa(q, k, v, mask, causal, causal_alignment=align, enable_gqa=gqa)
    assert_close(sdpa_reference(w, v, gqa), out, dtype, k=E + S)
    assert not np.isnan(w).any()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_times_value_equals_sdpa_fully_masked_rows(variant, dtype):
    rng = np.random.default_rng(11)
    L, S = 6, 4                         # bottom_right: rows 0 and 1 see no key
    q = rng.standard_normal((2, L, 8)).astype(dtype)
    k = rng.standard_normal((2, S, 8)).astype(dtype)
    v = rng.standard_normal((2, S, 3)).astype(dtype)
    mask = np.ones((2, L, S), bool)
    mask[1, 4] = False                  # and a row removed by the bool mask
    w = aw(q, k, mask, True, causal_alignment="bottom_right")
    out = sdpa(q, k, v, mask, True, causal_alignment="bottom_right")
    assert_close(sdpa_reference(w, v, False), out, dtype, k=8 + S)
    np.testing.assert_array_equal(w[:, :2], 0)
    np.testing.assert_array_equal(w[1, 4], 0)


# ------------------------------------------------------------------------------------------
# the masking rules
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("align", ALIGNMENTS)
def test_masked_exactly_zero_rows_sum_to_one(variant, dtype, align):
    rng = np.random.default_rng(7)
    L, S = 5, 9
    q = rng.standard_normal((3, L, 4)).astype(dtype)
    k = rng.standard_normal((3, S, 4)).astype(dtype)
    mask = rng.random((3, L, S)) < 0.6
    mask[0, 2] = False                                          # fully masked row
    w = aw(q, k, mask, True, causal_alignment=align)
    off = S - L if align == "bottom_right" else 0
    causal = np.arange(S)[None, :] <= np.arange(L)[:, None] + off
    keep = mask & causal
    assert (w[~keep] == 0).all()
    assert (w[keep] > 0).all()
    sums = w.astype(np.float64).sum(-1)
    alive = keep.any(-1)
    np.testing.assert_array_equal(sums[~alive], 0)
    assert_close(sums[alive], np.ones(alive.sum()), dtype, k=S)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_mask_minus_inf_and_finite_shift(variant, dtype):
    q = np.zeros((2, 3), dtype)
    k = np.zeros((3, 3), dtype)
    mask = np.array([[0.0, -np.inf, -1e9], [-np.inf, -np.inf, -np.inf]])
    w = aw(q, k, mask)
    # -inf removes; -1e9 only shifts (its weight underflows to 0 here, but the row is not
    # fully masked); an all -inf row is fully masked
    np.testing.assert_array_equal(w, [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    w = aw(q, k, np.array([[-1e9, -np.inf, -1e9]]))
    np.testing.assert_array_equal(w, [[0.5, 0.0, 0.5]] * 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_removed_keys_never_read(variant, dtype):
    rng = np.random.default_rng(2)
    q = rng.standard_normal((4, 6)).astype(dtype)
    k = rng.standard_normal((5, 6)).astype(dtype)
    k[1] = np.nan
    k[4] = np.inf                                   # causal removes key 4 from rows 0-3
    mask = np.array([True, False, True, True, True])
    w = aw(q, k, mask, True)
    assert np.isfinite(w).all()
    assert (w[:, 1] == 0).all() and (w[:, 4] == 0).all()
    # a +inf float mask on a causally removed position is still removed
    fmask = np.zeros((4, 5))
    fmask[0, 3] = np.inf
    w = aw(q, k[[0, 2, 3, 3, 3]], fmask, True)
    assert np.isfinite(w).all() and w[0, 3] == 0


def test_nan_in_permitted_score_makes_row_nan(variant):
    q = np.ones((2, 2))
    k = np.ones((3, 2))
    k[2, 0] = np.nan
    w = aw(q, k, np.array([[True, True, True], [True, True, False]]))
    assert np.isnan(w[0]).all()
    np.testing.assert_array_equal(w[1], [0.5, 0.5, 0.0])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_empty_dims(variant, dtype):
    assert aw(np.zeros((0, 3), dtype), np.zeros((4, 3), dtype)).shape == (0, 4)
    assert aw(np.zeros((2, 3), dtype), np.zeros((0, 3), dtype)).shape == (2, 0)
    assert aw(np.zeros((0, 2, 3), dtype), np.zeros((2, 3), dtype)).shape == (0, 2, 2)
    # E = 0: scores 0 whatever the scale, so the permitted keys share the weight equally
    w = aw(np.zeros((2, 0), dtype), np.zeros((4, 0), dtype), is_causal=True, scale=np.inf)
    assert w.dtype == dtype
    np.testing.assert_array_equal(w, [[1, 0, 0, 0], [0.5, 0.5, 0, 0]])


def test_scale_zero_honoured(variant):
    rng = np.random.default_rng(4)
    w = aw(rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), scale=0.0)
    np.testing.assert_array_equal(w, np.full((3, 5), 0.2))


# ------------------------------------------------------------------------------------------
# out=, layouts, threads
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("out_layout", ["c", "fortran", "strided"])
def test_out(variant, dtype, out_layout):
    rng = np.random.default_rng(8)
    q = rng.standard_normal((2, 3, 5, 4)).astype(dtype)
    k = rng.standard_normal((2, 3, 7, 4)).astype(dtype)
    mask = rng.random((5, 7)) < 0.7
    expected = aw(q, k, mask, True)
    if out_layout == "c":
        out = np.full((2, 3, 5, 7), np.nan, dtype)
    elif out_layout == "fortran":
        out = np.asfortranarray(np.full((2, 3, 5, 7), np.nan, dtype))
    else:
        out = np.full((2, 3, 10, 14), np.nan, dtype)[:, :, ::2, ::2]
    res = aw(q, k, mask, True, out=out)
    assert res is out
    np.testing.assert_array_equal(out, expected)


def test_out_overlapping_input(variant):
    rng = np.random.default_rng(9)
    q = rng.standard_normal((4, 4))
    k = rng.standard_normal((4, 4))
    expected = aw(q, k, is_causal=True)
    res = aw(q, k, is_causal=True, out=q)
    assert res is q
    np.testing.assert_array_equal(q, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layouts_give_the_same_weights(variant, dtype):
    rng = np.random.default_rng(10)
    q = rng.standard_normal((2, 6, 8)).astype(dtype)
    k = rng.standard_normal((2, 9, 8)).astype(dtype)
    expected = aw(q, k, is_causal=True)
    for name, ql in layout_variants(q):
        for kname, kl in layout_variants(k):
            assert_close(aw(ql, kl, is_causal=True), expected, dtype, k=17,
                         err_msg=f"{name}/{kname}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_threads_bit_identical(variant, dtype):
    rng = np.random.default_rng(12)
    q = rng.standard_normal((2, 4, 150, 32)).astype(dtype)
    k = rng.standard_normal((2, 4, 300, 32)).astype(dtype)
    one = aw(q, k, is_causal=True, n_threads=1)
    np.testing.assert_array_equal(aw(q, k, is_causal=True, n_threads=2), one)
    np.testing.assert_array_equal(aw(q, k, is_causal=True, n_threads=-1), one)


# ------------------------------------------------------------------------------------------
# errors: they name the argument, and leave out untouched
# ------------------------------------------------------------------------------------------

def _raises(exc, message, *args, **kwargs):
    out = kwargs.get("out")
    before = None if not isinstance(out, np.ndarray) else out.copy()
    with pytest.raises(exc, match=re.escape(f"{FN}: {message}")):
        aw(*args, **kwargs)
    if before is not None:
        np.testing.assert_array_equal(out, before)


Q, K = np.ones((2, 3, 4)), np.ones((2, 5, 4))


@pytest.mark.parametrize("args,kwargs,exc,message", [
    ((np.ones((3, 4), int), K), {}, TypeError, "query has dtype int64; expected float16"),
    ((Q, np.ones((5, 4), bool)), {}, TypeError, "key has dtype bool; expected float16"),
    ((np.ones(4), K), {}, ValueError, "query must have at least 2 dimensions"),
    ((Q, np.ones(4)), {}, ValueError, "key must have at least 2 dimensions"),
    ((Q, np.ones((5, 3))), {}, ValueError, "query has E=4 (shape (2, 3, 4)) but key has E=3"),
    ((Q, np.ones((3, 5, 4))), {}, ValueError,
     "batch dimensions of query (2,) and key (3,) do not broadcast together"),
    ((np.ones((4, 3, 4)), np.ones((3, 5, 4))), {"enable_gqa": True}, ValueError,
     "with enable_gqa, key must have a number of heads dividing the query's; got query 4, "
     "key 3 heads"),
    ((np.ones((3, 4)), np.ones((5, 4))), {"enable_gqa": True}, ValueError,
     "enable_gqa needs a head dimension (axis -3) on query and key"),
    ((Q, K, np.ones((3, 5), int)), {}, TypeError, "attn_mask has dtype int64; expected bool"),
    ((Q, K, np.ones((4, 5), bool)), {}, ValueError, "attn_mask has shape (4, 5), which does "
                                                    "not broadcast to (2, 3, 5)"),
    ((Q, K, np.ones((3, 3, 5), bool)), {}, ValueError, "attn_mask has shape (3, 3, 5)"),
    ((Q, K), {"is_causal": 1}, TypeError, "is_causal must be a bool, got int"),
    ((Q, K), {"enable_gqa": "yes"}, TypeError, "enable_gqa must be a bool, got str"),
    ((Q, K), {"scale": "2"}, TypeError, "scale must be a real number, got str"),
    ((Q, K), {"causal_alignment": "bottom"}, ValueError,
     "causal_alignment must be 'top_left' or 'bottom_right', got 'bottom'"),
    ((Q, K), {"n_threads": 0}, ValueError, "n_threads must be nonzero"),
    ((Q, K), {"n_threads": 1.5}, TypeError, "n_threads must be an int or None, got float"),
    ((Q, K), {"out": np.zeros((2, 3, 4))}, ValueError,
     "out has shape (2, 3, 4); expected (2, 3, 5)"),
    ((Q, K), {"out": np.zeros((2, 3, 5), np.float32)}, ValueError,
     "out has dtype float32; expected float64"),
    ((Q, K), {"out": [[0.0]]}, ValueError, "out must be a numpy.ndarray, got list"),
], ids=lambda x: x if isinstance(x, str) and len(x) < 30 else None)
def test_errors_name_the_argument(args, kwargs, exc, message):
    _raises(exc, message, *args, **kwargs)


def test_error_read_only_out_untouched():
    out = np.full((2, 3, 5), 7.0)
    out.flags.writeable = False
    _raises(ValueError, "out is read-only", Q, K, out=out)


def test_failed_call_leaves_out_untouched():
    out = np.full((2, 3, 5), 7.0)
    out[0, 0, 0] = np.nan
    _raises(ValueError, "attn_mask has shape", Q, K, np.ones((4, 5), bool), out=out)
    _raises(TypeError, "scale must be a real number", Q, K, scale="x", out=out)


def test_exported():
    assert "attention_weights" in cyattn.__all__
    assert cyattn.attention_weights is cyattn.weights.attention_weights


# ------------------------------------------------------------------------------------------
# attention variants (window, softcap, sinks, ALiBi, lengths)
# ------------------------------------------------------------------------------------------

VARIANT_CASES = {
    "window": dict(window=(5, 1)),
    "window_left_only": dict(window=(3, None)),
    "softcap": dict(softcap=1.5),
    "sinks": dict(sinks=np.array([0.5, -1.0, 3.0, -np.inf])),
    "alibi": dict(alibi_slopes=np.array([0.25, 0.125, 0.0625, 0.5])),
    "key_lengths": dict(key_lengths=np.array([[0], [7]])),
    "query_lengths": dict(query_lengths=np.array([[1], [0]])),
    "all": dict(window=(9, 0), softcap=2.0, sinks=np.array([0.1, 2.0, -3.0, 0.0]),
                alibi_slopes=np.array([0.1, 0.2, 0.3, 0.4]), key_lengths=np.array([[5], [30]]),
                query_lengths=np.array([[3], [9]])),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "top_left"),
                                          (True, "bottom_right"), (False, "bottom_right")])
@pytest.mark.parametrize("shape", [(2, 4, 3, 40, 16), (2, 4, 9, 600, 16)])
@pytest.mark.parametrize("case", list(VARIANT_CASES))
def test_variants_against_numpy_and_sdpa(variant, dtype, causal, align, shape, case):
    """The variants' weights: ``weights @ value`` equals SDPA (same arguments), and the
    weights equal an independent dense NumPy construction (``value`` = identity)."""
    B, H, L, S, E = shape
    kw = VARIANT_CASES[case]
    rng = np.random.default_rng(S + L)
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, H, S, E)).astype(dtype)
    v = rng.standard_normal((B, H, S, E)).astype(dtype)
    w = aw(q, k, None, causal, causal_alignment=align, **kw)
    out = sdpa(q, k, v, None, causal, causal_alignment=align, **kw)
    assert_close(sdpa_reference(w, v, False), out, dtype, k=E + S)
    eye = np.broadcast_to(np.eye(S), (B, H, S, S))
    ref, _ = numpy_sdpa_variants(q, k, eye, None, causal, causal_alignment=align, **kw)
    assert_close(w, ref, dtype, k=E + S)
    assert not np.isnan(w).any()
    one = aw(q, k, None, causal, causal_alignment=align, n_threads=1, **kw)
    assert one.tobytes() == w.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_variants_infinite_sink_takes_all_weight(variant, dtype):
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 3, 5, 8)).astype(dtype)
    k = rng.standard_normal((2, 3, 300, 8)).astype(dtype)
    sinks = np.array([np.inf, -np.inf, 0.0])
    w = aw(q, k, sinks=sinks)
    plain = aw(q, k)
    assert (w[:, 0] == 0).all()
    assert w[:, 1].tobytes() == plain[:, 1].tobytes()        # -inf: no effect
    assert (w[:, 2].sum(-1) < 1).all()


def test_variants_bad_input_names_argument_and_leaves_out():
    q = np.ones((2, 3, 4), np.float32)
    k = np.ones((2, 5, 4), np.float32)
    out = np.full((2, 3, 5), 7.0, np.float32)
    for kwargs, exc, name in (({"window": (-1, 0)}, ValueError, "window"),
                              ({"softcap": 0.0}, ValueError, "softcap"),
                              ({"sinks": np.ones(3)}, ValueError, "sinks"),
                              ({"key_lengths": np.array([1.5])}, TypeError, "key_lengths"),
                              ({"query_lengths": np.array([-1])}, ValueError, "query_lengths"),
                              ({"alibi_slopes": "x"}, TypeError, "alibi_slopes")):
        with pytest.raises(exc, match=name):
            aw(q, k, out=out, **kwargs)
        assert (out == 7.0).all()
