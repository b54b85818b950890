# Softmax and log-softmax rows, masked and unmasked: the kernels behind cyattn.softmax and
# cyattn.log_softmax, and the row passes the two-pass attention path reuses.
#
# Design
# ------
# * softmax rows: three passes (max and min; exp and sum; scale) with LANES lane-wise partial
#   maxima and sums combined in a fixed order, so results do not depend on threads. Unmasked
#   rows run two at a time with fused loops (softmax_pair_to), the same bits as one by one
#   (float64, and float32 in the baseline variant).
# * float32 softmax and log-softmax rows, unmasked or under a bool mask of unit column stride,
#   take the explicit vectors of cyattn_softmax_row_f32 (_cyattn_softmax_rows.h) in the avx2
#   and avx512 variants, one row at a time: the same operations per lane in the same order, so
#   the same bits as the loops here (tests/test_kernels.py, *_match_the_general_path_bits);
#   against the loops on a Zen 3 host, 1.1-1.4x faster unmasked (1.2-1.3x more on inputs past
#   L2, from a prefetch of the next row) and 1.5-3x under a mask (issue 26). row_max_min,
#   row_exp_sum_to's shortened exp and row_scale use its passes for their float32 loops too.
# * unmasked float32 softmax and log-softmax rows of 32 or more elements go further: runs of
#   rows are software-pipelined (cyattn_softmax_rows_f32 via softmax_row_run), the exp pass of
#   one row carrying the max pass of the next and the last pass (scale or log) of the one
#   before, with the same bits per row; 1.2-1.4x faster than row by row (rows of 512 and
#   2048, Zen 5, 1 thread), which took softmax at 1 thread from 1.03-1.10x ONNX Runtime's to
#   1.3-1.5x on rows of 512, and log-softmax from 0.94-1.22x to 1.18-1.44x (rows of 128-2048).

cdef inline floating lanes_sum(floating* part) noexcept nogil:
    """part[0] + ... + part[LANES-1] combined pairwise (lane j with j + 16, then + 8, ...).

    Constant trip counts, so gcc emits a few vector adds instead of a scalar loop that goes
    through memory (it was a measurable part of a 128-element softmax row). Overwrites part.
    """
    cdef Py_ssize_t lane
    for lane in range(16):
        part[lane] += part[lane + 16]
    for lane in range(8):
        part[lane] += part[lane + 8]
    for lane in range(4):
        part[lane] += part[lane + 4]
    for lane in range(2):
        part[lane] += part[lane + 2]
    return part[0] + part[1]


cdef inline floating lanes_max(floating* part) noexcept nogil:
    """max(part[0:LANES]) by the same pairwise tree as lanes_sum (no NaN in part). Overwrites
    part."""
    cdef Py_ssize_t lane
    for lane in range(16):
        part[lane] = part[lane + 16] if part[lane + 16] > part[lane] else part[lane]
    for lane in range(8):
        part[lane] = part[lane + 8] if part[lane + 8] > part[lane] else part[lane]
    for lane in range(4):
        part[lane] = part[lane + 4] if part[lane + 4] > part[lane] else part[lane]
    for lane in range(2):
        part[lane] = part[lane + 2] if part[lane + 2] > part[lane] else part[lane]
    return part[1] if part[1] > part[0] else part[0]


cdef inline floating lanes_min(floating* part) noexcept nogil:
    """min(part[0:LANES]) by the pairwise tree of lanes_max (no NaN in part). Overwrites part."""
    cdef Py_ssize_t lane
    for lane in range(16):
        part[lane] = part[lane + 16] if part[lane + 16] < part[lane] else part[lane]
    for lane in range(8):
        part[lane] = part[lane + 8] if part[lane + 8] < part[lane] else part[lane]
    for lane in range(4):
        part[lane] = part[lane + 4] if part[lane + 4] < part[lane] else part[lane]
    for lane in range(2):
        part[lane] = part[lane + 2] if part[lane + 2] < part[lane] else part[lane]
    return part[1] if part[1] < part[0] else part[0]


cdef floating row_max(const floating* y, Py_ssize_t n) noexcept nogil:
    """Maximum of y[:n], ignoring NaN; -inf for an empty row."""
    cdef floating part[LANES]
    cdef floating v, m = <floating>-CYATTN_INF
    cdef Py_ssize_t j = 0, lane
    for lane in range(LANES):
        part[lane] = <floating>-CYATTN_INF
    while j + LANES <= n:
        for lane in range(LANES):
            v = y[j + lane]
            part[lane] = v if v > part[lane] else part[lane]
        j += LANES
    while j < n:
        v = y[j]
        m = v if v > m else m
        j += 1
    v = lanes_max(part)
    return v if v > m else m


cdef floating row_max_min(const floating* y, Py_ssize_t n, floating* mn) noexcept nogil:
    """row_max(y, n), and the minimum (ignoring NaN; +inf for an empty row) into mn[0]."""
    cdef floating part[LANES]
    cdef floating low[LANES]
    cdef floating v, m = <floating>-CYATTN_INF, lo = <floating>CYATTN_INF
    cdef Py_ssize_t j = 0, lane
    for lane in range(LANES):
        part[lane] = <floating>-CYATTN_INF
        low[lane] = <floating>CYATTN_INF
    if floating is float:
        if CYATTN_ROWK:                 # the same bits in explicit vectors
            cyattn_rows_max_min_f32(y, n, part, low)
            j = n - n % LANES
    while j + LANES <= n:
        for lane in range(LANES):
            v = y[j + lane]
            part[lane] = v if v > part[lane] else part[lane]
            low[lane] = v if v < low[lane] else low[lane]
        j += LANES
    while j < n:
        v = y[j]
        m = v if v > m else m
        lo = v if v < lo else lo
        j += 1
    v = lanes_min(low)
    mn[0] = v if v < lo else lo
    v = lanes_max(part)
    return v if v > m else m


cdef bint row_has_nan(const floating* y, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(n):
        if y[j] != y[j]:
            return True
    return False


cdef void row_fill(floating* y, Py_ssize_t n, floating value) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(n):
        y[j] = value


cdef floating row_exp_sum(floating* y, Py_ssize_t n, floating shift, bint store) noexcept nogil:
    """sum_j exp(y[j] - shift); with store, y[j] becomes exp(y[j] - shift)."""
    cdef floating part[LANES]
    cdef floating e, total = 0, tail = 0
    cdef Py_ssize_t j = 0, lane
    for lane in range(LANES):
        part[lane] = 0
    if store:
        while j + LANES <= n:
            for lane in range(LANES):
                e = exp_any(y[j + lane] - shift)
                y[j + lane] = e
                part[lane] += e
            j += LANES
        while j < n:
            e = exp_any(y[j] - shift)
            y[j] = e
            tail += e
            j += 1
    else:
        while j + LANES <= n:
            for lane in range(LANES):
                part[lane] += exp_any(y[j + lane] - shift)
            j += LANES
        while j < n:
            tail += exp_any(y[j] - shift)
            j += 1
    # fixed combination order: pairwise over the lanes, then the tail
    total = lanes_sum(part) + tail
    return total


cdef void row_scale(floating* y, Py_ssize_t n, floating factor) noexcept nogil:
    cdef Py_ssize_t j, j0 = 0
    if floating is float:
        if CYATTN_ROWK:
            cyattn_rows_scale_f32(y, n, factor)
            j0 = n - n % LANES
    for j in range(j0, n):
        y[j] = y[j] * factor


cdef void row_shift(floating* y, Py_ssize_t n, floating shift) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(n):
        y[j] = y[j] - shift


cdef floating softmax_inplace(floating* y, Py_ssize_t n, bint log_out) noexcept nogil:
    """Stable (log-)softmax of y[:n] in place; returns lse = max + log(sum exp(y - max)).

    A row with no finite candidate (all -inf, or n == 0) is fully masked: weights 0 (log: -inf),
    lse -inf. A NaN or +inf entry makes the whole row NaN (lse NaN).
    """
    cdef floating m, total
    m = row_max(y, n)
    if m == -CYATTN_INF:
        if row_has_nan(y, n):
            row_fill(y, n, <floating>CYATTN_NAN)
            return <floating>CYATTN_NAN
        row_fill(y, n, <floating>-CYATTN_INF if log_out else <floating>0)
        return <floating>-CYATTN_INF
    if m == CYATTN_INF:
        row_fill(y, n, <floating>CYATTN_NAN)
        return <floating>CYATTN_NAN
    if log_out:
        row_shift(y, n, m)
        total = row_exp_sum(y, n, 0, False)
        row_shift(y, n, <floating>log(total))
    else:
        total = row_exp_sum(y, n, m, True)
        row_scale(y, n, <floating>1 / total)
    return m + <floating>log(total)


cdef floating row_exp_sum_to(const floating* x, floating* y, Py_ssize_t n,
                             floating shift, bint nonpos) noexcept nogil:
    """y[j] = exp(x[j] - shift) for distinct rows x and y; returns the sum (as row_exp_sum).

    nonpos: the caller knows EXP_NORMAL <= x[j] - shift <= 0 for every j, so the shorter
    exp_nonpos gives the same bits as exp_any.
    """
    cdef floating part[LANES]
    cdef floating e, tail = 0
    cdef Py_ssize_t j = 0, lane
    for lane in range(LANES):
        part[lane] = 0
    if floating is float:
        if nonpos and CYATTN_ROWK:      # the same bits in explicit vectors
            cyattn_rows_exp_sum_f32(x, y, n, shift, part)
            j = n - n % LANES
    if nonpos:
        while j + LANES <= n:
            for lane in range(LANES):
                e = exp_nonpos(x[j + lane] - shift)
                y[j + lane] = e
                part[lane] += e
            j += LANES
    else:
        while j + LANES <= n:
            for lane in range(LANES):
                e = exp_any(x[j + lane] - shift)
                y[j + lane] = e
                part[lane] += e
            j += LANES
    while j < n:
        e = exp_any(x[j] - shift)
        y[j] = e
        tail += e
        j += 1
    return lanes_sum(part) + tail


cdef void softmax_row_to(const floating* x, floating* y, Py_ssize_t n) noexcept nogil:
    """Softmax of row x written to a distinct row y in three passes (max and min; exp and sum;
    scale), without first copying x to y; the same results as softmax_inplace (no lse).

    When no x - max is below EXP_NORMAL (no -inf, no huge spread: the usual row) the exps
    take the shorter exp_nonpos, which gives the same bits; this made the L=512 softmax
    ~25 % faster."""
    cdef floating m, mn, total
    cdef floating normal = EXP_NORMAL_F32 if floating is float else EXP_NORMAL_F64
    m = row_max_min(x, n, &mn)
    if m == -CYATTN_INF or m == CYATTN_INF:     # fully masked, NaN or +inf: the general rules
        memcpy(y, x, n * sizeof(floating))
        softmax_inplace(y, n, False)
        return
    total = row_exp_sum_to(x, y, n, m, mn - m >= normal)
    row_scale(y, n, <floating>1 / total)


cdef void log_softmax_row_to(const floating* x, floating* y, Py_ssize_t n) noexcept nogil:
    """Log-softmax of row x written to a distinct row y in three passes (max and min; exp and
    sum, the exps parked in y; y = (x - max) - log(sum)), without first copying x to y or
    shifting it in place: the same bits as softmax_inplace's log path (x - max, and its exp,
    are the values it computes), and the shorter exp_nonpos where no x - max is below
    EXP_NORMAL, as softmax_row_to. Two passes fewer than the copy and two shifts: float64
    rows of 128 to 2048 went from 0.93-1.06x PyTorch's log_softmax to 1.56-1.86x (1 thread,
    interleaved)."""
    cdef floating m, mn, lse_shift
    cdef floating normal = EXP_NORMAL_F32 if floating is float else EXP_NORMAL_F64
    cdef Py_ssize_t j
    m = row_max_min(x, n, &mn)
    if m == -CYATTN_INF or m == CYATTN_INF:     # fully masked, NaN or +inf: the general rules
        memcpy(y, x, n * sizeof(floating))
        softmax_inplace(y, n, True)
        return
    lse_shift = <floating>log(row_exp_sum_to(x, y, n, m, mn - m >= normal))
    for j in range(n):
        y[j] = (x[j] - m) - lse_shift


cdef void row_mask_inplace(floating* y, Py_ssize_t n,
                           const uint8_t* bmask, Py_ssize_t bstride,
                           const floating* amask, Py_ssize_t astride) noexcept nogil:
    """Apply a bool mask (False -> -inf) and/or an additive mask to y in place.

    One pointer, so the unit-stride loops vectorise without an aliasing check (gcc's check
    fails at run time, and picks the scalar loop, when source and target coincide)."""
    cdef Py_ssize_t j
    cdef floating neg_inf = <floating>-CYATTN_INF
    if bmask != NULL:
        if bstride == 1:
            for j in range(n):
                y[j] = y[j] if bmask[j] else neg_inf
        else:
            for j in range(n):
                y[j] = y[j] if bmask[j * bstride] else neg_inf
    if amask != NULL:
        if astride == 1:
            for j in range(n):
                y[j] = y[j] + amask[j]
        else:
            for j in range(n):
                y[j] = y[j] + amask[j * astride]


cdef void row_load_masked(const floating* x, floating* y, Py_ssize_t n,
                          const uint8_t* bmask, Py_ssize_t bstride,
                          const floating* amask, Py_ssize_t astride) noexcept nogil:
    """y = x with the masks applied (a bool-masked x value is overwritten with -inf, so it
    never reaches the sums)."""
    if x != y:
        memcpy(y, x, n * sizeof(floating))
    row_mask_inplace(y, n, bmask, bstride, amask, astride)


cdef inline void softmax_row(const floating* x, floating* y, Py_ssize_t n,
                             const uint8_t* bmask, Py_ssize_t b_cs,
                             const floating* amask, Py_ssize_t a_cs,
                             bint log_out, bint direct) noexcept nogil:
    """One row of softmax_row_tasks: for float32 rows, unmasked or under a bool mask of unit
    column stride, cyattn_softmax_row_f32's explicit vectors where the row allows (the same
    bits as below); else straight from x to y for an unmasked softmax into a distinct row
    (direct), else a masked copy, then in place."""
    if floating is float:
        if CYATTN_ROWK and n >= LANES and amask == NULL and (bmask == NULL or b_cs == 1):
            if cyattn_softmax_row_f32(x, y, n, bmask, log_out):
                return
    if direct:
        softmax_row_to(x, y, n)
    elif log_out and bmask == NULL and amask == NULL and x != y:
        log_softmax_row_to(x, y, n)
    else:
        row_load_masked(x, y, n, bmask, b_cs, amask, a_cs)
        softmax_inplace(y, n, log_out)


cdef void softmax_pair_to(const floating* x0, floating* y0, const floating* x1, floating* y1,
                          Py_ssize_t n) noexcept nogil:
    """softmax_row_to of two rows at once, with the same bits: each row's operations and their
    order are those of softmax_row_to, but the two rows' loops are fused, so one row's
    reductions (max, min, sum: dependency chains across the lanes) overlap the other's work.
    A short row is latency-bound on them (a 128-element row ran ~1.2x faster paired)."""
    cdef floating part0[LANES]
    cdef floating low0[LANES]
    cdef floating part1[LANES]
    cdef floating low1[LANES]
    cdef floating ebuf0[LANES]
    cdef floating ebuf1[LANES]
    cdef floating v, w, e0, e1, m0, m1, mn0, mn1, t0 = 0, t1 = 0
    cdef floating normal = EXP_NORMAL_F32 if floating is float else EXP_NORMAL_F64
    cdef Py_ssize_t j = 0, lane
    for lane in range(LANES):
        part0[lane] = <floating>-CYATTN_INF
        part1[lane] = <floating>-CYATTN_INF
        low0[lane] = <floating>CYATTN_INF
        low1[lane] = <floating>CYATTN_INF
    while j + LANES <= n:
        for lane in range(LANES):
            v = x0[j + lane]
            w = x1[j + lane]
            part0[lane] = v if v > part0[lane] else part0[lane]
            low0[lane] = v if v < low0[lane] else low0[lane]
            part1[lane] = w if w > part1[lane] else part1[lane]
            low1[lane] = w if w < low1[lane] else low1[lane]
        j += LANES
    m0 = m1 = <floating>-CYATTN_INF
    mn0 = mn1 = <floating>CYATTN_INF
    while j < n:
        v = x0[j]
        w = x1[j]
        m0 = v if v > m0 else m0
        mn0 = v if v < mn0 else mn0
        m1 = w if w > m1 else m1
        mn1 = w if w < mn1 else mn1
        j += 1
    v = lanes_max(part0)
    m0 = v if v > m0 else m0
    v = lanes_min(low0)
    mn0 = v if v < mn0 else mn0
    v = lanes_max(part1)
    m1 = v if v > m1 else m1
    v = lanes_min(low1)
    mn1 = v if v < mn1 else mn1
    if (m0 == -CYATTN_INF or m0 == CYATTN_INF or m1 == -CYATTN_INF or m1 == CYATTN_INF
            or not (mn0 - m0 >= normal) or not (mn1 - m1 >= normal)):
        softmax_row_to(x0, y0, n)               # the general rules or the full exp: one by one
        softmax_row_to(x1, y1, n)
        return
    for lane in range(LANES):
        part0[lane] = 0
        part1[lane] = 0
    j = 0
    if STAGE_EXPS:
        # The exps go to local arrays, then to y0 and y1 by memcpy. Stored straight into y,
        # which gcc cannot prove distinct from x, the avx512 loop was versioned with a run-time
        # overlap check and reloaded its constants on every step: staged, a softmax of
        # (8,128,128) or (8,128,2048) is 5-10 % faster. With 16 registers (baseline, avx2) the
        # direct loop below is faster (staging cost avx2 10-20 %), so the variant chooses.
        while j + LANES <= n:
            for lane in range(LANES):
                e0 = exp_nonpos(x0[j + lane] - m0)
                e1 = exp_nonpos(x1[j + lane] - m1)
                ebuf0[lane] = e0
                ebuf1[lane] = e1
                part0[lane] += e0
                part1[lane] += e1
            memcpy(y0 + j, ebuf0, LANES * sizeof(floating))
            memcpy(y1 + j, ebuf1, LANES * sizeof(floating))
            j += LANES
    else:
        while j + LANES <= n:
            for lane in range(LANES):
                e0 = exp_nonpos(x0[j + lane] - m0)
                e1 = exp_nonpos(x1[j + lane] - m1)
                y0[j + lane] = e0
                y1[j + lane] = e1
                part0[lane] += e0
                part1[lane] += e1
            j += LANES
    while j < n:
        e0 = exp_any(x0[j] - m0)
        e1 = exp_any(x1[j] - m1)
        y0[j] = e0
        y1[j] = e1
        t0 += e0
        t1 += e1
        j += 1
    t0 = lanes_sum(part0) + t0
    t1 = lanes_sum(part1) + t1
    row_scale(y0, n, <floating>1 / t0)
    row_scale(y1, n, <floating>1 / t1)


# The output size in bytes from which unmasked float32 softmax rows write their output by
# non-temporal stores (softmax_row_run's stream): half the host's last-level cache as CPUID
# gives it (cyattn_llc_bytes; 16 MiB where it does not say), i.e. from where an out-of-place
# call's input and output together no longer fit that cache: the output cannot stay cached for
# its reader then, and its lines are not worth the read for ownership an ordinary store pays
# (nor the input's lines it would evict). Zen 5, 32 MiB L3, 1 thread, 512-float rows, ordinary
# pipelined rows against the streamed ones: 8 MiB out 0.29 / 0.35 ms (streaming loses, also
# with a copy of the output after the call), 16 MiB 0.93 / 0.88, 24 MiB 1.46 / 1.37, 32 MiB
# 6.1 / 1.8 (bench/results/softmax_stream.md). In the variants with 512-bit vectors, and in
# those with 256-bit ones for rows of at least STREAM_MIN_ROW floats (CYATTN_ROWS_STREAM and
# CYATTN_ROWS_STREAM_MIN_ROW; _cyattn_softmax_rows.h gives the measurements); never elsewhere.
# Read once, at import (constants of the host, never written again).
cdef Py_ssize_t STREAM_MIN_BYTES = (
    (<Py_ssize_t>(cyattn_llc_bytes() // 2) or (16 << 20)) if CYATTN_ROWS_STREAM
    else (<Py_ssize_t>1) << 62)
cdef Py_ssize_t STREAM_MIN_ROW = CYATTN_ROWS_STREAM_MIN_ROW


cdef inline Py_ssize_t stream_rule(Py_ssize_t n) noexcept nogil:
    """The host's stream_min (bytes) for rows of n floats: STREAM_MIN_BYTES, or never (1 << 62)
    for rows shorter than STREAM_MIN_ROW."""
    return STREAM_MIN_BYTES if n >= STREAM_MIN_ROW else (<Py_ssize_t>1) << 62


cdef void softmax_row_run(const float* x, float* y, Py_ssize_t r0, Py_ssize_t r1,
                          Py_ssize_t n, bint log_out) noexcept nogil:
    """Unmasked float32 softmax (log_out: log-softmax) of the C-contiguous rows r0 .. r1 of
    n >= LANES elements (CYATTN_ROWK variants): cyattn_softmax_rows_f32's pipelined runs of
    rows, with the bits of softmax_row on each row; a row that run declines (no finite
    maximum, or a score more than 87 below it) takes softmax_row and the run restarts after
    it."""
    cdef Py_ssize_t r = r0
    while r < r1:
        r += cyattn_softmax_rows_f32(x + r * n, y + r * n, r1 - r, n, log_out)
        if r < r1:
            softmax_row(x + r * n, y + r * n, n, NULL, 0, <const float*>NULL, 0, log_out,
                        x != y and not log_out)
            r += 1


cdef void softmax_row_run_stream(const float* x, float* y, Py_ssize_t r0, Py_ssize_t r1,
                                 Py_ssize_t n, bint log_out) noexcept nogil:
    """softmax_row_run for an output far larger than the caches (STREAM_MIN_BYTES): the rows
    by cyattn_softmax_rows_f32_nt instead, the exp values in a scratch row of this thread and y
    written once by non-temporal stores (the same bits), then a store fence, so that the rows
    are visible to whichever thread reads them after the parallel region (if the scratch row
    cannot be allocated, softmax_row_run). A function of its own: with both bodies inlined
    into one, the pipelined rows of the avx2 variant ran about 5 % slower in cache."""
    cdef Py_ssize_t r = r0
    # a scratch row at each row of y's offset in its page (cyattn_softmax_rows_f32_nt says why)
    cdef void* raw = malloc(CYATTN_NT_SCRATCH(n) * sizeof(float) + CYATTN_NT_PAGE)
    cdef float* scratch
    if raw == NULL:
        softmax_row_run(x, y, r0, r1, n, log_out)
        return
    scratch = <float*>(((<uintptr_t>raw) + CYATTN_NT_PAGE - 1)
                       & ~(<uintptr_t>(CYATTN_NT_PAGE - 1)))
    while r < r1:
        r += cyattn_softmax_rows_f32_nt(x + r * n, y + r * n, scratch, r1 - r, n, log_out)
        if r < r1:
            softmax_row(x + r * n, y + r * n, n, NULL, 0, <const float*>NULL, 0, log_out,
                        x != y and not log_out)
            r += 1
    cyattn_sfence()
    free(raw)


cdef void softmax_row_tasks(const floating* x, floating* y, Py_ssize_t rows, Py_ssize_t n,
                            const uint8_t* bmask, Py_ssize_t b_rs, Py_ssize_t b_cs,
                            const floating* amask, Py_ssize_t a_rs, Py_ssize_t a_cs,
                            bint log_out, int n_threads, bint stream=False) noexcept nogil:
    cdef Py_ssize_t r, pair, t
    cdef bint direct = bmask == NULL and amask == NULL and x != y and not log_out
    cdef bint pairs = direct and n >= LANES
    if floating is float:
        if CYATTN_ROWK:                 # softmax_row's explicit vectors, one row at a time
            pairs = False
            if bmask == NULL and amask == NULL and n >= LANES:
                # unmasked (log-)softmax: runs of rows pipelined (softmax_row_run), each
                # thread one contiguous share of the rows
                if stream and n_threads <= 1:
                    softmax_row_run_stream(<const float*>x, <float*>y, 0, rows, n, log_out)
                elif stream:
                    for t in prange(n_threads, num_threads=n_threads, schedule='static'):
                        softmax_row_run_stream(<const float*>x, <float*>y,
                                               rows * t // n_threads,
                                               rows * (t + 1) // n_threads, n, log_out)
                elif n_threads <= 1:
                    softmax_row_run(<const float*>x, <float*>y, 0, rows, n, log_out)
                else:
                    for t in prange(n_threads, num_threads=n_threads, schedule='static'):
                        softmax_row_run(<const float*>x, <float*>y, rows * t // n_threads,
                                        rows * (t + 1) // n_threads, n, log_out)
                return
    if pairs:                           # rows in pairs (softmax_pair_to), the last one alone
        if n_threads <= 1:
            for pair in range(rows // 2):
                softmax_pair_to(x + 2 * pair * n, y + 2 * pair * n,
                                x + (2 * pair + 1) * n, y + (2 * pair + 1) * n, n)
        else:
            for pair in prange(rows // 2, num_threads=n_threads, schedule='static'):
                softmax_pair_to(x + 2 * pair * n, y + 2 * pair * n,
                                x + (2 * pair + 1) * n, y + (2 * pair + 1) * n, n)
        if rows % 2:
            softmax_row_to(x + (rows - 1) * n, y + (rows - 1) * n, n)
        return
    if n_threads <= 1:                  # no OpenMP region for one thread
        for r in range(rows):
            softmax_row(x + r * n, y + r * n, n, bmask + r * b_rs if bmask != NULL else NULL,
                        b_cs, amask + r * a_rs if amask != NULL else NULL, a_cs, log_out,
                        direct)
        return
    for r in prange(rows, num_threads=n_threads, schedule='static'):
        softmax_row(x + r * n, y + r * n, n, bmask + r * b_rs if bmask != NULL else NULL,
                    b_cs, amask + r * a_rs if amask != NULL else NULL, a_cs, log_out, direct)


cdef void softmax_row_half(const char* x, int x_fmt, char* y, int y_fmt, Py_ssize_t n,
                           const uint8_t* bmask, Py_ssize_t b_cs,
                           const char* amask, int a_fmt, Py_ssize_t a_cs,
                           bint log_out, float* row, float* mrow) noexcept nogil:
    """One row of softmax_row_tasks_half, in the float32 row `row` (and `mrow` for a 16-bit mask)."""
    cdef Py_ssize_t j
    cdef const float* am = NULL
    if x_fmt != 0:
        cyattn_half_to_float(<const uint16_t*>x, row, n, x_fmt)
    else:
        memcpy(row, x, n * sizeof(float))
    if amask != NULL:
        if a_fmt != 0:
            for j in range(n):
                mrow[j] = cyattn_widen1(amask, j * a_cs, a_fmt)
            am = mrow
        else:
            am = <const float*>amask
    if bmask != NULL or am != NULL:
        row_mask_inplace(row, n, bmask, b_cs, am, 1 if a_fmt != 0 else a_cs)
    softmax_inplace(row, n, log_out)
    if y_fmt != 0:
        cyattn_float_to_half(row, <uint16_t*>y, n, y_fmt)
    else:
        memcpy(y, row, n * sizeof(float))


cdef int softmax_row_tasks_half(const char* x, int x_fmt, char* y, int y_fmt, Py_ssize_t rows,
                           Py_ssize_t n, const uint8_t* bmask, Py_ssize_t b_rs, Py_ssize_t b_cs,
                           const char* amask, int a_fmt, Py_ssize_t a_rs, Py_ssize_t a_cs,
                           bint log_out, int n_threads) noexcept nogil:
    """Row (log-)softmax of C-contiguous rows of float32 or 16-bit elements (x_fmt: 0 or the
    half format) into C-contiguous rows of float32 or 16-bit elements (y_fmt), computed in
    float32 one row at a time in a per-thread row: each row is widened as it is read, masked
    (bmask as in softmax_rows; amask of float32 or 16-bit elements, a_fmt), normalised as
    softmax_inplace does and rounded once, to nearest even, as it is written. The bits of the
    float32 call on the widened inputs followed by astype; no float32 copy of x, the mask or
    the result. Returns 1 if a thread's row buffer could not be allocated (y then undefined)."""
    cdef Py_ssize_t r
    cdef Py_ssize_t xs = n * (2 if x_fmt != 0 else 4)
    cdef Py_ssize_t ys = n * (2 if y_fmt != 0 else 4)
    cdef Py_ssize_t msz = 2 if a_fmt != 0 else 4
    cdef int status[1]                  # written through a pointer: shared across the threads
    cdef void* raw = NULL
    cdef float* row = NULL
    status[0] = 0
    if n_threads <= 1:                  # no OpenMP region for one thread (as softmax_row_tasks)
        raw = malloc(<size_t>(2 * n + 16) * sizeof(float) + ALIGN)
        if raw == NULL:
            return 1
        row = <float*>align_ptr(raw)
        for r in range(rows):
            softmax_row_half(x + r * xs, x_fmt, y + r * ys, y_fmt, n,
                             bmask + r * b_rs if bmask != NULL else NULL, b_cs,
                             amask + r * a_rs * msz if amask != NULL else NULL, a_fmt,
                             a_cs, log_out, row, row + n + 16)
        free(raw)
        return 0
    with parallel(num_threads=n_threads):
        raw = malloc(<size_t>(2 * n + 16) * sizeof(float) + ALIGN)
        row = NULL
        if raw == NULL:
            status[0] = 1
        else:
            row = <float*>align_ptr(raw)
        for r in prange(rows, schedule='static'):
            if raw != NULL:
                softmax_row_half(x + r * xs, x_fmt, y + r * ys, y_fmt, n,
                                 bmask + r * b_rs if bmask != NULL else NULL, b_cs,
                                 amask + r * a_rs * msz if amask != NULL else NULL, a_fmt,
                                 a_cs, log_out, row, row + n + 16)
        free(raw)
    return status[0]
