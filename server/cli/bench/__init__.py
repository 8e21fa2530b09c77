"""`tandem bench`: speculation settings measured through a running server's API.

Modules: ``grid`` (the settings swept), ``prompts`` (prompt sets), ``runner`` (the paired, interleaved
speed sweep), ``analysis`` (paired ratios, spreads, the best setting and the noise rule), ``stats``
(quantiles, sign test, Wilson interval), ``report`` (terminal and markdown tables), ``plots`` (PNGs),
``quality`` (HumanEval pass@1 and prose likelihood, strict vs relaxed), ``sandbox`` (running generated
code), ``apply`` (``--apply``: the best setting written into the model through /api/create),
``provenance`` (the claim stored beside each applied parameter, and how `tandem show` reads it),
``command`` (the command line).
"""
