"""edgeocr: HunyuanOCR on small GPUs, without torch at run time.

    from edgeocr import OCRModel
    model = OCRModel("artifacts/tiny")
    print(model.recognize("page.png", task="spotting").text)

Importing this package loads no heavy dependency; backends are imported when a model is opened.
"""

from edgeocr.decode import DecodeOptions, FinishReason
from edgeocr.errors import ArtifactError, BackendError, EdgeOCRError, ImageError, PromptError

__version__ = "0.1.0"

__all__ = ["OCRModel", "OCRResult", "DecodeOptions", "FinishReason", "EdgeOCRError", "ImageError", "ArtifactError",
           "PromptError", "BackendError", "__version__"]


def __getattr__(name):
    if name in ("OCRModel", "OCRResult"):
        from edgeocr import model
        return getattr(model, name)
    raise AttributeError(f"module 'edgeocr' has no attribute {name!r}")
