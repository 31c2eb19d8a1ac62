// Decode attention over a static FP16 KV cache (one new query token per slot, grouped-query heads), split
// over the sequence ("flash decoding"), compiled at run time by NVRTC (edgeocr.backends.native_step;
// scripts/gpu_decode_kernels.py), no CUDA headers (half.cuh).  HEAD_DIM (32, 64 or 128) and GROUP (query heads
// per key/value head) are compile-time: -DHEAD_DIM=.. -DGROUP=.. (default 128 and 2, HunyuanOCR's decoder).
//
//   attn_split(q, k, v, lens, part_o, part_ml, scale, cache_len, n_splits, len_add)
//       grid (kv_heads, n_splits, slots), 128 threads; block (h, c, s) reads cache rows [c * CHUNK, c * CHUNK +
//       CHUNK) of kv head h of slot s (rows at or past lens[s] are skipped; a block wholly past them returns at
//       once) and writes, for each of the GROUP query heads that share h, its partial softmax maximum and sum
//       and its unnormalized output
//   attn_combine(part_o, part_ml, lens, o, n_splits, len_add)
//       grid (q_heads, slots), 128 threads: the partials rescaled to one softmax, written as FP16
//
//   q:       [slots, q_heads, 128] fp16            the new token's queries (RoPE and Q-norm applied)
//   k, v:    [slots, kv_heads, cache_len, 128] fp16 the cache (ONNX Runtime GroupQueryAttention's BNSH layout),
//                                                  the new token's row already written
//   lens:    [slots] int32                         valid rows per slot are lens[s] + len_add, the new token's
//                                                  included (len_add 1: lens is GroupQueryAttention's seqlens_k)
//   part_o:  [slots, q_heads, n_splits, 128] fp32  scratch
//   part_ml: [slots, q_heads, n_splits, 2] fp32    scratch: (maximum, sum) of each split
//   o:       [slots, q_heads, 128] fp16
// The grid is fixed for a cache length (n_splits = cache_len / CHUNK), so a CUDA graph captures it once and
// replays it at any depth.

#include "half.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef GROUP
#define GROUP 2            // query heads per key/value head (16 / 8 in HunyuanOCR's decoder)
#endif
#ifndef CHUNK
#define CHUNK 64           // cache rows per block (the runtime: edgeocr.backends.native_step.CHUNK)
#endif
#define DPL (HEAD_DIM / 32)  // dimensions per lane when a warp reads one cache row
static_assert(HEAD_DIM % 32 == 0 && HEAD_DIM <= 128, "HEAD_DIM must be 32, 64, 96 or 128");
#define WARPS 4
#define NEG_INF __int_as_float(0xff800000u)

extern "C" __global__ void __launch_bounds__(128)
    attn_split(const half_t* __restrict__ q, const half_t* __restrict__ k, const half_t* __restrict__ v,
               const int* __restrict__ lens, float* __restrict__ part_o, float* __restrict__ part_ml, float scale,
               int cache_len, int n_splits, int len_add) {
  const int h = blockIdx.x, c = blockIdx.y, s = blockIdx.z;
  const int kv_heads = gridDim.x, q_heads = kv_heads * GROUP;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int len = min(lens[s] + len_add, cache_len);
  const int row0 = c * CHUNK;
  const int rows = min(CHUNK, len - row0);                          // this block's valid rows
  if (rows <= 0) return;                                            // past the slot's depth: attn_combine
                                                                    // reads only the splits below it

  __shared__ float qs[GROUP][HEAD_DIM];
  __shared__ float ps[GROUP][CHUNK];
  __shared__ float stat[GROUP][2];                                   // (maximum, sum) per query head

  for (int i = tid; i < GROUP * HEAD_DIM; i += blockDim.x) {
    const int g = i / HEAD_DIM, d = i % HEAD_DIM;
    qs[g][d] = h2f(q[((size_t)s * q_heads + h * GROUP + g) * HEAD_DIM + d]) * scale;
  }
  __syncthreads();

  const size_t head_base = ((size_t)s * kv_heads + h) * (size_t)cache_len * HEAD_DIM;
  // scores: each warp takes every WARPS-th row; a lane holds DPL consecutive values of the row (coalesced)
  for (int r = warp; r < rows; r += WARPS) {
    const half_t* kr = k + head_base + (size_t)(row0 + r) * HEAD_DIM + lane * DPL;
    float kf[DPL];
    if constexpr (DPL == 4) {
      const uint2 kv4 = *reinterpret_cast<const uint2*>(kr);
      kf[0] = h2f((half_t)(kv4.x & 0xffffu)), kf[1] = h2f((half_t)(kv4.x >> 16));
      kf[2] = h2f((half_t)(kv4.y & 0xffffu)), kf[3] = h2f((half_t)(kv4.y >> 16));
    } else {
#pragma unroll
      for (int j = 0; j < DPL; ++j) kf[j] = h2f(kr[j]);
    }
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
      const float* qg = qs[g] + lane * DPL;
      float d = 0.f;
#pragma unroll
      for (int j = 0; j < DPL; ++j) d = fmaf(qg[j], kf[j], d);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
      if (lane == 0) ps[g][r] = d;
    }
  }
  __syncthreads();

  // softmax statistics of this chunk: warp w handles query heads w, w + WARPS, ...
  for (int g = warp; g < GROUP; g += WARPS) {
    float m = NEG_INF;
    for (int r = lane; r < rows; r += 32) m = fmaxf(m, ps[g][r]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float l = 0.f;
    for (int r = lane; r < rows; r += 32) {
      const float p = expf(ps[g][r] - m);
      ps[g][r] = p;
      l += p;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
    if (lane == 0) {
      stat[g][0] = m;
      stat[g][1] = l;
    }
  }
  __syncthreads();

  // unnormalized output: thread tid owns dimension tid of every query head in the group
  if (tid < HEAD_DIM) {
    float acc[GROUP];
#pragma unroll
    for (int g = 0; g < GROUP; ++g) acc[g] = 0.f;
    for (int r = 0; r < rows; ++r) {
      const float vv = h2f(v[head_base + (size_t)(row0 + r) * HEAD_DIM + tid]);
#pragma unroll
      for (int g = 0; g < GROUP; ++g) acc[g] = fmaf(ps[g][r], vv, acc[g]);
    }
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
      const size_t slot_head = (size_t)s * q_heads + h * GROUP + g;
      part_o[(slot_head * n_splits + c) * HEAD_DIM + tid] = acc[g];
      if (tid == 0) {
        part_ml[(slot_head * n_splits + c) * 2] = stat[g][0];
        part_ml[(slot_head * n_splits + c) * 2 + 1] = stat[g][1];
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(128)
    attn_combine(const float* __restrict__ part_o, const float* __restrict__ part_ml, const int* __restrict__ lens,
                 half_t* __restrict__ o, int n_splits, int len_add) {
  const int hq = blockIdx.x, s = blockIdx.y, q_heads = gridDim.x, tid = threadIdx.x;
  if (tid >= HEAD_DIM) return;
  const int used = min(n_splits, (lens[s] + len_add + CHUNK - 1) / CHUNK);   // splits that saw at least one row
  const size_t slot_head = (size_t)s * q_heads + hq;
  const float* ml = part_ml + slot_head * n_splits * 2;
  float m = NEG_INF;
  for (int c = 0; c < used; ++c) m = fmaxf(m, ml[2 * c]);
  float l = 0.f, acc = 0.f;
  for (int c = 0; c < used; ++c) {
    const float w = expf(ml[2 * c] - m);
    l += w * ml[2 * c + 1];
    acc += w * part_o[(slot_head * n_splits + c) * HEAD_DIM + tid];
  }
  o[slot_head * HEAD_DIM + tid] = f2h(used > 0 ? acc / l : 0.f);
}
