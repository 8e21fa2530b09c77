"""Pull and push like Ollama: the Ollama library and any OCI distribution registry (names resolved as Ollama resolves
them, ``TANDEM_REGISTRY`` for the default host), resumable and verified pulls, pushes that keep every layer."""

from .auth import Credentials
from .download import Downloads, PullSettings
from .errors import RegistryError
from .pull import pull_model
from .push import push_model
from .reference import RegistryRef, resolve

__all__ = ["Credentials", "Downloads", "PullSettings", "RegistryError", "RegistryRef", "pull_model", "push_model",
           "resolve"]
