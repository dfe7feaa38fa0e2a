"""Image-text rows for the vision tests (data, checks, export, train, kernels): the tiny model's
processor parts, builtin:shapes encoded, a dataset file with its images, the two row forms."""
import json
from pathlib import Path

from jobs.data.vision_dataset import vision_examples
from jobs.models import load, vision
from jobs.spec import JobSpec


def processor_parts(folder):
    tokenizer = load.load_tokenizer(str(folder))
    return tokenizer, vision.load_image_processor(str(folder)), vision.image_token(tokenizer)[1]


def encoded_shapes(folder, tmp_path, rows=4, max_length=256):
    """(tokenizer, examples) of builtin:shapes drawn into tmp_path."""
    tokenizer, processor, image_id = processor_parts(folder)
    spec = JobSpec(model=str(folder), dataset="builtin:shapes", max_seq_length=max_length)
    examples = vision_examples(spec, "dataset", tokenizer, processor, image_id, tmp_path / "data", log=lambda _: None)
    return tokenizer, examples[:rows]


def write_dataset(folder: Path, rows: list[dict], images=("a.png",)) -> Path:
    from PIL import Image
    (folder / "imgs").mkdir(parents=True, exist_ok=True)
    for name in images:
        Image.new("RGB", (56, 84), (200, 30, 30)).save(folder / "imgs" / name)
    path = folder / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


PARTS_ROW = {"messages": [
    {"role": "user", "content": [{"type": "image", "image": "imgs/a.png"}, {"type": "text", "text": "What colour?"}]},
    {"role": "assistant", "content": "red"}]}
LLAMA_FACTORY_ROW = {"messages": [{"role": "user", "content": "<image>What colour?"},
                                  {"role": "assistant", "content": "red"}], "images": ["imgs/a.png"]}
