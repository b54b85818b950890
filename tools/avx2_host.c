/* tools/avx2_host.c: an LD_PRELOAD shim that makes this process see an AVX2 host on an
 * AVX-512 one (Linux x86-64 with CPUID faulting: `cpuid_fault` in /proc/cpuinfo). Run it
 * through tools/avx2_host.sh.
 *
 * Why: AVX2-only servers (AMD Zen 2/3, Intel's E-core Xeons) are much of what clouds rent,
 * and the peers cyattn is compared with choose their kernels at run time from CPUID (NumPy's
 * OpenBLAS, ONNX Runtime's MLAS, PyTorch's cpuinfo, cyattn's own _backend). Forcing only
 * cyattn's avx2 variant on an AVX-512 host compares it with the peers' AVX-512 kernels. With
 * this shim every library in the process dispatches as on an AVX2 host; what stays the
 * host's own is its micro-architecture: cache sizes, ports, clock (say so when quoting).
 *
 * How: the constructor turns on CPUID faulting for the process (arch_prctl ARCH_SET_CPUID 0;
 * threads created later inherit it), so every CPUID instruction raises SIGSEGV; the handler
 * runs the real CPUID with faulting briefly off, clears the AVX-512 and AMX feature bits
 * (leaf 7, leaf 7.1's AVX512_BF16, and the AVX-512 state components of leaf 0xD) and steps
 * over the instruction. Any other SIGSEGV gets the default action. Libraries read CPUID a
 * few times at start-up, so the cost is nil after that. A later SIGSEGV handler (Python's
 * faulthandler, e.g. under pytest) would take the fault instead: run benchmarks, not pytest.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <asm/prctl.h>
#include <cpuid.h>

static void cpuid_faulting(int off) { syscall(SYS_arch_prctl, ARCH_SET_CPUID, off); }

static void on_segv(int sig, siginfo_t* info, void* context) {
    ucontext_t* uc = (ucontext_t*)context;
    greg_t* reg = uc->uc_mcontext.gregs;
    const unsigned char* ip = (const unsigned char*)reg[REG_RIP];
    unsigned leaf, sub, a, b, c, d;
    (void)info;
    if (ip[0] != 0x0f || ip[1] != 0xa2) {      /* not CPUID: retried with the default action */
        signal(sig, SIG_DFL);
        return;
    }
    leaf = (unsigned)reg[REG_RAX];
    sub = (unsigned)reg[REG_RCX];
    cpuid_faulting(1);
    __cpuid_count(leaf, sub, a, b, c, d);
    cpuid_faulting(0);
    if (leaf == 7 && sub == 0) {
        /* EBX: AVX512 F, DQ, IFMA, PF, ER, CD, BW, VL */
        b &= ~((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) |
               (1u << 30) | (1u << 31));
        /* ECX: AVX512 VBMI, VBMI2, VNNI, BITALG, VPOPCNTDQ */
        c &= ~((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14));
        /* EDX: AVX512 4VNNIW, 4FMAPS, VP2INTERSECT, AMX-BF16, FP16, AMX-TILE, AMX-INT8 */
        d &= ~((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) |
               (1u << 25));
    } else if (leaf == 7 && sub == 1) {
        a &= ~(1u << 5);                        /* AVX512_BF16 */
    } else if (leaf == 0xd && sub == 0) {
        a &= ~0x600e0u;                         /* opmask, ZMM_Hi256, Hi16_ZMM; AMX tiles */
    }
    reg[REG_RAX] = a;
    reg[REG_RBX] = b;
    reg[REG_RCX] = c;
    reg[REG_RDX] = d;
    reg[REG_RIP] += 2;                          /* CPUID is 0F A2 */
}

__attribute__((constructor)) static void avx2_host_init(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGSEGV, &sa, NULL);
    cpuid_faulting(0);
}
