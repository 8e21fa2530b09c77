"""The engine process: the model runtime, its caches, kernels, sampling and speculation. Started by the server by
module name (``engine.process.worker``); what the two processes share is ``engine.contract``."""
