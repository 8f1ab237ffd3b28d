"""PowerInfer's HTTP server (llama.cpp-compatible native routes + OpenAI-compatible routes).

    python examples/server.py -m model.gguf -np 4

The engine it serves from (slots + continuous batching) is `powerinfer.engine`, below the API and with
no web dependency; the web app in `powerinfer.server.app` needs the `server` extra (starlette, uvicorn,
jinja2). Engine, Task, Result and the request errors are re-exported here.
"""
from ..engine import Engine
from ..request import ContextLengthExceeded, RequestError, Result, Task

__all__ = ["ContextLengthExceeded", "Engine", "RequestError", "Result", "Task", "create_app", "main"]


def __getattr__(name):
    if name == "create_app":
        from .app import create_app
        return create_app
    if name == "main":
        from .cli import main
        return main
    raise AttributeError(name)
