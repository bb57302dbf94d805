"""The Ollama API: /api/generate, /api/chat, /api/embed, model management."""
