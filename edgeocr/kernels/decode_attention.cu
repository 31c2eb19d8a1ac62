// Decode attention over a static FP16 KV cache (one new query token per slot, grouped-query heads), split
// over the sequence ("flash decoding") and combined in the same launch, compiled at run time by NVRTC
// (edgeocr.backends.native_step; scripts/gpu_decode_kernels.py), no CUDA headers (half.cuh).  HEAD_DIM (32, 64,
// 96 or 128), GROUP (query heads per key/value head) and CHUNK (cache rows per block) are compile-time:
// -DHEAD_DIM=.. -DGROUP=.. -DCHUNK=.. (default 128, 2 and 64: HunyuanOCR's decoder, the runtime's block).
//
//   attn_decode(q, k, v, lens, part_o, part_ml, count, o, scale, cache_len, n_splits, len_add)
//       grid (kv_heads, n_splits, slots), 128 threads.  Block (h, c, s) takes cache rows [c * CHUNK, c * CHUNK +
//       CHUNK) of kv head h of slot s (rows at or past the slot's depth are skipped; a block wholly past them
//       returns at once and is not counted).  It issues every load it needs (its rows of K and V, its queries)
//       before any arithmetic, so the cache is read in one memory round trip: 16 threads share a row, each
//       holding HEAD_DIM / 16 values of it, and a thread keeps the same rows of K and V, so the softmax weights
//       never leave its registers.  A slot whose rows fit one block writes o itself; otherwise each block writes
//       its partial softmax maximum, sum and unnormalized output for the GROUP query heads that share h and
//       counts itself in count[s, h]; the last block of (s, h) to arrive combines the splits into o and sets the
//       count back to 0.
//
//   q:       [slots, q_heads, HEAD_DIM] fp16       the new token's queries (RoPE and Q-norm applied)
//   k, v:    [slots, kv_heads, cache_len, HEAD_DIM] fp16 the cache (ONNX Runtime GroupQueryAttention's BNSH
//                                                  layout), the new token's row already written
//   lens:    [slots] int32                         valid rows per slot are lens[s] + len_add, the new token's
//                                                  included (len_add 1: lens is GroupQueryAttention's seqlens_k)
//   part_o:  [slots, q_heads, n_splits, HEAD_DIM] fp32 scratch
//   part_ml: [slots, q_heads, n_splits, 2] fp32    scratch: (maximum, sum) of each split
//   count:   [slots, kv_heads] int32               zero before the first launch; every launch leaves it zero
//   o:       [slots, q_heads, HEAD_DIM] fp16
// The grid is fixed for a cache length (n_splits = cache_len / CHUNK), so a CUDA graph captures it once and
// replays it at any depth.  On the H200 at depth 1,221 it takes 11.2 us a layer for one slot (the separate split
// and combine kernels it replaced: 22.6; torch's fused SDPA: 8.8) and 21.5 us for 8 (28.7; 16.5), 2026-12-05.

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
static_assert(HEAD_DIM % 32 == 0 && HEAD_DIM <= 128, "HEAD_DIM must be 32, 64, 96 or 128");
#define WARPS 4                          // 128 threads a block
#define NEG_INF __int_as_float(0xff800000u)

#define TPR 16                           // threads per cache row
#define DPT (HEAD_DIM / TPR)             // values of a row per thread: 2, 4, 6 or 8
#define WPT (DPT / 2)                    // 32-bit words of a row per thread
#define RG (128 / TPR)                   // rows read at once by the block
#define RPT (CHUNK / RG)                 // rows per thread
static_assert(CHUNK % RG == 0, "CHUNK must be a multiple of 8");

__device__ __forceinline__ void load_words(const half_t* p, u32 (&w)[WPT]) {
  if constexpr (WPT == 4) {
    const uint4 t = *reinterpret_cast<const uint4*>(p);
    w[0] = t.x, w[1] = t.y, w[2] = t.z, w[3] = t.w;
  } else if constexpr (WPT == 2) {
    const uint2 t = *reinterpret_cast<const uint2*>(p);
    w[0] = t.x, w[1] = t.y;
  } else {
#pragma unroll
    for (int j = 0; j < WPT; ++j) w[j] = reinterpret_cast<const u32*>(p)[j];
  }
}

__device__ __forceinline__ float lo(u32 w) { return h2f((half_t)(w & 0xffffu)); }
__device__ __forceinline__ float hi(u32 w) { return h2f((half_t)(w >> 16)); }

extern "C" __global__ void __launch_bounds__(128)
    attn_decode(const half_t* __restrict__ q, const half_t* __restrict__ k, const half_t* __restrict__ v,
                const int* __restrict__ lens, float* __restrict__ part_o, float* __restrict__ part_ml,
                int* __restrict__ count, half_t* __restrict__ o, float scale, int cache_len, int n_splits,
                int len_add) {
  STEP_ENTRY();
  const int h = blockIdx.x, c = blockIdx.y, s = blockIdx.z;
  const int kv_heads = gridDim.x, q_heads = kv_heads * GROUP;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, rg = tid / TPR, part = tid % TPR;
  const int len = min(lens[s] + len_add, cache_len);
  const int row0 = c * CHUNK;
  const int rows = min(CHUNK, len - row0);
  if (rows <= 0) return;                                    // past the slot's depth: not counted
  const int used = (len + CHUNK - 1) / CHUNK;               // blocks of this (s, h) that hold rows

  // every load first: K and V rows, then the queries
  const size_t head_base = ((size_t)s * kv_heads + h) * (size_t)cache_len * HEAD_DIM;
  u32 kw[RPT][WPT], vw[RPT][WPT];
#pragma unroll
  for (int i = 0; i < RPT; ++i) {
    const int r = rg + i * RG;
    if (r < rows) {
      const size_t at = head_base + (size_t)(row0 + r) * HEAD_DIM + part * DPT;
      load_words(k + at, kw[i]);
      load_words(v + at, vw[i]);
    } else {
#pragma unroll
      for (int j = 0; j < WPT; ++j) kw[i][j] = 0u, vw[i][j] = 0u;
    }
  }
  float qf[GROUP][DPT];
#pragma unroll
  for (int g = 0; g < GROUP; ++g) {
    u32 qw[WPT];
    load_words(q + ((size_t)s * q_heads + h * GROUP + g) * HEAD_DIM + part * DPT, qw);
#pragma unroll
    for (int j = 0; j < WPT; ++j) qf[g][2 * j] = lo(qw[j]) * scale, qf[g][2 * j + 1] = hi(qw[j]) * scale;
  }

  // scores of this thread's rows, summed over the 16 threads of each row
  float sc[GROUP][RPT];
#pragma unroll
  for (int i = 0; i < RPT; ++i) {
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
      float d = 0.f;
#pragma unroll
      for (int j = 0; j < WPT; ++j) d = fmaf(qf[g][2 * j], lo(kw[i][j]), fmaf(qf[g][2 * j + 1], hi(kw[i][j]), d));
#pragma unroll
      for (int off = TPR / 2; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
      sc[g][i] = (rg + i * RG < rows) ? d : NEG_INF;
    }
  }

  __shared__ float wmax[WARPS][GROUP], wsum[WARPS][GROUP];
  __shared__ float red[WARPS][GROUP][HEAD_DIM];
  __shared__ int last;
  // the block's maximum per query head
#pragma unroll
  for (int g = 0; g < GROUP; ++g) {
    float m = sc[g][0];
#pragma unroll
    for (int i = 1; i < RPT; ++i) m = fmaxf(m, sc[g][i]);
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
    if (lane == 0) wmax[warp][g] = m;
  }
  __syncthreads();
  float mx[GROUP];
#pragma unroll
  for (int g = 0; g < GROUP; ++g) {
    mx[g] = wmax[0][g];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) mx[g] = fmaxf(mx[g], wmax[w][g]);
  }
  // softmax weights (0 past the rows) and the weighted sum of this thread's V values
  float acc[GROUP][DPT];
#pragma unroll
  for (int g = 0; g < GROUP; ++g) {
    float l = 0.f;
#pragma unroll
    for (int j = 0; j < DPT; ++j) acc[g][j] = 0.f;
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
      const float p = (rg + i * RG < rows) ? expf(sc[g][i] - mx[g]) : 0.f;
      l += p;
#pragma unroll
      for (int j = 0; j < WPT; ++j) {
        acc[g][2 * j] = fmaf(p, lo(vw[i][j]), acc[g][2 * j]);
        acc[g][2 * j + 1] = fmaf(p, hi(vw[i][j]), acc[g][2 * j + 1]);
      }
    }
    l += __shfl_xor_sync(0xffffffffu, l, 16);               // the warp's two row groups
#pragma unroll
    for (int j = 0; j < DPT; ++j) acc[g][j] += __shfl_xor_sync(0xffffffffu, acc[g][j], 16);
    if (lane == 0) wsum[warp][g] = l;
    if (lane < 16) {
#pragma unroll
      for (int j = 0; j < DPT; ++j) red[warp][g][part * DPT + j] = acc[g][j];
    }
  }
  __syncthreads();

  // the block's partials: the warps' sums
  for (int i = tid; i < GROUP * HEAD_DIM; i += blockDim.x) {
    const int g = i / HEAD_DIM, d = i % HEAD_DIM;
    float val = red[0][g][d], l = wsum[0][g];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) val += red[w][g][d], l += wsum[w][g];
    const size_t slot_head = (size_t)s * q_heads + h * GROUP + g;
    if (used == 1) {
      o[slot_head * HEAD_DIM + d] = f2h(val / l);
    } else {
      part_o[(slot_head * n_splits + c) * HEAD_DIM + d] = val;
      if (d == 0) part_ml[(slot_head * n_splits + c) * 2] = mx[g], part_ml[(slot_head * n_splits + c) * 2 + 1] = l;
    }
  }
  if (used == 1) return;

  // the last block of (s, h) to finish combines the splits
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(count + s * kv_heads + h, 1) == used - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = tid; i < GROUP * HEAD_DIM; i += blockDim.x) {
    const int g = i / HEAD_DIM, d = i % HEAD_DIM;
    const size_t slot_head = (size_t)s * q_heads + h * GROUP + g;
    const float* ml = part_ml + slot_head * n_splits * 2;
    const float* po = part_o + slot_head * n_splits * HEAD_DIM + d;
    float m = NEG_INF;
    for (int j = 0; j < used; ++j) m = fmaxf(m, __ldcg(ml + 2 * j));
    float l = 0.f, a = 0.f;
#pragma unroll 4
    for (int j = 0; j < used; ++j) {
      const float w = expf(__ldcg(ml + 2 * j) - m);
      l = fmaf(w, __ldcg(ml + 2 * j + 1), l);
      a = fmaf(w, __ldcg(po + (size_t)j * HEAD_DIM), a);
    }
    o[slot_head * HEAD_DIM + d] = f2h(a / l);
  }
  if (tid == 0) count[s * kv_heads + h] = 0;
}
