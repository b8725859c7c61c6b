// Optimizer updates: one pass over the region (float4 when the pointers allow), the rule's scalars read from device
// memory once per block (Adam's FP64 bias corrections too) and broadcast through shared memory. LARS: a norms kernel
// and an update kernel over the same grid of kLarsChunk-element chunks; each block finds its segment with a block
// scan of the segment table (no host-side chunk table). Built with -fmad=false: kernels/cpu/optimizer.cpp's order.
#include <kernels/cuda/optimizer.h>

#include <kernels/cuda/pointwise_common.cuh>

namespace renaissance::cuda {

namespace {

using detail::kThreads;

// Rules are plain aggregates (they live in __shared__ memory): make() reads the scalars, step() updates one element.
struct Sgd {
  static constexpr bool kM = false, kV = false;
  float lr, wd;
  bool decay;
  static __device__ Sgd make(const OptimizerScalars& s, bool decay) { return Sgd{s.lr, decay ? s.weight_decay : 0.0f, decay}; }
  __device__ void step(float& w, float g, float&, float&) const {
    const float gi = decay ? g + wd * w : g;
    w = w - lr * gi;
  }
};
struct Momentum {
  static constexpr bool kM = false, kV = true;
  float lr, mu, wd;
  bool decay;
  static __device__ Momentum make(const OptimizerScalars& s, bool decay) {
    return Momentum{s.lr, s.momentum, decay ? s.weight_decay : 0.0f, decay};
  }
  __device__ void step(float& w, float g, float&, float& v) const {
    const float gi = decay ? g + wd * w : g;
    v = mu * v + gi;
    w = w - lr * v;
  }
};
struct Nesterov {
  static constexpr bool kM = false, kV = true;
  float lr, mu, wd;
  bool decay;
  static __device__ Nesterov make(const OptimizerScalars& s, bool decay) {
    return Nesterov{s.lr, s.momentum, decay ? s.weight_decay : 0.0f, decay};
  }
  __device__ void step(float& w, float g, float&, float& v) const {
    const float gi = decay ? g + wd * w : g;
    v = mu * v + gi;
    w = w - lr * (gi + mu * v);
  }
};
/// Adam (kDecoupledOnly = false: L2 in g' when decay) and AdamW (true: w·(1 − lr·wd) first when decay).
template <bool kDecoupledOnly>
struct Adam {
  static constexpr bool kM = true, kV = true;
  float lr, b1, b2, one_b1, one_b2, bc1, bc2, eps, wd, shrink;
  bool l2, decoupled;
  static __device__ Adam make(const OptimizerScalars& s, bool decay) {
    Adam a;
    a.lr = s.lr;
    a.b1 = s.beta1;
    a.b2 = s.beta2;
    a.eps = s.eps;
    a.wd = s.weight_decay;
    a.one_b1 = 1.0f - a.b1;
    a.one_b2 = 1.0f - a.b2;
    a.shrink = 1.0f - a.lr * a.wd;
    a.bc1 = static_cast<float>(1.0 - pow(static_cast<double>(a.b1), static_cast<double>(s.step)));
    a.bc2 = static_cast<float>(1.0 - pow(static_cast<double>(a.b2), static_cast<double>(s.step)));
    a.l2 = !kDecoupledOnly && decay;
    a.decoupled = kDecoupledOnly && decay;
    return a;
  }
  __device__ void step(float& w, float g, float& m, float& v) const {
    float wi = w;
    if (decoupled) wi = wi * shrink;
    const float gi = l2 ? g + wd * wi : g;
    const float mi = b1 * m + one_b1 * gi;
    const float vi = b2 * v + one_b2 * (gi * gi);
    m = mi;
    v = vi;
    const float mhat = mi / bc1;
    const float vhat = vi / bc2;
    w = wi - lr * mhat / (sqrtf(vhat) + eps);
  }
};

template <typename Rule>
__device__ __forceinline__ Rule block_rule(const OptimizerScalars* s, bool decay) {
  __shared__ Rule shared;
  if (threadIdx.x == 0) shared = Rule::make(*s, decay);
  __syncthreads();
  return shared;
}

__device__ __forceinline__ float4 ld4(const float* p, std::int64_t i) { return reinterpret_cast<const float4*>(p)[i]; }
__device__ __forceinline__ void st4(float* p, std::int64_t i, const float4& v) { reinterpret_cast<float4*>(p)[i] = v; }

template <int V, typename Rule>
__global__ void __launch_bounds__(kThreads)
    optimizer_kernel(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ m, float* __restrict__ v,
                     std::int64_t n, const OptimizerScalars* __restrict__ s, bool decay,
                     const std::int32_t* __restrict__ skip) {
  if (skip != nullptr && *skip != 0) return;  // uniform over the grid
  const Rule rule = block_rule<Rule>(s, decay);
  const std::int64_t nvec = n / V, tid = detail::thread_index();
  float dummy = 0.0f;
  for (std::int64_t i = tid; i < nvec; i += detail::grid_stride()) {
    if constexpr (V == 4) {
      float4 wv = ld4(w, i), mv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vv = mv;
      const float4 gv = ld4(g, i);
      if constexpr (Rule::kM) mv = ld4(m, i);
      if constexpr (Rule::kV) vv = ld4(v, i);
      rule.step(wv.x, gv.x, mv.x, vv.x);
      rule.step(wv.y, gv.y, mv.y, vv.y);
      rule.step(wv.z, gv.z, mv.z, vv.z);
      rule.step(wv.w, gv.w, mv.w, vv.w);
      st4(w, i, wv);
      if constexpr (Rule::kM) st4(m, i, mv);
      if constexpr (Rule::kV) st4(v, i, vv);
    } else {
      rule.step(w[i], g[i], Rule::kM ? m[i] : dummy, Rule::kV ? v[i] : dummy);
    }
  }
  if constexpr (V > 1) {
    const std::int64_t t = nvec * V + tid;
    if (t < n) rule.step(w[t], g[t], Rule::kM ? m[t] : dummy, Rule::kV ? v[t] : dummy);
  }
}

template <typename Rule>
void launch_optimizer(cudaStream_t stream, float* w, const float* g, float* m, float* v, std::int64_t n,
                      const OptimizerScalars* s, bool decay, const std::int32_t* skip, const char* what) {
  RN_CHECK(s != nullptr, "{}: scalars pointer is null", what);
  RN_CHECK(n >= 0, "{}: negative element count {}", what, n);
  if (n == 0) return;
  RN_CHECK(w && g, "{}: weights or gradients null", what);
  RN_CHECK(!Rule::kM || m, "{}: first moment null", what);
  RN_CHECK(!Rule::kV || v, "{}: second moment / velocity null", what);
  const bool vec = detail::aligned16(w) && detail::aligned16(g) && (!Rule::kM || detail::aligned16(m)) &&
                   (!Rule::kV || detail::aligned16(v));
  if (vec)
    optimizer_kernel<4, Rule><<<grid_for(n / 4), kThreads, 0, stream>>>(w, g, m, v, n, s, decay, skip);
  else
    optimizer_kernel<1, Rule><<<grid_for(n), kThreads, 0, stream>>>(w, g, m, v, n, s, decay, skip);
  CUDA_CHECK_LAUNCH();
}

// ---- LARS ---------------------------------------------------------------------------------------------------

struct ChunkRef {
  std::int64_t segment, begin, end;    // element range of this chunk
  std::int64_t first_chunk, chunks;    // the segment's chunks
};

/// Block-collective: which segment holds global chunk `chunk` (segments in table order, ⌈count/kLarsChunk⌉ chunks
/// each). An inclusive block scan of the chunk counts, 256 segments at a time.
__device__ ChunkRef locate_chunk(const LarsSegment* __restrict__ segs, std::int64_t nseg, std::int64_t chunk) {
  __shared__ long long warp_total[kThreads / 32];
  __shared__ long long carry;
  __shared__ ChunkRef found;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    carry = 0;
    found = ChunkRef{-1, 0, 0, -1, 0};  // an empty range should num_chunks exceed the table's chunks
  }
  __syncthreads();
  for (std::int64_t base = 0; base < nseg; base += kThreads) {
    const std::int64_t sidx = base + tid;
    long long nc = 0;
    if (sidx < nseg) nc = (segs[sidx].count + kLarsChunk - 1) / kLarsChunk;
    long long x = nc;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const long long y = __shfl_up_sync(0xffffffffu, x, off);
      if (lane >= off) x += y;
    }
    if (lane == 31) warp_total[warp] = x;
    __syncthreads();
    long long before = 0, all = 0;
    for (int k = 0; k < kThreads / 32; ++k) {
      if (k < warp) before += warp_total[k];
      all += warp_total[k];
    }
    const long long incl = carry + before + x, excl = incl - nc;
    if (sidx < nseg && chunk >= excl && chunk < incl) {
      const std::int64_t local = chunk - excl;
      const std::int64_t begin = segs[sidx].offset + local * kLarsChunk;
      const std::int64_t seg_end = segs[sidx].offset + segs[sidx].count;
      found = ChunkRef{sidx, begin, begin + kLarsChunk < seg_end ? begin + kLarsChunk : seg_end, excl, nc};
    }
    __syncthreads();
    if (tid == 0) carry += all;
    __syncthreads();
  }
  return found;
}

/// Fixed-order block sum of two doubles (tree over the 256 threads); every thread gets the result.
__device__ void block_sum2(double& a, double& b) {
  __shared__ double red[2][kThreads];
  const int tid = static_cast<int>(threadIdx.x);
  red[0][tid] = a;
  red[1][tid] = b;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (tid < s) {
      red[0][tid] += red[0][tid + s];
      red[1][tid] += red[1][tid + s];
    }
    __syncthreads();
  }
  a = red[0][0];
  b = red[1][0];
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads)
    lars_norms_kernel(const float* __restrict__ w, const float* __restrict__ g, const LarsSegment* __restrict__ segs,
                      std::int64_t nseg, double* __restrict__ chunk_sums) {
  const ChunkRef c = locate_chunk(segs, nseg, blockIdx.x);
  double sw = 0.0, sg = 0.0;
  for (std::int64_t i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
    const double wi = w[i], gi = g[i];
    sw += wi * wi;
    sg += gi * gi;
  }
  block_sum2(sw, sg);
  if (threadIdx.x == 0) {
    chunk_sums[2 * blockIdx.x] = sw;
    chunk_sums[2 * blockIdx.x + 1] = sg;
  }
}

__global__ void __launch_bounds__(kThreads)
    lars_update_kernel(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ v,
                       const LarsSegment* __restrict__ segs, std::int64_t nseg, const OptimizerScalars* __restrict__ s,
                       bool decay, const std::int32_t* __restrict__ skip, const double* __restrict__ chunk_sums,
                       float* __restrict__ norms, std::int64_t norm_stride) {
  const ChunkRef c = locate_chunk(segs, nseg, blockIdx.x);
  double sw = 0.0, sg = 0.0;
  for (std::int64_t k = c.first_chunk + threadIdx.x; k < c.first_chunk + c.chunks; k += kThreads) {
    sw += chunk_sums[2 * k];
    sg += chunk_sums[2 * k + 1];
  }
  block_sum2(sw, sg);
  const auto wn = static_cast<float>(sqrt(sw)), gn = static_cast<float>(sqrt(sg));
  if (norms != nullptr) {
    if (threadIdx.x == 0 && static_cast<std::int64_t>(blockIdx.x) == c.first_chunk) {
      norms[c.segment * norm_stride] = wn;
      norms[c.segment * norm_stride + 1] = gn;
    }
    if (blockIdx.x == 0) {  // empty segments own no chunk: their norms are 0
      for (std::int64_t k = threadIdx.x; k < nseg; k += kThreads) {
        if (segs[k].count == 0) {
          norms[k * norm_stride] = 0.0f;
          norms[k * norm_stride + 1] = 0.0f;
        }
      }
    }
  }
  if (skip != nullptr && *skip != 0) return;
  const float lr = s->lr, mu = s->momentum, eta = s->lars_eta, wd = decay ? s->weight_decay : 0.0f;
  const float trust = (wn > 0.0f && gn > 0.0f) ? eta * wn / (gn + wd * wn) : 1.0f;
  const float sc = lr * trust;
  for (std::int64_t i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
    const float vi = mu * v[i] + sc * (g[i] + wd * w[i]);
    v[i] = vi;
    w[i] = w[i] - vi;
  }
}

void check_lars(const LarsSegment* segments, std::size_t num_segments, std::int64_t num_chunks, const void* workspace,
                std::size_t workspace_bytes, const char* what) {
  RN_CHECK(num_segments == 0 || segments != nullptr, "{}: {} segments but the device table is null", what,
           num_segments);
  RN_CHECK(num_chunks >= 0 && num_chunks < (std::int64_t{1} << 31), "{}: {} chunks", what, num_chunks);
  RN_CHECK(num_chunks == 0 || (workspace != nullptr && detail::aligned16(workspace) &&
                               workspace_bytes >= lars_workspace_bytes(num_chunks)),
           "{}: workspace of {} bytes is null, misaligned or below lars_workspace_bytes = {}", what, workspace_bytes,
           lars_workspace_bytes(num_chunks));
}

}  // namespace

void sgd_update(cudaStream_t stream, float* w, const float* g, std::int64_t n, const OptimizerScalars* s,
                bool apply_weight_decay, const std::int32_t* skip) {
  launch_optimizer<Sgd>(stream, w, g, nullptr, nullptr, n, s, apply_weight_decay, skip, "sgd_update");
}

void momentum_update(cudaStream_t stream, float* w, const float* g, float* v, std::int64_t n,
                     const OptimizerScalars* s, bool apply_weight_decay, const std::int32_t* skip) {
  launch_optimizer<Momentum>(stream, w, g, nullptr, v, n, s, apply_weight_decay, skip, "momentum_update");
}

void nesterov_update(cudaStream_t stream, float* w, const float* g, float* v, std::int64_t n,
                     const OptimizerScalars* s, bool apply_weight_decay, const std::int32_t* skip) {
  launch_optimizer<Nesterov>(stream, w, g, nullptr, v, n, s, apply_weight_decay, skip, "nesterov_update");
}

void adam_update(cudaStream_t stream, float* w, const float* g, float* m, float* v, std::int64_t n,
                 const OptimizerScalars* s, bool apply_weight_decay, const std::int32_t* skip) {
  launch_optimizer<Adam<false>>(stream, w, g, m, v, n, s, apply_weight_decay, skip, "adam_update");
}

void adamw_update(cudaStream_t stream, float* w, const float* g, float* m, float* v, std::int64_t n,
                  const OptimizerScalars* s, bool apply_weight_decay, const std::int32_t* skip) {
  launch_optimizer<Adam<true>>(stream, w, g, m, v, n, s, apply_weight_decay, skip, "adamw_update");
}

std::int64_t lars_num_chunks(const LarsSegment* host_segments, std::size_t num_segments) {
  RN_CHECK(num_segments == 0 || host_segments != nullptr, "lars_num_chunks: {} segments but the list is null",
           num_segments);
  std::int64_t chunks = 0;
  for (std::size_t i = 0; i < num_segments; ++i) {
    RN_CHECK(host_segments[i].count >= 0 && host_segments[i].offset >= 0, "lars: segment {} has offset {} count {}",
             i, host_segments[i].offset, host_segments[i].count);
    chunks += (host_segments[i].count + kLarsChunk - 1) / kLarsChunk;
  }
  return chunks;
}

std::size_t lars_workspace_bytes(std::int64_t num_chunks) {
  return (static_cast<std::size_t>(num_chunks) * 2 * sizeof(double) + 255) / 256 * 256;
}

void lars_norms(cudaStream_t stream, const float* w, const float* g, const LarsSegment* segments,
                std::size_t num_segments, std::int64_t num_chunks, void* workspace, std::size_t workspace_bytes) {
  check_lars(segments, num_segments, num_chunks, workspace, workspace_bytes, "lars_norms");
  if (num_chunks == 0) return;
  RN_CHECK(w && g, "lars_norms: weights or gradients null");
  lars_norms_kernel<<<static_cast<unsigned>(num_chunks), kThreads, 0, stream>>>(
      w, g, segments, static_cast<std::int64_t>(num_segments), static_cast<double*>(workspace));
  CUDA_CHECK_LAUNCH();
}

void lars_update(cudaStream_t stream, float* w, const float* g, float* v, const LarsSegment* segments,
                 std::size_t num_segments, std::int64_t num_chunks, const OptimizerScalars* s,
                 bool apply_weight_decay, const std::int32_t* skip, const void* workspace,
                 std::size_t workspace_bytes, float* norms, std::int64_t norm_stride) {
  check_lars(segments, num_segments, num_chunks, workspace, workspace_bytes, "lars_update");
  RN_CHECK(s != nullptr, "lars_update: scalars pointer is null");
  RN_CHECK(norms == nullptr || norm_stride >= 2, "lars_update: norm_stride {} < 2", norm_stride);
  if (num_chunks == 0 && (norms == nullptr || num_segments == 0)) return;
  RN_CHECK(num_chunks == 0 || (w && g && v), "lars_update: weights, gradients or velocity null");
  // With no chunks at all, one block still writes the (zero) norms of the empty segments.
  const auto blocks = static_cast<unsigned>(num_chunks > 0 ? num_chunks : 1);
  lars_update_kernel<<<blocks, kThreads, 0, stream>>>(
      w, g, v, segments, static_cast<std::int64_t>(num_segments), s, apply_weight_decay, skip,
      static_cast<const double*>(workspace), norms, norm_stride);
  CUDA_CHECK_LAUNCH();
}

}  // namespace renaissance::cuda
