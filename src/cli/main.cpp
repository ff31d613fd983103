// fern: one binary, several subcommands (see command.h).
#include <cstdio>
#include <memory>
#include <vector>

#include "cli/command.h"
#include "core/error.h"

namespace fern::cli {
namespace {

struct Entry {
  std::string name, description;
  SetupFn setup;
};

std::vector<Entry>& registry() {
  static std::vector<Entry> r;
  return r;
}

}  // namespace

Command::Command(std::string name, std::string description, SetupFn setup) {
  registry().push_back({std::move(name), std::move(description), std::move(setup)});
}

}  // namespace fern::cli

int main(int argc, char** argv) {
  using namespace fern::cli;
  CLI::App app{"fern: an inference engine for Qwen3.5/3.6-35B-A3B"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("fern 0.1.0"));
  std::vector<std::pair<CLI::App*, RunFn>> runs;
  for (auto& e : registry()) {
    CLI::App* sub = app.add_subcommand(e.name, e.description);
    runs.emplace_back(sub, e.setup(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : runs)
      if (sub->parsed()) return run();
  } catch (const fern::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
