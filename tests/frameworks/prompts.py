# SPDX-License-Identifier: Apache-2.0
"""The prompt set of the framework tests: token-id prompts drawn from a
fixed seed, lengths 5 to 2,000 tokens, in three families that share a
prefix of several blocks with each other (so that decode's prefix cache
holds part of a later prompt, and only the rest crosses), and the long
prompts of the time-to-first-token table."""

import random

SEED = 20261206
VOCAB_LOW, VOCAB_HIGH = 3, 2048  # ids 0..2 are <s>, </s>, <unk>


def _tokens(rng, n):
    return [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(n)]


def prompt_set(n=36):
    """n prompts (n >= 32): ordered so that each family's first member
    comes before the ones that share its prefix."""
    rng = random.Random(SEED)
    lengths = [5, 2000, 17, 31, 32, 33, 64, 100, 127, 250, 511, 777,
               1024, 1500, 1999, 9, 300, 640, 1200, 48]
    prompts = [_tokens(rng, n) for n in lengths]
    # Families: a shared prefix of 5, 10 and 24 blocks of 32 tokens.
    for blocks, tails in ((5, (7, 40, 200)), (10, (1, 33, 500)),
                          (24, (16, 90, 1100))):
        prefix = _tokens(rng, blocks * 32)
        for t in tails:
            prompts.append(prefix + _tokens(rng, t))
        prompts.append(prefix[:blocks * 32 - 5] + _tokens(rng, 20))
    while len(prompts) < n:
        prompts.append(_tokens(rng, rng.randint(5, 2000)))
    return [p[:2000] for p in prompts[:n]]


def long_prompts(n=4, length=3000):
    """Prompts for the time-to-first-token table (no shared prefix)."""
    rng = random.Random(SEED + 1)
    return [_tokens(rng, length) for _ in range(n)]


def cached_blocks(prompts, block_size):
    """For each prompt, the blocks decode's prefix cache already holds
    when the prompts arrive one at a time in this order: the longest
    prefix, in whole blocks, shared with an earlier prompt, at most
    (len - 1) // block_size (vLLM computes a prompt's last token)."""
    out = []
    for i, p in enumerate(prompts):
        best = 0
        for q in prompts[:i]:
            n = 0
            for a, b in zip(p, q):
                if a != b:
                    break
                n += 1
            best = max(best, n // block_size)
        out.append(min(best, (len(p) - 1) // block_size))
    return out
