"""Attention variants (issue 24): ``window``, ``softcap``, ``sinks``, ``alibi_slopes``,
``key_lengths`` and ``query_lengths`` of ``scaled_dot_product_attention``.

Three references, each built without the code under test:

* :func:`numpy_variants`: an independent NumPy float64 construction -- a dense bool "keep"
  matrix for the causal rule, the window and the lengths, an explicit ALiBi bias matrix,
  ``np.tanh`` for the softcap, and the sink as an extra key column whose value row is 0;
* :func:`oracle_variants`: ``cyattn.oracle`` (pure Python, exactly rounded sums), one call per
  batch entry;
* ONNX's ``onnx.reference`` Attention operator (opsets 23-25, where onnx is installed), its
  inputs mapped to cyattn's arguments by :func:`onnx_to_cyattn` (the mapping README.md
  documents).

The oracle is checked against the NumPy construction (and the ONNX mapping against both) now;
the tests of the compiled ``cyattn.scaled_dot_product_attention`` (marked ``needs_variants``)
run once the kernel has the new arguments. They cover every path -- tiny problems, decode
(L <= 4 with enough work), fused (several key blocks and query groups) and the redo path of
non-finite rows --, both causal alignments, GQA, broadcasting, strided inputs, ``out=``, thread
counts (bit-identical results) and every kernel variant, in float32 and float64 with the
tolerances of conftest.py.
"""
import inspect
import math
import zlib

import numpy as np
import pytest
from conftest import (
    assert_close,
    grid_values,
    with_layout,
)
from conftest import numpy_sdpa_variants as numpy_variants
from conftest import oracle_sdpa_variants as oracle_variants

import cyattn
from cyattn import oracle

NAN, INF = math.nan, math.inf
ALIGNMENTS = ("top_left", "bottom_right")
VARIANT_ARGS = ("window", "softcap", "sinks", "alibi_slopes", "key_lengths", "query_lengths")

HAS_VARIANTS = "window" in inspect.signature(cyattn.scaled_dot_product_attention).parameters
needs_variants = pytest.mark.skipif(
    not HAS_VARIANTS,
    reason="cyattn.scaled_dot_product_attention has no window/softcap/sinks/alibi_slopes/"
           "key_lengths/query_lengths arguments yet (issue 24 kernel not merged)")


# ------------------------------------------------------------------------------------------
# References
# ------------------------------------------------------------------------------------------

def _seed(*parts):
    """A seed that is the same in every process (str hashes are salted per process)."""
    return zlib.crc32(repr(parts).encode())


def assert_same(got, expected, dtype=np.float64, k=1, err_msg=""):
    """(out, lse) pairs agree within the tolerances of ``dtype`` (NaN and infinities in the
    same places)."""
    assert_close(got[0], expected[0], dtype, k, err_msg=f"out {err_msg}")
    assert_close(got[1], expected[1], dtype, k, err_msg=f"lse {err_msg}")


# ------------------------------------------------------------------------------------------
# Random cases
# ------------------------------------------------------------------------------------------

def random_case(rng, L, S, E, Ev, B=2, Hq=2, Hkv=None, gqa=False, alignment="top_left",
                is_causal=False, mask=None, window=None, softcap=None, sinks=None,
                alibi_slopes=None, key_lengths=None, query_lengths=None):
    """Inputs and keyword arguments of one call. Values are on the dyadic grid of conftest
    (exact in float32 and float64, so one reference serves both dtypes). ``mask``: None,
    "bool" or "float"; ``sinks`` / ``alibi_slopes``: None, "head" (shape (Hq,)) or "entry"
    ((B, Hq)); ``key_lengths`` / ``query_lengths``: None, "batch" ((B, 1)) or "entry"."""
    Hkv = Hkv or (Hq // 2 if gqa and Hq % 2 == 0 else Hq)
    q = grid_values(rng, (B, Hq, L, E))
    kv_batch = (B, Hkv) if gqa else (rng.choice([1, B]), Hq)
    k = grid_values(rng, kv_batch + (S, E))
    v = grid_values(rng, kv_batch + (S, Ev))
    kw = {"is_causal": is_causal, "causal_alignment": alignment, "enable_gqa": gqa}
    if mask == "bool":
        kw["mask"] = rng.random((B, 1, L, S)) < 0.85
    elif mask == "float":
        m = grid_values(rng, (L, S))
        m[rng.random((L, S)) < 0.1] = -np.inf
        kw["mask"] = m
    if window is not None:
        kw["window"] = window
    if softcap is not None:
        kw["softcap"] = softcap
    shapes = {"head": (Hq,), "entry": (B, Hq), "batch": (B, 1)}
    if sinks is not None:
        s = grid_values(rng, shapes[sinks], -3.0, 3.0)
        if s.size > 2:
            s.flat[1] = -np.inf
        kw["sinks"] = s
    if alibi_slopes is not None:
        kw["alibi_slopes"] = 2.0 ** -rng.integers(1, 9, size=shapes[alibi_slopes])
    if key_lengths is not None:
        kw["key_lengths"] = rng.integers(0, S + 3, size=shapes[key_lengths])
    if query_lengths is not None:
        kw["query_lengths"] = rng.integers(0, L + 3, size=shapes[query_lengths])
    return q, k, v, kw


def _reference_kwargs(kw):
    kw = dict(kw)
    return kw.pop("mask", None), kw


def _random_variant_kwargs(rng, L, S):
    side = lambda: None if rng.random() < 0.25 else int(rng.integers(0, max(S, 1) + 1))  # noqa: E731
    opts = {}
    if rng.random() < 0.6:
        opts["window"] = (side(), side())
    if rng.random() < 0.4:
        opts["softcap"] = float(rng.choice([0.25, 1.0, 2.5, 30.0]))
    for name, kinds in (("sinks", ["head", "entry"]), ("alibi_slopes", ["head", "entry"]),
                        ("key_lengths", ["batch", "entry"]),
                        ("query_lengths", ["batch", "entry"])):
        if rng.random() < 0.4:
            opts[name] = str(rng.choice(kinds))
    return opts


# ------------------------------------------------------------------------------------------
# (a) The oracle against the NumPy construction
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(60))
def test_oracle_matches_numpy_construction(seed):
    rng = np.random.default_rng(seed)
    L, S = int(rng.integers(0, 7)), int(rng.integers(0, 8))
    E, Ev = int(rng.integers(0, 5)), int(rng.integers(1, 4))
    gqa = bool(rng.random() < 0.4)
    q, k, v, kw = random_case(
        rng, L, S, E, Ev, B=2, Hq=4 if gqa else 2, gqa=gqa,
        alignment=str(rng.choice(ALIGNMENTS)), is_causal=bool(rng.random() < 0.5),
        mask=rng.choice([None, "bool", "float"]), **_random_variant_kwargs(rng, L, S))
    mask, kw = _reference_kwargs(kw)
    got = oracle_variants(q, k, v, mask, **kw)
    ref = numpy_variants(q, k, v, mask, **kw)
    assert_same(got, ref, np.float64, E + S + 1, err_msg=str(kw))


@pytest.mark.parametrize("alignment", ALIGNMENTS)
@pytest.mark.parametrize("name", VARIANT_ARGS)
def test_oracle_each_argument_matches_numpy(name, alignment):
    rng = np.random.default_rng(_seed(name, alignment))
    opts = {"window": {"window": (2, 1)}, "softcap": {"softcap": 0.75},
            "sinks": {"sinks": "entry"}, "alibi_slopes": {"alibi_slopes": "head"},
            "key_lengths": {"key_lengths": "entry"},
            "query_lengths": {"query_lengths": "entry"}}[name]
    for is_causal in (False, True):
        for gqa in (False, True):
            q, k, v, kw = random_case(rng, 5, 7, 3, 2, B=2, Hq=4, gqa=gqa, alignment=alignment,
                                      is_causal=is_causal, mask="float", **opts)
            mask, kw = _reference_kwargs(kw)
            assert_same(oracle_variants(q, k, v, mask, **kw), numpy_variants(q, k, v, mask, **kw),
                        np.float64, 11, err_msg=str(kw))


def test_oracle_without_variants_is_unchanged():
    """Unbounded windows and lengths equal to (or past) S and L change nothing; so does a
    -inf sink; and the default call still is today's."""
    rng = np.random.default_rng(7)
    for alignment in ALIGNMENTS:
        q, k, v, kw = random_case(rng, 4, 6, 3, 2, alignment=alignment, is_causal=True,
                                  mask="bool")
        mask, kw = _reference_kwargs(kw)
        base = oracle_variants(q, k, v, mask, **kw)
        for extra in ({"window": (None, None)}, {"window": (10, 10)},
                      {"key_lengths": 6, "query_lengths": 4},
                      {"key_lengths": 60, "query_lengths": 40},
                      {"sinks": -INF}, {"alibi_slopes": 0.0}):
            got = oracle_variants(q, k, v, mask, **kw, **extra)
            np.testing.assert_array_equal(got[0], base[0], err_msg=str(extra))
            np.testing.assert_array_equal(got[1], base[1], err_msg=str(extra))


def test_oracle_batched_broadcasting_matches_per_entry_calls():
    """The oracle's own broadcasting of per-batch arguments ((H,), (B, 1), scalars)."""
    rng = np.random.default_rng(3)
    B, H, L, S, E = 2, 3, 3, 5, 2
    q, k, v = (grid_values(rng, (B, H, n, E)) for n in (L, S, S))
    sinks = [0.5, -1.0, -INF]
    slopes = 0.25
    key_lengths = [[2], [5]]
    query_lengths = [[1, 2, 3], [3, 0, 2]]
    got_out, got_lse = oracle.scaled_dot_product_attention(
        q.tolist(), k.tolist(), v.tolist(), is_causal=True, causal_alignment="bottom_right",
        return_lse=True, window=(1, None), sinks=sinks, alibi_slopes=slopes,
        key_lengths=key_lengths, query_lengths=query_lengths)
    for b in range(B):
        for h in range(H):
            o, s = oracle.scaled_dot_product_attention(
                q[b, h].tolist(), k[b, h].tolist(), v[b, h].tolist(), is_causal=True,
                causal_alignment="bottom_right", return_lse=True, window=(1, None),
                sinks=sinks[h], alibi_slopes=slopes, key_lengths=key_lengths[b][0],
                query_lengths=query_lengths[b][h])
            assert got_out[b][h] == o and got_lse[b][h] == s


def test_oracle_sink_hand_computed():
    """Two keys of scores 0 and log 2 and a sink of log 3: weights 1/6, 2/6 and lse log 6."""
    out, lse = oracle.scaled_dot_product_attention(
        [[1.0]], [[0.0], [math.log(2.0)]], [[6.0], [12.0]], scale=1.0, sinks=math.log(3.0),
        return_lse=True)
    assert out[0][0] == pytest.approx(1.0 + 4.0, rel=1e-15)
    assert lse[0] == pytest.approx(math.log(6.0), rel=1e-15)


def test_oracle_softcap_and_alibi_hand_computed():
    """Scores 3 and 0, softcap 1 -> tanh(3) and 0; ALiBi slope 0.5 at distances 1 and 0."""
    out, lse = oracle.scaled_dot_product_attention(
        [[0.0], [1.0]], [[3.0], [0.0]], [[1.0], [0.0]], scale=1.0, softcap=1.0,
        alibi_slopes=0.5, return_lse=True)
    s0, s1 = math.tanh(0.0) - 0.0, 0.0 - 0.5  # row 0: q = 0 -> scores 0 (distance 0) and 0 - 0.5
    assert out[0][0] == pytest.approx(math.exp(s0) / (math.exp(s0) + math.exp(s1)), rel=1e-15)
    t0, t1 = math.tanh(3.0) - 0.5, 0.0  # row 1: capped score of key 0 at distance 1, key 1 at 0
    assert out[1][0] == pytest.approx(math.exp(t0) / (math.exp(t0) + math.exp(t1)), rel=1e-15)
    assert lse[1] == pytest.approx(math.log(math.exp(t0) + math.exp(t1)), rel=1e-15)


def test_oracle_sink_special_values():
    q, k, v = [[1.0], [NAN], [0.0]], [[1.0], [2.0]], [[1.0], [2.0]]
    mask = [[True, True], [True, True], [False, False]]
    # +inf sink: output 0, lse +inf, except the NaN row (row 1) stays NaN
    out, lse = oracle.scaled_dot_product_attention(q, k, v, mask, sinks=INF, return_lse=True)
    assert out[0] == [0.0] and lse[0] == INF
    assert math.isnan(out[1][0]) and math.isnan(lse[1])
    assert out[2] == [0.0] and lse[2] == INF
    # NaN sink: every row NaN
    out, lse = oracle.scaled_dot_product_attention(q, k, v, mask, sinks=NAN, return_lse=True)
    assert all(math.isnan(r[0]) for r in out) and all(math.isnan(x) for x in lse)
    # finite sink on a row without a permitted key: output 0, lse = the sink
    out, lse = oracle.scaled_dot_product_attention(q, k, v, mask, sinks=-1.5, return_lse=True)
    assert out[2] == [0.0] and lse[2] == -1.5
    # query rows past query_lengths: 0 and -inf even with a sink
    out, lse = oracle.scaled_dot_product_attention(q, k, v, sinks=INF, query_lengths=1,
                                                   return_lse=True)
    assert out[1:] == [[0.0], [0.0]] and lse[1:] == [-INF, -INF] and lse[0] == INF


def test_oracle_softcap_of_infinite_scores():
    """tanh(+-inf) = +-1: capped infinite scores are finite; a NaN score stays NaN."""
    out, lse = oracle.scaled_dot_product_attention(
        [[INF]], [[1.0], [-1.0]], [[2.0], [4.0]], scale=1.0, softcap=2.0, return_lse=True)
    w0 = math.exp(2.0) / (math.exp(2.0) + math.exp(-2.0))
    assert out[0][0] == pytest.approx(2.0 * w0 + 4.0 * (1.0 - w0), rel=1e-15)
    out = oracle.scaled_dot_product_attention([[INF]], [[0.0]], [[2.0]], softcap=2.0)
    assert math.isnan(out[0][0])


def test_oracle_hf_sliding_window_is_window_w_minus_1():
    """HF's sliding_window=W with causal: query i sees keys i - W < j <= i."""
    rng = np.random.default_rng(11)
    L, W = 7, 3
    q, k, v = (grid_values(rng, (L, 2)) for _ in range(3))
    dense = np.array([[i - W < j <= i for j in range(L)] for i in range(L)])
    got = oracle.scaled_dot_product_attention(q.tolist(), k.tolist(), v.tolist(),
                                              is_causal=True, window=(W - 1, 0))
    ref = oracle.scaled_dot_product_attention(q.tolist(), k.tolist(), v.tolist(),
                                              dense.tolist())
    assert got == ref


def test_oracle_never_reads_removed_keys():
    """NaN in keys/values outside the window or past a key length does not leak."""
    k = [[1.0], [2.0], [NAN], [NAN]]
    v = [[1.0], [2.0], [INF], [NAN]]
    for kw in ({"key_lengths": 2}, {"window": (1, 0), "is_causal": True},
               {"window": (None, 0)}):
        out = oracle.scaled_dot_product_attention([[1.0], [0.5]], k, v, **kw)
        assert all(math.isfinite(x) for row in out for x in row), kw


@pytest.mark.parametrize("kwargs, exc, words", [
    ({"window": 3}, TypeError, "window"),
    ({"window": (1, 2, 3)}, ValueError, "window"),
    ({"window": (-1, 0)}, ValueError, "window left"),
    ({"window": (0, -2)}, ValueError, "window right"),
    ({"window": (1.0, 0)}, TypeError, "window left"),
    ({"window": (0, True)}, TypeError, "window right"),
    ({"softcap": 0.0}, ValueError, "softcap"),
    ({"softcap": -1.0}, ValueError, "softcap"),
    ({"softcap": NAN}, ValueError, "softcap"),
    ({"softcap": INF}, ValueError, "softcap"),
    ({"softcap": "1"}, TypeError, "softcap"),
    ({"softcap": True}, TypeError, "softcap"),
    ({"sinks": [0.0, 1.0, 2.0]}, ValueError, "sinks"),
    ({"sinks": [True, False]}, TypeError, "sinks"),
    ({"alibi_slopes": [[0.5], [0.5], [0.5]]}, ValueError, "alibi_slopes"),
    ({"alibi_slopes": ["x", "y"]}, TypeError, "alibi_slopes"),
    ({"key_lengths": [1.0, 2.0]}, TypeError, "key_lengths"),
    ({"key_lengths": True}, TypeError, "key_lengths"),
    ({"key_lengths": [1, -1]}, ValueError, "key_lengths"),
    ({"key_lengths": [1, 2, 3]}, ValueError, "key_lengths"),
    ({"query_lengths": [2.5]}, TypeError, "query_lengths"),
    ({"query_lengths": -3}, ValueError, "query_lengths"),
    ({"query_lengths": [[1, 1], [1, 1], [1, 1]]}, ValueError, "query_lengths"),
])
def test_oracle_validation(kwargs, exc, words):
    q = [[[1.0, 0.0]], [[0.0, 1.0]]]            # batch 2, L = 1, E = 2
    k = [[[1.0, 0.0], [0.0, 1.0]]] * 2           # S = 2
    v = [[[1.0], [2.0]]] * 2
    with pytest.raises(exc, match=words):
        oracle.scaled_dot_product_attention(q, k, v, **kwargs)


# ------------------------------------------------------------------------------------------
# (b) The compiled kernel against the references
# ------------------------------------------------------------------------------------------

# Paths of the kernel: "tiny" (few rows, too little work to decode), "decode" (L <= 4 with
# S * (E + Ev) * batch >= 1024 * L, several 512-key chunks), "fused" (several 256-key blocks,
# query groups and panels).
PATHS = {
    "tiny": {"L": 3, "S": 7, "E": 4, "Ev": 3, "B": 2, "Hq": 4},
    "small": {"L": 9, "S": 13, "E": 5, "Ev": 3, "B": 2, "Hq": 2},
    "decode": {"L": 3, "S": 1100, "E": 16, "Ev": 8, "B": 1, "Hq": 4},
    "fused": {"L": 300, "S": 600, "E": 16, "Ev": 8, "B": 1, "Hq": 2},
}

# Window sides are fractions of S (rounded), so every path gets windows of its own scale.
CASES = {
    "window_causal": {"is_causal": True, "window": (0.06, 0.0)},
    "window_two_sided": {"window": (0.2, 0.02)},
    "window_left_open": {"window": (None, 0.01)},
    "window_right_open": {"window": (0.1, None)},
    "window_bool_mask": {"window": (0.3, 0.3), "mask": "bool"},
    "softcap": {"softcap": 2.5},
    "softcap_float_mask_causal": {"softcap": 0.75, "mask": "float", "is_causal": True},
    "sinks": {"sinks": "head"},
    "sinks_causal": {"sinks": "entry", "is_causal": True},
    "alibi": {"alibi_slopes": "head"},
    "alibi_window_causal": {"alibi_slopes": "entry", "is_causal": True, "window": (0.1, 0.0)},
    "key_lengths": {"key_lengths": "batch"},
    "query_lengths": {"query_lengths": "entry"},
    "lengths_causal": {"key_lengths": "entry", "query_lengths": "batch", "is_causal": True},
    "everything": {"is_causal": True, "window": (0.15, 0.01), "softcap": 3.0, "sinks": "entry",
                   "alibi_slopes": "head", "key_lengths": "entry", "query_lengths": "batch",
                   "mask": "float"},
}


def _window(spec, S):
    if spec is None:
        return None
    return tuple(None if f is None else int(round(f * S)) for f in spec)


def build(path, case, alignment, gqa, seed=0):
    dims = PATHS[path]
    opts = dict(CASES[case])
    if "window" in opts:
        opts["window"] = _window(opts["window"], dims["S"])
    rng = np.random.default_rng(_seed(path, case, alignment, gqa, seed))
    return random_case(rng, dims["L"], dims["S"], dims["E"], dims["Ev"], B=dims["B"],
                       Hq=dims["Hq"], gqa=gqa, alignment=alignment, **opts)


def sdpa(q, k, v, mask=None, dtype=np.float64, **kw):
    """The compiled call on inputs cast to ``dtype``; returns (out, lse)."""
    cast = [np.asarray(t, dtype=dtype) for t in (q, k, v)]
    if mask is not None and mask.dtype != np.bool_:
        mask = mask.astype(dtype)
    return cyattn.scaled_dot_product_attention(*cast, mask, return_lse=True, **kw)


_REFERENCES = {}


def built_case(path, case, alignment, gqa, seed=0):
    """``build`` plus its float64 reference (cached: every kernel variant reuses them)."""
    key = (path, case, alignment, gqa, seed)
    if key not in _REFERENCES:
        q, k, v, kw = build(path, case, alignment, gqa, seed)
        mask, kw = _reference_kwargs(kw)
        _REFERENCES[key] = (q, k, v, mask, kw, references(q, k, v, mask, kw, path))
    return _REFERENCES[key]


def references(q, k, v, mask, kw, path):
    ref = numpy_variants(q, k, v, mask, **kw)
    if path in ("tiny", "small"):
        # the oracle agrees with the construction here (tested above); compare with both
        assert_same(oracle_variants(q, k, v, mask, **kw), ref, np.float64,
                    q.shape[-1] + k.shape[-2] + 1)
    return ref


def _k(q, k):
    return q.shape[-1] + k.shape[-2] + 1


@needs_variants
@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
@pytest.mark.parametrize("alignment", ALIGNMENTS)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("path", list(PATHS))
def test_compiled_matches_references(variant, path, case, alignment, gqa):
    q, k, v, mask, kw, ref = built_case(path, case, alignment, gqa)
    for dtype in (np.float32, np.float64):
        one = sdpa(q, k, v, mask, dtype, n_threads=1, **kw)
        assert one[0].dtype == dtype and one[1].dtype == dtype
        assert_same(one, ref, dtype, _k(q, k), err_msg=f"{dtype.__name__} {kw}")
        two = sdpa(q, k, v, mask, dtype, n_threads=2, **kw)
        assert one[0].tobytes() == two[0].tobytes(), "n_threads=1 and 2 differ"
        assert one[1].tobytes() == two[1].tobytes(), "n_threads=1 and 2 differ (lse)"


@needs_variants
@pytest.mark.parametrize("alignment", ALIGNMENTS)
@pytest.mark.parametrize("path", list(PATHS))
def test_compiled_strided_inputs_and_out(variant, path, alignment):
    """Transposed, sliced and reversed views of every argument (the per-batch ones too), and
    out= (C-contiguous and a strided view) give the results of C-contiguous inputs."""
    q, k, v, mask, kw, ref = built_case(path, "everything", alignment, True)
    for dtype in (np.float32, np.float64):
        qd, kd, vd = (t.astype(dtype) for t in (q, k, v))
        md = mask.astype(dtype)
        strided = {"query": with_layout(qd, "transposed_view"), "key": with_layout(kd, "sliced"),
                   "value": with_layout(vd, "reversed_view"),
                   "attn_mask": with_layout(md, "transposed_view")}
        extra = {name: with_layout(np.asarray(kw[name]), "sliced")
                 for name in ("sinks", "alibi_slopes", "key_lengths", "query_lengths")}
        rest = {n: x for n, x in kw.items() if n not in extra}
        plain = cyattn.scaled_dot_product_attention(qd, kd, vd, md, return_lse=True, **kw)
        got = cyattn.scaled_dot_product_attention(
            strided["query"], strided["key"], strided["value"], strided["attn_mask"],
            return_lse=True, **rest, **extra)
        assert_same(got, ref, dtype, _k(q, k))
        assert_same(got, plain, dtype, _k(q, k))
        shape = plain[0].shape
        for out in (np.full(shape, 7.0, dtype=dtype),
                    np.full(shape[:-1] + (2 * shape[-1],), 7.0, dtype=dtype)[..., ::2]):
            res = cyattn.scaled_dot_product_attention(qd, kd, vd, md, out=out, **kw)
            assert res is out
            assert_close(out, ref[0], dtype, _k(q, k))


@needs_variants
@pytest.mark.parametrize("case", ["window_causal", "sinks_causal", "alibi", "softcap",
                                  "lengths_causal", "everything"])
@pytest.mark.parametrize("alignment", ALIGNMENTS)
@pytest.mark.parametrize("path", list(PATHS))
def test_compiled_redo_path(variant, path, case, alignment):
    """Non-finite rows (a NaN and an inf in value rows, huge finite values whose unnormalised
    sum overflows) take the two-pass redo path, which keeps every variant's semantics."""
    q, k, v, kw = build(path, case, alignment, gqa=False, seed=1)
    mask, kw = _reference_kwargs(kw)
    L, S = q.shape[-2], k.shape[-2]
    # The NaN and inf values sit just before the middle query's aligned position: with ALiBi a
    # far key's float32 weight underflows to exactly 0, and such a key is never read (the
    # documented semantics), while the float64 reference still gives it a tiny weight.
    mid = L // 2 + (S - L if alignment == "bottom_right" else 0)
    for dtype in (np.float32, np.float64):
        vd = v.copy()
        vd[..., min(max(mid - 3, 2), S - 2), 0] = np.nan
        vd[..., min(max(mid - 7, 2), S - 2), -1] = np.inf
        huge = np.finfo(dtype).max / 4
        vd[..., -1, :] = huge
        vd[..., 1, :] = huge
        key = ("redo", path, case, alignment, dtype)
        if key not in _REFERENCES:
            _REFERENCES[key] = numpy_variants(q, k, vd, mask, **kw)
        ref = _REFERENCES[key]
        got = sdpa(q, k, vd, mask, dtype, n_threads=1, **kw)
        assert_same(got, ref, dtype, _k(q, k), err_msg=str(kw))
        two = sdpa(q, k, vd, mask, dtype, n_threads=2, **kw)
        assert got[0].tobytes() == two[0].tobytes()


# ------------------------------------------------------------------------------------------
# Edge cases (compiled)
# ------------------------------------------------------------------------------------------

EDGE_PATHS = ("tiny", "decode", "fused")


def _plain(path, seed=5, L=None, S=None):
    dims = dict(PATHS[path])
    if L is not None:
        dims["L"] = L
    if S is not None:
        dims["S"] = S
    rng = np.random.default_rng(seed)
    q = grid_values(rng, (dims["B"], dims["Hq"], dims["L"], dims["E"]))
    k = grid_values(rng, (dims["B"], dims["Hq"], dims["S"], dims["E"]))
    v = grid_values(rng, (dims["B"], dims["Hq"], dims["S"], dims["Ev"]))
    return q, k, v


@needs_variants
@pytest.mark.parametrize("path", EDGE_PATHS)
def test_window_excluding_every_key_of_a_row(variant, path):
    """Rows whose window holds no key: output 0 and lse -inf, or lse = the sink."""
    if path == "decode":  # key_lengths=1: row 1's window [1, 1] lies past the only key
        q, k, v = _plain(path)
        kw = {"window": (0, 0), "key_lengths": 1}
        empty = np.s_[..., 1:, :]
    else:  # L > S: rows i >= S have window [i, i] beyond the last key
        S = 5 if path == "tiny" else 260
        q, k, v = _plain(path, S=S, L=S + 40 if path == "fused" else S + 2)
        kw = {"window": (0, 0)}
        empty = np.s_[..., S:, :]
    sinks = np.array([0.5, -1.0, 2.0, -INF])[:q.shape[1]]
    for dtype in (np.float32, np.float64):
        out, lse = sdpa(q, k, v, None, dtype, **kw)
        assert (out[empty] == 0).all() and (lse[empty[:-1]] == -INF).all()
        assert_same((out, lse), numpy_variants(q, k, v, **kw), dtype, _k(q, k))
        out, lse = sdpa(q, k, v, None, dtype, sinks=sinks, **kw)
        assert (out[empty] == 0).all()
        np.testing.assert_array_equal(
            lse[empty[:-1]], np.broadcast_to(sinks.astype(dtype)[:, None], lse[empty[:-1]].shape))
        assert_same((out, lse), numpy_variants(q, k, v, sinks=sinks, **kw), dtype, _k(q, k))


@needs_variants
@pytest.mark.parametrize("path", EDGE_PATHS)
def test_softcap_huge_and_infinite_scores(variant, path):
    """Scores of +-1e30 and +-inf are capped to +-c (tanh(+-inf) = +-1); a NaN score (inf * 0)
    still makes its row NaN."""
    q, k, v = _plain(path)
    k[..., 0] = np.where(np.arange(k.shape[-2]) % 2 == 0, 1.0, -1.0)
    for dtype, big in ((np.float32, 1e30), (np.float64, 1e200)):
        for value in (big, INF):
            qb = q.copy()
            qb[..., 0, 0] = value
            ref = oracle_variants(qb[..., :1, :], k[..., :40, :], v[..., :40, :], softcap=2.0)
            got = sdpa(qb[..., :1, :], k[..., :40, :], v[..., :40, :], None, dtype, softcap=2.0)
            assert np.isfinite(got[0]).all() and np.isfinite(got[1]).all()
            assert_same(got, ref, dtype, _k(q, k))
            full = sdpa(qb, k, v, None, dtype, softcap=2.0)
            assert_same(full, numpy_variants(qb, k, v, softcap=2.0), dtype, _k(q, k))
        qn = q.copy()
        qn[..., 0, 0] = INF
        kn = k.copy()
        kn[..., 3, 0] = 0.0  # inf * 0 = NaN in key 3's score of row 0
        out, lse = sdpa(qn, kn, v, None, dtype, softcap=2.0)
        assert np.isnan(out[..., 0, :]).all() and np.isnan(lse[..., 0]).all()
        assert np.isfinite(out[..., 1:, :]).all()


@needs_variants
@pytest.mark.parametrize("path", EDGE_PATHS)
def test_sinks_of_minus_and_plus_infinity(variant, path):
    q, k, v = _plain(path)
    H = q.shape[1]
    for dtype in (np.float32, np.float64):
        base = sdpa(q, k, v, None, dtype, is_causal=True)
        minus = sdpa(q, k, v, None, dtype, is_causal=True, sinks=np.full(H, -INF))
        assert_same(minus, base, dtype, _k(q, k))
        plus = sdpa(q, k, v, None, dtype, is_causal=True, sinks=np.full(H, INF))
        assert (plus[0] == 0).all() and (plus[1] == INF).all()
        qn = q.copy()
        qn[..., 0, 0] = np.nan  # a NaN row stays NaN, whatever the sink
        plus = sdpa(qn, k, v, None, dtype, is_causal=True, sinks=np.full(H, INF))
        assert np.isnan(plus[0][..., 0, :]).all() and np.isnan(plus[1][..., 0]).all()
        assert (plus[0][..., 1:, :] == 0).all() and (plus[1][..., 1:] == INF).all()
        nan = sdpa(q, k, v, None, dtype, sinks=np.full(H, np.nan))
        assert np.isnan(nan[0]).all() and np.isnan(nan[1]).all()


# Routes of a call with rows that no key is permitted for (bottom-right causal with L > S):
# (Hq, Hk, L, S, compute dtype, extra arguments); "kv8" stores K/V as int8 with scales.
_NO_KEY_ROUTES = {
    "decode": (3, 3, 9, 5, np.float32, {}),            # issue 49's fuzz input (shapes)
    "decode_grouped": (4, 2, 9, 5, np.float32, {"enable_gqa": True}),
    "fused": (3, 3, 150, 60, np.float32, {}),
    "fused_f64": (3, 3, 40, 17, np.float64, {}),
    "no_keys": (3, 3, 4, 0, np.float32, {}),
    "bf16_fast": (3, 3, 70, 40, "bfloat16", {"precision": "fast"}),
    "kv8": (4, 2, 9, 5, "kv8", {"enable_gqa": True}),
    "query_lengths": (3, 3, 9, 5, np.float32, {"query_lengths": np.array([7, 7, 6])}),
}


@needs_variants
@pytest.mark.parametrize("route", sorted(_NO_KEY_ROUTES))
def test_nan_sink_makes_rows_without_a_permitted_key_nan(variant, route):
    """Issue 49 (a fuzz find): the sink takes part in every row's denominator and a NaN taking
    part makes the row NaN, so a NaN sink gives output NaN and lse NaN on every row of its
    head, also on the rows with no permitted key (the kernels gave output 0 there). A finite
    sink keeps such a row at output 0 and lse = the sink; rows past ``query_lengths`` stay 0
    and ``-inf``. The same bits for 1 and 3 threads; attention_weights agrees."""
    Hq, Hk, L, S, dtype, extra = _NO_KEY_ROUTES[route]
    rng = np.random.default_rng(49)
    q = rng.standard_normal((1, Hq, L, 2)).astype(np.float32)
    k = rng.standard_normal((1, Hk, S, 2)).astype(np.float32)
    v = rng.standard_normal((1, Hk, S, 3)).astype(np.float32)
    sinks = np.array([[-1.3125, 5.0, NAN, NAN][:Hq]], np.float32)
    kw = dict(is_causal=True, causal_alignment="bottom_right", sinks=sinks, **extra)
    if dtype == "kv8":
        k, v = np.round(k * 8).astype(np.int8), np.round(v * 8).astype(np.int8)
        kw.update(key_scale=np.float32(0.125), value_scale=np.float32(0.125))
    elif dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        q, k, v = (t.astype(ml_dtypes.bfloat16) for t in (q, k, v))
    else:
        q, k, v = (t.astype(dtype) for t in (q, k, v))
    runs = [cyattn.scaled_dot_product_attention(q, k, v, return_lse=True, n_threads=n, **kw)
            for n in (1, 3)]
    for got in runs[1:]:
        for a, b in zip(got, runs[0]):
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), route
    out, lse = (np.asarray(t, np.float64) for t in runs[0])
    live = np.broadcast_to(np.asarray(extra.get("query_lengths", L)), (Hq,))
    for h in range(Hq):
        rows, past = np.s_[0, h, :live[h]], np.s_[0, h, live[h]:]
        assert (out[past] == 0).all() and (lse[past] == -INF).all(), (route, h)
        if np.isnan(sinks[0, h]):
            assert np.isnan(out[rows]).all() and np.isnan(lse[rows]).all(), (route, h)
            continue
        no_key = np.arange(live[h]) < live[h] - S    # p(i) = i + S - L_b < 0: no key
        assert no_key.any() and (out[rows][no_key] == 0).all(), (route, h)
        assert (lse[rows][no_key] == np.float32(sinks[0, h])).all(), (route, h)
        assert np.isfinite(out[rows]).all() and np.isfinite(lse[rows]).all(), (route, h)
    if dtype in (np.float32, np.float64) and Hq == Hk:
        weights = cyattn.attention_weights(q, k, **kw)
        assert S == 0 or np.array_equal(np.isnan(weights).any(axis=-1), np.isnan(lse)), route
        ref = oracle.scaled_dot_product_attention(
            q.tolist(), k.tolist(), v.tolist(), return_lse=True, value_dim=3,
            **{**kw, "sinks": sinks.tolist(),
               **({"query_lengths": extra["query_lengths"].tolist()} if extra else {})})
        assert_same((out, lse), tuple(np.asarray(t, np.float64) for t in ref), dtype, 2,
                    err_msg=route)


@needs_variants
@pytest.mark.parametrize("alignment", ALIGNMENTS)
@pytest.mark.parametrize("path", EDGE_PATHS)
def test_lengths_of_zero_and_past_the_end(variant, path, alignment):
    q, k, v = _plain(path)
    B, H, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    for dtype in (np.float32, np.float64):
        base = sdpa(q, k, v, None, dtype, is_causal=True, causal_alignment=alignment)
        past = sdpa(q, k, v, None, dtype, is_causal=True, causal_alignment=alignment,
                    key_lengths=np.full((B, 1), S + 7), query_lengths=np.full((B, H), L + 3))
        assert_same(past, base, dtype, _k(q, k))
        for kw in ({"key_lengths": np.zeros((B, 1), np.int64)},
                   {"query_lengths": np.zeros(H, np.int64)}):
            out, lse = sdpa(q, k, v, None, dtype, causal_alignment=alignment, **kw)
            assert (out == 0).all() and (lse == -INF).all()
        out, lse = sdpa(q, k, v, None, dtype, sinks=np.full(H, 1.25),
                        key_lengths=np.zeros((B, 1), np.int64))
        assert (out == 0).all() and (lse == np.asarray(1.25, dtype)).all()


@needs_variants
@pytest.mark.parametrize("alignment", ALIGNMENTS)
@pytest.mark.parametrize("path", EDGE_PATHS)
def test_nan_outside_the_window_or_past_a_length_is_never_read(variant, path, alignment):
    q, k, v = _plain(path)
    B, L, S = q.shape[0], q.shape[2], k.shape[2]
    n_keys = S // 2
    kn, vn = k.copy(), v.copy()
    kn[..., n_keys:, :] = np.nan
    vn[..., n_keys:, :] = np.inf
    for dtype in (np.float32, np.float64):
        kw = {"key_lengths": np.full((B, 1), n_keys), "causal_alignment": alignment}
        got = sdpa(q, kn, vn, None, dtype, **kw)
        assert np.isfinite(got[0]).all()
        assert_same(got, numpy_variants(q, k, v, **kw), dtype, _k(q, k))
        # window: bottom_right rows sit at the end of the keys; top_left rows at the start
        kw = {"window": (3, 2), "causal_alignment": alignment}
        kw2, vw = k.copy(), v.copy()
        p = np.arange(L) + (S - L if alignment == "bottom_right" else 0)
        visible = np.zeros(S, dtype=bool)
        for pi in p:
            visible[max(pi - 3, 0):pi + 3] = True
        kw2[..., ~visible, :] = np.nan
        vw[..., ~visible, :] = np.nan
        got = sdpa(q, kw2, vw, None, dtype, **kw)
        assert np.isfinite(got[0]).all() and np.isfinite(got[1]).all()
        assert_same(got, numpy_variants(q, k, v, **kw), dtype, _k(q, k))


# ------------------------------------------------------------------------------------------
# Validation (compiled)
# ------------------------------------------------------------------------------------------

BAD_ARGS = [
    ({"window": (-1, 0)}, ValueError, "window"),
    ({"window": (0, -5)}, ValueError, "window"),
    ({"window": (1.5, 0)}, TypeError, "window"),
    ({"window": (0, "2")}, TypeError, "window"),
    ({"window": (1, 2, 3)}, (TypeError, ValueError), "window"),
    ({"window": 4}, (TypeError, ValueError), "window"),
    ({"softcap": 0.0}, ValueError, "softcap"),
    ({"softcap": -2.0}, ValueError, "softcap"),
    ({"softcap": np.nan}, ValueError, "softcap"),
    ({"softcap": "2"}, TypeError, "softcap"),
    ({"softcap": 1j}, TypeError, "softcap"),
    ({"sinks": np.zeros(3)}, ValueError, "sinks"),
    ({"sinks": np.zeros((2, 2, 1))}, ValueError, "sinks"),
    ({"sinks": np.zeros(2, dtype=bool)}, TypeError, "sinks"),
    ({"sinks": np.zeros(2, dtype=complex)}, TypeError, "sinks"),
    ({"alibi_slopes": np.ones(5)}, ValueError, "alibi_slopes"),
    ({"alibi_slopes": np.ones(2, dtype=bool)}, TypeError, "alibi_slopes"),
    ({"alibi_slopes": np.array(["a", "b"])}, TypeError, "alibi_slopes"),
    ({"key_lengths": np.array([1.0, 2.0])}, TypeError, "key_lengths"),
    ({"key_lengths": np.array([True, False])}, TypeError, "key_lengths"),
    ({"key_lengths": np.array([1, -1])}, ValueError, "key_lengths"),
    ({"key_lengths": np.array([1, 2, 3])}, ValueError, "key_lengths"),
    ({"query_lengths": np.array([0.5])}, TypeError, "query_lengths"),
    ({"query_lengths": np.array([True])}, TypeError, "query_lengths"),
    ({"query_lengths": np.array([-2])}, ValueError, "query_lengths"),
    ({"query_lengths": np.ones((3, 2), np.int64)}, ValueError, "query_lengths"),
]


@needs_variants
@pytest.mark.parametrize("kwargs, exc, name", BAD_ARGS,
                         ids=[f"{next(iter(a[0]))}-{i}" for i, a in enumerate(BAD_ARGS)])
def test_compiled_validation(kwargs, exc, name):
    """Each bad argument raises the documented error naming it, and out= stays untouched."""
    rng = np.random.default_rng(0)
    q, k, v = (grid_values(rng, (2, 2, n, 4)) for n in (3, 5, 5))  # batch shape (2, 2)
    out = np.full((2, 2, 3, 4), 13.0)
    before = out.tobytes()
    with pytest.raises(exc, match=name):
        cyattn.scaled_dot_product_attention(q, k, v, out=out, **kwargs)
    assert out.tobytes() == before


# ------------------------------------------------------------------------------------------
# (c) ONNX Attention (onnx.reference), opsets 23-25
# ------------------------------------------------------------------------------------------

_ONNX_INPUTS = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")


def run_onnx_attention(opset, inputs, attrs):
    """Y of one ONNX Attention node run by ``onnx.reference.ReferenceEvaluator``."""
    pytest.importorskip("onnx")
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    last = max(i for i, n in enumerate(_ONNX_INPUTS) if inputs.get(n) is not None)
    names = [n if inputs.get(n) is not None else "" for n in _ONNX_INPUTS[:last + 1]]
    feeds = {n: inputs[n] for n in names if n}
    graph_inputs = [helper.make_tensor_value_info(
        n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()]
    y_type = helper.np_dtype_to_tensor_dtype(inputs["Q"].dtype)
    node = helper.make_node("Attention", names, ["Y"], **attrs)
    graph = helper.make_graph([node], "attention", graph_inputs,
                              [helper.make_tensor_value_info("Y", y_type, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, feeds)[0]


def onnx_to_cyattn(inputs, attrs):
    """An ONNX Attention call as cyattn arguments: ``(q, k, v, kwargs, to_onnx_layout)``.

    * 3-D ``Q (B, L, Hq*E)``, ``K``/``V (B, S, Hkv*E)`` with ``q_num_heads``/``kv_num_heads``
      -> 4-D ``(B, H, L, E)`` (split and move the heads), ``enable_gqa`` when ``Hq != Hkv``;
    * ``past_key``/``past_value`` -> prepended to K/V along S, ``causal_alignment=
      "bottom_right"`` (ONNX aligns query i at ``past_len + i``, which is ``S - L + i`` when,
      as in decoding, the new K/V rows are the L new tokens of Q);
    * ``nonpad_kv_seqlen (B,)`` -> ``key_lengths`` of shape ``(B, 1)`` and
      ``causal_alignment="bottom_right"``; no cache -> ``"top_left"``;
    * ``is_causal``, ``scale``, ``attn_mask`` (bool True = attend, or float) -> the same
      names; ``softcap`` (0 = off) -> ``softcap``;
    * ``left_window_size``/``right_window_size`` (-1 = unbounded) -> ``window=(left, right)``
      with None for -1.
    """
    q, k, v = inputs["Q"], inputs["K"], inputs["V"]
    three_d = q.ndim == 3
    if three_d:
        hq, hkv = attrs["q_num_heads"], attrs["kv_num_heads"]
        split = lambda x, h: np.swapaxes(x.reshape(x.shape[0], x.shape[1], h, -1), 1, 2)  # noqa: E731
        q, k, v = split(q, hq), split(k, hkv), split(v, hkv)
    kw = {"causal_alignment": "top_left"}
    if inputs.get("past_key") is not None:
        k = np.concatenate([inputs["past_key"], k], axis=2)
        v = np.concatenate([inputs["past_value"], v], axis=2)
        kw["causal_alignment"] = "bottom_right"
    if inputs.get("nonpad_kv_seqlen") is not None:
        kw["key_lengths"] = inputs["nonpad_kv_seqlen"].astype(np.int64)[:, None]
        kw["causal_alignment"] = "bottom_right"
    kw["enable_gqa"] = q.shape[1] != k.shape[1]
    kw["is_causal"] = bool(attrs.get("is_causal", 0))
    if "scale" in attrs:
        kw["scale"] = attrs["scale"]
    if attrs.get("softcap", 0.0) > 0:
        kw["softcap"] = attrs["softcap"]
    left, right = attrs.get("left_window_size", -1), attrs.get("right_window_size", -1)
    if left >= 0 or right >= 0:
        kw["window"] = (None if left < 0 else left, None if right < 0 else right)
    mask = inputs.get("attn_mask")

    def to_onnx_layout(out):
        if three_d:
            out = np.swapaxes(out, 1, 2)
            return out.reshape(out.shape[0], out.shape[1], -1)
        return out

    return q, k, v, mask, kw, to_onnx_layout


def onnx_cases():
    """(id, opset, inputs, attrs): random ONNX Attention calls covering every feature.

    ``scale`` is a float32 attribute whose square root the reference takes in float32 (it
    scales Q and K by it), so the scales used have exact float32 square roots."""
    cases = []
    rng = np.random.default_rng(2024)
    B, Hq, Hkv, L, S, E = 2, 4, 2, 5, 9, 4

    def arr(*shape):
        return grid_values(rng, shape)

    def bool_mask(*shape):
        return rng.random(shape) < 0.8

    def float_mask(*shape):
        m = grid_values(rng, shape)
        m[rng.random(shape) < 0.15] = -np.inf
        return m

    for opset in (23, 24, 25):
        for causal in (0, 1):
            cases.append((f"plain-causal{causal}", opset,
                          {"Q": arr(B, Hq, L, E), "K": arr(B, Hq, S, E), "V": arr(B, Hq, S, 3)},
                          {"is_causal": causal}))
            cases.append((f"gqa4d-softcap-bool-causal{causal}", opset,
                          {"Q": arr(B, Hq, L, E), "K": arr(B, Hkv, S, E), "V": arr(B, Hkv, S, 3),
                           "attn_mask": bool_mask(B, 1, L, S)},
                          {"is_causal": causal, "softcap": 1.5, "scale": 0.25}))
            cases.append((f"3d-float-causal{causal}", opset,
                          {"Q": arr(B, L, Hq * E), "K": arr(B, S, Hkv * E),
                           "V": arr(B, S, Hkv * 2), "attn_mask": float_mask(L, S)},
                          {"is_causal": causal, "q_num_heads": Hq, "kv_num_heads": Hkv}))
            cases.append((f"past-causal{causal}", opset,
                          {"Q": arr(B, Hq, L, E), "K": arr(B, Hq, L, E), "V": arr(B, Hq, L, 3),
                           "attn_mask": float_mask(B, Hq, L, S),
                           "past_key": arr(B, Hq, S - L, E), "past_value": arr(B, Hq, S - L, 3)},
                          {"is_causal": causal, "softcap": 4.0}))
            if opset >= 24:
                cases.append((f"nonpad-causal{causal}", opset,
                              {"Q": arr(B, Hq, L, E), "K": arr(B, Hkv, S, E),
                               "V": arr(B, Hkv, S, 3), "attn_mask": bool_mask(L, S),
                               "nonpad_kv_seqlen": np.array([S - 2, 3], dtype=np.int64)},
                              {"is_causal": causal, "softcap": 2.0}))
            if opset >= 25:
                for left, right in ((2, 0), (1, 3), (-1, 1), (3, -1)):
                    win = {"left_window_size": left, "right_window_size": right}
                    cases.append((f"window{left},{right}-causal{causal}", opset,
                                  {"Q": arr(B, Hq, L, E), "K": arr(B, Hkv, S, E),
                                   "V": arr(B, Hkv, S, 3), "attn_mask": float_mask(B, 1, L, S)},
                                  {"is_causal": causal, **win}))
                    cases.append((f"window{left},{right}-past-causal{causal}", opset,
                                  {"Q": arr(B, L, Hq * E), "K": arr(B, L, Hkv * E),
                                   "V": arr(B, L, Hkv * 3),
                                   "past_key": arr(B, Hkv, S - L, E),
                                   "past_value": arr(B, Hkv, S - L, 3)},
                                  {"is_causal": causal, "q_num_heads": Hq,
                                   "kv_num_heads": Hkv, "softcap": 2.5, **win}))
                    cases.append((f"window{left},{right}-nonpad-causal{causal}", opset,
                                  {"Q": arr(B, Hq, L, E), "K": arr(B, Hq, S, E),
                                   "V": arr(B, Hq, S, 3), "attn_mask": bool_mask(Hq, L, S),
                                   "nonpad_kv_seqlen": np.array([4, S], dtype=np.int64)},
                                  {"is_causal": causal, **win}))
    return cases


ONNX_CASES = onnx_cases()


@pytest.mark.parametrize("name, opset, inputs, attrs", ONNX_CASES,
                         ids=[f"opset{c[1]}-{c[0]}" for c in ONNX_CASES])
def test_onnx_mapping_against_references(name, opset, inputs, attrs):
    """ONNX's reference Attention equals the oracle and the NumPy construction on the mapped
    arguments: this checks the mapping itself (and our reading of the ONNX semantics)."""
    y = run_onnx_attention(opset, inputs, attrs)
    q, k, v, mask, kw, back = onnx_to_cyattn(inputs, attrs)
    k_sum = q.shape[-1] + k.shape[-2]
    ref_out, _ = numpy_variants(q, k, v, mask, **kw)
    assert_close(y, back(ref_out), np.float64, k_sum, err_msg=f"numpy {kw}")
    orc_out, _ = oracle_variants(q, k, v, mask, **kw)
    assert_close(y, back(orc_out), np.float64, k_sum, err_msg=f"oracle {kw}")


@needs_variants
@pytest.mark.parametrize("name, opset, inputs, attrs", ONNX_CASES,
                         ids=[f"opset{c[1]}-{c[0]}" for c in ONNX_CASES])
def test_onnx_against_compiled(variant, name, opset, inputs, attrs):
    y = run_onnx_attention(opset, inputs, attrs)
    q, k, v, mask, kw, back = onnx_to_cyattn(inputs, attrs)
    for dtype in (np.float32, np.float64):
        m = mask if mask is None or mask.dtype == np.bool_ else mask.astype(dtype)
        out = cyattn.scaled_dot_product_attention(q.astype(dtype), k.astype(dtype),
                                                  v.astype(dtype), m, **kw)
        assert_close(back(out), y, dtype, q.shape[-1] + k.shape[-2], err_msg=str(kw))


# ------------------------------------------------------------------------------------------
# JAX jax.nn.dot_product_attention (the JAX column of README's table)
# ------------------------------------------------------------------------------------------

def jax_cases():
    """Random calls with windows, lengths, GQA and causal. Every row keeps at least its own
    key (lengths >= L, diagonal in the mask): JAX fills masked logits with a large finite
    negative number, so its fully masked rows are not 0 (cyattn's are)."""
    rng = np.random.default_rng(77)
    B, T, S, N, K, H = 2, 5, 9, 4, 2, 4
    cases = []
    for i, (window, causal, lengths) in enumerate([
            ((2, 1), False, False), ((3, 0), True, False), (1, False, True),
            ((0, 2), True, True), (None, True, True), ((4, 4), False, True)]):
        q = grid_values(rng, (B, T, N, H)).astype(np.float32)
        k = grid_values(rng, (B, S, K, H)).astype(np.float32)
        v = grid_values(rng, (B, S, K, H)).astype(np.float32)
        mask = rng.random((B, 1, T, S)) < 0.7
        mask[..., np.arange(T), np.arange(T)] = True
        jax_kw = {"is_causal": causal, "local_window_size": window, "mask": mask}
        if lengths:
            jax_kw["query_seq_lengths"] = rng.integers(1, T + 1, size=B).astype(np.int32)
            jax_kw["key_value_seq_lengths"] = rng.integers(T, S + 1, size=B).astype(np.int32)
        cases.append(pytest.param(q, k, v, jax_kw, id=f"jax-{i}"))
    return cases


def jax_to_cyattn(q, k, v, jax_kw):
    """jax.nn.dot_product_attention's arguments as cyattn's: (B, T, N, H) -> (B, N, T, H);
    local_window_size (an int w means (w, w)) -> window; *_seq_lengths (B,) -> (B, 1);
    is_causal and the window are top-left aligned."""
    swap = lambda x: np.swapaxes(x, 1, 2)  # noqa: E731
    kw = {"is_causal": jax_kw["is_causal"], "causal_alignment": "top_left",
          "enable_gqa": q.shape[2] != k.shape[2]}
    window = jax_kw.get("local_window_size")
    if window is not None:
        kw["window"] = (window, window) if isinstance(window, int) else tuple(window)
    if jax_kw.get("query_seq_lengths") is not None:
        kw["query_lengths"] = jax_kw["query_seq_lengths"].astype(np.int64)[:, None]
    if jax_kw.get("key_value_seq_lengths") is not None:
        kw["key_lengths"] = jax_kw["key_value_seq_lengths"].astype(np.int64)[:, None]
    return swap(q), swap(k), swap(v), jax_kw.get("mask"), kw, swap


def run_jax(q, k, v, jax_kw):
    jax = pytest.importorskip("jax")
    return np.asarray(jax.nn.dot_product_attention(q, k, v, implementation="xla", **jax_kw))


@pytest.mark.parametrize("q, k, v, jax_kw", jax_cases())
def test_jax_mapping_against_references(q, k, v, jax_kw):
    y = run_jax(q, k, v, jax_kw)
    cq, ck, cv, mask, kw, back = jax_to_cyattn(q, k, v, jax_kw)
    k_sum = q.shape[-1] + k.shape[1]
    assert_close(y, back(numpy_variants(cq, ck, cv, mask, **kw)[0]), np.float32, k_sum)
    assert_close(y, back(oracle_variants(cq, ck, cv, mask, **kw)[0]), np.float32, k_sum)


@needs_variants
@pytest.mark.parametrize("q, k, v, jax_kw", jax_cases())
def test_jax_against_compiled(variant, q, k, v, jax_kw):
    y = run_jax(q, k, v, jax_kw)
    cq, ck, cv, mask, kw, back = jax_to_cyattn(q, k, v, jax_kw)
    out = cyattn.scaled_dot_product_attention(cq, ck, cv, mask, **kw)
    assert_close(back(out), y, np.float32, q.shape[-1] + k.shape[1])


# ------------------------------------------------------------------------------------------
# Hugging Face transformers: gpt-oss sinks and Gemma 2 softcap, each with sliding_window=W
# ------------------------------------------------------------------------------------------

def _hf_inputs(seed=5, B=2, Hq=4, Hkv=2, L=7, E=4):
    rng = np.random.default_rng(seed)
    q = grid_values(rng, (B, Hq, L, E))
    k = grid_values(rng, (B, Hkv, L, E))
    v = grid_values(rng, (B, Hkv, L, E))
    return q, k, v


def _hf_sliding_mask(L, W):
    """transformers' sliding-window causal rule (masking_utils: kv_idx > q_idx - W and
    kv_idx <= q_idx) as the additive mask its eager attention takes."""
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    return np.where((j <= i) & (j > i - W), 0.0, -np.inf)[None, None]


def _hf_attention(model, q, k, v, W, **extra):
    torch = pytest.importorskip("torch")
    mod = pytest.importorskip(f"transformers.models.{model}.modeling_{model}")
    import types
    module = types.SimpleNamespace(num_key_value_groups=q.shape[1] // k.shape[1],
                                   training=False, head_dim=q.shape[-1])
    kwargs = {}
    if "sinks" in extra:
        module.sinks = torch.tensor(extra["sinks"])
    if "softcap" in extra:
        kwargs["softcap"] = extra["softcap"]
    t = [torch.tensor(x) for x in (q, k, v)]
    out, _ = mod.eager_attention_forward(module, *t, torch.tensor(_hf_sliding_mask(q.shape[2], W)),
                                         scaling=q.shape[-1] ** -0.5, **kwargs)
    return np.swapaxes(out.numpy(), 1, 2)  # transformers returns (B, L, H, E)


HF_CASES = [("gpt_oss", {"sinks": np.array([0.5, -1.0, 2.0, -3.0])}, np.float64),
            ("gemma2", {"softcap": 1.5}, np.float32)]  # Gemma 2 takes its softmax in float32


@pytest.mark.parametrize("model, extra, dtype", HF_CASES, ids=[c[0] for c in HF_CASES])
@pytest.mark.parametrize("W", [1, 3, 20])
def test_hf_mapping_against_references(model, extra, dtype, W):
    q, k, v = _hf_inputs()
    y = _hf_attention(model, q, k, v, W, **extra)
    kw = {"is_causal": True, "window": (W - 1, 0), "enable_gqa": True, **extra}
    assert_close(y, numpy_variants(q, k, v, **kw)[0], dtype, q.shape[-1] + k.shape[-2] + 1)
    assert_close(y, oracle_variants(q, k, v, **kw)[0], dtype, q.shape[-1] + k.shape[-2] + 1)


@needs_variants
@pytest.mark.parametrize("model, extra, dtype", HF_CASES, ids=[c[0] for c in HF_CASES])
@pytest.mark.parametrize("W", [1, 3, 20])
def test_hf_against_compiled(variant, model, extra, dtype, W):
    q, k, v = _hf_inputs()
    y = _hf_attention(model, q, k, v, W, **extra)
    out = cyattn.scaled_dot_product_attention(q, k, v, is_causal=True, window=(W - 1, 0),
                                              enable_gqa=True, **extra)
    assert_close(out, y, dtype, q.shape[-1] + k.shape[-2] + 1)
