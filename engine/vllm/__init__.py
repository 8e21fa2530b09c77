"""The vllm engine: a model served by vLLM behind tandem's API (``PARAMETER engine vllm``).

One module per job: ``server`` (starting and stopping vLLM, under ``reaper``), ``api`` (the HTTP calls),
``translate`` (requests, refusals and statistics between tandem and vLLM) and ``runtime`` (what the engine
process drives). The launch itself (which folders, which speculative method, vLLM's arguments) is planned by the
server, so it lives in the contract: ``engine.contract.vllm_launch``.
"""
