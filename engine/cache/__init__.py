"""Per-sequence model state (KV caches), and the rollback protocol speculation needs from every cache.

``protocol.SequenceCache`` is that protocol; ``kv.KVCache`` is the attention cache that implements it.
"""
