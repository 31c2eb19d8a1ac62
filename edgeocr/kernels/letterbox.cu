// The letterbox on the GPU, bit for bit what Pillow computes (edgeocr.letterbox_cuda has the numpy twin):
// Image.resize(..., BICUBIC) on 8-bit RGB is ImagingResample, two passes (one along rows, one along columns, in
// the order Pillow picks), each with fixed-point weights of 22 fraction bits computed on the host as Pillow's
// precompute_coeffs and normalize_coeffs_8bpc do, a rounding half added, and the sum clipped to 0..255 after a
// shift.  The second pass also pads the canvas with the pad level and normalizes through the same float32 lookup
// table as edgeocr.preprocess.normalize, writing the vision graph's input [1, 3, S, S] float32.

#define LB_PRECISION_BITS 22

__device__ __forceinline__ int lb_clip8(int v) {
    v >>= LB_PRECISION_BITS;                     // arithmetic shift, as Pillow's clip8
    return v < 0 ? 0 : (v > 255 ? 255 : v);
}

// Output pixel (x, y) of a pass over src ([rows, cols, 3] uint8, rows `pitch` bytes apart): along the row
// (horizontal: taps at columns first.., bounds and weights indexed by x) or along the column (vertical: taps
// at rows first.., indexed by y).  bounds: [n_out, 2] (first source pixel, tap count); kk: [n_out, ksize].
__device__ __forceinline__ void lb_pass(const unsigned char* __restrict__ src, int pitch, int horizontal, int x,
                                        int y, const int* __restrict__ bounds, const int* __restrict__ kk,
                                        int ksize, int& l0, int& l1, int& l2) {
    int o = horizontal ? x : y;
    int first = bounds[2 * o], n = bounds[2 * o + 1];
    const int* k = kk + (size_t)o * ksize;
    const unsigned char* p = horizontal ? src + (size_t)y * pitch + (size_t)first * 3
                                        : src + (size_t)first * pitch + (size_t)x * 3;
    size_t step = horizontal ? 3 : (size_t)pitch;
    int s0 = 1 << (LB_PRECISION_BITS - 1), s1 = s0, s2 = s0;
    for (int i = 0; i < n; ++i, p += step) {
        int w = k[i];
        s0 += p[0] * w;
        s1 += p[1] * w;
        s2 += p[2] * w;
    }
    l0 = lb_clip8(s0);
    l1 = lb_clip8(s1);
    l2 = lb_clip8(s2);
}

// The first pass: dst [out_h, out_w, 3] uint8.
extern "C" __global__ void letterbox_pass(const unsigned char* __restrict__ src, int pitch, int horizontal,
                                          unsigned char* __restrict__ dst, int out_w, int out_h,
                                          const int* __restrict__ bounds, const int* __restrict__ kk, int ksize) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= out_w) return;
    for (int y = blockIdx.y; y < out_h; y += gridDim.y) {     // rows beyond gridDim.y's limit loop
        int l0, l1, l2;
        lb_pass(src, pitch, horizontal, x, y, bounds, kk, ksize, l0, l1, l2);
        unsigned char* o = dst + ((size_t)y * out_w + x) * 3;
        o[0] = (unsigned char)l0;
        o[1] = (unsigned char)l1;
        o[2] = (unsigned char)l2;
    }
}

// The second pass onto the canvas: the image's (out_w x out_h) top-left corner, the pad level elsewhere, every
// level normalized through lut ([3 * 256] float32: channel c's value of level v at c * 256 + v) into
// out [3, canvas, canvas] float32.
extern "C" __global__ void letterbox_canvas(const unsigned char* __restrict__ src, int pitch, int horizontal,
                                            int out_w, int out_h, const int* __restrict__ bounds,
                                            const int* __restrict__ kk, int ksize, const float* __restrict__ lut,
                                            int pad_level, int canvas, float* __restrict__ out) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y;
    if (x >= canvas || y >= canvas) return;
    int l0 = pad_level, l1 = pad_level, l2 = pad_level;
    if (x < out_w && y < out_h) lb_pass(src, pitch, horizontal, x, y, bounds, kk, ksize, l0, l1, l2);
    size_t plane = (size_t)canvas * canvas, at = (size_t)y * canvas + x;
    out[at] = lut[l0];
    out[plane + at] = lut[256 + l1];
    out[2 * plane + at] = lut[512 + l2];
}
