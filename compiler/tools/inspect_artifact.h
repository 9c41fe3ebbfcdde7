// The .mfb half of minfer-inspect: prints an artifact's config, tensors, planes, plans and kernels.
#pragma once

#include <string>

namespace minfer {

// Prints the artifact at `path` (text, or JSON when `json`); with `verify`, checks every segment's
// checksum. Returns the process exit code (0 ok, 1 on any error, after printing it to stderr).
int inspectArtifact(const std::string& path, bool json, bool verify);

}  // namespace minfer
