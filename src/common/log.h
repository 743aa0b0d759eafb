#pragma once

#include <string>
#include <utility>
#include <vector>

// moatd's log on stderr (docs/INSTALL.md, "Logs"): a line per message, as
// text ("moatd: ...", as always) or as JSON ({"time", "level", "msg", ...}:
// --log-format json), those below the level left out (--log-level).
// Configured once at the start, before any thread; every line is written
// whole in one call (lines of two threads never interleave).
namespace moat::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };
enum class Format { kText, kJson };

// `program` prefixes text lines ("moatd").
void configure(const std::string& program, Level minimum, Format format);
bool enabled(Level level);

// A JSON line's extra members; `number`: the value goes in unquoted (it
// must then be a JSON number).
struct Field {
  std::string key;
  std::string value;
  bool number = false;
};

// `message` is the text line (after "program: "); `fields` go only into a
// JSON line, beside "msg".
void write(Level level, const std::string& message, const std::vector<Field>& fields = {});

// printf-style, for the messages moatd has always written.
void debugf(const char* format, ...) __attribute__((format(printf, 1, 2)));
void infof(const char* format, ...) __attribute__((format(printf, 1, 2)));
void warnf(const char* format, ...) __attribute__((format(printf, 1, 2)));
void errorf(const char* format, ...) __attribute__((format(printf, 1, 2)));

// "debug", "info", "warn", "error" (and back: false for another word).
const char* levelName(Level level);
bool levelNamed(const std::string& name, Level& out);

// A text line: "program: message", control characters as \xNN (tests;
// write() uses it).
std::string textLine(const std::string& program, const std::string& message);
// One JSON line for the arguments (tests; write() uses it).
std::string jsonLine(const std::string& time, Level level, const std::string& message,
                     const std::vector<Field>& fields);

}  // namespace moat::log
