/* 8-bit K/V caches (issue 39, _attention_decode_grouped.pxi): the CYATTN_KV8_* format codes
   and the widening of int8 and float8_e4m3fn (ml_dtypes) elements to float32, exactly.

   The scales are not applied here: the decode folds them out of the element loops (a key's
   scale multiplies its score, a value's scale its weight), so a row of 8-bit elements is
   only converted. Every int8 value and every e4m3fn value is exact in float32.
   * int8: a sign extension and an int -> float conversion (gcc vectorises the loop:
     vpmovsxbd + vcvtdq2ps on AVX2).
   * e4m3fn (1 sign, 4 exponent bits of bias 7, 3 significand bits; no infinities, 0x7f and
     0xff are NaN): with F16C the bits are moved into binary16 position
     ((x & 0x7f) << 7 | (x & 0x80) << 8, the value times 2^-8 since binary16's bias is 15),
     converted by vcvtph2ps (exact, subnormals included) and multiplied by 2^8 (exact); the
     NaN codes are given a NaN exponent (AVX-512: 16 at a time, the binary16 bits made by
     (int16)(x << 8) >> 1 with bit 14 cleared). Elsewhere integer operations and one
     exact int -> float conversion, as _cyattn_half.h does for binary16.
   C because Cython has no 8-bit float type and cannot test whether the target has F16C. */
#ifndef CYATTN_KV8_H
#define CYATTN_KV8_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include "_cyattn_half.h"

/* Formats of 8-bit K/V elements (the 16-bit ones are CYATTN_HALF_F16 / _BF16 = 1 / 2) */
#define CYATTN_KV8_I8   3   /* int8, two's complement */
#define CYATTN_KV8_E4M3 4   /* float8_e4m3fn */

/* e4m3fn bits -> float32 bits. Normal (exponent field e > 0): rebias by +120 and shift the
   significand; subnormal (e = 0): m * 2^-9, exact and normal in float32; 0x7f / 0xff: the
   quiet NaN with the sign kept. */
static inline uint32_t cyattn_e4m3_bits_to_f32_bits(uint32_t x) {
    uint32_t m = x & 0x7fu;
    uint32_t normal = (m << 20) + (120u << 23);
    float sub_f = (float)(int32_t)m * 0.001953125f;                 /* 2^-9 */
    uint32_t sub;
    uint32_t b;
    memcpy(&sub, &sub_f, 4);
    b = (m < 0x08u) ? sub : normal;
    b = (m == 0x7fu) ? 0x7fc00000u : b;
    return b | ((x & 0x80u) << 24);
}

/* dst[0:n] = src[0:n] (8-bit elements of format fmt: CYATTN_KV8_I8 or CYATTN_KV8_E4M3)
   widened to float32, exactly. */
static inline void cyattn_kv8_to_float(const uint8_t* src, float* dst, ptrdiff_t n, int fmt) {
    ptrdiff_t i = 0;
    if (fmt == CYATTN_KV8_I8) {
        const int8_t* s = (const int8_t*)src;
#if defined(__AVX512F__)
        for (; i + 16 <= n; i += 16)       /* vpmovsxbd + vcvtdq2ps (gcc's own loop took
                                              three extends and two extracts per 64) */
            _mm512_storeu_ps(dst + i, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                _mm_loadu_si128((const __m128i*)(s + i)))));
#elif defined(__AVX2__)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                _mm_loadl_epi64((const __m128i*)(s + i)))));
#endif
        for (; i < n; i++)
            dst[i] = (float)s[i];
        return;
    }
#if CYATTN_HAVE_F16C && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    {
        /* 16 at a time: (int16)(x << 8) >> 1 puts the sign in bit 15 (and 14, cleared), the
           exponent in bits 13..10 and the significand in 9..7 of a binary16; the NaN codes
           (found on the bytes) get an all-ones float32 exponent and a quiet bit */
        const __m512 two8 = _mm512_set1_ps(256.0f);
        const __m256i keep = _mm256_set1_epi16((short)0xbfff);
        const __m128i low7 = _mm_set1_epi8(0x7f);
        const __m512i qnan = _mm512_set1_epi32(0x7fc00000);
        for (; i + 16 <= n; i += 16) {
            __m128i x = _mm_loadu_si128((const __m128i*)(src + i));
            __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_and_si128(x, low7), low7);
            __m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(x), 8);
            __m512 f;
            h = _mm256_and_si256(_mm256_srai_epi16(h, 1), keep);
            f = _mm512_mul_ps(_mm512_cvtph_ps(h), two8);
            f = _mm512_castsi512_ps(_mm512_mask_or_epi32(_mm512_castps_si512(f), nan,
                                                         _mm512_castps_si512(f), qnan));
            _mm512_storeu_ps(dst + i, f);
        }
    }
#endif
#if CYATTN_HAVE_F16C && defined(__AVX2__)
    {
        const __m256 two8 = _mm256_set1_ps(256.0f);
        const __m128i low7 = _mm_set1_epi16(0x7f), sign = _mm_set1_epi16(0x80);
        const __m128i nan16 = _mm_set1_epi16(0x7e00);
        for (; i + 8 <= n; i += 8) {
            __m128i x = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i*)(src + i)));
            __m128i m = _mm_and_si128(x, low7);
            __m128i h = _mm_or_si128(_mm_slli_epi16(m, 7),
                                     _mm_slli_epi16(_mm_and_si128(x, sign), 8));
            h = _mm_or_si128(h, _mm_and_si128(_mm_cmpeq_epi16(m, low7), nan16));
            _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtph_ps(h), two8));
        }
    }
#endif
    for (; i < n; i++) {
        uint32_t b = cyattn_e4m3_bits_to_f32_bits(src[i]);
        memcpy(dst + i, &b, 4);
    }
}

/* Element i of the 8-bit row v (format fmt) widened to float32 (tests, scalar paths). */
static inline float cyattn_kv8_widen1(const uint8_t* v, ptrdiff_t i, int fmt) {
    uint32_t b;
    float f;
    if (fmt == CYATTN_KV8_I8) return (float)((const int8_t*)v)[i];
    b = cyattn_e4m3_bits_to_f32_bits(v[i]);
    memcpy(&f, &b, 4);
    return f;
}

#endif /* CYATTN_KV8_H */
