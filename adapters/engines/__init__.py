"""The local engines over the local model store. ``local.LocalEngines`` starts each engine's backend on
first use and hands it out by name; ``scheduler.py`` decides which runners run and for how long (the one
keep-alive); ``runner/`` is a model's runner (a process of ``infer serve``, a thread of ``infer run
--local``); ``llamacpp/`` and ``native/`` are what runs in it; ``store_models`` is what they all read from the
store (details, listing, the GGUF path).
"""
