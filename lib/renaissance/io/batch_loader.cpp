#include <renaissance/io/batch_loader.h>

#include <renaissance/core/error.h>
#include <renaissance/io/hdf5_util.h>
#include <renaissance/io/image.h>

#include <algorithm>

namespace renaissance::io {

BatchLoader::BatchLoader(const DatasetFile& file, Split split, std::int64_t batch_size, std::vector<std::int64_t> order,
                         BatchTransform transform, std::optional<BatchBuffers> buffers, LoaderOptions options)
    : m_file(file),
      m_split(split),
      m_batch_size(batch_size),
      m_order(std::move(order)),
      m_transform(std::move(transform)),
      m_options(std::move(options)),
      m_num_batches(batch_size > 0 ? (static_cast<std::int64_t>(m_order.size()) + batch_size - 1) / batch_size : 0) {
  const std::string ctx = fmt::format("{}: split '{}'", file.path(), split_name(split));
  RN_CHECK_CTX(batch_size > 0, ctx, "batch size must be positive, got {}", batch_size);
  const SplitInfo& info = file.info(split);
  m_out_h = m_options.out_h > 0 ? m_options.out_h : info.height;
  m_out_w = m_options.out_w > 0 ? m_options.out_w : info.width;
  RN_CHECK_CTX(!m_options.encoded || file.storage() == Storage::jpeg, ctx,
               "undecoded batches (LoaderOptions::encoded) come from JPEG stores only");
  if (m_options.encoded) {
    m_sample_bytes = 0;
  } else if (file.storage() == Storage::jpeg) {
    RN_CHECK_CTX(m_options.render, ctx, "a JPEG store's images differ in size: the loader needs a render (crop/resize)");
    RN_CHECK_CTX(m_options.out_h > 0 && m_options.out_w > 0, ctx, "a JPEG store needs the batch's image size");
    RN_CHECK_CTX(have_jpeg_codec(), file.path(),
                 "this build has no JPEG decoder (libturbojpeg) to read a JPEG store; rebuild with libturbojpeg0-dev "
                 "or import the images as a raw store (data import folder --store raw)");
  }
  if (!m_options.render && !m_options.encoded)
    RN_CHECK_CTX(m_out_h == info.height && m_out_w == info.width, ctx,
                 "images of {}x{} requested from a split of {}x{} without a render", m_out_w, m_out_h, info.width,
                 info.height);
  m_sample_bytes = m_options.encoded ? 0 : m_out_h * m_out_w * file.channels();
  // Checked here rather than on the thread so that a bad order fails at the call that made it.
  const std::int64_t n = file.size(split);
  for (size_t i = 0; i < m_order.size(); ++i)
    RN_CHECK_CTX(m_order[i] >= 0 && m_order[i] < n, ctx, "sample order[{}] = {} out of range: the split has {} samples",
                 i, m_order[i], n);
  for (int s = 0; s < 2; ++s) {
    if (buffers) {
      RN_CHECK_CTX(buffers->images[s] && buffers->labels[s], ctx, "BatchBuffers slot {} has a null buffer", s);
      m_images[s] = buffers->images[s];
      m_labels[s] = buffers->labels[s];
    } else {
      // No batch holds more samples than the order has (a --batch above the split's size: one partial batch).
      const std::int64_t most = std::max<std::int64_t>(1, std::min<std::int64_t>(batch_size, m_order.size()));
      m_own_images[s].resize(static_cast<size_t>(most * m_sample_bytes));
      m_own_labels[s].resize(static_cast<size_t>(most));
      m_images[s] = m_own_images[s].data();
      m_labels[s] = m_own_labels[s].data();
    }
  }
  m_thread = std::thread([this] { run(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_stop = true;
  }
  m_cv.notify_all();
  if (m_thread.joinable()) m_thread.join();
}

void BatchLoader::fill(int slot, std::int64_t batch) {
  const std::int64_t first = batch * m_batch_size;
  const std::int64_t count = std::min<std::int64_t>(m_batch_size, static_cast<std::int64_t>(m_order.size()) - first);
  const std::vector<std::int64_t> idx(m_order.begin() + first, m_order.begin() + first + count);
  std::uint8_t* out = m_images[slot];
  const SplitInfo& info = m_file.info(m_split);
  const std::int64_t c = m_file.channels();
  auto each = [&](const std::function<void(std::int64_t)>& fn) {
    if (m_options.pool)
      m_options.pool->parallel_for(count, fn);
    else
      for (std::int64_t i = 0; i < count; ++i) fn(i);
  };
  if (m_options.encoded) {
    m_file.read_encoded(m_split, idx, m_encoded_slot[slot]);
    m_indices[slot] = idx;
    std::copy(m_encoded_slot[slot].labels.begin(), m_encoded_slot[slot].labels.end(), m_labels[slot]);
  } else if (m_file.storage() == Storage::jpeg) {
    m_file.read_encoded(m_split, idx, m_encoded);
    std::copy(m_encoded.labels.begin(), m_encoded.labels.end(), m_labels[slot]);
    each([&](std::int64_t i) {
      thread_local ImageRegion r;
      const std::string name =
          fmt::format("{}: /{}/jpeg sample {}", m_file.path(), split_name(m_split), idx[static_cast<std::size_t>(i)]);
      const std::int64_t sh = m_encoded.heights[static_cast<std::size_t>(i)];
      const std::int64_t sw = m_encoded.widths[static_cast<std::size_t>(i)];
      const auto* bytes = m_encoded.data(i);
      const auto size = static_cast<std::size_t>(m_encoded.size(i));
      if (m_options.region && sh > 0 && sw > 0) {
        const SourceBox b = m_options.region(sh, sw, first + i);
        r = decode_image_region(bytes, size, static_cast<int>(c), name, b.y0, b.x0, b.h, b.w);
      } else {
        r.image = decode_image(bytes, size, static_cast<int>(c), name);
        r.row0 = r.col0 = 0;
        r.full_h = r.image.height;
        r.full_w = r.image.width;
      }
      if (r.full_h != sh || r.full_w != sw)
        RN_IO_FAIL(name, "the file is corrupt; re-import it", "decodes to {}x{} but its shape says {}x{}", r.full_w,
                   r.full_h, sw, sh);
      const Image& img = r.image;
      m_options.render(SampleSource{img.pixels.data(), img.height, img.width, c, r.row0, r.col0, r.full_h, r.full_w},
                       first + i, out + i * m_sample_bytes);
    });
  } else if (m_options.render) {
    const std::int64_t sb = info.sample_bytes();
    m_stored.resize(static_cast<std::size_t>(count * sb));
    m_file.read_indices(m_split, idx, m_stored.data(), m_labels[slot]);
    each([&](std::int64_t i) {
      m_options.render(SampleSource{m_stored.data() + i * sb, info.height, info.width, c}, first + i,
                       out + i * m_sample_bytes);
    });
  } else {
    m_file.read_indices(m_split, idx, out, m_labels[slot]);
  }
  if (m_transform) m_transform(out, m_labels[slot], count, first);
}

void BatchLoader::run() {
  for (std::int64_t k = 0; k < m_num_batches; ++k) {
    const int slot = static_cast<int>(k % 2);
    {
      std::unique_lock<std::mutex> lock(m_mutex);
      m_cv.wait(lock, [&] { return m_stop || m_ready_batch[slot] < 0; });
      if (m_stop) return;
    }
    try {
      fill(slot, k);
    } catch (...) {
      std::lock_guard<std::mutex> lock(m_mutex);
      m_error = std::current_exception();
      m_error_batch = k;
      m_cv.notify_all();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      m_ready_batch[slot] = k;
    }
    m_cv.notify_all();
  }
}

std::optional<Batch> BatchLoader::next() {
  std::unique_lock<std::mutex> lock(m_mutex);
  if (m_holding) {  // the caller is done with the previous batch: its buffer may be refilled
    m_ready_batch[(m_consumed - 1) % 2] = -1;
    m_holding = false;
    m_cv.notify_all();
  }
  if (m_consumed >= m_num_batches) return std::nullopt;
  const std::int64_t k = m_consumed;
  const int slot = static_cast<int>(k % 2);
  m_cv.wait(lock, [&] { return m_ready_batch[slot] == k || m_error_batch == k; });
  if (m_ready_batch[slot] != k) std::rethrow_exception(m_error);
  m_holding = true;
  ++m_consumed;
  const std::int64_t first = k * m_batch_size;
  Batch b{m_images[slot],
          m_labels[slot],
          std::min<std::int64_t>(m_batch_size, static_cast<std::int64_t>(m_order.size()) - first),
          k,
          first,
          m_out_h,
          m_out_w};
  if (m_options.encoded) {
    b.images = nullptr;
    b.encoded = &m_encoded_slot[slot];
    b.indices = m_indices[slot].data();
  }
  return b;
}

void BatchLoader::take_encoded(EncodedBatch& into) {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    RN_CHECK(m_options.encoded && m_holding, "internal: take_encoded() without a held encoded batch");
    // The held slot is not written by the loader thread until it is freed, here.
    const std::int64_t slot = (m_consumed - 1) % 2;
    std::swap(m_encoded_slot[slot], into);
    m_ready_batch[slot] = -1;
    m_holding = false;
  }
  m_cv.notify_all();
}

}  // namespace renaissance::io
