// BackendSession: what a backend keeps alive while a trainer runs (GPU: streams, handles, workspace, pinned
// staging) and the stream forks the trainer replays the step schedule with (transfer, side, update).
#pragma once

#include <renaissance/core/backend.h>
#include <renaissance/runtime/exec_env.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

namespace renaissance::runtime {

/// What a backend needs alive while a trainer runs (GPU: the stream, cuDNN/cuBLASLt handles, the workspace),
/// wired into an ExecEnv by open_backend.
class BackendSession {
 public:
  virtual ~BackendSession() = default;
  /// Waits until everything launched so far has finished (GPU: the stream; CPU: nothing to wait for).
  virtual void synchronize() {}
  /// Host memory the backend copies from fastest (GPU: pinned), zeroed.
  virtual std::byte* host_alloc(std::int64_t bytes);
  virtual void host_free(std::byte* p) noexcept;

  // Input double buffering (DESIGN §7): batch k+1 is staged on the host and copied to the device while step k
  // runs. Slot s (A = 0, B = 1) owns a pinned staging buffer, a device input buffer and pinned step scalars.
  /// Blocks the host until the work that last used slot `s` (released by release_slot) has finished, so its
  /// pinned buffers may be rewritten. CPU: returns at once.
  virtual void wait_slot(int s) { (void)s; }
  /// Runs `launch` (the TRANSFER graph of slot `s`) on the transfer stream, after the compute work that last
  /// read slot `s`; later compute work waits for the copy. CPU: calls `launch`.
  virtual void transfer(ExecEnv& env, int s, const std::function<void()>& launch) { (void)env, (void)s, launch(); }
  /// Copies per-step scalars from pinned host memory to the device, ordered with the compute work (GPU: an
  /// asynchronous copy on the compute stream). CPU: memcpy.
  virtual void upload_async(std::byte* dst, const std::byte* src, std::int64_t bytes);
  /// Marks the end of the compute work that uses slot `s`.
  virtual void release_slot(int s) { (void)s; }
  /// Runs `launch` on the side stream after everything launched so far on the compute stream (GPU: the gradient
  /// all-reduce of bucket 1 beside the first layer's backward). CPU: calls `launch`.
  virtual void side(ExecEnv& env, const std::function<void()>& launch) { (void)env, launch(); }
  /// Later compute work waits for the side stream's work.
  virtual void join_side(ExecEnv& env) { (void)env; }
  /// Runs `launch` on the update stream after everything launched so far on the compute stream (GPU: the optimizer,
  /// the W → A cast and the EMA beside the BN running statistics and the metrics). CPU: calls `launch`.
  virtual void update(ExecEnv& env, const std::function<void()>& launch) { (void)env, launch(); }
  /// Later compute work waits for the update stream's work.
  virtual void join_update(ExecEnv& env) { (void)env; }
  /// Writes `byte` over the scratch memory outside the arena that the step's kernels use (GPU: the cuDNN/cuBLASLt
  /// workspaces of the compute streams), waiting for it. The trainer zeroes them before the run, after start-up
  /// timed the engines in them, so a timed start-up and one from the engine cache start the run alike.
  virtual void fill_workspaces(int byte) { (void)byte; }
  /// RN_DEBUG_NODE_HASHES (GPU): after optimizer step `step` (from 1) of the first RN_DEBUG_NODE_HASH_STEPS (2),
  /// waits for the device and writes every slot's hash to the file the variable names (docs/kernels-cuda.md).
  virtual void trace_node_hashes(std::int64_t step) { (void)step; }
};
/// CPU: a session that does nothing. CUDA: streams + handles + a `workspace_bytes` device workspace (two with
/// `concurrent`: the weight-gradient stream has its own).
std::unique_ptr<BackendSession> open_backend(Backend b, ExecEnv& env, std::int64_t workspace_bytes,
                                             bool concurrent = true);
#ifdef RENAISSANCE_HAVE_CUDA
/// `concurrent`: a second compute stream for weight gradients (ExecEnv::streams).
std::unique_ptr<BackendSession> open_cuda_backend(ExecEnv& env, std::int64_t workspace_bytes,
                                                  bool concurrent);  // cuda_session.cpp
#endif

}  // namespace renaissance::runtime
