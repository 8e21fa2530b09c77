"""Per-sequence model state (KV caches), and the rollback protocol speculation needs from every cache.

``protocol.SequenceCache`` is that protocol; ``kv.KVCache`` is the attention cache that implements it,
``layered.LayeredKVCache`` the same with per-layer shapes and layers that share entries.
"""
