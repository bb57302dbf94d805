"""Backends: whatever turns a :class:`~core.base.GenerationRequest` into a stream of events
ending in exactly one ``Done``, in-process or remote.

    core/        the protocol every backend implements (request, events, ``Backend``), the error
                 tree, sampling options, durations and the in-process engines' settings
    tools/       tool calling: the wire shapes, a local model's output parsed into calls
    prompting/   chat templates and prompt text, token bytes to text, token counting
    remote/      backends that talk HTTP to another server (vLLM, TGI, TensorRT-LLM, Triton,
                 Ollama, llama.cpp's server, any OpenAI-compatible one)
    local/       the engines over the local store: llama.cpp and the native engine (``local/native/``
                 is the only code that imports ``native_engine``), and the scheduler of runners
    runner/      a local model in its own process: the protocol, the gateway's client and
                 ``RunnerBackend``, the runner's loop (``python -m adapters.engines.runner``)

Imports go one way: ``core`` <- ``tools`` <- ``prompting`` <- ``remote``, ``local`` <- ``runner``. Which backend
serves a request is decided outside, by ``gateway/serving/router.py``.
"""
