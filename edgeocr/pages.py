"""Page sources for `edgeocr run`: files, folders, globs and PDFs -> pages, each loaded when it is needed.

    files = list_files(["scans/", "inbox/*.pdf", "one.png"])   # folders sorted, globs expanded
    refs = list_pages(files)                                    # PDF pages counted up front
    with PageLoader(dpi=200) as loader:
        pixels = loader.load(refs[0])                           # HxWx3 uint8 RGB

PDF pages are rasterized with pypdfium2 (the `pdf` extra), imported only when a PDF is met.
"""

from __future__ import annotations

import glob
import io
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeocr import preprocess
from edgeocr.errors import BackendError, EdgeOCRError, ImageError, ImageTooLarge

log = logging.getLogger("edgeocr")

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")   # found in folders / globs
PDF_SUFFIX = ".pdf"
PDF_MAGIC = b"%PDF-"                 # a PDF file starts with this, whatever its name
DEFAULT_DPI = 200                    # PDF rasterization, dots per inch
POINTS_PER_INCH = 72.0               # PDF user-space unit
_GLOB_CHARS = re.compile(r"[*?\[]")


class InputPathError(EdgeOCRError, ValueError):
    """A folder or glob pattern given as input holds no image or PDF file."""


@dataclass(frozen=True)
class PageRef:
    """One page to recognize: an image file, or one page of a PDF."""

    file: str                        # the path as given, or as found in a folder / by a glob
    page: int | None                 # 1-based page of a PDF; None for an image file (or a PDF that does not open)
    error: EdgeOCRError | None = field(default=None, compare=False)   # why a PDF could not be listed page by page

    @property
    def key(self) -> tuple[str, int | None]:
        """What `--resume` matches output lines on."""
        return (self.file, self.page)

    @property
    def label(self) -> str:
        """`file` for an image, `file page N` for a PDF page (messages)."""
        return self.file if self.page is None else f"{self.file} page {self.page}"


# ---------------------------------------------------------------------------------------------- listing
def list_files(inputs: list[str]) -> list[str]:
    """Expand inputs into files, in order, each once: a folder -> its image and PDF files sorted by name
    (not recursive, hidden files skipped); a glob pattern (`*`, `?`, `[`, `**` recursive) -> its matching
    image and PDF files, sorted; anything else is taken as a file (a missing one fails as that page's error).
    Raises InputPathError for a folder or pattern that yields nothing."""
    out, seen = [], set()
    for arg in inputs:
        p = Path(arg)
        if p.is_dir():
            found = _folder_files(p)
            if not found:
                raise InputPathError(f"{arg}: folder has no image or PDF file ({', '.join(_suffixes())})")
        elif not p.exists() and _GLOB_CHARS.search(arg):
            found = _glob_files(arg)
        else:
            found = [arg]
        for f in found:
            k = os.path.normcase(os.path.abspath(f))
            if k not in seen:
                seen.add(k)
                out.append(f)
    return out


def _suffixes() -> tuple[str, ...]:
    return IMAGE_SUFFIXES + (PDF_SUFFIX,)


def _folder_files(folder: Path) -> list[str]:
    try:
        children = sorted(folder.iterdir(), key=lambda c: c.name)
    except OSError as e:
        raise InputPathError(f"{folder}: folder cannot be listed ({e.strerror or e})") from None
    return [str(c) for c in children if not c.name.startswith(".") and c.suffix.lower() in _suffixes() and c.is_file()]


def _glob_files(pattern: str) -> list[str]:
    matches = [m for m in sorted(glob.glob(pattern, recursive=True)) if os.path.isfile(m)]
    found = [m for m in matches if Path(m).suffix.lower() in _suffixes()]
    if not found:
        extra = f" (it matches {len(matches)} other files)" if matches else ""
        raise InputPathError(f"{pattern}: no image or PDF file matches this pattern{extra}")
    return found


def is_pdf(path: str) -> bool:
    """By extension, or by the `%PDF-` header for a file named otherwise."""
    if path.lower().endswith(PDF_SUFFIX):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(len(PDF_MAGIC)) == PDF_MAGIC
    except OSError:
        return False                 # missing or unreadable: loading it as an image says why


def list_pages(files: list[str]) -> list[PageRef]:
    """One PageRef per image file and per PDF page (PDFs are opened to count pages, not rendered).
    A PDF that does not open becomes a single PageRef carrying the error."""
    refs: list[PageRef] = []
    for f in files:
        if not is_pdf(f):
            refs.append(PageRef(f, None))
            continue
        try:
            n = pdf_page_count(f)
        except ImageError as e:
            refs.append(PageRef(f, None, error=e))
            continue
        if n == 0:
            refs.append(PageRef(f, None, error=ImageError(f"{f}: PDF has no pages")))
        refs.extend(PageRef(f, i) for i in range(1, n + 1))
    log.info("%d files: %d pages", len(files), len(refs))
    return refs


# ---------------------------------------------------------------------------------------------- PDFs
def _pdfium():
    try:
        import pypdfium2
    except ImportError:
        raise BackendError("PDF input needs pypdfium2: pip install 'edgeocr[pdf]'") from None
    return pypdfium2


def open_pdf(path: str):
    """pypdfium2.PdfDocument, or ImageError naming the file and what is wrong."""
    pdfium = _pdfium()
    try:
        return pdfium.PdfDocument(path)
    except FileNotFoundError:
        raise ImageError(f"{path}: no such file") from None
    except OSError as e:
        raise ImageError(f"{path}: cannot be read ({e.strerror or e})") from None
    except pdfium.PdfiumError as e:
        raise ImageError(f"{path}: not a readable PDF ({e})") from None


def pdf_page_count(path: str) -> int:
    doc = open_pdf(path)
    try:
        return len(doc)
    finally:
        doc.close()


# ---------------------------------------------------------------------------------------------- loading
class PageLoader:
    """Loads PageRefs as HxWx3 uint8 RGB arrays, one at a time; keeps the current PDF open across
    its pages.  Every failure is an EdgeOCRError whose message names the file (and page)."""

    def __init__(self, dpi: float = DEFAULT_DPI, max_pixels: int | None = None):
        if not dpi > 0:
            raise ValueError(f"dpi must be positive, got {dpi!r}")
        self.dpi = dpi                   # PDF rasterization, dots per inch
        self.max_pixels = preprocess.pixel_limit(max_pixels)   # larger images and rendered pages are refused
        self._pdf_path: str | None = None
        self._pdf = None

    def load(self, ref: PageRef) -> np.ndarray:
        if ref.error is not None:
            raise ref.error
        if ref.page is None:
            return np.asarray(preprocess.load_image(ref.file, self.max_pixels))
        return np.asarray(self._render(ref))                         # [H, W, 3] uint8

    def source(self, ref: PageRef):
        """What a preparer takes for `ref`, read no further than needed: an image file's path (the preparer
        checks its header against the preparer's own pixel limit, then decodes it, at reduced scale on the fast
        path), or a PDF page rasterized to an RGB PIL image (checked here against this loader's limit)."""
        if ref.error is not None:
            raise ref.error
        return ref.file if ref.page is None else self._render(ref)

    def load_encoded(self, ref: PageRef) -> bytes:
        """The page as an encoded image, for a daemon (`edgeocr run --remote`): an image file's own bytes, its
        header checked here as a local run checks it; a PDF page rendered here and sent as PNG."""
        if ref.error is not None:
            raise ref.error
        if ref.page is not None:
            out = io.BytesIO()
            self._render(ref).save(out, "PNG", compress_level=1)
            return out.getvalue()
        data, name = preprocess.read_bytes(ref.file)
        try:
            preprocess.open_image(data, name, self.max_pixels)
        except ImageError:
            raise
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            raise ImageError(f"{name}: unreadable image header ({e})") from None
        return data

    def _render(self, ref: PageRef):
        doc = self._document(ref.file)
        if ref.page > len(doc):
            raise ImageError(f"{ref.label}: the PDF has only {len(doc)} pages")
        page = doc[ref.page - 1]
        try:
            w_pt, h_pt = page.get_size()
            scale = self.dpi / POINTS_PER_INCH
            w, h = round(w_pt * scale), round(h_pt * scale)
            try:
                preprocess.check_size(w, h, f"{ref.label} at {self.dpi:g} dpi", self.max_pixels)
            except ImageTooLarge as e:
                raise ImageTooLarge(f"{e}; or lower --dpi") from None
            try:
                bitmap = page.render(scale=scale)
            except _pdfium().PdfiumError as e:
                raise ImageError(f"{ref.label}: cannot be rendered ({e})") from None
            img = bitmap.to_pil().convert("RGB")
        finally:
            page.close()
        return img                                                 # PIL RGB

    def _document(self, path: str):
        if self._pdf_path != path:
            self.close()
            self._pdf = open_pdf(path)
            self._pdf_path = path
        return self._pdf

    def close(self) -> None:
        if self._pdf is not None:
            self._pdf.close()
        self._pdf, self._pdf_path = None, None

    def __enter__(self) -> PageLoader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
