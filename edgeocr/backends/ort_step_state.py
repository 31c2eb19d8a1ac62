"""The GroupQueryAttention session for a decoder with device-resident step state (quantize.step_state): a decode
step copies nothing from the host.

Per slot, the step state lives in device buffers in two sets, A and B (N = slots, V = vocab):

    ids[k]     [N] int64      each slot's incoming token (the previous step's next_token)
    pos[k]     [N] int64      its cache row (seqlens_k and the RoPE row are derived in the graph)
    seens[k]   [N, V] float   its repetition-penalty set
and once: live [N] int64 (1 = decoding), penalty [N] float32, and the zero cos/sin rows a step binds (unread).

Binding k reads set k and writes set 1 - k (`next_token`, `positions_next`, `seen_next`): no output aliases an input
of the same run.  The two bindings are made once and alternate, each replayed as its own CUDA graph (graph ids 1
and 2).  The host writes these buffers only when a page is admitted (`first`: its seen row, penalty and live flag;
the prefill itself writes its first token and next row into the set the next step reads) or leaves (its live
flag and row back to 0, so an idle slot stays at row 0).  `total_sequence_length`, which GroupQueryAttention reads
from host memory, is a host scalar bound once to the cache length (on CUDA the existing flavour does the same;
on the CPU the kernel attends each sequence over its own seqlens_k whatever the bound).  What a step reads back
is each slot's next token (8 bytes a slot).

The session keeps a host record of what the device state holds (h_tok, h_pos, h_live); the Selection protocol's
arguments stay the truth: a slot whose record disagrees with them is written from them before the step
(`resyncs` counts those writes; a scheduler's run makes none).
"""

from __future__ import annotations

import logging

import numpy as np

from edgeocr.backends.ort import GqaSession

log = logging.getLogger("edgeocr")

UNKNOWN = -1                  # h_tok of a slot whose device token the host has not read back


class StepStateSession(GqaSession):
    """GqaSession over a step-state decoder (see module doc); selection() is StepStateSelection."""

    step_graphs = 2                       # bindings A->B and B->A
    prefill_beside_ok = False             # the prefill writes the step state the next step reads
    _len_name, _len_dtype = "positions", np.int64      # the prefill binds its last row, S - 1

    @property
    def capture_steps(self) -> int:
        """Decode steps after which every step binding's CUDA graph is captured (ONNX Runtime captures a graph id
        on its third run): a scheduler keeps other CUDA work off the device until then."""
        return 3 * self.step_graphs

    def _alloc_flavour(self) -> None:
        super()._alloc_flavour()
        mem, n, v = self.mem, self.slots, self.vocab_size
        self.st_total[...] = self.cache_len               # bound once, never written again
        self.ids = [mem.alloc((n,), np.int64) for _ in range(2)]
        self.pos = [mem.alloc((n,), np.int64) for _ in range(2)]
        self.seens = [self.seen, mem.alloc((n, v), np.float32)]
        self.live = mem.alloc((n,), np.int64)
        self.table_on, self.table_off = mem.alloc((1,), np.bool_), mem.alloc((1,), np.bool_)
        self.pf_live = mem.alloc((1,), np.int64)        # a prefill's positions_next = (S - 1) + 1
        mem.write(self.table_on, np.ones((1,), np.bool_))
        mem.write(self.pf_live, np.ones((1,), np.int64))
        mem.sync()
        self.side = 0                                     # the set the next step reads
        self.h_tok = np.full((n,), UNKNOWN, np.int64)    # host record of the device state
        self.h_pos = np.zeros((n,), np.int64)
        self.h_live = np.zeros((n,), bool)
        self.started = np.zeros((n,), bool)               # slot has had a page started by StepStateSelection.first
        self.resyncs = 0                                  # slots written from the caller's state before a step
        self.h_one = np.ones((1,), np.int64)
        self.h_zero = np.zeros((1,), np.int64)

    # ------------------------------------------------------------ bindings
    def _bind_step(self) -> None:
        """Both step bindings, made once (a CUDA graph replays each one's addresses)."""
        self.step_bindings = [self._bind_side(k) for k in (0, 1)]

    def _bind_side(self, k: int):
        b, o, n = self.decoder.io_binding(), 1 - k, self.slots
        self._bind(b, "input_ids", self.ids[k], [n, 1])
        self._bind(b, "image_embeds", self.no_image)
        self._bind(b, "cos", self.st_cos)                 # [N, 1, D] zeros: a step takes the table's rows
        self._bind(b, "sin", self.st_sin)
        self._bind(b, "positions", self.pos[k])
        self._bind(b, "live", self.live)
        self._bind(b, "rope_from_table", self.table_on)
        self._bind(b, "seen", self.seens[k])
        self._bind(b, "penalty", self.penalty)
        self._bind_total(b, self.st_total)
        self._bind_caches(b, None)
        self._bind(b, "logits", self.logits, output=True)
        self._bind(b, "next_token", self.ids[o], output=True)
        self._bind(b, "positions_next", self.pos[o], output=True)
        self._bind(b, "seen_next", self.seens[o], output=True)
        return b

    def _bind_prefill_select(self, b, slot: int) -> None:
        """The prefill reads the slot's seen row of the set the next step reads and writes its first token and
        next row there; its seen_next goes to the other set's row (which that step then overwrites)."""
        k, v = self.side, self.vocab_size
        self._bind(b, "seen", self.seens[k], [1, v], index=slot)
        self._bind(b, "penalty", self.penalty, [1], index=slot)
        self._bind(b, "next_token", self.ids[k], [1], index=slot, output=True)
        self._bind(b, "positions_next", self.pos[k], [1], index=slot, output=True)
        self._bind(b, "seen_next", self.seens[1 - k], [1, v], index=slot, output=True)
        self._bind(b, "live", self.pf_live)
        self._bind(b, "rope_from_table", self.table_off)

    def _after_prefill(self, slot: int, s: int) -> None:
        self.h_pos[slot], self.h_tok[slot] = s, UNKNOWN

    # ------------------------------------------------------------ the step
    def sync_state(self, tokens: np.ndarray, pos: np.ndarray, live: np.ndarray) -> None:
        """Make the device state the caller's: a slot that left (live in the record, not in `live`) goes idle at
        row 0; a live slot whose record differs from tokens/pos is written from them.  Writes nothing when the
        record already agrees, which it does for every step a scheduler runs between admissions and leaves."""
        live = np.asarray(live, bool)
        k, mem, wrote = self.side, self.mem, False
        for slot in np.flatnonzero(self.h_live & ~live):
            slot = int(slot)
            mem.write(self.live, self.h_zero, offset=slot)
            mem.write(self.pos[k], self.h_zero, offset=slot)
            self.h_live[slot], self.h_pos[slot], wrote = False, 0, True
        for slot in np.flatnonzero(live):
            slot = int(slot)
            p, t = int(pos[slot]), int(tokens[slot])
            if not 0 <= p < self.cache_len:
                raise IndexError(f"cache position outside [0, {self.cache_len}): slot {slot} at {p}")
            if self.h_live[slot] and self.h_pos[slot] == p and self.h_tok[slot] == t:
                continue
            mem.write(self.ids[k], np.asarray([t], np.int64), offset=slot)
            mem.write(self.pos[k], np.asarray([p], np.int64), offset=slot)
            if not self.h_live[slot]:
                mem.write(self.live, self.h_one, offset=slot)
            self.h_live[slot], self.h_pos[slot], self.h_tok[slot], wrote = True, p, t, True
            self.resyncs += 1
            log.debug("step state of slot %d written from the host (row %d, token %d)", slot, p, t)
        if wrote:
            mem.sync()                    # the copies have landed before the graph (on its own stream) reads them

    def run_step(self) -> int:
        """One decode step of every slot from set `side` into the other; returns the set it wrote."""
        k = self.side
        ro = self._ro_steps[k] if self.cuda_graph else self._ro_plain
        self.decoder.run_with_iobinding(self.step_bindings[k], ro)
        self.side = 1 - k
        self.h_pos += self.h_live
        return 1 - k

    def _step(self, token_ids: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray,
              live: np.ndarray) -> None:
        """The Session seam's step (logits read back): the state taken from the arguments, cos/sin from the
        graph's table (they are the same rows)."""
        self.sync_state(token_ids, pos, live)
        self.run_step()
        self.h_tok[:] = UNKNOWN

    def selection(self):
        return StepStateSelection(self)


class StepStateSelection:
    """edgeocr.selection's graph selection on a StepStateSession: `first` starts a page's device state, `next` runs
    a step from the state the graph left and reads back only each slot's next token (8 bytes a slot)."""

    where = "graph"

    def __init__(self, session: StepStateSession):
        self.s = session

    def first(self, slot: int, prompt_ids: np.ndarray, penalty: float, cos: np.ndarray, sin: np.ndarray) -> int:
        s, k = self.s, self.s.side
        s._start_selection(s.seens[k], slot, prompt_ids, penalty)
        s._prefill(slot, prompt_ids, cos, sin)          # syncs the writes above before it runs
        if not s.h_live[slot]:                          # only once the prefill ran: a slot whose admission failed
            s.mem.write(s.live, s.h_one, offset=slot)   # must not advance
            s.mem.sync()
        tok = int(s.mem.read(s.ids[k], s.first_tokens, offset=slot)[0])
        s.h_tok[slot], s.h_live[slot], s.started[slot] = tok, True, True
        return tok

    def next(self, tokens: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray, live: np.ndarray,
             out: np.ndarray) -> np.ndarray:
        s = self.s
        for slot in np.flatnonzero(live):
            if not s.started[slot]:
                raise RuntimeError(f"slot {int(slot)} is live but was never started with first()")
        s.sync_state(tokens, pos, live)
        written = s.run_step()
        out[:] = s.mem.read(s.ids[written], s.h_next)
        s.h_tok[:] = out
        return out
