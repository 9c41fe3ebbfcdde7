// The artifact a runtime tool runs on: its positional argument or -m / --model (llama.cpp's spelling).
#pragma once

#include <string>

#include "minfer/status.h"

namespace minfer::tools {

// `flag` (-m) or `positional`; both given must name the same file. Errors: they differ; neither is given.
inline Result<std::string> modelArgument(const std::string& positional, const std::string& flag) {
  if (!flag.empty() && !positional.empty() && positional != flag)
    return Status::error("-m " + flag + " and the positional " + positional + " differ");
  std::string model = flag.empty() ? positional : flag;
  if (model.empty()) return Status::error("no model: give the artifact as the first argument or with -m (see --help)");
  return model;
}

}  // namespace minfer::tools
