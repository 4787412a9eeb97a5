"""Tiny checkpoints on disk, as a hub repository or a local folder holds them: a tiny kind's
config (kvbench.models.tiny_configs) and random weights, saved by transformers' own
save_pretrained in the dtype asked, beside a small byte-level BPE tokenizer trained here (a few
hundred ids, chat special tokens included) and, where asked, a chat template and a
generation_config naming several end-of-sequence ids."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")

# Qwen3's chat template in short: ChatML, and with enable_thinking false an empty think block
# opening the answer (Qwen/Qwen3-8B's tokenizer_config.json does the same).
QWEN3_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


@functools.lru_cache(maxsize=1)
def tokenizer_files() -> dict[str, str]:
    """tokenizer.json of a BPE tokenizer trained on pydoc's text (byte level: any text
    round-trips), the special tokens first."""
    from pydoc_data.topics import topics
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = [topics[key] for key in sorted(topics)][:40]
    tokenizer.train_from_iterator(text, trainer)
    return {"tokenizer.json": tokenizer.to_str()}


def save_checkpoint(folder: Path, kind: str = "llama", dtype: torch.dtype = torch.float32,
                    chat_template: str | None = None, stop_tokens: tuple[str, ...] = (),
                    seed: int = 0, **config) -> Path:
    """A tiny checkpoint of `kind` in `folder`: config.json (the kind's, with `config` over
    it), model.safetensors in `dtype`, the tokenizer (its eos <|endoftext|>), a chat template
    if given, and a generation_config.json whose eos_token_id lists the tokenizer's eos and
    `stop_tokens`."""
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    from kvbench.models.tiny_configs import TINY_CONFIGS

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in tokenizer_files().items():
        (folder / name).write_text(text)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"),
                                        eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    if chat_template:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(folder)
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = AutoConfig.for_model(**{**TINY_CONFIGS[kind], "vocab_size": len(tokenizer),
                                     "bos_token_id": eos, "eos_token_id": eos,
                                     "pad_token_id": eos, **config})
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(folder)
    stops = [eos, *tokenizer.convert_tokens_to_ids(list(stop_tokens))]
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": eos, "eos_token_id": stops if stop_tokens else eos}))
    return folder


def checkpoint_files(folder: Path) -> dict[str, bytes]:
    """Every file of a checkpoint folder by its name: what HubStandIn.add_model takes."""
    return {path.name: path.read_bytes() for path in Path(folder).iterdir() if path.is_file()}


def save_scripted_checkpoint(folder: Path, script: dict[str, str], otherwise: str,
                             stop_tokens: tuple[str, ...] = ("<|im_end|>",),
                             chat_template: str = QWEN3_TEMPLATE,
                             generation_config: bool = True) -> Path:
    """save_checkpoint's tiny llama, made to answer a script: its greedy next token depends on
    the current token alone, script[text] after the one token `text` encodes to and `otherwise`
    after any other (each key and value one token of the tokenizer). Every layer's attention
    and MLP outputs are zero (o_proj, down_proj), so the final norm reads the current token's
    embedding; each scripted token's embedding has a dimension of its own, which lm_head's row
    of its successor reads, and every embedding a shared one that `otherwise`'s row reads.
    `<think>` and `</think>` are ordinary added tokens, as Qwen3's tokenizer has them
    (skip_special_tokens keeps them). generation_config False: no generation_config.json."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = save_checkpoint(folder, "llama", chat_template=chat_template,
                             stop_tokens=stop_tokens)
    tokenizer_json = folder / "tokenizer.json"
    spec = json.loads(tokenizer_json.read_text())
    for added in spec["added_tokens"]:
        if added["content"] in ("<think>", "</think>"):
            added["special"] = False
    tokenizer_json.write_text(json.dumps(spec))
    tokenizer = AutoTokenizer.from_pretrained(folder)

    def one(text: str) -> int:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert len(ids) == 1, f"{text!r} is {len(ids)} tokens, not one"
        return ids[0]

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    hidden = model.config.hidden_size
    assert len(script) < hidden - 1, "one embedding dimension per scripted token"
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        embed[:, 1 : len(script) + 1] = 0.0  # the scripted dimensions: theirs alone
        embed[:, 0] = 1.0  # the shared dimension
        head.zero_()
        head[one(otherwise), 0] = 1.0
        for dim, (current, following) in enumerate(script.items(), 1):
            embed[one(current)] = 0.0
            embed[one(current), 0], embed[one(current), dim] = 1.0, 4.0
            head[one(following), dim] = 10.0
    kept = (folder / "generation_config.json").read_bytes()
    model.save_pretrained(folder)  # writes a generation config of its own: put back below
    if generation_config:
        (folder / "generation_config.json").write_bytes(kept)
    else:
        (folder / "generation_config.json").unlink()
    return folder
