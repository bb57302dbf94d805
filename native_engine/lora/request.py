"""A request's adapter (torch-free): the scheduler and the prefix cache see only its name."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoRARequest:
    lora_name: str  # what the client asked for (the model name of the adapter)
    lora_path: str  # a GGUF LoRA file or a PEFT directory

    def __post_init__(self) -> None:
        if not self.lora_name or not self.lora_path:
            raise ValueError(f"a LoRA request needs a name and a path, got {self.lora_name!r}, {self.lora_path!r}")
