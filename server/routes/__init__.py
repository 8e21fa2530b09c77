"""The HTTP surfaces, one module each: `generate` (/api/generate, /api/chat), `models` (model management
under /api), `pull` (/api/pull), `openai` (/v1), `responses` (/v1/responses; its output items and stream
events are built in `responses_output`) and `anthropic` (/v1/messages). Each has its own `router`, which
`server.routes.app` includes; they share the request checks, option merging and generation pipeline of the
modules above.
"""
