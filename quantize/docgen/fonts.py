"""Fonts from Debian packages (fonts-noto-cjk, fonts-wqy-microhei, fonts-arphic-uming,
fonts-liberation2, fonts-dejavu-core).  The generator reports which it found and which it lacks."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from edgeocr.errors import EdgeOCRError

FONT_DIRS = ("/usr/share/fonts", "/usr/local/share/fonts", os.path.expanduser("~/.fonts"))
FONT_DIR_ENV = "EDGEOCR_FONT_DIR"   # extra flat directory of font files (e.g. carried to a machine without apt)


@dataclass(frozen=True)
class FontFace:
    name: str        # human name
    path: str        # file
    index: int       # face index in a .ttc
    cjk: bool        # covers Chinese
    style: str       # "sans", "serif", "mono", "hand"
    bold: bool = False


# (name, relative path under a font dir, ttc index, cjk, style, bold, Debian package)
CATALOG = (
    ("Noto Sans CJK SC", "opentype/noto/NotoSansCJK-Regular.ttc", 2, True, "sans", False, "fonts-noto-cjk"),
    ("Noto Sans CJK SC Bold", "opentype/noto/NotoSansCJK-Bold.ttc", 2, True, "sans", True, "fonts-noto-cjk"),
    ("Noto Serif CJK SC", "opentype/noto/NotoSerifCJK-Regular.ttc", 2, True, "serif", False, "fonts-noto-cjk"),
    ("Noto Serif CJK SC Bold", "opentype/noto/NotoSerifCJK-Bold.ttc", 2, True, "serif", True, "fonts-noto-cjk"),
    ("Noto Sans Mono CJK SC", "opentype/noto/NotoSansCJK-Regular.ttc", 7, True, "mono", False, "fonts-noto-cjk"),
    ("WenQuanYi Micro Hei", "truetype/wqy/wqy-microhei.ttc", 0, True, "sans", False, "fonts-wqy-microhei"),
    ("AR PL UMing CN", "truetype/arphic/uming.ttc", 0, True, "serif", False, "fonts-arphic-uming"),
    ("Liberation Sans", "truetype/liberation2/LiberationSans-Regular.ttf", 0, False, "sans", False, "fonts-liberation2"),
    ("Liberation Sans Bold", "truetype/liberation2/LiberationSans-Bold.ttf", 0, False, "sans", True, "fonts-liberation2"),
    ("Liberation Serif", "truetype/liberation2/LiberationSerif-Regular.ttf", 0, False, "serif", False, "fonts-liberation2"),
    ("Liberation Serif Bold", "truetype/liberation2/LiberationSerif-Bold.ttf", 0, False, "serif", True, "fonts-liberation2"),
    ("Liberation Mono", "truetype/liberation2/LiberationMono-Regular.ttf", 0, False, "mono", False, "fonts-liberation2"),
    ("DejaVu Sans", "truetype/dejavu/DejaVuSans.ttf", 0, False, "sans", False, "fonts-dejavu-core"),
    ("DejaVu Sans Bold", "truetype/dejavu/DejaVuSans-Bold.ttf", 0, False, "sans", True, "fonts-dejavu-core"),
    ("DejaVu Sans Mono", "truetype/dejavu/DejaVuSansMono.ttf", 0, False, "mono", False, "fonts-dejavu-core"),
)


class FontsMissing(EdgeOCRError):
    pass


@dataclass(frozen=True)
class FontSet:
    faces: tuple[FontFace, ...]
    missing: tuple[str, ...]          # "name (package)" not found

    def pick(self, rng, cjk: bool, style: str | None = None, bold: bool = False) -> FontFace:
        pool = [f for f in self.faces if (f.cjk or not cjk) and f.bold == bold and (style is None or f.style == style)]
        if not pool:
            pool = [f for f in self.faces if (f.cjk or not cjk) and (style is None or f.style == style)]
        if not pool:
            pool = [f for f in self.faces if f.cjk or not cjk]
        return pool[int(rng.integers(len(pool)))]

    def report(self) -> str:
        found = ", ".join(f.name for f in self.faces)
        miss = ", ".join(self.missing) or "none"
        return f"fonts found: {found}\nfonts missing: {miss}"


@functools.lru_cache(maxsize=1)
def discover() -> FontSet:
    faces, missing = [], []
    extra = os.environ.get(FONT_DIR_ENV)
    for name, rel, idx, cjk, style, bold, pkg in CATALOG:
        path = next((os.path.join(d, rel) for d in FONT_DIRS if os.path.exists(os.path.join(d, rel))), None)
        if path is None and extra and os.path.exists(os.path.join(extra, os.path.basename(rel))):
            path = os.path.join(extra, os.path.basename(rel))
        if path:
            faces.append(FontFace(name, path, idx, cjk, style, bold))
        else:
            missing.append(f"{name} ({pkg})")
    fs = FontSet(tuple(faces), tuple(missing))
    if not any(f.cjk for f in faces) or not faces:
        raise FontsMissing("no CJK font found; install fonts-noto-cjk or fonts-wqy-microhei "
                           "(apt-get install fonts-noto-cjk fonts-liberation2)\n" + fs.report())
    return fs


@functools.lru_cache(maxsize=512)
def truetype(face: FontFace, size: int):
    from PIL import ImageFont
    return ImageFont.truetype(face.path, size, index=face.index)
