/*
 * The decode helpers: the scores of a few query rows against a run of key rows
 * (cyattn_dot_rows) and the weighted sum of value rows (cyattn_wsum_rows), over float32 or
 * 16-bit K/V. The bodies are ISA-independent: they use the vector vocabulary of
 * _cyattn_vec_avx512.h / _cyattn_vec_avx2.h where one is defined (CYATTN_VW, CYATTN_DOT_KEYS)
 * and scalar loops for the rest. C because the explicit vectors (and the register blocking
 * they need) cannot be expressed in Cython.
 */
#ifndef CYATTN_DECODE_H
#define CYATTN_DECODE_H

#include <stddef.h>
#include "_cyattn_common.h"
#include "_cyattn_half.h"
#include "_cyattn_vec_avx512.h"
#include "_cyattn_vec_avx2.h"
#include "_cyattn_vec_neon.h"

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
   prefetches the row that far ahead (in bytes of v). The vector type, loads and
   FMA of each ISA: _cyattn_vec_*.h. */

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
   are prefetched instead, for the value pass that follows. The key groups (and their trees) of
   each ISA: cyattn_dot_keys in _cyattn_vec_*.h. */

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
#if defined(CYATTN_DOT_KEYS)
    for (; j + CYATTN_DOT_KEYS <= rows; j += CYATTN_DOT_KEYS) {
        if (pf > 0)
            for (i = 0; i < CYATTN_DOT_KEYS; i++)
                cyattn_prefetch_rows_ahead(k, ks, rows, n, v, vs, nv, esz, j + i + pf);
        cyattn_dot_keys(scores, ss, q, qs, nq, k, j, ks, n, fmt, scale);
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

#endif /* CYATTN_DECODE_H */
