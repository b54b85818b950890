/*
 * The float32 softmax rows in explicit vectors: the passes of a row (max/min, exp and sum,
 * scale or log) and whole rows, one at a time or software-pipelined across rows. The bodies
 * are ISA-independent, written in the CYATTN_R* vocabulary of _cyattn_vec_avx512.h /
 * _cyattn_vec_avx2.h; without either (CYATTN_ROWK 0) only never-called stubs are defined. C
 * because Cython cannot express SIMD vector types or intrinsics.
 */
#ifndef CYATTN_SOFTMAX_ROWS_H
#define CYATTN_SOFTMAX_ROWS_H

#include <stddef.h>
#include <stdint.h>
#include "_cyattn_common.h"
#include "_cyattn_vec_avx512.h"
#include "_cyattn_vec_avx2.h"
#include "_cyattn_vec_neon.h"

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
   cyattn_rpow2(t) (_cyattn_vec_*.h): 2**n as a float from the shifter sum t (exp_f32_nonpos's
   (ni + 127) << 23 with ni = bits(t) - 0x4B400000: 0x4B400000 << 23 vanishes modulo 2**32, leaving
   (bits(t) << 23) + (127 << 23), and 127 << 23 is the bit pattern of 1.0f, a constant the exp
   already holds in a register) */
#if defined(CYATTN_RW)
#define CYATTN_ROWK 1
#else
#define CYATTN_ROWK 0
#endif

/* Whether the host's rule streams softmax outputs past the caches (STREAM_MIN_BYTES in
   _softmax_rows.pxi), and from which row length (CYATTN_ROWS_STREAM_MIN_ROW, floats): with
   512-bit vectors every row length; with 256-bit ones rows of 512 floats or more. The
   256-bit streamed rows (one row at a time, not pipelined) against the pipelined ordinary
   rows, interleaved, 1 / 2 threads, speed ratios (bench/bench_softmax_stream.py --nt, under
   tools/avx2_host.sh on the AVX-512 hosts): Zen 5: rows of 2048 at 0.9x, rows of 512 level at
   1 thread and 0.9x at 2; Zen 4 (32 MiB L3): rows of 2048 1.3-1.6x (32-128 MiB out), rows of
   1024 1.3x, rows of 512 1.05-1.15x (noisy); Zen 3, a native AVX2 CPU, once the scratch row
   was placed (see cyattn_softmax_rows_f32_nt; 32 MiB out, three runs): rows of 512 1.07,
   1.08, 1.10x at 1 thread and 1.14, 1.09, 1.04x at 2, rows of 256 0.91-0.99x, rows of 128
   0.72-0.91x. Shorter rows stay on the pipelined ordinary rows: the streamed row's own passes
   (one row at a time, in cache 215-229 ns a row of 512 against the pipelined rows' 197 on
   Zen 3) then cost more than the read for ownership saves. The issue-46 hosts whose ordinary
   rows trailed ONNX Runtime (Zen 3, an AVX2 view of a Xeon) were all 256-bit; Zen 5 runs the
   512-bit variant. An explicit stream_min still takes
   the streamed rows in any variant (the tests do); NEON has no non-temporal store intrinsic
   and never streams by rule. */
#if defined(CYATTN_RW) && CYATTN_RW == 16
#define CYATTN_ROWS_STREAM 1
#define CYATTN_ROWS_STREAM_MIN_ROW 0
#elif defined(CYATTN_RW) && CYATTN_RW == 8
#define CYATTN_ROWS_STREAM 1
#define CYATTN_ROWS_STREAM_MIN_ROW 512
#else
#define CYATTN_ROWS_STREAM 0
#define CYATTN_ROWS_STREAM_MIN_ROW 0
#endif

/* The scratch of the streamed rows (cyattn_softmax_rows_f32_nt): floats for rows of n, from a
   boundary of CYATTN_NT_PAGE bytes */
#define CYATTN_NT_PAGE 4096
#define CYATTN_NT_SCRATCH(n) ((n) + CYATTN_NT_PAGE / 4)

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

/* The exp of a 32-lane step, x[0 : 32] -> v[0 : CYATTN_RN], for the row loops: CYATTN_REXP_STEP
   computes the step, then CYATTN_REXP_GET(v, k, x, vs) gives its vector k. With CYATTN_RLOCK (the
   avx2 variant), cyattn_rexp_nonpos_lock runs the CYATTN_RN vectors in lockstep, each operation
   for every vector before the next: every lane gets the operations of cyattn_rexp_nonpos in
   its order, so the same bits (tools/bits_digest.py). Why: written one vector after the other
   (the other variants' way), each vector is a chain of 13 dependent operations (~50 cycles)
   and Zen 3's out-of-order window overlapped too few of them: the rows of 512 ran at 12.6
   cycles a vector of 8 against the 5 their FMA-class operations need. Four chains side by side
   made the exp pass 1.2x and the pipelined rows of 512 1.15x faster in cache (Zen 3, 1 thread,
   a C harness over this header, min of 21 interleaved runs: exp pass 144 -> 121 ns a row,
   pipelined rows 217 -> 190 ns). Lockstep over 8 vectors (64 lanes) ran 1.4x slower than over
   4: 16 registers do not hold eight chains. The lockstep code also applies 2**n by an integer
   add to p's exponent field (cyattn_rscale2n) instead of the multiply by cyattn_rpow2(t): one
   multiply fewer on the two FMA pipes and a shorter chain (what bounds the loop on Zen 3 is
   the chain: bench/results/x86_peers.md, sixth session). For an argument in
   [EXP_NORMAL_F32, 0] (the contract of every caller) p * 2**n is a normal number and both are
   exact: the same bits (a C harness compared 141,934,593 arguments there and NaNs;
   tests/test_kernels.py::test_softmax_exp_of_every_argument_range_matches_the_general_path_bits).
   With n taken from the shifter sum's bits (t << 23) the add was wrong for a NaN score with
   payload bits in the low 9 (they shifted into the exponent and turned p's NaN into a number;
   the rows let a NaN through their max / min pass and count on the exp to spread it:
   tests/test_kernels.py::test_softmax_nan_payloads_spread); n converted from nn is 0x80000000
   for a NaN, whose shift is 0, so p's NaN passes as the multiply passes it. Zen 3, C harness,
   exp pass of rows of 512 (2048): 158.6 -> 144.8 (629 -> 610) ns a row; in one process, rows
   of 512 in cache 1.02-1.05 of main where a build with main's code ran 0.96-0.99. First landed
   in the sixth session and reverted: its longer code moved the GEMM micro-kernel's k loop
   into a third 64-byte fetch window and SDPA (8,8,128,64) ran 0.92-0.99 of main; with that
   loop aligned where it stands (cyattn_kloop4x24_f32, seventh session), 1.007-1.012. The
   other variants keep the vector-by-vector code (not measured this way: no AVX-512 host, no
   Arm hardware). */
#if defined(CYATTN_RLOCK) && CYATTN_RLOCK
/* cyattn_rexp_nonpos's operations after its subtraction, on the `count` vectors of a
   (a[k] = x - shift, replaced by its exp) in lockstep: each operation for every vector before
   the next. The row loops' steps (count CYATTN_RN) and the fused attention's panels (3) share
   it, so the exp's constants are spelled once for all the lockstep callers. */
CYATTN_INLINE void cyattn_rexp_lock_n(CYATTN_RV* a, const int count) {
    CYATTN_RV t[CYATTN_RN], nn[CYATTN_RN], r[CYATTN_RN], p[CYATTN_RN];
    int k;
    for (k = 0; k < count; k++)
        t[k] = cyattn_rfma(a[k], cyattn_rset1(1.44269504088896341f), cyattn_rset1(12582912.0f));
    for (k = 0; k < count; k++)
        nn[k] = cyattn_rsub(t[k], cyattn_rset1(12582912.0f));
    for (k = 0; k < count; k++)
        r[k] = cyattn_rfnma(nn[k], cyattn_rset1(0.693145751953125f), a[k]);
    for (k = 0; k < count; k++)
        r[k] = cyattn_rfnma(nn[k], cyattn_rset1(1.428606765330187045e-06f), r[k]);
    for (k = 0; k < count; k++)
        p[k] = cyattn_rfma(cyattn_rset1(0.001381461275741458f), r[k],
                           cyattn_rset1(0.008368710055947304f));
    for (k = 0; k < count; k++)
        p[k] = cyattn_rfma(p[k], r[k], cyattn_rset1(0.04166838899254799f));
    for (k = 0; k < count; k++)
        p[k] = cyattn_rfma(p[k], r[k], cyattn_rset1(0.1666652113199234f));
    for (k = 0; k < count; k++)
        p[k] = cyattn_rfma(p[k], r[k], cyattn_rset1(0.4999999403953552f));
    for (k = 0; k < count; k++)
        p[k] = cyattn_rfma(p[k], r[k], cyattn_rset1(1.0f));
    for (k = 0; k < count; k++)
        p[k] = cyattn_rfma(p[k], r[k], cyattn_rset1(1.0f));
    for (k = 0; k < count; k++)
        a[k] = cyattn_rscale2n(p[k], nn[k]);
}

static inline void cyattn_rexp_nonpos_lock(CYATTN_RV* v, const float* x, CYATTN_RV shift) {
    int k;
    for (k = 0; k < CYATTN_RN; k++)
        v[k] = cyattn_rsub(cyattn_rload(x + k * CYATTN_RW), shift);
    cyattn_rexp_lock_n(v, CYATTN_RN);
}
/* The fused attention's panel exp (panel_online_softmax, _attention_fused.pxi, with no masked
   or far-off score): panel[p * 24 + j] = exp_f32_nonpos(panel[p * 24 + j] - shift[j]) and
   part[j] += it, key p after key p - 1, for the 24 query lanes of the avx2 tiles, the three
   vectors of a key in lockstep as cyattn_rexp_nonpos_lock does (the same operations on every
   lane, and the same order of each lane's sum, so the same bits). gcc's vectorisation of the
   Cython loop ran one vector's chain after the other: 9.4 against 7.7 ns a key of 24 lanes on
   Zen 3 (a C harness, 128 keys in L1). */
#define CYATTN_HAVE_PANEL_EXP24 1
static inline void cyattn_panel_exp24_f32(float* panel, ptrdiff_t kb, const float* shift,
                                          float* part) {
    CYATTN_RV sh[3], acc[3];
    ptrdiff_t p;
    int k;
    for (k = 0; k < 3; k++) {
        sh[k] = cyattn_rload(shift + k * CYATTN_RW);
        acc[k] = cyattn_rload(part + k * CYATTN_RW);
    }
    for (p = 0; p < kb; p++) {
        float* row = panel + p * 24;
        CYATTN_RV v[3];
        for (k = 0; k < 3; k++)
            v[k] = cyattn_rsub(cyattn_rload(row + k * CYATTN_RW), sh[k]);
        cyattn_rexp_lock_n(v, 3);
        for (k = 0; k < 3; k++) {
            cyattn_rstore(row + k * CYATTN_RW, v[k]);
            acc[k] = cyattn_radd(acc[k], v[k]);
        }
    }
    for (k = 0; k < 3; k++)
        cyattn_rstore(part + k * CYATTN_RW, acc[k]);
}
#define CYATTN_REXP_STEP(v, x, vs) cyattn_rexp_nonpos_lock(v, x, vs)
#define CYATTN_REXP_GET(v, k, x, vs) ((v)[k])
#else
#define CYATTN_REXP_STEP(v, x, vs) ((void)(v))
#define CYATTN_REXP_GET(v, k, x, vs) cyattn_rexp_nonpos(cyattn_rload((x) + (k) * CYATTN_RW), vs)
#endif

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
        CYATTN_RV ev[CYATTN_RN];
        CYATTN_REXP_STEP(ev, x + j, vs);
        for (k = 0; k < CYATTN_RN; k++) {
            CYATTN_RV e = CYATTN_REXP_GET(ev, k, x + j, vs);
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
    CYATTN_RV acc[CYATTN_RN], ev[CYATTN_RN], vs = cyattn_rset1(m);
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
        CYATTN_REXP_STEP(ev, x + j, vs);
        for (k = 0; k < CYATTN_RN; k++) {
            CYATTN_RV e = CYATTN_REXP_GET(ev, k, x + j, vs);
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
   at each call, as log_out), the next row's max pass (its maxima and minima into hi[0] and
   lo[0]: only their values are used, so one vector each serves all 32 lanes; with 16 vector
   registers (AVX2) the four of each were spilled to the stack with the sums, a load and a
   store each per vector, and the rows ran 1.07-1.09x slower on Zen 5 as an AVX2 CPU; 512-bit
   rows unchanged) and the previous row's last pass (softmax: yp *= f; log_out: yp = (xp - mp)
   - f), each element by the operations of cyattn_softmax_row_f32's passes. */
CYATTN_INLINE void cyattn_rowp_step(const float* xi, float* yi, const float* xn, const float* xp,
                                    float* yp, ptrdiff_t n32, ptrdiff_t n, float m, float mp,
                                    float f, CYATTN_RV* acc, CYATTN_RV* hi, CYATTN_RV* lo,
                                    int next, int prev, int log_out) {
    CYATTN_RV vs = cyattn_rset1(m), vmp = cyattn_rset1(mp), vf = cyattn_rset1(f), ev[CYATTN_RN];
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
        CYATTN_REXP_STEP(ev, xi + j, vs);
        for (k = 0; k < CYATTN_RN; k++) {
            CYATTN_RV e = CYATTN_REXP_GET(ev, k, xi + j, vs);
            if (!log_out)
                cyattn_rstore(yi + j + k * CYATTN_RW, e);
            acc[k] = cyattn_radd(acc[k], e);
            if (next) {
                CYATTN_RV w = cyattn_rload(xn + j + k * CYATTN_RW);
                hi[0] = cyattn_rmax(w, hi[0]);
                lo[0] = cyattn_rmin(w, lo[0]);
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

/* The last pass of a streamed row, y[j] = e[j] * f (softmax: e the row's exp values) or
   y[j] = (e[j] - m) - f (log-softmax: e the row of x, f the log of the sum), the operations of
   cyattn_rowk_scale / cyattn_rowk_log element by element (so the same bits), with the
   CYATTN_RW-aligned middle of y written by non-temporal stores: no read for ownership of y's
   lines and no eviction of the caches' contents for an output that is not read back soon.
   The non-temporal stores cover whole 64-byte lines only: they start at the first line
   boundary of the row and end at the last one that a whole step of 32 elements reaches; the
   elements before and after take ordinary stores, so no line is written both ways (with
   256-bit stores from a 32-byte boundary, the lines shared with the ordinary stores of the
   row's ends ran the rows 2-6x slower than ordinary stores on Zen 5; 64-byte alignment,
   as 512-bit stores need anyway, fixes that). */
CYATTN_INLINE void cyattn_rowk_out_nt(const float* e, float* y, ptrdiff_t n, float m, float f,
                                      int log_out) {
    CYATTN_RV vm = cyattn_rset1(m), vf = cyattn_rset1(f);
    ptrdiff_t j = 0, head = (ptrdiff_t)((((uintptr_t)0 - (uintptr_t)y) % 64) / sizeof(float));
    int k;
    if (head > n)
        head = n;
    for (; j < head; j++)
        y[j] = log_out ? (e[j] - m) - f : e[j] * f;
    for (; j + 32 <= n; j += 32)
        for (k = 0; k < CYATTN_RN; k++) {
            CYATTN_RV v = cyattn_rload(e + j + k * CYATTN_RW);
            cyattn_rstream(y + j + k * CYATTN_RW,
                           log_out ? cyattn_rsub(cyattn_rsub(v, vm), vf) : cyattn_rmul(v, vf));
        }
    for (; j < n; j++)
        y[j] = log_out ? (e[j] - m) - f : e[j] * f;
}

CYATTN_INLINE ptrdiff_t cyattn_softmax_rows_f32_nt_impl(const float* x, float* y, float* s,
                                                        ptrdiff_t rows, ptrdiff_t n,
                                                        int log_out) {
    ptrdiff_t i;
    float m;
    for (i = 0; i < rows; i++) {
        const float* xi = x + i * n;
        float* yi = y + i * n;
        /* this row's scratch at yi's offset in its 4 KiB page (see cyattn_softmax_rows_f32_nt) */
        float* si = s + ((uintptr_t)yi % CYATTN_NT_PAGE) / sizeof(float);
        if (!cyattn_rowk_max(xi, n, NULL, &m))
            return i;
        if (log_out)
            cyattn_rowk_out_nt(xi, yi, n, m,
                               (float)log((double)cyattn_rowk_exp(xi, si, n, NULL, m, 0)), 1);
        else
            cyattn_rowk_out_nt(si, yi, n, 0.0f, 1.0f / cyattn_rowk_exp(xi, si, n, NULL, m, 1),
                               0);
    }
    return rows;
}

/* cyattn_softmax_rows_f32 for an output far larger than the caches (the caller's rule): each
   row by cyattn_softmax_row_f32's three passes, the same bits, but the exp values go to a
   scratch row (n floats, which stays in L1 or L2) instead of y, and the last pass writes y
   once, by non-temporal stores (cyattn_rowk_out_nt): y's bytes cross the memory bus once
   (a store that misses allocates the line first: read, then written back), and nothing is read
   back from it. Rows one after the other, not pipelined: past the caches the rows wait on
   memory, not on the exp pass's ports (Zen 5, rows of 2048, 1 thread: 95 % of np.copyto's
   bandwidth over the same bytes). Returns how many leading rows
   are done, as cyattn_softmax_rows_f32 does. The caller fences (cyattn_sfence) before the
   results are read by another thread. x and y may be the same array (each row of x is read in
   full before that row of y is written).

   s: CYATTN_NT_SCRATCH(n) floats from a CYATTN_NT_PAGE-byte boundary. Each row's scratch row
   starts in s at the offset that row of y has in its 4 KiB page, so that the last pass's
   stores to y never share the low 12 address bits with its next loads from the scratch row: a
   load that does waits for the store (4K aliasing). With the scratch row at a fixed place and
   the output 16 bytes past a page boundary (a large NumPy array's usual place), rows of 2048
   ran 1.14-1.23x slower on Zen 3 (1 thread, 16,384 rows, in a C harness) than with the
   scratch row placed so. */
static inline ptrdiff_t cyattn_softmax_rows_f32_nt(const float* x, float* y, float* s,
                                                   ptrdiff_t rows, ptrdiff_t n, int log_out) {
    return log_out ? cyattn_softmax_rows_f32_nt_impl(x, y, s, rows, n, 1)
                   : cyattn_softmax_rows_f32_nt_impl(x, y, s, rows, n, 0);
}
static inline void cyattn_sfence(void) {
#if defined(__aarch64__) || defined(_M_ARM64)
    /* the neon variant's cyattn_rstream is an ordinary store: nothing to order */
#else
    _mm_sfence();
#endif
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
static inline ptrdiff_t cyattn_softmax_rows_f32_nt(const float* x, float* y, float* s,
                                                   ptrdiff_t rows, ptrdiff_t n, int log_out) {
    (void)x; (void)y; (void)s; (void)rows; (void)n; (void)log_out;
    return 0;
}
static inline void cyattn_sfence(void) {
}
#endif

#ifndef CYATTN_HAVE_PANEL_EXP24     /* only the avx2 variant has it (CYATTN_RLOCK) */
#define CYATTN_HAVE_PANEL_EXP24 0
static inline void cyattn_panel_exp24_f32(float* panel, ptrdiff_t kb, const float* shift,
                                          float* part) {
    (void)panel; (void)kb; (void)shift; (void)part;
}
#endif

#endif /* CYATTN_SOFTMAX_ROWS_H */
