"""Pick the compiled kernel variant once, at import.

The baseline module (no -march) always loads and reports the CPU's features (CPUID leaves 1 and
7, and XGETBV for the OS's support of YMM and ZMM state). On x86-64 the best of the
AVX2+FMA+F16C (x86-64-v3), AVX-512 (F, VL, BW, DQ: x86-64-v4) and AVX-512 + AVX512-BF16
(vdpbf16ps, for bfloat16 matmul_accumulate) modules that the CPU and OS support is loaded;
on aarch64 the baseline (Linux getauxval(AT_HWCAP / AT_HWCAP2) and macOS sysctl
hw.optional.arm.FEAT_* report ASIMD, FP16, BF16, I8MM and SVE).
``CYATTN_BACKEND=baseline|avx2|avx512|avx512bf16`` forces one; forcing a variant this
build lacks or this CPU cannot run raises ImportError with the reason. Nothing else imports a
variant module directly: use ``kernels`` from here.

The ``amx`` variant (the avx512bf16 flags plus AMX-TILE and AMX-BF16: bfloat16
``matmul_accumulate`` on tiles) is opt-in only, ``CYATTN_BACKEND=amx``: it has not yet run on
an AMX CPU, so it is never the default (:data:`OPT_IN`). It loads only where CPUID reports
AMX-BF16 and AMX-TILE, the OS enabled the tile state in XCR0, and Linux grants this process
the tile data state (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``, asked once,
when the variant is loaded); :func:`amx_status` says why not where it does not.

The ``neon`` variant (aarch64: Advanced SIMD softmax rows, exp and decode, an 8 x 12 GEMM
micro-kernel) is opt-in by the same rule, ``CYATTN_BACKEND=neon``: it passes the test suite
under qemu-user, but qemu is not hardware, so it is not the default until an aarch64 CPU has
run its tests. So is ``neonbf16`` (the neon kernels plus BFDOT for bfloat16 ``matmul_accumulate``
and prefill attention with ``precision="fast"``, on FEAT_BF16: HWCAP2_BF16, or macOS's
hw.optional.arm.FEAT_BF16), ``CYATTN_BACKEND=neonbf16``. :func:`runnable_opt_in` lists those
two where they can load (for the tests).

Which bfloat16 path ``precision=None`` takes is :func:`bf16_path`, a pure function of CPUID's
facts (vendor, family, the features) and of what the loaded kernels have; never a timing.
"""
import importlib
import importlib.util
import os

from . import _kernels_baseline

__all__ = ["kernels", "variant", "available_variants", "runnable_opt_in", "cpu_features",
           "load_variant", "max_threads", "in_forked_child"]

_FEATURE_BITS = {"sse2": 1, "avx": 2, "fma": 4, "avx2": 8, "os_ymm": 16, "avx512f": 32, "neon": 64,
                 "avx512bw": 128, "avx512dq": 256, "avx512vl": 512, "os_zmm": 1024, "f16c": 2048,
                 "avx512bf16": 4096, "amx_bf16": 8192, "amx_tile": 16384, "os_tile": 32768,
                 # aarch64 (neon above): from 65536 up, clear of every x86 bit
                 "fp16": 65536, "bf16": 131072, "i8mm": 262144, "sve": 524288}
# Best last within each architecture: a build holds either the x86-64 or the aarch64 ones.
VARIANTS = ("baseline", "avx2", "avx512", "avx512bf16")
# Loaded only when CYATTN_BACKEND names them, never by default: none has run on its hardware
# (amx: tested through its portable model; neon and neonbf16: under qemu only).
OPT_IN = ("amx", "neon", "neonbf16")
_NEEDS = {"baseline": set(),
          "neon": {"neon"},
          "avx2": {"avx", "avx2", "fma", "f16c", "os_ymm"},
          "avx512": {"avx", "avx2", "fma", "f16c", "os_ymm", "avx512f", "avx512vl", "avx512bw",
                     "avx512dq", "os_zmm"}}
_NEEDS["avx512bf16"] = _NEEDS["avx512"] | {"avx512bf16"}
_NEEDS["amx"] = _NEEDS["avx512bf16"] | {"amx_bf16", "amx_tile", "os_tile"}
_NEEDS["neonbf16"] = {"neon", "bf16"}
_FEATURE_TEXT = {"amx_bf16": "AMX-BF16 (CPUID leaf 7 EDX bit 22)",
                 "amx_tile": "AMX-TILE (CPUID leaf 7 EDX bit 24)",
                 "os_tile": "the OS's tile state (XCR0 bits 17 and 18)"}


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


def runnable_opt_in():
    """Opt-in variants built into this install that this CPU runs, without loading them (the
    test suite runs its per-variant tests on these too). Not ``amx``: its tiles also need the
    OS's permission, asked only when it is loaded, and its own tests cover it."""
    return [n for n in OPT_IN if n != "amx" and _built(n) and _cpu_runs(n)]


def _amx_refusal():
    """None where this process may run the amx variant's tiles, else why not (one line).
    Asks Linux for the tile data state when the CPU and XCR0 allow tiles (a request that is
    granted stays granted for the process's life, so asking again is harmless)."""
    missing = sorted(_NEEDS["amx"] - set(cpu_features()))
    if missing:
        return ("this CPU or OS lacks " + ", ".join(_FEATURE_TEXT.get(m, m) for m in missing))
    err = _kernels_baseline.amx_request_permission()
    if err == -1:
        return "tiles are used on Linux only (the tile state is requested with arch_prctl)"
    if err:
        return (f"Linux refused the tile data state (arch_prctl(ARCH_REQ_XCOMP_PERM, "
                f"XFEATURE_XTILEDATA): {os.strerror(err)}; an old kernel or a container policy)")
    return None


def amx_status():
    """One line for ``python -m cyattn info``: whether the opt-in amx variant can load here,
    and why not. Off CPUs with AMX it asks nothing of the OS."""
    if not _built("amx"):
        return "not built into this install (x86-64 gcc/clang builds only)"
    why = _amx_refusal()
    if why:
        return f"unavailable: {why}"
    return ("available, opt-in (CYATTN_BACKEND=amx): bf16 matmul_accumulate and prefill "
            "attention on tiles; "
            "not the default until an AMX CPU has run its tests")


def load_variant(name):
    """Import and return the kernel module of variant ``name`` (one of ``VARIANTS`` or
    ``OPT_IN``).

    Raises
    ------
    ImportError
        If the variant is unknown, not built into this install, or needs CPU features
        this machine lacks (for ``amx``: the feature or OS permission that is missing).
    """
    if name not in VARIANTS and name not in OPT_IN:
        raise ImportError(f"cyattn: unknown kernel variant {name!r}; expected one of "
                          f"{', '.join(repr(v) for v in VARIANTS + OPT_IN)}")
    if not _built(name):
        raise ImportError(f"cyattn: the {name!r} kernel variant is not built into this install "
                          f"(built: {[n for n in VARIANTS + OPT_IN if _built(n)]})")
    if not _cpu_runs(name):
        missing = sorted(_NEEDS[name] - set(cpu_features()))
        raise ImportError(f"cyattn: this CPU cannot run the {name!r} kernel variant "
                          f"(it has {cpu_features()}; {name} also needs {missing})")
    if name == "amx":
        why = _amx_refusal()
        if why:
            raise ImportError(f"cyattn: the 'amx' kernel variant cannot run here: {why}")
        module = importlib.import_module("cyattn._kernels_amx")
        if not getattr(module, "AMX", False):
            raise ImportError("cyattn: the 'amx' kernel variant was built without the tile "
                              "instructions (its compiler has no -mamx-tile/-mamx-bf16)")
        return module
    if name == "baseline":
        return _kernels_baseline
    return importlib.import_module(f"cyattn._kernels_{name}")


# --- the bfloat16 path: a rule keyed on CPUID, never on a timing ---

def bf16_path(vendor, family, features, dot_kernels, amx_kernels, arm_kernels=False):
    """The path a bfloat16 ``matmul_accumulate`` takes with ``precision=None``, and why.

    A pure function of CPUID's facts, so that results never depend on a timing:

    ==========================================  =========  ==============================
    CPU and loaded kernels                      path       why
    ==========================================  =========  ==============================
    amx variant loaded (opt-in)                 ``amx``    tdpbf16ps tiles
    neonbf16 variant loaded (opt-in, aarch64)   ``fast``   BFDOT (FEAT_BF16)
    aarch64 otherwise                           ``exact``  BFDOT only in neonbf16
    AMD family >= 0x19 with AVX512-BF16         ``fast``   vdpbf16ps ~2x float32 FMA
    Intel with AVX512-BF16 (Cooper Lake,        ``exact``  vdpbf16ps 0.5x float32 FMA
    Sapphire/Emerald/Granite Rapids)
    any other vendor with AVX512-BF16           ``exact``  not measured faster
    no AVX512-BF16, or kernels without it       ``exact``  the emulation is slower
    ==========================================  =========  ==============================

    Parameters
    ----------
    vendor : str
        CPUID leaf 0's vendor string (``"GenuineIntel"``, ``"AuthenticAMD"``, ...).
    family : int
        The display family (base family plus extended family).
    features : iterable of str
        The names of :func:`cpu_features` (``"avx512bf16"``, ``"amx_bf16"``, ...).
    dot_kernels : bool
        Whether the loaded kernels multiply bf16 on vdpbf16ps (their ``BF16_DOT``).
    amx_kernels : bool
        Whether the loaded kernels multiply bf16 on AMX tiles (their ``AMX``).
    arm_kernels : bool, optional
        Whether the loaded kernels multiply bf16 on BFDOT (their ``BF16_ARM``: aarch64).

    Returns
    -------
    tuple of str
        ``(path, reason)``: path ``"amx"`` or ``"fast"`` (``precision=None`` means
        ``"fast"``, on tiles or on vdpbf16ps) or ``"exact"`` (widening to float32).
    """
    features = set(features)
    amx_cpu = {"amx_bf16", "amx_tile"} <= features
    if amx_kernels:
        return "amx", "the opt-in amx variant is loaded (CYATTN_BACKEND=amx): tdpbf16ps tiles"
    if arm_kernels:
        return "fast", ("the opt-in neonbf16 variant is loaded (CYATTN_BACKEND=neonbf16): "
                        "BFDOT (FEAT_BF16)")
    if "neon" in features:
        if "bf16" in features:
            return "exact", ("BFDOT (FEAT_BF16) is in the opt-in neonbf16 variant "
                             "(CYATTN_BACKEND=neonbf16; not yet run on aarch64 hardware)")
        return "exact", "no FEAT_BF16 in this CPU: the model of BFDOT is slower than widening"
    if "avx512bf16" not in features:
        return "exact", "no AVX512-BF16 in this CPU: the emulation of vdpbf16ps is slower"
    if not dot_kernels:
        return "exact", ("the loaded kernel variant has no vdpbf16ps: its emulation is "
                         "slower than widening")
    if vendor == "AuthenticAMD" and family >= 0x19:
        return "fast", (f"AMD family {family:#x} (Zen 4 or later): vdpbf16ps runs at about "
                        f"2x the float32 FMA rate")
    if vendor == "GenuineIntel":
        why = "Intel: vdpbf16ps runs at 0.5x the float32 FMA rate (measured), widening is faster"
        if amx_cpu:
            why += "; AMX tiles: opt in with CYATTN_BACKEND=amx (not yet run on AMX hardware)"
        return "exact", why
    return "exact", (f"vendor {vendor!r}: vdpbf16ps not measured faster than widening there")


def _cpu_facts():
    vendor, family, _model = _kernels_baseline.cpu_identity()
    return vendor, family, tuple(cpu_features())


_CPU_FACTS = _cpu_facts()        # constant: the CPU does not change under a process
_DOT_IS_FAST = bf16_path(*_CPU_FACTS, True, False)[0] == "fast"


def bf16_fast_by_default(kernels_module, tiles=True):
    """Whether ``precision=None`` means ``"fast"`` for bfloat16 with ``kernels_module``: the
    cheap form of :func:`default_bf16_path`, for every call. ``tiles``: the operation's fast
    path runs on AMX tiles where the kernels have them (bf16 ``matmul_accumulate`` and
    prefill attention both do); False for an operation without a tile kernel, whose fast
    path is then the default only where :func:`bf16_path` says the CPU runs vdpbf16ps faster
    than widening."""
    if tiles and getattr(kernels_module, "AMX", False):
        return True
    if getattr(kernels_module, "BF16_ARM", False):
        return True
    return _DOT_IS_FAST and bool(getattr(kernels_module, "BF16_DOT", False))


def default_bf16_path(kernels_module=None):
    """:func:`bf16_path` for this CPU and ``kernels_module`` (default: the loaded kernels)."""
    k = kernels if kernels_module is None else kernels_module
    return bf16_path(*_CPU_FACTS, bool(getattr(k, "BF16_DOT", False)),
                     bool(getattr(k, "AMX", False)), bool(getattr(k, "BF16_ARM", False)))


def _choose():
    forced = os.environ.get("CYATTN_BACKEND", "").strip().lower()
    if forced:
        return load_variant(forced)       # the only way to load an OPT_IN variant
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
