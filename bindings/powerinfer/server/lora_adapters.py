"""GET / POST /lora-adapters: llama.cpp's LoRA adapter list and scales (`--lora`, `--lora-scaled`,
`--lora-init-without-apply`).

GET answers `[{id, path, scale, task_name, prompt_prefix}]` (the adapter file's adapter.lora.task_name /
prompt_prefix, "" when absent); POST takes `[{"id": i, "scale": s}, ...]` and sets the scales of the requests that give
none (the adapters left out: 0), answering `{"success": true}`. A request's own `lora` field (the same array) applies
to that request alone (powerinfer.engine: a decode step holds the requests of one set of scales).
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.routing import Route

from ..request import RequestError
from .protocol import JSON, read_json


def adapter_list(llm) -> list[dict]:
    return [{"id": i, "path": str(ad.path), "scale": scale,
             "task_name": str(ad.metadata.get("adapter.lora.task_name", "")),
             "prompt_prefix": str(ad.metadata.get("adapter.lora.prompt_prefix", ""))}
            for i, (ad, scale) in enumerate(llm.lora_adapters)]


def routes(state) -> list[Route]:

    async def get_adapters(request: Request):
        return JSON(adapter_list(state.require()))

    async def set_adapters(request: Request):
        llm = state.require()
        body = await read_json(request, state, array=True)
        try:
            llm.set_lora_scales(body)
        except ValueError as e:
            raise RequestError(str(e), param="lora") from None
        return JSON({"success": True})

    return [Route("/lora-adapters", get_adapters, methods=["GET"]),
            Route("/lora-adapters", set_adapters, methods=["POST"])]
