# Decode: attention for a few query rows (a KV-cache step), a stream over K and V.
#
# Design
# ------
# * decode (L <= DECODE_MAX_L unit-stride rows, unless the whole problem is tiny): tasks
#   (batch entry, chunk of DECODE_CHUNK keys) stream their keys and values once and leave
#   (max, sum, accumulator) per row; the partials are merged in chunk order. The chunking is
#   fixed, so results do not depend on threads. Zero weights are skipped, so a masked inf/NaN
#   value is never read (the Python side copies strided rows, so every layout decodes).
# * decode loops prefetch DECODE_PF_BYTES ahead into L2 (decode was latency-bound at ~60 % of
#   the streaming read bandwidth without it).

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


cdef inline void prefetch_row(const void* row, Py_ssize_t nbytes) noexcept nogil:
    """Prefetch (into L2) each 64-byte line of row[0:nbytes]."""
    cdef Py_ssize_t off = 0
    while off < nbytes:
        cyattn_prefetch_r(<const char*>row + off)
        off += 64


cdef void decode_chunk(const floating* q, Py_ssize_t q_rs,
                       const floating* k, Py_ssize_t k_rs,
                       const floating* v, Py_ssize_t v_rs,
                       const uint8_t* bmask, const floating* amask,
                       Py_ssize_t m_rs, Py_ssize_t m_cs,
                       Py_ssize_t L, Py_ssize_t j0, Py_ssize_t kb,
                       Py_ssize_t E, Py_ssize_t Ev, floating scale,
                       bint causal, Py_ssize_t causal_off,
                       floating* scores, floating* part) noexcept nogil:
    """Partial softmax state of all L query rows over keys j0 .. j0+kb (unit-stride rows).

    Writes part[r] = (max, sum, accumulator[Ev]) for r < L, stride Ev + 2. Each key row and
    value row is read once for all query rows.
    """
    cdef Py_ssize_t r, j, e, lim
    cdef floating m, shift, total, w
    cdef floating floor_ = SHIFT_FLOOR_F32 if floating is float else SHIFT_FLOOR_F64
    cdef floating neg_inf = <floating>-CYATTN_INF
    cdef floating* row
    cdef floating* acc
    cdef const floating* k_row
    cdef const floating* v_row
    cdef Py_ssize_t pf
    cdef Py_ssize_t row_bytes_k = E * <Py_ssize_t>sizeof(floating)
    cdef Py_ssize_t row_bytes_v = Ev * <Py_ssize_t>sizeof(floating)
    # Software prefetch (into L2) DECODE_PF_BYTES ahead within the chunk: without it the
    # per-key reduction keeps too few cache misses in flight and decode ran at ~60 % of the
    # streaming read bandwidth; with it ~85 %. The last rows of the key pass prefetch the
    # first value rows. Prefetches never fault, but stay inside the chunk anyway.
    pf = (DECODE_PF_BYTES // <Py_ssize_t>sizeof(floating)) // (E if E > 0 else 1) + 1
    for j in range(kb):
        k_row = k + (j0 + j) * k_rs
        if j + pf < kb:
            prefetch_row(k_row + pf * k_rs, row_bytes_k)
        elif j + pf - kb < kb:                    # the first value rows, for the second pass
            prefetch_row(v + (j0 + j + pf - kb) * v_rs, row_bytes_v)
        for r in range(L):
            scores[r * kb + j] = scale * dot_lanes(q + r * q_rs, k_row, E)
    for r in range(L):
        row = scores + r * kb
        if causal:
            lim = r + causal_off + 1 - j0
            lim = 0 if lim < 0 else lim
            for j in range(lim, kb):
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
    pf = (DECODE_PF_BYTES // <Py_ssize_t>sizeof(floating)) // (Ev if Ev > 0 else 1) + 1
    for j in range(kb):
        v_row = v + (j0 + j) * v_rs
        if j + pf < kb:
            prefetch_row(v_row + pf * v_rs, row_bytes_v)
        for r in range(L):
            w = scores[r * kb + j]
            if w == 0:      # adds nothing, and a masked key's inf/NaN value is never read
                continue
            acc = part + r * (Ev + 2) + 2
            for e in range(Ev):
                acc[e] += w * v_row[e]


cdef void decode_merge(const floating* part, Py_ssize_t chunks, Py_ssize_t L, Py_ssize_t Ev,
                       floating* out, floating* lse) noexcept nogil:
    """Combine the chunks' partial states of one batch entry in chunk order into out and lse."""
    cdef Py_ssize_t r, c, e
    cdef floating m, shift, w, total
    cdef floating floor_ = SHIFT_FLOOR_F32 if floating is float else SHIFT_FLOOR_F64
    cdef const floating* pc
    cdef floating* o_row
    for r in range(L):
        m = <floating>-CYATTN_INF
        for c in range(chunks):
            pc = part + (c * L + r) * (Ev + 2)
            m = pc[0] if pc[0] > m else m
        shift = m if m > floor_ else floor_
        o_row = out + r * Ev
        for e in range(Ev):
            o_row[e] = 0
        total = 0
        for c in range(chunks):
            pc = part + (c * L + r) * (Ev + 2)
            w = exp_any(pc[0] - shift)            # 0 for a chunk with no permitted key
            total = total + pc[1] * w
            for e in range(Ev):
                o_row[e] = o_row[e] + pc[2 + e] * w
        if total == 0:                            # fully masked: output 0, lse -inf
            for e in range(Ev):
                o_row[e] = 0
            lse[r] = <floating>-CYATTN_INF
            continue
        w = <floating>1 / total
        for e in range(Ev):
            o_row[e] = o_row[e] * w
        lse[r] = m + <floating>log(total)


cdef void decode_attention(const floating* q, const int64_t* q_off, Py_ssize_t q_rs,
                                const floating* k, const int64_t* k_off, Py_ssize_t k_rs,
                                const floating* v, const int64_t* v_off, Py_ssize_t v_rs,
                                const uint8_t* bmask, const floating* amask,
                                const int64_t* m_off, Py_ssize_t m_rs, Py_ssize_t m_cs,
                                floating* out, floating* lse,
                                Py_ssize_t batch, Py_ssize_t L, Py_ssize_t S, Py_ssize_t E,
                                Py_ssize_t Ev, floating scale, bint causal,
                                Py_ssize_t causal_off, int n_threads, int* status) noexcept nogil:
    """Attention for a few query rows against many keys (decode with a KV cache).

    S is split into chunks of DECODE_CHUNK keys, a number that does not depend on the thread
    count. Tasks (batch entry, chunk) run in parallel, each streaming its keys and values
    once and leaving a partial (max, sum, accumulator) per query row; the partials are then
    merged per batch entry in chunk order, so results are bit-identical for any thread count.
    Rows whose result is not finite are redone by the two-pass path.
    """
    cdef Py_ssize_t s_used = S
    cdef Py_ssize_t chunks, ntasks
    if causal:                                    # keys past the last row's limit are unused
        s_used = L + causal_off
        s_used = S if s_used > S else (0 if s_used < 0 else s_used)
    chunks = (s_used + DECODE_CHUNK - 1) // DECODE_CHUNK
    ntasks = batch * chunks
    cdef Py_ssize_t stride = L * (Ev + 2)
    cdef Py_ssize_t t, bi, c, j0, kb, mo
    cdef floating* parts
    cdef floating* scores
    cdef void* raw
    if ntasks <= 0:                               # no key is visible: fully masked rows
        for t in range(batch * L):
            lse[t] = <floating>-CYATTN_INF
        memset(out, 0, <size_t>(batch * L * Ev) * sizeof(floating))
        return
    parts = <floating*>malloc(<size_t>(ntasks * stride) * sizeof(floating))
    if parts == NULL:
        status[0] = 1
        return
    with parallel(num_threads=n_threads):
        raw = malloc(<size_t>(L * DECODE_CHUNK) * sizeof(floating) + ALIGN)
        scores = NULL
        if raw == NULL:
            status[0] = 1
        else:
            scores = <floating*>align_ptr(raw)
        for t in prange(ntasks, schedule='static'):
            if raw != NULL:
                bi = t // chunks
                c = t % chunks
                j0 = c * DECODE_CHUNK
                kb = s_used - j0 if s_used - j0 < DECODE_CHUNK else DECODE_CHUNK
                mo = m_off[bi] if m_off != NULL else 0
                decode_chunk(q + q_off[bi], q_rs, k + k_off[bi], k_rs, v + v_off[bi], v_rs,
                             bmask + mo if bmask != NULL else NULL,
                             amask + mo if amask != NULL else NULL, m_rs, m_cs,
                             L, j0, kb, E, Ev, scale, causal, causal_off,
                             scores, parts + t * stride)
        free(raw)
    if status[0]:
        free(parts)
        return
    for bi in prange(batch, num_threads=n_threads, schedule='static'):
        decode_merge(parts + bi * chunks * stride, chunks, L, Ev,
                     out + bi * L * Ev, lse + bi * L)
        mo = m_off[bi] if m_off != NULL else 0
        if redo_nonfinite_rows(q + q_off[bi], q_rs, 1, k + k_off[bi], k_rs, 1,
                               v + v_off[bi], v_rs, 1,
                               bmask + mo if bmask != NULL else NULL,
                               amask + mo if amask != NULL else NULL, m_rs, m_cs,
                               out + bi * L * Ev, lse + bi * L,
                               0, L, S, E, Ev, scale, causal, causal_off):
            status[0] = 1
    free(parts)
