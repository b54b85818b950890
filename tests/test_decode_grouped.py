"""Grouped decode (issue 39): the query heads that share a K/V head (``enable_gqa=True``, or
K/V broadcast over heads) run as the rows of one decode task, for L = 1-16 query rows per
head, with the key range split into fixed chunks merged in a fixed order.

Every case is compared with ``cyattn.oracle`` (pure Python, one call per batch entry; inputs on
the dyadic grid of conftest, exact in every dtype, so one oracle result serves all of them),
for group sizes 1, 2, 3 (a group and a group count that do not divide 2 threads), 4 and 8,
float32, float64, float16 and bfloat16 K/V, every variant option (bool and float masks,
broadcast; key_lengths with NaN past them; query_lengths; windows; softcap; sinks; ALiBi;
both causal alignments; lse), on every compiled kernel variant, at 1, 2 and 3 threads with
bit-identical results. Half-precision calls must give the float32 call's bits, rounded once.
"""
import math

import numpy as np
import pytest
from conftest import (
    BFLOAT16_TOLERANCE, add_decode_entry_options, assert_close, decode_option_kwargs,
    grid_values, oracle_sdpa_variants,
)

import cyattn

DECODE_MAX_L = 16          # the kernels' DECODE_MAX_L
DECODE_MIN_WORK = 1024     # decode when batch * S * (E + Ev) >= L * this (and, for L > 4,
#                            S >= 16 L)


def _dtypes():
    out = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)]
    try:
        import ml_dtypes
    except ImportError:
        return out
    return out + [np.dtype(ml_dtypes.bfloat16)]


DTYPES = _dtypes()

# (B, Hkv, g, L, S): S past the grouped path's smallest chunk (128) so that calls have
# several chunks; (1, 1, 3, ...): one group of 3 heads, (1, 3, 2, ...): three groups
CASES = [(1, 2, 1, 5, 300), (1, 4, 1, 16, 300), (2, 2, 2, 1, 300), (1, 2, 2, 3, 300),
         (1, 2, 4, 1, 300), (1, 2, 4, 8, 300), (2, 1, 4, 16, 260), (1, 1, 8, 1, 300),
         (1, 2, 8, 4, 300), (1, 1, 8, 16, 260), (1, 1, 3, 2, 700), (1, 3, 2, 7, 300)]
E, EV = 8, 12

OPTIONS = {
    "plain": {},
    "bool-mask": {"mask": "bool"},
    "float-mask": {"mask": "float"},
    "causal-br": {"is_causal": True, "causal_alignment": "bottom_right"},
    "causal-tl-window": {"is_causal": True, "window": (100, 0)},
    "window-br": {"causal_alignment": "bottom_right", "window": (90, 3)},
    "key-lengths-nan": {"key_lengths": "entry", "is_causal": True,
                        "causal_alignment": "bottom_right"},
    "query-lengths": {"query_lengths": "batch", "mask": "bool"},
    "softcap-alibi": {"softcap": 2.5, "alibi_slopes": "head", "is_causal": True,
                      "causal_alignment": "bottom_right"},
    "sinks": {"sinks": "head", "mask": "bool-rows"},
}


def _case(B, Hkv, g, L, S, option, seed=0):
    """Inputs (float64 on the grid) and keyword arguments of one call."""
    rng = np.random.default_rng([seed, B, Hkv, g, L, S, len(option)])
    Hq = Hkv * g
    q = grid_values(rng, (B, Hq, L, E), step=1.0 / 64)   # exact in bfloat16 too
    k = grid_values(rng, (B, Hkv, S, E), step=1.0 / 64)
    v = grid_values(rng, (B, Hkv, S, EV), step=1.0 / 64)
    spec = OPTIONS[option]
    kw = decode_option_kwargs(spec)
    mask = spec.get("mask")
    if mask == "bool":              # per query head, broadcast over the batch
        kw["attn_mask"] = rng.random((Hq, L, S)) < 0.8
    elif mask == "bool-rows":       # whole rows masked for some heads (output 0, lse = sink)
        m = rng.random((B, Hq, 1, S)) < 0.7
        m[:, ::3] = False
        kw["attn_mask"] = m
    elif mask == "float":           # one row pattern broadcast over batch and heads
        m = grid_values(rng, (L, S))
        m[rng.random((L, S)) < 0.2] = -np.inf
        kw["attn_mask"] = m
    add_decode_entry_options(rng, spec, kw, B, Hq, L, S)
    return q, k, v, kw


_ORACLE = {}


def _oracle(case, option):
    key = (case, option)
    if key not in _ORACLE:
        q, k, v, kw = _case(*case, option)
        kw = dict(kw)
        mask = kw.pop("attn_mask", None)
        kw.pop("return_lse")
        _ORACLE[key] = oracle_sdpa_variants(q, k, v, mask, **kw)
    return _ORACLE[key]


def _takes_decode(B, Hkv, g, L, S):
    return (L <= DECODE_MAX_L and (L <= 4 or S >= 16 * L)
            and B * Hkv * g * S * (E + EV) >= L * DECODE_MIN_WORK)


def _call(q, k, v, kw, dtype, n_threads):
    q, k, v = (a.astype(dtype) for a in (q, k, v))
    kw = dict(kw)
    if kw.get("attn_mask") is not None and kw["attn_mask"].dtype != np.bool_:
        kw["attn_mask"] = kw["attn_mask"].astype(np.float64 if dtype == np.float64
                                                 else np.float32)
    return cyattn.scaled_dot_product_attention(q, k, v, n_threads=n_threads, **kw)


def _check_close(got, want, dtype, S, msg):
    k = S + E
    if dtype.name == "bfloat16":
        rtol, atol = BFLOAT16_TOLERANCE["rtol"], BFLOAT16_TOLERANCE["atol"] * math.sqrt(k)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=rtol, atol=atol,
                                       equal_nan=True, err_msg=msg)
    else:
        assert_close(got[0], want[0], dtype, k, err_msg=f"out {msg}")
        assert_close(got[1], want[1], dtype, k, err_msg=f"lse {msg}")


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-Hkv{}-g{}-L{}-S{}".format(*c))
def test_grouped_decode_matches_oracle(variant, dtype, case):
    assert _takes_decode(*case)
    S = case[-1]
    for option in OPTIONS:
        q, k, v, kw = _case(*case, option)
        if option == "key-lengths-nan":
            # NaN keys and values past the longest length of each group's heads: no head
            # may see them, so none may read them
            B, Hkv, g = case[:3]
            longest = kw["key_lengths"].reshape(B, Hkv, g).max(axis=-1)
            for b, h in np.ndindex(B, Hkv):
                k[b, h, longest[b, h]:] = np.nan
                v[b, h, longest[b, h]:] = np.nan
        want = _oracle(case, option)
        results = [_call(q, k, v, kw, dtype, n) for n in (1, 2, 3)]
        for got in results[1:]:
            assert np.array_equal(_bits(got[0]), _bits(results[0][0])), option
            assert np.array_equal(_bits(got[1]), _bits(results[0][1])), option
        _check_close(results[0], want, dtype, S, f"{option} {case}")
        if dtype.itemsize == 2:      # the exact path: the float32 call's bits, rounded once
            ref = _call(q, k, v, kw, np.dtype(np.float32), 2)
            assert np.array_equal(_bits(results[0][0]), _bits(ref[0].astype(dtype))), option
            assert np.array_equal(_bits(results[0][1]), _bits(ref[1].astype(dtype))), option


@pytest.mark.parametrize("L", range(1, 17))
@pytest.mark.parametrize("g", [1, 2, 4, 8])
def test_every_row_count_and_group(L, g):
    """L = 1..16 rows per head for each group size, bottom-right causal with lengths, float32,
    against the oracle and across 1, 2 and 3 threads."""
    B, Hkv, S = 1, 2, 420
    case = (B, Hkv, g, L, S)
    if not _takes_decode(*case):
        pytest.skip("too small for the decode path")
    q, k, v, kw = _case(*case, "causal-br", seed=L)
    kw["key_lengths"] = np.repeat(np.array([S - 7, S - 300]), g)[None]   # per K/V head
    mask = kw.pop("attn_mask", None)
    want = oracle_sdpa_variants(q, k, v, mask, **{n: a for n, a in kw.items()
                                                  if n != "return_lse"})
    results = [_call(q, k, v, kw, np.dtype(np.float32), n) for n in (1, 2, 3)]
    for got in results[1:]:
        assert np.array_equal(_bits(got[0]), _bits(results[0][0]))
        assert np.array_equal(_bits(got[1]), _bits(results[0][1]))
    _check_close(results[0], want, np.dtype(np.float32), S, f"L={L} g={g}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_group_equals_its_heads_one_by_one(variant, dtype):
    """Grouping changes no bit: a GQA call equals, head by head, calls with one query head per
    K/V head (with 32 groups x 8 chunks of 512 keys the grouped call keeps the 512-key chunks
    of the per-head calls)."""
    rng = np.random.default_rng(5)
    B, Hkv, g, L, S = 4, 8, 4, 2, 4096
    q = rng.standard_normal((B, Hkv * g, L, 32)).astype(dtype)
    k = rng.standard_normal((B, Hkv, S, 32)).astype(dtype)
    v = rng.standard_normal((B, Hkv, S, 24)).astype(dtype)
    got = cyattn.scaled_dot_product_attention(q, k, v, enable_gqa=True, n_threads=2)
    for h in range(g):
        one = cyattn.scaled_dot_product_attention(np.ascontiguousarray(q[:, h::g]), k, v,
                                                  n_threads=2)
        assert np.array_equal(_bits(got[:, h::g]), _bits(one))


def test_broadcast_kv_is_grouped():
    """K and V broadcast over every head (zero strides) decode as one group, as the oracle."""
    rng = np.random.default_rng(6)
    q = grid_values(rng, (2, 5, 3, E), step=1.0 / 64)
    k = grid_values(rng, (1, 1, 400, E), step=1.0 / 64)
    v = grid_values(rng, (1, 1, 400, EV), step=1.0 / 64)
    want = oracle_sdpa_variants(q, k, v, None, is_causal=True, causal_alignment="bottom_right")
    for n in (1, 2, 3):
        got = cyattn.scaled_dot_product_attention(
            q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), is_causal=True,
            causal_alignment="bottom_right", return_lse=True, n_threads=n)
        _check_close(got, want, np.dtype(np.float32), 400, f"n={n}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("L", [1, 8])
def test_decode_makes_no_copy_of_k_or_v(dtype, L):
    """A GQA decode step over a 32 MiB (float32) cache allocates O(output + scratch): no copy
    of K or V (NumPy reports its buffers to tracemalloc)."""
    import tracemalloc
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 16, L, 128)).astype(dtype)
    k = rng.standard_normal((2, 4, 4096, 128)).astype(np.float32).astype(dtype)
    v = rng.standard_normal((2, 4, 4096, 128)).astype(np.float32).astype(dtype)

    def call():
        return cyattn.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True,
                                                   causal_alignment="bottom_right")
    call()
    tracemalloc.start()
    try:
        call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < k.nbytes // 8, peak


@pytest.mark.parametrize("dtype", [np.dtype(np.float32)] + DTYPES[3:], ids=str)
@pytest.mark.parametrize("E_,Ev", [(128, 128), (40, 72), (96, 24), (33, 17), (160, 144)])
def test_head_sizes_and_row_blocks(variant, dtype, E_, Ev):
    """Head sizes on and off the vector widths (the key pass's 32-element steps and tail, the
    value pass's 128/64/32/16-element sweeps and tail), row counts that leave odd rows (two
    rows per key step, three per value step), against the float64 NumPy reference; 16-bit
    K/V give the float32 call's bits."""
    from conftest import numpy_sdpa
    rng = np.random.default_rng(E_ * 1000 + Ev)
    for g, L in ((3, 1), (8, 1), (3, 5), (2, 16), (5, 3)):
        q = rng.standard_normal((2, 2 * g, L, E_)).astype(dtype)
        k = rng.standard_normal((2, 2, 1100, E_)).astype(dtype)
        v = rng.standard_normal((2, 2, 1100, Ev)).astype(dtype)
        kw = dict(enable_gqa=True, is_causal=True, causal_alignment="bottom_right",
                  return_lse=True)
        got = [cyattn.scaled_dot_product_attention(q, k, v, n_threads=n, **kw) for n in (1, 3)]
        assert np.array_equal(_bits(got[0][0]), _bits(got[1][0]))
        if dtype.itemsize == 2:
            ref = cyattn.scaled_dot_product_attention(
                *(a.astype(np.float32) for a in (q, k, v)), **kw)
            assert np.array_equal(_bits(got[0][0]), _bits(ref[0].astype(dtype)))
            continue
        want = numpy_sdpa(q, k, v, is_causal=True, causal_alignment="bottom_right",
                          enable_gqa=True)
        assert_close(got[0][0], want[0], dtype, 1100 + E_, err_msg=f"g={g} L={L}")
        assert_close(got[0][1], want[1], dtype, 1100 + E_, err_msg=f"g={g} L={L}")
