# Python-facing entry points: buffer acquisition, the fast-path argument checks and the calls
# into the kernels. Validation lives in Python (cyattn/_validate.py and the public modules);
# these trust their arguments, except where a fast path checks that it applies and declines
# (returns None) so that the general path runs.

cdef char* _buf(object arr, Py_buffer* view, bint writable) except NULL:
    PyObject_GetBuffer(arr, view, PyBUF_RECORDS if writable else PyBUF_RECORDS_RO)
    return <char*>view.buf


def exp_values(x, out, bint nonpos=False):
    """out = exp(x) with the kernels' exp (1-D float32/float64 C-contiguous arrays).

    nonpos: with the shortened exp of arguments in [EXP_NORMAL, 0] (-87 for float32, -708 for
    float64), which must give the same bits there (tests only; other arguments are undefined).
    """
    cdef Py_buffer xv, ov
    cdef char* xp = _buf(x, &xv, False)
    cdef char* op
    cdef Py_ssize_t n = xv.len // xv.itemsize
    cdef bint dbl = xv.itemsize == 8
    try:
        op = _buf(out, &ov, True)
        try:
            with nogil:
                if dbl:
                    exp_array(<const double*>xp, <double*>op, n, nonpos)
                else:
                    exp_array(<const float*>xp, <float*>op, n, nonpos)
        finally:
            PyBuffer_Release(&ov)
    finally:
        PyBuffer_Release(&xv)


def tanh_values(x, out):
    """out = tanh(x) with the kernels' tanh (1-D float32/float64 C-contiguous arrays; tests)."""
    cdef Py_buffer xv, ov
    cdef char* xp = _buf(x, &xv, False)
    cdef char* op
    cdef Py_ssize_t n = xv.len // xv.itemsize
    cdef bint dbl = xv.itemsize == 8
    try:
        op = _buf(out, &ov, True)
        try:
            with nogil:
                if dbl:
                    tanh_array(<const double*>xp, <double*>op, n)
                else:
                    tanh_array(<const float*>xp, <float*>op, n)
        finally:
            PyBuffer_Release(&ov)
    finally:
        PyBuffer_Release(&xv)


def gelu_rows(h, bias, p, int n_threads):
    """h = GELU(h + bias) in place, row by row: h a C-contiguous 2-D float32 array, bias None or
    a C-contiguous float32 array of h's row length, p the 7 float32 coefficients of the GELU
    polynomial (_encoder_rows.pxi). Trusts its arguments (cyattn.encoder checks them)."""
    cdef Py_buffer hv, bv, pv
    cdef float* hp = <float*>_buf(h, &hv, True)
    cdef const float* bp = NULL
    cdef const float* pp
    cdef Py_ssize_t rows = hv.shape[0], n = hv.shape[1]
    try:
        pp = <const float*>_buf(p, &pv, False)
        try:
            if bias is not None:
                bp = <const float*>_buf(bias, &bv, False)
            try:
                with nogil:
                    gelu_row_tasks(hp, bp, rows, n, pp, n_threads)
            finally:
                if bias is not None:
                    PyBuffer_Release(&bv)
        finally:
            PyBuffer_Release(&pv)
    finally:
        PyBuffer_Release(&hv)


def layer_norm_rows(x, weight, bias, float eps, int n_threads):
    """x = LayerNorm(x) over its rows in place: x a C-contiguous 2-D float32 array, weight and
    bias C-contiguous float32 arrays of x's row length (_encoder_rows.pxi). Trusts its
    arguments (cyattn.encoder checks them)."""
    cdef Py_buffer xv, wv, bv
    cdef float* xp = <float*>_buf(x, &xv, True)
    cdef const float* wp
    cdef const float* bp
    cdef Py_ssize_t rows = xv.shape[0], n = xv.shape[1]
    try:
        wp = <const float*>_buf(weight, &wv, False)
        try:
            bp = <const float*>_buf(bias, &bv, False)
            try:
                with nogil:
                    layer_norm_row_tasks(xp, rows, n, wp, bp, eps, n_threads)
            finally:
                PyBuffer_Release(&bv)
        finally:
            PyBuffer_Release(&wv)
    finally:
        PyBuffer_Release(&xv)


def half_to_float32(x, out, int fmt):
    """out = x widened to float32 with the kernels' conversion (tests): x a 1-D C-contiguous
    uint16 array of float16 (fmt 1) or bfloat16 (fmt 2) bit patterns, out float32 of x's size."""
    cdef Py_buffer xv, ov
    cdef char* xp = _buf(x, &xv, False)
    cdef char* op
    cdef Py_ssize_t n = xv.len // 2
    try:
        op = _buf(out, &ov, True)
        try:
            if (fmt != CYATTN_HALF_F16 and fmt != CYATTN_HALF_BF16) or xv.itemsize != 2 \
                    or ov.itemsize != 4 or ov.len != 4 * n:
                raise ValueError("half_to_float32: uint16 x, float32 out of its size, fmt 1 or 2")
            with nogil:
                cyattn_half_to_float(<const uint16_t*>xp, <float*>op, n, fmt)
        finally:
            PyBuffer_Release(&ov)
    finally:
        PyBuffer_Release(&xv)


def float32_to_half(x, out, int fmt):
    """out = x rounded to float16 (fmt 1) or bfloat16 (fmt 2) bit patterns with the kernels'
    conversion (tests): x a 1-D C-contiguous float32 array, out uint16 of x's size."""
    cdef Py_buffer xv, ov
    cdef char* xp = _buf(x, &xv, False)
    cdef char* op
    cdef Py_ssize_t n = xv.len // 4
    try:
        op = _buf(out, &ov, True)
        try:
            if (fmt != CYATTN_HALF_F16 and fmt != CYATTN_HALF_BF16) or xv.itemsize != 4 \
                    or ov.itemsize != 2 or ov.len != 2 * n:
                raise ValueError("float32_to_half: float32 x, uint16 out of its size, fmt 1 or 2")
            with nogil:
                cyattn_float_to_half(<const float*>xp, <uint16_t*>op, n, fmt)
        finally:
            PyBuffer_Release(&ov)
    finally:
        PyBuffer_Release(&xv)


def softmax_rows_half(x, out, int x_fmt, int out_fmt, bmask, amask, int a_fmt,
                      Py_ssize_t b_rs, Py_ssize_t b_cs, Py_ssize_t a_rs, Py_ssize_t a_cs,
                      bint log_out, int n_threads):
    """Row softmax in float32 of C-contiguous 2-D x into C-contiguous 2-D out of x's shape,
    either of them 16-bit (x_fmt / out_fmt: 1 float16, 2 bfloat16, as uint16 arrays) or
    float32 (fmt 0), with at least one 16-bit: each row is widened as it is read and rounded
    once as it is written (softmax_row_tasks_half). bmask: None or uint8 (True = keep); amask: None,
    float32 (a_fmt 0) or 16-bit (a_fmt); each addressed from its first element with element
    strides (b_rs, b_cs) / (a_rs, a_cs)."""
    cdef Py_buffer xv, ov, bv, av
    cdef char* xp
    cdef char* op
    cdef const uint8_t* bp = NULL
    cdef char* ap = NULL
    cdef Py_ssize_t rows, n
    cdef int failed = 0
    if not (0 <= x_fmt <= 2 and 0 <= out_fmt <= 2 and 0 <= a_fmt <= 2 and (x_fmt or out_fmt)):
        raise ValueError("softmax_rows_half: formats 0 (float32), 1 or 2, one of x/out 16-bit")
    xp = _buf(x, &xv, False)
    try:
        op = _buf(out, &ov, True)
        try:
            if (xv.ndim != 2 or ov.ndim != 2 or xv.shape[0] != ov.shape[0]
                    or xv.shape[1] != ov.shape[1] or xv.itemsize != (2 if x_fmt else 4)
                    or ov.itemsize != (2 if out_fmt else 4)):
                raise ValueError("softmax_rows_half: 2-D x and out of one shape and the "
                                 "item sizes of their formats")
            rows = xv.shape[0]
            n = xv.shape[1]
            if bmask is not None:
                bp = <const uint8_t*>_buf(bmask, &bv, False)
            try:
                if amask is not None:
                    ap = _buf(amask, &av, False)
                try:
                    if amask is not None and av.itemsize != (2 if a_fmt else 4):
                        raise ValueError("softmax_rows_half: amask's item size is not its format's")
                    with nogil:
                        failed = softmax_row_tasks_half(xp, x_fmt, op, out_fmt, rows, n, bp,
                                                        b_rs, b_cs, ap, a_fmt, a_rs, a_cs,
                                                        log_out, n_threads)
                finally:
                    if amask is not None:
                        PyBuffer_Release(&av)
            finally:
                if bmask is not None:
                    PyBuffer_Release(&bv)
        finally:
            PyBuffer_Release(&ov)
    finally:
        PyBuffer_Release(&xv)
    if failed:
        raise MemoryError("cyattn.softmax: could not allocate a row buffer")


def softmax_rows(x, out, bmask, amask, Py_ssize_t b_rs, Py_ssize_t b_cs,
                 Py_ssize_t a_rs, Py_ssize_t a_cs, bint log_out, int n_threads):
    """Row softmax of C-contiguous 2-D x into C-contiguous out (same shape and dtype).

    bmask: None or a uint8 array (True = keep); amask: None or an array of x's dtype; each
    addressed from its first element with element strides (b_rs, b_cs) / (a_rs, a_cs).
    """
    cdef Py_buffer xv, ov, bv, av
    cdef char* xp
    cdef char* op
    cdef const uint8_t* bp = NULL
    cdef char* ap = NULL
    cdef Py_ssize_t rows, n
    cdef bint dbl
    xp = _buf(x, &xv, False)
    try:
        rows = xv.shape[0]
        n = xv.shape[1]
        dbl = xv.itemsize == 8
        op = _buf(out, &ov, True)
        try:
            if bmask is not None:
                bp = <const uint8_t*>_buf(bmask, &bv, False)
            try:
                if amask is not None:
                    ap = _buf(amask, &av, False)
                try:
                    with nogil:
                        if dbl:
                            softmax_row_tasks(<const double*>xp, <double*>op, rows, n,
                                              bp, b_rs, b_cs, <const double*>ap, a_rs, a_cs,
                                              log_out, n_threads)
                        else:
                            softmax_row_tasks(<const float*>xp, <float*>op, rows, n,
                                              bp, b_rs, b_cs, <const float*>ap, a_rs, a_cs,
                                              log_out, n_threads)
                finally:
                    if amask is not None:
                        PyBuffer_Release(&av)
            finally:
                if bmask is not None:
                    PyBuffer_Release(&bv)
        finally:
            PyBuffer_Release(&ov)
    finally:
        PyBuffer_Release(&xv)


def matmul_accumulate(a, const int64_t[::1] a_off, Py_ssize_t rsa, Py_ssize_t csa,
                      b, const int64_t[::1] b_off, Py_ssize_t rsb, Py_ssize_t csb,
                      out, const int64_t[::1] c_off, Py_ssize_t rsc, Py_ssize_t csc,
                      Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, double alpha, int n_threads,
                      int a_fmt=0, int b_fmt=0, int c_fmt=0):
    """out[t] += alpha * a[t] @ b[t] for each batch entry t, addressed by element offsets.

    a, b, out are arrays of one float dtype (any strides that are multiples of the itemsize,
    aligned); offsets and strides are in elements, from each array's first element. With
    a_fmt, b_fmt or c_fmt != 0 (CYATTN_HALF_F16 / BF16) that array holds 16-bit elements of
    the format (a uint16 view) and the others float32: computed in float32, 16-bit operands
    widened as they are packed, a 16-bit out rounded once.
    """
    cdef Py_buffer av, bv, cv
    cdef char* ap
    cdef char* bp
    cdef char* cp
    cdef int status = 0
    cdef Py_ssize_t batch = c_off.shape[0]
    cdef Py_ssize_t tile_m, tile_n
    cdef bint half = a_fmt != 0 or b_fmt != 0 or c_fmt != 0
    cdef bint dbl = not half and a.itemsize == 8
    if dbl:
        matmul_tiles(batch, M, N, MRD, NRD, &n_threads, &tile_m, &tile_n)
    else:
        matmul_tiles(batch, M, N, MR, NR, &n_threads, &tile_m, &tile_n)
        if c_fmt != 0:
            half_c_tiles(NR, &tile_m, &tile_n)
    ap = _buf(a, &av, False)
    try:
        bp = _buf(b, &bv, False)
        try:
            cp = _buf(out, &cv, True)
            try:
                if (av.itemsize != (2 if a_fmt else (8 if dbl else 4))
                        or bv.itemsize != (2 if b_fmt else (8 if dbl else 4))
                        or cv.itemsize != (2 if c_fmt else (8 if dbl else 4))):
                    raise ValueError("matmul_accumulate: element sizes do not match the formats")
                with nogil:
                    if dbl:
                        matmul_tasks(<const double*>ap, &a_off[0], rsa, csa,
                                     <const double*>bp, &b_off[0], rsb, csb,
                                     <double*>cp, &c_off[0], rsc, csc,
                                     batch, M, N, K, alpha, tile_m, tile_n, n_threads, &status,
                                     0, 0, 0, NULL)
                    else:
                        matmul_tasks(<const float*>ap, &a_off[0], rsa, csa,
                                     <const float*>bp, &b_off[0], rsb, csb,
                                     <float*>cp, &c_off[0], rsc, csc,
                                     batch, M, N, K, <float>alpha, tile_m, tile_n,
                                     n_threads, &status, a_fmt, b_fmt, c_fmt, NULL)
            finally:
                PyBuffer_Release(&cv)
        finally:
            PyBuffer_Release(&bv)
    finally:
        PyBuffer_Release(&av)
    if status:
        raise MemoryError("cyattn.matmul_accumulate: could not allocate packing buffers")


def packed_b_size(Py_ssize_t K, Py_ssize_t N):
    """Floats that B (K x N, float32) takes packed whole by pack_b_whole: K * round_up(N, NR)
    (this variant's float32 panel width)."""
    return packed_b_floats(K, N)


def packed_b_layout():
    """(KC, NR): the depth of pack_b_whole's blocks of rows and the width of its panels."""
    return KC, NR


def pack_b_whole_into(b, Py_ssize_t rsb, Py_ssize_t csb, Py_ssize_t K, Py_ssize_t N, out):
    """out[:packed_b_size(K, N)] = b (float32, K x N, element strides rsb, csb) packed whole
    for matmul_packed_b; out is a writable C-contiguous float32 buffer of that size."""
    cdef Py_buffer bv, ov
    cdef char* bp = _buf(b, &bv, False)
    cdef char* op
    try:
        op = _buf(out, &ov, True)
        try:
            if (bv.itemsize != 4 or ov.itemsize != 4 or K < 0 or N < 0
                    or ov.len < packed_b_floats(K, N) * 4):
                raise ValueError("pack_b_whole_into: expected float32 buffers of the sizes given")
            with nogil:
                pack_b_whole(K, N, <const float*>bp, rsb, csb, <float*>op)
        finally:
            PyBuffer_Release(&ov)
    finally:
        PyBuffer_Release(&bv)


def matmul_packed_b(a, Py_ssize_t rsa, Py_ssize_t csa, packed, out, Py_ssize_t rsc,
                    Py_ssize_t csc, Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, double alpha,
                    int n_threads):
    """out (M x N) += alpha * a (M x K) @ B for a float32 B packed whole by pack_b_whole_into
    (with this module: the panel width is the variant's); a, out float32 with element strides.
    The same bits as matmul_accumulate on the unpacked B."""
    cdef Py_buffer av, pv, cv
    cdef char* ap = _buf(a, &av, False)
    cdef char* pp
    cdef char* cp
    cdef int status = 0
    cdef int64_t zero = 0
    cdef Py_ssize_t tile_m, tile_n
    try:
        pp = _buf(packed, &pv, False)
        try:
            cp = _buf(out, &cv, True)
            try:
                if (av.itemsize != 4 or pv.itemsize != 4 or cv.itemsize != 4
                        or pv.len < packed_b_floats(K, N) * 4):
                    raise ValueError("matmul_packed_b: expected float32 buffers of the sizes "
                                     "given")
                if M > 0 and N > 0 and K > 0:
                    matmul_tiles(1, M, N, MR, NR, &n_threads, &tile_m, &tile_n)
                    with nogil:
                        matmul_tasks(<const float*>ap, &zero, rsa, csa,
                                     <const float*>pp, &zero, 0, 0,
                                     <float*>cp, &zero, rsc, csc,
                                     1, M, N, K, <float>alpha, tile_m, tile_n, n_threads,
                                     &status, 0, 0, 0, <const float*>pp)
            finally:
                PyBuffer_Release(&cv)
        finally:
            PyBuffer_Release(&pv)
    finally:
        PyBuffer_Release(&av)
    if status:
        raise MemoryError("cyattn.matmul_accumulate: could not allocate packing buffers")


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
    cdef bint decode = (0 < L <= DECODE_MAX_L and batch * S * (E + Ev) >= L * DECODE_MIN_WORK
                        and q_cs == 1 and k_cs == 1 and v_cs == 1)
    if half_redo == NULL:
        half_redo = &redo_local
    if (q_fmt != 0 or kv_fmt != 0) and (dbl or (decode and q_fmt != 0)):
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
            decode_attention(<const double*>qp, q_off, q_rs, kp, k_off, k_rs, vp, v_off, v_rs, 0,
                             <const uint8_t*>mp if mask_kind == 1 else NULL,
                             <const double*>mp if mask_kind == 2 else NULL,
                             mo, m_rs, m_cs, <double*>op, o_off, o_rs, <double*>lp,
                             batch, L, S, E, Ev, scale, var, n_threads, &status, half_redo)
        else:
            decode_attention(<const float*>qp, q_off, q_rs, kp, k_off, k_rs, vp, v_off, v_rs,
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


cdef inline int _float_code(const Py_buffer* view) noexcept:
    """4 for a native float32 buffer, 8 for float64, 0 for anything else."""
    cdef const char* fmt = view.format
    if fmt == NULL or fmt[0] == 0 or fmt[1] != 0:
        return 0
    if fmt[0] == b'f' and view.itemsize == 4:
        return 4
    if fmt[0] == b'd' and view.itemsize == 8:
        return 8
    return 0


cdef inline bint _disjoint(const Py_buffer* x, const Py_buffer* y) noexcept:
    cdef uintptr_t x0 = <uintptr_t>x.buf
    cdef uintptr_t y0 = <uintptr_t>y.buf
    return x0 + <uintptr_t>x.len <= y0 or y0 + <uintptr_t>y.len <= x0


cdef inline bint _is_u16(const Py_buffer* view) noexcept:
    """True for a buffer of native uint16 elements (16-bit floats viewed as uint16)."""
    cdef const char* fmt = view.format
    return (fmt != NULL and fmt[0] == b'H' and fmt[1] == 0 and view.itemsize == 2)


cdef inline bint _get_rows(object obj, Py_buffer* view):
    """Acquire a strided, formatted buffer of obj whose strides are whole elements and whose
    last axis has unit stride (rows of adjacent elements); False (no exception) if it has
    none or is not of that kind."""
    cdef int d
    try:
        PyObject_GetBuffer(obj, view, PyBUF_RECORDS_RO)
    except Exception:
        return False
    for d in range(view.ndim):
        if (view.strides[d] % view.itemsize
                or (d == view.ndim - 1 and view.shape[d] > 1
                    and view.strides[d] != view.itemsize)):
            PyBuffer_Release(view)
            return False
    return True


cdef inline bint _get_contiguous(object obj, Py_buffer* view, bint writable):
    """Acquire a C-contiguous, formatted buffer of obj; False (no exception) if it has none."""
    cdef int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT
    if writable:
        flags |= PyBUF_WRITABLE
    try:
        PyObject_GetBuffer(obj, view, flags)
    except Exception:
        return False
    return True


def matmul_fast(a, b, out, double alpha, int n_threads):
    """out += alpha * a @ b if a (M, K), b (K, N) and out (M, N) are C-contiguous, aligned,
    non-empty 2-D arrays of one native float dtype and out is writable and disjoint from both;
    returns False without touching anything otherwise. The low-overhead path of
    matmul_accumulate: one pass of checks on the buffers, no offset arrays."""
    cdef Py_buffer av, bv, cv
    cdef int status = 0, code
    cdef int64_t zero = 0
    cdef Py_ssize_t M, N, K, tile_m, tile_n
    cdef bint ok = False
    if not _get_contiguous(a, &av, False):
        return False
    try:
        if not _get_contiguous(b, &bv, False):
            return False
        try:
            if not _get_contiguous(out, &cv, True):
                return False
            try:
                code = _float_code(&cv)
                if (code == 0 or _float_code(&av) != code or _float_code(&bv) != code
                        or av.ndim != 2 or bv.ndim != 2 or cv.ndim != 2):
                    return False
                M = av.shape[0]
                K = av.shape[1]
                N = bv.shape[1]
                if (bv.shape[0] != K or cv.shape[0] != M or cv.shape[1] != N
                        or M == 0 or N == 0 or K == 0
                        or <uintptr_t>av.buf % code or <uintptr_t>bv.buf % code
                        or <uintptr_t>cv.buf % code
                        or not _disjoint(&cv, &av) or not _disjoint(&cv, &bv)):
                    return False
                if n_threads > (M * N * K) >> 18:     # small products run on fewer threads
                    n_threads = <int>((M * N * K) >> 18)
                if n_threads < 1:
                    n_threads = 1
                if code == 8:
                    matmul_tiles(1, M, N, MRD, NRD, &n_threads, &tile_m, &tile_n)
                else:
                    matmul_tiles(1, M, N, MR, NR, &n_threads, &tile_m, &tile_n)
                with nogil:
                    if code == 8:
                        matmul_tasks(<const double*>av.buf, &zero, K, 1,
                                          <const double*>bv.buf, &zero, N, 1,
                                          <double*>cv.buf, &zero, N, 1, 1, M, N, K,
                                          alpha, tile_m, tile_n, n_threads, &status, 0, 0, 0,
                                          NULL)
                    else:
                        matmul_tasks(<const float*>av.buf, &zero, K, 1,
                                          <const float*>bv.buf, &zero, N, 1,
                                          <float*>cv.buf, &zero, N, 1, 1, M, N, K,
                                          <float>alpha, tile_m, tile_n, n_threads, &status,
                                          0, 0, 0, NULL)
                ok = True
            finally:
                PyBuffer_Release(&cv)
        finally:
            PyBuffer_Release(&bv)
    finally:
        PyBuffer_Release(&av)
    if status:
        raise MemoryError("cyattn.matmul_accumulate: could not allocate packing buffers")
    return ok


def attention(q, const int64_t[::1] q_off, Py_ssize_t q_rs, Py_ssize_t q_cs,
              k, const int64_t[::1] k_off, Py_ssize_t k_rs, Py_ssize_t k_cs,
              v, const int64_t[::1] v_off, Py_ssize_t v_rs, Py_ssize_t v_cs,
              mask, int mask_kind, const int64_t[::1] m_off, Py_ssize_t m_rs, Py_ssize_t m_cs,
              out, lse, Py_ssize_t L, Py_ssize_t S, Py_ssize_t E, Py_ssize_t Ev,
              double scale, bint causal, bint bottom_right, bint want_lse, int n_threads,
              Py_ssize_t window_left=-1, Py_ssize_t window_right=-1, double softcap=0.0,
              const int64_t[::1] key_len=None, const int64_t[::1] query_len=None,
              const double[::1] slopes=None, const double[::1] sinks=None, int q_fmt=0,
              int kv_fmt=0, const int64_t[::1] o_off=None, Py_ssize_t o_rs=-1):
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
                            if ((kv_fmt != 0 and (kv.itemsize != 2 or vv.itemsize != 2))
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


def softmax_fast(x, out, bint log_out, int n_threads, empty):
    """(Log-)softmax over the last axis of a C-contiguous, aligned, non-empty float32/float64
    array x with at least one dimension, into ``out`` (None: a new array from
    ``empty(x.shape, dtype)``; else a writable, C-contiguous, aligned array of x's shape and
    dtype, disjoint from x). Returns the result, or None without doing anything (out untouched)
    if the arguments are not of that kind. The low-overhead path of softmax and log_softmax
    without a mask: one pass of checks on the buffers (the general path cost ~4 us per call)."""
    cdef Py_buffer xv, ov
    cdef int code, d
    cdef Py_ssize_t n, rows, work
    cdef object res = out
    if not _get_contiguous(x, &xv, False):
        return None
    try:
        code = _float_code(&xv)
        if code == 0 or xv.ndim < 1 or <uintptr_t>xv.buf % code or xv.len == 0:
            return None
        n = xv.shape[xv.ndim - 1]
        rows = (xv.len // code) // n
        if out is None:
            res = empty(tuple([xv.shape[d] for d in range(xv.ndim)]),
                        "float64" if code == 8 else "float32")
            PyObject_GetBuffer(res, &ov, PyBUF_RECORDS)
        elif not _get_contiguous(out, &ov, True):
            return None
        try:
            if out is not None:
                if (_float_code(&ov) != code or ov.ndim != xv.ndim or <uintptr_t>ov.buf % code
                        or not _disjoint(&xv, &ov)):
                    return None
                for d in range(xv.ndim):
                    if ov.shape[d] != xv.shape[d]:
                        return None
            work = (rows * n) >> 15                     # as threads_for_work(..., 1 << 15)
            if n_threads > work:
                n_threads = <int>(work if work > 0 else 1)
            with nogil:
                if code == 8:
                    softmax_row_tasks(<const double*>xv.buf, <double*>ov.buf, rows, n,
                                      NULL, 0, 0, NULL, 0, 0, log_out, n_threads)
                else:
                    softmax_row_tasks(<const float*>xv.buf, <float*>ov.buf, rows, n,
                                      NULL, 0, 0, NULL, 0, 0, log_out, n_threads)
        finally:
            PyBuffer_Release(&ov)
    finally:
        PyBuffer_Release(&xv)
    return res


cdef enum:
    FAST_MAX_DIMS = 64  # NumPy's NPY_MAXDIMS: the most dimensions an array can have


cdef int _fast_mask_layout(const Py_buffer* mv, int code, const Py_buffer* qv, Py_ssize_t S,
                           Py_ssize_t* st) noexcept:
    """The kind of a mask buffer for attention_fast: 1 for bool, 2 for an aligned float mask of
    the data dtype (``code``), 0 for anything else or a mask that does not broadcast to q's
    batch shape + (L, S) without enlarging it. For kinds 1 and 2, writes the mask's element
    stride along each of q's dims, the last standing for S (0 where broadcast), to
    st[0:q.ndim]."""
    cdef const char* fmt = mv.format
    cdef int nd = qv.ndim, lead = qv.ndim - mv.ndim, kind, d
    cdef Py_ssize_t item, size, target
    if lead < 0 or nd > FAST_MAX_DIMS:
        return 0
    if fmt != NULL and fmt[0] == b'?' and fmt[1] == 0 and mv.itemsize == 1:
        kind = 1
    elif _float_code(mv) == code and <uintptr_t>mv.buf % code == 0:
        kind = 2
    else:
        return 0
    item = mv.itemsize
    for d in range(nd):
        st[d] = 0
        if d < lead:
            continue
        size = mv.shape[d - lead]
        target = S if d == nd - 1 else qv.shape[d]
        if size == target and size != 1:
            if mv.strides[d - lead] % item:
                return 0
            st[d] = mv.strides[d - lead] // item
        elif size != 1:
            return 0
    return kind


cdef bint _extent(const Py_buffer* x, uintptr_t* lo, uintptr_t* hi) noexcept:
    """The bytes [lo, hi) that hold every element of the strided buffer x (any strides, also
    negative or zero); False if x has no element."""
    cdef int d
    lo[0] = <uintptr_t>x.buf
    hi[0] = <uintptr_t>x.buf + <uintptr_t>x.itemsize
    for d in range(x.ndim):
        if x.shape[d] == 0:
            return False
        if x.strides[d] < 0:
            lo[0] -= <uintptr_t>((x.shape[d] - 1) * -x.strides[d])
        else:
            hi[0] += <uintptr_t>((x.shape[d] - 1) * x.strides[d])
    return True


cdef bint _disjoint_strided(const Py_buffer* x, const Py_buffer* y) noexcept:
    """True if no byte of the strided buffer x (any strides, also negative or zero) lies in
    the contiguous buffer y."""
    cdef uintptr_t lo, hi
    if not _extent(x, &lo, &hi):
        return True
    return hi <= <uintptr_t>y.buf or <uintptr_t>y.buf + <uintptr_t>y.len <= lo


cdef bint _disjoint_extents(const Py_buffer* x, const Py_buffer* y) noexcept:
    """True if the byte ranges spanned by the strided buffers x and y do not meet (so no
    element of one shares a byte with an element of the other)."""
    cdef uintptr_t xlo, xhi, ylo, yhi
    if not _extent(x, &xlo, &xhi) or not _extent(y, &ylo, &yhi):
        return True
    return xhi <= ylo or yhi <= xlo


cdef bint _no_self_overlap(const Py_buffer* o) noexcept:
    """True if no two elements of the strided buffer o share a byte: with the dims of more
    than one element ordered by |stride|, each stride spans at least the block of the dims
    before it (a sufficient test; a zero stride fails it)."""
    cdef Py_ssize_t st[FAST_MAX_DIMS]
    cdef Py_ssize_t sh[FAST_MAX_DIMS]
    cdef Py_ssize_t n = 0, i, j, a, extent = o.itemsize
    if o.ndim > FAST_MAX_DIMS:
        return False
    for i in range(o.ndim):
        if o.shape[i] > 1:
            a = o.strides[i] if o.strides[i] >= 0 else -o.strides[i]
            j = n                               # insertion sort by |stride|
            while j > 0 and st[j - 1] > a:
                st[j] = st[j - 1]
                sh[j] = sh[j - 1]
                j -= 1
            st[j] = a
            sh[j] = o.shape[i]
            n += 1
    for i in range(n):
        if st[i] < extent:
            return False
        extent += st[i] * (sh[i] - 1)
    return True


cdef void _rows_to_strided(const char* src, const Py_buffer* o, const int64_t* o_off,
                           Py_ssize_t batch) noexcept nogil:
    """Copy batch x L rows of Ev adjacent elements at src (C order) into the strided buffer o
    of shape (..., L, Ev), batch entry bi starting o_off[bi] elements after o's first."""
    cdef int nd = o.ndim
    cdef Py_ssize_t item = o.itemsize, L = o.shape[nd - 2], Ev = o.shape[nd - 1]
    cdef Py_ssize_t rs = o.strides[nd - 2], cs = o.strides[nd - 1], bi, r, e
    cdef char* base
    cdef char* dst
    for bi in range(batch):
        base = <char*>o.buf + o_off[bi] * item
        for r in range(L):
            dst = base + r * rs
            if cs == item:
                memcpy(dst, src, <size_t>(Ev * item))
            else:
                for e in range(Ev):
                    memcpy(dst + e * cs, src + e * item, <size_t>item)
            src += Ev * item


def attention_fast(q, k, v, mask, out, scale, bint causal, bint bottom_right, bint gqa,
                   bint want_lse, int n_threads, empty, int q_fmt=0, int kv_fmt=0):
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
    see attention_run)."""
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


