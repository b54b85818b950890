#!/usr/bin/env python3
"""Coverage-guided fuzzing of cyattn's public API with atheris (libFuzzer for Python).

Each input is decoded by ``api_checks.check_one`` into one call of softmax, log_softmax,
matmul_accumulate, scaled_dot_product_attention or multi_head_attention (dtype, shapes,
layout, masks, flags, out=, n_threads, NaN/inf values, deliberate faults) and the result is
checked against cyattn's contract and the oracle; a contract violation raises FuzzFailure,
which atheris reports as a crash and saves as ``crash-<sha1>``. The decoding and checking live
in ``api_checks.py`` and the ``checks_*.py`` modules it combines (no atheris needed), so
``tests/test_fuzz_corpus.py`` replays the corpus with plain pytest.

Usage (libFuzzer flags pass through; see tools/fuzz_check.sh for a bounded run):

    python fuzz/fuzz_api.py NEW_CORPUS_DIR fuzz/corpus -max_total_time=60 -timeout=20
    python fuzz/fuzz_api.py crash-1234...          # replay one input
    python fuzz/api_checks.py FILE...              # explain/replay inputs without atheris

Coverage feedback comes from cyattn's Python modules (validation, dispatch, mha; not the
oracle) and from the harness's own decoder (which branch of the input space an input reached);
the compiled kernels are not instrumented (that needs a -fsanitize=fuzzer build), so they are
covered through the paths that reach them and checked by their results.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_check_one = None


def TestOneInput(data):  # noqa: N802 - the name atheris and libFuzzer use
    _check_one(data)


def main():
    global _check_one
    import atheris

    # cyattn.oracle is the reference, not the code under test: instrumenting its pure-Python
    # loops would cost most of the time of an execution
    with atheris.instrument_imports(include=["cyattn", "api_checks", "checks_common",
                                             "checks_softmax", "checks_attention",
                                             "checks_matmul", "checks_mha",
                                             "checks_variants"],
                                    exclude=["cyattn.oracle"]):
        import api_checks
    _check_one = api_checks.check_one
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
