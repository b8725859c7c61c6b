// The engine choices of convolution passes (DESIGN §11 lever 5), keyed by everything a choice depends on: the pass,
// the layer's shapes and row strides, kernel/stride/padding/groups, dtype and numerics rules, determinism, the
// workspace limit, the GPU (name, SM count, compute capability) and the cuDNN and cudnn-frontend versions.
// ConvOp::choose fills it after timing and reads it before timing; the runtime saves it to and loads it from a file
// (`--engine-cache`), so a second start-up neither times again nor chooses differently: the same choices give the
// same bits (timing noise alone could otherwise pick another, equally deterministic, engine).
//
// Plain C++ (no CUDA calls), so the file format is tested without a GPU.
#pragma once

#include <kernels/cuda/conv_graph.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace renaissance::cuda {

/// What a pass runs with.
struct EngineChoice {
  /// Own: the project's own kernel for the pass (kernels/cuda/depthwise.h), chosen where it is faster.
  enum class Api : std::uint8_t { Graph, Legacy, Own };
  Api api = Api::Graph;
  bool staged = false;   ///< through compact copies of row-padded tensors
  EngineConfig graph;    ///< Api::Graph: the cudnn-frontend engine configuration
  int algo = -1;         ///< Api::Legacy: the cudnnConvolution*Algo_t
  int math = 0;          ///< Api::Legacy: the cudnnMathType_t
  bool deterministic = true;  ///< known deterministic (false: the mode admitted others, or unknown)
  float time_ms = -1.0f;  ///< measured when chosen (-1: the heuristics' first, not timed)
  std::int64_t workspace = 0;  ///< bytes of cuDNN workspace
  bool fallback = false;       ///< Api::Legacy chosen because no graph plan supports the pass

  /// "graph eng62_k2=1 (0.128 ms)" / "legacy algo 1 (fallback)" / "own depthwise (0.052 ms)"
  std::string str() const;
};

class EngineCache {
 public:
  /// The process-wide cache every ConvOp uses.
  static EngineCache& global();

  std::optional<EngineChoice> find(const std::string& key) const;
  void put(const std::string& key, const EngineChoice& choice);
  std::size_t size() const;
  /// Entries put (not loaded) since the last mark_saved(): new choices worth saving.
  std::size_t unsaved() const;
  void mark_saved();
  void clear();

  /// The file text: a header line, then one tab-separated line per entry, sorted by key.
  std::string serialize() const;
  /// Adds the entries of a file's text (entries already present keep their value, so a shared file never makes a
  /// run change its mind). Returns false with `error` (the line and what is wrong) for text that is not an engine
  /// cache of this format; nothing is added then.
  bool merge(const std::string& text, std::string* error);

  /// Counters for start-up logs: choices found in the cache / timed (or taken from the heuristics) since clear().
  std::size_t hits() const;
  std::size_t misses() const;
  void count(bool hit);
  /// A cached choice that could not be made real again (chosen afresh instead): counted, the first reason kept.
  void reject(const std::string& why);
  std::size_t rejected() const;
  std::string first_rejection() const;

 private:
  mutable std::mutex m_mutex;
  std::map<std::string, EngineChoice> m_entries;
  std::size_t m_unsaved = 0, m_hits = 0, m_misses = 0, m_rejected = 0;
  std::string m_first_rejection;
};

}  // namespace renaissance::cuda
