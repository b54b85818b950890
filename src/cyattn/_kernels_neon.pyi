"""Type stubs for the NEON kernel variant (aarch64): the same API as the baseline variant."""
from typing import Literal

from ._kernels_baseline import *  # noqa: F403  (every variant module has the same functions)

VARIANT: Literal["neon"]
