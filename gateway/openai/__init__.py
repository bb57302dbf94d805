"""The OpenAI API: /v1/chat/completions, /v1/completions, /v1/models, /v1/embeddings."""
