"""Synthetic tasks generated on the fly from a seed (no downloads), small enough for two CPU cores.

Sequence tasks give (tokens, targets) with target -100 where nothing is asked; the image task gives
(images, labels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

IGNORE = -100


@dataclass(frozen=True)
class Task:
    """A synthetic task: how to draw examples, its vocabulary and classes, and what it shows."""
    name: str
    summary: str
    kind: str  # "sequence" or "image"
    classes: int
    make: Callable[[torch.Generator, int], tuple[torch.Tensor, torch.Tensor]]
    vocab: int = 0
    length: int = 0
    pairs: int = 0  # associative recall: key-value pairs to remember (the recall-versus-pairs curve's x)

    @property
    def chance(self) -> float:
        """The accuracy of guessing."""
        return 1.0 / self.classes


def associative_recall(pairs: int = 8, queries: int = 8, keys: int = 16, values: int = 16,
                       name: str = "associative-recall") -> Task:
    """Multi-query associative recall (Zoology's MQAR): key-value pairs, then queries for some keys;
    at each query the model must output that key's value. Each pair is one token, so one attention
    hop suffices; what it takes is a sharp match between the query and the right pair."""
    pair_base, query_base = 0, keys * values

    def make(generator: torch.Generator, batch: int):
        key_ids = torch.argsort(torch.rand(batch, keys, generator=generator), dim=1)[:, :pairs]
        value_ids = torch.randint(values, (batch, pairs), generator=generator)
        asked = torch.randint(pairs, (batch, queries), generator=generator)
        tokens = torch.cat([pair_base + key_ids * values + value_ids,
                            query_base + torch.gather(key_ids, 1, asked)], dim=1)
        targets = torch.cat([torch.full((batch, pairs), IGNORE), torch.gather(value_ids, 1, asked)], dim=1)
        return tokens, targets

    return Task(name, f"MQAR: {pairs} key-value pairs over {keys} keys, {queries} queries, {values} values",
                "sequence", values, make, vocab=keys * values + keys, length=pairs + queries, pairs=pairs)


RECALL_PAIRS = (8, 16, 32)
KEYS_PER_PAIR = 2


def recall_sweep(pairs=RECALL_PAIRS, keys_per_pair: int = KEYS_PER_PAIR, values: int = 16) -> list[Task]:
    """Associative recall at growing difficulty for a model of fixed width: more pairs to hold, from a key
    vocabulary growing with them, each pair queried once on average. Zoology (Arora et al. 2023) found
    softmax attention keeps solving it as pairs grow while fixed-state linear attention degrades."""
    return [associative_recall(pairs=p, queries=p, keys=keys_per_pair * p, values=values, name=f"recall-{p}-pairs")
            for p in pairs]


def copy_from(distance: int, length: int, span: int = 8, symbols: int = 16) -> Task:
    """The first ``span`` tokens are random symbols; the ``span`` positions starting at ``distance``
    must repeat them. Filler (token 0) elsewhere. A local model solves short distances only."""

    def make(generator: torch.Generator, batch: int):
        tokens = torch.zeros(batch, length, dtype=torch.long)
        content = torch.randint(symbols, (batch, span), generator=generator)
        tokens[:, :span] = content + 1
        targets = torch.full((batch, length), IGNORE)
        targets[:, distance:distance + span] = content
        return tokens, targets

    kind = "long-range-copy" if distance > length // 2 else "local-copy"
    return Task(kind, f"copy {span} symbols over a distance of {distance} in a sequence of {length}",
                "sequence", symbols, make, vocab=symbols + 1, length=length)


def shapes(size: int = 16, noise: float = 0.3) -> Task:
    """Which of three shapes (filled square, plus, X) sits somewhere in a noisy image."""
    stamps = [torch.ones(5, 5), torch.zeros(5, 5), torch.eye(5)]
    stamps[1][2, :] = 1
    stamps[1][:, 2] = 1
    stamps[2] = torch.maximum(stamps[2], torch.eye(5).flip(0))

    def make(generator: torch.Generator, batch: int):
        images = torch.randn(batch, 1, size, size, generator=generator) * noise
        labels = torch.randint(len(stamps), (batch,), generator=generator)
        rows = torch.randint(size - 4, (batch,), generator=generator)
        cols = torch.randint(size - 4, (batch,), generator=generator)
        for i in range(batch):
            images[i, 0, rows[i]:rows[i] + 5, cols[i]:cols[i] + 5] += stamps[labels[i]]
        return images, labels

    return Task("shapes", f"which of 3 shapes is in a {size}x{size} noisy image", "image", len(stamps), make)


COPY_LENGTH = 144  # one layer with a window of 128 reaches 128 positions back: the long copy spans 136


def default_tasks() -> list[Task]:
    """The quality suite's tasks."""
    return [*recall_sweep(), copy_from(COPY_LENGTH - 8, COPY_LENGTH), copy_from(8, COPY_LENGTH), shapes()]
