"""vllm/vllm.sh's dry run: the exact server command of both paths, with the flags the seed names."""

from __future__ import annotations

import os
import subprocess

import pytest

from app.settings import PROJECT_ROOT


def command(path: str, **env: str) -> list[str]:
    result = subprocess.run([str(PROJECT_ROOT / "vllm" / "vllm.sh"), "command", path], capture_output=True, text=True,
                            env={**{k: v for k, v in os.environ.items() if not k.startswith("STACK_VLLM_")}, **env},
                            check=True)
    return result.stdout.split()


def flag(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def test_gpu_path_has_the_memory_block_and_length_settings() -> None:
    words = command("gpu")
    assert "--enable-prefix-caching" in words and "--enforce-eager" not in words
    assert flag(words, "--gpu-memory-utilization") == "0.90" and flag(words, "--block-size") == "16"
    assert flag(words, "--max-model-len") == "2048" and flag(words, "--max-num-seqs") == "64"
    tuned = command("gpu", STACK_VLLM_GPU_MEMORY_UTILIZATION="0.8", STACK_VLLM_BLOCK_SIZE="32", STACK_VLLM_MAX_MODEL_LEN="4096")
    assert flag(tuned, "--gpu-memory-utilization") == "0.8" and flag(tuned, "--block-size") == "32"
    assert flag(tuned, "--max-model-len") == "4096"


def test_cpu_path_passes_the_smallest_block_size_the_cpu_build_accepts() -> None:
    words = command("cpu")
    assert words[0] == "VLLM_CPU_KVCACHE_SPACE=1" and "--enable-prefix-caching" in words
    assert flag(words, "--block-size") == "32" and flag(words, "--max-model-len") == "2048"
    assert "--gpu-memory-utilization" not in words and "--enforce-eager" in words


def test_an_unknown_path_is_refused() -> None:
    with pytest.raises(subprocess.CalledProcessError):
        command("tpu")
