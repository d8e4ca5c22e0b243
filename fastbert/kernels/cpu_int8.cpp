// The two passes around the int8 GEMM of fastbert's dynamic int8 linear on a CPU:
// fastbert.kernels.cpu_int8 compiles this file at first use (-O3 -march=native -fopenmp) and
// calls it through ctypes.
//
// fastbert_quantize_rows: float32 x [rows, cols] (row stride row_stride; times input_scale
// [cols] first when given) -> int8 q [rows, cols] and float32 scale [rows], per row
//   absmax = max(max(x), -min(x)), q = round_half_even(x * (127 / absmax)), scale = absmax / 127
// (q = 0 and scale = 0 for a row of zeros).
// fastbert_dequantize: acc [rows, cols], int32 or (acc_is_float) float32 holding integers ->
// float32 out [rows, cols] (out may be acc's own memory),
//   out = fma(float(acc) * row_scale[i], col_scale[j], bias[j])   (without bias: the product)
//         [+ residual, row stride residual_stride]
//
// Plain loops the compiler vectorises for the CPU at hand, one OpenMP chunk of rows per
// thread. Every step is the float32 operation fastbert.kernels.torch_ops takes, in its order
// (the bias added in one fused multiply-add, as torch.addcmul computes it; no other
// contraction: it is built with -ffp-contract=off), so the results are the same bits as the PyTorch ops
// they replace, in two passes instead of nine.

#include <math.h>
#include <stdint.h>

typedef float vf __attribute__((vector_size(64)));
typedef float vf_unaligned __attribute__((vector_size(64), aligned(4)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef int8_t vb __attribute__((vector_size(16)));
typedef int8_t vb_unaligned __attribute__((vector_size(16), aligned(1)));
enum { W = 16 };

// Adding and subtracting 1.5 * 2^23 rounds a float32 of magnitude below 2^22 to an integer,
// half to even: nearbyintf's result in the default rounding mode, on whole vectors.
static const float ROUNDER = 12582912.0f;

// 16 values of the row from column j: x, or x * input_scale when given.
static inline vf load16(const float* row, const float* input_scale, int64_t j) {
  vf x = *(const vf_unaligned*)(row + j);
  return input_scale != nullptr ? x * *(const vf_unaligned*)(input_scale + j) : x;
}

static inline float value(const float* row, const float* input_scale, int64_t j) {
  return input_scale != nullptr ? row[j] * input_scale[j] : row[j];
}

extern "C" void fastbert_quantize_rows(const float* x, int64_t rows, int64_t cols,
                                       int64_t row_stride, const float* input_scale, int8_t* q,
                                       float* scale, int threads) {
  const int64_t whole = cols - cols % W;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = x + i * row_stride;
    int8_t* out = q + i * cols;
    // The largest and smallest value, 16 lanes at a time and then across the lanes (a max
    // does not depend on the order it is taken in).
    vf hi16 = vf{} - INFINITY, lo16 = vf{} + INFINITY;
    for (int64_t j = 0; j < whole; j += W) {
      vf v = load16(row, input_scale, j);
      hi16 = v > hi16 ? v : hi16;
      lo16 = v < lo16 ? v : lo16;
    }
    float hi = -INFINITY, lo = INFINITY;
    for (int k = 0; k < W; ++k) {
      hi = hi16[k] > hi ? hi16[k] : hi;
      lo = lo16[k] < lo ? lo16[k] : lo;
    }
    for (int64_t j = whole; j < cols; ++j) {
      float v = value(row, input_scale, j);
      hi = v > hi ? v : hi;
      lo = v < lo ? v : lo;
    }
    float absmax = hi > -lo ? hi : -lo;
    float inv = absmax > 0.0f ? 127.0f / absmax : 0.0f;
    for (int64_t j = 0; j < whole; j += W) {
      vf r = (load16(row, input_scale, j) * inv + ROUNDER) - ROUNDER;
      *(vb_unaligned*)(out + j) = __builtin_convertvector(__builtin_convertvector(r, vi), vb);
    }
    for (int64_t j = whole; j < cols; ++j) {
      out[j] = (int8_t)nearbyintf(value(row, input_scale, j) * inv);
    }
    scale[i] = absmax / 127.0f;
  }
}

template <typename Acc>
static void dequantize_rows(const Acc* acc, int64_t rows, int64_t cols, const float* row_scale,
                            const float* col_scale, const float* bias, const float* residual,
                            int64_t residual_stride, float* out, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const Acc* a = acc + i * cols;
    float* o = out + i * cols;
    const float s = row_scale[i];
    const float* r = residual != nullptr ? residual + i * residual_stride : nullptr;
    if (bias != nullptr && r != nullptr) {
      for (int64_t j = 0; j < cols; ++j) o[j] = fmaf((float)a[j] * s, col_scale[j], bias[j]) + r[j];
    } else if (bias != nullptr) {
      for (int64_t j = 0; j < cols; ++j) o[j] = fmaf((float)a[j] * s, col_scale[j], bias[j]);
    } else if (r != nullptr) {
      for (int64_t j = 0; j < cols; ++j) o[j] = ((float)a[j] * s) * col_scale[j] + r[j];
    } else {
      for (int64_t j = 0; j < cols; ++j) o[j] = ((float)a[j] * s) * col_scale[j];
    }
  }
}

extern "C" void fastbert_dequantize(const void* acc, int acc_is_float, int64_t rows, int64_t cols,
                                    const float* row_scale, const float* col_scale,
                                    const float* bias, const float* residual,
                                    int64_t residual_stride, float* out, int threads) {
  if (acc_is_float) {
    dequantize_rows((const float*)acc, rows, cols, row_scale, col_scale, bias, residual,
                    residual_stride, out, threads);
  } else {
    dequantize_rows((const int32_t*)acc, rows, cols, row_scale, col_scale, bias, residual,
                    residual_stride, out, threads);
  }
}
