"""Fitting drafters to a model the user already has, on its own machine: a NextN (MTP) head trained by
self-distillation against the frozen target (`nextn_head.py` the trainable head, `fit.py` the resumable loop,
`head_gguf.py` the head-only GGUF a DRAFT layer holds)."""
