"""Print a SHA-256 digest of the results of every public kernel function, per kernel variant.

For refactors that must not change a bit: run it on the old and the new build and compare,
e.g. ``PYTHONPATH=old/src python tools/bits_digest.py`` against ``PYTHONPATH=new/src ...``.
The inputs are the self-check cases (``cyattn._selfcheck.generate_cases``: every function,
masks, causal alignments, GQA, odd sizes and layouts) plus larger attention calls that take the
fused, decode and two-pass paths, and a MultiHeadAttention forward. Each result is hashed with
its dtype and shape; a call that raises is hashed as its exception type.
"""
import hashlib
import sys

import numpy as np

import cyattn
from cyattn import _backend
from cyattn._selfcheck import generate_cases


def _feed(h, value):
    if isinstance(value, tuple):
        for item in value:
            _feed(h, item)
    elif value is None:
        h.update(b"None")
    else:
        arr = np.ascontiguousarray(value)
        h.update(f"{arr.dtype}{arr.shape}".encode())
        h.update(arr.tobytes())


def _larger_calls(rng):
    """Attention calls past the self-check sizes: fused, decode, two-pass redo and MHA."""
    for dtype in (np.float32, np.float64):
        for (B, H, L, S, E) in ((1, 2, 300, 700, 64), (2, 2, 3, 2000, 32), (1, 1, 1, 5000, 128)):
            q = rng.standard_normal((B, H, L, E)).astype(dtype)
            k = rng.standard_normal((B, H, S, E)).astype(dtype)
            v = rng.standard_normal((B, H, S, E)).astype(dtype)
            mask = rng.random((B, 1, L, S)) < 0.8
            yield lambda: cyattn.scaled_dot_product_attention(q, k, v, return_lse=True)
            yield lambda: cyattn.scaled_dot_product_attention(
                q, k, v, mask, is_causal=True, causal_alignment="bottom_right", return_lse=True)
            v_bad = v.copy()
            v_bad[..., 5, :] = np.inf
            yield lambda: cyattn.scaled_dot_product_attention(q, k, v_bad, return_lse=True)
        mha = cyattn.MultiHeadAttention(64, 4, batch_first=True, dtype=dtype)
        params = {name: rng.standard_normal(p.shape).astype(dtype) * 0.2
                  for name, p in mha.state_dict().items()}
        mha.load_state_dict(params)
        x = rng.standard_normal((2, 37, 64)).astype(dtype)
        yield lambda: mha(x, x, x, need_weights=True)


def digest(variant):
    _backend.kernels = _backend.load_variant(variant)
    h = hashlib.sha256()
    for case in generate_cases(300, seed=0):
        inp = case.inputs
        try:
            if case.func in ("softmax", "log_softmax"):
                res = getattr(cyattn, case.func)(inp["x"], inp["axis"], mask=inp["mask"])
            elif case.func == "matmul_accumulate":
                res = inp["out"].copy()
                cyattn.matmul_accumulate(inp["a"], inp["b"], res, alpha=inp["alpha"])
            else:
                res = cyattn.scaled_dot_product_attention(
                    inp["query"], inp["key"], inp["value"], inp["attn_mask"], inp["is_causal"],
                    inp["scale"], causal_alignment=inp["causal_alignment"],
                    enable_gqa=inp["enable_gqa"], return_lse=True)
        except Exception as exc:  # the same error is the same result
            res = type(exc).__name__
            h.update(res.encode())
            continue
        _feed(h, res)
    for call in _larger_calls(np.random.default_rng(1)):
        _feed(h, call())
    return h.hexdigest()


def main():
    # the opt-in variants this CPU runs too (neon on aarch64), as the tests do
    for variant in _backend.available_variants() + _backend.runnable_opt_in():
        print(variant, digest(variant))
    return 0


if __name__ == "__main__":
    sys.exit(main())
