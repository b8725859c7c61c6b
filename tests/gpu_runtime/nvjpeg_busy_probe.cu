// Why does nvJPEG's batched decode take ~4x longer beside a training step than alone (docs/input-pipeline.md,
// "Not done")? A measurement program, not a test (not run by ctest): it decodes one batch of JPEG files with
// nvJPEG while other work occupies the GPU on another stream, and prints how long the decode call takes to
// return and to complete in each situation, for both backends and with caching allocators.
//
//   nvcc -std=c++17 -O2 -arch=sm_90 -I<nvjpeg>/include tests/gpu_runtime/nvjpeg_busy_probe.cu -L<nvjpeg>/lib \
//        -lnvjpeg -o /tmp/nvjpeg_busy_probe && /tmp/nvjpeg_busy_probe DIR_OF_JPEGS [batch [hardware|parallel]]
//
// Situations, each timed 5 times (median):
//   alone        nothing else on the GPU
//   spin1        one block spinning 100 ms on a non-blocking stream (one SM busy): a decode that waits for it
//                waits for other streams' work (a device-wide synchronisation inside nvJPEG), not for SMs
//   spinall      every SM spinning 100 ms (no SM free): a decode that waits here but not in spin1 needs SMs
//   spinall_hp   spinall with the decode on a stream of the greatest priority
//   kernels      2,000 short full-GPU kernels (~50 us each) on another stream, like a training step's graph
//   kernels_hp   the same with the decode on the greatest-priority stream
//   graph        the same 2,000 kernels as one CUDA graph (the trainer launches captured graphs)
//   graph_hp     the graph with the decode on the greatest-priority stream
//   blocked      16 other streams each waiting (cudaStreamWaitEvent) for a one-block 100 ms spin: a decode that
//                waits here shares a hardware work queue with a blocked stream (CUDA_DEVICE_MAX_CONNECTIONS, default
//                8, queues for all streams)
//
// `... DIR 256 parallel` instead: what could take the SM wait out of the decode, beside a load like a training
// step's (every SM holding one block for ~0.2 ms at a time, `hold`):
//   formats      the call with RGBI (what the runtime decodes to), planar RGB and planar YUV output, alone, beside
//                the load, and beside it on the greatest-priority stream
//   threads      two threads decoding at once with one handle and two states (the runtime's decoders) and with a
//                handle each: images per second, alone and beside the load
//   bytes        how many output bytes differ between two decodes of the batch by one state, two states of one
//                handle, and two handles (the JPEG engines' pixels were seen to depend on the decoder)
#include <cuda_runtime.h>
#include <nvjpeg.h>

#include <dirent.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
#define NJ(x)                                                                                \
  do {                                                                                       \
    nvjpegStatus_t s_ = (x);                                                                 \
    if (s_ != NVJPEG_STATUS_SUCCESS) {                                                       \
      std::fprintf(stderr, "%s:%d %s: nvJPEG status %d\n", __FILE__, __LINE__, #x, (int)s_); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

__device__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__global__ void spin(unsigned long long ns) {
  const unsigned long long t0 = now_ns();
  while (now_ns() - t0 < ns) {
  }
}
// One block per SM (its shared memory admits no second one), spinning `ns`: the SMs stay busy the way a training
// step's convolution kernels keep them.
__global__ void hold(unsigned long long ns) {
  extern __shared__ unsigned char smem[];
  if (threadIdx.x == 0) smem[0] = 0;
  const unsigned long long t0 = now_ns();
  while (now_ns() - t0 < ns) {
  }
}
__global__ void busy(float* p, int n) {  // a short memory-bound kernel over the whole GPU
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = p[i] * 0.999f + 1.0f;
}

// Counting, caching allocators (nothing is freed until exit).
struct Cache {
  std::mutex mu;
  std::multimap<size_t, void*> free_blocks;
  std::map<void*, size_t> sizes;
  long real = 0, calls = 0, frees = 0;
};
Cache g_dev, g_pin;
long g_dev_plain_malloc = 0, g_dev_plain_free = 0, g_pin_plain_malloc = 0, g_pin_plain_free = 0;
int cached_malloc(Cache& c, void** p, size_t n, bool pinned) {
  std::lock_guard<std::mutex> lk(c.mu);
  ++c.calls;
  auto it = c.free_blocks.lower_bound(n);
  if (it != c.free_blocks.end()) {
    *p = it->second;
    c.free_blocks.erase(it);
    return 0;
  }
  ++c.real;
  const cudaError_t e = pinned ? cudaHostAlloc(p, n, cudaHostAllocDefault) : cudaMalloc(p, n);
  if (e != cudaSuccess) return 1;
  c.sizes[*p] = n;
  return 0;
}
int cached_free(Cache& c, void* p) {
  std::lock_guard<std::mutex> lk(c.mu);
  ++c.frees;
  if (p) c.free_blocks.emplace(c.sizes[p], p);
  return 0;
}
int dev_malloc(void** p, size_t n) { return cached_malloc(g_dev, p, n, false); }
int dev_free(void* p) { return cached_free(g_dev, p); }
int pin_malloc(void** p, size_t n, unsigned int) { return cached_malloc(g_pin, p, n, true); }
int pin_free(void* p) { return cached_free(g_pin, p); }
int dev_malloc_plain(void** p, size_t n) {
  ++g_dev_plain_malloc;
  return cudaMalloc(p, n) != cudaSuccess;
}
int dev_free_plain(void* p) {
  ++g_dev_plain_free;
  return cudaFree(p) != cudaSuccess;
}
int pin_malloc_plain(void** p, size_t n, unsigned int f) {
  ++g_pin_plain_malloc;
  return cudaHostAlloc(p, n, f) != cudaSuccess;
}
int pin_free_plain(void* p) {
  ++g_pin_plain_free;
  return cudaFreeHost(p) != cudaSuccess;
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR_OF_JPEGS [batch [hardware|parallel]]\n", argv[0]);
    return 2;
  }
  const int batch = argc > 2 ? std::atoi(argv[2]) : 256;
  std::vector<std::string> files;
  if (DIR* d = opendir(argv[1])) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 4 && n.substr(n.size() - 4) == ".jpg") files.push_back(std::string(argv[1]) + "/" + n);
    }
    closedir(d);
  }
  std::sort(files.begin(), files.end());
  if ((int)files.size() < batch) {
    std::fprintf(stderr, "%zu JPEGs in %s, need %d\n", files.size(), argv[1], batch);
    return 2;
  }
  std::vector<std::vector<unsigned char>> data(batch);
  for (int i = 0; i < batch; ++i) {
    std::ifstream in(files[i], std::ios::binary);
    data[i].assign(std::istreambuf_iterator<char>(in), {});
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  int lo = 0, hi = 0;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  const char* conn = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::printf("CUDA_DEVICE_MAX_CONNECTIONS=%s\n", conn ? conn : "(unset)");
  std::printf("device %s, %d SMs, stream priorities %d (least) .. %d (greatest), batch %d\n", prop.name,
              prop.multiProcessorCount, lo, hi, batch);

  cudaStream_t s_norm, s_hp, s_load;
  CK(cudaStreamCreateWithPriority(&s_norm, cudaStreamNonBlocking, lo));
  CK(cudaStreamCreateWithPriority(&s_hp, cudaStreamNonBlocking, hi));
  CK(cudaStreamCreateWithPriority(&s_load, cudaStreamNonBlocking, lo));
  const int n_busy = 32 << 20;  // 128 MiB of floats: ~50 us a pass at ~4.8 TB/s (read + write)
  float* buf = nullptr;
  CK(cudaMalloc(&buf, sizeof(float) * n_busy));
  CK(cudaMemset(buf, 0, sizeof(float) * n_busy));

  std::vector<cudaStream_t> waiters(16);
  for (auto& w : waiters) CK(cudaStreamCreateWithFlags(&w, cudaStreamNonBlocking));
  cudaEvent_t spun;
  CK(cudaEventCreateWithFlags(&spun, cudaEventDisableTiming));
  cudaGraphExec_t graph = nullptr;
  {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s_load, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 2000; ++i) busy<<<prop.multiProcessorCount * 8, 256, 0, s_load>>>(buf, n_busy);
    CK(cudaStreamEndCapture(s_load, &g));
    CK(cudaGraphInstantiate(&graph, g, 0));
    CK(cudaGraphDestroy(g));
  }

  // The output: interleaved RGB, each image at its own offset.
  std::vector<size_t> offs(batch + 1, 0);
  std::vector<int> ws(batch), hs(batch);
  {
    nvjpegHandle_t h;
    NJ(nvjpegCreateSimple(&h));
    for (int i = 0; i < batch; ++i) {
      int nc = 0;
      nvjpegChromaSubsampling_t sub;
      int w[NVJPEG_MAX_COMPONENT], hh[NVJPEG_MAX_COMPONENT];
      NJ(nvjpegGetImageInfo(h, data[i].data(), data[i].size(), &nc, &sub, w, hh));
      ws[i] = w[0];
      hs[i] = hh[0];
      offs[i + 1] = offs[i] + ((size_t)w[0] * hh[0] * 3 + 255) / 256 * 256;
    }
    nvjpegDestroy(h);
  }
  unsigned char* out = nullptr;
  CK(cudaMalloc(&out, offs[batch]));

  if (argc > 3 && std::string(argv[3]) == "parallel") {
    constexpr int kHoldSmem = 160 * 1024;
    CK(cudaFuncSetAttribute(hold, cudaFuncAttributeMaxDynamicSharedMemorySize, kHoldSmem));
    auto load = [&](int launches) {  // ~0.2 ms a launch
      for (int i = 0; i < launches; ++i) hold<<<prop.multiProcessorCount, 256, kHoldSmem, s_load>>>(200000ull);
    };
    std::vector<unsigned char*> outs(3, nullptr);
    for (auto& o : outs) CK(cudaMalloc(&o, offs[batch]));
    nvjpegHandle_t ha, hb;
    NJ(nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &ha));
    NJ(nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &hb));
    auto state = [&](nvjpegHandle_t h, nvjpegOutputFormat_t f) {
      nvjpegJpegState_t st;
      NJ(nvjpegJpegStateCreate(h, &st));
      NJ(nvjpegDecodeBatchedInitialize(h, st, batch, 1, f));
      return st;
    };
    std::vector<const unsigned char*> ptrs(batch);
    std::vector<size_t> lens(batch);
    for (int i = 0; i < batch; ++i) {
      ptrs[i] = data[i].data();
      lens[i] = data[i].size();
    }
    // Decodes the batch into `o` (planar formats: plane c at c * w * h of the image's place) and returns the ms
    // from the call to the stream's completion.
    auto decode = [&](nvjpegHandle_t h, nvjpegJpegState_t st, nvjpegOutputFormat_t f, unsigned char* o,
                      cudaStream_t s) {
      std::vector<nvjpegImage_t> dst(batch);
      for (int i = 0; i < batch; ++i) {
        dst[i] = nvjpegImage_t{};
        const size_t plane = (size_t)ws[i] * hs[i];
        if (f == NVJPEG_OUTPUT_RGBI) {
          dst[i].channel[0] = o + offs[i];
          dst[i].pitch[0] = (size_t)ws[i] * 3;
        } else {
          for (int c = 0; c < 3; ++c) {
            dst[i].channel[c] = o + offs[i] + c * plane;
            dst[i].pitch[c] = (size_t)ws[i];
          }
        }
      }
      const auto t0 = std::chrono::steady_clock::now();
      NJ(nvjpegDecodeBatched(h, st, ptrs.data(), lens.data(), dst.data(), s));
      CK(cudaStreamSynchronize(s));
      return ms_since(t0);
    };
    auto median5 = [&](auto&& once) {
      std::vector<double> v;
      for (int r = 0; r < 5; ++r) v.push_back(once());
      std::sort(v.begin(), v.end());
      return v[2];
    };
    const struct {
      const char* name;
      nvjpegOutputFormat_t f;
    } formats[] = {{"RGBI", NVJPEG_OUTPUT_RGBI}, {"RGB", NVJPEG_OUTPUT_RGB}, {"YUV", NVJPEG_OUTPUT_YUV}};
    for (const auto& fm : formats) {
      nvjpegJpegState_t st = state(ha, fm.f);
      for (int w = 0; w < 2; ++w) decode(ha, st, fm.f, outs[0], s_norm);
      const double alone = median5([&] { return decode(ha, st, fm.f, outs[0], s_norm); });
      const double loaded = median5([&] {
        CK(cudaDeviceSynchronize());
        load(500);
        const double ms = decode(ha, st, fm.f, outs[0], s_norm);
        CK(cudaDeviceSynchronize());
        return ms;
      });
      const double loaded_hp = median5([&] {
        CK(cudaDeviceSynchronize());
        load(500);
        const double ms = decode(ha, st, fm.f, outs[0], s_hp);
        CK(cudaDeviceSynchronize());
        return ms;
      });
      std::printf(
          "formats  %-5s decode alone %7.2f ms, beside the load %7.2f ms, beside it on the urgent stream %7.2f ms\n",
          fm.name, alone, loaded, loaded_hp);
      nvjpegJpegStateDestroy(st);
    }
    // Two threads at once: 4 batches each.
    for (int handles = 1; handles <= 2; ++handles)
      for (int loaded = 0; loaded <= 1; ++loaded) {
        nvjpegHandle_t h2 = handles == 2 ? hb : ha;
        nvjpegJpegState_t s1 = state(ha, NVJPEG_OUTPUT_RGBI), s2 = state(h2, NVJPEG_OUTPUT_RGBI);
        cudaStream_t t1, t2;
        CK(cudaStreamCreateWithFlags(&t1, cudaStreamNonBlocking));
        CK(cudaStreamCreateWithFlags(&t2, cudaStreamNonBlocking));
        decode(ha, s1, NVJPEG_OUTPUT_RGBI, outs[0], t1);
        decode(h2, s2, NVJPEG_OUTPUT_RGBI, outs[1], t2);
        CK(cudaDeviceSynchronize());
        if (loaded) load(2500);  // ~500 ms, longer than the decodes
        const auto t0 = std::chrono::steady_clock::now();
        double per[2] = {0, 0};
        std::thread a([&] {
          for (int k = 0; k < 4; ++k) per[0] += decode(ha, s1, NVJPEG_OUTPUT_RGBI, outs[0], t1);
        });
        std::thread b([&] {
          for (int k = 0; k < 4; ++k) per[1] += decode(h2, s2, NVJPEG_OUTPUT_RGBI, outs[1], t2);
        });
        a.join();
        b.join();
        const double wall = ms_since(t0);
        CK(cudaDeviceSynchronize());
        std::printf(
            "threads  2 threads, %d handle(s)%s: %6.0f img/s (8 batches in %.1f ms; %.1f / %.1f ms a batch on "
            "each thread)\n",
            handles, loaded ? ", beside the load" : "", 8.0 * batch / wall * 1e3, wall, per[0] / 4, per[1] / 4);
        nvjpegJpegStateDestroy(s1);
        nvjpegJpegStateDestroy(s2);
        CK(cudaStreamDestroy(t1));
        CK(cudaStreamDestroy(t2));
      }
    // Bytes: one state twice, two states of one handle, two handles.
    {
      std::vector<unsigned char> h0(offs[batch]), h1(offs[batch]);
      auto differ = [&](unsigned char* x, unsigned char* y) {
        CK(cudaMemcpy(h0.data(), x, offs[batch], cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(h1.data(), y, offs[batch], cudaMemcpyDeviceToHost));
        size_t n = 0, images = 0;
        for (int i = 0; i < batch; ++i) {
          size_t k = 0;
          for (size_t b = offs[i]; b < offs[i] + (size_t)ws[i] * hs[i] * 3; ++b) k += h0[b] != h1[b];
          n += k;
          images += k > 0;
        }
        return std::to_string(n) + " bytes in " + std::to_string(images) + " images";
      };
      nvjpegJpegState_t a1 = state(ha, NVJPEG_OUTPUT_RGBI), a2 = state(ha, NVJPEG_OUTPUT_RGBI),
                        b1 = state(hb, NVJPEG_OUTPUT_RGBI);
      for (auto& o : outs) CK(cudaMemset(o, 0, offs[batch]));
      decode(ha, a1, NVJPEG_OUTPUT_RGBI, outs[0], s_norm);
      decode(ha, a1, NVJPEG_OUTPUT_RGBI, outs[1], s_norm);
      std::printf("bytes    one state, twice: %s differ\n", differ(outs[0], outs[1]).c_str());
      decode(ha, a2, NVJPEG_OUTPUT_RGBI, outs[1], s_norm);
      std::printf("bytes    two states of one handle: %s differ\n", differ(outs[0], outs[1]).c_str());
      decode(hb, b1, NVJPEG_OUTPUT_RGBI, outs[2], s_norm);
      std::printf("bytes    two handles: %s differ\n", differ(outs[0], outs[2]).c_str());
      load(500);
      decode(ha, a1, NVJPEG_OUTPUT_RGBI, outs[1], s_norm);
      CK(cudaDeviceSynchronize());
      std::printf("bytes    one state, beside the load: %s differ\n", differ(outs[0], outs[1]).c_str());
    }
    return 0;
  }

  struct Config {
    const char* name;
    nvjpegBackend_t backend;
    int alloc;  // 0 default, 1 counting plain, 2 caching
  };
  const Config configs[] = {{"hardware", NVJPEG_BACKEND_HARDWARE, 1},
                            {"hardware+caching-alloc", NVJPEG_BACKEND_HARDWARE, 2},
                            {"gpu-hybrid", NVJPEG_BACKEND_GPU_HYBRID, 1},
                            {"gpu-hybrid+caching-alloc", NVJPEG_BACKEND_GPU_HYBRID, 2}};
  const bool hardware_only = argc > 3 && std::string(argv[3]) == "hardware";  // the first config alone
  for (const Config& cfg : configs) {
    if (hardware_only && &cfg != &configs[0]) break;
    nvjpegDevAllocator_t da{};
    nvjpegPinnedAllocator_t pa{};
    if (cfg.alloc == 1) {
      da = {dev_malloc_plain, dev_free_plain};
      pa = {pin_malloc_plain, pin_free_plain};
    } else {
      da = {dev_malloc, dev_free};
      pa = {pin_malloc, pin_free};
    }
    nvjpegHandle_t h;
    if (nvjpegCreateEx(cfg.backend, &da, &pa, NVJPEG_FLAGS_DEFAULT, &h) != NVJPEG_STATUS_SUCCESS) {
      std::printf("%s: backend not available\n", cfg.name);
      continue;
    }
    nvjpegJpegState_t st;
    NJ(nvjpegJpegStateCreate(h, &st));
    NJ(nvjpegDecodeBatchedInitialize(h, st, batch, 1, NVJPEG_OUTPUT_RGBI));
    std::vector<const unsigned char*> ptrs(batch);
    std::vector<size_t> lens(batch);
    std::vector<nvjpegImage_t> dst(batch);
    for (int i = 0; i < batch; ++i) {
      ptrs[i] = data[i].data();
      lens[i] = data[i].size();
      dst[i] = nvjpegImage_t{};
      dst[i].channel[0] = out + offs[i];
      dst[i].pitch[0] = (size_t)ws[i] * 3;
    }
    auto decode = [&](cudaStream_t s, double* call_ms, double* done_ms) {
      const auto t0 = std::chrono::steady_clock::now();
      NJ(nvjpegDecodeBatched(h, st, ptrs.data(), lens.data(), dst.data(), s));
      *call_ms = ms_since(t0);
      CK(cudaStreamSynchronize(s));
      *done_ms = ms_since(t0);
    };
    double c, d;
    for (int w = 0; w < 3; ++w) decode(s_norm, &c, &d);  // warm-up: allocations happen here
    const long dm0 = g_dev_plain_malloc + g_dev.real, df0 = g_dev_plain_free, pm0 = g_pin_plain_malloc + g_pin.real,
               pf0 = g_pin_plain_free;
    const char* situations[] = {"alone",      "spin1", "spinall",  "spinall_hp", "kernels",
                                "kernels_hp", "graph", "graph_hp", "blocked"};
    for (int k = 0; k < 9; ++k) {
      std::vector<double> calls, dones, loads;
      for (int r = 0; r < 5; ++r) {
        CK(cudaDeviceSynchronize());
        const auto t0 = std::chrono::steady_clock::now();
        if (k == 1) spin<<<1, 32, 0, s_load>>>(100000000ull);
        if (k == 2 || k == 3) spin<<<prop.multiProcessorCount * 16, 128, 0, s_load>>>(100000000ull);
        if (k == 4 || k == 5)
          for (int i = 0; i < 2000; ++i) busy<<<prop.multiProcessorCount * 8, 256, 0, s_load>>>(buf, n_busy);
        if (k == 6 || k == 7) CK(cudaGraphLaunch(graph, s_load));
        if (k == 8) {
          spin<<<1, 32, 0, s_load>>>(100000000ull);
          CK(cudaEventRecord(spun, s_load));
          for (cudaStream_t w : waiters) {
            CK(cudaStreamWaitEvent(w, spun, 0));
            busy<<<1, 32, 0, w>>>(buf, 32);
          }
        }
        const double launched = ms_since(t0);
        decode(k == 3 || k == 5 || k == 7 ? s_hp : s_norm, &c, &d);
        CK(cudaDeviceSynchronize());
        calls.push_back(c);
        dones.push_back(d);
        loads.push_back(ms_since(t0) - launched);
      }
      std::sort(calls.begin(), calls.end());
      std::sort(dones.begin(), dones.end());
      std::sort(loads.begin(), loads.end());
      std::printf("%-26s %-11s call returns %8.2f ms, decode done %8.2f ms (%6.0f img/s); load done after %8.2f ms\n",
                  cfg.name, situations[k], calls[2], dones[2], batch / dones[2] * 1e3, loads[2]);
    }
    std::printf(
        "%-26s after warm-up: %ld device allocations, %ld device frees, %ld pinned allocations, %ld pinned "
        "frees (caching: %ld/%ld device calls real, %ld/%ld pinned)\n",
        cfg.name, g_dev_plain_malloc + g_dev.real - dm0, g_dev_plain_free - df0, g_pin_plain_malloc + g_pin.real - pm0,
        g_pin_plain_free - pf0, g_dev.real, g_dev.calls, g_pin.real, g_pin.calls);
    nvjpegJpegStateDestroy(st);
    nvjpegDestroy(h);
  }
  return 0;
}
