"""bfloat16 (``ml_dtypes.bfloat16``) inputs: accepted by every function, computed in float32 and
rounded once to bfloat16 (attention, softmax and matmul_accumulate read bfloat16 in their
kernels, see test_half_kv.py, test_half_softmax.py and test_half_matmul.py; MHA converts to
float32 copies).

A bfloat16 call must give exactly the float32 call on the same (bfloat16-valued) inputs, rounded
to bfloat16: the same arithmetic, one rounding at the end. For attention that is
``precision="exact"`` (the default where the kernels have no bf16 dot product; the fast path's
contract is tested in test_bf16_attention_fast.py).
"""
import subprocess
import sys

import numpy as np
import pytest
from conftest import child_env

import cyattn

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)


def _bits(a):
    return np.asarray(a).view(np.uint16)


def _data(rng, shape):
    return rng.standard_normal(shape).astype(BF16)


def test_sdpa_equals_float32_rounded_once(variant):
    rng = np.random.default_rng(0)
    for (L, S) in ((3, 2000), (70, 600), (2, 9)):
        q, k, v = _data(rng, (2, 4, L, 16)), _data(rng, (2, 2, S, 16)), _data(rng, (2, 2, S, 8))
        mask = rng.random((2, 1, L, S)) < 0.8
        kw = dict(is_causal=True, causal_alignment="bottom_right", enable_gqa=True,
                  window=(50, 0), sinks=np.array([0.5, 1.0, -1.0, 2.0]), return_lse=True,
                  precision="exact")
        out, lse = cyattn.scaled_dot_product_attention(q, k, v, mask, **kw)
        ref, ref_lse = cyattn.scaled_dot_product_attention(
            *(t.astype(np.float32) for t in (q, k, v)), mask, **kw)
        assert out.dtype == BF16 and lse.dtype == BF16
        assert np.array_equal(_bits(out), _bits(ref.astype(BF16)))
        assert np.array_equal(_bits(lse), _bits(ref_lse.astype(BF16)))
        held = np.zeros(out.shape, BF16)[..., ::-1]              # a strided bfloat16 out=
        res = cyattn.scaled_dot_product_attention(q, k, v, mask, out=held, **dict(
            kw, return_lse=False))
        assert res is held and np.array_equal(_bits(held), _bits(out))


def test_softmax_matmul_weights_equal_float32_rounded_once(variant):
    rng = np.random.default_rng(1)
    x = _data(rng, (6, 300))
    mask = _data(rng, (300,))
    for fn in (cyattn.softmax, cyattn.log_softmax):
        got = fn(x, mask=mask)
        assert got.dtype == BF16
        assert np.array_equal(_bits(got), _bits(fn(x.astype(np.float32),
                                                   mask=mask.astype(np.float32)).astype(BF16)))
    a, b = _data(rng, (5, 300)), _data(rng, (300, 7))
    out = _data(rng, (5, 7))
    ref = out.astype(np.float32)
    cyattn.matmul_accumulate(a.astype(np.float32), b.astype(np.float32), ref)
    cyattn.matmul_accumulate(a, b, out)
    assert np.array_equal(_bits(out), _bits(ref.astype(BF16)))
    q, k = _data(rng, (2, 9, 8)), _data(rng, (2, 40, 8))
    w = cyattn.attention_weights(q, k, is_causal=True)
    assert w.dtype == BF16
    assert np.array_equal(_bits(w), _bits(cyattn.attention_weights(
        q.astype(np.float32), k.astype(np.float32), is_causal=True).astype(BF16)))


@pytest.mark.parametrize("other,expected", [(BF16, BF16), (np.float16, np.float32),
                                            (np.float32, np.float32),
                                            (np.float64, np.float64)])
def test_promotion(other, expected):
    rng = np.random.default_rng(2)
    q = _data(rng, (3, 8))
    k = rng.standard_normal((5, 8)).astype(other)
    assert cyattn.scaled_dot_product_attention(q, k, k).dtype == expected


def test_out_of_another_dtype_is_refused_and_untouched():
    q = np.ones((2, 4), BF16)
    out = np.full((2, 4), 3.0, np.float32)
    with pytest.raises(ValueError, match="out has dtype float32; expected bfloat16"):
        cyattn.scaled_dot_product_attention(q, q, q, out=out)
    assert (out == 3.0).all()


def test_import_cyattn_does_not_import_ml_dtypes():
    code = "import sys, cyattn; print('ml_dtypes' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=child_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_bfloat16_sinks_and_slopes_are_accepted():
    """Per-head options given in bfloat16 (as a bfloat16 model holds them, e.g. gpt-oss's
    sinks) were refused as 'not a real array' once."""
    rng = np.random.default_rng(3)
    q, k, v = _data(rng, (1, 2, 3, 8)), _data(rng, (1, 2, 6, 8)), _data(rng, (1, 2, 6, 8))
    sinks, slopes = np.array([0.5, -1.0], BF16), np.array([0.25, 0.5], BF16)
    got = cyattn.scaled_dot_product_attention(q, k, v, sinks=sinks, alibi_slopes=slopes)
    ref = cyattn.scaled_dot_product_attention(q, k, v, sinks=sinks.astype(np.float32),
                                              alibi_slopes=slopes.astype(np.float32))
    assert np.array_equal(_bits(got), _bits(ref))
