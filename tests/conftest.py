"""CPU compile options for the test session, set before jax starts its backend.

The tests run many small programs once each, so XLA's compile time dominates: LLVM at -O0
compiles them about a third faster (measured on tests/test_language.py: 95 s vs 140 s)
and computes the same functions (the golden and equivalence tests hold). The tests that
start processes pass this XLA_FLAGS on, with their device counts appended.
"""

import os

TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = f"{TEST_XLA_FLAGS} {os.environ.get('XLA_FLAGS', '')}".strip()

pytest_plugins = ("gcs_emulator",)  # The `bucket` fixture: a GCS emulator, gs://mpx-test.
