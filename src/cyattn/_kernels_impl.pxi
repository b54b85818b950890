# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False, overflowcheck=False
#
# cyattn's compiled kernels. This file is included by every variant module
# (_kernels_baseline.pyx, _kernels_avx2.pyx); the variants differ only in compiler flags, so the
# same loops become SSE2 code in one and 256-bit FMA code in the other.
#
# Design
# ------
# * exp: range reduction x = n ln2 + r (n by the 1.5*2^p shifter trick, Cody-Waite split of ln2),
#   a Taylor polynomial for e^r on |r| <= ln2/2 (degree 7 for float32, 13 for float64) and 2^n
#   applied as two exact power-of-two factors so that subnormal results are rounded once.
#   Arguments below the underflow bound (-inf included) give exactly 0 by a final select, not by
#   underflowing (which costs a microcode assist); +inf overflows to +inf; NaN passes through.
#   The loop body is branch-free and gcc vectorises it.
# * softmax rows: three passes (max; exp and sum; scale) with LANES lane-wise partial maxima and
#   sums combined in a fixed order, so results do not depend on threads.
# * GEMM (C (+)= alpha A B): BLIS-style. Loops NC -> KC -> MC -> NR -> MR; B is packed into
#   NR-column panels and A into MR-row panels (zero padded at the edges), which also makes any
#   input strides cheap. The micro-kernel keeps an MR x NR accumulator tile in a local array
#   indexed by constant-bound loops; its innermost loop has NR > 16 trips so that gcc vectorises
#   it instead of fully unrolling it (float32: 4 x 24; float64: 2 x 24, the best of 4x12, 2x24,
#   6x8 and 8x8 measured here; see PERF-NOTES). KC = 256 keeps an A panel and a B panel in L1/L2.
#   Panel buffers are sized for the wider of the two tiles (NR = NRD, MC a multiple of MR, MRD).
#   Every element of C is summed over K in the same order whatever the tiling, so results are
#   bit-identical for any number of threads.
# * attention (this version): per (batch*head, query block of QB rows) task, scores = scale Q K^T
#   for the query block into a per-thread buffer (keys past the causal limit of the block are
#   never computed), masks applied in place, row softmax, then out = P V. K^T and V are packed
#   once per (batch, head) and thread and reused by its consecutive query blocks. A key whose
#   weight is exactly zero is never read into the output when V holds non-finite values.
# * threads: OpenMP prange over independent tasks only (rows, output tiles, attention tasks),
#   static schedule, per-thread scratch allocated once per call inside the parallel block.
#   No reduction is ever split across threads. No global mutable state.

from libc.stdlib cimport malloc, free
from libc.string cimport memset, memcpy
from libc.math cimport log, isnan
from libc.stdint cimport int32_t, uint32_t, int64_t, uint64_t, uint8_t, uintptr_t
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_RECORDS_RO, PyBUF_RECORDS
from cython cimport floating
from cython.parallel cimport prange, parallel

from ._kernels cimport (cyattn_cpu_features, cyattn_openmp_enabled, cyattn_omp_max_threads,
                        cyattn_omp_num_procs, cyattn_omp_pause, cyattn_prefetch_w)

cdef extern from *:
    """
    #include <math.h>
    #define CYATTN_INF ((double)INFINITY)
    #define CYATTN_NAN ((double)NAN)
    """
    double CYATTN_INF
    double CYATTN_NAN

cdef enum:
    LANES = 32        # partial maxima / sums per row (a 32-trip loop is vectorised, not unrolled)
    MR = 4            # float32 micro-kernel rows
    NR = 24           # float32 micro-kernel columns (> 16 trips: see PERF-NOTES)
    MRD = 2           # float64 micro-kernel rows (2 x 24: measured best of 4x12, 2x24, 6x8, 8x8)
    NRD = 24          # float64 micro-kernel columns
    KC = 256          # depth of a packed panel
    MC = 144          # rows of A packed at once (multiple of MR)
    NC = 4032         # columns of B packed at once (multiple of NR)
    QB = 64           # query rows per attention task
    ALIGN = 64        # scratch alignment in bytes


# ------------------------------------------------------------------------------------------
# exp
# ------------------------------------------------------------------------------------------

# Clamp bounds of the exp argument. They are module variables rather than literals on purpose:
# with gcc's default -ftrapping-math, comparisons against literal constants are kept as
# branches and the exp loops stay scalar, while loop-invariant variables become vminps/vmaxps
# (PERF-NOTES, "Vectorised float32 exp"). They are assigned once here and never written again.
cdef float EXP_LO_F32 = -104.0
cdef float EXP_HI_F32 = 88.8
cdef double EXP_LO_F64 = -746.0
cdef double EXP_HI_F64 = 710.0

cdef inline int32_t _f32_bits(float x) noexcept nogil:
    cdef int32_t i
    memcpy(&i, &x, 4)
    return i

cdef inline float _f32_from_bits(uint32_t i) noexcept nogil:
    cdef float x
    memcpy(&x, &i, 4)
    return x

cdef inline int64_t _f64_bits(double x) noexcept nogil:
    cdef int64_t i
    memcpy(&i, &x, 8)
    return i

cdef inline double _f64_from_bits(uint64_t i) noexcept nogil:
    cdef double x
    memcpy(&x, &i, 8)
    return x


cdef inline float exp_f32(float x) noexcept nogil:
    """e**x in float32, < 2 ulp; -inf -> 0, +inf -> +inf, NaN -> NaN, subnormals kept."""
    cdef float t, n, r, p
    cdef int32_t ni, n1, n2
    cdef uint32_t keep = 0u - <uint32_t>(not (x < EXP_LO_F32))   # all ones unless x < -104
    # Below -104 the result is exactly 0: those lanes (masked -inf scores above all) compute
    # exp(0) and are zeroed at the end, because letting the formula underflow to 0 costs a
    # microcode assist per instruction on many x86 CPUs (7 ns instead of 0.9 ns per element
    # for a half-masked row). Above 88.8 the result overflows to inf through the formula.
    # NaN fails every comparison and passes through.
    # (the selects are integer masks: gcc keeps float selects as branches under -ftrapping-math)
    x = _f32_from_bits(<uint32_t>_f32_bits(x) & keep)
    x = EXP_HI_F32 if x > EXP_HI_F32 else x
    t = x * <float>1.44269504088896341 + <float>12582912.0     # 1.5 * 2**23 shifter
    n = t - <float>12582912.0
    ni = _f32_bits(t) - <int32_t>0x4B400000
    r = x - n * <float>0.693145751953125          # ln2 high part, exact product for |n| < 256
    r = r - n * <float>1.428606765330187045e-06   # ln2 low part
    p = <float>(1.0 / 5040.0)
    p = p * r + <float>(1.0 / 720.0)
    p = p * r + <float>(1.0 / 120.0)
    p = p * r + <float>(1.0 / 24.0)
    p = p * r + <float>(1.0 / 6.0)
    p = p * r + <float>0.5
    p = p * r + <float>1.0
    p = p * r + <float>1.0
    n1 = ni >> 1
    n2 = ni - n1
    p = p * _f32_from_bits((<uint32_t>(n1 + 127)) << 23)     # exact: p times a normal 2**n1
    p = p * _f32_from_bits((<uint32_t>(n2 + 127)) << 23)     # the one rounding (subnormals)
    return _f32_from_bits(<uint32_t>_f32_bits(p) & keep)


cdef inline double exp_f64(double x) noexcept nogil:
    """e**x in float64, < 2 ulp; -inf -> 0, +inf -> +inf, NaN -> NaN, subnormals kept."""
    cdef double t, n, r, p
    cdef int64_t ni, n1, n2
    cdef uint64_t keep = 0u - <uint64_t>(not (x < EXP_LO_F64))   # as in exp_f32
    x = _f64_from_bits(<uint64_t>_f64_bits(x) & keep)
    x = EXP_HI_F64 if x > EXP_HI_F64 else x
    t = x * 1.4426950408889634074 + 6755399441055744.0         # 1.5 * 2**52 shifter
    n = t - 6755399441055744.0
    ni = _f64_bits(t) - <int64_t>0x4338000000000000
    r = x - n * 6.93147180369123816490e-01        # ln2 high part (fdlibm), exact for |n| < 2**21
    r = r - n * 1.90821492927058770002e-10        # ln2 low part
    p = 1.0 / 6227020800.0
    p = p * r + 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    n1 = ni >> 1
    n2 = ni - n1
    p = p * _f64_from_bits((<uint64_t>(n1 + 1023)) << 52)    # exact: p times a normal 2**n1
    p = p * _f64_from_bits((<uint64_t>(n2 + 1023)) << 52)    # the one rounding (subnormals)
    return _f64_from_bits(<uint64_t>_f64_bits(p) & keep)


cdef inline floating exp_any(floating x) noexcept nogil:
    if floating is float:
        return exp_f32(x)
    else:
        return exp_f64(x)


cdef void exp_array(const floating* x, floating* y, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(n):
        y[j] = exp_any(x[j])


# ------------------------------------------------------------------------------------------
# softmax rows
# ------------------------------------------------------------------------------------------

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
    for lane in range(LANES):
        m = part[lane] if part[lane] > m else m
    return m


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
    lane = LANES // 2
    while lane >= 1:
        for j in range(lane):
            part[j] += part[j + lane]
        lane //= 2
    total = part[0] + tail
    return total


cdef void row_scale(floating* y, Py_ssize_t n, floating factor) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(n):
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


cdef void softmax_rows_impl(const floating* x, floating* y, Py_ssize_t rows, Py_ssize_t n,
                            const uint8_t* bmask, Py_ssize_t b_rs, Py_ssize_t b_cs,
                            const floating* amask, Py_ssize_t a_rs, Py_ssize_t a_cs,
                            bint log_out, int n_threads) noexcept nogil:
    cdef Py_ssize_t r
    for r in prange(rows, num_threads=n_threads, schedule='static'):
        row_load_masked(x + r * n, y + r * n, n,
                        bmask + r * b_rs if bmask != NULL else NULL, b_cs,
                        amask + r * a_rs if amask != NULL else NULL, a_cs)
        softmax_inplace(y + r * n, n, log_out)


# ------------------------------------------------------------------------------------------
# GEMM: C (+)= alpha * A @ B on packed panels
# ------------------------------------------------------------------------------------------

cdef void pack_a(Py_ssize_t mc, Py_ssize_t kc, const floating* a, Py_ssize_t rsa, Py_ssize_t csa,
                 floating* dst, Py_ssize_t mr) noexcept nogil:
    """A[0:mc, 0:kc] into mr-row panels: dst[panel][p][i], rows past mc zero.

    The loop order follows the unit stride of A (rows of a row-major A are read contiguously).
    """
    cdef Py_ssize_t ir = 0, p, i, m_here
    cdef const floating* src
    while ir < mc:
        m_here = mc - ir if mc - ir < mr else mr
        if csa == 1:
            for i in range(m_here):
                src = a + (ir + i) * rsa
                for p in range(kc):
                    dst[p * mr + i] = src[p]
            for i in range(m_here, mr):
                for p in range(kc):
                    dst[p * mr + i] = 0
        else:
            for p in range(kc):
                src = a + ir * rsa + p * csa
                for i in range(m_here):
                    dst[p * mr + i] = src[i * rsa]
                for i in range(m_here, mr):
                    dst[p * mr + i] = 0
        dst += mr * kc
        ir += mr


cdef void pack_b(Py_ssize_t kc, Py_ssize_t nc, const floating* b, Py_ssize_t rsb, Py_ssize_t csb,
                 floating* dst, Py_ssize_t nr) noexcept nogil:
    """B[0:kc, 0:nc] into nr-column panels: dst[panel][p][j], columns past nc zero.

    The loop order follows the unit stride of B: rows are copied when B is row-major, columns
    when it is column-major (as K^T is for the attention scores).
    """
    cdef Py_ssize_t jr = 0, p, j, n_here
    cdef const floating* src
    while jr < nc:
        n_here = nc - jr if nc - jr < nr else nr
        if rsb == 1 and csb != 1:
            for j in range(n_here):
                src = b + (jr + j) * csb
                for p in range(kc):
                    dst[p * nr + j] = src[p]
            for j in range(n_here, nr):
                for p in range(kc):
                    dst[p * nr + j] = 0
        else:
            for p in range(kc):
                src = b + p * rsb + jr * csb
                if csb == 1 and n_here == nr:
                    memcpy(dst + p * nr, src, nr * sizeof(floating))
                else:
                    for j in range(n_here):
                        dst[p * nr + j] = src[j * csb]
                    for j in range(n_here, nr):
                        dst[p * nr + j] = 0
        dst += nr * kc
        jr += nr


cdef void micro_kernel_f32(Py_ssize_t kc, const float* pa, const float* pb,
                           float* c, Py_ssize_t rsc, Py_ssize_t csc,
                           Py_ssize_t m_here, Py_ssize_t n_here, float alpha,
                           bint overwrite) noexcept nogil:
    """C[0:m_here, 0:n_here] (+)= alpha * (A panel @ B panel) over kc steps (MR x NR tile)."""
    cdef float acc[MR][NR]
    cdef Py_ssize_t p, i, j
    cdef float a_i
    cdef float* c_row
    for i in range(MR):
        cyattn_prefetch_w(c + i * rsc)
        for j in range(NR):
            acc[i][j] = 0
    for p in range(kc):
        for i in range(MR):
            a_i = pa[p * MR + i]
            for j in range(NR):
                acc[i][j] += a_i * pb[p * NR + j]
    if m_here == MR and n_here == NR and csc == 1:
        for i in range(MR):
            c_row = c + i * rsc
            if overwrite:
                for j in range(NR):
                    c_row[j] = alpha * acc[i][j]
            else:
                for j in range(NR):
                    c_row[j] += alpha * acc[i][j]
    else:
        for i in range(m_here):
            for j in range(n_here):
                if overwrite:
                    c[i * rsc + j * csc] = alpha * acc[i][j]
                else:
                    c[i * rsc + j * csc] += alpha * acc[i][j]


cdef void micro_kernel_f64(Py_ssize_t kc, const double* pa, const double* pb,
                           double* c, Py_ssize_t rsc, Py_ssize_t csc,
                           Py_ssize_t m_here, Py_ssize_t n_here, double alpha,
                           bint overwrite) noexcept nogil:
    """As micro_kernel_f32 with an MRD x NRD tile."""
    cdef double acc[MRD][NRD]
    cdef Py_ssize_t p, i, j
    cdef double a_i
    cdef double* c_row
    for i in range(MRD):
        cyattn_prefetch_w(c + i * rsc)
        for j in range(NRD):
            acc[i][j] = 0
    for p in range(kc):
        for i in range(MRD):
            a_i = pa[p * MRD + i]
            for j in range(NRD):
                acc[i][j] += a_i * pb[p * NRD + j]
    if m_here == MRD and n_here == NRD and csc == 1:
        for i in range(MRD):
            c_row = c + i * rsc
            if overwrite:
                for j in range(NRD):
                    c_row[j] = alpha * acc[i][j]
            else:
                for j in range(NRD):
                    c_row[j] += alpha * acc[i][j]
    else:
        for i in range(m_here):
            for j in range(n_here):
                if overwrite:
                    c[i * rsc + j * csc] = alpha * acc[i][j]
                else:
                    c[i * rsc + j * csc] += alpha * acc[i][j]


cdef void gemm_block(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, floating alpha,
                     const floating* a, Py_ssize_t rsa, Py_ssize_t csa,
                     const floating* b, Py_ssize_t rsb, Py_ssize_t csb,
                     floating* c, Py_ssize_t rsc, Py_ssize_t csc,
                     bint overwrite, floating* buf_a, floating* buf_b) noexcept nogil:
    """C[M, N] (+)= alpha * A[M, K] @ B[K, N], any strides, single-threaded.

    buf_a holds MC x KC and buf_b KC x min(NC, round_up(N, NR)) elements. With ``overwrite``
    C is written (C = alpha A B), else accumulated. C is summed over K in KC blocks in order, so
    each element's result does not depend on how M and N are tiled.
    """
    cdef Py_ssize_t jc, pc, ic, jr, ir, nc, kc, mc
    cdef bint first
    cdef Py_ssize_t i, j
    cdef Py_ssize_t mr = MR if floating is float else MRD
    cdef Py_ssize_t nr = NR if floating is float else NRD
    if M <= 0 or N <= 0:
        return
    if K <= 0:
        if overwrite:
            for i in range(M):
                for j in range(N):
                    c[i * rsc + j * csc] = 0
        return
    jc = 0
    while jc < N:
        nc = N - jc if N - jc < NC else NC
        pc = 0
        while pc < K:
            kc = K - pc if K - pc < KC else KC
            first = overwrite and pc == 0
            pack_b(kc, nc, b + pc * rsb + jc * csb, rsb, csb, buf_b, nr)
            ic = 0
            while ic < M:
                mc = M - ic if M - ic < MC else MC
                pack_a(mc, kc, a + ic * rsa + pc * csa, rsa, csa, buf_a, mr)
                jr = 0
                while jr < nc:
                    ir = 0
                    while ir < mc:
                        if floating is float:
                            micro_kernel_f32(kc, buf_a + ir * kc, buf_b + jr * kc,
                                             c + (ic + ir) * rsc + (jc + jr) * csc, rsc, csc,
                                             mc - ir if mc - ir < mr else mr,
                                             nc - jr if nc - jr < nr else nr, alpha, first)
                        else:
                            micro_kernel_f64(kc, buf_a + ir * kc, buf_b + jr * kc,
                                             c + (ic + ir) * rsc + (jc + jr) * csc, rsc, csc,
                                             mc - ir if mc - ir < mr else mr,
                                             nc - jr if nc - jr < nr else nr, alpha, first)
                        ir += mr
                    jr += nr
                ic += MC
            pc += KC
        jc += NC


cdef void gemm_packed(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, floating alpha,
                      const floating* pa, Py_ssize_t a_depth,
                      const floating* pb, Py_ssize_t b_depth,
                      floating* c, Py_ssize_t rsc, Py_ssize_t csc, bint overwrite) noexcept nogil:
    """C[M, N] (+)= alpha * A[M, K] @ B[K, N] from operands packed over their whole depth.

    ``pa`` holds A as mr-row panels ``pack_a(M, a_depth, ...)`` and ``pb`` holds B as nr-column
    panels ``pack_b(b_depth, N, ...)``; only the first K of each depth is used, so a packed K^T
    or V serves every query block, whatever prefix of the keys it sees. Per element the sum
    runs over K in KC blocks in order, exactly as in gemm_block.
    """
    cdef Py_ssize_t pc, jr, ir, kc, i, j
    cdef bint first
    cdef Py_ssize_t mr = MR if floating is float else MRD
    cdef Py_ssize_t nr = NR if floating is float else NRD
    if M <= 0 or N <= 0:
        return
    if K <= 0:
        if overwrite:
            for i in range(M):
                for j in range(N):
                    c[i * rsc + j * csc] = 0
        return
    pc = 0
    while pc < K:
        kc = K - pc if K - pc < KC else KC
        first = overwrite and pc == 0
        jr = 0
        while jr < N:
            ir = 0
            while ir < M:
                if floating is float:
                    micro_kernel_f32(kc, pa + (ir // mr) * a_depth * mr + pc * mr,
                                     pb + (jr // nr) * b_depth * nr + pc * nr,
                                     c + ir * rsc + jr * csc, rsc, csc,
                                     M - ir if M - ir < mr else mr,
                                     N - jr if N - jr < nr else nr, alpha, first)
                else:
                    micro_kernel_f64(kc, pa + (ir // mr) * a_depth * mr + pc * mr,
                                     pb + (jr // nr) * b_depth * nr + pc * nr,
                                     c + ir * rsc + jr * csc, rsc, csc,
                                     M - ir if M - ir < mr else mr,
                                     N - jr if N - jr < nr else nr, alpha, first)
                ir += mr
            jr += nr
        pc += KC


cdef inline Py_ssize_t round_up(Py_ssize_t x, Py_ssize_t m) noexcept nogil:
    return ((x + m - 1) // m) * m


cdef inline void* align_ptr(void* raw) noexcept nogil:
    return <void*>((<uintptr_t>raw + ALIGN - 1) & ~(<uintptr_t>(ALIGN - 1)))


cdef void matmul_tasks_impl(const floating* a, const int64_t* a_off, Py_ssize_t rsa, Py_ssize_t csa,
                            const floating* b, const int64_t* b_off, Py_ssize_t rsb, Py_ssize_t csb,
                            floating* c, const int64_t* c_off, Py_ssize_t rsc, Py_ssize_t csc,
                            Py_ssize_t batch, Py_ssize_t M, Py_ssize_t N, Py_ssize_t K,
                            floating alpha, Py_ssize_t tile_m, Py_ssize_t tile_n,
                            int n_threads, int* status) noexcept nogil:
    """Batched C += alpha A B, parallel over (batch, tile_m x tile_n output tiles)."""
    cdef Py_ssize_t tiles_m = (M + tile_m - 1) // tile_m
    cdef Py_ssize_t tiles_n = (N + tile_n - 1) // tile_n
    cdef Py_ssize_t ntasks = batch * tiles_m * tiles_n
    cdef Py_ssize_t t, bi, ti, tj, i0, j0, mm, nn
    cdef Py_ssize_t kc_max = K if K < KC else KC
    cdef Py_ssize_t nb = round_up(tile_n if tile_n < NC else NC, NR)
    cdef size_t bytes_a = <size_t>(MC * (kc_max if kc_max > 0 else 1)) * sizeof(floating)
    cdef size_t bytes_b = <size_t>(nb * (kc_max if kc_max > 0 else 1)) * sizeof(floating)
    cdef void* raw
    cdef floating* buf_a
    cdef floating* buf_b
    if ntasks <= 0:
        return
    with parallel(num_threads=n_threads):
        buf_a = NULL
        buf_b = NULL
        raw = malloc(bytes_a + bytes_b + 2 * ALIGN)
        if raw == NULL:
            status[0] = 1
        else:
            buf_a = <floating*>align_ptr(raw)
            buf_b = <floating*>align_ptr(<char*>buf_a + bytes_a)
        for t in prange(ntasks, schedule='static'):
            if raw != NULL:
                bi = t // (tiles_m * tiles_n)
                ti = (t // tiles_n) % tiles_m
                tj = t % tiles_n
                i0 = ti * tile_m
                j0 = tj * tile_n
                mm = M - i0 if M - i0 < tile_m else tile_m
                nn = N - j0 if N - j0 < tile_n else tile_n
                gemm_block(mm, nn, K, alpha,
                           a + a_off[bi] + i0 * rsa, rsa, csa,
                           b + b_off[bi] + j0 * csb, rsb, csb,
                           c + c_off[bi] + i0 * rsc + j0 * csc, rsc, csc,
                           False, buf_a, buf_b)
        free(raw)


# ------------------------------------------------------------------------------------------
# attention (composed: Q K^T tile, masked softmax rows, P V)
# ------------------------------------------------------------------------------------------

cdef bint has_nonfinite(const floating* v, Py_ssize_t rows, Py_ssize_t cols,
                        Py_ssize_t rs, Py_ssize_t cs) noexcept nogil:
    """True if v[:rows, :cols] holds an inf or NaN (x - x is then NaN, else 0)."""
    cdef Py_ssize_t i, j
    cdef int bad = 0
    cdef const floating* v_row
    for i in range(rows):
        v_row = v + i * rs
        if cs == 1:                 # unit stride: an integer OR reduction gcc vectorises
            for j in range(cols):
                bad |= (v_row[j] - v_row[j]) != 0
        else:
            for j in range(cols):
                bad |= (v_row[j * cs] - v_row[j * cs]) != 0
        if bad:
            return True
    return False


cdef void attention_task(const floating* q, Py_ssize_t q_rs, Py_ssize_t q_cs,
                         const floating* kt_packed, const floating* v_packed,
                         const uint8_t* bmask, const floating* amask,
                         Py_ssize_t m_rs, Py_ssize_t m_cs,
                         floating* out, floating* lse,
                         Py_ssize_t i0, Py_ssize_t rows, Py_ssize_t S,
                         Py_ssize_t E, Py_ssize_t Ev, floating scale,
                         bint causal, Py_ssize_t causal_off,
                         const floating* v, Py_ssize_t v_rs, Py_ssize_t v_cs, bint v_nonfinite,
                         floating* scores, Py_ssize_t ld_scores,
                         floating* q_packed, floating* p_packed) noexcept nogil:
    """Rows i0 .. i0+rows of one (batch, head): out rows (stride Ev) and their lse.

    ``kt_packed`` and ``v_packed`` hold K^T and V of this (batch, head) packed once over all S
    keys. Scores for the block go to ``scores``; each row is masked and turned into its softmax
    weights, then multiplied by V. The weights are normalised before the product (not after,
    as flash-attention does) so that a weighted sum of huge finite values cannot overflow and a
    weight that rounds to exactly 0 skips its value.
    """
    cdef Py_ssize_t s_lim = S, lim, r, i, j, e
    cdef Py_ssize_t mr = MR if floating is float else MRD
    cdef floating* row
    cdef floating* o_row
    cdef floating m, total, w
    cdef const floating* v_row
    if causal:
        s_lim = i0 + rows + causal_off          # one past the last key any row here may see
        s_lim = S if s_lim > S else (0 if s_lim < 0 else s_lim)
    if s_lim > 0:
        pack_a(rows, E, q + i0 * q_rs, q_rs, q_cs, q_packed, mr)
        gemm_packed(rows, s_lim, E, scale, q_packed, E, kt_packed, E,
                    scores, ld_scores, 1, True)
    for r in range(rows):
        i = i0 + r
        row = scores + r * ld_scores
        lim = s_lim
        if causal:
            lim = i + causal_off + 1
            lim = s_lim if lim > s_lim else (0 if lim < 0 else lim)
        if bmask != NULL or amask != NULL:
            row_mask_inplace(row, lim,
                             bmask + i * m_rs if bmask != NULL else NULL, m_cs,
                             amask + i * m_rs if amask != NULL else NULL, m_cs)
        m = row_max(row, lim)
        if m == -CYATTN_INF and not row_has_nan(row, lim):
            # fully masked: zero weights, zero output, lse -inf
            row_fill(row, lim, <floating>0)
            lse[r] = <floating>-CYATTN_INF
        elif m == -CYATTN_INF or m == CYATTN_INF:
            # NaN, or +inf (inf - inf): the row is NaN
            row_fill(row, lim, <floating>CYATTN_NAN)
            lse[r] = <floating>CYATTN_NAN
        else:
            total = row_exp_sum(row, lim, m, True)
            row_scale(row, lim, <floating>1 / total)
            lse[r] = m + <floating>log(total)
        for j in range(lim, s_lim):
            row[j] = 0
    if s_lim == 0 or Ev == 0:
        for r in range(rows):
            for e in range(Ev):
                out[r * Ev + e] = 0
        return
    if not v_nonfinite:
        pack_a(rows, s_lim, scores, ld_scores, 1, p_packed, mr)
        gemm_packed(rows, Ev, s_lim, 1, p_packed, s_lim, v_packed, S, out, Ev, 1, True)
        return
    # V holds inf/NaN somewhere: sum only keys with a nonzero weight, so masked (zero-weight)
    # positions are never read into the output.
    for r in range(rows):
        row = scores + r * ld_scores
        o_row = out + r * Ev
        for e in range(Ev):
            o_row[e] = 0
        for j in range(s_lim):
            w = row[j]
            if w != 0:
                v_row = v + j * v_rs
                for e in range(Ev):
                    o_row[e] += w * v_row[e * v_cs]


cdef void attention_impl(const floating* q, const int64_t* q_off, Py_ssize_t q_rs, Py_ssize_t q_cs,
                         const floating* k, const int64_t* k_off, Py_ssize_t k_rs, Py_ssize_t k_cs,
                         const floating* v, const int64_t* v_off, Py_ssize_t v_rs, Py_ssize_t v_cs,
                         const uint8_t* bmask, const floating* amask, const int64_t* m_off,
                         Py_ssize_t m_rs, Py_ssize_t m_cs,
                         floating* out, floating* lse,
                         Py_ssize_t batch, Py_ssize_t L, Py_ssize_t S, Py_ssize_t E, Py_ssize_t Ev,
                         floating scale, bint causal, Py_ssize_t causal_off,
                         int n_threads, int* status) noexcept nogil:
    """Tasks (batch entry, query block of QB rows) in parallel, static schedule.

    Each thread packs K^T and V of the (batch, head) it works on once and reuses them for
    consecutive tasks of the same keys (the static schedule hands a thread a contiguous run of
    tasks, and GQA heads sharing keys are adjacent), so the packing cost is paid per head, not
    per query block. Scratch per thread: scores QB x S, packed P QB x S, packed K^T S x E and V
    S x Ev, all allocated once per call.
    """
    cdef Py_ssize_t qblocks = (L + QB - 1) // QB
    cdef Py_ssize_t ntasks = batch * qblocks
    cdef Py_ssize_t t, bi, qb, i0, rows, mo
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
    cdef void* raw
    cdef floating* scores
    cdef floating* p_packed
    cdef floating* q_packed
    cdef floating* kt_packed
    cdef floating* v_packed
    cdef int64_t* cache         # per thread: k offset, v offset, V non-finite (written in prange)
    if ntasks <= 0:
        return
    with parallel(num_threads=n_threads):
        scores = NULL
        p_packed = NULL
        q_packed = NULL
        kt_packed = NULL
        v_packed = NULL
        cache = NULL
        raw = malloc(bytes_s + bytes_p + bytes_q + bytes_kt + bytes_v + 6 * ALIGN)
        if raw == NULL:
            status[0] = 1
        else:
            cache = <int64_t*>align_ptr(raw)
            cache[0] = -1
            cache[1] = -1
            cache[2] = 0
            scores = <floating*>align_ptr(<char*>cache + 3 * sizeof(int64_t))
            p_packed = <floating*>align_ptr(<char*>scores + bytes_s)
            q_packed = <floating*>align_ptr(<char*>p_packed + bytes_p)
            kt_packed = <floating*>align_ptr(<char*>q_packed + bytes_q)
            v_packed = <floating*>align_ptr(<char*>kt_packed + bytes_kt)
        for t in prange(ntasks, schedule='static'):
            if raw != NULL:
                bi = t // qblocks
                qb = t % qblocks
                i0 = qb * QB
                rows = L - i0 if L - i0 < QB else QB
                mo = m_off[bi] if m_off != NULL else 0
                if S > 0 and (k_off[bi] != cache[0] or v_off[bi] != cache[1]):
                    # K^T: (E x S) with unit stride along E when K is row-major
                    pack_b(E, S, k + k_off[bi], k_cs, k_rs, kt_packed, nr)
                    pack_b(S, Ev, v + v_off[bi], v_rs, v_cs, v_packed, nr)
                    cache[0] = k_off[bi]
                    cache[1] = v_off[bi]
                    cache[2] = has_nonfinite(v + v_off[bi], S, Ev, v_rs, v_cs)
                attention_task(q + q_off[bi], q_rs, q_cs, kt_packed, v_packed,
                               bmask + mo if bmask != NULL else NULL,
                               amask + mo if amask != NULL else NULL,
                               m_rs, m_cs,
                               out + (bi * L + i0) * Ev, lse + bi * L + i0,
                               i0, rows, S, E, Ev, scale, causal, causal_off,
                               v + v_off[bi], v_rs, v_cs, cache[2] != 0,
                               scores, ld_scores, q_packed, p_packed)
        free(raw)


# ------------------------------------------------------------------------------------------
# Python-facing wrappers (validation lives in Python; these trust their arguments)
# ------------------------------------------------------------------------------------------

cdef char* _buf(object arr, Py_buffer* view, bint writable) except NULL:
    PyObject_GetBuffer(arr, view, PyBUF_RECORDS if writable else PyBUF_RECORDS_RO)
    return <char*>view.buf


def cpu_features():
    """Bit set of CPU features (see _cyattn_support.h)."""
    return cyattn_cpu_features()


def openmp_enabled():
    """True if this module was compiled with OpenMP."""
    return bool(cyattn_openmp_enabled())


def omp_max_threads():
    """The OpenMP runtime's current default team size (1 without OpenMP)."""
    return cyattn_omp_max_threads()


def omp_num_procs():
    return cyattn_omp_num_procs()


def omp_pause():
    """Release the OpenMP thread pool (before fork); 0 on success."""
    return cyattn_omp_pause()


def exp_values(x, out):
    """out = exp(x) with the kernels' exp (1-D float32/float64 C-contiguous arrays)."""
    cdef Py_buffer xv, ov
    cdef char* xp = _buf(x, &xv, False)
    cdef char* op
    cdef Py_ssize_t n = xv.len // xv.itemsize
    cdef bint dbl = xv.itemsize == 8
    try:
        op = _buf(out, &ov, True)
        try:
            with nogil:
                if dbl:
                    exp_array(<const double*>xp, <double*>op, n)
                else:
                    exp_array(<const float*>xp, <float*>op, n)
        finally:
            PyBuffer_Release(&ov)
    finally:
        PyBuffer_Release(&xv)


def softmax_rows(x, out, bmask, amask, Py_ssize_t b_rs, Py_ssize_t b_cs,
                 Py_ssize_t a_rs, Py_ssize_t a_cs, bint log_out, int n_threads):
    """Row softmax of C-contiguous 2-D x into C-contiguous out (same shape and dtype).

    bmask: None or a uint8 array (True = keep); amask: None or an array of x's dtype; each
    addressed from its first element with element strides (b_rs, b_cs) / (a_rs, a_cs).
    """
    cdef Py_buffer xv, ov, bv, av
    cdef char* xp
    cdef char* op
    cdef const uint8_t* bp = NULL
    cdef char* ap = NULL
    cdef Py_ssize_t rows, n
    cdef bint dbl
    xp = _buf(x, &xv, False)
    try:
        rows = xv.shape[0]
        n = xv.shape[1]
        dbl = xv.itemsize == 8
        op = _buf(out, &ov, True)
        try:
            if bmask is not None:
                bp = <const uint8_t*>_buf(bmask, &bv, False)
            try:
                if amask is not None:
                    ap = _buf(amask, &av, False)
                try:
                    with nogil:
                        if dbl:
                            softmax_rows_impl(<const double*>xp, <double*>op, rows, n,
                                              bp, b_rs, b_cs, <const double*>ap, a_rs, a_cs,
                                              log_out, n_threads)
                        else:
                            softmax_rows_impl(<const float*>xp, <float*>op, rows, n,
                                              bp, b_rs, b_cs, <const float*>ap, a_rs, a_cs,
                                              log_out, n_threads)
                finally:
                    if amask is not None:
                        PyBuffer_Release(&av)
            finally:
                if bmask is not None:
                    PyBuffer_Release(&bv)
        finally:
            PyBuffer_Release(&ov)
    finally:
        PyBuffer_Release(&xv)


def matmul_accumulate(a, const int64_t[::1] a_off, Py_ssize_t rsa, Py_ssize_t csa,
                      b, const int64_t[::1] b_off, Py_ssize_t rsb, Py_ssize_t csb,
                      out, const int64_t[::1] c_off, Py_ssize_t rsc, Py_ssize_t csc,
                      Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, double alpha, int n_threads):
    """out[t] += alpha * a[t] @ b[t] for each batch entry t, addressed by element offsets.

    a, b, out are arrays of one float dtype (any strides that are multiples of the itemsize,
    aligned); offsets and strides are in elements, from each array's first element.
    """
    cdef Py_buffer av, bv, cv
    cdef char* ap
    cdef char* bp
    cdef char* cp
    cdef int status = 0
    cdef Py_ssize_t batch = c_off.shape[0]
    cdef Py_ssize_t tile_m, tile_n, tiles
    cdef bint dbl
    # Output tiles: MC x NC, split further along N (in NR steps) until every thread has work.
    tile_m = MC
    tile_n = round_up(N if N < NC else NC, NR)
    tiles = batch * ((M + tile_m - 1) // tile_m) * ((N + tile_n - 1) // tile_n)
    while tiles < 2 * n_threads and tile_n > NR:
        tile_n = round_up(tile_n // 2, NR)
        tiles = batch * ((M + tile_m - 1) // tile_m) * ((N + tile_n - 1) // tile_n)
    if n_threads > tiles:
        n_threads = <int>(tiles if tiles > 0 else 1)
    ap = _buf(a, &av, False)
    try:
        dbl = av.itemsize == 8
        bp = _buf(b, &bv, False)
        try:
            cp = _buf(out, &cv, True)
            try:
                with nogil:
                    if dbl:
                        matmul_tasks_impl(<const double*>ap, &a_off[0], rsa, csa,
                                          <const double*>bp, &b_off[0], rsb, csb,
                                          <double*>cp, &c_off[0], rsc, csc,
                                          batch, M, N, K, alpha, tile_m, tile_n, n_threads, &status)
                    else:
                        matmul_tasks_impl(<const float*>ap, &a_off[0], rsa, csa,
                                          <const float*>bp, &b_off[0], rsb, csb,
                                          <float*>cp, &c_off[0], rsc, csc,
                                          batch, M, N, K, <float>alpha, tile_m, tile_n,
                                          n_threads, &status)
            finally:
                PyBuffer_Release(&cv)
        finally:
            PyBuffer_Release(&bv)
    finally:
        PyBuffer_Release(&av)
    if status:
        raise MemoryError("cyattn.matmul_accumulate: could not allocate packing buffers")


def attention(q, const int64_t[::1] q_off, Py_ssize_t q_rs, Py_ssize_t q_cs,
              k, const int64_t[::1] k_off, Py_ssize_t k_rs, Py_ssize_t k_cs,
              v, const int64_t[::1] v_off, Py_ssize_t v_rs, Py_ssize_t v_cs,
              mask, int mask_kind, const int64_t[::1] m_off, Py_ssize_t m_rs, Py_ssize_t m_cs,
              out, lse, Py_ssize_t L, Py_ssize_t S, Py_ssize_t E, Py_ssize_t Ev,
              double scale, bint causal, Py_ssize_t causal_off, int n_threads):
    """Scaled dot-product attention for `batch = len(q_off)` independent (L, S) problems.

    out: C-contiguous (batch, L, Ev); lse: C-contiguous (batch, L); both of the data dtype.
    mask_kind: 0 none, 1 bool (uint8, True = keep), 2 additive (data dtype).
    """
    cdef Py_buffer qv, kv, vv, mv, ov, lv
    cdef char* qp
    cdef char* kp
    cdef char* vp
    cdef char* mp = NULL
    cdef char* op
    cdef char* lp
    cdef const int64_t* mo = NULL
    cdef int status = 0
    cdef Py_ssize_t batch = q_off.shape[0]
    cdef Py_ssize_t tasks = batch * ((L + QB - 1) // QB)
    cdef bint dbl
    if n_threads > tasks:
        n_threads = <int>(tasks if tasks > 0 else 1)
    qp = _buf(q, &qv, False)
    try:
        dbl = qv.itemsize == 8
        kp = _buf(k, &kv, False)
        try:
            vp = _buf(v, &vv, False)
            try:
                if mask_kind != 0:
                    mp = _buf(mask, &mv, False)
                    mo = &m_off[0]
                try:
                    op = _buf(out, &ov, True)
                    try:
                        lp = _buf(lse, &lv, True)
                        try:
                            with nogil:
                                if dbl:
                                    attention_impl(<const double*>qp, &q_off[0], q_rs, q_cs,
                                                   <const double*>kp, &k_off[0], k_rs, k_cs,
                                                   <const double*>vp, &v_off[0], v_rs, v_cs,
                                                   <const uint8_t*>mp if mask_kind == 1 else NULL,
                                                   <const double*>mp if mask_kind == 2 else NULL,
                                                   mo, m_rs, m_cs, <double*>op, <double*>lp,
                                                   batch, L, S, E, Ev, scale, causal, causal_off,
                                                   n_threads, &status)
                                else:
                                    attention_impl(<const float*>qp, &q_off[0], q_rs, q_cs,
                                                   <const float*>kp, &k_off[0], k_rs, k_cs,
                                                   <const float*>vp, &v_off[0], v_rs, v_cs,
                                                   <const uint8_t*>mp if mask_kind == 1 else NULL,
                                                   <const float*>mp if mask_kind == 2 else NULL,
                                                   mo, m_rs, m_cs, <float*>op, <float*>lp,
                                                   batch, L, S, E, Ev, <float>scale, causal,
                                                   causal_off, n_threads, &status)
                        finally:
                            PyBuffer_Release(&lv)
                    finally:
                        PyBuffer_Release(&ov)
                finally:
                    if mask_kind != 0:
                        PyBuffer_Release(&mv)
            finally:
                PyBuffer_Release(&vv)
        finally:
            PyBuffer_Release(&kv)
    finally:
        PyBuffer_Release(&qv)
    if status:
        raise MemoryError("cyattn.scaled_dot_product_attention: could not allocate scratch")
