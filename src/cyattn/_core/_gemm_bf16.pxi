# bfloat16 GEMM on the CPU's bf16 dot products (matmul_accumulate with precision="fast"):
# packing into the instruction's pair layout and the drivers. The micro-kernels are C
# (_cyattn_bf16_avx512.h: vdpbf16ps; _cyattn_bf16_emul.h: its portable emulation).
#
# Design
# ------
# * Same BLIS loops as _gemm.pxi (NC -> KCB -> MC -> NR -> MR, threads over output tiles
#   only), on CYATTN_BF16_MR x CYATTN_BF16_NR tiles. Each operand is packed once per block
#   into uint32 pairs of consecutive k (k = 2q in the high half, which the instruction
#   multiplies first; a +0 pad in the low half of the last pair when the block's depth is
#   odd): A into MR-row panels, dst[q * MR + i]; B into NR-column panels, dst[q * NR + j].
#   Packing reads the bf16 bits as they are stored: no float32 copy, no widening.
# * Per element of C: within each KCB-deep block the sum runs over k in order, every step
#   acc = FTZ(RNE(acc + a_k b_k)) with subnormal inputs read as zero (see the emulation's
#   header for what the instruction does, measured); the block's sum is then added to C as
#   fma(alpha, sum, C). Tiling and threads never change that order, so results are
#   bit-identical for any thread count, and the emulation gives the hardware's bits.
# * The same packing and loops run AArch64 BFDOT's rule (engine BF16_ARM_*: the pair of k
#   summed first, every step rounded to odd; isa/_cyattn_bf16_arm.h): the neonbf16 variant's
#   BFDOT tile, or its model, which aarch64 builds use wherever they have no BFDOT.
# * KCB = KC (256 k values, 128 pairs): the B panel of one block is 16 KiB, the A block
#   72 KiB. Equal to the float32 path's KC on purpose: with the same blocks and sums over k
#   in order, vdpbf16ps's rule gives the exact path's bits on variants with FMA wherever no
#   subnormal occurs (tests/test_bf16_fast.py checks it).
# * B packed once per worker and tile column (pack_b_pairs_whole), all of K, when that is at
#   most B_WHOLE_BYTES: a bf16 out caps tiles at MC rows (half_c_tiles), and each 144-row
#   tile packed its B again (8 times for n = 1024), a quarter of the time of the product.

cdef enum:
    KCB = KC
    B_WHOLE_BYTES = 1 << 24


cdef void pack_a_pairs(Py_ssize_t mc, Py_ssize_t kc, const uint16_t* a, Py_ssize_t rsa,
                       Py_ssize_t csa, uint32_t* dst) noexcept nogil:
    """A[0:mc, 0:kc] (bf16 bits) into BF16_MR-row panels of k pairs:
    dst[panel][q][i] = A[i, 2q] << 16 | A[i, 2q + 1] (0 past kc), rows past mc zero."""
    cdef Py_ssize_t kp = (kc + 1) // 2, kfull = kc // 2
    cdef Py_ssize_t ir = 0, i, q, q0, m_here, q8
    cdef const uint16_t* src
    cdef uint32_t x
    while ir < mc:
        m_here = mc - ir if mc - ir < BF16_MR else BF16_MR
        q8 = 0
        if (csa == 1 and rsa % 2 == 0 and m_here == 8 and BF16_MR == 8
                and <uintptr_t>a % 4 == 0):
            # row-major A with 4-byte aligned pairs: 8 x 8 blocks of pairs transposed as
            # 32-bit words (transpose_8x8 only moves bits: 6 % of an n = 1024 product packed
            # word by word), then each word's halves swapped into the instruction's order
            q8 = kfull - kfull % 8
            for q0 in range(0, q8, 8):
                transpose_8x8(<const float*>(a + ir * rsa + 2 * q0), rsa // 2,
                              <float*>(dst + q0 * 8), 8)
            for q in range(q8 * 8):
                x = dst[q]
                dst[q] = (x << 16) | (x >> 16)
        for i in range(m_here):
            src = a + (ir + i) * rsa
            if csa == 1:
                for q in range(q8, kfull):
                    dst[q * BF16_MR + i] = (<uint32_t>src[2 * q] << 16) | src[2 * q + 1]
            else:
                for q in range(q8, kfull):
                    dst[q * BF16_MR + i] = ((<uint32_t>src[2 * q * csa] << 16)
                                            | src[(2 * q + 1) * csa])
            if kc & 1:
                dst[kfull * BF16_MR + i] = <uint32_t>src[(kc - 1) * csa] << 16
        for i in range(m_here, BF16_MR):
            for q in range(kp):
                dst[q * BF16_MR + i] = 0
        dst += BF16_MR * kp
        ir += BF16_MR


cdef void pack_b_pairs(Py_ssize_t kc, Py_ssize_t nc, const uint16_t* b, Py_ssize_t rsb,
                       Py_ssize_t csb, uint32_t* dst) noexcept nogil:
    """B[0:kc, 0:nc] (bf16 bits) into BF16_NR-column panels of k pairs:
    dst[panel][q][j] = B[2q, j] << 16 | B[2q + 1, j] (0 past kc), columns past nc zero.
    Row-major B: two rows are interleaved a panel row at a time (contiguous reads)."""
    cdef Py_ssize_t kp = (kc + 1) // 2, kfull = kc // 2
    cdef Py_ssize_t jr = 0, j, q, n_here
    cdef const uint16_t* r0
    cdef const uint16_t* r1
    cdef uint32_t* d
    while jr < nc:
        n_here = nc - jr if nc - jr < BF16_NR else BF16_NR
        for q in range(kp):
            r0 = b + 2 * q * rsb + jr * csb
            r1 = r0 + rsb
            d = dst + q * BF16_NR
            if q < kfull:
                if csb == 1:
                    for j in range(n_here):
                        d[j] = (<uint32_t>r0[j] << 16) | r1[j]
                else:
                    for j in range(n_here):
                        d[j] = (<uint32_t>r0[j * csb] << 16) | r1[j * csb]
            else:
                for j in range(n_here):
                    d[j] = <uint32_t>r0[j * csb] << 16
            for j in range(n_here, BF16_NR):
                d[j] = 0
        dst += BF16_NR * kp
        jr += BF16_NR


cdef inline Py_ssize_t packed_pairs_whole(Py_ssize_t K, Py_ssize_t N) noexcept nogil:
    """uint32 pairs of B (K x N) packed whole by pack_b_pairs_whole."""
    return ((K + 1) // 2 + (K + KCB - 1) // KCB) * round_up(N, BF16_NR)


cdef void pack_b_pairs_whole(Py_ssize_t K, Py_ssize_t N, const uint16_t* b, Py_ssize_t rsb,
                             Py_ssize_t csb, uint32_t* dst) noexcept nogil:
    """B (K x N bf16 bits) packed for every KCB-deep block, in order: the block at depth pc
    starts at dst + (pc // 2) * round_up(N, BF16_NR) (KCB is even) and holds pack_b_pairs'
    panels of its kc rows."""
    cdef Py_ssize_t cols = round_up(N, BF16_NR), pc = 0, kc
    while pc < K:
        kc = K - pc if K - pc < KCB else KCB
        pack_b_pairs(kc, N, b + pc * rsb, rsb, csb, dst + (pc // 2) * cols)
        pc += KCB


cdef enum:
    # which bf16 dot product runs (bf16_engine picks one per call; the tiles' two are
    # _gemm_amx.pxi's and the fused attention's)
    BF16_EMUL = 0             # vdpbf16ps's rule, the portable emulation
    BF16_DOT_HW = 1           # vdpbf16ps (the avx512bf16 variant)
    BF16_TILES_MODEL = 2      # AMX tiles, the portable model
    BF16_TILES_HW = 3         # AMX tiles, the instructions (the amx variant)
    BF16_ARM_MODEL = 4        # BFDOT / BFMMLA's rule, the portable model
    BF16_ARM_HW = 5           # BFDOT (the neonbf16 variant)


cdef inline int bf16_engine(bint arm, bint emulate) noexcept nogil:
    """The dot-product engine of a call: ``arm`` picks BFDOT's rule over vdpbf16ps's, and the
    rule runs on the instruction where this module has it, unless ``emulate``."""
    if arm:
        return BF16_ARM_HW if CYATTN_HAVE_BF16_ARM and not emulate else BF16_ARM_MODEL
    return BF16_DOT_HW if CYATTN_HAVE_BF16_DOT and not emulate else BF16_EMUL


cdef inline void bf16_dot_tile(int engine, Py_ssize_t kp, const uint32_t* pa,
                               const uint32_t* pb, float* c, Py_ssize_t rsc, Py_ssize_t csc,
                               Py_ssize_t m_here, Py_ssize_t n_here, float alpha,
                               int overwrite) noexcept nogil:
    """One BF16_MR x BF16_NR tile (m_here x n_here of it stored) on the engine's kernel: each
    rule's instruction and its model give the same bits."""
    # the instructions first, each behind its module's constant (a variant without one
    # compiles its branch away)
    if CYATTN_HAVE_BF16_DOT and engine == BF16_DOT_HW:
        cyattn_bf16_tile_avx512(kp, pa, pb, c, rsc, csc, m_here, n_here, alpha, overwrite)
    elif CYATTN_HAVE_BF16_ARM and engine == BF16_ARM_HW:
        cyattn_bf16_tile_arm_hw(kp, pa, pb, c, rsc, csc, m_here, n_here, alpha, overwrite)
    elif engine == BF16_ARM_MODEL:
        cyattn_bf16_tile_arm_model(kp, pa, pb, c, rsc, csc, m_here, n_here, alpha, overwrite)
    else:
        cyattn_bf16_tile_emul(kp, pa, pb, c, rsc, csc, m_here, n_here, alpha, overwrite)


cdef void gemm_block_bf16(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, float alpha,
                          const uint16_t* a, Py_ssize_t rsa, Py_ssize_t csa,
                          const uint16_t* b, Py_ssize_t rsb, Py_ssize_t csb,
                          float* c, Py_ssize_t rsc, Py_ssize_t csc,
                          uint32_t* buf_a, uint32_t* buf_b, int engine,
                          const uint32_t* pb_all) noexcept nogil:
    """C[M, N] += alpha * A[M, K] @ B[K, N] (A, B bf16 bits, any strides; C float32) on the
    bf16 dot product of ``engine`` (bf16_engine: an instruction or the model of its rule).
    buf_a holds MC x KCB / 2 pairs, buf_b KCB / 2 x min(NC, round_up(N, BF16_NR)).
    pb_all != NULL (N <= NC): B packed whole by pack_b_pairs_whole, read in place (``b`` is
    not read); the same panels, so the same bits."""
    cdef Py_ssize_t jc, pc, ic, jr, ir, nc, kc, mc, kp
    cdef const uint32_t* pa
    cdef const uint32_t* pb
    if M <= 0 or N <= 0 or K <= 0:
        return
    jc = 0
    while jc < N:
        nc = N - jc if N - jc < NC else NC
        pc = 0
        while pc < K:
            kc = K - pc if K - pc < KCB else KCB
            kp = (kc + 1) // 2
            if pb_all != NULL:
                pb = pb_all + (pc // 2) * round_up(N, BF16_NR)
            else:
                pack_b_pairs(kc, nc, b + pc * rsb + jc * csb, rsb, csb, buf_b)
                pb = buf_b
            ic = 0
            while ic < M:
                mc = M - ic if M - ic < MC else MC
                pack_a_pairs(mc, kc, a + ic * rsa + pc * csa, rsa, csa, buf_a)
                jr = 0
                while jr < nc:
                    ir = 0
                    while ir < mc:
                        pa = buf_a + ir * kp
                        bf16_dot_tile(engine, kp, pa, pb + jr * kp,
                                      c + (ic + ir) * rsc + (jc + jr) * csc, rsc, csc,
                                      mc - ir if mc - ir < BF16_MR else BF16_MR,
                                      nc - jr if nc - jr < BF16_NR else BF16_NR, alpha, 0)
                        ir += BF16_MR
                    jr += BF16_NR
                ic += MC
            pc += KCB
        jc += NC


cdef int matmul_worker_bf16(const uint16_t* a, const int64_t* a_off, Py_ssize_t rsa,
                            Py_ssize_t csa, const uint16_t* b, const int64_t* b_off,
                            Py_ssize_t rsb, Py_ssize_t csb, void* c, const int64_t* c_off,
                            Py_ssize_t rsc, Py_ssize_t csc, Py_ssize_t batch, Py_ssize_t M,
                            Py_ssize_t N, Py_ssize_t K, float alpha, Py_ssize_t tile_m,
                            Py_ssize_t tile_n, Py_ssize_t first, Py_ssize_t step, int c_fmt,
                            int engine) noexcept nogil:
    """Output tiles first, first + step, ... of a batched C += alpha A B with bf16 A and B
    (gemm_block_bf16), with this worker's own buffers; 1 if they cannot be allocated.
    c_fmt != 0: C holds 16-bit elements of that format; each tile is widened into a float32
    tile, accumulated over all of K and rounded back once (as matmul_worker does)."""
    cdef Py_ssize_t tiles_m = (M + tile_m - 1) // tile_m
    cdef Py_ssize_t tiles_n = (N + tile_n - 1) // tile_n
    cdef Py_ssize_t ntasks = batch * tiles_m * tiles_n
    cdef Py_ssize_t t, bi, ti, tj, i0, j0, mm, nn
    cdef Py_ssize_t kp_max = ((K if K < KCB else KCB) + 1) // 2
    cdef Py_ssize_t nb = round_up(min(tile_n, N, NC), BF16_NR)
    cdef Py_ssize_t ma = round_up(tile_m if tile_m < M else M, BF16_MR)
    cdef size_t bytes_a = <size_t>((ma if ma < MC else MC) * kp_max) * sizeof(uint32_t)
    cdef size_t bytes_b = <size_t>(nb * kp_max) * sizeof(uint32_t)
    cdef size_t bytes_c = 0
    cdef size_t bytes_w = <size_t>packed_pairs_whole(K, nb) * sizeof(uint32_t)
    cdef Py_ssize_t c_esz = 2 if c_fmt != 0 else 4
    cdef Py_ssize_t last_bi = -1, last_j0 = -1
    cdef uint32_t* pb_all = NULL
    cdef void* raw
    cdef uint32_t* buf_a
    cdef uint32_t* buf_b
    cdef float* ctile = NULL
    cdef float* cdst
    cdef uint16_t* c16 = NULL
    if c_fmt != 0:
        bytes_c = <size_t>((tile_m if tile_m < M else M) * (tile_n if tile_n < N else N)) \
            * sizeof(float)
    if ntasks <= tiles_n or nb > NC or bytes_w > B_WHOLE_BYTES:
        bytes_w = 0           # every tile has columns of its own, or B is too large
    raw = malloc(bytes_a + bytes_b + bytes_c + bytes_w + 4 * ALIGN)
    if raw == NULL:
        return 1
    buf_a = <uint32_t*>align_ptr(raw)
    buf_b = <uint32_t*>align_ptr(<char*>buf_a + bytes_a)
    if bytes_c:
        ctile = <float*>align_ptr(<char*>buf_b + bytes_b)
    if bytes_w:
        pb_all = <uint32_t*>align_ptr(<char*>buf_b + bytes_b + bytes_c + ALIGN)
    t = first
    while t < ntasks:
        bi = t // (tiles_m * tiles_n)
        ti = (t // tiles_n) % tiles_m
        tj = t % tiles_n
        i0 = ti * tile_m
        j0 = tj * tile_n
        mm = M - i0 if M - i0 < tile_m else tile_m
        nn = N - j0 if N - j0 < tile_n else tile_n
        cdst = <float*>(<char*>c + (c_off[bi] + i0 * rsc + j0 * csc) * c_esz)
        if c_fmt != 0:
            c16 = <uint16_t*>cdst
            widen_block(c16, mm, nn, rsc, csc, c_fmt, ctile)
            cdst = ctile
        if pb_all != NULL and (bi != last_bi or j0 != last_j0):
            # this worker's previous tile had other columns of B: pack these, all of K
            pack_b_pairs_whole(K, nn, b + b_off[bi] + j0 * csb, rsb, csb, pb_all)
            last_bi = bi
            last_j0 = j0
        gemm_block_bf16(mm, nn, K, alpha, a + a_off[bi] + i0 * rsa, rsa, csa,
                        b + b_off[bi] + j0 * csb, rsb, csb,
                        cdst, nn if c_fmt != 0 else rsc, 1 if c_fmt != 0 else csc,
                        buf_a, buf_b, engine, pb_all)
        if c_fmt != 0:
            narrow_block(ctile, mm, nn, c16, rsc, csc, c_fmt)
        t += step
    free(raw)
    return 0


cdef void matmul_tasks_bf16(const uint16_t* a, const int64_t* a_off, Py_ssize_t rsa,
                            Py_ssize_t csa, const uint16_t* b, const int64_t* b_off,
                            Py_ssize_t rsb, Py_ssize_t csb, void* c, const int64_t* c_off,
                            Py_ssize_t rsc, Py_ssize_t csc, Py_ssize_t batch, Py_ssize_t M,
                            Py_ssize_t N, Py_ssize_t K, float alpha, Py_ssize_t tile_m,
                            Py_ssize_t tile_n, int n_threads, int* status, int c_fmt,
                            int engine) noexcept nogil:
    """Batched C += alpha A B on the bf16 dot product over output tiles: worker w of
    n_threads takes tiles w, w + n_threads, ... (as matmul_tasks)."""
    cdef Py_ssize_t w
    if batch <= 0 or M <= 0 or N <= 0:
        return
    if n_threads <= 1:
        if matmul_worker_bf16(a, a_off, rsa, csa, b, b_off, rsb, csb, c, c_off, rsc, csc,
                              batch, M, N, K, alpha, tile_m, tile_n, 0, 1, c_fmt, engine):
            status[0] = 1
        return
    for w in prange(n_threads, num_threads=n_threads, schedule='static', chunksize=1):
        if matmul_worker_bf16(a, a_off, rsa, csa, b, b_off, rsb, csb, c, c_off, rsc, csc,
                              batch, M, N, K, alpha, tile_m, tile_n, w, n_threads, c_fmt,
                              engine):
            status[0] = 1
