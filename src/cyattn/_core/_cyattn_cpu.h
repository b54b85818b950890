/*
 * CPU feature detection: CPUID leaves 1 and 7 (subleaves 0 and 1) and XGETBV (whether the
 * OS saves YMM / ZMM state) on x86; on aarch64 the Linux auxiliary vector (AT_HWCAP,
 * AT_HWCAP2) or macOS's hw.optional.arm.FEAT_* sysctls; reported as the CYATTN_CPU_* bits of
 * cyattn_cpu_features(); also CYATTN_X86, which the other headers test. C because Cython has no inline assembly
 * or compiler intrinsics for CPUID/XGETBV. A pure function of the CPU: no mutable state.
 */
#ifndef CYATTN_CPU_H
#define CYATTN_CPU_H

#include <stdint.h>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || defined(_M_IX86)
#define CYATTN_X86 1
#if defined(_MSC_VER)
#include <intrin.h>
#include <immintrin.h>
#else
#include <cpuid.h>
#endif
#else
#define CYATTN_X86 0
#endif

/* aarch64: Linux reports the features in the auxiliary vector (getauxval, glibc 2.16+ and
   musl), macOS in sysctl hw.optional.arm.FEAT_*; elsewhere (Windows ARM64, other systems)
   only Advanced SIMD, which every aarch64 CPU has, is reported. */
#if (defined(__aarch64__) || defined(_M_ARM64)) && defined(__linux__)
#include <sys/auxv.h>
#define CYATTN_ARM_AUXV 1
#elif (defined(__aarch64__) || defined(_M_ARM64)) && defined(__APPLE__)
#include <sys/types.h>
#include <sys/sysctl.h>
#define CYATTN_ARM_SYSCTL 1
#endif

/* Feature bits reported by cyattn_cpu_features(). */
#define CYATTN_CPU_SSE2    1
#define CYATTN_CPU_AVX     2
#define CYATTN_CPU_FMA     4
#define CYATTN_CPU_AVX2    8
#define CYATTN_CPU_OSYMM   16   /* the OS saves YMM state (XCR0 bits 1 and 2) */
#define CYATTN_CPU_AVX512F 32
#define CYATTN_CPU_NEON    64
#define CYATTN_CPU_AVX512BW 128
#define CYATTN_CPU_AVX512DQ 256
#define CYATTN_CPU_AVX512VL 512
#define CYATTN_CPU_OSZMM   1024  /* the OS saves opmask and ZMM state (XCR0 bits 5, 6, 7) */
#define CYATTN_CPU_F16C    2048
#define CYATTN_CPU_AVX512BF16 4096  /* vdpbf16ps (CPUID leaf 7 subleaf 1, EAX bit 5) */
/* aarch64 (CYATTN_CPU_NEON above: Advanced SIMD, Linux HWCAP_ASIMD) */
#define CYATTN_CPU_FP16    8192   /* FEAT_FP16 half-precision arithmetic (HWCAP_FPHP + ASIMDHP) */
#define CYATTN_CPU_BF16    16384  /* FEAT_BF16: BFDOT, BFMMLA (HWCAP2_BF16) */
#define CYATTN_CPU_I8MM    32768  /* FEAT_I8MM: SMMLA, USDOT (HWCAP2_I8MM) */
#define CYATTN_CPU_SVE     65536  /* FEAT_SVE (HWCAP_SVE) */

#if defined(CYATTN_ARM_SYSCTL)
static int cyattn_sysctl_flag(const char* name) {
    int v = 0;
    size_t len = sizeof(v);
    return sysctlbyname(name, &v, &len, NULL, 0) == 0 && v != 0;
}
#endif

#if CYATTN_X86
static void cyattn_cpuid(unsigned int leaf, unsigned int sub, unsigned int r[4]) {
#if defined(_MSC_VER)
    int regs[4];
    __cpuidex(regs, (int)leaf, (int)sub);
    r[0] = (unsigned int)regs[0]; r[1] = (unsigned int)regs[1];
    r[2] = (unsigned int)regs[2]; r[3] = (unsigned int)regs[3];
#else
    unsigned int a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(leaf, sub, &a, &b, &c, &d)) { a = b = c = d = 0; }
    r[0] = a; r[1] = b; r[2] = c; r[3] = d;
#endif
}

static uint64_t cyattn_xgetbv0(void) {
#if defined(_MSC_VER)
    return (uint64_t)_xgetbv(0);
#else
    unsigned int lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
#endif
}
#endif

static int cyattn_cpu_features(void) {
    int f = 0;
#if CYATTN_X86
    unsigned int r[4];
    unsigned int max_leaf;
    cyattn_cpuid(0, 0, r);
    max_leaf = r[0];
    if (max_leaf < 1) return 0;
    cyattn_cpuid(1, 0, r);
    if (r[3] & (1u << 26)) f |= CYATTN_CPU_SSE2;
    if (r[2] & (1u << 12)) f |= CYATTN_CPU_FMA;
    if (r[2] & (1u << 28)) f |= CYATTN_CPU_AVX;
    if (r[2] & (1u << 29)) f |= CYATTN_CPU_F16C;
    if ((r[2] & (1u << 27)) && (cyattn_xgetbv0() & 6u) == 6u) f |= CYATTN_CPU_OSYMM;
    if ((r[2] & (1u << 27)) && (cyattn_xgetbv0() & 0xE6u) == 0xE6u) f |= CYATTN_CPU_OSZMM;
    if (max_leaf >= 7) {
        cyattn_cpuid(7, 0, r);
        if (r[1] & (1u << 5)) f |= CYATTN_CPU_AVX2;
        if (r[1] & (1u << 16)) f |= CYATTN_CPU_AVX512F;
        if (r[1] & (1u << 17)) f |= CYATTN_CPU_AVX512DQ;
        if (r[1] & (1u << 30)) f |= CYATTN_CPU_AVX512BW;
        if (r[1] & (1u << 31)) f |= CYATTN_CPU_AVX512VL;
        if (r[0] >= 1) {                     /* EAX of subleaf 0: the highest subleaf */
            cyattn_cpuid(7, 1, r);
            if (r[0] & (1u << 5)) f |= CYATTN_CPU_AVX512BF16;
        }
    }
#elif defined(CYATTN_ARM_AUXV)
    /* bit numbers of the Linux arm64 ABI (asm/hwcap.h), spelled out for older headers */
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    if (hw & (1ul << 1)) f |= CYATTN_CPU_NEON;                                 /* ASIMD */
    if ((hw & (1ul << 9)) && (hw & (1ul << 10))) f |= CYATTN_CPU_FP16;        /* FPHP, ASIMDHP */
    if (hw & (1ul << 22)) f |= CYATTN_CPU_SVE;                                 /* SVE */
    if (hw2 & (1ul << 13)) f |= CYATTN_CPU_I8MM;                               /* I8MM */
    if (hw2 & (1ul << 14)) f |= CYATTN_CPU_BF16;                               /* BF16 */
#elif defined(CYATTN_ARM_SYSCTL)
    f |= CYATTN_CPU_NEON;
    if (cyattn_sysctl_flag("hw.optional.arm.FEAT_FP16")) f |= CYATTN_CPU_FP16;
    if (cyattn_sysctl_flag("hw.optional.arm.FEAT_BF16")) f |= CYATTN_CPU_BF16;
    if (cyattn_sysctl_flag("hw.optional.arm.FEAT_I8MM")) f |= CYATTN_CPU_I8MM;
    if (cyattn_sysctl_flag("hw.optional.arm.FEAT_SVE")) f |= CYATTN_CPU_SVE;
#elif defined(__aarch64__) || defined(_M_ARM64)
    f |= CYATTN_CPU_NEON;
#endif
    return f;
}

#endif /* CYATTN_CPU_H */
