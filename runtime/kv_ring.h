// What the ring KV caches of a single-sequence session still hold (schema Step.kv_ring), so that a
// forward pass never reads a key a later position overwrote.
//
// A sliding-window layer with a ring of R slots keeps position p in slot p % R. Writing positions
// pos0 .. pos0+n−1 overwrites the positions R below them, so after a rewind (Session::rewind) the window
// before the new pos0 may be gone: resuming at pos0 needs positions max(0, pos0 − W + 1) .. pos0 − 1 of every
// ring layer (W its window). A ring never wraps when R ≥ n_ctx; such layers are not tracked. Shared by the
// CPU (runtime/cpu/cpu_backend.cpp) and CUDA (runtime/cuda/cuda_session.cpp) single-sequence sessions.
// Header-only: both backends' libraries include it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "minfer/status.h"

namespace minfer {

class KvRingTracker {
 public:
  // A ring layer of `ring` slots and window `window` in a session of n_ctx positions (ignored when the ring
  // holds the whole context).
  void addLayer(int64_t ring, int window, int n_ctx) {
    if (ring > 0 && ring < n_ctx) rings_.push_back({ring, window, 0});
  }

  // True when forward(…, pos0) reads only keys every ring still holds: pos0 = 0, or positions
  // pos0 − W + 1 .. pos0 − 1 were not overwritten since they were written.
  bool canResumeAt(int pos0) const {
    if (pos0 == 0) return true;
    for (const Ring& r : rings_)
      if (r.kept_from > std::max(0, pos0 - r.window + 1)) return false;
    return true;
  }

  // Error naming the lost positions when !canResumeAt(pos0).
  Status check(int pos0) const {
    if (canResumeAt(pos0)) return Status::ok();
    for (const Ring& r : rings_)
      if (r.kept_from > std::max(0, pos0 - r.window + 1))
        return Status::error("forward at position " + std::to_string(pos0) + ": a sliding-window layer's KV ring of " +
                             std::to_string(r.ring) + " positions (window " + std::to_string(r.window) +
                             ") holds positions from " + std::to_string(r.kept_from) + " on, but position " +
                             std::to_string(pos0) + " attends to positions from " +
                             std::to_string(std::max(0, pos0 - r.window + 1)) +
                             " (rewind less than the artifact's max batch, or re-evaluate from position 0)");
    return Status::ok();
  }

  // Records that positions pos0 .. pos0+n−1 were written (after check(pos0) passed): every ring keeps
  // the positions from max(what it kept, pos0 + n − ring) on.
  void advance(int pos0, int n) {
    for (Ring& r : rings_) r.kept_from = std::max<int64_t>(pos0 == 0 ? 0 : r.kept_from, int64_t{pos0} + n - r.ring);
  }

 private:
  struct Ring {
    int64_t ring;
    int window;
    int64_t kept_from;  // positions [kept_from, last position written] are in the ring
  };
  std::vector<Ring> rings_;
};

}  // namespace minfer
