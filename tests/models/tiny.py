"""Tiny models built offline from configs (random weights) with tokenizers trained on the corpus.

Random weights are enough to check plumbing and padding: a padded batch must reproduce each
row's own output token for token. Weights are drawn with a large spread, untied from the input
embeddings (so a model does not just repeat its last token), and the EOS row of the output layer
is scaled so that some rows stop early and others run to the length limit.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from generate_example import train_bpe  # scripts/, on the path by tests/conftest.py
from safetensors.torch import save_file
from tokenizers import Tokenizer

VOCAB = 400
LLAMA_EOS_SCALE = 1.6


def bpe(texts: list[str], specials: list[str], template: str | None = None) -> Tokenizer:
    """A byte-level BPE tokenizer trained on ``texts`` (the toy example's own recipe)."""
    return train_bpe(texts, specials, template, vocab=VOCAB)


def save_tokenizer(tok: Tokenizer, folder: Path, **special: str) -> None:
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_object=tok, **special).save_pretrained(folder)


def finish(model: torch.nn.Module, folder: Path, eos: int, eos_scale: float) -> Path:
    with torch.no_grad():
        model.get_output_embeddings().weight[eos] *= eos_scale
    model.save_pretrained(folder)
    return folder


def gpt2(folder: Path, texts: list[str]) -> Path:
    """A decoder-only model: 2 layers, width 32, no pad token (EOS pads, as for real GPT-2)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = bpe(texts, ["<|endoftext|>"])
    end = "<|endoftext|>"
    save_tokenizer(tok, folder, bos_token=end, eos_token=end, unk_token=end)
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=tok.get_vocab_size(),
        n_positions=256,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
        initializer_range=0.3,
        tie_word_embeddings=False,
    )
    return finish(GPT2LMHeadModel(config), folder, eos=0, eos_scale=1.6)


# ChatML, as Qwen and many other instruction-tuned models ship it, led by the tokenizer's BOS
CHATML = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def set_chat_template(folder: Path, template: str | list[dict[str, str]] | None) -> None:
    """Put ``template`` in the folder's tokenizer_config.json, where hub folders ship it (or take
    it out, with None), leaving no chat_template.jinja beside it."""
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.pop("chat_template", None)
    if template is not None:
        config["chat_template"] = template
    config_file.write_text(json.dumps(config, indent=2))
    (folder / "chat_template.jinja").unlink(missing_ok=True)


def llama_chat(folder: Path, texts: list[str]) -> Path:
    """A Llama-style instruction model: 2 layers, grouped-query attention, rotary positions; its
    tokenizer adds BOS to every text (so a templated prompt tokenized with special tokens would
    start with two) and ships a ChatML template in tokenizer_config.json; EOS is <|im_end|>."""
    from transformers import LlamaConfig, LlamaForCausalLM

    specials = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    tok = bpe(texts, specials, "<s> $A")
    save_tokenizer(tok, folder, bos_token="<s>", eos_token="<|im_end|>", unk_token="</s>")
    set_chat_template(folder, CHATML)
    eos = tok.token_to_id("<|im_end|>")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        bos_token_id=0,
        eos_token_id=eos,
        initializer_range=0.3,
        tie_word_embeddings=False,
    )
    return finish(LlamaForCausalLM(config), folder, eos=eos, eos_scale=LLAMA_EOS_SCALE)


def llama_reward(folder: Path, texts: list[str], labels: list[str], *, pad: bool = True) -> Path:
    """A Llama-style reward model: a sequence-classification head of ``labels`` over 2 layers,
    its tokenizer adding BOS, a ChatML template; the pad token set in its config (so
    transformers batches it), or none (``pad`` False: it scores one row at a time)."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    specials = ["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
    tok = bpe(texts, specials, "<s> $A")
    named = {"pad_token": "<pad>"} if pad else {}
    save_tokenizer(tok, folder, bos_token="<s>", eos_token="<|im_end|>", unk_token="</s>", **named)
    set_chat_template(folder, CHATML)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        bos_token_id=0,
        pad_token_id=tok.token_to_id("<pad>") if pad else None,
        initializer_range=0.3,
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
    )
    model = LlamaForSequenceClassification(config)
    model.save_pretrained(folder)
    return folder


def t5(folder: Path, texts: list[str]) -> Path:
    """A T5 encoder-decoder: relative positions, pad 0, EOS 1 appended to every input."""
    from transformers import T5Config, T5ForConditionalGeneration

    tok = bpe(texts, ["<pad>", "</s>", "<unk>"], "$A </s>")
    save_tokenizer(tok, folder, eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=tok.get_vocab_size(),
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        initializer_factor=10.0,
        tie_word_embeddings=False,
    )
    return finish(T5ForConditionalGeneration(config), folder, eos=1, eos_scale=3.0)


def bart(folder: Path, texts: list[str]) -> Path:
    """A BART encoder-decoder: learned positions, <s> ... </s> inputs, EOS forced at the limit."""
    from transformers import BartConfig, BartForConditionalGeneration

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = bpe(texts, specials, "<s> $A </s>")
    save_tokenizer(
        tok, folder, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        mask_token="<mask>",
    )  # fmt: skip
    torch.manual_seed(0)
    config = BartConfig(
        vocab_size=tok.get_vocab_size(),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=256,
        init_std=0.3,
        tie_word_embeddings=False,
    )
    return finish(BartForConditionalGeneration(config), folder, eos=2, eos_scale=8.0)


def bert_classifier(folder: Path, minilm_path: Path, labels: list[str]) -> Path:
    """A 2-layer BERT classifier with MiniLM's tokenizer (the real WordPiece vocabulary)."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    AutoTokenizer.from_pretrained(minilm_path).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        initializer_range=0.2,
    )
    BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def mlp_files(
    folder: Path, features: int = 4, classes: int = 3
) -> tuple[torch.nn.Module, dict[str, Path]]:
    """One small MLP, and its files: TorchScript, torch.export, safetensors (for the built-in
    ``mlp`` factory) and a torch.save pickle, all named ``.bin`` so only content tells them apart.
    """
    from batchscore.models.numeric.factories import mlp

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    module = mlp(features, classes, hidden=[8]).eval()
    with torch.no_grad():
        module.mean.copy_(torch.arange(features, dtype=torch.float32))
        module.scale.copy_(torch.full((features,), 2.0))
    paths = {name: folder / f"{name}.bin" for name in ("torchscript", "export", "safetensors")}
    torch.jit.save(torch.jit.script(module), str(paths["torchscript"]))
    batch = torch.export.Dim("batch")
    example = (torch.zeros(2, features),)
    program = torch.export.export(module, example, dynamic_shapes=({0: batch},))
    with paths["export"].open("wb") as fh:
        torch.export.save(program, fh)
    save_file(module.state_dict(), str(paths["safetensors"]))
    paths["pickle"] = folder / "pickle.bin"
    torch.save(module.state_dict(), paths["pickle"])
    return module, paths
