"""How a page travels: prepared by the artifact's own preparer on a worker thread, admitted into the one
scheduler, never decoded on the thread that steps the model (recognize, recognize_many, `edgeocr run`, the
daemon's engine)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image

from conftest import make_image
from edgeocr import preprocess
from edgeocr.decode import DecodeOptions
from edgeocr.prepare import Prepared


class _Recording:
    """Wraps a preparer; records the thread of each host preparation and of each admission."""

    def __init__(self, inner):
        self.inner, self.host, self.admit = inner, [], []

    def __call__(self, image):
        if not isinstance(image, Prepared):          # a Prepared passes through
            self.host.append(threading.current_thread().name)
        return self.inner(image)

    def pixels(self, prep):
        self.admit.append(threading.current_thread().name)
        return self.inner.pixels(prep)


def _record(model) -> _Recording:
    model.preparer = rec = _Recording(model.preparer)
    return rec


def test_device_preparer_uses_the_artifacts_mean_and_std():
    """The device strategy normalizes with the artifact's mean/std, not CLIP's: on an image already at its
    letterbox size the graph only pads and normalizes, so it equals the exact strategy bit for bit."""
    from edgeocr.artifact import ImageSpec
    from edgeocr.prepare import open_preparer

    spec = ImageSpec(canvas=224, patch_size=16, merge_size=2, n_image_tokens=49, mean=(0.5, 0.4, 0.3),
                     std=(0.2, 0.25, 0.3), pad_value=200)
    img = make_image(5, (224, 150))                 # width 150, height 224: fits the canvas unresized
    exact = open_preparer("exact", spec)(img)
    device = open_preparer("device", spec, "cpu")
    prep = device(img)
    assert prep.pixels.dtype == np.uint8 and prep.letterbox == exact.letterbox
    ours = device.pixels(prep).numpy()
    assert np.array_equal(ours, exact.pixels)
    clip = preprocess.normalize(np.full((224, 224, 3), 200, np.uint8))
    assert not np.allclose(ours[..., 200:], clip[..., 200:])          # CLIP's table would give these
    clip_spec = open_preparer("device", replace(spec, mean=preprocess.MEAN, std=preprocess.STD), "cpu")
    assert not np.array_equal(clip_spec.pixels(clip_spec(img)).numpy(), exact.pixels)


def test_model_preparer_is_fixed_at_load_with_the_manifest(art_a, tmp_path):
    """OCRModel(preprocess=...) builds its preparer from the manifest's geometry and mean/std."""
    import json
    import shutil

    from edgeocr.model import OCRModel

    art = tmp_path / "art"
    shutil.copytree(art_a, art)
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["preprocess"]["mean"] = [0.5, 0.5, 0.5]
    (art / "manifest.json").write_text(json.dumps(manifest))
    for strategy in ("exact", "fast", "device"):
        p = OCRModel(art, preprocess=strategy).preparer
        assert p.strategy == strategy and p.spec.mean == (0.5, 0.5, 0.5)
    img = make_image(3, (300, 200))
    exact = OCRModel(art).prepare(img)
    canvas, _ = preprocess.letterbox(Image.fromarray(img))
    assert np.array_equal(exact.pixels, preprocess.normalize(canvas, mean=(0.5, 0.5, 0.5)))


def test_scheduler_admits_prepared_pages_only(art_a):
    from edgeocr.model import OCRModel
    from edgeocr.slots import PageRequest

    model = OCRModel(art_a)
    sched = model.scheduler()
    with pytest.raises(TypeError, match="prepared Page"):
        sched.admit(PageRequest(make_image(1)), "x")
    with pytest.raises(TypeError, match="prepared Page"):
        sched.admit(model.prepare(make_image(1)), "x")
    assert sched.free() == 1


def test_model_pages_are_prepared_on_the_worker_pool(art_a, tmp_path):
    """recognize, recognize_many and `edgeocr run`'s run_pages decode on the pool's thread; only the
    admission (vision + prefill) runs on the caller's."""
    from edgeocr import batchrun, pages
    from edgeocr.model import OCRModel

    model = OCRModel(art_a)
    rec = _record(model)
    opts = DecodeOptions(max_new_tokens=2)
    imgs = [make_image(i, (200 + 40 * i, 300)) for i in range(3)]
    model.recognize(imgs[0], options=opts)
    list(model.recognize_many(imgs, options=opts))
    for i, img in enumerate(imgs):
        Image.fromarray(img).save(tmp_path / f"p{i}.png")
    refs = pages.list_pages(pages.list_files([str(tmp_path)]))
    got = []
    with pages.PageLoader() as loader:
        batchrun.run_pages(model, refs, loader, got.append, options=opts)
    assert len(got) == 3 and all(o.ok for o in got)
    main = threading.current_thread().name
    assert len(rec.host) == 7 and all(n.startswith("edgeocr-prepare") for n in rec.host)
    assert rec.admit == [main] * 7


def test_run_pages_hands_image_files_to_the_preparer_as_paths(art_a, tmp_path):
    """`edgeocr run` gives the preparer the file itself (so the fast path can decode a JPEG at reduced
    scale), not a decoded array."""
    from edgeocr import batchrun, pages
    from edgeocr.model import OCRModel

    model = OCRModel(art_a, preprocess="fast")
    seen = []
    inner = model.preparer
    model.preparer = lambda image: (seen.append(image), inner(image))[1]
    model.preparer.pixels = inner.pixels
    Image.fromarray(make_image(4, (900, 1300))).save(tmp_path / "a.jpg", quality=90)
    refs = pages.list_pages([str(tmp_path / "a.jpg")])
    got = []
    with pages.PageLoader() as loader:
        batchrun.run_pages(model, refs, loader, got.append, options=DecodeOptions(max_new_tokens=2))
    assert [x for x in seen if not isinstance(x, Prepared)] == [str(tmp_path / "a.jpg")] and got[0].ok and got[0].result.image_size == (1300, 900)


def test_engine_prepares_off_its_thread_and_answers_bad_images(art_a):
    """The daemon's engine: images are decoded on the pool, never on the engine thread; a bad image is a 400
    and every count returns to zero."""
    from edgeocr.sdnotify import Notifier
    from edgeocr.serve.config import ServerConfig
    from edgeocr.serve.engine import EngineWorker, open_model
    from edgeocr.serve.jobs import DONE, ERROR, Admission, Job
    from edgeocr.slots import PageRequest

    recs = []

    def opener(cfg):
        model, info = open_model(cfg)
        recs.append(_record(model))
        return model, info

    cfg = ServerConfig(artifact=str(art_a), threads=1, warmup=True)
    admission = Admission(queue_size=4)
    worker = EngineWorker(cfg, admission, Notifier(""), opener=opener)
    worker.start()

    async def main():
        loop = asyncio.get_running_loop()
        while worker.phase != "ready":
            assert worker.phase in ("loading", "warming")
            await asyncio.sleep(0.05)
        jobs = []
        for i, image in enumerate([make_image(1), b"not an image", make_image(2)]):
            job = Job(id=f"j{i}", request=PageRequest(image, options=DecodeOptions(max_new_tokens=3)),
                      stream=False, deadline=time.monotonic() + 60, loop=loop)
            admission.submit(admission.reserve(), job)
            jobs.append(job)
        return [await asyncio.wait_for(j.events.get(), 60) for j in jobs]

    try:
        out = asyncio.run(main())
    finally:
        worker.stop()
        worker.join(30)
    assert [o[0] for o in out] == [DONE, ERROR, DONE]
    assert out[1][1].status == 400 and out[1][1].type == "invalid_image"
    assert worker.idle() and admission.busy() == admission.in_engine() == admission.slots_busy() == 0
    rec = recs[0]
    assert len(rec.host) == 4 and all(n.startswith("edgeocr-prepare") for n in rec.host)   # warm-up + 3
    assert rec.admit and set(rec.admit) == {"edgeocr-engine"}


def test_finish_reason_is_one_enum_that_reads_as_its_value(art_a):
    import json

    from edgeocr import FinishReason
    from edgeocr.model import OCRModel

    r = OCRModel(art_a).recognize(make_image(2), options=DecodeOptions(max_new_tokens=2))
    assert r.finish_reason is FinishReason.LENGTH
    assert r.finish_reason == "length" and r.finish_reason in {"length"} and f"{r.finish_reason}" == "length"
    assert json.loads(json.dumps(r.to_dict()))["finish_reason"] == "length"
    assert [str(f) for f in FinishReason] == ["stop", "length", "cache_full", "repetition", "cancelled", "blank"]


def test_daemon_limit_reaches_the_preparer_and_blank_pages_finish_at_admission(art_a):
    """The daemon's max_pixels is the preparer's (checked on the worker, from the header); a page with no ink is
    marked blank by the preparer and finished by the scheduler at admission: FinishReason.BLANK, no token, the
    vision graph never run."""
    import io

    from edgeocr import FinishReason
    from edgeocr.errors import ImageTooLarge
    from edgeocr.serve.config import ServerConfig
    from edgeocr.serve.engine import open_model
    from edgeocr.slots import drive

    model, _ = open_model(ServerConfig(artifact=str(art_a), threads=1, max_pixels=50_000))
    assert model.preparer.max_pixels == 50_000
    png = io.BytesIO()
    Image.fromarray(make_image(1, (300, 400))).save(png, "PNG")            # 120,000 pixels
    with pytest.raises(ImageTooLarge, match="exceeds the pixel limit of 50,000"):
        model.workers.submit(model.page, png.getvalue()).result()
    blank = model.page(np.full((200, 200, 3), 240, np.uint8), task="spotting")
    assert blank.prep.blank and not model.page(make_image(1, (200, 200))).prep.blank
    sched, encoded = model.scheduler(), []
    inner = sched.session.encode_image
    sched.session.encode_image = lambda pixels: (encoded.append(1), inner(pixels))[1]
    events = [ev for step in drive(sched, [("blank", blank)]) for ev in step]
    assert [(ev.tag, ev.token_id) for ev in events] == [("blank", None)] and not encoded and sched.idle()
    r = events[0].result
    assert r.finish_reason is FinishReason.BLANK and (r.text, r.token_ids, r.prompt_tokens) == ("", [], 0)
    assert r.image_size == (200, 200) and r.to_dict()["finish_reason"] == "blank"
