// LayerNorm(x + residual) over rows, in one pass over memory: fastbert.kernels.cpu_layer_norm
// compiles this file at first use (-O3 -march=native -fopenmp) and calls it through ctypes.
//
// fastbert_layer_norm: x [rows, cols] (row stride x_stride), residual [rows, cols] or NULL (row
// stride r_stride), weight [cols], bias [cols] or NULL, all of one dtype (bfloat16: is_bf16,
// else float32) -> out [rows, cols], contiguous, that dtype:
//   s = x + residual, rounded to the dtype (as PyTorch's add in that dtype rounds it),
//   mean = sum(s) / cols, var = sum((s - mean)^2) / cols (float32),
//   out = (s - mean) * (1 / sqrt(var + eps)) * weight + bias, rounded to the dtype.
// The statistics are those of the reference (fastbert.kernels.reference.layer_norm: float32
// over the rounded sum), summed in 16 lanes and then across them, so they differ from
// PyTorch's in the order of the float32 additions only. Each thread converts the weight and
// bias to float32 once and takes a chunk of rows; a row (at most MAX_COLS values) is read once
// into a float32 buffer on its stack, 16 values at a time.

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef float vf __attribute__((vector_size(64)));
typedef float vf_unaligned __attribute__((vector_size(64), aligned(4)));
typedef uint32_t vu __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint16_t vh_unaligned __attribute__((vector_size(32), aligned(2)));
enum { W = 16, MAX_COLS = 16384 };

static inline float from_bf16(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest, ties to even (NaN stays a quiet NaN), as PyTorch converts to bfloat16.
static inline uint16_t to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

// The same two conversions on 16 values at a time.
static inline vf from_bf16_16(const uint16_t* p) {
  vu bits = __builtin_convertvector(*(const vh_unaligned*)p, vu) << 16;
  vf f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static inline vu to_bf16_bits16(vf f) {
  vu bits;
  memcpy(&bits, &f, sizeof bits);
  vu rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  vi nan = (vi)((bits & 0x7fffffffu) > 0x7f800000u);
  return nan ? ((bits >> 16) | 0x0040u) : rounded;
}

static inline vf round_bf16_16(vf f) {
  vu bits = to_bf16_bits16(f) << 16;
  vf r;
  memcpy(&r, &bits, sizeof r);
  return r;
}

template <bool BF16>
static inline vf load16(const void* p, int64_t j) {
  if (BF16) return from_bf16_16((const uint16_t*)p + j);
  return *(const vf_unaligned*)((const float*)p + j);
}

template <bool BF16>
static inline void store16(void* p, int64_t j, vf f) {
  if (BF16) {
    *(vh_unaligned*)((uint16_t*)p + j) = __builtin_convertvector(to_bf16_bits16(f), vh_unaligned);
  } else {
    *(vf_unaligned*)((float*)p + j) = f;
  }
}

template <bool BF16>
static inline float load(const void* p, int64_t j) {
  if (BF16) return from_bf16(((const uint16_t*)p)[j]);
  return ((const float*)p)[j];
}

template <bool BF16>
static inline float round_to_dtype(float f) {
  return BF16 ? from_bf16(to_bf16(f)) : f;
}

template <bool BF16>
static inline void store(void* p, int64_t j, float f) {
  if (BF16) {
    ((uint16_t*)p)[j] = to_bf16(f);
  } else {
    ((float*)p)[j] = f;
  }
}

static inline float lanes_sum(vf v) {
  float total = 0.0f;
  for (int k = 0; k < W; ++k) total += v[k];
  return total;
}

template <bool BF16>
static void layer_norm_rows(const void* x, int64_t x_stride, const void* residual,
                            int64_t r_stride, int64_t rows, int64_t cols, const void* weight,
                            const void* bias, float eps, void* out, int threads) {
  const int size = BF16 ? 2 : 4;
  const int64_t whole = cols - cols % W;
#pragma omp parallel num_threads(threads)
  {
    // The weight and bias in float32 once per thread, and a row's rounded sum.
    float w[MAX_COLS] __attribute__((aligned(64)));
    float b[MAX_COLS] __attribute__((aligned(64)));
    float s[MAX_COLS] __attribute__((aligned(64)));
    for (int64_t j = 0; j < cols; ++j) {
      w[j] = load<BF16>(weight, j);
      b[j] = bias != nullptr ? load<BF16>(bias, j) : 0.0f;
    }
    #pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const char* xr = (const char*)x + i * x_stride * size;
      const char* rr = residual != nullptr ? (const char*)residual + i * r_stride * size : nullptr;
      for (int64_t j = 0; j < whole; j += W) {
        vf v = load16<BF16>(xr, j);
        if (rr != nullptr) {
          v += load16<BF16>(rr, j);
          if (BF16) v = round_bf16_16(v);
        }
        *(vf*)(s + j) = v;
      }
      for (int64_t j = whole; j < cols; ++j) {
        float v = load<BF16>(xr, j);
        s[j] = rr != nullptr ? round_to_dtype<BF16>(v + load<BF16>(rr, j)) : v;
      }
      vf sum16 = vf{};
      for (int64_t j = 0; j < whole; j += W) sum16 += *(const vf*)(s + j);
      float sum = lanes_sum(sum16);
      for (int64_t j = whole; j < cols; ++j) sum += s[j];
      const float mean = sum / (float)cols;
      vf sq16 = vf{};
      for (int64_t j = 0; j < whole; j += W) {
        vf d = *(const vf*)(s + j) - mean;
        sq16 += d * d;
      }
      float sq = lanes_sum(sq16);
      for (int64_t j = whole; j < cols; ++j) sq += (s[j] - mean) * (s[j] - mean);
      const float rstd = 1.0f / sqrtf(sq / (float)cols + eps);
      char* o = (char*)out + i * cols * size;
      for (int64_t j = 0; j < whole; j += W) {
        vf y = (*(const vf*)(s + j) - mean) * rstd * *(const vf*)(w + j) + *(const vf*)(b + j);
        store16<BF16>(o, j, y);
      }
      for (int64_t j = whole; j < cols; ++j) store<BF16>(o, j, (s[j] - mean) * rstd * w[j] + b[j]);
    }
  }
}

extern "C" int fastbert_layer_norm_max_cols(void) { return MAX_COLS; }

extern "C" void fastbert_layer_norm(const void* x, int64_t x_stride, const void* residual,
                                    int64_t r_stride, int64_t rows, int64_t cols,
                                    const void* weight, const void* bias, float eps, int is_bf16,
                                    void* out, int threads) {
  if (is_bf16) {
    layer_norm_rows<true>(x, x_stride, residual, r_stride, rows, cols, weight, bias, eps, out,
                          threads);
  } else {
    layer_norm_rows<false>(x, x_stride, residual, r_stride, rows, cols, weight, bias, eps, out,
                           threads);
  }
}
