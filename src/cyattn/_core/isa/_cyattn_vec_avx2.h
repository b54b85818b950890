/*
 * The AVX2 vector pieces (the avx2 variant: -mavx2 -mfma -mf16c), in the vocabulary that the
 * ISA-independent bodies in _cyattn_decode.h and _cyattn_softmax_rows.h are written in:
 *   - decode: the vector type, loads (float32 or 16-bit elements widened in registers) and
 *     masked FMA of cyattn_wsum_rows; the key groups (2 keys) of cyattn_dot_rows and their
 *     lane trees;
 *   - softmax rows: the CYATTN_R* operations on 256-bit vectors with vector masks, and the
 *     32-lane sum and max/min.
 * Included after _cyattn_vec_avx512.h: each section applies only where that header left its
 * vocabulary undefined (CYATTN_VW, CYATTN_RW), so the avx512 variant uses its own wider
 * vectors. C because Cython cannot express SIMD vector types or intrinsics.
 */
#ifndef CYATTN_VEC_AVX2_H
#define CYATTN_VEC_AVX2_H

#include "_cyattn_common.h"
#include "_cyattn_half.h"

/* ---- decode ---------------------------------------------------------------------------- */
#if !defined(CYATTN_VW) && defined(__AVX2__) && defined(__FMA__) && CYATTN_HAVE_F16C
#include <immintrin.h>
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

/* x[i]: lanes 0-7 of key i after the + 16 and + 8 steps */
static inline __m128 cyattn_tree2(__m256 x0, __m256 x1) {
    __m256 c = _mm256_add_ps(_mm256_permute2f128_ps(x0, x1, 0x20),
                             _mm256_permute2f128_ps(x0, x1, 0x31));   /* + 4: [key0 | key1] */
    c = _mm256_add_ps(c, _mm256_permute_ps(c, 0x4e));
    c = _mm256_add_ps(c, _mm256_permute_ps(c, 0xb1));
    return _mm_unpacklo_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
}
#define CYATTN_DOT_KEYS 2

/* Scores of the nq query rows against the 2 key rows j .. j + 1 (a key group of
   cyattn_dot_rows_fmt, which does the prefetches): see the dot's description in
   _cyattn_decode.h. */
CYATTN_INLINE void cyattn_dot_keys(float* scores, ptrdiff_t ss, const float* q, ptrdiff_t qs,
                                   ptrdiff_t nq, const void* k, ptrdiff_t j, ptrdiff_t ks,
                                   ptrdiff_t n, const int fmt, float scale) {
    ptrdiff_t e, i, r;
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

/* ---- softmax rows ---------------------------------------------------------------------- */
/* 256-bit vectors, 4 per 32 lanes, masks as all-ones lanes (see _cyattn_softmax_rows.h) */
#if !defined(CYATTN_RW) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CYATTN_RV __m256
#define CYATTN_RW 8
#define cyattn_rload _mm256_loadu_ps
#define cyattn_rstore _mm256_storeu_ps
/* non-temporal store of a vector to a 32-byte aligned address (the output rows past the caches) */
#define cyattn_rstream _mm256_stream_ps
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
/* the exp steps of the softmax rows run in lockstep (cyattn_rexp_nonpos_lock) */
#define CYATTN_RLOCK 1

/* part[0] + ... + part[31] of 32 lane partials held in CYATTN_RN vectors, in lanes_sum's
   order (lane l plus lane l + 16, then + 8, + 4, + 2, then lane 0 plus lane 1) */
static inline float cyattn_rsum32(const CYATTN_RV* v) {
    __m256 c;
    __m128 d;
    c = _mm256_add_ps(_mm256_add_ps(v[0], v[2]), _mm256_add_ps(v[1], v[3]));
    d = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
    d = _mm_add_ps(d, _mm_movehl_ps(d, d));
    return _mm_cvtss_f32(d) + _mm_cvtss_f32(_mm_shuffle_ps(d, d, 1));
}

/* max (want_max) or min of 32 lane values held in CYATTN_RN vectors (no NaN among them) */
static inline float cyattn_rmax32(const CYATTN_RV* v, int want_max) {
    __m256 c;
    __m128 d;
    c = want_max ? _mm256_max_ps(_mm256_max_ps(v[0], v[2]), _mm256_max_ps(v[1], v[3]))
                 : _mm256_min_ps(_mm256_min_ps(v[0], v[2]), _mm256_min_ps(v[1], v[3]));
    d = want_max ? _mm_max_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1))
                 : _mm_min_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
    d = want_max ? _mm_max_ps(d, _mm_movehl_ps(d, d)) : _mm_min_ps(d, _mm_movehl_ps(d, d));
    d = want_max ? _mm_max_ss(d, _mm_shuffle_ps(d, d, 1)) : _mm_min_ss(d, _mm_shuffle_ps(d, d, 1));
    return _mm_cvtss_f32(d);
}
#endif

#endif /* CYATTN_VEC_AVX2_H */
