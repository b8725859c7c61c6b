#include <renaissance/io/batch_loader.h>

#include <renaissance/core/error.h>

#include <algorithm>

namespace renaissance::io {

BatchLoader::BatchLoader(const DatasetFile& file, Split split, std::int64_t batch_size, std::vector<std::int64_t> order,
                         BatchTransform transform, std::optional<BatchBuffers> buffers)
    : m_file(file),
      m_split(split),
      m_batch_size(batch_size),
      m_order(std::move(order)),
      m_transform(std::move(transform)),
      m_num_batches(batch_size > 0 ? (static_cast<std::int64_t>(m_order.size()) + batch_size - 1) / batch_size : 0),
      m_sample_bytes(file.sample_bytes()) {
  const std::string ctx = fmt::format("{}: split '{}'", file.path(), split_name(split));
  RN_CHECK_CTX(batch_size > 0, ctx, "batch size must be positive, got {}", batch_size);
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
      m_own_images[s].resize(static_cast<size_t>(batch_size * m_sample_bytes));
      m_own_labels[s].resize(static_cast<size_t>(batch_size));
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
  m_file.read_indices(m_split, idx, m_images[slot], m_labels[slot]);
  if (m_transform) m_transform(m_images[slot], m_labels[slot], count, first);
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
  return Batch{m_images[slot], m_labels[slot],
               std::min<std::int64_t>(m_batch_size, static_cast<std::int64_t>(m_order.size()) - first), k, first};
}

}  // namespace renaissance::io
