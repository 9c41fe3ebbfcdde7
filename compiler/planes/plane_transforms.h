// Plane transforms: GGUF tensor bytes → the bytes of every plane of its TensorLayout (DESIGN.md §3).
//
// What each plane holds is defined by layout_planner.h (which planes) and kernels/stride_table.h
// (addressing and value semantics); the q / scale / min values come from decomposeBlock
// (kernels/block_formats.h), whose float operations match dequantizeBlock bit for bit.
//
// Streaming: one tensor at a time, into caller-provided buffers, so the artifact writer can write a
// tensor's planes and free them before the next tensor (peak memory ≈ one tensor's planes beyond the
// GGUF mapping). The caller may also ask for a subset of the planes (empty buffers are skipped), e.g.
// one plane at a time.
//
// Parallel and deterministic: rows are split into chunks run on PlaneWorkers; each row of each plane
// is a pure function of the same source row and every byte of an output (row padding included) is
// written, so the output is byte-identical whatever the thread count and whatever the buffers held.
//
// Cost: one pass over the source; per quantized weight about one byte written to kI8 (+ ½ to kPacked),
// plus 8 bytes per group for kScale/kMin.
#pragma once

#include <cstdint>
#include <vector>

#include "compiler/planes/layout_planner.h"
#include "compiler/planes/plane_workers.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"

namespace minfer::planes {

// Writes the planes of `layout` from `source`, the tensor's GGUF data (layout.source_bytes bytes:
// layout.desc.rows rows of layout.source_row_bytes bytes). `outputs` has one entry per
// layout.planes[i]: an empty entry skips that plane, any other must be exactly planes[i].bytes()
// long. Errors (naming the tensor, the plane and the sizes): source size ≠ layout.source_bytes;
// outputs.size() ≠ planes.size(); an output of the wrong size.
llvm::Error transformTensor(const TensorLayout& layout, llvm::ArrayRef<uint8_t> source,
                            llvm::ArrayRef<llvm::MutableArrayRef<uint8_t>> outputs, PlaneWorkers& workers);

// Convenience: allocates and returns every plane (planes[i] has layout.planes[i].bytes() bytes).
llvm::Expected<std::vector<std::vector<uint8_t>>> transformTensor(const TensorLayout& layout,
                                                                  llvm::ArrayRef<uint8_t> source,
                                                                  PlaneWorkers& workers);

}  // namespace minfer::planes
