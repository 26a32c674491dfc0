"""What the tests share: helpers, fakes and emulators imported by test modules and conftest.py.

No test module imports another (tests/unit/test_suite_layout.py checks it): a helper two test files
need lives here, and pytest fixtures stay in conftest.py files.
"""
