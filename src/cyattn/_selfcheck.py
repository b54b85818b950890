"""Self-check of the compiled kernels against :mod:`cyattn.oracle` (``python -m cyattn check``).

:func:`generate_cases` draws small random cases from a seed: float32 and float64; row lengths,
matrix and attention sizes either side of the kernels' vector and block widths, including 0, 1
and odd sizes; no mask, bool masks (True = take part) and float masks with ``-inf`` entries,
fully masked rows, broadcast masks, key-padding masks with NaN in the padded keys and values;
``is_causal`` with both alignments, explicit and default scales, batch broadcasting, grouped
query heads and non-contiguous layouts. :func:`run_case` calls the public cyattn function and
the pure-Python oracle on the same values and compares them with per-dtype tolerances (NaN
must match NaN, infinities must match in sign). Sizes are kept small because the oracle is
pure Python: 300 cases take about a second.

Functions are looked up on the :mod:`cyattn` package at call time, so a test can swap one for
a broken stand-in and see the check fail.
"""
import math
import time

import numpy as np

__all__ = ["TOLERANCES", "Case", "generate_cases", "run_case", "compare", "run_check"]

#: Relative tolerance per dtype; the absolute tolerance is the same number times the largest
#: finite magnitude of the expected result (at least 1), which covers cancellation.
TOLERANCES = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 2e-5}

_KINDS = ("softmax", "log_softmax", "matmul_accumulate", "scaled_dot_product_attention",
          "scaled_dot_product_attention")

# Sizes either side of the kernels' widths (32 softmax lanes, the 4 x 24 GEMM tile, 64-row
# query blocks), weighted towards the small ones the oracle handles quickly.
_ROW_SIZES = (0, 1, 1, 2, 3, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65)
_MAT_SIZES = (0, 1, 1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 23, 24, 25)
_SEQ_SIZES = (0, 1, 1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33)
_HEAD_SIZES = (0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 17)


class Case:
    """One self-check case: the function name, its parameters (for messages) and its inputs."""

    __slots__ = ("index", "func", "dtype", "params", "inputs")

    def __init__(self, index, func, dtype, params, inputs):
        self.index = index
        self.func = func
        self.dtype = np.dtype(dtype)
        self.params = params
        self.inputs = inputs

    def describe(self):
        parts = [f"dtype={self.dtype.name}"]
        parts += [f"{k}={v}" for k, v in self.params.items()]
        return f"#{self.index} {self.func}(" + ", ".join(parts) + ")"


# ------------------------------------------------------------------------------------------
# Case generation
# ------------------------------------------------------------------------------------------


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _data(rng, shape, dtype, scale=1.5):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def _layout(rng, arr):
    """``arr`` (values unchanged) in a random memory layout; returns (array, layout name)."""
    kind = _pick(rng, ("C", "C", "C", "F", "strided", "reversed"))
    if arr.ndim == 0 or arr.size == 0 or kind == "C":
        return np.ascontiguousarray(arr), "C"
    if kind == "F":
        return np.asfortranarray(arr), "F"
    if kind == "strided":
        big = np.zeros(arr.shape[:-1] + (2 * arr.shape[-1],), dtype=arr.dtype)
        big[..., ::2] = arr
        return big[..., ::2], "strided"
    rev = np.ascontiguousarray(arr[..., ::-1])
    return rev[..., ::-1], "reversed"


def _bool_mask(rng, shape, keep=0.7, full_rows=True):
    mask = rng.random(shape) < keep
    if full_rows and mask.ndim >= 1 and mask.size and rng.random() < 0.5:
        rows = mask.reshape(-1, mask.shape[-1])
        rows[int(rng.integers(rows.shape[0]))] = False      # one fully masked row
    return mask


def _float_mask(rng, shape, dtype, full_rows=True):
    mask = rng.uniform(-2.0, 2.0, shape)
    mask[rng.random(shape) < 0.25] = -np.inf
    if full_rows and mask.ndim >= 1 and mask.size and rng.random() < 0.5:
        rows = mask.reshape(-1, mask.shape[-1])
        rows[int(rng.integers(rows.shape[0]))] = -np.inf    # one fully masked row
    return mask.astype(dtype)


def _softmax_case(rng, index, func, dtype):
    for _ in range(100):
        ndim = _pick(rng, (1, 2, 2, 3))
        shape = [_pick(rng, _ROW_SIZES) for _ in range(ndim)]
        for d in range(ndim - 1):
            shape[d] = min(shape[d], _pick(rng, (1, 2, 3, 4, 5)))
        if math.prod(shape) <= 400:
            break
    shape = tuple(shape)
    axis = int(rng.integers(-ndim, ndim))
    x = _data(rng, shape, dtype, scale=_pick(rng, (1.0, 3.0, 10.0)))
    values = _pick(rng, ("normal", "normal", "normal", "-inf", "-inf row", "nan/+inf"))
    if x.size:
        if values == "-inf":
            x[rng.random(shape) < 0.2] = -np.inf
        elif values == "-inf row":
            xm = np.moveaxis(x, axis, -1)                   # a view: writes go into x
            xm[tuple(int(rng.integers(n)) for n in xm.shape[:-1])] = -np.inf
        elif values == "nan/+inf":
            x.reshape(-1)[int(rng.integers(x.size))] = _pick(rng, (np.nan, np.inf))
    mask_kind = _pick(rng, ("none", "bool", "float", "bool broadcast"))
    mask = None
    if mask_kind == "bool":
        mask = np.moveaxis(_bool_mask(rng, np.moveaxis(x, axis, -1).shape), -1, axis)
    elif mask_kind == "float":
        mask = np.moveaxis(_float_mask(rng, np.moveaxis(x, axis, -1).shape, dtype), -1, axis)
    elif mask_kind == "bool broadcast":
        mshape = tuple(1 if rng.random() < 0.5 else s for s in shape)
        mask = _bool_mask(rng, mshape, full_rows=False)
    x, layout = _layout(rng, x)
    params = {"shape": shape, "axis": axis, "values": values, "mask": mask_kind,
              "layout": layout}
    return Case(index, func, dtype, params, {"x": x, "axis": axis, "mask": mask})


def _matmul_case(rng, index, dtype):
    for _ in range(100):
        M, K, N = (_pick(rng, _MAT_SIZES) for _ in range(3))
        if rng.random() < 0.1:
            K = _pick(rng, (31, 32, 33, 64, 65))
        batch = _pick(rng, ((), (), (), (2,), (3,), (2, 2)))
        if math.prod(batch) * M * N * max(K, 1) <= 8000:
            break
    bcast = _pick(rng, ("none", "a", "b", "both")) if batch else "none"
    a_batch = (1,) * len(batch) if bcast in ("a",) else batch
    b_batch = () if bcast == "b" else batch
    if bcast == "both" and len(batch) == 2:
        a_batch, b_batch = (batch[0], 1), (1, batch[1])
    a = _data(rng, a_batch + (M, K), dtype)
    b = _data(rng, b_batch + (K, N), dtype)
    out = _data(rng, batch + (M, N), dtype)
    alpha = float(_pick(rng, (1.0, 1.0, -0.5, 2.0, 0.0)))
    a, layout_a = _layout(rng, a)
    b, layout_b = _layout(rng, b)
    params = {"a": a.shape, "b": b.shape, "out": out.shape, "alpha": alpha,
              "layout": f"{layout_a}/{layout_b}"}
    return Case(index, "matmul_accumulate", dtype, params,
                {"a": a, "b": b, "out": out, "alpha": alpha})


def _sdpa_case(rng, index, dtype):
    for _ in range(200):
        L, S = _pick(rng, _SEQ_SIZES), _pick(rng, _SEQ_SIZES)
        if rng.random() < 0.08:
            L = _pick(rng, (63, 64, 65))                    # query block edge
        E, Ev = _pick(rng, _HEAD_SIZES), _pick(rng, _HEAD_SIZES)
        batch = _pick(rng, ((), (), (1,), (2,), (3,), (2, 2), (1, 4)))
        if math.prod(batch) * L * max(S, 1) * (E + Ev + 2) <= 8000:
            break
    gqa = len(batch) >= 1 and batch[-1] in (2, 4) and rng.random() < 0.3
    kv_batch = batch
    if gqa:
        kv_batch = batch[:-1] + (_pick(rng, tuple(h for h in (1, 2) if batch[-1] % h == 0)),)
    elif batch and rng.random() < 0.25:
        kv_batch = (1,) * len(batch)                        # key/value broadcast over batch
    q = _data(rng, batch + (L, E), dtype, scale=1.0)
    k = _data(rng, kv_batch + (S, E), dtype, scale=1.0)
    v = _data(rng, kv_batch + (S, Ev), dtype, scale=1.0)
    mask_kind = _pick(rng, ("none", "none", "bool", "float", "bool padding", "float broadcast"))
    mask = None
    if mask_kind == "bool":
        mask = _bool_mask(rng, _pick(rng, (batch, ())) + (L, S))
    elif mask_kind == "float":
        mask = _float_mask(rng, _pick(rng, (batch, ())) + (L, S), dtype)
    elif mask_kind == "bool padding":
        # Key padding: the padded keys are False for every query and hold NaN in K and V, which
        # must never be read.
        mask = rng.random(kv_batch + (1, S)) < 0.7 if not gqa else rng.random((1, S)) < 0.7
        if S:
            pad = ~np.broadcast_to(mask, kv_batch + (1, S))[..., 0, :]
            k[pad] = np.nan
            v[pad] = np.nan
    elif mask_kind == "float broadcast":
        mask = _float_mask(rng, (1, S), dtype, full_rows=False)
    is_causal = bool(rng.random() < 0.4)
    alignment = _pick(rng, ("top_left", "bottom_right"))
    scale = None if rng.random() < 0.6 else float(_pick(rng, (0.0, 0.125, 0.5, 1.0, 2.0)))
    q, layout = _layout(rng, q)
    params = {"query": q.shape, "key": k.shape, "value": v.shape, "mask": mask_kind,
              "mask_shape": None if mask is None else mask.shape, "is_causal": is_causal,
              "causal_alignment": alignment, "scale": scale, "enable_gqa": gqa,
              "layout": layout}
    return Case(index, "scaled_dot_product_attention", dtype, params,
                {"query": q, "key": k, "value": v, "attn_mask": mask, "is_causal": is_causal,
                 "scale": scale, "causal_alignment": alignment, "enable_gqa": gqa})


def generate_cases(count=300, seed=0):
    """``count`` cases drawn from ``seed``, cycling through the functions (SDPA twice as often).

    Case ``i`` depends only on ``(seed, i)``, so a failing case can be reproduced alone.
    """
    cases = []
    for i in range(count):
        rng = np.random.default_rng([seed, i])
        func = _KINDS[i % len(_KINDS)]
        dtype = np.float32 if (i // len(_KINDS)) % 2 == 0 else np.float64
        if func in ("softmax", "log_softmax"):
            cases.append(_softmax_case(rng, i, func, dtype))
        elif func == "matmul_accumulate":
            cases.append(_matmul_case(rng, i, dtype))
        else:
            cases.append(_sdpa_case(rng, i, dtype))
    return cases


# ------------------------------------------------------------------------------------------
# Running and comparing
# ------------------------------------------------------------------------------------------


def compare(got, expected, dtype):
    """None if ``got`` matches ``expected`` within ``dtype``'s tolerance, else a message."""
    got = np.asarray(got)
    expected = np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        return f"shape {got.shape}, expected {expected.shape}"
    if got.size == 0:
        return None
    g = got.astype(np.float64)
    nan_g, nan_e = np.isnan(g), np.isnan(expected)
    if (nan_g != nan_e).any():
        idx = tuple(int(i) for i in np.argwhere(nan_g != nan_e)[0])
        return f"NaN pattern differs at {idx}: got {g[idx]!r}, expected {expected[idx]!r}"
    inf_e = np.isinf(expected)
    inf_bad = (np.isinf(g) != inf_e) | (inf_e & (g != expected))
    if inf_bad.any():
        idx = tuple(int(i) for i in np.argwhere(inf_bad)[0])
        return f"infinity differs at {idx}: got {g[idx]!r}, expected {expected[idx]!r}"
    finite = np.isfinite(expected)
    if not finite.any():
        return None
    rtol = TOLERANCES[np.dtype(dtype)]
    atol = rtol * max(1.0, float(np.abs(expected[finite]).max()))
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(finite, np.abs(g - expected), 0.0)
    bound = atol + rtol * np.abs(np.where(finite, expected, 0.0))
    bad = err > bound
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        worst = float((err / bound).max())
        return (f"error {err[idx]:.3g} > tolerance {bound[idx]:.3g} at {idx}: got {g[idx]!r}, "
                f"expected {expected[idx]!r} (worst error/tolerance {worst:.3g})")
    return None


def _tolist(arr):
    return None if arr is None else np.asarray(arr).tolist()


def _run_softmax(case, cyattn, oracle):
    x, axis, mask = case.inputs["x"], case.inputs["axis"], case.inputs["mask"]
    x_before = x.copy()
    got = getattr(cyattn, case.func)(x, axis, mask=mask)
    if not np.array_equal(x, x_before, equal_nan=True):
        return "the input x was modified"
    if got.dtype != case.dtype:
        return f"result dtype {got.dtype}, expected {case.dtype}"
    if x.size == 0:
        return compare(got, np.zeros(x.shape), case.dtype)
    full_mask = None if mask is None else np.broadcast_to(mask, x.shape)
    expected = getattr(oracle, case.func)(_tolist(x), axis, mask=_tolist(full_mask))
    return compare(got, expected, case.dtype)


def _run_matmul(case, cyattn, oracle):
    a, b, out, alpha = (case.inputs[n] for n in ("a", "b", "out", "alpha"))
    out_k = out.copy()
    res = cyattn.matmul_accumulate(a, b, out_k, alpha=alpha)
    if res is not out_k:
        return "matmul_accumulate did not return out"
    if out_k.dtype != case.dtype:
        return f"out dtype changed to {out_k.dtype}"
    if out.size == 0:
        return compare(out_k, np.zeros(out.shape), case.dtype)
    batch, (M, K) = out.shape[:-2], a.shape[-2:]
    N = b.shape[-1]
    if 0 in (M, N, K) and batch:
        # Nested lists cannot carry empty inner dims under batch dims: out + alpha*0 = out.
        expected = out.astype(np.float64)
    else:
        expected = oracle.matmul_accumulate(
            _tolist(np.broadcast_to(a, batch + (M, K))),
            _tolist(np.broadcast_to(b, batch + (K, N))), _tolist(out), alpha=alpha)
    return compare(out_k, expected, case.dtype)


def _run_sdpa(case, cyattn, oracle):
    inp = case.inputs
    q, k, v, mask = inp["query"], inp["key"], inp["value"], inp["attn_mask"]
    got, lse = cyattn.scaled_dot_product_attention(
        q, k, v, mask, inp["is_causal"], inp["scale"], causal_alignment=inp["causal_alignment"],
        enable_gqa=inp["enable_gqa"], return_lse=True)
    if got.dtype != case.dtype or lse.dtype != case.dtype:
        return f"result dtypes {got.dtype}/{lse.dtype}, expected {case.dtype}"
    L, E = q.shape[-2:]
    S, Ev = v.shape[-2:]
    if inp["enable_gqa"]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if math.prod(batch) * L == 0:
        err = compare(got, np.zeros(batch + (L, Ev)), case.dtype)
        return err or compare(lse, np.zeros(batch + (L,)), case.dtype)
    full_mask = None if mask is None else np.broadcast_to(mask, batch + (L, S))
    expected, expected_lse = oracle.scaled_dot_product_attention(
        _tolist(np.broadcast_to(q, batch + (L, E))), _tolist(np.broadcast_to(k, batch + (S, E))),
        _tolist(np.broadcast_to(v, batch + (S, Ev))), _tolist(full_mask), inp["is_causal"],
        inp["scale"], causal_alignment=inp["causal_alignment"], return_lse=True, value_dim=Ev)
    if Ev == 0:
        err = compare(got, np.zeros(batch + (L, 0)), case.dtype)
    else:
        err = compare(got, expected, case.dtype)
    if err:
        return "output: " + err
    err = compare(lse, expected_lse, case.dtype)
    return "lse: " + err if err else None


def run_case(case):
    """None if the compiled function agrees with the oracle on ``case``, else a message."""
    import cyattn
    from cyattn import oracle
    try:
        if case.func in ("softmax", "log_softmax"):
            return _run_softmax(case, cyattn, oracle)
        if case.func == "matmul_accumulate":
            return _run_matmul(case, cyattn, oracle)
        return _run_sdpa(case, cyattn, oracle)
    except Exception as exc:  # a crash is a mismatch too, reported with the case
        return f"raised {type(exc).__name__}: {exc}"


def run_check(count=300, seed=0, out=print):
    """Run ``count`` cases; report each mismatch and a summary line. Returns the mismatch count."""
    t0 = time.perf_counter()
    cases = generate_cases(count, seed)
    per_func = {}
    failures = 0
    for case in cases:
        per_func[case.func] = per_func.get(case.func, 0) + 1
        err = run_case(case)
        if err:
            failures += 1
            out(f"MISMATCH {case.describe()}: {err}")
    elapsed = time.perf_counter() - t0
    counts = ", ".join(f"{name} {n}" for name, n in per_func.items())
    out(f"check: {count - failures}/{count} cases match the oracle "
        f"({counts}; seed {seed}; {elapsed:.1f} s)")
    return failures
