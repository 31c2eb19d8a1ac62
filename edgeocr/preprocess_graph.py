"""The letterbox resize and the normalization as a small ONNX graph, so they run on the GPU beside the model.

    image   uint8 [H, W, 3]   the decoded RGB image, as it comes from the decoder (uploaded: 3 bytes a pixel)
    resize  int64 [4]         (1, 3, new_h, new_w): the letterbox size (preprocess.letterbox_geometry)
    pads    int64 [8]         (0, 0, 0, 0, 0, 0, S - new_h, S - new_w): the canvas left after it
    ->
    pixels  float32 [1, 3, S, S]   what the vision graph takes, left on the device

Resize is ONNX Resize-18 in Pillow's bicubic: a = -0.5, antialiased when shrinking (the kernel widened by the
scale), weights renormalized at the image borders (exclude_outside), pixel centres at +0.5.  On uint8 input
ONNX Runtime computes it as Pillow does (fixed-point weights, the horizontal pass rounded to uint8 before
the vertical one); measured against Pillow on CPU: identical on most pages, otherwise <= 1 level at < 0.1 %
of the values (docs/perf.md).  The padding is the level `pad_value`, then every level goes through the same
float32 lookup table as preprocess.normalize, so the normalization itself is bit-identical.

Building the graph needs the `onnx` package (the toolchain); running it needs only ONNX Runtime.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from edgeocr import preprocess
from edgeocr.errors import BackendError, ImageError
from edgeocr.preprocess import Letterbox

log = logging.getLogger("edgeocr")

OPSET = 18                      # Resize's antialias attribute
OUTPUT = "pixels"


def lookup_table(mean=preprocess.MEAN, std=preprocess.STD) -> np.ndarray:
    """[3 * 256] float32: channel c's normalized value of level v at c * 256 + v (preprocess._LUT's values)."""
    v = np.arange(256, dtype=np.float32) * np.float32(1 / 255)
    return np.concatenate([(v - np.float32(m)) / np.float32(s) for m, s in zip(mean, std)]).astype(np.float32)


def build(canvas: int = preprocess.CANVAS, pad_value: int = preprocess.PAD_VALUE, mean=preprocess.MEAN,
          std=preprocess.STD):
    """The graph as an onnx ModelProto (needs the onnx package)."""
    try:
        import onnx
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        raise BackendError("building the preprocessing graph needs onnx: pip install 'edgeocr[export]'") from None
    if not 0 <= pad_value <= 255:
        raise ValueError(f"pad_value must be a uint8 level, not {pad_value}")
    inits = [numpy_helper.from_array(np.array([0], np.int64), "batch_axis"),
             numpy_helper.from_array(np.array(pad_value, np.float32), "pad_value"),
             numpy_helper.from_array(np.arange(3, dtype=np.int32).reshape(1, 3, 1, 1) * 256, "channel_offset"),
             numpy_helper.from_array(lookup_table(mean, std), "lut")]
    # the padding runs on float levels: ONNX Runtime's CUDA Pad has no uint8 kernel (it would fall back to the CPU)
    nodes = [
        helper.make_node("Transpose", ["image"], ["chw"], perm=[2, 0, 1]),                   # [3, H, W] uint8
        helper.make_node("Unsqueeze", ["chw", "batch_axis"], ["nchw"]),                      # [1, 3, H, W]
        helper.make_node("Resize", ["nchw", "", "", "resize"], ["resized"], mode="cubic", cubic_coeff_a=-0.5,
                         antialias=1, exclude_outside=1, coordinate_transformation_mode="half_pixel"),
        helper.make_node("Cast", ["resized"], ["resized_f"], to=TensorProto.FLOAT),           # [1, 3, h, w] levels
        helper.make_node("Pad", ["resized_f", "pads", "pad_value"], ["canvas"], mode="constant"),  # [1, 3, S, S]
        helper.make_node("Cast", ["canvas"], ["levels"], to=TensorProto.INT32),
        helper.make_node("Add", ["levels", "channel_offset"], ["lut_index"]),
        helper.make_node("Gather", ["lut", "lut_index"], [OUTPUT], axis=0),                   # [1, 3, S, S] f32
    ]
    graph = helper.make_graph(
        nodes, "edgeocr_letterbox",
        [helper.make_tensor_value_info("image", TensorProto.UINT8, ["height", "width", 3]),
         helper.make_tensor_value_info("resize", TensorProto.INT64, [4]),
         helper.make_tensor_value_info("pads", TensorProto.INT64, [8])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, [1, 3, canvas, canvas])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="edgeocr")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def save(path: Path, canvas: int = preprocess.CANVAS, pad_value: int = preprocess.PAD_VALUE, mean=preprocess.MEAN,
         std=preprocess.STD) -> Path:
    """Write the graph (a few KB) to `path`, e.g. into an artifact beside vision.onnx."""
    import onnx

    path = Path(path)
    onnx.save_model(build(canvas, pad_value, mean, std), str(path))
    return path


def graph_inputs(lb: Letterbox, canvas: int = preprocess.CANVAS) -> tuple[np.ndarray, np.ndarray]:
    """(resize [4], pads [8]) int64 for an image placed on the canvas as `lb` says."""
    resize = np.array([1, 3, lb.new_h, lb.new_w], np.int64)
    pads = np.array([0, 0, 0, 0, 0, 0, canvas - lb.new_h, canvas - lb.new_w], np.int64)
    return resize, pads


class DevicePreprocessor:
    """Runs the graph on ONNX Runtime; on CUDA the pixels stay on the device, in one buffer allocated at load.

    >>> pre = DevicePreprocessor(device="cuda")
    >>> img = preprocess.load_image("page.jpg")                         # host: decode only
    >>> pixels, lb = pre(np.asarray(img))                                # OrtValue [1, 3, S, S] float32 on the GPU
    """

    def __init__(self, graph: Path | bytes | None = None, device: str = "cuda", canvas: int = preprocess.CANVAS,
                 pad_value: int = preprocess.PAD_VALUE, device_id: int = 0, mean=preprocess.MEAN,
                 std=preprocess.STD):
        """canvas, pad_value, mean, std: the artifact's (edgeocr.artifact.ImageSpec); a given `graph` has its own."""
        try:
            import onnxruntime as ort
        except ImportError:
            raise BackendError("ONNX Runtime is not installed: pip install 'edgeocr[cpu]' (or 'edgeocr[cuda]')") \
                from None
        if graph is None:
            graph = build(canvas, pad_value, mean, std).SerializeToString()
        elif isinstance(graph, (str, Path)):
            graph = Path(graph).read_bytes()
        if device == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise BackendError("CUDAExecutionProvider is not available in this onnxruntime; "
                                   "pip install 'edgeocr[cuda]'")
            providers = [("CUDAExecutionProvider", {"device_id": device_id}), "CPUExecutionProvider"]
        elif device == "cpu":
            providers = ["CPUExecutionProvider"]
        else:
            raise BackendError(f"unknown device {device!r}; use 'cpu' or 'cuda'")
        so = ort.SessionOptions()
        so.log_severity_level = 3
        self.session = ort.InferenceSession(graph, so, providers=providers)
        self.device, self.canvas = device, canvas
        self.binding = self.session.io_binding()
        where = ("cuda", device_id) if device == "cuda" else ("cpu", 0)
        # pixels: [1, 3, S, S] float32, allocated once, rewritten by every call
        self.pixels = ort.OrtValue.ortvalue_from_shape_and_type((1, 3, canvas, canvas), np.float32, *where)
        self.binding.bind_ortvalue_output(OUTPUT, self.pixels)

    def __call__(self, rgb: np.ndarray, size: tuple[int, int] | None = None):
        """uint8 [H, W, 3] -> (pixels OrtValue [1, 3, S, S] float32 on the session's device, Letterbox).
        `size`: the source's original (width, height) when `rgb` was decoded at reduced scale."""
        if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
            raise ImageError(f"the preprocessing graph takes a uint8 HxWx3 RGB array, not "
                             f"{getattr(rgb, 'dtype', type(rgb).__name__)} {getattr(rgb, 'shape', '')}")
        lb = preprocess.letterbox_geometry(*(size or (rgb.shape[1], rgb.shape[0])), self.canvas)
        resize, pads = graph_inputs(lb, self.canvas)
        b = self.binding
        b.bind_cpu_input("image", np.ascontiguousarray(rgb))
        b.bind_cpu_input("resize", resize)
        b.bind_cpu_input("pads", pads)
        self.session.run_with_iobinding(b)
        return self.pixels, lb
