"""The command lines, run as users run them (subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys

from PIL import Image

from conftest import make_image


def run(*args, check=True):
    p = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def test_import_is_light():
    code = ("import sys, edgeocr, edgeocr.cli, edgeocr.model, edgeocr.backends.ort; "
            "heavy = [m for m in ('torch', 'transformers', 'onnx', 'onnxruntime', 'cv2') if m in sys.modules]; "
            "print(heavy)")
    assert run("-c", code).stdout.strip() == "[]"


def test_run_text_json_and_errors(art_a, tmp_path):
    img = tmp_path / "page.png"
    Image.fromarray(make_image(0)).save(img)
    p = run("-m", "edgeocr", "run", str(img), "--model", str(art_a), "--task", "spotting", "--format", "json",
            "--max-new-tokens", "4")
    out = json.loads(p.stdout.strip().splitlines()[0])
    assert out["generated_tokens"] == 4 and out["finish_reason"] == "length" and out["task"] == "spotting"
    assert {"vision", "prefill", "decode", "total", "first_token", "per_token"} <= set(out["timings_ms"])
    assert "tokens, finish=length" in p.stderr and "text cut off at --max-new-tokens" in p.stderr
    p = run("-m", "edgeocr", "run", str(img), "--model", str(art_a), "--stream", "--max-new-tokens", "3")
    assert "finish=length" in p.stderr
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"nope")
    p = run("-m", "edgeocr", "run", str(bad), str(img), "--model", str(art_a), "--max-new-tokens", "2", check=False)
    assert p.returncode == 1 and "not a recognized image format" in p.stderr and "finish=length" in p.stderr
    p = run("-m", "edgeocr", "run", str(img), "--model", str(tmp_path), check=False)
    assert p.returncode == 1 and "no manifest.json" in p.stderr and "Traceback" not in p.stderr
    p = run("-m", "edgeocr", "run", str(img), check=False)
    assert p.returncode == 2 and "no model" in p.stderr


def test_run_stops_quietly_when_its_reader_goes_away(art_a, tmp_path):
    """`edgeocr run ... | head -1`: once stdout's reader has closed the pipe the run stops with 141 (as a tool
    ended by SIGPIPE), no traceback; --stream with --format json is refused as a usage error."""
    imgs = []
    for k in range(4):
        imgs.append(tmp_path / f"p{k}.png")
        Image.fromarray(make_image(k)).save(imgs[-1])
    p = subprocess.Popen([sys.executable, "-m", "edgeocr", "run", *map(str, imgs), "--model", str(art_a),
                          "--format", "json", "--max-new-tokens", "3"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert json.loads(p.stdout.readline())["generated_tokens"] == 3
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=600) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    p = run("-m", "edgeocr", "run", str(imgs[0]), "--model", str(art_a), "--stream", "--format", "json", check=False)
    assert p.returncode == 2 and "--stream" in p.stderr and "--format json" in p.stderr


def test_summary_line_says_when_the_text_is_cut():
    """A page that ended on a full KV cache or on --max-new-tokens says its text is cut and what to change; a
    page that stopped says nothing more."""
    from edgeocr.cli import _summary_line
    rec = {"generated_tokens": 958, "timings_ms": {"total": 9.0, "vision": 1.0, "prefill": 1.0, "per_token": 1.0}}
    full = _summary_line({**rec, "finish_reason": "cache_full"}, "p.png")
    assert "finish=cache_full" in full and "KV cache is full" in full and "--cache-len" in full
    assert "--max-new-tokens" in _summary_line({**rec, "finish_reason": "length"}, "p.png")
    assert "cut off" not in _summary_line({**rec, "finish_reason": "stop"}, "p.png")


def test_tasks_listing():
    assert "spotting" in run("-m", "edgeocr", "tasks").stdout
    en = run("-m", "edgeocr", "tasks", "--lang", "en").stdout          # the README's command
    assert "structured_parse   Extract the text in the image." in en


def test_export_cli_reports_sizes(ckpt_a, tmp_path):
    p = run("-m", "quantize", "export", str(ckpt_a), str(tmp_path / "art"), "--cache-len", "1200",
            "--prefill-len", "1100")
    assert "MiB  total" in p.stdout and "exporting decoder graph" in p.stderr
    m = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert m["kv_cache"]["cache_len"] == 1200 and m["rope"]["layout"] == "B"
    p = run("-m", "quantize", "export", str(tmp_path), str(tmp_path / "x"), check=False)
    assert p.returncode == 2 and "missing config.json" in p.stderr
    p = run("-m", "quantize", "export", str(ckpt_a), str(tmp_path / "art" / "manifest.json"), check=False)
    assert p.returncode == 2 and "is a file; OUT is the artifact directory" in p.stderr and "Traceback" not in p.stderr
    # int8: a calibration folder that is not there is found before the export, and nothing is written
    p = run("-m", "quantize", "int8", str(ckpt_a), str(tmp_path / "q8"), "--calib", str(tmp_path / "nope"), check=False)
    assert p.returncode == 2 and "nope" in p.stderr and "exporting" not in p.stderr and not (tmp_path / "q8").exists()
