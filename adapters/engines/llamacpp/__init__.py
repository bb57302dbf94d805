"""llama.cpp (llama-cpp-python), as a llama.cpp runner serves it (``runner/worker.py``): ``backend`` (one
model's generations and embeddings), ``pool`` (its contexts and their slots) and ``job`` (one generation on
one slot, run on the slot's thread).
"""
