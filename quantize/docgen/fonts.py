"""Fonts from Debian packages (fonts-noto-cjk, fonts-wqy-microhei, fonts-arphic-uming,
fonts-liberation2, fonts-dejavu-core).  The generator reports which it found and which it lacks."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from edgeocr.errors import EdgeOCRError

FONT_DIRS = ("/usr/share/fonts", "/usr/local/share/fonts", os.path.expanduser("~/.fonts"))
FONT_DIR_ENV = "EDGEOCR_FONT_DIR"   # extra flat directory of font files (e.g. carried to a machine without apt)


def face_file(rel: str, index: int) -> str:
    """Name of a single-face file for (collection file, face index) in a flat font folder (see subset_fonts)."""
    stem, _ = os.path.splitext(os.path.basename(rel))
    return f"{stem}.face{index}.otf"


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
        if path is None and extra and os.path.exists(os.path.join(extra, face_file(rel, idx))):
            path, idx = os.path.join(extra, face_file(rel, idx)), 0
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


# FreeType's auto-hinter (used for fonts without hinting bytecode, e.g. AR PL UMing) sets its CJK blue
# zones from these characters (afblue.dat CJK top/bottom, standard characters 田囗): a subset without
# them renders differently.
_AUTOHINT_CJK = ("他们你來們到和地对對就席我时時會来為能舰說说这這齊军同已愿既星是景民照现現理用置要軍那配里開雷露面顾"
                 "个为人他以们你來個們到和大对對就我时時有来為要說说主些因它想意理生當看着置者自著裡过还进進過道還里面田囗")


def generator_charset() -> str:
    """Every character the generator can draw (its sources' string literals, printable ASCII) plus the
    characters FreeType's auto-hinter measures."""
    here = os.path.dirname(os.path.abspath(__file__))
    chars = {chr(c) for c in range(32, 127)} | set(_AUTOHINT_CJK)
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), encoding="utf-8") as f:
                chars |= set(f.read())
    return "".join(sorted(c for c in chars if c.isprintable()))


def _renders_same(a: FontFace, b_path: str, text: str) -> bool:
    from PIL import Image, ImageDraw, ImageFont
    lines = [text[i:i + 40] for i in range(0, len(text), 40)]
    for size in (11, 14, 16, 18, 22, 28, 36):
        fa = ImageFont.truetype(a.path, size, index=a.index)
        fb = ImageFont.truetype(b_path, size, index=0)
        for line in lines:
            ims = []
            for f in (fa, fb):
                im = Image.new("L", (size * 44, size * 2), 255)
                ImageDraw.Draw(im).text((4, 4), line, font=f, fill=0)
                ims.append(im.tobytes())
            if ims[0] != ims[1]:
                return False
    return True


def subset_fonts(out_dir: str, fs: FontSet | None = None) -> list[tuple[str, int, bool]]:
    """Write each found face, cut down to generator_charset(), as one file in `out_dir` (flat).

    For machines without apt (point EDGEOCR_FONT_DIR at `out_dir` there): the CJK collections are
    20-27 MB each, their subsets a few hundred KB.  Every subset is checked by rendering the whole
    charset at several sizes against the original; a face whose subset renders differently (FreeType's
    auto-hinter measures the whole font for faces without hinting bytecode) is copied whole instead.
    Needs fontTools.  Returns (file, bytes, subsetted) per face.
    """
    import shutil

    from fontTools import subset
    from fontTools.ttLib import TTFont

    fs = fs or discover()
    os.makedirs(out_dir, exist_ok=True)
    text = generator_charset()
    rel_of = {name: rel for name, rel, *_ in CATALOG}
    idx_of = {name: idx for name, _, idx, *_ in CATALOG}
    written = []
    for face in fs.faces:
        font = TTFont(face.path, fontNumber=face.index, lazy=False)
        opts = subset.Options()
        opts.layout_features = ["*"]
        opts.name_IDs = ["*"]
        opts.notdef_outline = True
        opts.glyph_names = False
        # keep embedded bitmap strikes (AR PL UMing has them): FreeType draws those at small sizes
        opts.drop_tables = [t for t in opts.drop_tables if t not in ("EBDT", "EBLC", "EBSC")]
        sub = subset.Subsetter(opts)
        sub.populate(text=text)
        sub.subset(font)
        dst = os.path.join(out_dir, face_file(rel_of[face.name], idx_of[face.name]))
        font.save(dst)
        if _renders_same(face, dst, text):
            written.append((os.path.basename(dst), os.path.getsize(dst), True))
            continue
        os.remove(dst)
        whole = os.path.join(out_dir, os.path.basename(face.path))
        if not os.path.exists(whole):
            shutil.copyfile(face.path, whole)
        written.append((os.path.basename(whole), os.path.getsize(whole), False))
    return written
