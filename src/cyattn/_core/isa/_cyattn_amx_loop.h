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
 * Decode (cyattn_amx_dec_*): A tile 0 and C tiles 4-5 of m <= 16 rows (a task's query rows),
 * B tiles 2-3 of 16 pair rows; S = Q K^T and O += P V, 32 keys per block.
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

/* Decode on tiles (_attention_decode_amx.pxi): a task's query rows (at most 16: the query
   heads of a K/V group times L) are the tiles' rows; Q and P are A tiles, K^T (pairs along
   E) and V (pairs along keys) B tiles. */
#define CYATTN_AMX_DEC_ROWS 16    /* query rows of a decode task, at most (one A tile) */
#define CYATTN_AMX_ACHUNK 512     /* uint16 of an A chunk: 16 rows x 32 k */

/* One query row (E bf16 elements, column stride cs) into its row of ne = ceil(E / 32) A
   chunks (dst: the first chunk's row, chunks CYATTN_AMX_ACHUNK apart, rows 32 apart);
   elements past E are +0. */
static void cyattn_amx_pack_arow(ptrdiff_t E, const uint16_t* src, ptrdiff_t cs,
                                 uint16_t* dst) {
    ptrdiff_t ne = (E + CYATTN_AMX_KB - 1) / CYATTN_AMX_KB, c, x, e;
    for (c = 0; c < ne; c++) {
        uint16_t* d = dst + c * CYATTN_AMX_ACHUNK;
        for (x = 0; x < CYATTN_AMX_KB; x++) {
            e = CYATTN_AMX_KB * c + x;
            d[x] = e < E ? src[e * cs] : 0;
        }
    }
}

/* Keys lo .. hi - 1 of a block of 32 keys (k: key lo's row; rows rs, elements cs apart, E
   elements) into ne chunks of the two B tiles of S = Q K^T: chunk c, tile h (keys 16h ..
   16h + 15), row q holds the pairs (K[key, 32c + 2q], K[key, 32c + 2q + 1]) of its 16 keys.
   Keys of the block outside lo .. hi - 1 and elements past E are +0: those keys are never
   read. */
static void cyattn_amx_pack_kblock(ptrdiff_t E, ptrdiff_t lo, ptrdiff_t hi, const uint16_t* k,
                                   ptrdiff_t rs, ptrdiff_t cs, uint16_t* dst) {
    ptrdiff_t ne = (E + CYATTN_AMX_KB - 1) / CYATTN_AMX_KB, j, e;
    memset(dst, 0, (size_t)(ne * CYATTN_AMX_CHUNK) * 2);
    for (j = lo; j < hi; j++) {
        const uint16_t* row = k + (j - lo) * rs;
        uint16_t* d = dst + (j >> 4) * 512 + ((j & 15) << 1);
        if (cs == 1) {
            for (e = 0; e < E; e++)
                d[(e >> 5) * CYATTN_AMX_CHUNK + ((e & 31) >> 1) * 32 + (e & 1)] = row[e];
        } else {
            for (e = 0; e < E; e++)
                d[(e >> 5) * CYATTN_AMX_CHUNK + ((e & 31) >> 1) * 32 + (e & 1)] = row[e * cs];
        }
    }
}

/* Keys lo .. hi - 1 of a block of 32 keys (v: key lo's row; Ev elements) into ncg B tiles of
   O += P V: tile c (value columns 16c .. 16c + 15), row q holds the pairs (V[2q, col],
   V[2q + 1, col]) of its 16 columns. Other keys, and columns past Ev, are +0. */
static void cyattn_amx_pack_vblock(ptrdiff_t Ev, ptrdiff_t ncg, ptrdiff_t lo, ptrdiff_t hi,
                                   const uint16_t* v, ptrdiff_t rs, ptrdiff_t cs,
                                   uint16_t* dst) {
    ptrdiff_t j, n;
    memset(dst, 0, (size_t)(ncg * 512) * 2);
    for (j = lo; j < hi; j++) {
        const uint16_t* row = v + (j - lo) * rs;
        uint16_t* d = dst + (j >> 1) * 32 + (j & 1);
        if (cs == 1) {
            for (n = 0; n < Ev; n++) d[(n >> 4) * 512 + ((n & 15) << 1)] = row[n];
        } else {
            for (n = 0; n < Ev; n++) d[(n >> 4) * 512 + ((n & 15) << 1)] = row[n * cs];
        }
    }
}

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

/* Decode on tiles: the tile configuration of a worker whose tasks have m <= 16 query rows
   (the A tile 0 and the C tiles 4-5 of m rows, the B tiles 2-3 of 16 pair rows), loaded
   once when the worker starts; released by cyattn_amx_end. */
static void CYATTN_AMX_FN(cyattn_amx_dec_begin)(cyattn_amx_model* ctx, int m) {
    cyattn_amx_cfg cfg;
    CYATTN_TL_USE(ctx);
    cyattn_amx_cfg_uniform(&cfg, 16, 64);
    cfg.rows[0] = (uint8_t)m;
    cfg.rows[4] = (uint8_t)m;
    cfg.rows[5] = (uint8_t)m;
    CYATTN_TL_CONFIG(&cfg);
}

/* S[0:m, 0:32] = Q K^T for one block of 32 keys, unscaled: qa the task's query rows packed
   by cyattn_amx_pack_arow (ne chunks), kt the block packed by cyattn_amx_pack_kblock; E in
   chunks of 32 in order, keys 0-15 and 16-31 in C tiles 4 and 5, stored to s (row stride
   ld_s floats). Inside cyattn_amx_dec_begin / cyattn_amx_end. */
static void CYATTN_AMX_FN(cyattn_amx_dec_scores)(cyattn_amx_model* ctx, const uint16_t* qa,
                                                 ptrdiff_t ne, const uint16_t* kt, float* s,
                                                 ptrdiff_t ld_s) {
    ptrdiff_t e;
    CYATTN_TL_USE(ctx);
    CYATTN_TL_ZERO(4);
    CYATTN_TL_ZERO(5);
    for (e = 0; e < ne; e++) {
        CYATTN_TL_LOAD(0, qa + e * CYATTN_AMX_ACHUNK, 64);
        CYATTN_TL_LOAD(2, kt + e * CYATTN_AMX_CHUNK, 64);
        CYATTN_TL_LOAD(3, kt + e * CYATTN_AMX_CHUNK + 512, 64);
        CYATTN_TL_DP(4, 0, 2);
        CYATTN_TL_DP(5, 0, 3);
    }
    CYATTN_TL_STORE(4, s, ld_s * 4);
    CYATTN_TL_STORE(5, s + 16, ld_s * 4);
}

/* acc[0:m, 0:16 ncg] += P[0:m, 32 keys] V[32 keys, 0:16 ncg] for one block of 32 keys: p the
   block's weights (bf16 bits, row stride ld_p elements: the A tile's pairs along keys), vb
   the block packed by cyattn_amx_pack_vblock (ncg even), acc row stride ld_acc floats; the
   accumulators pass through C tiles 4-5, 32 columns at a time. Inside cyattn_amx_dec_begin /
   cyattn_amx_end. */
static void CYATTN_AMX_FN(cyattn_amx_dec_pv)(cyattn_amx_model* ctx, const uint16_t* p,
                                             ptrdiff_t ld_p, const uint16_t* vb, ptrdiff_t ncg,
                                             float* acc, ptrdiff_t ld_acc) {
    ptrdiff_t c;
    CYATTN_TL_USE(ctx);
    CYATTN_TL_LOAD(0, p, ld_p * 2);
    for (c = 0; c < ncg; c += 2) {
        CYATTN_TL_LOAD(4, acc + 16 * c, ld_acc * 4);
        CYATTN_TL_LOAD(5, acc + 16 * c + 16, ld_acc * 4);
        CYATTN_TL_LOAD(2, vb + c * 512, 64);
        CYATTN_TL_LOAD(3, vb + c * 512 + 512, 64);
        CYATTN_TL_DP(4, 0, 2);
        CYATTN_TL_DP(5, 0, 3);
        CYATTN_TL_STORE(4, acc + 16 * c, ld_acc * 4);
        CYATTN_TL_STORE(5, acc + 16 * c + 16, ld_acc * 4);
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
