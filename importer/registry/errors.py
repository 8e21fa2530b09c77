"""The one error a registry pull or push raises: its text is what Ollama says for the same fault."""

from __future__ import annotations

from importer.hf.errors import CreateError


class RegistryError(CreateError):
    """A pull or push that cannot go on; ``status`` is the HTTP status of a ``stream: false`` answer (Ollama answers
    a failed pull or push with 500, an invalid name with 400)."""

    def __init__(self, message: str, status: int = 500):
        super().__init__(message, status)
