// FlashAttention-2 on the CPU, forward and backward, as two XLA FFI handlers.
//
//   z_i = sum_j p_ij v_j,  p_ij = exp(l_ij - lse_i),  lse_i = log sum_j exp(l_ij),
//   l_ij = q_i . k_j  over the keys j query i sees (causality, a boolean mask).
//
// The scale is folded into q by the caller, so one kernel serves every scaling.
// Forward (Dao 2023, "FlashAttention-2", Algorithm 1): one task per (batch,
// key/value head) packs its keys and values once (or a chunk of every C-th query
// block, where B K is under 8 tasks); each query block of BQ rows of
// each of its query heads meets the key blocks of BK keys one by one with an online softmax (running
// row max m_i and sum l_i, the output rescaled by exp(m_old - m_new)); a causal
// query block stops at its last row's key. Only the BQ x BK logits of one block
// pair exist at a time, so memory is O(T) per block (no T x S buffer).
// Backward (Algorithm 2, with D_i = do_i . o_i - dlse_i so that a gradient of
// lse, the sink's, joins dl_ij = p_ij (dp_ij - D_i)): one task per (batch,
// key/value head) walks its key blocks; for each it meets every query block of
// every query head of its group, accumulating dk and dv in the block and dq in
// the task's own float32 buffer, so no two tasks write one element: no atomics.
// Where B K is under 8, each (batch, head) splits into C chunks of every C-th key
// block, whose dq sums are added in chunk order afterwards. C follows from the
// shape, so the bits are the same whatever the number of threads.
//
// Layout: q [B, T, N, H], k [B, S, K, H], v [B, S, K, V], o [B, T, N, V], lse [B, T, N]
// (float32); query head n reads key/value head n / G, G = N / K. Inputs float32 or
// bfloat16, read into float32 tiles; every product and the softmax in float32.
// A mask is uint8 [mB, mN, mT, S] with mB, mN, mT each 1 or full (broadcast).
// A query that sees no key gets o = 0 and lse = -inf.
//
// Products run through one register-blocked micro-kernel (4 rows x 4 or 8 rows x 2
// vectors of 16 floats, a broadcast FMA per element of A) written with GCC/Clang
// vector extensions, which compile to AVX-512 with -march=native and to two or
// four narrower registers elsewhere. exp is a vectorised Cephes polynomial.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using attnscale_cpu::parallel_for;
using attnscale_cpu::to_bf16;

constexpr int BQ = 64;  // query rows per block (a multiple of 8)
constexpr int BK = 64;  // keys per block (a multiple of 16 and of 8)
constexpr int W = 16;   // floats per vector

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

inline v16 splat(float x) { return v16{} + x; }
inline v16 load(const float* p) { v16 r; std::memcpy(&r, p, sizeof(r)); return r; }
inline void store(float* p, v16 x) { std::memcpy(p, &x, sizeof(x)); }
inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

// exp(x) for a vector, Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-7
// polynomial for e^r, 2^n built in the exponent bits. Relative error ~1e-7;
// exactly 0 below -87.3 (and for -inf), so an invisible key weighs nothing.
inline v16 vexp(v16 x) {
  const v16 lo = splat(-87.3f), hi = splat(88.3f);
  v16i zero_mask = x < lo;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  v16 fx = x * 1.44269504088896341f + 0.5f;
  v16i n = __builtin_convertvector(fx, v16i);
  v16 nf = __builtin_convertvector(n, v16);
  v16i above = nf > fx;  // truncation toward 0 -> floor
  nf = above ? nf - 1.0f : nf;
  n = __builtin_convertvector(nf, v16i);
  v16 r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
  v16 y = splat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  v16i bits = (n + 127) << 23;
  v16 pow2n;
  std::memcpy(&pow2n, &bits, sizeof(pow2n));
  y = y * pow2n;
  return zero_mask ? splat(0.0f) : y;
}

inline float hmax(v16 x) {
  float r = x[0];
  for (int i = 1; i < W; ++i) r = std::max(r, x[i]);
  return r;
}

inline float hsum(v16 x) {
  // A fixed pairwise order: the same bits on every call.
  float a[W];
  std::memcpy(a, &x, sizeof(a));
  for (int w = W / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] += a[i + w];
  return a[0];
}

// C[R rows][NV vectors] (+)= A[R rows][kd] B[kd][NV vectors]: A(m, k) at
// A[m * am + k * ak] (so A may be a transposed tile), B row-major with stride ldb.
// R x NV accumulators stay in registers (16 of AVX-512's 32), one broadcast FMA per
// element of A and vector of B.
template <int R, int NV>
inline void micro(float* C, int ldc, const float* A, int am, int ak, const float* B, int ldb,
                  int kd, bool accumulate) {
  v16 c[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) c[r][v] = accumulate ? load(C + r * ldc + v * W) : splat(0.0f);
  for (int k = 0; k < kd; ++k) {
    v16 b[NV];
    for (int v = 0; v < NV; ++v) b[v] = load(B + k * ldb + v * W);
    for (int r = 0; r < R; ++r) {
      v16 a = splat(A[r * am + k * ak]);
      for (int v = 0; v < NV; ++v) c[r][v] += a * b[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) store(C + r * ldc + v * W, c[r][v]);
}

// C[m][n] (+)= sum_k A(m, k) B[k][n] for m < M (a multiple of 8), n < N (a multiple of 16):
// 4 rows x 4 vectors where N allows, 8 rows x 2 (or 1) vectors for its rest (head dim 32).
void gemm(float* C, int ldc, const float* A, int am, int ak, const float* B, int ldb, int M,
          int N, int kd, bool accumulate) {
  const int n4 = N / (4 * W) * (4 * W), rest = (N - n4) / W;
  for (int m = 0; m < M; m += 4) {
    const float* Am = A + m * am;
    float* Cm = C + m * ldc;
    for (int n = 0; n < n4; n += 4 * W)
      micro<4, 4>(Cm + n, ldc, Am, am, ak, B + n, ldb, kd, accumulate);
    if (rest == 3) micro<4, 3>(Cm + n4, ldc, Am, am, ak, B + n4, ldb, kd, accumulate);
  }
  if (rest == 3 || rest == 0) return;
  for (int m = 0; m < M; m += 8) {
    const float* Am = A + m * am;
    float* Cm = C + m * ldc + n4;
    if (rest == 2) micro<8, 2>(Cm, ldc, Am, am, ak, B + n4, ldb, kd, accumulate);
    else micro<8, 1>(Cm, ldc, Am, am, ak, B + n4, ldb, kd, accumulate);
  }
}

// Zeroed float32 scratch, 64-byte aligned, from a per-thread stack of blocks that
// only grows: a task's buffers (some 10 of them) cost a memset, not a malloc, a
// free and the page faults of fresh memory each time (measured: at T = 64 the
// backward's tasks are some 20 us of work, and two threads ran no faster than
// one while every task allocated its own). Buffers are locals, freed in reverse.
struct AlignedDelete {
  void operator()(float* p) const { ::operator delete[](p, std::align_val_t(64)); }
};

struct Arena {
  std::vector<std::pair<std::unique_ptr<float[], AlignedDelete>, size_t>> slots;
  size_t top = 0;
};

thread_local Arena arena;

class Buf {
 public:
  explicit Buf(size_t n) {
    if (arena.top == arena.slots.size()) arena.slots.emplace_back(nullptr, 0);
    auto& slot = arena.slots[arena.top++];
    if (slot.second < n) {
      slot.first.reset(new (std::align_val_t(64)) float[n]);
      slot.second = n;
    }
    p_ = slot.first.get();
    std::memset(p_, 0, sizeof(float) * n);
  }
  ~Buf() { --arena.top; }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  float* get() { return p_; }

 private:
  float* p_;
};

// float32 or bfloat16 storage, read and written as float32, a row at a time (one
// branch a row; float32 rows are copies, bfloat16 rows a shift the compiler vectorises).
struct Tensor {
  const void* data;
  bool bf16;
  void read(int64_t at, int n, float* dst) const {
    if (!bf16) {
      std::memcpy(dst, static_cast<const float*>(data) + at, sizeof(float) * n);
      return;
    }
    const uint16_t* src = static_cast<const uint16_t*>(data) + at;
    for (int i = 0; i < n; ++i) {
      uint32_t bits = uint32_t(src[i]) << 16;
      std::memcpy(dst + i, &bits, 4);
    }
  }
};

// Rows of [B, T, N, H] are N H elements apart: a head's rows are read with a large
// stride, so each read asks for the row AHEAD rows on. (The row reads took about 40%
// of the kernel on a shared 2-core host, waiting on memory, with or without this.)
inline void prefetch_row(const Tensor& x, int64_t at, int64_t row_stride, int bytes) {
  const char* p = static_cast<const char*>(x.data) + (at + row_stride) * (x.bf16 ? 2 : 4);
  for (int b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
}
constexpr int AHEAD = 32;

inline void write(void* data, bool bf16, int64_t at, int n, const float* src, float scale = 1.0f) {
  if (!bf16) {
    float* dst = static_cast<float*>(data) + at;
    for (int i = 0; i < n; ++i) dst[i] = src[i] * scale;
    return;
  }
  uint16_t* dst = static_cast<uint16_t*>(data) + at;
  for (int i = 0; i < n; ++i) dst[i] = to_bf16(src[i] * scale);
}

struct Shape {
  int64_t B, T, S, N, K, H, V;
  int64_t mB, mN, mT;  // the mask's leading dims (0: no mask)
  bool causal;
  const uint8_t* mask;
  int G() const { return int(N / K); }
  int64_t q_at(int64_t b, int64_t t, int64_t n) const { return ((b * T + t) * N + n) * H; }
  int64_t k_at(int64_t b, int64_t s, int64_t k) const { return ((b * S + s) * K + k) * H; }
  int64_t v_at(int64_t b, int64_t s, int64_t k) const { return ((b * S + s) * K + k) * V; }
  int64_t o_at(int64_t b, int64_t t, int64_t n) const { return ((b * T + t) * N + n) * V; }
  const uint8_t* mask_row(int64_t b, int64_t n, int64_t t) const {
    if (!mask) return nullptr;
    return mask + (((mB > 1 ? b : 0) * mN + (mN > 1 ? n : 0)) * mT + (mT > 1 ? t : 0)) * S;
  }
};

// -inf where query t0 + i does not see key s0 + j (causality, the mask, past the
// block's sk keys), for the rows and keys of one BQ x BK logit tile.
void mask_tile(const Shape& sh, float* L, int64_t b, int64_t n, int64_t t0, int64_t s0, int sk) {
  const float ninf = -INFINITY;
  bool diagonal = sh.causal && s0 + BK - 1 > t0;
  for (int i = 0; i < BQ; ++i) {
    float* row = L + i * BK;
    int end = sk;
    if (diagonal) end = int(std::max<int64_t>(0, std::min<int64_t>(sk, t0 + i - s0 + 1)));
    for (int j = end; j < BK; ++j) row[j] = ninf;
    const uint8_t* m = (t0 + i < sh.T) ? sh.mask_row(b, n, t0 + i) : nullptr;
    if (m)
      for (int j = 0; j < end; ++j)
        if (!m[s0 + j]) row[j] = ninf;
  }
}

// Keys and values of one (b, key/value head), packed once per task for every query
// head and block that reads them: K^T per key block [nk][Hp][BK] (a block's rows
// contiguous: no strided rows aliasing in L1), K rows [Sp][Hp], V rows [Sp][Vp],
// V^T per block [nk][Vp][BK]; zero past S and past H, V (zeros add nothing).
struct PackedKV {
  int Hp, Vp;
  int64_t nk;
  Buf kt, kr, vr, vt;
  PackedKV(const Shape& sh, Tensor k, Tensor v, int64_t b, int64_t kv, int64_t s_end,
           bool rows_k, bool t_v)
      : Hp(round_up(int(sh.H), W)), Vp(round_up(int(sh.V), W)), nk((s_end + BK - 1) / BK),
        kt(size_t(nk) * Hp * BK), kr(rows_k ? size_t(nk) * BK * Hp : 1),
        vr(t_v ? 1 : size_t(nk) * BK * Vp), vt(t_v ? size_t(nk) * Vp * BK : 1) {
    std::vector<float> rk(sh.H), rv(sh.V);
    float *row_k = rk.data(), *row_v = rv.data();
    const int kbytes = int(sh.H) * (k.bf16 ? 2 : 4), vbytes = int(sh.V) * (v.bf16 ? 2 : 4);
    for (int64_t s = 0; s < s_end; ++s) {
      const int64_t blk = s / BK, j = s % BK;
      if (s + AHEAD < s_end) {
        prefetch_row(k, sh.k_at(b, s, kv), AHEAD * sh.K * sh.H, kbytes);
        prefetch_row(v, sh.v_at(b, s, kv), AHEAD * sh.K * sh.V, vbytes);
      }
      k.read(sh.k_at(b, s, kv), int(sh.H), row_k);
      v.read(sh.v_at(b, s, kv), int(sh.V), row_v);
      float* kt_b = kt.get() + blk * Hp * BK;
      for (int h = 0; h < sh.H; ++h) kt_b[h * BK + j] = row_k[h];
      if (rows_k) std::memcpy(kr.get() + s * Hp, row_k, sizeof(float) * sh.H);
      if (t_v) {
        float* vt_b = vt.get() + blk * Vp * BK;
        for (int h = 0; h < sh.V; ++h) vt_b[h * BK + j] = row_v[h];
      } else {
        std::memcpy(vr.get() + s * Vp, row_v, sizeof(float) * sh.V);
      }
    }
  }
};

// ---------------------------------------------------------------------------
// Forward: one task per (b, key/value head); its G query heads and every query block.

// Tasks per (b, key/value head) where B K alone is too few to share among the
// threads (long sequences at batch 1): a chunk of every C-th query (forward) or key
// (backward) block each. C follows from the shape alone, never from the thread
// count, so the bits are the same on any number of threads.
constexpr int64_t MIN_TASKS = 8;

inline int64_t chunks_for(const Shape& sh, int64_t blocks) {
  const int64_t heads = sh.B * sh.K;
  return std::max<int64_t>(1, std::min<int64_t>(blocks, (MIN_TASKS + heads - 1) / heads));
}

void forward_task(const Shape& sh, Tensor q, Tensor k, Tensor v, void* o, bool o_bf16,
                  float* lse, int64_t chunks, int64_t task) {
  const int64_t chunk = task % chunks, b = task / chunks / sh.K, kv = task / chunks % sh.K;
  const int G = sh.G();
  const int64_t nq = (sh.T + BQ - 1) / BQ;
  const int64_t s_all = sh.causal ? std::min<int64_t>(sh.S, sh.T) : sh.S;
  PackedKV kvp(sh, k, v, b, kv, s_all, false, false);
  const int Hp = kvp.Hp, Vp = kvp.Vp;
  Buf Q(BQ * Hp), L(BQ * BK), O(BQ * Vp);
  float m[BQ], l[BQ];
  for (int gi = 0; gi < G; ++gi) {
    const int64_t n = kv * G + gi;
    for (int64_t qb = chunk; qb < nq; qb += chunks) {
      const int64_t t0 = qb * BQ;
      const int tq = int(std::min<int64_t>(BQ, sh.T - t0));
      for (int i = 0; i < BQ; ++i) { m[i] = -INFINITY; l[i] = 0.0f; }
      std::memset(Q.get(), 0, sizeof(float) * BQ * Hp);
      std::memset(O.get(), 0, sizeof(float) * BQ * Vp);
      const int qbytes = int(sh.H) * (q.bf16 ? 2 : 4);
      for (int i = 0; i < tq; ++i) {
        if (i + AHEAD < tq) prefetch_row(q, sh.q_at(b, t0 + i, n), AHEAD * sh.N * sh.H, qbytes);
        q.read(sh.q_at(b, t0 + i, n), int(sh.H), Q.get() + i * Hp);
      }
      // Causal: the block's last row sees keys up to t0 + tq - 1, no later block.
      const int64_t s_end = sh.causal ? std::min<int64_t>(sh.S, t0 + tq) : sh.S;
      for (int64_t s0 = 0; s0 < s_end; s0 += BK) {
        const int sk = int(std::min<int64_t>(BK, s_end - s0));
        const int64_t blk = s0 / BK;
        gemm(L.get(), BK, Q.get(), Hp, 1, kvp.kt.get() + blk * Hp * BK, BK, BQ, BK, Hp, false);
        mask_tile(sh, L.get(), b, n, t0, s0, sk);
        for (int i = 0; i < BQ; ++i) {
          float* row = L.get() + i * BK;
          v16 mx = load(row);
          for (int j = W; j < BK; j += W) { v16 x = load(row + j); mx = x > mx ? x : mx; }
          const float m_new = std::max(m[i], hmax(mx));
          const float shift = m_new == -INFINITY ? 0.0f : m_new;  // no key seen yet: p = 0
          v16 sum = splat(0.0f);
          for (int j = 0; j < BK; j += W) {
            v16 p = vexp(load(row + j) - shift);
            store(row + j, p);
            sum += p;
          }
          const float alpha = m[i] == -INFINITY ? 0.0f : std::exp(m[i] - shift);
          l[i] = l[i] * alpha + hsum(sum);
          m[i] = m_new;
          if (alpha != 1.0f) {
            float* orow = O.get() + i * Vp;
            for (int h = 0; h < Vp; h += W) store(orow + h, load(orow + h) * alpha);
          }
        }
        gemm(O.get(), Vp, L.get(), BK, 1, kvp.vr.get() + s0 * Vp, Vp, BQ, Vp, BK, true);
      }
      for (int i = 0; i < tq; ++i) {
        const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        write(o, o_bf16, sh.o_at(b, t0 + i, n), int(sh.V), O.get() + i * Vp, inv);
        lse[(b * sh.T + t0 + i) * sh.N + n] = l[i] > 0.0f ? m[i] + std::log(l[i]) : -INFINITY;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Backward: one task per (b, key/value head).

struct Grads {
  void* dq;
  void* dk;
  void* dv;
  bool bf16;
};

// dq_part: with chunks > 1, each chunk's dq in float32, [chunks][B][K][G][Tp][Hp], summed
// by `reduce_dq` in chunk order; with one chunk (nullptr) the task writes dq itself.
void backward_task(const Shape& sh, Tensor q, Tensor k, Tensor v, Tensor o, Tensor dout,
                   const float* lse, const float* dlse, Grads g, int64_t chunks, float* dq_part,
                   int64_t task) {
  const int64_t chunk = task % chunks, b = task / chunks / sh.K, kv = task / chunks % sh.K;
  const int G = sh.G();
  const int64_t nq = (sh.T + BQ - 1) / BQ, Tp = nq * BQ;
  PackedKV kvp(sh, k, v, b, kv, sh.S, true, true);
  const int Hp = kvp.Hp, Vp = kvp.Vp;
  // Per query row of the group, packed once: q, do, D_i = do_i . o_i - dlse_i, lse_i;
  // dq accumulated in float32.
  Buf Qa(size_t(G) * Tp * Hp), dOa(size_t(G) * Tp * Vp), D(G * Tp), LSE(G * Tp);
  Buf dQ(size_t(G) * Tp * Hp), orow(Vp);
  for (int gi = 0; gi < G; ++gi) {
    const int64_t n = kv * G + gi;
    for (int64_t t = 0; t < Tp; ++t) {
      float d = 0.0f, ls = INFINITY;  // padding rows: p = exp(-inf) = 0
      if (t + AHEAD < sh.T) {
        prefetch_row(q, sh.q_at(b, t, n), AHEAD * sh.N * sh.H, int(sh.H) * (q.bf16 ? 2 : 4));
        const int vbytes = int(sh.V) * (o.bf16 ? 2 : 4);
        prefetch_row(dout, sh.o_at(b, t, n), AHEAD * sh.N * sh.V, vbytes);
        prefetch_row(o, sh.o_at(b, t, n), AHEAD * sh.N * sh.V, vbytes);
      }
      if (t < sh.T) {
        float* q_row = Qa.get() + (gi * Tp + t) * Hp;
        float* do_row = dOa.get() + (gi * Tp + t) * Vp;
        q.read(sh.q_at(b, t, n), int(sh.H), q_row);
        dout.read(sh.o_at(b, t, n), int(sh.V), do_row);
        o.read(sh.o_at(b, t, n), int(sh.V), orow.get());
        for (int h = 0; h < sh.V; ++h) d += do_row[h] * orow.get()[h];
        const int64_t r = (b * sh.T + t) * sh.N + n;
        d -= dlse[r];
        ls = lse[r] == -INFINITY ? INFINITY : lse[r];  // a row that sees no key: p = 0
      }
      D.get()[gi * Tp + t] = d;
      LSE.get()[gi * Tp + t] = ls;
    }
  }
  Buf dK(BK * Hp), dV(BK * Vp), P(BQ * BK), dP(BQ * BK);
  for (int64_t s0 = chunk * BK; s0 < sh.S; s0 += chunks * BK) {
    const int sk = int(std::min<int64_t>(BK, sh.S - s0));
    const int64_t blk = s0 / BK;
    const float* Kt = kvp.kt.get() + blk * Hp * BK;
    const float* Kb = kvp.kr.get() + s0 * Hp;
    const float* Vt = kvp.vt.get() + blk * Vp * BK;
    std::memset(dK.get(), 0, sizeof(float) * BK * Hp);
    std::memset(dV.get(), 0, sizeof(float) * BK * Vp);
    // Causal: key s0 is first seen by query s0, in query block s0 / BQ.
    const int64_t qb0 = sh.causal ? s0 / BQ : 0;
    for (int gi = 0; gi < G; ++gi) {
      const int64_t n = kv * G + gi;
      for (int64_t qb = qb0; qb < nq; ++qb) {
        const int64_t t0 = qb * BQ;
        const float* Q = Qa.get() + (gi * Tp + t0) * Hp;
        const float* dO = dOa.get() + (gi * Tp + t0) * Vp;
        gemm(P.get(), BK, Q, Hp, 1, Kt, BK, BQ, BK, Hp, false);
        mask_tile(sh, P.get(), b, n, t0, s0, sk);
        const float* lse_t = LSE.get() + gi * Tp + t0;
        for (int i = 0; i < BQ; ++i) {
          float* row = P.get() + i * BK;
          for (int j = 0; j < BK; j += W) store(row + j, vexp(load(row + j) - lse_t[i]));
        }
        // dv += p^T do; dp = do v^T; ds = p (dp - D); dk += ds^T q; dq += ds k.
        gemm(dV.get(), Vp, P.get(), 1, BK, dO, Vp, BK, Vp, BQ, true);
        gemm(dP.get(), BK, dO, Vp, 1, Vt, BK, BQ, BK, Vp, false);
        const float* d_t = D.get() + gi * Tp + t0;
        for (int i = 0; i < BQ; ++i) {
          float* ds = dP.get() + i * BK;
          const float* p = P.get() + i * BK;
          for (int j = 0; j < BK; j += W) store(ds + j, load(p + j) * (load(ds + j) - d_t[i]));
        }
        gemm(dK.get(), Hp, dP.get(), 1, BK, Q, Hp, BK, Hp, BQ, true);
        gemm(dQ.get() + (size_t(gi) * Tp + t0) * Hp, Hp, dP.get(), BK, 1, Kb, Hp, BQ, Hp, BK,
             true);
      }
    }
    for (int j = 0; j < sk; ++j) {
      write(g.dk, g.bf16, sh.k_at(b, s0 + j, kv), int(sh.H), dK.get() + j * Hp);
      write(g.dv, g.bf16, sh.v_at(b, s0 + j, kv), int(sh.V), dV.get() + j * Vp);
    }
  }
  if (dq_part) {
    const size_t size = size_t(G) * Tp * Hp;
    std::memcpy(dq_part + ((chunk * sh.B + b) * sh.K + kv) * size, dQ.get(), sizeof(float) * size);
    return;
  }
  for (int gi = 0; gi < G; ++gi) {
    const int64_t n = kv * G + gi;
    for (int64_t t = 0; t < sh.T; ++t)
      write(g.dq, g.bf16, sh.q_at(b, t, n), int(sh.H), dQ.get() + (size_t(gi) * Tp + t) * Hp);
  }
}

// dq of (b, key/value head) `task`: its chunks' partial sums added in chunk order.
void reduce_dq(const Shape& sh, Grads g, int64_t chunks, const float* dq_part, int64_t task) {
  const int64_t b = task / sh.K, kv = task % sh.K;
  const int G = sh.G(), Hp = round_up(int(sh.H), W);
  const int64_t Tp = (sh.T + BQ - 1) / BQ * BQ;
  const size_t size = size_t(G) * Tp * Hp;
  std::vector<float> row(Hp);
  for (int gi = 0; gi < G; ++gi) {
    const int64_t n = kv * G + gi;
    for (int64_t t = 0; t < sh.T; ++t) {
      const size_t at = (size_t(gi) * Tp + t) * Hp;
      std::fill(row.begin(), row.end(), 0.0f);
      for (int64_t c = 0; c < chunks; ++c) {
        const float* part = dq_part + ((c * sh.B + b) * sh.K + kv) * size + at;
        for (int h = 0; h < Hp; ++h) row[h] += part[h];
      }
      write(g.dq, g.bf16, sh.q_at(b, t, n), int(sh.H), row.data());
    }
  }
}

// ---------------------------------------------------------------------------
// FFI handlers.

ffi::Error shape_of(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                    ffi::Buffer<ffi::U8> mask, int64_t is_causal, int64_t has_mask, Shape* sh,
                    bool* bf16) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), md = mask.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || md.size() != 4)
    return ffi::Error::InvalidArgument("attnscale flash attention: q, k, v, mask must be rank 4");
  ffi::DataType t = q.element_type();
  if (t != k.element_type() || t != v.element_type() ||
      (t != ffi::DataType::F32 && t != ffi::DataType::BF16))
    return ffi::Error::InvalidArgument("attnscale flash attention: q, k, v must be f32 or bf16");
  *bf16 = t == ffi::DataType::BF16;
  *sh = Shape{qd[0], qd[1], kd[1], qd[2], kd[2], qd[3], vd[3], md[0], md[1], md[2],
              is_causal != 0, has_mask ? mask.typed_data() : nullptr};
  if (kd[3] != sh->H || vd[1] != sh->S || vd[2] != sh->K || kd[0] != sh->B || vd[0] != sh->B ||
      sh->K <= 0 || sh->N % sh->K != 0)
    return ffi::Error::InvalidArgument("attnscale flash attention: inconsistent shapes");
  if (has_mask && md[3] != sh->S)
    return ffi::Error::InvalidArgument("attnscale flash attention: mask must end in S");
  return ffi::Error::Success();
}

ffi::Error ForwardImpl(ffi::ThreadPool xla_pool, ffi::AnyBuffer q, ffi::AnyBuffer k,
                       ffi::AnyBuffer v, ffi::Buffer<ffi::U8> mask, int64_t is_causal,
                       int64_t has_mask, int64_t pool, int64_t threads,
                       ffi::Result<ffi::AnyBuffer> o, ffi::ResultBuffer<ffi::F32> lse) {
  Shape sh;
  bool bf16;
  ffi::Error err = shape_of(q, k, v, mask, is_causal, has_mask, &sh, &bf16);
  if (err.failure()) return err;
  const Tensor tq{q.untyped_data(), bf16}, tk{k.untyped_data(), bf16}, tv{v.untyped_data(), bf16};
  void* out = o->untyped_data();
  float* lse_out = lse->typed_data();
  const int64_t chunks = chunks_for(sh, (sh.T + BQ - 1) / BQ);
  parallel_for(xla_pool, pool, threads, sh.B * sh.K * chunks, [&](int64_t task) {
    forward_task(sh, tq, tk, tv, out, bf16, lse_out, chunks, task);
  });
  return ffi::Error::Success();
}

ffi::Error BackwardImpl(ffi::ThreadPool xla_pool, ffi::AnyBuffer q, ffi::AnyBuffer k,
                        ffi::AnyBuffer v, ffi::Buffer<ffi::U8> mask, ffi::AnyBuffer o,
                        ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer dout,
                        ffi::Buffer<ffi::F32> dlse, int64_t is_causal, int64_t has_mask,
                        int64_t pool, int64_t threads, ffi::Result<ffi::AnyBuffer> dq,
                        ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv) {
  Shape sh;
  bool bf16;
  ffi::Error err = shape_of(q, k, v, mask, is_causal, has_mask, &sh, &bf16);
  if (err.failure()) return err;
  const Tensor tq{q.untyped_data(), bf16}, tk{k.untyped_data(), bf16}, tv{v.untyped_data(), bf16};
  const Tensor to{o.untyped_data(), bf16}, tdo{dout.untyped_data(), bf16};
  const Grads g{dq->untyped_data(), dk->untyped_data(), dv->untyped_data(), bf16};
  const float* lse_in = lse.typed_data();
  const float* dlse_in = dlse.typed_data();
  const int64_t chunks = chunks_for(sh, (sh.S + BK - 1) / BK);
  std::unique_ptr<float[]> dq_part;
  if (chunks > 1) {
    const int64_t Tp = (sh.T + BQ - 1) / BQ * BQ;
    dq_part.reset(new float[size_t(chunks) * sh.B * sh.K * sh.G() * Tp * round_up(int(sh.H), W)]);
  }
  parallel_for(xla_pool, pool, threads, sh.B * sh.K * chunks, [&](int64_t task) {
    backward_task(sh, tq, tk, tv, to, tdo, lse_in, dlse_in, g, chunks, dq_part.get(), task);
  });
  if (chunks > 1)
    parallel_for(xla_pool, pool, threads, sh.B * sh.K, [&](int64_t task) {
      reduce_dq(sh, g, chunks, dq_part.get(), task);
    });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttnscaleFlashForward, ForwardImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Attr<int64_t>("is_causal")
                                  .Attr<int64_t>("has_mask")
                                  .Attr<int64_t>("pool")
                                  .Attr<int64_t>("threads")
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttnscaleFlashBackward, BackwardImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("is_causal")
                                  .Attr<int64_t>("has_mask")
                                  .Attr<int64_t>("pool")
                                  .Attr<int64_t>("threads")
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
