"""The HTTP surfaces, one module each: `generate` (/api/generate, /api/chat), `models` (model management
under /api), `pull` (/api/pull) and `openai` (/v1). Each has its own `router`, which `server.app`
includes; they share the request checks, option merging and generation pipeline of the modules above.
"""
