"""Reading model files without torch: GGUF headers, metadata and tensor views (``gguf_file``) and
tokenizers built from a GGUF vocabulary or a Hugging Face ``tokenizer.json`` (``tokenizer``).

The one place both sides read models: the engine (``native_engine``) and the gateway (prompt
rendering, token counting, ``infer bench``). A leaf: it imports nothing else from this project,
only ``gguf``, ``numpy`` and ``tokenizers``.
"""
