"""tandem's HTTP server (Ollama and OpenAI APIs), model lifecycle and command line."""
