// The decode step's small kernels around the GEMVs (decode_gemv.cu) and the attention (decode_attention.cu):
// one decoder layer of HunyuanOCR's text model for N slots, one new token each, FP16 activations with fp32
// arithmetic, rounded to fp16 where the exported graph (quantize/torch_model.py, Decoder._forward_gqa and
// DeviceSelect) rounds.  Compiled at run time by NVRTC (edgeocr.backends.native_step), no CUDA headers
// (half.cuh).  Every kernel has a numpy twin in edgeocr/backends/native_step.py that the CPU tests run.
//
//   embed_rows(ids, table, x, h)                       grid (N), 256 threads
//   embed_rows_q8(ids, table, scales, x, h)            the same from an 8-bit table (blocks of 32 along h)
//       x[s] = table[ids[s]]                           ids: [N, 1] int64; table [V, h]; x [N, h]
//   add_rmsnorm(x, delta, gamma, xn, h, eps)           grid (N), 256 threads
//       x[s] += delta[s] (the residual, fp16; delta may be null), then xn[s] = gamma * rms_norm(x[s])
//   rope_qknorm_append(qkv, cos, sin, qn, kn, lens, kc, vc, q, nq, kvh, cache_len, eps)
//                                                      grid (nq + 2 kvh, N), HEAD_DIM threads
//       head h of slot s's q|k|v row: a query or key head gets RoPE (x cos + rotate_half(x) sin), then its
//       RMSNorm (qn / kn); queries go to q [N, nq * D], keys and values to row lens[s] of the cache
//       [N, kvh, cache_len, D]
//   select_partial(logits, seen, penalty, val, idx, v) grid (PARTS, N), 256 threads
//   select_final(val, idx, next, parts, live, lens)    grid (N), 32 threads
//       the repetition penalty over the seen ids (logit / p if logit > 0 else logit * p), then the argmax,
//       first index on ties: next [N] int64; then, when live is given, lens[s] += live[s] (the next step's row)
//   step_begin(next, live, lens, table_cos, table_sin, seen, ids, cos, sin, v, d)
//                                                      grid (N), 128 threads
//       the step's inputs from the device state: each slot's incoming token is the last step's choice (ids; a
//       live slot's joins its seen set), its RoPE rows the text table's rows at lens[s]

#include "half.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif

__device__ __forceinline__ float rh(float f) { return h2f(f2h(f)); }

// sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  __syncthreads();                                   // scratch may still be read by an earlier call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = 0.f;
  for (int i = 0; i < warps; ++i) t += scratch[i];
  return t;
}

extern "C" __global__ void __launch_bounds__(256)
    embed_rows(const long long* __restrict__ ids, const half_t* __restrict__ table, half_t* __restrict__ x, int h) {
  STEP_ENTRY();
  const int s = blockIdx.x;
  const long long id = ids[s];
  for (int j = threadIdx.x; j < h; j += blockDim.x) x[(size_t)s * h + j] = table[(size_t)id * h + j];
}

// the rows of an 8-bit table (blocks of 32 along h, a weight is (q - 128) * scale), rounded to fp16 as ONNX Runtime's
// GatherBlockQuantized gives them to the prefill
extern "C" __global__ void __launch_bounds__(256)
    embed_rows_q8(const long long* __restrict__ ids, const unsigned char* __restrict__ table,
                  const half_t* __restrict__ scales, half_t* __restrict__ x, int h) {
  STEP_ENTRY();
  const int s = blockIdx.x;
  const long long id = ids[s];
  for (int j = threadIdx.x; j < h; j += blockDim.x)
    x[(size_t)s * h + j] = f2h(((float)table[(size_t)id * h + j] - 128.f) * h2f(scales[(size_t)id * (h >> 5) + (j >> 5)]));
}

extern "C" __global__ void __launch_bounds__(256)
    add_rmsnorm(half_t* __restrict__ x, const half_t* __restrict__ delta, const half_t* __restrict__ gamma,
                half_t* __restrict__ xn, int h, float eps) {
  STEP_ENTRY();
  __shared__ float scratch[32];
  const int s = blockIdx.x;
  half_t* xs = x + (size_t)s * h;
  float ss = 0.f;
  for (int j = threadIdx.x; j < h; j += blockDim.x) {
    float v = h2f(xs[j]);
    if (delta != nullptr) {
      v = rh(v + h2f(delta[(size_t)s * h + j]));     // the residual stream is fp16, as in the graph
      xs[j] = f2h(v);
    }
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss, scratch) / h + eps);
  for (int j = threadIdx.x; j < h; j += blockDim.x)
    xn[(size_t)s * h + j] = f2h(h2f(gamma[j]) * rh(h2f(xs[j]) * inv));   // w * fp16(x * inv), as rms_norm
}

extern "C" __global__ void __launch_bounds__(128)
    rope_qknorm_append(const half_t* __restrict__ qkv, const float* __restrict__ cos, const float* __restrict__ sin,
                       const half_t* __restrict__ qn, const half_t* __restrict__ kn, const int* __restrict__ lens,
                       half_t* __restrict__ kc, half_t* __restrict__ vc, half_t* __restrict__ q, int nq, int kvh,
                       int cache_len, float eps) {
  STEP_ENTRY();
  __shared__ float xs[HEAD_DIM];
  __shared__ float scratch[32];
  const int h = blockIdx.x, s = blockIdx.y, j = threadIdx.x;
  const int width = (nq + 2 * kvh) * HEAD_DIM, pos = lens[s];
  const half_t raw = qkv[(size_t)s * width + h * HEAD_DIM + j];
  if (h >= nq + kvh) {                               // a value head: into the cache as it is
    const int hv = h - nq - kvh;
    vc[(((size_t)s * kvh + hv) * cache_len + pos) * HEAD_DIM + j] = raw;
    return;
  }
  const float x = h2f(raw);
  xs[j] = x;
  __syncthreads();
  const int half = HEAD_DIM / 2;
  const float rot = j < half ? -xs[j + half] : xs[j - half];
  const float c = rh(cos[(size_t)s * HEAD_DIM + j]), sn = rh(sin[(size_t)s * HEAD_DIM + j]);
  const float r = rh(rh(x * c) + rh(rot * sn));      // qk * cos + (qk @ R) * sin, fp16 between ops
  const float inv = rsqrtf(block_sum(r * r, scratch) / HEAD_DIM + eps);
  if (h < nq) {
    q[(size_t)s * nq * HEAD_DIM + h * HEAD_DIM + j] = f2h(h2f(qn[j]) * rh(r * inv));
  } else {
    const int hk = h - nq;
    kc[(((size_t)s * kvh + hk) * cache_len + pos) * HEAD_DIM + j] = f2h(h2f(kn[j]) * rh(r * inv));
  }
}

// (value, index) pairs: the larger value wins, the smaller index on ties
__device__ __forceinline__ void better(float& v, int& i, float v2, int i2) {
  if (v2 > v || (v2 == v && i2 < i)) {
    v = v2;
    i = i2;
  }
}

extern "C" __global__ void __launch_bounds__(256)
    select_partial(const float* __restrict__ logits, const float* __restrict__ seen, const float* __restrict__ penalty,
                   float* __restrict__ val, int* __restrict__ idx, int v) {
  STEP_ENTRY();
  __shared__ float sv[256];
  __shared__ int si[256];
  const int part = blockIdx.x, parts = gridDim.x, s = blockIdx.y, t = threadIdx.x;
  const float p = penalty[s];
  float best = __int_as_float(0xff800000u);
  int bi = 0x7fffffff;
  for (int i = part * blockDim.x + t; i < v; i += parts * blockDim.x) {
    float l = logits[(size_t)s * v + i];
    if (seen[(size_t)s * v + i] > 0.f) l = l < 0.f ? l * p : l / p;
    better(best, bi, l, i);
  }
  sv[t] = best;
  si[t] = bi;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (t < w) better(sv[t], si[t], sv[t + w], si[t + w]);
    __syncthreads();
  }
  if (t == 0) {
    val[s * parts + part] = sv[0];
    idx[s * parts + part] = si[0];
  }
}

extern "C" __global__ void __launch_bounds__(32)
    select_final(const float* __restrict__ val, const int* __restrict__ idx, long long* __restrict__ next, int parts,
                 const int* __restrict__ live, int* __restrict__ lens) {
  STEP_ENTRY();
  const int s = blockIdx.x, lane = threadIdx.x;
  float best = __int_as_float(0xff800000u);
  int bi = 0x7fffffff;
  for (int i = lane; i < parts; i += 32) better(best, bi, val[s * parts + i], idx[s * parts + i]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, best, off);
    const int i2 = __shfl_xor_sync(0xffffffffu, bi, off);
    better(best, bi, v2, i2);
  }
  if (lane == 0) {
    next[s] = bi == 0x7fffffff ? 0 : bi;   // every logit NaN: token 0, not an id past the vocabulary
    if (live != nullptr) lens[s] += live[s];
  }
}

extern "C" __global__ void __launch_bounds__(128)
    step_begin(const long long* __restrict__ next, const int* __restrict__ live, const int* __restrict__ lens,
               const float* __restrict__ table_cos, const float* __restrict__ table_sin, float* __restrict__ seen,
               long long* __restrict__ ids, float* __restrict__ cos, float* __restrict__ sin, int v, int d) {
  STEP_ENTRY();
  const int s = blockIdx.x;
  const long long tok = next[s];
  const size_t row = (size_t)lens[s] * d;
  if (threadIdx.x == 0) {
    ids[s] = tok;
    if (live[s] && tok >= 0 && tok < v) seen[(size_t)s * v + tok] = 1.f;
  }
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    cos[(size_t)s * d + j] = table_cos[row + j];
    sin[(size_t)s * d + j] = table_sin[row + j];
  }
}
