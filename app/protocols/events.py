"""Chat completion streams translated, chunk by chunk, into another protocol's events.

The pipeline streams ``chat.completion.chunk`` events for a hit (replayed) and for a miss
(relayed as the model writes); a protocol's ``EventSink`` turns what they say (opened, text,
a tool call and its arguments, finished, failed) into its own events, and gets the whole
completion at the end, assembled as the write-back assembles it, for its closing event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any, Protocol

from app.stream import StreamAssembler
from app.wire import SSE_DONE, ChatCompletionChunkView, json_decoder, json_encoder

_DATA = b"data: "
# The relay's own error event (``app/relay.py``): ``{"error": {...}}`` encoded by msgspec.
_ERROR_START = b'{"error"'


def chat_payload(event: bytes) -> bytes | None:
    """The JSON payload of one SSE event the pipeline yields (``data: {...}\\n\\n``)."""
    if not event.startswith(_DATA):
        return None
    return event[len(_DATA):].strip()


def named_event(name: str, payload: dict[str, Any]) -> bytes:
    """One SSE event with its ``event:`` line, as the Responses and Anthropic streams frame them."""
    return b"event: " + name.encode() + b"\ndata: " + json_encoder.encode(payload) + b"\n\n"


def response_hex(completion_id: str) -> str:
    """The random part of a chat completion's id, which the other protocols' ids reuse (so that
    feedback can name a response in any protocol: ``app/cache/learning/feedback.py``)."""
    return completion_id.removeprefix("chatcmpl-") or "0"


# The prefixes of a response's id in the other protocols (``resp_``: Responses, ``msg_``: Anthropic).
_PROTOCOL_ID_PREFIXES = ("resp_", "msg_")


def chat_completion_id(response_id: str) -> str:
    """The chat completion id a response id in any protocol stands for (the one its record has)."""
    for prefix in _PROTOCOL_ID_PREFIXES:
        if response_id.startswith(prefix):
            return "chatcmpl-" + response_id.removeprefix(prefix)
    return response_id


class EventSink(Protocol):
    """What one protocol's stream says for each thing a chat stream says."""

    def opened(self, chunk: ChatCompletionChunkView) -> Iterable[bytes]:
        """The first chunk arrived (its id, model and creation time)."""
        ...

    def text(self, delta: str) -> Iterable[bytes]:
        """More of the answer's text."""
        ...

    def tool_call(self, index: int, call_id: str, name: str) -> Iterable[bytes]:
        """A tool call begins."""
        ...

    def arguments(self, index: int, delta: str) -> Iterable[bytes]:
        """More of a tool call's arguments."""
        ...

    def finished(self, completion: dict[str, Any]) -> Iterable[bytes]:
        """Every choice finished; ``completion`` is the whole answer."""
        ...

    def failed(self, error: dict[str, Any]) -> Iterable[bytes]:
        """The stream broke (the relay's error event, ``{"message", "type", "code"}``)."""
        ...


async def translate(chat_events: AsyncIterator[bytes], sink: EventSink) -> AsyncIterator[bytes]:
    """The events of ``sink``'s protocol for a chat stream (one choice: the other protocols have
    no ``n``).

    Args:
        chat_events: The pipeline's SSE events, one per item.
        sink: The protocol's renderer, fresh for this stream.

    Yields:
        The protocol's SSE events, ending with its closing event or its error event.
    """
    assembler = StreamAssembler()
    opened = False
    started_calls: set[int] = set()
    async for event in chat_events:
        payload = chat_payload(event)
        if payload is None:
            continue
        if payload == SSE_DONE:
            break
        if payload.startswith(_ERROR_START):
            error = json_decoder.decode(payload).get("error") or {}
            for item in sink.failed(error if isinstance(error, dict) else {"message": str(error)}):
                yield item
            return
        chunk = assembler.add(payload)
        if not opened:
            opened = True
            for item in sink.opened(chunk):
                yield item
        for choice in chunk.choices:
            if choice.delta.content:
                for item in sink.text(choice.delta.content):
                    yield item
            for position, call in enumerate(choice.delta.tool_calls or []):
                index = call.get("index", position)
                function = call.get("function") or {}
                if index not in started_calls:
                    started_calls.add(index)
                    for item in sink.tool_call(index, call.get("id") or f"call_{index}", function.get("name") or ""):
                        yield item
                if function.get("arguments"):
                    for item in sink.arguments(index, function["arguments"]):
                        yield item
    if assembler.finished:
        for item in sink.finished(assembler.completion()):
            yield item
