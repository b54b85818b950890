/*
 * The few things the Cython kernels need that Cython cannot express:
 *   - CPU feature detection (CPUID leaves 1 and 7, XGETBV for OS support of YMM state),
 *   - whether this module was compiled with OpenMP, and thin wrappers over the OpenMP runtime
 *     that also compile (as single-threaded stubs) when it was not,
 *   - a prefetch hint,
 *   - widening float16/bfloat16 elements to float32 (F16C where the variant is built with it).
 * Everything here is a pure function of its arguments or of the CPU: no mutable state.
 */
#ifndef CYATTN_SUPPORT_H
#define CYATTN_SUPPORT_H

#include <stdint.h>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || defined(_M_IX86)
#define CYATTN_X86 1
#if defined(_MSC_VER)
#include <intrin.h>
#include <immintrin.h>
#else
#include <cpuid.h>
#endif
#else
#define CYATTN_X86 0
#endif

/* Feature bits reported by cyattn_cpu_features(). */
#define CYATTN_CPU_SSE2    1
#define CYATTN_CPU_AVX     2
#define CYATTN_CPU_FMA     4
#define CYATTN_CPU_AVX2    8
#define CYATTN_CPU_OSYMM   16   /* the OS saves YMM state (XCR0 bits 1 and 2) */
#define CYATTN_CPU_AVX512F 32
#define CYATTN_CPU_NEON    64
#define CYATTN_CPU_AVX512BW 128
#define CYATTN_CPU_AVX512DQ 256
#define CYATTN_CPU_AVX512VL 512
#define CYATTN_CPU_OSZMM   1024  /* the OS saves opmask and ZMM state (XCR0 bits 5, 6, 7) */
#define CYATTN_CPU_F16C    2048

#if CYATTN_X86
static void cyattn_cpuid(unsigned int leaf, unsigned int sub, unsigned int r[4]) {
#if defined(_MSC_VER)
    int regs[4];
    __cpuidex(regs, (int)leaf, (int)sub);
    r[0] = (unsigned int)regs[0]; r[1] = (unsigned int)regs[1];
    r[2] = (unsigned int)regs[2]; r[3] = (unsigned int)regs[3];
#else
    unsigned int a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(leaf, sub, &a, &b, &c, &d)) { a = b = c = d = 0; }
    r[0] = a; r[1] = b; r[2] = c; r[3] = d;
#endif
}

static uint64_t cyattn_xgetbv0(void) {
#if defined(_MSC_VER)
    return (uint64_t)_xgetbv(0);
#else
    unsigned int lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
#endif
}
#endif

static int cyattn_cpu_features(void) {
    int f = 0;
#if CYATTN_X86
    unsigned int r[4];
    unsigned int max_leaf;
    cyattn_cpuid(0, 0, r);
    max_leaf = r[0];
    if (max_leaf < 1) return 0;
    cyattn_cpuid(1, 0, r);
    if (r[3] & (1u << 26)) f |= CYATTN_CPU_SSE2;
    if (r[2] & (1u << 12)) f |= CYATTN_CPU_FMA;
    if (r[2] & (1u << 28)) f |= CYATTN_CPU_AVX;
    if (r[2] & (1u << 29)) f |= CYATTN_CPU_F16C;
    if ((r[2] & (1u << 27)) && (cyattn_xgetbv0() & 6u) == 6u) f |= CYATTN_CPU_OSYMM;
    if ((r[2] & (1u << 27)) && (cyattn_xgetbv0() & 0xE6u) == 0xE6u) f |= CYATTN_CPU_OSZMM;
    if (max_leaf >= 7) {
        cyattn_cpuid(7, 0, r);
        if (r[1] & (1u << 5)) f |= CYATTN_CPU_AVX2;
        if (r[1] & (1u << 16)) f |= CYATTN_CPU_AVX512F;
        if (r[1] & (1u << 17)) f |= CYATTN_CPU_AVX512DQ;
        if (r[1] & (1u << 30)) f |= CYATTN_CPU_AVX512BW;
        if (r[1] & (1u << 31)) f |= CYATTN_CPU_AVX512VL;
    }
#elif defined(__aarch64__) || defined(_M_ARM64)
    f |= CYATTN_CPU_NEON;
#endif
    return f;
}

/* ---- OpenMP -------------------------------------------------------------------------- */
#if defined(_OPENMP)
#include <omp.h>
static int cyattn_openmp_enabled(void) { return 1; }
static int cyattn_omp_max_threads(void) { return omp_get_max_threads(); }
static int cyattn_omp_num_procs(void) { return omp_get_num_procs(); }
/* Release the runtime's thread pool (OpenMP 5.0); returns 0 on success, nonzero if unsupported. */
static int cyattn_omp_pause(void) {
#if _OPENMP >= 201811
    return omp_pause_resource_all(omp_pause_hard);
#else
    return -1;
#endif
}
#else
static int cyattn_openmp_enabled(void) { return 0; }
static int cyattn_omp_max_threads(void) { return 1; }
static int cyattn_omp_num_procs(void) { return 1; }
static int cyattn_omp_pause(void) { return -1; }
#endif

/* ---- prefetch ------------------------------------------------------------------------ */
/* Helpers that must be inlined into their caller. A helper whose only effects are prefetches
   must be: gcc's interprocedural pure-const analysis counts a prefetch as no side effect and
   deletes the call to such a helper (gcc 12 at -O2 and -O3), so the prefetches vanish. */
#if defined(__GNUC__) || defined(__clang__)
#define CYATTN_INLINE static inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define CYATTN_INLINE static __forceinline
#else
#define CYATTN_INLINE static inline
#endif
#if defined(__GNUC__) || defined(__clang__)
#define cyattn_prefetch_w(p) __builtin_prefetch((const void *)(p), 1, 3)
/* read, keep in L2 (prefetcht2 on x86): streaming rows that are read once */
#define cyattn_prefetch_r(p) __builtin_prefetch((const void *)(p), 0, 1)
#else
#define cyattn_prefetch_w(p) ((void)(p))
#define cyattn_prefetch_r(p) ((void)(p))
#endif

/* ---- half-precision storage ---------------------------------------------------------- */
/* Formats of 16-bit elements the kernels read (widened to float32 before any arithmetic). */
#define CYATTN_HALF_F16  1   /* IEEE 754 binary16 */
#define CYATTN_HALF_BF16 2   /* bfloat16: the top half of a float32 */

#include <string.h>
#include <stddef.h>
#if (defined(__F16C__) || (defined(_MSC_VER) && defined(__AVX2__))) && CYATTN_X86
#include <immintrin.h>
#define CYATTN_HAVE_F16C 1
#else
#define CYATTN_HAVE_F16C 0
#endif

/* binary16 bits -> float32 bits, exactly, with integer operations and one exact int->float
   conversion only (so no subnormal float is ever an operand: the result does not depend on
   the FTZ/DAZ modes). Normal: rebias the exponent (+112) and shift the significand; subnormal
   (exponent 0): m * 2^-24, computed as (float)m * 2^-24, which is exact and normal in float32;
   inf/NaN (exponent 31): exponent 255 with the significand kept (a NaN stays a NaN with its
   payload). Branch-free, so compilers vectorise the loop below. */
static inline uint32_t cyattn_f16_bits_to_f32_bits(uint32_t h) {
    uint32_t m = h & 0x7fffu;
    uint32_t normal = (m << 13) + (112u << 23);
    uint32_t special = (m << 13) | 0x7f800000u;
    float sub_f = (float)(int32_t)m * 5.9604644775390625e-08f;     /* 2^-24 */
    uint32_t sub;
    uint32_t b;
    memcpy(&sub, &sub_f, 4);
    b = (m >= 0x7c00u) ? special : normal;
    b = (m < 0x0400u) ? sub : b;
    return b | ((h & 0x8000u) << 16);
}

/* dst[0:n] = src[0:n] widened to float32 (fmt: CYATTN_HALF_F16 or CYATTN_HALF_BF16). Exact for
   every one of the 65,536 bit patterns of either format; on builds with F16C the binary16 path
   uses the conversion instruction (which also quiets a signalling NaN). */
static inline void cyattn_half_to_float(const uint16_t* src, float* dst, ptrdiff_t n, int fmt) {
    ptrdiff_t i = 0;
    if (fmt == CYATTN_HALF_BF16) {
        for (; i < n; i++) {
            uint32_t b = (uint32_t)src[i] << 16;
            memcpy(dst + i, &b, 4);
        }
        return;
    }
#if CYATTN_HAVE_F16C && defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(src + i))));
#endif
#if CYATTN_HAVE_F16C
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(src + i))));
#endif
    for (; i < n; i++) {
        uint32_t b = cyattn_f16_bits_to_f32_bits(src[i]);
        memcpy(dst + i, &b, 4);
    }
}

/* float32 bits -> binary16 bits, rounded to nearest even, as NumPy's astype(float16) does:
   overflow (|x| >= 65520) gives inf, values below 2^-14 round to subnormals (2^-25 and below
   to zero), inf stays inf, NaN keeps its sign and top 10 significand bits (made nonzero so it
   stays a NaN). Integer operations only. */
static inline uint32_t cyattn_f32_bits_to_f16_bits(uint32_t f) {
    uint32_t sign = (f >> 16) & 0x8000u;
    uint32_t a = f & 0x7fffffffu;
    uint32_t r, e, m, shift, q, rem, half;
    if (a >= 0x7f800000u) {
        if (a == 0x7f800000u) return sign | 0x7c00u;
        r = 0x7c00u + ((a & 0x7fffffu) >> 13);
        return sign | (r == 0x7c00u ? 0x7c01u : r);
    }
    if (a >= 0x477ff000u) return sign | 0x7c00u;          /* rounds to 65536 or more */
    if (a >= 0x38800000u) {                                /* a normal binary16 */
        r = a - 0x38000000u;                               /* exponent rebiased by -112 */
        r += 0xfffu + ((r >> 13) & 1u);                    /* nearest even at bit 13 */
        return sign | (r >> 13);
    }
    if (a <= 0x33000000u) return sign;                     /* <= 2^-25: zero (a tie is even) */
    e = a >> 23;                                           /* 102 .. 112 */
    m = (a & 0x7fffffu) | 0x800000u;
    shift = 126u - e;                                      /* x * 2^24 = m / 2^shift */
    q = m >> shift;
    rem = m & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
    q += (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;
    return sign | q;                                       /* 0x400: rounded up to 2^-14 */
}

/* float32 bits -> bfloat16 bits, rounded to nearest even, as ml_dtypes' astype(bfloat16):
   NaN becomes the quiet NaN 0x7fc0 with the sign kept. */
static inline uint32_t cyattn_f32_bits_to_bf16_bits(uint32_t f) {
    if ((f & 0x7fffffffu) > 0x7f800000u) return ((f >> 16) & 0x8000u) | 0x7fc0u;
    return (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;
}

/* dst[0:n] = src[0:n] rounded to the 16-bit format fmt (CYATTN_HALF_F16 / CYATTN_HALF_BF16),
   once, to nearest even, as NumPy / ml_dtypes round (binary16 with F16C: the conversion
   instruction, which gives the same bits except that it quiets a signalling NaN). */
static inline void cyattn_float_to_half(const float* src, uint16_t* dst, ptrdiff_t n, int fmt) {
    ptrdiff_t i = 0;
    uint32_t b;
    if (fmt == CYATTN_HALF_BF16) {
        for (; i < n; i++) {
            memcpy(&b, src + i, 4);
            dst[i] = (uint16_t)cyattn_f32_bits_to_bf16_bits(b);
        }
        return;
    }
#if CYATTN_HAVE_F16C && defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i*)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
#if CYATTN_HAVE_F16C
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i*)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) {
        memcpy(&b, src + i, 4);
        dst[i] = (uint16_t)cyattn_f32_bits_to_f16_bits(b);
    }
}

/* ---- decode: weighted sum of value rows ------------------------------------------------ */
/* For each of nq query rows r: acc[r * as + 0:n] += w[r * ws + j] * v[j * vs + 0:n] for rows
   j = 0 .. rows-1 in order, skipping the rows with w[r * ws + j] == 0 (so a masked key's
   inf/NaN value never enters row r's sum). v holds float32 (fmt 0) or 16-bit elements of
   format fmt, widened exactly as cyattn_half_to_float does. Per element the updates happen in
   row order, each a fused multiply-add where the module is built with FMA (as gcc contracts
   `acc[e] += w * v[e]` there) and a multiply then an add elsewhere, so the result is that of
   the row-by-row loop. Blocks of the accumulators (64 elements for one query row, 32 each for
   2-4 rows, on AVX-512; half that on AVX2) stay in registers across all the value rows, and
   each value block is loaded once for all query rows: the row-by-row loop loaded and stored
   the accumulator for every row, which bound decode. pf_bytes > 0: the first block's pass
   prefetches the row that far ahead (in bytes of v). */
static inline float cyattn_widen1(const void* v, ptrdiff_t i, int fmt) {
    uint32_t b;
    float f;
    if (fmt == 0) return ((const float*)v)[i];
    b = ((const uint16_t*)v)[i];
    b = (fmt == CYATTN_HALF_BF16) ? (b << 16) : cyattn_f16_bits_to_f32_bits(b);
    memcpy(&f, &b, 4);
    return f;
}

/* c + a * b as gcc's contraction of `c += a * b` gives it in the module: one fused
   multiply-add where the module is built with FMA, else a multiply then an add. Spelled out,
   because gcc does not contract every such update in these helpers (a dot's tail, whose
   operand comes from cyattn_widen1, stayed a multiply and an add). */
#if defined(__FMA__)
#include <math.h>
#define CYATTN_MADD(a, b, c) fmaf((a), (b), (c))
#else
#define CYATTN_MADD(a, b, c) ((c) + (a) * (b))
#endif

/* One vector type per ISA for cyattn_wsum_rows: CYATTN_VW float lanes, loads of float32 or
   16-bit elements (widened in registers), and the FMA. */
#if defined(__AVX512F__) && CYATTN_HAVE_F16C
typedef __m512 cyattn_vec;
#define CYATTN_VW 16
#define cyattn_vloadf _mm512_loadu_ps
#define cyattn_vstoref _mm512_storeu_ps
#define cyattn_vset1 _mm512_set1_ps
/* a + w * x where w != 0 (or NaN), else a unchanged (w: a broadcast weight) */
#define cyattn_vfmadd_nz(w, x, a) \
    _mm512_mask3_fmadd_ps((w), (x), (a), _mm512_cmp_ps_mask((w), _mm512_setzero_ps(), _CMP_NEQ_UQ))
CYATTN_INLINE __m512 cyattn_vload(const void* v, ptrdiff_t i, int fmt) {
    if (fmt == 0) return _mm512_loadu_ps((const float*)v + i);
    if (fmt == CYATTN_HALF_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)((const uint16_t*)v + i)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
        _mm256_loadu_si256((const __m256i*)((const uint16_t*)v + i))), 16));
}
#elif defined(__AVX2__) && defined(__FMA__) && CYATTN_HAVE_F16C
typedef __m256 cyattn_vec;
#define CYATTN_VW 8
#define cyattn_vloadf _mm256_loadu_ps
#define cyattn_vstoref _mm256_storeu_ps
#define cyattn_vset1 _mm256_set1_ps
#define cyattn_vfmadd_nz(w, x, a) _mm256_blendv_ps((a), _mm256_fmadd_ps((w), (x), (a)), \
                                                   _mm256_cmp_ps((w), _mm256_setzero_ps(), _CMP_NEQ_UQ))
CYATTN_INLINE __m256 cyattn_vload(const void* v, ptrdiff_t i, int fmt) {
    if (fmt == 0) return _mm256_loadu_ps((const float*)v + i);
    if (fmt == CYATTN_HALF_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)v + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
        _mm_loadu_si128((const __m128i*)((const uint16_t*)v + i))), 16));
}
#endif

/* The value pass of nq (1..4) query rows over the same value rows: for each row r,
   acc[r * as + 0:n] += w[r * ws + j] * v[j * vs + 0:n] over j in order as above (row r skips
   the rows j of zero weight). Each value block is loaded once for all nq rows. One sweep over
   the rows per block of nb vectors of elements, from *e_done on while whole blocks remain;
   *e_done: where the next sweep starts. nq and nb are constants at every call, so the
   accumulators stay in registers. Each accumulator element sees the same updates in the same
   order whatever the blocking, so the sweeps' widths do not change the bits. */
#if defined(CYATTN_VW)
CYATTN_INLINE void cyattn_wsum_sweep(
        float* acc, ptrdiff_t as, const float* w, ptrdiff_t ws, const int nq, const int nb,
        const void* v, ptrdiff_t rows, ptrdiff_t vs, ptrdiff_t n, int fmt,
        ptrdiff_t* pf_bytes, ptrdiff_t* e_done) {
    enum { NB = 8 };
    ptrdiff_t e0 = *e_done, j, off, r;
    ptrdiff_t esz = fmt == 0 ? 4 : 2;
    ptrdiff_t end = rows * vs * esz;       /* prefetches stay inside the rows */
    for (; e0 + nb * CYATTN_VW <= n; e0 += nb * CYATTN_VW) {
        cyattn_vec a[4][NB];
        int b;
        for (r = 0; r < nq; r++)
            for (b = 0; b < nb; b++)
                a[r][b] = cyattn_vloadf(acc + r * as + e0 + b * CYATTN_VW);
        for (j = 0; j < rows; j++) {
            cyattn_vec x[NB];
            if (*pf_bytes > 0 && j * vs * esz + *pf_bytes < end)
                for (off = 0; off < n * esz; off += 64)
                    cyattn_prefetch_r((const char*)v + j * vs * esz + *pf_bytes + off);
            for (b = 0; b < nb; b++)
                x[b] = cyattn_vload(v, j * vs + e0 + b * CYATTN_VW, fmt);
            for (r = 0; r < nq; r++) {     /* branch-free: a zero weight keeps a as it is */
                cyattn_vec wr = cyattn_vset1(w[r * ws + j]);
                for (b = 0; b < nb; b++)
                    a[r][b] = cyattn_vfmadd_nz(wr, x[b], a[r][b]);
            }
        }
        for (r = 0; r < nq; r++)
            for (b = 0; b < nb; b++)
                cyattn_vstoref(acc + r * as + e0 + b * CYATTN_VW, a[r][b]);
        *pf_bytes = 0;                     /* the first sweep prefetched whole rows */
    }
    *e_done = e0;
}
#endif

/* The vector sweeps of the value pass, widest first, as many accumulator vectors per row as
   the registers hold: with 32 (AVX-512) 8 for one row (Ev = 128 in one sweep, 8 independent
   FMA chains per value row, where 4 left half the FMA throughput to the chains' latency), 4
   for two rows, 2 for more; with 16 (AVX2) 4 for one row, 2 for more; then narrower sweeps
   for what is left. *e_done: the elements done (the rest is the caller's, row by row). */
CYATTN_INLINE void cyattn_wsum_block(
        float* acc, ptrdiff_t as, const float* w, ptrdiff_t ws, const int nq, const void* v,
        ptrdiff_t rows, ptrdiff_t vs, ptrdiff_t n, int fmt, ptrdiff_t pf_bytes, ptrdiff_t* e_done) {
    *e_done = 0;
#if defined(CYATTN_VW)
#if CYATTN_VW == 16
    if (nq == 1)
        cyattn_wsum_sweep(acc, as, w, ws, nq, 8, v, rows, vs, n, fmt, &pf_bytes, e_done);
    if (nq <= 2)
        cyattn_wsum_sweep(acc, as, w, ws, nq, 4, v, rows, vs, n, fmt, &pf_bytes, e_done);
#else
    if (nq == 1)
        cyattn_wsum_sweep(acc, as, w, ws, nq, 4, v, rows, vs, n, fmt, &pf_bytes, e_done);
#endif
    cyattn_wsum_sweep(acc, as, w, ws, nq, 2, v, rows, vs, n, fmt, &pf_bytes, e_done);
#else
    (void)acc; (void)as; (void)w; (void)ws; (void)nq; (void)v; (void)rows; (void)vs; (void)n;
    (void)fmt; (void)pf_bytes;
#endif
}

CYATTN_INLINE void cyattn_wsum_rows_fmt(float* acc, ptrdiff_t as, const float* w, ptrdiff_t ws,
                                        ptrdiff_t nq, const void* v, ptrdiff_t rows,
                                        ptrdiff_t vs, ptrdiff_t n, const int fmt,
                                        ptrdiff_t pf_bytes) {
    ptrdiff_t e0 = 0, j, e, off, r;
    ptrdiff_t esz = fmt == 0 ? 4 : 2;
    ptrdiff_t end = rows * vs * esz;
    /* constant row counts, so the compiler keeps the accumulator blocks in registers */
    switch (nq) {
    case 1: cyattn_wsum_block(acc, as, w, ws, 1, v, rows, vs, n, fmt, pf_bytes, &e0); break;
    case 2: cyattn_wsum_block(acc, as, w, ws, 2, v, rows, vs, n, fmt, pf_bytes, &e0); break;
    case 3: cyattn_wsum_block(acc, as, w, ws, 3, v, rows, vs, n, fmt, pf_bytes, &e0); break;
    case 4: cyattn_wsum_block(acc, as, w, ws, 4, v, rows, vs, n, fmt, pf_bytes, &e0); break;
    default: break;                    /* more rows: all elements row by row below */
    }
    if (e0 >= n) return;
    if (e0 > 0) pf_bytes = 0;
    for (j = 0; j < rows; j++) {           /* the rest of the elements, row by row */
        if (pf_bytes > 0 && j * vs * esz + pf_bytes < end)
            for (off = 0; off < n * esz; off += 64)
                cyattn_prefetch_r((const char*)v + j * vs * esz + pf_bytes + off);
        for (r = 0; r < nq; r++) {
            float wj = w[r * ws + j];
            if (wj == 0) continue;
            for (e = e0; e < n; e++)
                acc[r * as + e] = CYATTN_MADD(wj, cyattn_widen1(v, j * vs + e, fmt),
                                              acc[r * as + e]);
        }
    }
}

/* cyattn_wsum_rows_fmt with fmt a constant in each copy: gcc left the element format's test in
   the inner loops of the one copy (a compare and branch per loaded vector) */
static inline void cyattn_wsum_rows(float* acc, ptrdiff_t as, const float* w, ptrdiff_t ws,
                                    ptrdiff_t nq, const void* v, ptrdiff_t rows, ptrdiff_t vs,
                                    ptrdiff_t n, int fmt, ptrdiff_t pf_bytes) {
    if (fmt == 0)
        cyattn_wsum_rows_fmt(acc, as, w, ws, nq, v, rows, vs, n, 0, pf_bytes);
    else if (fmt == CYATTN_HALF_F16)
        cyattn_wsum_rows_fmt(acc, as, w, ws, nq, v, rows, vs, n, CYATTN_HALF_F16, pf_bytes);
    else
        cyattn_wsum_rows_fmt(acc, as, w, ws, nq, v, rows, vs, n, CYATTN_HALF_BF16, pf_bytes);
}

/* ---- decode: scores of a few query rows against a run of key rows --------------------- */
/* scores[r * ss + j] = scale * dot(q[r * qs + 0:n], k[j * ks + 0:n]) for the nq query rows r
   and the key rows j = 0 .. rows-1, with k of float32 (fmt 0) or 16-bit elements of format fmt
   (widened in registers as cyattn_half_to_float does). Each dot is that of the decode
   kernels' dot_lanes: 32 lane-wise partial sums (a fused multiply-add each where the module is
   built with FMA, as gcc contracts `part += a * b` there), combined pairwise (lane l with
   l + 16, then + 8, + 4, + 2, + 1: the tree of lanes_sum), plus the tail's sum taken in
   element order: the same bits. The trees of a group of keys are taken together in vector
   registers (the scalar trees through memory were about half of a float32 decode step), and
   a group's key rows are loaded once per query row from L1. pf_bytes > 0: prefetch each key
   row that far ahead; past the last key row, the first rows of v (row stride vs, nv elements)
   are prefetched instead, for the value pass that follows. */
#if defined(__AVX512F__) && CYATTN_HAVE_F16C
/* 32 partial sums in two registers -> four dots: x[i] holds lanes 0-15 + lanes 16-31 of key i */
static inline __m128 cyattn_tree4(__m512 x0, __m512 x1, __m512 x2, __m512 x3) {
    /* + 8: [x0 lo256 | x1 lo256] + [x0 hi256 | x1 hi256] */
    __m512 a = _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, 0x44), _mm512_shuffle_f32x4(x0, x1, 0xee));
    __m512 b = _mm512_add_ps(_mm512_shuffle_f32x4(x2, x3, 0x44), _mm512_shuffle_f32x4(x2, x3, 0xee));
    /* + 4: blocks [a0 a1 a2 a3] = [x0 lo, x0 hi, x1 lo, x1 hi] (128 bits each) */
    __m512 c = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xdd));
    /* + 2 and + 1 within each 128-bit block: block i holds key i */
    c = _mm512_add_ps(c, _mm512_permute_ps(c, 0x4e));
    c = _mm512_add_ps(c, _mm512_permute_ps(c, 0xb1));
    /* lane 0 of each block */
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(
        _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), c));
}
#define CYATTN_DOT_KEYS 4
#elif defined(__AVX2__) && defined(__FMA__) && CYATTN_HAVE_F16C
/* x[i]: lanes 0-7 of key i after the + 16 and + 8 steps */
static inline __m128 cyattn_tree2(__m256 x0, __m256 x1) {
    __m256 c = _mm256_add_ps(_mm256_permute2f128_ps(x0, x1, 0x20),
                             _mm256_permute2f128_ps(x0, x1, 0x31));   /* + 4: [key0 | key1] */
    c = _mm256_add_ps(c, _mm256_permute_ps(c, 0x4e));
    c = _mm256_add_ps(c, _mm256_permute_ps(c, 0xb1));
    return _mm_unpacklo_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
}
#define CYATTN_DOT_KEYS 2
#endif

CYATTN_INLINE void cyattn_prefetch_rows_ahead(const void* k, ptrdiff_t ks, ptrdiff_t rows,
                                              ptrdiff_t n, const void* v, ptrdiff_t vs,
                                              ptrdiff_t nv, ptrdiff_t esz, ptrdiff_t j) {
    /* key row j (or, past the last key, value row j - rows) if it exists */
    ptrdiff_t off;
    if (j < rows) {
        for (off = 0; off < n * esz; off += 64)
            cyattn_prefetch_r((const char*)k + j * ks * esz + off);
    } else if (j - rows < rows) {
        for (off = 0; off < nv * esz; off += 64)
            cyattn_prefetch_r((const char*)v + (j - rows) * vs * esz + off);
    }
}

CYATTN_INLINE void cyattn_dot_rows_fmt(float* scores, ptrdiff_t ss, const float* q,
                                       ptrdiff_t qs, ptrdiff_t nq, const void* k, ptrdiff_t rows,
                                       ptrdiff_t ks, ptrdiff_t n, const int fmt, float scale,
                                       const void* v, ptrdiff_t vs, ptrdiff_t nv,
                                       ptrdiff_t pf_bytes) {
    ptrdiff_t j = 0, e, i, r;
    ptrdiff_t esz = fmt == 0 ? 4 : 2;
    ptrdiff_t pf = pf_bytes > 0 ? pf_bytes / esz / (n > 0 ? n : 1) + 1 : -1;
#if defined(CYATTN_DOT_KEYS) && CYATTN_DOT_KEYS == 4
    for (; j + 4 <= rows; j += 4) {
        if (pf > 0)
            for (i = 0; i < 4; i++)
                cyattn_prefetch_rows_ahead(k, ks, rows, n, v, vs, nv, esz, j + i + pf);
        for (r = 0; r < nq; r++) {         /* the 4 key rows stay in L1 across the query rows */
            const float* qr = q + r * qs;
            __m512 lo0 = _mm512_setzero_ps(), lo1 = lo0, lo2 = lo0, lo3 = lo0;   /* lanes 0-15 */
            __m512 hi0 = lo0, hi1 = lo0, hi2 = lo0, hi3 = lo0;                    /* 16-31 */
            float t[4] = {0, 0, 0, 0};
            for (e = 0; e + 32 <= n; e += 32) {
                __m512 qa = _mm512_loadu_ps(qr + e), qb = _mm512_loadu_ps(qr + e + 16);
                lo0 = _mm512_fmadd_ps(qa, cyattn_vload(k, j * ks + e, fmt), lo0);
                hi0 = _mm512_fmadd_ps(qb, cyattn_vload(k, j * ks + e + 16, fmt), hi0);
                lo1 = _mm512_fmadd_ps(qa, cyattn_vload(k, (j + 1) * ks + e, fmt), lo1);
                hi1 = _mm512_fmadd_ps(qb, cyattn_vload(k, (j + 1) * ks + e + 16, fmt), hi1);
                lo2 = _mm512_fmadd_ps(qa, cyattn_vload(k, (j + 2) * ks + e, fmt), lo2);
                hi2 = _mm512_fmadd_ps(qb, cyattn_vload(k, (j + 2) * ks + e + 16, fmt), hi2);
                lo3 = _mm512_fmadd_ps(qa, cyattn_vload(k, (j + 3) * ks + e, fmt), lo3);
                hi3 = _mm512_fmadd_ps(qb, cyattn_vload(k, (j + 3) * ks + e + 16, fmt), hi3);
            }
            for (; e < n; e++)
                for (i = 0; i < 4; i++)
                    t[i] = CYATTN_MADD(qr[e], cyattn_widen1(k, (j + i) * ks + e, fmt), t[i]);
            /* + 16 (lo + hi), the rest of the tree, + tail, * scale */
            _mm_storeu_ps(scores + r * ss + j, _mm_mul_ps(_mm_set1_ps(scale), _mm_add_ps(
                cyattn_tree4(_mm512_add_ps(lo0, hi0), _mm512_add_ps(lo1, hi1),
                             _mm512_add_ps(lo2, hi2), _mm512_add_ps(lo3, hi3)),
                _mm_loadu_ps(t))));
        }
    }
#elif defined(CYATTN_DOT_KEYS) && CYATTN_DOT_KEYS == 2
    for (; j + 2 <= rows; j += 2) {
        if (pf > 0)
            for (i = 0; i < 2; i++)
                cyattn_prefetch_rows_ahead(k, ks, rows, n, v, vs, nv, esz, j + i + pf);
        for (r = 0; r < nq; r++) {
            const float* qr = q + r * qs;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;   /* key j: lanes 0-31 */
            __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;                    /* key j + 1 */
            float t[4] = {0, 0, 0, 0};
            __m128 d;
            for (e = 0; e + 32 <= n; e += 32) {
                __m256 x0 = _mm256_loadu_ps(qr + e), x1 = _mm256_loadu_ps(qr + e + 8);
                __m256 x2 = _mm256_loadu_ps(qr + e + 16), x3 = _mm256_loadu_ps(qr + e + 24);
                a0 = _mm256_fmadd_ps(x0, cyattn_vload(k, j * ks + e, fmt), a0);
                a1 = _mm256_fmadd_ps(x1, cyattn_vload(k, j * ks + e + 8, fmt), a1);
                a2 = _mm256_fmadd_ps(x2, cyattn_vload(k, j * ks + e + 16, fmt), a2);
                a3 = _mm256_fmadd_ps(x3, cyattn_vload(k, j * ks + e + 24, fmt), a3);
                b0 = _mm256_fmadd_ps(x0, cyattn_vload(k, (j + 1) * ks + e, fmt), b0);
                b1 = _mm256_fmadd_ps(x1, cyattn_vload(k, (j + 1) * ks + e + 8, fmt), b1);
                b2 = _mm256_fmadd_ps(x2, cyattn_vload(k, (j + 1) * ks + e + 16, fmt), b2);
                b3 = _mm256_fmadd_ps(x3, cyattn_vload(k, (j + 1) * ks + e + 24, fmt), b3);
            }
            for (; e < n; e++)
                for (i = 0; i < 2; i++)
                    t[i] = CYATTN_MADD(qr[e], cyattn_widen1(k, (j + i) * ks + e, fmt), t[i]);
            /* + 16: lanes l and l + 16; + 8: lanes l and l + 8; then the rest of the tree */
            d = cyattn_tree2(_mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3)),
                             _mm256_add_ps(_mm256_add_ps(b0, b2), _mm256_add_ps(b1, b3)));
            d = _mm_add_ps(d, _mm_loadu_ps(t));
            scores[r * ss + j] = scale * _mm_cvtss_f32(d);
            scores[r * ss + j + 1] = scale * _mm_cvtss_f32(_mm_shuffle_ps(d, d, 0x55));
        }
    }
#endif
    for (; j < rows; j++) {                /* the rest of the keys, one at a time */
        if (pf > 0)
            cyattn_prefetch_rows_ahead(k, ks, rows, n, v, vs, nv, esz, j + pf);
        for (r = 0; r < nq; r++) {
            const float* qr = q + r * qs;
            float part[32], t = 0;
            ptrdiff_t l;
            for (l = 0; l < 32; l++)
                part[l] = 0;
            for (e = 0; e + 32 <= n; e += 32)
                for (l = 0; l < 32; l++)
                    part[l] = CYATTN_MADD(qr[e + l], cyattn_widen1(k, j * ks + e + l, fmt),
                                          part[l]);
            for (; e < n; e++)
                t = CYATTN_MADD(qr[e], cyattn_widen1(k, j * ks + e, fmt), t);
            for (l = 0; l < 16; l++) part[l] += part[l + 16];
            for (l = 0; l < 8; l++) part[l] += part[l + 8];
            for (l = 0; l < 4; l++) part[l] += part[l + 4];
            for (l = 0; l < 2; l++) part[l] += part[l + 2];
            scores[r * ss + j] = scale * (part[0] + part[1] + t);
        }
    }
    (void)i;
}

/* cyattn_dot_rows_fmt with fmt a constant in each copy (as cyattn_wsum_rows) */
static inline void cyattn_dot_rows(float* scores, ptrdiff_t ss, const float* q, ptrdiff_t qs,
                                   ptrdiff_t nq, const void* k, ptrdiff_t rows, ptrdiff_t ks,
                                   ptrdiff_t n, int fmt, float scale, const void* v,
                                   ptrdiff_t vs, ptrdiff_t nv, ptrdiff_t pf_bytes) {
    if (fmt == 0)
        cyattn_dot_rows_fmt(scores, ss, q, qs, nq, k, rows, ks, n, 0, scale, v, vs, nv, pf_bytes);
    else if (fmt == CYATTN_HALF_F16)
        cyattn_dot_rows_fmt(scores, ss, q, qs, nq, k, rows, ks, n, CYATTN_HALF_F16, scale, v, vs,
                            nv, pf_bytes);
    else
        cyattn_dot_rows_fmt(scores, ss, q, qs, nq, k, rows, ks, n, CYATTN_HALF_BF16, scale, v,
                            vs, nv, pf_bytes);
}

/* Float32 softmax row passes in explicit vectors (issue 26): the lane-wise max/min, the exp
   and sum, and the scale of softmax_row_to / row_exp_sum_to over the first n - n % 32 elements,
   and a whole softmax row (cyattn_softmax_row_f32). Each lane does exactly the operations of the
   module's scalar code (_softmax_rows.pxi and exp_f32_nonpos in _exp.pxi, as gcc contracts them
   into FMAs), in the same order, and lane l of the 32 partials takes elements j + l, so the
   results are bit for bit those of the loops they replace (tools/bits_digest.py; the
   *_match_the_general_path_bits tests); the point is the code: gcc's vectorisation of those
   loops ran the exp pass about 1.3x slower. The constants are those of exp_core_f32: keep the
   two in step. 256-bit vectors in the avx2 variant (4 per 32 lanes), 512-bit in the avx512
   variant (2 per 32 lanes, masks as k-registers): on a Zen 5 host (family 26, full-width
   512-bit FMA) the 512-bit rows ran 1.2-1.7x faster than the 256-bit ones at 1 thread (rows of
   512 and 2048, alternating builds, each timed against ONNX Runtime). Without
   AVX2 and FMA (baseline), CYATTN_ROWK is 0 and the module keeps its loops (the stubs below
   are never called).
   cyattn_rpow2(t): 2**n as a float from the shifter sum t (exp_f32_nonpos's (ni + 127) << 23
   with ni = bits(t) - 0x4B400000: 0x4B400000 << 23 vanishes modulo 2**32, leaving
   (bits(t) << 23) + (127 << 23), and 127 << 23 is the bit pattern of 1.0f, a constant the exp
   already holds in a register) */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__)
#define CYATTN_ROWK 1
#define CYATTN_RV __m512
#define CYATTN_RW 16
#define cyattn_rload _mm512_loadu_ps
#define cyattn_rstore _mm512_storeu_ps
#define cyattn_rset1 _mm512_set1_ps
#define cyattn_rmax _mm512_max_ps
#define cyattn_rmin _mm512_min_ps
#define cyattn_radd _mm512_add_ps
#define cyattn_rsub _mm512_sub_ps
#define cyattn_rmul _mm512_mul_ps
#define cyattn_rfma _mm512_fmadd_ps
#define cyattn_rfnma _mm512_fnmadd_ps
#define CYATTN_RK __mmask16
#define cyattn_rkeep(b) _mm_test_epi8_mask(_mm_loadu_si128((const __m128i*)(b)), \
    _mm_set1_epi8((char)-1))
#define cyattn_rsel(kk, v, fill) _mm512_mask_blend_ps((kk), (fill), (v))
#define cyattn_rzero_unless(kk, v) _mm512_maskz_mov_ps((kk), (v))
#define cyattn_rpow2(t) _mm512_castsi512_ps(_mm512_add_epi32( \
    _mm512_slli_epi32(_mm512_castps_si512(t), 23), _mm512_castps_si512(_mm512_set1_ps(1.0f))))
#elif defined(__AVX2__) && defined(__FMA__)
#define CYATTN_ROWK 1
#define CYATTN_RV __m256
#define CYATTN_RW 8
#define cyattn_rload _mm256_loadu_ps
#define cyattn_rstore _mm256_storeu_ps
#define cyattn_rset1 _mm256_set1_ps
#define cyattn_rmax _mm256_max_ps
#define cyattn_rmin _mm256_min_ps
#define cyattn_radd _mm256_add_ps
#define cyattn_rsub _mm256_sub_ps
#define cyattn_rmul _mm256_mul_ps
#define cyattn_rfma _mm256_fmadd_ps
#define cyattn_rfnma _mm256_fnmadd_ps
#define CYATTN_RK __m256
#define cyattn_rkeep(b) _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_cvtepu8_epi32( \
    _mm_loadl_epi64((const __m128i*)(b))), _mm256_setzero_si256()))
#define cyattn_rsel(kk, v, fill) _mm256_blendv_ps((fill), (v), (kk))
#define cyattn_rzero_unless(kk, v) _mm256_and_ps((kk), (v))
#define cyattn_rpow2(t) _mm256_castsi256_ps(_mm256_add_epi32( \
    _mm256_slli_epi32(_mm256_castps_si256(t), 23), _mm256_castps_si256(_mm256_set1_ps(1.0f))))
#else
#define CYATTN_ROWK 0
#endif

#if CYATTN_ROWK
#include <math.h>
#define CYATTN_RN (32 / CYATTN_RW)          /* vectors per 32 lanes */

/* pmax[l] = max(pmax[l], x[j + l]) and pmin[l] likewise for j = 0, 32, ... < n - n % 32, as
   `v if v > part else part` (vmaxps(v, part) is exactly that, NaN included). */
static inline void cyattn_rows_max_min_f32(const float* x, ptrdiff_t n, float* pmax, float* pmin) {
    CYATTN_RV hi[CYATTN_RN], lo[CYATTN_RN];
    ptrdiff_t j;
    int k;
    for (k = 0; k < CYATTN_RN; k++) {
        hi[k] = cyattn_rload(pmax + k * CYATTN_RW);
        lo[k] = cyattn_rload(pmin + k * CYATTN_RW);
    }
    for (j = 0; j + 32 <= n; j += 32) {
        for (k = 0; k < CYATTN_RN; k++) {
            CYATTN_RV v = cyattn_rload(x + j + k * CYATTN_RW);
            hi[k] = cyattn_rmax(v, hi[k]);
            lo[k] = cyattn_rmin(v, lo[k]);
        }
    }
    for (k = 0; k < CYATTN_RN; k++) {
        cyattn_rstore(pmax + k * CYATTN_RW, hi[k]);
        cyattn_rstore(pmin + k * CYATTN_RW, lo[k]);
    }
}

/* exp_f32_nonpos(x - shift) of one vector, as the module computes it */
static inline CYATTN_RV cyattn_rexp_nonpos(CYATTN_RV x, CYATTN_RV shift) {
    CYATTN_RV a = cyattn_rsub(x, shift);
    CYATTN_RV t = cyattn_rfma(a, cyattn_rset1(1.44269504088896341f), cyattn_rset1(12582912.0f));
    CYATTN_RV nn = cyattn_rsub(t, cyattn_rset1(12582912.0f));
    CYATTN_RV r = cyattn_rfnma(nn, cyattn_rset1(0.693145751953125f), a);
    CYATTN_RV p;
    r = cyattn_rfnma(nn, cyattn_rset1(1.428606765330187045e-06f), r);
    p = cyattn_rfma(cyattn_rset1(0.001381461275741458f), r, cyattn_rset1(0.008368710055947304f));
    p = cyattn_rfma(p, r, cyattn_rset1(0.04166838899254799f));
    p = cyattn_rfma(p, r, cyattn_rset1(0.1666652113199234f));
    p = cyattn_rfma(p, r, cyattn_rset1(0.4999999403953552f));
    p = cyattn_rfma(p, r, cyattn_rset1(1.0f));
    p = cyattn_rfma(p, r, cyattn_rset1(1.0f));
    return cyattn_rmul(p, cyattn_rpow2(t));
}

/* y[j] = exp_f32_nonpos(x[j] - shift) and part[l] += y[j + l] for j < n - n % 32 (x and y
   distinct, or the same row). */
static inline void cyattn_rows_exp_sum_f32(const float* x, float* y, ptrdiff_t n, float shift,
                                           float* part) {
    CYATTN_RV acc[CYATTN_RN];
    CYATTN_RV vs = cyattn_rset1(shift);
    ptrdiff_t j;
    int k;
    for (k = 0; k < CYATTN_RN; k++)
        acc[k] = cyattn_rload(part + k * CYATTN_RW);
    for (j = 0; j + 32 <= n; j += 32) {
        for (k = 0; k < CYATTN_RN; k++) {
            CYATTN_RV e = cyattn_rexp_nonpos(cyattn_rload(x + j + k * CYATTN_RW), vs);
            cyattn_rstore(y + j + k * CYATTN_RW, e);
            acc[k] = cyattn_radd(acc[k], e);
        }
    }
    for (k = 0; k < CYATTN_RN; k++)
        cyattn_rstore(part + k * CYATTN_RW, acc[k]);
}

/* y[j] *= factor for j < n - n % 32 */
static inline void cyattn_rows_scale_f32(float* y, ptrdiff_t n, float factor) {
    CYATTN_RV f = cyattn_rset1(factor);
    ptrdiff_t j;
    int k;
    for (j = 0; j + 32 <= n; j += 32)
        for (k = 0; k < CYATTN_RN; k++)
            cyattn_rstore(y + j + k * CYATTN_RW, cyattn_rmul(cyattn_rload(y + j + k * CYATTN_RW), f));
}
/* part[0] + ... + part[31] of 32 lane partials held in CYATTN_RN vectors, in lanes_sum's
   order (lane l plus lane l + 16, then + 8, + 4, + 2, then lane 0 plus lane 1) */
static inline float cyattn_rsum32(const CYATTN_RV* v) {
    __m256 c;
    __m128 d;
#if CYATTN_RW == 16
    __m512 w = _mm512_add_ps(v[0], v[1]);
    c = _mm256_add_ps(_mm512_castps512_ps256(w),
                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(w), 1)));
#else
    c = _mm256_add_ps(_mm256_add_ps(v[0], v[2]), _mm256_add_ps(v[1], v[3]));
#endif
    d = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
    d = _mm_add_ps(d, _mm_movehl_ps(d, d));
    return _mm_cvtss_f32(d) + _mm_cvtss_f32(_mm_shuffle_ps(d, d, 1));
}

/* max (want_max) or min of 32 lane values held in CYATTN_RN vectors (no NaN among them) */
static inline float cyattn_rmax32(const CYATTN_RV* v, int want_max) {
#if CYATTN_RW == 16
    return want_max ? _mm512_reduce_max_ps(_mm512_max_ps(v[0], v[1]))
                    : _mm512_reduce_min_ps(_mm512_min_ps(v[0], v[1]));
#else
    __m256 c;
    __m128 d;
    c = want_max ? _mm256_max_ps(_mm256_max_ps(v[0], v[2]), _mm256_max_ps(v[1], v[3]))
                 : _mm256_min_ps(_mm256_min_ps(v[0], v[2]), _mm256_min_ps(v[1], v[3]));
    d = want_max ? _mm_max_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1))
                 : _mm_min_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
    d = want_max ? _mm_max_ps(d, _mm_movehl_ps(d, d)) : _mm_min_ps(d, _mm_movehl_ps(d, d));
    d = want_max ? _mm_max_ss(d, _mm_shuffle_ps(d, d, 1)) : _mm_min_ss(d, _mm_shuffle_ps(d, d, 1));
    return _mm_cvtss_f32(d);
#endif
}

/* Pass 1 of a row: the kept maximum into *m; 0 if the row needs the general rules or full exp */
CYATTN_INLINE int cyattn_rowk_max(const float* x, ptrdiff_t n, const uint8_t* keep, float* mp) {
    CYATTN_RV hi[CYATTN_RN], lo[CYATTN_RN];
    float m, mn;
    ptrdiff_t j, n32 = n - n % 32;
    int k;
    for (k = 0; k < CYATTN_RN; k++) {
        hi[k] = cyattn_rset1(-INFINITY);
        lo[k] = cyattn_rset1(INFINITY);
    }
    for (j = 0; j < n32; j += 32)
        for (k = 0; k < CYATTN_RN; k++) {
            CYATTN_RV v = cyattn_rload(x + j + k * CYATTN_RW);
            if (keep) {
                CYATTN_RK kk = cyattn_rkeep(keep + j + k * CYATTN_RW);
                hi[k] = cyattn_rmax(cyattn_rsel(kk, v, cyattn_rset1(-INFINITY)), hi[k]);
                lo[k] = cyattn_rmin(cyattn_rsel(kk, v, cyattn_rset1(INFINITY)), lo[k]);
            } else {
                hi[k] = cyattn_rmax(v, hi[k]);
                lo[k] = cyattn_rmin(v, lo[k]);
            }
        }
    m = cyattn_rmax32(hi, 1);
    mn = cyattn_rmax32(lo, 0);
    for (j = n32; j < n; j++) {
        float v = x[j];
        if (keep && !keep[j])
            continue;
        m = v > m ? v : m;
        mn = v < mn ? v : mn;
    }
    *mp = m;
    return !(m == -INFINITY || m == INFINITY || !(mn - m >= -87.0f));
}

/* Pass 2: exp(x - m) (0 where not kept), into y if store; returns their sum */
CYATTN_INLINE float cyattn_rowk_exp(const float* x, float* y, ptrdiff_t n, const uint8_t* keep,
                                    float m, int store) {
    CYATTN_RV acc[CYATTN_RN], vs = cyattn_rset1(m);
    float tail = 0.0f;
    ptrdiff_t j, n32 = n - n % 32;
    int k;
    for (k = 0; k < CYATTN_RN; k++)
        acc[k] = cyattn_rset1(0.0f);
    for (j = 0; j < n32; j += 32) {
        /* the next row of a C-contiguous x, read by the next call's max pass: from L3 or
           memory that pass waited on its loads (45 % of a (8, 128, 2048) softmax), and this
           pass has load slots to spare; 1.2-1.3x on inputs past L2, nothing lost in cache. A
           prefetch past the last row is not an access (it never faults). Prefetching the next
           row of y for writing as well gained nothing. */
        cyattn_prefetch_r(x + n + j);
        cyattn_prefetch_r(x + n + j + 16);
        for (k = 0; k < CYATTN_RN; k++) {
            CYATTN_RV e = cyattn_rexp_nonpos(cyattn_rload(x + j + k * CYATTN_RW), vs);
            if (keep)
                e = cyattn_rzero_unless(cyattn_rkeep(keep + j + k * CYATTN_RW), e);
            if (store)
                cyattn_rstore(y + j + k * CYATTN_RW, e);
            acc[k] = cyattn_radd(acc[k], e);
        }
    }
    if (n > n32) {                      /* the tail through one more vector step, in order */
        float xb[32], eb[32];
        for (k = 0; k < 32; k++)
            xb[k] = k < n - n32 && (!keep || keep[n32 + k]) ? x[n32 + k] : m;
        for (k = 0; k < CYATTN_RN; k++)
            cyattn_rstore(eb + k * CYATTN_RW,
                          cyattn_rexp_nonpos(cyattn_rload(xb + k * CYATTN_RW), vs));
        for (k = 0; k < n - n32; k++) {
            float e = keep && !keep[n32 + k] ? 0.0f : eb[k];
            if (store)
                y[n32 + k] = e;
            tail += e;
        }
    }
    return cyattn_rsum32(acc) + tail;
}

/* Pass 3: y *= f */
CYATTN_INLINE void cyattn_rowk_scale(float* y, ptrdiff_t n, float f) {
    ptrdiff_t j;
    cyattn_rows_scale_f32(y, n, f);
    for (j = n - n % 32; j < n; j++)
        y[j] = y[j] * f;
}

/* Pass 3 of log-softmax: y = (x - m) - lse_shift where kept, -inf - lse_shift elsewhere (as
   softmax_inplace's two shifts of the masked copy give it: -inf, or NaN for a NaN shift) */
CYATTN_INLINE void cyattn_rowk_log(const float* x, float* y, ptrdiff_t n, const uint8_t* keep,
                                   float m, float lse_shift) {
    CYATTN_RV vs = cyattn_rset1(m), vl = cyattn_rset1(lse_shift);
    ptrdiff_t j, n32 = n - n % 32;
    int k;
    for (j = 0; j < n32; j += 32)
        for (k = 0; k < CYATTN_RN; k++) {
            CYATTN_RV a = cyattn_rsub(cyattn_rload(x + j + k * CYATTN_RW), vs);
            if (keep)
                a = cyattn_rsel(cyattn_rkeep(keep + j + k * CYATTN_RW), a, cyattn_rset1(-INFINITY));
            cyattn_rstore(y + j + k * CYATTN_RW, cyattn_rsub(a, vl));
        }
    for (j = n32; j < n; j++)
        y[j] = (keep && !keep[j] ? -INFINITY : x[j] - m) - lse_shift;
}

CYATTN_INLINE int cyattn_softmax_row_f32_impl(const float* x, float* y, ptrdiff_t n,
                                              const uint8_t* keep, int log_out) {
    float m;
    if (!cyattn_rowk_max(x, n, keep, &m))
        return 0;
    if (log_out)        /* softmax_inplace: log(total) in double, rounded to float */
        cyattn_rowk_log(x, y, n, keep, m, (float)log((double)cyattn_rowk_exp(x, y, n, keep, m, 0)));
    else
        cyattn_rowk_scale(y, n, 1.0f / cyattn_rowk_exp(x, y, n, keep, m, 1));
    return 1;
}

/* The float32 softmax (log_out: log-softmax) of row x -> row y (distinct, or the same row) of
   n >= 32 elements, as softmax_row_to / softmax_inplace compute it (the same bits), unmasked (keep NULL) or under a
   contiguous bool mask keep[0:n] (False: weight exactly 0, x never used). Returns 0, with
   nothing written, when the row needs the module's general rules or full exp: no kept finite
   maximum (fully masked, +inf, NaN), or a kept score more than 87 below the maximum. The max and
   min reductions may take any order (only their values are used); the sum keeps lanes_sum's
   order, then the tail's: a masked lane adds +0, which changes no sum, so the bits are those of
   the masked copy's (-inf -> exp 0) three passes. (With 16 vector registers, AVX2, gcc keeps
   the 4 partial sums on the stack; an exp pass split in two halves of 2 partials each kept them
   in registers but ran no faster against ONNX Runtime, nor did two rows at a time or the next
   row's max pass moved before this row's scale, so the loops stay simple.) */
static inline int cyattn_softmax_row_f32(const float* x, float* y, ptrdiff_t n,
                                         const uint8_t* keep, int log_out) {
    if (log_out)
        return keep ? cyattn_softmax_row_f32_impl(x, y, n, keep, 1)
                    : cyattn_softmax_row_f32_impl(x, y, n, NULL, 1);
    return keep ? cyattn_softmax_row_f32_impl(x, y, n, keep, 0)
                : cyattn_softmax_row_f32_impl(x, y, n, NULL, 0);
}

/* One step of cyattn_softmax_rows_f32 over the first n32 elements: row i's exp pass (exp of
   xi - m, lane sums into acc; stored into yi unless log_out), and, when next / prev (constants
   at each call, as log_out), the next row's max pass (its lane maxima and minima into hi, lo)
   and the previous row's last pass (softmax: yp *= f; log_out: yp = (xp - mp) - f), each
   element by the operations of cyattn_softmax_row_f32's passes. */
CYATTN_INLINE void cyattn_rowp_step(const float* xi, float* yi, const float* xn, const float* xp,
                                    float* yp, ptrdiff_t n32, ptrdiff_t n, float m, float mp,
                                    float f, CYATTN_RV* acc, CYATTN_RV* hi, CYATTN_RV* lo,
                                    int next, int prev, int log_out) {
    CYATTN_RV vs = cyattn_rset1(m), vmp = cyattn_rset1(mp), vf = cyattn_rset1(f);
    ptrdiff_t j;
    int k;
    for (j = 0; j < n32; j += 32) {
        /* the row of x after next (the next step's max pass) and the next row of y, for
           writing (the next step's exp pass): rows of 2048 from L3 1.1-1.15x faster, with
           256- and 512-bit vectors (either prefetch alone gained little or nothing); a
           prefetch past the last row is not an access (it never faults) */
        cyattn_prefetch_r(xi + 2 * n + j);
        cyattn_prefetch_r(xi + 2 * n + j + 16);
        cyattn_prefetch_w(yi + n + j);
        cyattn_prefetch_w(yi + n + j + 16);
        for (k = 0; k < CYATTN_RN; k++) {
            CYATTN_RV e = cyattn_rexp_nonpos(cyattn_rload(xi + j + k * CYATTN_RW), vs);
            if (!log_out)
                cyattn_rstore(yi + j + k * CYATTN_RW, e);
            acc[k] = cyattn_radd(acc[k], e);
            if (next) {
                CYATTN_RV w = cyattn_rload(xn + j + k * CYATTN_RW);
                hi[k] = cyattn_rmax(w, hi[k]);
                lo[k] = cyattn_rmin(w, lo[k]);
            }
            if (prev && log_out)
                cyattn_rstore(yp + j + k * CYATTN_RW, cyattn_rsub(
                    cyattn_rsub(cyattn_rload(xp + j + k * CYATTN_RW), vmp), vf));
            else if (prev)
                cyattn_rstore(yp + j + k * CYATTN_RW,
                              cyattn_rmul(cyattn_rload(yp + j + k * CYATTN_RW), vf));
        }
    }
}

/* The unmasked float32 softmax (log_out: log-softmax) of `rows` contiguous rows of n >= 32
   elements, x -> y (distinct, or the same array), with the bits of cyattn_softmax_row_f32 on
   each row, software-pipelined across rows: the exp pass of row i also runs the max pass of
   row i + 1 and the last pass of row i - 1 (the scale, or the log pass). The exp pass is bound
   by its FMA-class operations (10 per vector); the other two passes are loads, stores,
   max/min and one multiply or two subtractions, which then fill its idle ports instead of
   running on their own: softmax 1.2-1.3x faster than row by row on rows of 512 and 2048 from
   L3 (Zen 5, 512-bit), 1.1-1.2x with 256-bit vectors. Returns how many leading rows are done;
   the row after them, if any, needs the module's general rules (cyattn_softmax_row_f32 would
   decline it) and nothing of it, or of later rows, has been written. */
CYATTN_INLINE ptrdiff_t cyattn_softmax_rows_f32_impl(const float* x, float* y, ptrdiff_t rows,
                                                     ptrdiff_t n, int log_out) {
    ptrdiff_t i, j, n32 = n - n % 32;
    float m = 0.0f, mp = 0.0f, f = 0.0f, mn;
    int k;
    if (rows <= 0 || !cyattn_rowk_max(x, n, NULL, &m))
        return 0;
    for (i = 0; i < rows; i++) {
        const float* xi = x + i * n;
        float* yi = y + i * n;
        int next = i + 1 < rows, prev = i > 0;
        const float* xn = next ? xi + n : xi;
        const float* xp = prev ? xi - n : xi;
        float* yp = prev ? yi - n : yi;
        CYATTN_RV acc[CYATTN_RN], hi[CYATTN_RN], lo[CYATTN_RN];
        float tail = 0.0f, m_next = 0.0f, total;
        for (k = 0; k < CYATTN_RN; k++) {
            acc[k] = cyattn_rset1(0.0f);
            hi[k] = cyattn_rset1(-INFINITY);
            lo[k] = cyattn_rset1(INFINITY);
        }
        if (next && prev)
            cyattn_rowp_step(xi, yi, xn, xp, yp, n32, n, m, mp, f, acc, hi, lo, 1, 1, log_out);
        else if (next)
            cyattn_rowp_step(xi, yi, xn, xp, yp, n32, n, m, mp, f, acc, hi, lo, 1, 0, log_out);
        else if (prev)
            cyattn_rowp_step(xi, yi, xn, xp, yp, n32, n, m, mp, f, acc, hi, lo, 0, 1, log_out);
        else
            cyattn_rowp_step(xi, yi, xn, xp, yp, n32, n, m, mp, f, acc, hi, lo, 0, 0, log_out);
        if (n > n32) {     /* the tails, as cyattn_rowk_exp / _max / _scale / _log do them */
            float xb[32], eb[32];
            CYATTN_RV vs = cyattn_rset1(m);
            for (k = 0; k < 32; k++)
                xb[k] = k < n - n32 ? xi[n32 + k] : m;
            for (k = 0; k < CYATTN_RN; k++)
                cyattn_rstore(eb + k * CYATTN_RW,
                              cyattn_rexp_nonpos(cyattn_rload(xb + k * CYATTN_RW), vs));
            for (k = 0; k < n - n32; k++) {
                if (!log_out)
                    yi[n32 + k] = eb[k];
                tail += eb[k];
            }
            if (prev)
                for (j = n32; j < n; j++)
                    yp[j] = log_out ? (xp[j] - mp) - f : yp[j] * f;
        }
        total = cyattn_rsum32(acc) + tail;
        /* softmax: the scale factor; log-softmax: log(sum) in double, rounded to float */
        f = log_out ? (float)log((double)total) : 1.0f / total;
        mp = m;
        if (next) {
            m_next = cyattn_rmax32(hi, 1);
            mn = cyattn_rmax32(lo, 0);
            for (j = n32; j < n; j++) {
                float v = xn[j];
                m_next = v > m_next ? v : m_next;
                mn = v < mn ? v : mn;
            }
            if (m_next == -INFINITY || m_next == INFINITY || !(mn - m_next >= -87.0f)) {
                if (log_out)
                    cyattn_rowk_log(xi, yi, n, NULL, m, f);
                else
                    cyattn_rowk_scale(yi, n, f);
                return i + 1;
            }
            m = m_next;
        }
    }
    if (log_out)
        cyattn_rowk_log(x + (rows - 1) * n, y + (rows - 1) * n, n, NULL, mp, f);
    else
        cyattn_rowk_scale(y + (rows - 1) * n, n, f);
    return rows;
}

static inline ptrdiff_t cyattn_softmax_rows_f32(const float* x, float* y, ptrdiff_t rows,
                                                ptrdiff_t n, int log_out) {
    return log_out ? cyattn_softmax_rows_f32_impl(x, y, rows, n, 1)
                   : cyattn_softmax_rows_f32_impl(x, y, rows, n, 0);
}
#else
static inline void cyattn_rows_max_min_f32(const float* x, ptrdiff_t n, float* pmax, float* pmin) {
    (void)x; (void)n; (void)pmax; (void)pmin;
}
static inline void cyattn_rows_exp_sum_f32(const float* x, float* y, ptrdiff_t n, float shift,
                                           float* part) {
    (void)x; (void)y; (void)n; (void)shift; (void)part;
}
static inline void cyattn_rows_scale_f32(float* y, ptrdiff_t n, float factor) {
    (void)y; (void)n; (void)factor;
}
static inline ptrdiff_t cyattn_softmax_rows_f32(const float* x, float* y, ptrdiff_t rows,
                                                ptrdiff_t n, int log_out) {
    (void)x; (void)y; (void)rows; (void)n; (void)log_out;
    return 0;
}
static inline int cyattn_softmax_row_f32(const float* x, float* y, ptrdiff_t n,
                                         const uint8_t* keep, int log_out) {
    (void)x; (void)y; (void)n; (void)keep; (void)log_out;
    return 0;
}
#endif

#endif /* CYATTN_SUPPORT_H */
