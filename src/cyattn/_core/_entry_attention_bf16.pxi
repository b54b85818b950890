# Entry point, bfloat16 attention on the bf16 dot products (precision="fast"): the general
# path's arguments (per-batch offsets built by cyattn/attention.py), run without the GIL on
# _attention_bf16.pxi. A call whose result has a non-finite row reports it, and the caller
# computes the call again on the exact path.


def attention_bf16(q, const int64_t[::1] q_off, Py_ssize_t q_rs, Py_ssize_t q_cs,
                   k, const int64_t[::1] k_off, Py_ssize_t k_rs, Py_ssize_t k_cs,
                   v, const int64_t[::1] v_off, Py_ssize_t v_rs, Py_ssize_t v_cs,
                   mask, int mask_kind, const int64_t[::1] m_off, Py_ssize_t m_rs,
                   Py_ssize_t m_cs, float[:, :, ::1] out, float[:, ::1] lse,
                   Py_ssize_t L, Py_ssize_t S, Py_ssize_t E, Py_ssize_t Ev, double scale,
                   bint causal, bint bottom_right, bint want_lse, int n_threads,
                   Py_ssize_t window_left=-1, Py_ssize_t window_right=-1, double softcap=0.0,
                   const int64_t[::1] key_len=None, const int64_t[::1] query_len=None,
                   const double[::1] slopes=None, const double[::1] sinks=None,
                   bint emulate=False, bint tiles=False, bint arm=CYATTN_BF16_RULE_ARM):
    """Scaled dot-product attention of bf16 q, k, v (uint16 views of the bits; offsets and
    strides in elements, as ``attention``) on the bf16 dot product: vdpbf16ps's rule, or
    BFDOT's with ``arm`` (the default in aarch64 builds), on the instruction where this module
    has it (BF16_DOT, BF16_ARM) unless ``emulate``, else the rule's model (the same bits); with
    ``tiles``, on AMX tiles: the instructions where this module has them (AMX) unless
    ``emulate``, else the tiles' portable model (the same bits); on tiles, the few-row calls
    the exact path would decode take the tile decode (_attention_decode_amx.pxi).
    E, Ev > 0 and L > 0. out: float32 C-contiguous (batch, L, Ev); lse float32 (batch, L).
    mask_kind: 0 none, 1 bool (uint8, True = keep), 2 additive (float32). Variants as in
    ``attention``. Returns True if a row's result is not finite (the caller then computes
    the call on the exact path), else False."""
    cdef Py_buffer qv, kv, vv, mv
    cdef const uint8_t* bmask = NULL
    cdef const float* amask = NULL
    cdef const int64_t* mo = NULL
    cdef int status = 0, redo = 0
    cdef int engine = bf16_engine(arm, emulate)
    if tiles:
        engine = BF16_TILES_HW if CYATTN_HAVE_AMX and not emulate else BF16_TILES_MODEL
    cdef Py_ssize_t batch = q_off.shape[0]
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
    if (out.shape[0] != batch or out.shape[1] != L or out.shape[2] != Ev
            or lse.shape[0] != batch or lse.shape[1] != L or E <= 0 or Ev <= 0
            or k_off.shape[0] != batch or v_off.shape[0] != batch):
        raise ValueError("attention_bf16: out (batch, L, Ev), lse (batch, L), E, Ev > 0")
    if batch == 0 or L == 0:
        return False
    # a few query rows on tiles: the bf16 tile decode where the exact path would decode
    # (attention_run's rule, strides aside: the tile decode packs any), else the prefill tiles
    cdef bint decode = (tiles and L <= DECODE_MAX_L and decode_rows_fit(L, S)
                        and batch * S * (E + Ev) >= L * DECODE_MIN_WORK)
    cdef char* qp = _buf(q, &qv, False)
    try:
        kp = _buf(k, &kv, False)
        try:
            vp = _buf(v, &vv, False)
            try:
                if mask_kind != 0:
                    mp = _buf(mask, &mv, False)
                    mo = &m_off[0]
                    if mask_kind == 1:
                        bmask = <const uint8_t*>mp
                    else:
                        amask = <const float*>mp
                try:
                    if (qv.itemsize != 2 or kv.itemsize != 2 or vv.itemsize != 2
                            or (mask_kind == 2 and mv.itemsize != 4)):
                        raise ValueError("attention_bf16: q, k, v need 16-bit elements and "
                                         "a float mask float32")
                    with nogil:
                        if decode:
                            amx_decode_run(<const uint16_t*>qp, &q_off[0], q_rs, q_cs,
                                           <const uint16_t*>kp, &k_off[0], k_rs, k_cs,
                                           <const uint16_t*>vp, &v_off[0], v_rs, v_cs,
                                           bmask, amask, mo, m_rs, m_cs, &out[0, 0, 0],
                                           &lse[0, 0], batch, L, S, E, Ev, <float>scale, &var,
                                           n_threads, engine == BF16_TILES_HW, &status,
                                           &redo)
                        else:
                            bf16_attention_run(
                                <const uint16_t*>qp, &q_off[0], q_rs, q_cs,
                                <const uint16_t*>kp, &k_off[0], k_rs, k_cs,
                                <const uint16_t*>vp, &v_off[0], v_rs, v_cs, bmask, amask, mo,
                                m_rs, m_cs, &out[0, 0, 0], &lse[0, 0], batch, L, S, E, Ev,
                                <float>scale, &var, want_lse, n_threads, engine, &status,
                                &redo)
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
    return redo != 0
