"""Scaled dot-product attention ``softmax(scale * Q K^T + mask) V``."""
import math

import numpy as np

from . import _backend
from . import _kv8
from . import _validate as V
from .matmul import _resolve_precision, _bf16_arm, _dot_name, _EMULATIONS

__all__ = ["scaled_dot_product_attention"]

_FNAME = "cyattn.scaled_dot_product_attention"
_DECODE_MAX_L = 16       # the kernels' DECODE_MAX_L: at most this many query rows may decode
_ndarray = np.ndarray
_empty = np.empty
_FLOAT32, _BOOL, _UINT16 = np.dtype(np.float32), np.dtype(np.bool_), np.dtype(np.uint16)
_STORAGE = {1: _UINT16, 2: _UINT16, _kv8.KV8_I8: np.dtype(np.uint8),
            _kv8.KV8_E4M3: np.dtype(np.uint8)}     # the kernels' view of each element format


def default_bf16_path():
    """One line for ``python -m cyattn info``: which path bfloat16 attention takes by default
    with the loaded kernels, and why (_backend.bf16_path's reason)."""
    path, why = _backend.default_bf16_path()
    if path == "amx":
        return (f"fast on AMX tiles (tdpbf16ps, P rounded to bf16) for prefill and decode by "
                f"default [{why}]; precision='exact': float32 FMAs")
    if path == "fast":
        return (f"fast ({_dot_name()}, P rounded to bf16) for prefill (L > 16) by default, "
                f"decode exact [{why}]; precision='exact': float32 FMAs")
    return (f"exact (float32 FMAs) by default [{why}]; precision='fast': {_dot_name()} for "
            f"prefill")


def _on_tiles(emulate):
    """Whether the bf16 fast path runs on AMX tiles: the amx variant's instructions (unless
    ``emulate`` asks for the vdpbf16ps emulation), or the tiles' model (``emulate="amx"``)."""
    return emulate == "amx" or (emulate is False and getattr(_backend.kernels, "AMX", False))


def _fast_call(query, key, value, attn_mask, is_causal, scale, causal_alignment, return_lse,
               enable_gqa, out, n_threads, precision=None, emulate=False):
    """The common call: aligned float32/float64 arrays of one dtype whose last axis has unit
    stride (C-contiguous, or head views of a fused projection), equal batch shapes (GQA heads
    aside), no mask or a bool mask or a float mask of that dtype that broadcasts without
    enlarging, no ``out`` or a writable one of the result's shape and dtype (C-contiguous and
    apart from the inputs: written directly; else it gets a copy), plain Python options. The
    kernel module checks the buffers in one pass and allocates the results; None means the
    call must take the general path (which also produces every error message, a bad
    ``precision``'s too: None, "exact" and "fast" pass here, resolved for 16-bit inputs only).
    8-bit K/V never pass: the kernel module takes float K/V only."""
    if not (type(query) is _ndarray and type(key) is _ndarray and type(value) is _ndarray
            and (attn_mask is None or type(attn_mask) is _ndarray)
            and (out is None or type(out) is _ndarray)
            and (is_causal is False or is_causal is True)
            and (return_lse is False or return_lse is True)
            and (enable_gqa is False or enable_gqa is True)
            and (scale is None or (type(scale) is float and scale - scale == 0.0))
            and (precision is None or (type(precision) is str
                                       and (precision == "exact" or precision == "fast")))):
        return None
    if causal_alignment == "top_left":
        bottom_right = False
    elif causal_alignment == "bottom_right":
        bottom_right = True
    else:
        return None
    n_threads = V.fast_threads(n_threads)
    if n_threads == 0:
        return None
    if query.dtype.itemsize == 2:
        if precision is None:
            precision = _resolve_precision(None, _FNAME)
        if precision == "fast" and _on_tiles(emulate):
            return None             # the tile path runs from the general path only
        return _fast_half_call(query, key, value, attn_mask, is_causal, scale, bottom_right,
                               return_lse, enable_gqa, out, n_threads, precision, emulate)
    res = _backend.kernels.attention_fast(query, key, value, attn_mask, out, scale, is_causal,
                                          bottom_right, enable_gqa, return_lse, n_threads,
                                          _empty)
    if res is None or return_lse:
        return res
    return res[0]


def _fast_half_call(query, key, value, attn_mask, is_causal, scale, bottom_right, return_lse,
                    enable_gqa, out, n_threads, precision, emulate=False):
    """_fast_call for query, key and value of one 16-bit dtype (float16, bfloat16): the
    kernels read them as they are (a query of up to _DECODE_MAX_L rows as a float32 copy, as
    the decode path reads it), compute in float32, and the result is rounded once, as the
    general path does; None for anything else (a float mask that is not float32, an ``out``
    that is not of the dtype, a row whose result is not finite: the general path then decides).
    bfloat16 with ``precision="fast"`` and more than _DECODE_MAX_L query rows: the bf16 fast
    path (the emulation with ``emulate``).
    """
    dtype = query.dtype
    qs, ks, vs = query.shape, key.shape, value.shape
    # shapes first: the float32 copy of a decode query below must not be made (or fail) for
    # a call the general path then refuses with its own message
    if (key.dtype != dtype or value.dtype != dtype or not 2 <= len(qs) == len(ks) == len(vs)
            or qs[-1] != ks[-1] or ks[:-1] != vs[:-1]
            or not (qs[:-2] == ks[:-2] or (enable_gqa and len(qs) >= 3 and qs[:-3] == ks[:-3]
                                           and ks[-3] and qs[-3] % ks[-3] == 0))):
        return None
    fmt = V.half_format(query, _FLOAT32)
    if not fmt or (out is not None and (
            out.dtype != dtype or not out.flags.writeable
            or out.shape != query.shape[:-1] + value.shape[-1:])) or (
            attn_mask is not None and attn_mask.dtype != _BOOL and attn_mask.dtype != _FLOAT32):
        return None
    if query.shape[-2] <= _DECODE_MAX_L:
        q, q_fmt = query.astype(_FLOAT32), 0
    else:
        q, q_fmt = query.view(_UINT16), fmt
    bf16_dot = q_fmt != 0 and precision == "fast" and fmt == V.HALF_BF16
    res = _backend.kernels.attention_fast(q, key.view(_UINT16), value.view(_UINT16), attn_mask,
                                          None, scale, is_causal, bottom_right, enable_gqa,
                                          return_lse, n_threads, _empty, q_fmt, fmt, bf16_dot,
                                          emulate is not False, _bf16_arm(emulate))
    if res is None:
        return None
    if out is None:
        result = V.to_result(res[0], dtype)
    else:
        V.copy_result(out, res[0])
        result = out
    return (result, V.to_result(res[1], dtype)) if return_lse else result


def scaled_dot_product_attention(query, key, value, attn_mask=None, is_causal=False, scale=None,
                                 *, causal_alignment="top_left", enable_gqa=False,
                                 return_lse=False, out=None, n_threads=None, window=None,
                                 softcap=None, sinks=None, alibi_slopes=None, key_lengths=None,
                                 query_lengths=None, key_scale=None, value_scale=None,
                                 precision=None):
    r"""Scaled dot-product attention: ``softmax(scale * query @ key^T + mask) @ value``.

    Parameters
    ----------
    query : array_like of float, shape (..., L, E)
    key : array_like of float, shape (..., S, E)
    value : array_like of float, shape (..., S, Ev)
        Batch dimensions (``...``, e.g. batch and heads) broadcast like :func:`numpy.matmul`.
        float32 and float64 are computed natively, float16 and bfloat16 (``ml_dtypes``) in
        float32 (returned in their dtype); mixed float dtypes promote with ``np.result_type``
        (bfloat16 with float16 gives float32). Half-precision inputs are read by the kernels
        as they are stored, each element widened exactly to float32 as it is loaded (no
        float32 copy of an input; with at most 16 query rows the query is copied to float32),
        so a half call gives the float32 call on the same values, rounded once. A call with
        a non-finite row is computed again on float32 copies.
        ``key`` and ``value`` may also be 8-bit caches: ``int8`` (with ``key_scale`` /
        ``value_scale``, required) or ``ml_dtypes.float8_e4m3fn`` (scales optional, default
        1); each element stands for ``scale * element``. They do not take part in the dtype
        promotion (the result has the dtype of ``query`` and of a float key or value): with
        float32 compute and at most 16 query rows (the decode path), key and value of one
        8-bit dtype are read in place, widened exactly to float32 in the kernel, the scales
        applied to each key's score and each value's weight, with no copy of either. Every
        other call with an 8-bit key or value (more than 16 query rows, a float64 query, one
        8-bit and one float, int8 with float8, or a row whose result is not finite) first
        dequantises them into float32 (float64) copies, ``4 x`` (``8 x``) their bytes, and
        runs as a float call.
    attn_mask : array_like of bool or float, optional
        Broadcastable to ``(..., L, S)`` without enlarging the result. **bool**: True = the
        query may attend to the key (PyTorch SDPA convention); a False position gets exactly
        zero weight and its key and value are never read. **float**: added to the scaled
        scores (cast to the compute dtype; finite values beyond its range saturate at its
        largest finite value); ``-inf`` removes a position, a finite value such as ``-1e9``
        only shifts it. Integer masks raise TypeError.
    is_causal : bool, optional
        Restrict query ``i`` to keys ``j <= i`` (``"top_left"``) or ``j <= i + S - L``
        (``"bottom_right"``). Composes with ``attn_mask`` by AND.
    scale : float, optional
        Multiplies ``query @ key^T`` (never the mask). Default ``1 / sqrt(E)`` (1.0 when E = 0).
        An explicit value, including 0.0, is honoured.
    causal_alignment : {"top_left", "bottom_right"}, keyword-only
        Alignment of the causal diagonal when L != S. ``"top_left"`` is PyTorch's and JAX's
        ``is_causal``; ``"bottom_right"`` is flash-attention >= 2.1's, right for decoding with a
        KV cache.
    enable_gqa : bool, keyword-only
        Grouped-query attention: the head dimension (axis -3) of ``key``/``value`` may be a
        divisor of the query's; query head ``h`` uses key/value head ``h // (Hq // Hkv)``.
    return_lse : bool, keyword-only
        Also return the log-sum-exp of each row's scaled, masked scores.
    out : ndarray, keyword-only, optional
        Writable array of shape ``(..., L, Ev)`` and the result dtype to hold the output.
    n_threads : int, keyword-only, optional
        OpenMP threads: None for the default, a positive count, or negative to count back from
        the maximum (-1 = all).
    window : (int or None, int or None), keyword-only, optional
        Sliding window ``(left, right)``: query row ``i`` may see key ``j`` only if
        ``p(i) - left <= j <= p(i) + right``, where ``p(i)`` is the row's aligned position
        (``i`` for ``"top_left"``; ``i + K_b - L_b`` for ``"bottom_right"``, ``K_b``/``L_b``
        the sequence's key and query lengths, S and L without lengths). ``None`` on a side
        leaves it unbounded. Hugging Face's ``sliding_window=W`` with a causal mask is
        ``window=(W - 1, 0)``; ONNX Attention's and ggml's windows and JAX's
        ``local_window_size`` use the same two sides. Key blocks outside every row's window
        are never computed or read.
    softcap : float, keyword-only, optional
        Logit soft-capping ``c > 0``: each scaled score ``s`` becomes ``c * tanh(s / c)``
        before ALiBi and the masks (Gemma 2, ONNX Attention, ggml, flash-attn). tanh(+-inf) is
        +-1, so infinite scores are capped too.
    sinks : array_like of float, keyword-only, optional
        One logit per head (broadcastable to the batch shape, e.g. ``(H,)`` for
        ``(B, H, L, E)`` inputs) that joins each row's softmax denominator with no value
        (gpt-oss attention sinks, ONNX Runtime's ``head_sink``, ggml's ``add_sinks``): the
        weights sum to ``1 - exp(sink - lse)``. The lse includes it; a row with no permitted
        key gives output 0 and lse equal to the sink; ``-inf`` has no effect; ``+inf`` takes
        all the weight (output 0, lse ``+inf``). A NaN sink takes part in every row's
        denominator, so it makes every row NaN (output and lse), also a row with no permitted
        key. Rows past ``query_lengths`` give output 0 and lse ``-inf`` whatever the sink.
    alibi_slopes : array_like of float, keyword-only, optional
        Per-head ALiBi slopes (broadcastable to the batch shape): ``-slope * |p(i) - j|`` is
        added to the scaled (and capped) scores (Press et al. 2022, flash-attn's definition).
    key_lengths : array_like of int, keyword-only, optional
        Per-sequence key lengths ``K_b`` (broadcastable to the batch shape, >= 0; values past
        S act as S): keys ``j >= K_b`` take no part, as a bool padding mask would, without
        building one, and the key blocks past it are never read.
    query_lengths : array_like of int, keyword-only, optional
        Per-sequence query lengths ``L_b`` (broadcastable to the batch shape, >= 0; values
        past L act as L): rows ``i >= L_b`` give output 0 and lse ``-inf`` and are not
        computed.
    key_scale, value_scale : float or array_like of float32, keyword-only, optional
        Dequantisation scales of an 8-bit ``key`` / ``value`` (see above), broadcastable to
        ``key.shape[:-1] + (1,)`` (``value.shape[:-1] + (1,)``): per token and head
        ``(..., H, S, 1)``, per head ``(..., H, 1, 1)``, or one scale for the tensor. The
        value used is exactly ``scale * element`` (as ``cyattn.oracle`` dequantises), with
        one exception: on the decode path a value row whose scale is 0 adds nothing, even
        where its float8 elements are NaN (dequantised, ``0 * NaN`` is NaN).
        Arrays must be float32 (float16 and bfloat16 are widened, exactly; a float64 array
        is refused, so that its rounding stays the caller's choice); a Python or NumPy
        scalar, or a list of Python numbers, is rounded to float32; every scale must be
        finite (0 and negative values are allowed). A non-contiguous or misaligned scale
        array is copied (its size is ``1 / E`` of its cache's elements). vLLM's
        ``kv_cache_dtype="fp8"`` is float8_e4m3fn
        with a per-tensor scale (``k_scale``); llama.cpp's ``q8_0`` is int8 with one scale
        per 32 elements, a per-token scale only when E = 32 (see the README).
    precision : {None, "exact", "fast"}, keyword-only, optional
        How bfloat16 attention (``query``, ``key`` and ``value`` all bfloat16) multiplies;
        other dtypes ignore it (checked all the same). ``"exact"``: the float32 call on the
        same values, rounded once. ``"fast"``: ``Q K^T`` and ``P V`` on the CPU's bf16 dot
        products (AVX512-BF16 ``vdpbf16ps``; on a CPU or build without them, a portable
        emulation with the same semantics, slower than ``"exact"``; on aarch64 BFDOT's rule,
        the instruction in the opt-in ``neonbf16`` variant), with the weights ``P``
        rounded to bfloat16 before ``P V`` (as PyTorch's CPU flash attention does): see
        Notes for the contract and its error bound. In the opt-in ``amx`` variant
        (``CYATTN_BACKEND=amx``) both products run on AMX tiles (``tdpbf16ps``; the same
        contract, the tiles' order of the sums), and so does decode (at most 16 query rows:
        the query heads of a K/V group as the tiles' rows, the bound below with ``nb`` the
        number of key chunks of 128-512). None (default): ``"fast"`` where the
        loaded kernels have tiles (the ``amx`` variant) or the instruction and the CPU runs
        it faster than widening (AMD Zen 4 and later), else ``"exact"`` (Intel, where
        ``vdpbf16ps`` runs at half the float32 FMA rate; CPUs without it): a rule on CPUID's
        vendor, family and features, never a timing
        (``python -m cyattn info`` prints the path and why). Why: on Zen 5 the fast path
        runs bf16 prefill at 1.5-1.8x the float32 call's rate (1 thread), and its error (the
        bf16 rounding of P, 2^-8 relative) is of the size of the bf16 rounding of the result
        that either path makes; on Intel or through the emulation it would only be slower.
        With at most 16 query rows (decode, memory-bound), E = 0, Ev = 0 or S = 0, and for a
        call whose fast result has a non-finite row (inf/NaN inputs, overflow), the exact path
        runs instead.

    Returns
    -------
    output : ndarray, shape (..., L, Ev)
    lse : ndarray, shape (..., L)
        Only with ``return_lse=True``: natural log of each row's softmax denominator,
        ``max + log(sum(exp(s - max)))`` over the scaled, masked scores ``s`` (plus the sink's
        ``exp``); ``-inf`` for a fully masked row without a sink.

    Raises
    ------
    TypeError
        If an input is not a float array, the mask is an integer (or other non-bool, non-float)
        array, ``scale`` is not a real number, ``is_causal``/``enable_gqa``/``return_lse`` is
        not a bool, ``n_threads`` is not an int, ``window`` is not a pair of ints or None,
        ``softcap`` is not a real number, ``key_lengths``/``query_lengths`` are not integer
        arrays, or ``sinks``/``alibi_slopes`` are not real arrays; if ``key`` / ``value``
        is int8 and its ``key_scale`` / ``value_scale`` is None, or a scale is given for a
        ``key`` / ``value`` that is not int8 or float8_e4m3fn.
    ValueError
        If an input has fewer than 2 dimensions, E or S do not match between the inputs, the
        batch dimensions do not broadcast (or, with ``enable_gqa``, the query heads are not a
        multiple of the key/value heads), the mask does not broadcast to ``(..., L, S)``
        without enlarging it, ``causal_alignment`` is unknown, ``out`` is not a writable
        ndarray of the result shape and dtype, ``n_threads == 0``, a window side is negative,
        ``softcap`` is not positive and finite, a length is negative, ``sinks``,
        ``alibi_slopes``, ``key_lengths`` or ``query_lengths`` do not broadcast to the batch
        shape, ``key_scale`` / ``value_scale`` does not broadcast to its array's
        ``shape[:-1] + (1,)``, is not float32 (float16, bfloat16) or a real scalar (a float64
        array is refused: cast it), or holds a NaN or infinity, or ``precision`` is not None,
        ``"exact"`` or ``"fast"``. A call that raises leaves ``out`` untouched.
    MemoryError
        If NumPy cannot allocate the result, or if the kernel's scratch (O(tile) per thread,
        growing with E) or, for at most 16 query rows, a contiguous copy of a strided input
        cannot be allocated (these messages name this function), or the dequantised copy of
        an 8-bit key or value off the decode path.

    Notes
    -----
    A query row with no permitted key (bool mask all False, causal, ``S = 0``, or every score
    ``-inf``) is *fully masked*: its output is 0 and its lse ``-inf``, never NaN, without a
    warning. A NaN or ``+inf`` score in a permitted position makes that row NaN. A key whose
    weight is exactly 0 is never read into the output, so NaN or inf in masked-out values
    cannot leak.

    The L x S score matrix is never formed: the kernel walks the keys in blocks of 256 with an
    online softmax (running row maximum and sum), so its extra memory is a few hundred KiB per
    thread whatever L and S are. Key blocks that ``is_causal`` or an all-False bool mask
    removes are skipped, and with ``is_causal`` each group of query rows stops at the last key
    it may see. With at most 16 query rows (decoding with a KV cache, speculative
    verification; more than 4 only against at least 16 keys per row, and unless the whole
    problem is tiny) the keys are split into fixed chunks of
    128-512 (by shape, never by thread count) processed in parallel and merged in order, and
    the query heads that share a key/value head (``enable_gqa``, or key and value broadcast
    over heads) run together, so each key and value row is read from memory once per group.
    Rows whose result is not finite are recomputed by a two-pass method
    (scores of the row materialised, weights normalised before they multiply ``value``), which
    gives the results described above and keeps a weighted sum of huge finite values from
    overflowing.
    Tasks (batch x head x query block, or key chunk) run in parallel; results are
    bit-identical for any thread count. The GIL is released while the kernel runs.

    Order of the score terms: ``s = scale * q.k``, then the softcap, then ALiBi, then the
    masks; the bool mask, ``is_causal``, ``window`` and the lengths all remove keys and
    compose with AND.

    ``precision="fast"`` (bfloat16 query, key and value, more than 16 query rows): the bf16
    bits are read as stored and packed in ``vdpbf16ps``'s pair layout (Q and K in pairs along
    E, P and V in pairs along the keys; K and V once per block of 256 keys). Each score is
    ``scale * t``, rounded once, where ``t = 0``, then for e in order
    ``t = FTZ(RNE(t + q_e k_e))``: products exact, bfloat16 subnormal inputs read as zero,
    results tiny after rounding flushed to zero (the instruction's rules, see
    :func:`cyattn.matmul_accumulate`). Softcap, ALiBi, masks and the online softmax are the
    float32 path's, in float32 (running max and sum per row over key blocks of 256, the sum
    of the unrounded float32 weights); the weights are then rounded to bfloat16 (nearest
    even) and ``P V`` is summed per key block in key order by the same step (from +0), each
    block's sum added to the float32 accumulator (rescaled when the row maximum grows) with
    one rounding; the output is divided by the sum, and rounded once to bfloat16. Error
    bound against the exact result on the same bfloat16 values (checked against a float64
    reference by tests/test_bf16_attention_fast.py), per output element c of a row with
    exact weights ``w_j`` (sink included in the denominator) and output ``o``, u = 2^-24,
    ``nb = ceil(S / 256)``, before the final rounding to bfloat16 (which adds
    ``2^-8 |result|``)::

        |o' - o| <= (e^{2 d} - 1) sum_j w_j |v_jc - o_c| + e^{2 d} eps sum_j w_j |v_jc|
                    + 2^-126 (2 S + 1) (max_j |v_jc| + 1)
        eps = 1.01 * 2^-8 + (2 S + 8 nb + 16) u
        d = max over keys with w_j > 0 of  scale (E + 2) u sum_e |q_e k_je|
              + 8 u (|s_j| + |max_j s_j|) + scale 2^-126 (sum_e (|q_e| + |k_je|) + E)

    ``d`` bounds a score's error (products, sums, scale, transforms, mask, shift; the last
    term what DAZ/FTZ may lose), ``eps`` the weights' (2^-8 from rounding P to bfloat16) and
    the float32 sums', the last term what DAZ/FTZ may lose in ``P V``. The lse has no P
    rounding: ``|lse' - lse| <= d + 1.01 (S + 3 nb + 8) u + 2 u |lse|``. Results are
    bit-identical for any thread count on a host, and the emulation on the ``avx512`` kernel
    variant gives the ``avx512bf16`` variant's (hardware's) bits; other variants may round
    ``exp`` and the rescaling differently (FMA), within the same bound. On aarch64 both
    products follow BFDOT's rule instead (pairs summed first, rounded to odd: see
    :func:`cyattn.matmul_accumulate`), the instruction in the ``neonbf16`` variant and its
    model elsewhere with the same bits; the bound holds with ``E + 4`` in place of ``E + 2``.

    Source: Vaswani et al., "Attention Is All You Need", NeurIPS 2017 (eq. 1); online softmax:
    Milakov and Gimelshein, "Online normalizer calculation for softmax", 2018; tiling: Dao et
    al., "FlashAttention", NeurIPS 2022. The masking and fully-masked-row semantics follow
    PyTorch >= 2.5 ``scaled_dot_product_attention``. Variants: sliding windows, Beltagy et
    al., "Longformer", 2020 (Mistral, Gemma); softcap, Gemma Team, "Gemma 2", 2024; sinks,
    Xiao et al., "Efficient Streaming Language Models with Attention Sinks", 2024 (gpt-oss);
    ALiBi, Press et al., "Train Short, Test Long", ICLR 2022; the per-sequence alignment is
    flash-attn varlen's and ONNX Attention's (``nonpad_kv_seqlen``).

    Examples
    --------
    >>> import numpy as np, cyattn
    >>> q = np.array([[1.0]]); k = np.array([[2.0], [1.0], [0.0]])
    >>> v = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]])
    >>> cyattn.scaled_dot_product_attention(q, k, v, scale=1.0).round(3)
    array([[0.935, 0.579]])
    >>> mask = np.array([[False, False, False]])
    >>> cyattn.scaled_dot_product_attention(q, k, v, mask)
    array([[0., 0.]])
    >>> cyattn.scaled_dot_product_attention(q, k, v, scale=1.0, window=(0, 0)).round(3)
    array([[1., 0.]])
    >>> out, lse = cyattn.scaled_dot_product_attention(q, k, v, mask, sinks=1.5, return_lse=True)
    >>> out, lse
    (array([[0., 0.]]), array([1.5]))

    An int8 cache with a scale per key row (token) and one for the values:

    >>> k8 = np.array([[64], [32], [0]], dtype=np.int8)
    >>> ks = np.full((3, 1), 1 / 32, dtype=np.float32)
    >>> v8 = np.array([[2, 0], [0, 4], [6, 2]], dtype=np.int8)
    >>> cyattn.scaled_dot_product_attention(q.astype(np.float32), k8, v8, scale=1.0,
    ...                                     key_scale=ks, value_scale=0.5).round(3)
    array([[0.935, 0.579]], dtype=float32)
    """
    # the low-overhead path first, here (a function call fewer: a tiny call is ~2.5 us)
    if (window is None and softcap is None and sinks is None and alibi_slopes is None
            and key_lengths is None and query_lengths is None and key_scale is None
            and value_scale is None):
        fast = _fast_call(query, key, value, attn_mask, is_causal, scale, causal_alignment,
                          return_lse, enable_gqa, out, n_threads, precision)
        if fast is not None:
            return fast
    return _sdpa(query, key, value, attn_mask, is_causal, scale, causal_alignment, enable_gqa,
                 return_lse, out, n_threads, window, softcap, sinks, alibi_slopes, key_lengths,
                 query_lengths, precision, key_scale, value_scale, fast_tried=True)


def _sdpa(query, key, value, attn_mask, is_causal, scale, causal_alignment, enable_gqa,
          return_lse, out, n_threads, window, softcap, sinks, alibi_slopes, key_lengths,
          query_lengths, precision, key_scale=None, value_scale=None, emulate=False,
          fast_tried=False):
    """scaled_dot_product_attention; ``emulate`` runs the bf16 fast path's emulation even
    where the kernels have the instruction (for the tests that compare the two bit for
    bit); ``fast_tried``: the caller has tried the low-overhead path."""
    if emulate not in _EMULATIONS:
        raise ValueError(f"{_FNAME}: emulate must be False, True, 'amx' or 'arm', got "
                         f"{emulate!r}")
    precision = _resolve_precision(precision, _FNAME)
    if (not fast_tried and window is None and softcap is None and sinks is None
            and alibi_slopes is None and key_lengths is None and query_lengths is None
            and key_scale is None and value_scale is None):
        fast = _fast_call(query, key, value, attn_mask, is_causal, scale, causal_alignment,
                          return_lse, enable_gqa, out, n_threads, precision, emulate)
        if fast is not None:
            return fast
    return _run(V.describe_attention(
        _FNAME, query, key, value, attn_mask, is_causal, scale, causal_alignment, enable_gqa,
        out, n_threads, return_lse=return_lse, window=window, softcap=softcap, sinks=sinks,
        alibi_slopes=alibi_slopes, key_lengths=key_lengths, query_lengths=query_lengths,
        key_scale=key_scale, value_scale=value_scale), precision, emulate)


def _run(call, precision, emulate):
    """The kernel paths of a validated call (:class:`cyattn._validate.AttentionCall`): the
    fused / decode / two-pass kernels (16-bit inputs read in place, 8-bit K/V read in place
    by the decode path or dequantised), or the bf16 fast path; writes ``out`` or returns a
    new result, and the lse with ``return_lse``."""
    f, query, key, value, kv8 = call.fname, call.query, call.key, call.value, call.kv8
    batch, group, L, S, E, Ev = call.batch, call.group, call.L, call.S, call.E, call.Ev
    compute, result, out, var = call.compute, call.result, call.out, call.variants
    kind, mask = call.mask_kind, call.mask
    out_shape = batch + (L, Ev)
    count = math.prod(batch)
    # float16/bfloat16 inputs are read as they are (the query only with more than
    # _DECODE_MAX_L rows: decode reads a float32 query); K and V when of one format
    q_fmt = V.half_format(query, compute) if L > _DECODE_MAX_L else 0
    kv_fmt = V.half_format(key, compute) if key.dtype == value.dtype else 0
    if kv8 is not None:     # 8-bit K/V: read in place by the decode path, else dequantised
        kv_fmt = kv8.fmt(compute, L, _DECODE_MAX_L)
    # (a half call may be redone on float32 inputs: never straight into the caller's out)
    res, o_off, o_rs = None, None, -1
    if out is not None and not (q_fmt or kv_fmt):
        inputs = (query, key, value, call.attn_mask, var.key_lengths, var.query_lengths, var.slopes,
                  var.sinks)       # the per-entry options may be the caller's own memory
        if kv8 is not None:
            inputs += kv8.real_arrays()
        if V.writes_in_place(out, compute, inputs):
            res = out
        elif V.writes_rows_in_place(out, compute, inputs):
            # e.g. transformers' (B, L, H, Ev) buffer viewed as (B, H, L, Ev): written by row
            res = out
            o_off = V.batch_offsets(out, batch)
            o_rs = out.strides[-2] // out.itemsize if L > 1 else Ev
    if res is None:
        res = np.empty(out_shape, dtype=compute)
    lse = np.empty(batch + (L,), dtype=compute)
    if count and L:
        n_threads = V.threads_for_work(call.n_threads, count * L * max(S, 1) * (E + Ev + 8),
                                       1 << 18)
        if kind:
            m_off = V.batch_offsets(mask, batch)
            m_rs, m_cs = mask.strides[-2] // mask.itemsize, mask.strides[-1] // mask.itemsize
        else:
            m_off, m_rs, m_cs = np.zeros(1, np.int64), 0, 0

        def run(q_fmt, kv_fmt):
            q = V.kernel_ready(query, query.dtype if q_fmt else compute)
            if kv8 is None:
                k = V.kernel_ready(key, key.dtype if kv_fmt else compute)
                v = V.kernel_ready(value, value.dtype if kv_fmt else compute)
            else:
                k, v = kv8.kernel_arrays(kv_fmt, compute, V.kernel_ready)
            if L <= _DECODE_MAX_L:
                # The kernel's decode path (a few query rows) reads rows of adjacent elements;
                # other layouts are copied, so they give the C-contiguous bits (huge broadcast
                # views are not: they take the fused path, equal to rounding).
                q = V.unit_stride_rows(q, "query", f)
                k = V.unit_stride_rows(k, "key", f)
                v = V.unit_stride_rows(v, "value", f)
            # 16-bit storage is widened by the kernels as they read it: no float32 copies
            q, k, v = (a.view(_STORAGE[fmt]) if fmt else a
                       for a, fmt in ((q, q_fmt), (k, kv_fmt), (v, kv_fmt)))
            scales = kv8.kernel_scales(kv_fmt, batch, group, V.batch_offsets) if kv8 else {}
            return _backend.kernels.attention(
                q, V.batch_offsets(q, batch), q.strides[-2] // q.itemsize, V.column_stride(q),
                k, V.batch_offsets(k, batch, group), k.strides[-2] // k.itemsize,
                V.column_stride(k),
                v, V.batch_offsets(v, batch, group), v.strides[-2] // v.itemsize,
                V.column_stride(v),
                mask, kind, m_off, m_rs, m_cs, res, lse, L, S, E, Ev, call.scale, call.is_causal,
                call.bottom_right, call.return_lse, n_threads, var.left, var.right,
                var.softcap, var.key_lengths, var.query_lengths, var.slopes, var.sinks,
                q_fmt=q_fmt, kv_fmt=kv_fmt, o_off=o_off, o_rs=o_rs, **scales)

        def run_bf16():
            q, k, v = (V.kernel_ready(a, a.dtype).view(np.uint16) for a in (query, key, value))
            return _backend.kernels.attention_bf16(
                q, V.batch_offsets(q, batch), q.strides[-2] // 2, V.column_stride(q),
                k, V.batch_offsets(k, batch, group), k.strides[-2] // 2, V.column_stride(k),
                v, V.batch_offsets(v, batch, group), v.strides[-2] // 2, V.column_stride(v),
                mask, kind, m_off, m_rs, m_cs, res.reshape(-1, L, Ev), lse.reshape(-1, L),
                L, S, E, Ev, call.scale, call.is_causal, call.bottom_right, call.return_lse,
                n_threads, var.left, var.right, var.softcap, var.key_lengths,
                var.query_lengths, var.slopes, var.sinks, emulate=emulate is not False,
                tiles=_on_tiles(emulate), arm=_bf16_arm(emulate))

        # bfloat16 on the bf16 dot products (prefill only: decode is memory-bound and stays
        # on the exact path), or on AMX tiles (prefill and decode: the query heads of a K/V
        # group as the tiles' rows); a non-finite row sends the whole call to the exact path
        # (8-bit K/V never: key and value are then dtype stand-ins, not the data)
        bf16_fast = (precision == "fast" and kv8 is None and S > 0 and E > 0 and Ev > 0
                     and (L > _DECODE_MAX_L or _on_tiles(emulate))
                     and all(V.is_bfloat16(a.dtype) for a in (query, key, value)))
        if not (bf16_fast and not run_bf16()):
            if run(q_fmt, kv_fmt) and (q_fmt or kv_fmt):
                run(0, 0)   # a non-finite row: redone on float32 inputs, by the two-pass path
    if out is not None:
        if res is not out:
            V.copy_result(out, res)
        res = out
    else:
        res = V.to_result(res, result)
    if call.return_lse:
        return res, V.to_result(lse, result)
    return res
