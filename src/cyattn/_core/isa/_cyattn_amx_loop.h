/*
 * The AMX tile loops, written once against the tile operations CYATTN_TL_CONFIG, _ZERO,
 * _LOAD, _STORE, _DP (TDPBF16PS) and _RELEASE, which _cyattn_amx.h defines twice before
 * including this file: over the portable model and over the instructions; CYATTN_AMX_FN names
 * each copy (_model, _hw). No include guard on purpose; the packing helpers, which use no
 * tile operation, are defined once (CYATTN_AMX_LOOP_SHARED); the end of the file undefines
 * the operations, so that the next copy defines its own.
 *
 * Tiles (palette 1, every tile 16 rows x 64 bytes): A tiles 0-1 (rows 0-15 and 16-31 of a
 * 32-row block, 32 k each), B tiles 2-3 (columns 0-15 and 16-31, 16 k pairs each), C tiles
 * 4-7 (the 2 x 2 block of 16 x 16 float32 results). Each 32 x 32 block of the output is
 * accumulated over all of K in its C tiles, 32 k per TDPBF16PS, k chunks in order; its bits
 * depend only on K (zero-padded to a multiple of 32), never on the tiling or the threads.
 */

#ifndef CYATTN_AMX_LOOP_SHARED
#define CYATTN_AMX_LOOP_SHARED

#define CYATTN_AMX_KB 32          /* k per tile product (16 pairs of bf16) */
#define CYATTN_AMX_BLOCK 32       /* rows and columns of the 2 x 2 block of C tiles */
#define CYATTN_AMX_CHUNK 1024     /* uint16 per packed k chunk of a 32-row A or 32-col B */

/* A[0:m_here, 0:K] (bf16 bits, strides in elements) into nk = ceil(K / 32) chunks of
   32 rows x 32 k, row-major (the two A tiles of a chunk: rows 0-15, then 16-31); rows past
   m_here and k past K are +0. */
static void cyattn_amx_pack_a(ptrdiff_t m_here, ptrdiff_t K, const uint16_t* a, ptrdiff_t rsa,
                              ptrdiff_t csa, uint16_t* dst) {
    ptrdiff_t nk = (K + CYATTN_AMX_KB - 1) / CYATTN_AMX_KB, kk, r, x, k0, kn;
    for (kk = 0; kk < nk; kk++) {
        uint16_t* d = dst + kk * CYATTN_AMX_CHUNK;
        k0 = kk * CYATTN_AMX_KB;
        kn = K - k0 < CYATTN_AMX_KB ? K - k0 : CYATTN_AMX_KB;
        for (r = 0; r < CYATTN_AMX_BLOCK; r++) {
            uint16_t* drow = d + r * CYATTN_AMX_KB;
            if (r < m_here) {
                const uint16_t* src = a + r * rsa + k0 * csa;
                if (csa == 1) {
                    memcpy(drow, src, (size_t)kn * 2);
                } else {
                    for (x = 0; x < kn; x++) drow[x] = src[x * csa];
                }
                for (x = kn; x < CYATTN_AMX_KB; x++) drow[x] = 0;
            } else {
                memset(drow, 0, CYATTN_AMX_KB * 2);
            }
        }
    }
}

/* B[0:K, 0:n_here] (bf16 bits) into nk chunks of the two B tiles: chunk kk, tile h (columns
   16h .. 16h + 15), row q holds the pairs (B[32kk + 2q, col], B[32kk + 2q + 1, col]) of its 16
   columns; k past K and columns past n_here are +0. */
static void cyattn_amx_pack_b(ptrdiff_t K, ptrdiff_t n_here, const uint16_t* b, ptrdiff_t rsb,
                              ptrdiff_t csb, uint16_t* dst) {
    ptrdiff_t nk = (K + CYATTN_AMX_KB - 1) / CYATTN_AMX_KB, kk, q, p, j, k;
    memset(dst, 0, (size_t)(nk * CYATTN_AMX_CHUNK) * 2);
    for (kk = 0; kk < nk; kk++) {
        for (q = 0; q < CYATTN_AMX_KB / 2; q++) {
            for (p = 0; p < 2; p++) {
                const uint16_t* src;
                k = kk * CYATTN_AMX_KB + 2 * q + p;
                if (k >= K) break;
                src = b + k * rsb;
                for (j = 0; j < n_here; j++)
                    dst[kk * CYATTN_AMX_CHUNK + (j / 16) * 512 + q * 32 + (j % 16) * 2 + p] =
                        src[j * csb];
            }
        }
    }
}

/* C[r, j] (+)= alpha * acc[r][j] for the m_here x n_here corner of a 32 x 32 block:
   fma(alpha, acc, C) in float32, one rounding, then once to bf16 where C holds bf16 bits
   (c_fmt = CYATTN_HALF_BF16); strides in elements. */
static void cyattn_amx_store_block(const float* acc, ptrdiff_t m_here, ptrdiff_t n_here,
                                   void* c, ptrdiff_t rsc, ptrdiff_t csc, float alpha, int c_fmt) {
    ptrdiff_t r, j;
    for (r = 0; r < m_here; r++) {
        const float* arow = acc + r * CYATTN_AMX_BLOCK;
        if (c_fmt == 0) {
            float* row = (float*)c + r * rsc;
            for (j = 0; j < n_here; j++) row[j * csc] = fmaf(alpha, arow[j], row[j * csc]);
        } else {
            uint16_t* row = (uint16_t*)c + r * rsc;
            for (j = 0; j < n_here; j++) {
                float v = fmaf(alpha, arow[j], cyattn_widen1(row, j * csc, c_fmt));
                cyattn_float_to_half(&v, row + j * csc, 1, c_fmt);
            }
        }
    }
}

/* dst[r * ld + x] = src[r * rs + x * cs] for r < rows, x < cols (bf16 bits), +0 elsewhere in
   rows_total rows of ld elements: K blocks (rows = keys, along E) and V^T blocks (rows = value
   columns, along keys) for the attention's tiles, which load them with a stride of ld. */
static void cyattn_amx_pack_rows(ptrdiff_t rows, ptrdiff_t cols, const uint16_t* src,
                                 ptrdiff_t rs, ptrdiff_t cs, ptrdiff_t rows_total, ptrdiff_t ld,
                                 uint16_t* dst) {
    ptrdiff_t r, x;
    for (r = 0; r < rows_total; r++) {
        uint16_t* d = dst + r * ld;
        if (r < rows) {
            const uint16_t* sr = src + r * rs;
            if (cs == 1) {
                memcpy(d, sr, (size_t)cols * 2);
            } else {
                for (x = 0; x < cols; x++) d[x] = sr[x * cs];
            }
            for (x = cols; x < ld; x++) d[x] = 0;
        } else {
            memset(d, 0, (size_t)ld * 2);
        }
    }
}

/* The weights P^T of a 32-lane panel (p_pairs[q * 32 + j]: keys 2q and 2q + 1 of lane j, key
   2q in the HIGH half, as bf16_panel_softmax writes them for vdpbf16ps) into nkc chunks of
   the two B tiles of TDPBF16PS (lanes 0-15, 16-31; row q of a chunk: the pairs of its 16
   lanes, key 2q in the LOW half); pairs past kpn are +0. */
static void cyattn_amx_pack_pt(const uint32_t* p_pairs, ptrdiff_t kpn, ptrdiff_t nkc,
                               uint32_t* dst) {
    ptrdiff_t c, h, qq, jj, q;
    for (c = 0; c < nkc; c++)
        for (h = 0; h < 2; h++)
            for (qq = 0; qq < 16; qq++) {
                uint32_t* d = dst + c * 512 + h * 256 + qq * 16;
                q = 16 * c + qq;
                for (jj = 0; jj < 16; jj++) {
                    uint32_t w = q < kpn ? p_pairs[q * 32 + 16 * h + jj] : 0u;
                    d[jj] = (w >> 16) | (w << 16);
                }
            }
}

/* One k step of the 2 x 2 block of C tiles (4-7): A tiles 0-1 from a0 and a1 (row stride sa
   bytes), B tiles 2-3 from b0 and b1 (64-byte rows), four tile products. Built from the
   CYATTN_TL_* operations of whichever copy of the loops expands it. */
#define CYATTN_AMX_STEP_2X2(a0, a1, sa, b0, b1) do { \
        CYATTN_TL_LOAD(0, (a0), (sa)); \
        CYATTN_TL_LOAD(1, (a1), (sa)); \
        CYATTN_TL_LOAD(2, (b0), 64); \
        CYATTN_TL_LOAD(3, (b1), 64); \
        CYATTN_TL_DP(4, 0, 2); \
        CYATTN_TL_DP(5, 0, 3); \
        CYATTN_TL_DP(6, 1, 2); \
        CYATTN_TL_DP(7, 1, 3); \
    } while (0)

#endif /* CYATTN_AMX_LOOP_SHARED */

/* One TDPBF16PS on 16 x 64-byte tiles: out = c0 + a @ b (a, b: 16 x 32 bf16 in the tile
   layout; c0, out: 16 x 16 float32 bits). The probe the golden data is checked with. */
static void CYATTN_AMX_FN(cyattn_amx_tile_product)(const uint16_t* a, const uint16_t* b,
                                                   const uint32_t* c0, uint32_t* out) {
    cyattn_amx_cfg cfg;
    CYATTN_TL_DECLARE;
    cyattn_amx_cfg_uniform(&cfg, 16, 64);
    CYATTN_TL_CONFIG(&cfg);
    CYATTN_TL_LOAD(4, c0, 64);
    CYATTN_TL_LOAD(0, a, 64);
    CYATTN_TL_LOAD(2, b, 64);
    CYATTN_TL_DP(4, 0, 2);
    CYATTN_TL_STORE(4, out, 64);
    CYATTN_TL_RELEASE();
}

/* C[0:M, 0:n_here] (+)= alpha * A[0:M, 0:K] @ B-panel, n_here <= 32: pb is the B panel packed
   by cyattn_amx_pack_b (nk chunks), abuf room for nk chunks of A; one 32 x 32 block of C
   tiles at a time, A packed per 32-row block. The tile configuration is loaded when the
   panel starts and released when it ends. */
static void CYATTN_AMX_FN(cyattn_amx_gemm_panel)(ptrdiff_t M, ptrdiff_t K, const uint16_t* a,
                                                 ptrdiff_t rsa, ptrdiff_t csa,
                                                 const uint16_t* pb, uint16_t* abuf, void* c,
                                                 ptrdiff_t rsc, ptrdiff_t csc, ptrdiff_t n_here,
                                                 float alpha, int c_fmt) {
    ptrdiff_t nk = (K + CYATTN_AMX_KB - 1) / CYATTN_AMX_KB, i0, kk, m_here;
    ptrdiff_t esz = c_fmt ? 2 : 4;
    float acc[CYATTN_AMX_BLOCK * CYATTN_AMX_BLOCK];
    cyattn_amx_cfg cfg;
    CYATTN_TL_DECLARE;
    if (M <= 0 || n_here <= 0 || K <= 0) return;
    cyattn_amx_cfg_uniform(&cfg, 16, 64);
    CYATTN_TL_CONFIG(&cfg);
    for (i0 = 0; i0 < M; i0 += CYATTN_AMX_BLOCK) {
        m_here = M - i0 < CYATTN_AMX_BLOCK ? M - i0 : CYATTN_AMX_BLOCK;
        cyattn_amx_pack_a(m_here, K, a + i0 * rsa, rsa, csa, abuf);
        CYATTN_TL_ZERO(4);
        CYATTN_TL_ZERO(5);
        CYATTN_TL_ZERO(6);
        CYATTN_TL_ZERO(7);
        for (kk = 0; kk < nk; kk++) {
            const uint16_t* ak = abuf + kk * CYATTN_AMX_CHUNK;
            const uint16_t* bk = pb + kk * CYATTN_AMX_CHUNK;
            CYATTN_AMX_STEP_2X2(ak, ak + 512, 64, bk, bk + 512);
        }
        CYATTN_TL_STORE(4, acc, 128);
        CYATTN_TL_STORE(5, acc + 16, 128);
        CYATTN_TL_STORE(6, acc + 512, 128);
        CYATTN_TL_STORE(7, acc + 528, 128);
        cyattn_amx_store_block(acc, m_here, n_here, (char*)c + i0 * rsc * esz, rsc, csc, alpha,
                               c_fmt);
    }
    CYATTN_TL_RELEASE();
}


/* The tile state of a worker that runs several tile loops in a row (the attention): loaded
   once when the worker starts its tile work and released when it ends; the model keeps it in
   *ctx (ignored by the hardware). */
static void CYATTN_AMX_FN(cyattn_amx_begin)(cyattn_amx_model* ctx) {
    cyattn_amx_cfg cfg;
    CYATTN_TL_USE(ctx);
    cyattn_amx_cfg_uniform(&cfg, 16, 64);
    CYATTN_TL_CONFIG(&cfg);
}

static void CYATTN_AMX_FN(cyattn_amx_end)(cyattn_amx_model* ctx) {
    CYATTN_TL_USE(ctx);
    CYATTN_TL_RELEASE();
}

/* Attention scores on tiles, S^T = K Q^T unscaled: keys k0 .. k0 + 32 nkc of a K block packed
   by cyattn_amx_pack_rows (rows = keys, ld_k >= 32 ne elements, E zero-padded) against a
   32-lane Q^T panel packed by cyattn_amx_pack_b (ne chunks of 32 along E); written to
   tile[key * 32 + lane] for those keys. Inside cyattn_amx_begin / _end. */
static void CYATTN_AMX_FN(cyattn_amx_scores)(cyattn_amx_model* ctx, const uint16_t* kbuf,
                                             ptrdiff_t ld_k, ptrdiff_t ne, const uint16_t* qt,
                                             ptrdiff_t k0, ptrdiff_t nkc, float* tile) {
    ptrdiff_t c, e;
    CYATTN_TL_USE(ctx);
    for (c = 0; c < nkc; c++) {
        const uint16_t* kr = kbuf + (k0 + CYATTN_AMX_BLOCK * c) * ld_k;
        float* o = tile + (k0 + CYATTN_AMX_BLOCK * c) * CYATTN_AMX_BLOCK;
        CYATTN_TL_ZERO(4);
        CYATTN_TL_ZERO(5);
        CYATTN_TL_ZERO(6);
        CYATTN_TL_ZERO(7);
        for (e = 0; e < ne; e++) {
            CYATTN_AMX_STEP_2X2(kr + e * CYATTN_AMX_KB, kr + 16 * ld_k + e * CYATTN_AMX_KB, ld_k * 2, qt + e * CYATTN_AMX_CHUNK, qt + e * CYATTN_AMX_CHUNK + 512);
        }
        CYATTN_TL_STORE(4, o, 128);
        CYATTN_TL_STORE(5, o + 16, 128);
        CYATTN_TL_STORE(6, o + 512, 128);
        CYATTN_TL_STORE(7, o + 528, 128);
    }
}

/* O^T += V^T P^T on tiles for the 32 lanes of a panel: ot (row e: value column e, ld_o floats
   per row, rows up to Ev rounded up to 32 allocated) is loaded into the C tiles, the keys
   k0 .. k0 + 32 nkc of V^T (packed by cyattn_amx_pack_rows: rows = value columns, ld_v
   elements, zero past the block) times the weights (cyattn_amx_pack_pt) added, 32 keys per
   tile product, and stored back. Inside cyattn_amx_begin / _end. */
static void CYATTN_AMX_FN(cyattn_amx_pv)(cyattn_amx_model* ctx, const uint16_t* vt,
                                         ptrdiff_t ld_v, ptrdiff_t Ev, ptrdiff_t k0,
                                         ptrdiff_t nkc, const uint32_t* pt, float* ot,
                                         ptrdiff_t ld_o) {
    ptrdiff_t e0, c;
    CYATTN_TL_USE(ctx);
    for (e0 = 0; e0 < Ev; e0 += CYATTN_AMX_BLOCK) {
        float* o0 = ot + e0 * ld_o;
        float* o1 = ot + (e0 + 16) * ld_o;
        const uint16_t* v0 = vt + e0 * ld_v + k0;
        CYATTN_TL_LOAD(4, o0, ld_o * 4);
        CYATTN_TL_LOAD(5, o0 + 16, ld_o * 4);
        CYATTN_TL_LOAD(6, o1, ld_o * 4);
        CYATTN_TL_LOAD(7, o1 + 16, ld_o * 4);
        for (c = 0; c < nkc; c++) {
            CYATTN_AMX_STEP_2X2(v0 + CYATTN_AMX_BLOCK * c, v0 + 16 * ld_v + CYATTN_AMX_BLOCK * c, ld_v * 2, pt + c * 512, pt + c * 512 + 256);
        }
        CYATTN_TL_STORE(4, o0, ld_o * 4);
        CYATTN_TL_STORE(5, o0 + 16, ld_o * 4);
        CYATTN_TL_STORE(6, o1, ld_o * 4);
        CYATTN_TL_STORE(7, o1 + 16, ld_o * 4);
    }
}

#undef CYATTN_AMX_FN
#undef CYATTN_TL_DECLARE
#undef CYATTN_TL_USE
#undef CYATTN_TL_CONFIG
#undef CYATTN_TL_ZERO
#undef CYATTN_TL_LOAD
#undef CYATTN_TL_STORE
#undef CYATTN_TL_DP
#undef CYATTN_TL_RELEASE
#undef CYATTN_AMX_BARRIER
