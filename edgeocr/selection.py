"""Token selection: the strategy, fixed when a session loads its artifact, that turns the decoder's run into each
slot's next token.

Both strategies keep HunyuanOCR's decoding contract (spec §7.4): greedy argmax after an HF-style repetition
penalty over every unique id of the prompt and of the output so far.  They differ in where that runs:

  HostSelection   the graph returns logits [N, V]; the penalty and the argmax run here, each slot's seen ids
                  kept in a RepetitionPenalty.  Works with every artifact and every backend.
  graph selection the artifact was exported with --select-on-device: the graph applies the penalty and picks
                  the token itself from per-slot `seen` rows and penalties held in the session's buffers, so
                  only token ids cross to the host.  Its strategy object belongs to the backend that owns
                  those buffers (edgeocr.backends.ort.OrtGraphSelection, edgeocr.backends.tensorrt's
                  TrtGraphSelection).

A session's `selection()` returns the strategy its artifact needs; the slot scheduler drives decoding through
it and never asks which one it has.  Both give the same tokens (tests/test_demo_model.py, tests/test_gpu.py).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Selection(Protocol):
    """How a session's slots get their next tokens (see module doc).  Each method runs the decoder once."""

    where: str           # "host" | "graph": reported by bench and the daemon's info

    def first(self, slot: int, prompt_ids: np.ndarray, penalty: float, cos: np.ndarray, sin: np.ndarray) -> int:
        """A new sequence in `slot`: its prompt's ids start its seen set, `penalty` is its repetition penalty;
        prefill the prompt (input_ids [S] int64, cos/sin [S, D]) and return the first token."""
        ...

    def next(self, tokens: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray, live: np.ndarray,
             out: np.ndarray) -> np.ndarray:
        """One decode step of every slot: each live slot's last token (tokens [N] int64, at cache row pos [N])
        joins its seen set; the step runs; each live slot's next token goes into out [N] int64 (idle slots:
        don't-care), which is returned."""
        ...


class RepetitionPenalty:
    """HF semantics: for each unique id seen, logit / p if logit > 0 else logit * p."""

    def __init__(self, vocab: int, penalty: float, prompt_ids: np.ndarray):
        self.p = np.float32(penalty)
        self.seen = np.zeros(vocab, dtype=bool)
        self.seen[np.asarray(prompt_ids, np.int64)] = True
        self.ids = np.flatnonzero(self.seen)

    def add(self, token: int) -> None:
        if not self.seen[token]:
            self.seen[token] = True
            self.ids = np.append(self.ids, token)

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        if self.p == 1.0:
            return logits
        sel = logits[self.ids]
        logits[self.ids] = np.where(sel < 0, sel * self.p, sel / self.p)
        return logits


class HostSelection:
    """Penalty and argmax on the host over the logits the session returns (`session.prefill` / `session.step`)."""

    where = "host"

    def __init__(self, session):
        self.session = session
        self.penalties: list[RepetitionPenalty | None] = [None] * session.slots   # per slot, set by first()

    def first(self, slot: int, prompt_ids: np.ndarray, penalty: float, cos: np.ndarray, sin: np.ndarray) -> int:
        logits = self.session.prefill(slot, prompt_ids, cos, sin)
        rp = self.penalties[slot] = RepetitionPenalty(self.session.vocab_size, penalty, prompt_ids)
        return int(np.argmax(rp(logits)))

    def next(self, tokens: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray, live: np.ndarray,
             out: np.ndarray) -> np.ndarray:
        logits = self.session.step(tokens, pos, cos, sin, live)
        for i in np.flatnonzero(live):
            rp = self.penalties[i]
            if rp is None:
                raise RuntimeError(f"slot {i} is live but was never started with first()")
            rp.add(int(tokens[i]))
            out[i] = int(np.argmax(rp(logits[i])))
        return out
