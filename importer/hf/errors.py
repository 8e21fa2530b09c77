"""The one error a create raises for bad input (re-exported as ``importer.CreateError``).

It lives here, below ``importer/architectures/`` and the conversion machinery that raise most of them, so that
those folders need nothing of the importer's top level.
"""

from __future__ import annotations


class CreateError(Exception):
    """A create that cannot proceed. ``status`` is the HTTP status the API answers with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def fail(role: str, message: str) -> CreateError:
    """The error for a model in ``role`` (FROM, DRAFT, ...): its message starts with the role."""
    return CreateError(f"{role}: {message}")
