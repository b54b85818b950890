"""cyattn: fast, thread-safe transformer attention on CPUs, compiled with Cython.

Public functions work on NumPy arrays: :func:`softmax`, :func:`log_softmax`,
:func:`matmul_accumulate`, :func:`scaled_dot_product_attention`,
:func:`multi_head_attention` and :class:`MultiHeadAttention`; :func:`attention_weights` returns
the softmax weights of an attention call (for inspection; :mod:`cyattn.plot`, an optional
extra needing matplotlib, draws them). :mod:`cyattn.oracle` is a
pure-Python reference of the same functions. ``python -m cyattn`` prints the configuration,
checks the kernels against the oracle and runs a short benchmark.
"""
from ._backend import (kernels as _kernels, variant as _variant, cpu_features as _cpu_features,
                       max_threads as _max_threads)
from .softmax import softmax, log_softmax
from .matmul import matmul_accumulate
from .attention import scaled_dot_product_attention
from .weights import attention_weights
from .mha import multi_head_attention, MultiHeadAttention
from . import oracle

__version__ = "0.1.0"

__all__ = [
    "softmax", "log_softmax", "matmul_accumulate", "scaled_dot_product_attention",
    "multi_head_attention", "MultiHeadAttention", "attention_weights", "oracle", "show_config",
    "config", "__version__",
]


def config():
    """Build and runtime configuration as a dict.

    Keys: ``version``, ``variant`` (the loaded kernel variant), ``available_variants``,
    ``cpu_features``, ``openmp`` (whether the kernels were built with OpenMP),
    ``default_threads`` (what ``n_threads=None`` uses now), ``cpu_count``, ``bf16_matmul``
    (which path a bfloat16 :func:`matmul_accumulate` takes by default, and what
    ``precision="fast"`` runs) and ``bf16_attention`` (the same for
    :func:`scaled_dot_product_attention`), each with the reason of the rule that chose it
    (``cyattn._backend.bf16_path``: keyed on CPUID's vendor, family and features), and
    ``amx`` (whether the opt-in AMX variant can load here, and why not).
    """
    import os
    from ._backend import amx_status, available_variants
    from .attention import default_bf16_path as attention_bf16_path
    from .matmul import default_bf16_path
    return {
        "version": __version__,
        "variant": _variant,
        "available_variants": available_variants(),
        "cpu_features": _cpu_features(),
        "openmp": _kernels.openmp_enabled(),
        "default_threads": _max_threads(),
        "cpu_count": os.cpu_count(),
        "bf16_matmul": default_bf16_path(),
        "bf16_attention": attention_bf16_path(),
        "amx": amx_status(),
    }


def show_config():
    """Print :func:`config` as ``key: value`` lines."""
    for k, v in config().items():
        if isinstance(v, list):
            v = ", ".join(v) if v else "-"
        print(f"{k + ':':<20}{v}")
