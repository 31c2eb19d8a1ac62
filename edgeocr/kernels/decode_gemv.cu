// FP16 matrix-vector kernels for a decode step of a few slots (M <= 8 rows of activations), compiled at run
// time by NVRTC (edgeocr.backends.native_step; scripts/gpu_decode_kernels.py) for sm_87 Orin, sm_89 RTX 4090D
// and sm_90 H200 alike (no CUDA headers: half.cuh).
//
//   gemv_m{M}_ks{KS}(x, w, y, n, k)         y[m, r] = sum_j x[m, j] * w[r, j]; a warp per row
//   gemv2_m{M}_ks{KS}(x, w, y, n, k)        the same, a warp per two rows (each activation vector read once
//                                           for both)
//   gemvf_m{M}_ks{KS}(x, w, y, n, k)        gemv with y in fp32, rounded through fp16 first (an fp16 Gemm
//                                           followed by a Cast, as the decoder graph's logits)
//   swiglu_m{M}_ks{KS}(x, w, y, n, k, gate_mul, up_off)
//                                           g, u = the rows r * gate_mul and r * gate_mul + up_off of w applied
//                                           to x[m]; y[m, r] = silu(g) * u, rounded as ONNX Runtime's
//                                           MatMul -> QuickGelu -> Mul chain rounds (fp16 between ops).
//                                           (2, 1): gate and up rows interleaved; (1, n): gate rows, then up rows
//
//   gemv_q8 / gemvf_q8 / swiglu_q8 (x, w, scales, y, n, k[, gate_mul, up_off])
//                                           the same with 8-bit weights: w [rows, k] uint8 row-major, each run of
//                                           32 along k one block with an fp16 scale (scales [rows, k / 32]); a
//                                           weight is (q - 128) * scale: ONNX Runtime's MatMulNBits layout (bits
//                                           8, block 32, default zero point), so one copy serves both; k % 32 == 0
//
//   x: [M, k] fp16, row-major        the activations (one row per slot)
//   w: [n, k] fp16 (gemv), [2n, k] fp16 (swiglu), row-major: each output's weights are contiguous, so a warp
//      reads them in 16-byte vectors
//   y: [M, n] fp16 (fp32 for gemvf), row-major
//   k: a multiple of 8 (a lane reads 8 halves at a time); n: any
// With SLOTS defined (the runtime: -DSLOTS=N) only M = SLOTS is instantiated; otherwise M = 1, 2, 4 and 8.
//
// A block is 8 warps.  KS warps share one output row, each summing a strided share of its k (KS = 1 for tall
// matrices, up to 8 when n is too small to fill the GPU otherwise); accumulation is fp32 throughout.

#include "half.cuh"

__device__ __forceinline__ float round_h(float f) { return h2f(f2h(f)); }

__device__ __forceinline__ void unpack8(uint4 v, float* f) {
  const u32 p[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = h2f((half_t)(p[i] & 0xffffu));
    f[2 * i + 1] = h2f((half_t)(p[i] >> 16));
  }
}

// acc[r][m] += the 8 products of weight vector w[r] and activation vector xf[m]
template <int M, int R>
__device__ __forceinline__ void fma_rows(const uint4* w, const float (*xf)[8], float (*acc)[M]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float wf[8];
    unpack8(w[r], wf);
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[r][m] = fmaf(wf[j], xf[m][j], acc[r][m]);
  }
}

template <int M>
__device__ __forceinline__ void load_x(const uint4* __restrict__ x, int v, int kv, float (*xf)[8]) {
#pragma unroll
  for (int m = 0; m < M; ++m) unpack8(__ldg(x + (size_t)m * kv + v), xf[m]);
}

// Sum of R weight rows (rows[0..R)) against every x row, over this warp's share of k.  4 vectors of each row
// are loaded before any arithmetic, so a warp keeps 4 * R * 512 bytes of weights in flight; each activation
// vector is read once per position and used by all R rows (with M = 8 slots, reading it once per row would
// move more bytes through L1 than the weights themselves).
template <int M, int KS, int R>
__device__ __forceinline__ void dot_rows(const uint4* __restrict__ x, const uint4* const* rows, int kv, int part,
                                         int lane, float (*acc)[M]) {
  const int stride = 32 * KS;
  int v = part * 32 + lane;
  float xf[M][8];
  for (; v + 3 * stride < kv; v += 4 * stride) {
    uint4 wv[4][R];
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) wv[u][r] = __ldg(rows[r] + v + u * stride);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      load_x<M>(x, v + u * stride, kv, xf);
      fma_rows<M, R>(wv[u], xf, acc);
    }
  }
  for (; v < kv; v += stride) {
    uint4 wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wv[r] = __ldg(rows[r] + v);
    load_x<M>(x, v, kv, xf);
    fma_rows<M, R>(wv, xf, acc);
  }
}

// Warp sums, then the KS partial sums of one output row through shared memory; every thread reaches the
// barrier.  Returns true in the one thread that holds row `row`'s totals.
template <int M, int KS, int R>
__device__ __forceinline__ bool reduce_rows(float (*acc)[M], int warp, int lane) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], off);
  if (KS == 1) return lane == 0;
  __shared__ float part_sums[8][R][M];
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m) part_sums[warp][r][m] = acc[r][m];
  __syncthreads();
  if (lane != 0 || warp % KS != 0) return false;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float s = 0.f;
#pragma unroll
      for (int p = 0; p < KS; ++p) s += part_sums[warp + p][r][m];
      acc[r][m] = s;
    }
  return true;
}

__device__ __forceinline__ void store_out(half_t* y, size_t i, float v) { y[i] = f2h(v); }
__device__ __forceinline__ void store_out(float* y, size_t i, float v) { y[i] = h2f(f2h(v)); }

template <int M, int KS, int R, typename OutT>
__device__ __forceinline__ void gemv_body(const half_t* __restrict__ x, const half_t* __restrict__ w,
                                          OutT* __restrict__ y, int n, int k) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * (8 / KS) + warp / KS) * R;         // this warp's R consecutive rows
  const int kv = k >> 3;                                            // 16-byte vectors per row
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
  if (row0 < n) {
    const uint4* rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r)                                     // a row past n reads row n - 1 (not stored)
      rows[r] = reinterpret_cast<const uint4*>(w) + (size_t)min(row0 + r, n - 1) * kv;
    dot_rows<M, KS, R>(reinterpret_cast<const uint4*>(x), rows, kv, warp % KS, lane, acc);
  }
  if (reduce_rows<M, KS, R>(acc, warp, lane))
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (row0 + r < n)
#pragma unroll
        for (int m = 0; m < M; ++m) store_out(y, (size_t)m * n + row0 + r, acc[r][m]);
}

template <int M, int KS>
__device__ __forceinline__ void swiglu_body(const half_t* __restrict__ x, const half_t* __restrict__ w,
                                            half_t* __restrict__ y, int n, int k, int gate_mul, int up_off) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.x * (8 / KS) + warp / KS;
  const int kv = k >> 3;
  float acc[2][M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[0][m] = acc[1][m] = 0.f;
  if (row < n) {
    const uint4* base = reinterpret_cast<const uint4*>(w) + (size_t)row * gate_mul * kv;
    const uint4* rows[2] = {base, base + (size_t)up_off * kv};
    dot_rows<M, KS, 2>(reinterpret_cast<const uint4*>(x), rows, kv, warp % KS, lane, acc);
  }
  if (reduce_rows<M, KS, 2>(acc, warp, lane) && row < n)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float g = round_h(acc[0][m]), u = round_h(acc[1][m]);     // the two MatMuls' fp16 outputs
      const float act = round_h(g / (1.f + expf(-g)));                // QuickGelu (alpha 1) = SiLU, fp16 out
      y[(size_t)m * n + row] = f2h(act * u);                          // Mul
    }
}

__device__ __forceinline__ void unpack16_q8(uint4 v, float* f) {
  const u32 p[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int b = 0; b < 4; ++b) f[4 * i + b] = (float)((int)((p[i] >> (8 * b)) & 0xffu) - 128);
}

// 8-bit weights: R rows (rows[r], their block scales srows[r]) against every x row, over this warp's share of k;
// a lane takes 16 weights (one 16-byte load, half a block) and the 16 activations beside them
template <int M, int KS, int R>
__device__ __forceinline__ void dot_rows_q8(const uint4* __restrict__ x, const uint4* const* rows,
                                            const half_t* const* srows, int kv, int part, int lane,
                                            float (*acc)[M]) {
  const int kx = kv * 2;                                            // x: 8 halves a vector, two per weight vector
  for (int v = part * 32 + lane; v < kv; v += 32 * KS) {
    uint4 wv[R];
    float sc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      wv[r] = __ldg(rows[r] + v);
      sc[r] = h2f(srows[r][v >> 1]);
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xf[16];
      unpack8(__ldg(x + (size_t)m * kx + 2 * v), xf);
      unpack8(__ldg(x + (size_t)m * kx + 2 * v + 1), xf + 8);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float wf[16];
        unpack16_q8(wv[r], wf);
        float d = 0.f;
#pragma unroll
        for (int j = 0; j < 16; ++j) d = fmaf(wf[j], xf[j], d);
        acc[r][m] = fmaf(sc[r], d, acc[r][m]);
      }
    }
  }
}

template <int M, int KS, typename OutT>
__device__ __forceinline__ void gemv_q8_body(const half_t* __restrict__ x, const unsigned char* __restrict__ w,
                                             const half_t* __restrict__ scales, OutT* __restrict__ y, int n, int k) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.x * (8 / KS) + warp / KS;
  const int kv = k >> 4;                                            // 16-byte weight vectors per row
  float acc[1][M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[0][m] = 0.f;
  if (row < n) {
    const uint4* rows[1] = {reinterpret_cast<const uint4*>(w + (size_t)row * k)};
    const half_t* srows[1] = {scales + (size_t)row * (k >> 5)};
    dot_rows_q8<M, KS, 1>(reinterpret_cast<const uint4*>(x), rows, srows, kv, warp % KS, lane, acc);
  }
  if (reduce_rows<M, KS, 1>(acc, warp, lane) && row < n)
#pragma unroll
    for (int m = 0; m < M; ++m) store_out(y, (size_t)m * n + row, acc[0][m]);
}

template <int M, int KS>
__device__ __forceinline__ void swiglu_q8_body(const half_t* __restrict__ x, const unsigned char* __restrict__ w,
                                               const half_t* __restrict__ scales, half_t* __restrict__ y, int n,
                                               int k, int gate_mul, int up_off) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.x * (8 / KS) + warp / KS;
  const int kv = k >> 4;
  float acc[2][M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[0][m] = acc[1][m] = 0.f;
  if (row < n) {
    const size_t g = (size_t)row * gate_mul, u = g + up_off;
    const uint4* rows[2] = {reinterpret_cast<const uint4*>(w + g * k), reinterpret_cast<const uint4*>(w + u * k)};
    const half_t* srows[2] = {scales + g * (k >> 5), scales + u * (k >> 5)};
    dot_rows_q8<M, KS, 2>(reinterpret_cast<const uint4*>(x), rows, srows, kv, warp % KS, lane, acc);
  }
  if (reduce_rows<M, KS, 2>(acc, warp, lane) && row < n)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float gg = round_h(acc[0][m]), uu = round_h(acc[1][m]);
      const float act = round_h(gg / (1.f + expf(-gg)));
      y[(size_t)m * n + row] = f2h(act * uu);
    }
}

#define EDGEOCR_KERNELS(MM, KS)                                                                             \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      gemv_m##MM##_ks##KS(const half_t* x, const half_t* w, half_t* y, int n, int k) {                        \
    STEP_ENTRY(); gemv_body<MM, KS, 1>(x, w, y, n, k);                                                        \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      gemv2_m##MM##_ks##KS(const half_t* x, const half_t* w, half_t* y, int n, int k) {                       \
    STEP_ENTRY(); gemv_body<MM, KS, 2>(x, w, y, n, k);                                                        \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      gemvf_m##MM##_ks##KS(const half_t* x, const half_t* w, float* y, int n, int k) {                        \
    STEP_ENTRY(); gemv_body<MM, KS, 1>(x, w, y, n, k);                                                        \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      swiglu_m##MM##_ks##KS(const half_t* x, const half_t* w, half_t* y, int n, int k, int gate_mul,          \
                            int up_off) {                                                                    \
    STEP_ENTRY(); swiglu_body<MM, KS>(x, w, y, n, k, gate_mul, up_off);                                      \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      gemv_q8_m##MM##_ks##KS(const half_t* x, const unsigned char* w, const half_t* s, half_t* y, int n,      \
                             int k) {                                                                        \
    STEP_ENTRY(); gemv_q8_body<MM, KS>(x, w, s, y, n, k);                                                    \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      gemvf_q8_m##MM##_ks##KS(const half_t* x, const unsigned char* w, const half_t* s, float* y, int n,     \
                              int k) {                                                                       \
    STEP_ENTRY(); gemv_q8_body<MM, KS>(x, w, s, y, n, k);                                                    \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      swiglu_q8_m##MM##_ks##KS(const half_t* x, const unsigned char* w, const half_t* s, half_t* y, int n,   \
                               int k, int gate_mul, int up_off) {                                            \
    STEP_ENTRY(); swiglu_q8_body<MM, KS>(x, w, s, y, n, k, gate_mul, up_off);                                \
  }

#define EDGEOCR_KERNELS_KS(MM) \
  EDGEOCR_KERNELS(MM, 1)       \
  EDGEOCR_KERNELS(MM, 2)       \
  EDGEOCR_KERNELS(MM, 4)       \
  EDGEOCR_KERNELS(MM, 8)

#ifdef SLOTS
EDGEOCR_KERNELS_KS(SLOTS)
#else
EDGEOCR_KERNELS_KS(1)
EDGEOCR_KERNELS_KS(2)
EDGEOCR_KERNELS_KS(4)
EDGEOCR_KERNELS_KS(8)
#endif
