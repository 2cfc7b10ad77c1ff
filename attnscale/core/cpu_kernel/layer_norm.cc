// LayerNorm over the last axis on the CPU, forward and backward, as two XLA FFI handlers.
//
//   y = (x - mu) r s + b,   mu = mean(x),   r = 1 / sqrt(mean((x - mu)^2) + eps)
//
// (Ba et al. 2016, "Layer Normalization", arXiv 1607.06450), per row of D features.
// The forward returns y, mu and r; the backward, with xh = (x - mu) r and g = dy s,
//
//   dx = r (g - mean(g) - xh mean(g xh)),   ds = sum_rows dy xh,   db = sum_rows dy,
//
// the fused backward of Apex's and PyTorch's CPU kernels (one pass over a row
// for its two means, one for dx). A row of D floats stays in L1 between passes,
// so the variance is the two-pass one (no E[x^2] - mu^2 cancellation) at no cost.
//
// Layout: x [R, D] float32 or bfloat16, y (and dy) [R, D] float32 or bfloat16 (the
// two independent: a bfloat16 model normalises its float32 residual stream into
// bfloat16), s and b [D] float32, mu and r [R] float32; every sum in float32.
// Rows go in tasks of ROWS rows; ds and db sum each task's rows into its own
// partial, and the partials are added in task order afterwards, so the bits are
// the same whatever the number of threads. Under vmap (a pack of runs) x is
// [G..., R, D] with a scale and bias per group [G..., D], one call for all.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using attnscale_cpu::parallel_for;
using attnscale_cpu::to_bf16;

constexpr int64_t ROWS = 128;  // rows per task
constexpr int W = 16;          // floats per vector

typedef float v16 __attribute__((vector_size(64)));

inline v16 load(const float* p) { v16 r; std::memcpy(&r, p, sizeof(r)); return r; }
inline void store(float* p, v16 x) { std::memcpy(p, &x, sizeof(x)); }

inline float hsum(v16 x) {  // a fixed pairwise order: the same bits on every call
  float a[W];
  std::memcpy(a, &x, sizeof(a));
  for (int w = W / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] += a[i + w];
  return a[0];
}

// sum_i f(i) over [0, D): vectors of W lanes, then the scalar tail, in a fixed order.
template <typename VecF, typename ScalarF>
inline float row_sum(int64_t D, VecF vec, ScalarF scalar) {
  const int64_t Dv = D / W * W;
  v16 acc = v16{};
  for (int64_t i = 0; i < Dv; i += W) acc += vec(i);
  float s = hsum(acc);
  for (int64_t i = Dv; i < D; ++i) s += scalar(i);
  return s;
}

typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

// A row as float32: in place for float32 storage, widened into `buf` for bfloat16.
inline const float* read_row(const void* data, bool bf16, int64_t at, int64_t D, float* buf) {
  if (!bf16) return static_cast<const float*>(data) + at;
  const uint16_t* src = static_cast<const uint16_t*>(data) + at;
  const int64_t Dv = D / W * W;
  for (int64_t i = 0; i < Dv; i += W) {
    v16h h;
    std::memcpy(&h, src + i, sizeof(h));
    v16u bits = __builtin_convertvector(h, v16u) << 16;
    std::memcpy(buf + i, &bits, sizeof(bits));
  }
  for (int64_t i = Dv; i < D; ++i) {
    uint32_t bits = uint32_t(src[i]) << 16;
    std::memcpy(buf + i, &bits, 4);
  }
  return buf;
}

// float32 -> bfloat16 for a row: `to_bf16`'s rounding (nearest even, NaN kept), 16 at a time.
inline void write_row(void* data, bool bf16, int64_t at, int64_t D, const float* src) {
  if (!bf16) {
    std::memcpy(static_cast<float*>(data) + at, src, sizeof(float) * D);
    return;
  }
  uint16_t* dst = static_cast<uint16_t*>(data) + at;
  const int64_t Dv = D / W * W;
  for (int64_t i = 0; i < Dv; i += W) {
    v16u u;
    std::memcpy(&u, src + i, sizeof(u));
    v16u nan = (u & 0x7fffffffu) > 0x7f800000u;
    v16u rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    v16u out = nan ? ((u >> 16) | 0x40u) : rounded;
    v16h h = __builtin_convertvector(out, v16h);
    std::memcpy(dst + i, &h, sizeof(h));
  }
  for (int64_t i = Dv; i < D; ++i) dst[i] = to_bf16(src[i]);
}

bool is_bf16(const ffi::AnyBuffer& x) { return x.element_type() == ffi::DataType::BF16; }
bool supported(const ffi::AnyBuffer& x) {
  return x.element_type() == ffi::DataType::F32 || x.element_type() == ffi::DataType::BF16;
}

void forward_row(const float* x, const float* s, const float* b, int64_t D, float eps,
                 float* y, float* mu_out, float* r_out) {
  const int64_t Dv = D / W * W;
  const float mu = row_sum(D, [&](int64_t i) { return load(x + i); },
                           [&](int64_t i) { return x[i]; }) / float(D);
  const float var = row_sum(D, [&](int64_t i) { v16 d = load(x + i) - mu; return d * d; },
                            [&](int64_t i) { float d = x[i] - mu; return d * d; }) / float(D);
  const float r = 1.0f / std::sqrt(var + eps);
  for (int64_t i = 0; i < Dv; i += W) {
    v16 out = (load(x + i) - mu) * (load(s + i) * r);
    if (b) out += load(b + i);
    store(y + i, out);
  }
  for (int64_t i = Dv; i < D; ++i) y[i] = (x[i] - mu) * (s[i] * r) + (b ? b[i] : 0.0f);
  *mu_out = mu;
  *r_out = r;
}

// One row's dx (into dx) and its terms of ds and db (added to ds, db).
void backward_row(const float* x, const float* dy, const float* s, float mu, float r, int64_t D,
                  float* xh, float* g, float* dx, float* ds, float* db) {
  const int64_t Dv = D / W * W;
  v16 sg = v16{}, sgx = v16{};
  for (int64_t i = 0; i < Dv; i += W) {
    v16 xhv = (load(x + i) - mu) * r, dyv = load(dy + i), gv = dyv * load(s + i);
    store(xh + i, xhv);
    store(g + i, gv);
    sg += gv;
    sgx += gv * xhv;
    store(ds + i, load(ds + i) + dyv * xhv);
    store(db + i, load(db + i) + dyv);
  }
  float sum_g = hsum(sg), sum_gx = hsum(sgx);
  for (int64_t i = Dv; i < D; ++i) {
    xh[i] = (x[i] - mu) * r;
    g[i] = dy[i] * s[i];
    sum_g += g[i];
    sum_gx += g[i] * xh[i];
    ds[i] += dy[i] * xh[i];
    db[i] += dy[i];
  }
  const float mean_g = sum_g / float(D), mean_gx = sum_gx / float(D);
  for (int64_t i = 0; i < Dv; i += W)
    store(dx + i, (load(g + i) - mean_g - load(xh + i) * mean_gx) * r);
  for (int64_t i = Dv; i < D; ++i) dx[i] = (g[i] - mean_g - xh[i] * mean_gx) * r;
}

// The rows and groups of a call: x [G..., R, D] holds G groups of R rows, each with
// its own scale and bias [G..., D] (vmap's batch axes: a pack's runs), G = 1 outside
// vmap. Tasks never straddle two groups.
struct Groups {
  int64_t G, R, D, per_group;  // per_group: tasks per group
  int64_t tasks() const { return G * per_group; }
  int64_t group(int64_t task) const { return task / per_group; }
  int64_t begin(int64_t task) const { return group(task) * R + task % per_group * ROWS; }
  int64_t end(int64_t task) const { return std::min((group(task) + 1) * R, begin(task) + ROWS); }
};

bool groups_of(const ffi::AnyBuffer& x, const ffi::Buffer<ffi::F32>& scale, Groups* g) {
  auto dims = x.dimensions();
  if (dims.size() < 2 || dims.back() <= 0 || scale.element_count() % size_t(dims.back()))
    return false;
  g->D = dims.back();
  g->G = int64_t(scale.element_count()) / g->D;
  const int64_t rows = int64_t(x.element_count()) / g->D;
  if (g->G <= 0 || rows % g->G) return false;
  g->R = rows / g->G;
  g->per_group = std::max<int64_t>(1, (g->R + ROWS - 1) / ROWS);
  return true;
}

ffi::Error ForwardImpl(ffi::ThreadPool xla_pool, ffi::AnyBuffer x, ffi::Buffer<ffi::F32> scale,
                       ffi::Buffer<ffi::F32> bias, float eps, int64_t has_bias, int64_t pool,
                       int64_t threads, ffi::Result<ffi::AnyBuffer> y,
                       ffi::ResultBuffer<ffi::F32> mean, ffi::ResultBuffer<ffi::F32> rstd) {
  Groups gr;
  if (!supported(x) || !supported(*y) || !groups_of(x, scale, &gr) ||
      (has_bias && bias.element_count() != scale.element_count()))
    return ffi::Error::InvalidArgument("attnscale layer norm: x [G.., R, D] f32/bf16, "
                                       "scale and bias [G.., D]");
  const int64_t D = gr.D;
  const bool x_bf16 = is_bf16(x), y_bf16 = is_bf16(*y);
  const void* xd = x.untyped_data();
  void* yd = y->untyped_data();
  const float* s = scale.typed_data();
  const float* b = has_bias ? bias.typed_data() : nullptr;
  float *mu = mean->typed_data(), *r = rstd->typed_data();
  parallel_for(xla_pool, pool, threads, gr.tasks(), [&](int64_t task) {
    std::vector<float> xbuf(x_bf16 ? D : 0), ybuf(D);
    const int64_t g = gr.group(task);
    for (int64_t row = gr.begin(task); row < gr.end(task); ++row) {
      const float* xr = read_row(xd, x_bf16, row * D, D, xbuf.data());
      float* yr = y_bf16 ? ybuf.data() : static_cast<float*>(yd) + row * D;
      forward_row(xr, s + g * D, b ? b + g * D : nullptr, D, eps, yr, mu + row, r + row);
      if (y_bf16) write_row(yd, true, row * D, D, yr);
    }
  });
  return ffi::Error::Success();
}

ffi::Error BackwardImpl(ffi::ThreadPool xla_pool, ffi::AnyBuffer x, ffi::Buffer<ffi::F32> scale,
                        ffi::Buffer<ffi::F32> mean, ffi::Buffer<ffi::F32> rstd,
                        ffi::AnyBuffer dy, int64_t pool, int64_t threads,
                        ffi::Result<ffi::AnyBuffer> dx, ffi::ResultBuffer<ffi::F32> dscale,
                        ffi::ResultBuffer<ffi::F32> dbias) {
  Groups gr;
  if (!supported(x) || !supported(dy) || !groups_of(x, scale, &gr) ||
      dy.element_count() != x.element_count())
    return ffi::Error::InvalidArgument("attnscale layer norm: x, dy [G.., R, D] f32/bf16, "
                                       "scale [G.., D]");
  const int64_t D = gr.D, tasks = gr.tasks();
  const bool x_bf16 = is_bf16(x), dy_bf16 = is_bf16(dy), dx_bf16 = is_bf16(*dx);
  const void *xd = x.untyped_data(), *dyd = dy.untyped_data();
  void* dxd = dx->untyped_data();
  const float *s = scale.typed_data(), *mu = mean.typed_data(), *r = rstd.typed_data();
  // Per task: its rows' terms of ds (first D) and db (next D).
  std::vector<float> partial(size_t(tasks) * 2 * D, 0.0f);
  parallel_for(xla_pool, pool, threads, tasks, [&](int64_t task) {
    std::vector<float> buf(5 * D);
    float *xbuf = buf.data(), *dybuf = xbuf + D, *xh = dybuf + D, *g = xh + D, *dxbuf = g + D;
    float* ds = partial.data() + size_t(task) * 2 * D;
    const float* sg = s + gr.group(task) * D;
    for (int64_t row = gr.begin(task); row < gr.end(task); ++row) {
      const float* xr = read_row(xd, x_bf16, row * D, D, xbuf);
      const float* dyr = read_row(dyd, dy_bf16, row * D, D, dybuf);
      float* dxr = dx_bf16 ? dxbuf : static_cast<float*>(dxd) + row * D;
      backward_row(xr, dyr, sg, mu[row], r[row], D, xh, g, dxr, ds, ds + D);
      if (dx_bf16) write_row(dxd, true, row * D, D, dxr);
    }
  });
  // Each group's partials, added in task order.
  for (int64_t grp = 0; grp < gr.G; ++grp) {
    float *ds = dscale->typed_data() + grp * D, *db = dbias->typed_data() + grp * D;
    const float* first = partial.data() + size_t(grp * gr.per_group) * 2 * D;
    std::memcpy(ds, first, sizeof(float) * D);
    std::memcpy(db, first + D, sizeof(float) * D);
    for (int64_t t = 1; t < gr.per_group; ++t) {
      const float* p = first + size_t(t) * 2 * D;
      for (int64_t i = 0; i < D; ++i) {
        ds[i] += p[i];
        db[i] += p[D + i];
      }
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttnscaleLayerNormForward, ForwardImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("eps")
                                  .Attr<int64_t>("has_bias")
                                  .Attr<int64_t>("pool")
                                  .Attr<int64_t>("threads")
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttnscaleLayerNormBackward, BackwardImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Attr<int64_t>("pool")
                                  .Attr<int64_t>("threads")
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
