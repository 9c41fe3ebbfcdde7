// The chat template of a tool: a file or the artifact's (chat_template_file.h).
#include "runtime/tools/chat_template_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "minfer/artifact.h"

namespace minfer::tools {

Result<ChatTemplateText> chatTemplateText(const Model& model, const std::string& model_path, const std::string& file) {
  ChatTemplateText text;
  if (file.empty()) {
    const fb::Tokenizer* t = model.artifact().manifest()->tokenizer();
    if (t && t->chat_template()) text.source = t->chat_template()->str();
    text.origin = model_path + ": tokenizer.chat_template";
    return text;
  }
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec))
    return Status::error("--chat-template " + file + ": is a directory, not a template file");
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::error("--chat-template " + file + ": cannot read the template: " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  text.source = ss.str();
  text.origin = file;
  return text;
}

}  // namespace minfer::tools
