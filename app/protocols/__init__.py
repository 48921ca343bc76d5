"""The other protocols clients speak, served through the chat layers.

A Responses or Anthropic Messages request is translated once, at the boundary, into the chat call
the pipeline serves (the same canonical request, so the same question with the same parameters
and scope shares one entry whichever protocol asked it); the chat answer, a hit or the model's,
is rendered back in the asker's protocol: a JSON body, or its event stream translated chunk by
chunk from the chat stream (``app/protocols/events.py``). What a protocol carries that chat
cannot (stored conversations, hosted tools) is passed through to the model server uncached.
"""
