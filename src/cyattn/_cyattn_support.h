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

/* ---- decode: weighted sum of value rows ------------------------------------------------ */
/* acc[0:n] += w[j] * v[j * vs + 0:n] for rows j = 0 .. rows-1 in order, skipping rows with
   w[j] == 0 (never read: a masked key's inf/NaN value stays out). v holds float32 (fmt 0) or
   16-bit elements of format fmt, widened exactly as cyattn_half_to_float does. Per element the
   updates happen in row order, each a fused multiply-add where the module is built with FMA
   (as gcc contracts `acc[e] += w * v[e]` there) and a multiply then an add elsewhere, so the
   result is that of the row-by-row loop. Blocks of 64 (AVX-512) or 32 (AVX2) elements stay in
   registers across all the rows: the row-by-row loop loaded and stored the accumulator for
   every row, which bound decode. pf_bytes > 0: the first block's pass prefetches the row that
   far ahead (in bytes of v). */
static inline float cyattn_widen1(const void* v, ptrdiff_t i, int fmt) {
    uint32_t b;
    float f;
    if (fmt == 0) return ((const float*)v)[i];
    b = ((const uint16_t*)v)[i];
    b = (fmt == CYATTN_HALF_BF16) ? (b << 16) : cyattn_f16_bits_to_f32_bits(b);
    memcpy(&f, &b, 4);
    return f;
}

/* One vector type per ISA for cyattn_wsum_rows: CYATTN_VW float lanes, loads of float32 or
   16-bit elements (widened in registers), and the FMA. */
#if defined(__AVX512F__) && CYATTN_HAVE_F16C
typedef __m512 cyattn_vec;
#define CYATTN_VW 16
#define cyattn_vloadf _mm512_loadu_ps
#define cyattn_vstoref _mm512_storeu_ps
#define cyattn_vset1 _mm512_set1_ps
#define cyattn_vfmadd _mm512_fmadd_ps
static inline __m512 cyattn_vload(const void* v, ptrdiff_t i, int fmt) {
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
#define cyattn_vfmadd _mm256_fmadd_ps
static inline __m256 cyattn_vload(const void* v, ptrdiff_t i, int fmt) {
    if (fmt == 0) return _mm256_loadu_ps((const float*)v + i);
    if (fmt == CYATTN_HALF_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)v + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
        _mm_loadu_si128((const __m128i*)((const uint16_t*)v + i))), 16));
}
#endif

static inline void cyattn_wsum_rows(float* acc, const float* w, const void* v, ptrdiff_t rows,
                                    ptrdiff_t vs, ptrdiff_t n, int fmt, ptrdiff_t pf_bytes) {
    ptrdiff_t e0 = 0, j, e, off;
    ptrdiff_t esz = fmt == 0 ? 4 : 2;
    ptrdiff_t end = rows * vs * esz;       /* prefetches stay inside the rows */
#if defined(CYATTN_VW)
    for (; e0 + 4 * CYATTN_VW <= n; e0 += 4 * CYATTN_VW) {
        cyattn_vec a0 = cyattn_vloadf(acc + e0), a1 = cyattn_vloadf(acc + e0 + CYATTN_VW);
        cyattn_vec a2 = cyattn_vloadf(acc + e0 + 2 * CYATTN_VW);
        cyattn_vec a3 = cyattn_vloadf(acc + e0 + 3 * CYATTN_VW);
        for (j = 0; j < rows; j++) {
            cyattn_vec wj;
            if (pf_bytes > 0 && j * vs * esz + pf_bytes < end)
                for (off = 0; off < n * esz; off += 64)
                    cyattn_prefetch_r((const char*)v + j * vs * esz + pf_bytes + off);
            if (w[j] == 0) continue;
            wj = cyattn_vset1(w[j]);
            a0 = cyattn_vfmadd(wj, cyattn_vload(v, j * vs + e0, fmt), a0);
            a1 = cyattn_vfmadd(wj, cyattn_vload(v, j * vs + e0 + CYATTN_VW, fmt), a1);
            a2 = cyattn_vfmadd(wj, cyattn_vload(v, j * vs + e0 + 2 * CYATTN_VW, fmt), a2);
            a3 = cyattn_vfmadd(wj, cyattn_vload(v, j * vs + e0 + 3 * CYATTN_VW, fmt), a3);
        }
        cyattn_vstoref(acc + e0, a0);
        cyattn_vstoref(acc + e0 + CYATTN_VW, a1);
        cyattn_vstoref(acc + e0 + 2 * CYATTN_VW, a2);
        cyattn_vstoref(acc + e0 + 3 * CYATTN_VW, a3);
        pf_bytes = 0;
    }
#endif
    for (j = 0; j < rows; j++) {           /* the rest of the elements, row by row */
        float wj = w[j];
        if (pf_bytes > 0 && j * vs * esz + pf_bytes < end)
            for (off = 0; off < n * esz; off += 64)
                cyattn_prefetch_r((const char*)v + j * vs * esz + pf_bytes + off);
        if (wj == 0) continue;
        for (e = e0; e < n; e++)
            acc[e] += wj * cyattn_widen1(v, j * vs + e, fmt);
    }
}

#endif /* CYATTN_SUPPORT_H */
