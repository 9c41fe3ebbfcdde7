// The fuzz harnesses: one function per libFuzzer target, shared by the fuzz binaries and the corpus
// replay suite (test_fuzz_replay), so every checked-in input and every regression runs in ctest too.
//
// Each harness takes arbitrary bytes, must never crash, hang, leak or read out of bounds (ASan and
// UBSan watch), and checks invariants of its own: a violated invariant calls fuzzFail(), which prints
// what broke and aborts (a libFuzzer finding; a failed test in the replay suite).
//   runGgufReader  GgufFile::parse of the bytes; then every metadata value, every typed accessor,
//                  every tensor's data, describeModel and the planes of small tensors.
//   runArtifact    the bytes as a .mfb file (memfd): ArtifactFile::open, verifyChecksums, a walk of
//                  the manifest; then Model::open on the CPU, tokenizer calls, a session, prefill and
//                  decode of two tokens (sessions over ~64 MiB are skipped: a real 7B model needs GBs).
//   runTokenizer   byte 0 picks the vocabulary (bit 0: llama-spm / gpt-2) and the flags (bit 1
//                  parse_special, bit 2 add_special, bit 3 render_special); the rest is encoded as
//                  text and, read as little-endian int32 ids (any value), decoded, turned into pieces
//                  and streamed through a Detokenizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace minfer::fuzz {

int runGgufReader(const uint8_t* data, size_t size);
int runArtifact(const uint8_t* data, size_t size);
int runTokenizer(const uint8_t* data, size_t size);

// Prints "fuzz invariant violated: <what>" to stderr and aborts.
[[noreturn]] void fuzzFail(const std::string& what);

// True when `s` is well-formed UTF-8 (Unicode 15 §3.9, Table 3-7: no overlongs, no surrogates,
// nothing above U+10FFFF). Written here, independently of runtime/text/utf8.cpp.
bool isWellFormedUtf8(const std::string& s);

}  // namespace minfer::fuzz
