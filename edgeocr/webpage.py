"""The small page served at `/`: upload an image, see the text and the boxes drawn on it.
Plain HTML and JavaScript, no external resources, served with a Content-Security-Policy that allows
only its own inline script and style (by hash).  `/?demo=1` runs it on /sample.png by itself."""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import re

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>edgeocr</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body{font-family:system-ui,sans-serif;margin:1.5rem;max-width:1100px;color:#222}
 fieldset{border:1px solid #ccc;padding:.8rem;margin-bottom:1rem} label{margin-right:1rem}
 #wrap{display:flex;gap:1rem;flex-wrap:wrap} canvas{max-width:540px;border:1px solid #ddd}
 pre{white-space:pre-wrap;background:#f6f6f6;padding:.6rem;min-height:4rem;max-width:520px;flex:1}
 .err{color:#b00} #max{width:6em} #key{width:10em}
</style></head><body>
<h1>edgeocr</h1>
<form id="f"><fieldset>
 <label>Image <input type="file" id="file" accept="image/*"></label>
 <label>Task <select id="task"></select></label>
 <label>Max tokens <input type="number" id="max" value="512" min="1"></label>
 <label>API key <input type="password" id="key" placeholder="TCP only"></label>
 <button id="go" type="submit">Read</button> <span id="status"></span>
</fieldset></form>
<div id="wrap"><canvas id="cv" width="10" height="10"></canvas><pre id="out"></pre></div>
<p id="meta"></p>
<script>
const $ = id => document.getElementById(id);
const key = () => $("key").value || localStorage.getItem("edgeocr_key") || "";
function headers(){ const k = key(); return k ? {"Authorization": "Bearer " + k} : {}; }
async function loadTasks(){
  try { const r = await fetch("/v1/info", {headers: headers()}); const j = await r.json();
        for (const t of (j.tasks || [])) { const o = document.createElement("option"); o.value = o.textContent = t;
          if (t === "spotting") o.selected = true; $("task").appendChild(o); } }
  catch (e) { $("status").textContent = "info unavailable"; }
  if (!$("task").options.length) { const o = document.createElement("option"); o.value = o.textContent = "spotting"; $("task").appendChild(o); }
}
function draw(blob, lines){
  return new Promise(resolve => { const img = new Image(); img.onload = () => {
    const cv = $("cv"); cv.width = img.width; cv.height = img.height; const c = cv.getContext("2d");
    c.drawImage(img, 0, 0); c.strokeStyle = "#e0203a"; c.lineWidth = Math.max(2, img.width / 400);
    for (const l of lines) { const [x1, y1, x2, y2] = l.box; c.strokeRect(x1, y1, x2 - x1, y2 - y1); }
    resolve(); }; img.src = URL.createObjectURL(blob); });
}
async function run(blob){
  document.body.dataset.state = "running"; $("status").textContent = "reading...";
  $("out").classList.remove("err");
  const fd = new FormData(); fd.append("image", blob, "upload"); fd.append("task", $("task").value || "spotting");
  fd.append("max_new_tokens", $("max").value);
  if ($("key").value) localStorage.setItem("edgeocr_key", $("key").value);
  try {
    const r = await fetch("/v1/ocr", {method: "POST", body: fd, headers: headers()}); const j = await r.json();
    if (!r.ok) { $("out").textContent = j.error ? j.error.type + ": " + j.error.message : r.status;
                 $("out").classList.add("err"); document.body.dataset.state = "error"; $("status").textContent = ""; return; }
    $("out").textContent = j.text; await draw(blob, j.lines || []);
    $("meta").textContent = j.generated_tokens + " tokens, " + j.finish_reason + ", " + Math.round(j.timings_ms.total) +
      " ms; " + (j.lines || []).length + " boxes";
    $("meta").dataset.lines = (j.lines || []).length; $("meta").dataset.tokens = j.generated_tokens;
    document.body.dataset.state = "done"; $("status").textContent = "";
  } catch (e) { $("out").textContent = String(e); $("out").classList.add("err"); document.body.dataset.state = "error"; }
}
$("f").addEventListener("submit", ev => { ev.preventDefault(); const f = $("file").files[0];
  if (!f) { $("status").textContent = "choose an image first"; return; } run(f); });
loadTasks().then(async () => { if (new URLSearchParams(location.search).get("demo")) {
  const b = await (await fetch("/sample.png")).blob(); run(b); } });
</script></body></html>
"""


@functools.lru_cache(maxsize=1)
def sample_png() -> bytes:
    """A small receipt-like page drawn with Pillow's built-in font."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (480, 320), "white")
    d = ImageDraw.Draw(img)
    for i, line in enumerate(["EDGEOCR MART", "Milk 1L        3.20", "Bread          2.50", "TOTAL          5.70",
                              "2026-12-02 10:15", "Thank you!"]):
        d.text((30, 25 + 45 * i), line, fill="black", font_size=24)
    b = io.BytesIO()
    img.save(b, "PNG")
    return b.getvalue()


def _hashes(tag: str) -> str:
    """CSP source list allowing exactly the page's inline <script>/<style> blocks (by SHA-256)."""
    blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", PAGE, flags=re.S)
    return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'" for b in blocks)


# headers sent with the page: no external resources, no framing, no referrer, no MIME sniffing
SECURITY_HEADERS = {
    "Content-Security-Policy": (f"default-src 'none'; script-src {_hashes('script')}; style-src {_hashes('style')}; "
                                "img-src 'self' blob: data:; connect-src 'self'; form-action 'none'; "
                                "base-uri 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}
