// CUDA optimizers against kernels/cpu/optimizer over several steps (the step counter and scalars in device memory,
// updated between steps as the trainer does): within 1e-6 relative (bit-exact except Adam's FP64 pow and LARS's
// FP64 norm order); the skip flag leaves every byte alone.
#include "gpu_test_util.h"

#include <kernels/cpu/optimizer.h>
#include <kernels/cuda/optimizer.h>

namespace renaissance::cuda::ktest {
namespace {

class OptimizerTest : public GpuTest {};

enum class Kind { kSgd, kMomentum, kNesterov, kAdam, kAdamW };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kSgd: return "sgd";
    case Kind::kMomentum: return "momentum";
    case Kind::kNesterov: return "nesterov";
    case Kind::kAdam: return "adam";
    case Kind::kAdamW: return "adamw";
  }
  return "?";
}

cpu::OptimizerScalars scalars_at(int step) {
  cpu::OptimizerScalars s;
  s.lr = 0.05f / static_cast<float>(step);
  s.momentum = 0.9f;
  s.beta1 = 0.9f;
  s.beta2 = 0.999f;
  s.eps = 1e-8f;
  s.weight_decay = 1e-2f;
  s.step = static_cast<float>(step);
  s.lars_eta = 0.001f;
  return s;
}

/// |got − ref| ≤ 1e-6·(|ref| + 1e-3·max|ref|): relative, with a floor for the few values near zero.
void expect_rel(const Vec& got, const Vec& ref, const std::string& what) {
  double mx = 0.0;
  for (float r : ref) mx = std::max(mx, static_cast<double>(std::abs(r)));
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - ref[i]);
    if (!(err <= 1e-6 * (std::abs(static_cast<double>(ref[i])) + 1e-3 * mx))) {
      if (bad++ == 0) first = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": first at " << first << " got " << got[first] << " want " << ref[first];
}

void run_cpu(Kind k, Vec& w, const Vec& g, Vec& m, Vec& v, std::int64_t off, std::int64_t n,
             const cpu::OptimizerScalars& s, bool decay, const std::int32_t* skip) {
  switch (k) {
    case Kind::kSgd: cpu::sgd_update(w.data() + off, g.data() + off, n, &s, decay, skip); break;
    case Kind::kMomentum: cpu::momentum_update(w.data() + off, g.data() + off, v.data() + off, n, &s, decay, skip); break;
    case Kind::kNesterov: cpu::nesterov_update(w.data() + off, g.data() + off, v.data() + off, n, &s, decay, skip); break;
    case Kind::kAdam:
      cpu::adam_update(w.data() + off, g.data() + off, m.data() + off, v.data() + off, n, &s, decay, skip);
      break;
    case Kind::kAdamW:
      cpu::adamw_update(w.data() + off, g.data() + off, m.data() + off, v.data() + off, n, &s, decay, skip);
      break;
  }
}

void run_gpu(cudaStream_t st, Kind k, float* w, const float* g, float* m, float* v, std::int64_t n,
             const OptimizerScalars* s, bool decay, const std::int32_t* skip) {
  switch (k) {
    case Kind::kSgd: sgd_update(st, w, g, n, s, decay, skip); break;
    case Kind::kMomentum: momentum_update(st, w, g, v, n, s, decay, skip); break;
    case Kind::kNesterov: nesterov_update(st, w, g, v, n, s, decay, skip); break;
    case Kind::kAdam: adam_update(st, w, g, m, v, n, s, decay, skip); break;
    case Kind::kAdamW: adamw_update(st, w, g, m, v, n, s, decay, skip); break;
  }
}

TEST_F(OptimizerTest, UpdatesMatchCpuOverSteps) {
  constexpr std::int64_t kN = 10007;
  for (Kind k : {Kind::kSgd, Kind::kMomentum, Kind::kNesterov, Kind::kAdam, Kind::kAdamW}) {
    for (bool decay : {false, true}) {
      for (std::int64_t off : {0, 1}) {  // aligned (float4 + tail) and misaligned (scalar) starts
        const std::string name = std::string(kind_name(k)) + (decay ? " wd" : "") + " offset " + std::to_string(off);
        const std::int64_t n = kN - off;
        Vec w = random_vec(kN, 1, -1.0f, 1.0f), m(kN, 0.0f), v(kN, 0.0f);
        const DeviceBuffer dw = upload(w), dm = upload(m), dv = upload(v), dg(kN * 4);
        DeviceBuffer ds(sizeof(OptimizerScalars));
        const DeviceBuffer skip = upload(std::vector<std::int32_t>{0});
        const std::int32_t no_skip = 0;
        for (int step = 1; step <= 5; ++step) {
          const Vec g = random_vec(kN, 100 + step, -0.5f, 0.5f);
          upload_into(dg, g);
          const cpu::OptimizerScalars s = scalars_at(step);
          upload_into(ds, std::vector<cpu::OptimizerScalars>{s});
          run_gpu(stream, k, dw.as<float>() + off, dg.as<float>() + off, dm.as<float>() + off, dv.as<float>() + off, n,
                  ds.as<OptimizerScalars>(), decay, skip.as<std::int32_t>());
          sync();
          run_cpu(k, w, g, m, v, off, n, s, decay, &no_skip);
          const std::string at = name + " step " + std::to_string(step);
          expect_rel(download<float>(dw, kN), w, "w " + at);
          if (k == Kind::kAdam || k == Kind::kAdamW) expect_rel(download<float>(dm, kN), m, "m " + at);
          if (k != Kind::kSgd) expect_rel(download<float>(dv, kN), v, "v " + at);
        }
      }
    }
  }
}

TEST_F(OptimizerTest, SkipFlagLeavesEverythingAlone) {
  constexpr std::int64_t kN = 4099;
  const Vec w = random_vec(kN, 7), g = random_vec(kN, 8), m = random_vec(kN, 9), v = random_vec(kN, 10, 0.0f, 1.0f);
  const DeviceBuffer ds = upload(std::vector<cpu::OptimizerScalars>{scalars_at(3)});
  const DeviceBuffer skip = upload(std::vector<std::int32_t>{1});
  for (Kind k : {Kind::kSgd, Kind::kMomentum, Kind::kNesterov, Kind::kAdam, Kind::kAdamW}) {
    const DeviceBuffer dw = upload(w), dg = upload(g), dm = upload(m), dv = upload(v);
    run_gpu(stream, k, dw.as<float>(), dg.as<float>(), dm.as<float>(), dv.as<float>(), kN, ds.as<OptimizerScalars>(),
            true, skip.as<std::int32_t>());
    sync();
    expect_bits_equal(download<float>(dw, kN), w, std::string("skipped w ") + kind_name(k));
    expect_bits_equal(download<float>(dm, kN), m, std::string("skipped m ") + kind_name(k));
    expect_bits_equal(download<float>(dv, kN), v, std::string("skipped v ") + kind_name(k));
  }
}

TEST_F(OptimizerTest, LarsMatchesCpuOverSteps) {
  // Segments of odd sizes, one empty, one spanning several 4096-element chunks, one of a single element.
  const std::vector<LarsSegment> segs{{0, 10000}, {10000, 3}, {10003, 4096}, {14099, 0}, {14099, 9000}, {23099, 1}};
  std::vector<cpu::LarsSegment> csegs;
  for (const LarsSegment& s : segs) csegs.push_back({s.offset, s.count});
  constexpr std::int64_t kN = 23100;
  const std::int64_t chunks = lars_num_chunks(segs.data(), segs.size());
  EXPECT_EQ(chunks, 3 + 1 + 1 + 0 + 3 + 1);
  const std::size_t ws_bytes = lars_workspace_bytes(chunks);
  DeviceBuffer ws(ws_bytes);
  const DeviceBuffer dsegs = upload(segs);
  const std::int64_t norm_stride = 64;  // N_* slots: 2 floats each, 256-byte aligned
  DeviceBuffer norms(segs.size() * norm_stride * 4);
  for (bool decay : {false, true}) {
    Vec w = random_vec(kN, 3, -1.0f, 1.0f), v(kN, 0.0f);
    w[23099] = 0.0f;  // a zero-norm segment: trust 1
    const DeviceBuffer dw = upload(w), dv = upload(v), dg(kN * 4), ds(sizeof(OptimizerScalars));
    const DeviceBuffer skip = upload(std::vector<std::int32_t>{0});
    for (int step = 1; step <= 4; ++step) {
      const Vec g = random_vec(kN, 50 + step, -0.1f, 0.1f);
      upload_into(dg, g);
      const cpu::OptimizerScalars s = scalars_at(step);
      upload_into(ds, std::vector<cpu::OptimizerScalars>{s});
      // The norms the CPU LARS_NORMS op writes (FP64 sums, before the update).
      Vec wn(segs.size()), gn(segs.size());
      for (std::size_t i = 0; i < segs.size(); ++i) {
        double sw = 0.0, sg = 0.0;
        for (std::int64_t j = segs[i].offset; j < segs[i].offset + segs[i].count; ++j) {
          sw += static_cast<double>(w[j]) * w[j];
          sg += static_cast<double>(g[j]) * g[j];
        }
        wn[i] = static_cast<float>(std::sqrt(sw));
        gn[i] = static_cast<float>(std::sqrt(sg));
      }
      lars_norms(stream, dw.as<float>(), dg.as<float>(), dsegs.as<LarsSegment>(), segs.size(), chunks, ws.get(),
                 ws_bytes);
      lars_update(stream, dw.as<float>(), dg.as<float>(), dv.as<float>(), dsegs.as<LarsSegment>(), segs.size(), chunks,
                  ds.as<OptimizerScalars>(), decay, skip.as<std::int32_t>(), ws.get(), ws_bytes, norms.as<float>(),
                  norm_stride);
      sync();
      cpu::lars_update(w.data(), g.data(), v.data(), csegs.data(), csegs.size(), &s, decay, nullptr);
      const std::string at = std::string("lars") + (decay ? " wd" : "") + " step " + std::to_string(step);
      expect_rel(download<float>(dw, kN), w, "w " + at);
      expect_rel(download<float>(dv, kN), v, "v " + at);
      const Vec nd = download<float>(norms, segs.size() * norm_stride);
      for (std::size_t i = 0; i < segs.size(); ++i) {
        expect_rel({nd[i * norm_stride]}, {wn[i]}, "‖w‖ " + at);
        expect_rel({nd[i * norm_stride + 1]}, {gn[i]}, "‖g‖ " + at);
      }
    }
    // A skipped step writes the norms but leaves w and v alone.
    const Vec wb = download<float>(dw, kN), vb = download<float>(dv, kN);
    upload_into(skip, std::vector<std::int32_t>{1});
    lars_norms(stream, dw.as<float>(), dg.as<float>(), dsegs.as<LarsSegment>(), segs.size(), chunks, ws.get(), ws_bytes);
    lars_update(stream, dw.as<float>(), dg.as<float>(), dv.as<float>(), dsegs.as<LarsSegment>(), segs.size(), chunks,
                ds.as<OptimizerScalars>(), decay, skip.as<std::int32_t>(), ws.get(), ws_bytes, nullptr, 0);
    sync();
    expect_bits_equal(download<float>(dw, kN), wb, "lars skipped w");
    expect_bits_equal(download<float>(dv, kN), vb, "lars skipped v");
  }
}

}  // namespace
}  // namespace renaissance::cuda::ktest
