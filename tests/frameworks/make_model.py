# SPDX-License-Identifier: Apache-2.0
"""Builds the tiny model the framework tests serve, on the spot and with
nothing fetched: a Llama-architecture config with grouped-query attention
(4 layers, hidden 256, 8 query heads, 2 KV heads, head size 32), weights
drawn from a fixed seed and saved as safetensors, and a byte-level BPE
tokenizer trained here on text generated from the same seed.

The same arguments give the same files, byte for byte: the weights come
from torch's CPU generator under a fixed seed and the tokenizer from a
deterministic training run on deterministic text.

Two scalings make it a discriminating test subject. The query and key
projections are scaled up so that attention is sharp: what a sequence
generates depends on exactly which keys and values its cache holds (with
the initial weights attention is nearly uniform, and outputs repeat one
token whatever the context). The output projection is scaled so that a
token's logits lie well apart: greedy decoding then does not hinge on
the last bits of a float, which differ between a prompt computed in one
pass and one whose cache was computed elsewhere.

Usage: make_model.py DIR [--preset tiny|bench]. The "bench" preset is a
larger model of the same kind for the time-to-first-token table (8 layers,
hidden 512, 8 query heads, 4 KV heads, head size 64: 16 KiB of KV per
token), where prefill takes long enough per layer for layer-wise transfer
to show.
"""

import argparse
import json
import random
from pathlib import Path

SEED = 20261206
VOCAB = 2048
WORDS = 3000
PRESETS = {
    "tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=32),
    "bench": dict(hidden_size=512, intermediate_size=1408,
                  num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=4, head_dim=64),
}


def corpus(rng):
    """Sentences over a fixed vocabulary of made-up words."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9)))
             for _ in range(WORDS)]
    for _ in range(20000):
        n = rng.randint(4, 20)
        yield " ".join(rng.choice(words) for _ in range(n)) + "."


def tokenizer(out):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False)
    tok.train_from_iterator(list(corpus(random.Random(SEED))), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(out)
    return fast


def model(out, vocab, bos, eos, preset):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    cfg = LlamaConfig(vocab_size=vocab, **PRESETS[preset],
                      max_position_embeddings=4096,
                      bos_token_id=bos, eos_token_id=eos,
                      tie_word_embeddings=False, torch_dtype="float32")
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():
        m.lm_head.weight.mul_(40.0)
        for layer in m.model.layers:
            layer.self_attn.q_proj.weight.mul_(6.0)
            layer.self_attn.k_proj.weight.mul_(6.0)
    m.save_pretrained(out, safe_serialization=True)
    (Path(out) / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": bos, "eos_token_id": eos, "do_sample": False}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    args = ap.parse_args()
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(out)
    model(out, len(tok), tok.bos_token_id, tok.eos_token_id, args.preset)
    print(f"model in {out}")


if __name__ == "__main__":
    main()
