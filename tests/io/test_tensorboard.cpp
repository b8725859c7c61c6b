// io/tensorboard: the CRC-32C and the TFRecord framing against published values and an independent decoder of the
// protobuf wire format written here (the end-to-end check with TensorBoard's own reader is io.tensorboard_events).
#include <renaissance/io/tensorboard.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using renaissance::io::crc32c;
using renaissance::io::masked_crc32c;
using renaissance::io::TensorBoardWriter;

// RFC 3720 (iSCSI) B.4 test vectors and the usual check value of CRC-32C.
TEST(TensorBoard, Crc32cMatchesPublishedVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::vector<std::uint8_t> zeros(32, 0x00), ones(32, 0xFF);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  std::vector<std::uint8_t> inc(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<std::uint8_t>(i);
  EXPECT_EQ(crc32c(inc.data(), inc.size()), 0x46DD794Eu);
  // The TFRecord mask: rotate right by 15, add 0xa282ead8.
  const std::uint32_t c = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

// A minimal protobuf reader: field number -> (wire type, payload bytes or varint/fixed value).
struct Field {
  int number = 0, wire = 0;
  std::uint64_t value = 0;
  std::string bytes;
};
std::vector<Field> parse(const std::string& msg) {
  std::vector<Field> out;
  std::size_t p = 0;
  auto varint = [&]() {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const auto b = static_cast<std::uint8_t>(msg.at(p++));
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
  };
  while (p < msg.size()) {
    const std::uint64_t key = varint();
    Field f;
    f.number = static_cast<int>(key >> 3);
    f.wire = static_cast<int>(key & 7);
    if (f.wire == 0) {
      f.value = varint();
    } else if (f.wire == 1 || f.wire == 5) {
      const int n = f.wire == 1 ? 8 : 4;
      for (int i = 0; i < n; ++i)
        f.value |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(msg.at(p++))) << (8 * i);
    } else if (f.wire == 2) {
      const std::uint64_t n = varint();
      f.bytes = msg.substr(p, n);
      p += n;
    } else {
      ADD_FAILURE() << "wire type " << f.wire;
      return out;
    }
    out.push_back(f);
  }
  return out;
}
const Field* field(const std::vector<Field>& fs, int number) {
  for (const Field& f : fs)
    if (f.number == number) return &f;
  return nullptr;
}

TEST(TensorBoard, RecordsAndEventsDecode) {
  const fs::path dir = fs::temp_directory_path() / ("rn_tb_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::string path;
  {
    TensorBoardWriter w(dir.string());
    path = w.path();
    w.scalars(7, {{"train/loss", 0.25}, {"opt/lr", 0.1}});
    w.text(0, "run/config", "epochs=2");
  }
  EXPECT_NE(fs::path(path).filename().string().find("events.out.tfevents."), std::string::npos);
  std::ifstream f(path, std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> events;
  for (std::size_t p = 0; p < raw.size();) {
    ASSERT_LE(p + 12, raw.size());
    std::uint64_t len = 0;
    std::memcpy(&len, raw.data() + p, 8);  // little-endian host
    std::uint32_t lcrc = 0, dcrc = 0;
    std::memcpy(&lcrc, raw.data() + p + 8, 4);
    EXPECT_EQ(lcrc, masked_crc32c(raw.data() + p, 8));
    ASSERT_LE(p + 16 + len, raw.size());
    const std::string data = raw.substr(p + 12, len);
    std::memcpy(&dcrc, raw.data() + p + 12 + len, 4);
    EXPECT_EQ(dcrc, masked_crc32c(data.data(), data.size()));
    events.push_back(data);
    p += 16 + len;
  }
  ASSERT_EQ(events.size(), 3u);
  // 1: file_version
  const auto e0 = parse(events[0]);
  ASSERT_NE(field(e0, 3), nullptr);
  EXPECT_EQ(field(e0, 3)->bytes, "brain.Event:2");
  ASSERT_NE(field(e0, 1), nullptr);
  EXPECT_EQ(field(e0, 1)->wire, 1);  // wall_time: a double
  // 2: step 7, two scalar values
  const auto e1 = parse(events[1]);
  ASSERT_NE(field(e1, 2), nullptr);
  EXPECT_EQ(field(e1, 2)->value, 7u);
  const auto summary = parse(field(e1, 5)->bytes);
  ASSERT_EQ(summary.size(), 2u);
  const auto v0 = parse(summary[0].bytes);
  EXPECT_EQ(field(v0, 1)->bytes, "train/loss");
  float x = 0;
  const auto bits = static_cast<std::uint32_t>(field(v0, 2)->value);
  std::memcpy(&x, &bits, 4);
  EXPECT_EQ(x, 0.25f);
  EXPECT_EQ(parse(summary[1].bytes)[0].bytes, "opt/lr");
  // 3: the text summary: plugin "text", a DT_STRING (7) tensor holding the string
  const auto value = parse(parse(field(parse(events[2]), 5)->bytes)[0].bytes);
  EXPECT_EQ(field(value, 1)->bytes, "run/config");
  EXPECT_EQ(field(parse(field(parse(field(value, 9)->bytes), 1)->bytes), 1)->bytes, "text");
  const auto tensor = parse(field(value, 8)->bytes);
  EXPECT_EQ(field(tensor, 1)->value, 7u);
  EXPECT_EQ(field(tensor, 8)->bytes, "epochs=2");
  fs::remove_all(dir);
}

TEST(TensorBoard, AnUnwritableDirectoryIsNamed) {
  try {
    TensorBoardWriter w("/proc/renaissance-no-such-dir/tb");
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/renaissance-no-such-dir/tb"), std::string::npos) << e.what();
  }
}

}  // namespace
