# Entry points, attention: attention_run picks the path (decode for a few unit-stride query
# rows, the fused path otherwise; never by thread count) and runs it without the GIL;
# attention is the general path (per-batch offset arrays built by cyattn/attention.py) and
# attention_fast the low-overhead one, which takes aligned q/k/v of any row strides, GQA heads,
# bool or float masks and strided outputs straight from the caller's buffers, checking its
# preconditions with the helpers of _entry_buffers.pxi and declining (returns None) so that the
# general path runs. Half-precision inputs that cannot be done in 16 bits are reported for a
# redo on float32 (half_redo), so a half call gives the float32 call's bits.

cdef int attention_run(bint dbl, const char* qp, const int64_t* q_off,
                       Py_ssize_t q_rs, Py_ssize_t q_cs,
                       const char* kp, const int64_t* k_off, Py_ssize_t k_rs, Py_ssize_t k_cs,
                       const char* vp, const int64_t* v_off, Py_ssize_t v_rs, Py_ssize_t v_cs,
                       const char* mp, int mask_kind, const int64_t* mo,
                       Py_ssize_t m_rs, Py_ssize_t m_cs,
                       char* op, const int64_t* o_off, Py_ssize_t o_rs, char* lp,
                       Py_ssize_t batch, Py_ssize_t L, Py_ssize_t S,
                       Py_ssize_t E, Py_ssize_t Ev, double scale, const AttnVariant* var,
                       bint want_lse, int n_threads, int q_fmt=0, int kv_fmt=0,
                       int* half_redo=NULL) noexcept nogil:
    """Pick the attention path and run it; 0, or 1 if scratch could not be allocated.

    Output row r of batch entry bi starts at element o_off[bi] + r * o_rs of op (o_off NULL:
    bi * L * o_rs), its Ev elements adjacent; lse is C-contiguous (batch, L).
    Without ``want_lse`` the fused path leaves lse holding values that are inf or NaN where
    the true lse would be, not the lse itself (see fused_attention_task).

    A few query rows (unit-stride rows, more than a tiny problem) take the decode path,
    parallel over key chunks; everything else the fused path. The choice depends only on
    the shapes and strides, never on the thread count, and neither does any result.

    q_fmt, kv_fmt != 0 (CYATTN_HALF_F16/BF16; float32 compute only): q, and k and v, hold
    16-bit elements, widened by the kernels as they read them (the decode path reads 16-bit
    k and v, not q). half_redo is set to 1 if the call cannot be done so (a 16-bit q on the
    decode path, or float64 compute: nothing is computed) or a row's result is not finite;
    the caller then redoes the call on float32 inputs, so a half call gives the float32
    call's bits.

    kv_fmt CYATTN_KV8_I8 / CYATTN_KV8_E4M3: k and v hold 8-bit elements (scales in var),
    which only the decode path reads (grouped, _attention_decode_grouped.pxi); any other call
    sets half_redo and computes nothing, and the caller runs it on dequantised K and V.
    """
    cdef int status = 0
    cdef int redo_local = 0
    # wide groups only for heads up to 128 + 128: their packed Q^T and O^T (qg x (E + Ev))
    # then stay within 1 MiB of L2, and scratch stays O(input) for wider heads
    cdef Py_ssize_t qg = QG_DENSE if E + Ev <= 256 else QG
    # a causal (upper-limited) task's cost grows with its first row, so threads need more
    # tasks each to even out; dense tasks all cost the same
    cdef Py_ssize_t per_thread = 8 if n_threads > 1 and (var.causal or var.has_right) else 2
    cdef Py_ssize_t tasks = batch * ((L + qg - 1) // qg)
    cdef bint decode = (0 < L <= DECODE_MAX_L and decode_rows_fit(L, S)
                        and batch * S * (E + Ev) >= L * DECODE_MIN_WORK
                        and q_cs == 1 and k_cs == 1 and v_cs == 1)
    if half_redo == NULL:
        half_redo = &redo_local
    if (q_fmt != 0 or kv_fmt != 0) and (dbl or (decode and q_fmt != 0)
                                        or (kv_fmt >= CYATTN_KV8_I8 and not decode)):
        half_redo[0] = 1
        return 0
    if decode:
        tasks = batch * ((S + DECODE_CHUNK - 1) // DECODE_CHUNK)
    # Smaller query groups when there are too few tasks to keep the threads busy (every row
    # is computed the same way in any group).
    while not decode and qg > 64 and tasks < per_thread * n_threads:
        qg //= 2
        tasks = batch * ((L + qg - 1) // qg)
    if n_threads > tasks:
        n_threads = <int>(tasks if tasks > 0 else 1)
    if decode:
        if dbl:
            decode_dispatch(<const double*>qp, q_off, q_rs, kp, k_off, k_rs, vp, v_off, v_rs, 0,
                             <const uint8_t*>mp if mask_kind == 1 else NULL,
                             <const double*>mp if mask_kind == 2 else NULL,
                             mo, m_rs, m_cs, <double*>op, o_off, o_rs, <double*>lp,
                             batch, L, S, E, Ev, scale, var, n_threads, &status, half_redo)
        else:
            decode_dispatch(<const float*>qp, q_off, q_rs, kp, k_off, k_rs, vp, v_off, v_rs,
                             kv_fmt, <const uint8_t*>mp if mask_kind == 1 else NULL,
                             <const float*>mp if mask_kind == 2 else NULL,
                             mo, m_rs, m_cs, <float*>op, o_off, o_rs, <float*>lp,
                             batch, L, S, E, Ev, <float>scale, var, n_threads, &status,
                             half_redo)
    elif dbl:
        fused_attention(qp, q_off, q_rs, q_cs, 0, kp, k_off, k_rs, k_cs, vp, v_off, v_rs, v_cs, 0,
                        <const uint8_t*>mp if mask_kind == 1 else NULL,
                        <const double*>mp if mask_kind == 2 else NULL,
                        mo, m_rs, m_cs, <double*>op, o_off, o_rs, <double*>lp,
                        batch, L, S, E, Ev, scale, var, qg, want_lse, n_threads,
                        &status, half_redo)
    else:
        fused_attention(qp, q_off, q_rs, q_cs, q_fmt, kp, k_off, k_rs, k_cs, vp, v_off, v_rs,
                        v_cs, kv_fmt, <const uint8_t*>mp if mask_kind == 1 else NULL,
                        <const float*>mp if mask_kind == 2 else NULL,
                        mo, m_rs, m_cs, <float*>op, o_off, o_rs, <float*>lp,
                        batch, L, S, E, Ev, <float>scale, var, qg, want_lse,
                        n_threads, &status, half_redo)
    return status


def attention(q, const int64_t[::1] q_off, Py_ssize_t q_rs, Py_ssize_t q_cs,
              k, const int64_t[::1] k_off, Py_ssize_t k_rs, Py_ssize_t k_cs,
              v, const int64_t[::1] v_off, Py_ssize_t v_rs, Py_ssize_t v_cs,
              mask, int mask_kind, const int64_t[::1] m_off, Py_ssize_t m_rs, Py_ssize_t m_cs,
              out, lse, Py_ssize_t L, Py_ssize_t S, Py_ssize_t E, Py_ssize_t Ev,
              double scale, bint causal, bint bottom_right, bint want_lse, int n_threads,
              Py_ssize_t window_left=-1, Py_ssize_t window_right=-1, double softcap=0.0,
              const int64_t[::1] key_len=None, const int64_t[::1] query_len=None,
              const double[::1] slopes=None, const double[::1] sinks=None, int q_fmt=0,
              int kv_fmt=0, const int64_t[::1] o_off=None, Py_ssize_t o_rs=-1,
              const float[::1] k_scale=None, const int64_t[::1] k_scale_off=None,
              Py_ssize_t k_scale_rs=0, const float[::1] v_scale=None,
              const int64_t[::1] v_scale_off=None, Py_ssize_t v_scale_rs=0):
    """Scaled dot-product attention for `batch = len(q_off)` independent (L, S) problems.

    q, k, v, mask are addressed by element offsets per batch entry and element strides.
    out: C-contiguous (batch, L, Ev), or with ``o_off`` (element offsets per batch entry) and
    ``o_rs`` (row stride) rows of Ev adjacent elements anywhere in its buffer (the caller
    checks that no two share an element); lse: C-contiguous (batch, L); both of the data
    dtype.
    Without ``want_lse`` lse is scratch and its contents are not the lse.
    mask_kind: 0 none, 1 bool (uint8, True = keep), 2 additive (data dtype).
    Variants (_attention_variants.pxi): window sides (-1 = unbounded, else 0 .. S + L),
    softcap (0 = none), and per batch entry (length ``batch`` each, or None): key and query
    lengths, ALiBi slopes and sink logits (values already rounded to the data dtype).
    q_fmt, kv_fmt: 0, or 1 (float16) / 2 (bfloat16) for q, and k and v, holding those 16-bit
    elements (as uint16 buffers; float32 compute: float32 out and lse). Returns True if the
    caller must redo such a call on float32 inputs (see attention_run: then nothing, or rows
    that are not finite, was computed), else False.
    kv_fmt 3 (int8) / 4 (float8_e4m3fn): k and v hold 8-bit elements (uint8 buffers), with
    scales ``k_scale[k_scale_off[bi] + j * k_scale_rs]`` for key row j of batch entry bi
    (None: 1; the buffers hold every element so addressed), likewise ``v_scale``; only the
    decode path reads them (True is returned for any other call, nothing computed).
    """
    cdef Py_buffer qv, kv, vv, mv, ov, lv
    cdef char* mp = NULL
    cdef const int64_t* mo = NULL
    cdef int status = 0
    cdef int half_redo = 0
    cdef AttnVariant var
    var.causal = causal
    var.bottom_right = bottom_right
    var.has_left = window_left >= 0
    var.has_right = window_right >= 0
    var.left = window_left if window_left >= 0 else 0
    var.right = window_right if window_right >= 0 else 0
    var.softcap = softcap if softcap > 0 else 0.0
    var.key_len = &key_len[0] if key_len is not None and key_len.shape[0] > 0 else NULL
    var.query_len = &query_len[0] if query_len is not None and query_len.shape[0] > 0 else NULL
    var.slopes = &slopes[0] if slopes is not None and slopes.shape[0] > 0 else NULL
    var.sinks = &sinks[0] if sinks is not None and sinks.shape[0] > 0 else NULL
    var.k_scale = NULL
    var.v_scale = NULL
    var.k_scale_off = NULL
    var.v_scale_off = NULL
    var.k_scale_rs = k_scale_rs
    var.v_scale_rs = v_scale_rs
    if k_scale is not None and k_scale.shape[0] > 0:
        if k_scale_off is None or k_scale_off.shape[0] != q_off.shape[0]:
            raise ValueError("cyattn kernels: k_scale needs one offset per batch entry")
        var.k_scale = &k_scale[0]
        var.k_scale_off = &k_scale_off[0]
    if v_scale is not None and v_scale.shape[0] > 0:
        if v_scale_off is None or v_scale_off.shape[0] != q_off.shape[0]:
            raise ValueError("cyattn kernels: v_scale needs one offset per batch entry")
        var.v_scale = &v_scale[0]
        var.v_scale_off = &v_scale_off[0]
    if o_off is not None and (o_off.shape[0] != q_off.shape[0] or o_rs < 0):
        raise ValueError("cyattn kernels: o_off needs one offset per batch entry and o_rs >= 0")
    cdef char* qp = _buf(q, &qv, False)
    try:
        kp = _buf(k, &kv, False)
        try:
            vp = _buf(v, &vv, False)
            try:
                if mask_kind != 0:
                    mp = _buf(mask, &mv, False)
                    mo = &m_off[0]
                try:
                    op = _buf(out, &ov, True)
                    try:
                        lp = _buf(lse, &lv, True)
                        try:
                            if ((kv_fmt != 0 and (kv.itemsize != (1 if kv_fmt >= 3 else 2)
                                                  or vv.itemsize != kv.itemsize))
                                    or (kv_fmt == 0 and kv.itemsize != ov.itemsize)
                                    or qv.itemsize != (2 if q_fmt != 0 else ov.itemsize)
                                    or ((q_fmt != 0 or kv_fmt != 0) and ov.itemsize != 4)):
                                raise ValueError("cyattn kernels: q_fmt/kv_fmt need 16-bit "
                                                 "inputs there and float32 out, others of "
                                                 "out's dtype")
                            with nogil:
                                status = attention_run(
                                    qv.itemsize == 8, qp, &q_off[0], q_rs, q_cs,
                                    kp, &k_off[0], k_rs, k_cs, vp, &v_off[0], v_rs, v_cs,
                                    mp, mask_kind, mo, m_rs, m_cs, op,
                                    &o_off[0] if o_off is not None else NULL,
                                    o_rs if o_off is not None else Ev, lp, q_off.shape[0],
                                    L, S, E, Ev, scale, &var, want_lse, n_threads, q_fmt,
                                    kv_fmt, &half_redo)
                        finally:
                            PyBuffer_Release(&lv)
                    finally:
                        PyBuffer_Release(&ov)
                finally:
                    if mask_kind != 0:
                        PyBuffer_Release(&mv)
            finally:
                PyBuffer_Release(&vv)
        finally:
            PyBuffer_Release(&kv)
    finally:
        PyBuffer_Release(&qv)
    if status:
        raise MemoryError("cyattn.scaled_dot_product_attention: could not allocate scratch")
    return half_redo != 0


def attention_fast(q, k, v, mask, out, scale, bint causal, bint bottom_right, bint gqa,
                   bint want_lse, int n_threads, empty, int q_fmt=0, int kv_fmt=0,
                   bint bf16_dot=False, bint emulate=False, bint arm=CYATTN_BF16_RULE_ARM):
    """Attention for aligned q (..., L, E), k (..., S, E) and v (..., S, Ev) of one native
    float dtype with rows of adjacent elements (unit stride along the last axis; any other
    strides, also 0 or negative, as the head views of a fused QKV projection have), with
    L, S, E, Ev > 0 and equal batch shapes (with ``gqa``, k and v may have fewer heads, axis
    -3, dividing q's), ``mask`` None, a bool array or a float array of the data dtype
    (aligned, any strides) that broadcasts to (..., L, S) without enlarging it, and ``out``
    None or a writable, C-contiguous, aligned array of the result's shape and dtype sharing no
    memory with the inputs, or a writable, aligned strided one whose elements do not overlap
    each other, which gets a copy of the result after the kernel (so it may alias the
    inputs). Returns (out, lse), allocating them by ``empty(shape, dtype)`` (the result only
    if ``out`` is None or strided; lse is None without ``want_lse``), or None without doing
    anything if the inputs are not of that kind. ``scale`` is a float or None (1 / sqrt(E)).
    The low-overhead path of scaled_dot_product_attention: one pass of checks on the
    buffers. q_fmt, kv_fmt != 0 (CYATTN_HALF_F16/BF16): q, and k and v, are uint16 views of
    16-bit elements of that format (a 16-bit q only with more than DECODE_MAX_L rows), computed
    in float32: the results are float32, ``out`` must be None, a float mask is float32; None
    also when a row's result is not finite (the caller redoes the call on float32 inputs,
    see attention_run). ``bf16_dot`` (q_fmt = kv_fmt = CYATTN_HALF_BF16, more than
    DECODE_MAX_L rows): the bf16 fast path (_attention_bf16.pxi; the emulation with
    ``emulate``) instead, None when a row's result is not finite."""
    cdef Py_buffer qv, kv, vv, mv, ov, lv, rv
    cdef bint have_q = False, have_k = False, have_v = False, have_m = False
    cdef bint have_o = False, have_l = False, have_r = False, o_strided = False
    cdef bint o_direct = False
    cdef Py_ssize_t o_rs
    cdef int status = 0, code, d, nd, mask_kind = 0
    cdef Py_ssize_t batch = 1, bi, L, S, E, Ev, work, m_rs = 0, m_cs = 0, hq = 1, group = 1
    cdef Py_ssize_t idx[FAST_MAX_DIMS]
    cdef Py_ssize_t m_st[FAST_MAX_DIMS]
    cdef Py_ssize_t q_rs, k_rs, v_rs, item, j, q_item, kv_item
    cdef int half_redo = 0
    cdef int64_t q_o, k_o, v_o, m_o, o_o
    cdef double scale_value
    cdef int64_t* offs = NULL
    cdef object res = None, lse = None
    cdef AttnVariant var
    memset(&var, 0, sizeof(var))
    var.causal = causal
    var.bottom_right = bottom_right
    try:
        if not _get_rows(q, &qv):
            return None
        have_q = True
        if not _get_rows(k, &kv):
            return None
        have_k = True
        if not _get_rows(v, &vv):
            return None
        have_v = True
        if mask is not None:
            try:
                PyObject_GetBuffer(mask, &mv, PyBUF_RECORDS_RO)
            except Exception:
                return None
            have_m = True
        if out is not None:
            if not _get_contiguous(out, &ov, True):
                try:
                    PyObject_GetBuffer(out, &ov, PyBUF_RECORDS)
                except Exception:
                    return None
                o_strided = True
            have_o = True
        code = _float_code(&qv) if q_fmt == 0 else 4
        nd = qv.ndim
        q_item = 2 if q_fmt != 0 else code
        kv_item = 2 if kv_fmt != 0 else code
        if (code == 0 or (q_fmt != 0 and not _is_u16(&qv))
                or (bf16_dot and (q_fmt != CYATTN_HALF_BF16 or kv_fmt != CYATTN_HALF_BF16))
                or (kv_fmt == 0 and (_float_code(&kv) != code or _float_code(&vv) != code))
                or (kv_fmt != 0 and (code != 4 or not _is_u16(&kv) or not _is_u16(&vv)))
                or ((q_fmt != 0 or kv_fmt != 0) and have_o)
                or nd < (3 if gqa else 2) or nd > FAST_MAX_DIMS or kv.ndim != nd
                or vv.ndim != nd or <uintptr_t>qv.buf % q_item or <uintptr_t>kv.buf % kv_item
                or <uintptr_t>vv.buf % kv_item):
            return None
        for d in range(nd - 2):
            if vv.shape[d] != kv.shape[d]:
                return None
            if gqa and d == nd - 3:
                hq = qv.shape[d]
                if kv.shape[d] == 0 or hq % kv.shape[d]:
                    return None
                group = hq // kv.shape[d]
            elif kv.shape[d] != qv.shape[d]:
                return None
            batch *= qv.shape[d]
        L = qv.shape[nd - 2]
        E = qv.shape[nd - 1]
        S = kv.shape[nd - 2]
        Ev = vv.shape[nd - 1]
        if (kv.shape[nd - 1] != E or vv.shape[nd - 2] != S
                or batch == 0 or L == 0 or S == 0 or E == 0 or Ev == 0
                or (q_fmt != 0 and L <= DECODE_MAX_L)):
            return None
        if have_o and not o_strided:
            if (_float_code(&ov) != code or <uintptr_t>ov.buf % code or ov.ndim != nd
                    or ov.shape[nd - 1] != Ev or not _disjoint_strided(&qv, &ov)
                    or not _disjoint_strided(&kv, &ov) or not _disjoint_strided(&vv, &ov)
                    or (have_m and not _disjoint_strided(&mv, &ov))):
                return None
            for d in range(nd - 1):
                if ov.shape[d] != qv.shape[d]:
                    return None
        elif have_o:
            # a strided out gets a copy of the result once every input has been read, so it
            # may share memory with them, but not with itself (the general path's copy would
            # leave other bytes in the shared elements)
            if (_float_code(&ov) != code or <uintptr_t>ov.buf % code or ov.ndim != nd
                    or ov.shape[nd - 1] != Ev or not _no_self_overlap(&ov)):
                return None
            for d in range(nd):
                if (d < nd - 1 and ov.shape[d] != qv.shape[d]) or ov.strides[d] % code:
                    return None
            # rows of adjacent elements apart from every input (a head-interleaved
            # (B, L, H, Ev) buffer viewed as (B, H, L, Ev), as transformers wants it): the
            # kernel writes them in place, without the copy
            o_direct = (ov.strides[nd - 1] == code
                        and (ov.strides[nd - 2] >= Ev * code or ov.shape[nd - 2] == 1)
                        and _disjoint_extents(&qv, &ov) and _disjoint_extents(&kv, &ov)
                        and _disjoint_extents(&vv, &ov)
                        and (not have_m or _disjoint_extents(&mv, &ov)))
        for d in range(nd):
            m_st[d] = 0
        if have_m:
            mask_kind = _fast_mask_layout(&mv, code, &qv, S, m_st)
            if mask_kind == 0:
                return None
            m_rs = m_st[nd - 2]
            m_cs = m_st[nd - 1]
        offs = <int64_t*>malloc(<size_t>(5 * batch) * sizeof(int64_t))
        if offs == NULL:
            raise MemoryError("cyattn.scaled_dot_product_attention: could not allocate scratch")
        # element offsets of each batch entry's q, k, v, mask and (strided) out matrices: an
        # odometer over the batch dims, last fastest; with gqa, query head h reads key/value
        # head h // group
        item = code                 # the compute dtype's: out's offsets and row stride
        for d in range(nd - 2):
            idx[d] = 0
        for bi in range(batch):
            q_o = 0
            k_o = 0
            v_o = 0
            m_o = 0
            o_o = 0
            for d in range(nd - 2):
                j = idx[d] // group if gqa and d == nd - 3 else idx[d]
                q_o += idx[d] * (qv.strides[d] // q_item)
                k_o += j * (kv.strides[d] // kv_item)
                v_o += j * (vv.strides[d] // kv_item)
                m_o += idx[d] * m_st[d]
                if o_strided:
                    o_o += idx[d] * (ov.strides[d] // item)
            offs[bi] = q_o
            offs[batch + bi] = k_o
            offs[2 * batch + bi] = v_o
            offs[3 * batch + bi] = m_o
            offs[4 * batch + bi] = o_o
            d = nd - 3
            while d >= 0:
                idx[d] += 1
                if idx[d] < qv.shape[d]:
                    break
                idx[d] = 0
                d -= 1
        q_rs = qv.strides[nd - 2] // q_item
        k_rs = kv.strides[nd - 2] // kv_item
        v_rs = vv.strides[nd - 2] // kv_item
        scale_value = 1.0 / sqrt(<double>E) if scale is None else <double>scale
        work = (batch * L * S * (E + Ev + 8)) >> 18   # as threads_for_work(..., 1 << 18)
        if n_threads > work:
            n_threads = <int>(work if work > 0 else 1)
        shape = tuple([qv.shape[d] for d in range(nd - 1)])
        dtype = "float64" if code == 8 else "float32"
        o_rs = Ev
        if o_direct:
            o_rs = ov.strides[nd - 2] // item if ov.shape[nd - 2] > 1 else Ev
        if have_o and (o_direct or not o_strided):
            res = out
            rv = ov
        else:
            res = empty(shape + (Ev,), dtype)
            PyObject_GetBuffer(res, &rv, PyBUF_RECORDS)
            have_r = True
        lse = empty(shape, dtype)
        PyObject_GetBuffer(lse, &lv, PyBUF_RECORDS)
        have_l = True
        with nogil:
            if bf16_dot:
                bf16_attention_run(
                    <const uint16_t*>qv.buf, offs, q_rs, 1, <const uint16_t*>kv.buf,
                    offs + batch, k_rs, 1, <const uint16_t*>vv.buf, offs + 2 * batch, v_rs, 1,
                    <const uint8_t*>mv.buf if mask_kind == 1 else NULL,
                    <const float*>mv.buf if mask_kind == 2 else NULL, offs + 3 * batch,
                    m_rs, m_cs, <float*>rv.buf, <float*>lv.buf, batch, L, S, E, Ev,
                    <float>scale_value, &var, want_lse, n_threads,
                    bf16_engine(arm, emulate), &status, &half_redo)
            else:
                status = attention_run(
                    code == 8, <const char*>qv.buf, offs, q_rs, 1,
                    <const char*>kv.buf, offs + batch, k_rs, 1,
                    <const char*>vv.buf, offs + 2 * batch, v_rs, 1,
                    <const char*>mv.buf if mask_kind else NULL, mask_kind, offs + 3 * batch,
                    m_rs, m_cs, <char*>rv.buf, offs + 4 * batch if o_direct else NULL, o_rs,
                    <char*>lv.buf, batch, L, S, E, Ev, scale_value, &var, want_lse, n_threads,
                    q_fmt, kv_fmt, &half_redo)
            if status == 0 and o_strided and not o_direct:
                _rows_to_strided(<const char*>rv.buf, &ov, offs + 4 * batch, batch)
        if o_strided:
            res = out
    finally:
        free(offs)
        if have_r:
            PyBuffer_Release(&rv)
        if have_l:
            PyBuffer_Release(&lv)
        if have_o:
            PyBuffer_Release(&ov)
        if have_m:
            PyBuffer_Release(&mv)
        if have_v:
            PyBuffer_Release(&vv)
        if have_k:
            PyBuffer_Release(&kv)
        if have_q:
            PyBuffer_Release(&qv)
    if status:
        raise MemoryError("cyattn.scaled_dot_product_attention: could not allocate scratch")
    if half_redo:
        return None
    return res, (lse if want_lse else None)
