// Synthetic models: shapes, type mixes, deterministic block generators, writer population.
#include "compiler/tools/synth_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"

namespace minfer::synth {
namespace {

llvm::Error synthError(const llvm::Twine& what) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), what.str());
}

// splitmix64 (Steele, Lea, Flood: "Fast splittable pseudorandom number generators", 2014): the
// finalizer is a bijection on 64 bits; the generator adds the golden-ratio increment per draw.
constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct Rng {
  uint64_t state;
  uint64_t next() { return mix64(state += kGamma); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Approximately standard normal: sum of four 16-bit uniforms (Irwin–Hall), centred and scaled.
  double gaussian() {
    const uint64_t x = next();
    const double sum = static_cast<double>((x & 0xFFFF) + ((x >> 16) & 0xFFFF) + ((x >> 32) & 0xFFFF) + (x >> 48));
    constexpr double kMean = 4 * 65535.0 / 2;
    constexpr double kInvStd = 2.6428997921303014e-05;  // 1 / sqrt(4 * (65536^2 - 1) / 12)
    return (sum - kMean) * kInvStd;
  }
  void bytes(uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
      const uint64_t x = next();
      std::memcpy(p + i, &x, std::min<size_t>(8, n - i));
    }
  }
};

constexpr double kWeightStd = 0.02;

float floatValue(TensorKind kind, Rng& rng) {
  const double z = kWeightStd * rng.gaussian();
  return static_cast<float>(kind == TensorKind::kNorm ? 1.0 + z : z);
}

// A random weight as binary16 by truncating the mantissa (rounding is pointless for random data and
// its branches cost more than the generator); magnitudes below the smallest normal half become ±0.
// |v| stays far below the half maximum (65504) for these distributions.
uint16_t truncateToHalf(float v) {
  const uint32_t x = floatToBits(v);
  const uint32_t absx = x & 0x7FFFFFFFu;
  const uint32_t magnitude = absx >= 0x38800000u ? (absx >> 13) - (112u << 10) : 0u;
  return static_cast<uint16_t>(((x >> 16) & 0x8000u) | magnitude);
}

void putU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

// Scale ranges below give dequantized weights a standard deviation of about kWeightStd:
//   Q8_0  w = d*q, q uniform int8 (std 73.9)                        d in [2e-4, 4e-4]
//   Q4_0  w = d*(q-8), q uniform 0..15 (std 4.61)                   d in [3e-3, 6e-3]
//   Q4_K  w = d*sc*q - dmin*m with m = sc and dmin = 7.5 d, so w ~ d*sc*(q - 7.5); sc uniform
//         1..63 (rms 36.8)                                          d in [0.8e-4, 1.6e-4]
//   Q6_K  w = d*sc*(q-32), sc = ±1..16 (rms 9.67), q-32 std 18.5    d in [6.5e-5, 1.3e-4]
// All d are normal binary16 numbers (> 6.1e-5).
void fillOneBlock(GgmlType type, TensorKind kind, Rng& rng, uint8_t* p) {
  switch (type) {
    case GgmlType::F32: {
      const float v = floatValue(kind, rng);
      std::memcpy(p, &v, 4);
      return;
    }
    case GgmlType::F16:
      putU16(p, truncateToHalf(floatValue(kind, rng)));
      return;
    case GgmlType::Q8_0:
      putU16(p, floatToHalf(static_cast<float>(rng.uniform(2e-4, 4e-4))));
      rng.bytes(p + 2, 32);
      return;
    case GgmlType::Q4_0:
      putU16(p, floatToHalf(static_cast<float>(rng.uniform(3e-3, 6e-3))));
      rng.bytes(p + 2, 16);
      return;
    case GgmlType::Q4_K: {
      const uint16_t d = floatToHalf(static_cast<float>(rng.uniform(0.8e-4, 1.6e-4)));
      putU16(p, d);
      putU16(p + 2, floatToHalf(7.5f * halfToFloat(d)));
      // 8 groups: 6-bit scale sc and min m (= sc), packed as kScaleMin (block_formats.h) reads them.
      uint8_t* s = p + 4;
      std::memset(s, 0, 12);
      const uint64_t bits = rng.next();
      for (int j = 0; j < 8; ++j) {
        const uint8_t sc = static_cast<uint8_t>(1 + ((bits >> (8 * j)) & 0xFF) % 63);
        const uint8_t m = sc;
        if (j < 4) {
          s[j] = static_cast<uint8_t>(s[j] | sc);
          s[j + 4] = static_cast<uint8_t>(s[j + 4] | m);
        } else {
          s[j + 4] = static_cast<uint8_t>((sc & 0xF) | ((m & 0xF) << 4));
          s[j - 4] = static_cast<uint8_t>(s[j - 4] | ((sc >> 4) << 6));
          s[j] = static_cast<uint8_t>(s[j] | ((m >> 4) << 6));
        }
      }
      rng.bytes(p + 16, 128);
      return;
    }
    case GgmlType::Q6_K: {
      rng.bytes(p, 192);  // ql[128], qh[64]
      const uint64_t bits = rng.next(), signs = rng.next();
      for (int g = 0; g < 16; ++g) {
        const int nibble = static_cast<int>((bits >> (4 * g)) & 0xF);
        const int sign = ((signs >> g) & 1) ? -1 : 1;
        p[192 + g] = static_cast<uint8_t>(static_cast<int8_t>(sign * (1 + nibble)));
      }
      putU16(p + 208, floatToHalf(static_cast<float>(rng.uniform(6.5e-5, 1.3e-4))));
      return;
    }
    default:
      std::memset(p, 0, ggmlTypeTraits(type).type_size);  // not produced by planTensors
      return;
  }
}

void fillRange(GgmlType type, TensorKind kind, uint64_t tensor_seed, uint64_t first_block, uint8_t* out,
               uint64_t n_blocks) {
  const uint32_t block_bytes = ggmlTypeTraits(type).type_size;
  // Float elements take one draw each: element e is draw e of the tensor's splitmix64 sequence. A
  // quantized block takes many draws, so its generator starts at a hashed (bijective) point instead.
  const bool one_draw = type == GgmlType::F32 || type == GgmlType::F16;
  for (uint64_t b = 0; b < n_blocks; ++b) {
    const uint64_t index = first_block + b;
    Rng rng{one_draw ? tensor_seed + index * kGamma : mix64(tensor_seed + index)};
    fillOneBlock(type, kind, rng, out + b * block_bytes);
  }
}

std::string wordPiece(uint64_t n) {  // bijective base 26: a..z, aa, ab, ...
  std::string s;
  ++n;
  while (n > 0) {
    --n;
    s.push_back(static_cast<char>('a' + n % 26));
    n /= 26;
  }
  std::reverse(s.begin(), s.end());
  return s;
}

}  // namespace

llvm::Expected<ModelShape> modelShape(llvm::StringRef name) {
  ModelShape s;
  s.name = name.str();
  if (name == "tiny-llama" || name == "tiny-qwen2") {
    s.n_embd = 256, s.n_layer = 2, s.n_head = 4, s.n_head_kv = 2, s.n_ff = 512, s.n_vocab = 512, s.n_ctx = 2048;
    if (name == "tiny-llama") {
      s.arch = "llama", s.rope_freq_base = 10000.0f, s.rms_eps = 1e-5f;
    } else {
      s.arch = "qwen2", s.rope_freq_base = 1e6f, s.rms_eps = 1e-6f, s.qkv_bias = true;
    }
    return s;
  }
  if (name == "qwen2-7b") {
    s.arch = "qwen2", s.n_embd = 3584, s.n_layer = 28, s.n_head = 28, s.n_head_kv = 4, s.n_ff = 18944;
    s.n_vocab = 152064, s.n_ctx = 32768, s.rope_freq_base = 1e6f, s.rms_eps = 1e-6f, s.qkv_bias = true;
    return s;
  }
  if (name == "llama3-8b") {
    s.arch = "llama", s.n_embd = 4096, s.n_layer = 32, s.n_head = 32, s.n_head_kv = 8, s.n_ff = 14336;
    s.n_vocab = 128256, s.n_ctx = 8192, s.rope_freq_base = 500000.0f, s.rms_eps = 1e-5f;
    return s;
  }
  if (name == "phi3-mini") {  // Phi-3-mini-4k-instruct's shapes (neox RoPE is the phi3 architecture's fact)
    s.arch = "phi3", s.n_embd = 3072, s.n_layer = 32, s.n_head = 32, s.n_head_kv = 32, s.n_ff = 8192;
    s.n_vocab = 32064, s.n_ctx = 4096, s.rope_freq_base = 10000.0f, s.rms_eps = 1e-5f, s.fused = true;
    return s;
  }
  if (name == "qwen3-30b-a3b") {  // Qwen3-30B-A3B: 128 experts of 768, 8 per token; q is 32 x 128 wide
    s.arch = "qwen3moe", s.n_embd = 2048, s.n_layer = 48, s.n_head = 32, s.n_head_kv = 4, s.head_dim = 128;
    s.n_ff = 6144, s.n_expert = 128, s.n_expert_used = 8, s.n_ff_exp = 768, s.qk_norm = true;
    s.n_vocab = 151936, s.n_ctx = 40960, s.rope_freq_base = 1e6f, s.rms_eps = 1e-6f;
    return s;
  }
  if (name == "gemma2-9b" || name == "gemma3-12b") {
    // Both: head_dim 256 (q is wider than n_embd), query_pre_attn_scalar 256 (no GGUF key: llama.cpp's
    // 1/sqrt(head_dim) for these sizes), RMSNorm eps 1e-6, tied output, sandwich norms, GELU-tanh FFN.
    s.head_dim = 256, s.rms_eps = 1e-6f, s.post_norms = true, s.tied_output = true;
    if (name == "gemma2-9b") {
      // google/gemma-2-9b config.json; keys as convert_hf_to_gguf.py's Gemma2Model writes them: no
      // rope.freq_base (llama.cpp: 10000 = rope_theta) and no sliding_window_pattern (gemma2: even
      // layers local, fixed in llama.cpp).
      s.arch = "gemma2", s.n_embd = 3584, s.n_layer = 42, s.n_head = 16, s.n_head_kv = 8, s.n_ff = 14336;
      s.n_vocab = 256000, s.n_ctx = 8192, s.rope_freq_base = 0.0f, s.sliding_window = 4096;
      s.attn_softcap = 50.0f, s.final_softcap = 30.0f;
    } else {
      // google/gemma-3-12b-it text_config; keys as Gemma3Model writes them: rope.freq_base 1e6 and linear
      // scaling x8 (global layers), no rope.freq_base_swa (llama.cpp: 10000 = rope_local_base_freq) and
      // no sliding_window_pattern (llama.cpp: period 6, 5 local then 1 global). No soft-caps.
      s.arch = "gemma3", s.n_embd = 3840, s.n_layer = 48, s.n_head = 16, s.n_head_kv = 8, s.n_ff = 15360;
      s.n_vocab = 262208, s.n_ctx = 131072, s.rope_freq_base = 1e6f, s.sliding_window = 1024;
      s.rope_scale_linear = 8.0f, s.qk_norm = true;
    }
    return s;
  }
  return synthError(llvm::formatv("unknown model '{0}' (known: {1})", name, llvm::join(modelNames(), ", ")));
}

std::vector<std::string> modelNames() {
  return {"tiny-llama", "tiny-qwen2", "qwen2-7b", "llama3-8b", "phi3-mini", "qwen3-30b-a3b", "gemma2-9b", "gemma3-12b"};
}

llvm::Expected<TypeMix> parseTypeMix(llvm::StringRef name) {
  const std::string n = name.lower();
  if (n == "f32") return TypeMix::kF32;
  if (n == "f16") return TypeMix::kF16;
  if (n == "q8_0") return TypeMix::kQ8_0;
  if (n == "q4_0") return TypeMix::kQ4_0;
  if (n == "q6_k") return TypeMix::kQ6_K;
  if (n == "q4_k_m") return TypeMix::kQ4_K_M;
  return synthError(llvm::formatv("unknown type mix '{0}' (known: f32, f16, q8_0, q4_0, q6_k, q4_k_m)", name));
}

const char* typeMixName(TypeMix mix) {
  switch (mix) {
    case TypeMix::kF32: return "f32";
    case TypeMix::kF16: return "f16";
    case TypeMix::kQ8_0: return "q8_0";
    case TypeMix::kQ4_0: return "q4_0";
    case TypeMix::kQ6_K: return "q6_k";
    case TypeMix::kQ4_K_M: return "q4_k_m";
  }
  return "?";
}

uint32_t fileType(TypeMix mix) {
  switch (mix) {
    case TypeMix::kF32: return 0;
    case TypeMix::kF16: return 1;
    case TypeMix::kQ4_0: return 2;
    case TypeMix::kQ8_0: return 7;
    case TypeMix::kQ4_K_M: return 15;
    case TypeMix::kQ6_K: return 18;
  }
  return 0;
}

bool q4kmMoreBits(uint32_t layer, uint32_t n_layer) {
  const uint32_t eighth = n_layer / 8;
  return layer < eighth || layer >= 7 * n_layer / 8 || (layer - eighth) % 3 == 2;
}

llvm::Expected<std::vector<TensorPlan>> planTensors(const ModelShape& shape, TypeMix mix) {
  if (shape.n_head == 0 || (shape.head_dim == 0 && shape.n_embd % shape.n_head != 0))
    return synthError(llvm::formatv("n_embd {0} is not a multiple of n_head {1}", shape.n_embd, shape.n_head));
  const uint64_t n_embd = shape.n_embd, kv_dim = uint64_t{shape.n_head_kv} * shape.headDim();
  const uint64_t q_dim = uint64_t{shape.n_head} * shape.headDim();
  const auto matrixType = [&](llvm::StringRef role, uint32_t layer) -> GgmlType {
    switch (mix) {
      case TypeMix::kF32: return GgmlType::F32;
      case TypeMix::kF16: return GgmlType::F16;
      case TypeMix::kQ8_0: return GgmlType::Q8_0;
      case TypeMix::kQ6_K: return GgmlType::Q6_K;
      case TypeMix::kQ4_0: return role == "output" ? GgmlType::Q6_K : GgmlType::Q4_0;
      case TypeMix::kQ4_K_M:
        if (role == "output") return GgmlType::Q6_K;
        if ((role == "attn_v" || role == "attn_qkv" || role == "ffn_down" || role == "ffn_down_exps") &&
            q4kmMoreBits(layer, shape.n_layer))
          return GgmlType::Q6_K;
        return GgmlType::Q4_K;
    }
    return GgmlType::F32;
  };
  std::vector<TensorPlan> plan;
  const auto matrix = [&](std::string name, llvm::StringRef role, uint32_t layer, uint64_t in, uint64_t out,
                          uint64_t experts = 0) {
    std::vector<uint64_t> ne{in, out};
    if (experts) ne.push_back(experts);
    plan.push_back({std::move(name), matrixType(role, layer), std::move(ne), TensorKind::kMatrix});
  };
  const auto vec = [&](std::string name, TensorKind kind, uint64_t n) {
    plan.push_back({std::move(name), GgmlType::F32, {n}, kind});
  };
  // A tied token_embd is the output head: llama-quantize gives it the output's type.
  matrix("token_embd.weight", shape.tied_output ? "output" : "token_embd", 0, n_embd, shape.n_vocab);
  for (uint32_t i = 0; i < shape.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    vec(p + "attn_norm.weight", TensorKind::kNorm, n_embd);
    if (shape.fused) {
      matrix(p + "attn_qkv.weight", "attn_qkv", i, n_embd, q_dim + 2 * kv_dim);
    } else {
      matrix(p + "attn_q.weight", "attn_q", i, n_embd, q_dim);
      matrix(p + "attn_k.weight", "attn_k", i, n_embd, kv_dim);
      matrix(p + "attn_v.weight", "attn_v", i, n_embd, kv_dim);
    }
    if (shape.qkv_bias) {
      vec(p + "attn_q.bias", TensorKind::kBias, n_embd);
      vec(p + "attn_k.bias", TensorKind::kBias, kv_dim);
      vec(p + "attn_v.bias", TensorKind::kBias, kv_dim);
    }
    if (shape.qk_norm) {
      vec(p + "attn_q_norm.weight", TensorKind::kNorm, shape.headDim());
      vec(p + "attn_k_norm.weight", TensorKind::kNorm, shape.headDim());
    }
    matrix(p + "attn_output.weight", "attn_output", i, q_dim, n_embd);
    if (shape.post_norms) vec(p + "post_attention_norm.weight", TensorKind::kNorm, n_embd);
    vec(p + "ffn_norm.weight", TensorKind::kNorm, n_embd);
    if (shape.n_expert) {
      plan.push_back({p + "ffn_gate_inp.weight", GgmlType::F32, {n_embd, shape.n_expert}, TensorKind::kMatrix});
      matrix(p + "ffn_gate_exps.weight", "ffn_gate_exps", i, n_embd, shape.n_ff_exp, shape.n_expert);
      matrix(p + "ffn_up_exps.weight", "ffn_up_exps", i, n_embd, shape.n_ff_exp, shape.n_expert);
      matrix(p + "ffn_down_exps.weight", "ffn_down_exps", i, shape.n_ff_exp, n_embd, shape.n_expert);
      continue;
    }
    if (!shape.fused) matrix(p + "ffn_gate.weight", "ffn_gate", i, n_embd, shape.n_ff);
    matrix(p + "ffn_up.weight", "ffn_up", i, n_embd, shape.fused ? 2 * uint64_t{shape.n_ff} : shape.n_ff);
    matrix(p + "ffn_down.weight", "ffn_down", i, shape.n_ff, n_embd);
    if (shape.post_norms) vec(p + "post_ffw_norm.weight", TensorKind::kNorm, n_embd);
  }
  vec("output_norm.weight", TensorKind::kNorm, n_embd);
  if (!shape.tied_output) matrix("output.weight", "output", 0, n_embd, shape.n_vocab);
  for (const TensorPlan& t : plan) {
    const GgmlTypeTraits traits = ggmlTypeTraits(t.type);
    if (t.ne[0] % traits.block_size != 0)
      return synthError(llvm::formatv("{0}: row length {1} is not a multiple of the {2} block size {3}", t.name,
                                      t.ne[0], traits.name, traits.block_size));
  }
  return plan;
}

uint64_t tensorSeed(uint64_t seed, llvm::StringRef name) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
  return mix64(mix64(seed) ^ mix64(h));
}

void fillBlocks(GgmlType type, TensorKind kind, uint64_t tensor_seed, uint64_t first_block,
                llvm::MutableArrayRef<uint8_t> out, unsigned threads) {
  const uint32_t block_bytes = ggmlTypeTraits(type).type_size;
  const uint64_t n_blocks = out.size() / block_bytes;
  constexpr uint64_t kMinBlocksPerThread = 4096;
  const uint64_t workers = std::max<uint64_t>(1, std::min<uint64_t>(threads, n_blocks / kMinBlocksPerThread));
  if (workers == 1) {
    fillRange(type, kind, tensor_seed, first_block, out.data(), n_blocks);
    return;
  }
  std::vector<std::thread> pool;
  const uint64_t per = (n_blocks + workers - 1) / workers;
  for (uint64_t w = 0; w < workers; ++w) {
    const uint64_t begin = w * per, end = std::min(n_blocks, begin + per);
    if (begin >= end) break;
    pool.emplace_back([=] {
      fillRange(type, kind, tensor_seed, first_block + begin, out.data() + begin * block_bytes, end - begin);
    });
  }
  for (std::thread& t : pool) t.join();
}

std::vector<std::string> builtinVocab(uint32_t n_vocab) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) tokens.push_back(llvm::formatv("<0x{0:X-2}>", b).str());
  for (uint64_t k = 0; tokens.size() < n_vocab; ++k)
    tokens.push_back((k % 2 == 0 ? "\xE2\x96\x81" : "") + wordPiece(k / 2));
  tokens.resize(n_vocab);
  return tokens;
}

llvm::Error buildSynthModel(const SynthOptions& options, gguf::GgufWriter& w, std::vector<std::string>* notes) {
  ModelShape shape = options.shape;
  std::vector<std::pair<std::string, gguf::MetaValue>> tokenizer;
  if (options.vocab) {
    auto tokens = options.vocab->getStringArray("tokenizer.ggml.tokens");
    if (!tokens) return tokens.takeError();
    for (const gguf::KeyValue& kv : options.vocab->metadata())
      if (llvm::StringRef(kv.key.data(), kv.key.size()).startswith("tokenizer."))
        tokenizer.emplace_back(std::string(kv.key), gguf::MetaValue::fromParsed(kv.value));
    if (tokens->size() != shape.n_vocab) {
      if (notes)
        notes->push_back(llvm::formatv("n_vocab {0} -> {1} to match the tokenizer of {2}", shape.n_vocab,
                                       tokens->size(), options.vocab->fileName()));
      shape.n_vocab = static_cast<uint32_t>(tokens->size());
    }
  } else {
    if (shape.n_vocab < 260)
      return synthError(llvm::formatv("n_vocab {0} is too small for the built-in vocabulary (>= 260)", shape.n_vocab));
    std::vector<std::string> tokens = builtinVocab(shape.n_vocab);
    std::vector<float> scores(tokens.size(), 0.0f);
    std::vector<int32_t> types(tokens.size(), 1);  // llama.cpp token types: 1 normal, 2 unknown, 3 control, 6 byte
    types[0] = 2, types[1] = 3, types[2] = 3;
    for (size_t i = 3; i < 259; ++i) types[i] = 6;
    for (size_t i = 259; i < tokens.size(); ++i) scores[i] = -static_cast<float>(i - 259);
    tokenizer.emplace_back("tokenizer.ggml.model", gguf::MetaValue::string("llama"));
    tokenizer.emplace_back("tokenizer.ggml.tokens", gguf::MetaValue::stringArray(std::move(tokens)));
    tokenizer.emplace_back("tokenizer.ggml.scores", gguf::MetaValue::f32Array(scores));
    tokenizer.emplace_back("tokenizer.ggml.token_type", gguf::MetaValue::i32Array(types));
    tokenizer.emplace_back("tokenizer.ggml.bos_token_id", gguf::MetaValue::u32(1));
    tokenizer.emplace_back("tokenizer.ggml.eos_token_id", gguf::MetaValue::u32(2));
    tokenizer.emplace_back("tokenizer.ggml.unknown_token_id", gguf::MetaValue::u32(0));
    tokenizer.emplace_back("tokenizer.ggml.add_bos_token", gguf::MetaValue::boolean(true));
    tokenizer.emplace_back("tokenizer.ggml.add_eos_token", gguf::MetaValue::boolean(false));
  }

  auto plan = planTensors(shape, options.mix);
  if (!plan) return plan.takeError();

  const std::string a = shape.arch + ".";
  w.setString("general.architecture", shape.arch);
  w.setString("general.name", "synthetic-" + shape.name);
  w.setU32(a + "context_length", shape.n_ctx);
  w.setU32(a + "embedding_length", shape.n_embd);
  w.setU32(a + "block_count", shape.n_layer);
  w.setU32(a + "feed_forward_length", shape.n_ff);
  w.setU32(a + "attention.head_count", shape.n_head);
  w.setU32(a + "attention.head_count_kv", shape.n_head_kv);
  if (shape.rope_freq_base > 0) w.setF32(a + "rope.freq_base", shape.rope_freq_base);
  w.setF32(a + "attention.layer_norm_rms_epsilon", shape.rms_eps);
  if (shape.rope_scale_linear > 0) {
    w.setString(a + "rope.scaling.type", "linear");
    w.setF32(a + "rope.scaling.factor", shape.rope_scale_linear);
  }
  if (shape.sliding_window) w.setU32(a + "attention.sliding_window", shape.sliding_window);
  if (shape.attn_softcap > 0) w.setF32(a + "attn_logit_softcapping", shape.attn_softcap);
  if (shape.final_softcap > 0) w.setF32(a + "final_logit_softcapping", shape.final_softcap);
  if (shape.head_dim) {
    w.setU32(a + "attention.key_length", shape.head_dim);
    w.setU32(a + "attention.value_length", shape.head_dim);
  }
  if (shape.n_expert) {
    w.setU32(a + "expert_count", shape.n_expert);
    w.setU32(a + "expert_used_count", shape.n_expert_used);
    w.setU32(a + "expert_feed_forward_length", shape.n_ff_exp);
  }
  w.setU32("general.file_type", fileType(options.mix));
  if (options.mix != TypeMix::kF32 && options.mix != TypeMix::kF16) w.setU32("general.quantization_version", 2);
  for (auto& [key, value] : tokenizer) w.set(key, std::move(value));

  for (const TensorPlan& t : *plan) {
    auto size = gguf::GgufWriter::tensorDataSize(t.type, t.ne);
    if (!size) return size.takeError();
    const uint64_t seed = tensorSeed(options.seed, t.name);
    const uint32_t block_bytes = ggmlTypeTraits(t.type).type_size;
    const GgmlType type = t.type;
    const TensorKind kind = t.kind;
    const unsigned threads = std::max(1u, options.threads);
    w.addTensor(t.name, t.type, t.ne, *size,
                [=](uint64_t offset, llvm::MutableArrayRef<uint8_t> out) -> llvm::Error {
                  fillBlocks(type, kind, seed, offset / block_bytes, out, threads);
                  return llvm::Error::success();
                });
  }
  return llvm::Error::success();
}

llvm::Error writeSynthModel(const SynthOptions& options, llvm::StringRef path, std::vector<std::string>* notes) {
  gguf::GgufWriter w;
  if (llvm::Error e = buildSynthModel(options, w, notes)) return e;
  return w.write(path);
}

}  // namespace minfer::synth
