// GELU of bfloat16 values by table, in place: fastbert.kernels.cpu_gelu compiles this file at
// first use (-O3 -march=native -fopenmp) and calls it through ctypes.
//
// fastbert_gelu_bf16_table: table [65537] uint16 (entry b: the bfloat16 bits of GELU of the
// bfloat16 value with bits b; one entry of padding), data [count] bfloat16 (uint16_t), threads
// -> data[i] = table[data[i]]. A bfloat16 input has 65,536 values, so GELU of one, rounded to
// bfloat16, is a lookup: 32 values a load, their 16-bit indices widened to 32 bits, two
// 16-lane gathers (each reads 4 bytes at an entry: the padding keeps the last in bounds) whose
// low halves are the results. A gather of 16 lanes costs less than the ~25 vector operations
// of an erf to float32 accuracy (docs/results.md, "GELU by table").

#include <immintrin.h>
#include <stdint.h>

#if !defined(__AVX512F__) || !defined(__AVX512BW__)
#error "cpu_gelu.cpp needs AVX512F and AVX512BW (-march=native on a CPU that has them)"
#endif

enum { VALUES = 32 };  // bfloat16 values in a 64-byte vector

extern "C" void fastbert_gelu_bf16_table(const uint16_t* table, uint16_t* data, int64_t count,
                                         int threads) {
  const int64_t whole = count / VALUES * VALUES;
  // Words 0, 2, 4, ... of the two gathers' 32-bit lanes: their low halves, in order.
  const __m512i low_halves = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40,
                                              38, 36, 34, 32, 30, 28, 26, 24, 22, 20, 18, 16,
                                              14, 12, 10, 8, 6, 4, 2, 0);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < whole; i += VALUES) {
    const __m512i bits = _mm512_loadu_si512(data + i);
    const __m512i first = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(bits));
    const __m512i second = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(bits, 1));
    const __m512i found_first = _mm512_i32gather_epi32(first, (const int*)table, 2);
    const __m512i found_second = _mm512_i32gather_epi32(second, (const int*)table, 2);
    _mm512_storeu_si512(data + i,
                        _mm512_permutex2var_epi16(found_first, low_halves, found_second));
  }
  for (int64_t i = whole; i < count; i++) data[i] = table[data[i]];
}
