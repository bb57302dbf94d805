"""Text in and out of a model: a model's templates plus messages -> the prompt (``chat_format``),
prompts and option translation for the prompt-only remote APIs (``prompt_text``), token bytes ->
visible text with stop strings (``textstream``), token counts for usage a server did not report
(``token_count``). Reads GGUF metadata and tokenizers through ``gguf_io``, never ``native_engine``.
"""
