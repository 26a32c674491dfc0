"""Errors a user can cause, each carrying the place (file, field) and what is wrong.

The CLI turns these into one clear message and a non-zero exit; nothing else is printed for them.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: a file, a field, a flag. Exit code 2."""

    exit_code = 2


class JobFailed(Exception):
    """The job ran and could not be kept alive (budget spent, unrecoverable fault). Exit code 1."""

    exit_code = 1
