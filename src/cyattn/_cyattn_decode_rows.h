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
   Kept in its own header so that the grouped path's code sits apart from the support header
   (included by _attention_decode_grouped.pxi only). */
#ifndef CYATTN_DECODE_ROWS_H
#define CYATTN_DECODE_ROWS_H
#include "_cyattn_support.h"

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
   bits of cyattn_dot_rows(fmt 0). */
static void cyattn_gdot_f32(float* scores, ptrdiff_t ss, const float* q, ptrdiff_t qs,
                            ptrdiff_t nq, const float* k, ptrdiff_t rows, ptrdiff_t ks,
                            ptrdiff_t n, float scale, const cyattn_pf_stream* pf) {
    ptrdiff_t j = 0, i;
#if defined(__AVX512F__) && CYATTN_HAVE_F16C && defined(CYATTN_DOT_KEYS) && CYATTN_DOT_KEYS == 4
    const __m128 sc = _mm_set1_ps(scale);
    for (; j + 4 <= rows; j += 4) {
        ptrdiff_t r = 0, e;
        const float* k0 = k + j * ks;
        const float* k1 = k0 + ks;
        const float* k2 = k1 + ks;
        const float* k3 = k2 + ks;
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
                x = _mm512_loadu_ps(k0 + e); y = _mm512_loadu_ps(k0 + e + 16);
                al0 = _mm512_fmadd_ps(qa0, x, al0); ah0 = _mm512_fmadd_ps(qa1, y, ah0);
                bl0 = _mm512_fmadd_ps(qb0, x, bl0); bh0 = _mm512_fmadd_ps(qb1, y, bh0);
                x = _mm512_loadu_ps(k1 + e); y = _mm512_loadu_ps(k1 + e + 16);
                al1 = _mm512_fmadd_ps(qa0, x, al1); ah1 = _mm512_fmadd_ps(qa1, y, ah1);
                bl1 = _mm512_fmadd_ps(qb0, x, bl1); bh1 = _mm512_fmadd_ps(qb1, y, bh1);
                x = _mm512_loadu_ps(k2 + e); y = _mm512_loadu_ps(k2 + e + 16);
                al2 = _mm512_fmadd_ps(qa0, x, al2); ah2 = _mm512_fmadd_ps(qa1, y, ah2);
                bl2 = _mm512_fmadd_ps(qb0, x, bl2); bh2 = _mm512_fmadd_ps(qb1, y, bh2);
                x = _mm512_loadu_ps(k3 + e); y = _mm512_loadu_ps(k3 + e + 16);
                al3 = _mm512_fmadd_ps(qa0, x, al3); ah3 = _mm512_fmadd_ps(qa1, y, ah3);
                bl3 = _mm512_fmadd_ps(qb0, x, bl3); bh3 = _mm512_fmadd_ps(qb1, y, bh3);
            }
            for (; e < n; e++)
                for (i = 0; i < 4; i++) {
                    ta[i] = CYATTN_MADD(qa[e], k[(j + i) * ks + e], ta[i]);
                    tb[i] = CYATTN_MADD(qb[e], k[(j + i) * ks + e], tb[i]);
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
        if (r < nq)                        /* an odd last row: the helper's own loop */
            cyattn_dot_rows(scores + r * ss + j, ss, q + r * qs, qs, 1, k + j * ks, 4, ks, n,
                            0, scale, NULL, 0, 0, 0);
    }
#endif
    for (i = j; i < rows; i++)
        cyattn_pf_step(pf, i);
    if (j < rows)
        cyattn_dot_rows(scores + j, ss, q, qs, nq, k + j * ks, rows - j, ks, n, 0, scale, NULL,
                        0, 0, 0);
}

#if defined(__AVX512F__) && CYATTN_HAVE_F16C
/* nq (1..3) rows x nb (1..8) vectors of accumulators from element e0 over the value rows */
CYATTN_INLINE void cyattn_gwsum_block(float* acc, ptrdiff_t as, const float* w, ptrdiff_t ws,
                                      const int nq, const int nb, const float* v,
                                      ptrdiff_t rows, ptrdiff_t vs, ptrdiff_t e0,
                                      const cyattn_pf_stream* pf) {
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
            __m512 x = _mm512_loadu_ps(v + j * vs + e0 + b * 16);
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
                                      const int nq, const float* v, ptrdiff_t rows,
                                      ptrdiff_t vs, ptrdiff_t n, const cyattn_pf_stream* pf) {
    ptrdiff_t e0 = 0, j, e;
    int r;
    for (; e0 + 128 <= n; e0 += 128, pf = NULL)
        cyattn_gwsum_block(acc, as, w, ws, nq, 8, v, rows, vs, e0, pf);
    if (e0 + 64 <= n) {
        cyattn_gwsum_block(acc, as, w, ws, nq, 4, v, rows, vs, e0, pf);
        e0 += 64;
        pf = NULL;
    }
    if (e0 + 32 <= n) {
        cyattn_gwsum_block(acc, as, w, ws, nq, 2, v, rows, vs, e0, pf);
        e0 += 32;
        pf = NULL;
    }
    if (e0 + 16 <= n) {
        cyattn_gwsum_block(acc, as, w, ws, nq, 1, v, rows, vs, e0, pf);
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
                acc[r * as + e] = CYATTN_MADD(wj, v[j * vs + e], acc[r * as + e]);
        }
    }
}
#endif

/* acc[r * as + 0:n] += w[r * ws + j] * v[j * vs + 0:n] over j < rows in order, zero weights
   skipped, r < nq: the bits of cyattn_wsum_rows(fmt 0). */
static void cyattn_gwsum_f32(float* acc, ptrdiff_t as, const float* w, ptrdiff_t ws,
                             ptrdiff_t nq, const float* v, ptrdiff_t rows, ptrdiff_t vs,
                             ptrdiff_t n, const cyattn_pf_stream* pf) {
    ptrdiff_t r = 0, j;
#if defined(__AVX512F__) && CYATTN_HAVE_F16C
    for (; r + 3 <= nq; r += 3, pf = NULL)
        cyattn_gwsum_rows3(acc + r * as, as, w + r * ws, ws, 3, v, rows, vs, n, pf);
    if (nq - r == 2)
        cyattn_gwsum_rows3(acc + r * as, as, w + r * ws, ws, 2, v, rows, vs, n, pf);
    else if (nq - r == 1)
        cyattn_gwsum_rows3(acc + r * as, as, w + r * ws, ws, 1, v, rows, vs, n, pf);
    return;
#endif
    if (pf != NULL)
        for (j = 0; j < rows; j++)
            cyattn_pf_step(pf, j);
    for (; r < nq; r += 4)
        cyattn_wsum_rows(acc + r * as, as, w + r * ws, ws, nq - r < 4 ? nq - r : 4, v, rows,
                         vs, n, 0, 0);
}

#endif
