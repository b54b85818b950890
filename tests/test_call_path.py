"""The public attention entries validate a call once (issue 46): scaled_dot_product_attention's
general path and attention_weights go through one ``_validate.describe_attention`` pass, which
converts and checks ``query`` exactly once, and the kernel paths take the description it builds
(nothing below re-validates). Counted by wrapping the validation functions."""
import numpy as np
import pytest

import cyattn
from cyattn import _validate as V


@pytest.fixture
def counted(monkeypatch):
    """Counts of describe_attention calls and of as_float_array conversions of ``query``
    (as_float_arrays converts through as_float_array)."""
    counts = {"describe": 0, "query": 0}
    describe, one = V.describe_attention, V.as_float_array

    def count_describe(*args, **kwargs):
        counts["describe"] += 1
        return describe(*args, **kwargs)

    def count_one(x, name, fname):
        counts["query"] += name == "query"
        return one(x, name, fname)

    monkeypatch.setattr(V, "describe_attention", count_describe)
    monkeypatch.setattr(V, "as_float_array", count_one)
    return counts


def _qkv(dtype=np.float32, L=5, S=7, E=4):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((2, L, E)).astype(dtype), rng.standard_normal((2, S, E)).astype(dtype),
            rng.standard_normal((2, S, E)).astype(dtype))


@pytest.mark.parametrize("case", ["sinks", "window", "list_query", "int8_kv", "weights"])
def test_query_is_validated_once(counted, case):
    q, k, v = _qkv()
    if case == "sinks":
        got = cyattn.scaled_dot_product_attention(q, k, v, sinks=np.zeros(2, np.float32))
    elif case == "window":
        got = cyattn.scaled_dot_product_attention(q, k, v, window=(2, 0), is_causal=True)
    elif case == "list_query":       # not an ndarray: the low-overhead path declines it
        got = cyattn.scaled_dot_product_attention(q.tolist(), k, v)
    elif case == "int8_kv":
        k8 = np.clip(np.round(k * 30), -127, 127).astype(np.int8)
        v8 = np.clip(np.round(v * 30), -127, 127).astype(np.int8)
        got = cyattn.scaled_dot_product_attention(q, k8, v8, key_scale=np.float32(1 / 30),
                                                  value_scale=np.float32(1 / 30))
    else:
        got = cyattn.attention_weights(q, k, window=(1, 1))
    assert np.isfinite(got).all()
    assert counted == {"describe": 1, "query": 1}


def test_bad_call_fails_in_the_one_pass(counted):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="key has S=7 rows"):
        cyattn.scaled_dot_product_attention(q, k, v[:, :6], sinks=np.zeros(2, np.float32))
    assert counted == {"describe": 1, "query": 1}


def test_kv8_module_does_not_call_back_into_validation():
    """_kv8 checks only the 8-bit K/V and their scales; the stand-ins that take part in the
    shape and dtype checks are made by _validate (the call goes down, not back up)."""
    import inspect

    from cyattn import _kv8
    assert "_validate" not in inspect.getsource(_kv8)
