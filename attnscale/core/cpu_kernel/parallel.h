// What the native CPU kernels share (flash_attention.cc, layer_norm.cc): float32 to
// bfloat16 rounding, and the work split over XLA's intra-op pool or a pool of this
// library's own threads.

#ifndef ATTNSCALE_CPU_KERNEL_PARALLEL_H_
#define ATTNSCALE_CPU_KERNEL_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace attnscale_cpu {

namespace ffi = xla::ffi;

// float32 -> bfloat16, round to nearest even.
inline uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return uint16_t(u >> 16);
}

// Work split: tasks [0, n) over XLA's intra-op pool or this library's own, the
// caller taking tasks too. Each task writes its own outputs, so the result does
// not depend on which thread ran which task.

class Pool {
 public:
  static Pool& get() {
    static Pool* pool = new Pool();  // never destroyed: threads outlive static destructors
    return *pool;
  }
  // Runs fn(i) for i in [0, n) on up to `threads` threads (the caller included).
  void run(int64_t n, int threads, const std::function<void(int64_t)>& fn) {
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    if (!busy.owns_lock() || threads <= 1 || n <= 1) {  // nested or concurrent: serial
      for (int64_t i = 0; i < n; ++i) fn(i);
      return;
    }
    grow(threads - 1);
    std::atomic<int64_t> next{0}, done{0};
    auto work = [&] {
      for (int64_t i; (i = next.fetch_add(1)) < n;) {
        fn(i);
        done.fetch_add(1);
      }
    };
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = work;
      helpers_ = threads - 1;
      ++epoch_;
    }
    cv_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return done.load() == n && active_ == 0; });
    job_ = nullptr;
  }

 private:
  void grow(int helpers) {
    std::lock_guard<std::mutex> lock(mu_);
    while (int(threads_.size()) < helpers) {
      int id = int(threads_.size());
      threads_.emplace_back([this, id] { loop(id); });
      threads_.back().detach();
    }
  }
  void loop(int id) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return epoch_ != seen; });
      seen = epoch_;
      if (id >= helpers_ || !job_) continue;
      std::function<void()> job = job_;
      ++active_;
      lock.unlock();
      job();
      lock.lock();
      --active_;
      done_cv_.notify_all();
    }
  }
  std::mutex run_mu_, mu_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> threads_;
  std::function<void()> job_;
  uint64_t epoch_ = 0;
  int helpers_ = 0, active_ = 0;
};

// fn(i) for i in [0, n) on XLA's intra-op pool: up to `threads - 1` helpers
// scheduled there, the caller working too; the caller returns when every task
// is done (a helper that starts late finds none left and returns at once).
inline void run_on_xla_pool(ffi::ThreadPool& xla_pool, int64_t n, int threads,
                     const std::function<void(int64_t)>& fn) {
  struct State {
    std::atomic<int64_t> next{0}, done{0};
    std::mutex mu;
    std::condition_variable cv;
    std::function<void(int64_t)> fn;
    int64_t n;
  };
  auto state = std::make_shared<State>();
  state->fn = fn;
  state->n = n;
  auto work = [](State& s) {
    for (int64_t i; (i = s.next.fetch_add(1)) < s.n;) {
      s.fn(i);
      if (s.done.fetch_add(1) + 1 == s.n) {
        std::lock_guard<std::mutex> lock(s.mu);
        s.cv.notify_all();
      }
    }
  };
  int helpers = int(std::min<int64_t>(threads - 1, n - 1));
  for (int h = 0; h < helpers; ++h) xla_pool.Schedule([state, work] { work(*state); });
  work(*state);
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->done.load() == n; });
}

// pool: 0 XLA's intra-op pool, 1 this file's own threads. threads <= 0: all of them.
inline void parallel_for(ffi::ThreadPool& xla_pool, int64_t pool, int64_t threads, int64_t n,
                  const std::function<void(int64_t)>& fn) {
  int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  int64_t avail = pool == 0 ? std::max<int64_t>(1, xla_pool.num_threads()) : hw;
  int t = int(std::min(threads > 0 ? threads : avail, n));
  if (t <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
  } else if (pool == 0) {
    run_on_xla_pool(xla_pool, n, t, fn);
  } else {
    Pool::get().run(n, t, fn);
  }
}

}  // namespace attnscale_cpu

#endif  // ATTNSCALE_CPU_KERNEL_PARALLEL_H_
