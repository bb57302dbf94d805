"""Tool calling: the one internal shape of tools and calls and its OpenAI and Ollama forms
(``wire``), calls parsed out of an in-process model's output in its template's format
(``parser``), and the wrapper that gives a local backend's ``stream`` tool calling (``local``).
"""
