# Shared by every kernel file: C-level imports, the extern helpers Cython cannot express, and
# the blocking constants that do not depend on the variant. _kernel_sources.pxi includes this
# first; each variant module (_kernels_baseline.pyx, _kernels_avx2.pyx, _kernels_avx512.pyx)
# defines its micro-kernel tile, then includes _kernel_sources.pxi, so the same loops become SSE2
# code in one, 256-bit FMA code in the next and 512-bit code in the last.
#
# Cython reads `# cython:` directive comments only at the top of the module file itself, so
# the directives that hold for the kernels are the ones the variant .pyx files set.
#
# Design
# ------
# * threads: OpenMP only over independent tasks (rows, output tiles, attention tasks), each
#   worker with its own scratch allocated once per call; one thread runs without an OpenMP
#   region. No reduction is ever split across threads. No global mutable state.

from libc.stdlib cimport malloc, free
from libc.string cimport memset, memcpy
from libc.math cimport log, isnan, sqrt, sqrtf
from libc.stdint cimport int32_t, uint16_t, uint32_t, int64_t, uint64_t, uint8_t, uintptr_t
from cpython.buffer cimport (PyObject_GetBuffer, PyBuffer_Release, PyBUF_RECORDS_RO, PyBUF_RECORDS,
                             PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE)
cimport cython
from cython cimport floating
from cython.parallel cimport prange, parallel

include "_kernel_decls.pxi"   # the extern declarations of the C headers

cdef extern from *:
    """
    #include <math.h>
    #define CYATTN_INF ((double)INFINITY)
    #define CYATTN_NAN ((double)NAN)
    /* c + a * b rounded as the vectorised micro-kernel rounds it: fused where the variant has
       FMA (gcc contracts the micro-kernel's multiply-add there), separately where it has not. */
    /* The score and P V micro-kernels and the online softmax stay functions of their own:
       when gcc inlined them into the fused attention worker (after issue 24 grew it), its
       16-32 accumulators no longer stayed in registers and dense attention ran 1.8-2.7x
       slower (perf: 68 % of the time in the worker). Every variant module needs its line
       here: the avx512bf16 variant had none, and its float32 attention ran at half the
       avx512 variant's speed (58 against 114-143 GFLOP/s, (1, 8, 1024, 64), Zen 5).
       Cython cannot mark a function noinline, so the attribute goes on a prototype of the
       name Cython gives it (cython mangling: __pyx_f_<module>_<name>, fused specialisations
       __pyx_fuse_<i>__pyx_f_...); tests/test_build.py checks the symbols exist. */
    #if defined(__GNUC__) && defined(__PYX_HAVE__cyattn___kernels_avx512bf16)
    #define CYATTN_KFN(name) __pyx_f_6cyattn_19_kernels_avx512bf16_##name
    #define CYATTN_KFUSED(i, name) __pyx_fuse_##i##__pyx_f_6cyattn_19_kernels_avx512bf16_##name
    #elif defined(__GNUC__) && defined(__PYX_HAVE__cyattn___kernels_avx512)
    #define CYATTN_KFN(name) __pyx_f_6cyattn_15_kernels_avx512_##name
    #define CYATTN_KFUSED(i, name) __pyx_fuse_##i##__pyx_f_6cyattn_15_kernels_avx512_##name
    #elif defined(__GNUC__) && defined(__PYX_HAVE__cyattn___kernels_avx2)
    #define CYATTN_KFN(name) __pyx_f_6cyattn_13_kernels_avx2_##name
    #define CYATTN_KFUSED(i, name) __pyx_fuse_##i##__pyx_f_6cyattn_13_kernels_avx2_##name
    #elif defined(__GNUC__) && defined(__PYX_HAVE__cyattn___kernels_baseline)
    #define CYATTN_KFN(name) __pyx_f_6cyattn_17_kernels_baseline_##name
    #define CYATTN_KFUSED(i, name) __pyx_fuse_##i##__pyx_f_6cyattn_17_kernels_baseline_##name
    #endif
    #if defined(CYATTN_KFN)
    static void CYATTN_KFN(micro_kernel_f32)(Py_ssize_t, float const *, float const *, float *,
        Py_ssize_t, Py_ssize_t, Py_ssize_t, Py_ssize_t, float, int) __attribute__((noinline));
    static void CYATTN_KFN(micro_kernel_f64)(Py_ssize_t, double const *, double const *,
        double *, Py_ssize_t, Py_ssize_t, Py_ssize_t, Py_ssize_t, double, int)
        __attribute__((noinline));
    static void CYATTN_KFUSED(0, panel_online_softmax)(float *, Py_ssize_t, float *, float *,
        float *) __attribute__((noinline));
    static void CYATTN_KFUSED(1, panel_online_softmax)(double *, Py_ssize_t, double *,
        double *, double *) __attribute__((noinline));
    static void CYATTN_KFN(bf16_panel_softmax)(float *, Py_ssize_t, float *, float *, float *,
        uint32_t *) __attribute__((noinline));
    #endif
    #if defined(__FMA__)
    #define CYATTN_MULADD_F32(a, b, c) fmaf((a), (b), (c))
    #define CYATTN_MULADD_F64(a, b, c) fma((a), (b), (c))
    #else
    #define CYATTN_MULADD_F32(a, b, c) ((a) * (b) + (c))
    #define CYATTN_MULADD_F64(a, b, c) ((a) * (b) + (c))
    #endif
    """
    double CYATTN_INF
    double CYATTN_NAN
    float CYATTN_MULADD_F32(float a, float b, float c) nogil
    double CYATTN_MULADD_F64(double a, double b, double c) nogil

# The micro-kernel tile (MR x NR float32, MRD x NRD float64) and the blocking MC, NC depend on
# the register file, so each variant module defines them before including this file.
cdef enum:
    LANES = 32        # partial maxima / sums per row (lanes_sum/lanes_max/lanes_min assume 32)
    KC = 256          # depth of a packed panel
    QB = 64           # query rows per block of the two-pass (fallback) attention path
    KB = 256          # keys per block of the fused attention (score tile qg x KB)
    PACK_COLS = 16    # columns of a column-major A (keys of V^T) per pass over its panels
    #                   (pack_a): each panel's piece of them, 16 x mr floats, is written
    #                   whole before the next panel's
    QG = 256          # query rows per fused attention task when E + Ev > 256 (halved down
    #                   to 64 for parallelism)
    QG_DENSE = 1024   # the same for E + Ev <= 256: K and V are packed once per task, so
    #                   bigger groups pack them less often (+5-13 % dense, +5-15 % causal at
    #                   one thread); with a causal mask and several threads, halved until
    #                   each thread has 8 tasks, to keep the uneven work balanced
    DECODE_MAX_L = 16  # at most this many query rows take the decode path (per head) ...
    DECODE_MIN_WORK = 1024  # ... when batch * S * (E + Ev) >= L * this: the fused path pads
    #                         its query tile to NR rows (up to 32x the work at L = 1) and is
    #                         2-4x slower; only for tiny problems is its lower fixed cost less
    DECODE_PF_BYTES = 4096  # software prefetch distance of the decode loops
    DECODE_CHUNK = 512   # keys per decode task (fixed: results must not depend on threads)
    ALIGN = 64        # scratch alignment in bytes
    SMALL_MNK = 96 * 96 * 96   # matmul products up to this size run unpacked (gemm_small)


cdef inline void prefetch_row(const void* row, Py_ssize_t nbytes) noexcept nogil:
    """Prefetch (into L2) each 64-byte line of row[0:nbytes] (the decode loops, the fused
    attention's value rows). A prefetch is not an access: past an array it never faults."""
    cdef Py_ssize_t off = 0
    while off < nbytes:
        cyattn_prefetch_r(<const char*>row + off)
        off += 64
