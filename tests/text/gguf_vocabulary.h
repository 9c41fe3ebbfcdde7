// Test helper: reads a minfer::Vocabulary from a GGUF file's tokenizer.ggml.* keys (llama.cpp rules).
//
// Starts from Vocabulary::withDefaults(model, pre) and overwrites each field whose key is present;
// special ids outside [0, n_vocab) keep the default, as llama.cpp's loader does (it warns).
#pragma once

#include <string>

#include "compiler/gguf/gguf_reader.h"
#include "minfer/status.h"
#include "minfer/tokenizer.h"

namespace minfer::test {

inline Result<Vocabulary> vocabularyFromGguf(const gguf::GgufFile& f) {
  auto fail = [&](llvm::Error e) { return Status::error(llvm::toString(std::move(e))); };
  auto model = f.getString("tokenizer.ggml.model");
  if (!model) return fail(model.takeError());
  std::string pre;
  if (f.find("tokenizer.ggml.pre")) {
    auto p = f.getString("tokenizer.ggml.pre");
    if (!p) return fail(p.takeError());
    pre = std::string(*p);
  }
  Vocabulary v = Vocabulary::withDefaults(std::string(*model), pre);

  auto tokens = f.getStringArray("tokenizer.ggml.tokens");
  if (!tokens) return fail(tokens.takeError());
  v.tokens.assign(tokens->begin(), tokens->end());
  if (f.find("tokenizer.ggml.scores")) {
    auto scores = f.getF32Array("tokenizer.ggml.scores");
    if (!scores) return fail(scores.takeError());
    v.scores = std::move(*scores);
  }
  if (f.find("tokenizer.ggml.token_type")) {
    auto types = f.getI32Array("tokenizer.ggml.token_type");
    if (!types) return fail(types.takeError());
    v.token_types = std::move(*types);
  }
  if (f.find("tokenizer.ggml.merges")) {
    auto merges = f.getStringArray("tokenizer.ggml.merges");
    if (!merges) return fail(merges.takeError());
    v.merges.assign(merges->begin(), merges->end());
  }

  const std::pair<const char*, int32_t*> ids[] = {{"tokenizer.ggml.bos_token_id", &v.bos_id},
                                                  {"tokenizer.ggml.eos_token_id", &v.eos_id},
                                                  {"tokenizer.ggml.unknown_token_id", &v.unk_id},
                                                  {"tokenizer.ggml.padding_token_id", &v.pad_id},
                                                  {"tokenizer.ggml.eot_token_id", &v.eot_id},
                                                  {"tokenizer.ggml.eom_token_id", &v.eom_id}};
  for (const auto& [key, field] : ids) {
    if (!f.find(key)) continue;
    auto id = f.getI64(key);
    if (!id) return fail(id.takeError());
    if (*id >= 0 && *id < static_cast<int64_t>(v.tokens.size())) *field = static_cast<int32_t>(*id);
  }
  const std::pair<const char*, bool*> flags[] = {{"tokenizer.ggml.add_bos_token", &v.add_bos},
                                                 {"tokenizer.ggml.add_eos_token", &v.add_eos},
                                                 {"tokenizer.ggml.add_space_prefix", &v.add_space_prefix}};
  for (const auto& [key, field] : flags) {
    if (!f.find(key)) continue;
    auto value = f.getBool(key);
    if (!value) return fail(value.takeError());
    *field = *value;
  }
  return v;
}

inline Result<Vocabulary> vocabularyFromGguf(const std::string& path) {
  auto file = gguf::GgufFile::open(path);
  if (!file) return Status::error(llvm::toString(file.takeError()));
  return vocabularyFromGguf(**file);
}

}  // namespace minfer::test
