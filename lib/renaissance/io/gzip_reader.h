// Sequential reading of a gzip file (or a plain one) that verifies what zlib's gzread does not always verify: gzread
// returns 0 at the end of the input without looking at the gzip trailer when its last read ended exactly there, so a
// file cut before its CRC-32 (or whose CRC-32 no longer matches) read as complete. Here every gzip member is inflated
// to Z_STREAM_END, which checks its CRC-32 and length, before the data counts as ended.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace renaissance::io {

class GzipReader {
 public:
  /// Opens `path` (errors name it). A file that does not start with the gzip magic is read as it is.
  explicit GzipReader(std::string path);
  ~GzipReader();
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;

  /// Up to n bytes into dst; fewer only at the verified end of the data (0 after it). Throws, naming the file and
  /// `what` at the uncompressed byte offset, on a damaged stream (a CRC-32 or length mismatch, invalid deflate data),
  /// on a gzip member cut short, and on bytes after the last member that are neither another member nor zeros.
  std::int64_t read(void* dst, std::int64_t n, const std::string& what);

  const std::string& path() const { return m_path; }
  /// Uncompressed bytes returned so far.
  std::int64_t offset() const { return m_offset; }

 private:
  bool fill();  // more compressed input; false at the end of the file
  [[noreturn]] void fail_truncated(const std::string& what, std::int64_t at) const;

  std::string m_path;
  std::FILE* m_file = nullptr;
  std::vector<unsigned char> m_in;
  z_stream m_z{};
  bool m_gzip = false;       // the file started with the gzip magic
  bool m_inflating = false;  // inside a member (after its header, before Z_STREAM_END)
  bool m_end = false;        // the verified end of the data
  std::int64_t m_offset = 0;
};

}  // namespace renaissance::io
