"""instructor against Strata: a validator that fails the first answer, re-asks (an assistant turn
with tool_calls and no content, then the error), and succeeds."""

from __future__ import annotations

import instructor
import openai
from common import DIRECT, MODEL, STRATA, done, twice
from pydantic import BaseModel, field_validator


class Shout(BaseModel):
    word: str

    @field_validator("word")
    @classmethod
    def loud(cls, value: str) -> str:
        if value != value.upper():
            raise ValueError("the word must be in capitals")
        return value


def extract(base: str, text: str) -> dict:
    client = instructor.from_openai(openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0))
    return client.chat.completions.create(model=MODEL, response_model=Shout, max_retries=2,
                                          messages=[{"role": "user", "content": text}]).model_dump()


twice("re_ask_with_max_retries", lambda: (extract(STRATA, "shout hello"), None), direct=lambda: extract(DIRECT, "shout hello"))
done()
