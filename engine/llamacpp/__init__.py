"""The llamacpp engine (``PARAMETER engine llamacpp``, or ``engine auto`` for a model the native engine does not run):
the engine process drives a ``LlamaCppRuntime`` (runtime.py) in place of a ``ModelRuntime``, forwarding to a
llama-server it starts (server.py, under engine/process/reaper.py) or attaches to (``TANDEM_LLAMACPP_URL``), as the
contract's llamacpp_launch.py planned it; api.py is the HTTP calls, translate.py the request body and statistics."""
