"""Reading the user's JSON input files (grid, prompts) with one kind of error message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json(path: str | Path, what: str, error: type[Exception]) -> Any:
    """The parsed contents of ``path``; ``error`` (naming ``what``, e.g. "grid") when it cannot be read."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise error(f"cannot read the {what} file: {e}") from None
    except ValueError as e:
        raise error(f"the {what} file {path} is not valid JSON: {e}") from None
