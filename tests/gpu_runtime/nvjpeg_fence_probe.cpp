// The nvJPEG state hazard behind kernels/cuda/jpeg_decode.cpp's Fence, on its own (scripts/bench/nvjpeg_fence_probe.sh
// compiles it with the toolkit alone: no project build). The decode-ahead's pattern, one thread, one stream: each
// batch gives its baseline JPEGs to the hardware engines and its progressive one to GPU-hybrid (whose CPU phase
// writes the Huffman-decoded coefficients into the state's pinned buffer, then copies them on the stream), into one of
// three output slots, and a second stream copies the progressive image out after an event, as the trainer's copy
// does. The batch sizes change from batch to batch (the engines' 3 or 2, GPU-hybrid's 1 or 2), so the states are
// initialised again now and then, as the decode-ahead's are. Each copied image is compared with the same JPEG decoded
// alone and synchronously.
//
//   nvjpeg_fence_probe DIR [iterations]   DIR: base_*.jpg (baseline) and prog_*.jpg (progressive)
//
// Prints, without and with the fence (an event after each GPU-hybrid decode, synchronised before the state's next
// one, and the same for the engines' state), how many of the progressive decodes differ from their reference, and the
// largest mean difference.
#include <cuda_runtime.h>
#include <nvjpeg.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

#define CK(x)                                                                          \
  do {                                                                                 \
    const auto rc_ = (x);                                                              \
    if (static_cast<int>(rc_) != 0) {                                                  \
      std::fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, int(rc_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

struct Jpeg {
  std::string name;
  std::vector<unsigned char> bytes;
  int w = 0, h = 0;
  std::size_t size() const { return static_cast<std::size_t>(w) * h * 3; }
};

std::vector<Jpeg> load(const std::filesystem::path& dir, const std::string& prefix, nvjpegHandle_t h) {
  std::vector<Jpeg> out;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    Jpeg j;
    j.name = f.filename().string();
    std::ifstream in(f, std::ios::binary);
    j.bytes.assign(std::istreambuf_iterator<char>(in), {});
    int nc = 0, ws[NVJPEG_MAX_COMPONENT] = {}, hs[NVJPEG_MAX_COMPONENT] = {};
    nvjpegChromaSubsampling_t ss;
    CK(nvjpegGetImageInfo(h, j.bytes.data(), j.bytes.size(), &nc, &ss, ws, hs));
    j.w = ws[0];
    j.h = hs[0];
    out.push_back(std::move(j));
  }
  return out;
}

nvjpegImage_t dest(unsigned char* p, int w) {
  nvjpegImage_t d{};
  d.channel[0] = p;
  d.pitch[0] = static_cast<std::size_t>(w) * 3;
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [iterations]\n", argv[0]);
    return 2;
  }
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 200;
  nvjpegHandle_t hw = nullptr, hy = nullptr;
  if (nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, 0, &hw) != NVJPEG_STATUS_SUCCESS) {
    std::printf("no hardware JPEG decoder on this GPU: the hazard needs the engines' work before GPU-hybrid's\n");
    return 0;
  }
  CK(nvjpegCreateEx(NVJPEG_BACKEND_GPU_HYBRID, nullptr, nullptr, 0, &hy));
  const std::vector<Jpeg> base = load(argv[1], "base_", hy), prog = load(argv[1], "prog_", hy);
  if (base.size() < 3 || prog.empty()) {
    std::fprintf(stderr, "need at least 3 base_*.jpg and 1 prog_*.jpg in %s\n", argv[1]);
    return 2;
  }
  cudaStream_t s = nullptr, copy = nullptr;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));

  // The references: each progressive JPEG decoded alone, synchronously (the same batched GPU-hybrid path).
  nvjpegJpegState_t single = nullptr;
  CK(nvjpegJpegStateCreate(hy, &single));
  CK(nvjpegDecodeBatchedInitialize(hy, single, 1, 1, NVJPEG_OUTPUT_RGBI));
  std::vector<std::vector<unsigned char>> ref;
  std::size_t most = 0;
  for (const Jpeg& p : prog) most = std::max(most, p.size());
  unsigned char* dref = nullptr;
  CK(cudaMalloc(&dref, most));
  for (const Jpeg& p : prog) {
    nvjpegImage_t d = dest(dref, p.w);
    const unsigned char* pp = p.bytes.data();
    const std::size_t pl = p.bytes.size();
    CK(nvjpegDecodeBatched(hy, single, &pp, &pl, &d, s));
    CK(cudaStreamSynchronize(s));
    ref.emplace_back(p.size());
    CK(cudaMemcpy(ref.back().data(), dref, p.size(), cudaMemcpyDeviceToHost));
  }

  for (int fence = 0; fence < 2; ++fence) {
    nvjpegJpegState_t shw = nullptr, shy = nullptr;
    CK(nvjpegJpegStateCreate(hw, &shw));
    CK(nvjpegJpegStateCreate(hy, &shy));
    CK(nvjpegDecodeBatchedInitialize(hw, shw, 3, 1, NVJPEG_OUTPUT_RGBI));
    CK(nvjpegDecodeBatchedInitialize(hy, shy, 1, 1, NVJPEG_OUTPUT_RGBI));
    // Three slots, each holding three baseline images then the progressive one.
    std::size_t slot_bytes = most;
    for (const Jpeg& b : base) slot_bytes += b.size();
    unsigned char* slots[3];
    cudaEvent_t decoded[3], copied[3], hy_done, hw_done;
    for (int k = 0; k < 3; ++k) {
      CK(cudaMalloc(&slots[k], slot_bytes));
      CK(cudaEventCreateWithFlags(&decoded[k], cudaEventDisableTiming));
      CK(cudaEventCreateWithFlags(&copied[k], cudaEventDisableTiming));
      CK(cudaEventRecord(copied[k], copy));
    }
    CK(cudaEventCreateWithFlags(&hy_done, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&hw_done, cudaEventDisableTiming));
    bool hy_pending = false;
    int hw_size = 3, hy_size = 1;
    unsigned char* extra = nullptr;  // the second GPU-hybrid image's place
    CK(cudaMalloc(&extra, most));
    unsigned char* host = nullptr;
    CK(cudaMallocHost(&host, most * static_cast<std::size_t>(iterations)));
    for (int i = 0; i < iterations; ++i) {
      const int k = i % 3;
      CK(cudaEventSynchronize(copied[k]));  // the slot's last image has been copied out
      std::vector<const unsigned char*> ptrs;
      std::vector<std::size_t> lens;
      std::vector<nvjpegImage_t> dests;
      std::size_t at = 0;
      for (int j = 0; j < 3; ++j) {
        const Jpeg& b = base[(i + j) % base.size()];
        ptrs.push_back(b.bytes.data());
        lens.push_back(b.bytes.size());
        dests.push_back(dest(slots[k] + at, b.w));
        at += b.size();
      }
      // The engines' batch: 3 images, or 2 every third batch (the state initialised again when the size changes).
      const int nhw = i % 3 == 2 ? 2 : 3;
      if (fence && i > 0) CK(cudaEventSynchronize(hw_done));
      if (nhw != hw_size) {
        CK(nvjpegDecodeBatchedInitialize(hw, shw, nhw, 1, NVJPEG_OUTPUT_RGBI));
        hw_size = nhw;
      }
      ptrs.resize(static_cast<std::size_t>(nhw));
      lens.resize(static_cast<std::size_t>(nhw));
      dests.resize(static_cast<std::size_t>(nhw));
      CK(nvjpegDecodeBatched(hw, shw, ptrs.data(), lens.data(), dests.data(), s));
      CK(cudaEventRecord(hw_done, s));
      const Jpeg& p = prog[i % prog.size()];
      if (fence && hy_pending) CK(cudaEventSynchronize(hy_done));
      // GPU-hybrid's batch: the progressive image, with a second (written after it, not checked) every other batch.
      const Jpeg& p2 = prog[(i + 1) % prog.size()];
      const int nhy = i % 2 == 1 ? 2 : 1;
      if (nhy != hy_size) {
        CK(nvjpegDecodeBatchedInitialize(hy, shy, nhy, 1, NVJPEG_OUTPUT_RGBI));
        hy_size = nhy;
      }
      const unsigned char* pp[2] = {p.bytes.data(), p2.bytes.data()};
      const std::size_t pl[2] = {p.bytes.size(), p2.bytes.size()};
      nvjpegImage_t pd[2] = {dest(slots[k] + at, p.w), dest(extra, p2.w)};
      CK(nvjpegDecodeBatched(hy, shy, pp, pl, pd, s));
      CK(cudaEventRecord(hy_done, s));
      hy_pending = true;
      CK(cudaEventRecord(decoded[k], s));
      CK(cudaStreamWaitEvent(copy, decoded[k], 0));
      CK(cudaMemcpyAsync(host + most * static_cast<std::size_t>(i), slots[k] + at, p.size(), cudaMemcpyDeviceToHost,
                         copy));
      CK(cudaEventRecord(copied[k], copy));
    }
    CK(cudaDeviceSynchronize());
    int differ = 0;
    double worst = 0;
    for (int i = 0; i < iterations; ++i) {
      const std::size_t r = static_cast<std::size_t>(i) % prog.size();
      const unsigned char* got = host + most * static_cast<std::size_t>(i);
      double sum = 0;
      for (std::size_t b = 0; b < ref[r].size(); ++b) sum += std::abs(int(got[b]) - int(ref[r][b]));
      const double mean = sum / static_cast<double>(ref[r].size());
      if (sum > 0) ++differ;
      worst = std::max(worst, mean);
    }
    std::printf("fence %s: %d of %d progressive decodes differ from their reference (largest mean |diff| %.3f)\n",
                fence ? "on " : "off", differ, iterations, worst);
    CK(cudaFreeHost(host));
    for (int k = 0; k < 3; ++k) {
      cudaFree(slots[k]);
      cudaEventDestroy(decoded[k]);
      cudaEventDestroy(copied[k]);
    }
    cudaEventDestroy(hy_done);
    cudaEventDestroy(hw_done);
    cudaFree(extra);
    nvjpegJpegStateDestroy(shw);
    nvjpegJpegStateDestroy(shy);
  }
  return 0;
}
