// The exact integer product of fastbert's dynamic int8 linear on a CPU without int8 dot
// products (no VNNI, no AMX): fastbert.kernels.cpu_int8_product compiles this file at first use
// (-O3 -march=native -fopenmp) in two builds, on AVX2's 256-bit registers (-mno-avx512f) and,
// with -DFASTBERT_BYTES_512, on AVX-512 BW's 512-bit ones, and calls it through ctypes.
//
// fastbert_int8_panel_columns: the columns of one panel in this build (2 registers of int32s).
// fastbert_pack_int8_panels: int8 weight [n, k] (row stride k) -> panels
//   [ceil(n / columns)][ceil(k / 4)][columns][4 terms], zeros past n and k. Returns 0, or 1
//   (nothing packed) when the weight holds -128.
// fastbert_int8_panels_product: int8 a [m, k] (row stride lda) times the packed weight ->
//   int32 c [m, n] (row stride ldc), c[i][j] = sum_t a[i][t] * weight[j][t], exact.
//
// Why it is exact: the byte multiply-add (vpmaddubsw) multiplies unsigned bytes by signed ones
// and adds neighbouring products in 16 bits, saturating. Here the unsigned side is |a| (at
// most 128) and the signed side the weight with a's sign moved onto it, so every pair sum is
// at most 2 x 128 x 127 = 32,512 in magnitude and never saturates; a weight of -128 would have
// no positive counterpart, hence the refusal. A multiply-add of 16-bit words by ones (vpmaddwd)
// then adds the pairs into 32 bits. Per register of products that is four instructions, two of
// them multiplies, where oneDNN's int8 product here either pairs full-range operands in 16 bits
// (saturating) or runs its reference loop.

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#if defined(FASTBERT_BYTES_512)
#ifndef __AVX512BW__
#error "the 512-bit build of fastbert's int8 byte product needs AVX-512 BW"
#endif
typedef __m512i vec;
enum { LANES = 16 };  // int32 sums per register
static inline vec load(const int8_t* p) { return _mm512_loadu_si512((const void*)p); }
static inline void store(int32_t* p, vec v) { _mm512_storeu_si512((void*)p, v); }
static inline vec broadcast(int32_t four) { return _mm512_set1_epi32(four); }
static inline vec zeros() { return _mm512_setzero_si512(); }
static inline vec ones16() { return _mm512_set1_epi16(1); }
static inline vec magnitude(vec a) { return _mm512_abs_epi8(a); }
// w with each byte negated where a's byte is negative (AVX-512 has no vpsignb; where a is 0,
// |a| = 0 makes the product 0 either way).
static inline vec signed_as(vec w, vec a) {
  return _mm512_mask_sub_epi8(w, _mm512_movepi8_mask(a), _mm512_setzero_si512(), w);
}
static inline vec pair_sums(vec u, vec s) { return _mm512_maddubs_epi16(u, s); }
static inline vec widened(vec pairs, vec ones) { return _mm512_madd_epi16(pairs, ones); }
static inline vec add(vec x, vec y) { return _mm512_add_epi32(x, y); }
#else
#ifndef __AVX2__
#error "fastbert's int8 byte product needs AVX2"
#endif
typedef __m256i vec;
enum { LANES = 8 };
static inline vec load(const int8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
static inline void store(int32_t* p, vec v) { _mm256_storeu_si256((__m256i*)p, v); }
static inline vec broadcast(int32_t four) { return _mm256_set1_epi32(four); }
static inline vec zeros() { return _mm256_setzero_si256(); }
static inline vec ones16() { return _mm256_set1_epi16(1); }
static inline vec magnitude(vec a) { return _mm256_abs_epi8(a); }
static inline vec signed_as(vec w, vec a) { return _mm256_sign_epi8(w, a); }
static inline vec pair_sums(vec u, vec s) { return _mm256_maddubs_epi16(u, s); }
static inline vec widened(vec pairs, vec ones) { return _mm256_madd_epi16(pairs, ones); }
static inline vec add(vec x, vec y) { return _mm256_add_epi32(x, y); }
#endif

enum {
  ROWS = 4,              // rows one call of the inner kernel multiplies
  COLUMNS = 2 * LANES,   // columns of a panel: two registers of int32 sums
  TERMS = 4,             // consecutive k terms each int32 lane sums per step
  ROW_BLOCK = 64,        // rows a thread keeps in cache while the panels pass by
  STEP = COLUMNS * TERMS // bytes of a panel per step
};

extern "C" int fastbert_int8_panel_columns() { return COLUMNS; }

extern "C" int fastbert_pack_int8_panels(const int8_t* weight, int64_t n, int64_t k,
                                         int8_t* panels) {
  for (int64_t i = 0; i < n * k; ++i) {
    if (weight[i] == -128) return 1;
  }
  const int64_t groups = (k + TERMS - 1) / TERMS;
  const int64_t count = (n + COLUMNS - 1) / COLUMNS;
  memset(panels, 0, count * groups * STEP);
  for (int64_t j = 0; j < n; ++j) {
    int8_t* column = panels + (j / COLUMNS) * groups * STEP + (j % COLUMNS) * TERMS;
    for (int64_t t = 0; t < k; ++t) {
      column[(t / TERMS) * STEP + t % TERMS] = weight[j * k + t];
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

// sum += a's four terms (broadcast) times the panel's columns of them, in two registers.
static inline void step(int32_t four, vec w0, vec w1, vec ones, vec& sum0, vec& sum1) {
  const vec a = broadcast(four);
  const vec u = magnitude(a);
  sum0 = add(sum0, widened(pair_sums(u, signed_as(w0, a)), ones));
  sum1 = add(sum1, widened(pair_sums(u, signed_as(w1, a)), ones));
}

// R rows of a from row `a` times one panel -> c's R x `columns` block (columns <= COLUMNS).
template <int R>
static void rows_times_panel(const int8_t* a, int64_t lda, int64_t k, const int8_t* panel,
                             int32_t* c, int64_t ldc, int64_t columns) {
  vec sum[R][2];
  for (int r = 0; r < R; ++r) sum[r][0] = sum[r][1] = zeros();
  const vec ones = ones16();
  const int64_t whole = k / TERMS;
  for (int64_t g = 0; g < whole; ++g) {
    const vec w0 = load(panel + g * STEP);
    const vec w1 = load(panel + g * STEP + STEP / 2);
    for (int r = 0; r < R; ++r) {
      int32_t four;
      memcpy(&four, a + r * lda + g * TERMS, TERMS);
      step(four, w0, w1, ones, sum[r][0], sum[r][1]);
    }
  }
  if (k % TERMS) {  // the last group of fewer than four terms
    const vec w0 = load(panel + whole * STEP);
    const vec w1 = load(panel + whole * STEP + STEP / 2);
    for (int r = 0; r < R; ++r) {
      step(terms(a + r * lda, whole, k), w0, w1, ones, sum[r][0], sum[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    if (columns == COLUMNS) {
      store(c + r * ldc, sum[r][0]);
      store(c + r * ldc + LANES, sum[r][1]);
    } else {
      int32_t whole_row[COLUMNS];
      store(whole_row, sum[r][0]);
      store(whole_row + LANES, sum[r][1]);
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
      const int8_t* panel = panels + p * groups * STEP;
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
