"""The bfloat16 path follows the CPU (issue 45): cyattn._backend.bf16_path, a pure function of
CPUID's facts, checked for each CPU class; what ``precision=None`` resolves to with the loaded
kernels; and that ``info``/``config()`` name the path and its reason.

On Intel, vdpbf16ps runs at 0.5x the float32 FMA rate (shared/amx/README.md), so the default
there is the exact (widening) path; on AMD Zen 4 and later it runs at about 2x, so the default
is the fast path. The opt-in amx variant makes bf16 ``matmul_accumulate`` run on tiles.
"""
import subprocess
import sys

import pytest
from conftest import child_env

import cyattn
from cyattn import _backend
from cyattn.matmul import _resolve_precision

AVX512 = ["sse2", "avx", "fma", "avx2", "os_ymm", "avx512f", "avx512bw", "avx512dq",
          "avx512vl", "os_zmm", "f16c"]
BF16 = AVX512 + ["avx512bf16"]
AMX = BF16 + ["amx_bf16", "amx_tile", "os_tile"]
AVX2 = ["sse2", "avx", "fma", "avx2", "os_ymm", "f16c"]

# (CPU class, vendor, family, features, kernels have vdpbf16ps, kernels have tiles) -> path
CASES = [
    ("Intel Sapphire Rapids", "GenuineIntel", 6, AMX, True, False, "exact"),
    ("Intel Granite Rapids", "GenuineIntel", 6, AMX, True, False, "exact"),
    ("Intel Cooper Lake", "GenuineIntel", 6, BF16, True, False, "exact"),
    ("Intel SPR, amx variant forced", "GenuineIntel", 6, AMX, True, True, "amx"),
    ("Intel Skylake-X", "GenuineIntel", 6, AVX512, False, False, "exact"),
    ("Intel AVX2 only", "GenuineIntel", 6, AVX2, False, False, "exact"),
    ("AMD Zen 4", "AuthenticAMD", 0x19, BF16, True, False, "fast"),
    ("AMD Zen 5", "AuthenticAMD", 0x1A, BF16, True, False, "fast"),
    ("AMD Zen 5, avx512 variant forced", "AuthenticAMD", 0x1A, BF16, False, False, "exact"),
    ("AMD Zen 3", "AuthenticAMD", 0x19, AVX2, False, False, "exact"),
    ("AMD Zen 2", "AuthenticAMD", 0x17, AVX2, False, False, "exact"),
    ("Hygon Dhyana", "HygonGenuine", 0x18, AVX2, False, False, "exact"),
    ("other vendor with AVX512-BF16", "CentaurHauls", 7, BF16, True, False, "exact"),
    ("aarch64", "", 0, ["neon"], False, False, "exact"),
    ("aarch64 with FEAT_BF16, default variant", "", 0, ["neon", "fp16", "bf16"], False, False,
     "exact"),
]
# aarch64 with the opt-in neonbf16 variant loaded (kernels with BFDOT): the fast path
ARM_CASES = [
    ("Graviton3, neonbf16 forced", ["neon", "fp16", "bf16", "i8mm", "sve"], True, "fast"),
    ("Graviton3, neon forced", ["neon", "fp16", "bf16", "i8mm", "sve"], False, "exact"),
    ("Graviton2", ["neon", "fp16"], False, "exact"),
]


@pytest.mark.parametrize("name, vendor, family, feats, dot, amx, path", CASES,
                         ids=[c[0] for c in CASES])
def test_rule_per_cpu_class(name, vendor, family, feats, dot, amx, path):
    got, why = _backend.bf16_path(vendor, family, feats, dot, amx)
    assert got == path
    assert isinstance(why, str) and why
    # deterministic: the same facts give the same answer
    assert _backend.bf16_path(vendor, family, feats, dot, amx) == (got, why)


@pytest.mark.parametrize("name, feats, arm, path", ARM_CASES, ids=[c[0] for c in ARM_CASES])
def test_rule_on_aarch64(name, feats, arm, path):
    got, why = _backend.bf16_path("", 0, feats, False, False, arm)
    assert got == path
    if arm:
        assert "BFDOT" in why and "neonbf16" in why
    elif "bf16" in feats:
        assert "CYATTN_BACKEND=neonbf16" in why and "AVX512" not in why
    else:
        assert "no FEAT_BF16" in why


def test_reasons_say_why():
    assert "0.5x" in _backend.bf16_path("GenuineIntel", 6, BF16, True, False)[1]
    assert "CYATTN_BACKEND=amx" in _backend.bf16_path("GenuineIntel", 6, AMX, True, False)[1]
    assert "CYATTN_BACKEND=amx" not in _backend.bf16_path("GenuineIntel", 6, BF16, True,
                                                          False)[1]
    assert "Zen 4" in _backend.bf16_path("AuthenticAMD", 0x19, BF16, True, False)[1]
    assert "emulation" in _backend.bf16_path("GenuineIntel", 6, AVX2, False, False)[1]


def test_cpu_identity_probe():
    vendor, family, model = _backend._kernels_baseline.cpu_identity()
    assert isinstance(vendor, str) and isinstance(family, int) and isinstance(model, int)
    if "avx2" in _backend.cpu_features():
        assert len(vendor) == 12 and family > 0


def test_default_follows_rule(monkeypatch):
    for name in _backend.available_variants():
        k = _backend.load_variant(name)
        path, _ = _backend.default_bf16_path(k)
        monkeypatch.setattr(_backend, "kernels", k)
        assert _resolve_precision(None) == ("exact" if path == "exact" else "fast")
        # attention has no tile kernel: its default is fast only on the vdpbf16ps rule
        assert _resolve_precision(None, tiles=False) == ("fast" if path == "fast" else "exact")
        # an explicit precision keeps its meaning on every CPU
        assert _resolve_precision("fast") == "fast"
        assert _resolve_precision("exact") == "exact"


def test_intel_default_is_exact(monkeypatch):
    """The rule applied to the loaded kernels as an Intel CPU with AVX512-BF16 would see it."""
    monkeypatch.setattr(_backend, "_DOT_IS_FAST", False)
    monkeypatch.setattr(_backend, "kernels", _backend.load_variant("baseline"))
    assert _resolve_precision(None) == "exact"

    class DotKernels:
        BF16_DOT = True
        AMX = False

    monkeypatch.setattr(_backend, "kernels", DotKernels)
    assert _resolve_precision(None) == "exact"
    assert _resolve_precision(None, tiles=False) == "exact"

    class TileKernels:
        BF16_DOT = True
        AMX = True

    monkeypatch.setattr(_backend, "kernels", TileKernels)
    assert _resolve_precision(None) == "fast"                 # matmul on tiles
    assert _resolve_precision(None, tiles=False) == "exact"   # attention: vdpbf16ps is slow


def test_config_and_info_name_the_path(tmp_path):
    cfg = cyattn.config()
    path, why = _backend.default_bf16_path()
    assert why in cfg["bf16_matmul"]
    assert cfg["bf16_matmul"].startswith("exact" if path == "exact" else "fast")
    assert "amx" in cfg
    proc = subprocess.run([sys.executable, "-m", "cyattn", "info"], cwd=tmp_path,
                          env=child_env(None, clear_backend=True), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(":", 1) for line in proc.stdout.splitlines()[1:] if ":" in line)
    assert "[" in lines["bf16_matmul"] and "[" in lines["bf16_attention"]
    assert lines["amx"].strip()
