# Attention variants shared by the fused, two-pass and decode paths: which keys each query row
# may see (causal, sliding window, per-sequence key and query lengths), the score transforms
# (logit softcap, ALiBi) and the attention sink's share of the softmax denominator.
#
# Design
# ------
# * One rule places every query row: row i of batch entry b sits at the aligned position
#   p(i) = i (top_left) or i + K_b - L_b (bottom_right), K_b / L_b the sequence's key and query
#   lengths (S and L without lengths: flash-attn varlen's and ONNX nonpad_kv_seqlen's rule).
#   Row i may see keys lo(i) <= j < hi(i): hi(i) = min(K_b, p(i) + 1 if causal,
#   p(i) + right + 1 with a right window), lo(i) = max(0, p(i) - left) with a left window.
#   lo and hi never decrease with i, so a group of rows needs the keys from lo(first row) to
#   hi(last row): key blocks, query panels and decode chunks outside that range are never
#   computed or read, which makes a window cost O(L x window) instead of O(L x S). Skipping a
#   block that every lane of a panel masks leaves its online-softmax state exactly as
#   processing it would (factor 1 or an all-zero state), so skipping changes no bit.
#   Rows i >= L_b give output 0 and lse -inf.
# * Score order: s = scale * q.k, then the softcap c tanh(s / c) (s times 1/c, rounded once:
#   a division per score cost a T = 512 call 8 %), then the ALiBi bias
#   -slope |p(i) - j|, then the masks (bool, causal, window, lengths remove a key; a float
#   mask is added), as flash-attn and ggml apply them.
# * A sink joins the denominator with no value. It is merged once per row at the end of each
#   path: with the row's (max m, sum l, accumulator o), m' = max(m, sink),
#   l' = l e^{m - m'} + e^{sink - m'}, output = o e^{m - m'} / l', lse = m' + log l'. A row with
#   no permitted key then gives 0 and lse = sink; sink = -inf changes nothing; sink = +inf takes
#   all the weight (output 0, lse +inf). A NaN sink makes the row NaN (lse NaN here; the row's
#   non-finite result sends it to the two-pass redo, which also sets an output row with no
#   permitted key to NaN).

cdef struct AttnVariant:
    bint causal
    bint bottom_right
    bint has_left           # window left side bounded
    bint has_right          # window right side bounded
    Py_ssize_t left
    Py_ssize_t right
    double softcap          # 0: none
    const int64_t* key_len  # per batch entry (C order of the batch shape), or NULL
    const int64_t* query_len
    const double* slopes    # ALiBi slope per batch entry, or NULL
    const double* sinks     # sink logit per batch entry, or NULL
    # 8-bit K/V (kv_fmt CYATTN_KV8_*, decode only): the float32 scale of key row j of batch
    # entry bi is k_scale[k_scale_off[bi] + j * k_scale_rs] (NULL: 1), likewise for values
    const float* k_scale
    const int64_t* k_scale_off
    Py_ssize_t k_scale_rs
    const float* v_scale
    const int64_t* v_scale_off
    Py_ssize_t v_scale_rs


cdef struct RowLimits:
    Py_ssize_t kend         # K_b: keys j >= kend take no part
    Py_ssize_t lend         # L_b: rows i >= lend give output 0, lse -inf
    Py_ssize_t pos_off      # p(i) = i + pos_off
    bint has_hi             # hi(i) = min(kend, i + hi_off)
    Py_ssize_t hi_off
    bint has_lo             # lo(i) = max(0, i + lo_off)
    Py_ssize_t lo_off
    bint has_softcap
    double softcap
    bint has_slope
    double slope
    bint has_sink
    double sink


cdef inline void row_limits(const AttnVariant* var, Py_ssize_t bi, Py_ssize_t L, Py_ssize_t S,
                            RowLimits* lim) noexcept nogil:
    """The limits of batch entry bi (lengths clipped to [0, S] and [0, L])."""
    cdef Py_ssize_t kend = S, lend = L, off = 0
    if var.key_len != NULL:
        kend = <Py_ssize_t>var.key_len[bi]
        kend = S if kend > S else (0 if kend < 0 else kend)
    if var.query_len != NULL:
        lend = <Py_ssize_t>var.query_len[bi]
        lend = L if lend > L else (0 if lend < 0 else lend)
    if var.bottom_right:
        off = kend - lend
    lim.kend = kend
    lim.lend = lend
    lim.pos_off = off
    lim.has_hi = var.causal or var.has_right
    lim.hi_off = 0
    if var.causal:
        lim.hi_off = off + 1
    if var.has_right and (not var.causal or off + var.right + 1 < lim.hi_off):
        lim.hi_off = off + var.right + 1
    lim.has_lo = var.has_left
    lim.lo_off = off - var.left if var.has_left else 0
    lim.has_softcap = var.softcap > 0
    lim.softcap = var.softcap
    lim.has_slope = var.slopes != NULL
    lim.slope = var.slopes[bi] if var.slopes != NULL else 0.0
    lim.has_sink = var.sinks != NULL
    lim.sink = var.sinks[bi] if var.sinks != NULL else 0.0


cdef inline Py_ssize_t row_hi(const RowLimits* lim, Py_ssize_t i) noexcept nogil:
    """One past the last key row i may see (0 if none)."""
    cdef Py_ssize_t h = lim.kend
    if lim.has_hi and i + lim.hi_off < h:
        h = i + lim.hi_off
    return h if h > 0 else 0


cdef inline Py_ssize_t row_lo(const RowLimits* lim, Py_ssize_t i) noexcept nogil:
    """The first key row i may see (may be >= row_hi: then it sees none)."""
    if lim.has_lo and i + lim.lo_off > 0:
        return i + lim.lo_off
    return 0


@cython.cdivision(True)
cdef void panel_transform(floating* panel, Py_ssize_t kb, Py_ssize_t nr, Py_ssize_t q0,
                          Py_ssize_t j0, const RowLimits* lim) noexcept nogil:
    """Softcap, then ALiBi, on a score panel: key j0 + p, query lane q0 + j (all nr lanes)."""
    cdef Py_ssize_t p, j, d0
    cdef floating c, inv_c, slope, d
    cdef floating* row
    if lim.has_softcap:
        c = <floating>lim.softcap
        inv_c = <floating>1 / c
        for p in range(kb):
            row = panel + p * nr
            for j in range(nr):
                row[j] = c * tanh_any(row[j] * inv_c)
    if lim.has_slope:
        slope = <floating>lim.slope
        for p in range(kb):
            row = panel + p * nr
            d0 = q0 + lim.pos_off - (j0 + p)           # p(q0 + j) - key = d0 + j
            for j in range(nr):
                d = <floating>(d0 + j if d0 + j >= 0 else -(d0 + j))
                row[j] = row[j] - slope * d


@cython.cdivision(True)
cdef void row_transform(floating* row, Py_ssize_t n, Py_ssize_t i, Py_ssize_t j0,
                        const RowLimits* lim) noexcept nogil:
    """Softcap, then ALiBi, on the scores of row i for keys j0 .. j0+n-1 (row[0] is j0)."""
    cdef Py_ssize_t j, d0
    cdef floating c, inv_c, slope, d
    if lim.has_softcap:
        c = <floating>lim.softcap
        inv_c = <floating>1 / c
        for j in range(n):
            row[j] = c * tanh_any(row[j] * inv_c)
    if lim.has_slope:
        slope = <floating>lim.slope
        d0 = i + lim.pos_off - j0
        for j in range(n):
            d = <floating>(d0 - j if d0 - j >= 0 else j - d0)
            row[j] = row[j] - slope * d


@cython.cdivision(True)
cdef inline void sink_merge(const RowLimits* lim, floating m, floating l, floating* factor,
                            floating* l_out, floating* m_out) noexcept nogil:
    """Merge the sink into a row state (max m, sum l): the accumulator is to be multiplied by
    factor[0] and divided by l_out[0]; lse = m_out[0] + log(l_out[0]). Without a sink: 1, l, m."""
    cdef floating sink, mm, b, f
    if not lim.has_sink:
        factor[0] = 1
        l_out[0] = l
        m_out[0] = m
        return
    sink = <floating>lim.sink
    mm = m if m > sink else sink
    if sink != sink:
        mm = sink                       # a NaN sink makes the row NaN
    b = <floating>1 if sink == mm else exp_any(sink - mm)
    f = <floating>1 if m == mm else exp_any(m - mm)
    factor[0] = f
    l_out[0] = l * f + b
    m_out[0] = mm
