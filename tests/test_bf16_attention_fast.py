"""bfloat16 attention on the CPU's bf16 dot products (issue 40, ``precision="fast"``).

* The fast path (emulated on every variant, and on the instruction where the kernels have it)
  against a float64 reference on the same bfloat16 values, within the bound documented in
  :func:`cyattn.scaled_dot_product_attention`'s Notes, on every attention option (masks,
  causal both alignments, windows, softcap, sinks, ALiBi, key/query lengths, GQA, lse), odd
  shapes and strided inputs.
* The hardware kernel against the emulation bit for bit: in process (the avx512 variant's
  emulation against the avx512bf16 variant's vdpbf16ps, and the emulate switch), and in a child
  process with ``CYATTN_BACKEND=avx512`` against the default.
* 1, 2 and 3 threads bit-identical; the routing (decode, non-finite inputs, E = 0 go to the exact
  path); the default; bad ``precision`` values.
"""
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import bf16_attention_bound, child_env

import cyattn
from cyattn import _backend
from cyattn import attention as A
from cyattn.matmul import _dot_name

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
HW = getattr(_backend.kernels, "BF16_DOT", False)
needs_hw = pytest.mark.skipif(not HW, reason="the loaded kernels have no AVX512-BF16 "
                              "(vdpbf16ps): nothing to compare the emulation with")


def _bits(x):
    return np.ascontiguousarray(x).view(np.uint16)


def _sdpa(q, k, v, mask=None, emulate=False, **kw):
    """The public call's arguments, through attention._sdpa (which can force the emulation)."""
    args = dict(is_causal=False, scale=None, causal_alignment="top_left", enable_gqa=False,
                return_lse=False, out=None, n_threads=None, window=None, softcap=None,
                sinks=None, alibi_slopes=None, key_lengths=None, query_lengths=None,
                precision="fast")
    args.update(kw)
    return A._sdpa(q, k, v, mask, args["is_causal"], args["scale"], args["causal_alignment"],
                   args["enable_gqa"], args["return_lse"], args["out"], args["n_threads"],
                   args["window"], args["softcap"], args["sinks"], args["alibi_slopes"],
                   args["key_lengths"], args["query_lengths"], args["precision"],
                   emulate=emulate)


def _check(q, k, v, mask=None, emulate=True, **kw):
    out, lse = _sdpa(q, k, v, mask, emulate=emulate, return_lse=True, **kw)
    assert out.dtype == BF16 and lse.dtype == BF16
    o, b, ref_lse, lse_b = bf16_attention_bound(q, k, v, mask, **kw)
    err = np.abs(out.astype(np.float64) - o)
    assert np.all(err <= b), (err.max(), (err / b).max())
    lse64 = lse.astype(np.float64)
    inf = ~np.isfinite(ref_lse)
    assert np.array_equal(lse64[inf], ref_lse[inf])
    lerr = np.abs(lse64[~inf] - ref_lse[~inf])
    assert np.all(lerr <= lse_b[~inf]), lerr.max()
    return out, lse


def _data(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(BF16)


def _qkv(rng, B, Hq, Hk, L, S, E, Ev, scale=1.0):
    return (_data(rng, (B, Hq, L, E), scale), _data(rng, (B, Hk, S, E), scale),
            _data(rng, (B, Hk, S, Ev)))


# --- the fast path against the float64 reference, every option -------------------------------

SHAPES = [(17, 1, 1, 1), (33, 7, 7, 9), (65, 65, 64, 64), (130, 33, 65, 130), (40, 300, 128, 128),
          (300, 600, 64, 32)]


@pytest.mark.parametrize("L,S,E,Ev", SHAPES)
def test_dense_within_bound(variant, L, S, E, Ev):
    rng = np.random.default_rng(L * 1000 + S)
    q, k, v = _qkv(rng, 1, 2, 2, L, S, E, Ev, scale=2.0)
    _check(q, k, v)
    if HW and variant == "avx512bf16":
        _check(q, k, v, emulate=False)


OPTIONS = {
    "causal": dict(is_causal=True),
    "causal_bottom_right": dict(is_causal=True, causal_alignment="bottom_right"),
    "window": dict(window=(37, 5)),
    "window_causal_br": dict(window=(90, 0), is_causal=True, causal_alignment="bottom_right"),
    "softcap": dict(softcap=3.0, scale=0.5),
    "sinks": dict(sinks=np.array([0.5, -1.0, 2.0, 30.0])),
    "alibi": dict(alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625])),
    "lengths": dict(key_lengths=np.array([[300], [17]]), query_lengths=np.array([[45], [200]])),
    "lengths_br": dict(key_lengths=np.array([[250], [40]]), query_lengths=np.array([[60], [210]]),
                       is_causal=True, causal_alignment="bottom_right"),
    "gqa": dict(enable_gqa=True),
    "gqa_causal_sinks_window": dict(enable_gqa=True, is_causal=True, window=(50, 0),
                                    sinks=np.array([0.5, 1.0, -1.0, 2.0])),
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_options_within_bound(variant, name):
    kw = dict(OPTIONS[name])
    rng = np.random.default_rng(len(name))
    hk = 2 if kw.get("enable_gqa") else 4
    q, k, v = _qkv(rng, 2, 4, hk, 210, 300, 72, 40, scale=1.5)
    _check(q, k, v, **kw)


@pytest.mark.parametrize("kind", ["bool", "bool_broadcast", "float", "float_neg_inf"])
def test_masks_within_bound(variant, kind):
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, 2, 3, 3, 70, 290, 33, 20)
    if kind == "bool":
        mask = rng.random((2, 3, 70, 290)) < 0.7
        mask[0, 1, 5] = False                                   # a fully masked row
        mask[1, :, :, 0:256] = False                            # an all-False block
    elif kind == "bool_broadcast":
        mask = rng.random((1, 1, 70, 290)) < 0.5
    elif kind == "float":
        mask = (rng.standard_normal((2, 1, 70, 290)) * 3).astype(np.float32)
    else:
        mask = np.where(rng.random((70, 290)) < 0.6, 0.0, -np.inf).astype(np.float32)
        mask[3] = -np.inf
    out, _ = _check(q, k, v, mask, is_causal=kind == "bool")
    if kind == "bool":
        assert not np.any(out[0, 1, 5].astype(np.float32))


def test_strided_and_odd_layouts(variant):
    rng = np.random.default_rng(7)
    base = _data(rng, (3, 2, 100, 2 * 65))
    q = base[..., ::2][:, :, ::-1]                              # column and reversed row stride
    k = np.asfortranarray(_data(rng, (3, 2, 33, 65)))
    v = _data(rng, (2, 33, 3, 7)).transpose(2, 0, 1, 3)          # head-interleaved
    _check(q, k, v)
    out = _sdpa(q, k, v)
    same = _sdpa(*(np.ascontiguousarray(t) for t in (q, k, v)))
    assert np.array_equal(_bits(out), _bits(same))
    held = np.zeros(out.shape, BF16)[..., ::-1]                 # a strided out
    res = _sdpa(q, k, v, out=held)
    assert res is held and np.array_equal(_bits(held), _bits(out))
    f32 = np.zeros(out.shape, np.float32)                        # out of another dtype
    with pytest.raises(ValueError):
        _sdpa(q, k, v, out=f32)
    assert not f32.any()


def test_large_scores_and_long_rows(variant):
    """Scores far apart (most weights underflow), and S of 2050 (9 key blocks)."""
    rng = np.random.default_rng(11)
    q, k, v = _qkv(rng, 1, 2, 2, 40, 2050, 64, 64, scale=4.0)
    _check(q, k, v, is_causal=True, causal_alignment="bottom_right")


def test_subnormal_inputs_read_as_zero(variant):
    """bf16 subnormals in Q, K, V are read as zero by the instruction; the bound covers it."""
    rng = np.random.default_rng(12)
    q, k, v = _qkv(rng, 1, 1, 1, 40, 50, 16, 8)
    q[0, 0, :, :3] = np.array(2.0 ** -130, BF16)
    k[0, 0, :5] = np.array(-(2.0 ** -128), BF16)
    v[0, 0, 7:9] = np.array(2.0 ** -131, BF16)
    _check(q, k, v)


# --- hardware against emulation, bit for bit -------------------------------------------------

CASES = [(dict(), (1, 2, 2, 65, 130, 64, 64)),
         (dict(is_causal=True), (2, 4, 4, 300, 300, 128, 128)),
         (dict(enable_gqa=True, window=(40, 3), softcap=2.5), (1, 4, 2, 97, 520, 33, 17)),
         (dict(alibi_slopes=np.array([0.5, 0.1]), sinks=np.array([1.0, -2.0]),
               key_lengths=np.array([100, 7])), (2, 2, 2, 40, 130, 7, 9))]


@needs_hw
@pytest.mark.parametrize("i", range(len(CASES)))
def test_hardware_equals_emulation(i, monkeypatch):
    kw, (B, Hq, Hk, L, S, E, Ev) = CASES[i]
    rng = np.random.default_rng(20 + i)
    q, k, v = _qkv(rng, B, Hq, Hk, L, S, E, Ev, scale=2.0)
    mask = rng.random((L, S)) < 0.8
    monkeypatch.setattr(_backend, "kernels", _backend.load_variant("avx512bf16"))
    hw, hw_lse = _sdpa(q, k, v, mask, return_lse=True, **kw)
    em, em_lse = _sdpa(q, k, v, mask, emulate=True, return_lse=True, **kw)
    assert np.array_equal(_bits(hw), _bits(em)) and np.array_equal(_bits(hw_lse), _bits(em_lse))
    monkeypatch.setattr(_backend, "kernels", _backend.load_variant("avx512"))
    em2, em2_lse = _sdpa(q, k, v, mask, return_lse=True, **kw)
    assert np.array_equal(_bits(hw), _bits(em2))
    assert np.array_equal(_bits(hw_lse), _bits(em2_lse))


_CHILD = """
import json, sys, numpy as np, ml_dtypes, cyattn
from cyattn import _backend
rng = np.random.default_rng(3)
bf = ml_dtypes.bfloat16
q = rng.standard_normal((2, 4, 150, 64)).astype(bf)
k = rng.standard_normal((2, 2, 400, 64)).astype(bf)
v = rng.standard_normal((2, 2, 400, 48)).astype(bf)
out = cyattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                          causal_alignment="bottom_right", precision="fast")
print(json.dumps([_backend.variant, out.view(np.uint16).tobytes().hex()]))
"""


@needs_hw
def test_hardware_equals_emulation_across_processes():
    """CYATTN_BACKEND=avx512 (emulation) against the default (avx512bf16, vdpbf16ps)."""
    got = {}
    for backend in ("avx512", None):
        res = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                             env=child_env(backend, clear_backend=backend is None), timeout=120)
        assert res.returncode == 0, res.stderr
        name, bits = json.loads(res.stdout.strip().splitlines()[-1])
        got[backend or "default"] = (name, bits)
    assert got["avx512"][0] == "avx512" and got["default"][0] == "avx512bf16"
    assert got["avx512"][1] == got["default"][1]


# --- threads, routing, arguments -------------------------------------------------------------

@pytest.mark.parametrize("emulate", [True, pytest.param(False, marks=needs_hw)])
def test_thread_count_identity(emulate):
    rng = np.random.default_rng(30)
    q, k, v = _qkv(rng, 1, 3, 3, 700, 700, 64, 64)
    for kw in (dict(), dict(is_causal=True), dict(window=(100, 0), sinks=np.ones(3))):
        outs = [_sdpa(q, k, v, emulate=emulate, n_threads=n, return_lse=True, **kw)
                for n in (1, 2, 3)]
        for o, lse in outs[1:]:
            assert np.array_equal(_bits(o), _bits(outs[0][0]))
            assert np.array_equal(_bits(lse), _bits(outs[0][1]))


def test_default_precision():
    rng = np.random.default_rng(31)
    q, k, v = _qkv(rng, 1, 2, 2, 50, 60, 16, 16)
    default = cyattn.scaled_dot_product_attention(q, k, v)
    want = "fast" if _backend.bf16_fast_by_default(_backend.kernels) else "exact"
    assert np.array_equal(_bits(default), _bits(cyattn.scaled_dot_product_attention(
        q, k, v, precision=want)))
    exact = cyattn.scaled_dot_product_attention(q, k, v, precision="exact")
    ref = cyattn.scaled_dot_product_attention(*(t.astype(np.float32) for t in (q, k, v)))
    assert np.array_equal(_bits(exact), _bits(ref.astype(BF16)))


def test_routes_to_exact():
    """Decode (L <= 16), non-finite inputs and E = 0 run the exact path; other dtypes ignore
    precision."""
    rng = np.random.default_rng(32)
    q, k, v = _qkv(rng, 1, 2, 2, 16, 300, 32, 32)
    exact = cyattn.scaled_dot_product_attention(q, k, v, precision="exact")
    assert np.array_equal(_bits(_sdpa(q, k, v, emulate=True)), _bits(exact))
    q, k, v = _qkv(rng, 1, 2, 2, 40, 300, 32, 32)
    v[0, 1, 7, 3] = np.inf
    mask = np.ones((40, 300), bool)
    mask[:, 7] = False                       # the inf value is masked out: output finite
    got = _sdpa(q, k, v, mask, emulate=True)
    assert np.array_equal(_bits(got), _bits(cyattn.scaled_dot_product_attention(
        q, k, v, mask, precision="exact")))
    assert np.isfinite(got.astype(np.float32)).all()
    q0, k0 = np.zeros((1, 40, 0), BF16), np.zeros((1, 30, 0), BF16)
    v0 = _data(rng, (1, 30, 5))
    assert np.array_equal(_bits(_sdpa(q0, k0, v0, emulate=True)), _bits(
        cyattn.scaled_dot_product_attention(q0, k0, v0, precision="exact")))
    q32 = rng.standard_normal((2, 40, 8)).astype(np.float32)
    assert np.array_equal(cyattn.scaled_dot_product_attention(q32, q32, q32, precision="fast"),
                          cyattn.scaled_dot_product_attention(q32, q32, q32))


@pytest.mark.parametrize("bad", ["Fast", "bf16", 1, True, b"fast", ""])
def test_bad_precision(bad):
    q = np.ones((20, 4), BF16)
    out = np.full((20, 4), 7.0, BF16)
    with pytest.raises(ValueError, match=r"scaled_dot_product_attention: precision must be "
                                         r"None, 'exact' or 'fast', got"):
        cyattn.scaled_dot_product_attention(q, q, q, out=out, precision=bad)
    assert np.all(out.astype(np.float32) == 7.0)
    with pytest.raises(ValueError, match="precision"):
        cyattn.scaled_dot_product_attention(q.astype(np.float32), q, q, precision=bad)
    q32 = np.ones((20, 4), np.float32)      # float32 alone: the low-overhead path checks it too
    with pytest.raises(ValueError, match="precision"):
        cyattn.scaled_dot_product_attention(q32, q32, q32, precision=bad)


@pytest.mark.parametrize("emulate", [True, pytest.param(False, marks=needs_hw)])
def test_plain_calls_take_the_low_overhead_path(emulate, monkeypatch):
    """Calls without variant options (the adapters') run the fast path from the low-overhead
    entry, with the general path's bits (reached here through a no-op window)."""
    from cyattn import _validate

    def general_path(*args):
        raise AssertionError("the general path was entered")
    rng = np.random.default_rng(33)
    q, k, v = _qkv(rng, 2, 4, 2, 40, 300, 64, 48)
    mask = rng.random((2, 1, 40, 300)) < 0.8
    fmask = np.where(mask, 0.0, -np.inf).astype(np.float32)
    for kw in (dict(is_causal=True), dict(mask=mask, enable_gqa=True),
               dict(mask=fmask, enable_gqa=True, return_lse=True, scale=0.3)):
        kw = dict(kw)
        m = kw.pop("mask", None)
        if m is None:
            q_, k_, v_ = q, k[:, :1].repeat(4, axis=1), v[:, :1].repeat(4, axis=1)
        else:
            q_, k_, v_ = q, k, v
        ref = _sdpa(q_, k_, v_, m, emulate=emulate, window=(None, None), **kw)
        with monkeypatch.context() as patch:
            patch.setattr(_validate, "float_dtypes", general_path)
            got = _sdpa(q_, k_, v_, m, emulate=emulate, **kw)
        got, ref = (got, ref) if kw.get("return_lse") else ((got,), (ref,))
        for g, r in zip(got, ref):
            assert g.dtype == BF16 and np.array_equal(_bits(g), _bits(r))


def test_config_names_the_default_path():
    line = cyattn.config()["bf16_attention"]
    fast = _backend.bf16_fast_by_default(_backend.kernels)
    assert line.startswith("fast (" if fast else "exact (float32 FMAs)")
    assert _dot_name() in line          # vdpbf16ps, BFDOT, or the model of the build's rule


@pytest.mark.parametrize("S", [64, 65, 300])
def test_key_major_layouts(S):
    """K and V stored key-minor (their transposes contiguous: unit stride along the keys,
    the packing's transposing path for V^T), Q Fortran-ordered: the C-contiguous bits."""
    rng = np.random.default_rng(S)
    q = np.asfortranarray(_data(rng, (2, 50, 24)))
    kT, vT = _data(rng, (2, 24, S)), _data(rng, (2, 40, S))
    k, v = kT.transpose(0, 2, 1), vT.transpose(0, 2, 1)
    for emulate in (True, False) if HW else (True,):
        got = _sdpa(q, k, v, emulate=emulate, is_causal=True, causal_alignment="bottom_right")
        want = _sdpa(*(np.ascontiguousarray(t) for t in (q, k, v)), emulate=emulate,
                     is_causal=True, causal_alignment="bottom_right")
        assert np.array_equal(_bits(got), _bits(want))
    _check(q, k, v, is_causal=True, causal_alignment="bottom_right")
