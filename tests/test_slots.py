"""N-slot artifacts: pages decoded together get exactly the tokens they get decoded alone (same artifact,
CPU FP32), which equal the one-slot artifact's (and so transformers', see test_parity), for both decoder
flavours, host and in-graph selection, every task prompt, slots refilled mid-run, INT8 and weight-INT8."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import CACHE_LEN, PREFILL_LEN, make_image
from edgeocr import prompts
from edgeocr.decode import DecodeOptions
from edgeocr.model import OCRModel

FLAVOURS = {"masked": {}, "masked-select": {"select_on_device": True}, "gqa": {"attention": "gqa"},
            "gqa-select": {"attention": "gqa", "select_on_device": True}}


def _export(ckpt, out, **kw):
    from quantize.export import ExportOptions, export
    export(ckpt, out, ExportOptions(cache_len=CACHE_LEN, prefill_len=PREFILL_LEN, **kw))
    return out


@pytest.fixture(scope="module")
def slot_arts(ckpt_b, tmp_path_factory):
    """tiny-b (GQA 6, 3 layers, stored lm_head) with 3 slots in every flavour, and its 1-slot export."""
    root = tmp_path_factory.mktemp("slots")
    arts = {name: _export(ckpt_b, root / name, slots=3, **kw) for name, kw in FLAVOURS.items()}
    arts["one"] = _export(ckpt_b, root / "one")
    return arts


def _pages(n):
    return [make_image(30 + i, (420 + 60 * i, 900 - 50 * i)) for i in range(n)]


def test_manifest_and_cache_shape(slot_arts):
    m = OCRModel(slot_arts["gqa"])
    assert m.slots == m.artifact.kv.slots == 3
    k = m.session.keys[0].host
    assert k.shape == (3, m.artifact.kv.kv_heads, CACHE_LEN, m.artifact.kv.head_dim)
    assert m.session.memory_bytes()["kv_cache"] == 3 * CACHE_LEN * m.artifact.kv.bytes_per_token


@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_many_pages_equal_each_page_alone(slot_arts, flavour):
    """7 pages through 3 slots (slots refilled as pages finish), each page's tokens identical to decoding it
    alone, and alone on the N-slot artifact identical to the one-slot artifact."""
    opts = DecodeOptions(max_new_tokens=9, repetition_penalty=1.3)
    pages = _pages(7)
    one = OCRModel(slot_arts["one"])
    ref = [one.recognize(p, task="spotting", options=opts).token_ids for p in pages]
    model = OCRModel(slot_arts[flavour])
    alone = [model.recognize(p, task="spotting", options=opts).token_ids for p in pages]
    assert alone == ref
    order, got = [], {}
    for i, r in model.recognize_many(iter(pages), task="spotting", options=opts):
        order.append(i)
        got[i] = r.token_ids
    assert sorted(order) == list(range(7)) and [got[i] for i in range(7)] == alone
    assert len({tuple(t) for t in alone}) > 3          # the pages really differ


def test_pages_of_different_lengths_refill_slots_mid_run(slot_arts):
    """Pages with different max_new_tokens finish at different steps; a freed slot takes the next page
    while the others keep decoding, and every page still matches its solo run."""
    model = OCRModel(slot_arts["gqa-select"])
    pages = _pages(6)
    lengths = [3, 11, 5, 8, 2, 7]
    opts = [DecodeOptions(max_new_tokens=n, repetition_penalty=1.2) for n in lengths]
    alone = [model.recognize(p, task="structured_parse", options=o).token_ids for p, o in zip(pages, opts)]
    reqs = [model.page(p, task="structured_parse", options=o) for p, o in zip(pages, opts)]
    sched = model.scheduler()
    pending, done, admitted_while_busy = list(enumerate(reqs)), {}, 0
    while pending or sched.live():
        while pending and sched.free():
            if sched.live():
                admitted_while_busy += 1
            i, r = pending.pop(0)
            sched.admit(r, i)
        for ev in sched.step():
            if ev.result is not None:
                done[ev.tag] = ev.result
    assert admitted_while_busy >= 3
    assert [done[i].token_ids for i in range(6)] == alone
    assert [len(t) for t in alone] == lengths
    assert all(done[i].finish_reason == "length" for i in range(6))


@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_one_slot_prefilled_with_prompts_of_other_lengths(slot_arts, flavour):
    """A slot's prefill binding is kept from page to page (OrtSession._prefill_binding) and only the inputs of
    the prompt's length are bound again: prompts of other lengths one after another on one model each give the
    tokens a fresh model gives them."""
    opts = DecodeOptions(max_new_tokens=6, repetition_penalty=1.2)
    page = _pages(1)[0]
    tasks = prompts.task_names()
    model = OCRModel(slot_arts[flavour])
    seq = [model.recognize(page, task=t, options=opts) for t in tasks + tasks[:1]]
    assert len({r.prompt_tokens for r in seq}) > 2                  # the prompts' lengths really differ
    fresh = [OCRModel(slot_arts[flavour]).recognize(page, task=t, options=opts) for t in tasks]
    assert [r.token_ids for r in seq] == [r.token_ids for r in fresh + fresh[:1]]
    assert len(model.session._pf_bindings) == 1


@pytest.mark.parametrize("task,lang", [(t, "zh") for t in prompts.task_names()] + [("spotting", "en")])
def test_every_task_prompt_in_slots(slot_arts, task, lang):
    model = OCRModel(slot_arts["masked"])
    opts = DecodeOptions(max_new_tokens=5)
    pages = _pages(4)
    alone = [model.recognize(p, task=task, lang=lang, options=opts).token_ids for p in pages]
    many = dict(model.recognize_many(pages, task=task, lang=lang, options=opts))
    assert [many[i].token_ids for i in range(4)] == alone


def test_cancel_frees_the_slot_and_others_go_on(slot_arts):
    model = OCRModel(slot_arts["gqa"])
    opts = DecodeOptions(max_new_tokens=10)
    a, b = _pages(2)
    alone_b = model.recognize(b, options=opts).token_ids
    sched = model.scheduler()
    sched.admit(model.page(a, options=opts), "a")
    sched.admit(model.page(b, options=opts), "b")
    sched.step()
    sched.step()
    res = sched.cancel("a")
    assert res.finish_reason == "cancelled" and res.generated_tokens == 3 and sched.free() == 2
    assert sched.cancel("a") is None
    out = None
    while out is None:
        out = next((ev.result for ev in sched.step() if ev.tag == "b" and ev.result), None)
    assert out.token_ids == alone_b


def test_bad_page_raises_and_nothing_is_admitted(slot_arts):
    from edgeocr.errors import ImageError
    model = OCRModel(slot_arts["masked"])
    sched = model.scheduler()
    with pytest.raises(ImageError):
        sched.admit(model.page(b"not an image"), "x")
    assert sched.free() == 3
    with pytest.raises(ImageError):
        list(model.recognize_many([make_image(1), b"not an image"], options=DecodeOptions(max_new_tokens=2)))


def test_weight_int8_and_int8_builds_keep_slots(slot_arts, ckpt_b, tmp_path):
    """Both 8-bit builds of a slot artifact: the slots survive, and pages decoded together equal alone."""
    from pathlib import Path

    from quantize.int8 import Int8Options, build_int8
    from quantize.weight_int8 import build_weight_int8
    w8 = build_weight_int8(slot_arts["gqa-select"], tmp_path / "w8", 32, progress=lambda _: None)
    calib = Path(__file__).resolve().parents[1] / "calibration_data" / "calib"
    q8 = build_int8(slot_arts["masked"], calib, tmp_path / "q8", Int8Options(calib_images=3, holdout_images=1,
                                                                              decode_tokens=4))
    opts = DecodeOptions(max_new_tokens=6)
    pages = _pages(4)
    for art, out in ((w8, tmp_path / "w8"), (q8, tmp_path / "q8")):
        assert art.slots == 3
        model = OCRModel(out)
        alone = [model.recognize(p, options=opts).token_ids for p in pages]
        many = dict(model.recognize_many(pages, options=opts))
        assert [many[i].token_ids for i in range(4)] == alone


def test_slot_step_reads_only_its_own_rows(slot_arts):
    """A page decoding next to another produces the same logits at every step as alone (host selection)."""
    model = OCRModel(slot_arts["masked"])
    opts = DecodeOptions(max_new_tokens=4)
    a, b = _pages(2)
    seen = []
    inner = model.session

    class Tap:
        def __getattr__(self, name):
            return getattr(inner, name)

        def step(self, tokens, pos, cos, sin, live):
            out = inner.step(tokens, pos, cos, sin, live)
            seen.append(out.copy())
            return out

        def selection(self):
            from edgeocr.selection import HostSelection
            return HostSelection(self)             # selects over the tapped logits

    model.session = Tap()
    try:
        model.recognize(a, options=opts)
        solo = [s[0] for s in seen]
        seen.clear()
        sched = model.scheduler()
        sched.admit(model.page(a, options=opts), "a")
        sched.admit(model.page(b, options=opts), "b")
        while sched.live():
            sched.step()
        together = [s[0] for s in seen[:len(solo)]]
    finally:
        model.session = inner
    np.testing.assert_array_equal(np.stack(solo), np.stack(together))


def test_reslot_gives_the_same_decoding(slot_arts, tmp_path):
    """`python -m quantize reslot`: a one-slot export given 3 slots decodes like the 3-slot export."""
    import subprocess
    import sys
    out = tmp_path / "re3"
    subprocess.run([sys.executable, "-m", "quantize", "reslot", str(slot_arts["one"]), str(out), "--slots", "3"],
                   check=True, capture_output=True, timeout=120)
    opts = DecodeOptions(max_new_tokens=6)
    pages = _pages(4)
    a, b = OCRModel(out), OCRModel(slot_arts["masked"])
    assert a.slots == 3
    assert dict((i, r.token_ids) for i, r in a.recognize_many(pages, options=opts)) == \
        dict((i, r.token_ids) for i, r in b.recognize_many(pages, options=opts))


def test_pages_that_finish_on_their_first_token(slot_arts):
    """max_new_tokens=1: every page ends at its prefill; each is still reported once and frees its slot."""
    model = OCRModel(slot_arts["gqa-select"])
    got = list(model.recognize_many(_pages(5), options=DecodeOptions(max_new_tokens=1)))
    assert sorted(i for i, _ in got) == list(range(5))
    assert all(r.generated_tokens == 1 and r.finish_reason == "length" for _, r in got)


# ---------------------------------------------------------------- vision ahead
def _run(sched, reqs, on_error=None):
    """Every (tag, Page) through `sched` with drive(); {tag: result}."""
    from edgeocr.slots import drive
    done = {}
    for events in drive(sched, reqs, on_error):
        done.update((ev.tag, ev.result) for ev in events if ev.result is not None)
    return done


@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_vision_ahead_gives_each_page_its_tokens_alone(slot_arts, flavour):
    """With each page's vision on the worker thread and its prefill between two steps, 7 pages through 3
    slots get exactly the tokens they get alone, in every flavour."""
    model = OCRModel(slot_arts[flavour])
    opts = DecodeOptions(max_new_tokens=9, repetition_penalty=1.3)
    pages = _pages(7)
    alone = [model.recognize(p, task="spotting", options=opts).token_ids for p in pages]
    sched = model.scheduler(vision_ahead=True)
    assert sched.vision_ahead and not model.scheduler().vision_ahead       # off unless EDGEOCR_VISION_AHEAD=1
    done = _run(sched, [(i, model.page(p, task="spotting", options=opts)) for i, p in enumerate(pages)])
    assert [done[i].token_ids for i in range(7)] == alone
    assert all(done[i].timings_ms["vision"] > 0 for i in range(7))


def _slow_vision(model, delay):
    """Make the session's vision take `delay` s longer; returns the (start, end) spans and step times."""
    import time
    s = model.session
    spans, steps = [], []
    real_encode, real_step = s.encode_image, s.step

    def encode(pixels, slot=0):
        t0 = time.perf_counter()
        time.sleep(delay)
        real_encode(pixels, slot)
        spans.append((t0, time.perf_counter()))

    def step(*a):
        steps.append(time.perf_counter())
        return real_step(*a)
    s.encode_image, s.step = encode, step
    return spans, steps


def test_vision_ahead_runs_while_the_other_slots_decode(slot_arts):
    """A page admitted while another decodes: the decoder keeps stepping the first page during the second's
    vision (its 0.4 s), and both pages still get their tokens alone."""
    model = OCRModel(slot_arts["gqa"])
    opts = DecodeOptions(max_new_tokens=120, ignore_stop=True, tail_repetition_stop=False)
    a, b = _pages(2)
    alone = [model.recognize(p, options=opts).token_ids for p in (a, b)]
    spans, steps = _slow_vision(model, 0.4)
    sched = model.scheduler(vision_ahead=True)
    sched.admit(model.page(a, options=opts), "a")
    got = {}
    for _ in range(3):
        sched.step()
    sched.admit(model.page(b, options=opts), "b")
    while sched.live():
        got.update((ev.tag, ev.result) for ev in sched.step() if ev.result is not None)
    assert [got["a"].token_ids, got["b"].token_ids] == alone
    start, end = spans[1]
    assert sum(start < t < end for t in steps) >= 5, "no decode step ran during the second page's vision"


def test_vision_ahead_failure_is_that_page_alone(slot_arts):
    """A page whose vision fails on the worker thread goes to drive()'s admission-error handler with its tag;
    the other pages finish with their own tokens; without a handler the error is raised."""
    model = OCRModel(slot_arts["gqa-select"])
    opts = DecodeOptions(max_new_tokens=6)
    pages = _pages(4)
    alone = [model.recognize(p, options=opts).token_ids for p in pages]
    s, real = model.session, model.session.encode_image
    calls = []

    def encode(pixels, slot=0):
        calls.append(slot)
        if len(calls) == 2:
            raise RuntimeError("vision failed on purpose")
        real(pixels, slot)
    s.encode_image = encode
    errors = []
    reqs = [(i, model.page(p, options=opts)) for i, p in enumerate(pages)]
    done = _run(model.scheduler(vision_ahead=True), reqs, lambda tag, e: errors.append((tag, str(e))))
    assert errors == [(1, "vision failed on purpose")]
    assert sorted(done) == [0, 2, 3] and [done[i].token_ids for i in (0, 2, 3)] == [alone[i] for i in (0, 2, 3)]
    calls.clear()
    with pytest.raises(RuntimeError, match="on purpose"):
        _run(model.scheduler(vision_ahead=True), reqs[:2])


def test_vision_ahead_cancel_while_its_vision_runs(slot_arts):
    """Cancelling a page whose vision is still running frees its slot at once (no token generated); the next
    page admitted into that slot gets its own image and tokens."""
    model = OCRModel(slot_arts["gqa"])
    opts = DecodeOptions(max_new_tokens=8)
    a, b, c = _pages(3)
    alone_a, alone_c = (model.recognize(p, options=opts).token_ids for p in (a, c))
    _slow_vision(model, 0.3)
    sched = model.scheduler(vision_ahead=True)
    sched.admit(model.page(a, options=opts), "a")
    sched.step()                                          # a is prefilled and decoding
    sched.admit(model.page(b, options=opts), "b")
    res = sched.cancel("b")
    assert res.finish_reason == "cancelled" and res.generated_tokens == 0 and sched.free() == 2
    sched.admit(model.page(c, options=opts), "c")         # into b's slot, its vision queued behind b's
    got = {}
    while sched.live():
        got.update((ev.tag, ev.result) for ev in sched.step() if ev.result is not None)
    assert sorted(got) == ["a", "c"] and got["a"].token_ids == alone_a and got["c"].token_ids == alone_c


def test_capture_pending_visions_and_prefills_run_with_nothing_in_flight(slot_arts, monkeypatch):
    """A session whose next vision or prefill may capture a CUDA graph (EDGEOCR_VISION_GRAPH /
    EDGEOCR_PREFILL_GRAPH on CUDA; no other thread may use the device meanwhile): with vision ahead, such a vision
    runs inside admit() on the caller's thread, and such a prefill waits for the visions in flight.  Without
    the hooks a prefill does overlap the next page's vision here, so the test can see the difference; the
    pages' tokens stay their own either way.  A CPU session never captures."""
    import time
    model = OCRModel(slot_arts["gqa"])
    s = model.session
    assert not s.vision_capture_pending() and not s.prefill_capture_pending(0, 10)
    monkeypatch.setenv("EDGEOCR_PREFILL_GRAPH", "1")         # read on CUDA only
    assert not OCRModel(slot_arts["gqa"]).session.prefill_graph
    opts = DecodeOptions(max_new_tokens=8, ignore_stop=True)
    pages = _pages(5)                     # past the slots, so that pages are admitted after the quiet steps
    alone = [model.recognize(p, options=opts).token_ids for p in pages]
    spans, _ = _slow_vision(model, 0.3)
    prefills, real_prefill = [], s._prefill

    def prefill(*args, **kw):
        prefills.append(time.perf_counter())
        return real_prefill(*args, **kw)
    s._prefill = prefill

    def overlaps():
        return sum(t0 < t < t1 for t in prefills for t0, t1 in spans)

    def run(vision_pending, prefill_pending):
        spans.clear(), prefills.clear()
        s.vision_capture_pending = lambda: vision_pending
        s.prefill_capture_pending = lambda slot, n: prefill_pending
        sched = model.scheduler(vision_ahead=True)
        got = _run(sched, [(i, model.page(p, options=opts)) for i, p in enumerate(pages)])
        assert [got[i].token_ids for i in range(5)] == alone

    run(False, False)
    assert overlaps() >= 1, "no prefill overlapped a vision: the test cannot tell the hooks' effect"
    run(False, True)
    assert len(prefills) == 5 and overlaps() == 0
    sched = model.scheduler(vision_ahead=True)
    s.vision_capture_pending = lambda: True
    sched.admit(model.page(pages[0], options=opts), "a")   # its vision ran here: decoding at once, none submitted
    assert sched.decoding() == 1 and len(spans) == 6 and not sched._vision._inflight
    s.vision_graph = True                 # ONNX Runtime keeps a CUDA graph per thread: no vision on the worker
    assert not model.scheduler(vision_ahead=True).vision_ahead


def test_vision_ahead_from_the_environment(slot_arts, monkeypatch):
    """EDGEOCR_VISION_AHEAD=1 turns vision ahead on for every scheduler not told otherwise (run, daemon)."""
    model = OCRModel(slot_arts["masked"])
    monkeypatch.setenv("EDGEOCR_VISION_AHEAD", "1")
    assert model.scheduler().vision_ahead and not model.scheduler(vision_ahead=False).vision_ahead
    monkeypatch.setenv("EDGEOCR_VISION_AHEAD", "0")
    assert not model.scheduler().vision_ahead


def test_vision_ahead_quiet_steps_wait_for_a_cancelled_pages_vision(slot_arts):
    """A page cancelled while its vision runs: the scheduler's first steps (where a CUDA graph may be captured)
    still wait for that vision, so no step runs while it is in flight."""
    model = OCRModel(slot_arts["gqa"])
    opts = DecodeOptions(max_new_tokens=6)
    a, b = _pages(2)
    spans, steps = _slow_vision(model, 0.3)
    sched = model.scheduler(vision_ahead=True)
    sched.admit(model.page(a, options=opts), "a")
    sched.admit(model.page(b, options=opts), "b")
    sched.cancel("b")
    for _ in range(3):
        sched.step()
    assert len(spans) == 2 and len(steps) == 3
    assert all(t > spans[1][1] for t in steps), "a quiet step ran while the cancelled page's vision was in flight"


def test_a_new_scheduler_waits_for_visions_left_in_flight(slot_arts):
    """Visions belong to the session's one worker: a page left in flight by an abandoned scheduler finishes
    before a new scheduler (vision ahead or not) encodes into the same slot, so the new page reads its own
    image."""
    model = OCRModel(slot_arts["gqa"])
    opts = DecodeOptions(max_new_tokens=6)
    a, b = _pages(2)
    alone_b = model.recognize(b, options=opts).token_ids
    spans, _ = _slow_vision(model, 0.3)
    old = model.scheduler(vision_ahead=True)
    old.admit(model.page(a, options=opts), "a")       # then abandoned, its vision in flight
    res = model.recognize(b, options=opts)            # a new scheduler, vision not ahead, slot 0 again
    assert res.token_ids == alone_b
    assert len(spans) == 2 and spans[1][0] >= spans[0][1], "the new page's vision overlapped the old one's"


def test_drive_drops_recorded_failures_when_the_step_fails(slot_arts):
    """A page's vision fails and the same step() then fails: drive() raises the step's error and leaves no
    stale failure behind (the daemon fails every live job itself; a stale entry would be reported twice)."""
    from edgeocr.slots import drive
    model = OCRModel(slot_arts["gqa"])
    opts = DecodeOptions(max_new_tokens=6)
    s, real = model.session, model.session.encode_image
    broken = []

    def encode(pixels, slot=0):
        if slot == 1:
            broken.append(slot)
            raise RuntimeError("vision failed on purpose")
        real(pixels, slot)

    def step(*a):
        raise RuntimeError("step failed on purpose")
    s.encode_image, s.step = encode, step
    sched = model.scheduler(vision_ahead=True)
    errors = []
    reqs = [(i, model.page(p, options=opts)) for i, p in enumerate(_pages(2))]
    with pytest.raises(RuntimeError, match="step failed"):
        for _ in drive(sched, reqs, lambda tag, e: errors.append(tag)):
            pass
    assert broken == [1] and sched.failed == [] and errors == []


def test_vision_ahead_knobs(slot_arts, tmp_path, monkeypatch):
    """`edgeocr run --vision-ahead on` and OCRModel(vision_ahead=...) set the model's schedulers' default; the
    daemon has it as a setting with its env twin and --help line."""
    import argparse

    from PIL import Image

    from edgeocr.serve.config import ServerConfig, add_arguments, resolve
    assert OCRModel(slot_arts["masked"], vision_ahead=True).scheduler().vision_ahead
    page, out = tmp_path / "p.png", tmp_path / "r.jsonl"
    Image.fromarray(make_image(3)).save(page)
    seen, real = [], OCRModel.scheduler

    def spy(self, *a, **kw):
        sched = real(self, *a, **kw)
        seen.append(sched.vision_ahead)
        return sched
    monkeypatch.setattr(OCRModel, "scheduler", spy)
    from edgeocr.cli import main
    assert main(["run", str(page), "--model", str(slot_arts["masked"]), "--vision-ahead", "on",
                 "--max-new-tokens", "3", "--out", str(out), "--no-progress"]) == 0
    assert seen == [True] and '"finish_reason": "length"' in out.read_text()
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    assert ServerConfig().vision_ahead is False and "--vision-ahead" in ap.format_help()
    cfg = resolve(ap.parse_args([str(slot_arts["masked"])]), {"EDGEOCR_VISION_AHEAD": "true"})
    assert cfg.vision_ahead is True


def _slow_beside_prefill(model, delay, step_delay=0.0):
    """Make the session's prefills beside the step take `delay` s longer (and each step `step_delay` s);
    returns the prefills' (start, end) spans and the step start times."""
    import time
    s = model.session
    spans, steps = [], []
    real_prefill, real_step = s._prefill, s._step

    def prefill(slot, ids, cos, sin, beside=False):
        t0 = time.perf_counter()
        real_prefill(slot, ids, cos, sin, beside=beside)
        if beside:                        # after the rows are written: the steps meanwhile must leave them be
            time.sleep(delay)
            spans.append((t0, time.perf_counter()))

    def step(*a):
        steps.append(time.perf_counter())
        time.sleep(step_delay)
        return real_step(*a)
    s._prefill, s._step = prefill, step
    return spans, steps


def test_prefill_beside_gives_each_page_its_tokens_alone(slot_arts):
    """Vision and prefill on the worker, the prefill on a second decoder session bound to the same cache while
    the step decodes the other slots: 7 pages through 3 slots get exactly the tokens they get alone; the
    prefills really ran during decode steps (slowed by 0.15 s each), and only on the second session."""
    model = OCRModel(slot_arts["gqa-select"])
    opts = [DecodeOptions(max_new_tokens=24 + 9 * i, repetition_penalty=1.3, ignore_stop=True,
                          tail_repetition_stop=False) for i in range(7)]      # pages leave their slots one by one
    pages = _pages(7)
    alone = [model.recognize(p, task="spotting", options=o).token_ids for p, o in zip(pages, opts)]
    sched = model.scheduler(vision_ahead=True, prefill_beside=True)
    assert sched.prefill_beside and model.session.prefill_decoder is not None
    assert not model.scheduler(vision_ahead=True).prefill_beside            # off unless asked
    # steps of at least 10 ms: a page then decodes longer than a slowed prefill takes, however fast the machine
    spans, steps = _slow_beside_prefill(model, 0.15, step_delay=0.01)
    done = _run(sched, [(i, model.page(p, task="spotting", options=o)) for i, (p, o) in enumerate(zip(pages, opts))])
    assert [done[i].token_ids for i in range(7)] == alone
    assert len(spans) == 7 and all(done[i].timings_ms["prefill"] >= 150 for i in range(7))
    # the first three are prefilled before the first steps (no other CUDA work while a graph may be captured);
    # each later one while the pages still in their slots step
    overlapped = sum(any(a < t < b for t in steps) for a, b in spans[3:])
    assert overlapped >= 3, f"only {overlapped} of the 4 later prefills ran while the other slots stepped"


def test_prefill_beside_cancel_and_failure(slot_arts):
    """A page cancelled while its prefill runs beside the step frees its slot, and the next page in that slot
    gets its own tokens; a prefill that fails is that page's admission error alone."""
    model = OCRModel(slot_arts["gqa-select"])
    opts = DecodeOptions(max_new_tokens=8)
    a, b, c, d = _pages(4)
    alone = {k: model.recognize(p, options=opts).token_ids for k, p in zip("acd", (a, c, d))}
    _slow_beside_prefill(model, 0.3)
    sched = model.scheduler(vision_ahead=True, prefill_beside=True)
    sched.admit(model.page(a, options=opts), "a")
    sched.step()                                          # a decoding
    sched.admit(model.page(b, options=opts), "b")
    res = sched.cancel("b")
    assert res.finish_reason == "cancelled" and res.generated_tokens == 0 and sched.free() == 2
    sched.admit(model.page(c, options=opts), "c")         # its vision and prefill queue behind b's
    got = {}
    while sched.live():
        got.update((ev.tag, ev.result) for ev in sched.step() if ev.result is not None)
    assert sorted(got) == ["a", "c"] and got["a"].token_ids == alone["a"] and got["c"].token_ids == alone["c"]

    real = model.session._prefill

    def failing(slot, ids, cos, sin, beside=False):
        if beside and slot == 1:
            raise RuntimeError("prefill failed on purpose")
        real(slot, ids, cos, sin, beside=beside)
    model.session._prefill = failing
    errors = []
    done = _run(model.scheduler(vision_ahead=True, prefill_beside=True),
                [("a", model.page(a, options=opts)), ("x", model.page(b, options=opts)),
                 ("d", model.page(d, options=opts))], lambda tag, e: errors.append((tag, str(e))))
    assert errors == [("x", "prefill failed on purpose")]
    assert done["a"].token_ids == alone["a"] and done["d"].token_ids == alone["d"]


def test_prefill_beside_is_refused_where_it_cannot_run(slot_arts, monkeypatch):
    """Asked for explicitly, prefill beside names why it cannot run (no vision ahead, host selection, step-state or
    masked decoders); from EDGEOCR_PREFILL_BESIDE=1 it is simply off there, and on where it can run."""
    from edgeocr.slots import PREFILL_BESIDE_ENV
    sel = OCRModel(slot_arts["gqa-select"])
    with pytest.raises(ValueError, match="needs vision ahead"):
        sel.scheduler(vision_ahead=False, prefill_beside=True)
    with pytest.raises(ValueError, match="token selection"):
        OCRModel(slot_arts["gqa"]).scheduler(vision_ahead=True, prefill_beside=True)
    with pytest.raises(ValueError, match="MaskedSession cannot"):
        OCRModel(slot_arts["masked-select"]).scheduler(vision_ahead=True, prefill_beside=True)
    monkeypatch.setenv(PREFILL_BESIDE_ENV, "1")
    assert not OCRModel(slot_arts["gqa"]).scheduler(vision_ahead=True).prefill_beside
    assert sel.scheduler(vision_ahead=True).prefill_beside and not sel.scheduler().prefill_beside


def test_prefill_beside_from_the_environment_with_vision_ahead(slot_arts, monkeypatch):
    """EDGEOCR_VISION_AHEAD=1 and EDGEOCR_PREFILL_BESIDE=1: the model's schedulers (run, the daemon,
    recognize_many) prefill beside the step, and recognize_many gives each page its tokens alone."""
    from edgeocr.slots import PREFILL_BESIDE_ENV, VISION_AHEAD_ENV
    model = OCRModel(slot_arts["gqa-select"])
    opts = DecodeOptions(max_new_tokens=12)
    pages = _pages(5)
    alone = [model.recognize(p, options=opts).token_ids for p in pages]
    monkeypatch.setenv(VISION_AHEAD_ENV, "1")
    monkeypatch.setenv(PREFILL_BESIDE_ENV, "1")
    assert model.scheduler().prefill_beside and not model.scheduler(vision_ahead=False).prefill_beside
    many = dict(model.recognize_many(pages, options=opts))
    assert [many[i].token_ids for i in range(5)] == alone


def test_prefill_beside_guards(slot_arts, monkeypatch):
    """A prompt that fills the cache is refused before a prefill beside the step (row S is the step's for that
    slot); a second decoder session that cannot load turns EDGEOCR_PREFILL_BESIDE=1 off with a warning, and an
    explicit request fails with the error."""
    from edgeocr.errors import BackendError
    from edgeocr.slots import PREFILL_BESIDE_ENV
    model = OCRModel(slot_arts["gqa-select"])
    s = model.session
    s.open_prefill_beside()
    ids = np.zeros((s.cache_len,), np.int64)
    rows = np.zeros((s.cache_len, s.head_dim), np.float32)
    monkeypatch.setattr(s, "prefill_len", s.cache_len)    # an artifact whose prefill could fill its cache
    with pytest.raises(ValueError, match="no room"):
        s._prefill(0, ids, rows, rows, beside=True)
    other = OCRModel(slot_arts["gqa-select"])

    def cannot():
        raise BackendError("out of device memory on purpose")
    other.session.open_prefill_beside = cannot
    monkeypatch.setenv(PREFILL_BESIDE_ENV, "1")
    assert not other.scheduler(vision_ahead=True).prefill_beside
    with pytest.raises(BackendError, match="on purpose"):
        other.scheduler(vision_ahead=True, prefill_beside=True)


@pytest.mark.parametrize("mode", ["in line", "vision ahead", "prefill beside"])
def test_blank_check_still_running_at_admission(slot_arts, mode):
    """A page whose blank check (on the preparer's worker) has not finished when it is admitted: its vision
    runs meanwhile, then the check says blank and the page ends empty without a prefill; the pages around it
    get their tokens alone.  A check that fails is that page's admission error."""
    import threading
    from concurrent.futures import Future

    from edgeocr.decode import FinishReason

    model = OCRModel(slot_arts["gqa-select"])
    opts = DecodeOptions(max_new_tokens=7, repetition_penalty=1.3)
    a, b = _pages(2)
    alone = [model.recognize(p, options=opts).token_ids for p in (a, b)]
    kw = {"in line": {}, "vision ahead": {"vision_ahead": True},
          "prefill beside": {"vision_ahead": True, "prefill_beside": True}}[mode]
    for outcome in (True, ValueError("unreadable page")):
        sched = model.scheduler(**kw)
        reqs = [("a", model.page(a, options=opts)), ("blank", model.page(np.full((300, 200, 3), 240, np.uint8),
                                                                            options=opts)),
                ("b", model.page(b, options=opts))]
        pending = Future()
        held = reqs[1][1].prep
        held.blank_check = pending
        assert not held.blank_known()
        # a scheduler that waited for the check before the vision would wait here for good: end it in 5 s
        # (the page is then finished without its vision, and the counts below fail)
        timer = threading.Timer(5.0, lambda pending=pending: pending.done() or pending.set_result(True))
        timer.start()
        encoded, prefilled = [], []
        real_encode, sel = sched._encode, sched.selection

        def encode(prep, slot, real_encode=real_encode, pending=pending, held=held):
            ms = real_encode(prep, slot)
            encoded.append(prep is held)
            if prep is held:               # the check ends after the page's vision
                pending.set_exception(outcome) if isinstance(outcome, Exception) else pending.set_result(outcome)
            return ms
        sched._encode = encode
        for name in ("first", "first_beside"):
            if hasattr(sel, name):
                real = getattr(sel, name)
                setattr(sel, name, lambda *args, real=real: (prefilled.append(1), real(*args))[1])
        errors = []
        done = _run(sched, reqs, lambda tag, e: errors.append((tag, str(e))))
        timer.cancel()
        assert [done["a"].token_ids, done["b"].token_ids] == alone and sched.idle()
        assert encoded.count(True) == 1 and len(encoded) == 3 and len(prefilled) == 2
        if outcome is True:
            r = done["blank"]
            assert r.finish_reason is FinishReason.BLANK and (r.text, r.token_ids, r.prompt_tokens) == ("", [], 0)
            assert r.timings_ms["vision"] > 0 and not errors          # its vision ran, and is reported
        else:
            assert "blank" not in done and errors == [("blank", "unreadable page")]


def test_a_prompt_shared_by_pages_is_written_into_the_prefill_buffers_once(gqa_arts):
    """The prefill's ids and RoPE tables (1.1 MB at the real size) are written to the device once for pages of the
    same instruction (the model's prompt arrays are read-only and shared), again when the instruction changes, and
    every time for arrays a caller may change; the tokens are those of a fresh model."""
    m = OCRModel(gqa_arts["a"])
    writes = []
    write = m.session.mem.write
    m.session.mem.write = lambda dst, src: (writes.append(dst is m.session.pf_cos), write(dst, src))[1]
    o = DecodeOptions(max_new_tokens=6, ignore_stop=True)
    imgs = [make_image(k) for k in (1, 2)]
    tasks = ("spotting", "spotting", "table", "spotting")
    got = [m.recognize(imgs[k % 2], task=t, options=o).token_ids for k, t in enumerate(tasks)]
    assert sum(writes) == 3                     # spotting, table, spotting again
    fresh = OCRModel(gqa_arts["a"])
    assert got == [fresh.recognize(imgs[k % 2], task=t, options=o).token_ids for k, t in enumerate(tasks)]
    s = m.session
    p = m._prompt(m.instruction("spotting", None)[0])
    ids, cos, sin = p.ids, p.cos, p.sin
    n = sum(writes)
    for _ in range(2):                          # writable copies: written each time
        s.prefill(0, ids.copy(), cos.copy(), sin.copy())
    assert sum(writes) == n + 2


def test_the_models_vision_ahead_reaches_its_session(gqa_arts, monkeypatch):
    """OCRModel(vision_ahead=...) is the session's too (it keeps the vision graph's CUDA graph off by default,
    edgeocr.ort_options.vision_graph_default); None leaves it to EDGEOCR_VISION_AHEAD."""
    monkeypatch.delenv("EDGEOCR_VISION_AHEAD", raising=False)
    for asked in (True, False, None):
        m = OCRModel(gqa_arts["a"], vision_ahead=asked)
        assert m.session._vision_ahead is asked and m.scheduler().vision_ahead is bool(asked)
