"""Device-resident step state (`python -m quantize step-state`, edgeocr.backends.ort_step_state): the decode step
reads its positions, input ids and seen sets from device buffers and writes the next step's, so a step copies
nothing from the host.  On ONNX Runtime's CPU provider: the same tokens as the GQA + in-graph-selection artifact it
was made from (3 slots, pages of different lengths admitted mid-run and finishing, vision ahead, a fused graph), and
no host write in a step, counted on the session's memory."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import CACHE_LEN, PREFILL_LEN, make_image
from edgeocr import rope
from edgeocr.artifact import read
from edgeocr.decode import DecodeOptions
from edgeocr.model import OCRModel
from edgeocr.slots import drive


def _export(ckpt, out, **kw):
    from quantize.export import ExportOptions, export
    export(ckpt, out, ExportOptions(cache_len=CACHE_LEN, prefill_len=PREFILL_LEN, **kw))
    return out


@pytest.fixture(scope="module")
def arts(ckpt_b, tmp_path_factory):
    """tiny-b (GQA 6, 3 layers) with 3 slots: the gqa + in-graph-selection export, its step-state form, its
    portable fusion and that one's step-state form."""
    from quantize.fuse import FuseOptions, fuse_artifact
    from quantize.step_state import step_state_artifact
    root = tmp_path_factory.mktemp("stepstate")
    a = {"select": _export(ckpt_b, root / "select", slots=3, attention="gqa", select_on_device=True)}
    step_state_artifact(a["select"], root / "state")
    fuse_artifact(a["select"], root / "fused", FuseOptions(target="portable"))
    step_state_artifact(root / "fused", root / "fused-state")
    a.update(state=root / "state", fused=root / "fused", fused_state=root / "fused-state")
    return a


def _pages(n):
    return [make_image(50 + i, (420 + 60 * i, 900 - 50 * i)) for i in range(n)]


LENGTHS = [3, 11, 5, 8, 2, 7, 9]


def _run(model, pages, lengths=LENGTHS, vision_ahead=False, on_step=None):
    """Every page through the model's scheduler (pages of different lengths, each admitted as a slot frees);
    {index: token ids}."""
    sched = model.scheduler(vision_ahead=vision_ahead)
    reqs = [(i, model.page(p, task="spotting", options=DecodeOptions(max_new_tokens=n, repetition_penalty=1.3)))
            for i, (p, n) in enumerate(zip(pages, lengths))]
    done = {}
    for events in drive(sched, reqs):
        done.update((ev.tag, ev.result.token_ids) for ev in events if ev.result is not None)
        if on_step:
            on_step(sched)
    return [done[i] for i in range(len(pages))]


def test_the_pass_writes_the_state_inputs_outputs_and_table(arts):
    m = read(arts["state"])
    assert m.decoder.step_state and not read(arts["select"]).decoder.step_state
    ins = {e["name"]: e for e in m.decoder.inputs}
    outs = {e["name"]: e for e in m.decoder.outputs}
    assert "seqlens_k" not in ins and "total_sequence_length" in ins
    assert [ins[k]["dtype"] for k in ("positions", "live", "rope_from_table")] == ["int64", "int64", "bool"]
    assert outs["positions_next"]["dtype"] == "int64" and outs["seen_next"]["shape"] == ["batch", m.vocab_size]
    assert m.export["step_state"]["rewired"]["cos_readers"] > 0
    # copied, not hard-linked: onnx refuses a weights file with several links (quantize weight-int8 of either)
    assert all((arts[a] / f).stat().st_nlink == 1 for a in ("select", "state") for f in m.files)
    import onnx
    from onnx import numpy_helper
    g = onnx.load(str(arts["state"] / m.decoder.file)).graph
    table = {t.name: numpy_helper.to_array(t) for t in g.initializer if t.name.startswith("step_state_table")}
    r = m.rope
    cos, sin = rope.text_table(m.cache_len, rope.inv_freq(r.head_dim, r.theta, r.alpha))
    np.testing.assert_array_equal(table["step_state_table_cos"], cos)
    np.testing.assert_array_equal(table["step_state_table_sin"], sin)


def test_the_pass_refuses_what_it_cannot_rewrite(ckpt_b, arts, tmp_path):
    from quantize.step_state import step_state_artifact
    host = _export(ckpt_b, tmp_path / "host", attention="gqa")
    with pytest.raises(ValueError, match="--attention gqa --select-on-device.*selection on the host"):
        step_state_artifact(host, tmp_path / "x")
    with pytest.raises(ValueError, match="already holds its step state"):
        step_state_artifact(arts["state"], tmp_path / "y")
    with pytest.raises(ValueError, match="OUT must differ"):
        step_state_artifact(arts["select"], arts["select"])


def test_text_rope_rows_are_the_same_for_every_page(arts):
    """What the stored table relies on: a generated token's XD-RoPE row, built from a page's own position ids,
    is the text table's row at its cache position, whatever the page's prompt and the layout."""
    model = OCRModel(arts["select"])
    for task in ("spotting", "structured_parse"):
        ids = model.prompt_ids(model.instruction(task, None)[0])
        n = len(ids) + 40                                    # the prompt, then 40 generated tokens
        start = int(np.flatnonzero(ids == model.prompt_tokens.image)[0])
        grid = (model.image_spec.grid, model.image_spec.grid)
        pos = rope.position_ids(n, start, grid, model.image_spec.merge_size)
        for layout in rope.LAYOUTS:
            cos, sin = rope.cos_sin(pos, model.freqs, model.artifact.rope.sections, layout)
            np.testing.assert_array_equal(cos[len(ids):], model.table_cos[len(ids):n])
            np.testing.assert_array_equal(sin[len(ids):], model.table_sin[len(ids):n])


@pytest.mark.parametrize("pair", [("select", "state"), ("fused", "fused_state")])
def test_same_tokens_as_the_graph_selection_artifact(arts, pair):
    """7 pages of 2-11 tokens through 3 slots (pages finish at different steps, the next one takes the freed
    slot while the others decode): every page's tokens equal the artifact it was made from, with no slot's state
    ever written from the host between admissions."""
    pages = _pages(7)
    ref = _run(OCRModel(arts[pair[0]]), pages)
    model = OCRModel(arts[pair[1]])
    assert type(model.session).__name__ == "StepStateSession" and model.session.selection().where == "graph"
    assert _run(model, pages) == ref
    assert model.session.resyncs == 0
    assert len({tuple(t) for t in ref}) > 3                 # the pages really differ
    s, idle, n = model.session, np.zeros(3, bool), np.zeros(3, np.int64)
    for _ in range(2):                                      # the last pages leave; idle slots stay at row 0
        s.selection().next(n, n, model.table_cos[n], model.table_sin[n], idle, n.copy())
        assert not s.h_live.any() and [s.mem.read(p, np.ones(3, np.int64)).tolist() for p in s.pos] == [[0] * 3] * 2


def test_vision_ahead_gives_the_same_tokens(arts):
    """Each page's vision on the worker thread and its prefill between two steps, as on CUDA."""
    pages = _pages(7)
    ref = _run(OCRModel(arts["select"]), pages)
    model = OCRModel(arts["state"])
    assert model.session.capture_steps == 6                # two step graphs, each captured on its third run
    assert _run(model, pages, vision_ahead=True) == ref


class _CountingMemory:
    """The session's memory with every host-to-device write counted."""

    def __init__(self, inner):
        self.inner, self.writes = inner, 0

    def write(self, *a, **kw):
        self.writes += 1
        return self.inner.write(*a, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _writes_per_step(model):
    """[(writes during the step, slots that left since the previous step)] over a run of 7 pages."""
    s = model.session
    mem = s.mem = _CountingMemory(s.mem)
    sel = s.selection()
    record, last_live = [], np.zeros(s.slots, bool)

    class Counted:
        where = sel.where

        def first(self, *a):
            return sel.first(*a)

        def next(self, tokens, pos, cos, sin, live, out):
            nonlocal last_live
            before = mem.writes
            r = sel.next(tokens, pos, cos, sin, live, out)
            record.append((mem.writes - before, int((last_live & ~live).sum())))
            last_live = live.copy()
            return r

    s.selection = lambda: Counted()
    try:
        _run(model, _pages(7))
    finally:
        s.mem = mem.inner
        del s.selection
    return record


def test_a_step_writes_nothing_from_the_host(arts):
    """Counted on the session's memory object: a step of the step-state form writes nothing, except for a slot
    whose page left since the last step (its live flag and row, two writes); the artifact it was made from writes
    its inputs every step (ids, cos, sin, lengths, one seen flag per live slot)."""
    record = _writes_per_step(OCRModel(arts["state"]))
    quiet = [w for w, left in record if left == 0]
    assert len(quiet) >= 10 and set(quiet) == {0}, record
    assert all(w == 2 * left for w, left in record), record
    before = _writes_per_step(OCRModel(arts["select"]))
    assert all(w >= 5 for w, _ in before), before


def test_a_failed_admission_leaves_its_slot_idle(arts):
    """A prompt the prefill refuses raises before the slot is marked live: the slot's row stays at 0 through the
    steps that follow (an idle slot that advanced would one day write past its cache)."""
    model = OCRModel(arts["state"])
    s, sel = model.session, model.session.selection()
    ids = np.ones(PREFILL_LEN + 1, np.int64)
    cos = np.zeros((len(ids), s.head_dim), np.float32)
    with pytest.raises(ValueError, match="longer than this artifact's prefill_len"):
        sel.first(1, ids, 1.1, cos, cos)
    n, idle = np.zeros(3, np.int64), np.zeros(3, bool)
    for _ in range(3):
        sel.next(n, n, model.table_cos[n], model.table_sin[n], idle, n.copy())
    assert s.mem.read(s.live, np.ones(3, np.int64)).tolist() == [0, 0, 0]
    assert [s.mem.read(p, np.ones(3, np.int64)).tolist() for p in s.pos] == [[0] * 3] * 2


def test_step_seam_gives_the_same_logits(arts):
    """The Session seam's step (teacher-forced logits, host selection) on the step-state decoder equals the
    decoder it was made from: the table's rows are the host's rows, the lengths the same."""
    outs = []
    for name in ("select", "state"):
        model = OCRModel(arts[name])
        s = model.session
        ids = model.prompt_ids(model.instruction("spotting", None)[0])
        cos, sin = model.rope_tables(ids)
        s.encode_image(model.prepare(_pages(1)[0]).pixels, 1)
        rows = [s.prefill(1, ids, cos, sin).copy()]
        live = np.array([False, True, False])
        for n, t in enumerate([5, 17, 3, 300, 9]):
            pos = np.array([0, len(ids) + n, 0], np.int64)
            tok = np.array([0, t, 0], np.int64)
            rows.append(s.step(tok, pos, model.table_cos[pos], model.table_sin[pos], live)[1].copy())
        outs.append(np.stack(rows))
    np.testing.assert_array_equal(outs[0], outs[1])


def test_bench_reports_no_host_copy_per_step(arts):
    from edgeocr.bench import step_copies
    state, select = step_copies(read(arts["state"])), step_copies(read(arts["select"]))
    assert state == {"host_to_device": 0, "device_to_host": 3 * 8, "cache_rows_device_to_device": 0}
    assert select["host_to_device"] > 0 and select["device_to_host"] == 3 * 8
