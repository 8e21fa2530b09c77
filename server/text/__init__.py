"""Chat text the server renders and parses: prompts from templates, thinking, tool calls, harmony."""
