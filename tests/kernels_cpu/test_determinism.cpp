// The thread pool, and the determinism contract: every kernel gives the same bits with 1 and 2 threads.
#include <kernels/cpu/batchnorm.h>
#include <kernels/cpu/conv2d.h>
#include <kernels/cpu/elementwise.h>
#include <kernels/cpu/fully_connected.h>
#include <kernels/cpu/gemm.h>
#include <kernels/cpu/metrics.h>
#include <kernels/cpu/optimizer.h>
#include <kernels/cpu/pooling.h>
#include <kernels/cpu/range_ops.h>
#include <kernels/cpu/softmax_ce.h>
#include <kernels/cpu/thread_pool.h>

#include "kernel_test_util.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

namespace renaissance::cpu::test {
namespace {

TEST(ThreadPool, CoversEveryIndexOnce) {
  ThreadPool pool(3);
  EXPECT_EQ(pool.size(), 3);
  for (std::int64_t n : {0, 1, 7, 1000, 100003})
    for (std::int64_t grain : {1, 5, 4096}) {
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      pool.parallel_for(0, n, grain, [&](std::int64_t b, std::int64_t e) {
        EXPECT_LT(b, e);
        for (std::int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " grain=" << grain;
    }
}

TEST(ThreadPool, RethrowsAndNestsInline) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(0, 100, 1,
                                 [](std::int64_t b, std::int64_t) {
                                   if (b == 0) throw std::runtime_error("chunk failed");
                                 }),
               std::runtime_error);
  std::atomic<std::int64_t> sum{0};
  pool.parallel_for(0, 10, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i)
      pool.parallel_for(0, 10, 1, [&](std::int64_t b2, std::int64_t e2) { sum += (e2 - b2) * i; });
  });
  EXPECT_EQ(sum.load(), 45 * 10);
  // The pool keeps working after an exception.
  std::atomic<int> count{0};
  pool.parallel_for(0, 64, 1, [&](std::int64_t b, std::int64_t e) { count += static_cast<int>(e - b); });
  EXPECT_EQ(count.load(), 64);
}

#if defined(__linux__)
TEST(ThreadPool, TakesItsSizeFromTheAffinityMask) {
  // A thread restricted to one processor (as taskset or a Slurm binding would) sizes a default pool at one.
  std::thread t([] {
    cpu_set_t all, one;
    ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
    const int allowed = CPU_COUNT(&all);
    EXPECT_EQ(affinity_cpu_count(), allowed);
    int first = 0;
    while (!CPU_ISSET(first, &all)) ++first;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    EXPECT_EQ(affinity_cpu_count(), 1);
    if (!std::getenv("RENAISSANCE_CPU_THREADS")) {  // the variable wins over the mask
      ThreadPool pool(0);
      EXPECT_EQ(pool.size(), 1);
    }
  });
  t.join();
}
#endif

// Runs every kernel once on medium shapes and returns all outputs by name.
std::map<std::string, Vec> run_all() {
  std::map<std::string, Vec> out;
  // GEMM shapes on both sides of every threshold.
  for (auto [m, n, k] : {std::tuple<int, int, int>{301, 77, 520}, {40, 300, 2000}, {2000, 40, 70}}) {
    const Vec a = random_vec(m * k, 1), b = random_vec(k * n, 2);
    Vec c(m * n);
    sgemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
    out["gemm" + std::to_string(m)] = c;
  }
  struct C {
    Shape xs;
    std::int64_t cout;
    Conv2dParams p;
  };
  // The last batch (37 samples) splits into oneDNN batch pieces with a shorter last one.
  for (const C& cs : {C{{8, 14, 14, 32}, 48, {3, 3, 1, 1, 1, 1, 1}}, C{{6, 9, 9, 16}, 16, {3, 3, 2, 2, 1, 1, 16}},
                      C{{8, 10, 10, 24}, 40, {1, 1, 1, 1, 0, 0, 1}}, C{{37, 7, 7, 16}, 32, {3, 3, 1, 1, 1, 1, 1}},
                      C{{37, 9, 9, 16}, 16, {3, 3, 1, 1, 1, 1, 1}}}) {
    const Shape ys = conv2d_output_shape(cs.xs, cs.cout, cs.p);
    const std::string tag = "conv" + cs.xs.str() + ">" + std::to_string(cs.cout);
    Vec x = random_vec(cs.xs.elems() + 4, 3), w = random_vec(conv2d_weight_elems(cs.xs.c, cs.cout, cs.p), 4),
        b = random_vec(cs.cout, 5), dy = random_vec(ys.elems() + 4, 6);  // +16 bytes for XNNPACK
    Vec y(ys.elems()), dx(cs.xs.elems()), dw(w.size()), db(b.size());
    conv2d_forward(x.data(), cs.xs, w.data(), b.data(), y.data(), ys, cs.p, Conv2dAlgo::Gemm);
    out[tag + " y"] = y;
    conv2d_forward(x.data(), cs.xs, w.data(), b.data(), y.data(), ys, cs.p, Conv2dAlgo::Auto);
    out[tag + " y auto"] = y;
    conv2d_backward_data(dy.data(), ys, w.data(), dx.data(), cs.xs, cs.p, false, Conv2dAlgo::Gemm);
    out[tag + " dx"] = dx;
    conv2d_backward_data(dy.data(), ys, w.data(), dx.data(), cs.xs, cs.p, false, Conv2dAlgo::Auto);
    out[tag + " dx auto"] = dx;
    conv2d_backward_filter(x.data(), cs.xs, dy.data(), ys, dw.data(), db.data(), cs.p, false, Conv2dAlgo::Gemm);
    out[tag + " dw"] = dw;
    out[tag + " db"] = db;
    conv2d_backward_filter(x.data(), cs.xs, dy.data(), ys, dw.data(), db.data(), cs.p, false, Conv2dAlgo::Auto);
    out[tag + " dw auto"] = dw;
    out[tag + " db auto"] = db;
    if (onednn_available()) {  // explicitly, whatever Auto picks
      conv2d_forward(x.data(), cs.xs, w.data(), b.data(), y.data(), ys, cs.p, Conv2dAlgo::Onednn);
      out[tag + " y onednn"] = y;
      conv2d_backward_data(dy.data(), ys, w.data(), dx.data(), cs.xs, cs.p, false, Conv2dAlgo::Onednn);
      out[tag + " dx onednn"] = dx;
      conv2d_backward_filter(x.data(), cs.xs, dy.data(), ys, dw.data(), db.data(), cs.p, false, Conv2dAlgo::Onednn);
      out[tag + " dw onednn"] = dw;
    }
  }
  {
    const Shape s{16, 12, 12, 24};
    const Vec x = random_vec(s.elems(), 7), g = random_vec(s.c, 8), be = random_vec(s.c, 9),
              dy = random_vec(s.elems(), 10);
    Vec y(x.size()), mean(s.c), inv(s.c), rm(s.c, 0.0f), rv(s.c, 1.0f), dx(x.size()), dg(s.c), db(s.c);
    batchnorm_forward_train(x.data(), s, g.data(), be.data(), y.data(), mean.data(), inv.data(), rm.data(), rv.data());
    batchnorm_backward(x.data(), dy.data(), s, g.data(), mean.data(), inv.data(), dx.data(), dg.data(), db.data(),
                       false, false);
    out["bn y"] = y, out["bn mean"] = mean, out["bn invstd"] = inv, out["bn rv"] = rv;
    out["bn dx"] = dx, out["bn dg"] = dg, out["bn db"] = db;

    const Pool2dParams pp{3, 3, 2, 2, 1, 1};
    const Shape ps = maxpool2d_output_shape(s, pp);
    Vec py(ps.elems()), pdx(x.size());
    maxpool2d_forward(x.data(), s, py.data(), ps, pp, nullptr);
    maxpool2d_backward(py.data(), ps, x.data(), nullptr, pdx.data(), s, pp, false);
    out["pool y"] = py, out["pool dx"] = pdx;
    Vec gy(s.n * s.c);
    global_avgpool_forward(x.data(), s, gy.data());
    out["gap"] = gy;
  }
  {
    const std::int64_t batch = 128, in = 256, classes = 10;
    const Vec x = random_vec(batch * in, 11), w = random_vec(classes * in, 12), b = random_vec(classes, 13);
    Vec z(batch * classes), p(z.size()), dz(z.size()), dx(x.size()), dw(w.size()), db(b.size());
    fc_forward(x.data(), batch, in, w.data(), b.data(), z.data(), classes);
    std::vector<std::int32_t> labels(batch);
    for (std::int64_t i = 0; i < batch; ++i) labels[i] = static_cast<std::int32_t>(i * 7 % classes);
    const float loss = softmax_ce_forward(z.data(), labels.data(), batch, classes, 0.1f, p.data());
    softmax_ce_backward(p.data(), labels.data(), batch, classes, 0.1f, 1.0f, dz.data(), false);
    fc_backward_data(dz.data(), batch, classes, w.data(), dx.data(), in, false);
    fc_backward_weights(x.data(), dz.data(), batch, in, classes, dw.data(), db.data(), false);
    float metrics[4] = {};
    accumulate_metrics(z.data(), labels.data(), batch, classes, 0.1f, metrics, nullptr);
    out["fc z"] = z, out["ce p"] = p, out["ce loss"] = Vec{loss}, out["ce dz"] = dz;
    out["fc dx"] = dx, out["fc dw"] = dw, out["fc db"] = db, out["metrics"] = Vec(metrics, metrics + 4);
  }
  {
    const std::int64_t n = 300000;
    Vec w = random_vec(n, 14), m(n, 0.0f), g = random_vec(n, 15);
    OptimizerScalars s;
    s.lr = 0.1f, s.momentum = 0.9f, s.weight_decay = 1e-4f;
    const std::vector<LarsSegment> segs = {{0, 100000}, {100000, 200000}};
    lars_update(w.data(), g.data(), m.data(), segs.data(), segs.size(), &s, true, nullptr);
    out["lars w"] = w;
    Vec v(n, 0.0f);
    adamw_update(w.data(), g.data(), m.data(), v.data(), n, &s, true, nullptr);
    out["adamw w"] = w;
  }
  return out;
}

TEST(Determinism, OneAndTwoThreadsGiveIdenticalBits) {
  const int before = num_threads();
  set_num_threads(1);
  const auto one = run_all();
  set_num_threads(2);
  const auto two = run_all();
  const auto again = run_all();
  set_num_threads(before);
  ASSERT_EQ(one.size(), two.size());
  for (const auto& [name, v] : one) {
    expect_bits_equal(v, two.at(name), name + " (1 vs 2 threads)");
    expect_bits_equal(two.at(name), again.at(name), name + " (rerun)");
  }
}

}  // namespace
}  // namespace renaissance::cpu::test
