"""Type stubs for the opt-in AMX kernel variant (avx512bf16 + AMX-TILE/AMX-BF16): the same API as
the baseline variant."""
from typing import Literal

from ._kernels_baseline import *  # noqa: F403  (every variant module has the same functions)

VARIANT: Literal["amx"]
