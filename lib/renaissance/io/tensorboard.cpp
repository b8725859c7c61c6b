#include <renaissance/io/tensorboard.h>

#include <renaissance/core/error.h>

#include <fmt/format.h>

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace renaissance::io {

namespace {

std::array<std::uint32_t, 256> make_crc32c_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    t[i] = c;
  }
  return t;
}

// ---- protobuf wire format: varints, length-delimited fields, fixed 64-bit (double) and 32-bit (float) ----
void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, static_cast<std::uint64_t>(field) << 3 | wire_type);
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}
void put_double(std::string& out, int field, double v) {
  put_key(out, field, 1);
  std::uint64_t bits;
  std::memcpy(&bits, &v, 8);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(bits >> (8 * i)));
}
void put_float(std::string& out, int field, float v) {
  put_key(out, field, 5);
  std::uint32_t bits;
  std::memcpy(&bits, &v, 4);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(bits >> (8 * i)));
}
void put_int(std::string& out, int field, std::int64_t v) {
  put_key(out, field, 0);
  put_varint(out, static_cast<std::uint64_t>(v));
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// Event {wall_time = 1, step = 2, <payload>}.
std::string event_with(std::int64_t step, const std::string& payload) {
  std::string e;
  put_double(e, 1, wall_time());
  put_int(e, 2, step);
  e += payload;
  return e;
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t n) {
  static const std::array<std::uint32_t, 256> table = make_crc32c_table();
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = 0xffffffffu;
  for (std::size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

std::uint32_t masked_crc32c(const void* data, std::size_t n) {
  const std::uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  RN_CHECK_CTX(!ec && std::filesystem::is_directory(dir), dir, "--tensorboard: cannot create the directory: {}",
               ec ? ec.message() : std::string("not a directory"));
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const auto secs = static_cast<long long>(wall_time());
  m_path = (std::filesystem::path(dir) / fmt::format("events.out.tfevents.{}.{}.{}", secs, host, getpid())).string();
  m_file = std::fopen(m_path.c_str(), "wb");
  RN_CHECK_CTX(m_file != nullptr, m_path, "--tensorboard: cannot create the event file: {}", std::strerror(errno));
  std::string version;
  put_bytes(version, 3, "brain.Event:2");
  write_event(event_with(0, version));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (m_file) std::fclose(m_file);
}

void TensorBoardWriter::write_event(const std::string& event) {
  std::string rec;
  const std::uint64_t len = event.size();
  for (int i = 0; i < 8; ++i) rec.push_back(static_cast<char>(len >> (8 * i)));
  auto put_u32 = [&](std::uint32_t v) {
    for (int i = 0; i < 4; ++i) rec.push_back(static_cast<char>(v >> (8 * i)));
  };
  put_u32(masked_crc32c(rec.data(), 8));
  rec += event;
  put_u32(masked_crc32c(event.data(), event.size()));
  RN_CHECK_CTX(std::fwrite(rec.data(), 1, rec.size(), m_file) == rec.size() && std::fflush(m_file) == 0, m_path,
               "--tensorboard: writing the event file failed: {}", std::strerror(errno));
}

void TensorBoardWriter::scalars(std::int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    put_bytes(value, 1, tag);
    put_float(value, 2, static_cast<float>(v));
    put_bytes(summary, 1, value);
  }
  std::string payload;
  put_bytes(payload, 5, summary);
  write_event(event_with(step, payload));
}

void TensorBoardWriter::text(std::int64_t step, const std::string& tag, const std::string& markdown) {
  std::string plugin_data, metadata, tensor, value, summary, payload;
  put_bytes(plugin_data, 1, "text");
  put_bytes(metadata, 1, plugin_data);
  put_int(tensor, 1, 7);     // DT_STRING
  put_bytes(tensor, 2, "");  // TensorShapeProto {}: a scalar
  put_bytes(tensor, 8, markdown);
  put_bytes(value, 1, tag);
  put_bytes(value, 9, metadata);
  put_bytes(value, 8, tensor);
  put_bytes(summary, 1, value);
  put_bytes(payload, 5, summary);
  write_event(event_with(step, payload));
}

void TensorBoardWriter::session_start(std::int64_t step) {
  std::string session_log, payload;
  put_int(session_log, 1, 1);  // status: START
  put_bytes(payload, 7, session_log);  // Event.session_log (6 is the deprecated log_message)
  write_event(event_with(step, payload));
}

void TensorBoardWriter::flush() {
  if (m_file) std::fflush(m_file);
}

}  // namespace renaissance::io
