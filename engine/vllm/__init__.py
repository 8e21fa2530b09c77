"""The vllm engine: a model served by vLLM behind tandem's API (``PARAMETER engine vllm``).

One module per job: ``launch`` (the typed launch and vLLM's arguments; torch-free, the server builds it),
``server`` (starting and stopping vLLM, under ``reaper``), ``api`` (the HTTP calls), ``translate`` (requests,
refusals and statistics between tandem and vLLM) and ``runtime`` (what the engine process drives).
"""
