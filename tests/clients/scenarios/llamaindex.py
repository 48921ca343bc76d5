"""llama-index's OpenAILike against Strata: chat, stream_chat, structured_predict."""

from __future__ import annotations

from common import DIRECT, MODEL, STRATA, done, twice
from llama_index.core.llms import ChatMessage
from llama_index.core.prompts import PromptTemplate
from llama_index.llms.openai_like import OpenAILike
from pydantic import BaseModel


class Capital(BaseModel):
    city: str
    country: str


def llm(base: str) -> OpenAILike:
    return OpenAILike(model=MODEL, api_base=base + "/v1", api_key="sk-test", is_chat_model=True,
                      is_function_calling_model=True, max_retries=0, context_window=4096)


def chat(base: str, text: str) -> dict:
    response = llm(base).chat([ChatMessage(role="user", content=text)])
    return {"content": response.message.content, "role": str(response.message.role)}


def stream_chat(base: str, text: str) -> dict:
    chunks = list(llm(base).stream_chat([ChatMessage(role="user", content=text)]))
    return {"content": chunks[-1].message.content if chunks else None}


def structured(base: str, text: str) -> dict:
    return llm(base).structured_predict(Capital, PromptTemplate("{question}"), question=text).model_dump()


twice("chat", lambda: (chat(STRATA, "What is the capital of France?"), None),
      direct=lambda: chat(DIRECT, "What is the capital of France?"))
twice("stream_chat", lambda: (stream_chat(STRATA, "Tell me about Lyon."), None),
      direct=lambda: stream_chat(DIRECT, "Tell me about Lyon."))
twice("structured_predict", lambda: (structured(STRATA, "Capital of Spain?"), None),
      direct=lambda: structured(DIRECT, "Capital of Spain?"))
done()
