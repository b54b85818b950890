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

/* ---- in-register int8 passes (AVX-512) ------------------------------------------------
   The grouped decode's key and value passes over int8 rows, widening each 16-element vector
   in registers (vpmovsxbd + vcvtdq2ps) where cyattn_gdot_f32 / cyattn_gwsum_f32 load float32:
   the same operations in the same order on the same (exact) values, so the bits of the
   widened block's passes, without writing the block (its stores, four bytes per element,
   bound the block widening). The pieces that those helpers hand to cyattn_dot_rows (an odd
   last query row, the last rows % 4 keys) widen their few rows into kvbuf first. Built only
   where the float32 helpers take their AVX-512 paths (CYATTN_KV8_IN_REGISTERS), so that the
   two always agree; elsewhere the caller widens blocks. */
#include "_cyattn_decode_rows.h"
#if defined(__AVX512F__) && CYATTN_HAVE_F16C && defined(CYATTN_DOT_KEYS) && CYATTN_DOT_KEYS == 4
#define CYATTN_KV8_IN_REGISTERS 1

CYATTN_INLINE __m512 cyattn_i8_load16(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}

/* cyattn_gdot_f32 over int8 key rows k (row stride ks), kvbuf: 4 * n floats of scratch */
static void cyattn_gdot_i8(float* scores, ptrdiff_t ss, const float* q, ptrdiff_t qs,
                           ptrdiff_t nq, const int8_t* k, ptrdiff_t rows, ptrdiff_t ks,
                           ptrdiff_t n, float scale, float* kvbuf) {
    ptrdiff_t j = 0, i, e;
    const __m128 sc = _mm_set1_ps(scale);
    for (; j + 4 <= rows; j += 4) {
        ptrdiff_t r = 0;
        const int8_t* k0 = k + j * ks;
        const int8_t* k1 = k0 + ks;
        const int8_t* k2 = k1 + ks;
        const int8_t* k3 = k2 + ks;
        for (; r + 2 <= nq; r += 2) {
            const float* qa = q + r * qs;
            const float* qb = qa + qs;
            __m512 al0 = _mm512_setzero_ps(), al1 = al0, al2 = al0, al3 = al0;
            __m512 ah0 = al0, ah1 = al0, ah2 = al0, ah3 = al0;
            __m512 bl0 = al0, bl1 = al0, bl2 = al0, bl3 = al0;
            __m512 bh0 = al0, bh1 = al0, bh2 = al0, bh3 = al0;
            float ta[4] = {0, 0, 0, 0}, tb[4] = {0, 0, 0, 0};
            for (e = 0; e + 32 <= n; e += 32) {
                __m512 qa0 = _mm512_loadu_ps(qa + e), qa1 = _mm512_loadu_ps(qa + e + 16);
                __m512 qb0 = _mm512_loadu_ps(qb + e), qb1 = _mm512_loadu_ps(qb + e + 16);
                __m512 x, y;
                x = cyattn_i8_load16(k0 + e); y = cyattn_i8_load16(k0 + e + 16);
                al0 = _mm512_fmadd_ps(qa0, x, al0); ah0 = _mm512_fmadd_ps(qa1, y, ah0);
                bl0 = _mm512_fmadd_ps(qb0, x, bl0); bh0 = _mm512_fmadd_ps(qb1, y, bh0);
                x = cyattn_i8_load16(k1 + e); y = cyattn_i8_load16(k1 + e + 16);
                al1 = _mm512_fmadd_ps(qa0, x, al1); ah1 = _mm512_fmadd_ps(qa1, y, ah1);
                bl1 = _mm512_fmadd_ps(qb0, x, bl1); bh1 = _mm512_fmadd_ps(qb1, y, bh1);
                x = cyattn_i8_load16(k2 + e); y = cyattn_i8_load16(k2 + e + 16);
                al2 = _mm512_fmadd_ps(qa0, x, al2); ah2 = _mm512_fmadd_ps(qa1, y, ah2);
                bl2 = _mm512_fmadd_ps(qb0, x, bl2); bh2 = _mm512_fmadd_ps(qb1, y, bh2);
                x = cyattn_i8_load16(k3 + e); y = cyattn_i8_load16(k3 + e + 16);
                al3 = _mm512_fmadd_ps(qa0, x, al3); ah3 = _mm512_fmadd_ps(qa1, y, ah3);
                bl3 = _mm512_fmadd_ps(qb0, x, bl3); bh3 = _mm512_fmadd_ps(qb1, y, bh3);
            }
            for (; e < n; e++)
                for (i = 0; i < 4; i++) {
                    float kv = (float)k[(j + i) * ks + e];
                    ta[i] = CYATTN_MADD(qa[e], kv, ta[i]);
                    tb[i] = CYATTN_MADD(qb[e], kv, tb[i]);
                }
            _mm_storeu_ps(scores + r * ss + j, _mm_mul_ps(sc, _mm_add_ps(
                cyattn_tree4(_mm512_add_ps(al0, ah0), _mm512_add_ps(al1, ah1),
                             _mm512_add_ps(al2, ah2), _mm512_add_ps(al3, ah3)),
                _mm_loadu_ps(ta))));
            _mm_storeu_ps(scores + (r + 1) * ss + j, _mm_mul_ps(sc, _mm_add_ps(
                cyattn_tree4(_mm512_add_ps(bl0, bh0), _mm512_add_ps(bl1, bh1),
                             _mm512_add_ps(bl2, bh2), _mm512_add_ps(bl3, bh3)),
                _mm_loadu_ps(tb))));
        }
        if (r < nq) {                      /* an odd last row: as cyattn_gdot_f32 does */
            for (i = 0; i < 4; i++)
                cyattn_kv8_to_float((const uint8_t*)(k + (j + i) * ks), kvbuf + i * n, n,
                                    CYATTN_KV8_I8);
            cyattn_dot_rows(scores + r * ss + j, ss, q + r * qs, qs, 1, kvbuf, 4, n, n, 0,
                            scale, NULL, 0, 0, 0);
        }
    }
    if (j < rows) {
        for (i = j; i < rows; i++)
            cyattn_kv8_to_float((const uint8_t*)(k + i * ks), kvbuf + (i - j) * n, n,
                                CYATTN_KV8_I8);
        cyattn_dot_rows(scores + j, ss, q, qs, nq, kvbuf, rows - j, n, n, 0, scale, NULL, 0,
                        0, 0);
    }
}

/* cyattn_gwsum_block over int8 value rows */
CYATTN_INLINE void cyattn_gwsum_block_i8(float* acc, ptrdiff_t as, const float* w,
                                         ptrdiff_t ws, const int nq, const int nb,
                                         const int8_t* v, ptrdiff_t rows, ptrdiff_t vs,
                                         ptrdiff_t e0) {
    __m512 a[3][8];
    ptrdiff_t j;
    int r, b;
    for (r = 0; r < nq; r++)
        for (b = 0; b < nb; b++)
            a[r][b] = _mm512_loadu_ps(acc + r * as + e0 + b * 16);
    for (j = 0; j < rows; j++) {
        __m512 wr[3];
        __mmask16 nz[3];
        for (r = 0; r < nq; r++) {
            wr[r] = _mm512_set1_ps(w[r * ws + j]);
            nz[r] = _mm512_cmp_ps_mask(wr[r], _mm512_setzero_ps(), _CMP_NEQ_UQ);
        }
        for (b = 0; b < nb; b++) {
            __m512 x = cyattn_i8_load16(v + j * vs + e0 + b * 16);
            for (r = 0; r < nq; r++)
                a[r][b] = _mm512_mask3_fmadd_ps(wr[r], x, a[r][b], nz[r]);
        }
    }
    for (r = 0; r < nq; r++)
        for (b = 0; b < nb; b++)
            _mm512_storeu_ps(acc + r * as + e0 + b * 16, a[r][b]);
}

CYATTN_INLINE void cyattn_gwsum_rows3_i8(float* acc, ptrdiff_t as, const float* w,
                                         ptrdiff_t ws, const int nq, const int8_t* v,
                                         ptrdiff_t rows, ptrdiff_t vs, ptrdiff_t n) {
    ptrdiff_t e0 = 0, j, e;
    int r;
    for (; e0 + 128 <= n; e0 += 128)
        cyattn_gwsum_block_i8(acc, as, w, ws, nq, 8, v, rows, vs, e0);
    if (e0 + 64 <= n) {
        cyattn_gwsum_block_i8(acc, as, w, ws, nq, 4, v, rows, vs, e0);
        e0 += 64;
    }
    if (e0 + 32 <= n) {
        cyattn_gwsum_block_i8(acc, as, w, ws, nq, 2, v, rows, vs, e0);
        e0 += 32;
    }
    if (e0 + 16 <= n) {
        cyattn_gwsum_block_i8(acc, as, w, ws, nq, 1, v, rows, vs, e0);
        e0 += 16;
    }
    if (e0 >= n)
        return;
    for (j = 0; j < rows; j++)
        for (r = 0; r < nq; r++) {
            float wj = w[r * ws + j];
            if (wj == 0) continue;
            for (e = e0; e < n; e++)
                acc[r * as + e] = CYATTN_MADD(wj, (float)v[j * vs + e], acc[r * as + e]);
        }
}

/* cyattn_gwsum_f32 over int8 value rows */
static void cyattn_gwsum_i8(float* acc, ptrdiff_t as, const float* w, ptrdiff_t ws,
                            ptrdiff_t nq, const int8_t* v, ptrdiff_t rows, ptrdiff_t vs,
                            ptrdiff_t n) {
    ptrdiff_t r = 0;
    for (; r + 3 <= nq; r += 3)
        cyattn_gwsum_rows3_i8(acc + r * as, as, w + r * ws, ws, 3, v, rows, vs, n);
    if (nq - r == 2)
        cyattn_gwsum_rows3_i8(acc + r * as, as, w + r * ws, ws, 2, v, rows, vs, n);
    else if (nq - r == 1)
        cyattn_gwsum_rows3_i8(acc + r * as, as, w + r * ws, ws, 1, v, rows, vs, n);
}
#else
#define CYATTN_KV8_IN_REGISTERS 0
/* never called: the caller tests CYATTN_KV8_IN_REGISTERS */
static inline void cyattn_gdot_i8(float* scores, ptrdiff_t ss, const float* q, ptrdiff_t qs,
                                  ptrdiff_t nq, const int8_t* k, ptrdiff_t rows, ptrdiff_t ks,
                                  ptrdiff_t n, float scale, float* kvbuf) {
    (void)scores; (void)ss; (void)q; (void)qs; (void)nq; (void)k; (void)rows; (void)ks;
    (void)n; (void)scale; (void)kvbuf;
}
static inline void cyattn_gwsum_i8(float* acc, ptrdiff_t as, const float* w, ptrdiff_t ws,
                                   ptrdiff_t nq, const int8_t* v, ptrdiff_t rows,
                                   ptrdiff_t vs, ptrdiff_t n) {
    (void)acc; (void)as; (void)w; (void)ws; (void)nq; (void)v; (void)rows; (void)vs; (void)n;
}
#endif

#endif /* CYATTN_KV8_H */
