/*
 * Half-precision storage: the CYATTN_HALF_* format codes, widening float16/bfloat16 elements
 * to float32 (F16C where the variant is built with it) and rounding float32 back, bit-exact
 * against NumPy / ml_dtypes. C because Cython has no 16-bit float type and cannot test
 * whether the target has F16C.
 */
#ifndef CYATTN_HALF_H
#define CYATTN_HALF_H

#include <stdint.h>
#include "_cyattn_cpu.h"

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

/* Element i of v widened to float32: v holds float32 (fmt 0) or 16-bit elements of format
   fmt, widened exactly as cyattn_half_to_float does. */
static inline float cyattn_widen1(const void* v, ptrdiff_t i, int fmt) {
    uint32_t b;
    float f;
    if (fmt == 0) return ((const float*)v)[i];
    b = ((const uint16_t*)v)[i];
    b = (fmt == CYATTN_HALF_BF16) ? (b << 16) : cyattn_f16_bits_to_f32_bits(b);
    memcpy(&f, &b, 4);
    return f;
}

#endif /* CYATTN_HALF_H */
