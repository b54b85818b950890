"""The public bug-report cases (tests/data/public_cases.py) as pytest tests.

Every ordinary case becomes one parametrized test (``test_public_case``, ids = case ids): its
inputs are built with NumPy from literals and recipes, in the case's dtypes and memory layouts,
the named cyattn function is called, and the result is compared as the case's ``check`` says.
Every call must also leave its input arrays unmodified (except the ``out`` / aliased target).

The four ``special`` cases describe runtime properties in words; each has its own test below:
PKG-01 ``fork_safe``, PKG-03 ``gil_released``, PKG-04 ``thread_count_invariant`` and
PKG-06 ``no_ftz_side_effect``.

The input builders themselves are checked with NumPy only (``test_layout_builder``,
``test_recipes``, ``test_case_inputs_build``), so a wrong builder cannot make a case pass
vacuously (e.g. a "misaligned" array that happens to be aligned).
"""

import builtins
import importlib.util
import math
import multiprocessing
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import pytest
from conftest import child_env, misaligned, read_only, run_forked, transposed_view

import cyattn


def _load_cases():
    # Load the project's own copy of the cases by path, so this works whether or not
    # ``tests`` is imported as a package and under any pytest import mode.
    path = Path(__file__).resolve().parent / "data" / "public_cases.py"
    spec = importlib.util.spec_from_file_location("_cyattn_public_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES


CASES = _load_cases()
REGULAR_CASES = [case for case in CASES if case["fn"] != "special"]
SPECIAL_CASES = {case["check"]: case for case in CASES if case["fn"] == "special"}

# Leading positional arguments of each function, by case input name, in call order.
# Any other input is passed by keyword under its own name (attn_mask, mask, out, ...).
POSITIONAL = {
    "softmax": ["x"],
    "log_softmax": ["x"],
    "scaled_dot_product_attention": ["q", "k", "v"],
    "matmul_accumulate": ["a", "b", "out"],
}
# Case input names -> cyattn keyword names, for inputs passed by keyword.
KEYWORD_NAMES = {"q": "query", "k": "key", "v": "value"}
# Inputs holding the data (not masks / out); used to derive the expected result dtype.
DATA_INPUTS = {
    "softmax": ["x"],
    "log_softmax": ["x"],
    "scaled_dot_product_attention": ["q", "k", "v"],
    "matmul_accumulate": ["out"],
}

SENTINEL = 7.0


# --------------------------------------------------------------------------------------
# Input builders (NumPy only)
# --------------------------------------------------------------------------------------


def _recipe(spec, dtype):
    """Build a ``{"gen": ...}`` recipe as a C-contiguous array of ``dtype``."""
    gen = spec["gen"]
    if gen == "ones":
        return np.ones(spec["shape"], dtype=dtype)
    if gen == "zeros":
        return np.zeros(spec["shape"], dtype=dtype)
    if gen == "full":
        return np.full(spec["shape"], spec["value"], dtype=dtype)
    if gen == "arange":
        # (arange(n) % mod) + offset, reshaped.
        shape = tuple(spec["shape"])
        n = math.prod(shape)
        values = np.arange(n, dtype=np.int64)
        if spec.get("mod") is not None:
            values = values % spec["mod"]
        values = values + spec.get("offset", 0)
        return values.astype(dtype).reshape(shape)
    if gen == "index_col":
        # v[0, j, 0] = j, everything else 0; shape (1, S, 1) unless given.
        shape = tuple(spec.get("shape", (1, spec["S"], 1)))
        out = np.zeros(shape, dtype=dtype)
        out[0, :, 0] = np.arange(shape[1])
        return out
    if gen == "index_rows":
        # v[0, j] = [j, 1], shape (1, S, 2).
        S = spec["S"]
        out = np.ones((1, S, 2), dtype=dtype)
        out[0, :, 0] = np.arange(S)
        return out
    if gen == "band_mask":
        # Query i may see keys max(0, i - window + 1) .. i, i.e. i - window < j <= i.
        # Float dtype: additive mask, 0.0 inside the band and -inf outside; bool: True inside.
        L, S, window = spec["L"], spec["S"], spec["window"]
        i = np.arange(L)[:, None]
        j = np.arange(S)[None, :]
        inside = (j <= i) & (j > i - window)
        return _keep_to_mask(inside, dtype)
    if gen == "keep_one":
        # A mask that keeps exactly one key per query row (key ``index``, default 0).
        shape = tuple(spec.get("shape", (spec["L"], spec["S"])))
        inside = np.zeros(shape, dtype=bool)
        inside[..., spec.get("index", 0)] = True
        return _keep_to_mask(inside, dtype)
    raise AssertionError(f"unknown recipe {gen!r} in {spec!r}")


def _keep_to_mask(inside, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return inside.copy()
    return np.where(inside, 0.0, -np.inf).astype(dtype)


def _base_array(value, dtype):
    if isinstance(value, dict):
        return _recipe(value, dtype)
    return np.array(value, dtype=dtype)


def _gap_fill(dtype):
    """A value for memory around a view that must never be read (NaN poisons floats)."""
    return np.nan if np.dtype(dtype).kind in "fc" else 1


def _reversed_view(x):
    # Stored reversed along the last axis, viewed back with [..., ::-1].
    return np.ascontiguousarray(x[..., ::-1])[..., ::-1]


def _strided_slice(x, fill=None):
    # Every 2nd element (along the last axis) of a bigger array.
    big_shape = x.shape[:-1] + (2 * x.shape[-1],)
    big = np.full(big_shape, _gap_fill(x.dtype) if fill is None else fill, dtype=x.dtype)
    view = big[..., ::2]
    view[...] = x
    return view, big


def _odd_stride(x):
    # A field of a packed record array: stride = itemsize + 1, not a multiple of itemsize.
    record = np.zeros(x.shape, dtype=np.dtype([("x", x.dtype), ("pad", "u1")]))
    record["x"] = x
    return record["x"]


# Layout name -> builder of a view holding the same values. Fortran order, the transposed view,
# the misaligned buffer (odd address: flags.aligned is False for any dtype wider than one byte)
# and the read-only copy are conftest's.
_LAYOUT_BUILDERS = {
    "fortran": np.asfortranarray,
    "transposed_view": transposed_view,
    "reversed_view": _reversed_view,
    "strided_slice": lambda x: _strided_slice(x)[0],
    "misaligned": misaligned,
    "odd_stride": _odd_stride,
    "readonly": read_only,
}


def _apply_layout(x, layout):
    """Return ``(array, sentinel)``: the values of ``x`` in ``layout``; ``sentinel`` is the
    bigger backing array for ``strided_sentinel`` (else None)."""
    if layout is None:
        return x, None
    if layout == "strided_sentinel":
        return _strided_slice(x, fill=SENTINEL)
    if layout not in _LAYOUT_BUILDERS:
        raise AssertionError(f"unknown layout {layout!r}")
    return _LAYOUT_BUILDERS[layout](x), None


def _assert_layout(y, x, layout, sentinel=None):
    """Check that ``y`` holds the values of ``x`` and really has the property ``layout`` names."""
    assert y.shape == x.shape
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y, x)
    nontrivial = sum(d > 1 for d in y.shape)
    if layout == "fortran":
        assert y.flags.f_contiguous
        if nontrivial >= 2:
            assert not y.flags.c_contiguous
    elif layout == "transposed_view":
        assert y.ndim >= 2
        if y.shape[-1] > 1 and y.shape[-2] > 1:
            assert y.strides[-2] == y.itemsize
            assert not y.flags.c_contiguous
    elif layout == "reversed_view":
        if y.shape[-1] > 1:
            assert y.strides[-1] < 0
    elif layout in ("strided_slice", "strided_sentinel"):
        if y.shape[-1] > 1:
            assert y.strides[-1] == 2 * y.itemsize
            assert not y.flags.c_contiguous
        if layout == "strided_sentinel":
            assert sentinel is not None
            assert np.all(sentinel[..., 1::2] == sentinel.dtype.type(SENTINEL))
    elif layout == "misaligned":
        if y.itemsize > 1 and y.size > 0:
            assert not y.flags.aligned
    elif layout == "odd_stride":
        if y.itemsize > 1 and y.size > 0 and y.ndim > 0:
            assert y.strides[-1] == y.itemsize + 1
            assert y.strides[-1] % y.itemsize != 0
    elif layout == "readonly":
        assert not y.flags.writeable
    elif layout is not None:
        raise AssertionError(f"unknown layout {layout!r}")


def _build_inputs(case, *, with_layout=True):
    """Build the case's inputs.

    Returns ``(arrays, sentinels)``: ``arrays`` maps input name -> array as passed (after
    layout and alias); ``sentinels`` maps name -> bigger backing array whose gaps hold 7.0.
    """
    dtypes = case.get("dtypes", {})
    layouts = case.get("layout", {}) if with_layout else {}
    arrays, sentinels = {}, {}
    for name, value in case["inputs"].items():
        dtype = np.dtype(dtypes.get(name, case["dtype"]))
        base = _base_array(value, dtype)
        arr, sentinel = _apply_layout(base, layouts.get(name))
        arrays[name] = arr
        if sentinel is not None:
            sentinels[name] = sentinel
    for name, source in case.get("alias", {}).items():
        arrays[name] = arrays[source]  # the very same array object
    return arrays, sentinels


def _call_arguments(fn_name, arrays, kwargs):
    positional = [name for name in POSITIONAL[fn_name] if name in arrays]
    assert positional == POSITIONAL[fn_name][: len(positional)], "gap in positional inputs"
    args = [arrays[name] for name in positional]
    call_kwargs = {
        KEYWORD_NAMES.get(name, name): arr
        for name, arr in arrays.items()
        if name not in positional
    }
    call_kwargs.update(kwargs)
    return args, call_kwargs


def _exception_types(names):
    return tuple(getattr(builtins, name) for name in names.split("|") if name)


def _expected_dtype(case, arrays):
    """The result dtype the design promises, or None when the case does not pin it.

    float32/float64 preserved, float16 computed in float32 and returned as float16, mixed
    floats promote with np.result_type; integer data (if accepted at all) upcasts to float64.
    """
    dtypes = [arrays[name].dtype for name in DATA_INPUTS[case["fn"]] if name in arrays]
    if not dtypes:
        return None
    if all(dt.kind == "f" for dt in dtypes):
        return np.result_type(*dtypes)
    if all(dt.kind in "iu" for dt in dtypes):
        return np.dtype(np.float64)
    return None


def _window_mean(case, arrays):
    """Expected output for the ``window_mean`` rule: out[..., i, :] is the mean of the value
    rows j in max(0, i - window + 1) .. i (with index_rows values: [mean of those j, 1.0])."""
    window = case["expected"]["window"]
    value = np.asarray(arrays["v"], dtype=np.float64)
    L = arrays["q"].shape[-2]
    expected = np.empty(value.shape[:-2] + (L, value.shape[-1]))
    for i in range(L):
        lo = max(0, i - window + 1)
        expected[..., i, :] = value[..., lo : i + 1, :].mean(axis=-2)
    return expected


def _expected_array(case, arrays):
    expected = case["expected"]
    if isinstance(expected, dict):
        rule = expected.get("rule")
        if rule == "window_mean":
            return _window_mean(case, arrays)
        raise AssertionError(f"unknown expected rule {rule!r}")
    return np.array(expected, dtype=np.float64)


def _assert_allclose(result, expected, case):
    assert isinstance(result, np.ndarray), f"result is {type(result).__name__}, not ndarray"
    assert result.shape == expected.shape, f"shape {result.shape} != expected {expected.shape}"
    actual = result.astype(np.float64)
    np.testing.assert_array_equal(
        np.isnan(actual), np.isnan(expected), err_msg="NaN positions differ"
    )
    np.testing.assert_allclose(
        actual, expected, rtol=case["rtol"], atol=case["atol"], equal_nan=True
    )


def _assert_unmodified(arrays, before, skip=()):
    for name, copy in before.items():
        if name in skip:
            continue
        arr = arrays[name]
        assert arr.shape == copy.shape and arr.dtype == copy.dtype, f"input {name!r} changed"
        # assert_array_equal treats NaN == NaN, so NaN inputs compare equal to themselves.
        np.testing.assert_array_equal(arr, copy, err_msg=f"input {name!r} was modified")


def _assert_sentinels(sentinels):
    for name, big in sentinels.items():
        gaps = big[..., 1::2]
        assert np.all(gaps == big.dtype.type(SENTINEL)), f"{name!r}: memory around the view changed"


# --------------------------------------------------------------------------------------
# The cases
# --------------------------------------------------------------------------------------


def test_every_case_is_tested():
    ids = [case["id"] for case in CASES]
    assert len(ids) == len(set(ids)) == 33
    assert set(SPECIAL_CASES) == {
        "fork_safe",
        "gil_released",
        "thread_count_invariant",
        "no_ftz_side_effect",
    }
    for case in REGULAR_CASES:
        assert case["fn"] in POSITIONAL, case["id"]
        kind = case["check"].partition(":")[0]
        assert kind in {"allclose", "exact", "shape", "dtype", "raises", "allclose_or_raises"}


@pytest.mark.parametrize("case", REGULAR_CASES, ids=[case["id"] for case in REGULAR_CASES])
def test_public_case(case):
    fn = getattr(cyattn, case["fn"])
    arrays, sentinels = _build_inputs(case)
    args, kwargs = _call_arguments(case["fn"], arrays, case.get("kwargs", {}))
    before = {name: np.array(arr, copy=True) for name, arr in arrays.items()}

    target = case.get("target")
    alias = case.get("alias", {})
    written = set()  # inputs the call is allowed to write: the target and anything aliased to it
    if target is not None:
        written.add(target)
    for name, source in alias.items():
        if name in written or source in written:
            written.update((name, source))

    kind, _, exc_names = case["check"].partition(":")
    exc_types = _exception_types(exc_names)

    if kind == "raises":
        with pytest.raises(exc_types):
            fn(*args, **kwargs)
        # A failed call leaves every argument, out included, untouched.
        _assert_unmodified(arrays, before)
        _assert_sentinels(sentinels)
        return

    catch = exc_types if kind == "allclose_or_raises" else ()
    try:
        returned = fn(*args, **kwargs)
    except catch:
        _assert_unmodified(arrays, before)
        _assert_sentinels(sentinels)
        return

    _assert_unmodified(arrays, before, skip=written)
    _assert_sentinels(sentinels)

    if target is not None:
        result = arrays[target]
        # matmul_accumulate returns out; a returned array must be (a view of) the target.
        if returned is not None:
            assert isinstance(returned, np.ndarray)
            assert returned.shape == result.shape
            assert np.shares_memory(returned, result)
    else:
        result = returned

    expected_dtype = _expected_dtype(case, arrays)
    if kind in ("allclose", "allclose_or_raises", "exact") and expected_dtype is not None:
        assert result.dtype == expected_dtype, f"dtype {result.dtype} != {expected_dtype}"

    if kind in ("allclose", "allclose_or_raises"):
        _assert_allclose(result, _expected_array(case, arrays), case)
    elif kind == "exact":
        expected = _expected_array(case, arrays)
        assert isinstance(result, np.ndarray)
        assert result.shape == expected.shape
        np.testing.assert_array_equal(result, expected)
    elif kind == "shape":
        expected = case["expected"]
        if isinstance(expected, dict):
            expected = expected["shape"]
        assert np.shape(result) == tuple(expected)
    elif kind == "dtype":
        assert result.dtype == np.dtype(case["expected"])
    else:
        raise AssertionError(f"unknown check {case['check']!r}")


# --------------------------------------------------------------------------------------
# Special cases: runtime properties
# --------------------------------------------------------------------------------------


def _fork_child(conn, query, key, value):
    try:
        result = cyattn.scaled_dot_product_attention(query, key, value, n_threads=2)
        conn.send(("ok", result))
    except BaseException:  # report anything to the parent instead of dying silently
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def test_PKG_01_fork_safe():
    """PKG-01: after the parent used the thread pool, a forked child can still run SDPA."""
    assert SPECIAL_CASES["fork_safe"]["id"] == "PKG-01"
    try:
        multiprocessing.get_context("fork")
    except ValueError:
        pytest.skip("the 'fork' start method is not available on this platform")

    rng = np.random.default_rng(101)
    query = rng.standard_normal((2, 4, 256, 64))
    key = rng.standard_normal((2, 4, 256, 64))
    value = rng.standard_normal((2, 4, 256, 64))
    parent = cyattn.scaled_dot_product_attention(query, key, value, n_threads=2)
    again = cyattn.scaled_dot_product_attention(query, key, value, n_threads=2)
    np.testing.assert_array_equal(again, parent)

    status, payload = run_forked(_fork_child, (query, key, value))
    assert status == "ok", f"forked child failed:\n{payload}"
    np.testing.assert_allclose(payload, parent, rtol=1e-12, atol=1e-12)


def _gil_problem(rng, heads, length):
    shape = (1, heads, length, 64)
    return tuple(rng.standard_normal(shape).astype(np.float32) for _ in range(3))


def _timed_sdpa(query, key, value):
    start = time.perf_counter()
    out = cyattn.scaled_dot_product_attention(query, key, value, n_threads=1)
    return time.perf_counter() - start, out


def test_PKG_03_gil_released():
    """PKG-03: a long SDPA call in a worker thread does not stall the main thread."""
    assert SPECIAL_CASES["gil_released"]["id"] == "PKG-03"
    rng = np.random.default_rng(303)
    # Size the problem (float32, B=1, H heads, L=S, E=64, one thread) so that one call
    # takes roughly 0.5 s here: time a small probe, then scale heads (cost ~ H * L * S).
    target = 0.5
    probe_time, _ = _timed_sdpa(*_gil_problem(rng, 1, 1024))
    if 4 * probe_time <= target:
        length = 2048
        heads = int(min(16, max(1, round(target / max(4 * probe_time, 1e-6)))))
    else:  # a slow build: keep the test short rather than the problem large
        length, heads = (1024, 1) if probe_time <= 2 * target else (512, 1)
    problem = _gil_problem(rng, heads, length)
    call_time, _ = _timed_sdpa(*problem)
    if call_time < 0.05:
        pytest.skip(f"one call takes only {call_time * 1e3:.1f} ms: too short to measure stalls")

    outcome = {}

    def worker():
        try:
            outcome["time"], outcome["out"] = _timed_sdpa(*problem)
        except BaseException as exc:  # re-raised in the main thread below
            outcome["error"] = exc

    thread = threading.Thread(target=worker, daemon=True)
    longest = 0.0
    last = time.perf_counter()
    thread.start()
    while thread.is_alive():
        now = time.perf_counter()
        if now - last > longest:
            longest = now - last
        last = now
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    assert np.all(np.isfinite(outcome["out"]))
    worker_time = max(call_time, outcome["time"])
    assert longest < 0.5 * worker_time, (
        f"main thread stalled {longest:.3f} s during a {worker_time:.3f} s call "
        "(is the GIL held by the kernel?)"
    )


_INVARIANCE_SCRIPT = r"""
import sys
import numpy as np
import cyattn

rng = np.random.default_rng(20261129)
query = rng.standard_normal((2, 257, 32))
key = rng.standard_normal((2, 257, 32))
value = rng.standard_normal((2, 257, 32))
attn = cyattn.scaled_dot_product_attention(query, key, value, is_causal=True)
a = rng.standard_normal((3, 5003))
b = rng.standard_normal((5003, 4))
out = rng.standard_normal((3, 4))
cyattn.matmul_accumulate(a, b, out)
np.savez(sys.argv[1], attn=attn, matmul=out)
"""


def _invariance_reference():
    # The same data as the script, computed with NumPy in float64 (sanity, not bit-equality).
    rng = np.random.default_rng(20261129)
    query = rng.standard_normal((2, 257, 32))
    key = rng.standard_normal((2, 257, 32))
    value = rng.standard_normal((2, 257, 32))
    scores = query @ np.swapaxes(key, -1, -2) / np.sqrt(32)
    scores = np.where(np.tril(np.ones((257, 257), dtype=bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    attn = weights @ value
    a = rng.standard_normal((3, 5003))
    b = rng.standard_normal((5003, 4))
    out = rng.standard_normal((3, 4))
    return attn, out + a @ b


def _run_fresh(script, args=(), env_extra=None, cwd=None):
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=child_env(**(env_extra or {})),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_PKG_04_thread_count_invariant(tmp_path):
    """PKG-04: fresh processes with OMP_NUM_THREADS=1 and =4 give bit-identical results."""
    assert SPECIAL_CASES["thread_count_invariant"]["id"] == "PKG-04"
    results = {}
    for n in (1, 4):
        path = tmp_path / f"threads{n}.npz"
        _run_fresh(_INVARIANCE_SCRIPT, [str(path)], {"OMP_NUM_THREADS": str(n)}, cwd=tmp_path)
        with np.load(path) as data:
            results[n] = {name: data[name] for name in data.files}
    for name in ("attn", "matmul"):
        one, four = results[1][name], results[4][name]
        np.testing.assert_allclose(four, one, rtol=1e-10, atol=1e-10)
        # cyattn promises more than the case asks: bit-identical for any thread count.
        np.testing.assert_array_equal(four, one)
    attn_ref, matmul_ref = _invariance_reference()
    np.testing.assert_allclose(results[1]["attn"], attn_ref, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(results[1]["matmul"], matmul_ref, rtol=1e-9, atol=1e-9)


def _assert_subnormals_work():
    assert sys.float_info.min / 2 != 0.0, "float64 subnormal results flushed to zero (FTZ)"
    assert np.float32(1e-38) / np.float32(10) != 0, "float32 subnormal results flushed (FTZ)"
    tiny = np.float32(1e-39)  # a float32 subnormal input
    assert tiny * np.float32(1) != 0, "float32 subnormal inputs read as zero (DAZ)"


_FTZ_SCRIPT = r"""
import sys
import numpy as np
import cyattn

assert sys.float_info.min / 2 != 0.0, "float64 subnormal results flushed to zero"
assert np.float32(1e-38) / np.float32(10) != 0, "float32 subnormal results flushed to zero"
assert np.float32(1e-39) * np.float32(1) != 0, "float32 subnormal inputs read as zero"
print("subnormals ok")
"""


def test_PKG_06_no_ftz_side_effect(tmp_path):
    """PKG-06: importing and calling cyattn leaves the FPU's subnormal handling alone."""
    assert SPECIAL_CASES["no_ftz_side_effect"]["id"] == "PKG-06"
    _assert_subnormals_work()  # cyattn is already imported in this process
    x = np.array([[0.0, -100.0], [1.0, 2.0]], dtype=np.float32)
    cyattn.softmax(x)
    rng = np.random.default_rng(606)
    query, key, value = (rng.standard_normal((2, 3, 17, 8)) for _ in range(3))
    cyattn.scaled_dot_product_attention(query, key, value, is_causal=True)
    _assert_subnormals_work()
    # A fresh process that only imports cyattn (catches crtfastmath.o run at load time).
    proc = _run_fresh(_FTZ_SCRIPT, cwd=tmp_path)
    assert "subnormals ok" in proc.stdout


# --------------------------------------------------------------------------------------
# The builders themselves (NumPy only)
# --------------------------------------------------------------------------------------

LAYOUTS = [
    "fortran",
    "transposed_view",
    "reversed_view",
    "strided_slice",
    "misaligned",
    "odd_stride",
    "readonly",
    "strided_sentinel",
]


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bool"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_builder(layout, dtype):
    x = (np.arange(24).reshape(2, 3, 4) % 5).astype(dtype)
    y, sentinel = _apply_layout(x, layout)
    _assert_layout(y, x, layout, sentinel)
    if layout == "misaligned" and np.dtype(dtype).itemsize > 1:
        assert not y.flags.aligned
    if layout == "odd_stride" and np.dtype(dtype).itemsize > 1:
        assert y.strides[-1] % y.itemsize != 0


def test_recipes():
    a = _recipe({"gen": "arange", "shape": [7, 13], "mod": 5, "offset": -2}, "float64")
    assert a.shape == (7, 13)
    np.testing.assert_array_equal(a.ravel(), np.arange(91) % 5 - 2)
    full = _recipe({"gen": "full", "shape": [2, 3], "value": 0.5}, "float32")
    assert full.dtype == np.float32 and np.all(full == 0.5)
    col = _recipe({"gen": "index_col", "S": 4}, "float64")
    np.testing.assert_array_equal(col, [[[0.0], [1.0], [2.0], [3.0]]])
    rows = _recipe({"gen": "index_rows", "S": 3}, "float64")
    np.testing.assert_array_equal(rows, [[[0.0, 1.0], [1.0, 1.0], [2.0, 1.0]]])
    band = _recipe({"gen": "band_mask", "L": 5, "S": 5, "window": 2}, "float64")
    ninf = -np.inf
    np.testing.assert_array_equal(
        band,
        [
            [0.0, ninf, ninf, ninf, ninf],
            [0.0, 0.0, ninf, ninf, ninf],
            [ninf, 0.0, 0.0, ninf, ninf],
            [ninf, ninf, 0.0, 0.0, ninf],
            [ninf, ninf, ninf, 0.0, 0.0],
        ],
    )
    band_bool = _recipe({"gen": "band_mask", "L": 3, "S": 3, "window": 2}, "bool")
    np.testing.assert_array_equal(band_bool, [[1, 0, 0], [1, 1, 0], [0, 1, 1]])
    keep = _recipe({"gen": "keep_one", "L": 2, "S": 3}, "bool")
    np.testing.assert_array_equal(keep, [[1, 0, 0], [1, 0, 0]])
    # The window_mean rule on index_rows values is [mean of the window's j, 1.0].
    case = {"expected": {"rule": "window_mean", "window": 3}}
    arrays = {
        "q": np.ones((1, 5, 2)),
        "v": _recipe({"gen": "index_rows", "S": 5}, "float64"),
    }
    np.testing.assert_array_equal(
        _window_mean(case, arrays),
        [[[0.0, 1.0], [0.5, 1.0], [1.0, 1.0], [2.0, 1.0], [3.0, 1.0]]],
    )


@pytest.mark.parametrize("case", REGULAR_CASES, ids=[case["id"] for case in REGULAR_CASES])
def test_case_inputs_build(case):
    plain, _ = _build_inputs(case, with_layout=False)
    arrays, sentinels = _build_inputs(case)
    dtypes = case.get("dtypes", {})
    for name in case["inputs"]:
        assert plain[name].dtype == np.dtype(dtypes.get(name, case["dtype"]))
        layout = case.get("layout", {}).get(name)
        _assert_layout(arrays[name], plain[name], layout, sentinels.get(name))
    for name, source in case.get("alias", {}).items():
        assert arrays[name] is arrays[source]
    # An expected array (literal or rule) can be built for every non-raising check.
    if case["check"].partition(":")[0] in ("allclose", "allclose_or_raises", "exact"):
        expected = _expected_array(case, arrays)
        if case.get("target") is not None:
            assert expected.shape == arrays[case["target"]].shape
