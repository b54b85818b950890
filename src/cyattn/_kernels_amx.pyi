"""Type stubs for the AVX-512 + AVX512-BF16 + AMX kernel variant (opt-in): the same API as the baseline variant."""
from typing import Literal

from ._kernels_baseline import *  # noqa: F403  (every variant module has the same functions)

VARIANT: Literal["amx"]
