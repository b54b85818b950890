"""Build script: declares the compiled kernel variants and picks flags per compiler.

The same Cython source (src/cyattn/_kernels_impl.pxi) is compiled as
  * cyattn._kernels_baseline: no -march (x86-64 SSE2, armv8-a NEON), runs on every CPU;
  * cyattn._kernels_avx2 (x86-64 only): -mavx2 -mfma (MSVC: /arch:AVX2).
cyattn._backend picks one at import time. No host-specific ISA flag (march=native) and no
fast-math or Ofast: wheels must run on any CPU of their architecture and keep IEEE semantics.

OpenMP is used when the compiler supports it (probed by compiling a test program); set
CYATTN_NO_OPENMP=1 to build without it (the kernels then run single-threaded).
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


def _env_flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class BuildExt(build_ext):
    """Adds optimisation, ISA and OpenMP flags that depend on the compiler in use."""

    def _compiles_and_links(self, cflags, ldflags):
        code = "#include <omp.h>\nint main(void){int n=0;\n#pragma omp parallel\n{n=omp_get_num_threads();}\nreturn n<1;}\n"
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

    def build_extensions(self):
        ctype = self.compiler.compiler_type
        if ctype == "msvc":
            base = ["/O2"]
            omp_c, omp_l = ["/openmp"], []
            isa = {"avx2": ["/arch:AVX2"]}
        else:
            base = ["-O3", "-fno-strict-aliasing"]
            if sys.platform == "darwin":
                omp_c, omp_l = ["-Xpreprocessor", "-fopenmp"], ["-lomp"]
            else:
                omp_c, omp_l = ["-fopenmp"], ["-fopenmp"]
            isa = {"avx2": ["-mavx2", "-mfma"]}
        use_omp = not _env_flag("CYATTN_NO_OPENMP") and self._compiles_and_links(omp_c, omp_l)
        self.cyattn_openmp = use_omp
        for ext in self.extensions:
            variant = ext.name.rsplit("_", 1)[-1]
            ext.extra_compile_args = base + isa.get(variant, []) + (omp_c if use_omp else [])
            ext.extra_link_args = omp_l if use_omp else []
        print(f"cyattn: compiler={ctype} openmp={'on' if use_omp else 'off'}")
        super().build_extensions()


def _extensions():
    from Cython.Build import cythonize

    variants = ["baseline"] + (["avx2"] if _target_is_x86_64() else [])
    exts = [
        Extension(
            f"cyattn._kernels_{v}",
            [f"src/cyattn/_kernels_{v}.pyx"],
            include_dirs=["src/cyattn"],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        )
        for v in variants
    ]
    return cythonize(
        exts,
        compiler_directives={"language_level": 3, "freethreading_compatible": True},
        include_path=["src"],
    )


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildExt})
