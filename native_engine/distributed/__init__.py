"""Tensor parallelism for the native engine (Megatron-LM's scheme on `torch.distributed`).

    partition.py       which heads, KV heads, MLP rows and vocabulary rows each rank holds (torch-free)
    parallel_state.py  the group: gloo on CPU, NCCL on CUDA; all-reduce, logits gather, the step plan
    worker.py          ranks > 0: join the group, load their shards, execute what rank 0 sends

Rank 0 is the engine (`LLMEngine`): it owns the scheduler and the sampler and broadcasts each step's plan
(`input_batch.StepPlan`: token ids, positions, block tables, the rows that sample) once; the other ranks
only execute it. The layers that split (`layers/linear.py`, `layers/embed_head.py`) take the group and
their span; with one rank they are the plain layers.
"""
