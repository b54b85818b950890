# The two-pass attention path: scores for a block of rows materialised, each row normalised
# before P V. It runs only for rows whose fused or decode result was not finite.
#
# Design
# ------
# * rows whose fused or decode result is not finite (NaN/inf inputs, or a weighted sum of huge
#   finite values that overflows before normalisation) are redone by the two-pass path, which
#   materialises QB x S scores per block, normalises the weights before P V and never reads a
#   value whose weight is exactly 0: the documented inf/NaN results, at two-pass cost, only for
#   those rows.

cdef bint has_nonfinite(const floating* v, Py_ssize_t rows, Py_ssize_t cols,
                        Py_ssize_t rs, Py_ssize_t cs) noexcept nogil:
    """True if v[:rows, :cols] holds an inf or NaN (x - x is then NaN, else 0)."""
    cdef Py_ssize_t i, j
    cdef int bad = 0
    cdef const floating* v_row
    for i in range(rows):
        v_row = v + i * rs
        if floating is float and cs == 1 and CYATTN_HAVE_TRANSPOSE:    # AVX, NEON (_cyattn_transpose.h)
            bad = cyattn_any_nonfinite_f32(v_row, cols)
        elif cs == 1:               # unit stride: an integer OR reduction
            for j in range(cols):
                bad |= (v_row[j] - v_row[j]) != 0
        else:
            for j in range(cols):
                bad |= (v_row[j * cs] - v_row[j * cs]) != 0
        if bad:
            return True
    return False


cdef void two_pass_block(const floating* q, Py_ssize_t q_rs, Py_ssize_t q_cs,
                         const floating* kt_packed, const floating* v_packed,
                         const uint8_t* bmask, const floating* amask,
                         Py_ssize_t m_rs, Py_ssize_t m_cs,
                         floating* out, Py_ssize_t o_rs, floating* lse,
                         Py_ssize_t i0, Py_ssize_t rows, Py_ssize_t S,
                         Py_ssize_t E, Py_ssize_t Ev, floating scale,
                         const RowLimits* lim,
                         const floating* v, Py_ssize_t v_rs, Py_ssize_t v_cs, bint v_nonfinite,
                         floating* scores, Py_ssize_t ld_scores,
                         floating* q_packed, floating* p_packed) noexcept nogil:
    """Rows i0 .. i0+rows of one (batch, head): out rows (stride o_rs) and their lse.

    ``kt_packed`` and ``v_packed`` hold K^T and V of this (batch, head) packed once over all S
    keys. Scores for the block go to ``scores``; each row is masked and turned into its softmax
    weights, then multiplied by V. The weights are normalised before the product (not after,
    as flash-attention does) so that a weighted sum of huge finite values cannot overflow and a
    weight that rounds to exactly 0 skips its value.
    """
    cdef Py_ssize_t s_lim, hi, lo, r, i, j, e
    cdef Py_ssize_t mr = MR if floating is float else MRD
    cdef floating* row
    cdef floating* o_row
    cdef floating m, total, w, f, l2, m2
    cdef const floating* v_row
    s_lim = row_hi(lim, i0 + rows - 1)          # one past the last key any row here may see
    if s_lim > 0:
        pack_a(rows, E, q + i0 * q_rs, q_rs, q_cs, q_packed, mr)
        gemm_packed(rows, s_lim, E, scale, q_packed, E, kt_packed, E,
                    scores, ld_scores, 1, True)
    for r in range(rows):
        i = i0 + r
        row = scores + r * ld_scores
        if i >= lim.lend:                       # past the query length: output 0, lse -inf
            row_fill(row, s_lim, <floating>0)
            lse[r] = <floating>-CYATTN_INF
            continue
        hi = row_hi(lim, i)
        hi = s_lim if hi > s_lim else hi
        lo = row_lo(lim, i)
        lo = hi if lo > hi else lo
        if lim.has_softcap or lim.has_slope:
            row_transform(row + lo, hi - lo, i, lo, lim)
        row_fill(row, lo, <floating>-CYATTN_INF)
        if bmask != NULL or amask != NULL:
            row_mask_inplace(row, hi,
                             bmask + i * m_rs if bmask != NULL else NULL, m_cs,
                             amask + i * m_rs if amask != NULL else NULL, m_cs)
        m = row_max(row, hi)
        if m == -CYATTN_INF and not row_has_nan(row, hi):
            # fully masked: zero weights, zero output, lse -inf (or the sink's)
            row_fill(row, hi, <floating>0)
            sink_merge(lim, m, 0, &f, &l2, &m2)
            lse[r] = m2 + <floating>log(l2)
        elif m == -CYATTN_INF or m == CYATTN_INF:
            # NaN, or +inf (inf - inf): the row is NaN
            row_fill(row, hi, <floating>CYATTN_NAN)
            lse[r] = <floating>CYATTN_NAN
        else:
            total = row_exp_sum(row, hi, m, True)
            sink_merge(lim, m, total, &f, &l2, &m2)
            row_scale(row, hi, f / l2)
            lse[r] = m2 + <floating>log(l2)
        for j in range(hi, s_lim):
            row[j] = 0
    if s_lim == 0 or Ev == 0:
        for r in range(rows):
            for e in range(Ev):
                out[r * o_rs + e] = 0
        return
    if not v_nonfinite:
        pack_a(rows, s_lim, scores, ld_scores, 1, p_packed, mr)
        gemm_packed(rows, Ev, s_lim, 1, p_packed, s_lim, v_packed, S, out, o_rs, 1, True)
        return
    # V holds inf/NaN somewhere: sum only keys with a nonzero weight, so masked (zero-weight)
    # positions are never read into the output.
    for r in range(rows):
        row = scores + r * ld_scores
        o_row = out + r * o_rs
        for e in range(Ev):
            o_row[e] = 0
        for j in range(s_lim):
            w = row[j]
            if w != 0:
                v_row = v + j * v_rs
                for e in range(Ev):
                    o_row[e] += w * v_row[e * v_cs]


cdef bint row_nonfinite(const floating* out_row, floating lse_r, Py_ssize_t Ev) noexcept nogil:
    """True if an output of the row is inf/NaN or its lse is NaN/+inf."""
    if lse_r != lse_r or lse_r == CYATTN_INF:
        return True
    return has_nonfinite(out_row, 1, Ev, Ev, 1)


cdef int redo_nonfinite_rows(const floating* q, Py_ssize_t q_rs, Py_ssize_t q_cs,
                             const floating* k, Py_ssize_t k_rs, Py_ssize_t k_cs,
                             const floating* v, Py_ssize_t v_rs, Py_ssize_t v_cs,
                             const uint8_t* bmask, const floating* amask,
                             Py_ssize_t m_rs, Py_ssize_t m_cs,
                             floating* out, Py_ssize_t o_rs, floating* lse,
                             Py_ssize_t i0, Py_ssize_t rows, Py_ssize_t S,
                             Py_ssize_t E, Py_ssize_t Ev, floating scale,
                             const RowLimits* lim) noexcept nogil:
    """Redo, by the two-pass path, each run of rows whose fused result is not finite.

    Only those rows: a row's result then does not depend on which rows share its task, so
    results stay the same for any grouping and thread count. 1 if out of memory.
    """
    cdef Py_ssize_t r = 0, run_end
    while r < rows:
        if not row_nonfinite(out + r * o_rs, lse[r], Ev):
            r += 1
            continue
        run_end = r + 1
        while run_end < rows and row_nonfinite(out + run_end * o_rs, lse[run_end], Ev):
            run_end += 1
        if two_pass_rows(q, q_rs, q_cs, k, k_rs, k_cs, v, v_rs, v_cs, bmask, amask,
                         m_rs, m_cs, out + r * o_rs, o_rs, lse + r, i0 + r, run_end - r,
                         S, E, Ev, scale, lim):
            return 1
        r = run_end
    return 0


cdef int two_pass_rows(const floating* q, Py_ssize_t q_rs, Py_ssize_t q_cs,
                       const floating* k, Py_ssize_t k_rs, Py_ssize_t k_cs,
                       const floating* v, Py_ssize_t v_rs, Py_ssize_t v_cs,
                       const uint8_t* bmask, const floating* amask,
                       Py_ssize_t m_rs, Py_ssize_t m_cs,
                       floating* out, Py_ssize_t o_rs, floating* lse,
                       Py_ssize_t i0, Py_ssize_t rows, Py_ssize_t S,
                       Py_ssize_t E, Py_ssize_t Ev, floating scale,
                       const RowLimits* lim) noexcept nogil:
    """Rows i0 .. i0+rows by the two-pass path (scores of QB rows materialised, weights
    normalised before P V, zero-weight keys skipped when V is non-finite); 1 if out of memory.

    The fused path hands a block here when its result is not finite: the two-pass order is the
    one whose inf/NaN behaviour is documented (a huge finite V cannot overflow the weighted sum,
    a key whose weight is exactly 0 is never read). Scratch is allocated here, per call.
    """
    cdef Py_ssize_t nr = NR if floating is float else NRD
    cdef Py_ssize_t mr = MR if floating is float else MRD
    cdef Py_ssize_t s1 = S if S > 0 else 1
    cdef Py_ssize_t ld_scores = round_up(s1, 16)
    cdef Py_ssize_t qrows = round_up(QB, mr)
    cdef size_t bytes_s = <size_t>(QB * ld_scores) * sizeof(floating)
    cdef size_t bytes_p = <size_t>(qrows * s1) * sizeof(floating)
    cdef size_t bytes_q = <size_t>(qrows * (E if E > 0 else 1)) * sizeof(floating)
    cdef size_t bytes_kt = <size_t>(round_up(s1, nr) * (E if E > 0 else 1)) * sizeof(floating)
    cdef size_t bytes_v = <size_t>(s1 * round_up(Ev if Ev > 0 else 1, nr)) * sizeof(floating)
    cdef void* raw = malloc(bytes_s + bytes_p + bytes_q + bytes_kt + bytes_v + 5 * ALIGN)
    cdef floating* scores
    cdef floating* p_packed
    cdef floating* q_packed
    cdef floating* kt_packed
    cdef floating* v_packed
    cdef Py_ssize_t done = 0, n, live, r, e
    cdef bint v_nonfinite = False
    if raw == NULL:
        return 1
    scores = <floating*>align_ptr(raw)
    p_packed = <floating*>align_ptr(<char*>scores + bytes_s)
    q_packed = <floating*>align_ptr(<char*>p_packed + bytes_p)
    kt_packed = <floating*>align_ptr(<char*>q_packed + bytes_q)
    v_packed = <floating*>align_ptr(<char*>kt_packed + bytes_kt)
    if S > 0:
        pack_b(E, S, k, k_cs, k_rs, kt_packed, nr)
        pack_b(S, Ev, v, v_rs, v_cs, v_packed, nr)
        v_nonfinite = has_nonfinite(v, S, Ev, v_rs, v_cs)
    while done < rows:
        n = rows - done if rows - done < QB else QB
        two_pass_block(q, q_rs, q_cs, kt_packed, v_packed, bmask, amask, m_rs, m_cs,
                       out + done * o_rs, o_rs, lse + done, i0 + done, n, S, E, Ev, scale,
                       lim, v, v_rs, v_cs, v_nonfinite,
                       scores, ld_scores, q_packed, p_packed)
        done += n
    free(raw)
    if lim.has_sink and lim.sink != lim.sink:
        # a NaN sink takes part in every row's denominator, so it makes the row NaN (lse is
        # NaN already): also a row with no permitted key, whose weights are all 0
        live = lim.lend - i0 if lim.lend - i0 < rows else rows     # rows past the length stay 0
        for r in range(live):
            for e in range(Ev):
                out[r * o_rs + e] = <floating>CYATTN_NAN
    return 0
