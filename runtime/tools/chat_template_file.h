// The chat template a tool renders with: --chat-template's file, else the artifact's tokenizer.chat_template
// (minfer-run -cnv and minfer-server share it).
#pragma once

#include <string>

#include "minfer/runtime.h"

namespace minfer::tools {

struct ChatTemplateText {
  std::string source;  // Jinja text; "" when the artifact has none and no file was given
  std::string origin;  // names it in messages: "FILE" or "MODEL: tokenizer.chat_template"
};

// `file` (the --chat-template option; "" = none) read whole, else the template `model` (opened from
// `model_path`) carries. Errors: `file` is a directory or cannot be read (the message names the option,
// the path and the reason).
Result<ChatTemplateText> chatTemplateText(const Model& model, const std::string& model_path, const std::string& file);

}  // namespace minfer::tools
