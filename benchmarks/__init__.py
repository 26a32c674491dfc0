"""The benchmarks (docs/benchmarks.md), each a script run from the repo root.

recovery.py, checkpoint.py, policy.py and layout.py run as files (`python benchmarks/recovery.py`,
as `make bench` does) and share benchmarks/harness.py, imported as `harness` from their own folder;
their parts (policy_*.py, checkpoint_*.py) are imported the same way. operator_scale.py runs as a
module of this package (`python -m benchmarks.operator_scale`), so that the repo root is on sys.path
for the emulated API server of the test suite (tests/support/); its parts (operator_scale_*.py) are
imported as modules of this package.
"""
