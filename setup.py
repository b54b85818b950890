"""Build script: declares the compiled kernel variants and picks flags per compiler.

The compiled core lives in src/cyattn/_core/ (the variant .pyx files, the .pxi loops that
_kernel_sources.pxi lists, the portable C headers; isa/ holds one header per instruction set).
The same Cython sources are compiled as
  * cyattn._kernels_baseline: no -march (x86-64 SSE2, armv8-a NEON), runs on every CPU;
  * cyattn._kernels_neon (aarch64 only; opt-in, CYATTN_BACKEND=neon, never the default until
    it has run on an aarch64 CPU): -march=armv8-a (Advanced SIMD is in every aarch64
    CPU) plus CYATTN_ISA_NEON, which selects the explicit NEON vectors of
    _core/isa/_cyattn_vec_neon.h and the 8 x 12 micro-kernel tile;
  * cyattn._kernels_neonbf16 (aarch64 only; opt-in, CYATTN_BACKEND=neonbf16, on FEAT_BF16):
    the neon variant with -march=armv8.2-a+bf16 (probed), so that the bf16 fast path runs on
    BFDOT (_core/isa/_cyattn_bf16_arm.h);
  * cyattn._kernels_avx2 (x86-64 only): -mavx2 -mfma -mf16c (x86-64-v3; MSVC: /arch:AVX2);
  * cyattn._kernels_avx512 (x86-64 only): AVX-512 F/VL/BW/DQ + FMA (MSVC: /arch:AVX512),
    the x86-64-v4 feature set, with its own micro-kernel tile sizes (512-bit registers);
  * cyattn._kernels_avx512bf16 (x86-64 only): the avx512 flags + -mavx512bf16 (vdpbf16ps:
    Cooper Lake, Sapphire Rapids and later, Zen 4 and later), for the bf16 fast path of
    matmul_accumulate; gcc/clang only (MSVC has no flag that enables only AVX512-BF16
    intrinsics' code generation: there the variant compiles without them, its bf16 fast path
    then runs the emulation);
  * cyattn._kernels_amx (x86-64 only; opt-in, CYATTN_BACKEND=amx, never the default until it
    has run on an AMX CPU): the avx512bf16 flags + -mamx-tile -mamx-bf16 (Sapphire Rapids and
    later), bf16 matmul_accumulate on tiles; where the compiler lacks the flags (MSVC, old
    gcc/clang: probed) it compiles without them and cyattn._backend refuses to load it.
cyattn._backend picks one at import time. No host-specific ISA flag (march=native) and no
fast-math or Ofast: wheels must run on any CPU of their architecture and keep IEEE semantics.

OpenMP is used when the compiler supports it (probed by compiling a test program); set
CYATTN_NO_OPENMP=1 to build without it (the kernels then run single-threaded).
CYATTN_SANITIZE=address,undefined (gcc/clang) builds with ASan/UBSan for tools/sanitize_check.sh.
CYATTN_BUILD_JOBS=N: modules compiled at once (default: one per module, up to the usable CPUs);
CYATTN_BUILD_VARIANTS=a,b: compile only these variants and the baseline (developers' builds).
"""
import os
import sys
import sysconfig
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _target_is_x86_64():
    plat = os.environ.get("_PYTHON_HOST_PLATFORM") or sysconfig.get_platform()
    plat = plat.lower()
    archflags = os.environ.get("ARCHFLAGS", "")
    if "arm64" in archflags and "x86_64" not in archflags:
        return False
    return plat.endswith(("x86_64", "amd64")) or plat in ("win-amd64",)


def _target_is_aarch64():
    """True when building for aarch64 / arm64 (Linux, macOS arm64, Windows ARM64), also when
    cross-compiling (_PYTHON_HOST_PLATFORM, as tools/qemu_aarch64_check.sh does; ARCHFLAGS)."""
    plat = (os.environ.get("_PYTHON_HOST_PLATFORM") or sysconfig.get_platform()).lower()
    archflags = os.environ.get("ARCHFLAGS", "")
    if "arm64" in archflags and "x86_64" not in archflags:
        return True
    if "x86_64" in archflags:
        return False
    return plat.endswith(("aarch64", "arm64"))


def _env_flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _usable_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class BuildExt(build_ext):
    """Adds optimisation, ISA and OpenMP flags that depend on the compiler in use.

    The kernel modules compile in parallel, one compiler per module up to the usable CPUs
    (pip passes no ``--parallel``; each module is one large C file, so a serial build leaves all
    but one core idle): ``CYATTN_BUILD_JOBS=N`` sets N, and ``build_ext --parallel`` or a
    ``[build_ext] parallel`` setting takes precedence over both.
    """

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:
            jobs = os.environ.get("CYATTN_BUILD_JOBS", "").strip()
            if jobs:
                if not jobs.isdigit() or int(jobs) < 1:
                    raise RuntimeError(f"CYATTN_BUILD_JOBS={jobs!r}: expected a positive "
                                       f"integer (the number of modules compiled at once)")
                self.parallel = int(jobs)
            else:
                self.parallel = max(1, min(_usable_cpus(), len(self.extensions or ())))

    def _compiles_and_links(self, cflags, ldflags):
        code = ("#include <omp.h>\nint main(void){int n=0;\n#pragma omp parallel\n"
                "{n=omp_get_num_threads();}\nreturn n<1;}\n")
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "omp_probe.c")
            with open(src, "w") as fh:
                fh.write(code)
            try:
                objs = self.compiler.compile([src], output_dir=tmp, extra_postargs=cflags)
                self.compiler.link_executable(objs, "omp_probe", output_dir=tmp,
                                              extra_postargs=ldflags)
            except Exception:  # any compiler or linker failure means: no OpenMP
                return False
        return True

    def _compiles(self, cflags, code):
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "flag_probe.c")
            with open(src, "w") as fh:
                fh.write(code)
            try:
                self.compiler.compile([src], output_dir=tmp, extra_postargs=cflags)
            except Exception:  # any compiler failure means: not supported
                return False
        return True

    def build_extensions(self):
        ctype = self.compiler.compiler_type
        if ctype == "msvc":
            base = ["/O2"]
            omp_c, omp_l = ["/openmp"], []
            isa = {"avx2": ["/arch:AVX2"], "avx512": ["/arch:AVX512"],
                   "avx512bf16": ["/arch:AVX512"], "amx": ["/arch:AVX512"], "neon": [],
                   "neonbf16": []}
        else:
            base = ["-O3", "-fno-strict-aliasing"]
            if sys.platform == "darwin":
                omp_c, omp_l = ["-Xpreprocessor", "-fopenmp"], ["-lomp"]
            else:
                omp_c, omp_l = ["-fopenmp"], ["-fopenmp"]
            isa = {"avx2": ["-mavx2", "-mfma", "-mf16c"],
                   "avx512": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512vl", "-mavx512bw",
                              "-mavx512dq"]}
            isa["avx512bf16"] = isa["avx512"] + ["-mavx512bf16"]
            amx = ["-mamx-tile", "-mamx-bf16"]
            amx_probe = ("#include <immintrin.h>\nvoid f(void* p){_tile_loadd(0, p, 64);"
                         "_tile_dpbf16ps(1, 0, 2);_tile_release();}\n")
            isa["amx"] = isa["avx512bf16"] + (
                amx if self._compiles(isa["avx512bf16"] + amx, amx_probe) else [])
            # Apple's clang targets armv8.x of its own CPUs by default: name the baseline
            isa["neon"] = ["-march=armv8-a"]
            # FEAT_BF16 (BFDOT, BFMMLA): Armv8.2-A and later with the bf16 extension; a compiler
            # without it builds the variant on the portable model of BFDOT (the same bits)
            bf16 = ["-march=armv8.2-a+bf16"]
            bf16_probe = ("#include <arm_neon.h>\nfloat32x4_t f(float32x4_t a, bfloat16x8_t b)"
                          "{return vbfdotq_laneq_f32(a, b, b, 1);}\n")
            isa["neonbf16"] = bf16 if (_target_is_aarch64()
                                       and self._compiles(bf16, bf16_probe)) else isa["neon"]
        use_omp = not _env_flag("CYATTN_NO_OPENMP") and self._compiles_and_links(omp_c, omp_l)
        self.cyattn_openmp = use_omp
        for ext in self.extensions:
            variant = ext.name.rsplit("_", 1)[-1]
            ext.extra_compile_args = base + isa.get(variant, []) + (omp_c if use_omp else [])
            ext.extra_link_args = omp_l if use_omp else []
        # --- CYATTN_SANITIZE: ASan/UBSan builds for tools/sanitize_check.sh (never for wheels) ---
        # A comma-separated subset of {address, undefined}. -O3 stays on purpose: the sanitizers
        # then check the code the wheels ship (the same vectorised loops and remainder paths);
        # -g and frame pointers keep the reports readable. UBSan findings abort instead of
        # printing and going on (-fno-sanitize-recover). Link flags: the sanitizer runtimes.
        sanitize = [name.strip() for name in os.environ.get("CYATTN_SANITIZE", "").split(",")
                    if name.strip()]
        if sanitize:
            unknown = sorted(set(sanitize) - {"address", "undefined"})
            if unknown:
                raise RuntimeError(f"CYATTN_SANITIZE={os.environ['CYATTN_SANITIZE']!r}: unknown "
                                   f"sanitizer(s) {unknown}; expected a comma-separated list "
                                   f"from: address, undefined")
            if ctype not in ("unix", "mingw32", "cygwin"):
                raise RuntimeError(f"CYATTN_SANITIZE needs gcc or clang; this build uses the "
                                   f"{ctype!r} compiler")
            san_flag = f"-fsanitize={','.join(sanitize)}"
            for ext in self.extensions:
                # new lists: the OpenMP flag lists are shared by all extensions
                ext.extra_compile_args = ext.extra_compile_args + [
                    san_flag, "-fno-omit-frame-pointer", "-g"] + (
                    ["-fno-sanitize-recover=undefined"] if "undefined" in sanitize else [])
                ext.extra_link_args = ext.extra_link_args + [san_flag]
        # --- end CYATTN_SANITIZE ---
        print(f"cyattn: compiler={ctype} openmp={'on' if use_omp else 'off'} "
              f"sanitize={','.join(sanitize) or 'off'}")
        super().build_extensions()


def _extensions():
    from Cython.Build import cythonize

    variants = ["baseline"]
    if _target_is_x86_64():
        variants += ["avx2", "avx512", "avx512bf16", "amx"]
    elif _target_is_aarch64():
        # opt-in at run time (CYATTN_BACKEND=neon / neonbf16, cyattn._backend.OPT_IN): tested
        # under qemu, not yet on aarch64 hardware
        variants += ["neon", "neonbf16"]
    # CYATTN_BUILD_VARIANTS (developers' knob; wheels build them all): a comma-separated subset
    # of the variants above to compile, e.g. tools/sanitize_check.sh --quick's instrumented build
    # of only the variants this CPU runs. The baseline is always built (the dispatcher's fallback).
    wanted = [v.strip() for v in os.environ.get("CYATTN_BUILD_VARIANTS", "").split(",")
              if v.strip()]
    if wanted:
        unknown = sorted(set(wanted) - set(variants))
        if unknown:
            raise RuntimeError(f"CYATTN_BUILD_VARIANTS={os.environ['CYATTN_BUILD_VARIANTS']!r}: "
                               f"{unknown} not among this target's variants {variants}")
        variants = [v for v in variants if v == "baseline" or v in wanted]
    # macros of one variant: CYATTN_ISA_NEON turns on the NEON vocabulary (the baseline module
    # is compiled for the same architecture, so the flags alone cannot tell them apart)
    macros = {"neon": [("CYATTN_ISA_NEON", "1")], "neonbf16": [("CYATTN_ISA_NEON", "1")]}
    exts = [
        Extension(
            f"cyattn._kernels_{v}",
            [f"src/cyattn/_core/_kernels_{v}.pyx"],
            include_dirs=["src/cyattn/_core", "src/cyattn/_core/isa"],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")] + macros.get(v, []),
        )
        for v in variants
    ]
    return cythonize(
        exts,
        compiler_directives={"language_level": 3, "freethreading_compatible": True},
        include_path=["src"],
    )


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildExt})
