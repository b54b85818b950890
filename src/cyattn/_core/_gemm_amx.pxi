# bfloat16 GEMM on AMX tiles (matmul_accumulate with precision="fast" in the opt-in amx
# variant; the portable model of the tiles elsewhere, for the tests): the threads' split and
# the buffers. The tile loop is C, written once over the tile operations
# (isa/_cyattn_amx_loop.h), compiled over the model (isa/_cyattn_amx_model.h) and, in the amx
# variant only, over the instructions (isa/_cyattn_amx.h).
#
# Design
# ------
# * Tasks are (batch entry, 32-column panel of C, chunk of AMX_ROW_CHUNK rows); worker w of T
#   takes tasks w, w + T, ... Each task packs its B panel once (all of K, in TDPBF16PS's pair
#   layout, reused by the worker's next task of the same panel) and walks its rows in 32-row
#   blocks: A packed per block, a 2 x 2 block of C tiles accumulated over all of K, 32 k per
#   tile product, then added to C as fma(alpha, acc, C) (bf16 C: rounded once).
# * Per output element the sums depend only on K: the tile product's two partial sums (even
#   and odd k) per 32-k chunk, chunks in order into the C tile. Tiling and threads never
#   change them, so results are bit-identical for any thread count, and the model build
#   gives the hardware build's bits (both compute TDPBF16PS; tests/test_amx_model.py).
# * Each worker loads the tile configuration once per panel and releases the tiles at the
#   panel's end (inside the C loop), so no thread holds tile state after the kernel.

cdef enum:
    AMX_ROW_CHUNK = 256


cdef int matmul_worker_amx(const uint16_t* a, const int64_t* a_off, Py_ssize_t rsa,
                           Py_ssize_t csa, const uint16_t* b, const int64_t* b_off,
                           Py_ssize_t rsb, Py_ssize_t csb, void* c, const int64_t* c_off,
                           Py_ssize_t rsc, Py_ssize_t csc, Py_ssize_t batch, Py_ssize_t M,
                           Py_ssize_t N, Py_ssize_t K, float alpha, Py_ssize_t first,
                           Py_ssize_t step, int c_fmt, bint use_hw) noexcept nogil:
    """Tasks first, first + step, ... of a batched C += alpha A B (bf16 A and B, float32 or
    bf16 C) on tiles, with this worker's own buffers; 1 if they cannot be allocated."""
    cdef Py_ssize_t nk = (K + AMX_KB - 1) // AMX_KB
    cdef Py_ssize_t panels = (N + AMX_BLOCK - 1) // AMX_BLOCK
    cdef Py_ssize_t chunks = (M + AMX_ROW_CHUNK - 1) // AMX_ROW_CHUNK
    cdef Py_ssize_t ntasks = batch * panels * chunks
    cdef Py_ssize_t t, bi, pj, ci, j0, i0, mm, nn, last = -1
    cdef Py_ssize_t esz = 2 if c_fmt != 0 else 4
    cdef size_t bytes_one = <size_t>(nk * AMX_CHUNK) * sizeof(uint16_t)
    cdef void* raw
    cdef uint16_t* pb
    cdef uint16_t* abuf
    cdef char* cdst
    if ntasks <= 0 or K <= 0:
        return 0
    raw = malloc(2 * bytes_one + 2 * ALIGN)
    if raw == NULL:
        return 1
    pb = <uint16_t*>align_ptr(raw)
    abuf = <uint16_t*>align_ptr(<char*>pb + bytes_one)
    t = first
    while t < ntasks:
        bi = t // (panels * chunks)
        pj = (t // chunks) % panels
        ci = t % chunks
        j0 = pj * AMX_BLOCK
        i0 = ci * AMX_ROW_CHUNK
        nn = N - j0 if N - j0 < AMX_BLOCK else AMX_BLOCK
        mm = M - i0 if M - i0 < AMX_ROW_CHUNK else AMX_ROW_CHUNK
        if t // chunks != last:
            cyattn_amx_pack_b(K, nn, b + b_off[bi] + j0 * csb, rsb, csb, pb)
            last = t // chunks
        cdst = <char*>c + (c_off[bi] + i0 * rsc + j0 * csc) * esz
        if use_hw:
            cyattn_amx_gemm_panel_hw(mm, K, a + a_off[bi] + i0 * rsa, rsa, csa, pb, abuf,
                                     cdst, rsc, csc, nn, alpha, c_fmt)
        else:
            cyattn_amx_gemm_panel_model(mm, K, a + a_off[bi] + i0 * rsa, rsa, csa, pb, abuf,
                                        cdst, rsc, csc, nn, alpha, c_fmt)
        t += step
    free(raw)
    return 0


cdef void matmul_tasks_amx(const uint16_t* a, const int64_t* a_off, Py_ssize_t rsa,
                           Py_ssize_t csa, const uint16_t* b, const int64_t* b_off,
                           Py_ssize_t rsb, Py_ssize_t csb, void* c, const int64_t* c_off,
                           Py_ssize_t rsc, Py_ssize_t csc, Py_ssize_t batch, Py_ssize_t M,
                           Py_ssize_t N, Py_ssize_t K, float alpha, int n_threads,
                           int* status, int c_fmt, bint use_hw) noexcept nogil:
    """Batched C += alpha A B on tiles: worker w of n_threads takes tasks w, w + n_threads,
    ... (matmul_worker_amx); status[0] = 1 if a worker could not allocate its buffers."""
    cdef Py_ssize_t w
    cdef Py_ssize_t ntasks = batch * ((N + AMX_BLOCK - 1) // AMX_BLOCK) \
        * ((M + AMX_ROW_CHUNK - 1) // AMX_ROW_CHUNK)
    if batch <= 0 or M <= 0 or N <= 0:
        return
    if n_threads > ntasks:
        n_threads = <int>ntasks
    if n_threads <= 1:
        if matmul_worker_amx(a, a_off, rsa, csa, b, b_off, rsb, csb, c, c_off, rsc, csc,
                             batch, M, N, K, alpha, 0, 1, c_fmt, use_hw):
            status[0] = 1
        return
    for w in prange(n_threads, num_threads=n_threads, schedule='static', chunksize=1):
        if matmul_worker_amx(a, a_off, rsa, csa, b, b_off, rsb, csb, c, c_off, rsc, csc,
                             batch, M, N, K, alpha, w, n_threads, c_fmt, use_hw):
            status[0] = 1
