#include <renaissance/core/error.h>
#include <renaissance/io/batch_loader.h>
#include <renaissance/runtime/gpu_input.h>
#include <renaissance/runtime/gpu_jpeg.h>
#include <renaissance/runtime/memory_guard.h>

#ifdef RENAISSANCE_HAVE_CUDA
#include <kernels/cuda/augment.h>
#include <kernels/cuda/device_info.h>
#include <kernels/cuda/runtime_api.h>
#endif

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

namespace renaissance::runtime {

DataCacheMode parse_data_cache(const std::string& s) {
  if (s == "auto") return DataCacheMode::automatic;
  if (s == "off") return DataCacheMode::off;
  if (s == "on") return DataCacheMode::on;
  RN_FAIL_CTX("--data-cache", "unknown value '{}' (known: auto, off, on)", s);
}

const char* data_cache_name(DataCacheMode m) {
  switch (m) {
    case DataCacheMode::off: return "off";
    case DataCacheMode::on: return "on";
    default: return "auto";
  }
}

DataCacheDecision decide_data_cache(const DataCacheRequest& r) {
  DataCacheDecision d;
  auto no = [&](std::string why) {
    if (r.mode == DataCacheMode::on)
      throw Error(fmt::format("the device-resident dataset cache cannot be used: {}", why), "--data-cache on",
                  "--data-cache auto falls back to the host loader");
    d.reason = std::move(why);
    return d;
  };
  if (r.mode == DataCacheMode::off) return no("--data-cache off");
  if (!r.gpu) return no("not the CUDA backend");
  if (!r.raw_store && !r.jpeg_on_gpu)
    return no("a JPEG store decoded on the CPU (the cache holds the images nvJPEG decodes: --decode gpu)");
  if (r.progressive) return no("progressive resize (--start-resolution), which this build renders on the host");
  if (r.total_bytes >= 0) {
    const auto share = static_cast<std::int64_t>(kDataCacheShare * static_cast<double>(r.total_bytes));
    if (r.bytes > share)
      return no(fmt::format("{} of images exceed {:.0f} % of the device's {}", gib(r.bytes), 100 * kDataCacheShare,
                            gib(r.total_bytes)));
  }
  if (r.free_bytes >= 0 && r.bytes + kDataCacheHeadroom > r.free_bytes)
    return no(fmt::format("{} of images and {} of headroom exceed the {} free", gib(r.bytes), gib(kDataCacheHeadroom),
                          gib(r.free_bytes)));
  d.use = true;
  return d;
}

void device_memory_now(std::int64_t* free_bytes, std::int64_t* total_bytes) {
#ifdef RENAISSANCE_HAVE_CUDA
  cuda::device_memory(free_bytes, total_bytes);
#else
  *free_bytes = *total_bytes = -1;
#endif
}

struct GpuDataCache::Split {
  std::int64_t n = 0;
  std::uint8_t* images = nullptr;
  std::int32_t* labels = nullptr;
  std::int32_t* table = nullptr;   // [n, kGatherTableInts]
  std::int32_t* cursor = nullptr;  // one int
  std::vector<std::int32_t> host_table;
  // JPEG stores: image i at byte offset sources[3i], sources[3i+1] x sources[3i+2] (h x w) x c (kernels/cuda/augment.h)
  std::int64_t* sources = nullptr;
  std::vector<std::int64_t> host_sources;
  Split() = default;
  Split(const Split&) = delete;
  Split& operator=(const Split&) = delete;
  ~Split();  // frees the device memory (also when a constructor of the cache fails half-way)
};

namespace {
/// A JPEG store's images laid out as GpuJpegInput's decode lays out a batch (256-aligned, one after the other), so a
/// decoded batch is one contiguous piece of the split's: [count, 3] (offset, h, w) and the total in *bytes.
std::vector<std::int64_t> jpeg_layout(const io::DatasetFile& data, io::Split s, std::int64_t* bytes) {
  const std::vector<std::int32_t>& shapes = data.jpeg_shapes(s);
  const std::int64_t n = data.size(s), c = data.channels();
  RN_CHECK_CTX(static_cast<std::int64_t>(shapes.size()) == 2 * n, data.path(), "{} shapes for {} {} images",
               shapes.size() / 2, n, io::split_name(s));
  std::vector<std::int64_t> src(static_cast<std::size_t>(3 * n));
  std::int64_t at = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t h = shapes[static_cast<std::size_t>(2 * i)], w = shapes[static_cast<std::size_t>(2 * i + 1)];
    src[static_cast<std::size_t>(3 * i)] = at;
    src[static_cast<std::size_t>(3 * i + 1)] = h;
    src[static_cast<std::size_t>(3 * i + 2)] = w;
    at += decoded_image_bytes(h, w, c);
  }
  *bytes = at;
  return src;
}

/// Labels must name one of the model's classes (both cache constructors check every label they upload).
void check_label(std::int32_t label, io::Split s, std::int64_t i, int num_classes, const std::string& path) {
  if (label < 0 || label >= num_classes)
    throw Error(fmt::format("label {} of {} sample {} is outside [0, {})", label, io::split_name(s), i, num_classes),
                path, "the dataset's num_classes must match the model's classes");
}
}  // namespace

std::int64_t GpuDataCache::jpeg_image_bytes(const io::DatasetFile& data) {
  std::int64_t total = 0;
  for (io::Split s : io::kAllSplits) {
    std::int64_t b = 0;
    jpeg_layout(data, s, &b);
    total += b;
  }
  return total;
}

std::int64_t GpuDataCache::sample_height(io::Split s, std::int64_t i) const {
  const Split& sp = split(s);
  return m_jpeg ? sp.host_sources[static_cast<std::size_t>(3 * i + 1)] : m_h;
}
std::int64_t GpuDataCache::sample_width(io::Split s, std::int64_t i) const {
  const Split& sp = split(s);
  return m_jpeg ? sp.host_sources[static_cast<std::size_t>(3 * i + 2)] : m_w;
}

HostDataset read_host_dataset(const io::DatasetFile& data) {
  HostDataset h;
  for (io::Split s : {io::Split::train, io::Split::val}) {
    const io::SplitInfo& info = data.info(s);
    const auto i = static_cast<std::size_t>(s);
    h.images[i].resize(static_cast<std::size_t>(info.count * info.height * info.width * info.channels));
    h.labels[i].resize(static_cast<std::size_t>(info.count));
    if (info.count > 0) data.read(s, 0, info.count, h.images[i].data(), h.labels[i].data());
  }
  return h;
}

#ifdef RENAISSANCE_HAVE_CUDA

struct GpuDataCache::Graph {
  std::unique_ptr<cuda::GraphExec> exec;
  bool resample = false;
  int max_taps = 0;  ///< the longest filter its shared-memory tables hold
  std::int64_t out_h = 0, out_w = 0;
};

void GpuDataCache::reserve_scratch(std::int64_t batch, std::int64_t out_w) {
  const std::int64_t need = scratch_bytes(batch, out_w);
  if (need <= m_scratch_bytes) return;
  // The captured renders hold the scratch's address: it can only be sized before the first of them.
  for (const auto& [key, g] : m_graphs)
    RN_CHECK(!g->resample, "internal: the resampling scratch must be reserved before the first render is captured");
  cuda::device_free(m_scratch);
  m_bytes -= m_scratch_bytes;
  m_scratch = static_cast<std::uint8_t*>(cuda::device_alloc(need, "the device dataset cache's resampling rows"));
  m_scratch_bytes = need;
  m_bytes += need;
}

GpuDataCache::GpuDataCache(const io::DatasetFile& data, int num_classes, const HostDataset* host) {
  RN_CHECK_CTX(data.storage() == io::Storage::raw, data.path(),
               "internal: the raw-store cache of a JPEG store (the JPEG constructor decodes it)");
  const io::SplitInfo& tr = data.info(io::Split::train);
  m_h = tr.height;
  m_w = tr.width;
  m_c = tr.channels;
  const io::SplitInfo& va = data.info(io::Split::val);
  RN_CHECK_CTX(va.count == 0 || (va.height == m_h && va.width == m_w && va.channels == m_c), data.path(),
               "the val images are {}x{}x{}, the train images {}x{}x{}", va.height, va.width, va.channels, m_h, m_w,
               m_c);
  const std::int64_t image_bytes = m_h * m_w * m_c;
  for (io::Split s : {io::Split::train, io::Split::val}) {
    auto sp = std::make_unique<Split>();
    sp->n = data.size(s);
    const std::int64_t n = std::max<std::int64_t>(sp->n, 1);
    sp->images = static_cast<std::uint8_t*>(cuda::device_alloc(n * image_bytes, "the device dataset cache's images"));
    m_bytes += n * image_bytes;
    allocate_split_tables(*sp);
    // Samples [a, a + k) from host memory: their labels checked, then uploaded.
    auto upload = [&](std::int64_t a, std::int64_t k, const std::uint8_t* images, const std::int32_t* labels) {
      for (std::int64_t i = 0; i < k; ++i) check_label(labels[i], s, a + i, num_classes, data.path());
      cuda::copy_h2d(sp->images + a * image_bytes, images, k * image_bytes);
      cuda::copy_h2d(sp->labels + a, labels, k * 4);
    };
    if (host) {
      const auto i = static_cast<std::size_t>(s);
      RN_CHECK_CTX(static_cast<std::int64_t>(host->labels[i].size()) == sp->n &&
                       static_cast<std::int64_t>(host->images[i].size()) == sp->n * image_bytes,
                   data.path(), "internal: the host copy of the {} split has another size", io::split_name(s));
      if (sp->n > 0) upload(0, sp->n, host->images[i].data(), host->labels[i].data());
    } else {
      // Uploaded in pieces of about 256 MiB (one HDF5 hyperslab each), so the host holds no second copy of the set.
      const std::int64_t piece =
          std::max<std::int64_t>(1, (std::int64_t(256) << 20) / std::max<std::int64_t>(image_bytes, 1));
      std::vector<std::uint8_t> images(static_cast<std::size_t>(std::min(piece, n) * image_bytes));
      std::vector<std::int32_t> labels(static_cast<std::size_t>(std::min(piece, n)));
      for (std::int64_t a = 0; a < sp->n; a += piece) {
        const std::int64_t k = std::min(piece, sp->n - a);
        data.read(s, a, k, images.data(), labels.data());
        upload(a, k, images.data(), labels.data());
      }
    }
    (s == io::Split::train ? m_train : m_val) = std::move(sp);
  }
  m_capture_stream = cuda::stream_create();
}

void GpuDataCache::allocate_split_tables(Split& sp) {
  const std::int64_t n = std::max<std::int64_t>(sp.n, 1);
  sp.labels = static_cast<std::int32_t*>(cuda::device_alloc(n * 4, "the device dataset cache's labels"));
  sp.table = static_cast<std::int32_t*>(
      cuda::device_alloc(n * 4 * cuda::kGatherTableInts, "the device dataset cache's pass table"));
  sp.cursor = static_cast<std::int32_t*>(cuda::device_alloc(16, "the device dataset cache's batch counter"));
  m_bytes += n * (4 + 4 * cuda::kGatherTableInts) + 16;
}

GpuDataCache::GpuDataCache(const io::DatasetFile& data, int num_classes, GpuJpegInput& decoder, io::LoaderPool* pool,
                           int decoders, std::int64_t decode_batch) {
  RN_CHECK_CTX(data.storage() == io::Storage::jpeg, data.path(), "internal: the JPEG cache of a raw store");
  m_jpeg = true;
  m_c = data.channels();
  m_capture_stream = cuda::stream_create();
  // A constructor that throws runs no destructor: the splits made so far free themselves, the stream is freed here.
  struct StreamGuard {
    void*& stream;
    bool armed = true;
    ~StreamGuard() {
      if (armed) cuda::stream_destroy(stream);
    }
  } guard{m_capture_stream};
  const auto t0 = std::chrono::steady_clock::now();
  for (io::Split s : io::kAllSplits) {
    auto sp = std::make_unique<Split>();
    sp->n = data.size(s);
    std::int64_t bytes = 0;
    sp->host_sources = jpeg_layout(data, s, &bytes);
    for (std::int64_t i = 0; i < sp->n; ++i) {
      m_h = std::max(m_h, sp->host_sources[static_cast<std::size_t>(3 * i + 1)]);
      m_w = std::max(m_w, sp->host_sources[static_cast<std::size_t>(3 * i + 2)]);
    }
    sp->images = static_cast<std::uint8_t*>(
        cuda::device_alloc(std::max<std::int64_t>(bytes, 256), "the device dataset cache's decoded JPEG images"));
    sp->sources = static_cast<std::int64_t*>(
        cuda::device_alloc(std::max<std::int64_t>(sp->n, 1) * 3 * 8, "the device dataset cache's image table"));
    m_bytes += std::max<std::int64_t>(bytes, 256) + std::max<std::int64_t>(sp->n, 1) * 3 * 8;
    allocate_split_tables(*sp);
    if (sp->n > 0) cuda::copy_h2d(sp->sources, sp->host_sources.data(), sp->n * 3 * 8);
    // Decoded in stored order, a batch at a time (the decode-ahead: reading, nvJPEG and the copy overlap), each
    // batch copied whole to where its images belong.
    std::vector<std::int32_t> labels(static_cast<std::size_t>(sp->n));
    if (sp->n > 0) {
      std::vector<std::int64_t> order(static_cast<std::size_t>(sp->n));
      std::iota(order.begin(), order.end(), std::int64_t(0));
      io::LoaderOptions lo;
      lo.pool = pool;
      lo.encoded = true;
      io::BatchLoader loader(data, s, std::max<std::int64_t>(decode_batch, 1), std::move(order), {}, std::nullopt, lo);
      decoder.begin(loader, s, decoders);
      try {
        while (auto b = decoder.next()) {
          const std::int64_t first = b->first_position, k = b->count;
          for (std::int64_t i = 0; i < k; ++i) {
            check_label(b->labels[i], s, first + i, num_classes, data.path());
            labels[static_cast<std::size_t>(first + i)] = b->labels[i];
          }
          const std::int64_t from = sp->host_sources[static_cast<std::size_t>(3 * first)];
          const std::int64_t to =
              first + k < sp->n ? sp->host_sources[static_cast<std::size_t>(3 * (first + k))] : bytes;
          decoder.copy_current(sp->images + from, to - from, m_capture_stream);
        }
      } catch (...) {
        decoder.end();
        throw;
      }
      decoder.end();
      cuda::stream_synchronize(m_capture_stream);
      cuda::copy_h2d(sp->labels, labels.data(), sp->n * 4);
    }
    (s == io::Split::train ? m_train : m_val) = std::move(sp);
  }
  m_decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  guard.armed = false;
}

std::vector<std::uint8_t> GpuDataCache::image(io::Split s, std::int64_t i) const {
  const Split& sp = split(s);
  RN_CHECK(i >= 0 && i < sp.n, "internal: image {} of {}", i, sp.n);
  const std::int64_t h = sample_height(s, i), w = sample_width(s, i);
  std::vector<std::uint8_t> px(static_cast<std::size_t>(h * w * m_c));
  const std::int64_t at = m_jpeg ? sp.host_sources[static_cast<std::size_t>(3 * i)] : i * m_h * m_w * m_c;
  cuda::copy_d2h(px.data(), sp.images + at, static_cast<std::int64_t>(px.size()));
  return px;
}

GpuDataCache::Split::~Split() {
  cuda::device_free(images);
  cuda::device_free(labels);
  cuda::device_free(table);
  cuda::device_free(cursor);
  cuda::device_free(sources);
}

GpuDataCache::~GpuDataCache() {
  m_graphs.clear();
  cuda::stream_destroy(m_capture_stream);
  cuda::device_free(m_scratch);
  // m_train and m_val free their own device memory.
}

void GpuDataCache::prepare(io::Split s, int slot, std::int64_t batch, std::int64_t count, const Dest& d,
                           const float* mean, const float* stddev, std::int64_t out_h, std::int64_t out_w,
                           bool resample) {
  const auto key = std::make_tuple(static_cast<int>(s), slot, count);
  if (m_graphs.count(key)) return;
  RN_CHECK(d.dtype == DType::F32 || d.dtype == DType::F16, "the data buffer must be f32 or f16");
  RN_CHECK(m_c <= 16 && d.channels >= m_c, "data buffer of {} channels for images of {}", d.channels, m_c);
  RN_CHECK(resample || (out_h == m_h && out_w == m_w && !m_jpeg),
           "internal: {}x{} images gathered into {}x{} as they are", m_h, m_w, out_h, out_w);
  const Split& sp = split(s);
  cuda::GatherParams p;
  p.images = sp.images;
  p.h = m_h;  // JPEG stores: the tallest image (the scratch's rows); each image's own size is in p.sources
  p.w = m_w;
  p.c = m_c;
  p.sources = sp.sources;
  p.labels = sp.labels;
  p.table = sp.table;
  p.cursor = sp.cursor;
  p.batch = batch;
  p.count = count;
  p.out_h = out_h;
  p.out_w = out_w;
  p.resample = resample;
  if (resample) {
    // Random-resized boxes lie inside the image and are resampled to the output size; centre crops resize the
    // whole image to at least the output's short side: 2 ceil(source / output) + 1 taps at most (begin_pass checks).
    const std::int64_t ratio = std::max<std::int64_t>({1, (m_h + out_h - 1) / out_h, (m_w + out_w - 1) / out_w,
                                                       (m_h + out_w - 1) / out_w, (m_w + out_h - 1) / out_h});
    m_max_taps = std::max(m_max_taps, static_cast<int>(std::min<std::int64_t>(2 * ratio + 3, cuda::kMaxTaps)));
    reserve_scratch(batch, out_w);
    p.max_taps = m_max_taps;
    p.scratch = m_scratch;
  }
  // runtime::normalize_images' constants, computed the same way in FP32.
  for (std::int64_t k = 0; k < m_c; ++k) {
    p.scale[k] = 1.0f / (255.0f * stddev[k]);
    p.bias[k] = -mean[k] / stddev[k];
  }
  p.out = d.data;
  p.out_f16 = d.dtype == DType::F16;
  p.out_c = d.channels;
  p.out_labels = reinterpret_cast<std::int32_t*>(d.labels);
  auto g = std::make_unique<Graph>();
  g->exec = cuda::GraphExec::capture(m_capture_stream, [&] {
    cuda::gather_normalize(p, m_capture_stream);
    cuda::advance_cursor(sp.cursor, m_capture_stream);
  });
  g->resample = resample;
  g->max_taps = p.max_taps;
  g->out_h = out_h;
  g->out_w = out_w;
  m_graphs[key] = std::move(g);
}

namespace {
/// The filter length io::resample_table uses for in -> out (0 when the axis is copied).
int taps_for(std::int64_t in, std::int64_t out) {
  if (in == out) return 0;
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  return static_cast<int>(std::ceil(std::max(scale, 1.0))) * 2 + 1;
}
}  // namespace

void GpuDataCache::begin_pass(io::Split s, const std::vector<std::int64_t>& order,
                              const std::vector<io::SampleGeometry>* geometry) {
  Split& sp = split(s);
  RN_CHECK(static_cast<std::int64_t>(order.size()) <= sp.n, "internal: a pass of {} samples over {}", order.size(),
           sp.n);
  RN_CHECK(!geometry || geometry->size() == order.size(), "internal: {} geometries for {} samples", geometry->size(),
           order.size());
  // Which captured renders read this pass: those of this split (all resample, or none).
  bool resample = false, plain = false;
  int max_taps = cuda::kMaxTaps;  // the least any of the split's renders holds
  for (const auto& [key, g] : m_graphs) {
    if (std::get<0>(key) != static_cast<int>(s)) continue;
    (g->resample ? resample : plain) = true;
    if (g->resample) max_taps = std::min(max_taps, g->max_taps);
  }
  constexpr int K = cuda::kGatherTableInts;
  RN_CHECK(geometry || !m_jpeg, "internal: a pass over a JPEG store's cache without geometry");
  sp.host_table.assign(order.size() * K + K, 0);
  for (std::size_t p = 0; p < order.size(); ++p) {
    std::int32_t* e = sp.host_table.data() + K * p;
    RN_CHECK(order[p] >= 0 && order[p] < sp.n, "internal: sample {} of {}", order[p], sp.n);
    const std::int64_t ih = sample_height(s, order[p]), iw = sample_width(s, order[p]);
    io::SampleGeometry g;
    if (geometry) {
      g = (*geometry)[p];
    } else {
      g.box_h = g.virt_h = static_cast<std::int32_t>(m_h);
      g.box_w = g.virt_w = static_cast<std::int32_t>(m_w);
    }
    const bool whole = g.box_y == 0 && g.box_x == 0 && g.box_h == ih && g.box_w == iw && g.virt_h == ih &&
                       g.virt_w == iw && g.top == 0 && g.left == 0;
    RN_CHECK(whole || !plain, "internal: a resampled geometry for a gather captured without resampling");
    if (resample) {
      RN_CHECK(g.box_y >= 0 && g.box_x >= 0 && g.box_h > 0 && g.box_w > 0 && g.box_y + g.box_h <= ih &&
                   g.box_x + g.box_w <= iw && g.virt_h > 0 && g.virt_w > 0,
               "internal: box {}x{} at ({}, {}) of a {}x{} image", g.box_h, g.box_w, g.box_y, g.box_x, ih, iw);
      const int taps = std::max(taps_for(g.box_h, g.virt_h), taps_for(g.box_w, g.virt_w));
      if (taps > max_taps)
        throw Error(fmt::format("sample {} is resampled from {}x{} to {}x{}: a filter of {} taps, more than the {} "
                                "the device cache's render allows",
                                order[p], g.box_h, g.box_w, g.virt_h, g.virt_w, taps, max_taps),
                    "--data-cache",
                    m_jpeg ? "--data-cache off renders it batch by batch; or import the store with a smaller --max-side"
                           : "--data-cache off renders it on the host; or import the store at a smaller --size");
    }
    e[0] = static_cast<std::int32_t>(order[p]);
    const std::int32_t f[11] = {g.box_y, g.box_x, g.box_h,   g.box_w,   g.virt_h, g.virt_w,
                                g.top,   g.left,  g.shift_y, g.shift_x, g.flip};
    std::memcpy(e + 1, f, sizeof f);
  }
  // The table, then the counter's 0 (copy_h2d waits for the device: no gather of the last pass is still running).
  if (!order.empty()) cuda::copy_h2d(sp.table, sp.host_table.data(), static_cast<std::int64_t>(order.size() * K * 4));
  const std::int32_t zero[4] = {0, 0, 0, 0};
  cuda::copy_h2d(sp.cursor, zero, sizeof zero);
}

void GpuDataCache::launch(io::Split s, int slot, std::int64_t count, void* stream) const {
  auto it = m_graphs.find(std::make_tuple(static_cast<int>(s), slot, count));
  RN_CHECK(it != m_graphs.end(), "internal: no gather captured for a batch of {} in slot {}", count, slot);
  it->second->exec->launch(stream);
}

#else  // CPU-only build

struct GpuDataCache::Graph {};
GpuDataCache::Split::~Split() = default;
GpuDataCache::GpuDataCache(const io::DatasetFile& data, int, const HostDataset*) {
  RN_FAIL_CTX(data.path(), "the device dataset cache needs a build with CUDA");
}
GpuDataCache::GpuDataCache(const io::DatasetFile& data, int, GpuJpegInput&, io::LoaderPool*, int, std::int64_t) {
  RN_FAIL_CTX(data.path(), "the device dataset cache needs a build with CUDA");
}
void GpuDataCache::allocate_split_tables(Split&) {}
std::vector<std::uint8_t> GpuDataCache::image(io::Split, std::int64_t) const { return {}; }
GpuDataCache::~GpuDataCache() = default;
void GpuDataCache::prepare(io::Split, int, std::int64_t, std::int64_t, const Dest&, const float*, const float*,
                           std::int64_t, std::int64_t, bool) {}
void GpuDataCache::begin_pass(io::Split, const std::vector<std::int64_t>&, const std::vector<io::SampleGeometry>*) {}
void GpuDataCache::reserve_scratch(std::int64_t, std::int64_t) {}
void GpuDataCache::launch(io::Split, int, std::int64_t, void*) const {}

#endif

GpuDataCache::Split& GpuDataCache::split(io::Split s) { return s == io::Split::train ? *m_train : *m_val; }
const GpuDataCache::Split& GpuDataCache::split(io::Split s) const { return s == io::Split::train ? *m_train : *m_val; }

}  // namespace renaissance::runtime
