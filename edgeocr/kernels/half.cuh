// FP16 without CUDA headers, shared by the decode kernels: halves travel as 16-bit integers and are converted
// with PTX, so NVRTC compiles the same source for every architecture it targets.
#pragma once

typedef unsigned short half_t;
typedef unsigned int u32;

__device__ __forceinline__ float h2f(half_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

__device__ __forceinline__ half_t f2h(float f) {
  half_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
