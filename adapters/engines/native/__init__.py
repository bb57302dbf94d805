"""The native PyTorch engine as an in-process backend (``backend``). The only package outside
``native_engine/`` that imports it, lazily, so ``infer serve`` starts without torch.
"""
