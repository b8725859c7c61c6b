// The error checks (host only), the per-device handles, and the row kernels around cuDNN/cuBLASLt: the bias
// gradient against a double-precision column sum (also bit-identical on two runs), bias add and the staging copy.
#include "dnn_test_util.h"

#include <kernels/cuda/dnn_bias.h>

namespace renaissance::cuda::test {
namespace {

// ---- error checks: pure host code, they run without a GPU ------------------------------------------------------------

TEST(DnnChecks, CudnnCheckNamesCallStatusAndPlace) {
  try {
    CUDNN_CHECK(CUDNN_STATUS_BAD_PARAM);
    FAIL() << "no exception";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("CUDNN_STATUS_BAD_PARAM"), std::string::npos) << what;
    EXPECT_NE(what.find("failed"), std::string::npos) << what;
    EXPECT_NE(e.where().find("test_dnn_common.cpp"), std::string::npos) << e.where();
  }
  EXPECT_NO_THROW(CUDNN_CHECK(CUDNN_STATUS_SUCCESS));
}

TEST(DnnChecks, CublasCheckNamesCallStatusAndPlace) {
  try {
    CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED);
    FAIL() << "no exception";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("CUBLAS_STATUS_NOT_SUPPORTED"), std::string::npos) << what;
    EXPECT_NE(e.where().find("test_dnn_common.cpp"), std::string::npos) << e.where();
  }
  EXPECT_NO_THROW(CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS));
}

// ---- handles -----------------------------------------------------------------------------------------------------------

TEST(DnnHandles, OnePerDeviceAndBoundToAStream) {
  RN_SKIP_WITHOUT_GPU();
  DnnHandles& a = handles();
  DnnHandles& b = handles();
  EXPECT_EQ(&a, &b);
  EXPECT_NE(a.cudnn(), nullptr);
  EXPECT_NE(a.cublaslt(), nullptr);
  Stream s;
  a.set_stream(s.get());
  EXPECT_EQ(a.stream(), s.get());
  cudaStream_t bound = nullptr;
  ASSERT_EQ(cudnnGetStream(a.cudnn(), &bound), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(bound, s.get());
  a.set_stream(nullptr);
}

// ---- row kernels -------------------------------------------------------------------------------------------------------

struct RowCase {
  std::int64_t rows, c, ld;
  DType t;
};

class GpuRows : public ::testing::TestWithParam<RowCase> {};

TEST_P(GpuRows, BiasGradientMatchesDoubleSumsAndRepeatsBitForBit) {
  RN_SKIP_WITHOUT_GPU();
  const RowCase k = GetParam();
  std::vector<float> dy = random_vec(static_cast<std::size_t>(k.rows * k.c), 11);
  quantize(dy, k.t);
  const std::vector<float> db0 = random_vec(static_cast<std::size_t>(k.c), 12);
  DevTensor d(k.rows, k.c, k.ld, k.t);
  d.upload(dy, 1e6f);  // padding must not be summed
  DevF32 db(static_cast<std::size_t>(k.c));
  DeviceBuffer ws(bias_grad_workspace_bytes(k.rows, k.c));
  Stream s;
  for (const bool acc : {false, true}) {
    std::vector<double> ref(static_cast<std::size_t>(k.c), 0.0);
    for (std::int64_t r = 0; r < k.rows; ++r)
      for (std::int64_t c = 0; c < k.c; ++c) ref[c] += dy[r * k.c + c];
    std::vector<float> reff(ref.size());
    for (std::size_t c = 0; c < ref.size(); ++c) reff[c] = static_cast<float>(2.0 * ref[c] + (acc ? db0[c] : 0.0));
    std::vector<std::uint8_t> first;
    for (int run = 0; run < 2; ++run) {
      db.upload(acc ? db0 : nan_vec(db0.size()));
      bias_grad_rows(s.get(), d.ptr(), k.t, k.rows, k.c, k.ld, db.get(), acc, 2.0f, ws.get(), ws.bytes());
      s.sync();
      if (run == 0) {
        first = db.bytes();
        EXPECT_TRUE(close(db.download(), reff, 1e-5)) << "accumulate=" << acc;
      } else {
        EXPECT_TRUE(db.bytes() == first) << "two runs differ";
      }
    }
  }
}

TEST_P(GpuRows, BiasAddAndStagingCopy) {
  RN_SKIP_WITHOUT_GPU();
  const RowCase k = GetParam();
  std::vector<float> y = random_vec(static_cast<std::size_t>(k.rows * k.c), 21);
  quantize(y, k.t);
  const std::vector<float> bias = random_vec(static_cast<std::size_t>(k.c), 22);
  DevTensor d(k.rows, k.c, k.ld, k.t);
  d.upload(y, 0.0f);
  DevF32 b(bias.size());
  b.upload(bias);
  Stream s;
  add_bias_rows(s.get(), d.ptr(), k.t, k.rows, k.c, k.ld, b.get());
  s.sync();
  std::vector<float> ref(y.size());
  for (std::int64_t r = 0; r < k.rows; ++r)
    for (std::int64_t c = 0; c < k.c; ++c) ref[r * k.c + c] = y[r * k.c + c] + bias[c];
  EXPECT_TRUE(close(d.download(), ref, tolerance(k.t)));
  EXPECT_TRUE(all_zero(d.padding()));

  // padded -> compact (overwrite: the NaN in the destination is not read), then compact -> padded with beta = 1
  DevTensor compact(k.rows, k.c, k.c, k.t);
  compact.upload(nan_vec(y.size()));
  copy_rows(s.get(), d.ptr(), k.ld, compact.ptr(), k.c, k.t, k.rows, k.c, 0.0f);
  s.sync();
  const std::vector<float> staged = compact.download();
  EXPECT_TRUE(close(staged, d.download(), 0.0));
  copy_rows(s.get(), compact.ptr(), k.c, d.ptr(), k.ld, k.t, k.rows, k.c, 1.0f);
  s.sync();
  std::vector<float> doubled = staged;
  for (float& v : doubled) v *= 2.0f;
  EXPECT_TRUE(close(d.download(), doubled, 0.0));
  EXPECT_TRUE(all_zero(d.padding()));
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuRows,
                         ::testing::Values(RowCase{3, 7, 7, DType::F32}, RowCase{189, 13, 16, DType::F32},
                                           RowCase{189, 13, 16, DType::F16}, RowCase{100000, 64, 64, DType::F32},
                                           RowCase{25088, 100, 104, DType::F16}, RowCase{1, 1000, 1000, DType::F32}),
                         [](const ::testing::TestParamInfo<RowCase>& i) {
                           return fmt::format("r{}_c{}_ld{}_{}", i.param.rows, i.param.c, i.param.ld,
                                              dtype_label(i.param.t));
                         });

}  // namespace
}  // namespace renaissance::cuda::test
