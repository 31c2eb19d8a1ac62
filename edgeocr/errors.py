"""Errors edgeocr raises on bad input.  Each message names what is wrong."""


class EdgeOCRError(Exception):
    """Base class of every error edgeocr raises on purpose."""


class ImageError(EdgeOCRError, ValueError):
    """The image could not be read, is empty or truncated, or has an unusable shape."""


class ImageTooLarge(ImageError):
    """The image's declared size exceeds the pixel limit (checked before decoding)."""


class ArtifactError(EdgeOCRError):
    """The artifact directory is missing, incomplete, or of another format version."""


class PromptError(EdgeOCRError, ValueError):
    """Unknown task, bad custom prompt, or a prompt that does not fit the KV cache."""


class CheckpointError(EdgeOCRError):
    """The directory is not a usable HunyuanVL checkpoint (missing or mis-shaped tensor, bad config)."""


class BackendError(EdgeOCRError):
    """The requested backend or execution provider is not available."""


class PageTooSmall(ImageError):
    """The page is narrower or shorter than the minimum page edge (edgeocr.preprocess.MIN_EDGE)."""
