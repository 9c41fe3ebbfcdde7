// The .mfb half of minfer-inspect (filled in with the artifact reader; see inspect_artifact.h).
#include "compiler/tools/inspect_artifact.h"

#include "llvm/Support/raw_ostream.h"

namespace minfer {

int inspectArtifact(const std::string& path, bool, bool) {
  llvm::errs() << "minfer-inspect: " << path << ": artifact inspection is not available in this build yet\n";
  return 1;
}

}  // namespace minfer
