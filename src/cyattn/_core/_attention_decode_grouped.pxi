# Grouped decode (issue 39): the query heads that share a K/V head run as rows of one task.
#
# Design
# ------
# * Which path: decode_dispatch looks at the batch entries' K and V offsets. Runs of g
#   consecutive entries with the same K and V matrix (query heads of one GQA group, or any K/V
#   broadcast over heads) form a group; with g > 1, or with more than DECODE_UNGROUPED_MAX_L
#   query rows, the grouped path below runs, else decode_attention (_attention_decode.pxi) as
#   before. The choice depends on shapes and offsets only, never on the thread count. More
#   than DECODE_UNGROUPED_MAX_L rows decode only against S >= 16 L keys (decode_rows_fit).
# * Tasks are (group, block of heads, chunk of keys). A task's rows are the L query rows of
#   each of its heads (at most GDECODE_MAX_ROWS: a group of more rows is split into blocks of
#   whole heads), packed into a per-thread buffer, and each key row and value row of the chunk
#   is loaded from memory once for all of them: the key pass and the value pass walk the
#   chunk in blocks of GDECODE_WIDEN rows (16 KiB of float32 at E = 128, in L1), 16-bit rows
#   widened to float32 into a per-thread block first (once, not once per query row), with
#   software prefetch DECODE_PF_BYTES ahead as in decode_chunk. The float32 passes are the C
#   helpers of _cyattn_decode_rows.h (cyattn_gdot_f32: two rows x four keys per step;
#   cyattn_gwsum_f32: three rows x 128 accumulator elements in registers), which give the
#   bits of cyattn_dot_rows / cyattn_wsum_rows; float64 uses the Cython loops.
# * Each row keeps its own head's limits (causal, window, lengths), mask, softcap, ALiBi
#   slope and sink: the keys of a chunk visited are the union of the rows' ranges, and each
#   row removes the keys it may not see as decode_chunk does. Every row's arithmetic is that
#   of decode_chunk (the same dots, softmax passes and value updates in key order), so with
#   the same chunks a grouped call gives the bits of the per-head calls.
# * The KV split: the keys are cut into chunks of GDECODE_CHUNK keys, halved (down to
#   GDECODE_MIN_CHUNK) while the call has fewer than GDECODE_MIN_TASKS tasks, so that a
#   decode step with few groups (batch x KV heads) still gives 16-64 threads several tasks
#   each. The chunking depends on the shape only, and the partials are merged per query head
#   in chunk order (decode_finish), so results are bit-identical for any thread count.
# * No copy of K or V is made: the per-thread scratch is the packed query rows, their scores
#   over one chunk and their accumulators (O(rows x (E + chunk + Ev))), the partials
#   O(batch x chunks x L x Ev).
# * 8-bit K/V (kv_fmt CYATTN_KV8_I8 / CYATTN_KV8_E4M3, _cyattn_kv8.h; float32 compute): every
#   8-bit call takes this path (decode_dispatch), its rows widened into the L1 block as the
#   16-bit ones are (int8 on AVX-512: in registers, _cyattn_decode_rows.h), without their
#   scales: a key's scale multiplies the key's scores after the key pass
#   (scale * s_k[j] * dot(q, k8_j)), a value's scale the key's weights after the softmax sums
#   (w_j * s_v[j]), so the element loops only convert. The scales of batch entry
#   bi are read at var.k_scale / var.v_scale (per row's head, so heads that share K and V but
#   not scales are right too).

cdef extern from "_cyattn_decode_rows.h":
    ctypedef struct cyattn_pf_stream:
        const void* k
        Py_ssize_t ks, rows, n
        const void* v
        Py_ssize_t vs, nv, esz, start
    void cyattn_pf_step(const cyattn_pf_stream* pf, Py_ssize_t j) noexcept nogil
    void cyattn_gdot_f32(float* scores, Py_ssize_t ss, const float* q, Py_ssize_t qs,
                         Py_ssize_t nq,
                         const float* k, Py_ssize_t rows, Py_ssize_t ks, Py_ssize_t n,
                         float scale, const cyattn_pf_stream* pf) noexcept nogil
    void cyattn_gwsum_f32(float* acc, Py_ssize_t acc_stride, const float* w, Py_ssize_t ws,
                          Py_ssize_t nq, const float* v, Py_ssize_t rows, Py_ssize_t vs,
                          Py_ssize_t n, const cyattn_pf_stream* pf) noexcept nogil
    int CYATTN_KV8_IN_REGISTERS
    void cyattn_gdot_i8(float* scores, Py_ssize_t ss, const float* q, Py_ssize_t qs,
                        Py_ssize_t nq, const signed char* k, Py_ssize_t rows, Py_ssize_t ks,
                        Py_ssize_t n, float scale, float* kvbuf) noexcept nogil
    void cyattn_gwsum_i8(float* acc, Py_ssize_t acc_stride, const float* w, Py_ssize_t ws,
                         Py_ssize_t nq, const signed char* v, Py_ssize_t rows, Py_ssize_t vs,
                         Py_ssize_t n) noexcept nogil


cdef extern from "_cyattn_kv8.h":
    int CYATTN_KV8_I8
    int CYATTN_KV8_E4M3
    void cyattn_kv8_to_float(const uint8_t* src, float* dst, Py_ssize_t n, int fmt) noexcept nogil


cdef enum:
    DECODE_UNGROUPED_MAX_L = 4   # g = 1 with at most this many rows: decode_attention
    GDECODE_KEYS_PER_ROW = 16    # more than 4 rows decode against at least 16 keys per row
    GDECODE_MAX_ROWS = 64        # query rows (heads x L) per grouped task
    GDECODE_CHUNK = 512          # keys per grouped task ...
    GDECODE_MIN_CHUNK = 128      # ... halved down to this while there are fewer tasks than
    GDECODE_MIN_TASKS = 256      # this (enough for 64 threads at 4 tasks each)
    GDECODE_WIDEN = 32           # 16-bit K/V rows widened to float32 at a time (in L1)


cdef inline bint decode_rows_fit(Py_ssize_t L, Py_ssize_t S) noexcept nogil:
    """Whether L query rows per head may take the decode path against S keys (the caller
    also checks DECODE_MAX_L and the work): more than DECODE_UNGROUPED_MAX_L rows only
    against at least GDECODE_KEYS_PER_ROW keys per row, i.e. a KV cache. A self-attention of
    a few rows (a short text in cyattn.encoder, alone or padded in a batch) stays on the
    fused path, so its bits do not depend on the batch it is in."""
    return L <= DECODE_UNGROUPED_MAX_L or S >= L * GDECODE_KEYS_PER_ROW


cdef inline void scale_row(floating* row, Py_ssize_t n, const float* sc,
                           Py_ssize_t rs) noexcept nogil:
    """row[j] *= sc[j * rs] (8-bit K/V scales: rs 0 for a per-head or per-tensor scale, 1
    for per-token ones in C order; the two common strides as loops gcc vectorises)."""
    cdef Py_ssize_t j
    cdef floating c
    if rs == 0:
        c = sc[0]
        for j in range(n):
            row[j] = row[j] * c
    elif rs == 1:
        for j in range(n):
            row[j] = row[j] * sc[j]
    else:
        for j in range(n):
            row[j] = row[j] * sc[j * rs]


cdef Py_ssize_t decode_group_size(const int64_t* k_off, const int64_t* v_off,
                                  Py_ssize_t batch) noexcept nogil:
    """g such that each run of g consecutive batch entries (g dividing batch) reads one K and
    one V matrix (the same offsets); 1 if there is no such run longer than 1."""
    cdef Py_ssize_t g = 1, bi
    if k_off == NULL or v_off == NULL or batch < 2:
        return 1
    while g < batch and k_off[g] == k_off[0] and v_off[g] == v_off[0]:
        g += 1
    if g == 1 or batch % g:
        return 1
    for bi in range(batch):
        if k_off[bi] != k_off[bi - bi % g] or v_off[bi] != v_off[bi - bi % g]:
            return 1
    return g


cdef void gdecode_empty(floating* part, Py_ssize_t Ev) noexcept nogil:
    """An empty partial state: max -inf, sum 0, accumulator 0."""
    cdef Py_ssize_t e
    part[0] = <floating>-CYATTN_INF
    part[1] = 0
    for e in range(Ev):
        part[2 + e] = 0


cdef void gdecode_task(const floating* q, const int64_t* q_off, Py_ssize_t q_rs,
                       const void* k, const int64_t* k_off, Py_ssize_t k_rs,
                       const void* v, const int64_t* v_off, Py_ssize_t v_rs, int kv_fmt,
                       const uint8_t* bmask, const floating* amask,
                       const int64_t* m_off, Py_ssize_t m_rs, Py_ssize_t m_cs,
                       Py_ssize_t L, Py_ssize_t S, Py_ssize_t E, Py_ssize_t Ev, floating scale,
                       const AttnVariant* var, Py_ssize_t b0, Py_ssize_t nh,
                       Py_ssize_t j0, Py_ssize_t j1, Py_ssize_t cix, Py_ssize_t chunks,
                       floating* qbuf, floating* scores, floating* accs, float* kvbuf,
                       floating* parts) noexcept nogil:
    """Task: heads b0 .. b0+nh-1 (batch entries of one K/V matrix), keys j0 .. j1.

    Leaves the partial state of row r of head b (max, sum, accumulator[Ev]) at
    parts + ((b * chunks + cix) * L + r) * (Ev + 2), as decode_task does for (b, cix).
    """
    cdef RowLimits lims[GDECODE_MAX_ROWS]
    cdef Py_ssize_t row_head[GDECODE_MAX_ROWS]   # packed row -> head index (0 .. nh-1)
    cdef Py_ssize_t row_q[GDECODE_MAX_ROWS]      # packed row -> query row
    cdef Py_ssize_t h, r, p, n, j, e, lo, hi, ka = -1, kz = 0, kb, mo, live, nq, jb, nb, pf
    cdef bint kv8 = kv_fmt >= CYATTN_KV8_I8
    cdef Py_ssize_t esz = (1 if kv8 else 2) if kv_fmt != 0 else <Py_ssize_t>sizeof(floating)
    cdef floating floor_ = SHIFT_FLOOR_F32 if floating is float else SHIFT_FLOOR_F64
    cdef floating neg_inf = <floating>-CYATTN_INF
    cdef floating m, shift, total, w
    cdef const float* sc_row
    cdef Py_ssize_t sc_rs
    cdef floating* row
    cdef floating* acc
    cdef floating* part
    cdef const floating* q_row
    cdef const floating* k_row
    cdef const floating* v_row
    cdef const char* kc
    cdef const char* vc
    cdef const floating* k_rows[4]
    cdef floating dots[4]
    cdef Py_ssize_t stride = L * (Ev + 2)
    cdef cyattn_pf_stream pfs
    # the rows that may see a key of this chunk, packed; the others get an empty state
    n = 0
    for h in range(nh):
        row_limits(var, b0 + h, L, S, &lims[h])
        live = lims[h].lend if lims[h].lend < L else L
        for r in range(L):
            part = parts + ((b0 + h) * chunks + cix) * stride + r * (Ev + 2)
            gdecode_empty(part, Ev)
            if r >= live:
                continue
            lo = row_lo(&lims[h], r)
            hi = row_hi(&lims[h], r)
            lo = j0 if j0 > lo else lo
            hi = j1 if j1 < hi else hi
            if hi <= lo:
                continue
            if ka < 0 or lo < ka:
                ka = lo
            if hi > kz:
                kz = hi
            row_head[n] = h
            row_q[n] = r
            q_row = q + q_off[b0 + h] + r * q_rs
            for e in range(E):
                qbuf[n * E + e] = q_row[e]
            n += 1
    if n == 0:
        return
    kb = kz - ka
    kc = <const char*>k + (k_off[b0] + ka * k_rs) * esz
    vc = <const char*>v + (v_off[b0] + ka * v_rs) * esz
    # key pass: scores[p * kb + j] = scale * q_p . k_{ka + j}
    if floating is float:
        # blocks of GDECODE_WIDEN keys (16-bit ones widened into L1 first, once for all the
        # rows), prefetching DECODE_PF_BYTES ahead (then the first value rows) as they go
        pfs.k = kc
        pfs.ks = k_rs
        pfs.rows = kb
        pfs.n = E
        pfs.v = vc
        pfs.vs = v_rs
        pfs.nv = Ev
        pfs.esz = esz
        pf = (DECODE_PF_BYTES // esz) // (E if E > 0 else 1) + 1
        if kv_fmt != 0 and pf < GDECODE_WIDEN:
            pf = GDECODE_WIDEN      # a block is widened at once: prefetch the next whole block
        jb = 0
        while jb < kb:
            nb = kb - jb if kb - jb < GDECODE_WIDEN else GDECODE_WIDEN
            pfs.start = jb + pf
            if kv_fmt == CYATTN_KV8_I8 and CYATTN_KV8_IN_REGISTERS:
                for j in range(nb):             # int8 widened in registers (same bits)
                    cyattn_pf_step(&pfs, j)
                cyattn_gdot_i8(scores + jb, kb, qbuf, E, n,
                               <const signed char*>kc + jb * k_rs, nb, k_rs, E, scale, kvbuf)
            elif kv8:
                for j in range(nb):
                    cyattn_pf_step(&pfs, j)
                    cyattn_kv8_to_float(<const uint8_t*>kc + (jb + j) * k_rs, kvbuf + j * E,
                                        E, kv_fmt)
                cyattn_gdot_f32(scores + jb, kb, qbuf, E, n, kvbuf, nb, E, E, scale, NULL)
            elif kv_fmt != 0:
                for j in range(nb):
                    cyattn_pf_step(&pfs, j)
                    cyattn_half_to_float(<const uint16_t*>kc + (jb + j) * k_rs, kvbuf + j * E,
                                         E, kv_fmt)
                cyattn_gdot_f32(scores + jb, kb, qbuf, E, n, kvbuf, nb, E, E, scale, NULL)
            else:
                cyattn_gdot_f32(scores + jb, kb, qbuf, E, n, <const float*>kc + jb * k_rs,
                                nb, k_rs, E, scale, &pfs)
            jb += nb
    else:
        j = 0
        while j + 4 <= kb:
            for e in range(4):
                if j + e + 8 < kb:
                    prefetch_row(kc + (j + e + 8) * k_rs * esz, E * esz)
                k_rows[e] = <const floating*>kc + (j + e) * k_rs
            for p in range(n):
                dot4_lanes(qbuf + p * E, k_rows[0], k_rows[1], k_rows[2], k_rows[3], E, dots)
                for e in range(4):
                    scores[p * kb + j + e] = scale * dots[e]
            j += 4
        while j < kb:
            k_row = <const floating*>kc + j * k_rs
            for p in range(n):
                scores[p * kb + j] = scale * dot_lanes(qbuf + p * E, k_row, E)
            j += 1
    # each row: transforms, its own key limits and masks, max and exp-sum (as decode_chunk)
    for p in range(n):
        h = row_head[p]
        r = row_q[p]
        row = scores + p * kb
        if kv8 and var.k_scale != NULL:           # scale * s_k[j] * dot(q, k8_j)
            sc_row = var.k_scale + var.k_scale_off[b0 + h] + ka * var.k_scale_rs
            sc_rs = var.k_scale_rs
            scale_row(row, kb, sc_row, sc_rs)
        if lims[h].has_softcap or lims[h].has_slope:
            row_transform(row, kb, r, ka, &lims[h])
        hi = row_hi(&lims[h], r) - ka
        hi = 0 if hi < 0 else hi
        for j in range(hi, kb):
            row[j] = neg_inf
        lo = row_lo(&lims[h], r) - ka
        lo = kb if lo > kb else lo
        for j in range(lo):
            row[j] = neg_inf
        if bmask != NULL or amask != NULL:
            mo = (m_off[b0 + h] if m_off != NULL else 0) + r * m_rs + ka * m_cs
            row_mask_inplace(row, kb, bmask + mo if bmask != NULL else NULL, m_cs,
                             amask + mo if amask != NULL else NULL, m_cs)
        m = row_max(row, kb)
        shift = m if m > floor_ else floor_
        total = row_exp_sum(row, kb, shift, True)
        part = parts + ((b0 + h) * chunks + cix) * stride + r * (Ev + 2)
        part[0] = m
        part[1] = total
        for e in range(Ev):
            accs[p * Ev + e] = 0
        if kv8 and var.v_scale != NULL:           # the value pass adds w_j * s_v[j] * v8_j
            sc_row = var.v_scale + var.v_scale_off[b0 + h] + ka * var.v_scale_rs
            sc_rs = var.v_scale_rs
            scale_row(row, kb, sc_row, sc_rs)
    # value pass: accs[p] += sum_j scores[p, j] * v_{ka + j}, in key order, zero weights skipped
    if floating is float:
        # blocks of GDECODE_WIDEN value rows (in L1 for all the rows; 16-bit ones widened first)
        pfs.k = vc
        pfs.ks = v_rs
        pfs.rows = kb
        pfs.n = Ev
        pfs.v = NULL
        pfs.nv = 0
        pf = (DECODE_PF_BYTES // esz) // (Ev if Ev > 0 else 1) + 1
        if kv_fmt != 0 and pf < GDECODE_WIDEN:
            pf = GDECODE_WIDEN      # a block is widened at once: prefetch the next whole block
        jb = 0
        while jb < kb:
            nb = kb - jb if kb - jb < GDECODE_WIDEN else GDECODE_WIDEN
            pfs.start = jb + pf
            if kv_fmt == CYATTN_KV8_I8 and CYATTN_KV8_IN_REGISTERS:
                for j in range(nb):             # int8 widened in registers (same bits)
                    cyattn_pf_step(&pfs, j)
                cyattn_gwsum_i8(accs, Ev, scores + jb, kb, n,
                                <const signed char*>vc + jb * v_rs, nb, v_rs, Ev)
            elif kv8:
                for j in range(nb):
                    cyattn_pf_step(&pfs, j)
                    cyattn_kv8_to_float(<const uint8_t*>vc + (jb + j) * v_rs, kvbuf + j * Ev,
                                        Ev, kv_fmt)
                cyattn_gwsum_f32(accs, Ev, scores + jb, kb, n, kvbuf, nb, Ev, Ev, NULL)
            elif kv_fmt != 0:
                for j in range(nb):
                    cyattn_pf_step(&pfs, j)
                    cyattn_half_to_float(<const uint16_t*>vc + (jb + j) * v_rs, kvbuf + j * Ev,
                                         Ev, kv_fmt)
                cyattn_gwsum_f32(accs, Ev, scores + jb, kb, n, kvbuf, nb, Ev, Ev, NULL)
            else:
                cyattn_gwsum_f32(accs, Ev, scores + jb, kb, n, <const float*>vc + jb * v_rs, nb,
                                 v_rs, Ev, &pfs)
            jb += nb
    else:
        for j in range(kb):
            v_row = <const floating*>vc + j * v_rs
            for p in range(n):
                w = scores[p * kb + j]
                if w == 0:      # adds nothing, and a masked key's inf/NaN value is never read
                    continue
                acc = accs + p * Ev
                for e in range(Ev):
                    acc[e] += w * v_row[e]
    for p in range(n):
        part = parts + ((b0 + row_head[p]) * chunks + cix) * stride + row_q[p] * (Ev + 2)
        for e in range(Ev):
            part[2 + e] = accs[p * Ev + e]


cdef void decode_grouped(const floating* q, const int64_t* q_off, Py_ssize_t q_rs,
                         const void* k, const int64_t* k_off, Py_ssize_t k_rs,
                         const void* v, const int64_t* v_off, Py_ssize_t v_rs, int kv_fmt,
                         const uint8_t* bmask, const floating* amask,
                         const int64_t* m_off, Py_ssize_t m_rs, Py_ssize_t m_cs,
                         floating* out, const int64_t* o_off, Py_ssize_t o_rs, floating* lse,
                         Py_ssize_t batch, Py_ssize_t g, Py_ssize_t L, Py_ssize_t S,
                         Py_ssize_t E, Py_ssize_t Ev, floating scale, const AttnVariant* var,
                         int n_threads, int* status, int* half_redo) noexcept nogil:
    """decode_attention with the g consecutive batch entries of each K/V matrix as the rows
    of one task (see the design note): tasks (group, head block, chunk) in parallel, then the
    partials merged per batch entry in chunk order (decode_finish)."""
    cdef Py_ssize_t hg = GDECODE_MAX_ROWS // L      # heads per task
    cdef Py_ssize_t nhb, ngroups, chunk, c_beg = -1, c_end = 0, chunks, ntasks
    cdef Py_ssize_t ka, kz, bi, t, gi, hb, c, b0, nh, j0, j1, rows
    cdef Py_ssize_t stride = L * (Ev + 2)
    cdef Py_ssize_t lo_all = -1, hi_all = 0
    cdef RowLimits lim
    cdef floating* parts
    cdef floating* qbuf
    cdef floating* scores
    cdef floating* accs
    cdef float* kvbuf
    cdef void* raw
    cdef int done
    hg = 1 if hg < 1 else (g if hg > g else hg)
    nhb = (g + hg - 1) // hg
    ngroups = batch // g
    rows = hg * L
    for bi in range(batch):                       # the keys some row of some entry may see
        row_limits(var, bi, L, S, &lim)
        decode_key_range(&lim, L, &ka, &kz)
        if kz > ka:
            if lo_all < 0 or ka < lo_all:
                lo_all = ka
            if kz > hi_all:
                hi_all = kz
    if lo_all < 0:
        lo_all = 0
    chunk = GDECODE_CHUNK                         # the shape's chunking (not the threads')
    while (chunk > GDECODE_MIN_CHUNK and ngroups * nhb * ((hi_all + chunk - 1) // chunk
                                                          - lo_all // chunk)
           < GDECODE_MIN_TASKS):
        chunk //= 2
    if hi_all > lo_all:
        c_beg = lo_all // chunk
        c_end = (hi_all + chunk - 1) // chunk
    else:
        c_beg = 0
        c_end = 0
    chunks = c_end - c_beg
    ntasks = ngroups * nhb * chunks
    parts = <floating*>malloc(<size_t>((batch * chunks if batch * chunks > 0 else 1) * stride
                                       + 1) * sizeof(floating))
    if parts == NULL:
        status[0] = 1
        return
    if ntasks > 0:
        if n_threads > ntasks:
            n_threads = <int>ntasks
        with parallel(num_threads=n_threads):
            raw = malloc(<size_t>(rows * (E + chunk + Ev)) * sizeof(floating)
                         + <size_t>(GDECODE_WIDEN * (E if E > Ev else Ev)) * sizeof(float)
                         + 4 * ALIGN)
            qbuf = NULL
            scores = NULL
            accs = NULL
            kvbuf = NULL
            if raw == NULL:
                status[0] = 1
            else:
                scores = <floating*>align_ptr(raw)
                qbuf = <floating*>align_ptr(<void*>(scores + rows * chunk))
                accs = <floating*>align_ptr(<void*>(qbuf + rows * E))
                kvbuf = <float*>align_ptr(<void*>(accs + rows * Ev))
            for t in prange(ntasks, schedule='static'):
                if raw != NULL:
                    gi = t // (nhb * chunks)
                    hb = (t // chunks) % nhb
                    c = c_beg + t % chunks
                    b0 = gi * g + hb * hg
                    nh = g - hb * hg if g - hb * hg < hg else hg
                    j0 = c * chunk
                    j1 = j0 + chunk
                    gdecode_task(q, q_off, q_rs, k, k_off, k_rs, v, v_off, v_rs, kv_fmt,
                                 bmask, amask, m_off, m_rs, m_cs, L, S, E, Ev, scale, var,
                                 b0, nh, j0, j1 if j1 < S else S, c - c_beg, chunks,
                                 qbuf, scores, accs, kvbuf, parts)
            free(raw)
    if status[0]:
        free(parts)
        return
    for bi in prange(batch, num_threads=n_threads, schedule='static'):
        done = decode_finish(q, q_off, q_rs, k, k_off, k_rs, v, v_off, v_rs, kv_fmt, bmask,
                             amask, m_off, m_rs, m_cs, out, o_off, o_rs, lse, bi, L, S, E, Ev,
                             scale, var, parts + bi * chunks * stride, chunks)
        if done == 1:
            status[0] = 1
        elif done == 2:
            half_redo[0] = 1
    free(parts)


cdef void decode_dispatch(const floating* q, const int64_t* q_off, Py_ssize_t q_rs,
                          const void* k, const int64_t* k_off, Py_ssize_t k_rs,
                          const void* v, const int64_t* v_off, Py_ssize_t v_rs,
                          int kv_fmt, const uint8_t* bmask, const floating* amask,
                          const int64_t* m_off, Py_ssize_t m_rs, Py_ssize_t m_cs,
                          floating* out, const int64_t* o_off, Py_ssize_t o_rs,
                          floating* lse, Py_ssize_t batch, Py_ssize_t L, Py_ssize_t S,
                          Py_ssize_t E, Py_ssize_t Ev, floating scale,
                          const AttnVariant* var, int n_threads, int* status,
                          int* half_redo) noexcept nogil:
    """The decode path (up to DECODE_MAX_L query rows): grouped (decode_grouped) where
    consecutive batch entries share K and V or L > DECODE_UNGROUPED_MAX_L, else
    decode_attention; 8-bit K/V (kv_fmt CYATTN_KV8_*) always grouped (only that path reads
    them). Same arguments as decode_attention."""
    cdef Py_ssize_t g = decode_group_size(k_off, v_off, batch)
    if g == 1 and L <= DECODE_UNGROUPED_MAX_L and kv_fmt < CYATTN_KV8_I8:
        decode_attention(q, q_off, q_rs, k, k_off, k_rs, v, v_off, v_rs, kv_fmt, bmask, amask,
                         m_off, m_rs, m_cs, out, o_off, o_rs, lse, batch, L, S, E, Ev, scale,
                         var, n_threads, status, half_redo)
    else:
        decode_grouped(q, q_off, q_rs, k, k_off, k_rs, v, v_off, v_rs, kv_fmt, bmask, amask,
                       m_off, m_rs, m_cs, out, o_off, o_rs, lse, batch, g, L, S, E, Ev, scale,
                       var, n_threads, status, half_redo)
