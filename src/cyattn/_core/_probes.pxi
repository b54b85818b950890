# Machine probes: the CPU features and OpenMP runtime this module sees, and the FMA peak
# probe the bench uses as the machine's compute limit.

def cpu_features():
    """Bit set of CPU features (see _cyattn_cpu.h)."""
    return cyattn_cpu_features()


def cpu_identity():
    """``(vendor, family, model)`` from CPUID leaves 0 and 1: the vendor string
    (``"GenuineIntel"``, ``"AuthenticAMD"``, ...; ``""`` off x86) and the display family and
    model (see _cyattn_cpu.h), which cyattn._backend.bf16_path keys the bf16 path on."""
    cdef char vendor[13]
    cdef int family = 0, model = 0
    cyattn_cpu_identity(vendor, &family, &model)
    return vendor[:12].decode("ascii", "replace").rstrip("\0"), family, model


def amx_request_permission():
    """Ask Linux for the AMX tile data state of this process (arch_prctl
    ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); 0 when granted, the errno of a refusal, -1 off
    Linux x86-64. Only cyattn._backend calls it, once, before loading the amx variant."""
    return cyattn_amx_request_perm()


def openmp_enabled():
    """True if this module was compiled with OpenMP."""
    return bool(cyattn_openmp_enabled())


def omp_max_threads():
    """The OpenMP runtime's current default team size (1 without OpenMP)."""
    return cyattn_omp_max_threads()


def omp_num_procs():
    return cyattn_omp_num_procs()


def plan_constants():
    """The constants by which the kernels split their work into tasks (this variant's tiles,
    attention's query groups and decode chunks, the row passes' elements per thread): what
    cyattn._plan mirrors in Python, and tests compare with."""
    return {"MR": MR, "NR": NR, "MRD": MRD, "NRD": NRD, "MC": MC, "NC": NC, "KC": KC,
            "KB": KB, "QG": QG, "QG_DENSE": QG_DENSE, "DECODE_MAX_L": DECODE_MAX_L,
            "DECODE_MIN_WORK": DECODE_MIN_WORK, "DECODE_CHUNK": DECODE_CHUNK,
            "DECODE_UNGROUPED_MAX_L": DECODE_UNGROUPED_MAX_L,
            "GDECODE_KEYS_PER_ROW": GDECODE_KEYS_PER_ROW, "GDECODE_MAX_ROWS": GDECODE_MAX_ROWS,
            "GDECODE_CHUNK": GDECODE_CHUNK, "GDECODE_MIN_CHUNK": GDECODE_MIN_CHUNK,
            "GDECODE_MIN_TASKS": GDECODE_MIN_TASKS,
            "ROWS_PER_THREAD_ELEMS": ROWS_PER_THREAD_ELEMS}


def omp_pause():
    """Release the OpenMP thread pool (before fork); 0 on success."""
    return cyattn_omp_pause()


cdef extern from *:
    """
    /* Independent multiply-add chains of the FMA peak probe: twelve vector registers' worth on
       every ISA, so that all accumulators stay in registers on the 16-register ones (SSE2 and
       NEON 128-bit, AVX2 256-bit) as on AVX-512 (32 registers). 192 float32 chains on AVX2 were
       24 ymm registers: gcc spilled them, and a Zen 1 host reported 26.8 GFLOP/s per core where
       OpenBLAS's sgemm ran at 36.4. Twelve chains cover two FMA pipes of up to 6 cycles. */
    #if defined(__AVX512F__)
    #define CYATTN_PROBE_LANES 192
    #elif defined(__AVX__)
    #define CYATTN_PROBE_LANES 96
    #else
    #define CYATTN_PROBE_LANES 48
    #endif
    """
    enum: PROBE_LANES "CYATTN_PROBE_LANES"


def fma_probe(Py_ssize_t iters):
    """Run ``iters`` rounds of PROBE_LANES independent float32 multiply-adds (one thread).

    Returns ``(flops, checksum)``. The bench times it to estimate the core's FMA peak: the
    chains are independent, so the loop is bound by the FMA units, not by their latency.
    """
    cdef float acc[PROBE_LANES]
    cdef float mul = <float>0.999999
    cdef float add = <float>1e-7
    cdef Py_ssize_t it, j
    cdef double checksum = 0.0
    with nogil:
        for j in range(PROBE_LANES):
            acc[j] = <float>j * <float>1e-3
        for it in range(iters):
            for j in range(PROBE_LANES):
                acc[j] = acc[j] * mul + add
        for j in range(PROBE_LANES):
            checksum += acc[j]
    return 2 * iters * PROBE_LANES, checksum
