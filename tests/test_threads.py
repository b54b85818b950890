"""Thread-count invariance, concurrent calls from Python threads, and n_threads validation.

Results must be bit-identical for any thread count (DESIGN 3.11: work is split only across
independent rows / output tiles / (batch, head, query block) tasks), NaN positions included.
"""
import concurrent.futures
import threading

import numpy as np
import pytest
from conftest import freeze

import cyattn
from cyattn import _backend

THREAD_COUNTS = [1, 2, 3, -1, None]

try:
    import threadpoolctl
except ImportError:          # pragma: no cover - threadpoolctl is a test extra
    threadpoolctl = None


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    mm = {"a": rng.standard_normal((200, 300)), "b": rng.standard_normal((300, 250)),
              "out": rng.standard_normal((200, 250))}
    mm["a"][5, 7] = np.nan                                   # a NaN row in the product
    q = rng.standard_normal((2, 3, 200, 32))
    k = rng.standard_normal((2, 3, 200, 32))
    v = rng.standard_normal((2, 3, 200, 32))
    q[1, 2, 150, 3] = np.nan                                 # a NaN output row
    keep = rng.random((2, 1, 200, 200)) < 0.8
    keep[0, 0, 17] = False                                   # a fully masked row
    x = rng.standard_normal((700, 129)) * 5
    x[3, 4] = np.nan
    x[9] = -np.inf
    return mm, (q, k, v, keep), x


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_matmul_bit_identical_for_any_thread_count(variant, dtype):
    mm, _, _ = _inputs()
    a, b = mm["a"].astype(dtype), mm["b"].astype(dtype)
    results = []
    for n in THREAD_COUNTS:
        out = mm["out"].astype(dtype)
        cyattn.matmul_accumulate(a, b, out, alpha=0.5, n_threads=n)
        results.append(out)
    assert np.isnan(results[0]).any()
    for n, r in zip(THREAD_COUNTS[1:], results[1:]):
        np.testing.assert_array_equal(r, results[0], err_msg=f"n_threads={n}")
    # batched, with broadcasting of b
    a3 = np.stack([a[:, :100], a[:, 100:200], a[:, 200:]])
    ref = None
    for n in THREAD_COUNTS:
        out = np.zeros((3, 200, 250), dtype)
        cyattn.matmul_accumulate(a3, b[:100], out, n_threads=n)
        if ref is None:
            ref = out
        np.testing.assert_array_equal(out, ref, err_msg=f"batched n_threads={n}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("shape", [(1000, 300, 40), (21, 300, 4100), (333, 280, 333)],
                         ids=["tall", "wide", "square"])
def test_matmul_tiles_do_not_change_bits(variant, dtype, shape):
    # Output tiles are split along the longer side, by thread count (matmul_tiles): tall
    # products split M, wide ones (past NC columns) N. No split may change any element.
    M, K, N = shape
    rng = np.random.default_rng(7)
    a = rng.standard_normal((M, K)).astype(dtype)
    b = rng.standard_normal((K, N)).astype(dtype)
    c0 = rng.standard_normal((M, N)).astype(dtype)
    results = []
    for n in (1, 2, 3):
        out = c0.copy()
        cyattn.matmul_accumulate(a, b, out, alpha=0.75, n_threads=n)
        results.append(out)
    for n, r in zip((2, 3), results[1:]):
        np.testing.assert_array_equal(r, results[0], err_msg=f"n_threads={n}")
    # a single row and a single column alone give the same bits as inside the whole product
    row = c0[M // 2:M // 2 + 1].copy()
    cyattn.matmul_accumulate(a[M // 2:M // 2 + 1], b, row, alpha=0.75, n_threads=1)
    np.testing.assert_array_equal(row, results[0][M // 2:M // 2 + 1])
    col = c0[:, N - 1:].copy()
    cyattn.matmul_accumulate(a, b[:, N - 1:], col, alpha=0.75, n_threads=1)
    np.testing.assert_array_equal(col, results[0][:, N - 1:])
    np.testing.assert_allclose(results[0], c0 + 0.75 * (a.astype(np.float64) @ b),
                               rtol=1e-4 if dtype == np.float32 else 1e-12,
                               atol=1e-3 if dtype == np.float32 else 1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("mode", ["plain", "bool", "causal_br", "float"])
def test_sdpa_bit_identical_for_any_thread_count(variant, dtype, mode):
    _, (q, k, v, keep), _ = _inputs()
    q, k, v = q.astype(dtype), k.astype(dtype), v.astype(dtype)
    kw = {"plain": {}, "bool": {"attn_mask": keep},
          "causal_br": {"is_causal": True, "causal_alignment": "bottom_right"},
          "float": {"attn_mask": np.where(keep, 0.0, -np.inf).astype(dtype)}}[mode]
    ref = None
    for n in THREAD_COUNTS:
        out, lse = cyattn.scaled_dot_product_attention(q, k, v, return_lse=True, n_threads=n,
                                                       **kw)
        if ref is None:
            ref = (out, lse)
            assert np.isnan(out).any()
        np.testing.assert_array_equal(out, ref[0], err_msg=f"n_threads={n}")
        np.testing.assert_array_equal(lse, ref[1], err_msg=f"n_threads={n}")
    # GQA too
    ref = None
    for n in THREAD_COUNTS:
        out = cyattn.scaled_dot_product_attention(q, k[:, :1], v[:, :1], enable_gqa=True,
                                                  n_threads=n, **kw)
        ref = out if ref is None else ref
        np.testing.assert_array_equal(out, ref, err_msg=f"gqa n_threads={n}")


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_softmax_bit_identical_for_any_thread_count(variant, dtype, log):
    """softmax has no n_threads argument: the kernel's thread count is driven directly, and
    the public function under OpenMP limits set with threadpoolctl."""
    _, _, x = _inputs()
    x = x.astype(dtype)
    kern = _backend.kernels
    ref = None
    for n in (1, 2, 3, max(1, _backend.max_threads())):
        out = np.empty_like(x)
        kern.softmax_rows(x, out, None, None, 0, 0, 0, 0, log, n)
        ref = out if ref is None else ref
        np.testing.assert_array_equal(out, ref, err_msg=f"kernel n_threads={n}")
    fn = cyattn.log_softmax if log else cyattn.softmax
    public = fn(x)
    np.testing.assert_array_equal(public, ref)
    if threadpoolctl is not None:
        for limit in (1, 2, 3):
            with threadpoolctl.threadpool_limits(limits=limit, user_api="openmp"):
                np.testing.assert_array_equal(fn(x), public, err_msg=f"openmp limit {limit}")
                np.testing.assert_array_equal(fn(x, mask=x > 0), fn(x, mask=x > 0))


def test_batch_split_does_not_change_results(variant):
    """Computing a batch at once equals computing each entry on its own."""
    _, (q, k, v, keep), _ = _inputs(1)
    out = cyattn.scaled_dot_product_attention(q, k, v, keep, n_threads=-1)
    for b in range(2):
        for h in range(3):
            np.testing.assert_array_equal(
                out[b, h], cyattn.scaled_dot_product_attention(q[b, h], k[b, h], v[b, h],
                                                               keep[b, 0], n_threads=1))
    mm, _, _ = _inputs(1)
    a3 = np.stack([mm["a"][:, :100]] * 2)
    out = np.zeros((2, 200, 250))
    cyattn.matmul_accumulate(a3, mm["b"][:100], out)
    single = np.zeros((200, 250))
    cyattn.matmul_accumulate(a3[0], mm["b"][:100], single, n_threads=1)
    np.testing.assert_array_equal(out[0], single)
    np.testing.assert_array_equal(out[1], single)


def test_concurrent_python_threads_match_serial(variant):
    """8 Python threads calling at once on shared read-only inputs get the serial results."""
    mm, (q, k, v, keep), x = _inputs(2)
    freeze(mm["a"], mm["b"], q, k, v, keep, x)
    base = mm["out"].copy()
    freeze(base)

    def job(i):
        n = THREAD_COUNTS[i % len(THREAD_COUNTS)]
        out = base.copy()
        cyattn.matmul_accumulate(mm["a"], mm["b"], out, alpha=0.25 * (i % 3), n_threads=n)
        att, lse = cyattn.scaled_dot_product_attention(
            q, k, v, keep if i % 2 else None, is_causal=bool(i % 3 == 0), return_lse=True,
            n_threads=n)
        sm = cyattn.softmax(x, axis=i % 2)
        lsm = cyattn.log_softmax(x, mask=x > -1)
        return out, att, lse, sm, lsm

    serial = [job(i) for i in range(8)]
    barrier = threading.Barrier(8)

    def synced(i):
        barrier.wait()
        return [job(i) for _ in range(2)]

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(synced, range(8)))
    for i, reps in enumerate(results):
        for rep in reps:
            for got, want in zip(rep, serial[i]):
                np.testing.assert_array_equal(got, want, err_msg=f"thread {i}")


def test_concurrent_calls_writing_distinct_outs(variant):
    """Threads writing into disjoint views of one out buffer do not interfere."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((8, 2, 130, 16))
    q.flags.writeable = False
    buf = np.zeros((8, 2, 130, 16))

    def job(i):
        cyattn.scaled_dot_product_attention(q[i], q[i], q[i], is_causal=True, out=buf[i],
                                            n_threads=2)

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(job, range(8)))
    np.testing.assert_array_equal(buf, cyattn.scaled_dot_product_attention(q, q, q,
                                                                           is_causal=True))


# ------------------------------------------------------------------------------------------
# n_threads validation
# ------------------------------------------------------------------------------------------

def _call(fn_name, n):
    a = np.ones((4, 3))
    if fn_name == "matmul":
        return cyattn.matmul_accumulate(a, a.T, np.zeros((4, 4)), n_threads=n)
    return cyattn.scaled_dot_product_attention(a, a, a, n_threads=n)


@pytest.mark.parametrize("fn_name", ["matmul", "sdpa"])
def test_n_threads_accepted_values(fn_name):
    ref = _call(fn_name, None)
    for n in (1, 2, 3, 64, -1, -2, -1000, np.int64(2), np.int32(-1), np.uint8(3)):
        np.testing.assert_array_equal(_call(fn_name, n), ref, err_msg=repr(n))


@pytest.mark.parametrize("fn_name", ["matmul", "sdpa"])
def test_n_threads_zero_is_value_error(fn_name):
    with pytest.raises(ValueError, match="n_threads must be nonzero"):
        _call(fn_name, 0)
    with pytest.raises(ValueError, match="n_threads must be nonzero"):
        _call(fn_name, np.int64(0))


@pytest.mark.parametrize("fn_name", ["matmul", "sdpa"])
@pytest.mark.parametrize("n", [1.0, 2.5, "2", True, False, np.bool_(True), [2], np.float32(2)],
                         ids=["1.0", "2.5", "str", "True", "False", "np_bool", "list", "np_f32"])
def test_n_threads_not_int_is_type_error(fn_name, n):
    with pytest.raises(TypeError, match="n_threads must be an int or None, got"):
        _call(fn_name, n)


def test_default_threads_follow_openmp_limits():
    if threadpoolctl is None:
        pytest.skip("threadpoolctl not installed")
    with threadpoolctl.threadpool_limits(limits=1, user_api="openmp"):
        assert _backend.max_threads() == 1
        assert cyattn.config()["default_threads"] == 1
