"""The build: which kernel variants it holds, which one is loaded, and how it is forced.

* An x86-64 build must hold the AVX2+FMA variant as well as the baseline; other builds only
  the baseline.
* The loaded variant is the best one this CPU runs, unless ``CYATTN_BACKEND`` names one;
  forcing is checked in fresh interpreters (the choice is made once, at import), including
  that forcing the baseline never imports the AVX2 module, and that an unknown, unbuilt or
  unrunnable variant is an ImportError that says why.
* Free-threaded CPython: importing cyattn and every variant keeps the GIL disabled (the
  kernels are compiled with Cython's ``freethreading_compatible`` directive).
* Wheels: ``CYATTN_EXPECT_OPENMP`` (0/1) and ``CYATTN_EXPECT_VENDORED`` (a library name prefix,
  e.g. ``libgomp`` or ``vcomp140``), set by cibuildwheel's test-environment and
  tools/wheel_check.sh, state what the wheel under test must have; unset, those tests skip.

The per-variant run of the kernel tests is the ``variant`` fixture in conftest.py.
"""
import ast
import importlib.util
import os
import platform
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import child_env

import cyattn
from cyattn import _backend

KNOWN = ("baseline", "neon", "avx2", "avx512", "avx512bf16")
IS_X86_64 = (platform.machine().lower() in ("x86_64", "amd64", "x64")
             and sys.maxsize > 2 ** 32)
IS_AARCH64 = platform.machine().lower() in ("aarch64", "arm64")


def _built(name):
    return importlib.util.find_spec(f"cyattn._kernels_{name}") is not None


def _child_env(backend=None):
    """conftest's :func:`child_env` without an inherited CYATTN_BACKEND (``backend`` or none)."""
    return child_env(backend, clear_backend=True)


# Prints the loaded variant and the variant modules imported, one per line.
_PROBE = """
import sys
import cyattn
print(cyattn.config()["variant"])
print(",".join(sorted(m for m in sys.modules if m.startswith("cyattn._kernels_"))))
"""


def _run(code, tmp_path, backend=None, extra_args=()):
    return subprocess.run([sys.executable, *extra_args, "-c", code], cwd=tmp_path,
                          env=_child_env(backend), capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------------------------------------
# What the build holds
# ------------------------------------------------------------------------------------------

@pytest.mark.skipif(not IS_X86_64, reason="x86-64 only")
@pytest.mark.parametrize("name", ["avx2", "avx512", "avx512bf16", "amx"])
def test_x86_64_build_has_simd_variants(name):
    assert _built("baseline")
    assert _built(name), (
        f"this x86-64 build of cyattn has no {name} kernel variant (cyattn._kernels_{name}): "
        "setup.py did not see an x86-64 target (check _PYTHON_HOST_PLATFORM / ARCHFLAGS)")
    base = importlib.util.find_spec("cyattn._kernels_baseline").origin
    origin = importlib.util.find_spec(f"cyattn._kernels_{name}").origin
    assert os.path.dirname(origin) == os.path.dirname(base)


@pytest.mark.skipif(IS_X86_64, reason="non-x86-64 only")
def test_other_builds_hold_only_the_baseline():
    assert _built("baseline")
    assert not _built("avx2") and not _built("avx512") and not _built("avx512bf16")
    assert not _built("amx")
    # aarch64 builds add the opt-in neon variant, others nothing


@pytest.mark.skipif(IS_AARCH64, reason="not aarch64 only")
def test_non_aarch64_builds_have_no_neon_variant():
    assert not _built("neon") and not _built("neonbf16")


def test_variant_modules_are_what_they_say():
    for name in _backend.available_variants():
        module = _backend.load_variant(name)
        assert module.__name__ == f"cyattn._kernels_{name}"
        assert module.VARIANT == name
        assert not module.BF16_ARM     # BFDOT only in the opt-in neonbf16 variant
        # only the avx512bf16 variant multiplies bf16 on vdpbf16ps (gcc/clang: always)
        if name != "avx512bf16":
            assert not module.BF16_DOT
        elif sys.platform != "win32":
            assert module.BF16_DOT
        assert not module.AMX          # tiles only in the opt-in amx variant
    # Every variant is compiled with the same OpenMP setting.
    assert len({_backend.load_variant(n).openmp_enabled()
                for n in _backend.available_variants()}) == 1


# ------------------------------------------------------------------------------------------
# Which variant is loaded
# ------------------------------------------------------------------------------------------

def test_available_variants_match_cpu_features():
    feats = set(_backend.cpu_features())
    avail = _backend.available_variants()
    assert avail[0] == "baseline"
    assert not {"neon", "neonbf16", "amx"} & set(avail)    # opt-in only (OPT_IN)
    assert _backend.runnable_opt_in() == (
        (["neon"] if _built("neon") and "neon" in feats else [])
        + (["neonbf16"] if _built("neonbf16") and {"neon", "bf16"} <= feats else []))
    can_avx2 = {"avx", "avx2", "fma", "os_ymm"} <= feats
    assert ("avx2" in avail) == (_built("avx2") and can_avx2)
    can_avx512 = can_avx2 and {"avx512f", "avx512vl", "avx512bw", "avx512dq", "os_zmm"} <= feats
    assert ("avx512" in avail) == (_built("avx512") and can_avx512)
    can_bf16 = can_avx512 and "avx512bf16" in feats
    assert ("avx512bf16" in avail) == (_built("avx512bf16") and can_bf16)
    assert avail == [n for n in KNOWN if n in avail]          # best last
    if IS_X86_64:
        assert "sse2" in feats
    if platform.machine().lower() in ("arm64", "aarch64"):
        assert "neon" in feats


def test_loaded_variant():
    forced = os.environ.get("CYATTN_BACKEND", "").strip().lower()
    expected = forced or _backend.available_variants()[-1]
    assert _backend.variant == expected
    assert _backend.kernels is sys.modules[f"cyattn._kernels_{expected}"]
    assert _backend.kernels.VARIANT == expected
    assert cyattn.config()["variant"] == expected


def test_default_is_best_available(tmp_path):
    proc = _run(_PROBE, tmp_path, backend=None)
    assert proc.returncode == 0, proc.stderr
    variant, modules = proc.stdout.split()
    best = _backend.available_variants()[-1]
    assert variant == best
    assert modules == ",".join(sorted({"cyattn._kernels_baseline", f"cyattn._kernels_{best}"}))


def test_empty_backend_means_default(tmp_path):
    proc = _run(_PROBE, tmp_path, backend="")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == _backend.available_variants()[-1]


@pytest.mark.parametrize("name", _backend.available_variants())
def test_forcing_a_variant(tmp_path, name):
    proc = _run(_PROBE, tmp_path, backend=name)
    assert proc.returncode == 0, proc.stderr
    variant, modules = proc.stdout.split()
    assert variant == name
    # Forcing the baseline never imports another variant's module.
    assert modules == ",".join(sorted({"cyattn._kernels_baseline", f"cyattn._kernels_{name}"}))


def test_forced_variant_shown_by_info(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "cyattn", "info"], cwd=tmp_path,
                          env=_child_env("baseline"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^variant:\s+baseline \(forced by CYATTN_BACKEND=baseline\)$",
                     proc.stdout, re.M), proc.stdout


@pytest.mark.parametrize("name", ["avx512f", "native", "AVX-2", "none"])
def test_forcing_an_unknown_variant_is_an_import_error(tmp_path, name):
    proc = _run("import cyattn", tmp_path, backend=name)
    assert proc.returncode != 0
    message = (f"ImportError: cyattn: unknown kernel variant {name.lower()!r}; "
               "expected one of 'baseline', 'avx2', 'avx512', 'avx512bf16', 'amx', 'neon'")
    assert message in proc.stderr, proc.stderr


def test_load_variant_unknown_name():
    with pytest.raises(ImportError, match=r"unknown kernel variant 'sse9'; expected one of "
                                          r"'baseline', 'avx2', 'avx512', 'avx512bf16', 'amx', "
                                          r"'neon'"):
        _backend.load_variant("sse9")


@pytest.mark.parametrize("name", ["avx2", "avx512", "avx512bf16"])
def test_forcing_an_unrunnable_variant_is_an_import_error(tmp_path, name):
    if name in _backend.available_variants():
        pytest.skip(f"this build and CPU run the {name} variant")
    if _built(name):
        why = f"cyattn: this CPU cannot run the {name!r} kernel variant"
    else:
        why = f"cyattn: the {name!r} kernel variant is not built into this install"
    with pytest.raises(ImportError, match=re.escape(why)):
        _backend.load_variant(name)
    proc = _run("import cyattn", tmp_path, backend=name)
    assert proc.returncode != 0
    assert f"ImportError: {why}" in proc.stderr, proc.stderr


@pytest.mark.parametrize("name", ["neon", "neonbf16"])
def test_neon_variant_is_opt_in(tmp_path, name):
    """neon and neonbf16 (aarch64) are never the default (they have run under qemu only);
    forcing one loads it where built and the CPU runs it, elsewhere it is an ImportError that
    says why (not built; or, for neonbf16, no FEAT_BF16)."""
    assert name not in _backend.available_variants()
    proc = _run(_PROBE, tmp_path, backend=name)
    if _built(name) and _backend._NEEDS[name] <= set(_backend.cpu_features()):
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split()[0] == name
        default = _run(_PROBE, tmp_path)
        assert default.returncode == 0 and default.stdout.split()[0] == "baseline"
    elif _built(name):
        assert proc.returncode != 0 and "bf16" in proc.stderr, proc.stderr
    else:
        assert f"the {name!r} kernel variant is not built into this install" in proc.stderr


def test_amx_variant_is_opt_in(tmp_path):
    """The amx variant is never the default; forcing it loads it only where CPUID, XCR0 and
    Linux allow tiles, else an ImportError that names what is missing."""
    assert "amx" not in _backend.available_variants()
    if not _built("amx"):
        pytest.skip("no amx variant in this build")
    proc = _run(_PROBE, tmp_path, backend="amx")
    if proc.returncode == 0:                  # an AMX host that grants the tile state
        assert proc.stdout.split()[0] == "amx"
        return
    assert "ImportError: cyattn:" in proc.stderr, proc.stderr
    # The child may run on another CPU than this process (qemu_baseline_check runs the suite
    # under an emulated pre-AVX CPU, where it lacks far more than the tiles), so the test asks
    # only that every tile feature this CPU lacks is among those the message names.
    missing = sorted({"amx_bf16", "amx_tile", "os_tile"} - set(_backend.cpu_features()))
    if missing:
        named = re.search(r"cannot run the 'amx' kernel variant .*amx also needs (\[[^\]]*\])",
                          proc.stderr)
        assert named, proc.stderr
        assert set(missing) <= set(ast.literal_eval(named.group(1))), proc.stderr
    else:
        assert "Linux refused the tile data state" in proc.stderr, proc.stderr
    info = subprocess.run([sys.executable, "-m", "cyattn", "info"], cwd=tmp_path,
                          env=_child_env(None), capture_output=True, text=True, timeout=120)
    assert re.search(r"^amx:\s+unavailable: ", info.stdout, re.M), info.stdout


# ------------------------------------------------------------------------------------------
# Free-threaded CPython
# ------------------------------------------------------------------------------------------

@pytest.mark.skipif(not sysconfig.get_config_var("Py_GIL_DISABLED"),
                    reason="needs a free-threaded CPython build")
def test_free_threaded_gil_stays_disabled(tmp_path):
    code = ("import sys, warnings\n"
            "warnings.simplefilter('error')\n"   # 'the GIL has been enabled' is a RuntimeWarning
            "import cyattn\n"
            "from cyattn import _backend\n"
            "for name in _backend.available_variants():\n"
            "    _backend.load_variant(name)\n"
            "print(sys._is_gil_enabled())\n")
    env = _child_env()
    env.pop("PYTHON_GIL", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False", proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------
# Wheels: OpenMP and its vendored runtime
# ------------------------------------------------------------------------------------------

def test_openmp_as_expected(tmp_path):
    want = os.environ.get("CYATTN_EXPECT_OPENMP", "").strip()
    if want not in ("0", "1"):
        pytest.skip("CYATTN_EXPECT_OPENMP is not set")
    assert cyattn.config()["openmp"] is (want == "1")
    proc = subprocess.run([sys.executable, "-m", "cyattn", "info"], cwd=tmp_path,
                          env=_child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = "openmp:             on" if want == "1" else \
        "openmp:             off (kernels run single-threaded)"
    assert line in proc.stdout.splitlines(), proc.stdout


def test_openmp_runtime_vendored():
    want = os.environ.get("CYATTN_EXPECT_VENDORED", "").strip().lower()
    if not want:
        pytest.skip("CYATTN_EXPECT_VENDORED is not set")
    libs = Path(cyattn.__file__).resolve().parent.parent / "cyattn.libs"
    names = sorted(p.name for p in libs.iterdir()) if libs.is_dir() else []
    assert any(n.lower().startswith(want) for n in names), (
        f"no {want}* in {libs} (found: {names})")
    if sys.platform.startswith("linux"):
        # The kernels (imported above) use the vendored copy, not one from the system.
        with open("/proc/self/maps") as fh:
            mapped = {line.split()[-1] for line in fh if want in line.lower()}
        assert mapped, f"{want} is not loaded"
        assert any(str(libs) in m for m in mapped), mapped


@pytest.mark.skipif(not sys.platform.startswith("linux") or sysconfig.get_config_var("CC") is None
                    or "gcc" not in (sysconfig.get_config_var("CC") or ""),
                    reason="checks symbols of a gcc build on Linux")
@pytest.mark.parametrize("name", _backend.available_variants())
def test_attention_micro_kernels_not_inlined(name):
    """The micro-kernels and the online softmax stay functions of their own (the noinline
    prototypes in _kernel_common.pxi): inlined into the fused worker they ran 1.8-2.7x slower.
    Reads the symbol table with nm; skipped where there is none (stripped wheels)."""
    path = _backend.load_variant(name).__file__
    try:
        proc = subprocess.run(["nm", path], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        pytest.skip("nm not available")
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.skip("no symbol table (stripped)")
    # both specialisations of the fused online softmax (float32 is __pyx_fuse_0), and the
    # bf16 fast path's (the avx512bf16 variant once had no noinline prototypes at all)
    for symbol in ("micro_kernel_f32", "micro_kernel_f64",
                   r"fuse_0__pyx_f_\S*panel_online_softmax",
                   r"fuse_1__pyx_f_\S*panel_online_softmax", "bf16_panel_softmax"):
        assert re.search(rf"\s[tT]\s\S*{symbol}", proc.stdout), symbol
