"""The torch-free contract between the server process and the engine process.

Everything here is imported by both sides (or by the importer and `modelfile/`, which run in the server's
process) and never imports torch or any engine module outside this package: the options a request and a
model carry (`options`), GGUF reading (`gguf`, `hyperparams`, `adapter`, `pretokenizers`, `special_tokens`), what the
engine can run (`capabilities`), the messages that cross the process boundary (`protocol`, `cancel_flag`),
the speculation plan and the statistics it reports (`speculation_plan`, `speculation_stats`), how a model is
started on vLLM (`vllm_launch`), and the `format` grammar both sides compile (`json_grammar` and its
`json_schema`, `json_regex`). `tests/test_layout.py` holds both rules.
"""
