"""LoRA adapters in the native engine (Punica / S-LoRA / vLLM style).

`max_loras` adapters are resident in slots; each request names one (`LoRARequest`) or none. A step runs
every base matmul once for the whole batch, then adds each row's `x · A · B · (alpha / r)` with the rows
grouped per adapter (`punica.py`, a segmented matmul). Adapters load from disk on first use (`models.py`:
a PEFT directory or a GGUF LoRA) and the least recently used one leaves its slot when a new one needs it
(`manager.py`); the scheduler keeps at most `max_loras` adapters among the running requests, so a request
for one more waits. Prefix-cache hashes start from the adapter's name (`BlockManager`).
"""

from .request import LoRARequest

__all__ = ["LoRARequest"]
