"""Sampling on the device (vLLM v1's `vllm/v1/sample/` layout).

- `state.SamplingState`: one row ("slot") per live sequence: its parameters as tensors, its token counts
  for the penalties (updated in place from the sampled ids, never rebuilt), its generator when seeded.
- `metadata.SamplingMetadata`: the step's view of those rows, built with a few numpy ops on the host.
- `sampler.Sampler`: penalties -> grammar bitmask -> greedy argmax / temperature, top-k, top-p, min-p and
  one batched exponential-race draw -> logprobs; everything stays on the device until one small copy.
- `ops`: the tensor maths, each a short function with the same code on CPU and GPU.
"""

from .metadata import SamplingMetadata
from .sampler import HostTokens, SampledToken, Sampler, SamplerOutput
from .state import SamplingState

__all__ = ["HostTokens", "SampledToken", "Sampler", "SamplerOutput", "SamplingMetadata", "SamplingState"]
