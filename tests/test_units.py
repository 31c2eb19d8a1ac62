"""Pure functions: rope positions and tables, repetition penalty, spotting parse, cleanup, prompts.  Torch-free
(tests/test_boundary.py pins it); their comparisons with transformers are in test_parity.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgeocr import decode, postprocess, preprocess, prompts, rope

ROOT = Path(__file__).resolve().parents[1]


def test_real_model_frequencies():
    f = rope.inv_freq(128, 10000.0, 1000.0)
    np.testing.assert_allclose(f[:4], [1.0, 0.7760344, 0.6022294, 0.4673507], rtol=1e-6)


def test_layouts_agree_on_text_and_differ_on_image_grid():
    f = rope.inv_freq(32, 1e4, 1000.0)
    pos = rope.position_ids(30, 2, (8, 8), 2)
    a = rope.cos_sin(pos, f, (4, 4, 4, 4), "A")[0]
    b = rope.cos_sin(pos, f, (4, 4, 4, 4), "B")[0]
    np.testing.assert_array_equal(a[:3], b[:3])          # text before the grid
    assert np.abs(a[3:20] - b[3:20]).max() > 0.1          # grid tokens
    with pytest.raises(ValueError):
        rope.axis_of_dim(32, (4, 4, 4, 4), "C")


def test_text_table_equals_general_path():
    f = rope.inv_freq(24, 1e4, 1000.0)
    tc, ts = rope.text_table(64, f)
    c, s = rope.cos_sin(rope.position_ids(64, None, None, 2), f, (3, 3, 3, 3), "B")
    np.testing.assert_allclose(tc, c, atol=1e-6)
    np.testing.assert_allclose(ts, s, atol=1e-6)


def test_tail_repeats():
    assert decode.tail_repeats("intro " + "ab" * 8, 8000, 8)
    assert not decode.tail_repeats("intro " + "ab" * 7, 8000, 8)
    assert not decode.tail_repeats("x" + " " * 40, 8000, 8)   # pure whitespace unit is not a loop
    assert decode.tail_repeats("start" + "<td>1</td>" * 9, 8000, 8)


def test_clean_repeated_substrings():
    body = "x" * 2000
    assert postprocess.clean_repeated_substrings(body + "abc" * 12) == body + "abc"
    assert postprocess.clean_repeated_substrings("short" + "ab" * 20) == "short" + "ab" * 20
    assert postprocess.clean_repeated_substrings(body + "q") == body + "q"


def test_parse_spotting_maps_boxes_back_to_original_pixels():
    lb = preprocess.Letterbox(width=2000, height=1000, scale=1024 / 2000, new_w=1024, new_h=512)
    text = "Total (USD)(100,50),(500,100)合计 ¥1,234.00(0,0),(1000,500)"
    lines = postprocess.parse_spotting(text, lb, 1024)
    assert [ln.text for ln in lines] == ["Total (USD)", "合计 ¥1,234.00"]
    assert lines[0].box_norm == (100, 50, 500, 100)
    assert lines[0].box == (200, 100, 1000, 200)
    assert lines[1].box == (0, 0, 2000, 1000)


def test_parse_spotting_json_form():
    lb = preprocess.Letterbox(width=1024, height=1024, scale=1.0, new_w=1024, new_h=1024)
    lines = postprocess.parse_spotting('[{"box": [0, 0, 500, 500], "text": "A"}]', lb, 1024)
    assert lines[0].text == "A" and lines[0].box == (0, 0, 512, 512)


def test_prompt_layout():
    t = prompts.PromptTokens(bos=1, system_sep=2, im_start=3, im_end=4, image=5, user=6)
    assert prompts.build_prompt_ids(t, 3, [9, 9]) == [1, 2, 3, 5, 5, 5, 4, 9, 9, 6]
    assert "JSON" in prompts.field_extraction_prompt(["Total", "Date"])
    with pytest.raises(prompts.PromptError):
        prompts.task_prompt("nope")
    with pytest.raises(prompts.PromptError):
        prompts.task_prompt("layout", "en")
    with pytest.raises(prompts.PromptError):
        prompts.field_extraction_prompt([])


def test_real_spotting_prompt_text():
    # spec §6 test vector's source text
    assert prompts.task_prompt("spotting") == "检测并识别图片中的文字，将文本坐标格式化输出。"


def test_letterbox_geometry():
    from PIL import Image
    img = Image.fromarray(np.zeros((100, 400, 3), np.uint8))
    canvas, lb = preprocess.letterbox(img)
    assert canvas.shape == (1024, 1024, 3) and (lb.new_w, lb.new_h) == (1024, 256)
    assert (canvas[256:] == 255).all() and (canvas[:256] == 0).all()
    assert lb.to_original(512, 128) == (200, 50)
    small = Image.fromarray(np.zeros((10, 20, 3), np.uint8))
    _, lb2 = preprocess.letterbox(small)
    assert (lb2.new_w, lb2.new_h) == (1024, 512)


def test_backends_keep_the_session_signature():
    """Every backend implements the one narrow seam with the same signatures, and each token selection strategy
    the Selection protocol's; the only selection methods a session has are its `selection()` factory's."""
    import inspect

    from edgeocr.backends.base import Session
    from edgeocr.backends.ort import GqaSession, MaskedSession, OrtGraphSelection
    from edgeocr.backends.ort_step_state import StepStateSelection
    from edgeocr.backends.tensorrt import TrtGraphSelection, TrtSession
    from edgeocr.selection import HostSelection, Selection
    for cls in (MaskedSession, GqaSession, TrtSession):
        for name in ("encode_image", "prefill", "step", "memory_bytes", "selection", "prefill_capture_pending",
                     "vision_capture_pending"):
            want = list(inspect.signature(getattr(Session, name)).parameters)
            got = list(inspect.signature(getattr(cls, name)).parameters)
            assert got == want, (cls.__name__, name, got, want)
        for gone in ("begin", "prefill_token", "step_tokens"):
            assert not hasattr(cls, gone), (cls.__name__, gone)
    for mod in ("edgeocr/backends/ort.py", "edgeocr/backends/tensorrt.py", "edgeocr/backends/ort_step_state.py",
                "edgeocr/slots.py", "edgeocr/bench.py"):
        assert ".selects" not in (ROOT / mod).read_text(), mod       # no selection flag left to test
    for cls in (HostSelection, OrtGraphSelection, TrtGraphSelection, StepStateSelection):
        assert cls.where in ("host", "graph")
        for name in ("first", "next"):
            want = list(inspect.signature(getattr(Selection, name)).parameters)
            got = list(inspect.signature(getattr(cls, name)).parameters)
            assert got == want, (cls.__name__, name, got, want)


def test_host_selection_penalizes_per_slot():
    """Host selection keeps each slot's seen ids apart: a token seen in slot 0 is penalized there only, and a
    slot's first() starts its seen set from its own prompt."""
    import numpy as np

    from edgeocr.selection import HostSelection

    class Fixed:                                   # a two-slot session whose logits never change
        slots, vocab_size = 2, 4
        logits = np.asarray([[1.0, 0.9, 0.1, 0.0]] * 2, np.float32)

        def prefill(self, slot, ids, cos, sin):
            return self.logits[0].copy()

        def step(self, tokens, pos, cos, sin, live):
            return self.logits.copy()

    sel = HostSelection(Fixed())
    z = np.zeros((1, 1), np.float32)
    assert sel.first(0, np.asarray([3]), 2.0, z, z) == 0          # 1.0 beats 0.9: nothing seen penalizes them
    assert sel.first(1, np.asarray([0]), 20.0, z, z) == 1         # id 0 is in slot 1's prompt: 1.0/20 < 0.9
    out = np.zeros(2, np.int64)
    sel.next(np.asarray([0, 1]), np.zeros(2, np.int64), z, z, np.asarray([True, True]), out)
    assert out.tolist() == [1, 2]       # slot 0 saw 0 (0.5 < 0.9); slot 1 saw 0 and 1 (0.05, 0.045 < 0.1)
    with pytest.raises(RuntimeError, match="slot 0 is live but was never started"):
        HostSelection(Fixed()).next(np.asarray([0, 0]), np.zeros(2, np.int64), z, z, np.asarray([True, False]), out)


def test_python_api_and_cli_share_task_names():
    from edgeocr.cli import main
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["tasks"]) == 0
    assert [line.split()[0] for line in buf.getvalue().splitlines()] == prompts.task_names()


def test_priority_streams_put_vision_low_and_decoder_high(monkeypatch):
    """EDGEOCR_STREAM_PRIORITIES: the vision session's provider options name a lowest-priority stream, the
    decoder's a highest-priority one (CUDA numbers: lower is higher), each a stream of its own."""
    from edgeocr import ort_options

    class FakeCuda:
        def __init__(self):
            self.made = []

        def stream_priority_range(self):
            return 0, -5

        def stream_create_with_priority(self, priority):
            self.made.append(priority)
            return 0x1000 + len(self.made)

    cuda = FakeCuda()
    vision, decoder = ort_options.priority_stream_options(cuda)
    assert cuda.made == [0, -5]
    assert vision == {"user_compute_stream": str(0x1001)} and decoder == {"user_compute_stream": str(0x1002)}
    monkeypatch.delenv(ort_options.STREAM_PRIORITIES_ENV, raising=False)
    assert ort_options.stream_priorities_wanted() is False
    monkeypatch.setenv(ort_options.STREAM_PRIORITIES_ENV, "1")
    assert ort_options.stream_priorities_wanted() is True
    assert ort_options.stream_priorities_wanted(False) is False


def test_memory_views_of_one_allocation():
    """The native step's weights are views of one allocation (edgeocr.backends.memory): a view shares the bytes,
    and one that would leave the allocation or split an element is refused."""
    from edgeocr.backends.memory import HostMemory
    mem = HostMemory()
    blob = mem.alloc((64,), np.uint8)
    mem.write(blob, np.arange(64, dtype=np.uint8))
    v = mem.view(blob, 16, (2, 4), np.float16)
    assert v.host.tobytes() == bytes(range(16, 32)) and v.ptr == blob.ptr + 16
    mem.write(v, np.zeros((2, 4), np.float16))
    assert not blob.host[16:32].any() and blob.host[32] == 32
    for offset, shape in ((60, (4,)), (-2, (1,)), (3, (1,))):
        with pytest.raises(IndexError, match="outside"):
            mem.view(blob, offset, shape, np.float16)


def test_vision_arena_setting(monkeypatch):
    """EDGEOCR_VISION_ARENA: the vision arena is shrunk after each call unless "keep"; anything else is named."""
    from edgeocr.ort_options import vision_shrink_wanted
    monkeypatch.delenv("EDGEOCR_VISION_ARENA", raising=False)
    assert vision_shrink_wanted()
    monkeypatch.setenv("EDGEOCR_VISION_ARENA", " Keep ")
    assert not vision_shrink_wanted()
    monkeypatch.setenv("EDGEOCR_VISION_ARENA", "small")
    with pytest.raises(ValueError, match="EDGEOCR_VISION_ARENA must be 'shrink' or 'keep', not 'small'"):
        vision_shrink_wanted()


def test_cuda_arena_and_memory_pattern_settings(monkeypatch):
    """EDGEOCR_CUDA_ARENA (separate | shared) and EDGEOCR_MEM_PATTERN (1 | 0; None when unset: the session's
    default): defaults, case and spaces, and a bad value named with what is allowed."""
    from edgeocr.ort_options import mem_pattern_wanted, shared_arena_wanted
    for env in ("EDGEOCR_CUDA_ARENA", "EDGEOCR_MEM_PATTERN"):
        monkeypatch.delenv(env, raising=False)
    assert not shared_arena_wanted() and mem_pattern_wanted() is None
    monkeypatch.setenv("EDGEOCR_MEM_PATTERN", " 1")
    assert mem_pattern_wanted() is True
    monkeypatch.setenv("EDGEOCR_CUDA_ARENA", " Shared ")
    monkeypatch.setenv("EDGEOCR_MEM_PATTERN", "0")
    assert shared_arena_wanted() and mem_pattern_wanted() is False
    monkeypatch.setenv("EDGEOCR_CUDA_ARENA", "one")
    with pytest.raises(ValueError, match="EDGEOCR_CUDA_ARENA must be one of 'separate', 'shared', not 'one'"):
        shared_arena_wanted()
    monkeypatch.setenv("EDGEOCR_MEM_PATTERN", "off")
    with pytest.raises(ValueError, match="EDGEOCR_MEM_PATTERN must be one of '1', '0', not 'off'"):
        mem_pattern_wanted()


def test_vision_graph_and_memory_pattern_defaults(monkeypatch):
    """Unset, the vision graph is replayed for native-step artifacts with 8-bit vision weights only (its kept arena fits
    their memory target), never with a shared arena, a vision arena asked to shrink or visions ahead; a replayed
    vision graph runs without memory patterns, replayed prefills too, an explicit EDGEOCR_MEM_PATTERN wins for
    the vision session."""
    from edgeocr.ort_options import memory_patterns, vision_graph_default
    for env in ("EDGEOCR_CUDA_ARENA", "EDGEOCR_VISION_AHEAD", "EDGEOCR_VISION_ARENA"):
        monkeypatch.delenv(env, raising=False)
    assert vision_graph_default("int8") and not vision_graph_default("float") and not vision_graph_default(None)
    for env, value in (("EDGEOCR_CUDA_ARENA", "shared"), ("EDGEOCR_VISION_AHEAD", "1"),
                       ("EDGEOCR_VISION_ARENA", "shrink")):
        monkeypatch.setenv(env, value)
        assert not vision_graph_default("int8"), env
        monkeypatch.delenv(env)
    monkeypatch.setenv("EDGEOCR_VISION_ARENA", "keep")
    assert vision_graph_default("int8")
    assert not vision_graph_default("int8", vision_ahead=True)         # the model's own choice wins over the env
    monkeypatch.setenv("EDGEOCR_VISION_AHEAD", "1")
    assert vision_graph_default("int8", vision_ahead=False) and not vision_graph_default("int8")
    assert memory_patterns(None, vision_graph=False, prefill_graph=False) == (True, True)
    assert memory_patterns(None, vision_graph=True, prefill_graph=True) == (False, False)
    assert memory_patterns(None, vision_graph=False, prefill_graph=True) == (True, False)
    assert memory_patterns(None, vision_graph=True, prefill_graph=False) == (False, True)
    assert memory_patterns(True, vision_graph=True, prefill_graph=True) == (True, False)
    assert memory_patterns(False, vision_graph=False, prefill_graph=False) == (False, False)


def test_cuda_graph_and_stack_settings(monkeypatch):
    """EDGEOCR_PREFILL_GRAPH and EDGEOCR_VISION_GRAPH (None when unset: the session's default) and
    EDGEOCR_CUDA_STACK (bytes, "driver" for the driver's own; 0 when unset): values parsed, a bad one named."""
    from edgeocr.ort_options import cuda_stack_bytes, prefill_graph_wanted, vision_graph_wanted
    for env in ("EDGEOCR_PREFILL_GRAPH", "EDGEOCR_VISION_GRAPH", "EDGEOCR_CUDA_STACK"):
        monkeypatch.delenv(env, raising=False)
    assert prefill_graph_wanted() is None and vision_graph_wanted() is None and cuda_stack_bytes() == 0
    monkeypatch.setenv("EDGEOCR_PREFILL_GRAPH", " 1 ")
    monkeypatch.setenv("EDGEOCR_VISION_GRAPH", "on")
    monkeypatch.setenv("EDGEOCR_CUDA_STACK", "256")
    assert prefill_graph_wanted() and vision_graph_wanted() and cuda_stack_bytes() == 256
    monkeypatch.setenv("EDGEOCR_VISION_GRAPH", "0")
    monkeypatch.setenv("EDGEOCR_PREFILL_GRAPH", "0")
    monkeypatch.setenv("EDGEOCR_CUDA_STACK", "driver")
    assert prefill_graph_wanted() is False and vision_graph_wanted() is False and cuda_stack_bytes() is None
    monkeypatch.setenv("EDGEOCR_PREFILL_GRAPH", "yes please")
    with pytest.raises(ValueError, match="EDGEOCR_PREFILL_GRAPH must be 1 or 0, not 'yes please'"):
        prefill_graph_wanted()
    for bad in ("-1", "1k"):
        monkeypatch.setenv("EDGEOCR_CUDA_STACK", bad)
        with pytest.raises(ValueError, match=f"EDGEOCR_CUDA_STACK must be a number of bytes .* not '{bad}'"):
            cuda_stack_bytes()


def test_prefill_graph_ids_cap_and_pending_per_thread():
    """A session's prefill CUDA graphs: one graph id per (slot, prompt length) after the step graphs' ids, at most
    PREFILL_GRAPHS of them (further ones run outside every graph, id -1); a (slot, length) may capture on its first
    GRAPH_CAPTURE_RUN runs on each thread (ONNX Runtime keeps graphs per thread), not after; off, nothing is."""
    import threading

    from edgeocr.backends import ort as eort

    class RunOptions:
        def __init__(self):
            self.entries = {}

        def add_run_config_entry(self, k, v):
            self.entries[k] = v

    s = object.__new__(eort.GqaSession)
    s.device, s.step_graphs, s._ort = "cuda", 1, type("ort", (), {"RunOptions": RunOptions})
    s.prefill_graph, s._pf_graph_ro, s._pf_graph_runs = True, {}, {}
    s._ro_plain = eort._graph_run_options(s._ort, -1)
    gid = lambda slot, n: s._prefill_run_options(slot, n).entries["gpu_graph_id"]   # noqa: E731
    assert [s.prefill_capture_pending(0, 50)] + [gid(0, 50) for _ in range(3)] == [True, "2", "2", "2"]
    assert not s.prefill_capture_pending(0, 50) and gid(0, 50) == "2"
    assert gid(1, 50) == "3" and gid(0, 60) == "4" and s.prefill_capture_pending(1, 50)
    other = []
    t = threading.Thread(target=lambda: other.append(s.prefill_capture_pending(0, 50)))
    t.start(), t.join()
    assert other == [True]                       # a new thread captures its own graph
    for n in range(100, 100 + eort.PREFILL_GRAPHS - 3):
        gid(0, n)
    assert len(s._pf_graph_ro) == eort.PREFILL_GRAPHS
    assert gid(2, 7) == "-1" and not s.prefill_capture_pending(2, 7)
    s.prefill_graph = False
    assert not s.prefill_capture_pending(1, 50) and s._prefill_run_options(1, 50) is s._ro_plain


def test_is_blank_at_the_ink_threshold():
    """preprocess.is_blank: a page is blank while fewer than BLANK_MAX_INK of its pixels are ink; an RGB page (the
    one-pass histogram) and the same page with a fourth channel (per-channel bincount) give the same answer."""
    h, w = 400, 500
    n = h * w
    limit = int(np.ceil(preprocess.BLANK_MAX_INK * n))                      # this many ink pixels: not blank
    rng = np.random.default_rng(0)
    for ink, want in ((0, True), (limit - 1, True), (limit, False), (n // 10, False)):
        page = np.full((h, w, 3), 235, np.uint8)
        idx = rng.choice(n, ink, replace=False)
        page.reshape(-1, 3)[idx, 1] = 235 - preprocess.INK_CONTRAST - 1         # ink in the green channel only
        assert preprocess.is_blank(page) is want, ink
        four = np.concatenate([page, np.full((h, w, 1), 255, np.uint8)], axis=2)
        assert preprocess.is_blank(four) is want, ink
        from PIL import Image
        assert preprocess.is_blank(Image.fromarray(page)) is want, ink              # a PIL image: its histogram
        assert preprocess.is_blank(Image.fromarray(page).convert("L")) is _blank_reference(
            np.repeat(np.asarray(Image.fromarray(page).convert("L"))[..., None], 3, axis=2)), ink
        view = page[::-1, ::2]                                                    # strided, not contiguous
        assert preprocess.is_blank(view) is _blank_reference(view), ink


def _blank_reference(rgb):
    levels, ink = np.arange(256), 0
    for c in range(rgb.shape[2]):
        hist = np.bincount(rgb[..., c].ravel(), minlength=256)
        ink = max(ink, int(hist[np.abs(levels - int(np.argmax(hist))) > preprocess.INK_CONTRAST].sum()))
    return ink < preprocess.BLANK_MAX_INK * rgb.shape[0] * rgb.shape[1]


def test_a_character_cut_by_the_pages_end_is_not_written():
    """Byte-level BPE writes 淼 in two tokens of the demo tokenizer: a page cut after the first of them ends
    without a replacement character in its result; a page whose last character is whole keeps every character."""
    from pathlib import Path

    from edgeocr.decode import DecodeOptions, FinishReason, Sequence
    from edgeocr.prepare import Prepared
    from edgeocr.preprocess import Letterbox
    from edgeocr.result import ResultBuilder
    from edgeocr.tokenizer import Tokenizer
    tok = Tokenizer(Path(__file__).resolve().parents[1] / "demo_model" / "tokenizer.json")
    ids = tok.encode("鑫淼")
    assert tok.decode(ids[:-1]).endswith("\ufffd")          # the premise: 淼 takes more than one token
    build = ResultBuilder(tok, 1024)
    prep = Prepared(np.zeros((4, 4, 3), np.uint8), Letterbox(4, 4, 1.0, 4, 4))
    for tokens, want in ((ids[:-1], "鑫"), (ids, "鑫淼"), (ids[:1], "")):
        seq = Sequence(np.zeros(3, np.int64), DecodeOptions(), frozenset(), 1.0, list(tokens), FinishReason.LENGTH)
        assert build(seq, prep, None, 0.0, 0.0).text == want, tokens
    # a U+FFFD the model wrote whole is kept, cut or not; a page the model stopped is not touched
    whole = tok.encode("end\ufffd")
    for tokens, reason in ((whole, FinishReason.LENGTH), (ids[:-1], FinishReason.STOP)):
        seq = Sequence(np.zeros(3, np.int64), DecodeOptions(), frozenset(), 1.0, list(tokens), reason)
        assert build(seq, prep, None, 0.0, 0.0).text.endswith("\ufffd"), (tokens, reason)
    # the byte-level check itself, at every cut of characters of one to four UTF-8 bytes
    for text in ("Ω≈ç√", " 𠀀x", "鑫淼", "abc"):
        t = tok.encode(text)
        for k in range(1, len(t) + 1):
            assert tok.ends_inside_a_character(t[:k]) == tok.decode(t[:k]).endswith("\ufffd"), (text, k)
