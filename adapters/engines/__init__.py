"""The in-process engines over the local model store. ``engines.LocalEngines`` starts each engine
on first use and hands it out by name; ``store_models`` is what both read from the store (details,
listing, the GGUF path). ``llamacpp/`` runs llama-cpp-python on worker threads, ``native/`` the
PyTorch ``native_engine`` on its own thread; each implements ``core.base.LocalBackend``.
"""
