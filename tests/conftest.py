"""Shared fixtures and helpers of the cyattn test suite.

* ``variant``: runs a test once per compiled kernel variant this machine can run, by pointing
  ``cyattn._backend.kernels`` (which the public functions look up at call time) at it.
* ``TOLERANCES`` / :func:`tol` / :func:`assert_close`: the per-dtype tolerances, set here and
  nowhere else (DESIGN section 5).
* :func:`to_oracle` / :func:`from_oracle`: NumPy arrays <-> the oracle's nested lists.
* ``oracle_*``: the pure-Python oracle applied to broadcast NumPy inputs (the oracle itself
  does not broadcast), and NumPy float64 references for sizes too big for the oracle
  (``*_sdpa_variants``: with issue 24's window, softcap, sinks, ALiBi and lengths).
* :func:`call_checked`: call a public function and assert that no input array was modified;
  :func:`no_warnings`: a block in which any warning or floating-point error is an error;
  :func:`freeze`: make arrays read-only.
* :func:`layout_variants`: the same data in other memory layouts (Fortran, transposed and
  reversed views, slices, a misaligned byte-offset buffer, read-only); the builders
  :func:`transposed_view`, :func:`misaligned` and :func:`read_only` on their own.
* :func:`mha_params`: random multi-head attention parameters (packed or separate weights).
* :func:`run_forked`: run a function in a forked child and collect what it sends, failing
  (instead of hanging) when the child deadlocks; :func:`child_env`: the environment for a
  child interpreter that must import the same cyattn as this process.
* :class:`FakeTorchMHA` / :class:`FakeTensor`: a duck-typed torch.nn.MultiheadAttention for
  ``MultiHeadAttention.from_torch`` without torch.
"""
import contextlib
import math
import multiprocessing
import os
import sysconfig
import warnings

# Some hosts (this project's CI machines among them) set OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE in
# every environment. They slow NumPy's OpenBLAS, and the bench tests that set one of them to
# check the bench's re-run without them expect it alone: the suite and its child processes
# run without them (popped before this file imports NumPy; the shell that ran pytest keeps
# them). The names are cyattn._bench.timing.BLAS_ENV_VARS, spelled out here because importing
# cyattn would import NumPy first: keep the two in step.
for _name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
    os.environ.pop(_name, None)

import numpy as np
import pytest

import cyattn
from cyattn import _backend, oracle

# the variants the dispatcher may pick, and the opt-in ones this CPU runs (neon on aarch64)
VARIANTS = _backend.available_variants() + _backend.runnable_opt_in()

FLOAT_DTYPES = (np.float16, np.float32, np.float64)


ALLOCATION_REFUSAL_MARKER = (
    "allocation_refusal(what): the test requests more memory than any machine has and expects "
    "the refusal (MemoryError). Under AddressSanitizer with allocator_may_return_null=1 the "
    "refusal also writes a 'failed to allocate' warning, not a report: tools/sanitize_check.sh "
    "runs these tests apart and expects exactly that warning from them")


def pytest_configure(config):
    # Also declared in pyproject.toml; registered here so the suite works from any rootdir.
    config.addinivalue_line("markers", "slow: long-running tests (skipped with -m 'not slow')")
    config.addinivalue_line("markers", ALLOCATION_REFUSAL_MARKER)


def pytest_collection_modifyitems(config, items):
    """CYATTN_ALLOCATION_REFUSALS=skip / only (set by tools/sanitize_check.sh): deselect the
    tests marked allocation_refusal, or all the others; unset: run everything."""
    mode = os.environ.get("CYATTN_ALLOCATION_REFUSALS", "")
    if mode not in ("skip", "only"):
        return
    keep, drop = [], []
    for item in items:
        marked = item.get_closest_marker("allocation_refusal") is not None
        (keep if marked == (mode == "only") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(params=VARIANTS)
def variant(request, monkeypatch):
    """Name of the kernel variant this test runs on (``_backend.kernels`` is patched)."""
    module = _backend.load_variant(request.param)
    monkeypatch.setattr(_backend, "kernels", module)
    return request.param


# ------------------------------------------------------------------------------------------
# Tolerances: the ONE place they are set. Widening one needs a comment saying why.
# ------------------------------------------------------------------------------------------

TOLERANCES = {
    np.dtype(np.float64): {"rtol": 1e-12, "atol": 1e-13},
    np.dtype(np.float32): {"rtol": 2e-5, "atol": 2e-6},
    # float16 results are computed in float32 and rounded once to float16 (half ulp = 4.9e-4).
    np.dtype(np.float16): {"rtol": 2e-3, "atol": 1e-4},
}

# bfloat16 results of cyattn.torch (no NumPy dtype, so keyed by name): computed in float32 and
# rounded once to bfloat16, whose half ulp is 2^-9 = 1.95e-3 relative.
BFLOAT16_TOLERANCE = {"rtol": 4e-3, "atol": 1e-5}

# Sentence encoder (cyattn.encoder, tests/test_minilm.py and tests/test_encoder*.py): bounds of
# issue 3 against the sentence-transformers reference (float32; a careful float32 forward
# reaches ~2e-7), and, where bits may differ (NumPy's BLAS backend), a text alone vs in a batch.
MINILM_MIN_COSINE = 0.999999
MINILM_MAX_ABS_DIFF = 2e-5
MINILM_BATCH_INVARIANCE_ATOL = 1e-6


def tol(dtype, k=1):
    """(rtol, atol) for results of ``dtype``; ``k`` is the length of the longest sum behind a
    result (matmul K, attention E + S): rounding errors of a k-term sum grow like sqrt(k), so
    atol is scaled by sqrt(k) (rtol is not)."""
    t = TOLERANCES[np.dtype(dtype)]
    return t["rtol"], t["atol"] * math.sqrt(max(int(k), 1))


@pytest.fixture
def tolerances():
    """:func:`tol` as a fixture: ``tolerances(dtype, k)`` -> (rtol, atol)."""
    return tol


def assert_close(got, expected, dtype, k=1, err_msg=""):
    """``got`` (any float dtype) matches ``expected`` (float64) within :func:`tol`; NaN must
    match NaN and infinities must match exactly."""
    rtol, atol = tol(dtype, k)
    got = np.asarray(got, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape, (got.shape, expected.shape, err_msg)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True,
                               err_msg=err_msg)


# ------------------------------------------------------------------------------------------
# Oracle conversion
# ------------------------------------------------------------------------------------------

def to_oracle(arr):
    """An ndarray as the oracle's nested lists (Python floats; bool masks stay bool)."""
    if arr is None:
        return None
    arr = np.asarray(arr)
    if arr.dtype == np.bool_:
        return arr.tolist()
    return arr.astype(np.float64).tolist()


def from_oracle(nested, shape):
    """Oracle nested lists back to a float64 ndarray of ``shape`` (empty lists lose shape)."""
    return np.array(nested, dtype=np.float64).reshape(shape)


def compute_dtype(*dtypes):
    """The dtype the kernels compute in: float16 computes in float32."""
    result = np.result_type(*dtypes)
    return np.dtype(np.float32) if result == np.float16 else result


def _mask_for_oracle(mask, compute):
    """A float mask is cast to the compute dtype by the kernels (masks do not promote); finite
    values beyond its range saturate at its largest finite value (they never become -inf)."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.dtype == np.bool_:
        return mask
    info = np.finfo(compute)
    finite = np.isfinite(mask)
    return np.where(finite, np.clip(mask, info.min, info.max), mask).astype(compute)


def oracle_softmax(x, axis=-1, mask=None, log=False):
    """The oracle's (log-)softmax of ``x`` (ndarray) with ``mask`` broadcast to ``x.shape``."""
    x = np.asarray(x)
    mask = _mask_for_oracle(mask, compute_dtype(x.dtype))
    if mask is not None:
        mask = np.broadcast_to(mask, x.shape)
    fn = oracle.log_softmax if log else oracle.softmax
    if x.size == 0:
        return np.zeros(x.shape)
    return from_oracle(fn(to_oracle(x), axis, mask=to_oracle(mask)), x.shape)


def _broadcast_matmul(a, b, out):
    batch = out.shape[:-2]
    a = np.broadcast_to(a, batch + a.shape[-2:])
    b = np.broadcast_to(b, batch + b.shape[-2:])
    return a, b


def oracle_matmul(a, b, out, alpha=1.0):
    """``out + alpha * (a @ b)`` from the oracle, batch dims broadcast into ``out``'s."""
    a, b = _broadcast_matmul(a, b, out)
    M, N = out.shape[-2:]
    res = np.empty(out.shape, dtype=np.float64)
    for idx in np.ndindex(*out.shape[:-2]):
        if M == 0:
            continue
        if N == 0:
            res[idx] = np.zeros((M, 0))
            continue
        res[idx] = from_oracle(oracle.matmul_accumulate(to_oracle(a[idx]), to_oracle(b[idx]),
                                                        to_oracle(out[idx]), alpha=alpha), (M, N))
    return res


def numpy_matmul(a, b, out, alpha=1.0):
    """float64 NumPy reference of ``out + alpha * (a @ b)``."""
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    return np.asarray(out, dtype=np.float64) + alpha * np.matmul(a64, b64)


def sdpa_batch_shape(q, k, v, enable_gqa=False):
    if not enable_gqa:
        return np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    outer = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    return outer + (q.shape[-3],)


def expand_kv_heads(q, k, v, enable_gqa):
    """With GQA, repeat the key/value heads so that every query head has its own."""
    if not enable_gqa:
        return k, v
    group = q.shape[-3] // k.shape[-3]
    return np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)


def oracle_sdpa(q, k, v, mask=None, is_causal=False, scale=None, causal_alignment="top_left",
                enable_gqa=False):
    """(out, lse) of the oracle for broadcast NumPy inputs: one oracle call per batch entry."""
    q, k, v = (np.asarray(t) for t in (q, k, v))
    compute = compute_dtype(q.dtype, k.dtype, v.dtype)
    k, v = expand_kv_heads(q, k, v, enable_gqa)
    batch = sdpa_batch_shape(q, k, v)
    L, E = q.shape[-2:]
    S, Ev = v.shape[-2:]
    q = np.broadcast_to(q, batch + (L, E))
    k = np.broadcast_to(k, batch + (S, E))
    v = np.broadcast_to(v, batch + (S, Ev))
    mask = _mask_for_oracle(mask, compute)
    if mask is not None:
        mask = np.broadcast_to(mask, batch + (L, S))
    out = np.zeros(batch + (L, Ev))
    lse = np.zeros(batch + (L,))
    if L == 0:
        return out, lse
    for idx in np.ndindex(*batch):
        o, s = oracle.scaled_dot_product_attention(
            to_oracle(q[idx]), to_oracle(k[idx]), to_oracle(v[idx]),
            None if mask is None else to_oracle(mask[idx]), is_causal, scale,
            causal_alignment=causal_alignment, return_lse=True, value_dim=Ev)
        out[idx] = from_oracle(o, (L, Ev))
        lse[idx] = from_oracle(s, (L,))
    return out, lse


def numpy_sdpa(q, k, v, mask=None, is_causal=False, scale=None, causal_alignment="top_left",
               enable_gqa=False):
    """float64 NumPy reference (out, lse) for sizes too big for the oracle (finite inputs)."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    k, v = expand_kv_heads(q, k, v, enable_gqa)
    L, E = q.shape[-2:]
    S = k.shape[-2]
    if scale is None:
        scale = 1.0 / math.sqrt(E) if E else 1.0
    scores = scale * np.matmul(q, np.swapaxes(k, -1, -2))
    keep = np.ones((L, S), dtype=bool)
    if is_causal:
        off = 0 if causal_alignment == "top_left" else S - L
        keep = np.arange(S)[None, :] <= np.arange(L)[:, None] + off
    if mask is not None and np.asarray(mask).dtype == np.bool_:
        keep = keep & mask
    elif mask is not None:
        scores = scores + np.asarray(mask, dtype=np.float64)
    keep = np.broadcast_to(keep, scores.shape)
    scores = np.where(keep, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    dead = ~np.isfinite(row_max)
    e = np.exp(scores - np.where(dead, 0.0, row_max))
    z = e.sum(axis=-1, keepdims=True)
    w = np.where(dead, 0.0, e / np.where(dead, 1.0, z))
    lse = np.where(dead, -np.inf, row_max + np.log(np.where(dead, 1.0, z)))[..., 0]
    return np.matmul(w, v), lse



# Attention variants (issue 24): window, softcap, sinks, alibi_slopes, key_lengths,
# query_lengths. Used by tests/test_variants.py, test_properties_variants.py and the fuzzer.

# bfloat16 attention on the bf16 dot products (issue 40): the documented error bound.
_U = 2.0 ** -24          # float32 unit roundoff
_UB = 2.0 ** -8          # bfloat16 unit roundoff (8 significant bits)
_TINY = 2.0 ** -126      # smallest normal float32 (what DAZ/FTZ may lose)


def bf16_gemm_bound(a, b, out0, alpha):
    """The documented bound of bfloat16 matmul_accumulate's fast paths (vdpbf16ps and AMX
    tiles) against the exact ``out0 + alpha * a @ b``, u = 2^-24: (K + 2) u (|alpha|
    sum_k |a_k b_k| + |out0|) + 2^-126 |alpha| (sum_k (|a_k| + |b_k|) + K)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    K = a.shape[-1]
    mag = abs(alpha) * (np.abs(a64) @ np.abs(b64)) + np.abs(out0.astype(np.float64))
    flush = abs(alpha) * 2.0 ** -126 * (np.abs(a64).sum(-1)[..., :, None]
                                        + np.abs(b64).sum(-2)[..., None, :] + K)
    return (K + 2) * 2.0 ** -24 * mag + flush


def _bf16_f64(x):
    return None if x is None else np.asarray(x).astype(np.float64)


def bf16_attention_bound(q, k, v, mask=None, key_chunk=256, **kw):
    """(reference output, its bound, reference lse, its bound) of a bfloat16 attention call
    with the options ``kw``: the float64 call on the same bfloat16 values (q, k, v, mask as
    NumPy arrays of those values, any float dtype), and the error bound of the bfloat16
    results of ``precision="fast"`` that cyattn.scaled_dot_product_attention's Notes document
    (issue 40; it also holds for the exact path, whose error is the bf16 rounding of the
    result plus float32 sums). Elementwise arrays of the output's and the lse's shapes.
    ``key_chunk``: the keys per block (256) or, for the decode on tiles, the smallest key
    chunk (128): nb counts the blocks, or the chunks (one more: they need not start at 0)."""
    ref_kw = {key: val for key, val in kw.items() if key not in ("precision", "n_threads")}
    ref_kw["return_lse"] = True
    q64, k64, v64 = _bf16_f64(q), _bf16_f64(k), _bf16_f64(v)
    m64 = mask if mask is None or mask.dtype == bool else _bf16_f64(mask)
    o, lse = cyattn.scaled_dot_product_attention(q64, k64, v64, m64, **ref_kw)
    w_kw = {key: val for key, val in ref_kw.items() if key != "return_lse"}
    w = cyattn.attention_weights(q64, k64, m64, **w_kw)                  # (..., L, S)
    E, S = q.shape[-1], k.shape[-2]
    scale = kw.get("scale") or 1.0 / math.sqrt(E)
    if kw.get("enable_gqa"):
        rep = q.shape[-3] // k.shape[-3]
        k64, v64 = np.repeat(k64, rep, axis=-3), np.repeat(v64, rep, axis=-3)
    nb = -(-S // key_chunk) + (0 if key_chunk == 256 else 1)
    qk = np.abs(q64) @ np.swapaxes(np.abs(k64), -1, -2)                     # sum_e |q_e k_je|
    daz = (np.abs(q64).sum(-1)[..., :, None] + np.abs(k64).sum(-1)[..., None, :] + E)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(w > 0, np.log(w) + lse[..., None], 0.0)                  # exact scores
    m = np.where(w > 0, s, -np.inf).max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    d_j = scale * (E + 2) * _U * qk + 8 * _U * (np.abs(s) + np.abs(m)) + scale * _TINY * daz
    d = np.where(w > 0, d_j, 0.0).max(-1)[..., None]                        # (..., L, 1)
    eps = 1.01 * _UB + (2 * S + 8 * nb + 16) * _U
    A_ = w @ np.abs(v64)                                                    # sum_j w_j |v_j|
    D_ = np.einsum("...ls,...lse->...le", w, np.abs(v64[..., None, :, :] - o[..., :, None, :]))
    vmax = np.abs(v64).max(-2, keepdims=True)
    b = (np.expm1(2 * d) * D_ + np.exp(2 * d) * eps * A_ + _TINY * (2 * S + 1) * (vmax + 1))
    b_out = b + _UB * (np.abs(o) + b) + 2.0 ** -133                          # rounded to bf16
    finite = np.isfinite(lse)
    lse_abs = np.abs(np.where(finite, lse, 0))
    lse_b = d[..., 0] + 1.01 * (S + 3 * nb + 8) * _U + 2 * _U * lse_abs
    lse_b = lse_b + _UB * (lse_abs + lse_b)
    return o, b_out, lse, lse_b


def _variant_per_batch(x, batch, default, dtype):
    if x is None:
        return np.full(batch, default, dtype=dtype)
    return np.broadcast_to(np.asarray(x, dtype=dtype), batch)


def _float64_broadcast_qkv(q, k, v, enable_gqa):
    """q, k, v in float64 broadcast to the batch shape (GQA heads repeated), and that shape."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    batch = sdpa_batch_shape(q, k, v, enable_gqa)
    k, v = expand_kv_heads(q, k, v, enable_gqa)
    L, E = q.shape[-2:]
    S, Ev = v.shape[-2:]
    return (np.broadcast_to(q, batch + (L, E)), np.broadcast_to(k, batch + (S, E)),
            np.broadcast_to(v, batch + (S, Ev)), batch)


def numpy_sdpa_variants(q, k, v, mask=None, is_causal=False, scale=None,
                        causal_alignment="top_left", enable_gqa=False, window=None, softcap=None,
                        sinks=None, alibi_slopes=None, key_lengths=None, query_lengths=None):
    """(out, lse) in float64 from dense NumPy arrays: a bool keep matrix (lengths, causal,
    window, bool mask), the explicit ALiBi bias, np.tanh for the softcap and an extra sink key
    column with a zero value row. Weights that are exactly 0 never multiply a value."""
    q, k, v, batch = _float64_broadcast_qkv(q, k, v, enable_gqa)
    L, E = q.shape[-2:]
    S, Ev = v.shape[-2:]
    if scale is None:
        scale = 1.0 / math.sqrt(E) if E else 1.0
    n_keys = np.clip(_variant_per_batch(key_lengths, batch, S, np.int64), 0, S)[..., None, None]
    n_queries = np.clip(_variant_per_batch(query_lengths, batch, L, np.int64), 0, L)[..., None, None]
    i = np.arange(L)[:, None]
    j = np.arange(S)[None, :]
    pos = i + (n_keys - n_queries if causal_alignment == "bottom_right" else 0)  # (..., L, 1)
    keep = np.broadcast_to(j < n_keys, batch + (L, S)).copy()
    if is_causal:
        keep &= j <= pos
    if window is not None:
        left, right = window
        if left is not None:
            keep &= j >= pos - left
        if right is not None:
            keep &= j <= pos + right
    float_mask = None
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype == np.bool_:
            keep &= mask
        else:
            float_mask = mask.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        if E:
            s = scale * np.matmul(q, np.swapaxes(k, -1, -2))
        else:
            s = np.zeros(batch + (L, S))
        if softcap is not None:
            s = softcap * np.tanh(s / softcap)
        if alibi_slopes is not None:
            slope = _variant_per_batch(alibi_slopes, batch, 0.0, np.float64)[..., None, None]
            s = s + (-slope) * np.abs(pos - j).astype(np.float64)
        if float_mask is not None:
            s = s + float_mask
        s = np.where(keep, s, -np.inf)
        if sinks is not None:
            sink = _variant_per_batch(sinks, batch, 0.0, np.float64)[..., None, None]
            s = np.concatenate([s, np.broadcast_to(sink, batch + (L, 1))], axis=-1)
            v = np.concatenate([v, np.zeros(batch + (1, Ev))], axis=-2)
        row_max = s.max(axis=-1, keepdims=True, initial=-np.inf)
        dead = row_max == -np.inf
        e = np.exp(s - np.where(dead, 0.0, row_max))
        z = e.sum(axis=-1, keepdims=True)
        w = np.where(dead, 0.0, e / np.where(dead, 1.0, z))
        lse = np.where(dead, -np.inf, row_max + np.log(np.where(dead, 1.0, z)))[..., 0]
        if np.isfinite(v).all():
            out = np.matmul(w, v)
        else:  # a key of weight exactly 0 is never read
            terms = np.where(w[..., None] != 0.0, w[..., None] * v[..., None, :, :], 0.0)
            out = terms.sum(axis=-2)
    padded = i >= n_queries  # (..., L, 1)
    out = np.where(padded, 0.0, out)
    lse = np.where(padded[..., 0], -np.inf, lse)
    return out, lse


def oracle_sdpa_variants(q, k, v, mask=None, is_causal=False, scale=None,
                         causal_alignment="top_left", enable_gqa=False, **variants):
    """(out, lse) of ``cyattn.oracle`` for NumPy inputs, one oracle call per batch entry with
    that entry's sink, slope and lengths as Python scalars."""
    q, k, v, batch = _float64_broadcast_qkv(q, k, v, enable_gqa)
    L, E = q.shape[-2:]
    S, Ev = v.shape[-2:]
    if mask is not None:
        mask = np.broadcast_to(np.asarray(mask), batch + (L, S))
        if mask.dtype != np.bool_:
            mask = mask.astype(np.float64)
    per_batch = {}
    for name in ("sinks", "alibi_slopes", "key_lengths", "query_lengths"):
        value = variants.pop(name, None)
        if value is not None:
            dtype = np.int64 if name.endswith("lengths") else np.float64
            per_batch[name] = np.broadcast_to(np.asarray(value, dtype=dtype), batch)
    out = np.zeros(batch + (L, Ev))
    lse = np.zeros(batch + (L,))
    if L == 0:
        return out, lse
    for idx in np.ndindex(*batch):
        extra = {name: arr[idx].item() for name, arr in per_batch.items()}
        o, s = oracle.scaled_dot_product_attention(
            q[idx].tolist(), k[idx].tolist(), v[idx].tolist(),
            None if mask is None else mask[idx].tolist(), is_causal, scale,
            causal_alignment=causal_alignment, return_lse=True, value_dim=Ev,
            **variants, **extra)
        out[idx] = np.array(o, dtype=np.float64).reshape(L, Ev)
        lse[idx] = np.array(s, dtype=np.float64).reshape(L)
    return out, lse

# ------------------------------------------------------------------------------------------
# Calling with checks, and layouts
# ------------------------------------------------------------------------------------------

def _snapshot(value):
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value).tobytes(), value.shape, value.dtype, value.strides
    return None


def call_checked(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, asserting afterwards that no ndarray argument (other than
    ``out``, and for ``matmul_accumulate`` its third argument) changed, bit for bit."""
    skip = set()
    if getattr(fn, "__name__", "") == "matmul_accumulate" and len(args) >= 3:
        skip.add(2)
    watched = [(i, a) for i, a in enumerate(args) if i not in skip]
    watched += [(name, a) for name, a in kwargs.items() if name != "out"]
    out_obj = kwargs.get("out", args[2] if 2 in skip else None)
    before = [(name, _snapshot(a)) for name, a in watched
              if isinstance(a, np.ndarray) and not _shares(a, out_obj)]
    result = fn(*args, **kwargs)
    lookup = dict(watched)
    for name, snap in before:
        assert _snapshot(lookup[name]) == snap, f"{fn.__name__} modified its input {name!r}"
    return result


def _shares(a, out_obj):
    return isinstance(out_obj, np.ndarray) and np.may_share_memory(a, out_obj)


@contextlib.contextmanager
def no_warnings(underflow="raise"):
    """Any warning (e.g. a NumPy RuntimeWarning) or NumPy floating-point error inside the block
    is an error; ``underflow="ignore"`` lets underflow pass (NumPy's own default: rounding a
    float32 result to float16 underflows for tiny weights, and that is the right answer)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise", under=underflow):
            yield


def freeze(*arrays):
    """Make each array read-only (shared inputs of concurrent calls must not be written)."""
    for a in arrays:
        a.flags.writeable = False


def misaligned(arr):
    """A copy of ``arr`` in a buffer offset by one byte from an aligned address (so its data
    pointer is not aligned to the itemsize when the itemsize is > 1)."""
    arr = np.asarray(arr)
    raw = np.empty(arr.nbytes + 64 + 1, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64 + 1
    view = raw[start:start + arr.nbytes].view(arr.dtype).reshape(arr.shape)
    view[...] = arr
    if arr.dtype.itemsize > 1 and arr.size:
        assert not view.flags.aligned
    return view


def transposed_view(arr):
    """``arr``'s values stored with the last two axes swapped, viewed back in ``arr``'s shape."""
    return np.swapaxes(np.ascontiguousarray(np.swapaxes(arr, -1, -2)), -1, -2)


def read_only(arr):
    """A read-only copy of ``arr``."""
    ro = np.array(arr)
    ro.flags.writeable = False
    return ro


LAYOUTS = ("c_contiguous", "fortran", "transposed_view", "reversed_view", "sliced",
           "misaligned", "read_only")


def layout_variants(arr):
    """(name, array) pairs holding the same values as ``arr`` in other memory layouts."""
    arr = np.asarray(arr)
    out = [("c_contiguous", np.ascontiguousarray(arr))]
    if arr.ndim == 0:
        return out + [("read_only", read_only(arr))]
    out.append(("fortran", np.asfortranarray(arr)))
    if arr.ndim >= 2:
        out.append(("transposed_view", transposed_view(arr)))
    rev = np.ascontiguousarray(arr[(slice(None, None, -1),) * arr.ndim])
    out.append(("reversed_view", rev[(slice(None, None, -1),) * arr.ndim]))
    big = np.zeros(tuple(2 * s + 1 for s in arr.shape), dtype=arr.dtype)
    sl = tuple(slice(1, 1 + 2 * s, 2) for s in arr.shape)
    big[sl] = arr
    out.append(("sliced", big[sl]))
    out.append(("misaligned", misaligned(arr)))
    out.append(("read_only", read_only(arr)))
    for name, a in out:
        assert np.array_equal(a, arr, equal_nan=True), name
    return out


def with_layout(arr, name):
    """``arr``'s values in the memory layout ``name`` (one of LAYOUTS; C order if ``name``
    does not apply, e.g. a transposed view of a 1-D array)."""
    return dict(layout_variants(arr)).get(name, np.ascontiguousarray(arr))


def grid_values(rng, shape, lo=-2.0, hi=2.0, step=1.0 / 256):
    """Random values on the dyadic grid ``step * integer`` in [lo, hi]: exactly representable
    in float16, float32 and float64, so one oracle result serves every dtype, and small
    integer multiples of step^2 keep float64 sums of their products exact."""
    n = rng.integers(round(lo / step), round(hi / step) + 1, size=shape)
    return n.astype(np.float64) * step


def mha_params(rng, E, kdim, vdim, packed=True, bias_in=True, bias_out=True, bias_scale=1.0):
    """float64 parameters of multi-head attention drawn from ``rng`` (standard normal; weights
    scaled by 1/sqrt(fan-in), biases by ``bias_scale``): ``in_proj_weight`` when ``packed`` and
    kdim == vdim == E, else the three separate projection weights; ``out_proj_weight``;
    ``in_proj_bias`` / ``out_proj_bias`` when asked for. Draw order is fixed (the tests that
    share a generator depend on it)."""
    p = {}
    if packed and kdim == E and vdim == E:
        p["in_proj_weight"] = rng.standard_normal((3 * E, E)) / math.sqrt(E)
    else:
        p["q_proj_weight"] = rng.standard_normal((E, E)) / math.sqrt(E)
        p["k_proj_weight"] = rng.standard_normal((E, kdim)) / math.sqrt(kdim)
        p["v_proj_weight"] = rng.standard_normal((E, vdim)) / math.sqrt(vdim)
    p["out_proj_weight"] = rng.standard_normal((E, E)) / math.sqrt(E)
    if bias_in:
        p["in_proj_bias"] = rng.standard_normal(3 * E) * bias_scale
    if bias_out:
        p["out_proj_bias"] = rng.standard_normal(E) * bias_scale
    return p


# ------------------------------------------------------------------------------------------
# Fork and torch stand-ins
# ------------------------------------------------------------------------------------------

def run_forked(target, args, timeout=60):
    """Run ``target(conn, *args)`` in a forked child, which sends ``(status, payload)`` on
    ``conn`` ("ok" or "error"), and return what it sent.

    Raises AssertionError if the child sends nothing or does not exit within ``timeout``
    seconds (a deadlock after fork); a child that sent "ok" but exited with a nonzero code
    gives ``("error", "exit code N")``. The child is killed on the way out if still alive.
    Callers skip first where the "fork" start method is not available.
    """
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(sender, *args))
    with warnings.catch_warnings():
        # Python >= 3.12 warns about fork() in a multi-threaded process; that is the point.
        warnings.simplefilter("ignore", DeprecationWarning)
        proc.start()
    sender.close()
    try:
        # Read before joining: the child blocks on a large send until the parent reads.
        if not receiver.poll(timeout):
            raise AssertionError(f"forked child sent nothing within {timeout} s "
                                 "(deadlock after fork?)")
        status, payload = receiver.recv()
        proc.join(timeout)
        if proc.is_alive():
            raise AssertionError(f"forked child did not exit within {timeout} s")
        if status == "ok" and proc.exitcode != 0:
            status, payload = "error", f"exit code {proc.exitcode}"
        return status, payload
    finally:
        receiver.close()
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def timeout_scale():
    """Factor for the hang guards (subprocess timeouts) of the tests that run a whole command:
    CYATTN_TEST_TIMEOUT_SCALE, default 1. tools/qemu_baseline_check.sh sets 4: under its
    emulated CPU `bench --full --cases tiny` took 268 s of its 300 s guard (one thread, the
    other core busy), where natively it takes a few seconds. A guard against hangs, scaled
    to the emulator's speed; no test asserts a time."""
    value = float(os.environ.get("CYATTN_TEST_TIMEOUT_SCALE", "1"))
    return value if value >= 1 else 1.0


def child_env(backend=None, clear_backend=False, **extra):
    """Environment for a child interpreter that imports the same cyattn as this process.

    ``os.environ``, with the folder that holds the imported cyattn put first on PYTHONPATH when
    it is a source tree (an installed package is found by the child on its own); ``backend``
    sets CYATTN_BACKEND for the child, ``clear_backend`` drops an inherited one; ``extra``:
    more variables to set.
    """
    env = dict(os.environ)
    if clear_backend:
        env.pop("CYATTN_BACKEND", None)
    if backend is not None:
        env["CYATTN_BACKEND"] = backend
    parent = os.path.dirname(os.path.dirname(os.path.abspath(_backend.__file__)))
    site = {os.path.abspath(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
    if parent not in site:  # a source tree on sys.path: hand it to the child too
        env["PYTHONPATH"] = os.pathsep.join(
            [parent] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(extra)
    return env


class FakeTensor:
    """Just enough of a torch tensor for from_torch: ``.detach().cpu().numpy()``."""

    def __init__(self, arr):
        self.arr = arr

    def detach(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self.arr


class FakeTorchMHA:
    """Duck-typed stand-in for torch.nn.MultiheadAttention (no torch needed).

    Takes its shape attributes and parameters from ``source`` (a cyattn.MultiHeadAttention),
    in training mode without dropout; ``attrs`` override any attribute (``_state``: the
    parameters that ``state_dict`` returns as tensors).
    """

    def __init__(self, source, **attrs):
        self.embed_dim = source.embed_dim
        self.num_heads = source.num_heads
        self.batch_first = source.batch_first
        self.kdim, self.vdim = source.kdim, source.vdim
        self.dropout = 0.0
        self.training = True
        self.bias_k = self.bias_v = None
        self.add_zero_attn = False
        self._state = source.state_dict()
        self.__dict__.update(attrs)

    def state_dict(self):
        return {k: FakeTensor(v) for k, v in self._state.items()}


def decode_option_kwargs(spec):
    """The keyword arguments of a decode-option spec (tests/test_decode_grouped.py OPTIONS,
    shared by tests/test_kv8.py) that need no random values: GQA, lse and the scalar options."""
    kw = {"enable_gqa": True, "return_lse": True}
    for name in ("is_causal", "causal_alignment", "window", "softcap"):
        if name in spec:
            kw[name] = spec[name]
    return kw


def add_decode_entry_options(rng, spec, kw, B, Hq, L, S):
    """Add the spec's per-entry options to kw, drawn from rng in this order: key lengths
    (B, Hq), query lengths (B, 1), sinks (Hq,) with one -inf, ALiBi slopes (Hq,)."""
    if spec.get("key_lengths"):
        # the heads of one K/V head may see different lengths
        lengths = rng.integers(0, S - 20, size=(B, Hq))
        lengths[..., 0] = S // 2
        kw["key_lengths"] = lengths
    if spec.get("query_lengths"):
        kw["query_lengths"] = rng.integers(0, L + 2, size=(B, 1))
    if spec.get("sinks"):
        s = grid_values(rng, (Hq,), -3.0, 3.0)
        s[1 % Hq] = -np.inf
        kw["sinks"] = s
    if spec.get("alibi_slopes"):
        kw["alibi_slopes"] = 2.0 ** -rng.integers(1, 9, size=(Hq,))
    return kw

