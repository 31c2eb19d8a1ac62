"""`edgeocr run` as a batch tool: folders, globs, PDFs, JSONL out, resume, Ctrl-C, progress bar."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from PIL import Image

from conftest import make_image
from edgeocr import batchrun, pages
from edgeocr.errors import BackendError, ImageError, ImageTooLarge

BAR = "page/s]"                      # the end of tqdm's bar line: "3/3 [00:01<00:00,  2.50page/s]"


def cli(*args, check_rc=None, **kw):
    p = subprocess.run([sys.executable, "-m", "edgeocr", "run", *map(str, args)], capture_output=True, text=True,
                       timeout=300, **kw)
    if check_rc is not None and p.returncode != check_rc:
        raise AssertionError(f"{args} exited {p.returncode}, expected {check_rc}\n{p.stdout}\n{p.stderr}")
    return p


def image(seed: int, w: int, h: int) -> Image.Image:
    return Image.fromarray(make_image(seed, (max(h, 60), max(w, 140)))[:h, :w])


def save_images(folder: Path, names: list[str]) -> dict[str, tuple[int, int]]:
    """Distinct sizes, so each output line can be matched to its file by image_size."""
    folder.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for i, name in enumerate(names):
        h, w = 120 + 10 * i, 160 + 7 * i
        image(i, w, h).save(folder / name)
        sizes[str(folder / name)] = (w, h)
    return sizes


def save_pdf(path: Path, sizes: list[tuple[int, int]]) -> None:
    """A PDF with one page per (width, height); at 72 dpi a pixel is a point."""
    ims = [image(20 + i, w, h) for i, (w, h) in enumerate(sizes)]
    ims[0].save(path, "PDF", save_all=True, append_images=ims[1:], resolution=72.0)


def lines_of(path: Path) -> list[dict]:
    data = path.read_text(encoding="utf-8")
    assert data.endswith("\n"), "the JSONL file must end with a complete line"
    return [json.loads(s) for s in data.splitlines()]


def test_folder_with_a_corrupt_file(art_a, tmp_path):
    sizes = save_images(tmp_path / "in", ["b.png", "a.png", "c.jpg"])
    (tmp_path / "in" / "broken.png").write_bytes(b"nope")
    (tmp_path / "in" / "notes.txt").write_text("not a page")
    image(9, 50, 50).save(tmp_path / "in" / ".hidden.png")
    out = tmp_path / "out.jsonl"
    p = cli(tmp_path / "in", "--model", art_a, "--out", out, "--max-new-tokens", "2", "--task", "spotting",
            check_rc=1)
    recs = lines_of(out)
    assert sorted(r["file"] for r in recs) == sorted([*sizes, str(tmp_path / "in" / "broken.png")])
    bad = [r for r in recs if "error" in r]
    assert len(bad) == 1 and bad[0]["file"].endswith("broken.png") and bad[0]["page"] is None
    assert bad[0]["error"] == {"type": "ImageError",
                               "message": f"{tmp_path / 'in' / 'broken.png'}: not a recognized image format"}
    for r in recs:
        if "error" not in r:
            assert r["page"] is None and tuple(r["image_size"]) == sizes[r["file"]]
            assert r["finish_reason"] == "length" and r["generated_tokens"] == 2 and isinstance(r["text"], str)
            assert r["lines"] == [] or isinstance(r["lines"][0]["box"], list)
            assert {"load", "vision", "prefill", "decode", "total"} <= set(r["timings_ms"])
    assert "not a recognized image format" in p.stderr and "4 pages" in p.stderr and "3 ok, 1 failed" in p.stderr
    assert BAR not in p.stderr                               # stderr is a pipe here: no progress bar
    assert p.stdout == ""


def test_pdf_pages_at_dpi_and_a_broken_pdf(art_a, tmp_path):
    pytest.importorskip("pypdfium2", reason="the pdf extra is part of the dev install")
    page_sizes = [(150, 200), (180, 120), (100, 100)]
    save_pdf(tmp_path / "doc.pdf", page_sizes)
    (tmp_path / "bad.pdf").write_bytes(b"%PDF-1.4 this is not a PDF body")
    out = tmp_path / "out.jsonl"
    cli(tmp_path / "doc.pdf", tmp_path / "bad.pdf", "--model", art_a, "--out", out, "--dpi", "144",
        "--max-new-tokens", "2", check_rc=1)
    recs = lines_of(out)
    good = sorted((r for r in recs if "error" not in r), key=lambda r: r["page"])
    assert [r["page"] for r in good] == [1, 2, 3] and {r["file"] for r in good} == {str(tmp_path / "doc.pdf")}
    assert [tuple(r["image_size"]) for r in good] == [(2 * w, 2 * h) for w, h in page_sizes]   # 144 dpi = 2x
    (bad,) = [r for r in recs if "error" in r]
    assert bad["file"] == str(tmp_path / "bad.pdf") and bad["page"] is None
    assert bad["error"]["type"] == "ImageError" and "not a readable PDF" in bad["error"]["message"]
    # stdout JSON without --out: one object per page, the same keys as an --out line
    p = cli(tmp_path / "doc.pdf", "--model", art_a, "--format", "json", "--max-new-tokens", "2", check_rc=0)
    objs = [json.loads(s) for s in p.stdout.splitlines()]
    assert sorted(o["page"] for o in objs) == [1, 2, 3] and {o["file"] for o in objs} == {str(tmp_path / "doc.pdf")}
    assert all(o.keys() == good[0].keys() for o in objs)
    assert p.stderr.count("tokens, finish=length") == 3


def test_globs(art_a, tmp_path):
    d = tmp_path / "scans"
    sizes = save_images(d, ["a.png", "b.png", "c.jpg"])
    sizes.update(save_images(d / "sub", ["e.png"]))
    p = cli(f"{d}/*.png", f"{d}/**/*.png", d / "a.png", "--model", art_a, "--max-new-tokens", "1", check_rc=0)
    headers = [s[3:] for s in p.stdout.splitlines() if s.startswith("== ")]
    assert headers == [str(d / "a.png"), str(d / "b.png"), str(d / "sub" / "e.png")]    # sorted, each once
    p = cli(f"{d}/*.tif", "--model", art_a, check_rc=2)
    assert "no image or PDF file matches this pattern" in p.stderr


def test_resume_after_a_partial_file(art_a, tmp_path):
    sizes = save_images(tmp_path / "in", [f"p{i}.png" for i in range(5)])
    f = [str(tmp_path / "in" / f"p{i}.png") for i in range(5)]
    out = tmp_path / "out.jsonl"
    kept = [{"file": f[0], "page": None, "text": "kept 0"}, {"file": f[2], "page": None, "text": "kept 2"}]
    out.write_text(json.dumps(kept[0]) + "\n"
                   + json.dumps({"file": f[1], "page": None, "error": {"type": "ImageError", "message": "x"}}) + "\n"
                   + json.dumps(kept[1]) + "\n"
                   + '{"file": "' + f[3] + '", "page": nu')                     # hard kill mid-line
    p = cli(tmp_path / "in", "--model", art_a, "--out", out, "--max-new-tokens", "1", check_rc=2)
    assert "already exists: pass --resume" in p.stderr
    p = cli(tmp_path / "in", "--model", art_a, "--out", out, "--resume", "--max-new-tokens", "1", check_rc=0)
    assert "2 pages already done, 3 to go (1 error line(s) removed; 1 of those pages run again)" in p.stderr
    assert p.stderr.count("tokens, finish=length") == 3
    recs = lines_of(out)
    assert recs[:2] == kept                                    # untouched, in place
    assert sorted(r["file"] for r in recs) == f and not any("error" in r for r in recs)
    assert {r["file"]: tuple(r["image_size"]) for r in recs[2:]} == {k: sizes[k] for k in (f[1], f[3], f[4])}
    # everything done: nothing is loaded (the model path does not even exist)
    p = cli(tmp_path / "in", "--model", tmp_path / "no-model", "--out", out, "--resume", check_rc=0)
    assert "nothing to do: all 5 pages are in" in p.stderr


def _wait_for_lines(path: Path, n: int, proc, timeout=120.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"no {n} lines in {path} after {timeout} s")


def test_ctrl_c_leaves_a_valid_jsonl_and_resume_finishes(art_a, tmp_path):
    n = 12
    save_images(tmp_path / "in", [f"p{i:02d}.png" for i in range(n)])
    out = tmp_path / "out.jsonl"
    args = [sys.executable, "-m", "edgeocr", "run", str(tmp_path / "in"), "--model", str(art_a), "--out", str(out),
            "--max-new-tokens", "2"]
    # one Ctrl-C: stop feeding pages, finish the one in flight, close the file, exit 130
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_lines(out, 2, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    first = lines_of(out)
    assert 2 <= len(first) < n and "interrupted" in err and "--resume" in err and "Traceback" not in err
    # Ctrl-C twice: stop at once; still only complete lines
    with open(tmp_path / "err.txt", "w+") as errf:
        proc = subprocess.Popen([*args, "--resume"], stdout=subprocess.DEVNULL, stderr=errf, text=True)
        _wait_for_lines(out, len(first) + 1, proc)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        while "Ctrl-C again" not in (tmp_path / "err.txt").read_text() and time.monotonic() - t0 < 60:
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    err = (tmp_path / "err.txt").read_text()
    assert proc.returncode == 130 and "Traceback" not in err, err
    second = lines_of(out)
    assert second[:len(first)] == first and len(second) < n
    p = subprocess.run([*args, "--resume"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    recs = lines_of(out)
    assert sorted(r["file"] for r in recs) == sorted(str(tmp_path / "in" / f"p{i:02d}.png") for i in range(n))


def _stderr_on_a_terminal(args, rows: int, cols: int) -> str:
    """Run with stderr on a pseudo-terminal of rows x cols (0 x 0: one that does not report its size)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "edgeocr", "run", *map(str, args)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            b = os.read(master, 4096)
        except OSError:                       # EIO: the child closed the terminal
            break
        if not b:
            break
        chunks.append(b)
    os.close(master)
    assert proc.wait(timeout=120) == 0
    return b"".join(chunks).decode(errors="replace")


def test_progress_bar_on_a_terminal_only(art_a, tmp_path):
    save_images(tmp_path / "in", ["a.png", "b.png"])
    args = [tmp_path / "in", "--model", art_a, "--out", tmp_path / "o.jsonl", "--overwrite", "--max-new-tokens", "1"]
    for rows, cols in [(30, 100), (0, 0)]:
        err = _stderr_on_a_terminal(args, rows, cols)
        assert "100%|" in err and "2/2 [" in err and BAR in err, err
        assert "tokens, finish=" not in err            # per-page lines give way to the bar
    p = cli(*args, check_rc=0)
    assert BAR not in p.stderr and p.stderr.count("tokens, finish=") == 2


def test_usage_errors(tmp_path):
    save_images(tmp_path / "in", ["a.png"])
    (tmp_path / "empty").mkdir()
    for extra, msg in [(["--out", tmp_path / "o.jsonl", "--stream"], "does not combine with --out"),
                       (["--resume"], "apply to an --out file"),
                       ([tmp_path / "empty"], "folder has no image or PDF file"),
                       (["--dpi", "0"], "--dpi must be positive"),
                       (["-v", "--dpi", "0"], "--dpi must be positive"),       # -v after the command is taken
                       (["--max-new-tokens", "0"], "--max-new-tokens must be a positive integer, got 0"),
                       (["--max-pixels", "0"], "--max-pixels must be a positive integer"),
                       (["--remote", "unix:/x.sock", "--stream"], "--stream is for local runs"),
                       (["--out", tmp_path / "nowhere" / "o.jsonl"], "does not exist"),
                       (["--task", "layout", "--lang", "en"], "task 'layout' has no English prompt; use --lang zh"),
                       (["--remote", "127.0.0.1:8090"], "daemon address '127.0.0.1:8090': use unix:/path.sock or "
                                                        "http://HOST:PORT"),
                       (["--remote", "http://127.0.0.1:99999"], "Port out of range")]:
        p = cli(tmp_path / "in", *extra, "--model", tmp_path, check_rc=2)
        assert msg in p.stderr and "Traceback" not in p.stderr
    p = cli(tmp_path / "nope.png", tmp_path / "in" / "b.png", "--model", tmp_path, check_rc=2)   # none exists
    assert f"no such file: {tmp_path / 'nope.png'}, {tmp_path / 'in' / 'b.png'}" in p.stderr
    assert "manifest" not in p.stderr                       # said before the model would load


# ---------------------------------------------------------------------------------------------- in process
def test_list_files_order_hidden_dedup_and_missing(tmp_path):
    d = tmp_path / "d"
    save_images(d, ["b.png", "a.PNG"])
    (d / "c.pdf.txt").write_text("not a page")
    (d / ".x.png").write_bytes(b"")
    (d / "sub").mkdir()
    save_images(d / "sub", ["z.png"])
    assert pages.list_files([str(d)]) == [str(d / "a.PNG"), str(d / "b.png")]          # not recursive
    assert pages.list_files([str(d / "b.png"), str(d), f"{d}/**/*.png", str(tmp_path / "missing.png")]) == [
        str(d / "b.png"), str(d / "a.PNG"), str(d / "sub" / "z.png"), str(tmp_path / "missing.png")]
    with pytest.raises(pages.InputPathError, match=r"matches 1 other files"):
        pages.list_files([f"{d}/*.txt"])
    refs = pages.list_pages([str(tmp_path / "missing.png")])
    with pytest.raises(ImageError, match="no such file"):
        pages.PageLoader().load(refs[0])


def test_pdf_without_the_extra_names_it(tmp_path, monkeypatch):
    save_pdf(tmp_path / "d.pdf", [(50, 60)])
    monkeypatch.setitem(sys.modules, "pypdfium2", None)           # import fails as when not installed
    with pytest.raises(BackendError, match=r"pip install 'edgeocr\[pdf\]'"):
        pages.list_pages([str(tmp_path / "d.pdf")])


def test_pdf_page_limit_and_header_sniffing(tmp_path):
    pytest.importorskip("pypdfium2", reason="the pdf extra is part of the dev install")
    save_pdf(tmp_path / "scan.bin", [(100, 50), (40, 40)])      # a PDF whatever its name
    refs = pages.list_pages([str(tmp_path / "scan.bin")])
    assert [r.key for r in refs] == [(str(tmp_path / "scan.bin"), 1), (str(tmp_path / "scan.bin"), 2)]
    with pages.PageLoader(dpi=72) as loader:
        assert loader.load(refs[0]).shape == (50, 100, 3) and loader.load(refs[1]).dtype.name == "uint8"
    with pages.PageLoader(dpi=720, max_pixels=100_000) as loader, \
            pytest.raises(ImageTooLarge, match=r"page 1 at 720 dpi: 1000x500 = 500,000 pixels exceeds the pixel limit "
                                               r"of 100,000 \(max_pixels.* lower --dpi"):
        loader.load(refs[0])


def test_resume_state_and_writer(tmp_path):
    out = tmp_path / "o.jsonl"
    out.write_text('{"file": "a", "page": 1, "text": "x"}\n{"file": "a", "page": 2, "error": {}}\n\n'
                   '{"file": "b", "page": null, "text": "y"}\n{"file": "c"')
    with pytest.raises(batchrun.OutputError, match="already exists"):
        batchrun.prepare_output(out)
    st = batchrun.prepare_output(out, resume=True)
    assert st.done == {("a", 1), ("b", None)} and (st.kept, st.retried, st.partial_bytes) == (2, 1, 12)
    assert out.read_text() == '{"file": "a", "page": 1, "text": "x"}\n{"file": "b", "page": null, "text": "y"}\n'
    w = batchrun.JsonlWriter(out)
    w.write({"file": "c", "page": None, "text": "ü"})
    w._f.write(b'{"file": "d", "pa')                # a write cut short by a second Ctrl-C
    w.close()
    assert [r["file"] for r in lines_of(out)] == ["a", "b", "c"] and lines_of(out)[2]["text"] == "ü"
    out.write_text('{"file": "a"}\nnot json\n')
    with pytest.raises(batchrun.OutputError, match="line 2 is not an `edgeocr run` JSON line"):
        batchrun.prepare_output(out, resume=True)
    assert batchrun.prepare_output(out, overwrite=True).done == frozenset() and out.read_bytes() == b""


class _OutOfOrder:
    """A model whose recognize_many takes pages lazily, `slots` at a time, and finishes each group in reverse
    order."""

    def __init__(self, model, slots=3):
        self.recognize, self.prepare, self.workers = model.recognize, model.prepare, model.workers
        self.slots, self.pulled = slots, 0

    def recognize_many(self, images, task=None, prompt=None, lang="zh", options=None):
        it, i = iter(images), 0
        while True:
            group = []
            for img in it:
                self.pulled += 1
                group.append((i, img))
                i += 1
                if len(group) == self.slots:
                    break
            if not group:
                return
            for j, img in reversed(group):
                yield j, self.recognize(img, task=task, prompt=prompt, lang=lang, options=options)


def test_run_pages_maps_out_of_order_results_and_stops_feeding(art_a, tmp_path):
    from edgeocr.decode import DecodeOptions
    from edgeocr.model import OCRModel

    sizes = save_images(tmp_path, [f"p{i}.png" for i in range(5)])
    (tmp_path / "p3.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    refs = pages.list_pages(sorted(sizes))
    model = OCRModel(art_a)
    opts = DecodeOptions(max_new_tokens=1)
    for wrapped in (model, _OutOfOrder(model)):
        got = []
        with pages.PageLoader() as loader:
            batchrun.run_pages(wrapped, refs, loader, got.append, task="spotting", options=opts)
        assert sorted(o.ref.file for o in got) == sorted(sizes)
        for o in got:
            if o.ref.file.endswith("p3.png"):
                assert not o.ok and isinstance(o.error, ImageError) and o.record()["error"]["type"] == "ImageError"
            else:
                assert o.ok and o.result.image_size == sizes[o.ref.file] and o.record()["timings_ms"]["load"] > 0
    # stop while the first group (3 pages) is in flight: that group finishes, nothing more is fed
    ooo, got = _OutOfOrder(model), []
    stop = batchrun.threading.Event()
    with pages.PageLoader() as loader:
        batchrun.run_pages(ooo, refs, loader, lambda o: (got.append(o), stop.set()), options=opts, stop=stop)
    assert len(got) == 3 and ooo.pulled == 3 and [o.ref.file for o in got] == sorted(sizes)[2::-1]


def test_degenerate_pages_blank_and_too_small_and_pixel_limit(art_a, tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    Image.new("RGB", (400, 300), "white").save(d / "a_blank.png")
    Image.new("RGB", (1, 1), "white").save(d / "b_dot.png")
    image(3, 300, 200).save(d / "c_text.png")
    out = tmp_path / "o.jsonl"
    p = cli(d, "--model", art_a, "--out", out, "--max-new-tokens", "2", check_rc=1)
    recs = {Path(r["file"]).name: r for r in lines_of(out)}
    blank = recs["a_blank.png"]
    assert blank["finish_reason"] == "blank" and blank["text"] == "" and blank["generated_tokens"] == 0
    assert blank["image_size"] == [400, 300] and blank["lines"] == []
    dot = recs["b_dot.png"]["error"]
    assert dot["type"] == "PageTooSmall" and "1x1 pixels is smaller than the minimum page of 16x16" in dot["message"]
    assert recs["c_text.png"]["generated_tokens"] == 2
    # a missing file among existing ones is said before the model loads, then is that page's error
    p = cli(d / "c_text.png", d / "nope.png", "--model", art_a, "--max-new-tokens", "2", check_rc=1)
    assert p.stderr.index("warning: no such file") < p.stderr.index("error: ") and "1 ok, 1 failed" in p.stderr
    # without --out, --format json prints one line per page on stdout, the failed page's included
    p = cli(d, "--model", art_a, "--format", "json", "--max-new-tokens", "2", check_rc=1)
    printed = {Path(r["file"]).name: r for r in map(json.loads, p.stdout.splitlines())}
    assert sorted(printed) == sorted(recs) and printed["b_dot.png"]["error"]["type"] == "PageTooSmall"
    # one pixel limit, one message naming the setting, for files and for rendered PDF pages
    p = cli(d / "c_text.png", "--model", art_a, "--max-pixels", "50000", check_rc=1)
    assert "300x200 = 60,000 pixels exceeds the pixel limit of 50,000 (max_pixels: --max-pixels or " \
           "EDGEOCR_MAX_PIXELS)" in p.stderr
    p = cli(d / "c_text.png", "--model", art_a, env=dict(os.environ, EDGEOCR_MAX_PIXELS="50000"), check_rc=1)
    assert "exceeds the pixel limit of 50,000" in p.stderr


def test_spotting_text_format_prints_one_box_per_line():
    from edgeocr.cli import format_text
    rec = {"text": "EXPRESS(35,46),(172,69)FROM:(33,115),(87,127)",
           "lines": [{"text": "EXPRESS", "box": [35, 46, 172, 69]}, {"text": "FROM:", "box": [33, 115, 87, 1270]}]}
    assert format_text(rec).splitlines() == ["[  35,   46,  172,   69]  EXPRESS", "[  33,  115,   87, 1270]  FROM:"]
    assert format_text({"text": "plain", "lines": []}) == "plain"
