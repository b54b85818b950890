"""Type stubs for the neonbf16 kernel variant (aarch64, FEAT_BF16): the baseline's API."""
from typing import Literal

from ._kernels_baseline import *  # noqa: F403  (every variant module has the same functions)

VARIANT: Literal["neonbf16"]
