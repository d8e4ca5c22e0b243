// The exact integer product of fastbert's dynamic int8 linear on a CPU without int8 dot
// products (no VNNI, no AMX): fastbert.kernels.cpu_int8_product compiles this file at first use
// (-O3 -march=native -fopenmp) in two builds, on AVX2's 256-bit registers (-mno-avx512f) and,
// with -DFASTBERT_BYTES_512, on AVX-512 BW's 512-bit ones, and calls it through ctypes.
//
// fastbert_int8_panel_columns: the columns of one panel in this build (24 AVX2, 32 AVX-512).
// fastbert_pack_int8_panels: int8 weight [n, k] (row stride k) -> panels
//   [ceil(n / columns)][ceil(k / 4)][columns][4 terms], zeros past n and k. Returns 0, or 1
//   when the weight holds -128 (the panels, part written, are then not used).
// fastbert_int8_panels_product: int8 a [m, k] (row stride lda; k a multiple of 4, the
//   caller pads) times the packed weight -> int32 c [m, n] (row stride ldc),
//   c[i][j] = sum_t a[i][t] * weight[j][t], exact.
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
// int32 sums per register; registers of sums per panel row and rows per step, which the 32
// registers hold with the weights' and the broadcast's.
enum { LANES = 16, REGISTERS = 2, ROWS = 4 };
#define SIMD(op) _mm512_##op
#define WHOLE(op) _mm512_##op##_si512
// w with each byte negated where a's byte is negative (AVX-512 has no vpsignb; where a is 0,
// |a| = 0 makes the product 0 either way).
static inline vec signed_as(vec w, vec a) {
  return _mm512_mask_sub_epi8(w, _mm512_movepi8_mask(a), _mm512_setzero_si512(), w);
}
#else
#ifndef __AVX2__
#error "fastbert's int8 byte product needs AVX2"
#endif
typedef __m256i vec;
// Within AVX2's 16 registers: 2 x 3 sums, 3 of weights, the broadcast and its magnitude.
enum { LANES = 8, REGISTERS = 3, ROWS = 2 };
#define SIMD(op) _mm256_##op
#define WHOLE(op) _mm256_##op##_si256
static inline vec signed_as(vec w, vec a) { return _mm256_sign_epi8(w, a); }
#endif

// The operations both widths name alike.
static inline vec load(const int8_t* p) { return WHOLE(loadu)((const vec*)p); }
static inline void store(int32_t* p, vec v) { WHOLE(storeu)((vec*)p, v); }
static inline vec zeros() { return WHOLE(setzero)(); }
static inline vec broadcast(int32_t four) { return SIMD(set1_epi32)(four); }
static inline vec ones16() { return SIMD(set1_epi16)(1); }
static inline vec magnitude(vec a) { return SIMD(abs_epi8)(a); }
static inline vec pair_sums(vec u, vec s) { return SIMD(maddubs_epi16)(u, s); }
static inline vec widened(vec pairs, vec ones) { return SIMD(madd_epi16)(pairs, ones); }
static inline vec add(vec x, vec y) { return SIMD(add_epi32)(x, y); }

enum {
  COLUMNS = REGISTERS * LANES, // columns of a panel: REGISTERS registers of int32 sums
  TERMS = 4,                   // consecutive k terms each int32 lane sums per step
  ROW_BLOCK = 64,              // rows a thread keeps in cache while the panels pass by
  STEP = COLUMNS * TERMS       // bytes of a panel per step
};

extern "C" int fastbert_int8_panel_columns() { return COLUMNS; }

extern "C" int fastbert_pack_int8_panels(const int8_t* weight, int64_t n, int64_t k,
                                         int8_t* panels) {
  const int64_t groups = (k + TERMS - 1) / TERMS;
  const int64_t count = (n + COLUMNS - 1) / COLUMNS;
  memset(panels, 0, count * groups * STEP);
  for (int64_t j = 0; j < n; ++j) {
    int8_t* column = panels + (j / COLUMNS) * groups * STEP + (j % COLUMNS) * TERMS;
    for (int64_t t = 0; t < k; ++t) {
      const int8_t w = weight[j * k + t];
      if (w == -128) return 1;
      column[(t / TERMS) * STEP + t % TERMS] = w;
    }
  }
  return 0;
}

// R rows of a from row `a` times one panel -> c's R x `columns` block (columns <= COLUMNS);
// k is a multiple of TERMS.
template <int R>
static void rows_times_panel(const int8_t* a, int64_t lda, int64_t k, const int8_t* panel,
                             int32_t* c, int64_t ldc, int64_t columns) {
  vec sum[R][REGISTERS];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < REGISTERS; ++v) sum[r][v] = zeros();
  }
  const vec ones = ones16();
  for (int64_t g = 0; g < k / TERMS; ++g) {
    vec w[REGISTERS];
    for (int v = 0; v < REGISTERS; ++v) w[v] = load(panel + g * STEP + v * LANES * TERMS);
    for (int r = 0; r < R; ++r) {
      int32_t four;  // a's four terms, broadcast; the weights take their signs
      memcpy(&four, a + r * lda + g * TERMS, TERMS);
      const vec av = broadcast(four);
      const vec u = magnitude(av);
      for (int v = 0; v < REGISTERS; ++v) {
        sum[r][v] = add(sum[r][v], widened(pair_sums(u, signed_as(w[v], av)), ones));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    int32_t row[COLUMNS];
    for (int v = 0; v < REGISTERS; ++v) store(row + v * LANES, sum[r][v]);
    memcpy(c + r * ldc, row, columns * sizeof(int32_t));
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
