# Entry points, shared pieces: buffer acquisition (_buf, and the fast paths' _get_contiguous /
# _get_rows, which decline instead of raising), the dtype tests (_float_code, _is_u16) and the
# layout and overlap tests of the fast paths (attention_fast's mask layout, byte extents, self
# overlap, the copy back into a strided output). Included first of the entry-point files, so
# the rows, matmul and attention entry points that follow find them defined. The Python-facing
# functions trust their arguments (validation lives in cyattn/_validate.py and the public
# modules), except that a fast path checks here that it applies and declines (returns None or
# False) so that the general path runs.

cdef char* _buf(object arr, Py_buffer* view, bint writable) except NULL:
    PyObject_GetBuffer(arr, view, PyBUF_RECORDS if writable else PyBUF_RECORDS_RO)
    return <char*>view.buf


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
