"""Type stubs for the AVX-512 kernel variant: the same API as the baseline variant."""
from typing import Literal

from ._kernels_baseline import *  # noqa: F403  (every variant module has the same functions)

VARIANT: Literal["avx512"]
