// The exact integer product of fastbert's dynamic int8 linear on a CPU with AVX2 but without
// int8 dot products (no VNNI, no AMX): fastbert.kernels.cpu_int8_product compiles this file at
// first use (-O3 -march=native -fopenmp) and calls it through ctypes.
//
// fastbert_pack_int8_panels: int8 weight [n, k] (row stride k) -> panels
//   [ceil(n / 16)][ceil(k / 4)][16 columns][4 terms], zeros past n and k. Returns 0, or 1
//   (nothing packed) when the weight holds -128.
// fastbert_int8_panels_product: int8 a [m, k] (row stride lda) times the packed weight ->
//   int32 c [m, n] (row stride ldc), c[i][j] = sum_t a[i][t] * weight[j][t], exact.
//
// Why it is exact: AVX2's byte multiply-add (vpmaddubsw) multiplies unsigned bytes by signed
// ones and adds neighbouring products in 16 bits, saturating. Here the unsigned side is |a|
// (at most 128) and the signed side the weight with a's sign moved onto it (vpsignb), so every
// pair sum is at most 2 x 128 x 127 = 32,512 in magnitude and never saturates; a weight of -128
// would have no positive counterpart, hence the refusal. A multiply-add of 16-bit words by ones
// (vpmaddwd) then adds the pairs into 32 bits. Per 32 products that is four instructions, two
// of them multiplies: about twice the float32 FMA rate, where oneDNN's int8 product here either
// pairs full-range operands in 16 bits (saturating) or runs its reference loop.

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#ifndef __AVX2__
#error "fastbert's int8 byte product needs AVX2"
#endif

enum {
  ROWS = 4,      // rows of a one call of the inner kernel multiplies
  COLUMNS = 16,  // columns of a panel: two registers of eight int32 sums
  TERMS = 4,     // consecutive k terms each int32 lane of a register sums per step
  ROW_BLOCK = 64 // rows a thread keeps in cache while the panels pass by
};

extern "C" int fastbert_pack_int8_panels(const int8_t* weight, int64_t n, int64_t k,
                                         int8_t* panels) {
  for (int64_t i = 0; i < n * k; ++i) {
    if (weight[i] == -128) return 1;
  }
  const int64_t groups = (k + TERMS - 1) / TERMS;
  const int64_t count = (n + COLUMNS - 1) / COLUMNS;
  memset(panels, 0, count * groups * COLUMNS * TERMS);
  for (int64_t j = 0; j < n; ++j) {
    int8_t* column = panels + (j / COLUMNS) * groups * COLUMNS * TERMS + (j % COLUMNS) * TERMS;
    for (int64_t t = 0; t < k; ++t) {
      column[(t / TERMS) * COLUMNS * TERMS + t % TERMS] = weight[j * k + t];
    }
  }
  return 0;
}

// The row's terms from 4 * group to its end (fewer than four), zeros after them.
static inline int32_t terms(const int8_t* row, int64_t group, int64_t k) {
  int32_t v = 0;
  const int64_t start = group * TERMS;
  memcpy(&v, row + start, k - start < TERMS ? k - start : TERMS);
  return v;
}

// sum += a's four terms (broadcast) times the panel's 16 columns of them, in two registers.
static inline void step(int32_t four, __m256i w0, __m256i w1, __m256i ones, __m256i& sum0,
                        __m256i& sum1) {
  const __m256i a = _mm256_set1_epi32(four);
  const __m256i magnitude = _mm256_abs_epi8(a);
  const __m256i pairs0 = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(w0, a));
  const __m256i pairs1 = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(w1, a));
  sum0 = _mm256_add_epi32(sum0, _mm256_madd_epi16(pairs0, ones));
  sum1 = _mm256_add_epi32(sum1, _mm256_madd_epi16(pairs1, ones));
}

// R rows of a from row `a` times one panel -> c's R x `columns` block (columns <= 16).
template <int R>
static void rows_times_panel(const int8_t* a, int64_t lda, int64_t k, const int8_t* panel,
                             int32_t* c, int64_t ldc, int64_t columns) {
  __m256i sum[R][2];
  for (int r = 0; r < R; ++r) sum[r][0] = sum[r][1] = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t whole = k / TERMS;
  for (int64_t g = 0; g < whole; ++g) {
    const __m256i w0 = _mm256_loadu_si256((const __m256i*)(panel + g * COLUMNS * TERMS));
    const __m256i w1 = _mm256_loadu_si256((const __m256i*)(panel + g * COLUMNS * TERMS + 32));
    for (int r = 0; r < R; ++r) {
      int32_t four;
      memcpy(&four, a + r * lda + g * TERMS, TERMS);
      step(four, w0, w1, ones, sum[r][0], sum[r][1]);
    }
  }
  if (k % TERMS) {  // the last group of fewer than four terms
    const __m256i w0 = _mm256_loadu_si256((const __m256i*)(panel + whole * COLUMNS * TERMS));
    const __m256i w1 = _mm256_loadu_si256((const __m256i*)(panel + whole * COLUMNS * TERMS + 32));
    for (int r = 0; r < R; ++r) {
      step(terms(a + r * lda, whole, k), w0, w1, ones, sum[r][0], sum[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    if (columns == COLUMNS) {
      _mm256_storeu_si256((__m256i*)(c + r * ldc), sum[r][0]);
      _mm256_storeu_si256((__m256i*)(c + r * ldc + 8), sum[r][1]);
    } else {
      int32_t whole_row[COLUMNS];
      _mm256_storeu_si256((__m256i*)whole_row, sum[r][0]);
      _mm256_storeu_si256((__m256i*)(whole_row + 8), sum[r][1]);
      memcpy(c + r * ldc, whole_row, columns * sizeof(int32_t));
    }
  }
}

extern "C" void fastbert_int8_panels_product(const int8_t* a, int64_t m, int64_t k, int64_t lda,
                                             const int8_t* panels, int64_t n, int32_t* c,
                                             int64_t ldc, int threads) {
  const int64_t groups = (k + TERMS - 1) / TERMS;
  const int64_t count = (n + COLUMNS - 1) / COLUMNS;
  const int64_t blocks = (m + ROW_BLOCK - 1) / ROW_BLOCK;
#pragma omp parallel for num_threads(threads) schedule(static) collapse(2)
  for (int64_t block = 0; block < blocks; ++block) {
    for (int64_t p = 0; p < count; ++p) {
      const int8_t* panel = panels + p * groups * COLUMNS * TERMS;
      const int64_t columns = n - p * COLUMNS < COLUMNS ? n - p * COLUMNS : COLUMNS;
      const int64_t end = (block + 1) * ROW_BLOCK < m ? (block + 1) * ROW_BLOCK : m;
      int64_t i = block * ROW_BLOCK;
      for (; i + ROWS <= end; i += ROWS) {
        rows_times_panel<ROWS>(a + i * lda, lda, k, panel, c + i * ldc + p * COLUMNS, ldc,
                               columns);
      }
      for (; i < end; ++i) {
        rows_times_panel<1>(a + i * lda, lda, k, panel, c + i * ldc + p * COLUMNS, ldc, columns);
      }
    }
  }
}
