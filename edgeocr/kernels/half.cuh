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

// Programmatic dependent launch (sm_90 and later; the runtime compiles with -DPDL and launches each kernel with
// programmatic stream serialization, edgeocr.backends.native_step.PDL): a decode kernel first waits until the
// kernel before it has finished and its writes are visible, then lets the next one be scheduled, so each launch and
// its block scheduling overlap the tail of the kernel before it.  Every read and write comes after the wait, so the
// order of the launch list holds as without it.  Elsewhere, and without -DPDL, nothing.
#if defined(PDL) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define STEP_ENTRY()                                          \
  do {                                                        \
    asm volatile("griddepcontrol.wait;" ::: "memory");        \
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); \
  } while (0)
#else
#define STEP_ENTRY() \
  do {               \
  } while (0)
#endif
