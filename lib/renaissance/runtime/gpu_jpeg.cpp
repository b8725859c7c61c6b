#include <renaissance/core/error.h>
#include <renaissance/io/batch_loader.h>
#include <renaissance/io/image.h>
#include <renaissance/runtime/data_pipeline.h>
#include <renaissance/runtime/gpu_jpeg.h>

#ifdef RENAISSANCE_HAVE_CUDA
#include <kernels/cuda/augment.h>
#include <kernels/cuda/runtime_api.h>
#ifdef RENAISSANCE_HAVE_NVJPEG
#include <kernels/cuda/jpeg_decode.h>
#endif
#endif

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

namespace renaissance::runtime {

DecodeMode parse_decode(const std::string& s) {
  if (s == "auto") return DecodeMode::automatic;
  if (s == "gpu") return DecodeMode::gpu;
  if (s == "cpu") return DecodeMode::cpu;
  RN_FAIL_CTX("--decode", "unknown value '{}' (known: auto, gpu, cpu)", s);
}

const char* decode_name(DecodeMode m) {
  switch (m) {
    case DecodeMode::gpu: return "gpu";
    case DecodeMode::cpu: return "cpu";
    default: return "auto";
  }
}

bool nvjpeg_in_build() {
#ifdef RENAISSANCE_HAVE_NVJPEG
  return true;
#else
  return false;
#endif
}

std::string hardware_queue_warning() {
#ifdef RENAISSANCE_HAVE_CUDA
  bool user = false;
  const int n = cuda::hardware_queues(&user);
  if (user && n < cuda::kHardwareQueues)
    return fmt::format(
        "warning: CUDA_DEVICE_MAX_CONNECTIONS={} (from the environment): the step's streams and the JPEG decoders "
        "share hardware queues, and nvJPEG's decode then waits behind the step (unset it: renaissance uses {})",
        n, cuda::kHardwareQueues);
#endif
  return "";
}

DecodeDecision decide_decode(DecodeMode mode, bool cuda_backend, bool jpeg_store, bool nvjpeg) {
  DecodeDecision d;
  if (!jpeg_store) return d;  // nothing to decode
  auto cpu = [&](std::string why) {
    if (mode == DecodeMode::gpu)
      throw Error(fmt::format("JPEG stores cannot be decoded on the GPU: {}", why), "--decode gpu",
                  "--decode auto (or cpu) decodes them with libjpeg-turbo on the loader threads");
    d.reason = std::move(why);
    return d;
  };
  if (mode == DecodeMode::cpu) return cpu("--decode cpu");
  if (!cuda_backend) return cpu("not the CUDA backend");
  if (!nvjpeg) return cpu("this build has no nvJPEG (configure with it: RENAISSANCE_NVJPEG, docs/build.md)");
  // auto stays on the CPU: on the H200 ResNet-50 trains from a JPEG store at 97 % of `bench` with --decode gpu when
  // the store is decoded once into the device cache (2026-12-04; 90-92 % batch by batch), but two trainers of one
  // process did not always decode to the same bits there (GpuJpeg.TrainsFromAJpegStore failed on 2026-12-03, passed
  // on 2026-12-04), so it is opt-in until that is understood.
  if (mode == DecodeMode::automatic)
    return cpu(
        "--decode auto decodes on the CPU until the GPU path is known to be bit-reproducible (--decode gpu: nvJPEG)");
  d.gpu = true;
  return d;
}

namespace {
/// The filter length io::resample_table uses for in -> out (0 when the axis is copied).
int taps_for(std::int64_t in, std::int64_t out) {
  if (in == out) return 0;
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  return static_cast<int>(std::ceil(std::max(scale, 1.0))) * 2 + 1;
}
std::string sample_name(const std::string& path, io::Split split, const std::int64_t* indices, std::int64_t i) {
  return fmt::format("{}: /{}/jpeg sample {}", path, io::split_name(split), indices ? indices[i] : i);
}
}  // namespace

#if defined(RENAISSANCE_HAVE_CUDA) && defined(RENAISSANCE_HAVE_NVJPEG)

namespace {
/// Grows a device buffer (after the stream's work that may still read it).
void grow_device(std::uint8_t** p, std::int64_t* have, std::int64_t need, void* stream, const char* what) {
  if (need <= *have) return;
  cuda::stream_synchronize(stream);
  cuda::device_free(*p);
  *p = nullptr;
  *have = 0;
  const std::int64_t bytes = std::max<std::int64_t>(need + need / 4, 1 << 20);
  *p = static_cast<std::uint8_t*>(cuda::device_alloc(bytes, what));
  *have = bytes;
}

struct Fallbacks {
  std::int64_t count = 0;
  std::string first;
  void add(const Fallbacks& o) {
    if (o.count && count == 0) first = o.first;
    count += o.count;
  }
};

/// One thread's decoding: its nvJPEG state (handles and states are not shared between threads) and scratch.
struct Decoder {
  std::unique_ptr<cuda::JpegDecoder> nvjpeg;
  std::vector<const std::uint8_t*> ptrs;
  std::vector<std::size_t> sizes;
  std::vector<int> failed;
  std::vector<std::string> reasons;

  /// Decodes b into dec on `stream`; what nvJPEG cannot decode is decoded on this thread by libjpeg-turbo (the
  /// exact pixels of the CPU path) and uploaded in order on the same stream, counted in fb; without libjpeg-turbo,
  /// an error naming the sample.
  void decode(const io::EncodedBatch& b, std::int64_t c, const std::string& path, io::Split split,
              const std::int64_t* indices, GpuJpegInput::Decoded& dec, void* stream, Fallbacks* fb) {
    const std::int64_t n = b.count();
    dec.offsets.assign(static_cast<std::size_t>(n) + 1, 0);
    for (std::int64_t i = 0; i < n; ++i)
      dec.offsets[static_cast<std::size_t>(i) + 1] =
          dec.offsets[static_cast<std::size_t>(i)] +
          decoded_image_bytes(b.heights[static_cast<std::size_t>(i)], b.widths[static_cast<std::size_t>(i)], c);
    grow_device(&dec.images, &dec.bytes, dec.offsets.back(), stream, "the decoded JPEG images of a batch");
    ptrs.resize(static_cast<std::size_t>(n));
    sizes.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      ptrs[static_cast<std::size_t>(i)] = b.data(i);
      sizes[static_cast<std::size_t>(i)] = static_cast<std::size_t>(b.size(i));
    }
    failed.clear();
    reasons.clear();
    nvjpeg->decode(static_cast<int>(n), ptrs.data(), sizes.data(), b.heights.data(), b.widths.data(), dec.images,
                   dec.offsets.data(), stream, &failed, &reasons);
    for (std::size_t f = 0; f < failed.size(); ++f) {
      const std::int64_t i = failed[f];
      const std::string name = sample_name(path, split, indices, i);
      if (!io::have_jpeg_codec())
        throw Error(fmt::format("nvJPEG cannot decode it ({}), and this build has no CPU JPEG decoder (libturbojpeg) "
                                "to fall back on",
                                reasons[f]),
                    name, "re-import the image (data import folder), or build with libturbojpeg0-dev");
      const io::Image img = io::decode_image(b.data(i), static_cast<std::size_t>(b.size(i)), static_cast<int>(c), name);
      if (img.height != b.heights[static_cast<std::size_t>(i)] || img.width != b.widths[static_cast<std::size_t>(i)])
        throw Error(fmt::format("decodes to {}x{} but its shape says {}x{}", img.width, img.height,
                                b.widths[static_cast<std::size_t>(i)], b.heights[static_cast<std::size_t>(i)]),
                    name, "the file is corrupt; re-import it");
      cuda::copy_h2d_async(dec.images + dec.offsets[static_cast<std::size_t>(i)], img.pixels.data(),
                           static_cast<std::int64_t>(img.pixels.size()), stream);
      cuda::stream_synchronize(stream);  // img is freed when this iteration ends
      if (fb->count++ == 0) fb->first = fmt::format("{}: {}", name, reasons[f]);
    }
  }
};

/// A batch in the decode-ahead's ring: the copies of what the loader delivered, its decoded images and events.
struct Job {
  enum State { free, decoding, ready };
  State state = free;
  std::int64_t batch = -1;
  io::EncodedBatch enc;
  std::vector<std::int64_t> indices;
  io::Batch meta;
  GpuJpegInput::Decoded dec;
  void* decoded = nullptr;   // event on the decoder's stream: the images are written
  void* rendered = nullptr;  // event on the render's stream: the images are read
  std::exception_ptr error;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

struct GpuJpegInput::Impl {
  Decoder sync;  // decode() and decode_render() on the caller's thread
  Decoded sync_out;
  // The decode-ahead. Lock order: read_mu, then mu. `mu` guards the jobs' states, the counters and fallbacks.
  std::vector<std::unique_ptr<Decoder>> decoders;
  std::vector<void*> streams;  // one per decoder thread
  std::vector<std::unique_ptr<Job>> jobs;
  std::vector<std::thread> threads;
  io::BatchLoader* loader = nullptr;
  io::Split split = io::Split::train;
  mutable std::mutex mu;
  std::mutex read_mu;  // serialises the loader's next() and the copy, so batches are taken in order
  std::condition_variable cv;
  std::int64_t taken = 0, consumed = 0, held = -1, total = -1;
  bool stop = false, active = false;
  Fallbacks fallbacks;  // every thread's
  AheadStats stats;

  Job& job(std::int64_t k) { return *jobs[static_cast<std::size_t>(k % static_cast<std::int64_t>(jobs.size()))]; }
};

GpuJpegInput::GpuJpegInput(std::int64_t channels, std::string path, bool prefer_hardware)
    : m_impl(std::make_unique<Impl>()), m_c(channels), m_path(std::move(path)) {
  RN_CHECK_CTX(channels == 1 || channels == 3, m_path, "JPEG stores of {} channels cannot be decoded by nvJPEG",
               channels);
  m_impl->sync.nvjpeg = std::make_unique<cuda::JpegDecoder>(static_cast<int>(channels), prefer_hardware);
  for (auto& e : m_copied) e = cuda::event_create();
}

GpuJpegInput::~GpuJpegInput() {
  end();
  Impl& I = *m_impl;
  for (auto& e : m_copied)
    if (e) {
      try {
        cuda::event_synchronize(e);
      } catch (...) {
      }
      cuda::event_destroy(e);
    }
  for (auto& j : I.jobs) {
    cuda::device_free(j->dec.images);
    cuda::event_destroy(j->decoded);
    cuda::event_destroy(j->rendered);
  }
  for (void* s : I.streams) cuda::stream_destroy(s);
  cuda::device_free(I.sync_out.images);
  cuda::device_free(m_scratch);
  cuda::device_free(m_table);
  for (auto* p : m_pinned) cuda::pinned_free(p);
}

const char* GpuJpegInput::backend() const { return m_impl->sync.nvjpeg->backend(); }
std::int64_t GpuJpegInput::hardware_images() const {
  std::lock_guard<std::mutex> lk(m_impl->mu);
  std::int64_t n = m_impl->sync.nvjpeg->hardware_images();
  for (const auto& d : m_impl->decoders) n += d->nvjpeg->hardware_images();
  return n;
}
std::int64_t GpuJpegInput::default_images() const {
  std::lock_guard<std::mutex> lk(m_impl->mu);
  std::int64_t n = m_impl->sync.nvjpeg->default_images();
  for (const auto& d : m_impl->decoders) n += d->nvjpeg->default_images();
  return n;
}
std::int64_t GpuJpegInput::cpu_fallbacks() const {
  std::lock_guard<std::mutex> lk(m_impl->mu);
  return m_impl->fallbacks.count;
}
std::string GpuJpegInput::first_fallback() const {
  std::lock_guard<std::mutex> lk(m_impl->mu);
  return m_impl->fallbacks.first;
}
const std::uint8_t* GpuJpegInput::decoded() const { return m_impl->sync_out.images; }
const std::vector<std::int64_t>& GpuJpegInput::offsets() const { return m_impl->sync_out.offsets; }
bool GpuJpegInput::ahead() const { return m_impl->active; }
GpuJpegInput::AheadStats GpuJpegInput::ahead_stats() const {
  std::lock_guard<std::mutex> lk(m_impl->mu);
  return m_impl->stats;
}
const GpuJpegInput::Decoded* GpuJpegInput::current_decoded() const {
  std::lock_guard<std::mutex> lk(m_impl->mu);
  return m_impl->active && m_impl->held >= 0 ? &m_impl->job(m_impl->held).dec : nullptr;
}

void GpuJpegInput::decode(const io::EncodedBatch& b, io::Split split, const std::int64_t* indices, void* stream) {
  Impl& I = *m_impl;
  Fallbacks fb;
  I.sync.decode(b, m_c, m_path, split, indices, I.sync_out, stream, &fb);
  std::lock_guard<std::mutex> lk(I.mu);
  I.fallbacks.add(fb);
}

void GpuJpegInput::begin(io::BatchLoader& loader, io::Split split, int decoders) {
  Impl& I = *m_impl;
  RN_CHECK(!I.active, "internal: a decode-ahead pass is already active");
  RN_CHECK_CTX(decoders >= 1 && decoders <= 16, "--gpu-decoders", "{} decoder threads (1 to 16)", decoders);
  while (static_cast<int>(I.decoders.size()) < decoders) {
    auto d = std::make_unique<Decoder>();
    d->nvjpeg = I.sync.nvjpeg->another();  // the same nvJPEG handles, its own states
    I.decoders.push_back(std::move(d));
    I.streams.push_back(cuda::stream_create_urgent());
  }
  // Two buffers beyond the decoders': the trainer holds one (its render is queued) and the decoders may run a batch
  // further ahead while the trainer waits for an input slot, instead of waiting for it to take the next batch.
  const std::size_t ring = static_cast<std::size_t>(decoders) + 2;
  while (I.jobs.size() < ring) {
    auto j = std::make_unique<Job>();
    j->decoded = cuda::event_create();
    j->rendered = cuda::event_create();
    I.jobs.push_back(std::move(j));
  }
  // (A larger ring from an earlier pass with more decoders stays: more batches ahead, the same results.)
  for (auto& j : I.jobs) {
    j->state = Job::free;
    j->batch = -1;
    j->error = nullptr;
  }
  I.loader = &loader;
  I.split = split;
  I.taken = I.consumed = 0;
  I.held = I.total = -1;
  I.stop = false;
  I.stats = AheadStats{};
  I.active = true;
  const int device = cuda::current_device();  // the caller's: a new thread starts on device 0
  for (int w = 0; w < decoders; ++w)
    I.threads.emplace_back([this, w, device] {
      Impl& J = *m_impl;
      try {
        cuda::set_device(device);
      } catch (...) {
      }
      Decoder& dec = *J.decoders[static_cast<std::size_t>(w)];
      void* stream = J.streams[static_cast<std::size_t>(w)];
      for (;;) {
        std::unique_lock<std::mutex> rl(J.read_mu);
        const auto t_ring = std::chrono::steady_clock::now();
        Job* j = nullptr;
        {
          std::unique_lock<std::mutex> lk(J.mu);
          J.cv.wait(lk, [&] { return J.stop || J.total >= 0 || J.job(J.taken).state == Job::free; });
          if (J.stop || J.total >= 0) return;
          j = &J.job(J.taken);
          j->state = Job::decoding;
          j->batch = J.taken++;
          j->error = nullptr;
        }
        const double ring_s = seconds_since(t_ring);
        const auto t_read = std::chrono::steady_clock::now();
        try {
          std::optional<io::Batch> b = J.loader->next();
          if (!b) {
            std::lock_guard<std::mutex> lk(J.mu);
            J.total = j->batch;
            j->state = Job::free;
            j->batch = -1;
            J.cv.notify_all();
            return;
          }
          RN_CHECK(b->encoded, "internal: the decode-ahead's loader must deliver JPEG bytes (LoaderOptions::encoded)");
          j->indices.assign(b->indices, b->indices + b->count);
          // A swap, not a copy of the ~25 MB of a batch, and the loader's slot back at once: it reads the batch after
          // next while this one decodes (b's pointers into the loader are invalid from here).
          J.loader->take_encoded(j->enc);
          j->meta = *b;
          j->meta.encoded = &j->enc;
          j->meta.indices = j->indices.data();
          j->meta.labels = j->enc.labels.data();
        } catch (...) {
          std::lock_guard<std::mutex> lk(J.mu);
          j->error = std::current_exception();
          j->state = Job::ready;
          J.total = j->batch + 1;
          J.cv.notify_all();
          return;
        }
        rl.unlock();
        const double read_s = seconds_since(t_read);
        Fallbacks fb;
        double slot_s = 0, decode_s = 0;
        try {
          const auto t0 = std::chrono::steady_clock::now();
          cuda::event_synchronize(j->rendered);  // the render of the batch this slot held last has read its images
          slot_s = seconds_since(t0);
          const auto t1 = std::chrono::steady_clock::now();
          dec.decode(j->enc, m_c, m_path, J.split, j->indices.data(), j->dec, stream, &fb);
          cuda::event_record(j->decoded, stream);
          decode_s = seconds_since(t1);
        } catch (...) {
          j->error = std::current_exception();
        }
        std::lock_guard<std::mutex> lk(J.mu);
        J.fallbacks.add(fb);
        J.stats.batches += 1;
        J.stats.ring_s += ring_s;
        J.stats.read_s += read_s;
        J.stats.slot_s += slot_s;
        J.stats.decode_s += decode_s;
        j->state = Job::ready;
        J.cv.notify_all();
      }
    });
}

std::optional<io::Batch> GpuJpegInput::next() {
  Impl& I = *m_impl;
  RN_CHECK(I.active, "internal: next() without a decode-ahead pass");
  std::unique_lock<std::mutex> lk(I.mu);
  if (I.held >= 0) {  // its render is queued (its event recorded) or it was never rendered
    I.job(I.held).state = Job::free;
    I.held = -1;
    I.cv.notify_all();
  }
  const std::int64_t k = I.consumed;
  const auto t0 = std::chrono::steady_clock::now();
  I.cv.wait(lk, [&] {
    const Job& j = I.job(k);
    return (j.batch == k && j.state == Job::ready) || (I.total >= 0 && k >= I.total);
  });
  I.stats.wait_s += seconds_since(t0);
  Job& j = I.job(k);
  if (!(j.batch == k && j.state == Job::ready)) return std::nullopt;
  ++I.consumed;
  I.held = k;
  if (j.error) std::rethrow_exception(j.error);
  return j.meta;
}

void GpuJpegInput::render_current(const std::vector<io::SampleGeometry>& geometry, const Dest& d, const float* mean,
                                  const float* stddev, int slot, void* stream) {
  Impl& I = *m_impl;
  Job* j = nullptr;
  {
    std::lock_guard<std::mutex> lk(I.mu);
    RN_CHECK(I.active && I.held >= 0, "internal: render_current() without a batch from next()");
    j = &I.job(I.held);
  }
  cuda::stream_wait_event(stream, j->decoded);
  render(j->enc, I.split, j->indices.data(), geometry, j->dec, d, mean, stddev, slot, stream);
  cuda::event_record(j->rendered, stream);
}

void GpuJpegInput::copy_current(std::uint8_t* dst, std::int64_t bytes, void* stream) {
  Impl& I = *m_impl;
  Job* j = nullptr;
  {
    std::lock_guard<std::mutex> lk(I.mu);
    RN_CHECK(I.active && I.held >= 0, "internal: copy_current() without a batch from next()");
    j = &I.job(I.held);
  }
  RN_CHECK(!j->dec.offsets.empty() && j->dec.offsets.back() == bytes,
           "internal: a decoded batch of {} bytes copied as {}", j->dec.offsets.empty() ? 0 : j->dec.offsets.back(),
           bytes);
  cuda::stream_wait_event(stream, j->decoded);
  if (bytes > 0) cuda::copy_d2d_async(dst, j->dec.images, bytes, stream);
  cuda::event_record(j->rendered, stream);
}

void GpuJpegInput::end() noexcept {
  Impl& I = *m_impl;
  if (!I.active) return;
  {
    std::lock_guard<std::mutex> lk(I.mu);
    I.stop = true;
    I.cv.notify_all();
  }
  for (auto& t : I.threads) t.join();
  I.threads.clear();
  // A decode nobody renders may still run on a decoder's stream; the next pass's decoders may write its buffer.
  for (void* s : I.streams) {
    try {
      cuda::stream_synchronize(s);
    } catch (...) {
    }
  }
  I.loader = nullptr;
  I.active = false;
}

void GpuJpegInput::decode_render(const io::EncodedBatch& b, io::Split split, const std::int64_t* indices,
                                 const std::vector<io::SampleGeometry>& geometry, const Dest& d, const float* mean,
                                 const float* stddev, int slot, void* stream) {
  decode(b, split, indices, stream);
  render(b, split, indices, geometry, m_impl->sync_out, d, mean, stddev, slot, stream);
}

void GpuJpegInput::render(const io::EncodedBatch& b, io::Split split, const std::int64_t* indices,
                          const std::vector<io::SampleGeometry>& geometry, const Decoded& dec, const Dest& d,
                          const float* mean, const float* stddev, int slot, void* stream) {
  const std::int64_t n = b.count();
  RN_CHECK(static_cast<std::int64_t>(geometry.size()) == n, "internal: {} geometries for {} samples", geometry.size(),
           n);
  RN_CHECK(d.dtype == DType::F32 || d.dtype == DType::F16, "the data buffer must be f32 or f16");
  RN_CHECK(d.channels >= m_c && slot >= 0 && slot < 2, "internal: data buffer of {} channels, slot {}", d.channels,
           slot);
  // The table (labels, geometry, sources) first: its checks fail before anything is queued.
  constexpr int K = cuda::kGatherTableInts;
  const std::int64_t labels_bytes = (n * 4 + 15) & ~std::int64_t(15);
  const std::int64_t table_bytes = (n * K * 4 + 15) & ~std::int64_t(15);
  const std::int64_t bytes = labels_bytes + table_bytes + n * 3 * 8;
  cuda::event_synchronize(m_copied[slot]);  // this slot's previous copy has landed
  if (m_pinned_bytes[slot] < bytes) {
    cuda::pinned_free(m_pinned[slot]);
    m_pinned[slot] = static_cast<std::byte*>(cuda::pinned_alloc(bytes));
    m_pinned_bytes[slot] = bytes;
  }
  std::byte* host = m_pinned[slot];
  std::memcpy(host, b.labels.data(), static_cast<std::size_t>(n) * 4);
  auto* tab = reinterpret_cast<std::int32_t*>(host + labels_bytes);
  int max_taps = 1;
  std::int64_t max_h = 1;
  for (std::int64_t i = 0; i < n; ++i) {
    const io::SampleGeometry& g = geometry[static_cast<std::size_t>(i)];
    const std::int32_t ih = b.heights[static_cast<std::size_t>(i)], iw = b.widths[static_cast<std::size_t>(i)];
    RN_CHECK(g.box_y >= 0 && g.box_x >= 0 && g.box_h > 0 && g.box_w > 0 && g.box_y + g.box_h <= ih &&
                 g.box_x + g.box_w <= iw && g.virt_h > 0 && g.virt_w > 0,
             "internal: box {}x{} at ({}, {}) of a {}x{} image", g.box_h, g.box_w, g.box_y, g.box_x, ih, iw);
    const int taps = std::max(taps_for(g.box_h, g.virt_h), taps_for(g.box_w, g.virt_w));
    if (taps > cuda::kMaxTaps)
      throw Error(fmt::format("resampled from {}x{} to {}x{}: a filter of {} taps, more than the {} the GPU render "
                              "allows",
                              g.box_h, g.box_w, g.virt_h, g.virt_w, taps, cuda::kMaxTaps),
                  sample_name(m_path, split, indices, i),
                  "--decode cpu renders it on the host; or import the store with a smaller --max-side");
    max_taps = std::max(max_taps, std::min(taps + 2, cuda::kMaxTaps));  // the device cache's margin
    max_h = std::max<std::int64_t>(max_h, ih);
    std::int32_t* e = tab + K * i;
    e[0] = static_cast<std::int32_t>(i);
    const std::int32_t f[11] = {g.box_y, g.box_x, g.box_h,   g.box_w,   g.virt_h, g.virt_w,
                                g.top,   g.left,  g.shift_y, g.shift_x, g.flip};
    std::memcpy(e + 1, f, sizeof f);
  }
  auto* src = reinterpret_cast<std::int64_t*>(host + labels_bytes + table_bytes);
  for (std::int64_t i = 0; i < n; ++i) {
    src[3 * i] = dec.offsets[static_cast<std::size_t>(i)];
    src[3 * i + 1] = b.heights[static_cast<std::size_t>(i)];
    src[3 * i + 2] = b.widths[static_cast<std::size_t>(i)];
  }
  const std::int64_t stride = max_h * d.out_w * m_c;
  {
    std::uint8_t* t = reinterpret_cast<std::uint8_t*>(m_table);
    grow_device(&t, &m_table_bytes, bytes, stream, "the JPEG batch's table");
    m_table = reinterpret_cast<std::byte*>(t);
  }
  grow_device(&m_scratch, &m_scratch_bytes, n * stride, stream, "the JPEG render's resampling rows");
  cuda::copy_h2d_async(m_table, host, bytes, stream);
  cuda::event_record(m_copied[slot], stream);
  cuda::GatherParams p;
  p.images = dec.images;
  p.h = max_h;
  p.w = 0;
  p.c = m_c;
  p.labels = reinterpret_cast<const std::int32_t*>(m_table);
  p.table = reinterpret_cast<const std::int32_t*>(m_table + labels_bytes);
  p.cursor = nullptr;
  p.sources = reinterpret_cast<const std::int64_t*>(m_table + labels_bytes + table_bytes);
  p.batch = n;
  p.count = n;
  p.out_h = d.out_h;
  p.out_w = d.out_w;
  p.resample = true;
  p.max_taps = max_taps;
  p.scratch = m_scratch;
  p.scratch_stride = stride;
  // runtime::normalize_images' constants, computed the same way in FP32.
  for (std::int64_t k = 0; k < m_c; ++k) {
    p.scale[k] = 1.0f / (255.0f * stddev[k]);
    p.bias[k] = -mean[k] / stddev[k];
  }
  p.out = d.data;
  p.out_f16 = d.dtype == DType::F16;
  p.out_c = d.channels;
  p.out_labels = reinterpret_cast<std::int32_t*>(d.labels);
  cuda::gather_normalize(p, stream);
}

JpegBenchResult bench_jpeg_decode(const io::DatasetFile& data, const JpegBenchOptions& o) {
  RN_CHECK_CTX(data.storage() == io::Storage::jpeg, data.path(), "bench-decode needs a JPEG store (--store jpeg)");
  RN_CHECK_CTX(o.batch >= 1 && o.size >= 1 && o.passes >= 1, "bench-decode", "batch, size and passes must be >= 1");
  const std::int64_t n = o.images > 0 ? std::min(o.images, data.size(io::Split::train)) : data.size(io::Split::train);
  RN_CHECK_CTX(n > 0, data.path(), "the train split is empty");
  GpuJpegInput in(data.channels(), data.path(), o.prefer_hardware);
  void* stream = cuda::stream_create();
  const std::int64_t out_c = 8;  // AMP's FP16 input with padded channels
  auto* out = static_cast<std::byte*>(cuda::device_alloc(o.batch * o.size * o.size * out_c * 2, "bench-decode"));
  auto* labels = static_cast<std::byte*>(cuda::device_alloc(o.batch * 4, "bench-decode"));
  Augmentation aug;
  aug.crop = o.crop;
  aug.horizontal_flip = true;
  const io::AugmentSpec spec = train_spec(aug, o.size, o.size);
  const std::vector<float> mean(static_cast<std::size_t>(data.channels()), 0.5f),
      stddev(static_cast<std::size_t>(data.channels()), 0.25f);
  io::LoaderPool pool(std::max(0, o.loader_threads - 1));
  JpegBenchResult r;
  r.backend = in.backend();
  r.images = n;
  // kind 0: read only; 1: read + decode; 2: read + decode + render; 3: the same through the decode-ahead (what
  // training runs). Pass 0 of each is a warm-up.
  double best[4] = {0, 0, 0, 0};
  GpuJpegInput::Dest d;
  d.labels = labels;
  d.data = out;
  d.dtype = DType::F16;
  d.channels = out_c;
  d.out_h = d.out_w = o.size;
  auto geometry = [&](const io::Batch& b, int pass) {
    std::vector<io::SampleGeometry> geom(static_cast<std::size_t>(b.count));
    for (std::int64_t i = 0; i < b.count; ++i)
      geom[static_cast<std::size_t>(i)] =
          io::sample_geometry(spec, 1, pass, b.first_position + i, b.encoded->heights[static_cast<std::size_t>(i)],
                              b.encoded->widths[static_cast<std::size_t>(i)]);
    return geom;
  };
  for (int kind = 0; kind < 4; ++kind)
    for (int pass = 0; pass <= o.passes; ++pass) {
      std::vector<std::int64_t> order(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
      io::LoaderOptions lo;
      lo.pool = &pool;
      lo.encoded = true;
      const auto t0 = std::chrono::steady_clock::now();
      io::BatchLoader loader(data, io::Split::train, o.batch, std::move(order), {}, std::nullopt, lo);
      double bytes = 0;
      if (kind == 3) {
        in.begin(loader, io::Split::train, o.decoders);
        try {
          while (auto b = in.next()) {
            bytes += static_cast<double>(b->encoded->bytes.size());
            in.render_current(geometry(*b, pass), d, mean.data(), stddev.data(), static_cast<int>(b->index % 2),
                              stream);
          }
        } catch (...) {
          in.end();
          throw;
        }
        in.end();
      }
      while (kind != 3) {
        const std::optional<io::Batch> b = loader.next();
        if (!b) break;
        bytes += static_cast<double>(b->encoded->bytes.size());
        if (kind == 1) in.decode(*b->encoded, io::Split::train, b->indices, stream);
        if (kind == 2)
          in.decode_render(*b->encoded, io::Split::train, b->indices, geometry(*b, pass), d, mean.data(), stddev.data(),
                           static_cast<int>(b->index % 2), stream);
        // the batch's bytes are released at the next next(): nvJPEG has copied what it needs by now
      }
      cuda::stream_synchronize(stream);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (pass > 0) best[kind] = std::max(best[kind], static_cast<double>(n) / s);
      r.encoded_mib = bytes / (1 << 20);
    }
  r.read_per_s = best[0];
  r.decode_per_s = best[1];
  r.render_per_s = best[2];
  r.ahead_per_s = best[3];
  r.cpu_fallbacks = in.cpu_fallbacks();
  r.hardware_images = in.hardware_images();
  r.default_images = in.default_images();
  cuda::device_free(out);
  cuda::device_free(labels);
  cuda::stream_destroy(stream);
  return r;
}

#else  // no nvJPEG in this build

JpegBenchResult bench_jpeg_decode(const io::DatasetFile& data, const JpegBenchOptions&) {
  RN_FAIL_CTX(data.path(), "bench-decode decodes on the GPU: it needs a build with CUDA and nvJPEG");
}

struct GpuJpegInput::Impl {};
GpuJpegInput::GpuJpegInput(std::int64_t, std::string path, bool) : m_path(std::move(path)) {
  RN_FAIL_CTX(m_path, "decoding JPEG stores on the GPU needs a build with CUDA and nvJPEG");
}
GpuJpegInput::~GpuJpegInput() = default;
const char* GpuJpegInput::backend() const { return "none"; }
std::int64_t GpuJpegInput::hardware_images() const { return 0; }
std::int64_t GpuJpegInput::default_images() const { return 0; }
std::int64_t GpuJpegInput::cpu_fallbacks() const { return 0; }
std::string GpuJpegInput::first_fallback() const { return {}; }
const std::uint8_t* GpuJpegInput::decoded() const { return nullptr; }
const std::vector<std::int64_t>& GpuJpegInput::offsets() const {
  static const std::vector<std::int64_t> none;
  return none;
}
void GpuJpegInput::decode(const io::EncodedBatch&, io::Split, const std::int64_t*, void*) {}
void GpuJpegInput::decode_render(const io::EncodedBatch&, io::Split, const std::int64_t*,
                                 const std::vector<io::SampleGeometry>&, const Dest&, const float*, const float*, int,
                                 void*) {}
void GpuJpegInput::render(const io::EncodedBatch&, io::Split, const std::int64_t*,
                          const std::vector<io::SampleGeometry>&, const Decoded&, const Dest&, const float*,
                          const float*, int, void*) {}
void GpuJpegInput::begin(io::BatchLoader&, io::Split, int) {}
std::optional<io::Batch> GpuJpegInput::next() { return std::nullopt; }
void GpuJpegInput::render_current(const std::vector<io::SampleGeometry>&, const Dest&, const float*, const float*, int,
                                  void*) {}
void GpuJpegInput::copy_current(std::uint8_t*, std::int64_t, void*) {}
void GpuJpegInput::end() noexcept {}
bool GpuJpegInput::ahead() const { return false; }
GpuJpegInput::AheadStats GpuJpegInput::ahead_stats() const { return {}; }
const GpuJpegInput::Decoded* GpuJpegInput::current_decoded() const { return nullptr; }

#endif

}  // namespace renaissance::runtime
