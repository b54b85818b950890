# Decode: attention for a few query rows (a KV-cache step), a stream over K and V.
#
# Design
# ------
# * decode (L <= DECODE_MAX_L unit-stride rows, unless the whole problem is tiny; this file:
#   at most DECODE_UNGROUPED_MAX_L rows and no two batch entries sharing K and V, else the
#   grouped path of _attention_decode_grouped.pxi, which reuses decode_finish): tasks
#   (batch entry, chunk of DECODE_CHUNK keys) stream their keys and values once and leave
#   (max, sum, accumulator) per row; the partials are merged in chunk order. The chunking is
#   fixed, so results do not depend on threads. Zero weights are skipped, so a masked inf/NaN
#   value is never read (the Python side copies strided rows, so every layout decodes).
# * decode loops prefetch DECODE_PF_BYTES ahead into L2 (decode was latency-bound at ~60 % of
#   the streaming read bandwidth without it).
# * float32 compute: the key pass (cyattn_dot_rows) and the value pass (cyattn_wsum_rows) are
#   C helpers in _cyattn_decode.h over all 1-4 query rows of the task at once: each key or
#   value row is loaded once for all of them, the dots' pairwise trees are taken in vector
#   registers, and the value accumulators stay in registers. Their arithmetic is that of the
#   Cython loops kept below for float64, operation for operation (the bits are the same but
#   for a dot's tail past the 32 lanes, now one fused multiply-add per product on FMA builds,
#   as every other product).
# * half-precision K/V (issue 19; float32 compute only): kv_fmt names the 16-bit format of K
#   and V (0: they are of the compute dtype); the C helpers widen each row in registers as
#   they load it, so the stream reads half the bytes and no float32 copy of K or V exists.
#   Non-finite rows are then not redone here: the call reports them (status 2) and the caller
#   redoes it on float32 inputs.

cdef inline floating dot_lanes(const floating* a, const floating* b, Py_ssize_t n) noexcept nogil:
    """sum_e a[e] * b[e] with LANES lane-wise partial sums combined pairwise (vectorised)."""
    cdef floating part[LANES]
    cdef floating tail = 0
    cdef Py_ssize_t j = 0, lane
    for lane in range(LANES):
        part[lane] = 0
    while j + LANES <= n:
        for lane in range(LANES):
            part[lane] += a[j + lane] * b[j + lane]
        j += LANES
    while j < n:
        tail += a[j] * b[j]
        j += 1
    return lanes_sum(part) + tail


cdef inline void dot4_lanes(const floating* a, const floating* b0, const floating* b1,
                            const floating* b2, const floating* b3, Py_ssize_t n,
                            floating* out) noexcept nogil:
    """out[i] = dot_lanes(a, b_i, n) for four rows b_i, computed together: the same operations
    in the same order per row (the same bits), as four independent chains (the decode key
    pass was bound by the latency of one row's chain)."""
    cdef floating p0[LANES]
    cdef floating p1[LANES]
    cdef floating p2[LANES]
    cdef floating p3[LANES]
    cdef floating t0 = 0, t1 = 0, t2 = 0, t3 = 0
    cdef Py_ssize_t j = 0, lane
    for lane in range(LANES):
        p0[lane] = 0
        p1[lane] = 0
        p2[lane] = 0
        p3[lane] = 0
    while j + LANES <= n:
        for lane in range(LANES):
            p0[lane] += a[j + lane] * b0[j + lane]
            p1[lane] += a[j + lane] * b1[j + lane]
            p2[lane] += a[j + lane] * b2[j + lane]
            p3[lane] += a[j + lane] * b3[j + lane]
        j += LANES
    while j < n:
        t0 += a[j] * b0[j]
        t1 += a[j] * b1[j]
        t2 += a[j] * b2[j]
        t3 += a[j] * b3[j]
        j += 1
    out[0] = lanes_sum(p0) + t0
    out[1] = lanes_sum(p1) + t1
    out[2] = lanes_sum(p2) + t2
    out[3] = lanes_sum(p3) + t3


cdef inline void axpy2(floating* acc, floating w0, const floating* v0, floating w1,
                       const floating* v1, Py_ssize_t n) noexcept nogil:
    """acc += w0 * v0, then acc += w1 * v1, element by element (the bits of the two updates
    one after the other, with acc read and written once)."""
    cdef Py_ssize_t e
    cdef floating x
    for e in range(n):
        x = acc[e] + w0 * v0[e]
        acc[e] = x + w1 * v1[e]


cdef void decode_chunk(const floating* q, Py_ssize_t q_rs,
                       const void* k, Py_ssize_t k_rs,
                       const void* v, Py_ssize_t v_rs, int kv_fmt,
                       const uint8_t* bmask, const floating* amask,
                       Py_ssize_t m_rs, Py_ssize_t m_cs,
                       Py_ssize_t L, Py_ssize_t j0, Py_ssize_t kb,
                       Py_ssize_t E, Py_ssize_t Ev, floating scale,
                       const RowLimits* lim,
                       floating* scores, floating* part) noexcept nogil:
    """Partial softmax state of all L query rows over keys j0 .. j0+kb (unit-stride rows).

    Writes part[r] = (max, sum, accumulator[Ev]) for r < L, stride Ev + 2. Each key row and
    value row is read once for all query rows; rows past the query length read nothing and
    leave an empty state (max -inf, sum 0). k and v hold elements of the compute dtype, or
    (float32 compute only) of the 16-bit format kv_fmt, which the C helpers widen as they
    load them.
    """
    cdef Py_ssize_t r, j, e, lo, hi
    cdef Py_ssize_t live = lim.lend if lim.lend < L else L
    cdef floating m, shift, total, w
    cdef floating floor_ = SHIFT_FLOOR_F32 if floating is float else SHIFT_FLOOR_F64
    cdef floating neg_inf = <floating>-CYATTN_INF
    cdef floating* row
    cdef floating* acc
    cdef const floating* k_row
    cdef const floating* v_row
    cdef Py_ssize_t pf
    cdef Py_ssize_t esz = 2 if kv_fmt != 0 else <Py_ssize_t>sizeof(floating)
    cdef Py_ssize_t row_bytes_k = E * esz
    cdef Py_ssize_t row_bytes_v = Ev * esz
    cdef const char* kc = <const char*>k
    cdef const char* vc = <const char*>v
    cdef const floating* k_rows[4]
    cdef const floating* v_held = NULL         # a value row waiting for a partner (axpy2)
    cdef floating w_held = 0
    cdef floating dots[4]
    cdef Py_ssize_t i, n4
    # Software prefetch (into L2) DECODE_PF_BYTES ahead within the chunk: without it the
    # per-key reduction keeps too few cache misses in flight and decode ran at ~60 % of the
    # streaming read bandwidth; with it ~85 %. The last rows of the key pass prefetch the
    # first value rows. Prefetches never fault, but stay inside the chunk anyway.
    pf = (DECODE_PF_BYTES // esz) // (E if E > 0 else 1) + 1
    n4 = kb - kb % 4 if live > 0 else 0
    j = 0
    if floating is float:
        if live >= 1:
            # float32 (and half K/V): all live rows at once (cyattn_dot_rows; the arithmetic
            # of dot4_lanes / dot_lanes below)
            cyattn_dot_rows(scores, kb, q, q_rs, live, kc + j0 * k_rs * esz, kb, k_rs, E, kv_fmt,
                            scale, vc + j0 * v_rs * esz, v_rs, Ev, DECODE_PF_BYTES)
            j = kb                              # the loops below have nothing left to do
            n4 = kb
    while j < n4:                               # four keys at a time (dot4_lanes)
        for i in range(4):
            if j + i + pf < kb:
                prefetch_row(kc + (j0 + j + i + pf) * k_rs * esz, row_bytes_k)
            elif j + i + pf - kb < kb:            # the first value rows, for the second pass
                prefetch_row(vc + (j0 + j + i + pf - kb) * v_rs * esz, row_bytes_v)
            k_rows[i] = <const floating*>k + (j0 + j + i) * k_rs
        for r in range(live):
            dot4_lanes(q + r * q_rs, k_rows[0], k_rows[1], k_rows[2], k_rows[3], E, dots)
            for i in range(4):
                scores[r * kb + j + i] = scale * dots[i]
        j += 4
    for j in range(n4, kb):
        if j + pf < kb:
            prefetch_row(kc + (j0 + j + pf) * k_rs * esz, row_bytes_k)
        elif j + pf - kb < kb:
            prefetch_row(vc + (j0 + j + pf - kb) * v_rs * esz, row_bytes_v)
        if live <= 0:
            continue
        k_row = <const floating*>k + (j0 + j) * k_rs
        for r in range(live):
            scores[r * kb + j] = scale * dot_lanes(q + r * q_rs, k_row, E)
    for r in range(live, L):
        row = scores + r * kb
        row_fill(row, kb, <floating>0)
        acc = part + r * (Ev + 2)
        acc[0] = neg_inf
        acc[1] = 0
        for e in range(Ev):
            acc[2 + e] = 0
    for r in range(live):
        row = scores + r * kb
        if lim.has_softcap or lim.has_slope:
            row_transform(row, kb, r, j0, lim)
        hi = row_hi(lim, r) - j0
        hi = 0 if hi < 0 else hi
        for j in range(hi, kb):
            row[j] = neg_inf
        lo = row_lo(lim, r) - j0
        lo = kb if lo > kb else lo
        for j in range(lo):
            row[j] = neg_inf
        if bmask != NULL or amask != NULL:
            row_mask_inplace(row, kb,
                             bmask + r * m_rs + j0 * m_cs if bmask != NULL else NULL, m_cs,
                             amask + r * m_rs + j0 * m_cs if amask != NULL else NULL, m_cs)
        m = row_max(row, kb)
        shift = m if m > floor_ else floor_
        total = row_exp_sum(row, kb, shift, True)
        acc = part + r * (Ev + 2)
        acc[0] = m
        acc[1] = total
        for e in range(Ev):
            acc[2 + e] = 0
    pf = (DECODE_PF_BYTES // esz) // (Ev if Ev > 0 else 1) + 1
    if floating is float:
        if live >= 1:
            # float32: blocks of the accumulators stay in registers over the chunk's value
            # rows, each value block loaded once for all live rows (cyattn_wsum_rows; the bits
            # of the row-by-row loops below)
            cyattn_wsum_rows(part + 2, Ev + 2, scores, kb, live, vc + j0 * v_rs * esz, kb, v_rs,
                             Ev, kv_fmt, DECODE_PF_BYTES)
            return
    if live == 1:
        # one query row: the value rows of nonzero weight in pairs (axpy2), in key order
        acc = part + 2
        for j in range(kb):
            if j + pf < kb:
                prefetch_row(vc + (j0 + j + pf) * v_rs * esz, row_bytes_v)
            w = scores[j]
            if w == 0:      # adds nothing, and a masked key's inf/NaN value is never read
                continue
            if v_held == NULL:
                v_held = <const floating*>v + (j0 + j) * v_rs
                w_held = w
                continue
            v_row = <const floating*>v + (j0 + j) * v_rs
            axpy2(acc, w_held, v_held, w, v_row, Ev)
            v_held = NULL
        if v_held != NULL:
            for e in range(Ev):
                acc[e] += w_held * v_held[e]
        return
    for j in range(kb):
        if j + pf < kb:
            prefetch_row(vc + (j0 + j + pf) * v_rs * esz, row_bytes_v)
        v_row = NULL
        for r in range(live):
            w = scores[r * kb + j]
            if w == 0:      # adds nothing, and a masked key's inf/NaN value is never read
                continue
            if v_row == NULL:
                v_row = <const floating*>v + (j0 + j) * v_rs
            acc = part + r * (Ev + 2) + 2
            for e in range(Ev):
                acc[e] += w * v_row[e]


cdef void decode_merge(const floating* part, Py_ssize_t chunks, Py_ssize_t L, Py_ssize_t Ev,
                       floating* out, Py_ssize_t o_rs, floating* lse,
                       const RowLimits* lim) noexcept nogil:
    """Combine the chunks' partial states of one batch entry in chunk order into out and lse
    (the sink merged in; rows past the query length: output 0, lse -inf)."""
    cdef Py_ssize_t r, c, e
    cdef floating m, shift, w, total, f, l2, m2
    cdef floating floor_ = SHIFT_FLOOR_F32 if floating is float else SHIFT_FLOOR_F64
    cdef const floating* pc
    cdef floating* o_row
    for r in range(L):
        m = <floating>-CYATTN_INF
        for c in range(chunks):
            pc = part + (c * L + r) * (Ev + 2)
            m = pc[0] if pc[0] > m else m
        shift = m if m > floor_ else floor_
        o_row = out + r * o_rs
        for e in range(Ev):
            o_row[e] = 0
        total = 0
        for c in range(chunks):
            pc = part + (c * L + r) * (Ev + 2)
            w = exp_any(pc[0] - shift)            # 0 for a chunk with no permitted key
            total = total + pc[1] * w
            for e in range(Ev):
                o_row[e] = o_row[e] + pc[2 + e] * w
        if r >= lim.lend:                         # past the query length
            total = 0
            l2 = 0
        else:
            sink_merge(lim, m, total, &f, &l2, &m2)
        if l2 == 0:                               # fully masked: output 0, lse -inf
            for e in range(Ev):
                o_row[e] = 0
            lse[r] = <floating>-CYATTN_INF
            continue
        w = f / l2
        for e in range(Ev):
            o_row[e] = o_row[e] * w
        lse[r] = m2 + <floating>log(l2)


cdef void decode_key_range(const RowLimits* lim, Py_ssize_t L, Py_ssize_t* ka,
                           Py_ssize_t* kz) noexcept nogil:
    """The keys any row of a batch entry may see: ka .. kz (kz <= ka: none)."""
    cdef Py_ssize_t live = lim.lend if lim.lend < L else L
    if live <= 0:
        ka[0] = 0
        kz[0] = 0
        return
    ka[0] = row_lo(lim, 0)
    kz[0] = row_hi(lim, live - 1)


cdef void decode_task(const floating* q, const int64_t* q_off, Py_ssize_t q_rs,
                      const void* k, const int64_t* k_off, Py_ssize_t k_rs,
                      const void* v, const int64_t* v_off, Py_ssize_t v_rs, int kv_fmt,
                      const uint8_t* bmask, const floating* amask,
                      const int64_t* m_off, Py_ssize_t m_rs, Py_ssize_t m_cs,
                      Py_ssize_t L, Py_ssize_t S, Py_ssize_t E, Py_ssize_t Ev, floating scale,
                      const AttnVariant* var, Py_ssize_t bi, Py_ssize_t c,
                      floating* scores, floating* part) noexcept nogil:
    """Task (batch entry bi, chunk c): its partial states, over the keys of the chunk that
    some row of the entry may see (an empty state when none does)."""
    cdef RowLimits lim
    cdef Py_ssize_t ka, kz, j0, j1, r, e, mo
    cdef Py_ssize_t esz = 2 if kv_fmt != 0 else <Py_ssize_t>sizeof(floating)
    cdef floating* acc
    row_limits(var, bi, L, S, &lim)
    decode_key_range(&lim, L, &ka, &kz)
    j0 = c * DECODE_CHUNK
    j0 = ka if ka > j0 else j0
    j1 = (c + 1) * DECODE_CHUNK
    j1 = kz if kz < j1 else j1
    if j1 <= j0:
        for r in range(L):
            acc = part + r * (Ev + 2)
            acc[0] = <floating>-CYATTN_INF
            acc[1] = 0
            for e in range(Ev):
                acc[2 + e] = 0
        return
    mo = m_off[bi] if m_off != NULL else 0
    decode_chunk(q + q_off[bi], q_rs, <const char*>k + k_off[bi] * esz, k_rs,
                 <const char*>v + v_off[bi] * esz, v_rs, kv_fmt,
                 bmask + mo if bmask != NULL else NULL,
                 amask + mo if amask != NULL else NULL, m_rs, m_cs,
                 L, j0, j1 - j0, E, Ev, scale, &lim, scores, part)


cdef int decode_finish(const floating* q, const int64_t* q_off, Py_ssize_t q_rs,
                       const void* k, const int64_t* k_off, Py_ssize_t k_rs,
                       const void* v, const int64_t* v_off, Py_ssize_t v_rs, int kv_fmt,
                       const uint8_t* bmask, const floating* amask,
                       const int64_t* m_off, Py_ssize_t m_rs, Py_ssize_t m_cs,
                       floating* out, const int64_t* o_off, Py_ssize_t o_rs, floating* lse,
                       Py_ssize_t bi,
                       Py_ssize_t L, Py_ssize_t S, Py_ssize_t E, Py_ssize_t Ev, floating scale,
                       const AttnVariant* var, const floating* parts,
                       Py_ssize_t chunks) noexcept nogil:
    """Merge batch entry bi's partial states and redo its non-finite rows; 1 if out of
    memory. With half-precision K/V (kv_fmt != 0) non-finite rows are not redone: 2 if there
    is one (the caller then redoes the call on float32 inputs), else 0."""
    cdef RowLimits lim
    cdef Py_ssize_t mo = m_off[bi] if m_off != NULL else 0
    cdef Py_ssize_t r
    cdef Py_ssize_t ob = o_off[bi] if o_off != NULL else bi * L * o_rs
    row_limits(var, bi, L, S, &lim)
    decode_merge(parts, chunks, L, Ev, out + ob, o_rs, lse + bi * L, &lim)
    if kv_fmt != 0:
        for r in range(L):
            if row_nonfinite(out + ob + r * o_rs, lse[bi * L + r], Ev):
                return 2
        return 0
    return redo_nonfinite_rows(q + q_off[bi], q_rs, 1, <const floating*>k + k_off[bi], k_rs, 1,
                               <const floating*>v + v_off[bi], v_rs, 1,
                               bmask + mo if bmask != NULL else NULL,
                               amask + mo if amask != NULL else NULL, m_rs, m_cs,
                               out + ob, o_rs, lse + bi * L,
                               0, L, S, E, Ev, scale, &lim)


cdef void decode_attention(const floating* q, const int64_t* q_off, Py_ssize_t q_rs,
                           const void* k, const int64_t* k_off, Py_ssize_t k_rs,
                           const void* v, const int64_t* v_off, Py_ssize_t v_rs, int kv_fmt,
                           const uint8_t* bmask, const floating* amask,
                           const int64_t* m_off, Py_ssize_t m_rs, Py_ssize_t m_cs,
                           floating* out, const int64_t* o_off, Py_ssize_t o_rs, floating* lse,
                           Py_ssize_t batch, Py_ssize_t L, Py_ssize_t S, Py_ssize_t E,
                           Py_ssize_t Ev, floating scale, const AttnVariant* var,
                           int n_threads, int* status, int* half_redo) noexcept nogil:
    """Attention for a few query rows against many keys (decode with a KV cache).

    S is split into chunks of DECODE_CHUNK keys, a number that does not depend on the thread
    count. Tasks (batch entry, chunk) run in parallel, each streaming its keys and values
    once and leaving a partial (max, sum, accumulator) per query row; the partials are then
    merged per batch entry in chunk order, so results are bit-identical for any thread count.
    Only the chunks that hold keys some row may see (row limits: causal, window, lengths) are
    visited, and within a chunk only those keys. Rows whose result is not finite are redone by
    the two-pass path (with half-precision K/V: half_redo is set to 1 instead, see
    decode_finish).
    """
    cdef Py_ssize_t c_beg = -1, c_end = 0, ka, kz
    cdef Py_ssize_t chunks, ntasks
    cdef Py_ssize_t stride = L * (Ev + 2)
    cdef Py_ssize_t t, bi
    cdef RowLimits lim
    cdef floating* parts
    cdef floating* scores
    cdef void* raw
    cdef int done
    for bi in range(batch):                       # chunks some batch entry needs
        row_limits(var, bi, L, S, &lim)
        decode_key_range(&lim, L, &ka, &kz)
        if kz > ka:
            if c_beg < 0 or ka // DECODE_CHUNK < c_beg:
                c_beg = ka // DECODE_CHUNK
            if (kz + DECODE_CHUNK - 1) // DECODE_CHUNK > c_end:
                c_end = (kz + DECODE_CHUNK - 1) // DECODE_CHUNK
    if c_beg < 0:
        c_beg = 0
    chunks = c_end - c_beg
    ntasks = batch * chunks
    parts = <floating*>malloc(<size_t>((ntasks if ntasks > 0 else 1) * stride + 1)
                              * sizeof(floating))
    if parts == NULL:
        status[0] = 1
        return
    if ntasks > 0:
        with parallel(num_threads=n_threads):
            raw = malloc(<size_t>(L * DECODE_CHUNK) * sizeof(floating) + ALIGN)
            scores = NULL
            if raw == NULL:
                status[0] = 1
            else:
                scores = <floating*>align_ptr(raw)
            for t in prange(ntasks, schedule='static'):
                if raw != NULL:
                    decode_task(q, q_off, q_rs, k, k_off, k_rs, v, v_off, v_rs, kv_fmt,
                                bmask, amask, m_off, m_rs, m_cs, L, S, E, Ev, scale, var,
                                t // chunks, c_beg + t % chunks, scores, parts + t * stride)
            free(raw)
    if status[0]:
        free(parts)
        return
    for bi in prange(batch, num_threads=n_threads, schedule='static'):
        done = decode_finish(q, q_off, q_rs, k, k_off, k_rs, v, v_off, v_rs, kv_fmt, bmask,
                             amask, m_off, m_rs, m_cs, out, o_off, o_rs, lse, bi, L, S, E, Ev,
                             scale, var,
                             parts + bi * chunks * stride, chunks)
        if done == 1:
            status[0] = 1
        elif done == 2:
            half_redo[0] = 1
    free(parts)
