// Subcommands of the `fern` binary register themselves here, one file per command (src/cli/cmd_<name>.cpp):
//   static fern::cli::Command reg("synth", "Write a synthetic checkpoint", [](CLI::App& app) { ...; return run; });
// The setup function adds the command's options to `app` and returns the function that runs it (returning the
// process exit code). Errors thrown as fern::Error are printed as "error: <message>" with exit code 1.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace fern::cli {

using RunFn = std::function<int()>;
using SetupFn = std::function<RunFn(CLI::App&)>;

struct Command {
  Command(std::string name, std::string description, SetupFn setup);
};

}  // namespace fern::cli
