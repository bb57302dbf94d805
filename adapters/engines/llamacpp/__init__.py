"""llama.cpp (llama-cpp-python) as an in-process backend: ``backend`` (the ``LocalBackend``),
``pool`` (loaded models and their slots, keep-alive, ``max_loaded_models``) and ``job`` (one
generation on one slot, run in a worker thread).
"""
