"""A stub OpenAI-compatible upstream for hit-path benchmarks (the model is not measured there).

    python -m bench.stub_upstream PORT
"""

from __future__ import annotations

import sys

import uvicorn

from tests.support import FakeUpstream

if __name__ == "__main__":
    uvicorn.run(FakeUpstream().app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
