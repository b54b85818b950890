# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False, overflowcheck=False
#
# cyattn's compiled kernels. This file is included by every variant module
# (_kernels_baseline.pyx, _kernels_avx2.pyx, _kernels_avx512.pyx); the variants differ in compiler
# flags and in the micro-kernel tile each one defines before the include, so the same loops
# become SSE2 code in one, 256-bit FMA code in the next and 512-bit code in the last.
#
# Design
# ------
# * exp: range reduction x = n ln2 + r (n by the 1.5*2^p shifter trick, Cody-Waite split of ln2),
#   a Taylor polynomial for e^r on |r| <= ln2/2 (degree 7 for float32, 13 for float64) and 2^n
#   applied as two exact power-of-two factors so that subnormal results are rounded once.
#   Arguments below the underflow bound (-inf included) give exactly 0 by a final select, not by
#   underflowing (which costs a microcode assist); +inf overflows to +inf; NaN passes through.
#   The loop body is branch-free and gcc vectorises it. exp_nonpos is the same computation for
#   arguments in [-87, 0] (float64: [-708, 0]), where 2^n is one normal factor and the clamps do
#   nothing: the same bits in ~7 fewer operations. A softmax row or attention score panel whose
#   smallest shifted score is in range (no masked or far-off score) uses it; an attention panel
#   whose only out-of-range scores are masked (-inf) uses it too, with those lanes zeroed.
# * softmax rows: three passes (max and min; exp and sum; scale) with LANES lane-wise partial
#   maxima and sums combined in a fixed order, so results do not depend on threads. Unmasked
#   rows run two at a time with fused loops (softmax_pair_to), the same bits as one by one.
# * decode loops prefetch DECODE_PF_BYTES ahead into L2 (decode was latency-bound at ~60 % of
#   the streaming read bandwidth without it).
# * GEMM (C (+)= alpha A B): BLIS-style. Loops NC -> KC -> MC -> NR -> MR; B is packed into
#   NR-column panels and A into MR-row panels (zero padded at the edges), which also makes any
#   input strides cheap. The micro-kernel keeps an MR x NR accumulator tile in a local array
#   indexed by constant-bound loops; its innermost loop has NR > 16 trips so that gcc vectorises
#   it instead of fully unrolling it. Tiles (float32 / float64): baseline and avx2 4 x 24 / 2 x 24
#   (PERF-NOTES; 2 x 24 the best of 4x12, 2x24, 6x8, 8x8), avx512 8 x 32 / 8 x 24 (16 and 24 of
#   the 32 zmm registers; 8 x 32 measured against 12 x 32, 8 x 48 and 14 x 32 here). KC = 256.
#   The A-panel index must stay a compile-time multiple of MR: a runtime stride there cost the
#   float32 kernel 60 % (measured). Every element of C is summed over K in the same order
#   whatever the tiling, so results are bit-identical for any number of threads. matmul
#   splits its output into tiles only as far as threads need (matmul_tiles): each tile packs
#   its own B, and tiles of MC rows repacked B once per 144 rows (13 % of an n=1024 product).
#   The micro-kernel prefetches every cache line of its C tile on entry (+4-8 % at n >= 1024).
#   Products up to SMALL_MNK with row-major A and B and K <= KC skip packing (gemm_small), and
#   so do products of at most DMR rows with a B of at most SMALL_B_BYTES (K in KC blocks; the
#   avx512 variant only, where packing B cost more than such a product: 1.5-2.8x): a
#   DMR x DNR micro-kernel reads A's rows and B's rows in place (4 rows keep the row pointers
#   in registers; 8 spilled them), with the same multiply-adds in the same order, so the same
#   bits. Packing was a third of an n=64 product.
# * fused attention (Milakov and Gimelshein 2018; Dao et al. 2022): per task (batch entry, group
#   of up to QG_DENSE, or QG with a causal mask, query rows) walk the keys in blocks of KB with
#   an online softmax, transposed:
#   S^T = K Q^T goes straight into the packed-panel layout (NR query lanes per panel) that
#   O^T += V^T P^T reads as its B operand, so the weights are never repacked and the column
#   softmax runs across query lanes. Causal limits skip whole blocks, leading query panels
#   and, per panel, the keys past its last row's limit (same bits: their weights are 0),
#   an all-False bool-mask block is skipped, GQA and broadcasting are offsets per batch entry.
#   Scratch is O(tile) per thread; the L x S matrix never exists.
# * decode (L <= DECODE_MAX_L unit-stride rows, unless the whole problem is tiny): tasks
#   (batch entry, chunk of DECODE_CHUNK keys) stream their keys and values once and leave
#   (max, sum, accumulator) per row; the partials are merged in chunk order. The chunking is
#   fixed, so results do not depend on threads. Zero weights are skipped, so a masked inf/NaN
#   value is never read (the Python side copies strided rows, so every layout decodes).
# * rows whose fused or decode result is not finite (NaN/inf inputs, or a weighted sum of huge
#   finite values that overflows before normalisation) are redone by the two-pass path, which
#   materialises QB x S scores per block, normalises the weights before P V and never reads a
#   value whose weight is exactly 0: the documented inf/NaN results, at two-pass cost, only for
#   those rows.
# * threads: OpenMP only over independent tasks (rows, output tiles, attention tasks), each
#   worker with its own scratch allocated once per call; one thread runs without an OpenMP
#   region. No reduction is ever split across threads. No global mutable state.

from libc.stdlib cimport malloc, free
from libc.string cimport memset, memcpy
from libc.math cimport log, isnan, sqrt
from libc.stdint cimport int32_t, uint32_t, int64_t, uint64_t, uint8_t, uintptr_t
from cpython.buffer cimport (PyObject_GetBuffer, PyBuffer_Release, PyBUF_RECORDS_RO, PyBUF_RECORDS,
                             PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE)
from cython cimport floating
from cython.parallel cimport prange, parallel

from ._kernels cimport (cyattn_cpu_features, cyattn_openmp_enabled, cyattn_omp_max_threads,
                        cyattn_omp_num_procs, cyattn_omp_pause, cyattn_prefetch_w,
                        cyattn_prefetch_r)

cdef extern from *:
    """
    #include <math.h>
    #define CYATTN_INF ((double)INFINITY)
    #define CYATTN_NAN ((double)NAN)
    /* c + a * b rounded as the vectorised micro-kernel rounds it: fused where the variant has
       FMA (gcc contracts the micro-kernel's multiply-add there), separately where it has not. */
    #if defined(__FMA__)
    #define CYATTN_MULADD_F32(a, b, c) fmaf((a), (b), (c))
    #define CYATTN_MULADD_F64(a, b, c) fma((a), (b), (c))
    #else
    #define CYATTN_MULADD_F32(a, b, c) ((a) * (b) + (c))
    #define CYATTN_MULADD_F64(a, b, c) ((a) * (b) + (c))
    #endif
    """
    double CYATTN_INF
    double CYATTN_NAN
    float CYATTN_MULADD_F32(float a, float b, float c) nogil
    double CYATTN_MULADD_F64(double a, double b, double c) nogil

# The micro-kernel tile (MR x NR float32, MRD x NRD float64) and the blocking MC, NC depend on
# the register file, so each variant module defines them before including this file.
cdef enum:
    LANES = 32        # partial maxima / sums per row (lanes_sum/lanes_max/lanes_min assume 32)
    KC = 256          # depth of a packed panel
    QB = 64           # query rows per block of the two-pass (fallback) attention path
    KB = 256          # keys per block of the fused attention (score tile qg x KB)
    QG = 256          # query rows per causal fused attention task (halved down to 64 for
    #                   parallelism); smaller tasks keep a causal mask's uneven work balanced
    QG_DENSE = 1024   # the same without a causal mask and E + Ev <= 256: K and V are packed
    #                   once per task, so bigger groups pack them less often (+5-13 %)
    DECODE_MAX_L = 4  # at most this many query rows take the decode path ...
    DECODE_MIN_WORK = 1024  # ... when batch * S * (E + Ev) >= L * this: the fused path pads
    #                         its query tile to NR rows (up to 32x the work at L = 1) and is
    #                         2-4x slower; only for tiny problems is its lower fixed cost less
    DECODE_PF_BYTES = 4096  # software prefetch distance of the decode loops
    DECODE_CHUNK = 512   # keys per decode task (fixed: results must not depend on threads)
    ALIGN = 64        # scratch alignment in bytes
    SMALL_MNK = 96 * 96 * 96   # matmul products up to this size run unpacked (gemm_small)


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


cdef inline float exp_core_f32(float x, int32_t* ni) noexcept nogil:
    """e**x = p * 2**ni[0]: the range reduction and the polynomial shared by exp_f32 and
    exp_f32_nonpos (which differ only in how 2**n is applied and in their clamps)."""
    cdef float t, n, r, p
    t = x * <float>1.44269504088896341 + <float>12582912.0     # 1.5 * 2**23 shifter
    n = t - <float>12582912.0
    ni[0] = _f32_bits(t) - <int32_t>0x4B400000
    r = x - n * <float>0.693145751953125          # ln2 high part, exact product for |n| < 256
    r = r - n * <float>1.428606765330187045e-06   # ln2 low part
    p = <float>(1.0 / 5040.0)
    p = p * r + <float>(1.0 / 720.0)
    p = p * r + <float>(1.0 / 120.0)
    p = p * r + <float>(1.0 / 24.0)
    p = p * r + <float>(1.0 / 6.0)
    p = p * r + <float>0.5
    p = p * r + <float>1.0
    return p * r + <float>1.0


cdef inline float exp_f32(float x) noexcept nogil:
    """e**x in float32, < 2 ulp; -inf -> 0, +inf -> +inf, NaN -> NaN, subnormals kept."""
    cdef float p
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
    p = exp_core_f32(x, &ni)
    n1 = ni >> 1
    n2 = ni - n1
    p = p * _f32_from_bits((<uint32_t>(n1 + 127)) << 23)     # exact: p times a normal 2**n1
    p = p * _f32_from_bits((<uint32_t>(n2 + 127)) << 23)     # the one rounding (subnormals)
    return _f32_from_bits(<uint32_t>_f32_bits(p) & keep)


cdef inline double exp_core_f64(double x, int64_t* ni) noexcept nogil:
    """e**x = p * 2**ni[0]: as exp_core_f32, for exp_f64 and exp_f64_nonpos."""
    cdef double t, n, r, p
    t = x * 1.4426950408889634074 + 6755399441055744.0         # 1.5 * 2**52 shifter
    n = t - 6755399441055744.0
    ni[0] = _f64_bits(t) - <int64_t>0x4338000000000000
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
    return p * r + 1.0


cdef inline double exp_f64(double x) noexcept nogil:
    """e**x in float64, < 2 ulp; -inf -> 0, +inf -> +inf, NaN -> NaN, subnormals kept."""
    cdef double p
    cdef int64_t ni, n1, n2
    cdef uint64_t keep = 0u - <uint64_t>(not (x < EXP_LO_F64))   # as in exp_f32
    x = _f64_from_bits(<uint64_t>_f64_bits(x) & keep)
    x = EXP_HI_F64 if x > EXP_HI_F64 else x
    p = exp_core_f64(x, &ni)
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


# Arguments at least EXP_NORMAL_* (and at most 0): 2**n is a normal number, so exp_f32's two
# scalings by 2**n1 and 2**n2 equal one scaling by 2**n (each rounds once, from the same exact
# product), and the clamp and the -104 cutoff do nothing. The same bits, ~7 fewer operations.
cdef float EXP_NORMAL_F32 = -87.0
cdef double EXP_NORMAL_F64 = -708.0

cdef inline float exp_f32_nonpos(float x) noexcept nogil:
    """exp_f32(x) for EXP_NORMAL_F32 <= x <= 0 (or NaN); bit-identical to it there."""
    cdef int32_t ni
    cdef float p = exp_core_f32(x, &ni)
    return p * _f32_from_bits((<uint32_t>(ni + 127)) << 23)


cdef inline double exp_f64_nonpos(double x) noexcept nogil:
    """exp_f64(x) for EXP_NORMAL_F64 <= x <= 0 (or NaN); bit-identical to it there."""
    cdef int64_t ni
    cdef double p = exp_core_f64(x, &ni)
    return p * _f64_from_bits((<uint64_t>(ni + 1023)) << 52)


cdef inline floating exp_nonpos(floating x) noexcept nogil:
    if floating is float:
        return exp_f32_nonpos(x)
    else:
        return exp_f64_nonpos(x)


cdef inline floating exp_nonpos_or_zero(floating s, floating shift) noexcept nogil:
    """exp_any(s - shift) where s - shift >= EXP_NORMAL, s == -inf (exactly +0, as exp_any
    gives) or s is NaN (NaN): exp_nonpos, with the masked lanes zeroed by an integer mask (a
    float select would stay a branch under -ftrapping-math). NaN != -inf keeps a NaN."""
    cdef floating e = exp_nonpos(s - shift)
    if floating is float:
        return _f32_from_bits(<uint32_t>_f32_bits(e) & (0u - <uint32_t>(s != -CYATTN_INF)))
    else:
        return _f64_from_bits(<uint64_t>_f64_bits(e)
                              & (<uint64_t>0 - <uint64_t>(s != -CYATTN_INF)))


cdef void exp_array(const floating* x, floating* y, Py_ssize_t n, bint nonpos) noexcept nogil:
    cdef Py_ssize_t j
    if nonpos:
        for j in range(n):
            y[j] = exp_nonpos(x[j])
    else:
        for j in range(n):
            y[j] = exp_any(x[j])


# ------------------------------------------------------------------------------------------
# softmax rows
# ------------------------------------------------------------------------------------------

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
    """One row of softmax_rows_impl: straight from x to y for an unmasked softmax into a
    distinct row (direct), else a masked copy, then in place."""
    if direct:
        softmax_row_to(x, y, n)
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


cdef void softmax_rows_impl(const floating* x, floating* y, Py_ssize_t rows, Py_ssize_t n,
                            const uint8_t* bmask, Py_ssize_t b_rs, Py_ssize_t b_cs,
                            const floating* amask, Py_ssize_t a_rs, Py_ssize_t a_cs,
                            bint log_out, int n_threads) noexcept nogil:
    cdef Py_ssize_t r, pair
    cdef bint direct = bmask == NULL and amask == NULL and x != y and not log_out
    if direct and n >= LANES:           # rows in pairs (softmax_pair_to), the last one alone
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


# ------------------------------------------------------------------------------------------
# GEMM: C (+)= alpha * A @ B on packed panels
# ------------------------------------------------------------------------------------------

cdef inline void transpose_8x8(const floating* a, Py_ssize_t rsa, floating* dst,
                               Py_ssize_t ldd) noexcept nogil:
    """dst[q * ldd + i] = a[i * rsa + q] for i, q < 8.

    Whole rows in (memcpy), a transpose between two local tiles with constant trip counts,
    whole rows out: gcc turns this into vector loads, permutes and stores (written as plain
    element loops it gathers element by element). The element-by-element transposing packs
    were a fifth of a short attention call's time."""
    cdef floating t[8][8]
    cdef floating u[8][8]
    cdef Py_ssize_t i, q
    for i in range(8):
        memcpy(&t[i][0], a + i * rsa, 8 * sizeof(floating))
    for q in range(8):
        for i in range(8):
            u[q][i] = t[i][q]
    for q in range(8):
        memcpy(dst + q * ldd, &u[q][0], 8 * sizeof(floating))


cdef inline void transpose_4x8(const floating* a, Py_ssize_t rsa, floating* dst,
                               Py_ssize_t ldd) noexcept nogil:
    """dst[q * ldd + i] = a[i * rsa + q] for i < 4, q < 8 (as transpose_8x8)."""
    cdef floating t[4][8]
    cdef floating u[8][4]
    cdef Py_ssize_t i, q
    for i in range(4):
        memcpy(&t[i][0], a + i * rsa, 8 * sizeof(floating))
    for q in range(8):
        for i in range(4):
            u[q][i] = t[i][q]
    for q in range(8):
        memcpy(dst + q * ldd, &u[q][0], 4 * sizeof(floating))


cdef void pack_a(Py_ssize_t mc, Py_ssize_t kc, const floating* a, Py_ssize_t rsa, Py_ssize_t csa,
                 floating* dst, Py_ssize_t mr) noexcept nogil:
    """A[0:mc, 0:kc] into mr-row panels: dst[panel][p][i], rows past mc zero.

    The loop order follows the unit stride of A (rows of a row-major A are read contiguously).
    """
    cdef Py_ssize_t ir = 0, p, i, m_here, p8, full, jr
    cdef Py_ssize_t tile_mr = MR if floating is float else MRD
    cdef const floating* src
    if rsa == 1 and csa != 1 and mc >= mr and mr == tile_mr:
        # Column-major A (V^T of a row-major V): each column of A is contiguous, so copy
        # column by column into every full panel. Walking one panel down all kc columns read
        # A in mr-element pieces a whole row of V apart (6 % of a short attention call).
        full = mc - mc % mr
        for p in range(kc):
            src = a + p * csa
            jr = 0
            while jr < full:
                if floating is float:
                    for i in range(MR):
                        dst[jr * kc + p * MR + i] = src[jr + i]
                else:
                    for i in range(MRD):
                        dst[jr * kc + p * MRD + i] = src[jr + i]
                jr += mr
        if full == mc:
            return
        ir = full
        dst += full * kc
    while ir < mc:
        m_here = mc - ir if mc - ir < mr else mr
        if csa == 1 and m_here == mr and (mr == 8 or mr == 4):
            p8 = kc - kc % 8
            if mr == 8:
                for p in range(0, p8, 8):
                    transpose_8x8(a + ir * rsa + p, rsa, dst + p * 8, 8)
            else:
                for p in range(0, p8, 8):
                    transpose_4x8(a + ir * rsa + p, rsa, dst + p * 4, 4)
            for i in range(mr):
                src = a + (ir + i) * rsa
                for p in range(p8, kc):
                    dst[p * mr + i] = src[p]
        elif csa == 1:
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
    cdef Py_ssize_t jr = 0, p, j, n_here, p8, jb, p0, p1, full
    cdef const floating* src
    if csb == 1 and rsb != 1:
        # Row-major B: a block of 8 rows at a time, every full panel's 8 x nr piece in turn.
        # Each row is read front to back and each panel piece is written contiguously; walking
        # one panel down all kc rows instead reads B one cache line per 4 KiB page.
        full = nc - nc % nr
        for p0 in range(0, kc, 8):
            p1 = p0 + 8 if p0 + 8 < kc else kc
            jr = 0
            while jr < full:
                for p in range(p0, p1):
                    memcpy(dst + jr * kc + p * nr, b + p * rsb + jr, nr * sizeof(floating))
                jr += nr
        if full == nc:
            return
        jr = full
        dst += full * kc
    while jr < nc:
        n_here = nc - jr if nc - jr < nr else nr
        if rsb == 1 and csb != 1 and n_here == nr and nr % 8 == 0:
            p8 = kc - kc % 8
            for jb in range(0, nr, 8):
                for p in range(0, p8, 8):
                    transpose_8x8(b + (jr + jb) * csb + p, csb, dst + p * nr + jb, nr)
            for j in range(nr):
                src = b + (jr + j) * csb
                for p in range(p8, kc):
                    dst[p * nr + j] = src[p]
        elif rsb == 1 and csb != 1:
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
    cdef float zero = 0
    cdef float* c_row
    # C is read and written after the k loop: prefetch every cache line of the tile's rows
    # when accumulating into it (+4-8 % on large products), only each row's first otherwise
    if overwrite or csc != 1:
        for i in range(MR):
            cyattn_prefetch_w(c + i * rsc)
    else:
        for i in range(MR):
            for j in range(0, NR, 16):
                cyattn_prefetch_w(c + i * rsc + j)
            cyattn_prefetch_w(c + i * rsc + NR - 1)
    if kc <= 0:                 # (no caller passes it) C = 0, or C unchanged
        if overwrite:
            for i in range(m_here):
                for j in range(n_here):
                    c[i * rsc + j * csc] = 0
        return
    # The first k step starts the sums (0 + a b, the same as zeroing and accumulating):
    # zeroing acc made gcc clear its stack copy with a 1 KiB rep stos on every call.
    for i in range(MR):
        a_i = pa[i]
        for j in range(NR):
            acc[i][j] = a_i * pb[j] + zero
    for p in range(1, kc):
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
    cdef double zero = 0
    cdef double* c_row
    # C is read and written after the k loop: prefetch every cache line of the tile's rows
    # when accumulating into it (+4-8 % on large products), only each row's first otherwise
    if overwrite or csc != 1:
        for i in range(MRD):
            cyattn_prefetch_w(c + i * rsc)
    else:
        for i in range(MRD):
            for j in range(0, NRD, 8):
                cyattn_prefetch_w(c + i * rsc + j)
            cyattn_prefetch_w(c + i * rsc + NRD - 1)
    if kc <= 0:                 # (no caller passes it) C = 0, or C unchanged
        if overwrite:
            for i in range(m_here):
                for j in range(n_here):
                    c[i * rsc + j * csc] = 0
        return
    # The first k step starts the sums (0 + a b, the same as zeroing and accumulating):
    # zeroing acc made gcc clear its stack copy with a 1 KiB rep stos on every call.
    for i in range(MRD):
        a_i = pa[i]
        for j in range(NRD):
            acc[i][j] = a_i * pb[j] + zero
    for p in range(1, kc):
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


cdef void micro_kernel_direct(Py_ssize_t kc, const floating* a, Py_ssize_t rsa,
                              const floating* zeros, const floating* b, Py_ssize_t rsb,
                              floating* c, Py_ssize_t rsc, Py_ssize_t csc,
                              Py_ssize_t m_here, Py_ssize_t n_here, floating alpha) noexcept nogil:
    """C[0:m_here, 0:n_here] += alpha * A[0:m_here, 0:kc] @ B[0:kc, 0:nr] with A and B read
    in place (unit column strides; B holds DNR / DNRD readable columns): the unpacked
    micro-kernel of products too small to amortise packing. A's rows past m_here read
    ``zeros`` (kc zeros).
    Each element is summed over k in the same order, with the same multiply-adds, as by the
    packed micro-kernel, so the bits are the same. kc >= 1."""
    cdef floating acc[DMR_MAX][DNR_MAX]
    cdef const floating* ar[DMR_MAX]
    cdef const floating* bp
    cdef Py_ssize_t p, i, j
    cdef floating a_i
    cdef floating zero = 0
    cdef floating* c_row
    if floating is float:
        for i in range(DMR):
            ar[i] = a + i * rsa if i < m_here else zeros
        for i in range(DMR):             # the first k step starts the sums (micro_kernel_f32)
            a_i = ar[i][0]
            for j in range(DNR):
                acc[i][j] = a_i * b[j] + zero
        for p in range(1, kc):
            bp = b + p * rsb
            for i in range(DMR):
                a_i = ar[i][p]
                for j in range(DNR):
                    acc[i][j] += a_i * bp[j]
        if m_here == DMR and n_here == DNR and csc == 1:
            for i in range(DMR):
                c_row = c + i * rsc
                for j in range(DNR):
                    c_row[j] += alpha * acc[i][j]
            return
    else:
        for i in range(DMRD):
            ar[i] = a + i * rsa if i < m_here else zeros
        for i in range(DMRD):             # the first k step starts the sums (micro_kernel_f32)
            a_i = ar[i][0]
            for j in range(DNRD):
                acc[i][j] = a_i * b[j] + zero
        for p in range(1, kc):
            bp = b + p * rsb
            for i in range(DMRD):
                a_i = ar[i][p]
                for j in range(DNRD):
                    acc[i][j] += a_i * bp[j]
        if m_here == DMRD and n_here == DNRD and csc == 1:
            for i in range(DMRD):
                c_row = c + i * rsc
                for j in range(DNRD):
                    c_row[j] += alpha * acc[i][j]
            return
    for i in range(m_here):
        for j in range(n_here):
            c[i * rsc + j * csc] += alpha * acc[i][j]


cdef void micro_kernel_row(Py_ssize_t kc, const floating* a, const floating* b,
                           Py_ssize_t rsb, floating* c, floating alpha) noexcept nogil:
    """c[0:w] += alpha * a[0:kc] @ B[0:kc, 0:w] for one row of A, w = MR x NR (MRD x NRD for
    float64) columns, B's rows read in place (unit column stride) and c contiguous: the
    accumulators of a whole tile hold one row, so each step reads w adjacent elements of B.
    Per element the same multiply-adds in the same order as the other micro-kernels, so the
    same bits. kc >= 1."""
    cdef floating acc[MR][NR]
    cdef const floating* bp
    cdef Py_ssize_t p, i, j
    cdef floating a_p
    cdef floating zero = 0
    if floating is float:
        a_p = a[0]
        for i in range(MR):             # the first k step starts the sums (micro_kernel_f32)
            for j in range(NR):
                acc[i][j] = a_p * b[i * NR + j] + zero
        for p in range(1, kc):
            a_p = a[p]
            bp = b + p * rsb
            for i in range(MR):
                for j in range(NR):
                    acc[i][j] += a_p * bp[i * NR + j]
        for i in range(MR):
            for j in range(NR):
                c[i * NR + j] += alpha * acc[i][j]
    else:
        a_p = a[0]
        for i in range(MRD):
            for j in range(NRD):
                acc[i][j] = a_p * b[i * NRD + j] + zero
        for p in range(1, kc):
            a_p = a[p]
            bp = b + p * rsb
            for i in range(MRD):
                for j in range(NRD):
                    acc[i][j] += a_p * bp[i * NRD + j]
        for i in range(MRD):
            for j in range(NRD):
                c[i * NRD + j] += alpha * acc[i][j]


cdef void gemm_small(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, floating alpha,
                     const floating* a, Py_ssize_t rsa, const floating* b, Py_ssize_t rsb,
                     floating* c, Py_ssize_t rsc, Py_ssize_t csc,
                     floating* buf_a, floating* buf_b) noexcept nogil:
    """C += alpha A B for A, B with unit column strides, unpacked: full column panels of B are
    read in place, the last partial one is packed (zero padded) into buf_b, and buf_a holds
    the min(K, KC) zeros that stand in for A's rows past M (read only when M is not a
    multiple of the tile's rows). K runs in KC blocks in order, each added to C, exactly as
    in the packed path, so the bits are the same."""
    cdef Py_ssize_t mr = DMR if floating is float else DMRD
    cdef Py_ssize_t nr = DNR if floating is float else DNRD
    cdef Py_ssize_t row_w = MR * NR if floating is float else MRD * NRD
    cdef Py_ssize_t jr, ir, n_here, pc, kc
    cdef const floating* bj
    cdef Py_ssize_t ldb
    if M % mr:
        memset(buf_a, 0, <size_t>(K if K < KC else KC) * sizeof(floating))
    jr = 0
    if M == 1 and csc == 1:
        # one row: whole tiles of accumulators along the row (micro_kernel_row), the
        # remaining columns below
        while jr + row_w <= N:
            pc = 0
            while pc < K:
                kc = K - pc if K - pc < KC else KC
                micro_kernel_row(kc, a + pc, b + pc * rsb + jr, rsb, c + jr, alpha)
                pc += KC
            jr += row_w
    while jr < N:
        n_here = N - jr if N - jr < nr else nr
        pc = 0
        while pc < K:
            kc = K - pc if K - pc < KC else KC
            if n_here == nr:
                bj = b + pc * rsb + jr
                ldb = rsb
            else:
                pack_b(kc, n_here, b + pc * rsb + jr, rsb, 1, buf_b, nr)
                bj = buf_b
                ldb = nr
            ir = 0
            while ir < M:
                micro_kernel_direct(kc, a + ir * rsa + pc, rsa, buf_a, bj, ldb,
                                    c + ir * rsc + jr * csc, rsc, csc,
                                    M - ir if M - ir < mr else mr, n_here, alpha)
                ir += mr
            pc += KC
        jr += nr


cdef void gemm_block(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, floating alpha,
                     const floating* a, Py_ssize_t rsa, Py_ssize_t csa,
                     const floating* b, Py_ssize_t rsb, Py_ssize_t csb,
                     floating* c, Py_ssize_t rsc, Py_ssize_t csc,
                     bint overwrite, floating* buf_a, floating* buf_b) noexcept nogil:
    """C[M, N] (+)= alpha * A[M, K] @ B[K, N], any strides, single-threaded.

    buf_a holds MC x KC and buf_b KC x min(NC, round_up(N, nr)) elements. With ``overwrite``
    C is written (C = alpha A B), else accumulated. C is summed over K in KC blocks in order, so
    each element's result does not depend on how M and N are tiled.
    """
    cdef Py_ssize_t jc, pc, ic, jr, ir, nc, kc, mc
    cdef bint first
    cdef Py_ssize_t i, j
    cdef Py_ssize_t mr = MR if floating is float else MRD
    cdef Py_ssize_t nr = NR if floating is float else NRD
    cdef Py_ssize_t dnr = DNR if floating is float else DNRD
    cdef Py_ssize_t dmr = DMR if floating is float else DMRD
    if M <= 0 or N <= 0:
        return
    if K <= 0:
        if overwrite:
            for i in range(M):
                for j in range(N):
                    c[i * rsc + j * csc] = 0
        return
    if (csa == 1 and csb == 1 and not overwrite
            and ((K <= KC and M * N * K <= SMALL_MNK)
                 or (M <= dmr and N * K * <Py_ssize_t>sizeof(floating) <= SMALL_B_BYTES))
            and round_up(N, dnr) - N <= round_up(N, nr) - N):
        # row-major, small (or one tile of rows against a B that L2 holds), and the unpacked
        # tile pads no more columns than the packed one
        gemm_small(M, N, K, alpha, a, rsa, b, rsb, c, rsc, csc, buf_a, buf_b)
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


cdef void matmul_tiles(Py_ssize_t batch, Py_ssize_t M, Py_ssize_t N, Py_ssize_t mr,
                       Py_ssize_t nr, int* n_threads, Py_ssize_t* tile_m,
                       Py_ssize_t* tile_n) noexcept nogil:
    """Output tiles (tile_m x tile_n) of a batched product; caps n_threads at the tile count.

    Each tile packs its own rows of A and columns of B (gemm_block), so one tile per batch entry
    (at most NC wide) packs each operand once. With several threads, tiles are halved until
    every thread has two, always along the longer side, so that the smaller operand is the one
    packed again. Tiling never splits K, so the result does not depend on it.
    """
    cdef Py_ssize_t tm = round_up(M, mr)
    cdef Py_ssize_t tn = round_up(N if N < NC else NC, nr)
    cdef Py_ssize_t want = 2 * n_threads[0] if n_threads[0] > 1 else 1
    cdef Py_ssize_t tiles = batch * ((M + tm - 1) // tm) * ((N + tn - 1) // tn)
    while tiles < want:
        if tm > mr and (tm >= tn or tn <= nr):
            tm = round_up(tm // 2, mr)
        elif tn > nr:
            tn = round_up(tn // 2, nr)
        else:
            break
        tiles = batch * ((M + tm - 1) // tm) * ((N + tn - 1) // tn)
    if n_threads[0] > tiles:
        n_threads[0] = <int>(tiles if tiles > 0 else 1)
    tile_m[0] = tm
    tile_n[0] = tn


cdef int matmul_worker(const floating* a, const int64_t* a_off, Py_ssize_t rsa, Py_ssize_t csa,
                       const floating* b, const int64_t* b_off, Py_ssize_t rsb, Py_ssize_t csb,
                       floating* c, const int64_t* c_off, Py_ssize_t rsc, Py_ssize_t csc,
                       Py_ssize_t batch, Py_ssize_t M, Py_ssize_t N, Py_ssize_t K,
                       floating alpha, Py_ssize_t tile_m, Py_ssize_t tile_n,
                       Py_ssize_t first, Py_ssize_t step) noexcept nogil:
    """Output tiles first, first + step, ... of a batched C += alpha A B, with this worker's
    own packing buffers (sized to the problem); 1 if they cannot be allocated."""
    cdef Py_ssize_t tiles_m = (M + tile_m - 1) // tile_m
    cdef Py_ssize_t tiles_n = (N + tile_n - 1) // tile_n
    cdef Py_ssize_t ntasks = batch * tiles_m * tiles_n
    cdef Py_ssize_t t, bi, ti, tj, i0, j0, mm, nn
    cdef Py_ssize_t kc_max = K if K < KC else KC
    cdef Py_ssize_t nb = max(round_up(min(tile_n, N, NC), NR if floating is float else NRD),
                             DNR_MAX)
    cdef Py_ssize_t ma = round_up(tile_m if tile_m < M else M, MR if floating is float else MRD)
    cdef size_t bytes_a = <size_t>((ma if ma < MC else MC) * (kc_max if kc_max > 0 else 1)) \
        * sizeof(floating)
    cdef size_t bytes_b = <size_t>(nb * (kc_max if kc_max > 0 else 1)) * sizeof(floating)
    cdef void* raw = malloc(bytes_a + bytes_b + 2 * ALIGN)
    cdef floating* buf_a
    cdef floating* buf_b
    if raw == NULL:
        return 1
    buf_a = <floating*>align_ptr(raw)
    buf_b = <floating*>align_ptr(<char*>buf_a + bytes_a)
    t = first
    while t < ntasks:
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
        t += step
    free(raw)
    return 0


cdef void matmul_tasks_impl(const floating* a, const int64_t* a_off, Py_ssize_t rsa, Py_ssize_t csa,
                            const floating* b, const int64_t* b_off, Py_ssize_t rsb, Py_ssize_t csb,
                            floating* c, const int64_t* c_off, Py_ssize_t rsc, Py_ssize_t csc,
                            Py_ssize_t batch, Py_ssize_t M, Py_ssize_t N, Py_ssize_t K,
                            floating alpha, Py_ssize_t tile_m, Py_ssize_t tile_n,
                            int n_threads, int* status) noexcept nogil:
    """Batched C += alpha A B over (batch, tile_m x tile_n output tiles): worker w of
    n_threads takes tiles w, w + n_threads, ... One thread runs without an OpenMP region."""
    cdef Py_ssize_t w
    if batch <= 0 or M <= 0 or N <= 0:
        return
    if n_threads <= 1:
        if matmul_worker(a, a_off, rsa, csa, b, b_off, rsb, csb, c, c_off, rsc, csc,
                         batch, M, N, K, alpha, tile_m, tile_n, 0, 1):
            status[0] = 1
        return
    for w in prange(n_threads, num_threads=n_threads, schedule='static', chunksize=1):
        if matmul_worker(a, a_off, rsa, csa, b, b_off, rsb, csb, c, c_off, rsc, csc,
                         batch, M, N, K, alpha, tile_m, tile_n, w, n_threads):
            status[0] = 1


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
        if nonpos:                  # no masked or far-off score: the same bits, fewer steps
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
                      bint causal, Py_ssize_t causal_off) noexcept nogil:
    """Apply the causal limit and the masks to a panel: key j0 + p, query q0 + j (j < lanes).

    Lanes past ``lanes`` are padding (no query) and are left alone, so no mask row past the
    last query is read.
    """
    cdef Py_ssize_t p, j, cut, first
    cdef floating neg_inf = <floating>-CYATTN_INF
    cdef floating* row
    cdef const uint8_t* b_col
    cdef const floating* a_col
    # One loop per mask, each over the keys it touches only (every element still sees the
    # causal limit, then the bool mask, then the additive mask); a panel without masks costs
    # nothing (a do-nothing loop over the keys was ~2 % of an unmasked call).
    if causal:
        # query i sees key j0 + p iff j0 + p <= i + causal_off: lanes j < cut are cut off
        first = causal_off + q0 - j0 + 1
        for p in range(first if first > 0 else 0, kb):
            row = panel + p * nr
            cut = j0 + p - causal_off - q0
            if cut > nr:
                cut = nr
            for j in range(cut):
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


cdef void fused_attention_task(const floating* q, Py_ssize_t q_rs, Py_ssize_t q_cs,
                               const floating* k, Py_ssize_t k_rs, Py_ssize_t k_cs,
                               const floating* v, Py_ssize_t v_rs, Py_ssize_t v_cs,
                               const uint8_t* bmask, const floating* amask,
                               Py_ssize_t m_rs, Py_ssize_t m_cs,
                               floating* out, floating* lse,
                               Py_ssize_t i0, Py_ssize_t rows, Py_ssize_t S,
                               Py_ssize_t E, Py_ssize_t Ev, floating scale,
                               bint causal, Py_ssize_t causal_off,
                               floating* qt_packed, floating* k_packed, floating* vt_packed,
                               floating* tile, floating* ot, Py_ssize_t ld_o,
                               floating* row_m, floating* row_l, floating* factor,
                               bint want_lse) noexcept nogil:
    """Rows i0 .. i0+rows of one (batch, head) by the online softmax over key blocks of KB.

    Transposed formulation: per key block, S^T = K Q^T is computed straight into ``tile`` in
    the packed-panel layout (nr query lanes per panel, one row per key) that the next product
    reads as its B operand, so P is never repacked; the column softmax runs across query
    lanes (vectorised); then O^T += V^T P^T. Query panels that a causal mask keeps from seeing
    the whole block are skipped, as are blocks a bool mask removes entirely and the blocks past
    the last row's causal limit; a panel stops at the keys its last row may see. At the end
    out = (O^T)^T / sum and lse = max + log(sum). Without ``want_lse`` (the caller discards
    lse) max + sum is stored instead: it is inf or NaN exactly when max + log(sum) is (sum is
    at least 1 and at most S), which is all that redo_nonfinite_rows reads, and it saves a
    log per row (2-3 % of a call with L = S = 128).
    """
    cdef Py_ssize_t mr = MR if floating is float else MRD
    cdef Py_ssize_t nr = NR if floating is float else NRD
    cdef Py_ssize_t panels = (rows + nr - 1) // nr
    cdef Py_ssize_t kv_end = S, j0, kb, kq, jp, jp0, ir, pc, kc, r, e, first_q, lanes
    cdef floating inv, acc, w
    cdef bint v_bad, rescale
    cdef floating* o_row
    cdef floating* panel
    cdef floating* ot_col
    for r in range(panels * nr):
        row_m[r] = <floating>-CYATTN_INF
        row_l[r] = 0
    memset(ot, 0, <size_t>(ld_o * (Ev if Ev > 0 else 1)) * sizeof(floating))
    if causal:
        kv_end = i0 + rows + causal_off         # one past the last key any row here may see
        kv_end = S if kv_end > S else (0 if kv_end < 0 else kv_end)
    if kv_end > 0:
        pack_b(E, rows, q + i0 * q_rs, q_cs, q_rs, qt_packed, nr)      # Q^T: E x rows
    j0 = 0
    while j0 < kv_end:
        kb = kv_end - j0 if kv_end - j0 < KB else KB
        jp0 = 0
        if causal:
            first_q = j0 - causal_off - i0      # queries before this one see none of the keys
            jp0 = 0 if first_q < 0 else first_q // nr
        if bmask != NULL and bool_block_empty(bmask, m_rs, m_cs, i0 + jp0 * nr, i0 + rows,
                                              j0, kb):
            j0 += KB
            continue
        pack_a(kb, E, k + j0 * k_rs, k_rs, k_cs, k_packed, mr)         # K block: kb x E
        v_bad = False
        if Ev > 0:
            pack_a(Ev, kb, v + j0 * v_rs, v_cs, v_rs, vt_packed, mr)   # V^T: Ev x kb
            v_bad = has_nonfinite(vt_packed, 1, round_up(Ev, mr) * kb, 0, 1)
        for jp in range(jp0, panels):
            panel = tile                        # one panel at a time: KB x nr scratch
            lanes = rows - jp * nr if rows - jp * nr < nr else nr
            kq = kb
            if causal:                          # keys past the panel's last row's limit
                kq = i0 + jp * nr + lanes + causal_off - j0
                kq = kb if kq > kb else kq
            # scores^T for this query panel: (kb x E) @ (E x nr), into the panel layout
            ir = 0
            while ir < kq:
                if E <= 0:
                    for r in range(ir * nr, (ir + mr if ir + mr < kq else kq) * nr):
                        panel[r] = 0
                pc = 0
                while pc < E:
                    kc = E - pc if E - pc < KC else KC
                    if floating is float:
                        micro_kernel_f32(kc, k_packed + ir * E + pc * mr,
                                         qt_packed + jp * E * nr + pc * nr,
                                         panel + ir * nr, nr, 1,
                                         kq - ir if kq - ir < mr else mr, nr, scale, pc == 0)
                    else:
                        micro_kernel_f64(kc, k_packed + ir * E + pc * mr,
                                         qt_packed + jp * E * nr + pc * nr,
                                         panel + ir * nr, nr, 1,
                                         kq - ir if kq - ir < mr else mr, nr, scale, pc == 0)
                    pc += KC
                ir += mr
            panel_masks(panel, kq, nr, lanes, i0 + jp * nr, j0, bmask, amask, m_rs, m_cs,
                        causal, causal_off)
            panel_online_softmax(panel, kq, row_m + jp * nr, row_l + jp * nr, factor)
            if Ev <= 0:
                continue
            rescale = False
            for r in range(nr):
                rescale = rescale | (factor[r] != 1)
            if rescale:                         # x * 1 == x: skip when no lane's max grew
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
                        for pc in range(kq):
                            w = panel[pc * nr + r]
                            if w != 0:
                                if floating is float:
                                    acc = CYATTN_MULADD_F32(w, v[(j0 + pc) * v_rs + e * v_cs],
                                                            acc)
                                else:
                                    acc = CYATTN_MULADD_F64(w, v[(j0 + pc) * v_rs + e * v_cs],
                                                            acc)
                        ot_col[r] = ot_col[r] + acc
                continue
            # O^T += V^T (Ev x kq) @ P^T (kq x nr); a key past kq has weight 0 in every lane
            ir = 0
            while ir < Ev:
                pc = 0
                while pc < kq:
                    kc = kq - pc if kq - pc < KC else KC
                    if floating is float:
                        micro_kernel_f32(kc, vt_packed + ir * kb + pc * mr, panel + pc * nr,
                                         ot + ir * ld_o + jp * nr, ld_o, 1,
                                         Ev - ir if Ev - ir < mr else mr, nr, 1, False)
                    else:
                        micro_kernel_f64(kc, vt_packed + ir * kb + pc * mr, panel + pc * nr,
                                         ot + ir * ld_o + jp * nr, ld_o, 1,
                                         Ev - ir if Ev - ir < mr else mr, nr, 1, False)
                    pc += KC
                ir += mr
        j0 += KB
    for r in range(rows):
        o_row = out + r * Ev
        if row_l[r] == 0:                       # fully masked: output 0, lse -inf
            for e in range(Ev):
                o_row[e] = 0
            lse[r] = <floating>-CYATTN_INF
            continue
        inv = <floating>1 / row_l[r]
        for e in range(Ev):
            o_row[e] = ot[e * ld_o + r] * inv
        if want_lse:
            lse[r] = row_m[r] + <floating>log(row_l[r])
        else:
            lse[r] = row_m[r] + row_l[r]


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
                             floating* out, floating* lse,
                             Py_ssize_t i0, Py_ssize_t rows, Py_ssize_t S,
                             Py_ssize_t E, Py_ssize_t Ev, floating scale,
                             bint causal, Py_ssize_t causal_off) noexcept nogil:
    """Redo, by the two-pass path, each run of rows whose fused result is not finite.

    Only those rows: a row's result then does not depend on which rows share its task, so
    results stay the same for any grouping and thread count. 1 if out of memory.
    """
    cdef Py_ssize_t r = 0, run_end
    while r < rows:
        if not row_nonfinite(out + r * Ev, lse[r], Ev):
            r += 1
            continue
        run_end = r + 1
        while run_end < rows and row_nonfinite(out + run_end * Ev, lse[run_end], Ev):
            run_end += 1
        if legacy_attention_rows(q, q_rs, q_cs, k, k_rs, k_cs, v, v_rs, v_cs, bmask, amask,
                                 m_rs, m_cs, out + r * Ev, lse + r, i0 + r, run_end - r,
                                 S, E, Ev, scale, causal, causal_off):
            return 1
        r = run_end
    return 0


cdef int legacy_attention_rows(const floating* q, Py_ssize_t q_rs, Py_ssize_t q_cs,
                               const floating* k, Py_ssize_t k_rs, Py_ssize_t k_cs,
                               const floating* v, Py_ssize_t v_rs, Py_ssize_t v_cs,
                               const uint8_t* bmask, const floating* amask,
                               Py_ssize_t m_rs, Py_ssize_t m_cs,
                               floating* out, floating* lse,
                               Py_ssize_t i0, Py_ssize_t rows, Py_ssize_t S,
                               Py_ssize_t E, Py_ssize_t Ev, floating scale,
                               bint causal, Py_ssize_t causal_off) noexcept nogil:
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
    cdef Py_ssize_t done = 0, n
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
        attention_task(q, q_rs, q_cs, kt_packed, v_packed, bmask, amask, m_rs, m_cs,
                       out + done * Ev, lse + done, i0 + done, n, S, E, Ev, scale,
                       causal, causal_off, v, v_rs, v_cs, v_nonfinite,
                       scores, ld_scores, q_packed, p_packed)
        done += n
    free(raw)
    return 0


cdef int attention_worker(const floating* q, const int64_t* q_off, Py_ssize_t q_rs,
                          Py_ssize_t q_cs,
                          const floating* k, const int64_t* k_off, Py_ssize_t k_rs, Py_ssize_t k_cs,
                          const floating* v, const int64_t* v_off, Py_ssize_t v_rs, Py_ssize_t v_cs,
                          const uint8_t* bmask, const floating* amask, const int64_t* m_off,
                          Py_ssize_t m_rs, Py_ssize_t m_cs,
                          floating* out, floating* lse,
                          Py_ssize_t batch, Py_ssize_t L, Py_ssize_t S, Py_ssize_t E,
                          Py_ssize_t Ev, floating scale, bint causal, Py_ssize_t causal_off,
                          Py_ssize_t qg, bint want_lse, Py_ssize_t first,
                          Py_ssize_t step) noexcept nogil:
    """Fused attention tasks first, first + step, ... with this worker's own scratch;
    1 if it cannot be allocated. See attention_impl."""
    cdef Py_ssize_t groups = (L + qg - 1) // qg
    cdef Py_ssize_t ntasks = batch * groups
    cdef Py_ssize_t t, bi, i0, rows, mo
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
    cdef void* raw = malloc(bytes_q + bytes_k + bytes_v + bytes_tile + bytes_o + bytes_rows
                            + 7 * ALIGN)
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
    t = first
    while t < ntasks:
        bi = t % batch
        i0 = (t // batch) * qg
        rows = L - i0 if L - i0 < qg else qg
        mo = m_off[bi] if m_off != NULL else 0
        fused_attention_task(q + q_off[bi], q_rs, q_cs, k + k_off[bi], k_rs, k_cs,
                             v + v_off[bi], v_rs, v_cs,
                             bmask + mo if bmask != NULL else NULL,
                             amask + mo if amask != NULL else NULL, m_rs, m_cs,
                             out + (bi * L + i0) * Ev, lse + bi * L + i0,
                             i0, rows, S, E, Ev, scale, causal, causal_off,
                             qt_packed, k_packed, vt_packed, tile, ot, ld_o,
                             row_m, row_m + qlanes, row_m + 2 * qlanes, want_lse)
        if redo_nonfinite_rows(q + q_off[bi], q_rs, q_cs, k + k_off[bi], k_rs, k_cs,
                               v + v_off[bi], v_rs, v_cs,
                               bmask + mo if bmask != NULL else NULL,
                               amask + mo if amask != NULL else NULL, m_rs, m_cs,
                               out + (bi * L + i0) * Ev, lse + bi * L + i0,
                               i0, rows, S, E, Ev, scale, causal, causal_off):
            free(raw)
            return 1
        t += step
    free(raw)
    return 0


cdef void attention_impl(const floating* q, const int64_t* q_off, Py_ssize_t q_rs, Py_ssize_t q_cs,
                         const floating* k, const int64_t* k_off, Py_ssize_t k_rs, Py_ssize_t k_cs,
                         const floating* v, const int64_t* v_off, Py_ssize_t v_rs, Py_ssize_t v_cs,
                         const uint8_t* bmask, const floating* amask, const int64_t* m_off,
                         Py_ssize_t m_rs, Py_ssize_t m_cs,
                         floating* out, floating* lse,
                         Py_ssize_t batch, Py_ssize_t L, Py_ssize_t S, Py_ssize_t E, Py_ssize_t Ev,
                         floating scale, bint causal, Py_ssize_t causal_off, Py_ssize_t qg,
                         bint want_lse, int n_threads, int* status) noexcept nogil:
    """Tasks (query group of qg rows, batch entry) in parallel, dealt out round-robin.

    Task t covers batch entry t % batch and query group t // batch, so that consecutive tasks,
    dealt out one at a time, belong to different heads and a causal mask's cheap early groups
    and expensive late ones spread over the threads. Scratch per thread is O(tile): packed Q^T
    (E x qg), one key block of K (KB x E) and V^T (Ev x KB), the score tile (KB x qg) and the
    output accumulator O^T (Ev x qg), allocated once per call. Rows whose result is not finite
    are redone by legacy_attention_rows (see there). One thread runs without an OpenMP region.
    """
    cdef Py_ssize_t w
    if batch <= 0 or L <= 0:
        return
    if n_threads <= 1:
        if attention_worker(q, q_off, q_rs, q_cs, k, k_off, k_rs, k_cs, v, v_off, v_rs, v_cs,
                            bmask, amask, m_off, m_rs, m_cs, out, lse, batch, L, S, E, Ev,
                            scale, causal, causal_off, qg, want_lse, 0, 1):
            status[0] = 1
        return
    for w in prange(n_threads, num_threads=n_threads, schedule='static', chunksize=1):
        if attention_worker(q, q_off, q_rs, q_cs, k, k_off, k_rs, k_cs, v, v_off, v_rs, v_cs,
                            bmask, amask, m_off, m_rs, m_cs, out, lse, batch, L, S, E, Ev,
                            scale, causal, causal_off, qg, want_lse, w, n_threads):
            status[0] = 1


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


cdef void attention_decode_impl(const floating* q, const int64_t* q_off, Py_ssize_t q_rs,
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


def exp_values(x, out, bint nonpos=False):
    """out = exp(x) with the kernels' exp (1-D float32/float64 C-contiguous arrays).

    nonpos: with the shortened exp of arguments in [EXP_NORMAL, 0] (-87 for float32, -708 for
    float64), which must give the same bits there (tests only; other arguments are undefined).
    """
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
                    exp_array(<const double*>xp, <double*>op, n, nonpos)
                else:
                    exp_array(<const float*>xp, <float*>op, n, nonpos)
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
    cdef Py_ssize_t tile_m, tile_n
    cdef bint dbl
    if a.itemsize == 8:
        matmul_tiles(batch, M, N, MRD, NRD, &n_threads, &tile_m, &tile_n)
    else:
        matmul_tiles(batch, M, N, MR, NR, &n_threads, &tile_m, &tile_n)
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


cdef int attention_run(bint dbl, const char* qp, const int64_t* q_off,
                       Py_ssize_t q_rs, Py_ssize_t q_cs,
                       const char* kp, const int64_t* k_off, Py_ssize_t k_rs, Py_ssize_t k_cs,
                       const char* vp, const int64_t* v_off, Py_ssize_t v_rs, Py_ssize_t v_cs,
                       const char* mp, int mask_kind, const int64_t* mo,
                       Py_ssize_t m_rs, Py_ssize_t m_cs,
                       char* op, char* lp, Py_ssize_t batch, Py_ssize_t L, Py_ssize_t S,
                       Py_ssize_t E, Py_ssize_t Ev, double scale, bint causal,
                       Py_ssize_t causal_off, bint want_lse, int n_threads) noexcept nogil:
    """Pick the attention path and run it; 0, or 1 if scratch could not be allocated.
    Without ``want_lse`` the fused path leaves lse holding values that are inf or NaN where
    the true lse would be, not the lse itself (see fused_attention_task).

    A few query rows (unit-stride rows, more than a tiny problem) take the decode path,
    parallel over key chunks; everything else the fused path. The choice depends only on
    the shapes and strides, never on the thread count, and neither does any result.
    """
    cdef int status = 0
    # wide groups only for heads up to 128 + 128: their packed Q^T and O^T (qg x (E + Ev))
    # then stay within 1 MiB of L2, and scratch stays O(input) for wider heads
    cdef Py_ssize_t qg = QG_DENSE if not causal and E + Ev <= 256 else QG
    cdef Py_ssize_t tasks = batch * ((L + qg - 1) // qg)
    cdef bint decode = (0 < L <= DECODE_MAX_L and batch * S * (E + Ev) >= L * DECODE_MIN_WORK
                        and q_cs == 1 and k_cs == 1 and v_cs == 1)
    if decode:
        tasks = batch * ((S + DECODE_CHUNK - 1) // DECODE_CHUNK)
    # Smaller query groups when there are too few tasks to keep the threads busy (every row
    # is computed the same way in any group).
    while not decode and qg > 64 and tasks < 2 * n_threads:
        qg //= 2
        tasks = batch * ((L + qg - 1) // qg)
    if n_threads > tasks:
        n_threads = <int>(tasks if tasks > 0 else 1)
    if decode:
        if dbl:
            attention_decode_impl(<const double*>qp, q_off, q_rs, <const double*>kp, k_off, k_rs,
                                  <const double*>vp, v_off, v_rs,
                                  <const uint8_t*>mp if mask_kind == 1 else NULL,
                                  <const double*>mp if mask_kind == 2 else NULL,
                                  mo, m_rs, m_cs, <double*>op, <double*>lp,
                                  batch, L, S, E, Ev, scale, causal, causal_off,
                                  n_threads, &status)
        else:
            attention_decode_impl(<const float*>qp, q_off, q_rs, <const float*>kp, k_off, k_rs,
                                  <const float*>vp, v_off, v_rs,
                                  <const uint8_t*>mp if mask_kind == 1 else NULL,
                                  <const float*>mp if mask_kind == 2 else NULL,
                                  mo, m_rs, m_cs, <float*>op, <float*>lp,
                                  batch, L, S, E, Ev, <float>scale, causal, causal_off,
                                  n_threads, &status)
    elif dbl:
        attention_impl(<const double*>qp, q_off, q_rs, q_cs, <const double*>kp, k_off, k_rs, k_cs,
                       <const double*>vp, v_off, v_rs, v_cs,
                       <const uint8_t*>mp if mask_kind == 1 else NULL,
                       <const double*>mp if mask_kind == 2 else NULL,
                       mo, m_rs, m_cs, <double*>op, <double*>lp,
                       batch, L, S, E, Ev, scale, causal, causal_off, qg, want_lse, n_threads,
                       &status)
    else:
        attention_impl(<const float*>qp, q_off, q_rs, q_cs, <const float*>kp, k_off, k_rs, k_cs,
                       <const float*>vp, v_off, v_rs, v_cs,
                       <const uint8_t*>mp if mask_kind == 1 else NULL,
                       <const float*>mp if mask_kind == 2 else NULL,
                       mo, m_rs, m_cs, <float*>op, <float*>lp,
                       batch, L, S, E, Ev, <float>scale, causal, causal_off, qg, want_lse,
                       n_threads, &status)
    return status


cdef inline int _float_code(const Py_buffer* view) noexcept:
    """4 for a native float32 buffer, 8 for float64, 0 for anything else."""
    cdef const char* fmt = view.format
    if fmt == NULL or fmt[0] == 0 or fmt[1] != 0:
        return 0
    if fmt[0] == b'f' and view.itemsize == 4:
        return 4
    if fmt[0] == b'd' and view.itemsize == 8:
        return 8
    return 0


cdef inline bint _disjoint(const Py_buffer* x, const Py_buffer* y) noexcept:
    cdef uintptr_t x0 = <uintptr_t>x.buf
    cdef uintptr_t y0 = <uintptr_t>y.buf
    return x0 + <uintptr_t>x.len <= y0 or y0 + <uintptr_t>y.len <= x0


cdef inline bint _get_rows(object obj, Py_buffer* view):
    """Acquire a strided, formatted buffer of obj whose strides are whole elements and whose
    last axis has unit stride (rows of adjacent elements); False (no exception) if it has
    none or is not of that kind."""
    cdef int d
    try:
        PyObject_GetBuffer(obj, view, PyBUF_RECORDS_RO)
    except Exception:
        return False
    for d in range(view.ndim):
        if (view.strides[d] % view.itemsize
                or (d == view.ndim - 1 and view.shape[d] > 1
                    and view.strides[d] != view.itemsize)):
            PyBuffer_Release(view)
            return False
    return True


cdef inline bint _get_contiguous(object obj, Py_buffer* view, bint writable):
    """Acquire a C-contiguous, formatted buffer of obj; False (no exception) if it has none."""
    cdef int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT
    if writable:
        flags |= PyBUF_WRITABLE
    try:
        PyObject_GetBuffer(obj, view, flags)
    except Exception:
        return False
    return True


def matmul_fast(a, b, out, double alpha, int n_threads):
    """out += alpha * a @ b if a (M, K), b (K, N) and out (M, N) are C-contiguous, aligned,
    non-empty 2-D arrays of one native float dtype and out is writable and disjoint from both;
    returns False without touching anything otherwise. The low-overhead path of
    matmul_accumulate: one pass of checks on the buffers, no offset arrays."""
    cdef Py_buffer av, bv, cv
    cdef int status = 0, code
    cdef int64_t zero = 0
    cdef Py_ssize_t M, N, K, tile_m, tile_n
    cdef bint ok = False
    if not _get_contiguous(a, &av, False):
        return False
    try:
        if not _get_contiguous(b, &bv, False):
            return False
        try:
            if not _get_contiguous(out, &cv, True):
                return False
            try:
                code = _float_code(&cv)
                if (code == 0 or _float_code(&av) != code or _float_code(&bv) != code
                        or av.ndim != 2 or bv.ndim != 2 or cv.ndim != 2):
                    return False
                M = av.shape[0]
                K = av.shape[1]
                N = bv.shape[1]
                if (bv.shape[0] != K or cv.shape[0] != M or cv.shape[1] != N
                        or M == 0 or N == 0 or K == 0
                        or <uintptr_t>av.buf % code or <uintptr_t>bv.buf % code
                        or <uintptr_t>cv.buf % code
                        or not _disjoint(&cv, &av) or not _disjoint(&cv, &bv)):
                    return False
                if n_threads > (M * N * K) >> 18:     # small products run on fewer threads
                    n_threads = <int>((M * N * K) >> 18)
                if n_threads < 1:
                    n_threads = 1
                if code == 8:
                    matmul_tiles(1, M, N, MRD, NRD, &n_threads, &tile_m, &tile_n)
                else:
                    matmul_tiles(1, M, N, MR, NR, &n_threads, &tile_m, &tile_n)
                with nogil:
                    if code == 8:
                        matmul_tasks_impl(<const double*>av.buf, &zero, K, 1,
                                          <const double*>bv.buf, &zero, N, 1,
                                          <double*>cv.buf, &zero, N, 1, 1, M, N, K,
                                          alpha, tile_m, tile_n, n_threads, &status)
                    else:
                        matmul_tasks_impl(<const float*>av.buf, &zero, K, 1,
                                          <const float*>bv.buf, &zero, N, 1,
                                          <float*>cv.buf, &zero, N, 1, 1, M, N, K,
                                          <float>alpha, tile_m, tile_n, n_threads, &status)
                ok = True
            finally:
                PyBuffer_Release(&cv)
        finally:
            PyBuffer_Release(&bv)
    finally:
        PyBuffer_Release(&av)
    if status:
        raise MemoryError("cyattn.matmul_accumulate: could not allocate packing buffers")
    return ok


def attention(q, const int64_t[::1] q_off, Py_ssize_t q_rs, Py_ssize_t q_cs,
              k, const int64_t[::1] k_off, Py_ssize_t k_rs, Py_ssize_t k_cs,
              v, const int64_t[::1] v_off, Py_ssize_t v_rs, Py_ssize_t v_cs,
              mask, int mask_kind, const int64_t[::1] m_off, Py_ssize_t m_rs, Py_ssize_t m_cs,
              out, lse, Py_ssize_t L, Py_ssize_t S, Py_ssize_t E, Py_ssize_t Ev,
              double scale, bint causal, Py_ssize_t causal_off, bint want_lse, int n_threads):
    """Scaled dot-product attention for `batch = len(q_off)` independent (L, S) problems.

    q, k, v, mask are addressed by element offsets per batch entry and element strides.
    out: C-contiguous (batch, L, Ev); lse: C-contiguous (batch, L); both of the data dtype.
    Without ``want_lse`` lse is scratch and its contents are not the lse.
    mask_kind: 0 none, 1 bool (uint8, True = keep), 2 additive (data dtype).
    """
    cdef Py_buffer qv, kv, vv, mv, ov, lv
    cdef char* mp = NULL
    cdef const int64_t* mo = NULL
    cdef int status = 0
    cdef char* qp = _buf(q, &qv, False)
    try:
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
                                status = attention_run(
                                    qv.itemsize == 8, qp, &q_off[0], q_rs, q_cs,
                                    kp, &k_off[0], k_rs, k_cs, vp, &v_off[0], v_rs, v_cs,
                                    mp, mask_kind, mo, m_rs, m_cs, op, lp, q_off.shape[0],
                                    L, S, E, Ev, scale, causal, causal_off, want_lse,
                                    n_threads)
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


def softmax_fast(x, out, bint log_out, int n_threads, empty):
    """(Log-)softmax over the last axis of a C-contiguous, aligned, non-empty float32/float64
    array x with at least one dimension, into ``out`` (None: a new array from
    ``empty(x.shape, dtype)``; else a writable, C-contiguous, aligned array of x's shape and
    dtype, disjoint from x). Returns the result, or None without doing anything (out untouched)
    if the arguments are not of that kind. The low-overhead path of softmax and log_softmax
    without a mask: one pass of checks on the buffers (the general path cost ~4 us per call)."""
    cdef Py_buffer xv, ov
    cdef int code, d
    cdef Py_ssize_t n, rows, work
    cdef object res = out
    if not _get_contiguous(x, &xv, False):
        return None
    try:
        code = _float_code(&xv)
        if code == 0 or xv.ndim < 1 or <uintptr_t>xv.buf % code or xv.len == 0:
            return None
        n = xv.shape[xv.ndim - 1]
        rows = (xv.len // code) // n
        if out is None:
            res = empty(tuple([xv.shape[d] for d in range(xv.ndim)]),
                        "float64" if code == 8 else "float32")
            PyObject_GetBuffer(res, &ov, PyBUF_RECORDS)
        elif not _get_contiguous(out, &ov, True):
            return None
        try:
            if out is not None:
                if (_float_code(&ov) != code or ov.ndim != xv.ndim or <uintptr_t>ov.buf % code
                        or not _disjoint(&xv, &ov)):
                    return None
                for d in range(xv.ndim):
                    if ov.shape[d] != xv.shape[d]:
                        return None
            work = (rows * n) >> 15                     # as threads_for_work(..., 1 << 15)
            if n_threads > work:
                n_threads = <int>(work if work > 0 else 1)
            with nogil:
                if code == 8:
                    softmax_rows_impl(<const double*>xv.buf, <double*>ov.buf, rows, n,
                                      NULL, 0, 0, NULL, 0, 0, log_out, n_threads)
                else:
                    softmax_rows_impl(<const float*>xv.buf, <float*>ov.buf, rows, n,
                                      NULL, 0, 0, NULL, 0, 0, log_out, n_threads)
        finally:
            PyBuffer_Release(&ov)
    finally:
        PyBuffer_Release(&xv)
    return res


cdef enum:
    FAST_MAX_DIMS = 64  # NumPy's NPY_MAXDIMS: the most dimensions an array can have


cdef int _fast_mask_layout(const Py_buffer* mv, int code, const Py_buffer* qv, Py_ssize_t S,
                           Py_ssize_t* st) noexcept:
    """The kind of a mask buffer for attention_fast: 1 for bool, 2 for an aligned float mask of
    the data dtype (``code``), 0 for anything else or a mask that does not broadcast to q's
    batch shape + (L, S) without enlarging it. For kinds 1 and 2, writes the mask's element
    stride along each of q's dims, the last standing for S (0 where broadcast), to
    st[0:q.ndim]."""
    cdef const char* fmt = mv.format
    cdef int nd = qv.ndim, lead = qv.ndim - mv.ndim, kind, d
    cdef Py_ssize_t item, size, target
    if lead < 0 or nd > FAST_MAX_DIMS:
        return 0
    if fmt != NULL and fmt[0] == b'?' and fmt[1] == 0 and mv.itemsize == 1:
        kind = 1
    elif _float_code(mv) == code and <uintptr_t>mv.buf % code == 0:
        kind = 2
    else:
        return 0
    item = mv.itemsize
    for d in range(nd):
        st[d] = 0
        if d < lead:
            continue
        size = mv.shape[d - lead]
        target = S if d == nd - 1 else qv.shape[d]
        if size == target and size != 1:
            if mv.strides[d - lead] % item:
                return 0
            st[d] = mv.strides[d - lead] // item
        elif size != 1:
            return 0
    return kind


cdef bint _disjoint_strided(const Py_buffer* x, const Py_buffer* y) noexcept:
    """True if no byte of the strided buffer x (any strides, also negative or zero) lies in
    the contiguous buffer y."""
    cdef uintptr_t lo = <uintptr_t>x.buf, hi = <uintptr_t>x.buf + <uintptr_t>x.itemsize
    cdef int d
    for d in range(x.ndim):
        if x.shape[d] == 0:
            return True
        if x.strides[d] < 0:
            lo -= <uintptr_t>((x.shape[d] - 1) * -x.strides[d])
        else:
            hi += <uintptr_t>((x.shape[d] - 1) * x.strides[d])
    return hi <= <uintptr_t>y.buf or <uintptr_t>y.buf + <uintptr_t>y.len <= lo


cdef bint _no_self_overlap(const Py_buffer* o) noexcept:
    """True if no two elements of the strided buffer o share a byte: with the dims of more
    than one element ordered by |stride|, each stride spans at least the block of the dims
    before it (a sufficient test; a zero stride fails it)."""
    cdef Py_ssize_t st[FAST_MAX_DIMS]
    cdef Py_ssize_t sh[FAST_MAX_DIMS]
    cdef Py_ssize_t n = 0, i, j, a, extent = o.itemsize
    if o.ndim > FAST_MAX_DIMS:
        return False
    for i in range(o.ndim):
        if o.shape[i] > 1:
            a = o.strides[i] if o.strides[i] >= 0 else -o.strides[i]
            j = n                               # insertion sort by |stride|
            while j > 0 and st[j - 1] > a:
                st[j] = st[j - 1]
                sh[j] = sh[j - 1]
                j -= 1
            st[j] = a
            sh[j] = o.shape[i]
            n += 1
    for i in range(n):
        if st[i] < extent:
            return False
        extent += st[i] * (sh[i] - 1)
    return True


cdef void _rows_to_strided(const char* src, const Py_buffer* o, const int64_t* o_off,
                           Py_ssize_t batch) noexcept nogil:
    """Copy batch x L rows of Ev adjacent elements at src (C order) into the strided buffer o
    of shape (..., L, Ev), batch entry bi starting o_off[bi] elements after o's first."""
    cdef int nd = o.ndim
    cdef Py_ssize_t item = o.itemsize, L = o.shape[nd - 2], Ev = o.shape[nd - 1]
    cdef Py_ssize_t rs = o.strides[nd - 2], cs = o.strides[nd - 1], bi, r, e
    cdef char* base
    cdef char* dst
    for bi in range(batch):
        base = <char*>o.buf + o_off[bi] * item
        for r in range(L):
            dst = base + r * rs
            if cs == item:
                memcpy(dst, src, <size_t>(Ev * item))
            else:
                for e in range(Ev):
                    memcpy(dst + e * cs, src + e * item, <size_t>item)
            src += Ev * item


def attention_fast(q, k, v, mask, out, scale, bint causal, bint bottom_right, bint gqa,
                   bint want_lse, int n_threads, empty):
    """Attention for aligned q (..., L, E), k (..., S, E) and v (..., S, Ev) of one native
    float dtype with rows of adjacent elements (unit stride along the last axis; any other
    strides, also 0 or negative, as the head views of a fused QKV projection have), with
    L, S, E, Ev > 0 and equal batch shapes (with ``gqa``, k and v may have fewer heads, axis
    -3, dividing q's), ``mask`` None, a bool array or a float array of the data dtype
    (aligned, any strides) that broadcasts to (..., L, S) without enlarging it, and ``out``
    None or a writable, C-contiguous, aligned array of the result's shape and dtype sharing no
    memory with the inputs, or a writable, aligned strided one whose elements do not overlap
    each other, which gets a copy of the result after the kernel (so it may alias the
    inputs). Returns (out, lse), allocating them by ``empty(shape, dtype)`` (the result only
    if ``out`` is None or strided; lse is None without ``want_lse``), or None without doing
    anything if the inputs are not of that kind. ``scale`` is a float or None (1 / sqrt(E)).
    The low-overhead path of scaled_dot_product_attention: one pass of checks on the
    buffers."""
    cdef Py_buffer qv, kv, vv, mv, ov, lv, rv
    cdef bint have_q = False, have_k = False, have_v = False, have_m = False
    cdef bint have_o = False, have_l = False, have_r = False, o_strided = False
    cdef int status = 0, code, d, nd, mask_kind = 0
    cdef Py_ssize_t batch = 1, bi, L, S, E, Ev, work, m_rs = 0, m_cs = 0, hq = 1, group = 1
    cdef Py_ssize_t idx[FAST_MAX_DIMS]
    cdef Py_ssize_t m_st[FAST_MAX_DIMS]
    cdef Py_ssize_t q_rs, k_rs, v_rs, item, j
    cdef int64_t q_o, k_o, v_o, m_o, o_o
    cdef double scale_value
    cdef int64_t* offs = NULL
    cdef object res = None, lse = None
    try:
        if not _get_rows(q, &qv):
            return None
        have_q = True
        if not _get_rows(k, &kv):
            return None
        have_k = True
        if not _get_rows(v, &vv):
            return None
        have_v = True
        if mask is not None:
            try:
                PyObject_GetBuffer(mask, &mv, PyBUF_RECORDS_RO)
            except Exception:
                return None
            have_m = True
        if out is not None:
            if not _get_contiguous(out, &ov, True):
                try:
                    PyObject_GetBuffer(out, &ov, PyBUF_RECORDS)
                except Exception:
                    return None
                o_strided = True
            have_o = True
        code = _float_code(&qv)
        nd = qv.ndim
        if (code == 0 or _float_code(&kv) != code or _float_code(&vv) != code
                or nd < (3 if gqa else 2) or nd > FAST_MAX_DIMS or kv.ndim != nd
                or vv.ndim != nd or <uintptr_t>qv.buf % code or <uintptr_t>kv.buf % code
                or <uintptr_t>vv.buf % code):
            return None
        for d in range(nd - 2):
            if vv.shape[d] != kv.shape[d]:
                return None
            if gqa and d == nd - 3:
                hq = qv.shape[d]
                if kv.shape[d] == 0 or hq % kv.shape[d]:
                    return None
                group = hq // kv.shape[d]
            elif kv.shape[d] != qv.shape[d]:
                return None
            batch *= qv.shape[d]
        L = qv.shape[nd - 2]
        E = qv.shape[nd - 1]
        S = kv.shape[nd - 2]
        Ev = vv.shape[nd - 1]
        if (kv.shape[nd - 1] != E or vv.shape[nd - 2] != S
                or batch == 0 or L == 0 or S == 0 or E == 0 or Ev == 0):
            return None
        if have_o and not o_strided:
            if (_float_code(&ov) != code or <uintptr_t>ov.buf % code or ov.ndim != nd
                    or ov.shape[nd - 1] != Ev or not _disjoint_strided(&qv, &ov)
                    or not _disjoint_strided(&kv, &ov) or not _disjoint_strided(&vv, &ov)
                    or (have_m and not _disjoint_strided(&mv, &ov))):
                return None
            for d in range(nd - 1):
                if ov.shape[d] != qv.shape[d]:
                    return None
        elif have_o:
            # a strided out gets a copy of the result once every input has been read, so it
            # may share memory with them, but not with itself (the general path's copy would
            # leave other bytes in the shared elements)
            if (_float_code(&ov) != code or <uintptr_t>ov.buf % code or ov.ndim != nd
                    or ov.shape[nd - 1] != Ev or not _no_self_overlap(&ov)):
                return None
            for d in range(nd):
                if (d < nd - 1 and ov.shape[d] != qv.shape[d]) or ov.strides[d] % code:
                    return None
        for d in range(nd):
            m_st[d] = 0
        if have_m:
            mask_kind = _fast_mask_layout(&mv, code, &qv, S, m_st)
            if mask_kind == 0:
                return None
            m_rs = m_st[nd - 2]
            m_cs = m_st[nd - 1]
        offs = <int64_t*>malloc(<size_t>(5 * batch) * sizeof(int64_t))
        if offs == NULL:
            raise MemoryError("cyattn.scaled_dot_product_attention: could not allocate scratch")
        # element offsets of each batch entry's q, k, v, mask and (strided) out matrices: an
        # odometer over the batch dims, last fastest; with gqa, query head h reads key/value
        # head h // group
        item = qv.itemsize
        for d in range(nd - 2):
            idx[d] = 0
        for bi in range(batch):
            q_o = 0
            k_o = 0
            v_o = 0
            m_o = 0
            o_o = 0
            for d in range(nd - 2):
                j = idx[d] // group if gqa and d == nd - 3 else idx[d]
                q_o += idx[d] * (qv.strides[d] // item)
                k_o += j * (kv.strides[d] // item)
                v_o += j * (vv.strides[d] // item)
                m_o += idx[d] * m_st[d]
                if o_strided:
                    o_o += idx[d] * (ov.strides[d] // item)
            offs[bi] = q_o
            offs[batch + bi] = k_o
            offs[2 * batch + bi] = v_o
            offs[3 * batch + bi] = m_o
            offs[4 * batch + bi] = o_o
            d = nd - 3
            while d >= 0:
                idx[d] += 1
                if idx[d] < qv.shape[d]:
                    break
                idx[d] = 0
                d -= 1
        q_rs = qv.strides[nd - 2] // item
        k_rs = kv.strides[nd - 2] // item
        v_rs = vv.strides[nd - 2] // item
        scale_value = 1.0 / sqrt(<double>E) if scale is None else <double>scale
        work = (batch * L * S * (E + Ev + 8)) >> 18   # as threads_for_work(..., 1 << 18)
        if n_threads > work:
            n_threads = <int>(work if work > 0 else 1)
        shape = tuple([qv.shape[d] for d in range(nd - 1)])
        dtype = "float64" if code == 8 else "float32"
        if have_o and not o_strided:
            res = out
            rv = ov
        else:
            res = empty(shape + (Ev,), dtype)
            PyObject_GetBuffer(res, &rv, PyBUF_RECORDS)
            have_r = True
        lse = empty(shape, dtype)
        PyObject_GetBuffer(lse, &lv, PyBUF_RECORDS)
        have_l = True
        with nogil:
            status = attention_run(
                code == 8, <const char*>qv.buf, offs, q_rs, 1,
                <const char*>kv.buf, offs + batch, k_rs, 1,
                <const char*>vv.buf, offs + 2 * batch, v_rs, 1,
                <const char*>mv.buf if mask_kind else NULL, mask_kind, offs + 3 * batch,
                m_rs, m_cs, <char*>rv.buf, <char*>lv.buf, batch, L, S, E, Ev, scale_value,
                causal, (S - L) if bottom_right else 0, want_lse, n_threads)
            if status == 0 and o_strided:
                _rows_to_strided(<const char*>rv.buf, &ov, offs + 4 * batch, batch)
        if o_strided:
            res = out
    finally:
        free(offs)
        if have_r:
            PyBuffer_Release(&rv)
        if have_l:
            PyBuffer_Release(&lv)
        if have_o:
            PyBuffer_Release(&ov)
        if have_m:
            PyBuffer_Release(&mv)
        if have_v:
            PyBuffer_Release(&vv)
        if have_k:
            PyBuffer_Release(&kv)
        if have_q:
            PyBuffer_Release(&qv)
    if status:
        raise MemoryError("cyattn.scaled_dot_product_attention: could not allocate scratch")
    return res, (lse if want_lse else None)


cdef enum:
    PROBE_LANES = 192  # independent multiply-add chains of the FMA peak probe


def fma_probe(Py_ssize_t iters):
    """Run ``iters`` rounds of PROBE_LANES independent float32 multiply-adds (one thread).

    Returns ``(flops, checksum)``. The bench times it to estimate the core's FMA peak: the
    chains are independent, so the loop is bound by the FMA units, not by their latency.
    """
    cdef float acc[PROBE_LANES]
    cdef float mul = <float>0.999999
    cdef float add = <float>1e-7
    cdef Py_ssize_t it, j
    cdef double checksum = 0.0
    with nogil:
        for j in range(PROBE_LANES):
            acc[j] = <float>j * <float>1e-3
        for it in range(iters):
            for j in range(PROBE_LANES):
                acc[j] = acc[j] * mul + add
        for j in range(PROBE_LANES):
            checksum += acc[j]
    return 2 * iters * PROBE_LANES, checksum
