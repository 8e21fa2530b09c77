"""Building models into the blob store: from a Modelfile or an `/api/create` body, GGUF in, layers out."""

from . import hf_source
from .create import create_model
from .from_modelfile import BlobSink, request_from_modelfile
from .request import CreateError, CreateRequest, ProgressEvent
from .sinks import LocalBlobSink

__all__ = [
    "BlobSink",
    "CreateError",
    "CreateRequest",
    "LocalBlobSink",
    "ProgressEvent",
    "create_model",
    "hf_source",
    "request_from_modelfile",
]
