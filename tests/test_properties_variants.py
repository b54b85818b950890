"""Property-based tests (hypothesis) of the attention variants of issue 24: ``window``,
``softcap``, ``sinks``, ``alibi_slopes``, ``key_lengths`` and ``query_lengths`` drawn together
with shapes, GQA, broadcasting, masks, causal alignment, scale and memory layouts; the compiled
``scaled_dot_product_attention`` against ``cyattn.oracle``.

These run once the kernel has the new arguments (skipped before). Examples are derandomized;
see test_properties.py for the suppressed health checks.
"""
import numpy as np
from conftest import LAYOUTS, assert_close, call_checked, with_layout
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from test_properties import masks, value_arrays
from test_variants import needs_variants, oracle_variants

import cyattn

SETTINGS = settings(deadline=None, max_examples=80, derandomize=True, print_blob=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.data_too_large])


def _broadcastable_shape(draw, batch):
    """A shape that broadcasts to ``batch`` (a suffix of it, some dims replaced by 1)."""
    dims = [draw(st.sampled_from([d, 1])) for d in batch]
    return tuple(dims[draw(st.integers(0, len(dims))):])


def _grid(lo, hi, step=1.0 / 16):
    return st.integers(round(lo / step), round(hi / step)).map(lambda n: n * step)


@st.composite
def variant_cases(draw):
    dtype = draw(st.sampled_from([np.float16, np.float32, np.float64]))
    gqa = draw(st.booleans())
    B = draw(st.integers(1, 2))
    if gqa:
        hkv = draw(st.integers(1, 2))
        hq = hkv * draw(st.integers(1, 3))
        q_batch, kv_batch = (B, hq), (draw(st.sampled_from([B, 1])), hkv)
    else:
        hq = draw(st.integers(1, 3))
        q_batch = (B, hq)
        kv_batch = draw(st.sampled_from([(B, hq), (1, hq), (hq,), (B, 1)]))
    batch = (B, hq)
    # small; many query rows (several panels); or a few rows over two key blocks (decode)
    L, S = draw(st.sampled_from([(st.integers(0, 9), st.integers(0, 12)),
                                 (st.integers(60, 66), st.integers(0, 12)),
                                 (st.integers(1, 4), st.integers(257, 262))]).flatmap(
        lambda pair: st.tuples(*pair)))
    E = draw(st.integers(0, 6))
    Ev = draw(st.integers(1, 4))
    q = draw(value_arrays(dtype, q_batch + (L, E), 3.0))
    k = draw(value_arrays(dtype, kv_batch + (S, E), 3.0))
    v = draw(value_arrays(dtype, kv_batch + (S, Ev), 3.0))
    mask = draw(masks(batch + (L, S), dtype))
    kw = {"is_causal": draw(st.booleans()),
          "causal_alignment": draw(st.sampled_from(["top_left", "bottom_right"])),
          "enable_gqa": gqa,
          "scale": draw(st.one_of(st.none(), st.sampled_from([0.25, 1.0, -0.5])))}
    side = st.one_of(st.none(), st.integers(0, S + 2))
    if draw(st.booleans()):
        kw["window"] = (draw(side), draw(side))
    if draw(st.booleans()):
        kw["softcap"] = draw(st.sampled_from([0.5, 2.0, 7.5, 50.0]))
    if draw(st.booleans()):
        kw["sinks"] = draw(hnp.arrays(np.float64, _broadcastable_shape(draw, batch),
                                      elements=st.one_of(_grid(-4.0, 4.0),
                                                         st.sampled_from([-np.inf, np.inf]))))
    if draw(st.booleans()):
        kw["alibi_slopes"] = draw(hnp.arrays(np.float64, _broadcastable_shape(draw, batch),
                                             elements=_grid(0.0, 1.0)))
    for name, n in (("key_lengths", S), ("query_lengths", L)):
        if draw(st.booleans()):
            kw[name] = draw(hnp.arrays(np.int64, _broadcastable_shape(draw, batch),
                                       elements=st.integers(0, n + 2)))
    return {"dtype": dtype, "q": q, "k": k, "v": v, "mask": mask, "kw": kw, "batch": batch,
            "layouts": [draw(st.sampled_from(LAYOUTS)) for _ in range(4)],
            "out": draw(st.sampled_from(["none", "c", "strided"])),
            "threads": draw(st.sampled_from([None, 1, 2]))}


@needs_variants
@SETTINGS
@given(case=variant_cases())
def test_variants_match_oracle(variant, case):
    dtype, q, k, v, mask, kw = (case[n] for n in ("dtype", "q", "k", "v", "mask", "kw"))
    ref_mask = mask
    if mask is not None and mask.dtype != np.bool_:
        ref_mask = mask.astype(np.float32 if dtype == np.float16 else dtype)
    ref_out, ref_lse = oracle_variants(q, k, v, ref_mask, **kw)
    ql, kl, vl = (with_layout(a, name) for a, name in zip((q, k, v), case["layouts"]))
    ml = None if mask is None else with_layout(mask, case["layouts"][3])
    out_shape = case["batch"] + (q.shape[-2], v.shape[-1])
    extra = {}
    if case["out"] == "c":
        extra["out"] = np.full(out_shape, 5.0, dtype)
    elif case["out"] == "strided":
        extra["out"] = np.full(out_shape[:-1] + (2 * out_shape[-1],), 5.0, dtype)[..., ::2]
    out, lse = call_checked(cyattn.scaled_dot_product_attention, ql, kl, vl, ml,
                            return_lse=True, n_threads=case["threads"], **kw, **extra)
    if "out" in extra:
        assert out is extra["out"]
    assert out.shape == out_shape and lse.shape == out_shape[:-1]
    assert out.dtype == dtype and lse.dtype == dtype
    k_len = q.shape[-1] + k.shape[-2] + 1
    assert_close(out, ref_out, dtype, k=k_len)
    assert_close(lse, ref_lse, dtype, k=k_len)


@needs_variants
@SETTINGS
@given(case=variant_cases())
def test_removed_keys_are_never_read(variant, case):
    """Poisoning the keys/values no row may see (past every key length, outside every window)
    changes nothing, bit for bit."""
    q, k, v, mask, kw = (case[n] for n in ("q", "k", "v", "mask", "kw"))
    L, S = q.shape[-2], k.shape[-2]
    if L == 0 or S == 0 or kw["enable_gqa"]:
        return
    batch = case["batch"]
    n_keys = np.clip(np.broadcast_to(kw.get("key_lengths", S), batch), 0, S)
    n_queries = np.clip(np.broadcast_to(kw.get("query_lengths", L), batch), 0, L)
    off = (n_keys - n_queries if kw["causal_alignment"] == "bottom_right"
           else np.zeros(batch, np.int64))
    pos = np.arange(L)[:, None] + off[..., None, None]
    j = np.arange(S)
    keep = np.broadcast_to(j < n_keys[..., None, None], batch + (L, S)).copy()
    if kw["is_causal"]:
        keep &= j <= pos
    left, right = kw.get("window", (None, None))
    if left is not None:
        keep &= j >= pos - left
    if right is not None:
        keep &= j <= pos + right
    used = keep.reshape(-1, L, S).any(axis=(0, 1))
    if used.all():
        return
    clean = cyattn.scaled_dot_product_attention(q, k, v, mask, return_lse=True, **kw)
    kp, vp = k.copy(), v.copy()
    kp[..., ~used, :] = np.nan
    vp[..., ~used, :] = np.inf
    poisoned = cyattn.scaled_dot_product_attention(q, kp, vp, mask, return_lse=True, **kw)
    np.testing.assert_array_equal(poisoned[0], clean[0])
    np.testing.assert_array_equal(poisoned[1], clean[1])


def test_strategy_draws_every_argument():
    """The strategy reaches every variant argument (guards against a silently narrowed draw)."""
    seen = set()

    @settings(max_examples=60, derandomize=True, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=variant_cases())
    def collect(case):
        seen.update(n for n in ("window", "softcap", "sinks", "alibi_slopes", "key_lengths",
                                "query_lengths") if n in case["kw"])

    collect()
    assert seen == {"window", "softcap", "sinks", "alibi_slopes", "key_lengths",
                    "query_lengths"}

