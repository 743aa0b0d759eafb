#include "common/log.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <ctime>

namespace moat::log {
namespace {

std::atomic<int> minimumLevel{static_cast<int>(Level::kInfo)};
std::atomic<bool> asJson{false};
char programName[32] = "moatd";

std::string escaped(const std::string& text) {
  std::string out;
  out.reserve(text.size() + 2);
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "\\u%04x", c);
          out += hex;
        } else {
          out += static_cast<char>(c);  // UTF-8 passes as it is; invalid bytes too (a reader may replace them)
        }
    }
  }
  return out;
}

std::string now() {
  auto since = std::chrono::system_clock::now().time_since_epoch();
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(since).count();
  std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  struct tm tm;
  ::gmtime_r(&seconds, &tm);
  char text[40];
  size_t n = std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(text + n, sizeof text - n, ".%03dZ", static_cast<int>(ms % 1000));
  return text;
}

void vwrite(Level level, const char* format, va_list args) {
  if (!enabled(level)) return;
  char buffer[2048];
  int n = std::vsnprintf(buffer, sizeof buffer, format, args);
  if (n < 0) return;
  std::string message(buffer, std::min<size_t>(static_cast<size_t>(n), sizeof buffer - 1));
  while (!message.empty() && message.back() == '\n') message.pop_back();
  write(level, message);
}

}  // namespace

void configure(const std::string& program, Level minimum, Format format) {
  std::snprintf(programName, sizeof programName, "%s", program.c_str());
  minimumLevel = static_cast<int>(minimum);
  asJson = format == Format::kJson;
}

bool enabled(Level level) { return static_cast<int>(level) >= minimumLevel.load(std::memory_order_relaxed); }

const char* levelName(Level level) {
  switch (level) {
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarn:
      return "warn";
    case Level::kError:
      return "error";
  }
  return "info";
}

bool levelNamed(const std::string& name, Level& out) {
  for (Level l : {Level::kDebug, Level::kInfo, Level::kWarn, Level::kError}) {
    if (name == levelName(l)) {
      out = l;
      return true;
    }
  }
  return false;
}

std::string jsonLine(const std::string& time, Level level, const std::string& message,
                     const std::vector<Field>& fields) {
  std::string line =
      "{\"time\":\"" + time + "\",\"level\":\"" + levelName(level) + "\",\"msg\":\"" + escaped(message) + "\"";
  for (const Field& f : fields) {
    line += ",\"" + escaped(f.key) + "\":" + (f.number ? f.value : "\"" + escaped(f.value) + "\"");
  }
  return line + "}\n";
}

std::string textLine(const std::string& program, const std::string& message) {
  // One line whatever the message holds: a request's path (decoded, the
  // client's to choose) must not start a line of its own that reads as
  // moatd's.
  std::string line = program + ": ";
  for (unsigned char c : message) {
    if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      line += hex;
    } else {
      line += static_cast<char>(c);
    }
  }
  return line + "\n";
}

void write(Level level, const std::string& message, const std::vector<Field>& fields) {
  if (!enabled(level)) return;
  std::string line = asJson ? jsonLine(now(), level, message, fields) : textLine(programName, message);
  // One call per whole line on unbuffered stderr (glibc locks the stream
  // for it): lines of two threads never interleave.
  std::fwrite(line.data(), 1, line.size(), stderr);
}

#define MOAT_LOG_F(name, level)        \
  void name(const char* format, ...) { \
    va_list args;                      \
    va_start(args, format);            \
    vwrite(level, format, args);       \
    va_end(args);                      \
  }
MOAT_LOG_F(debugf, Level::kDebug)
MOAT_LOG_F(infof, Level::kInfo)
MOAT_LOG_F(warnf, Level::kWarn)
MOAT_LOG_F(errorf, Level::kError)
#undef MOAT_LOG_F

}  // namespace moat::log
