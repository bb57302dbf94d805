"""What every backend shares, whatever it talks to: the request and event types and the
``Backend`` protocol (``base``), the error tree (``errors``), sampling options with Ollama's names
and precedence (``options``), Go-style durations (``durations``) and the in-process engines'
settings (``settings``). Imports nothing from the rest of ``adapters``.
"""
