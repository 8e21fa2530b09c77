"""The server side of the engine process: starting it, calling it, batching embedding calls to it."""
