"""The native PyTorch engine as a native runner's engine core loads and drives it (``backend``). The only
package outside ``native_engine/`` that imports it, lazily, so ``infer serve`` starts without torch.
"""
