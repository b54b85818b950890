# exp for the softmax rows and the attention panels, and tanh for the logit softcap
# (float32 and float64).
#
# Design
# ------
# * exp: range reduction x = n ln2 + r (n by the 1.5*2^p shifter trick, Cody-Waite split of ln2),
#   a polynomial for e^r on |r| <= ln2/2 (float32: degree 6, fitted for the least relative
#   error; float64: the degree-13 Taylor polynomial) and 2^n
#   applied as two exact power-of-two factors so that subnormal results are rounded once.
#   Arguments below the underflow bound (-inf included) give exactly 0 by a final select, not by
#   underflowing (which costs a microcode assist); +inf overflows to +inf; NaN passes through.
#   The loop body is branch-free and gcc vectorises it. exp_nonpos is the same computation for
#   arguments in [-87, 0] (float64: [-708, 0]), where 2^n is one normal factor and the clamps do
#   nothing: the same bits in ~7 fewer operations. A softmax row or attention score panel whose
#   smallest shifted score is in range (no masked or far-off score) uses it; an attention panel
#   whose only out-of-range scores are masked (-inf) uses it too, with those lanes zeroed.

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
    # 1 + r + c2 r^2 + ... + c6 r^6: c2..c6 fitted for the least maximum relative error on
    # |r| <= ln2/2 (Lawson's iteration, float32 coefficients): 0.064 ulp of approximation error,
    # one FMA fewer than the degree-7 Taylor polynomial it replaced (0.1 ulp)
    p = <float>0.001381461275741458
    p = p * r + <float>0.008368710055947304
    p = p * r + <float>0.04166838899254799
    p = p * r + <float>0.1666652113199234
    p = p * r + <float>0.4999999403953552
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
# tanh (the logit softcap c * tanh(s / c) of the attention variants)
# ------------------------------------------------------------------------------------------
# tanh(x) = sign(x) * (-u / (2 + u)) with u = expm1(-2|x|) in (-1, 0]. expm1 reuses exp's
# range reduction -2|x| = n ln2 + r, |r| <= ln2/2, and computes e^r - 1 = r * P(r) with one more
# Taylor term than exp (its error is relative to r, not to 1), then
# u = 2^n (e^r - 1) + (2^n - 1): 2^n and 2^n - 1 are exact, and |u| >= 0.29 whenever n != 0,
# so nothing cancels; near 0 (n = 0) u = r * P(r) keeps full relative accuracy. Past
# TANH_CLAMP_* the result rounds to 1 (1 - tanh(x) < 2 e^{-2x} is below half an ulp of 1), so
# the argument is clamped there, which also maps +-inf to +-1; NaN passes through. The sign is
# copied from x by bits (tanh(-0) = -0). Against a correctly rounded tanh: at most 2.62 ulp
# over every float32 (baseline, avx2 and avx512 alike) and 2.8 ulp on 3 million float64
# samples; tests/test_tanh.py holds both to 3 ulp (the float32 sweep of all 2**31 magnitudes
# is a slow test).
cdef float TANH_CLAMP_F32 = 9.0
cdef double TANH_CLAMP_F64 = 19.5


@cython.cdivision(True)         # x / 0 is IEEE here, no Python check
cdef inline float tanh_f32(float x) noexcept nogil:
    """tanh(x) in float32 (see the note above); branch-free, vectorisable."""
    cdef uint32_t sign = <uint32_t>_f32_bits(x) & 0x80000000u
    cdef float a = _f32_from_bits(<uint32_t>_f32_bits(x) & 0x7FFFFFFFu)
    cdef float y, t, n, r, p, scale, u, res
    cdef int32_t ni
    a = TANH_CLAMP_F32 if a > TANH_CLAMP_F32 else a
    y = <float>-2.0 * a
    t = y * <float>1.44269504088896341 + <float>12582912.0
    n = t - <float>12582912.0
    ni = _f32_bits(t) - <int32_t>0x4B400000        # in [-26, 0]
    r = y - n * <float>0.693145751953125
    r = r - n * <float>1.428606765330187045e-06
    p = <float>(1.0 / 40320.0)
    p = p * r + <float>(1.0 / 5040.0)
    p = p * r + <float>(1.0 / 720.0)
    p = p * r + <float>(1.0 / 120.0)
    p = p * r + <float>(1.0 / 24.0)
    p = p * r + <float>(1.0 / 6.0)
    p = p * r + <float>0.5
    p = p * r + <float>1.0
    p = p * r                                       # e^r - 1
    scale = _f32_from_bits((<uint32_t>(ni + 127)) << 23)
    u = scale * p + (scale - <float>1.0)
    res = -u / (<float>2.0 + u)
    return _f32_from_bits((<uint32_t>_f32_bits(res) & 0x7FFFFFFFu) | sign)


@cython.cdivision(True)         # x / 0 is IEEE here, no Python check
cdef inline double tanh_f64(double x) noexcept nogil:
    """tanh(x) in float64 (see the note above); branch-free, vectorisable."""
    cdef uint64_t sign = <uint64_t>_f64_bits(x) & (<uint64_t>1 << 63)
    cdef double a = _f64_from_bits(<uint64_t>_f64_bits(x) & ~(<uint64_t>1 << 63))
    cdef double y, t, n, r, p, scale, u, res
    cdef int64_t ni
    a = TANH_CLAMP_F64 if a > TANH_CLAMP_F64 else a
    y = -2.0 * a
    t = y * 1.4426950408889634074 + 6755399441055744.0
    n = t - 6755399441055744.0
    ni = _f64_bits(t) - <int64_t>0x4338000000000000  # in [-57, 0]
    r = y - n * 6.93147180369123816490e-01
    r = r - n * 1.90821492927058770002e-10
    p = 1.0 / 87178291200.0
    p = p * r + 1.0 / 6227020800.0
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
    p = p * r                                       # e^r - 1
    scale = _f64_from_bits((<uint64_t>(ni + 1023)) << 52)
    u = scale * p + (scale - 1.0)
    res = -u / (2.0 + u)
    return _f64_from_bits((<uint64_t>_f64_bits(res) & ~(<uint64_t>1 << 63)) | sign)


cdef inline floating tanh_any(floating x) noexcept nogil:
    if floating is float:
        return tanh_f32(x)
    else:
        return tanh_f64(x)


cdef void tanh_array(const floating* x, floating* y, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(n):
        y[j] = tanh_any(x[j])
