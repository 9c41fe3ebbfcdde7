// Which layers attend through the sliding window: <arch>.attention.sliding_window_pattern as llama.cpp reads it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/gguf/gguf_reader.h"
#include "llvm/Support/Error.h"

namespace minfer::model {

// n_layer flags, true = the layer is local (sliding window), from llama.cpp's period rule
// (llama_hparams::set_swa_pattern with dense_first = false): layer il is local iff
// il % period < period − 1; period 0 makes every layer local, period 1 none.
std::vector<bool> swaLayersFromPeriod(uint32_t period, uint32_t n_layer);

// n_layer flags, true = local, from the metadata key `key` of `file`:
//  - absent: swaLayersFromPeriod(default_period, n_layer);
//  - an integer (any width, value ≤ UINT32_MAX): that period;
//  - an ARRAY of n_layer BOOL, INT32 or UINT32 elements: one flag per layer, true / 1 = local,
//    false / 0 = global. This is how llama.cpp's get_key_or_arr fills hparams.swa_layers
//    (src/llama-model-loader.cpp: the array length must equal n_layer; BOOL, INT32 and UINT32 are the
//    element types it accepts; src/llama-hparams.cpp: is_swa(il) = swa_layers[il] != 0).
// Errors name the file, the key and the values: an array whose length is not n_layer, an element type
// other than BOOL / INT32 / UINT32 (strings, floats, other integer widths), an integer element other
// than 0 or 1 (llama.cpp would read 2 as "local"; we refuse a value whose meaning is a guess), a scalar
// that is not an integer or does not fit UINT32.
llvm::Expected<std::vector<bool>> readSwaLayers(const gguf::GgufFile& file, const std::string& key,
                                                uint32_t n_layer, uint32_t default_period);

}  // namespace minfer::model
