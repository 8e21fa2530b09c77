"""tandem's HTTP server (Ollama and OpenAI APIs), model scheduler and command line."""
