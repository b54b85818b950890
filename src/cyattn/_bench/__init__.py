"""The benchmark harness of ``python -m cyattn bench`` (quick) and ``bench --full``.

Measurement rules (see bench/README.md in the repository for the full harness):

* Samples of the implementations are **interleaved** (A B A B ...) so that drift in clock speed
  and background load hits both alike; each sample runs a calibrated number of calls (at least
  ``target`` seconds) and records the time per call. We report the median per implementation
  and the **median of the paired ratios** (NumPy time / cyattn time of the same round).
* NumPy's BLAS is pinned to the same thread count as cyattn with ``threadpoolctl`` when it is
  installed (it limits the OpenMP runtime too, which is how :func:`cyattn.softmax`, which has no
  ``n_threads`` argument, gets the same count). Without it the quick bench re-runs itself in a
  child process whose ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` and
  ``BLIS_NUM_THREADS`` are its one thread count (:data:`THREAD_ENV_VARS`: read when numpy and
  the OpenMP runtime load), and the table names them; the full harness, which runs several
  thread counts in one process, says it is not limited.
* ``OPENBLAS_CORETYPE`` / ``OPENBLAS_L2_SIZE`` in the environment make OpenBLAS pick slow kernels
  (up to 5x). They act when numpy is loaded, so the bench re-runs itself in a child process
  without them (:func:`blas_env_overrides`, :func:`rerun_without_blas_overrides`) and says so.
* With more than one thread, OpenBLAS workers busy-spin for ~0.1 s after a call, which would
  slow whatever runs next on a small machine: samples are then separated by a pause, and
  untimed calls for 0.1 s after it keep the slow calls after a sleep out of the sample.

The full harness (``python -m cyattn bench --full``, ``bench/run.py`` in a checkout) lives here
too, so that it runs from an installed package: cyattn vs NumPy vs PyTorch (when installed) on
the cases of :func:`build_specs`, with the machine's FMA peak (:func:`measure_fma_peak`) and
streaming read bandwidth (:func:`measure_read_bandwidth`), peak memory growth per case in a fresh
process (:func:`measure_memory`), a Markdown report (:func:`render_markdown`) and a PNG plot
(:func:`write_plot`, needs matplotlib). Only NumPy is required; torch, threadpoolctl and
matplotlib are used when installed.

One concern per module; this package re-exports the names its callers use
(``cyattn.__main__``, bench/run.py, bench/bench_mha.py, the tests):

- ``timing``: environment (OpenBLAS overrides, child processes, thread limits) and the
  interleaved, paired-ratio timing; the progress bar.
- ``quick``: the quick bench (cyattn vs NumPy, one thread count, a printed table).
- ``cases``: the full harness's case table (:class:`Spec`, :func:`build_specs`), the inputs and
  timed calls of each implementation (:func:`prepare`), the result check (:func:`check_case`).
- ``machine``: FMA peak, read bandwidth, CPU name.
- ``memory``: peak memory growth of one call in a fresh process.
- ``runner``: :func:`run_full`, the full harness's measurement loop.
- ``report``: the Markdown report; ``plot``: the PNG plot.
- ``cli``: the options of ``bench --full`` and :func:`full_main`.
"""
from .cases import (DECODE_SHAPE, DECODE_SHORT_SHAPE, FULL_GROUPS, HEAD_DIM, IMPLS, KV_READ,
                    MATMUL_N, QUICK_SELECTION, SDPA_BHT, SDPA_KINDS, SOFTMAX_L, TINY_SHAPE, Spec,
                    build_specs, check_case, np_attention, np_masked_softmax, np_softmax,
                    padding_keep, prepare, sdpa_flops, select_specs, torch_module)
from .cli import (FULL_SETTINGS, add_full_arguments, check_full_arguments, checkout_root,
                  default_outdir, full_main, parse_thread_list)
from .machine import measure_fma_peak, measure_read_bandwidth, read_once
from .memory import measure_memory, memory_supported
from .plot import PLOT_NAME, write_plot
from .quick import BenchCase, quick_cases, run_quick_bench
from .report import fmt_size, fmt_time, render_markdown
from .runner import run_full
from .timing import (BLAS_ENV_VARS, THREAD_ENV_VARS, Progress, blas_env_overrides, calibrate,
                     child_env, interleaved, paired_ratio, rerun_without_blas_overrides,
                     summary, thread_limits)

__all__ = ["BLAS_ENV_VARS", "THREAD_ENV_VARS", "blas_env_overrides",
           "rerun_without_blas_overrides", "child_env", "calibrate", "interleaved", "summary",
           "paired_ratio", "Progress", "thread_limits",
           "np_softmax", "np_masked_softmax", "np_attention", "quick_cases", "run_quick_bench",
           "FULL_GROUPS", "Spec", "sdpa_flops", "build_specs", "select_specs", "prepare",
           "measure_fma_peak", "measure_read_bandwidth", "measure_memory", "run_full",
           "render_markdown", "write_plot", "add_full_arguments", "check_full_arguments",
           "full_main", "checkout_root", "default_outdir", "parse_thread_list"]
# also used by the tests and the bench scripts
__all__ += ["IMPLS", "KV_READ", "HEAD_DIM", "SDPA_KINDS", "SDPA_BHT", "SOFTMAX_L", "MATMUL_N",
            "DECODE_SHAPE", "DECODE_SHORT_SHAPE", "TINY_SHAPE", "QUICK_SELECTION", "FULL_SETTINGS",
            "PLOT_NAME", "BenchCase", "check_case", "padding_keep", "torch_module", "read_once",
            "memory_supported", "fmt_size", "fmt_time"]
