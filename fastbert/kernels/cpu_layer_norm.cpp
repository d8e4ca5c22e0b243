// LayerNorm(x + residual) over rows, and the embeddings' LayerNorm of three gathered table
// rows, each in one pass over memory: fastbert.kernels.cpu_layer_norm compiles this file at
// first use (-O3 -march=native -fopenmp) and calls it through ctypes.
//
// fastbert_layer_norm: x [rows, cols] (row stride x_stride), residual [rows, cols] or NULL (row
// stride r_stride), weight [cols], bias [cols] or NULL, all of one dtype (bfloat16: is_bf16,
// else float32) -> out [rows, cols], contiguous, that dtype:
//   s = x + residual, rounded to the dtype (as PyTorch's add in that dtype rounds it),
//   mean = sum(s) / cols, var = sum((s - mean)^2) / cols (float32),
//   out = (s - mean) * (1 / sqrt(var + eps)) * weight + bias, rounded to the dtype.
// fastbert_embeddings_layer_norm: the same with s = word[ids] + pos[positions] + type[types],
// summed in float32 in that order and not rounded (fastbert.kernels.reference's
// embeddings_layer_norm); returns 1, having written nothing, where an id is outside its table.
// The statistics are those of the reference (fastbert.kernels.reference.layer_norm: float32
// over the rounded sum), summed in two accumulators of 16 lanes and then pairwise across the
// lanes (so that the additions overlap), so they differ from PyTorch's in the order of the
// float32 additions only. Each thread converts the weight and bias to float32 once and takes a
// chunk of rows; a row (at most MAX_COLS values) is read once into a float32 buffer on its
// stack, 16 values at a time, and summed as it is read. A bfloat16 row of a multiple of 32
// columns is read as 32-bit words, its even and odd elements widened in place (a shift, a mask)
// and kept apart until they are paired again on the way out: widening 16 values into 16 lanes
// took shuffles that made the bfloat16 rows slower than float32 ones of twice the bytes
// (docs/results.md, "Measurements behind the code's choices"). On a CPU with AVX512_BF16 those
// rows are rounded to bfloat16 by its conversion instruction, two vectors at a time, instead
// of in integer arithmetic (see paired).

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define FASTBERT_BF16_CONVERSION 1
#endif

typedef float vf __attribute__((vector_size(64)));
typedef float vf_unaligned __attribute__((vector_size(64), aligned(4)));
typedef uint32_t vu __attribute__((vector_size(64)));
typedef uint32_t vu_unaligned __attribute__((vector_size(64), aligned(2)));
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

// A bfloat16 row read as 32-bit words holds its values in pairs: element 2k in a word's low
// half, 2k + 1 in its high half. Each half widens to float32 with a shift or a mask, in place,
// so a row with a multiple of 2W columns is worked on as its even and its odd elements (each
// in a float32 buffer of its own) without moving values across vector lanes.
static inline vf even_half(vu words) {
  vu bits = words << 16;
  vf f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static inline vf odd_half(vu words) {
  vu bits = words & 0xffff0000u;
  vf f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

// The words of the even and odd elements' bfloat16 values, in pairs again. vcvtne2ps2bf16
// rounds as to_bf16_bits16 does (to nearest, ties to even; a NaN stays a quiet NaN, its
// payload's top bits kept) but flushes float32 denormals to zero, so a vector holding one
// (fpclass category 0x20) is rounded in integer arithmetic: the same bits either way.
static inline vu paired(vf even, vf odd) {
#ifdef FASTBERT_BF16_CONVERSION
  const __mmask16 denormal = _mm512_fpclass_ps_mask((__m512)even, 0x20) |
                             _mm512_fpclass_ps_mask((__m512)odd, 0x20);
  if (__builtin_expect(denormal == 0, 1)) {
    // Words 0-15: the even elements, 16-31: the odd ones; interleaved into pairs.
    const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh((__m512)odd, (__m512)even);
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25,
                                           9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2,
                                           17, 1, 16, 0);
    return (vu)_mm512_permutexvar_epi16(pairs, halves);
  }
#endif
  return to_bf16_bits16(even) | (to_bf16_bits16(odd) << 16);
}

static inline float lanes_sum(vf v) {
  typedef float v8 __attribute__((vector_size(32)));
  typedef float v4 __attribute__((vector_size(16)));
  v8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
         __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// The rows a call reads: row i of source k at base[k] + (index[k] ? index[k][i] : i) *
// stride[k] elements (x and the residual, or the word, position and type tables); a null base:
// no such source.
struct Sources {
  const char* base[3];
  int64_t stride[3];
  const int64_t* index[3];
  const char* row(int k, int64_t i, int size) const {
    if (base[k] == nullptr) return nullptr;
    return base[k] + (index[k] != nullptr ? index[k][i] : i) * stride[k] * size;
  }
};

// The even and odd elements of a bfloat16 row's values 2j .. 2j + 2W - 1 (W 32-bit words)
// added to even and odd; nothing for a null row.
static inline void add_pairs(const char* row, int64_t j, vf& even, vf& odd) {
  if (row == nullptr) return;
  const vu words = *(const vu_unaligned*)((const uint16_t*)row + 2 * j);
  even += even_half(words);
  odd += odd_half(words);
}

// Row i's sum a + b + c (b, c: null where absent) into s, float32, and the sum of its values.
// ROUND: a + b rounded to the dtype (as PyTorch's add in that dtype rounds the residual sum);
// else the sum is kept in float32 (the embeddings'). PAIRS (bfloat16, cols a multiple of 2W):
// s holds the even elements, then the odd ones.
template <bool BF16, bool PAIRS, bool ROUND>
static float row_sum(const char* a, const char* b, const char* c, int64_t cols, float* s) {
  // Two accumulators (even and odd elements, or alternate vectors), so that consecutive
  // additions do not wait on each other.
  vf sum_a = vf{}, sum_b = vf{};
  float sum = 0.0f;
  if (PAIRS) {
    const int64_t half = cols / 2;
    for (int64_t j = 0; j < half; j += W) {
      vu aw = *(const vu_unaligned*)((const uint16_t*)a + 2 * j);
      vf even = even_half(aw), odd = odd_half(aw);
      add_pairs(b, j, even, odd);
      add_pairs(c, j, even, odd);
      if (ROUND && b != nullptr) {
        vu rounded = paired(even, odd);
        even = even_half(rounded);
        odd = odd_half(rounded);
      }
      *(vf*)(s + j) = even;
      *(vf*)(s + half + j) = odd;
      sum_a += even;
      sum_b += odd;
    }
    return lanes_sum(sum_a + sum_b);
  }
  const int64_t whole = cols - cols % W;
  for (int64_t j = 0; j < whole; j += W) {
    vf v = load16<BF16>(a, j);
    if (b != nullptr) v += load16<BF16>(b, j);
    if (c != nullptr) v += load16<BF16>(c, j);
    if (BF16 && ROUND && b != nullptr) v = round_bf16_16(v);
    *(vf*)(s + j) = v;
    if ((j / W) % 2 == 0) {
      sum_a += v;
    } else {
      sum_b += v;
    }
  }
  sum = lanes_sum(sum_a + sum_b);
  for (int64_t j = whole; j < cols; ++j) {
    float v = load<BF16>(a, j);
    if (b != nullptr) v += load<BF16>(b, j);
    if (c != nullptr) v += load<BF16>(c, j);
    s[j] = ROUND && b != nullptr ? round_to_dtype<BF16>(v) : v;
    sum += s[j];
  }
  return sum;
}

// out = (s - mean) * rstd * w + b for one row, w and b laid out as s is.
template <bool BF16, bool PAIRS>
static void write_row(const float* s, int64_t cols, float mean, float rstd, const float* w,
                      const float* b, char* o) {
  if (PAIRS) {
    const int64_t half = cols / 2;
    for (int64_t j = 0; j < half; j += W) {
      vf even = (*(const vf*)(s + j) - mean) * rstd * *(const vf*)(w + j) + *(const vf*)(b + j);
      vf odd = (*(const vf*)(s + half + j) - mean) * rstd * *(const vf*)(w + half + j) +
               *(const vf*)(b + half + j);
      *(vu_unaligned*)((uint16_t*)o + 2 * j) = paired(even, odd);
    }
    return;
  }
  const int64_t whole = cols - cols % W;
  for (int64_t j = 0; j < whole; j += W) {
    vf y = (*(const vf*)(s + j) - mean) * rstd * *(const vf*)(w + j) + *(const vf*)(b + j);
    store16<BF16>(o, j, y);
  }
  for (int64_t j = whole; j < cols; ++j) store<BF16>(o, j, (s[j] - mean) * rstd * w[j] + b[j]);
}

// The sum of (s[j] - mean)^2 over a row, in two accumulators as row_sum sums.
static inline float squares_sum(const float* s, int64_t cols, float mean) {
  const int64_t whole = cols - cols % W;
  vf sq_a = vf{}, sq_b = vf{};
  int64_t j = 0;
  for (; j + 2 * W <= whole; j += 2 * W) {
    vf d_a = *(const vf*)(s + j) - mean, d_b = *(const vf*)(s + j + W) - mean;
    sq_a += d_a * d_a;
    sq_b += d_b * d_b;
  }
  if (j < whole) {
    vf d = *(const vf*)(s + j) - mean;
    sq_a += d * d;
  }
  float sq = lanes_sum(sq_a + sq_b);
  for (j = whole; j < cols; ++j) sq += (s[j] - mean) * (s[j] - mean);
  return sq;
}

template <bool BF16, bool PAIRS, bool ROUND>
static void layer_norm_rows(const Sources& in, int64_t rows, int64_t cols, const void* weight,
                            const void* bias, float eps, void* out, int threads) {
  const int size = BF16 ? 2 : 4;
  const int64_t half = cols / 2;
#pragma omp parallel num_threads(threads)
  {
    // The weight and bias in float32 once per thread (in PAIRS, their even elements, then
    // their odd ones), and a row's rounded sum.
    float w[MAX_COLS] __attribute__((aligned(64)));
    float b[MAX_COLS] __attribute__((aligned(64)));
    float s[MAX_COLS] __attribute__((aligned(64)));
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t at = PAIRS ? (j % 2) * half + j / 2 : j;
      w[at] = load<BF16>(weight, j);
      b[at] = bias != nullptr ? load<BF16>(bias, j) : 0.0f;
    }
    #pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const float mean = row_sum<BF16, PAIRS, ROUND>(in.row(0, i, size), in.row(1, i, size),
                                                     in.row(2, i, size), cols, s) /
                         (float)cols;
      const float sq = squares_sum(s, cols, mean);
      const float rstd = 1.0f / sqrtf(sq / (float)cols + eps);
      write_row<BF16, PAIRS>(s, cols, mean, rstd, w, b, (char*)out + i * cols * size);
    }
  }
}

extern "C" int fastbert_layer_norm_max_cols(void) { return MAX_COLS; }

template <bool ROUND>
static void layer_norm_sources(const Sources& in, int64_t rows, int64_t cols, const void* weight,
                               const void* bias, float eps, int is_bf16, void* out,
                               int threads) {
  if (is_bf16 && cols % (2 * W) == 0) {
    layer_norm_rows<true, true, ROUND>(in, rows, cols, weight, bias, eps, out, threads);
  } else if (is_bf16) {
    layer_norm_rows<true, false, ROUND>(in, rows, cols, weight, bias, eps, out, threads);
  } else {
    layer_norm_rows<false, false, ROUND>(in, rows, cols, weight, bias, eps, out, threads);
  }
}

extern "C" void fastbert_layer_norm(const void* x, int64_t x_stride, const void* residual,
                                    int64_t r_stride, int64_t rows, int64_t cols,
                                    const void* weight, const void* bias, float eps, int is_bf16,
                                    void* out, int threads) {
  const Sources in{{(const char*)x, (const char*)residual, nullptr},
                   {x_stride, r_stride, 0},
                   {nullptr, nullptr, nullptr}};
  layer_norm_sources<true>(in, rows, cols, weight, bias, eps, is_bf16, out, threads);
}

// tables[k]: [table_rows[k], cols] (row stride strides[k]); ids[k]: [rows] int64, each below
// table_rows[k] (checked here first: 1 where one is not, with nothing written).
extern "C" int fastbert_embeddings_layer_norm(const void* const* tables, const int64_t* strides,
                                              const int64_t* table_rows,
                                              const int64_t* const* ids, int64_t rows,
                                              int64_t cols, const void* weight, const void* bias,
                                              float eps, int is_bf16, void* out, int threads) {
  for (int k = 0; k < 3; k++)
    for (int64_t i = 0; i < rows; i++)
      if (ids[k][i] < 0 || ids[k][i] >= table_rows[k]) return 1;
  const Sources in{{(const char*)tables[0], (const char*)tables[1], (const char*)tables[2]},
                   {strides[0], strides[1], strides[2]},
                   {ids[0], ids[1], ids[2]}};
  layer_norm_sources<false>(in, rows, cols, weight, bias, eps, is_bf16, out, threads);
  return 0;
}
