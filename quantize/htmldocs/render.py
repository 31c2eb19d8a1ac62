"""Headless Chromium rendering with per-visual-line boxes read from the DOM.

Driver: Playwright (PyPI `playwright`), launched with `executable_path` pointing at the system Chromium
(Debian's `chromium` package; `EDGEOCR_CHROMIUM` overrides), so no browser download is needed.  It works
with that Chromium as is, is maintained alongside Chromium's DevTools protocol, and takes care of the
browser process, page lifecycle, script evaluation and protocol sessions; a raw DevTools-over-websocket
client (`websocket-client`) would have to re-implement exactly that.  Screenshots use Playwright's
DevTools session directly (`Page.captureScreenshot` with its fast PNG path).

One `Renderer` holds one browser and one tab and renders any number of pages in it (set content,
measure, screenshot), which is what makes batches fast.  Per page:

1. every text item (an element with class "t"; text anywhere else is an error) is measured one character
   at a time with DOM Ranges; characters are grouped into visual lines (a wrapped paragraph gives one line
   per row it occupies, with that row's text);
2. items that leave the page or overlap an earlier item are hidden (`visibility: hidden` keeps the layout)
   and not labelled;
3. a second screenshot draws only the text, black on white (colours, backgrounds, borders turned off, the
   layout unchanged): each line's box is the ink inside its layout box, so boxes are ink-tight like the
   PIL generator's.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass

import numpy as np

from edgeocr.errors import EdgeOCRError

log = logging.getLogger("edgeocr")

CHROMIUM_ENV = "EDGEOCR_CHROMIUM"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INK_LEVEL = 200            # text-only render: a pixel darker than this is ink
EDGE_SLACK_PX = 1          # ink searched this far left/right of a line's layout box (italic overhang)
OVERLAP_TOL_PX = 1.0       # layout boxes may touch by this much before the later item is hidden
SCREENSHOT_TRIES = 3       # attempts at a page screenshot (Chromium sometimes has no frame ready yet)
# A character's layout box is the font's whole content area (Noto CJK: about 1.45 em), taller than the line
# box at tight line heights, so boxes of stacked lines overlap without their ink touching.  Overlap is
# judged on the middle of each box (this share cut from the top and from the bottom).
OVERLAP_INSET = 0.22

# Families the generator draws from when fontconfig lists them (sorted choice: order-independent).
LATIN_FAMILIES = ("Liberation Sans", "Liberation Serif", "Liberation Mono", "DejaVu Sans", "DejaVu Serif",
                  "DejaVu Sans Mono", "DejaVu Sans Condensed", "DejaVu Serif Condensed")
CJK_FAMILIES = ("Noto Sans CJK SC", "Noto Serif CJK SC", "Noto Sans Mono CJK SC", "WenQuanYi Micro Hei",
                "WenQuanYi Micro Hei Mono", "AR PL UMing CN")
MONO_FAMILIES = frozenset({"Liberation Mono", "DejaVu Sans Mono", "Noto Sans Mono CJK SC", "WenQuanYi Micro Hei Mono"})


class RenderError(EdgeOCRError):
    """Chromium or its driver is missing, or a page could not be rendered."""


def find_chromium() -> str:
    """Path of the Chromium executable: $EDGEOCR_CHROMIUM, else the first of CHROMIUM_NAMES on PATH."""
    env = os.environ.get(CHROMIUM_ENV)
    if env:
        if not os.access(env, os.X_OK):
            raise RenderError(f"{CHROMIUM_ENV}={env} is not an executable")
        return env
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise RenderError("no Chromium found (looked for " + ", ".join(CHROMIUM_NAMES) + f" on PATH and ${CHROMIUM_ENV}); "
                      "install it with `apt-get install chromium` (scripts/setup.sh does as root)")


@dataclass(frozen=True)
class Families:
    latin: tuple[str, ...]
    cjk: tuple[str, ...]


@functools.lru_cache(maxsize=1)
def font_families() -> Families:
    """The installed families of LATIN_FAMILIES / CJK_FAMILIES, as fontconfig (`fc-list`) lists them."""
    try:
        out = subprocess.run(["fc-list", "--format", "%{family}\n"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise RenderError(f"fc-list failed ({e}); install fontconfig and the fonts (scripts/setup.sh)") from None
    have = {f.strip() for line in out.splitlines() for f in line.split(",")}
    fam = Families(tuple(f for f in LATIN_FAMILIES if f in have), tuple(f for f in CJK_FAMILIES if f in have))
    if not fam.cjk:
        raise RenderError("no CJK font family installed (want one of " + ", ".join(CJK_FAMILIES) +
                          "); apt-get install fonts-noto-cjk fonts-wqy-microhei")
    if not fam.latin:
        raise RenderError("no Latin font family installed; apt-get install fonts-liberation2 fonts-dejavu-core")
    return fam


# Reads every ".t" item: per-character Range rects grouped into visual lines; hides items that leave the
# page or overlap an earlier one.  Returns {lines: [[item, text, x0, y0, x1, y1]], stray: text outside items}.
MEASURE_JS = r"""
([pageW, pageH, tol, inset]) => {
  const items = Array.from(document.querySelectorAll('.t'));
  const stray = [];
  const tw = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = tw.nextNode(); n; n = tw.nextNode()) {
    if (n.data.trim() && !n.parentElement.closest('.t') && !n.parentElement.closest('style,script'))
      stray.push(n.data.trim().slice(0, 40));
  }
  const rg = document.createRange();
  const kept = [];
  const out = [];
  items.forEach((el, idx) => {
    const lines = [];
    let cur = null;
    const w = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let n = w.nextNode(); n; n = w.nextNode()) {
      const s = n.data;
      for (let i = 0; i < s.length; i++) {
        const c = s[i];
        if (/\s/.test(c)) { if (cur) cur.text += ' '; continue; }
        rg.setStart(n, i); rg.setEnd(n, i + 1);
        const rs = rg.getClientRects();
        let r = null;
        for (const q of rs) if (q.width > 0 && q.height > 0 && (!r || q.width > r.width)) r = q;
        if (!r) continue;
        const cy = (r.top + r.bottom) / 2;
        if (!cur || cy > cur.y1 || cy < cur.y0 || r.left < cur.last - 1) {
          cur = {text: '', x0: r.left, y0: r.top, x1: r.right, y1: r.bottom, last: r.right};
          lines.push(cur);
        }
        cur.text += c;
        cur.x0 = Math.min(cur.x0, r.left); cur.y0 = Math.min(cur.y0, r.top);
        cur.x1 = Math.max(cur.x1, r.right); cur.y1 = Math.max(cur.y1, r.bottom);
        cur.last = r.right;
      }
    }
    if (!lines.length) return;
    let ok = lines.every(l => l.x0 >= 0 && l.y0 >= 0 && l.x1 <= pageW && l.y1 <= pageH);
    if (ok) {
      for (const l of lines) {
        for (const k of kept) {
          const li = (l.y1 - l.y0) * inset, ki = (k.y1 - k.y0) * inset;
          if (l.x0 < k.x1 - tol && k.x0 < l.x1 - tol && l.y0 + li < k.y1 - ki && k.y0 + ki < l.y1 - li) { ok = false; break; }
        }
        if (!ok) break;
      }
    }
    if (!ok) { el.style.visibility = 'hidden'; return; }
    for (const l of lines) {
      kept.push(l);
      out.push([idx, l.text.replace(/\s+/g, ' ').trim(), l.x0, l.y0, l.x1, l.y1]);
    }
  });
  return {lines: out, stray: stray};
}
"""

MASK_CSS = ("*, *::before, *::after { color: #000 !important; background: transparent !important; "
            "border-color: transparent !important; column-rule-color: transparent !important; "
            "box-shadow: none !important; text-shadow: none !important; "
            "outline-color: transparent !important; text-decoration-color: transparent !important; "
            "opacity: 1 !important; } html, body { background: #fff !important; } "
            "img, svg, hr, .deco { visibility: hidden !important; }")

TOGGLE_MASK_JS = r"""
(on) => {
  let s = document.getElementById('__textonly');
  if (on && !s) { s = document.createElement('style'); s.id = '__textonly'; s.textContent = %s;
                  document.head.appendChild(s); }
  if (!on && s) s.remove();
  return document.fonts.ready.then(() => true);
}
"""


@dataclass(frozen=True)
class TextLine:
    text: str
    box: tuple[int, int, int, int]        # x0, y0, x1, y1 image pixels, ink-tight
    item: int                             # index of the .t element it came from


@dataclass(frozen=True)
class Rendered:
    image: np.ndarray                     # [H, W, 3] uint8 as Chromium drew it
    text_only: np.ndarray                 # [H, W] uint8 grey: the same layout, text only, black on white
    lines: tuple[TextLine, ...]


def _decode_png(data: bytes, mode: str) -> np.ndarray:
    import io

    from PIL import Image
    return np.asarray(Image.open(io.BytesIO(data)).convert(mode))


def split_stacked(boxes: list[tuple[float, float, float, float]], text_only: np.ndarray) -> list[tuple[float, float, float, float]]:
    """Layout boxes of lines stacked with overlapping content areas (tight line heights), each cut where
    it overlaps the line above / below that shares columns with it: at the row of the overlap with the
    least text ink (the gap between the two lines' glyphs; nearest the middle on ties), so the ink search
    of a line does not reach into its neighbours' descenders or ascenders."""
    if not boxes:
        return []
    b = np.asarray(boxes, np.float64)
    top, bot = b[:, 1].copy(), b[:, 3].copy()
    cy = (b[:, 1] + b[:, 3]) / 2
    hx = (b[:, 0][:, None] < b[:, 2][None, :]) & (b[:, 0][None, :] < b[:, 2][:, None])        # share columns
    ov = hx & (cy[:, None] < cy[None, :]) & (b[:, 3][:, None] > b[:, 1][None, :])              # i above j, touching
    h, w = text_only.shape
    for i, j in zip(*np.nonzero(ov)):
        y0, y1 = max(0, int(np.floor(b[j, 1]))), min(h, int(np.ceil(b[i, 3])))
        x0, x1 = max(0, int(max(b[i, 0], b[j, 0]))), min(w, int(np.ceil(min(b[i, 2], b[j, 2]))))
        mid = (b[i, 3] + b[j, 1]) / 2
        if y1 > y0 and x1 > x0:
            ink = (text_only[y0:y1, x0:x1] < INK_LEVEL).sum(axis=1)
            rows = np.arange(y0, y1)
            cut = float(rows[np.lexsort((np.abs(rows + 0.5 - mid), ink))[0]])   # least ink, then nearest the middle
        else:
            cut = mid
        bot[i] = min(bot[i], cut)
        top[j] = max(top[j], cut + 1)
    return [(float(x0), float(t), float(x1), float(u)) for (x0, _, x1, _), t, u in zip(b, top, bot)]


def ink_box(text_only: np.ndarray, layout: tuple[float, float, float, float]) -> tuple[int, int, int, int] | None:
    """The ink of the text-only render inside a layout box (widened EDGE_SLACK_PX sideways), or None."""
    h, w = text_only.shape
    x0 = max(0, int(np.floor(layout[0])) - EDGE_SLACK_PX)
    x1 = min(w, int(np.ceil(layout[2])) + EDGE_SLACK_PX)
    y0, y1 = max(0, int(np.floor(layout[1]))), min(h, int(np.ceil(layout[3])))
    if x1 <= x0 or y1 <= y0:
        return None
    ink = text_only[y0:y1, x0:x1] < INK_LEVEL
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    if not rows.size:
        return None
    return (x0 + int(cols[0]), y0 + int(rows[0]), x0 + int(cols[-1]) + 1, y0 + int(rows[-1]) + 1)


_driver = None          # Playwright's sync driver: one per thread, shared by the Renderers open in it
_driver_users = 0


def _acquire_driver():
    global _driver, _driver_users
    if _driver is None:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            raise RenderError("the HTML document generator needs Playwright: pip install 'edgeocr[data]' "
                              "(or pip install playwright; the system Chromium is used, no browser download)") from None
        _driver = sync_playwright().start()
    _driver_users += 1
    return _driver


def _release_driver() -> None:
    global _driver, _driver_users
    _driver_users -= 1
    if _driver_users == 0 and _driver is not None:
        _driver.stop()
        _driver = None


class Renderer:
    """One headless Chromium and one tab, reused for every page (close() or use as a context manager)."""

    def __init__(self, executable: str | None = None):
        self.executable = executable or find_chromium()
        self._pw = _acquire_driver()
        try:
            self._browser = self._pw.chromium.launch(
                executable_path=self.executable, headless=True,
                args=["--no-sandbox", "--disable-gpu", "--font-render-hinting=none", "--hide-scrollbars",
                      "--disable-lcd-text", "--force-color-profile=srgb"])
        except Exception as e:
            _release_driver()
            raise RenderError(f"could not start Chromium at {self.executable}: {e}") from None
        self._page = self._browser.new_page(viewport={"width": 800, "height": 600}, device_scale_factor=1)
        # screenshots through DevTools directly: lossless PNG with fast compression, about half the time
        # of Playwright's screenshot(), which also waits for fonts and animations (done once per page here)
        self._cdp = self._page.context.new_cdp_session(self._page)
        self._toggle = TOGGLE_MASK_JS % repr(MASK_CSS)
        log.debug("htmldocs: Chromium %s at %s", self._browser.version, self.executable)

    @property
    def version(self) -> str:
        return self._browser.version

    def render(self, html: str, width: int, max_height: int, min_height: int = 0) -> Rendered:
        """Lay out `html` `width` px wide; the image is as tall as the document, clamped to
        [min_height, max_height] (text below max_height is hidden and not labelled)."""
        p = self._page
        p.set_viewport_size({"width": int(width), "height": int(max_height)})
        p.set_content(html, wait_until="load")
        full = p.evaluate("() => document.fonts.ready.then(() => Math.ceil(document.body.getBoundingClientRect().bottom))")
        height = int(min(max_height, max(min_height, full)))
        if height != max_height:
            p.set_viewport_size({"width": int(width), "height": height})
        res = p.evaluate(MEASURE_JS, [width, height, OVERLAP_TOL_PX, OVERLAP_INSET])
        if res["stray"]:
            raise RenderError(f"text outside a .t item (it would be unlabelled): {res['stray'][:3]}")
        image = _decode_png(self._screenshot(width, height), "RGB")
        p.evaluate(self._toggle, True)
        gray = _decode_png(self._screenshot(width, height), "L")
        p.evaluate(self._toggle, False)
        boxes = split_stacked([tuple(ln[2:]) for ln in res["lines"]], gray)
        lines = []
        for (idx, text, *_), box in zip(res["lines"], boxes):
            ib = ink_box(gray, box) if text else None
            if ib is not None:
                lines.append(TextLine(text, ib, int(idx)))
        return Rendered(image, gray, tuple(lines))

    def _screenshot(self, width: int, height: int) -> bytes:
        """The page's pixels.  Chromium now and then answers "Unable to capture screenshot" when no compositor
        frame is ready yet (seen on a loaded 2-core machine): wait for the next animation frame and ask again,
        up to SCREENSHOT_TRIES times; the pixels do not depend on which attempt returns them."""
        import base64

        from playwright.sync_api import Error as PlaywrightError
        clip = {"x": 0, "y": 0, "width": int(width), "height": int(height), "scale": 1}
        for attempt in range(SCREENSHOT_TRIES):
            try:
                res = self._cdp.send("Page.captureScreenshot", {"format": "png", "clip": clip,
                                                                 "optimizeForSpeed": True,
                                                                 "captureBeyondViewport": False})
                return base64.b64decode(res["data"])
            except PlaywrightError as e:
                if "Unable to capture screenshot" not in str(e) or attempt == SCREENSHOT_TRIES - 1:
                    raise
                self._page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        raise AssertionError("unreachable")

    def close(self) -> None:
        try:
            self._browser.close()
        finally:
            _release_driver()

    def __enter__(self) -> "Renderer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
