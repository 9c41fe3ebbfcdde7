// A small program embedding the minfer runtime: open an artifact, create a session, stream a greedy
// continuation of a prompt to stdout.   usage: minfer-example [--no-verify] MODEL.mfb "prompt" [n_tokens]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "minfer/runtime.h"

int main(int argc, char** argv) {
  // Every data segment's checksum is checked while loading unless told otherwise.
  minfer::ModelOptions options;
  if (argc > 1 && std::string(argv[1]) == "--no-verify") {
    options.verify_checksums = false;
    --argc;
    ++argv;
  }
  if (argc < 3) {
    std::fprintf(stderr, "usage: minfer-example [--no-verify] MODEL.mfb \"prompt\" [n_tokens]\n");
    return 2;
  }
  // Map + verify the artifact and pick a backend (CUDA when usable, else the CPU).
  auto model = minfer::Model::open(argv[1], minfer::BackendKind::kAuto, options);
  if (!model) {
    std::fprintf(stderr, "%s\n", model.status().message().c_str());
    return 1;
  }
  std::fprintf(stderr, "backend: %s %s\n", (*model)->backendName(), (*model)->backendNote().c_str());

  // Everything a session needs (activations, KV cache) is allocated here, once.
  auto session = (*model)->createSession({.n_ctx = 512});
  if (!session) {
    std::fprintf(stderr, "%s\n", session.status().message().c_str());
    return 1;
  }

  minfer::GenerateParams params;
  params.n_predict = 32;
  if (argc > 3) {
    char* end = nullptr;
    const long n = std::strtol(argv[3], &end, 10);
    if (*argv[3] == '\0' || *end != '\0' || n < 0 || n > 1000000) {
      std::fprintf(stderr, "minfer-example: n_tokens '%s' is not a number in 0..1000000\n", argv[3]);
      return 2;
    }
    params.n_predict = static_cast<int>(n);
  }
  params.sampling.temperature = 0;  // greedy
  std::fputs(argv[2], stdout);
  auto result = (*session)->generate(argv[2], params, [](std::string_view piece, int32_t) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;  // false would stop the generation
  });
  std::fputc('\n', stdout);
  std::fflush(stdout);  // the text ends before the summary on stderr starts, also on a terminal
  if (!result) {
    std::fprintf(stderr, "%s\n", result.status().message().c_str());
    return 1;
  }
  std::fprintf(stderr, "%d prompt tokens, %d generated (%s)\n", result->n_prompt, result->n_generated,
               minfer::stopReasonName(result->stop));
  return 0;
}
