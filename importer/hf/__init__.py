"""What every Hugging Face architecture's conversion builds on, and nothing architecture-specific: the create
error, reading an uploaded folder (config.json, safetensors), the hyper-parameters every decoder shares, tensor
plans (name, shape, dtype, value transforms) and how a planned tensor is laid out in a GGUF.

``importer/architectures/`` (one module per architecture) builds on this package; the drivers that pick an
architecture and run its conversion (``importer/hf_config.py``, ``importer/hf_to_gguf.py``) use both. This
package imports neither.
"""
