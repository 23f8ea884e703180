// A full fine-tune of a GGUF base saved as a Hugging Face directory (models/hf_export.hpp,
// save_full_model): small random GGUF models with byte-level and SentencePiece vocabularies, their
// fully fine-tuned state (the starting state moved at random, as training would) saved and opened
// again: the same config, a tokenizer that encodes and decodes like the GGUF's own, and a forward
// pass that gives the trained state's loss and, in ref_llm.py (PyTorch, reading the directory
// itself), the same logits; Hugging Face's tokenizer code for JavaScript (tokenizers.js, from npm)
// reads the tokenizer and gives the same ids and texts. Then what cannot be written exactly is
// refused, naming it.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpu/executor.hpp"
#include "graph/simplify.hpp"
#include "model_writer.hpp"
#include "models/chat_template.hpp"
#include "models/checkpoint_tokenizer.hpp"
#include "models/finetune.hpp"
#include "models/hf_export.hpp"
#include "models/peft.hpp"
#include "models/session.hpp"
#include "models/tokenizer.hpp"
#include "models/tokenizer_json.hpp"
#include "python_torch.hpp"
#include "npm_package.hpp"
#include "run_command.hpp"

using namespace mesh;
using namespace mesh::models;
using namespace mesh::models::test;
using json = nlohmann::json;

namespace {

constexpr int64_t batch = 2, sequence = 12;

std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

/// A real chat template (Mistral's: BOS, [INST] ... [/INST], EOS) from chat_templates.json.
std::string mistral_template() {
  return json::parse(read_text(std::filesystem::path(MESH_MODELS_TEST_DIR) / "chat_templates.json"))["mistral"]["chat_template"];
}

/// Texts that reach every path of both tokenizers: spaces of every kind, digits, punctuation,
/// unicode (byte fallback), special and user-defined tokens written in the text, and runs of the
/// vocabulary's own pieces (so that merges compete). All valid UTF-8.
std::vector<std::string> texts_for(const tokenizer& t) {
  std::vector<std::string> out = {"",
                                  "Hello world",
                                  "hello  world   three",
                                  " leading space",
                                  "trailing space ",
                                  "tabs\tand\nnew\n\nlines\r\n end",
                                  "digits 1234567 and 3.14159, 42!",
                                  "don't I'll we've THEY'RE",
                                  "unicode: h\xc3\xa9llo w\xc3\xb6rld \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x99\x82",
                                  "<s>special</s> in the text<s>",
                                  "a <|tool|> call",
                                  "abcdefghijklmnopqrstuvwxyz the quick brown fox jumps over the lazy dog"};
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> id(0, t.vocab().size() - 1);
  for (int k = 0; k < 20; ++k) {
    std::string s;
    for (int j = 0; j < 12; ++j) {
      const int32_t i = id(rng);
      const token_type ty = t.vocab().type_of(i);
      // Only pieces that are whole UTF-8 text: the texts go to Python as JSON too.
      if (ty != token_type::normal || !utf8::valid(t.piece(i))) continue;
      s += t.piece(i);
      if (j % 3 == 2) s += ' ';
    }
    out.push_back(s);
  }
  return out;
}

/// The loss of the training graph with `state`, on the CPU executor.
double graph_loss(const finetune_model& m, const tensor_map& state, const std::vector<int32_t>& tokens,
                  const std::vector<int32_t>& targets, const std::vector<float>& mask) {
  auto ex = gpu::make_cpu_executor(2);
  REQUIRE(ex->set_parameters(state));
  auto id = ex->load(simplify(m.g));
  INFO((id ? "" : id.error().message));
  REQUIRE(id);
  tensor_map in{{"tokens", tensor::from_ints({batch, sequence}, tokens)},
                {"targets", tensor::from_ints({batch, sequence}, targets)},
                {"mask", tensor::from_floats({batch, sequence}, mask)}};
  auto out = ex->run(*id, in);
  INFO((out ? "" : out.error().message));
  REQUIRE(out);
  return out->at("loss").at(0);
}

void check_same_config(const model_config& a, const model_config& b) {
  CHECK(to_string(a.arch) == std::string(to_string(b.arch)));
  CHECK(a.vocab_size == b.vocab_size);
  CHECK(a.hidden_size == b.hidden_size);
  CHECK(a.n_layers == b.n_layers);
  CHECK(a.n_heads == b.n_heads);
  CHECK(a.n_kv_heads == b.n_kv_heads);
  CHECK(a.head_dim == b.head_dim);
  CHECK(a.ffn_size == b.ffn_size);
  CHECK(a.max_context == b.max_context);
  CHECK(a.sliding_window == b.sliding_window);
  CHECK(a.norm_eps == b.norm_eps);
  CHECK(a.rope_theta == b.rope_theta);
  CHECK(a.rope_dims == b.rope_dims);
  CHECK(a.scaling.type == b.scaling.type);
  CHECK(a.scaling.factor == b.scaling.factor);
  CHECK(a.qkv_bias == b.qkv_bias);
  CHECK(a.qk_norm == b.qk_norm);
  CHECK(a.tied_embeddings == b.tied_embeddings);
  CHECK(a.bos_token_id == b.bos_token_id);
  CHECK(a.eos_token_ids == b.eos_token_ids);
}

/// Encodes and decodes `texts` with both tokenizers in every mode; they must agree.
void check_same_tokenizer(const tokenizer& want, const tokenizer& got, const std::vector<std::string>& texts) {
  const std::vector<encode_options> modes = {{}, {.add_special = false, .parse_special = false},
                                             {.add_special = true, .parse_special = true, .space_prefix = false}};
  for (const auto& text : texts)
    for (const auto& mode : modes) {
      INFO("text " << json(text).dump() << ", add_special " << mode.add_special << ", parse_special " << mode.parse_special
                   << ", space_prefix " << mode.space_prefix);
      auto a = want.encode(text, mode), b = got.encode(text, mode);
      REQUIRE(a);
      REQUIRE(b);
      CHECK(*a == *b);
      for (const bool skip : {true, false}) {
        auto da = want.decode(*a, {.skip_special = skip}), db = got.decode(*a, {.skip_special = skip});
        REQUIRE(da);
        REQUIRE(db);
        CHECK(*da == *db);
      }
    }
}

/// Hugging Face's own tokenizer code for JavaScript (the npm package @huggingface/tokenizers,
/// which transformers.js runs) reading the saved tokenizer.json and tokenizer_config.json.
const char* tokenizers_js_script = R"JS(
const { Tokenizer } = require('@huggingface/tokenizers');
const fs = require('fs');
const [dir, input, output] = process.argv.slice(2);
const read = (f) => JSON.parse(fs.readFileSync(f, 'utf8'));
const tok = new Tokenizer(read(dir + '/tokenizer.json'), read(dir + '/tokenizer_config.json'));
const job = read(input);
fs.writeFileSync(output, JSON.stringify({
  with_special: job.texts.map((t) => tok.encode(t).ids),
  plain: job.texts.map((t) => tok.encode(t, { add_special_tokens: false }).ids),
  decoded: job.ids.map((ids) => (ids.length ? tok.decode(ids, { skip_special_tokens: true }) : '')),
}));
)JS";

/// The saved tokenizer through tokenizers.js: each text's ids with BOS/EOS as the file says and
/// without, and the texts its ids decode to with special tokens skipped, equal meshnode's (which
/// equal the GGUF's, checked above). (Kept special tokens decode differently by design: Hugging
/// Face's Llama decoder strips the space of the first piece only when it starts the text, so
/// "<s>" is followed by " Hello" there and by "Hello" in llama.cpp's and meshnode's.) Only a
/// registry that cannot be reached leaves it out (a warning says so).
void check_with_tokenizers_js(const std::filesystem::path& dir, const tokenizer& t, const std::vector<std::string>& texts) {
  auto package = mesh::test::npm_package(MESH_MODELS_NPM_DIR, "@huggingface/tokenizers", "0.2");
  if (package.unreachable) {
    WARN("the npm registry cannot be reached: the saved tokenizer was not read by tokenizers.js\n" << package.error);
    return;
  }
  INFO(package.error);
  REQUIRE(!package.node_modules.empty());
  std::vector<std::vector<int32_t>> with_special, plain;
  for (const auto& text : texts) {
    auto a = t.encode(text), b = t.encode(text, {.add_special = false});
    REQUIRE(a);
    REQUIRE(b);
    with_special.push_back(*a);
    plain.push_back(*b);
  }
  write_file(dir / "tokenizers_js.cjs", std::string(tokenizers_js_script));
  write_file(dir / "texts.json", json({{"texts", texts}, {"ids", with_special}}).dump());
  const auto run = mesh::test::run_command("NODE_PATH='" + package.node_modules.string() + "' node '" + (dir / "tokenizers_js.cjs").string() +
                                           "' '" + dir.string() + "' '" + (dir / "texts.json").string() + "' '" +
                                           (dir / "tokenizers_js.json").string() + "'");
  INFO(run.output);
  REQUIRE(run.status == 0);
  const json got = json::parse(read_text(dir / "tokenizers_js.json"));
  REQUIRE(got["with_special"].size() == texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    INFO("text " << json(texts[i]).dump());
    CHECK(got["with_special"][i].get<std::vector<int32_t>>() == with_special[i]);
    CHECK(got["plain"][i].get<std::vector<int32_t>>() == plain[i]);
    auto decoded = t.decode(with_special[i], {.skip_special = true});
    REQUIRE(decoded);
    CHECK(got["decoded"][i].get<std::string>() == *decoded);
  }
}

struct export_case {
  std::string label;
  model_spec spec;
  tensor_type type;
};

}  // namespace

TEST_CASE("a full fine-tune of a GGUF base saves as a Hugging Face directory with its config, tokenizer and weights",
          "[finetune][hf_export]") {
  std::vector<export_case> cases;
  {
    export_case c{"llama, byte-level BPE (GPT-2's pre-tokenizer), F32", {}, tensor_type::f32};
    c.spec.chat_template = mistral_template();
    cases.push_back(c);
  }
  {
    export_case c{"qwen2 with a tied head, byte-level BPE (Qwen2's pre-tokenizer), F16", {}, tensor_type::f16};
    c.spec.arch = architecture::qwen2;
    c.spec.tied = true;
    c.spec.pre_tokenizer = "qwen2";
    c.spec.seed = 2;
    cases.push_back(c);
  }
  {
    export_case c{"gpt2 (LayerNorm, learned positions, Conv1D weights transposed from GGUF's), F16", {}, tensor_type::f16};
    c.spec.arch = architecture::gpt2;
    c.spec.kv_heads = c.spec.heads;
    c.spec.seed = 4;
    cases.push_back(c);
  }
  {
    export_case c{"llama, SentencePiece vocabulary, Q8_0", {}, tensor_type::q8_0};
    c.spec.sentencepiece = true;
    c.spec.vocab = 420;
    c.spec.seed = 3;
    c.spec.chat_template = mistral_template();
    cases.push_back(c);
  }
  std::string why;
  const std::string torch_python = mesh::test::python_with_torch(why);
  temp_dir dir;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const auto& c = cases[ci];
    INFO(c.label);
    const auto gguf_path = dir / ("base" + std::to_string(ci) + ".gguf");
    write_gguf_model(gguf_path, c.spec, c.type);
    auto base = models::checkpoint::open(gguf_path);
    REQUIRE(base);
    auto base_config = read_model_config(*base);
    REQUIRE(base_config);
    auto base_tok = load_tokenizer(*base, *base_config);
    INFO((base_tok ? "" : base_tok.error().message));
    REQUIRE(base_tok);
    REQUIRE(check_hf_export(*base_config, *base_tok));

    finetune_options o;
    o.batch = batch;
    o.sequence = sequence;
    auto m = build_finetune_model(*base_config, *base, o);
    REQUIRE(m);
    // "Trained": every parameter moved at random.
    tensor_map trained = m->state;
    std::mt19937 rng(17 + static_cast<uint32_t>(ci));
    std::normal_distribution<double> nd(0, 0.02);
    for (auto& [name, t] : trained) {
      auto v = t.to_floats();
      for (auto& x : v) x += static_cast<float>(nd(rng));
      t = tensor::from_floats(t.dims, v);
    }
    const auto out = dir / ("ft" + std::to_string(ci));
    auto saved = save_full_model(out, *m, trained, *base);
    INFO((saved ? "" : saved.error().message));
    REQUIRE(saved);

    // The config.
    auto ckpt = models::checkpoint::open(out);
    REQUIRE(ckpt);
    CHECK(ckpt->format() == checkpoint_format::hf_directory);
    auto config = read_model_config(*ckpt);
    INFO((config ? "" : config.error().message));
    REQUIRE(config);
    check_same_config(*base_config, *config);
    // The rows are in Hugging Face's order (GPT-2 has no rotary embeddings).
    CHECK(config->rope == (c.spec.arch == architecture::gpt2 ? rope_style::none : rope_style::neox));
    CHECK(json::parse(read_text(out / "config.json"))["torch_dtype"] == "float32");

    // The tokenizer.
    auto tok = load_tokenizer(*ckpt, *config);
    INFO((tok ? "" : tok.error().message));
    REQUIRE(tok);
    CHECK(tok->chat_template == base_tok->chat_template);
    CHECK(tok->vocab.model == base_tok->vocab.model);
    CHECK(tok->vocab.tokens == base_tok->vocab.tokens);
    auto want = tokenizer::create(base_tok->vocab), got = tokenizer::create(tok->vocab);
    REQUIRE(want);
    REQUIRE(got);
    auto texts = texts_for(*want);
    if (base_tok->chat_template) {
      const chat_tokens specials = chat_tokens_of(*want);
      auto a = detect_chat_template(*base_tok->chat_template, specials), b = detect_chat_template(*tok->chat_template, specials);
      REQUIRE(a);
      REQUIRE(b);
      const std::vector<chat_message> chat = {{"user", "What is 2 + 2?"}, {"assistant", "It is 4."}, {"user", "And h\xc3\xa9 ?"}};
      auto ra = a->render(chat, true), rb = b->render(chat, true);
      REQUIRE(ra);
      REQUIRE(rb);
      CHECK(*ra == *rb);
      texts.push_back(*ra);
    }
    check_same_tokenizer(*want, *got, texts);

    // The weights: the saved directory's forward pass gives the trained state's loss.
    std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(c.spec.vocab - 1));
    std::vector<int32_t> tokens, targets;
    std::vector<float> mask;
    for (int64_t i = 0; i < batch * sequence; ++i) {
      tokens.push_back(any(rng));
      targets.push_back(any(rng));
      mask.push_back(i % 5 == 1 ? 0.0f : 1.0f);
    }
    const double want_loss = graph_loss(*m, trained, tokens, targets, mask);
    const double base_loss = graph_loss(*m, m->state, tokens, targets, mask);
    auto ex = gpu::make_cpu_executor(2);
    double sum = 0, count = 0;
    std::vector<float> first_row_logits;
    const auto V = static_cast<size_t>(c.spec.vocab);
    for (int64_t r = 0; r < batch; ++r) {
      const std::vector<int32_t> row(tokens.begin() + r * sequence, tokens.begin() + (r + 1) * sequence);
      auto s = session::create(*ex, *ckpt, {});  // each row from position 0
      INFO((s ? "" : s.error().message));
      REQUIRE(s);
      auto logits = s->prefill_all_logits(row);
      REQUIRE(logits);
      REQUIRE(logits->size() == static_cast<size_t>(sequence) * V);
      if (r == 0) first_row_logits = *logits;
      for (int64_t t = 0; t < sequence; ++t) {
        const size_t k = static_cast<size_t>(r * sequence + t);
        if (mask[k] == 0) continue;
        const float* l = logits->data() + static_cast<size_t>(t) * V;
        double top = l[0], z = 0;
        for (size_t j = 0; j < V; ++j) top = std::max(top, static_cast<double>(l[j]));
        for (size_t j = 0; j < V; ++j) z += std::exp(l[j] - top);
        sum += top + std::log(z) - l[static_cast<size_t>(targets[k])];
        count += 1;
      }
    }
    const double loss = sum / count;
    WARN(c.label << ": the saved directory's loss " << loss << ", the trained state's " << want_loss << " (the base's "
                 << base_loss << ")");
    CHECK(std::abs(loss - want_loss) <= 1e-5 * std::abs(want_loss));
    CHECK(std::abs(base_loss - want_loss) > 1e-3);  // the state trained away from the base

    // An independent reader of Hugging Face directories: ref_llm.py's logits.
    const std::vector<int32_t> row0(tokens.begin(), tokens.begin() + sequence);
    if (torch_python.empty()) {
      WARN(why);
    } else {
      write_file(out / "job.json", json::array({{{"model", out.string()}, {"tokens", row0}, {"generate", 0},
                                                 {"out", (out / "ref.json").string()}}})
                                       .dump());
      const auto run = mesh::test::run_command(torch_python + " " MESH_MODELS_TEST_DIR "/ref_llm.py " + (out / "job.json").string());
      INFO(run.output);
      REQUIRE(run.status == 0);
      const auto ref = json::parse(read_text(out / "ref.json"))["logits"].get<std::vector<std::vector<double>>>();
      REQUIRE(ref.size() * V == first_row_logits.size());
      double worst = 0, scale = 1;
      for (size_t r = 0; r < ref.size(); ++r)
        for (size_t j = 0; j < V; ++j) {
          worst = std::max(worst, std::abs(first_row_logits[r * V + j] - ref[r][j]));
          scale = std::max(scale, std::abs(ref[r][j]));
        }
      CHECK(worst / scale <= 1e-4);
    }
    check_with_tokenizers_js(out, *got, texts);
  }
}

TEST_CASE("config.json is written for each architecture and reads back the same", "[finetune][hf_export]") {
  temp_dir dir;
  for (const auto arch : {architecture::llama, architecture::qwen2, architecture::qwen3, architecture::gpt2}) {
    model_spec s;
    s.arch = arch;
    s.tied = arch == architecture::qwen3;
    if (arch == architecture::gpt2) s.kv_heads = s.heads;
    write_gguf_model(dir / "m.gguf", s, tensor_type::f32);
    auto ckpt = models::checkpoint::open(dir / "m.gguf");
    REQUIRE(ckpt);
    auto c = read_model_config(*ckpt);
    REQUIRE(c);
    auto text = config_json_of(*c);
    REQUIRE(text);
    auto back = parse_hf_config(*text, "config.json");
    INFO(*text);
    REQUIRE(back);
    check_same_config(*c, *back);
  }
  // A Llama with a sliding window (Mistral's GGUF files say "llama") is written as Mistral, with
  // linear rope scaling and several EOS tokens.
  model_config c;
  c.vocab_size = 100, c.hidden_size = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16, c.ffn_size = 128;
  c.max_context = 4096, c.sliding_window = 1024, c.rope = rope_style::normal, c.rope_dims = 16, c.norm_eps = 1e-6;
  c.rope_theta = 1e6, c.scaling = {rope_scaling::kind::linear, 4.0, 1, 1, 0}, c.bos_token_id = 1, c.eos_token_ids = {2, 7};
  auto text = config_json_of(c);
  REQUIRE(text);
  const json j = json::parse(*text);
  CHECK(j["architectures"][0] == "MistralForCausalLM");
  auto back = parse_hf_config(*text, "config.json");
  REQUIRE(back);
  CHECK(back->arch == architecture::mistral);
  c.arch = architecture::mistral;
  check_same_config(c, *back);
}

TEST_CASE("tokenizer.json of a GGUF vocabulary reads back into an equal tokenizer", "[finetune][hf_export]") {
  // Each byte-level pre-tokenizer meshnode knows by its GGUF name, BOS added or not.
  for (const std::string pre : {"gpt2", "llama-bpe", "qwen2", "smollm"})
    for (const bool add_bos : {false, true}) {
      INFO(pre << ", add_bos " << add_bos);
      gguf_writer w;
      add_gguf_vocabulary(w, 300, pre);
      w.add_bool("tokenizer.ggml.add_bos_token", add_bos);
      const bytes file = w.build();
      auto g = gguf_view::parse(file, "t.gguf");
      REQUIRE(g);
      auto t = read_gguf_tokenizer(*g);
      REQUIRE(t);
      auto files = tokenizer_json_of(t->vocab, std::nullopt, 128);
      INFO((files ? "" : files.error().message));
      REQUIRE(files);
      auto back = parse_hf_tokenizer(files->tokenizer_json, files->tokenizer_config_json);
      REQUIRE(back);
      CHECK(back->vocab.ignore_merges == (pre == "llama-bpe"));
      auto a = tokenizer::create(t->vocab), b = tokenizer::create(back->vocab);
      REQUIRE(a);
      REQUIRE(b);
      check_same_tokenizer(*a, *b, texts_for(*a));
    }
  // Unused padding at the end (llama.cpp's converter pads to the embedding's rows) is left out.
  vocabulary v;
  v.model = vocabulary::kind::byte_bpe;
  v.pre_tokenizer = "gpt2";
  const auto& bytes_map = utf8::gpt2_bytes();
  for (int i = 0; i < 256; ++i) v.tokens.push_back(bytes_map.to_text[static_cast<size_t>(i)]);
  v.tokens.insert(v.tokens.end(), {"<|endoftext|>", "[PAD257]", "[PAD258]"});
  v.token_types.assign(v.tokens.size(), 1);
  v.token_types[256] = 3;
  v.token_types[257] = v.token_types[258] = 5;
  v.eos_id = 256;
  auto files = tokenizer_json_of(v, std::nullopt);
  REQUIRE(files);
  auto back = parse_hf_tokenizer(files->tokenizer_json, files->tokenizer_config_json);
  REQUIRE(back);
  CHECK(back->vocab.size() == 257);
  CHECK(back->vocab.eos_id == 256);
}

TEST_CASE("what a Hugging Face directory cannot hold exactly is refused, naming it", "[finetune][hf_export]") {
  temp_dir dir;
  SECTION("Llama 3 rope scaling given only as rope_freqs.weight: refused before training, and by save_full_model") {
    model_spec s;
    s.llama3_scaling = true;
    write_gguf_model(dir / "l3.gguf", s, tensor_type::f32);
    auto ckpt = models::checkpoint::open(dir / "l3.gguf");
    REQUIRE(ckpt);
    auto c = read_model_config(*ckpt);
    REQUIRE(c);
    auto t = load_tokenizer(*ckpt, *c);
    REQUIRE(t);
    auto r = check_hf_export(*c, *t);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == error_code::unsupported);
    CHECK_THAT(r.error().message, Catch::Contains("rope_freqs.weight") && Catch::Contains("low_freq_factor"));
    finetune_options o;
    o.sequence = 8;
    auto m = build_finetune_model(*c, *ckpt, o);
    REQUIRE(m);
    auto saved = save_full_model(dir / "out", *m, m->state, *ckpt);
    REQUIRE_FALSE(saved);
    CHECK_THAT(saved.error().message, Catch::Contains("rope_freqs.weight"));
    CHECK_FALSE(std::filesystem::exists(dir / "out" / "model.safetensors"));
  }
  SECTION("configs") {
    model_config c;
    c.vocab_size = 100, c.hidden_size = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16;
    c.ffn_size = 128, c.max_context = 128, c.rope = rope_style::neox, c.rope_dims = 16;
    REQUIRE(config_json_of(c));
    const std::vector<std::pair<std::function<void(model_config&)>, std::string>> refused = {
        {[](model_config& x) { x.arch = architecture::gpt2, x.layer_norm = true, x.rope = rope_style::none, x.qkv_bias = true; },
         "GPT-2 with grouped key/value heads"},
        {[](model_config& x) { x.layer_norm = true; }, "llama with LayerNorm or without rotary embeddings"},
        {[](model_config& x) { x.rope_dims = 8; }, "partial rotary embeddings (rope over 8 of the head's 16 dimensions)"},
        {[](model_config& x) { x.qkv_bias = true; }, "q/k/v biases on llama"},
        {[](model_config& x) { x.arch = architecture::qwen2; }, "Qwen2 without q/k/v biases"},
    };
    for (const auto& [change, reason] : refused) {
      model_config x = c;
      change(x);
      auto r = config_json_of(x);
      REQUIRE_FALSE(r);
      CHECK_THAT(r.error().message, Catch::StartsWith("config.json cannot hold ") && Catch::Contains(reason));
    }
  }
  SECTION("vocabularies") {
    gguf_writer w;
    add_gguf_sentencepiece_vocabulary(w, 330);
    const bytes file = w.build();
    auto g = gguf_view::parse(file, "t.gguf");
    REQUIRE(g);
    auto t = read_gguf_tokenizer(*g);
    REQUIRE(t);
    REQUIRE(tokenizer_json_of(t->vocab, std::nullopt));
    const int32_t last = t->vocab.size() - 1, before = last - 1;
    const auto refused = [&](const vocabulary& v, const std::string& reason) {
      auto r = tokenizer_json_of(v, std::nullopt);
      REQUIRE_FALSE(r);
      CHECK(r.error().code == error_code::unsupported);
      CHECK_THAT(r.error().message, Catch::Contains(reason));
    };
    vocabulary v = t->vocab;
    v.scores[static_cast<size_t>(last)] = v.scores[static_cast<size_t>(before)];
    refused(v, fmt::format("tokens {} {} and {} {}, which have the same score", before,
                           printable_token(v.tokens[static_cast<size_t>(before)]), last,
                           printable_token(v.tokens[static_cast<size_t>(last)])));
    v = t->vocab;
    v.token_types[5] = 5;
    refused(v, "token 5 \"<0x02>\", an unused token");
    v = t->vocab;
    v.token_types[9] = 1;
    refused(v, "token 9 \"<0x06>\", a token written like a byte-fallback token");
    v = t->vocab;
    v.token_types[0] = 1;
    refused(v, "token 0 \"<unk>\", the unknown token, which is not of the unknown-token type");
  }
}
