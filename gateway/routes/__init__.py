"""One router per resource: health, Ollama generation, Ollama model management, OpenAI chat and models."""
