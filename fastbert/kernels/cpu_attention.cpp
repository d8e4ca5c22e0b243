// Attention of bfloat16 or float32 sequences on a CPU with AVX512_BF16, and of float32 ones on
// a CPU with AVX2 and FMA or AVX-512: fastbert.kernels.cpu_attention compiles this file at
// first use (-O3 -march=native -fopenmp, with -mno-avx512bf16 or -mno-avx512f for the
// float32-only builds) and calls it through ctypes. A vector (GCC's vector extensions) is W
// floats, a register's width: 16 with AVX-512, 8 with AVX2 alone; every build sums in the same
// order (the softmax's sum in 16 lanes either way), so the float32 builds give the same bits.
//
// For each sequence s and head h: the queries at tokens starts[s] .. + queries[s] - 1 attend
//   out = softmax(scale * q k^T + bias) v
// over the keys and values at tokens starts[s] .. + lengths[s] - 1 (lengths[s] <= queries[s]:
// a right-padded row's real tokens; equal for packed sequences). No other token is read or
// written; a query without keys gets zeros. Optional, by the distance j - i of key j from
// query i (both counted from the sequence's first token):
// - bias: float32 [H][bias_width], bias_width = 2P - 1 for P >= every queries[s] and
//   lengths[s] rounded up to 16; query i and key j add bias[h][P - 1 + j - i] (MPNet's
//   relative position bias, looked up per distance by the caller);
// - window >= 0: query i attends only keys with |j - i| <= window (ModernBERT's local
//   layers); key blocks wholly outside every row's window are skipped;
// - rotary_cos, rotary_sin: float32 [P][D/2] (P >= every queries[s] and lengths[s]): q and k
//   rotated by RoPE at their positions first, each token's halves (x1, x2) -> (x1 cos - x2 sin,
//   x2 cos + x1 sin) in float32 with its position's row, rounded to the dtype once (as
//   fastbert.kernels.reference.rotary_positions rotates them), into per-thread scratch.
// q, k, v: bfloat16 (uint16_t) or float32, element (token t, head h, dim d) at
// t * token_stride + h * head_stride + d, the same strides for all three (views of one fused
// QKV tensor). out: the same dtype, contiguous [tokens, H, D], a sequence's token at the same
// index as its input.
//
// bfloat16: q k^T from exact bfloat16 products summed in float32 (vdpbf16ps), the softmax and
// P @ V in float32 with P unrounded (V widened exactly), the result rounded to bfloat16 once.
// float32: every step in float32 FMAs, the softmax's exp as 2^t, t = (s - max) log2(e) from one
// FMA, by a polynomial (about 1 ulp).
//
// Work: one OpenMP task per sequence, or per sequence and head when the sequences are fewer
// than four a thread (so that one sequence's heads spread over the threads too), dynamic
// schedule, a scratch buffer per thread: K transposed W x W words at a time in registers
// (bfloat16: into pairs [D/2][Lp] of 32 bits; float32: [D][Lp]; Lp is L rounded up to W,
// zeros past L), bfloat16 V widened to float32 [L][D] (float32 V is read in place; on AMX's
// tiles, below, V in pairs of keys instead), and a block of score rows [ROWS][Lp]. Queries go
// ROWS at a time so that each K or V vector loaded serves ROWS rows.
//
// AMX (built where the compiler targets AMX-BF16, used where the kernel is asked to and Linux
// grants the process the tile state): bfloat16 q k^T of 16 queries at a time on the tiles,
// the queries' rows as the A tile and the K pairs above, which are AMX's B layout, as the B
// tile; the same exact products summed in float32. The softmax stays as above; P @ V of the
// 16 queries runs on the tiles too, each probability split into two bfloat16 parts (high =
// P rounded, low = P - high rounded: their sum is within 2^-18 of P, where rounding P to
// bfloat16 as PyTorch's flash kernel does is within 2^-9) multiplying V exactly, V held as
// pairs of keys [pair_keys / 2][D] (pair_keys: L rounded up to 32, zeros past L), AMX's B
// layout; sequences of at most 16 tokens keep the vector path. Each call leaves a thread's
// tile configuration as it found it, since oneDNN's AMX kernels run on the same OpenMP
// threads.

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#if !defined(__AVX2__) || !defined(__FMA__)
#error "cpu_attention.cpp needs AVX2 and FMA (-march=native on a CPU that has them)"
#endif

// bfloat16 (fastbert_attention_bf16) only where q k^T can run on AVX512_BF16's dot products.
#ifdef __AVX512BF16__
#define FASTBERT_BF16 1
#endif

#if defined(FASTBERT_BF16) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>
#define FASTBERT_AMX 1
#endif

// W: floats per vector register. Queries go ROWS_D32 or ROWS_D64 at a time on the vector
// path (by head dimension), so that each K or V vector loaded serves that many rows; P @ V
// keeps at most SUMS vectors of sums in registers (the rest hold V and the probabilities).
#ifdef __AVX512F__
enum { W = 16, ROWS_D32 = 8, ROWS_D64 = 4, SUMS = 16 };
#else
enum { W = 8, ROWS_D32 = 8, ROWS_D64 = 8, SUMS = 8 };
#endif
enum { TILE_ROWS = 16, SUM_LANES = 16 };

typedef float vf __attribute__((vector_size(W * 4)));
typedef int32_t vi __attribute__((vector_size(W * 4)));
typedef uint32_t vu __attribute__((vector_size(W * 4)));
typedef uint16_t vh __attribute__((vector_size(W * 2)));
typedef float vf_unaligned __attribute__((vector_size(W * 4), aligned(4)));
typedef uint32_t vu_unaligned __attribute__((vector_size(W * 4), aligned(4)));
typedef uint16_t vh_unaligned __attribute__((vector_size(W * 2), aligned(2)));

// Each lane's index, written out: built by a loop in finished(), the vector cost the whole
// kernel 3-8% (the loop kept GCC from simplifying the code around it).
#ifdef __AVX512F__
static const vi LANES = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
#else
static const vi LANES = {0, 1, 2, 3, 4, 5, 6, 7};
#endif

static inline vf load(const float* p) { return *(const vf_unaligned*)p; }
static inline void store(float* p, vf x) { *(vf_unaligned*)p = x; }
// What each register width does with its own instructions, the same values either way:
// - splat: x in every lane (a broadcast; vf{} + x would cost an addition, since 0 + x is not x
//   for x = -0);
// - fused: a * b + c rounded once (every build is compiled with -ffp-contract=off, so that
//   these are its only fused multiply-adds and the float32 builds round alike);
// - nearest_integer: t rounded to an integer, ties to even;
// - times_power_of_two: p * 2^n for an integer n, exactly down to 2^-126 (below it a
//   subnormal with AVX-512's vscalefps, 0 with AVX2: far below what a softmax's sum of at
//   least 1 can show);
// - lane_max: the largest lane;
// - lane_sum: the sum of SUM_LANES lanes held in SUM_LANES / W vectors (the first W lanes
//   first), in the order of _mm512_reduce_add_ps: halves, quarters, pairs.
#ifdef __AVX512F__
static inline vf splat(float x) { return (vf)_mm512_set1_ps(x); }
static inline vf fused(vf a, vf b, vf c) { return (vf)_mm512_fmadd_ps(a, b, c); }
static inline vf nearest_integer(vf t) {
  return (vf)_mm512_roundscale_ps((__m512)t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline vf times_power_of_two(vf p, vf n) {
  return (vf)_mm512_scalef_ps((__m512)p, (__m512)n);
}
static inline float lane_max(vf x) { return _mm512_reduce_max_ps((__m512)x); }
static inline float lane_sum(const vf* x) { return _mm512_reduce_add_ps((__m512)x[0]); }
#else
static inline vf splat(float x) { return (vf)_mm256_set1_ps(x); }
static inline vf fused(vf a, vf b, vf c) { return (vf)_mm256_fmadd_ps(a, b, c); }
// 1.5 * 2^23 added and taken away (for |t| < 2^22; below that 2^t is 0 either way).
static inline vf nearest_integer(vf t) { return (t + 12582912.0f) - 12582912.0f; }
// 2^n built in the exponent field.
static inline vf times_power_of_two(vf p, vf n) {
  const vf lowest = splat(-127.0f);
  return p * (vf)((__builtin_convertvector(n < lowest ? lowest : n, vi) + 127) << 23);
}
static inline float lane_max(vf x) {
  const __m128 four = _mm_max_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
  const __m128 two = _mm_max_ps(four, _mm_permute_ps(four, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(_mm_max_ss(two, _mm_movehdup_ps(two)));
}
static inline float lane_sum(const vf* x) {
  const __m256 eight = _mm256_add_ps(x[1], x[0]);
  const __m128 four = _mm_add_ps(_mm256_extractf128_ps(eight, 1), _mm256_castps256_ps128(eight));
  const __m128 two = _mm_add_ps(four, _mm_permute_ps(four, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(two) + _mm_cvtss_f32(_mm_movehdup_ps(two));
}
#endif

// W bfloat16 -> float32, exactly.
static inline vf widen(const uint16_t* p) {
  vh h = *(const vh_unaligned*)p;
  return (vf)(__builtin_convertvector(h, vu) << 16);
}

// float32 -> bfloat16, round to nearest even; a NaN stays a NaN.
static inline vh narrow(vf x) {
  vu u = (vu)x;
  u = (x != x) ? (u | 0x400000u) : u;
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return __builtin_convertvector(u, vh);
}

// 2^t for t at most about 0 (a row's scores less its max, in base 2; a NaN stays a NaN, and
// -inf, a masked key's, gives a NaN that the caller masks): t's nearest integer n and the
// rest f in [-1/2, 1/2], 2^f by a degree-6 polynomial (a Chebyshev fit, relative error 9e-9
// before float32's rounding, about 1 ulp with it), times 2^n exactly.
static constexpr float LOG2E = 1.44269504088896341f;

static inline vf exp2_nonpositive(vf t) {
  const vf n = nearest_integer(t);
  const vf f = t - n;
  vf p = splat(1.5453163359779865e-4f);
  p = fused(p, f, splat(1.3390863314270973e-3f));
  p = fused(p, f, splat(9.618083015084267e-3f));
  p = fused(p, f, splat(5.5503569543361664e-2f));
  p = fused(p, f, splat(2.4022650718688965e-1f));
  p = fused(p, f, splat(6.931471824645996e-1f));
  p = fused(p, f, splat(1.0f));
  return times_power_of_two(p, n);
}

// Rows first .. first + count - 1 of x (those below end), D values each a row stride apart,
// fetched into the caches ahead of their use. A head's rows lie a whole token's row apart,
// beyond the hardware prefetchers' reach, and a tile or vector load waits for each: so a
// block's query rows are fetched while the block before it computes, and the next head's K
// and V rows, a block's worth at a time, while this head's blocks compute (measured:
// docs/results.md, "GELU by table, and a faster LayerNorm" and "The next head's rows fetched
// ahead"). The calls stay written out where they are used: moved into a helper function,
// the same prefetches were compiled into code that gained nothing.
template <typename T, int D>
static inline void prefetch_rows(const T* x, int64_t stride, int first, int count, int end) {
  for (int i = first; i < first + count && i < end; i++)
    for (int byte = 0; byte < D * (int)sizeof(T); byte += 64)
      _mm_prefetch((const char*)(x + (int64_t)i * stride) + byte, _MM_HINT_T0);
}

// One sequence and head, its K (and, for bfloat16, V) already in the scratch layout.
template <typename T>
struct Head {
  const T* q;
  int64_t stride;      // between tokens of q (and of v, for float32)
  int length, padded;  // L, and L rounded up to W
  float scale;
  const uint32_t* k_t;  // bfloat16: [D/2][padded] pairs (k[j][2p], k[j][2p+1]); float32: [D][padded]
  const float* v;       // [L][v_stride] float32
  int64_t v_stride;
  float* scores;  // [ROWS][padded]
  vi tail_keep;   // lanes of the last key block that hold keys
  T* out;
  int64_t out_stride;
  const float* bias;  // this head's bias at distance 0 (bias[j - i]), or none
  int window;         // -1: none
  // On the tiles (bfloat16 with AMX; else unused): V as pairs of keys [pair_keys / 2][D]
  // (zeros past L), the probabilities' two bfloat16 parts [2][TILE_ROWS][pair_keys], a block
  // of results [TILE_ROWS][D] and one of queries.
  const uint32_t* v_pairs;
  int pair_keys;  // L rounded up to 32
  uint16_t* p_parts;
  float* block;
  uint16_t* q_block;  // [TILE_ROWS][D]: the last queries when fewer than 16 remain
  int queries;        // the rows of q
  // K and V as given, their rows kv_stride apart (q's stride differs where rotated rows are
  // read from scratch), and the elements from them to the next head's K and V (0: none).
  const T* k_rows;
  const T* v_rows;
  int64_t kv_stride, next_head;
};

// The key blocks [begin, end) (multiples of W) that queries first .. last may attend: every
// block, or with a window those within it of one of them (none for a padded row's query
// beyond its keys' window: then begin == end).
struct Keys {
  int begin, end;
};

template <typename T>
static inline Keys keys_for(const Head<T>& a, int first, int last) {
  if (a.window < 0) return {0, a.padded};
  const int lo = first - a.window > 0 ? first - a.window : 0;
  const int hi = last + a.window + 1 < a.length ? last + a.window + 1 : a.length;
  if (hi <= lo) return {0, 0};
  return {lo / W * W, (hi + W - 1) / W * W};
}

// Query i's scaled scores s against keys jb .. jb + W - 1, finished: plus the bias, and -inf
// outside the window and past L.
template <typename T>
static inline vf finished(const Head<T>& a, int i, int jb, vf s) {
  if (a.bias != nullptr) s += load(a.bias + (jb - i));
  if (a.window >= 0) {
    const vi distance = LANES + (jb - i);
    s = (distance <= a.window) & (distance >= -a.window) ? s : splat(-INFINITY);
  }
  if (jb == a.padded - W) s = a.tail_keep ? s : splat(-INFINITY);  // keys past L
  return s;
}

// Softmax of one row's scores over the key blocks ``keys`` in place, given the row's max
// over them (keys past L, and outside the window: probability 0); returns 1 / sum, or 0 for
// a row without keys (its output then is zeros).
template <typename T>
static inline float softmax_row(const Head<T>& a, float* row, float row_max, Keys keys) {
  if (a.window >= 0 && row_max == -INFINITY) {  // no key in its window
    for (int jb = keys.begin; jb < keys.end; jb += W) store(row + jb, splat(0.0f));
    return 0.0f;
  }
  const int last = a.padded - W;
  const float max_log2 = row_max * LOG2E;
  vf sum[SUM_LANES / W] = {};  // key j's probability in lane j % SUM_LANES
  for (int jb = keys.begin; jb < keys.end; jb += W) {
    const vf s = load(row + jb);
    vf p = exp2_nonpositive(fused(s, splat(LOG2E), splat(-max_log2)));  // exp(s - row_max)
    if (jb == last) p = a.tail_keep ? p : splat(0.0f);
    if (a.window >= 0) p = s == splat(-INFINITY) ? splat(0.0f) : p;
    sum[jb % SUM_LANES / W] += p;
    store(row + jb, p);
  }
  return 1.0f / lane_sum(sum);
}

// Scores of ROWS queries against the keys jb .. jb + W - 1, unscaled.
#ifdef FASTBERT_BF16
template <int D, int ROWS>
static inline void key_block(const Head<uint16_t>& a, int first, int jb, vf* acc) {
  const uint32_t* q_pairs[ROWS];
  for (int r = 0; r < ROWS; r++) q_pairs[r] = (const uint32_t*)(a.q + (first + r) * a.stride);
  __m512 sums[ROWS];
  for (int r = 0; r < ROWS; r++) sums[r] = _mm512_setzero_ps();
  for (int p = 0; p < D / 2; p++) {
    __m512bh keys = (__m512bh)_mm512_loadu_si512(a.k_t + p * a.padded + jb);
    for (int r = 0; r < ROWS; r++)
      sums[r] = _mm512_dpbf16_ps(sums[r], (__m512bh)_mm512_set1_epi32(q_pairs[r][p]), keys);
  }
  for (int r = 0; r < ROWS; r++) acc[r] = (vf)sums[r];
}
#endif

template <int D, int ROWS>
static inline void key_block(const Head<float>& a, int first, int jb, vf* acc) {
  const float* q_rows[ROWS];
  for (int r = 0; r < ROWS; r++) q_rows[r] = a.q + (first + r) * a.stride;
  for (int r = 0; r < ROWS; r++) acc[r] = vf{};
  const float* k_t = (const float*)a.k_t;
  for (int d = 0; d < D; d++) {
    vf keys = load(k_t + d * a.padded + jb);
    for (int r = 0; r < ROWS; r++) acc[r] = fused(splat(q_rows[r][d]), keys, acc[r]);
  }
}

static inline void store_out(uint16_t* p, vf x) { *(vh_unaligned*)p = narrow(x); }
static inline void store_out(float* p, vf x) { store(p, x); }
static inline vf load_wide(const uint16_t* p) { return widen(p); }
static inline vf load_wide(const float* p) { return load(p); }

// What a call asks beyond plain attention (see the top of the file); for one head, bias
// points at its row's distance 0.
struct Positions {
  const float* bias;
  int window;
  const float* cos;
  const float* sin;
};

// Rows 0 .. count - 1 of x (row stride ``stride``), at positions 0 .. count - 1, rotated by
// RoPE into out [count][D]. Products and sums rounded one by one, as PyTorch's ops round
// them (no fused multiply-add).
template <typename T, int D>
__attribute__((optimize("fp-contract=off"))) static void rotate_rows(
    const T* x, int64_t stride, int count, const Positions& p, T* out) {
  constexpr int HALF = D / 2;
  for (int i = 0; i < count; i++) {
    const T* row = x + i * stride;
    T* o = out + i * D;
    for (int d = 0; d < HALF; d += W) {
      const vf x1 = load_wide(row + d), x2 = load_wide(row + HALF + d);
      const vf c = load(p.cos + i * HALF + d), s = load(p.sin + i * HALF + d);
      const vf a = x1 * c, b = x2 * s, e = x2 * c, f = x1 * s;
      store_out(o + d, a - b);
      store_out(o + HALF + d, e + f);
    }
  }
}

// The most vectors of a row's D values whose sums fit in SUMS registers beside the other
// rows' (a power of two that divides D / W).
template <int D, int ROWS>
constexpr int sum_vectors() {
  int vectors = D / W;
  while (vectors > 1 && vectors * ROWS > SUMS) vectors /= 2;
  return vectors;
}

// out rows first .. first + ROWS - 1 = (P @ V) * inverse_sum, P the rows' probabilities in
// probabilities [ROWS][padded] over the key blocks ``keys`` (unnormalised, 0 past L); the
// columns a slice of sum_vectors() vectors at a time.
template <typename T, int D, int ROWS>
static inline void weighted_values(const Head<T>& a, int first, const float* probabilities,
                                   const float* inverse_sum, Keys keys) {
  constexpr int SLICE = sum_vectors<D, ROWS>();
  const int end = keys.end < a.length ? keys.end : a.length;
  for (int d = 0; d < D; d += SLICE * W) {
    vf o[ROWS][SLICE] = {};
    for (int j = keys.begin; j < end; j++) {
      for (int b = 0; b < SLICE; b++) {
        vf values = load(a.v + j * a.v_stride + d + b * W);
        for (int r = 0; r < ROWS; r++)
          o[r][b] = fused(splat(probabilities[r * a.padded + j]), values, o[r][b]);
      }
    }
    for (int r = 0; r < ROWS; r++)
      for (int b = 0; b < SLICE; b++)
        store_out(a.out + (int64_t)(first + r) * a.out_stride + d + b * W,
                  o[r][b] * inverse_sum[r]);
  }
}

// Queries first .. first + ROWS - 1: scores, softmax, P @ V, written to out.
template <typename T, int D, int ROWS>
static inline void query_rows(const Head<T>& a, int first) {
  const Keys keys = keys_for(a, first, first + ROWS - 1);
  // Not for float32 rows of 64 values: four cache lines a row, and the blocks' rows
  // fetched ahead made those heads slower.
  if (D * sizeof(T) <= 128 && a.next_head) {
    prefetch_rows<T, D>(a.k_rows + a.next_head, a.kv_stride, first, ROWS, a.length);
    prefetch_rows<T, D>(a.v_rows + a.next_head, a.kv_stride, first, ROWS, a.length);
  }
  vf row_max[ROWS];
  for (int r = 0; r < ROWS; r++) row_max[r] = splat(-INFINITY);
  for (int jb = keys.begin; jb < keys.end; jb += W) {
    vf acc[ROWS];
    key_block<D, ROWS>(a, first, jb, acc);
    for (int r = 0; r < ROWS; r++) {
      const vf s = finished(a, first + r, jb, acc[r] * a.scale);
      row_max[r] = s > row_max[r] ? s : row_max[r];
      store(a.scores + r * a.padded + jb, s);
    }
  }
  float inverse_sum[ROWS];
  for (int r = 0; r < ROWS; r++)
    inverse_sum[r] = softmax_row(a, a.scores + r * a.padded, lane_max(row_max[r]), keys);
  weighted_values<T, D, ROWS>(a, first, a.scores, inverse_sum, keys);
}

#ifdef FASTBERT_AMX
// Linux gives a process AMX's tile state only on request (ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); asked once, when the library loads.
static const bool amx_granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;

struct TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t bytes_per_row[16];
  uint8_t rows[16];
} __attribute__((packed));

// This kernel's tiles, all 16 rows of 64 bytes. q k^T: 0-1 query rows (A: 16 x 32 bfloat16;
// D = 64 takes both halves), 2-3 K pairs (B: 16 pairs of dimensions x 16 keys), 4 scores (C:
// 16 x 16 float32). P @ V: 0-1 the probabilities' high and low parts (A: 16 rows x 32 keys),
// 2 V pairs (B: 16 pairs of keys x 16 dimensions), 3 .. 3 + D / 16 - 1 the results (C).
static void configure_tiles() {
  TileConfig config = {};
  config.palette = 1;
  for (int t = 0; t < 7; t++) config.bytes_per_row[t] = 64, config.rows[t] = 16;
  _tile_loadconfig(&config);
}

// The results' dimensions d .. d + 15 (tile RESULT) += both parts of P (tiles 0 and 1) x V's
// keys first_key .. + 31 at those dimensions, V's pairs [.][D] at v_pairs (a macro: a tile's
// number is part of the instruction).
#define VALUES_TILE(RESULT, v_pairs, D, first_key, d)                     \
  do {                                                                    \
    _tile_loadd(2, (v_pairs) + (first_key) / 2 * (D) + (d), (D) * 4);     \
    _tile_dpbf16ps(RESULT, 0, 2);                                         \
    _tile_dpbf16ps(RESULT, 1, 2);                                         \
  } while (0)

// Probabilities p of keys jb .. jb + 15 as their two bfloat16 parts, at high[jb] and low[jb]
// (high = p rounded to nearest even, low = p - high rounded; both flush subnormals to zero,
// far below what a row's sum of at least 1 can show).
static inline void keep_parts(uint16_t* high, uint16_t* low, int jb, vf p) {
  const __m256bh rounded = _mm512_cvtneps_pbh((__m512)p);
  _mm256_storeu_si256((__m256i*)(high + jb), (__m256i)rounded);
  const vf rest = p - (vf)_mm512_cvtpbh_ps(rounded);
  _mm256_storeu_si256((__m256i*)(low + jb), (__m256i)_mm512_cvtneps_pbh((__m512)rest));
}

// out rows first .. first + count - 1 (count <= 16) = (P @ V) * inverse_sum on the tiles, P
// the rows' probabilities in a.scores [16][padded] over the key blocks ``keys``
// (unnormalised, 0 past L), split into their two bfloat16 parts over whole 32-key blocks
// (zeros outside ``keys`` and in the rows past count). Splitting in a pass of its own, not
// in the softmax's loop, measured faster.
template <int D>
static inline void weighted_values_tile(const Head<uint16_t>& a, int first, int count,
                                        const float* inverse_sum, Keys keys) {
  const int begin = keys.begin / 32 * 32, end = (keys.end + 31) / 32 * 32;
  uint16_t* high = a.p_parts;
  uint16_t* low = a.p_parts + TILE_ROWS * a.pair_keys;
  for (int r = 0; r < TILE_ROWS; r++)
    for (int jb = begin; jb < end; jb += W) {
      const bool kept = r < count && jb >= keys.begin && jb < keys.end;
      const vf p = kept ? load(a.scores + r * a.padded + jb) : splat(0.0f);
      keep_parts(high + r * a.pair_keys, low + r * a.pair_keys, jb, p);
    }
  _tile_zero(3);
  _tile_zero(4);
  if constexpr (D == 64) {
    _tile_zero(5);
    _tile_zero(6);
  }
  for (int kb = begin; kb < end; kb += 32) {
    _tile_loadd(0, high + kb, a.pair_keys * 2);
    _tile_loadd(1, low + kb, a.pair_keys * 2);
    VALUES_TILE(3, a.v_pairs, D, kb, 0);
    VALUES_TILE(4, a.v_pairs, D, kb, 16);
    if constexpr (D == 64) {
      VALUES_TILE(5, a.v_pairs, D, kb, 32);
      VALUES_TILE(6, a.v_pairs, D, kb, 48);
    }
  }
  _tile_stored(3, a.block, D * 4);
  _tile_stored(4, a.block + 16, D * 4);
  if constexpr (D == 64) {
    _tile_stored(5, a.block + 32, D * 4);
    _tile_stored(6, a.block + 48, D * 4);
  }
  for (int r = 0; r < count; r++)
    for (int b = 0; b < D / W; b++)
      store_out(a.out + (int64_t)(first + r) * a.out_stride + b * W,
                load(a.block + r * D + b * W) * inverse_sum[r]);
}

// Queries first .. first + count - 1 (count <= 16) of a bfloat16 head: scores on the tiles
// (scaled, -inf past L), the softmax as query_rows', and P @ V on the tiles.
template <int D>
static inline void query_tile(const Head<uint16_t>& a, int first, int count) {
  static_assert(D == 32 || D == 64, "a tile holds 32 bfloat16 of a row");
  const uint16_t* q = a.q + (int64_t)first * a.stride;
  int64_t q_stride = a.stride;
  if (count < TILE_ROWS) {  // a tile reads 16 rows: the last few copied, zeros after them
    for (int r = 0; r < TILE_ROWS; r++)
      for (int d = 0; d < D; d += W)
        *(vh_unaligned*)(a.q_block + r * D + d) =
            r < count ? *(const vh_unaligned*)(q + r * q_stride + d) : vh{};
    q = a.q_block, q_stride = D;
  }
  const Keys keys = keys_for(a, first, first + count - 1);
  prefetch_rows<uint16_t, D>(a.q, a.stride, first + TILE_ROWS, TILE_ROWS, a.queries);
  if (a.next_head) {
    prefetch_rows<uint16_t, D>(a.k_rows + a.next_head, a.kv_stride, first, TILE_ROWS, a.length);
    prefetch_rows<uint16_t, D>(a.v_rows + a.next_head, a.kv_stride, first, TILE_ROWS, a.length);
  }
  _tile_loadd(0, q, q_stride * 2);
  if constexpr (D == 64) _tile_loadd(1, q + 32, q_stride * 2);
  for (int jb = keys.begin; jb < keys.end; jb += W) {
    _tile_zero(4);
    _tile_loadd(2, a.k_t + jb, a.padded * 4);
    _tile_dpbf16ps(4, 0, 2);
    if constexpr (D == 64) {
      _tile_loadd(3, a.k_t + 16 * a.padded + jb, a.padded * 4);
      _tile_dpbf16ps(4, 1, 3);
    }
    _tile_stored(4, a.scores + jb, a.padded * 4);
  }
  float inverse_sum[TILE_ROWS];
  for (int r = 0; r < count; r++) {
    float* row = a.scores + r * a.padded;
    vf row_max = splat(-INFINITY);
    for (int jb = keys.begin; jb < keys.end; jb += W) {
      const vf s = finished(a, first + r, jb, load(row + jb) * a.scale);
      row_max = s > row_max ? s : row_max;
      store(row + jb, s);
    }
    inverse_sum[r] = softmax_row(a, row, lane_max(row_max), keys);
  }
  weighted_values_tile<D>(a, first, count, inverse_sum, keys);
}
#else
static const bool amx_granted = false;
#endif

// The W x W block of 32-bit words at rows[i * row_stride + w] (rows i < count; zeros for
// the rest) transposed into out[w * out_stride + i].
#ifndef __AVX512F__
static inline void transpose_block(const uint32_t* rows, int64_t row_stride, int count,
                                   uint32_t* out, int64_t out_stride) {
  __m256 r[W], t[W];
  for (int i = 0; i < W; i++)
    r[i] = i < count ? _mm256_loadu_ps((const float*)(rows + i * row_stride)) : _mm256_setzero_ps();
  for (int i = 0; i < W; i += 2) {  // per 128-bit lane: pairs of rows interleaved
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < W; i += 4) {  // per lane: 4 rows of one column
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // r[c], lane L: column 4L + c of rows 0 .. 3; r[4 + c] of rows 4 .. 7.
  for (int c = 0; c < 4; c++) {
    _mm256_storeu_ps((float*)(out + c * out_stride), _mm256_permute2f128_ps(r[c], r[4 + c], 0x20));
    _mm256_storeu_ps((float*)(out + (4 + c) * out_stride),
                     _mm256_permute2f128_ps(r[c], r[4 + c], 0x31));
  }
}
#else
static inline void transpose_block(const uint32_t* rows, int64_t row_stride, int count,
                                   uint32_t* out, int64_t out_stride) {
  __m512 r[W], t[W];
  for (int i = 0; i < W; i++)
    r[i] = i < count ? _mm512_loadu_ps(rows + i * row_stride) : _mm512_setzero_ps();
  for (int i = 0; i < W; i += 2) {  // per 128-bit lane: pairs of rows interleaved
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < W; i += 4) {  // per lane: 4 rows of one column (c = i % 4 .. )
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // r[4g + c], lane L: column 4L + c of rows 4g .. 4g + 3; gather each column's four lanes.
  for (int c = 0; c < 4; c++) {
    const __m512 low01 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44);
    const __m512 low23 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
    const __m512 high01 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xEE);
    const __m512 high23 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xEE);
    _mm512_storeu_ps(out + c * out_stride, _mm512_shuffle_f32x4(low01, low23, 0x88));
    _mm512_storeu_ps(out + (4 + c) * out_stride, _mm512_shuffle_f32x4(low01, low23, 0xDD));
    _mm512_storeu_ps(out + (8 + c) * out_stride, _mm512_shuffle_f32x4(high01, high23, 0x88));
    _mm512_storeu_ps(out + (12 + c) * out_stride, _mm512_shuffle_f32x4(high01, high23, 0xDD));
  }
}
#endif

template <typename T, int D, int ROWS>
static void attend(const T* q, const T* k, const T* v, int64_t stride, int length, int queries,
                   float scale, T* out, int64_t out_stride, float* scratch, bool tiles,
                   const Positions& positions, int64_t next_head) {
  const T* k_rows = k;
  const int padded = (length + W - 1) / W * W;
  constexpr bool bf16 = std::is_same_v<T, uint16_t>;
  constexpr int words = bf16 ? D / 2 : D;  // 32-bit words per key
  uint32_t* k_t = (uint32_t*)scratch;
  float* rest = scratch + words * padded;
  int64_t k_stride = stride, q_stride = stride;
  if (positions.cos != nullptr) {  // q and k rotated into scratch, then read from there
    T* rotated = (T*)rest;
    rotate_rows<T, D>(k, stride, length, positions, rotated);
    rotate_rows<T, D>(q, stride, queries, positions, rotated + (int64_t)length * D);
    k = rotated, q = rotated + (int64_t)length * D, k_stride = q_stride = D;
    rest += ((int64_t)(length + queries) * D * sizeof(T) + 63) / 64 * 16;
  }
  // The first block's query rows, while K is laid out.
  prefetch_rows<T, D>(q, q_stride, 0, TILE_ROWS, queries);
  for (int jb = 0; jb < padded; jb += W)
    for (int wb = 0; wb < words; wb += W)
      transpose_block((const uint32_t*)(k + jb * k_stride) + wb, k_stride * sizeof(T) / 4,
                      length - jb, k_t + wb * padded + jb, padded);
  float* scores = rest;
  rest += TILE_ROWS * padded;
  // At most 16 queries (one block) cost less on the vector path than the tiles' set-up.
  tiles = bf16 && tiles && queries > TILE_ROWS;
  // bfloat16 V: on the tiles, its keys in pairs (each 32-bit word two keys' values at one
  // dimension, zeros past L) [pair_keys / 2][D], then P's two parts, a block of results and
  // one of queries; else widened to float32 [L][D].
  const float* values = (const float*)v;
  int64_t v_stride = stride;
  const int pair_keys = (length + 31) / 32 * 32;
  uint32_t* v_pairs = (uint32_t*)rest;
  uint16_t* p_parts = (uint16_t*)(v_pairs + pair_keys / 2 * D);
  float* block = (float*)(p_parts + 2 * TILE_ROWS * pair_keys);
  uint16_t* q_block = (uint16_t*)(block + TILE_ROWS * D);
  if constexpr (bf16) {
    if (tiles) {
      for (int j = 0; j < pair_keys; j += 2)
        for (int d = 0; d < D; d += W) {
          const vh even = j < length ? *(const vh_unaligned*)(v + j * stride + d) : vh{};
          const vh odd = j + 1 < length ? *(const vh_unaligned*)(v + (j + 1) * stride + d) : vh{};
          *(vu_unaligned*)(v_pairs + j / 2 * D + d) =
              __builtin_convertvector(even, vu) | __builtin_convertvector(odd, vu) << 16;
        }
    } else {
      for (int j = 0; j < length; j++)
        for (int d = 0; d < D; d += W) store(rest + j * D + d, widen(v + j * stride + d));
      values = rest, v_stride = D;
    }
  }
  const Head<T> a{q,       q_stride,  length,  padded,         scale,
                  k_t,     values,    v_stride, scores,        LANES < (length - (padded - W)),
                  out,     out_stride, positions.bias, positions.window, v_pairs,
                  pair_keys, p_parts, block,   q_block, queries,
                  k_rows,  v,         stride,   next_head};
#ifdef FASTBERT_AMX
  if constexpr (bf16)
    if (tiles) {
      for (int first = 0; first < queries; first += TILE_ROWS)
        query_tile<D>(a, first, queries - first < TILE_ROWS ? queries - first : TILE_ROWS);
      return;
    }
#endif
  int first = 0;
  for (; first + ROWS <= queries; first += ROWS) query_rows<T, D, ROWS>(a, first);
  if (ROWS > 4 && first + 4 <= queries) query_rows<T, D, 4>(a, first), first += 4;
  if (first + 2 <= queries) query_rows<T, D, 2>(a, first), first += 2;
  if (first < queries) query_rows<T, D, 1>(a, first);
}

// Returns 0, or 1 for a head dimension other than 32 or 64, 2 when scratch memory ran out.
template <typename T>
static int attention(const T* q, const T* k, const T* v, int64_t token_stride,
                     int64_t head_stride, const int64_t* starts, const int64_t* lengths,
                     const int64_t* queries, int64_t sequences, int64_t heads, int64_t head_dim,
                     float scale, T* out, int threads, bool tiles, const float* bias,
                     int64_t bias_width, int window, const float* rotary_cos,
                     const float* rotary_sin) {
  if (head_dim != 32 && head_dim != 64) return 1;
  tiles = tiles && amx_granted && std::is_same_v<T, uint16_t>;
  int64_t longest = 0, most_queries = 0;
  for (int64_t s = 0; s < sequences; s++) {
    longest = lengths[s] > longest ? lengths[s] : longest;
    most_queries = queries[s] > most_queries ? queries[s] : most_queries;
  }
  const int64_t padded = (longest + W - 1) / W * W;
  // K transposed, rotated K and q, the score rows (all at most float32-sized; 16 floats of
  // slack for the rotated rows' rounding up to 64 bytes), and bfloat16 V widened or, on the
  // tiles, V's pairs, P's two parts and the blocks of results and queries.
  const int64_t rotated = rotary_cos != nullptr ? (longest + most_queries) * head_dim + 16 : 0;
  const int64_t pair_keys = (longest + 31) / 32 * 32;
  const int64_t v_and_p = pair_keys * (head_dim / 2 + TILE_ROWS) + TILE_ROWS * head_dim * 3 / 2;
  const int64_t floats = head_dim * padded + rotated + TILE_ROWS * padded +
                         (v_and_p > longest * head_dim ? v_and_p : longest * head_dim);
  const int64_t out_stride = heads * head_dim;
  // A task per sequence and part of its heads: one head a part when the sequences are few for
  // the threads (one long sequence would keep a thread busy while the others wait), all of
  // them when they are many (a task per head cost up to a fifth more on 2 threads with
  // 100-200 short sequences).
  const int64_t part_heads = sequences < 4 * (int64_t)threads ? 1 : heads;
  const int64_t parts = heads / part_heads;
  int failed = 0;
#pragma omp parallel num_threads(threads)
  {
    float* scratch = (float*)malloc((size_t)floats * sizeof(float) + 64);
    if (!scratch) {
#pragma omp atomic write
      failed = 2;
    }
#ifdef FASTBERT_AMX
    alignas(64) TileConfig found = {};
    if (tiles) _tile_storeconfig(&found), configure_tiles();
#endif
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < sequences * parts; item++) {
      const int64_t s = item / parts, first_head = item % parts * part_heads;
      const int64_t start = starts[s];
      const int length = (int)lengths[s], rows = (int)queries[s];
      if (!scratch) continue;
      if (length <= 0) {
        if (first_head == 0)
          memset(out + start * out_stride, 0, (size_t)rows * out_stride * sizeof(T));
        continue;
      }
      for (int64_t h = first_head; h < first_head + part_heads; h++) {
        const int64_t at = start * token_stride + h * head_stride;
        T* o = out + start * out_stride + h * head_dim;
        const float* b = bias != nullptr ? bias + h * bias_width + (bias_width - 1) / 2 : nullptr;
        const Positions positions{b, window, rotary_cos, rotary_sin};
        const int64_t next = h + 1 < first_head + part_heads ? head_stride : 0;
        if (head_dim == 32)
          attend<T, 32, ROWS_D32>(q + at, k + at, v + at, token_stride, length, rows, scale, o,
                           out_stride, scratch, tiles, positions, next);
        else
          attend<T, 64, ROWS_D64>(q + at, k + at, v + at, token_stride, length, rows, scale, o,
                           out_stride, scratch, tiles, positions, next);
      }
    }
    free(scratch);
#ifdef FASTBERT_AMX
    if (tiles) _tile_loadconfig(&found);  // palette 0 (none configured) releases the tiles
#endif
  }
  return failed;
}

#ifdef FASTBERT_BF16
extern "C" int fastbert_attention_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                       int64_t token_stride, int64_t head_stride,
                                       const int64_t* starts, const int64_t* lengths,
                                       const int64_t* queries, int64_t sequences, int64_t heads,
                                       int64_t head_dim, float scale, uint16_t* out,
                                       int threads, int tiles, const float* bias,
                                       int64_t bias_width, int window, const float* rotary_cos,
                                       const float* rotary_sin) {
  return attention(q, k, v, token_stride, head_stride, starts, lengths, queries, sequences,
                   heads, head_dim, scale, out, threads, tiles != 0, bias, bias_width, window,
                   rotary_cos, rotary_sin);
}
#endif

extern "C" int fastbert_attention_f32(const float* q, const float* k, const float* v,
                                      int64_t token_stride, int64_t head_stride,
                                      const int64_t* starts, const int64_t* lengths,
                                      const int64_t* queries, int64_t sequences, int64_t heads,
                                      int64_t head_dim, float scale, float* out, int threads,
                                      int tiles, const float* bias, int64_t bias_width,
                                      int window, const float* rotary_cos,
                                      const float* rotary_sin) {
  return attention(q, k, v, token_stride, head_stride, starts, lengths, queries, sequences,
                   heads, head_dim, scale, out, threads, tiles != 0, bias, bias_width, window,
                   rotary_cos, rotary_sin);
}

// Whether bfloat16 calls that ask for tiles get them: built for AMX and granted the tile state.
extern "C" int fastbert_attention_tiles() { return amx_granted; }
