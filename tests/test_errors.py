"""One test per documented error (the ``Raises`` entries of softmax, log_softmax,
matmul_accumulate and scaled_dot_product_attention), each pinning its message.

Every failing call is made through :func:`raises_cleanly`, which also asserts that ``out``
(when given) is bit-for-bit unchanged and that no input was modified (DESIGN 3.10).
"""
import re

import numpy as np
import pytest

import cyattn

SM = "cyattn.softmax"
LSM = "cyattn.log_softmax"
MM = "cyattn.matmul_accumulate"
ATT = "cyattn.scaled_dot_product_attention"


def _bits(a):
    return np.ascontiguousarray(a).tobytes(), a.shape, a.dtype, a.strides


def raises_cleanly(exc, match, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` raises ``exc`` whose message contains ``match`` (a literal
    string, or a compiled regex); every ndarray argument, ``out`` included, is unchanged."""
    arrays = [a for a in list(args) + list(kwargs.values()) if isinstance(a, np.ndarray)]
    before = [_bits(a) for a in arrays]
    pattern = match if isinstance(match, re.Pattern) else re.escape(match)
    with pytest.raises(exc, match=pattern) as info:
        fn(*args, **kwargs)
    for a, b in zip(arrays, before):
        assert _bits(a) == b, "a failing call modified an argument"
    return info


def f64(*shape):
    return np.random.default_rng(sum(shape) + len(shape)).standard_normal(shape)


def fresh_out(shape, dtype=np.float64):
    out = np.full(shape, 1.25, dtype)
    out[..., 0] = np.nan                 # NaN payloads must survive a failed call too
    return out


def qkv(L=3, S=5, E=4, Ev=2, batch=()):
    return f64(*batch, L, E), f64(*batch, S, E), f64(*batch, S, Ev)


SOFTMAXES = pytest.mark.parametrize("fn,name", [(cyattn.softmax, SM), (cyattn.log_softmax, LSM)],
                                    ids=["softmax", "log_softmax"])

_LONGDOUBLE_IS_DOUBLE = np.dtype(np.longdouble) == np.dtype(np.float64)   # MSVC, arm64 macOS

BAD_DATA = [
    (np.array([[1, 2], [3, 4]], dtype=np.int64),
     "has dtype int64; expected float16, bfloat16, float32 or float64"),
    (np.array([[True, False]]), "has dtype bool; expected float16, bfloat16, float32 or float64"),
    (np.array([[1 + 2j, 3j]]), "has dtype complex128; expected float16, bfloat16, float32 or float64"),
    (np.array([[1.0, None]], dtype=object),
     "has dtype object; expected float16, bfloat16, float32 or float64"),
    (np.array([[1, 2]], dtype=np.uint8), "has dtype uint8; expected float16, bfloat16, float32 or float64"),
    pytest.param(np.array([[1.0, 2.0]], dtype=np.longdouble),
                 f"has dtype {np.dtype(np.longdouble)}; expected float16, bfloat16, float32 or float64",
                 marks=pytest.mark.skipif(_LONGDOUBLE_IS_DOUBLE,
                                          reason="long double is float64 on this platform")),
]
BAD_DATA_IDS = ["int", "bool", "complex", "object", "uint8", "longdouble"]
bad_data = pytest.mark.parametrize("bad,msg", BAD_DATA, ids=BAD_DATA_IDS)

BAD_MASKS = [
    (np.array([[1, 0]], dtype=np.int64),
     "has dtype int64; expected bool (True = take part) or a float dtype"),
    (np.array([[1, 0]], dtype=np.uint8), "has dtype uint8; expected bool"),
    (np.array([[1j, 0]]), "has dtype complex128; expected bool"),
    (np.array([[True, 0.5]], dtype=object), "has dtype object; expected bool"),
]
BAD_MASK_IDS = ["int", "uint8", "complex", "object"]
bad_masks = pytest.mark.parametrize("mask,msg", BAD_MASKS, ids=BAD_MASK_IDS)


# ------------------------------------------------------------------------------------------
# softmax / log_softmax
# ------------------------------------------------------------------------------------------

@SOFTMAXES
@bad_data
def test_softmax_bad_x_dtype(fn, name, bad, msg):
    raises_cleanly(TypeError, f"{name}: x {msg}", fn, bad, out=fresh_out(bad.shape))


@SOFTMAXES
def test_softmax_x_not_convertible(fn, name):
    raises_cleanly(TypeError, f"{name}: x could not be converted to an array", fn,
                   [[1.0, 2.0], [3.0]])


@SOFTMAXES
@bad_masks
def test_softmax_bad_mask_dtype(fn, name, mask, msg):
    x = f64(1, 2)
    raises_cleanly(TypeError, f"{name}: mask {msg}", fn, x, mask=mask, out=fresh_out((1, 2)))


@SOFTMAXES
def test_softmax_int_mask_from_list(fn, name):
    mask = [1, 0, 1]
    raises_cleanly(TypeError, f"{name}: mask has dtype {np.asarray(mask).dtype}; expected bool",
                   fn, f64(3), mask=mask)


@SOFTMAXES
def test_softmax_zero_dim(fn, name):
    raises_cleanly(ValueError, f"{name}: x must have at least 1 dimension, got a 0-d array",
                   fn, np.float64(1.0))


@SOFTMAXES
@pytest.mark.parametrize("axis", [2, -3, 100])
def test_softmax_axis_out_of_range(fn, name, axis):
    x = f64(3, 4)
    raises_cleanly(ValueError, f"{name}: axis {axis} is out of bounds for an array of "
                               f"dimension 2", fn, x, axis=axis, out=fresh_out((3, 4)))


@SOFTMAXES
@pytest.mark.parametrize("axis,tname", [(1.0, "float"), ("0", "str"), (None, "NoneType"),
                                        ([0], "list")])
def test_softmax_axis_not_int(fn, name, axis, tname):
    raises_cleanly(TypeError, f"{name}: axis must be an integer, got {tname}", fn, f64(3, 4),
                   axis=axis, out=fresh_out((3, 4)))


@SOFTMAXES
@pytest.mark.parametrize("mshape", [(2, 3, 4), (3, 5), (4, 4), (2, 1, 4)])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_softmax_mask_does_not_broadcast(fn, name, mshape, kind):
    x = f64(3, 4)
    mask = np.ones(mshape, bool) if kind == "bool" else np.zeros(mshape)
    raises_cleanly(ValueError, f"{name}: mask has shape {mshape}, which does not broadcast to "
                               f"(3, 4) without enlarging it", fn, x, mask=mask,
                   out=fresh_out((3, 4)))


@SOFTMAXES
def test_softmax_out_wrong_shape(fn, name):
    raises_cleanly(ValueError, f"{name}: out has shape (4, 3); expected (3, 4)", fn, f64(3, 4),
                   out=fresh_out((4, 3)))


@SOFTMAXES
@pytest.mark.parametrize("xdt,odt", [(np.float64, np.float32), (np.float32, np.float64),
                                     (np.float16, np.float32), (np.float32, np.float16)])
def test_softmax_out_wrong_dtype(fn, name, xdt, odt):
    x = f64(3, 4).astype(xdt)
    raises_cleanly(ValueError, f"{name}: out has dtype {np.dtype(odt)}; expected "
                               f"{np.dtype(xdt)}", fn, x, out=fresh_out((3, 4), odt))


@SOFTMAXES
def test_softmax_out_int_dtype(fn, name):
    raises_cleanly(ValueError, f"{name}: out has dtype int64; expected float64", fn, f64(3, 4),
                   out=np.zeros((3, 4), np.int64))


@SOFTMAXES
def test_softmax_out_read_only(fn, name):
    out = fresh_out((3, 4))
    out.flags.writeable = False
    raises_cleanly(ValueError, f"{name}: out is read-only; expected a writable array", fn,
                   f64(3, 4), out=out)


@SOFTMAXES
@pytest.mark.parametrize("out,tname", [([[0.0] * 4] * 3, "list"), (np.float64(0), "float64"),
                                       (memoryview(bytearray(96)), "memoryview")])
def test_softmax_out_not_ndarray(fn, name, out, tname):
    raises_cleanly(ValueError, f"{name}: out must be a numpy.ndarray, got {tname}", fn,
                   f64(3, 4), out=out)


# ------------------------------------------------------------------------------------------
# matmul_accumulate
# ------------------------------------------------------------------------------------------

@bad_data
@pytest.mark.parametrize("which", ["a", "b"])
def test_matmul_bad_input_dtype(which, bad, msg):
    good = f64(2, 2)
    a, b = (bad, good) if which == "a" else (good, bad.reshape(2, 1) if bad.size == 2 else bad)
    out = fresh_out((a.shape[0], b.shape[1]))
    raises_cleanly(TypeError, f"{MM}: {which} {msg}", cyattn.matmul_accumulate, a, b, out)


@pytest.mark.parametrize("dt", [np.int64, np.bool_, np.complex128, np.int8])
def test_matmul_bad_out_dtype(dt):
    out = np.zeros((2, 2), dt)
    raises_cleanly(TypeError, f"{MM}: out has dtype {np.dtype(dt)}; expected float16, bfloat16, "
                              f"float32 or float64", cyattn.matmul_accumulate, f64(2, 3),
                   f64(3, 2), out)


@pytest.mark.parametrize("alpha,tname", [(1j, "complex"), ("2", "str"), (None, "NoneType"),
                                         (True, "bool"), (np.array([1.0]), "ndarray")])
def test_matmul_alpha_not_real(alpha, tname):
    raises_cleanly(TypeError, f"{MM}: alpha must be a real number, got {tname}",
                   cyattn.matmul_accumulate, f64(2, 3), f64(3, 2), fresh_out((2, 2)),
                   alpha=alpha)


@pytest.mark.parametrize("which", ["a", "b", "out"])
def test_matmul_too_few_dims(which):
    a, b, out = f64(2, 3), f64(3, 2), fresh_out((2, 2))
    if which == "a":
        a = f64(3)
    elif which == "b":
        b = f64(3)
    else:
        out = fresh_out((2,))
    shape = {"a": a, "b": b, "out": out}[which].shape
    raises_cleanly(ValueError, f"{MM}: {which} must have at least 2 dimensions (..., rows, "
                               f"cols), got shape {shape}", cyattn.matmul_accumulate, a, b, out)


def test_matmul_inner_dims_differ():
    raises_cleanly(ValueError, f"{MM}: a has shape (2, 3) and b has shape (4, 2); expected "
                               f"a (..., M, K) and b (..., K, N) with equal K",
                   cyattn.matmul_accumulate, f64(2, 3), f64(4, 2), fresh_out((2, 2)))


@pytest.mark.parametrize("sa,sb,so", [
    ((2, 2, 3), (3, 3, 4), (2, 2, 4)),        # a and b batches do not broadcast
    ((2, 2, 3), (3, 4), (2, 4)),              # a's batch would enlarge out
    ((2, 3), (5, 3, 4), (2, 2, 4)),           # b's batch does not fit out's
    ((3, 2, 3), (3, 4), (2, 2, 4)),           # a's batch does not fit out's
    ((2, 3), (3, 4), (2, 5)),                 # out has the wrong N
    ((2, 3), (3, 4), (3, 4)),                 # out has the wrong M
    ((2, 3), (3, 4), (1, 2, 5)),
], ids=["ab", "enlarge_a", "b_vs_out", "a_vs_out", "wrong_N", "wrong_M", "batched_wrong_N"])
def test_matmul_shapes_do_not_fit_out(sa, sb, so):
    out = fresh_out(so)
    M, N = sa[-2], sb[-1]
    raises_cleanly(ValueError, f"{MM}: out has shape {so}; a {sa} @ b {sb} needs out of shape "
                               f"(..., {M}, {N}) whose batch dims a's and b's broadcast to",
                   cyattn.matmul_accumulate, f64(*sa), f64(*sb), out)


@pytest.mark.parametrize("adt,bdt,odt", [
    (np.float64, np.float64, np.float32), (np.float32, np.float32, np.float64),
    (np.float32, np.float64, np.float32), (np.float16, np.float16, np.float32),
    (np.float16, np.float32, np.float16)])
def test_matmul_out_wrong_dtype(adt, bdt, odt):
    res = np.result_type(adt, bdt)
    raises_cleanly(ValueError, f"{MM}: out has dtype {np.dtype(odt)}; expected {res}",
                   cyattn.matmul_accumulate, f64(2, 3).astype(adt), f64(3, 2).astype(bdt),
                   fresh_out((2, 2), odt))


def test_matmul_out_read_only():
    out = fresh_out((2, 2))
    out.flags.writeable = False
    raises_cleanly(ValueError, f"{MM}: out is read-only; expected a writable array",
                   cyattn.matmul_accumulate, f64(2, 3), f64(3, 2), out)
    out = np.broadcast_to(np.zeros(2), (2, 2))
    raises_cleanly(ValueError, f"{MM}: out is read-only", cyattn.matmul_accumulate, f64(2, 3),
                   f64(3, 2), out)


@pytest.mark.parametrize("out,tname", [([[0.0, 0.0], [0.0, 0.0]], "list"), (None, "NoneType"),
                                       ((0.0, 0.0), "tuple")])
def test_matmul_out_not_ndarray(out, tname):
    raises_cleanly(ValueError, f"{MM}: out must be a numpy.ndarray, got {tname}",
                   cyattn.matmul_accumulate, f64(2, 3), f64(3, 2), out)


def test_matmul_n_threads_zero():
    raises_cleanly(ValueError, f"{MM}: n_threads must be nonzero (None for the default, a "
                               f"negative value counts back from the maximum of",
                   cyattn.matmul_accumulate, f64(2, 3), f64(3, 2), fresh_out((2, 2)),
                   n_threads=0)


@pytest.mark.parametrize("n,tname", [(1.0, "float"), ("2", "str"), (True, "bool"),
                                     (False, "bool"), (np.bool_(True), "bool"),
                                     (np.float64(2), "float64")])
def test_matmul_n_threads_not_int(n, tname):
    raises_cleanly(TypeError, f"{MM}: n_threads must be an int or None, got {tname}",
                   cyattn.matmul_accumulate, f64(2, 3), f64(3, 2), fresh_out((2, 2)),
                   n_threads=n)


def test_matmul_errors_checked_before_empty_shortcut():
    """Validation happens even when there is nothing to compute (K == 0, empty out)."""
    raises_cleanly(ValueError, f"{MM}: n_threads must be nonzero", cyattn.matmul_accumulate,
                   f64(2, 0), f64(0, 2), fresh_out((2, 2)), n_threads=0)
    raises_cleanly(ValueError, f"{MM}: out has dtype float32; expected float64",
                   cyattn.matmul_accumulate, f64(0, 3), f64(3, 2), np.zeros((0, 2), np.float32))


# ------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# ------------------------------------------------------------------------------------------

@bad_data
@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_sdpa_bad_input_dtype(which, bad, msg):
    args = {"query": f64(1, 2), "key": f64(1, 2), "value": f64(1, 2)}
    args[which] = bad[:1, :2] if bad.ndim == 2 else bad
    raises_cleanly(TypeError, f"{ATT}: {which} {msg}", cyattn.scaled_dot_product_attention,
                   args["query"], args["key"], args["value"], out=fresh_out((1, 2)))


def test_sdpa_input_not_convertible():
    raises_cleanly(TypeError, f"{ATT}: key could not be converted to an array",
                   cyattn.scaled_dot_product_attention, f64(2, 2), [[1.0, 2.0], [1.0]],
                   f64(2, 2))


@bad_masks
def test_sdpa_bad_mask_dtype(mask, msg):
    q, k, v = qkv(L=1, S=2)
    raises_cleanly(TypeError, f"{ATT}: attn_mask {msg}", cyattn.scaled_dot_product_attention,
                   q, k, v, mask, out=fresh_out((1, 2)))


@pytest.mark.parametrize("scale,tname", [("0.5", "str"), (1j, "complex"), (True, "bool"),
                                         ([1.0], "list"), (np.array(0.5), "ndarray")])
def test_sdpa_scale_not_real(scale, tname):
    q, k, v = qkv()
    raises_cleanly(TypeError, f"{ATT}: scale must be a real number, got {tname}",
                   cyattn.scaled_dot_product_attention, q, k, v, scale=scale,
                   out=fresh_out((3, 2)))


@pytest.mark.parametrize("arg", ["is_causal", "enable_gqa", "return_lse"])
@pytest.mark.parametrize("value,tname", [(1, "int"), (0, "int"), (None, "NoneType"),
                                         ("True", "str"), (np.array(True), "ndarray")])
def test_sdpa_flag_not_bool(arg, value, tname):
    q, k, v = qkv()
    raises_cleanly(TypeError, f"{ATT}: {arg} must be a bool, got {tname}",
                   cyattn.scaled_dot_product_attention, q, k, v, out=fresh_out((3, 2)),
                   **{arg: value})


@pytest.mark.parametrize("n,tname", [(1.5, "float"), ("2", "str"), (True, "bool"),
                                     (np.bool_(False), "bool")])
def test_sdpa_n_threads_not_int(n, tname):
    q, k, v = qkv()
    raises_cleanly(TypeError, f"{ATT}: n_threads must be an int or None, got {tname}",
                   cyattn.scaled_dot_product_attention, q, k, v, n_threads=n,
                   out=fresh_out((3, 2)))


def test_sdpa_n_threads_zero():
    q, k, v = qkv()
    raises_cleanly(ValueError, f"{ATT}: n_threads must be nonzero",
                   cyattn.scaled_dot_product_attention, q, k, v, n_threads=0,
                   out=fresh_out((3, 2)))


@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_sdpa_too_few_dims(which):
    args = dict(zip(("query", "key", "value"), qkv(L=4, S=4, E=4, Ev=4)))
    args[which] = f64(4)
    raises_cleanly(ValueError, f"{ATT}: {which} must have at least 2 dimensions (..., length, "
                               f"dim), got shape (4,)", cyattn.scaled_dot_product_attention,
                   args["query"], args["key"], args["value"], out=fresh_out((4, 4)))


def test_sdpa_e_mismatch():
    q, k, v = f64(3, 4), f64(5, 6), f64(5, 2)
    raises_cleanly(ValueError, f"{ATT}: query has E=4 (shape (3, 4)) but key has E=6 (shape "
                               f"(5, 6)); expected equal last dimensions",
                   cyattn.scaled_dot_product_attention, q, k, v, out=fresh_out((3, 2)))


def test_sdpa_s_mismatch():
    q, k, v = f64(3, 4), f64(5, 4), f64(6, 2)
    raises_cleanly(ValueError, f"{ATT}: key has S=5 rows (shape (5, 4)) but value has 6 (shape "
                               f"(6, 2)); expected equal", cyattn.scaled_dot_product_attention,
                   q, k, v, out=fresh_out((3, 2)))


@pytest.mark.parametrize("qb,kb,vb", [((2,), (3,), (3,)), ((2, 3), (2, 3), (3, 3)),
                                      ((4, 2), (2,), (3, 2))])
def test_sdpa_batch_does_not_broadcast(qb, kb, vb):
    q, k, v = f64(*qb, 3, 4), f64(*kb, 5, 4), f64(*vb, 5, 2)
    raises_cleanly(ValueError, f"{ATT}: batch dimensions of query {qb}, key {kb} and value "
                               f"{vb} do not broadcast together",
                   cyattn.scaled_dot_product_attention, q, k, v)


@pytest.mark.parametrize("hq,hk,hv", [(4, 3, 3), (4, 2, 1), (2, 4, 4), (4, 0, 0), (3, 2, 2)])
def test_sdpa_gqa_head_mismatch(hq, hk, hv):
    q, k, v = f64(2, hq, 3, 4), f64(2, hk, 5, 4), f64(2, hv, 5, 2)
    raises_cleanly(ValueError, f"{ATT}: with enable_gqa, key and value must have the same "
                               f"number of heads dividing the query's; got query {hq}, key "
                               f"{hk}, value {hv} heads", cyattn.scaled_dot_product_attention,
                   q, k, v, enable_gqa=True, out=fresh_out((2, hq, 3, 2)))


def test_sdpa_gqa_needs_head_dim():
    q, k, v = f64(3, 4), f64(5, 4), f64(5, 2)
    raises_cleanly(ValueError, f"{ATT}: enable_gqa needs a head dimension (axis -3) on query, "
                               f"key and value", cyattn.scaled_dot_product_attention, q, k, v,
                   enable_gqa=True, out=fresh_out((3, 2)))


def test_sdpa_gqa_outer_batch_does_not_broadcast():
    q, k, v = f64(2, 4, 3, 4), f64(3, 2, 5, 4), f64(3, 2, 5, 2)
    raises_cleanly(ValueError, f"{ATT}: batch dimensions of query (2,), key (3,) and value (3,) "
                               f"do not broadcast together", cyattn.scaled_dot_product_attention,
                   q, k, v, enable_gqa=True)


@pytest.mark.parametrize("mshape", [(2, 3, 3, 5), (3, 4), (5, 3), (1, 2, 1, 5), (4, 5)])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_sdpa_mask_does_not_broadcast(mshape, kind):
    q, k, v = qkv(batch=(3,))
    mask = np.ones(mshape, bool) if kind == "bool" else np.zeros(mshape)
    raises_cleanly(ValueError, f"{ATT}: attn_mask has shape {mshape}, which does not broadcast "
                               f"to (3, 3, 5) without enlarging it",
                   cyattn.scaled_dot_product_attention, q, k, v, mask,
                   out=fresh_out((3, 3, 2)))


@pytest.mark.parametrize("align", ["center", "TOP_LEFT", "", None, "bottom-right"])
def test_sdpa_bad_causal_alignment(align):
    q, k, v = qkv()
    raises_cleanly(ValueError, f"{ATT}: causal_alignment must be 'top_left' or 'bottom_right', "
                               f"got {align!r}", cyattn.scaled_dot_product_attention, q, k, v,
                   is_causal=True, causal_alignment=align, out=fresh_out((3, 2)))


@pytest.mark.allocation_refusal("about 2.25 TiB of scratch in this process")
def test_sdpa_memory_error_names_the_function():
    # E = 2**31 + 1 on zero-stride views: the per-thread scratch (packed query panel and key
    # block, about 2.25 TiB) cannot be allocated.
    # (Not through raises_cleanly: its snapshot would copy the 24 GiB views; they are
    # read-only broadcasts, so the call cannot modify them anyway.)
    bt = np.broadcast_to
    with pytest.raises(MemoryError, match=re.escape(f"{ATT}: could not allocate scratch")):
        cyattn.scaled_dot_product_attention(bt(np.float32(0), (1, 2**31 + 1)),
                                            bt(np.float32(0), (3, 2**31 + 1)),
                                            np.ones((3, 2), np.float32))


def test_sdpa_out_wrong_shape():
    q, k, v = qkv(batch=(2,))
    raises_cleanly(ValueError, f"{ATT}: out has shape (2, 3, 4); expected (2, 3, 2)",
                   cyattn.scaled_dot_product_attention, q, k, v, out=fresh_out((2, 3, 4)))
    raises_cleanly(ValueError, f"{ATT}: out has shape (3, 2); expected (2, 3, 2)",
                   cyattn.scaled_dot_product_attention, q, k, v, out=fresh_out((3, 2)))


@pytest.mark.parametrize("dts,odt", [((np.float64,) * 3, np.float32),
                                     ((np.float32,) * 3, np.float64),
                                     ((np.float16,) * 3, np.float32),
                                     ((np.float32, np.float64, np.float32), np.float32)])
def test_sdpa_out_wrong_dtype(dts, odt):
    q, k, v = (t.astype(d) for t, d in zip(qkv(), dts))
    res = np.result_type(*dts)
    raises_cleanly(ValueError, f"{ATT}: out has dtype {np.dtype(odt)}; expected {res}",
                   cyattn.scaled_dot_product_attention, q, k, v, out=fresh_out((3, 2), odt))


def test_sdpa_out_read_only():
    q, k, v = qkv()
    out = fresh_out((3, 2))
    out.flags.writeable = False
    raises_cleanly(ValueError, f"{ATT}: out is read-only; expected a writable array",
                   cyattn.scaled_dot_product_attention, q, k, v, out=out)


@pytest.mark.parametrize("out,tname", [([[0.0] * 2] * 3, "list"), (3.0, "float")])
def test_sdpa_out_not_ndarray(out, tname):
    q, k, v = qkv()
    raises_cleanly(ValueError, f"{ATT}: out must be a numpy.ndarray, got {tname}",
                   cyattn.scaled_dot_product_attention, q, k, v, out=out)


def test_failed_call_with_out_aliasing_input_leaves_everything():
    """out is also an input: a failed call still changes nothing."""
    q, k, v = qkv(L=5, S=5, E=2, Ev=2)
    raises_cleanly(ValueError, f"{ATT}: n_threads must be nonzero",
                   cyattn.scaled_dot_product_attention, q, k, v, out=q, n_threads=0)
    a = f64(3, 3)
    raises_cleanly(TypeError, f"{MM}: alpha must be a real number",
                   cyattn.matmul_accumulate, a, f64(3, 3), a, alpha="x")
    x = f64(3, 3)
    raises_cleanly(TypeError, f"{SM}: mask has dtype int64", cyattn.softmax, x,
                   mask=np.ones(3, np.int64), out=x)


# ------------------------------------------------------------------------------------------
# Found by a fresh-eyes user test (each was wrong once)
# ------------------------------------------------------------------------------------------

def test_byte_swapped_floats_are_accepted():
    x = np.array([1.0, 2.0, 3.0])
    swapped = x.astype(">f8" if np.little_endian else "<f8")
    np.testing.assert_array_equal(cyattn.softmax(swapped), cyattn.softmax(x))


def test_non_integer_dtype_message_has_no_integer_hint():
    with pytest.raises(TypeError, match=r"complex128; expected float16, bfloat16, float32 or float64$"):
        cyattn.softmax(np.ones(3, np.complex128))


@pytest.mark.parametrize("kw", ["key_padding_mask", "attn_mask"])
def test_mha_integer_mask_message_states_ignore_polarity(kw):
    mha = cyattn.MultiHeadAttention(8, 2)
    x = np.ones((5, 3, 8), np.float32)
    mask = np.zeros((3, 5), int) if kw == "key_padding_mask" else np.zeros((5, 5), int)
    with pytest.raises(TypeError, match=r"True = ignore"):
        mha(x, x, x, **{kw: mask})


def test_huge_int_alpha_and_scale_raise_value_error_naming_them():
    with pytest.raises(ValueError, match=r"alpha is too large"):
        cyattn.matmul_accumulate(np.ones((2, 3)), np.ones((3, 2)), np.ones((2, 2)),
                                 alpha=10**400)
    with pytest.raises(ValueError, match=r"scale is too large"):
        cyattn.scaled_dot_product_attention(np.ones((1, 2)), np.ones((2, 2)), np.ones((2, 2)),
                                            scale=10**400)


def test_float16_result_overflow_gives_inf_without_warning():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = cyattn.log_softmax(np.array([65504, -65504], np.float16))
        q = np.full((1, 4), 100, np.float16)
        k = np.full((2, 4), 100, np.float16)
        _, lse = cyattn.scaled_dot_product_attention(q, k, np.ones((2, 1), np.float16),
                                                     scale=10.0, return_lse=True)
    assert out.dtype == np.float16 and out[0] == 0 and out[1] == -np.inf
    assert lse.dtype == np.float16 and np.isposinf(lse).all()


def test_mha_bad_seed_message_names_seed():
    with pytest.raises(ValueError, match=r"seed must be"):
        cyattn.MultiHeadAttention(8, 2, seed=-1)
