// Hugging Face parity: zeroplan's op graphs are transformers' models. tests/data/hf_parity/
// holds, per tiny model and attention, what tools/hf_parity.py recorded from transformers
// (PyTorch, fp32; versions in reference.json): the config (dropout off), seeded random
// weights, the batch, transformers' loss and every parameter's gradient. Here zeroplan
// trains one step from the same weights on the same batch (stage 0, SGD at lr 2^16, so its
// gradient is (w0 - w1) / lr) and must give the same loss and gradients within 1e-5
// (relative, per tensor), eager and sdpa attention. The tool compares the same way on the GPU machine.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "exec/safetensors.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const fs::path kData = fs::path(ZEROPLAN_SHARED_DIR) / "tests" / "data" / "hf_parity";

double norm(const std::vector<double>& v) {
  double s = 0.0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

void check_case(const std::string& model, const std::string& attention) {
  const std::string name = model + "-" + attention;
  const fs::path d = kData / model;
  const json ref = json::parse(std::ifstream(d / "reference.json"));
  const fs::path tmp = fs::temp_directory_path() / ("zeroplan-hf-parity-" + name);
  fs::create_directories(tmp);
  const auto r = zp::test::run_shell(fmt::format(
      "{} train --model {} --ds-config {} --steps 1 --seq-len 16 --attention {} --quiet --init-weights {} "
      "--save-weights {} --save-batch {} --out {}",
      ZEROPLAN_BIN, (d / "config.json").string(), (d / "ds_config.json").string(), attention,
      (d / "weights.safetensors").string(), (tmp / "after.safetensors").string(), (tmp / "batch.json").string(),
      (tmp / "out.json").string()));
  INFO(name, "\n", r.out);
  REQUIRE(r.status == 0);
  // The batch transformers was given is the one zeroplan trains on.
  CHECK(json::parse(std::ifstream(tmp / "batch.json")) == json::parse(std::ifstream(d / "batch.json")));
  const double loss = json::parse(std::ifstream(tmp / "out.json"))["losses"][0].get<double>();
  const double hf_loss = ref["loss"][attention].get<double>();
  CHECK(std::abs(loss - hf_loss) <= 1e-5 * std::abs(hf_loss));

  const auto w0 = zp::exec::read_safetensors((d / "weights.safetensors").string());
  const auto w1 = zp::exec::read_safetensors((tmp / "after.safetensors").string());
  const auto hf = zp::exec::read_safetensors((d / fmt::format("grads.{}.safetensors", attention)).string());
  const double lr = ref["lr"].get<double>();
  REQUIRE(w1.size() == hf.size());
  double total = 0.0;
  for (const auto& [n, g] : hf)
    for (float x : g.values) total += static_cast<double>(x) * x;
  total = std::sqrt(total);
  double worst = 0.0;
  std::string worst_name;
  for (const auto& [n, g] : hf) {
    REQUIRE(w1.count(n) == 1);
    const auto& a = w0.at(n).values;
    const auto& b = w1.at(n).values;
    REQUIRE(b.size() == g.values.size());
    std::vector<double> diff(g.values.size()), ref_g(g.values.size());
    for (std::size_t i = 0; i < g.values.size(); ++i) {
      ref_g[i] = g.values[i];
      diff[i] = (static_cast<double>(a[i]) - static_cast<double>(b[i])) / lr - ref_g[i];
    }
    // A gradient zero in exact arithmetic (BERT's key biases) is noise on both sides: measured
    // against the whole gradient's norm, as tools/hf_parity.py does.
    const double scale = norm(ref_g) < 1e-6 * total ? total : norm(ref_g);
    const double e = norm(diff) / scale;
    if (e > worst) {
      worst = e;
      worst_name = n;
    }
  }
  MESSAGE(name, ": loss ", loss, " (transformers ", hf_loss, "), worst gradient error ", worst, " (", worst_name, ") over ",
          hf.size(), " tensors");
  CHECK(worst <= 1e-5);
}

}  // namespace

TEST_CASE("Hugging Face parity, fp32: loss and every parameter gradient of one step equal transformers'") {
  for (const char* m : {"tiny-gpt2", "tiny-llama", "tiny-bert"})
    for (const char* a : {"eager", "sdpa"}) check_case(m, a);
}

TEST_CASE("--init-weights refuses a file without the model's parameters, or with other shapes") {
  const std::string w = (kData / "tiny-gpt2" / "weights.safetensors").string();
  auto r = zp::test::run_shell(fmt::format("{} train --model tiny-llama --steps 1 --init-weights {}", ZEROPLAN_BIN, w));
  CHECK(r.status == 2);
  CHECK(r.out.find("model.embed_tokens.weight: --init-weights: the model's parameter is not in the file") != std::string::npos);
  // tiny-gpt2 with a longer context: wpe has another shape.
  const fs::path cfg = fs::temp_directory_path() / "zeroplan-hf-parity-wpe.json";
  json c = json::parse(std::ifstream(kData / "tiny-gpt2" / "config.json"));
  c["n_positions"] = 128;
  std::ofstream(cfg) << c.dump();
  r = zp::test::run_shell(fmt::format("{} train --model {} --steps 1 --seq-len 16 --init-weights {}", ZEROPLAN_BIN, cfg.string(), w));
  CHECK(r.status == 2);
  CHECK(r.out.find("transformer.wpe.weight: --init-weights: shape [64, 64] in the file, the model's is [128, 64]") != std::string::npos);
  const fs::path bad = fs::temp_directory_path() / "zeroplan-hf-parity-bad.safetensors";
  std::ofstream(bad) << "not a safetensors file at all";
  r = zp::test::run_shell(fmt::format("{} train --model tiny-gpt2 --steps 1 --init-weights {}", ZEROPLAN_BIN, bad.string()));
  CHECK(r.status == 2);
  CHECK(r.out.find("not a safetensors file") != std::string::npos);
}

TEST_CASE("--save-weights and --save-batch: an unwritable place or an input is refused before training") {
  const std::string w = (kData / "tiny-gpt2" / "weights.safetensors").string();
  auto r = zp::test::run_shell(fmt::format("{} train --model tiny-gpt2 --steps 1 --save-weights /", ZEROPLAN_BIN));
  CHECK(r.status == 2);
  CHECK(r.out.find("--save-weights") != std::string::npos);
  r = zp::test::run_shell(fmt::format("{} train --model tiny-gpt2 --steps 1 --save-batch /nonexistent-dir/b.json", ZEROPLAN_BIN));
  CHECK(r.status == 2);
  CHECK(r.out.find("--save-batch") != std::string::npos);
  // The same file as input and output (a copy: the recorded data must stay as it is).
  const fs::path copy = fs::temp_directory_path() / "zeroplan-hf-parity-same.safetensors";
  fs::copy_file(w, copy, fs::copy_options::overwrite_existing);
  r = zp::test::run_shell(fmt::format("{} train --model tiny-gpt2 --steps 1 --init-weights {} --save-weights {}", ZEROPLAN_BIN,
                                      copy.string(), copy.string()));
  CHECK(r.status == 2);
  CHECK(r.out.find("--init-weights") != std::string::npos);
  r = zp::test::run_shell(fmt::format("{} train --model tiny-gpt2 --steps 1 --init-weights /nonexistent.safetensors", ZEROPLAN_BIN));
  CHECK(r.status == 2);
  CHECK(r.out.find("cannot read the weights file") != std::string::npos);
}
