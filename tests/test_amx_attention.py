"""bfloat16 prefill attention on AMX tiles (issue 45), through the tiles' portable model on
every host (``emulate="amx"``), and on the hardware where the amx variant loads.

* Within the bound of ``precision="fast"`` (scaled_dot_product_attention's Notes) against the
  float64 reference on the same bf16 values, for the shapes and every option the vdpbf16ps
  fast path is tested with (masks, causal both alignments, windows, softcap, sinks, ALiBi,
  key/query lengths, GQA, lse, strided inputs, subnormals, long rows).
* The tile path really runs: its float32 results differ from vdpbf16ps's order somewhere and
  agree within the bound; 1, 2 and 3 threads bit-identical.
* On an AMX host (tools/amx_check.sh): the hardware equals the model bit for bit, and the amx
  variant's default precision runs on the tiles.
"""
import numpy as np
import pytest
from test_bf16_attention_fast import CASES, OPTIONS, SHAPES, _bits, _check, _qkv, _sdpa

from cyattn import _backend

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)


def _amx_kernels():
    try:
        return _backend.load_variant("amx")
    except ImportError:
        return None


AMX_K = _amx_kernels()
needs_amx = pytest.mark.skipif(AMX_K is None, reason="no AMX here: the amx variant cannot load")


@pytest.mark.parametrize("L,S,E,Ev", SHAPES)
def test_tiles_dense_within_bound(L, S, E, Ev):
    rng = np.random.default_rng(L * 1000 + S)
    q, k, v = _qkv(rng, 1, 2, 2, L, S, E, Ev, scale=2.0)
    _check(q, k, v, emulate="amx")


@pytest.mark.parametrize("name", list(OPTIONS))
def test_tiles_options_within_bound(name):
    kw = dict(OPTIONS[name])
    rng = np.random.default_rng(len(name))
    hk = 2 if kw.get("enable_gqa") else 4
    q, k, v = _qkv(rng, 2, 4, hk, 210, 300, 72, 40, scale=1.5)
    _check(q, k, v, emulate="amx", **kw)


@pytest.mark.parametrize("kind", ["bool", "float_neg_inf"])
def test_tiles_masks_within_bound(kind):
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, 2, 3, 3, 70, 290, 33, 20)
    if kind == "bool":
        mask = rng.random((2, 3, 70, 290)) < 0.7
        mask[0, 1, 5] = False                                   # a fully masked row
        mask[1, :, :, 0:256] = False                            # an all-False block
    else:
        mask = np.where(rng.random((70, 290)) < 0.6, 0.0, -np.inf).astype(np.float32)
        mask[3] = -np.inf
    out, _ = _check(q, k, v, mask, emulate="amx", is_causal=kind == "bool")
    if kind == "bool":
        assert not np.any(out[0, 1, 5].astype(np.float32))


def test_tiles_strided_long_rows_and_subnormals():
    rng = np.random.default_rng(7)
    base = rng.standard_normal((3, 2, 100, 2 * 65)).astype(BF16)
    q = base[..., ::2][:, :, ::-1]
    k = np.asfortranarray(rng.standard_normal((3, 2, 33, 65)).astype(BF16))
    v = rng.standard_normal((2, 33, 3, 7)).astype(BF16).transpose(2, 0, 1, 3)
    _check(q, k, v, emulate="amx")
    same = _sdpa(*(np.ascontiguousarray(t) for t in (q, k, v)), emulate="amx")
    assert np.array_equal(_bits(_sdpa(q, k, v, emulate="amx")), _bits(same))
    q, k, v = _qkv(rng, 1, 2, 2, 40, 2050, 64, 64, scale=4.0)
    _check(q, k, v, emulate="amx", is_causal=True, causal_alignment="bottom_right")
    q, k, v = _qkv(rng, 1, 1, 1, 40, 50, 16, 8)
    q[0, 0, :, :3] = np.array(2.0 ** -130, BF16)
    k[0, 0, :5] = np.array(-(2.0 ** -128), BF16)
    _check(q, k, v, emulate="amx")


def _kernel_f32(q, k, v, emulate, tiles):
    """The float32 result of the bf16 kernel entry (before the bf16 rounding of the output)."""
    B, H, L, E = q.shape
    S, Ev = k.shape[-2], v.shape[-1]
    qq, kk, vv = (np.ascontiguousarray(t).reshape(B * H, -1, t.shape[-1]).view(np.uint16)
                  for t in (q, k, v))
    off = np.arange(B * H, dtype=np.int64)
    out = np.zeros((B * H, L, Ev), np.float32)
    lse = np.zeros((B * H, L), np.float32)
    redo = _backend.kernels.attention_bf16(
        qq, off * L * E, E, 1, kk, off * S * E, E, 1, vv, off * S * Ev, Ev, 1, None, 0,
        np.zeros(B * H, np.int64), 0, 0, out, lse, L, S, E, Ev, E ** -0.5, False, False, True,
        1, emulate=emulate, tiles=tiles)
    assert not redo
    return out


def test_tiles_path_runs_and_differs_from_vdpbf16ps_order():
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, 1, 2, 2, 64, 700, 64, 64)
    tiles = _kernel_f32(q, k, v, emulate=True, tiles=True)
    dot = _kernel_f32(q, k, v, emulate=True, tiles=False)
    assert not np.array_equal(tiles.view(np.uint32), dot.view(np.uint32))
    np.testing.assert_allclose(tiles, dot, rtol=0, atol=0.02)


@pytest.mark.parametrize("i", range(len(CASES)))
def test_tiles_bit_identical_across_threads(i):
    kw, (B, Hq, Hk, L, S, E, Ev) = CASES[i]
    rng = np.random.default_rng(20 + i)
    q, k, v = _qkv(rng, B, Hq, Hk, L, S, E, Ev, scale=2.0)
    mask = rng.random((L, S)) < 0.8
    res = [_sdpa(q, k, v, mask, emulate="amx", return_lse=True, n_threads=t, **kw)
           for t in (1, 2, 3)]
    for out, lse in res[1:]:
        assert np.array_equal(_bits(out), _bits(res[0][0]))
        assert np.array_equal(_bits(lse), _bits(res[0][1]))


@needs_amx
@pytest.mark.parametrize("i", range(len(CASES)))
def test_hardware_tiles_equal_model(i, monkeypatch):
    kw, shape = CASES[i]
    check_hardware_equals_model(kw, shape, 20 + i, monkeypatch)


def check_hardware_equals_model(kw, shape, seed, monkeypatch):
    """The amx variant's tiles give the model build's bits (output and lse, 1 and 2 threads),
    and its default bf16 call is the tile path; test_amx_decode uses it for the decode shapes."""
    B, Hq, Hk, L, S, E, Ev = shape
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, B, Hq, Hk, L, S, E, Ev, scale=2.0)
    mask = rng.random((L, S)) < 0.8
    monkeypatch.setattr(_backend, "kernels", AMX_K)
    for threads in (1, 2):
        hw = _sdpa(q, k, v, mask, return_lse=True, n_threads=threads, **kw)
        model = _sdpa(q, k, v, mask, emulate="amx", return_lse=True, n_threads=threads, **kw)
        assert np.array_equal(_bits(hw[0]), _bits(model[0]))
        assert np.array_equal(_bits(hw[1]), _bits(model[1]))
    dflt = _sdpa(q, k, v, mask, precision=None, **kw)             # the amx default: tiles
    assert np.array_equal(_bits(dflt), _bits(_sdpa(q, k, v, mask, emulate="amx", **kw)))
