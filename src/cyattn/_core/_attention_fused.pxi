# Fused attention: tasks, score panels, masks and the online softmax, and the drivers that
# split (batch, head, query group) tasks over threads. Rows whose result is not finite are
# redone by the two-pass path (_attention_two_pass.pxi).
#
# Design
# ------
# * fused attention (Milakov and Gimelshein 2018; Dao et al. 2022): per task (batch entry, group
#   of up to QG_DENSE, or QG for heads with E + Ev > 256, query rows) walk the keys in blocks of KB with
#   an online softmax, transposed:
#   S^T = K Q^T goes straight into the packed-panel layout (NR query lanes per panel) that
#   O^T += V^T P^T reads as its B operand, so the weights are never repacked and the column
#   softmax runs across query lanes. Row limits (causal, window, lengths; see
#   _attention_variants.pxi) skip whole blocks, the query panels that see none of a block and,
#   per panel, the keys outside its rows' limits (same bits: their weights are 0), an
#   all-False bool-mask block is skipped, GQA and broadcasting are offsets per batch entry.
#   Scratch is O(tile) per thread; the L x S matrix never exists.
# * Per-call work around the micro-kernel (issue 38, measured on AVX2 where it weighed most):
#   the packing transposes and the last step, O^T back into output rows scaled by 1 / sum, run
#   in 8 x 8 register blocks (_cyattn_transpose.h); with the 4 x 24 tile a query panel of at
#   most 8 lanes (L = 128, 512) runs on a 12 x 8 tile (_cyattn_tile_narrow.h) instead of
#   spending two thirds of its FMAs on padding lanes. All with the same bits.

# Floor of the online-softmax shift: a query lane that has seen only -inf scores so far is
# shifted by -FLT_MAX instead of -inf, so exp(-inf - shift) = 0 rather than NaN. A module
# variable, so that gcc turns max(m, floor) into vmaxps (see EXP_LO_F32).
cdef float SHIFT_FLOOR_F32 = -3.4028234663852886e38
cdef double SHIFT_FLOOR_F64 = -1.7976931348623157e308


cdef void panel_online_softmax(floating* panel, Py_ssize_t kb, floating* row_m, floating* row_l,
                               floating* factor) noexcept nogil:
    """Online-softmax update of one query panel (nr query lanes) with a block of kb keys.

    panel[p * nr + j] is the score of key p for query lane j (masks applied). For each lane:
    the running maximum row_m grows to include the block, factor = exp(old max - new max)
    rescales the running sum row_l (and, by the caller, the accumulated output), and the
    panel becomes the unnormalised weights exp(score - max). All loops run across the nr
    lanes, so they vectorise; a lane's sum is accumulated over keys in order.
    """
    cdef Py_ssize_t p, j
    cdef floating col_max[NR_MAX]
    cdef floating col_min[NR_MAX]
    cdef floating kept_min[NR_MAX]
    cdef floating shift[NR_MAX]
    cdef floating neg_inf = <floating>-CYATTN_INF
    cdef floating pos_inf = <floating>CYATTN_INF
    cdef int kept_nonpos
    cdef floating normal = EXP_NORMAL_F32 if floating is float else EXP_NORMAL_F64
    cdef int nonpos
    cdef floating part[NR_MAX]
    cdef floating s, e
    cdef floating floor_ = SHIFT_FLOOR_F32 if floating is float else SHIFT_FLOOR_F64
    cdef floating* row
    if floating is float:
        for j in range(NR):
            col_max[j] = row_m[j]
            col_min[j] = <floating>CYATTN_INF
            part[j] = 0
        if CYATTN_NEON_COLMAX:      # neon: the same selections in vectors (isa/_cyattn_vec_neon.h)
            cyattn_col_maxmin_f32(panel, kb, NR, col_max, col_min)
        else:
            for p in range(kb):
                row = panel + p * NR
                for j in range(NR):
                    s = row[j]
                    col_max[j] = s if s > col_max[j] else col_max[j]
                    col_min[j] = s if s < col_min[j] else col_min[j]
        nonpos = 1
        kept_nonpos = 1
        for j in range(NR):
            shift[j] = col_max[j] if col_max[j] > floor_ else floor_
            factor[j] = exp_any(row_m[j] - shift[j])
            row_m[j] = col_max[j]
            nonpos = nonpos & (col_min[j] - shift[j] >= normal)
        if not nonpos:              # the minimum over the unmasked scores (a second pass only
            for j in range(NR):     # here: in the first it cost a dense call 1-4 %)
                kept_min[j] = pos_inf
            for p in range(kb):
                row = panel + p * NR
                for j in range(NR):
                    s = row[j]
                    s = s if s > neg_inf else pos_inf
                    kept_min[j] = s if s < kept_min[j] else kept_min[j]
            for j in range(NR):
                kept_nonpos = kept_nonpos & (kept_min[j] - shift[j] >= normal)
        if nonpos and CYATTN_HAVE_PANEL_EXP24 and NR == 24:
            # avx2: the same, the three vectors of a key in lockstep (_cyattn_softmax_rows.h)
            cyattn_panel_exp24_f32(<float*>panel, kb, <const float*>shift, <float*>part)
        elif nonpos:                # no masked or far-off score: the same bits, fewer steps
            for p in range(kb):
                row = panel + p * NR
                for j in range(NR):
                    e = exp_nonpos(row[j] - shift[j])
                    row[j] = e
                    part[j] += e
        elif kept_nonpos:           # masked (-inf) scores, the others in range: as above, with
            for p in range(kb):     # the masked ones exactly 0, as exp_any makes them
                row = panel + p * NR
                for j in range(NR):
                    e = exp_nonpos_or_zero(row[j], shift[j])
                    row[j] = e
                    part[j] += e
        else:
            for p in range(kb):
                row = panel + p * NR
                for j in range(NR):
                    e = exp_any(row[j] - shift[j])
                    row[j] = e
                    part[j] += e
        for j in range(NR):
            row_l[j] = row_l[j] * factor[j] + part[j]
    else:
        for j in range(NRD):
            col_max[j] = row_m[j]
            col_min[j] = <floating>CYATTN_INF
            part[j] = 0
        for p in range(kb):
            row = panel + p * NRD
            for j in range(NRD):
                s = row[j]
                col_max[j] = s if s > col_max[j] else col_max[j]
                col_min[j] = s if s < col_min[j] else col_min[j]
        nonpos = 1
        kept_nonpos = 1
        for j in range(NRD):
            shift[j] = col_max[j] if col_max[j] > floor_ else floor_
            factor[j] = exp_any(row_m[j] - shift[j])
            row_m[j] = col_max[j]
            nonpos = nonpos & (col_min[j] - shift[j] >= normal)
        if not nonpos:              # the minimum over the unmasked scores (a second pass only
            for j in range(NRD):    # here: in the first it cost a dense call 1-4 %)
                kept_min[j] = pos_inf
            for p in range(kb):
                row = panel + p * NRD
                for j in range(NRD):
                    s = row[j]
                    s = s if s > neg_inf else pos_inf
                    kept_min[j] = s if s < kept_min[j] else kept_min[j]
            for j in range(NRD):
                kept_nonpos = kept_nonpos & (kept_min[j] - shift[j] >= normal)
        if nonpos:                  # no masked or far-off score: the same bits, fewer steps
            for p in range(kb):
                row = panel + p * NRD
                for j in range(NRD):
                    e = exp_nonpos(row[j] - shift[j])
                    row[j] = e
                    part[j] += e
        elif kept_nonpos:           # masked (-inf) scores, the others in range: as above, with
            for p in range(kb):     # the masked ones exactly 0, as exp_any makes them
                row = panel + p * NRD
                for j in range(NRD):
                    e = exp_nonpos_or_zero(row[j], shift[j])
                    row[j] = e
                    part[j] += e
        else:
            for p in range(kb):
                row = panel + p * NRD
                for j in range(NRD):
                    e = exp_any(row[j] - shift[j])
                    row[j] = e
                    part[j] += e
        for j in range(NRD):
            row_l[j] = row_l[j] * factor[j] + part[j]


cdef void panel_masks(floating* panel, Py_ssize_t kb, Py_ssize_t nr, Py_ssize_t lanes,
                      Py_ssize_t q0, Py_ssize_t j0,
                      const uint8_t* bmask, const floating* amask,
                      Py_ssize_t m_rs, Py_ssize_t m_cs,
                      const RowLimits* lim) noexcept nogil:
    """Apply the score transforms, the row limits and the masks to a panel: key j0 + p,
    query q0 + j (j < lanes).

    Lanes past ``lanes`` are padding (no query) and are left alone by the masks, so no mask
    row past the last query is read.
    """
    cdef Py_ssize_t p, j, cut, first, start
    cdef floating neg_inf = <floating>-CYATTN_INF
    cdef floating* row
    cdef const uint8_t* b_col
    cdef const floating* a_col
    if lim.has_softcap or lim.has_slope:
        panel_transform(panel, kb, nr, q0, j0, lim)
    # One loop per mask, each over the keys it touches only (every element still sees the
    # limits, then the bool mask, then the additive mask); a panel without masks costs
    # nothing (a do-nothing loop over the keys was ~2 % of an unmasked call).
    if lim.has_hi:
        # query i sees key j0 + p iff j0 + p < i + hi_off: lanes j < cut are cut off
        first = lim.hi_off + q0 - j0
        for p in range(first if first > 0 else 0, kb):
            row = panel + p * nr
            cut = j0 + p - lim.hi_off - q0 + 1
            if cut > nr:
                cut = nr
            for j in range(cut):
                row[j] = neg_inf
    if lim.has_lo:
        # query i sees key j0 + p iff j0 + p >= i + lo_off: lanes j >= start are cut off
        for p in range(kb):
            start = j0 + p - lim.lo_off - q0 + 1
            if start >= nr:
                break
            row = panel + p * nr
            for j in range(start if start > 0 else 0, nr):
                row[j] = neg_inf
    if bmask != NULL:
        for p in range(kb):
            row = panel + p * nr
            b_col = bmask + q0 * m_rs + (j0 + p) * m_cs
            if m_rs == 0:
                if not b_col[0]:
                    for j in range(lanes):
                        row[j] = neg_inf
            else:
                for j in range(lanes):
                    if not b_col[j * m_rs]:
                        row[j] = neg_inf
    if amask != NULL:
        for p in range(kb):
            row = panel + p * nr
            a_col = amask + q0 * m_rs + (j0 + p) * m_cs
            if m_rs == 0:
                for j in range(lanes):
                    row[j] = row[j] + a_col[0]
            else:
                for j in range(lanes):
                    row[j] = row[j] + a_col[j * m_rs]


cdef bint bool_block_empty(const uint8_t* bmask, Py_ssize_t m_rs, Py_ssize_t m_cs,
                           Py_ssize_t i_first, Py_ssize_t i_last, Py_ssize_t j0,
                           Py_ssize_t kb) noexcept nogil:
    """True if the bool mask permits no key j0 .. j0+kb for any query i_first .. i_last-1."""
    cdef Py_ssize_t i, j
    cdef const uint8_t* m_row
    cdef int any_kept = 0
    if m_rs == 0:
        i_last = i_first + 1                   # the mask is the same for every query
    for i in range(i_first, i_last):
        m_row = bmask + i * m_rs + j0 * m_cs
        if m_cs == 1:
            for j in range(kb):
                any_kept |= m_row[j]
        else:
            for j in range(kb):
                any_kept |= m_row[j * m_cs]
        if any_kept:
            return False
    return True


cdef inline void prefetch_rows(const floating* a, Py_ssize_t n_rows, Py_ssize_t rs,
                               Py_ssize_t n) noexcept nogil:
    """Prefetch rows 0 .. n_rows of a (row stride rs elements, n contiguous elements each):
    prefetch_row's lines of each, and the line of its last element (a row not aligned to a
    line ends in one more)."""
    cdef Py_ssize_t r
    for r in range(n_rows):
        prefetch_row(a + r * rs, n * <Py_ssize_t>sizeof(floating))
        cyattn_prefetch_r(a + r * rs + n - 1)


cdef void fused_attention_task(const void* q, Py_ssize_t q_rs, Py_ssize_t q_cs, int q_fmt,
                               const void* k, Py_ssize_t k_rs, Py_ssize_t k_cs,
                               const void* v, Py_ssize_t v_rs, Py_ssize_t v_cs, int kv_fmt,
                               const uint8_t* bmask, const floating* amask,
                               Py_ssize_t m_rs, Py_ssize_t m_cs,
                               floating* out, Py_ssize_t o_rs, floating* lse,
                               Py_ssize_t i0, Py_ssize_t rows, Py_ssize_t S,
                               Py_ssize_t E, Py_ssize_t Ev, floating scale,
                               const RowLimits* lim,
                               floating* qt_packed, floating* k_packed, floating* vt_packed,
                               floating* tile, floating* ot, Py_ssize_t ld_o,
                               floating* row_m, floating* row_l, floating* factor,
                               bint want_lse, float* stage) noexcept nogil:
    """Rows i0 .. i0+rows of one (batch, head) by the online softmax over key blocks of KB.

    Transposed formulation: per key block, S^T = K Q^T is computed straight into ``tile`` in
    the packed-panel layout (nr query lanes per panel, one row per key) that the next product
    reads as its B operand, so P is never repacked; the column softmax runs across query
    lanes (vectorised); then O^T += V^T P^T. Only the keys lo(first row) .. hi(last row) are
    visited (_attention_variants.pxi); per block, query panels whose rows see none of its keys
    are skipped, as are blocks a bool mask removes entirely, and a panel computes only the
    keys from its first row's lo to its last row's hi. At the end out = (O^T)^T / sum and
    lse = max + log(sum), the sink merged in. Without ``want_lse`` (the caller discards lse)
    max + sum is stored instead: it is inf or NaN exactly when max + log(sum) is (sum is at
    least 1 and at most S + 1), which is all that redo_nonfinite_rows reads, and it saves a log
    per row (2-3 % of a call with L = S = 128). Rows at or past the query length are not
    computed: output 0, lse -inf.

    q (q_fmt != 0) and k, v (kv_fmt != 0) may hold 16-bit elements (float32 compute only):
    each block is then widened into ``stage`` (row-major) and packed from there, so the packed
    operands, and the results, are those of the float32 call on the widened values.
    """
    cdef Py_ssize_t mr = MR if floating is float else MRD
    cdef Py_ssize_t nr = NR if floating is float else NRD
    cdef Py_ssize_t live = lim.lend - i0 if lim.lend - i0 < rows else rows
    cdef Py_ssize_t panels, kv_beg, kv_end, j0, kb, kq, ks, jp, jp0, jp1, ir, pc, kc, r, e
    cdef Py_ssize_t first_q, last_q, lanes, q_first, n_keys
    cdef floating inv, acc, w, f, l2, m2
    cdef bint v_bad, rescale, narrow, first, v_ready, pf_v
    # which query panels' O^T columns hold sums yet: a panel's first P V product overwrites
    # them (the same bits as zeroing then accumulating: the tiles' sums start at +0, so
    # none is -0, and s + 0 == s), and only panels never written are zeroed at the end
    cdef unsigned char ot_set[QG_DENSE]
    cdef floating* o_row
    cdef floating* panel
    cdef floating* ot_col
    cdef const floating* v_blk                  # the block's values: V itself, or widened
    cdef Py_ssize_t vb_rs, vb_cs
    live = 0 if live < 0 else live
    for r in range(live, rows):                 # past the query length: output 0, lse -inf
        for e in range(Ev):
            out[r * o_rs + e] = 0
        lse[r] = <floating>-CYATTN_INF
    rows = live
    if rows == 0:
        return
    panels = (rows + nr - 1) // nr
    for r in range(panels * nr):
        row_m[r] = <floating>-CYATTN_INF
        row_l[r] = 0
    for jp in range(panels):
        ot_set[jp] = 0
    kv_beg = row_lo(lim, i0)                    # the first key the first row may see
    kv_end = row_hi(lim, i0 + rows - 1)         # one past the last key any row here may see
    if kv_end > kv_beg:                         # Q^T: E x rows
        if floating is float and q_fmt != 0:
            widen_block(<const uint16_t*>q + i0 * q_rs, rows, E, q_rs, q_cs, q_fmt, stage)
            pack_b(E, rows, stage, 1, E, qt_packed, nr)
        else:
            pack_b(E, rows, <const floating*>q + i0 * q_rs, q_cs, q_rs, qt_packed, nr)
    j0 = (kv_beg // KB) * KB                    # blocks start at multiples of KB
    while j0 < kv_end:
        kb = kv_end - j0 if kv_end - j0 < KB else KB
        jp0 = 0
        if lim.has_hi:                          # queries before first_q see none of the keys
            first_q = j0 - lim.hi_off + 1 - i0
            jp0 = 0 if first_q < 0 else first_q // nr
        jp1 = panels
        if lim.has_lo:                          # queries from last_q on see none of them
            last_q = j0 + kb - lim.lo_off - i0
            last_q = 0 if last_q < 0 else last_q
            jp1 = (last_q + nr - 1) // nr
            jp1 = panels if jp1 > panels else jp1
        if jp1 <= jp0 or (bmask != NULL and bool_block_empty(
                bmask, m_rs, m_cs, i0 + jp0 * nr,
                i0 + jp1 * nr if i0 + jp1 * nr < i0 + rows else i0 + rows, j0, kb)):
            j0 += KB
            continue
        if floating is float and kv_fmt != 0:  # K block: kb x E
            widen_block(<const uint16_t*>k + j0 * k_rs, kb, E, k_rs, k_cs, kv_fmt, stage)
            pack_a(kb, E, stage, E, 1, k_packed, mr)
        else:
            pack_a(kb, E, <const floating*>k + j0 * k_rs, k_rs, k_cs, k_packed, mr)
        # V^T is packed when the block's first P V product needs it, not here: the value
        # rows are prefetched meanwhile, as the first panel's score tiles reach their keys
        # (pf_v), so that their loads from L3 or memory overlap those products instead of
        # stalling a packing loop that has nothing else to do (pack_a 8.1 -> 6.6 % of an SDPA
        # (8,8,128,64) call's samples on Zen 3, 1 thread; A/B 1.005-1.023). Only float32
        # values with unit column stride are prefetched (16-bit ones are widened first).
        v_bad = False
        v_ready = False
        v_blk, vb_rs, vb_cs = <const floating*>v + j0 * v_rs, v_rs, v_cs
        for jp in range(jp0, jp1):
            lanes = rows - jp * nr if rows - jp * nr < nr else nr
            q_first = i0 + jp * nr
            # keys ks .. kq of the block: from the first lane's lo (rounded down to a
            # micro-tile of keys) to the last lane's hi
            kq = row_hi(lim, q_first + lanes - 1) - j0
            kq = kb if kq > kb else kq
            ks = row_lo(lim, q_first) - j0
            ks = 0 if ks < 0 else (ks // mr) * mr
            if ks >= kq:
                continue                        # no lane sees a key of this block
            n_keys = kq - ks
            panel = tile + ks * nr              # one panel at a time: KB x nr scratch
            # scores^T for this query panel: (kb x E) @ (E x nr), into the panel layout
            ir = ks
            # a panel of at most 8 lanes: 12 keys x 8 lanes at a time (_cyattn_tile_narrow.h),
            # the padding lanes' scores set to 0 as the zero-padded Q^T gives them
            narrow = (floating is float and CYATTN_HAVE_TILE12X8 and MR == 4 and lanes <= 8
                      and E > 0)
            pf_v = not v_ready and Ev > 0 and kv_fmt == 0 and v_cs == 1
            while narrow and kq - ir >= 12:
                if pf_v:
                    prefetch_rows(<const floating*>v + (j0 + ir) * v_rs, 12, v_rs, Ev)
                pc = 0
                while pc < E:
                    kc = E - pc if E - pc < KC else KC
                    cyattn_tile12x8_f32(kc, <const float*>k_packed + ir * E + pc * mr, mr * E,
                                        <const float*>qt_packed + jp * E * nr + pc * nr, nr,
                                        <float*>tile + ir * nr, nr, <float>scale, pc == 0)
                    pc += KC
                for r in range(ir, ir + 12):
                    for e in range(8, nr):
                        tile[r * nr + e] = 0
                ir += 12
            while ir < kq:
                if pf_v:
                    prefetch_rows(<const floating*>v + (j0 + ir) * v_rs,
                                  kq - ir if kq - ir < mr else mr, v_rs, Ev)
                if E <= 0:
                    for r in range(ir * nr, (ir + mr if ir + mr < kq else kq) * nr):
                        tile[r] = 0
                pc = 0
                while pc < E:
                    kc = E - pc if E - pc < KC else KC
                    if floating is float:
                        micro_kernel_f32(kc, k_packed + ir * E + pc * mr,
                                         qt_packed + jp * E * nr + pc * nr,
                                         tile + ir * nr, nr, 1,
                                         kq - ir if kq - ir < mr else mr, nr, scale, pc == 0)
                    else:
                        micro_kernel_f64(kc, k_packed + ir * E + pc * mr,
                                         qt_packed + jp * E * nr + pc * nr,
                                         tile + ir * nr, nr, 1,
                                         kq - ir if kq - ir < mr else mr, nr, scale, pc == 0)
                    pc += KC
                ir += mr
            panel_masks(panel, n_keys, nr, lanes, q_first, j0 + ks, bmask, amask, m_rs, m_cs,
                        lim)
            panel_online_softmax(panel, n_keys, row_m + jp * nr, row_l + jp * nr, factor)
            if Ev <= 0:
                continue
            if not v_ready:
                if floating is float and kv_fmt != 0:
                    widen_block(<const uint16_t*>v + j0 * v_rs, kb, Ev, v_rs, v_cs, kv_fmt,
                                stage)
                    v_blk, vb_rs, vb_cs = stage, Ev, 1
                pack_a(Ev, kb, v_blk, vb_cs, vb_rs, vt_packed, mr)    # V^T: Ev x kb
                v_bad = has_nonfinite(vt_packed, 1, round_up(Ev, mr) * kb, 0, 1)
                v_ready = True
            first = not ot_set[jp]
            ot_set[jp] = 1
            rescale = False
            for r in range(nr):
                rescale = rescale | (factor[r] != 1)
            if rescale and not first:           # x * 1 == x: skip when no lane's max grew
                for e in range(Ev):
                    ot_col = ot + e * ld_o + jp * nr
                    for r in range(nr):
                        ot_col[r] = ot_col[r] * factor[r]
            if v_bad:
                # inf/NaN among these values: the same sums, in the same order, over the keys
                # with a nonzero weight only, so a masked key's value is never read
                for e in range(Ev):
                    ot_col = ot + e * ld_o + jp * nr
                    for r in range(nr):
                        acc = 0
                        for pc in range(n_keys):
                            w = panel[pc * nr + r]
                            if w != 0:
                                if floating is float:
                                    acc = CYATTN_MULADD_F32(
                                        w, v_blk[(ks + pc) * vb_rs + e * vb_cs], acc)
                                else:
                                    acc = CYATTN_MULADD_F64(
                                        w, v_blk[(ks + pc) * vb_rs + e * vb_cs], acc)
                        ot_col[r] = acc if first else ot_col[r] + acc
                continue
            # O^T += V^T (Ev x n_keys) @ P^T (n_keys x nr); a key past kq has weight 0 in
            # every lane, and so has one before ks
            ir = 0
            while narrow and Ev - ir >= 12:     # 12 value dimensions x 8 lanes at a time
                pc = 0
                while pc < n_keys:
                    kc = n_keys - pc if n_keys - pc < KC else KC
                    cyattn_tile12x8_f32(kc, <const float*>vt_packed + ir * kb + (ks + pc) * mr,
                                        mr * kb, <const float*>panel + pc * nr, nr,
                                        <float*>ot + ir * ld_o + jp * nr, ld_o, 1,
                                        first and pc == 0)
                    pc += KC
                ir += 12
            while ir < Ev:
                pc = 0
                while pc < n_keys:
                    kc = n_keys - pc if n_keys - pc < KC else KC
                    if floating is float:
                        micro_kernel_f32(kc, vt_packed + ir * kb + (ks + pc) * mr,
                                         panel + pc * nr,
                                         ot + ir * ld_o + jp * nr, ld_o, 1,
                                         Ev - ir if Ev - ir < mr else mr, nr, 1,
                                         first and pc == 0)
                    else:
                        micro_kernel_f64(kc, vt_packed + ir * kb + (ks + pc) * mr,
                                         panel + pc * nr,
                                         ot + ir * ld_o + jp * nr, ld_o, 1,
                                         Ev - ir if Ev - ir < mr else mr, nr, 1,
                                         first and pc == 0)
                    pc += KC
                ir += mr
        j0 += KB
    for jp in range(panels if Ev > 0 else 0):   # panels no key reached: O^T = 0
        if not ot_set[jp]:
            for e in range(Ev):
                for r in range(nr):
                    ot[e * ld_o + jp * nr + r] = 0
    if floating is float:
        # the rows' 1 / sum into row_l (no longer needed), lse as below, then O^T into the
        # output rows in 8 x 8 blocks (_cyattn_transpose.h); a fully masked row is then zeroed
        for r in range(rows):
            sink_merge(lim, row_m[r], row_l[r], &f, &l2, &m2)
            row_l[r] = f / l2 if l2 != 0 else 0
            if l2 == 0:
                lse[r] = <floating>-CYATTN_INF
            elif want_lse:
                lse[r] = m2 + <floating>log(l2)
            else:
                lse[r] = m2 + l2
        if Ev > 0:
            cyattn_transpose_scale_f32(ot, ld_o, out, o_rs, rows, Ev, row_l)
        for r in range(rows):
            if lse[r] == <floating>-CYATTN_INF and row_l[r] == 0:
                o_row = out + r * o_rs
                for e in range(Ev):
                    o_row[e] = 0
    else:
        for r in range(rows):
            o_row = out + r * o_rs
            sink_merge(lim, row_m[r], row_l[r], &f, &l2, &m2)
            if l2 == 0:                         # fully masked: output 0, lse -inf
                for e in range(Ev):
                    o_row[e] = 0
                lse[r] = <floating>-CYATTN_INF
                continue
            inv = f / l2
            for e in range(Ev):
                o_row[e] = ot[e * ld_o + r] * inv
            if want_lse:
                lse[r] = m2 + <floating>log(l2)
            else:
                lse[r] = m2 + l2


cdef int attention_worker(const void* q, const int64_t* q_off, Py_ssize_t q_rs,
                          Py_ssize_t q_cs, int q_fmt,
                          const void* k, const int64_t* k_off, Py_ssize_t k_rs, Py_ssize_t k_cs,
                          const void* v, const int64_t* v_off, Py_ssize_t v_rs, Py_ssize_t v_cs,
                          int kv_fmt,
                          const uint8_t* bmask, const floating* amask, const int64_t* m_off,
                          Py_ssize_t m_rs, Py_ssize_t m_cs,
                          floating* out, const int64_t* o_off, Py_ssize_t o_rs, floating* lse,
                          Py_ssize_t batch, Py_ssize_t L, Py_ssize_t S, Py_ssize_t E,
                          Py_ssize_t Ev, floating scale, const AttnVariant* var,
                          Py_ssize_t qg, bint want_lse, int* half_redo,
                          Py_ssize_t* deal) noexcept nogil:
    """Fused attention tasks with this worker's own scratch, each the next one of the call's
    counter *deal (cyattn_next_task); 1 if the scratch cannot be allocated. See
    fused_attention."""
    cdef Py_ssize_t groups = (L + qg - 1) // qg
    cdef Py_ssize_t ntasks = batch * groups
    cdef Py_ssize_t t, bi, i0, rows, mo, ob
    cdef RowLimits lim
    cdef Py_ssize_t nr = NR if floating is float else NRD
    cdef Py_ssize_t mr = MR if floating is float else MRD
    cdef Py_ssize_t qlanes = round_up(qg if qg < L else L, nr)
    cdef Py_ssize_t e1 = E if E > 0 else 1
    cdef Py_ssize_t ev1 = Ev if Ev > 0 else 1
    cdef size_t bytes_q = <size_t>(qlanes * e1) * sizeof(floating)
    cdef size_t bytes_k = <size_t>(round_up(KB, mr) * e1) * sizeof(floating)
    cdef size_t bytes_v = <size_t>(round_up(ev1, mr) * KB) * sizeof(floating)
    cdef size_t bytes_tile = <size_t>(nr * KB) * sizeof(floating)
    # O^T rows one cache line longer than the query lanes: at 1024 lanes the rows of a
    # micro-tile would be 4 KiB apart and fall into one L1 set
    cdef Py_ssize_t ld_o = qlanes + 64 // sizeof(floating)
    cdef size_t bytes_o = <size_t>(ld_o * ev1) * sizeof(floating)
    cdef size_t bytes_rows = <size_t>(3 * qlanes) * sizeof(floating)
    # 16-bit inputs: one block (the query group, a key block or a value block) widened
    cdef Py_ssize_t n_stage = qlanes * e1
    cdef size_t bytes_stage = 0
    cdef Py_ssize_t esz = <Py_ssize_t>sizeof(floating)
    cdef Py_ssize_t q_esz = 2 if q_fmt != 0 else esz
    cdef Py_ssize_t kv_esz = 2 if kv_fmt != 0 else esz
    cdef float* stage = NULL
    cdef Py_ssize_t r
    cdef void* raw
    if q_fmt != 0 or kv_fmt != 0:
        n_stage = n_stage if n_stage > KB * e1 else KB * e1
        n_stage = n_stage if n_stage > KB * ev1 else KB * ev1
        bytes_stage = <size_t>n_stage * sizeof(float)
    raw = malloc(bytes_q + bytes_k + bytes_v + bytes_tile + bytes_o + bytes_rows + bytes_stage
                 + 8 * ALIGN)
    cdef floating* qt_packed
    cdef floating* k_packed
    cdef floating* vt_packed
    cdef floating* tile
    cdef floating* ot
    cdef floating* row_m
    if raw == NULL:
        return 1
    qt_packed = <floating*>align_ptr(raw)
    k_packed = <floating*>align_ptr(<char*>qt_packed + bytes_q)
    vt_packed = <floating*>align_ptr(<char*>k_packed + bytes_k)
    tile = <floating*>align_ptr(<char*>vt_packed + bytes_v)
    ot = <floating*>align_ptr(<char*>tile + bytes_tile)
    row_m = <floating*>align_ptr(<char*>ot + bytes_o)
    if bytes_stage:
        stage = <float*>align_ptr(<char*>row_m + bytes_rows)
    t = cyattn_next_task(deal)
    while t < ntasks:
        bi = t % batch
        i0 = (t // batch) * qg
        rows = L - i0 if L - i0 < qg else qg
        mo = m_off[bi] if m_off != NULL else 0
        ob = (o_off[bi] if o_off != NULL else bi * L * o_rs) + i0 * o_rs
        row_limits(var, bi, L, S, &lim)
        fused_attention_task(<const char*>q + q_off[bi] * q_esz, q_rs, q_cs, q_fmt,
                             <const char*>k + k_off[bi] * kv_esz, k_rs, k_cs,
                             <const char*>v + v_off[bi] * kv_esz, v_rs, v_cs, kv_fmt,
                             bmask + mo if bmask != NULL else NULL,
                             amask + mo if amask != NULL else NULL, m_rs, m_cs,
                             out + ob, o_rs, lse + bi * L + i0,
                             i0, rows, S, E, Ev, scale, &lim,
                             qt_packed, k_packed, vt_packed, tile, ot, ld_o,
                             row_m, row_m + qlanes, row_m + 2 * qlanes, want_lse, stage)
        if stage != NULL:
            # 16-bit inputs: a non-finite row is redone by the caller on float32 inputs
            for r in range(rows):
                if row_nonfinite(out + ob + r * o_rs, lse[bi * L + i0 + r], Ev):
                    half_redo[0] = 1
        elif redo_nonfinite_rows(<const floating*>q + q_off[bi], q_rs, q_cs,
                               <const floating*>k + k_off[bi], k_rs, k_cs,
                               <const floating*>v + v_off[bi], v_rs, v_cs,
                               bmask + mo if bmask != NULL else NULL,
                               amask + mo if amask != NULL else NULL, m_rs, m_cs,
                               out + ob, o_rs, lse + bi * L + i0,
                               i0, rows, S, E, Ev, scale, &lim):
            free(raw)
            return 1
        t = cyattn_next_task(deal)
    free(raw)
    return 0


cdef void fused_attention(const void* q, const int64_t* q_off, Py_ssize_t q_rs, Py_ssize_t q_cs,
                         int q_fmt,
                         const void* k, const int64_t* k_off, Py_ssize_t k_rs, Py_ssize_t k_cs,
                         const void* v, const int64_t* v_off, Py_ssize_t v_rs, Py_ssize_t v_cs,
                         int kv_fmt,
                         const uint8_t* bmask, const floating* amask, const int64_t* m_off,
                         Py_ssize_t m_rs, Py_ssize_t m_cs,
                         floating* out, const int64_t* o_off, Py_ssize_t o_rs, floating* lse,
                         Py_ssize_t batch, Py_ssize_t L, Py_ssize_t S, Py_ssize_t E, Py_ssize_t Ev,
                         floating scale, const AttnVariant* var, Py_ssize_t qg,
                         bint want_lse, int n_threads, int* status,
                         int* half_redo) noexcept nogil:
    """Tasks (query group of qg rows, batch entry) in parallel, each thread taking the next
    task in order as it finishes one (a shared counter, cyattn_next_task).

    Task t covers batch entry t % batch and query group t // batch, so that consecutive tasks
    belong to different heads and a causal mask's cheap early groups and expensive late ones
    spread over the threads. Dealt out round-robin instead (thread w: w, w + n_threads, ...),
    SDPA (8,8,128,64) at 2 threads on Zen 3 spent about 10 % of its threads' time spinning at
    the region's end barrier, whichever thread had met a slower stretch waiting for the other.
    Which thread runs a task changes no bits. Scratch per thread is O(tile): packed Q^T
    (E x qg), one key block of K (KB x E) and V^T (Ev x KB), the score tile (KB x qg) and the
    output accumulator O^T (Ev x qg), allocated once per call. Rows whose result is not finite
    are redone by two_pass_rows (see there), except with 16-bit inputs (q_fmt, kv_fmt != 0:
    see fused_attention_task), where half_redo is set to 1 instead and the caller redoes the
    call on float32 inputs. One thread runs without an OpenMP region.
    """
    cdef Py_ssize_t w
    cdef Py_ssize_t deal = 0
    if batch <= 0 or L <= 0:
        return
    if n_threads <= 1:
        if attention_worker(q, q_off, q_rs, q_cs, q_fmt, k, k_off, k_rs, k_cs, v, v_off, v_rs,
                            v_cs, kv_fmt, bmask, amask, m_off, m_rs, m_cs, out, o_off, o_rs, lse, batch, L,
                            S, E, Ev, scale, var, qg, want_lse, half_redo, &deal):
            status[0] = 1
        return
    for w in prange(n_threads, num_threads=n_threads, schedule='static', chunksize=1):
        if attention_worker(q, q_off, q_rs, q_cs, q_fmt, k, k_off, k_rs, k_cs, v, v_off, v_rs,
                            v_cs, kv_fmt, bmask, amask, m_off, m_rs, m_cs, out, o_off, o_rs, lse, batch, L,
                            S, E, Ev, scale, var, qg, want_lse, half_redo, &deal):
            status[0] = 1
