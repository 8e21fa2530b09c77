"""Where a trained MTP head came from, as its GGUF records it (``tandem.drafter.*`` keys): what ``tandem
train-drafter`` writes and ``/api/show`` reports."""

from __future__ import annotations

from typing import Any, Mapping

PROVENANCE_PREFIX = "tandem.drafter."


def read_provenance(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The ``tandem.drafter.*`` keys of a GGUF's metadata, without the prefix (empty: not a trained head). A
    fraction is stored as a float32 (0.313 reads back as 0.31299999356...): it is given to the 4 places written."""
    return {k[len(PROVENANCE_PREFIX):]: round(v, 4) if isinstance(v, float) else v
            for k, v in metadata.items() if k.startswith(PROVENANCE_PREFIX)}
