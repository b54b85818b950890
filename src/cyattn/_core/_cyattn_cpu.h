/*
 * CPU feature detection: CPUID leaves 1 and 7 (subleaves 0 and 1) and XGETBV (whether the
 * OS saves YMM / ZMM / AMX tile state) on x86; on aarch64 the Linux auxiliary vector
 * (AT_HWCAP, AT_HWCAP2) or macOS's hw.optional.arm.FEAT_* sysctls; reported as the
 * CYATTN_CPU_* bits of cyattn_cpu_features(); the vendor string, family and model
 * (cyattn_cpu_identity, x86 only), which the choice of the bf16 path keys on
 * (cyattn._backend.bf16_path); the Linux request for the AMX tile state
 * (cyattn_amx_request_perm); also CYATTN_X86, which the other headers test. C because Cython
 * has no inline assembly or compiler intrinsics for CPUID/XGETBV. Pure functions of the CPU
 * (and of the process's permission, for the request): no mutable state here.
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
#define CYATTN_CPU_AMXBF16 8192     /* tdpbf16ps (CPUID leaf 7 subleaf 0, EDX bit 22) */
#define CYATTN_CPU_AMXTILE 16384    /* tile registers (CPUID leaf 7 subleaf 0, EDX bit 24) */
#define CYATTN_CPU_OSTILE 32768     /* the OS enabled tile state (XCR0 bits 17 and 18) */

/* aarch64 (CYATTN_CPU_NEON above: Advanced SIMD, Linux HWCAP_ASIMD); from 65536 up, clear of
   the x86 bits (a build reports one architecture's bits, but the numbers never overlap) */
#define CYATTN_CPU_FP16    65536   /* FEAT_FP16 half-precision arithmetic (HWCAP_FPHP + ASIMDHP) */
#define CYATTN_CPU_BF16    131072  /* FEAT_BF16: BFDOT, BFMMLA (HWCAP2_BF16) */
#define CYATTN_CPU_I8MM    262144  /* FEAT_I8MM: SMMLA, USDOT (HWCAP2_I8MM) */
#define CYATTN_CPU_SVE     524288  /* FEAT_SVE (HWCAP_SVE) */

#if CYATTN_X86 && defined(__linux__)
#include <unistd.h>
#include <errno.h>
#include <sys/syscall.h>
#endif

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
    if ((r[2] & (1u << 27)) && (cyattn_xgetbv0() & 0x60000u) == 0x60000u) f |= CYATTN_CPU_OSTILE;
    if (max_leaf >= 7) {
        cyattn_cpuid(7, 0, r);
        if (r[1] & (1u << 5)) f |= CYATTN_CPU_AVX2;
        if (r[1] & (1u << 16)) f |= CYATTN_CPU_AVX512F;
        if (r[1] & (1u << 17)) f |= CYATTN_CPU_AVX512DQ;
        if (r[1] & (1u << 30)) f |= CYATTN_CPU_AVX512BW;
        if (r[1] & (1u << 31)) f |= CYATTN_CPU_AVX512VL;
        if (r[3] & (1u << 22)) f |= CYATTN_CPU_AMXBF16;
        if (r[3] & (1u << 24)) f |= CYATTN_CPU_AMXTILE;
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

/* The CPUID vendor string (leaf 0: EBX, EDX, ECX; 12 characters and a NUL, "" off x86), the
   display family (base family, plus the extended family where the base is 0xF) and display
   model (base model, plus the extended model << 4 where the family is 6 or 0xF), as Intel's
   and AMD's manuals define them (leaf 1 EAX). Zen 4 and Zen 5 are families 0x19 and 0x1A;
   Sapphire/Emerald/Granite Rapids family 6, models 0x8F, 0xCF and 0xAD/0xAE. */
static void cyattn_cpu_identity(char vendor[13], int* family, int* model) {
    int i;
    for (i = 0; i < 13; i++) vendor[i] = 0;
    *family = 0;
    *model = 0;
#if CYATTN_X86
    {
        unsigned int r[4], regs[3], eax, base_family, base_model;
        cyattn_cpuid(0, 0, r);
        regs[0] = r[1]; regs[1] = r[3]; regs[2] = r[2];
        for (i = 0; i < 12; i++) vendor[i] = (char)((regs[i / 4] >> (8 * (i % 4))) & 0xffu);
        if (r[0] < 1) return;
        cyattn_cpuid(1, 0, r);
        eax = r[0];
        base_family = (eax >> 8) & 0xfu;
        base_model = (eax >> 4) & 0xfu;
        *family = (int)(base_family == 0xfu ? base_family + ((eax >> 20) & 0xffu) : base_family);
        *model = (int)((base_family == 6u || base_family == 0xfu)
                       ? (((eax >> 16) & 0xfu) << 4) | base_model : base_model);
    }
#endif
}

/* Asks Linux for the AMX tile data state for this process (arch_prctl(ARCH_REQ_XCOMP_PERM,
   XFEATURE_XTILEDATA), then ARCH_GET_XCOMP_PERM to confirm): without it the first tile
   instruction raises SIGILL. Returns 0 when granted (asking again is harmless: the kernel
   keeps the permission for the process's life), the errno of the refusal (old kernel:
   EINVAL; a seccomp policy: EPERM or ENOSYS), or -1 off Linux x86-64, where cyattn does not
   use tiles. */
static int cyattn_amx_request_perm(void) {
#if CYATTN_X86 && defined(__linux__) && defined(SYS_arch_prctl)
    unsigned long bits = 0;
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0)
        return errno ? errno : EINVAL;
    if (syscall(SYS_arch_prctl, 0x1022 /* ARCH_GET_XCOMP_PERM */, &bits) != 0)
        return errno ? errno : EINVAL;
    return (bits & (1ul << 18)) ? 0 : EPERM;
#else
    return -1;
#endif
}

/* Bytes of the largest data or unified cache CPUID describes (the last level: L3 on the
   hosts seen), from the deterministic cache parameters (leaf 4 on Intel, leaf 0x8000001D on
   AMD with TOPOEXT): ways x partitions x line size x sets. 0 where CPUID does not say (other
   vendors, old CPUs, a hypervisor that hides the leaves, not x86). A pure function of the CPU,
   read once, at the kernel module's import (it costs a trap to the hypervisor per CPUID in a
   virtual machine). */
static long long cyattn_llc_bytes(void) {
    long long best = 0;
#if CYATTN_X86
    unsigned int r[4], leaf = 0, sub;
    cyattn_cpuid(0, 0, r);
    if (r[1] == 0x756e6547u && r[0] >= 4) {                 /* "GenuineIntel" */
        leaf = 4;
    } else if (r[1] == 0x68747541u || r[1] == 0x6f677948u) { /* "AuthenticAMD", "HygonGenuine" */
        cyattn_cpuid(0x80000000u, 0, r);
        if (r[0] >= 0x8000001Du) {
            cyattn_cpuid(0x80000001u, 0, r);
            if (r[2] & (1u << 22))                           /* TOPOEXT */
                leaf = 0x8000001Du;
        }
    }
    if (leaf == 0)
        return 0;
    for (sub = 0; sub < 16; sub++) {
        long long size;
        unsigned int type;
        cyattn_cpuid(leaf, sub, r);
        type = r[0] & 0x1fu;                   /* 0: no more caches; 1 data, 2 code, 3 unified */
        if (type == 0)
            break;
        if (type == 2)
            continue;
        size = (long long)((r[1] >> 22) + 1) * (long long)(((r[1] >> 12) & 0x3ffu) + 1)
               * (long long)((r[1] & 0xfffu) + 1) * ((long long)r[2] + 1);
        if (size > best)
            best = size;
    }
#endif
    return best;
}

#endif /* CYATTN_CPU_H */
