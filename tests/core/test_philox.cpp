// PhiloxStream::seek: a stream cut into pieces, each generated from its own seek, gives the sequential stream's values
// bit for bit (the weight initialisation draws its pieces on several threads, runtime/trainer_impl.h).
#include <renaissance/core/philox.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace renaissance {
namespace {

// Values i of a stream: normal() takes two 32-bit draws, uniform() one; a block holds four.
std::vector<float> sequential(std::uint64_t key, std::uint64_t stream, bool normal, int n) {
  PhiloxStream s(key, stream, 7);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = normal ? s.normal() : s.uniform();
  return v;
}

TEST(PhiloxStream, PiecesFromSeekEqualTheSequentialStream) {
  const int n = 1000;
  for (bool normal : {true, false}) {
    const int per_block = normal ? 2 : 4;
    const std::vector<float> want = sequential(12345, 3, normal, n);
    for (int piece : {4, 8, 100, 512}) {  // values per piece, whole blocks
      std::vector<float> got(static_cast<std::size_t>(n));
      for (int first = n - n % piece; first >= 0; first -= piece) {  // last piece first: order does not matter
        PhiloxStream s(12345, 3, 7);
        s.seek(static_cast<std::uint32_t>(first / per_block));
        for (int i = first; i < std::min(n, first + piece); ++i)
          got[static_cast<std::size_t>(i)] = normal ? s.normal() : s.uniform();
      }
      EXPECT_EQ(got, want) << (normal ? "normal" : "uniform") << ", pieces of " << piece;
    }
  }
  // The control: another stream id, another key or a seek one block off gives other values.
  EXPECT_NE(sequential(12345, 4, true, 8), sequential(12345, 3, true, 8));
  EXPECT_NE(sequential(12346, 3, true, 8), sequential(12345, 3, true, 8));
  PhiloxStream off(12345, 3, 7);
  off.seek(1);
  const std::vector<float> want = sequential(12345, 3, false, 8);
  EXPECT_NE(off.uniform(), want[0]);
  EXPECT_EQ(off.uniform(), want[5]);  // block 1 holds values 4..7: the second draw after seek(1) is value 5
}

}  // namespace
}  // namespace renaissance
