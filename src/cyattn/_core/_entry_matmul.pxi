# Entry points, matrix products: matmul_accumulate (the general path: per-batch offset arrays,
# any strides), the packed-B interface (packed_b_size, packed_b_layout, pack_b_whole_into,
# matmul_packed_b; cyattn.matmul._PackedB: B packed once, e.g. the encoder's weights at load,
# and reused by every call), and matmul_fast, the low-overhead path of C-contiguous, aligned
# 2-D arrays. All drive the GEMM of _gemm.pxi; cyattn/matmul.py has validated the arguments,
# and matmul_fast declines (returns False) when it does not apply.

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


def matmul_fast(a, b, out, double alpha, int n_threads):
    """out += alpha * a @ b if a (M, K), b (K, N) and out (M, N) are C-contiguous, aligned,
    non-empty 2-D arrays of one native float dtype and out is writable and disjoint from both;
    returns False without touching anything otherwise. The low-overhead path of
    matmul_accumulate: one pass of checks on the buffers, no offset arrays. n_threads 0: the
    default thread count, for a product small enough to run on one thread whatever that count
    (below 2 << 18 multiply-adds); a larger one is declined (False), for the caller to resolve
    the count (matmul_accumulate's tiny calls, without the Python layers that resolve it)."""
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
                if n_threads == 0 and (M * N * K) >> 18 > 1:    # the count is the caller's
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


# --- bfloat16 on bf16 dot products (precision="fast") ---

BF16_DOT = bool(CYATTN_HAVE_BF16_DOT)   # this module multiplies bf16 with vdpbf16ps
BF16_ARM = bool(CYATTN_HAVE_BF16_ARM)   # this module multiplies bf16 with BFDOT (neonbf16)
# the rule of precision="fast" in this build where it has no instruction: BFDOT's in aarch64
# builds (the bits of an aarch64 CPU with FEAT_BF16), vdpbf16ps's in x86-64 ones
BF16_RULE = "arm" if CYATTN_BF16_RULE_ARM else "x86"


def matmul_accumulate_bf16(a, const int64_t[::1] a_off, Py_ssize_t rsa, Py_ssize_t csa,
                           b, const int64_t[::1] b_off, Py_ssize_t rsb, Py_ssize_t csb,
                           out, const int64_t[::1] c_off, Py_ssize_t rsc, Py_ssize_t csc,
                           Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, double alpha,
                           int n_threads, int c_fmt=0, bint emulate=False,
                           bint arm=CYATTN_BF16_RULE_ARM):
    """out[t] += alpha * a[t] @ b[t] with bf16 a and b (uint16 views of the bits) on the bf16
    dot product (_gemm_bf16.pxi): vdpbf16ps's rule, or BFDOT's with ``arm`` (the default in
    aarch64 builds), on the instruction where this module has it (BF16_DOT, BF16_ARM) unless
    ``emulate``, else the rule's model, which gives the same bits. out is float32, or bf16 bits
    (uint16) with c_fmt = CYATTN_HALF_BF16; offsets and strides in elements."""
    cdef Py_buffer av, bv, cv
    cdef char* ap
    cdef char* bp
    cdef char* cp
    cdef int status = 0
    cdef Py_ssize_t batch = c_off.shape[0]
    cdef Py_ssize_t tile_m, tile_n
    cdef int engine = bf16_engine(arm, emulate)
    matmul_tiles(batch, M, N, BF16_MR, BF16_NR, &n_threads, &tile_m, &tile_n)
    if c_fmt != 0:
        half_c_tiles(BF16_NR, &tile_m, &tile_n)
    ap = _buf(a, &av, False)
    try:
        bp = _buf(b, &bv, False)
        try:
            cp = _buf(out, &cv, True)
            try:
                if av.itemsize != 2 or bv.itemsize != 2 or cv.itemsize != (2 if c_fmt else 4):
                    raise ValueError("matmul_accumulate_bf16: element sizes do not match")
                with nogil:
                    matmul_tasks_bf16(<const uint16_t*>ap, &a_off[0], rsa, csa,
                                      <const uint16_t*>bp, &b_off[0], rsb, csb,
                                      cp, &c_off[0], rsc, csc, batch, M, N, K, <float>alpha,
                                      tile_m, tile_n, n_threads, &status, c_fmt, engine)
            finally:
                PyBuffer_Release(&cv)
        finally:
            PyBuffer_Release(&bv)
    finally:
        PyBuffer_Release(&av)
    if status:
        raise MemoryError("cyattn.matmul_accumulate: could not allocate packing buffers")


def bf16_dot_lanes(const float[::1] acc, const uint32_t[::1] a, const uint32_t[::1] b,
                   float[::1] out, bint emulate=False, bint arm=False):
    """out[i] = one vdpbf16ps lane: acc[i] + the products of the bf16 pairs a[i] and b[i]
    (high halves first), on the instruction where this module has it (BF16_DOT) unless
    ``emulate``, else emulated; with ``arm``, one BFDOT lane (the pair summed first, rounded
    to odd: isa/_cyattn_bf16_arm.h) on the instruction where this module has it (BF16_ARM)
    unless ``emulate``, else the model. For the tests of the semantics; lengths must match."""
    cdef Py_ssize_t n = acc.shape[0], i
    if a.shape[0] != n or b.shape[0] != n or out.shape[0] != n:
        raise ValueError("bf16_dot_lanes: acc, a, b and out must have one length")
    with nogil:
        if arm:
            if CYATTN_HAVE_BF16_ARM and not emulate:
                for i in range(n):
                    out[i] = cyattn_bf16_arm_dot_lane_hw(acc[i], a[i], b[i])
            else:
                for i in range(n):
                    out[i] = cyattn_bf16_arm_dot_step(acc[i], a[i], b[i])
        elif CYATTN_HAVE_BF16_DOT and not emulate:
            for i in range(n):
                out[i] = cyattn_bf16_dot_lane_hw(acc[i], a[i], b[i])
        else:
            for i in range(n):
                out[i] = cyattn_bf16_dot_step(acc[i], a[i], b[i])


# --- bfloat16 on AMX tiles (precision="fast" in the opt-in amx variant; the model elsewhere) ---

AMX = bool(CYATTN_HAVE_AMX)   # this module multiplies bf16 on AMX tiles (the amx variant)


def matmul_accumulate_amx(a, const int64_t[::1] a_off, Py_ssize_t rsa, Py_ssize_t csa,
                          b, const int64_t[::1] b_off, Py_ssize_t rsb, Py_ssize_t csb,
                          out, const int64_t[::1] c_off, Py_ssize_t rsc, Py_ssize_t csc,
                          Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, double alpha,
                          int n_threads, int c_fmt=0, bint emulate=False):
    """out[t] += alpha * a[t] @ b[t] with bf16 a and b (uint16 views of the bits) on AMX
    tiles (_gemm_amx.pxi): the instructions where this module has them (AMX) unless
    ``emulate``, else the portable model of the tiles, which gives the same bits. out is
    float32, or bf16 bits (uint16) with c_fmt = CYATTN_HALF_BF16; offsets and strides in
    elements. The caller (cyattn.matmul) has checked shapes, strides and offsets."""
    cdef Py_buffer av, bv, cv
    cdef char* ap
    cdef char* bp
    cdef char* cp
    cdef int status = 0
    cdef Py_ssize_t batch = c_off.shape[0]
    cdef bint use_hw = CYATTN_HAVE_AMX and not emulate
    if n_threads < 1:
        n_threads = 1
    ap = _buf(a, &av, False)
    try:
        bp = _buf(b, &bv, False)
        try:
            cp = _buf(out, &cv, True)
            try:
                if av.itemsize != 2 or bv.itemsize != 2 or cv.itemsize != (2 if c_fmt else 4):
                    raise ValueError("matmul_accumulate_amx: element sizes do not match")
                if a_off.shape[0] != batch or b_off.shape[0] != batch:
                    raise ValueError("matmul_accumulate_amx: offsets of one batch expected")
                with nogil:
                    matmul_tasks_amx(<const uint16_t*>ap, &a_off[0], rsa, csa,
                                     <const uint16_t*>bp, &b_off[0], rsb, csb,
                                     cp, &c_off[0], rsc, csc, batch, M, N, K, <float>alpha,
                                     n_threads, &status, c_fmt, use_hw)
            finally:
                PyBuffer_Release(&cv)
        finally:
            PyBuffer_Release(&bv)
    finally:
        PyBuffer_Release(&av)
    if status:
        raise MemoryError("cyattn.matmul_accumulate: could not allocate tile buffers")


def amx_tile_product(const uint16_t[::1] a, const uint16_t[::1] b, const uint32_t[::1] c0,
                     uint32_t[::1] out, bint emulate=False):
    """One TDPBF16PS on 16 x 64-byte tiles: ``out = c0 + a @ b`` with a (16 x 32 bf16 bits,
    row m holding the k pairs of output row m), b (16 x 32 bf16 bits, row k holding the pairs
    of the 16 output columns), c0 and out (16 x 16 float32 bits), flattened. On the
    instruction where this module has it (AMX) unless ``emulate``, else on the portable model
    (isa/_cyattn_amx_model.h). For the tests that hold the model to bits recorded on AMX
    hardware (tests/data/amx_bf16_golden.bin)."""
    if a.shape[0] != 512 or b.shape[0] != 512 or c0.shape[0] != 256 or out.shape[0] != 256:
        raise ValueError("amx_tile_product: a and b need 512 elements, c0 and out 256")
    with nogil:
        if CYATTN_HAVE_AMX and not emulate:
            cyattn_amx_tile_product_hw(&a[0], &b[0], &c0[0], &out[0])
        else:
            cyattn_amx_tile_product_model(&a[0], &b[0], &c0[0], &out[0])
