#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstring>

namespace fern::log {
namespace {

std::shared_ptr<spdlog::logger> make_logger() {
  auto l = spdlog::stderr_color_mt("fern");
  l->set_pattern("%^[%H:%M:%S.%e %l]%$ %v");
  const char* env = std::getenv("FERN_LOG_LEVEL");
  spdlog::level::level_enum lvl = spdlog::level::info;
  if (env) {
    if (!std::strcmp(env, "debug")) lvl = spdlog::level::debug;
    else if (!std::strcmp(env, "warn")) lvl = spdlog::level::warn;
    else if (!std::strcmp(env, "error")) lvl = spdlog::level::err;
  }
  l->set_level(lvl);
  return l;
}

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> l = make_logger();
  return *l;
}

}  // namespace

void write(Level level, const std::string& msg) {
  switch (level) {
    case Level::Debug: logger().debug(msg); break;
    case Level::Info: logger().info(msg); break;
    case Level::Warn: logger().warn(msg); break;
    case Level::Error: logger().error(msg); break;
  }
}

void set_level(Level level) {
  static const spdlog::level::level_enum map[] = {spdlog::level::debug, spdlog::level::info, spdlog::level::warn,
                                                  spdlog::level::err};
  logger().set_level(map[static_cast<int>(level)]);
}

}  // namespace fern::log
