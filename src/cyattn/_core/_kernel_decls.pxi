# Declarations shared by the kernel modules: the C support headers (CPU features, OpenMP
# wrappers, prefetch, half-precision conversion, the decode helpers, softmax rows, transposes
# and tiles in explicit vectors) that Cython cannot express itself, through the umbrella
# _cyattn_support.h (its opening comment maps each declaration's header; the per-ISA headers
# are in isa/). Only extern declarations live here; _kernel_common.pxi includes this file (an
# include, not a .pxd cimport, so that the whole compiled core stays in this folder).

from libc.stdint cimport uint8_t, uint16_t, uint32_t

cdef extern from "_cyattn_support.h" nogil:
    int CYATTN_CPU_SSE2
    int CYATTN_CPU_AVX
    int CYATTN_CPU_FMA
    int CYATTN_CPU_AVX2
    int CYATTN_CPU_OSYMM
    int CYATTN_CPU_AVX512F
    int CYATTN_CPU_NEON
    int CYATTN_CPU_AVX512BW
    int CYATTN_CPU_AVX512DQ
    int CYATTN_CPU_AVX512VL
    int CYATTN_CPU_OSZMM
    int CYATTN_CPU_F16C
    int CYATTN_CPU_AVX512BF16
    int CYATTN_HALF_F16
    int CYATTN_HALF_BF16
    void cyattn_half_to_float(const uint16_t* src, float* dst, Py_ssize_t n, int fmt)
    void cyattn_float_to_half(const float* src, uint16_t* dst, Py_ssize_t n, int fmt)
    float cyattn_widen1(const void* v, Py_ssize_t i, int fmt)
    void cyattn_wsum_rows(float* acc, Py_ssize_t acc_stride, const float* w,
                          Py_ssize_t w_stride, Py_ssize_t nq, const void* v, Py_ssize_t rows,
                          Py_ssize_t vs, Py_ssize_t n, int fmt, Py_ssize_t pf_bytes)
    void cyattn_dot_rows(float* scores, Py_ssize_t scores_stride, const float* q,
                         Py_ssize_t q_stride, Py_ssize_t nq, const void* k, Py_ssize_t rows,
                         Py_ssize_t ks, Py_ssize_t n, int fmt, float scale, const void* v,
                         Py_ssize_t vs, Py_ssize_t nv, Py_ssize_t pf_bytes)
    int CYATTN_ROWK
    int CYATTN_ROWS_STREAM
    int CYATTN_NT_PAGE
    Py_ssize_t CYATTN_NT_SCRATCH(Py_ssize_t n)
    int CYATTN_ROWS_STREAM_MIN_ROW
    void cyattn_rows_max_min_f32(const float* x, Py_ssize_t n, float* pmax, float* pmin)
    void cyattn_rows_exp_sum_f32(const float* x, float* y, Py_ssize_t n, float shift, float* part)
    void cyattn_rows_scale_f32(float* y, Py_ssize_t n, float factor)
    int cyattn_softmax_row_f32(const float* x, float* y, Py_ssize_t n, const uint8_t* keep,
                               int log_out)
    Py_ssize_t cyattn_softmax_rows_f32(const float* x, float* y, Py_ssize_t rows, Py_ssize_t n,
                                       int log_out)
    Py_ssize_t cyattn_softmax_rows_f32_nt(const float* x, float* y, float* s, Py_ssize_t rows,
                                          Py_ssize_t n, int log_out)
    void cyattn_sfence()
    int CYATTN_HAVE_PANEL_EXP24
    void cyattn_panel_exp24_f32(float* panel, Py_ssize_t kb, const float* shift, float* part)
    void cyattn_tile12x8_f32(Py_ssize_t kc, const float* pa, Py_ssize_t ps, const float* pb,
                             Py_ssize_t pbs, float* c, Py_ssize_t rsc, float alpha, int overwrite)
    int CYATTN_KLOOP_4X24
    void cyattn_kloop4x24_f32(Py_ssize_t kc, const float* pa, const float* pb, float* acc)
    int CYATTN_NEON_TILE
    void cyattn_tile8x12_f32(Py_ssize_t kc, const float* pa, const float* pb, float* acc)
    int CYATTN_TILE8X12_OUT
    void cyattn_tile8x12_out_f32(Py_ssize_t kc, const float* pa, const float* pb, float* c,
                                 Py_ssize_t rsc, float alpha, int overwrite)
    int CYATTN_NEON_COLMAX
    void cyattn_col_maxmin_f32(const float* panel, Py_ssize_t kb, Py_ssize_t nr,
                               float* col_max, float* col_min)
    int CYATTN_TILE_OUT_FMA
    void cyattn_tile_out_f32(const float* acc, Py_ssize_t ras, float* c, Py_ssize_t rsc,
                             Py_ssize_t csc, Py_ssize_t m, Py_ssize_t n, float alpha,
                             int overwrite)
    void cyattn_tile_out_f64(const double* acc, Py_ssize_t ras, double* c, Py_ssize_t rsc,
                             Py_ssize_t csc, Py_ssize_t m, Py_ssize_t n, double alpha,
                             int overwrite)
    int cyattn_any_nonfinite_f32(const float* v, Py_ssize_t n)
    int cyattn_cpu_features()
    void cyattn_cpu_identity(char* vendor, int* family, int* model)
    int cyattn_amx_request_perm()
    long long cyattn_llc_bytes()
    int cyattn_openmp_enabled()
    int cyattn_omp_max_threads()
    int cyattn_omp_num_procs()
    int cyattn_omp_pause()
    Py_ssize_t cyattn_next_task(Py_ssize_t* c)
    void cyattn_transpose_8x8_f32(const float* a, Py_ssize_t rsa, float* dst, Py_ssize_t ldd)
    void cyattn_transpose_4x8_f32(const float* a, Py_ssize_t rsa, float* dst, Py_ssize_t ldd)
    void cyattn_transpose_scale_f32(const float* ot, Py_ssize_t ot_rs, float* out, Py_ssize_t o_rs,
                                    Py_ssize_t rows, Py_ssize_t n, const float* inv)
    void cyattn_prefetch_w(const void* p)
    void cyattn_prefetch_r(const void* p)
    enum:
        BF16_MR "CYATTN_BF16_MR"
        BF16_NR "CYATTN_BF16_NR"
        CYATTN_HAVE_BF16_DOT
        CYATTN_HAVE_BF16_ARM
        CYATTN_BF16_RULE_ARM
        CYATTN_HAVE_TRANSPOSE
        CYATTN_HAVE_TILE12X8
    float cyattn_bf16_dot_step(float acc, uint32_t a, uint32_t b)
    float cyattn_bf16_arm_dot_step(float acc, uint32_t a, uint32_t b)
    float cyattn_bf16_arm_dot_lane_hw(float acc, uint32_t a, uint32_t b)
    enum:
        CYATTN_HAVE_AMX
        AMX_KB "CYATTN_AMX_KB"
        AMX_BLOCK "CYATTN_AMX_BLOCK"
        AMX_CHUNK "CYATTN_AMX_CHUNK"
        AMX_MODEL_BYTES "CYATTN_AMX_MODEL_BYTES"
        AMX_DEC_ROWS "CYATTN_AMX_DEC_ROWS"
        AMX_ACHUNK "CYATTN_AMX_ACHUNK"
    void cyattn_amx_pack_rows(Py_ssize_t rows, Py_ssize_t cols, const uint16_t* src,
                              Py_ssize_t rs, Py_ssize_t cs, Py_ssize_t rows_total, Py_ssize_t ld,
                              uint16_t* dst)
    void cyattn_amx_pack_pt(const uint32_t* p_pairs, Py_ssize_t kpn, Py_ssize_t nkc,
                            uint32_t* dst)
    void cyattn_amx_begin_model(void* ctx)
    void cyattn_amx_begin_hw(void* ctx)
    void cyattn_amx_end_model(void* ctx)
    void cyattn_amx_end_hw(void* ctx)
    void cyattn_amx_scores_model(void* ctx, const uint16_t* kbuf, Py_ssize_t ld_k, Py_ssize_t ne,
                                 const uint16_t* qt, Py_ssize_t k0, Py_ssize_t nkc, float* tile)
    void cyattn_amx_scores_hw(void* ctx, const uint16_t* kbuf, Py_ssize_t ld_k, Py_ssize_t ne,
                              const uint16_t* qt, Py_ssize_t k0, Py_ssize_t nkc, float* tile)
    void cyattn_amx_pv_model(void* ctx, const uint16_t* vt, Py_ssize_t ld_v, Py_ssize_t Ev,
                             Py_ssize_t k0, Py_ssize_t nkc, const uint32_t* pt, float* ot,
                             Py_ssize_t ld_o)
    void cyattn_amx_pv_hw(void* ctx, const uint16_t* vt, Py_ssize_t ld_v, Py_ssize_t Ev,
                          Py_ssize_t k0, Py_ssize_t nkc, const uint32_t* pt, float* ot,
                          Py_ssize_t ld_o)
    void cyattn_amx_pack_arow(Py_ssize_t E, const uint16_t* src, Py_ssize_t cs, uint16_t* dst)
    void cyattn_amx_pack_kblock(Py_ssize_t E, Py_ssize_t lo, Py_ssize_t hi, const uint16_t* k,
                                Py_ssize_t rs, Py_ssize_t cs, uint16_t* dst)
    void cyattn_amx_pack_vblock(Py_ssize_t Ev, Py_ssize_t ncg, Py_ssize_t lo, Py_ssize_t hi,
                                const uint16_t* v, Py_ssize_t rs, Py_ssize_t cs, uint16_t* dst)
    void cyattn_amx_dec_begin_model(void* ctx, int m)
    void cyattn_amx_dec_begin_hw(void* ctx, int m)
    void cyattn_amx_dec_scores_model(void* ctx, const uint16_t* qa, Py_ssize_t ne,
                                     const uint16_t* kt, float* s, Py_ssize_t ld_s)
    void cyattn_amx_dec_scores_hw(void* ctx, const uint16_t* qa, Py_ssize_t ne,
                                  const uint16_t* kt, float* s, Py_ssize_t ld_s)
    void cyattn_amx_dec_pv_model(void* ctx, const uint16_t* p, Py_ssize_t ld_p,
                                 const uint16_t* vb, Py_ssize_t ncg, float* acc,
                                 Py_ssize_t ld_acc)
    void cyattn_amx_dec_pv_hw(void* ctx, const uint16_t* p, Py_ssize_t ld_p,
                              const uint16_t* vb, Py_ssize_t ncg, float* acc, Py_ssize_t ld_acc)
    void cyattn_amx_pack_b(Py_ssize_t K, Py_ssize_t n_here, const uint16_t* b, Py_ssize_t rsb,
                           Py_ssize_t csb, uint16_t* dst)
    void cyattn_amx_tile_product_model(const uint16_t* a, const uint16_t* b, const uint32_t* c0,
                                       uint32_t* out)
    void cyattn_amx_tile_product_hw(const uint16_t* a, const uint16_t* b, const uint32_t* c0,
                                    uint32_t* out)
    void cyattn_amx_gemm_panel_model(Py_ssize_t M, Py_ssize_t K, const uint16_t* a,
                                     Py_ssize_t rsa, Py_ssize_t csa, const uint16_t* pb,
                                     uint16_t* abuf, void* c, Py_ssize_t rsc, Py_ssize_t csc,
                                     Py_ssize_t n_here, float alpha, int c_fmt)
    void cyattn_amx_gemm_panel_hw(Py_ssize_t M, Py_ssize_t K, const uint16_t* a,
                                  Py_ssize_t rsa, Py_ssize_t csa, const uint16_t* pb,
                                  uint16_t* abuf, void* c, Py_ssize_t rsc, Py_ssize_t csc,
                                  Py_ssize_t n_here, float alpha, int c_fmt)
    float cyattn_bf16_dot_lane_hw(float acc, uint32_t a, uint32_t b)
    void cyattn_bf16_tile_emul(Py_ssize_t kp, const uint32_t* pa, const uint32_t* pb, float* c,
                               Py_ssize_t rsc, Py_ssize_t csc, Py_ssize_t m_here,
                               Py_ssize_t n_here, float alpha, int overwrite)
    void cyattn_bf16_tile_avx512(Py_ssize_t kp, const uint32_t* pa, const uint32_t* pb,
                                 float* c, Py_ssize_t rsc, Py_ssize_t csc, Py_ssize_t m_here,
                                 Py_ssize_t n_here, float alpha, int overwrite)
    void cyattn_bf16_tile_arm_model(Py_ssize_t kp, const uint32_t* pa, const uint32_t* pb,
                                    float* c, Py_ssize_t rsc, Py_ssize_t csc,
                                    Py_ssize_t m_here, Py_ssize_t n_here, float alpha,
                                    int overwrite)
    void cyattn_bf16_tile_arm_hw(Py_ssize_t kp, const uint32_t* pa, const uint32_t* pb,
                                 float* c, Py_ssize_t rsc, Py_ssize_t csc, Py_ssize_t m_here,
                                 Py_ssize_t n_here, float alpha, int overwrite)
