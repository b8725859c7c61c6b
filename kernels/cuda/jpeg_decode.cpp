// See jpeg_decode.h. Compiled only with nvJPEG (kernels/cuda/CMakeLists.txt: RENAISSANCE_HAVE_NVJPEG).
#include <kernels/cuda/common.h>
#include <kernels/cuda/jpeg_decode.h>

#include <nvjpeg.h>

#include <fmt/format.h>

#include <algorithm>
#include <string>

namespace renaissance::cuda {

bool nvjpeg_in_build() { return true; }

/// The nvJPEG library handles, shared by every decoder made from the first (nvJPEG's handles are thread-safe; its
/// states are not, so each decoder, one per thread, has its own).
struct JpegDecoder::Handles {
  nvjpegHandle_t hw = nullptr;   ///< NVJPEG_BACKEND_HARDWARE (nullptr: none)
  nvjpegHandle_t def = nullptr;  ///< GPU_HYBRID, else DEFAULT
  const char* def_name = "default";
  ~Handles() {
    if (hw) nvjpegDestroy(hw);
    if (def) nvjpegDestroy(def);
  }
};

namespace {

const char* status_name(nvjpegStatus_t s) {
  switch (s) {
    case NVJPEG_STATUS_SUCCESS: return "success";
    case NVJPEG_STATUS_NOT_INITIALIZED: return "not initialised";
    case NVJPEG_STATUS_INVALID_PARAMETER: return "invalid parameter";
    case NVJPEG_STATUS_BAD_JPEG: return "bad JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED: return "JPEG not supported";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE: return "allocator failure";
    case NVJPEG_STATUS_EXECUTION_FAILED: return "execution failed";
    case NVJPEG_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case NVJPEG_STATUS_INTERNAL_ERROR: return "internal error";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED: return "implementation not supported";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM: return "incomplete bitstream";
    default: return "unknown status";
  }
}

#define NVJPEG_CHECK(expr)                                                                                            \
  do {                                                                                                                \
    const nvjpegStatus_t rn_nvjpeg_st_ = (expr);                                                                      \
    if (rn_nvjpeg_st_ != NVJPEG_STATUS_SUCCESS)                                                                       \
      ::renaissance::detail::throw_error(__FILE__, __LINE__,                                                          \
                                         ::fmt::format("{} failed: nvJPEG status {} ({})", #expr,                     \
                                                       static_cast<int>(rn_nvjpeg_st_), status_name(rn_nvjpeg_st_))); \
  } while (0)

/// A fence for one nvJPEG state: an event recorded on the stream after each decode that used the state, waited
/// for before the state is used again (a decode, or an initialisation for another batch size). nvJPEG stages through
/// the state's pinned host buffer (GPU-hybrid: the Huffman-decoded coefficients its CPU phase writes there, copied to
/// the device asynchronously on the stream), and the decode-ahead thread calls again before the stream has run the
/// previous batch. On an H100 (2026-12-05), under load from other test processes, a progressive JPEG decoded by
/// GPU-hybrid after the JPEG engines' batch on the same stream came out 38 levels off on average
/// (GpuJpeg.TheDeviceCacheHoldsTheDecodedStore). That this was the cause is not established: alone, neither the test
/// nor scripts/bench/nvjpeg_fence_probe.sh reproduced it, with or without the fence (docs/input-pipeline.md).
struct Fence {
  cudaEvent_t done = nullptr;
  bool pending = false;
  void create() { CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming)); }
  void wait() {
    if (pending) CUDA_CHECK(cudaEventSynchronize(done));
    pending = false;
  }
  void record(cudaStream_t stream) {
    CUDA_CHECK(cudaEventRecord(done, stream));
    pending = true;
  }
  /// After the last decode it fences has run (a queued copy may still read the state's pinned buffer).
  void destroy() noexcept {
    if (pending) cudaEventSynchronize(done);
    if (done) cudaEventDestroy(done);
    done = nullptr;
    pending = false;
  }
};

/// One backend's handle (owned by Handles) with the states its batched and single-image decodes keep (one thread's).
struct Backend {
  nvjpegHandle_t handle = nullptr;
  nvjpegJpegState_t batched = nullptr;  ///< nvjpegDecodeBatched's state
  nvjpegJpegState_t single = nullptr;   ///< nvjpegDecode's state (the one-by-one retry)
  Fence batched_done, single_done;      ///< the last decode on each state (above)
  int batch_size = -1;                  ///< what `batched` was initialised for (-1: needs initialising)
  void destroy() noexcept {
    batched_done.destroy();
    single_done.destroy();
    if (single) nvjpegJpegStateDestroy(single);
    if (batched) nvjpegJpegStateDestroy(batched);
    single = batched = nullptr;
    handle = nullptr;
  }
};

}  // namespace

struct JpegDecoder::Impl {
  int channels = 3;
  nvjpegOutputFormat_t format = NVJPEG_OUTPUT_RGBI;
  Backend hw, def;  // hw.handle == nullptr: no hardware decoder
  std::string name;
  nvjpegJpegStream_t parsed = nullptr;  // header parsing: the size, components and the hardware check
  std::vector<const unsigned char*> ptrs;
  std::vector<std::size_t> lens;
  std::vector<nvjpegImage_t> dests;
  std::vector<int> which;

  nvjpegImage_t dest(std::uint8_t* out, std::int64_t offset, std::int32_t width) const {
    nvjpegImage_t d{};
    d.channel[0] = out + offset;
    d.pitch[0] = static_cast<std::size_t>(width) * static_cast<std::size_t>(channels);
    return d;
  }

  /// Batched decode of the images `idx` on backend b; false when nvJPEG refused the batch (then nothing is known
  /// to be written, and the state is re-initialised next time).
  bool batched(Backend& b, const std::vector<int>& idx, const std::uint8_t* const* data, const std::size_t* sizes,
               const std::int32_t* widths, std::uint8_t* out, const std::int64_t* offsets, cudaStream_t stream) {
    const int k = static_cast<int>(idx.size());
    if (k == 0) return true;
    b.batched_done.wait();  // the state's previous decode has been copied out of its pinned buffer (Fence)
    if (b.batch_size != k) {
      if (nvjpegDecodeBatchedInitialize(b.handle, b.batched, k, 1, format) != NVJPEG_STATUS_SUCCESS) {
        b.batch_size = -1;
        return false;
      }
      b.batch_size = k;
    }
    ptrs.resize(static_cast<std::size_t>(k));
    lens.resize(static_cast<std::size_t>(k));
    dests.resize(static_cast<std::size_t>(k));
    for (int j = 0; j < k; ++j) {
      const int i = idx[static_cast<std::size_t>(j)];
      ptrs[static_cast<std::size_t>(j)] = data[i];
      lens[static_cast<std::size_t>(j)] = sizes[i];
      dests[static_cast<std::size_t>(j)] = dest(out, offsets[i], widths[i]);
    }
    if (nvjpegDecodeBatched(b.handle, b.batched, ptrs.data(), lens.data(), dests.data(), stream) !=
        NVJPEG_STATUS_SUCCESS) {
      b.batch_size = -1;
      b.batched_done.record(stream);  // whatever the refused call queued
      return false;
    }
    b.batched_done.record(stream);
    return true;
  }
};

JpegDecoder::JpegDecoder(int channels, bool prefer_hardware) {
  RN_CHECK(channels == 1 || channels == 3, "nvJPEG decodes to 1 or 3 channels, not {}", channels);
  auto h = std::make_shared<Handles>();
  if (!prefer_hardware ||
      nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &h->hw) != NVJPEG_STATUS_SUCCESS)
    h->hw = nullptr;
  // The rest: GPU_HYBRID (Huffman decoding on the GPU for baseline streams in batches of more than 50, nvJPEG's
  // documentation says; the CPU for the others), else whatever the default backend is.
  if (nvjpegCreateEx(NVJPEG_BACKEND_GPU_HYBRID, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &h->def) ==
      NVJPEG_STATUS_SUCCESS) {
    h->def_name = "GPU-hybrid";
  } else {
    h->def = nullptr;
    NVJPEG_CHECK(nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &h->def));
    h->def_name = "default";
  }
  init(std::move(h), channels);
  if (!m_impl->hw.handle && m_handles->hw) {  // no state for the hardware: none of it, for every decoder
    nvjpegDestroy(m_handles->hw);
    m_handles->hw = nullptr;
  }
}

JpegDecoder::JpegDecoder(std::shared_ptr<Handles> handles, int channels) { init(std::move(handles), channels); }

std::unique_ptr<JpegDecoder> JpegDecoder::another() const {
  return std::unique_ptr<JpegDecoder>(new JpegDecoder(m_handles, m_impl->channels));
}

void JpegDecoder::init(std::shared_ptr<Handles> handles, int channels) {
  m_handles = std::move(handles);
  m_impl = std::make_unique<Impl>();
  Impl& I = *m_impl;
  I.channels = channels;
  I.format = channels == 1 ? NVJPEG_OUTPUT_Y : NVJPEG_OUTPUT_RGBI;
  try {
    if (m_handles->hw && nvjpegJpegStateCreate(m_handles->hw, &I.hw.batched) == NVJPEG_STATUS_SUCCESS) {
      I.hw.handle = m_handles->hw;
      I.hw.batched_done.create();
    }
    I.def.handle = m_handles->def;
    NVJPEG_CHECK(nvjpegJpegStateCreate(I.def.handle, &I.def.batched));
    NVJPEG_CHECK(nvjpegJpegStateCreate(I.def.handle, &I.def.single));
    I.def.batched_done.create();
    I.def.single_done.create();
    NVJPEG_CHECK(nvjpegJpegStreamCreate(I.hw.handle ? I.hw.handle : I.def.handle, &I.parsed));
  } catch (...) {
    if (I.parsed) nvjpegJpegStreamDestroy(I.parsed);
    I.hw.destroy();
    I.def.destroy();
    throw;
  }
}

JpegDecoder::~JpegDecoder() {
  if (m_impl->parsed) nvjpegJpegStreamDestroy(m_impl->parsed);
  m_impl->hw.destroy();
  m_impl->def.destroy();
}

const char* JpegDecoder::backend() const {
  Impl& I = *m_impl;
  if (I.name.empty())
    I.name = I.hw.handle ? fmt::format("hardware, {} for the rest", m_handles->def_name) : m_handles->def_name;
  return I.name.c_str();
}

void JpegDecoder::decode(int n, const std::uint8_t* const* data, const std::size_t* sizes, const std::int32_t* heights,
                         const std::int32_t* widths, std::uint8_t* out, const std::int64_t* offsets,
                         StreamHandle stream_handle, std::vector<int>* failed, std::vector<std::string>* reasons) {
  Impl& I = *m_impl;
  auto stream = static_cast<cudaStream_t>(stream_handle);
  auto fail = [&](int i, std::string why) {
    failed->push_back(i);
    reasons->push_back(std::move(why));
  };
  // Sort the batch: what the hardware engines take, what the default backend gets; a header that does not parse
  // or disagrees with the store's shape is a failure at once (nothing is written for it: the shape sizes the
  // destination).
  std::vector<int> to_hw, to_def;
  for (int i = 0; i < n; ++i) {
    // A stream without its end-of-image marker is truncated (libjpeg-turbo, and so the CPU path, refuses it; nvJPEG,
    // the hardware engines above all, may decode what is there without a word).
    bool eoi = false;
    for (std::size_t k = sizes[i] >= 2 ? sizes[i] - 2 : 0; sizes[i] >= 2 && !eoi; --k) {
      eoi = data[i][k] == 0xFF && data[i][k + 1] == 0xD9;
      if (k == 0 || sizes[i] - k > 64) break;  // trailing bytes after the marker: at most 64
    }
    if (!eoi) {
      fail(i, "no end-of-image marker: the stream is truncated");
      continue;
    }
    // The header only (the decode parses the stream itself): its size, components and whether the engines take it.
    unsigned h = 0, w = 0, nc = 0;
    if (nvjpegJpegStreamParseHeader(I.hw.handle ? I.hw.handle : I.def.handle, data[i], sizes[i], I.parsed) !=
            NVJPEG_STATUS_SUCCESS ||
        nvjpegJpegStreamGetFrameDimensions(I.parsed, &w, &h) != NVJPEG_STATUS_SUCCESS ||
        nvjpegJpegStreamGetComponentsNum(I.parsed, &nc) != NVJPEG_STATUS_SUCCESS) {
      fail(i, "nvJPEG cannot parse its header");
      continue;
    }
    if (static_cast<std::int64_t>(h) != heights[i] || static_cast<std::int64_t>(w) != widths[i]) {
      fail(i, fmt::format("decodes to {}x{} but its shape says {}x{}", w, h, widths[i], heights[i]));
      continue;
    }
    if (nc != 1 && nc != 3) {
      fail(i, fmt::format("{} colour components (CMYK?), which nvJPEG does not convert", nc));
      continue;
    }
    int unsupported = 1;
    const bool hw_ok = I.hw.handle &&
                       nvjpegDecodeBatchedSupported(I.hw.handle, I.parsed, &unsupported) == NVJPEG_STATUS_SUCCESS &&
                       unsupported == 0;
    (hw_ok ? to_hw : to_def).push_back(i);
  }
  if (!I.batched(I.hw, to_hw, data, sizes, widths, out, offsets, stream)) {
    to_def.insert(to_def.end(), to_hw.begin(), to_hw.end());  // the hardware refused the batch: try the default
    to_hw.clear();
  }
  m_hw_images += static_cast<std::int64_t>(to_hw.size());
  std::sort(to_def.begin(), to_def.end());
  if (I.batched(I.def, to_def, data, sizes, widths, out, offsets, stream)) {
    m_default_images += static_cast<std::int64_t>(to_def.size());
    return;
  }
  // The batch was refused (one bad image spoils it): one by one, to find out which.
  for (int i : to_def) {
    nvjpegImage_t d = I.dest(out, offsets[i], widths[i]);
    I.def.single_done.wait();
    const nvjpegStatus_t st = nvjpegDecode(I.def.handle, I.def.single, data[i], sizes[i], I.format, &d, stream);
    I.def.single_done.record(stream);
    if (st == NVJPEG_STATUS_SUCCESS)
      ++m_default_images;
    else
      fail(i, fmt::format("nvJPEG: {}", status_name(st)));
  }
}

}  // namespace renaissance::cuda
