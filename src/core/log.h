// Logging to stderr through spdlog. Levels: debug, info, warn, error. FERN_LOG_LEVEL=debug|info|warn|error.
#pragma once
#include <fmt/format.h>

#include <string>

namespace fern::log {

enum class Level { Debug, Info, Warn, Error };
void write(Level level, const std::string& msg);
void set_level(Level level);

template <typename... A> void debug(fmt::format_string<A...> f, A&&... a) { write(Level::Debug, fmt::format(f, std::forward<A>(a)...)); }
template <typename... A> void info(fmt::format_string<A...> f, A&&... a) { write(Level::Info, fmt::format(f, std::forward<A>(a)...)); }
template <typename... A> void warn(fmt::format_string<A...> f, A&&... a) { write(Level::Warn, fmt::format(f, std::forward<A>(a)...)); }
template <typename... A> void error(fmt::format_string<A...> f, A&&... a) { write(Level::Error, fmt::format(f, std::forward<A>(a)...)); }

}  // namespace fern::log
