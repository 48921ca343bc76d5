"""Strata: a Redis-native, layered cache in front of an OpenAI-compatible LLM server."""

__version__ = "0.1.0"
