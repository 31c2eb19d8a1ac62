// The decode step's matrix-vector products on tensor cores (mma.sync m16n8k16, FP16 in, FP32 accumulation;
// sm_80 and later: Orin sm_87, RTX 4090D sm_89, H200 sm_90), compiled at run time by NVRTC like decode_gemv.cu,
// with the same arguments and results as its kernels:
//
//   tc_gemv_m{M}_ks{KS}(x, w, y, n, k)                    y[m, r] = sum_j x[m, j] * w[r, j], y fp16
//   tc_gemvf_m{M}_ks{KS}(x, w, y, n, k)                   the same, y fp32 rounded through fp16 first
//   tc_swiglu_m{M}_ks{KS}(x, w, y, n, k, gate_mul, up_off) y[m, r] = silu(g) * u (decode_gemv.cu's swiglu)
//   tc_gemv_q8_m{M}_ks{KS}(x, w, scales, y, n, k)          8-bit weights, blocks of 32 along k (decode_gemv.cu)
//   tc_gemvf_q8_m{M}_ks{KS}(x, w, scales, y, n, k)         the same, y fp32 rounded through fp16 first (the lm_head)
//   tc_swiglu_q8_m{M}_ks{KS}(x, w, scales, y, n, k, gate_mul, up_off)
//
// A warp computes 16 output rows for all M <= 8 slots at once: the weights are the 16 x 16 A operand, the
// slots' activations the 16 x 8 B operand (columns past M are zero), so each weight is read once and never
// converted on the CUDA cores, whatever M is (decode_gemv.cu converts every weight once per slot, which is
// what bounds it at 8 slots).  The dot product does not depend on the order of k, so within each 32-wide step a
// thread takes 8 consecutive values of its rows and of its slot (one 16-byte load each) and feeds them to two
// m16n8k16 products as if they were the k positions the fragment layout names: A and B see the same
// relabelling.  KS warps share a tile of 16 rows, each taking every KS-th step of k; every load of a warp's
// UNROLL steps is issued before its products.  k must be a multiple of 32 (8-bit weights: one scale block is
// one step), x 16-byte aligned; n: any (rows past n read row n - 1 and are not stored).

#include "half.cuh"

// Compiled only with -DTENSOR_CORES (edgeocr.backends.native_step.kernel_defines: where the plan takes them).
#if defined(TENSOR_CORES) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)   // mma.sync m16n8k16: sm_80 on
#define UNROLL 8

__device__ __forceinline__ void mma16816(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c += (rows g: a, g + 8: b) x (slot g: xv) over one 32-wide step, 8 values each
__device__ __forceinline__ void mma_step(float (&c)[4], uint4 a, uint4 b, uint4 xv) {
  mma16816(c, a.x, b.x, a.y, b.y, xv.x, xv.y);
  mma16816(c, a.z, b.z, a.w, b.w, xv.z, xv.w);
}

// 8 bytes of 8-bit weights -> 4 half2 of (q - 128), exact: 0x64XX is 1024 + XX as fp16, less 1152
__device__ __forceinline__ void q8_to_h2(u32 w, u32& h01, u32& h23) {
  const u32 k1152 = 0x64806480u;
  u32 a = __byte_perm(w, 0x64646464u, 0x7170), b = __byte_perm(w, 0x64646464u, 0x7372);
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(h01) : "r"(a), "r"(k1152));
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(h23) : "r"(b), "r"(k1152));
}

// the KS partial tiles of a block's warps summed into the first warp of each group; true there
template <int KS, int T>
__device__ __forceinline__ bool tc_reduce(float (&c)[T][4], int warp, int lane) {
  if (KS == 1) return true;
  __shared__ float part[8][T][4][32];
#pragma unroll
  for (int i = 0; i < T; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) part[warp][i][j][lane] = c[i][j];
  __syncthreads();
  if (warp % KS != 0) return false;
#pragma unroll
  for (int i = 0; i < T; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float s = 0.f;
#pragma unroll
      for (int p = 0; p < KS; ++p) s += part[warp + p][i][j][lane];
      c[i][j] = s;
    }
  return true;
}

// T tiles of 16 rows (row g of tile i: ra[i], row g + 8: rb[i]) against the slots, over this warp's steps
template <int KS, int T, bool TAIL>
__device__ __forceinline__ void tc_dot_steps(const uint4* __restrict__ xr, bool has_x, const uint4* const (&ra)[T],
                                             const uint4* const (&rb)[T], int s, int steps, int t,
                                             float (&c)[T][4]) {
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  uint4 a[UNROLL][T], b[UNROLL][T], xv[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int at = 4 * (s + u * KS) + t;
    const bool in = !TAIL || s + u * KS < steps;
#pragma unroll
    for (int i = 0; i < T; ++i) {
      a[u][i] = in ? __ldg(ra[i] + at) : zero;
      b[u][i] = in ? __ldg(rb[i] + at) : zero;
    }
    xv[u] = in && has_x ? __ldg(xr + at) : zero;
  }
#pragma unroll
  for (int u = 0; u < UNROLL; ++u)
#pragma unroll
    for (int i = 0; i < T; ++i) mma_step(c[i], a[u][i], b[u][i], xv[u]);
}

// T tiles of 16 rows (row g of tile i: ra[i], row g + 8: rb[i]) against the slots, over this warp's steps
template <int KS, int T>
__device__ __forceinline__ void tc_dot(const uint4* __restrict__ xr, bool has_x, const uint4* const (&ra)[T],
                                       const uint4* const (&rb)[T], int steps, int part, int t, float (&c)[T][4]) {
  int s = part;
  for (; s + (UNROLL - 1) * KS < steps; s += UNROLL * KS) tc_dot_steps<KS, T, false>(xr, has_x, ra, rb, s, steps, t, c);
  if (s < steps) tc_dot_steps<KS, T, true>(xr, has_x, ra, rb, s, steps, t, c);
}

// the same with 8-bit rows: 8 bytes of each row a step, the step's block scale applied to its products
template <int KS, int T, bool TAIL>
__device__ __forceinline__ void tc_dot_q8_steps(const uint4* __restrict__ xr, bool has_x,
                                                const uint2* const (&ra)[T], const uint2* const (&rb)[T],
                                                const half_t* const (&sa)[T], const half_t* const (&sb)[T], int s,
                                                int steps, int t, float (&c)[T][4]) {
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  uint2 a[UNROLL][T], b[UNROLL][T];
  half_t fa[UNROLL][T], fb[UNROLL][T];
  uint4 xv[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int st = s + u * KS;
    const bool in = !TAIL || st < steps;
#pragma unroll
    for (int i = 0; i < T; ++i) {
      a[u][i] = in ? __ldg(ra[i] + 4 * st + t) : make_uint2(0u, 0u);
      b[u][i] = in ? __ldg(rb[i] + 4 * st + t) : make_uint2(0u, 0u);
      fa[u][i] = in ? __ldg(sa[i] + st) : (half_t)0;
      fb[u][i] = in ? __ldg(sb[i] + st) : (half_t)0;
    }
    xv[u] = in && has_x ? __ldg(xr + 4 * st + t) : zero;
  }
#pragma unroll
  for (int u = 0; u < UNROLL; ++u)
#pragma unroll
    for (int i = 0; i < T; ++i) {
      uint4 ah, bh;
      q8_to_h2(a[u][i].x, ah.x, ah.y);
      q8_to_h2(a[u][i].y, ah.z, ah.w);
      q8_to_h2(b[u][i].x, bh.x, bh.y);
      q8_to_h2(b[u][i].y, bh.z, bh.w);
      float d[4] = {0.f, 0.f, 0.f, 0.f};
      mma_step(d, ah, bh, xv[u]);
      const float sga = h2f(fa[u][i]), sgb = h2f(fb[u][i]);
      c[i][0] = fmaf(sga, d[0], c[i][0]);
      c[i][1] = fmaf(sga, d[1], c[i][1]);
      c[i][2] = fmaf(sgb, d[2], c[i][2]);
      c[i][3] = fmaf(sgb, d[3], c[i][3]);
    }
}

template <int KS, int T>
__device__ __forceinline__ void tc_dot_q8(const uint4* __restrict__ xr, bool has_x, const uint2* const (&ra)[T],
                                          const uint2* const (&rb)[T], const half_t* const (&sa)[T],
                                          const half_t* const (&sb)[T], int steps, int part, int t,
                                          float (&c)[T][4]) {
  int s = part;
  for (; s + (UNROLL - 1) * KS < steps; s += UNROLL * KS)
    tc_dot_q8_steps<KS, T, false>(xr, has_x, ra, rb, sa, sb, s, steps, t, c);
  if (s < steps) tc_dot_q8_steps<KS, T, true>(xr, has_x, ra, rb, sa, sb, s, steps, t, c);
}

__device__ __forceinline__ void tc_store(half_t* y, size_t i, float v) { y[i] = f2h(v); }
__device__ __forceinline__ void tc_store(float* y, size_t i, float v) { y[i] = h2f(f2h(v)); }

// y = silu(round(g)) * round(u), rounded as ONNX Runtime's MatMul -> QuickGelu -> Mul chain (decode_gemv.cu)
__device__ __forceinline__ half_t swiglu_out(float g, float u) {
  const float gg = h2f(f2h(g)), uu = h2f(f2h(u));
  return f2h(h2f(f2h(gg / (1.f + expf(-gg)))) * uu);
}

// tile rows of this warp and its lane's fragment coordinates
#define TC_SETUP                                                                                              \
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;                    \
  const int r0 = (blockIdx.x * (8 / KS) + warp / KS) * 16;                                                    \
  const int steps = k >> 5;                                                                                   \
  const bool live = r0 < n;                                                                                   \
  const int ra_row = min(r0 + g, n - 1), rb_row = min(r0 + g + 8, n - 1);                                     \
  const uint4* xr = reinterpret_cast<const uint4*>(x) + (size_t)min(g, M - 1) * (k >> 3);                      \
  const bool has_x = g < M;

// lane (g, t) holds rows r0 + g (c[0], c[1]) and r0 + g + 8 (c[2], c[3]) of slots 2t, 2t + 1
#define TC_OUT(EXPR_STORE)                                                                                    \
  _Pragma("unroll") for (int j = 0; j < 4; ++j) {                                                             \
    const int row = r0 + g + (j >> 1) * 8, m = 2 * t + (j & 1);                                                \
    if (row < n && m < M) { EXPR_STORE; }                                                                     \
  }

template <int M, int KS, typename OutT>
__device__ __forceinline__ void tc_gemv_body(const half_t* __restrict__ x, const half_t* __restrict__ w,
                                             OutT* __restrict__ y, int n, int k) {
  TC_SETUP
  float c[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  if (live) {
    const uint4* ra[1] = {reinterpret_cast<const uint4*>(w) + (size_t)ra_row * (k >> 3)};
    const uint4* rb[1] = {reinterpret_cast<const uint4*>(w) + (size_t)rb_row * (k >> 3)};
    tc_dot<KS, 1>(xr, has_x, ra, rb, steps, warp % KS, t, c);
  }
  if (tc_reduce<KS, 1>(c, warp, lane) && live) TC_OUT(tc_store(y, (size_t)m * n + row, c[0][j]))
}

template <int M, int KS>
__device__ __forceinline__ void tc_swiglu_body(const half_t* __restrict__ x, const half_t* __restrict__ w,
                                               half_t* __restrict__ y, int n, int k, int gate_mul, int up_off) {
  TC_SETUP
  float c[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
  if (live) {
    const uint4* base = reinterpret_cast<const uint4*>(w);
    const size_t kv = k >> 3, ga = (size_t)ra_row * gate_mul, gb = (size_t)rb_row * gate_mul;
    const uint4* ra[2] = {base + ga * kv, base + (ga + up_off) * kv};
    const uint4* rb[2] = {base + gb * kv, base + (gb + up_off) * kv};
    tc_dot<KS, 2>(xr, has_x, ra, rb, steps, warp % KS, t, c);
  }
  if (tc_reduce<KS, 2>(c, warp, lane) && live) TC_OUT(y[(size_t)m * n + row] = swiglu_out(c[0][j], c[1][j]))
}

template <int M, int KS, typename OutT>
__device__ __forceinline__ void tc_gemv_q8_body(const half_t* __restrict__ x, const unsigned char* __restrict__ w,
                                                const half_t* __restrict__ scales, OutT* __restrict__ y, int n,
                                                int k) {
  TC_SETUP
  float c[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  if (live) {
    const uint2* ra[1] = {reinterpret_cast<const uint2*>(w + (size_t)ra_row * k)};
    const uint2* rb[1] = {reinterpret_cast<const uint2*>(w + (size_t)rb_row * k)};
    const half_t* sa[1] = {scales + (size_t)ra_row * steps};
    const half_t* sb[1] = {scales + (size_t)rb_row * steps};
    tc_dot_q8<KS, 1>(xr, has_x, ra, rb, sa, sb, steps, warp % KS, t, c);
  }
  if (tc_reduce<KS, 1>(c, warp, lane) && live) TC_OUT(tc_store(y, (size_t)m * n + row, c[0][j]))
}

template <int M, int KS>
__device__ __forceinline__ void tc_swiglu_q8_body(const half_t* __restrict__ x, const unsigned char* __restrict__ w,
                                                  const half_t* __restrict__ scales, half_t* __restrict__ y, int n,
                                                  int k, int gate_mul, int up_off) {
  TC_SETUP
  float c[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
  if (live) {
    const size_t ga = (size_t)ra_row * gate_mul, gb = (size_t)rb_row * gate_mul;
    const uint2* ra[2] = {reinterpret_cast<const uint2*>(w + ga * k), reinterpret_cast<const uint2*>(w + (ga + up_off) * k)};
    const uint2* rb[2] = {reinterpret_cast<const uint2*>(w + gb * k), reinterpret_cast<const uint2*>(w + (gb + up_off) * k)};
    const half_t* sa[2] = {scales + ga * steps, scales + (ga + up_off) * steps};
    const half_t* sb[2] = {scales + gb * steps, scales + (gb + up_off) * steps};
    tc_dot_q8<KS, 2>(xr, has_x, ra, rb, sa, sb, steps, warp % KS, t, c);
  }
  if (tc_reduce<KS, 2>(c, warp, lane) && live) TC_OUT(y[(size_t)m * n + row] = swiglu_out(c[0][j], c[1][j]))
}

#define EDGEOCR_TC_KERNELS(MM, KS)                                                                          \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      tc_gemv_m##MM##_ks##KS(const half_t* x, const half_t* w, half_t* y, int n, int k) {                     \
    STEP_ENTRY(); tc_gemv_body<MM, KS>(x, w, y, n, k);                                                        \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      tc_gemvf_m##MM##_ks##KS(const half_t* x, const half_t* w, float* y, int n, int k) {                     \
    STEP_ENTRY(); tc_gemv_body<MM, KS>(x, w, y, n, k);                                                        \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      tc_swiglu_m##MM##_ks##KS(const half_t* x, const half_t* w, half_t* y, int n, int k, int gate_mul,       \
                               int up_off) {                                                                 \
    STEP_ENTRY(); tc_swiglu_body<MM, KS>(x, w, y, n, k, gate_mul, up_off);                                   \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      tc_gemv_q8_m##MM##_ks##KS(const half_t* x, const unsigned char* w, const half_t* s, half_t* y, int n,   \
                                int k) {                                                                     \
    STEP_ENTRY(); tc_gemv_q8_body<MM, KS>(x, w, s, y, n, k);                                                 \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      tc_gemvf_q8_m##MM##_ks##KS(const half_t* x, const unsigned char* w, const half_t* s, float* y, int n,   \
                                 int k) {                                                                    \
    STEP_ENTRY(); tc_gemv_q8_body<MM, KS>(x, w, s, y, n, k);                                                 \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      tc_swiglu_q8_m##MM##_ks##KS(const half_t* x, const unsigned char* w, const half_t* s, half_t* y, int n, \
                                  int k, int gate_mul, int up_off) {                                         \
    STEP_ENTRY(); tc_swiglu_q8_body<MM, KS>(x, w, s, y, n, k, gate_mul, up_off);                             \
  }

#define EDGEOCR_TC_KERNELS_KS(MM) \
  EDGEOCR_TC_KERNELS(MM, 1)       \
  EDGEOCR_TC_KERNELS(MM, 2)       \
  EDGEOCR_TC_KERNELS(MM, 4)       \
  EDGEOCR_TC_KERNELS(MM, 8)

#ifdef SLOTS
EDGEOCR_TC_KERNELS_KS(SLOTS)
#else
EDGEOCR_TC_KERNELS_KS(1)
EDGEOCR_TC_KERNELS_KS(2)
EDGEOCR_TC_KERNELS_KS(4)
EDGEOCR_TC_KERNELS_KS(8)
#endif
#endif  // TENSOR_CORES, sm_80 and later
