"""Pick the compiled kernel variant once, at import.

The baseline module (no -march) always loads and reports the CPU's features (CPUID leaves 1 and
7, and XGETBV for the OS's support of YMM and ZMM state). On x86-64 the best of the
AVX2+FMA+F16C (x86-64-v3), AVX-512 (F, VL, BW, DQ: x86-64-v4) and AVX-512 + AVX512-BF16
(vdpbf16ps, for bfloat16 matmul_accumulate) modules that the CPU and OS support is loaded;
on aarch64 the neon module (Advanced SIMD, in every aarch64 CPU; Linux getauxval(AT_HWCAP /
AT_HWCAP2) and macOS sysctl hw.optional.arm.FEAT_* also report FP16, BF16, I8MM and SVE).
``CYATTN_BACKEND=baseline|neon|avx2|avx512|avx512bf16`` forces one; forcing a variant this
build lacks or this CPU cannot run raises ImportError with the reason. Nothing else imports a
variant module directly: use ``kernels`` from here.
"""
import importlib
import importlib.util
import os

from . import _kernels_baseline

__all__ = ["kernels", "variant", "available_variants", "cpu_features", "load_variant",
           "max_threads", "in_forked_child"]

_FEATURE_BITS = {"sse2": 1, "avx": 2, "fma": 4, "avx2": 8, "os_ymm": 16, "avx512f": 32, "neon": 64,
                 "avx512bw": 128, "avx512dq": 256, "avx512vl": 512, "os_zmm": 1024, "f16c": 2048,
                 "avx512bf16": 4096, "fp16": 8192, "bf16": 16384, "i8mm": 32768, "sve": 65536}
# Best last within each architecture: a build holds either the x86-64 or the aarch64 ones.
VARIANTS = ("baseline", "neon", "avx2", "avx512", "avx512bf16")
_NEEDS = {"baseline": set(),
          "neon": {"neon"},
          "avx2": {"avx", "avx2", "fma", "f16c", "os_ymm"},
          "avx512": {"avx", "avx2", "fma", "f16c", "os_ymm", "avx512f", "avx512vl", "avx512bw",
                     "avx512dq", "os_zmm"}}
_NEEDS["avx512bf16"] = _NEEDS["avx512"] | {"avx512bf16"}


def cpu_features():
    """Names of the CPU features the kernels care about, as detected by CPUID/XGETBV."""
    bits = _kernels_baseline.cpu_features()
    return [name for name, bit in _FEATURE_BITS.items() if bits & bit]


def _cpu_runs(name):
    return _NEEDS[name] <= set(cpu_features())


def _built(name):
    return importlib.util.find_spec(f"cyattn._kernels_{name}") is not None


def available_variants():
    """Variants that are both built into this install and runnable on this CPU, best last."""
    return [n for n in VARIANTS if _built(n) and _cpu_runs(n)]


def load_variant(name):
    """Import and return the kernel module of variant ``name`` (one of ``VARIANTS``).

    Raises
    ------
    ImportError
        If the variant is unknown, not built into this install, or needs CPU features
        this machine lacks.
    """
    if name not in VARIANTS:
        raise ImportError(f"cyattn: unknown kernel variant {name!r}; expected one of "
                          f"{', '.join(repr(v) for v in VARIANTS)}")
    if not _built(name):
        raise ImportError(f"cyattn: the {name!r} kernel variant is not built into this install "
                          f"(built: {[n for n in VARIANTS if _built(n)]})")
    if not _cpu_runs(name):
        missing = sorted(_NEEDS[name] - set(cpu_features()))
        raise ImportError(f"cyattn: this CPU cannot run the {name!r} kernel variant "
                          f"(it has {cpu_features()}; {name} also needs {missing})")
    if name == "baseline":
        return _kernels_baseline
    return importlib.import_module(f"cyattn._kernels_{name}")


def _choose():
    forced = os.environ.get("CYATTN_BACKEND", "").strip().lower()
    if forced:
        return load_variant(forced)
    return load_variant(available_variants()[-1])


kernels = _choose()
variant = kernels.VARIANT


# GNU libgomp's thread pool does not survive fork(): a child that starts a parallel region with
# more than one thread waits forever for the parent's workers. A process forked after cyattn was
# imported therefore runs its kernels on one thread (results are identical for any thread
# count). This flag is written only in the child, once, by the fork handler.
_forked_child = False


def _after_fork_in_child():
    global _forked_child
    _forked_child = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def in_forked_child():
    """True in a process forked after cyattn was imported (kernels then run on one thread)."""
    return _forked_child


def max_threads():
    """Threads a kernel may use now: the OpenMP default team size, 1 in a forked child."""
    if _forked_child:
        return 1
    return max(1, kernels.omp_max_threads())
