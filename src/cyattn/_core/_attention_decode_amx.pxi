# bfloat16 decode on AMX tiles (issue 45): scaled_dot_product_attention with precision="fast"
# (the amx variant's default), bfloat16 query, key and value and at most DECODE_MAX_L query
# rows, on the tiles: the opt-in amx variant's instructions, or the tiles' portable model
# (emulate="amx") on any host. The grouped decode's tasks with both products on tiles.
#
# Design
# ------
# * Which calls: attention_bf16 with tiles sends here the few-row calls the exact path decodes
#   (attention_run's rule: L <= DECODE_MAX_L, decode_rows_fit, enough work; any strides: the
#   packing reads them); other few-row calls take the prefill tile path (_attention_bf16.pxi).
# * Tasks are (group, block of heads, chunk of keys), as decode_grouped's: the g consecutive
#   batch entries that read one K and one V matrix (the query heads of a GQA group, or K/V
#   broadcast over heads; g = 1 otherwise) form a group, cut into blocks of hg = 16 // L whole
#   heads, so that a task has at most m = hg * L <= 16 query rows: the tiles' rows (A tile 0:
#   Q, then P; C tiles 4-5: S, then O; B tiles 2-3: K^T, then V). The tile configuration (m
#   rows) is loaded once per worker, and the tiles released when its tasks end. The keys are
#   cut into chunks by decode_grouped's rule (512, halved down to 128 while there are fewer
#   than 256 tasks): by the shape only, never by the thread count.
# * Per task: the rows' Q packed once into A chunks of 32 along E. The keys some row of the
#   task may see in the chunk, ka .. kz, are walked in blocks of 32 aligned to the chunk's
#   start (so a key's place in the tile products depends on its index only, not on the other
#   rows of its task); keys of a block outside ka .. kz are packed as +0 and never read. Per
#   block, K is packed in pairs along E (B tiles of 16 keys) and S = Q K^T is taken on the
#   tiles (E in chunks of 32, in order) into the task's score rows.
# * Between the products, per row in float32, as gdecode_task does: the scale (one multiply,
#   as the prefill tile path), softcap and ALiBi, the row's own limits (causal, window,
#   lengths) and mask, the row maximum, exp and the lane-wise sum of the unrounded float32
#   weights (row_exp_sum, the float32 decode's); the weights are then rounded to bfloat16
#   (nearest even) into P, row-major: the A tile's pairs along keys.
# * O = P V: per block of 32 keys, V packed in pairs along keys (B tiles of 16 value columns);
#   the task's float32 accumulators (from +0) pass through C tiles 4-5, 32 columns at a time,
#   32 keys per tile product. The task leaves (max, sum, accumulator) per row, and the
#   partials are merged per batch entry in chunk order (decode_merge), so results are
#   bit-identical for any thread count; the model and the instructions give the same bits.
# * The precision contract is the prefill tile path's (P rounded to bfloat16 before P V, the
#   tiles' sums): its documented bound holds with nb the number of key chunks. A masked key
#   inside ka .. kz is multiplied by a +0 weight, not skipped: an inf or NaN there, like any
#   non-finite result, makes the call report a redo (redo[0]), and the caller computes it on
#   the exact path, which never reads such keys.
# * Scratch per worker: Q's chunks, one packed K block and one V block (in L1), the task's
#   score rows, weights and accumulators (O(16 x (chunk + Ev))), the model's tile state.

cdef inline void amx_dec_scores(bint hw, void* tctx, const uint16_t* qa, Py_ssize_t ne,
                                const uint16_t* kt, float* s, Py_ssize_t ld_s) noexcept nogil:
    if hw:
        cyattn_amx_dec_scores_hw(tctx, qa, ne, kt, s, ld_s)
    else:
        cyattn_amx_dec_scores_model(tctx, qa, ne, kt, s, ld_s)


cdef inline void amx_dec_pv(bint hw, void* tctx, const uint16_t* p, Py_ssize_t ld_p,
                            const uint16_t* vb, Py_ssize_t ncg, float* acc,
                            Py_ssize_t ld_acc) noexcept nogil:
    if hw:
        cyattn_amx_dec_pv_hw(tctx, p, ld_p, vb, ncg, acc, ld_acc)
    else:
        cyattn_amx_dec_pv_model(tctx, p, ld_p, vb, ncg, acc, ld_acc)


cdef void amx_decode_task(const uint16_t* q, const int64_t* q_off, Py_ssize_t q_rs,
                          Py_ssize_t q_cs, const uint16_t* k, const int64_t* k_off,
                          Py_ssize_t k_rs, Py_ssize_t k_cs, const uint16_t* v,
                          const int64_t* v_off, Py_ssize_t v_rs, Py_ssize_t v_cs,
                          const uint8_t* bmask, const float* amask, const int64_t* m_off,
                          Py_ssize_t m_rs, Py_ssize_t m_cs, Py_ssize_t L, Py_ssize_t S,
                          Py_ssize_t E, Py_ssize_t Ev, float scale, const AttnVariant* var,
                          Py_ssize_t b0, Py_ssize_t nh, Py_ssize_t m, Py_ssize_t j0,
                          Py_ssize_t j1, Py_ssize_t cix, Py_ssize_t chunks, Py_ssize_t ld_s,
                          bint hw, void* tctx, uint16_t* qa, uint16_t* kt, uint16_t* vb,
                          float* scores, uint16_t* pw, float* accs,
                          float* parts) noexcept nogil:
    """Task: heads b0 .. b0+nh-1 (batch entries of one K/V matrix; nh * L <= m <= 16 rows
    configured), keys j0 .. j1 (j0 a multiple of 32, j1 - j0 <= ld_s). Leaves the partial
    state of row r of head b at parts + ((b * chunks + cix) * L + r) * (Ev + 2), as
    gdecode_task does (see the design note)."""
    cdef RowLimits lims[AMX_DEC_ROWS]
    cdef Py_ssize_t rlo[AMX_DEC_ROWS]           # packed row p (head p // L, query row p % L):
    cdef Py_ssize_t rhi[AMX_DEC_ROWS]           # its keys in the chunk (rhi <= rlo: none)
    cdef Py_ssize_t ne = (E + AMX_KB - 1) // AMX_KB
    cdef Py_ssize_t evp = round_up(Ev, AMX_BLOCK)
    cdef Py_ssize_t ncg = evp // 16
    cdef Py_ssize_t stride = L * (Ev + 2)
    cdef Py_ssize_t h, r, p, e, j, lo, hi, live, ka = -1, kz = 0, kb0, nkb, width, b, bs, mo
    cdef float floor_ = SHIFT_FLOOR_F32
    cdef float neg_inf = <float>-CYATTN_INF
    cdef float mx, shift, total
    cdef float* row
    cdef float* part
    cdef uint16_t* prow
    memset(qa, 0, <size_t>(ne * AMX_ACHUNK) * sizeof(uint16_t))
    for p in range(m):
        rlo[p] = 0
        rhi[p] = 0
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
            p = h * L + r
            rlo[p] = lo
            rhi[p] = hi
            if ka < 0 or lo < ka:
                ka = lo
            if hi > kz:
                kz = hi
            cyattn_amx_pack_arow(E, q + q_off[b0 + h] + r * q_rs, q_cs, qa + p * AMX_KB)
    if ka < 0:
        return
    kb0 = j0 + ((ka - j0) // AMX_KB) * AMX_KB
    nkb = (kz - kb0 + AMX_KB - 1) // AMX_KB
    width = nkb * AMX_KB
    # S = Q K^T, one block of 32 keys at a time (keys outside ka .. kz are +0, never read)
    for b in range(nkb):
        bs = kb0 + b * AMX_KB
        lo = ka - bs if ka > bs else 0
        hi = kz - bs if kz - bs < AMX_KB else AMX_KB
        cyattn_amx_pack_kblock(E, lo, hi, k + k_off[b0] + (bs + lo) * k_rs, k_rs, k_cs, kt)
        amx_dec_scores(hw, tctx, qa, ne, kt, scores + b * AMX_KB, ld_s)
    # each row: scale, transforms, its own limits and mask, max, exp, sum; P in bf16
    for p in range(m):
        prow = pw + p * ld_s
        if rhi[p] <= rlo[p]:                    # no key here (or a padding row): P = +0
            memset(prow, 0, <size_t>width * sizeof(uint16_t))
            continue
        h = p // L
        r = p - h * L
        row = scores + p * ld_s
        for j in range(width):
            row[j] = row[j] * scale
        if lims[h].has_softcap or lims[h].has_slope:
            row_transform(row, width, r, kb0, &lims[h])
        lo = rlo[p] - kb0
        hi = rhi[p] - kb0
        for j in range(lo):
            row[j] = neg_inf
        for j in range(hi, width):
            row[j] = neg_inf
        if bmask != NULL or amask != NULL:
            mo = (m_off[b0 + h] if m_off != NULL else 0) + r * m_rs + rlo[p] * m_cs
            row_mask_inplace(row + lo, hi - lo, bmask + mo if bmask != NULL else NULL, m_cs,
                             amask + mo if amask != NULL else NULL, m_cs)
        mx = row_max(row, width)
        shift = mx if mx > floor_ else floor_
        total = row_exp_sum(row, width, shift, True)
        for j in range(width):
            prow[j] = <uint16_t>bf16_rne_bits(row[j])
        part = parts + ((b0 + h) * chunks + cix) * stride + r * (Ev + 2)
        part[0] = mx
        part[1] = total
    # O = P V, one block of 32 keys at a time, the accumulators from +0
    memset(accs, 0, <size_t>(m * evp) * sizeof(float))
    for b in range(nkb):
        bs = kb0 + b * AMX_KB
        lo = ka - bs if ka > bs else 0
        hi = kz - bs if kz - bs < AMX_KB else AMX_KB
        cyattn_amx_pack_vblock(Ev, ncg, lo, hi, v + v_off[b0] + (bs + lo) * v_rs, v_rs, v_cs,
                               vb)
        amx_dec_pv(hw, tctx, pw + b * AMX_KB, ld_s, vb, ncg, accs, evp)
    for p in range(m):
        if rhi[p] <= rlo[p]:
            continue
        h = p // L
        part = parts + ((b0 + h) * chunks + cix) * stride + (p - h * L) * (Ev + 2)
        for e in range(Ev):
            part[2 + e] = accs[p * evp + e]


cdef bint amx_decode_finish(const float* parts, Py_ssize_t chunks, Py_ssize_t bi,
                            Py_ssize_t L, Py_ssize_t S, Py_ssize_t Ev, const AttnVariant* var,
                            float* out, float* lse) noexcept nogil:
    """Merge batch entry bi's partial states in chunk order into out (L x Ev) and lse (its
    own row limits: a function, so that they are the thread's own); whether a row is not
    finite."""
    cdef RowLimits lim
    cdef Py_ssize_t r
    row_limits(var, bi, L, S, &lim)
    decode_merge(parts, chunks, L, Ev, out, Ev, lse, &lim)
    for r in range(L):
        if row_nonfinite(out + r * Ev, lse[r], Ev):
            return True
    return False


cdef void amx_decode_run(const uint16_t* q, const int64_t* q_off, Py_ssize_t q_rs,
                         Py_ssize_t q_cs, const uint16_t* k, const int64_t* k_off,
                         Py_ssize_t k_rs, Py_ssize_t k_cs, const uint16_t* v,
                         const int64_t* v_off, Py_ssize_t v_rs, Py_ssize_t v_cs,
                         const uint8_t* bmask, const float* amask, const int64_t* m_off,
                         Py_ssize_t m_rs, Py_ssize_t m_cs, float* out, float* lse,
                         Py_ssize_t batch, Py_ssize_t L, Py_ssize_t S, Py_ssize_t E,
                         Py_ssize_t Ev, float scale, const AttnVariant* var, int n_threads,
                         bint hw, int* status, int* redo) noexcept nogil:
    """bf16 decode on tiles (see the design note): tasks (group, head block, chunk) in
    parallel, then the partials merged per batch entry in chunk order; out C-contiguous
    (batch, L, Ev), lse (batch, L). status[0] = 1 if scratch could not be allocated; a row
    whose result is not finite sets redo[0] = 1. 0 < L <= AMX_DEC_ROWS, E, Ev > 0."""
    cdef Py_ssize_t g = decode_group_size(k_off, v_off, batch)
    cdef Py_ssize_t hg = AMX_DEC_ROWS // L         # heads per task
    cdef Py_ssize_t nhb, ngroups, chunk, c_beg, c_end, chunks, ntasks, m
    cdef Py_ssize_t ka, kz, bi, t, gi, hb, c, b0, nh, j0, j1
    cdef Py_ssize_t stride = L * (Ev + 2)
    cdef Py_ssize_t lo_all = -1, hi_all = 0
    cdef Py_ssize_t ne = (E + AMX_KB - 1) // AMX_KB
    cdef Py_ssize_t evp = round_up(Ev, AMX_BLOCK)
    cdef size_t bytes_qa, bytes_kt, bytes_vb, bytes_s, bytes_p, bytes_acc
    cdef RowLimits lim
    cdef float* parts
    cdef uint16_t* qa
    cdef uint16_t* kt
    cdef uint16_t* vb
    cdef float* scores
    cdef uint16_t* pw
    cdef float* accs
    cdef void* tctx
    cdef void* raw
    hg = 1 if hg < 1 else (g if hg > g else hg)
    m = hg * L
    nhb = (g + hg - 1) // hg
    ngroups = batch // g
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
    parts = <float*>malloc(<size_t>((batch * chunks if batch * chunks > 0 else 1) * stride
                                    + 1) * sizeof(float))
    if parts == NULL:
        status[0] = 1
        return
    bytes_qa = <size_t>(ne * AMX_ACHUNK) * sizeof(uint16_t)
    bytes_kt = <size_t>(ne * AMX_CHUNK) * sizeof(uint16_t)
    bytes_vb = <size_t>(evp * AMX_KB) * sizeof(uint16_t)
    bytes_s = <size_t>(m * chunk) * sizeof(float)
    bytes_p = <size_t>(m * chunk) * sizeof(uint16_t)
    bytes_acc = <size_t>(m * evp) * sizeof(float)
    if ntasks > 0:
        if n_threads > ntasks:
            n_threads = <int>ntasks
        with parallel(num_threads=n_threads):
            raw = malloc(bytes_qa + bytes_kt + bytes_vb + bytes_s + bytes_p + bytes_acc
                         + <size_t>AMX_MODEL_BYTES + 8 * ALIGN)
            qa = NULL
            kt = NULL
            vb = NULL
            scores = NULL
            pw = NULL
            accs = NULL
            tctx = NULL
            if raw == NULL:
                status[0] = 1
            else:
                qa = <uint16_t*>align_ptr(raw)
                kt = <uint16_t*>align_ptr(<char*>qa + bytes_qa)
                vb = <uint16_t*>align_ptr(<char*>kt + bytes_kt)
                scores = <float*>align_ptr(<char*>vb + bytes_vb)
                pw = <uint16_t*>align_ptr(<char*>scores + bytes_s)
                accs = <float*>align_ptr(<char*>pw + bytes_p)
                tctx = align_ptr(<char*>accs + bytes_acc)
                if hw:
                    cyattn_amx_dec_begin_hw(tctx, <int>m)
                else:
                    cyattn_amx_dec_begin_model(tctx, <int>m)
            for t in prange(ntasks, schedule='static'):
                if raw != NULL:
                    gi = t // (nhb * chunks)
                    hb = (t // chunks) % nhb
                    c = c_beg + t % chunks
                    b0 = gi * g + hb * hg
                    nh = g - hb * hg if g - hb * hg < hg else hg
                    j0 = c * chunk
                    j1 = j0 + chunk
                    amx_decode_task(q, q_off, q_rs, q_cs, k, k_off, k_rs, k_cs, v, v_off,
                                    v_rs, v_cs, bmask, amask, m_off, m_rs, m_cs, L, S, E, Ev,
                                    scale, var, b0, nh, m, j0, j1 if j1 < S else S,
                                    c - c_beg, chunks, chunk, hw, tctx, qa, kt, vb, scores,
                                    pw, accs, parts)
            if raw != NULL:
                if hw:
                    cyattn_amx_end_hw(tctx)
                else:
                    cyattn_amx_end_model(tctx)
            free(raw)
    if status[0]:
        free(parts)
        return
    for bi in prange(batch, num_threads=n_threads, schedule='static'):
        if amx_decode_finish(parts + bi * chunks * stride, chunks, bi, L, S, Ev, var,
                             out + bi * L * Ev, lse + bi * L):
            redo[0] = 1
    free(parts)
