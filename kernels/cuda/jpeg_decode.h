// nvJPEG batched decoding for JPEG stores on the GPU (issue 12, docs/input-pipeline.md "JPEG stores on the GPU").
// Built only when CMake found nvJPEG (RENAISSANCE_HAVE_NVJPEG); no CUDA or nvJPEG types here: the runtime calls it.
//
// One decoder holds two nvJPEG handles: the hardware decoder (NVJPEG_BACKEND_HARDWARE, the A100/H100/H200 JPEG
// engines) when the GPU has one, and NVJPEG_BACKEND_GPU_HYBRID (else NVJPEG_BACKEND_DEFAULT) for the images the
// hardware cannot take (progressive, 4:1:0/4:1:1, ...) and on GPUs without it. Images are decoded to interleaved RGB
// (3-channel stores) or to luma (1-channel stores), each at its own offset of one device buffer, pitch width x
// channels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace renaissance::cuda {

using StreamHandle = void*;  ///< a cudaStream_t

/// True when this build has nvJPEG (the library is linked).
bool nvjpeg_in_build();

class JpegDecoder {
 public:
  /// `channels`: 1 (luma) or 3 (RGB). `prefer_hardware`: try NVJPEG_BACKEND_HARDWARE first. Throws when nvJPEG
  /// cannot be initialised (no GPU, no nvJPEG in the build), naming the nvJPEG status.
  JpegDecoder(int channels, bool prefer_hardware = true);
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;
  /// A decoder for another thread: the same nvJPEG handles (thread-safe, and the JPEG engines' one set), its own
  /// states. It may outlive this one.
  std::unique_ptr<JpegDecoder> another() const;

  /// "hardware, GPU-hybrid for the rest" (the JPEG engines take what they can), "GPU-hybrid" or "default".
  const char* backend() const;

  /// Decodes `n` JPEGs (host memory) into `out` (device memory): image i at byte offset offsets[i], heights[i] x
  /// widths[i] x channels, interleaved. The work is queued on `stream` (the host part of the decode, Huffman on the
  /// default backend, runs inside the call; the input bytes may be reused when it returns). Images nvJPEG cannot
  /// decode are not written: their indices are appended to `failed` with nvJPEG's reason in `reasons` (the caller
  /// decodes them on the CPU or stops, naming the sample).
  void decode(int n, const std::uint8_t* const* data, const std::size_t* sizes, const std::int32_t* heights,
              const std::int32_t* widths, std::uint8_t* out, const std::int64_t* offsets, StreamHandle stream,
              std::vector<int>* failed, std::vector<std::string>* reasons);

  /// Images decoded by the hardware engines / by the default backend since construction.
  std::int64_t hardware_images() const { return m_hw_images; }
  std::int64_t default_images() const { return m_default_images; }

 private:
  struct Handles;
  struct Impl;
  JpegDecoder(std::shared_ptr<Handles> handles, int channels);
  void init(std::shared_ptr<Handles> handles, int channels);
  std::shared_ptr<Handles> m_handles;
  std::unique_ptr<Impl> m_impl;
  std::int64_t m_hw_images = 0, m_default_images = 0;
};

}  // namespace renaissance::cuda
