"""Building models into the blob store: from a Modelfile or an `/api/create` body, GGUF in, layers out."""

from . import hf_source
from .create import create_model, discard_quietly, discarding_new_blobs_on_error
from .from_modelfile import BlobSink, request_from_modelfile
from .path_gate import PathGate
from .request import CreateError, CreateRequest, ProgressEvent
from .sinks import LocalBlobSink

__all__ = [
    "BlobSink",
    "CreateError",
    "CreateRequest",
    "LocalBlobSink",
    "PathGate",
    "ProgressEvent",
    "create_model",
    "discard_quietly",
    "discarding_new_blobs_on_error",
    "hf_source",
    "request_from_modelfile",
]
