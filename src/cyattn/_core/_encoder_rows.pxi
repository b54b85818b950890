# Row kernels of a transformer encoder layer's element-wise steps (cyattn.encoder, issue 25):
# bias + exact GELU, and LayerNorm, over the rows of a C-contiguous float32 (T, width) array,
# in place.
#
# Design
# ------
# * They replace 18 (GELU) and 9 (LayerNorm) NumPy passes, 10-12 % of an encode at one thread
#   that did not speed up with a second thread. On a Zen 5 core, per element: GELU 1.2 -> 0.6 ns,
#   LayerNorm 0.8 -> 0.18 ns.
# * GELU(x) = x Phi(x) = x / (1 + exp(-2 x P(x^2))), the minimax polynomial P of
#   cyattn.encoder._bert._GELU_P (x P(x^2) approximates atanh(erf(x / sqrt 2))), with the
#   kernels' exp_f32: max abs error 6.0e-7 against the exact GELU on [-12, 12], 3.6e-7
#   relative for |x| <= 1 (tests/test_kernels.py). 0.5 + 0.5 tanh_f32(u) lost the relative
#   accuracy of small Phi (4.6e-7). The coefficients come in from Python, so the polynomial is
#   defined in one place.
# * LayerNorm (Ba, Kiros & Hinton 2016; torch.nn.LayerNorm's biased variance):
#   y = (x - mean) / sqrt(var + eps) * weight + bias, by the corrected two-pass algorithm (see
#   layer_norm_row), every sum in LANES float32 partials combined by lanes_sum (then the tail).
#   The NumPy steps it replaced lost rows whose mean is far from zero against their spread (the
#   float32 mean's rounding error shifts every centred value: off by 4.6e-4 on a row around 7
#   with spread 1.2e-3) and turned a constant row into values off by 0.6 when eps is 1e-12
#   (tests/test_kernels.py, test_layer_norm_rows_match_float64).
# * Each row's result depends only on that row, so the bits are the same for any thread count
#   and any batch the row is in. Rows are split across threads in one OpenMP region when there
#   are at least ROWS_PER_THREAD_ELEMS elements per thread.

cdef enum:
    ROWS_PER_THREAD_ELEMS = 16384


@cython.cdivision(True)         # x / 0 is IEEE here, no Python check
cdef inline float gelu_f32(float x, const float* p) noexcept nogil:
    """GELU(x) = x Phi(x) with u = x P(x^2) (p[0..6], highest power first) and
    Phi = 0.5 + 0.5 tanh(u) = 1 / (1 + e^(-2u)), evaluated as e / (1 + e) for u < 0 and
    1 / (1 + e) for u >= 0 with e = exp(-2|u|) <= 1: a small Phi (negative x) keeps its relative
    accuracy, which 0.5 + 0.5 tanh(u) loses to cancellation."""
    cdef float s = x * x
    cdef float u = p[0] * s + p[1]
    cdef float e, num
    u = u * s + p[2]
    u = u * s + p[3]
    u = u * s + p[4]
    u = u * s + p[5]
    u = u * s + p[6]
    u = u * x
    e = exp_f32(<float>-2.0 * _f32_from_bits(<uint32_t>_f32_bits(u) & 0x7FFFFFFFu))
    num = e if u < 0 else <float>1.0
    return x * (num / (<float>1.0 + e))


cdef void gelu_row(float* h, const float* bias, Py_ssize_t n, const float* p) noexcept nogil:
    cdef Py_ssize_t j
    cdef float c[7]
    for j in range(7):
        c[j] = p[j]
    if bias != NULL:
        for j in range(n):
            h[j] = gelu_f32(h[j] + bias[j], c)
    else:
        for j in range(n):
            h[j] = gelu_f32(h[j], c)


@cython.cdivision(True)
cdef void layer_norm_row(float* x, Py_ssize_t n, const float* weight, const float* bias,
                         float eps) noexcept nogil:
    """One row of LayerNorm in place (n >= 1), by the corrected two-pass algorithm (Chan,
    Golub & LeVeque 1983): d = x - mean, then c = sum(d) / n (the rounding error of the float32
    mean, measured; d is exact wherever x is within a factor 2 of the mean), the variance
    sum(d^2) / n - c^2 and the output (d - c) / sqrt(var + eps) * weight + bias. So a row
    far from zero mean keeps its centred values, and a constant row gives exactly bias."""
    cdef float part[LANES]
    cdef float part2[LANES]
    cdef float s, s2, mean, c, var, inv, d
    cdef Py_ssize_t j, lane, full = n - n % LANES
    for lane in range(LANES):
        part[lane] = 0
    j = 0
    while j < full:
        for lane in range(LANES):
            part[lane] += x[j + lane]
        j += LANES
    s = 0
    for j in range(full, n):
        s += x[j]
    mean = (lanes_sum(part) + s) / <float>n
    for lane in range(LANES):
        part[lane] = 0
        part2[lane] = 0
    j = 0
    while j < full:
        for lane in range(LANES):
            d = x[j + lane] - mean
            x[j + lane] = d
            part[lane] += d
            part2[lane] += d * d
        j += LANES
    s = 0
    s2 = 0
    for j in range(full, n):
        d = x[j] - mean
        x[j] = d
        s += d
        s2 += d * d
    c = (lanes_sum(part) + s) / <float>n
    var = (lanes_sum(part2) + s2) / <float>n - c * c
    var = var if var > 0 else <float>0.0
    inv = <float>1.0 / sqrtf(var + eps)
    for j in range(n):
        x[j] = (x[j] - c) * inv * weight[j] + bias[j]


cdef int _row_threads(Py_ssize_t rows, Py_ssize_t n, int n_threads) noexcept nogil:
    cdef Py_ssize_t most = rows * n // ROWS_PER_THREAD_ELEMS
    if most < 1:
        return 1
    return n_threads if n_threads < most else <int>most


cdef void gelu_row_tasks(float* h, const float* bias, Py_ssize_t rows, Py_ssize_t n,
                         const float* p, int n_threads) noexcept nogil:
    cdef Py_ssize_t r
    cdef int threads = _row_threads(rows, n, n_threads)
    if threads <= 1:
        for r in range(rows):
            gelu_row(h + r * n, bias, n, p)
        return
    for r in prange(rows, num_threads=threads, schedule='static'):
        gelu_row(h + r * n, bias, n, p)


cdef void layer_norm_row_tasks(float* x, Py_ssize_t rows, Py_ssize_t n, const float* weight,
                               const float* bias, float eps, int n_threads) noexcept nogil:
    cdef Py_ssize_t r
    cdef int threads = _row_threads(rows, n, n_threads)
    if threads <= 1:
        for r in range(rows):
            layer_norm_row(x + r * n, n, weight, bias, eps)
        return
    for r in prange(rows, num_threads=threads, schedule='static'):
        layer_norm_row(x + r * n, n, weight, bias, eps)
