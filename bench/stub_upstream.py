"""A stub OpenAI-compatible upstream for hit-path benchmarks (the model is not measured there):
it answers every chat request at once with a completion naming the question.

    python -m bench.stub_upstream PORT
"""

from __future__ import annotations

import sys
from typing import Any

import uvicorn
from litestar import Litestar, get, post


@post("/v1/chat/completions", status_code=200)
async def chat(data: dict[str, Any]) -> dict[str, Any]:
    question = data["messages"][-1].get("content")
    return {
        "id": "chatcmpl-stub", "object": "chat.completion", "created": 1700000000, "model": data["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": f"stub answer to: {question}"},
                     "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
    }


@get("/v1/models")
async def models() -> dict[str, Any]:
    return {"object": "list", "data": [{"id": "stub-model", "object": "model", "owned_by": "bench"}]}


def stub_app() -> Litestar:
    """The stub as an ASGI app (benchmarks serve it in a thread with app.replay.simulate.ServerThread)."""
    return Litestar([chat, models])


if __name__ == "__main__":
    uvicorn.run(stub_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
