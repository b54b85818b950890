# GEMM: C (+)= alpha * A @ B on packed panels -- packing, the micro-kernels and the drivers
# behind cyattn.matmul_accumulate; the fused attention reuses the packing and micro-kernels.
#
# Design
# ------
# * GEMM (C (+)= alpha A B): BLIS-style. Loops NC -> KC -> MC -> NR -> MR; B is packed into
#   NR-column panels and A into MR-row panels (zero padded at the edges), which also makes any
#   input strides cheap. The micro-kernel keeps an MR x NR accumulator tile in a local array
#   indexed by constant-bound loops; its innermost loop has NR > 16 trips so that gcc vectorises
#   it instead of fully unrolling it. Tiles (float32 / float64): baseline and avx2 4 x 24 / 2 x 24
#   (PERF-NOTES; 2 x 24 the best of 4x12, 2x24, 6x8, 8x8), avx512 8 x 32 / 8 x 24 (16 and 24 of
#   the 32 zmm registers; 8 x 32 measured against 12 x 32, 8 x 48 and 14 x 32 here). KC = 256.
#   The A-panel index must stay a compile-time multiple of MR: a runtime stride there cost the
#   float32 kernel 60 % (measured). Every element of C is summed over K in the same order
#   whatever the tiling, so results are bit-identical for any number of threads. matmul
#   splits its output into tiles only as far as threads need (matmul_tiles): each tile packs
#   its own B, and tiles of MC rows repacked B once per 144 rows (13 % of an n=1024 product).
#   The micro-kernel prefetches every cache line of its C tile on entry (+4-8 % at n >= 1024),
#   and, where the variant sets B_PREFETCH (avx512), B one panel depth (256 k steps) ahead as
#   it goes, which is the next packed panel: a few-row product against B from memory read it
#   at 13 GB/s without, 20 with (Zen 5; 64 and 128 steps ahead gave 16 and 18; hot products
#   unchanged). The 4 x 24 tile (avx2, baseline) does not: its k step is 3 loads, 4
#   broadcasts and 12 FMAs, and two more load-port operations per step cost a Zen 3 host
#   10-11 % in matmul (issue 38, 8d80475 against 2910a57); that variant packs B per product
#   for few rows anyway (SMALL_B_ROWS = 0). A B used for many products can be
#   packed once, whole (pack_b_whole: the sentence encoder's weights, cyattn.matmul._PackedB),
#   and gemm_block then reads its panels in place: 1.3-1.5x on the encoder's 24 weight
#   products of 12-20 rows, where packing per call cost more than the product.
#   Products up to SMALL_MNK with row-major A and B and K <= KC skip packing (gemm_small), and
#   so do products of at most SMALL_B_ROWS rows with a B of at most SMALL_B_BYTES (K in KC
#   blocks; the avx512 variant only, where packing B cost more than such a product: 1.5-2.8x
#   at 1-4 rows, 1.1-1.6x at 8-24 rows of B from memory): a
#   DMR x DNR micro-kernel reads A's rows and B's rows in place (4 rows keep the row pointers
#   in registers; 8 spilled them), with the same multiply-adds in the same order, so the same
#   bits. Packing was a third of an n=64 product.
# * The avx2 variant runs the 4 x 24 micro-kernel's k steps after the first in C
#   (cyattn_kloop4x24_f32, isa/_cyattn_vec_avx2.h), inlined, the loop started on a 64-byte
#   boundary: compiled here, the loop's place moved with unrelated code, and where it
#   straddled three 64-byte fetch windows instead of two SDPA (8,8,128,64) ran 1-8 % slower
#   on Zen 3 (bench/results/x86_peers.md, sixth and seventh sessions).

cdef inline void transpose_8x8(const floating* a, Py_ssize_t rsa, floating* dst,
                               Py_ssize_t ldd) noexcept nogil:
    """dst[q * ldd + i] = a[i * rsa + q] for i, q < 8.

    Whole rows in (memcpy), a transpose between two local tiles with constant trip counts,
    whole rows out: gcc turns this into vector loads, permutes and stores (written as plain
    element loops it gathers element by element). The element-by-element transposing packs
    were a fifth of a short attention call's time."""
    cdef floating t[8][8]
    cdef floating u[8][8]
    cdef Py_ssize_t i, q
    if floating is float and CYATTN_HAVE_TRANSPOSE:     # AVX, NEON: _cyattn_transpose.h
        cyattn_transpose_8x8_f32(a, rsa, dst, ldd)
        return
    for i in range(8):
        memcpy(&t[i][0], a + i * rsa, 8 * sizeof(floating))
    for q in range(8):
        for i in range(8):
            u[q][i] = t[i][q]
    for q in range(8):
        memcpy(dst + q * ldd, &u[q][0], 8 * sizeof(floating))


cdef inline void transpose_4x8(const floating* a, Py_ssize_t rsa, floating* dst,
                               Py_ssize_t ldd) noexcept nogil:
    """dst[q * ldd + i] = a[i * rsa + q] for i < 4, q < 8 (as transpose_8x8)."""
    cdef floating t[4][8]
    cdef floating u[8][4]
    cdef Py_ssize_t i, q
    if floating is float and CYATTN_HAVE_TRANSPOSE:
        cyattn_transpose_4x8_f32(a, rsa, dst, ldd)
        return
    for i in range(4):
        memcpy(&t[i][0], a + i * rsa, 8 * sizeof(floating))
    for q in range(8):
        for i in range(4):
            u[q][i] = t[i][q]
    for q in range(8):
        memcpy(dst + q * ldd, &u[q][0], 4 * sizeof(floating))


cdef void pack_a(Py_ssize_t mc, Py_ssize_t kc, const floating* a, Py_ssize_t rsa, Py_ssize_t csa,
                 floating* dst, Py_ssize_t mr) noexcept nogil:
    """A[0:mc, 0:kc] into mr-row panels: dst[panel][p][i], rows past mc zero.

    The loop order follows the unit stride of A (rows of a row-major A are read contiguously).
    """
    cdef Py_ssize_t ir = 0, p, i, m_here, p8, full, jr, p0, p1
    cdef Py_ssize_t tile_mr = MR if floating is float else MRD
    cdef const floating* src
    if rsa == 1 and csa != 1 and mc >= mr and mr == tile_mr:
        # Column-major A (V^T of a row-major V): each column of A is contiguous, so copy
        # columns into every full panel. Walking one panel down all kc columns read A in
        # mr-element pieces a whole row of V apart (6 % of a short attention call). Column by
        # column over every panel wrote 16 streams at once (with kc = 128 and mr = 4 they start
        # 2 KiB apart, so they share two L1 sets); a block of PACK_COLS columns at a time
        # writes each panel's piece of the block whole (64 floats with mr = 4) and reads the
        # block (16 rows of V) from L1: pack_a 6.6 -> 5.5 % of an SDPA (8,8,128,64) call's
        # samples on Zen 3, matmul with a column-major A level or faster.
        full = mc - mc % mr
        p0 = 0
        while p0 < kc:
            p1 = p0 + PACK_COLS if p0 + PACK_COLS < kc else kc
            jr = 0
            while jr < full:
                for p in range(p0, p1):
                    # memcpy of a constant size: one or two vector moves (an element loop
                    # stayed scalar, as gcc could not rule out that dst and src overlap)
                    if floating is float:
                        memcpy(dst + jr * kc + p * MR, a + p * csa + jr, MR * sizeof(float))
                    else:
                        memcpy(dst + jr * kc + p * MRD, a + p * csa + jr, MRD * sizeof(double))
                jr += mr
            p0 = p1
        if full == mc:
            return
        ir = full
        dst += full * kc
    while ir < mc:
        m_here = mc - ir if mc - ir < mr else mr
        if csa == 1 and m_here == mr and (mr == 8 or mr == 4):
            p8 = kc - kc % 8
            if mr == 8:
                for p in range(0, p8, 8):
                    transpose_8x8(a + ir * rsa + p, rsa, dst + p * 8, 8)
            else:
                for p in range(0, p8, 8):
                    transpose_4x8(a + ir * rsa + p, rsa, dst + p * 4, 4)
            for i in range(mr):
                src = a + (ir + i) * rsa
                for p in range(p8, kc):
                    dst[p * mr + i] = src[p]
        elif csa == 1:
            for i in range(m_here):
                src = a + (ir + i) * rsa
                for p in range(kc):
                    dst[p * mr + i] = src[p]
            for i in range(m_here, mr):
                for p in range(kc):
                    dst[p * mr + i] = 0
        else:
            for p in range(kc):
                src = a + ir * rsa + p * csa
                for i in range(m_here):
                    dst[p * mr + i] = src[i * rsa]
                for i in range(m_here, mr):
                    dst[p * mr + i] = 0
        dst += mr * kc
        ir += mr


cdef void pack_b(Py_ssize_t kc, Py_ssize_t nc, const floating* b, Py_ssize_t rsb, Py_ssize_t csb,
                 floating* dst, Py_ssize_t nr) noexcept nogil:
    """B[0:kc, 0:nc] into nr-column panels: dst[panel][p][j], columns past nc zero.

    The loop order follows the unit stride of B: rows are copied when B is row-major, columns
    when it is column-major (as K^T is for the attention scores).
    """
    cdef Py_ssize_t jr = 0, p, j, n_here, p8, jb, p0, p1, full
    cdef const floating* src
    if csb == 1 and rsb != 1:
        # Row-major B: a block of 8 rows at a time, every full panel's 8 x nr piece in turn.
        # Each row is read front to back and each panel piece is written contiguously; walking
        # one panel down all kc rows instead reads B one cache line per 4 KiB page.
        full = nc - nc % nr
        for p0 in range(0, kc, 8):
            p1 = p0 + 8 if p0 + 8 < kc else kc
            jr = 0
            while jr < full:
                for p in range(p0, p1):
                    memcpy(dst + jr * kc + p * nr, b + p * rsb + jr, nr * sizeof(floating))
                jr += nr
        if full == nc:
            return
        jr = full
        dst += full * kc
    while jr < nc:
        n_here = nc - jr if nc - jr < nr else nr
        if rsb == 1 and csb != 1 and n_here == nr and nr % 4 == 0:
            # 8 x 8 transposes, and a 4 x 8 one for the last 4 columns of a panel of 12 (neon)
            p8 = kc - kc % 8
            for jb in range(0, nr - nr % 8, 8):
                for p in range(0, p8, 8):
                    transpose_8x8(b + (jr + jb) * csb + p, csb, dst + p * nr + jb, nr)
            if nr % 8:
                jb = nr - 4
                for p in range(0, p8, 8):
                    transpose_4x8(b + (jr + jb) * csb + p, csb, dst + p * nr + jb, nr)
            for j in range(nr):
                src = b + (jr + j) * csb
                for p in range(p8, kc):
                    dst[p * nr + j] = src[p]
        elif rsb == 1 and csb != 1:
            for j in range(n_here):
                src = b + (jr + j) * csb
                for p in range(kc):
                    dst[p * nr + j] = src[p]
            for j in range(n_here, nr):
                for p in range(kc):
                    dst[p * nr + j] = 0
        else:
            for p in range(kc):
                src = b + p * rsb + jr * csb
                if csb == 1 and n_here == nr:
                    memcpy(dst + p * nr, src, nr * sizeof(floating))
                else:
                    for j in range(n_here):
                        dst[p * nr + j] = src[j * csb]
                    for j in range(n_here, nr):
                        dst[p * nr + j] = 0
        dst += nr * kc
        jr += nr


cdef void widen_block(const uint16_t* src, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t rs,
                      Py_ssize_t cs, int fmt, float* dst) noexcept nogil:
    """dst (rows x cols, row-major) = the 16-bit elements src[i * rs + j * cs] widened to
    float32 (fmt: CYATTN_HALF_F16 or CYATTN_HALF_BF16)."""
    cdef Py_ssize_t i, j
    for i in range(rows):
        if cs == 1:
            cyattn_half_to_float(src + i * rs, dst + i * cols, cols, fmt)
        else:
            for j in range(cols):
                cyattn_half_to_float(src + i * rs + j * cs, dst + i * cols + j, 1, fmt)


cdef void narrow_block(const float* src, Py_ssize_t rows, Py_ssize_t cols, uint16_t* dst,
                       Py_ssize_t rs, Py_ssize_t cs, int fmt) noexcept nogil:
    """dst[i * rs + j * cs] = src (rows x cols, row-major) rounded once, to nearest even, to the
    16-bit format fmt (the inverse of widen_block)."""
    cdef Py_ssize_t i, j
    for i in range(rows):
        if cs == 1:
            cyattn_float_to_half(src + i * cols, dst + i * rs, cols, fmt)
        else:
            for j in range(cols):
                cyattn_float_to_half(src + i * cols + j, dst + i * rs + j * cs, 1, fmt)


cdef void pack_a_half(Py_ssize_t mc, Py_ssize_t kc, const uint16_t* a, Py_ssize_t rsa,
                      Py_ssize_t csa, int fmt, float* dst, float* stage) noexcept nogil:
    """pack_a(mc, kc, A, rsa, csa, dst, MR) for an A of 16-bit elements: each MR-row panel is
    widened into ``stage`` (MR x kc floats, row-major) and packed from there. The widening is
    exact, so the panels are those of the float32 A with the same values."""
    cdef Py_ssize_t ir = 0, m_here
    while ir < mc:
        m_here = mc - ir if mc - ir < MR else MR
        widen_block(a + ir * rsa, m_here, kc, rsa, csa, fmt, stage)
        pack_a(m_here, kc, stage, kc, 1, dst + ir * kc, MR)
        ir += MR


cdef void pack_b_half(Py_ssize_t kc, Py_ssize_t nc, const uint16_t* b, Py_ssize_t rsb,
                      Py_ssize_t csb, int fmt, float* dst, float* stage) noexcept nogil:
    """pack_b(kc, nc, B, rsb, csb, dst, NR) for a B of 16-bit elements. A full NR-column panel
    is laid out as a row-major kc x NR block, so it is widened straight into place; the last,
    partial one is widened into ``stage`` (kc x NR floats) and packed (zero padded) from there."""
    cdef Py_ssize_t jr = 0, n_here
    while jr < nc:
        n_here = nc - jr if nc - jr < NR else NR
        if n_here == NR:
            widen_block(b + jr * csb, kc, NR, rsb, csb, fmt, dst + jr * kc)
        else:
            widen_block(b + jr * csb, kc, n_here, rsb, csb, fmt, stage)
            pack_b(kc, n_here, stage, n_here, 1, dst + jr * kc, NR)
        jr += NR


cdef inline void pack_a_at(Py_ssize_t mc, Py_ssize_t kc, const floating* a, Py_ssize_t at,
                           Py_ssize_t rsa, Py_ssize_t csa, int fmt, floating* dst,
                           floating* stage) noexcept nogil:
    """pack_a of the block that starts ``at`` elements into ``a``; with fmt != 0 (float32
    compute only) ``a`` points to 16-bit elements of that format."""
    if floating is float:
        if fmt != 0:
            pack_a_half(mc, kc, <const uint16_t*>a + at, rsa, csa, fmt, dst, stage)
        else:
            pack_a(mc, kc, a + at, rsa, csa, dst, MR)
    else:
        pack_a(mc, kc, a + at, rsa, csa, dst, MRD)


cdef inline void pack_b_at(Py_ssize_t kc, Py_ssize_t nc, const floating* b, Py_ssize_t at,
                           Py_ssize_t rsb, Py_ssize_t csb, int fmt, floating* dst,
                           floating* stage) noexcept nogil:
    """pack_b of the block that starts ``at`` elements into ``b`` (fmt as in pack_a_at)."""
    if floating is float:
        if fmt != 0:
            pack_b_half(kc, nc, <const uint16_t*>b + at, rsb, csb, fmt, dst, stage)
        else:
            pack_b(kc, nc, b + at, rsb, csb, dst, NR)
    else:
        pack_b(kc, nc, b + at, rsb, csb, dst, NRD)


cdef void micro_kernel_f32(Py_ssize_t kc, const float* pa, const float* pb,
                           float* c, Py_ssize_t rsc, Py_ssize_t csc,
                           Py_ssize_t m_here, Py_ssize_t n_here, float alpha,
                           bint overwrite) noexcept nogil:
    """C[0:m_here, 0:n_here] (+)= alpha * (A panel @ B panel) over kc steps (MR x NR tile)."""
    cdef float acc[MR][NR]
    cdef Py_ssize_t p, i, j
    cdef float a_i
    cdef float zero = 0
    cdef float* c_row
    # C is read and written after the k loop: prefetch every cache line of the tile's rows
    # when accumulating into it (+4-8 % on large products), only each row's first otherwise
    if overwrite or csc != 1:
        for i in range(MR):
            cyattn_prefetch_w(c + i * rsc)
    else:
        for i in range(MR):
            for j in range(0, NR, 16):
                cyattn_prefetch_w(c + i * rsc + j)
            cyattn_prefetch_w(c + i * rsc + NR - 1)
    if kc <= 0:                 # (no caller passes it) C = 0, or C unchanged
        if overwrite:
            for i in range(m_here):
                for j in range(n_here):
                    c[i * rsc + j * csc] = 0
        return
    if CYATTN_NEON_TILE:
        # the neon variant's 8 x 12 tile in registers (isa/_cyattn_vec_neon.h), the same sums
        # as the loops below; a C constant (0 elsewhere), so the branch is compiled away
        if CYATTN_TILE8X12_OUT and m_here == MR and n_here == NR and csc == 1:
            # a whole tile of a row-major C: written from the registers, as
            # cyattn_tile_out_f32 below would from acc (the same operations)
            cyattn_tile8x12_out_f32(kc, pa, pb, c, rsc, alpha, overwrite)
            return
        cyattn_tile8x12_f32(kc, pa, pb, &acc[0][0])
    else:
        # The first k step starts the sums (0 + a b, the same as zeroing and accumulating):
        # zeroing acc made gcc clear its stack copy with a 1 KiB rep stos on every call.
        for i in range(MR):
            a_i = pa[i]
            for j in range(NR):
                acc[i][j] = a_i * pb[j] + zero
        if CYATTN_KLOOP_4X24:
            # avx2 (B_PREFETCH 0): steps 1 to kc - 1 in C, the loop 64-byte aligned, the
            # same sums (isa/_cyattn_vec_avx2.h says why); a C constant, so the branch is
            # compiled away
            cyattn_kloop4x24_f32(kc, pa, pb, &acc[0][0])
        else:
            for p in range(1, kc):
                # B's next panel (contiguous in a packed B; a prefetch past its end is
                # harmless); a constant of the variant (B_PREFETCH), so the branch is compiled
                # away
                if B_PREFETCH:
                    cyattn_prefetch_r(pb + (p + 256) * NR)
                    cyattn_prefetch_r(pb + (p + 256) * NR + 16)
                for i in range(MR):
                    a_i = pa[p * MR + i]
                    for j in range(NR):
                        acc[i][j] += a_i * pb[p * NR + j]
    if CYATTN_TILE_OUT_FMA:
        # aarch64: C (+)= alpha acc by explicit fused multiply-adds, as in every micro-kernel
        # there (isa/_cyattn_vec_neon.h says why); a C constant, 0 on x86
        cyattn_tile_out_f32(&acc[0][0], NR, c, rsc, csc, m_here, n_here, alpha, overwrite)
        return
    if m_here == MR and n_here == NR and csc == 1:
        for i in range(MR):
            c_row = c + i * rsc
            if overwrite:
                for j in range(NR):
                    c_row[j] = alpha * acc[i][j]
            else:
                for j in range(NR):
                    c_row[j] += alpha * acc[i][j]
    else:
        for i in range(m_here):
            for j in range(n_here):
                if overwrite:
                    c[i * rsc + j * csc] = alpha * acc[i][j]
                else:
                    c[i * rsc + j * csc] += alpha * acc[i][j]


cdef void micro_kernel_f64(Py_ssize_t kc, const double* pa, const double* pb,
                           double* c, Py_ssize_t rsc, Py_ssize_t csc,
                           Py_ssize_t m_here, Py_ssize_t n_here, double alpha,
                           bint overwrite) noexcept nogil:
    """As micro_kernel_f32 with an MRD x NRD tile."""
    cdef double acc[MRD][NRD]
    cdef Py_ssize_t p, i, j
    cdef double a_i
    cdef double zero = 0
    cdef double* c_row
    # C is read and written after the k loop: prefetch every cache line of the tile's rows
    # when accumulating into it (+4-8 % on large products), only each row's first otherwise
    if overwrite or csc != 1:
        for i in range(MRD):
            cyattn_prefetch_w(c + i * rsc)
    else:
        for i in range(MRD):
            for j in range(0, NRD, 8):
                cyattn_prefetch_w(c + i * rsc + j)
            cyattn_prefetch_w(c + i * rsc + NRD - 1)
    if kc <= 0:                 # (no caller passes it) C = 0, or C unchanged
        if overwrite:
            for i in range(m_here):
                for j in range(n_here):
                    c[i * rsc + j * csc] = 0
        return
    # The first k step starts the sums (0 + a b, the same as zeroing and accumulating):
    # zeroing acc made gcc clear its stack copy with a 1 KiB rep stos on every call.
    for i in range(MRD):
        a_i = pa[i]
        for j in range(NRD):
            acc[i][j] = a_i * pb[j] + zero
    for p in range(1, kc):
        for i in range(MRD):
            a_i = pa[p * MRD + i]
            for j in range(NRD):
                acc[i][j] += a_i * pb[p * NRD + j]
    if CYATTN_TILE_OUT_FMA:     # aarch64, as in micro_kernel_f32
        cyattn_tile_out_f64(&acc[0][0], NRD, c, rsc, csc, m_here, n_here, alpha, overwrite)
        return
    if m_here == MRD and n_here == NRD and csc == 1:
        for i in range(MRD):
            c_row = c + i * rsc
            if overwrite:
                for j in range(NRD):
                    c_row[j] = alpha * acc[i][j]
            else:
                for j in range(NRD):
                    c_row[j] += alpha * acc[i][j]
    else:
        for i in range(m_here):
            for j in range(n_here):
                if overwrite:
                    c[i * rsc + j * csc] = alpha * acc[i][j]
                else:
                    c[i * rsc + j * csc] += alpha * acc[i][j]


cdef void micro_kernel_direct(Py_ssize_t kc, const floating* a, Py_ssize_t rsa,
                              const floating* zeros, const floating* b, Py_ssize_t rsb,
                              floating* c, Py_ssize_t rsc, Py_ssize_t csc,
                              Py_ssize_t m_here, Py_ssize_t n_here, floating alpha) noexcept nogil:
    """C[0:m_here, 0:n_here] += alpha * A[0:m_here, 0:kc] @ B[0:kc, 0:nr] with A and B read
    in place (unit column strides; B holds DNR / DNRD readable columns): the unpacked
    micro-kernel of products too small to amortise packing. A's rows past m_here read
    ``zeros`` (kc zeros).
    Each element is summed over k in the same order, with the same multiply-adds, as by the
    packed micro-kernel, so the bits are the same. kc >= 1."""
    cdef floating acc[DMR_MAX][DNR_MAX]
    cdef const floating* ar[DMR_MAX]
    cdef const floating* bp
    cdef Py_ssize_t p, i, j
    cdef floating a_i
    cdef floating zero = 0
    cdef floating* c_row
    if floating is float:
        for i in range(DMR):
            ar[i] = a + i * rsa if i < m_here else zeros
        for i in range(DMR):             # the first k step starts the sums (micro_kernel_f32)
            a_i = ar[i][0]
            for j in range(DNR):
                acc[i][j] = a_i * b[j] + zero
        for p in range(1, kc):
            bp = b + p * rsb
            for i in range(DMR):
                a_i = ar[i][p]
                for j in range(DNR):
                    acc[i][j] += a_i * bp[j]
        if CYATTN_TILE_OUT_FMA:     # aarch64, as in micro_kernel_f32
            cyattn_tile_out_f32(&acc[0][0], DNR_MAX, c, rsc, csc, m_here, n_here, alpha, False)
            return
        if m_here == DMR and n_here == DNR and csc == 1:
            for i in range(DMR):
                c_row = c + i * rsc
                for j in range(DNR):
                    c_row[j] += alpha * acc[i][j]
            return
    else:
        for i in range(DMRD):
            ar[i] = a + i * rsa if i < m_here else zeros
        for i in range(DMRD):             # the first k step starts the sums (micro_kernel_f32)
            a_i = ar[i][0]
            for j in range(DNRD):
                acc[i][j] = a_i * b[j] + zero
        for p in range(1, kc):
            bp = b + p * rsb
            for i in range(DMRD):
                a_i = ar[i][p]
                for j in range(DNRD):
                    acc[i][j] += a_i * bp[j]
        if CYATTN_TILE_OUT_FMA:     # aarch64, as in micro_kernel_f32
            cyattn_tile_out_f64(&acc[0][0], DNR_MAX, c, rsc, csc, m_here, n_here, alpha, False)
            return
        if m_here == DMRD and n_here == DNRD and csc == 1:
            for i in range(DMRD):
                c_row = c + i * rsc
                for j in range(DNRD):
                    c_row[j] += alpha * acc[i][j]
            return
    for i in range(m_here):
        for j in range(n_here):
            c[i * rsc + j * csc] += alpha * acc[i][j]


cdef void micro_kernel_row(Py_ssize_t kc, const floating* a, const floating* b,
                           Py_ssize_t rsb, floating* c, floating alpha) noexcept nogil:
    """c[0:w] += alpha * a[0:kc] @ B[0:kc, 0:w] for one row of A, w = MR x NR (MRD x NRD for
    float64) columns, B's rows read in place (unit column stride) and c contiguous: the
    accumulators of a whole tile hold one row, so each step reads w adjacent elements of B.
    Per element the same multiply-adds in the same order as the other micro-kernels, so the
    same bits. kc >= 1."""
    cdef floating acc[MR][NR]
    cdef const floating* bp
    cdef Py_ssize_t p, i, j
    cdef floating a_p
    cdef floating zero = 0
    if floating is float:
        a_p = a[0]
        for i in range(MR):             # the first k step starts the sums (micro_kernel_f32)
            for j in range(NR):
                acc[i][j] = a_p * b[i * NR + j] + zero
        for p in range(1, kc):
            a_p = a[p]
            bp = b + p * rsb
            for i in range(MR):
                for j in range(NR):
                    acc[i][j] += a_p * bp[i * NR + j]
        if CYATTN_TILE_OUT_FMA:     # aarch64, as in micro_kernel_f32 (c holds MR * NR columns)
            cyattn_tile_out_f32(&acc[0][0], NR, c, NR, 1, MR, NR, alpha, False)
            return
        for i in range(MR):
            for j in range(NR):
                c[i * NR + j] += alpha * acc[i][j]
    else:
        a_p = a[0]
        for i in range(MRD):
            for j in range(NRD):
                acc[i][j] = a_p * b[i * NRD + j] + zero
        for p in range(1, kc):
            a_p = a[p]
            bp = b + p * rsb
            for i in range(MRD):
                for j in range(NRD):
                    acc[i][j] += a_p * bp[i * NRD + j]
        if CYATTN_TILE_OUT_FMA:     # aarch64, as above (acc's rows are NR apart here too)
            cyattn_tile_out_f64(&acc[0][0], NR, c, NRD, 1, MRD, NRD, alpha, False)
            return
        for i in range(MRD):
            for j in range(NRD):
                c[i * NRD + j] += alpha * acc[i][j]


cdef void gemm_small(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, floating alpha,
                     const floating* a, Py_ssize_t rsa, const floating* b, Py_ssize_t rsb,
                     floating* c, Py_ssize_t rsc, Py_ssize_t csc,
                     floating* buf_a, floating* buf_b) noexcept nogil:
    """C += alpha A B for A, B with unit column strides, unpacked: full column panels of B are
    read in place, the last partial one is packed (zero padded) into buf_b, and buf_a holds
    the min(K, KC) zeros that stand in for A's rows past M (read only when M is not a
    multiple of the tile's rows). K runs in KC blocks in order, each added to C, exactly as
    in the packed path, so the bits are the same."""
    cdef Py_ssize_t mr = DMR if floating is float else DMRD
    cdef Py_ssize_t nr = DNR if floating is float else DNRD
    cdef Py_ssize_t row_w = MR * NR if floating is float else MRD * NRD
    cdef Py_ssize_t jr, ir, n_here, pc, kc
    cdef const floating* bj
    cdef Py_ssize_t ldb
    if M % mr:
        memset(buf_a, 0, <size_t>(K if K < KC else KC) * sizeof(floating))
    jr = 0
    if M == 1 and csc == 1:
        # one row: whole tiles of accumulators along the row (micro_kernel_row), the
        # remaining columns below
        while jr + row_w <= N:
            pc = 0
            while pc < K:
                kc = K - pc if K - pc < KC else KC
                micro_kernel_row(kc, a + pc, b + pc * rsb + jr, rsb, c + jr, alpha)
                pc += KC
            jr += row_w
    while jr < N:
        n_here = N - jr if N - jr < nr else nr
        pc = 0
        while pc < K:
            kc = K - pc if K - pc < KC else KC
            if n_here == nr:
                bj = b + pc * rsb + jr
                ldb = rsb
            else:
                pack_b(kc, n_here, b + pc * rsb + jr, rsb, 1, buf_b, nr)
                bj = buf_b
                ldb = nr
            ir = 0
            while ir < M:
                micro_kernel_direct(kc, a + ir * rsa + pc, rsa, buf_a, bj, ldb,
                                    c + ir * rsc + jr * csc, rsc, csc,
                                    M - ir if M - ir < mr else mr, n_here, alpha)
                ir += mr
            pc += KC
        jr += nr


cdef void gemm_block(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, floating alpha,
                     const floating* a, Py_ssize_t rsa, Py_ssize_t csa,
                     const floating* b, Py_ssize_t rsb, Py_ssize_t csb,
                     floating* c, Py_ssize_t rsc, Py_ssize_t csc,
                     bint overwrite, floating* buf_a, floating* buf_b,
                     int a_fmt, int b_fmt, floating* stage,
                     const floating* pb_all, Py_ssize_t pb_cols,
                     Py_ssize_t pb_j0) noexcept nogil:
    """C[M, N] (+)= alpha * A[M, K] @ B[K, N], any strides, single-threaded.

    buf_a holds MC x KC and buf_b KC x min(NC, round_up(N, nr)) elements. With ``overwrite``
    C is written (C = alpha A B), else accumulated. C is summed over K in KC blocks in order, so
    each element's result does not depend on how M and N are tiled.

    a_fmt, b_fmt != 0 (float32 only): ``a`` / ``b`` point to 16-bit elements of that format
    (CYATTN_HALF_*; the pointer's type is then nominal, all indexing goes through pack_a_at /
    pack_b_at), widened while packing; ``stage`` holds max(MR, NR) x KC floats for that. The
    result is that of the float32 product of the widened values, bit for bit.

    pb_all != NULL: B was packed whole beforehand (pack_b_whole, pb_cols = round_up(N of that
    B, nr) columns) and this block's columns start at its column pb_j0 (a multiple of nr); the
    panels are read from there instead of packed (``b`` is not read). The panels are those
    pack_b would make, so are the results.
    """
    cdef const floating* pb
    cdef Py_ssize_t jc, pc, ic, jr, ir, nc, kc, mc
    cdef bint first
    cdef Py_ssize_t i, j
    cdef Py_ssize_t mr = MR if floating is float else MRD
    cdef Py_ssize_t nr = NR if floating is float else NRD
    cdef Py_ssize_t dnr = DNR if floating is float else DNRD
    cdef Py_ssize_t dmr = DMR if floating is float else DMRD
    if M <= 0 or N <= 0:
        return
    if K <= 0:
        if overwrite:
            for i in range(M):
                for j in range(N):
                    c[i * rsc + j * csc] = 0
        return
    if (csa == 1 and csb == 1 and not overwrite and a_fmt == 0 and b_fmt == 0 and pb_all == NULL
            and ((K <= KC and M * N * K <= SMALL_MNK)
                 or (M <= SMALL_B_ROWS and N * K * <Py_ssize_t>sizeof(floating) <= SMALL_B_BYTES))
            and round_up(N, dnr) - N <= round_up(N, nr) - N):
        # row-major, small (or one tile of rows against a B that L2 holds), and the unpacked
        # tile pads no more columns than the packed one
        gemm_small(M, N, K, alpha, a, rsa, b, rsb, c, rsc, csc, buf_a, buf_b)
        return
    jc = 0
    while jc < N:
        nc = N - jc if N - jc < NC else NC
        pc = 0
        while pc < K:
            kc = K - pc if K - pc < KC else KC
            first = overwrite and pc == 0
            if pb_all != NULL:
                pb = pb_all + pc * pb_cols + (pb_j0 + jc) * kc
            else:
                pack_b_at(kc, nc, b, pc * rsb + jc * csb, rsb, csb, b_fmt, buf_b, stage)
                pb = buf_b
            ic = 0
            while ic < M:
                mc = M - ic if M - ic < MC else MC
                pack_a_at(mc, kc, a, ic * rsa + pc * csa, rsa, csa, a_fmt, buf_a, stage)
                jr = 0
                while jr < nc:
                    ir = 0
                    while ir < mc:
                        if floating is float:
                            micro_kernel_f32(kc, buf_a + ir * kc, pb + jr * kc,
                                             c + (ic + ir) * rsc + (jc + jr) * csc, rsc, csc,
                                             mc - ir if mc - ir < mr else mr,
                                             nc - jr if nc - jr < nr else nr, alpha, first)
                        else:
                            micro_kernel_f64(kc, buf_a + ir * kc, pb + jr * kc,
                                             c + (ic + ir) * rsc + (jc + jr) * csc, rsc, csc,
                                             mc - ir if mc - ir < mr else mr,
                                             nc - jr if nc - jr < nr else nr, alpha, first)
                        ir += mr
                    jr += nr
                ic += MC
            pc += KC
        jc += NC


cdef inline Py_ssize_t packed_b_floats(Py_ssize_t K, Py_ssize_t N) noexcept nogil:
    """Floats of B (K x N, float32) packed whole by pack_b_whole."""
    return K * round_up(N, NR)


cdef void pack_b_whole(Py_ssize_t K, Py_ssize_t N, const float* b, Py_ssize_t rsb,
                       Py_ssize_t csb, float* dst) noexcept nogil:
    """B (K x N, any strides) packed once for many products (gemm_block's pb_all): each
    KC-deep block of rows, in order, as pack_b's NR-column panels over round_up(N, NR)
    columns (zero padded), so the block at depth pc starts at dst + pc * round_up(N, NR) and
    its panel of columns j.. (j a multiple of NR) at + j * kc. K * round_up(N, NR) floats."""
    cdef Py_ssize_t cols = round_up(N, NR), pc = 0, kc
    while pc < K:
        kc = K - pc if K - pc < KC else KC
        pack_b(kc, N, b + pc * rsb, rsb, csb, dst + pc * cols, NR)
        pc += KC


cdef void gemm_packed(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, floating alpha,
                      const floating* pa, Py_ssize_t a_depth,
                      const floating* pb, Py_ssize_t b_depth,
                      floating* c, Py_ssize_t rsc, Py_ssize_t csc, bint overwrite) noexcept nogil:
    """C[M, N] (+)= alpha * A[M, K] @ B[K, N] from operands packed over their whole depth.

    ``pa`` holds A as mr-row panels ``pack_a(M, a_depth, ...)`` and ``pb`` holds B as nr-column
    panels ``pack_b(b_depth, N, ...)``; only the first K of each depth is used, so a packed K^T
    or V serves every query block, whatever prefix of the keys it sees. Per element the sum
    runs over K in KC blocks in order, exactly as in gemm_block.
    """
    cdef Py_ssize_t pc, jr, ir, kc, i, j
    cdef bint first
    cdef Py_ssize_t mr = MR if floating is float else MRD
    cdef Py_ssize_t nr = NR if floating is float else NRD
    if M <= 0 or N <= 0:
        return
    if K <= 0:
        if overwrite:
            for i in range(M):
                for j in range(N):
                    c[i * rsc + j * csc] = 0
        return
    pc = 0
    while pc < K:
        kc = K - pc if K - pc < KC else KC
        first = overwrite and pc == 0
        jr = 0
        while jr < N:
            ir = 0
            while ir < M:
                if floating is float:
                    micro_kernel_f32(kc, pa + (ir // mr) * a_depth * mr + pc * mr,
                                     pb + (jr // nr) * b_depth * nr + pc * nr,
                                     c + ir * rsc + jr * csc, rsc, csc,
                                     M - ir if M - ir < mr else mr,
                                     N - jr if N - jr < nr else nr, alpha, first)
                else:
                    micro_kernel_f64(kc, pa + (ir // mr) * a_depth * mr + pc * mr,
                                     pb + (jr // nr) * b_depth * nr + pc * nr,
                                     c + ir * rsc + jr * csc, rsc, csc,
                                     M - ir if M - ir < mr else mr,
                                     N - jr if N - jr < nr else nr, alpha, first)
                ir += mr
            jr += nr
        pc += KC


cdef inline Py_ssize_t round_up(Py_ssize_t x, Py_ssize_t m) noexcept nogil:
    return ((x + m - 1) // m) * m


cdef inline void* align_ptr(void* raw) noexcept nogil:
    return <void*>((<uintptr_t>raw + ALIGN - 1) & ~(<uintptr_t>(ALIGN - 1)))


cdef void matmul_tiles(Py_ssize_t batch, Py_ssize_t M, Py_ssize_t N, Py_ssize_t mr,
                       Py_ssize_t nr, int* n_threads, Py_ssize_t* tile_m,
                       Py_ssize_t* tile_n) noexcept nogil:
    """Output tiles (tile_m x tile_n) of a batched product; caps n_threads at the tile count.

    Each tile packs its own rows of A and columns of B (gemm_block), so one tile per batch entry
    (at most NC wide) packs each operand once. With several threads, tiles are halved until
    every thread has two, always along the longer side, so that the smaller operand is the one
    packed again. Tiling never splits K, so the result does not depend on it.
    """
    cdef Py_ssize_t tm = round_up(M, mr)
    cdef Py_ssize_t tn = round_up(N if N < NC else NC, nr)
    cdef Py_ssize_t want = 2 * n_threads[0] if n_threads[0] > 1 else 1
    cdef Py_ssize_t tiles = batch * ((M + tm - 1) // tm) * ((N + tn - 1) // tn)
    while tiles < want:
        if tm > mr and (tm >= tn or tn <= nr):
            tm = round_up(tm // 2, mr)
        elif tn > nr:
            tn = round_up(tn // 2, nr)
        else:
            break
        tiles = batch * ((M + tm - 1) // tm) * ((N + tn - 1) // tn)
    if n_threads[0] > tiles:
        n_threads[0] = <int>(tiles if tiles > 0 else 1)
    tile_m[0] = tm
    tile_n[0] = tn


cdef void half_c_tiles(Py_ssize_t nr, Py_ssize_t* tile_m, Py_ssize_t* tile_n) noexcept nogil:
    """Caps matmul_tiles' tiles for a 16-bit C: each worker accumulates its tile in a float32
    buffer of tile_m x tile_n, here at most MC x round_up(1024, nr) floats (under 600 KiB), not
    a float32 copy of all of C. Smaller tiles repack B once per MC rows; tiling never changes
    the result."""
    if tile_m[0] > MC:
        tile_m[0] = MC
    if tile_n[0] > round_up(1024, nr):
        tile_n[0] = round_up(1024, nr)


cdef int matmul_worker(const floating* a, const int64_t* a_off, Py_ssize_t rsa, Py_ssize_t csa,
                       const floating* b, const int64_t* b_off, Py_ssize_t rsb, Py_ssize_t csb,
                       floating* c, const int64_t* c_off, Py_ssize_t rsc, Py_ssize_t csc,
                       Py_ssize_t batch, Py_ssize_t M, Py_ssize_t N, Py_ssize_t K,
                       floating alpha, Py_ssize_t tile_m, Py_ssize_t tile_n,
                       Py_ssize_t first, Py_ssize_t step, int a_fmt, int b_fmt,
                       int c_fmt, const floating* pb_all) noexcept nogil:
    """Output tiles first, first + step, ... of a batched C += alpha A B, with this worker's
    own packing buffers (sized to the problem); 1 if they cannot be allocated.

    a_fmt, b_fmt, c_fmt != 0 (float32 only): that operand holds 16-bit elements of the format
    (offsets and strides still count elements). A and B are widened while packing (gemm_block);
    a 16-bit C tile is widened into a float32 tile of this worker's, accumulated there over all
    of K and rounded back once, so the result is the float32 call's rounded once.
    pb_all != NULL: B packed whole (pack_b_whole; ``b``, b_off, rsb, csb unused, batch 1)."""
    cdef Py_ssize_t tiles_m = (M + tile_m - 1) // tile_m
    cdef Py_ssize_t tiles_n = (N + tile_n - 1) // tile_n
    cdef Py_ssize_t ntasks = batch * tiles_m * tiles_n
    cdef Py_ssize_t t, bi, ti, tj, i0, j0, mm, nn
    cdef Py_ssize_t kc_max = K if K < KC else KC
    cdef Py_ssize_t nb = max(round_up(min(tile_n, N, NC), NR if floating is float else NRD),
                             DNR_MAX)
    cdef Py_ssize_t ma = round_up(tile_m if tile_m < M else M, MR if floating is float else MRD)
    cdef size_t bytes_a = <size_t>((ma if ma < MC else MC) * (kc_max if kc_max > 0 else 1)) \
        * sizeof(floating)
    cdef size_t bytes_b = 0 if pb_all != NULL else \
        <size_t>(nb * (kc_max if kc_max > 0 else 1)) * sizeof(floating)   # B packed already
    cdef size_t bytes_s = 0
    cdef size_t bytes_c = 0
    cdef Py_ssize_t a_esz = 2 if a_fmt != 0 else sizeof(floating)
    cdef Py_ssize_t b_esz = 2 if b_fmt != 0 else sizeof(floating)
    cdef Py_ssize_t c_esz = 2 if c_fmt != 0 else sizeof(floating)
    cdef void* raw
    cdef floating* buf_a
    cdef floating* buf_b
    cdef floating* stage = NULL
    cdef floating* ctile = NULL
    cdef floating* cdst
    cdef uint16_t* c16 = NULL
    if a_fmt != 0 or b_fmt != 0:
        bytes_s = <size_t>((MR if MR > NR else NR) * (kc_max if kc_max > 0 else 1)) \
            * sizeof(floating)
    if c_fmt != 0:
        bytes_c = <size_t>((tile_m if tile_m < M else M) * (tile_n if tile_n < N else N)) \
            * sizeof(floating)
    raw = malloc(bytes_a + bytes_b + bytes_s + bytes_c + 4 * ALIGN)
    if raw == NULL:
        return 1
    buf_a = <floating*>align_ptr(raw)
    buf_b = <floating*>align_ptr(<char*>buf_a + bytes_a)
    if bytes_s:
        stage = <floating*>align_ptr(<char*>buf_b + bytes_b)
    if bytes_c:
        ctile = <floating*>align_ptr(<char*>buf_b + bytes_b + bytes_s + ALIGN)
    t = first
    while t < ntasks:
        bi = t // (tiles_m * tiles_n)
        ti = (t // tiles_n) % tiles_m
        tj = t % tiles_n
        i0 = ti * tile_m
        j0 = tj * tile_n
        mm = M - i0 if M - i0 < tile_m else tile_m
        nn = N - j0 if N - j0 < tile_n else tile_n
        cdst = <floating*>(<char*>c + (c_off[bi] + i0 * rsc + j0 * csc) * c_esz)
        if floating is float:
            if c_fmt != 0:
                c16 = <uint16_t*>cdst
                widen_block(c16, mm, nn, rsc, csc, c_fmt, ctile)
                cdst = ctile
        gemm_block(mm, nn, K, alpha,
                   <const floating*>(<const char*>a + (a_off[bi] + i0 * rsa) * a_esz), rsa, csa,
                   <const floating*>(<const char*>b + (b_off[bi] + j0 * csb) * b_esz), rsb, csb,
                   cdst, nn if c_fmt != 0 else rsc, 1 if c_fmt != 0 else csc,
                   False, buf_a, buf_b, a_fmt, b_fmt, stage,
                   pb_all, round_up(N, NR if floating is float else NRD), j0)
        if floating is float:
            if c_fmt != 0:
                narrow_block(ctile, mm, nn, c16, rsc, csc, c_fmt)
        t += step
    free(raw)
    return 0


cdef void matmul_tasks(const floating* a, const int64_t* a_off, Py_ssize_t rsa, Py_ssize_t csa,
                            const floating* b, const int64_t* b_off, Py_ssize_t rsb, Py_ssize_t csb,
                            floating* c, const int64_t* c_off, Py_ssize_t rsc, Py_ssize_t csc,
                            Py_ssize_t batch, Py_ssize_t M, Py_ssize_t N, Py_ssize_t K,
                            floating alpha, Py_ssize_t tile_m, Py_ssize_t tile_n,
                            int n_threads, int* status, int a_fmt, int b_fmt,
                            int c_fmt, const floating* pb_all) noexcept nogil:
    """Batched C += alpha A B over (batch, tile_m x tile_n output tiles): worker w of
    n_threads takes tiles w, w + n_threads, ... One thread runs without an OpenMP region.
    a_fmt, b_fmt, c_fmt: 16-bit operands, as in matmul_worker (a 16-bit C needs tiles small
    enough for the float32 tile each worker holds: see half_c_tiles). pb_all: B packed whole,
    as in matmul_worker."""
    cdef Py_ssize_t w
    if batch <= 0 or M <= 0 or N <= 0:
        return
    if n_threads <= 1:
        if matmul_worker(a, a_off, rsa, csa, b, b_off, rsb, csb, c, c_off, rsc, csc,
                         batch, M, N, K, alpha, tile_m, tile_n, 0, 1, a_fmt, b_fmt,
                         c_fmt, pb_all):
            status[0] = 1
        return
    for w in prange(n_threads, num_threads=n_threads, schedule='static', chunksize=1):
        if matmul_worker(a, a_off, rsa, csa, b, b_off, rsb, csb, c, c_off, rsc, csc,
                         batch, M, N, K, alpha, tile_m, tile_n, w, n_threads, a_fmt,
                         b_fmt, c_fmt, pb_all):
            status[0] = 1
