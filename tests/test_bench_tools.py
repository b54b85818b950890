"""The bench tools of issue 38 (bench/README.md).

* tools/ab_builds.py, the A/B of two builds per kernel variant: it runs, prints a ratio per
  case and variant, and refuses what it cannot compare. The installed build is compared with
  itself through a second directory (a link to the package), so no second build is needed; the
  timing itself is not asserted (no timed tests).
* tools/ab_inprocess.py, the in-process A/B of builds of one variant: it runs (the loaded
  variant's module given twice), prints a ratio per build, and refuses a bad case, a missing
  file and builds of two variants.
* tools/avx2_host.sh: a command run through it sees a CPU without AVX-512, so cyattn (like the
  peers) picks its AVX2 kernels; where the host has AVX-512 and CPUID faulting.
"""
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import child_env

import cyattn
from cyattn import _backend

TOOL = Path(__file__).resolve().parents[1] / "tools" / "ab_builds.py"
pytestmark = pytest.mark.skipif(not TOOL.is_file(), reason="tools/ab_builds.py not in this tree")


def _run(*args, cwd):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], cwd=cwd,
                          env=child_env(None, clear_backend=True), capture_output=True,
                          text=True, timeout=300)


def _sites(tmp_path):
    site = Path(cyattn.__file__).resolve().parent.parent
    other = tmp_path / "other"
    other.mkdir()
    try:
        os.symlink(site / "cyattn", other / "cyattn", target_is_directory=True)
    except OSError as exc:                  # e.g. Windows without the symlink privilege
        pytest.skip(f"cannot link the package: {exc}")
    return site, other


def test_ab_builds_prints_a_ratio_per_case_and_variant(tmp_path):
    site, other = _sites(tmp_path)
    variant = _backend.variant
    res = _run(site, other, "--variants", f"{variant},no-such-variant", "--only", "tiny",
               "--only", "matmul n=64", "--rounds", 1, "--samples", 1, "--min-time", 0,
               "--noise", 10, "--json", tmp_path / "ab.json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows = [line for line in res.stdout.splitlines() if line.startswith(f"| {variant} | 1 |")]
    assert len(rows) == 2, res.stdout
    assert any("tiny (1,1,8,8)" in r for r in rows) and any("matmul n=64" in r for r in rows)
    for r in rows:
        ratio = float(r.split("|")[6])
        assert ratio > 0
    assert "variant no-such-variant skipped" in res.stdout
    assert "no case slower beyond noise" in res.stdout
    assert (tmp_path / "ab.json").stat().st_size > 0


def test_ab_builds_refuses_the_same_build_twice_and_a_missing_one(tmp_path):
    site, _ = _sites(tmp_path)
    res = _run(site, site, cwd=tmp_path)
    assert res.returncode == 2 and "same directory" in res.stderr
    res = _run(site, tmp_path / "nowhere", cwd=tmp_path)
    assert res.returncode != 0 and "no cyattn package" in res.stderr


def _cpuid_faulting():
    try:
        with open("/proc/cpuinfo") as fh:
            return " cpuid_fault" in fh.read()
    except OSError:
        return False


@pytest.mark.skipif(not (sys.platform.startswith("linux") and "avx512f" in _backend.cpu_features()
                         and _cpuid_faulting() and shutil.which(os.environ.get("CC", "cc"))),
                    reason="needs Linux on an AVX-512 CPU with CPUID faulting, and a C compiler")
def test_avx2_host_hides_avx512_from_the_process(tmp_path):
    code = ("import cyattn; from cyattn import _backend; "
            "print(cyattn.config()['variant'], 'avx512f' in _backend.cpu_features())")
    res = subprocess.run(["bash", str(TOOL.parent / "avx2_host.sh"), sys.executable, "-c", code],
                         cwd=tmp_path, env=child_env(None, clear_backend=True),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["avx2", "False"]
    res = subprocess.run(["bash", str(TOOL.parent / "avx2_host.sh")], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and "usage" in res.stderr


IPF = TOOL.parent / "insn_per_flop.py"


@pytest.mark.skipif(not (sys.platform.startswith("linux") and platform.machine() == "x86_64"
                         and shutil.which("qemu-x86_64") and shutil.which("gcc")),
                    reason="needs Linux x86-64 with qemu-x86_64 (qemu-user) and gcc")
def test_insn_per_flop_counts_the_same_call_the_same(tmp_path):
    """tools/insn_per_flop.py (issue 47): the plugin's marks give a per-call count of one GEMM
    that two runs (2 calls, 1 call) agree on within 1 % and that is in the range of a
    vectorised GEMM, so bench/results/aarch64_insn.md's figures count the calls, not start-up."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("insn_per_flop", IPF)
    ipf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ipf)
    plugin = tmp_path / "libqemu_insn_count.so"
    ipf.build_plugin(plugin)
    env = dict(child_env(None, clear_backend=True), CYATTN_BACKEND="avx2", OMP_NUM_THREADS="1")
    cmd = [shutil.which("qemu-x86_64"), "-cpu", "max", "-plugin", str(plugin), sys.executable]
    variant, per_call = ipf.count(cmd, env, 2, ["gemm"])
    assert variant == "avx2"
    flops = ipf.SIZES["gemm"][0]
    _, again = ipf.count(cmd, env, 1, ["gemm"])
    assert abs(per_call["gemm"] - again["gemm"]) <= 0.01 * again["gemm"]
    assert 0.06 < per_call["gemm"] / flops < 0.3      # 12 FMAs (192 flops) in a 23-insn loop


INPROC = TOOL.parent / "ab_inprocess.py"


def _run_inproc(*args):
    return subprocess.run([sys.executable, str(INPROC), *map(str, args)],
                          env=child_env(None, clear_backend=True), capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("case", ["sdpa:1,2,8,8", "matmul:8", "softmax:3,16"])
def test_ab_inprocess_prints_a_ratio_per_build(case):
    so = _backend.load_variant("baseline").__file__
    res = _run_inproc(so, so, "--case", case, "--rounds", "2", "--samples", "1")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith(case.split(":")[0] + " (") and "2 rounds" in lines[0]
    assert len(lines) == 2 and lines[1].strip().startswith(so + ": median ")


def test_ab_inprocess_refuses_what_it_cannot_compare(tmp_path):
    so = _backend.load_variant("baseline").__file__
    res = _run_inproc(so, so, "--case", "sdpa:1,2")
    assert res.returncode == 2 and "expected sdpa:B,H,L,E" in res.stderr
    res = _run_inproc(so, tmp_path / "missing.so")
    assert res.returncode == 2 and "is not a file" in res.stderr
    res = _run_inproc(so)
    assert res.returncode == 2 and "need two builds" in res.stderr
    other = [v for v in _backend.available_variants() if v != "baseline"]
    if other:
        res = _run_inproc(so, _backend.load_variant(other[0]).__file__, "--rounds", "1")
        assert res.returncode == 1 and "not loadable as _kernels_baseline" in res.stderr
