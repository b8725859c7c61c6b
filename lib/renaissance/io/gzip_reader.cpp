#include <renaissance/io/gzip_reader.h>

#include <renaissance/core/error.h>
#include <renaissance/io/hdf5_util.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace renaissance::io {

namespace {
constexpr std::size_t kInputChunk = std::size_t(1) << 18;
}  // namespace

GzipReader::GzipReader(std::string path) : m_path(std::move(path)), m_in(kInputChunk) {
  m_file = std::fopen(m_path.c_str(), "rb");
  if (!m_file) RN_IO_FAIL(m_path, "check the path and the file's permissions", "cannot open: {}", std::strerror(errno));
  m_z.next_in = m_in.data();
  m_z.avail_in = 0;
  try {
    fill();
  } catch (...) {
    std::fclose(m_file);
    throw;
  }
  m_gzip = m_z.avail_in >= 2 && m_z.next_in[0] == 0x1f && m_z.next_in[1] == 0x8b;
  if (m_gzip) {
    if (inflateInit2(&m_z, 15 + 16) != Z_OK) {  // 15 + 16: a gzip wrapper, its header and trailer checked
      std::fclose(m_file);
      RN_IO_FAIL(m_path, "out of memory?", "zlib could not start inflating");
    }
    m_inflating = true;
  }
}

GzipReader::~GzipReader() {
  if (m_gzip) inflateEnd(&m_z);
  if (m_file) std::fclose(m_file);
}

bool GzipReader::fill() {
  if (m_z.avail_in > 0) return true;
  const std::size_t got = std::fread(m_in.data(), 1, m_in.size(), m_file);
  if (got == 0 && std::ferror(m_file)) {
    const int err = errno;
    if (err == EISDIR) RN_IO_FAIL(m_path, "pass the file itself", "is a directory");
    RN_IO_FAIL(m_path, "the file could not be read (a disk or network file system error?)", "read error: {}",
               std::strerror(err));
  }
  m_z.next_in = m_in.data();
  m_z.avail_in = static_cast<uInt>(got);
  return got > 0;
}

void GzipReader::fail_truncated(const std::string& what, std::int64_t at) const {
  RN_IO_FAIL(m_path, "the file is truncated (an interrupted download?); download it again",
             "the gzip stream ends early at byte offset {} (uncompressed) in {}: its end and CRC-32 are missing", at,
             what);
}

std::int64_t GzipReader::read(void* dst, std::int64_t n, const std::string& what) {
  auto* out = static_cast<unsigned char*>(dst);
  std::int64_t done = 0;
  if (!m_gzip) {  // a plain file
    while (done < n && !m_end) {
      if (!fill()) {
        m_end = true;
        break;
      }
      const std::int64_t k = std::min<std::int64_t>(n - done, m_z.avail_in);
      std::memcpy(out + done, m_z.next_in, static_cast<std::size_t>(k));
      m_z.next_in += k;
      m_z.avail_in -= static_cast<uInt>(k);
      done += k;
    }
    m_offset += done;
    return done;
  }
  while (done < n && !m_end) {
    if (!m_inflating) {
      // After a member: another one (concatenated gzip, as gzip -d reads it), zeros (padding), or the end.
      if (!fill()) {
        m_end = true;
        break;
      }
      const unsigned char* nz =
          std::find_if(m_z.next_in, m_z.next_in + m_z.avail_in, [](unsigned char c) { return c != 0; });
      const auto zeros = static_cast<uInt>(nz - m_z.next_in);
      m_z.next_in += zeros;
      m_z.avail_in -= zeros;
      if (m_z.avail_in == 0) continue;
      if (m_z.next_in[0] != 0x1f)
        RN_IO_FAIL(m_path, "the file is corrupt, or something was appended to it; download it again",
                   "bytes after the end of the gzip data (uncompressed byte offset {}) are not another gzip member",
                   m_offset + done);
      inflateReset(&m_z);
      m_inflating = true;
    }
    if (m_z.avail_in == 0 && !fill()) fail_truncated(what, m_offset + done);
    const auto want = static_cast<uInt>(std::min<std::int64_t>(n - done, std::int64_t(1) << 30));
    m_z.next_out = out + done;
    m_z.avail_out = want;
    const int ret = inflate(&m_z, Z_NO_FLUSH);
    done += want - m_z.avail_out;
    if (ret == Z_STREAM_END) {
      m_inflating = false;                           // its CRC-32 and length matched
    } else if (ret != Z_OK && ret != Z_BUF_ERROR) {  // Z_BUF_ERROR: input needed, taken above next time round
      m_offset += done;
      RN_IO_FAIL(m_path, "the file is corrupt; download it again",
                 "read error at byte offset {} (uncompressed) in {}: {}", m_offset, what,
                 m_z.msg ? m_z.msg : (ret == Z_MEM_ERROR ? "out of memory" : "invalid gzip data"));
    }
  }
  m_offset += done;
  return done;
}

}  // namespace renaissance::io
