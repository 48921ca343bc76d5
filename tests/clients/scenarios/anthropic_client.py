"""The anthropic SDK through Strata's pass-through (`/v1/messages`, not cached yet: issue #25)."""

from __future__ import annotations

import anthropic
from common import DIRECT, MODEL, STRATA, done, twice


def ask(base: str, text: str) -> tuple[dict, str | None]:
    client = anthropic.Anthropic(base_url=base, api_key="sk-test", max_retries=0)
    raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=64,
                                                   messages=[{"role": "user", "content": text}])
    message = raw.parse()
    return {"content": [b.model_dump() for b in message.content], "stop_reason": message.stop_reason,
            "usage": message.usage.model_dump()}, raw.headers.get("x-cache")


twice("messages", lambda: ask(STRATA, "What is the capital of France?"), direct=lambda: ask(DIRECT, "What is the capital of France?")[0])
done()
