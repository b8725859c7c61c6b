// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a counter-based
// generator. Every random number is a pure function of (key, counter), so augmentation and weight
// initialisation do not depend on the number of ranks, threads or the order of evaluation.
#pragma once

#include <array>
#include <cstdint>

namespace renaissance {

class Philox {
 public:
  using Block = std::array<std::uint32_t, 4>;

  /// key: the seed; counter: (stream, index, ...) - e.g. (epoch, sample index, purpose, 0).
  static Block generate(std::uint64_t key, const Block& counter) {
    std::uint32_t k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
    Block c = counter;
    for (int round = 0; round < 10; ++round) {
      const std::uint64_t p0 = static_cast<std::uint64_t>(0xD2511F53u) * c[0];
      const std::uint64_t p1 = static_cast<std::uint64_t>(0xCD9E8D57u) * c[2];
      c = Block{static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k0, static_cast<std::uint32_t>(p1),
                static_cast<std::uint32_t>(p0 >> 32) ^ c[3] ^ k1, static_cast<std::uint32_t>(p0)};
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    return c;
  }

  /// Uniform in [0, 1) with 24 bits.
  static float to_unit(std::uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }
};

/// A sequential stream over Philox blocks for one (key, stream id): counter = (stream_lo, stream_hi, i, purpose).
class PhiloxStream {
 public:
  PhiloxStream(std::uint64_t key, std::uint64_t stream, std::uint32_t purpose = 0)
      : m_key(key), m_stream(stream), m_purpose(purpose) {}
  std::uint32_t next_u32() {
    if (m_used == 4) {
      m_block = Philox::generate(m_key, {static_cast<std::uint32_t>(m_stream), static_cast<std::uint32_t>(m_stream >> 32),
                                         m_counter++, m_purpose});
      m_used = 0;
    }
    return m_block[static_cast<std::size_t>(m_used++)];
  }
  float uniform() { return Philox::to_unit(next_u32()); }
  /// Continues from the first value of block `block` (4 values each: uniform() takes one, normal() two), as if the
  /// values before it had been drawn: a stream is cut into pieces generated apart (in parallel) with the same values.
  void seek(std::uint32_t block) {
    m_counter = block;
    m_used = 4;
  }
  /// Uniform integer in [0, n) (n > 0), by multiply-shift (bias < 2^-32 · n).
  std::uint32_t below(std::uint32_t n) {
    return static_cast<std::uint32_t>((static_cast<std::uint64_t>(next_u32()) * n) >> 32);
  }
  /// Standard normal by Box-Muller.
  float normal();

 private:
  std::uint64_t m_key, m_stream;
  std::uint32_t m_purpose;
  std::uint32_t m_counter = 0;
  Philox::Block m_block{};
  int m_used = 4;
};

}  // namespace renaissance
