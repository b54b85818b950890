# bfloat16 attention on the CPU's bf16 dot products (scaled_dot_product_attention with
# precision="fast" and query, key and value all bfloat16, more than DECODE_MAX_L query rows):
# the fused path of _attention_fused.pxi with both products on the bf16 GEMM micro-kernel
# (_cyattn_bf16_avx512.h: vdpbf16ps; _cyattn_bf16_emul.h: its emulation, same bits).
#
# Design
# ------
# * The float32 fused path's tasks and transposed blocking (see _attention_fused.pxi): per task
#   (batch entry, group of query rows) the keys are walked in blocks of KB = 256, aligned to
#   multiples of KB. Q^T is packed once per task into BF16_NR = 32-lane B panels of pairs
#   along E; per key block K is packed into BF16_MR = 8-row A panels of pairs along E and V^T
#   into 8-row A panels of pairs along keys (each once per block, read as stored: no widened
#   copy). Per query panel of 32 lanes: S^T = scale * (K Q^T) on the tile kernel (sum over E
#   in order, the whole of E in one sum), then the score transforms and masks
#   (panel_transform, panel_masks with nr = 32), then the online softmax across the 32 lanes
#   (bf16_panel_softmax: float32 max, exp, sum of the float32 weights), which writes the
#   weights rounded to bfloat16 (nearest even) straight into the B-pair layout of P^T (pairs
#   along keys), and O^T = O^T * factor + V^T P^T (the tile's block sum added once).
# * Every quantity of a query row depends only on its 32-lane panel's keys, and those only
#   through keys whose weight is exactly 0 (a key a lane may not see scores -inf and weighs
#   0; the tile's sums start at +0, so adding 0 changes no bit): query groups, which depend
#   on the thread count, never change a bit. Panels are the same 32 lanes on every variant,
#   so the avx512 variant's emulation gives the avx512bf16 variant's bits exactly; other
#   variants round exp and the rescaling differently (FMA contraction), within the bound.
# * Non-finite results (inf/NaN in the inputs, a NaN score, an overflow): the call reports a
#   redo (half_redo) and the caller computes it again on the exact path, which handles them.
# * On AArch64 BFDOT's rule (engine BF16_ARM_MODEL / BF16_ARM_HW: aarch64 builds, the
#   instruction in the neonbf16 variant; emulate="arm" on any host): the same tasks, panels
#   and tiles, only the tile's dot-product rule changes (_gemm_bf16.pxi's bf16_dot_tile).
# * On AMX tiles (engine BF16_TILES_MODEL / BF16_TILES_HW: the opt-in amx variant, or the
#   tiles' portable model on any host): the same tasks, blocks, panels, masks and online
#   softmax, only the two products change (isa/_cyattn_amx_loop.h): K is packed per block in
#   rows along E and V^T in rows along keys (pairs of keys as TDPBF16PS reads them), Q^T per
#   task in the B-tile pair layout, 32 lanes a panel; S^T = K Q^T per 32 keys x 32 lanes
#   (2 x 2 C tiles, E in chunks of 32, then scaled by one float32 multiply); the weights
#   (bf16_panel_softmax's pairs, halves swapped) multiply V^T into O^T, which the C tiles load,
#   accumulate 32 keys per tile product and store back. Sums are TDPBF16PS's (two partial sums
#   per chunk, see isa/_cyattn_amx_model.h), so the bits differ from vdpbf16ps's but not
#   between the model and the hardware, nor with the thread count. Each worker loads the tile
#   configuration once and releases the tiles when its tasks end.
#   On tiles, few-row calls (L <= DECODE_MAX_L) that the exact path would decode take the tile
#   decode instead (_attention_decode_amx.pxi); the other few-row calls run here.

cdef inline uint32_t bf16_rne_bits(float x) noexcept nogil:
    """x (finite, >= 0, or NaN) rounded to bfloat16, nearest even: the 16 bits."""
    cdef uint32_t u = <uint32_t>_f32_bits(x)
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16


cdef void bf16_panel_softmax(float* panel, Py_ssize_t kb, float* row_m, float* row_l,
                             float* factor, uint32_t* p_pairs) noexcept nogil:
    """Online-softmax update of a 32-lane score panel (panel[p * 32 + j]: key p, lane j) with
    kb keys, as panel_online_softmax does for the float32 path (the same max, shift, exp and
    in-order float32 sum per lane), the weights then written to p_pairs rounded to bfloat16
    in the B-pair layout: p_pairs[q * 32 + j] = w[2q, j] << 16 | w[2q + 1, j] (0 past kb)."""
    cdef Py_ssize_t p, j, q, kfull = kb // 2
    cdef float col_max[BF16_NR]
    cdef float col_min[BF16_NR]
    cdef float kept_min[BF16_NR]
    cdef float shift[BF16_NR]
    cdef float part[BF16_NR]
    cdef float neg_inf = <float>-CYATTN_INF
    cdef float pos_inf = <float>CYATTN_INF
    cdef float normal = EXP_NORMAL_F32
    cdef float floor_ = SHIFT_FLOOR_F32
    cdef int nonpos = 1, kept_nonpos = 1
    cdef float s, e, e1
    cdef float* row
    cdef const float* r0
    cdef const float* r1
    for j in range(BF16_NR):
        col_max[j] = row_m[j]
        col_min[j] = pos_inf
        part[j] = 0
    for p in range(kb):
        row = panel + p * BF16_NR
        for j in range(BF16_NR):
            s = row[j]
            col_max[j] = s if s > col_max[j] else col_max[j]
            col_min[j] = s if s < col_min[j] else col_min[j]
    for j in range(BF16_NR):
        shift[j] = col_max[j] if col_max[j] > floor_ else floor_
        factor[j] = exp_any(row_m[j] - shift[j])
        row_m[j] = col_max[j]
        nonpos = nonpos & (col_min[j] - shift[j] >= normal)
    if not nonpos:
        for j in range(BF16_NR):
            kept_min[j] = pos_inf
        for p in range(kb):
            row = panel + p * BF16_NR
            for j in range(BF16_NR):
                s = row[j]
                s = s if s > neg_inf else pos_inf
                kept_min[j] = s if s < kept_min[j] else kept_min[j]
        for j in range(BF16_NR):
            kept_nonpos = kept_nonpos & (kept_min[j] - shift[j] >= normal)
    # the same exp as the float32 path's (exp_nonpos, exp_nonpos_or_zero and exp_any agree
    # where each is used), summed over the keys in order (key 2q, then 2q + 1), each weight
    # rounded to bfloat16 and written straight into its pair: one pass over the panel
    if nonpos:
        for q in range(kfull):
            r0 = panel + 2 * q * BF16_NR
            r1 = r0 + BF16_NR
            for j in range(BF16_NR):
                e = exp_nonpos(r0[j] - shift[j])
                e1 = exp_nonpos(r1[j] - shift[j])
                part[j] += e
                part[j] += e1
                p_pairs[q * BF16_NR + j] = (bf16_rne_bits(e) << 16) | bf16_rne_bits(e1)
    elif kept_nonpos:
        for q in range(kfull):
            r0 = panel + 2 * q * BF16_NR
            r1 = r0 + BF16_NR
            for j in range(BF16_NR):
                e = exp_nonpos_or_zero(r0[j], shift[j])
                e1 = exp_nonpos_or_zero(r1[j], shift[j])
                part[j] += e
                part[j] += e1
                p_pairs[q * BF16_NR + j] = (bf16_rne_bits(e) << 16) | bf16_rne_bits(e1)
    else:
        for q in range(kfull):
            r0 = panel + 2 * q * BF16_NR
            r1 = r0 + BF16_NR
            for j in range(BF16_NR):
                e = exp_any(r0[j] - shift[j])
                e1 = exp_any(r1[j] - shift[j])
                part[j] += e
                part[j] += e1
                p_pairs[q * BF16_NR + j] = (bf16_rne_bits(e) << 16) | bf16_rne_bits(e1)
    if kb & 1:                              # the last key alone, a +0 pad in its pair
        r0 = panel + (kb - 1) * BF16_NR
        for j in range(BF16_NR):
            e = exp_any(r0[j] - shift[j])
            part[j] += e
            p_pairs[kfull * BF16_NR + j] = bf16_rne_bits(e) << 16
    for j in range(BF16_NR):
        row_l[j] = row_l[j] * factor[j] + part[j]


cdef void bf16_attention_task(const uint16_t* q, Py_ssize_t q_rs, Py_ssize_t q_cs,
                              const uint16_t* k, Py_ssize_t k_rs, Py_ssize_t k_cs,
                              const uint16_t* v, Py_ssize_t v_rs, Py_ssize_t v_cs,
                              const uint8_t* bmask, const float* amask,
                              Py_ssize_t m_rs, Py_ssize_t m_cs,
                              float* out, Py_ssize_t o_rs, float* lse,
                              Py_ssize_t i0, Py_ssize_t rows, Py_ssize_t E, Py_ssize_t Ev,
                              float scale, const RowLimits* lim,
                              uint32_t* qt_pairs, uint32_t* k_pairs, uint32_t* vt_pairs,
                              uint32_t* p_pairs, float* tile, float* ot, Py_ssize_t ld_o,
                              float* row_m, float* row_l, float* factor, bint want_lse,
                              int engine, void* tctx, uint32_t* p_tiles) noexcept nogil:
    """Rows i0 .. i0+rows of one (batch, head), E, Ev > 0: fused_attention_task's walk over
    the key blocks with the products on the bf16 tile or the AMX tiles (engine; see the
    design note; tctx: the tiles' model state). lse as there (max + sum without
    ``want_lse``). On tiles the buffers are the tile layouts (bf16_attention_worker)."""
    cdef Py_ssize_t live = lim.lend - i0 if lim.lend - i0 < rows else rows
    cdef Py_ssize_t kpe = (E + 1) // 2
    cdef Py_ssize_t panels, kv_beg, kv_end, j0, kb, kpb, kq, ks, jp, jp0, jp1, ir, r, e
    cdef Py_ssize_t first_q, last_q, lanes, q_first, n_keys
    cdef float inv, f, l2, m2
    cdef bint rescale
    cdef float* o_row
    cdef float* panel
    cdef float* ot_col
    cdef bint tiles = (engine == BF16_TILES_MODEL or engine == BF16_TILES_HW)
    cdef Py_ssize_t ne = (E + AMX_KB - 1) // AMX_KB, ld_k = ne * AMX_KB
    cdef Py_ssize_t ld_v = KB + 2 * AMX_BLOCK, evp = round_up(Ev, AMX_BLOCK), nkc
    live = 0 if live < 0 else live
    for r in range(live, rows):                 # past the query length: output 0, lse -inf
        for e in range(Ev):
            out[r * o_rs + e] = 0
        lse[r] = <float>-CYATTN_INF
    rows = live
    if rows == 0:
        return
    panels = (rows + BF16_NR - 1) // BF16_NR
    for r in range(panels * BF16_NR):
        row_m[r] = <float>-CYATTN_INF
        row_l[r] = 0
    memset(ot, 0, <size_t>(ld_o * (evp if tiles else Ev)) * sizeof(float))
    kv_beg = row_lo(lim, i0)
    kv_end = row_hi(lim, i0 + rows - 1)
    if kv_end > kv_beg and tiles:               # Q^T per 32-lane panel, B tiles along E
        for jp in range(panels):
            lanes = rows - jp * BF16_NR if rows - jp * BF16_NR < BF16_NR else BF16_NR
            cyattn_amx_pack_b(E, lanes, q + (i0 + jp * BF16_NR) * q_rs, q_cs, q_rs,
                              <uint16_t*>qt_pairs + jp * ne * AMX_CHUNK)
    elif kv_end > kv_beg:                       # Q^T: E x rows, pairs along E
        pack_b_pairs(E, rows, q + i0 * q_rs, q_cs, q_rs, qt_pairs)
    j0 = (kv_beg // KB) * KB
    while j0 < kv_end:
        kb = kv_end - j0 if kv_end - j0 < KB else KB
        kpb = (kb + 1) // 2
        jp0 = 0
        if lim.has_hi:
            first_q = j0 - lim.hi_off + 1 - i0
            jp0 = 0 if first_q < 0 else first_q // BF16_NR
        jp1 = panels
        if lim.has_lo:
            last_q = j0 + kb - lim.lo_off - i0
            last_q = 0 if last_q < 0 else last_q
            jp1 = (last_q + BF16_NR - 1) // BF16_NR
            jp1 = panels if jp1 > panels else jp1
        if jp1 <= jp0 or (bmask != NULL and bool_block_empty(
                bmask, m_rs, m_cs, i0 + jp0 * BF16_NR,
                i0 + jp1 * BF16_NR if i0 + jp1 * BF16_NR < i0 + rows else i0 + rows, j0, kb)):
            j0 += KB
            continue
        if tiles:       # K: rows along E; V^T: rows along keys; zero past kb, E, Ev
            cyattn_amx_pack_rows(kb, E, k + j0 * k_rs, k_rs, k_cs, KB + AMX_BLOCK, ld_k,
                                 <uint16_t*>k_pairs)
            cyattn_amx_pack_rows(Ev, kb, v + j0 * v_rs, v_cs, v_rs, evp, ld_v,
                                 <uint16_t*>vt_pairs)
        else:
            pack_a_pairs(kb, E, k + j0 * k_rs, k_rs, k_cs, k_pairs)     # K: kb x E
            pack_a_pairs(Ev, kb, v + j0 * v_rs, v_cs, v_rs, vt_pairs)   # V^T: Ev x kb
        for jp in range(jp0, jp1):
            lanes = rows - jp * BF16_NR if rows - jp * BF16_NR < BF16_NR else BF16_NR
            q_first = i0 + jp * BF16_NR
            kq = row_hi(lim, q_first + lanes - 1) - j0
            kq = kb if kq > kb else kq
            ks = row_lo(lim, q_first) - j0
            ks = 0 if ks < 0 else (ks // BF16_MR) * BF16_MR     # even: a pair boundary
            if ks >= kq:
                continue
            n_keys = kq - ks
            panel = tile + ks * BF16_NR
            nkc = (n_keys + AMX_BLOCK - 1) // AMX_BLOCK
            if tiles:                           # S^T = K Q^T, 32 keys x 32 lanes, scaled
                if engine == BF16_TILES_HW:
                    cyattn_amx_scores_hw(tctx, <const uint16_t*>k_pairs, ld_k, ne,
                                         <const uint16_t*>qt_pairs + jp * ne * AMX_CHUNK, ks,
                                         nkc, tile)
                else:
                    cyattn_amx_scores_model(tctx, <const uint16_t*>k_pairs, ld_k, ne,
                                            <const uint16_t*>qt_pairs + jp * ne * AMX_CHUNK,
                                            ks, nkc, tile)
                for r in range(n_keys * BF16_NR):
                    panel[r] = panel[r] * scale
            ir = ks
            while ir < kq and not tiles:        # S^T = scale K Q^T, 8 keys x 32 lanes a tile
                bf16_dot_tile(engine, kpe, k_pairs + ir * kpe,
                              qt_pairs + jp * kpe * BF16_NR, tile + ir * BF16_NR, BF16_NR, 1,
                              kq - ir if kq - ir < BF16_MR else BF16_MR, BF16_NR, scale, 1)
                ir += BF16_MR
            panel_masks(panel, n_keys, BF16_NR, lanes, q_first, j0 + ks, bmask, amask,
                        m_rs, m_cs, lim)
            bf16_panel_softmax(panel, n_keys, row_m + jp * BF16_NR, row_l + jp * BF16_NR,
                               factor, p_pairs)
            rescale = False
            for r in range(BF16_NR):
                rescale = rescale | (factor[r] != 1)
            if rescale:
                for e in range(Ev):
                    ot_col = ot + e * ld_o + jp * BF16_NR
                    for r in range(BF16_NR):
                        ot_col[r] = ot_col[r] * factor[r]
            # O^T += V^T (Ev x n_keys) P^T (n_keys x 32): keys ks .. kq, pairs from ks / 2
            if tiles:
                cyattn_amx_pack_pt(p_pairs, (n_keys + 1) // 2, nkc, p_tiles)
                if engine == BF16_TILES_HW:
                    cyattn_amx_pv_hw(tctx, <const uint16_t*>vt_pairs, ld_v, Ev, ks, nkc,
                                     p_tiles, ot + jp * BF16_NR, ld_o)
                else:
                    cyattn_amx_pv_model(tctx, <const uint16_t*>vt_pairs, ld_v, Ev, ks, nkc,
                                        p_tiles, ot + jp * BF16_NR, ld_o)
            ir = 0
            while ir < Ev and not tiles:
                bf16_dot_tile(engine, (n_keys + 1) // 2,
                              vt_pairs + ir * kpb + (ks // 2) * BF16_MR,
                              p_pairs, ot + ir * ld_o + jp * BF16_NR, ld_o, 1,
                              Ev - ir if Ev - ir < BF16_MR else BF16_MR, BF16_NR, 1.0, 0)
                ir += BF16_MR
        j0 += KB
    for r in range(rows):
        o_row = out + r * o_rs
        sink_merge(lim, row_m[r], row_l[r], &f, &l2, &m2)
        if l2 == 0:
            for e in range(Ev):
                o_row[e] = 0
            lse[r] = <float>-CYATTN_INF
            continue
        inv = f / l2
        for e in range(Ev):
            o_row[e] = ot[e * ld_o + r] * inv
        if want_lse:
            lse[r] = m2 + <float>log(l2)
        else:
            lse[r] = m2 + l2


cdef int bf16_attention_worker(const uint16_t* q, const int64_t* q_off, Py_ssize_t q_rs,
                               Py_ssize_t q_cs, const uint16_t* k, const int64_t* k_off,
                               Py_ssize_t k_rs, Py_ssize_t k_cs, const uint16_t* v,
                               const int64_t* v_off, Py_ssize_t v_rs, Py_ssize_t v_cs,
                               const uint8_t* bmask, const float* amask, const int64_t* m_off,
                               Py_ssize_t m_rs, Py_ssize_t m_cs, float* out, float* lse,
                               Py_ssize_t batch, Py_ssize_t L, Py_ssize_t S, Py_ssize_t E,
                               Py_ssize_t Ev, float scale, const AttnVariant* var,
                               Py_ssize_t qg, bint want_lse, int engine, int* redo,
                               Py_ssize_t* deal) noexcept nogil:
    """Tasks with this worker's own scratch, each the next one of the call's counter *deal
    (cyattn_next_task, as attention_worker); 1 if the scratch cannot be allocated (its tasks
    are left to the other workers). A row whose result is not finite sets redo[0] = 1. On tiles
    (engine) the buffers hold the tile layouts, and the tile state is loaded before the first
    task and released after the last."""
    cdef Py_ssize_t groups = (L + qg - 1) // qg
    cdef Py_ssize_t ntasks = batch * groups
    cdef Py_ssize_t t, bi, i0, rows, mo, ob, r
    cdef RowLimits lim
    cdef Py_ssize_t qlanes = round_up(qg if qg < L else L, BF16_NR)
    cdef Py_ssize_t kpe = (E + 1) // 2
    cdef size_t bytes_q = <size_t>(qlanes * kpe) * sizeof(uint32_t)
    cdef size_t bytes_k = <size_t>(round_up(KB, BF16_MR) * kpe) * sizeof(uint32_t)
    cdef size_t bytes_v = <size_t>(round_up(Ev, BF16_MR) * (KB // 2)) * sizeof(uint32_t)
    cdef size_t bytes_p = <size_t>((KB // 2) * BF16_NR) * sizeof(uint32_t)
    cdef size_t bytes_tile = <size_t>(BF16_NR * KB) * sizeof(float)
    cdef Py_ssize_t ld_o = qlanes + 16          # rows of O^T a cache line longer (see there)
    cdef size_t bytes_o = <size_t>(ld_o * Ev) * sizeof(float)
    cdef size_t bytes_rows = <size_t>(3 * qlanes) * sizeof(float)
    cdef bint tiles = (engine == BF16_TILES_MODEL or engine == BF16_TILES_HW)
    cdef Py_ssize_t ne = (E + AMX_KB - 1) // AMX_KB, evp = round_up(Ev, AMX_BLOCK)
    cdef size_t bytes_pt = 0, bytes_ctx = 0
    cdef void* tctx = NULL
    cdef uint32_t* p_tiles = NULL
    if tiles:
        bytes_q = <size_t>((qlanes // BF16_NR) * ne * AMX_CHUNK) * sizeof(uint16_t)
        bytes_k = <size_t>((KB + AMX_BLOCK) * ne * AMX_KB) * sizeof(uint16_t)
        bytes_v = <size_t>(evp * (KB + 2 * AMX_BLOCK)) * sizeof(uint16_t)
        bytes_tile = <size_t>(BF16_NR * (KB + AMX_BLOCK)) * sizeof(float)
        bytes_o = <size_t>(ld_o * evp) * sizeof(float)
        bytes_pt = <size_t>((KB // AMX_BLOCK + 1) * 512) * sizeof(uint32_t)
        bytes_ctx = <size_t>AMX_MODEL_BYTES
    cdef void* raw = malloc(bytes_q + bytes_k + bytes_v + bytes_p + bytes_tile + bytes_o
                            + bytes_rows + bytes_pt + bytes_ctx + 10 * ALIGN)
    cdef uint32_t* qt_pairs
    cdef uint32_t* k_pairs
    cdef uint32_t* vt_pairs
    cdef uint32_t* p_pairs
    cdef float* tile
    cdef float* ot
    cdef float* row_m
    if raw == NULL:
        return 1
    qt_pairs = <uint32_t*>align_ptr(raw)
    k_pairs = <uint32_t*>align_ptr(<char*>qt_pairs + bytes_q)
    vt_pairs = <uint32_t*>align_ptr(<char*>k_pairs + bytes_k)
    p_pairs = <uint32_t*>align_ptr(<char*>vt_pairs + bytes_v)
    tile = <float*>align_ptr(<char*>p_pairs + bytes_p)
    ot = <float*>align_ptr(<char*>tile + bytes_tile)
    row_m = <float*>align_ptr(<char*>ot + bytes_o)
    if tiles:
        p_tiles = <uint32_t*>align_ptr(<char*>row_m + bytes_rows)
        tctx = align_ptr(<char*>p_tiles + bytes_pt)
        if engine == BF16_TILES_HW:
            cyattn_amx_begin_hw(tctx)
        else:
            cyattn_amx_begin_model(tctx)
    t = cyattn_next_task(deal)
    while t < ntasks:
        bi = t % batch
        i0 = (t // batch) * qg
        rows = L - i0 if L - i0 < qg else qg
        mo = m_off[bi] if m_off != NULL else 0
        ob = bi * L * Ev + i0 * Ev
        row_limits(var, bi, L, S, &lim)
        bf16_attention_task(q + q_off[bi], q_rs, q_cs, k + k_off[bi], k_rs, k_cs,
                            v + v_off[bi], v_rs, v_cs,
                            bmask + mo if bmask != NULL else NULL,
                            amask + mo if amask != NULL else NULL, m_rs, m_cs,
                            out + ob, Ev, lse + bi * L + i0, i0, rows, E, Ev, scale, &lim,
                            qt_pairs, k_pairs, vt_pairs, p_pairs, tile, ot, ld_o,
                            row_m, row_m + qlanes, row_m + 2 * qlanes, want_lse, engine, tctx,
                            p_tiles)
        for r in range(rows):
            if row_nonfinite(out + ob + r * Ev, lse[bi * L + i0 + r], Ev):
                redo[0] = 1
        t = cyattn_next_task(deal)
    if tiles:
        if engine == BF16_TILES_HW:
            cyattn_amx_end_hw(tctx)
        else:
            cyattn_amx_end_model(tctx)
    free(raw)
    return 0


cdef void bf16_attention_run(const uint16_t* q, const int64_t* q_off, Py_ssize_t q_rs,
                            Py_ssize_t q_cs, const uint16_t* k, const int64_t* k_off,
                            Py_ssize_t k_rs, Py_ssize_t k_cs, const uint16_t* v,
                            const int64_t* v_off, Py_ssize_t v_rs, Py_ssize_t v_cs,
                            const uint8_t* bmask, const float* amask, const int64_t* m_off,
                            Py_ssize_t m_rs, Py_ssize_t m_cs, float* out, float* lse,
                            Py_ssize_t batch, Py_ssize_t L, Py_ssize_t S, Py_ssize_t E,
                            Py_ssize_t Ev, float scale, const AttnVariant* var,
                            bint want_lse, int n_threads, int engine, int* status,
                            int* redo) noexcept nogil:
    """The bf16 fast path over all tasks (query groups as attention_run chooses them for the
    fused path; they change no bit), each thread taking the next task as it finishes one (a
    shared counter, as fused_attention does); status[0] = 1 if scratch could not be allocated.
    engine: BF16_EMUL, BF16_DOT_HW, BF16_ARM_MODEL, BF16_ARM_HW (bf16_engine),
    BF16_TILES_MODEL or BF16_TILES_HW."""
    cdef Py_ssize_t qg = QG_DENSE if E + Ev <= 256 else QG
    cdef Py_ssize_t per_thread = 8 if n_threads > 1 and (var.causal or var.has_right) else 2
    cdef Py_ssize_t tasks = batch * ((L + qg - 1) // qg)
    cdef Py_ssize_t w
    cdef Py_ssize_t deal = 0
    if batch <= 0 or L <= 0:
        return
    while qg > 64 and tasks < per_thread * n_threads:
        qg //= 2
        tasks = batch * ((L + qg - 1) // qg)
    if n_threads > tasks:
        n_threads = <int>(tasks if tasks > 0 else 1)
    if n_threads <= 1:
        if bf16_attention_worker(q, q_off, q_rs, q_cs, k, k_off, k_rs, k_cs, v, v_off, v_rs,
                                 v_cs, bmask, amask, m_off, m_rs, m_cs, out, lse, batch, L, S,
                                 E, Ev, scale, var, qg, want_lse, engine, redo, &deal):
            status[0] = 1
        return
    for w in prange(n_threads, num_threads=n_threads, schedule='static', chunksize=1):
        if bf16_attention_worker(q, q_off, q_rs, q_cs, k, k_off, k_rs, k_cs, v, v_off, v_rs,
                                 v_cs, bmask, amask, m_off, m_rs, m_cs, out, lse, batch, L,
                                 S, E, Ev, scale, var, qg, want_lse, engine, redo, &deal):
            status[0] = 1
