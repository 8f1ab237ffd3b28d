#!/usr/bin/env python3
"""server: an HTTP server for a PowerInfer model, like llama.cpp's `server`.

    python examples/server.py -m models/tiny-q8_0.gguf                 # 127.0.0.1:8080
    python examples/server.py -m MODEL -np 4 -c 4096 --api-key secret  # 4 slots of 1024 tokens

Routes: GET / (chat page), /health, /v1/models, /props, /slots, /metrics (--metrics); POST /v1/embeddings and
/embedding (--embedding), /completion (llama.cpp native, SSE with
"stream": true), /tokenize, /detokenize, /v1/completions, /v1/chat/completions (OpenAI shapes,
streams end with `data: [DONE]`). Any OpenAI client works:

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8080/v1", api_key="sk-no-key-required")
    client.chat.completions.create(model="tiny-q8_0.gguf", messages=[{"role": "user", "content": "Hi"}])

Needs the server extra: pip install 'powerinfer-py[server]'.
"""
import sys

from powerinfer.server.cli import main

if __name__ == "__main__":
    sys.exit(main())
