// minfer's version (the CMake project version) and the --version text of every tool.
#pragma once

namespace minfer {

#ifndef MINFER_VERSION
#define MINFER_VERSION "unknown"
#endif
inline constexpr const char* kVersion = MINFER_VERSION;

}  // namespace minfer
