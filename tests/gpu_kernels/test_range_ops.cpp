// CUDA RANGE ops against kernels/cpu/range_ops and the RANGE entries of the CPU adapter (runtime/cpu_ops.cpp):
// odd lengths (vector body + tail), misaligned starts (scalar paths), the NaN/inf flag (zeroed first), the skip flag.
#include "gpu_test_util.h"

#include <kernels/cpu/range_ops.h>
#include <kernels/cuda/range_ops.h>

#include <limits>

namespace renaissance::cuda::ktest {
namespace {

class RangeOpsTest : public GpuTest {};

constexpr std::int64_t kN = 100003;  // odd: a vector body and a tail

TEST_F(RangeOpsTest, ClearAndCopy) {
  for (std::size_t shift : {0u, 4u, 1u}) {
    const std::size_t bytes = 4 * kN + 3;
    std::vector<std::uint8_t> src(bytes + 16);
    std::mt19937 gen(5);
    for (auto& b : src) b = static_cast<std::uint8_t>(gen());
    const DeviceBuffer s = upload(src);
    DeviceBuffer d(bytes + 16);
    d.fill_bytes(0xAB);
    range_copy(stream, d.as<std::uint8_t>() + shift, s.as<std::uint8_t>() + shift, bytes);
    sync();
    const std::vector<std::uint8_t> got = download<std::uint8_t>(d, bytes + 16);
    for (std::size_t i = 0; i < bytes + 16; ++i) {
      const std::uint8_t want = (i >= shift && i < shift + bytes) ? src[i] : 0xAB;
      ASSERT_EQ(got[i], want) << "copy shift " << shift << " byte " << i;
    }
    range_clear(stream, d.as<std::uint8_t>() + shift, bytes);
    sync();
    const std::vector<std::uint8_t> cleared = download<std::uint8_t>(d, bytes + 16);
    for (std::size_t i = 0; i < bytes + 16; ++i)
      ASSERT_EQ(cleared[i], (i >= shift && i < shift + bytes) ? 0 : 0xAB) << "clear shift " << shift << " byte " << i;
  }
}

TEST_F(RangeOpsTest, CastsMatchCpuBitForBit) {
  // Normal values, values that round to FP16 subnormals or overflow, exact ties, zeros of both signs.
  Vec v = random_vec(kN, 11, -70000.0f, 70000.0f);
  const Vec small = random_vec(kN, 12, -1e-4f, 1e-4f);
  for (std::size_t i = 0; i < v.size(); i += 3) v[i] = small[i];
  v[0] = -0.0f;
  v[1] = 0.0f;
  v[2] = 65520.0f;
  v[3] = 65519.0f;
  v[4] = std::numeric_limits<float>::infinity();
  v[5] = 1.0f + 1.0f / 2048.0f;  // a tie: rounds to even
  v[6] = 5.9604644775390625e-8f * 0.5f;
  for (std::int64_t shift : {0, 1}) {
    const std::int64_t n = kN - shift;
    const DeviceBuffer src = upload(v);
    DeviceBuffer h(static_cast<std::size_t>(kN) * 2), back(static_cast<std::size_t>(kN) * 4);
    range_cast_f32_to_f16(stream, src.as<float>() + shift, h.as<std::uint16_t>() + shift, n);
    sync();
    std::vector<std::uint16_t> ref(static_cast<std::size_t>(kN));
    cpu::range_cast_f32_to_f16(v.data() + shift, ref.data() + shift, n);
    const std::vector<std::uint16_t> got = download<std::uint16_t>(h, static_cast<std::size_t>(kN));
    for (std::int64_t i = shift; i < kN; ++i) ASSERT_EQ(got[i], ref[i]) << "f32->f16 element " << i << " of " << v[i];

    range_cast_f16_to_f32(stream, h.as<std::uint16_t>() + shift, back.as<float>() + shift, n);
    sync();
    Vec fref(static_cast<std::size_t>(kN));
    cpu::range_cast_f16_to_f32(ref.data() + shift, fref.data() + shift, n);
    const Vec fgot = download<float>(back, static_cast<std::size_t>(kN));
    for (std::int64_t i = shift; i < kN; ++i) ASSERT_EQ(bits(fgot[i]), bits(fref[i])) << "f16->f32 element " << i;
  }
  // Every non-NaN FP16 pattern widens exactly.
  std::vector<std::uint16_t> all;
  for (std::uint32_t u = 0; u < 65536; ++u)
    if ((u & 0x7c00u) != 0x7c00u || (u & 0x3ffu) == 0) all.push_back(static_cast<std::uint16_t>(u));
  const DeviceBuffer hs = upload(all);
  DeviceBuffer fs(all.size() * 4);
  range_cast_f16_to_f32(stream, hs.as<std::uint16_t>(), fs.as<float>(), static_cast<std::int64_t>(all.size()));
  sync();
  Vec fref(all.size());
  cpu::range_cast_f16_to_f32(all.data(), fref.data(), static_cast<std::int64_t>(all.size()));
  expect_bits_equal(download<float>(fs, all.size()), fref, "all f16 patterns");
}

TEST_F(RangeOpsTest, NanCheckZeroesThenFlags) {
  const Vec a = random_vec(kN, 21), b = random_vec(1001, 22);
  const DeviceBuffer da = upload(a), db = upload(b);
  DeviceBuffer flag(4);
  const std::vector<FloatRange> ranges{{da.as<float>(), kN}, {db.as<float>() + 1, 1000}};
  upload_into(flag, std::vector<std::int32_t>{7});
  range_check_finite(stream, ranges.data(), ranges.size(), flag.as<std::int32_t>());
  sync();
  EXPECT_EQ(download<std::int32_t>(flag, 1)[0], 0) << "clean ranges must clear the flag";

  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (std::int64_t pos : {std::int64_t{0}, std::int64_t{999}, std::int64_t{500}}) {
      Vec bb = b;
      bb[static_cast<std::size_t>(pos) + 1] = bad;
      upload_into(db, bb);
      range_check_finite(stream, ranges.data(), ranges.size(), flag.as<std::int32_t>());
      sync();
      EXPECT_EQ(download<std::int32_t>(flag, 1)[0], 1) << "value " << bad << " at " << pos;
      std::int32_t cpu_flag = 0;
      EXPECT_TRUE(cpu::range_check_finite(bb.data() + 1, 1000, &cpu_flag));
    }
  }
  upload_into(db, b);
  range_check_finite(stream, ranges.data(), ranges.size(), flag.as<std::int32_t>());
  sync();
  EXPECT_EQ(download<std::int32_t>(flag, 1)[0], 0);

  // FP16 ranges (building block: no zeroing).
  std::vector<std::uint16_t> h(4099, cpu::float_to_half(1.5f));
  DeviceBuffer dh = upload(h);
  upload_into(flag, std::vector<std::int32_t>{0});
  range_mark_nonfinite_f16(stream, dh.as<std::uint16_t>(), 4099, flag.as<std::int32_t>());
  sync();
  EXPECT_EQ(download<std::int32_t>(flag, 1)[0], 0);
  for (std::size_t pos : {std::size_t{0}, std::size_t{4095}, std::size_t{4098}}) {
    for (std::uint16_t bad : {std::uint16_t{0x7c00}, std::uint16_t{0xfc00}, std::uint16_t{0x7e00}}) {
      std::vector<std::uint16_t> hb = h;
      hb[pos] = bad;
      upload_into(dh, hb);
      upload_into(flag, std::vector<std::int32_t>{0});
      range_mark_nonfinite_f16(stream, dh.as<std::uint16_t>(), 4099, flag.as<std::int32_t>());
      sync();
      EXPECT_EQ(download<std::int32_t>(flag, 1)[0], 1) << "f16 pattern " << bad << " at " << pos;
    }
  }
}

TEST_F(RangeOpsTest, GradScaleHonoursSkipFlag) {
  const Vec g = random_vec(kN, 31, -100.0f, 100.0f);
  const float scale = 1024.0f * 3.0f;
  for (std::int32_t skip : {0, 1}) {
    for (std::int64_t shift : {0, 3}) {
      const DeviceBuffer dg = upload(g), ls = upload(std::vector<float>{scale, 0, 0, 0}),
                         fl = upload(std::vector<std::int32_t>{skip});
      range_grad_scale(stream, dg.as<float>() + shift, kN - shift, ls.as<float>(), fl.as<std::int32_t>());
      sync();
      Vec ref = g;
      if (skip == 0) cpu::range_scale(ref.data() + shift, kN - shift, 1.0f / scale);
      expect_bits_equal(download<float>(dg, kN), ref, "grad scale skip " + std::to_string(skip));
    }
  }
}

TEST_F(RangeOpsTest, LossScaleUpdateFollowsCpuRule) {
  // state = {scale, clean steps, interval, factor}; the CPU adapter's rule replayed on the host.
  std::vector<float> host{65536.0f, 0.0f, 3.0f, 2.0f};
  const DeviceBuffer state = upload(host);
  DeviceBuffer flag(4);
  const std::vector<std::int32_t> overflow{0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                           0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  for (std::size_t step = 0; step < overflow.size(); ++step) {
    upload_into(flag, std::vector<std::int32_t>{overflow[step]});
    loss_scale_update(stream, state.as<float>(), flag.as<std::int32_t>());
    sync();
    if (overflow[step] != 0) {
      host[1] = host[0] <= 1.0f ? -1.0f : 0.0f;
      host[0] = std::max(1.0f, host[0] / host[3]);
    } else if ((host[1] = std::max(0.0f, host[1]) + 1.0f) >= host[2]) {
      host[0] = std::min(65536.0f * 256.0f, host[0] * host[3]);
      host[1] = 0.0f;
    }
    expect_bits_equal(download<float>(state, 4), host, "loss scale after step " + std::to_string(step));
  }
  // Halving stops at 1; an overflow there marks the clean-step count -1 (the host's "diverged"), a clean step after
  // it counts from 0 again.
  upload_into(state, std::vector<float>{1.5f, 0.0f, 3.0f, 2.0f});
  for (const auto& [flagged, want] : std::vector<std::pair<std::int32_t, std::vector<float>>>{
           {1, {1.0f, 0.0f, 3.0f, 2.0f}}, {1, {1.0f, -1.0f, 3.0f, 2.0f}}, {0, {1.0f, 1.0f, 3.0f, 2.0f}}}) {
    upload_into(flag, std::vector<std::int32_t>{flagged});
    loss_scale_update(stream, state.as<float>(), flag.as<std::int32_t>());
    sync();
    expect_bits_equal(download<float>(state, 4), want, "loss scale at its floor");
  }
}

TEST_F(RangeOpsTest, EmaBnRunningAndMetricAccumulate) {
  const Vec e0 = random_vec(kN, 41), w = random_vec(kN, 42);
  const float decay = 0.999f, momentum = 0.1f;
  const DeviceBuffer d = upload(std::vector<float>{decay}), m = upload(std::vector<float>{momentum});
  for (std::int32_t skip : {0, 1}) {
    for (std::int64_t shift : {0, 1}) {
      const DeviceBuffer de = upload(e0), dw = upload(w), fl = upload(std::vector<std::int32_t>{skip});
      range_ema_update(stream, de.as<float>() + shift, dw.as<float>() + shift, kN - shift, d.as<float>(),
                       fl.as<std::int32_t>());
      sync();
      Vec ref = e0;
      if (skip == 0) cpu::range_ema_update(ref.data() + shift, w.data() + shift, kN - shift, decay);
      expect_bits_equal(download<float>(de, kN), ref, "ema skip " + std::to_string(skip));
    }
  }
  for (std::int32_t skip : {0, 1}) {
    const DeviceBuffer prev = upload(e0), next = upload(w), fl = upload(std::vector<std::int32_t>{skip});
    range_bn_running_update(stream, prev.as<float>(), next.as<float>(), kN, m.as<float>(), fl.as<std::int32_t>());
    sync();
    Vec ref = e0;
    if (skip == 0)
      for (std::size_t i = 0; i < ref.size(); ++i) ref[i] = (1.0f - momentum) * ref[i] + momentum * w[i];
    expect_bits_equal(download<float>(prev, kN), ref, "bn running update skip " + std::to_string(skip));
  }
  {
    const Vec acc{1.0f, 2.0f, 3.0f, 4.0f}, step{0.5f, 7.0f, 9.0f, 32.0f};
    const DeviceBuffer da = upload(acc), ds = upload(step);
    range_metric_accumulate(stream, da.as<float>(), ds.as<float>(), 4);
    sync();
    expect_bits_equal(download<float>(da, 4), Vec{1.5f, 9.0f, 12.0f, 36.0f}, "metric accumulate");
  }
}

}  // namespace
}  // namespace renaissance::cuda::ktest
