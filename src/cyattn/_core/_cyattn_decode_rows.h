/* Grouped decode (issue 39, _attention_decode_grouped.pxi): the key and value passes of many
   query rows (the query heads of one K/V head x L rows) over a block of float32 key / value
   rows (16-bit K/V are widened into an L1 block first, once for all the rows).

   They give the bits of cyattn_dot_rows / cyattn_wsum_rows (fmt 0) in _cyattn_support.h, row
   for row: the same lane-wise partial sums, trees and tails per dot, and per accumulator
   element the same fused multiply-adds in key order, zero weights skipped. What changes is
   the register blocking, since with many rows the passes are bound by instructions, not by
   memory:
   * key pass (AVX-512): two query rows x four keys per step, so each key vector loaded feeds
     two rows' FMAs (cyattn_dot_rows loads every key vector once per row);
   * value pass (AVX-512): three query rows x up to 8 vectors (128 elements) of accumulators in
     registers, the weight's broadcast and zero test done once per row and value row
     (cyattn_wsum_rows holds 32 elements of 2-4 rows and redoes them per 32 elements).
   Elsewhere (AVX2, baseline) both call the _cyattn_support.h helpers.
   The AVX-512 bodies also read int8 rows (fmt CYATTN_KV8_I8, issue 39's 8-bit caches:
   cyattn_gdot_i8 / cyattn_gwsum_i8), widening each 16-element vector in registers (vpmovsxbd
   + vcvtdq2ps) where float32 rows are loaded: the same operations in the same order on the
   same (exact) values, so the bits of the float32 passes over the widened rows, without
   writing a widened block (its stores, four bytes per element, bound the block widening). The
   pieces handed to cyattn_dot_rows (an odd last query row, the last rows % 4 keys) widen their
   few rows into kvbuf first. fmt is a constant at every call, so each format gets its own
   code. Built where the float32 helpers take their AVX-512 paths (CYATTN_KV8_IN_REGISTERS);
   elsewhere the caller widens int8 blocks.
   Kept in its own header so that the grouped path's code sits apart from the support header
   (included by _attention_decode_grouped.pxi only). */
#ifndef CYATTN_DECODE_ROWS_H
#define CYATTN_DECODE_ROWS_H
#include "_cyattn_support.h"
#include "_cyattn_kv8.h"

#if defined(__AVX512F__) && CYATTN_HAVE_F16C && defined(CYATTN_DOT_KEYS) && CYATTN_DOT_KEYS == 4
#define CYATTN_KV8_IN_REGISTERS 1
#else
#define CYATTN_KV8_IN_REGISTERS 0
#endif

/* Element i of a row of float32 (fmt 0) or int8 (CYATTN_KV8_I8) elements, as float32 */
CYATTN_INLINE float cyattn_gelem(const void* k, ptrdiff_t i, const int fmt) {
    return fmt == 0 ? ((const float*)k)[i] : (float)((const int8_t*)k)[i];
}

/* Rows j .. j + cnt - 1 of k (row stride ks, n elements) as float32 rows: k's own (fmt 0), or
   widened into kvbuf (cnt * n floats); *rs: their stride */
CYATTN_INLINE const float* cyattn_grows(const void* k, ptrdiff_t j, ptrdiff_t cnt, ptrdiff_t ks,
                                        ptrdiff_t n, const int fmt, float* kvbuf,
                                        ptrdiff_t* rs) {
    ptrdiff_t i;
    if (fmt == 0) {
        *rs = ks;
        return (const float*)k + j * ks;
    }
    for (i = 0; i < cnt; i++)
        cyattn_kv8_to_float((const uint8_t*)k + (j + i) * ks, kvbuf + i * n, n, fmt);
    *rs = n;
    return kvbuf;
}

#if CYATTN_KV8_IN_REGISTERS
/* 16 elements of k from element off, widened to float32 */
CYATTN_INLINE __m512 cyattn_gload16(const void* k, ptrdiff_t off, const int fmt) {
    if (fmt == 0)
        return _mm512_loadu_ps((const float*)k + off);
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
        _mm_loadu_si128((const __m128i*)((const int8_t*)k + off))));
}
#endif

/* Software prefetch of a stream of rows while a block is processed: at key j of the block,
   stream row start + j (rows of k, then of v: cyattn_prefetch_rows_ahead) is prefetched.
   pf or pf->k NULL: none. */
typedef struct {
    const void* k;
    ptrdiff_t ks, rows, n;
    const void* v;
    ptrdiff_t vs, nv, esz, start;
} cyattn_pf_stream;

CYATTN_INLINE void cyattn_pf_step(const cyattn_pf_stream* pf, ptrdiff_t j) {
    if (pf != NULL && pf->k != NULL)
        cyattn_prefetch_rows_ahead(pf->k, pf->ks, pf->rows, pf->n, pf->v, pf->vs, pf->nv,
                                   pf->esz, pf->start + j);
}

/* scores[r * ss + j] = scale * dot(q[r * qs + 0:n], k[j * ks + 0:n]), r < nq, j < rows: the
   bits of cyattn_dot_rows(fmt 0) over k's rows as float32 (fmt 0: k is float32; int8:
   kvbuf holds 4 * n floats of scratch). */
CYATTN_INLINE void cyattn_gdot_fmt(float* scores, ptrdiff_t ss, const float* q, ptrdiff_t qs,
                                   ptrdiff_t nq, const void* k, ptrdiff_t rows, ptrdiff_t ks,
                                   ptrdiff_t n, float scale, const cyattn_pf_stream* pf,
                                   const int fmt, float* kvbuf) {
    ptrdiff_t j = 0, i, krs;
    const float* kr;
#if CYATTN_KV8_IN_REGISTERS
    const __m128 sc = _mm_set1_ps(scale);
    for (; j + 4 <= rows; j += 4) {
        ptrdiff_t r = 0, e;
        const ptrdiff_t k0 = j * ks, k1 = k0 + ks, k2 = k1 + ks, k3 = k2 + ks;
        for (i = 0; i < 4; i++)
            cyattn_pf_step(pf, j + i);
        for (; r + 2 <= nq; r += 2) {      /* two rows share each key vector */
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
                x = cyattn_gload16(k, k0 + e, fmt); y = cyattn_gload16(k, k0 + e + 16, fmt);
                al0 = _mm512_fmadd_ps(qa0, x, al0); ah0 = _mm512_fmadd_ps(qa1, y, ah0);
                bl0 = _mm512_fmadd_ps(qb0, x, bl0); bh0 = _mm512_fmadd_ps(qb1, y, bh0);
                x = cyattn_gload16(k, k1 + e, fmt); y = cyattn_gload16(k, k1 + e + 16, fmt);
                al1 = _mm512_fmadd_ps(qa0, x, al1); ah1 = _mm512_fmadd_ps(qa1, y, ah1);
                bl1 = _mm512_fmadd_ps(qb0, x, bl1); bh1 = _mm512_fmadd_ps(qb1, y, bh1);
                x = cyattn_gload16(k, k2 + e, fmt); y = cyattn_gload16(k, k2 + e + 16, fmt);
                al2 = _mm512_fmadd_ps(qa0, x, al2); ah2 = _mm512_fmadd_ps(qa1, y, ah2);
                bl2 = _mm512_fmadd_ps(qb0, x, bl2); bh2 = _mm512_fmadd_ps(qb1, y, bh2);
                x = cyattn_gload16(k, k3 + e, fmt); y = cyattn_gload16(k, k3 + e + 16, fmt);
                al3 = _mm512_fmadd_ps(qa0, x, al3); ah3 = _mm512_fmadd_ps(qa1, y, ah3);
                bl3 = _mm512_fmadd_ps(qb0, x, bl3); bh3 = _mm512_fmadd_ps(qb1, y, bh3);
            }
            for (; e < n; e++)
                for (i = 0; i < 4; i++) {
                    float kv = cyattn_gelem(k, (j + i) * ks + e, fmt);
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
        if (r < nq) {                      /* an odd last row: the helper's own loop */
            kr = cyattn_grows(k, j, 4, ks, n, fmt, kvbuf, &krs);
            cyattn_dot_rows(scores + r * ss + j, ss, q + r * qs, qs, 1, kr, 4, krs, n, 0, scale,
                            NULL, 0, 0, 0);
        }
    }
#endif
    for (i = j; i < rows; i++)
        cyattn_pf_step(pf, i);
    if (j < rows) {
        kr = cyattn_grows(k, j, rows - j, ks, n, fmt, kvbuf, &krs);
        cyattn_dot_rows(scores + j, ss, q, qs, nq, kr, rows - j, krs, n, 0, scale, NULL, 0, 0,
                        0);
    }
}

static void cyattn_gdot_f32(float* scores, ptrdiff_t ss, const float* q, ptrdiff_t qs,
                            ptrdiff_t nq, const float* k, ptrdiff_t rows, ptrdiff_t ks,
                            ptrdiff_t n, float scale, const cyattn_pf_stream* pf) {
    cyattn_gdot_fmt(scores, ss, q, qs, nq, k, rows, ks, n, scale, pf, 0, NULL);
}

/* cyattn_gdot_f32 over int8 key rows (called where CYATTN_KV8_IN_REGISTERS only: elsewhere the
   caller widens blocks); kvbuf: 4 * n floats of scratch */
static void cyattn_gdot_i8(float* scores, ptrdiff_t ss, const float* q, ptrdiff_t qs,
                           ptrdiff_t nq, const int8_t* k, ptrdiff_t rows, ptrdiff_t ks,
                           ptrdiff_t n, float scale, float* kvbuf) {
    cyattn_gdot_fmt(scores, ss, q, qs, nq, k, rows, ks, n, scale, NULL, CYATTN_KV8_I8, kvbuf);
}

#if CYATTN_KV8_IN_REGISTERS
/* nq (1..3) rows x nb (1..8) vectors of accumulators from element e0 over the value rows */
CYATTN_INLINE void cyattn_gwsum_block(float* acc, ptrdiff_t as, const float* w, ptrdiff_t ws,
                                      const int nq, const int nb, const void* v,
                                      ptrdiff_t rows, ptrdiff_t vs, ptrdiff_t e0,
                                      const cyattn_pf_stream* pf, const int fmt) {
    __m512 a[3][8];
    ptrdiff_t j;
    int r, b;
    for (r = 0; r < nq; r++)
        for (b = 0; b < nb; b++)
            a[r][b] = _mm512_loadu_ps(acc + r * as + e0 + b * 16);
    for (j = 0; j < rows; j++) {
        __m512 wr[3];
        __mmask16 nz[3];
        if (pf != NULL)
            cyattn_pf_step(pf, j);
        for (r = 0; r < nq; r++) {
            wr[r] = _mm512_set1_ps(w[r * ws + j]);
            nz[r] = _mm512_cmp_ps_mask(wr[r], _mm512_setzero_ps(), _CMP_NEQ_UQ);
        }
        for (b = 0; b < nb; b++) {
            __m512 x = cyattn_gload16(v, j * vs + e0 + b * 16, fmt);
            for (r = 0; r < nq; r++)
                a[r][b] = _mm512_mask3_fmadd_ps(wr[r], x, a[r][b], nz[r]);
        }
    }
    for (r = 0; r < nq; r++)
        for (b = 0; b < nb; b++)
            _mm512_storeu_ps(acc + r * as + e0 + b * 16, a[r][b]);
}

/* rows r .. r+nq-1 over all n elements: sweeps of 8, 4, 2, 1 vectors, then the scalar rest */
CYATTN_INLINE void cyattn_gwsum_rows3(float* acc, ptrdiff_t as, const float* w, ptrdiff_t ws,
                                      const int nq, const void* v, ptrdiff_t rows,
                                      ptrdiff_t vs, ptrdiff_t n, const cyattn_pf_stream* pf,
                                      const int fmt) {
    ptrdiff_t e0 = 0, j, e;
    int r;
    for (; e0 + 128 <= n; e0 += 128, pf = NULL)
        cyattn_gwsum_block(acc, as, w, ws, nq, 8, v, rows, vs, e0, pf, fmt);
    if (e0 + 64 <= n) {
        cyattn_gwsum_block(acc, as, w, ws, nq, 4, v, rows, vs, e0, pf, fmt);
        e0 += 64;
        pf = NULL;
    }
    if (e0 + 32 <= n) {
        cyattn_gwsum_block(acc, as, w, ws, nq, 2, v, rows, vs, e0, pf, fmt);
        e0 += 32;
        pf = NULL;
    }
    if (e0 + 16 <= n) {
        cyattn_gwsum_block(acc, as, w, ws, nq, 1, v, rows, vs, e0, pf, fmt);
        e0 += 16;
        pf = NULL;
    }
    for (j = 0; j < rows; j++) {
        if (pf != NULL)
            cyattn_pf_step(pf, j);
        if (e0 >= n)
            continue;
        for (r = 0; r < nq; r++) {
            float wj = w[r * ws + j];
            if (wj == 0) continue;
            for (e = e0; e < n; e++)
                acc[r * as + e] = CYATTN_MADD(wj, cyattn_gelem(v, j * vs + e, fmt),
                                              acc[r * as + e]);
        }
    }
}

/* all nq rows, three at a time */
CYATTN_INLINE void cyattn_gwsum_fmt(float* acc, ptrdiff_t as, const float* w, ptrdiff_t ws,
                                    ptrdiff_t nq, const void* v, ptrdiff_t rows, ptrdiff_t vs,
                                    ptrdiff_t n, const cyattn_pf_stream* pf, const int fmt) {
    ptrdiff_t r = 0;
    for (; r + 3 <= nq; r += 3, pf = NULL)
        cyattn_gwsum_rows3(acc + r * as, as, w + r * ws, ws, 3, v, rows, vs, n, pf, fmt);
    if (nq - r == 2)
        cyattn_gwsum_rows3(acc + r * as, as, w + r * ws, ws, 2, v, rows, vs, n, pf, fmt);
    else if (nq - r == 1)
        cyattn_gwsum_rows3(acc + r * as, as, w + r * ws, ws, 1, v, rows, vs, n, pf, fmt);
}
#endif

/* acc[r * as + 0:n] += w[r * ws + j] * v[j * vs + 0:n] over j < rows in order, zero weights
   skipped, r < nq: the bits of cyattn_wsum_rows(fmt 0). */
static void cyattn_gwsum_f32(float* acc, ptrdiff_t as, const float* w, ptrdiff_t ws,
                             ptrdiff_t nq, const float* v, ptrdiff_t rows, ptrdiff_t vs,
                             ptrdiff_t n, const cyattn_pf_stream* pf) {
    ptrdiff_t r = 0, j;
#if CYATTN_KV8_IN_REGISTERS
    cyattn_gwsum_fmt(acc, as, w, ws, nq, v, rows, vs, n, pf, 0);
    return;
#endif
    if (pf != NULL)
        for (j = 0; j < rows; j++)
            cyattn_pf_step(pf, j);
    for (; r < nq; r += 4)
        cyattn_wsum_rows(acc + r * as, as, w + r * ws, ws, nq - r < 4 ? nq - r : 4, v, rows,
                         vs, n, 0, 0);
}

/* cyattn_gwsum_f32 over int8 value rows (where CYATTN_KV8_IN_REGISTERS only) */
static void cyattn_gwsum_i8(float* acc, ptrdiff_t as, const float* w, ptrdiff_t ws,
                            ptrdiff_t nq, const int8_t* v, ptrdiff_t rows, ptrdiff_t vs,
                            ptrdiff_t n) {
#if CYATTN_KV8_IN_REGISTERS
    cyattn_gwsum_fmt(acc, as, w, ws, nq, v, rows, vs, n, NULL, CYATTN_KV8_I8);
#else
    (void)acc; (void)as; (void)w; (void)ws; (void)nq; (void)v; (void)rows; (void)vs; (void)n;
#endif
}

#endif
