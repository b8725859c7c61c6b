// TensorBoard event files (`train --tensorboard DIR`): scalars and text summaries that `tensorboard --logdir DIR`
// shows, written without TensorFlow or protobuf. The format is small:
//  - a file `events.out.tfevents.<seconds>.<host>.<pid>` of TFRecords: u64 length (little-endian), u32 masked
//    CRC-32C of those 8 bytes, the data, u32 masked CRC-32C of the data (mask: rotate right by 15, add 0xa282ead8);
//  - each record one `tensorflow.Event` protobuf: wall_time (1, double), step (2, int64), file_version (3, string,
//    the first record: "brain.Event:2"), summary (5, Summary {repeated Value value = 1}) or session_log (7,
//    SessionLog {status = 1}: START where a resumed run begins); a scalar Value is
//    {tag = 1, simple_value = 2 (float)}, a text Value {tag = 1, metadata = 9 {plugin_data = 1 {plugin_name = 1:
//    "text"}}, tensor = 8 {dtype = 1: DT_STRING (7), tensor_shape = 2: {}, string_val = 8}}.
// (tensorflow/core/util/event.proto, summary.proto, tensor.proto; tensorboard/summary/writer/record_writer.py.)
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace renaissance::io {

/// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78) of `n` bytes.
std::uint32_t crc32c(const void* data, std::size_t n);
/// The TFRecord mask of a CRC-32C.
std::uint32_t masked_crc32c(const void* data, std::size_t n);

class TensorBoardWriter {
 public:
  /// Creates `dir` (and parents) and a new event file in it; errors name the directory.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// One event holding these scalars at `step`.
  void scalars(std::int64_t step, const std::vector<std::pair<std::string, double>>& values);
  void scalar(std::int64_t step, const std::string& tag, double value) { scalars(step, {{tag, value}}); }
  /// A text summary (shown in TensorBoard's Text tab; markdown).
  void text(std::int64_t step, const std::string& tag, const std::string& markdown);
  /// A SessionLog START at `step` (Event field 7: SessionLog {status = 1: START}): TensorBoard then drops the points
  /// at `step` and later of the event files before this one, which a run killed after its last checkpoint wrote and
  /// the resumed run writes again. A resumed run writes it at its first step.
  void session_start(std::int64_t step);
  /// Flushes to the file (every write flushes already: a killed run keeps what it wrote).
  void flush();
  const std::string& path() const { return m_path; }

 private:
  void write_event(const std::string& event);
  std::string m_path;
  std::FILE* m_file = nullptr;
};

}  // namespace renaissance::io
