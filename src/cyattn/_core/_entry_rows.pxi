# Entry points, element-wise and row functions: exp and tanh of arrays (tests), bias + GELU and
# LayerNorm rows (cyattn.encoder), float16/bfloat16 conversion, and softmax / log_softmax rows
# (the general path with masks and strides, its half-precision form, and softmax_fast, the
# low-overhead path of unmasked C-contiguous input). Each acquires its buffers, releases the
# GIL and calls the row kernels of _exp.pxi, _encoder_rows.pxi and _softmax_rows.pxi; the
# Python side (cyattn/softmax.py, cyattn/encoder) has validated the arguments.

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


def kv8_to_float32(x, out, int fmt):
    """out = x widened to float32 with the 8-bit K/V conversion of the decode (tests): x a 1-D
    C-contiguous array of 8-bit int8 (fmt 3) or float8_e4m3fn (fmt 4) bit patterns, out
    float32 of x's size."""
    cdef Py_buffer xv, ov
    cdef char* xp = _buf(x, &xv, False)
    cdef char* op
    cdef Py_ssize_t n = xv.len
    try:
        op = _buf(out, &ov, True)
        try:
            if (fmt != CYATTN_KV8_I8 and fmt != CYATTN_KV8_E4M3) or xv.itemsize != 1 \
                    or ov.itemsize != 4 or ov.len != 4 * n:
                raise ValueError("kv8_to_float32: 8-bit x, float32 out of its size, fmt 3 or 4")
            with nogil:
                cyattn_kv8_to_float(<const uint8_t*>xp, <float*>op, n, fmt)
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


def softmax_stream_min_bytes():
    """Bytes from which an unmasked float32 softmax / log-softmax writes its output by
    non-temporal stores on this host (the rule of STREAM_MIN_BYTES: half the last-level
    cache in the variants with 512-bit and 256-bit vectors; 1 << 62, never, in the others),
    for rows of at least softmax_stream_min_row() floats."""
    return STREAM_MIN_BYTES


def softmax_stream_min_row():
    """Row length (floats) from which the rule of softmax_stream_min_bytes() applies: 0 with
    512-bit vectors, 512 with 256-bit ones (shorter rows keep the pipelined ordinary rows)."""
    return STREAM_MIN_ROW


def softmax_rows(x, out, bmask, amask, Py_ssize_t b_rs, Py_ssize_t b_cs,
                 Py_ssize_t a_rs, Py_ssize_t a_cs, bint log_out, int n_threads,
                 Py_ssize_t stream_min=-1):
    """Row softmax of C-contiguous 2-D x into C-contiguous out (same shape and dtype).

    bmask: None or a uint8 array (True = keep); amask: None or an array of x's dtype; each
    addressed from its first element with element strides (b_rs, b_cs) / (a_rs, a_cs).
    stream_min: the output size in bytes from which unmasked float32 rows are written by
    non-temporal stores (-1: this host's rule, softmax_stream_min_bytes() for rows of at least
    softmax_stream_min_row() floats; tests pass 0 or a
    huge value to take either path; the bits are the same).
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
                    if stream_min < 0:
                        stream_min = stream_rule(n)
                    with nogil:
                        if dbl:
                            softmax_row_tasks(<const double*>xp, <double*>op, rows, n,
                                              bp, b_rs, b_cs, <const double*>ap, a_rs, a_cs,
                                              log_out, n_threads)
                        else:
                            softmax_row_tasks(<const float*>xp, <float*>op, rows, n,
                                              bp, b_rs, b_cs, <const float*>ap, a_rs, a_cs,
                                              log_out, n_threads, ov.len >= stream_min)
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


def softmax_fast(x, out, bint log_out, int n_threads, empty, Py_ssize_t stream_min=-1):
    """(Log-)softmax over the last axis of a C-contiguous, aligned, non-empty float32/float64
    array x with at least one dimension, into ``out`` (None: a new array from
    ``empty(x.shape, dtype)``; else a writable, C-contiguous, aligned array of x's shape and
    dtype, disjoint from x). Returns the result, or None without doing anything (out untouched)
    if the arguments are not of that kind. The low-overhead path of softmax and log_softmax
    without a mask: one pass of checks on the buffers (the general path cost ~4 us per call).
    stream_min: as softmax_rows's."""
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
            if stream_min < 0:
                stream_min = stream_rule(n)
            with nogil:
                if code == 8:
                    softmax_row_tasks(<const double*>xv.buf, <double*>ov.buf, rows, n,
                                      NULL, 0, 0, NULL, 0, 0, log_out, n_threads)
                else:
                    softmax_row_tasks(<const float*>xv.buf, <float*>ov.buf, rows, n,
                                      NULL, 0, 0, NULL, 0, 0, log_out, n_threads,
                                      ov.len >= stream_min)
        finally:
            PyBuffer_Release(&ov)
    finally:
        PyBuffer_Release(&xv)
    return res
